//! The node policy module a pool's target names, checked by the controller first: where the
//! configuration requires signatures, a module without a valid one (or a file, which carries
//! none) never becomes a target entry, so no node is granted it.
//!
//! The check runs in the background, bounded by [`pinset_registry::limits::POLICY_FETCH`]: a
//! pool's reconcile never waits on a registry. Until a verdict is in, the pool's target leaves
//! the module out (its nodes keep what they run) and its status says the module is being
//! checked; the pool is reconciled again when the check ends. A verdict stands for the module
//! *and the keys trusted now*: other keys are another check. A registry the controller cannot
//! reach is no verdict — the check is left to the nodes, which verify every module they fetch
//! anyway — and is asked again on the recheck schedule, as is a module not found or unsigned
//! ([`Refusal::recheck_after`]: 30 s doubling to 5 min), and at once when the
//! PolicyConfiguration changes (a new generation: the operator may have just signed it); every
//! other refusal stands until the module's digest or the keys change.

use crate::api::MachineConfigPool;
use crate::policy_config::{ModuleRef, PolicyConfig, fingerprint};
use kube::runtime::reflector::ObjectRef;
use pinset_core::refusal::Refusal;
use pinset_registry::artifact::Artifacts;
use pinset_registry::limits::POLICY_FETCH;
use pinset_registry::policy_source::Source;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Verdicts kept (per module and key set); the table starts over when full.
const VERDICTS: usize = 256;

/// What the gate says of a module for a pool now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// It may be rolled out.
    Pass,
    /// Not yet known: a check is under way.
    Checking,
    /// It must not be rolled out: the kind, and why.
    Refused(Refusal, String),
}

/// One module under one key set.
type Key = (String, String);

#[derive(Clone, Debug)]
enum Check {
    Running,
    Done {
        result: Result<(), (Refusal, String)>,
        attempt: u32,
        at: Instant,
    },
}

/// What the controller found of each module's signature, by module and keys.
pub struct SignatureGate {
    artifacts: Option<Artifacts>,
    verdicts: Arc<Mutex<HashMap<Key, Check>>>,
    /// Where a pool is asked to be reconciled again when its check ends.
    triggers: Mutex<Option<UnboundedSender<ObjectRef<MachineConfigPool>>>>,
    /// The PolicyConfiguration generation the verdicts were looked up under.
    generation: Mutex<Option<i64>>,
}

impl SignatureGate {
    /// `artifacts: None`: the controller cannot reach registries; only files are refused here.
    pub fn new(artifacts: Option<Artifacts>) -> Self {
        Self {
            artifacts,
            verdicts: Arc::default(),
            triggers: Mutex::new(None),
            generation: Mutex::new(None),
        }
    }

    /// The PolicyConfiguration is at `generation` now: when that is a change, the refusals
    /// that are rechecked on a schedule (not found, unsigned, registry away) are forgotten, so
    /// the next look checks again at once.
    pub(super) fn configuration_at(&self, generation: Option<i64>) {
        let mut seen = self.generation.lock().expect("gate generation");
        if *seen == generation {
            return;
        }
        *seen = generation;
        self.verdicts
            .lock()
            .expect("verdicts lock")
            .retain(|_, v| match v {
                Check::Done {
                    result: Err((kind, _)),
                    ..
                } => !kind.rechecked(),
                _ => true,
            });
    }

    /// Reconcile a pool again through `triggers` when its check ends.
    pub(super) fn notify(&self, triggers: UnboundedSender<ObjectRef<MachineConfigPool>>) {
        *self.triggers.lock().expect("gate triggers") = Some(triggers);
    }

    /// What may be done with `m`, named for `pool`, now. Never waits on a registry.
    pub(super) fn check(&self, config: &PolicyConfig, pool: &str, m: &ModuleRef) -> Gate {
        let keys = match config.keys(pool, m) {
            Ok(keys) if keys.is_empty() => return Gate::Pass,
            Ok(keys) => keys,
            Err(e) => return Gate::Refused(Refusal::SignatureRefused, e.to_string()),
        };
        let at = match Source::parse(&m.module) {
            Err(e) => return Gate::Refused(e.refusal(), e.to_string()),
            Ok(Source::File(path)) => {
                let e = pinset_registry::policy_source::SourceError::Unsigned { path };
                return Gate::Refused(e.refusal(), e.to_string());
            }
            Ok(Source::Oci(at)) => at,
        };
        let Some(artifacts) = self.artifacts.clone() else {
            return Gate::Pass;
        };
        let pems: Vec<String> = keys.iter().map(|k| k.to_pem()).collect();
        let key = (m.reference(), fingerprint(&pems));
        if let Some(gate) = self.known(&key) {
            return gate;
        }
        self.start(key, pool.to_string(), artifacts, at, keys);
        Gate::Checking
    }

    /// The verdict on `key` when there is one that still stands.
    fn known(&self, key: &Key) -> Option<Gate> {
        let verdicts = self.verdicts.lock().expect("verdicts lock");
        match verdicts.get(key)? {
            Check::Running => Some(Gate::Checking),
            Check::Done { result: Ok(()), .. } => Some(Gate::Pass),
            Check::Done {
                result: Err((kind, why)),
                attempt,
                at,
            } => {
                let stale = kind.rechecked() && at.elapsed() >= Refusal::recheck_after(*attempt);
                match (stale, kind.transient()) {
                    (true, _) => None,
                    // Not reached: left to the nodes meanwhile.
                    (false, true) => Some(Gate::Pass),
                    (false, false) => Some(Gate::Refused(*kind, why.clone())),
                }
            }
        }
    }

    /// Verify `at`'s signature in the background; reconcile `pool` again when done.
    fn start(
        &self,
        key: Key,
        pool: String,
        artifacts: Artifacts,
        at: pinset_registry::artifact::ArtifactRef,
        keys: Vec<pinset_registry::signature::VerifyingKey>,
    ) {
        let verdicts = self.verdicts.clone();
        let attempt = {
            let mut v = verdicts.lock().expect("verdicts lock");
            if v.len() >= VERDICTS {
                v.retain(|_, verdict| matches!(verdict, Check::Running));
            }
            let attempt = match v.get(&key) {
                Some(Check::Done { attempt, .. }) => attempt + 1,
                _ => 1,
            };
            v.insert(key.clone(), Check::Running);
            attempt
        };
        let triggers = self.triggers.lock().expect("gate triggers").clone();
        tokio::spawn(async move {
            let result = verify(&artifacts, &at, &keys).await;
            report(&pool, &key.0, &result);
            let done = Check::Done {
                result,
                attempt,
                at: Instant::now(),
            };
            verdicts.lock().expect("verdicts lock").insert(key, done);
            if let Some(triggers) = triggers {
                let _ = triggers.send(ObjectRef::new(&pool));
            }
        });
    }
}

/// The signature of `at` against `keys`, within the policy fetch's deadline.
async fn verify(
    artifacts: &Artifacts,
    at: &pinset_registry::artifact::ArtifactRef,
    keys: &[pinset_registry::signature::VerifyingKey],
) -> Result<(), (Refusal, String)> {
    match tokio::time::timeout(POLICY_FETCH, artifacts.verify(at, keys)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err((e.refusal(), e.to_string())),
        Err(_) => Err((
            Refusal::RegistryAway,
            format!("{at}: no answer within {} s", POLICY_FETCH.as_secs()),
        )),
    }
}

fn report(pool: &str, module: &str, result: &Result<(), (Refusal, String)>) {
    match result {
        Ok(()) => tracing::info!(pool, module, "node policy signature verified"),
        Err((kind, why)) if kind.transient() => {
            tracing::info!(pool, module, error = %why, "cannot check the signature (the registry is away); the nodes will, and it is checked again")
        }
        Err((kind, why)) => {
            tracing::warn!(pool, module, reason = kind.reason(), %why, "node policy refused before any node is granted it: {}", kind.action())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(module: &str, keys: bool) -> PolicyConfig {
        let key = pinset_registry::signature::SigningKey::generate(b"")
            .unwrap()
            .1
            .public()
            .to_pem();
        let verify = match keys {
            true => format!("verify: {{keys: [{key:?}]}}\n"),
            false => String::new(),
        };
        PolicyConfig::parse(
            &format!("{verify}pools:\n  w: {{module: {module:?}}}\n"),
            "t",
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_file_is_refused_where_a_signature_is_required() {
        let gate = SignatureGate::new(None);
        let file = config("/p/a.wasm", true);
        let Gate::Refused(kind, why) = gate.check(&file, "w", &file.pools["w"]) else {
            panic!("refused")
        };
        assert_eq!(kind, Refusal::NotAPolicy);
        assert!(why.contains("file carries none"), "{why}");
        let unsigned_ok = config("/p/a.wasm", false);
        assert_eq!(
            gate.check(&unsigned_ok, "w", &unsigned_ok.pools["w"]),
            Gate::Pass
        );
    }

    /// The registry is asked in the background, and does not answer (its port refuses
    /// connections): the pool is reconciled again, and the check is left to the nodes until the
    /// recheck is due.
    #[tokio::test]
    async fn an_unreachable_registry_is_checked_in_the_background_and_left_to_the_nodes() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let artifacts = Artifacts::new(vec![format!("127.0.0.1:{port}")], Default::default());
        let gate = SignatureGate::new(Some(artifacts));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        gate.notify(tx);
        let oci = config(
            &format!("oci://127.0.0.1:{port}/p@sha256:{}", "a".repeat(64)),
            true,
        );
        assert_eq!(gate.check(&oci, "w", &oci.pools["w"]), Gate::Checking);
        assert_eq!(
            gate.check(&oci, "w", &oci.pools["w"]),
            Gate::Checking,
            "one check"
        );
        let again = rx.recv().await.unwrap();
        assert_eq!(again.name, "w");
        assert_eq!(gate.check(&oci, "w", &oci.pools["w"]), Gate::Pass);
        // Other keys are another check.
        let rotated = config(
            &format!("oci://127.0.0.1:{port}/p@sha256:{}", "a".repeat(64)),
            true,
        );
        assert_eq!(
            gate.check(&rotated, "w", &rotated.pools["w"]),
            Gate::Checking
        );
    }

    /// A module refused as not found is looked at again as soon as the PolicyConfiguration
    /// changes, not only on the recheck schedule.
    #[tokio::test]
    async fn a_new_configuration_generation_rechecks_a_refusal_at_once() {
        let gate = SignatureGate::new(None);
        let oci = config(
            &format!("oci://r.example/p@sha256:{}", "b".repeat(64)),
            true,
        );
        let key = (oci.pools["w"].reference(), "k".to_string());
        let refuse = || {
            let refused = Check::Done {
                result: Err((Refusal::Unsigned, "no cosign signature".into())),
                attempt: 1,
                at: Instant::now(),
            };
            gate.verdicts.lock().unwrap().insert(key.clone(), refused);
        };
        refuse();
        gate.configuration_at(Some(1));
        assert!(
            gate.known(&key).is_none(),
            "the first generation seen is a change"
        );
        refuse();
        gate.configuration_at(Some(1));
        assert!(
            matches!(gate.known(&key), Some(Gate::Refused(Refusal::Unsigned, _))),
            "the same generation: the refusal stands until its recheck"
        );
        gate.configuration_at(Some(2));
        assert!(
            gate.known(&key).is_none(),
            "a new generation: checked again"
        );
    }
}
