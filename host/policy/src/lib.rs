//! The host side of the policy contract (`wit/policy.wit`).
//!
//! Every pull decision comes from a policy:
//! - [`WasmPolicy`]: a sandboxed WebAssembly component implementing `wit/policy.wit`;
//! - [`NativePolicy`]: a policy compiled into pinset (the reference policy is the default
//!   policy's own source, so both have identical semantics);
//! - [`Guarded`]: what the rest of pinset uses. It asks the primary policy, validates every
//!   answer ([`validate`]), and on any failure (trap, deadline, memory cap, invalid decision)
//!   answers with the native reference policy instead and records the fallback. It implements
//!   the core's [`Decisions`](pinset_core::decisions::Decisions), which is all a reconcile sees.
//!
//! May depend on: `pinset-core`, the SDK and the default policy's source (the native fallback),
//! wasmtime (and wasmtime-wasi, which brings tokio along). Must not depend on the node's adapters
//! (CRI, registries, pins), Kubernetes or metrics: what a policy does is reported through the
//! core's `Observer`; a call is synchronous and bounded by its deadline.

mod error;
pub mod fleet;
mod guard;
mod native;
mod smoke;
pub mod synth;
pub mod validate;
mod wasm;

pub use error::{LoadError, PolicyError};
pub use fleet::{Decided, FleetInstance, GuardedFleet, NativeFleet};
pub use guard::Guarded;
pub use native::NativePolicy;
pub use pinset_core::decisions::{Decisions, Fallback, Observer};
pub use pinset_policy_sdk::{
    Admission, AdmissionRequest, DiskFacts, Image, Images, Level, NodeFacts, PolicyInfo, Pressure,
    PullOutcome, Verdict,
};
pub use smoke::{fleet_smoke_test, smoke_test};
pub use wasm::{
    COMPILE_INVALID_MODULE, COMPILE_SUBCOMMAND, CONTRACT, CONTRACTS, CompiledModule, Compiler,
    Contract, FLEET_CONTRACT, FleetContract, FleetModule, Limits, MAX_LOG_BYTES,
    MAX_LOG_LINE_BYTES, MAX_LOG_LINES, MAX_REASON_BYTES, Module, NO_WAITING, Node, PolicyModule,
    Role, STDERR_CAPTURE_BYTES, WasmFleet, WasmInstance, WasmPolicy, WasmRuntime, bounded,
    instance_strategy, precompile,
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

/// One live instance of a node policy, answering the hooks of one reconcile. Calls may fail;
/// callers other than tests and benchmarks use [`Guarded`], which never does.
pub trait PolicyInstance: Described {
    fn admit(&mut self, request: &AdmissionRequest) -> Result<Admission, PolicyError>;
    fn order(&mut self, node: &NodeFacts, images: &Images) -> Result<Vec<u32>, PolicyError>;
    fn concurrency(&mut self, node: &NodeFacts) -> Result<u32, PolicyError>;
    /// The raw answer in milliseconds; [`Guarded::throttle`] validates and converts it.
    fn throttle(
        &mut self,
        node: &NodeFacts,
        outcome: &PullOutcome,
        pressure: &Pressure,
    ) -> Result<u64, PolicyError>;
}

/// Bounds every decision must respect.
pub const MAX_CONCURRENCY: u32 = 64;
pub const MAX_THROTTLE: Duration = Duration::from_secs(600);

/// The default policy module, built from `policies/default` and embedded at build time.
pub const EMBEDDED_DEFAULT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/default-policy.wasm"));
pub const EMBEDDED_DEFAULT_NAME: &str = "embedded:default";
