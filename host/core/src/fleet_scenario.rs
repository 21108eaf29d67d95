//! The offline format of a fleet scenario: a pool's nodes in given states, and the grant a
//! fleet policy must answer. `pinset policy test` runs them next to node scenarios; a file is a
//! fleet scenario when it has a top-level `fleet:` key.
//!
//! ```yaml
//! name: the canary goes first
//! fleet:
//!   pool: {name: worker, annotations: {pinset.io/rollout-max-pulling: "2"}}
//!   target: [{name: apps, generation: 2, images: 3}]
//!   nodes:
//!     - {name: w-0, labels: {topology.kubernetes.io/zone: a}}
//!     - {name: w-1, phase: done}
//! expect:
//!   grant: [w-0]
//!   reasonContains: canary
//! ```

use crate::diff::Diff;
use crate::scenario::{Outcome, ScenarioError};
use pinset_policy_sdk::{
    FleetNode, FleetPool, Grant, NodeProgress, Phase, RolloutRequest, SetState,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FleetScenario {
    pub name: String,
    pub description: Option<String>,
    pub fleet: FleetSpec,
    #[serde(default)]
    pub expect: FleetExpect,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FleetSpec {
    pub pool: PoolSpec,
    pub target: Vec<TargetSpec>,
    pub nodes: Vec<NodeSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolSpec {
    pub name: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TargetSpec {
    pub name: String,
    pub generation: i64,
    #[serde(default)]
    pub images: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PhaseName {
    Waiting,
    Pulling,
    Done,
    Failed,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeSpec {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default = "yes")]
    pub ready: bool,
    /// Defaults to true for pulling nodes, false otherwise.
    pub granted: Option<bool>,
    #[serde(default = "waiting")]
    pub phase: PhaseName,
    /// The error of a failed node.
    pub error: Option<String>,
}

fn yes() -> bool {
    true
}

fn waiting() -> PhaseName {
    PhaseName::Waiting
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct FleetExpect {
    /// Names of the nodes granted now, in any order.
    pub grant: Option<Vec<String>>,
    pub max_pulls: Option<u32>,
    pub reason_contains: Option<String>,
    /// The answer must be the default fleet policy's, after the policy failed.
    pub fallback: Option<bool>,
}

/// A fleet scenario ready to run.
pub struct LoadedFleet {
    pub name: String,
    pub path: PathBuf,
    pub request: RolloutRequest,
    pub expect: FleetExpect,
}

/// Whether `text` is a fleet scenario (a top-level `fleet:` key).
pub fn is_fleet(text: &str) -> bool {
    text.lines().any(|l| l.starts_with("fleet:"))
}

pub fn load(path: &Path, text: &str) -> Result<LoadedFleet, ScenarioError> {
    let (scenario, _): (FleetScenario, _) =
        crate::yaml::from_str(text, crate::yaml::Fields::Strict).map_err(|error| {
            ScenarioError::Parse {
                path: path.into(),
                error,
            }
        })?;
    let spec = scenario.fleet;
    let max_pulling = crate::rollout::max_pulling(&spec.pool.annotations, spec.nodes.len())
        .map_err(|why| ScenarioError::Invalid {
            path: path.into(),
            why,
        })?;
    let mut nodes: Vec<FleetNode> = spec
        .nodes
        .into_iter()
        .map(|n| node(n, &spec.target))
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let target = crate::rollout::target(
        &spec
            .target
            .iter()
            .map(|t| (t.name.clone(), t.generation, t.images))
            .collect::<Vec<_>>(),
    );
    Ok(LoadedFleet {
        name: scenario.name,
        path: path.into(),
        request: RolloutRequest {
            pool: FleetPool {
                name: spec.pool.name,
                annotations: spec.pool.annotations.into_iter().collect(),
                max_pulling,
            },
            target,
            nodes,
        },
        expect: scenario.expect,
    })
}

fn node(n: NodeSpec, target: &[TargetSpec]) -> FleetNode {
    let phase = match n.phase {
        PhaseName::Waiting => Phase::Waiting,
        PhaseName::Pulling => Phase::Pulling,
        PhaseName::Done => Phase::Done,
        PhaseName::Failed => Phase::Failed,
    };
    let sets = target
        .iter()
        .map(|t| SetState {
            name: t.name.clone(),
            desired_generation: t.generation,
            current_generation: (phase == Phase::Done).then_some(t.generation),
            last_failed_generation: (phase == Phase::Failed).then_some(t.generation),
            last_failed_error: (phase == Phase::Failed)
                .then(|| n.error.clone().unwrap_or_else(|| "failed".into())),
        })
        .collect();
    FleetNode {
        name: n.name,
        labels: n.labels.into_iter().collect(),
        ready: n.ready,
        granted: n
            .granted
            .unwrap_or(matches!(phase, Phase::Pulling | Phase::Failed)),
        phase,
        progress: NodeProgress::default(),
        sets,
    }
}

/// Run one fleet scenario: `grant` answers with the grant and whether it fell back.
pub fn run(loaded: &LoadedFleet, grant: impl FnOnce(&RolloutRequest) -> (Grant, bool)) -> Outcome {
    let (answer, fell_back) = grant(&loaded.request);
    let mut diffs = Vec::new();
    let e = &loaded.expect;
    if let Some(want) = &e.grant {
        let mut got: Vec<String> = answer
            .nodes
            .iter()
            .filter_map(|&i| loaded.request.nodes.get(i as usize))
            .map(|n| n.name.clone())
            .collect();
        let mut want = want.clone();
        got.sort();
        want.sort();
        if got != want {
            diffs.push(
                Diff::new("grant", want, got).with_note(format!("reason: {}", answer.reason)),
            );
        }
    }
    if e.max_pulls.is_some() && e.max_pulls != answer.max_pulls {
        diffs.push(Diff::new("maxPulls", e.max_pulls, answer.max_pulls));
    }
    if let Some(part) = &e.reason_contains
        && !answer.reason.contains(part.as_str())
    {
        diffs.push(Diff::new("reason contains", part, &answer.reason));
    }
    if let Some(want) = e.fallback
        && want != fell_back
    {
        diffs.push(Diff::new("fallback", want, fell_back));
    }
    Outcome {
        name: loaded.name.clone(),
        path: loaded.path.clone(),
        diffs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANARY: &str = "name: canary\nfleet:\n  pool: {name: worker}\n  target: [{name: apps, generation: 2, images: 3}]\n  nodes:\n    - {name: w-1}\n    - {name: w-0, phase: done}\nexpect:\n  grant: [w-1]\n  reasonContains: canary\n";

    #[test]
    fn a_fleet_scenario_reads_and_judges_an_answer() {
        assert!(is_fleet(CANARY));
        let loaded = load(Path::new("c.yaml"), CANARY).unwrap();
        assert_eq!(loaded.request.nodes[0].name, "w-0", "sorted by name");
        assert_eq!(loaded.request.nodes[0].sets[0].current_generation, Some(2));
        let pass = run(&loaded, |_| (Grant::new(vec![1], "canary: w-1"), false));
        assert!(pass.passed(), "{:?}", pass.diffs);
        let fail = run(&loaded, |_| (Grant::new(vec![0, 1], "all"), false));
        assert_eq!(fail.diffs.len(), 2, "{:?}", fail.diffs);
    }

    #[test]
    fn unknown_fields_are_refused_with_their_place() {
        let bad = CANARY.replace("phase: done", "phase: done, zone: a");
        let err = load(Path::new("c.yaml"), &bad).err().unwrap().to_string();
        assert!(err.contains("c.yaml") && err.contains("zone"), "{err}");
    }
}
