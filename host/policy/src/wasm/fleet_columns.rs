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

/// `record nodes` of the contract: the SDK's columns, borrowed (the phases converted).
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub(super) struct NodesArg<'a> {
    strings: &'a str,
    #[component(name = "string-starts")]
    string_starts: &'a [u32],
    names: &'a [u32],
    #[component(name = "label-starts")]
    label_starts: &'a [u32],
    #[component(name = "label-keys")]
    label_keys: &'a [u32],
    #[component(name = "label-values")]
    label_values: &'a [u32],
    ready: &'a [u8],
    granted: &'a [u8],
    phase: &'a [fw::Phase],
    #[component(name = "images-done")]
    images_done: &'a [u64],
    #[component(name = "images-total")]
    images_total: &'a [u64],
    #[component(name = "bytes-done")]
    bytes_done: &'a [u64],
    #[component(name = "bytes-total")]
    bytes_total: &'a [u64],
    pulling: &'a [u8],
    #[component(name = "pulling-for-ms")]
    pulling_for_ms: &'a [u64],
    #[component(name = "set-starts")]
    set_starts: &'a [u32],
    #[component(name = "set-names")]
    set_names: &'a [u32],
    #[component(name = "desired-generations")]
    desired_generations: &'a [i64],
    #[component(name = "current-known")]
    current_known: &'a [u8],
    #[component(name = "current-generations")]
    current_generations: &'a [i64],
    #[component(name = "failed-known")]
    failed_known: &'a [u8],
    #[component(name = "failed-generations")]
    failed_generations: &'a [i64],
    #[component(name = "error-known")]
    error_known: &'a [u8],
    errors: &'a [u32],
}

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

fn nodes<'a>(c: &'a sdk::Nodes, phase: &'a [fw::Phase]) -> NodesArg<'a> {
    NodesArg {
        strings: &c.strings,
        string_starts: &c.string_starts,
        names: &c.names,
        label_starts: &c.label_starts,
        label_keys: &c.label_keys,
        label_values: &c.label_values,
        ready: &c.ready,
        granted: &c.granted,
        phase,
        images_done: &c.images_done,
        images_total: &c.images_total,
        bytes_done: &c.bytes_done,
        bytes_total: &c.bytes_total,
        pulling: &c.pulling,
        pulling_for_ms: &c.pulling_for_ms,
        set_starts: &c.set_starts,
        set_names: &c.set_names,
        desired_generations: &c.desired_generations,
        current_known: &c.current_known,
        current_generations: &c.current_generations,
        failed_known: &c.failed_known,
        failed_generations: &c.failed_generations,
        error_known: &c.error_known,
        errors: &c.errors,
    }
}
