//! From a policy's answers to a pull plan.

use crate::decisions::Decisions;
use pinset_policy_sdk::{Admission, AdmissionRequest, Verdict};

/// What a reconcile will do: the admission, the images to pull in order, and how many at once.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub admission: Admission,
    /// Indices into the request's images, in pull order. Only admitted images that are absent.
    pub pulls: Vec<u32>,
    /// Pulls at once: the policy's answer, at most the rollout grant's cap.
    pub concurrency: u32,
    /// The policy's own answer when the node's rollout grant capped it (`max-pulls`).
    pub capped_from: Option<u32>,
}

impl Plan {
    pub fn rejected(&self) -> bool {
        self.admission.verdict == Verdict::Reject
    }

    /// The verdict in the words of the scenario format: `admit-all`, `admit-some (N)`, `reject`.
    pub fn verdict(&self) -> String {
        match &self.admission.verdict {
            Verdict::AdmitAll => "admit-all".into(),
            Verdict::AdmitSome(subset) => format!("admit-some ({} image(s))", subset.len()),
            Verdict::Reject => "reject".into(),
        }
    }
}

/// Indices of the images an admission lets pinset pull: admitted and not present, in the
/// request's order.
pub fn admitted_absent(request: &AdmissionRequest, verdict: &Verdict) -> Vec<u32> {
    match verdict {
        Verdict::Reject => Vec::new(),
        Verdict::AdmitAll => request.images.absent().collect(),
        Verdict::AdmitSome(subset) => {
            let mut chosen = vec![false; request.images.len()];
            for &i in subset {
                if let Some(slot) = chosen.get_mut(i as usize) {
                    *slot = true;
                }
            }
            request
                .images
                .absent()
                .filter(|&i| chosen[i as usize])
                .collect()
        }
    }
}

/// Ask the policy for admission, order and concurrency. `grant_cap` is the node's rollout
/// grant's `max-pulls` (the fleet policy's cap over the node policy's concurrency): the one place
/// a plan's concurrency is bounded by it, so that `pinset plan` shows what the node will do.
pub fn make(
    policy: &mut dyn Decisions,
    request: &AdmissionRequest,
    grant_cap: Option<u32>,
) -> Plan {
    let admission = policy.admit(request);
    let candidates = admitted_absent(request, &admission.verdict);
    let pulls = if candidates.is_empty() {
        Vec::new()
    } else {
        let order = policy.order(&request.node, &request.images.subset(&candidates));
        order.into_iter().map(|k| candidates[k as usize]).collect()
    };
    let asked = policy.concurrency(&request.node);
    let concurrency = grant_cap.map_or(asked, |cap| asked.min(cap.max(1)));
    Plan {
        admission,
        pulls,
        concurrency,
        capped_from: (concurrency < asked).then_some(asked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_policy_sdk::Images;

    fn request(present: &[bool]) -> AdmissionRequest {
        let mut images = Images::new();
        for (i, &p) in present.iter().enumerate() {
            images.push(&format!("r{i}"), ["s"], p, None, &[]);
        }
        AdmissionRequest {
            images,
            ..Default::default()
        }
    }

    #[test]
    fn only_admitted_absent_images_are_pulled() {
        let r = request(&[false, true, false, false]);
        assert_eq!(admitted_absent(&r, &Verdict::AdmitAll), vec![0, 2, 3]);
        assert_eq!(
            admitted_absent(&r, &Verdict::AdmitSome(vec![3, 1, 0])),
            vec![0, 3]
        );
        assert!(admitted_absent(&r, &Verdict::Reject).is_empty());
    }

    /// Five pulls at once, whatever it is asked.
    struct Five;

    impl pinset_policy_sdk::Policy for Five {
        fn info(&self) -> pinset_policy_sdk::PolicyInfo {
            pinset_policy_sdk::PolicyInfo::new("five", "0", "")
        }
        fn admit(&self, _: &AdmissionRequest) -> Admission {
            Admission::admit_all("")
        }
        fn order(&self, _: &pinset_policy_sdk::NodeFacts, images: &Images) -> Vec<u32> {
            (0..images.len() as u32).collect()
        }
        fn concurrency(&self, _: &pinset_policy_sdk::NodeFacts) -> u32 {
            5
        }
        fn throttle(
            &self,
            _: &pinset_policy_sdk::NodeFacts,
            _: &pinset_policy_sdk::PullOutcome,
            _: &pinset_policy_sdk::Pressure,
        ) -> u64 {
            0
        }
    }

    #[test]
    fn a_grant_s_cap_bounds_the_plan_s_concurrency_and_says_so() {
        let r = request(&[false, false]);
        let mut policy = crate::decisions::Native(Five, Vec::new());
        let plan = make(&mut policy, &r, None);
        assert_eq!((plan.concurrency, plan.capped_from), (5, None));
        let plan = make(&mut policy, &r, Some(2));
        assert_eq!((plan.concurrency, plan.capped_from), (2, Some(5)));
        let plan = make(&mut policy, &r, Some(8));
        assert_eq!(
            (plan.concurrency, plan.capped_from),
            (5, None),
            "a cap above"
        );
        let plan = make(&mut policy, &r, Some(0));
        assert_eq!(plan.concurrency, 1, "at least one pull");
        assert_eq!(plan.pulls, vec![0, 1]);
    }
}
