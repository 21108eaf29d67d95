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
pub use crate::policy_loader::{Loader, Refusing};
use pinset_core::refusal::Refusal;
use pinset_core::rollout::{RolloutGrant, policy_set};
use pinset_core::status::{NodeStatus, RejectedPolicy, RunningPolicy};
use pinset_policy::{NodeContract, PolicyModule};
use pinset_policy_sdk::{AdmissionRequest, Pressure};
use pinset_registry::signature::VerifyingKey;

/// A module a node can decide with, and what its status says of it.
#[derive(Clone)]
pub struct Loaded {
    pub module: PolicyModule,
    /// As the configuration names it; `None` for the embedded default.
    pub reference: Option<String>,
    pub running: RunningPolicy,
}

impl Loaded {
    /// The embedded default, as a node status reports it.
    pub fn default_of(module: &PolicyModule) -> Self {
        Self::new(module.clone(), None, &now())
    }

    fn new(module: PolicyModule, reference: Option<String>, since: &str) -> Self {
        use pinset_policy::Described as _;
        let (name, version) = match module.instance().info() {
            Ok(info) => (info.name, info.version),
            Err(e) => (format!("(no info: {e})"), String::new()),
        };
        let content = format!("sha256:{}", module.sha256());
        let running = RunningPolicy {
            name,
            version,
            digest: pinset_core::status::policy_digest(reference.as_deref(), &content),
            module_digest: content,
            module: reference
                .clone()
                .unwrap_or_else(|| pinset_policy::EMBEDDED_DEFAULT_NAME.to_string()),
            since: since.to_string(),
            probation: false,
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
pub struct WantedPolicy {
    pub pool: Option<String>,
    /// `None`: the embedded default.
    pub module: Option<ModuleRef>,
    /// The keys its signature must verify with (PEM).
    pub keys: Vec<String>,
    /// The node may take it now: granted by the controller, or no grant is needed (the
    /// default, a configuration of the node's own, `--rollout=free`).
    pub granted: bool,
}

impl WantedPolicy {
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
    /// Its registry is away: no verdict, asked again with backoff; the running module stays.
    Waiting,
    /// It fell back in its first reconcile: the previous module is back.
    Reverted,
}

impl SwapResult {
    pub fn as_str(self) -> &'static str {
        match self {
            SwapResult::Swapped => "swapped",
            SwapResult::Rejected => "rejected",
            SwapResult::Waiting => "waiting",
            SwapResult::Reverted => "reverted",
        }
    }
}

/// A check's identity: a module (`None`: the embedded default) under a set of trusted keys. A
/// verdict on a module stands for those keys only; another key set is another check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CheckKey {
    pub module: Option<String>,
    /// [`fingerprint`] of the keys.
    pub keys: String,
}

impl CheckKey {
    pub fn of(wanted: &WantedPolicy) -> Self {
        Self {
            module: wanted.reference(),
            keys: fingerprint(&wanted.keys),
        }
    }
}

pub use crate::policy_config::fingerprint;

/// A module refused under a key set, and of what kind.
#[derive(Clone, Debug)]
struct Refused {
    key: CheckKey,
    kind: Refusal,
    report: RejectedPolicy,
}

/// The node's policy: the module it runs (and the keys it was checked with), the one before,
/// the last it refused, and a module it waits for while its registry is away.
pub struct NodePolicy {
    running: Loaded,
    running_keys: String,
    previous: Option<(Loaded, String)>,
    refused: Option<Refused>,
    /// The registry of a wanted module is away: (module, cause). No verdict on the module.
    waiting: Option<(String, String)>,
    /// The running module was swapped in and no reconcile with it has succeeded yet.
    probation: bool,
    /// The configuration could not be read: why (the node keeps what it runs).
    config_error: Option<String>,
}

impl NodePolicy {
    pub fn new(running: Loaded) -> Self {
        Self {
            running,
            running_keys: String::new(),
            previous: None,
            refused: None,
            waiting: None,
            probation: false,
            config_error: None,
        }
    }

    pub fn running(&self) -> &Loaded {
        &self.running
    }

    /// The digests of the modules in use — the running one and the one before it, by manifest
    /// digest and by content — which the node's cache keeps whatever its bound.
    pub fn in_use(&self) -> Vec<String> {
        let previous = self.previous.as_ref().map(|(loaded, _)| loaded);
        std::iter::once(&self.running)
            .chain(previous)
            .flat_map(|l| {
                let manifest = l
                    .reference
                    .as_ref()
                    .and_then(|r| r.rsplit_once('@'))
                    .map(|(_, d)| d.to_string());
                manifest
                    .into_iter()
                    .chain([l.running.module_digest.clone()])
            })
            .collect()
    }

    /// The keys the running module was checked with ([`fingerprint`]).
    pub fn running_keys(&self) -> &str {
        &self.running_keys
    }

    /// The configuration and the grant ask for another module than the running one.
    pub fn should_try(&self, wanted: &WantedPolicy) -> bool {
        wanted.granted && wanted.reference() != self.running.reference
    }

    /// `key` was refused for a reason that stands until its digest or the keys change.
    pub fn refused_for_good(&self, key: &CheckKey) -> bool {
        self.refused
            .as_ref()
            .is_some_and(|r| r.key == *key && !r.kind.rechecked())
    }

    pub fn set_config_error(&mut self, error: Option<String>) {
        self.config_error = error;
    }

    /// `candidate`, checked with the keys of `key`, decides from now on; its first successful
    /// reconcile ends its probation.
    pub fn accept(&mut self, candidate: Loaded, key: &CheckKey) -> SwapResult {
        tracing::info!(module = %candidate.running.module, digest = %candidate.running.digest, "node policy swapped");
        let before = std::mem::replace(&mut self.running, candidate);
        let before_keys = std::mem::replace(&mut self.running_keys, key.keys.clone());
        self.previous = Some((before, before_keys));
        self.refused = None;
        self.waiting = None;
        self.probation = true;
        SwapResult::Swapped
    }

    /// The running module is confirmed for `keys` (a re-check after the keys changed).
    pub fn confirm_keys(&mut self, keys: &str) {
        self.running_keys = keys.to_string();
    }

    /// `key`'s module was not taken, for a reason of `kind`: the running module stays. A
    /// registry away is no verdict: the node says it waits for it.
    pub fn refuse(&mut self, key: &CheckKey, kind: Refusal, cause: String) -> SwapResult {
        let module = key
            .module
            .clone()
            .unwrap_or_else(|| pinset_policy::EMBEDDED_DEFAULT_NAME.into());
        let running = &self.running.running.module;
        if kind.transient() {
            tracing::warn!(%module, %cause, %running, "node policy module not checked: its registry is away; asking again with backoff");
            self.waiting = Some((module, cause));
            return SwapResult::Waiting;
        }
        tracing::warn!(%module, reason = kind.reason(), %cause, %running, "node policy module refused: {}", kind.action());
        self.waiting = None;
        self.refused = Some(Refused {
            key: key.clone(),
            kind,
            report: RejectedPolicy {
                module,
                reason: kind.reason().into(),
                cause,
                since: now(),
            },
        });
        SwapResult::Rejected
    }

    /// The running module no longer verifies with the keys now trusted (`kind`, `cause`): the
    /// previous module decides when it was checked with these keys, else the default.
    pub fn retire(&mut self, default: Loaded, keys: &CheckKey, kind: Refusal, cause: String) {
        let retired = CheckKey {
            module: self.running.reference.clone(),
            keys: keys.keys.clone(),
        };
        let back = match self.previous.take() {
            Some((loaded, k)) if k == keys.keys => (loaded, k),
            _ => (default, String::new()),
        };
        tracing::warn!(module = ?retired.module, %cause, "the running node policy no longer verifies with the trusted keys: replaced");
        (self.running, self.running_keys) = back;
        self.probation = false;
        self.refuse(&retired, kind, format!("no longer trusted: {cause}"));
    }

    /// A reconcile ended (`ok`: it succeeded) with `fallbacks`. Probation ends with the first
    /// successful reconcile: a module on probation that fell back there is replaced by the one
    /// before it, and not tried again until its digest or the keys change.
    pub fn after_reconcile(&mut self, ok: bool, fallbacks: &[String]) -> Option<SwapResult> {
        if !self.probation || !ok {
            return None;
        }
        self.probation = false;
        let first = fallbacks.first()?;
        let (back, back_keys) = self.previous.take()?;
        let failed = CheckKey {
            module: self.running.reference.clone(),
            keys: self.running_keys.clone(),
        };
        (self.running, self.running_keys) = (back, back_keys);
        let cause = format!("fell back in its first reconcile: {first}");
        self.refuse(&failed, Refusal::FellBack, cause);
        Some(SwapResult::Reverted)
    }

    /// What the node's status says of its policy, for `wanted` (what is configured now: a
    /// refusal of a module no longer configured is no longer said).
    pub fn report(&self, wanted: &WantedPolicy, status: &mut NodeStatus) {
        let mut running = self.running.running.clone();
        running.probation = self.probation;
        status.policy = Some(running);
        let configured = wanted.reference();
        let current = |module: &str| {
            configured.as_deref() == Some(module) && configured != self.running.reference
        };
        let refused = self.refused.as_ref().filter(|r| current(&r.report.module));
        let waiting = self.waiting.as_ref().filter(|(m, _)| current(m));
        status.policy_rejected = refused.map(|r| r.report.clone());
        let pool = wanted.pool.as_deref().unwrap_or("(none)");
        let running = &self.running.running.module;
        status.policy_waiting = waiting.map(|(module, cause)| {
            format!(
                "policy of pool {pool}: waiting for the registry of {module} ({cause}); deciding with {running}"
            )
        });
        status.policy_refused = match (refused, &self.config_error) {
            (Some(r), _) => Some(format!(
                "policy of pool {pool}: {} refused ({}): {}; {}; deciding with {running}",
                r.report.module,
                r.report.reason,
                r.report.cause,
                r.kind.action()
            )),
            (None, Some(e)) => Some(format!("{e}; deciding with {running}")),
            (None, None) => None,
        };
    }
}

/// Fetch `wanted`'s module (a file, or an artifact through the registry and the node's cache,
/// its signature checked), within [`pinset_registry::limits::POLICY_FETCH`]. The step that
/// touches the network: the agent runs it in the background.
pub async fn fetch(
    loader: &Loader,
    wanted: &WantedPolicy,
) -> Result<Option<pinset_registry::policy_source::Fetched>, Refusing> {
    let Some(m) = &wanted.module else {
        return Ok(None);
    };
    let keys = keys_of(wanted)?;
    loader.fetch(m, &keys).await.map(Some)
}

fn keys_of(wanted: &WantedPolicy) -> Result<Vec<VerifyingKey>, Refusing> {
    wanted
        .keys
        .iter()
        .enumerate()
        .map(|(n, pem)| {
            VerifyingKey::from_pem(pem)
                .map_err(|e| (Refusal::SignatureRefused, format!("key {}: {e}", n + 1)))
        })
        .collect()
}

/// Compile `fetched` (the module `wanted` names) and smoke-test it on a node whose facts are
/// `request`; `default` when `wanted` names none. Blocking.
pub fn prove(
    loader: &Loader,
    default: &PolicyModule,
    wanted: &WantedPolicy,
    fetched: Option<pinset_registry::policy_source::Fetched>,
    request: &AdmissionRequest,
    pressure: &Pressure,
) -> Result<Loaded, Refusing> {
    let (Some(m), Some(fetched)) = (&wanted.module, fetched) else {
        return Ok(Loaded::default_of(default));
    };
    let on = "the node's facts";
    let module = loader.prove::<NodeContract>(m, &fetched, (request, pressure), on)?;
    Ok(Loaded::new(module, Some(m.reference()), &now()))
}

/// The module a restarted node ran, as its status says (`reference`), loaded again (from the
/// node's cache when it is an artifact) under the keys configured now, without a smoke test: it
/// passed one before. Blocking.
pub fn restore(
    loader: &Loader,
    config: &PolicyConfig,
    pool: Option<&str>,
    reference: &str,
    since: &str,
) -> Result<(Loaded, String), Refusing> {
    let m = ModuleRef::from_reference(reference)
        .ok_or((Refusal::NotAPolicy, "no module named".to_string()))?;
    let configured = pool.and_then(|p| config.pools.get(p));
    let verify = configured
        .and_then(|c| c.verify.as_ref())
        .or(config.verify.as_ref());
    let pems = verify.map(|v| v.keys.clone()).unwrap_or_default();
    let keys = match configured {
        Some(c) => config.keys(pool.unwrap_or_default(), c),
        None => config.keys("", &m),
    }
    .map_err(|e| (Refusal::SignatureRefused, e.to_string()))?;
    let module = loader.load::<NodeContract>(&m, &keys)?;
    Ok((
        Loaded::new(module, Some(reference.to_string()), since),
        fingerprint(&pems),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use pinset_policy::{Limits, WasmRuntime};

    fn loader() -> Loader {
        Loader::for_tests(1 << 20)
    }

    /// The embedded default, compiled once for the module's tests.
    fn default() -> PolicyModule {
        static DEFAULT: std::sync::OnceLock<PolicyModule> = std::sync::OnceLock::new();
        DEFAULT
            .get_or_init(|| {
                let runtime = WasmRuntime::new().unwrap();
                let embedded = pinset_policy::EMBEDDED_DEFAULT;
                runtime
                    .load("d", embedded, None, Limits::default())
                    .unwrap()
            })
            .clone()
    }

    fn config(yaml: &str) -> PolicyConfig {
        PolicyConfig::parse(yaml, "test").unwrap()
    }

    #[test]
    fn a_module_is_taken_only_under_a_grant_covering_it() {
        let oci = format!("oci://r.io/p@sha256:{}", "a".repeat(64));
        let c = config(&format!("pools:\n  infra: {{module: {oci:?}}}\n"));
        let infra = ["infra".to_string()];
        let mut grant = RolloutGrant::default();
        assert!(!WantedPolicy::of(&c, &infra, Some(&grant)).granted);
        assert!(
            WantedPolicy::of(&c, &infra, None).granted,
            "no grant needed"
        );
        grant.sets.insert(policy_set(&oci), 1);
        assert!(WantedPolicy::of(&c, &infra, Some(&grant)).granted);
        let worker = WantedPolicy::of(&c, &["worker".to_string()], Some(&RolloutGrant::default()));
        assert!(
            worker.granted && worker.module.is_none(),
            "the default needs no grant"
        );
    }

    fn key(module: &str) -> CheckKey {
        CheckKey {
            module: Some(module.into()),
            keys: String::new(),
        }
    }

    #[tokio::test]
    async fn a_refused_candidate_leaves_the_running_module_and_says_why_while_it_is_configured() {
        let loader = loader();
        let mut node = NodePolicy::new(Loaded::default_of(&default()));
        let c = config("pools:\n  infra: {module: /nonexistent/p.wasm}\n");
        let wanted = WantedPolicy::of(&c, &["infra".to_string()], None);
        assert!(node.should_try(&wanted));
        let (kind, why) = fetch(&loader, &wanted).await.unwrap_err();
        assert_eq!(kind, Refusal::NotFound, "{why}");
        node.refuse(&CheckKey::of(&wanted), kind, why);
        assert!(
            !node.refused_for_good(&CheckKey::of(&wanted)),
            "not found may pass: checked again on the schedule"
        );
        let mut status = NodeStatus::default();
        node.report(&wanted, &mut status);
        assert_eq!(
            status.policy.clone().unwrap().module,
            pinset_policy::EMBEDDED_DEFAULT_NAME
        );
        let refused = status.policy_refused.clone().unwrap();
        assert!(
            refused.contains("pool infra")
                && refused.contains("/nonexistent/p.wasm")
                && refused.contains("(NotFound)"),
            "{refused}"
        );
        assert_eq!(status.policy_rejected.clone().unwrap().reason, "NotFound");
        // The configuration no longer names it: the refusal is no longer said.
        let other = WantedPolicy::of(&config("pools: {}\n"), &["infra".to_string()], None);
        node.report(&other, &mut status);
        assert_eq!(status.policy_rejected, None);
        assert_eq!(status.policy_refused, None);
    }

    #[test]
    fn a_registry_away_is_waited_for_not_refused() {
        let mut node = NodePolicy::new(Loaded::default_of(&default()));
        let oci = format!("oci://r.io/p@sha256:{}", "a".repeat(64));
        let c = config(&format!("pools:\n  infra: {{module: {oci:?}}}\n"));
        let wanted = WantedPolicy::of(&c, &["infra".to_string()], None);
        let result = node.refuse(
            &CheckKey::of(&wanted),
            Refusal::RegistryAway,
            "r.io: refused".into(),
        );
        assert_eq!(result, SwapResult::Waiting);
        let mut status = NodeStatus::default();
        node.report(&wanted, &mut status);
        assert_eq!(status.policy_rejected, None, "no verdict on the module");
        assert_eq!(status.policy_refused, None, "and no refusal");
        let said = status.policy_waiting.unwrap();
        assert!(
            said.contains("waiting for the registry of") && said.contains(&oci),
            "{said}"
        );
    }

    #[test]
    fn an_unreadable_configuration_keeps_the_running_module_and_says_why() {
        let mut node = NodePolicy::new(Loaded::default_of(&default()));
        node.set_config_error(Some(
            "policy configuration PolicyConfiguration cluster: pool infra: key 1: not a PEM".into(),
        ));
        let wanted = WantedPolicy::default();
        let mut status = NodeStatus::default();
        node.report(&wanted, &mut status);
        let said = status.policy_refused.clone().unwrap();
        assert!(
            said.contains("key 1") && said.ends_with(pinset_policy::EMBEDDED_DEFAULT_NAME),
            "{said}"
        );
        node.set_config_error(None);
        node.report(&wanted, &mut status);
        assert_eq!(status.policy_refused, None);
    }

    #[tokio::test]
    async fn a_signature_requirement_refuses_a_file() {
        let loader = loader();
        let key = pinset_registry::signature::SigningKey::generate(b"")
            .unwrap()
            .1
            .public()
            .to_pem();
        let c = config(&format!(
            "verify: {{keys: [{key:?}]}}\npools:\n  infra: {{module: /p/a.wasm}}\n"
        ));
        let wanted = WantedPolicy::of(&c, &["infra".to_string()], None);
        let (kind, why) = fetch(&loader, &wanted).await.unwrap_err();
        assert_eq!(kind, Refusal::NotAPolicy);
        assert!(
            why.contains("signature is required") && why.contains("/p/a.wasm"),
            "{why}"
        );
    }

    #[test]
    fn probation_ends_with_a_successful_reconcile_and_a_fallback_there_reverts_for_good() {
        let mut node = NodePolicy::new(Loaded::default_of(&default()));
        let v2 = Loaded::new(default(), Some("/p/v2.wasm".into()), "t");
        assert_eq!(
            node.accept(v2.clone(), &key("/p/v2.wasm")),
            SwapResult::Swapped
        );
        let wanted = WantedPolicy {
            module: ModuleRef::from_reference("/p/v2.wasm"),
            granted: true,
            ..Default::default()
        };
        let mut status = NodeStatus::default();
        node.report(&wanted, &mut status);
        assert!(
            status.policy.clone().unwrap().probation,
            "not done with it yet"
        );
        // A reconcile that failed does not end the probation.
        assert_eq!(node.after_reconcile(false, &["order: trap".into()]), None);
        assert_eq!(
            node.after_reconcile(true, &["order: trap".into()]),
            Some(SwapResult::Reverted)
        );
        assert_eq!(node.running().reference, None, "the default is back");
        assert!(node.refused_for_good(&key("/p/v2.wasm")), "not tried again");
        node.report(&wanted, &mut status);
        let rejected = status.policy_rejected.clone().unwrap();
        assert_eq!(
            (rejected.module.as_str(), rejected.reason.as_str()),
            ("/p/v2.wasm", "FellBack")
        );
        assert!(
            rejected.cause.contains("first reconcile: order: trap"),
            "{rejected:?}"
        );
        // Past its probation, a fallback is the module's to answer for, not a swap's.
        node.accept(v2, &key("/p/v2.wasm"));
        assert_eq!(node.after_reconcile(true, &[]), None);
        assert_eq!(node.after_reconcile(true, &["order: trap".into()]), None);
        assert_eq!(node.running().reference.as_deref(), Some("/p/v2.wasm"));
        node.report(&wanted, &mut status);
        assert!(!status.policy.unwrap().probation);
    }

    #[test]
    fn a_module_no_longer_trusted_is_retired_for_the_default() {
        let mut node = NodePolicy::new(Loaded::default_of(&default()));
        let v2 = Loaded::new(default(), Some("oci://r/p@sha256:2".into()), "t");
        node.accept(
            v2,
            &CheckKey {
                module: Some("oci://r/p@sha256:2".into()),
                keys: "old".into(),
            },
        );
        let now = CheckKey {
            module: Some("oci://r/p@sha256:2".into()),
            keys: "new".into(),
        };
        node.retire(
            Loaded::default_of(&default()),
            &now,
            Refusal::SignatureRefused,
            "signed by another key".into(),
        );
        assert_eq!(node.running().reference, None);
        assert!(node.refused_for_good(&now));
    }

    #[test]
    fn key_fingerprints_ignore_order() {
        let (a, b) = ("A".to_string(), "B".to_string());
        assert_eq!(
            fingerprint(&[a.clone(), b.clone()]),
            fingerprint(&[b, a.clone()])
        );
        assert_ne!(fingerprint(std::slice::from_ref(&a)), fingerprint(&[]));
        assert_eq!(fingerprint(&[]), "");
    }
}
