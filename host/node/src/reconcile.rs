//! One node's reconcile, as its phases: facts → plan → pulls → verify → pin → settle.
//!
//! The decisions come from the [`Decisions`] passed to [`Reconciler::reconcile`]; this module
//! gathers the facts they need ([`crate::facts`]) and carries out what they decide. What the
//! outcome means for each set is decided in the core (`pinset_core::settle`).

use crate::cri::client::{CriClient, CriError};
use crate::executor::{self, Backoff, Event, Job, SharedDecisions};
use crate::facts::{Facts, Snapshot};
use crate::pin::{PinBackend, PinChange, PinError};
use crate::pull::CriPuller;
use pinset_core::decisions::{Decisions, Observer};
use pinset_core::desired::{Desired, NodeInfo};
use pinset_core::drift::{self, Drift};
use pinset_core::plan::{self, Plan};
use pinset_core::rollout;
use pinset_core::settle::{self, Confirmation, Outcome};
use pinset_core::status::{NodeStatus, Progress};
use pinset_policy_sdk::Pressure;
use pinset_registry::auth::Credentials;
use pinset_registry::size::{Cached, Sizer};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("container runtime: {0}")]
    Cri(#[from] CriError),
    #[error("pinning: {0}")]
    Pin(#[from] PinError),
}

/// What a reconcile did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub plan: Option<Plan>,
    pub outcome: Outcome,
    pub pin: Option<PinChange>,
    /// Desired images present after the pulls.
    pub present_after: usize,
    /// Wall time of each step, in order.
    pub phases: Vec<(&'static str, Duration)>,
    pub cancelled: bool,
    /// Pins found lost behind pinset's back, and repaired by this reconcile.
    pub drift: Vec<Drift>,
    /// The pin back end (`crio`, `containerd`).
    pub backend: &'static str,
}

impl Report {
    /// The phases' wall times on one line: `facts 1.2ms, pull 3.4s, verify 0.8ms, pin 5.0ms`.
    pub fn phase_times(&self) -> String {
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(name, d)| format!("{name} {d:.1?}"))
            .collect();
        phases.join(", ")
    }
}

/// How long the runtime may take to report a pin change (containerd's CRI plugin learns of
/// label changes from its event stream; CRI-O re-reads its configuration on reload).
pub const PIN_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a node needs to reconcile, but the decisions: the runtime, the registries, the
/// pin back end. Built by [`crate::config::NodeConfig::connect`] from flags, or with
/// [`Reconciler::new`] and its `with_*` methods.
pub struct Reconciler<S, B> {
    cri: CriClient,
    sizer: Option<Arc<Cached<S>>>,
    credentials: Arc<Credentials>,
    pins: B,
    backoff: Backoff,
    pressure: fn() -> Pressure,
    observer: Option<Arc<dyn Observer>>,
}

impl<S, B> Reconciler<S, B> {
    /// A reconciler that pulls through `cri` and pins with `pins`: no sizing, no credentials, the
    /// reference's retry schedule, the node's own pressure.
    pub fn new(cri: CriClient, pins: B) -> Self {
        Self {
            cri,
            sizer: None,
            credentials: Arc::default(),
            pins,
            backoff: Backoff::default(),
            pressure: crate::os::pressure,
            observer: None,
        }
    }

    /// Size absent images with `sizer` (without, their size is unknown to the policy).
    pub fn with_sizer(mut self, sizer: Arc<Cached<S>>) -> Self {
        self.sizer = Some(sizer);
        self
    }

    pub fn with_credentials(mut self, credentials: Arc<Credentials>) -> Self {
        self.credentials = credentials;
        self
    }

    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    pub fn with_pressure(mut self, pressure: fn() -> Pressure) -> Self {
        self.pressure = pressure;
        self
    }

    /// Report pulls, and the credential providers' plugin runs, to `observer` (Prometheus in
    /// the agent).
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.credentials.observe(observer.clone());
        self.observer = Some(observer);
        self
    }

    pub fn cri(&self) -> &CriClient {
        &self.cri
    }

    pub fn pins(&self) -> &B {
        &self.pins
    }

    pub(crate) fn sizer(&self) -> Option<&Arc<Cached<S>>> {
        self.sizer.as_ref()
    }
}

impl<S: Sizer + 'static, B: PinBackend> Reconciler<S, B> {
    /// Reconcile the node towards `desired` with `decisions`, updating `status`. Returns early
    /// (nothing pinned, status still Progressing) when `cancel` fires.
    #[tracing::instrument(name = "reconcile", skip_all, fields(node = %node.name))]
    pub async fn reconcile(
        &self,
        desired: &Desired,
        node: &NodeInfo,
        decisions: Box<dyn Decisions>,
        status: &mut NodeStatus,
        cancel: CancellationToken,
        events: Option<UnboundedSender<Event>>,
    ) -> Result<Report, ReconcileError> {
        let result = self
            .phases(desired, node, decisions, status, cancel, events)
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

    async fn phases(
        &self,
        desired: &Desired,
        node: &NodeInfo,
        mut decisions: Box<dyn Decisions>,
        status: &mut NodeStatus,
        cancel: CancellationToken,
        events: Option<UnboundedSender<Event>>,
    ) -> Result<Report, ReconcileError> {
        let gated = self.gate(desired).await?;
        let desired = &gated;
        let facts = self.facts(desired, node).await?;
        status.sizing = facts.sizing.warning();
        // Before anything changes: what the sets pinned earlier promise, against the snapshot.
        let pinned = facts.snapshot.pinned_flags(desired);
        let drift = drift::find(desired, status, &facts.present, &pinned);
        let mut phases = facts.phases.clone();
        let started = Instant::now();
        let grant_cap = desired.grant.as_ref().and_then(|g| g.max_pulls);
        let plan = plan::make(decisions.as_mut(), &facts.request, grant_cap);
        phases.push(("policy", started.elapsed()));
        let jobs = start(
            desired,
            node,
            &facts,
            &plan,
            decisions.name(),
            status,
            &events,
        );
        let policy: SharedDecisions = Arc::new(Mutex::new(decisions));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let run = self.run(&plan, &facts, policy.clone(), cancel.clone(), tx);
        let started = Instant::now();
        let outcome = self.pulls(jobs, run, rx, status, events).await;
        phases.push(("pulls", started.elapsed()));
        let fallbacks = policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take_fallbacks();
        status.policy_fallbacks = fallbacks.iter().map(|f| f.to_string()).collect();
        let mut report = Report {
            plan: Some(plan),
            outcome,
            phases,
            drift,
            ..Default::default()
        };
        if report.outcome.cancelled || cancel.is_cancelled() {
            report.cancelled = true;
            return Ok(report);
        }
        self.verify_pin_settle(desired, facts.snapshot, status, &mut report)
            .await?;
        Ok(report)
    }

    /// How the executor runs this reconcile's pulls: the plan's concurrency, the policy's
    /// throttle, this reconciler's retries, its events into `events`.
    fn run(
        &self,
        plan: &Plan,
        facts: &Facts,
        policy: SharedDecisions,
        cancel: CancellationToken,
        events: UnboundedSender<executor::Event>,
    ) -> executor::Run<CriPuller> {
        executor::Run {
            concurrency: plan.concurrency,
            puller: CriPuller {
                cri: self.cri.clone(),
                credentials: self.credentials.clone(),
            },
            policy,
            node: facts.request.node.clone(),
            pressure: Box::new(self.pressure),
            backoff: self.backoff,
            cancel,
            events: Some(events),
        }
    }

    /// Under a rollout grant: the sets it does not cover and that miss images wait (one
    /// snapshot tells which); nothing of theirs is sized or pulled.
    async fn gate(&self, desired: &Desired) -> Result<Desired, ReconcileError> {
        let Some(grant) = &desired.grant else {
            return Ok(desired.clone());
        };
        if desired
            .sets
            .iter()
            .all(|s| grant.covers(&s.name, s.generation))
        {
            return Ok(desired.clone());
        }
        let snapshot = Snapshot::of(&self.cri.list_images().await?);
        let gated = rollout::gate(desired, &snapshot.presence(desired));
        if !gated.waiting.is_empty() {
            tracing::info!(waiting = ?gated.waiting, "sets wait for a rollout grant");
        }
        Ok(gated)
    }

    /// The pulls phase: the plan's jobs through the executor, progress into `status` and the
    /// observer as they happen, every event passed on to `events`.
    async fn pulls(
        &self,
        jobs: Vec<Job>,
        run: executor::Run<CriPuller>,
        mut rx: UnboundedReceiver<Event>,
        status: &mut NodeStatus,
        events: Option<UnboundedSender<Event>>,
    ) -> Outcome {
        let run = executor::run(jobs, run);
        let track = async {
            while let Some(event) = rx.recv().await {
                match &event {
                    Event::Pulled {
                        bytes, duration, ..
                    } => {
                        status.advance(1, bytes.unwrap_or(0));
                        if let Some(o) = &self.observer {
                            o.pull(Some(*bytes), *duration);
                        }
                    }
                    Event::Failed { .. } => {
                        if let Some(o) = &self.observer {
                            o.pull(None, Duration::ZERO);
                        }
                    }
                    _ => {}
                }
                if let Some(out) = &events {
                    let _ = out.send(event);
                }
            }
        };
        let (outcome, ()) = tokio::join!(run, track);
        outcome
    }

    /// Verify with one more snapshot (none needed when nothing was pulled: the first one is
    /// still the truth), pin the sets that are complete, confirm, and settle every set.
    async fn verify_pin_settle(
        &self,
        desired: &Desired,
        before: Snapshot,
        status: &mut NodeStatus,
        report: &mut Report,
    ) -> Result<(), ReconcileError> {
        let started = Instant::now();
        let after = if report.outcome.pulled.is_empty() {
            before
        } else {
            Snapshot::of(&self.cri.list_images().await?)
        };
        let present_after = after.presence(desired);
        report.phases.push(("verify", started.elapsed()));
        report.present_after = present_after.iter().filter(|p| **p).count();
        let plan = report
            .plan
            .as_ref()
            .expect("a reconcile that pulled has a plan");
        let settled = settle::settle(desired, &present_after, plan, &report.outcome);
        let started = Instant::now();
        let change = if self.pins.satisfied(&settled.pin, &after.pinned) {
            PinChange::default()
        } else {
            self.pins.apply(&settled.pin, &after.pinned).await?
        };
        report.drift.extend(change.drift.iter().cloned());
        self.report_drift(&report.drift, status);
        // A set is done when the runtime itself reports its images pinned.
        let unconfirmed = if change.applied {
            self.confirm_pins(&settled.pin, &change.unpinned).await?
        } else {
            BTreeSet::new()
        };
        let confirmation = Confirmation {
            backend: self.pins.name(),
            unconfirmed: &unconfirmed,
            waited: PIN_CONFIRM_TIMEOUT,
        };
        let failures = settle::record(desired, &settled, &confirmation, status);
        for (i, why) in &settled.incomplete {
            let set = &desired.sets[*i];
            tracing::warn!(set = %set.name, generation = set.generation, error = %why, "set not pinned");
        }
        report.pin = Some(change);
        report.backend = self.pins.name();
        report.phases.push(("pin", started.elapsed()));
        status.finish((!failures.is_empty()).then(|| failures.join("; ")));
        Ok(())
    }

    /// Say what was lost and repaired: a warning per pin, the observer, the status.
    fn report_drift(&self, drift: &[Drift], status: &mut NodeStatus) {
        for d in drift {
            tracing::warn!(kind = d.kind.as_str(), object = %d.object, backend = self.pins.name(), "a pin was lost behind pinset's back; repaired");
            if let Some(o) = &self.observer {
                o.pin_drift(d.kind.as_str());
            }
        }
        status.pin_drift = drift::summary(drift);
    }

    /// Wait until the runtime reports `pinned` pinned and `unpinned` not; returns the images
    /// still not reported pinned when [`PIN_CONFIRM_TIMEOUT`] runs out.
    async fn confirm_pins(
        &self,
        pinned: &BTreeSet<String>,
        unpinned: &[String],
    ) -> Result<BTreeSet<String>, CriError> {
        let deadline = Instant::now() + PIN_CONFIRM_TIMEOUT;
        // containerd usually reports within a few milliseconds: look again soon, then less often.
        let mut pause = Duration::from_millis(5);
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
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

/// The plan is made: record it in `status`, log it, announce it, and turn it into jobs.
fn start(
    desired: &Desired,
    node: &NodeInfo,
    facts: &Facts,
    plan: &Plan,
    policy: &str,
    status: &mut NodeStatus,
    events: &Option<UnboundedSender<Event>>,
) -> Vec<Job> {
    let images = &facts.request.images;
    let jobs: Vec<Job> = plan
        .pulls
        .iter()
        .map(|&i| {
            let image = images.get(i as usize).expect("plan indices are valid");
            Job {
                reference: image.reference.to_string(),
                bytes: image.size_bytes,
            }
        })
        .collect();
    let planned_bytes: u64 = jobs.iter().filter_map(|j| j.bytes).sum();
    let done = facts.present.iter().filter(|p| **p).count() as u64;
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
        policy,
        verdict = %plan.verdict(),
        reason = %plan.admission.reason,
        pulls = plan.pulls.len(),
        concurrency = plan.concurrency,
        "plan"
    );
    if let Some(out) = events {
        let _ = out.send(Event::Planned {
            pulls: plan.pulls.len() as u64,
            bytes: planned_bytes,
            present: done,
        });
    }
    jobs
}
