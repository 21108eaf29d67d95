//! `pinset set from-images NAME IMAGE… [--file LIST] [--pool POOL]`: a PinnedImageSet from images
//! as people name them, tags resolved to digests through the mirrors and credentials the node
//! uses. The only place pinset reads tags: the set it prints is digest-only, as sets must be,
//! with each image's source tag kept in the annotation [`SOURCE_TAGS`].

use super::node::RegistryAccess;
use anyhow::{Context, Result, bail};
use pinset_registry::mirrors::Target;
use pinset_registry::size::RegistrySizer;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The annotation that maps each pinned image to the tag it was resolved from (JSON object).
pub const SOURCE_TAGS: &str = "pinset.io/source-tags";

#[derive(clap::Subcommand)]
pub enum SetCommand {
    /// Print a PinnedImageSet of IMAGEs given by tag or digest: tags resolved to digests (a
    /// multi-platform tag to its index) through the node's mirrors and credentials. Exit 1,
    /// printing nothing, when an image cannot be resolved.
    FromImages(FromImagesArgs),
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SetOutput {
    #[default]
    Yaml,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct FromImagesArgs {
    /// The set's name (metadata.name).
    pub name: String,
    /// Images: [host[:port]/]path[:tag] or …@sha256:<digest> (checked to exist).
    pub images: Vec<String>,
    /// More images, one per line (blank lines and # comments skipped; - for standard input).
    #[arg(long, value_name = "LIST")]
    pub file: Option<PathBuf>,
    /// The pool the set is for: the label machineconfiguration.openshift.io/role=POOL.
    #[arg(long, value_name = "POOL")]
    pub pool: Option<String>,
    #[arg(long, short = 'o', value_enum, default_value = "yaml")]
    pub output: SetOutput,
    #[command(flatten)]
    pub registry: RegistryAccess,
}

pub async fn run(cmd: SetCommand) -> Result<ExitCode> {
    match cmd {
        SetCommand::FromImages(args) => from_images(&args).await,
    }
}

/// One image as given, and what it names.
#[derive(Debug)]
struct Wanted {
    given: String,
    target: Target,
}

async fn from_images(args: &FromImagesArgs) -> Result<ExitCode> {
    check_name(&args.name)?;
    if let Some(pool) = &args.pool {
        check_pool(pool)?;
    }
    let wanted = wanted(args)?;
    if wanted.is_empty() {
        bail!("no image: give IMAGEs or --file LIST");
    }
    let credentials = pinset_node::config::credentials(args.registry.auth().as_deref())?;
    let sizer = RegistrySizer::new(args.registry.insecure(), credentials)
        .with_mirrors(args.registry.mirrors().offline()?);
    pinset_registry::size::Sizer::refresh(&sizer)?;
    let answers = futures::future::join_all(wanted.iter().map(|w| sizer.resolve(&w.target))).await;
    let mut pinned: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut order = Vec::new();
    let mut failed = 0;
    for (w, answer) in wanted.iter().zip(answers) {
        match answer {
            Ok((digest, endpoint)) => {
                let t = &w.target;
                let reference = format!("{}/{}@{digest}", t.registry, t.repository);
                pinset_core::reference::ImageRef::parse(&reference)
                    .with_context(|| w.given.clone())?;
                tracing::info!(image = %w.given, %reference, %endpoint, "resolved");
                if !pinned.contains_key(&reference) {
                    order.push(reference.clone());
                }
                let tags = pinned.entry(reference).or_default();
                if !t.by_digest() {
                    tags.push(w.given.clone());
                }
            }
            Err(e) => {
                eprintln!("error: {}: {}", w.given, e.why);
                failed += 1;
            }
        }
    }
    if failed > 0 {
        eprintln!(
            "{failed} of {} image(s) not resolved: no set printed",
            wanted.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    let set = document(args, &order, &pinned)?;
    match args.output {
        SetOutput::Yaml => print!("{}", serde_yaml::to_string(&set)?),
        SetOutput::Json => println!("{}", serde_json::to_string_pretty(&set)?),
    }
    Ok(ExitCode::SUCCESS)
}

/// The images of the arguments, then of `--file`, parsed.
fn wanted(args: &FromImagesArgs) -> Result<Vec<Wanted>> {
    let mut out = Vec::new();
    for given in &args.images {
        let target = Target::parse(given).map_err(anyhow::Error::msg)?;
        out.push(Wanted {
            given: given.clone(),
            target,
        });
    }
    if let Some(file) = &args.file {
        out.extend(read_list(file)?);
    }
    Ok(out)
}

/// A list of images, one per line; a bad line is an error at FILE:LINE.
fn read_list(file: &Path) -> Result<Vec<Wanted>> {
    let text = if file == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("--file -: standard input")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("--file {}", file.display()))?
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line
            .split_once('#')
            .map_or(line, |(before, _)| before)
            .trim();
        if line.is_empty() {
            continue;
        }
        let target = Target::parse(line)
            .map_err(|why| anyhow::anyhow!("{}:{}: {why}", file.display(), n + 1))?;
        out.push(Wanted {
            given: line.to_string(),
            target,
        });
    }
    Ok(out)
}

/// The PinnedImageSet, images in the order given.
fn document(
    args: &FromImagesArgs,
    order: &[String],
    tags: &BTreeMap<String, Vec<String>>,
) -> Result<serde_json::Value> {
    let sources: BTreeMap<&str, String> = order
        .iter()
        .filter_map(|r| {
            Some((
                r.as_str(),
                tags.get(r).filter(|t| !t.is_empty())?.join(", "),
            ))
        })
        .collect();
    let mut metadata = serde_json::json!({ "name": args.name });
    if let Some(pool) = &args.pool {
        metadata["labels"] = serde_json::json!({ pinset_core::desired::ROLE_LABEL: pool });
    }
    if !sources.is_empty() {
        metadata["annotations"] =
            serde_json::json!({ SOURCE_TAGS: serde_json::to_string(&sources)? });
    }
    let images: Vec<serde_json::Value> = order
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
fn check_name(name: &str) -> Result<()> {
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
    fn a_bad_line_of_the_list_is_named_at_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("images.txt");
        std::fs::write(
            &list,
            "# release\nquay.io/a/b:v1  # pinned\n\nquay.io/A:v1\n",
        )
        .unwrap();
        let e = read_list(&list).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:4: ", list.display())), "{e}");
        std::fs::write(&list, "# release\nquay.io/a/b:v1  # pinned\n\nbusybox\n").unwrap();
        let ok = read_list(&list).unwrap();
        assert_eq!(
            ok.iter().map(|w| w.target.full()).collect::<Vec<_>>(),
            ["quay.io/a/b:v1", "docker.io/library/busybox:latest"]
        );
    }

    #[test]
    fn the_set_keeps_each_images_tags_and_the_pool() {
        let args = FromImagesArgs {
            name: "apps".into(),
            images: Vec::new(),
            file: None,
            pool: Some("worker".into()),
            output: SetOutput::Yaml,
            registry: RegistryAccess {
                auth: None,
                registries_conf: None,
                registry_config_path: None,
            },
        };
        let (a, b) = ("q.io/a@sha256:1".to_string(), "q.io/b@sha256:2".to_string());
        let tags = BTreeMap::from([
            (a.clone(), vec!["q.io/a:v1".into(), "q.io/a:latest".into()]),
            (b.clone(), vec![]),
        ]);
        let set = document(&args, &[b.clone(), a.clone()], &tags).unwrap();
        assert_eq!(
            set["metadata"]["labels"][pinset_core::desired::ROLE_LABEL],
            "worker"
        );
        assert_eq!(
            set["spec"]["pinnedImages"][0]["name"],
            b.as_str(),
            "the order given"
        );
        let sources: BTreeMap<String, String> = serde_json::from_str(
            set["metadata"]["annotations"][SOURCE_TAGS]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            sources,
            BTreeMap::from([(a, "q.io/a:v1, q.io/a:latest".to_string())])
        );
    }
}
