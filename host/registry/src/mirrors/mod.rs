//! The node's registry mirrors, read as its runtime reads them: CRI-O's `registries.conf` (v2,
//! with its `registries.conf.d` drop-ins) or containerd's `certs.d/<host>/hosts.toml`. pinset's
//! pulls go through the CRI, which applies them; pinset's own registry requests (sizing,
//! resolving tags) ask [`Mirrors::endpoints`] for the same endpoints in the same order.
//!
//! Reading is pure apart from the files: no request is made here.

pub mod hosts_toml;
pub mod registries_conf;

use std::path::{Path, PathBuf};

/// How an endpoint is spoken to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    Https,
    Http,
    /// `registries.conf` `insecure = true`: HTTPS without verifying the certificate, and plain
    /// HTTP when the endpoint does not speak TLS (as CRI-O does).
    HttpsThenHttp,
}

/// How the TLS certificate of an endpoint is checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tls {
    /// Accept any certificate (`skip_verify`, `insecure`).
    pub skip_verify: bool,
    /// Extra CA certificates (PEM files) to trust (`hosts.toml` `ca`).
    pub ca: Vec<PathBuf>,
}

/// One place an image can be asked for: a mirror or the image's own registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub scheme: Scheme,
    /// `host[:port]` dialled.
    pub host: String,
    /// The API's base path on that host: `/v2`, or a mirror's own (`override_path`).
    pub path: String,
    /// The repository at this endpoint (a mirror may serve it under another path).
    pub repository: String,
    pub tls: Tls,
    /// A mirror (`false`: the image's own registry).
    pub mirror: bool,
    /// The registry name credentials are looked up by (the source's name for the source).
    pub auth_host: String,
    /// The source registry, told to a containerd mirror as `?ns=REGISTRY` (as containerd does,
    /// so that one mirror can serve several registries).
    pub ns: Option<String>,
}

impl Endpoint {
    /// The image's own registry, with no configuration: HTTPS, `/v2`, Docker Hub's API host for
    /// `docker.io`.
    pub fn source(registry: &str, repository: &str) -> Endpoint {
        Endpoint {
            scheme: Scheme::Https,
            host: api_host(registry).to_string(),
            path: "/v2".into(),
            repository: repository.to_string(),
            tls: Tls::default(),
            mirror: false,
            auth_host: registry.to_string(),
            ns: None,
        }
    }

    /// The URL of `tail` (`manifests/REF`, `blobs/DIGEST`, `blobs/uploads/`) under this
    /// endpoint's repository over `scheme`.
    pub fn url(&self, scheme: &str, tail: &str) -> String {
        let query = self
            .ns
            .as_ref()
            .map(|ns| format!("?ns={ns}"))
            .unwrap_or_default();
        format!(
            "{scheme}://{}{}/{}/{tail}{query}",
            self.host, self.path, self.repository
        )
    }

    /// The URL of a manifest (`reference`: a digest or a tag) at this endpoint over `scheme`.
    pub fn manifest_url(&self, scheme: &str, reference: &str) -> String {
        self.url(scheme, &format!("manifests/{reference}"))
    }

    /// `host[/path]/repository`: what reports say an image was sized by.
    pub fn name(&self) -> String {
        let path = self.path.strip_suffix("/v2").unwrap_or(&self.path);
        format!("{}{path}/{}", self.host, self.repository)
    }
}

/// The host Docker Hub's API answers on; every other registry answers on its own name.
pub fn api_host(registry: &str) -> &str {
    match registry {
        "docker.io" | "index.docker.io" => "registry-1.docker.io",
        other => other,
    }
}

/// The repository as registries spell it: Docker Hub's one-component names live under `library/`.
pub fn canonical_repository(registry: &str, repository: &str) -> String {
    if registry == "docker.io" && !repository.contains('/') {
        format!("library/{repository}")
    } else {
        repository.to_string()
    }
}

/// What an image is asked for by: its registry, repository, and a digest or a tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub registry: String,
    /// Canonical ([`canonical_repository`]).
    pub repository: String,
    /// `sha256:…` or a tag.
    pub reference: String,
}

impl Target {
    pub fn by_digest(&self) -> bool {
        self.reference.starts_with("sha256:")
    }

    /// `registry/repository@digest` or `registry/repository:tag`.
    pub fn full(&self) -> String {
        let sep = if self.by_digest() { '@' } else { ':' };
        format!(
            "{}/{}{sep}{}",
            self.registry, self.repository, self.reference
        )
    }
}

impl Target {
    /// An image as people write it: `[host[:port]/]path[:tag|@sha256:…]` (`latest` when neither
    /// is given; Docker Hub when no host is).
    pub fn parse(text: &str) -> Result<Target, String> {
        let bad = |why: &str| format!("{text:?}: {why}");
        let (name, reference) = match text.split_once('@') {
            Some((name, digest)) => {
                pinset_core::reference::ImageRef::parse(text).map_err(|e| e.to_string())?;
                (name, digest.to_string())
            }
            None => match text.rfind(':').filter(|&c| !text[c..].contains('/')) {
                Some(colon) => (&text[..colon], text[colon + 1..].to_string()),
                None => (text, "latest".to_string()),
            },
        };
        let tag_ok = |t: &str| {
            !t.is_empty()
                && t.len() <= 128
                && !t.starts_with(['.', '-'])
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        };
        if !reference.starts_with("sha256:") && !tag_ok(&reference) {
            return Err(bad("the tag is not valid"));
        }
        let parts: Vec<&str> = name.split('/').collect();
        let first = parts[0];
        let has_host =
            parts.len() > 1 && (first.contains('.') || first.contains(':') || first == "localhost");
        let (registry, path) = match has_host {
            true => (first, &parts[1..]),
            false => ("docker.io", &parts[..]),
        };
        let component_ok = |c: &&str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        };
        if path.is_empty() || !path.iter().all(component_ok) || registry.is_empty() {
            return Err(bad("not an image name"));
        }
        Ok(Target {
            registry: registry.to_string(),
            repository: canonical_repository(registry, &path.join("/")),
            reference,
        })
    }
}

impl From<&pinset_core::reference::ImageRef> for Target {
    fn from(image: &pinset_core::reference::ImageRef) -> Target {
        Target {
            registry: image.registry().to_string(),
            repository: canonical_repository(image.registry(), image.repository()),
            reference: image.digest().to_string(),
        }
    }
}

/// A file of the mirror configuration that cannot be used, at FILE:LINE where a line is known.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {why}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct MirrorError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub why: String,
}

impl MirrorError {
    pub(crate) fn at(file: &Path, text: &str, offset: Option<usize>, why: String) -> MirrorError {
        MirrorError {
            file: file.to_path_buf(),
            line: offset.map(|o| line_of(text, o)),
            why,
        }
    }

    /// A TOML syntax or type error, at its line, in the parser's words (its first line: the
    /// rest is a drawing of the line).
    pub(crate) fn toml(file: &Path, text: &str, e: &toml::de::Error) -> MirrorError {
        let why = e.message().lines().next().unwrap_or("not TOML").to_string();
        Self::at(file, text, e.span().map(|s| s.start), why)
    }

    pub(crate) fn read(file: &Path, e: &std::io::Error) -> MirrorError {
        MirrorError {
            file: file.to_path_buf(),
            line: None,
            why: format!("cannot read: {e}"),
        }
    }
}

/// The 1-based line of byte `offset` in `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The mirror configuration in force on a node.
#[derive(Clone, Debug, Default)]
pub enum Mirrors {
    /// Every image from its own registry.
    #[default]
    None,
    /// CRI-O's (containers') `registries.conf` and drop-ins.
    Registries(registries_conf::RegistriesConf),
    /// containerd's `hosts.toml` directory.
    Hosts(hosts_toml::HostsDir),
}

impl Mirrors {
    /// The endpoints to ask for `target`, in the runtime's order: mirrors first, then the image's
    /// own registry unless it is blocked (the list is then empty when no mirror may serve it).
    pub fn endpoints(&self, target: &Target) -> Vec<Endpoint> {
        match self {
            Mirrors::None => vec![Endpoint::source(&target.registry, &target.repository)],
            Mirrors::Registries(conf) => conf.endpoints(target),
            Mirrors::Hosts(dir) => dir.endpoints(target),
        }
    }

    /// The files this configuration was read from (for reports).
    pub fn files(&self) -> Vec<PathBuf> {
        match self {
            Mirrors::None => Vec::new(),
            Mirrors::Registries(conf) => conf.files.clone(),
            Mirrors::Hosts(dir) => dir.files(),
        }
    }
}

/// Where a node's mirror configuration is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MirrorSource {
    None,
    /// `registries.conf` and the drop-in directory beside it (`FILE.d`).
    RegistriesConf(PathBuf),
    /// A containerd `config_path` directory.
    HostsDir(PathBuf),
}

/// CRI-O's and the containers tools' file (`CONTAINERS_REGISTRIES_CONF` overrides it).
pub const REGISTRIES_CONF: &str = "/etc/containers/registries.conf";
/// containerd's customary `config_path` (2.x's default; 1.7 has none unless configured).
pub const CONTAINERD_HOSTS_DIR: &str = "/etc/containerd/certs.d";

impl MirrorSource {
    /// Read the configuration. A missing file or directory means no mirrors, as for the runtime.
    pub fn load(&self) -> Result<Mirrors, MirrorError> {
        match self {
            MirrorSource::None => Ok(Mirrors::None),
            MirrorSource::RegistriesConf(file) => {
                registries_conf::RegistriesConf::load(file).map(Mirrors::Registries)
            }
            MirrorSource::HostsDir(dir) => hosts_toml::HostsDir::load(dir).map(Mirrors::Hosts),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            MirrorSource::None => "no mirror configuration".into(),
            MirrorSource::RegistriesConf(f) => format!("registries.conf {}", f.display()),
            MirrorSource::HostsDir(d) => format!("containerd hosts directory {}", d.display()),
        }
    }
}

/// Split `host/repo…@digest` or `host/repo…:tag` (a rewritten reference) into a target. The
/// first component is always the host here: rewriting keeps a fully qualified name.
pub(crate) fn split_reference(full: &str) -> Option<(String, String, String)> {
    let (name, reference) = match full.split_once('@') {
        Some((name, digest)) => (name, digest.to_string()),
        None => {
            let slash = full.rfind('/')?;
            let colon = full[slash..].find(':')? + slash;
            (&full[..colon], full[colon + 1..].to_string())
        }
    };
    let (host, repository) = name.split_once('/')?;
    Some((host.to_string(), repository.to_string(), reference))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_as_people_write_them() {
        let t = Target::parse("busybox").unwrap();
        assert_eq!(t.full(), "docker.io/library/busybox:latest");
        let t = Target::parse("127.0.0.1:5000/team/app:v1.2").unwrap();
        assert_eq!(
            (
                t.registry.as_str(),
                t.repository.as_str(),
                t.reference.as_str()
            ),
            ("127.0.0.1:5000", "team/app", "v1.2")
        );
        let d = "sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";
        let t = Target::parse(&format!("quay.io/a/b@{d}")).unwrap();
        assert!(t.by_digest() && t.reference == d);
        assert_eq!(
            Target::parse("localhost:5000/a").unwrap().reference,
            "latest"
        );
        for bad in [
            "Team/App:v1",
            "quay.io/a:",
            "quay.io/a:-x",
            "quay.io/a@sha256:12",
            "quay.io//a",
            "",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines_count_from_one() {
        let text = "a\nb\nc";
        assert_eq!(line_of(text, 0), 1);
        assert_eq!(line_of(text, 2), 2);
        assert_eq!(line_of(text, 4), 3);
        assert_eq!(line_of(text, 99), 3);
    }

    #[test]
    fn references_split_into_host_repository_and_reference() {
        assert_eq!(
            split_reference("m.local:5000/a/b@sha256:00"),
            Some(("m.local:5000".into(), "a/b".into(), "sha256:00".into()))
        );
        assert_eq!(
            split_reference("m.local:5000/a/b:v1"),
            Some(("m.local:5000".into(), "a/b".into(), "v1".into()))
        );
        assert_eq!(split_reference("m.local:5000/a/b"), None);
    }

    #[test]
    fn docker_hub_names_are_canonical_and_dialled_on_its_api_host() {
        let e = Endpoint::source("docker.io", &canonical_repository("docker.io", "busybox"));
        assert_eq!(e.host, "registry-1.docker.io");
        assert_eq!(e.repository, "library/busybox");
        assert_eq!(e.auth_host, "docker.io");
        assert_eq!(e.name(), "registry-1.docker.io/library/busybox");
        assert_eq!(
            e.manifest_url("https", "sha256:00"),
            "https://registry-1.docker.io/v2/library/busybox/manifests/sha256:00"
        );
    }
}
