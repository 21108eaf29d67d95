//! containerd's registry hosts (`config_path`, docs/hosts.md): `DIR/<host[:port]>/hosts.toml`,
//! else `DIR/_default/hosts.toml`. A file lists `[host."URL"]` endpoints in order, then the
//! `server` (default: the registry itself); `capabilities` (`pull`, `resolve`, `push`) filter
//! them — a digest needs `pull`, a tag `pull` and `resolve`; `override_path` keeps a URL's
//! path as the API's base; `skip_verify` and `ca` set how TLS is checked. Requests to a host
//! other than the server carry `?ns=REGISTRY`, as containerd's do.

use super::{Endpoint, MirrorError, Scheme, Target, Tls, api_host};
use pinset_core::input;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toml::Spanned;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub pull: bool,
    pub resolve: bool,
}

/// One endpoint of a `hosts.toml`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    pub scheme: Scheme,
    pub host: String,
    pub path: String,
    pub capabilities: Capabilities,
    pub tls: Tls,
}

/// One `hosts.toml`: its `[host]` endpoints in file order and its server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostsFile {
    pub file: PathBuf,
    pub hosts: Vec<Host>,
    /// `None`: the registry's own (`https://HOST/v2`).
    pub server: Option<Host>,
    /// The top level's capabilities and TLS, which apply to the server.
    pub server_capabilities: Capabilities,
    pub server_tls: Tls,
}

/// A `config_path` directory, every registry's file read.
#[derive(Clone, Debug, Default)]
pub struct HostsDir {
    pub dir: PathBuf,
    /// By directory name (`host[:port]` or `_default`).
    pub registries: BTreeMap<String, HostsFile>,
}

#[derive(Deserialize)]
struct HostToml {
    server: Option<String>,
    capabilities: Option<Vec<String>>,
    #[serde(default)]
    skip_verify: bool,
    ca: Option<OneOrMany>,
    #[serde(default)]
    override_path: bool,
    #[serde(default)]
    host: BTreeMap<String, Spanned<HostToml>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl HostsDir {
    /// Every `*/hosts.toml` under `dir`; a missing directory is no configuration.
    pub fn load(dir: &Path) -> Result<HostsDir, MirrorError> {
        let mut out = HostsDir {
            dir: dir.to_path_buf(),
            registries: BTreeMap::new(),
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(MirrorError::read(dir, &e)),
        };
        // Directories only, as containerd looks: other files there are not registries.
        for entry in entries.filter_map(Result::ok).filter(|e| e.path().is_dir()) {
            let file = entry.path().join("hosts.toml");
            let text = match input::text(&file, input::CONFIG) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(MirrorError::read(&file, &e)),
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            out.registries.insert(name, parse(&file, &text)?);
        }
        Ok(out)
    }

    pub fn files(&self) -> Vec<PathBuf> {
        self.registries.values().map(|f| f.file.clone()).collect()
    }

    /// The registry's file (else `_default`'s) endpoints that can serve the target, in order.
    pub fn endpoints(&self, target: &Target) -> Vec<Endpoint> {
        let Some(file) = self
            .registries
            .get(&target.registry)
            .or_else(|| self.registries.get("_default"))
        else {
            return vec![Endpoint::source(&target.registry, &target.repository)];
        };
        let needs = |c: &Capabilities| c.pull && (target.by_digest() || c.resolve);
        let server = file.server.clone().unwrap_or_else(|| Host {
            scheme: Scheme::Https,
            host: api_host(&target.registry).to_string(),
            path: "/v2".into(),
            capabilities: file.server_capabilities,
            tls: file.server_tls.clone(),
        });
        let mirrors = file.hosts.iter().map(|h| (h, true));
        mirrors
            .chain(std::iter::once((&server, false)))
            .filter(|(h, _)| needs(&h.capabilities))
            .map(|(h, mirror)| Endpoint {
                scheme: h.scheme,
                host: h.host.clone(),
                path: h.path.clone(),
                repository: target.repository.clone(),
                tls: h.tls.clone(),
                mirror,
                auth_host: if mirror {
                    h.host.clone()
                } else {
                    target.registry.clone()
                },
                ns: mirror.then(|| target.registry.clone()),
            })
            .collect()
    }
}

/// One `hosts.toml`.
pub fn parse(file: &Path, text: &str) -> Result<HostsFile, MirrorError> {
    let top: HostToml = toml::from_str(text).map_err(|e| MirrorError::toml(file, text, &e))?;
    let dir = file.parent().unwrap_or(Path::new("/"));
    let at = |offset: usize, why: String| MirrorError::at(file, text, Some(offset), why);
    let line_of_key = |needle: &str| text.find(needle).unwrap_or(0);
    let server_capabilities = capabilities(top.capabilities.as_deref())
        .map_err(|w| at(line_of_key("capabilities"), w))?;
    let server_tls = tls(top.skip_verify, top.ca.as_ref(), dir);
    let server = match &top.server {
        Some(url) => Some(
            host(
                url,
                top.override_path,
                server_capabilities,
                server_tls.clone(),
            )
            .map_err(|w| at(line_of_key("server"), w))?,
        ),
        None => None,
    };
    let mut hosts: Vec<(usize, Host)> = Vec::new();
    for (url, entry) in &top.host {
        let offset = entry.span().start;
        let h = entry.get_ref();
        let caps = capabilities(h.capabilities.as_deref()).map_err(|w| at(offset, w))?;
        let tls = tls(h.skip_verify, h.ca.as_ref(), dir);
        hosts.push((
            offset,
            host(url, h.override_path, caps, tls).map_err(|w| at(offset, w))?,
        ));
    }
    // In the file's order, which is the order containerd tries them in.
    hosts.sort_by_key(|(offset, _)| *offset);
    Ok(HostsFile {
        file: file.to_path_buf(),
        hosts: hosts.into_iter().map(|(_, h)| h).collect(),
        server,
        server_capabilities,
        server_tls,
    })
}

/// `pull`, `resolve`, `push`; all when not said.
fn capabilities(list: Option<&[String]>) -> Result<Capabilities, String> {
    let Some(list) = list else {
        return Ok(Capabilities {
            pull: true,
            resolve: true,
        });
    };
    let mut caps = Capabilities::default();
    for c in list {
        match c.as_str() {
            "pull" => caps.pull = true,
            "resolve" => caps.resolve = true,
            "push" => {}
            other => {
                return Err(format!(
                    "capability {other:?}: expected pull, resolve or push"
                ));
            }
        }
    }
    Ok(caps)
}

fn tls(skip_verify: bool, ca: Option<&OneOrMany>, dir: &Path) -> Tls {
    let files = match ca {
        None => Vec::new(),
        Some(OneOrMany::One(f)) => vec![f.clone()],
        Some(OneOrMany::Many(fs)) => fs.clone(),
    };
    Tls {
        skip_verify,
        // Relative paths are the host directory's.
        ca: files.into_iter().map(|f| dir.join(f)).collect(),
    }
}

/// An endpoint URL: `[scheme://]host[:port][/path]` (HTTPS when no scheme is given); the path
/// gets `/v2` appended unless `override_path`.
fn host(
    url: &str,
    override_path: bool,
    capabilities: Capabilities,
    tls: Tls,
) -> Result<Host, String> {
    let (scheme, rest) = match url.split_once("://") {
        Some(("http", rest)) => (Scheme::Http, rest),
        Some(("https", rest)) => (Scheme::Https, rest),
        Some((other, _)) => return Err(format!("{url:?}: scheme {other:?} is not http or https")),
        None => (Scheme::Https, url),
    };
    let (host, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], rest[slash..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(format!("{url:?}: no host"));
    }
    let path = if override_path || path.ends_with("/v2") {
        path.to_string()
    } else {
        format!("{path}/v2")
    };
    Ok(Host {
        scheme,
        host: host.to_string(),
        path,
        capabilities,
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    fn target(registry: &str, reference: &str) -> Target {
        Target {
            registry: registry.into(),
            repository: "team/app".into(),
            reference: reference.into(),
        }
    }

    fn dir(files: &[(&str, &str)]) -> HostsDir {
        let mut d = HostsDir::default();
        for (name, text) in files {
            let file = PathBuf::from(format!("/etc/containerd/certs.d/{name}/hosts.toml"));
            d.registries
                .insert(name.to_string(), parse(&file, text).unwrap());
        }
        d
    }

    fn urls(d: &HostsDir, t: &Target) -> Vec<String> {
        d.endpoints(t)
            .iter()
            .map(|e| {
                e.manifest_url(
                    if e.scheme == Scheme::Http {
                        "http"
                    } else {
                        "https"
                    },
                    "R",
                )
            })
            .collect()
    }

    #[test]
    fn hosts_come_in_file_order_then_the_server_filtered_by_capability() {
        let d = dir(&[(
            "quay.io",
            r#"
server = "https://quay.io"

[host."https://zz-first.local:5000"]
  capabilities = ["pull", "resolve"]
  ca = "ca.pem"

[host."http://aa-second.local/v2/quay"]
  capabilities = ["pull"]
  override_path = true
  skip_verify = true
"#,
        )]);
        assert_eq!(
            urls(&d, &target("quay.io", D)),
            [
                "https://zz-first.local:5000/v2/team/app/manifests/R?ns=quay.io",
                "http://aa-second.local/v2/quay/team/app/manifests/R?ns=quay.io",
                "https://quay.io/v2/team/app/manifests/R",
            ]
        );
        assert_eq!(
            urls(&d, &target("quay.io", "v1")),
            [
                "https://zz-first.local:5000/v2/team/app/manifests/R?ns=quay.io",
                "https://quay.io/v2/team/app/manifests/R",
            ],
            "a tag needs resolve"
        );
        let e = d.endpoints(&target("quay.io", D));
        assert_eq!(
            e[0].tls.ca,
            [PathBuf::from("/etc/containerd/certs.d/quay.io/ca.pem")]
        );
        assert!(e[1].tls.skip_verify && e[1].mirror && !e[2].mirror);
        assert_eq!(
            (e[1].auth_host.as_str(), e[2].auth_host.as_str()),
            ("aa-second.local", "quay.io")
        );
        assert_eq!(e[1].name(), "aa-second.local/v2/quay/team/app");
    }

    #[test]
    fn without_a_file_or_server_the_registry_itself_is_the_server() {
        let d = dir(&[("_default", "[host.\"https://cache.local\"]\n")]);
        assert_eq!(
            urls(&d, &target("docker.io", D)),
            [
                "https://cache.local/v2/team/app/manifests/R?ns=docker.io",
                "https://registry-1.docker.io/v2/team/app/manifests/R",
            ]
        );
        assert_eq!(
            urls(&HostsDir::default(), &target("r.example", D)),
            ["https://r.example/v2/team/app/manifests/R"]
        );
        // A server without pull is never asked.
        let d = dir(&[(
            "r.example",
            "capabilities = []\n[host.\"http://m.local:5000\"]\n",
        )]);
        assert_eq!(
            urls(&d, &target("r.example", D)),
            ["http://m.local:5000/v2/team/app/manifests/R?ns=r.example"]
        );
    }

    #[test]
    fn bad_files_are_refused_at_their_line() {
        for (text, line, why) in [
            (
                "server = \"https://a\"\n\n[host.\"https://m\"]\n  capabilities = [\"pull\", \"fly\"]\n",
                3,
                "capability \"fly\"",
            ),
            ("server = \"ftp://a\"\n", 1, "scheme \"ftp\""),
            ("server = 5\n", 1, "invalid type"),
            ("[host.\"https://m\"\n", 1, ""),
        ] {
            let file = Path::new("/etc/containerd/certs.d/a/hosts.toml");
            let e = parse(file, text).unwrap_err();
            assert_eq!(e.line, Some(line), "{text}: {e}");
            assert!(e.why.contains(why), "{text}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("{}:{line}: ", file.display())),
                "{e}"
            );
        }
    }

    #[test]
    fn a_directory_is_read_as_containerd_reads_it() {
        let root = tempfile::tempdir().unwrap();
        assert!(
            HostsDir::load(&root.path().join("none"))
                .unwrap()
                .registries
                .is_empty()
        );
        let host = root.path().join("127.0.0.1:5000");
        std::fs::create_dir(&host).unwrap();
        std::fs::write(
            host.join("hosts.toml"),
            "server = \"http://127.0.0.1:5000\"\n",
        )
        .unwrap();
        std::fs::create_dir(root.path().join("empty")).unwrap();
        std::fs::write(root.path().join("README"), "not a registry").unwrap();
        let d = HostsDir::load(root.path()).unwrap();
        assert_eq!(d.registries.len(), 1);
        assert_eq!(
            urls(&d, &target("127.0.0.1:5000", D)),
            ["http://127.0.0.1:5000/v2/team/app/manifests/R"]
        );
    }
}
