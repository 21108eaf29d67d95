//! The sandboxed WebAssembly runtime for policies (wasmtime, component model), one concern a
//! file. Every contract a module may export goes through the same path: loading, instances,
//! deadlines, memory cap and failures are written once, over [`Contract`].
//!
//! - [`contract`]: what describes a contract ([`Contract`]: interface and version, role, where
//!   its functions are), version compatibility, export lookup;
//! - [`engine`]: the one engine configuration, and [`WasmRuntime`] (engine, linker, the epoch
//!   ticker that enforces deadlines);
//! - [`compile`]: where a module becomes machine code — in this process, or in a child process
//!   ([`Compiler::Subprocess`]) so that the agent itself never runs the compiler;
//! - [`child`]: both sides of that child, bounded in time and memory ([`ChildCompiler`]);
//! - [`module`]: loading — size, sha256 pin and compilation once per module
//!   ([`CompiledModule`]), then bound to a contract ([`Module`]);
//! - [`store`]: one store's state — the empty WASI context, the memory cap, the log budget
//!   ([`Limits`]);
//! - [`wasi`]: the WASI a policy gets: synchronous bounded stdout/stderr, every wait a trap;
//! - [`instance`]: one instance of any contract ([`WasmInstance`]): calls under a deadline,
//!   failures classified, `info`;
//! - [`node`]: the node contract — its exports, and `admit`, `order`, `concurrency`,
//!   `throttle` called with the caller's values borrowed;
//! - [`fleet`], [`fleet_columns`]: the fleet contract — its exports, and `grant` called with the
//!   rollout's columns borrowed.
//!
//! May depend on wasmtime, wasmtime-wasi, the SDK's types and the crate's error types; nothing
//! here decides what to do with an answer (that is `validate` and the guards).
//!
mod child;
mod compile;
mod contract;
mod engine;
mod fleet;
mod fleet_columns;
mod instance;
mod module;
mod node;
mod store;
mod wasi;

pub use child::{
    COMPILE_INVALID_MODULE, COMPILE_SUBCOMMAND, ChildCompiler, MEMORY_FLAG, bound_memory,
    precompile,
};
pub use compile::Compiler;
pub use contract::{CONTRACTS, Contract, FleetContract, NodeContract, Role};
pub use engine::{WasmRuntime, instance_strategy};
pub use fleet::FLEET_CONTRACT;
pub use instance::{MAX_REASON_BYTES, WasmInstance};
pub use module::{CONTRACT, CompiledModule, FleetModule, Module, PolicyModule};
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

/// Characters that start a line, or reorder what a reader sees of one: control characters
/// (newline, carriage return, escape), the Unicode line and paragraph separators, and the
/// bidirectional embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069), which can
/// make a reason read as another.
fn forges_a_line(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A string from a policy as pinset passes it on: characters that could forge or disguise a line
/// escaped ([`forges_a_line`]: a newline cannot start a line of its own in a log or a status), at
/// most `max` bytes (cut marked with `…`).
pub fn bounded(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 4);
    for c in text.chars() {
        if out.len() > max {
            break;
        }
        if forges_a_line(c) {
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
        assert_eq!(
            bounded("ok\u{2028}INFO forged\u{2029}x", 100),
            "ok\\u{2028}INFO forged\\u{2029}x"
        );
        // Bidirectional overrides and isolates: `evil\u{202e}txt.exe` shows as `evilexe.txt`.
        for c in [
            '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}', '\u{2069}',
        ] {
            let escaped = bounded(&format!("a{c}b"), 100);
            assert_eq!(escaped, format!("a{}b", c.escape_default()), "{c:?}");
        }
        assert_eq!(bounded("née → 東京", 100), "née → 東京", "other text stays");
        let long = "é".repeat(10_000);
        let cut = bounded(&long, 4096);
        assert!(cut.len() <= 4096 + '…'.len_utf8(), "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(bounded(&"x".repeat(4096), 4096), "x".repeat(4096));
    }
}
