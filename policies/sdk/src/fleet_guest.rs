//! Glue between the generated fleet bindings and [`crate::Fleet`] (wasm32, feature `fleet`).

use crate::fleet_bindings::pinset::fleet::{host, types as wit};
use crate::{Fleet, fleet as types};

pub fn log(level: crate::Level, message: &str) {
    let level = match level {
        crate::Level::Debug => wit::Level::Debug,
        crate::Level::Info => wit::Level::Info,
        crate::Level::Warn => wit::Level::Warn,
        crate::Level::Error => wit::Level::Error,
    };
    host::log(level, message);
}

pub fn info<F: Fleet + Default>() -> wit::PolicyInfo {
    let i = F::default().info();
    wit::PolicyInfo {
        name: i.name,
        version: i.version,
        description: i.description,
    }
}

/// The columns as they arrived: moved, not copied (the phases mapped to the SDK's enum).
fn nodes(c: wit::Nodes) -> crate::Nodes {
    crate::Nodes {
        strings: c.strings,
        string_starts: c.string_starts,
        names: c.names,
        label_starts: c.label_starts,
        label_keys: c.label_keys,
        label_values: c.label_values,
        ready: c.ready,
        granted: c.granted,
        phase: c
            .phase
            .into_iter()
            .map(|p| match p {
                wit::Phase::Waiting => types::Phase::Waiting,
                wit::Phase::Pulling => types::Phase::Pulling,
                wit::Phase::Done => types::Phase::Done,
                wit::Phase::Failed => types::Phase::Failed,
            })
            .collect(),
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

pub fn grant<F: Fleet + Default>(r: wit::RolloutRequest) -> wit::RolloutGrant {
    let rollout = crate::Rollout {
        pool: types::FleetPool {
            name: r.pool.name,
            annotations: r.pool.annotations,
            max_pulling: r.pool.max_pulling,
        },
        target: types::Target {
            sets: r
                .target
                .sets
                .into_iter()
                .map(|s| types::TargetSet {
                    name: s.name,
                    generation: s.generation,
                    images: s.images,
                    bytes: s.bytes,
                })
                .collect(),
            images: r.target.images,
            bytes: r.target.bytes,
        },
        nodes: nodes(r.nodes),
    };
    let g = F::default().grant(&rollout);
    wit::RolloutGrant {
        nodes: g.nodes,
        max_pulls: g.max_pulls,
        reason: g.reason,
    }
}
