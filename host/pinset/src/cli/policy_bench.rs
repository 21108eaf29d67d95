//! `pinset policy bench`: the hooks of a module measured, against a baseline that means
//! something for it — the native reference (the embedded default only: the same source), the
//! floor module (`--floor`), or the module's own saved run (`--baseline`, which a policy's CI
//! gates on with `--max-regression`).

use super::policy::{Format, Modules};
use super::report;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use pinset_policy::bench::{self, Baseline, Row};
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
    /// How much slower than the baseline a row may be, in percent (`20%` or `20`).
    #[arg(long, value_name = "PERCENT", default_value = "20%", value_parser = percent)]
    pub max_regression: f64,
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

/// One row against the saved run's: its Wasm medians, in µs, and the change.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Compared {
    pub hook: String,
    pub baseline_us: f64,
    pub now_us: f64,
    /// Percent slower (negative: faster).
    pub change_percent: f64,
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
    if !native_means_something {
        // Another module's work against the default's native code says nothing about it: the
        // column is labelled so and no ratio is drawn (`--floor`, `--baseline` are its baselines).
        for r in rows.iter_mut().filter(|r| r.baseline == Baseline::Native) {
            r.baseline = Baseline::NativeDefault;
        }
    }
    let compared = match &a.baseline {
        Some(path) => Some(compare(&read_saved(path)?, &rows, a.max_regression)),
        None => None,
    };
    let mut document = report::bench_json(&modules.json(), a.images, a.iterations, &rows);
    if let Some(c) = &compared {
        document["baseline"] =
            serde_json::json!({"maxRegressionPercent": a.max_regression, "rows": c});
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

/// A saved run's Wasm medians by row, in µs.
fn read_saved(path: &Path) -> Result<Vec<(String, f64)>> {
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
        Some((
            r["hook"].as_str()?.to_string(),
            r["wasm"]["medianUs"].as_f64()?,
        ))
    };
    Ok(rows.iter().filter_map(row).collect())
}

/// Each row of this run that the saved run has, compared by Wasm median.
pub fn compare(saved: &[(String, f64)], rows: &[Row], max_percent: f64) -> Vec<Compared> {
    rows.iter()
        .filter_map(|r| {
            let (_, before) = saved.iter().find(|(hook, _)| *hook == r.what)?;
            let now = r.wasm.median.as_secs_f64() * 1e6;
            let change_percent = (now / before.max(1e-9) - 1.0) * 100.0;
            Some(Compared {
                hook: r.what.clone(),
                baseline_us: *before,
                now_us: now,
                change_percent,
                regressed: change_percent > max_percent,
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
        "against the saved run (at most {:.0}% slower):",
        a.max_regression
    );
    for c in compared {
        let verdict = if c.regressed { "REGRESSED" } else { "ok" };
        println!(
            "  {:<68} {:>10.1} µs → {:>10.1} µs  {:>+7.1}%  {verdict}",
            c.hook, c.baseline_us, c.now_us, c.change_percent
        );
    }
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_policy::bench::Stats;

    fn row(what: &str, median_us: u64) -> Row {
        let s = Stats {
            median: Duration::from_micros(median_us),
            p99: Duration::from_micros(median_us),
        };
        Row {
            what: what.into(),
            wasm: s,
            native: s,
            baseline: Baseline::Native,
        }
    }

    #[test]
    fn a_row_slower_than_allowed_regresses_and_a_new_row_is_not_compared() {
        let saved = vec![("admit".to_string(), 10.0), ("order".to_string(), 10.0)];
        let rows = [row("admit", 13), row("order", 11), row("new", 99)];
        let c = compare(&saved, &rows, 20.0);
        assert_eq!(c.len(), 2);
        assert!(c[0].regressed && (c[0].change_percent - 30.0).abs() < 1e-6);
        assert!(!c[1].regressed);
        assert_eq!(percent("20%"), Ok(20.0));
        assert_eq!(percent("7.5"), Ok(7.5));
        assert!(percent("fast").is_err() && percent("-1%").is_err());
    }
}
