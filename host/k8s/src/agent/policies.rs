//! Which node policy module a node decides with, and how that changes while the agent runs.
//!
//! The policy configuration ([`crate::policy_config`]) names a module for the node's primary
//! pool; a rollout grant covering the module's target entry
//! ([`pinset_core::rollout::policy_set`]) lets the node take it. A candidate is fetched (file or
//! `oci://…@sha256:…`, its signature checked where keys are configured), compiled, and
//! smoke-tested on the node's current facts ([`pinset_policy::smoke_test`]) before it replaces
//! the running module, between two reconciles. Its first reconcile is its probation: a fallback
//! there puts the previous module back. A module refused at any step never replaces the running
//! one; the node says which and why on its status, and keeps the module it ran last.

use crate::policy_config::{ModuleRef, PolicyConfig};
use pinset_core::rollout::{RolloutGrant, policy_set};
use pinset_core::status::{NodeStatus, RejectedPolicy, RunningPolicy};
use pinset_node::policy_source::Fetcher;
use pinset_node::registry::signature::VerifyingKey;
use pinset_policy::{Limits, LoadError, PolicyModule, WasmRuntime};
use pinset_policy_sdk::{AdmissionRequest, Pressure};

/// Fetches, verifies and compiles node policy modules; holds the embedded default.
pub struct Loader {
    pub runtime: WasmRuntime,
    pub default: PolicyModule,
    pub limits: Limits,
    pub fetcher: Fetcher,
}

impl Loader {
    /// One module: fetched (file or artifact, signature checked against `keys`), compiled and
    /// bound. Blocking: the agent calls it off the async runtime.
    pub fn load(&self, m: &ModuleRef, keys: &[VerifyingKey]) -> Result<PolicyModule, LoadError> {
        crate::policy_config::load_module(&self.runtime, self.limits, &self.fetcher, m, keys)
    }

    /// The embedded default, as a node status reports it.
    pub fn default_loaded(&self) -> Loaded {
        Loaded::new(self.default.clone(), None, &now())
    }
}

/// A module a node can decide with, and what its status says of it.
#[derive(Clone)]
pub struct Loaded {
    pub module: PolicyModule,
    /// As the configuration names it; `None` for the embedded default.
    pub reference: Option<String>,
    pub running: RunningPolicy,
}

impl Loaded {
    fn new(module: PolicyModule, reference: Option<String>, since: &str) -> Self {
        use pinset_policy::Described as _;
        let (name, version) = match module.instance().info() {
            Ok(info) => (info.name, info.version),
            Err(e) => (format!("(no info: {e})"), String::new()),
        };
        let running = RunningPolicy {
            name,
            version,
            digest: format!("sha256:{}", module.sha256()),
            module: reference
                .clone()
                .unwrap_or_else(|| pinset_policy::EMBEDDED_DEFAULT_NAME.to_string()),
            since: since.to_string(),
        };
        Self {
            module,
            reference,
            running,
        }
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// What the configuration and the node's grant ask of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wanted {
    pub pool: Option<String>,
    /// `None`: the embedded default.
    pub module: Option<ModuleRef>,
    /// The keys its signature must verify with (PEM).
    pub keys: Vec<String>,
    /// The node may take it now: granted by the controller, or no grant is needed (the
    /// default, a configuration of the node's own, `--rollout=free`).
    pub granted: bool,
}

impl Wanted {
    /// For a node of `pools` (the first is its primary), under `grant` (`None`: no grant needed).
    pub fn of(config: &PolicyConfig, pools: &[String], grant: Option<&RolloutGrant>) -> Self {
        let pool = pools.first().cloned();
        let module = pool.as_ref().and_then(|p| config.pools.get(p)).cloned();
        let keys = module
            .as_ref()
            .and_then(|m| m.verify.as_ref().or(config.verify.as_ref()))
            .map(|v| v.keys.clone())
            .unwrap_or_default();
        let granted = match (&module, grant) {
            (None, _) | (_, None) => true,
            (Some(m), Some(g)) => g.covers(&policy_set(&m.reference()), 1),
        };
        Self {
            pool,
            module,
            keys,
            granted,
        }
    }

    pub fn reference(&self) -> Option<String> {
        self.module.as_ref().map(ModuleRef::reference)
    }
}

/// How a swap ended, for `pinset_policy_swaps_total{result}` and the node's Events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwapResult {
    /// The candidate passed every check and decides from now on (on probation).
    Swapped,
    /// A step refused it; the running module stays.
    Rejected,
    /// It fell back in its first reconcile: the previous module is back.
    Reverted,
}

impl SwapResult {
    pub fn as_str(self) -> &'static str {
        match self {
            SwapResult::Swapped => "swapped",
            SwapResult::Rejected => "rejected",
            SwapResult::Reverted => "reverted",
        }
    }
}

/// The node's policy: the module it runs, the one before, the last it refused.
pub struct NodePolicy {
    running: Loaded,
    previous: Option<Loaded>,
    rejected: Option<RejectedPolicy>,
    /// The running module was swapped in and has not finished a reconcile yet.
    probation: bool,
    /// The configuration could not be read: why (the node keeps what it runs).
    config_error: Option<String>,
}

impl NodePolicy {
    pub fn new(running: Loaded) -> Self {
        Self {
            running,
            previous: None,
            rejected: None,
            probation: false,
            config_error: None,
        }
    }

    pub fn running(&self) -> &Loaded {
        &self.running
    }

    /// The node should try `wanted` now.
    pub fn should_try(&self, wanted: &Wanted) -> bool {
        wanted.granted && wanted.reference() != self.running.reference
    }

    /// A try of `wanted` is due that was not tried and refused already: what wakes an idle
    /// agent (a refused module is tried again at the next round).
    pub fn pending(&self, wanted: &Wanted) -> bool {
        let refused = self.rejected.as_ref().map(|r| Some(&r.module));
        self.should_try(wanted) && refused != Some(wanted.reference().as_ref())
    }

    pub fn set_config_error(&mut self, error: Option<String>) {
        self.config_error = error;
    }

    /// `candidate` decides from now on; its first reconcile is its probation.
    pub fn accept(&mut self, candidate: Loaded) -> SwapResult {
        tracing::info!(module = %candidate.running.module, digest = %candidate.running.digest, "node policy swapped");
        self.previous = Some(std::mem::replace(&mut self.running, candidate));
        self.rejected = None;
        self.probation = true;
        SwapResult::Swapped
    }

    /// `module` was refused: the running module stays.
    pub fn reject(&mut self, module: String, cause: String) -> SwapResult {
        tracing::warn!(%module, %cause, running = %self.running.running.module, "node policy refused; keeping the running module");
        self.rejected = Some(RejectedPolicy {
            module,
            cause,
            since: now(),
        });
        SwapResult::Rejected
    }

    /// A reconcile finished with `fallbacks`: a module on probation that fell back is replaced
    /// by the one before it.
    pub fn after_reconcile(&mut self, fallbacks: &[String]) -> Option<SwapResult> {
        if !std::mem::take(&mut self.probation) {
            return None;
        }
        let first = fallbacks.first()?;
        let failed = self.running.running.module.clone();
        let back = self.previous.take()?;
        self.running = back;
        let cause = format!("fell back in its first reconcile: {first}");
        self.reject(failed, cause);
        Some(SwapResult::Reverted)
    }

    /// What the node's status says of its policy.
    pub fn report(&self, pool: Option<&str>, status: &mut NodeStatus) {
        status.policy = Some(self.running.running.clone());
        status.policy_rejected = self.rejected.clone();
        let pool = pool.unwrap_or("(none)");
        let running = &self.running.running.module;
        status.policy_refused = match (&self.rejected, &self.config_error) {
            (Some(r), _) => Some(format!(
                "policy of pool {pool}: {} refused: {}; deciding with {running}",
                r.module, r.cause
            )),
            (None, Some(e)) => Some(format!("{e}; deciding with {running}")),
            (None, None) => None,
        };
    }
}

/// Check `wanted`'s module for a node whose facts are `request`: fetched, verified, compiled,
/// smoke-tested. Blocking. The error says which step refused it.
pub fn candidate(
    loader: &Loader,
    wanted: &Wanted,
    request: &AdmissionRequest,
    pressure: &Pressure,
) -> Result<Loaded, String> {
    let Some(m) = &wanted.module else {
        return Ok(loader.default_loaded());
    };
    let keys = wanted
        .keys
        .iter()
        .enumerate()
        .map(|(n, pem)| VerifyingKey::from_pem(pem).map_err(|e| format!("key {}: {e}", n + 1)))
        .collect::<Result<Vec<_>, _>>()?;
    let module = loader.load(m, &keys).map_err(|e| e.to_string())?;
    pinset_policy::smoke_test(&module, request, pressure)
        .map_err(|f| format!("smoke test on the node's facts: {f}"))?;
    Ok(Loaded::new(module, Some(m.reference()), &now()))
}

/// The module a restarted node ran, as its status says (`reference`), loaded again (from the
/// node's cache when it is an artifact) without a smoke test: it passed one before.
pub fn restore(
    loader: &Loader,
    config: &PolicyConfig,
    pool: Option<&str>,
    reference: &str,
    since: &str,
) -> Result<Loaded, String> {
    let m = ModuleRef::from_reference(reference).ok_or("no module named")?;
    let configured = pool.and_then(|p| config.pools.get(p));
    let keys = match configured {
        Some(c) => config.keys(pool.unwrap_or_default(), c),
        None => config.keys("", &m),
    }
    .map_err(|e| e.to_string())?;
    let module = loader.load(&m, &keys).map_err(|e| e.to_string())?;
    Ok(Loaded::new(module, Some(reference.to_string()), since))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loader() -> Loader {
        let runtime = WasmRuntime::new().unwrap();
        let default = runtime
            .load(
                "d",
                pinset_policy::EMBEDDED_DEFAULT,
                None,
                Limits::default(),
            )
            .unwrap();
        Loader {
            runtime,
            default,
            limits: Limits::default(),
            fetcher: Fetcher {
                artifacts: pinset_node::registry::artifact::Artifacts::new(
                    vec![],
                    Default::default(),
                ),
                cache: None,
                max_bytes: 1 << 20,
            },
        }
    }

    fn config(yaml: &str) -> PolicyConfig {
        PolicyConfig::parse(yaml, "test").unwrap()
    }

    fn request() -> AdmissionRequest {
        pinset_policy::synth::request(5, 1)
    }

    #[test]
    fn a_module_is_taken_only_under_a_grant_covering_it() {
        let oci = format!("oci://r.io/p@sha256:{}", "a".repeat(64));
        let c = config(&format!("pools:\n  infra: {{module: {oci:?}}}\n"));
        let infra = ["infra".to_string()];
        let mut grant = RolloutGrant::default();
        assert!(!Wanted::of(&c, &infra, Some(&grant)).granted);
        assert!(Wanted::of(&c, &infra, None).granted, "no grant needed");
        grant.sets.insert(policy_set(&oci), 1);
        assert!(Wanted::of(&c, &infra, Some(&grant)).granted);
        let worker = Wanted::of(&c, &["worker".to_string()], Some(&RolloutGrant::default()));
        assert!(
            worker.granted && worker.module.is_none(),
            "the default needs no grant"
        );
    }

    #[test]
    fn a_refused_candidate_leaves_the_running_module_and_says_why() {
        let loader = loader();
        let mut node = NodePolicy::new(loader.default_loaded());
        let c = config("pools:\n  infra: {module: /nonexistent/p.wasm}\n");
        let wanted = Wanted::of(&c, &["infra".to_string()], None);
        assert!(node.pending(&wanted));
        let why = candidate(&loader, &wanted, &request(), &Pressure::default())
            .err()
            .unwrap();
        node.reject(wanted.reference().unwrap(), why);
        assert!(
            !node.pending(&wanted),
            "not woken again for the same module"
        );
        assert!(
            node.should_try(&wanted),
            "but tried again at the next round"
        );
        let mut status = NodeStatus::default();
        node.report(Some("infra"), &mut status);
        assert_eq!(
            status.policy.unwrap().module,
            pinset_policy::EMBEDDED_DEFAULT_NAME
        );
        let refused = status.policy_refused.unwrap();
        assert!(
            refused.contains("pool infra") && refused.contains("/nonexistent/p.wasm"),
            "{refused}"
        );
        assert_eq!(
            status.policy_rejected.unwrap().module,
            "/nonexistent/p.wasm"
        );
    }

    #[test]
    fn an_unreadable_configuration_keeps_the_running_module_and_says_why() {
        let loader = loader();
        let mut node = NodePolicy::new(loader.default_loaded());
        node.set_config_error(Some(
            "policy configuration PolicyConfiguration cluster: pool infra: key 1: not a PEM".into(),
        ));
        let mut status = NodeStatus::default();
        node.report(Some("infra"), &mut status);
        let said = status.policy_refused.clone().unwrap();
        assert!(
            said.contains("key 1") && said.ends_with(pinset_policy::EMBEDDED_DEFAULT_NAME),
            "{said}"
        );
        node.set_config_error(None);
        node.report(Some("infra"), &mut status);
        assert_eq!(status.policy_refused, None);
    }

    #[test]
    fn a_signature_requirement_refuses_a_file() {
        let loader = loader();
        let key = pinset_node::registry::signature::SigningKey::generate(b"")
            .unwrap()
            .1
            .public()
            .to_pem();
        let c = config(&format!(
            "verify: {{keys: [{key:?}]}}\npools:\n  infra: {{module: /p/a.wasm}}\n"
        ));
        let wanted = Wanted::of(&c, &["infra".to_string()], None);
        let why = candidate(&loader, &wanted, &request(), &Pressure::default())
            .err()
            .unwrap();
        assert!(
            why.contains("signature is required") && why.contains("/p/a.wasm"),
            "{why}"
        );
    }

    #[test]
    fn a_module_that_falls_back_in_its_first_reconcile_is_replaced_by_the_previous() {
        let loader = loader();
        let mut node = NodePolicy::new(loader.default_loaded());
        let v2 = Loaded::new(loader.default.clone(), Some("/p/v2.wasm".into()), "t");
        assert_eq!(node.accept(v2.clone()), SwapResult::Swapped);
        assert_eq!(
            node.after_reconcile(&["order: trap".into()]),
            Some(SwapResult::Reverted)
        );
        assert_eq!(node.running().reference, None, "the default is back");
        let mut status = NodeStatus::default();
        node.report(Some("infra"), &mut status);
        let rejected = status.policy_rejected.unwrap();
        assert_eq!(rejected.module, "/p/v2.wasm");
        assert!(
            rejected.cause.contains("first reconcile: order: trap"),
            "{rejected:?}"
        );
        // Past its probation, a fallback is the module's to answer for, not a swap's.
        node.accept(v2);
        assert_eq!(node.after_reconcile(&[]), None);
        assert_eq!(node.after_reconcile(&["order: trap".into()]), None);
        assert_eq!(node.running().reference.as_deref(), Some("/p/v2.wasm"));
    }
}
