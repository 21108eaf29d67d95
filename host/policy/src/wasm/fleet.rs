//! The fleet contract (`wit/fleet/fleet.wit`): where its functions are among a module's
//! exports, and `grant` called with the request lowered borrowed (`fleet_columns`), each call in
//! a fresh instance.

use super::bounded;
use super::contract::{Contract, FleetContract, Role, check, export_index, optional_export};
use super::fleet_bindings::pinset::fleet::types;
use super::fleet_columns::Converted;
use super::fleet_columns::RequestArg;
use super::instance::{MAX_REASON_BYTES, WasmInstance, call};
use super::store::State;
use crate::FleetInstance;
use crate::{Hook, LoadError, PolicyError};
use pinset_policy_sdk as sdk;
use wasmtime::Store;
use wasmtime::component::{Component, ComponentExportIndex, Instance};

/// The fleet contract's interface (and version) the controller calls.
pub const FLEET_CONTRACT: &str = FleetContract::INTERFACE;

/// Where the fleet contract's functions are among a module's exports, found once.
#[derive(Clone, Copy)]
pub struct FleetExports {
    info: ComponentExportIndex,
    grant: ComponentExportIndex,
    /// `decide` (since 0.2.1), which a module built for 0.2.0 lacks: it is asked `grant`.
    decide: Option<ComponentExportIndex>,
}

impl Contract for FleetContract {
    const INTERFACE: &'static str = "pinset:fleet/rollout@0.2.1";
    const ROLE: Role = Role {
        kind: "fleet",
        what: "fleet rollout policy, for the controller (`--fleet-policy`)",
    };
    const FRESH_PER_CALL: bool = true;
    type Exports = FleetExports;

    fn exports(
        component: &Component,
        module: &str,
        interface: &str,
    ) -> Result<FleetExports, LoadError> {
        let func = |name: &str| export_index(component, module, interface, name);
        Ok(FleetExports {
            info: func("info")?,
            grant: func("grant")?,
            decide: optional_export(component, interface, "decide"),
        })
    }

    fn info(exports: &FleetExports) -> ComponentExportIndex {
        exports.info
    }

    fn typecheck(
        store: &mut Store<State>,
        instance: &Instance,
        e: &FleetExports,
    ) -> Result<(), (&'static str, wasmtime::Error)> {
        type Request = RequestArg<'static>;
        check::<(Request,), types::RolloutGrant>(store, instance, "grant", e.grant)?;
        match e.decide {
            Some(decide) => {
                check::<(Request,), types::RolloutDecision>(store, instance, "decide", decide)
            }
            None => Ok(()),
        }
    }
}

impl FleetInstance for WasmInstance<FleetContract> {
    fn grant_rollout(&mut self, rollout: &sdk::Rollout) -> Result<sdk::Grant, PolicyError> {
        let converted = Converted::of(rollout);
        let request = converted.request(rollout);
        let d: types::RolloutDecision = self.call(Hook::Grant, |s, i, e| match e.decide {
            Some(decide) => call(s, i, decide, (request,)),
            None => call(s, i, e.grant, (request,))
                .map(|grant| types::RolloutDecision { grant, hold: None }),
        })?;
        Ok(sdk::Grant {
            nodes: d.grant.nodes,
            max_pulls: d.grant.max_pulls,
            reason: bounded(&d.grant.reason, MAX_REASON_BYTES),
            hold: d.hold.map(|h| bounded(&h, MAX_REASON_BYTES)),
        })
    }
}
