//! `registries.conf` (containers-registries.conf(5), version 2) and its drop-ins, as CRI-O reads
//! them: `[[registry]]` tables with `prefix`, `location`, `insecure`, `blocked`,
//! `mirror-by-digest-only` and `[[registry.mirror]]` (`location`, `insecure`, `pull-from-mirror`);
//! the longest matching prefix wins (`*.example.com` matches hosts under it); drop-ins
//! (`FILE.d/*.conf`, in name order) replace a registry of the same prefix and add the others.
//! The version 1 tables (`[registries.insecure]`, `[registries.block]`) are read too.

use super::{Endpoint, MirrorError, Scheme, Target, Tls, api_host, split_reference};
use pinset_core::input;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// When a mirror may serve an image (`pull-from-mirror`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullFrom {
    All,
    DigestOnly,
    TagOnly,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    pub location: String,
    pub insecure: bool,
    pub pull_from: PullFrom,
}

/// One `[[registry]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registry {
    pub prefix: String,
    /// Empty for a wildcard prefix without a location: the matched host itself.
    pub location: String,
    pub insecure: bool,
    pub blocked: bool,
    pub mirror_by_digest_only: bool,
    pub mirrors: Vec<Mirror>,
    /// FILE:LINE of its table.
    pub origin: String,
}

/// The registries of a `registries.conf` and its drop-ins, merged.
#[derive(Clone, Debug, Default)]
pub struct RegistriesConf {
    pub registries: Vec<Registry>,
    /// The files read, in order.
    pub files: Vec<PathBuf>,
}

#[derive(Deserialize)]
struct FileToml {
    #[serde(default)]
    registry: Vec<Spanned<RegistryToml>>,
    /// Version 1.
    registries: Option<V1Toml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RegistryToml {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    location: String,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    blocked: bool,
    #[serde(default)]
    mirror_by_digest_only: bool,
    #[serde(default)]
    mirror: Vec<Spanned<MirrorToml>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct MirrorToml {
    #[serde(default)]
    location: String,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    pull_from_mirror: String,
}

#[derive(Deserialize, Default)]
struct V1Toml {
    #[serde(default)]
    insecure: V1List,
    #[serde(default)]
    block: V1List,
}

#[derive(Deserialize, Default)]
struct V1List {
    #[serde(default)]
    registries: Vec<String>,
}

impl RegistriesConf {
    /// Read `file` and the drop-ins of `FILE.d`. A missing file or directory is no
    /// configuration, as for CRI-O.
    pub fn load(file: &Path) -> Result<RegistriesConf, MirrorError> {
        let mut conf = RegistriesConf::default();
        match input::text(file, input::CONFIG) {
            Ok(text) => conf.merge(file, &text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(MirrorError::read(file, &e)),
        }
        let mut dir = file.as_os_str().to_owned();
        dir.push(".d");
        for dropin in dropins(Path::new(&dir))? {
            let text =
                input::text(&dropin, input::CONFIG).map_err(|e| MirrorError::read(&dropin, &e))?;
            conf.merge(&dropin, &text)?;
        }
        Ok(conf)
    }

    /// Add the registries of one file: a prefix already known is replaced where it stood.
    pub fn merge(&mut self, file: &Path, text: &str) -> Result<(), MirrorError> {
        let parsed = parse(file, text)?;
        self.files.push(file.to_path_buf());
        for registry in parsed {
            match self
                .registries
                .iter_mut()
                .find(|r| r.prefix == registry.prefix)
            {
                Some(known) => *known = registry,
                None => self.registries.push(registry),
            }
        }
        Ok(())
    }

    /// The registry whose prefix matches `full` longest, and the length of `full` it matched.
    pub fn find(&self, full: &str) -> Option<(&Registry, usize)> {
        self.registries
            .iter()
            .filter_map(|r| matched(full, &r.prefix).map(|n| (r, n)))
            .max_by_key(|(r, _)| r.prefix.len())
    }

    /// Mirrors allowed for the target's kind of reference, in order, then the registry's own
    /// location unless it is blocked.
    pub fn endpoints(&self, target: &Target) -> Vec<Endpoint> {
        let full = target.full();
        let Some((registry, matched)) = self.find(&full) else {
            return vec![Endpoint::source(&target.registry, &target.repository)];
        };
        let by_digest = target.by_digest();
        let mut out = Vec::new();
        for mirror in &registry.mirrors {
            let allowed = match (by_digest, mirror.pull_from) {
                (true, PullFrom::TagOnly) => false,
                (false, _) if registry.mirror_by_digest_only => false,
                (false, PullFrom::DigestOnly) => false,
                _ => true,
            };
            if allowed {
                out.extend(rewrite(
                    &full,
                    matched,
                    &mirror.location,
                    mirror.insecure,
                    true,
                ));
            }
        }
        if !registry.blocked {
            let primary = rewrite(&full, matched, &registry.location, registry.insecure, false);
            out.extend(primary.map(|mut e| {
                e.auth_host = target.registry.clone();
                e
            }));
        }
        out
    }
}

/// The files of a drop-in directory, `*.conf` in name order; none when it does not exist.
fn dropins(dir: &Path) -> Result<Vec<PathBuf>, MirrorError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(MirrorError::read(dir, &e)),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// The length of `full` that `prefix` matches, if it does. A prefix matches the whole
/// reference or a part of it followed by `/`, `:` or `@`; `*.domain` matches the hosts under
/// `domain`. (As in CRI-O, `example.com` also matches `example.com:5000/…`.)
fn matched(full: &str, prefix: &str) -> Option<usize> {
    if let Some(domain) = prefix.strip_prefix("*.") {
        let host = full.split('/').next()?;
        let name = host.split(':').next()?;
        return name
            .strip_suffix(domain)
            .is_some_and(|sub| sub.ends_with('.') && sub.len() > 1)
            .then_some(host.len());
    }
    let rest = full.strip_prefix(prefix)?;
    (rest.is_empty() || rest.starts_with(['/', ':', '@'])).then_some(prefix.len())
}

/// The endpoint `location` gives for `full` with its first `matched` bytes replaced; the
/// reference itself when the location is empty (a wildcard without one).
fn rewrite(
    full: &str,
    matched: usize,
    location: &str,
    insecure: bool,
    mirror: bool,
) -> Option<Endpoint> {
    let rewritten = match location {
        "" => full.to_string(),
        _ => format!("{location}{}", &full[matched..]),
    };
    let (host, repository, _) = split_reference(&rewritten)?;
    Some(Endpoint {
        scheme: if insecure {
            Scheme::HttpsThenHttp
        } else {
            Scheme::Https
        },
        host: api_host(&host).to_string(),
        path: "/v2".into(),
        repository,
        tls: Tls {
            skip_verify: insecure,
            ca: Vec::new(),
        },
        mirror,
        auth_host: host,
        ns: None,
    })
}

/// One file's registries, validated as CRI-O validates them.
fn parse(file: &Path, text: &str) -> Result<Vec<Registry>, MirrorError> {
    let parsed: FileToml = toml::from_str(text).map_err(|e| MirrorError::toml(file, text, &e))?;
    let mut out: Vec<Registry> = Vec::new();
    for entry in parsed.registry {
        let at = entry.span().start;
        let registry = registry(file, text, at, entry.into_inner())?;
        if out.iter().any(|r| r.prefix == registry.prefix) {
            return Err(MirrorError::at(
                file,
                text,
                Some(at),
                format!("registry {:?} is defined twice", registry.prefix),
            ));
        }
        out.push(registry);
    }
    let v1 = parsed.registries.unwrap_or_default();
    let origin = format!("{}", file.display());
    for (list, blocked) in [(v1.insecure.registries, false), (v1.block.registries, true)] {
        for location in list {
            match out.iter_mut().find(|r| r.prefix == location) {
                Some(r) => (r.insecure, r.blocked) = (r.insecure || !blocked, r.blocked || blocked),
                None => out.push(Registry {
                    prefix: location.clone(),
                    location,
                    insecure: !blocked,
                    blocked,
                    mirror_by_digest_only: false,
                    mirrors: Vec::new(),
                    origin: origin.clone(),
                }),
            }
        }
    }
    Ok(out)
}

/// One `[[registry]]` table, checked.
fn registry(file: &Path, text: &str, at: usize, r: RegistryToml) -> Result<Registry, MirrorError> {
    let err = |offset: usize, why: String| MirrorError::at(file, text, Some(offset), why);
    let location = checked_location(&r.location).map_err(|why| err(at, why))?;
    let prefix = match r.prefix.trim_end_matches('/') {
        "" => location.clone(),
        p => p.to_string(),
    };
    if prefix.is_empty() {
        return Err(err(
            at,
            "a [[registry]] needs a prefix or a location".into(),
        ));
    }
    if prefix.contains("://") {
        return Err(err(at, format!("prefix {prefix:?}: no URI scheme here")));
    }
    if prefix.contains('*') && (!prefix.starts_with("*.") || prefix[1..].contains(['*', '/'])) {
        return Err(err(
            at,
            format!("prefix {prefix:?}: a wildcard is only allowed as *.domain"),
        ));
    }
    let by_digest_only = r.mirror_by_digest_only;
    let mirrors = r
        .mirror
        .into_iter()
        .map(|m| mirror(file, text, &prefix, by_digest_only, m))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Registry {
        origin: format!("{}:{}", file.display(), super::line_of(text, at)),
        prefix,
        location,
        insecure: r.insecure,
        blocked: r.blocked,
        mirror_by_digest_only: r.mirror_by_digest_only,
        mirrors,
    })
}

/// One `[[registry.mirror]]` of the registry `prefix`, checked.
fn mirror(
    file: &Path,
    text: &str,
    prefix: &str,
    by_digest_only: bool,
    m: Spanned<MirrorToml>,
) -> Result<Mirror, MirrorError> {
    let err = |offset: usize, why: String| MirrorError::at(file, text, Some(offset), why);
    let m_at = m.span().start;
    let m = m.into_inner();
    let pull_from = match m.pull_from_mirror.as_str() {
        "" | "all" => PullFrom::All,
        "digest-only" => PullFrom::DigestOnly,
        "tag-only" => PullFrom::TagOnly,
        other => {
            return Err(err(
                m_at,
                format!("pull-from-mirror {other:?}: expected all, digest-only or tag-only"),
            ));
        }
    };
    if by_digest_only && !m.pull_from_mirror.is_empty() {
        return Err(err(
            m_at,
            format!(
                "registry {prefix:?}: mirror-by-digest-only and a mirror's pull-from-mirror cannot both be set"
            ),
        ));
    }
    let location = checked_location(&m.location).map_err(|why| err(m_at, why))?;
    if location.is_empty() {
        return Err(err(
            m_at,
            format!("registry {prefix:?}: a mirror without a location"),
        ));
    }
    Ok(Mirror {
        location,
        insecure: m.insecure,
        pull_from,
    })
}

/// A location without its trailing `/`; a URI scheme is refused, as by CRI-O.
fn checked_location(text: &str) -> Result<String, String> {
    if text.contains("://") {
        return Err(format!(
            "location {text:?}: no URI scheme here (insecure = true for plain HTTP)"
        ));
    }
    Ok(text.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    fn conf(files: &[(&str, &str)]) -> Result<RegistriesConf, MirrorError> {
        let mut conf = RegistriesConf::default();
        for (name, text) in files {
            conf.merge(Path::new(name), text)?;
        }
        Ok(conf)
    }

    fn target(registry: &str, repository: &str, reference: &str) -> Target {
        Target {
            registry: registry.into(),
            repository: repository.into(),
            reference: reference.into(),
        }
    }

    fn names(endpoints: &[Endpoint]) -> Vec<String> {
        endpoints.iter().map(Endpoint::name).collect()
    }

    /// OpenShift's rendering of an ImageDigestMirrorSet with `NeverContactSource`.
    const IDMS: &str = r#"
unqualified-search-registries = ["registry.access.redhat.com", "docker.io"]
short-name-mode = "enforcing"

[[registry]]
  prefix = ""
  location = "quay.io/openshift-release-dev/ocp-release"
  blocked = true
  mirror-by-digest-only = true

  [[registry.mirror]]
    location = "mirror.local:5000/ocp/release"

  [[registry.mirror]]
    location = "backup.local/ocp"
    insecure = true
"#;

    #[test]
    fn digest_only_mirrors_serve_digests_in_order_and_a_blocked_source_is_left_out() {
        let c = conf(&[("/etc/containers/registries.conf", IDMS)]).unwrap();
        let t = target("quay.io", "openshift-release-dev/ocp-release", D);
        let e = c.endpoints(&t);
        assert_eq!(
            names(&e),
            ["mirror.local:5000/ocp/release", "backup.local/ocp"]
        );
        assert_eq!(e[0].scheme, Scheme::Https);
        assert_eq!(e[1].scheme, Scheme::HttpsThenHttp);
        assert!(e[1].tls.skip_verify && e.iter().all(|e| e.mirror));
        assert_eq!(e[0].auth_host, "mirror.local:5000");
        // By tag: no mirror may serve it, and the source is blocked.
        assert!(
            c.endpoints(&target(
                "quay.io",
                "openshift-release-dev/ocp-release",
                "4.17"
            ))
            .is_empty()
        );
        // A repository under the prefix is remapped under the mirror's path.
        let sub = target("quay.io", "openshift-release-dev/ocp-release/extra", D);
        assert_eq!(
            names(&c.endpoints(&sub))[0],
            "mirror.local:5000/ocp/release/extra"
        );
        // A sibling that only shares characters is not under the prefix.
        let other = target("quay.io", "openshift-release-dev/ocp-release-art", D);
        assert_eq!(
            names(&c.endpoints(&other)),
            ["quay.io/openshift-release-dev/ocp-release-art"]
        );
    }

    #[test]
    fn the_longest_prefix_wins_and_a_wildcard_matches_hosts_under_its_domain() {
        let c = conf(&[(
            "r.conf",
            r#"
[[registry]]
prefix = "example.com"
location = "example.com"
[[registry.mirror]]
location = "m1.local"

[[registry]]
prefix = "example.com/team/app"
location = "example.com/team/app"
[[registry.mirror]]
location = "m2.local/app"
pull-from-mirror = "tag-only"
[[registry.mirror]]
location = "m3.local/app"

[[registry]]
prefix = "*.corp.example"
[[registry.mirror]]
location = "m4.local"
"#,
        )])
        .unwrap();
        let app = c.endpoints(&target("example.com", "team/app", D));
        assert_eq!(
            names(&app),
            ["m3.local/app", "example.com/team/app"],
            "tag-only skipped for a digest"
        );
        let by_tag = c.endpoints(&target("example.com", "team/app", "v1"));
        assert_eq!(
            names(&by_tag),
            ["m2.local/app", "m3.local/app", "example.com/team/app"]
        );
        let other = c.endpoints(&target("example.com", "team/tool", D));
        assert_eq!(
            names(&other),
            ["m1.local/team/tool", "example.com/team/tool"]
        );
        let wild = c.endpoints(&target("a.b.corp.example", "x", D));
        assert_eq!(names(&wild), ["m4.local/x", "a.b.corp.example/x"]);
        assert_eq!(
            names(&c.endpoints(&target("corp.example", "x", D))),
            ["corp.example/x"]
        );
    }

    #[test]
    fn a_dropin_replaces_a_prefix_where_it_stood_and_adds_the_others() {
        let c = conf(&[
            ("/etc/containers/registries.conf", IDMS),
            (
                "/etc/containers/registries.conf.d/50-site.conf",
                r#"
[[registry]]
location = "quay.io/openshift-release-dev/ocp-release"
[[registry.mirror]]
location = "site.local/release"
pull-from-mirror = "digest-only"

[[registry]]
location = "registry.example.com"
insecure = true
"#,
            ),
        ])
        .unwrap();
        assert_eq!(c.registries.len(), 2);
        let t = target("quay.io", "openshift-release-dev/ocp-release", D);
        assert_eq!(
            names(&c.endpoints(&t)),
            [
                "site.local/release",
                "quay.io/openshift-release-dev/ocp-release"
            ],
            "the drop-in's registry is not blocked"
        );
        assert!(
            c.registries[0].origin.ends_with("50-site.conf:2"),
            "{}",
            c.registries[0].origin
        );
        let e = c.endpoints(&target("registry.example.com", "a", D));
        assert_eq!(e[0].scheme, Scheme::HttpsThenHttp);
        assert!(!e[0].mirror);
    }

    #[test]
    fn version_1_lists_are_read() {
        let c = conf(&[(
            "v1.conf",
            "[registries.search]\nregistries = ['docker.io']\n[registries.insecure]\nregistries = ['127.0.0.1:5000']\n[registries.block]\nregistries = ['evil.example']\n",
        )])
        .unwrap();
        assert_eq!(
            c.endpoints(&target("127.0.0.1:5000", "a", D))[0].scheme,
            Scheme::HttpsThenHttp
        );
        assert!(c.endpoints(&target("evil.example", "a", D)).is_empty());
    }

    #[test]
    fn bad_files_are_refused_at_their_line() {
        for (text, line, why) in [
            (
                "[[registry]]\nlocation = \"a.example\"\nblocked = \"yes\"\n",
                3,
                "invalid type",
            ),
            ("[[registry]\nlocation = 1\n", 1, ""),
            (
                "\n[[registry]]\nlocation = \"https://a.example\"\n",
                2,
                "no URI scheme",
            ),
            (
                "[[registry]]\ninsecure = true\n",
                1,
                "needs a prefix or a location",
            ),
            (
                "[[registry]]\nlocation = \"a.example\"\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"sometimes\"\n",
                3,
                "pull-from-mirror \"sometimes\"",
            ),
            (
                "[[registry]]\nlocation = \"a.example\"\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = \"m\"\npull-from-mirror = \"all\"\n",
                4,
                "cannot both be set",
            ),
            ("[[registry]]\nprefix = \"a.*.example\"\n", 1, "wildcard"),
            (
                "[[registry]]\nlocation = \"a\"\n[[registry]]\nlocation = \"a\"\n",
                3,
                "defined twice",
            ),
        ] {
            let e = conf(&[("/etc/containers/registries.conf", text)]).unwrap_err();
            assert_eq!(e.line, Some(line), "{text}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("/etc/containers/registries.conf:{line}: ")),
                "{e}"
            );
            assert!(e.why.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn files_are_found_as_crio_finds_them() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("registries.conf");
        assert!(
            RegistriesConf::load(&main).unwrap().registries.is_empty(),
            "none: no mirrors"
        );
        std::fs::write(&main, IDMS).unwrap();
        let dropins = dir.path().join("registries.conf.d");
        std::fs::create_dir(&dropins).unwrap();
        std::fs::write(
            dropins.join("20-b.conf"),
            "[[registry]]\nlocation = \"b.example\"\n",
        )
        .unwrap();
        std::fs::write(
            dropins.join("10-a.conf"),
            "[[registry]]\nlocation = \"a.example\"\n",
        )
        .unwrap();
        std::fs::write(dropins.join("README"), "not a drop-in").unwrap();
        let c = RegistriesConf::load(&main).unwrap();
        let prefixes: Vec<&str> = c.registries.iter().map(|r| r.prefix.as_str()).collect();
        assert_eq!(
            prefixes,
            [
                "quay.io/openshift-release-dev/ocp-release",
                "a.example",
                "b.example"
            ]
        );
        assert_eq!(c.files.len(), 3);
        std::fs::write(dropins.join("30-bad.conf"), "[[registry]]\nlocation = 7\n").unwrap();
        let e = RegistriesConf::load(&main).unwrap_err();
        assert_eq!(e.file, dropins.join("30-bad.conf"));
        assert_eq!(e.line, Some(2));
    }
}
