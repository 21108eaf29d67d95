//! The host side of the fleet contract (`wit/fleet/fleet.wit`): a [`FleetInstance`] is a Wasm
//! fleet module or the native default; [`GuardedFleet`] asks one, validates the answer
//! ([`crate::validate::grant`]) and falls back to the native default fleet policy on any failure.

use crate::guard::Guard;
use crate::{Described, Fallback, Hook, MAX_CONCURRENCY, Observer, PolicyError, validate};
use pinset_policy_default::DefaultFleet;
use pinset_policy_sdk::{Fleet, Grant, PolicyInfo, Rollout, RolloutRequest};
use std::sync::Arc;

/// A fleet policy answering one decision. Calls may fail; the controller uses [`GuardedFleet`].
pub trait FleetInstance: Described {
    /// Which nodes of the pool may pull now, the request given as the columns both a module
    /// and the native policies read.
    fn grant_rollout(&mut self, rollout: &Rollout) -> Result<Grant, PolicyError>;
    /// The same for a request as the controller builds it, its columns built here.
    fn grant(&mut self, request: &RolloutRequest) -> Result<Grant, PolicyError> {
        self.grant_rollout(&Rollout::from(request))
    }
}

/// A fleet policy compiled into pinset. Its calls cannot fail.
pub struct NativeFleet {
    name: String,
    fleet: Box<dyn Fleet + Send>,
}

impl NativeFleet {
    pub fn new(name: impl Into<String>, fleet: impl Fleet + Send + 'static) -> Self {
        Self {
            name: name.into(),
            fleet: Box::new(fleet),
        }
    }

    /// The default fleet policy's source compiled natively: the fallback of every failed fleet
    /// decision.
    pub fn reference() -> Self {
        Self::new("builtin:default-fleet", DefaultFleet)
    }
}

impl Described for NativeFleet {
    fn name(&self) -> &str {
        &self.name
    }
    fn info(&mut self) -> Result<PolicyInfo, PolicyError> {
        Ok(self.fleet.info())
    }
}

impl FleetInstance for NativeFleet {
    fn grant_rollout(&mut self, rollout: &Rollout) -> Result<Grant, PolicyError> {
        Ok(self.fleet.grant(rollout))
    }
}

/// A fleet decision whose answer is valid: the primary policy's when it is, else the native
/// default's (with the failure).
pub struct GuardedFleet {
    primary: Box<dyn FleetInstance>,
    guard: Guard,
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

impl GuardedFleet {
    pub fn new(primary: Box<dyn FleetInstance>) -> Self {
        Self {
            primary,
            guard: Guard::default(),
        }
    }

    /// No warning per failure: the caller reports the failures ([`Decided::fallback`]) itself,
    /// once (`pinset policy simulate`, which may meet the same failure at every decision).
    pub fn without_warnings(mut self) -> Self {
        self.guard.quiet();
        self
    }

    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.guard.observe(observer);
        self
    }

    /// Which nodes of `request`'s pool may pull now. Never fails. The request's columns are
    /// built once, for the primary policy and, when its answer is not used, the fallback.
    pub fn grant(&mut self, request: &RolloutRequest) -> Decided {
        let rollout = Rollout::from(request);
        let primary = self.primary.as_mut();
        let name = primary.name().to_string();
        let answer = self.guard.ask(
            &name,
            Hook::Grant,
            Some(&request.pool.name),
            || primary.grant_rollout(&rollout),
            |grant| validate::grant(grant, request),
        );
        if let Some(grant) = answer {
            return Decided {
                grant,
                policy: name,
                fallback: None,
            };
        }
        let mut reference = NativeFleet::reference();
        let grant = reference
            .grant_rollout(&rollout)
            .expect("the native default fleet policy cannot fail");
        Decided {
            grant,
            policy: reference.name().to_string(),
            fallback: self.guard.take_fallbacks().pop(),
        }
    }
}

/// Pulls at once a grant may allow on a node.
pub const MAX_PULLS: u32 = MAX_CONCURRENCY;

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_policy_sdk::{FleetNode, FleetPool, Phase};

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
        RolloutRequest {
            pool: FleetPool {
                name: "worker".into(),
                max_pulling,
                ..Default::default()
            },
            nodes: (0..n)
                .map(|i| FleetNode {
                    name: format!("n{i}"),
                    ready: true,
                    phase: Phase::Waiting,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_valid_answer_is_used_and_an_invalid_one_falls_back_to_the_canary() {
        let all = Grant::new(vec![0, 1, 2], "everyone");
        let d = GuardedFleet::new(Box::new(Answer::new(all.clone()))).grant(&request(3, None));
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
            let d = GuardedFleet::new(Box::new(Answer::new(bad))).grant(&request(3, max));
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
        let d = GuardedFleet::new(Box::new(out_of_range)).grant(&request);
        let asked = asked.lock().unwrap().take().expect("the module was asked");
        assert_eq!(asked, Rollout::from(&request));
        assert!(d.fallback.is_some());
        let native = NativeFleet::reference().grant(&request).unwrap();
        assert_eq!(d.grant, native);
        assert_eq!(
            d.grant.nodes,
            vec![1],
            "one at a time, the first node waiting"
        );
    }
}
