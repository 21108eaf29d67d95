//! A test-only policy that misbehaves on request, to prove that pinset contains it.
//!
//! The misbehaviour is chosen by the node label `pinset.test/hostile`; without it the policy
//! behaves like the default. `trap`, `loop` and `alloc` hit every hook; the others hit one.
//! `counter` makes `concurrency` count its calls in this instance, to show whether state survives.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

use pinset_policy_default::DefaultPolicy;
use pinset_policy_sdk::*;

pub const MODE_LABEL: &str = "pinset.test/hostile";

#[derive(Default)]
struct Hostile;

fn misbehave(node: &NodeFacts) -> Option<&str> {
    let mode = node.label(MODE_LABEL)?;
    match mode {
        "trap" => panic!("hostile policy traps on purpose"),
        "loop" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "alloc" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        other => Some(other),
    }
}

impl Policy for Hostile {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new("hostile", "0.0.0", "misbehaves on request (tests only)")
    }

    fn admit(&self, request: &AdmissionRequest) -> Admission {
        match misbehave(&request.node) {
            Some("bad-subset") => Admission::admit_some(vec![0, 9_999], "names an unknown image"),
            _ => DefaultPolicy.admit(request),
        }
    }

    fn order(&self, node: &NodeFacts, images: &Images) -> Vec<u32> {
        match misbehave(node) {
            Some("non-permutation") => vec![0; images.len()],
            _ => DefaultPolicy.order(node, images),
        }
    }

    fn concurrency(&self, node: &NodeFacts) -> u32 {
        match misbehave(node) {
            Some("concurrency-zero") => 0,
            Some("concurrency-huge") => 10_000,
            Some("counter") => {
                static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
            }
            _ => DefaultPolicy.concurrency(node),
        }
    }

    fn throttle(&self, node: &NodeFacts, outcome: &PullOutcome, pressure: &Pressure) -> u64 {
        match misbehave(node) {
            Some("throttle-year") => 365 * 24 * 3_600 * 1_000,
            _ => DefaultPolicy.throttle(node, outcome, pressure),
        }
    }
}

export_policy!(Hostile);
