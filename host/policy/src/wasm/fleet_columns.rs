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
    fw::Nodes {
        strings: c.strings,
        string_starts: c.string_starts,
        names: c.names,
        label_starts: c.label_starts,
        label_keys: c.label_keys,
        label_values: c.label_values,
        ready: c.ready,
        granted: c.granted,
        phase: c.phase.into_iter().map(phase).collect(),
        images_done: c.images_done,
        images_total: c.images_total,
        bytes_done: c.bytes_done,
        bytes_total: c.bytes_total,
        pulling: c.pulling,
        pulling_for_ms: c.pulling_for_ms,
        set_starts: c.set_starts,
        set_names: c.set_names,
        desired_generations: c.desired_generations,
        current_known: c.current_known,
        current_generations: c.current_generations,
        failed_known: c.failed_known,
        failed_generations: c.failed_generations,
        error_known: c.error_known,
        errors: c.errors,
    }
}
