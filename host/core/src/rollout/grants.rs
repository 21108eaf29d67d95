//! What a grant changes: the grants written and not yet read back, the nodes a grant adds, a
//! grant over the ceiling, a held rollout.

use super::*;

/// A grant the controller wrote, and when (milliseconds since the Unix epoch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub grant: RolloutGrant,
    pub at_ms: u64,
}

/// How long a written grant counts while the cache does not show it. A cache lags by
/// milliseconds; a grant still missing after this was lost (its MachineConfigNode deleted and
/// created again), and the cache is right.
pub const WRITTEN_TTL_MS: u64 = 30_000;

/// Grants the controller wrote that the members, read from a cache, may not show yet: a member
/// whose own grant does not cover the one written gets the written one, so that a decision made
/// before the cache catches up neither grants the node again nor sees its slot free. Entries
/// the members show, entries of nodes no longer in the pool, and entries older than
/// [`WRITTEN_TTL_MS`] at `now_ms` are dropped from `written`.
pub fn overlay_written(
    members: &mut [Member],
    written: &mut BTreeMap<String, Written>,
    now_ms: u64,
) {
    written.retain(|node, w| {
        let Some(member) = members.iter_mut().find(|m| &m.name == node) else {
            return false;
        };
        let seen = member.grant.as_ref().is_some_and(|g| {
            w.grant
                .sets
                .iter()
                .all(|(set, generation)| g.covers(set, *generation))
        });
        let live = !seen && now_ms.saturating_sub(w.at_ms) < WRITTEN_TTL_MS;
        if live {
            member.grant = Some(w.grant.clone());
        }
        live
    });
}

/// The nodes a grant adds: those it names that do not hold one for the target yet, and still
/// have work to do (indices into `request.nodes`).
pub fn newly_granted(request: &RolloutRequest, nodes: &[u32]) -> Vec<usize> {
    let mut out: Vec<usize> = nodes
        .iter()
        .map(|&i| i as usize)
        .filter(|&i| {
            request
                .nodes
                .get(i)
                .is_some_and(|n| !n.granted && n.phase != Phase::Done)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// An answer that would leave the pool over its ceiling (`pool.max_pulling`): the nodes
/// holding a slot after it ([`FleetNode::holds_slot`]) plus every node it adds
/// ([`newly_granted`]: the controller writes their grants whatever their state — not Ready,
/// failed, or pulling without a grant — so each counts), and the ceiling. An answer that adds
/// nobody never is: a pool already over a ceiling lowered mid-rollout waits for its nodes, and
/// the policy that says so did nothing wrong. The host checks every fleet answer with this
/// (`pinset_policy::validate::grant`).
pub fn over_ceiling(request: &RolloutRequest, nodes: &[u32]) -> Option<(usize, u32)> {
    let ceiling = request.pool.max_pulling?;
    let added = newly_granted(request, nodes).len();
    if added == 0 {
        return None;
    }
    let holding = request.nodes.iter().filter(|n| n.holds_slot()).count();
    let after = holding + added;
    (after > ceiling as usize).then_some((after, ceiling))
}

/// The pool's Degraded message when the fleet policy's answer holds its rollout
/// ([`Grant::hold`]: the default's failed canary, or a custom policy's own stop): the pool's
/// status and the `RolloutHeld` Event say this.
pub fn held(grant: &Grant) -> Option<String> {
    grant
        .hold
        .as_ref()
        .map(|why| format!("the rollout holds: {why}"))
}
