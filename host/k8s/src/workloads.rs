//! The images Kubernetes objects run, read from manifests as `kubectl apply -f` reads them (the
//! output of `helm template` or `kubectl kustomize`, an operator bundle's manifests): every pod
//! template of Pod, Deployment, ReplicaSet, ReplicationController, StatefulSet, DaemonSet, Job,
//! CronJob and PodTemplate, and OLM's ClusterServiceVersion (`spec.relatedImages[]` and its
//! install deployments); in each, containers, init containers, ephemeral containers and image
//! volumes (`volumes[].image.reference`). `List` objects are read item by item. A field of the
//! wrong type is an error at its line and column.

use pinset_core::yaml::{Document, YamlError};
use serde_json::Value;

/// One image an object uses, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Used {
    pub image: String,
    /// `Kind/name`, then where in it (`container web`, `relatedImages etcd`).
    pub object: String,
    /// The field path in the document (`spec.template.spec.containers[0].image`).
    pub path: String,
}

/// What one document holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Read {
    pub used: Vec<Used>,
    /// Kinds not read (they run no pod), with how many objects of each.
    pub skipped: Vec<String>,
}

/// The images of the object (or `List`) in `doc`.
pub fn images(doc: &Document) -> Result<Read, YamlError> {
    let mut out = Read::default();
    object(doc, &doc.value, "", &mut out)?;
    Ok(out)
}

fn object(doc: &Document, value: &Value, at: &str, out: &mut Read) -> Result<(), YamlError> {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let join = |field: &str| join(at, field);
    let pod_spec = match kind {
        "List" => {
            for (i, item) in array(doc, value, "items", &join("items"))?
                .iter()
                .enumerate()
            {
                object(doc, item, &format!("{}[{i}]", join("items")), out)?;
            }
            return Ok(());
        }
        "Pod" => Some("spec"),
        "Deployment"
        | "ReplicaSet"
        | "ReplicationController"
        | "StatefulSet"
        | "DaemonSet"
        | "Job" => Some("spec.template.spec"),
        "CronJob" => Some("spec.jobTemplate.spec.template.spec"),
        "PodTemplate" => Some("template.spec"),
        "ClusterServiceVersion" => None,
        _ => {
            out.skipped.push(if kind.is_empty() {
                "(no kind)".into()
            } else {
                kind.to_string()
            });
            return Ok(());
        }
    };
    let owner = format!("{kind}/{name}");
    match pod_spec {
        Some(path) => {
            if let Some(spec) = field(value, path) {
                pod(doc, spec, &join(path), &owner, out)?;
            }
        }
        None => csv(doc, value, at, &owner, out)?,
    }
    Ok(())
}

/// A ClusterServiceVersion: its related images and its install deployments' pods.
fn csv(
    doc: &Document,
    value: &Value,
    at: &str,
    owner: &str,
    out: &mut Read,
) -> Result<(), YamlError> {
    let join = |field: &str| join(at, field);
    let related = field(value, "spec").map_or(Ok(&[][..]), |spec| {
        array(doc, spec, "relatedImages", &join("spec.relatedImages"))
    })?;
    for (i, entry) in related.iter().enumerate() {
        let path = format!("{}[{i}].image", join("spec.relatedImages"));
        if let Some(image) = string(doc, entry, "image", &path)? {
            let name = entry.get("name").and_then(Value::as_str).unwrap_or("");
            out.used.push(Used {
                image,
                object: format!("{owner} relatedImages {name}"),
                path,
            });
        }
    }
    let install = "spec.install.spec.deployments";
    let deployments = match field(value, "spec.install.spec") {
        Some(spec) => array(doc, spec, "deployments", &join(install))?,
        None => &[],
    };
    for (i, d) in deployments.iter().enumerate() {
        let name = d.get("name").and_then(Value::as_str).unwrap_or("");
        let base = format!("{}[{i}].spec.template.spec", join(install));
        if let Some(spec) = field(d, "spec.template.spec") {
            pod(doc, spec, &base, &format!("{owner} deployment {name}"), out)?;
        }
    }
    Ok(())
}

/// A pod spec's images.
fn pod(
    doc: &Document,
    spec: &Value,
    at: &str,
    owner: &str,
    out: &mut Read,
) -> Result<(), YamlError> {
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        let items = array(doc, spec, list, &format!("{at}.{list}"))?;
        for (i, c) in items.iter().enumerate() {
            let path = format!("{at}.{list}[{i}].image");
            if let Some(image) = string(doc, c, "image", &path)? {
                let name = c.get("name").and_then(Value::as_str).unwrap_or("");
                let what = match list {
                    "initContainers" => "init container",
                    "ephemeralContainers" => "ephemeral container",
                    _ => "container",
                };
                out.used.push(Used {
                    image,
                    object: format!("{owner} {what} {name}"),
                    path,
                });
            }
        }
    }
    let volumes = array(doc, spec, "volumes", &format!("{at}.volumes"))?;
    for (i, v) in volumes.iter().enumerate() {
        let path = format!("{at}.volumes[{i}].image.reference");
        if let Some(image) = v.get("image")
            && let Some(reference) = string(doc, image, "reference", &path)?
        {
            let name = v.get("name").and_then(Value::as_str).unwrap_or("");
            out.used.push(Used {
                image: reference,
                object: format!("{owner} volume {name}"),
                path,
            });
        }
    }
    Ok(())
}

/// `field` under the path `at` (the document's root when empty).
fn join(at: &str, field: &str) -> String {
    if at.is_empty() {
        field.to_string()
    } else {
        format!("{at}.{field}")
    }
}

/// The value at a dotted path of plain field names.
fn field<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, f| v.get(f))
}

/// `value[name]` as an array: absent or null is empty; another type is an error at `path`.
fn array<'a>(
    doc: &Document,
    value: &'a Value,
    name: &str,
    path: &str,
) -> Result<&'a [Value], YamlError> {
    match value.get(name) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(doc.error(path, "expected a list")),
    }
}

/// `value[name]` as a non-empty string: absent, null or empty is none; another type an error.
fn string(
    doc: &Document,
    value: &Value,
    name: &str,
    path: &str,
) -> Result<Option<String>, YamlError> {
    match value.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
        Some(_) => Err(doc.error(path, "expected a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_core::yaml::documents;

    fn read(text: &str) -> Result<Vec<Read>, YamlError> {
        documents(text)?.iter().map(images).collect()
    }

    #[test]
    fn every_pod_template_and_every_kind_of_container_is_read() {
        let text = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  template:
    spec:
      initContainers: [{name: migrate, image: "q.io/app/migrate:1"}]
      containers: [{name: web, image: "q.io/app/web:1"}, {name: side, image: ""}]
      ephemeralContainers: [{name: debug, image: busybox}]
      volumes: [{name: models, image: {reference: "q.io/app/models:v3"}}, {name: tmp, emptyDir: {}}]
---
kind: CronJob
metadata: {name: backup}
spec: {jobTemplate: {spec: {template: {spec: {containers: [{name: b, image: "q.io/b:2"}]}}}}}
---
kind: List
items:
- {kind: Pod, metadata: {name: p}, spec: {containers: [{name: c, image: "q.io/p:1"}]}}
- {kind: ConfigMap, metadata: {name: cm}}
---
kind: ClusterServiceVersion
metadata: {name: etcd-operator.v1}
spec:
  relatedImages: [{name: etcd, image: "q.io/etcd@sha256:abc"}]
  install: {spec: {deployments: [{name: op, spec: {template: {spec: {containers: [{name: o, image: "q.io/op:1"}]}}}}]}}
"#;
        let reads = read(text).unwrap();
        let images: Vec<&str> = reads
            .iter()
            .flat_map(|r| r.used.iter().map(|u| u.image.as_str()))
            .collect();
        assert_eq!(
            images,
            [
                "q.io/app/migrate:1",
                "q.io/app/web:1",
                "busybox",
                "q.io/app/models:v3",
                "q.io/b:2",
                "q.io/p:1",
                "q.io/etcd@sha256:abc",
                "q.io/op:1"
            ]
        );
        assert_eq!(reads[2].skipped, ["ConfigMap"]);
        assert_eq!(
            reads[0].used[0].object,
            "Deployment/web init container migrate"
        );
        assert_eq!(reads[2].used[0].path, "items[0].spec.containers[0].image");
    }

    #[test]
    fn a_field_of_the_wrong_type_is_an_error_at_its_place() {
        let e = read(
            "kind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: 3\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.col), (6, 5), "{e}");
        assert!(e.to_string().contains("expected a string"), "{e}");
        let e = read("kind: Pod\nspec:\n  containers: {a: 1}\n").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
    }
}
