//! Image sizes: compressed bytes per layer, resolved for the node's platform, cached by digest.

use super::distribution::{Distribution, FetchError};
use super::mirrors::{Endpoint, MirrorError, MirrorSource, Mirrors, Target};
use oci_client::manifest::{OciImageManifest, OciManifest};
use pinset_core::reference::ImageRef;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An image's compressed layers for this node's platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSize {
    /// (layer digest, compressed bytes).
    pub layers: Vec<(String, u64)>,
    /// The endpoint that served the manifest (`host[/path]/repository`), when a registry did.
    pub endpoint: Option<String>,
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
    Manifest(Box<OciImageManifest>),
    Digest(String),
}

/// Sizes from the registries' manifests (OCI distribution API), asked of the endpoints the
/// node's runtime would pull from ([`Mirrors`]: mirrors in order, then the image's own registry
/// unless blocked); the first that serves the digest sizes the image. An index is resolved to
/// this node's platform and the image's layers are listed. Registries listed as insecure are
/// spoken to over plain HTTP (loopback test registries).
pub struct RegistrySizer {
    distribution: Distribution,
    source: MirrorSource,
    mirrors: std::sync::RwLock<Arc<Mirrors>>,
}

impl RegistrySizer {
    pub fn new(
        insecure_registries: Vec<String>,
        credentials: Arc<crate::registry::auth::Credentials>,
    ) -> Self {
        Self {
            distribution: Distribution::new(insecure_registries, credentials),
            source: MirrorSource::None,
            mirrors: Default::default(),
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

    pub fn distribution(&self) -> &Distribution {
        &self.distribution
    }

    /// The image's manifest for this node's platform from the first endpoint that serves it,
    /// and that endpoint's name.
    pub async fn image_manifest(
        &self,
        target: &Target,
    ) -> Result<(OciImageManifest, String), SizeError> {
        match self.first_answer(target, Ask::PlatformManifest).await? {
            (Answer::Manifest(m), endpoint) => Ok((*m, endpoint)),
            (Answer::Digest(_), _) => unreachable!("asked for a manifest"),
        }
    }

    /// The digest `target` (a tag, or a digest to check) names, from the first endpoint that
    /// serves it as a manifest (an index for a multi-platform tag: its own digest), and that
    /// endpoint's name.
    pub async fn resolve(&self, target: &Target) -> Result<(String, String), SizeError> {
        match self.first_answer(target, Ask::Digest).await? {
            (Answer::Digest(d), endpoint) => Ok((d, endpoint)),
            (Answer::Manifest(_), _) => unreachable!("asked for a digest"),
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
                let m = self.distribution.manifest(endpoint, reference).await?;
                match serde_json::from_slice::<OciManifest>(&m.body) {
                    Ok(_) => Ok(Answer::Digest(m.digest)),
                    Err(e) => Err(FetchError::Answer {
                        endpoint: endpoint.name(),
                        why: format!("{reference}: not a manifest: {e}"),
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
    ) -> Result<(Answer, String), SizeError> {
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
                Ok(answer) => return Ok((answer, endpoint.name())),
                Err(e) => failures.push(e),
            }
        }
        let unreachable = failures.iter().all(FetchError::unreachable);
        let why: Vec<String> = failures.iter().map(ToString::to_string).collect();
        Err(error(unreachable, why.join("; ")))
    }

    /// The manifest at one endpoint, an index resolved to this platform there.
    async fn platform_manifest(
        &self,
        endpoint: &Endpoint,
        digest: &str,
    ) -> Result<OciImageManifest, FetchError> {
        let mut digest = digest.to_string();
        // An index, then the platform's manifest.
        for _ in 0..2 {
            let fetched = self.distribution.manifest(endpoint, &digest).await?;
            let answer = |why: String| FetchError::Answer {
                endpoint: endpoint.name(),
                why: format!("{digest}: {why}"),
            };
            match serde_json::from_slice::<OciManifest>(&fetched.body)
                .map_err(|e| answer(format!("not a manifest: {e}")))?
            {
                OciManifest::Image(manifest) => return Ok(manifest),
                OciManifest::ImageIndex(index) => {
                    digest = oci_client::client::current_platform_resolver(&index.manifests)
                        .ok_or_else(|| {
                            answer("the index has no manifest for this platform".into())
                        })?;
                }
            }
        }
        Err(FetchError::Answer {
            endpoint: endpoint.name(),
            why: "an index that points to another index".into(),
        })
    }
}

impl Sizer for RegistrySizer {
    async fn size(&self, image: &ImageRef) -> Result<ImageSize, SizeError> {
        let (manifest, endpoint) = self.image_manifest(&Target::from(image)).await?;
        let layers = manifest
            .layers
            .iter()
            .map(|l| (l.digest.clone(), u64::try_from(l.size).unwrap_or(0)))
            .collect();
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

    /// The registry and repository an image is asked for are those the distribution client's
    /// own parser makes, for every shape of name.
    #[test]
    fn targets_agree_with_the_client_parser() {
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
            let target = Target::from(&ImageRef::parse(&full).unwrap());
            let theirs: oci_client::Reference = full.parse().unwrap();
            assert_eq!(target.registry, theirs.registry(), "{full}");
            assert_eq!(target.repository, theirs.repository(), "{full}");
            assert_eq!(Some(target.reference.as_str()), theirs.digest(), "{full}");
            // Docker Hub's API host: containerd's (the client says index.docker.io, which
            // answers the same API).
            let source = &Endpoint::source(&target.registry, &target.repository);
            let expected = match theirs.resolve_registry() {
                "index.docker.io" => "registry-1.docker.io",
                other => other,
            };
            assert_eq!(source.host, expected, "{full}");
        }
    }

    #[tokio::test]
    async fn a_blocked_registry_without_a_mirror_is_said_and_never_asked() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("registries.conf");
        std::fs::write(
            &conf,
            "[[registry]]\nlocation = \"127.0.0.1:9\"\nblocked = true\n",
        )
        .unwrap();
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
}
