//! The node agent's memory (release build): `pinset agent` as its own process, against a real
//! API server, containerd and registry, pulling and pinning one set of 20 images × 8 MiB on a
//! worker node (5 pulls at once, sized from the registry), then idle. It runs as in a pod: its
//! in-cluster configuration, its Node from the API ([`support::WorkerBed::agent`]).
//!
//! Reported per repetition: peak RSS (VmHWM) while pulling, RSS once the set is pinned and the
//! agent idles (after 3 s) with its anonymous (heap, stacks) and file-backed (the binary's own
//! pages) parts, and the time to pin the set.
//!
//! `cargo bench --bench agent` (needs the whole bed: `bash scripts/test.sh` installs it).
//! `REPEATS` (default 3).

#[path = "../tests/it/support.rs"]
mod support;

use kube::api::Api;
use pinset_k8s::api::MachineConfigNode;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let repeats = support::repeats_or(3);
    println!("agent: one set of 20 images × 8 MiB on a worker node");
    println!(
        "{:>3} {:>12} {:>10} {:>12} {:>12} {:>10}",
        "run", "peak RSS", "idle RSS", "idle anon", "idle file", "pinned in"
    );
    for run in 1..=repeats {
        let Some(bed) = support::WorkerBed::start("bench", 20, 8 << 20, 1000 * run as u64).await
        else {
            return;
        };
        let nodes: Api<MachineConfigNode> = Api::all(bed.client.clone());
        let mut agent = bed
            .agent()
            .env("PINSET_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start pinset agent");
        let started = Instant::now();
        support::wait_for(
            "the agent pinning the set",
            Duration::from_secs(300),
            || async {
                let status = nodes.get("w-0").await.ok().and_then(|n| n.status);
                let pinned = status.as_ref().is_some_and(|s| {
                    (s.pinned_image_sets.iter())
                        .any(|p| p.name == "bench" && p.current_generation == Some(1))
                });
                pinned.then_some(()).ok_or_else(|| format!("{status:?}"))
            },
        )
        .await;
        let pinned_in = started.elapsed();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (peak, idle) = (
            support::procfs::status_kib(agent.id(), "VmHWM:"),
            support::procfs::status_kib(agent.id(), "VmRSS:"),
        );
        let (anon, file) = (
            support::procfs::status_kib(agent.id(), "RssAnon:"),
            support::procfs::status_kib(agent.id(), "RssFile:"),
        );
        support::reap(&mut agent);
        let mib = |k: u64| k as f64 / 1024.0;
        println!(
            "{run:>3} {:>8.1} MiB {:>6.1} MiB {:>8.1} MiB {:>8.1} MiB {:>9.2}s",
            mib(peak),
            mib(idle),
            mib(anon),
            mib(file),
            pinned_in.as_secs_f64()
        );
    }
}
