//! Runs a plan's pulls: `concurrency` slots take images in the plan's order; after each pull the
//! policy's throttle decides the slot's pause. Each pull is retried with backoff; a "no space
//! left on device" fails at once and drains the queue. A cancellation token stops everything
//! within one scheduling step: pulls in flight are abandoned (their futures dropped, so the CRI
//! calls are cancelled), pauses are cut short, and every task has ended when [`run`] returns.

use pinset_core::decisions::Decisions;
use pinset_policy_sdk::{NodeFacts, Pressure, PullOutcome};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// A failed pull attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullFailure {
    pub message: String,
    /// The runtime's disk is full: no retry, drain the queue.
    pub no_space: bool,
    /// Trying again cannot help (the image does not exist, the registry refuses): no retry.
    pub permanent: bool,
}

/// Pulls one image. Implemented by the CRI adapter; tests use their own.
pub trait Puller: Send + Sync + 'static {
    fn pull(&self, reference: &str) -> impl Future<Output = Result<(), PullFailure>> + Send;
}

/// Reads the node's pressure when a throttle is decided.
pub trait PressureSource: Send + Sync + 'static {
    fn pressure(&self) -> Pressure;
}

impl<F: Fn() -> Pressure + Send + Sync + 'static> PressureSource for F {
    fn pressure(&self) -> Pressure {
        self()
    }
}

/// Retry schedule of one image: `attempts` tries, waiting `first`, doubling, at most `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub attempts: u32,
    pub first: Duration,
    pub cap: Duration,
}

impl Default for Backoff {
    /// The reference's: 5 tries, waits of 1 s, 2 s, 4 s, 8 s, at most 10 s.
    fn default() -> Self {
        Self {
            attempts: 5,
            first: Duration::from_secs(1),
            cap: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The wait after failed attempt `n` (1-based).
    pub fn wait(&self, n: u32) -> Duration {
        self.first
            .saturating_mul(1u32 << (n - 1).min(20))
            .min(self.cap)
    }
}

#[derive(Clone, Debug)]
pub struct Job {
    pub reference: String,
    pub bytes: Option<u64>,
}

/// What happens, as it happens.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The plan is made: this many pulls of this many known compressed bytes (sent by the
    /// reconcile before the executor starts).
    Planned {
        pulls: u64,
        bytes: u64,
        /// Images of the desired state already present before any pull.
        present: u64,
    },
    Started {
        reference: String,
        /// The pull slot (0-based, below the concurrency) that runs it.
        slot: usize,
    },
    Retrying {
        reference: String,
        attempt: u32,
        error: String,
        wait: Duration,
    },
    Pulled {
        reference: String,
        bytes: Option<u64>,
        duration: Duration,
    },
    Failed {
        reference: String,
        error: String,
    },
    Throttle {
        reference: String,
        pause: Duration,
    },
}

pub use pinset_core::settle::Outcome;

/// The decisions of one reconcile, shared by the pull slots (each asks the throttle).
pub type SharedDecisions = Arc<Mutex<Box<dyn Decisions>>>;

/// How to run a plan's pulls: everything but the jobs themselves.
pub struct Run<P> {
    /// Pull slots (at least 1, at most one per job).
    pub concurrency: u32,
    pub puller: P,
    /// Asked for the pause after each pull.
    pub policy: SharedDecisions,
    pub node: NodeFacts,
    pub pressure: Box<dyn PressureSource>,
    pub backoff: Backoff,
    pub cancel: CancellationToken,
    pub events: Option<UnboundedSender<Event>>,
}

struct Shared<P> {
    queue: Mutex<VecDeque<Job>>,
    run: Run<P>,
    draining: AtomicBool,
    outcome: Mutex<Outcome>,
}

impl<P> Shared<P> {
    fn emit(&self, e: Event) {
        if let Some(tx) = &self.run.events {
            let _ = tx.send(e);
        }
    }
}

/// Pull `jobs` in order with `concurrency` slots. Returns once every slot has stopped.
pub async fn run<P: Puller>(jobs: Vec<Job>, run: Run<P>) -> Outcome {
    let slots = (run.concurrency.max(1) as usize).min(jobs.len().max(1));
    let shared = Arc::new(Shared {
        queue: Mutex::new(jobs.into()),
        run,
        draining: AtomicBool::new(false),
        outcome: Mutex::new(Outcome::default()),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..slots {
        tasks.spawn(slot(shared.clone(), index));
    }
    while tasks.join_next().await.is_some() {}
    let mut outcome = std::mem::take(&mut *shared.outcome.lock().expect("outcome lock"));
    outcome.cancelled = shared.run.cancel.is_cancelled();
    if shared.draining.load(Ordering::SeqCst) {
        let rest = shared.queue.lock().expect("queue lock");
        outcome
            .drained
            .extend(rest.iter().map(|j| j.reference.clone()));
    }
    outcome
}

async fn slot<P: Puller>(s: Arc<Shared<P>>, index: usize) {
    loop {
        if s.run.cancel.is_cancelled() || s.draining.load(Ordering::SeqCst) {
            return;
        }
        let Some(job) = s.queue.lock().expect("queue lock").pop_front() else {
            return;
        };
        s.emit(Event::Started {
            reference: job.reference.clone(),
            slot: index,
        });
        let started = Instant::now();
        let result = tokio::select! {
            biased;
            _ = s.run.cancel.cancelled() => return,
            r = pull_with_retries(&s, &job) => r,
        };
        let duration = started.elapsed();
        let remaining = s.queue.lock().expect("queue lock").len() as u32;
        let outcome = PullOutcome {
            reference: job.reference.clone(),
            error: result.as_ref().err().map(|f| f.message.clone()),
            bytes: job.bytes,
            duration_ms: duration.as_millis() as u64,
            remaining,
        };
        let drained = record(&s, &job, result, duration);
        if drained || remaining == 0 || !throttle(&s, &outcome).await {
            return;
        }
    }
}

/// One pull's result, said and kept in the outcome; whether it filled the disk (the run then
/// drains: no more pulls start).
fn record<P: Puller>(
    s: &Shared<P>,
    job: &Job,
    result: Result<(), PullFailure>,
    duration: Duration,
) -> bool {
    let reference = job.reference.clone();
    match result {
        Ok(()) => {
            tracing::debug!(image = %reference, bytes = job.bytes, ?duration, "pulled");
            s.emit(Event::Pulled {
                reference: reference.clone(),
                bytes: job.bytes,
                duration,
            });
            s.outcome
                .lock()
                .expect("outcome lock")
                .pulled
                .push(reference);
            false
        }
        Err(f) => {
            tracing::debug!(image = %reference, error = %f.message, "pull failed");
            s.emit(Event::Failed {
                reference: reference.clone(),
                error: f.message.clone(),
            });
            let mut o = s.outcome.lock().expect("outcome lock");
            o.failed.push((reference, f.message.clone()));
            if f.no_space {
                o.no_space.get_or_insert(f.message);
                s.draining.store(true, Ordering::SeqCst);
            }
            f.no_space
        }
    }
}

/// The slot pauses as long as the policy's throttle says after `outcome`; false when the run
/// was cancelled meanwhile.
async fn throttle<P: Puller>(s: &Shared<P>, outcome: &PullOutcome) -> bool {
    // A lock poisoned by a panic elsewhere still holds valid decisions: the guard answers
    // every hook (the reference's answer where the policy failed).
    let pause = {
        let pressure = s.run.pressure.pressure();
        s.run
            .policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .throttle(&s.run.node, outcome, &pressure)
    };
    if pause.is_zero() {
        return true;
    }
    s.emit(Event::Throttle {
        reference: outcome.reference.clone(),
        pause,
    });
    tokio::select! {
        _ = s.run.cancel.cancelled() => false,
        _ = tokio::time::sleep(pause) => true,
    }
}

async fn pull_with_retries<P: Puller>(s: &Shared<P>, job: &Job) -> Result<(), PullFailure> {
    let mut attempt = 1;
    loop {
        match s.run.puller.pull(&job.reference).await {
            Ok(()) => return Ok(()),
            Err(f) if f.no_space => return Err(f),
            Err(mut f) if f.permanent => {
                f.message = format!("{} (permanent: not retried)", f.message);
                return Err(f);
            }
            Err(mut f) if attempt >= s.run.backoff.attempts => {
                f.message = format!("{} (after {attempt} attempts)", f.message);
                return Err(f);
            }
            Err(f) => {
                let wait = s.run.backoff.wait(attempt);
                tracing::debug!(image = %job.reference, attempt, error = %f.message, ?wait, "pull failed; retrying");
                s.emit(Event::Retrying {
                    reference: job.reference.clone(),
                    attempt,
                    error: f.message,
                    wait,
                });
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pinset_policy::{Guarded, Native, NodeContract};
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU32;

    /// Per image, the results its next pulls return.
    type Results = HashMap<String, VecDeque<Result<(), PullFailure>>>;

    /// A puller scripted per image: a list of results, then success; each pull takes `delay`.
    #[derive(Clone, Default)]
    struct Script {
        results: Arc<Mutex<Results>>,
        calls: Arc<Mutex<Vec<String>>>,
        in_flight: Arc<AtomicU32>,
        max_in_flight: Arc<AtomicU32>,
        dropped: Arc<AtomicU32>,
        delay: Duration,
    }

    struct InFlight(Arc<AtomicU32>, Arc<AtomicU32>, bool);
    impl Drop for InFlight {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
            if !self.2 {
                self.1.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    impl Script {
        /// A script whose every pull takes `delay`.
        fn taking(delay: Duration) -> Script {
            Script {
                delay,
                ..Default::default()
            }
        }
    }

    impl Puller for Script {
        async fn pull(&self, reference: &str) -> Result<(), PullFailure> {
            self.calls.lock().unwrap().push(reference.to_string());
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let mut guard = InFlight(self.in_flight.clone(), self.dropped.clone(), false);
            tokio::time::sleep(self.delay).await;
            guard.2 = true;
            let next = self
                .results
                .lock()
                .unwrap()
                .get_mut(reference)
                .and_then(|q| q.pop_front());
            next.unwrap_or(Ok(()))
        }
    }

    fn fail(msg: &str) -> Result<(), PullFailure> {
        Err(PullFailure {
            message: msg.into(),
            no_space: msg.contains("no space"),
            permanent: msg.contains("not found"),
        })
    }

    fn jobs(n: usize) -> Vec<Job> {
        (0..n)
            .map(|i| Job {
                reference: format!("img{i}"),
                bytes: Some(10),
            })
            .collect()
    }

    fn policy() -> SharedDecisions {
        Arc::new(Mutex::new(Box::new(Guarded::<NodeContract>::new(
            Box::new(Native::<NodeContract>::reference()),
        ))))
    }

    const FAST: Backoff = Backoff {
        attempts: 5,
        first: Duration::from_millis(1),
        cap: Duration::from_millis(4),
    };

    fn worker() -> NodeFacts {
        NodeFacts {
            name: "w".into(),
            ready: true,
            ..Default::default()
        }
    }

    async fn go(
        script: &Script,
        jobs: Vec<Job>,
        concurrency: u32,
        cancel: CancellationToken,
    ) -> (Outcome, Vec<Event>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let out = run(
            jobs,
            Run {
                concurrency,
                puller: script.clone(),
                policy: policy(),
                node: worker(),
                pressure: Box::new(Pressure::default),
                backoff: FAST,
                cancel,
                events: Some(tx),
            },
        )
        .await;
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        (out, events)
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff::default();
        let waits: Vec<u64> = (1..=5).map(|n| b.wait(n).as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 10]);
    }

    #[tokio::test]
    async fn retries_then_succeeds_and_gives_up_after_five_tries() {
        let script = Script::default();
        script
            .results
            .lock()
            .unwrap()
            .insert("img0".into(), [fail("reset"), fail("reset")].into());
        script
            .results
            .lock()
            .unwrap()
            .insert("img1".into(), (0..5).map(|_| fail("refused")).collect());
        let (out, events) = go(&script, jobs(2), 5, CancellationToken::new()).await;
        assert_eq!(out.pulled, vec!["img0"]);
        assert_eq!(
            out.failed,
            vec![("img1".to_string(), "refused (after 5 attempts)".to_string())]
        );
        let calls = script.calls.lock().unwrap();
        assert_eq!(calls.iter().filter(|c| *c == "img0").count(), 3);
        assert_eq!(
            calls.iter().filter(|c| *c == "img1").count(),
            5,
            "5 tries, never marked pulled"
        );
        let retries = events
            .iter()
            .filter(|e| matches!(e, Event::Retrying { .. }))
            .count();
        assert_eq!(retries, 2 + 4);
    }

    #[tokio::test]
    async fn a_permanent_failure_is_not_retried_and_says_so() {
        let script = Script::default();
        script
            .results
            .lock()
            .unwrap()
            .insert("img0".into(), [fail("img0: not found")].into());
        let started = Instant::now();
        let (out, events) = go(&script, jobs(2), 1, CancellationToken::new()).await;
        assert_eq!(
            out.failed,
            vec![(
                "img0".to_string(),
                "img0: not found (permanent: not retried)".to_string()
            )]
        );
        assert_eq!(out.pulled, vec!["img1"], "the others go on");
        assert_eq!(script.calls.lock().unwrap().len(), 2, "one try each");
        assert!(!events.iter().any(|e| matches!(e, Event::Retrying { .. })));
        // The reference's 1 s throttle after the first pull, and nothing else waited for.
        assert_eq!(pauses(&events), vec![Duration::from_secs(1)]);
        assert!(started.elapsed() >= Duration::from_secs(1));
    }

    #[tokio::test]
    async fn no_space_fails_at_once_and_drains_the_queue() {
        let script = Script::taking(Duration::from_millis(10));
        script.results.lock().unwrap().insert(
            "img1".into(),
            [fail("write: no space left on device")].into(),
        );
        let (out, _) = go(&script, jobs(10), 1, CancellationToken::new()).await;
        assert_eq!(out.pulled, vec!["img0"]);
        assert_eq!(out.failed.len(), 1);
        assert!(out.no_space.as_deref().unwrap().contains("no space"));
        assert_eq!(out.drained.len(), 8);
        assert_eq!(
            script.calls.lock().unwrap().len(),
            2,
            "no retry after ENOSPC, nothing after it"
        );
    }

    #[tokio::test]
    async fn concurrency_caps_pulls_in_flight() {
        let script = Script::taking(Duration::from_millis(50));
        let (out, _) = go(&script, jobs(12), 5, CancellationToken::new()).await;
        assert_eq!(out.pulled.len(), 12);
        assert_eq!(script.max_in_flight.load(Ordering::SeqCst), 5);
    }

    /// The throttle pauses the executor announced, in order.
    fn pauses(events: &[Event]) -> Vec<Duration> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Throttle { pause, .. } => Some(*pause),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn throttle_pauses_each_slot_after_a_pull() {
        // Reference policy: 1 s after every pull. 3 images, 1 slot: 2 pauses (none after the last).
        let script = Script::taking(Duration::from_millis(100));
        let started = Instant::now();
        let (out, events) = go(&script, jobs(3), 1, CancellationToken::new()).await;
        assert_eq!(out.pulled.len(), 3);
        assert_eq!(pauses(&events), vec![Duration::from_secs(1); 2]);
        // Three pulls of 100 ms and two pauses of 1 s, one after the other.
        assert!(started.elapsed() >= Duration::from_millis(2_300));
    }

    #[tokio::test]
    async fn cancellation_abandons_pulls_in_flight_and_leaks_no_task() {
        let script = Script::taking(Duration::from_secs(3600));
        let cancel = CancellationToken::new();
        let handle = {
            let (script, cancel) = (script.clone(), cancel.clone());
            tokio::spawn(async move { go(&script, jobs(20), 5, cancel).await })
        };
        while script.in_flight.load(Ordering::SeqCst) < 5 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let cancelled_at = Instant::now();
        cancel.cancel();
        let (out, _) = handle.await.unwrap();
        assert!(
            cancelled_at.elapsed() < Duration::from_millis(250),
            "{:?}",
            cancelled_at.elapsed()
        );
        assert!(out.cancelled);
        assert!(out.pulled.is_empty());
        assert_eq!(
            script.in_flight.load(Ordering::SeqCst),
            0,
            "every in-flight pull was dropped"
        );
        assert_eq!(script.dropped.load(Ordering::SeqCst), 5);
        assert_eq!(
            script.calls.lock().unwrap().len(),
            5,
            "queued pulls never started"
        );
    }
}
