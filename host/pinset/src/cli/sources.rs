//! The registries every command and component reaches — images and policies alike — as the
//! registries file ([`pinset_registry::sources`]), `--insecure-registry` and the kubelet's
//! credential providers (`--image-credential-provider-*`) say, read once at start.

use anyhow::Result;
use pinset_node::config::ProviderFiles;
use pinset_registry::sources::Sources;
use std::path::Path;
use std::sync::OnceLock;

static SOURCES: OnceLock<Sources> = OnceLock::new();
static PROVIDERS: OnceLock<ProviderFiles> = OnceLock::new();

/// Read the registries file (`file`, else the environment's or the user's) and add `insecure`;
/// keep the kubelet's credential providers when named.
pub fn init(
    file: Option<&Path>,
    insecure: &[String],
    providers: Option<ProviderFiles>,
) -> Result<()> {
    if let Some(providers) = providers {
        let _ = PROVIDERS.set(providers);
    }
    let mut sources = Sources::load(file)?;
    sources.insecure_registries = sources.insecure(insecure);
    if let Some(origin) = &sources.origin {
        tracing::debug!(file = %origin.display(), insecure = ?sources.insecure_registries, "registries file read");
    }
    let _ = SOURCES.set(sources);
    Ok(())
}

/// The kubelet's image credential providers `--image-credential-provider-*` named, for images
/// and policies alike.
pub fn providers() -> Option<&'static ProviderFiles> {
    PROVIDERS.get()
}

/// What [`init`] read; nothing marked before it.
pub fn get() -> &'static Sources {
    SOURCES.get_or_init(Sources::default)
}
