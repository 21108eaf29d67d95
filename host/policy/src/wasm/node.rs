//! The node contract (`wit/policy.wit`): where its hooks are among a module's exports, and
//! `admit`, `order`, `concurrency` and `throttle` called with their arguments borrowed, lowered
//! straight from the caller's values into the policy's memory. The generated bindings take
//! owned records, which would copy every column, label and name once more on the host per call,
//! and type-check every export again for each instance.

use super::bounded;
use super::contract::{Contract, Node, Role, check, export_index};
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

/// `record node-facts` of the contract, borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
struct NodeArg<'a> {
    name: &'a str,
    labels: &'a [(String, String)],
    pools: &'a [String],
    #[component(name = "control-plane")]
    control_plane: bool,
    ready: bool,
    #[component(name = "disk-pressure")]
    disk_pressure: bool,
    #[component(name = "allocatable-ephemeral-bytes")]
    allocatable_ephemeral_bytes: Option<u64>,
}

impl<'a> NodeArg<'a> {
    fn of(n: &'a sdk::NodeFacts) -> Self {
        NodeArg {
            name: &n.name,
            labels: &n.labels,
            pools: &n.pools,
            control_plane: n.control_plane,
            ready: n.ready,
            disk_pressure: n.disk_pressure,
            allocatable_ephemeral_bytes: n.allocatable_ephemeral_bytes,
        }
    }
}

/// `record pull-outcome` of the contract, borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
struct OutcomeArg<'a> {
    reference: &'a str,
    error: Option<&'a str>,
    bytes: Option<u64>,
    #[component(name = "duration-ms")]
    duration_ms: u64,
    remaining: u32,
}

impl<'a> OutcomeArg<'a> {
    fn of(o: &'a sdk::PullOutcome) -> Self {
        OutcomeArg {
            reference: &o.reference,
            error: o.error.as_deref(),
            bytes: o.bytes,
            duration_ms: o.duration_ms,
            remaining: o.remaining,
        }
    }
}

/// `record admission-request` of the contract, borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
struct AdmissionRequestArg<'a> {
    node: NodeArg<'a>,
    disk: &'a wit::DiskFacts,
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

impl Contract for Node {
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
        check::<(Node, OutcomeArg<'static>, wit::Pressure), u64>(
            store, instance, "throttle", e.throttle,
        )
    }
}

/// A node policy module's instance for one reconcile.
pub type WasmPolicy = WasmInstance<Node>;

impl PolicyInstance for WasmInstance<Node> {
    fn admit(&mut self, request: &sdk::AdmissionRequest) -> Result<sdk::Admission, PolicyError> {
        let disk = wit::DiskFacts {
            capacity_bytes: request.disk.capacity_bytes,
            used_bytes: request.disk.used_bytes,
            available_bytes: request.disk.available_bytes,
        };
        let arg = AdmissionRequestArg {
            node: NodeArg::of(&request.node),
            disk: &disk,
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
        let pressure = wit::Pressure {
            io: pressure.io,
            cpu: pressure.cpu,
            memory: pressure.memory,
        };
        self.call(Hook::Throttle, |s, i, e| {
            call(s, i, e.throttle, (n, outcome, pressure))
        })
    }
}
