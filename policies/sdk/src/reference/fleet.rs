//! The reference's rollout, what a [`Fleet`](crate::Fleet) grants unless it writes its own
//! `grant`: a canary first, then bounded waves.
//!
//! | state of the pool                               | grant                                       |
//! |-------------------------------------------------|---------------------------------------------|
//! | every node at the target                        | none                                        |
//! | no granted node has reached the target yet      | one canary: the first ready waiting node by |
//! |                                                 | name, unless a canary is already granted    |
//! | the canary failed (and none has succeeded)      | none: the rest of the pool holds; the       |
//! |                                                 | controller marks the pool Degraded          |
//! | a granted node reached the target               | waves: ready waiting nodes by name until    |
//! |                                                 | `wave` nodes are in flight                  |
//!
//! `wave` is `max(1, 10 %)` of the pool's nodes, or the pool's `pinset.io/rollout-max-pulling`
//! annotation (`3` or `25%`). A node in flight is granted and pulling, or granted and failed (it
//! retries with backoff and keeps its slot, so failures slow a rollout and a wave that fails
//! whole stops it); a granted node that is not Ready frees its slot.

use crate::prelude::*;
use crate::{Grant, Phase, Rollout};

/// Percent of a pool's nodes pulling at once after the canary.
pub const WAVE_PERCENT: usize = 10;

/// Nodes pulling at once after the canary: the host's ceiling when the pool sets one, else
/// `max(1, 10 %)` of the pool.
#[inline]
pub fn wave(rollout: &Rollout) -> u32 {
    rollout
        .pool
        .max_pulling
        .unwrap_or_else(|| (rollout.nodes.len() * WAVE_PERCENT / 100).max(1) as u32)
}

/// The pool's grant now: see the table above. `#[inline]`, as [`super::admit`] is: compiled
/// in the policy's crate (out of line, the 300-node grant ran 5 % slower).
#[inline]
pub fn grant(rollout: &Rollout) -> Grant {
    let nodes = &rollout.nodes;
    let done = rollout.count(Phase::Done);
    if done == nodes.len() {
        return Grant::none(format!("all {done} node(s) at the target"));
    }
    let proven = nodes.iter().any(|n| n.granted && n.phase == Phase::Done);
    if !proven {
        return canary(rollout);
    }
    let wave = wave(rollout);
    let in_flight = nodes.iter().filter(|n| n.holds_slot()).count() as u32;
    let add: Vec<u32> = rollout
        .candidates()
        .take(wave.saturating_sub(in_flight) as usize)
        .collect();
    let failed = rollout.count(Phase::Failed);
    let mut reason = if add.is_empty() {
        format!("wave of {wave}: {in_flight} node(s) in flight; waiting for them")
    } else {
        format!(
            "wave of {wave}: granting {} ({in_flight} already in flight)",
            names(rollout, &add)
        )
    };
    reason.push_str(&format!("; {done}/{} at the target", nodes.len()));
    if failed > 0 {
        reason.push_str(&format!(", {failed} failed and retrying"));
    }
    Grant::new(add, reason)
}

/// Before any granted node reached the target: one canary at a time, and a failed canary holds
/// the pool.
#[inline]
fn canary(rollout: &Rollout) -> Grant {
    let nodes = &rollout.nodes;
    if let Some(failed) = nodes.iter().find(|n| n.granted && n.phase == Phase::Failed) {
        let waiting = rollout.count(Phase::Waiting);
        return Grant::hold(format!(
            "canary node {} failed: {}; the other {waiting} node(s) wait until it succeeds or \
             the target changes (the set fixed, or another node policy module configured)",
            failed.name,
            failed.error().unwrap_or("see its MachineConfigNode")
        ));
    }
    if let Some(pulling) = nodes.iter().find(|n| n.holds_slot()) {
        return Grant::none(format!(
            "canary node {} is pulling; the others wait for it",
            pulling.name
        ));
    }
    match rollout.candidates().next() {
        Some(i) => Grant::new(
            vec![i],
            format!(
                "canary: node {} first; the others follow in waves of {} once it pins the target",
                nodes.get(i as usize).map_or("", |n| n.name),
                wave(rollout)
            ),
        ),
        None => Grant::none("no ready node to start the canary on"),
    }
}

fn names(rollout: &Rollout, indices: &[u32]) -> String {
    const SHOWN: usize = 5;
    let mut out: Vec<&str> = indices
        .iter()
        .take(SHOWN)
        .map(|&i| rollout.nodes.get(i as usize).map_or("", |n| n.name))
        .collect();
    let more = indices.len().saturating_sub(SHOWN);
    let more = format!("and {more} more");
    if indices.len() > SHOWN {
        out.push(&more);
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FleetNode, FleetPool, RolloutRequest, SetState};

    fn node(name: &str, granted: bool, phase: Phase) -> FleetNode {
        FleetNode {
            name: name.into(),
            ready: true,
            granted,
            phase,
            ..Default::default()
        }
    }

    fn pool(nodes: Vec<FleetNode>) -> RolloutRequest {
        RolloutRequest {
            pool: FleetPool {
                name: "worker".into(),
                ..Default::default()
            },
            nodes,
            ..Default::default()
        }
    }

    fn decide(r: &RolloutRequest) -> Grant {
        grant(&r.into())
    }

    fn waiting(n: usize) -> Vec<FleetNode> {
        (0..n)
            .map(|i| node(&format!("n{i:02}"), false, Phase::Waiting))
            .collect()
    }

    #[test]
    fn a_canary_first_then_no_one_while_it_pulls() {
        let mut r = pool(waiting(30));
        let g = decide(&r);
        assert_eq!(g.nodes, vec![0]);
        assert!(g.reason.contains("canary: node n00"), "{}", g.reason);
        r.nodes[0].granted = true;
        r.nodes[0].phase = Phase::Pulling;
        let g = decide(&r);
        assert!(g.nodes.is_empty() && g.reason.contains("n00 is pulling"));
    }

    #[test]
    fn a_failed_canary_holds_the_pool_naming_its_error() {
        let mut r = pool(waiting(5));
        r.nodes[0].granted = true;
        r.nodes[0].phase = Phase::Failed;
        r.nodes[0].sets.push(SetState {
            name: "s".into(),
            last_failed_error: Some("image q.io/x@sha256:00: not found".into()),
            ..Default::default()
        });
        let g = decide(&r);
        assert!(g.nodes.is_empty());
        assert!(
            g.reason.contains("canary node n00 failed") && g.reason.contains("not found"),
            "{}",
            g.reason
        );
        assert_eq!(g.hold.as_deref(), Some(g.reason.as_str()), "the pool holds");
        // Once a granted node reached the target, a failure no longer holds the pool.
        r.nodes[1].granted = true;
        r.nodes[1].phase = Phase::Done;
        let g = decide(&r);
        assert_eq!(g.hold, None, "{}", g.reason);
        assert!(g.reason.starts_with("wave of 1"), "{}", g.reason);
    }

    #[test]
    fn after_the_canary_waves_of_ten_percent_count_failures_in_flight() {
        let mut r = pool(waiting(30));
        r.nodes[0] = node("n00", true, Phase::Done);
        let g = decide(&r);
        assert_eq!(g.nodes, vec![1, 2, 3], "10% of 30");
        for i in 1..=3 {
            r.nodes[i].granted = true;
            r.nodes[i].phase = Phase::Pulling;
        }
        r.nodes[2].phase = Phase::Failed;
        assert!(decide(&r).nodes.is_empty(), "the wave is full");
        r.nodes[1].phase = Phase::Done;
        let g = decide(&r);
        assert_eq!(g.nodes, vec![4]);
        assert!(g.reason.contains("1 failed"), "{}", g.reason);
    }

    #[test]
    fn small_pools_go_one_at_a_time_and_the_annotation_overrides() {
        let mut r = pool(waiting(3));
        r.nodes[0] = node("n00", true, Phase::Done);
        assert_eq!(decide(&r).nodes, vec![1]);
        r.pool.max_pulling = Some(5);
        assert_eq!(decide(&r).nodes, vec![1, 2]);
    }

    #[test]
    fn unready_nodes_are_skipped_and_free_their_slot() {
        let mut r = pool(waiting(4));
        r.nodes[0] = node("n00", true, Phase::Done);
        r.nodes[1].granted = true;
        r.nodes[1].phase = Phase::Pulling;
        r.nodes[1].ready = false;
        r.nodes[2].ready = false;
        assert_eq!(decide(&r).nodes, vec![3]);
    }

    #[test]
    fn nothing_to_do_when_every_node_is_done() {
        let r = pool(vec![
            node("a", false, Phase::Done),
            node("b", true, Phase::Done),
        ]);
        let g = decide(&r);
        assert!(
            g.nodes.is_empty() && g.reason.contains("all 2"),
            "{}",
            g.reason
        );
    }
}
