//! Pool statuses and Events, written off the reconcile and behind the grants.
//!
//! A pool's reconcile writes its nodes' rollout grants itself — a node waits for them — and
//! hands its status to this lane. The lane writes at most one status per pool at a time, the
//! newest one (a status computed while an older one was on its way replaces the queued one), and
//! at most [`LANE_WRITES`] statuses and Event batches at once across pools: in a burst the API
//! server's queue holds grants first, and a pool that changes five times in a second gets one or
//! two status writes, not five.
//!
//! A status is written with the resourceVersion of the snapshot it was computed from, so a
//! concurrent writer's change is a conflict rather than a lost update. The lane's own writes do
//! not count as such a change: a status computed from a snapshot the lane has since written over
//! (the watch cache lags the writes) is sent with the resourceVersion the lane's last write
//! produced. A failed write asks for the pool to be reconciled again (soon after a conflict,
//! with backoff otherwise).

use super::{Context, ControllerError, FIELD_MANAGER};
use crate::api::{MachineConfigPool, MachineConfigPoolStatus};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{Semaphore, mpsc};

/// Status writes and Event batches in flight at once.
pub const LANE_WRITES: usize = 2;

/// A pool status to write.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PoolStatus {
    pub pool: String,
    /// The resourceVersion of the pool snapshot it was computed from.
    pub based_on: Option<String>,
    /// The fields this controller owns.
    pub status: MachineConfigPoolStatus,
    /// The pool turns Degraded with this status: the `PoolDegraded` Event's message.
    pub newly_degraded: Option<String>,
}

/// What the lane knows of one pool.
#[derive(Default, Debug)]
struct Slot {
    writing: bool,
    queued: Option<PoolStatus>,
    /// The newest status offered (queued, in flight or written) and the snapshot it came from.
    offered: Option<(Option<String>, MachineConfigPoolStatus)>,
    /// The resourceVersions the pool went through by the lane's own consecutive writes, oldest
    /// first: the snapshot the first was based on, then what each produced. A snapshot among
    /// them differs from the pool as it is now only by statuses the lane wrote.
    own: Vec<String>,
}

/// Versions remembered per pool: a cache lagging further behind the lane's writes than this
/// meets a conflict and a re-read.
const OWN_VERSIONS: usize = 16;

/// The per-pool bookkeeping, apart from any I/O.
#[derive(Default, Debug)]
pub(super) struct Slots(HashMap<String, Slot>);

impl Slot {
    fn own(&self, resource_version: Option<&str>) -> bool {
        resource_version.is_some_and(|v| self.own.iter().any(|o| o == v))
    }
}

impl Slots {
    /// What a status computed from a snapshot at `resource_version` should be compared with:
    /// the newest status offered when the snapshot is the one it came from or one the lane's
    /// writes went through (the cache has not shown the newest yet), else `None` (the
    /// snapshot's own status).
    pub fn baseline(
        &self,
        pool: &str,
        resource_version: Option<&str>,
    ) -> Option<MachineConfigPoolStatus> {
        let slot = self.0.get(pool)?;
        let (based_on, status) = slot.offered.as_ref()?;
        (based_on.as_deref() == resource_version || slot.own(resource_version))
            .then(|| status.clone())
    }

    /// Offer `next`. `Some` when the caller must start writing it (nothing was in flight for
    /// its pool); `None` when it waits, replacing any status queued before it.
    pub fn offer(&mut self, mut next: PoolStatus) -> Option<PoolStatus> {
        let slot = self.0.entry(next.pool.clone()).or_default();
        slot.offered = Some((next.based_on.clone(), next.status.clone()));
        if !slot.writing {
            slot.writing = true;
            return Some(next);
        }
        if let Some(replaced) = slot.queued.take()
            && next.newly_degraded.is_none()
            && degraded(&next.status)
        {
            // The replaced status was the one turning the pool Degraded: the Event goes with
            // the status that carries the condition now.
            next.newly_degraded = replaced.newly_degraded;
        }
        slot.queued = Some(next);
        None
    }

    /// The resourceVersion to send `status` with: the newest the lane's own writes produced
    /// when `status` was computed from a snapshot they went through; else its snapshot's.
    pub fn precondition(&self, status: &PoolStatus) -> Option<String> {
        match self.0.get(&status.pool) {
            Some(slot) if slot.own(status.based_on.as_deref()) => slot.own.last().cloned(),
            _ => status.based_on.clone(),
        }
    }

    /// The write of `written` landed, producing `produced`.
    pub fn landed(&mut self, written: &PoolStatus, produced: Option<String>) {
        let slot = self.0.entry(written.pool.clone()).or_default();
        if !slot.own(written.based_on.as_deref()) {
            // Based on a version someone else wrote: a new run of own writes starts there.
            slot.own = written.based_on.iter().cloned().collect();
        }
        slot.own.extend(produced);
        let excess = slot.own.len().saturating_sub(OWN_VERSIONS);
        slot.own.drain(..excess);
    }

    /// The write of `failed` did not land: later statuses are compared with the cache again.
    pub fn failed(&mut self, failed: &PoolStatus) {
        if let Some(slot) = self.0.get_mut(&failed.pool) {
            slot.offered = None;
            slot.own.clear();
        }
    }

    /// The write in flight for `pool` is over: the next status to write, if one is queued.
    pub fn next(&mut self, pool: &str) -> Option<PoolStatus> {
        let slot = self.0.get_mut(pool)?;
        let next = slot.queued.take();
        slot.writing = next.is_some();
        next
    }

    /// Pools with a write in flight (and maybe one queued behind it).
    pub fn pending(&self) -> usize {
        self.0.values().filter(|s| s.writing).count()
    }

    /// Forget a pool that is gone, unless a write for it is in flight.
    pub fn forget(&mut self, pool: &str) {
        if self.0.get(pool).is_some_and(|s| !s.writing) {
            self.0.remove(pool);
        }
    }
}

fn degraded(status: &MachineConfigPoolStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == crate::api::CONDITION_DEGRADED && c.status == "True")
}

/// The lane: its bookkeeping, its permits, and where it asks for a pool to be reconciled again.
pub(super) struct StatusLane {
    slots: Mutex<Slots>,
    permits: Arc<Semaphore>,
    triggers: mpsc::UnboundedSender<ObjectRef<MachineConfigPool>>,
    /// `pinset_pool_status_writes_pending`, set after every change of the slots.
    pending: Gauge,
    /// Every write and Event batch on its way, waited for at shutdown ([`StatusLane::settle`]).
    tasks: tokio_util::task::TaskTracker,
}

impl StatusLane {
    pub fn new(
        triggers: mpsc::UnboundedSender<ObjectRef<MachineConfigPool>>,
        pending: Gauge,
    ) -> Self {
        Self {
            slots: Mutex::new(Slots::default()),
            permits: Arc::new(Semaphore::new(LANE_WRITES)),
            triggers,
            pending,
            tasks: tokio_util::task::TaskTracker::new(),
        }
    }

    fn slots<T>(&self, f: impl FnOnce(&mut Slots) -> T) -> T {
        let mut slots = self.slots.lock().expect("status lane lock");
        let result = f(&mut slots);
        self.pending.set(slots.pending() as i64);
        result
    }

    /// See [`Slots::baseline`].
    pub fn baseline(
        &self,
        pool: &str,
        resource_version: Option<&str>,
    ) -> Option<MachineConfigPoolStatus> {
        self.slots(|s| s.baseline(pool, resource_version))
    }

    /// Write `status` in the background, after any status of its pool already on its way.
    pub fn submit(ctx: &Arc<Context>, status: PoolStatus) {
        if let Some(first) = ctx.status_lane.slots(|s| s.offer(status)) {
            ctx.status_lane.tasks.spawn(drain(ctx.clone(), first));
        }
    }

    /// Run `work` (an Event batch) when a lane permit is free.
    pub fn background(&self, work: impl Future<Output = ()> + Send + 'static) {
        let permits = self.permits.clone();
        self.tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            work.await;
        });
    }

    /// At shutdown: the status writes and Events on their way land, within `deadline`; whether
    /// they all did. (A pause lifted just before a stop is announced, not lost with the
    /// process: a restarted controller cannot know it was ever paused.)
    pub async fn settle(&self, deadline: std::time::Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(deadline, self.tasks.wait())
            .await
            .is_ok()
    }
}

/// Write `status`, then whatever was queued for its pool meanwhile, until nothing is.
async fn drain(ctx: Arc<Context>, mut status: PoolStatus) {
    loop {
        let lane = &ctx.status_lane;
        let precondition = lane.slots(|s| s.precondition(&status));
        let result = {
            let _permit = lane.permits.acquire().await;
            write(&ctx, &status, precondition).await
        };
        match result {
            Ok(produced) => {
                lane.slots(|s| s.landed(&status, produced));
                ctx.succeeded(&failure_key(&status.pool));
                if let Some(why) = &status.newly_degraded {
                    let (client, pool, why) =
                        (ctx.client.clone(), status.pool.clone(), why.clone());
                    lane.background(async move { announce_degraded(client, &pool, &why).await });
                }
            }
            Err(e) => retry_later(&ctx, &status, &e),
        }
        match lane.slots(|s| s.next(&status.pool)) {
            Some(n) => status = n,
            None => {
                if ctx.pools.get(&ObjectRef::new(&status.pool)).is_none() {
                    lane.slots(|s| s.forget(&status.pool));
                }
                return;
            }
        }
    }
}

fn failure_key(pool: &str) -> String {
    format!("pool-status/{pool}")
}

/// A write that failed: said once, and the pool reconciled again after the backoff.
fn retry_later(ctx: &Arc<Context>, status: &PoolStatus, error: &ControllerError) {
    ctx.status_lane.slots(|s| s.failed(status));
    if error.conflict() {
        ctx.metrics.count_api_write_conflict("pool_status");
    }
    let wait = ctx.retry_after(failure_key(&status.pool), error, "pool status not written");
    let (triggers, pool) = (ctx.status_lane.triggers.clone(), status.pool.clone());
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        let _ = triggers.send(ObjectRef::new(&pool));
    });
}

/// Apply the status; the resourceVersion it produced.
async fn write(
    ctx: &Context,
    status: &PoolStatus,
    precondition: Option<String>,
) -> Result<Option<String>, ControllerError> {
    let body = json!({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfigPool",
        "metadata": {"resourceVersion": precondition},
        "status": status.status,
    });
    let api: Api<MachineConfigPool> = Api::all(ctx.client.clone());
    let written = api
        .patch_status(
            &status.pool,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| ControllerError::PoolWrite {
            pool: status.pool.clone(),
            what: "status",
            source,
        })?;
    ctx.metrics.count_api_write("pool_status");
    Ok(written.metadata.resource_version)
}

/// A `PoolDegraded` Event on the pool that just turned Degraded.
async fn announce_degraded(client: kube::Client, pool: &str, why: &str) {
    let event = crate::events::POOL_DEGRADED.event(why);
    crate::events::record::<MachineConfigPool>(client, FIELD_MANAGER, None, pool, &[event]).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PoolRollout;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn status(pool: &str, based_on: &str, done: u32, degraded: bool) -> PoolStatus {
        let mut condition = crate::condition::make(
            &[],
            crate::api::CONDITION_DEGRADED,
            degraded,
            "Why",
            "",
            Some(1),
        );
        condition.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        PoolStatus {
            pool: pool.into(),
            based_on: Some(based_on.into()),
            status: MachineConfigPoolStatus {
                conditions: vec![condition],
                rollout: Some(PoolRollout {
                    done,
                    ..Default::default()
                }),
                ..Default::default()
            },
            newly_degraded: degraded.then(|| format!("{pool} degraded at {done}")),
        }
    }

    #[test]
    fn one_write_per_pool_at_a_time_and_the_newest_status_next() {
        let mut slots = Slots::default();
        let first = status("a", "1", 1, false);
        assert_eq!(slots.offer(first.clone()), Some(first));
        // Another pool is not held up by the first.
        let other = status("b", "7", 1, false);
        assert_eq!(slots.offer(other.clone()), Some(other));
        assert_eq!(slots.offer(status("a", "1", 2, false)), None);
        assert_eq!(slots.offer(status("a", "1", 3, false)), None);
        assert_eq!(slots.next("a"), Some(status("a", "1", 3, false)));
        assert_eq!(slots.next("a"), None, "the queued status was replaced");
        // The slot is free again: the next offer is written at once.
        let later = status("a", "2", 4, false);
        assert_eq!(slots.offer(later.clone()), Some(later));
    }

    #[test]
    fn a_status_is_compared_with_the_newest_offered_until_the_cache_moves_on() {
        let mut slots = Slots::default();
        assert_eq!(slots.baseline("a", Some("1")), None);
        slots.offer(status("a", "1", 1, false));
        slots.offer(status("a", "1", 2, false));
        let expected = status("a", "1", 2, false).status;
        assert_eq!(slots.baseline("a", Some("1")), Some(expected));
        assert_eq!(slots.baseline("a", Some("2")), None, "the cache moved on");
        assert_eq!(slots.baseline("b", Some("1")), None);
        slots.failed(&status("a", "1", 2, false));
        assert_eq!(slots.baseline("a", Some("1")), None, "nothing landed");
    }

    #[test]
    fn a_status_from_a_snapshot_the_lane_wrote_over_is_sent_with_the_version_it_produced() {
        let mut slots = Slots::default();
        // The version a status of pool `a` computed from snapshot `based_on` is sent with.
        let sent_with = |slots: &Slots, based_on: &str, done: u32| {
            slots
                .precondition(&status("a", based_on, done, false))
                .unwrap()
        };
        let first = status("a", "10", 1, false);
        assert_eq!(slots.precondition(&first), Some("10".into()));
        slots.offer(first.clone());
        slots.landed(&first, Some("11".into()));
        let second = status("a", "10", 2, false);
        assert_eq!(slots.precondition(&second), Some("11".into()));
        slots.landed(&second, Some("12".into()));
        assert_eq!(sent_with(&slots, "10", 3), "12");
        // The cache caught up with the first write only: still the lane's own version.
        assert_eq!(sent_with(&slots, "11", 3), "12");
        assert!(slots.baseline("a", Some("11")).is_some());
        // Computed from a snapshot someone else wrote: sent as it is (a conflict if stale).
        let theirs = status("a", "13", 3, false);
        assert_eq!(slots.precondition(&theirs), Some("13".into()));
        assert_eq!(slots.baseline("a", Some("13")), None);
        // Once it lands, the lane's versions start again from there.
        slots.landed(&theirs, Some("14".into()));
        assert_eq!(sent_with(&slots, "13", 4), "14");
        assert_eq!(sent_with(&slots, "11", 4), "11");
        slots.failed(&status("a", "10", 3, false));
        assert_eq!(sent_with(&slots, "10", 3), "10");
    }

    #[test]
    fn the_degraded_event_follows_the_status_that_carries_the_condition() {
        let mut slots = Slots::default();
        slots.offer(status("a", "1", 1, false));
        slots.offer(status("a", "1", 2, true));
        let mut still = status("a", "1", 3, true);
        still.newly_degraded = None;
        slots.offer(still);
        assert_eq!(
            slots.next("a").and_then(|s| s.newly_degraded).as_deref(),
            Some("a degraded at 2")
        );
        slots.offer(status("a", "1", 4, true));
        slots.offer(status("a", "1", 5, false));
        assert_eq!(
            slots.next("a").map(|s| s.newly_degraded),
            Some(None),
            "the pool is no longer Degraded: no Event"
        );
    }

    #[test]
    fn a_gone_pool_is_forgotten_once_its_write_is_over() {
        let mut slots = Slots::default();
        slots.offer(status("a", "1", 1, false));
        slots.forget("a");
        assert!(slots.baseline("a", Some("1")).is_some(), "in flight: kept");
        assert_eq!(slots.next("a"), None);
        slots.forget("a");
        assert_eq!(slots.baseline("a", Some("1")), None);
    }
}
