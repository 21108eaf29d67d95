//! Fleet rollout, with no Kubernetes in sight: where each node of a pool stands against the
//! pool's target, what the fleet policy is asked, what its grant changes, and — on the node —
//! which sets a node may pull under its grant.
//!
//! A grant is recorded per node as the sets and generations it may pull ([`RolloutGrant`]). A
//! node pulls a set only when its grant covers the set's generation; the images it already
//! holds are verified and pinned without one ([`gate()`]).

use crate::desired::{Desired, DesiredSet, Wanted};
use crate::status::{Progress, SetStatus};
use crate::timeline::{NodeBar, Timeline};
use pinset_policy_sdk::{
    FleetNode, FleetPool, Grant, MAX_PULLING_ANNOTATION, NodeProgress, Phase, RolloutRequest,
    SetState, Target, TargetSet, count_or_percent,
};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

mod gate;
mod grants;
mod pause;
mod policy_entry;
mod request;
mod standing;

pub use gate::*;
pub use grants::*;
pub use pause::*;
pub use policy_entry::*;
pub use request::*;
pub use standing::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_change_is_a_target_entry_done_where_it_runs_and_failed_where_refused() {
        let v2 = format!("oci://r.io/p@sha256:{}", "2".repeat(64));
        let v3 = format!("oci://r.io/p@sha256:{}", "3".repeat(64));
        assert_eq!(policy_set(&v2), format!("policy@sha256:{}", "2".repeat(64)));
        assert_eq!(policy_set("/p/a.wasm"), "policy@/p/a.wasm");
        assert_eq!(policy_set(&"x".repeat(400)).len(), 253);
        let target = target(&[("apps".into(), 1, 2), (policy_set(&v3), 1, 0)]);
        let at_v2 = |rejected: Option<(&str, &str)>| {
            let mut sets = BTreeMap::new();
            sets.insert(
                "apps".to_string(),
                SetStatus {
                    name: "apps".into(),
                    desired_generation: 1,
                    current_generation: Some(1),
                    ..Default::default()
                },
            );
            add_policy_states(&mut sets, Some(&v2), rejected);
            Member {
                name: "n".into(),
                sets,
                grant: Some(RolloutGrant::for_target(&target, None)),
                ..Default::default()
            }
        };
        assert_eq!(
            phase(&at_v2(None), &target),
            Phase::Pulling,
            "granted, not swapped"
        );
        let refused = at_v2(Some((&v3, "order: trap")));
        assert_eq!(phase(&refused, &target), Phase::Failed);
        let error = &refused.sets[&policy_set(&v3)].last_failed_generation_error;
        assert!(
            error.as_deref().unwrap().contains("sha256:333"),
            "{error:?}"
        );
        let mut swapped = at_v2(None);
        add_policy_states(&mut swapped.sets, Some(&v3), None);
        assert_eq!(phase(&swapped, &target), Phase::Done);
        let grant = RolloutGrant::for_target(&target, Some(2));
        assert_eq!(sets_only(&grant).sets.keys().collect::<Vec<_>>(), ["apps"]);
    }
    use crate::reference::ImageRef;
    use crate::timeline::MarkKind;

    fn set(name: &str, generation: i64, current: Option<i64>, failed: Option<i64>) -> SetStatus {
        SetStatus {
            name: name.into(),
            desired_generation: generation,
            current_generation: current,
            last_failed_generation: failed,
            last_failed_generation_error: failed.map(|_| "image x: not found".into()),
        }
    }

    fn member(name: &str, sets: Vec<SetStatus>, grant: Option<&[(&str, i64)]>) -> Member {
        Member {
            name: name.into(),
            ready: true,
            grant: grant.map(|g| RolloutGrant {
                sets: g.iter().map(|(n, g)| (n.to_string(), *g)).collect(),
                max_pulls: None,
            }),
            sets: sets.into_iter().map(|s| (s.name.clone(), s)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn phases_against_the_target() {
        let t = target(&[("a".into(), 2, 3), ("b".into(), 1, 1)]);
        assert_eq!(t.images, 4);
        let done = member(
            "d",
            vec![set("a", 2, Some(2), None), set("b", 1, Some(1), None)],
            None,
        );
        assert_eq!(phase(&done, &t), Phase::Done);
        let old = member(
            "w",
            vec![set("a", 2, Some(1), None)],
            Some(&[("a", 1), ("b", 1)]),
        );
        assert_eq!(
            phase(&old, &t),
            Phase::Waiting,
            "a grant of an older generation"
        );
        let pulling = member("p", vec![], Some(&[("a", 2), ("b", 1)]));
        assert_eq!(phase(&pulling, &t), Phase::Pulling);
        let failed = member(
            "f",
            vec![set("a", 2, Some(1), Some(2))],
            Some(&[("a", 2), ("b", 1)]),
        );
        assert_eq!(phase(&failed, &t), Phase::Failed);
        let recovered = member(
            "r",
            vec![set("a", 2, Some(2), Some(1)), set("b", 1, Some(1), None)],
            None,
        );
        assert_eq!(
            phase(&recovered, &t),
            Phase::Done,
            "an old failure is history"
        );
    }

    #[test]
    fn the_request_sorts_nodes_counts_them_and_fingerprints_ignore_progress() {
        let t = target(&[("a".into(), 1, 2)]);
        let mut members = vec![
            member("z", vec![], Some(&[("a", 1)])),
            member("b", vec![set("a", 1, Some(1), None)], None),
            member("m", vec![], None),
        ];
        members[0].progressing_since_ms = Some(1_000);
        let r = request("worker", &BTreeMap::new(), None, t.clone(), &members, 4_000);
        let names: Vec<&str> = r.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, vec!["b", "m", "z"]);
        assert_eq!(r.nodes[2].progress.pulling_for_ms, Some(3_000));
        let c = counts(&r);
        assert_eq!(
            (c.granted, c.pulling, c.done, c.failed, c.waiting),
            (1, 1, 1, 0, 1)
        );
        assert_eq!(
            newly_granted(&r, &[0, 1, 2, 1]),
            vec![1],
            "done and granted nodes are not re-granted"
        );

        let mut moved = members.clone();
        moved[0].progress = Some(Progress {
            images_done: 1,
            ..Default::default()
        });
        let again = request("worker", &BTreeMap::new(), None, t.clone(), &moved, 9_000);
        assert_eq!(fingerprint(&r), fingerprint(&again));
        moved[2].ready = false;
        let changed = request("worker", &BTreeMap::new(), None, t, &moved, 9_000);
        assert_ne!(fingerprint(&r), fingerprint(&changed));
    }

    /// One pool's nodes in the states a ceiling must count, by name: `(ready, granted, phase)`.
    fn pool_of(max_pulling: u32, nodes: &[(bool, bool, Phase)]) -> RolloutRequest {
        RolloutRequest {
            pool: FleetPool {
                name: "worker".into(),
                max_pulling: Some(max_pulling),
                ..Default::default()
            },
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(i, &(ready, granted, phase))| FleetNode {
                    name: format!("n{i}"),
                    ready,
                    granted,
                    phase,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_ceiling_counts_every_node_an_answer_adds_whatever_its_state() {
        use Phase::*;
        // Not Ready, failed without a grant, pulling without a grant, waiting: all four are
        // written a grant when named, so all four count.
        let r = pool_of(
            2,
            &[
                (false, false, Waiting),
                (true, false, Failed),
                (true, false, Pulling),
                (true, false, Waiting),
                (true, false, Done),
            ],
        );
        assert_eq!(over_ceiling(&r, &[0, 1, 2, 3]), Some((4, 2)));
        assert_eq!(over_ceiling(&r, &[0, 1, 2]), Some((3, 2)));
        assert_eq!(over_ceiling(&r, &[0, 1]), None);
        // A node at the target is not granted: naming it adds nobody.
        assert_eq!(over_ceiling(&r, &[4, 3, 2, 1]), Some((3, 2)));
        assert_eq!(over_ceiling(&r, &[4, 3, 2]), None);
    }

    #[test]
    fn an_answer_that_adds_nobody_is_never_over_the_ceiling() {
        use Phase::*;
        // A ceiling of 3 lowered to 1 with three granted nodes pulling: over it, and waiting.
        let r = pool_of(
            1,
            &[
                (true, true, Pulling),
                (true, true, Pulling),
                (true, true, Failed),
                (true, false, Waiting),
            ],
        );
        assert_eq!(over_ceiling(&r, &[]), None);
        assert_eq!(
            over_ceiling(&r, &[0, 1]),
            None,
            "granted already: adds nobody"
        );
        assert_eq!(over_ceiling(&r, &[3]), Some((4, 1)));
        // A granted node that is not Ready frees its slot; a done one holds none.
        let r = pool_of(
            2,
            &[
                (false, true, Pulling),
                (true, true, Done),
                (true, false, Waiting),
            ],
        );
        assert_eq!(over_ceiling(&r, &[2]), None);
    }

    #[test]
    fn grants_written_count_until_the_cache_shows_them() {
        let t = target(&[("a".into(), 2, 1)]);
        let grant = |generation| RolloutGrant {
            sets: [("a".to_string(), generation)].into(),
            max_pulls: None,
        };
        let written = |generation, at_ms| Written {
            grant: grant(generation),
            at_ms,
        };
        // The cache still shows b with last generation's grant, c with none, e with the new
        // one; d left the pool; f's grant was written long ago and never showed up.
        let mut members = vec![
            member("b", vec![], Some(&[("a", 1)])),
            member("c", vec![], None),
            member("e", vec![], Some(&[("a", 2)])),
            member("f", vec![], None),
        ];
        let mut memory: BTreeMap<String, Written> = [
            ("b".to_string(), written(2, 100_000)),
            ("d".to_string(), written(2, 100_000)),
            ("e".to_string(), written(2, 100_000)),
            ("f".to_string(), written(2, 100_000 - WRITTEN_TTL_MS)),
        ]
        .into();
        overlay_written(&mut members, &mut memory, 100_500);
        assert_eq!(members[0].grant, Some(grant(2)), "b counts as granted");
        assert_eq!(phase(&members[0], &t), Phase::Pulling);
        assert_eq!(members[1].grant, None, "c was never granted");
        assert_eq!(
            members[3].grant, None,
            "f's grant was lost: the cache is right"
        );
        assert_eq!(
            memory.keys().collect::<Vec<_>>(),
            vec!["b"],
            "e is seen, d is gone, f expired: only b still waits for the cache"
        );
        // The cache catches up: nothing is left to overlay.
        members[0].grant = Some(grant(2));
        overlay_written(&mut members, &mut memory, 100_600);
        assert!(memory.is_empty());
    }

    #[test]
    fn a_pool_holds_by_the_policy_s_word() {
        assert_eq!(held(&Grant::none("waiting")), None);
        assert_eq!(
            held(&Grant::hold("canary node c failed: image x: not found")).as_deref(),
            Some("the rollout holds: canary node c failed: image x: not found")
        );
    }

    #[test]
    fn the_ceiling_annotation() {
        let a = |v: &str| BTreeMap::from([(MAX_PULLING_ANNOTATION.to_string(), v.to_string())]);
        assert_eq!(max_pulling(&BTreeMap::new(), 10), Ok(None));
        assert_eq!(max_pulling(&a("2"), 10), Ok(Some(2)));
        assert_eq!(max_pulling(&a("50%"), 10), Ok(Some(5)));
        let err = max_pulling(&a("lots"), 10).unwrap_err();
        assert!(err.contains("\"lots\""), "{err}");
    }

    #[test]
    fn the_pause_annotation_stops_grants_and_a_bad_value_pauses() {
        let a = |v: &str| BTreeMap::from([(PAUSED_ANNOTATION.to_string(), v.to_string())]);
        assert_eq!(paused(&BTreeMap::new()), (false, None));
        assert_eq!(paused(&a("false")), (false, None));
        assert_eq!(paused(&a(" true ")), (true, None));
        let (p, why) = paused(&a("yes"));
        assert!(p && why.as_deref().unwrap().contains("\"yes\""), "{why:?}");
        let t = target(&[("a".into(), 2, 3)]);
        let members = vec![
            member("a", vec![set("a", 2, Some(2), None)], Some(&[("a", 2)])),
            member("b", vec![set("a", 2, Some(1), None)], Some(&[("a", 2)])),
            member("c", vec![set("a", 2, Some(1), None)], None),
        ];
        let r = request("worker", &a("true"), None, t, &members, 0);
        let g = paused_grant(&r);
        assert!(g.nodes.is_empty());
        assert!(
            g.reason
                .contains("1 granted node(s) still pulling go on, 1 wait, 1/3 at the target"),
            "{}",
            g.reason
        );
    }

    fn digest(n: u8) -> ImageRef {
        ImageRef::parse(&format!("q.io/x@sha256:{}", format!("{n:02x}").repeat(32))).unwrap()
    }

    #[test]
    fn the_gate_holds_ungranted_sets_that_miss_images_and_keeps_present_ones() {
        let wanted = |n: u8, sets: &[&str]| Wanted {
            reference: digest(n),
            sets: sets.iter().map(|s| s.to_string()).collect(),
        };
        let desired = Desired {
            pools: vec!["worker".into()],
            sets: vec![
                DesiredSet {
                    name: "granted".into(),
                    generation: 2,
                    images: vec![0, 1],
                },
                DesiredSet {
                    name: "present".into(),
                    generation: 5,
                    images: vec![1],
                },
                DesiredSet {
                    name: "held".into(),
                    generation: 3,
                    images: vec![1, 2],
                },
            ],
            images: vec![
                wanted(0, &["granted"]),
                wanted(1, &["granted", "present", "held"]),
                wanted(2, &["held"]),
            ],
            grant: Some(RolloutGrant {
                sets: BTreeMap::from([("granted".into(), 2), ("held".into(), 2)]),
                max_pulls: None,
            }),
            ..Default::default()
        };
        let gated = gate(&desired, &[false, true, false]);
        let names: Vec<&str> = gated.sets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["granted", "present"]);
        assert_eq!(gated.waiting, vec![("held".to_string(), 3)]);
        assert_eq!(gated.images.len(), 2, "image 2 is only the held set's");
        assert_eq!(gated.images[1].sets, vec!["granted", "present"]);
        assert_eq!(gated.sets[1].images, vec![1]);
        let open = Desired {
            grant: None,
            ..desired
        };
        assert_eq!(gate(&open, &[false; 3]), open);
        assert!(waiting_message(&gated.waiting).contains("held generation 3"));
    }

    #[test]
    fn where_a_rollout_stands() {
        let t = target(&[("b".into(), 3, 1), ("a".into(), 2, 1)]);
        assert_eq!(target_label(&t), "a@2,b@3");
        assert_eq!(target_label(&target(&[])), "");
        let c = |pulling, done, failed, waiting| Counts {
            granted: pulling + done + failed,
            pulling,
            done,
            failed,
            waiting,
        };
        let degraded = Some("canary n0 failed");
        assert_eq!(
            standing(&c(0, 3, 0, 0), true, degraded),
            Standing::Degraded("canary n0 failed".into()),
            "every node at the target, and the pool says something is wrong"
        );
        assert_eq!(standing(&c(0, 3, 0, 0), true, None), Standing::Complete);
        assert_eq!(
            standing(&c(0, 0, 0, 0), false, None),
            Standing::Complete,
            "a pool without nodes has nothing left to pull"
        );
        assert_eq!(
            standing(&c(0, 0, 1, 2), true, degraded),
            Standing::Degraded("canary n0 failed".into())
        );
        assert_eq!(standing(&c(1, 0, 0, 2), true, None), Standing::Paused);
        assert_eq!(
            standing(&c(0, 0, 1, 2), false, None),
            Standing::Progressing,
            "a failure the pool's status does not name yet"
        );
        assert_eq!(standing(&c(1, 1, 0, 1), false, None).name(), "Progressing");
    }

    #[test]
    fn a_watched_rollout_as_a_timeline() {
        let mut w = Watched::default();
        let (wait, pull, done, fail) = (Phase::Waiting, Phase::Pulling, Phase::Done, Phase::Failed);
        // Each look: when, then a, b, c and old as (granted, phase).
        #[rustfmt::skip]
        let looks = [
            (0, [(true, pull), (false, wait), (false, wait), (false, done)]),
            (100, [(true, done), (true, pull), (false, wait), (false, done)]),
            (250, [(true, done), (true, fail), (false, done), (false, done)]),
            (400, [(true, done), (true, fail), (false, done), (false, done)]),
        ];
        for (at_ms, nodes) in looks {
            let named = ["a", "b", "c", "old"].into_iter().zip(nodes);
            w.observe(
                at_ms,
                named.map(|(n, (granted, phase))| (n, granted, phase)),
            );
        }
        let t = w.timeline("t".into(), vec![], 500);
        assert_eq!(t.lane_names, ["a", "b", "c", "old"]);
        let bars: Vec<Option<(MarkKind, f64, f64)>> = t
            .lanes
            .iter()
            .map(|l| l.first().map(|m| (m.kind, m.start_ms, m.end_ms)))
            .collect();
        assert_eq!(
            bars,
            [
                Some((MarkKind::Pull, 0.0, 100.0)),
                Some((MarkKind::Failed, 100.0, 250.0)),
                Some((MarkKind::Pull, 250.0, 250.0)),
                None,
            ],
            "c got there between two looks; old was there before"
        );
        // A node that fails and then pins the target on a retry ends as a pull.
        w.observe(450, [("b", true, done)]);
        let t = w.timeline("t".into(), vec![], 500);
        assert_eq!(t.lanes[1][0].kind, MarkKind::Pull);
        assert_eq!(
            (t.lanes[1][0].start_ms, t.lanes[1][0].end_ms),
            (100.0, 450.0)
        );
    }
}
