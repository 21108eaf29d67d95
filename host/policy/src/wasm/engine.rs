//! The engine every policy runs in, and the runtime that owns it.

use super::bindings;
use super::compile::Compiler;
use super::store::State;
use crate::LoadError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the engine's epoch advances: the granularity of deadlines.
pub(super) const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The engine configuration. Every engine in pinset, the compiling child's included, is built
/// from this one function: an artifact loads only into an engine configured like the one that
/// compiled it.
pub(super) fn engine_config() -> Config {
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
    // Every reconcile and every fleet decision starts a fresh instance (no state survives one):
    // instances come from a pool of pre-reserved slots whose linear memories are mapped
    // copy-on-write from the module's initial image, instead of mmap + page faults + munmap
    // per instance. `PINSET_WASM_ALLOCATOR=on-demand` turns it off (the baseline of
    // BENCHMARKS.md).
    if pooled() {
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool()));
    }
    config
}

/// Instances alive at once per engine: an agent runs one reconcile at a time, a controller at
/// most a handful of fleet decisions. An exhausted pool fails instantiation, which the guard
/// answers with the native policy, never a crash.
pub const POOLED_INSTANCES: u32 = 64;
/// Largest linear memory a pooled instance may grow to; each policy's own cap (`Limits`) is
/// enforced below it by the store's limiter.
pub const POOLED_MEMORY_BYTES: usize = 4 << 30;

/// Linear memory of a pooled slot reset in place (memset) and kept resident between instances;
/// beyond it, pages go back to the kernel. At most this much per warm slot stays resident.
pub const KEEP_RESIDENT_BYTES: usize = 4 << 20;

fn pool() -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(POOLED_INSTANCES)
        // A component holds a few core instances (the policy, shims), each at most one memory
        // and a table or two.
        .total_core_instances(POOLED_INSTANCES * 8)
        .total_memories(POOLED_INSTANCES * 2)
        .total_tables(POOLED_INSTANCES * 8)
        .max_memory_size(POOLED_MEMORY_BYTES)
        // Reset a slot's memory with memset rather than madvise, up to what a reconcile of a
        // few hundred images touches (the guest's 1 MiB stack, its data and heap): the next
        // instance then takes no page faults. Measured in BENCHMARKS.md: 1 MiB left the heap to
        // fault in again (reconcile 161 µs); from 2 MiB on it is 80 µs, flat up to 32 MiB.
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(64 << 10)
        // Where the kernel offers it (Linux 6.7+, PAGEMAP_SCAN), reset only the pages an instance
        // wrote instead of the whole resident prefix; elsewhere the memset above.
        // `PINSET_WASM_PAGEMAP_SCAN=no` turns it off (the baseline of BENCHMARKS.md).
        .pagemap_scan(if dirty_page_reset() {
            Enabled::Auto
        } else {
            Enabled::No
        });
    pool
}

/// Instances come from the pool (`PINSET_WASM_ALLOCATOR=on-demand`: mmap per instance).
fn pooled() -> bool {
    std::env::var("PINSET_WASM_ALLOCATOR").as_deref() != Ok("on-demand")
}

/// A pooled slot is reset by the pages its instance wrote, when the kernel can tell.
fn dirty_page_reset() -> bool {
    std::env::var("PINSET_WASM_PAGEMAP_SCAN").as_deref() != Ok("no")
}

/// How instances are made and reset on this machine, in words (`pinset policy bench`).
pub fn instance_strategy() -> String {
    if !pooled() {
        "on demand (mmap, page faults and munmap per instance)".into()
    } else if dirty_page_reset() && PoolingAllocationConfig::is_pagemap_scan_available() {
        "pooled slots, reset by the pages each instance wrote (PAGEMAP_SCAN)".into()
    } else {
        format!(
            "pooled slots, reset by memset of the first {} MiB",
            KEEP_RESIDENT_BYTES >> 20
        )
    }
}

/// Engine, linker and epoch ticker shared by every module.
#[derive(Clone)]
pub struct WasmRuntime {
    pub(super) engine: Engine,
    pub(super) linker: Arc<Linker<State>>,
    pub(super) ticker: Arc<Ticker>,
    pub(super) compiler: Compiler,
    /// Where compiled modules are kept ([`WasmRuntime::with_compiled_cache`]).
    pub(super) compiled_cache: Option<std::path::PathBuf>,
}

pub(super) struct Ticker {
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

    /// A runtime whose modules are compiled by `compiler`. One that compiles in a child builds
    /// no compiler of its own: it only loads the child's artifacts (wasmtime still checks that
    /// each was compiled for this engine's settings and this CPU), and Cranelift's code is
    /// never run in this process.
    pub fn with_compiler(compiler: Compiler) -> Result<Self, LoadError> {
        let mut config = engine_config();
        config.enable_compiler(matches!(compiler, Compiler::InProcess));
        let engine = Engine::new(&config).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        super::wasi::add_to_linker(&mut linker)
            .map_err(|e| LoadError::Engine(format!("linking WASI: {e:#}")))?;
        bindings::Policy::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Engine(format!("linking the host interface: {e:#}")))?;
        super::fleet_bindings::FleetPolicy::add_to_linker::<State, HasSelf<State>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| LoadError::Engine(format!("linking the fleet host interface: {e:#}")))?;

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
            compiled_cache: None,
        })
    }

    /// Keep compiled modules in `dir`, by the module's sha256 and this engine's version and
    /// configuration (a compiled module only loads into an engine of both): a restarted
    /// process loads them instead of compiling again. An engine that compiles in process and
    /// one that does not (its modules compiled in a child) count as two configurations: each
    /// keeps its own copy of a module in a directory they share.
    pub fn with_compiled_cache(mut self, dir: std::path::PathBuf) -> Self {
        self.compiled_cache = Some(dir);
        self
    }

    pub fn compiler(&self) -> &Compiler {
        &self.compiler
    }
}
