//! One reconcile's instance of a policy: calls under a deadline, failures classified, the
//! contract's types converted to and from the SDK's.

use super::borrowed::{AdmissionRequestArg, ImagesArg, NodeArg, OutcomeArg};
use super::bounded;
use super::engine::EPOCH_TICK;
use super::module::Shared;
use super::store::{Limits, LogBudget, State, new_store};
use super::wit;
use crate::{Hook, PolicyError, PolicyInstance};
use pinset_policy_sdk as sdk;
use std::sync::Arc;
use wasmtime::component::Instance;
use wasmtime::{Store, Trap};

/// One reconcile's instance of a Wasm policy.
pub struct WasmPolicy {
    pub(super) shared: Arc<Shared>,
    pub(super) live: Option<(Store<State>, Bound)>,
    /// What the policy may still log in this reconcile, whatever instances it takes.
    pub(super) log: Arc<LogBudget>,
}

/// A live instance: the component instance (its hooks are called by the export indices found
/// once per module, `Shared::hooks`).
pub(super) struct Bound {
    instance: Instance,
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
        f: impl FnOnce(&mut Store<State>, &Bound) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let ticks = deadline_ticks(self.shared.limits);
        if self.live.is_none() {
            let s = &self.shared;
            let mut store = new_store(&s.engine, &s.name, s.limits, self.log.clone());
            store.set_epoch_deadline(ticks);
            let bound = s
                .pre
                .instantiate(&mut store)
                .map(|instance| Bound { instance });
            match bound {
                Ok(bound) => self.live = Some((store, bound)),
                Err(e) => return Err(classify(&s.name, s.limits, hook, &store, e)),
            }
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
            if let Some(panic) = panic_message(store.data()) {
                message = format!("{message} ({panic})");
            }
            PolicyError::Trap {
                policy,
                hook,
                message: bounded(&message, MAX_REASON_BYTES),
            }
        }
    }
}

/// The panic that made a policy trap: the message its standard library wrote to stderr (the
/// `panicked at` line and the next), or, for a policy without one, the line its panic handler
/// logged through the contract.
fn panic_message(state: &State) -> Option<String> {
    let stderr = state.stderr.contents();
    let stderr = String::from_utf8_lossy(&stderr);
    let detail: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.contains("panicked at"))
        .take(2)
        .collect();
    if detail.is_empty() {
        return state.logged_panic.clone();
    }
    Some(detail.join(" "))
}

impl PolicyInstance for WasmPolicy {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn info(&mut self) -> Result<sdk::PolicyInfo, PolicyError> {
        let hooks = self.shared.hooks;
        let i = self.call(Hook::Info, |s, b| hooks.info(s, &b.instance))?;
        Ok(sdk::PolicyInfo {
            name: bounded(&i.name, MAX_NAME_BYTES),
            version: bounded(&i.version, MAX_NAME_BYTES),
            description: bounded(&i.description, MAX_DESCRIPTION_BYTES),
        })
    }

    fn admit(&mut self, request: &sdk::AdmissionRequest) -> Result<sdk::Admission, PolicyError> {
        let disk = disk(&request.disk);
        let arg = AdmissionRequestArg {
            node: NodeArg::of(&request.node),
            disk: &disk,
            images: ImagesArg::of(&request.images),
        };
        let hooks = self.shared.hooks;
        let a = self.call(Hook::Admit, |s, b| hooks.admit(s, &b.instance, arg))?;
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
        let (n, images) = (NodeArg::of(n), ImagesArg::of(images));
        let hooks = self.shared.hooks;
        self.call(Hook::Order, |s, b| hooks.order(s, &b.instance, n, images))
    }

    fn concurrency(&mut self, n: &sdk::NodeFacts) -> Result<u32, PolicyError> {
        let (n, hooks) = (NodeArg::of(n), self.shared.hooks);
        self.call(Hook::Concurrency, |s, b| {
            hooks.concurrency(s, &b.instance, n)
        })
    }

    fn throttle(
        &mut self,
        n: &sdk::NodeFacts,
        outcome: &sdk::PullOutcome,
        pressure: &sdk::Pressure,
    ) -> Result<u64, PolicyError> {
        let (n, outcome) = (NodeArg::of(n), OutcomeArg::of(outcome));
        let pressure = wit::Pressure {
            io: pressure.io,
            cpu: pressure.cpu,
            memory: pressure.memory,
        };
        let hooks = self.shared.hooks;
        self.call(Hook::Throttle, |s, b| {
            hooks.throttle(s, &b.instance, n, outcome, pressure)
        })
    }
}

fn disk(d: &sdk::DiskFacts) -> wit::DiskFacts {
    wit::DiskFacts {
        capacity_bytes: d.capacity_bytes,
        used_bytes: d.used_bytes,
        available_bytes: d.available_bytes,
    }
}
