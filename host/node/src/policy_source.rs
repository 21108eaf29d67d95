//! Where a policy module comes from: a file, or an OCI artifact pinned by digest
//! (`oci://REGISTRY/REPOSITORY@sha256:HEX`), fetched through the registry, its cosign signature
//! checked when keys are required, and kept on the node by digest so that a restarted agent
//! starts without the registry.
//!
//! The cache holds, per manifest digest, the module (`<hex>.wasm`) and a record (`<hex>.json`:
//! the reference, the module's digest, the keys that verified it). A module whose bytes no longer
//! match the record's digest (a truncated or altered file) is discarded and fetched again; a
//! module verified by none of the keys now required is verified again against the registry.

use crate::os::write_atomic;
use crate::registry::artifact::{ArtifactError, ArtifactRef, Artifacts, SCHEME, sha256_digest};
use crate::registry::signature::{SignatureError, VerifyingKey};
use std::path::{Path, PathBuf};

/// A module as a policy configuration names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    File(PathBuf),
    /// Always pinned by digest.
    Oci(ArtifactRef),
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{reference}: signature required, but {why}")]
    Unverifiable { reference: String, why: String },
    #[error("policy cache {path}: {source}")]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Source {
    /// `oci://REGISTRY/REPOSITORY@sha256:HEX`, or a file path. A tag is refused: a module is
    /// named by digest, as images in sets are.
    pub fn parse(text: &str) -> Result<Self, SourceError> {
        if !text.starts_with(SCHEME) {
            return Ok(Source::File(PathBuf::from(text)));
        }
        let reference = ArtifactRef::parse(text)?;
        reference.pinned()?;
        Ok(Source::Oci(reference))
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Oci(r) => write!(f, "{SCHEME}{r}"),
        }
    }
}

/// A module's bytes and where they came from.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// How reports name the module: the file, or `oci://…@sha256:…`.
    pub name: String,
    pub bytes: Vec<u8>,
    /// The key that verified its signature (its fingerprint), when one was required.
    pub verified_by: Option<String>,
    /// Served from the node's cache, without the registry.
    pub cached: bool,
}

/// Fetches modules: files directly, artifacts through the registry and the node's cache.
#[derive(Clone)]
pub struct Fetcher {
    pub artifacts: Artifacts,
    pub cache: Option<PathBuf>,
    /// The largest module accepted.
    pub max_bytes: u64,
}

/// What the cache records of a module beside its bytes.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    reference: String,
    module_digest: String,
    #[serde(default)]
    verified_by: Vec<String>,
}

impl Fetcher {
    /// The module `source` names; with `keys`, only one whose signature one of them verifies.
    pub async fn fetch(
        &self,
        source: &Source,
        keys: &[VerifyingKey],
    ) -> Result<Fetched, SourceError> {
        match source {
            Source::File(path) => read_file(path, keys),
            Source::Oci(reference) => self.fetch_artifact(reference, keys).await,
        }
    }

    async fn fetch_artifact(
        &self,
        reference: &ArtifactRef,
        keys: &[VerifyingKey],
    ) -> Result<Fetched, SourceError> {
        let name = format!("{SCHEME}{reference}");
        let mut record = self.cached(reference);
        if let Some((bytes, rec)) = &record {
            let trusted = keys
                .iter()
                .find(|k| rec.verified_by.contains(&k.fingerprint()));
            if keys.is_empty() || trusted.is_some() {
                return Ok(Fetched {
                    name,
                    bytes: bytes.clone(),
                    verified_by: trusted.map(|k| k.fingerprint()),
                    cached: true,
                });
            }
        }
        let verified_by = match keys.is_empty() {
            true => None,
            false => Some(self.artifacts.verify(reference, keys).await?.key),
        };
        let bytes = match record.take() {
            Some((bytes, _)) => bytes,
            None => self.artifacts.pull(reference, self.max_bytes).await?.module,
        };
        self.store(reference, &bytes, verified_by.as_deref())?;
        Ok(Fetched {
            name,
            bytes,
            verified_by,
            cached: false,
        })
    }

    fn paths(&self, reference: &ArtifactRef) -> Option<(PathBuf, PathBuf)> {
        let dir = self.cache.as_ref()?;
        let hex = reference.digest()?.strip_prefix("sha256:")?;
        Some((
            dir.join(format!("{hex}.wasm")),
            dir.join(format!("{hex}.json")),
        ))
    }

    /// The cached module of `reference` and its record, when both read and agree.
    fn cached(&self, reference: &ArtifactRef) -> Option<(Vec<u8>, Record)> {
        let (module, record) = self.paths(reference)?;
        let rec: Record = serde_json::from_slice(&std::fs::read(&record).ok()?).ok()?;
        let bytes = std::fs::read(&module).ok()?;
        if bytes.len() as u64 > self.max_bytes || sha256_digest(&bytes) != rec.module_digest {
            tracing::warn!(module = %module.display(), reference = %reference,
                "cached policy module does not match its digest: discarded, fetching again");
            let _ = std::fs::remove_file(&module);
            let _ = std::fs::remove_file(&record);
            return None;
        }
        Some((bytes, rec))
    }

    /// Keep `bytes` for `reference`, with the key that verified them (added to earlier ones).
    fn store(
        &self,
        reference: &ArtifactRef,
        bytes: &[u8],
        verified_by: Option<&str>,
    ) -> Result<(), SourceError> {
        let Some((module, record)) = self.paths(reference) else {
            return Ok(());
        };
        let dir = module.parent().expect("a cache file has a directory");
        let err = |source| SourceError::Cache {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        let mut rec: Record = std::fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        rec.reference = reference.to_string();
        rec.module_digest = sha256_digest(bytes);
        if let Some(key) = verified_by.filter(|k| !rec.verified_by.iter().any(|v| v == k)) {
            rec.verified_by.push(key.to_string());
        }
        write_atomic(&module, bytes).map_err(err)?;
        write_atomic(
            &record,
            &serde_json::to_vec_pretty(&rec).expect("a record serialises"),
        )
        .map_err(err)
    }
}

fn read_file(path: &Path, keys: &[VerifyingKey]) -> Result<Fetched, SourceError> {
    if !keys.is_empty() {
        return Err(SourceError::Unverifiable {
            reference: path.display().to_string(),
            why: "a file carries no signature: reference a signed oci:// artifact".into(),
        });
    }
    let bytes = std::fs::read(path).map_err(|source| SourceError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Fetched {
        name: path.display().to_string(),
        bytes,
        verified_by: None,
        cached: false,
    })
}

/// Run `fetch` to completion on a runtime of its own, on another thread: for the synchronous
/// paths that load policies (commands, startup), whether or not they run inside a runtime.
pub fn fetch_blocking(
    fetcher: &Fetcher,
    source: &Source,
    keys: &[VerifyingKey],
) -> Result<Fetched, SourceError> {
    if let Source::File(path) = source {
        return read_file(path, keys);
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|source| SourceError::Read {
                        path: PathBuf::from("(runtime)"),
                        source,
                    })?;
                runtime.block_on(fetcher.fetch(source, keys))
            })
            .join()
            .expect("the fetch thread does not panic")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    #[test]
    fn sources_are_files_or_pinned_artifacts() {
        assert_eq!(
            Source::parse("/p/a.wasm").unwrap(),
            Source::File("/p/a.wasm".into())
        );
        let oci = format!("oci://r.io/p/x@sha256:{HEX}");
        assert_eq!(Source::parse(&oci).unwrap().to_string(), oci);
        let e = Source::parse("oci://r.io/p/x:v1").unwrap_err().to_string();
        assert!(e.contains("by digest"), "{e}");
    }

    fn fetcher(dir: &Path) -> Fetcher {
        Fetcher {
            artifacts: Artifacts::new(vec![], Default::default()),
            cache: Some(dir.to_path_buf()),
            max_bytes: 1 << 20,
        }
    }

    #[test]
    fn a_cached_module_is_served_and_a_damaged_one_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let f = fetcher(dir.path());
        // An address nothing listens on: only the cache can answer.
        let r = ArtifactRef::parse(&format!("127.0.0.1:9/p@sha256:{HEX}")).unwrap();
        f.store(&r, b"\0asm module", Some("sha256:key")).unwrap();
        let got = fetch_blocking(&f, &Source::Oci(r.clone()), &[]).unwrap();
        assert!(got.cached);
        assert_eq!(got.bytes, b"\0asm module");
        std::fs::write(dir.path().join(format!("{HEX}.wasm")), b"\0asm mod").unwrap();
        assert!(f.cached(&r).is_none(), "a truncated module is not served");
        assert!(
            !dir.path().join(format!("{HEX}.wasm")).exists(),
            "and is removed"
        );
    }

    #[test]
    fn a_file_cannot_satisfy_a_signature_requirement() {
        let dir = tempfile::tempdir().unwrap();
        let key = crate::registry::signature::SigningKey::generate(b"")
            .unwrap()
            .1
            .public();
        let e = fetch_blocking(
            &fetcher(dir.path()),
            &Source::File("/x.wasm".into()),
            &[key],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/x.wasm") && e.contains("signature required"),
            "{e}"
        );
    }
}
