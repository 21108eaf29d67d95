//! Kubernetes objects read from YAML files (`PinnedImageSet`, `MachineConfigPool`, `Node`), as
//! in the seed's examples, turned into the core's types. Files may hold several documents;
//! directories are read for their `*.yaml`/`*.yml` files; other kinds are skipped.

use crate::core::desired::{NodeInfo, PinnedImageSet, Pool};
use crate::core::quantity::parse_bytes;
use crate::core::selector::LabelSelector;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: document {doc}: {source}")]
    Parse {
        path: PathBuf,
        doc: usize,
        source: serde_yaml::Error,
    },
    #[error("{path}: {kind} {name}: {why}")]
    Invalid {
        path: PathBuf,
        kind: String,
        name: String,
        why: String,
    },
}

#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub sets: Vec<PinnedImageSet>,
    pub pools: Vec<Pool>,
    pub nodes: Vec<NodeInfo>,
}

#[derive(Deserialize)]
struct Meta {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    generation: Option<i64>,
}

#[derive(Deserialize)]
struct Doc {
    kind: Option<String>,
    metadata: Option<Meta>,
    #[serde(default)]
    spec: serde_yaml::Value,
    #[serde(default)]
    status: serde_yaml::Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SetSpec {
    #[serde(default)]
    pinned_images: Vec<Named>,
}

#[derive(Deserialize)]
struct Named {
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PoolSpec {
    #[serde(default)]
    machine_config_selector: LabelSelector,
    #[serde(default)]
    node_selector: LabelSelector,
    pinned_image_sets: Option<Vec<Named>>,
}

#[derive(Deserialize, Default)]
struct NodeStatus {
    #[serde(default)]
    conditions: Vec<Condition>,
    #[serde(default)]
    allocatable: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

/// The `*.yaml` and `*.yml` files of a directory, sorted.
pub fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    Ok(files)
}

/// Read every object of `paths` (files or directories).
pub fn load(paths: &[PathBuf]) -> Result<Objects, ObjectError> {
    let mut out = Objects::default();
    for path in paths {
        if path.is_dir() {
            let files = yaml_files(path).map_err(|source| ObjectError::Read {
                path: path.clone(),
                source,
            })?;
            for f in files {
                load_file(&f, &mut out)?;
            }
        } else {
            load_file(path, &mut out)?;
        }
    }
    Ok(out)
}

pub fn load_file(path: &Path, out: &mut Objects) -> Result<(), ObjectError> {
    let text = std::fs::read_to_string(path).map_err(|source| ObjectError::Read {
        path: path.into(),
        source,
    })?;
    parse(&text, path, out)
}

pub fn parse(text: &str, path: &Path, out: &mut Objects) -> Result<(), ObjectError> {
    for (n, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let parse_err = |source| ObjectError::Parse {
            path: path.into(),
            doc: n + 1,
            source,
        };
        let value = serde_yaml::Value::deserialize(de).map_err(parse_err)?;
        if value.is_null() {
            continue;
        }
        let doc: Doc = serde_yaml::from_value(value).map_err(parse_err)?;
        let (Some(kind), Some(meta)) = (doc.kind, doc.metadata) else {
            continue;
        };
        let invalid = |why: String| ObjectError::Invalid {
            path: path.into(),
            kind: kind.clone(),
            name: meta.name.clone(),
            why,
        };
        match kind.as_str() {
            "PinnedImageSet" => {
                let spec: SetSpec =
                    serde_yaml::from_value(doc.spec).map_err(|e| invalid(e.to_string()))?;
                out.sets.push(PinnedImageSet {
                    name: meta.name.clone(),
                    generation: meta.generation.unwrap_or(1).max(1),
                    labels: meta.labels.clone(),
                    images: spec.pinned_images.into_iter().map(|i| i.name).collect(),
                });
            }
            "MachineConfigPool" => {
                let spec: PoolSpec = if doc.spec.is_null() {
                    PoolSpec::default()
                } else {
                    serde_yaml::from_value(doc.spec).map_err(|e| invalid(e.to_string()))?
                };
                out.pools.push(Pool {
                    name: meta.name.clone(),
                    machine_config_selector: spec.machine_config_selector,
                    node_selector: spec.node_selector,
                    pinned_image_sets: spec
                        .pinned_image_sets
                        .map(|v| v.into_iter().map(|n| n.name).collect()),
                });
            }
            "Node" => {
                let status: NodeStatus = if doc.status.is_null() {
                    NodeStatus::default()
                } else {
                    serde_yaml::from_value(doc.status).map_err(|e| invalid(e.to_string()))?
                };
                let condition = |t: &str| {
                    status
                        .conditions
                        .iter()
                        .find(|c| c.kind == t)
                        .map(|c| c.status == "True")
                };
                let allocatable = match status.allocatable.get("ephemeral-storage") {
                    Some(q) => Some(parse_bytes(q).map_err(|e| invalid(e.to_string()))?),
                    None => None,
                };
                out.nodes.push(NodeInfo {
                    name: meta.name.clone(),
                    labels: meta.labels.clone(),
                    ready: condition("Ready").unwrap_or(false),
                    disk_pressure: condition("DiskPressure").unwrap_or(false),
                    allocatable_ephemeral_bytes: allocatable,
                });
            }
            _ => {}
        }
    }
    Ok(())
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
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
"#;
        let mut o = Objects::default();
        parse(text, Path::new("x.yaml"), &mut o).unwrap();
        assert_eq!(o.sets.len(), 1);
        assert_eq!(o.sets[0].generation, 1);
        assert_eq!(o.sets[0].images.len(), 1);
        let n = &o.nodes[0];
        assert!(n.ready && !n.disk_pressure);
        assert_eq!(n.allocatable_ephemeral_bytes, Some(120 << 30));
    }

    #[test]
    fn bad_documents_are_named() {
        let mut o = Objects::default();
        let e = parse(
            "kind: Node\nmetadata: {name: n}\nstatus: {allocatable: {ephemeral-storage: lots}}\n",
            Path::new("n.yaml"),
            &mut o,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("n.yaml") && e.contains("Node n") && e.contains("lots"),
            "{e}"
        );
        let e = parse("a: [\n", Path::new("bad.yaml"), &mut o)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.yaml: document 1"), "{e}");
    }
}
