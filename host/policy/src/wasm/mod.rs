//! The sandboxed WebAssembly runtime for policies (wasmtime, component model), one concern a
//! file:
//!
//! - [`engine`]: the one engine configuration, and [`WasmRuntime`] (engine, linker, the epoch
//!   ticker that enforces deadlines);
//! - [`compile`]: where a module becomes machine code — in this process, or in a child process
//!   ([`Compiler::Subprocess`]) so that the agent itself never runs the compiler;
//! - [`module`]: loading — sha256 pin, contract version, pre-instantiation ([`PolicyModule`]);
//! - [`store`]: one store's state — the empty WASI context, the memory cap, the log budget
//!   ([`Limits`]);
//! - [`instance`]: one reconcile's instance ([`WasmPolicy`]): calls under a deadline, failures
//!   classified, the contract's types converted to and from the SDK's.
//!
//! The sandbox: WASI is linked (the Rust standard library imports it) with an empty context — no
//! preopened directories, environment, arguments or sockets; stdout is discarded and stderr is
//! kept (4 KiB) only to quote a panic message in the error. Each call has a deadline (epoch
//! interruption), each store a memory cap, and a policy may log at most [`MAX_LOG_LINES`] lines.

mod compile;
mod engine;
mod instance;
mod module;
mod store;

pub use compile::{COMPILE_INVALID_MODULE, COMPILE_SUBCOMMAND, Compiler, precompile};
pub use engine::WasmRuntime;
pub use instance::WasmPolicy;
pub use module::{CONTRACT, PolicyModule};
pub use store::{Limits, MAX_LOG_LINES};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "policy",
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
