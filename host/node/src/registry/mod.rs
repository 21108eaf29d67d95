//! Registries: credentials (kubelet-style `config.json`), image sizing, and policy modules as
//! OCI artifacts with their cosign signatures.

pub mod artifact;

pub mod auth;
pub mod signature;
pub mod size;
