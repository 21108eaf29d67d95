//! Reading a release payload (release build): `pinset set from-release` on a 200-image fixture
//! release served by a real registry that mirrors a dark source (the path a disconnected site
//! takes), the payload's base layer grown from 1 MiB to 256 MiB of incompressible data below the
//! `release-manifests/` layer — as in a real payload, where the manifests are not the top layer
//! only by luck, the base layer is read *above* them here, so every byte is streamed.
//!
//! Reported per payload size, median of `REPEATS` (default 5) runs of the `pinset` process:
//! wall time, and its peak RSS (`ru_maxrss` of the process, from `wait4`). Reading a release must
//! not hold whole layers in memory: peak RSS stays flat while the payload grows 256×.
//!
//! `cargo bench --bench releases` (needs docker-registry: `bash scripts/test.sh` installs it).

#[path = "../tests/it/support.rs"]
mod support;

use pinset_registry::tar::write::archive;
use std::time::{Duration, Instant};
use support::{GZIP_LAYER, gzip};

const COMPONENTS: usize = 200;

/// The `release-manifests/` layer of a release of `COMPONENTS` images named through `source`.
fn manifests_layer(source: &str) -> Vec<u8> {
    let tags: Vec<serde_json::Value> = (0..COMPONENTS)
        .map(|n| {
            serde_json::json!({"name": format!("component-{n}"),
                "from": {"kind": "DockerImage", "name": format!("{source}/ocp/art@sha256:{n:064x}")}})
        })
        .collect();
    let stream = serde_json::json!({"kind": "ImageStream", "metadata": {"name": "4.18.0"},
        "spec": {"tags": tags}});
    let metadata = serde_json::json!({"version": "4.18.0", "previous": ["4.17.9"]});
    gzip(&archive(&[
        (
            "release-manifests/image-references",
            &serde_json::to_vec(&stream).unwrap(),
        ),
        (
            "release-manifests/release-metadata",
            &serde_json::to_vec(&metadata).unwrap(),
        ),
    ]))
}

/// Push a release whose base layer holds `payload` bytes, above its manifests; its tag.
async fn push_release(registry: &support::Registry, source: &str, payload: usize) -> String {
    let base = gzip(&archive(&[(
        "usr/share/payload.bin",
        &support::random_bytes(payload as u64, payload),
    )]));
    let layers = [(GZIP_LAYER, manifests_layer(source)), (GZIP_LAYER, base)];
    let tag = format!("payload-{}m", payload >> 20);
    support::push_layers(
        &registry.client(),
        &registry.host,
        "ocp/release",
        &tag,
        &layers,
    )
    .await;
    tag
}

/// One `pinset set from-release` run: (wall time, peak RSS in KiB, images printed).
fn run(args: &[String]) -> (Duration, u64, usize) {
    let started = Instant::now();
    let child = support::without_terminal(std::process::Command::new(support::PINSET).args(args))
        .env("PINSET_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (ok, peak, stdout) = reap(child);
    let took = started.elapsed();
    assert!(ok, "pinset {args:?} failed");
    let images = stdout.lines().filter(|l| l.contains("- name:")).count();
    (took, peak, images)
}

/// Read the child's stdout to its end, then reap it with `wait4`: (success, its peak RSS in
/// KiB, its stdout).
fn reap(mut child: std::process::Child) -> (bool, u64, String) {
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 writes it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is this process's child, not yet reaped (std never waited for it).
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, usage.ru_maxrss as u64, stdout)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let repeats = support::repeats();
    let mirror =
        support::Registry::start().expect("docker-registry (bash scripts/test.sh installs it)");
    let dark = support::Dark::start();
    let hosts = tempfile::tempdir().unwrap();
    let dir = hosts.path().join(&dark.addr);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("hosts.toml"),
        format!(
            "server = \"http://{}\"\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            dark.addr, mirror.host
        ),
    )
    .unwrap();
    println!(
        "set from-release, {COMPONENTS} images, through a mirror of a dark source; median of {repeats}"
    );
    println!(
        "{:>12} {:>10} {:>14} {:>8}",
        "payload", "wall", "peak RSS", "images"
    );
    for mib in [1usize, 16, 64, 256] {
        let tag = push_release(&mirror, &dark.addr, mib << 20).await;
        let args: Vec<String> = [
            "set",
            "from-release",
            &format!("{}/ocp/release:{tag}", dark.addr),
            "--registry-config-path",
            hosts.path().to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec();
        let runs: Vec<(Duration, u64, usize)> = (0..repeats).map(|_| run(&args)).collect();
        assert!(
            runs.iter().all(|r| r.2 == COMPONENTS + 1),
            "every image, once"
        );
        let wall = median(runs.iter().map(|r| r.0.as_secs_f64()).collect());
        let rss = median(runs.iter().map(|r| r.1 as f64).collect());
        println!(
            "{:>9} MiB {:>8.2} s {:>10.1} MiB {:>8}",
            mib,
            wall,
            rss / 1024.0,
            COMPONENTS + 1
        );
    }
    assert_eq!(dark.connections(), 0, "the source was never contacted");
}
