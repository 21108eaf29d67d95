//! Where each node of a pool stands against the pool's target, and what the fleet policy is
//! asked: the members, the target, the ceiling, the request and its fingerprint.

use super::*;

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
