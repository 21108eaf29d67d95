//! Image sizes: compressed bytes per layer, resolved for the node's platform, cached by digest.
//! A size is a registry's claim: one that cannot be true (a negative layer, a sum past any
//! disk, [`MAX_IMAGE_BYTES`]) makes the image's size unknown, said with the image and why, and
//! never reaches the policy's admission.

use crate::client::{Client, RegistryError};
use crate::distribution::Fetched;
use crate::mirrors::{Endpoint, MirrorError, MirrorSource, Mirrors, Target};
use crate::oci::{ImageManifest, Manifest};
use pinset_core::reference::ImageRef;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The largest size believed for one image (compressed layers together): 1 TiB.
pub const MAX_IMAGE_BYTES: u64 = 1 << 40;
/// One manifest request of sizing (manifests are small).
const REQUEST: Duration = Duration::from_secs(5);
/// How long an endpoint that did not answer is skipped.
pub const DARK_FOR: Duration = Duration::from_secs(60);
/// Endpoints remembered as dark (the table starts over when full).
const DARK: usize = 1024;

/// Why an endpoint gave no manifest.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// No answer (refused, timed out, TLS): the endpoint is skipped for a while.
    #[error("{endpoint}: unreachable: {why}")]
    Unreachable { endpoint: String, why: String },
    /// An answer that is not the manifest asked for.
    #[error("{endpoint}: {why}")]
    Answer { endpoint: String, why: String },
}

impl FetchError {
    pub fn unreachable(&self) -> bool {
        matches!(self, FetchError::Unreachable { .. })
    }

    fn of(endpoint: &Endpoint, e: RegistryError) -> FetchError {
        let (endpoint, why) = (endpoint.name(), e.to_string());
        match e {
            RegistryError::Http(h) if h.transient() => FetchError::Unreachable { endpoint, why },
            _ => FetchError::Answer { endpoint, why },
        }
    }
}

/// An image's compressed layers for this node's platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSize {
    /// (layer digest, compressed bytes).
    pub layers: Vec<(String, u64)>,
    /// The endpoint that served the manifest (`host[/path]/repository`), when a registry did.
    pub endpoint: Option<String>,
}

impl ImageSize {
    /// The layers' bytes together (checked when the size was made: it cannot overflow).
    pub fn total(&self) -> u64 {
        self.layers.iter().map(|(_, s)| s).sum()
    }
}

/// The layers of `manifest` as sizes, refused when they cannot be true: a negative size, a sum
/// past [`MAX_IMAGE_BYTES`] (which also keeps it far from overflowing).
pub fn layers_of(manifest: &ImageManifest) -> Result<Vec<(String, u64)>, String> {
    let mut total: u64 = 0;
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for layer in &manifest.layers {
        let size = layer.checked_size()?;
        total = total
            .checked_add(size)
            .filter(|t| *t <= MAX_IMAGE_BYTES)
            .ok_or_else(|| {
                format!(
                    "its layers add up to more than {MAX_IMAGE_BYTES} bytes (1 TiB): not believed"
                )
            })?;
        layers.push((layer.digest.clone(), size));
    }
    Ok(layers)
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("sizing {image}: {why}")]
pub struct SizeError {
    pub image: String,
    /// The image's own registry (failures are summed up per registry).
    pub registry: String,
    /// No endpoint answered at all (as opposed to answers without the manifest).
    pub unreachable: bool,
    pub why: String,
}

/// Where sizes come from: a registry, or a table in tests and the demo.
pub trait Sizer: Send + Sync {
    fn size(&self, image: &ImageRef) -> impl Future<Output = Result<ImageSize, SizeError>> + Send;

    /// Read the configuration sizing depends on again (the node's mirrors), before a round of
    /// sizing. An error is said by the caller; the sizer then works without it.
    fn refresh(&self) -> Result<(), MirrorError> {
        Ok(())
    }
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
                registry: image.registry().to_string(),
                unreachable: false,
                why: "not in the size table".into(),
            })
    }
}

/// How long one round of sizing may take, all images together: a registry or mirror that does
/// not answer cannot hold a reconcile longer (the images it left are "size unknown").
pub const SIZING_BUDGET: Duration = Duration::from_secs(15);

/// Sizes never change for a digest: cache them for the life of the process.
pub struct Cached<S> {
    inner: S,
    cache: Mutex<HashMap<String, ImageSize>>,
    budget: Duration,
}

impl<S: Sizer> Cached<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            cache: Mutex::new(HashMap::new()),
            budget: SIZING_BUDGET,
        }
    }

    /// Another total time for one round of sizing.
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    pub fn budget(&self) -> Duration {
        self.budget
    }

    pub fn inner(&self) -> &S {
        &self.inner
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

/// What [`RegistrySizer::first_answer`] asks each endpoint for.
#[derive(Clone, Copy)]
enum Ask {
    PlatformManifest,
    Digest,
}

enum Answer {
    Manifest(Box<ImageManifest>),
    Digest(String),
}

/// Sizes from the registries' manifests (OCI distribution API), asked of the endpoints the
/// node's runtime would pull from ([`Mirrors`]: mirrors in order, then the image's own registry
/// unless blocked); the first that serves the digest sizes the image. An index is resolved to
/// this node's platform and the image's layers are listed. Registries listed as insecure are
/// spoken to over plain HTTP (loopback test registries). An endpoint that does not answer — or
/// whose request is dropped unanswered by the sizing budget — is skipped for [`DARK_FOR`], so
/// one dark mirror or source costs one timeout, not one per image.
pub struct RegistrySizer {
    client: Arc<Client>,
    source: MirrorSource,
    mirrors: std::sync::RwLock<Arc<Mirrors>>,
    dark: Mutex<HashMap<String, Instant>>,
}

impl RegistrySizer {
    pub fn new(
        insecure_registries: Vec<String>,
        credentials: Arc<crate::auth::Credentials>,
    ) -> Self {
        Self::with_client(Arc::new(Client::new(insecure_registries, credentials)))
    }

    /// A sizer speaking through `client` (shared with the policy artifacts).
    pub fn with_client(client: Arc<Client>) -> Self {
        Self {
            client,
            source: MirrorSource::None,
            mirrors: Default::default(),
            dark: Mutex::default(),
        }
    }

    /// Size through the mirrors configured at `source` (read by [`Sizer::refresh`]).
    pub fn with_mirrors(mut self, source: MirrorSource) -> Self {
        self.source = source;
        self
    }

    pub fn mirrors(&self) -> Arc<Mirrors> {
        self.mirrors.read().expect("mirrors").clone()
    }

    pub fn mirror_source(&self) -> &MirrorSource {
        &self.source
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// The image's manifest for this node's platform from the first endpoint that serves it,
    /// and that endpoint's name.
    pub async fn image_manifest(
        &self,
        target: &Target,
    ) -> Result<(ImageManifest, String), SizeError> {
        match self.first_answer(target, Ask::PlatformManifest).await? {
            (Answer::Manifest(m), endpoint) => Ok((*m, endpoint.name())),
            (Answer::Digest(_), _) => unreachable!("asked for a manifest"),
        }
    }

    /// The digest `target` (a tag, or a digest to check) names, from the first endpoint that
    /// serves it as a manifest (an index for a multi-platform tag: its own digest), and that
    /// endpoint's name.
    pub async fn resolve(&self, target: &Target) -> Result<(String, String), SizeError> {
        let (digest, endpoint) = self.resolve_at(target).await?;
        Ok((digest, endpoint.name()))
    }

    /// [`RegistrySizer::resolve`], with the endpoint that answered (to read more there).
    pub async fn resolve_at(&self, target: &Target) -> Result<(String, Endpoint), SizeError> {
        match self.first_answer(target, Ask::Digest).await? {
            (Answer::Digest(d), endpoint) => Ok((d, endpoint)),
            (Answer::Manifest(_), _) => unreachable!("asked for a digest"),
        }
    }

    /// The manifest `reference` at `endpoint`, unless the endpoint is dark.
    pub async fn fetch(&self, endpoint: &Endpoint, reference: &str) -> Result<Fetched, FetchError> {
        if let Some(since) = self.dark_since(&endpoint.host) {
            return Err(FetchError::Unreachable {
                endpoint: endpoint.name(),
                why: format!(
                    "skipped: it did not answer {} s ago",
                    since.elapsed().as_secs()
                ),
            });
        }
        // Dropped before an answer (a sizing budget ran out): the endpoint counts as dark.
        let mut waiting = Waiting {
            dark: &self.dark,
            host: &endpoint.host,
            answered: false,
        };
        let result = self.client.manifest(endpoint, reference, REQUEST).await;
        let result = result.map_err(|e| FetchError::of(endpoint, e));
        waiting.answered = !matches!(result, Err(FetchError::Unreachable { .. }));
        result
    }

    fn dark_since(&self, host: &str) -> Option<Instant> {
        let mut dark = self.dark.lock().expect("dark");
        match dark.get(host) {
            Some(since) if since.elapsed() < DARK_FOR => Some(*since),
            Some(_) => {
                dark.remove(host);
                None
            }
            None => None,
        }
    }

    async fn ask(
        &self,
        endpoint: &Endpoint,
        reference: &str,
        ask: Ask,
    ) -> Result<Answer, FetchError> {
        match ask {
            Ask::PlatformManifest => self
                .platform_manifest(endpoint, reference)
                .await
                .map(|m| Answer::Manifest(Box::new(m))),
            Ask::Digest => {
                let m = self.fetch(endpoint, reference).await?;
                match Manifest::parse(&m.body) {
                    Ok(_) => Ok(Answer::Digest(m.digest)),
                    Err(e) => Err(FetchError::Answer {
                        endpoint: endpoint.name(),
                        why: format!("{reference}: {e}"),
                    }),
                }
            }
        }
    }

    /// Ask each endpoint of `target` in the runtime's order until one answers; every
    /// endpoint's failure said when none does.
    async fn first_answer(
        &self,
        target: &Target,
        what: Ask,
    ) -> Result<(Answer, Endpoint), SizeError> {
        let endpoints = self.mirrors().endpoints(target);
        let error = |unreachable: bool, why: String| SizeError {
            image: target.full(),
            registry: target.registry.clone(),
            unreachable,
            why,
        };
        if endpoints.is_empty() {
            let why = "its registry is blocked and no mirror serves it";
            return Err(error(false, why.into()));
        }
        let mut failures = Vec::new();
        for endpoint in &endpoints {
            match self.ask(endpoint, &target.reference, what).await {
                Ok(answer) => return Ok((answer, endpoint.clone())),
                Err(e) => failures.push(e),
            }
        }
        let unreachable = failures.iter().all(FetchError::unreachable);
        let why: Vec<String> = failures.iter().map(ToString::to_string).collect();
        Err(error(unreachable, why.join("; ")))
    }

    /// The manifest at one endpoint, an index resolved to this platform there.
    pub async fn platform_manifest(
        &self,
        endpoint: &Endpoint,
        digest: &str,
    ) -> Result<ImageManifest, FetchError> {
        let mut digest = digest.to_string();
        // An index, then the platform's manifest.
        for _ in 0..2 {
            let fetched = self.fetch(endpoint, &digest).await?;
            let answer = |why: String| FetchError::Answer {
                endpoint: endpoint.name(),
                why: format!("{digest}: {why}"),
            };
            match Manifest::parse(&fetched.body).map_err(answer)? {
                Manifest::Image(manifest) => return Ok(manifest),
                Manifest::Index(index) => {
                    digest = index
                        .for_this_platform()
                        .ok_or_else(|| {
                            answer("the index has no manifest for this platform".into())
                        })?
                        .to_string();
                }
            }
        }
        Err(FetchError::Answer {
            endpoint: endpoint.name(),
            why: "an index that points to another index".into(),
        })
    }
}

/// A request under way to `host`: unless it is answered, the host is dark from its end (a
/// failure, or the request dropped by a deadline).
struct Waiting<'a> {
    dark: &'a Mutex<HashMap<String, Instant>>,
    host: &'a str,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered
            && let Ok(mut dark) = self.dark.lock()
        {
            if dark.len() >= DARK {
                dark.clear();
            }
            dark.insert(self.host.to_string(), Instant::now());
        }
    }
}

impl Sizer for RegistrySizer {
    async fn size(&self, image: &ImageRef) -> Result<ImageSize, SizeError> {
        let (manifest, endpoint) = self.image_manifest(&Target::from(image)).await?;
        let layers = layers_of(&manifest).map_err(|why| SizeError {
            image: image.to_string(),
            registry: image.registry().to_string(),
            unreachable: false,
            why: format!("{endpoint}: {why}"),
        })?;
        Ok(ImageSize {
            layers,
            endpoint: Some(endpoint),
        })
    }

    fn refresh(&self) -> Result<(), MirrorError> {
        let (mirrors, result) = match self.source.load() {
            Ok(mirrors) => (mirrors, Ok(())),
            // Sized without mirrors, said by the caller: pulls go on.
            Err(e) => (Mirrors::None, Err(e)),
        };
        *self.mirrors.write().expect("mirrors") = Arc::new(mirrors);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    /// The registry, repository and API host an image is asked for, for every shape of name,
    /// as the distribution reference's normalisation (Docker's, containerd's) gives them.
    #[test]
    fn targets_follow_the_reference_normalisation() {
        let table = [
            (
                "quay.io/openshift-release-dev/ocp-v4.0-art-dev",
                "quay.io",
                "openshift-release-dev/ocp-v4.0-art-dev",
                "quay.io",
            ),
            (
                "127.0.0.1:5000/pinset/a",
                "127.0.0.1:5000",
                "pinset/a",
                "127.0.0.1:5000",
            ),
            ("localhost:5000/a", "localhost:5000", "a", "localhost:5000"),
            (
                "registry.example.com/a/b/c",
                "registry.example.com",
                "a/b/c",
                "registry.example.com",
            ),
            (
                "docker.io/library/busybox",
                "docker.io",
                "library/busybox",
                "registry-1.docker.io",
            ),
            (
                "docker.io/busybox",
                "docker.io",
                "library/busybox",
                "registry-1.docker.io",
            ),
            (
                "library/busybox",
                "docker.io",
                "library/busybox",
                "registry-1.docker.io",
            ),
            (
                "busybox",
                "docker.io",
                "library/busybox",
                "registry-1.docker.io",
            ),
            (
                "someone/tool",
                "docker.io",
                "someone/tool",
                "registry-1.docker.io",
            ),
        ];
        for (name, registry, repository, host) in table {
            let full = format!("{name}@sha256:{D}");
            let target = Target::from(&ImageRef::parse(&full).unwrap());
            assert_eq!(target.registry, registry, "{full}");
            assert_eq!(target.repository, repository, "{full}");
            assert_eq!(target.reference, format!("sha256:{D}"), "{full}");
            let source = Endpoint::source(&target.registry, &target.repository);
            assert_eq!(source.host, host, "{full}");
        }
    }

    /// A manifest whose layers claim sizes no image has: the size is unknown, said with why.
    #[test]
    fn impossible_sizes_are_not_believed() {
        let manifest = |sizes: &[i64]| -> ImageManifest {
            let layers: Vec<_> = sizes
                .iter()
                .map(|s| serde_json::json!({"mediaType": "l", "digest": "sha256:a", "size": s}))
                .collect();
            serde_json::from_value(serde_json::json!({
                "schemaVersion": 2,
                "config": {"mediaType": "c", "digest": "sha256:c", "size": 1},
                "layers": layers,
            }))
            .unwrap()
        };
        assert_eq!(layers_of(&manifest(&[5000, 1])).unwrap().len(), 2);
        let negative = layers_of(&manifest(&[-1, 5000])).unwrap_err();
        assert!(negative.contains("negative size (-1)"), "{negative}");
        let huge = layers_of(&manifest(&[i64::MAX, i64::MAX, i64::MAX])).unwrap_err();
        assert!(huge.contains("more than 1099511627776 bytes"), "{huge}");
        let over = layers_of(&manifest(&[1 << 40, 1])).unwrap_err();
        assert!(over.contains("not believed"), "{over}");
    }

    #[tokio::test]
    async fn a_blocked_registry_without_a_mirror_is_said_and_never_asked() {
        let (_dir, conf) = pinset_testkit::scratch_file(
            "registries.conf",
            "[[registry]]\nlocation = \"127.0.0.1:9\"\nblocked = true\n",
        );
        let sizer = RegistrySizer::new(Vec::new(), Arc::default())
            .with_mirrors(MirrorSource::RegistriesConf(conf.clone()));
        sizer.refresh().unwrap();
        let image = ImageRef::parse(&format!("127.0.0.1:9/a@sha256:{D}")).unwrap();
        let e = sizer.size(&image).await.unwrap_err();
        assert!(e.why.contains("blocked and no mirror serves it"), "{e}");
        assert_eq!(e.registry, "127.0.0.1:9");
        // A configuration that cannot be read is said, and sizing goes on without mirrors.
        std::fs::write(&conf, "[[registry]\n").unwrap();
        let bad = sizer.refresh().unwrap_err();
        assert_eq!(bad.line, Some(1), "{bad}");
        let e = sizer.size(&image).await.unwrap_err();
        assert!(
            e.unreachable && e.why.contains("GET https://127.0.0.1:9/v2/a/manifests"),
            "{e}"
        );
    }
    fn endpoint(addr: &str) -> Endpoint {
        let mut e = Endpoint::source(addr, "a/b");
        e.scheme = crate::mirrors::Scheme::Http;
        e
    }

    const DIGEST: &str = "sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    #[tokio::test]
    async fn an_unreachable_endpoint_is_named_with_the_cause_and_skipped_after() {
        let addr = format!("127.0.0.1:{}", pinset_testkit::free_port());
        let sizer = RegistrySizer::new(Vec::new(), Arc::default());
        let e = sizer.fetch(&endpoint(&addr), DIGEST).await.unwrap_err();
        assert!(e.unreachable(), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&format!("GET http://{addr}/v2/a/b/manifests/{DIGEST}")),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
        let again = sizer.fetch(&endpoint(&addr), DIGEST).await.unwrap_err();
        assert!(
            again.to_string().contains("skipped: it did not answer"),
            "{again}"
        );
    }

    /// A port that accepts and never answers, and a request given up by its caller's deadline:
    /// the endpoint is skipped after, so a dark registry costs one deadline, not one per round.
    #[tokio::test]
    async fn a_request_given_up_unanswered_makes_its_endpoint_dark() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let sizer = RegistrySizer::new(Vec::new(), Arc::default());
        let dark = endpoint(&addr);
        let asked = sizer.fetch(&dark, DIGEST);
        let given_up = tokio::time::timeout(Duration::from_millis(300), asked).await;
        assert!(given_up.is_err(), "the port never answers");
        let e = sizer.fetch(&endpoint(&addr), DIGEST).await.unwrap_err();
        assert!(e.unreachable() && e.to_string().contains("skipped"), "{e}");
        drop(listener);
    }

    #[tokio::test]
    async fn a_manifest_that_is_not_the_digest_asked_for_is_refused() {
        let addr = pinset_testkit::answering(
            "200 OK",
            "application/vnd.oci.image.manifest.v1+json",
            r#"{"schemaVersion":2,"layers":[]}"#,
        );
        let sizer = RegistrySizer::new(Vec::new(), Arc::default());
        let e = sizer.fetch(&endpoint(&addr), DIGEST).await.unwrap_err();
        assert!(!e.unreachable());
        assert!(e.to_string().contains("not the one asked for"), "{e}");
        // By tag, the digest is the bytes'.
        let m = sizer.fetch(&endpoint(&addr), "v1").await.unwrap();
        assert_eq!(m.digest.len(), 71);
    }

    #[tokio::test]
    async fn an_error_status_is_an_answer_not_a_dark_endpoint() {
        let addr = pinset_testkit::answering("500 Internal Server Error", "text/plain", "");
        let sizer = RegistrySizer::new(Vec::new(), Arc::default());
        let e = sizer.fetch(&endpoint(&addr), DIGEST).await.unwrap_err();
        assert!(e.to_string().contains("500"), "{e}");
        let again = sizer.fetch(&endpoint(&addr), DIGEST).await.unwrap_err();
        assert!(again.to_string().contains("500"), "asked again: {again}");
    }
}
