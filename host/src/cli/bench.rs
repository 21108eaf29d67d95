//! `pinset bench`: measurements of the node pipeline (release builds; see BENCHMARKS.md).

use super::{PolicyOpts, load_policy};
use crate::core::desired::{self, NodeInfo, PinnedImageSet, ROLE_LABEL};
use crate::core::executor::Backoff;
use crate::core::status::NodeStatus;
use crate::cri::client::{CriClient, CriConfig};
use crate::cri::sim::{SimConfig, SimImage, SimulatedRuntime};
use crate::node::Reconciler;
use crate::pin::crio::CrioPins;
use crate::policy::bench::Stats;
use crate::registry::auth::Credentials;
use crate::registry::size::{Cached, TableSizer};
use anyhow::{Result, bail};
use clap::Subcommand;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// A reconcile with every image already present: pinset (one ListImages) against the
    /// reference's approach (one ImageStatus per image), same runtime, same images.
    Noop {
        /// Images in the set.
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
    let mut _server = None;
    let mut sim = None;
    let endpoint = match endpoint {
        Some(e) => e,
        None => {
            let refs: Vec<String> = (0..n)
                .map(|i| format!("registry.bench/app/{i}@sha256:{i:064x}"))
                .collect();
            let s = SimulatedRuntime::new(SimConfig {
                registry: refs
                    .iter()
                    .map(|r| SimImage {
                        reference: r.clone(),
                        size: 1 << 20,
                    })
                    .collect(),
                bandwidth: 1 << 30,
                disk_capacity: u64::MAX / 2,
                pin_drop_in: Some(
                    dir.path()
                        .join("crio.conf.d")
                        .join(crate::pin::crio::DROP_IN),
                ),
            });
            refs.iter().for_each(|r| s.preload(r));
            let server = s.serve(&dir.path().join("cri.sock")).await?;
            let e = server.endpoint();
            _server = Some(server);
            sim = Some(s);
            e
        }
    };
    let cri = CriClient::new(CriConfig {
        endpoint: endpoint.clone(),
        ..Default::default()
    })?;
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
    let set = PinnedImageSet {
        name: "bench".into(),
        generation: 1,
        labels: [(ROLE_LABEL.to_string(), "worker".to_string())].into(),
        images: present.clone(),
    };
    let node = NodeInfo {
        name: "bench-0".into(),
        labels: [("node-role.kubernetes.io/worker".to_string(), String::new())].into(),
        ready: true,
        disk_pressure: false,
        allocatable_ephemeral_bytes: Some(1 << 40),
    };
    let desired = desired::desired(&node, &desired::standard_pools(), &[set]);
    let reconciler = Reconciler {
        cri: cri.clone(),
        sizer: None::<Arc<Cached<TableSizer>>>,
        credentials: Arc::new(Credentials::default()),
        pins: CrioPins::new(dir.path().join("crio.conf.d"), Vec::new()),
        policy: module,
        backoff: Backoff::default(),
        pressure: crate::os::pressure,
        metrics: None,
    };
    let mut status = NodeStatus::default();
    // Warm up both paths (connection, caches, first pin write).
    reconciler
        .reconcile(&desired, &node, &mut status, CancellationToken::new(), None)
        .await?;
    for r in &present {
        cri.image_status(r).await?;
    }
    let (mut ours, mut reference) = (Vec::new(), Vec::new());
    let calls_before = sim.as_ref().map(|s| s.stats());
    for _ in 0..repeat {
        let t = Instant::now();
        let report = reconciler
            .reconcile(&desired, &node, &mut status, CancellationToken::new(), None)
            .await?;
        ours.push(t.elapsed());
        if !report.outcome.pulled.is_empty() {
            bail!(
                "the no-op reconcile pulled {} image(s)",
                report.outcome.pulled.len()
            );
        }
        let t = Instant::now();
        for r in &present {
            if cri.image_status(r).await?.is_none() {
                bail!("{r} vanished from the runtime during the benchmark");
            }
        }
        reference.push(t.elapsed());
    }
    let (a, b) = (Stats::of(ours), Stats::of(reference));
    println!("no-op reconcile of {n} present images, {repeat} repetitions, runtime {endpoint}");
    println!(
        "{:<44} {:>12} {:>12}   CRI calls per reconcile",
        "", "median", "p99"
    );
    let calls = match (&sim, calls_before) {
        (Some(s), Some(before)) => {
            let after = s.stats();
            let d = |k: &str| (after.calls(k) - before.calls(k)) / repeat as u64;
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
    };
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
    Ok(ExitCode::SUCCESS)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
