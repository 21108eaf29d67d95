//! The fleet contract (`wit/fleet/fleet.wit`) on pinset's side: the decision an instance
//! answers ([`FleetInstance`]), the native policies' answers, the reference (the default fleet
//! policy's source), the smoke test's question, and the guarded decision the controller asks
//! ([`Guarded::grant`]), its answer validated by [`crate::validate::grant`].

use crate::{
    Described, Fallback, FleetContract, Guarded, Hook, Hooks, Native, PolicyError, WasmInstance,
    validate,
};
use pinset_policy_default::DefaultFleet;
use pinset_policy_sdk::{Fleet, Grant, PolicyInfo, Rollout, RolloutRequest};

/// A fleet policy answering one decision. Calls may fail; the controller uses
/// [`Guarded::grant`].
pub trait FleetInstance: Described {
    /// Which nodes of the pool may pull now, the request given as the columns both a module
    /// and the native policies read.
    fn grant_rollout(&mut self, rollout: &Rollout) -> Result<Grant, PolicyError>;
    /// The same for a request as the controller builds it, its columns built here.
    fn grant(&mut self, request: &RolloutRequest) -> Result<Grant, PolicyError> {
        self.grant_rollout(&Rollout::from(request))
    }
}

impl Hooks for FleetContract {
    type Native = dyn Fleet + Send;
    type Instance = dyn FleetInstance;
    /// The pool's current rollout request.
    type Probe<'a> = &'a RolloutRequest;
    const REFERENCE: &'static str = "builtin:default-fleet";

    fn reference() -> Box<Self::Native> {
        Box::new(DefaultFleet)
    }
    fn native_info(policy: &Self::Native) -> PolicyInfo {
        policy.info()
    }
    fn boxed(instance: WasmInstance<Self>) -> Box<Self::Instance> {
        Box::new(instance)
    }
    fn probe(guarded: &mut Guarded<Self>, request: Self::Probe<'_>) {
        guarded.grant(request);
    }
}

impl FleetInstance for Native<FleetContract> {
    fn grant_rollout(&mut self, rollout: &Rollout) -> Result<Grant, PolicyError> {
        Ok(self.policy().grant(rollout))
    }
}

/// A decision and how it was made.
#[derive(Clone, Debug, PartialEq)]
pub struct Decided {
    pub grant: Grant,
    /// The policy whose answer this is.
    pub policy: String,
    /// Why the primary policy's answer was not used.
    pub fallback: Option<Fallback>,
}

impl Guarded<FleetContract> {
    /// Which nodes of `request`'s pool may pull now. Never fails. The request's columns are
    /// built once, for the primary policy and, when its answer is not used, the reference.
    pub fn grant(&mut self, request: &RolloutRequest) -> Decided {
        let rollout = Rollout::from(request);
        let (grant, primary) = self.decide(
            Hook::Grant,
            Some(&request.pool.name),
            |p| p.grant_rollout(&rollout),
            |grant| validate::grant(grant, request),
            |r| r.policy().grant(&rollout),
        );
        // The guard keeps the failure too: a smoke test reads it there.
        let (policy, fallback) = match primary {
            true => (self.name().to_string(), None),
            false => (
                self.reference_name().to_string(),
                self.fallbacks().last().cloned(),
            ),
        };
        Decided {
            grant,
            policy,
            fallback,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_policy_sdk::{FleetNode, FleetPool, Phase};
    use std::sync::Arc;

    /// Answers `grant` whatever it is asked, keeping the columns it was asked with.
    struct Answer {
        grant: Grant,
        asked: Arc<std::sync::Mutex<Option<Rollout>>>,
    }

    impl Answer {
        fn new(grant: Grant) -> Self {
            Self {
                grant,
                asked: Arc::default(),
            }
        }
    }

    impl Described for Answer {
        fn name(&self) -> &str {
            "test:answer"
        }
        fn info(&mut self) -> Result<PolicyInfo, PolicyError> {
            Ok(PolicyInfo::new("answer", "0", ""))
        }
    }

    impl FleetInstance for Answer {
        fn grant_rollout(&mut self, rollout: &Rollout) -> Result<Grant, PolicyError> {
            *self.asked.lock().unwrap() = Some(rollout.clone());
            Ok(self.grant.clone())
        }
    }

    fn request(n: usize, max_pulling: Option<u32>) -> RolloutRequest {
        let pool = FleetPool {
            name: "worker".into(),
            max_pulling,
            ..Default::default()
        };
        let nodes = (0..n)
            .map(|i| FleetNode::waiting(format!("n{i}")))
            .collect();
        RolloutRequest {
            pool,
            nodes,
            ..Default::default()
        }
    }

    #[test]
    fn a_valid_answer_is_used_and_an_invalid_one_falls_back_to_the_canary() {
        let all = Grant::new(vec![0, 1, 2], "everyone");
        let d = Guarded::<FleetContract>::new(Box::new(Answer::new(all.clone())))
            .grant(&request(3, None));
        assert_eq!((d.grant, d.fallback), (all.clone(), None));

        for (bad, why) in [
            (Grant::new(vec![7], "x"), "names node 7 of 3"),
            (Grant::new(vec![1, 1], "x"), "twice"),
            (all.clone(), "over the pool's ceiling of 1"),
            (
                Grant {
                    max_pulls: Some(0),
                    ..Grant::new(vec![0], "x")
                },
                "max-pulls 0",
            ),
            (
                Grant {
                    hold: Some("stop".into()),
                    ..Grant::new(vec![1], "x")
                },
                "holds the rollout yet grants 1 node(s)",
            ),
        ] {
            let max = (bad == all).then_some(1);
            let d =
                Guarded::<FleetContract>::new(Box::new(Answer::new(bad))).grant(&request(3, max));
            let fallback = d.fallback.expect("fallback");
            assert!(fallback.message.contains(why), "{}", fallback.message);
            assert_eq!(d.grant.nodes, vec![0], "the default's canary");
            assert_eq!(d.policy, "builtin:default-fleet");
        }
    }

    #[test]
    fn the_module_and_the_fallback_decide_on_the_columns_of_the_request() {
        let mut request = request(5, None);
        request.nodes[0].phase = Phase::Done;
        request.nodes[2].labels = vec![("zone".into(), "b".into())];
        let out_of_range = Answer::new(Grant::new(vec![99], "x"));
        let asked = out_of_range.asked.clone();
        let d = Guarded::<FleetContract>::new(Box::new(out_of_range)).grant(&request);
        let asked = asked.lock().unwrap().take().expect("the module was asked");
        assert_eq!(asked, Rollout::from(&request));
        assert!(d.fallback.is_some());
        let native = Native::<FleetContract>::reference()
            .grant(&request)
            .unwrap();
        assert_eq!(d.grant, native);
        assert_eq!(
            d.grant.nodes,
            vec![1],
            "one at a time, the first node waiting"
        );
    }
}
