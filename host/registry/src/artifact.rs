//! Policy modules as OCI artifacts, in the Wasm component layout that wasm-pkg-tools
//! (`wkg oci push`, its `oci-wasm` crate) and the CNCF TAG Runtime's Wasm OCI artifact layout
//! define: an image manifest whose config is `application/vnd.wasm.config.v0+json` and whose one
//! layer is the module, `application/wasm`. A module pushed by either tool is pulled by the other.
//!
//! References are `[oci://]REGISTRY/REPOSITORY@sha256:HEX`; a tag (`:TAG`) is accepted only where
//! a person names an artifact to push or pull, and is resolved to its digest there.

use crate::auth::Credentials;
use crate::client::{Client, RegistryError};
use crate::limits::{CONFIG, Limit, MODULE, MODULE_REQUEST, SMALL_REQUEST};
use crate::mirrors::Endpoint;
use crate::oci::{DOCKER_LIST, ImageManifest, OCI_INDEX, OCI_MANIFEST};
pub use crate::oci::{Descriptor, manifest_json, sha256_digest};
use bytes::Bytes;
use pinset_core::reference::ImageRef;
use pinset_core::refusal::Refusal;
use std::fmt;
use std::sync::Arc;

pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
pub const MANIFEST_MEDIA_TYPE: &str = OCI_MANIFEST;

/// How a reference names its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Version {
    Tag(String),
    /// `sha256:<64 hex>`.
    Digest(String),
}

/// `REGISTRY/REPOSITORY:TAG` or `REGISTRY/REPOSITORY@sha256:HEX`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactRef {
    pub registry: String,
    pub repository: String,
    pub version: Version,
}

/// The prefix that marks a module reference as an OCI artifact rather than a file.
pub const SCHEME: &str = "oci://";

/// Why an artifact could not be read or written. [`ArtifactError::transient`] tells a registry
/// away (ask again later) from an answer that stands.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    #[error("{reference:?}: not an artifact reference: {why}")]
    Reference { reference: String, why: String },
    #[error("{reference}: a tag names no fixed module: reference it by digest (@sha256:…)")]
    Unpinned { reference: String },
    /// The registry did not answer, too slowly, or with a server error.
    #[error("{reference}: {operation}: the registry is away: {cause}")]
    Away {
        reference: String,
        operation: &'static str,
        cause: String,
    },
    /// The registry has no such artifact.
    #[error("{reference}: not found in its registry")]
    NotFound { reference: String },
    /// The registry served other content than the digest asked for.
    #[error("{reference}: the registry served {served}, not that digest")]
    WrongDigest { reference: String, served: String },
    /// Any other refusal of the registry (a status, an answer too large, a bad redirect).
    #[error("{reference}: {operation}: {cause}")]
    Registry {
        reference: String,
        operation: &'static str,
        cause: String,
    },
    #[error("{reference}: not a Wasm artifact: {why}")]
    NotWasm { reference: String, why: String },
    #[error("{reference}: layer {digest}: {why}")]
    Layer {
        reference: String,
        digest: String,
        why: String,
    },
    /// A blob served with other bytes than its digest.
    #[error("{reference}: layer {digest}: {why}")]
    LayerDigest {
        reference: String,
        digest: String,
        why: String,
    },
    #[error(
        "{reference}: the module is {size} bytes, over the limit of {max} bytes (--policy-max-module-mib)"
    )]
    TooLarge {
        reference: String,
        size: u64,
        max: u64,
    },
}

impl ArtifactError {
    /// The registry is away: asking again later may succeed.
    pub fn transient(&self) -> bool {
        matches!(self, ArtifactError::Away { .. })
    }

    /// The kind of refusal this is, for a module.
    pub fn refusal(&self) -> Refusal {
        match self {
            ArtifactError::Away { .. } => Refusal::RegistryAway,
            ArtifactError::NotFound { .. } => Refusal::NotFound,
            ArtifactError::WrongDigest { .. } | ArtifactError::LayerDigest { .. } => {
                Refusal::WrongDigest
            }
            ArtifactError::Registry { .. } => Refusal::RegistryRefused,
            ArtifactError::Reference { .. }
            | ArtifactError::Unpinned { .. }
            | ArtifactError::NotWasm { .. }
            | ArtifactError::Layer { .. }
            | ArtifactError::TooLarge { .. } => Refusal::NotAPolicy,
        }
    }

    /// A registry failure while `operation` on `reference`, by its kind.
    fn of(reference: &ArtifactRef, operation: &'static str, e: RegistryError) -> ArtifactError {
        let reference = reference.to_string();
        match e {
            RegistryError::NotFound { .. } => ArtifactError::NotFound { reference },
            e if e.transient() => ArtifactError::Away {
                reference,
                operation,
                cause: e.to_string(),
            },
            e => ArtifactError::Registry {
                reference,
                operation,
                cause: e.to_string(),
            },
        }
    }
}

impl ArtifactRef {
    /// Parse `[oci://]REGISTRY/REPOSITORY(:TAG|@sha256:HEX)`.
    pub fn parse(text: &str) -> Result<Self, ArtifactError> {
        let bad = |why: &str| ArtifactError::Reference {
            reference: text.to_string(),
            why: why.to_string(),
        };
        let rest = text.strip_prefix(SCHEME).unwrap_or(text);
        let (name, version) = match rest.split_once('@') {
            Some((name, digest)) => (name, Version::Digest(digest.to_string())),
            None => {
                let (name, tag) = rest
                    .rsplit_once(':')
                    .filter(|(_, tag)| !tag.contains('/'))
                    .ok_or_else(|| bad("expected REGISTRY/REPOSITORY:TAG or @sha256:HEX"))?;
                if !valid_tag(tag) {
                    return Err(bad(
                        "the tag must be 1-128 of [A-Za-z0-9_.-], not starting with . or -",
                    ));
                }
                (name, Version::Tag(tag.to_string()))
            }
        };
        let digest = match &version {
            Version::Digest(d) => d.clone(),
            Version::Tag(_) => format!("sha256:{}", "0".repeat(64)),
        };
        let image =
            ImageRef::parse(&format!("{name}@{digest}")).map_err(|e| bad(&e.to_string()))?;
        if image.registry() == "docker.io" && !name.starts_with("docker.io/") {
            return Err(bad("name the registry (REGISTRY/REPOSITORY)"));
        }
        Ok(Self {
            registry: image.registry().to_string(),
            repository: image.repository().to_string(),
            version,
        })
    }

    /// The digest, when the reference names one.
    pub fn digest(&self) -> Option<&str> {
        match &self.version {
            Version::Digest(d) => Some(d),
            Version::Tag(_) => None,
        }
    }

    /// The same artifact at `digest`.
    pub fn at(&self, digest: &str) -> Self {
        Self {
            version: Version::Digest(digest.to_string()),
            ..self.clone()
        }
    }

    /// `REGISTRY/REPOSITORY`, as a signature's `docker-reference` names it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// This reference with a digest, or [`ArtifactError::Unpinned`].
    pub fn pinned(&self) -> Result<&str, ArtifactError> {
        self.digest().ok_or_else(|| ArtifactError::Unpinned {
            reference: self.to_string(),
        })
    }

    /// Where the artifact's registry is asked: its API host, its repository.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::source(&self.registry, &self.repository)
    }

    /// The tag or digest, as a manifest URL names it.
    fn version_text(&self) -> &str {
        match &self.version {
            Version::Tag(t) | Version::Digest(t) => t,
        }
    }

    /// The reference of the same repository at another tag (signatures live at one).
    pub fn tagged(&self, tag: &str) -> Self {
        Self {
            version: Version::Tag(tag.to_string()),
            ..self.clone()
        }
    }
}

impl fmt::Display for ArtifactRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.version {
            Version::Tag(t) => write!(f, "{}/{}:{t}", self.registry, self.repository),
            Version::Digest(d) => write!(f, "{}/{}@{d}", self.registry, self.repository),
        }
    }
}

fn valid_tag(tag: &str) -> bool {
    (1..=128).contains(&tag.len())
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// The artifact's config, as wasm-pkg-tools writes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// RFC 3339. pinset writes `SOURCE_DATE_EPOCH` when set, else the Unix epoch, so that pushing
    /// one module twice gives one manifest digest.
    pub created: String,
    pub author: Option<String>,
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub layer_digests: Vec<String>,
    pub component: Option<ComponentWorld>,
}

/// What a component exports and imports (interface names), as the config records it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ComponentWorld {
    pub exports: Vec<String>,
    pub imports: Vec<String>,
    pub target: Option<String>,
}

/// A module pulled from a registry.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// The reference, at the manifest's digest.
    pub reference: ArtifactRef,
    /// The module's bytes (the layer), their digest checked against the manifest.
    pub module: Vec<u8>,
    /// `sha256:<hex>` of [`Pulled::module`].
    pub layer_digest: String,
    pub config: Option<WasmConfig>,
}

/// The registry client for artifacts: credentials as for images (kubelet `config.json`), the
/// token and basic flows of the registry client, plain HTTP for the registries listed. Every
/// read is bounded ([`crate::limits`]).
#[derive(Clone)]
pub struct Artifacts {
    client: Arc<Client>,
}

impl Artifacts {
    pub fn new(insecure_registries: Vec<String>, credentials: Arc<Credentials>) -> Self {
        Self::with_client(Arc::new(Client::new(insecure_registries, credentials)))
    }

    /// Artifacts spoken to through `client` (shared with sizing).
    pub fn with_client(client: Arc<Client>) -> Self {
        Self { client }
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// The digest a reference names: its own, or the one its tag points to now.
    pub async fn resolve(&self, reference: &ArtifactRef) -> Result<ArtifactRef, ArtifactError> {
        if reference.digest().is_some() {
            return Ok(reference.clone());
        }
        let fetched = self.fetch_manifest(reference).await;
        let fetched = fetched.map_err(|e| ArtifactError::of(reference, "resolving the tag", e))?;
        Ok(reference.at(&fetched.digest))
    }

    /// Push `module` with `config` as `reference` (a tag or a digest); the reference at the
    /// manifest's digest. `title` (the module's file name) annotates the layer, as wkg does.
    pub async fn push(
        &self,
        reference: &ArtifactRef,
        module: &[u8],
        mut config: WasmConfig,
        title: Option<&str>,
    ) -> Result<ArtifactRef, ArtifactError> {
        let mut layer = Descriptor::of(LAYER_MEDIA_TYPE, module);
        if let Some(title) = title {
            layer = layer.annotated("org.opencontainers.image.title", title);
        }
        config.layer_digests = vec![layer.digest.clone()];
        let config_json = serde_json::to_vec(&config).expect("a config serialises");
        let config = Descriptor::of(CONFIG_MEDIA_TYPE, &config_json);
        self.push_blob(reference, module.to_vec()).await?;
        self.push_blob(reference, config_json).await?;
        let manifest = manifest_json(&config, &[layer]);
        self.push_manifest(reference, manifest).await
    }

    /// Push a manifest's bytes as `reference`; the reference at their digest.
    pub(crate) async fn push_manifest(
        &self,
        reference: &ArtifactRef,
        manifest: Vec<u8>,
    ) -> Result<ArtifactRef, ArtifactError> {
        let digest = self
            .client
            .push_manifest(
                &reference.endpoint(),
                reference.version_text(),
                MANIFEST_MEDIA_TYPE,
                Bytes::from(manifest),
                SMALL_REQUEST,
            )
            .await
            .map_err(|e| ArtifactError::of(reference, "pushing the manifest", e))?;
        Ok(reference.at(&digest))
    }

    /// Push a blob to `reference`'s repository.
    pub(crate) async fn push_blob(
        &self,
        reference: &ArtifactRef,
        bytes: Vec<u8>,
    ) -> Result<String, ArtifactError> {
        self.client
            .push_blob(&reference.endpoint(), Bytes::from(bytes), MODULE_REQUEST)
            .await
            .map_err(|e| ArtifactError::of(reference, "pushing a blob", e))
    }

    /// The registry's answer for the manifest at `reference`'s version.
    async fn fetch_manifest(
        &self,
        reference: &ArtifactRef,
    ) -> Result<crate::distribution::Fetched, RegistryError> {
        let version = reference.version_text();
        (self.client)
            .manifest(&reference.endpoint(), version, SMALL_REQUEST)
            .await
    }

    /// The manifest `reference` names, its bytes checked against the digest it is asked by;
    /// `Ok(None)` when the registry has none.
    pub(crate) async fn manifest(
        &self,
        reference: &ArtifactRef,
    ) -> Result<Option<(ImageManifest, String)>, ArtifactError> {
        let fetched = match self.fetch_manifest(reference).await {
            Ok(fetched) => fetched,
            Err(RegistryError::NotFound { .. }) => return Ok(None),
            Err(RegistryError::Answer { why, .. }) if why.contains("not the one asked for") => {
                let served = why.split_whitespace().find(|w| w.starts_with("sha256:"));
                return Err(ArtifactError::WrongDigest {
                    reference: reference.to_string(),
                    served: served
                        .unwrap_or("other content")
                        .trim_end_matches(',')
                        .to_string(),
                });
            }
            Err(e) => return Err(ArtifactError::of(reference, "reading the manifest", e)),
        };
        let not_wasm = |why: String| not_wasm(reference, why);
        if is_index(fetched.media_type.as_deref()) {
            return Err(not_wasm(AN_INDEX.into()));
        }
        let manifest: ImageManifest = serde_json::from_slice(&fetched.body)
            .map_err(|e| not_wasm(format!("the manifest does not parse: {e}")))?;
        Ok(Some((manifest, fetched.digest)))
    }

    /// Pull the module `reference` names (a digest, or a tag resolved here), its layer no larger
    /// than `max_bytes`.
    pub async fn pull(
        &self,
        reference: &ArtifactRef,
        max_bytes: u64,
    ) -> Result<Pulled, ArtifactError> {
        let (manifest, digest) =
            self.manifest(reference)
                .await?
                .ok_or_else(|| ArtifactError::NotFound {
                    reference: reference.to_string(),
                })?;
        let at = reference.at(&digest);
        let layer = wasm_layer(&at, &manifest)?;
        let size = layer.checked_size().map_err(|why| ArtifactError::Layer {
            reference: at.to_string(),
            digest: layer.digest.clone(),
            why,
        })?;
        if size > max_bytes {
            return Err(ArtifactError::TooLarge {
                reference: at.to_string(),
                size,
                max: max_bytes,
            });
        }
        let module = self
            .blob(&at, &layer.digest, MODULE.at_most(max_bytes))
            .await?;
        let config = self.config(&at, &manifest).await;
        Ok(Pulled {
            reference: at,
            layer_digest: layer.digest.clone(),
            module,
            config,
        })
    }

    /// The config, when it reads as a Wasm config (informational: nothing depends on it).
    async fn config(&self, at: &ArtifactRef, manifest: &ImageManifest) -> Option<WasmConfig> {
        let bytes = self
            .client
            .blob(
                &at.endpoint(),
                &manifest.config.digest,
                CONFIG,
                SMALL_REQUEST,
            )
            .await
            .inspect_err(|e| tracing::debug!(error = %e, "artifact config unreadable"))
            .ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// A blob of `at`'s repository, within `limit`, its digest checked.
    pub(crate) async fn blob(
        &self,
        at: &ArtifactRef,
        digest: &str,
        limit: Limit,
    ) -> Result<Vec<u8>, ArtifactError> {
        match self
            .client
            .blob(&at.endpoint(), digest, limit, MODULE_REQUEST)
            .await
        {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(RegistryError::Answer { why, .. }) if why.contains("bytes of digest") => {
                Err(ArtifactError::LayerDigest {
                    reference: at.to_string(),
                    digest: digest.to_string(),
                    why,
                })
            }
            Err(e @ RegistryError::NotFound { .. }) => {
                Err(ArtifactError::of(at, "reading a blob", e))
            }
            Err(e) if e.transient() => Err(ArtifactError::of(at, "reading a blob", e)),
            Err(e) => Err(ArtifactError::Layer {
                reference: at.to_string(),
                digest: digest.to_string(),
                why: e.to_string(),
            }),
        }
    }
}

/// What a Wasm artifact's reference naming an image index is told.
const AN_INDEX: &str = "an image index (a container image?)";

/// A media type (a manifest's, or a `Content-Type` with its parameters) of an image index.
fn is_index(media_type: Option<&str>) -> bool {
    media_type.is_some_and(|t| t.starts_with(OCI_INDEX) || t.starts_with(DOCKER_LIST))
}

/// `reference` names no Wasm module, for the reason `why`.
fn not_wasm(reference: &ArtifactRef, why: String) -> ArtifactError {
    ArtifactError::NotWasm {
        reference: reference.to_string(),
        why,
    }
}

/// The one `application/wasm` layer of a Wasm artifact's manifest.
fn wasm_layer<'m>(
    at: &ArtifactRef,
    manifest: &'m ImageManifest,
) -> Result<&'m Descriptor, ArtifactError> {
    let not_wasm = |why: String| not_wasm(at, why);
    if is_index(manifest.media_type.as_deref()) {
        return Err(not_wasm(AN_INDEX.into()));
    }
    if manifest.config.media_type != CONFIG_MEDIA_TYPE {
        return Err(not_wasm(format!(
            "its config is {}, not {CONFIG_MEDIA_TYPE} (a container image?)",
            manifest.config.media_type
        )));
    }
    match manifest.layers.as_slice() {
        [layer] if layer.media_type == LAYER_MEDIA_TYPE => Ok(layer),
        [layer] => Err(not_wasm(format!(
            "its layer is {}, not {LAYER_MEDIA_TYPE}",
            layer.media_type
        ))),
        layers => Err(not_wasm(format!("{} layers, not one", layers.len()))),
    }
}

/// `created` for a pushed config: `SOURCE_DATE_EPOCH` when set (reproducible builds' convention),
/// else the Unix epoch, so one module pushed twice has one manifest digest.
pub fn created() -> String {
    let seconds: i64 = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    rfc3339(seconds)
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time (days to civil date: Howard Hinnant's algorithm).
fn rfc3339(seconds: i64) -> String {
    let (days, secs) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    #[test]
    fn references_parse_with_tags_or_digests() {
        let r = ArtifactRef::parse(&format!("oci://127.0.0.1:5000/policies/mine@sha256:{HEX}"))
            .unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "policies/mine");
        assert_eq!(r.digest(), Some(format!("sha256:{HEX}").as_str()));
        assert_eq!(
            r.to_string(),
            format!("127.0.0.1:5000/policies/mine@sha256:{HEX}")
        );
        let t = ArtifactRef::parse("quay.io/org/policy:v1.2").unwrap();
        assert_eq!(t.version, Version::Tag("v1.2".into()));
        assert_eq!(t.to_string(), "quay.io/org/policy:v1.2");
        assert!(t.pinned().unwrap_err().to_string().contains("by digest"));
        assert_eq!(
            t.tagged("sha256-x.sig").to_string(),
            "quay.io/org/policy:sha256-x.sig"
        );
        for bad in [
            "quay.io/org/policy",
            "policy:v1",
            "quay.io/Org/p:v1",
            "quay.io/org/p:-v1",
            "quay.io/org/p@sha256:abc",
        ] {
            let e = ArtifactRef::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn created_is_rfc3339_and_follows_source_date_epoch() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    fn manifest(config: &str, layers: &[&str]) -> ImageManifest {
        let layers: Vec<_> = layers.iter().map(|t| Descriptor::of(t, b"1")).collect();
        serde_json::from_slice(&manifest_json(&Descriptor::of(config, b"{}"), &layers)).unwrap()
    }

    #[test]
    fn only_a_single_wasm_layer_under_a_wasm_config_is_a_module() {
        let at = ArtifactRef::parse(&format!("r.io/p@sha256:{HEX}")).unwrap();
        assert!(wasm_layer(&at, &manifest(CONFIG_MEDIA_TYPE, &[LAYER_MEDIA_TYPE])).is_ok());
        let image = manifest(
            "application/vnd.oci.image.config.v1+json",
            &["application/vnd.oci.image.layer.v1.tar"],
        );
        let e = wasm_layer(&at, &image).unwrap_err().to_string();
        assert!(
            e.contains("not a Wasm artifact") && e.contains("container image"),
            "{e}"
        );
        let two = manifest(CONFIG_MEDIA_TYPE, &[LAYER_MEDIA_TYPE, LAYER_MEDIA_TYPE]);
        assert!(
            wasm_layer(&at, &two)
                .unwrap_err()
                .to_string()
                .contains("2 layers")
        );
        let other = manifest(CONFIG_MEDIA_TYPE, &["application/octet-stream"]);
        assert!(
            wasm_layer(&at, &other)
                .unwrap_err()
                .to_string()
                .contains("application/octet-stream")
        );
    }
}
