//! The kubelet's image credential providers, end to end: a registry (the bed's, behind a token
//! service that grants pulls to one credential only), a provider plugin run as the kubelet runs
//! it that gives that credential, and pinset sizing (`pinset plan`) and pulling through a real
//! containerd with it — and failing to without it.

use crate::support;

use pinset_core::desired;
use pinset_core::status::NodeStatus;
use pinset_node::executor::Backoff;
use pinset_registry::auth::Credentials;
use pinset_registry::credential_provider::Providers;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const USER: &str = "AWS";
const PASSWORD: &str = "from-the-plugin";

/// A token service that grants a pull token only to `USER:PASSWORD` (basic authentication, as
/// pinset and containerd send it), a push token to anyone (the test's own pushes); it counts
/// what it granted and refused. containerd first POSTs an OAuth form, which this one, like
/// some registries, does not serve (404): containerd then asks with basic authentication.
struct TokenService {
    addr: String,
    granted: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

impl TokenService {
    fn start() -> TokenService {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (granted, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (g, r) = (granted.clone(), refused.clone());
        use base64::Engine;
        let pair = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
        let expected = format!("authorization: basic {pair}");
        // Lives as long as the test process; each answer closes its connection.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let head = read_head(&mut stream).to_lowercase();
                let status = if head.starts_with("post ") {
                    "404 Not Found"
                } else if head.contains("push") {
                    "200 OK"
                } else if head.lines().any(|l| l.trim() == expected.to_lowercase()) {
                    g.fetch_add(1, Ordering::SeqCst);
                    "200 OK"
                } else {
                    r.fetch_add(1, Ordering::SeqCst);
                    "401 Unauthorized"
                };
                let body = r#"{"token":"pinset-test","access_token":"pinset-test"}"#;
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        TokenService {
            addr,
            granted,
            refused,
        }
    }

    fn granted(&self) -> usize {
        self.granted.load(Ordering::SeqCst)
    }

    fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }
}

/// A request's line and headers (at most 64 KiB).
fn read_head(stream: &mut std::net::TcpStream) -> String {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A private registry: the bed's registry behind [`TokenService`], with two images pushed.
async fn private_registry() -> Option<(TokenService, support::Registry, Vec<String>)> {
    let tokens = TokenService::start();
    let auth = format!(
        "auth:\n  silly:\n    realm: http://{}/token\n    service: pinset-test\n",
        tokens.addr
    );
    let registry = support::Registry::start_with(&auth)?;
    let refs = support::push_images(&registry, "private", 2, 40_000, 700).await;
    Some((tokens, registry, refs))
}

/// A node's provider configuration for `registry`, its plugin (the shell, as `ecr-login`, its
/// script in its arguments) giving `USER:PASSWORD` for it and counting its runs in `runs`; the
/// configuration file and the bin directory.
fn provider_for(registry: &str, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // A link, not a written script: an executable just written may be held open by another
    // test's fork ("text file busy").
    std::os::unix::fs::symlink("/bin/sh", bin.join("ecr-login")).unwrap();
    let runs = dir.join("runs");
    let answer = serde_json::json!({
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderResponse",
        "cacheKeyType": "Registry",
        "cacheDuration": "6h",
        "auth": {registry: {"username": USER, "password": PASSWORD}},
    });
    let script = format!(
        "cat >/dev/null; echo run >> {}; printf '%s' '{answer}'",
        runs.display()
    );
    let config = dir.join("credential-providers.yaml");
    let yaml = format!(
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
         - name: ecr-login\n  matchImages: [{registry:?}]\n  defaultCacheDuration: 12h\n  \
         apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: ['-c', {script:?}]\n"
    );
    std::fs::write(&config, yaml).unwrap();
    (config, bin, runs)
}

fn runs(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// `pinset plan` sizes a private registry's images with the credential a provider gives (the
/// plugin run once: its answer is kept for the registry); without the provider, the registry
/// refuses and the sizes are unknown.
#[tokio::test]
async fn plan_sizes_a_private_registrys_images_with_a_providers_credential() {
    let Some((tokens, registry, refs)) = private_registry().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (config, bin, count) = provider_for(&registry.host, dir.path());
    let sets = dir.path().join("sets.yaml");
    std::fs::write(&sets, support::set_yaml("apps", None, &refs)).unwrap();
    let node = dir.path().join("node.yaml");
    std::fs::write(&node, support::worker_yaml("")).unwrap();
    let insecure = ["--insecure-registry", &registry.host];

    let plan = support::plan_json(&sets, &node, &insecure).await;
    let sizes = |plan: &serde_json::Value| -> Vec<Option<u64>> {
        let pulls = plan["pulls"].as_array().unwrap().iter();
        pulls.map(|p| p["sizeBytes"].as_u64()).collect()
    };
    assert_eq!(sizes(&plan), [None, None], "without a credential: {plan}");
    assert!(tokens.refused() > 0 && tokens.granted() == 0);

    let with_provider = [
        &insecure[..],
        &[
            "--image-credential-provider-config",
            config.to_str().unwrap(),
            "--image-credential-provider-bin-dir",
            bin.to_str().unwrap(),
        ],
    ]
    .concat();
    let plan = support::plan_json(&sets, &node, &with_provider).await;
    assert!(
        sizes(&plan).iter().all(|s| s.is_some_and(|b| b >= 40_000)),
        "{plan}"
    );
    assert!(tokens.granted() > 0);
    assert_eq!(runs(&count), 1, "the answer kept for the registry");
}

/// containerd pulls a private image with the credential pinset passes it through CRI, from the
/// provider; the same pull without it fails, naming the image.
#[tokio::test]
async fn containerd_pulls_a_private_image_with_a_providers_credential() {
    let Some((tokens, registry, refs)) = private_registry().await else {
        return;
    };
    let Some(containerd) = support::Containerd::start(&registry.host) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (config, bin, count) = provider_for(&registry.host, dir.path());
    let quick = Backoff {
        attempts: 2,
        first: Duration::from_millis(20),
        cap: Duration::from_millis(50),
    };
    let node = support::node("worker");
    let set = desired::PinnedImageSet::for_role("private", "worker", &refs[..1]);
    let wanted = desired::desired(&node, &desired::standard_pools(), &[set]);

    let anonymous = support::reconciler(&containerd, &registry.host, quick, false);
    let mut status = NodeStatus::default();
    let report = support::reconcile_default(&anonymous, &wanted, &node, &mut status, None)
        .await
        .unwrap();
    assert_eq!(report.outcome.failed.len(), 1, "{report:?}");
    let err = status.sets["private"].last_failed_generation_error.clone();
    support::assert_says(&err.unwrap_or_default(), &[&refs[0]]);
    assert!(tokens.refused() > 0);
    assert_eq!(tokens.granted(), 0);

    let providers = Providers::load(&config, &bin).unwrap();
    let credentials = Arc::new(Credentials::default().with_providers(providers));
    let private = support::reconciler_with(&containerd, &registry.host, quick, false, credentials);
    let mut status = NodeStatus::default();
    let report = support::reconcile_default(&private, &wanted, &node, &mut status, None)
        .await
        .unwrap();
    assert_eq!(report.outcome.pulled.len(), 1, "{report:?} {status:?}");
    let image = private.cri().image_status(&refs[0]).await.unwrap();
    assert!(
        image.is_some_and(|i| i.pinned),
        "{} pulled and pinned",
        refs[0]
    );
    assert!(tokens.granted() > 0);
    assert_eq!(runs(&count), 1);
}
