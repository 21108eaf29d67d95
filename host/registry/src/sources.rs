//! The registries file: which registries pinset speaks plain HTTP to, and where their
//! credentials are — for images and policies alike, in one place every command and component
//! reads, as kwctl's `sources.yaml` does for policies:
//!
//! ```yaml
//! insecureRegistries: [registry.local:5000]   # plain HTTP (a registry without TLS)
//! auth: /var/lib/kubelet/config.json          # credentials (a config.json), images and policies
//! ```
//!
//! Where it is: `--registries FILE`, else `$PINSET_REGISTRIES`, else
//! `$XDG_CONFIG_HOME/pinset/registries.yaml` (`~/.config/…`) when that exists. The flags
//! `--insecure-registry` / `--policy-insecure-registry` (added to the file's list) and `--auth` /
//! `--policy-auth` (over the file's) stay as shorthands.

use pinset_core::input;
use std::path::{Path, PathBuf};

/// The variable naming the registries file.
pub const ENV: &str = "PINSET_REGISTRIES";

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Sources {
    /// Registries (`host[:port]`) spoken to over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// A `config.json` with the registries' credentials.
    pub auth: Option<PathBuf>,
    /// The file these came from (`None`: no file).
    #[serde(skip)]
    pub origin: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum SourcesError {
    #[error("registries file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// `FILE:LINE:COL: field: message`.
    #[error("{path}:{error}")]
    Parse {
        path: String,
        error: pinset_core::yaml::YamlError,
    },
}

impl Sources {
    /// The registries file `flag` names, else the environment's, else the user's when it
    /// exists; no file is no registry marked and no credentials.
    pub fn load(flag: Option<&Path>) -> Result<Sources, SourcesError> {
        let chosen = flag
            .map(Path::to_path_buf)
            .or_else(|| {
                std::env::var_os(ENV)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .or_else(|| user_file().filter(|p| p.exists()));
        match chosen {
            Some(path) => Self::read(&path),
            None => Ok(Sources::default()),
        }
    }

    /// The file at `path`: strict fields, an error naming FILE:LINE:COL.
    pub fn read(path: &Path) -> Result<Sources, SourcesError> {
        let shown = path.display().to_string();
        let text = input::text(path, input::CONFIG).map_err(|source| SourcesError::Read {
            path: shown.clone(),
            source,
        })?;
        let parse = |error| SourcesError::Parse {
            path: shown.clone(),
            error,
        };
        let (mut sources, _) = if text.trim().is_empty() {
            (Sources::default(), Vec::new())
        } else {
            pinset_core::yaml::from_str::<Sources>(&text, Default::default()).map_err(parse)?
        };
        sources.origin = Some(path.to_path_buf());
        Ok(sources)
    }

    /// The registries spoken to over plain HTTP: the file's and `flags`', each once.
    pub fn insecure<'a>(&self, flags: impl IntoIterator<Item = &'a String>) -> Vec<String> {
        let mut all = self.insecure_registries.clone();
        for f in flags {
            if !all.contains(f) {
                all.push(f.clone());
            }
        }
        all
    }

    /// The credentials file: `flag` over the file's.
    pub fn auth(&self, flag: Option<&Path>) -> Option<PathBuf> {
        flag.map(Path::to_path_buf).or_else(|| self.auth.clone())
    }

    /// How to mark `host` insecure, for an error's hint.
    pub fn fix_for(host: &str) -> String {
        format!(
            "--insecure-registry {host}, or `insecureRegistries: [{host}]` in the registries file (--registries, ${ENV})"
        )
    }
}

/// `$XDG_CONFIG_HOME/pinset/registries.yaml`, else `~/.config/pinset/registries.yaml`.
fn user_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("pinset/registries.yaml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_strict_and_the_flags_add_to_it() {
        let (dir, file) = pinset_testkit::scratch_file(
            "registries.yaml",
            "insecureRegistries: [r.local:5000]\nauth: /a/config.json\n",
        );
        let s = Sources::load(Some(&file)).unwrap();
        assert_eq!(s.insecure_registries, ["r.local:5000"]);
        let flags = ["r.local:5000".to_string(), "other:5000".to_string()];
        assert_eq!(s.insecure(&flags), ["r.local:5000", "other:5000"]);
        assert_eq!(s.auth(None), Some(PathBuf::from("/a/config.json")));
        assert_eq!(s.auth(Some(Path::new("/b"))), Some(PathBuf::from("/b")));
        std::fs::write(&file, "insecureRegistries: [a]\ninsecure: [b]\n").unwrap();
        let e = Sources::load(Some(&file)).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}:2:1", file.display())) && e.contains("insecure"),
            "{e}"
        );
        std::fs::write(&file, "").unwrap();
        assert_eq!(
            Sources::load(Some(&file))
                .unwrap()
                .insecure_registries
                .len(),
            0
        );
        let missing = dir.path().join("none.yaml");
        let e = Sources::load(Some(&missing)).unwrap_err().to_string();
        assert!(e.contains("none.yaml"), "{e}");
    }
}
