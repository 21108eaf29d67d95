//! Write a pinset pull policy in plain Rust.
//!
//! A policy is a type that implements [`Policy`]; `export_policy!(MyPolicy)` turns the crate
//! into a WebAssembly component implementing the `pinset:policy` contract (`wit/policy.wit`)
//! when it is built for `wasm32-wasip2`. Natively, the same type is an ordinary Rust value whose
//! decisions can be unit tested with `cargo test`.
//!
//! ```
//! use pinset_policy_sdk::*;
//!
//! #[derive(Default)]
//! struct TwoAtATime;
//!
//! impl Policy for TwoAtATime {
//!     fn info(&self) -> PolicyInfo {
//!         PolicyInfo::new("two-at-a-time", "0.1.0", "two pulls at once, no pause between them")
//!     }
//!     fn concurrency(&self, _node: &NodeFacts) -> u32 {
//!         2
//!     }
//!     fn throttle(&self, _node: &NodeFacts, _outcome: &PullOutcome, _pressure: &Pressure) -> u64 {
//!         0
//!     }
//!     // Admission and order are the reference's (`reference`).
//! }
//!
//! export_policy!(TwoAtATime);
//! # fn main() { assert_eq!(TwoAtATime.concurrency(&NodeFacts::default()), 2); }
//! ```
//!
//! The SDK needs no standard library (`#![no_std]`, with `alloc`). A policy built without one
//! imports nothing but the contract: no WASI, whose interfaces every instance pays for (see
//! BENCHMARKS.md, "The floor"). Such a policy enables the SDK's `no-std` feature, which brings
//! the module's allocator and panic handler (the panic is logged through the contract and quoted
//! in pinset's error), and declares `#![cfg_attr(target_arch = "wasm32", no_std)]`; the default
//! policy is built this way.

#![no_std]

extern crate alloc;
#[cfg(test)]
extern crate std;

/// What the standard library's prelude would bring, for the SDK's own modules.
mod prelude {
    pub use alloc::format;
    pub use alloc::string::{String, ToString};
    pub use alloc::vec;
    pub use alloc::vec::Vec;
}

/// Paths the export macros expand to, valid in a crate without the standard library.
#[doc(hidden)]
pub mod __private {
    pub use alloc::vec::Vec;
}

#[cfg(all(target_arch = "wasm32", feature = "no-std"))]
mod bare;
pub mod fleet;
mod fleet_view;
mod helpers;
pub mod reference;
mod types;

pub use fleet::{
    Fleet, FleetNode, FleetPool, Grant, MAX_PULLING_ANNOTATION, NodeProgress, Phase,
    RolloutRequest, SetState, Target, TargetSet, count_or_percent,
};
pub use fleet_view::{Node, NodeSet, Nodes, Rollout};
pub use helpers::*;
pub use types::*;

use prelude::*;

/// The decisions of a pull policy. See `wit/policy.wit` for the contract each method implements.
///
/// Only [`info`](Policy::info) is required: a decision the policy does not write is the
/// reference's ([`reference`](mod@reference)), so a policy names what it changes and nothing else.
/// A policy instance lives for one reconcile at most: do not rely on state kept between calls.
pub trait Policy {
    /// Name, version and a one-line description.
    fn info(&self) -> PolicyInfo;
    /// May the images be pulled? Called once per reconcile with every image of the node.
    fn admit(&self, request: &AdmissionRequest) -> Admission {
        reference::admit(request)
    }
    /// A permutation of `0..images.len()`: the order to pull the admitted, absent images in.
    fn order(&self, node: &NodeFacts, images: &Images) -> Vec<u32> {
        reference::order(node, images)
    }
    /// Pulls at once on this node, 1..=64.
    fn concurrency(&self, node: &NodeFacts) -> u32 {
        reference::concurrency(node)
    }
    /// Milliseconds a pull slot pauses after `outcome` (at most 600 000).
    fn throttle(&self, node: &NodeFacts, outcome: &PullOutcome, pressure: &Pressure) -> u64 {
        reference::throttle(node, outcome, pressure)
    }
}

/// Write a line to pinset's log. In a native build (unit tests), or a module exporting neither
/// contract, this does nothing.
pub fn log(level: Level, message: &str) {
    #[cfg(all(target_arch = "wasm32", feature = "decisions"))]
    guest::log(level, message);
    #[cfg(all(target_arch = "wasm32", not(feature = "decisions"), feature = "fleet"))]
    fleet_guest::log(level, message);
    #[cfg(not(all(target_arch = "wasm32", any(feature = "decisions", feature = "fleet"))))]
    let _ = (level, message);
}

// Each contract's bindings exist only when the crate exports it (features `decisions`, on by
// default, and `fleet`): a component must export every interface its bindings declare. They are
// wit-bindgen's output for `wit/`, generated once and checked in (`src/generated/`, written by
// `scripts/codegen`, whose `--check` fails when they are stale), so building a policy compiles
// no proc macro.
/// `pub fn log` of a contract's glue module: the SDK's [`Level`] as the contract's `level` (the
/// `wit` types module where it is called) through the contract's `host::log` import. Both
/// contracts declare the same `level` enum; this is its one mapping.
#[cfg(target_arch = "wasm32")]
macro_rules! host_log {
    () => {
        pub fn log(level: crate::Level, message: &str) {
            let level = match level {
                crate::Level::Debug => wit::Level::Debug,
                crate::Level::Info => wit::Level::Info,
                crate::Level::Warn => wit::Level::Warn,
                crate::Level::Error => wit::Level::Error,
            };
            host::log(level, message);
        }
    };
}

#[cfg(all(target_arch = "wasm32", feature = "decisions"))]
#[doc(hidden)]
#[rustfmt::skip]
#[path = "generated/policy.rs"]
pub mod bindings;

#[cfg(all(target_arch = "wasm32", feature = "decisions"))]
#[doc(hidden)]
pub mod guest;

#[cfg(all(target_arch = "wasm32", feature = "fleet"))]
#[doc(hidden)]
#[rustfmt::skip]
#[path = "generated/fleet.rs"]
pub mod fleet_bindings;

#[cfg(all(target_arch = "wasm32", feature = "fleet"))]
#[doc(hidden)]
pub mod fleet_guest;

/// Export a [`Fleet`] type (which must implement `Default`) as the module's fleet rollout
/// policy (`wit/fleet/fleet.wit`). Needs the SDK's `fleet` feature; a module may export a
/// fleet policy, node decisions ([`export_policy!`], feature `decisions`), or both.
///
/// Expands to nothing in a native build, so the crate's unit tests run with `cargo test`.
#[macro_export]
macro_rules! export_fleet {
    ($fleet:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct ExportedFleet;
            impl $crate::fleet_bindings::exports::pinset::fleet::rollout::Guest for ExportedFleet {
                fn info() -> $crate::fleet_bindings::pinset::fleet::types::PolicyInfo {
                    $crate::fleet_guest::info::<$fleet>()
                }
                fn grant(
                    request: $crate::fleet_bindings::pinset::fleet::types::RolloutRequest,
                ) -> $crate::fleet_bindings::pinset::fleet::types::RolloutGrant {
                    $crate::fleet_guest::grant::<$fleet>(request)
                }
                fn decide(
                    request: $crate::fleet_bindings::pinset::fleet::types::RolloutRequest,
                ) -> $crate::fleet_bindings::pinset::fleet::types::RolloutDecision {
                    $crate::fleet_guest::decide::<$fleet>(request)
                }
            }
            $crate::fleet_bindings::__export_rollout!(ExportedFleet with_types_in $crate::fleet_bindings);
        };
    };
}

/// Export a [`Policy`] type (which must implement `Default`) as the module's decisions.
///
/// Expands to nothing in a native build, so the crate's unit tests run with `cargo test`.
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct Exported;
            impl $crate::bindings::exports::pinset::policy::decisions::Guest for Exported {
                fn info() -> $crate::bindings::pinset::policy::types::PolicyInfo {
                    $crate::guest::info::<$policy>()
                }
                fn admit(
                    request: $crate::bindings::pinset::policy::types::AdmissionRequest,
                ) -> $crate::bindings::pinset::policy::types::Admission {
                    $crate::guest::admit::<$policy>(request)
                }
                fn order(
                    node: $crate::bindings::pinset::policy::types::NodeFacts,
                    images: $crate::bindings::pinset::policy::types::Images,
                ) -> $crate::__private::Vec<u32> {
                    $crate::guest::order::<$policy>(node, images)
                }
                fn concurrency(node: $crate::bindings::pinset::policy::types::NodeFacts) -> u32 {
                    $crate::guest::concurrency::<$policy>(node)
                }
                fn throttle(
                    node: $crate::bindings::pinset::policy::types::NodeFacts,
                    outcome: $crate::bindings::pinset::policy::types::PullOutcome,
                    pressure: $crate::bindings::pinset::policy::types::Pressure,
                ) -> u64 {
                    $crate::guest::throttle::<$policy>(node, outcome, pressure)
                }
            }
    $crate::bindings::__export_decisions!(Exported with_types_in $crate::bindings);
        };
    };
}
