//! The node contract (`wit/policy.wit`): where its hooks are among a module's exports, and
//! `admit`, `order`, `concurrency` and `throttle` called with their arguments borrowed, lowered
//! straight from the caller's values into the policy's memory. The generated bindings take
//! owned records, which would copy every column, label and name once more on the host per call,
//! and type-check every export again for each instance.

use super::bounded;
use super::contract::{Contract, NodeContract, Role, check, export_index};
use super::instance::{MAX_REASON_BYTES, WasmInstance, call};
use super::store::State;
use super::wit;
use crate::{Hook, LoadError, PolicyError, PolicyInstance};
use pinset_policy_sdk as sdk;
use wasmtime::Store;
use wasmtime::component::{Component, ComponentExportIndex, ComponentType, Instance, Lower};

/// `record images` of the contract over the caller's borrowed columns, generated from the SDK's
/// one list of them ([`pinset_policy_sdk::image_columns!`]): a column added there is lowered
/// here with nothing written on the host.
macro_rules! images_arg {
    ([] $($name:ident: $owned:ty => $borrowed:ty, $wit:literal;)*) => {
        #[derive(ComponentType, Lower, Clone, Copy)]
        #[component(record)]
        struct ImagesArg<'a> {
            $(#[component(name = $wit)] $name: &'a $borrowed,)*
        }

        impl<'a> ImagesArg<'a> {
            fn of(images: &'a sdk::Images) -> Self {
                let c = images.columns();
                ImagesArg {
                    $($name: c.$name,)*
                }
            }
        }
    };
}

pinset_policy_sdk::image_columns!(images_arg);

/// A record of the contract over the caller's borrowed SDK struct, generated from the SDK's one
/// list of its fields ([`pinset_policy_sdk::node_facts_fields!`] and its siblings): a field added
/// there is lowered here with nothing written on the host. `agrees` names every field of the
/// host's bindings of the WIT without `..` and moves it into the SDK's struct: a field the WIT has
/// and the list lacks, or the reverse, or a type that differs, fails to compile here.
macro_rules! record_arg {
    ([$arg:ident, $ty:ident] $($(#[$m:meta])* $name:ident: $owned:ty => $borrowed:ty, $wit:literal;)*) => {
        #[derive(ComponentType, Lower, Clone, Copy)]
        #[component(record)]
        struct $arg<'a> {
            $(#[component(name = $wit)] $name: &'a $borrowed,)*
        }

        impl<'a> $arg<'a> {
            fn of(r: &'a sdk::$ty) -> Self {
                $arg {
                    $($name: &r.$name,)*
                }
            }

            #[allow(dead_code)]
            fn agrees(r: wit::$ty) -> sdk::$ty {
                let wit::$ty { $($name),* } = r;
                sdk::$ty { $($name),* }
            }
        }
    };
}

pinset_policy_sdk::node_facts_fields!(record_arg, NodeArg, NodeFacts);
pinset_policy_sdk::disk_facts_fields!(record_arg, DiskArg, DiskFacts);
pinset_policy_sdk::pressure_fields!(record_arg, PressureArg, Pressure);
pinset_policy_sdk::pull_outcome_fields!(record_arg, OutcomeArg, PullOutcome);

/// `record admission-request` of the contract, borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
struct AdmissionRequestArg<'a> {
    node: NodeArg<'a>,
    disk: DiskArg<'a>,
    images: ImagesArg<'a>,
}

/// Where the node contract's hooks are among a module's exports, found once when it loads.
#[derive(Clone, Copy)]
pub struct NodeExports {
    info: ComponentExportIndex,
    admit: ComponentExportIndex,
    order: ComponentExportIndex,
    concurrency: ComponentExportIndex,
    throttle: ComponentExportIndex,
}

impl Contract for NodeContract {
    const INTERFACE: &'static str = "pinset:policy/decisions@0.1.0";
    const ROLE: Role = Role {
        kind: "node",
        what: "node pull policy, for the agents (`--policy`)",
    };
    const FRESH_PER_CALL: bool = false;
    type Exports = NodeExports;

    fn exports(
        component: &Component,
        module: &str,
        interface: &str,
    ) -> Result<NodeExports, LoadError> {
        let func = |name: &str| export_index(component, module, interface, name);
        Ok(NodeExports {
            info: func("info")?,
            admit: func("admit")?,
            order: func("order")?,
            concurrency: func("concurrency")?,
            throttle: func("throttle")?,
        })
    }

    fn info(exports: &NodeExports) -> ComponentExportIndex {
        exports.info
    }

    fn typecheck(
        store: &mut Store<State>,
        instance: &Instance,
        e: &NodeExports,
    ) -> Result<(), (&'static str, wasmtime::Error)> {
        type Node = NodeArg<'static>;
        check::<(AdmissionRequestArg<'static>,), wit::Admission>(
            store, instance, "admit", e.admit,
        )?;
        check::<(Node, ImagesArg<'static>), Vec<u32>>(store, instance, "order", e.order)?;
        check::<(Node,), u32>(store, instance, "concurrency", e.concurrency)?;
        check::<(Node, OutcomeArg<'static>, PressureArg<'static>), u64>(
            store, instance, "throttle", e.throttle,
        )
    }
}

impl PolicyInstance for WasmInstance<NodeContract> {
    fn admit(&mut self, request: &sdk::AdmissionRequest) -> Result<sdk::Admission, PolicyError> {
        let arg = AdmissionRequestArg {
            node: NodeArg::of(&request.node),
            disk: DiskArg::of(&request.disk),
            images: ImagesArg::of(&request.images),
        };
        let a: wit::Admission = self.call(Hook::Admit, |s, i, e| call(s, i, e.admit, (arg,)))?;
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
        self.call(Hook::Order, |s, i, e| call(s, i, e.order, (n, images)))
    }

    fn concurrency(&mut self, n: &sdk::NodeFacts) -> Result<u32, PolicyError> {
        let n = NodeArg::of(n);
        self.call(Hook::Concurrency, |s, i, e| call(s, i, e.concurrency, (n,)))
    }

    fn throttle(
        &mut self,
        n: &sdk::NodeFacts,
        outcome: &sdk::PullOutcome,
        pressure: &sdk::Pressure,
    ) -> Result<u64, PolicyError> {
        let (n, outcome) = (NodeArg::of(n), OutcomeArg::of(outcome));
        let pressure = PressureArg::of(pressure);
        self.call(Hook::Throttle, |s, i, e| {
            call(s, i, e.throttle, (n, outcome, pressure))
        })
    }
}
