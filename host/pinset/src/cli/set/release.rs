//! `pinset set from-release RELEASE… [--since CURRENT]`: the set that stages an upgrade — the
//! release image and every image its payload references, read from the registry as
//! [`pinset_registry::release`] reads it (the node's mirrors and credentials, no `oc`, no engine).

use super::{Common, Gathered};
use anyhow::{Context, Result, bail};
use pinset_registry::mirrors::Target;
use pinset_registry::release::{self, Release};
use pinset_registry::size::RegistrySizer;
use std::collections::BTreeSet;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct FromReleaseArgs {
    /// Release images, by tag or digest (`[host[:port]/]path[:tag]` or `…@sha256:<digest>`); several
    /// (an upgrade path, hop by hop) give the union of their images.
    #[arg(required = true, value_name = "RELEASE")]
    pub releases: Vec<String>,
    /// The set's name. Default: release-VERSION (of the last RELEASE), with -since-VERSION
    /// when --since is given.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Keep only the images the release CURRENT does not already have (compared by digest):
    /// what an upgrade from CURRENT actually pulls.
    #[arg(long, value_name = "CURRENT")]
    pub since: Option<String>,
    /// Keep only the components whose name matches GLOB (`*` any run, `?` one character;
    /// repeatable). The release image itself is always kept.
    #[arg(long, value_name = "GLOB")]
    pub include: Vec<String>,
    /// Leave out the components whose name matches GLOB (repeatable; applied after --include).
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    #[command(flatten)]
    pub common: Common,
}

pub async fn run(args: &FromReleaseArgs) -> Result<ExitCode> {
    if let Some(name) = &args.name {
        super::check_name(name)?;
    }
    args.common.check()?;
    let targets = targets(&args.releases)?;
    let since = match &args.since {
        Some(s) => Some(Target::parse(s).map_err(|e| anyhow::anyhow!("--since {e}"))?),
        None => None,
    };
    let sizer = args.common.sizer()?;
    // The releases and CURRENT are read at once.
    let read = futures::future::join_all(targets.iter().map(|t| release::read(&sizer, t)));
    let current = async {
        match &since {
            Some(target) => Some(read_current(&sizer, target).await),
            None => None,
        }
    };
    let (read, current) = tokio::join!(read, current);
    let mut releases = Vec::new();
    let mut failed = Vec::new();
    for ((given, target), answer) in args.releases.iter().zip(&targets).zip(read) {
        match answer {
            Ok(r) => releases.push(((given.as_str(), target.by_digest()), r)),
            Err(e) => failed.push(format!("{given}: {e}")),
        }
    }
    if let Some(code) = super::unresolved(&args.common, &failed, targets.len()) {
        return Ok(code);
    }
    let Some((_, last)) = releases.last() else {
        bail!("no release could be read");
    };
    let mut gathered = gather(&releases, &args.include, &args.exclude);
    let mut source = describe(&releases);
    let mut name = args
        .name
        .clone()
        .unwrap_or_else(|| default_name(&last.version));
    if let Some(current) = current {
        let current = current?;
        let had = digests(&current);
        let before = gathered.len();
        gathered.retain(|r| !had.contains(digest_of(r)));
        eprintln!(
            "since {} ({}): {} of {before} image(s) are new",
            current.image,
            current.version,
            gathered.len()
        );
        source.push_str(&format!("; since {} ({})", current.image, current.version));
        if args.name.is_none() {
            name = format!("{name}-since-{}", sanitize(&current.version));
        }
    }
    super::print(&args.common, &name, &source, &gathered)
}

fn targets(given: &[String]) -> Result<Vec<Target>> {
    given
        .iter()
        .map(|g| Target::parse(g).map_err(|e| anyhow::anyhow!("RELEASE {e}")))
        .collect()
}

async fn read_current(sizer: &RegistrySizer, target: &Target) -> Result<Release> {
    release::read(sizer, target)
        .await
        .with_context(|| format!("--since {}", target.full()))
}

/// A release as it was given (the argument, and whether it names a digest) and as it was read.
type Given<'a> = ((&'a str, bool), Release);

/// Every release image, then every kept component of each release in turn, each image once.
fn gather(releases: &[Given<'_>], include: &[String], exclude: &[String]) -> Gathered {
    let mut out = Gathered::default();
    for ((given, by_digest), r) in releases {
        let origin = match by_digest {
            true => format!("release {}", r.version),
            false => format!("release {} ({given})", r.version),
        };
        out.add(&r.image, Some(&origin));
    }
    for (_, r) in releases {
        for c in &r.components {
            let included = include.is_empty() || include.iter().any(|g| glob(g, &c.name));
            if included && !exclude.iter().any(|g| glob(g, &c.name)) {
                out.add(&c.image, Some(&c.name));
            }
        }
    }
    out
}

/// The digests a release holds: its own and every component's.
fn digests(r: &Release) -> BTreeSet<&str> {
    std::iter::once(r.image.as_str())
        .chain(r.components.iter().map(|c| c.image.as_str()))
        .map(digest_of)
        .collect()
}

/// `sha256:…` of `host/path@sha256:…` (an image is the same image under any name or mirror).
fn digest_of(reference: &str) -> &str {
    reference.rsplit_once('@').map_or(reference, |(_, d)| d)
}

/// What the set was made from: each release by digest, with its version.
fn describe(releases: &[Given<'_>]) -> String {
    let each: Vec<String> = releases
        .iter()
        .map(|(_, r)| format!("release {} ({})", r.image, r.version))
        .collect();
    each.join("; ")
}

fn default_name(version: &str) -> String {
    format!("release-{}", sanitize(version))
}

/// A version as a name's part: lowercase, anything else than letters, digits, '.' and '-' as
/// '-', trimmed to start and end with a letter or digit.
fn sanitize(version: &str) -> String {
    let s: String = version
        .to_ascii_lowercase()
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '.' | '-' => c,
            _ => '-',
        })
        .collect();
    let s = s.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if s.is_empty() {
        "unversioned".into()
    } else {
        s.chars().take(200).collect()
    }
}

/// A shell-style glob over a whole name: `*` any run of characters, `?` exactly one.
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match, backtracking to the last `*`.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        match p.get(i) {
            Some('*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(&c) if c == '?' || c == n[j] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    star = Some((si, sj + 1));
                    i = si + 1;
                    j = sj + 1;
                }
                None => return false,
            },
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_registry::release::Component;

    fn release(version: &str, n: u8, components: &[(&str, u8)]) -> Release {
        let d = |n: u8| format!("sha256:{}", format!("{n:02x}").repeat(32));
        Release {
            image: format!("q.io/ocp/release@{}", d(n)),
            endpoint: "q.io".into(),
            version: version.into(),
            previous: Vec::new(),
            components: components
                .iter()
                .map(|(name, n)| Component {
                    name: name.to_string(),
                    image: format!("q.io/ocp/art@{}", d(*n)),
                })
                .collect(),
        }
    }

    #[test]
    fn globs_match_whole_names() {
        for (p, n, want) in [
            ("etcd", "etcd", true),
            ("etcd", "etcd-operator", false),
            ("*-operator", "etcd-operator", true),
            ("*operator*", "cluster-operator-x", true),
            ("e?cd", "etcd", true),
            ("e?cd", "ecd", false),
            ("*", "", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
        ] {
            assert_eq!(glob(p, n), want, "{p} ~ {n}");
        }
    }

    #[test]
    fn an_upgrade_path_is_the_union_each_image_once_filtered_by_component() {
        let a = release(
            "4.17.3",
            1,
            &[("etcd", 10), ("console", 11), ("installer", 12)],
        );
        let b = release(
            "4.18.1",
            2,
            &[("etcd", 20), ("console", 11), ("installer", 22)],
        );
        let g = gather(
            &[
                (("q.io/ocp/release:4.17.3", false), a),
                (("q.io/ocp/release:4.18.1", false), b),
            ],
            &[],
            &["install*".into()],
        );
        let names: Vec<&str> = g.order.iter().map(|r| digest_of(r)).collect();
        let d = |n: u8| format!("sha256:{}", format!("{n:02x}").repeat(32));
        assert_eq!(names, [d(1), d(2), d(10), d(11), d(20)]);
        let release = &g.origins[&g.order[0]];
        assert_eq!(release, &["release 4.17.3 (q.io/ocp/release:4.17.3)"]);
        assert_eq!(
            g.origins[&g.order[3]],
            ["console"],
            "one image, one name, once"
        );
    }

    #[test]
    fn the_delta_keeps_what_current_does_not_have_under_any_name() {
        let current = release("4.17.2", 3, &[("etcd", 10), ("console", 30)]);
        let next = release("4.17.3", 1, &[("etcd", 10), ("console", 11)]);
        let mut g = gather(&[(("x", false), next)], &["*".into()], &[]);
        // The same image through a mirror is the same image.
        let had = digests(&current);
        g.retain(|r| !had.contains(digest_of(r)));
        assert_eq!(g.len(), 2, "{:?}", g.order);
        assert!(g.order.iter().all(|r| !r.ends_with(&"0a".repeat(32))));
    }

    #[test]
    fn default_names_are_valid_set_names() {
        for v in [
            "4.17.3",
            "4.18.0-0.nightly-2026-11-03-101112",
            "V4_X+build",
            "--",
        ] {
            super::super::check_name(&default_name(v)).unwrap();
        }
        assert_eq!(default_name("4.17.3"), "release-4.17.3");
    }
}
