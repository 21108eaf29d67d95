//! The guard: a policy whose every answer is valid. [`Guard`] is the one place every hook of
//! every contract goes through — the call timed and reported, the answer checked, a failure
//! logged, counted and kept — and [`Guarded`] applies it to a contract's instance, answering
//! with the contract's native reference when the policy's answer is not used. Each contract's
//! hooks are in its own file (`node.rs`: the core's `Decisions`; `fleet.rs`: `grant`).

use crate::{Described, Hook, Hooks, Native, PolicyError};
use pinset_core::decisions::{Fallback, Observer};
use pinset_policy_sdk::PolicyInfo;
use std::sync::Arc;
use std::time::Instant;

/// Asks a policy, checks its answer, and on a failure logs it (once, as a warning), reports it
/// to the observer and keeps it: the one place every hook of every contract goes through.
#[derive(Default)]
pub(crate) struct Guard {
    observer: Option<Arc<dyn Observer>>,
    fallbacks: Vec<Fallback>,
    /// Log each failure as a warning; off when the caller reports them itself.
    quiet: bool,
}

impl Guard {
    pub(crate) fn observe(&mut self, observer: Arc<dyn Observer>) {
        self.observer = Some(observer);
    }

    pub(crate) fn quiet(&mut self) {
        self.quiet = true;
    }

    /// The policy's answer to `hook` when it is valid; else `None`, the failure recorded (the
    /// caller answers with its reference). `pool` names the pool a fleet decision is for.
    pub(crate) fn ask<T>(
        &mut self,
        policy: &str,
        hook: Hook,
        pool: Option<&str>,
        ask: impl FnOnce() -> Result<T, PolicyError>,
        check: impl FnOnce(&T) -> Result<(), String>,
    ) -> Option<T> {
        let started = Instant::now();
        let answer = ask();
        if let Some(o) = &self.observer {
            o.policy_call(hook, started.elapsed());
        }
        let error = match answer {
            Ok(value) => match check(&value) {
                Ok(()) => return Some(value),
                Err(reason) => PolicyError::Invalid {
                    policy: policy.to_string(),
                    hook,
                    reason,
                },
            },
            Err(e) => e,
        };
        if !self.quiet {
            let hook = hook.as_str();
            let why = "policy decision failed; using the built-in reference policy for it";
            match pool {
                Some(pool) => tracing::warn!(policy, pool, hook, error = %error, "{why}"),
                None => tracing::warn!(policy, hook, error = %error, "{why}"),
            }
        }
        if let Some(o) = &self.observer {
            o.policy_fallback(hook, error.kind());
        }
        self.fallbacks.push(Fallback {
            hook,
            kind: error.kind(),
            message: error.to_string(),
        });
        None
    }

    pub(crate) fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    pub(crate) fn take_fallbacks(&mut self) -> Vec<Fallback> {
        std::mem::take(&mut self.fallbacks)
    }
}

/// A policy of contract `C` whose every answer is valid: the primary policy's when it is, else
/// the native reference policy's. Failures are logged (unless the caller reports them itself),
/// reported to the observer and kept for status.
pub struct Guarded<C: Hooks> {
    primary: Box<C::Instance>,
    /// The primary's name, kept: every hook's failure names it.
    name: String,
    reference: Native<C>,
    guard: Guard,
}

impl<C: Hooks> Guarded<C> {
    pub fn new(primary: Box<C::Instance>) -> Self {
        Self {
            name: primary.name().to_string(),
            primary,
            reference: Native::reference(),
            guard: Guard::default(),
        }
    }

    /// A fresh instance of `module`, guarded.
    pub fn of(module: &crate::Module<C>) -> Self {
        Self::new(C::boxed(module.instance()))
    }

    /// Report every call and fallback to `observer` (Prometheus in the agent and the
    /// controller).
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.guard.observe(observer);
        self
    }

    /// No warning per failure: the caller reports the failures itself (a smoke test, whose
    /// failure is the refusal of a module that never decided anything; `pinset policy
    /// simulate`, which may meet the same failure at every decision).
    pub fn without_warnings(mut self) -> Self {
        self.guard.quiet();
        self
    }

    /// The primary policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The reference policy's name: whose answer a fallback is.
    pub fn reference_name(&self) -> &str {
        self.reference.name()
    }

    /// The failures kept since the last [`Self::take_fallbacks`].
    pub fn fallbacks(&self) -> &[Fallback] {
        self.guard.fallbacks()
    }

    pub fn take_fallbacks(&mut self) -> Vec<Fallback> {
        self.guard.take_fallbacks()
    }

    /// Ask the primary policy, check its answer, fall back to the reference policy on failure.
    /// `pool` names the pool a fleet decision is for. The answer, and whether it is the
    /// primary's.
    pub(crate) fn decide<T>(
        &mut self,
        hook: Hook,
        pool: Option<&str>,
        ask: impl FnOnce(&mut C::Instance) -> Result<T, PolicyError>,
        check: impl FnOnce(&T) -> Result<(), String>,
        reference: impl FnOnce(&mut Native<C>) -> T,
    ) -> (T, bool) {
        let primary = self.primary.as_mut();
        match self
            .guard
            .ask(&self.name, hook, pool, || ask(primary), check)
        {
            Some(answer) => (answer, true),
            None => (reference(&mut self.reference), false),
        }
    }

    pub fn info(&mut self) -> PolicyInfo {
        let reference = |r: &mut Native<C>| C::native_info(r.policy());
        self.decide(Hook::Info, None, |p| p.info(), |_| Ok(()), reference)
            .0
    }
}
