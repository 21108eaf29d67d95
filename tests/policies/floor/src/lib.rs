//! The floor of what a reconcile costs through the node contract: a module that decides nothing
//! (admit all, the given order, one pull at a time, no pause) and imports nothing but the
//! contract's own interfaces.
//!
//! It is `no_std` (the SDK's `no-std` feature brings its allocator and panic handler): Rust's
//! standard library brings WASI with it (its panic path reads the environment and writes to
//! stderr), and every imported interface is a core instance and a set of lowered functions that
//! each instantiation pays for. `pinset policy bench --policy` on this module measures what the
//! contract and the SDK's glue cost — a fresh instance and the crossing of each hook's
//! arguments — against the native reference policy (BENCHMARKS.md, "The floor").
//!
//! One input is answered differently: `concurrency` panics on a node named `floor-panics`, the
//! path on which a policy without stderr reports its panic (tests/it/policy_sandbox.rs).

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use pinset_policy_sdk::*;

/// The node name on which `concurrency` panics.
pub const PANIC_NODE: &str = "floor-panics";

#[derive(Default)]
pub struct Floor;

impl Policy for Floor {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new(
            "floor",
            "0.1.0",
            "decides nothing: the cost of the contract alone",
        )
    }
    fn admit(&self, _request: &AdmissionRequest) -> Admission {
        Admission::admit_all("floor")
    }
    fn concurrency(&self, node: &NodeFacts) -> u32 {
        if node.name == PANIC_NODE {
            panic!("asked to panic on node {}", node.name);
        }
        1
    }
    fn throttle(&self, _node: &NodeFacts, _outcome: &PullOutcome, _pressure: &Pressure) -> u64 {
        0
    }
}

export_policy!(Floor);
