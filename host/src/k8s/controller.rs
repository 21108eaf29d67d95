//! `pinset controller`: for every MachineConfigPool, the PinnedImageSets it selects
//! (`spec.pinnedImageSets`) and how far its nodes are (`status.poolSynchronizersStatus` and the
//! `PinnedImageSetsDegraded` condition); for every PinnedImageSet, its size and pools (status).
//!
//! The decisions are the core's ([`crate::core::pool`]); this module reads the objects from
//! watch caches and writes only what changed. One [`Context`] is shared by both reconcilers.

use super::api::{
    CONDITION_DEGRADED, MachineConfigNode, MachineConfigPool, PinnedImageSet, PinnedImageSetStatus,
    PoolSynchronizerStatus, SYNCHRONIZER,
};
use super::watcher_config;
use super::{condition, convert};
use crate::core::pool::{self, PoolError};
use crate::metrics::Metrics;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub const FIELD_MANAGER: &str = "pinset-controller";
/// Reconciles in flight per kind of object.
pub const CONCURRENCY: u16 = 8;
/// Everything is reconciled again this often, changes or not.
pub const RESYNC: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("MachineConfigPool {pool}: writing {what}: {source}")]
    PoolWrite {
        pool: String,
        what: &'static str,
        source: kube::Error,
    },
    #[error("PinnedImageSet {set}: writing status: {source}")]
    SetWrite { set: String, source: kube::Error },
    #[error(transparent)]
    Convert(#[from] convert::ConvertError),
}

impl ControllerError {
    fn conflict(&self) -> bool {
        matches!(
            self,
            ControllerError::PoolWrite {
                source: kube::Error::Api(e),
                ..
            } | ControllerError::SetWrite {
                source: kube::Error::Api(e),
                ..
            } if e.code == 409
        )
    }
}

/// Shared by the pool and set reconcilers.
pub struct Context {
    pub client: Client,
    pub pools: Store<MachineConfigPool>,
    pub sets: Store<PinnedImageSet>,
    pub nodes: Store<MachineConfigNode>,
    pub metrics: Metrics,
    /// Each pool's selection as last computed (to trigger the sets that join or leave a pool).
    selections: Mutex<HashMap<String, Vec<String>>>,
    /// Sets whose pools changed, for the set reconciler.
    set_triggers: mpsc::UnboundedSender<ObjectRef<PinnedImageSet>>,
    /// Consecutive failures per object, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// True once every cache has its first full list.
    synced: tokio::sync::watch::Receiver<bool>,
}

impl Context {
    /// Wait until every cache has its first full list. (One task waits on the stores and
    /// broadcasts: a store's readiness does not wake many concurrent waiters reliably.)
    async fn synced(&self) {
        let _ = self.synced.clone().wait_for(|s| *s).await;
    }

    fn backoff(&self, key: String, conflict: bool) -> Duration {
        let mut failures = self.failures.lock().expect("failures lock");
        let n = failures.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        if conflict {
            // Someone else wrote first: read again soon.
            return Duration::from_millis(100);
        }
        Duration::from_millis(500u64.saturating_mul(1 << (*n - 1).min(10)))
            .min(Duration::from_secs(300))
    }

    fn succeeded(&self, key: &str) {
        self.failures.lock().expect("failures lock").remove(key);
    }
}

async fn reconcile_pool(
    mcp: Arc<MachineConfigPool>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    let started = Instant::now();
    let result = reconcile_pool_inner(&mcp, &ctx).await;
    ctx.metrics
        .observe_reconcile("pool", started.elapsed(), result.is_ok());
    if result.is_ok() {
        ctx.succeeded(&format!("pool/{}", mcp.name_any()));
    }
    result
}

async fn reconcile_pool_inner(
    mcp: &MachineConfigPool,
    ctx: &Context,
) -> Result<Action, ControllerError> {
    ctx.synced().await;
    let name = mcp.name_any();
    let api: Api<MachineConfigPool> = Api::all(ctx.client.clone());
    let core_pool = match convert::pool(mcp) {
        Ok(p) => p,
        Err(e) => {
            write_pool_status(ctx, &api, mcp, None, Some(e.to_string())).await?;
            return Ok(Action::await_change());
        }
    };
    let sets = ctx.sets.state();
    tracing::debug!(pool = %name, sets = sets.len(), "reconcile pool");
    let labelled = sets
        .iter()
        .map(|s| (s.metadata.name.as_deref().unwrap_or(""), s.labels()));
    let (selected, failure) = match pool::select_labelled(&core_pool, labelled) {
        Ok(selected) => (selected, None),
        Err(e @ PoolError::TooManySets { .. }) => (None, Some(e.to_string())),
    };
    if let Some(names) = &selected {
        let current: Option<Vec<String>> = mcp
            .spec
            .pinned_image_sets
            .as_ref()
            .map(|v| v.iter().map(|s| s.name.clone()).collect());
        let wanted = (!names.is_empty()).then(|| names.clone());
        if current != wanted {
            // A merge patch replaces the whole list; the resourceVersion makes a concurrent
            // writer's change a conflict (retried) instead of a lost update.
            let patch = json!({
                "metadata": {"resourceVersion": mcp.resource_version()},
                "spec": {"pinnedImageSets": wanted.as_ref().map(|v| v.iter().map(|n| json!({"name": n})).collect::<Vec<_>>())}
            });
            if let Err(source) = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                let err = ControllerError::PoolWrite {
                    pool: name.clone(),
                    what: "spec.pinnedImageSets",
                    source,
                };
                if !err.conflict() {
                    // Say why on the pool too; the error itself is retried with backoff.
                    let _ = write_pool_status(ctx, &api, mcp, None, Some(err.to_string())).await;
                }
                return Err(err);
            }
            ctx.metrics.count_api_write("pool_spec");
            tracing::info!(pool = %name, sets = ?names, "pool selection written");
        }
        let previous = ctx
            .selections
            .lock()
            .expect("selections lock")
            .insert(name.clone(), names.clone());
        // The sets that joined or left the pool get their status recomputed.
        let previous = previous.unwrap_or_default();
        for set in names
            .iter()
            .filter(|n| !previous.contains(n))
            .chain(previous.iter().filter(|n| !names.contains(n)))
        {
            let _ = ctx.set_triggers.send(ObjectRef::new(set));
        }
    }
    // Node counts for the sets the pool now holds, at their current generation.
    let wanted: Vec<(String, i64)> = selected
        .iter()
        .flatten()
        .filter_map(|n| {
            ctx.sets
                .get(&ObjectRef::new(n))
                .map(|s| (n.clone(), s.metadata.generation.unwrap_or(1).max(1)))
        })
        .collect();
    let reports: Vec<_> = ctx
        .nodes
        .state()
        .iter()
        .filter(|n| n.spec.pool.name == name)
        .map(|n| convert::node_report(n))
        .collect();
    let sync = pool::sync_status(&name, &wanted, &reports);
    let degraded = failure.or(sync.degraded.clone());
    write_pool_status(ctx, &api, mcp, Some(&sync), degraded).await?;
    Ok(Action::requeue(RESYNC))
}

/// Apply the pool's synchronizer entry and Degraded condition, only when they differ from what
/// the pool already says. `sync` is `None` when the counts could not be computed (kept as they are).
async fn write_pool_status(
    ctx: &Context,
    api: &Api<MachineConfigPool>,
    mcp: &MachineConfigPool,
    sync: Option<&pool::PoolSync>,
    degraded: Option<String>,
) -> Result<(), ControllerError> {
    let status = mcp.status.clone().unwrap_or_default();
    let old_entry = status
        .pool_synchronizers_status
        .iter()
        .find(|s| s.pool_synchronizer_type == SYNCHRONIZER);
    let entry = match sync {
        Some(s) => Some(PoolSynchronizerStatus {
            pool_synchronizer_type: SYNCHRONIZER.into(),
            machine_count: s.machine_count,
            updated_machine_count: s.updated_machine_count,
            ready_machine_count: s.ready_machine_count,
            available_machine_count: s.available_machine_count,
            unavailable_machine_count: s.unavailable_machine_count,
            observed_generation: mcp.metadata.generation,
        }),
        None => old_entry.cloned(),
    };
    let cond = condition::make(
        &status.conditions,
        CONDITION_DEGRADED,
        degraded.is_some(),
        if degraded.is_some() {
            "PinnedImageSetsFailed"
        } else {
            "AsExpected"
        },
        degraded.as_deref().unwrap_or(""),
        mcp.metadata.generation,
    );
    let same_cond = status.conditions.iter().any(|c| condition::same(c, &cond));
    if entry.as_ref() == old_entry && same_cond {
        return Ok(());
    }
    let mut body = json!({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfigPool",
        "metadata": {"resourceVersion": mcp.resource_version()},
        "status": {"conditions": [cond]},
    });
    if let Some(e) = entry {
        body["status"]["poolSynchronizersStatus"] = json!([e]);
    }
    api.patch_status(
        &mcp.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|source| ControllerError::PoolWrite {
        pool: mcp.name_any(),
        what: "status",
        source,
    })?;
    ctx.metrics.count_api_write("pool_status");
    Ok(())
}

async fn reconcile_set(
    set: Arc<PinnedImageSet>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    let started = Instant::now();
    let result = reconcile_set_inner(&set, &ctx).await;
    ctx.metrics
        .observe_reconcile("set", started.elapsed(), result.is_ok());
    if result.is_ok() {
        ctx.succeeded(&format!("set/{}", set.name_any()));
    }
    result
}

async fn reconcile_set_inner(
    set: &PinnedImageSet,
    ctx: &Context,
) -> Result<Action, ControllerError> {
    ctx.synced().await;
    let name = set.name_any();
    // The pools whose selector selects the set, judged from the pool cache as the pool
    // reconciler judges it (not from the written specs, which may lag).
    let labels = set.labels();
    let selections: Vec<(String, Vec<String>)> = ctx
        .pools
        .state()
        .iter()
        .filter_map(|p| convert::pool(p).ok())
        .filter_map(|p| {
            pool::select_labelled(&p, [(name.as_str(), labels)])
                .ok()
                .flatten()
                .map(|names| (p.name, names))
        })
        .collect();
    let pools = pool::pools_of_set(
        &name,
        selections
            .iter()
            .map(|(p, names)| (p.as_str(), names.as_slice())),
    );
    let status = PinnedImageSetStatus {
        image_count: set.spec.pinned_images.len() as u32,
        pools,
    };
    if set.status.as_ref() == Some(&status) {
        return Ok(Action::requeue(RESYNC));
    }
    let api: Api<PinnedImageSet> = Api::all(ctx.client.clone());
    api.patch_status(
        &name,
        &PatchParams::default(),
        // The resourceVersion turns a write from a stale cache into a conflict (read again)
        // instead of a repeated write.
        &Patch::Merge(
            &json!({"metadata": {"resourceVersion": set.resource_version()}, "status": status}),
        ),
    )
    .await
    .map_err(|source| ControllerError::SetWrite {
        set: name.clone(),
        source,
    })?;
    ctx.metrics.count_api_write("set_status");
    Ok(Action::requeue(RESYNC))
}

fn error_policy<K: ResourceExt>(obj: Arc<K>, error: &ControllerError, ctx: Arc<Context>) -> Action {
    let kind = if std::any::type_name::<K>().ends_with("PinnedImageSet") {
        "set"
    } else {
        "pool"
    };
    let wait = ctx.backoff(format!("{kind}/{}", obj.name_any()), error.conflict());
    if error.conflict() {
        tracing::debug!(error = %error, "conflict; reading again");
    } else {
        tracing::warn!(error = %error, retry_in = ?wait, "reconcile failed");
    }
    Action::requeue(wait)
}

/// Caches keep what pinset reads; `managedFields` (often the largest part of an object) go.
fn strip<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// The objects of a watch whose `key` changed since they were last seen, and every deletion.
fn changed_objects<K, T, S>(
    events: S,
    key: impl Fn(&K) -> T + Send + 'static,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send
where
    K: kube::Resource + Send + 'static,
    T: PartialEq + Send + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let mut seen: HashMap<String, T> = HashMap::new();
    events.flat_map(move |event| {
        let out: Vec<Result<K, watcher::Error>> = match event {
            Err(e) => vec![Err(e)],
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                let k = key(&o);
                let name = o.name_any();
                if seen.get(&name) == Some(&k) {
                    vec![]
                } else {
                    seen.insert(name, k);
                    vec![Ok(o)]
                }
            }
            Ok(watcher::Event::Delete(o)) => {
                seen.remove(&o.name_any());
                vec![Ok(o)]
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => vec![],
        };
        futures::stream::iter(out)
    })
}

/// Reconcile errors are logged by the error policy; here the controller's own (watches, queue).
fn log_outcome<K, E: std::error::Error, W: std::error::Error>(
    outcome: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, W>>,
) -> std::future::Ready<()>
where
    K: kube::Resource,
{
    match outcome {
        Ok((obj, _)) => tracing::trace!(object = %obj, "reconciled"),
        Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
        Err(e) => tracing::warn!(error = %e, "controller"),
    }
    std::future::ready(())
}

/// Run both reconcilers until `shutdown` fires.
pub async fn run(
    client: Client,
    metrics: Metrics,
    ready: Arc<std::sync::atomic::AtomicBool>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let pools_api: Api<MachineConfigPool> = Api::all(client.clone());
    let sets_api: Api<PinnedImageSet> = Api::all(client.clone());
    let nodes_api: Api<MachineConfigNode> = Api::all(client.clone());
    let config = watcher_config();

    let (sets_reader, sets_writer) = reflector::store();
    // A pool cares about a set's labels and spec (its generation), not its status; about a
    // node's report, not its progress.
    let sets_stream = changed_objects(
        watcher(sets_api.clone(), config.clone())
            .default_backoff()
            .modify(strip)
            .reflect(sets_writer),
        |s: &PinnedImageSet| (s.metadata.generation, s.labels().clone()),
    );
    let (nodes_reader, nodes_writer) = reflector::store();
    let nodes_stream = changed_objects(
        watcher(nodes_api, config.clone())
            .default_backoff()
            .modify(strip)
            .reflect(nodes_writer),
        convert::node_report,
    );

    // Bounded concurrency: each reconcile in flight may hold an HTTP connection (a TLS session),
    // so unbounded reconciles of a thousand objects would open a thousand connections.
    let limits = kube::runtime::controller::Config::default().concurrency(CONCURRENCY);
    let (pools_reader, pools_writer) = reflector::store();
    let pools_stream = watcher(pools_api, config.clone())
        .default_backoff()
        .modify(strip)
        .reflect(pools_writer)
        .applied_objects();
    let pool_controller =
        Controller::for_stream(pools_stream, pools_reader.clone()).with_config(limits.clone());
    let (set_triggers, set_trigger_rx) = mpsc::unbounded_channel();
    let (synced_tx, synced) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Context {
        client,
        pools: pools_reader.clone(),
        sets: sets_reader,
        nodes: nodes_reader,
        metrics,
        selections: Mutex::new(HashMap::new()),
        set_triggers,
        failures: Mutex::new(HashMap::new()),
        synced,
    });

    // A set change concerns the pools that select it now or listed it before.
    let mapper_pools = pools_reader.clone();
    let set_to_pools = move |set: PinnedImageSet| {
        let labels = set.labels().clone();
        let name = set.name_any();
        mapper_pools
            .state()
            .iter()
            .filter(|p| {
                let listed = p
                    .spec
                    .pinned_image_sets
                    .iter()
                    .flatten()
                    .any(|s| s.name == name);
                listed
                    || convert::pool(p).is_ok_and(|c| {
                        !c.machine_config_selector.is_empty()
                            && c.machine_config_selector.matches(&labels)
                    })
            })
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect::<Vec<_>>()
    };
    let node_to_pool =
        |n: MachineConfigNode| Some(ObjectRef::<MachineConfigPool>::new(&n.spec.pool.name));

    let stop = shutdown.clone();
    let pools = pool_controller
        .watches_stream(sets_stream, set_to_pools)
        .watches_stream(nodes_stream, node_to_pool)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile_pool, error_policy, ctx.clone())
        .for_each(log_outcome);

    let stop = shutdown.clone();
    let (own_sets_reader, own_sets_writer) = reflector::store();
    let own_sets = watcher(sets_api, config)
        .default_backoff()
        .modify(strip)
        .reflect(own_sets_writer)
        .applied_objects();
    let sets = Controller::for_stream(own_sets, own_sets_reader)
        .with_config(limits)
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            set_trigger_rx,
        ))
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile_set, error_policy, ctx.clone())
        .for_each(log_outcome);

    let readiness = {
        let ctx = ctx.clone();
        async move {
            let _ = ctx.pools.wait_until_ready().await;
            let _ = ctx.sets.wait_until_ready().await;
            let _ = ctx.nodes.wait_until_ready().await;
            let _ = synced_tx.send(true);
            ready.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                pools = ctx.pools.state().len(),
                sets = ctx.sets.state().len(),
                nodes = ctx.nodes.state().len(),
                "controller caches synced"
            );
        }
    };
    tokio::join!(pools, sets, readiness);
    Ok(())
}
