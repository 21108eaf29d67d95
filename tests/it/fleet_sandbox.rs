//! Fleet modules (`wit/fleet/fleet.wit`) compiled from `policies/` and `tests/policies/`: the
//! contracts load side by side (node-only, fleet-only and both), and every misbehaviour of a
//! fleet module is contained by the guard — the default fleet policy answers, the failure named.

use crate::support;
use crate::support::wasm_runtime as runtime;

use pinset_policy::{
    Decided, Described, FleetContract, FleetInstance, FleetModule, Guarded, Hook, Limits,
    LoadError, NodeContract, PolicyError, PolicyInstance,
};
use pinset_policy_sdk::{FleetNode, FleetPool, Phase, RolloutRequest};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn component(stem: &str) -> PathBuf {
    support::policy_path(stem)
}

fn fleet(stem: &str) -> FleetModule {
    runtime()
        .load_file_as::<pinset_policy::FleetContract>(&component(stem), None, Limits::default())
        .unwrap_or_else(|e| panic!("{stem}: {e}"))
}

/// A pool of `n` ready nodes, none granted, the hostile module's mode in an annotation.
fn pool(n: usize, mode: &str, max_pulling: Option<u32>) -> RolloutRequest {
    RolloutRequest {
        pool: FleetPool {
            name: "worker".into(),
            annotations: vec![("pinset.test/hostile-fleet".into(), mode.into())],
            max_pulling,
        },
        nodes: (0..n)
            .map(|i| FleetNode::waiting(format!("w-{i}")))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn node_only_fleet_only_and_both_modules_load_for_what_they_export() {
    // A node policy of the unchanged pinset:policy@0.1.0 contract still loads as one.
    let node_only = component("pinset_policy_smallest_first");
    runtime()
        .load_file(&node_only, None, Limits::default())
        .expect("a node-only module loads for the node");
    let (err, msg) = support::refused_as::<FleetContract>("pinset_policy_smallest_first");
    // It is the other kind of policy, not an old one: the error says its role, not "rebuild".
    assert!(
        matches!(err, LoadError::OtherContract { .. })
            && msg.contains("pinset:fleet/rollout@0.2.1")
            && msg.contains("pinset:policy/decisions@0.1.0")
            && msg.contains("node pull policy")
            && !msg.contains("rebuild"),
        "{msg}"
    );
    // A fleet-only module is refused as a node policy, and loads as a fleet policy.
    let (err, msg) = support::refused_as::<NodeContract>("pinset_policy_zone_by_zone");
    assert!(
        matches!(err, LoadError::OtherContract { .. })
            && msg.contains("pinset:policy/decisions@0.1.0")
            && msg.contains("--fleet-policy")
            && !msg.contains("rebuild"),
        "{msg}"
    );
    let info = fleet("pinset_policy_zone_by_zone")
        .instance()
        .info()
        .unwrap();
    assert_eq!(info.name, "zone-by-zone");
    // The default module exports both, compiled once and bound to each contract; its fleet
    // answer is the native default's.
    let compiled = runtime()
        .compile_module(
            pinset_policy::EMBEDDED_DEFAULT_NAME,
            pinset_policy::EMBEDDED_DEFAULT,
            None,
            Limits::default(),
        )
        .unwrap();
    let node = runtime()
        .bind::<pinset_policy::NodeContract>(&compiled)
        .unwrap();
    let default = runtime()
        .bind::<pinset_policy::FleetContract>(&compiled)
        .unwrap();
    assert_eq!(node.sha256(), compiled.sha256());
    assert_eq!(default.sha256(), compiled.sha256());
    let facts = pinset_policy::NodeFacts::default();
    assert_eq!(node.instance().concurrency(&facts).unwrap(), 5);
    let request = pool(30, "", None);
    let wasm = default.instance().grant(&request).unwrap();
    let native = pinset_policy::Native::<FleetContract>::reference()
        .grant(&request)
        .unwrap();
    assert_eq!(wasm, native);
    assert_eq!(wasm.nodes, vec![0], "a canary first");
}

/// What the hostile fleet module does in each mode that the guard must contain: the failure's
/// kind, and words its message must hold.
const CONTAINED: [(&str, Option<u32>, &str, &str); 8] = [
    ("trap", None, "trap", "traps on purpose"),
    ("loop", None, "deadline", "deadline"),
    ("alloc", None, "memory", "memory cap"),
    ("sleep", None, "trap", pinset_policy::NO_WAITING),
    ("all", Some(1), "invalid", "over the pool's ceiling of 1"),
    ("out-of-range", None, "invalid", "names node 8 of 3"),
    ("twice", None, "invalid", "names node 0 twice"),
    ("max-pulls", None, "invalid", "max-pulls 1000"),
];

/// Modes whose answer stands: printing, probing the sandbox or flooding the log costs the module
/// nothing but what it wrote; the default's canary is granted, with the reason it gave.
const ANSWERED: [(&str, &str); 4] = [
    ("stdout", "canary"),
    ("stderr", "canary"),
    ("log-flood", "canary"),
    // No environment, no arguments, no directory: WASI as a policy gets it.
    ("probe", "env 0 args 0 root false"),
];

/// Every mode of the hostile fleet module asked through `decide`, a fresh instance each time.
fn every_misbehaviour_is_contained(decide: impl Fn(RolloutRequest) -> (Decided, Duration)) {
    for (mode, max_pulling, kind, says) in CONTAINED {
        let (decided, elapsed) = decide(pool(3, mode, max_pulling));
        let fallback = decided
            .fallback
            .unwrap_or_else(|| panic!("{mode}: no fallback"));
        assert_eq!(fallback.hook, Hook::Grant, "{mode}");
        assert_eq!(fallback.kind, kind, "{mode}: {}", fallback.message);
        assert!(
            fallback.message.contains(says) && fallback.message.contains("hostile"),
            "{mode}: {}",
            fallback.message
        );
        assert_eq!(decided.grant.nodes, vec![0], "{mode}: the default's canary");
        assert_eq!(decided.policy, "builtin:default-fleet");
        assert!(elapsed < Duration::from_secs(2), "{mode}: took {elapsed:?}");
    }
    for (mode, reason) in ANSWERED {
        let (decided, elapsed) = decide(pool(3, mode, None));
        assert_eq!(decided.fallback, None, "{mode}");
        assert_eq!(decided.grant.nodes, vec![0], "{mode}");
        assert!(
            decided.grant.reason.contains(reason),
            "{mode}: {}",
            decided.grant.reason
        );
        assert!(elapsed < Duration::from_secs(2), "{mode}: took {elapsed:?}");
    }
    // A 4 MiB reason (1 000 times the cap): the grant stands, its reason arrives cut and
    // without a raw newline.
    let (decided, _) = decide(pool(3, "giant-reason", None));
    assert_eq!((decided.grant.nodes, decided.fallback), (vec![0], None));
    let reason = decided.grant.reason;
    assert!(
        reason.len() <= pinset_policy::MAX_REASON_BYTES + 8,
        "{} bytes",
        reason.len()
    );
    assert!(
        reason.starts_with("z\\nz\\n") && !reason.contains('\n'),
        "{reason:.40}"
    );
    // Without a ceiling, everyone at once is a valid strategy (the reference's).
    let (decided, _) = decide(pool(3, "all", None));
    assert_eq!(
        (decided.grant.nodes, decided.fallback),
        (vec![0, 1, 2], None)
    );
}

fn decide_here(request: RolloutRequest) -> (Decided, Duration) {
    let hostile = fleet("pinset_test_policy_hostile");
    let started = Instant::now();
    let decided = Guarded::of(&hostile).grant(&request);
    (decided, started.elapsed())
}

#[test]
fn every_misbehaviour_of_a_fleet_module_falls_back_to_the_default_and_is_named() {
    every_misbehaviour_is_contained(decide_here);
}

/// The controller asks from async code, on tokio's blocking threads: nothing the module does
/// there (print, wait, trap) may panic the runtime or hold it. The same asked on an async worker
/// itself, as a caller that forgot `spawn_blocking` would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_module_asked_from_async_code_is_contained_alike() {
    let handle = tokio::runtime::Handle::current();
    let on_blocking_thread = move |request: RolloutRequest| {
        handle.block_on(tokio::task::spawn_blocking(move || decide_here(request)))
    };
    tokio::task::spawn_blocking(move || {
        every_misbehaviour_is_contained(|r| on_blocking_thread(r).expect("no panic"))
    })
    .await
    .unwrap();
    tokio::spawn(async { every_misbehaviour_is_contained(decide_here) })
        .await
        .unwrap();
}

/// The hostile module's `echo` digest: FNV-1a (64 bits) of the `Debug` form of the rollout
/// the policy reads (the columns the host builds from `request`).
fn digest(request: &RolloutRequest) -> String {
    let text = format!("{:?}", pinset_policy_sdk::Rollout::from(request));
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{h:016x}")
}

#[test]
fn the_request_a_fleet_module_reads_is_the_one_the_host_was_given() {
    // A pool mid-rollout (labels in three zones, two sets, a failed node with its error, nodes
    // pulling for a while), plus the edges: a node without labels or sets, a non-ASCII name,
    // a set the node reports but the target lacks, and an empty error.
    let mut request = pinset_policy_bench::synth::fleet(300);
    request.pool.annotations = vec![("pinset.test/hostile-fleet".into(), "echo".into())];
    request.nodes.push(FleetNode {
        name: "zz-knoten-ü".into(),
        ..Default::default()
    });
    request.nodes[0].sets.push(pinset_policy_sdk::SetState {
        name: "gone".into(),
        desired_generation: -1,
        current_generation: Some(0),
        last_failed_generation: Some(i64::MAX),
        last_failed_error: Some(String::new()),
    });
    assert!(request.nodes.iter().any(|n| n.error().is_some()));
    let hostile = fleet("pinset_test_policy_hostile");
    let grant = hostile.instance().grant(&request).expect("echo answers");
    assert_eq!(grant.reason, digest(&request));
    // And the digest tells requests apart: one label changed is another request.
    let echoed = grant.reason;
    request.nodes[7].labels[0].1.push('x');
    assert_ne!(digest(&request), echoed);
}

#[test]
fn a_trapped_fleet_call_leaves_the_module_usable() {
    let hostile = fleet("pinset_test_policy_hostile");
    let mut instance = hostile.instance();
    let err = instance.grant(&pool(3, "trap", None)).unwrap_err();
    assert!(
        matches!(
            err,
            PolicyError::Trap {
                hook: Hook::Grant,
                ..
            }
        ),
        "{err}"
    );
    // Each call runs in a fresh instance: the next one answers.
    assert_eq!(instance.grant(&pool(3, "", None)).unwrap().nodes, vec![0]);
}

/// `decide` was added in pinset:fleet@0.2.1: a module built for 0.2.0 exports `grant` only,
/// still loads and is asked `grant` (its pool never holds by its word); a 0.2.1 module's hold
/// reaches the controller — the default's failed canary holds the pool by its own answer.
#[test]
fn a_fleet_module_built_for_0_2_0_keeps_loading_and_a_0_2_1_module_can_hold() {
    let old = fleet("pinset_test_policy_fleet_0_2_0");
    assert_eq!(old.instance().info().unwrap().name, "fleet-0.2.0");
    let d = Guarded::of(&old).grant(&pool(3, "", None));
    assert_eq!(d.fallback, None, "{:?}", d.fallback);
    assert_eq!(d.grant.nodes, vec![0]);
    assert_eq!(d.grant.reason, "built for 0.2.0: the first node");
    assert_eq!(d.grant.hold, None);

    let mut failed = pool(3, "", None);
    failed.nodes[0].granted = true;
    failed.nodes[0].phase = Phase::Failed;
    let default = runtime()
        .load_as::<pinset_policy::FleetContract>(
            pinset_policy::EMBEDDED_DEFAULT_NAME,
            pinset_policy::EMBEDDED_DEFAULT,
            None,
            Limits::default(),
        )
        .unwrap();
    let d = Guarded::of(&default).grant(&failed);
    assert_eq!(d.fallback, None, "{:?}", d.fallback);
    let hold = d.grant.hold.expect("a failed canary holds the pool");
    support::assert_says(&hold, &["canary node w-0 failed"]);
    assert!(d.grant.nodes.is_empty());
}

/// The check a fleet module passes before a running controller swaps to it: a grant on the
/// pool's request without a fallback. What traps, loops or answers nonsense fails it, naming
/// the module and the hook; the hostile module without its annotation passes.
#[test]
fn the_fleet_smoke_test_refuses_what_would_fall_back() {
    let hostile = fleet("pinset_test_policy_hostile");
    pinset_policy::smoke_test(&hostile, &pool(3, "none", None)).unwrap();
    for mode in ["trap", "loop", "alloc", "all"] {
        let request = pool(3, mode, Some(1));
        let fallback = pinset_policy::smoke_test(&hostile, &request).expect_err(mode);
        assert_eq!(fallback.hook, pinset_policy::Hook::Grant, "{mode}");
        assert!(fallback.message.contains("hostile"), "{mode}: {fallback}");
    }
}
