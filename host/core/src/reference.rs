//! Image references. pinset pins by digest only: `host[:port]/path@sha256:<64 lowercase hex>`.

use std::fmt;

/// Longest reference accepted (as the PinnedImageSet API allows).
pub const MAX_LEN: usize = 447;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("{0:?} has a tag but no digest: pin images by digest (name@sha256:<64 hex digits>)")]
    Tag(String),
    #[error("{0:?} has no digest: pin images by digest (name@sha256:<64 hex digits>)")]
    NoDigest(String),
    #[error("{0:?}: the digest must be sha256:<64 lowercase hex digits>")]
    BadDigest(String),
    #[error("{0:?}: the name before @ is not a valid repository")]
    BadName(String),
    #[error("reference of {0} characters is longer than {MAX_LEN}")]
    TooLong(usize),
}

/// A validated digest reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageRef {
    full: String,
    /// Length of `host[:port]` (0 when the name has no registry host).
    host_len: usize,
    /// Byte offset of `@`.
    at: usize,
}

/// `host[:port]`: letters, digits, '.' and '-', and a port of digits when there is a ':'.
fn host_ok(first: &str) -> bool {
    let (host, port) = first.split_once(':').unwrap_or((first, ""));
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-".contains(&b));
    let port_ok =
        !first.contains(':') || (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

impl ImageRef {
    pub fn parse(s: &str) -> Result<Self, RefError> {
        if s.len() > MAX_LEN {
            return Err(RefError::TooLong(s.len()));
        }
        let Some(at) = s.find('@') else {
            let last = s.rsplit('/').next().unwrap_or(s);
            return Err(if last.contains(':') {
                RefError::Tag(s.into())
            } else {
                RefError::NoDigest(s.into())
            });
        };
        let (name, digest) = (&s[..at], &s[at + 1..]);
        let hex = digest
            .strip_prefix("sha256:")
            .ok_or_else(|| RefError::BadDigest(s.into()))?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(RefError::BadDigest(s.into()));
        }
        let components: Vec<&str> = name.split('/').collect();
        let valid_component = |c: &str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        };
        let first = components[0];
        let has_host = components.len() > 1
            && (first.contains('.') || first.contains(':') || first == "localhost");
        if has_host && !host_ok(first) {
            return Err(RefError::BadName(s.into()));
        }
        let path = if has_host {
            &components[1..]
        } else {
            &components[..]
        };
        if path.is_empty() || !path.iter().all(|c| valid_component(c)) {
            // A tag before the digest (`name:tag@sha256:…`) lands here too.
            return Err(if path.last().is_some_and(|c| c.contains(':')) {
                RefError::Tag(s.into())
            } else {
                RefError::BadName(s.into())
            });
        }
        Ok(Self {
            full: s.into(),
            host_len: if has_host { first.len() } else { 0 },
            at,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The registry host (with port) credentials are looked up by; `docker.io` when the name
    /// has none.
    pub fn registry(&self) -> &str {
        if self.host_len == 0 {
            "docker.io"
        } else {
            &self.full[..self.host_len]
        }
    }

    /// The repository path without the registry host.
    pub fn repository(&self) -> &str {
        let start = if self.host_len == 0 {
            0
        } else {
            self.host_len + 1
        };
        &self.full[start..self.at]
    }

    /// `sha256:<hex>`.
    pub fn digest(&self) -> &str {
        &self.full[self.at + 1..]
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    #[test]
    fn parses_digest_references() {
        let r = ImageRef::parse(&format!(
            "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:{D}"
        ))
        .unwrap();
        assert_eq!(r.registry(), "quay.io");
        assert_eq!(r.repository(), "openshift-release-dev/ocp-v4.0-art-dev");
        assert_eq!(r.digest(), format!("sha256:{D}"));
        let local = ImageRef::parse(&format!("127.0.0.1:5000/pinset/a@sha256:{D}")).unwrap();
        assert_eq!(local.registry(), "127.0.0.1:5000");
        assert_eq!(local.repository(), "pinset/a");
        let hub = ImageRef::parse(&format!("library/busybox@sha256:{D}")).unwrap();
        assert_eq!(
            (hub.registry(), hub.repository()),
            ("docker.io", "library/busybox")
        );
    }

    #[test]
    fn refuses_tags_and_bad_digests_with_a_clear_error() {
        assert!(matches!(
            ImageRef::parse("quay.io/a/b:latest"),
            Err(RefError::Tag(_))
        ));
        assert!(matches!(
            ImageRef::parse(&format!("quay.io/a/b:1.0@sha256:{D}")),
            Err(RefError::Tag(_))
        ));
        assert!(
            ImageRef::parse("quay.io/a/b:latest")
                .unwrap_err()
                .to_string()
                .contains("by digest")
        );
        assert!(matches!(
            ImageRef::parse("quay.io/a/b"),
            Err(RefError::NoDigest(_))
        ));
        assert!(matches!(
            ImageRef::parse("quay.io/a/b@sha256:abc"),
            Err(RefError::BadDigest(_))
        ));
        assert!(matches!(
            ImageRef::parse(&format!("quay.io/a/b@sha256:{}", D.to_uppercase())),
            Err(RefError::BadDigest(_))
        ));
        assert!(matches!(
            ImageRef::parse(&format!("quay.io/A/b@sha256:{D}")),
            Err(RefError::BadName(_))
        ));
        assert!(matches!(
            ImageRef::parse(&format!("@sha256:{D}")),
            Err(RefError::BadName(_))
        ));
        assert!(matches!(
            ImageRef::parse(&format!("q.io:x/a@sha256:{D}")),
            Err(RefError::BadName(_))
        ));
        let long = format!("quay.io/{}@sha256:{D}", "a".repeat(400));
        assert!(matches!(ImageRef::parse(&long), Err(RefError::TooLong(_))));
    }
}
