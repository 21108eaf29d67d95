//! Fleet modules (`wit/fleet/fleet.wit`): loading, and one call of the `grant` hook in a fresh
//! instance under the module's deadline and memory cap.

use super::borrowed::{call, export_index};
use super::bounded;
use super::engine::Ticker;
use super::engine::WasmRuntime;
use super::fleet_bindings as fb;
use super::fleet_columns::Converted;
use super::instance::{
    MAX_DESCRIPTION_BYTES, MAX_NAME_BYTES, MAX_REASON_BYTES, classify, deadline_ticks,
};
use super::module::CompiledModule;
use super::store::{Limits, LogBudget, State, new_store};
use crate::fleet::FleetInstance;
use crate::{Hook, LoadError, PolicyError};
use pinset_policy_sdk as sdk;
use std::sync::Arc;
use wasmtime::Engine;
use wasmtime::component::{ComponentExportIndex, Instance, InstancePre};

/// The exported interface (and version) the controller calls.
pub const FLEET_CONTRACT: &str = "pinset:fleet/rollout@0.2.0";

struct FleetShared {
    name: String,
    sha256: String,
    pre: InstancePre<State>,
    /// The contract's functions among the module's exports, found once.
    info: ComponentExportIndex,
    grant: ComponentExportIndex,
    engine: Engine,
    limits: Limits,
    _ticker: Arc<Ticker>,
}

/// A compiled, checked, pre-instantiated fleet module. Cheap to clone.
#[derive(Clone)]
pub struct FleetModule {
    shared: Arc<FleetShared>,
}

impl FleetModule {
    pub fn name(&self) -> &str {
        &self.shared.name
    }
    pub fn sha256(&self) -> &str {
        &self.shared.sha256
    }
    /// The interfaces the module imports, sorted (`pinset policy info`).
    pub fn imports(&self) -> Vec<String> {
        super::module::imports(&self.shared.engine, self.shared.pre.component())
    }
    /// An instance for one decision: each call runs in a fresh store.
    pub fn instance(&self) -> WasmFleet {
        WasmFleet {
            shared: self.shared.clone(),
        }
    }
}

impl WasmRuntime {
    /// Load a fleet module from a file. `sha256`, when given, must match the file.
    pub fn load_fleet_file(
        &self,
        path: &std::path::Path,
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<FleetModule, LoadError> {
        self.fleet_module(&self.compile_file(path, sha256, limits)?)
    }

    /// Compile, check and pre-instantiate a module that exports [`FLEET_CONTRACT`].
    pub fn load_fleet(
        &self,
        name: &str,
        bytes: &[u8],
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<FleetModule, LoadError> {
        self.fleet_module(&self.compile_module(name, bytes, sha256, limits)?)
    }

    /// Check a compiled module's fleet contract and pre-instantiate it.
    pub fn fleet_module(&self, compiled: &CompiledModule) -> Result<FleetModule, LoadError> {
        let name = &compiled.name;
        let pre = self.bind(compiled, FLEET_CONTRACT)?;
        // Each function of the contract looked up once (a module without one is refused here);
        // calls lower the request borrowed (`fleet_columns`), not through the generated bindings.
        let func = |f: &str| export_index(&compiled.component, name, FLEET_CONTRACT, f);
        Ok(FleetModule {
            shared: Arc::new(FleetShared {
                name: name.clone(),
                sha256: compiled.sha256.clone(),
                info: func("info")?,
                grant: func("grant")?,
                pre,
                engine: self.engine.clone(),
                limits: compiled.limits,
                _ticker: self.ticker.clone(),
            }),
        })
    }
}

/// A fleet module's instance: each call instantiates afresh (no state survives a decision).
pub struct WasmFleet {
    shared: Arc<FleetShared>,
}

impl WasmFleet {
    fn call<R>(
        &mut self,
        hook: Hook,
        f: impl FnOnce(&mut wasmtime::Store<State>, &Instance) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let s = &self.shared;
        let mut store = new_store(&s.engine, &s.name, s.limits, Arc::new(LogBudget::default()));
        store.set_epoch_deadline(deadline_ticks(s.limits));
        let result = s
            .pre
            .instantiate(&mut store)
            .and_then(|instance| f(&mut store, &instance));
        result.map_err(|e| classify(&s.name, s.limits, hook, &store, e))
    }
}

impl FleetInstance for WasmFleet {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn info(&mut self) -> Result<sdk::PolicyInfo, PolicyError> {
        let info = self.shared.info;
        let i: fb::pinset::fleet::types::PolicyInfo =
            self.call(Hook::Info, |s, instance| call(s, instance, info, ()))?;
        Ok(sdk::PolicyInfo {
            name: bounded(&i.name, MAX_NAME_BYTES),
            version: bounded(&i.version, MAX_NAME_BYTES),
            description: bounded(&i.description, MAX_DESCRIPTION_BYTES),
        })
    }

    fn grant_rollout(&mut self, rollout: &sdk::Rollout) -> Result<sdk::Grant, PolicyError> {
        let converted = Converted::of(rollout);
        let request = converted.request(rollout);
        let grant = self.shared.grant;
        let g: fb::pinset::fleet::types::RolloutGrant = self.call(Hook::Grant, |s, instance| {
            call(s, instance, grant, (request,))
        })?;
        Ok(sdk::Grant {
            nodes: g.nodes,
            max_pulls: g.max_pulls,
            reason: bounded(&g.reason, MAX_REASON_BYTES),
        })
    }
}
