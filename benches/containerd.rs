//! Pulls into real containerd from a real registry (release build):
//!
//! 1. Makespan of 20 images × 8 MiB distinct layers: (a) raw sequential CRI pulls, (b) raw 5-way
//!    parallel CRI pulls, (c) pinset with a policy of 5 at once and no throttle, (d) the default
//!    worker policy, (e) the default control-plane policy. Each run starts from an empty
//!    containerd; runs are repeated and interleaved.
//! 2. No-op reconcile of 500 present images: pinset against one ImageStatus per image.
//! 3. Cancellation latency: a reconcile pulling large images is cancelled once pulls are in
//!    flight; time until the reconcile has returned, over 20 trials.
//!
//! `cargo bench --bench containerd` (needs the test bed: `bash scripts/test.sh` installs it).
//! `REPEATS` (default 3) sets the repetitions of part 1; `PARTS` (default `makespan,noop,cancel`)
//! selects the parts to run.

#[path = "../tests/it/support.rs"]
mod support;

use pinset_core::desired::{self, Desired, NodeInfo, PinnedImageSet};
use pinset_core::status::NodeStatus;
use pinset_node::Reconciler;
use pinset_node::cri::client::{CriClient, CriConfig};
use pinset_node::executor::Backoff;
use pinset_node::pin::containerd::ContainerdPins;
use pinset_policy::{EMBEDDED_DEFAULT, Limits, PolicyModule, WasmRuntime};
use pinset_policy_bench::Stats;

use pinset_registry::size::RegistrySizer;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const IMAGES: usize = 20;
const LAYER: usize = 8 << 20;
const NOOP_RUNS: u32 = 20;

fn desired_for(node: &NodeInfo, role: &str, refs: &[String]) -> Desired {
    support::desired_for(node, role, "bench", refs)
}

/// One reconcile with a fresh instance of `policy`: no events, not cancelled.
async fn reconcile_once(
    rec: &Reconciler<RegistrySizer, ContainerdPins>,
    d: &Desired,
    n: &NodeInfo,
    policy: &PolicyModule,
    status: &mut NodeStatus,
) -> Result<pinset_node::Report, pinset_node::ReconcileError> {
    rec.reconcile(
        d,
        n,
        support::decisions(policy),
        status,
        CancellationToken::new(),
        None,
    )
    .await
}

fn reconciler(c: &support::Containerd, host: &str) -> Reconciler<RegistrySizer, ContainerdPins> {
    support::reconciler(c, host, Backoff::default(), true)
}

#[tokio::main]
async fn main() {
    let Some(registry) = support::Registry::start() else {
        return;
    };
    if support::containerd_binary().is_none() {
        support::skip_or_fail("containerd is not installed");
        return;
    }
    let repeats = support::repeats_or(3);
    let parts = std::env::var("PARTS").unwrap_or_else(|_| "makespan,noop,cancel".into());
    let part = |name: &str| parts.split(',').any(|p| p.trim() == name);
    let wasm = WasmRuntime::new().unwrap();
    let default = wasm
        .load(
            "embedded:default",
            EMBEDDED_DEFAULT,
            None,
            Limits::default(),
        )
        .unwrap();
    let dir = support::policy_dir();
    let unthrottled = wasm
        .load_file(
            &dir.join("pinset_test_policy_unthrottled.wasm"),
            None,
            Limits::default(),
        )
        .unwrap();
    // 1. Makespan.
    if part("makespan") {
        makespan(&registry, repeats, &default, &unthrottled).await;
    }
    // 2. No-op reconcile of 500 present images.
    if part("noop") {
        noop(&registry, &unthrottled).await;
    }
    // 3. Cancellation latency.
    if part("cancel") {
        cancellation(&registry, &unthrottled).await;
    }
    // 4. One node with 20 sets × 100 images (not in the default PARTS: it takes minutes).
    if part("scale") {
        scale(&registry, &unthrottled).await;
    }
}

/// 20 sets × 100 tiny images on one worker in real containerd: the full reconcile (5 pulls at
/// once, no pause), then no-op reconciles; time, phases, this process's memory, the status size.
async fn scale(registry: &support::Registry, policy: &PolicyModule) {
    const SETS: usize = 20;
    const PER_SET: usize = 100;
    let c = support::Containerd::start(&registry.host).unwrap();
    let t = Instant::now();
    let refs = support::push_images(registry, "scale", SETS * PER_SET, 4096, 90_000).await;
    println!(
        "\nscale: pushed {} images in {:.1?}",
        refs.len(),
        t.elapsed()
    );
    let n = support::node("worker");
    let sets: Vec<PinnedImageSet> = refs
        .chunks(PER_SET)
        .enumerate()
        .map(|(i, chunk)| PinnedImageSet::for_role(format!("scale-{i:02}"), "worker", chunk))
        .collect();
    let d = desired::desired(&n, &desired::standard_pools(), &sets);
    let rec = reconciler(&c, &registry.host);
    let me = std::process::id();
    let rss_before = support::procfs::status_kib(me, "VmRSS");
    let mut status = NodeStatus::default();
    let mut run = async || {
        let t = Instant::now();
        let r = reconcile_once(&rec, &d, &n, policy, &mut status)
            .await
            .unwrap();
        (t.elapsed(), r)
    };
    let (full, r) = run().await;
    assert_eq!(
        r.outcome.pulled.len(),
        refs.len(),
        "{:?}",
        r.outcome.failed.first()
    );
    println!(
        "  full reconcile of {} images: {full:.1?} ({})",
        refs.len(),
        r.phase_times()
    );
    let mut noops = Vec::new();
    let mut last = None;
    for _ in 0..5 {
        let (t, r) = run().await;
        assert!(r.outcome.pulled.is_empty());
        noops.push(t);
        last = Some(r);
    }
    let noop = Stats::of(noops);
    println!(
        "  no-op reconcile: median {:.1?} ({})",
        noop.median,
        last.unwrap().phase_times()
    );
    let rss_after = support::procfs::status_kib(me, "VmRSS");
    let peak = support::procfs::status_kib(me, "VmHWM");
    let published = pinset_k8s::agent::node_status(&status, &[]);
    let bytes = serde_json::to_vec(&published).unwrap().len();
    println!(
        "  this process: RSS {} → {} MiB (peak {} MiB, the harness's pushes included); status of {} sets: {bytes} bytes; done: {}",
        rss_before >> 10,
        rss_after >> 10,
        peak >> 10,
        status.sets.len(),
        status.done()
    );
}

async fn makespan(
    registry: &support::Registry,
    repeats: usize,
    default: &PolicyModule,
    unthrottled: &PolicyModule,
) {
    println!(
        "pushing {IMAGES} images of one {} MiB layer each to {}",
        LAYER >> 20,
        registry.host
    );
    let refs = support::push_images(registry, "img", IMAGES, LAYER, 1000).await;
    let cases = [
        "a raw sequential",
        "b raw 5-way",
        "c pinset 5-way, no throttle",
        "d pinset default worker",
        "e pinset default control-plane",
    ];
    let mut times: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for rep in 0..repeats {
        for case in cases {
            let c = support::Containerd::start(&registry.host).unwrap();
            let cri = CriClient::new(CriConfig {
                endpoint: c.endpoint(),
                ..Default::default()
            })
            .unwrap();
            let started = Instant::now();
            match &case[..1] {
                "a" => {
                    for r in &refs {
                        cri.pull_image(r, None).await.unwrap();
                    }
                }
                "b" => {
                    let queue = Arc::new(std::sync::Mutex::new(refs.clone()));
                    let mut tasks = tokio::task::JoinSet::new();
                    for _ in 0..5 {
                        let (cri, queue) = (cri.clone(), queue.clone());
                        tasks.spawn(async move {
                            loop {
                                let next = queue.lock().unwrap().pop();
                                let Some(r) = next else { return };
                                cri.pull_image(&r, None).await.unwrap();
                            }
                        });
                    }
                    while tasks.join_next().await.is_some() {}
                }
                k => {
                    let (policy, role) = match k {
                        "c" => (unthrottled.clone(), "worker"),
                        "d" => (default.clone(), "worker"),
                        _ => (default.clone(), "master"),
                    };
                    let n = support::node(role);
                    let d = desired_for(&n, role, &refs);
                    let (rec, policy) = (reconciler(&c, &registry.host), policy);
                    let mut status = NodeStatus::default();
                    let report = reconcile_once(&rec, &d, &n, &policy, &mut status)
                        .await
                        .unwrap();
                    assert_eq!(report.outcome.pulled.len(), IMAGES, "{case}");
                    println!("    phases: {}", report.phase_times());
                }
            }
            let t = started.elapsed();
            println!("  run {} {case}: {:.2} s", rep + 1, t.as_secs_f64());
            times.entry(case).or_default().push(t);
        }
    }
    let median = |case: &str| Stats::of(times[case].clone()).median.as_secs_f64();
    println!(
        "\nmakespan, {IMAGES} images × {} MiB, median of {repeats}:",
        LAYER >> 20
    );
    for case in cases {
        let all: Vec<String> = times[case]
            .iter()
            .map(|t| format!("{:.2}", t.as_secs_f64()))
            .collect();
        println!(
            "  {case:<32} {:>6.2} s   (runs: {})",
            median(case),
            all.join(", ")
        );
    }
    println!(
        "  (b)/(a) = {:.2}   (c)/(b) = {:.2}   (d)/(b) = {:.2}   (e)/(a) = {:.2}",
        median("b raw 5-way") / median("a raw sequential"),
        median("c pinset 5-way, no throttle") / median("b raw 5-way"),
        median("d pinset default worker") / median("b raw 5-way"),
        median("e pinset default control-plane") / median("a raw sequential")
    );
}

async fn noop(registry: &support::Registry, unthrottled: &PolicyModule) {
    let c = support::Containerd::start(&registry.host).unwrap();
    let many = support::push_images(registry, "small", 500, 4096, 50_000).await;
    let n = support::node("worker");
    let d = desired_for(&n, "worker", &many);
    let (rec, policy) = (reconciler(&c, &registry.host), unthrottled.clone());
    let mut status = NodeStatus::default();
    let first = reconcile_once(&rec, &d, &n, &policy, &mut status)
        .await
        .unwrap();
    assert_eq!(first.outcome.pulled.len(), 500);
    let (mut ours, mut reference, mut list) = (Vec::new(), Vec::new(), Vec::new());
    // containerd's own CPU time for the bare calls, from /proc (10 ms ticks, so summed over runs).
    let (mut list_cpu, mut status_cpu) = (Duration::ZERO, Duration::ZERO);
    for i in 0..NOOP_RUNS {
        let t = Instant::now();
        let r = reconcile_once(&rec, &d, &n, &policy, &mut status)
            .await
            .unwrap();
        ours.push(t.elapsed());
        assert!(r.outcome.pulled.is_empty());
        if i == 0 {
            println!("  no-op phases: {}", r.phase_times());
        }
        let (t, cpu) = (Instant::now(), support::procfs::cpu(c.pid()));
        let listed = rec.cri().list_images().await.unwrap();
        list.push(t.elapsed());
        list_cpu += support::procfs::cpu(c.pid()) - cpu;
        assert!(listed.len() >= 500);
        let cpu = support::procfs::cpu(c.pid());
        let t = Instant::now();
        for r in &many {
            assert!(rec.cri().image_status(r).await.unwrap().is_some());
        }
        reference.push(t.elapsed());
        status_cpu += support::procfs::cpu(c.pid()) - cpu;
    }
    let (a, b) = (Stats::of(ours), Stats::of(reference));
    println!(
        "\nno-op reconcile of 500 present images ({NOOP_RUNS} runs): pinset {:.2} ms, ImageStatus per image {:.2} ms, ratio {:.1}x",
        a.median.as_secs_f64() * 1e3,
        b.median.as_secs_f64() * 1e3,
        b.median.as_secs_f64() / a.median.as_secs_f64()
    );
    let runs = f64::from(NOOP_RUNS);
    println!(
        "  bare calls: one ListImages {:.2} ms (containerd CPU {:.2} ms), 500 ImageStatus (containerd CPU {:.2} ms); bound over CRI {:.1}x",
        Stats::of(list.clone()).median.as_secs_f64() * 1e3,
        list_cpu.as_secs_f64() * 1e3 / runs,
        status_cpu.as_secs_f64() * 1e3 / runs,
        b.median.as_secs_f64() / Stats::of(list).median.as_secs_f64()
    );
}

async fn cancellation(registry: &support::Registry, unthrottled: &PolicyModule) {
    let big = support::push_images(registry, "big", 5, 96 << 20, 90_000).await;
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let c = support::Containerd::start(&registry.host).unwrap();
        let n = support::node("worker");
        let d = desired_for(&n, "worker", &big);
        let (rec, policy) = (reconciler(&c, &registry.host), unthrottled.clone());
        let mut status = NodeStatus::default();
        let (r, returned_after) = support::reconcile_cancelled(
            &rec,
            (&d, &n),
            support::decisions(&policy),
            &mut status,
            (5, Duration::from_millis(50)),
        )
        .await;
        if let Some(latency) = returned_after {
            assert!(r.cancelled);
            latencies.push(latency);
        }
    }
    latencies.sort();
    println!(
        "\ncancellation with 5 pulls of 96 MiB in flight ({} trials): median {:.2} ms, max {:.2} ms",
        latencies.len(),
        latencies[latencies.len() / 2].as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3
    );
}
