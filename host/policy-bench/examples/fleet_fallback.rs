//! What a fleet decision costs when the module's answer is not used: the guard asks the module,
//! finds its answer invalid and asks the native default fleet policy instead, for pools of 300
//! and 3 000 nodes (`pinset_policy_bench::synth::fleet`). Median of 300 decisions each.
//!
//! ```sh
//! cargo test -p pinset --test fleet_sandbox   # builds the test modules (tests/policies/*)
//! cargo run --release -p pinset-policy-bench --example fleet_fallback [HOSTILE.wasm]
//! ```

use pinset_policy::{Guarded, Limits, WasmRuntime};
use pinset_policy_bench::synth;
use std::time::{Duration, Instant};

const HOSTILE: &str = "target/wasm-policies/components/pinset_test_policy_hostile.wasm";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| HOSTILE.into());
    let module = WasmRuntime::new()?.load_file_as::<pinset_policy::FleetContract>(
        path.as_ref(),
        None,
        Limits::default(),
    )?;
    for nodes in [300, 3000] {
        let mut request = synth::fleet(nodes);
        // The hostile module names a node the pool does not have: an invalid answer.
        request.pool.annotations =
            vec![("pinset.test/hostile-fleet".into(), "out-of-range".into())];
        let mut samples: Vec<Duration> = (0..300)
            .map(|_| {
                let started = Instant::now();
                let decided = Guarded::of(&module).without_warnings().grant(&request);
                assert!(decided.fallback.is_some(), "the answer was used");
                started.elapsed()
            })
            .collect();
        samples.sort_unstable();
        println!(
            "{nodes}-node pool: a decision that falls back, median {:.1} µs",
            samples[samples.len() / 2].as_secs_f64() * 1e6
        );
    }
    Ok(())
}
