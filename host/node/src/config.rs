//! The one way from flags to a [`Reconciler`] on a real node: `pinset node`, `pinset plan` and
//! the agent all build theirs here.

use crate::cri::client::{CriClient, CriConfig, CriError};
use crate::pin::AnyPins;
use crate::pin::containerd::ContainerdPins;
use crate::pin::crio::CrioPins;
use crate::reconcile::Reconciler;
use pinset_registry::auth::{AuthError, Credentials};
use pinset_registry::credential_provider::Providers;
use pinset_registry::mirrors::{CONTAINERD_HOSTS_DIR, MirrorSource, REGISTRIES_CONF};
use pinset_registry::size::{Cached, RegistrySizer};
use std::path::PathBuf;
use std::sync::Arc;

/// Which pin back end a node uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinKind {
    /// The runtime's own: asked with CRI `Version` (`cri-o` or `containerd`).
    Auto,
    /// The CRI-O drop-in `50-pinned-images` and a reload.
    Crio,
    /// The image label `io.cri-containerd.pinned=pinned` through containerd's images API.
    Containerd,
}

/// How a node reaches its runtime, its registries and its pins.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// CRI endpoint (`unix:///…`).
    pub cri: String,
    pub pin: PinKind,
    /// Directory of the CRI-O drop-in.
    pub crio_dropin_dir: PathBuf,
    /// How CRI-O is made to re-read its configuration.
    pub crio_reload: crate::pin::reload::Reload,
    /// Registry credentials (kubelet `config.json`).
    pub auth: Option<PathBuf>,
    /// The kubelet's image credential providers, for what `auth` has no credential for.
    pub credential_providers: Option<Arc<Providers>>,
    /// Registries (`host[:port]`) spoken to over plain HTTP when sizing.
    pub insecure_registries: Vec<String>,
    /// Size absent images from their registries.
    pub sizing: bool,
    /// Where the node's registry mirrors are read from (flags over the runtime's defaults).
    pub mirrors: MirrorFlags,
    /// The total time of one round of sizing.
    pub sizing_budget: std::time::Duration,
}

/// The node's mirror configuration as flags name it; what is not named is found as the runtime
/// finds it.
#[derive(Clone, Debug, Default)]
pub struct MirrorFlags {
    /// CRI-O's `registries.conf` (drop-ins in `FILE.d`).
    pub registries_conf: Option<PathBuf>,
    /// containerd's `config_path` directory of `HOST/hosts.toml` files.
    pub hosts_dir: Option<PathBuf>,
}

impl MirrorFlags {
    /// The configuration the node's runtime reads: CRI-O's `registries.conf` (the flag, else
    /// `$CONTAINERS_REGISTRIES_CONF`, else `/etc/containers/registries.conf`); containerd's
    /// hosts directory (the flag, else the `config_path` the runtime reports, else
    /// `/etc/containerd/certs.d`).
    pub async fn for_runtime(&self, pin: PinKind, cri: &CriClient) -> MirrorSource {
        match pin {
            PinKind::Containerd => {
                let dir = match &self.hosts_dir {
                    Some(dir) => dir.clone(),
                    None => cri
                        .registry_config_path()
                        .await
                        .unwrap_or_else(|| CONTAINERD_HOSTS_DIR.into()),
                };
                MirrorSource::HostsDir(dir)
            }
            PinKind::Crio | PinKind::Auto => {
                MirrorSource::RegistriesConf(self.registries_conf.clone().unwrap_or_else(|| {
                    std::env::var_os("CONTAINERS_REGISTRIES_CONF")
                        .map_or_else(|| REGISTRIES_CONF.into(), PathBuf::from)
                }))
            }
        }
    }

    /// Without a runtime to follow (`pinset plan` without `--cri`): what the flags name.
    pub fn offline(&self) -> Result<MirrorSource, ConfigError> {
        match (&self.registries_conf, &self.hosts_dir) {
            (Some(_), Some(_)) => Err(ConfigError::TwoMirrorConfigs),
            (Some(file), None) => Ok(MirrorSource::RegistriesConf(file.clone())),
            (None, Some(dir)) => Ok(MirrorSource::HostsDir(dir.clone())),
            (None, None) => Ok(MirrorSource::None),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(
        "CRI endpoint {endpoint}: the runtime is {name:?}, which pinset cannot pin for; choose --pin crio or --pin containerd"
    )]
    UnknownRuntime { endpoint: String, name: String },
    #[error(
        "--registries-conf (CRI-O) and --registry-config-path (containerd) name two runtimes' mirror configurations: give one"
    )]
    TwoMirrorConfigs,
}

impl PinKind {
    /// The back end for a runtime that calls itself `name` (CRI `Version.runtime_name`).
    pub fn for_runtime(name: &str) -> Option<PinKind> {
        match name {
            "cri-o" => Some(PinKind::Crio),
            "containerd" => Some(PinKind::Containerd),
            _ => None,
        }
    }
}

impl NodeConfig {
    /// The node whose runtime is at `cri` (`unix:///…`), as the flags' defaults describe it: the
    /// back end the runtime asks for, CRI-O's drop-in where CRI-O reads it, no credentials,
    /// images sized through the runtime's mirrors within the default budget.
    pub fn new(cri: impl Into<String>) -> NodeConfig {
        NodeConfig {
            cri: cri.into(),
            pin: PinKind::Auto,
            crio_dropin_dir: crate::pin::crio::DEFAULT_DIR.into(),
            crio_reload: Default::default(),
            auth: None,
            credential_providers: None,
            insecure_registries: Vec::new(),
            sizing: true,
            mirrors: MirrorFlags::default(),
            sizing_budget: pinset_registry::size::SIZING_BUDGET,
        }
    }

    /// The node's reconciler. With [`PinKind::Auto`] the runtime is asked which it is;
    /// otherwise nothing is asked of it yet.
    pub async fn connect(&self) -> Result<Reconciler<RegistrySizer, AnyPins>, ConfigError> {
        let cri = CriClient::new(CriConfig {
            endpoint: self.cri.clone(),
            ..Default::default()
        })?;
        let pin = match self.pin {
            PinKind::Auto => {
                let name = cri.version().await?.runtime_name;
                let pin =
                    PinKind::for_runtime(&name).ok_or_else(|| ConfigError::UnknownRuntime {
                        endpoint: self.cri.clone(),
                        name: name.clone(),
                    })?;
                tracing::info!(endpoint = %self.cri, runtime = %name, "pinning for the node's runtime");
                pin
            }
            chosen => chosen,
        };
        let credentials = credentials(self.auth.as_deref(), self.credential_providers.as_ref())?;
        let pins = match pin {
            PinKind::Containerd => AnyPins::Containerd(Box::new(ContainerdPins::new(&self.cri)?)),
            // (`Auto` was resolved above.)
            PinKind::Crio | PinKind::Auto => AnyPins::Crio(CrioPins::new(
                &self.crio_dropin_dir,
                self.crio_reload.clone(),
            )),
        };
        let mirrors = self.mirrors.for_runtime(pin, &cri).await;
        tracing::info!(mirrors = %mirrors.describe(), "sizing through the runtime's mirror configuration");
        let mut reconciler = Reconciler::new(cri, pins).with_credentials(credentials.clone());
        if self.sizing {
            let sizer = RegistrySizer::new(self.insecure_registries.clone(), credentials)
                .with_mirrors(mirrors);
            reconciler =
                reconciler.with_sizer(Arc::new(Cached::new(sizer).with_budget(self.sizing_budget)));
        }
        Ok(reconciler)
    }
}

/// The registry credentials of a kubelet `config.json` (none without one), and of the kubelet's
/// image credential providers where there are some.
pub fn credentials(
    auth: Option<&std::path::Path>,
    providers: Option<&Arc<Providers>>,
) -> Result<Arc<Credentials>, AuthError> {
    let credentials = match auth {
        Some(path) => Credentials::load(path)?,
        None => Credentials::default(),
    };
    Ok(Arc::new(match providers {
        Some(providers) => credentials.with_providers(providers.clone()),
        None => credentials,
    }))
}

/// The cached registry sizer every command and the agent size images with.
pub fn sizer(
    insecure_registries: &[String],
    credentials: Arc<Credentials>,
    mirrors: MirrorSource,
    budget: std::time::Duration,
) -> Arc<Cached<RegistrySizer>> {
    let sizer = RegistrySizer::new(insecure_registries.to_vec(), credentials).with_mirrors(mirrors);
    Arc::new(Cached::new(sizer).with_budget(budget))
}
