//! A node's policy changed while the agent runs (release build): `pinset agent` as its own
//! process against a real API server, containerd and registry, following the PolicyConfiguration;
//! the pool's module alternates 20 times between two signed artifacts (the default and the
//! unthrottled test module).
//!
//! Reported per repetition: the time from each configuration change to the node's status naming
//! the new module (median and max over the 20 swaps: the watch, the fetch from the node's
//! cache after the first two, the signature check, compile from the compiled cache, the smoke
//! test and one reconcile), and the agent's idle RSS (3 s of idle each) before the first swap,
//! after the second (both modules loaded once: the running one and the one before it) and
//! after the twentieth: from the second on it must not grow (old instances, modules and their
//! compiled code are freed).
//!
//! `cargo bench --bench policy_swaps` (needs the whole bed: `bash scripts/test.sh` installs it).
//! `REPEATS` (default 3). Without a controller the agent runs `--rollout=free` (the worker bed's
//! flags): each change is taken without a grant (the canary-first path is timed in
//! tests/it/kube_e2e/policy_rollout.rs).

#[path = "../tests/it/support.rs"]
mod support;

use kube::api::Api;
use pinset_k8s::api::MachineConfigNode;
use serde_json::json;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const SWAPS: usize = 20;

/// The agent's process, killed with the bed (also when a repetition fails).
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        support::reap(&mut self.0);
    }
}

/// The agent (stopped first when dropped: fields drop in order) and its world.
struct Bed {
    agent: Agent,
    world: support::WorkerBed,
}

/// Push and sign `stem` as `repo`; its `oci://` reference.
fn release(registry: &str, key: &std::path::Path, stem: &str, repo: &str) -> String {
    let file = support::policy_path(stem);
    let pushed = support::push_policy(registry, &file, &format!("policies/{repo}:bench"));
    support::sign_policy(registry, &pushed, key);
    format!("oci://{pushed}")
}

async fn configure(client: &kube::Client, public_key: &str, module: &str) {
    let spec = json!({"verify": {"keys": [public_key]}, "pools": {"worker": {"module": module}}});
    support::apiserver::configure_policies(client, "bench", spec)
        .await
        .expect("the policy configuration");
}

async fn running(nodes: &Api<MachineConfigNode>) -> Option<String> {
    let st = nodes.get("w-0").await.ok()?.status?;
    st.policy.map(|p| p.module)
}

async fn wait_for(nodes: &Api<MachineConfigNode>, module: &str, log: &std::path::Path) -> Duration {
    let started = Instant::now();
    let (within, every) = (Duration::from_secs(60), Duration::from_millis(20));
    let log = || std::fs::read_to_string(log).unwrap_or_default();
    let what = format!("the node running {module}");
    support::poll_until(&what, within, every, &log, || async {
        match running(nodes).await {
            Some(now) if now == module => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    started.elapsed()
}

async fn start() -> Option<Bed> {
    let world = support::WorkerBed::start("swaps", 1, 1 << 20, 77).await?;
    let (registry, dir) = (&world.registry, &world.dir);
    let agent = world
        .agent()
        .args([
            "--policy-configuration=cluster",
            &format!("--policy-insecure-registry={}", registry.host),
            &format!("--policy-cache={}", dir.path().join("cache").display()),
        ])
        .env(
            "PINSET_LOG",
            std::env::var("PINSET_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("agent.log")).unwrap())
        .spawn()
        .expect("start pinset agent");
    let agent = Agent(agent);
    Some(Bed { agent, world })
}

#[tokio::main]
async fn main() {
    let repeats = support::repeats_or(3);
    println!("policy swaps: {SWAPS} changes of a pool's module on one agent");
    println!(
        "{:>3} {:>14} {:>11} {:>16} {:>17} {:>17} {:>12}",
        "run", "swap median", "swap max", "RSS before", "after 2 swaps", "after 20 swaps", "2 → 20"
    );
    for run in 1..=repeats {
        let Some(bed) = start().await else { return };
        let keys = tempfile::tempdir().unwrap();
        let (key, public_key) = support::keygen_empty(&keys.path().join("cosign"));
        let host = bed.world.registry.host.clone();
        let modules = [
            release(&host, &key, "pinset_policy_default", "default"),
            release(&host, &key, "pinset_test_policy_unthrottled", "unthrottled"),
        ];
        let nodes: Api<MachineConfigNode> = Api::all(bed.world.client.clone());
        configure(&bed.world.client, &public_key, &modules[0]).await;
        let log = bed.world.dir.path().join("agent.log");
        wait_for(&nodes, &modules[0], &log).await;
        let rss = || async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            support::procfs::status_kib(bed.agent.0.id(), "VmRSS:")
        };
        let before = rss().await;
        let mut times = Vec::new();
        let mut after_two = 0;
        for i in 1..=SWAPS {
            let module = &modules[i % 2];
            configure(&bed.world.client, &public_key, module).await;
            times.push(wait_for(&nodes, module, &log).await);
            if i == 2 {
                after_two = rss().await;
            }
        }
        let after = rss().await;
        times.sort();
        let mib = |k: u64| k as f64 / 1024.0;
        println!(
            "{run:>3} {:>11.0} ms {:>8.0} ms {:>12.1} MiB {:>13.1} MiB {:>13.1} MiB {:>+8.2} MiB",
            times[times.len() / 2].as_secs_f64() * 1e3,
            times[times.len() - 1].as_secs_f64() * 1e3,
            mib(before),
            mib(after_two),
            mib(after),
            mib(after) - mib(after_two)
        );
        drop(bed);
    }
}
