//! Prometheus metrics (text exposition format).

use pinset_core::decisions::{Hook, Observer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
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
struct KindLabels {
    kind: &'static str,
}

struct Inner {
    registry: Registry,
    policy_call_seconds: Family<HookLabels, Histogram>,
    policy_fallbacks: Family<FallbackLabels, Counter>,
    images_pulled: Counter,
    image_pull_failures: Counter,
    bytes_pulled: Counter,
    pull_seconds: Histogram,
    reconcile_seconds: Family<KindLabels, Histogram>,
    reconcile_errors: Family<KindLabels, Counter>,
    api_writes: Family<KindLabels, Counter>,
    pin_drift: Family<KindLabels, Counter>,
}

/// A counter per `kind`, registered as `pinset_<name>_total`.
fn kind_counter(registry: &mut Registry, name: &str, help: &str) -> Family<KindLabels, Counter> {
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
        let mut registry = Registry::with_prefix("pinset");
        // 1 µs .. ~1 s.
        let policy_call_seconds = Family::<HookLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(1e-6, 4.0, 11))
        });
        let policy_fallbacks = Family::<FallbackLabels, Counter>::default();
        registry.register(
            "policy_call_seconds",
            "Latency of policy hook calls, validation excluded",
            policy_call_seconds.clone(),
        );
        let help =
            "Policy decisions answered by the built-in reference policy because the policy failed";
        registry.register("policy_fallbacks", help, policy_fallbacks.clone());
        let images_pulled = Counter::default();
        let image_pull_failures = Counter::default();
        let bytes_pulled = Counter::default();
        // 10 ms .. ~45 min.
        let pull_seconds = Histogram::new(exponential_buckets(0.01, 3.0, 12));
        // 100 µs .. ~4 h.
        let reconcile_seconds = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(1e-4, 4.0, 14))
        });
        let reconcile_errors = kind_counter(
            &mut registry,
            "reconcile_errors",
            "Reconciles that ended in an error (kind: node, pool, set)",
        );
        let api_writes = kind_counter(
            &mut registry,
            "api_writes",
            "Writes to the Kubernetes API (kind: the object and part written)",
        );
        let pin_drift = kind_counter(
            &mut registry,
            "pin_drift",
            "Pins found lost behind pinset's back and repaired (kind: image-deleted, pin-removed, dropin-deleted, dropin-edited)",
        );
        let help = "Images pulled into the container runtime";
        registry.register("images_pulled", help, images_pulled.clone());
        registry.register(
            "image_pull_failures",
            "Images that failed to pull after every retry",
            image_pull_failures.clone(),
        );
        registry.register(
            "pulled_bytes",
            "Compressed bytes of the pulled images whose size is known",
            bytes_pulled.clone(),
        );
        registry.register(
            "image_pull_seconds",
            "Duration of successful pulls, retries included",
            pull_seconds.clone(),
        );
        registry.register(
            "reconcile_seconds",
            "Duration of reconciles (kind: node, pool, set)",
            reconcile_seconds.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                policy_call_seconds,
                policy_fallbacks,
                images_pulled,
                image_pull_failures,
                bytes_pulled,
                pull_seconds,
                reconcile_seconds,
                reconcile_errors,
                api_writes,
                pin_drift,
            }),
        }
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

    /// Writes made so far of `kind`.
    pub fn api_writes(&self, kind: &'static str) -> u64 {
        self.inner
            .api_writes
            .get_or_create(&KindLabels { kind })
            .get()
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
}
