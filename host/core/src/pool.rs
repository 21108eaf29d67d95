//! The controller's decisions for one pool, with no Kubernetes in sight: which PinnedImageSets the
//! pool selects, and how far the pool's nodes are with them.

use super::desired::{PinnedImageSet, Pool};
use super::status::SetStatus;
use std::collections::BTreeMap;

/// At most this many sets per pool (`spec.pinnedImageSets` is bounded in the API).
pub const MAX_SETS_PER_POOL: usize = 100;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error(
        "MachineConfigPool {pool}: its machineConfigSelector selects {count} PinnedImageSets, more than the {max} a pool may hold; narrow the selector or merge sets"
    )]
    TooManySets {
        pool: String,
        count: usize,
        max: usize,
    },
}

/// The sets `pool` selects by its `machineConfigSelector`, sorted by name. `Ok(None)` when the
/// selector is empty: such a pool is skipped (its `spec.pinnedImageSets` is left alone).
pub fn select_sets(pool: &Pool, sets: &[PinnedImageSet]) -> Result<Option<Vec<String>>, PoolError> {
    select_labelled(pool, sets.iter().map(|s| (s.name.as_str(), &s.labels)))
}

/// [`select_sets`] over (name, labels) pairs: selection needs nothing else of a set.
pub fn select_labelled<'a>(
    pool: &Pool,
    sets: impl IntoIterator<Item = (&'a str, &'a BTreeMap<String, String>)>,
) -> Result<Option<Vec<String>>, PoolError> {
    if pool.machine_config_selector.is_empty() {
        return Ok(None);
    }
    let mut names: Vec<String> = sets
        .into_iter()
        .filter(|(_, labels)| pool.machine_config_selector.matches(labels))
        .map(|(name, _)| name.to_string())
        .collect();
    names.sort();
    names.dedup();
    if names.len() > MAX_SETS_PER_POOL {
        return Err(PoolError::TooManySets {
            pool: pool.name.clone(),
            count: names.len(),
            max: MAX_SETS_PER_POOL,
        });
    }
    Ok(Some(names))
}

/// What one node reports (its MachineConfigNode), as the controller needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeReport {
    pub name: String,
    /// The node's primary pool.
    pub pool: String,
    pub sets: BTreeMap<String, SetStatus>,
    /// The message of its PinnedImageSetsDegraded condition when True.
    pub degraded: Option<String>,
    /// Why its pool's policy module was refused, when it was (it decides with the default).
    pub policy_refused: Option<String>,
    /// The node policy module it decides with, and the one it last refused to swap to.
    pub policy: Option<crate::status::RunningPolicy>,
    pub policy_rejected: Option<crate::status::RejectedPolicy>,
}

/// How many nodes of a pool run one node policy module.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyCount {
    /// `sha256:<hex>` of the module's bytes.
    pub digest: String,
    /// The module as the nodes name it (a file, `oci://…`, or the embedded default).
    pub module: String,
    /// What the module says it is.
    pub name: String,
    pub version: String,
    pub nodes: u32,
}

/// The node policy modules the nodes of `pool` run, most nodes first (then by digest); nodes
/// that have not said are not counted.
pub fn policy_counts(pool: &str, nodes: &[NodeReport]) -> Vec<PolicyCount> {
    let mut counts: BTreeMap<&str, PolicyCount> = BTreeMap::new();
    for p in nodes
        .iter()
        .filter(|n| n.pool == pool)
        .filter_map(|n| n.policy.as_ref())
    {
        counts
            .entry(p.digest.as_str())
            .or_insert_with(|| PolicyCount {
                digest: p.digest.clone(),
                module: p.module.clone(),
                name: p.name.clone(),
                version: p.version.clone(),
                nodes: 0,
            })
            .nodes += 1;
    }
    let mut out: Vec<PolicyCount> = counts.into_values().collect();
    out.sort_by(|a, b| b.nodes.cmp(&a.nodes).then_with(|| a.digest.cmp(&b.digest)));
    out
}

/// The nodes of `pool` that refused the pool's policy module, one line each; `None` when none
/// did.
pub fn policy_refusals(pool: &str, nodes: &[NodeReport]) -> Option<String> {
    let mut lines: Vec<String> = nodes
        .iter()
        .filter(|n| n.pool == pool)
        .filter_map(|n| Some(format!("node {}: {}", n.name, n.policy_refused.as_ref()?)))
        .collect();
    lines.sort();
    (!lines.is_empty()).then(|| crate::status::cap(&lines.join(" | "), MAX_MESSAGE))
}

/// The pool's PinnedImageSets synchronizer: node counts and, when nodes failed, a message naming
/// the nodes and the sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSync {
    pub machine_count: i64,
    pub updated_machine_count: i64,
    pub ready_machine_count: i64,
    pub available_machine_count: i64,
    pub unavailable_machine_count: i64,
    pub degraded: Option<String>,
}

/// Longest pool Degraded message; the nodes' own status holds the full errors.
const MAX_MESSAGE: usize = 4096;

/// Counts for `pool` whose sets are `wanted` (name and current generation of each set object):
/// a node is updated when every wanted set is at that generation on it; unavailable when it is
/// degraded. Nodes of other pools are ignored.
pub fn sync_status(pool: &str, wanted: &[(String, i64)], nodes: &[NodeReport]) -> PoolSync {
    let mut out = PoolSync::default();
    let mut failures: Vec<String> = Vec::new();
    let mut members: Vec<&NodeReport> = nodes.iter().filter(|n| n.pool == pool).collect();
    members.sort_by(|a, b| a.name.cmp(&b.name));
    for node in members {
        out.machine_count += 1;
        let updated = wanted.iter().all(|(set, generation)| {
            node.sets
                .get(set)
                .is_some_and(|s| s.current_generation == Some(*generation))
        });
        if updated {
            out.updated_machine_count += 1;
        }
        if node.degraded.is_some() {
            out.unavailable_machine_count += 1;
            let failed: Vec<String> = node
                .sets
                .values()
                .filter(|s| {
                    s.last_failed_generation.is_some()
                        && s.last_failed_generation >= s.current_generation
                })
                .map(|s| match &s.last_failed_generation_error {
                    Some(e) => format!("PinnedImageSet {}: {e}", s.name),
                    None => format!("PinnedImageSet {}", s.name),
                })
                .collect();
            let why = if failed.is_empty() {
                node.degraded.clone().unwrap_or_default()
            } else {
                failed.join("; ")
            };
            failures.push(format!("node {}: {why}", node.name));
        } else if updated {
            out.ready_machine_count += 1;
        }
    }
    out.available_machine_count = out.ready_machine_count;
    if !failures.is_empty() {
        let msg = format!(
            "{} of {} node(s) failed to pin the pool's images: {}",
            failures.len(),
            out.machine_count,
            failures.join(" | ")
        );
        out.degraded = Some(crate::status::cap(&msg, MAX_MESSAGE));
    }
    out
}

/// The pools whose selection holds `set`, sorted (for the set's status).
pub fn pools_of_set<'a>(
    set: &str,
    selections: impl IntoIterator<Item = (&'a str, &'a [String])>,
) -> Vec<String> {
    let mut out: Vec<String> = selections
        .into_iter()
        .filter(|(_, names)| names.iter().any(|n| n == set))
        .map(|(pool, _)| pool.to_string())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{infra_pool, standard_pools};
    use crate::selector::LabelSelector;

    fn set(name: &str, role: &str) -> PinnedImageSet {
        PinnedImageSet::for_role(name, role, &[])
    }

    #[test]
    fn pools_select_their_sets_sorted_and_custom_pools_get_the_worker_sets() {
        let sets = vec![
            set("w2", "worker"),
            set("m", "master"),
            set("w1", "worker"),
            set("i", "infra"),
        ];
        let pools = standard_pools();
        assert_eq!(
            select_sets(&pools[0], &sets).unwrap(),
            Some(vec!["m".to_string()])
        );
        assert_eq!(
            select_sets(&pools[1], &sets).unwrap(),
            Some(vec!["w1".to_string(), "w2".to_string()])
        );
        assert_eq!(
            select_sets(&infra_pool(), &sets).unwrap(),
            Some(vec!["i".to_string(), "w1".to_string(), "w2".to_string()])
        );
        // No set matches: an empty selection (the controller clears the field).
        assert_eq!(
            select_sets(&pools[1], &[set("m", "master")]).unwrap(),
            Some(vec![])
        );
    }

    #[test]
    fn an_empty_selector_skips_the_pool() {
        let mut pool = infra_pool();
        pool.machine_config_selector = LabelSelector::default();
        assert_eq!(select_sets(&pool, &[set("w", "worker")]).unwrap(), None);
    }

    #[test]
    fn too_many_sets_is_an_error_naming_the_pool() {
        let sets: Vec<PinnedImageSet> = (0..101)
            .map(|i| set(&format!("s{i:03}"), "worker"))
            .collect();
        let err = select_sets(&standard_pools()[1], &sets).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("MachineConfigPool worker") && msg.contains("101"),
            "{msg}"
        );
        assert!(select_sets(&standard_pools()[1], &sets[..100]).is_ok());
    }

    /// (set, desired, current, last failure (generation, error)).
    type Row<'a> = (&'a str, i64, Option<i64>, Option<(i64, &'a str)>);

    fn node(name: &str, pool: &str, sets: &[Row]) -> NodeReport {
        NodeReport {
            name: name.into(),
            pool: pool.into(),
            sets: sets
                .iter()
                .map(|(n, desired, current, failed)| {
                    (
                        n.to_string(),
                        SetStatus {
                            name: n.to_string(),
                            desired_generation: *desired,
                            current_generation: *current,
                            last_failed_generation: failed.map(|f| f.0),
                            last_failed_generation_error: failed.map(|f| f.1.to_string()),
                        },
                    )
                })
                .collect(),
            degraded: sets
                .iter()
                .any(|s| s.3.is_some_and(|(g, _)| Some(g) >= s.2))
                .then(|| "failed".to_string()),
            policy_refused: None,
            policy: None,
            policy_rejected: None,
        }
    }

    #[test]
    fn policy_counts_group_the_pools_nodes_by_digest() {
        let running = |digest: &str| crate::status::RunningPolicy {
            digest: digest.into(),
            module: format!("oci://r/p@{digest}"),
            ..Default::default()
        };
        let mut nodes: Vec<NodeReport> = ["w-1", "w-2", "w-3", "w-4"]
            .iter()
            .map(|n| node(n, "worker", &[]))
            .collect();
        nodes[0].policy = Some(running("sha256:b"));
        nodes[1].policy = Some(running("sha256:a"));
        nodes[2].policy = Some(running("sha256:b"));
        let mut other = node("i-1", "infra", &[]);
        other.policy = Some(running("sha256:a"));
        nodes.push(other);
        let counts: Vec<(String, u32)> = policy_counts("worker", &nodes)
            .into_iter()
            .map(|c| (c.digest, c.nodes))
            .collect();
        assert_eq!(counts, [("sha256:b".into(), 2), ("sha256:a".into(), 1)]);
        assert!(policy_counts("master", &nodes).is_empty());
    }

    #[test]
    fn refusals_name_the_nodes_of_the_pool_only() {
        let mut a = node("w-2", "worker", &[]);
        a.policy_refused = Some("policy of pool worker: no cosign signature".into());
        let mut b = node("w-1", "worker", &[]);
        b.policy_refused = Some("policy of pool worker: no cosign signature".into());
        let mut other = node("i-1", "infra", &[]);
        other.policy_refused = Some("elsewhere".into());
        let nodes = [a, b, other, node("w-3", "worker", &[])];
        assert_eq!(
            policy_refusals("worker", &nodes).unwrap(),
            "node w-1: policy of pool worker: no cosign signature | node w-2: policy of pool worker: no cosign signature"
        );
        assert_eq!(policy_refusals("master", &nodes), None);
    }

    #[test]
    fn counts_follow_the_generation_of_every_set() {
        let wanted = vec![("a".to_string(), 2), ("b".to_string(), 1)];
        let nodes = vec![
            node(
                "n1",
                "worker",
                &[("a", 2, Some(2), None), ("b", 1, Some(1), None)],
            ),
            // Still on generation 1 of a: not updated, not degraded (it is working).
            node(
                "n2",
                "worker",
                &[("a", 2, Some(1), None), ("b", 1, Some(1), None)],
            ),
            // Generation 2 of a failed.
            node(
                "n3",
                "worker",
                &[
                    ("a", 2, Some(1), Some((2, "img q.io/x@sha256:1: not found"))),
                    ("b", 1, Some(1), None),
                ],
            ),
            // Lacks set b entirely.
            node("n4", "worker", &[("a", 2, Some(2), None)]),
            node("m1", "master", &[]),
        ];
        let s = sync_status("worker", &wanted, &nodes);
        assert_eq!(
            (
                s.machine_count,
                s.updated_machine_count,
                s.ready_machine_count,
                s.unavailable_machine_count
            ),
            (4, 1, 1, 1)
        );
        assert_eq!(s.available_machine_count, 1);
        let msg = s.degraded.unwrap();
        assert!(
            msg.starts_with("1 of 4 node(s)")
                && msg.contains("node n3")
                && msg.contains("PinnedImageSet a")
                && msg.contains("not found"),
            "{msg}"
        );
        assert!(
            !msg.contains("n2"),
            "a node making progress is not named as failed: {msg}"
        );
    }

    #[test]
    fn a_pool_without_sets_has_every_node_updated_and_no_nodes_means_zero() {
        let nodes = vec![node("n1", "worker", &[])];
        let s = sync_status("worker", &[], &nodes);
        assert_eq!(
            (s.machine_count, s.updated_machine_count, s.degraded),
            (1, 1, None)
        );
        assert_eq!(sync_status("infra", &[], &nodes), PoolSync::default());
    }

    #[test]
    fn a_recovered_failure_does_not_degrade_and_long_messages_are_cut() {
        // Generation 1 failed, generation 2 succeeded: history only.
        let ok = node("n1", "w", &[("a", 2, Some(2), Some((1, "old")))]);
        assert!(ok.degraded.is_none());
        assert_eq!(
            sync_status("w", &[("a".into(), 2)], &[ok]).ready_machine_count,
            1
        );
        let long = "x".repeat(10_000);
        let bad: Vec<NodeReport> = (0..3)
            .map(|i| node(&format!("n{i}"), "w", &[("a", 1, None, Some((1, &long)))]))
            .collect();
        let msg = sync_status("w", &[("a".into(), 1)], &bad).degraded.unwrap();
        assert!(msg.chars().count() <= MAX_MESSAGE && msg.ends_with("more characters)"));
    }

    #[test]
    fn the_pools_of_a_set() {
        let worker = vec!["a".to_string(), "b".to_string()];
        let infra = vec!["b".to_string()];
        let selections = [("worker", worker.as_slice()), ("infra", infra.as_slice())];
        assert_eq!(pools_of_set("b", selections), vec!["infra", "worker"]);
        assert_eq!(pools_of_set("a", selections), vec!["worker"]);
        assert!(pools_of_set("z", selections).is_empty());
    }
}
