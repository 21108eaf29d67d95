//! Pins lost behind pinset's back. A set pinned at its desired generation (its status says so,
//! and the agent reads that status back after a restart) promises that every one of its images
//! is present and reported pinned; a reconcile's snapshot that says otherwise is a drift — an
//! image deleted (by hand, by a prune, by containerd under disk pressure), or a pin removed (a
//! label removed by hand, a drop-in edited or lost, a runtime reloaded or restarted without it).
//! The reconcile repairs what it finds (the image is pulled again through the policy, the pin
//! applied again) and reports it.

use crate::desired::Desired;
use crate::status::NodeStatus;
use std::fmt;

/// How a pin was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DriftKind {
    /// The image of a pinned set is gone from the runtime.
    ImageDeleted,
    /// The image is there, but the runtime no longer reports it pinned.
    PinRemoved,
    /// The CRI-O drop-in pinset wrote was deleted.
    DropInDeleted,
    /// The CRI-O drop-in pinset wrote was changed by someone else.
    DropInEdited,
}

impl DriftKind {
    /// A short, stable word for metrics labels and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::ImageDeleted => "image-deleted",
            DriftKind::PinRemoved => "pin-removed",
            DriftKind::DropInDeleted => "dropin-deleted",
            DriftKind::DropInEdited => "dropin-edited",
        }
    }
}

/// One lost pin: what was lost, and where.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Drift {
    pub kind: DriftKind,
    /// The image, or the drop-in's path.
    pub object: String,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.object)
    }
}

/// The images of the sets `status` says are pinned at their desired generation that the
/// runtime no longer holds (`present`) or no longer reports pinned (`pinned`), both by index of
/// `Desired::images`. Each image once, in the desired state's order.
pub fn find(
    desired: &Desired,
    status: &NodeStatus,
    present: &[bool],
    pinned: &[bool],
) -> Vec<Drift> {
    let mut promised = vec![false; desired.images.len()];
    for set in &desired.sets {
        let done = status
            .sets
            .get(&set.name)
            .is_some_and(|s| s.current_generation == Some(set.generation));
        if done {
            for &i in &set.images {
                promised[i] = true;
            }
        }
    }
    let mut out = Vec::new();
    for (i, wanted) in desired.images.iter().enumerate() {
        if !promised[i] {
            continue;
        }
        let kind = if !present.get(i).copied().unwrap_or(false) {
            DriftKind::ImageDeleted
        } else if !pinned.get(i).copied().unwrap_or(false) {
            DriftKind::PinRemoved
        } else {
            continue;
        };
        out.push(Drift {
            kind,
            object: wanted.reference.to_string(),
        });
    }
    out
}

/// One line for status and logs: how many pins were repaired, counted by kind, a few named.
pub fn summary(drift: &[Drift]) -> Option<String> {
    const SHOWN: usize = 3;
    if drift.is_empty() {
        return None;
    }
    let mut kinds: Vec<(DriftKind, usize)> = Vec::new();
    for d in drift {
        match kinds.iter_mut().find(|(k, _)| *k == d.kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((d.kind, 1)),
        }
    }
    kinds.sort();
    let counts: Vec<String> = kinds
        .iter()
        .map(|(k, n)| format!("{n} {}", k.as_str()))
        .collect();
    let named: Vec<String> = drift.iter().take(SHOWN).map(Drift::to_string).collect();
    let more = if drift.len() > SHOWN { "; …" } else { "" };
    Some(format!(
        "repaired {} lost pin(s) ({}): {}{more}",
        drift.len(),
        counts.join(", "),
        named.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{NodeInfo, PinnedImageSet, desired, standard_pools};

    fn image(n: u8) -> String {
        format!("quay.io/x/y@sha256:{}", format!("{n:02x}").repeat(32))
    }

    #[test]
    fn only_images_of_sets_pinned_at_their_generation_can_drift() {
        let set = |name: &str, generation, images: &[u8]| PinnedImageSet {
            name: name.into(),
            generation,
            labels: [(
                "machineconfiguration.openshift.io/role".into(),
                "worker".into(),
            )]
            .into(),
            images: images.iter().map(|&n| image(n)).collect(),
        };
        let node = NodeInfo {
            name: "w".into(),
            labels: [("node-role.kubernetes.io/worker".into(), String::new())].into(),
            ..Default::default()
        };
        // `done` was pinned at generation 1; `moved` at 1 but now wants 2 (a new generation is
        // not a promise yet); `new` never was.
        let d = desired(
            &node,
            &standard_pools(),
            &[
                set("done", 1, &[1, 2, 3]),
                set("moved", 2, &[4]),
                set("new", 1, &[5]),
            ],
        );
        let mut status = NodeStatus::default();
        status.start(&d, Default::default());
        status.succeed("done", 1);
        status.succeed("moved", 1);
        let at = |n: u8| {
            d.images
                .iter()
                .position(|w| w.reference.as_str() == image(n))
                .unwrap()
        };
        let mut present = vec![true; d.images.len()];
        let mut pinned = vec![true; d.images.len()];
        present[at(1)] = false;
        pinned[at(1)] = false;
        pinned[at(2)] = false;
        present[at(4)] = false;
        present[at(5)] = false;
        let drift = find(&d, &status, &present, &pinned);
        assert_eq!(
            drift,
            vec![
                Drift {
                    kind: DriftKind::ImageDeleted,
                    object: image(1)
                },
                Drift {
                    kind: DriftKind::PinRemoved,
                    object: image(2)
                },
            ]
        );
        assert_eq!(
            summary(&drift).unwrap(),
            format!(
                "repaired 2 lost pin(s) (1 image-deleted, 1 pin-removed): image-deleted: {}; pin-removed: {}",
                image(1),
                image(2)
            )
        );
        assert_eq!(summary(&[]), None);
    }
}
