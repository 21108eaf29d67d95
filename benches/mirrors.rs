//! Sizing at a disconnected site (release build):
//!
//! 1. 500 images sized directly from a registry vs through a containerd `hosts.toml` mirror of
//!    the same registry (the source's name dark), same run, repeated and interleaved; each
//!    round with an empty size cache.
//! 2. What a dark source (accepts connections, never answers) costs a round of sizing of 40
//!    images: with no mirror (first round: the sizing budget or the request timeout; the next
//!    round: skipped while dark), and with a mirror configured (never contacted).
//!
//! `cargo bench --bench mirrors` (needs docker-registry: `bash scripts/test.sh` installs it).
//! `REPEATS` (default 5) sets the repetitions of part 1.

#[path = "../tests/it/support.rs"]
mod support;

use pinset_core::desired::Desired;
use pinset_node::facts;
use pinset_registry::mirrors::MirrorSource;
use pinset_registry::size::{Cached, RegistrySizer, SIZING_BUDGET};
use std::sync::Arc;
use std::time::{Duration, Instant};

const IMAGES: usize = 500;
const DARK_IMAGES: usize = 40;

fn desired_of(refs: &[String]) -> Desired {
    support::desired_for(&support::node("worker"), "worker", "bench", refs)
}

/// One round of sizing `d` with a fresh cache: (time, images sized, images left).
async fn round(sizer: RegistrySizer, d: &Desired, budget: Duration) -> (Duration, usize, usize) {
    let cached = Arc::new(Cached::new(sizer).with_budget(budget));
    let absent = vec![false; d.images.len()];
    let started = Instant::now();
    let sizing = facts::sizes(Some(&cached), d, &absent).await;
    let took = started.elapsed();
    let sized = sizing.sizes.iter().flatten().count();
    (took, sized, sizing.left.iter().map(|l| l.images).sum())
}

#[tokio::main]
async fn main() {
    let repeats = support::repeats();
    let Some(registry) = support::Registry::start() else {
        eprintln!("docker-registry is not installed: run `bash scripts/test.sh` once");
        return;
    };
    let dark_source = support::Dark::start();
    let dark = dark_source.addr.clone();
    eprintln!("pushing {IMAGES} images to {}", registry.host);
    let direct = support::push_images(&registry, "m", IMAGES, 2_048, 7_000).await;
    let via_mirror: Vec<String> = direct
        .iter()
        .map(|r| r.replacen(&registry.host, &dark, 1))
        .collect();
    let hosts = tempfile::tempdir().unwrap();
    std::fs::create_dir(hosts.path().join(&dark)).unwrap();
    std::fs::write(
        hosts.path().join(&dark).join("hosts.toml"),
        format!(
            "server = \"http://{dark}\"\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            registry.host
        ),
    )
    .unwrap();
    let through = || {
        let sizer = RegistrySizer::new(Vec::new(), Arc::default())
            .with_mirrors(MirrorSource::HostsDir(hosts.path().to_path_buf()));
        pinset_registry::size::Sizer::refresh(&sizer).unwrap();
        sizer
    };
    let straight = || RegistrySizer::new(vec![registry.host.clone()], Arc::default());
    let (d_direct, d_mirror) = (desired_of(&direct), desired_of(&via_mirror));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let (t, sized, _) = round(straight(), &d_direct, SIZING_BUDGET).await;
        assert_eq!(sized, IMAGES);
        a.push(t);
        let (t, sized, _) = round(through(), &d_mirror, SIZING_BUDGET).await;
        assert_eq!(sized, IMAGES, "every image sized through the mirror");
        b.push(t);
    }
    println!("## sizing {IMAGES} images, {repeats} rounds each (median, min–max)");
    let (ma, mb) = (summary("direct", &mut a), summary("via mirror", &mut b));
    println!(
        "ratio        {:.2}× (median via mirror / median direct)",
        mb / ma
    );
    dark_cost(&dark, &registry, &hosts).await;
}

/// Print a row (median, min–max) and return the median in seconds.
fn summary(name: &str, samples: &mut [Duration]) -> f64 {
    samples.sort_unstable();
    let median = samples[samples.len() / 2];
    println!(
        "{name:<12} {median:>9.1?}  ({:.1?}–{:.1?})",
        samples[0],
        samples[samples.len() - 1]
    );
    median.as_secs_f64()
}

/// Part 2: 40 images whose registry is dark.
async fn dark_cost(dark: &str, registry: &support::Registry, hosts: &tempfile::TempDir) {
    let refs = support::push_images(registry, "dark", DARK_IMAGES, 2_048, 9_000).await;
    let on_dark: Vec<String> = refs
        .iter()
        .map(|r| r.replacen(&registry.host, dark, 1))
        .collect();
    let d = desired_of(&on_dark);
    println!("## a dark source, {DARK_IMAGES} images");
    // No mirror: the same sizer twice (its dark memory), then with the mirror.
    let sizer = Arc::new(Cached::new(RegistrySizer::new(
        vec![dark.to_string()],
        Arc::default(),
    )));
    let absent = vec![false; d.images.len()];
    for name in ["no mirror, first round", "no mirror, next round"] {
        let started = Instant::now();
        let sizing = facts::sizes(Some(&sizer), &d, &absent).await;
        let left: usize = sizing.left.iter().map(|l| l.images).sum();
        println!(
            "{name:<24} {:>9.1?}  ({left} left unsized)",
            started.elapsed()
        );
    }
    let mirrored = RegistrySizer::new(Vec::new(), Arc::default())
        .with_mirrors(MirrorSource::HostsDir(hosts.path().to_path_buf()));
    let (t, sized, _) = round(mirrored, &d, SIZING_BUDGET).await;
    println!(
        "{:<24} {t:>9.1?}  ({sized} sized through the mirror)",
        "mirror configured"
    );
}
