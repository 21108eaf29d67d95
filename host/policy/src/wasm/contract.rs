//! The contracts a module may export, each described once: its interface and version, the role
//! a module exporting it plays, and where its functions are among a module's exports. Loading
//! ([`super::module`]), instances, limits and failures ([`super::instance`]) are written once,
//! over [`Contract`].

use super::store::State;
use crate::LoadError;
use wasmtime::Store;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, ComponentType, Instance, Lift, Lower,
};

/// One contract a policy module may export.
pub trait Contract: Send + Sync + 'static {
    /// The exported interface and version this pinset calls (`package/interface@version`).
    const INTERFACE: &'static str;
    /// What a module exporting it is, and where it is used (for errors and `policy info`).
    const ROLE: Role;
    /// Each call in a fresh instance (a fleet decision keeps nothing); otherwise one instance
    /// answers the calls of a reconcile until one of them fails.
    const FRESH_PER_CALL: bool;
    /// The contract's functions among a module's exports, found once when it loads.
    type Exports: Copy + Send + Sync + 'static;
    /// The contract's functions in `component`'s export `interface` (the version it exports,
    /// compatible with [`Self::INTERFACE`]); a contract error naming the first one missing.
    fn exports(
        component: &Component,
        module: &str,
        interface: &str,
    ) -> Result<Self::Exports, LoadError>;
    /// The `info` function, which every contract has.
    fn info(exports: &Self::Exports) -> ComponentExportIndex;
    /// Each function's type checked against what the host lowers and lifts, in an instance
    /// made for the check when the module loads: a mismatch (a field the host does not know, a
    /// type of another shape) is named there, with the function, instead of trapping on every
    /// call. The function's name and wasmtime's error on the first that differs.
    fn typecheck(
        store: &mut Store<State>,
        instance: &Instance,
        exports: &Self::Exports,
    ) -> Result<(), (&'static str, wasmtime::Error)>;
}

/// Whether export `func` of `instance` takes `P` and returns `R`, as the host calls it.
pub(super) fn check<P, R>(
    store: &mut Store<State>,
    instance: &Instance,
    name: &'static str,
    func: ComponentExportIndex,
) -> Result<(), (&'static str, wasmtime::Error)>
where
    P: ComponentNamedList + Lower + Send + Sync,
    R: ComponentType + Lift + Send + Sync + 'static,
{
    instance
        .get_typed_func::<P, (R,)>(store, func)
        .map(drop)
        .map_err(|e| (name, e))
}

/// The role a module exporting a contract plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role {
    /// `node` or `fleet`: the key of `policy info -o json`.
    pub kind: &'static str,
    /// What a module of this contract is, and where it is given.
    pub what: &'static str,
}

/// The node contract (`wit/policy.wit`): the pull decisions an agent asks in a reconcile.
pub struct NodeContract;

/// The fleet contract (`wit/fleet/fleet.wit`): which nodes of a pool may pull now.
pub struct FleetContract;

/// Every contract this pinset serves: (interface, role).
pub const CONTRACTS: [(&str, Role); 2] = [
    (NodeContract::INTERFACE, NodeContract::ROLE),
    (FleetContract::INTERFACE, FleetContract::ROLE),
];

/// Where function `name` of `interface` (`package/interface@version`, as the module exports it)
/// is among `component`'s exports; a contract error naming what is missing when it is not there.
pub(super) fn export_index(
    component: &Component,
    module: &str,
    interface: &str,
    name: &str,
) -> Result<ComponentExportIndex, LoadError> {
    optional_export(component, interface, name).ok_or_else(|| LoadError::Contract {
        module: module.into(),
        expected: interface.into(),
        found: format!("no `{name}` export"),
    })
}

/// Function `name` of `interface` when `component` exports it: a function added in a compatible
/// version of a contract, which modules built for an older one lack.
pub(super) fn optional_export(
    component: &Component,
    interface: &str,
    name: &str,
) -> Option<ComponentExportIndex> {
    let iface = component.get_export_index(None, interface)?;
    component.get_export_index(Some(&iface), name)
}

/// The (major, minor) version of `export` when it names the interface of `contract`.
pub(super) fn version_of(export: &str, contract: &str) -> Option<(u64, u64)> {
    let prefix = &contract[..=contract.find('@')?];
    let version = export.strip_prefix(prefix)?;
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Semver compatibility: same major, and for 0.x the same minor.
pub(super) fn compatible(found: (u64, u64), wanted: (u64, u64)) -> bool {
    found.0 == wanted.0 && (found.0 != 0 || found.1 == wanted.1)
}

/// The export among `exports` that implements `contract` (or a semver-compatible version).
pub(super) fn implementing<'a>(exports: &'a [String], contract: &str) -> Option<&'a String> {
    let wanted = version_of(contract, contract)?;
    exports
        .iter()
        .find(|e| version_of(e, contract).is_some_and(|v| compatible(v, wanted)))
}

/// Whether `exports` has any version of `contract`'s interface: the contract a module was built
/// for, even when its version is not the one served.
pub(super) fn of_package(exports: &[String], contract: &str) -> bool {
    exports.iter().any(|e| version_of(e, contract).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_versions() {
        let node = NodeContract::INTERFACE;
        assert_eq!(version_of(node, node), Some((0, 1)));
        assert_eq!(
            version_of("pinset:policy/decisions@0.2.0", node),
            Some((0, 2))
        );
        assert_eq!(version_of("other:x/decisions@0.1.0", node), None);
        let fleet = FleetContract::INTERFACE;
        assert_eq!(
            version_of("pinset:fleet/rollout@0.2.3", fleet),
            Some((0, 2))
        );
        assert_eq!(version_of(node, fleet), None);
        assert!(compatible((0, 1), (0, 1)));
        assert!(!compatible((0, 2), (0, 1)));
        assert!(compatible((1, 3), (1, 0)));
        assert!(!compatible((2, 0), (1, 0)));
        let exports = ["pinset:fleet/rollout@0.2.0".to_string()];
        assert_eq!(implementing(&exports, fleet), Some(&exports[0]));
        assert_eq!(implementing(&exports, node), None);
        assert!(of_package(&exports, fleet) && !of_package(&exports, node));
        let future = ["pinset:fleet/rollout@0.3.0".to_string()];
        assert_eq!(implementing(&future, fleet), None);
        assert!(of_package(&future, fleet));
    }
}
