//! The sandboxed WebAssembly runtime for policies (wasmtime, component model).
//!
//! - A [`WasmRuntime`] owns the engine, the linker and the epoch ticker that enforces deadlines.
//!   It compiles modules in this process or, for long-running processes, in a child process
//!   ([`Compiler`]), so that the agent itself never runs the compiler.
//! - A [`PolicyModule`] is compiled and pre-instantiated once (`InstancePre`); loading checks the
//!   optional sha256 pin and the contract version, and probes `info`.
//! - A [`WasmPolicy`] is one reconcile's instance: its own `Store`, created on first use, so no
//!   state leaks between reconciles. A call that fails discards the store; the next call starts a
//!   fresh one.
//!
//! The sandbox: WASI is linked (the Rust standard library imports it) with an empty context — no
//! preopened directories, environment, arguments or sockets; stdout is discarded and stderr is
//! kept (4 KiB) only to quote a panic message in the error. Each call has a deadline (epoch
//! interruption), each store a memory cap, and a policy may log at most [`MAX_LOG_LINES`] lines.

use super::{Hook, LoadError, PolicyError, PolicyInstance};
use pinset_policy_sdk as sdk;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "policy",
    });
}

use bindings::pinset::policy::types as wit;

/// The exported interface (and version) this pinset calls.
pub const CONTRACT: &str = "pinset:policy/decisions@0.1.0";
const CONTRACT_PREFIX: &str = "pinset:policy/decisions@";

/// How often the engine's epoch advances: the granularity of deadlines.
const EPOCH_TICK: Duration = Duration::from_millis(5);
/// Lines a policy may log per store; more are dropped.
pub const MAX_LOG_LINES: u32 = 100;
const MAX_LOG_LINE_BYTES: usize = 1024;
const STDERR_CAPTURE_BYTES: usize = 4096;

/// Per-call and per-store limits of a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock budget of one hook call (and of instantiation).
    pub deadline: Duration,
    /// Linear memory a store may grow to.
    pub memory_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(100),
            memory_bytes: 32 << 20,
        }
    }
}

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

/// The engine configuration. Every engine in pinset, the compiling child's included, is built
/// from this one function: an artifact loads only into an engine configured like the one that
/// compiled it.
fn engine_config() -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(true)
        .wasm_backtrace_max_frames(None)
        .max_wasm_stack(1 << 20);
    // Lets `perf` name the functions of policy modules (see BENCHMARKS.md).
    if std::env::var_os("PINSET_WASM_PERFMAP").is_some() {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    config
}

/// The child's side of [`Compiler::Subprocess`]: compile the component in `bytes` to an
/// artifact for an engine of [`engine_config`]. The error is the compiler's message.
pub fn precompile(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let engine = Engine::new(&engine_config()).map_err(|e| format!("wasm engine: {e:#}"))?;
    engine
        .precompile_component(bytes)
        .map_err(|e| format!("{e:#}"))
}

/// Cut `text` to at most `max` bytes on a character boundary, marking the cut with `…`.
fn shorten(text: &mut String, max: usize) {
    if text.len() > max {
        text.truncate(text.floor_char_boundary(max));
        text.push('…');
    }
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

/// Engine, linker and epoch ticker shared by every module.
#[derive(Clone)]
pub struct WasmRuntime {
    engine: Engine,
    linker: Arc<Linker<State>>,
    ticker: Arc<Ticker>,
    compiler: Compiler,
}

struct Ticker {
    stop: Arc<AtomicBool>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl WasmRuntime {
    /// A runtime that compiles modules in this process.
    pub fn new() -> Result<Self, LoadError> {
        Self::with_compiler(Compiler::InProcess)
    }

    pub fn with_compiler(compiler: Compiler) -> Result<Self, LoadError> {
        let engine =
            Engine::new(&engine_config()).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| LoadError::Engine(format!("linking WASI: {e:#}")))?;
        bindings::Policy::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Engine(format!("linking the host interface: {e:#}")))?;

        let stop = Arc::new(AtomicBool::new(false));
        let (ticking_engine, ticking_stop) = (engine.clone(), stop.clone());
        std::thread::Builder::new()
            .name("pinset-wasm-epoch".into())
            .spawn(move || {
                while !ticking_stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    ticking_engine.increment_epoch();
                }
            })
            .map_err(|e| LoadError::Engine(format!("starting the epoch ticker: {e}")))?;
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            ticker: Arc::new(Ticker { stop }),
            compiler,
        })
    }

    pub fn compiler(&self) -> &Compiler {
        &self.compiler
    }

    fn compile(&self, name: &str, bytes: &[u8]) -> Result<Component, LoadError> {
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

    /// Load a module from a file. `sha256`, when given, must match the file.
    pub fn load_file(
        &self,
        path: &Path,
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<PolicyModule, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.load(&path.display().to_string(), &bytes, sha256, limits)
    }

    /// Compile, check and pre-instantiate a module.
    pub fn load(
        &self,
        name: &str,
        bytes: &[u8],
        sha256: Option<&str>,
        limits: Limits,
    ) -> Result<PolicyModule, LoadError> {
        let actual = hex(&Sha256::digest(bytes));
        if let Some(expected) = sha256 {
            let expected_norm = expected.trim().to_ascii_lowercase();
            if expected_norm.len() != 64 || !expected_norm.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(LoadError::BadSha256 {
                    module: name.into(),
                    value: expected.into(),
                });
            }
            if expected_norm != actual {
                return Err(LoadError::Sha256Mismatch {
                    module: name.into(),
                    expected: expected_norm,
                    actual,
                });
            }
        }
        let component = self.compile(name, bytes)?;
        check_contract(&self.engine, &component, name)?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Link {
                module: name.into(),
                cause: format!("{e:#}"),
            })?;
        let pre = bindings::PolicyPre::new(pre).map_err(|e| LoadError::Contract {
            module: name.into(),
            expected: CONTRACT.into(),
            found: format!("an incompatible {CONTRACT}: {e:#}"),
        })?;
        let module = PolicyModule {
            shared: Arc::new(Shared {
                name: name.into(),
                sha256: actual,
                pre,
                engine: self.engine.clone(),
                limits,
                _ticker: self.ticker.clone(),
            }),
        };
        Ok(module)
    }
}

/// The module must export [`CONTRACT`] or a semver-compatible version of it.
fn check_contract(engine: &Engine, component: &Component, name: &str) -> Result<(), LoadError> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let wanted = version_of(CONTRACT).expect("CONTRACT has a version");
    if exports
        .iter()
        .filter_map(|e| version_of(e))
        .any(|v| compatible(v, wanted))
    {
        return Ok(());
    }
    let found = if exports.is_empty() {
        "no exports".to_string()
    } else {
        exports.join(", ")
    };
    Err(LoadError::Contract {
        module: name.into(),
        expected: CONTRACT.into(),
        found,
    })
}

fn version_of(export: &str) -> Option<(u64, u64)> {
    let version = export.strip_prefix(CONTRACT_PREFIX)?;
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Semver compatibility: same major, and for 0.x the same minor.
fn compatible(found: (u64, u64), wanted: (u64, u64)) -> bool {
    found.0 == wanted.0 && (found.0 != 0 || found.1 == wanted.1)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Shared {
    name: String,
    sha256: String,
    pre: bindings::PolicyPre<State>,
    engine: Engine,
    limits: Limits,
    _ticker: Arc<Ticker>,
}

/// A compiled, checked, pre-instantiated policy module. Cheap to clone.
#[derive(Clone)]
pub struct PolicyModule {
    shared: Arc<Shared>,
}

impl PolicyModule {
    pub fn name(&self) -> &str {
        &self.shared.name
    }
    pub fn sha256(&self) -> &str {
        &self.shared.sha256
    }
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }
    /// A fresh instance for one reconcile.
    pub fn instance(&self) -> WasmPolicy {
        WasmPolicy {
            shared: self.shared.clone(),
            live: None,
        }
    }
}

/// Store state: the empty WASI context, the memory limiter, and the policy's log budget.
struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: CapLimiter,
    stderr: MemoryOutputPipe,
    policy: Arc<str>,
    log_lines: u32,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl bindings::pinset::policy::types::Host for State {}

impl bindings::pinset::policy::host::Host for State {
    fn log(&mut self, level: wit::Level, message: String) {
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES {
            if self.log_lines == MAX_LOG_LINES + 1 {
                tracing::warn!(policy = %self.policy, "policy log limit reached; dropping further lines");
            }
            return;
        }
        let mut message = message;
        shorten(&mut message, MAX_LOG_LINE_BYTES);
        let policy = &*self.policy;
        match level {
            wit::Level::Debug => tracing::debug!(policy, "{message}"),
            wit::Level::Info => tracing::info!(policy, "{message}"),
            wit::Level::Warn => tracing::warn!(policy, "{message}"),
            wit::Level::Error => tracing::error!(policy, "{message}"),
        }
    }
}

/// `StoreLimits` that remembers whether it refused to grow, so the error can say so.
struct CapLimiter {
    inner: StoreLimits,
    hit: bool,
}

impl ResourceLimiter for CapLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let r = self.inner.memory_growing(current, desired, maximum);
        if !matches!(r, Ok(true)) {
            self.hit = true;
        }
        r
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let r = self.inner.table_growing(current, desired, maximum);
        if !matches!(r, Ok(true)) {
            self.hit = true;
        }
        r
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }
    fn tables(&self) -> usize {
        self.inner.tables()
    }
    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// One reconcile's instance of a Wasm policy.
pub struct WasmPolicy {
    shared: Arc<Shared>,
    live: Option<(Store<State>, bindings::Policy)>,
}

impl WasmPolicy {
    fn new_store(&self) -> Store<State> {
        let s = &self.shared;
        let stderr = MemoryOutputPipe::new(STDERR_CAPTURE_BYTES);
        let wasi = WasiCtxBuilder::new()
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let limits = StoreLimitsBuilder::new()
            .memory_size(s.limits.memory_bytes)
            .table_elements(1 << 16)
            .instances(16)
            .memories(4)
            .tables(16)
            .trap_on_grow_failure(true)
            .build();
        let state = State {
            wasi,
            table: ResourceTable::new(),
            limiter: CapLimiter {
                inner: limits,
                hit: false,
            },
            stderr,
            policy: Arc::from(s.name.as_str()),
            log_lines: 0,
        };
        let mut store = Store::new(&s.engine, state);
        store.limiter(|state| &mut state.limiter);
        store
    }

    fn deadline_ticks(&self) -> u64 {
        let tick = EPOCH_TICK.as_nanos();
        // The deadline passes between ticks-1 and ticks epochs from now: add one for the floor.
        (self.shared.limits.deadline.as_nanos().div_ceil(tick) as u64).max(1) + 1
    }

    /// Run one hook, instantiating first when there is no live instance. Any failure drops the
    /// store: a trapped instance may not be entered again.
    fn call<R>(
        &mut self,
        hook: Hook,
        f: impl FnOnce(&mut Store<State>, &bindings::Policy) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let ticks = self.deadline_ticks();
        if self.live.is_none() {
            let mut store = self.new_store();
            store.set_epoch_deadline(ticks);
            let instance = match self.shared.pre.instantiate(&mut store) {
                Ok(i) => i,
                Err(e) => return Err(self.classify(hook, &store, e)),
            };
            self.live = Some((store, instance));
        }
        let (store, instance) = self.live.as_mut().expect("instantiated above");
        store.set_epoch_deadline(ticks);
        match f(store, instance) {
            Ok(r) => Ok(r),
            Err(e) => {
                let (store, _) = self.live.take().expect("live instance");
                Err(self.classify(hook, &store, e))
            }
        }
    }

    fn classify(&self, hook: Hook, store: &Store<State>, e: wasmtime::Error) -> PolicyError {
        let policy = self.shared.name.clone();
        if store.data().limiter.hit {
            return PolicyError::MemoryCap {
                policy,
                hook,
                cap_bytes: self.shared.limits.memory_bytes,
            };
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => PolicyError::Deadline {
                policy,
                hook,
                deadline: self.shared.limits.deadline,
            },
            trap => {
                let mut message = trap.map_or_else(|| format!("{e:#}"), |t| t.to_string());
                let stderr = store.data().stderr.contents();
                let stderr = String::from_utf8_lossy(&stderr);
                if let Some(panic) = stderr.lines().find(|l| l.contains("panicked at")) {
                    let detail: Vec<&str> = stderr
                        .lines()
                        .skip_while(|l| !l.contains("panicked at"))
                        .take(2)
                        .collect();
                    message = format!(
                        "{message} ({})",
                        if detail.len() > 1 {
                            detail.join(" ")
                        } else {
                            panic.to_string()
                        }
                    );
                }
                PolicyError::Trap {
                    policy,
                    hook,
                    message,
                }
            }
        }
    }
}

impl PolicyInstance for WasmPolicy {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn info(&mut self) -> Result<sdk::PolicyInfo, PolicyError> {
        let i = self.call(Hook::Info, |s, p| p.pinset_policy_decisions().call_info(s))?;
        Ok(sdk::PolicyInfo {
            name: i.name,
            version: i.version,
            description: i.description,
        })
    }

    fn admit(&mut self, request: &sdk::AdmissionRequest) -> Result<sdk::Admission, PolicyError> {
        let request = wit::AdmissionRequest {
            node: node(&request.node),
            disk: wit::DiskFacts {
                capacity_bytes: request.disk.capacity_bytes,
                used_bytes: request.disk.used_bytes,
                available_bytes: request.disk.available_bytes,
            },
            images: pack(&request.images),
        };
        let a = self.call(Hook::Admit, |s, p| {
            p.pinset_policy_decisions().call_admit(s, &request)
        })?;
        let verdict = match a.verdict {
            wit::Verdict::AdmitAll => sdk::Verdict::AdmitAll,
            wit::Verdict::AdmitSome(v) => sdk::Verdict::AdmitSome(v),
            wit::Verdict::Reject => sdk::Verdict::Reject,
        };
        Ok(sdk::Admission {
            verdict,
            reason: a.reason,
        })
    }

    fn order(&mut self, n: &sdk::NodeFacts, images: &sdk::Images) -> Result<Vec<u32>, PolicyError> {
        let n = node(n);
        let images = pack(images);
        self.call(Hook::Order, |s, p| {
            p.pinset_policy_decisions().call_order(s, &n, &images)
        })
    }

    fn concurrency(&mut self, n: &sdk::NodeFacts) -> Result<u32, PolicyError> {
        let n = node(n);
        self.call(Hook::Concurrency, |s, p| {
            p.pinset_policy_decisions().call_concurrency(s, &n)
        })
    }

    fn throttle(
        &mut self,
        n: &sdk::NodeFacts,
        outcome: &sdk::PullOutcome,
        pressure: &sdk::Pressure,
    ) -> Result<u64, PolicyError> {
        let n = node(n);
        let outcome = wit::PullOutcome {
            reference: outcome.reference.clone(),
            error: outcome.error.clone(),
            bytes: outcome.bytes,
            duration_ms: outcome.duration_ms,
            remaining: outcome.remaining,
        };
        let pressure = wit::Pressure {
            io: pressure.io,
            cpu: pressure.cpu,
            memory: pressure.memory,
        };
        self.call(Hook::Throttle, |s, p| {
            p.pinset_policy_decisions()
                .call_throttle(s, &n, &outcome, pressure)
        })
    }
}

fn node(n: &sdk::NodeFacts) -> wit::NodeFacts {
    wit::NodeFacts {
        name: n.name.clone(),
        labels: n.labels.clone(),
        pools: n.pools.clone(),
        control_plane: n.control_plane,
        ready: n.ready,
        disk_pressure: n.disk_pressure,
        allocatable_ephemeral_bytes: n.allocatable_ephemeral_bytes,
    }
}

/// The SDK's columns are the contract's: a copy of each, nothing per image.
fn pack(images: &sdk::Images) -> wit::Images {
    let c = images.to_columns();
    wit::Images {
        references: c.references,
        reference_starts: c.reference_starts,
        present: c.present,
        size_known: c.size_known,
        size_bytes: c.size_bytes,
        layer_starts: c.layer_starts,
        layer_ids: c.layer_ids,
        layer_sizes: c.layer_sizes,
        set_starts: c.set_starts,
        set_ids: c.set_ids,
        set_names: c.set_names,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_versions() {
        assert_eq!(version_of(CONTRACT), Some((0, 1)));
        assert_eq!(version_of("pinset:policy/decisions@0.2.0"), Some((0, 2)));
        assert_eq!(version_of("other:x/decisions@0.1.0"), None);
        assert!(compatible((0, 1), (0, 1)));
        assert!(!compatible((0, 2), (0, 1)));
        assert!(compatible((1, 3), (1, 0)));
        assert!(!compatible((2, 0), (1, 0)));
    }
}
