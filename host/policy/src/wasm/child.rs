//! Compiling a module in a child process, bounded in time and memory: both sides of
//! [`Compiler::Subprocess`](super::Compiler::Subprocess).
//!
//! A module is hostile until proven otherwise, its compilation included: a 5 MB module of one
//! function that pushes a million values takes Cranelift 10 s and 1.1 GB (measured; a policy of
//! this workspace, 0.2 s and 30 MB). Unbounded, such a module would hold a policy swap and push
//! the agent's pod past its memory limit. So the child runs under a memory bound it sets on
//! itself before reading the module (`RLIMIT_DATA`: its heap and the compiler's), and the parent
//! kills it at a deadline; either refuses the module as too costly to compile, naming the bound
//! and its flag. Everything the child writes is read while it runs, the artifact within
//! [`COMPILED`](super::compile) and its stderr kept in part.

use super::engine::engine_config;
use super::shorten;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use wasmtime::{Engine, InstanceAllocationStrategy};

/// The name of the (hidden) subcommand that a [`ChildCompiler`] runs.
pub const COMPILE_SUBCOMMAND: &str = "compile-policy";
/// Its exit status when the module is not a valid component (sysexits' `EX_DATAERR`); any other
/// failure is the child's, not the module's.
pub const COMPILE_INVALID_MODULE: u8 = 65;
/// The (long) flag of [`COMPILE_SUBCOMMAND`] that carries the memory bound, in bytes.
pub const MEMORY_FLAG: &str = "memory-bytes";
/// How much of the child's stderr is kept (the rest is read and dropped).
const KEPT_STDERR: u64 = 64 << 10;
/// How much of the child's stderr an error quotes.
const MAX_CHILD_MESSAGE: usize = 2048;
/// Rust's words when an allocation fails (then it aborts): the child met its memory bound.
const ALLOCATION_FAILED: &str = "memory allocation of ";

/// `EXE compile-policy`, and the bounds it runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildCompiler {
    /// This executable (`/proc/self/exe` on Linux).
    pub exe: PathBuf,
    /// Wall-clock time the child may take; it is killed then (`--policy-compile-seconds`).
    pub deadline: Duration,
    /// What the child may allocate, the compiler's memory included (`RLIMIT_DATA`,
    /// `--policy-compile-memory-mib`). It shares the agent's pod and its memory limit.
    pub memory_bytes: u64,
}

impl ChildCompiler {
    /// Default deadline: 300 times what a policy of this workspace takes (0.2 s).
    pub const DEADLINE: Duration = Duration::from_secs(60);
    /// Default memory bound: six times what a policy of this workspace takes (30 MiB), and
    /// within the agent's pod limit (256 MiB) beside the agent (30 MiB).
    pub const MEMORY_BYTES: u64 = 192 << 20;

    /// `exe` under the default bounds.
    pub fn new(exe: impl Into<PathBuf>) -> Self {
        ChildCompiler {
            exe: exe.into(),
            deadline: Self::DEADLINE,
            memory_bytes: Self::MEMORY_BYTES,
        }
    }
}

/// Why the child gave no artifact, when it is the module's doing.
pub(super) enum Refused {
    /// Not a valid component: the compiler's words.
    Invalid(String),
    /// Past a bound: which, and its flag.
    TooCostly(String),
}

/// The child's side: bound this process's memory to `bytes` before the module is read.
pub fn bound_memory(bytes: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit reads the struct it is given and changes this process's limit only.
    if unsafe { libc::setrlimit(libc::RLIMIT_DATA, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The child's side: compile the component in `bytes` to an artifact that loads into an engine
/// of [`engine_config`]. Its engine allocates instances on demand: the pool's reservations
/// (gigabytes of address space, never used to compile) would count against the memory bound,
/// and the allocation strategy is not part of an artifact's compatibility. The error is the
/// compiler's message.
pub fn precompile(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut config = engine_config();
    config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
    let engine = Engine::new(&config).map_err(|e| format!("wasm engine: {e:#}"))?;
    engine
        .precompile_component(bytes)
        .map_err(|e| format!("{e:#}"))
}

impl ChildCompiler {
    /// The parent's side: run the child on `bytes`. `Ok(Err(_))`: the module's doing (not a
    /// component, or past a bound); `Err`: the child could not do its job.
    pub(super) fn compile(&self, bytes: &[u8]) -> Result<Result<Vec<u8>, Refused>, String> {
        let mut child = Command::new(&self.exe)
            .arg(COMPILE_SUBCOMMAND)
            .arg(format!("--{MEMORY_FLAG}={}", self.memory_bytes))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start it: {e}"))?;
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        // The module goes in and the output comes out on threads of their own while the child is
        // watched, so that neither side waits on a full pipe and the deadline holds throughout.
        let (status, artifact, message) = std::thread::scope(|scope| {
            if let Some(mut stdin) = stdin {
                scope.spawn(move || {
                    let _ = stdin.write_all(bytes);
                });
            }
            let artifact = scope.spawn(move || kept(stdout, super::compile::COMPILED.max_bytes));
            let message = scope.spawn(move || kept(stderr, KEPT_STDERR));
            let status = wait_within(&mut child, self.deadline);
            let joined = |h: std::thread::ScopedJoinHandle<'_, _>| h.join().unwrap_or_default();
            (status, joined(artifact), joined(message))
        });
        let status = status.map_err(|e| format!("waiting for it: {e}"))?;
        let mut message = String::from_utf8_lossy(&message.0).trim().to_string();
        shorten(&mut message, MAX_CHILD_MESSAGE);
        self.verdict(status, artifact, message)
    }

    /// What the child's end says: its status (`None`: killed at the deadline), its output (and
    /// whether it was cut), its words.
    fn verdict(
        &self,
        status: Option<ExitStatus>,
        (artifact, cut): (Vec<u8>, bool),
        message: String,
    ) -> Result<Result<Vec<u8>, Refused>, String> {
        use std::os::unix::process::ExitStatusExt;
        let costly = |what: String| Ok(Err(Refused::TooCostly(what)));
        let Some(status) = status else {
            let secs = self.deadline.as_secs_f64();
            return costly(format!(
                "compiling it took longer than {secs} s (--policy-compile-seconds)"
            ));
        };
        match status.code() {
            Some(0) if cut => costly(format!(
                "its compiled code is larger than {} MiB",
                super::compile::COMPILED.max_bytes >> 20
            )),
            Some(0) => Ok(Ok(artifact)),
            Some(code) if code == i32::from(COMPILE_INVALID_MODULE) => {
                Ok(Err(Refused::Invalid(message)))
            }
            None if status.signal() == Some(libc::SIGABRT)
                && message.contains(ALLOCATION_FAILED) =>
            {
                costly(format!(
                    "compiling it needs more than {} MiB of memory (--policy-compile-memory-mib)",
                    self.memory_bytes >> 20
                ))
            }
            _ if message.is_empty() => Err(format!("it ended with {status}")),
            _ => Err(format!("it ended with {status}: {message}")),
        }
    }
}

/// The first `max` bytes of `from` and whether there were more, read to its end (a writer is
/// never left blocked on a full pipe).
fn kept(from: Option<impl Read>, max: u64) -> (Vec<u8>, bool) {
    let Some(mut from) = from else {
        return (Vec::new(), false);
    };
    let mut out = Vec::new();
    let _ = from.by_ref().take(max).read_to_end(&mut out);
    let more = std::io::copy(&mut from, &mut std::io::sink()).unwrap_or(0);
    (out, more > 0)
}

/// The child's exit status, or `None` when it was still running at `deadline`. Polled: a
/// compile takes a fraction of a second, the poll at most 20 ms. A child not seen to end — the
/// deadline passed, or it cannot be waited for — is killed and reaped, so that its pipes close
/// and the threads reading them end.
fn wait_within(child: &mut Child, deadline: Duration) -> std::io::Result<Option<ExitStatus>> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    let ended = loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        let left = deadline.saturating_sub(start.elapsed());
        if left.is_zero() {
            break Ok(None);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(20));
    };
    let killed = child.kill().and_then(|()| child.wait());
    ended.and_then(|none| killed.map(|_| none))
}
