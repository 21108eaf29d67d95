//! Kubernetes objects read from YAML files (`PinnedImageSet`, `MachineConfigPool`, `Node`), as
//! in the seed's examples, turned into the core's types. Each document is read into the same API
//! type the cluster path uses ([`crate::api`], k8s-openapi's `Node`) and converted by the same
//! functions ([`crate::convert`]): a file and the API server are read alike. Files may hold
//! several documents; directories are read for their `*.yaml`/`*.yml` files; other kinds are
//! skipped.

use crate::api::{MachineConfigPool, PinnedImageSet};
use crate::convert;
use k8s_openapi::api::core::v1::Node;
use pinset_core::desired::{self, NodeInfo, Pool};
use pinset_core::input;
use pinset_core::yaml::{self, Fields, YamlError};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not YAML, a field of the wrong type, an unknown field: `FILE:LINE:COL: field.path: …`.
    #[error("{path}:{error}")]
    Parse { path: PathBuf, error: YamlError },
    /// Read, but not valid as what it is: `FILE:LINE:COL: KIND NAME: why`.
    #[error("{path}:{line}:{col}: {kind} {name}: {why}")]
    Invalid {
        path: PathBuf,
        line: usize,
        col: usize,
        kind: String,
        name: String,
        why: String,
    },
}

#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub sets: Vec<desired::PinnedImageSet>,
    pub pools: Vec<Pool>,
    pub nodes: Vec<NodeInfo>,
    /// Unknown fields read under [`Fields::Lenient`], each `FILE:LINE:COL: field.path: unknown
    /// field`.
    pub warnings: Vec<String>,
}

/// What every document is asked first: its kind and name.
#[derive(Deserialize)]
struct Head {
    kind: Option<String>,
    metadata: Option<HeadMeta>,
}

#[derive(Deserialize)]
struct HeadMeta {
    name: String,
}

/// Read every object of `paths` (files or directories).
pub fn load(paths: &[PathBuf], fields: Fields) -> Result<Objects, ObjectError> {
    let mut out = Objects::default();
    for path in paths {
        load_path(path, fields, &mut out)?;
    }
    Ok(out)
}

/// Read every object of `path` (a file or a directory) into `out`.
pub fn load_path(path: &Path, fields: Fields, out: &mut Objects) -> Result<(), ObjectError> {
    if path.is_dir() {
        let files = pinset_core::yaml_files(path).map_err(|source| ObjectError::Read {
            path: path.into(),
            source,
        })?;
        for f in files {
            load_file(&f, fields, out)?;
        }
        Ok(())
    } else {
        load_file(path, fields, out)
    }
}

pub fn load_file(path: &Path, fields: Fields, out: &mut Objects) -> Result<(), ObjectError> {
    let text = input::text(path, input::OBJECTS).map_err(|source| ObjectError::Read {
        path: path.into(),
        source,
    })?;
    parse(&text, path, fields, out)
}

pub fn parse(
    text: &str,
    path: &Path,
    fields: Fields,
    out: &mut Objects,
) -> Result<(), ObjectError> {
    let parse_err = |error| ObjectError::Parse {
        path: path.into(),
        error,
    };
    for doc in yaml::documents(text).map_err(parse_err)? {
        object(&doc, path, fields, out)?;
    }
    Ok(())
}

/// One object of a document; a `List`'s items one by one (what `pinset set -o json` prints
/// for several sets, as kubectl does).
fn object(
    doc: &yaml::Document,
    path: &Path,
    fields: Fields,
    out: &mut Objects,
) -> Result<(), ObjectError> {
    if doc.value.get("kind").and_then(|k| k.as_str()) == Some("List") {
        let n = doc.value["items"].as_array().map_or(0, Vec::len);
        for i in 0..n {
            if let Some(item) = doc.item(&format!("items[{i}]")) {
                object(&item, path, fields, out)?;
            }
        }
        return Ok(());
    }
    // Other kinds, and documents without a kind or a name, are not pinset's.
    let Ok((head, _)) = doc.typed::<Head>(doc.value.clone(), Fields::Lenient) else {
        return Ok(());
    };
    let (Some(kind), Some(meta)) = (head.kind, head.metadata) else {
        return Ok(());
    };
    known(doc, &kind, &meta.name, path, fields, out)
}

/// A document of a kind pinset reads (`kind`, named `name`), else nothing.
fn known(
    doc: &yaml::Document,
    kind: &str,
    name: &str,
    path: &Path,
    fields: Fields,
    out: &mut Objects,
) -> Result<(), ObjectError> {
    let invalid = |why: String| ObjectError::Invalid {
        path: path.into(),
        line: doc.start.0,
        col: doc.start.1,
        kind: kind.to_string(),
        name: name.to_string(),
        why,
    };
    let mut value = doc.value.clone();
    if kind != "Node"
        && let Some(map) = value.as_object_mut()
    {
        // kube's derived types take apiVersion and kind from the type, not the document:
        // they were read above and are not unknown fields.
        map.remove("apiVersion");
        map.remove("kind");
    }
    let mut warned = Vec::new();
    let mut typed = Typed {
        doc,
        fields,
        path,
        warned: &mut warned,
    };
    match kind {
        "PinnedImageSet" => {
            let set: PinnedImageSet = typed.read(value)?;
            out.sets.push(convert::set(&set));
        }
        "MachineConfigPool" => {
            // A pool without a spec selects nothing, as in the API.
            if let Some(map) = value.as_object_mut() {
                map.entry("spec").or_insert_with(|| serde_json::json!({}));
            }
            let pool: MachineConfigPool = typed.read(value)?;
            out.pools
                .push(convert::pool(&pool).map_err(|e| invalid(e.to_string()))?);
        }
        "Node" => {
            quantities_as_strings(&mut value);
            let node: Node = typed.read(value)?;
            out.nodes
                .push(convert::node(&node).map_err(|e| invalid(e.to_string()))?);
        }
        _ => {}
    }
    out.warnings
        .extend(warned.iter().map(|w| format!("{}:{w}", path.display())));
    Ok(())
}

/// A document read as its API type, its unknown fields collected (lenient) or refused.
struct Typed<'a> {
    doc: &'a yaml::Document,
    fields: Fields,
    path: &'a Path,
    warned: &'a mut Vec<YamlError>,
}

impl Typed<'_> {
    fn read<T: serde::de::DeserializeOwned>(
        &mut self,
        value: serde_json::Value,
    ) -> Result<T, ObjectError> {
        let (t, warnings) =
            self.doc
                .typed(value, self.fields)
                .map_err(|error| ObjectError::Parse {
                    path: self.path.into(),
                    error,
                })?;
        self.warned.extend(warnings);
        Ok(t)
    }
}

/// `allocatable: {ephemeral-storage: 120000000000}` is a quantity to Kubernetes, a number to
/// YAML: read unquoted numbers there as the quantities they are.
fn quantities_as_strings(node: &mut serde_json::Value) {
    for field in ["allocatable", "capacity"] {
        let Some(map) = node
            .get_mut("status")
            .and_then(|s| s.get_mut(field))
            .and_then(|m| m.as_object_mut())
        else {
            continue;
        };
        for (_, v) in map.iter_mut() {
            if let serde_json::Value::Number(n) = v {
                *v = serde_json::Value::String(n.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_seed_example_and_nodes() {
        let text = r#"
apiVersion: machineconfiguration.openshift.io/v1alpha1
kind: PinnedImageSet
metadata:
  name: test-pinned
  labels:
    machineconfiguration.openshift.io/role: "master"
spec:
  pinnedImages:
   - name: quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504
---
apiVersion: v1
kind: Node
metadata:
  name: master-0
  labels: {node-role.kubernetes.io/master: ""}
status:
  allocatable: {ephemeral-storage: 120Gi}
  conditions:
    - {type: Ready, status: "True"}
    - {type: DiskPressure, status: "False"}
---
apiVersion: machineconfiguration.openshift.io/v1
kind: MachineConfigPool
metadata: {name: bare}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
"#;
        let mut o = Objects::default();
        parse(text, Path::new("x.yaml"), Fields::Strict, &mut o).unwrap();
        assert_eq!(o.sets.len(), 1);
        assert_eq!(o.sets[0].generation, 1);
        assert_eq!(o.sets[0].images.len(), 1);
        assert_eq!(
            o.sets[0].labels["machineconfiguration.openshift.io/role"],
            "master"
        );
        let n = &o.nodes[0];
        assert!(n.ready && !n.disk_pressure);
        assert_eq!(n.allocatable_ephemeral_bytes, Some(120 << 30));
        assert_eq!(o.pools[0].name, "bare");
        assert_eq!(o.pools[0].pinned_image_sets, None);
    }

    #[test]
    fn unquoted_and_exponent_quantities_read_as_kubernetes_reads_them() {
        for allocatable in ["120000000000", "'1.2e11'", "1.2e11"] {
            let mut o = Objects::default();
            let text = format!(
                "kind: Node\nmetadata: {{name: n}}\nstatus: {{allocatable: {{ephemeral-storage: {allocatable}}}}}\n"
            );
            parse(&text, Path::new("n.yaml"), Fields::Strict, &mut o)
                .unwrap_or_else(|e| panic!("{allocatable}: {e}"));
            assert_eq!(
                o.nodes[0].allocatable_ephemeral_bytes,
                Some(120_000_000_000),
                "{allocatable}"
            );
        }
    }

    #[test]
    fn bad_documents_are_named() {
        let refused = |text: &str, file: &str| {
            let mut o = Objects::default();
            let e = parse(text, Path::new(file), Fields::Strict, &mut o).unwrap_err();
            e.to_string()
        };
        let e = refused(
            "kind: Node\nmetadata: {name: n}\nstatus: {allocatable: {ephemeral-storage: lots}}\n",
            "n.yaml",
        );
        assert!(
            e.contains("n.yaml") && e.contains("Node n") && e.contains("lots"),
            "{e}"
        );
        let e = refused("a: [\n", "bad.yaml");
        assert!(e.starts_with("bad.yaml:2:1: "), "{e}");
        let e = refused(
            "kind: PinnedImageSet\nmetadata: {name: s}\nspec: {pinnedImages: 3}\n",
            "s.yaml",
        );
        assert!(
            e.starts_with("s.yaml:3:8: spec.pinnedImages: invalid type"),
            "{e}"
        );
    }

    /// `pinset set … -o json` prints several sets as a `List`, as kubectl does: read item by
    /// item, an item's error at its own line.
    #[test]
    fn a_lists_items_are_read_one_by_one() {
        let d = "sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";
        let list = format!(
            r#"{{"apiVersion": "v1", "kind": "List", "items": [
  {{"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
   "metadata": {{"name": "r-1"}}, "spec": {{"pinnedImages": [{{"name": "q.io/a@{d}"}}]}}}},
  {{"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "PinnedImageSet",
   "metadata": {{"name": "r-2"}}, "spec": {{"pinnedImages": [{{"name": "q.io/b@{d}"}}]}}}}
]}}"#
        );
        let mut o = Objects::default();
        parse(&list, Path::new("-"), Fields::Strict, &mut o).unwrap();
        let names: Vec<&str> = o.sets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["r-1", "r-2"]);
        let bad = list.replacen(
            "\"spec\": {\"pinnedImages\"",
            "\"spec\": {\"pinnedImage\"",
            2,
        );
        let bad = bad.replacen("\"pinnedImage\"", "\"pinnedImages\"", 1);
        let e = parse(
            &bad,
            Path::new("-"),
            Fields::Strict,
            &mut Objects::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("-:5:"), "{e}");
    }

    #[test]
    fn unknown_fields_are_refused_where_they_are_or_warned_about() {
        let text = "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  name: typo\nspec:\n  pinnedImage:\n    - name: q.io/a@sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504\n";
        let mut o = Objects::default();
        let e = parse(text, Path::new("s.yaml"), Fields::Strict, &mut o).unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.yaml:6:3: spec.pinnedImage: unknown field (and spec: missing field `pinnedImages`)"
        );
        assert!(o.sets.is_empty());
        let extra = text.replace("pinnedImage:", "pinnedImages: []\n  pinnedImage:");
        let e = parse(&extra, Path::new("s.yaml"), Fields::Strict, &mut o).unwrap_err();
        assert_eq!(e.to_string(), "s.yaml:7:3: spec.pinnedImage: unknown field");
        parse(&extra, Path::new("s.yaml"), Fields::Lenient, &mut o).unwrap();
        assert_eq!(o.warnings, ["s.yaml:7:3: spec.pinnedImage: unknown field"]);
        // A Node's unknown status field, too.
        let node = "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {alocatable: {}}\n";
        let e = parse(node, Path::new("n.yaml"), Fields::Strict, &mut o).unwrap_err();
        assert_eq!(
            e.to_string(),
            "n.yaml:4:10: status.alocatable: unknown field"
        );
    }
}
