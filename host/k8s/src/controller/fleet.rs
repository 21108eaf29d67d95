//! The fleet policy of each pool: the `--fleet-policy` flags' table, with the
//! PolicyConfiguration's `fleet` over it while the controller runs. A module the configuration
//! names is fetched, verified, compiled and smoke-tested — a grant on the pool's current
//! request, without a fallback — before it decides for the pool; a refused one leaves the pool
//! with the flags' module and says why. The check runs in the background (the fetch bounded by
//! [`pinset_registry::limits::POLICY_FETCH`]): a pool's decision never waits on a registry, the
//! flags' module decides meanwhile, and the pool is reconciled again when the check ends. A
//! verdict stands for the module and the keys trusted now; a registry away, a module not found
//! or unsigned is checked again on [`Refusal::recheck_after`]'s schedule. One controller: no
//! canary, the swap is at once, and the grants already written stand (a new module is asked
//! from the next decision on).

use super::rollout::FleetTable;
use crate::api::MachineConfigPool;
use crate::policy_config::{ModuleRef, PolicyConfig, fingerprint};
use crate::policy_loader::{Loader, Refusing};
use kube::runtime::reflector::ObjectRef;
use pinset_core::refusal::Refusal;
use pinset_policy::{FleetContract, FleetModule};
use pinset_policy_sdk::RolloutRequest;
use pinset_registry::signature::VerifyingKey;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Modules remembered (per module and key set); the table starts over when full.
const NAMED: usize = 64;

/// One module under one key set.
type Key = (String, String);

/// A named module after its checks: loaded, or refused (the kind, why, which attempt, when).
#[derive(Clone)]
enum Checked {
    Running,
    Loaded(FleetModule),
    Refused(Refusal, String, u32, Instant),
}

/// The modules of the flags, and those the configuration named (loaded, or why refused).
pub struct FleetPolicies {
    flags: FleetTable,
    loader: Option<Arc<Loader>>,
    named: Arc<Mutex<HashMap<Key, Checked>>>,
    triggers: Mutex<Option<UnboundedSender<ObjectRef<MachineConfigPool>>>>,
}

/// The module that decides for a pool, and why the configuration's was refused, when it was.
pub(super) struct Chosen {
    pub module: FleetModule,
    pub refused: Option<String>,
}

impl FleetPolicies {
    /// `loader: None`: the configuration cannot name fleet modules (said when it does).
    pub fn new(flags: FleetTable, loader: Option<Loader>) -> Self {
        Self {
            flags,
            loader: loader.map(Arc::new),
            named: Arc::default(),
            triggers: Mutex::new(None),
        }
    }

    /// Reconcile a pool again through `triggers` when its check ends.
    pub(super) fn notify(&self, triggers: UnboundedSender<ObjectRef<MachineConfigPool>>) {
        *self.triggers.lock().expect("fleet triggers") = Some(triggers);
    }

    /// The flags' module of `pool` (a paused pool's status names it).
    pub(super) fn flagged(&self, pool: &str) -> &FleetModule {
        self.flags.for_pool(pool)
    }

    /// The module that decides for `pool` now: the configuration's, once it passed its checks
    /// (started here, on `request`, in the background), else the flags'. Never waits.
    pub(super) fn for_pool(
        &self,
        config: &PolicyConfig,
        pool: &str,
        request: &RolloutRequest,
    ) -> Chosen {
        let flagged = self.flags.for_pool(pool);
        let fallback = |refused: Option<String>| Chosen {
            module: flagged.clone(),
            refused,
        };
        let Some(m) = config.fleet_for(pool) else {
            return fallback(None);
        };
        let reference = m.reference();
        let refused = |kind: Refusal, why: &str| {
            Some(format!(
                "fleet policy {reference} refused ({}): {why}; {}; deciding with {}",
                kind.reason(),
                kind.action(),
                flagged.name()
            ))
        };
        let keys = match config.keys(pool, m) {
            Ok(keys) => keys,
            Err(e) => return fallback(refused(Refusal::SignatureRefused, &e.to_string())),
        };
        let pems: Vec<String> = keys.iter().map(|k| k.to_pem()).collect();
        let key = (reference.clone(), fingerprint(&pems));
        match self.known(&key) {
            Some(Checked::Loaded(module)) => Chosen {
                module,
                refused: None,
            },
            Some(Checked::Refused(kind, why, _, _)) => fallback(refused(kind, &why)),
            Some(Checked::Running) => fallback(None),
            None => {
                self.start(key, pool, m.clone(), keys, request.clone());
                fallback(None)
            }
        }
    }

    /// What is known of `key` and still stands (a refusal due for a recheck does not).
    fn known(&self, key: &Key) -> Option<Checked> {
        let named = self.named.lock().expect("fleet lock");
        match named.get(key)? {
            Checked::Refused(kind, _, attempt, at)
                if kind.rechecked() && at.elapsed() >= Refusal::recheck_after(*attempt) =>
            {
                None
            }
            checked => Some(checked.clone()),
        }
    }

    /// Check `m` in the background; reconcile `pool` again when done.
    fn start(
        &self,
        key: Key,
        pool: &str,
        m: ModuleRef,
        keys: Vec<VerifyingKey>,
        request: RolloutRequest,
    ) {
        let attempt = {
            let mut named = self.named.lock().expect("fleet lock");
            if named.len() >= NAMED {
                named.retain(|_, c| !matches!(c, Checked::Refused(..)));
            }
            let attempt = match named.get(&key) {
                Some(Checked::Refused(_, _, n, _)) => n + 1,
                _ => 1,
            };
            named.insert(key.clone(), Checked::Running);
            attempt
        };
        let (named, loader) = (self.named.clone(), self.loader.clone());
        let triggers = self.triggers.lock().expect("fleet triggers").clone();
        let pool = pool.to_string();
        tokio::spawn(async move {
            let checked = match check(loader, &m, &keys, request).await {
                Ok(module) => {
                    tracing::info!(pool, module = %key.0, "fleet policy swapped");
                    Checked::Loaded(module)
                }
                Err((kind, why)) => {
                    tracing::warn!(pool, module = %key.0, reason = kind.reason(), cause = %why, "fleet policy refused");
                    Checked::Refused(kind, why, attempt, Instant::now())
                }
            };
            named.lock().expect("fleet lock").insert(key, checked);
            if let Some(triggers) = triggers {
                let _ = triggers.send(ObjectRef::new(&pool));
            }
        });
    }
}

/// Fetch (and verify) `m`, then compile and smoke-test it on a blocking thread.
async fn check(
    loader: Option<Arc<Loader>>,
    m: &ModuleRef,
    keys: &[VerifyingKey],
    request: RolloutRequest,
) -> Result<FleetModule, Refusing> {
    let Some(loader) = loader else {
        let why = "this controller cannot fetch fleet modules";
        return Err((Refusal::NotAPolicy, why.into()));
    };
    let fetched = loader.fetch(m, keys).await?;
    let m = m.clone();
    tokio::task::spawn_blocking(move || {
        let on = "the pool's rollout";
        loader.prove::<FleetContract>(&m, &fetched, &request, on)
    })
    .await
    .unwrap_or_else(|e| Err((Refusal::NotAPolicy, format!("checking task failed: {e}"))))
}
