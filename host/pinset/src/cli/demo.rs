//! `pinset demo`: the whole node pipeline on the embedded example, with no root, network or
//! daemon. For a control-plane node and a worker node it starts an in-process CRI image service
//! (a real gRPC server on a unix socket in a temporary directory, simulating a registry with
//! per-image sizes and a bandwidth, and a disk), runs the embedded default policy through the
//! pipeline, and shows the difference: one pull at a time with a 1 s throttle against five at once.

use super::node::{run_with_progress, summary};
use super::{PolicyOpts, load_policy};
use anyhow::{Context, Result};
use pinset_core::desired::{self, Desired, NodeInfo};
use pinset_core::status::NodeStatus;
use pinset_core::yaml::Fields;
use pinset_cri_sim::{SimConfig, SimImage, SimServer, SimulatedRuntime};
use pinset_k8s::objects::{self, Objects};
use pinset_node::Reconciler;
use pinset_node::cri::client::{CriClient, CriConfig};
use pinset_node::pin::crio::{CrioPins, DROP_IN, Reload};
use pinset_policy::{Guarded, PolicyModule};
use pinset_policy_sdk::{MIB, fmt_bytes};
use pinset_registry::size::{Cached, ImageSize, TableSizer};
use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

pub const SETS: &str = include_str!("../../../../examples/demo/sets.yaml");
pub const NODES: &str = include_str!("../../../../examples/demo/nodes.yaml");

/// Simulated registry bandwidth per pull.
const BANDWIDTH: u64 = 250 * MIB;
/// Every demo image shares this base layer.
const BASE_LAYER: (&str, u64) = ("sha256:demo-base-layer", 24 * MIB);

/// A deterministic size between 40 and 160 MiB from the image's digest.
fn own_layer_size(reference: &str) -> u64 {
    let h = reference
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    (40 + h % 120) * MIB
}

/// Per-node result for the closing comparison.
pub struct NodeRun {
    pub node: String,
    pub concurrency: u32,
    pub pulled: usize,
    pub max_in_flight: u32,
    pub makespan: std::time::Duration,
    pub bytes: u64,
    pub pinned: usize,
}

/// Where the demo draws its timelines unless told: in the system's temporary directory.
pub fn default_timeline_dir() -> std::path::PathBuf {
    std::env::temp_dir().join("pinset-demo-timelines")
}

pub async fn demo(policy: &PolicyOpts, timelines: &Path) -> Result<ExitCode> {
    let mut objects = Objects::default();
    objects::parse(
        SETS,
        Path::new("examples/demo/sets.yaml"),
        Fields::Strict,
        &mut objects,
    )?;
    objects::parse(
        NODES,
        Path::new("examples/demo/nodes.yaml"),
        Fields::Strict,
        &mut objects,
    )?;
    let (_wasm, module) = load_policy(policy)?;
    let dir = tempfile::Builder::new().prefix("pinset-demo-").tempdir()?;
    println!(
        "pinset demo — embedded default policy ({}), simulated runtime in {}",
        module.name(),
        dir.path().display()
    );
    std::fs::create_dir_all(timelines)
        .with_context(|| format!("creating the timeline directory {}", timelines.display()))?;
    let mut runs = Vec::new();
    for node in &objects.nodes {
        let timeline = timelines.join(format!("{}.timeline.svg", node.name));
        runs.push(run_node(node, &objects, &module, dir.path(), &timeline).await?);
    }
    println!(
        "\n{:<10} {:>6} {:>10} {:>10} {:>10} {:>9} {:>7}",
        "node", "pulls", "at once", "max seen", "bytes", "time", "pinned"
    );
    for r in &runs {
        println!(
            "{:<10} {:>6} {:>10} {:>10} {:>10} {:>8.1}s {:>7}",
            r.node,
            r.pulled,
            r.concurrency,
            r.max_in_flight,
            fmt_bytes(r.bytes),
            r.makespan.as_secs_f64(),
            r.pinned
        );
    }
    println!(
        "\nThe control-plane node pulls one image at a time and pauses 1 s after each; the worker \
         pulls five at once. Both decisions, and the disk admission, came from the Wasm policy."
    );
    Ok(ExitCode::SUCCESS)
}

async fn run_node(
    node: &NodeInfo,
    objects: &Objects,
    module: &PolicyModule,
    root: &Path,
    timeline: &Path,
) -> Result<NodeRun> {
    let desired = desired::desired(node, &desired::standard_pools(), &objects.sets);
    let work = root.join(&node.name);
    let drop_in_dir = work.join("crio.conf.d");
    std::fs::create_dir_all(&drop_in_dir)?;
    let (sim, server) = simulated(&desired, &work, &drop_in_dir).await?;
    let cri = CriClient::new(CriConfig {
        endpoint: server.endpoint(),
        ..Default::default()
    })?;
    // The simulated runtime re-reads the drop-in on every call: no reload command needed.
    let reconciler = Reconciler::new(cri.clone(), CrioPins::new(&drop_in_dir, Reload::None))
        .with_sizer(Arc::new(Cached::new(TableSizer {
            table: sizes(&desired),
        })));
    println!(
        "\n== {} (pools {}): {} set(s), {} image(s); CRI at {}",
        node.name,
        desired.pools.join(", "),
        desired.sets.len(),
        desired.images.len(),
        server.endpoint()
    );
    let (mut status, started) = (NodeStatus::default(), Instant::now());
    let report = run_with_progress(
        &reconciler,
        &desired,
        node,
        Box::new(Guarded::of(module)),
        &mut status,
        CancellationToken::new(),
        Some(timeline),
    )
    .await?;
    let makespan = started.elapsed();
    let Some(plan) = report.plan.clone() else {
        unreachable!("a finished reconcile has a plan")
    };
    println!("admission: {} — {}", plan.verdict(), plan.admission.reason);
    print!("{}", summary(&node.name, &report, &status));
    let pinned = show_pins(&cri, &drop_in_dir).await?;
    let stats = sim.stats();
    server.shutdown().await;
    Ok(NodeRun {
        node: node.name.clone(),
        concurrency: plan.concurrency,
        pulled: report.outcome.pulled.len(),
        max_in_flight: stats.max_in_flight,
        makespan,
        bytes: sim.used_bytes(),
        pinned,
    })
}

/// Show the drop-in written and what the runtime says is pinned; how many images are.
async fn show_pins(cri: &CriClient, drop_in_dir: &Path) -> Result<usize> {
    let drop_in = std::fs::read_to_string(drop_in_dir.join(DROP_IN)).unwrap_or_default();
    println!(
        "CRI-O drop-in {}:\n{}",
        drop_in_dir.join(DROP_IN).display(),
        indent(&drop_in)
    );
    let images = cri.list_images().await?;
    let pinned = images.iter().filter(|i| i.pinned).count();
    println!(
        "runtime reports {pinned} of {} image(s) pinned",
        images.len()
    );
    Ok(pinned)
}

/// The node's in-process CRI service: a registry of the desired images (a shared base layer and
/// one of their own each), pins read from the drop-in in `drop_in_dir`.
async fn simulated(
    desired: &Desired,
    work: &Path,
    drop_in_dir: &Path,
) -> Result<(SimulatedRuntime, SimServer)> {
    let registry: Vec<SimImage> = desired
        .images
        .iter()
        .map(|w| SimImage {
            reference: w.reference.to_string(),
            size: BASE_LAYER.1 + own_layer_size(w.reference.as_str()),
        })
        .collect();
    let sim = SimulatedRuntime::new(SimConfig {
        registry,
        bandwidth: BANDWIDTH,
        disk_capacity: 100 << 30,
        pin_drop_in: Some(drop_in_dir.join(DROP_IN)),
    });
    let server = sim
        .serve(&work.join("cri.sock"))
        .await
        .context("starting the simulated runtime")?;
    Ok((sim, server))
}

/// The sizes the simulated registry serves, as the sizer reports them.
fn sizes(desired: &Desired) -> HashMap<String, ImageSize> {
    desired
        .images
        .iter()
        .map(|w| {
            let layers = vec![
                (BASE_LAYER.0.to_string(), BASE_LAYER.1),
                (
                    format!("{}-layer", w.reference.digest()),
                    own_layer_size(w.reference.as_str()),
                ),
            ];
            (
                w.reference.to_string(),
                ImageSize {
                    layers,
                    endpoint: None,
                },
            )
        })
        .collect()
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}\n")).collect()
}
