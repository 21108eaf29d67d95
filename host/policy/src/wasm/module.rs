//! Loading a module: its size, sha256 pin and header checked and compiled once
//! ([`CompiledModule`]), then per contract its version checked and its imports linked
//! (pre-instantiation).

use super::borrowed::BorrowedHooks;
use super::engine::{Ticker, WasmRuntime};
use super::instance::WasmPolicy;
use super::store::{Limits, State};
use crate::LoadError;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use wasmtime::Engine;
use wasmtime::component::Component;

/// The exported interface (and version) this pinset calls.
pub const CONTRACT: &str = "pinset:policy/decisions@0.1.0";

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
    /// Load a module from a file. `sha256`, when given, must match the file.
    pub fn load_file(
        &self,
        path: &Path,
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<PolicyModule, LoadError> {
        self.policy_module(&self.compile_file(path, sha256, limits)?)
    }

    /// Compile, check and pre-instantiate a module.
    pub fn load(
        &self,
        name: &str,
        bytes: &[u8],
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<PolicyModule, LoadError> {
        self.policy_module(&self.compile_module(name, bytes, sha256, limits)?)
    }

    /// Check a compiled module's node contract and pre-instantiate it.
    pub fn policy_module(&self, compiled: &CompiledModule) -> Result<PolicyModule, LoadError> {
        let (name, pre) = (&compiled.name, self.bind(compiled, CONTRACT)?);
        let hooks = BorrowedHooks::find(&compiled.component, name, CONTRACT)?;
        Ok(PolicyModule {
            shared: Arc::new(Shared {
                name: name.clone(),
                sha256: compiled.sha256.clone(),
                pre,
                hooks,
                engine: self.engine.clone(),
                limits: compiled.limits,
                _ticker: self.ticker.clone(),
            }),
        })
    }

    /// `compiled` checked to export `contract` (or a compatible version) and its imports linked
    /// once: what binding a module to either contract starts with.
    pub(super) fn bind(
        &self,
        compiled: &CompiledModule,
        contract: &str,
    ) -> Result<wasmtime::component::InstancePre<State>, LoadError> {
        let (name, component) = (&compiled.name, &compiled.component);
        check_export(&self.engine, component, name, contract)?;
        self.pre_instantiate(name, component)
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

/// A module file's bytes, refused before it is read when it is over the size limit: a module's
/// size bounds what loading it costs.
pub(super) fn read_module(path: &Path, limits: Limits) -> Result<Vec<u8>, LoadError> {
    let read = |source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read)?.len();
    too_large(&path.display().to_string(), size, limits)?;
    std::fs::read(path).map_err(read)
}

pub(super) fn too_large(name: &str, bytes: u64, limits: Limits) -> Result<(), LoadError> {
    if bytes > limits.max_module_bytes as u64 {
        return Err(LoadError::TooLarge {
            module: name.into(),
            bytes,
            max: limits.max_module_bytes,
        });
    }
    Ok(())
}

/// The module must export `contract` (`package/interface@version`) or a semver-compatible
/// version of it.
pub(super) fn check_export(
    engine: &Engine,
    component: &Component,
    name: &str,
    contract: &str,
) -> Result<(), LoadError> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    // The export implementing `c`, or a semver-compatible version of it.
    let implementing = |c: &str| {
        let wanted = version_of(c, c).expect("a contract has a version");
        exports
            .iter()
            .find(|e| version_of(e, c).is_some_and(|v| compatible(v, wanted)))
    };
    if implementing(contract).is_some() {
        return Ok(());
    }
    // pinset's other contract: say which role the module plays instead of asking to rebuild it.
    let (other, hint) = if contract == CONTRACT {
        (
            super::FLEET_CONTRACT,
            "it is a fleet rollout policy, for the controller (`pinset controller --fleet-policy`)",
        )
    } else {
        (
            CONTRACT,
            "it is a node pull policy, for the agents (`--policy`), not a fleet rollout policy",
        )
    };
    if let Some(found) = implementing(other) {
        return Err(LoadError::OtherContract {
            module: name.into(),
            expected: contract.into(),
            found: found.clone(),
            hint,
        });
    }
    let found = if exports.is_empty() {
        "no exports".to_string()
    } else {
        exports.join(", ")
    };
    Err(LoadError::Contract {
        module: name.into(),
        expected: contract.into(),
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

/// The (major, minor) version of `export` when it names the interface of `contract`.
fn version_of(export: &str, contract: &str) -> Option<(u64, u64)> {
    let prefix = &contract[..=contract.find('@')?];
    let version = export.strip_prefix(prefix)?;
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}
/// Semver compatibility: same major, and for 0.x the same minor.
fn compatible(found: (u64, u64), wanted: (u64, u64)) -> bool {
    found.0 == wanted.0 && (found.0 != 0 || found.1 == wanted.1)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) struct Shared {
    pub(super) name: String,
    pub(super) sha256: String,
    pub(super) pre: wasmtime::component::InstancePre<State>,
    /// The contract's functions among the module's exports, found once; called with borrowed
    /// arguments.
    pub(super) hooks: BorrowedHooks,
    pub(super) engine: Engine,
    pub(super) limits: Limits,
    _ticker: Arc<Ticker>,
}

/// A compiled, checked, pre-instantiated policy module. Cheap to clone.
#[derive(Clone)]
pub struct PolicyModule {
    shared: Arc<Shared>,
}

impl PolicyModule {
    pub fn name(&self) -> &str {
        &self.shared.name
    }
    pub fn sha256(&self) -> &str {
        &self.shared.sha256
    }
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }
    /// The interfaces the module imports, sorted (`pinset policy info`).
    pub fn imports(&self) -> Vec<String> {
        imports(&self.shared.engine, self.shared.pre.component())
    }
    /// A fresh instance for one reconcile.
    pub fn instance(&self) -> WasmPolicy {
        WasmPolicy {
            shared: self.shared.clone(),
            live: None,
            log: Arc::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_versions() {
        assert_eq!(version_of(CONTRACT, CONTRACT), Some((0, 1)));
        assert_eq!(
            version_of("pinset:policy/decisions@0.2.0", CONTRACT),
            Some((0, 2))
        );
        assert_eq!(version_of("other:x/decisions@0.1.0", CONTRACT), None);
        let fleet = super::super::fleet::FLEET_CONTRACT;
        assert_eq!(
            version_of("pinset:fleet/rollout@0.2.3", fleet),
            Some((0, 2))
        );
        assert_eq!(version_of(CONTRACT, fleet), None);
        assert!(compatible((0, 1), (0, 1)));
        assert!(!compatible((0, 2), (0, 1)));
        assert!(compatible((1, 3), (1, 0)));
        assert!(!compatible((2, 0), (1, 0)));
    }
}
