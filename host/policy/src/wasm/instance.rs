//! One instance of a module, whatever its contract: calls under a deadline, failures
//! classified, the contract's `info` lifted. Each contract's hooks are called through
//! [`WasmInstance::call`] (`node.rs`, `fleet.rs`).

use super::bounded;
use super::contract::Contract;
use super::engine::EPOCH_TICK;
use super::module::Shared;
use super::store::{Limits, LogBudget, State, new_store};
use crate::{Hook, PolicyError};
use pinset_policy_sdk as sdk;
use std::sync::Arc;
use wasmtime::AsContextMut;
use wasmtime::component::{
    ComponentExportIndex, ComponentNamedList, ComponentType, Instance, Lift, Lower, TypedFunc,
};
use wasmtime::{Store, Trap};

/// An instance of a module bound to contract `C`: one reconcile's (node) or one decision's
/// (fleet). Instantiated on its first call; a failed call discards it.
pub struct WasmInstance<C: Contract> {
    pub(super) shared: Arc<Shared<C>>,
    live: Option<(Store<State>, Instance)>,
    /// What the policy may still log in this instance's reconcile or decision, whatever stores
    /// it takes.
    log: Arc<LogBudget>,
}

/// `record policy-info`, the same in every contract.
#[derive(ComponentType, Lift)]
#[component(record)]
struct InfoRecord {
    name: String,
    version: String,
    description: String,
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

impl<C: Contract> WasmInstance<C> {
    pub(super) fn new(shared: Arc<Shared<C>>) -> Self {
        Self {
            shared,
            live: None,
            log: Arc::default(),
        }
    }

    /// Run one hook, instantiating first when there is no live instance, under the module's
    /// deadline. Any failure drops the store (a trapped instance may not be entered again); so
    /// does every call of a contract whose calls each take a fresh instance.
    pub(super) fn call<R>(
        &mut self,
        hook: Hook,
        f: impl FnOnce(&mut Store<State>, &Instance, &C::Exports) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let (s, ticks) = (&self.shared, deadline_ticks(self.shared.limits));
        if self.live.is_none() {
            let mut store = new_store(&s.engine, &s.name, s.limits, self.log.clone());
            store.set_epoch_deadline(ticks);
            match s.pre.instantiate(&mut store) {
                Ok(instance) => self.live = Some((store, instance)),
                Err(e) => return Err(classify(&s.name, s.limits, hook, &store, e)),
            }
        }
        let (store, instance) = self.live.as_mut().expect("instantiated above");
        store.set_epoch_deadline(ticks);
        match f(store, instance, &s.exports) {
            Ok(answer) => {
                if C::FRESH_PER_CALL {
                    self.live = None;
                }
                Ok(answer)
            }
            Err(e) => {
                let (store, _) = self.live.take().expect("live instance");
                Err(classify(&s.name, s.limits, hook, &store, e))
            }
        }
    }
}

impl<C: Contract> crate::Described for WasmInstance<C> {
    fn name(&self) -> &str {
        &self.shared.name
    }

    /// What the module says of itself, its strings bounded.
    fn info(&mut self) -> Result<sdk::PolicyInfo, PolicyError> {
        let info = C::info(&self.shared.exports);
        let i: InfoRecord = self.call(Hook::Info, |s, instance, _| call(s, instance, info, ()))?;
        Ok(sdk::PolicyInfo {
            name: bounded(&i.name, MAX_NAME_BYTES),
            version: bounded(&i.version, MAX_NAME_BYTES),
            description: bounded(&i.description, MAX_DESCRIPTION_BYTES),
        })
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

/// Call export `func` of `instance`, its types checked against `P` and `R`.
pub(super) fn call<P, R>(
    mut store: impl AsContextMut,
    instance: &Instance,
    func: ComponentExportIndex,
    params: P,
) -> wasmtime::Result<R>
where
    P: ComponentNamedList + Lower + Send + Sync,
    R: ComponentType + Lift + Send + Sync + 'static,
{
    let f: TypedFunc<P, (R,)> = instance.get_typed_func(&mut store, func)?;
    Ok(f.call(&mut store, params)?.0)
}

/// A module's functions checked against the host's types, in an instance made for it when the
/// module loads ([`Contract::typecheck`], and `info`): a module that cannot be instantiated, or
/// whose function differs from what the host lowers and lifts, is refused there, named.
pub(super) fn typecheck<C: Contract>(
    engine: &wasmtime::Engine,
    name: &str,
    limits: Limits,
    pre: &wasmtime::component::InstancePre<State>,
    exports: &C::Exports,
) -> Result<(), crate::LoadError> {
    let mut store = new_store(engine, name, limits, Arc::default());
    store.set_epoch_deadline(deadline_ticks(limits));
    let instance = pre
        .instantiate(&mut store)
        .map_err(|e| crate::LoadError::Instantiate {
            module: name.into(),
            cause: classify(name, limits, Hook::Info, &store, e).to_string(),
        })?;
    let info = C::info(exports);
    super::contract::check::<(), InfoRecord>(&mut store, &instance, "info", info)
        .and_then(|()| C::typecheck(&mut store, &instance, exports))
        .map_err(|(function, e)| crate::LoadError::Mismatch {
            module: name.into(),
            interface: C::INTERFACE,
            function,
            cause: format!("{e:#}"),
        })
}
