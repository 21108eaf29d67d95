//! `pinset policy simulate`: a pool's whole rollout played offline against a fleet policy
//! ([`pinset_core::rollout_sim`]): a chart of when each node pulls, the decisions that granted
//! nodes, and how long the rollout took; `-o json|yaml` for scripts, `--timeline FILE.svg` for a
//! picture. Exits 0 when every node reached the target, 1 when the rollout held or stalled.

mod chart;

use super::PolicyOpts;
use super::plan::Output;
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use pinset_core::rollout_sim::{self, Run, SimNode, Simulation};
use pinset_policy::{Described, Guarded};
use pinset_policy_sdk::{FleetPool, MAX_PULLING_ANNOTATION, Target, TargetSet};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The pool `policy simulate` rolls out, and how its nodes behave.
#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    #[command(flatten)]
    pub policy: PolicyOpts,
    /// Nodes in the pool, named POOL-00, POOL-01, ...
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub nodes: u32,
    /// Zones the nodes are spread over, in turn (label topology.kubernetes.io/zone: zone-a,
    /// zone-b, ...).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=26))]
    pub zones: u32,
    /// The pool's name (lowercase letters, digits, '-' and '.', as a Kubernetes object's).
    #[arg(long, default_value = "worker", value_parser = pool_name)]
    pub pool: String,
    /// The pool's pinset.io/rollout-max-pulling annotation: a count (3) or a percentage (25%).
    #[arg(long, value_name = "N|P%")]
    pub max_pulling: Option<String>,
    /// Another pool annotation, KEY=VALUE, for policies that read one; repeatable.
    #[arg(long, value_name = "KEY=VALUE", value_parser = annotation)]
    pub annotation: Vec<(String, String)>,
    /// How long a node's pull of the target takes, in seconds (the middle of the spread).
    #[arg(long, default_value_t = 60.0, value_parser = pull_seconds)]
    pub pull_seconds: f64,
    /// How much pull times differ between nodes, in percent either way (fixed per node by
    /// --seed).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub spread_percent: u32,
    /// From a pull's end to the grant it allows (the node's status write, the controller's
    /// reconcile, the grant seen by the node), in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub react_ms: u64,
    /// A node whose pull fails (index or name); repeatable.
    #[arg(long, value_name = "NODE")]
    pub fail: Vec<String>,
    /// A node that is not Ready (index or name); repeatable.
    #[arg(long, value_name = "NODE")]
    pub not_ready: Vec<String>,
    /// Seed of the nodes' pull times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also draw the rollout (a lane per node) into FILE (SVG) and FILE's .trace.json.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<PathBuf>,
    /// text for people; json or yaml for scripts.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    pub output: Output,
}

fn pool_name(text: &str) -> Result<String, String> {
    let valid = (1..=63).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && text.starts_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?}: a pool is named by 1-63 lowercase letters, digits, '-' or '.', starting \
             with a letter or digit"
        ))
    }
}

fn annotation(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{text:?}: expected KEY=VALUE")),
    }
}

fn pull_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.0..=86_400.0).contains(&s) => Ok(s),
        _ => Err(format!("{text:?}: expected seconds from 0 to 86400")),
    }
}

/// What `policy simulate -o json|yaml` prints (camelCase keys).
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
struct Report {
    policy: PolicyRef,
    pool: String,
    nodes: u32,
    zones: u32,
    max_pulling: Option<u32>,
    react_ms: u64,
    run: Run,
    /// Why the first fallback happened, when the policy's answer was not used.
    first_fallback: Option<String>,
}

#[derive(Serialize, Debug)]
struct PolicyRef {
    module: String,
    name: String,
    version: String,
}

pub fn run(args: &SimulateArgs) -> Result<ExitCode> {
    let sim = simulation(args)?;
    let runtime = pinset_policy::WasmRuntime::new()?;
    let module = runtime.bind::<pinset_policy::FleetContract>(&args.policy.compile(&runtime)?)?;
    let info = module
        .instance()
        .info()
        .unwrap_or_else(|_| pinset_policy::PolicyInfo::new("(info failed)", "", ""));
    let mut first_fallback = None;
    // At most one decision per node and one more; each takes up to the policy's deadline.
    let bar = super::logging::bars()
        .add(ProgressBar::new(u64::from(args.nodes) + 1))
        .with_style(
            ProgressStyle::with_template("{spinner} decision {pos} (at most {len}) {msg}")
                .expect("valid template"),
        );
    bar.enable_steady_tick(Duration::from_millis(100));
    let run = rollout_sim::run(&sim, |request| {
        // Failures are reported once, in the summary, not as a warning per decision.
        let decided = Guarded::of(&module).without_warnings().grant(request);
        if let (Some(f), None) = (&decided.fallback, &first_fallback) {
            first_fallback = Some(f.message.clone());
        }
        bar.inc(1);
        bar.set_message(decided.grant.reason.clone());
        (decided.grant, decided.fallback.is_some())
    });
    bar.finish_and_clear();
    let policy = PolicyRef {
        module: module.name().to_string(),
        name: info.name,
        version: info.version,
    };
    if let Some(path) = &args.timeline {
        write_timeline(path, &run, &policy, args)?;
    }
    let code = if run.complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    let report = Report {
        policy,
        pool: args.pool.clone(),
        nodes: args.nodes,
        zones: args.zones,
        max_pulling: sim.pool.max_pulling,
        react_ms: args.react_ms,
        run,
        first_fallback,
    };
    match args.output {
        Output::Text => print_text(&report, args),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Yaml => print!("{}", serde_saphyr::to_string(&report)?),
    }
    Ok(code)
}

/// The pool of `args`: nodes named in index order, zones in turn, pull times spread around the
/// middle by a hash of the seed and the node's index.
fn simulation(args: &SimulateArgs) -> Result<Simulation> {
    let n = args.nodes as usize;
    let width = (n.saturating_sub(1)).to_string().len().max(2);
    let names: Vec<String> = (0..n)
        .map(|i| format!("{}-{i:0width$}", args.pool))
        .collect();
    let failing = resolve(&args.fail, &names, "--fail")?;
    let unready = resolve(&args.not_ready, &names, "--not-ready")?;
    let mut annotations: BTreeMap<String, String> = args.annotation.iter().cloned().collect();
    if let Some(value) = &args.max_pulling {
        annotations.insert(MAX_PULLING_ANNOTATION.to_string(), value.clone());
    }
    let max_pulling = pinset_core::rollout::max_pulling(&annotations, n)
        .map_err(anyhow::Error::msg)
        .context("--max-pulling")?;
    // What the controller would append to the pool's reason is an error here.
    if let (_, Some(bad)) = pinset_core::rollout::paused(&annotations) {
        bail!("--annotation: {bad}");
    }
    let nodes = names
        .iter()
        .enumerate()
        .map(|(i, name)| SimNode {
            name: name.clone(),
            labels: labels(name, &args.pool, i, args.zones),
            ready: !unready.contains(&i),
            pull_ms: pull_ms(args, i),
            fails: failing.contains(&i),
        })
        .collect();
    Ok(Simulation {
        pool: FleetPool {
            name: args.pool.clone(),
            annotations: annotations.into_iter().collect(),
            max_pulling,
        },
        target: Target {
            sets: vec![TargetSet {
                name: format!("{}-images", args.pool),
                generation: 2,
                images: 20,
                bytes: 0,
            }],
            images: 20,
            bytes: 0,
        },
        nodes,
        react_ms: args.react_ms,
    })
}

/// The node labels a cloud node carries, sorted by key.
fn labels(name: &str, pool: &str, i: usize, zones: u32) -> Vec<(String, String)> {
    let zone = char::from(b'a' + (i % zones as usize) as u8);
    let mut labels = vec![
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        (format!("node-role.kubernetes.io/{pool}"), String::new()),
        ("topology.kubernetes.io/zone".into(), format!("zone-{zone}")),
    ];
    labels.sort();
    labels
}

/// Node `i`'s pull time: the middle, moved by up to the spread either way.
fn pull_ms(args: &SimulateArgs, i: usize) -> u64 {
    // splitmix64 of (seed, i): a fixed value in [-1, 1] per node.
    let mut z = args
        .seed
        .wrapping_add((i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    let spread = f64::from(args.spread_percent) / 100.0;
    (args.pull_seconds * 1000.0 * (1.0 + spread * unit)).round() as u64
}

/// Node indices of `given` (each an index or a name of `names`).
fn resolve(given: &[String], names: &[String], flag: &str) -> Result<Vec<usize>> {
    given
        .iter()
        .map(|g| {
            if let Some(i) = g.parse::<usize>().ok().filter(|&i| i < names.len()) {
                return Ok(i);
            }
            match names.iter().position(|n| n == g) {
                Some(i) => Ok(i),
                None => bail!(
                    "{flag} {g}: no such node in the pool (indices 0-{}, names {} to {})",
                    names.len() - 1,
                    names[0],
                    names[names.len() - 1]
                ),
            }
        })
        .collect()
}

fn write_timeline(
    path: &std::path::Path,
    run: &Run,
    policy: &PolicyRef,
    args: &SimulateArgs,
) -> Result<()> {
    let t = rollout_sim::timeline(
        run,
        format!(
            "pinset policy simulate: pool {}, fleet policy {} {}",
            args.pool, policy.name, policy.version
        ),
        vec![pool_line(args), summary(run)],
    );
    super::write_timeline(path, &t)?;
    Ok(())
}

fn pool_line(args: &SimulateArgs) -> String {
    format!(
        "pool {}: {} nodes in {} zone(s), pulls of {} ± {} %, controller reaction {}{}",
        args.pool,
        args.nodes,
        args.zones,
        human((args.pull_seconds * 1000.0) as u64),
        args.spread_percent,
        human(args.react_ms),
        args.max_pulling
            .as_ref()
            .map(|m| format!(", {MAX_PULLING_ANNOTATION}={m}"))
            .unwrap_or_default()
    )
}

/// One line: how the rollout ended.
fn summary(run: &Run) -> String {
    let nodes = run.nodes.len();
    let grants = run
        .decisions
        .iter()
        .filter(|d| !d.granted.is_empty())
        .count();
    match run.complete_ms {
        Some(ms) => format!(
            "rollout complete in {}: {nodes}/{nodes} nodes at the target, at most {} in flight, \
             {grants} granting decision(s), {} fallback(s)",
            human(ms),
            run.max_in_flight,
            run.fallbacks
        ),
        None => {
            let mut parts = vec![format!("{}/{nodes} at the target", run.done)];
            parts.extend(super::nonzero(&[
                (run.failed, "failed"),
                (run.stalled, "granted but never Ready"),
                (run.waiting, "never granted"),
            ]));
            format!(
                "rollout held after {}: {}; at most {} in flight, {} fallback(s)",
                human(run.end_ms),
                parts.join(", "),
                run.max_in_flight,
                run.fallbacks
            )
        }
    }
}

/// `0s`, `850ms`, `12.5s`, `6m12s`, `1h02m`.
fn human(ms: u64) -> String {
    match ms {
        0 => "0s".into(),
        1..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

fn print_text(report: &Report, args: &SimulateArgs) {
    let p = &report.policy;
    println!("fleet policy {} — {} {}", p.module, p.name, p.version);
    println!("{}", pool_line(args));
    println!();
    chart::print(&report.run);
    println!();
    chart::print_decisions(&report.run);
    println!();
    println!("{}", summary(&report.run));
    if let Some(why) = &report.first_fallback {
        println!(
            "{} decision(s) fell back to the default fleet policy; the first because: {why}",
            report.run.fallbacks
        );
    }
    if let Some(path) = &args.timeline {
        println!("timeline: {} (and .trace.json)", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_names_are_object_names() {
        assert_eq!(pool_name("infra-2").unwrap(), "infra-2");
        for bad in ["", "Worker", "-w", "a b", &"x".repeat(64)] {
            assert!(pool_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(0), "0s");
        assert_eq!(human(850), "850ms");
        assert_eq!(human(12_500), "12.5s");
        assert_eq!(human(372_000), "6m12s");
        assert_eq!(human(3_720_000), "1h02m");
    }
}
