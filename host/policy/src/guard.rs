//! The guards: a policy whose every answer is valid. [`Guard`] is what they share — the call
//! timed and reported, the answer checked, a failure logged, counted and kept — and [`Guarded`]
//! (node decisions) and [`crate::GuardedFleet`] (fleet decisions) apply it to their contract,
//! answering with the native reference when the policy's answer is not used.

use super::{Described, Hook, NativePolicy, PolicyError, PolicyInstance, validate};
use pinset_core::decisions::{Decisions, Fallback, Observer};
use pinset_policy_sdk::{
    Admission, AdmissionRequest, Images, NodeFacts, PolicyInfo, Pressure, PullOutcome,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Asks a policy, checks its answer, and on a failure logs it (once, as a warning), reports it
/// to the observer and keeps it: the one place every hook of every contract goes through.
#[derive(Default)]
pub(crate) struct Guard {
    observer: Option<Arc<dyn Observer>>,
    fallbacks: Vec<Fallback>,
    /// Log each failure as a warning; off when the caller reports them itself.
    quiet: bool,
}

impl Guard {
    pub(crate) fn observe(&mut self, observer: Arc<dyn Observer>) {
        self.observer = Some(observer);
    }

    pub(crate) fn quiet(&mut self) {
        self.quiet = true;
    }

    /// The policy's answer to `hook` when it is valid; else `None`, the failure recorded (the
    /// caller answers with its reference). `pool` names the pool a fleet decision is for.
    pub(crate) fn ask<T>(
        &mut self,
        policy: &str,
        hook: Hook,
        pool: Option<&str>,
        ask: impl FnOnce() -> Result<T, PolicyError>,
        check: impl FnOnce(&T) -> Result<(), String>,
    ) -> Option<T> {
        let started = Instant::now();
        let answer = ask();
        if let Some(o) = &self.observer {
            o.policy_call(hook, started.elapsed());
        }
        let error = match answer {
            Ok(value) => match check(&value) {
                Ok(()) => return Some(value),
                Err(reason) => PolicyError::Invalid {
                    policy: policy.to_string(),
                    hook,
                    reason,
                },
            },
            Err(e) => e,
        };
        if !self.quiet {
            let hook = hook.as_str();
            let why = "policy decision failed; using the built-in reference policy for it";
            match pool {
                Some(pool) => tracing::warn!(policy, pool, hook, error = %error, "{why}"),
                None => tracing::warn!(policy, hook, error = %error, "{why}"),
            }
        }
        if let Some(o) = &self.observer {
            o.policy_fallback(hook, error.kind());
        }
        self.fallbacks.push(Fallback {
            hook,
            kind: error.kind(),
            message: error.to_string(),
        });
        None
    }

    pub(crate) fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    pub(crate) fn take_fallbacks(&mut self) -> Vec<Fallback> {
        std::mem::take(&mut self.fallbacks)
    }
}

/// A node policy whose every answer is valid: the primary policy's when it is, else the native
/// reference policy's. Failures are logged, reported to the observer and kept for status.
pub struct Guarded {
    primary: Box<dyn PolicyInstance>,
    /// The primary's name, kept: every hook's failure names it.
    name: String,
    reference: NativePolicy,
    guard: Guard,
}

impl Guarded {
    pub fn new(primary: Box<dyn PolicyInstance>) -> Self {
        Self {
            name: primary.name().to_string(),
            primary,
            reference: NativePolicy::reference(),
            guard: Guard::default(),
        }
    }

    /// Report every call and fallback to `observer` (Prometheus in the agent).
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.guard.observe(observer);
        self
    }

    /// No warning per failure: the caller reports the failures itself (a smoke test, whose
    /// failure is the refusal of a module that never decided anything).
    pub fn without_warnings(mut self) -> Self {
        self.guard.quiet();
        self
    }

    /// Ask the primary policy, check its answer, fall back to the reference policy on failure.
    fn decide<T>(
        &mut self,
        hook: Hook,
        ask: impl FnOnce(&mut dyn PolicyInstance) -> Result<T, PolicyError>,
        check: impl FnOnce(&T) -> Result<(), String>,
        reference: impl FnOnce(&mut NativePolicy) -> Result<T, PolicyError>,
    ) -> T {
        let primary = self.primary.as_mut();
        match self
            .guard
            .ask(&self.name, hook, None, || ask(primary), check)
        {
            Some(answer) => answer,
            None => {
                reference(&mut self.reference).expect("the native reference policy cannot fail")
            }
        }
    }

    pub fn info(&mut self) -> PolicyInfo {
        self.decide(Hook::Info, |p| p.info(), |_| Ok(()), |r| r.info())
    }
}

impl Decisions for Guarded {
    fn name(&self) -> &str {
        &self.name
    }

    fn fallbacks(&self) -> &[Fallback] {
        self.guard.fallbacks()
    }

    fn take_fallbacks(&mut self) -> Vec<Fallback> {
        self.guard.take_fallbacks()
    }

    fn admit(&mut self, request: &AdmissionRequest) -> Admission {
        let n = request.images.len();
        self.decide(
            Hook::Admit,
            |p| p.admit(request),
            |a| validate::verdict(&a.verdict, n),
            |r| r.admit(request),
        )
    }

    fn order(&mut self, node: &NodeFacts, images: &Images) -> Vec<u32> {
        self.decide(
            Hook::Order,
            |p| p.order(node, images),
            |o| validate::order(o, images.len()),
            |r| r.order(node, images),
        )
    }

    /// Pulls at once, within `1..=MAX_CONCURRENCY` ([`validate::concurrency`], the one bound of
    /// the policy's answer; a rollout grant's cap applies in `plan::make`).
    fn concurrency(&mut self, node: &NodeFacts) -> u32 {
        self.decide(
            Hook::Concurrency,
            |p| p.concurrency(node),
            |&n| validate::concurrency(n),
            |r| r.concurrency(node),
        )
    }

    fn throttle(
        &mut self,
        node: &NodeFacts,
        outcome: &PullOutcome,
        pressure: &Pressure,
    ) -> Duration {
        Duration::from_millis(self.decide(
            Hook::Throttle,
            |p| p.throttle(node, outcome, pressure),
            |&ms| validate::throttle_ms(ms),
            |r| r.throttle(node, outcome, pressure),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_policy_sdk::{Policy, Verdict};

    /// A native policy with out-of-bounds answers: the guard must not pass them on.
    struct OutOfBounds;

    impl Policy for OutOfBounds {
        fn info(&self) -> PolicyInfo {
            PolicyInfo::new("oob", "0", "")
        }
        fn admit(&self, _: &AdmissionRequest) -> Admission {
            Admission::admit_some(vec![5], "")
        }
        fn order(&self, _: &NodeFacts, images: &Images) -> Vec<u32> {
            vec![0; images.len() + 1]
        }
        fn concurrency(&self, _: &NodeFacts) -> u32 {
            0
        }
        fn throttle(&self, _: &NodeFacts, _: &PullOutcome, _: &Pressure) -> u64 {
            u64::MAX
        }
    }

    /// Records what the guard reports.
    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<(Hook, &'static str)>>);

    impl Observer for Recorder {
        fn policy_fallback(&self, hook: Hook, kind: &'static str) {
            self.0.lock().unwrap().push((hook, kind));
        }
    }

    #[test]
    fn invalid_answers_fall_back_and_are_recorded() {
        let recorder = Arc::new(Recorder::default());
        let mut g = Guarded::new(Box::new(NativePolicy::new("oob", OutOfBounds)))
            .with_observer(recorder.clone());
        let node = NodeFacts {
            control_plane: true,
            ready: true,
            ..Default::default()
        };
        assert_eq!(g.concurrency(&node), 1);
        assert_eq!(
            g.throttle(&node, &PullOutcome::default(), &Pressure::default()),
            Duration::from_secs(1)
        );
        let mut images = Images::new();
        images.push("r@sha256:00", ["s"], false, None, &[]);
        assert_eq!(g.order(&node, &images), vec![0]);
        let request = AdmissionRequest {
            node: node.clone(),
            ..Default::default()
        };
        // The reference rejects: allocatable unknown.
        assert_eq!(g.admit(&request).verdict, Verdict::Reject);
        let hooks: Vec<Hook> = g.fallbacks().iter().map(|f| f.hook).collect();
        assert_eq!(
            hooks,
            vec![Hook::Concurrency, Hook::Throttle, Hook::Order, Hook::Admit]
        );
        assert!(
            g.fallbacks()[0]
                .to_string()
                .contains("policy oob: hook concurrency")
        );
        assert_eq!(
            recorder.0.lock().unwrap()[0],
            (Hook::Concurrency, "invalid")
        );
        assert_eq!(g.take_fallbacks().len(), 4);
        assert!(g.fallbacks().is_empty());
    }
}
