//! Registries: credentials (kubelet-style `config.json`), image sizing, and policy modules as
//! OCI artifacts with their cosign signatures.

pub mod artifact;
pub mod auth;
pub mod distribution;
pub mod mirrors;
pub mod signature;
pub mod size;

/// The distribution client sizing and artifacts speak through: plain HTTP to the registries
/// listed, the same timeouts. It installs the process's TLS crypto provider (a second install is
/// a no-op), which the client needs.
pub(crate) fn client(insecure_registries: Vec<String>) -> oci_client::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::HttpsExcept(insecure_registries),
        connect_timeout: Some(std::time::Duration::from_secs(5)),
        read_timeout: Some(std::time::Duration::from_secs(30)),
        ..Default::default()
    })
}

/// An error and its causes, outermost first, each said once: HTTP client errors say little on
/// their own ("error sending request") and name the cause (refused, TLS, timeout) only in their
/// sources, which some messages already quote.
pub(crate) fn causes(e: &dyn std::error::Error) -> String {
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
