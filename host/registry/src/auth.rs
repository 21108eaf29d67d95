//! Registry credentials from a kubelet-style `config.json`: `auths.<registry>.auth` is base64 of
//! `user:password`. Keys may be bare hosts (`quay.io`), hosts with a path (`quay.io/org`, the
//! longest matching prefix wins) or URLs (`https://quay.io/v1/`).

use crate::credential_provider::Providers;
use base64::Engine;
use pinset_core::input;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("registry credentials {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("registry credentials {path}: not a config.json: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("registry credentials {path}: entry {key:?}: {why}")]
    Entry {
        path: PathBuf,
        key: String,
        why: String,
    },
    #[error(transparent)]
    Providers(#[from] crate::credential_provider::ConfigError),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
}

/// Credentials by registry key, normalised (no scheme, no trailing slash), and the node's
/// image credential providers, when it has them.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    entries: BTreeMap<String, Credential>,
    providers: Option<Arc<Providers>>,
}

impl Credentials {
    /// The credentials in a kubelet `config.json`. As for the kubelet, a missing or empty file
    /// means no credentials (said once, at info); a file that cannot be read or parsed is an
    /// error naming it.
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = match input::text(path, input::CONFIG) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!(path = %path.display(), "no registry credentials file: pulling without credentials");
                return Ok(Self::default());
            }
            Err(source) => {
                return Err(AuthError::Read {
                    path: path.into(),
                    source,
                });
            }
        };
        if text.trim().is_empty() {
            tracing::info!(path = %path.display(), "the registry credentials file is empty: pulling without credentials");
            return Ok(Self::default());
        }
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, AuthError> {
        #[derive(serde::Deserialize)]
        struct File {
            #[serde(default)]
            auths: BTreeMap<String, Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            auth: Option<String>,
            username: Option<String>,
            password: Option<String>,
        }
        let file: File = serde_json::from_str(text).map_err(|source| AuthError::Parse {
            path: path.into(),
            source,
        })?;
        let mut entries = BTreeMap::new();
        for (key, e) in file.auths {
            let err = |why: String| AuthError::Entry {
                path: path.into(),
                key: key.clone(),
                why,
            };
            let cred = match (e.auth, e.username, e.password) {
                (Some(auth), _, _) => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .map_err(|e| err(format!("auth is not base64: {e}")))?;
                    let text =
                        String::from_utf8(raw).map_err(|_| err("auth is not UTF-8".into()))?;
                    let (u, p) = text
                        .split_once(':')
                        .ok_or_else(|| err("auth is not user:password".into()))?;
                    Credential {
                        username: u.into(),
                        password: p.into(),
                    }
                }
                (None, Some(u), Some(p)) => Credential {
                    username: u,
                    password: p,
                },
                _ => return Err(err("neither auth nor username and password".into())),
            };
            entries.insert(normalise(&key), cred);
        }
        Ok(Self {
            entries,
            providers: None,
        })
    }

    /// Tell `observer` of the providers' plugin runs (Prometheus in the agent).
    pub fn observe(&self, observer: Arc<dyn pinset_core::decisions::Observer>) {
        if let Some(providers) = &self.providers {
            providers.observe(observer);
        }
    }

    /// These credentials, and `providers`' for the images they have none for (one set of
    /// providers, shared: one plugin run and one kept answer serve every client).
    pub fn with_providers(self, providers: Arc<Providers>) -> Self {
        Self {
            providers: Some(providers),
            ..self
        }
    }

    /// The credential for `image` (a reference, or `registry/repository`) of `repository` on
    /// `registry`: the file's when it has one (it is the operator's word), else the first an
    /// image credential provider gives (the provider runs when its answer is not kept); `None`
    /// when there is none; why, when a provider that should have given one failed.
    pub async fn resolve(
        &self,
        registry: &str,
        repository: &str,
        image: &str,
    ) -> Result<Option<Credential>, String> {
        if let Some(c) = self.lookup(registry, repository) {
            return Ok(Some(c.clone()));
        }
        match &self.providers {
            Some(providers) => providers.credential(image).await,
            None => Ok(None),
        }
    }

    /// Credentials for an image `repository` of `registry` (`host[:port]`), if any.
    pub fn lookup(&self, registry: &str, repository: &str) -> Option<&Credential> {
        let full = format!("{registry}/{repository}");
        self.entries
            .iter()
            .filter(|(k, _)| *k == registry || full == **k || full.starts_with(&format!("{k}/")))
            .max_by_key(|(k, _)| k.len())
            .map(|(_, c)| c)
    }
}

fn normalise(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let k = k.trim_end_matches('/');
    // Docker Hub's legacy key.
    let k = k
        .strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k);
    if k == "index.docker.io" {
        "docker.io".into()
    } else {
        k.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_file_means_no_credentials_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Credentials::load(&dir.path().join("config.json")).unwrap();
        assert!(missing.lookup("quay.io", "a/b").is_none());
        let empty = dir.path().join("empty.json");
        std::fs::write(&empty, "  \n").unwrap();
        assert!(
            Credentials::load(&empty)
                .unwrap()
                .lookup("quay.io", "a/b")
                .is_none()
        );
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{not json").unwrap();
        let e = Credentials::load(&bad).unwrap_err().to_string();
        assert!(
            e.contains("bad.json") && e.contains("not a config.json"),
            "{e}"
        );
        // A directory where the file should be (what a hostPath mount may create) is an error.
        let e = Credentials::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{e}");
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn longest_prefix_wins_and_urls_normalise() {
        let text = format!(
            r#"{{"auths": {{
                "quay.io": {{"auth": "{}"}},
                "quay.io/openshift-release-dev": {{"auth": "{}"}},
                "https://index.docker.io/v1/": {{"username": "hub", "password": "pw"}},
                "127.0.0.1:5000": {{"auth": "{}"}}
            }}}}"#,
            b64("any:one"),
            b64("release:two"),
            b64("local:three:with:colons")
        );
        let c = Credentials::parse(&text, Path::new("config.json")).unwrap();
        assert_eq!(c.lookup("quay.io", "other/img").unwrap().username, "any");
        assert_eq!(
            c.lookup("quay.io", "openshift-release-dev/ocp")
                .unwrap()
                .username,
            "release"
        );
        assert_eq!(
            c.lookup("docker.io", "library/busybox").unwrap().username,
            "hub"
        );
        let local = c.lookup("127.0.0.1:5000", "a").unwrap();
        assert_eq!(
            (local.username.as_str(), local.password.as_str()),
            ("local", "three:with:colons")
        );
        assert!(c.lookup("ghcr.io", "x").is_none());
    }

    #[test]
    fn bad_entries_name_file_and_key() {
        let e = Credentials::parse(
            r#"{"auths": {"q.io": {"auth": "%%%"}}}"#,
            Path::new("/k/config.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/k/config.json") && e.contains("q.io") && e.contains("base64"),
            "{e}"
        );
    }
}
