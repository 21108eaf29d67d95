//! The Kubernetes adapter: the API types and CRDs ([`api`]), conversions to the core's types
//! ([`convert`]), the pool controller ([`controller`]) and the node agent ([`agent`]).
//! The decisions stay in [`crate::core`]; this module reads and writes objects.

pub mod agent;
pub mod api;
pub mod condition;
pub mod controller;
pub mod convert;

use crate::policy::{Limits, PolicyModule, WasmRuntime};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A client from `kubeconfig`, else the usual discovery (in-cluster, then `$KUBECONFIG` or
/// `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration found (in-cluster, $KUBECONFIG or ~/.kube/config); pass --kubeconfig")?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// How pinset's watches list: from the API server's watch cache (`resourceVersion=0`), then watch
/// from the version that cache served. A quorum list would return etcd's newest version, which a
/// watch cache fed by an etcd without progress notifications (etcd 3.4) may not reach until the
/// next write to that resource: the watch would then wait on "too large resource version".
pub fn watcher_config() -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().any_semantic()
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyTableError {
    #[error("policy configuration {path}: {why}")]
    Config { path: PathBuf, why: String },
    #[error("--pool-policy {arg:?}: expected POOL=FILE.wasm or POOL=FILE.wasm@sha256:HEX")]
    Flag { arg: String },
    #[error("policy of pool {pool}: {source}")]
    Load {
        pool: String,
        source: crate::policy::LoadError,
    },
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
        serde_yaml::from_str(&text).map_err(|e| err(e.to_string()))
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
    ) -> Result<agent::PolicyTable, PolicyTableError> {
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
        Ok(agent::PolicyTable { default, by_pool })
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
                crate::policy::EMBEDDED_DEFAULT,
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
}
