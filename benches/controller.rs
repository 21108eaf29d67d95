//! The pool controller at fleet scale against a real API server (release build):
//! 1 000 PinnedImageSets (20 images each) across 100 pools, and 300 MachineConfigNodes (3 per
//! pool) reporting every set of their pool done.
//!
//! Measured per repetition, on a fresh API server each time, with `pinset controller` as a
//! separate process:
//! - cold: time from start until every pool lists its sets and counts its nodes and every set's
//!   status is written; the API writes it made; its peak RSS (VmHWM);
//! - restart on the converged cluster: time until every pool and set has been reconciled again,
//!   and the writes made (must be zero);
//! - one set changed: the writes that follow.
//!
//! `cargo bench --bench controller` (needs the API server bed: `bash scripts/test.sh` builds it).
//! `REPEATS` (default 3) sets the repetitions.

#[path = "../tests/support/mod.rs"]
mod support;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use pinset_k8s::api::{MachineConfigNode, MachineConfigPool, PinnedImageSet};
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const POOLS: usize = 100;
const SETS: usize = 1000;
const COMMON: usize = 10;
const IMAGES: usize = 20;
const NODES_PER_POOL: usize = 3;

fn image(set: usize, i: usize) -> String {
    format!("quay.io/pinset/s{set}-i{i}@sha256:{:064x}", set * 1000 + i)
}

/// Sets g0..g99 round-robin, plus `COMMON` sets every pool selects: 20 sets per pool.
fn group_of(set: usize) -> String {
    if set < COMMON {
        "common".into()
    } else {
        format!("g{}", set % POOLS)
    }
}

/// How many sets `pool-N` selects.
fn sets_of_pool(pool: &str) -> usize {
    let group = format!("g{}", pool.trim_start_matches("pool-"));
    (0..SETS)
        .filter(|s| group_of(*s) == "common" || group_of(*s) == group)
        .count()
}

async fn populate(client: &kube::Client) {
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    let nodes: Api<MachineConfigNode> = Api::all(client.clone());
    let pp = PostParams::default();
    futures::stream::iter(0..POOLS)
        .map(|p| {
            let pools = pools.clone();
            let pp = pp.clone();
            async move {
                let pool: MachineConfigPool = serde_json::from_value(json!({
                    "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
                    "metadata": {"name": format!("pool-{p}")},
                    "spec": {
                        "machineConfigSelector": {"matchExpressions": [{"key": "pinset.dev/group", "operator": "In", "values": [format!("g{p}"), "common"]}]},
                        "nodeSelector": {"matchLabels": {format!("pinset.dev/pool-{p}"): ""}}
                    }
                }))
                .unwrap();
                pools.create(&pp, &pool).await.map(drop)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("create pools");
    futures::stream::iter(0..SETS)
        .map(|s| {
            let sets = sets.clone();
            let pp = pp.clone();
            async move {
                let set: PinnedImageSet = serde_json::from_value(json!({
                    "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
                    "metadata": {"name": format!("set-{s:04}"), "labels": {"pinset.dev/group": group_of(s)}},
                    "spec": {"pinnedImages": (0..IMAGES).map(|i| json!({"name": image(s, i)})).collect::<Vec<_>>()}
                }))
                .unwrap();
                sets.create(&pp, &set).await.map(drop)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("create sets");
    // Each node reports every set of its pool at generation 1.
    futures::stream::iter(0..POOLS * NODES_PER_POOL)
        .map(|n| {
            let nodes = nodes.clone();
            async move {
                let p = n % POOLS;
                let name = format!("node-{n}");
                let pool_sets: Vec<serde_json::Value> = (0..SETS)
                    .filter(|s| group_of(*s) == "common" || group_of(*s) == format!("g{p}"))
                    .map(|s| json!({"name": format!("set-{s:04}"), "desiredGeneration": 1, "currentGeneration": 1}))
                    .collect();
                let body = json!({
                    "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigNode",
                    "metadata": {"name": name},
                    "spec": {"node": {"name": name}, "pool": {"name": format!("pool-{p}")}},
                });
                let ssa = PatchParams::apply("bench").force();
                nodes.patch(&name, &ssa, &Patch::Apply(&body)).await?;
                let status = json!({
                    "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigNode",
                    "metadata": {"name": name},
                    "status": {"pinnedImageSets": pool_sets},
                });
                nodes.patch_status(&name, &ssa, &Patch::Apply(&status)).await.map(drop)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("create nodes");
}

/// Every pool lists its 20 sets and counts its 3 nodes all updated; every set has its status.
async fn converged(client: &kube::Client) -> bool {
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    let Ok(pools) = pools.list(&ListParams::default()).await else {
        return false;
    };
    let pools_ok =
        pools.items.len() == POOLS
            && pools.items.iter().all(|p| {
                p.spec.pinned_image_sets.as_ref().is_some_and(|s| {
                    s.len() == sets_of_pool(p.metadata.name.as_deref().unwrap_or(""))
                }) && p.status.as_ref().is_some_and(|st| {
                    st.pool_synchronizers_status.iter().any(|s| {
                        s.machine_count == NODES_PER_POOL as i64
                            && s.updated_machine_count == NODES_PER_POOL as i64
                    })
                })
            });
    if !pools_ok {
        return false;
    }
    let Ok(sets) = sets.list(&ListParams::default()).await else {
        return false;
    };
    sets.items.len() == SETS
        && sets.items.iter().all(|s| {
            s.status
                .as_ref()
                .is_some_and(|st| st.image_count as usize == IMAGES && !st.pools.is_empty())
        })
}

struct Controller {
    child: Child,
    port: u16,
}

impl Controller {
    fn start(kubeconfig: &std::path::Path) -> Controller {
        let port = support::free_port();
        let child = Command::new(support::PINSET)
            .args([
                "controller",
                &format!("--kubeconfig={}", kubeconfig.display()),
                &format!("--metrics-addr=127.0.0.1:{port}"),
            ])
            .env("PINSET_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start pinset controller");
        Controller { child, port }
    }

    async fn metrics(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await else {
            return String::new();
        };
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await;
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    /// Sum of the samples of `name` (any labels).
    async fn metric(&self, name: &str) -> u64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| {
                l.starts_with(name)
                    && (l[name.len()..].starts_with('{') || l[name.len()..].starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }

    async fn count(&self, kind: &str) -> u64 {
        self.metric(&format!(
            "pinset_reconcile_seconds_count{{kind=\"{kind}\"}}"
        ))
        .await
    }

    fn status_kib(&self, field: &str) -> u64 {
        support::procfs::status_kib(self.child.id(), field)
    }

    fn cpu(&self) -> Duration {
        support::procfs::cpu(self.child.id())
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn wait_for<F, Fut>(what: &str, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !f().await {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{what}: not reached in 300 s"
        );
        // Polling lists the API; not so often that the server is busy answering it.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    started.elapsed()
}

#[tokio::main]
async fn main() {
    let repeats: usize = std::env::var("REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!(
        "controller: {SETS} sets × {IMAGES} images, {POOLS} pools ({}–{} sets each), {} nodes",
        sets_of_pool("pool-0"),
        sets_of_pool("pool-99"),
        POOLS * NODES_PER_POOL
    );
    println!(
        "{:>3} {:>8} {:>9} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8}",
        "run",
        "cold",
        "cold CPU",
        "writes",
        "peak RSS",
        "RSS after",
        "restart",
        "writes",
        "1 change"
    );
    for run in 1..=repeats {
        let Some(server) = support::apiserver::ApiServer::start().await else {
            return;
        };
        server.install_crds().await;
        let client = server.client().await;
        populate(&client).await;

        let c = Controller::start(&server.kubeconfig);
        let cold = wait_for("cold convergence", || converged(&client)).await;
        // Let the last status writes land, then count.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cold_writes = c.metric("pinset_api_writes_total").await;
        let (peak, rss, cpu) = (c.status_kib("VmHWM:"), c.status_kib("VmRSS:"), c.cpu());
        drop(c);

        let c = Controller::start(&server.kubeconfig);
        let restart = wait_for("restart: every object reconciled", || async {
            c.count("pool").await >= POOLS as u64 && c.count("set").await >= SETS as u64
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let restart_writes = c.metric("pinset_api_writes_total").await;

        // One set gains an image: its status changes (image count); nothing else does.
        let sets: Api<PinnedImageSet> = Api::all(client.clone());
        let before = c.metric("pinset_api_writes_total").await;
        let images: Vec<serde_json::Value> = (0..=IMAGES)
            .map(|i| json!({"name": image(500, i)}))
            .collect();
        sets.patch(
            "set-0500",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pinnedImages": images}})),
        )
        .await
        .unwrap();
        wait_for("the changed set's status", || async {
            sets.get("set-0500")
                .await
                .ok()
                .and_then(|s| s.status)
                .is_some_and(|s| s.image_count as usize == IMAGES + 1)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let change_writes = c.metric("pinset_api_writes_total").await - before;
        println!(
            "{run:>3} {:>7.2}s {:>8.2}s {:>7} {:>5} MiB {:>5} MiB {:>7.2}s {:>8} {:>8}",
            cold.as_secs_f64(),
            cpu.as_secs_f64(),
            cold_writes,
            peak / 1024,
            rss / 1024,
            restart.as_secs_f64(),
            restart_writes,
            change_writes
        );
    }
}
