//! `pinset bench`: measurements of the node pipeline (release builds; see BENCHMARKS.md).

use super::{PolicyOpts, load_policy};
use anyhow::{Result, bail};
use clap::Subcommand;
use pinset_core::desired::{self, Desired, NodeInfo, PinnedImageSet};
use pinset_core::status::NodeStatus;
use pinset_cri_sim::{SimConfig, SimServer, SimStats, SimulatedRuntime};
use pinset_node::Reconciler;
use pinset_node::cri::client::{CriClient, CriConfig};
use pinset_node::pin::crio::CrioPins;
use pinset_policy::Guarded;
use pinset_policy_bench::Stats;
use pinset_registry::size::TableSizer;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// A reconcile with every image already present: pinset (one ListImages) against the
    /// reference's approach (one ImageStatus per image), same runtime, same images.
    Noop {
        /// Images in all, in sets of at most 500 (the API's limit per set).
        #[arg(long, default_value_t = 500)]
        images: usize,
        /// Repetitions of each side.
        #[arg(long, default_value_t = 20)]
        repeat: usize,
        /// Measure against this runtime (its first N images); default: the in-process service.
        #[arg(long)]
        cri: Option<String>,
        #[command(flatten)]
        policy: PolicyOpts,
    },
}

pub async fn run(cmd: BenchCommand) -> Result<ExitCode> {
    match cmd {
        BenchCommand::Noop {
            images,
            repeat,
            cri,
            policy,
        } => noop(images, repeat.max(1), cri, &policy).await,
    }
}

async fn noop(
    n: usize,
    repeat: usize,
    endpoint: Option<String>,
    policy: &PolicyOpts,
) -> Result<ExitCode> {
    let (_wasm, module) = load_policy(policy)?;
    let dir = tempfile::tempdir()?;
    let (_server, sim, endpoint) = runtime(endpoint, n, dir.path()).await?;
    let cri = CriClient::new(CriConfig {
        endpoint: endpoint.clone(),
        ..Default::default()
    })?;
    let present = present_images(&cri, n, &endpoint).await?;
    let (node, desired) = bench_node(present.clone());
    let reconciler: Reconciler<TableSizer, _> = Reconciler::new(
        cri.clone(),
        CrioPins::new(
            dir.path().join("crio.conf.d"),
            pinset_node::pin::crio::Reload::None,
        ),
    );
    let mut status = NodeStatus::default();
    let reconcile = async |status: &mut NodeStatus| {
        let decisions = Box::new(Guarded::of(&module));
        reconciler
            .reconcile(
                &desired,
                &node,
                decisions,
                status,
                CancellationToken::new(),
                None,
            )
            .await
    };
    // Warm up both paths (connection, caches, first pin write).
    reconcile(&mut status).await?;
    statuses(&cri, &present).await?;
    let (mut ours, mut reference, mut phases) = (Vec::new(), Vec::new(), Vec::new());
    let calls_before = sim.as_ref().map(|s| s.stats());
    for _ in 0..repeat {
        let t = Instant::now();
        let report = reconcile(&mut status).await?;
        ours.push(t.elapsed());
        phases = report.phases;
        let pulled = report.outcome.pulled.len();
        anyhow::ensure!(pulled == 0, "the no-op reconcile pulled {pulled} image(s)");
        reference.push(statuses(&cri, &present).await?);
    }
    let calls = call_counts(sim.as_ref(), calls_before, repeat as u64, n);
    println!("no-op reconcile of {n} present images, {repeat} repetitions, runtime {endpoint}");
    print_noop(Stats::of(ours), Stats::of(reference), calls);
    print_phases_and_status(&phases, &status);
    Ok(ExitCode::SUCCESS)
}

/// The runtime measured: the one at `endpoint`, else a simulated one holding `n` images
/// (kept serving while the server lives).
async fn runtime(
    endpoint: Option<String>,
    n: usize,
    dir: &Path,
) -> Result<(Option<SimServer>, Option<SimulatedRuntime>, String)> {
    Ok(match endpoint {
        Some(e) => (None, None, e),
        None => {
            let (server, sim) = simulated(n, dir).await?;
            let e = server.endpoint();
            (Some(server), Some(sim), e)
        }
    })
}

/// The baseline: one ImageStatus per image, as a no-op reconcile needs at least; its time.
async fn statuses(cri: &CriClient, present: &[String]) -> Result<std::time::Duration> {
    let t = Instant::now();
    for r in present {
        if cri.image_status(r).await?.is_none() {
            bail!("{r} vanished from the runtime during the benchmark");
        }
    }
    Ok(t.elapsed())
}

/// The first `n` images of the runtime, by repo digest.
async fn present_images(cri: &CriClient, n: usize, endpoint: &str) -> Result<Vec<String>> {
    let present: Vec<String> = cri
        .list_images()
        .await?
        .into_iter()
        .filter_map(|i| i.repo_digests.into_iter().next())
        .take(n)
        .collect();
    if present.len() < n {
        bail!(
            "{endpoint} holds {} image(s) with a repo digest; the benchmark needs {n}",
            present.len()
        );
    }
    Ok(present)
}

/// CRI calls per reconcile of each side: counted by the in-process service, else as designed.
fn call_counts(
    sim: Option<&SimulatedRuntime>,
    before: Option<SimStats>,
    repeat: u64,
    n: usize,
) -> (String, String) {
    match (sim, before) {
        (Some(s), Some(before)) => {
            let after = s.stats();
            let d = |k: &str| (after.calls(k) - before.calls(k)) / repeat;
            (
                format!(
                    "{} ListImages + {} ImageFsInfo",
                    d("ListImages"),
                    d("ImageFsInfo")
                ),
                format!("{} ImageStatus", d("ImageStatus")),
            )
        }
        _ => (
            "1 ListImages + 1 ImageFsInfo".into(),
            format!("{n} ImageStatus"),
        ),
    }
}

/// The in-process CRI service holding `n` images, pins read from a drop-in under `dir`.
async fn simulated(n: usize, dir: &Path) -> Result<(SimServer, SimulatedRuntime)> {
    let refs: Vec<String> = (0..n)
        .map(|i| format!("registry.bench/app/{i}@sha256:{i:064x}"))
        .collect();
    let drop_in = dir
        .join("crio.conf.d")
        .join(pinset_node::pin::crio::DROP_IN);
    let sim = SimulatedRuntime::new(SimConfig {
        disk_capacity: u64::MAX / 2,
        ..SimConfig::uniform(&refs, 1 << 20, drop_in)
    });
    refs.iter().for_each(|r| sim.preload(r));
    let server = sim.serve(&dir.join("cri.sock")).await?;
    Ok((server, sim))
}

/// A worker node whose one set holds `images`.
fn bench_node(images: Vec<String>) -> (NodeInfo, Desired) {
    let sets: Vec<PinnedImageSet> = images
        .chunks(500)
        .enumerate()
        .map(|(n, chunk)| PinnedImageSet::for_role(format!("bench-{n:03}"), "worker", chunk))
        .collect();
    let node = NodeInfo {
        name: "bench-0".into(),
        labels: [("node-role.kubernetes.io/worker".to_string(), String::new())].into(),
        ready: true,
        disk_pressure: false,
        allocatable_ephemeral_bytes: Some(1 << 40),
    };
    let desired = desired::desired(&node, &desired::standard_pools(), &sets);
    (node, desired)
}

/// The last reconcile's phases, and the size of the status an agent would publish for it.
fn print_phases_and_status(phases: &[(&'static str, Duration)], status: &NodeStatus) {
    let phases: Vec<String> = phases
        .iter()
        .map(|(name, d)| format!("{name} {}", ms(*d)))
        .collect();
    println!("pinset's last reconcile: {}", phases.join(", "));
    let published = pinset_k8s::agent::node_status(status, &[]);
    let bytes = serde_json::to_vec(&published).map_or(0, |v| v.len());
    println!(
        "MachineConfigNode status of {} set(s): {bytes} bytes",
        status.sets.len()
    );
}

fn print_noop(a: Stats, b: Stats, calls: (String, String)) {
    println!(
        "{:<44} {:>12} {:>12}   CRI calls per reconcile",
        "", "median", "p99"
    );
    println!(
        "{:<44} {:>12} {:>12}   {}",
        "pinset (snapshot + policy + pin check)",
        ms(a.median),
        ms(a.p99),
        calls.0
    );
    println!(
        "{:<44} {:>12} {:>12}   {}",
        "reference (ImageStatus per image)",
        ms(b.median),
        ms(b.p99),
        calls.1
    );
    println!(
        "ratio (reference / pinset, medians): {:.1}x",
        b.median.as_secs_f64() / a.median.as_secs_f64()
    );
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
