//! The facts phase of a reconcile: one snapshot of the runtime's images, the disk, the sizes of
//! what is missing, and the node — turned into the admission request the policy sees. `pinset
//! plan` runs this same phase.

use crate::cri::client::CriError;
use crate::cri::proto;
use crate::reconcile::Reconciler;
use pinset_core::desired::{Desired, NodeInfo};
use pinset_policy_sdk::{AdmissionRequest, DiskFacts, Images, NodeFacts};
use pinset_registry::size::{Cached, ImageSize, Sizer};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One `ListImages` answer: the keys the runtime's images are found by (ids, repo digests,
/// repo tags), and those of the images it reports pinned.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub keys: HashSet<String>,
    pub pinned: HashSet<String>,
}

impl Snapshot {
    pub fn of(images: &[proto::Image]) -> Self {
        let mut s = Snapshot {
            keys: HashSet::with_capacity(images.len() * 2),
            pinned: HashSet::new(),
        };
        for i in images {
            let keys = std::iter::once(&i.id)
                .chain(&i.repo_digests)
                .chain(&i.repo_tags);
            if i.pinned {
                s.pinned.extend(keys.clone().cloned());
            }
            s.keys.extend(keys.cloned());
        }
        s
    }

    pub fn contains(&self, reference: &str) -> bool {
        self.keys.contains(reference)
    }

    /// Whether the runtime reports each desired image pinned, by index of `Desired::images`.
    pub fn pinned_flags(&self, desired: &Desired) -> Vec<bool> {
        desired
            .images
            .iter()
            .map(|w| self.pinned.contains(w.reference.as_str()))
            .collect()
    }

    /// Presence of each desired image, by index of `Desired::images`.
    pub fn presence(&self, desired: &Desired) -> Vec<bool> {
        desired
            .images
            .iter()
            .map(|w| self.contains(w.reference.as_str()))
            .collect()
    }
}

/// The facts of one reconcile, as the policy sees them.
#[derive(Clone, Debug)]
pub struct Facts {
    pub snapshot: Snapshot,
    /// Images of the desired state already present, by index of `Desired::images`.
    pub present: Vec<bool>,
    pub request: AdmissionRequest,
    /// Wall time of the snapshot and sizing steps.
    pub phases: Vec<(&'static str, Duration)>,
    pub sizing: Sizing,
}

/// Build the admission request from the desired state, what is present and the sizes.
pub fn request(
    desired: &Desired,
    node: NodeFacts,
    disk: DiskFacts,
    present: &[bool],
    sizes: &[Option<ImageSize>],
) -> AdmissionRequest {
    let mut images = Images::new();
    let mut layer_index: HashMap<&str, u32> = HashMap::new();
    for (i, wanted) in desired.images.iter().enumerate() {
        let size = sizes.get(i).and_then(Option::as_ref);
        let layers: Vec<u32> = size
            .map(|s| {
                s.layers
                    .iter()
                    .map(|(digest, bytes)| {
                        *layer_index
                            .entry(digest.as_str())
                            .or_insert_with(|| images.add_layer(*bytes))
                    })
                    .collect()
            })
            .unwrap_or_default();
        images.push(
            wanted.reference.as_str(),
            wanted.sets.iter().map(String::as_str),
            present.get(i).copied().unwrap_or(false),
            size.map(ImageSize::total),
            &layers,
        );
    }
    AdmissionRequest { node, disk, images }
}

impl<S: Sizer + 'static, B> Reconciler<S, B> {
    /// The facts phase: snapshot and disk (asked together), sizes of what is missing, node.
    pub async fn facts(&self, desired: &Desired, node: &NodeInfo) -> Result<Facts, CriError> {
        let started = Instant::now();
        let (listed, disk) = tokio::join!(self.cri().list_images(), self.disk());
        let (snapshot, disk) = (Snapshot::of(&listed?), disk?);
        let present = snapshot.presence(desired);
        let mut phases = vec![("snapshot", started.elapsed())];
        let started = Instant::now();
        let sizing = self.sizes(desired, &present).await;
        phases.push(("sizing", started.elapsed()));
        let request = request(
            desired,
            node.facts(&desired.pools),
            disk,
            &present,
            &sizing.sizes,
        );
        Ok(Facts {
            snapshot,
            present,
            request,
            phases,
            sizing,
        })
    }

    /// Disk facts: CRI ImageFsInfo, and the free space of that filesystem when it is visible.
    pub async fn disk(&self) -> Result<DiskFacts, CriError> {
        let fs = self.cri().image_fs_info().await?;
        let first = fs.first();
        let used = first.and_then(|f| f.used_bytes.as_ref()).map(|u| u.value);
        let space = first
            .and_then(|f| f.fs_id.as_ref())
            .map(|id| Path::new(&id.mountpoint))
            .filter(|p| p.exists())
            .and_then(crate::os::filesystem_space);
        Ok(DiskFacts {
            capacity_bytes: space.map(|(c, _)| c),
            used_bytes: used,
            available_bytes: space.map(|(_, a)| a),
        })
    }

    /// Sizes of the images not present (absent ones only: present images need no disk).
    pub async fn sizes(&self, desired: &Desired, present: &[bool]) -> Sizing {
        sizes(self.sizer(), desired, present).await
    }
}

/// One round of sizing: a size per image of the desired state (`None` where unknown), and what
/// was left unsized, summed up per registry.
#[derive(Clone, Debug, Default)]
pub struct Sizing {
    /// By index of `Desired::images`.
    pub sizes: Vec<Option<ImageSize>>,
    pub left: Vec<Unsized>,
    /// The node's mirror configuration could not be read: sized without mirrors.
    pub mirrors_error: Option<String>,
}

/// Images one registry left unsized, and the first cause.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Unsized {
    pub registry: String,
    pub images: usize,
    pub cause: String,
}

impl Sizing {
    /// One line for the node's status when sizing was incomplete or blind to the mirrors.
    pub fn warning(&self) -> Option<String> {
        let mut parts: Vec<String> = self
            .mirrors_error
            .iter()
            .map(|e| format!("mirror configuration not used: {e}"))
            .collect();
        parts.extend(self.left.iter().map(|u| {
            format!(
                "registry {}: {} image(s) left unsized: {}",
                u.registry, u.images, u.cause
            )
        }));
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Sizes of the images of `desired` that are not `present`, asked of `sizer` at once, within the
/// sizer's budget; `None` where a registry cannot tell (said once per registry, at warn), and
/// everywhere without a sizer. The sizer's configuration (the node's mirrors) is read first.
pub async fn sizes<S: Sizer + 'static>(
    sizer: Option<&Arc<Cached<S>>>,
    desired: &Desired,
    present: &[bool],
) -> Sizing {
    let mut out = Sizing {
        sizes: vec![None; desired.images.len()],
        ..Default::default()
    };
    let Some(sizer) = sizer else {
        return out;
    };
    if let Err(e) = sizer.inner().refresh() {
        tracing::warn!(error = %e, "the node's mirror configuration cannot be read: sizing without mirrors");
        out.mirrors_error = Some(e.to_string());
    }
    let mut tasks = tokio::task::JoinSet::new();
    let mut pending: HashMap<usize, String> = HashMap::new();
    for (i, wanted) in desired.images.iter().enumerate() {
        if present.get(i).copied().unwrap_or(false) {
            continue;
        }
        let (sizer, reference) = (sizer.clone(), wanted.reference.clone());
        pending.insert(i, reference.registry().to_string());
        tasks.spawn(async move { (i, sizer.size(&reference).await) });
    }
    let deadline = tokio::time::Instant::now() + sizer.budget();
    let mut failed: std::collections::BTreeMap<String, (usize, String)> = Default::default();
    loop {
        match tokio::time::timeout_at(deadline, tasks.join_next()).await {
            Ok(None) => break,
            Ok(Some(Err(_))) => continue,
            Ok(Some(Ok((i, result)))) => {
                pending.remove(&i);
                match result {
                    Ok(size) => out.sizes[i] = Some(size),
                    Err(e) => failed.entry(e.registry).or_insert((0, e.why)).0 += 1,
                }
            }
            Err(_) => {
                tasks.abort_all();
                let why = format!("not sized within the sizing budget ({:?})", sizer.budget());
                for registry in pending.into_values() {
                    failed.entry(registry).or_insert((0, why.clone())).0 += 1;
                }
                break;
            }
        }
    }
    for (registry, (images, cause)) in failed {
        tracing::warn!(%registry, images, %cause, "images left unsized: the policy is told their size is unknown");
        out.left.push(Unsized {
            registry,
            images,
            cause,
        });
    }
    out
}
