//! CRI-O pins by configuration: `[crio.image] pinned_images = [...]` in a drop-in, re-read when
//! CRI-O is reloaded (SIGHUP, see [`Reload`]).
//!
//! The drop-in is written atomically (temporary file in the same directory, fsync, rename,
//! fsync of the directory): after a crash at any point the file is either the old one or the
//! new one, never partial. It is rewritten, and the runtime reloaded, only when its content
//! changes; with nothing pinned it is removed.

pub use super::reload::Reload;
use super::{PinBackend, PinChange, PinError};
use crate::os::write_atomic;
use pinset_core::drift::{Drift, DriftKind};
use pinset_core::input;
use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::PoisonError;

pub const DEFAULT_DIR: &str = "/etc/crio/crio.conf.d";
pub const DROP_IN: &str = "50-pinned-images";

pub struct CrioPins {
    dir: PathBuf,
    reload: Reload,
    /// The drop-in's content as this process last wrote or found it right; `None` until the
    /// first apply. A file that differs from it was changed by someone else.
    last: std::sync::Mutex<Option<Option<String>>>,
}

impl CrioPins {
    /// `reload` is how CRI-O is made to re-read its configuration.
    pub fn new(dir: impl Into<PathBuf>, reload: Reload) -> Self {
        Self {
            dir: dir.into(),
            reload,
            last: std::sync::Mutex::new(None),
        }
    }

    /// The file changed behind pinset's back since it last wrote or checked it.
    fn drift(&self, found: Option<&str>) -> Vec<Drift> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(expected) = last.as_ref() else {
            return Vec::new();
        };
        let kind = match (expected.as_deref(), found) {
            (a, b) if a == b => return Vec::new(),
            (Some(_), None) => DriftKind::DropInDeleted,
            _ => DriftKind::DropInEdited,
        };
        vec![Drift {
            kind,
            object: self.path().display().to_string(),
        }]
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(DROP_IN)
    }

    async fn reload(&self) -> Result<(), PinError> {
        self.reload.run().await.map_err(|why| PinError::Reload {
            how: self.reload.describe(),
            why,
        })
    }
}

/// The drop-in's content for `images` (sorted, one per line).
pub fn render(images: &BTreeSet<String>) -> String {
    let mut out = String::from(
        "# Written by pinset: images the kubelet must never garbage collect.\n[crio.image]\npinned_images = [\n",
    );
    for image in images {
        out.push_str("  \"");
        for c in image.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
                c => out.push(c),
            }
        }
        out.push_str("\",\n");
    }
    out.push_str("]\n");
    out
}

/// The images a drop-in pins (`crio.image.pinned_images`), as CRI-O reads it.
pub fn parse(content: &str) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct File {
        crio: Option<Crio>,
    }
    #[derive(serde::Deserialize)]
    struct Crio {
        image: Option<Image>,
    }
    #[derive(serde::Deserialize)]
    struct Image {
        #[serde(default)]
        pinned_images: Vec<String>,
    }
    let f: File = toml::from_str(content).map_err(|e| e.to_string())?;
    Ok(f.crio
        .and_then(|c| c.image)
        .map(|i| i.pinned_images)
        .unwrap_or_default())
}

/// Whether CRI-O's pattern pins `image`: exact, trailing `*` glob, or `*keyword*`.
pub fn pattern_matches(pattern: &str, image: &str) -> bool {
    if let Some(inner) = pattern.strip_prefix('*').and_then(|p| p.strip_suffix('*')) {
        image.contains(inner)
    } else if let Some(prefix) = pattern.strip_suffix('*') {
        image.starts_with(prefix)
    } else {
        pattern == image
    }
}

impl PinBackend for CrioPins {
    fn name(&self) -> &'static str {
        "crio"
    }

    async fn apply(
        &self,
        images: &BTreeSet<String>,
        runtime_pinned: &HashSet<String>,
    ) -> Result<PinChange, PinError> {
        let path = self.path();
        let file_err = |action, source| PinError::File {
            path: path.clone(),
            action,
            source,
        };
        let old = match input::text(&path, input::CONFIG) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(file_err("read", e)),
        };
        let drift = self.drift(old.as_deref());
        let new = (!images.is_empty()).then(|| render(images));
        // The file as it was: parsed only when it differs (50 000 pins make a 5 MB file).
        let before: BTreeSet<String> = if old == new {
            images.clone()
        } else {
            old.as_deref()
                .and_then(|s| parse(s).ok())
                .unwrap_or_default()
                .into_iter()
                .collect()
        };
        // The file is right but CRI-O lost pins (reloaded or restarted without them): reload.
        let lost = images.iter().any(|i| !runtime_pinned.contains(i));
        let applied = old != new || lost;
        if old != new {
            match &new {
                None => std::fs::remove_file(&path).map_err(|e| file_err("remove", e))?,
                Some(content) => {
                    std::fs::create_dir_all(&self.dir)
                        .map_err(|e| file_err("create directory", e))?;
                    write_atomic(&path, content.as_bytes()).map_err(|e| file_err("write", e))?;
                }
            }
        }
        if applied {
            tracing::info!(path = %path.display(), pinned = images.len(), "pin drop-in written; reloading CRI-O");
            self.reload().await?;
        }
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(new);
        Ok(PinChange {
            pinned: images.difference(&before).cloned().collect(),
            unpinned: before.difference(images).cloned().collect(),
            applied,
            drift,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    /// The runtime reports exactly `images` pinned.
    fn reported(images: &BTreeSet<String>) -> HashSet<String> {
        images.iter().cloned().collect()
    }

    /// A reload command that appends a line to a log, so tests can count reloads.
    fn recorder(dir: &Path) -> (Reload, PathBuf) {
        let log = dir.join("reloads.log");
        (
            Reload::Command(vec![
                "sh".into(),
                "-c".into(),
                format!("echo reload >> {}", log.display()),
            ]),
            log,
        )
    }

    fn reloads(log: &Path) -> usize {
        std::fs::read_to_string(log)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn writes_sorted_toml_only_on_change_and_removes_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let (cmd, log) = recorder(dir.path());
        let pins = CrioPins::new(dir.path().join("crio.conf.d"), cmd);
        let c = pins
            .apply(
                &set(&["q.io/b@sha256:2", "q.io/a@sha256:1"]),
                &HashSet::new(),
            )
            .await
            .unwrap();
        assert!(c.applied);
        assert_eq!(c.pinned, vec!["q.io/a@sha256:1", "q.io/b@sha256:2"]);
        let text = std::fs::read_to_string(pins.path()).unwrap();
        assert_eq!(
            parse(&text).unwrap(),
            vec!["q.io/a@sha256:1", "q.io/b@sha256:2"]
        );
        assert_eq!(reloads(&log), 1);

        let both = set(&["q.io/a@sha256:1", "q.io/b@sha256:2"]);
        let again = pins.apply(&both, &reported(&both)).await.unwrap();
        assert!(!again.applied, "unchanged content is not rewritten");
        assert_eq!(reloads(&log), 1, "and CRI-O is not reloaded");

        let shrink = pins
            .apply(&set(&["q.io/b@sha256:2"]), &reported(&both))
            .await
            .unwrap();
        assert_eq!(shrink.unpinned, vec!["q.io/a@sha256:1"]);
        assert_eq!(reloads(&log), 2);

        let empty = pins.apply(&BTreeSet::new(), &HashSet::new()).await.unwrap();
        assert!(empty.applied && !pins.path().exists());
        assert_eq!(reloads(&log), 3);
        let none = pins.apply(&BTreeSet::new(), &HashSet::new()).await.unwrap();
        assert!(!none.applied && none.drift.is_empty());
        assert_eq!(reloads(&log), 3);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("crio.conf.d"))
            .unwrap()
            .collect();
        assert!(leftovers.is_empty(), "no temporary file left behind");
    }

    #[tokio::test]
    async fn a_failing_reload_is_an_error_that_names_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let pins = CrioPins::new(
            dir.path(),
            Reload::Command(vec![
                "sh".into(),
                "-c".into(),
                "echo nope >&2; exit 3".into(),
            ]),
        );
        let e = pins
            .apply(&set(&["q.io/a@sha256:1"]), &HashSet::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("reloading CRI-O (command") && e.contains("nope"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_drop_in_changed_behind_pinsets_back_is_rewritten_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (cmd, log) = recorder(dir.path());
        let pins = CrioPins::new(dir.path().join("crio.conf.d"), cmd);
        let images = set(&["q.io/a@sha256:1", "q.io/b@sha256:2"]);
        let first = pins.apply(&images, &HashSet::new()).await.unwrap();
        assert!(first.applied && first.drift.is_empty(), "{first:?}");
        let written = std::fs::read_to_string(pins.path()).unwrap();

        std::fs::remove_file(pins.path()).unwrap();
        let c = pins.apply(&images, &reported(&images)).await.unwrap();
        assert_eq!(c.drift.len(), 1, "{c:?}");
        assert_eq!(c.drift[0].kind, DriftKind::DropInDeleted);
        assert!(c.applied && std::fs::read_to_string(pins.path()).unwrap() == written);

        std::fs::write(
            pins.path(),
            "[crio.image]\npinned_images = [\"q.io/a@sha256:1\"]\n",
        )
        .unwrap();
        let c = pins.apply(&images, &reported(&images)).await.unwrap();
        assert_eq!(c.drift[0].kind, DriftKind::DropInEdited);
        assert!(c.drift[0].object.ends_with(DROP_IN), "{c:?}");
        assert_eq!(std::fs::read_to_string(pins.path()).unwrap(), written);
        assert_eq!(reloads(&log), 3);

        // The file is right, but CRI-O reports an image not pinned (reloaded without it):
        // reloaded again, nothing to report about the file.
        let c = pins
            .apply(&images, &reported(&set(&["q.io/a@sha256:1"])))
            .await
            .unwrap();
        assert!(c.applied && c.drift.is_empty(), "{c:?}");
        assert_eq!(reloads(&log), 4);
        let c = pins.apply(&images, &reported(&images)).await.unwrap();
        assert!(!c.applied, "{c:?}");
        assert_eq!(reloads(&log), 4);
    }

    #[test]
    fn rendering_escapes_and_round_trips() {
        let odd = set(&["q.io/a@sha256:1", "we\"ird\\name"]);
        assert_eq!(
            parse(&render(&odd)).unwrap(),
            odd.into_iter().collect::<Vec<_>>()
        );
    }

    #[test]
    fn crash_mid_write_leaves_the_old_file() {
        // Simulate a crash after the temporary file was written but before the rename: the
        // drop-in still holds the old content, and readers never see the partial one.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DROP_IN);
        write_atomic(&path, render(&set(&["old@sha256:1"])).as_bytes()).unwrap();
        std::fs::write(
            dir.path().join(format!(".{DROP_IN}.tmp-999")),
            "[crio.image]\npinned_images = [\n  \"new",
        )
        .unwrap();
        assert_eq!(
            parse(&std::fs::read_to_string(&path).unwrap()).unwrap(),
            vec!["old@sha256:1"]
        );
        write_atomic(&path, render(&set(&["new@sha256:2"])).as_bytes()).unwrap();
        assert_eq!(
            parse(&std::fs::read_to_string(&path).unwrap()).unwrap(),
            vec!["new@sha256:2"]
        );
    }

    #[test]
    fn crio_patterns() {
        assert!(pattern_matches("q.io/a@sha256:1", "q.io/a@sha256:1"));
        assert!(pattern_matches("q.io/*", "q.io/a@sha256:1"));
        assert!(pattern_matches(
            "*art-dev*",
            "quay.io/ocp-v4.0-art-dev@sha256:1"
        ));
        assert!(!pattern_matches("q.io/a", "q.io/a@sha256:1"));
    }
}
