//! One store's state: the empty WASI context, the memory cap, the policy's log budget.

use super::module::Shared;
use super::{bindings, shorten, wit};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

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

/// Store state: the empty WASI context, the memory limiter, and the policy's log budget.
pub(super) struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(super) limiter: CapLimiter,
    pub(super) stderr: MemoryOutputPipe,
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
pub(super) struct CapLimiter {
    inner: StoreLimits,
    pub(super) hit: bool,
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

/// A fresh store for one instance of `module`, under its limits.
pub(super) fn new_store(s: &Shared) -> Store<State> {
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
