//! The two hooks that carry the node's images (`admit`, `order`), called with their arguments
//! borrowed: lowered straight from the caller's columns into the policy's memory. The generated
//! bindings take owned records, which would copy every column once more on the host per call.

use super::wit;
use crate::LoadError;
use pinset_policy_sdk as sdk;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentType, Instance, Lower, TypedFunc,
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

/// `record admission-request` of the contract, its images borrowed.
#[derive(ComponentType, Lower, Clone, Copy)]
#[component(record)]
pub(super) struct AdmissionRequestArg<'a> {
    pub(super) node: &'a wit::NodeFacts,
    pub(super) disk: &'a wit::DiskFacts,
    pub(super) images: ImagesArg<'a>,
}

type Admit<'a> = TypedFunc<(AdmissionRequestArg<'a>,), (wit::Admission,)>;
type Order<'a> = TypedFunc<(&'a wit::NodeFacts, ImagesArg<'a>), (Vec<u32>,)>;

/// Where `admit` and `order` are among a module's exports, found once when it loads.
#[derive(Clone, Copy)]
pub(super) struct ImageHooks {
    admit: ComponentExportIndex,
    order: ComponentExportIndex,
}

impl ImageHooks {
    /// The hooks of `interface` (`package/interface@version`) exported by `component`. The
    /// generated bindings have checked that they exist by the time this is asked.
    pub(super) fn find(
        component: &Component,
        module: &str,
        interface: &str,
    ) -> Result<Self, LoadError> {
        let missing = |what: &str| LoadError::Contract {
            module: module.into(),
            expected: interface.into(),
            found: format!("no `{what}` export"),
        };
        let iface = component
            .get_export_index(None, interface)
            .ok_or_else(|| missing(interface))?;
        let func = |name: &str| {
            component
                .get_export_index(Some(&iface), name)
                .ok_or_else(|| missing(name))
        };
        Ok(Self {
            admit: func("admit")?,
            order: func("order")?,
        })
    }

    pub(super) fn admit(
        &self,
        mut store: impl AsContextMut,
        instance: &Instance,
        request: AdmissionRequestArg<'_>,
    ) -> Result<wit::Admission> {
        let f: Admit<'_> = instance.get_typed_func(&mut store, self.admit)?;
        Ok(f.call(&mut store, (request,))?.0)
    }

    pub(super) fn order(
        &self,
        mut store: impl AsContextMut,
        instance: &Instance,
        node: &wit::NodeFacts,
        images: ImagesArg<'_>,
    ) -> Result<Vec<u32>> {
        let f: Order<'_> = instance.get_typed_func(&mut store, self.order)?;
        Ok(f.call(&mut store, (node, images))?.0)
    }
}
