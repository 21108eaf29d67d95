//! The fleet policy of each pool: the `--fleet-policy` flags' table, with the
//! PolicyConfiguration's `fleet` over it while the controller runs. A module the configuration
//! names is fetched, verified, compiled and smoke-tested — a grant on the pool's current
//! request, without a fallback — before it decides for the pool; a refused one leaves the pool
//! with the flags' module and says why. One controller: no canary, the swap is at once, and the
//! grants already written stand (a new module is asked from the next decision on).

use super::rollout::FleetTable;
use crate::policy_config::{ModuleRef, PolicyConfig};
use pinset_node::policy_source::Fetcher;
use pinset_policy::{FleetModule, Limits, WasmRuntime};
use pinset_policy_sdk::RolloutRequest;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A refused module is checked again after this long (a registry may have been away).
const RETRY_REFUSED: Duration = Duration::from_secs(60);

/// What fetches and compiles the modules the configuration names.
pub struct FleetLoader {
    pub runtime: WasmRuntime,
    pub limits: Limits,
    pub fetcher: Fetcher,
}

/// The modules of the flags, and those the configuration named (loaded, or why refused).
pub struct FleetPolicies {
    flags: FleetTable,
    loader: Option<Arc<FleetLoader>>,
    named: Mutex<HashMap<String, Checked>>,
}

/// A named module after its checks (or why it failed them), and when they ran.
type Checked = (Result<FleetModule, String>, Instant);

/// The module that decides for a pool, and why the configuration's was refused, when it was.
pub(super) struct Chosen {
    pub module: FleetModule,
    pub refused: Option<String>,
}

impl FleetPolicies {
    /// `loader: None`: the configuration cannot name fleet modules (said when it does).
    pub fn new(flags: FleetTable, loader: Option<FleetLoader>) -> Self {
        Self {
            flags,
            loader: loader.map(Arc::new),
            named: Mutex::new(HashMap::new()),
        }
    }

    /// The flags' module of `pool` (a paused pool's status names it).
    pub(super) fn flagged(&self, pool: &str) -> &FleetModule {
        self.flags.for_pool(pool)
    }

    /// The module that decides for `pool` now: the configuration's, once it passed its checks
    /// on `request` (checked once per module and kept), else the flags'.
    pub(super) async fn for_pool(
        &self,
        config: &PolicyConfig,
        pool: &str,
        request: &RolloutRequest,
    ) -> Chosen {
        let fallback = |refused: Option<String>| Chosen {
            module: self.flags.for_pool(pool).clone(),
            refused,
        };
        let Some(m) = config.fleet_for(pool) else {
            return fallback(None);
        };
        let reference = m.reference();
        let known = self
            .named
            .lock()
            .expect("fleet lock")
            .get(&reference)
            .cloned();
        let fresh = |(r, at): &Checked| r.is_ok() || at.elapsed() < RETRY_REFUSED;
        let checked = match known.filter(fresh) {
            Some((checked, _)) => checked,
            None => {
                let checked = self.check(config, pool, m, request).await;
                match &checked {
                    Ok(_) => tracing::info!(pool, module = %reference, "fleet policy swapped"),
                    Err(e) => {
                        tracing::warn!(pool, module = %reference, cause = %e, "fleet policy refused")
                    }
                }
                let mut named = self.named.lock().expect("fleet lock");
                named.insert(reference.clone(), (checked.clone(), Instant::now()));
                checked
            }
        };
        match checked {
            Ok(module) => Chosen {
                module,
                refused: None,
            },
            Err(cause) => fallback(Some(format!(
                "fleet policy {reference} refused: {cause}; deciding with {}",
                self.flags.for_pool(pool).name()
            ))),
        }
    }

    /// Fetch, verify, compile and smoke-test `m` on a blocking thread.
    async fn check(
        &self,
        config: &PolicyConfig,
        pool: &str,
        m: &ModuleRef,
        request: &RolloutRequest,
    ) -> Result<FleetModule, String> {
        let Some(loader) = self.loader.clone() else {
            return Err("this controller cannot fetch fleet modules".into());
        };
        let keys = config.keys(pool, m).map_err(|e| e.to_string())?;
        let (m, request) = (m.clone(), request.clone());
        tokio::task::spawn_blocking(move || {
            let module = crate::policy_config::load_module::<pinset_policy::Fleet>(
                &loader.runtime,
                loader.limits,
                &loader.fetcher,
                &m,
                &keys,
            )
            .map_err(|e| e.to_string())?;
            pinset_policy::fleet_smoke_test(&module, &request)
                .map_err(|f| format!("smoke test on the pool's rollout: {f}"))?;
            Ok(module)
        })
        .await
        .unwrap_or_else(|e| Err(format!("checking task failed: {e}")))
    }
}
