//! From a policy's answers to a pull plan.

use crate::decisions::Decisions;
use pinset_policy_sdk::{Admission, AdmissionRequest, Verdict};

/// What a reconcile will do: the admission, the images to pull in order, and how many at once.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub admission: Admission,
    /// Indices into the request's images, in pull order. Only admitted images that are absent.
    pub pulls: Vec<u32>,
    pub concurrency: u32,
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

/// Ask the policy for admission, order and concurrency.
pub fn make(policy: &mut dyn Decisions, request: &AdmissionRequest) -> Plan {
    let admission = policy.admit(request);
    let candidates = admitted_absent(request, &admission.verdict);
    let pulls = if candidates.is_empty() {
        Vec::new()
    } else {
        let order = policy.order(&request.node, &request.images.subset(&candidates));
        order.into_iter().map(|k| candidates[k as usize]).collect()
    };
    let concurrency = policy.concurrency(&request.node);
    Plan {
        admission,
        pulls,
        concurrency,
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
}
