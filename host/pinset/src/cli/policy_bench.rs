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
//! repeated up to [`CONFIRM`] more times, each row keeping its fastest run. A shared machine
//! also runs slower for minutes at a time (here by half, for a minute): the saved medians are
//! scaled by how much slower the native reference runs now than in the saved run ([`pace`]),
//! which no change of module moves.

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
    /// Write this run's results (`-o json`'s document) to FILE, to compare later runs with:
    /// measured three times, each row keeping its middle run.
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

/// Runs measured again, at most, to confirm a regression: a slow spell of a shared machine
/// lasts seconds (a run takes about one), a slower module every run.
pub const CONFIRM: usize = 4;

/// Runs a saved run is made of, each row keeping its middle one: a baseline of one run may be
/// a lucky (or unlucky) moment of a shared machine.
pub const SAVE_RUNS: usize = 3;

/// A saved run's row: its Wasm median and noise, in µs, and its native reference's median
/// (none for a row measured against the floor module).
#[derive(Clone, Debug, PartialEq)]
pub struct Saved {
    pub hook: String,
    pub median_us: f64,
    pub noise_us: f64,
    pub native_us: Option<f64>,
}

/// A saved run: its rows, and the images per reconcile its node rows were measured with.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedRun {
    pub images: Option<u64>,
    pub rows: Vec<Saved>,
}

/// Native rows at least this slow tell the machine's pace (a shorter one is the timer's noise).
const PACE_MIN_US: f64 = 5.0;

/// How much slower the machine runs now than in the saved run: the median ratio of the native
/// reference's medians, now over then, over the rows measured on the same inputs in both (the
/// fleet rows always; the node rows when both runs had the same images) and slow enough to
/// tell. Never below 1 (a run is never held to more than its saved figures), and 1 when no row
/// tells. The native reference is pinset's own code: no change of the module moves it.
pub fn pace(saved: &SavedRun, rows: &[Row], images: usize) -> f64 {
    let mut ratios: Vec<f64> = rows
        .iter()
        .filter(|r| r.baseline != Baseline::Floor)
        .filter(|r| !bench::ROWS.contains(&r.what.as_str()) || saved.images == Some(images as u64))
        .filter_map(|r| {
            let before = saved.rows.iter().find(|s| s.hook == r.what)?.native_us?;
            let now = r.native.median.as_secs_f64() * 1e6;
            (before >= PACE_MIN_US).then(|| now / before)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    match ratios.len() {
        0 => 1.0,
        n if n % 2 == 1 => ratios[n / 2].max(1.0),
        n => ((ratios[n / 2 - 1] + ratios[n / 2]) / 2.0).max(1.0),
    }
}

/// What a row may lose against the saved run before it regresses.
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    pub max_percent: f64,
    pub floor_us: f64,
}

/// One row against the saved run's: its Wasm medians, in µs, the change, and the slack it was
/// allowed (the largest of the percentage, both runs' noise and the floor), over the saved
/// median scaled by the machine's [`pace`].
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Compared {
    pub hook: String,
    pub baseline_us: f64,
    /// The saved median at the machine's pace now.
    pub expected_us: f64,
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
    let mut rows = match a.save {
        Some(_) => middle_rows(
            (0..SAVE_RUNS)
                .map(|_| measure(modules, a))
                .collect::<Result<_>>()?,
        ),
        None => measure(modules, a)?,
    };
    let gate = Gate {
        max_percent: a.max_regression,
        floor_us: a.regression_floor,
    };
    let compared = match &a.baseline {
        Some(path) => Some(confirmed(modules, a, &read_saved(path)?, &mut rows, gate)?),
        None => None,
    };
    let (pace, compared) = match compared {
        Some((pace, c)) => (Some(pace), Some(c)),
        None => (None, None),
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
            "pace": pace,
            "rows": c,
        });
    }
    if let Some(path) = &a.save {
        std::fs::write(path, serde_json::to_string_pretty(&document)?)
            .with_context(|| format!("--save {}", path.display()))?;
    }
    match a.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&document)?),
        Format::Text => print_text(modules, a, &rows, compared.as_deref().zip(pace)),
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

/// Of runs of the same rows, each row's middle run by Wasm median (its native reference's
/// figures from the same run, for [`pace`]).
pub fn middle_rows(runs: Vec<Vec<Row>>) -> Vec<Row> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|i| {
            let mut all: Vec<&Row> = runs.iter().filter_map(|run| run.get(i)).collect();
            all.sort_by_key(|r| r.wasm.median);
            all[(all.len() - 1) / 2].clone()
        })
        .collect()
}

/// The comparison with the saved run, each apparent regression measured again (up to
/// [`CONFIRM`] runs, every row keeping the figures of its fastest run).
fn confirmed(
    modules: &Modules,
    a: &BenchArgs,
    saved: &SavedRun,
    rows: &mut [Row],
    gate: Gate,
) -> Result<(f64, Vec<Compared>)> {
    let mut compared = compare(&saved.rows, rows, gate, pace(saved, rows, a.images));
    for n in 1..=CONFIRM {
        if !compared.iter().any(|c| c.regressed) {
            break;
        }
        tracing::info!("a row looks slower than the saved run: measuring again ({n}/{CONFIRM})");
        let again = measure(modules, a)?;
        for (row, new) in rows.iter_mut().zip(again) {
            if new.wasm.median < row.wasm.median {
                *row = new;
            }
        }
        compared = compare(&saved.rows, rows, gate, pace(saved, rows, a.images));
    }
    Ok((pace(saved, rows, a.images), compared))
}

/// A saved run.
fn read_saved(path: &Path) -> Result<SavedRun> {
    let text = pinset_core::input::text(path, pinset_core::input::CONFIG)
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
            native_us: (r["baseline"] != "floor")
                .then(|| r["native"]["medianUs"].as_f64())
                .flatten(),
        })
    };
    Ok(SavedRun {
        images: doc["images"].as_u64(),
        rows: rows.iter().filter_map(row).collect(),
    })
}

/// Each row of this run that the saved run has, compared by Wasm median under `gate`, the saved
/// figures scaled by the machine's `pace`.
pub fn compare(saved: &[Saved], rows: &[Row], gate: Gate, pace: f64) -> Vec<Compared> {
    rows.iter()
        .filter_map(|r| {
            let before = saved.iter().find(|s| s.hook == r.what)?;
            let expected = before.median_us * pace;
            let now = r.wasm.median.as_secs_f64() * 1e6;
            let noise = r.wasm.noise.as_secs_f64() * 1e6 + before.noise_us * pace;
            let allowed = (expected * gate.max_percent / 100.0)
                .max(noise)
                .max(gate.floor_us);
            Some(Compared {
                hook: r.what.clone(),
                baseline_us: before.median_us,
                expected_us: expected,
                now_us: now,
                change_percent: (now / expected.max(1e-9) - 1.0) * 100.0,
                allowed_us: allowed,
                regressed: now - expected > allowed,
            })
        })
        .collect()
}

fn print_text(
    modules: &Modules,
    a: &BenchArgs,
    rows: &[Row],
    compared: Option<(&[Compared], f64)>,
) {
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
    let Some((compared, pace)) = compared else {
        return;
    };
    if pace > 1.0 {
        println!(
            "the machine runs {pace:.2}x slower than in the saved run (the native reference's rows): the saved medians are scaled by it"
        );
    }
    println!(
        "against the saved run (slower by at most {:.0}%, the noise of both runs or {} µs, whichever is most):",
        a.max_regression, a.regression_floor
    );
    for c in compared {
        let verdict = if c.regressed { "REGRESSED" } else { "ok" };
        println!(
            "  {:<68} {:>10.1} µs → {:>10.1} µs  {:>+7.1}% (allowed +{:.1} µs)  {verdict}",
            c.hook, c.expected_us, c.now_us, c.change_percent, c.allowed_us
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
            native_us: Some(median_us),
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
        let c = compare(&before, &rows, gate, 1.0);
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
    fn the_pace_is_the_native_reference_s_slowdown_on_the_same_inputs() {
        let fleet = "fleet grant, 3000-node pool (new instance + grant)";
        let run = SavedRun {
            images: Some(500),
            rows: vec![
                saved("admit", 10.0, 0.0),
                saved("order", 1.0, 0.0),
                saved(fleet, 500.0, 0.0),
            ],
        };
        // Natives now: admit 2x, order 9x (too short to tell), the fleet grant 1.5x.
        let native = |what: &str, us: u64| {
            let mut r = row(what, 1, 0);
            r.native.median = Duration::from_micros(us);
            r
        };
        let now = [native("admit", 20), native("order", 9), native(fleet, 750)];
        assert!(
            (pace(&run, &now, 500) - 1.75).abs() < 1e-9,
            "the median of 2 and 1.5"
        );
        assert!(
            (pace(&run, &now, 50) - 1.5).abs() < 1e-9,
            "other images: the fleet row only"
        );
        let faster = [native("admit", 5), native(fleet, 250)];
        assert_eq!(pace(&run, &faster, 500), 1.0, "never below 1");
        assert_eq!(pace(&run, &[], 500), 1.0, "no row tells");
        // At 1.5x, a row saved at 100 µs may take 150 µs and 20 % more.
        let gate = Gate {
            max_percent: 20.0,
            floor_us: 2.0,
        };
        let before = [saved("admit", 100.0, 0.0)];
        assert!(!compare(&before, &[row("admit", 175, 0)], gate, 1.5)[0].regressed);
        assert!(compare(&before, &[row("admit", 185, 0)], gate, 1.5)[0].regressed);
    }

    #[test]
    fn a_saved_row_is_its_middle_run() {
        let runs = vec![
            vec![row("admit", 9, 1), row("order", 5, 0)],
            vec![row("admit", 14, 2), row("order", 6, 3)],
            vec![row("admit", 12, 1), row("order", 4, 0)],
        ];
        let rows = middle_rows(runs);
        assert_eq!(rows[0].wasm.median, Duration::from_micros(12));
        assert_eq!(
            rows[0].wasm.noise,
            Duration::from_micros(1),
            "the middle run's own"
        );
        assert_eq!(rows[1].wasm.median, Duration::from_micros(5));
        assert!(middle_rows(Vec::new()).is_empty());
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
