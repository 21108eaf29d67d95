//! Image sizes: compressed bytes per layer, resolved for the node's platform, cached by digest.

use pinset_core::reference::ImageRef;
use std::collections::HashMap;
use std::sync::Mutex;

/// An image's compressed layers for this node's platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSize {
    /// (layer digest, compressed bytes).
    pub layers: Vec<(String, u64)>,
}

impl ImageSize {
    pub fn total(&self) -> u64 {
        self.layers.iter().map(|(_, s)| s).sum()
    }
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("sizing {image}: {why}")]
pub struct SizeError {
    pub image: String,
    pub why: String,
}

/// Where sizes come from: a registry, or a table in tests and the demo.
pub trait Sizer: Send + Sync {
    fn size(&self, image: &ImageRef) -> impl Future<Output = Result<ImageSize, SizeError>> + Send;
}

/// A fixed table: reference → layers.
#[derive(Clone, Debug, Default)]
pub struct TableSizer {
    pub table: HashMap<String, ImageSize>,
}

impl Sizer for TableSizer {
    async fn size(&self, image: &ImageRef) -> Result<ImageSize, SizeError> {
        self.table
            .get(image.as_str())
            .cloned()
            .ok_or_else(|| SizeError {
                image: image.to_string(),
                why: "not in the size table".into(),
            })
    }
}

/// Sizes never change for a digest: cache them for the life of the process.
pub struct Cached<S> {
    inner: S,
    cache: Mutex<HashMap<String, ImageSize>>,
}

impl<S: Sizer> Cached<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub async fn size(&self, image: &ImageRef) -> Result<ImageSize, SizeError> {
        if let Some(hit) = self.cache.lock().expect("size cache").get(image.digest()) {
            return Ok(hit.clone());
        }
        let size = self.inner.size(image).await?;
        self.cache
            .lock()
            .expect("size cache")
            .insert(image.digest().to_string(), size.clone());
        Ok(size)
    }

    pub fn cached(&self) -> usize {
        self.cache.lock().expect("size cache").len()
    }
}

/// The reference the distribution client speaks of, built from the parts [`ImageRef`] already
/// validated. Parsing the string again with the client's own parser would build its reference
/// regex (Unicode classes): ~7 MiB for the automaton plus ~5 MiB of matching cache per thread
/// that parsed, held for the life of the process — most of the agent's idle heap
/// (`benches/agent.rs`). Docker Hub names of one component live under `library/`.
pub fn distribution_reference(image: &ImageRef) -> oci_client::Reference {
    let repository = match image.registry() {
        "docker.io" if !image.repository().contains('/') => {
            format!("library/{}", image.repository())
        }
        _ => image.repository().to_string(),
    };
    oci_client::Reference::with_digest(
        image.registry().to_string(),
        repository,
        image.digest().to_string(),
    )
}

/// Sizes from the registry's manifests (OCI distribution API): an index is resolved to this
/// node's platform, the image's layers are summed. Credentials from [`Credentials`]; registries
/// listed as insecure are spoken to over plain HTTP (loopback test registries).
///
/// Without credentials the manifest is first asked for directly ([`Anonymous`]); a registry that
/// answers 401 or 403 is then left to the distribution client's authentication flow (token
/// challenge, basic) for the life of the sizer.
///
/// [`Credentials`]: crate::registry::auth::Credentials
pub struct RegistrySizer {
    client: oci_client::Client,
    anonymous: Anonymous,
    credentials: std::sync::Arc<crate::registry::auth::Credentials>,
}

/// The manifest of a registry that needs no authentication, in one request. The distribution
/// client probes `/v2/` before every manifest of such a registry (it caches tokens, and such a
/// registry gives none), which doubles the requests of a sizing; measured in
/// `benches/containerd.rs` (sizing phase).
struct Anonymous {
    /// `None` when the HTTP client cannot be built: every registry then goes through the
    /// distribution client.
    http: Option<reqwest::Client>,
    insecure: Vec<String>,
    /// Registries that refused an anonymous request.
    refused: Mutex<std::collections::HashSet<String>>,
}

/// The largest manifest accepted (the distribution spec's limit for a manifest).
const MAX_MANIFEST_BYTES: usize = 4 << 20;

const MANIFEST_TYPES: [&str; 4] = [
    oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
    oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

impl Anonymous {
    fn new(insecure: Vec<String>) -> Self {
        // The TLS stack needs a process-wide crypto provider; a second install is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .read_timeout(std::time::Duration::from_secs(30))
            .build()
            .inspect_err(|e| tracing::warn!(error = %e, "anonymous manifest requests disabled"))
            .ok();
        Self {
            http,
            insecure,
            refused: Mutex::default(),
        }
    }

    fn refused(&self, registry: &str) -> bool {
        self.http.is_none() || self.refused.lock().expect("refused").contains(registry)
    }

    /// The image manifest for this platform; `Ok(None)` when the registry wants credentials.
    async fn manifest(
        &self,
        reference: &oci_client::Reference,
    ) -> Result<Option<oci_client::manifest::OciImageManifest>, String> {
        use oci_client::manifest::OciManifest;
        let Some(http) = &self.http else {
            return Ok(None);
        };
        let registry = reference.resolve_registry();
        let scheme = match self.insecure.iter().any(|r| r == registry) {
            true => "http",
            false => "https",
        };
        let mut digest = reference.digest().unwrap_or_default().to_string();
        // An index, then the platform's manifest.
        for _ in 0..2 {
            let url = format!(
                "{scheme}://{registry}/v2/{}/manifests/{digest}",
                reference.repository()
            );
            let response = http
                .get(&url)
                .header(reqwest::header::ACCEPT, MANIFEST_TYPES.join(", "))
                .send()
                .await
                .map_err(|e| format!("GET {url}: {}", super::causes(&e)))?;
            let status = response.status();
            if status == reqwest::StatusCode::UNAUTHORIZED
                || status == reqwest::StatusCode::FORBIDDEN
            {
                self.refused
                    .lock()
                    .expect("refused")
                    .insert(registry.to_string());
                return Ok(None);
            }
            if !status.is_success() {
                return Err(format!("GET {url}: {status}"));
            }
            if response
                .content_length()
                .is_some_and(|n| n > MAX_MANIFEST_BYTES as u64)
            {
                return Err(format!(
                    "GET {url}: a manifest over {MAX_MANIFEST_BYTES} bytes"
                ));
            }
            let body = response
                .bytes()
                .await
                .map_err(|e| format!("GET {url}: {}", super::causes(&e)))?;
            if body.len() > MAX_MANIFEST_BYTES {
                return Err(format!(
                    "GET {url}: a manifest over {MAX_MANIFEST_BYTES} bytes"
                ));
            }
            // The digest is the manifest's identity: a registry cannot answer with another one.
            let actual = format!("sha256:{:x}", <sha2::Sha256 as sha2::Digest>::digest(&body));
            if actual != digest {
                return Err(format!("GET {url}: the manifest's digest is {actual}"));
            }
            match serde_json::from_slice::<OciManifest>(&body)
                .map_err(|e| format!("GET {url}: not a manifest: {e}"))?
            {
                OciManifest::Image(manifest) => return Ok(Some(manifest)),
                OciManifest::ImageIndex(index) => {
                    digest = oci_client::client::current_platform_resolver(&index.manifests)
                        .ok_or_else(|| {
                            format!("GET {url}: the index has no manifest for this platform")
                        })?;
                }
            }
        }
        Err(format!(
            "{}: an index that points to another index",
            reference.whole()
        ))
    }
}

impl RegistrySizer {
    pub fn new(
        insecure_registries: Vec<String>,
        credentials: std::sync::Arc<crate::registry::auth::Credentials>,
    ) -> Self {
        // First: it installs the TLS crypto provider that the distribution client needs too.
        let anonymous = Anonymous::new(insecure_registries.clone());
        Self {
            client: super::client(insecure_registries),
            anonymous,
            credentials,
        }
    }
}

impl Sizer for RegistrySizer {
    async fn size(&self, image: &ImageRef) -> Result<ImageSize, SizeError> {
        let err = |why: String| SizeError {
            image: image.to_string(),
            why,
        };
        let reference = distribution_reference(image);
        let credential = self
            .credentials
            .lookup(image.registry(), image.repository());
        let direct = match credential {
            None if !self.anonymous.refused(reference.resolve_registry()) => {
                self.anonymous.manifest(&reference).await.map_err(err)?
            }
            _ => None,
        };
        let manifest = match direct {
            Some(manifest) => manifest,
            None => {
                let auth = match credential {
                    Some(c) => oci_client::secrets::RegistryAuth::Basic(
                        c.username.clone(),
                        c.password.clone(),
                    ),
                    None => oci_client::secrets::RegistryAuth::Anonymous,
                };
                self.client
                    .pull_image_manifest(&reference, &auth)
                    .await
                    .map_err(|e| err(format!("{e}")))?
                    .0
            }
        };
        let layers = manifest
            .layers
            .iter()
            .map(|l| (l.digest.clone(), u64::try_from(l.size).unwrap_or(0)))
            .collect();
        Ok(ImageSize { layers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback registry that answers every request with `status` and `body`.
    fn serve(status: &'static str, body: &'static str) -> String {
        pinset_testkit::answering(status, "application/vnd.oci.image.manifest.v1+json", body)
    }

    /// Ask `anonymous` for the manifest of `a/b@sha256:D` on `registry`.
    async fn ask(
        anonymous: &Anonymous,
        registry: &str,
    ) -> Result<Option<oci_client::manifest::OciImageManifest>, String> {
        let image = ImageRef::parse(&format!("{registry}/a/b@sha256:{D}")).unwrap();
        anonymous.manifest(&distribution_reference(&image)).await
    }

    #[tokio::test]
    async fn an_unreachable_registry_is_named_with_the_cause() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let e = ask(&Anonymous::new(vec![addr.clone()]), &addr)
            .await
            .unwrap_err();
        assert!(
            e.contains(&format!("GET http://{addr}/v2/a/b/manifests")),
            "{e}"
        );
        assert!(e.to_lowercase().contains("refused"), "{e}");
    }

    #[tokio::test]
    async fn a_manifest_that_is_not_the_digest_asked_for_is_refused() {
        let addr = serve(
            "200 OK",
            r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504","size":2},"layers":[]}"#,
        );
        let e = ask(&Anonymous::new(vec![addr.clone()]), &addr)
            .await
            .unwrap_err();
        assert!(
            e.contains(&format!("http://{addr}/v2/a/b/manifests/sha256:{D}")),
            "{e}"
        );
        assert!(e.contains("the manifest's digest is sha256:"), "{e}");
    }

    #[tokio::test]
    async fn a_refusal_hands_the_registry_to_the_authentication_flow_for_good() {
        let (addr, other) = (
            serve("401 Unauthorized", ""),
            serve("500 Internal Server Error", ""),
        );
        let anonymous = Anonymous::new(vec![addr.clone(), other.clone()]);
        assert!(!anonymous.refused(&addr));
        let answer = ask(&anonymous, &addr).await;
        assert!(matches!(answer, Ok(None)), "{answer:?}");
        assert!(anonymous.refused(&addr));
        let e = ask(&anonymous, &other).await.unwrap_err();
        assert!(e.contains("500"), "{e}");
        assert!(!anonymous.refused(&other), "an error is not a refusal");
    }

    const D: &str = "86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    /// The same reference the client's own parser makes, for every shape of name.
    #[test]
    fn distribution_reference_agrees_with_the_client_parser() {
        for name in [
            "quay.io/openshift-release-dev/ocp-v4.0-art-dev",
            "127.0.0.1:5000/pinset/a",
            "localhost:5000/a",
            "registry.example.com/a/b/c",
            "docker.io/library/busybox",
            "docker.io/busybox",
            "library/busybox",
            "busybox",
            "someone/tool",
        ] {
            let full = format!("{name}@sha256:{D}");
            let ours = distribution_reference(&ImageRef::parse(&full).unwrap());
            let theirs: oci_client::Reference = full.parse().unwrap();
            assert_eq!(ours.registry(), theirs.registry(), "{full}");
            assert_eq!(ours.resolve_registry(), theirs.resolve_registry(), "{full}");
            assert_eq!(ours.repository(), theirs.repository(), "{full}");
            assert_eq!(ours.digest(), theirs.digest(), "{full}");
            assert_eq!(ours.tag(), None, "{full}");
            assert_eq!(ours.whole(), theirs.whole(), "{full}");
        }
    }
}
