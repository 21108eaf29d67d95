//! Registries: credentials (kubelet-style `config.json`) and image sizing.

pub mod auth;
pub mod size;
