//! A pool's whole rollout played offline against a fleet policy (`pinset policy simulate`):
//! simulated nodes pull the target for given durations once granted; the policy is asked at the
//! start and whenever pulls end (as the controller asks it when a node's phase changes), and the
//! nodes it grants start pulling then. What a scenario checks for one step, this shows for a
//! whole rollout: how long it takes, how many nodes pull at once, where it holds.
//!
//! Pure: the decision is a closure (the caller's guarded policy), time is simulated. A node that
//! fails keeps failing (a missing image) and keeps its grant; a node that is not Ready never
//! finishes a pull.

use crate::rollout::{self, Member, RolloutGrant};
use crate::status::{Progress, SetStatus};
use crate::timeline::{NodeBar, Timeline};
use pinset_policy_sdk::{FleetPool, Grant, Phase, RolloutRequest, Target};
use serde::Serialize;
use std::collections::BTreeMap;

/// One simulated node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimNode {
    pub name: String,
    /// (key, value) pairs sorted by key.
    pub labels: Vec<(String, String)>,
    pub ready: bool,
    /// How long its pull of the target takes once granted.
    pub pull_ms: u64,
    /// Its pull of the target fails (when it ends).
    pub fails: bool,
}

/// A pool about to roll a target out: no node is at it yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Simulation {
    pub pool: FleetPool,
    pub target: Target,
    /// The policy sees them sorted by name, as the controller passes a pool's nodes.
    pub nodes: Vec<SimNode>,
    /// From a pull's end to the decision that sees it (the node's status write, the
    /// controller's reconcile, its grant seen by the node): pulls ending within it are seen by
    /// the same decision.
    pub react_ms: u64,
}

/// How one node's rollout went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRun {
    pub name: String,
    /// When it was granted (and began to pull).
    pub granted_ms: Option<u64>,
    /// When its pull ended (at the target, or failed).
    pub ended_ms: Option<u64>,
    /// `done`, `failed`, `pulling` (granted, never finished: not Ready) or `waiting` (never
    /// granted).
    pub outcome: &'static str,
}

/// One decision of the fleet policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub at_ms: u64,
    /// The nodes it granted that held no grant yet.
    pub granted: Vec<String>,
    /// Nodes in flight (granted, Ready, pulling or failed and retrying) once it took effect.
    pub in_flight: u32,
    pub reason: String,
    /// The policy's answer was not used (trap, deadline, invalid answer): the default fleet
    /// policy's was.
    pub fallback: bool,
}

/// A whole simulated rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub nodes: Vec<NodeRun>,
    pub decisions: Vec<Decision>,
    /// When the last node reached the target, when every node did.
    pub complete_ms: Option<u64>,
    /// When the last pull ended or the last decision was taken, whichever is later.
    pub end_ms: u64,
    /// The most nodes in flight at once.
    pub max_in_flight: u32,
    pub done: u32,
    pub failed: u32,
    /// Granted but never finished (not Ready).
    pub stalled: u32,
    /// Never granted.
    pub waiting: u32,
    pub fallbacks: u32,
    /// Every node reached the target.
    pub complete: bool,
}

/// Where the nodes stand: when each was granted and when its pull ended.
struct State {
    granted: Vec<Option<u64>>,
    ended: Vec<Option<u64>>,
}

impl State {
    fn phase(&self, sim: &Simulation, i: usize) -> Phase {
        match (self.granted[i], self.ended[i]) {
            (_, Some(_)) if sim.nodes[i].fails => Phase::Failed,
            (_, Some(_)) => Phase::Done,
            (Some(_), None) => Phase::Pulling,
            (None, None) => Phase::Waiting,
        }
    }

    fn in_flight(&self, sim: &Simulation) -> u32 {
        (0..sim.nodes.len())
            .filter(|&i| {
                let phase = self.phase(sim, i);
                sim.nodes[i].ready && matches!(phase, Phase::Pulling | Phase::Failed)
            })
            .count() as u32
    }

    /// When the next pull ends: the earliest among granted, Ready nodes still pulling.
    fn next_end(&self, sim: &Simulation) -> Option<u64> {
        (0..sim.nodes.len())
            .filter(|&i| sim.nodes[i].ready && self.ended[i].is_none())
            .filter_map(|i| Some(self.granted[i]? + sim.nodes[i].pull_ms))
            .min()
    }

    /// Every pull that has ended by `now` ends.
    fn end_until(&mut self, sim: &Simulation, now: u64) {
        for (i, node) in sim.nodes.iter().enumerate() {
            if let (true, Some(start), None) = (node.ready, self.granted[i], self.ended[i]) {
                let end = start + node.pull_ms;
                if end <= now {
                    self.ended[i] = Some(end);
                }
            }
        }
    }
}

/// Play `sim` through, asking `decide` (answer, and whether it was a fallback) at each step.
pub fn run(sim: &Simulation, mut decide: impl FnMut(&RolloutRequest) -> (Grant, bool)) -> Run {
    let n = sim.nodes.len();
    let mut state = State {
        granted: vec![None; n],
        ended: vec![None; n],
    };
    // Node `k` of a request is `sim.nodes[by_name[k]]` (the request lists them by name).
    let mut by_name: Vec<usize> = (0..n).collect();
    by_name.sort_by(|&a, &b| sim.nodes[a].name.cmp(&sim.nodes[b].name));
    let (mut decisions, mut now, mut max_in_flight) = (Vec::new(), 0, 0);
    let annotations: BTreeMap<String, String> = sim.pool.annotations.iter().cloned().collect();
    let paused = rollout::paused(&annotations).0;
    // Each step but the first follows at least one pull's end: at most n + 1 steps.
    for _ in 0..=n {
        let request = request(sim, &annotations, &state, now);
        // A paused pool is not asked, as the controller does not ask it.
        let (grant, fallback) = if paused {
            (rollout::paused_grant(&request), false)
        } else {
            decide(&request)
        };
        let mut granted = Vec::new();
        for k in grant.nodes.iter().map(|&k| k as usize) {
            let Some(&i) = by_name.get(k) else {
                continue;
            };
            if state.granted[i].is_none() {
                state.granted[i] = Some(now);
                granted.push(sim.nodes[i].name.clone());
            }
        }
        let in_flight = state.in_flight(sim);
        max_in_flight = max_in_flight.max(in_flight);
        decisions.push(Decision {
            at_ms: now,
            granted,
            in_flight,
            reason: grant.reason,
            fallback,
        });
        let Some(end) = state.next_end(sim) else {
            break;
        };
        now = end + sim.react_ms;
        state.end_until(sim, now);
    }
    summary(sim, &state, decisions, max_in_flight)
}

fn summary(sim: &Simulation, state: &State, decisions: Vec<Decision>, max_in_flight: u32) -> Run {
    let nodes: Vec<NodeRun> = sim
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| NodeRun {
            name: node.name.clone(),
            granted_ms: state.granted[i],
            ended_ms: state.ended[i],
            outcome: state.phase(sim, i).as_str(),
        })
        .collect();
    let count = |outcome: &str| nodes.iter().filter(|r| r.outcome == outcome).count() as u32;
    let last_end = state.ended.iter().flatten().max().copied();
    let last_decision = decisions.last().map_or(0, |d| d.at_ms);
    let complete = count("done") as usize == nodes.len();
    Run {
        done: count("done"),
        failed: count("failed"),
        stalled: count("pulling"),
        waiting: count("waiting"),
        complete,
        complete_ms: last_end.filter(|_| complete),
        fallbacks: decisions.iter().filter(|d| d.fallback).count() as u32,
        end_ms: last_end.unwrap_or(0).max(last_decision),
        max_in_flight,
        nodes,
        decisions,
    }
}

/// What the controller would ask at `now`: each node as its MachineConfigNode would tell it,
/// through the controller's own [`rollout::request`] (phases, grants and progress derived by
/// the same rules); `annotations` are the pool's, read once per run.
fn request(
    sim: &Simulation,
    annotations: &BTreeMap<String, String>,
    state: &State,
    now: u64,
) -> RolloutRequest {
    let members: Vec<Member> = (0..sim.nodes.len())
        .map(|i| member(sim, i, state, now))
        .collect();
    rollout::request(
        &sim.pool.name,
        annotations,
        sim.pool.max_pulling,
        sim.target.clone(),
        &members,
        now,
    )
}

/// Node `i` as it reports itself at `now`: every set one generation behind the target until its
/// pull ends, then at it (or failed at it); progress the share of its pull time gone by.
fn member(sim: &Simulation, i: usize, state: &State, now: u64) -> Member {
    let (node, target) = (&sim.nodes[i], &sim.target);
    let phase = state.phase(sim, i);
    let share = |total: u64| match (phase, state.granted[i]) {
        (Phase::Done, _) => total,
        (Phase::Pulling, Some(start)) if node.pull_ms > 0 => {
            let ms = (now - start).min(node.pull_ms);
            (u128::from(total) * u128::from(ms) / u128::from(node.pull_ms)) as u64
        }
        _ => 0,
    };
    let failed = phase == Phase::Failed;
    let sets = target
        .sets
        .iter()
        .map(|s| {
            let status = SetStatus {
                name: s.name.clone(),
                desired_generation: s.generation,
                current_generation: Some(s.generation - i64::from(phase != Phase::Done)),
                last_failed_generation: failed.then_some(s.generation),
                last_failed_generation_error: failed
                    .then(|| format!("simulated: pulling set {} failed", s.name)),
            };
            (s.name.clone(), status)
        })
        .collect();
    Member {
        name: node.name.clone(),
        labels: node.labels.iter().cloned().collect(),
        ready: node.ready,
        grant: state.granted[i].map(|_| RolloutGrant::for_target(target, None)),
        sets,
        progress: Some(Progress {
            images_done: share(u64::from(target.images)),
            images_total: u64::from(target.images),
            bytes_done: share(target.bytes),
            bytes_total: target.bytes,
        }),
        progressing_since_ms: state.granted[i],
    }
}

/// The run as a timeline: one lane per node, its pull a bar from its grant to its end (red when
/// it failed; to the end of the run when it never finished).
pub fn timeline(run: &Run, title: String, notes: Vec<String>) -> Timeline {
    let nodes = run
        .nodes
        .iter()
        .map(|node| {
            let bar = node.granted_ms.map(|start_ms| NodeBar {
                start_ms,
                end_ms: node.ended_ms,
                failed: node.outcome == "failed",
            });
            (node.name.clone(), bar)
        })
        .collect();
    Timeline::of_nodes(title, notes, nodes, run.end_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_policy_default::DefaultFleet;
    use pinset_policy_sdk::{Fleet, MAX_PULLING_ANNOTATION, TargetSet};

    fn sim(nodes: usize, pull_ms: u64) -> Simulation {
        Simulation {
            pool: FleetPool {
                name: "worker".into(),
                ..Default::default()
            },
            target: Target {
                sets: vec![TargetSet {
                    name: "release".into(),
                    generation: 2,
                    images: 20,
                    bytes: 20 << 30,
                }],
                images: 20,
                bytes: 20 << 30,
            },
            nodes: (0..nodes)
                .map(|i| SimNode {
                    name: format!("w-{i:02}"),
                    ready: true,
                    pull_ms,
                    ..Default::default()
                })
                .collect(),
            react_ms: 100,
        }
    }

    fn default_fleet(request: &RolloutRequest) -> (Grant, bool) {
        (DefaultFleet.grant(&request.into()), false)
    }

    fn granting(run: &Run) -> Vec<(u64, Vec<String>)> {
        run.decisions
            .iter()
            .filter(|d| !d.granted.is_empty())
            .map(|d| (d.at_ms, d.granted.clone()))
            .collect()
    }

    #[test]
    fn the_default_grants_a_canary_then_one_node_per_finish_in_a_small_pool() {
        let run = run(&sim(10, 1000), default_fleet);
        assert!(run.complete, "{run:?}");
        let grants = granting(&run);
        assert_eq!(grants.len(), 10);
        // Node k is granted when node k - 1 has ended and the controller reacted.
        for (k, (at, names)) in grants.iter().enumerate() {
            assert_eq!(
                (*at, names.as_slice()),
                (1100 * k as u64, &[format!("w-{k:02}")][..])
            );
        }
        assert_eq!(run.complete_ms, Some(9 * 1100 + 1000));
        assert_eq!(run.max_in_flight, 1);
        assert_eq!(
            (run.done, run.failed, run.waiting, run.fallbacks),
            (10, 0, 0, 0)
        );
        let last = run.decisions.last().unwrap();
        assert!(
            last.granted.is_empty() && last.reason.contains("all 10"),
            "{last:?}"
        );
    }

    #[test]
    fn the_pool_annotation_widens_the_waves_and_bounds_them() {
        let mut s = sim(10, 1000);
        s.pool.annotations = vec![(MAX_PULLING_ANNOTATION.into(), "3".into())];
        s.pool.max_pulling = Some(3);
        let run = run(&s, default_fleet);
        assert!(run.complete);
        assert_eq!(run.max_in_flight, 3);
        let grants = granting(&run);
        assert_eq!(grants[0].1, ["w-00"], "the canary alone first");
        assert_eq!(
            grants[1],
            (1100, vec!["w-01".into(), "w-02".into(), "w-03".into()])
        );
        // 1 + 3 + 3 + 3 nodes: four rounds of 1.1 s.
        assert_eq!(run.complete_ms, Some(3 * 1100 + 1000));
    }

    #[test]
    fn a_failed_canary_holds_the_pool_and_the_run_ends() {
        let mut s = sim(5, 1000);
        s.nodes[0].fails = true;
        let run = run(&s, default_fleet);
        assert!(!run.complete && run.complete_ms.is_none());
        assert_eq!((run.done, run.failed, run.waiting), (0, 1, 4));
        assert_eq!(granting(&run), [(0, vec!["w-00".to_string()])]);
        assert_eq!(
            run.decisions.len(),
            2,
            "asked at the start and after the failure"
        );
        assert_eq!(run.end_ms, 1100);
        assert_eq!(run.nodes[0].outcome, "failed");
    }

    #[test]
    fn a_node_that_is_not_ready_is_passed_over_and_never_granted() {
        let mut s = sim(4, 500);
        s.nodes[0].ready = false;
        let run = run(&s, default_fleet);
        assert_eq!(
            granting(&run)[0].1,
            ["w-01"],
            "the first ready node is the canary"
        );
        assert_eq!((run.done, run.waiting, run.complete), (3, 1, false));
    }

    #[test]
    fn any_answer_ends_the_run_within_one_step_per_node() {
        // Everything at once, then nonsense: indices out of range and repeated.
        let run_all = run(&sim(50, 700), |r: &RolloutRequest| {
            (
                Grant::new((0..r.nodes.len() as u32).collect(), "all"),
                false,
            )
        });
        assert_eq!(run_all.max_in_flight, 50);
        assert_eq!(run_all.complete_ms, Some(700));
        let mut calls = 0;
        let nonsense = run(&sim(3, 700), |_: &RolloutRequest| {
            calls += 1;
            (Grant::new(vec![u32::MAX, 1, 1, 7], "nonsense"), true)
        });
        assert_eq!(granting(&nonsense), [(0, vec!["w-01".to_string()])]);
        assert_eq!(
            (nonsense.done, nonsense.waiting, nonsense.fallbacks),
            (1, 2, 2)
        );
        assert_eq!(calls, 2);
        // A node that is granted but never Ready does not keep the run going.
        let mut s = sim(2, 100);
        s.nodes[1].ready = false;
        let stalled = run(&s, |r: &RolloutRequest| {
            (
                Grant::new((0..r.nodes.len() as u32).collect(), "all"),
                false,
            )
        });
        assert_eq!((stalled.done, stalled.stalled), (1, 1));
        assert_eq!(stalled.nodes[1].outcome, "pulling");
    }

    #[test]
    fn the_policy_sees_progress_and_failures_as_the_controller_reports_them() {
        let mut s = sim(3, 1000);
        s.nodes[1].fails = true;
        s.react_ms = 0;
        let mut seen = Vec::new();
        run(&s, |r: &RolloutRequest| {
            seen.push(r.clone());
            (
                Grant::new((0..r.nodes.len() as u32).collect(), "all"),
                false,
            )
        });
        let first = &seen[0].nodes[0];
        assert_eq!((first.phase, first.granted), (Phase::Waiting, false));
        assert_eq!(first.sets[0].current_generation, Some(1));
        let last = &seen.last().unwrap().nodes;
        assert_eq!(
            (last[0].phase, last[0].progress.images_done),
            (Phase::Done, 20)
        );
        assert_eq!(last[0].sets[0].current_generation, Some(2));
        assert_eq!(last[1].phase, Phase::Failed);
        assert!(last[1].error().unwrap().contains("release"));
    }

    #[test]
    fn grants_name_nodes_in_the_order_the_policy_sees_them() {
        // Given out of name order: the policy's index 0 is the first by name, w-00.
        let mut s = sim(3, 1000);
        s.nodes.reverse();
        let run = run(&s, default_fleet);
        assert_eq!(granting(&run)[0], (0, vec!["w-00".to_string()]));
        assert!(run.complete);
    }

    #[test]
    fn the_timeline_has_a_lane_per_node_named_after_it() {
        let mut s = sim(3, 1000);
        s.nodes[0].fails = true;
        let run = run(&s, |r: &RolloutRequest| {
            (
                Grant::new((0..r.nodes.len() as u32).collect(), "all"),
                false,
            )
        });
        let t = timeline(&run, "rollout".into(), vec![]);
        assert_eq!(t.lane_names, ["w-00", "w-01", "w-02"]);
        assert_eq!(t.lanes[0][0].kind, crate::timeline::MarkKind::Failed);
        assert_eq!(t.lanes[1][0].kind, crate::timeline::MarkKind::Pull);
        let svg = crate::timeline::svg(&t);
        assert!(svg.contains(">w-02<title>w-02</title>"), "{svg}");
        // The legend names what the picture holds: pulls and a failure, no throttle or retry.
        assert!(
            svg.contains(">failed</text>") && !svg.contains("throttle pause"),
            "{svg}"
        );
    }

    #[test]
    fn a_paused_pool_grants_nothing_and_its_policy_is_not_asked() {
        let mut s = sim(4, 1000);
        s.pool.annotations = vec![(rollout::PAUSED_ANNOTATION.into(), "true".into())];
        let run = run(&s, |_: &RolloutRequest| -> (Grant, bool) {
            panic!("the policy of a paused pool was asked")
        });
        assert_eq!(
            (run.waiting, run.complete, run.decisions.len()),
            (4, false, 1)
        );
        assert!(
            run.decisions[0]
                .reason
                .starts_with("paused by pinset.io/rollout-paused"),
            "{:?}",
            run.decisions[0]
        );
    }

    /// A small deterministic generator (xorshift64*): the pools below are the same in every run.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    #[test]
    fn the_default_never_exceeds_its_wave_in_any_pool_and_finishes_what_can_finish() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..300 {
            let n = 1 + rng.below(60) as usize;
            let mut s = sim(n, 0);
            for node in &mut s.nodes {
                node.pull_ms = rng.below(5_000);
            }
            s.react_ms = rng.below(500);
            if rng.below(2) == 0 {
                let cap = 1 + rng.below(20) as u32;
                s.pool.annotations = vec![(MAX_PULLING_ANNOTATION.into(), cap.to_string())];
                s.pool.max_pulling = Some(cap);
            }
            let failing = (rng.below(4) == 0).then(|| rng.below(n as u64) as usize);
            if let Some(f) = failing {
                s.nodes[f].fails = true;
            }
            let wave = s.pool.max_pulling.unwrap_or((n as u32 / 10).max(1));
            let run = run(&s, default_fleet);
            let context = format!("case {case}: {n} nodes, wave {wave}, failing {failing:?}");
            assert!(run.max_in_flight <= wave, "{context}: {run:?}");
            assert!(run.decisions.len() <= n + 1, "{context}");
            let granted: Vec<String> = granting(&run).into_iter().flat_map(|(_, g)| g).collect();
            let once: std::collections::BTreeSet<&String> = granted.iter().collect();
            assert_eq!(once.len(), granted.len(), "{context}: a node granted twice");
            match failing {
                None => assert!(run.complete && run.done == n as u32, "{context}: {run:?}"),
                // The first node by name is the canary: its failure holds every other node.
                Some(0) => assert_eq!((run.failed, granted.len()), (1, 1), "{context}"),
                // A later failure keeps its slot: with one slot the nodes after it hold, with more
                // the rest finish around it.
                Some(f) if wave == 1 => {
                    assert_eq!((run.failed, run.done), (1, f as u32), "{context}")
                }
                Some(_) => assert_eq!((run.failed, run.done), (1, n as u32 - 1), "{context}"),
            }
        }
    }
}
