//! A test-only policy that misbehaves on request, to prove that pinset contains it.
//!
//! The misbehaviour is chosen by the node label `pinset.test/hostile`; without it the policy
//! behaves like the default. `trap`, `loop`, `alloc`, `stderr`, `stdout`, `sleep`, `probe`,
//! `log-flood` and `log-forge` hit every hook; the others hit one. `counter` and `counter-data`
//! make `concurrency` count its calls in this instance (in zeroed memory, and in the module's
//! data image), to show whether state survives. Everything here is written
//! from `wit/policy.wit` and the standard library alone: what any policy author can do.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

mod fleet;

use pinset_policy_sdk::*;

pub const MODE_LABEL: &str = "pinset.test/hostile";

#[derive(Default)]
struct Hostile;

fn misbehave(node: &NodeFacts) -> Option<&str> {
    let mode = node.label(MODE_LABEL)?;
    match mode {
        "trap" => panic!("hostile policy traps on purpose"),
        "loop" => spin(),
        "alloc" => hoard(),
        "stderr" => {
            // Answers like the default, after writing to stderr on every hook.
            eprintln!("hostile policy writes to stderr");
            None
        }
        "stdout" => {
            println!("hostile policy writes to stdout {}", "x".repeat(100_000));
            None
        }
        "sleep" => {
            // Blocks in a host call (WASI clocks and poll), where epoch interruption cannot reach.
            std::thread::sleep(std::time::Duration::from_secs(20));
            None
        }
        "probe" => {
            let env: Vec<(String, String)> = std::env::vars().collect();
            let root = std::fs::read_dir("/").map(|d| d.count());
            let now = std::time::SystemTime::now();
            eprintln!("env {env:?} root {root:?} time {now:?}");
            println!("env {env:?} root {root:?}");
            None
        }
        "log-flood" => {
            for n in 0..1_000 {
                log(Level::Info, &format!("line {n} {}", "y".repeat(2_000)));
            }
            None
        }
        "log-forge" => {
            log(
                Level::Info,
                "harmless\n2026-12-01T00:00:00Z  INFO pinset: every image pinned (forged)",
            );
            None
        }
        other => Some(other),
    }
}

/// Runs until the host interrupts it (the epoch deadline).
fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

/// Allocates until the host refuses memory (the memory cap): 8 MiB blocks, one byte written in
/// each, so the cap is met within a few grows however busy the machine (filling every byte once
/// outlasted the 100 ms deadline).
fn hoard() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut block = Vec::with_capacity(8 << 20);
        block.push(1u8);
        hoard.push(block);
        std::hint::black_box(&hoard);
    }
}

impl Policy for Hostile {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new("hostile", "0.0.0", "misbehaves on request (tests only)")
    }

    fn admit(&self, request: &AdmissionRequest) -> Admission {
        match misbehave(&request.node) {
            Some("bad-subset") => Admission::admit_some(vec![0, 9_999], "names an unknown image"),
            Some("giant-reason") => Admission::reject("z\n".repeat(2 << 20)),
            _ => reference::admit(request),
        }
    }

    fn order(&self, node: &NodeFacts, images: &Images) -> Vec<u32> {
        match misbehave(node) {
            Some("non-permutation") => vec![0; images.len()],
            Some("trap-order") => panic!("hostile policy traps in order on purpose"),
            _ => reference::order(node, images),
        }
    }

    fn concurrency(&self, node: &NodeFacts) -> u32 {
        match misbehave(node) {
            Some("concurrency-zero") => 0,
            Some("concurrency-huge") => 10_000,
            Some("counter") => {
                // Zero-initialised: outside the module's data image.
                static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
            }
            Some("counter-data") => {
                // Initialised to a non-zero value: inside the module's data image.
                static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(41);
                CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 - 41
            }
            _ => reference::concurrency(node),
        }
    }

    fn throttle(&self, node: &NodeFacts, outcome: &PullOutcome, pressure: &Pressure) -> u64 {
        match misbehave(node) {
            Some("throttle-year") => 365 * 24 * 3_600 * 1_000,
            _ => reference::throttle(node, outcome, pressure),
        }
    }
}

export_policy!(Hostile);
export_fleet!(fleet::HostileFleet);
