//! The OCI image format as far as pinset reads and writes it: media types, descriptors, image
//! manifests and indexes (and Docker's v2 equivalents, which registries still serve).

use sha2::Digest;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// Every manifest type pinset asks for (`Accept`).
pub const MANIFEST_TYPES: [&str; 4] = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits.
pub fn valid_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// A content descriptor. `size` is signed as JSON allows: a registry may lie, and a negative
/// size is refused where it is used ([`Descriptor::checked_size`]), never wrapped.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

impl Descriptor {
    pub fn of(media_type: &str, bytes: &[u8]) -> Self {
        Self {
            media_type: media_type.to_string(),
            digest: sha256_digest(bytes),
            size: bytes.len() as i64,
            annotations: None,
            platform: None,
        }
    }

    pub fn annotated(mut self, key: &str, value: &str) -> Self {
        self.annotations = Some([(key.to_string(), value.to_string())].into());
        self
    }

    /// The size, when it is one a descriptor can have (not negative).
    pub fn checked_size(&self) -> Result<u64, String> {
        u64::try_from(self.size)
            .map_err(|_| format!("{}: a negative size ({})", self.digest, self.size))
    }
}

/// Where an index entry runs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// An image manifest (OCI or Docker v2 schema 2).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    #[serde(default)]
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
}

/// An image index (OCI) or manifest list (Docker).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    #[serde(default)]
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

/// A manifest as served: an image's or an index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Manifest {
    Image(ImageManifest),
    Index(ImageIndex),
}

impl Manifest {
    /// Parse a manifest's bytes: an index when it says so (media type) or lists manifests.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, String> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Probe {
            media_type: Option<String>,
            manifests: Option<serde_json::Value>,
        }
        let probe: Probe = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let index = probe
            .media_type
            .as_deref()
            .is_some_and(|t| t == OCI_INDEX || t == DOCKER_LIST)
            || probe.manifests.is_some();
        if index {
            serde_json::from_slice(bytes)
                .map(Manifest::Index)
                .map_err(|e| format!("not an image index: {e}"))
        } else {
            serde_json::from_slice(bytes)
                .map(Manifest::Image)
                .map_err(|e| format!("not an image manifest: {e}"))
        }
    }
}

impl ImageIndex {
    /// The digest of the entry for this machine's platform (`linux` and its architecture, as Go
    /// names it), if the index has one.
    pub fn for_this_platform(&self) -> Option<&str> {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "powerpc64" => "ppc64le",
            other => other,
        };
        self.manifests
            .iter()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == arch)
            })
            .map(|m| m.digest.as_str())
    }
}

/// An OCI image manifest's bytes. Serialised once here so that its digest is the digest of what
/// is pushed.
pub fn manifest_json(config: &Descriptor, layers: &[Descriptor]) -> Vec<u8> {
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config,
        "layers": layers,
    });
    serde_json::to_vec(&manifest).expect("a manifest serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_and_indexes_are_told_apart_and_sizes_stay_signed() {
        let image = br#"{"schemaVersion":2,"config":{"mediaType":"c","digest":"sha256:a","size":2},"layers":[{"mediaType":"l","digest":"sha256:b","size":-1}]}"#;
        let Manifest::Image(m) = Manifest::parse(image).unwrap() else {
            panic!("an image manifest")
        };
        assert!(
            m.layers[0]
                .checked_size()
                .unwrap_err()
                .contains("negative size (-1)")
        );
        let index = br#"{"schemaVersion":2,"manifests":[{"digest":"sha256:c","size":3,"platform":{"architecture":"amd64","os":"linux"}}]}"#;
        let Manifest::Index(i) = Manifest::parse(index).unwrap() else {
            panic!("an index")
        };
        if std::env::consts::ARCH == "x86_64" {
            assert_eq!(i.for_this_platform(), Some("sha256:c"));
        }
        assert!(Manifest::parse(b"[]").is_err());
        assert!(valid_digest(&sha256_digest(b"x")));
        assert!(!valid_digest("sha256:ABC"));
    }
}
