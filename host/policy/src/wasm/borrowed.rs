//! The node contract's hooks, called by the export indices found once per module: `admit`,
//! `order`, `concurrency` and `throttle` with their arguments borrowed, lowered straight from the
//! caller's values into the policy's memory. The generated bindings take owned records, which
//! would copy every column, label and name once more on the host per call, and type-check every
//! export again for each instance.

use super::wit;
use crate::LoadError;
use pinset_policy_sdk as sdk;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, ComponentType, Instance, Lift, Lower,
    TypedFunc,
};
use wasmtime::{AsContextMut, Result};

/// `record images` of the contract, over borrowed columns.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub(super) struct ImagesArg<'a> {
    references: &'a str,
    #[component(name = "reference-starts")]
    reference_starts: &'a [u32],
    present: &'a [u8],
    #[component(name = "size-known")]
    size_known: &'a [u8],
    #[component(name = "size-bytes")]
    size_bytes: &'a [u64],
    #[component(name = "layer-starts")]
    layer_starts: &'a [u32],
    #[component(name = "layer-ids")]
    layer_ids: &'a [u32],
    #[component(name = "layer-sizes")]
    layer_sizes: &'a [u64],
    #[component(name = "set-starts")]
    set_starts: &'a [u32],
    #[component(name = "set-ids")]
    set_ids: &'a [u32],
    #[component(name = "set-names")]
    set_names: &'a [String],
}

impl<'a> ImagesArg<'a> {
    pub(super) fn of(images: &'a sdk::Images) -> Self {
        let c = images.columns();
        ImagesArg {
            references: c.references,
            reference_starts: c.reference_starts,
            present: c.present,
            size_known: c.size_known,
            size_bytes: c.size_bytes,
            layer_starts: c.layer_starts,
            layer_ids: c.layer_ids,
            layer_sizes: c.layer_sizes,
            set_starts: c.set_starts,
            set_ids: c.set_ids,
            set_names: c.set_names,
        }
    }
}

/// `record node-facts` of the contract, borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub(super) struct NodeArg<'a> {
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
    pub(super) fn of(n: &'a sdk::NodeFacts) -> Self {
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
pub(super) struct OutcomeArg<'a> {
    reference: &'a str,
    error: Option<&'a str>,
    bytes: Option<u64>,
    #[component(name = "duration-ms")]
    duration_ms: u64,
    remaining: u32,
}

impl<'a> OutcomeArg<'a> {
    pub(super) fn of(o: &'a sdk::PullOutcome) -> Self {
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
pub(super) struct AdmissionRequestArg<'a> {
    pub(super) node: NodeArg<'a>,
    pub(super) disk: &'a wit::DiskFacts,
    pub(super) images: ImagesArg<'a>,
}

/// Where the contract's hooks are among a module's exports, found once when it loads.
#[derive(Clone, Copy)]
pub(super) struct BorrowedHooks {
    info: ComponentExportIndex,
    admit: ComponentExportIndex,
    order: ComponentExportIndex,
    concurrency: ComponentExportIndex,
    throttle: ComponentExportIndex,
}

impl BorrowedHooks {
    /// The hooks of `interface` (`package/interface@version`) exported by `component`; a
    /// contract error naming the first one missing.
    pub(super) fn find(
        component: &Component,
        module: &str,
        interface: &str,
    ) -> Result<Self, LoadError> {
        let func = |name: &str| export_index(component, module, interface, name);
        Ok(Self {
            info: func("info")?,
            admit: func("admit")?,
            order: func("order")?,
            concurrency: func("concurrency")?,
            throttle: func("throttle")?,
        })
    }

    pub(super) fn info(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
    ) -> Result<wit::PolicyInfo> {
        call(store, instance, self.info, ())
    }

    pub(super) fn admit(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        request: AdmissionRequestArg<'_>,
    ) -> Result<wit::Admission> {
        call(store, instance, self.admit, (request,))
    }

    pub(super) fn order(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        node: NodeArg<'_>,
        images: ImagesArg<'_>,
    ) -> Result<Vec<u32>> {
        call(store, instance, self.order, (node, images))
    }

    pub(super) fn concurrency(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        node: NodeArg<'_>,
    ) -> Result<u32> {
        call(store, instance, self.concurrency, (node,))
    }

    pub(super) fn throttle(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        node: NodeArg<'_>,
        outcome: OutcomeArg<'_>,
        pressure: wit::Pressure,
    ) -> Result<u64> {
        call(store, instance, self.throttle, (node, outcome, pressure))
    }
}

/// Where function `name` of `interface` (`package/interface@version`) is among `component`'s
/// exports; a contract error naming what is missing when it is not there.
pub(super) fn export_index(
    component: &Component,
    module: &str,
    interface: &str,
    name: &str,
) -> Result<ComponentExportIndex, LoadError> {
    let missing = |what: &str| LoadError::Contract {
        module: module.into(),
        expected: interface.into(),
        found: format!("no `{what}` export"),
    };
    let iface = component
        .get_export_index(None, interface)
        .ok_or_else(|| missing(interface))?;
    component
        .get_export_index(Some(&iface), name)
        .ok_or_else(|| missing(name))
}

/// Call export `func` of `instance`, its types checked against `P` and `R`.
pub(super) fn call<P, R>(
    mut store: impl AsContextMut,
    instance: &Instance,
    func: ComponentExportIndex,
    params: P,
) -> Result<R>
where
    P: ComponentNamedList + Lower + Send + Sync,
    R: ComponentType + Lift + Send + Sync + 'static,
{
    let f: TypedFunc<P, (R,)> = instance.get_typed_func(&mut store, func)?;
    Ok(f.call(&mut store, params)?.0)
}
