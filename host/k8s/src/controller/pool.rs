//! A pool's reconcile: the sets it selects (written to `spec.pinnedImageSets`), and how far its
//! nodes are (the `PinnedImageSets` synchronizer entry and the Degraded condition).

use super::node_policy::Gate;
use super::status_lane::{PoolStatus, StatusLane};
use super::{Context, ControllerError, RESYNC, observed};
use crate::api::{
    CONDITION_DEGRADED, CONDITION_POLICY_FALLBACK, MachineConfigPool, MachineConfigPoolStatus,
    PoolObserved, PoolSynchronizerStatus, SYNCHRONIZER,
};
use crate::{condition, convert};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use pinset_core::pool::{self, PoolError};
use serde_json::json;
use std::sync::Arc;

pub(super) async fn reconcile(
    mcp: Arc<MachineConfigPool>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    observed(mcp.as_ref(), &ctx, reconcile_pool(&mcp, &ctx)).await
}

async fn reconcile_pool(
    mcp: &MachineConfigPool,
    ctx: &Arc<Context>,
) -> Result<Action, ControllerError> {
    ctx.synced().await;
    let name = mcp.name_any();
    let api: Api<MachineConfigPool> = Api::all(ctx.client.clone());
    let core_pool = match convert::pool(mcp) {
        Ok(p) => p,
        Err(e) => {
            submit_status(ctx, mcp, Report::failed(ctx, mcp, e.to_string()));
            return Ok(Action::await_change());
        }
    };
    let sets = ctx.sets.state();
    tracing::debug!(pool = %name, sets = sets.len(), "reconcile pool");
    let labelled = sets
        .iter()
        .map(|s| (s.metadata.name.as_deref().unwrap_or(""), s.labels()));
    let (selected, failure) = match pool::select_labelled(&core_pool, labelled) {
        Ok(selected) => (selected, None),
        Err(e @ PoolError::TooManySets { .. }) => (None, Some(e.to_string())),
    };
    // After a selection write, the pool as the API returned it: its status is computed against
    // that version, not the cached one the write replaced.
    let mut written = None;
    if let Some(names) = &selected {
        written = write_selection(ctx, &api, mcp, names).await?;
        retrigger_sets(ctx, &name, names);
    }
    let mcp = written.as_ref().unwrap_or(mcp);
    // The sets the pool now holds, at their current generation: node counts and the rollout.
    let target = convert::target_sets(selected.as_deref().unwrap_or_default(), |n| {
        ctx.sets.get(&ObjectRef::new(n))
    });
    let wanted: Vec<(String, i64)> = target.iter().map(|(n, g, _)| (n.clone(), *g)).collect();
    // A change of the pool's node policy rolls out as one more entry of its target.
    let mut target = target;
    // Read before the configuration itself: the status never claims a newer one than it used.
    let policy_observed = ctx.policy_observed();
    let (policy_refused, pending) = node_policy_entry(ctx, &name, &mut target);
    let (members, reports) = members(ctx, &name);
    let sync = pool::sync_status(&name, &wanted, &reports);
    let rollout = super::rollout::step(ctx, mcp, &target, &members, &reports).await?;
    let held = rollout.as_ref().and_then(|r| r.held.clone());
    let report = Report {
        sync: Some(&sync),
        degraded: degraded(failure, held, sync.degraded.clone(), policy_refused),
        rollout,
        refused: pool::policy_refusals(&name, &reports),
        policies: Some(policy_counts(&name, &reports)),
        observed: Some(observed_from(mcp, policy_observed, pending)),
    };
    submit_status(ctx, mcp, report);
    Ok(Action::requeue(RESYNC))
}

/// The pool's MachineConfigNodes, and the reports read from them (same order).
fn members(
    ctx: &Context,
    pool: &str,
) -> (
    Vec<Arc<crate::api::MachineConfigNode>>,
    Vec<pinset_core::pool::NodeReport>,
) {
    let members: Vec<_> = ctx
        .nodes
        .state()
        .into_iter()
        .filter(|n| n.spec.pool.name == pool)
        .collect();
    let reports = members.iter().map(|n| convert::node_report(n)).collect();
    (members, reports)
}

/// Why the pool is degraded, most fundamental first: a selection that failed, else a held
/// rollout and the nodes' failures; a node policy module refused before any grant (the pool
/// cannot reach its configured policy) is said first.
fn degraded(
    failure: Option<String>,
    held: Option<String>,
    nodes: Option<String>,
    policy_refused: Option<String>,
) -> Option<String> {
    let degraded = match (failure, held, nodes) {
        (Some(f), _, _) => Some(f),
        (None, Some(held), Some(d)) => Some(format!("{held}; {d}")),
        (None, held, d) => held.or(d),
    };
    match (degraded, policy_refused) {
        (Some(d), Some(p)) => Some(format!("{p}; {d}")),
        (d, p) => p.or(d),
    }
}

/// What the pool's status is computed from: its generation, the PolicyConfiguration's.
fn observed_from(
    mcp: &MachineConfigPool,
    policy: Option<(String, Option<i64>)>,
    pending: Option<String>,
) -> PoolObserved {
    let (policy_configuration, policy_configuration_generation) = match policy {
        Some((name, generation)) => (Some(name), generation),
        None => (None, None),
    };
    PoolObserved {
        generation: mcp.metadata.generation.unwrap_or_default(),
        policy_configuration,
        policy_configuration_generation,
        pending: pending.map(|p| pinset_core::status::cap(&p, 1024)),
    }
}

/// Add the pool's node policy to its `target` when its signature check passed. Else why it must
/// not be rolled out (refused), or what it waits for (pending): while the check runs (in the
/// background) the module stays out of the target, and the pool is reconciled again when its
/// verdict is in.
fn node_policy_entry(
    ctx: &Context,
    pool: &str,
    target: &mut Vec<(String, i64, u32)>,
) -> (Option<String>, Option<String>) {
    match ctx.node_policy(pool) {
        None => (None, None),
        Some((reference, Gate::Pass)) => {
            target.push((pinset_core::rollout::policy_set(&reference), 1, 0));
            (None, None)
        }
        Some((reference, Gate::Checking)) => {
            tracing::debug!(pool, module = %reference, "node policy signature being checked");
            let pending = format!("checking the signature of node policy {reference}");
            (None, Some(pending))
        }
        Some((reference, Gate::Refused(kind, why))) => {
            let refused = format!(
                "node policy {reference} refused ({}): {why}; {}; every node keeps its module",
                kind.reason(),
                kind.action()
            );
            (Some(refused), None)
        }
    }
}

/// What a pool's status says: node counts, Degraded, the rollout.
pub(super) struct Report<'a> {
    /// `None` when the counts could not be computed (kept as they are).
    sync: Option<&'a pool::PoolSync>,
    degraded: Option<String>,
    rollout: Option<super::rollout::Outcome>,
    /// Nodes that refused the pool's policy module (`None` also when not looked at).
    refused: Option<String>,
    /// Nodes per node policy module (`None` when not looked at: kept as it is).
    policies: Option<Vec<crate::api::PoolPolicy>>,
    /// What it was computed from (`None`: kept as it is).
    observed: Option<PoolObserved>,
}

impl Report<'_> {
    /// The pool cannot be reconciled as it is now: Degraded, for its current generation.
    fn failed(ctx: &Context, mcp: &MachineConfigPool, degraded: String) -> Self {
        Report {
            sync: None,
            degraded: Some(degraded),
            rollout: None,
            refused: None,
            policies: None,
            observed: Some(observed_from(mcp, ctx.policy_observed(), None)),
        }
    }
}

/// Write `spec.pinnedImageSets` when the selection differs from it; the pool as written.
async fn write_selection(
    ctx: &Arc<Context>,
    api: &Api<MachineConfigPool>,
    mcp: &MachineConfigPool,
    names: &[String],
) -> Result<Option<MachineConfigPool>, ControllerError> {
    let name = mcp.name_any();
    let current: Option<Vec<String>> = mcp
        .spec
        .pinned_image_sets
        .as_ref()
        .map(|v| v.iter().map(|s| s.name.clone()).collect());
    let wanted = (!names.is_empty()).then(|| names.to_vec());
    if current == wanted {
        return Ok(None);
    }
    // A merge patch replaces the whole list; the resourceVersion makes a concurrent writer's
    // change a conflict (retried) instead of a lost update.
    let list = wanted
        .as_ref()
        .map(|v| v.iter().map(|n| json!({"name": n})).collect::<Vec<_>>());
    let patch = json!({
        "metadata": {"resourceVersion": mcp.resource_version()},
        "spec": {"pinnedImageSets": list}
    });
    let written = match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => written,
        Err(source) => {
            let err = ControllerError::PoolWrite {
                pool: name.clone(),
                what: "spec.pinnedImageSets",
                source,
            };
            if err.conflict() {
                ctx.metrics.count_api_write_conflict("pool_spec");
            } else {
                // Say why on the pool too; the error itself is retried with backoff.
                submit_status(ctx, mcp, Report::failed(ctx, mcp, err.to_string()));
            }
            return Err(err);
        }
    };
    ctx.metrics.count_api_write("pool_spec");
    tracing::info!(pool = %name, sets = ?names, "pool selection written");
    Ok(Some(written))
}

/// The sets that joined or left the pool get their status recomputed.
fn retrigger_sets(ctx: &Context, pool: &str, names: &[String]) {
    let previous = ctx
        .selections
        .lock()
        .expect("selections lock")
        .insert(pool.to_string(), names.to_vec())
        .unwrap_or_default();
    for set in names
        .iter()
        .filter(|n| !previous.contains(n))
        .chain(previous.iter().filter(|n| !names.contains(n)))
    {
        let _ = ctx.set_triggers.send(ObjectRef::new(set));
    }
}

/// Hand the pool's synchronizer entry, Degraded and PolicyFallback conditions and rollout to
/// the status lane, only when they differ from what the pool says — or will say once the
/// statuses already handed over for this snapshot have landed.
fn submit_status(ctx: &Arc<Context>, mcp: &MachineConfigPool, report: Report<'_>) {
    let name = mcp.name_any();
    let snapshot = mcp.resource_version();
    let status = ctx
        .status_lane
        .baseline(&name, snapshot.as_deref())
        .unwrap_or_else(|| mcp.status.clone().unwrap_or_default());
    let old_entry = status
        .pool_synchronizers_status
        .iter()
        .find(|s| s.pool_synchronizer_type == SYNCHRONIZER);
    let entry = match report.sync {
        Some(s) => Some(entry(s, mcp)),
        None => old_entry.cloned(),
    };
    let conditions = conditions(&status, &report.degraded, &report, mcp);
    let degraded = report.degraded;
    let rollout = match &report.rollout {
        Some(r) => Some(r.rollout.clone()),
        None if report.sync.is_some() => None,
        None => status.rollout.clone(),
    };
    let same_conds = conditions
        .iter()
        .all(|cond| status.conditions.iter().any(|c| condition::same(c, cond)));
    let policies = report
        .policies
        .clone()
        .unwrap_or_else(|| status.policies.clone());
    let observed = report.observed.clone().or_else(|| status.observed.clone());
    if entry.as_ref() == old_entry
        && same_conds
        && rollout == status.rollout
        && policies == status.policies
        && observed == status.observed
    {
        return;
    }
    let was_degraded = status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_DEGRADED && c.status == "True");
    let next = PoolStatus {
        pool: name,
        based_on: snapshot,
        status: MachineConfigPoolStatus {
            pool_synchronizers_status: entry.into_iter().collect(),
            conditions,
            rollout,
            policies,
            observed,
            // OpenShift's fields are not pinset's to write (server-side apply leaves them).
            machine_config: Default::default(),
        },
        newly_degraded: degraded.filter(|_| !was_degraded),
    };
    StatusLane::submit(ctx, next);
}

/// The pool's nodes per node policy module, as its status lists them.
fn policy_counts(
    pool: &str,
    reports: &[pinset_core::pool::NodeReport],
) -> Vec<crate::api::PoolPolicy> {
    pool::policy_counts(pool, reports)
        .into_iter()
        .take(64)
        .map(|c| crate::api::PoolPolicy {
            digest: c.digest,
            module: pinset_core::status::cap(&c.module, 1024),
            name: pinset_core::status::cap(&c.name, 256),
            version: pinset_core::status::cap(&c.version, 256),
            nodes: c.nodes,
        })
        .collect()
}

fn entry(s: &pool::PoolSync, mcp: &MachineConfigPool) -> PoolSynchronizerStatus {
    PoolSynchronizerStatus {
        pool_synchronizer_type: SYNCHRONIZER.into(),
        machine_count: s.machine_count,
        updated_machine_count: s.updated_machine_count,
        ready_machine_count: s.ready_machine_count,
        available_machine_count: s.available_machine_count,
        unavailable_machine_count: s.unavailable_machine_count,
        observed_generation: mcp.metadata.generation,
    }
}

/// Degraded, and PolicyFallback: the fleet policy failed, or nodes refused the pool's policy
/// module (kept as it is when neither was looked at; a pool without target sets asks no fleet
/// policy, which then has not failed).
fn conditions(
    status: &crate::api::MachineConfigPoolStatus,
    degraded: &Option<String>,
    report: &Report<'_>,
    mcp: &MachineConfigPool,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let mut out = vec![condition::make(
        &status.conditions,
        CONDITION_DEGRADED,
        degraded.is_some(),
        if degraded.is_some() {
            "PinnedImageSetsFailed"
        } else {
            "AsExpected"
        },
        degraded.as_deref().unwrap_or(""),
        mcp.metadata.generation,
    )];
    let fleet = report.rollout.as_ref().map(|r| r.fallback.clone());
    let previous = condition::find(&status.conditions, CONDITION_POLICY_FALLBACK);
    let (reason, message) = match (fleet.flatten(), &report.refused) {
        (Some(f), Some(r)) => ("FleetPolicyFailed", Some(format!("{f}; {r}"))),
        (Some(f), None) => ("FleetPolicyFailed", Some(f)),
        (None, Some(r)) => (crate::api::REASON_POLICY_REFUSED, Some(r.clone())),
        (None, None) => ("AsExpected", None),
    };
    // The nodes' reports were read (the counts were computed), or the fleet policy asked.
    let looked = report.sync.is_some() || report.rollout.is_some();
    match (looked, previous) {
        (true, _) => out.push(condition::make(
            &status.conditions,
            CONDITION_POLICY_FALLBACK,
            message.is_some(),
            reason,
            &pinset_core::status::cap(message.as_deref().unwrap_or(""), 8192),
            mcp.metadata.generation,
        )),
        (false, Some(c)) => out.push(c.clone()),
        (false, None) => {}
    }
    out
}
