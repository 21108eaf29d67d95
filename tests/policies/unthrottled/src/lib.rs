//! Benchmark-only policy: the reference admission and order, five pulls at once on every node,
//! no pause between pulls. It measures what the pipeline costs over bare pulls.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use pinset_policy_sdk::*;

#[derive(Default)]
struct Unthrottled;

impl Policy for Unthrottled {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new(
            "unthrottled",
            "0.0.0",
            "5 pulls at once, no throttle (benchmarks only)",
        )
    }
    fn concurrency(&self, _node: &NodeFacts) -> u32 {
        5
    }
    fn throttle(&self, _node: &NodeFacts, _outcome: &PullOutcome, _pressure: &Pressure) -> u64 {
        0
    }
}

export_policy!(Unthrottled);
