//! Machine-readable results of `policy test` (JSON, JUnit XML for CI systems) and `policy bench`
//! (JSON).

use pinset_core::scenario::Outcome;
use pinset_policy_bench::Row;
use serde_json::json;
use std::time::Duration;

/// `policy test -o json`: the policy, each scenario (name, file, passed, its mismatches) and the
/// totals.
pub fn test_json(
    policy: &serde_json::Value,
    outcomes: &[(Outcome, Duration)],
) -> serde_json::Value {
    let passed = outcomes.iter().filter(|(o, _)| o.passed()).count();
    json!({
        "policy": policy,
        "scenarios": outcomes.iter().map(|(o, took)| json!({
            "name": o.name,
            "path": o.path.display().to_string(),
            "passed": o.passed(),
            "diffs": o.diffs,
            "seconds": took.as_secs_f64(),
        })).collect::<Vec<_>>(),
        "passed": passed,
        "failed": outcomes.len() - passed,
    })
}

fn xml(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\t'))
        .collect::<String>()
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `policy test --junit FILE`: one `<testsuite>` for the policy, a `<testcase>` per scenario
/// (classname: its file), a `<failure>` holding the mismatches of a failed one.
pub fn junit(policy: &str, outcomes: &[(Outcome, Duration)]) -> String {
    let failures = outcomes.iter().filter(|(o, _)| !o.passed()).count();
    let total: f64 = outcomes.iter().map(|(_, t)| t.as_secs_f64()).sum();
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"{n}\" failures=\"{failures}\" time=\"{total:.3}\">\n<testsuite name=\"{}\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" time=\"{total:.3}\">\n",
        xml(&format!("pinset policy test: {policy}")),
        n = outcomes.len(),
    );
    for (o, took) in outcomes {
        out.push_str(&format!(
            "  <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\"",
            xml(&o.name),
            xml(&o.path.display().to_string()),
            took.as_secs_f64()
        ));
        if o.passed() {
            out.push_str("/>\n");
        } else {
            let first = o.diffs.first().map_or("failed".into(), |d| d.summary());
            let all: Vec<String> = o.diffs.iter().map(ToString::to_string).collect();
            out.push_str(&format!(
                ">\n    <failure message=\"{}\">{}</failure>\n  </testcase>\n",
                xml(&first),
                xml(&all.join("\n"))
            ));
        }
    }
    out.push_str("</testsuite>\n</testsuites>\n");
    out
}

/// `policy bench -o json`: per row the median and p99 of both sides in microseconds, and the
/// ratio.
pub fn bench_json(
    policy: &serde_json::Value,
    images: usize,
    iterations: usize,
    rows: &[Row],
) -> serde_json::Value {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    json!({
        "policy": policy,
        "images": images,
        "iterations": iterations,
        "instances": pinset_policy::instance_strategy(),
        "rows": rows.iter().map(|r| json!({
            "hook": r.what,
            "wasm": {
                "medianUs": us(r.wasm.median),
                "p99Us": us(r.wasm.p99),
                "noiseUs": us(r.wasm.noise),
            },
            "native": {"medianUs": us(r.native.median), "p99Us": us(r.native.p99)},
            "baseline": r.baseline.as_str(),
            "ratio": r.ratio(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn junit_names_each_scenario_and_escapes_failures() {
        let outcomes = vec![
            (
                Outcome {
                    name: "ok".into(),
                    path: PathBuf::from("a.yaml"),
                    diffs: Vec::new(),
                },
                Duration::from_millis(3),
            ),
            (
                Outcome {
                    name: "bad <one>".into(),
                    path: PathBuf::from("b.yaml"),
                    diffs: vec![pinset_core::diff::Diff::new("concurrency <x>", 1, "2")],
                },
                Duration::from_millis(5),
            ),
        ];
        let x = junit("default", &outcomes);
        assert!(
            x.contains(
                "<testsuite name=\"pinset policy test: default\" tests=\"2\" failures=\"1\""
            ),
            "{x}"
        );
        assert!(
            x.contains("<testcase name=\"ok\" classname=\"a.yaml\" time=\"0.003\"/>"),
            "{x}"
        );
        assert!(
            x.contains("name=\"bad &lt;one&gt;\"")
                && x.contains(
                    "<failure message=\"concurrency &lt;x&gt;: expected 1, actual &quot;2&quot;\">"
                ),
            "the message carries both values: {x}"
        );
        assert!(x.contains("+ actual   &quot;2&quot;"), "{x}");
        let j = test_json(&json!({"name": "default"}), &outcomes);
        assert_eq!(
            (j["passed"].as_u64(), j["failed"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(j["scenarios"][1]["passed"], false);
        assert_eq!(
            j["scenarios"][1]["diffs"][0],
            json!({"what": "concurrency <x>", "expected": 1, "actual": "2"})
        );
    }
}
