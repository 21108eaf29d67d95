//! `pinset agent`: one per node. Watches the pools and sets, runs the node pipeline
//! ([`crate::node::Reconciler`]) whenever this node's desired state changes (a change cancels the
//! running reconcile), and publishes the node's status on its MachineConfigNode with server-side
//! apply: every set of every pool of the node, progress, and honest conditions.

use super::api::{
    CONDITION_DEGRADED, CONDITION_POLICY_FALLBACK, CONDITION_PROGRESSING, MachineConfigNode,
    MachineConfigNodeStatus, MachineConfigPool, NodeProgress, NodeSetStatus, PinnedImageSet,
};
use super::{condition, convert};
use crate::core::desired::{self, Desired, NodeInfo};
use crate::core::executor::Event;
use crate::core::status::{NodeStatus, Progress, SetStatus};
use crate::metrics::Metrics;
use crate::node::Reconciler;
use crate::pin::PinBackend;
use crate::policy::PolicyModule;
use crate::registry::size::Sizer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use pinset_policy_sdk::fmt_bytes;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub const FIELD_MANAGER: &str = "pinset-agent";

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("node {node}: reading the Node object: {source}")]
    NodeApi { node: String, source: kube::Error },
    #[error("node {node}: {source}")]
    NodeFile {
        node: String,
        source: crate::objects::ObjectError,
    },
    #[error("node {node}: {file}: no Node object named {node} in the file")]
    NodeMissing { node: String, file: PathBuf },
    #[error("node {node}: {source}")]
    Convert {
        node: String,
        source: convert::ConvertError,
    },
    #[error("MachineConfigNode {node}: writing {what}: {source}")]
    Write {
        node: String,
        what: &'static str,
        source: kube::Error,
    },
}

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub node_name: String,
    /// Node facts from this YAML file instead of the core API's Node object.
    pub node_file: Option<PathBuf>,
    /// Reconcile again this often even when nothing changed (images removed behind our back).
    pub resync: Duration,
    /// After a failed reconcile, retry after this long, doubling up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// At most one status write per this interval while pulling.
    pub publish_interval: Duration,
}

impl AgentConfig {
    pub fn new(node_name: String) -> Self {
        Self {
            node_name,
            node_file: None,
            resync: Duration::from_secs(600),
            retry_min: Duration::from_secs(10),
            retry_max: Duration::from_secs(300),
            publish_interval: Duration::from_secs(1),
        }
    }
}

/// The policy of each pool; a node uses its primary pool's.
#[derive(Clone)]
pub struct PolicyTable {
    pub default: PolicyModule,
    pub by_pool: BTreeMap<String, PolicyModule>,
}

impl PolicyTable {
    pub fn for_pools(&self, pools: &[String]) -> &PolicyModule {
        pools
            .first()
            .and_then(|p| self.by_pool.get(p))
            .unwrap_or(&self.default)
    }
}

pub struct Agent<S, B> {
    pub client: Client,
    pub config: AgentConfig,
    pub reconciler: Reconciler<S, B>,
    pub policies: PolicyTable,
    pub metrics: Metrics,
    pub ready: Arc<AtomicBool>,
}

/// What the agent last wrote, so unchanged status is not written again.
#[derive(Default)]
struct Published {
    pool: Option<Option<String>>,
    status: Option<MachineConfigNodeStatus>,
    conditions: Vec<Condition>,
}

impl<S: Sizer + 'static, B: PinBackend> Agent<S, B> {
    /// Run until `shutdown`; a reconcile in flight is cancelled (pulls dropped, pins left as they
    /// were) and the status says so.
    pub async fn run(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let (changes, mut changed) = watch::channel(0u64);
        let pools = spawn_reflector::<MachineConfigPool>(
            self.client.clone(),
            changes.clone(),
            shutdown.clone(),
        );
        let sets =
            spawn_reflector::<PinnedImageSet>(self.client.clone(), changes, shutdown.clone());
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = async { let _ = pools.wait_until_ready().await; let _ = sets.wait_until_ready().await; } => {}
        }
        let node_api: Api<MachineConfigNode> = Api::all(self.client.clone());
        let mut published = Published::default();
        let mut status = NodeStatus::default();
        match node_api.get_opt(&self.config.node_name).await {
            Ok(Some(mcn)) => {
                let st = mcn.status.unwrap_or_default();
                status.sets = st
                    .pinned_image_sets
                    .into_iter()
                    .map(|s| (s.name.clone(), set_status(s)))
                    .collect();
                published.conditions = st.conditions;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(node = %self.config.node_name, error = %e, "cannot read the MachineConfigNode; starting from an empty status")
            }
        }
        self.ready.store(true, Ordering::Relaxed);
        let mut failures = 0u32;
        loop {
            changed.borrow_and_update();
            let (node, desired) = match self.desired(&pools, &sets).await {
                Ok(x) => x,
                Err(e) => {
                    tracing::error!(error = %e, "cannot compute the node's desired state");
                    status.finish(Some(e.to_string()));
                    self.publish(&node_api, &mut published, &status).await;
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(self.config.retry_min) => continue,
                    }
                }
            };
            let pool = desired.pools.first().cloned();
            if published.pool.as_ref() != Some(&pool) {
                match self.apply_spec(&node_api, pool.as_deref()).await {
                    Ok(()) => published.pool = Some(pool),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot write the MachineConfigNode spec; retrying later")
                    }
                }
            }
            self.reconciler.policy = self.policies.for_pools(&desired.pools).clone();

            // The reconcile, its progress, and a watch that cancels it when the desired state
            // changes (or the agent stops).
            let cancel = shutdown.child_token();
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let mut preview = status.clone();
            preview.start(
                &desired,
                Progress {
                    images_total: desired.images.len() as u64,
                    ..Default::default()
                },
            );
            preview.progressing = Some(format!("working on {} set(s)", desired.sets.len()));
            let started = Instant::now();
            let (result, mut pub_state) = {
                let reconcile = self.reconciler.reconcile(
                    &desired,
                    &node,
                    &mut status,
                    cancel.clone(),
                    Some(tx),
                );
                let progress = publish_progress(
                    rx,
                    preview,
                    &desired,
                    &node_api,
                    &self.config,
                    &self.metrics,
                );
                let watch_changes = until_changed(
                    &self.config,
                    &self.client,
                    &pools,
                    &sets,
                    &desired,
                    &node,
                    changed.clone(),
                );
                let work = async { tokio::join!(reconcile, progress) };
                tokio::pin!(work, watch_changes);
                tokio::select! {
                    r = &mut work => r,
                    // The desired state changed: cancel the reconcile; it returns promptly.
                    () = &mut watch_changes => {
                        cancel.cancel();
                        work.await
                    }
                }
            };
            // The progress writer kept its own record of what it wrote.
            if pub_state.status.is_some() {
                published.status = pub_state.status.take();
                published.conditions = std::mem::take(&mut pub_state.conditions);
            }
            let ok = matches!(&result, Ok(r) if !r.cancelled) && status.degraded.is_none();
            self.metrics
                .observe_reconcile("node", started.elapsed(), ok);
            let cancelled = match &result {
                Ok(r) => r.cancelled,
                Err(e) => {
                    tracing::error!(node = %node.name, error = %e, "reconcile failed");
                    false
                }
            };
            if shutdown.is_cancelled() {
                status.progressing = Some(
                    "interrupted: the agent is stopping; the work resumes when it restarts".into(),
                );
                let _ = tokio::time::timeout(
                    Duration::from_secs(3),
                    self.publish(&node_api, &mut published, &status),
                )
                .await;
                return Ok(());
            }
            if cancelled {
                tracing::info!(node = %node.name, "the desired state changed: reconciling again");
                continue;
            }
            self.publish(&node_api, &mut published, &status).await;
            let wait = if status.degraded.is_some() {
                failures = failures.saturating_add(1);
                (self.config.retry_min * 2u32.saturating_pow(failures - 1))
                    .min(self.config.retry_max)
            } else {
                failures = 0;
                self.config.resync
            };
            tracing::info!(node = %node.name, done = status.done(), next_in = ?wait, "reconcile finished");
            // The agent idles until the next change: what the reconcile freed (response bodies,
            // manifests, plan) goes back to the system instead of staying in the allocator.
            crate::os::release_free_memory();
            // Sleep until the desired state changes, the timer fires, or the agent stops.
            let timer = tokio::time::sleep(wait);
            tokio::pin!(timer);
            let wait_change = until_changed(
                &self.config,
                &self.client,
                &pools,
                &sets,
                &desired,
                &node,
                changed.clone(),
            );
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = &mut timer => {}
                () = wait_change => {}
            }
        }
    }

    /// The node's facts and desired state from the caches.
    async fn desired(
        &self,
        pools: &Store<MachineConfigPool>,
        sets: &Store<PinnedImageSet>,
    ) -> Result<(NodeInfo, Desired), AgentError> {
        let node = node_info(&self.config, &self.client).await?;
        Ok((node.clone(), desired_of(&node, pools, sets)))
    }

    async fn apply_spec(
        &self,
        api: &Api<MachineConfigNode>,
        pool: Option<&str>,
    ) -> Result<(), AgentError> {
        let name = &self.config.node_name;
        let mut spec = json!({"node": {"name": name}});
        if let Some(pool) = pool {
            spec["pool"] = json!({"name": pool});
        }
        apply_node(api, name, "spec", spec).await?;
        self.metrics.count_api_write("node_spec");
        Ok(())
    }

    async fn publish(
        &self,
        api: &Api<MachineConfigNode>,
        published: &mut Published,
        status: &NodeStatus,
    ) {
        if let Err(e) = write_status(
            api,
            &self.config.node_name,
            published,
            status,
            &self.metrics,
        )
        .await
        {
            tracing::warn!(error = %e, "status not published; it will be on the next change");
        }
    }
}

/// Node facts: the `--node-file` or the Node object.
async fn node_info(config: &AgentConfig, client: &Client) -> Result<NodeInfo, AgentError> {
    let name = &config.node_name;
    match &config.node_file {
        Some(file) => {
            let mut objects = crate::objects::Objects::default();
            crate::objects::load_file(file, &mut objects).map_err(|source| {
                AgentError::NodeFile {
                    node: name.clone(),
                    source,
                }
            })?;
            objects
                .nodes
                .into_iter()
                .find(|n| &n.name == name)
                .ok_or_else(|| AgentError::NodeMissing {
                    node: name.clone(),
                    file: file.clone(),
                })
        }
        None => {
            let api: Api<Node> = Api::all(client.clone());
            let node = api.get(name).await.map_err(|source| AgentError::NodeApi {
                node: name.clone(),
                source,
            })?;
            convert::node(&node).map_err(|source| AgentError::Convert {
                node: name.clone(),
                source,
            })
        }
    }
}

/// The desired state of `node` from the cached pools and sets. A pool that cannot be read (a bad
/// selector) is skipped with a warning; the controller reports it on the pool.
pub fn desired_of(
    node: &NodeInfo,
    pools: &Store<MachineConfigPool>,
    sets: &Store<PinnedImageSet>,
) -> Desired {
    let pools: Vec<_> = pools
        .state()
        .iter()
        .filter_map(|p| match convert::pool(p) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "pool skipped");
                None
            }
        })
        .collect();
    let sets: Vec<_> = sets.state().iter().map(|s| convert::set(s)).collect();
    desired::desired(node, &pools, &sets)
}

/// Return as soon as the desired state differs from `running` (a pool or set changed, or the
/// node file).
async fn until_changed(
    config: &AgentConfig,
    client: &Client,
    pools: &Store<MachineConfigPool>,
    sets: &Store<PinnedImageSet>,
    running: &Desired,
    node: &NodeInfo,
    mut changed: watch::Receiver<u64>,
) {
    let mut file_stamp = stamp(config);
    loop {
        tokio::select! {
            r = changed.changed() => if r.is_err() { std::future::pending::<()>().await },
            _ = tokio::time::sleep(Duration::from_secs(1)), if config.node_file.is_some() => {
                let now = stamp(config);
                if now == file_stamp { continue; }
                file_stamp = now;
            }
        }
        let node = if config.node_file.is_some() {
            match node_info(config, client).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "node file unreadable; keeping the last facts");
                    node.clone()
                }
            }
        } else {
            node.clone()
        };
        if &desired_of(&node, pools, sets) != running {
            return;
        }
    }
}

fn stamp(config: &AgentConfig) -> Option<std::time::SystemTime> {
    config
        .node_file
        .as_ref()
        .and_then(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
}

fn spawn_reflector<K>(
    client: Client,
    changes: watch::Sender<u64>,
    shutdown: CancellationToken,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let api: Api<K> = Api::all(client);
    let stream = watcher(api, super::watcher_config())
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = stream.next() => n,
            };
            match next {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(kind = %K::kind(&()), error = %e, "watch interrupted; resuming")
                }
                Some(Ok(_)) => changes.send_modify(|n| *n += 1),
            }
        }
    });
    reader
}

/// Publish progress while the reconcile runs (at most once per `publish_interval`). Returns what
/// it wrote last.
async fn publish_progress(
    mut rx: UnboundedReceiver<Event>,
    mut preview: NodeStatus,
    desired: &Desired,
    api: &Api<MachineConfigNode>,
    config: &AgentConfig,
    metrics: &Metrics,
) -> Published {
    let mut published = Published::default();
    let mut dirty = true;
    let mut next = Instant::now();
    loop {
        let deadline = tokio::time::Instant::from_std(next);
        tokio::select! {
            event = rx.recv() => match event {
                None => return published,
                Some(Event::Planned { bytes, present, pulls }) => {
                    preview.start(desired, Progress {
                        images_done: present,
                        images_total: desired.images.len() as u64,
                        bytes_done: 0,
                        bytes_total: bytes,
                    });
                    preview.progressing = Some(format!("pulling {pulls} image(s) of {} set(s)", desired.sets.len()));
                    dirty = true;
                }
                Some(Event::Pulled { bytes, .. }) => {
                    preview.advance(1, bytes.unwrap_or(0));
                    dirty = true;
                }
                Some(_) => {}
            },
            _ = tokio::time::sleep_until(deadline), if dirty => {
                if let Err(e) = write_status(api, &config.node_name, &mut published, &preview, metrics).await {
                    tracing::warn!(error = %e, "progress not published");
                }
                dirty = false;
                next = Instant::now() + config.publish_interval;
            }
        }
    }
}

fn set_status(s: NodeSetStatus) -> SetStatus {
    SetStatus {
        name: s.name,
        desired_generation: s.desired_generation,
        current_generation: s.current_generation,
        last_failed_generation: s.last_failed_generation,
        last_failed_generation_error: s.last_failed_generation_error,
    }
}

/// The MachineConfigNode status for `status`; conditions keep their transition times.
pub fn node_status(status: &NodeStatus, previous: &[Condition]) -> MachineConfigNodeStatus {
    let p = status.progress;
    let progressing = status.progressing.clone();
    let conditions = vec![
        condition::make(
            previous,
            CONDITION_PROGRESSING,
            progressing.is_some(),
            if progressing.is_some() {
                "ImagePrefetch"
            } else {
                "AsExpected"
            },
            &progressing.unwrap_or_else(|| {
                if status.degraded.is_some() {
                    "not progressing: see PinnedImageSetsDegraded".into()
                } else {
                    format!("all {} set(s) pulled and pinned", status.sets.len())
                }
            }),
            None,
        ),
        condition::make(
            previous,
            CONDITION_DEGRADED,
            status.degraded.is_some(),
            if status.degraded.is_some() {
                "PrefetchFailed"
            } else {
                "AsExpected"
            },
            &truncate(status.degraded.as_deref().unwrap_or(""), 8192),
            None,
        ),
        condition::make(
            previous,
            CONDITION_POLICY_FALLBACK,
            !status.policy_fallbacks.is_empty(),
            if status.policy_fallbacks.is_empty() {
                "AsExpected"
            } else {
                "PolicyFailed"
            },
            &truncate(&status.policy_fallbacks.join("; "), 8192),
            None,
        ),
    ];
    MachineConfigNodeStatus {
        conditions,
        pinned_image_sets: status
            .sets
            .values()
            .map(|s| NodeSetStatus {
                name: s.name.clone(),
                desired_generation: s.desired_generation.max(1),
                current_generation: s.current_generation,
                last_failed_generation: s.last_failed_generation,
                last_failed_generation_error: s
                    .last_failed_generation
                    .map(|_| s.last_failed_generation_error.clone().unwrap_or_default()),
            })
            .collect(),
        pinned_image_progress: Some(NodeProgress {
            images_done: p.images_done,
            images_total: p.images_total,
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            summary: format!(
                "{}/{} ({}/{})",
                p.images_done,
                p.images_total,
                fmt_bytes(p.bytes_done),
                fmt_bytes(p.bytes_total)
            ),
        }),
    }
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((cut, _)) => format!("{}…", &s[..cut]),
    }
}

/// Same status, transition times aside.
fn same_status(a: &MachineConfigNodeStatus, b: &MachineConfigNodeStatus) -> bool {
    a.pinned_image_sets == b.pinned_image_sets
        && a.pinned_image_progress == b.pinned_image_progress
        && a.conditions.len() == b.conditions.len()
        && a.conditions
            .iter()
            .zip(&b.conditions)
            .all(|(x, y)| condition::same(x, y))
}

async fn write_status(
    api: &Api<MachineConfigNode>,
    name: &str,
    published: &mut Published,
    status: &NodeStatus,
    metrics: &Metrics,
) -> Result<(), AgentError> {
    let st = node_status(status, &published.conditions);
    if published
        .status
        .as_ref()
        .is_some_and(|p| same_status(p, &st))
    {
        return Ok(());
    }
    apply_node(
        api,
        name,
        "status",
        serde_json::to_value(&st).expect("status serializes"),
    )
    .await?;
    metrics.count_api_write("node_status");
    published.conditions = st.conditions.clone();
    published.status = Some(st);
    Ok(())
}

/// Server-side apply of one part (`spec` or `status`) of the node's MachineConfigNode, as
/// pinset's agent (its own field manager: other writers' fields are left alone).
async fn apply_node(
    api: &Api<MachineConfigNode>,
    name: &str,
    part: &'static str,
    value: serde_json::Value,
) -> Result<(), AgentError> {
    let body = json!({
        "apiVersion": MachineConfigNode::api_version(&()),
        "kind": MachineConfigNode::kind(&()),
        "metadata": {"name": name},
        part: value,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let result = if part == "status" {
        api.patch_status(name, &params, &Patch::Apply(&body)).await
    } else {
        api.patch(name, &params, &Patch::Apply(&body)).await
    };
    result.map(drop).map_err(|source| AgentError::Write {
        node: name.into(),
        what: part,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(sets: &[(&str, i64)]) -> Desired {
        Desired::of_sets(sets)
    }

    #[test]
    fn a_node_at_work_is_progressing_and_never_degraded_for_taking_time() {
        let mut st = NodeStatus::default();
        st.start(
            &desired(&[("a", 1)]),
            Progress {
                images_total: 760,
                bytes_total: 1 << 40,
                ..Default::default()
            },
        );
        st.advance(100, 1 << 30);
        let s = node_status(&st, &[]);
        let get = |t: &str| s.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(get(CONDITION_PROGRESSING).status, "True");
        assert_eq!(get(CONDITION_PROGRESSING).reason, "ImagePrefetch");
        assert_eq!(get(CONDITION_DEGRADED).status, "False");
        assert_eq!(get(CONDITION_POLICY_FALLBACK).status, "False");
        let p = s.pinned_image_progress.unwrap();
        assert_eq!((p.images_done, p.images_total), (100, 760));
        assert_eq!(p.summary, "100/760 (1.0 GiB/1.0 TiB)");
        assert_eq!(s.pinned_image_sets[0].desired_generation, 1);
        assert_eq!(s.pinned_image_sets[0].current_generation, None);
    }

    #[test]
    fn failures_name_the_images_and_fallbacks_show() {
        let mut st = NodeStatus::default();
        st.start(&desired(&[("a", 2)]), Progress::default());
        st.fail("a", 2, "1 image(s) missing: q.io/x@sha256:00: not found");
        st.policy_fallbacks = vec!["order: trap".into()];
        st.finish(Some(
            "PinnedImageSet a: 1 image(s) missing: q.io/x@sha256:00: not found".into(),
        ));
        let s = node_status(&st, &[]);
        let get = |t: &str| s.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(get(CONDITION_PROGRESSING).status, "False");
        let d = get(CONDITION_DEGRADED);
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", "PrefetchFailed")
        );
        assert!(d.message.contains("q.io/x@sha256:00"));
        assert_eq!(get(CONDITION_POLICY_FALLBACK).message, "order: trap");
        let set = &s.pinned_image_sets[0];
        assert_eq!(set.last_failed_generation, Some(2));
        assert!(
            set.last_failed_generation_error
                .as_ref()
                .unwrap()
                .contains("not found")
        );
        // Unchanged status compares equal even with fresh transition times.
        assert!(same_status(&s, &node_status(&st, &s.conditions)));
    }

    #[test]
    fn a_node_uses_its_primary_pools_policy() {
        let runtime = crate::policy::WasmRuntime::new().unwrap();
        let load = |n: &str| {
            runtime
                .load(n, crate::policy::EMBEDDED_DEFAULT, None, Default::default())
                .unwrap()
        };
        let table = PolicyTable {
            default: load("default"),
            by_pool: [("infra".to_string(), load("infra"))].into(),
        };
        assert_eq!(
            table.for_pools(&["infra".into(), "worker".into()]).name(),
            "infra"
        );
        assert_eq!(table.for_pools(&["worker".into()]).name(), "default");
        assert_eq!(table.for_pools(&[]).name(), "default");
    }
}
