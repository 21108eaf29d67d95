//! The node pipeline end to end against the in-process CRI service (a real gRPC server on a unix
//! socket) with injected faults, real Wasm policies and the CRI-O drop-in back end on real files.

use crate::support;
use crate::support::wasm_runtime as runtime;

use pinset_core::desired::{self, Desired, NodeInfo, PinnedImageSet};
use pinset_core::status::NodeStatus;
use pinset_cri_sim::{Fault, SimConfig, SimImage, SimServer, SimulatedRuntime};
use pinset_node::cri::client::{CriClient, CriConfig};
use pinset_node::executor::Backoff;
use pinset_node::pin::crio::{self, CrioPins};
use pinset_node::{Reconciler, Report};
use pinset_policy::{EMBEDDED_DEFAULT, Limits, PolicyModule};
use pinset_policy_sdk::{MIB, Pressure};
use pinset_registry::size::{Cached, ImageSize, TableSizer};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn default_policy() -> PolicyModule {
    runtime()
        .load(
            "embedded:default",
            EMBEDDED_DEFAULT,
            None,
            Limits::default(),
        )
        .unwrap()
}

fn image(n: u32) -> String {
    format!("registry.test/app/img{n}@sha256:{n:064x}")
}

fn set(name: &str, role: &str, generation: i64, images: &[u32]) -> PinnedImageSet {
    let images: Vec<String> = images.iter().map(|&n| image(n)).collect();
    PinnedImageSet {
        generation,
        ..PinnedImageSet::for_role(name, role, &images)
    }
}

fn node(role: &str) -> NodeInfo {
    NodeInfo {
        name: format!("{role}-0"),
        labels: [(format!("node-role.kubernetes.io/{role}"), String::new())].into(),
        ready: true,
        disk_pressure: false,
        allocatable_ephemeral_bytes: Some(200 << 30),
    }
}

struct Bed {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    drop_in: PathBuf,
    sim: SimulatedRuntime,
    server: Option<SimServer>,
    reconciler: Reconciler<TableSizer, CrioPins>,
    policy: PolicyModule,
}

const FAST: Backoff = Backoff {
    attempts: 5,
    first: Duration::from_millis(5),
    cap: Duration::from_millis(20),
};

/// `images` of `size` each in a simulated registry pulled at `bandwidth` bytes/s onto `disk`.
async fn bed(images: u32, size: u64, bandwidth: u64, disk: u64, policy: PolicyModule) -> Bed {
    let dir = tempfile::tempdir().unwrap();
    let drop_in_dir = dir.path().join("crio.conf.d");
    let drop_in = drop_in_dir.join(crio::DROP_IN);
    let sim = SimulatedRuntime::new(SimConfig {
        registry: (0..images)
            .map(|n| SimImage {
                reference: image(n),
                size,
            })
            .collect(),
        bandwidth,
        disk_capacity: disk,
        pin_drop_in: Some(drop_in.clone()),
    });
    let socket = dir.path().join("cri.sock");
    let server = sim.serve(&socket).await.unwrap();
    let table = (0..images)
        .map(|n| {
            (
                image(n),
                ImageSize {
                    layers: vec![(format!("sha256:layer{n}"), size)],
                    endpoint: None,
                },
            )
        })
        .collect();
    let cri = CriClient::new(CriConfig {
        endpoint: server.endpoint(),
        connect_timeout: Duration::from_millis(500),
        call_timeout: Duration::from_secs(5),
        pull_timeout: Duration::from_secs(60),
    })
    .unwrap();
    let reload = pinset_node::pin::crio::Reload::Command(vec![
        "sh".into(),
        "-c".into(),
        format!("echo reload >> {}", dir.path().join("reloads").display()),
    ]);
    let reconciler = Reconciler::new(cri, CrioPins::new(&drop_in_dir, reload))
        .with_sizer(Arc::new(Cached::new(TableSizer { table })))
        .with_backoff(FAST)
        .with_pressure(Pressure::default);
    Bed {
        _dir: dir,
        socket,
        drop_in,
        sim,
        server: Some(server),
        reconciler,
        policy,
    }
}

impl Bed {
    async fn run(&self, desired: &Desired, node: &NodeInfo, status: &mut NodeStatus) -> Report {
        let cancel = CancellationToken::new();
        self.try_run(desired, node, status, cancel).await.unwrap()
    }

    /// A reconcile with the bed's policy until `cancel`, which may fail.
    async fn try_run(
        &self,
        desired: &Desired,
        node: &NodeInfo,
        status: &mut NodeStatus,
        cancel: CancellationToken,
    ) -> Result<Report, pinset_node::ReconcileError> {
        let decisions = support::decisions(&self.policy);
        self.reconciler
            .reconcile(desired, node, decisions, status, cancel, None)
            .await
    }

    fn pinned(&self) -> Vec<String> {
        std::fs::read_to_string(&self.drop_in)
            .map(|s| crio::parse(&s).unwrap())
            .unwrap_or_default()
    }

    fn reloads(&self) -> usize {
        std::fs::read_to_string(self._dir.path().join("reloads"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

fn desired_for(node: &NodeInfo, sets: &[PinnedImageSet]) -> Desired {
    desired::desired(node, &desired::standard_pools(), sets)
}

#[tokio::test]
async fn pulls_pins_and_a_rerun_costs_one_list_images() {
    let b = bed(6, MIB, 1 << 30, 1 << 40, default_policy()).await;
    let n = node("worker");
    let d = desired_for(
        &n,
        &[
            set("a", "worker", 1, &[0, 1, 2, 3]),
            set("b", "worker", 1, &[3, 4, 5]),
        ],
    );
    let mut status = NodeStatus::default();
    let r = b.run(&d, &n, &mut status).await;
    assert_eq!(
        r.outcome.pulled.len(),
        6,
        "image 3 is in two sets and pulled once"
    );
    assert_eq!(b.pinned().len(), 6);
    assert!(status.done() && status.degraded.is_none() && status.progressing.is_none());
    assert_eq!(status.progress.images_done, 6);
    assert_eq!(status.progress.bytes_done, 6 * MIB);
    let client = b.reconciler.cri();
    for i in 0..6 {
        assert!(
            client
                .image_status(&image(i))
                .await
                .unwrap()
                .unwrap()
                .pinned,
            "image {i} pinned"
        );
    }

    b.sim.reset_stats();
    let again = b.run(&d, &n, &mut status).await;
    let stats = b.sim.stats();
    assert!(again.outcome.pulled.is_empty());
    assert_eq!(stats.calls("ListImages"), 1, "{:?}", stats.calls);
    assert_eq!(
        stats.calls("PullImage") + stats.calls("ImageStatus"),
        0,
        "{:?}",
        stats.calls
    );
    assert_eq!(b.reloads(), 1, "unchanged pins are not rewritten");
}

#[tokio::test]
async fn control_plane_pulls_one_at_a_time_and_workers_five() {
    for (role, expected) in [("master", 1), ("worker", 5)] {
        let b = bed(8, 20 * MIB, 200 * MIB, 1 << 40, default_policy()).await;
        let n = node(role);
        let d = desired_for(&n, &[set("s", role, 1, &[0, 1, 2, 3, 4, 5, 6, 7])]);
        let mut status = NodeStatus::default();
        let r = b.run(&d, &n, &mut status).await;
        assert_eq!(r.plan.unwrap().concurrency, expected);
        assert_eq!(b.sim.stats().max_in_flight, expected, "{role}");
        if role == "master" {
            // Pulls never overlap, and each starts at least the 1 s throttle after the last ended.
            let pulls = b.sim.stats().pulls;
            for w in pulls.windows(2) {
                let gap = w[1].started.duration_since(w[0].ended.unwrap());
                assert!(gap >= Duration::from_millis(990), "gap {gap:?}");
            }
        }
    }
}

#[tokio::test]
async fn transient_failures_are_retried_and_permanent_ones_named() {
    let b = bed(3, MIB, 1 << 30, 1 << 40, default_policy()).await;
    let refused = |m: &str| Fault::Fail(tonic::Code::Unavailable, m.into());
    b.sim.inject(
        &image(0),
        [refused("connection reset"), refused("connection reset")],
    );
    b.sim.inject(
        &image(2),
        (0..5).map(|_| refused("registry.test: connection refused")),
    );
    let n = node("worker");
    let d = desired_for(
        &n,
        &[
            set("ok", "worker", 1, &[0, 1]),
            set("broken", "worker", 4, &[1, 2]),
        ],
    );
    let mut status = NodeStatus::default();
    let r = b.run(&d, &n, &mut status).await;
    assert_eq!(r.outcome.pulled.len(), 2);
    assert_eq!(r.outcome.failed.len(), 1);
    let pulls_of_2 = b
        .sim
        .stats()
        .pulls
        .iter()
        .filter(|p| p.reference == image(2))
        .count();
    assert_eq!(pulls_of_2, 5);
    assert_eq!(status.sets["ok"].current_generation, Some(1));
    let broken = &status.sets["broken"];
    assert_eq!(
        (broken.current_generation, broken.last_failed_generation),
        (None, Some(4))
    );
    let err = broken.last_failed_generation_error.as_deref().unwrap();
    support::assert_says(err, &[&image(2), "connection refused"]);
    assert!(
        status
            .degraded
            .as_deref()
            .unwrap()
            .contains("PinnedImageSet broken")
    );
    assert_eq!(
        b.pinned(),
        vec![image(0), image(1)],
        "only complete sets are pinned"
    );
}

#[tokio::test]
async fn a_full_disk_drains_the_queue_at_once_and_names_the_image() {
    // Room for two of five 10 MiB images; the policy admits (allocatable is large).
    let b = bed(5, 10 * MIB, 1 << 30, 25 * MIB, default_policy()).await;
    let n = node("master");
    let d = desired_for(&n, &[set("s", "master", 1, &[0, 1, 2, 3, 4])]);
    let mut status = NodeStatus::default();
    let started = Instant::now();
    let r = b.run(&d, &n, &mut status).await;
    assert_eq!(r.outcome.pulled.len(), 2);
    assert_eq!(r.outcome.failed.len(), 1);
    assert_eq!(r.outcome.drained, vec![image(3), image(4)]);
    assert_eq!(
        b.sim.stats().calls("PullImage"),
        3,
        "no retry of a full disk"
    );
    // Two 1 s throttles before the failing pull, none after it.
    assert!(
        started.elapsed() < Duration::from_millis(2_900),
        "{:?}",
        started.elapsed()
    );
    let err = status.sets["s"]
        .last_failed_generation_error
        .clone()
        .unwrap();
    support::assert_says(
        &err,
        &[
            &image(2),
            "no space left on device",
            &image(3),
            "the disk filled up",
        ],
    );
    assert!(b.pinned().is_empty());
}

#[tokio::test]
async fn a_spec_change_cancels_in_flight_pulls_within_250ms_and_the_next_generation_completes() {
    let b = bed(10, MIB, 1 << 30, 1 << 40, default_policy()).await;
    for n in 0..5 {
        b.sim.inject(&image(n), [Fault::Hang]);
    }
    let n = node("worker");
    let gen1 = desired_for(&n, &[set("s", "worker", 1, &[0, 1, 2, 3, 4, 5, 6, 7])]);
    let cancel = CancellationToken::new();
    let mut status = NodeStatus::default();
    let watcher = {
        let (sim, cancel) = (b.sim.clone(), cancel.clone());
        tokio::spawn(async move {
            while sim.stats().in_flight < 5 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let at = Instant::now();
            cancel.cancel();
            at
        })
    };
    let r = b.try_run(&gen1, &n, &mut status, cancel).await.unwrap();
    let cancelled_at = watcher.await.unwrap();
    let returned = cancelled_at.elapsed();
    assert!(r.cancelled);
    assert!(
        returned < Duration::from_millis(250),
        "reconcile returned {returned:?} after cancel"
    );
    // The server saw every in-flight pull abandoned, and no queued pull started.
    let deadline = Instant::now() + Duration::from_millis(250);
    while b.sim.stats().in_flight > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let stats = b.sim.stats();
    assert_eq!(
        stats.in_flight, 0,
        "in-flight pulls were abandoned at the server"
    );
    assert_eq!(stats.pulls.iter().filter(|p| p.abandoned).count(), 5);
    assert_eq!(stats.calls("PullImage"), 5);
    assert!(
        b.pinned().is_empty(),
        "nothing pinned by a cancelled generation"
    );

    let gen2 = desired_for(&n, &[set("s", "worker", 2, &[5, 6, 7, 8, 9])]);
    let r = b.run(&gen2, &n, &mut status).await;
    assert_eq!(r.outcome.pulled.len(), 5);
    assert_eq!(status.sets["s"].current_generation, Some(2));
}

#[tokio::test]
async fn runtime_restart_reconnects_and_removed_sets_are_unpinned_not_deleted() {
    let mut b = bed(4, MIB, 1 << 30, 1 << 40, default_policy()).await;
    let n = node("worker");
    let both = desired_for(
        &n,
        &[
            set("a", "worker", 1, &[0, 1]),
            set("b", "worker", 1, &[1, 2, 3]),
        ],
    );
    let mut status = NodeStatus::default();
    b.run(&both, &n, &mut status).await;
    assert_eq!(b.pinned().len(), 4);

    // The runtime goes away: a clear error naming the socket.
    b.server.take().unwrap().shutdown().await;
    let cancel = CancellationToken::new();
    let err = b.try_run(&both, &n, &mut status, cancel).await.unwrap_err();
    assert!(
        err.to_string().contains(&b.socket.display().to_string()),
        "{err}"
    );
    assert!(status.degraded.is_some());

    // It comes back on the same socket: the same client reconnects.
    b.server = Some(b.sim.serve(&b.socket).await.unwrap());
    let only_b = desired_for(&n, &[set("b", "worker", 1, &[1, 2, 3])]);
    let r = b.run(&only_b, &n, &mut status).await;
    assert_eq!(r.pin.unwrap().unpinned, vec![image(0)]);
    assert_eq!(b.pinned(), vec![image(1), image(2), image(3)]);
    let img0 = b
        .reconciler
        .cri()
        .image_status(&image(0))
        .await
        .unwrap()
        .expect("still present");
    assert!(!img0.pinned);
    assert!(status.degraded.is_none() && !status.sets.contains_key("a"));
}

#[tokio::test]
async fn a_hostile_policy_is_contained_and_the_reference_pulls() {
    let path = support::policy_dir().join("pinset_test_policy_hostile.wasm");
    let limits = Limits {
        deadline: Duration::from_millis(20),
        ..Limits::default()
    };
    let hostile = runtime().load_file(&path, None, limits).unwrap();
    let b = bed(3, MIB, 1 << 30, 1 << 40, hostile).await;
    let mut n = node("worker");
    n.labels.insert("pinset.test/hostile".into(), "loop".into());
    let d = desired_for(&n, &[set("s", "worker", 1, &[0, 1, 2])]);
    let mut status = NodeStatus::default();
    let r = b.run(&d, &n, &mut status).await;
    assert_eq!(r.outcome.pulled.len(), 3);
    assert_eq!(
        r.plan.unwrap().concurrency,
        5,
        "the reference's answer for a worker"
    );
    assert!(status.done());
    assert!(
        status.policy_fallbacks.len() >= 3,
        "{:?}",
        status.policy_fallbacks
    );
    assert!(
        status
            .policy_fallbacks
            .iter()
            .all(|f| f.contains("deadline")),
        "{:?}",
        status.policy_fallbacks
    );
}

#[tokio::test]
async fn a_rejected_admission_pulls_nothing_and_says_why() {
    let b = bed(3, 4 << 30, 1 << 30, 1 << 40, default_policy()).await;
    let mut n = node("worker");
    n.allocatable_ephemeral_bytes = Some(20 << 30);
    let d = desired_for(&n, &[set("big", "worker", 3, &[0, 1, 2])]);
    let mut status = NodeStatus::default();
    let r = b.run(&d, &n, &mut status).await;
    assert!(r.plan.unwrap().rejected());
    assert_eq!(b.sim.stats().calls("PullImage"), 0);
    let err = status.sets["big"]
        .last_failed_generation_error
        .clone()
        .unwrap();
    support::assert_says(&err, &["not admitted", "not enough disk"]);
}

/// Every class of hostile module through the reconcile on a multi-threaded runtime, as the
/// agent runs it: printing (stderr, stdout, a panic's message), waiting through WASI, probing
/// WASI, flooding or forging the log, a giant reason. None crashes or stalls the reconcile; a
/// failed hook is answered by the reference and reported; what reaches the status is bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_modules_are_contained_on_the_async_path() {
    let path = support::policy_path("pinset_test_policy_hostile");
    let limits = Limits {
        deadline: Duration::from_millis(50),
        ..Limits::default()
    };
    let hostile = runtime().load_file(&path, None, limits).unwrap();
    for mode in support::HOSTILE_MODES {
        let b = bed(3, MIB, 1 << 30, 1 << 40, hostile.clone()).await;
        let mut n = node("worker");
        n.labels.insert("pinset.test/hostile".into(), mode.into());
        let d = desired_for(&n, &[set("s", "worker", 1, &[0, 1, 2])]);
        let mut status = NodeStatus::default();
        let started = Instant::now();
        let r = b.run(&d, &n, &mut status).await;
        let ctx = format!("mode {mode}: {:?} {status:?}", started.elapsed());
        assert!(started.elapsed() < Duration::from_secs(10), "{ctx}");
        let fallbacks = status.policy_fallbacks.join("\n");
        if mode == "giant-reason" {
            assert!(r.plan.unwrap().rejected(), "{ctx}");
            let err = status.sets["s"]
                .last_failed_generation_error
                .clone()
                .unwrap();
            assert!(err.len() < 8 << 10, "{mode}: error of {} bytes", err.len());
            assert!(
                !err.contains('\n'),
                "{mode}: a raw newline reached the status"
            );
            continue;
        }
        assert_eq!(r.outcome.pulled.len(), 3, "{ctx}");
        assert!(status.done(), "{ctx}");
        match mode {
            "trap" => assert!(fallbacks.contains("panicked"), "{ctx}"),
            "sleep" => assert!(fallbacks.contains(pinset_policy::NO_WAITING), "{ctx}"),
            _ => assert!(fallbacks.is_empty(), "printing is no failure: {ctx}"),
        }
    }
}

/// Pins lost behind pinset's back — the CRI-O drop-in deleted or edited, a pinned image removed —
/// are found by the next reconcile, repaired within it (the image pulled again through the
/// policy, the drop-in rewritten and CRI-O reloaded), and reported.
#[tokio::test]
async fn lost_pins_are_repaired_within_one_reconcile_and_reported() {
    let b = bed(3, MIB, 1 << 30, 1 << 40, default_policy()).await;
    let n = node("worker");
    let d = desired_for(&n, &[set("s", "worker", 1, &[0, 1, 2])]);
    let mut status = NodeStatus::default();
    let first = b.run(&d, &n, &mut status).await;
    assert!(status.done() && first.drift.is_empty() && status.pin_drift.is_none());
    let written = std::fs::read_to_string(&b.drop_in).unwrap();

    // The drop-in deleted: CRI-O (here, the simulated runtime reading it on every call) no
    // longer pins the images.
    std::fs::remove_file(&b.drop_in).unwrap();
    let r = b.run(&d, &n, &mut status).await;
    let kinds: Vec<&str> = r.drift.iter().map(|d| d.kind.as_str()).collect();
    assert!(kinds.contains(&"dropin-deleted"), "{:?}", r.drift);
    assert_eq!(
        kinds.iter().filter(|k| **k == "pin-removed").count(),
        3,
        "{:?}",
        r.drift
    );
    assert_eq!(std::fs::read_to_string(&b.drop_in).unwrap(), written);
    assert!(status.done(), "{status:?}");
    let said = status.pin_drift.clone().unwrap();
    support::assert_says(
        &said,
        &["repaired 4 lost pin(s) (3 pin-removed, 1 dropin-deleted)"],
    );

    // Edited by hand: rewritten, reported.
    std::fs::write(&b.drop_in, "[crio.image]\npinned_images = []\n").unwrap();
    let r = b.run(&d, &n, &mut status).await;
    assert!(
        r.drift.iter().any(|d| d.kind.as_str() == "dropin-edited"),
        "{:?}",
        r.drift
    );
    assert_eq!(std::fs::read_to_string(&b.drop_in).unwrap(), written);

    // A pinned image removed: pulled again (the policy plans it), pinned, reported.
    b.sim.reset_stats();
    b.reconciler.cri().remove_image(&image(1)).await.unwrap();
    let r = b.run(&d, &n, &mut status).await;
    assert_eq!(r.outcome.pulled, vec![image(1)]);
    assert_eq!(r.drift.len(), 1, "{:?}", r.drift);
    assert_eq!(r.drift[0].kind.as_str(), "image-deleted");
    assert_eq!(r.drift[0].object, image(1));
    assert_eq!(b.sim.stats().calls("PullImage"), 1);
    assert!(status.done());

    // Nothing lost: nothing reported, and the status says so.
    let r = b.run(&d, &n, &mut status).await;
    assert!(
        r.drift.is_empty() && status.pin_drift.is_none(),
        "{:?}",
        r.drift
    );
}
