//! What the integration tests share: the test bed of `pinset-testkit`, and the `pinset` binary
//! of this package (only its own tests know where cargo built it).

#![allow(dead_code, unused_imports)]

pub use pinset_testkit::*;

use std::process::Command;

/// The `pinset` binary cargo built for these tests.
pub const PINSET: &str = env!("CARGO_BIN_EXE_pinset");

/// Run the `pinset` binary with `args`: (exit code, stdout, stderr).
pub fn pinset(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(PINSET)
        .args(args)
        .env("PINSET_LOG", "warn")
        .output()
        .expect("run pinset");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The bars of a timeline's `.trace.json` (next to `svg`), by start: (start µs, end µs, what
/// the bar is of — an image, or a rollout's node —, its kind: `pull`, `failed`, …).
pub fn timeline_bars(svg: &std::path::Path) -> Vec<(f64, f64, String, String)> {
    let text = std::fs::read_to_string(svg.with_extension("trace.json")).unwrap();
    let trace: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut bars: Vec<_> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let start = e["ts"].as_f64().unwrap();
            (
                start,
                start + e["dur"].as_f64().unwrap(),
                e["args"]["image"].as_str().unwrap().to_string(),
                e["cat"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    bars.sort_by(|a, b| a.0.total_cmp(&b.0));
    bars
}
