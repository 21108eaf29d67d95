//! How far a pool's rollout is (the counts), where it stands, and a real rollout followed from
//! outside (`pinset rollout status`).

use super::*;

/// How far a pool's rollout is, node by node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Nodes holding a grant for the target.
    pub granted: u32,
    /// Granted nodes working towards the target.
    pub pulling: u32,
    pub done: u32,
    pub failed: u32,
    /// Nodes without a grant and not at the target.
    pub waiting: u32,
}

pub fn counts(request: &RolloutRequest) -> Counts {
    let mut c = Counts::default();
    for n in &request.nodes {
        c.granted += u32::from(n.granted);
        match n.phase {
            Phase::Waiting => c.waiting += 1,
            Phase::Pulling => c.pulling += 1,
            Phase::Done => c.done += 1,
            Phase::Failed => c.failed += 1,
        }
    }
    c
}

/// The target as a pool's status names it: `set@generation` of each set, by name, comma-separated.
pub fn target_label(target: &Target) -> String {
    let sets: Vec<String> = target
        .sets
        .iter()
        .map(|s| format!("{}@{}", s.name, s.generation))
        .collect();
    sets.join(",")
}

/// Where a pool's rollout stands against its target, as `pinset rollout status` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Every node of the pool has the target pinned (so has a pool without nodes or sets).
    Complete,
    /// The pool is Degraded for this target (a failed canary holds it, a node failed): why.
    Degraded(String),
    /// Paused by [`PAUSED_ANNOTATION`] short of the target.
    Paused,
    /// Nodes are pulling, or waiting for a grant.
    Progressing,
}

impl Standing {
    pub fn name(&self) -> &'static str {
        match self {
            Standing::Complete => "Complete",
            Standing::Degraded(_) => "Degraded",
            Standing::Paused => "Paused",
            Standing::Progressing => "Progressing",
        }
    }
}

/// Where the rollout stands, from the nodes' counts, the pause, and the pool's Degraded message.
/// `degraded` counts only when the pool's status speaks of this target: one written for an
/// earlier target says nothing of this one. A Degraded pool is Degraded even with every node at
/// the target: the target may leave out what is configured (a node policy refused before any
/// node was granted it), and a rollout is complete only when nothing is wrong.
pub fn standing(counts: &Counts, paused: bool, degraded: Option<&str>) -> Standing {
    if let Some(why) = degraded {
        Standing::Degraded(why.to_string())
    } else if counts.waiting + counts.pulling + counts.failed == 0 {
        Standing::Complete
    } else if paused {
        Standing::Paused
    } else {
        Standing::Progressing
    }
}

/// A real rollout as seen from outside (`pinset rollout status --timeline`): when each node was
/// first seen working towards the target and when it was first seen at it, or failed. Times are
/// the caller's, in milliseconds since it began watching.
#[derive(Clone, Debug, Default)]
pub struct Watched {
    nodes: BTreeMap<String, Seen>,
}

#[derive(Clone, Debug, Default)]
struct Seen {
    /// First seen short of the target (waiting or pulling): a later Done is this rollout's.
    short: bool,
    started_ms: Option<u64>,
    ended_ms: Option<u64>,
    failed: bool,
}

impl Watched {
    /// What the nodes show at `at_ms`: each node's name, whether it holds a grant, its phase.
    pub fn observe<'a>(
        &mut self,
        at_ms: u64,
        nodes: impl IntoIterator<Item = (&'a str, bool, Phase)>,
    ) {
        for (name, granted, phase) in nodes {
            let seen = self.nodes.entry(name.to_string()).or_default();
            match phase {
                Phase::Waiting => seen.short = true,
                Phase::Pulling | Phase::Failed => {
                    seen.short = true;
                    if granted {
                        seen.started_ms.get_or_insert(at_ms);
                    }
                    if phase == Phase::Failed && seen.ended_ms.is_none() {
                        seen.started_ms.get_or_insert(at_ms);
                        (seen.ended_ms, seen.failed) = (Some(at_ms), true);
                    }
                }
                // A node already at the target when the watch began draws nothing; one that
                // got there between two looks, an instant.
                Phase::Done if seen.short && (seen.ended_ms.is_none() || seen.failed) => {
                    seen.started_ms.get_or_insert(at_ms);
                    (seen.ended_ms, seen.failed) = (Some(at_ms), false);
                }
                Phase::Done => {}
            }
        }
    }

    /// The rollout as a picture: a lane per node (by name), a bar from when it was seen
    /// working to when it was seen at the target (red when it failed; open to `end_ms` while
    /// it works).
    pub fn timeline(&self, title: String, notes: Vec<String>, end_ms: u64) -> Timeline {
        let nodes = self
            .nodes
            .iter()
            .map(|(name, seen)| {
                let bar = seen.started_ms.map(|start_ms| NodeBar {
                    start_ms,
                    end_ms: seen.ended_ms,
                    failed: seen.failed,
                });
                (name.clone(), bar)
            })
            .collect();
        Timeline::of_nodes(title, notes, nodes, end_ms)
    }
}
