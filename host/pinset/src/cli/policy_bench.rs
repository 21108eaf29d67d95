//! `pinset policy bench`: the hooks of a module measured, against a baseline that means
//! something for it — the native reference (the embedded default only: the same source), the
//! floor module (`--floor`), or the module's own saved run (`--baseline`, which a policy's CI
//! gates on with `--max-regression`).
//!
//! The gate is meant for shared machines, where the same module measured twice differs by tens
//! of percent on a short row. A row regresses only when it is slower than the saved run by more
//! than all of: `--max-regression` of the saved median, the noise of both runs (the spread of
//! their block medians, [`pinset_policy_bench::Stats::noise`]), and `--regression-floor` in
//! absolute time; and it must stay so when measured again: a run with a regressed row is
//! repeated up to [`CONFIRM`] more times, each row keeping its fastest median.

use super::policy::{Format, Modules};
use super::report;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use pinset_policy_bench::{self as bench, Baseline, Row};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Images per reconcile.
    #[arg(long, default_value_t = 500)]
    pub images: usize,
    /// Measured calls per hook (after a warm-up of a tenth of that).
    #[arg(long, default_value_t = 200)]
    pub iterations: usize,
    /// Also measure a fresh instance and a reconcile against this module that decides
    /// nothing (`tests/policies/floor`): what the sandbox costs by itself, in the same run.
    #[arg(long, value_name = "FILE.wasm")]
    pub floor: Option<PathBuf>,
    /// Write this run's results (`-o json`'s document) to FILE, to compare later runs with.
    #[arg(long, value_name = "FILE.json")]
    pub save: Option<PathBuf>,
    /// Compare each row's Wasm median with the same row of a saved run (`--save`); exit 1 when
    /// one is slower by more than `--max-regression`.
    #[arg(long, value_name = "FILE.json")]
    pub baseline: Option<PathBuf>,
    /// How much slower than the baseline a row may be, in percent (`20%` or `20`); a row is
    /// also allowed the noise of both runs and `--regression-floor`.
    #[arg(long, value_name = "PERCENT", default_value = "20%", value_parser = percent)]
    pub max_regression: f64,
    /// A row slower by less than this is never a regression, whatever the percentage (`2us`,
    /// `0.5ms`; a bare number is µs).
    #[arg(long, value_name = "DURATION", default_value = "2us", value_parser = micros)]
    pub regression_floor: f64,
    /// text for people, json for scripts.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    pub output: Format,
}

fn percent(text: &str) -> Result<f64, String> {
    let n = text.trim().trim_end_matches('%');
    match n.parse::<f64>() {
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
        _ => Err(format!("{text:?} is not a percentage (e.g. 20%)")),
    }
}

/// `2us`, `2µs`, `0.5ms` or a bare number of µs, in µs.
fn micros(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (n, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1000.0)
    } else if let Some(n) = t.strip_suffix("us").or_else(|| t.strip_suffix("µs")) {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    match n.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v * scale),
        _ => Err(format!("{text:?} is not a duration (e.g. 2us or 0.5ms)")),
    }
}

/// Runs measured again, at most, to confirm a regression.
pub const CONFIRM: usize = 2;

/// A saved run's row: its Wasm median and noise, in µs.
#[derive(Clone, Debug, PartialEq)]
pub struct Saved {
    pub hook: String,
    pub median_us: f64,
    pub noise_us: f64,
}

/// What a row may lose against the saved run before it regresses.
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    pub max_percent: f64,
    pub floor_us: f64,
}

/// One row against the saved run's: its Wasm medians, in µs, the change, and the slack it was
/// allowed (the largest of the percentage, both runs' noise and the floor).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Compared {
    pub hook: String,
    pub baseline_us: f64,
    pub now_us: f64,
    /// Percent slower (negative: faster).
    pub change_percent: f64,
    pub allowed_us: f64,
    pub regressed: bool,
}

pub(super) fn run(
    modules: &mut Modules,
    native_means_something: bool,
    a: &BenchArgs,
) -> Result<ExitCode> {
    modules.load_all()?;
    if cfg!(debug_assertions) {
        tracing::warn!("this is a debug build; measure with `cargo run --release`");
    }
    let mut rows = measure(modules, a)?;
    let gate = Gate {
        max_percent: a.max_regression,
        floor_us: a.regression_floor,
    };
    let compared = match &a.baseline {
        Some(path) => Some(confirmed(modules, a, &read_saved(path)?, &mut rows, gate)?),
        None => None,
    };
    if !native_means_something {
        // Another module's work against the default's native code says nothing about it: the
        // column is labelled so and no ratio is drawn (`--floor`, `--baseline` are its baselines).
        for r in rows.iter_mut().filter(|r| r.baseline == Baseline::Native) {
            r.baseline = Baseline::NativeDefault;
        }
    }
    let mut document = report::bench_json(&modules.json(), a.images, a.iterations, &rows);
    if let Some(c) = &compared {
        document["baseline"] = serde_json::json!({
            "maxRegressionPercent": a.max_regression,
            "regressionFloorUs": a.regression_floor,
            "rows": c,
        });
    }
    if let Some(path) = &a.save {
        std::fs::write(path, serde_json::to_string_pretty(&document)?)
            .with_context(|| format!("--save {}", path.display()))?;
    }
    match a.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&document)?),
        Format::Text => print_text(modules, a, &rows, compared.as_deref()),
    }
    let regressed = compared.iter().flatten().any(|c| c.regressed);
    Ok(if regressed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Every row the module's contracts have, with a progress bar.
fn measure(modules: &Modules, a: &BenchArgs) -> Result<Vec<Row>> {
    let node_rows = modules.node.as_ref().map_or(0, |_| bench::ROWS.len());
    let fleet_rows = modules
        .fleet
        .as_ref()
        .map_or(0, |_| bench::FLEET_NODES.len());
    let bar = super::logging::bars()
        .add(ProgressBar::new((node_rows + fleet_rows) as u64))
        .with_style(
            ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
    bar.enable_steady_tick(Duration::from_millis(100));
    let mut rows = Vec::new();
    if let Some(module) = &modules.node {
        rows = bench::run(module, a.images, a.iterations, |what| {
            bar.inc(1);
            bar.set_message(what);
        })?;
        if let Some(floor) = &a.floor {
            bar.set_message("against the floor module");
            let floor = modules.runtime.load_file(floor, None, module.limits())?;
            rows.extend(bench::against_floor(
                module,
                &floor,
                a.images,
                a.iterations,
            )?);
        }
    }
    if let Some(fleet) = &modules.fleet {
        for nodes in bench::FLEET_NODES {
            bar.set_message(format!("fleet grant, {nodes} nodes"));
            rows.push(bench::fleet(fleet, nodes, a.iterations)?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(rows)
}

/// The comparison with the saved run, each apparent regression measured again (up to
/// [`CONFIRM`] runs, every row keeping the figures of its fastest run).
fn confirmed(
    modules: &Modules,
    a: &BenchArgs,
    saved: &[Saved],
    rows: &mut [Row],
    gate: Gate,
) -> Result<Vec<Compared>> {
    let mut compared = compare(saved, rows, gate);
    for n in 1..=CONFIRM {
        if !compared.iter().any(|c| c.regressed) {
            break;
        }
        tracing::info!("a row looks slower than the saved run: measuring again ({n}/{CONFIRM})");
        let again = measure(modules, a)?;
        for (row, new) in rows.iter_mut().zip(again) {
            if new.wasm.median < row.wasm.median {
                row.wasm = new.wasm;
            }
        }
        compared = compare(saved, rows, gate);
    }
    Ok(compared)
}

/// A saved run's rows.
fn read_saved(path: &Path) -> Result<Vec<Saved>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--baseline {}: cannot read", path.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--baseline {}: not JSON", path.display()))?;
    let Some(rows) = doc["rows"].as_array() else {
        bail!(
            "--baseline {}: no `rows`: not a document of `pinset policy bench --save`",
            path.display()
        );
    };
    let row = |r: &serde_json::Value| {
        Some(Saved {
            hook: r["hook"].as_str()?.to_string(),
            median_us: r["wasm"]["medianUs"].as_f64()?,
            // A run saved before noise was measured: none known.
            noise_us: r["wasm"]["noiseUs"].as_f64().unwrap_or(0.0),
        })
    };
    Ok(rows.iter().filter_map(row).collect())
}

/// Each row of this run that the saved run has, compared by Wasm median under `gate`.
pub fn compare(saved: &[Saved], rows: &[Row], gate: Gate) -> Vec<Compared> {
    rows.iter()
        .filter_map(|r| {
            let before = saved.iter().find(|s| s.hook == r.what)?;
            let now = r.wasm.median.as_secs_f64() * 1e6;
            let noise = r.wasm.noise.as_secs_f64() * 1e6 + before.noise_us;
            let allowed = (before.median_us * gate.max_percent / 100.0)
                .max(noise)
                .max(gate.floor_us);
            Some(Compared {
                hook: r.what.clone(),
                baseline_us: before.median_us,
                now_us: now,
                change_percent: (now / before.median_us.max(1e-9) - 1.0) * 100.0,
                allowed_us: allowed,
                regressed: now - before.median_us > allowed,
            })
        })
        .collect()
}

fn print_text(modules: &Modules, a: &BenchArgs, rows: &[Row], compared: Option<&[Compared]>) {
    println!("{}", modules.describe());
    match modules.node {
        Some(_) => println!(
            "{} images, {} calls per row (median / p99)",
            a.images, a.iterations
        ),
        None => println!("{} calls per row (median / p99)", a.iterations),
    }
    println!("instances: {}", pinset_policy::instance_strategy());
    println!(
        "{:<70} {:>22} {:>22} {:>8}",
        "hook", "wasm", "baseline", "ratio"
    );
    for row in rows {
        let ratio = row.ratio().map_or("—".to_string(), |r| format!("{r:.2}x"));
        println!(
            "{:<70} {:>22} {:>22} {:>8}",
            row.what,
            format!("{} / {}", us(row.wasm.median), us(row.wasm.p99)),
            format!("{}: {}", row.baseline.as_str(), us(row.native.median)),
            ratio
        );
    }
    let Some(compared) = compared else {
        return;
    };
    println!(
        "against the saved run (slower by at most {:.0}%, the noise of both runs or {} µs, whichever is most):",
        a.max_regression, a.regression_floor
    );
    for c in compared {
        let verdict = if c.regressed { "REGRESSED" } else { "ok" };
        println!(
            "  {:<68} {:>10.1} µs → {:>10.1} µs  {:>+7.1}% (allowed +{:.1} µs)  {verdict}",
            c.hook, c.baseline_us, c.now_us, c.change_percent, c.allowed_us
        );
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_policy_bench::Stats;

    fn row(what: &str, median_us: u64, noise_us: u64) -> Row {
        let s = Stats {
            median: Duration::from_micros(median_us),
            p99: Duration::from_micros(median_us),
            noise: Duration::from_micros(noise_us),
        };
        Row {
            what: what.into(),
            wasm: s,
            native: s,
            baseline: Baseline::Native,
        }
    }

    fn saved(hook: &str, median_us: f64, noise_us: f64) -> Saved {
        Saved {
            hook: hook.into(),
            median_us,
            noise_us,
        }
    }

    #[test]
    fn a_row_regresses_only_beyond_the_percentage_the_noise_and_the_floor() {
        let gate = Gate {
            max_percent: 20.0,
            floor_us: 2.0,
        };
        let before = vec![
            saved("admit", 100.0, 1.0),
            saved("order", 100.0, 30.0),
            saved("concurrency", 1.0, 0.0),
            saved("throttle", 1.0, 0.0),
        ];
        let rows = [
            row("admit", 130, 1),
            row("order", 130, 10),
            row("concurrency", 2, 0),
            row("throttle", 4, 0),
            row("new", 99, 0),
        ];
        let c = compare(&before, &rows, gate);
        assert_eq!(c.len(), 4, "a row the saved run lacks is not compared");
        assert!(c[0].regressed && (c[0].change_percent - 30.0).abs() < 1e-6);
        assert!(!c[1].regressed, "within the noise of both runs (40 µs)");
        assert!(!c[2].regressed, "+1 µs on a 1-µs row is under the floor");
        assert!(c[3].regressed, "+3 µs is beyond the floor");
        assert_eq!(percent("20%"), Ok(20.0));
        assert_eq!(percent("7.5"), Ok(7.5));
        assert!(percent("fast").is_err() && percent("-1%").is_err());
        assert_eq!(micros("2us"), Ok(2.0));
        assert_eq!(micros("2µs"), Ok(2.0));
        assert_eq!(micros("0.5ms"), Ok(500.0));
        assert_eq!(micros("3"), Ok(3.0));
        assert!(micros("soon").is_err());
    }

    #[test]
    fn the_noise_is_the_spread_of_block_medians() {
        let mut samples = vec![Duration::from_micros(10); 50];
        samples.extend(vec![Duration::from_micros(14); 50]);
        let s = Stats::of(samples);
        assert_eq!(s.noise, Duration::from_micros(4));
        assert_eq!(
            Stats::of(vec![Duration::from_micros(7); 9]).noise,
            Duration::ZERO
        );
    }
}
