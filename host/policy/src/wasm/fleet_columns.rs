//! A rollout as the fleet contract passes it: the SDK's columns (`pinset_policy_sdk::Nodes`)
//! handed over as they are, a few dozen copies whatever the pool's size.

use super::fleet_bindings::pinset::fleet::types as fw;
use pinset_policy_sdk as sdk;

/// The contract's form of `r`.
pub(super) fn request(r: &sdk::RolloutRequest) -> fw::RolloutRequest {
    let sdk::Rollout {
        pool,
        target,
        nodes,
    } = sdk::Rollout::from(r);
    fw::RolloutRequest {
        pool: fw::Pool {
            name: pool.name,
            annotations: pool.annotations,
            max_pulling: pool.max_pulling,
        },
        target: fw::Target {
            sets: target
                .sets
                .into_iter()
                .map(|s| fw::TargetSet {
                    name: s.name,
                    generation: s.generation,
                    images: s.images,
                    bytes: s.bytes,
                })
                .collect(),
            images: target.images,
            bytes: target.bytes,
        },
        nodes: columns(nodes),
    }
}

fn phase(p: sdk::Phase) -> fw::Phase {
    match p {
        sdk::Phase::Waiting => fw::Phase::Waiting,
        sdk::Phase::Pulling => fw::Phase::Pulling,
        sdk::Phase::Done => fw::Phase::Done,
        sdk::Phase::Failed => fw::Phase::Failed,
    }
}

fn columns(c: sdk::Nodes) -> fw::Nodes {
    pinset_policy_sdk::move_node_columns!(c, fw::Nodes, phase)
}
