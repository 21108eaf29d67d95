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

fn node(n: wit::Node) -> types::FleetNode {
    types::FleetNode {
        name: n.name,
        labels: n.labels,
        ready: n.ready,
        granted: n.granted,
        phase: match n.phase {
            wit::Phase::Waiting => types::Phase::Waiting,
            wit::Phase::Pulling => types::Phase::Pulling,
            wit::Phase::Done => types::Phase::Done,
            wit::Phase::Failed => types::Phase::Failed,
        },
        progress: types::NodeProgress {
            images_done: n.progress.images_done,
            images_total: n.progress.images_total,
            bytes_done: n.progress.bytes_done,
            bytes_total: n.progress.bytes_total,
            pulling_for_ms: n.progress.pulling_for_ms,
        },
        sets: n
            .sets
            .into_iter()
            .map(|s| types::SetState {
                name: s.name,
                desired_generation: s.desired_generation,
                current_generation: s.current_generation,
                last_failed_generation: s.last_failed_generation,
                last_failed_error: s.last_failed_error,
            })
            .collect(),
    }
}

pub fn grant<F: Fleet + Default>(r: wit::RolloutRequest) -> wit::RolloutGrant {
    let request = types::RolloutRequest {
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
        nodes: r.nodes.into_iter().map(node).collect(),
    };
    let g = F::default().grant(&request);
    wit::RolloutGrant {
        nodes: g.nodes,
        max_pulls: g.max_pulls,
        reason: g.reason,
    }
}
