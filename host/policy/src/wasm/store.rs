//! One store's state: the empty WASI context (built on first use), the memory cap, the policy's
//! log budget.

use super::{bindings, bounded, fleet_bindings, wit};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// Lines a policy may log per reconcile (across the instances of that reconcile); more are
/// dropped.
pub const MAX_LOG_LINES: u32 = 100;
/// Bytes of one log line; longer lines are cut.
pub const MAX_LOG_LINE_BYTES: usize = 1024;
/// Bytes a policy may log per reconcile.
pub const MAX_LOG_BYTES: usize = 16 << 10;
/// Bytes of stderr kept per instance (to quote a panic); the rest is dropped.
pub const STDERR_CAPTURE_BYTES: usize = 4096;

/// Per-call and per-instance limits of a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock budget of one hook call (and of instantiation).
    pub deadline: Duration,
    /// Memory an instance may grow to: all its linear memories together.
    pub memory_bytes: usize,
    /// Largest module accepted, in bytes.
    pub max_module_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_millis(100),
            memory_bytes: 32 << 20,
            max_module_bytes: 16 << 20,
        }
    }
}

/// What a policy may still log in one reconcile; shared by the instances of that reconcile (a
/// failed call discards its instance, the budget stays).
#[derive(Default)]
pub(super) struct LogBudget {
    lines: AtomicU32,
    bytes: AtomicUsize,
    warned: AtomicBool,
}

impl LogBudget {
    /// Whether a line of `len` bytes may be logged; warns once when the budget runs out.
    fn take(&self, policy: &str, len: usize) -> bool {
        let lines = self.lines.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = self.bytes.fetch_add(len, Ordering::Relaxed) + len;
        if lines <= MAX_LOG_LINES && bytes <= MAX_LOG_BYTES {
            return true;
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                policy,
                "policy log limit reached ({MAX_LOG_LINES} lines or {MAX_LOG_BYTES} bytes per reconcile); dropping further lines"
            );
        }
        false
    }
}

/// Store state: the empty WASI context, the memory limiter, and the policy's log budget.
pub struct State {
    /// Built on the first WASI call: a module built without the standard library imports no
    /// WASI and never pays for it.
    wasi: Option<WasiCtx>,
    table: ResourceTable,
    pub(super) limiter: CapLimiter,
    pub(super) stderr: MemoryOutputPipe,
    policy: Arc<str>,
    log: Arc<LogBudget>,
    /// The first `panicked at` line logged at error level: how a policy built without the
    /// standard library (no stderr) reports its panic before it traps. Not logged itself.
    pub(super) logged_panic: Option<String>,
}

impl State {
    pub(super) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let stderr = &self.stderr;
        WasiCtxView {
            ctx: self.wasi.get_or_insert_with(|| empty_wasi(stderr.clone())),
            table: &mut self.table,
        }
    }
}

impl bindings::pinset::policy::types::Host for State {}

impl bindings::pinset::policy::host::Host for State {
    fn log(&mut self, level: wit::Level, message: String) {
        self.write_log(level, message);
    }
}

impl fleet_bindings::pinset::fleet::types::Host for State {}

impl fleet_bindings::pinset::fleet::host::Host for State {
    fn log(&mut self, level: fleet_bindings::pinset::fleet::types::Level, message: String) {
        use fleet_bindings::pinset::fleet::types::Level;
        let level = match level {
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        };
        self.write_log(level, message);
    }
}

impl State {
    fn write_log(&mut self, level: wit::Level, message: String) {
        // A panic handler's line is kept for the error of the trap that follows it, which
        // quotes it: logged there, once.
        if matches!(level, wit::Level::Error) && message.starts_with("panicked at") {
            self.logged_panic
                .get_or_insert_with(|| bounded(&message, MAX_LOG_LINE_BYTES));
            return;
        }
        // The budget first: a line past it costs nothing more (a flood is dropped unread).
        if !self
            .log
            .take(&self.policy, message.len().min(MAX_LOG_LINE_BYTES))
        {
            return;
        }
        // Escaped: a policy's line cannot forge or disguise lines of pinset's own.
        let message = bounded(&message, MAX_LOG_LINE_BYTES);
        let policy = &*self.policy;
        match level {
            wit::Level::Debug => tracing::debug!(policy, "{message}"),
            wit::Level::Info => tracing::info!(policy, "{message}"),
            wit::Level::Warn => tracing::warn!(policy, "{message}"),
            wit::Level::Error => tracing::error!(policy, "{message}"),
        }
    }
}

/// Caps the memory of an instance as a whole (every linear memory together) and remembers
/// whether it refused to grow, so the error can say so.
pub(super) struct CapLimiter {
    inner: StoreLimits,
    cap: usize,
    total: usize,
    pub(super) hit: bool,
}

impl ResourceLimiter for CapLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.total.saturating_add(desired.saturating_sub(current));
        let r = if total > self.cap {
            Err(wasmtime::Error::msg(format!(
                "the instance's memories would grow to {total} bytes, over the {}-byte cap",
                self.cap
            )))
        } else {
            self.inner.memory_growing(current, desired, maximum)
        };
        match r {
            Ok(true) => self.total = total,
            _ => self.hit = true,
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

/// The WASI context a policy gets: stdout dropped (a pipe without room), stdin empty, stderr
/// kept up to [`STDERR_CAPTURE_BYTES`]; no sockets are linked at all.
fn empty_wasi(stderr: MemoryOutputPipe) -> WasiCtx {
    WasiCtxBuilder::new()
        .stdin(MemoryInputPipe::new(Vec::new()))
        .stdout(MemoryOutputPipe::new(0))
        .stderr(stderr)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build()
}

/// A fresh store for one instance of the module `name`, under its limits.
pub(super) fn new_store(
    engine: &Engine,
    name: &str,
    limits: Limits,
    log: Arc<LogBudget>,
) -> Store<State> {
    let stderr = MemoryOutputPipe::new(STDERR_CAPTURE_BYTES);
    let store_limits = StoreLimitsBuilder::new()
        .memory_size(limits.memory_bytes)
        .table_elements(1 << 16)
        .instances(16)
        .memories(4)
        .tables(16)
        .trap_on_grow_failure(true)
        .build();
    let state = State {
        wasi: None,
        table: ResourceTable::new(),
        limiter: CapLimiter {
            inner: store_limits,
            cap: limits.memory_bytes,
            total: 0,
            hit: false,
        },
        stderr,
        policy: Arc::from(name),
        log,
        logged_panic: None,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.limiter);
    store
}
