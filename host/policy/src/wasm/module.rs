//! Loading a module: its size, sha256 pin and header checked and compiled once
//! ([`CompiledModule`]), then bound to a contract ([`Module`]): its export checked against the
//! contract's version, its imports linked (pre-instantiation), its functions found. One path
//! for every contract ([`Contract`]).

use super::contract::{self, CONTRACTS, Contract, FleetContract, NodeContract};
use super::engine::{Ticker, WasmRuntime};
use super::instance::{WasmInstance, typecheck};
use super::store::{Limits, State};
use crate::LoadError;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use wasmtime::Engine;
use wasmtime::component::Component;

/// The node contract's interface (and version) this pinset calls.
pub const CONTRACT: &str = NodeContract::INTERFACE;

/// A module's bytes checked (size, sha256 pin, header) and compiled, not yet bound to a
/// contract: one compile serves both contracts of a module that implements both. Cheap to clone.
#[derive(Clone)]
pub struct CompiledModule {
    pub(super) name: String,
    pub(super) sha256: String,
    pub(super) component: Component,
    pub(super) limits: Limits,
}

impl CompiledModule {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
}

impl WasmRuntime {
    /// Load a node policy module from a file. `sha256`, when given, must match the file.
    pub fn load_file(
        &self,
        path: &Path,
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<PolicyModule, LoadError> {
        self.load_file_as(path, sha256, limits)
    }

    /// Compile, check and pre-instantiate a node policy module.
    pub fn load(
        &self,
        name: &str,
        bytes: &[u8],
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<PolicyModule, LoadError> {
        self.load_as(name, bytes, sha256, limits)
    }

    /// Load a module of contract `C` from a file (`load_file_as::<FleetContract>`).
    pub fn load_file_as<C: Contract>(
        &self,
        path: &Path,
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<Module<C>, LoadError> {
        self.bind(&self.compile_file(path, sha256, limits)?)
    }

    /// Compile, check and pre-instantiate a module of contract `C`.
    pub fn load_as<C: Contract>(
        &self,
        name: &str,
        bytes: &[u8],
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<Module<C>, LoadError> {
        self.bind(&self.compile_module(name, bytes, sha256, limits)?)
    }

    /// `compiled` bound to contract `C`: its export of `C` (or a compatible version) checked,
    /// its imports linked once, the contract's functions found. One compile serves every
    /// contract a module exports.
    pub fn bind<C: Contract>(&self, compiled: &CompiledModule) -> Result<Module<C>, LoadError> {
        let (name, component) = (&compiled.name, &compiled.component);
        let interface = check_export::<C>(&self.engine, component, name)?;
        let pre = self.pre_instantiate(name, component)?;
        let exports = C::exports(component, name, &interface)?;
        typecheck::<C>(&self.engine, name, compiled.limits, &pre, &exports)?;
        Ok(Module {
            shared: Arc::new(Shared {
                interface,
                name: name.clone(),
                sha256: compiled.sha256.clone(),
                pre,
                exports,
                engine: self.engine.clone(),
                limits: compiled.limits,
                _ticker: self.ticker.clone(),
            }),
        })
    }

    /// Each contract `compiled` exports, bound; when it binds to none, the error of the
    /// contract it was built for (a module built for a fleet contract this pinset does not
    /// serve is told about the fleet contract), else the node contract's.
    pub fn bind_all(
        &self,
        compiled: &CompiledModule,
    ) -> Result<(Option<PolicyModule>, Option<FleetModule>), LoadError> {
        let (node, fleet) = (
            self.bind::<NodeContract>(compiled),
            self.bind::<FleetContract>(compiled),
        );
        match (node, fleet) {
            (Err(node), Err(fleet)) => {
                let exports = exports(&self.engine, &compiled.component);
                let built_for_fleet = contract::of_package(&exports, FleetContract::INTERFACE)
                    && !contract::of_package(&exports, NodeContract::INTERFACE);
                Err(if built_for_fleet { fleet } else { node })
            }
            (node, fleet) => Ok((node.ok(), fleet.ok())),
        }
    }

    /// What `compiled` exports and imports (interface names, sorted): the world an artifact's
    /// config records.
    pub fn world(&self, compiled: &CompiledModule) -> (Vec<String>, Vec<String>) {
        let mut exports = exports(&self.engine, &compiled.component);
        exports.sort();
        (exports, imports(&self.engine, &compiled.component))
    }

    /// A module file checked and compiled. `sha256`, when given, must match the file.
    pub fn compile_file(
        &self,
        path: &Path,
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<CompiledModule, LoadError> {
        let bytes = read_module(path, limits)?;
        self.compile_module(&path.display().to_string(), &bytes, sha256, limits)
    }

    /// Link the component's imports once (what the sandbox does not offer fails here, named).
    pub(super) fn pre_instantiate(
        &self,
        name: &str,
        component: &Component,
    ) -> Result<wasmtime::component::InstancePre<State>, LoadError> {
        self.linker
            .instantiate_pre(component)
            .map_err(|e| LoadError::Link {
                module: name.into(),
                cause: format!("{e:#}"),
            })
    }

    /// A module's size, sha256 pin and header checked, then compiled: what every contract's
    /// loading starts with.
    pub fn compile_module(
        &self,
        name: &str,
        bytes: &[u8],
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<CompiledModule, LoadError> {
        too_large(name, bytes.len() as u64, limits)?;
        let actual = hex(&Sha256::digest(bytes));
        if let Some(expected) = sha256 {
            let expected_norm = expected.trim().to_ascii_lowercase();
            if expected_norm.len() != 64 || !expected_norm.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(LoadError::BadSha256 {
                    module: name.into(),
                    value: expected.into(),
                });
            }
            if expected_norm != actual {
                return Err(LoadError::Sha256Mismatch {
                    module: name.into(),
                    expected: expected_norm,
                    actual,
                });
            }
        }
        check_header(name, bytes)?;
        Ok(CompiledModule {
            name: name.into(),
            sha256: actual,
            component: self.compile(name, bytes)?,
            limits,
        })
    }
}

/// A component starts with `\0asm`, a version, and layer 1 (a core module has layer 0): say
/// what the file is instead of quoting the compiler's byte dump.
fn check_header(name: &str, bytes: &[u8]) -> Result<(), LoadError> {
    let cause = match bytes {
        [0, b'a', b's', b'm', _, _, 1, 0, ..] => return Ok(()),
        [0, b'a', b's', b'm', _, _, 0, 0, ..] => {
            "a core WebAssembly module, not a component: build the policy for wasm32-wasip2"
        }
        _ => "not WebAssembly at all (no \\0asm header)",
    };
    Err(LoadError::Compile {
        module: name.into(),
        cause: cause.into(),
    })
}

/// A module file's bytes, refused before it is read when its size is over the limit (and at the
/// limit when it says none): a module's size bounds what loading it costs.
pub(super) fn read_module(path: &Path, limits: Limits) -> Result<Vec<u8>, LoadError> {
    let read = |source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let limit = pinset_core::input::module(limits.max_module_bytes as u64);
    pinset_core::input::bytes(path, limit).map_err(|e| match pinset_core::input::refused(&e) {
        Some(refused) => LoadError::TooLarge {
            module: path.display().to_string(),
            bytes: refused.size,
            max: limits.max_module_bytes,
        },
        None => read(e),
    })
}

pub(super) fn too_large(name: &str, bytes: u64, limits: Limits) -> Result<(), LoadError> {
    if bytes > limits.max_module_bytes as u64 {
        return Err(LoadError::TooLarge {
            module: name.into(),
            bytes: Some(bytes),
            max: limits.max_module_bytes,
        });
    }
    Ok(())
}

/// The interfaces a component exports.
fn exports(engine: &Engine, component: &Component) -> Vec<String> {
    let ty = component.component_type();
    ty.exports(engine).map(|(n, _)| n.to_string()).collect()
}

/// The module must export `C`'s interface or a semver-compatible version of it: the name it
/// exports it under. A module exporting another of pinset's contracts is told which role it
/// plays instead of being asked to rebuild.
fn check_export<C: Contract>(
    engine: &Engine,
    component: &Component,
    name: &str,
) -> Result<String, LoadError> {
    let exports = exports(engine, component);
    if let Some(found) = contract::implementing(&exports, C::INTERFACE) {
        return Ok(found.clone());
    }
    let other = CONTRACTS
        .iter()
        .filter(|(interface, _)| *interface != C::INTERFACE)
        .find_map(|(interface, role)| Some((contract::implementing(&exports, interface)?, role)));
    if let Some((found, role)) = other {
        return Err(LoadError::OtherContract {
            module: name.into(),
            expected: C::INTERFACE.into(),
            found: found.clone(),
            hint: format!("it is a {}, not a {}", role.what, C::ROLE.what),
        });
    }
    let found = if exports.is_empty() {
        "no exports".to_string()
    } else {
        exports.join(", ")
    };
    Err(LoadError::Contract {
        module: name.into(),
        expected: C::INTERFACE.into(),
        found,
    })
}

/// The interfaces a component imports, sorted: what it asks of the sandbox (pinset's `host`
/// interface, and WASI, which the sandbox offers empty).
pub(super) fn imports(engine: &Engine, component: &Component) -> Vec<String> {
    let mut names: Vec<String> = component
        .component_type()
        .imports(engine)
        .map(|(n, _)| n.to_string())
        .collect();
    names.sort();
    names
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) struct Shared<C: Contract> {
    /// The contract's interface as the module exports it (its version may be an older,
    /// compatible one).
    interface: String,
    pub(super) name: String,
    pub(super) sha256: String,
    pub(super) pre: wasmtime::component::InstancePre<State>,
    /// The contract's functions among the module's exports, found once.
    pub(super) exports: C::Exports,
    pub(super) engine: Engine,
    pub(super) limits: Limits,
    _ticker: Arc<Ticker>,
}

/// A compiled, checked, pre-instantiated module bound to contract `C`. Cheap to clone.
pub struct Module<C: Contract> {
    shared: Arc<Shared<C>>,
}

/// A node policy module.
pub type PolicyModule = Module<NodeContract>;
/// A fleet policy module.
pub type FleetModule = Module<FleetContract>;

impl<C: Contract> Clone for Module<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<C: Contract> Module<C> {
    pub fn name(&self) -> &str {
        &self.shared.name
    }
    pub fn sha256(&self) -> &str {
        &self.shared.sha256
    }
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }
    /// The contract's interface as the module exports it, with the version it was built for.
    pub fn interface(&self) -> &str {
        &self.shared.interface
    }
    /// The interfaces the module imports, sorted (`pinset policy info`).
    pub fn imports(&self) -> Vec<String> {
        imports(&self.shared.engine, self.shared.pre.component())
    }
    /// A fresh instance: for one reconcile (node), or one decision (fleet).
    pub fn instance(&self) -> WasmInstance<C> {
        WasmInstance::new(self.shared.clone())
    }
}
