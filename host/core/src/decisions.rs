//! What a reconcile asks of a policy, as the core sees it. The policy crate's `Guarded`
//! implements [`Decisions`]: every answer is valid (the policy's own, or the native reference
//! policy's when the policy failed), and each fallback is kept as a [`Fallback`].

use pinset_policy_sdk::{Admission, AdmissionRequest, Images, NodeFacts, Pressure, PullOutcome};
use std::fmt;
use std::time::Duration;

/// The hooks of the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    Info,
    Admit,
    Order,
    Concurrency,
    Throttle,
    /// The fleet policy's hook (`pinset:fleet/rollout`), asked by the controller.
    Grant,
}

impl Hook {
    pub const ALL: [Hook; 5] = [
        Hook::Info,
        Hook::Admit,
        Hook::Order,
        Hook::Concurrency,
        Hook::Throttle,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Hook::Info => "info",
            Hook::Admit => "admit",
            Hook::Order => "order",
            Hook::Concurrency => "concurrency",
            Hook::Throttle => "throttle",
            Hook::Grant => "grant",
        }
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decision the policy failed to make, answered by the reference policy instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    pub hook: Hook,
    /// A short, stable word for metrics labels (`deadline`, `memory`, `trap`, `invalid`).
    pub kind: &'static str,
    /// The failure, naming the policy and the hook.
    pub message: String,
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The decisions of one reconcile. Never fails: an implementation answers every hook validly.
pub trait Decisions: Send {
    /// The policy's name, for logs.
    fn name(&self) -> &str;
    fn admit(&mut self, request: &AdmissionRequest) -> Admission;
    /// A permutation of `0..images.len()`.
    fn order(&mut self, node: &NodeFacts, images: &Images) -> Vec<u32>;
    /// Pulls at once, at least 1.
    fn concurrency(&mut self, node: &NodeFacts) -> u32;
    /// The pause after a pull.
    fn throttle(
        &mut self,
        node: &NodeFacts,
        outcome: &PullOutcome,
        pressure: &Pressure,
    ) -> Duration;
    /// Fallbacks so far.
    fn fallbacks(&self) -> &[Fallback];
    /// Fallbacks so far, leaving none.
    fn take_fallbacks(&mut self) -> Vec<Fallback>;
}

/// Where the node and policy layers report what they measure (Prometheus in the agent). Every
/// method defaults to doing nothing.
pub trait Observer: Send + Sync {
    /// A policy hook answered (or failed) in `elapsed`, validation excluded.
    fn policy_call(&self, _hook: Hook, _elapsed: Duration) {}
    /// A policy hook fell back to the reference policy.
    fn policy_fallback(&self, _hook: Hook, _kind: &'static str) {}
    /// A pull finished: `Some(bytes)` (when known) pulled in `elapsed`, or `None`: failed after
    /// every retry.
    fn pull(&self, _pulled: Option<Option<u64>>, _elapsed: Duration) {}
    /// A pin was found lost (and is being repaired); `kind` as [`crate::drift::DriftKind`].
    fn pin_drift(&self, _kind: &'static str) {}
    /// An image credential provider's plugin ran for a registry, and gave an answer (`ok`) or
    /// failed.
    fn credential_provider_run(&self, _provider: &str, _ok: bool) {}
}

/// A native SDK policy answering as it is, for the core's own tests.
#[cfg(test)]
pub(crate) struct Native<P>(pub P, pub Vec<Fallback>);

#[cfg(test)]
impl<P: pinset_policy_sdk::Policy + Send> Decisions for Native<P> {
    fn name(&self) -> &str {
        "native"
    }
    fn admit(&mut self, request: &AdmissionRequest) -> Admission {
        self.0.admit(request)
    }
    fn order(&mut self, node: &NodeFacts, images: &Images) -> Vec<u32> {
        self.0.order(node, images)
    }
    fn concurrency(&mut self, node: &NodeFacts) -> u32 {
        self.0.concurrency(node)
    }
    fn throttle(
        &mut self,
        node: &NodeFacts,
        outcome: &PullOutcome,
        pressure: &Pressure,
    ) -> Duration {
        Duration::from_millis(self.0.throttle(node, outcome, pressure))
    }
    fn fallbacks(&self) -> &[Fallback] {
        &self.1
    }
    fn take_fallbacks(&mut self) -> Vec<Fallback> {
        std::mem::take(&mut self.1)
    }
}
