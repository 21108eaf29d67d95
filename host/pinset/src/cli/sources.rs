//! The registries every command and component reaches — images and policies alike — as the
//! registries file ([`pinset_registry::sources`]), `--insecure-registry` and the kubelet's
//! credential providers (`--image-credential-provider-*`) say, read once at start.

use anyhow::Result;
use pinset_registry::credential_provider::Providers;
use pinset_registry::sources::Sources;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

static SOURCES: OnceLock<Sources> = OnceLock::new();
static PROVIDERS: OnceLock<Arc<Providers>> = OnceLock::new();

/// The registries every command reaches, as its global flags name them.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RegistryFlags {
    /// The registries file (`insecureRegistries`, `auth`), for images and policies alike;
    /// default: $PINSET_REGISTRIES, else ~/.config/pinset/registries.yaml when it exists.
    #[arg(long, global = true, value_name = "FILE")]
    pub registries: Option<PathBuf>,
    /// A registry (`host[:port]`) to speak plain HTTP to, for images and policies alike (added
    /// to the registries file's); repeatable.
    #[arg(long, global = true, value_name = "HOST")]
    pub insecure_registry: Vec<String>,
    /// The kubelet's image credential provider configuration (a CredentialProviderConfig, YAML
    /// or JSON, as the kubelet's flag of this name reads it): the exec plugins that give
    /// credentials for the registries --auth has none for (ECR, ACR, Artifact Registry), for
    /// images and policies alike.
    #[arg(long, global = true, value_name = "FILE")]
    pub image_credential_provider_config: Option<PathBuf>,
    /// The directory of the credential provider plugins, each named as its provider (the
    /// kubelet's flag of this name). Both flags or neither.
    #[arg(long, global = true, value_name = "DIR")]
    pub image_credential_provider_bin_dir: Option<PathBuf>,
}

/// Read the registries file (`--registries`, else the environment's or the user's) and add
/// `--insecure-registry`; read the kubelet's credential providers when named (once: every
/// client shares their plugin runs and kept answers).
pub fn init(flags: &RegistryFlags) -> Result<()> {
    let providers = (
        flags.image_credential_provider_config.as_deref(),
        flags.image_credential_provider_bin_dir.as_deref(),
    );
    match providers {
        (Some(config), Some(bin_dir)) => {
            let _ = PROVIDERS.set(Arc::new(Providers::load(config, bin_dir)?));
        }
        (None, None) => {}
        // A global flag's requirement is not checked wherever it stands: checked here.
        _ => anyhow::bail!(
            "--image-credential-provider-config and --image-credential-provider-bin-dir go \
             together, as the kubelet's do: give both or neither"
        ),
    }
    let mut sources = Sources::load(flags.registries.as_deref())?;
    sources.insecure_registries = sources.insecure(&flags.insecure_registry);
    if let Some(origin) = &sources.origin {
        tracing::debug!(file = %origin.display(), insecure = ?sources.insecure_registries, "registries file read");
    }
    let _ = SOURCES.set(sources);
    Ok(())
}

/// The kubelet's image credential providers `--image-credential-provider-*` named, for images
/// and policies alike.
pub fn providers() -> Option<&'static Arc<Providers>> {
    PROVIDERS.get()
}

/// The credentials of `auth` (else the registries file's) and of the credential providers:
/// what every command reaches registries with, images and policies alike.
pub fn credentials(
    auth: Option<&std::path::Path>,
) -> Result<Arc<pinset_registry::auth::Credentials>> {
    let auth = get().auth(auth);
    Ok(pinset_node::config::credentials(
        auth.as_deref(),
        providers(),
    )?)
}

/// What [`init`] read; nothing marked before it.
pub fn get() -> &'static Sources {
    SOURCES.get_or_init(Sources::default)
}
