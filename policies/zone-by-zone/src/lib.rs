//! Example fleet rollout policy: a canary, then one availability zone at a time.
//!
//! | state of the pool                       | grant                                               |
//! |-----------------------------------------|-----------------------------------------------------|
//! | no granted node has reached the target  | the default policy's canary (one node; a failed     |
//! |                                         | canary holds the pool)                              |
//! | after the canary                        | every ready waiting node of the first zone (by      |
//! |                                         | `topology.kubernetes.io/zone`, sorted) that is not  |
//! |                                         | done, up to the pool's ceiling                      |
//! | a node of that zone failed              | nothing more: the next zone waits for this one      |
//!
//! Nodes without a zone label form the zone `""`, which comes first. A zone outage then costs
//! one zone's pulls, never the whole pool's at once. This module exports only the fleet
//! interface (`pinset:fleet/rollout`); nodes keep their own pull policy.

use pinset_policy_sdk::reference::fleet as reference;
use pinset_policy_sdk::*;

pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

#[derive(Clone, Copy, Debug, Default)]
pub struct ZoneByZone;

/// The node's zone; `""` without the label.
fn zone<'a>(n: &Node<'a>) -> &'a str {
    n.label(ZONE_LABEL).unwrap_or("")
}

impl Fleet for ZoneByZone {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new(
            "zone-by-zone",
            env!("CARGO_PKG_VERSION"),
            "a canary, then one availability zone at a time (topology.kubernetes.io/zone)",
        )
    }

    fn grant(&self, rollout: &Rollout) -> Grant {
        let proven = rollout
            .nodes
            .iter()
            .any(|n| n.granted && n.phase == Phase::Done);
        if !proven {
            return reference::grant(rollout);
        }
        let mut zones: Vec<&str> = rollout
            .nodes
            .iter()
            .filter(|n| n.phase != Phase::Done)
            .map(|n| zone(&n))
            .collect();
        zones.sort();
        zones.dedup();
        let Some(&current) = zones.first() else {
            return Grant::none("every zone at the target");
        };
        let members = || rollout.nodes.iter().filter(move |n| zone(n) == current);
        if let Some(failed) = members().find(|n| n.phase == Phase::Failed) {
            return Grant::none(format!(
                "zone {current:?}: node {} failed ({}); the next zones wait",
                failed.name,
                failed.error().unwrap_or("see its MachineConfigNode")
            ));
        }
        let in_flight = rollout.nodes.iter().filter(|n| n.in_flight()).count() as u32;
        let room = rollout
            .pool
            .max_pulling
            .map_or(u32::MAX, |m| m.saturating_sub(in_flight));
        let add: Vec<u32> = rollout
            .candidates()
            .filter(|&i| {
                rollout
                    .nodes
                    .get(i as usize)
                    .is_some_and(|n| zone(&n) == current)
            })
            .take(room as usize)
            .collect();
        let left = zones.len() - 1;
        Grant::new(
            add.clone(),
            format!(
                "zone {current:?}: granting {} node(s); {left} zone(s) after it",
                add.len()
            ),
        )
    }
}

#[cfg(feature = "export")]
export_fleet!(ZoneByZone);

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, zone: &str, granted: bool, phase: Phase) -> FleetNode {
        FleetNode {
            name: name.into(),
            labels: vec![(ZONE_LABEL.into(), zone.into())],
            ready: true,
            granted,
            phase,
            ..Default::default()
        }
    }

    #[test]
    fn canary_then_a_whole_zone_then_the_next() {
        let mut r = RolloutRequest {
            nodes: vec![
                node("a1", "a", false, Phase::Waiting),
                node("a2", "a", false, Phase::Waiting),
                node("b1", "b", false, Phase::Waiting),
                node("b2", "b", false, Phase::Waiting),
            ],
            ..Default::default()
        };
        assert_eq!(ZoneByZone.grant(&(&r).into()).nodes, vec![0], "the canary");
        r.nodes[0].granted = true;
        r.nodes[0].phase = Phase::Done;
        assert_eq!(
            ZoneByZone.grant(&(&r).into()).nodes,
            vec![1],
            "the rest of zone a"
        );
        r.nodes[1].granted = true;
        r.nodes[1].phase = Phase::Failed;
        let g = ZoneByZone.grant(&(&r).into());
        assert!(
            g.nodes.is_empty() && g.reason.contains("next zones wait"),
            "{}",
            g.reason
        );
        r.nodes[1].phase = Phase::Done;
        assert_eq!(
            ZoneByZone.grant(&(&r).into()).nodes,
            vec![2, 3],
            "zone b at once"
        );
        r.pool.max_pulling = Some(1);
        assert_eq!(
            ZoneByZone.grant(&(&r).into()).nodes,
            vec![2],
            "within the ceiling"
        );
    }
}
