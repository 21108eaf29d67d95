//! pinset: pre-pull and pin container images on Kubernetes nodes.
//!
//! - [`core`]: pure domain logic (no I/O): quantities, desired state, plans.
//! - [`policy`]: the policy contract on the host side, the sandboxed Wasm runtime, the native
//!   reference policy and the guard that validates decisions and falls back.
//! - [`scenario`]: offline policy scenarios (`pinset policy test`).
//! - [`node`]: one node's reconcile (the pipeline around the core, over CRI).
//! - [`k8s`]: the Kubernetes adapter: CRDs, the pool controller, the node agent.
//! - [`metrics`], [`http`]: Prometheus metrics and the endpoint serving them.
//! - [`cli`]: one module per subcommand.

pub mod cli;
pub mod core;
pub mod cri;
pub mod http;
pub mod k8s;
pub mod metrics;
pub mod node;
pub mod objects;
pub mod os;
pub mod pin;
pub mod policy;
pub mod registry;
pub mod scenario;
