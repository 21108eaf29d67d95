//! containerd pins an image that carries the label `io.cri-containerd.pinned=pinned`; its CRI
//! plugin then reports `pinned: true` and the kubelet never collects the image.
//!
//! Labels are set and removed through containerd's images API in the `k8s.io` namespace (where
//! the CRI plugin keeps its images). pinset also labels what it pinned as its own, so that it
//! unpins only those: an image pinned by someone else is left alone.

use super::{PinBackend, PinChange, PinError};
use crate::cri::client::{socket_path, unix_channel};
use crate::cri::containerd_proto::{
    GetImageRequest, ListImagesRequest, UpdateImageRequest, images_client::ImagesClient,
};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::Channel;

pub const PIN_LABEL: &str = "io.cri-containerd.pinned";
pub const PIN_VALUE: &str = "pinned";
/// Marks the pins pinset made.
pub const MANAGED_LABEL: &str = "io.pinset.managed";
pub const CRI_NAMESPACE: &str = "k8s.io";
/// Label updates sent to containerd at once.
const LABEL_UPDATES_IN_FLIGHT: usize = 8;

pub struct ContainerdPins {
    /// The pins this process last applied; `None` until the first apply.
    last: std::sync::Mutex<Option<BTreeSet<String>>>,
    socket: PathBuf,
    namespace: String,
    client: ImagesClient<Channel>,
    timeout: Duration,
}

impl ContainerdPins {
    /// `endpoint`: containerd's socket (`unix:///run/containerd/containerd.sock`), which also
    /// serves CRI.
    pub fn new(endpoint: &str) -> Result<Self, crate::cri::client::CriError> {
        let socket = socket_path(endpoint)?;
        let channel = unix_channel(&socket, Duration::from_secs(5));
        Ok(Self {
            last: std::sync::Mutex::new(None),
            socket,
            namespace: CRI_NAMESPACE.into(),
            client: ImagesClient::new(channel),
            timeout: Duration::from_secs(30),
        })
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut().insert(
            "containerd-namespace",
            self.namespace.parse().expect("namespace is ASCII"),
        );
        r.set_timeout(self.timeout);
        r
    }

    fn error(&self, call: &'static str, image: &str, status: tonic::Status) -> PinError {
        PinError::Containerd {
            socket: self.socket.clone(),
            call,
            image: image.to_string(),
            message: format!("{:?}: {}", status.code(), status.message()),
        }
    }

    /// Images pinset labelled earlier, and among them those still carrying the pin label.
    pub async fn managed(&self) -> Result<(BTreeSet<String>, BTreeSet<String>), PinError> {
        let filter = format!("labels.\"{MANAGED_LABEL}\"==true");
        let r = self
            .client
            .clone()
            .list(self.request(ListImagesRequest {
                filters: vec![filter],
            }))
            .await
            .map_err(|s| self.error("List", "*", s))?;
        let images = r.into_inner().images;
        let pinned = images
            .iter()
            .filter(|i| i.labels.get(PIN_LABEL).map(String::as_str) == Some(PIN_VALUE))
            .map(|i| i.name.clone())
            .collect();
        Ok((images.into_iter().map(|i| i.name).collect(), pinned))
    }

    /// Pin `pinned` and unpin `unpinned`: independent records, updated a few at a time rather
    /// than one round trip after another; the first failure is returned.
    async fn set_all(&self, pinned: &[String], unpinned: &[String]) -> Result<(), PinError> {
        let mut changes = pinned
            .iter()
            .map(|i| (i.as_str(), true))
            .chain(unpinned.iter().map(|i| (i.as_str(), false)));
        let mut in_flight = FuturesUnordered::new();
        loop {
            while in_flight.len() < LABEL_UPDATES_IN_FLIGHT {
                let Some((image, pin)) = changes.next() else {
                    break;
                };
                in_flight.push(self.set_labels(image, pin));
            }
            match in_flight.next().await {
                Some(done) => done?,
                None => return Ok(()),
            }
        }
    }

    async fn set_labels(&self, image: &str, pin: bool) -> Result<(), PinError> {
        // containerd's Update needs the whole record (it reads the target), so fetch it first.
        let current = match self
            .client
            .clone()
            .get(self.request(GetImageRequest { name: image.into() }))
            .await
        {
            Ok(r) => r.into_inner().image,
            // An image removed by hand has nothing left to unpin.
            Err(s) if !pin && s.code() == tonic::Code::NotFound => return Ok(()),
            Err(s) => return Err(self.error("Get", image, s)),
        };
        let Some(mut record) = current else {
            return if pin {
                Err(self.error("Get", image, tonic::Status::not_found("no image record")))
            } else {
                Ok(())
            };
        };
        if pin {
            record.labels.insert(PIN_LABEL.into(), PIN_VALUE.into());
            record.labels.insert(MANAGED_LABEL.into(), "true".into());
        } else {
            record.labels.remove(PIN_LABEL);
            record.labels.remove(MANAGED_LABEL);
        }
        // Only these two labels change; a named label path with no value removes the label.
        let paths = vec![
            format!("labels.{PIN_LABEL}"),
            format!("labels.{MANAGED_LABEL}"),
        ];
        let req = UpdateImageRequest {
            image: Some(record),
            update_mask: Some(prost_types::FieldMask { paths }),
        };
        self.client
            .clone()
            .update(self.request(req))
            .await
            .map(drop)
            .map_err(|s| self.error("Update", image, s))
    }
}

impl PinBackend for ContainerdPins {
    fn name(&self) -> &'static str {
        "containerd"
    }

    /// The same pins as last applied, and the runtime still reports every one of them pinned
    /// (a label removed by hand shows as not pinned, and is put back by `apply`).
    fn satisfied(
        &self,
        images: &BTreeSet<String>,
        runtime_pinned: &std::collections::HashSet<String>,
    ) -> bool {
        let last = self.last.lock().expect("pin cache");
        last.as_ref() == Some(images) && images.iter().all(|i| runtime_pinned.contains(i))
    }

    async fn apply(
        &self,
        images: &BTreeSet<String>,
        _runtime_pinned: &std::collections::HashSet<String>,
    ) -> Result<PinChange, PinError> {
        let (managed, still_pinned) = self.managed().await?;
        let pinned: Vec<String> = images.difference(&still_pinned).cloned().collect();
        let unpinned: Vec<String> = managed.difference(images).cloned().collect();
        self.set_all(&pinned, &unpinned).await?;
        *self.last.lock().expect("pin cache") = Some(images.clone());
        let applied = !pinned.is_empty() || !unpinned.is_empty();
        if applied {
            tracing::info!(pinned = pinned.len(), unpinned = unpinned.len(), socket = %self.socket.display(), "containerd pin labels updated");
        }
        Ok(PinChange {
            pinned,
            unpinned,
            applied,
            drift: Vec::new(),
        })
    }
}
