//! Glue between the generated fleet bindings and [`crate::Fleet`] (wasm32, feature `fleet`).

use crate::fleet_bindings::pinset::fleet::{host, types as wit};
use crate::{Fleet, fleet as types};

host_log!();

pub fn info<F: Fleet + Default>() -> wit::PolicyInfo {
    let i = F::default().info();
    wit::PolicyInfo {
        name: i.name,
        version: i.version,
        description: i.description,
    }
}

/// The contract's columns moved into a [`crate::Nodes`] (from [`crate::node_columns!`]), the
/// phases mapped to the SDK's enum.
macro_rules! move_nodes {
    ([$c:ident] { $($a:ident: $ao:ty => $ab:ty, $aw:literal;)* } { $($b:ident: $bo:ty => $bb:ty, $bw:literal;)* }) => {
        crate::Nodes {
            $($a: $c.$a,)*
            phase: $c.phase.into_iter().map(phase).collect(),
            $($b: $c.$b,)*
        }
    };
}

fn phase(p: wit::Phase) -> types::Phase {
    match p {
        wit::Phase::Waiting => types::Phase::Waiting,
        wit::Phase::Pulling => types::Phase::Pulling,
        wit::Phase::Done => types::Phase::Done,
        wit::Phase::Failed => types::Phase::Failed,
    }
}

/// The columns as they arrived: moved, not copied.
fn nodes(c: wit::Nodes) -> crate::Nodes {
    crate::node_columns!(move_nodes, c)
}

pub fn grant<F: Fleet + Default>(r: wit::RolloutRequest) -> wit::RolloutGrant {
    decide::<F>(r).grant
}

pub fn decide<F: Fleet + Default>(r: wit::RolloutRequest) -> wit::RolloutDecision {
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
    wit::RolloutDecision {
        grant: wit::RolloutGrant {
            nodes: g.nodes,
            max_pulls: g.max_pulls,
            reason: g.reason,
        },
        hold: g.hold,
    }
}
