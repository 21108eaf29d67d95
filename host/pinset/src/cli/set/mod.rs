//! `pinset set from-images|from-release|from-manifests`: PinnedImageSets written from where the
//! images really are — images as people name them, a release payload, rendered manifests and
//! operator bundles. The only place pinset reads tags: every set it prints is digest-only, as
//! sets must be, each image's origin kept in the annotation [`SOURCE_TAGS`] and what the set was
//! made from in [`SOURCE`]. The commands only print (`kubectl apply -f -` applies; `pinset plan
//! --sets -` answers whether it fits first), never write to a cluster.
//!
//! Common to the three sources: a set over the API's 500 images is split (`NAME-1`, `NAME-2`, …,
//! said on standard error); `-o yaml` prints one document per set, `-o json` one object, or a
//! `List` of several as kubectl prints them; an image that cannot be resolved is named and fails
//! the command (exit 1, nothing printed) unless `--skip-unresolvable` turns it into a warning.

mod images;
mod manifests;
mod release;

use super::node::RegistryAccess;
use anyhow::{Context, Result, bail};
use futures::StreamExt;
use pinset_registry::mirrors::Target;
use pinset_registry::size::RegistrySizer;
use std::collections::BTreeMap;
use std::process::ExitCode;

/// The annotation that maps each pinned image to the names it was found under (JSON object):
/// the tags it was resolved from, its release component names, the objects that use it.
pub const SOURCE_TAGS: &str = "pinset.io/source-tags";
/// The annotation that says what the set was made from (`release quay.io/…@sha256:… 4.17.3`).
pub const SOURCE: &str = "pinset.io/source";
/// The most images one PinnedImageSet may hold (the API's limit).
pub const MAX_IMAGES: usize = 500;
/// Tags resolved at once against the registries.
const RESOLVING_AT_ONCE: usize = 16;

/// The three sources, as kubectl-style verbs (`set from-images`, …).
#[derive(clap::Subcommand)]
#[allow(clippy::enum_variant_names)]
pub enum SetCommand {
    /// Print a PinnedImageSet of IMAGEs given by tag or digest: tags resolved to digests (a
    /// multi-platform tag to its index) through the node's mirrors and credentials.
    FromImages(images::FromImagesArgs),
    /// Print the PinnedImageSet that stages a release: the release image and every image its
    /// payload references (release-manifests/image-references), read from the registry through
    /// the node's mirrors and credentials — no oc, no container engine. Several RELEASEs (an
    /// upgrade path) give their union; --since keeps what the upgrade actually pulls.
    FromRelease(release::FromReleaseArgs),
    /// Print a PinnedImageSet of every image the workloads in manifests run (as `kubectl apply
    /// -f` reads them: files, directories, - for standard input; Lists, multi-document files,
    /// `helm template` or `kubectl kustomize` output, operator bundles' CSVs), tags resolved.
    FromManifests(manifests::FromManifestsArgs),
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SetOutput {
    #[default]
    Yaml,
    Json,
}

/// The options every source shares.
#[derive(clap::Args, Debug)]
pub struct Common {
    /// The pool the set is for: the label machineconfiguration.openshift.io/role=POOL.
    #[arg(long, value_name = "POOL")]
    pub pool: Option<String>,
    #[arg(long, short = 'o', value_enum, default_value = "yaml")]
    pub output: SetOutput,
    /// Warn about the images that cannot be resolved and print the set without them (default:
    /// name them, print nothing, exit 1).
    #[arg(long)]
    pub skip_unresolvable: bool,
    #[command(flatten)]
    pub registry: RegistryAccess,
}

impl Common {
    fn check(&self) -> Result<()> {
        match &self.pool {
            Some(pool) => check_pool(pool),
            None => Ok(()),
        }
    }

    /// The sizer that resolves through the node's mirrors and credentials.
    fn sizer(&self) -> Result<RegistrySizer> {
        let credentials = self.registry.credentials()?;
        let sizer = RegistrySizer::new(self.registry.insecure(), credentials)
            .with_mirrors(self.registry.mirrors().offline()?);
        pinset_registry::size::Sizer::refresh(&sizer)?;
        Ok(sizer)
    }
}

pub async fn run(cmd: SetCommand) -> Result<ExitCode> {
    match cmd {
        SetCommand::FromImages(args) => images::run(&args).await,
        SetCommand::FromRelease(args) => release::run(&args).await,
        SetCommand::FromManifests(args) => manifests::run(&args).await,
    }
}

/// The images of a set being written, each once, in the order first found, with the names it
/// was found under.
#[derive(Debug, Default)]
pub struct Gathered {
    order: Vec<String>,
    origins: BTreeMap<String, Vec<String>>,
}

impl Gathered {
    /// Add `reference` (by digest), found as `origin` (none: given by its digest).
    pub fn add(&mut self, reference: &str, origin: Option<&str>) {
        let origins = match self.origins.get_mut(reference) {
            Some(origins) => origins,
            None => {
                self.order.push(reference.to_string());
                self.origins.entry(reference.to_string()).or_default()
            }
        };
        if let Some(origin) = origin
            && !origins.iter().any(|o| o == origin)
        {
            origins.push(origin.to_string());
        }
    }

    /// Keep only the images `keep` says yes to.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.order.retain(|r| keep(r));
        self.origins.retain(|r, _| keep(r));
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// One image to resolve: as it was given, what it names, and where it was found.
#[derive(Debug)]
pub struct Asked {
    pub given: String,
    pub target: Target,
    /// Where it was found (an object of a manifest); `None`: given on the command line.
    pub found_in: Option<String>,
}

impl Asked {
    fn origin(&self) -> Option<String> {
        match (&self.found_in, self.target.by_digest()) {
            (Some(found), true) => Some(found.clone()),
            (Some(found), false) => Some(format!("{} ({found})", self.given)),
            (None, true) => None,
            (None, false) => Some(self.given.clone()),
        }
    }
}

/// Resolve every wanted image to its digest (checking a digest exists), each image once and a
/// few at a time, into `into`; the images that could not be, each with why, and how many
/// images were asked.
pub async fn resolve_all(
    sizer: &RegistrySizer,
    wanted: &[Asked],
    into: &mut Gathered,
) -> Result<(Vec<String>, usize)> {
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&Asked> = wanted
        .iter()
        .filter(|w| seen.insert(w.given.as_str()))
        .collect();
    let answers: Vec<_> = futures::stream::iter(unique.iter().map(|w| sizer.resolve(&w.target)))
        .buffered(RESOLVING_AT_ONCE)
        .collect()
        .await;
    let mut resolved = BTreeMap::new();
    let mut failed = Vec::new();
    for (w, answer) in unique.iter().zip(answers) {
        match answer {
            Ok((digest, endpoint)) => {
                let t = &w.target;
                let reference = format!("{}/{}@{digest}", t.registry, t.repository);
                pinset_core::reference::ImageRef::parse(&reference)
                    .with_context(|| w.given.clone())?;
                tracing::info!(image = %w.given, %reference, %endpoint, "resolved");
                resolved.insert(w.given.as_str(), reference);
            }
            Err(e) => failed.push(format!("{}: {}", w.given, e.why)),
        }
    }
    for w in wanted {
        if let Some(reference) = resolved.get(w.given.as_str()) {
            into.add(reference, w.origin().as_deref());
        }
    }
    Ok((failed, unique.len()))
}

/// Say the images that could not be resolved: errors that stop the command (`Some(exit 1)`),
/// or warnings with `--skip-unresolvable`.
pub fn unresolved(common: &Common, failed: &[String], of: usize) -> Option<ExitCode> {
    if failed.is_empty() {
        return None;
    }
    let level = if common.skip_unresolvable {
        "warning"
    } else {
        "error"
    };
    for f in failed {
        eprintln!("{level}: {f}");
    }
    if common.skip_unresolvable {
        eprintln!(
            "warning: {} of {of} image(s) not resolved: left out of the set",
            failed.len()
        );
        return None;
    }
    eprintln!(
        "error: {} of {of} image(s) not resolved: no set printed (--skip-unresolvable leaves them out)",
        failed.len()
    );
    Some(ExitCode::FAILURE)
}

/// Print the set(s) of `gathered` named `name`, split at [`MAX_IMAGES`].
pub fn print(common: &Common, name: &str, source: &str, gathered: &Gathered) -> Result<ExitCode> {
    if gathered.is_empty() {
        bail!("set {name}: no image left to pin");
    }
    let sets = documents(common.pool.as_deref(), name, source, gathered)?;
    if sets.len() > 1 {
        let parts: Vec<String> = sets
            .iter()
            .map(|s| {
                let n = s["spec"]["pinnedImages"].as_array().map_or(0, Vec::len);
                format!("{} ({n})", s["metadata"]["name"].as_str().unwrap_or(""))
            })
            .collect();
        eprintln!(
            "set {name}: {} images, over the {MAX_IMAGES} a PinnedImageSet holds: split into {}",
            gathered.len(),
            parts.join(", ")
        );
    }
    print!("{}", render(common.output, &sets)?);
    Ok(ExitCode::SUCCESS)
}

/// YAML documents, or a JSON object (a `List` of several).
fn render(output: SetOutput, sets: &[serde_json::Value]) -> Result<String> {
    Ok(match (output, sets) {
        (SetOutput::Yaml, _) => {
            let docs: Result<Vec<String>, _> = sets.iter().map(serde_saphyr::to_string).collect();
            docs?.join("---\n")
        }
        (SetOutput::Json, [one]) => format!("{}\n", serde_json::to_string_pretty(one)?),
        (SetOutput::Json, _) => {
            let list = serde_json::json!({
                "apiVersion": "v1",
                "kind": "List",
                "metadata": {},
                "items": sets,
            });
            format!("{}\n", serde_json::to_string_pretty(&list)?)
        }
    })
}

/// The PinnedImageSets: images in the order found, [`MAX_IMAGES`] to a set.
fn documents(
    pool: Option<&str>,
    name: &str,
    source: &str,
    gathered: &Gathered,
) -> Result<Vec<serde_json::Value>> {
    let chunks: Vec<&[String]> = gathered.order.chunks(MAX_IMAGES).collect();
    let names: Vec<String> = match chunks.len() {
        1 => vec![name.to_string()],
        n => (1..=n).map(|i| format!("{name}-{i}")).collect(),
    };
    for n in &names {
        check_name(n)?;
    }
    chunks
        .iter()
        .zip(&names)
        .map(|(images, name)| document(pool, name, source, images, &gathered.origins))
        .collect()
}

fn document(
    pool: Option<&str>,
    name: &str,
    source: &str,
    images: &[String],
    origins: &BTreeMap<String, Vec<String>>,
) -> Result<serde_json::Value> {
    let tags: BTreeMap<&str, String> = images
        .iter()
        .filter_map(|r| {
            let names = origins.get(r).filter(|t| !t.is_empty())?;
            Some((r.as_str(), names.join(", ")))
        })
        .collect();
    let mut metadata = serde_json::json!({ "name": name });
    if let Some(pool) = pool {
        metadata["labels"] = serde_json::json!({ pinset_core::desired::ROLE_LABEL: pool });
    }
    let mut annotations = serde_json::json!({ SOURCE: source });
    if !tags.is_empty() {
        annotations[SOURCE_TAGS] = serde_json::Value::String(serde_json::to_string(&tags)?);
    }
    metadata["annotations"] = annotations;
    let images: Vec<serde_json::Value> = images
        .iter()
        .map(|r| serde_json::json!({ "name": r }))
        .collect();
    Ok(serde_json::json!({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "PinnedImageSet",
        "metadata": metadata,
        "spec": { "pinnedImages": images },
    }))
}

/// A DNS subdomain name (RFC 1123), as Kubernetes names objects.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            label_ok(part, |b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
            })
        });
    if !ok {
        bail!(
            "set name {name:?}: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (at most 253)"
        );
    }
    Ok(())
}

/// A label value: at most 63 of letters, digits, '-', '_', '.', alphanumeric at both ends.
fn check_pool(pool: &str) -> Result<()> {
    let ok =
        pool.len() <= 63 && label_ok(pool, |b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !ok {
        bail!("--pool {pool:?}: not a label value (letters, digits, '-', '_', '.'; at most 63)");
    }
    Ok(())
}

fn label_ok(part: &str, allowed: impl Fn(u8) -> bool) -> bool {
    let b = part.as_bytes();
    !b.is_empty()
        && b.iter().all(|&c| allowed(c))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_pools_are_checked_as_kubernetes_does() {
        assert!(check_name("release-4.17.3").is_ok());
        for bad in ["", "Apps", "-a", "a-", "a..b", &"a".repeat(254)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert!(check_pool("worker").is_ok() && check_pool("infra_2").is_ok());
        assert!(check_pool("-x").is_err() && check_pool(&"a".repeat(64)).is_err());
    }

    #[test]
    fn the_set_keeps_each_images_origins_the_pool_and_the_source() {
        let (a, b) = ("q.io/a@sha256:1", "q.io/b@sha256:2");
        let mut g = Gathered::default();
        g.add(b, None);
        g.add(a, Some("q.io/a:v1"));
        g.add(a, Some("q.io/a:latest"));
        g.add(a, Some("q.io/a:v1"));
        let sets = documents(Some("worker"), "apps", "images", &g).unwrap();
        let [set] = sets.as_slice() else {
            panic!("{sets:?}")
        };
        let meta = &set["metadata"];
        assert_eq!(meta["labels"][pinset_core::desired::ROLE_LABEL], "worker");
        assert_eq!(meta["annotations"][SOURCE], "images");
        assert_eq!(set["spec"]["pinnedImages"][0]["name"], b, "the order found");
        let tags: BTreeMap<String, String> =
            serde_json::from_str(meta["annotations"][SOURCE_TAGS].as_str().unwrap()).unwrap();
        let want = BTreeMap::from([(a.to_string(), "q.io/a:v1, q.io/a:latest".to_string())]);
        assert_eq!(tags, want, "each image once, each name once");
    }

    #[test]
    fn a_set_over_the_limit_is_split_in_order_and_printed_as_kubectl_would() {
        let mut g = Gathered::default();
        for i in 0..1203 {
            g.add(&format!("q.io/x@sha256:{i:064x}"), Some(&format!("c{i}")));
        }
        let sets = documents(None, "r", "release", &g).unwrap();
        let sizes: Vec<(String, usize)> = sets
            .iter()
            .map(|s| {
                let n = s["spec"]["pinnedImages"].as_array().unwrap().len();
                (s["metadata"]["name"].as_str().unwrap().to_string(), n)
            })
            .collect();
        let want = [("r-1", 500), ("r-2", 500), ("r-3", 203)];
        assert_eq!(sizes, want.map(|(n, c)| (n.to_string(), c)));
        assert_eq!(
            sets[2]["spec"]["pinnedImages"][0]["name"],
            format!("q.io/x@sha256:{:064x}", 1000)
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(SetOutput::Json, &sets).unwrap()).unwrap();
        assert_eq!(
            (
                json["kind"].as_str(),
                json["items"].as_array().map(Vec::len)
            ),
            (Some("List"), Some(3))
        );
        let yaml = render(SetOutput::Yaml, &sets).unwrap();
        let docs = pinset_core::yaml::documents(&yaml).unwrap();
        assert_eq!(docs.len(), 3);
        let one = render(SetOutput::Json, &sets[..1]).unwrap();
        assert!(
            one.contains("\"kind\": \"PinnedImageSet\""),
            "one set, one object"
        );
    }
}
