//! One reconcile's instance of a policy: calls under a deadline, failures classified, the
//! contract's types converted to and from the SDK's.

use super::bounded;
use super::engine::EPOCH_TICK;
use super::module::Shared;
use super::store::{Limits, LogBudget, State, new_store};
use super::{bindings, wit};
use crate::{Hook, PolicyError, PolicyInstance};
use pinset_policy_sdk as sdk;
use std::sync::Arc;
use wasmtime::{Store, Trap};

/// One reconcile's instance of a Wasm policy.
pub struct WasmPolicy {
    pub(super) shared: Arc<Shared>,
    pub(super) live: Option<(Store<State>, bindings::Policy)>,
    /// What the policy may still log in this reconcile, whatever instances it takes.
    pub(super) log: Arc<LogBudget>,
}

/// Longest admission reason passed on (status, logs, `pinset plan`).
pub const MAX_REASON_BYTES: usize = 4096;
/// Longest policy name or version passed on.
pub const MAX_NAME_BYTES: usize = 128;
/// Longest policy description passed on.
pub const MAX_DESCRIPTION_BYTES: usize = 1024;

/// Epochs until `limits.deadline` has passed.
pub(super) fn deadline_ticks(limits: Limits) -> u64 {
    let tick = EPOCH_TICK.as_nanos();
    // The deadline passes between ticks-1 and ticks epochs from now: add one for the floor.
    (limits.deadline.as_nanos().div_ceil(tick) as u64).max(1) + 1
}

impl WasmPolicy {
    /// Run one hook, instantiating first when there is no live instance. Any failure drops the
    /// store: a trapped instance may not be entered again.
    fn call<R>(
        &mut self,
        hook: Hook,
        f: impl FnOnce(&mut Store<State>, &bindings::Policy) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let ticks = deadline_ticks(self.shared.limits);
        if self.live.is_none() {
            let s = &self.shared;
            let mut store = new_store(&s.engine, &s.name, s.limits, self.log.clone());
            store.set_epoch_deadline(ticks);
            let instance = match self.shared.pre.instantiate(&mut store) {
                Ok(i) => i,
                Err(e) => return Err(classify(&s.name, s.limits, hook, &store, e)),
            };
            self.live = Some((store, instance));
        }
        let (store, instance) = self.live.as_mut().expect("instantiated above");
        store.set_epoch_deadline(ticks);
        match f(store, instance) {
            Ok(r) => Ok(r),
            Err(e) => {
                let (store, _) = self.live.take().expect("live instance");
                Err(classify(
                    &self.shared.name,
                    self.shared.limits,
                    hook,
                    &store,
                    e,
                ))
            }
        }
    }
}

/// What a failed call or instantiation was: the memory cap, the deadline, or a trap (quoting the
/// panic message the policy wrote to stderr, if any).
pub(super) fn classify(
    policy: &str,
    limits: Limits,
    hook: Hook,
    store: &Store<State>,
    e: wasmtime::Error,
) -> PolicyError {
    let policy = policy.to_string();
    if store.data().limiter.hit {
        return PolicyError::MemoryCap {
            policy,
            hook,
            cap_bytes: limits.memory_bytes,
        };
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => PolicyError::Deadline {
            policy,
            hook,
            deadline: limits.deadline,
        },
        trap => {
            let mut message = trap.map_or_else(|| format!("{e:#}"), |t| t.to_string());
            let stderr = store.data().stderr.contents();
            let stderr = String::from_utf8_lossy(&stderr);
            if let Some(panic) = stderr.lines().find(|l| l.contains("panicked at")) {
                let detail: Vec<&str> = stderr
                    .lines()
                    .skip_while(|l| !l.contains("panicked at"))
                    .take(2)
                    .collect();
                message = format!(
                    "{message} ({})",
                    if detail.len() > 1 {
                        detail.join(" ")
                    } else {
                        panic.to_string()
                    }
                );
            }
            PolicyError::Trap {
                policy,
                hook,
                message: bounded(&message, MAX_REASON_BYTES),
            }
        }
    }
}

impl PolicyInstance for WasmPolicy {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn info(&mut self) -> Result<sdk::PolicyInfo, PolicyError> {
        let i = self.call(Hook::Info, |s, p| p.pinset_policy_decisions().call_info(s))?;
        Ok(sdk::PolicyInfo {
            name: bounded(&i.name, MAX_NAME_BYTES),
            version: bounded(&i.version, MAX_NAME_BYTES),
            description: bounded(&i.description, MAX_DESCRIPTION_BYTES),
        })
    }

    fn admit(&mut self, request: &sdk::AdmissionRequest) -> Result<sdk::Admission, PolicyError> {
        let request = wit::AdmissionRequest {
            node: node(&request.node),
            disk: wit::DiskFacts {
                capacity_bytes: request.disk.capacity_bytes,
                used_bytes: request.disk.used_bytes,
                available_bytes: request.disk.available_bytes,
            },
            images: pack(&request.images),
        };
        let a = self.call(Hook::Admit, |s, p| {
            p.pinset_policy_decisions().call_admit(s, &request)
        })?;
        let verdict = match a.verdict {
            wit::Verdict::AdmitAll => sdk::Verdict::AdmitAll,
            wit::Verdict::AdmitSome(v) => sdk::Verdict::AdmitSome(v),
            wit::Verdict::Reject => sdk::Verdict::Reject,
        };
        Ok(sdk::Admission {
            verdict,
            reason: bounded(&a.reason, MAX_REASON_BYTES),
        })
    }

    fn order(&mut self, n: &sdk::NodeFacts, images: &sdk::Images) -> Result<Vec<u32>, PolicyError> {
        let n = node(n);
        let images = pack(images);
        self.call(Hook::Order, |s, p| {
            p.pinset_policy_decisions().call_order(s, &n, &images)
        })
    }

    fn concurrency(&mut self, n: &sdk::NodeFacts) -> Result<u32, PolicyError> {
        let n = node(n);
        self.call(Hook::Concurrency, |s, p| {
            p.pinset_policy_decisions().call_concurrency(s, &n)
        })
    }

    fn throttle(
        &mut self,
        n: &sdk::NodeFacts,
        outcome: &sdk::PullOutcome,
        pressure: &sdk::Pressure,
    ) -> Result<u64, PolicyError> {
        let n = node(n);
        let outcome = wit::PullOutcome {
            reference: outcome.reference.clone(),
            error: outcome.error.clone(),
            bytes: outcome.bytes,
            duration_ms: outcome.duration_ms,
            remaining: outcome.remaining,
        };
        let pressure = wit::Pressure {
            io: pressure.io,
            cpu: pressure.cpu,
            memory: pressure.memory,
        };
        self.call(Hook::Throttle, |s, p| {
            p.pinset_policy_decisions()
                .call_throttle(s, &n, &outcome, pressure)
        })
    }
}

fn node(n: &sdk::NodeFacts) -> wit::NodeFacts {
    wit::NodeFacts {
        name: n.name.clone(),
        labels: n.labels.clone(),
        pools: n.pools.clone(),
        control_plane: n.control_plane,
        ready: n.ready,
        disk_pressure: n.disk_pressure,
        allocatable_ephemeral_bytes: n.allocatable_ephemeral_bytes,
    }
}

/// The SDK's columns are the contract's: a copy of each, nothing per image.
fn pack(images: &sdk::Images) -> wit::Images {
    let c = images.to_columns();
    wit::Images {
        references: c.references,
        reference_starts: c.reference_starts,
        present: c.present,
        size_known: c.size_known,
        size_bytes: c.size_bytes,
        layer_starts: c.layer_starts,
        layer_ids: c.layer_ids,
        layer_sizes: c.layer_sizes,
        set_starts: c.set_starts,
        set_ids: c.set_ids,
        set_names: c.set_names,
    }
}
