//! The node pipeline against a real containerd (1.7, CRI plugin) and a real registry, with images
//! built and pushed here and the real default Wasm policy: pull, pin (containerd's pin label),
//! no-op rerun, unpin on set removal, registry down, cancellation, containerd restart.

use crate::support;

use pinset_core::desired::{self, Desired, NodeInfo, PinnedImageSet};
use pinset_core::status::NodeStatus;
use pinset_node::Reconciler;
use pinset_node::executor::{Backoff, Event};
use pinset_node::pin::PinBackend;
use pinset_node::pin::containerd::ContainerdPins;
use pinset_registry::size::RegistrySizer;
use std::time::{Duration, Instant};

fn set(name: &str, generation: i64, images: &[String]) -> PinnedImageSet {
    PinnedImageSet {
        generation,
        ..PinnedImageSet::for_role(name, "worker", images)
    }
}

fn desired_of(node: &NodeInfo, sets: &[PinnedImageSet]) -> Desired {
    desired::desired(node, &desired::standard_pools(), sets)
}

/// Short waits so that five failing tries take well under a second.
const QUICK: Backoff = Backoff {
    attempts: 5,
    first: Duration::from_millis(20),
    cap: Duration::from_millis(100),
};

/// One reconcile of `d` on `node` with the default policy: no events, not cancelled.
async fn reconcile(
    reconciler: &Reconciler<RegistrySizer, ContainerdPins>,
    d: &Desired,
    node: &NodeInfo,
    status: &mut NodeStatus,
) -> Result<pinset_node::Report, pinset_node::ReconcileError> {
    support::reconcile_default(reconciler, d, node, status, None).await
}

/// Every one of `refs` is in the runtime, pinned.
async fn assert_pinned(reconciler: &Reconciler<RegistrySizer, ContainerdPins>, refs: &[String]) {
    for reference in refs {
        let image = reconciler.cri().image_status(reference).await.unwrap();
        assert!(image.is_some_and(|i| i.pinned), "{reference} is not pinned");
    }
}

/// A registry, a containerd pulling from it, and the node pipeline wired to both on the default
/// policy. Fields drop in order: the pipeline, then containerd, then the registry.
struct Bed {
    reconciler: Reconciler<RegistrySizer, ContainerdPins>,
    containerd: support::Containerd,
    registry: support::Registry,
}

impl Bed {
    /// `None`, after a loud message, where the bed cannot start and `PINSET_SKIP_BED` asked to
    /// skip (otherwise the test fails). Sizes come from the registry when `sizing`.
    fn start(backoff: Backoff, sizing: bool) -> Option<Bed> {
        Self::start_with_root_limit(backoff, sizing, None)
    }

    /// The same with containerd's root on a filesystem of `limit` bytes.
    fn start_with_root_limit(backoff: Backoff, sizing: bool, limit: Option<u64>) -> Option<Bed> {
        let registry = support::Registry::start()?;
        let containerd = support::Containerd::start_with_root_limit(&registry.host, limit)?;
        let reconciler = support::reconciler(&containerd, &registry.host, backoff, sizing);
        Some(Bed {
            reconciler,
            containerd,
            registry,
        })
    }
}

#[tokio::test]
async fn pulls_and_pins_into_real_containerd_then_unpins_a_removed_set() {
    let Some(bed) = Bed::start(Backoff::default(), true) else {
        return;
    };
    let (reconciler, containerd) = (&bed.reconciler, &bed.containerd);
    let client = bed.registry.client();
    let host = bed.registry.host.clone();
    let base = support::layer(10, 200_000);
    let mut refs = Vec::new();
    for (n, repo) in ["pinset/api", "pinset/web", "pinset/batch"]
        .iter()
        .enumerate()
    {
        let own = support::layer(20 + n as u64, 100_000 * (n + 1));
        let (digest, _) =
            support::push_image(&client, &host, repo, support::arch(), &[base.clone(), own]).await;
        refs.push(format!("{host}/{repo}@{digest}"));
    }
    let cri = reconciler.cri().clone();
    let node = support::node("worker");
    let both = desired_of(&node, &[set("a", 1, &refs[..2]), set("b", 1, &refs[1..])]);
    let mut status = NodeStatus::default();
    let report = reconcile(reconciler, &both, &node, &mut status)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", containerd.log()));
    assert_eq!(
        report.outcome.pulled.len(),
        3,
        "{report:?}\n{}",
        containerd.log()
    );
    assert!(status.done(), "{status:?}");
    // Sizes came from the registry: the policy's reason counts the shared base layer once.
    let reason = &report.plan.as_ref().unwrap().admission.reason;
    support::assert_says(reason, &["3 image(s) to pull"]);
    for r in &refs {
        let image = cri
            .image_status(r)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{r} present"));
        assert!(image.pinned, "{r} pinned");
    }

    let again = reconcile(reconciler, &both, &node, &mut status)
        .await
        .unwrap();
    assert!(again.outcome.pulled.is_empty());
    assert!(!again.pin.unwrap().applied, "nothing to change");

    let only_b = desired_of(&node, &[set("b", 1, &refs[1..])]);
    let r = reconcile(reconciler, &only_b, &node, &mut status)
        .await
        .unwrap();
    assert_eq!(r.pin.unwrap().unpinned, vec![refs[0].clone()]);
    let api = cri
        .image_status(&refs[0])
        .await
        .unwrap()
        .expect("unpinned, never deleted");
    assert!(!api.pinned);
    assert!(
        cri.image_status(&refs[1]).await.unwrap().unwrap().pinned,
        "still in set b"
    );
    assert!(cri.image_status(&refs[2]).await.unwrap().unwrap().pinned);
}

#[tokio::test]
async fn registry_down_fails_each_image_clearly_and_the_next_reconcile_completes() {
    let Some(bed) = Bed::start(QUICK, true) else {
        return;
    };
    let reconciler = &bed.reconciler;
    let refs = support::push_images(&bed.registry, "down", 2, 64_000, 40).await;
    let node = support::node("worker");
    let d = desired_of(&node, &[set("s", 1, &refs)]);
    bed.registry.stop();
    let mut status = NodeStatus::default();
    let r = reconcile(reconciler, &d, &node, &mut status).await.unwrap();
    assert_eq!(r.outcome.failed.len(), 2, "{r:?}");
    let err = status.sets["s"]
        .last_failed_generation_error
        .clone()
        .unwrap();
    support::assert_says(&err, &[&refs[0], &refs[1]]);
    assert!(
        err.contains("(after 5 attempts)"),
        "a down registry is retried: {err}"
    );
    assert!(status.degraded.is_some());
    assert!(
        r.plan
            .as_ref()
            .unwrap()
            .admission
            .reason
            .contains("2 image(s) of unknown size"),
        "the registry is down: sizes are unknown, not 0"
    );

    bed.registry.restart();
    let r = reconcile(reconciler, &d, &node, &mut status).await.unwrap();
    assert_eq!(r.outcome.pulled.len(), 2);
    assert!(status.done() && status.degraded.is_none());
    assert_pinned(reconciler, &refs).await;
}

/// `--pin auto` asks the runtime which it is: real containerd says `containerd`, and gets the
/// label back end.
#[tokio::test]
async fn pin_auto_picks_the_label_back_end_for_containerd() {
    let Some(bed) = Bed::start(QUICK, false) else {
        return;
    };
    let config = pinset_node::NodeConfig {
        sizing: false,
        ..pinset_node::NodeConfig::new(bed.containerd.endpoint())
    };
    let reconciler = config.connect().await.unwrap();
    assert_eq!(reconciler.pins().name(), "containerd");
    let version = reconciler.cri().version().await.unwrap();
    assert_eq!(version.runtime_name, "containerd", "{version:?}");
    // The runtime tells where its registry hosts are: the sizing follows the same mirrors.
    assert_eq!(
        reconciler.cri().registry_config_path().await,
        Some(bed.containerd.hosts_dir())
    );
}

/// A digest the registry does not have is not retried with the reference's schedule (1+2+4+8 s
/// of waits): the reconcile completes at once, and the set's error says the cause is permanent.
#[tokio::test]
async fn a_missing_digest_fails_at_once_and_says_it_is_permanent() {
    let Some(bed) = Bed::start(Backoff::default(), false) else {
        return;
    };
    let refs = support::push_images(&bed.registry, "present", 1, 64_000, 60).await;
    let missing = bed.registry.missing_image();
    let node = support::node("worker");
    let d = desired_of(&node, &[set("s", 1, &[refs[0].clone(), missing.clone()])]);
    let mut status = NodeStatus::default();
    let started = Instant::now();
    let r = reconcile(&bed.reconciler, &d, &node, &mut status)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", bed.containerd.log()));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}: {r:?}");
    assert_eq!(r.outcome.pulled, vec![refs[0].clone()]);
    let err = status.sets["s"]
        .last_failed_generation_error
        .clone()
        .unwrap();
    support::assert_says(&err, &[&missing, "not found", "permanent"]);
}

#[tokio::test]
async fn cancelling_stops_pulls_in_flight_in_real_containerd() {
    let Some(bed) = Bed::start(Backoff::default(), false) else {
        return;
    };
    let reconciler = &bed.reconciler;
    let refs = support::push_images(&bed.registry, "big", 3, 64 << 20, 60).await;
    let node = support::node("worker");
    let gen1 = desired_of(&node, &[set("s", 1, &refs)]);
    let mut status = NodeStatus::default();
    let (r, returned_after) = support::reconcile_cancelled(
        reconciler,
        (&gen1, &node),
        support::default_decisions(),
        &mut status,
        (3, Duration::from_millis(30)),
    )
    .await;
    let returned_after = returned_after.expect("three pulls started");
    assert!(r.cancelled);
    assert!(returned_after < Duration::from_millis(250));
    assert!(
        status.sets["s"].current_generation.is_none(),
        "a cancelled generation is not done"
    );

    // The next generation completes from a fresh snapshot.
    let gen2 = desired_of(&node, &[set("s", 2, &refs[..1])]);
    let r = reconcile(reconciler, &gen2, &node, &mut status)
        .await
        .unwrap();
    assert!(r.outcome.failed.is_empty());
    assert_eq!(status.sets["s"].current_generation, Some(2));
    assert!(
        reconciler
            .cri()
            .image_status(&refs[0])
            .await
            .unwrap()
            .unwrap()
            .pinned
    );
}

#[tokio::test]
async fn a_containerd_restart_mid_run_is_retried_and_the_reconcile_completes() {
    let backoff = Backoff {
        attempts: 5,
        first: Duration::from_millis(250),
        cap: Duration::from_secs(2),
    };
    let Some(Bed {
        reconciler,
        containerd,
        registry,
    }) = Bed::start(backoff, false)
    else {
        return;
    };
    let refs = support::push_images(&registry, "restart", 3, 32 << 20, 80).await;
    let node = support::node("worker");
    let d = desired_of(&node, &[set("s", 1, &refs)]);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Restart containerd as soon as the pulls are under way; count the retries seen.
    let restarter = tokio::spawn(async move {
        let mut containerd = containerd;
        let mut retries = 0;
        let mut restarted = false;
        while let Some(e) = rx.recv().await {
            match e {
                Event::Started { .. } if !restarted => {
                    restarted = true;
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    containerd = tokio::task::spawn_blocking(move || {
                        containerd.restart();
                        containerd
                    })
                    .await
                    .unwrap();
                }
                Event::Retrying { .. } => retries += 1,
                _ => {}
            }
        }
        (containerd, retries)
    });
    let mut status = NodeStatus::default();
    let r = support::reconcile_default(&reconciler, &d, &node, &mut status, Some(tx))
        .await
        .unwrap();
    let (containerd, retries) = restarter.await.unwrap();
    assert_eq!(r.outcome.pulled.len(), 3, "{r:?}\n{}", containerd.log());
    assert!(retries >= 1, "pulls cut by the restart were retried");
    assert!(status.done(), "{status:?}");
    assert_pinned(&reconciler, &refs).await;
}

/// (reference, started, finished) of each pull of a reconcile, from its events.
async fn timeline(
    reconciler: &Reconciler<RegistrySizer, ContainerdPins>,
    node: &NodeInfo,
    d: &Desired,
) -> Vec<(String, Instant, Instant)> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let collect = tokio::spawn(async move {
        let mut started = std::collections::HashMap::new();
        let mut out = Vec::new();
        while let Some(e) = rx.recv().await {
            match e {
                Event::Started { reference, .. } => {
                    started.insert(reference, Instant::now());
                }
                Event::Pulled { reference, .. } => {
                    let s = started[&reference];
                    out.push((reference, s, Instant::now()));
                }
                _ => {}
            }
        }
        out
    });
    let mut status = NodeStatus::default();
    support::reconcile_default(reconciler, d, node, &mut status, Some(tx))
        .await
        .unwrap();
    assert!(status.done(), "{status:?}");
    collect.await.unwrap()
}

/// Most pulls in flight at once.
fn max_in_flight(pulls: &[(String, Instant, Instant)]) -> usize {
    pulls
        .iter()
        .map(|(_, s, _)| pulls.iter().filter(|(_, a, b)| a <= s && s < b).count())
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn the_default_policy_pulls_one_at_a_time_on_the_control_plane_and_five_on_workers() {
    let Some(bed) = Bed::start(Backoff::default(), false) else {
        return;
    };
    let reconciler = &bed.reconciler;
    // One node of `role`, one set of its role holding `refs`: the pulls' timeline.
    let on_role = |role: &'static str, refs: Vec<String>| async move {
        let node = support::node(role);
        let set = PinnedImageSet::for_role(format!("{role}-set"), role, &refs);
        timeline(reconciler, &node, &desired_of(&node, &[set])).await
    };
    let cp_refs = support::push_images(&bed.registry, "cp", 4, 64_000, 80).await;
    let worker_refs = support::push_images(&bed.registry, "wk", 5, 64_000, 90).await;

    let cp = on_role("master", cp_refs).await;
    assert_eq!(cp.len(), 4);
    assert_eq!(
        max_in_flight(&cp),
        1,
        "one pull at a time on the control plane"
    );
    let mut by_start = cp.clone();
    by_start.sort_by_key(|p| p.1);
    for pair in by_start.windows(2) {
        let gap = pair[1].1 - pair[0].2;
        assert!(
            gap >= Duration::from_millis(950),
            "1 s throttle between pulls, got {gap:?}"
        );
    }

    let w = on_role("worker", worker_refs).await;
    assert_eq!(w.len(), 5);
    assert_eq!(max_in_flight(&w), 5, "five pulls at once on workers");
    let span = |p: &[(String, Instant, Instant)]| {
        p.iter().map(|x| x.2).max().unwrap() - p.iter().map(|x| x.1).min().unwrap()
    };
    assert!(
        span(&w) < span(&cp),
        "workers: {:?}, control plane: {:?}",
        span(&w),
        span(&cp)
    );
}

#[tokio::test]
async fn a_full_disk_drains_the_queue_at_once_and_names_the_images() {
    // 24 MiB for content and unpacked snapshots: two 4 MiB images fit (8 MiB each), not six.
    let Some(bed) = Bed::start_with_root_limit(Backoff::default(), false, Some(24 << 20)) else {
        return;
    };
    let (reconciler, containerd) = (&bed.reconciler, &bed.containerd);
    let refs = support::push_images(&bed.registry, "full", 6, 4 << 20, 120).await;
    let node = support::node("worker");
    let d = desired_of(&node, &[set("s", 1, &refs)]);
    let mut status = NodeStatus::default();
    let started = Instant::now();
    let r = reconcile(reconciler, &d, &node, &mut status)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", containerd.log()));
    let took = started.elapsed();
    let no_space = r
        .outcome
        .no_space
        .clone()
        .unwrap_or_else(|| panic!("no ENOSPC seen: {r:?}"));
    support::assert_says(&no_space, &["no space left on device"]);
    // Retrying a full disk 5 times (1+2+4+8 s of waits) would take 15 s; it fails fast instead.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(r.outcome.pulled.len() < refs.len(), "{r:?}");
    let err = status.sets["s"]
        .last_failed_generation_error
        .clone()
        .unwrap();
    assert!(
        err.contains("no space left on device") || err.contains("disk filled up"),
        "{err}"
    );
    let missing = refs
        .iter()
        .filter(|x| !r.outcome.pulled.contains(x))
        .count();
    support::assert_says(&err, &[&format!("{missing} image(s) missing")]);
    assert!(status.degraded.is_some() && status.sets["s"].current_generation.is_none());
    for reference in &refs {
        let pinned = reconciler
            .cri()
            .image_status(reference)
            .await
            .unwrap()
            .is_some_and(|i| i.pinned);
        assert!(!pinned, "an incomplete set is not pinned");
    }
}

/// In real containerd: a pin label removed through containerd's images API, and a pinned image
/// removed, are found by the next reconcile, repaired within it and reported.
#[tokio::test]
async fn lost_pins_in_containerd_are_repaired_and_reported() {
    let Some(mut bed) = Bed::start(QUICK, false) else {
        return;
    };
    let refs = support::push_images(&bed.registry, "drift", 2, 64_000, 70).await;
    // A containerd restart between two reconciles: pins are labels in containerd's metadata,
    // so they outlive it; the next reconcile finds nothing lost and changes nothing.
    let node = support::node("worker");
    let d = desired_of(&node, &[set("s", 1, &refs)]);
    let mut status = NodeStatus::default();
    for _ in 0..2 {
        let r = reconcile(&bed.reconciler, &d, &node, &mut status)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", bed.containerd.log()));
        assert!(status.done() && r.drift.is_empty(), "{r:?}");
        bed.containerd.restart();
    }
    let reconciler = &bed.reconciler;
    let node = support::node("worker");
    let d = desired_of(&node, &[set("s", 1, &refs)]);
    let mut status = NodeStatus::default();
    let run = async |status: &mut NodeStatus| {
        reconcile(reconciler, &d, &node, status)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", bed.containerd.log()))
    };
    let first = run(&mut status).await;
    assert!(status.done() && first.drift.is_empty(), "{first:?}");
    assert!(first.outcome.pulled.is_empty() && !first.pin.unwrap().applied);
    let pinned = async |r: &str| {
        reconciler
            .cri()
            .image_status(r)
            .await
            .unwrap()
            .is_some_and(|i| i.pinned)
    };

    // Someone removes the labels with containerd's API (another process, same socket).
    let other = ContainerdPins::new(&bed.containerd.endpoint()).unwrap();
    other
        .apply(&Default::default(), &Default::default())
        .await
        .unwrap();
    // containerd's CRI plugin learns of label changes from its event stream: soon, not at once.
    let unpinned = "the labels' removal reaching the CRI plugin";
    support::wait_for(unpinned, Duration::from_secs(10), || async {
        for r in &refs {
            if pinned(r).await {
                return Err(format!("{r} still reported pinned"));
            }
        }
        Ok(())
    })
    .await;
    let r = run(&mut status).await;
    let kinds: Vec<&str> = r.drift.iter().map(|d| d.kind.as_str()).collect();
    assert_eq!(kinds, vec!["pin-removed", "pin-removed"], "{:?}", r.drift);
    for r in &refs {
        assert!(pinned(r).await, "{r} pinned again");
    }
    assert!(
        status.done()
            && status
                .pin_drift
                .as_deref()
                .unwrap()
                .contains("2 pin-removed")
    );

    // A pinned image removed: pulled again and pinned, within the same reconcile.
    reconciler.cri().remove_image(&refs[0]).await.unwrap();
    let r = run(&mut status).await;
    assert_eq!(r.outcome.pulled, vec![refs[0].clone()]);
    assert_eq!(r.drift.len(), 1, "{:?}", r.drift);
    assert_eq!(r.drift[0].kind.as_str(), "image-deleted");
    assert!(pinned(&refs[0]).await && status.done());
}
