//! `pinset controller`: for every MachineConfigPool, the PinnedImageSets it selects
//! (`spec.pinnedImageSets`) and how far its nodes are (`status.poolSynchronizersStatus` and the
//! `PinnedImageSetsDegraded` condition); for every PinnedImageSet, its size and pools (status).
//!
//! The decisions are the core's (`pinset_core::pool`); this module reads the objects from watch
//! caches and writes only what changed. One [`Context`] is shared by both reconcilers:
//!
//! - this file: the context, the error and its policy (backoff per object), the wiring;
//! - `pool`: a pool's selection (`spec.pinnedImageSets`) and status;
//! - `rollout`: a pool's fleet rollout (the policy's grants on the nodes);
//! - `status_lane`: pool statuses and Events, written off the reconcile, behind the grants;
//! - `set`: a set's status (image count, pools);
//! - `watch`: the watch streams (only the changes a reconciler cares about).

mod fleet;
mod node_policy;
mod pool;
mod rollout;
mod set;
mod status_lane;
mod watch;

pub use fleet::FleetPolicies;
pub use node_policy::SignatureGate;
pub use rollout::FleetTable;

use crate::api::{MachineConfigNode, MachineConfigPool, PinnedImageSet};
use crate::convert;
use crate::metrics::Metrics;
use crate::watcher_config;
use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub const FIELD_MANAGER: &str = "pinset-controller";
/// Pool reconciles in flight. A pool's reconcile writes its nodes' grants (its status and
/// Events go to the status lane): in a rollout burst, 4 keep the API server's queue short
/// enough that each grant lands sooner than with 8 (BENCHMARKS.md, fleet rollout).
pub const POOL_CONCURRENCY: u16 = 4;
/// Set reconciles in flight: each writes one set status.
pub const SET_CONCURRENCY: u16 = 8;
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
    #[error("MachineConfigNode {node} (pool {pool}): writing its rollout grant: {source}")]
    GrantWrite {
        node: String,
        pool: String,
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

/// What of a MachineConfigNode its pool's reconcile depends on: the node's report, and its
/// readiness and labels (a NotReady node frees its rollout slot). Progress updates are not in
/// it, nor the grants this controller writes.
type NodeChange = (pinset_core::pool::NodeReport, Option<crate::api::NodeState>);

fn set_change(s: &PinnedImageSet) -> (Option<i64>, BTreeMap<String, String>) {
    (s.metadata.generation, s.labels().clone())
}

type PoolChange = (
    Option<i64>,
    BTreeMap<String, String>,
    BTreeMap<String, String>,
);

fn pool_change(p: &MachineConfigPool) -> PoolChange {
    let m = &p.metadata;
    (m.generation, p.labels().clone(), p.annotations().clone())
}

fn node_change(n: &MachineConfigNode) -> NodeChange {
    (
        convert::node_report(n),
        n.status.as_ref().and_then(|s| s.node_state.clone()),
    )
}

/// Shared by the pool and set reconcilers.
pub struct Context {
    pub client: Client,
    pub pools: Store<MachineConfigPool>,
    pub sets: Store<PinnedImageSet>,
    pub nodes: Store<MachineConfigNode>,
    pub metrics: Metrics,
    /// The fleet policy of each pool.
    pub fleet: FleetPolicies,
    /// The node policy configuration the agents follow (`None`: the agents' own, not rolled
    /// out), and the last one read.
    node_policies: Option<crate::policy_config::ConfigSource>,
    last_node_policies: Mutex<crate::policy_config::PolicyConfig>,
    /// Signatures of the node modules the configuration names, checked before any grant.
    signatures: SignatureGate,
    /// Each pool's last fleet decision, and the state it was made for.
    decisions: rollout::Decisions,
    /// Each pool's selection as last computed (to trigger the sets that join or leave a pool).
    selections: Mutex<HashMap<String, Vec<String>>>,
    /// Pool statuses and Events, written behind the grants.
    status_lane: status_lane::StatusLane,
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
        crate::backoff::delay(Duration::from_millis(500), Duration::from_secs(300), *n)
    }

    /// When to try `key` again after `error`, said once: a conflict quietly (someone wrote
    /// first; read again soon), anything else as a warning with `what` failed and the wait.
    fn retry_after(&self, key: String, error: &ControllerError, what: &str) -> Duration {
        let wait = self.backoff(key, error.conflict());
        if error.conflict() {
            tracing::debug!(error = %error, "conflict; reading again");
        } else if let Some(why) = crate::forbidden::refusal(error) {
            tracing::warn!(error = %why, retry_in = ?wait, "{what}");
        } else {
            tracing::warn!(error = %error, retry_in = ?wait, "{what}");
        }
        wait
    }

    /// The node policy module the configuration names for `pool` (its reference) and what its
    /// signature check says now, when it names one. Never waits on a registry. The last
    /// configuration read when the current one cannot be read.
    fn node_policy(&self, pool: &str) -> Option<(String, node_policy::Gate)> {
        let generation = self.policy_observed().and_then(|(_, g)| g);
        self.signatures.configuration_at(generation);
        let config = self.policy_config();
        let m = config.pools.get(pool)?;
        Some((m.reference(), self.signatures.check(&config, pool, m)))
    }

    /// The PolicyConfiguration followed and its generation (see [`ConfigSource::observed`]).
    ///
    /// [`ConfigSource::observed`]: crate::policy_config::ConfigSource::observed
    fn policy_observed(&self) -> Option<(String, Option<i64>)> {
        self.node_policies.as_ref()?.observed()
    }

    /// The policy configuration now; the last one read when it cannot be read (said).
    fn policy_config(&self) -> crate::policy_config::PolicyConfig {
        let Some(source) = self.node_policies.as_ref() else {
            return Default::default();
        };
        let mut last = self.last_node_policies.lock().expect("policy config lock");
        match source.current() {
            Ok(config) => *last = config,
            Err(e) => {
                tracing::warn!(error = %e, "policy configuration unreadable; using the last one read")
            }
        }
        last.clone()
    }

    fn succeeded(&self, key: &str) {
        self.failures.lock().expect("failures lock").remove(key);
    }
}

/// The kinds the controller reconciles, each with the word that keys its backoff and metrics.
trait Reconciled: ResourceExt {
    const KIND: &'static str;
}

impl Reconciled for MachineConfigPool {
    const KIND: &'static str = "pool";
}

impl Reconciled for PinnedImageSet {
    const KIND: &'static str = "set";
}

/// Time a reconcile, count it, and forget the object's failures when it succeeded.
async fn observed<K: Reconciled>(
    obj: &K,
    ctx: &Context,
    reconcile: impl Future<Output = Result<Action, ControllerError>>,
) -> Result<Action, ControllerError> {
    let started = Instant::now();
    let result = reconcile.await;
    ctx.metrics
        .observe_reconcile(K::KIND, started.elapsed(), result.is_ok());
    if result.is_ok() {
        ctx.succeeded(&format!("{}/{}", K::KIND, obj.name_any()));
    }
    result
}

fn error_policy<K: Reconciled>(obj: Arc<K>, error: &ControllerError, ctx: Arc<Context>) -> Action {
    let key = format!("{}/{}", K::KIND, obj.name_any());
    Action::requeue(ctx.retry_after(key, error, "reconcile failed"))
}

/// Run both reconcilers until `shutdown` fires.
pub async fn run(
    client: Client,
    metrics: Metrics,
    fleet: FleetPolicies,
    node_policies: Option<(String, SignatureGate)>,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
) {
    let pools_api: Api<MachineConfigPool> = Api::all(client.clone());
    let sets_api: Api<PinnedImageSet> = Api::all(client.clone());
    let nodes_api: Api<MachineConfigNode> = Api::all(client.clone());
    // A pool cares about a set's labels and spec (its generation), not its status; about a
    // node's report, not its progress; about its own spec, labels and annotations (the rollout
    // ceiling), not the status this controller writes.
    let (sets_reader, sets_stream) =
        watch::cached_changes(sets_api.clone(), set_change, metrics.clone());
    let (nodes_reader, nodes_stream) =
        watch::cached_changes(nodes_api, node_change, metrics.clone());
    let (pools_reader, pools_stream) =
        watch::cached_changes(pools_api, pool_change, metrics.clone());
    let (set_triggers, set_trigger_rx) = mpsc::unbounded_channel();
    let (pool_triggers, pool_trigger_rx) = mpsc::unbounded_channel();
    let (synced_tx, synced) = tokio::sync::watch::channel(false);
    let (node_policies, signatures) = match node_policies {
        Some((name, gate)) => {
            let (pools, triggers) = (&pools_reader, &pool_triggers);
            let source =
                follow_node_policies(&client, name, pools, triggers, &metrics, &shutdown).await;
            (Some(source), gate)
        }
        None => (None, SignatureGate::new(None)),
    };
    signatures.notify(pool_triggers.clone());
    fleet.notify(pool_triggers.clone());
    let ctx = Arc::new(Context {
        node_policies,
        last_node_policies: Mutex::new(Default::default()),
        signatures,
        client,
        pools: pools_reader,
        sets: sets_reader,
        nodes: nodes_reader,
        status_lane: status_lane::StatusLane::new(
            pool_triggers,
            metrics.pool_status_pending_gauge(),
        ),
        metrics,
        fleet,
        decisions: rollout::Decisions::default(),
        selections: Mutex::new(HashMap::new()),
        set_triggers,
        failures: Mutex::new(HashMap::new()),
        synced,
    });
    let watched = (pools_stream, sets_stream, nodes_stream);
    let pools = run_pools(watched, pool_trigger_rx, ctx.clone(), shutdown.clone());
    let sets = run_sets(sets_api, set_trigger_rx, ctx.clone(), shutdown);
    tokio::join!(pools, sets, announce_ready(ctx.clone(), synced_tx, ready));
    settle(&ctx).await;
}

/// Before the controller stops: the status writes and Events on their way land, for a while.
async fn settle(ctx: &Context) {
    if !ctx.status_lane.settle(SETTLE).await {
        tracing::warn!(waited = ?SETTLE, "stopping with status writes or Events still on their way");
    }
}

/// How long a stopping controller waits for the writes and Events on their way.
const SETTLE: Duration = Duration::from_secs(5);

/// The pool reconciler: a pool's own changes, its sets' and its nodes', and the triggers of
/// the other parts (a set's status lane, a policy's change) reconcile it.
async fn run_pools(
    (pools, sets, nodes): (
        impl Stream<Item = Result<MachineConfigPool, watcher::Error>> + Send + 'static,
        impl Stream<Item = Result<PinnedImageSet, watcher::Error>> + Send + 'static,
        impl Stream<Item = Result<MachineConfigNode, watcher::Error>> + Send + 'static,
    ),
    triggers: mpsc::UnboundedReceiver<ObjectRef<MachineConfigPool>>,
    ctx: Arc<Context>,
    stop: CancellationToken,
) {
    let node_to_pool =
        |n: MachineConfigNode| Some(ObjectRef::<MachineConfigPool>::new(&n.spec.pool.name));
    Controller::for_stream(pools, ctx.pools.clone())
        .with_config(limits(POOL_CONCURRENCY))
        .trigger_backoff(watch::OwnBackoffOnly)
        .watches_stream(sets, set_to_pools(ctx.pools.clone()))
        .watches_stream(nodes, node_to_pool)
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            triggers,
        ))
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(pool::reconcile, error_policy, ctx)
        .for_each(watch::log_outcome)
        .await
}

/// Follow the node policy configuration: a change reconciles every pool (its target changes).
async fn follow_node_policies(
    client: &Client,
    name: String,
    pools: &Store<MachineConfigPool>,
    triggers: &mpsc::UnboundedSender<ObjectRef<MachineConfigPool>>,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> crate::policy_config::ConfigSource {
    let (pools, triggers) = (pools.clone(), triggers.clone());
    let on_change = move || {
        for pool in pools.state() {
            let _ = triggers.send(ObjectRef::from_obj(pool.as_ref()));
        }
    };
    crate::policy_config::ConfigSource::watch(
        client.clone(),
        name,
        vec![],
        metrics.clone(),
        on_change,
        shutdown.clone(),
    )
    .await
}

/// Bounded concurrency: each reconcile in flight may hold an HTTP connection (a TLS session),
/// so unbounded reconciles of a thousand objects would open a thousand connections.
fn limits(concurrency: u16) -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(concurrency)
}

/// A set change concerns the pools that select it now or listed it before.
fn set_to_pools(
    pools: Store<MachineConfigPool>,
) -> impl Fn(PinnedImageSet) -> Vec<ObjectRef<MachineConfigPool>> {
    move |set: PinnedImageSet| {
        let labels = set.labels().clone();
        let name = set.name_any();
        pools
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
            .collect()
    }
}

/// The set reconciler: on its own watch, and on the triggers of the pool reconciler.
async fn run_sets(
    sets_api: Api<PinnedImageSet>,
    triggers: mpsc::UnboundedReceiver<ObjectRef<PinnedImageSet>>,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
) {
    let metrics = ctx.metrics.clone();
    let (reader, events) = crate::cached_watch(sets_api, watcher_config());
    let own_sets = events.applied_objects().filter(move |event| {
        if let Err(e) = event {
            crate::watch_interrupted::<PinnedImageSet>(&metrics, e);
        }
        std::future::ready(event.is_ok())
    });
    Controller::for_stream(own_sets, reader)
        .with_config(limits(SET_CONCURRENCY))
        .trigger_backoff(watch::OwnBackoffOnly)
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            triggers,
        ))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(set::reconcile, error_policy, ctx)
        .for_each(watch::log_outcome)
        .await;
}

/// Once every cache has its first full list: let the reconcilers go, and say ready.
async fn announce_ready(
    ctx: Arc<Context>,
    synced: tokio::sync::watch::Sender<bool>,
    ready: Arc<AtomicBool>,
) {
    let _ = ctx.pools.wait_until_ready().await;
    let _ = ctx.sets.wait_until_ready().await;
    let _ = ctx.nodes.wait_until_ready().await;
    let _ = synced.send(true);
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(
        pools = ctx.pools.state().len(),
        sets = ctx.sets.state().len(),
        nodes = ctx.nodes.state().len(),
        "controller caches synced"
    );
}
