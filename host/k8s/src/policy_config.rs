//! The policy configuration: which node policy module each pool's nodes decide with, and the
//! keys their signatures must verify with. It lives in one ConfigMap (`pinset-policies` in
//! pinset's namespace, key `policies.yaml`), which the agent and the controller follow through
//! a watch (`--policy-configmap NAMESPACE/NAME`); a file (`--policy-config`) is read once, for
//! runs without an API server.
//!
//! ```yaml
//! verify:            # optional: every pool's module must carry a cosign signature by one of these
//!   keys: ["-----BEGIN PUBLIC KEY-----\n…"]
//! pools:
//!   master:
//!     module: oci://quay.io/org/io-adaptive@sha256:5f0c…   # or a file
//!     sha256: 9a1b…   # optional: refuse any other module bytes
//!     verify: {keys: […]}   # optional: this pool's keys instead
//! ```

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::{ObjectRef, Store};
use pinset_node::registry::signature::VerifyingKey;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tokio_util::sync::CancellationToken;

/// The ConfigMap's key holding the configuration.
pub const CONFIG_KEY: &str = "policies.yaml";

#[derive(Debug, thiserror::Error)]
pub enum PolicyConfigError {
    #[error("policy configuration {origin}: {why}")]
    Config { origin: String, why: String },
    /// `ORIGIN:LINE:COL: field.path: message`.
    #[error("{origin}:{error}")]
    Parse {
        origin: String,
        error: pinset_core::yaml::YamlError,
    },
    #[error(
        "--pool-policy {arg:?}: expected POOL=FILE.wasm, POOL=FILE.wasm@sha256:HEX or POOL=oci://REGISTRY/REPOSITORY@sha256:HEX"
    )]
    Flag { arg: String },
    #[error("--policy-configmap {arg:?}: expected NAMESPACE/NAME")]
    ConfigMapRef { arg: String },
    #[error("policy configuration: {what}: {why}")]
    Key { what: String, why: String },
}

/// The policy configuration (see the module's documentation).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    #[serde(default)]
    pub verify: Option<Verify>,
    #[serde(default)]
    pub pools: BTreeMap<String, ModuleRef>,
}

/// The public keys (PEM, as `cosign.pub` holds them) a module's signature must verify with.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verify {
    pub keys: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRef {
    /// A file, or `oci://REGISTRY/REPOSITORY@sha256:HEX`.
    pub module: String,
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub verify: Option<Verify>,
}

impl ModuleRef {
    /// The module as statuses name it: the artifact (its digest is its name), or the file with
    /// its pinned sha256 (`FILE@sha256:HEX`).
    pub fn reference(&self) -> String {
        match &self.sha256 {
            Some(hex) => format!("{}@sha256:{hex}", self.module),
            None => self.module.clone(),
        }
    }

    /// The module a [`ModuleRef::reference`] names; `None` for an empty one.
    pub fn from_reference(reference: &str) -> Option<Self> {
        if reference.is_empty() {
            return None;
        }
        // An artifact's digest is its name; a file's is a pin on its bytes.
        let (module, sha256) = match reference.rsplit_once("@sha256:") {
            Some((m, h)) if !reference.starts_with(pinset_node::registry::artifact::SCHEME) => {
                (m, Some(h.to_string()))
            }
            _ => (reference, None),
        };
        Some(ModuleRef {
            module: module.into(),
            sha256,
            verify: None,
        })
    }
}

impl PolicyConfig {
    pub fn read(path: &Path) -> Result<Self, PolicyConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| PolicyConfigError::Config {
            origin: origin.clone(),
            why: e.to_string(),
        })?;
        Self::parse(&text, &origin)
    }

    /// The configuration in `text`; errors name `origin` (a file, or the ConfigMap's key).
    pub fn parse(text: &str, origin: &str) -> Result<Self, PolicyConfigError> {
        let config: Self = pinset_core::yaml::from_str(text, pinset_core::yaml::Fields::Strict)
            .map(|(config, _)| config)
            .map_err(|error| PolicyConfigError::Parse {
                origin: origin.into(),
                error,
            })?;
        // A key that does not parse is an error of the whole configuration, found now.
        for (pool, m) in &config.pools {
            config.keys(pool, m)?;
        }
        Ok(config)
    }

    /// Add `POOL=FILE[@sha256:HEX]` or `POOL=oci://…` (flags win over the file).
    pub fn add_flag(&mut self, arg: &str) -> Result<(), PolicyConfigError> {
        let bad = || PolicyConfigError::Flag { arg: arg.into() };
        let (pool, rest) = arg.split_once('=').ok_or_else(bad)?;
        if pool.is_empty() || rest.is_empty() {
            return Err(bad());
        }
        let mut module = ModuleRef::from_reference(rest).ok_or_else(bad)?;
        module.verify = self.pools.get(pool).and_then(|m| m.verify.clone());
        self.pools.insert(pool.into(), module);
        Ok(())
    }

    /// The keys a pool's module must be signed by (its own, else the configuration's).
    pub fn keys(&self, pool: &str, m: &ModuleRef) -> Result<Vec<VerifyingKey>, PolicyConfigError> {
        let verify = m.verify.as_ref().or(self.verify.as_ref());
        let keys = verify.map(|v| v.keys.as_slice()).unwrap_or_default();
        keys.iter()
            .enumerate()
            .map(|(n, pem)| {
                VerifyingKey::from_pem(pem).map_err(|e| PolicyConfigError::Key {
                    what: format!("pool {pool}: key {}", n + 1),
                    why: e.to_string(),
                })
            })
            .collect()
    }
}

/// `NAMESPACE/NAME` of the ConfigMap holding the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigMapRef {
    pub namespace: String,
    pub name: String,
}

impl ConfigMapRef {
    pub fn parse(arg: &str) -> Result<Self, PolicyConfigError> {
        match arg.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    namespace: ns.into(),
                    name: name.into(),
                })
            }
            _ => Err(PolicyConfigError::ConfigMapRef { arg: arg.into() }),
        }
    }
}

impl std::fmt::Display for ConfigMapRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "configmap {}/{}", self.namespace, self.name)
    }
}

/// Where the configuration comes from: read once (a file, flags), or followed in a ConfigMap.
#[derive(Clone)]
pub enum ConfigSource {
    Fixed(PolicyConfig),
    Watched {
        at: ConfigMapRef,
        store: Store<ConfigMap>,
        /// `--pool-policy` flags, applied over the ConfigMap's content.
        flags: Vec<String>,
    },
}

impl ConfigSource {
    /// The configuration now. A ConfigMap that does not exist (yet) is an empty configuration;
    /// one that does not parse is an error naming it, line and column.
    pub fn current(&self) -> Result<PolicyConfig, PolicyConfigError> {
        let (at, store, flags) = match self {
            ConfigSource::Fixed(c) => return Ok(c.clone()),
            ConfigSource::Watched { at, store, flags } => (at, store, flags),
        };
        let cm = store.get(&ObjectRef::new(&at.name).within(&at.namespace));
        let text = cm
            .as_ref()
            .and_then(|cm| cm.data.as_ref())
            .and_then(|d| d.get(CONFIG_KEY));
        let mut config = match text {
            Some(text) => PolicyConfig::parse(text, &format!("{at} key {CONFIG_KEY}"))?,
            None => PolicyConfig::default(),
        };
        for flag in flags {
            config.add_flag(flag)?;
        }
        Ok(config)
    }

    /// Follow the ConfigMap `at`: its cache, filled before this returns (or when `shutdown`
    /// fires), and `on_change` called on each change of it.
    pub async fn watch(
        client: kube::Client,
        at: ConfigMapRef,
        flags: Vec<String>,
        metrics: crate::metrics::Metrics,
        on_change: impl Fn() + Send + 'static,
        shutdown: CancellationToken,
    ) -> Self {
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, &at.namespace);
        let config = crate::watcher_config().fields(&format!("metadata.name={}", at.name));
        let (store, events) = crate::cached_watch(api, config);
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            loop {
                let next = tokio::select! {
                    _ = stop.cancelled() => return,
                    n = events.next() => n,
                };
                match next {
                    None => return,
                    Some(Err(e)) => crate::watch_interrupted::<ConfigMap>(&metrics, &e),
                    Some(Ok(_)) => on_change(),
                }
            }
        });
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = store.wait_until_ready() => {}
        }
        ConfigSource::Watched { at, store, flags }
    }
}

/// The file of `--policy-config`, or an empty configuration, with `--pool-policy` flags over it.
pub fn fixed(path: Option<&PathBuf>, flags: &[String]) -> Result<PolicyConfig, PolicyConfigError> {
    let mut config = match path {
        Some(path) => PolicyConfig::read(path)?,
        None => PolicyConfig::default(),
    };
    for flag in flags {
        config.add_flag(flag)?;
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_flags_and_file() {
        let mut c = PolicyConfig::parse(
            "pools:\n  master: {module: /p/a.wasm, sha256: abc}\n",
            "t.yaml",
        )
        .unwrap();
        c.add_flag("infra=/p/b.wasm@sha256:0123").unwrap();
        c.add_flag("worker=/p/c.wasm").unwrap();
        assert_eq!(c.pools["master"].reference(), "/p/a.wasm@sha256:abc");
        assert_eq!(c.pools["infra"].module, "/p/b.wasm");
        assert_eq!(c.pools["infra"].sha256.as_deref(), Some("0123"));
        assert_eq!(c.pools["worker"].sha256, None);
        for bad in ["nopool", "=x.wasm", "worker="] {
            assert!(
                c.add_flag(bad).unwrap_err().to_string().contains(bad),
                "{bad}"
            );
        }
        let typo = PolicyConfig::parse("pools:\n  m: {module: x}\npool: {}\n", "cm key")
            .unwrap_err()
            .to_string();
        assert!(typo.starts_with("cm key:3:"), "{typo}");
    }

    #[test]
    fn an_artifact_reference_keeps_its_digest() {
        let mut c = PolicyConfig::default();
        let oci = format!("oci://r.io/p/x@sha256:{}", "a".repeat(64));
        c.add_flag(&format!("infra={oci}")).unwrap();
        assert_eq!(c.pools["infra"].module, oci);
        assert_eq!(c.pools["infra"].sha256, None);
        assert_eq!(c.pools["infra"].reference(), oci);
        assert_eq!(ModuleRef::from_reference(&oci).unwrap(), c.pools["infra"]);
    }

    #[test]
    fn a_key_that_does_not_parse_is_an_error_of_the_configuration() {
        let e = PolicyConfig::parse(
            "pools:\n  infra: {module: /p/a.wasm, verify: {keys: [nonsense]}}\n",
            "cm",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("pool infra: key 1") && e.contains("PUBLIC KEY"),
            "{e}"
        );
    }

    #[test]
    fn a_configmap_is_named_namespace_slash_name() {
        let at = ConfigMapRef::parse("pinset/pinset-policies").unwrap();
        assert_eq!(at.to_string(), "configmap pinset/pinset-policies");
        for bad in ["pinset", "/x", "x/", "a/b/c"] {
            assert!(ConfigMapRef::parse(bad).is_err(), "{bad}");
        }
    }
}
