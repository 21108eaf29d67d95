//! Where a module becomes machine code: in this process, or in a child process that hands back
//! wasmtime's artifact.

use super::engine::{WasmRuntime, engine_config};
use super::shorten;
use crate::LoadError;
use pinset_core::input::{self, Limit};

/// A compiled module in the cache: native code, a few times its module's size (16 MiB at most
/// by default). One over it is compiled again.
const COMPILED: Limit = Limit::new("a compiled policy module", 256 << 20);
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

/// Write `component`'s artifact and its sha256 beside it, each through a temporary file.
fn store_compiled(path: &Path, component: &Component) -> std::io::Result<()> {
    use sha2::Digest;
    let dir = path.parent().expect("a cache file has a directory");
    std::fs::create_dir_all(dir)?;
    let artifact = component.serialize().map_err(std::io::Error::other)?;
    let sum = super::module::hex(&sha2::Sha256::digest(&artifact));
    for (file, bytes) in [
        (path.with_extension("sha256"), sum.as_bytes()),
        (path.to_path_buf(), &artifact[..]),
    ] {
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.write_all(bytes)?;
        tmp.persist(&file).map_err(|e| e.error)?;
    }
    Ok(())
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
    /// `bytes` compiled: from the compiled cache when it holds them for this engine, else by
    /// the compiler (and then kept in the cache).
    pub(super) fn compile(&self, name: &str, bytes: &[u8]) -> Result<Component, LoadError> {
        let Some(cached) = self
            .compiled_cache
            .as_ref()
            .map(|dir| self.cache_path(dir, bytes))
        else {
            return self.compile_now(name, bytes);
        };
        if let Some(component) = self.load_compiled(&cached) {
            return Ok(component);
        }
        let component = self.compile_now(name, bytes)?;
        if let Err(e) = store_compiled(&cached, &component) {
            tracing::warn!(module = name, path = %cached.display(), error = %e, "cannot keep the compiled module");
        }
        Ok(component)
    }

    /// `<dir>/<module sha256>-<engine hash>.cwasm`.
    fn cache_path(&self, dir: &Path, bytes: &[u8]) -> PathBuf {
        use sha2::Digest;
        use std::hash::{Hash, Hasher};
        let mut engine = std::hash::DefaultHasher::new();
        self.engine
            .precompile_compatibility_hash()
            .hash(&mut engine);
        let module = super::module::hex(&sha2::Sha256::digest(bytes));
        dir.join(format!("{module}-{:016x}.cwasm", engine.finish()))
    }

    /// A compiled module from the cache, when its bytes are whole (their sha256 beside them)
    /// and this engine takes them; anything else is removed.
    fn load_compiled(&self, path: &Path) -> Option<Component> {
        use sha2::Digest;
        let artifact = input::bytes(path, COMPILED).ok()?;
        let sum = input::text(&path.with_extension("sha256"), input::CONFIG).ok();
        let whole = sum.as_deref().map(str::trim)
            == Some(&super::module::hex(&sha2::Sha256::digest(&artifact)));
        // SAFETY: `deserialize` trusts its input to be an artifact wasmtime produced. This one
        // was, by this runtime's compiler, written by it to a directory only it writes (the
        // node's policy cache), and its sha256 shows it is the same bytes; wasmtime still
        // refuses an artifact of another version or configuration.
        let loaded = whole.then(|| unsafe { Component::deserialize(&self.engine, &artifact) });
        match loaded {
            Some(Ok(component)) => Some(component),
            _ => {
                tracing::warn!(path = %path.display(), "compiled module damaged or foreign: compiling again");
                let _ = std::fs::remove_file(path);
                None
            }
        }
    }

    fn compile_now(&self, name: &str, bytes: &[u8]) -> Result<Component, LoadError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EMBEDDED_DEFAULT, Limits};

    #[test]
    fn a_compiled_module_is_kept_and_a_damaged_one_compiled_again() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let compile = || {
            let runtime = WasmRuntime::new()
                .unwrap()
                .with_compiled_cache(dir.path().to_path_buf());
            runtime.compile_module("default", EMBEDDED_DEFAULT, None, Limits::default())
        };
        compile().unwrap();
        let kept: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        let inode = || std::fs::metadata(&kept[0]).unwrap().ino();
        // Another runtime (another process, the same engine) loads it: a compiled module would
        // have been written again, through a new file.
        let written = inode();
        compile().unwrap();
        assert_eq!(inode(), written, "loaded, not compiled again");

        let mut artifact = std::fs::read(&kept[0]).unwrap();
        let at = artifact.len() / 2;
        artifact[at] ^= 0xff;
        std::fs::write(&kept[0], &artifact).unwrap();
        compile().unwrap();
        assert_ne!(
            std::fs::read(&kept[0]).unwrap(),
            artifact,
            "a damaged artifact is compiled again"
        );
        let rewritten = inode();
        compile().unwrap();
        assert_eq!(inode(), rewritten, "and the new one kept");
    }
}
