//! The sandboxed WebAssembly runtime for policies (wasmtime, component model), one concern a
//! file:
//!
//! - [`engine`]: the one engine configuration, and [`WasmRuntime`] (engine, linker, the epoch
//!   ticker that enforces deadlines);
//! - [`compile`]: where a module becomes machine code — in this process, or in a child process
//!   ([`Compiler::Subprocess`]) so that the agent itself never runs the compiler;
//! - [`module`]: loading — sha256 pin and compilation once per module ([`CompiledModule`]),
//!   then per contract its version and pre-instantiation ([`PolicyModule`]);
//! - [`store`]: one store's state — the empty WASI context, the memory cap, the log budget
//!   ([`Limits`]);
//! - [`instance`]: one reconcile's instance ([`WasmPolicy`]): calls under a deadline, failures
//!   classified, the contract's types converted to and from the SDK's;
//! - [`borrowed`]: `admit` and `order` called with the images borrowed, not copied.
//!
//! The sandbox: WASI is linked (the Rust standard library imports it) with an empty context — no
//! preopened directories, environment, arguments or sockets; stdout is discarded and stderr is
//! kept (4 KiB) only to quote a panic message in the error. Each call has a deadline (epoch
//! interruption), each store a memory cap, and a policy may log at most [`MAX_LOG_LINES`] lines.

mod borrowed;
mod compile;
mod engine;
mod fleet;
mod fleet_columns;
mod instance;
mod module;
mod store;
mod wasi;

pub use compile::{COMPILE_INVALID_MODULE, COMPILE_SUBCOMMAND, Compiler, precompile};
pub use engine::{WasmRuntime, instance_strategy};
pub use fleet::{FLEET_CONTRACT, FleetModule, WasmFleet};
pub use instance::{MAX_REASON_BYTES, WasmPolicy};
pub use module::{CONTRACT, CompiledModule, PolicyModule};
pub use store::{Limits, MAX_LOG_BYTES, MAX_LOG_LINE_BYTES, MAX_LOG_LINES, STDERR_CAPTURE_BYTES};
pub use wasi::NO_WAITING;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "policy",
    });
}

/// The fleet contract (`wit/fleet/fleet.wit`), its own package and version.
mod fleet_bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/fleet",
        world: "fleet-policy",
    });
}

use bindings::pinset::policy::types as wit;

/// Cut `text` to at most `max` bytes on a character boundary, marking the cut with `…`.
fn shorten(text: &mut String, max: usize) {
    if text.len() > max {
        text.truncate(text.floor_char_boundary(max));
        text.push('…');
    }
}

/// A string from a policy as pinset passes it on: control characters escaped (a newline cannot
/// start a line of its own in a log or a status), at most `max` bytes (cut marked with `…`).
pub fn bounded(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 4);
    for c in text.chars() {
        if out.len() > max {
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    shorten(&mut out, max);
    out
}

#[cfg(test)]
mod tests {
    use super::bounded;

    #[test]
    fn strings_from_a_policy_are_escaped_and_cut() {
        assert_eq!(bounded("plain", 10), "plain");
        assert_eq!(
            bounded("a\nINFO pinset: forged\r\u{1b}[31m", 100),
            "a\\nINFO pinset: forged\\r\\u{1b}[31m"
        );
        let long = "é".repeat(10_000);
        let cut = bounded(&long, 4096);
        assert!(cut.len() <= 4096 + '…'.len_utf8(), "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(bounded(&"x".repeat(4096), 4096), "x".repeat(4096));
    }
}
