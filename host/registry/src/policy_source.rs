//! Where a policy module comes from: a file, or an OCI artifact pinned by digest
//! (`oci://REGISTRY/REPOSITORY@sha256:HEX`), fetched through the registry, its cosign signature
//! checked when keys are required, and kept on the node by digest so that a restarted agent
//! starts without the registry.
//!
//! The cache holds, per manifest digest, the module (`<hex>.wasm`) and a record (`<hex>.json`:
//! the reference, the module's digest, the keys that verified it). A module whose bytes no longer
//! match the record's digest (a truncated or altered file) is discarded and fetched again; a
//! module verified by none of the keys now required is verified again against the registry.

use crate::artifact::{ArtifactError, ArtifactRef, Artifacts, SCHEME, sha256_digest};
use crate::files::write_atomic;
use crate::limits::POLICY_FETCH;
use crate::signature::{SignatureError, VerifyingKey};
use pinset_core::input;
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
    /// Keys are configured, and a file carries no signature.
    #[error("{}: a signature is required and a file carries none: reference a signed oci:// artifact", path.display())]
    Unsigned { path: PathBuf },
    /// `size`: when known (a read stopped at the bound knows none).
    #[error("policy module {}: {}over the limit of {max} bytes (--policy-max-module-mib)", path.display(), input::size_said(*size))]
    TooLarge {
        path: PathBuf,
        size: Option<u64>,
        max: u64,
    },
    #[error("policy cache {path}: {source}")]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl SourceError {
    /// The kind of refusal this is: a registry away or a cache that cannot be written is no
    /// verdict on the module.
    pub fn refusal(&self) -> pinset_core::refusal::Refusal {
        use pinset_core::refusal::Refusal;
        match self {
            SourceError::Artifact(e) => e.refusal(),
            SourceError::Signature(e) => e.refusal(),
            SourceError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Refusal::NotFound
            }
            SourceError::Read { .. }
            | SourceError::Unsigned { .. }
            | SourceError::TooLarge { .. } => Refusal::NotAPolicy,
            SourceError::Cache { .. } => Refusal::RegistryAway,
        }
    }
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
            Source::File(path) => read_file(path, keys, self.max_bytes),
            Source::Oci(reference) => {
                let fetch = self.fetch_artifact(reference, keys);
                match tokio::time::timeout(POLICY_FETCH, fetch).await {
                    Ok(fetched) => fetched,
                    Err(_) => Err(SourceError::Artifact(ArtifactError::Away {
                        reference: reference.to_string(),
                        operation: "fetching the module",
                        cause: format!("not done within {} s", POLICY_FETCH.as_secs()),
                    })),
                }
            }
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

    /// The cached module of `reference` and its record, when both read and agree (marked used).
    fn cached(&self, reference: &ArtifactRef) -> Option<(Vec<u8>, Record)> {
        let (module, record) = self.paths(reference)?;
        touch(&module);
        let rec: Record =
            serde_json::from_slice(&input::bytes(&record, input::CONFIG).ok()?).ok()?;
        // Over the limit (lowered since it was kept): fetched again, and the fetch rewrites it.
        let bytes = input::bytes(&module, input::module(self.max_bytes)).ok()?;
        if sha256_digest(&bytes) != rec.module_digest {
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
        let mut rec: Record = input::bytes(&record, input::CONFIG)
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

/// A module file: refused when a signature is required (a file carries none), its size
/// checked before a byte is read and its read bounded by `max_bytes` (a file may grow, a device
/// or FIFO says no size).
fn read_file(path: &Path, keys: &[VerifyingKey], max_bytes: u64) -> Result<Fetched, SourceError> {
    if !keys.is_empty() {
        return Err(SourceError::Unsigned { path: path.into() });
    }
    let read = |source| SourceError::Read {
        path: path.to_path_buf(),
        source,
    };
    let bytes =
        input::bytes(path, input::module(max_bytes)).map_err(|e| match input::refused(&e) {
            Some(refused) => SourceError::TooLarge {
                path: path.into(),
                size: refused.size,
                max: max_bytes,
            },
            None => read(e),
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
        return read_file(path, keys, fetcher.max_bytes);
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

/// What [`prune`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Files removed.
    pub removed: usize,
    /// Bytes kept.
    pub kept_bytes: u64,
}

/// Keep the node's policy cache `dir` bounded: the modules named in `keep` (a manifest digest or
/// a module's own sha256, as `sha256:HEX` or `HEX`: its artifact files and its compiled forms),
/// then the most recently used others while the cache stays within `max_bytes`; the rest is
/// removed. The agent prunes at start and after each swap. A file it cannot read is left.
pub fn prune(dir: &Path, keep: &[&str], max_bytes: u64) -> std::io::Result<Pruned> {
    let keep: Vec<&str> = keep
        .iter()
        .map(|k| k.trim_start_matches("sha256:"))
        .collect();
    let mut entries = cache_entries(dir)?;
    entries.extend(cache_entries(&dir.join("compiled"))?);
    // Kept first, then newest first.
    entries.sort_by_key(|e| (!keep.contains(&e.hex.as_str()), std::cmp::Reverse(e.used)));
    let mut pruned = Pruned::default();
    for entry in entries {
        let kept = keep.contains(&entry.hex.as_str());
        if kept || pruned.kept_bytes + entry.bytes <= max_bytes {
            pruned.kept_bytes += entry.bytes;
            continue;
        }
        for file in &entry.files {
            if std::fs::remove_file(file).is_ok() {
                pruned.removed += 1;
            }
        }
    }
    Ok(pruned)
}

/// One cached thing: its digest, its files (module and record, or artifact and checksum), their
/// size and when it was last used.
struct Entry {
    hex: String,
    files: Vec<PathBuf>,
    bytes: u64,
    used: std::time::SystemTime,
}

/// The entries of one cache directory, grouped by the digest their names start with.
fn cache_entries(dir: &Path) -> std::io::Result<Vec<Entry>> {
    let mut by_hex: std::collections::BTreeMap<String, Entry> = Default::default();
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    for item in listing.flatten() {
        let path = item.path();
        let Ok(meta) = item.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let name = item.file_name().to_string_lossy().into_owned();
        let hex: String = name.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
        if hex.len() != 64 {
            continue;
        }
        let used = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
        let entry = by_hex.entry(hex.clone()).or_insert_with(|| Entry {
            hex,
            files: Vec::new(),
            bytes: 0,
            used,
        });
        entry.files.push(path);
        entry.bytes += meta.len();
        entry.used = entry.used.max(used);
    }
    Ok(by_hex.into_values().collect())
}

/// Mark `path` as used now (what [`prune`] keeps longest).
pub fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::options().append(true).open(path) {
        let _ = file.set_modified(std::time::SystemTime::now());
    }
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
        let key = crate::signature::SigningKey::generate(b"")
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
            e.contains("/x.wasm") && e.contains("a signature is required"),
            "{e}"
        );
    }

    #[test]
    fn a_file_over_the_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let fetcher = fetcher(dir.path());
        let path = dir.path().join("big.wasm");
        std::fs::write(&path, vec![0u8; fetcher.max_bytes as usize + 1]).unwrap();
        let e = fetch_blocking(&fetcher, &Source::File(path.clone()), &[]).unwrap_err();
        assert!(
            matches!(e, SourceError::TooLarge { size: Some(size), max, .. }
            if size == max + 1 && max == fetcher.max_bytes)
        );
        assert_eq!(e.refusal(), pinset_core::refusal::Refusal::NotAPolicy);
        assert!(e.to_string().contains("--policy-max-module-mib"), "{e}");
        std::fs::write(&path, vec![0u8; fetcher.max_bytes as usize]).unwrap();
        let fetched = fetch_blocking(&fetcher, &Source::File(path), &[]).unwrap();
        assert_eq!(fetched.bytes.len() as u64, fetcher.max_bytes);
    }

    #[test]
    fn the_cache_keeps_what_is_named_then_the_newest_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let put = |hex: char, ext: &str, size: usize, age: u64| {
            let path = dir
                .path()
                .join(format!("{}.{ext}", hex.to_string().repeat(64)));
            std::fs::write(&path, vec![0u8; size]).unwrap();
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            std::fs::File::options()
                .append(true)
                .open(&path)
                .unwrap()
                .set_modified(when)
                .unwrap();
        };
        put('a', "wasm", 1000, 300); // old, but running: kept
        put('a', "json", 10, 300);
        put('b', "wasm", 1000, 10); // newest: kept within the bound
        put('c', "wasm", 1000, 100); // older: removed
        std::fs::create_dir(dir.path().join("compiled")).unwrap();
        let compiled = dir
            .path()
            .join("compiled")
            .join(format!("{}-00ff.cwasm", "c".repeat(64)));
        std::fs::write(&compiled, vec![0u8; 500]).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(200);
        std::fs::File::options()
            .append(true)
            .open(&compiled)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let pruned = prune(dir.path(), &[&format!("sha256:{}", "a".repeat(64))], 2100).unwrap();
        assert_eq!(pruned.kept_bytes, 2010);
        assert!(dir.path().join(format!("{}.wasm", "a".repeat(64))).exists());
        assert!(dir.path().join(format!("{}.wasm", "b".repeat(64))).exists());
        assert!(!dir.path().join(format!("{}.wasm", "c".repeat(64))).exists());
        assert!(
            !compiled.exists(),
            "an old compiled module past the bound goes too"
        );
        assert_eq!(pruned.removed, 2);
    }
}
