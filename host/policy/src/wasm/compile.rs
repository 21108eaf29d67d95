//! Where a module becomes machine code: in this process, or in a child process that hands back
//! wasmtime's artifact.

use super::child::{ChildCompiler, Refused};
use super::engine::WasmRuntime;
use crate::LoadError;
use pinset_core::input::{self, Limit};
use std::io::Write;
use std::path::{Path, PathBuf};
use wasmtime::component::Component;

/// A compiled module: native code, a few times its module's size (16 MiB at most by default).
/// One over it in the cache is compiled again; a child's over it is refused.
pub(super) const COMPILED: Limit = Limit::new("a compiled policy module", 256 << 20);

/// Where policy modules are compiled to machine code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Compiler {
    /// In this process: short-lived commands and tests.
    #[default]
    InProcess,
    /// In a child process: `EXE compile-policy` reads the module on stdin and writes wasmtime's
    /// artifact on stdout, which this process loads. A long-running process then never runs the
    /// compiler: its code pages, threads and memory stay out of the process (20 MiB of the
    /// agent's idle RSS, see BENCHMARKS.md), a compiler crash cannot take the agent down, and
    /// the compile is bounded in time and memory ([`ChildCompiler`]).
    Subprocess(ChildCompiler),
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
        let child = match &self.compiler {
            Compiler::InProcess => {
                return Component::new(&self.engine, bytes).map_err(|e| invalid(format!("{e:#}")));
            }
            Compiler::Subprocess(child) => child,
        };
        let failed = |cause: String| LoadError::Compiler {
            module: name.into(),
            exe: child.exe.clone(),
            cause,
        };
        let artifact = match child.compile(bytes).map_err(failed)? {
            Ok(artifact) => artifact,
            Err(Refused::Invalid(cause)) => return Err(invalid(cause)),
            Err(Refused::TooCostly(cause)) => {
                return Err(LoadError::TooCostly {
                    module: name.into(),
                    cause,
                });
            }
        };
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
