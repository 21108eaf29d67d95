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
use serde::Deserialize;
use serde::de::DeserializeOwned;
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
    pub sets: Vec<desired::PinnedImageSet>,
    pub pools: Vec<Pool>,
    pub nodes: Vec<NodeInfo>,
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
pub fn load(paths: &[PathBuf]) -> Result<Objects, ObjectError> {
    let mut out = Objects::default();
    for path in paths {
        if path.is_dir() {
            let files = pinset_core::yaml_files(path).map_err(|source| ObjectError::Read {
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
        let mut value = serde_yaml::Value::deserialize(de).map_err(parse_err)?;
        if value.is_null() {
            continue;
        }
        let head: Head = serde_yaml::from_value(value.clone()).map_err(parse_err)?;
        let (Some(kind), Some(meta)) = (head.kind, head.metadata) else {
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
                let set: PinnedImageSet = typed(value).map_err(invalid)?;
                out.sets.push(convert::set(&set));
            }
            "MachineConfigPool" => {
                // A pool without a spec selects nothing, as in the API.
                if let Some(map) = value.as_mapping_mut() {
                    map.entry("spec".into())
                        .or_insert_with(|| serde_yaml::Mapping::new().into());
                }
                let pool: MachineConfigPool = typed(value).map_err(invalid)?;
                out.pools
                    .push(convert::pool(&pool).map_err(|e| invalid(e.to_string()))?);
            }
            "Node" => {
                quantities_as_strings(&mut value);
                let node: Node = typed(value).map_err(invalid)?;
                out.nodes
                    .push(convert::node(&node).map_err(|e| invalid(e.to_string()))?);
            }
            _ => {}
        }
    }
    Ok(())
}

/// `allocatable: {ephemeral-storage: 120000000000}` is a quantity to Kubernetes, a number to
/// YAML: read unquoted numbers there as the quantities they are.
fn quantities_as_strings(node: &mut serde_yaml::Value) {
    for field in ["allocatable", "capacity"] {
        let Some(map) = node
            .get_mut("status")
            .and_then(|s| s.get_mut(field))
            .and_then(|m| m.as_mapping_mut())
        else {
            continue;
        };
        for (_, v) in map.iter_mut() {
            if let serde_yaml::Value::Number(n) = v {
                *v = serde_yaml::Value::String(n.to_string());
            }
        }
    }
}

/// A document as its API type.
fn typed<T: DeserializeOwned>(value: serde_yaml::Value) -> Result<T, String> {
    serde_yaml::from_value(value).map_err(|e| e.to_string())
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
        parse(text, Path::new("x.yaml"), &mut o).unwrap();
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
            parse(&text, Path::new("n.yaml"), &mut o)
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
        let e = parse(
            "kind: PinnedImageSet\nmetadata: {name: s}\nspec: {pinnedImages: 3}\n",
            Path::new("s.yaml"),
            &mut o,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("s.yaml: PinnedImageSet s"), "{e}");
    }
}
