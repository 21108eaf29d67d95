//! A rollout as the fleet contract passes it: the SDK's columns (`pinset_policy_sdk::Nodes`)
//! lowered straight from the caller's [`sdk::Rollout`] into the module's memory, a few dozen
//! copies whatever the pool's size. The generated bindings take an owned request, which would
//! take the columns from the caller: the native fallback then had to build them again.

use super::fleet_bindings::pinset::fleet::types as fw;
use pinset_policy_sdk as sdk;
use wasmtime::component::{ComponentType, Lower};

/// `record pool` of the contract, borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub(super) struct PoolArg<'a> {
    name: &'a str,
    annotations: &'a [(String, String)],
    #[component(name = "max-pulling")]
    max_pulling: Option<u32>,
}

/// `record target-set` of the contract, borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub(super) struct TargetSetArg<'a> {
    name: &'a str,
    generation: i64,
    images: u32,
    bytes: u64,
}

/// `record target` of the contract, borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub(super) struct TargetArg<'a> {
    sets: &'a [TargetSetArg<'a>],
    images: u32,
    bytes: u64,
}

/// `record nodes` of the contract over the SDK's columns, borrowed (the phases converted),
/// generated from the SDK's one list of them ([`pinset_policy_sdk::node_columns!`]).
macro_rules! nodes_arg {
    ([] { $($a:ident: $ao:ty => $ab:ty, $aw:literal;)* } { $($b:ident: $bo:ty => $bb:ty, $bw:literal;)* }) => {
        #[derive(ComponentType, Lower, Clone, Copy)]
        #[component(record)]
        pub(super) struct NodesArg<'a> {
            $(#[component(name = $aw)] $a: &'a $ab,)*
            phase: &'a [fw::Phase],
            $(#[component(name = $bw)] $b: &'a $bb,)*
        }

        fn nodes<'a>(c: &'a sdk::Nodes, phase: &'a [fw::Phase]) -> NodesArg<'a> {
            NodesArg {
                $($a: &c.$a,)*
                phase,
                $($b: &c.$b,)*
            }
        }
    };
}

pinset_policy_sdk::node_columns!(nodes_arg);

/// `record rollout-request` of the contract, borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub(super) struct RequestArg<'a> {
    pool: PoolArg<'a>,
    target: TargetArg<'a>,
    nodes: NodesArg<'a>,
}

/// What a borrowed request needs besides the rollout: the parts of the contract's form that
/// differ from the SDK's (the phase enum, the target's sets as contract records).
pub(super) struct Converted<'a> {
    phases: Vec<fw::Phase>,
    sets: Vec<TargetSetArg<'a>>,
}

impl<'a> Converted<'a> {
    pub(super) fn of(r: &'a sdk::Rollout) -> Self {
        Converted {
            phases: r.nodes.phase.iter().map(|&p| phase(p)).collect(),
            sets: r
                .target
                .sets
                .iter()
                .map(|s| TargetSetArg {
                    name: &s.name,
                    generation: s.generation,
                    images: s.images,
                    bytes: s.bytes,
                })
                .collect(),
        }
    }

    /// The contract's form of `r` (the rollout this was converted from).
    pub(super) fn request(&'a self, r: &'a sdk::Rollout) -> RequestArg<'a> {
        RequestArg {
            pool: PoolArg {
                name: &r.pool.name,
                annotations: &r.pool.annotations,
                max_pulling: r.pool.max_pulling,
            },
            target: TargetArg {
                sets: &self.sets,
                images: r.target.images,
                bytes: r.target.bytes,
            },
            nodes: nodes(&r.nodes, &self.phases),
        }
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
