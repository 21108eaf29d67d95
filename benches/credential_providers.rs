//! Credentials from the kubelet's image credential providers (release build):
//!
//! 1. Sizing 200 images of a private registry (its token service grants pulls to one credential
//!    only) with that credential from a `config.json` vs from a provider plugin (run once, its
//!    answer kept for the registry): same run, repeated and interleaved, each round with an empty
//!    size cache and fresh credentials.
//! 2. A plugin that never answers (a 1 s deadline): 50 images asked for 5 at once, as pulls ask,
//!    of one registry and of ten.
//!
//! `cargo bench --bench credential_providers` (needs docker-registry: `bash scripts/test.sh`
//! installs it). `REPEATS` (default 5) sets the repetitions of part 1.

#[path = "../tests/it/support.rs"]
mod support;

use pinset_core::desired::Desired;
use pinset_node::facts;
use pinset_registry::auth::Credentials;
use pinset_registry::credential_provider::Providers;
use pinset_registry::size::{Cached, RegistrySizer};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const IMAGES: usize = 200;
const HANGING_IMAGES: usize = 50;

fn desired_of(refs: &[String]) -> Desired {
    support::desired_for(&support::node("worker"), "worker", "bench", refs)
}

/// One round of sizing `d` with `credentials` and a fresh cache: (time, images sized).
async fn round(registry: &str, credentials: Credentials, d: &Desired) -> (Duration, usize) {
    let sizer = RegistrySizer::new(vec![registry.to_string()], Arc::new(credentials));
    let cached = Arc::new(Cached::new(sizer).with_budget(Duration::from_secs(120)));
    let absent = vec![false; d.images.len()];
    let started = Instant::now();
    let sizing = facts::sizes(Some(&cached), d, &absent).await;
    (started.elapsed(), sizing.sizes.iter().flatten().count())
}

/// A `config.json` holding the private registry's credential.
fn config_json(registry: &str, dir: &Path) -> Credentials {
    use base64::Engine;
    let pair = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        support::PRIVATE_USER,
        support::PRIVATE_PASSWORD
    ));
    let path = dir.join("config.json");
    let text = format!(r#"{{"auths": {{"{registry}": {{"auth": "{pair}"}}}}}}"#);
    std::fs::write(&path, &text).unwrap();
    Credentials::load(&path).unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn sizing(repeats: usize) {
    let Some(private) = support::PrivateRegistry::start(IMAGES, 1_024).await else {
        eprintln!("docker-registry is not installed: run `bash scripts/test.sh` once");
        return;
    };
    let host = private.registry.host.clone();
    let d = desired_of(&private.refs);
    let dir = tempfile::tempdir().unwrap();
    let (config, bin, runs) = support::provider_for(&host, dir.path());
    let (mut file, mut plugin) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let (took, sized) = round(&host, config_json(&host, dir.path()), &d).await;
        assert_eq!(sized, IMAGES);
        file.push(took);
        let providers = Providers::load(&config, &bin).unwrap();
        let credentials = Credentials::default().with_providers(Arc::new(providers));
        let (took, sized) = round(&host, credentials, &d).await;
        assert_eq!(sized, IMAGES);
        plugin.push(took);
    }
    let (file, plugin) = (median(file), median(plugin));
    println!(
        "sizing {IMAGES} private images, median of {repeats}: config.json {file:.2?}, \
         provider {plugin:.2?} ({:.2}x), the plugin run {} time(s) in all",
        plugin.as_secs_f64() / file.as_secs_f64(),
        support::plugin_runs(&runs)
    );
}

/// 50 images of `registries` registries asked for 5 at once past a plugin that never answers.
async fn hanging(registries: usize) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink("/bin/sh", bin.join("hangs")).unwrap();
    let config = dir.path().join("providers.yaml");
    let yaml = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n\
                providers:\n- name: hangs\n  matchImages: ['*.registry.test']\n  \
                defaultCacheDuration: 1h\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  \
                args: ['-c', 'sleep 600']\n";
    std::fs::write(&config, yaml).unwrap();
    let providers = Providers::load(&config, &bin)
        .unwrap()
        .with_deadline(Duration::from_secs(1));
    let providers = Arc::new(providers);
    let images: Vec<String> = (0..HANGING_IMAGES)
        .map(|i| format!("r{}.registry.test/image{i}", i % registries))
        .collect();
    let queue = Arc::new(std::sync::Mutex::new(images));
    let started = Instant::now();
    let workers = (0..5).map(|_| {
        let (providers, queue) = (providers.clone(), queue.clone());
        tokio::spawn(async move {
            loop {
                let next = queue.lock().unwrap().pop();
                let Some(image) = next else { break };
                assert!(providers.credential(&image).await.is_err());
            }
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        worker.await.unwrap();
    }
    started.elapsed()
}

#[tokio::main]
async fn main() {
    sizing(support::repeats()).await;
    for registries in [1, 10] {
        let took = hanging(registries).await;
        println!(
            "a plugin that never answers (1 s deadline): {HANGING_IMAGES} images of {registries} \
             registr{}, 5 at once: {took:.2?}",
            if registries == 1 { "y" } else { "ies" }
        );
    }
}
