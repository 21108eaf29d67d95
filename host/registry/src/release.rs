//! A release payload read as `oc adm release info` reads it, with no `oc` and no container
//! engine: the release image resolved through the node's mirrors and credentials, its layers
//! streamed from the top one down — decompressed and untarred as they arrive, never held whole —
//! until `release-manifests/image-references` (an `ImageStream` naming every component image by
//! digest) is found, with `release-manifests/release-metadata` (the version and the versions it
//! upgrades from). A layer is read to its end so its digest is checked before anything it held
//! is believed; a whiteout in a higher layer hides the file below it, as on the node.

use crate::http::Sink;
use crate::limits::{LAYER, LAYER_REQUEST, RELEASE_FILE};
use crate::mirrors::{Endpoint, Target};
use crate::oci::Descriptor;
use crate::size::{RegistrySizer, SizeError};
use crate::tar::{Found, TarFiles};
use pinset_core::reference::ImageRef;
use std::io::Write;

pub const IMAGE_REFERENCES: &str = "release-manifests/image-references";
pub const RELEASE_METADATA: &str = "release-manifests/release-metadata";

/// One image of a release: its component name (the ImageStream tag) and its reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    pub image: String,
}

/// What a release payload says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The release image by digest, under the name it was asked by (an index's digest for a
    /// multi-architecture release).
    pub image: String,
    /// The endpoint that served it (a mirror's name when a mirror did).
    pub endpoint: String,
    /// `release-metadata`'s version, else the ImageStream's name.
    pub version: String,
    /// The versions this release upgrades from (`release-metadata`'s `previous`).
    pub previous: Vec<String>,
    pub components: Vec<Component>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{0}")]
    Resolve(#[from] SizeError),
    #[error("release {release}: layer {layer}: {why}")]
    Layer {
        release: String,
        layer: String,
        why: String,
    },
    #[error("release {release}: no layer holds {IMAGE_REFERENCES}: not a release image")]
    NoReferences { release: String },
    #[error("release {release}: {file}: {why}")]
    Malformed {
        release: String,
        file: &'static str,
        why: String,
    },
}

/// Read the release `target` names (a tag or a digest).
pub async fn read(sizer: &RegistrySizer, target: &Target) -> Result<Release, ReleaseError> {
    let (digest, endpoint) = sizer.resolve_at(target).await?;
    let image = format!("{}/{}@{digest}", target.registry, target.repository);
    let manifest = sizer
        .platform_manifest(&endpoint, &digest)
        .await
        .map_err(|e| SizeError {
            image: target.full(),
            registry: target.registry.clone(),
            unreachable: e.unreachable(),
            why: e.to_string(),
        })?;
    let files = files(sizer, &endpoint, &manifest.layers, &target.full()).await?;
    let malformed = |file, why: String| ReleaseError::Malformed {
        release: target.full(),
        file,
        why,
    };
    let stream = files
        .get(IMAGE_REFERENCES)
        .ok_or_else(|| ReleaseError::NoReferences {
            release: target.full(),
        })?;
    let (name, components) =
        image_stream(stream).map_err(|why| malformed(IMAGE_REFERENCES, why))?;
    let metadata = match files.get(RELEASE_METADATA) {
        Some(bytes) => Some(metadata(bytes).map_err(|why| malformed(RELEASE_METADATA, why))?),
        None => None,
    };
    let (version, previous) = metadata.unwrap_or((name, Vec::new()));
    Ok(Release {
        image,
        endpoint: endpoint.name(),
        version,
        previous,
        components,
    })
}

/// The release files of the image, its layers read from the top down until the references
/// are found.
async fn files(
    sizer: &RegistrySizer,
    endpoint: &Endpoint,
    layers: &[Descriptor],
    release: &str,
) -> Result<std::collections::BTreeMap<&'static str, Vec<u8>>, ReleaseError> {
    let mut out = std::collections::BTreeMap::new();
    let mut above: Vec<Found> = Vec::new();
    for layer in layers.iter().rev() {
        let found =
            read_layer(sizer, endpoint, layer)
                .await
                .map_err(|why| ReleaseError::Layer {
                    release: release.to_string(),
                    layer: layer.digest.clone(),
                    why,
                })?;
        for file in [IMAGE_REFERENCES, RELEASE_METADATA] {
            let hidden = above.iter().any(|f| f.hides(file));
            if !out.contains_key(file)
                && !hidden
                && let Some(bytes) = found.files.get(file)
            {
                out.insert(file, bytes.clone());
            }
        }
        if out.contains_key(IMAGE_REFERENCES) {
            break;
        }
        above.push(Found {
            files: Default::default(),
            whiteouts: found.whiteouts,
        });
    }
    Ok(out)
}

/// One layer, streamed through its decompressor into the tar reader; its digest checked.
async fn read_layer(
    sizer: &RegistrySizer,
    endpoint: &Endpoint,
    layer: &Descriptor,
) -> Result<Found, String> {
    let size = layer.checked_size()?;
    if size > LAYER.max_bytes {
        return Err(format!(
            "{size} bytes, more than the {} pinset reads of a release layer",
            LAYER.max_bytes
        ));
    }
    let mut sink = Decode::for_media_type(&layer.media_type)?;
    sizer
        .client()
        .blob_into(
            endpoint,
            &layer.digest,
            size,
            LAYER,
            LAYER_REQUEST,
            &mut sink,
        )
        .await
        .map_err(|e| e.to_string())?;
    sink.finish()
}

/// A layer's bytes on their way to the tar reader.
enum Decode {
    Gzip(Box<flate2::write::GzDecoder<TarFiles>>),
    Plain(Box<TarFiles>),
}

impl Decode {
    fn for_media_type(media_type: &str) -> Result<Decode, String> {
        let tar = TarFiles::new([
            (IMAGE_REFERENCES.to_string(), RELEASE_FILE.max_bytes),
            (RELEASE_METADATA.to_string(), RELEASE_FILE.max_bytes),
        ]);
        if media_type.ends_with("gzip") {
            Ok(Decode::Gzip(Box::new(flate2::write::GzDecoder::new(tar))))
        } else if media_type.ends_with("tar") {
            Ok(Decode::Plain(Box::new(tar)))
        } else {
            Err(format!(
                "media type {media_type:?}: pinset reads tar layers, plain or gzip"
            ))
        }
    }

    fn finish(self) -> Result<Found, String> {
        let tar = match self {
            Decode::Gzip(gz) => gz.finish().map_err(|e| format!("gzip: {e}"))?,
            Decode::Plain(tar) => *tar,
        };
        tar.finish().map_err(|e| e.to_string())
    }
}

impl Sink for Decode {
    fn take(&mut self, chunk: &[u8]) -> Result<(), String> {
        match self {
            Decode::Gzip(gz) => gz.write_all(chunk).map_err(|e| format!("gzip: {e}")),
            Decode::Plain(tar) => tar.feed(chunk).map_err(|e| e.to_string()),
        }
    }
}

/// The ImageStream's name and its images, each by digest.
pub fn image_stream(bytes: &[u8]) -> Result<(String, Vec<Component>), String> {
    #[derive(serde::Deserialize)]
    struct Stream {
        kind: String,
        #[serde(default)]
        metadata: Meta,
        spec: Spec,
    }
    #[derive(serde::Deserialize, Default)]
    struct Meta {
        #[serde(default)]
        name: String,
    }
    #[derive(serde::Deserialize)]
    struct Spec {
        #[serde(default)]
        tags: Vec<Tag>,
    }
    #[derive(serde::Deserialize)]
    struct Tag {
        name: String,
        from: Option<From>,
    }
    #[derive(serde::Deserialize)]
    struct From {
        kind: String,
        name: String,
    }
    let stream: Stream = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    if stream.kind != "ImageStream" {
        return Err(format!("kind {:?}, not ImageStream", stream.kind));
    }
    let mut out = Vec::with_capacity(stream.spec.tags.len());
    for tag in stream.spec.tags {
        let Some(from) = tag.from else {
            return Err(format!("tag {}: no from", tag.name));
        };
        if from.kind != "DockerImage" {
            return Err(format!(
                "tag {}: from.kind {:?}, not DockerImage",
                tag.name, from.kind
            ));
        }
        ImageRef::parse(&from.name).map_err(|e| format!("tag {}: {}: {e}", tag.name, from.name))?;
        out.push(Component {
            name: tag.name,
            image: from.name,
        });
    }
    if out.is_empty() {
        return Err("no tags: a release names its images".into());
    }
    Ok((stream.metadata.name, out))
}

/// `release-metadata`'s version and previous versions.
fn metadata(bytes: &[u8]) -> Result<(String, Vec<String>), String> {
    #[derive(serde::Deserialize)]
    struct Metadata {
        version: String,
        #[serde(default)]
        previous: Vec<String>,
    }
    let m: Metadata = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    Ok((m.version, m.previous))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

    #[test]
    fn an_image_stream_gives_every_component_by_digest() {
        let stream = format!(
            r#"{{"kind":"ImageStream","apiVersion":"image.openshift.io/v1","metadata":{{"name":"4.17.3"}},
               "spec":{{"tags":[{{"name":"etcd","from":{{"kind":"DockerImage","name":"quay.io/o/a@{D}"}}}}]}}}}"#
        );
        let (name, components) = image_stream(stream.as_bytes()).unwrap();
        assert_eq!(name, "4.17.3");
        assert_eq!(components[0].name, "etcd");
        let tagged = stream.replace(&format!("@{D}"), ":latest");
        let e = image_stream(tagged.as_bytes()).unwrap_err();
        assert!(e.starts_with("tag etcd: quay.io/o/a:latest"), "{e}");
        let e = image_stream(b"{\"kind\":\"ImageStream\",\"spec\":{\"tags\":[{\"name\":1}]}}")
            .unwrap_err();
        assert!(e.contains("line 1 column"), "{e}");
        let e = image_stream(b"{\"kind\":\"ConfigMap\",\"spec\":{}}").unwrap_err();
        assert!(e.contains("not ImageStream"), "{e}");
    }

    #[test]
    fn release_metadata_gives_the_version_and_its_predecessors() {
        let m = br#"{"kind":"cincinnati-metadata-v0","version":"4.17.3","previous":["4.16.9","4.17.2"],"metadata":{}}"#;
        assert_eq!(
            metadata(m).unwrap(),
            ("4.17.3".into(), vec!["4.16.9".into(), "4.17.2".into()])
        );
    }

    #[test]
    fn only_tar_layers_are_read() {
        assert!(Decode::for_media_type("application/vnd.oci.image.layer.v1.tar+gzip").is_ok());
        assert!(
            Decode::for_media_type("application/vnd.docker.image.rootfs.diff.tar.gzip").is_ok()
        );
        assert!(Decode::for_media_type("application/vnd.oci.image.layer.v1.tar").is_ok());
        let e = Decode::for_media_type("application/vnd.oci.image.layer.v1.tar+zstd")
            .err()
            .unwrap();
        assert!(e.contains("plain or gzip"), "{e}");
    }

    /// A gzip layer fed in small chunks gives the file; a layer that is not gzip is refused.
    #[test]
    fn a_gzip_layer_is_read_as_it_streams() {
        let tar = crate::tar::write::archive(&[(IMAGE_REFERENCES, b"{}")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        let gz = gz.finish().unwrap();
        let mut sink = Decode::for_media_type("x.tar+gzip").unwrap();
        for chunk in gz.chunks(3) {
            sink.take(chunk).unwrap();
        }
        assert_eq!(sink.finish().unwrap().files[IMAGE_REFERENCES], b"{}");
        let mut sink = Decode::for_media_type("x.tar+gzip").unwrap();
        let e = sink.take(&tar).unwrap_err();
        assert!(e.starts_with("gzip: "), "{e}");
    }
}
