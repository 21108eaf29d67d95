//! From Kubernetes objects to the core's types.

use crate::api::{CONDITION_DEGRADED, MachineConfigNode, MachineConfigPool, PinnedImageSet};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use kube::ResourceExt;
use pinset_core::desired::{self, NodeInfo, Pool};
use pinset_core::pool::NodeReport;
use pinset_core::quantity::parse_bytes;
use pinset_core::selector::{LabelSelector, Operator, Requirement};
use pinset_core::status::{Progress, RejectedPolicy, RunningPolicy, SetStatus};

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(
        "{kind} {name}: {field}: operator {operator:?} is not one of In, NotIn, Exists, DoesNotExist"
    )]
    Operator {
        kind: &'static str,
        name: String,
        field: &'static str,
        operator: String,
    },
    #[error("Node {name}: status.allocatable.ephemeral-storage: {why}")]
    Allocatable { name: String, why: String },
}

fn selector(
    sel: Option<&meta::LabelSelector>,
    kind: &'static str,
    name: &str,
    field: &'static str,
) -> Result<LabelSelector, ConvertError> {
    let Some(sel) = sel else {
        return Ok(LabelSelector::default());
    };
    let mut out = LabelSelector {
        match_labels: sel.match_labels.clone().unwrap_or_default(),
        match_expressions: Vec::new(),
    };
    for e in sel.match_expressions.iter().flatten() {
        let operator = match e.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => {
                return Err(ConvertError::Operator {
                    kind,
                    name: name.into(),
                    field,
                    operator: other.into(),
                });
            }
        };
        out.match_expressions.push(Requirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone().unwrap_or_default(),
        });
    }
    Ok(out)
}

pub fn set(s: &PinnedImageSet) -> desired::PinnedImageSet {
    desired::PinnedImageSet {
        name: s.name_any(),
        generation: s.metadata.generation.unwrap_or(1).max(1),
        labels: s.labels().clone(),
        images: s
            .spec
            .pinned_images
            .iter()
            .map(|i| i.name.clone())
            .collect(),
    }
}

/// A pool's target: each of `names` (the sets it selects) that exists, with its generation and
/// image count, as the rollout and the node counts see it.
pub fn target_sets<S: std::ops::Deref<Target = PinnedImageSet>>(
    names: &[String],
    set: impl Fn(&str) -> Option<S>,
) -> Vec<(String, i64, u32)> {
    names
        .iter()
        .filter_map(|n| {
            set(n).map(|s| {
                let generation = s.metadata.generation.unwrap_or(1).max(1);
                (n.clone(), generation, s.spec.pinned_images.len() as u32)
            })
        })
        .collect()
}

/// The pool as the node sees it (with the controller's `spec.pinnedImageSets` when written).
pub fn pool(p: &MachineConfigPool) -> Result<Pool, ConvertError> {
    let name = p.name_any();
    Ok(Pool {
        machine_config_selector: selector(
            p.spec.machine_config_selector.as_ref(),
            "MachineConfigPool",
            &name,
            "spec.machineConfigSelector",
        )?,
        node_selector: selector(
            p.spec.node_selector.as_ref(),
            "MachineConfigPool",
            &name,
            "spec.nodeSelector",
        )?,
        pinned_image_sets: p
            .spec
            .pinned_image_sets
            .as_ref()
            .map(|v| v.iter().map(|s| s.name.clone()).collect()),
        name,
    })
}

/// What a MachineConfigNode reports, for the controller.
pub fn node_report(n: &MachineConfigNode) -> NodeReport {
    let status = n.status.clone().unwrap_or_default();
    NodeReport {
        name: n.name_any(),
        pool: n.spec.pool.name.clone(),
        sets: status
            .pinned_image_sets
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    SetStatus {
                        name: s.name.clone(),
                        desired_generation: s.desired_generation,
                        current_generation: s.current_generation,
                        last_failed_generation: s.last_failed_generation,
                        last_failed_generation_error: s.last_failed_generation_error.clone(),
                    },
                )
            })
            .collect(),
        degraded: status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_DEGRADED && c.status == "True")
            .map(|c| c.message.clone()),
        policy_refused: status
            .conditions
            .iter()
            .find(|c| {
                c.type_ == crate::api::CONDITION_POLICY_FALLBACK
                    && c.status == "True"
                    && c.reason == crate::api::REASON_POLICY_REFUSED
            })
            .map(|c| c.message.clone()),
        policy: status.policy.as_ref().map(|p| RunningPolicy {
            name: p.name.clone(),
            version: p.version.clone(),
            digest: p.digest.clone(),
            module_digest: p.module_digest.clone().unwrap_or_else(|| p.digest.clone()),
            module: p.module.clone(),
            since: p.since.0.to_string(),
            probation: p.probation,
        }),
        policy_rejected: status.policy_rejected.as_ref().map(|r| RejectedPolicy {
            module: r.module.clone(),
            reason: r.reason.clone(),
            cause: r.cause.clone(),
            since: r.since.0.to_string(),
        }),
    }
}

/// A rollout grant as the core knows it.
pub fn grant(g: &crate::api::RolloutGrant) -> pinset_core::rollout::RolloutGrant {
    pinset_core::rollout::RolloutGrant {
        sets: g
            .sets
            .iter()
            .map(|s| (s.name.clone(), s.generation))
            .collect(),
        max_pulls: g.max_pulls,
    }
}

/// A node of a pool for the fleet decision, from its MachineConfigNode and the report already
/// read from it ([`node_report`]).
pub fn member(n: &MachineConfigNode, report: &NodeReport) -> pinset_core::rollout::Member {
    let status = n.status.as_ref();
    let node_state = status.and_then(|s| s.node_state.as_ref());
    let progressing_since_ms = status
        .into_iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == crate::api::CONDITION_PROGRESSING && c.status == "True")
        .and_then(|c| u64::try_from(c.last_transition_time.0.as_millisecond()).ok());
    pinset_core::rollout::Member {
        name: report.name.clone(),
        labels: node_state.map(|s| s.labels.clone()).unwrap_or_default(),
        ready: node_state.is_some_and(|s| s.ready),
        grant: n.spec.rollout_grant.as_ref().map(grant),
        sets: {
            let mut sets = report.sets.clone();
            pinset_core::rollout::add_policy_states(
                &mut sets,
                // A module on probation has not decided a whole reconcile yet: not done.
                report
                    .policy
                    .as_ref()
                    .filter(|p| !p.probation)
                    .map(|p| p.module.as_str()),
                report
                    .policy_rejected
                    .as_ref()
                    .map(|r| (r.module.as_str(), r.cause.as_str())),
            );
            sets
        },
        progress: status
            .and_then(|s| s.pinned_image_progress.as_ref())
            .map(|p| Progress {
                images_done: p.images_done,
                images_total: p.images_total,
                bytes_done: p.bytes_done,
                bytes_total: p.bytes_total,
            }),
        progressing_since_ms,
    }
}

/// Node facts from a Node object (from the API or a YAML file).
pub fn node(n: &Node) -> Result<NodeInfo, ConvertError> {
    let name = n.name_any();
    let status = n.status.as_ref();
    let condition = |t: &str| {
        status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == t))
            .map(|c| c.status == "True")
    };
    let allocatable = status
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get("ephemeral-storage"));
    let allocatable_ephemeral_bytes = match allocatable {
        Some(q) => Some(parse_bytes(&q.0).map_err(|e| ConvertError::Allocatable {
            name: name.clone(),
            why: e.to_string(),
        })?),
        None => None,
    };
    Ok(NodeInfo {
        labels: n.labels().clone(),
        ready: condition("Ready").unwrap_or(false),
        disk_pressure: condition("DiskPressure").unwrap_or(false),
        allocatable_ephemeral_bytes,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_and_sets_read_as_the_core_reads_yaml() {
        let p: MachineConfigPool = serde_saphyr::from_str(
            r#"
apiVersion: machineconfiguration.openshift.io/v1
kind: MachineConfigPool
metadata: {name: infra}
spec:
  machineConfigSelector:
    matchExpressions:
      - {key: machineconfiguration.openshift.io/role, operator: In, values: [worker, infra]}
  nodeSelector:
    matchLabels: {node-role.kubernetes.io/infra: ""}
  paused: false
"#,
        )
        .unwrap();
        let core = pool(&p).unwrap();
        assert_eq!(core.name, "infra");
        assert_eq!(
            core.machine_config_selector.match_expressions[0].values,
            vec!["worker", "infra"]
        );
        assert!(
            core.node_selector
                .matches(&[("node-role.kubernetes.io/infra".to_string(), String::new())].into())
        );
        assert_eq!(core.pinned_image_sets, None);

        let mut bad = p.clone();
        bad.spec.node_selector.as_mut().unwrap().match_expressions =
            Some(vec![meta::LabelSelectorRequirement {
                key: "k".into(),
                operator: "Gt".into(),
                values: None,
            }]);
        let e = pool(&bad).unwrap_err().to_string();
        assert_eq!(
            e,
            "MachineConfigPool infra: spec.nodeSelector: operator \"Gt\" is not one of In, NotIn, \
             Exists, DoesNotExist"
        );
    }

    #[test]
    fn api_nodes_read_like_node_files() {
        let n: Node = serde_saphyr::from_str(
            r#"
metadata: {name: w1, labels: {node-role.kubernetes.io/worker: ""}}
status:
  allocatable: {ephemeral-storage: 100Gi}
  conditions:
    - {type: Ready, status: "True"}
"#,
        )
        .unwrap();
        let info = node(&n).unwrap();
        assert_eq!(info.name, "w1");
        assert!(info.ready && !info.disk_pressure);
        assert_eq!(info.allocatable_ephemeral_bytes, Some(100 << 30));
    }
}
