//! Policy modules as OCI artifacts, in the Wasm component layout that wasm-pkg-tools
//! (`wkg oci push`, its `oci-wasm` crate) and the CNCF TAG Runtime's Wasm OCI artifact layout
//! define: an image manifest whose config is `application/vnd.wasm.config.v0+json` and whose one
//! layer is the module, `application/wasm`. A module pushed by either tool is pulled by the other.
//!
//! References are `[oci://]REGISTRY/REPOSITORY@sha256:HEX`; a tag (`:TAG`) is accepted only where
//! a person names an artifact to push or pull, and is resolved to its digest there.

use super::auth::Credentials;
use pinset_core::reference::ImageRef;
use sha2::Digest;
use std::fmt;
use std::sync::Arc;

pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
const INDEX_MEDIA_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// The largest manifest read (the distribution spec's limit).
const MAX_MANIFEST_BYTES: usize = 4 << 20;

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

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{reference:?}: not an artifact reference: {why}")]
    Reference { reference: String, why: String },
    #[error("{reference}: a tag names no fixed module: reference it by digest (@sha256:…)")]
    Unpinned { reference: String },
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
    #[error(
        "{reference}: the module is {size} bytes, over the limit of {max} bytes (--policy-max-module-mib)"
    )]
    TooLarge {
        reference: String,
        size: u64,
        max: u64,
    },
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

    fn client_ref(&self) -> oci_client::Reference {
        let (registry, repository) = (self.registry.clone(), self.repository.clone());
        match &self.version {
            Version::Tag(tag) => oci_client::Reference::with_tag(registry, repository, tag.clone()),
            Version::Digest(d) => {
                oci_client::Reference::with_digest(registry, repository, d.clone())
            }
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

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

/// The artifact's config, as wasm-pkg-tools writes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// RFC 3339. pinset writes `SOURCE_DATE_EPOCH` when set, else the Unix epoch, so that pushing
    /// one module twice gives one manifest digest.
    pub created: String,
    #[serde(default)]
    pub author: Option<String>,
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub layer_digests: Vec<String>,
    #[serde(default)]
    pub component: Option<ComponentWorld>,
}

/// What a component exports and imports (interface names), as the config records it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ComponentWorld {
    #[serde(default)]
    pub exports: Vec<String>,
    #[serde(default)]
    pub imports: Vec<String>,
    #[serde(default)]
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
/// token and basic flows of the distribution client, plain HTTP for the registries listed.
#[derive(Clone)]
pub struct Artifacts {
    client: oci_client::Client,
    credentials: Arc<Credentials>,
}

impl Artifacts {
    pub fn new(insecure_registries: Vec<String>, credentials: Arc<Credentials>) -> Self {
        Self {
            client: super::client(insecure_registries),
            credentials,
        }
    }

    fn auth(&self, reference: &ArtifactRef) -> oci_client::secrets::RegistryAuth {
        match self
            .credentials
            .lookup(&reference.registry, &reference.repository)
        {
            Some(c) => {
                oci_client::secrets::RegistryAuth::Basic(c.username.clone(), c.password.clone())
            }
            None => oci_client::secrets::RegistryAuth::Anonymous,
        }
    }

    fn registry_error(
        reference: &ArtifactRef,
        operation: &'static str,
    ) -> impl FnOnce(oci_client::errors::OciDistributionError) -> ArtifactError {
        let reference = reference.to_string();
        move |e| ArtifactError::Registry {
            reference,
            operation,
            cause: super::causes(&e),
        }
    }

    /// The digest a reference names: its own, or the one its tag points to now.
    pub async fn resolve(&self, reference: &ArtifactRef) -> Result<ArtifactRef, ArtifactError> {
        if reference.digest().is_some() {
            return Ok(reference.clone());
        }
        let digest = self
            .client
            .fetch_manifest_digest(&reference.client_ref(), &self.auth(reference))
            .await
            .map_err(Self::registry_error(reference, "resolving the tag"))?;
        Ok(reference.at(&digest))
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
        let target = reference.client_ref();
        let auth = self.auth(reference);
        let fail = |op| Self::registry_error(reference, op);
        self.client
            .auth(&target, &auth, oci_client::RegistryOperation::Push)
            .await
            .map_err(fail("authenticating to push"))?;
        let mut layer = Descriptor::of(LAYER_MEDIA_TYPE, module);
        if let Some(title) = title {
            layer = layer.annotated("org.opencontainers.image.title", title);
        }
        config.layer_digests = vec![layer.digest.clone()];
        let config_json = serde_json::to_vec(&config).expect("a config serialises");
        let config = Descriptor::of(CONFIG_MEDIA_TYPE, &config_json);
        self.client
            .push_blob(&target, module.to_vec(), &layer.digest)
            .await
            .map_err(fail("pushing the module"))?;
        self.client
            .push_blob(&target, config_json, &config.digest)
            .await
            .map_err(fail("pushing the config"))?;
        let manifest = manifest_json(&config, &[layer]);
        self.push_manifest(reference, manifest).await
    }

    /// Push a manifest's bytes as `reference`; the reference at their digest.
    pub(crate) async fn push_manifest(
        &self,
        reference: &ArtifactRef,
        manifest: Vec<u8>,
    ) -> Result<ArtifactRef, ArtifactError> {
        let digest = sha256_digest(&manifest);
        self.client
            .push_manifest_raw(
                &reference.client_ref(),
                manifest,
                http::HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
            )
            .await
            .map_err(Self::registry_error(reference, "pushing the manifest"))?;
        Ok(reference.at(&digest))
    }

    /// Push a blob to `reference`'s repository.
    pub(crate) async fn push_blob(
        &self,
        reference: &ArtifactRef,
        bytes: Vec<u8>,
    ) -> Result<String, ArtifactError> {
        let digest = sha256_digest(&bytes);
        let target = reference.client_ref();
        let fail = |op| Self::registry_error(reference, op);
        self.client
            .auth(
                &target,
                &self.auth(reference),
                oci_client::RegistryOperation::Push,
            )
            .await
            .map_err(fail("authenticating to push"))?;
        self.client
            .push_blob(&target, bytes, &digest)
            .await
            .map_err(fail("pushing a blob"))?;
        Ok(digest)
    }

    /// The manifest `reference` names, its bytes checked against the digest it is asked by;
    /// `Ok(None)` when the registry has none.
    pub(crate) async fn manifest(
        &self,
        reference: &ArtifactRef,
    ) -> Result<Option<(Manifest, String)>, ArtifactError> {
        let accepted = [
            MANIFEST_MEDIA_TYPE,
            DOCKER_MANIFEST_MEDIA_TYPE,
            INDEX_MEDIA_TYPES[0],
            INDEX_MEDIA_TYPES[1],
        ];
        let pulled = self
            .client
            .pull_manifest_raw(&reference.client_ref(), &self.auth(reference), &accepted)
            .await;
        let (bytes, _) = match pulled {
            Ok(found) => found,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(Self::registry_error(reference, "reading the manifest")(e)),
        };
        let not_wasm = |why: String| ArtifactError::NotWasm {
            reference: reference.to_string(),
            why,
        };
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(not_wasm(format!(
                "a manifest over {MAX_MANIFEST_BYTES} bytes"
            )));
        }
        let digest = sha256_digest(&bytes);
        if let Some(asked) = reference.digest().filter(|asked| **asked != digest) {
            return Err(not_wasm(format!(
                "the registry answered with manifest {digest}, not {asked}"
            )));
        }
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| not_wasm(format!("the manifest does not parse: {e}")))?;
        Ok(Some((manifest, digest)))
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
                .ok_or_else(|| ArtifactError::Registry {
                    reference: reference.to_string(),
                    operation: "reading the manifest",
                    cause: "not found".into(),
                })?;
        let at = reference.at(&digest);
        let layer = wasm_layer(&at, &manifest)?;
        if layer.size > max_bytes {
            return Err(ArtifactError::TooLarge {
                reference: at.to_string(),
                size: layer.size,
                max: max_bytes,
            });
        }
        let module = self.blob(&at, &layer.digest, layer.size, max_bytes).await?;
        let config = self.config(&at, &manifest).await;
        Ok(Pulled {
            reference: at,
            layer_digest: layer.digest.clone(),
            module,
            config,
        })
    }

    /// The config, when it reads as a Wasm config (informational: nothing depends on it).
    async fn config(&self, at: &ArtifactRef, manifest: &Manifest) -> Option<WasmConfig> {
        let bytes = self
            .blob(
                at,
                &manifest.config.digest,
                manifest.config.size,
                MAX_MANIFEST_BYTES as u64,
            )
            .await
            .inspect_err(|e| tracing::debug!(error = %e, "artifact config unreadable"))
            .ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// A blob of `at`'s repository, no larger than `max` bytes, its digest checked.
    pub(crate) async fn blob(
        &self,
        at: &ArtifactRef,
        digest: &str,
        size: u64,
        max: u64,
    ) -> Result<Vec<u8>, ArtifactError> {
        use futures::StreamExt;
        let layer_error = |why: String| ArtifactError::Layer {
            reference: at.to_string(),
            digest: digest.to_string(),
            why,
        };
        let descriptor = oci_client::manifest::OciDescriptor {
            digest: digest.to_string(),
            size: i64::try_from(size).unwrap_or(i64::MAX),
            ..Default::default()
        };
        let mut stream = self
            .client
            .pull_blob_stream(&at.client_ref(), &descriptor)
            .await
            .map_err(Self::registry_error(at, "reading a blob"))?;
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| layer_error(format!("reading: {e}")))?;
            bytes.extend_from_slice(&chunk);
            if bytes.len() as u64 > max {
                return Err(layer_error(format!("more than {max} bytes")));
            }
        }
        let actual = sha256_digest(&bytes);
        if actual != digest {
            return Err(layer_error(format!(
                "the registry served bytes of digest {actual}"
            )));
        }
        Ok(bytes)
    }
}

/// An image manifest, as far as artifacts need it.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Manifest {
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
}

/// The one `application/wasm` layer of a Wasm artifact's manifest.
fn wasm_layer<'m>(
    at: &ArtifactRef,
    manifest: &'m Manifest,
) -> Result<&'m Descriptor, ArtifactError> {
    let not_wasm = |why: String| ArtifactError::NotWasm {
        reference: at.to_string(),
        why,
    };
    if manifest
        .media_type
        .as_deref()
        .is_some_and(|t| INDEX_MEDIA_TYPES.contains(&t))
    {
        return Err(not_wasm("an image index (a container image?)".into()));
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

/// An OCI image manifest's bytes. Serialised once here so that its digest is the digest of
/// what is pushed.
pub(crate) fn manifest_json(config: &Descriptor, layers: &[Descriptor]) -> Vec<u8> {
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config,
        "layers": layers,
    });
    serde_json::to_vec(&manifest).expect("a manifest serialises")
}

impl Descriptor {
    pub(crate) fn of(media_type: &str, bytes: &[u8]) -> Self {
        Self {
            media_type: media_type.to_string(),
            digest: sha256_digest(bytes),
            size: bytes.len() as u64,
            annotations: None,
        }
    }

    pub(crate) fn annotated(mut self, key: &str, value: &str) -> Self {
        self.annotations = Some([(key.to_string(), value.to_string())].into());
        self
    }
}

fn not_found(e: &oci_client::errors::OciDistributionError) -> bool {
    use oci_client::errors::OciDistributionError as E;
    match e {
        E::ImageManifestNotFoundError(_) => true,
        E::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                oci_client::errors::OciErrorCode::ManifestUnknown
                    | oci_client::errors::OciErrorCode::NameUnknown
            )
        }),
        E::ServerError { code: 404, .. } => true,
        _ => false,
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

    fn manifest(config: &str, layers: &[&str]) -> Manifest {
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
