//! `pinset set from-manifests NAME FILE|DIR|-…`: a set of every image the workloads of rendered
//! manifests run, read as `kubectl apply -f` reads them ([`pinset_k8s::workloads`]), tags
//! resolved as `from-images` resolves them.

use super::{Asked, Common, Gathered};
use anyhow::{Context, Result, bail};
use pinset_registry::mirrors::Target;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct FromManifestsArgs {
    /// The set's name (metadata.name).
    pub name: String,
    /// Manifests: YAML or JSON files (several documents, Lists), directories (their *.yaml,
    /// *.yml and *.json files), or - for standard input (`helm template … | pinset set
    /// from-manifests NAME -`).
    #[arg(required = true, value_name = "FILE|DIR|-")]
    pub files: Vec<PathBuf>,
    /// Read directories and their subdirectories (as `kubectl apply -R`).
    #[arg(long, short = 'R')]
    pub recursive: bool,
    #[command(flatten)]
    pub common: Common,
}

pub async fn run(args: &FromManifestsArgs) -> Result<ExitCode> {
    super::check_name(&args.name)?;
    args.common.check()?;
    let mut sources = Vec::new();
    for f in &args.files {
        sources.extend(expand(f, args.recursive)?);
    }
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    let mut wanted = Vec::new();
    for (label, text) in &sources {
        wanted.extend(read(label, text, &mut skipped)?);
    }
    for (kind, n) in &skipped {
        eprintln!("skipped: {n} {kind} (not a workload: no pod template, no related images)");
    }
    if wanted.is_empty() {
        bail!("no image: no workload in {}", labels(&sources));
    }
    let sizer = args.common.sizer()?;
    let mut gathered = Gathered::default();
    let (failed, asked) = super::resolve_all(&sizer, &wanted, &mut gathered).await?;
    if let Some(code) = super::unresolved(&args.common, &failed, asked) {
        return Ok(code);
    }
    let source = format!("manifests {}", labels(&sources));
    super::print(&args.common, &args.name, &source, &gathered)
}

fn labels(sources: &[(String, String)]) -> String {
    let names: Vec<&str> = sources.iter().map(|(l, _)| l.as_str()).collect();
    names.join(", ")
}

/// The texts `path` names: a file, standard input, or a directory's manifests in name order.
fn expand(path: &Path, recursive: bool) -> Result<Vec<(String, String)>> {
    if path == Path::new("-") {
        return Ok(vec![("-".into(), crate::cli::read_input(path, None)?)]);
    }
    let meta = std::fs::metadata(path).with_context(|| path.display().to_string())?;
    if !meta.is_dir() {
        let text = crate::cli::read_input(path, None)?;
        return Ok(vec![(path.display().to_string(), text)]);
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| path.display().to_string())?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| path.display().to_string())?;
    entries.sort();
    let mut out = Vec::new();
    for entry in entries {
        let is_manifest = entry
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ["yaml", "yml", "json"].contains(&e));
        if entry.is_dir() && recursive {
            out.extend(expand(&entry, true)?);
        } else if entry.is_file() && is_manifest {
            out.extend(expand(&entry, false)?);
        }
    }
    Ok(out)
}

/// The images one text's workloads use; a bad document or image is an error at FILE:LINE:COL.
fn read(label: &str, text: &str, skipped: &mut BTreeMap<String, usize>) -> Result<Vec<Asked>> {
    let docs = pinset_core::yaml::documents(text).map_err(|e| anyhow::anyhow!("{label}:{e}"))?;
    let mut out = Vec::new();
    for doc in &docs {
        let read =
            pinset_k8s::workloads::images(doc).map_err(|e| anyhow::anyhow!("{label}:{e}"))?;
        for kind in read.skipped {
            *skipped.entry(kind).or_default() += 1;
        }
        for used in read.used {
            let target = Target::parse(&used.image)
                .map_err(|why| anyhow::anyhow!("{label}:{}", doc.error(&used.path, why)))?;
            out.push(Asked {
                given: used.image,
                target,
                found_in: Some(used.object),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: &str = "\
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  template:
    spec:
      initContainers: [{name: init, image: 'q.io/a/init:v1'}]
      containers: [{name: web, image: 'q.io/a/web@sha256:0000000000000000000000000000000000000000000000000000000000000001'}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: d}
";

    #[test]
    fn every_workload_image_is_wanted_and_other_kinds_counted() {
        let mut skipped = BTreeMap::new();
        let wanted = read("app.yaml", APP, &mut skipped).unwrap();
        let got: Vec<(String, Option<String>)> = wanted
            .iter()
            .map(|w| (w.target.full(), w.origin()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "q.io/a/init:v1".to_string(),
                    Some("q.io/a/init:v1 (StatefulSet/web init container init)".to_string())
                ),
                (
                    format!("q.io/a/web@sha256:{}1", "0".repeat(63)),
                    Some("StatefulSet/web container web".to_string())
                ),
            ]
        );
        assert_eq!(skipped, BTreeMap::from([("ConfigMap".to_string(), 2)]));
    }

    #[test]
    fn a_bad_image_and_a_bad_document_are_errors_at_file_line_col() {
        let bad = APP.replace("q.io/a/init:v1", "Q.io/BAD image");
        let e = read("app.yaml", &bad, &mut BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("app.yaml:8:"), "{e}");
        let e = read("b.yaml", "kind: Pod\nspec: [\n", &mut BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("b.yaml:"), "{e}");
        let wrong = "kind: Pod\nmetadata: {name: p}\nspec:\n  containers: {name: x}\n";
        let e = read("c.yaml", wrong, &mut BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("c.yaml:4:"), "{e}");
    }

    #[test]
    fn a_directory_is_read_in_name_order_its_subdirectories_with_recursive() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.yaml"), "kind: ConfigMap\n").unwrap();
        std::fs::write(dir.path().join("a.json"), "{}").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/c.yml"), "kind: Pod\n").unwrap();
        let names = |r: bool| -> Vec<String> {
            expand(dir.path(), r)
                .unwrap()
                .into_iter()
                .map(|(l, _)| {
                    Path::new(&l)
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect()
        };
        assert_eq!(names(false), ["a.json", "b.yaml"]);
        assert_eq!(names(true), ["a.json", "b.yaml", "c.yml"]);
        let e = expand(&dir.path().join("nope.yaml"), false).unwrap_err();
        assert!(format!("{e:#}").contains("nope.yaml"), "{e:#}");
    }
}
