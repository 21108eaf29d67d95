//! Which policy a node uses: its primary pool's, from the agent's policy configuration (a
//! ConfigMap) and `--pool-policy` flags, else the default.

use pinset_policy::{Limits, LoadError, PolicyModule, WasmRuntime};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PolicyTableError {
    #[error("policy configuration {path}: {why}")]
    Config { path: PathBuf, why: String },
    /// `FILE:LINE:COL: field.path: message`.
    #[error("{path}:{error}")]
    Parse {
        path: PathBuf,
        error: pinset_core::yaml::YamlError,
    },
    #[error("--pool-policy {arg:?}: expected POOL=FILE.wasm or POOL=FILE.wasm@sha256:HEX")]
    Flag { arg: String },
    #[error("policy of pool {pool}: {source}")]
    Load { pool: String, source: LoadError },
}

/// The policy configuration file (a ConfigMap mounted into the agent):
///
/// ```yaml
/// pools:
///   master:
///     module: /etc/pinset/policies/io-adaptive.wasm
///     sha256: 5f0c…   # optional: refuse any other module
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    #[serde(default)]
    pub pools: BTreeMap<String, ModuleRef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRef {
    pub module: PathBuf,
    #[serde(default)]
    pub sha256: Option<String>,
}

impl PolicyConfig {
    pub fn read(path: &Path) -> Result<Self, PolicyTableError> {
        let err = |why: String| PolicyTableError::Config {
            path: path.into(),
            why,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        pinset_core::yaml::from_str(&text, pinset_core::yaml::Fields::Strict)
            .map(|(config, _)| config)
            .map_err(|error| PolicyTableError::Parse {
                path: path.into(),
                error,
            })
    }

    /// Add `POOL=FILE[@sha256:HEX]` (flags win over the file).
    pub fn add_flag(&mut self, arg: &str) -> Result<(), PolicyTableError> {
        let bad = || PolicyTableError::Flag { arg: arg.into() };
        let (pool, rest) = arg.split_once('=').ok_or_else(bad)?;
        if pool.is_empty() || rest.is_empty() {
            return Err(bad());
        }
        let (module, sha256) = match rest.rsplit_once("@sha256:") {
            Some((m, h)) => (m, Some(h.to_string())),
            None => (rest, None),
        };
        self.pools.insert(
            pool.into(),
            ModuleRef {
                module: module.into(),
                sha256,
            },
        );
        Ok(())
    }

    /// Compile every module (each checked against its sha256 when given).
    pub fn load(
        &self,
        runtime: &WasmRuntime,
        default: PolicyModule,
        limits: Limits,
    ) -> Result<PolicyTable, PolicyTableError> {
        let mut by_pool = BTreeMap::new();
        for (pool, m) in &self.pools {
            let module = runtime
                .load_file(&m.module, m.sha256.as_deref(), limits)
                .map_err(|source| PolicyTableError::Load {
                    pool: pool.clone(),
                    source,
                })?;
            by_pool.insert(pool.clone(), module);
        }
        Ok(PolicyTable { default, by_pool })
    }
}

/// The policy of each pool; a node uses its primary pool's.
#[derive(Clone)]
pub struct PolicyTable {
    pub default: PolicyModule,
    pub by_pool: BTreeMap<String, PolicyModule>,
}

impl PolicyTable {
    pub fn for_pools(&self, pools: &[String]) -> &PolicyModule {
        pools
            .first()
            .and_then(|p| self.by_pool.get(p))
            .unwrap_or(&self.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_flags_and_file() {
        let mut c: PolicyConfig =
            serde_yaml::from_str("pools:\n  master: {module: /p/a.wasm, sha256: abc}\n").unwrap();
        c.add_flag("infra=/p/b.wasm@sha256:0123").unwrap();
        c.add_flag("worker=/p/c.wasm").unwrap();
        assert_eq!(c.pools["master"].sha256.as_deref(), Some("abc"));
        assert_eq!(c.pools["infra"].module, PathBuf::from("/p/b.wasm"));
        assert_eq!(c.pools["infra"].sha256.as_deref(), Some("0123"));
        assert_eq!(c.pools["worker"].sha256, None);
        for bad in ["nopool", "=x.wasm", "worker="] {
            assert!(
                c.add_flag(bad).unwrap_err().to_string().contains(bad),
                "{bad}"
            );
        }
        assert!(
            serde_yaml::from_str::<PolicyConfig>("pool: {}\n").is_err(),
            "typos are refused"
        );
    }

    #[test]
    fn a_missing_module_names_the_pool_and_the_file() {
        let runtime = WasmRuntime::new().unwrap();
        let default = runtime
            .load(
                "d",
                pinset_policy::EMBEDDED_DEFAULT,
                None,
                Limits::default(),
            )
            .unwrap();
        let mut c = PolicyConfig::default();
        c.add_flag("infra=/nonexistent/p.wasm").unwrap();
        let e = c
            .load(&runtime, default, Limits::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("pool infra") && e.contains("/nonexistent/p.wasm"),
            "{e}"
        );
    }

    #[test]
    fn a_node_uses_its_primary_pools_policy() {
        let runtime = WasmRuntime::new().unwrap();
        let load = |n: &str| {
            runtime
                .load(n, pinset_policy::EMBEDDED_DEFAULT, None, Default::default())
                .unwrap()
        };
        let table = PolicyTable {
            default: load("default"),
            by_pool: [("infra".to_string(), load("infra"))].into(),
        };
        assert_eq!(
            table.for_pools(&["infra".into(), "worker".into()]).name(),
            "infra"
        );
        assert_eq!(table.for_pools(&["worker".into()]).name(), "default");
        assert_eq!(table.for_pools(&[]).name(), "default");
    }
}
