//! What a node must hold: its pools, their PinnedImageSets, and their images deduplicated.

use super::reference::{ImageRef, RefError};
use super::selector::LabelSelector;
use std::collections::{BTreeMap, HashMap};

pub const ROLE_LABEL: &str = "machineconfiguration.openshift.io/role";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedImageSet {
    pub name: String,
    pub generation: i64,
    pub labels: BTreeMap<String, String>,
    /// Image references as written in the set (validated by [`desired`]).
    pub images: Vec<String>,
}

impl PinnedImageSet {
    /// A set of generation 1 that the standard pool of `role` selects ([`standard_pools`]).
    pub fn for_role(name: impl Into<String>, role: &str, images: &[String]) -> PinnedImageSet {
        PinnedImageSet {
            name: name.into(),
            generation: 1,
            labels: [(ROLE_LABEL.to_string(), role.to_string())].into(),
            images: images.to_vec(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub machine_config_selector: LabelSelector,
    pub node_selector: LabelSelector,
    /// `spec.pinnedImageSets` as written by the controller; when absent the sets are selected
    /// here with `machine_config_selector`, as the controller would.
    pub pinned_image_sets: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ready: bool,
    pub disk_pressure: bool,
    pub allocatable_ephemeral_bytes: Option<u64>,
}

impl NodeInfo {
    /// The node's facts as a policy is given them (`record node-facts`), for a node of `pools`:
    /// the one place each fact is filled from what is known of the node — the agent, `pinset
    /// plan` and `node`, the smoke test and the scenarios all go through it.
    pub fn facts(&self, pools: &[String]) -> pinset_policy_sdk::NodeFacts {
        let labels = self.labels.iter();
        pinset_policy_sdk::NodeFacts {
            name: self.name.clone(),
            labels: labels.map(|(k, v)| (k.clone(), v.clone())).collect(),
            pools: pools.to_vec(),
            control_plane: pinset_policy_sdk::is_control_plane(
                self.labels.keys().map(String::as_str),
            ),
            ready: self.ready,
            disk_pressure: self.disk_pressure,
            allocatable_ephemeral_bytes: self.allocatable_ephemeral_bytes,
        }
    }
}

/// The standard `master` and `worker` pools: sets by `machineconfiguration.openshift.io/role`,
/// nodes by `node-role.kubernetes.io/<role>`.
pub fn standard_pools() -> Vec<Pool> {
    ["master", "worker"]
        .into_iter()
        .map(|role| Pool {
            name: role.into(),
            machine_config_selector: LabelSelector::labels(&[(ROLE_LABEL, role)]),
            node_selector: LabelSelector::labels(&[(
                &format!("node-role.kubernetes.io/{role}"),
                "",
            )]),
            pinned_image_sets: None,
        })
        .collect()
}

/// A custom `infra` pool as the reference documents it: sets of role `worker` or `infra`, nodes
/// labelled `node-role.kubernetes.io/infra` (for tests).
#[cfg(test)]
pub(crate) fn infra_pool() -> Pool {
    Pool {
        name: "infra".into(),
        machine_config_selector: LabelSelector {
            match_expressions: vec![crate::selector::Requirement {
                key: ROLE_LABEL.into(),
                operator: crate::selector::Operator::In,
                values: vec!["worker".into(), "infra".into()],
            }],
            ..Default::default()
        },
        node_selector: LabelSelector::labels(&[("node-role.kubernetes.io/infra", "")]),
        pinned_image_sets: None,
    }
}

/// The pools of a node, primary first: a control-plane node is only in `master`; otherwise
/// custom pools come first, then `worker` when it matches. An empty node selector matches no node.
pub fn pools_of_node<'a>(node: &NodeInfo, pools: &'a [Pool]) -> Vec<&'a Pool> {
    let matching: Vec<&Pool> = pools
        .iter()
        .filter(|p| !p.node_selector.is_empty() && p.node_selector.matches(&node.labels))
        .collect();
    if let Some(master) = matching.iter().find(|p| p.name == "master") {
        return vec![master];
    }
    let mut out: Vec<&Pool> = matching
        .iter()
        .copied()
        .filter(|p| p.name != "worker")
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.extend(matching.iter().copied().filter(|p| p.name == "worker"));
    out
}

/// The sets of a pool, sorted by name: its `spec.pinnedImageSets` when written, else the sets
/// whose labels its `machineConfigSelector` matches (an empty selector selects none).
pub fn sets_of_pool<'a>(pool: &Pool, sets: &'a [PinnedImageSet]) -> Vec<&'a PinnedImageSet> {
    let mut out: Vec<&PinnedImageSet> = match &pool.pinned_image_sets {
        Some(names) => sets.iter().filter(|s| names.contains(&s.name)).collect(),
        None if pool.machine_config_selector.is_empty() => Vec::new(),
        None => sets
            .iter()
            .filter(|s| pool.machine_config_selector.matches(&s.labels))
            .collect(),
    };
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// One image wanted on the node, with the sets that want it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub reference: ImageRef,
    pub sets: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredSet {
    pub name: String,
    pub generation: i64,
    /// Indices into [`Desired::images`].
    pub images: Vec<usize>,
}

/// A set that cannot be worked on, and why (names the set and the image).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("PinnedImageSet {set}: image {image}: {error}")]
pub struct InvalidSet {
    pub set: String,
    pub generation: i64,
    pub image: String,
    pub error: RefError,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// The node's pools, primary first.
    pub pools: Vec<String>,
    /// Valid sets of all pools, each once, in pool order then name order.
    pub sets: Vec<DesiredSet>,
    /// Images of the valid sets, duplicates removed, in the sets' order.
    pub images: Vec<Wanted>,
    /// Sets refused because an image reference is invalid; their images are not pulled.
    pub invalid: Vec<InvalidSet>,
    /// The node's rollout grant, when a fleet policy paces its pool: a set is pulled only up
    /// to the generation the grant covers (see [`crate::rollout::gate`]). `None`: no pacing.
    pub grant: Option<crate::rollout::RolloutGrant>,
    /// Sets held back by the grant in this reconcile (name, generation): they miss images and
    /// wait for a grant.
    pub waiting: Vec<(String, i64)>,
}

impl Desired {
    /// Sets with these names and generations and no images (for tests of status logic).
    #[cfg(test)]
    pub(crate) fn of_sets(sets: &[(&str, i64)]) -> Desired {
        Desired {
            sets: sets
                .iter()
                .map(|(n, g)| DesiredSet {
                    name: n.to_string(),
                    generation: *g,
                    images: vec![],
                })
                .collect(),
            ..Default::default()
        }
    }
}

/// The desired state of `node`: images of every set of every pool of the node.
pub fn desired(node: &NodeInfo, pools: &[Pool], sets: &[PinnedImageSet]) -> Desired {
    let mut out = Desired::default();
    let mut index: HashMap<String, usize> = HashMap::new();
    for pool in pools_of_node(node, pools) {
        out.pools.push(pool.name.clone());
        for set in sets_of_pool(pool, sets) {
            if out.sets.iter().any(|s| s.name == set.name)
                || out.invalid.iter().any(|s| s.set == set.name)
            {
                continue;
            }
            let parsed: Result<Vec<ImageRef>, InvalidSet> = set
                .images
                .iter()
                .map(|image| {
                    ImageRef::parse(image).map_err(|error| InvalidSet {
                        set: set.name.clone(),
                        generation: set.generation,
                        image: image.clone(),
                        error,
                    })
                })
                .collect();
            let refs = match parsed {
                Ok(refs) => refs,
                Err(invalid) => {
                    out.invalid.push(invalid);
                    continue;
                }
            };
            let mut members = Vec::with_capacity(refs.len());
            for reference in refs {
                let i = *index
                    .entry(reference.as_str().to_string())
                    .or_insert_with(|| {
                        out.images.push(Wanted {
                            reference,
                            sets: Vec::new(),
                        });
                        out.images.len() - 1
                    });
                if !out.images[i].sets.contains(&set.name) {
                    out.images[i].sets.push(set.name.clone());
                    members.push(i);
                }
            }
            out.sets.push(DesiredSet {
                name: set.name.clone(),
                generation: set.generation,
                images: members,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u8) -> String {
        format!("quay.io/x/y@sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn set(name: &str, role: &str, images: &[String]) -> PinnedImageSet {
        PinnedImageSet::for_role(name, role, images)
    }

    fn node(roles: &[&str]) -> NodeInfo {
        NodeInfo {
            name: "n".into(),
            labels: roles
                .iter()
                .map(|r| (format!("node-role.kubernetes.io/{r}"), String::new()))
                .collect(),
            ready: true,
            ..Default::default()
        }
    }

    #[test]
    fn node_pools_follow_the_reference_order() {
        let mut pools = standard_pools();
        pools.push(infra_pool());
        let names = |n: &NodeInfo| {
            pools_of_node(n, &pools)
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&node(&["master", "worker"])), vec!["master"]);
        assert_eq!(names(&node(&["worker", "infra"])), vec!["infra", "worker"]);
        assert_eq!(names(&node(&["worker"])), vec!["worker"]);
        assert!(names(&node(&[])).is_empty());
        let mut empty = infra_pool();
        empty.node_selector = LabelSelector::default();
        assert!(
            pools_of_node(&node(&["infra"]), &[empty]).is_empty(),
            "empty selector matches nothing"
        );
    }

    #[test]
    fn images_are_deduplicated_across_sets_and_pools() {
        let mut pools = standard_pools();
        pools.push(infra_pool());
        let sets = vec![
            set("b-worker", "worker", &[digest(1), digest(2)]),
            set("a-infra", "infra", &[digest(2), digest(3)]),
            set("m", "master", &[digest(9)]),
        ];
        let d = desired(&node(&["worker", "infra"]), &pools, &sets);
        assert_eq!(d.pools, vec!["infra", "worker"]);
        // infra pool selects both sets (sorted): a-infra, b-worker; worker adds nothing new.
        assert_eq!(
            d.sets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            vec!["a-infra", "b-worker"]
        );
        let refs: Vec<&str> = d.images.iter().map(|w| w.reference.as_str()).collect();
        assert_eq!(refs, vec![digest(2), digest(3), digest(1)]);
        assert_eq!(d.images[0].sets, vec!["a-infra", "b-worker"]);
        assert_eq!(d.sets[1].images, vec![2, 0]);
    }

    #[test]
    fn a_set_with_a_tag_is_refused_by_name_and_the_others_proceed() {
        let sets = vec![
            set("good", "worker", &[digest(1)]),
            set("bad", "worker", &[digest(2), "quay.io/x/y:latest".into()]),
        ];
        let d = desired(&node(&["worker"]), &standard_pools(), &sets);
        assert_eq!(d.sets.len(), 1);
        assert_eq!(d.images.len(), 1);
        let msg = d.invalid[0].to_string();
        assert_eq!(
            msg,
            "PinnedImageSet bad: image quay.io/x/y:latest: \"quay.io/x/y:latest\" has a tag but no \
             digest: pin images by digest (name@sha256:<64 hex digits>)"
        );
    }

    #[test]
    fn explicit_pool_sets_win_over_the_selector() {
        let mut pool = standard_pools().remove(1);
        pool.pinned_image_sets = Some(vec!["m".into()]);
        let sets = vec![
            set("w", "worker", &[digest(1)]),
            set("m", "master", &[digest(2)]),
        ];
        let names: Vec<&str> = sets_of_pool(&pool, &sets)
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, vec!["m"]);
    }
}
