//! Smallest images first, with a concurrency table per node role.
//!
//! Small images finish early, so most of a set is usable soon even when a few large images take
//! long. Admission is the reference's. Concurrency comes from the node's role labels; the throttle
//! is short on workers and longer on control-plane nodes.

use pinset_policy_sdk::*;

/// Pulls at once by role, first match wins; control-plane nodes are matched before this table.
pub const ROLE_CONCURRENCY: [(&str, u32); 3] = [("infra", 2), ("storage", 2), ("gpu", 3)];
pub const CONTROL_PLANE_CONCURRENCY: u32 = 1;
pub const OTHER_CONCURRENCY: u32 = 6;
pub const CONTROL_PLANE_THROTTLE_MS: u64 = 500;
pub const WORKER_THROTTLE_MS: u64 = 100;

#[derive(Default)]
pub struct SmallestFirst;

impl Policy for SmallestFirst {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new(
            "smallest-first",
            env!("CARGO_PKG_VERSION"),
            "smallest images first (unknown sizes last); concurrency by node role",
        )
    }

    fn order(&self, _node: &NodeFacts, images: &Images) -> Vec<u32> {
        let mut order = identity_order(images);
        // Stable: equal sizes keep the sets' order. Unknown sizes go last.
        order.sort_by_key(|&i| {
            images
                .get(i as usize)
                .and_then(|i| i.size_bytes)
                .unwrap_or(u64::MAX)
        });
        order
    }

    fn concurrency(&self, node: &NodeFacts) -> u32 {
        if node.control_plane {
            return CONTROL_PLANE_CONCURRENCY;
        }
        ROLE_CONCURRENCY
            .iter()
            .find(|(role, _)| node.has_role(role))
            .map_or(OTHER_CONCURRENCY, |&(_, n)| n)
    }

    fn throttle(&self, node: &NodeFacts, _outcome: &PullOutcome, _pressure: &Pressure) -> u64 {
        node.by_role(CONTROL_PLANE_THROTTLE_MS, WORKER_THROTTLE_MS)
    }
}

export_policy!(SmallestFirst);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_size_with_unknown_last_and_stable_ties() {
        let mut images = Images::new();
        for (i, size) in [Some(30), None, Some(10), Some(30), Some(5)]
            .into_iter()
            .enumerate()
        {
            images.push(&format!("img{i}"), ["s"], false, size, &[]);
        }
        assert_eq!(
            SmallestFirst.order(&NodeFacts::default(), &images),
            vec![4, 2, 0, 3, 1]
        );
    }

    #[test]
    fn concurrency_by_role() {
        let with_role = |role: &str| NodeFacts {
            labels: vec![(format!("{ROLE_LABEL_PREFIX}{role}"), String::new())],
            control_plane: role == "master",
            ..Default::default()
        };
        assert_eq!(SmallestFirst.concurrency(&with_role("master")), 1);
        assert_eq!(SmallestFirst.concurrency(&with_role("infra")), 2);
        assert_eq!(SmallestFirst.concurrency(&with_role("gpu")), 3);
        assert_eq!(SmallestFirst.concurrency(&with_role("worker")), 6);
    }
}
