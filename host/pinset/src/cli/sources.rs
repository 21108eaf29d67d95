//! The registries every command and component reaches — images and policies alike — as the
//! registries file ([`pinset_registry::sources`]) and `--insecure-registry` say, read once at
//! start.

use anyhow::Result;
use pinset_registry::sources::Sources;
use std::path::Path;
use std::sync::OnceLock;

static SOURCES: OnceLock<Sources> = OnceLock::new();

/// Read the registries file (`file`, else the environment's or the user's) and add `insecure`.
pub fn init(file: Option<&Path>, insecure: &[String]) -> Result<()> {
    let mut sources = Sources::load(file)?;
    sources.insecure_registries = sources.insecure(insecure);
    if let Some(origin) = &sources.origin {
        tracing::debug!(file = %origin.display(), insecure = ?sources.insecure_registries, "registries file read");
    }
    let _ = SOURCES.set(sources);
    Ok(())
}

/// What [`init`] read; nothing marked before it.
pub fn get() -> &'static Sources {
    SOURCES.get_or_init(Sources::default)
}
