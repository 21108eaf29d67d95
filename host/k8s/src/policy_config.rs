//! The policy configuration: which node policy module each pool's nodes decide with, and the
//! keys their signatures must verify with. It lives in one cluster-scoped object,
//! [`crate::api::PolicyConfiguration`] `cluster`, which the agent and the controller follow
//! through a watch (`--policy-configuration NAME`); a file (`--policy-config`, the object's
//! spec) is read once, for runs without an API server.
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

use crate::api::PolicyConfiguration;
use kube::runtime::reflector::{ObjectRef, Store};
use pinset_core::input;
use pinset_registry::signature::VerifyingKey;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a start waits for the configuration's first list (an API server without the CRD
/// never answers one: the configuration is then empty until it does).
const FIRST_LIST: Duration = Duration::from_secs(10);

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
    #[error("policy configuration: {what}: {why}")]
    Key { what: String, why: String },
}

pub use crate::api::{FleetConfig, ModuleRef, PolicyConfig, Verify};

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
            Some((m, h)) if !reference.starts_with(pinset_registry::artifact::SCHEME) => {
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
        let text = input::text(path, input::CONFIG).map_err(|e| PolicyConfigError::Config {
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
        config.check_keys()?;
        Ok(config)
    }

    /// Every key parses (a key that does not is an error of the whole configuration).
    pub fn check_keys(&self) -> Result<(), PolicyConfigError> {
        let fleet = self
            .fleet
            .iter()
            .flat_map(|f| f.module.iter().chain(f.pools.values()));
        for (pool, m) in self.pools.iter().chain(fleet.map(|m| (&m.module, m))) {
            self.keys(pool, m)?;
        }
        Ok(())
    }

    /// The fleet module the configuration names for `pool` (its own, else every pool's).
    pub fn fleet_for(&self, pool: &str) -> Option<&ModuleRef> {
        let fleet = self.fleet.as_ref()?;
        fleet.pools.get(pool).or(fleet.module.as_ref())
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

/// A short fingerprint of a set of trusted keys (PEM), whatever their order; empty for none. A
/// verdict on a module's signature is remembered under it: other keys, another check.
pub fn fingerprint(keys: &[String]) -> String {
    use sha2::Digest;
    if keys.is_empty() {
        return String::new();
    }
    let mut sorted: Vec<&str> = keys.iter().map(|k| k.trim()).collect();
    sorted.sort_unstable();
    let digest = sha2::Sha256::digest(sorted.join("\n").as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Where the configuration comes from: read once (a file, flags), or followed in the API.
#[derive(Clone)]
pub enum ConfigSource {
    Fixed(PolicyConfig),
    Watched {
        /// The PolicyConfiguration's name.
        name: String,
        store: Store<PolicyConfiguration>,
        /// `--pool-policy` flags, applied over the object's spec.
        flags: Vec<String>,
    },
}

impl ConfigSource {
    /// The configuration now. An object that does not exist (yet) is an empty configuration;
    /// one whose keys do not parse is an error naming it.
    pub fn current(&self) -> Result<PolicyConfig, PolicyConfigError> {
        let (name, store, flags) = match self {
            ConfigSource::Fixed(c) => return Ok(c.clone()),
            ConfigSource::Watched { name, store, flags } => (name, store, flags),
        };
        let mut config = store
            .get(&ObjectRef::new(name))
            .map(|o| o.spec.clone())
            .unwrap_or_default();
        for (pool, m) in &config.pools {
            config
                .keys(pool, m)
                .map_err(|e| PolicyConfigError::Config {
                    origin: format!("PolicyConfiguration {name}"),
                    why: e.to_string(),
                })?;
        }
        for flag in flags {
            config.add_flag(flag)?;
        }
        Ok(config)
    }

    /// The PolicyConfiguration followed, by name, and its `metadata.generation` now (`None`
    /// when it does not exist); `None` for a configuration read once. Read it before
    /// [`ConfigSource::current`] when a status will claim it: the status then never names a
    /// generation newer than the configuration it was computed from.
    pub fn observed(&self) -> Option<(String, Option<i64>)> {
        match self {
            ConfigSource::Fixed(_) => None,
            ConfigSource::Watched { name, store, .. } => {
                let object = store.get(&ObjectRef::new(name));
                Some((name.clone(), object.and_then(|o| o.metadata.generation)))
            }
        }
    }

    /// Follow the PolicyConfiguration `name`: its cache, filled before this returns (or after
    /// [`FIRST_LIST`], or when `shutdown` fires), and `on_change` called on each change of it.
    pub async fn watch(
        client: kube::Client,
        name: String,
        flags: Vec<String>,
        metrics: crate::metrics::Metrics,
        on_change: impl Fn() + Send + 'static,
        shutdown: CancellationToken,
    ) -> Self {
        let config = crate::watcher_config().fields(&format!("metadata.name={name}"));
        let store = crate::spawn_reflector::<PolicyConfiguration>(
            client,
            config,
            move |_| on_change(),
            metrics,
            shutdown.clone(),
        );
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = store.wait_until_ready() => {}
            _ = tokio::time::sleep(FIRST_LIST) => {
                tracing::warn!(policy_configuration = %name, "no PolicyConfiguration list yet (is its CRD installed?); every pool decides with the default until one arrives");
            }
        }
        ConfigSource::Watched { name, store, flags }
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
}
