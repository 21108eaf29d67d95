//! One reconcile on one node, and the adapters it runs through.
//!
//! - [`cri`]: the container runtime over CRI (client; generated protos, containerd's images API);
//! - [`pin`]: pin back ends (CRI-O drop-in + reload, containerd's pin label);
//! - [`os`]: disk space and pressure (PSI) of the node;
//! - [`executor`]: runs a plan's pulls in slots, with the policy's throttle, retries, ENOSPC
//!   drain and cancellation;
//! - [`facts`], [`reconcile`]: the reconcile as its phases (facts → plan → pulls → verify →
//!   pin → settle); [`config`]: the one way to build a [`Reconciler`] from flags.
//!
//! Registries — credentials, sizing through the node's mirrors — are `pinset-registry`'s.
//!
//! May depend on: `pinset-core` (rules, plan, settle, status, the `Decisions` trait), the policy
//! SDK's contract types (the facts a reconcile hands the decisions: images, node, disk),
//! `pinset-registry`, tokio, tonic. Must not depend on the policy runtime (wasmtime) or
//! Kubernetes: the decisions of a reconcile are an argument, whatever implements them.

pub mod config;
pub mod cri;
pub mod executor;
pub mod facts;
pub mod os;
pub mod pin;
pub mod pull;
pub mod reconcile;

pub use config::NodeConfig;
pub use facts::{Facts, Snapshot};
pub use reconcile::{PIN_CONFIRM_TIMEOUT, ReconcileError, Reconciler, Report};
