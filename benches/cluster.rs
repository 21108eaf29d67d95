//! What the controller benches share: a fleet of pools, sets and MachineConfigNodes written to a
//! real API server, `pinset controller` as its own process, its metrics, and polling.

#![allow(dead_code)]

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pinset_k8s::api::{MachineConfigNode, MachineConfigPool, PinnedImageSet};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;

/// The fleet: sets spread round-robin over per-pool groups, plus `common` sets every pool
/// selects; `nodes_per_pool` MachineConfigNodes per pool, each reporting every set of its pool
/// at generation 1.
pub struct Fleet {
    pub pools: usize,
    pub sets: usize,
    pub common: usize,
    pub images: usize,
    pub nodes_per_pool: usize,
    /// Nodes report themselves Ready (as agents do); without it no node is ever granted.
    pub ready: bool,
    /// Annotations of each pool, by index.
    pub annotations: fn(usize) -> BTreeMap<String, String>,
}

/// One set on a node: name, desired and current generation, last failed generation and error.
pub type SetReport = (String, i64, i64, Option<(i64, String)>);

pub fn no_annotations(_: usize) -> BTreeMap<String, String> {
    BTreeMap::new()
}

impl Fleet {
    pub fn image(set: usize, i: usize) -> String {
        format!("quay.io/pinset/s{set}-i{i}@sha256:{:064x}", set * 1000 + i)
    }

    pub fn set_name(set: usize) -> String {
        format!("set-{set:04}")
    }

    pub fn pool_name(pool: usize) -> String {
        format!("pool-{pool}")
    }

    pub fn node_name(node: usize) -> String {
        format!("node-{node}")
    }

    /// The pool of node `node`.
    pub fn pool_of(&self, node: usize) -> usize {
        node % self.pools
    }

    fn group_of(&self, set: usize) -> String {
        if set < self.common {
            "common".into()
        } else {
            format!("g{}", set % self.pools)
        }
    }

    /// The sets pool `pool` selects.
    pub fn sets_of(&self, pool: usize) -> Vec<usize> {
        let group = format!("g{pool}");
        (0..self.sets)
            .filter(|s| {
                let g = self.group_of(*s);
                g == "common" || g == group
            })
            .collect()
    }

    pub fn nodes(&self) -> usize {
        self.pools * self.nodes_per_pool
    }

    /// Node `node`'s labels: its zone (one of three).
    pub fn labels(node: usize) -> Value {
        json!({"topology.kubernetes.io/zone": format!("zone-{}", node / 100 % 3)})
    }

    /// A MachineConfigNode status reporting `sets`.
    pub fn node_status(&self, node: usize, sets: &[SetReport]) -> Value {
        let sets: Vec<Value> = sets
            .iter()
            .map(|(name, desired, current, failed)| {
                let mut s = json!({"name": name, "desiredGeneration": desired, "currentGeneration": current});
                if let Some((generation, error)) = failed {
                    s["lastFailedGeneration"] = json!(generation);
                    s["lastFailedGenerationError"] = json!(error);
                }
                s
            })
            .collect();
        let mut status = json!({"pinnedImageSets": sets});
        if self.ready {
            status["nodeState"] = json!({"ready": true, "labels": Self::labels(node)});
        }
        json!({
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigNode",
            "metadata": {"name": Self::node_name(node)},
            "status": status,
        })
    }

    /// Write every pool, set and node (16 requests at a time).
    pub async fn populate(&self, client: &kube::Client) {
        let pools = (0..self.pools).map(|p| self.pool(p)).collect();
        create_all(client, pools).await.expect("create pools");
        let sets = (0..self.sets).map(|s| self.set(s)).collect();
        create_all(client, sets).await.expect("create sets");
        futures::stream::iter(0..self.nodes())
            .map(|n| self.create_node(client, n))
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await
            .expect("create nodes");
    }

    /// Pool `p`: its group's sets and the common ones; its nodes by a label of their own.
    fn pool(&self, p: usize) -> MachineConfigPool {
        serde_json::from_value(json!({
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
            "metadata": {"name": Self::pool_name(p), "annotations": (self.annotations)(p)},
            "spec": {
                "machineConfigSelector": {"matchExpressions": [{"key": "pinset.dev/group", "operator": "In", "values": [format!("g{p}"), "common"]}]},
                "nodeSelector": {"matchLabels": {format!("pinset.dev/pool-{p}"): ""}}
            }
        }))
        .expect("pool")
    }

    /// Set `s`, labelled with its group, of `images` images.
    fn set(&self, s: usize) -> PinnedImageSet {
        serde_json::from_value(json!({
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
            "metadata": {"name": Self::set_name(s), "labels": {"pinset.dev/group": self.group_of(s)}},
            "spec": {"pinnedImages": (0..self.images).map(|i| json!({"name": Self::image(s, i)})).collect::<Vec<_>>()}
        }))
        .expect("set")
    }

    /// Node `n`'s MachineConfigNode, reporting every set of its pool at generation 1.
    async fn create_node(&self, client: &kube::Client, n: usize) -> Result<(), kube::Error> {
        let nodes: Api<MachineConfigNode> = Api::all(client.clone());
        let name = Self::node_name(n);
        let body = json!({
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigNode",
            "metadata": {"name": name},
            "spec": {"node": {"name": name}, "pool": {"name": Self::pool_name(self.pool_of(n))}},
        });
        let ssa = PatchParams::apply("bench").force();
        nodes.patch(&name, &ssa, &Patch::Apply(&body)).await?;
        let sets: Vec<_> = self
            .sets_of(self.pool_of(n))
            .into_iter()
            .map(|s| (Self::set_name(s), 1, 1, None))
            .collect();
        let status = self.node_status(n, &sets);
        nodes
            .patch_status(&name, &ssa, &Patch::Apply(&status))
            .await
            .map(drop)
    }
}

/// Create every object, 16 requests at a time.
async fn create_all<K>(client: &kube::Client, objects: Vec<K>) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::all(client.clone());
    let pp = PostParams::default();
    futures::stream::iter(objects)
        .map(|o| {
            let (api, pp) = (&api, &pp);
            async move { api.create(pp, &o).await.map(drop) }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .map(drop)
}

/// `pinset controller` (release) as its own process, its metrics on a loopback port.
pub struct Controller {
    child: Child,
    port: u16,
}

impl Controller {
    pub fn start(kubeconfig: &std::path::Path) -> Controller {
        let port = support::free_port();
        let child = Command::new(support::PINSET)
            .args([
                "controller",
                &format!("--kubeconfig={}", kubeconfig.display()),
                &format!("--metrics-addr=127.0.0.1:{port}"),
                "--policy-configuration=cluster",
            ])
            .env("PINSET_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start pinset controller");
        Controller { child, port }
    }

    pub async fn metrics(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await else {
            return String::new();
        };
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await;
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    /// Sum of the samples of `name` whose labels contain `labels` (any, when empty).
    pub async fn metric_with(&self, name: &str, labels: &str) -> u64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| {
                l.strip_prefix(name).is_some_and(|rest| {
                    (rest.starts_with('{') && rest.contains(labels))
                        || (rest.starts_with(' ') && labels.is_empty())
                })
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }

    /// Sum of the samples of `name` (any labels).
    pub async fn metric(&self, name: &str) -> u64 {
        self.metric_with(name, "").await
    }

    pub async fn count(&self, kind: &str) -> u64 {
        self.metric_with(
            "pinset_reconcile_seconds_count",
            &format!("kind=\"{kind}\""),
        )
        .await
    }

    pub fn status_kib(&self, field: &str) -> u64 {
        support::procfs::status_kib(self.child.id(), field)
    }

    pub fn cpu(&self) -> Duration {
        support::procfs::cpu(self.child.id())
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        support::reap(&mut self.child);
    }
}

/// Poll `f` every 250 ms (not so often that the API server is busy answering) until it holds;
/// panics naming `what` after 300 s.
pub async fn wait_for<F, Fut>(what: &str, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_until(what, || {
        let check = f();
        async move {
            if check.await {
                Ok(())
            } else {
                Err("no".into())
            }
        }
    })
    .await
}

/// Poll `f` every 250 ms until it answers `Ok`; panics naming `what` and `f`'s last answer
/// after 300 s. How long it took.
pub async fn wait_until<F, Fut>(what: &str, f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    let (within, every) = (Duration::from_secs(300), Duration::from_millis(250));
    support::poll_until(what, within, every, &String::new, f).await;
    started.elapsed()
}
