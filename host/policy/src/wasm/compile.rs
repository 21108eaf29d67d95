//! Where a module becomes machine code: in this process, or in a child process that hands back
//! wasmtime's artifact.

use super::engine::{WasmRuntime, engine_config};
use super::shorten;
use crate::LoadError;
use std::io::Write;
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where policy modules are compiled to machine code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Compiler {
    /// In this process: short-lived commands and tests.
    #[default]
    InProcess,
    /// In a child process: `EXE compile-policy` reads the module on stdin and writes wasmtime's
    /// artifact on stdout, which this process loads. A long-running process then never runs the
    /// compiler: its code pages, threads and memory stay out of the process (20 MiB of the
    /// agent's idle RSS, see BENCHMARKS.md), and a compiler crash cannot take the agent down.
    Subprocess(PathBuf),
}

/// The name of the (hidden) subcommand that [`Compiler::Subprocess`] runs.
pub const COMPILE_SUBCOMMAND: &str = "compile-policy";
/// Its exit status when the module is not a valid component (sysexits' `EX_DATAERR`); any other
/// failure is the child's, not the module's.
pub const COMPILE_INVALID_MODULE: u8 = 65;
/// How much of the child's stderr an error quotes.
const MAX_CHILD_MESSAGE: usize = 2048;

/// The child's side of [`Compiler::Subprocess`]: compile the component in `bytes` to an
/// artifact for an engine of [`engine_config`]. The error is the compiler's message.
pub fn precompile(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let engine = Engine::new(&engine_config()).map_err(|e| format!("wasm engine: {e:#}"))?;
    engine
        .precompile_component(bytes)
        .map_err(|e| format!("{e:#}"))
}

/// Run `exe compile-policy` on `bytes`. `Ok(Err(message))`: the module is not a valid component
/// (the child exits with [`COMPILE_INVALID_MODULE`] and says why on stderr); `Err`: the child
/// could not do its job.
fn compile_in_child(exe: &Path, bytes: &[u8]) -> Result<Result<Vec<u8>, String>, String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(exe)
        .arg(COMPILE_SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    // The module goes in on its own thread while the output is read, so that neither side
    // waits on a full pipe; a child that stops reading (it failed) shows in its exit status.
    let stdin = child.stdin.take();
    let output = std::thread::scope(|scope| {
        if let Some(mut stdin) = stdin {
            scope.spawn(move || {
                let _ = stdin.write_all(bytes);
            });
        }
        child.wait_with_output()
    })
    .map_err(|e| format!("waiting for it: {e}"))?;
    let (status, artifact) = (output.status, output.stdout);
    let mut message = String::from_utf8_lossy(&output.stderr).trim().to_string();
    shorten(&mut message, MAX_CHILD_MESSAGE);
    match status.code() {
        Some(0) => Ok(Ok(artifact)),
        Some(code) if code == i32::from(COMPILE_INVALID_MODULE) => Ok(Err(message)),
        _ if message.is_empty() => Err(format!("it ended with {status}")),
        _ => Err(format!("it ended with {status}: {message}")),
    }
}

impl WasmRuntime {
    pub(super) fn compile(&self, name: &str, bytes: &[u8]) -> Result<Component, LoadError> {
        let invalid = |cause: String| LoadError::Compile {
            module: name.into(),
            cause,
        };
        let exe = match &self.compiler {
            Compiler::InProcess => {
                return Component::new(&self.engine, bytes).map_err(|e| invalid(format!("{e:#}")));
            }
            Compiler::Subprocess(exe) => exe,
        };
        let failed = |cause: String| LoadError::Compiler {
            module: name.into(),
            exe: exe.clone(),
            cause,
        };
        let artifact = compile_in_child(exe, bytes)
            .map_err(failed)?
            .map_err(invalid)?;
        // SAFETY: `deserialize` trusts its input to be an artifact wasmtime produced. This one
        // was: our own executable compiled it with `precompile` just now and handed it over
        // through a pipe only we hold. wasmtime still checks that its version and engine
        // configuration match ours and refuses it otherwise.
        unsafe { Component::deserialize(&self.engine, &artifact) }
            .map_err(|e| failed(format!("its artifact does not load: {e:#}")))
    }
}
