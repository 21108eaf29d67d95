//! `pinset policy test | bench | info`.

use super::{PolicyOpts, load_policy};
use anyhow::Result;
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use pinset_core::scenario;
use pinset_policy::{Decisions, Guarded, PolicyModule, bench};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Run scenario files (or directories of them) against a policy; non-zero exit on failure.
    Test {
        #[command(flatten)]
        policy: PolicyOpts,
        /// Scenario files (YAML) or directories holding them.
        #[arg(required = true, value_name = "SCENARIO")]
        scenarios: Vec<PathBuf>,
    },
    /// Per-hook latency of the policy against the native reference policy on the same inputs.
    Bench {
        #[command(flatten)]
        policy: PolicyOpts,
        /// Images per reconcile.
        #[arg(long, default_value_t = 500)]
        images: usize,
        /// Measured calls per hook (after a warm-up of a tenth of that).
        #[arg(long, default_value_t = 200)]
        iterations: usize,
    },
    /// Load a policy and print its name, version, description and sha256.
    Info {
        #[command(flatten)]
        policy: PolicyOpts,
        /// The module to inspect (the same as --policy).
        #[arg(value_name = "FILE.wasm", conflicts_with = "policy")]
        module: Option<PathBuf>,
    },
}

/// `pinset compile-policy`, the child of [`pinset_policy::Compiler::Subprocess`].
pub fn compile_child() -> Result<ExitCode> {
    use anyhow::Context;
    use std::io::{Read, Write};
    let mut module = Vec::new();
    std::io::stdin()
        .read_to_end(&mut module)
        .context("reading the module from stdin")?;
    match pinset_policy::precompile(&module) {
        Ok(artifact) => {
            let mut out = std::io::stdout().lock();
            out.write_all(&artifact)
                .and_then(|()| out.flush())
                .context("writing the artifact to stdout")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(message) => {
            eprintln!("{message}");
            Ok(ExitCode::from(pinset_policy::COMPILE_INVALID_MODULE))
        }
    }
}

pub fn run(cmd: PolicyCommand) -> Result<ExitCode> {
    match cmd {
        PolicyCommand::Test { policy, scenarios } => test(&policy, &scenarios),
        PolicyCommand::Bench {
            policy,
            images,
            iterations,
        } => bench_cmd(&policy, images, iterations.max(1)),
        PolicyCommand::Info { mut policy, module } => {
            policy.policy = module.or(policy.policy);
            let (_runtime, module) = load_policy(&policy)?;
            println!("{}", describe(&module));
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn describe(module: &PolicyModule) -> String {
    let mut probe = Guarded::new(Box::new(module.instance()));
    let info = probe.info();
    let note = if probe.fallbacks().is_empty() {
        ""
    } else {
        " (info hook failed: reference shown)"
    };
    format!(
        "policy {} — {} {}{note}: {}\n  sha256 {}",
        module.name(),
        info.name,
        info.version,
        info.description,
        module.sha256()
    )
}

fn test(opts: &PolicyOpts, paths: &[PathBuf]) -> Result<ExitCode> {
    let (_runtime, module) = load_policy(opts)?;
    println!("{}", describe(&module));
    let files = scenario::collect(paths)?;
    super::warn_if_empty(
        "scenarios",
        paths,
        files.len(),
        "scenario file (*.yaml, *.yml)",
    );
    let (mut passed, mut failed) = (0, 0);
    for file in files {
        let outcome = match scenario::load(&file) {
            Ok(loaded) => {
                // A fresh instance per scenario, as per reconcile.
                let mut policy = Guarded::new(Box::new(module.instance()));
                scenario::run(&loaded, &mut policy)
            }
            Err(e) => scenario::Outcome {
                name: "(unreadable)".into(),
                path: file.clone(),
                diffs: vec![e.to_string()],
            },
        };
        if outcome.passed() {
            passed += 1;
            println!("PASS  {}  ({})", outcome.name, outcome.path.display());
        } else {
            failed += 1;
            println!("FAIL  {}  ({})", outcome.name, outcome.path.display());
            for d in &outcome.diffs {
                for line in d.lines() {
                    println!("      {line}");
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn bench_cmd(opts: &PolicyOpts, images: usize, iterations: usize) -> Result<ExitCode> {
    let (_runtime, module) = load_policy(opts)?;
    println!("{}", describe(&module));
    if cfg!(debug_assertions) {
        println!("warning: this is a debug build; measure with `cargo run --release`");
    }
    let bar = super::logging::bars()
        .add(ProgressBar::new(bench::ROWS.len() as u64))
        .with_style(
            ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
    bar.enable_steady_tick(Duration::from_millis(100));
    let rows = bench::run(&module, images, iterations, |what| {
        bar.inc(1);
        bar.set_message(what);
    })?;
    bar.finish_and_clear();
    println!("{images} images, {iterations} calls per row (median / p99)");
    println!(
        "{:<70} {:>22} {:>22} {:>8}",
        "hook", "wasm", "native", "ratio"
    );
    for row in &rows {
        println!(
            "{:<70} {:>22} {:>22} {:>7.2}x",
            row.what,
            format!("{} / {}", us(row.wasm.median), us(row.wasm.p99)),
            format!("{} / {}", us(row.native.median), us(row.native.p99)),
            row.ratio()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}
