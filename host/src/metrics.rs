//! Prometheus metrics (text exposition format).

use crate::policy::Hook;
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

struct Inner {
    registry: Registry,
    policy_call_seconds: Family<HookLabels, Histogram>,
    policy_fallbacks: Family<FallbackLabels, Counter>,
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
        registry.register(
            "policy_fallbacks",
            "Policy decisions answered by the built-in reference policy because the policy failed",
            policy_fallbacks.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                policy_call_seconds,
                policy_fallbacks,
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

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.inner.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
