//! Real Wasm modules compiled from `tests/policies/` and `policies/`: every kind of misbehaviour
//! is contained (clear error naming module and hook, fallback to the reference, process alive),
//! and modules that must not load are refused.

use crate::support;
use crate::support::wasm_runtime as runtime;

use pinset_policy::{
    ChildCompiler, Compiler, Decisions, Guarded, Hook, Limits, LoadError, NodeContract,
    PolicyError, PolicyInstance, PolicyModule, WasmRuntime,
};
use pinset_policy_bench::synth;
use pinset_policy_sdk::{NodeFacts, Pressure, PullOutcome, Verdict};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn component(stem: &str) -> PathBuf {
    support::policy_path(stem)
}

fn hostile() -> &'static PolicyModule {
    static M: OnceLock<PolicyModule> = OnceLock::new();
    M.get_or_init(|| {
        runtime()
            .load_file(
                &component("pinset_test_policy_hostile"),
                None,
                Limits::default(),
            )
            .expect("hostile module loads")
    })
}

/// A worker node asking the hostile policy for `mode`.
fn node(mode: &str) -> NodeFacts {
    let mut n = synth::node(false);
    n.labels.push(("pinset.test/hostile".into(), mode.into()));
    n.labels.sort();
    n
}

#[test]
fn infinite_loop_hits_the_deadline_in_every_hook_and_falls_back() {
    let n = node("loop");
    let mut instance = hostile().instance();
    let started = Instant::now();
    let err = instance.concurrency(&n).unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        matches!(
            err,
            PolicyError::Deadline {
                hook: Hook::Concurrency,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        elapsed >= Duration::from_millis(100),
        "stopped before the deadline: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "deadline not enforced: {elapsed:?}"
    );
    let msg = err.to_string();
    support::assert_says(
        &msg,
        &["pinset_test_policy_hostile.wasm", "hook concurrency"],
    );

    let mut guarded = Guarded::of(hostile());
    assert_eq!(guarded.concurrency(&n), 5, "reference answer for a worker");
    let (outcome, pressure) = (PullOutcome::default(), Pressure::default());
    assert_eq!(
        guarded.throttle(&n, &outcome, &pressure),
        Duration::from_secs(1)
    );
    let mut request = synth::request(3, 1);
    request.node = n.clone();
    assert_eq!(guarded.admit(&request).verdict, Verdict::AdmitAll);
    assert_eq!(guarded.order(&n, &request.images), vec![0, 1, 2]);
    let kinds: Vec<(Hook, &str)> = guarded
        .fallbacks()
        .iter()
        .map(|f| (f.hook, f.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (Hook::Concurrency, "deadline"),
            (Hook::Throttle, "deadline"),
            (Hook::Admit, "deadline"),
            (Hook::Order, "deadline"),
        ]
    );
}

#[test]
fn a_shorter_deadline_is_honoured() {
    let limits = Limits {
        deadline: Duration::from_millis(20),
        ..Limits::default()
    };
    let module = runtime()
        .load_file(&component("pinset_test_policy_hostile"), None, limits)
        .unwrap();
    let started = Instant::now();
    let err = module.instance().concurrency(&node("loop")).unwrap_err();
    assert!(
        matches!(err, PolicyError::Deadline { deadline, .. } if deadline == Duration::from_millis(20))
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn unbounded_allocation_hits_the_memory_cap() {
    let mut instance = hostile().instance();
    let err = instance.concurrency(&node("alloc")).unwrap_err();
    assert!(
        matches!(err, PolicyError::MemoryCap { hook: Hook::Concurrency, cap_bytes, .. } if cap_bytes == 32 << 20),
        "{err}"
    );
    assert!(err.to_string().contains("memory cap"), "{err}");
    // The same instance recovers with a fresh store on the next call.
    assert_eq!(instance.concurrency(&node("none")).unwrap(), 5);
}

#[test]
fn a_trap_is_reported_with_the_panic_message_and_the_instance_recovers() {
    let mut instance = hostile().instance();
    let err = instance
        .order(&node("trap"), &pinset_policy_sdk::Images::new())
        .unwrap_err();
    let PolicyError::Trap { hook, message, .. } = &err else {
        panic!("expected a trap: {err}")
    };
    assert_eq!(*hook, Hook::Order);
    support::assert_says(message, &["hostile policy traps on purpose"]);
    assert_eq!(instance.concurrency(&node("none")).unwrap(), 5);
}

#[test]
fn invalid_decisions_are_refused_and_replaced() {
    let request_for = |mode: &str| {
        let mut r = synth::request(4, 9);
        r.node = node(mode);
        r
    };
    let cases: [(&str, Hook); 5] = [
        ("non-permutation", Hook::Order),
        ("concurrency-zero", Hook::Concurrency),
        ("concurrency-huge", Hook::Concurrency),
        ("throttle-year", Hook::Throttle),
        ("bad-subset", Hook::Admit),
    ];
    for (mode, hook) in cases {
        let r = request_for(mode);
        let mut g = Guarded::of(hostile());
        let admission = g.admit(&r);
        let order = g.order(&r.node, &r.images);
        let concurrency = g.concurrency(&r.node);
        let throttle = g.throttle(&r.node, &PullOutcome::default(), &Pressure::default());
        assert_eq!(admission.verdict, Verdict::AdmitAll, "{mode}");
        assert_eq!(order, vec![0, 1, 2, 3], "{mode}");
        assert_eq!(concurrency, 5, "{mode}");
        assert_eq!(throttle, Duration::from_secs(1), "{mode}");
        let fallbacks = g.take_fallbacks();
        assert_eq!(fallbacks.len(), 1, "{mode}: {fallbacks:?}");
        assert_eq!(fallbacks[0].hook, hook, "{mode}");
        assert_eq!(fallbacks[0].kind, "invalid", "{mode}");
        assert!(
            fallbacks[0]
                .to_string()
                .contains("returned an invalid decision"),
            "{mode}"
        );
    }
}

#[test]
fn state_lives_for_one_instance_only() {
    // Counters in zeroed memory and in the module's data image: a reused instance slot is reset
    // (by the pages the last instance wrote where the kernel can tell, else by memset) so that
    // neither survives a reconcile.
    for mode in ["counter", "counter-data"] {
        let n = node(mode);
        let mut first = hostile().instance();
        assert_eq!(first.concurrency(&n).unwrap(), 1, "{mode}");
        assert_eq!(first.concurrency(&n).unwrap(), 2, "{mode}");
        let mut second = hostile().instance();
        assert_eq!(
            second.concurrency(&n).unwrap(),
            1,
            "{mode}: a new reconcile starts from a fresh store"
        );
        drop((first, second));
        for round in 0..5 {
            let mut again = hostile().instance();
            assert_eq!(
                (
                    again.concurrency(&n).unwrap(),
                    again.concurrency(&n).unwrap()
                ),
                (1, 2),
                "{mode}: instance {round} in a reused slot"
            );
        }
    }
}

#[test]
fn a_module_without_wasi_imports_only_the_contract_and_decides_through_the_host() {
    // Modules built without the standard library — the floor (`tests/policies/floor`) and the
    // default policy (the SDK's `no-std`) — import the contracts' interfaces and no WASI, which
    // a policy built with the standard library brings along: `imports` is what
    // `pinset policy info` shows.
    let floor = runtime()
        .load_file(
            &component("pinset_test_policy_floor"),
            None,
            Limits::default(),
        )
        .expect("floor module loads");
    assert_eq!(
        floor.imports(),
        ["pinset:policy/host@0.1.0", "pinset:policy/types@0.1.0"]
    );
    let default = runtime()
        .load_file(&component("pinset_policy_default"), None, Limits::default())
        .unwrap();
    assert_eq!(
        default.imports(),
        [
            "pinset:fleet/types@0.2.1",
            "pinset:policy/host@0.1.0",
            "pinset:policy/types@0.1.0"
        ]
    );
    let with_std = runtime()
        .load_file(
            &component("pinset_policy_smallest_first"),
            None,
            Limits::default(),
        )
        .unwrap();
    assert!(
        with_std
            .imports()
            .iter()
            .any(|i| i.starts_with("wasi:cli/stderr@")),
        "{:?}",
        with_std.imports()
    );

    // 600 admissions of 500 images in one instance copy ~50 MB of columns into it, over the
    // 32 MiB memory cap unless the module's allocator starts over once a call's blocks are freed.
    let request = synth::request(500, 7);
    let mut g = Guarded::of(&floor);
    for _ in 0..600 {
        assert_eq!(g.admit(&request).verdict, Verdict::AdmitAll);
    }
    let order = g.order(&request.node, &request.images);
    assert_eq!(order, (0..500).collect::<Vec<u32>>());
    assert_eq!(g.concurrency(&request.node), 1);
    let throttle = g.throttle(&request.node, &PullOutcome::default(), &Pressure::default());
    assert_eq!(throttle, Duration::ZERO);
    assert!(g.fallbacks().is_empty(), "{:?}", g.fallbacks());
}

#[test]
fn a_policy_without_stderr_reports_its_panic_through_the_contract_log() {
    // The SDK's panic handler (feature `no-std`) logs `panicked at FILE:LINE: MESSAGE` through
    // the contract, then traps; the error quotes that line as it quotes a standard library's
    // stderr.
    let floor = runtime()
        .load_file(
            &component("pinset_test_policy_floor"),
            None,
            Limits::default(),
        )
        .unwrap();
    let mut panicking = synth::node(false);
    panicking.name = "floor-panics".into();
    let mut instance = floor.instance();
    let err = instance.concurrency(&panicking).unwrap_err();
    let PolicyError::Trap { hook, message, .. } = &err else {
        panic!("expected a trap: {err}")
    };
    assert_eq!(*hook, Hook::Concurrency);
    support::assert_says(
        message,
        &[
            "panicked at ",
            "src/lib.rs:",
            "asked to panic on node floor-panics",
        ],
    );
    // A fresh instance answers again; its allocator and panic state start over.
    assert_eq!(instance.concurrency(&synth::node(false)).unwrap(), 1);
    let err = instance.concurrency(&panicking).unwrap_err();
    assert!(err.to_string().contains("asked to panic"), "{err}");
}

#[test]
fn corrupt_bytes_are_refused() {
    let err = runtime().load(
        "corrupt.wasm",
        b"\0asm\x0d\0\x01\0garbage",
        None,
        Limits::default(),
    );
    let err = err.err().expect("refused");
    assert!(matches!(err, LoadError::Compile { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("policy module corrupt.wasm: not a valid WebAssembly component")
    );
    let err = runtime()
        .load("empty.wasm", b"", None, Limits::default())
        .err()
        .unwrap();
    assert!(matches!(err, LoadError::Compile { .. }), "{err}");
}

#[test]
fn a_module_of_another_contract_version_is_refused() {
    let (err, msg) = support::refused_as::<NodeContract>("pinset_test_policy_future_contract");
    assert!(matches!(err, LoadError::Contract { .. }), "{msg}");
    support::assert_says(
        &msg,
        &[
            "pinset:policy/decisions@0.2.0",
            "pinset:policy/decisions@0.1.0",
        ],
    );
}

/// A module built from a WIT that differs from the host's under the same version (one more
/// column in `images`) is refused when it loads, naming the function and the record field that
/// differs — not trapped and replaced on every call.
#[test]
fn a_module_whose_types_differ_from_the_host_s_is_refused_naming_the_function_and_field() {
    let (err, msg) = support::refused_as::<NodeContract>("pinset_test_policy_mismatch");
    assert!(matches!(err, LoadError::Mismatch { .. }), "{msg}");
    support::assert_says(&msg, &["function `admit`", "pinset:policy/decisions@0.1.0"]);
    assert!(
        msg.contains("field images: expected record of 11 fields, found 12"),
        "the field is named: {msg}"
    );
}

#[test]
fn the_sha256_pin_is_enforced() {
    let path = component("pinset_policy_default");
    let module = runtime().load_file(&path, None, Limits::default()).unwrap();
    let good = module.sha256().to_string();
    assert!(
        runtime()
            .load_file(&path, Some(&good.to_uppercase()), Limits::default())
            .is_ok()
    );
    let wrong = format!(
        "{}{}",
        &good[..63],
        if good.ends_with('0') { "1" } else { "0" }
    );
    let err = runtime()
        .load_file(&path, Some(&wrong), Limits::default())
        .err()
        .unwrap();
    assert!(matches!(err, LoadError::Sha256Mismatch { .. }), "{err}");
    assert!(err.to_string().contains(&good) && err.to_string().contains(&wrong));
    let err = runtime()
        .load_file(&path, Some("abc"), Limits::default())
        .err()
        .unwrap();
    assert!(matches!(err, LoadError::BadSha256 { .. }), "{err}");
}

#[test]
fn a_missing_file_is_named() {
    let err = runtime()
        .load_file(
            std::path::Path::new("/nonexistent/policy.wasm"),
            None,
            Limits::default(),
        )
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("/nonexistent/policy.wasm"),
        "{err}"
    );
}

/// The agent's way of loading: the module is compiled by `pinset compile-policy` in a child
/// process and only the artifact is loaded here.
fn child_runtime(exe: &str) -> WasmRuntime {
    bounded_child_runtime(ChildCompiler::new(exe))
}

fn bounded_child_runtime(child: ChildCompiler) -> WasmRuntime {
    WasmRuntime::with_compiler(Compiler::Subprocess(child)).expect("runtime")
}

#[test]
fn a_module_compiled_in_a_child_process_decides_as_one_compiled_here() {
    let child = child_runtime(support::PINSET);
    for stem in [
        "pinset_policy_default",
        "pinset_policy_smallest_first",
        "pinset_policy_admit_what_fits",
    ] {
        let here = runtime()
            .load_file(&component(stem), None, Limits::default())
            .unwrap();
        let there = child
            .load_file(&component(stem), None, Limits::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(here.sha256(), there.sha256());
        let (mut a, mut b) = (here.instance(), there.instance());
        for seed in 0..4 {
            let request = synth::request(40, seed);
            let admission = a.admit(&request).unwrap();
            assert_eq!(admission, b.admit(&request).unwrap(), "{stem}");
            let images = &request.images;
            assert_eq!(
                a.order(&request.node, images).unwrap(),
                b.order(&request.node, images).unwrap(),
                "{stem}"
            );
            assert_eq!(
                a.concurrency(&request.node).unwrap(),
                b.concurrency(&request.node).unwrap(),
                "{stem}"
            );
        }
    }
}

/// The agent's compiled cache across a restart: the module the child compiled is kept, and the
/// next process's runtime (same engine, no compiler of its own) loads it without a compiler —
/// here one that cannot run; a module not in the cache is then a compiler error naming it.
#[test]
fn a_module_the_child_compiled_is_kept_and_loaded_by_the_next_agent_without_compiling() {
    let cache = tempfile::tempdir().unwrap();
    let with_cache = |exe: &str| child_runtime(exe).with_compiled_cache(cache.path().into());
    let default = component("pinset_policy_default");
    let first = with_cache(support::PINSET)
        .load_file(&default, None, Limits::default())
        .unwrap();
    let no_compiler = with_cache("/nonexistent/pinset");
    let next = no_compiler
        .load_file(&default, None, Limits::default())
        .unwrap_or_else(|e| panic!("not loaded from the cache: {e}"));
    assert_eq!(first.sha256(), next.sha256());
    let request = synth::request(40, 1);
    assert_eq!(
        first.instance().admit(&request).unwrap(),
        next.instance().admit(&request).unwrap()
    );
    let other = component("pinset_policy_smallest_first");
    let Err(e) = no_compiler.load_file(&other, None, Limits::default()) else {
        panic!("compiled without a compiler");
    };
    let e = e.to_string();
    support::assert_says(&e, &["/nonexistent/pinset", "smallest_first"]);
}

#[test]
fn the_sandbox_holds_for_a_module_compiled_in_a_child_process() {
    let child = child_runtime(support::PINSET);
    let hostile = child
        .load_file(
            &component("pinset_test_policy_hostile"),
            None,
            Limits::default(),
        )
        .unwrap();
    let started = Instant::now();
    let err = hostile.instance().concurrency(&node("loop")).unwrap_err();
    assert!(matches!(err, PolicyError::Deadline { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let err = hostile.instance().concurrency(&node("alloc")).unwrap_err();
    assert!(matches!(err, PolicyError::MemoryCap { .. }), "{err}");
}

#[test]
fn a_child_compiler_that_fails_is_reported_with_the_module_and_the_cause() {
    let child = child_runtime(support::PINSET);
    let err = child
        .load(
            "corrupt.wasm",
            b"\0asm\x0d\0\x01\0garbage",
            None,
            Limits::default(),
        )
        .err()
        .expect("refused");
    assert!(matches!(err, LoadError::Compile { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("policy module corrupt.wasm: not a valid WebAssembly component"),
        "{err}"
    );
    let bytes = std::fs::read(component("pinset_policy_default")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = |name: &str, body: &str| {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    };
    for (exe, cause) in [
        ("/nonexistent/pinset".to_string(), "cannot start it"),
        (
            script("fails", "echo 'out of memory' >&2; exit 1"),
            "it ended with exit status: 1: out of memory",
        ),
        (script("killed", "kill -9 $$"), "it ended with signal: 9"),
        // Fills its stderr pipe several times over: read while it writes, quoted in part.
        (
            script("noisy", "head -c 300000 /dev/zero | tr '\\0' x >&2; exit 3"),
            "it ended with exit status: 3: xxxx",
        ),
        // Echoes the module back: wasmtime refuses what is not one of its artifacts.
        (script("echoes", "cat"), "its artifact does not load"),
    ] {
        let err = child_runtime(&exe)
            .load("default.wasm", &bytes, None, Limits::default())
            .err()
            .expect("refused");
        let msg = err.to_string();
        assert!(matches!(err, LoadError::Compiler { .. }), "{msg}");
        assert!(msg.starts_with("policy module default.wasm: "), "{msg}");
        support::assert_says(&msg, &[&exe, cause]);
        assert!(msg.len() < 4096, "the child's message is quoted in part");
    }
}

/// A module whose compilation costs far more than its size (Cranelift: ~10 µs and ~1 KiB a
/// value) is refused as too costly to compile at the child's memory bound or its deadline,
/// with the bound and its flag named, and in about the deadline's time; the default policy
/// compiles under both bounds (the test above).
#[test]
fn a_module_too_costly_to_compile_is_refused_at_the_childs_bounds() {
    let costly = support::costly_component(200_000);
    assert!(costly.len() < 1 << 20, "{} bytes", costly.len());
    let bounded = |deadline: Duration, memory_mib: u64| {
        let mut child = ChildCompiler::new(support::PINSET);
        (child.deadline, child.memory_bytes) = (deadline, memory_mib << 20);
        bounded_child_runtime(child)
    };
    let started = Instant::now();
    let e = bounded(Duration::from_secs(60), 64)
        .load("costly.wasm", &costly, None, Limits::default())
        .err()
        .expect("refused");
    assert!(matches!(e, LoadError::TooCostly { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "policy module costly.wasm: too costly to compile: compiling it needs more than 64 MiB \
         of memory (--policy-compile-memory-mib)"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );

    let slow = support::costly_component(1_000_000);
    let started = Instant::now();
    let e = bounded(Duration::from_secs(1), 4096)
        .load("slow.wasm", &slow, None, Limits::default())
        .err()
        .expect("refused");
    let took = started.elapsed();
    assert!(matches!(e, LoadError::TooCostly { .. }), "{e}");
    assert!(
        e.to_string()
            .ends_with("compiling it took longer than 1 s (--policy-compile-seconds)"),
        "{e}"
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[test]
fn a_module_over_the_size_limit_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.wasm");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(17 << 20).unwrap();
    let e = runtime()
        .load_file(&big, None, Limits::default())
        .err()
        .expect("refused");
    assert!(matches!(e, LoadError::TooLarge { .. }), "{e}");
    let text = e.to_string();
    support::assert_says(
        &text,
        &[
            "big.wasm",
            &(17u64 << 20).to_string(),
            "--policy-max-module-mib",
        ],
    );
    // The limit is the caller's: a real module over a tiny limit is refused the same way.
    let tiny = Limits {
        max_module_bytes: 1024,
        ..Limits::default()
    };
    let e = runtime()
        .load_file(&component("pinset_policy_default"), None, tiny)
        .err()
        .expect("refused");
    assert!(matches!(e, LoadError::TooLarge { max: 1024, .. }), "{e}");
    // A device says no size and never ends: read to the limit, refused without a size.
    let e = runtime()
        .load_file(std::path::Path::new("/dev/zero"), None, Limits::default())
        .err()
        .expect("refused");
    assert!(matches!(e, LoadError::TooLarge { bytes: None, .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "policy module /dev/zero: over the limit of 16777216 bytes (--policy-max-module-mib)"
    );
}

#[test]
fn a_policy_that_waits_through_wasi_is_stopped_at_once() {
    let mut g = Guarded::of(hostile());
    let n = node("sleep");
    let started = Instant::now();
    assert_eq!(g.concurrency(&n), 5, "the reference's answer");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let f = g.take_fallbacks();
    assert_eq!(f.len(), 1);
    assert!(f[0].message.contains(pinset_policy::NO_WAITING), "{}", f[0]);
}

/// The smoke test a module passes before a node swaps to it: every hostile mode that costs a
/// fallback fails it, naming the module and the hook; the module's good behaviour passes.
#[test]
fn the_smoke_test_refuses_every_misbehaviour_naming_the_hook() {
    let with_mode = |mode: &str| {
        let mut request = synth::request(20, 3);
        request.node = node(mode);
        request
    };
    let pressure = Pressure::default();
    let info = pinset_policy::smoke_test(hostile(), (&with_mode("none"), &pressure)).unwrap();
    assert_eq!(info.name, "hostile");
    for (mode, hook) in [
        ("trap-order", Hook::Order),
        ("trap", Hook::Admit),
        ("loop", Hook::Admit),
        ("non-permutation", Hook::Order),
        ("concurrency-zero", Hook::Concurrency),
        ("throttle-year", Hook::Throttle),
        ("bad-subset", Hook::Admit),
    ] {
        let started = Instant::now();
        let fallback =
            pinset_policy::smoke_test(hostile(), (&with_mode(mode), &pressure)).expect_err(mode);
        assert_eq!(fallback.hook, hook, "{mode}: {fallback}");
        assert!(
            fallback.message.contains("hostile") && fallback.message.contains(hook.as_str()),
            "{mode}: {fallback}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{mode} stalled"
        );
    }
}
