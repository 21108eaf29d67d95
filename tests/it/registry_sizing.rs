//! Sizing against a real registry (`docker-registry`) with images built and pushed here.

use crate::support;

use pinset_core::reference::ImageRef;
use pinset_registry::auth::Credentials;
use pinset_registry::size::{Cached, RegistrySizer, Sizer};
use std::sync::Arc;

#[tokio::test]
async fn sizes_match_what_was_pushed_with_indexes_resolved_and_shared_layers_named_once() {
    let Some(registry) = support::Registry::start() else {
        return;
    };
    let client = registry.client();
    let host = registry.host.clone();
    let base = support::layer(1, 300_000);
    let a_own = support::layer(2, 120_000);
    let b_own = support::layer(3, 50_000);
    // Two images on one base layer.
    let push = async |repo: &str, own: &Vec<u8>| {
        let layers = [base.clone(), own.clone()];
        support::push_image(&client, &host, repo, support::arch(), &layers).await
    };
    let (a, a_manifest) = push("pinset/a", &a_own).await;
    let (b, _) = push("pinset/b", &b_own).await;
    // A multi-platform image: the other platform's manifest is much larger; the node's is sized.
    let index = support::push_two_platforms(
        &client,
        &host,
        "pinset/multi",
        support::layer(4, 70_000),
        support::layer(5, 900_000),
    )
    .await;

    let sizer = Cached::new(RegistrySizer::new(
        vec![host.clone()],
        Arc::new(Credentials::default()),
    ));
    let size_of =
        |repo: &str, digest: &str| ImageRef::parse(&format!("{host}/{repo}@{digest}")).unwrap();

    let sa = sizer.size(&size_of("pinset/a", &a)).await.unwrap();
    assert_eq!(sa.total(), (base.len() + a_own.len()) as u64);
    assert_eq!(sa.layers.len(), 2);
    assert_eq!(sa.layers[0].0, a_manifest.layers[0].digest);
    let sb = sizer.size(&size_of("pinset/b", &b)).await.unwrap();
    assert_eq!(
        sa.layers[0], sb.layers[0],
        "the shared base layer has one digest: counted once downstream"
    );
    let multi = sizer.size(&size_of("pinset/multi", &index)).await.unwrap();
    assert_eq!(multi.layers.len(), 1);
    assert_eq!(
        multi.total(),
        support::layer(4, 70_000).len() as u64,
        "index resolved to {}",
        support::arch()
    );
    assert_eq!(sizer.cached(), 3);

    // Unknown image and unreachable registry: an error naming the image, never a size of 0.
    let missing = sizer
        .size(&size_of("pinset/none", &support::sha256(b"nothing")))
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("pinset/none"), "{missing}");
    drop(registry);
    let gone = RegistrySizer::new(vec![host.clone()], Arc::new(Credentials::default()));
    let e = Cached::new(gone)
        .size(&size_of("pinset/b", &support::sha256(b"other")))
        .await
        .unwrap_err();
    assert!(e.to_string().contains(&host), "{e}");
}

/// A token service on loopback that grants every request the same bearer token, counting them.
struct TokenService {
    addr: String,
    served: Arc<std::sync::atomic::AtomicUsize>,
}

impl TokenService {
    fn start() -> TokenService {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = served.clone();
        // Lives as long as the test process; each answer closes its connection.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body =
                    r#"{"token":"pinset-test","access_token":"pinset-test","expires_in":300}"#;
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        TokenService { addr, served }
    }

    fn served(&self) -> usize {
        self.served.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A registry that refuses anonymous requests (`silly` auth: a bearer challenge for any request
/// without an Authorization header): the one-request anonymous path is refused, and the sizer
/// goes through the distribution client's token flow, for this image and the next.
#[tokio::test]
async fn a_registry_that_wants_a_token_is_sized_through_the_token_flow() {
    let tokens = TokenService::start();
    let auth = format!(
        "auth:\n  silly:\n    realm: http://{}/token\n    service: pinset-test\n",
        tokens.addr
    );
    let Some(registry) = support::Registry::start_with(&auth) else {
        return;
    };
    let refs = support::push_images(&registry, "private", 2, 50_000, 500).await;
    assert!(
        tokens.served() > 0,
        "pushing needed tokens: the registry wants them"
    );
    let sizer = RegistrySizer::new(
        vec![registry.host.clone()],
        Arc::new(Credentials::default()),
    );
    for reference in &refs {
        let before = tokens.served();
        let size = sizer.size(&ImageRef::parse(reference).unwrap()).await;
        let size = size.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(size.layers.len(), 1);
        assert!(size.total() > 0);
        assert!(
            tokens.served() > before,
            "{reference} was sized with a token"
        );
    }
}

/// `pinset plan` sizes what it would pull like a reconcile does: the sizes the policy's admission
/// sees come from the registry (here, the bed's), and `plan -o json` reports them per pull.
#[tokio::test]
async fn plan_sizes_images_from_their_registry() {
    let Some(registry) = support::Registry::start() else {
        return;
    };
    let refs = support::push_images(&registry, "plan", 3, 300_000, 900).await;
    let dir = tempfile::tempdir().unwrap();
    let sets = dir.path().join("sets.yaml");
    std::fs::write(&sets, support::set_yaml("apps", None, &refs)).unwrap();
    let node = dir.path().join("node.yaml");
    std::fs::write(&node, support::worker_yaml("")).unwrap();
    let plan = support::plan_json(&sets, &node, &["--insecure-registry", &registry.host]).await;
    let pulls = plan["pulls"].as_array().unwrap();
    assert_eq!(pulls.len(), 3);
    for p in pulls {
        let bytes = p["sizeBytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("unsized: {p}"));
        assert!(bytes >= 300_000, "{p}");
    }
    assert_eq!(
        plan["knownBytes"].as_u64(),
        Some(pulls.iter().map(|p| p["sizeBytes"].as_u64().unwrap()).sum())
    );
    // --no-sizing stays offline: the sizes are unknown.
    let plan = support::plan_json(&sets, &node, &["--no-sizing"]).await;
    assert!(
        plan["pulls"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["sizeBytes"].is_null())
    );
}
