//! pinset's network edge: everything pinset asks of a registry, and the node's configuration of
//! where to ask (mirrors, credentials). Every answer a registry, a mirror, a token service or a
//! blob store sends is read in one place, [`http::Http::send`], bounded in bytes per kind of
//! answer and in time per request ([`limits`]); a reviewer auditing what a hostile registry can
//! do to a node reads `http.rs`, `limits.rs` and `client.rs`.
//!
//! - [`http`]: the one bounded reader (deadline per request, cap per kind, redirects);
//! - [`client`]: authentication as registries ask (bearer tokens, basic), credentials kept home;
//! - [`distribution`]: the OCI distribution API — manifests and blobs by digest, checked; pushes;
//! - [`oci`]: manifests, indexes and descriptors;
//! - [`auth`]: credentials from a kubelet `config.json`;
//! - [`mirrors`]: `registries.conf` and `hosts.toml`, read as the runtime reads them;
//! - [`size`]: image sizes through the mirrors, validated, under a sizing budget;
//! - [`artifact`], [`signature`]: policy modules as OCI artifacts and their cosign signatures;
//! - [`policy_source`]: where a module comes from (a file, or an artifact through the node cache);
//! - [`release`], [`tar`]: a release payload's image list, its layers streamed, never held.
//!
//! Depends on the core only; the node, the controller and the CLI use it.

pub mod artifact;
pub mod auth;
pub mod client;
pub mod credential_provider;
pub mod distribution;
pub mod files;
pub mod http;
pub mod limits;
pub mod mirrors;
pub mod oci;
pub mod policy_source;
pub mod release;
pub mod signature;
pub mod size;
pub mod sources;
pub mod tar;

pub use client::{Client, RegistryError};

/// An error and its causes, outermost first, each said once: HTTP client errors say little on
/// their own ("error sending request") and name the cause (refused, TLS, timeout) only in their
/// sources, which some messages already quote.
pub fn causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}
