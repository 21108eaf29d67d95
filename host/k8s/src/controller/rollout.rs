//! A pool's fleet rollout: the state of its nodes against its target, the fleet policy asked
//! when that state changes, grants recorded on the nodes' MachineConfigNodes, Events.
//!
//! The rules are the core's (`pinset_core::rollout`) and the policy's; this module reads the
//! caches, calls the guarded policy off the async runtime, and writes only new grants. Grants
//! live in the API (each node's `spec.rolloutGrant`, owned by the controller's field manager),
//! so a restarted controller finds them where it left them: it neither grants a node twice nor
//! loses count.

use super::{Context, ControllerError, FIELD_MANAGER};
use crate::api::{MachineConfigNode, MachineConfigPool, PoolRollout};
use crate::convert;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::Event;
use kube::runtime::reflector::ObjectRef;
use pinset_core::pool::NodeReport;
use pinset_core::rollout::{self, Counts, RolloutGrant};
use pinset_policy::{Decided, FleetContract, FleetModule, Guarded, Native};
use pinset_policy_sdk::{Phase, RolloutRequest};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// The fleet policy of each pool; pools without their own use the default.
#[derive(Clone)]
pub struct FleetTable {
    pub default: FleetModule,
    pub by_pool: BTreeMap<String, FleetModule>,
}

impl FleetTable {
    /// Every pool with the embedded default module's fleet policy.
    pub fn embedded(
        runtime: &pinset_policy::WasmRuntime,
    ) -> Result<Self, pinset_policy::LoadError> {
        Ok(Self {
            default: runtime.load_as::<pinset_policy::FleetContract>(
                pinset_policy::EMBEDDED_DEFAULT_NAME,
                pinset_policy::EMBEDDED_DEFAULT,
                None,
                pinset_policy::Limits::default(),
            )?,
            by_pool: BTreeMap::new(),
        })
    }

    pub fn for_pool(&self, pool: &str) -> &FleetModule {
        self.by_pool.get(pool).unwrap_or(&self.default)
    }
}

/// What the controller remembers of each pool's rollout: its last fleet decision with the state
/// it was made for, and the grants it wrote that its cache may not show yet.
#[derive(Default)]
pub(super) struct Decisions(Mutex<HashMap<String, PoolMemory>>);

#[derive(Default)]
struct PoolMemory {
    last: Option<(u64, Decided)>,
    written: BTreeMap<String, rollout::Written>,
    /// The pool was paused at its last step.
    paused: bool,
    /// The node policy entry last announced as rolled out to every node.
    rolled_out: Option<String>,
}

impl Decisions {
    fn with<T>(&self, pool: &str, f: impl FnOnce(&mut PoolMemory) -> T) -> T {
        let mut pools = self.0.lock().expect("decisions lock");
        f(pools.entry(pool.to_string()).or_default())
    }

    /// The pool's last decision, when it was made for `fingerprint`.
    fn last(&self, pool: &str, fingerprint: u64) -> Option<Decided> {
        self.with(pool, |m| {
            m.last
                .as_ref()
                .filter(|(seen, _)| *seen == fingerprint)
                .map(|(_, d)| d.clone())
        })
    }

    /// The members as the API has them once every grant written has landed.
    fn overlay(&self, pool: &str, members: &mut [rollout::Member]) {
        self.with(pool, |m| {
            rollout::overlay_written(members, &mut m.written, crate::now_ms())
        });
    }

    /// Record whether the pool is paused; whether that changed since its last step (a restarted
    /// controller sees a paused pool change once).
    fn pause_changed(&self, pool: &str, paused: bool) -> bool {
        self.with(pool, |m| std::mem::replace(&mut m.paused, paused) != paused)
    }

    /// Forget the pools `exists` no longer knows.
    fn prune(&self, exists: impl Fn(&str) -> bool) {
        self.0
            .lock()
            .expect("decisions lock")
            .retain(|pool, _| exists(pool));
    }
}

/// What a pool's status says of its rollout.
pub(super) struct Outcome {
    pub rollout: PoolRollout,
    /// The fleet policy failed and the default answered: why.
    pub fallback: Option<String>,
    /// The canary failed and the pool holds: why (for Degraded).
    pub held: Option<String>,
}

/// One step of the pool's rollout for `target` (name, generation, images of each set), over the
/// pool's MachineConfigNodes and the reports read from them (same order).
pub(super) async fn step(
    ctx: &Context,
    mcp: &MachineConfigPool,
    target: &[(String, i64, u32)],
    nodes: &[Arc<MachineConfigNode>],
    reports: &[NodeReport],
) -> Result<Option<Outcome>, ControllerError> {
    let pool = mcp.name_any();
    if target.is_empty() {
        return Ok(None);
    }
    let mut members: Vec<rollout::Member> = nodes
        .iter()
        .zip(reports)
        .map(|(n, report)| convert::member(n, report))
        .collect();
    ctx.decisions.overlay(&pool, &mut members);
    let annotations = mcp.annotations().clone();
    let (max_pulling, bad_ceiling) = rollout::max_pulling(&annotations, members.len())
        .map_or_else(|e| (None, Some(e)), |m| (m, None));
    let (paused, bad_pause) = rollout::paused(&annotations);
    let mut request = rollout::request(
        &pool,
        &annotations,
        max_pulling,
        rollout::target(target),
        &members,
        crate::now_ms(),
    );
    let (decided, fresh) = decide_unless_paused(ctx, &pool, &request, paused).await;
    if ctx.decisions.pause_changed(&pool, paused) {
        announce_pause(ctx, &pool, paused, &decided.grant.reason);
    }
    let added = grant(ctx, &pool, &mut request, &decided).await?;
    let counts = rollout::counts(&request);
    ctx.metrics.observe_pool_rollout(&pool, &counts);
    ctx.metrics.observe_pool_paused(&pool, paused);
    announce_policy(ctx, &pool, &request, &counts);
    let held = rollout::held(&decided.grant);
    if fresh {
        announce(ctx, &pool, &request, &added, &decided, held.as_deref());
    }
    let mut reason = decided.grant.reason.clone();
    for bad in [bad_ceiling, bad_pause].into_iter().flatten() {
        reason = format!("{reason}; MachineConfigPool {pool}: {bad}");
    }
    Ok(Some(Outcome {
        rollout: status(&request, &counts, &decided.policy, reason),
        fallback: decided.fallback.as_ref().map(|f| f.message.clone()),
        held,
    }))
}

/// Write the grants `decided` adds, at once: each node starts as soon as its own lands. One
/// that fails fails the reconcile; the ones written stand and are read back on the retry. The
/// nodes granted, now marked so in `request`.
async fn grant(
    ctx: &Context,
    pool: &str,
    request: &mut RolloutRequest,
    decided: &Decided,
) -> Result<Vec<usize>, ControllerError> {
    let added = rollout::newly_granted(request, &decided.grant.nodes);
    let writes = added
        .iter()
        .map(|&i| write_grant(ctx, pool, request, i, decided));
    futures::future::try_join_all(writes).await?;
    for &i in &added {
        request.nodes[i].granted = true;
        request.nodes[i].phase = Phase::Pulling;
    }
    if !added.is_empty() {
        ctx.metrics.count_rollout_wave(pool);
    }
    Ok(added)
}

/// A paused pool is not asked: it grants no one, whatever its policy would say.
async fn decide_unless_paused(
    ctx: &Context,
    pool: &str,
    request: &RolloutRequest,
    paused: bool,
) -> (Decided, bool) {
    if !paused {
        return decide(ctx, pool, request).await;
    }
    let decided = Decided {
        grant: rollout::paused_grant(request),
        policy: ctx.fleet.flagged(pool).name().to_string(),
        fallback: None,
    };
    (decided, false)
}

/// The pool's last decision when its state has not changed since; else the policy's answer.
/// The call runs on a blocking thread: it is bounded by the module's deadline, but it is CPU.
async fn decide(ctx: &Context, pool: &str, request: &RolloutRequest) -> (Decided, bool) {
    let chosen = ctx.fleet.for_pool(&ctx.policy_config(), pool, request);
    // A decision is kept for the state it was made for and the module that made it: a new
    // module is asked at once, and grants already written stand.
    let fingerprint = rollout::fingerprint(request) ^ module_key(&chosen.module);
    if let Some(decided) = ctx.decisions.last(pool, fingerprint) {
        return (decided, false);
    }
    let module = chosen.module;
    let metrics: Arc<dyn pinset_policy::Observer> = Arc::new(ctx.metrics.clone());
    let owned = request.clone();
    let mut decided = tokio::task::spawn_blocking(move || {
        Guarded::of(&module).with_observer(metrics).grant(&owned)
    })
    .await
    .unwrap_or_else(|e| {
        // A panic in the host's own code: answer as the default policy would.
        tracing::error!(pool, error = %e, "fleet decision task failed");
        Guarded::<FleetContract>::new(Box::new(Native::reference())).grant(request)
    });
    if let Some(refused) = chosen.refused {
        // The configuration's module was refused: the pool's PolicyFallback condition says so.
        decided.fallback = Some(pinset_policy::Fallback {
            hook: pinset_policy::Hook::Grant,
            kind: "refused",
            message: refused,
        });
    }
    tracing::info!(
        pool,
        policy = %decided.policy,
        granted = ?decided.grant.nodes,
        reason = %decided.grant.reason,
        "fleet decision"
    );
    ctx.decisions
        .with(pool, |m| m.last = Some((fingerprint, decided.clone())));
    ctx.decisions
        .prune(|p| ctx.pools.get(&ObjectRef::new(p)).is_some());
    (decided, true)
}

/// What tells modules apart in a decision's fingerprint.
fn module_key(module: &FleetModule) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    module.sha256().hash(&mut h);
    h.finish()
}

/// Record node `i`'s grant for the target on its MachineConfigNode.
async fn write_grant(
    ctx: &Context,
    pool: &str,
    request: &RolloutRequest,
    i: usize,
    decided: &Decided,
) -> Result<(), ControllerError> {
    let node = &request.nodes[i].name;
    let grant = RolloutGrant::for_target(&request.target, decided.grant.max_pulls);
    let spec = crate::api::RolloutGrant {
        sets: grant
            .sets
            .iter()
            .map(|(name, generation)| crate::api::GrantedSet {
                name: name.clone(),
                generation: *generation,
            })
            .collect(),
        max_pulls: grant.max_pulls,
        reason: Some(pinset_core::status::cap(&decided.grant.reason, 4000)),
    };
    let api: Api<MachineConfigNode> = Api::all(ctx.client.clone());
    let value = json!({"rolloutGrant": spec});
    crate::apply::node_part(&api, node, FIELD_MANAGER, "spec", value)
        .await
        .map_err(|source| ControllerError::GrantWrite {
            node: node.clone(),
            pool: pool.to_string(),
            source,
        })?;
    ctx.metrics.count_api_write("node_grant");
    ctx.decisions.with(pool, |m| {
        let written = rollout::Written {
            grant,
            at_ms: crate::now_ms(),
        };
        m.written.insert(node.clone(), written)
    });
    tracing::info!(pool, node = %node, "rollout grant written");
    Ok(())
}

/// Events for a fresh decision: a wave started, or the canary failed. They are recorded in the
/// status lane, behind the grants: the next pool's grants do not wait for them.
fn announce(
    ctx: &Context,
    pool: &str,
    request: &RolloutRequest,
    added: &[usize],
    decided: &Decided,
    held: Option<&str>,
) {
    let mut events = Vec::new();
    if !added.is_empty() {
        let names: Vec<&str> = added
            .iter()
            .map(|&i| request.nodes[i].name.as_str())
            .collect();
        let note = format!("granted {}: {}", names.join(", "), decided.grant.reason);
        events.push(crate::events::ROLLOUT_WAVE.event(&note));
    }
    if let Some(why) = held {
        events.push(crate::events::ROLLOUT_HELD.event(why));
    }
    if let Some(f) = &decided.fallback {
        events.push(crate::events::POOL_POLICY_FALLBACK.event(&f.message));
    }
    record(ctx, pool, events);
}

/// `PolicyRolledOut` on the pool, once, when every node decides with the module its target
/// names.
fn announce_policy(ctx: &Context, pool: &str, request: &RolloutRequest, counts: &Counts) {
    let Some(entry) = request
        .target
        .sets
        .iter()
        .find(|s| rollout::is_policy_set(&s.name))
    else {
        return;
    };
    let everywhere = !request.nodes.is_empty() && counts.done as usize == request.nodes.len();
    let new = ctx.decisions.with(pool, |m| {
        let new = everywhere && m.rolled_out.as_ref() != Some(&entry.name);
        if new {
            m.rolled_out = Some(entry.name.clone());
        }
        new
    });
    if !new {
        return;
    }
    let note = format!(
        "every node of pool {pool} ({}) decides with node policy {}",
        request.nodes.len(),
        entry.name.trim_start_matches(rollout::POLICY_SET_PREFIX)
    );
    record(
        ctx,
        pool,
        vec![crate::events::POLICY_ROLLED_OUT.event(&note)],
    );
}

/// An Event when the pool's rollout is paused or resumed, in the status lane like [`announce`].
fn announce_pause(ctx: &Context, pool: &str, paused: bool, reason: &str) {
    let event = if paused {
        crate::events::ROLLOUT_PAUSED.event(reason)
    } else {
        let note = format!(
            "the pause ({}) is lifted: the fleet policy grants again",
            rollout::PAUSED_ANNOTATION
        );
        crate::events::ROLLOUT_RESUMED.event(&note)
    };
    record(ctx, pool, vec![event]);
}

/// Record `events` on the pool in the status lane: behind the grants, which do not wait for them.
fn record(ctx: &Context, pool: &str, events: Vec<Event>) {
    if events.is_empty() {
        return;
    }
    let (client, pool) = (ctx.client.clone(), pool.to_string());
    ctx.status_lane.background(async move {
        crate::events::record::<MachineConfigPool>(client, FIELD_MANAGER, None, &pool, &events)
            .await;
    });
}

fn status(request: &RolloutRequest, counts: &Counts, policy: &str, reason: String) -> PoolRollout {
    PoolRollout {
        target: rollout::target_label(&request.target),
        granted: counts.granted,
        pulling: counts.pulling,
        done: counts.done,
        failed: counts.failed,
        waiting: counts.waiting,
        policy: policy.to_string(),
        reason: pinset_core::status::cap(&reason, 4000),
    }
}
