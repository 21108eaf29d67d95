//! One node's reconcile: snapshot → sizes → facts → policy plan → pulls → verify → pin → status.
//!
//! The decisions come from the policy ([`crate::policy::Guarded`]); this module gathers the facts
//! it needs and carries out what it decides. See `ARCHITECTURE.md` for the whole picture.

use crate::core::desired::{Desired, NodeInfo};
use crate::core::executor::{self, Backoff, Event, Job, PullFailure, Puller};
use crate::core::plan::{self, Plan};
use crate::core::status::{NodeStatus, Progress};
use crate::cri::client::{CriClient, CriError};
use crate::cri::proto;
use crate::pin::{PinBackend, PinChange, PinError};
use crate::policy::{Guarded, PolicyModule};
use crate::registry::auth::Credentials;
use crate::registry::size::{Cached, ImageSize, Sizer};
use pinset_policy_sdk::{self as sdk, AdmissionRequest, DiskFacts, Images, NodeFacts, Pressure};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("container runtime: {0}")]
    Cri(#[from] CriError),
    #[error("pinning: {0}")]
    Pin(#[from] PinError),
}

/// The facts of one reconcile, as the policy sees them.
#[derive(Clone, Debug)]
pub struct Facts {
    pub request: AdmissionRequest,
    /// Size of each desired image, `None` when unknown, by index of `Desired::images`.
    pub sizes: Vec<Option<u64>>,
    /// Images of the desired state already present.
    pub present: Vec<bool>,
}

/// What a reconcile did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub plan: Option<Plan>,
    pub outcome: executor::Outcome,
    pub pin: Option<PinChange>,
    /// Desired images present after the pulls.
    pub present_after: usize,
    /// Wall time of each step, in order.
    pub phases: Vec<(&'static str, std::time::Duration)>,
    pub cancelled: bool,
}

/// Node facts for the policy.
pub fn node_facts(node: &NodeInfo, pools: &[String]) -> NodeFacts {
    NodeFacts {
        name: node.name.clone(),
        labels: node
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        pools: pools.to_vec(),
        control_plane: sdk::is_control_plane(node.labels.keys().map(String::as_str)),
        ready: node.ready,
        disk_pressure: node.disk_pressure,
        allocatable_ephemeral_bytes: node.allocatable_ephemeral_bytes,
    }
}

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

/// Pulls through CRI with the credentials of the image's registry.
#[derive(Clone)]
pub struct CriPuller {
    pub cri: CriClient,
    pub credentials: Arc<Credentials>,
}

impl Puller for CriPuller {
    async fn pull(&self, reference: &str) -> Result<(), PullFailure> {
        let auth = crate::core::reference::ImageRef::parse(reference)
            .ok()
            .and_then(|r| self.credentials.for_pull(r.registry(), r.repository()));
        self.cri
            .pull_image(reference, auth)
            .await
            .map(drop)
            .map_err(|e| PullFailure {
                no_space: e.is_no_space(),
                message: e.to_string(),
            })
    }
}

/// Everything a node needs to reconcile.
pub struct Reconciler<S, B> {
    pub cri: CriClient,
    pub sizer: Option<Arc<Cached<S>>>,
    pub credentials: Arc<Credentials>,
    pub pins: B,
    pub policy: PolicyModule,
    pub backoff: Backoff,
    pub pressure: fn() -> Pressure,
    pub metrics: Option<crate::metrics::Metrics>,
}

impl<S: Sizer + 'static, B: PinBackend> Reconciler<S, B> {
    /// Disk facts: CRI ImageFsInfo, and the free space of that filesystem when it is visible.
    pub async fn disk(&self) -> Result<DiskFacts, CriError> {
        let fs = self.cri.image_fs_info().await?;
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
    pub async fn sizes(&self, desired: &Desired, present: &[bool]) -> Vec<Option<ImageSize>> {
        let Some(sizer) = &self.sizer else {
            return vec![None; desired.images.len()];
        };
        let mut tasks = tokio::task::JoinSet::new();
        for (i, wanted) in desired.images.iter().enumerate() {
            if present[i] {
                continue;
            }
            let (sizer, reference) = (sizer.clone(), wanted.reference.clone());
            tasks.spawn(async move { (i, sizer.size(&reference).await) });
        }
        let mut out = vec![None; desired.images.len()];
        while let Some(joined) = tasks.join_next().await {
            let Ok((i, result)) = joined else { continue };
            match result {
                Ok(size) => out[i] = Some(size),
                Err(e) => tracing::warn!(error = %e, "image size unknown; the policy is told so"),
            }
        }
        out
    }

    /// Reconcile the node towards `desired`, updating `status`. Returns early (nothing pinned,
    /// status still Progressing) when `cancel` fires.
    pub async fn reconcile(
        &self,
        desired: &Desired,
        node: &NodeInfo,
        status: &mut NodeStatus,
        cancel: CancellationToken,
        events: Option<UnboundedSender<Event>>,
    ) -> Result<Report, ReconcileError> {
        let result = self
            .reconcile_inner(desired, node, status, cancel, events)
            .await;
        if let Err(e) = &result {
            let msg = e.to_string();
            for set in &desired.sets {
                status.fail(&set.name, set.generation, &msg);
            }
            status.finish(Some(msg));
        }
        result
    }

    async fn reconcile_inner(
        &self,
        desired: &Desired,
        node: &NodeInfo,
        status: &mut NodeStatus,
        cancel: CancellationToken,
        events: Option<UnboundedSender<Event>>,
    ) -> Result<Report, ReconcileError> {
        // 1. One snapshot of the store, and the disk (independent calls, asked together).
        let started = Instant::now();
        let (listed, disk) = tokio::join!(self.cri.list_images(), self.disk());
        let (snapshot, disk) = (Snapshot::of(&listed?), disk?);
        let present: Vec<bool> = desired
            .images
            .iter()
            .map(|w| snapshot.contains(w.reference.as_str()))
            .collect();
        let mut phases = vec![("snapshot", started.elapsed())];
        // 2–3. Sizes of what is missing; disk and node facts.
        let started = Instant::now();
        let sizes = self.sizes(desired, &present).await;
        phases.push(("sizing", started.elapsed()));
        let started = Instant::now();
        let request = request(
            desired,
            node_facts(node, &desired.pools),
            disk,
            &present,
            &sizes,
        );
        // 4. The policy's plan.
        let mut guarded = Guarded::new(Box::new(self.policy.instance()));
        if let Some(m) = &self.metrics {
            guarded = guarded.with_metrics(m.clone());
        }
        let plan = plan::make(&mut guarded, &request);
        phases.push(("policy", started.elapsed()));
        let planned_bytes: u64 = plan
            .pulls
            .iter()
            .filter_map(|&i| request.images.get(i as usize).and_then(|i| i.size_bytes))
            .sum();
        let done = present.iter().filter(|p| **p).count() as u64;
        status.start(
            desired,
            Progress {
                images_done: done,
                images_total: desired.images.len() as u64,
                bytes_done: 0,
                bytes_total: planned_bytes,
            },
        );
        tracing::info!(
            node = %node.name,
            policy = guarded.policy_name(),
            verdict = ?plan.admission.verdict,
            reason = %plan.admission.reason,
            pulls = plan.pulls.len(),
            concurrency = plan.concurrency,
            "plan"
        );

        // 5. Pulls.
        if let Some(out) = &events {
            let _ = out.send(Event::Planned {
                pulls: plan.pulls.len() as u64,
                bytes: planned_bytes,
                present: done,
            });
        }
        let jobs: Vec<Job> = plan
            .pulls
            .iter()
            .map(|&i| {
                let image = request
                    .images
                    .get(i as usize)
                    .expect("plan indices are valid");
                Job {
                    reference: image.reference.to_string(),
                    bytes: image.size_bytes,
                }
            })
            .collect();
        let policy = Arc::new(Mutex::new(guarded));
        let puller = CriPuller {
            cri: self.cri.clone(),
            credentials: self.credentials.clone(),
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let run = executor::run(
            jobs,
            plan.concurrency,
            puller,
            policy.clone(),
            request.node.clone(),
            self.pressure,
            self.backoff,
            cancel.clone(),
            Some(tx),
        );
        let track = async {
            while let Some(event) = rx.recv().await {
                match &event {
                    Event::Pulled {
                        bytes, duration, ..
                    } => {
                        status.advance(1, bytes.unwrap_or(0));
                        if let Some(m) = &self.metrics {
                            m.observe_pull(Ok(*bytes), *duration);
                        }
                    }
                    Event::Failed { .. } => {
                        if let Some(m) = &self.metrics {
                            m.observe_pull(Err(()), std::time::Duration::ZERO);
                        }
                    }
                    _ => {}
                }
                if let Some(out) = &events {
                    let _ = out.send(event);
                }
            }
        };
        let started = Instant::now();
        let (outcome, ()) = tokio::join!(run, track);
        phases.push(("pulls", started.elapsed()));
        let fallbacks = policy.lock().expect("policy lock").take_fallbacks();
        status.policy_fallbacks = fallbacks.iter().map(|f| f.to_string()).collect();
        let mut report = Report {
            plan: Some(plan.clone()),
            outcome,
            ..Default::default()
        };
        if report.outcome.cancelled || cancel.is_cancelled() {
            report.cancelled = true;
            report.phases = phases;
            return Ok(report);
        }
        let started = Instant::now();

        // 6. Verify with one more snapshot (none needed when nothing was pulled: the first one
        // is still the truth), then pin the sets that are complete.
        let after = if report.outcome.pulled.is_empty() {
            snapshot
        } else {
            Snapshot::of(&self.cri.list_images().await?)
        };
        let present_after: Vec<bool> = desired
            .images
            .iter()
            .map(|w| after.contains(w.reference.as_str()))
            .collect();
        phases.push(("verify", started.elapsed()));
        report.present_after = present_after.iter().filter(|p| **p).count();
        let errors: HashMap<&str, &str> = report
            .outcome
            .failed
            .iter()
            .map(|(r, e)| (r.as_str(), e.as_str()))
            .collect();
        let mut pin = BTreeSet::new();
        let mut failures = Vec::new();
        let mut complete = Vec::new();
        for set in &desired.sets {
            let missing: Vec<&str> = set
                .images
                .iter()
                .filter(|&&i| !present_after[i])
                .map(|&i| desired.images[i].reference.as_str())
                .collect();
            if missing.is_empty() {
                pin.extend(
                    set.images
                        .iter()
                        .map(|&i| desired.images[i].reference.to_string()),
                );
                complete.push(set);
                continue;
            }
            let why = missing_reason(&missing, &errors, &plan, &report.outcome);
            status.fail(&set.name, set.generation, &why);
            failures.push(format!("PinnedImageSet {}: {why}", set.name));
        }
        for invalid in &desired.invalid {
            failures.push(invalid.to_string());
        }
        let started = Instant::now();
        let change = if self.pins.satisfied(&pin, &after.pinned) {
            PinChange::default()
        } else {
            self.pins.apply(&pin).await?
        };
        // A set is done when the runtime itself reports its images pinned.
        let unconfirmed = if change.applied {
            self.confirm_pins(&pin, &change.unpinned).await?
        } else {
            BTreeSet::new()
        };
        for set in complete {
            let not_pinned: Vec<&str> = set
                .images
                .iter()
                .map(|&i| desired.images[i].reference.as_str())
                .filter(|r| unconfirmed.contains(*r))
                .collect();
            if not_pinned.is_empty() {
                status.succeed(&set.name, set.generation);
            } else {
                let why = format!(
                    "the {} back end pinned {} image(s) but the runtime does not report them pinned after {:?}: {}",
                    self.pins.name(),
                    not_pinned.len(),
                    PIN_CONFIRM_TIMEOUT,
                    not_pinned.join(", ")
                );
                status.fail(&set.name, set.generation, &why);
                failures.push(format!("PinnedImageSet {}: {why}", set.name));
            }
        }
        report.pin = Some(change);
        phases.push(("pin", started.elapsed()));
        report.phases = phases;
        status.finish((!failures.is_empty()).then(|| failures.join("; ")));
        Ok(report)
    }
}

/// How long the runtime may take to report a pin change (containerd's CRI plugin learns of
/// label changes from its event stream; CRI-O re-reads its configuration on reload).
pub const PIN_CONFIRM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl<S: Sizer + 'static, B: PinBackend> Reconciler<S, B> {
    /// Wait until the runtime reports `pinned` pinned and `unpinned` not; returns the images
    /// still not reported pinned when [`PIN_CONFIRM_TIMEOUT`] runs out.
    async fn confirm_pins(
        &self,
        pinned: &BTreeSet<String>,
        unpinned: &[String],
    ) -> Result<BTreeSet<String>, CriError> {
        let deadline = Instant::now() + PIN_CONFIRM_TIMEOUT;
        // containerd usually reports within a few milliseconds: look again soon, then less often.
        let mut pause = std::time::Duration::from_millis(5);
        loop {
            let snapshot = Snapshot::of(&self.cri.list_images().await?);
            let missing: BTreeSet<String> = pinned
                .iter()
                .filter(|i| !snapshot.pinned.contains(*i))
                .cloned()
                .collect();
            let lingering = unpinned.iter().any(|i| snapshot.pinned.contains(i));
            if (missing.is_empty() && !lingering) || Instant::now() >= deadline {
                if lingering {
                    tracing::warn!("the runtime still reports unpinned images as pinned");
                }
                return Ok(missing);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(200));
        }
    }
}

/// Why images of a set are missing, naming them.
fn missing_reason(
    missing: &[&str],
    errors: &HashMap<&str, &str>,
    plan: &Plan,
    outcome: &executor::Outcome,
) -> String {
    const SHOWN: usize = 5;
    let mut parts: Vec<String> = missing
        .iter()
        .take(SHOWN)
        .map(|m| match errors.get(m) {
            Some(e) => format!("{m}: {e}"),
            None if plan.rejected() => format!("{m}: not admitted: {}", plan.admission.reason),
            None if outcome.drained.iter().any(|d| d == m) => {
                format!(
                    "{m}: not pulled: the disk filled up ({})",
                    outcome.no_space.as_deref().unwrap_or("")
                )
            }
            None => format!("{m}: not admitted by the policy: {}", plan.admission.reason),
        })
        .collect();
    if missing.len() > SHOWN {
        parts.push(format!("and {} more", missing.len() - SHOWN));
    }
    format!("{} image(s) missing: {}", missing.len(), parts.join("; "))
}
