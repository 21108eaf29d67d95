//! Which policy a node uses: its primary pool's, from the agent's policy configuration (a
//! ConfigMap) and `--pool-policy` flags, else the default. A pool's module is a file or an
//! `oci://…@sha256:…` artifact, its cosign signature required when the configuration names
//! keys. A module that cannot be fetched, verified or loaded affects only the pools that name
//! it: their nodes decide with the default and say why (their PolicyFallback condition).

use pinset_core::status::RunningPolicy;
use pinset_node::policy_source::{Fetcher, Source, fetch_blocking};
use pinset_node::registry::signature::VerifyingKey;
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
    #[error(
        "--pool-policy {arg:?}: expected POOL=FILE.wasm, POOL=FILE.wasm@sha256:HEX or POOL=oci://REGISTRY/REPOSITORY@sha256:HEX"
    )]
    Flag { arg: String },
    #[error("policy configuration: {what}: {why}")]
    Key { what: String, why: String },
    #[error("policy of pool {pool}: {source}")]
    Load { pool: String, source: LoadError },
}

/// The policy configuration file (a ConfigMap mounted into the agent):
///
/// ```yaml
/// verify:            # optional: every pool's module must carry a cosign signature by one of these
///   keys: ["-----BEGIN PUBLIC KEY-----\n…"]
/// pools:
///   master:
///     module: oci://quay.io/org/io-adaptive@sha256:5f0c…   # or a file
///     sha256: 9a1b…   # optional: refuse any other module bytes
///     verify: {keys: […]}   # optional: this pool's keys instead
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    #[serde(default)]
    pub verify: Option<Verify>,
    #[serde(default)]
    pub pools: BTreeMap<String, ModuleRef>,
}

/// The public keys (PEM, as `cosign.pub` holds them) a module's signature must verify with.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verify {
    pub keys: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRef {
    /// A file, or `oci://REGISTRY/REPOSITORY@sha256:HEX`.
    pub module: String,
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub verify: Option<Verify>,
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
        // An artifact's digest is its name; a file's is a pin on its bytes.
        let (module, sha256) = match rest.rsplit_once("@sha256:") {
            Some((m, h)) if !rest.starts_with(pinset_node::registry::artifact::SCHEME) => {
                (m, Some(h.to_string()))
            }
            _ => (rest, None),
        };
        let verify = self.pools.get(pool).and_then(|m| m.verify.clone());
        self.pools.insert(
            pool.into(),
            ModuleRef {
                module: module.into(),
                sha256,
                verify,
            },
        );
        Ok(())
    }

    /// The keys a pool's module must be signed by (its own, else the configuration's); a key
    /// that does not parse is an error of the configuration.
    fn keys(&self, pool: &str, m: &ModuleRef) -> Result<Vec<VerifyingKey>, PolicyTableError> {
        let verify = m.verify.as_ref().or(self.verify.as_ref());
        let keys = verify.map(|v| v.keys.as_slice()).unwrap_or_default();
        keys.iter()
            .enumerate()
            .map(|(n, pem)| {
                VerifyingKey::from_pem(pem).map_err(|e| PolicyTableError::Key {
                    what: format!("pool {pool}: key {}", n + 1),
                    why: e.to_string(),
                })
            })
            .collect()
    }

    /// Fetch, verify and compile every pool's module. A pool whose module fails any step is
    /// recorded as refused (its nodes use the default); only a configuration that cannot be
    /// read (a key that does not parse) is an error.
    pub fn load(
        &self,
        runtime: &WasmRuntime,
        default: PolicyModule,
        limits: Limits,
        fetcher: &Fetcher,
    ) -> Result<PolicyTable, PolicyTableError> {
        let since = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut table = PolicyTable {
            running_default: running(&default, &since),
            default,
            by_pool: BTreeMap::new(),
            running: BTreeMap::new(),
            refused: BTreeMap::new(),
        };
        for (pool, m) in &self.pools {
            let keys = self.keys(pool, m)?;
            match load_one(runtime, limits, fetcher, m, &keys) {
                Ok(module) => {
                    table.running.insert(pool.clone(), running(&module, &since));
                    table.by_pool.insert(pool.clone(), module);
                }
                Err(why) => {
                    let error = PolicyTableError::Load {
                        pool: pool.clone(),
                        source: why,
                    };
                    tracing::error!(pool = %pool, error = %error, "policy refused: the pool's nodes decide with the default");
                    table.refused.insert(pool.clone(), error.to_string());
                }
            }
        }
        Ok(table)
    }
}

/// What the node status says of `module`: its own `info` (or why it gave none), digest, source.
fn running(module: &PolicyModule, since: &str) -> RunningPolicy {
    use pinset_policy::Described as _;
    let (name, version) = match module.instance().info() {
        Ok(info) => (info.name, info.version),
        Err(e) => (format!("(no info: {e})"), String::new()),
    };
    RunningPolicy {
        name,
        version,
        digest: format!("sha256:{}", module.sha256()),
        module: module.name().to_string(),
        since: since.to_string(),
    }
}

/// One pool's module: fetched (file or artifact, signature checked), then compiled and bound.
fn load_one(
    runtime: &WasmRuntime,
    limits: Limits,
    fetcher: &Fetcher,
    m: &ModuleRef,
    keys: &[VerifyingKey],
) -> Result<PolicyModule, LoadError> {
    let fetch_error = |cause: String| LoadError::Fetch {
        module: m.module.clone(),
        cause,
    };
    let source = Source::parse(&m.module).map_err(|e| fetch_error(e.to_string()))?;
    if let Source::File(path) = &source {
        // A file's size is checked before it is read.
        return match keys.is_empty() {
            true => runtime.load_file(path, m.sha256.as_deref(), limits),
            false => Err(fetch_error(
                "a signature is required and a file carries none: reference a signed oci:// artifact".into(),
            )),
        };
    }
    let fetched = fetch_blocking(fetcher, &source, keys).map_err(|e| fetch_error(e.to_string()))?;
    runtime.load(&fetched.name, &fetched.bytes, m.sha256.as_deref(), limits)
}

/// The policy of each pool; a node uses its primary pool's.
#[derive(Clone)]
pub struct PolicyTable {
    pub default: PolicyModule,
    pub by_pool: BTreeMap<String, PolicyModule>,
    /// What each module is, as node statuses report it (the default's, and each pool's).
    pub running_default: RunningPolicy,
    pub running: BTreeMap<String, RunningPolicy>,
    /// Pools whose module was refused, and why: their nodes use the default.
    pub refused: BTreeMap<String, String>,
}

impl PolicyTable {
    pub fn for_pools(&self, pools: &[String]) -> &PolicyModule {
        pools
            .first()
            .and_then(|p| self.by_pool.get(p))
            .unwrap_or(&self.default)
    }

    /// The module a node of `pools` decides with, as its status reports it.
    pub fn running_for(&self, pools: &[String]) -> &RunningPolicy {
        pools
            .first()
            .and_then(|p| self.running.get(p))
            .unwrap_or(&self.running_default)
    }

    /// Why the primary pool's module was refused, when it was: the node says so on its status.
    pub fn refused_for(&self, pools: &[String]) -> Option<String> {
        let pool = pools.first()?;
        let why = self.refused.get(pool)?;
        Some(format!(
            "{why}; deciding with the default policy ({})",
            self.default.name()
        ))
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
        assert_eq!(c.pools["infra"].module, "/p/b.wasm");
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

    fn fetcher() -> Fetcher {
        Fetcher {
            artifacts: pinset_node::registry::artifact::Artifacts::new(vec![], Default::default()),
            cache: None,
            max_bytes: 1 << 20,
        }
    }

    fn default_module(runtime: &WasmRuntime) -> PolicyModule {
        runtime
            .load(
                "d",
                pinset_policy::EMBEDDED_DEFAULT,
                None,
                Limits::default(),
            )
            .unwrap()
    }

    /// `c` loaded with the embedded default and no registry or cache.
    fn load(c: &PolicyConfig, runtime: &WasmRuntime) -> Result<PolicyTable, PolicyTableError> {
        c.load(
            runtime,
            default_module(runtime),
            Limits::default(),
            &fetcher(),
        )
    }

    #[test]
    fn a_module_that_cannot_load_is_refused_for_its_pool_only() {
        let runtime = WasmRuntime::new().unwrap();
        let mut c = PolicyConfig::default();
        c.add_flag("infra=/nonexistent/p.wasm").unwrap();
        let table = load(&c, &runtime).unwrap();
        let why = table.refused_for(&["infra".into()]).unwrap();
        assert!(
            why.contains("pool infra")
                && why.contains("/nonexistent/p.wasm")
                && why.contains("default"),
            "{why}"
        );
        assert_eq!(table.for_pools(&["infra".into()]).name(), "d");
        assert!(table.refused_for(&["worker".into()]).is_none());
    }

    #[test]
    fn a_required_signature_refuses_a_file_and_a_bad_key_is_a_configuration_error() {
        let runtime = WasmRuntime::new().unwrap();
        let key = pinset_node::registry::signature::SigningKey::generate(b"")
            .unwrap()
            .1
            .public()
            .to_pem();
        let yaml = format!("verify: {{keys: [{key:?}]}}\npools:\n  infra: {{module: /p/a.wasm}}\n");
        let c: PolicyConfig = serde_yaml::from_str(&yaml).unwrap();
        let table = load(&c, &runtime).unwrap();
        let why = table.refused_for(&["infra".into()]).unwrap();
        assert!(
            why.contains("signature is required") && why.contains("/p/a.wasm"),
            "{why}"
        );

        let c: PolicyConfig = serde_yaml::from_str(
            "pools:\n  infra: {module: /p/a.wasm, verify: {keys: [nonsense]}}\n",
        )
        .unwrap();
        let e = load(&c, &runtime).err().unwrap().to_string();
        assert!(
            e.contains("pool infra: key 1") && e.contains("PUBLIC KEY"),
            "{e}"
        );
    }

    #[test]
    fn an_artifact_reference_keeps_its_digest() {
        let mut c = PolicyConfig::default();
        let oci = format!("oci://r.io/p/x@sha256:{}", "a".repeat(64));
        c.add_flag(&format!("infra={oci}")).unwrap();
        assert_eq!(c.pools["infra"].module, oci);
        assert_eq!(c.pools["infra"].sha256, None);
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
            running_default: running(&load("default"), "t"),
            running: [("infra".to_string(), running(&load("infra"), "t"))].into(),
            default: load("default"),
            by_pool: [("infra".to_string(), load("infra"))].into(),
            refused: Default::default(),
        };
        assert_eq!(
            table.for_pools(&["infra".into(), "worker".into()]).name(),
            "infra"
        );
        assert_eq!(table.for_pools(&["worker".into()]).name(), "default");
        assert_eq!(table.for_pools(&[]).name(), "default");
        let infra = table.running_for(&["infra".into()]);
        assert_eq!(
            (infra.name.as_str(), infra.module.as_str()),
            ("default", "infra")
        );
        assert_eq!(infra.digest, format!("sha256:{}", table.default.sha256()));
        assert_eq!(table.running_for(&["worker".into()]).module, "default");
    }
}
