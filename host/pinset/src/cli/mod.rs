//! The subcommands. `main.rs` only parses arguments and calls into these.

pub mod bench;
pub mod demo;
pub mod kube;
pub mod logging;
pub mod node;
pub mod plan;
pub mod policy;
pub mod policy_bench;
pub mod policy_oci;
pub mod reference;
pub mod report;
pub mod rollout;
pub mod scaffold;
pub mod set;
pub mod simulate;
pub mod sources;
pub mod terminal;

use anyhow::Context;
use pinset_core::input;
use pinset_k8s::policy_config::ModuleRef;
use pinset_k8s::policy_loader::Loader;
use pinset_policy::{ChildCompiler, CompiledModule, Compiler, Limits, PolicyModule, WasmRuntime};
use std::path::PathBuf;
use std::time::Duration;

/// Which policy module to use, shared by every subcommand that takes decisions.
#[derive(clap::Args, Clone, Debug)]
pub struct PolicyOpts {
    /// A policy module (WebAssembly component): a file, or an OCI artifact pinned by digest
    /// (`oci://REGISTRY/REPOSITORY@sha256:HEX`). Default: the embedded default policy.
    #[arg(long, value_name = "FILE.wasm|oci://REF")]
    pub policy: Option<String>,
    /// Refuse the module unless its sha256 is this (64 hex digits).
    #[arg(long, value_name = "HEX", requires = "policy")]
    pub policy_sha256: Option<String>,
    /// Deadline of one policy call, in milliseconds.
    #[arg(long, default_value_t = 100, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub policy_deadline_ms: u64,
    /// Memory cap of a policy instance (all its memories together), in MiB.
    #[arg(long, default_value_t = 32, value_name = "MIB",
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub policy_memory_mib: u64,
    #[command(flatten)]
    pub fetch: FetchOpts,
    /// Largest policy module accepted, in MiB.
    #[arg(long, default_value_t = 16, value_name = "MIB",
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub policy_max_module_mib: u64,
}

/// The bounds of a compile in a child process: the long-running commands' (the agent, the
/// controller, `pinset node --watch`), which never run the compiler themselves.
#[derive(clap::Args, Clone, Debug)]
pub struct CompileOpts {
    /// The most time one policy module's compile may take, in seconds, where it runs in a child
    /// process (the agent, the controller, `node --watch`). The child is killed then and the
    /// module refused as too costly to compile (a policy of a few hundred KiB takes 0.2 s).
    #[arg(long, default_value_t = ChildCompiler::DEADLINE.as_secs(), value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub policy_compile_seconds: u64,
    /// The most memory one policy module's compile may allocate, in MiB, the compiler's
    /// included (a policy of a few hundred KiB takes 30). Past it the module is refused as too
    /// costly to compile. The child runs in the agent's pod, under its memory limit: raise both
    /// together.
    #[arg(long, default_value_t = ChildCompiler::MEMORY_BYTES >> 20, value_name = "MIB",
          value_parser = clap::value_parser!(u64).range(16..=65536))]
    pub policy_compile_memory_mib: u64,
}

/// How `oci://` policy modules are fetched and verified.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct FetchOpts {
    /// Require the module's cosign signature by this public key (`cosign.pub`); repeatable, one
    /// key verifying is enough. Only an `oci://` module can carry a signature.
    #[arg(long, value_name = "FILE.pub")]
    pub policy_verify_key: Vec<PathBuf>,
    /// Keep fetched `oci://` modules here, by digest, and start from them when the registry
    /// cannot be reached; compiled modules too (`compiled/`, by module digest and engine).
    #[arg(long, value_name = "DIR")]
    pub policy_cache: Option<PathBuf>,
    /// The most the policy cache keeps besides the modules in use (the running one and the one
    /// before it, whatever their size), in MiB: the least recently used go first. The agent
    /// prunes it at start and after each swap.
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub policy_cache_max_mib: u64,
    #[command(flatten)]
    pub policy_registry: RegistryOpts,
}

impl FetchOpts {
    /// A Wasm runtime compiling with `compiler`, its compiled modules kept in the policy cache
    /// (`compiled/`) when there is one.
    pub fn runtime(&self, compiler: Compiler) -> anyhow::Result<WasmRuntime> {
        let runtime = WasmRuntime::with_compiler(compiler).context("starting the Wasm runtime")?;
        Ok(match &self.policy_cache {
            Some(dir) => runtime.with_compiled_cache(dir.join("compiled")),
            None => runtime,
        })
    }

    /// How modules named by `oci://` are fetched: from this registry, through this cache, no
    /// larger than `max_bytes`.
    pub fn fetcher(
        &self,
        max_bytes: u64,
    ) -> anyhow::Result<pinset_registry::policy_source::Fetcher> {
        Ok(pinset_registry::policy_source::Fetcher {
            artifacts: self.policy_registry.artifacts()?,
            cache: self.policy_cache.clone(),
            max_bytes,
        })
    }

    /// What loads the modules this command names, through the same path as the agent's and
    /// the controller's ([`pinset_k8s::policy_loader::Loader`]).
    pub fn loader(&self, runtime: &WasmRuntime, limits: Limits) -> anyhow::Result<Loader> {
        Ok(Loader {
            runtime: runtime.clone(),
            limits,
            fetcher: self.fetcher(limits.max_module_bytes as u64)?,
            cache_max_bytes: self.policy_cache_max_mib << 20,
        })
    }

    /// The keys a module's signature must verify with (`--policy-verify-key`).
    pub fn keys(&self) -> anyhow::Result<Vec<pinset_registry::signature::VerifyingKey>> {
        verifying_keys(&self.policy_verify_key)
    }
}

/// How pinset reaches a registry for policy artifacts.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RegistryOpts {
    /// Registry credentials for policy artifacts (a `config.json`, as for images); default: the
    /// registries file's `auth`.
    #[arg(long, value_name = "FILE")]
    pub policy_auth: Option<PathBuf>,
    /// Another name for `--insecure-registry`, which covers policies too; repeatable.
    #[arg(long, value_name = "HOST")]
    pub policy_insecure_registry: Vec<String>,
}

impl RegistryOpts {
    pub fn artifacts(&self) -> anyhow::Result<pinset_registry::artifact::Artifacts> {
        let sources = sources::get();
        let credentials = sources::credentials(self.policy_auth.as_deref())?;
        Ok(pinset_registry::artifact::Artifacts::new(
            sources.insecure(&self.policy_insecure_registry),
            credentials,
        ))
    }
}

/// The public keys of `paths` (`cosign.pub`), each error naming its file.
pub fn verifying_keys(
    paths: &[PathBuf],
) -> anyhow::Result<Vec<pinset_registry::signature::VerifyingKey>> {
    paths
        .iter()
        .map(|path| {
            let text = input::text(path, input::CONFIG)
                .with_context(|| format!("reading {}", path.display()))?;
            pinset_registry::signature::VerifyingKey::from_pem(&text)
                .with_context(|| format!("public key {}", path.display()))
        })
        .collect()
}

impl PolicyOpts {
    pub fn limits(&self) -> Limits {
        Limits {
            deadline: Duration::from_millis(self.policy_deadline_ms),
            memory_bytes: (self.policy_memory_mib as usize) << 20,
            max_module_bytes: (self.policy_max_module_mib as usize) << 20,
        }
    }

    /// Compile and check the chosen module's node decisions (`pinset:policy/decisions`).
    pub fn load(&self, runtime: &WasmRuntime) -> anyhow::Result<PolicyModule> {
        Ok(runtime.bind::<pinset_policy::NodeContract>(&self.compile(runtime)?)?)
    }

    /// Check and compile the chosen module (the embedded default when none is given), for
    /// whichever contracts it is then loaded as. A file over the size limit is not read; an
    /// artifact comes through the registry and the cache, its signature checked when keys are
    /// given.
    pub fn compile(&self, runtime: &WasmRuntime) -> anyhow::Result<CompiledModule> {
        let Some(source) = &self.policy else {
            let name = pinset_policy::EMBEDDED_DEFAULT_NAME;
            let embedded = pinset_policy::EMBEDDED_DEFAULT;
            return Ok(runtime.compile_module(name, embedded, None, self.limits())?);
        };
        let m = ModuleRef {
            module: source.clone(),
            sha256: self.policy_sha256.clone(),
            verify: None,
        };
        let loader = self.fetch.loader(runtime, self.limits())?;
        let keys = self.fetch.keys()?;
        let fetched = loader
            .fetch_blocking(&m, &keys)
            .map_err(|(_, why)| anyhow::anyhow!(why))?;
        Ok(loader.compile(&m, &fetched)?)
    }

    /// The module as reports name it before it is loaded.
    pub fn name(&self) -> String {
        self.policy
            .clone()
            .unwrap_or_else(|| pinset_policy::EMBEDDED_DEFAULT_NAME.to_string())
    }
}

/// A runtime that compiles in this process and the chosen module, or a clear error.
pub fn load_policy(opts: &PolicyOpts) -> anyhow::Result<(WasmRuntime, PolicyModule)> {
    load_policy_with(opts, Compiler::InProcess)
}

pub fn load_policy_with(
    opts: &PolicyOpts,
    compiler: Compiler,
) -> anyhow::Result<(WasmRuntime, PolicyModule)> {
    let runtime = opts.fetch.runtime(compiler)?;
    let module = opts.load(&runtime)?;
    Ok((runtime, module))
}

/// The compiler of long-running processes: this executable, as a child process (see
/// [`Compiler::Subprocess`]). On Linux through `/proc/self/exe`, which still works after the
/// file was replaced by an upgrade; bounded by the `--policy-compile-*` flags.
pub fn child_compiler(bounds: &CompileOpts) -> anyhow::Result<Compiler> {
    let exe = match cfg!(target_os = "linux") {
        true => PathBuf::from("/proc/self/exe"),
        false => std::env::current_exe().context("finding this executable")?,
    };
    Ok(Compiler::Subprocess(ChildCompiler {
        exe,
        deadline: Duration::from_secs(bounds.policy_compile_seconds),
        memory_bytes: bounds.policy_compile_memory_mib << 20,
    }))
}

/// Draw `t` into `path` (SVG) and the same data into `path`'s `.trace.json` (Chrome trace
/// format); the trace's path.
pub fn write_timeline(
    path: &std::path::Path,
    t: &pinset_core::timeline::Timeline,
) -> anyhow::Result<PathBuf> {
    use pinset_core::timeline;
    std::fs::write(path, timeline::svg(t))
        .with_context(|| format!("writing {}", path.display()))?;
    let trace = path.with_extension("trace.json");
    let json = serde_json::to_string(&timeline::chrome_trace(t))?;
    std::fs::write(&trace, json).with_context(|| format!("writing {}", trace.display()))?;
    Ok(trace)
}

/// The same warning in every command when inputs hold nothing to work on:
/// `warning: --sets examples/empty: no PinnedImageSet found`.
pub fn warn_if_empty(flag: &str, paths: &[std::path::PathBuf], found: usize, kind: &str) {
    if found == 0 {
        let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        tracing::warn!("{flag} {}: no {kind} found", paths.join(" "));
    }
}

/// The text of `path`, or of standard input for `-`; a failure names the input, after `flag`
/// when the input is a flag's (`--file -: standard input`).
pub fn read_input(path: &std::path::Path, flag: Option<&str>) -> anyhow::Result<String> {
    let prefix = flag.map_or(String::new(), |f| format!("{f} "));
    if path.as_os_str() == "-" {
        input::stdin_text(input::OBJECTS).with_context(|| format!("{prefix}-: standard input"))
    } else {
        input::text(path, input::OBJECTS).with_context(|| format!("{prefix}{}", path.display()))
    }
}

/// `1 pulling, 2 failed`: each count that is not zero, with what it counts.
pub fn nonzero(counts: &[(u32, &str)]) -> Vec<String> {
    counts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect()
}

/// An error and its causes on one line, each said once: a cause whose text a message already
/// quotes (`"… : {source}"`) is not repeated after it.
pub fn error_line(e: &anyhow::Error) -> String {
    // Refused for lack of rights: who may not do what, and where it is granted.
    if let Some(why) = e.chain().find_map(pinset_k8s::forbidden::refusal) {
        return why;
    }
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {path}: {source}")]
    struct Quoting {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "No such file (os error 2)");
        let quoted = anyhow::Error::new(Quoting {
            path: "/a",
            source: io(),
        })
        .context("--auth");
        assert_eq!(
            error_line(&quoted),
            "--auth: reading /a: No such file (os error 2)"
        );
        let plain = anyhow::Error::new(io()).context("reading /b");
        assert_eq!(error_line(&plain), "reading /b: No such file (os error 2)");
    }
}
