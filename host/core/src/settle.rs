//! After the pulls: which sets are complete (and so pinned), which are not and why, and which
//! complete sets the runtime did not confirm pinned. Pure: the node crate gathers presence and
//! pin confirmations, this module decides what they mean for each set.

use crate::desired::Desired;
use crate::plan::Plan;
use crate::status::NodeStatus;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// What the pulls of one reconcile came to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub pulled: Vec<String>,
    /// (reference, error) of every image that failed all its attempts.
    pub failed: Vec<(String, String)>,
    /// Images never attempted because the disk filled up (the error that drained them).
    pub drained: Vec<String>,
    pub no_space: Option<String>,
    pub cancelled: bool,
}

/// The sets of a desired state, judged by what is present after the pulls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settled {
    /// Indices into `Desired::sets` of the sets whose every image is present.
    pub complete: Vec<usize>,
    /// Exactly the images to pin: those of the complete sets.
    pub pin: BTreeSet<String>,
    /// Sets with missing images: (index into `Desired::sets`, why, naming the images).
    pub incomplete: Vec<(usize, String)>,
}

/// Judge every set of `desired` by `present_after` (by index of `Desired::images`).
pub fn settle(
    desired: &Desired,
    present_after: &[bool],
    plan: &Plan,
    outcome: &Outcome,
) -> Settled {
    let errors: HashMap<&str, &str> = outcome
        .failed
        .iter()
        .map(|(r, e)| (r.as_str(), e.as_str()))
        .collect();
    let mut settled = Settled::default();
    for (n, set) in desired.sets.iter().enumerate() {
        let missing: Vec<&str> = set
            .images
            .iter()
            .filter(|&&i| !present_after.get(i).copied().unwrap_or(false))
            .map(|&i| desired.images[i].reference.as_str())
            .collect();
        if missing.is_empty() {
            settled.pin.extend(
                set.images
                    .iter()
                    .map(|&i| desired.images[i].reference.to_string()),
            );
            settled.complete.push(n);
        } else {
            let why = missing_reason(&missing, &errors, plan, outcome);
            settled.incomplete.push((n, why));
        }
    }
    settled
}

/// The pin confirmation of the complete sets: `unconfirmed` are the images the runtime still
/// did not report pinned after `waited`.
pub struct Confirmation<'a> {
    pub backend: &'a str,
    pub unconfirmed: &'a BTreeSet<String>,
    pub waited: Duration,
}

/// Write the verdicts into `status`: complete and confirmed sets succeed, the others fail with
/// their reason. Returns the failure messages (invalid sets included), one per set.
pub fn record(
    desired: &Desired,
    settled: &Settled,
    confirmation: &Confirmation<'_>,
    status: &mut NodeStatus,
) -> Vec<String> {
    let mut failures = Vec::new();
    for (n, why) in &settled.incomplete {
        let set = &desired.sets[*n];
        status.fail(&set.name, set.generation, why);
        failures.push(format!("PinnedImageSet {}: {why}", set.name));
    }
    for invalid in &desired.invalid {
        failures.push(invalid.to_string());
    }
    for &n in &settled.complete {
        let set = &desired.sets[n];
        let not_pinned: Vec<&str> = set
            .images
            .iter()
            .map(|&i| desired.images[i].reference.as_str())
            .filter(|r| confirmation.unconfirmed.contains(*r))
            .collect();
        if not_pinned.is_empty() {
            status.succeed(&set.name, set.generation);
            continue;
        }
        let why = format!(
            "the {} back end pinned {} image(s) but the runtime does not report them pinned after {:?}: {}",
            confirmation.backend,
            not_pinned.len(),
            confirmation.waited,
            not_pinned.join(", ")
        );
        status.fail(&set.name, set.generation, &why);
        failures.push(format!("PinnedImageSet {}: {why}", set.name));
    }
    failures
}

/// Why images of a set are missing, naming them: images are grouped by cause, so a cause shared
/// by many (a policy's reason, a full disk) is said once; at most [`SHOWN`] images are named.
fn missing_reason(
    missing: &[&str],
    errors: &HashMap<&str, &str>,
    plan: &Plan,
    outcome: &Outcome,
) -> String {
    let mut causes: Vec<(String, Vec<&str>)> = Vec::new();
    for &m in missing {
        let cause = match errors.get(m) {
            Some(e) => e.to_string(),
            None if plan.rejected() => format!("not admitted: {}", plan.admission.reason),
            None if outcome.drained.iter().any(|d| d == m) => format!(
                "not pulled: the disk filled up ({})",
                outcome.no_space.as_deref().unwrap_or("")
            ),
            None => format!("not admitted by the policy: {}", plan.admission.reason),
        };
        match causes.iter_mut().find(|(c, _)| *c == cause) {
            Some((_, images)) => images.push(m),
            None => causes.push((cause, vec![m])),
        }
    }
    let mut shown = 0;
    let mut parts = Vec::new();
    for (cause, images) in &causes {
        if shown >= SHOWN {
            break;
        }
        let named: Vec<&str> = images.iter().take(SHOWN - shown).copied().collect();
        shown += named.len();
        parts.push(format!("{}: {cause}", named.join(", ")));
    }
    if missing.len() > shown {
        parts.push(format!("and {} more", missing.len() - shown));
    }
    format!("{} image(s) missing: {}", missing.len(), parts.join("; "))
}

/// Images named in a set's failure; the others are counted.
const SHOWN: usize = 5;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{NodeInfo, PinnedImageSet, desired, standard_pools};
    use pinset_policy_sdk::{Admission, Verdict};

    fn image(n: u8) -> String {
        format!("quay.io/x/y@sha256:{}", format!("{n:02x}").repeat(32))
    }

    /// Two worker sets: `a` = images 1, 2; `b` = image 3.
    fn two_sets() -> Desired {
        let set = |name: &str, images: Vec<String>| PinnedImageSet {
            name: name.into(),
            generation: 2,
            labels: [(
                "machineconfiguration.openshift.io/role".into(),
                "worker".into(),
            )]
            .into(),
            images,
        };
        let node = NodeInfo {
            name: "w".into(),
            labels: [("node-role.kubernetes.io/worker".into(), String::new())].into(),
            ..Default::default()
        };
        desired(
            &node,
            &standard_pools(),
            &[set("a", vec![image(1), image(2)]), set("b", vec![image(3)])],
        )
    }

    fn plan(verdict: Verdict) -> Plan {
        Plan {
            admission: Admission {
                verdict,
                reason: "because".into(),
            },
            pulls: Vec::new(),
            concurrency: 1,
            capped_from: None,
        }
    }

    fn index(d: &Desired, n: u8) -> usize {
        d.images
            .iter()
            .position(|w| w.reference.as_str() == image(n))
            .unwrap()
    }

    #[test]
    fn complete_sets_are_pinned_and_missing_images_are_named_with_their_cause() {
        let d = two_sets();
        let mut present = vec![true; d.images.len()];
        present[index(&d, 2)] = false;
        let outcome = Outcome {
            failed: vec![(image(2), "manifest unknown".into())],
            ..Default::default()
        };
        let s = settle(&d, &present, &plan(Verdict::AdmitAll), &outcome);
        let b = d.sets.iter().position(|s| s.name == "b").unwrap();
        assert_eq!(s.complete, vec![b]);
        assert_eq!(s.pin, [image(3)].into());
        assert_eq!(s.incomplete.len(), 1);
        assert_eq!(
            s.incomplete[0].1,
            format!("1 image(s) missing: {}: manifest unknown", image(2))
        );
    }

    #[test]
    fn a_rejection_and_a_full_disk_are_the_reasons_when_nothing_failed() {
        let d = two_sets();
        let present = vec![false; d.images.len()];
        let rejected = settle(&d, &present, &plan(Verdict::Reject), &Outcome::default());
        assert!(rejected.complete.is_empty() && rejected.pin.is_empty());
        assert!(rejected.incomplete[0].1.contains("not admitted: because"));
        let full = Outcome {
            drained: vec![image(3)],
            no_space: Some("no space left on device".into()),
            ..Default::default()
        };
        let s = settle(&d, &present, &plan(Verdict::AdmitAll), &full);
        let why = &s
            .incomplete
            .iter()
            .find(|(n, _)| d.sets[*n].name == "b")
            .unwrap()
            .1;
        assert!(
            why.contains("the disk filled up (no space left on device)"),
            "{why}"
        );
    }

    #[test]
    fn unconfirmed_pins_fail_their_set_and_others_succeed() {
        let d = two_sets();
        let present = vec![true; d.images.len()];
        let s = settle(&d, &present, &plan(Verdict::AdmitAll), &Outcome::default());
        let mut status = NodeStatus::default();
        status.start(&d, Default::default());
        let unconfirmed = [image(3)].into();
        let failures = record(
            &d,
            &s,
            &Confirmation {
                backend: "crio",
                unconfirmed: &unconfirmed,
                waited: Duration::from_secs(10),
            },
            &mut status,
        );
        assert_eq!(failures.len(), 1);
        assert!(failures[0].starts_with("PinnedImageSet b: the crio back end pinned 1 image(s)"));
        assert_eq!(status.sets["a"].current_generation, Some(2));
        assert_eq!(status.sets["b"].last_failed_generation, Some(2));
    }
}
