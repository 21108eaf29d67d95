//! A pool's rollout as `pinset rollout` shows and steers it: where it stands, read from the
//! objects themselves (the pool, the PinnedImageSets it selects, its MachineConfigNodes) by the
//! rules the controller uses — the core's selection, phases and counts — and the pause, set and
//! lifted through the pool's `pinset.io/rollout-paused` annotation.
//!
//! The nodes say how far the rollout is; the pool's status (the controller's) adds the fleet
//! policy's reason and whether the pool is Degraded, and is believed only when it speaks of
//! the objects as they are now, as `kubectl rollout status` follows `observedGeneration`: the
//! selection and the target the objects show, the pool's generation and the generation of the
//! PolicyConfiguration the controller follows. Until then the rollout is Progressing, never
//! Complete: a change just made is not judged by the status of the one before it.

use crate::api::{
    CONDITION_DEGRADED, MachineConfigNode, MachineConfigPool, PinnedImageSet, PolicyConfiguration,
    PoolRollout,
};
use crate::convert::{self, ConvertError};
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use pinset_core::pool::{self, PoolError};
use pinset_core::rollout::{self, PAUSED_ANNOTATION, Standing};
use pinset_policy_sdk::Phase;
use serde::Serialize;
use std::collections::BTreeMap;

/// Where a pool's rollout stands (`pinset rollout status -o json|yaml` prints it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    pub pool: String,
    /// `set@generation` of every set the pool selects, by name; empty when it selects none.
    pub target: String,
    /// Complete, Degraded, Paused or Progressing.
    #[serde(serialize_with = "standing_name")]
    pub standing: Standing,
    /// Why it is Degraded or Paused, or what it waits for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub nodes: u32,
    pub granted: u32,
    pub pulling: u32,
    pub done: u32,
    pub failed: u32,
    pub waiting: u32,
    pub paused: bool,
    /// The pool's status (the controller's) speaks of this target and of the current
    /// generations of the pool and the PolicyConfiguration.
    pub observed: bool,
    /// The fleet policy that decided last, and why, when the status speaks of this target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Every node of the pool, by name.
    pub members: Vec<MemberStatus>,
}

/// One node of the pool against the target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    pub name: String,
    /// waiting, pulling, done or failed.
    #[serde(serialize_with = "phase_name")]
    pub phase: Phase,
    pub granted: bool,
    pub ready: bool,
    pub images_done: u64,
    pub images_total: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn phase_name<S: serde::Serializer>(p: &Phase, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(p.as_str())
}

fn standing_name<S: serde::Serializer>(s: &Standing, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(s.name())
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("MachineConfigPool {pool} not found")]
    NotFound { pool: String },
    #[error(transparent)]
    Convert(#[from] ConvertError),
    #[error("MachineConfigPool {pool}: reading the {what}: {source}")]
    Watch {
        pool: String,
        what: &'static str,
        source: watcher::Error,
    },
    #[error("MachineConfigPool {pool}: {source}")]
    Api { pool: String, source: kube::Error },
    #[error("MachineConfigPool {pool} is already paused ({PAUSED_ANNOTATION}={value:?})")]
    AlreadyPaused { pool: String, value: String },
    #[error("MachineConfigPool {pool} is not paused")]
    NotPaused { pool: String },
}

/// The objects a rollout is read from, all of their kind there are (the pool's own are picked).
pub struct Objects<'a, S, N, P> {
    pub sets: S,
    pub nodes: N,
    pub policies: P,
    _life: std::marker::PhantomData<&'a ()>,
}

impl<'a, S, N, P> Objects<'a, S, N, P>
where
    S: IntoIterator<Item = &'a PinnedImageSet>,
    N: IntoIterator<Item = &'a MachineConfigNode>,
    P: IntoIterator<Item = &'a PolicyConfiguration>,
{
    pub fn new(sets: S, nodes: N, policies: P) -> Self {
        Self {
            sets,
            nodes,
            policies,
            _life: std::marker::PhantomData,
        }
    }
}

/// Where `mcp`'s rollout stands, from every PinnedImageSet, MachineConfigNode and
/// PolicyConfiguration there is. `now_ms`: milliseconds since the Unix epoch.
pub fn read<'a, S, N, P>(
    mcp: &MachineConfigPool,
    objects: Objects<'a, S, N, P>,
    now_ms: u64,
) -> Result<RolloutStatus, ConvertError>
where
    S: IntoIterator<Item = &'a PinnedImageSet>,
    N: IntoIterator<Item = &'a MachineConfigNode>,
    P: IntoIterator<Item = &'a PolicyConfiguration>,
{
    let (request, selected, too_many) = request_of(mcp, objects.sets, objects.nodes, now_ms)?;
    let counts = rollout::counts(&request);
    let label = rollout::target_label(&request.target);
    let unobserved = unobserved(mcp, &selected, &label, objects.policies);
    let observed = unobserved.is_none();
    let pending = mcp.status.as_ref().and_then(|s| s.observed.as_ref());
    let pending = pending.and_then(|o| o.pending.clone()).filter(|_| observed);
    let (paused, pause_note) = rollout::paused(mcp.annotations());
    let standing = match too_many {
        // No selection, so no target the nodes could be complete against.
        Some(why) => Standing::Degraded(why),
        None => {
            let degraded = observed.then(|| degraded_message(mcp)).flatten();
            match rollout::standing(&counts, paused, degraded.as_deref()) {
                // Complete only for the change the status has seen, with nothing left out.
                Standing::Complete if !observed || pending.is_some() => Standing::Progressing,
                standing => standing,
            }
        }
    };
    let message = message(&standing, pause_note, unobserved.or(pending));
    let last_decision = mcp.status.as_ref().and_then(|s| s.rollout.clone());
    let (policy, reason) = match last_decision.filter(|_| observed) {
        Some(PoolRollout { policy, reason, .. }) => (Some(policy), Some(reason)),
        None => (None, None),
    };
    Ok(RolloutStatus {
        pool: mcp.name_any(),
        target: label,
        standing,
        message,
        nodes: request.nodes.len() as u32,
        granted: counts.granted,
        pulling: counts.pulling,
        done: counts.done,
        failed: counts.failed,
        waiting: counts.waiting,
        paused,
        observed,
        policy,
        reason,
        members: request.nodes.iter().map(member_status).collect(),
    })
}

/// The pool's rollout request as the controller makes it — its selection of sets (and whether
/// it selects too many), the node policy entries it wrote, its nodes — and the selection.
fn request_of<'a>(
    mcp: &MachineConfigPool,
    sets: impl IntoIterator<Item = &'a PinnedImageSet>,
    nodes: impl IntoIterator<Item = &'a MachineConfigNode>,
    now_ms: u64,
) -> Result<
    (
        pinset_policy_sdk::RolloutRequest,
        Vec<String>,
        Option<String>,
    ),
    ConvertError,
> {
    let name = mcp.name_any();
    let sets: BTreeMap<String, &PinnedImageSet> =
        sets.into_iter().map(|s| (s.name_any(), s)).collect();
    let labelled = sets.iter().map(|(n, s)| (n.as_str(), s.labels()));
    // The selection the controller makes (and writes to spec.pinnedImageSets).
    let (selected, too_many) = match pool::select_labelled(&convert::pool(mcp)?, labelled) {
        Ok(names) => (names.unwrap_or_default(), None),
        Err(e @ PoolError::TooManySets { .. }) => (Vec::new(), Some(e.to_string())),
    };
    let mut target = convert::target_sets(&selected, |n| sets.get(n).copied());
    target.extend(policy_entries(mcp));
    let members: Vec<rollout::Member> = nodes
        .into_iter()
        .filter(|n| n.spec.pool.name == name)
        .map(|n| convert::member(n, &convert::node_report(n)))
        .collect();
    // The pool's ceiling changes what may be granted, not where nodes stand: not needed here.
    let request = rollout::request(
        &name,
        mcp.annotations(),
        None,
        rollout::target(&target),
        &members,
        now_ms,
    );
    Ok((request, selected, too_many))
}

/// The node policy entries of the target the controller last wrote for `mcp`: a policy change
/// rolls out as one (the controller reads the PolicyConfiguration; this command follows it).
fn policy_entries(mcp: &MachineConfigPool) -> Vec<(String, i64, u32)> {
    let written = mcp.status.as_ref().and_then(|s| s.rollout.as_ref());
    written
        .map(|r| r.target.split(','))
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.rsplit_once('@'))
        .filter(|(name, _)| rollout::is_policy_set(name))
        .filter_map(|(name, g)| Some((name.to_string(), g.parse().ok()?, 0)))
        .collect()
}

/// What the pool's status has not seen yet (`None`: it speaks of the objects as they are): the
/// controller wrote the selection the objects show (`selected`), a rollout status for `target`,
/// and computed it from the pool's generation and the PolicyConfiguration's now.
fn unobserved<'a>(
    mcp: &MachineConfigPool,
    selected: &[String],
    target: &str,
    policies: impl IntoIterator<Item = &'a PolicyConfiguration>,
) -> Option<String> {
    let written: Vec<&str> = mcp
        .spec
        .pinned_image_sets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    let status = mcp.status.as_ref();
    let status_target = status.and_then(|s| s.rollout.as_ref());
    if written != selected || status_target.map_or("", |r| r.target.as_str()) != target {
        return Some(format!(
            "the pool's status does not show target {target:?} yet (is the controller running?)"
        ));
    }
    let generation = mcp.metadata.generation.unwrap_or_default();
    let Some(seen) = status.and_then(|s| s.observed.as_ref()) else {
        return Some("the controller has not reported on this pool yet".into());
    };
    if seen.generation < generation {
        return Some(format!(
            "waiting for the controller to observe the pool's generation {generation} (it has seen {})",
            seen.generation
        ));
    }
    let name = seen.policy_configuration.as_deref()?;
    let now = policies
        .into_iter()
        .find(|p| p.name_any() == name)
        .and_then(|p| p.metadata.generation);
    (now != seen.policy_configuration_generation).then(|| {
        let now = now.map_or("deleted".to_string(), |g| format!("at generation {g}"));
        format!("waiting for the controller to observe PolicyConfiguration {name} ({now})")
    })
}

/// Why the rollout is Degraded or Paused, or what it waits for (`waiting`: the status has not
/// seen the change yet, or the target leaves something configured out for now).
fn message(
    standing: &Standing,
    pause_note: Option<String>,
    waiting: Option<String>,
) -> Option<String> {
    match standing {
        Standing::Degraded(why) => Some(why.clone()),
        Standing::Paused => {
            Some(pause_note.unwrap_or_else(|| format!("paused by {PAUSED_ANNOTATION}")))
        }
        Standing::Progressing => waiting,
        _ => None,
    }
}

fn degraded_message(mcp: &MachineConfigPool) -> Option<String> {
    mcp.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_DEGRADED && c.status == "True")
        .map(|c| c.message.clone())
}

fn member_status(n: &pinset_policy_sdk::FleetNode) -> MemberStatus {
    MemberStatus {
        name: n.name.clone(),
        phase: n.phase,
        granted: n.granted,
        ready: n.ready,
        images_done: n.progress.images_done,
        images_total: n.progress.images_total,
        error: n.error().map(str::to_string),
    }
}

/// Pause (`true`) or resume `pool`'s rollout: the annotation set to `true`, or removed. An
/// error when the pool is already where it was asked to go, as `kubectl rollout pause` does.
pub async fn set_paused(client: Client, pool: &str, pause: bool) -> Result<(), RolloutError> {
    let api: Api<MachineConfigPool> = Api::all(client);
    let api_error = |source| RolloutError::Api {
        pool: pool.to_string(),
        source,
    };
    let mcp = api
        .get_opt(pool)
        .await
        .map_err(api_error)?
        .ok_or_else(|| RolloutError::NotFound { pool: pool.into() })?;
    let value = mcp.annotations().get(PAUSED_ANNOTATION).cloned();
    match (pause, rollout::paused(mcp.annotations()).0) {
        (true, true) => {
            return Err(RolloutError::AlreadyPaused {
                pool: pool.into(),
                value: value.unwrap_or_default(),
            });
        }
        (false, false) => return Err(RolloutError::NotPaused { pool: pool.into() }),
        _ => {}
    }
    let value = pause.then_some("true");
    let patch = serde_json::json!({"metadata": {"annotations": {PAUSED_ANNOTATION: value}}});
    let params = PatchParams {
        field_manager: Some("pinset-rollout".into()),
        ..Default::default()
    };
    api.patch(pool, &params, &Patch::Merge(&patch))
        .await
        .map_err(api_error)?;
    Ok(())
}

/// Follow `pool`'s rollout through watches of pools, sets and nodes: `on_change` sees the first
/// status once every list has arrived, then each different one, until it returns `false`;
/// that status is returned. An error before the first status ends it (a missing CRD, no
/// permission); later watch errors are retried with backoff.
pub async fn follow(
    client: Client,
    pool: &str,
    mut on_change: impl FnMut(&RolloutStatus) -> bool,
) -> Result<RolloutStatus, RolloutError> {
    let pool_config = crate::watcher_config().fields(&format!("metadata.name={pool}"));
    let (pools, pools_events) =
        crate::cached_watch(Api::<MachineConfigPool>::all(client.clone()), pool_config);
    let (sets, sets_events) = crate::cached_watch(
        Api::<PinnedImageSet>::all(client.clone()),
        crate::watcher_config(),
    );
    let (nodes, nodes_events) = crate::cached_watch(
        Api::<MachineConfigNode>::all(client.clone()),
        crate::watcher_config(),
    );
    let (policies, policies_events) = crate::cached_watch(
        Api::<PolicyConfiguration>::all(client),
        crate::watcher_config(),
    );
    let mut events = futures::stream::select_all([
        labelled(pools_events, "MachineConfigPool"),
        labelled(sets_events, "PinnedImageSets"),
        labelled(nodes_events, "MachineConfigNodes"),
        labelled(policies_events, "PolicyConfigurations"),
    ]);
    let mut lists = Lists::default();
    let mut last: Option<RolloutStatus> = None;
    let mut next_read = tokio::time::Instant::now();
    while let Some(event) = events.next().await {
        lists.take(pool, event)?;
        // The events that arrive before the next read is due are taken first: a read is O(the
        // cluster's nodes), and a large pool's progress reports arrive by the thousand.
        while let Ok(Some(event)) = tokio::time::timeout_at(next_read, events.next()).await {
            lists.take(pool, event)?;
        }
        if !lists.ready() {
            continue;
        }
        next_read = tokio::time::Instant::now() + READ_EVERY;
        let mcp = pools
            .get(&ObjectRef::new(pool))
            .ok_or_else(|| RolloutError::NotFound { pool: pool.into() })?;
        let (sets, nodes, policies) = (sets.state(), nodes.state(), policies.state());
        let objects = Objects::new(
            sets.iter().map(AsRef::as_ref),
            nodes.iter().map(AsRef::as_ref),
            policies.iter().map(AsRef::as_ref),
        );
        let status = read(&mcp, objects, crate::now_ms())?;
        if last.as_ref() == Some(&status) {
            continue;
        }
        if !on_change(&status) {
            return Ok(status);
        }
        last = Some(status);
    }
    Err(RolloutError::NotFound { pool: pool.into() })
}

/// At most this often a pool's rollout is read again while events arrive (a read goes over every
/// MachineConfigNode of the cluster).
const READ_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// A watch's event as the follow needs it, once its cache has taken it: which watch (`what`)
/// and whether it completed a list, or its error.
type Cached = futures::stream::BoxStream<
    'static,
    Result<(&'static str, bool), (&'static str, watcher::Error)>,
>;

/// A cached watch's events ([`crate::cached_watch`]) as the follow needs them.
fn labelled<K, S>(events: S, what: &'static str) -> Cached
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    events
        .map(move |e| {
            e.map(|e| (what, matches!(e, watcher::Event::InitDone)))
                .map_err(|err| (what, err))
        })
        .boxed()
}

/// Which watches have delivered their first full list.
#[derive(Default)]
struct Lists(std::collections::BTreeSet<&'static str>);

impl Lists {
    fn ready(&self) -> bool {
        self.0.len() == 4
    }

    /// Note one event of the watches. An error before every list has arrived ends the follow
    /// (a missing CRD, no permission); after, the watch retries with backoff.
    fn take(
        &mut self,
        pool: &str,
        event: Result<(&'static str, bool), (&'static str, watcher::Error)>,
    ) -> Result<(), RolloutError> {
        match event {
            Ok((what, listed)) => {
                if listed {
                    self.0.insert(what);
                }
            }
            Err((what, source)) if !self.ready() => {
                return Err(RolloutError::Watch {
                    pool: pool.into(),
                    what,
                    source,
                });
            }
            Err((what, error)) => tracing::warn!(pool, %error, "watching the {what} (retrying)"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pool(annotations: Value, spec_sets: &[&str], status: Value) -> MachineConfigPool {
        let sets: Vec<Value> = spec_sets.iter().map(|n| json!({"name": n})).collect();
        serde_json::from_value(json!({
            "apiVersion": "machineconfiguration.openshift.io/v1",
            "kind": "MachineConfigPool",
            "metadata": {"name": "worker", "annotations": annotations},
            "spec": {
                "machineConfigSelector": {"matchLabels": {"role": "worker"}},
                "pinnedImageSets": if sets.is_empty() { Value::Null } else { json!(sets) }
            },
            "status": status
        }))
        .unwrap()
    }

    fn set(name: &str, role: &str, generation: i64, images: usize) -> PinnedImageSet {
        let digest = "a".repeat(64);
        let images: Vec<Value> = (0..images)
            .map(|i| json!({"name": format!("q.io/x/i{i}@sha256:{digest}")}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "machineconfiguration.openshift.io/v1",
            "kind": "PinnedImageSet",
            "metadata": {"name": name, "generation": generation, "labels": {"role": role}},
            "spec": {"pinnedImages": images}
        }))
        .unwrap()
    }

    /// A node of `pool` at `current` of set `apps` (failed at `failed`), granted up to `grant`.
    fn node(
        name: &str,
        pool: &str,
        current: Option<i64>,
        failed: Option<i64>,
        grant: Option<i64>,
    ) -> MachineConfigNode {
        let grant = grant.map(|g| json!({"sets": [{"name": "apps", "generation": g}]}));
        let mut set = json!({"name": "apps", "desiredGeneration": 2});
        if let Some(c) = current {
            set["currentGeneration"] = json!(c);
        }
        if let Some(f) = failed {
            set["lastFailedGeneration"] = json!(f);
            set["lastFailedGenerationError"] = json!("q.io/x/i1: manifest unknown");
        }
        serde_json::from_value(json!({
            "apiVersion": "machineconfiguration.openshift.io/v1",
            "kind": "MachineConfigNode",
            "metadata": {"name": name},
            "spec": {"node": {"name": name}, "pool": {"name": pool}, "rolloutGrant": grant},
            "status": {"pinnedImageSets": [set], "nodeState": {"ready": true}}
        }))
        .unwrap()
    }

    fn at(
        mcp: &MachineConfigPool,
        sets: &[PinnedImageSet],
        nodes: &[MachineConfigNode],
    ) -> Result<RolloutStatus, ConvertError> {
        read(mcp, Objects::new(sets, nodes, &[]), 0)
    }

    fn status(target: &str, degraded: Option<&str>) -> Value {
        json!({
            "observed": {"generation": 0},
            "conditions": [{
                "type": CONDITION_DEGRADED,
                "status": if degraded.is_some() { "True" } else { "False" },
                "reason": "r", "message": degraded.unwrap_or(""),
                "lastTransitionTime": "2026-12-01T00:00:00Z"
            }],
            "rollout": {"target": target, "granted": 1, "pulling": 1, "done": 0, "failed": 0,
                        "waiting": 2, "policy": "embedded:default", "reason": "canary n0"}
        })
    }

    #[test]
    fn a_node_policy_rolling_out_is_followed_from_the_target_the_controller_wrote() {
        let module = format!("oci://r.io/p@sha256:{}", "b".repeat(64));
        let entry = rollout::policy_set(&module);
        let sets = [set("apps", "worker", 2, 3)];
        let mut on_it = node("n0", "worker", Some(2), None, Some(2));
        on_it.status.as_mut().unwrap().policy = serde_json::from_value(json!({
            "name": "p", "version": "1", "digest": format!("sha256:{}", "c".repeat(64)),
            "module": module, "since": "2026-12-03T00:00:00Z"
        }))
        .unwrap();
        let nodes = [on_it, node("n1", "worker", Some(2), None, Some(2))];
        let target = format!("apps@2,{entry}@1");
        let p = pool(json!({}), &["apps"], status(&target, None));
        let s = at(&p, &sets, &nodes).unwrap();
        assert_eq!(s.target, target);
        assert!(s.observed, "{s:?}");
        assert_eq!((s.done, s.waiting), (1, 1), "{s:?}");
        assert_eq!(s.standing, Standing::Progressing);
    }

    #[test]
    fn the_nodes_say_how_far_and_the_pools_status_counts_only_for_this_target() {
        let sets = [set("apps", "worker", 2, 3), set("other", "master", 5, 1)];
        let nodes = [
            node("n0", "worker", Some(2), None, Some(2)),
            node("n1", "worker", Some(1), None, Some(2)),
            node("n2", "worker", Some(1), None, None),
            node("m0", "master", Some(1), None, None),
        ];
        let p = pool(json!({}), &["apps"], status("apps@2", None));
        let s = at(&p, &sets, &nodes).unwrap();
        assert_eq!((s.target.as_str(), s.nodes), ("apps@2", 3), "{s:?}");
        assert_eq!(
            (s.done, s.pulling, s.waiting, s.failed, s.granted),
            (1, 1, 1, 0, 2)
        );
        assert_eq!(
            (s.standing.clone(), s.observed),
            (Standing::Progressing, true)
        );
        assert_eq!(s.reason.as_deref(), Some("canary n0"));
        let names: Vec<_> = s
            .members
            .iter()
            .map(|m| (m.name.as_str(), m.phase))
            .collect();
        assert_eq!(
            names,
            [
                ("n0", Phase::Done),
                ("n1", Phase::Pulling),
                ("n2", Phase::Waiting)
            ]
        );

        // A status written for generation 1 says nothing of generation 2: no reason, no
        // Degraded, and the message says what is missing.
        let stale = pool(
            json!({}),
            &["apps"],
            status("apps@1", Some("canary n0 failed")),
        );
        let s = at(&stale, &sets, &nodes).unwrap();
        assert_eq!(
            (s.standing.clone(), s.observed, s.reason),
            (Standing::Progressing, false, None)
        );
        assert!(s.message.unwrap().contains("\"apps@2\""));
        // Nor does a pool whose spec does not list the selection yet (a set just created).
        let unwritten = pool(json!({}), &[], status("apps@2", None));
        assert!(!at(&unwritten, &sets, &nodes).unwrap().observed);
    }

    #[test]
    fn degraded_paused_and_complete() {
        let sets = [set("apps", "worker", 2, 3)];
        let failed = [
            node("n0", "worker", Some(1), Some(2), Some(2)),
            node("n1", "worker", Some(1), None, None),
        ];
        let why = "canary n0 failed: q.io/x/i1: manifest unknown";
        let held = pool(json!({}), &["apps"], status("apps@2", Some(why)));
        let s = at(&held, &sets, &failed).unwrap();
        assert_eq!(s.standing, Standing::Degraded(why.into()));
        assert_eq!(
            s.members[0].error.as_deref(),
            Some("q.io/x/i1: manifest unknown")
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            (json["standing"].as_str(), json["failed"].as_u64()),
            (Some("Degraded"), Some(1))
        );

        let waiting = [node("n1", "worker", Some(1), None, None)];
        let paused = pool(
            json!({PAUSED_ANNOTATION: "yes"}),
            &["apps"],
            status("apps@2", None),
        );
        let s = at(&paused, &sets, &waiting).unwrap();
        assert_eq!((s.standing.clone(), s.paused), (Standing::Paused, true));
        assert!(
            s.message.unwrap().contains("\"yes\""),
            "a bad value is named"
        );

        let done = [node("n0", "worker", Some(2), None, Some(2))];
        let s = at(&paused, &sets, &done).unwrap();
        assert_eq!(
            s.standing,
            Standing::Complete,
            "nothing left to pull, paused or not"
        );
        // A pool without sets or nodes has nothing to roll out, once the controller said so.
        let unseen = pool(json!({}), &[], Value::Null);
        let s = at(&unseen, &[], &[]).unwrap();
        assert_eq!((s.standing, s.observed), (Standing::Progressing, false));
        let empty = pool(json!({}), &[], json!({"observed": {"generation": 0}}));
        let s = at(&empty, &[], &[]).unwrap();
        assert_eq!(
            (s.standing, s.target.as_str(), s.observed),
            (Standing::Complete, "", true)
        );
    }

    fn policy_configuration(generation: i64) -> PolicyConfiguration {
        serde_json::from_value(json!({
            "apiVersion": "pinset.io/v1alpha1", "kind": "PolicyConfiguration",
            "metadata": {"name": "cluster", "generation": generation},
            "spec": {"pools": {}}
        }))
        .unwrap()
    }

    /// Right after a change, the status the controller wrote for the objects before it must not
    /// be read as the outcome: a pool edited, a PolicyConfiguration changed (or deleted), a
    /// module still being checked, a module refused while every node is at the old target.
    #[test]
    fn a_change_the_controller_has_not_observed_is_progressing_never_complete() {
        let sets = [set("apps", "worker", 2, 3)];
        let done = [node("n0", "worker", Some(2), None, Some(2))];
        let mut seen = status("apps@2", None);
        seen["observed"] = json!({"generation": 4, "policyConfiguration": "cluster",
                                  "policyConfigurationGeneration": 7});
        let mut p = pool(json!({}), &["apps"], seen.clone());
        p.metadata.generation = Some(4);
        let read_with = |p: &MachineConfigPool, policies: &[PolicyConfiguration]| {
            read(p, Objects::new(&sets, &done, policies), 0).unwrap()
        };
        let s = read_with(&p, &[policy_configuration(7)]);
        assert_eq!((s.standing.clone(), s.observed), (Standing::Complete, true));

        let s = read_with(&p, &[policy_configuration(8)]);
        assert_eq!(
            (s.standing.clone(), s.observed),
            (Standing::Progressing, false)
        );
        let why = s.message.unwrap();
        assert!(
            why.contains("PolicyConfiguration cluster (at generation 8)"),
            "{why}"
        );
        let s = read_with(&p, &[]);
        assert!(s.message.unwrap().contains("deleted"));

        p.metadata.generation = Some(5);
        let s = read_with(&p, &[policy_configuration(7)]);
        assert_eq!(s.standing, Standing::Progressing);
        assert!(s.message.unwrap().contains("generation 5 (it has seen 4)"));

        p.metadata.generation = Some(4);
        let mut checking = seen.clone();
        checking["observed"]["pending"] = json!("checking the signature of node policy oci://r/p");
        p.status = serde_json::from_value(checking).unwrap();
        let s = read_with(&p, &[policy_configuration(7)]);
        assert_eq!((s.standing, s.observed), (Standing::Progressing, true));
        assert!(s.message.unwrap().starts_with("checking the signature"));

        let refused = "node policy oci://r/p refused (Unsigned): no cosign signature";
        let mut degraded = status("apps@2", Some(refused));
        degraded["observed"] = seen["observed"].clone();
        p.status = serde_json::from_value(degraded).unwrap();
        let s = read_with(&p, &[policy_configuration(7)]);
        assert_eq!(
            s.standing,
            Standing::Degraded(refused.into()),
            "every node at the target"
        );
    }

    #[test]
    fn a_pool_selecting_too_many_sets_is_degraded_and_a_bad_selector_is_an_error() {
        let sets: Vec<_> = (0..=pool::MAX_SETS_PER_POOL)
            .map(|i| set(&format!("s{i:03}"), "worker", 1, 1))
            .collect();
        let nodes = [node("n0", "worker", None, None, None)];
        let s = at(&pool(json!({}), &[], Value::Null), &sets, &nodes).unwrap();
        assert!(
            matches!(&s.standing, Standing::Degraded(why) if why.contains("101")),
            "{s:?}"
        );
        let mut bad = pool(json!({}), &[], Value::Null);
        bad.spec.machine_config_selector = serde_json::from_value(json!({
            "matchExpressions": [{"key": "role", "operator": "Near", "values": ["x"]}]
        }))
        .unwrap();
        let e = at(&bad, &sets, &nodes).unwrap_err().to_string();
        assert!(
            e.contains("MachineConfigPool worker") && e.contains("Near"),
            "{e}"
        );
    }
}
