//! The subcommands. `main.rs` only parses arguments and calls into these.

pub mod bench;
pub mod demo;
pub mod kube;
pub mod node;
pub mod policy;

use crate::policy::{Limits, PolicyModule, WasmRuntime};
use anyhow::Context;
use std::path::PathBuf;
use std::time::Duration;

/// Which policy module to use, shared by every subcommand that takes decisions.
#[derive(clap::Args, Clone, Debug)]
pub struct PolicyOpts {
    /// A policy module (WebAssembly component); default: the embedded default policy.
    #[arg(long, value_name = "FILE.wasm")]
    pub policy: Option<PathBuf>,
    /// Refuse the module unless its sha256 is this (64 hex digits).
    #[arg(long, value_name = "HEX", requires = "policy")]
    pub policy_sha256: Option<String>,
    /// Deadline of one policy call, in milliseconds.
    #[arg(long, default_value_t = 100, value_name = "MS")]
    pub policy_deadline_ms: u64,
    /// Memory cap of a policy instance, in MiB.
    #[arg(long, default_value_t = 32, value_name = "MIB")]
    pub policy_memory_mib: usize,
}

impl PolicyOpts {
    pub fn limits(&self) -> Limits {
        Limits {
            deadline: Duration::from_millis(self.policy_deadline_ms),
            memory_bytes: self.policy_memory_mib << 20,
        }
    }

    /// Compile and check the chosen module.
    pub fn load(&self, runtime: &WasmRuntime) -> anyhow::Result<PolicyModule> {
        let module = match &self.policy {
            Some(path) => runtime.load_file(path, self.policy_sha256.as_deref(), self.limits())?,
            None => runtime.load(
                crate::policy::EMBEDDED_DEFAULT_NAME,
                crate::policy::EMBEDDED_DEFAULT,
                None,
                self.limits(),
            )?,
        };
        Ok(module)
    }
}

/// A runtime and the chosen module, or a clear error.
pub fn load_policy(opts: &PolicyOpts) -> anyhow::Result<(WasmRuntime, PolicyModule)> {
    let runtime = WasmRuntime::new().context("starting the Wasm runtime")?;
    let module = opts.load(&runtime)?;
    Ok((runtime, module))
}

/// Logs go to stderr so that command output on stdout stays clean.
pub fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
