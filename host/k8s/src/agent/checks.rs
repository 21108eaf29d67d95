//! A node's policy checks, in the background. Fetching a module and its signature waits on a
//! registry; a reconcile never does: a check runs as its own task (the fetch bounded by
//! [`pinset_registry::limits::POLICY_FETCH`], then the compile and smoke test on a blocking
//! thread, abandoned when the agent stops) and the round that finds it finished takes its
//! result. Meanwhile the node decides with the module it runs. A refusal that may pass by itself
//! (the registry away, not found, unsigned) is checked again on
//! [`pinset_core::refusal::Refusal::recheck_after`]'s schedule.

use super::policies::{CheckKey, Loaded, Refusing};
use pinset_core::refusal::Refusal;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;

/// Keys whose refusals are remembered for a recheck (the table starts over when full).
const RETRIES: usize = 64;

/// What a check finds.
pub enum Outcome {
    /// A candidate to swap to: loaded and smoke-tested, or refused.
    Candidate(Result<Loaded, Refusing>),
    /// The running module under another key set: it still verifies, or not.
    Recheck(Result<(), Refusing>),
}

/// Where a check leaves its outcome, before it wakes the agent.
type Slot = Arc<Mutex<Option<Outcome>>>;

/// Fills the slot if the check did not (it panicked, or was abandoned), then wakes the agent:
/// an outcome is always there by the time the agent looks.
struct Done {
    slot: Slot,
    wake: signal::Sender<u64>,
}

impl Drop for Done {
    fn drop(&mut self) {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            let why = "the check ended without an outcome (it failed)".to_string();
            *slot = Some(Outcome::Candidate(Err((Refusal::NotAPolicy, why))));
        }
        drop(slot);
        self.wake.send_modify(|n| *n += 1);
    }
}

/// The check in flight (at most one) and when each refused key may be checked again.
pub struct Checks {
    inflight: Option<(CheckKey, JoinHandle<()>, Slot)>,
    retries: HashMap<CheckKey, (u32, Instant)>,
    /// Bumped when a check ends, to wake an idle agent.
    wake: signal::Sender<u64>,
}

impl Checks {
    pub fn new(wake: signal::Sender<u64>) -> Self {
        Self {
            inflight: None,
            retries: HashMap::new(),
            wake,
        }
    }

    /// A check of `key` is under way.
    pub fn running(&self, key: &CheckKey) -> bool {
        self.inflight.as_ref().is_some_and(|(k, ..)| k == key)
    }

    /// A check of `key` has ended and waits to be taken.
    pub fn finished(&self, key: &CheckKey) -> bool {
        self.inflight.as_ref().is_some_and(|(k, _, slot)| {
            k == key && slot.lock().unwrap_or_else(|e| e.into_inner()).is_some()
        })
    }

    /// The outcome of `key`'s check, once it has ended.
    pub fn take(&mut self, key: &CheckKey) -> Option<Outcome> {
        if !self.finished(key) {
            return None;
        }
        let (_, _, slot) = self.inflight.take()?;
        slot.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// `key` may be checked now: nothing in flight for it and no recheck wait running.
    pub fn due(&self, key: &CheckKey) -> bool {
        !self.running(key)
            && self
                .retries
                .get(key)
                .is_none_or(|(_, at)| Instant::now() >= *at)
    }

    /// When the next recheck is due, if one is waiting.
    pub fn next_due(&self) -> Option<Instant> {
        self.retries.values().map(|(_, at)| *at).min()
    }

    /// Start checking `key` with `work`; a check of another key in flight is abandoned (the
    /// configuration moved on).
    pub fn start(&mut self, key: CheckKey, work: impl Future<Output = Outcome> + Send + 'static) {
        self.cancel();
        let slot = Slot::default();
        let done = Done {
            slot: slot.clone(),
            wake: self.wake.clone(),
        };
        let module = key.module.clone();
        tracing::debug!(?module, "policy check started");
        let task = tokio::spawn(async move {
            let outcome = work.await;
            tracing::debug!(?module, "policy check ended");
            *done.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
            // `done` drops here: the outcome is in its slot before the agent is woken.
        });
        self.inflight = Some((key, task, slot));
    }

    /// Abandon any check (nothing is wanted any more).
    pub fn cancel(&mut self) {
        if let Some((_, task, _)) = self.inflight.take() {
            task.abort();
        }
    }

    /// `key` was refused as `kind`: when it may pass by itself, check it again later.
    pub fn refused(&mut self, key: &CheckKey, kind: Refusal) {
        if !kind.rechecked() {
            self.retries.remove(key);
            return;
        }
        if self.retries.len() >= RETRIES {
            self.retries.clear();
        }
        let attempt = self.retries.get(key).map_or(1, |(n, _)| n + 1);
        let at = Instant::now() + Refusal::recheck_after(attempt);
        self.retries.insert(key.clone(), (attempt, at));
    }

    /// `key` passed: no recheck is waiting for it.
    pub fn passed(&mut self, key: &CheckKey) {
        self.retries.remove(key);
    }
}

impl Drop for Checks {
    fn drop(&mut self) {
        self.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(module: &str) -> CheckKey {
        CheckKey {
            module: Some(module.into()),
            keys: "k".into(),
        }
    }

    #[tokio::test]
    async fn a_check_runs_once_wakes_the_agent_and_is_taken() {
        let (wake, mut woken) = signal::channel(0u64);
        let mut checks = Checks::new(wake);
        let a = key("a");
        assert!(checks.due(&a));
        checks.start(a.clone(), async {
            Outcome::Recheck(Err((Refusal::RegistryAway, "away".into())))
        });
        assert!(checks.running(&a) && !checks.due(&a));
        woken.changed().await.unwrap();
        assert!(
            checks.finished(&a),
            "the outcome is there when the agent is woken"
        );
        let Some(Outcome::Recheck(Err((kind, _)))) = checks.take(&a) else {
            panic!("the outcome")
        };
        checks.refused(&a, kind);
        assert!(!checks.due(&a), "rechecked after a wait, not at once");
        let due = checks.next_due().unwrap();
        assert!(due > Instant::now() + std::time::Duration::from_secs(25));
        // A refusal that stands is not rechecked at all.
        checks.refused(&key("b"), Refusal::SmokeTestFailed);
        assert!(checks.due(&key("b")) && checks.next_due() == Some(due));
    }

    #[tokio::test]
    async fn a_check_of_another_key_abandons_the_one_in_flight() {
        let (wake, _woken) = signal::channel(0u64);
        let mut checks = Checks::new(wake);
        checks.start(key("a"), std::future::pending());
        checks.start(key("b"), async { Outcome::Recheck(Ok(())) });
        assert!(!checks.running(&key("a")) && checks.running(&key("b")));
    }
}
