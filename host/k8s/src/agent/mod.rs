//! The node agent: watches pools and sets, reconciles its node with the node crate's
//! [`Reconciler`], cancels and restarts when its desired state changes, and publishes status on
//! its MachineConfigNode.
//!
//! - this file: the loop (one round: desired state → spec → reconcile → publish → idle);
//! - [`watch`]: reflector caches, node facts, change detection;
//! - [`status`]: the status model as a MachineConfigNode and its writes;
//! - [`policies`]: which policy module a node decides with, and its swaps;
//! - [`taint`]: the startup taint lifted once the node's sets are pinned.

mod checks;
pub mod policies;
mod status;
mod swap;
mod taint;
mod watch;

pub use policies::{Loader, NodePolicy, WantedPolicy};
pub use status::node_status;
pub use watch::desired_of;

use crate::api::{MachineConfigNode, MachineConfigPool, PinnedImageSet};
use crate::metrics::Metrics;
use crate::policy_config::{ConfigSource, PolicyConfig};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use pinset_core::decisions::Decisions;
use pinset_core::desired::{Desired, NodeInfo};
use pinset_core::status::{NodeStatus, Progress};
use pinset_node::pin::PinBackend;
use pinset_node::{ReconcileError, Reconciler, Report};
use pinset_policy::Guarded;
use pinset_registry::size::Sizer;
use serde_json::json;
use status::Published;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch as signal;
use tokio_util::sync::CancellationToken;

pub const FIELD_MANAGER: &str = "pinset-agent";

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("node {node}: reading the Node object: {source}")]
    NodeApi { node: String, source: kube::Error },
    #[error("node {node}: {source}")]
    NodeFile {
        node: String,
        /// Boxed: the largest of the agent's errors, which travel by value.
        source: Box<crate::objects::ObjectError>,
    },
    #[error("node {node}: {file}: no Node object named {node} in the file")]
    NodeMissing { node: String, file: PathBuf },
    #[error("node {node}: {source}")]
    Convert {
        node: String,
        source: crate::convert::ConvertError,
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
    /// After a failed reconcile, retry after this long, doubling up to `retry_max` (each wait
    /// with a random jitter of up to as much again).
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// At most one status write per this interval while pulling.
    pub publish_interval: Duration,
    /// Pull only what the pool's fleet policy granted (recorded by the controller on the
    /// node's MachineConfigNode); `false` pulls as soon as the sets change, as the reference.
    pub wait_for_grants: bool,
    /// The taint to lift from the node's Node once its sets are pinned ([`taint`]); needs the
    /// Node from the API (no `node_file`).
    pub startup_taint: Option<pinset_core::startup_taint::StartupTaint>,
    /// Lift it anyway once the node is this old.
    pub startup_taint_deadline: Option<Duration>,
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
            wait_for_grants: true,
            startup_taint: None,
            startup_taint_deadline: None,
        }
    }
}

/// Where the agent's policy configuration comes from.
#[derive(Clone, Debug)]
pub enum PolicySettings {
    /// Read once (a file, flags): the node's own, taken without a rollout grant.
    Fixed(PolicyConfig),
    /// Followed in a PolicyConfiguration (its name), `--pool-policy` flags over it; a module is
    /// taken under a rollout grant.
    Followed { name: String, flags: Vec<String> },
}

pub struct Agent<S, B> {
    pub client: Client,
    pub config: AgentConfig,
    pub reconciler: Reconciler<S, B>,
    /// Fetches, verifies and compiles policy modules (shared with blocking tasks).
    pub loader: Arc<Loader>,
    /// The module a node decides with when the configuration names none: the embedded default
    /// (or `--policy`).
    pub default_policy: pinset_policy::PolicyModule,
    pub policy_settings: PolicySettings,
    pub metrics: Metrics,
    pub ready: Arc<AtomicBool>,
}

/// The watched objects, and the signal that any of them changed.
struct Caches {
    pools: Store<MachineConfigPool>,
    sets: Store<PinnedImageSet>,
    /// The node's own MachineConfigNode (its rollout grant).
    own: Store<MachineConfigNode>,
    /// The node's own Node object (its facts); `None` with a `--node-file`.
    node: Option<Store<Node>>,
    /// Set when the watch of the node's MachineConfigNode sees it deleted; taken by the round
    /// that writes it again.
    own_deleted: Arc<AtomicBool>,
    changed: signal::Receiver<u64>,
}

/// What the agent's loop keeps from one round to the next.
struct Rounds {
    caches: Caches,
    node_api: Api<MachineConfigNode>,
    published: Published,
    status: NodeStatus,
    failures: u32,
    /// Each set's state as the last Events told it.
    seen: status::Seen,
    /// The policy configuration, and the last one that could be read.
    policy_source: ConfigSource,
    last_config: PolicyConfig,
    policy: NodePolicy,
    /// Policy checks running in the background, and their rechecks.
    checks: checks::Checks,
    /// The uid of the node's Node object, when its facts came from the API: the owner of its
    /// MachineConfigNode.
    node_uid: Option<String>,
    /// Why the startup taint was last kept (said once per reason).
    taint_kept: Option<String>,
}

/// What follows a round.
enum Next {
    /// Stop: the agent is shutting down.
    Stop,
    /// Reconcile again at once (the desired state changed mid-round).
    Again,
    /// Idle this long, or until the desired state changes.
    Idle(Duration),
}

impl<S: Sizer + 'static, B: PinBackend> Agent<S, B> {
    /// Run until `shutdown`; a reconcile in flight is cancelled (pulls dropped, pins left as they
    /// were) and the status says so.
    pub async fn run(self, shutdown: CancellationToken) {
        let Some(mut rounds) = self.start(&shutdown).await else {
            return;
        };
        let mut known: Option<NodeInfo> = None;
        loop {
            rounds.caches.changed.borrow_and_update();
            let node = match watch::node_info(&self.config, &self.client, &rounds.caches).await {
                Ok(read) => {
                    rounds.node_uid = read.uid;
                    known.insert(read.facts).clone()
                }
                // The API server is away: the node's last known facts do while it is.
                Err(e @ AgentError::NodeApi { .. }) if known.is_some() => {
                    tracing::warn!(error = %e, "using the node's last known facts");
                    known.clone().expect("checked")
                }
                Err(e) => match self.report_unknown_desired(&mut rounds, e, &shutdown).await {
                    Next::Stop => return,
                    _ => continue,
                },
            };
            let desired = watch::desired_now(&self.config, &node, &rounds.caches);
            match self.round(&mut rounds, &node, &desired, &shutdown).await {
                Next::Stop => return,
                Next::Again => continue,
                Next::Idle(wait) => {
                    let done = rounds.status.done();
                    tracing::info!(node = %node.name, done, next_in = ?wait, "reconcile finished");
                    // The agent idles until the next change: what the reconcile freed goes back
                    // to the system instead of staying in the allocator.
                    pinset_node::os::release_free_memory();
                    self.idle(&rounds, &node, &desired, wait, &shutdown).await;
                    if shutdown.is_cancelled() {
                        return;
                    }
                }
            }
        }
    }

    /// Start the caches, wait until they are filled, read the last published status, and
    /// start with the policy module it says the node ran.
    async fn start(&self, shutdown: &CancellationToken) -> Option<Rounds> {
        let (changes, changed) = signal::channel(0u64);
        let caches = self.spawn_caches(&changes, changed, shutdown);
        let checks = checks::Checks::new(changes.clone());
        let policy_source = self.policy_source(changes, shutdown).await;
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = async {
                let _ = caches.pools.wait_until_ready().await;
                let _ = caches.sets.wait_until_ready().await;
                let _ = caches.own.wait_until_ready().await;
            } => {}
        }
        let node_api: Api<MachineConfigNode> = Api::all(self.client.clone());
        let mut published = Published::default();
        let mut status = NodeStatus::default();
        let mut ran = None;
        match node_api.get_opt(&self.config.node_name).await {
            Ok(Some(mcn)) => {
                let st = mcn.status.unwrap_or_default();
                status.sets = st
                    .pinned_image_sets
                    .into_iter()
                    .map(|s| (s.name.clone(), status::set_status(s)))
                    .collect();
                published.conditions = st.conditions;
                ran = st.policy.map(|p| (p.module, p.since.0.to_string()));
                ran = ran.filter(|(module, _)| module != pinset_policy::EMBEDDED_DEFAULT_NAME);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(node = %self.config.node_name, error = %e, "cannot read the MachineConfigNode; starting from an empty status")
            }
        }
        let last_config = policy_source.current().unwrap_or_default();
        let pool = self.pool_of_own(&caches);
        let policy = self.restore_policy(&last_config, pool, ran).await;
        self.ready.store(true, Ordering::Relaxed);
        let rounds = Rounds {
            caches,
            node_api,
            published,
            seen: status::Seen::of(&status),
            status,
            failures: 0,
            policy_source,
            last_config,
            policy,
            checks,
            node_uid: None,
            taint_kept: None,
        };
        self.prune_cache(&rounds);
        Some(rounds)
    }

    fn spawn_caches(
        &self,
        changes: &signal::Sender<u64>,
        changed: signal::Receiver<u64>,
        shutdown: &CancellationToken,
    ) -> Caches {
        let own_only =
            crate::watcher_config().fields(&format!("metadata.name={}", self.config.node_name));
        let own_deleted = Arc::new(AtomicBool::new(false));
        let deleted = own_deleted.clone();
        let on_own = move |event: &watcher::Event<MachineConfigNode>| {
            if let watcher::Event::Delete(_) = event {
                deleted.store(true, Ordering::Relaxed);
            }
        };
        Caches {
            pools: self.reflector(crate::watcher_config(), changes, shutdown, |_| {}),
            sets: self.reflector(crate::watcher_config(), changes, shutdown, |_| {}),
            own: self.reflector(own_only.clone(), changes, shutdown, on_own),
            node: (self.config.node_file.is_none())
                .then(|| self.reflector(own_only, changes, shutdown, |_| {})),
            own_deleted,
            changed,
        }
    }

    /// A cache of the `K` that `config` selects; each event is given to `also`, then signalled
    /// on `changes`.
    fn reflector<K: crate::WatchedKind>(
        &self,
        config: watcher::Config,
        changes: &signal::Sender<u64>,
        shutdown: &CancellationToken,
        also: impl Fn(&watcher::Event<K>) + Send + 'static,
    ) -> Store<K> {
        let changes = changes.clone();
        crate::spawn_reflector::<K>(
            self.client.clone(),
            config,
            move |event| {
                also(event);
                changes.send_modify(|n| *n += 1)
            },
            self.metrics.clone(),
            shutdown.clone(),
        )
    }

    /// The policy configuration: fixed, or a PolicyConfiguration followed through a watch whose changes
    /// wake the loop like the other caches'.
    async fn policy_source(
        &self,
        changes: signal::Sender<u64>,
        shutdown: &CancellationToken,
    ) -> ConfigSource {
        match &self.policy_settings {
            PolicySettings::Fixed(config) => ConfigSource::Fixed(config.clone()),
            PolicySettings::Followed { name, flags } => {
                let on_change = move || changes.send_modify(|n| *n += 1);
                ConfigSource::watch(
                    self.client.clone(),
                    name.clone(),
                    flags.clone(),
                    self.metrics.clone(),
                    on_change,
                    shutdown.clone(),
                )
                .await
            }
        }
    }

    /// The primary pool its MachineConfigNode names (as last written by this agent).
    fn pool_of_own(&self, caches: &Caches) -> Option<String> {
        let own = caches.own.get(&kube::runtime::reflector::ObjectRef::new(
            &self.config.node_name,
        ))?;
        Some(own.spec.pool.name.clone()).filter(|p| !p.is_empty())
    }

    /// The module the node's status says it ran (`ran`: reference and since when), loaded
    /// again under the keys configured now — from the node's cache for an artifact, even with
    /// the registry away; the embedded default when there is none or it cannot be loaded. A
    /// registry away (the keys changed, the cache cannot vouch for it) is no verdict on the
    /// module: the node says it waits, and checks it again in the background.
    async fn restore_policy(
        &self,
        config: &PolicyConfig,
        pool: Option<String>,
        ran: Option<(String, String)>,
    ) -> NodePolicy {
        let Some((reference, since)) = ran else {
            return NodePolicy::new(policies::Loaded::default_of(&self.default_policy));
        };
        let (loader, config, at) = (self.loader.clone(), config.clone(), reference.clone());
        let restored = tokio::task::spawn_blocking(move || {
            policies::restore(&loader, &config, pool.as_deref(), &at, &since)
        })
        .await
        .unwrap_or_else(|e| {
            let why = format!("restoring task failed: {e}");
            Err((pinset_core::refusal::Refusal::NotAPolicy, why))
        });
        match restored {
            Ok((loaded, keys)) => {
                tracing::info!(module = %reference, "deciding with the module the node ran before the restart");
                let mut policy = NodePolicy::new(loaded);
                policy.confirm_keys(&keys);
                policy
            }
            Err((kind, cause)) => {
                let mut policy =
                    NodePolicy::new(policies::Loaded::default_of(&self.default_policy));
                let key = policies::CheckKey {
                    module: Some(reference),
                    keys: String::new(),
                };
                policy.refuse(&key, kind, format!("after a restart: {cause}"));
                policy
            }
        }
    }

    /// The node's facts cannot be read: say so on the status, retry later.
    async fn report_unknown_desired(
        &self,
        rounds: &mut Rounds,
        e: AgentError,
        shutdown: &CancellationToken,
    ) -> Next {
        tracing::error!(error = %e, "cannot compute the node's desired state");
        rounds.status.finish(Some(e.to_string()));
        self.publish(&rounds.node_api, &mut rounds.published, &rounds.status)
            .await;
        tokio::select! {
            _ = shutdown.cancelled() => Next::Stop,
            _ = tokio::time::sleep(self.config.retry_min) => Next::Again,
        }
    }

    /// One round: the spec, the reconcile (cancelled when the desired state changes), the
    /// status. Says what comes next.
    async fn round(
        &self,
        rounds: &mut Rounds,
        node: &NodeInfo,
        desired: &Desired,
        shutdown: &CancellationToken,
    ) -> Next {
        let deleted = rounds.caches.own_deleted.swap(false, Ordering::Relaxed);
        let missing =
            rounds.published.spec.is_some() && watch::own_missing(&self.config, &rounds.caches);
        if deleted || missing {
            // Deleted since it was written (by hand, or with its CRD): written again, whole.
            tracing::warn!(node = %self.config.node_name, "the MachineConfigNode is gone; writing it again");
            rounds.published = status::Published::default();
        }
        self.sync_spec(rounds, desired).await;
        rounds.status.node_ready = Some(node.ready);
        rounds.status.node_labels = node.labels.clone();
        self.swap_policy(rounds, node, desired).await;
        let started = Instant::now();
        let result = self.reconcile(rounds, node, desired, shutdown).await;
        self.account(rounds, desired, &result, started);
        let cancelled = match &result {
            Ok(r) => r.cancelled,
            Err(e) => {
                tracing::error!(node = %node.name, error = %e, "reconcile failed");
                false
            }
        };
        if shutdown.is_cancelled() {
            rounds.status.progressing = Some(
                "interrupted: the agent is stopping; the work resumes when it restarts".into(),
            );
            let publish = self.publish(&rounds.node_api, &mut rounds.published, &rounds.status);
            let _ = tokio::time::timeout(Duration::from_secs(3), publish).await;
            return Next::Stop;
        }
        if cancelled {
            tracing::info!(node = %node.name, "the desired state changed: reconciling again");
            return Next::Again;
        }
        let published = self
            .publish(&rounds.node_api, &mut rounds.published, &rounds.status)
            .await;
        self.record_events(&mut rounds.status, &mut rounds.seen)
            .await;
        let lifted = self.lift_startup_taint(rounds).await;
        let wait = self.next_wait(rounds);
        // An unpublished status, or a taint not lifted, is not left for the next resync: try
        // again soon.
        Next::Idle(match published && lifted {
            true => wait,
            false => wait.min(self.config.retry_min),
        })
    }

    /// After a reconcile: the policy's probation settled, its state reported, the metrics.
    fn account(
        &self,
        rounds: &mut Rounds,
        desired: &Desired,
        result: &Result<Report, ReconcileError>,
        started: Instant,
    ) {
        let succeeded = matches!(result, Ok(r) if !r.cancelled);
        if let Some(r) = rounds
            .policy
            .after_reconcile(succeeded, &rounds.status.policy_fallbacks)
        {
            self.metrics.count_policy_swap(r.as_str());
        }
        let pool = desired.pools.first().map(String::as_str);
        let config = rounds.last_config.clone();
        let wanted = self.wanted(rounds, &config, &desired.pools);
        rounds.policy.report(&wanted, &mut rounds.status);
        self.metrics
            .set_policy_info(pool.unwrap_or(""), &rounds.policy.running().running);
        let ok = succeeded && rounds.status.degraded.is_none();
        self.metrics
            .observe_reconcile("node", started.elapsed(), ok);
        if !matches!(result, Ok(r) if r.cancelled) {
            self.metrics.observe_node_sets(&rounds.status);
            self.metrics
                .observe_rollout_waiting(rounds.status.waiting.len());
        }
    }

    /// After a failure, back off (doubling up to `retry_max`, with jitter); after a success,
    /// resync.
    fn next_wait(&self, rounds: &mut Rounds) -> Duration {
        if rounds.status.degraded.is_some() {
            rounds.failures = rounds.failures.saturating_add(1);
            crate::backoff::delay(
                self.config.retry_min,
                self.config.retry_max,
                rounds.failures,
            )
        } else {
            rounds.failures = 0;
            self.config.resync
        }
    }

    /// The reconcile with the primary pool's policy, its progress published as it goes, and a
    /// watch that cancels it when the desired state changes (or the agent stops).
    async fn reconcile(
        &self,
        rounds: &mut Rounds,
        node: &NodeInfo,
        desired: &Desired,
        shutdown: &CancellationToken,
    ) -> Result<Report, ReconcileError> {
        let cancel = shutdown.child_token();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut preview = rounds.status.clone();
        preview.start(
            desired,
            Progress {
                images_total: desired.images.len() as u64,
                ..Default::default()
            },
        );
        preview.progressing = Some(format!("working on {} set(s)", desired.sets.len()));
        let decisions = self.decisions(&rounds.policy.running().module);
        let reconcile = self.reconciler.reconcile(
            desired,
            node,
            decisions,
            &mut rounds.status,
            cancel.clone(),
            Some(tx),
        );
        let progress = status::publish_progress(
            rx,
            preview,
            desired,
            &rounds.node_api,
            &self.config,
            &self.metrics,
        );
        let watch_changes = watch::until_changed(&self.config, &rounds.caches, desired, node);
        let work = async { tokio::join!(reconcile, progress) };
        tokio::pin!(work, watch_changes);
        let (result, mut written) = tokio::select! {
            r = &mut work => r,
            // The desired state changed: cancel the reconcile; it returns promptly.
            () = &mut watch_changes => {
                cancel.cancel();
                work.await
            }
        };
        // The progress writer kept its own record of what it wrote.
        if written.status.is_some() {
            rounds.published.status = written.status.take();
            rounds.published.conditions = std::mem::take(&mut written.conditions);
        }
        result
    }

    /// The decisions of one reconcile: a fresh instance of the running module, guarded,
    /// reporting to the agent's metrics.
    fn decisions(&self, module: &pinset_policy::PolicyModule) -> Box<dyn Decisions> {
        Box::new(Guarded::of(module).with_observer(Arc::new(self.metrics.clone())))
    }

    /// Sleep until the desired state or a fact of the node changes, `wait` passes, or the agent
    /// stops.
    async fn idle(
        &self,
        rounds: &Rounds,
        node: &NodeInfo,
        desired: &Desired,
        wait: Duration,
        shutdown: &CancellationToken,
    ) {
        let wait_change =
            watch::until_changed_or_facts(&self.config, &rounds.caches, desired, node);
        let policy_due = async {
            let mut changed = rounds.caches.changed.clone();
            while !self.policy_due(rounds, desired) {
                if changed.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        // A policy recheck that comes due wakes the agent too.
        let recheck = rounds
            .checks
            .next_due()
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(wait);
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(wait.min(recheck)) => {}
            () = wait_change => {}
            () = policy_due => {}
        }
    }

    /// The MachineConfigNode's spec names the node and its primary pool, and the Node owns it
    /// when the agent knows the Node's uid: the garbage collector deletes it with the Node, so a
    /// node removed from the cluster leaves no member its pool waits for.
    async fn sync_spec(&self, rounds: &mut Rounds, desired: &Desired) {
        let published = status::PublishedSpec {
            pool: desired.pools.first().cloned(),
            owner: rounds.node_uid.clone(),
        };
        if rounds.published.spec.as_ref() == Some(&published) {
            return;
        }
        let name = &self.config.node_name;
        let mut spec = json!({"node": {"name": name}});
        if let Some(pool) = &published.pool {
            spec["pool"] = json!({"name": pool});
        }
        let owner = published.owner.as_deref();
        match status::apply_spec(&rounds.node_api, name, spec, owner).await {
            Ok(()) => {
                self.metrics.count_api_write("node_spec");
                rounds.published.spec = Some(published);
            }
            Err(e) => match crate::forbidden::refusal(&e) {
                Some(why) => {
                    tracing::warn!(error = %why, "cannot write the MachineConfigNode spec; retrying with backoff");
                    rounds.status.forbidden = Some(why);
                }
                None => {
                    tracing::warn!(error = %e, "cannot write the MachineConfigNode spec; retrying later")
                }
            },
        }
    }

    /// Events on the node's MachineConfigNode for what this reconcile repaired or could not
    /// ask its policy. An API server without Events (or without the right to write them) costs
    /// a debug line, nothing else.
    /// Events for what changed since the last round (sets pinned or failed, pins repaired,
    /// policy fallbacks).
    async fn record_events(&self, status: &mut NodeStatus, seen: &mut status::Seen) {
        let events = status::events(status, seen);
        if events.is_empty() {
            return;
        }
        // Said on the status the next time it is written (the events are lost, not the work),
        // until events are recorded again.
        status.forbidden = self.record(&events).await;
    }

    /// Record `events` about the node's MachineConfigNode; the refusal, when the agent may not.
    async fn record(&self, events: &[kube::runtime::events::Event]) -> Option<String> {
        let name = &self.config.node_name;
        let client = self.client.clone();
        let instance = Some(name.clone());
        crate::events::record::<MachineConfigNode>(client, FIELD_MANAGER, instance, name, events)
            .await
    }

    /// Write the status; whether it is now published.
    async fn publish(
        &self,
        api: &Api<MachineConfigNode>,
        published: &mut Published,
        status: &NodeStatus,
    ) -> bool {
        let name = &self.config.node_name;
        match status::write_status(api, name, published, status, &self.metrics).await {
            Ok(()) => true,
            Err(e) => {
                match crate::forbidden::refusal(&e) {
                    Some(why) => {
                        tracing::warn!(error = %why, retry_in = ?self.config.retry_min, "status not published; retrying with backoff")
                    }
                    None => {
                        tracing::warn!(error = %e, retry_in = ?self.config.retry_min, "status not published (is the API server down?); the work goes on and the status is published when it returns")
                    }
                }
                false
            }
        }
    }
}
