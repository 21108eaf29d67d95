//! Fleet rollout, with no Kubernetes in sight: where each node of a pool stands against the
//! pool's target, what the fleet policy is asked, what its grant changes, and — on the node —
//! which sets a node may pull under its grant.
//!
//! A grant is recorded per node as the sets and generations it may pull ([`RolloutGrant`]). A
//! node pulls a set only when its grant covers the set's generation; the images it already
//! holds are verified and pinned without one ([`gate`]).

use crate::desired::{Desired, DesiredSet, Wanted};
use crate::status::{Progress, SetStatus};
use crate::timeline::{NodeBar, Timeline};
use pinset_policy_sdk::{
    FleetNode, FleetPool, Grant, MAX_PULLING_ANNOTATION, NodeProgress, Phase, RolloutRequest,
    SetState, Target, TargetSet, count_or_percent,
};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// What a node may pull: each set up to a generation, and how many pulls at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolloutGrant {
    pub sets: BTreeMap<String, i64>,
    pub max_pulls: Option<u32>,
}

impl RolloutGrant {
    /// The grant covers `set` at `generation`.
    pub fn covers(&self, set: &str, generation: i64) -> bool {
        self.sets.get(set).is_some_and(|g| *g >= generation)
    }

    /// The grant covers every set of `target`.
    pub fn covers_target(&self, target: &Target) -> bool {
        target
            .sets
            .iter()
            .all(|s| self.covers(&s.name, s.generation))
    }

    /// A grant for `target`.
    pub fn for_target(target: &Target, max_pulls: Option<u32>) -> Self {
        Self {
            sets: target
                .sets
                .iter()
                .map(|s| (s.name.clone(), s.generation))
                .collect(),
            max_pulls,
        }
    }
}

/// One node of a pool as its MachineConfigNode tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The agent reports the node Ready.
    pub ready: bool,
    pub grant: Option<RolloutGrant>,
    pub sets: BTreeMap<String, SetStatus>,
    pub progress: Option<Progress>,
    /// Since when the node has been Progressing, in milliseconds since the Unix epoch.
    pub progressing_since_ms: Option<u64>,
}

/// Where `member` stands against `target`.
pub fn phase(member: &Member, target: &Target) -> Phase {
    let mut done = true;
    for t in &target.sets {
        let s = member.sets.get(&t.name);
        if s.and_then(|s| s.current_generation) >= Some(t.generation) {
            continue;
        }
        done = false;
        let failed = s.and_then(|s| s.last_failed_generation) >= Some(t.generation);
        if failed {
            return Phase::Failed;
        }
    }
    match (done, granted(member, target)) {
        (true, _) => Phase::Done,
        (false, true) => Phase::Pulling,
        (false, false) => Phase::Waiting,
    }
}

fn granted(member: &Member, target: &Target) -> bool {
    member
        .grant
        .as_ref()
        .is_some_and(|g| g.covers_target(target))
}

/// The target of a pool: its sets as (name, generation, image count), sorted by name.
pub fn target(sets: &[(String, i64, u32)]) -> Target {
    let mut sets: Vec<TargetSet> = sets
        .iter()
        .map(|(name, generation, images)| TargetSet {
            name: name.clone(),
            generation: *generation,
            images: *images,
            bytes: 0,
        })
        .collect();
    sets.sort_by(|a, b| a.name.cmp(&b.name));
    Target {
        images: sets.iter().map(|s| s.images).sum(),
        bytes: 0,
        sets,
    }
}

/// The pool's ceiling on nodes pulling at once, from its annotation; an error names the value.
pub fn max_pulling(
    annotations: &BTreeMap<String, String>,
    nodes: usize,
) -> Result<Option<u32>, String> {
    let Some(value) = annotations.get(MAX_PULLING_ANNOTATION) else {
        return Ok(None);
    };
    count_or_percent(value, nodes).map(Some).ok_or_else(|| {
        format!(
            "annotation {MAX_PULLING_ANNOTATION}={value:?} is neither a count nor a percentage \
             (0-100%); the pool has no ceiling until it is fixed"
        )
    })
}

/// The pool annotation that pauses its rollout: while it is set, no node is granted (the fleet
/// policy is not asked); nodes granted before go on, since a grant is never taken back.
pub const PAUSED_ANNOTATION: &str = "pinset.io/rollout-paused";

/// Whether the pool's rollout is paused, and what is wrong with the annotation when its value
/// is neither `true` nor `false`. Such a value pauses: whoever wrote it meant to stop.
pub fn paused(annotations: &BTreeMap<String, String>) -> (bool, Option<String>) {
    match annotations.get(PAUSED_ANNOTATION).map(|v| v.trim()) {
        None | Some("false") => (false, None),
        Some("true") => (true, None),
        Some(other) => (
            true,
            Some(format!(
                "annotation {PAUSED_ANNOTATION}={other:?} is neither \"true\" nor \"false\"; \
                 the rollout stays paused until it is fixed"
            )),
        ),
    }
}

/// The answer for a paused pool, in place of the fleet policy's: no node, and why.
pub fn paused_grant(request: &RolloutRequest) -> Grant {
    let c = counts(request);
    Grant::none(format!(
        "paused by {PAUSED_ANNOTATION}: no node is granted until it is removed; {} granted \
         node(s) still pulling go on, {} wait, {}/{} at the target",
        c.pulling,
        c.waiting,
        c.done,
        request.nodes.len()
    ))
}

/// What the fleet policy is asked for `pool`: every member, sorted by name. `now_ms` dates the
/// progress (milliseconds since the Unix epoch).
pub fn request(
    pool: &str,
    annotations: &BTreeMap<String, String>,
    max_pulling: Option<u32>,
    target: Target,
    members: &[Member],
    now_ms: u64,
) -> RolloutRequest {
    let mut members: Vec<&Member> = members.iter().collect();
    members.sort_by(|a, b| a.name.cmp(&b.name));
    let nodes = members
        .into_iter()
        .map(|m| fleet_node(m, &target, now_ms))
        .collect();
    RolloutRequest {
        pool: FleetPool {
            name: pool.into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            max_pulling,
        },
        target,
        nodes,
    }
}

fn fleet_node(m: &Member, target: &Target, now_ms: u64) -> FleetNode {
    let phase = phase(m, target);
    let p = m.progress.unwrap_or_default();
    FleetNode {
        name: m.name.clone(),
        labels: m
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ready: m.ready,
        granted: granted(m, target),
        phase,
        progress: NodeProgress {
            images_done: p.images_done,
            images_total: p.images_total,
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            pulling_for_ms: (phase == Phase::Pulling)
                .then_some(m.progressing_since_ms)
                .flatten()
                .map(|since| now_ms.saturating_sub(since)),
        },
        sets: m
            .sets
            .values()
            .map(|s| SetState {
                name: s.name.clone(),
                desired_generation: s.desired_generation,
                current_generation: s.current_generation,
                last_failed_generation: s.last_failed_generation,
                last_failed_error: s.last_failed_generation_error.clone(),
            })
            .collect(),
    }
}

/// What the fleet decision depends on — the pool's annotations, the target, and each node's
/// name, labels, readiness, grant and phase — hashed. Progress is left out: the policy is
/// asked again when a node's phase changes, not at every image it pulls.
pub fn fingerprint(request: &RolloutRequest) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    request.pool.annotations.hash(&mut h);
    request.pool.max_pulling.hash(&mut h);
    for s in &request.target.sets {
        (&s.name, s.generation, s.images).hash(&mut h);
    }
    for n in &request.nodes {
        (&n.name, &n.labels, n.ready, n.granted, n.phase).hash(&mut h);
    }
    h.finish()
}

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

/// A change of a pool's node policy rolls out as one more entry of the pool's target, named
/// by the module: granted canary first and in waves like a set, `Done` on a node that decides
/// with it, `Failed` on a node that refused it (the cause is the entry's error).
pub const POLICY_SET_PREFIX: &str = "policy@";

/// The target entry of the node policy `reference` (a file, `FILE@sha256:…` or
/// `oci://…@sha256:…`): `policy@sha256:HEX` when the reference names a digest, else
/// `policy@REFERENCE` (at most 253 characters, a set name's limit).
pub fn policy_set(reference: &str) -> String {
    let name = match reference.rsplit_once("@sha256:") {
        Some((_, hex)) => format!("{POLICY_SET_PREFIX}sha256:{hex}"),
        None => format!("{POLICY_SET_PREFIX}{reference}"),
    };
    name.chars().take(253).collect()
}

/// Whether `name` is a target entry of a node policy rather than a set.
pub fn is_policy_set(name: &str) -> bool {
    name.starts_with(POLICY_SET_PREFIX)
}

/// Add to a node's sets the policy entries its status implies: the module it runs (at the
/// target), the one it refused (failed, with the cause). The generation of a policy entry is 1:
/// its name is its version.
pub fn add_policy_states(
    sets: &mut BTreeMap<String, SetStatus>,
    running: Option<&str>,
    rejected: Option<(&str, &str)>,
) {
    if let Some((module, cause)) = rejected {
        let name = policy_set(module);
        sets.insert(
            name.clone(),
            SetStatus {
                name,
                desired_generation: 1,
                last_failed_generation: Some(1),
                last_failed_generation_error: Some(format!("node policy {module}: {cause}")),
                ..Default::default()
            },
        );
    }
    if let Some(module) = running {
        let name = policy_set(module);
        sets.insert(
            name.clone(),
            SetStatus {
                name,
                desired_generation: 1,
                current_generation: Some(1),
                ..Default::default()
            },
        );
    }
}

/// The grant without its policy entries: what the node may pull (a policy grant changes no
/// pull, and must not restart a reconcile).
pub fn sets_only(grant: &RolloutGrant) -> RolloutGrant {
    RolloutGrant {
        sets: grant
            .sets
            .iter()
            .filter(|(name, _)| !is_policy_set(name))
            .map(|(n, g)| (n.clone(), *g))
            .collect(),
        max_pulls: grant.max_pulls,
    }
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

/// On the node: `desired` without the sets its grant does not cover and that miss an image
/// (`present` by index of `desired.images`); those go to `waiting`. Sets whose images are all
/// present stay: they are verified and pinned without a grant. Without a grant field
/// (`desired.grant` is `None`) everything stays.
pub fn gate(desired: &Desired, present: &[bool]) -> Desired {
    let Some(grant) = &desired.grant else {
        return desired.clone();
    };
    let held = |s: &DesiredSet| {
        !grant.covers(&s.name, s.generation)
            && s.images
                .iter()
                .any(|&i| !present.get(i).copied().unwrap_or(false))
    };
    let mut out = Desired {
        pools: desired.pools.clone(),
        invalid: desired.invalid.clone(),
        grant: desired.grant.clone(),
        waiting: desired.waiting.clone(),
        ..Default::default()
    };
    let mut index: HashMap<usize, usize> = HashMap::new();
    for set in &desired.sets {
        if held(set) {
            out.waiting.push((set.name.clone(), set.generation));
            continue;
        }
        let images = set
            .images
            .iter()
            .map(|&i| {
                *index.entry(i).or_insert_with(|| {
                    out.images.push(Wanted {
                        reference: desired.images[i].reference.clone(),
                        sets: Vec::new(),
                    });
                    out.images.len() - 1
                })
            })
            .collect::<Vec<_>>();
        for &i in &images {
            out.images[i].sets.push(set.name.clone());
        }
        out.sets.push(DesiredSet {
            name: set.name.clone(),
            generation: set.generation,
            images,
        });
    }
    out
}

/// The node's Progressing message while sets wait for a grant.
pub fn waiting_message(waiting: &[(String, i64)]) -> String {
    let sets: Vec<String> = waiting
        .iter()
        .map(|(name, generation)| format!("{name} generation {generation}"))
        .collect();
    format!(
        "waiting for a rollout grant from the pool's fleet policy to pull PinnedImageSet(s) {}; \
         images already present are pinned",
        sets.join(", ")
    )
}

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
        w.observe(
            0,
            [
                ("a", true, pull),
                ("b", false, wait),
                ("c", false, wait),
                ("old", false, done),
            ],
        );
        w.observe(
            100,
            [
                ("a", true, done),
                ("b", true, pull),
                ("c", false, wait),
                ("old", false, done),
            ],
        );
        w.observe(
            250,
            [
                ("a", true, done),
                ("b", true, fail),
                ("c", false, done),
                ("old", false, done),
            ],
        );
        w.observe(
            400,
            [
                ("a", true, done),
                ("b", true, fail),
                ("c", false, done),
                ("old", false, done),
            ],
        );
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
