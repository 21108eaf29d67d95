//! Prometheus metrics (text exposition format).

use pinset_core::decisions::{Hook, Observer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::TypedMetric;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    hook: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FallbackLabels {
    hook: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolStateLabels {
    pool: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
    /// The node contract's interface and version.
    contract: String,
    /// The fleet contract's.
    fleet_contract: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderRunLabels {
    provider: String,
    result: &'static str,
}

/// The node policy a node decides with.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyInfoLabels {
    pool: String,
    digest: String,
    name: String,
    version: String,
}

struct Inner {
    registry: Registry,
    /// Each metric's exposed name, type and help, as registered (families without series
    /// included): the metrics reference.
    descriptors: Vec<Descriptor>,
    policy_info: Family<PolicyInfoLabels, Gauge>,
    policy_swaps: Family<ResultLabels, Counter>,
    policy_call_seconds: Family<HookLabels, Histogram>,
    policy_fallbacks: Family<FallbackLabels, Counter>,
    images_pulled: Counter,
    image_pull_failures: Counter,
    bytes_pulled: Counter,
    pull_seconds: Histogram,
    credential_provider_runs: Family<ProviderRunLabels, Counter>,
    reconcile_seconds: Family<KindLabels, Histogram>,
    reconcile_errors: Family<KindLabels, Counter>,
    api_writes: Family<KindLabels, Counter>,
    api_write_conflicts: Family<KindLabels, Counter>,
    pin_drift: Family<KindLabels, Counter>,
    watch_interruptions: Family<KindLabels, Counter>,
    startup_taint_lifts: Family<KindLabels, Counter>,
    node_sets: Family<StateLabels, Gauge>,
    last_success: Gauge<f64, AtomicU64>,
    build_info: Family<BuildLabels, Gauge>,
    rollout: RolloutMetrics,
}

/// The fleet rollout's: the agent's waiting sets, the controller's pools.
struct RolloutMetrics {
    waiting: Gauge,
    /// Pools whose status the controller computed and has not written yet.
    status_pending: Gauge,
    pool_nodes: Family<PoolStateLabels, Gauge>,
    waves: Family<PoolLabels, Counter>,
    paused: Family<PoolLabels, Gauge>,
}

/// The node's sets by state, the last success, the build.
type PolicyMetrics = (
    Family<HookLabels, Histogram>,
    Family<FallbackLabels, Counter>,
    Family<PolicyInfoLabels, Gauge>,
    Family<ResultLabels, Counter>,
);

type Gauges = (
    Family<StateLabels, Gauge>,
    Gauge<f64, AtomicU64>,
    Family<BuildLabels, Gauge>,
);

/// One metric as `/metrics` exposes it: its name (with `_total` for counters), type and help.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub name: String,
    pub kind: String,
    pub help: String,
}

/// The registry, and what was registered in it.
struct Described {
    registry: Registry,
    descriptors: Vec<Descriptor>,
}

impl Described {
    fn new() -> Self {
        Described {
            registry: Registry::with_prefix("pinset"),
            descriptors: Vec::new(),
        }
    }

    fn register<M>(&mut self, name: &str, help: &str, metric: M)
    where
        M: prometheus_client::registry::Metric + TypedMetric,
    {
        let kind = format!("{:?}", M::TYPE).to_lowercase();
        let suffix = if kind == "counter" { "_total" } else { "" };
        self.descriptors.push(Descriptor {
            name: format!("pinset_{name}{suffix}"),
            kind,
            help: format!("{help}."),
        });
        self.registry.register(name, help, metric);
    }
}

/// `metric`, registered as `pinset_<name>`.
fn registered<M>(registry: &mut Described, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + TypedMetric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

/// A counter per `kind`, registered as `pinset_<name>_total`.
fn kind_counter(registry: &mut Described, name: &str, help: &str) -> Family<KindLabels, Counter> {
    let family = Family::<KindLabels, Counter>::default();
    registry.register(name, help, family.clone());
    family
}

/// pinset's metrics. Cheap to clone; clones share the same registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Described::new();
        let (policy_call_seconds, policy_fallbacks, policy_info, policy_swaps) =
            Self::register_policy(&mut registry);
        let (images_pulled, image_pull_failures, bytes_pulled, pull_seconds) =
            Self::register_pulls(&mut registry);
        let r = &mut registry;
        let credential_provider_runs = registered(
            r,
            "credential_provider_runs",
            "Runs of the kubelet's image credential provider plugins (provider: its name; result: ok, failed)",
            Family::default(),
        );
        // 100 µs .. ~4 h.
        let reconcile_seconds = registered(
            r,
            "reconcile_seconds",
            "Duration of reconciles (kind: node, pool, set)",
            Family::<KindLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-4, 4.0, 14))
            }),
        );
        let [
            reconcile_errors,
            api_writes,
            api_write_conflicts,
            pin_drift,
            watch_interruptions,
            startup_taint_lifts,
        ] = Self::register_kind_counters(r);
        let (node_sets, last_success, build_info) = Self::register_gauges(&mut registry);
        let rollout = Self::register_rollout(&mut registry);
        Self {
            inner: Arc::new(Inner {
                descriptors: registry.descriptors,
                registry: registry.registry,
                policy_info,
                policy_swaps,
                policy_call_seconds,
                policy_fallbacks,
                images_pulled,
                image_pull_failures,
                bytes_pulled,
                pull_seconds,
                credential_provider_runs,
                reconcile_seconds,
                reconcile_errors,
                api_writes,
                api_write_conflicts,
                pin_drift,
                watch_interruptions,
                startup_taint_lifts,
                node_sets,
                last_success,
                build_info,
                rollout,
            }),
        }
    }

    /// The counters labelled by kind: reconcile errors, API writes and their conflicts, pin
    /// drift, watch interruptions, the startup taint's lifts.
    fn register_kind_counters(r: &mut Described) -> [Family<KindLabels, Counter>; 6] {
        let reconcile_errors = kind_counter(
            r,
            "reconcile_errors",
            "Reconciles that ended in an error (kind: node, pool, set)",
        );
        let api_writes = kind_counter(
            r,
            "api_writes",
            "Writes to the Kubernetes API (kind: the object and part written)",
        );
        let api_write_conflicts = kind_counter(
            r,
            "api_write_conflicts",
            "Writes to the Kubernetes API refused because the object changed since it was read (kind: as api_writes)",
        );
        let pin_drift = kind_counter(
            r,
            "pin_drift",
            "Pins found lost behind pinset's back and repaired (kind: image-deleted, pin-removed, dropin-deleted, dropin-edited)",
        );
        let watch_interruptions = kind_counter(
            r,
            "watch_interruptions",
            "Watches interrupted and resumed (kind: MachineConfigPool, PinnedImageSet, MachineConfigNode)",
        );
        let startup_taint = kind_counter(
            r,
            "startup_taint_lifts",
            "The node's startup taint (--startup-taint) lifted (kind: pinned, deadline: not all pinned) or not, the API server failing the write (kind: failed)",
        );
        [
            reconcile_errors,
            api_writes,
            api_write_conflicts,
            pin_drift,
            watch_interruptions,
            startup_taint,
        ]
    }

    fn register_policy(r: &mut Described) -> PolicyMetrics {
        // 1 µs .. ~1 s.
        let call_seconds = registered(
            r,
            "policy_call_seconds",
            "Latency of policy hook calls, validation excluded",
            Family::<HookLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-6, 4.0, 11))
            }),
        );
        let fallbacks = registered(
            r,
            "policy_fallbacks",
            "Policy decisions answered by the built-in reference policy because the policy failed",
            Family::<FallbackLabels, Counter>::default(),
        );
        let info = registered(
            r,
            "policy_info",
            "The node policy this node decides with: its pool, module digest, name and version (always 1)",
            Family::<PolicyInfoLabels, Gauge>::default(),
        );
        let swaps = registered(
            r,
            "policy_swaps",
            "Node policy swaps by result: swapped (a candidate passed its checks), rejected (a step refused it; the running module stays), reverted (it fell back in its first reconcile; the previous module is back)",
            Family::<ResultLabels, Counter>::default(),
        );
        (call_seconds, fallbacks, info, swaps)
    }

    fn register_rollout(r: &mut Described) -> RolloutMetrics {
        let waiting = registered(
            r,
            "rollout_waiting",
            "This node's PinnedImageSets waiting for a rollout grant from the pool's fleet policy",
            Gauge::default(),
        );
        let pool_nodes = registered(
            r,
            "pool_rollout_nodes",
            "Nodes of each pool by rollout state against the pool's target (granted, pulling, done, failed, waiting)",
            Family::<PoolStateLabels, Gauge>::default(),
        );
        let waves = registered(
            r,
            "rollout_waves",
            "Fleet decisions that granted nodes of a pool (a canary or a wave)",
            Family::<PoolLabels, Counter>::default(),
        );
        let paused = registered(
            r,
            "pool_rollout_paused",
            "1 while the pool's rollout is paused (pinset.io/rollout-paused): no node is granted",
            Family::<PoolLabels, Gauge>::default(),
        );
        let status_pending = registered(
            r,
            "pool_status_writes_pending",
            "Pools whose status the controller has computed and not yet written (queued or in flight)",
            Gauge::default(),
        );
        RolloutMetrics {
            waiting,
            status_pending,
            pool_nodes,
            waves,
            paused,
        }
    }

    fn register_pulls(r: &mut Described) -> (Counter, Counter, Counter, Histogram) {
        let images_pulled = registered(
            r,
            "images_pulled",
            "Images pulled into the container runtime",
            Counter::default(),
        );
        let image_pull_failures = registered(
            r,
            "image_pull_failures",
            "Images that failed to pull after every retry",
            Counter::default(),
        );
        let bytes_pulled = registered(
            r,
            "pulled_bytes",
            "Compressed bytes of the pulled images whose size is known",
            Counter::default(),
        );
        // 10 ms .. ~45 min.
        let pull_seconds = registered(
            r,
            "image_pull_seconds",
            "Duration of successful pulls, retries included",
            Histogram::new(exponential_buckets(0.01, 3.0, 12)),
        );
        (
            images_pulled,
            image_pull_failures,
            bytes_pulled,
            pull_seconds,
        )
    }

    fn register_gauges(registry: &mut Described) -> Gauges {
        let node_sets = Family::<StateLabels, Gauge>::default();
        registry.register(
            "node_sets",
            "This node's PinnedImageSets by state (pinned: at their generation; failed: the last try failed; pending: neither yet)",
            node_sets.clone(),
        );
        let last_success = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "last_successful_reconcile_timestamp_seconds",
            "When the last reconcile that left every set pinned ended (Unix time)",
            last_success.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "build_info",
            "The running build: release, source commit and policy contracts, node and fleet (always 1)",
            build_info.clone(),
        );
        (node_sets, last_success, build_info)
    }

    /// `pinset_build_info{version, commit, contract, fleet_contract} 1`.
    pub fn set_build_info(&self, version: &str, commit: &str, contract: &str, fleet: &str) {
        self.inner
            .build_info
            .get_or_create(&BuildLabels {
                version: version.into(),
                commit: commit.into(),
                contract: contract.into(),
                fleet_contract: fleet.into(),
            })
            .set(1);
    }

    /// A node policy swap ended with `result` (`swapped`, `rejected`, `reverted`).
    pub fn count_policy_swap(&self, result: &str) {
        self.inner
            .policy_swaps
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// `pinset_policy_info{pool, digest, name, version} 1` for the module the node decides with
    /// (one series: the previous one is dropped when it changes).
    pub fn set_policy_info(&self, pool: &str, policy: &pinset_core::status::RunningPolicy) {
        let labels = PolicyInfoLabels {
            pool: pool.into(),
            digest: policy.digest.clone(),
            name: policy.name.clone(),
            version: policy.version.clone(),
        };
        if self.inner.policy_info.get(&labels).is_none() {
            self.inner.policy_info.clear();
            self.inner.policy_info.get_or_create(&labels).set(1);
        }
    }

    /// The node's sets by state after a reconcile; a reconcile that pinned every set is the
    /// last success.
    pub fn observe_node_sets(&self, status: &pinset_core::status::NodeStatus) {
        let (mut pinned, mut failed, mut pending) = (0, 0, 0);
        for set in status.sets.values() {
            if set.current_generation == Some(set.desired_generation) {
                pinned += 1;
            } else if set.last_failed_generation == Some(set.desired_generation) {
                failed += 1;
            } else {
                pending += 1;
            }
        }
        for (state, n) in [("pinned", pinned), ("failed", failed), ("pending", pending)] {
            self.inner
                .node_sets
                .get_or_create(&StateLabels { state })
                .set(n);
        }
        if failed == 0 && pending == 0 && status.degraded.is_none() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.inner.last_success.set(now);
        }
    }

    /// Sets of this node waiting for a rollout grant.
    pub fn observe_rollout_waiting(&self, sets: usize) {
        self.inner.rollout.waiting.set(sets as i64);
    }

    /// A pool's nodes by rollout state.
    pub fn observe_pool_rollout(&self, pool: &str, counts: &pinset_core::rollout::Counts) {
        for (state, n) in [
            ("granted", counts.granted),
            ("pulling", counts.pulling),
            ("done", counts.done),
            ("failed", counts.failed),
            ("waiting", counts.waiting),
        ] {
            self.inner
                .rollout
                .pool_nodes
                .get_or_create(&PoolStateLabels {
                    pool: pool.into(),
                    state,
                })
                .set(i64::from(n));
        }
    }

    /// Whether the pool's rollout is paused.
    pub fn observe_pool_paused(&self, pool: &str, paused: bool) {
        self.inner
            .rollout
            .paused
            .get_or_create(&PoolLabels { pool: pool.into() })
            .set(i64::from(paused));
    }

    /// A fleet decision granted nodes of `pool`.
    pub fn count_rollout_wave(&self, pool: &str) {
        self.inner
            .rollout
            .waves
            .get_or_create(&PoolLabels { pool: pool.into() })
            .inc();
    }

    pub fn observe_policy_call(&self, hook: Hook, elapsed: Duration) {
        self.inner
            .policy_call_seconds
            .get_or_create(&HookLabels {
                hook: hook.as_str(),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub fn count_fallback(&self, hook: Hook, kind: &'static str) {
        self.inner
            .policy_fallbacks
            .get_or_create(&FallbackLabels {
                hook: hook.as_str(),
                kind,
            })
            .inc();
    }

    /// A pull finished: `Ok(bytes)` pulled in `elapsed`, or failed after every retry.
    pub fn observe_pull(&self, result: Result<Option<u64>, ()>, elapsed: Duration) {
        match result {
            Ok(bytes) => {
                self.inner.images_pulled.inc();
                self.inner.bytes_pulled.inc_by(bytes.unwrap_or(0));
                self.inner.pull_seconds.observe(elapsed.as_secs_f64());
            }
            Err(()) => {
                self.inner.image_pull_failures.inc();
            }
        }
    }

    pub fn observe_reconcile(&self, kind: &'static str, elapsed: Duration, ok: bool) {
        let labels = KindLabels { kind };
        self.inner
            .reconcile_seconds
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if !ok {
            self.inner.reconcile_errors.get_or_create(&labels).inc();
        }
    }

    pub fn count_api_write(&self, kind: &'static str) {
        self.inner
            .api_writes
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    pub fn count_api_write_conflict(&self, kind: &'static str) {
        self.inner
            .api_write_conflicts
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// Writes made so far of `kind`.
    pub fn api_writes(&self, kind: &'static str) -> u64 {
        self.inner
            .api_writes
            .get_or_create(&KindLabels { kind })
            .get()
    }

    /// Writes of `kind` met with a conflict so far.
    pub fn api_write_conflicts(&self, kind: &'static str) -> u64 {
        self.inner
            .api_write_conflicts
            .get_or_create(&KindLabels { kind })
            .get()
    }

    /// The startup taint lifted (`pinned`, `deadline`) or not (`failed`).
    pub fn count_startup_taint(&self, kind: &'static str) {
        (self.inner.startup_taint_lifts)
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// A watch of `kind` (a Kubernetes kind) was interrupted and resumes.
    pub fn count_watch_interruption(&self, kind: &'static str) {
        self.inner
            .watch_interruptions
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// Interruptions so far of the watches of `kind`.
    pub fn watch_interruptions(&self, kind: &'static str) -> u64 {
        self.inner
            .watch_interruptions
            .get_or_create(&KindLabels { kind })
            .get()
    }

    /// The gauge of pool statuses not yet written, for the controller's status lane to set.
    pub(crate) fn pool_status_pending_gauge(&self) -> Gauge {
        self.inner.rollout.status_pending.clone()
    }

    /// Pool statuses computed and not yet written (queued or in flight).
    pub fn pool_status_writes_pending(&self) -> i64 {
        self.inner.rollout.status_pending.get()
    }

    /// Every metric registered, in order: the metrics reference (`pinset reference metrics`).
    pub fn descriptors(&self) -> &[Descriptor] {
        &self.inner.descriptors
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.inner.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// The node and policy layers report through the core's observer.
impl Observer for Metrics {
    fn policy_call(&self, hook: Hook, elapsed: Duration) {
        self.observe_policy_call(hook, elapsed);
    }
    fn policy_fallback(&self, hook: Hook, kind: &'static str) {
        self.count_fallback(hook, kind);
    }
    fn pull(&self, pulled: Option<Option<u64>>, elapsed: Duration) {
        self.observe_pull(pulled.ok_or(()), elapsed);
    }
    fn pin_drift(&self, kind: &'static str) {
        self.inner
            .pin_drift
            .get_or_create(&KindLabels { kind })
            .inc();
    }
    fn credential_provider_run(&self, provider: &str, ok: bool) {
        let labels = ProviderRunLabels {
            provider: provider.to_string(),
            result: if ok { "ok" } else { "failed" },
        };
        self.inner
            .credential_provider_runs
            .get_or_create(&labels)
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_provider_runs_are_counted_by_provider_and_result() {
        let metrics = Metrics::new();
        metrics.credential_provider_run("ecr-login", true);
        metrics.credential_provider_run("ecr-login", false);
        metrics.credential_provider_run("ecr-login", false);
        let text = metrics.encode();
        for series in [
            r#"pinset_credential_provider_runs_total{provider="ecr-login",result="ok"} 1"#,
            r#"pinset_credential_provider_runs_total{provider="ecr-login",result="failed"} 2"#,
        ] {
            assert!(text.lines().any(|l| l == series), "{series} in {text}");
        }
    }

    #[test]
    fn the_policy_a_node_decides_with_is_one_series_replaced_when_it_changes() {
        let metrics = Metrics::new();
        let policy = |name: &str, digest: &str| pinset_core::status::RunningPolicy {
            name: name.into(),
            version: "1.0.0".into(),
            digest: digest.into(),
            ..Default::default()
        };
        metrics.set_policy_info("worker", &policy("default", "sha256:aa"));
        metrics.set_policy_info("worker", &policy("edge-sites", "sha256:bb"));
        let text = metrics.encode();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("pinset_policy_info{"))
            .collect();
        assert_eq!(series.len(), 1, "{text}");
        for label in [
            r#"pool="worker""#,
            r#"digest="sha256:bb""#,
            r#"name="edge-sites""#,
            r#"version="1.0.0""#,
        ] {
            assert!(series[0].contains(label), "{label} in {}", series[0]);
        }
        assert!(series[0].ends_with(" 1"), "{}", series[0]);
    }
}
