//! The fleet contract's records as plain Rust values (mirrors `wit/fleet/fleet.wit`), the
//! [`Fleet`] trait and its helpers.

use crate::prelude::*;

use crate::PolicyInfo;

/// The pool annotation that bounds how many of its nodes pull at once: the default fleet
/// policy's wave size, and a ceiling the host enforces on every fleet policy's answer. A count
/// (`3`) or a percentage of the pool's nodes (`25%`, at least one node).
pub const MAX_PULLING_ANNOTATION: &str = "pinset.io/rollout-max-pulling";

/// The pool being rolled out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetPool {
    pub name: String,
    /// (key, value) pairs sorted by key.
    pub annotations: Vec<(String, String)>,
    /// The host's ceiling on nodes pulling at once, from [`MAX_PULLING_ANNOTATION`].
    pub max_pulling: Option<u32>,
}

/// One PinnedImageSet of the target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetSet {
    pub name: String,
    pub generation: i64,
    pub images: u32,
    /// Compressed bytes when known, else 0.
    pub bytes: u64,
}

/// Every set of the pool at its current generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    pub sets: Vec<TargetSet>,
    pub images: u32,
    pub bytes: u64,
}

/// Where a node stands against the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Not granted, not at the target.
    #[default]
    Waiting,
    /// Granted, working towards the target.
    Pulling,
    /// Every set of the target pinned at its generation.
    Done,
    /// A set of the target failed at its generation (the node retries with backoff).
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Pulling => "pulling",
            Phase::Done => "done",
            Phase::Failed => "failed",
        }
    }
}

/// One set as a node reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetState {
    pub name: String,
    pub desired_generation: i64,
    pub current_generation: Option<i64>,
    pub last_failed_generation: Option<i64>,
    pub last_failed_error: Option<String>,
}

/// How far a node's current reconcile is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeProgress {
    pub images_done: u64,
    pub images_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// How long the node has been pulling for the target, when it is.
    pub pulling_for_ms: Option<u64>,
}

/// One node of the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetNode {
    pub name: String,
    /// (key, value) pairs sorted by key.
    pub labels: Vec<(String, String)>,
    pub ready: bool,
    /// Holds a grant for the target.
    pub granted: bool,
    pub phase: Phase,
    pub progress: NodeProgress,
    pub sets: Vec<SetState>,
}

impl FleetNode {
    /// A ready node without a grant that has not started on the target: how every node enters
    /// a rollout (for a policy's tests and simulations).
    pub fn waiting(name: impl Into<String>) -> Self {
        FleetNode {
            name: name.into(),
            ready: true,
            phase: Phase::Waiting,
            ..Default::default()
        }
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Granted and still at work towards the target: pulling, or failed and retrying.
    pub fn in_flight(&self) -> bool {
        in_flight(self.granted, self.phase)
    }

    /// Counts against the pool's ceiling ([`holds_slot`]).
    pub fn holds_slot(&self) -> bool {
        holds_slot(self.granted, self.phase, self.ready)
    }

    /// The error of the first target set that failed on this node, if any.
    pub fn error(&self) -> Option<&str> {
        self.sets
            .iter()
            .find_map(|s| s.last_failed_error.as_deref())
    }
}

/// A node holding a grant in `phase` is still at work towards the target: pulling, or failed
/// and retrying (it keeps its slot). The one rule behind [`FleetNode::in_flight`] and
/// [`crate::Node::in_flight`].
pub(crate) fn in_flight(granted: bool, phase: Phase) -> bool {
    granted && matches!(phase, Phase::Pulling | Phase::Failed)
}

/// A node counts against the pool's ceiling on nodes pulling at once
/// ([`MAX_PULLING_ANNOTATION`]) while it is in flight ([`FleetNode::in_flight`]) and Ready: a granted node
/// that is not Ready frees its slot until it is Ready again (a node that went away must not hold
/// the rollout). The one rule behind [`FleetNode::holds_slot`] and [`crate::Node::holds_slot`],
/// which the reference's rollout counts its waves by and the host checks every answer with.
pub fn holds_slot(granted: bool, phase: Phase, ready: bool) -> bool {
    ready && in_flight(granted, phase)
}

/// What the controller knows of a pool's rollout, one record per node: what it builds, updates
/// and validates answers against. A policy reads it as a [`crate::Rollout`] (columns).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolloutRequest {
    pub pool: FleetPool,
    pub target: Target,
    /// Every node of the pool, sorted by name.
    pub nodes: Vec<FleetNode>,
}

/// A fleet policy's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// Indices into [`RolloutRequest::nodes`] of the nodes that may pull now, each once. Nodes
    /// already granted keep their grant whether listed or not.
    pub nodes: Vec<u32>,
    /// Pulls at once on each granted node (1..=64), over the node policy's own concurrency.
    pub max_pulls: Option<u32>,
    /// Shown to operators in the pool's status, Events and logs.
    pub reason: String,
    /// The pool's rollout holds, and why: it cannot go on until something changes (a failed
    /// canary). The pool is Degraded with it. A grant that holds names no node.
    pub hold: Option<String>,
}

impl Grant {
    pub fn new(nodes: Vec<u32>, reason: impl Into<String>) -> Self {
        Self {
            nodes,
            max_pulls: None,
            reason: reason.into(),
            hold: None,
        }
    }

    /// Grant no node, and hold the pool's rollout: `reason` is both the grant's reason and the
    /// hold's.
    pub fn hold(reason: impl Into<String>) -> Self {
        let reason = reason.into();
        Self {
            hold: Some(reason.clone()),
            ..Self::none(reason)
        }
    }

    /// Grant no node now.
    pub fn none(reason: impl Into<String>) -> Self {
        Self::new(Vec::new(), reason)
    }
}

/// A count (`3`) or a percentage (`25%`) of `of` nodes, at least 1; `None` when `text` is
/// neither.
pub fn count_or_percent(text: &str, of: usize) -> Option<u32> {
    let text = text.trim();
    let n = match text.strip_suffix('%') {
        Some(p) => {
            let p: u64 = p.trim().parse().ok().filter(|p| *p <= 100)?;
            (of as u64 * p / 100) as u32
        }
        None => text.parse().ok()?,
    };
    Some(n.max(1))
}

/// The decision of a fleet rollout policy. See `wit/fleet/fleet.wit` for the contract;
/// `export_fleet!(MyFleet)` exports a type as the module's fleet policy.
///
/// An instance answers one call: do not rely on state kept between calls.
///
/// ```
/// use pinset_policy_sdk::*;
///
/// /// Ready waiting nodes of zone `a` first, at most two nodes in flight.
/// #[derive(Default)]
/// struct ZoneAFirst;
///
/// impl Fleet for ZoneAFirst {
///     fn info(&self) -> PolicyInfo {
///         PolicyInfo::new("zone-a-first", "0.1.0", "zone a first, two nodes at a time")
///     }
///     fn grant(&self, rollout: &Rollout) -> Grant {
///         let in_flight = rollout.nodes.iter().filter(|n| n.in_flight()).count();
///         let mut candidates: Vec<Node> = rollout
///             .candidates()
///             .filter_map(|i| rollout.nodes.get(i as usize))
///             .collect();
///         candidates.sort_by_key(|n| n.label("topology.kubernetes.io/zone") != Some("a"));
///         let add = candidates.iter().take(2usize.saturating_sub(in_flight));
///         Grant::new(add.map(|n| n.index).collect(), "zone a first, two at a time")
///     }
/// }
///
/// // Natively, a plain value: build the pool from records and ask it.
/// let node = |name: &str, zone: &str| FleetNode {
///     name: name.into(),
///     labels: vec![("topology.kubernetes.io/zone".into(), zone.into())],
///     ready: true,
///     ..Default::default()
/// };
/// let pool = RolloutRequest {
///     nodes: vec![node("w-0", "b"), node("w-1", "a"), node("w-2", "a")],
///     ..Default::default()
/// };
/// assert_eq!(ZoneAFirst.grant(&Rollout::from(&pool)).nodes, vec![1, 2]);
/// ```
pub trait Fleet {
    /// Name, version and a one-line description.
    fn info(&self) -> PolicyInfo;
    /// Which nodes of the pool may pull now; unless written, the reference's
    /// ([`crate::reference::fleet`]: a canary, then waves).
    fn grant(&self, rollout: &crate::Rollout) -> Grant {
        crate::reference::fleet::grant(rollout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_percentages() {
        assert_eq!(count_or_percent("3", 100), Some(3));
        assert_eq!(count_or_percent("25%", 10), Some(2));
        assert_eq!(count_or_percent("10%", 3), Some(1), "at least one node");
        assert_eq!(count_or_percent("0", 3), Some(1));
        assert_eq!(count_or_percent("101%", 3), None);
        assert_eq!(count_or_percent("many", 3), None);
        assert_eq!(count_or_percent("-1", 3), None);
    }

    #[test]
    fn candidates_are_ready_ungranted_waiting_nodes() {
        let node = |name: &str, ready, granted, phase| FleetNode {
            name: name.into(),
            ready,
            granted,
            phase,
            ..Default::default()
        };
        let r = RolloutRequest {
            nodes: vec![
                node("a", true, true, Phase::Pulling),
                node("b", false, false, Phase::Waiting),
                node("c", true, false, Phase::Done),
                node("d", true, false, Phase::Waiting),
            ],
            ..Default::default()
        };
        assert!(r.nodes[0].in_flight() && !r.nodes[2].in_flight());
        let r = crate::Rollout::from(&r);
        assert_eq!(r.candidates().collect::<Vec<_>>(), vec![3]);
        assert_eq!(r.count(Phase::Waiting), 2);
        let first = r.nodes.get(0).unwrap();
        assert!(first.in_flight() && !r.nodes.get(2).unwrap().in_flight());
    }
}
