//! The host side of the policy contracts: the node's (`wit/policy.wit`) and the fleet's
//! (`wit/fleet/fleet.wit`).
//!
//! Every decision comes from a policy, and everything but a contract's own hooks is written
//! once, generic over the contract ([`Hooks`], over the Wasm side's [`Contract`]):
//! - [`WasmInstance<C>`]: an instance of a sandboxed WebAssembly component ([`Module<C>`]);
//! - [`Native<C>`]: a policy compiled into pinset (the references are the default policies' own
//!   source, so both answer alike);
//! - [`Guarded<C>`]: what the rest of pinset uses. It asks the primary policy, validates every
//!   answer ([`validate`]), and on any failure (trap, deadline, memory cap, invalid decision)
//!   answers with the native reference instead and records the fallback. `Guarded<NodeContract>`
//!   implements the core's [`Decisions`], which is all a reconcile sees;
//!   `Guarded<FleetContract>` answers the controller's grants;
//! - [`smoke_test`]: the check a module passes before it decides for a node or a pool.
//!
//! Each contract's hooks are in its own file: `node.rs` ([`PolicyInstance`]) and `fleet.rs`
//! ([`FleetInstance`]).
//!
//! May depend on: `pinset-core`, the SDK and the default policy's source (the native fallback),
//! wasmtime (and wasmtime-wasi, which brings tokio along). Must not depend on the node's adapters
//! (CRI, registries, pins), Kubernetes or metrics: what a policy does is reported through the
//! core's `Observer`; a call is synchronous and bounded by its deadline.

mod error;
mod fleet;
mod guard;
mod hooks;
mod native;
mod node;
mod smoke;
pub mod validate;
mod wasm;

pub use error::{LoadError, PolicyError};
pub use fleet::{Decided, FleetInstance};
pub use guard::Guarded;
pub use hooks::Hooks;
pub use native::Native;
pub use node::PolicyInstance;
pub use pinset_core::decisions::{Decisions, Fallback, Observer};
pub use pinset_policy_sdk::{
    Admission, AdmissionRequest, DiskFacts, Image, Images, Level, NodeFacts, PolicyInfo, Pressure,
    PullOutcome, Verdict,
};
pub use smoke::smoke_test;
pub use wasm::{
    COMPILE_INVALID_MODULE, COMPILE_SUBCOMMAND, CONTRACT, CONTRACTS, ChildCompiler, CompiledModule,
    Compiler, Contract, FLEET_CONTRACT, FleetContract, FleetModule, Limits, MAX_LOG_BYTES,
    MAX_LOG_LINE_BYTES, MAX_LOG_LINES, MAX_REASON_BYTES, MEMORY_FLAG, Module, NO_WAITING,
    NodeContract, PolicyModule, Role, STDERR_CAPTURE_BYTES, WasmInstance, WasmRuntime,
    bound_memory, bounded, instance_strategy, precompile,
};

pub use pinset_core::decisions::Hook;
use std::time::Duration;

/// What every policy instance answers, whatever its contract and whether it is a Wasm module or
/// compiled into pinset: its name and what it says of itself. The contracts' traits,
/// [`PolicyInstance`] and [`FleetInstance`], build on it.
pub trait Described: Send {
    /// The name of the module or built-in policy, for errors and metrics.
    fn name(&self) -> &str;
    fn info(&mut self) -> Result<PolicyInfo, PolicyError>;
}

/// Bounds every decision must respect.
pub const MAX_CONCURRENCY: u32 = 64;
pub const MAX_THROTTLE: Duration = Duration::from_secs(600);
/// Pulls at once a fleet grant may allow on a node.
pub const MAX_PULLS: u32 = MAX_CONCURRENCY;

/// The default policy module, built from `policies/default` and embedded at build time.
pub const EMBEDDED_DEFAULT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/default-policy.wasm"));
pub const EMBEDDED_DEFAULT_NAME: &str = "embedded:default";
