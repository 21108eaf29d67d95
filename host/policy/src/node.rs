//! The node contract (`wit/policy.wit`) on pinset's side: the hooks an instance answers
//! ([`PolicyInstance`]), the native policies' answers, the reference (the default policy's
//! source), the smoke test's questions, and the guarded decisions a reconcile asks — the core's
//! [`Decisions`].

use crate::{
    Described, Guarded, Hook, Hooks, Native, NodeContract, PolicyError, WasmInstance, validate,
};
use pinset_core::decisions::{Decisions, Fallback};
use pinset_policy_default::DefaultPolicy;
use pinset_policy_sdk::{
    Admission, AdmissionRequest, Images, NodeFacts, Policy, PolicyInfo, Pressure, PullOutcome,
};
use std::time::Duration;

/// One live instance of a node policy, answering the hooks of one reconcile. Calls may fail;
/// callers other than tests and benchmarks use [`Guarded`], which never does.
pub trait PolicyInstance: Described {
    fn admit(&mut self, request: &AdmissionRequest) -> Result<Admission, PolicyError>;
    fn order(&mut self, node: &NodeFacts, images: &Images) -> Result<Vec<u32>, PolicyError>;
    fn concurrency(&mut self, node: &NodeFacts) -> Result<u32, PolicyError>;
    /// The raw answer in milliseconds; [`Guarded::throttle`] validates and converts it.
    fn throttle(
        &mut self,
        node: &NodeFacts,
        outcome: &PullOutcome,
        pressure: &Pressure,
    ) -> Result<u64, PolicyError>;
}

impl Hooks for NodeContract {
    type Native = dyn Policy + Send;
    type Instance = dyn PolicyInstance;
    /// The node's facts (its images, disk and labels) and its pressure.
    type Probe<'a> = (&'a AdmissionRequest, &'a Pressure);
    const REFERENCE: &'static str = "builtin:default";

    fn reference() -> Box<Self::Native> {
        Box::new(DefaultPolicy)
    }
    fn native_info(policy: &Self::Native) -> PolicyInfo {
        policy.info()
    }
    fn boxed(instance: WasmInstance<Self>) -> Box<Self::Instance> {
        Box::new(instance)
    }

    /// Every hook once, the throttle on a pull of the first image in the policy's order.
    fn probe(guarded: &mut Guarded<Self>, (request, pressure): Self::Probe<'_>) {
        let node = &request.node;
        guarded.admit(request);
        let order = guarded.order(node, &request.images);
        guarded.concurrency(node);
        let first = order.first().and_then(|&i| request.images.get(i as usize));
        let outcome = PullOutcome {
            reference: first.map(|i| i.reference.to_string()).unwrap_or_default(),
            error: None,
            bytes: first.and_then(|i| i.size_bytes),
            duration_ms: 1_000,
            remaining: request.images.len().saturating_sub(1) as u32,
        };
        guarded.throttle(node, &outcome, pressure);
    }
}

impl PolicyInstance for Native<NodeContract> {
    fn admit(&mut self, request: &AdmissionRequest) -> Result<Admission, PolicyError> {
        Ok(self.policy().admit(request))
    }
    fn order(&mut self, node: &NodeFacts, images: &Images) -> Result<Vec<u32>, PolicyError> {
        Ok(self.policy().order(node, images))
    }
    fn concurrency(&mut self, node: &NodeFacts) -> Result<u32, PolicyError> {
        Ok(self.policy().concurrency(node))
    }
    fn throttle(
        &mut self,
        node: &NodeFacts,
        outcome: &PullOutcome,
        pressure: &Pressure,
    ) -> Result<u64, PolicyError> {
        Ok(self.policy().throttle(node, outcome, pressure))
    }
}

impl Decisions for Guarded<NodeContract> {
    fn name(&self) -> &str {
        Guarded::name(self)
    }

    fn fallbacks(&self) -> &[Fallback] {
        Guarded::fallbacks(self)
    }

    fn take_fallbacks(&mut self) -> Vec<Fallback> {
        Guarded::take_fallbacks(self)
    }

    fn admit(&mut self, request: &AdmissionRequest) -> Admission {
        let n = request.images.len();
        self.decide(
            Hook::Admit,
            None,
            |p| p.admit(request),
            |a| validate::verdict(&a.verdict, n),
            |r| r.policy().admit(request),
        )
        .0
    }

    fn order(&mut self, node: &NodeFacts, images: &Images) -> Vec<u32> {
        self.decide(
            Hook::Order,
            None,
            |p| p.order(node, images),
            |o| validate::order(o, images.len()),
            |r| r.policy().order(node, images),
        )
        .0
    }

    /// Pulls at once, within `1..=MAX_CONCURRENCY` ([`validate::concurrency`], the one bound of
    /// the policy's answer; a rollout grant's cap applies in `plan::make`).
    fn concurrency(&mut self, node: &NodeFacts) -> u32 {
        self.decide(
            Hook::Concurrency,
            None,
            |p| p.concurrency(node),
            |&n| validate::concurrency(n),
            |r| r.policy().concurrency(node),
        )
        .0
    }

    fn throttle(
        &mut self,
        node: &NodeFacts,
        outcome: &PullOutcome,
        pressure: &Pressure,
    ) -> Duration {
        Duration::from_millis(
            self.decide(
                Hook::Throttle,
                None,
                |p| p.throttle(node, outcome, pressure),
                |&ms| validate::throttle_ms(ms),
                |r| r.policy().throttle(node, outcome, pressure),
            )
            .0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Observer;
    use pinset_policy_sdk::Verdict;
    use std::sync::Arc;

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
        let mut g = Guarded::<NodeContract>::new(Box::new(Native::<NodeContract>::new(
            "oob",
            Box::new(OutOfBounds),
        )))
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
