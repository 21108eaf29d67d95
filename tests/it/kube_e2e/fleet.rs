//! A fleet policy pacing three worker nodes ([`FleetBed`]): a paused pool, the canary and the
//! waves after it, a failed canary held, hostile fleet modules contained.

use super::*;
use pinset_k8s::api::PoolRollout;

/// A bed whose pool `worker` is paused (annotation `pinset.io/rollout-paused`), with the set
/// `apps` of two of three `prefix` images of 150 kB, the agents and the controller running;
/// the three images.
async fn paused_fleet(prefix: &str, seed: u64) -> Option<(FleetBed, Vec<String>)> {
    let (bed, images) = FleetBed::with_images(prefix, 3, seed).await?;
    let paused = [("pinset.io/rollout-paused", "true")];
    support::create_annotated_pool(&bed.cluster.client, "worker", &["worker"], &paused).await;
    bed.cluster.create_set("apps", "worker", &images[..2]).await;
    bed.run(&[]);
    Some((bed, images))
}

/// The paused pool counts its three nodes waiting: its rollout reason.
async fn three_waiting(bed: &FleetBed) -> String {
    let paused = |r: Option<PoolRollout>, _: String, _: String| {
        r.filter(|r| r.waiting == 3 && r.reason.starts_with("paused by"))
    };
    let waiting = "the paused pool counts its three waiting nodes";
    bed.pool_when(waiting, paused).await.reason
}

/// `pinset rollout resume worker`, which must say it resumed the pool.
async fn resume(bed: &FleetBed) {
    let resume = ["rollout", "resume", "worker", "--kubeconfig", &bed.operator];
    let (code, out, err) = support::pinset_blocking(resume.map(String::from).to_vec()).await;
    assert_eq!(
        (code, out.trim()),
        (0, "machineconfigpool/worker resumed"),
        "{err}"
    );
}

/// A paused pool counts its waiting nodes and grants none of them, for as long as it is paused;
/// `pinset rollout resume` lifts the pause and the canary is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_pool_grants_no_node_until_it_is_resumed() {
    let Some((bed, images)) = paused_fleet("paused", 710).await else {
        return;
    };
    let why = three_waiting(&bed).await;
    support::assert_says(&why, &["3 wait, 0/3 at the target"]);
    let paused = "pinset_pool_rollout_paused{pool=\"worker\"}";
    let m = metrics(bed.controller_port).await;
    assert_eq!(metric(&m, paused), 1, "{m}");
    throughout(10, || async {
        let l = bed.look(1, &images[..2]).await;
        assert!(
            l.granted.iter().all(|g| !g) && l.present.iter().all(|p| *p == 0),
            "a paused pool granted or pulled: {l:?}"
        );
    })
    .await;
    resume(&bed).await;
    let granted = |r: Option<PoolRollout>, _: String, _: String| r.filter(|r| r.granted >= 1);
    bed.pool_when("the canary granted once resumed", granted)
        .await;
    let m = metrics(bed.controller_port).await;
    assert_eq!(metric(&m, paused), 0, "{m}");
    bed.pool_events(&["RolloutPaused", "RolloutResumed"]).await;
}

/// The canary pulls first, the others only after it pinned, one at a time (10 % of 3 nodes
/// rounds up to one): never more than one node pulling, never a pull without a grant. Losing
/// the controller never stops a node that holds a grant — the controller is stopped once the
/// canary is granted (its pull waiting on the registry, which is away), the registry comes back,
/// the canary pins the set alone, and a restarted controller goes on without granting it again.
/// `pinset rollout status` follows the whole rollout and draws it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_pins_first_then_one_node_at_a_time_through_a_controller_restart() {
    let Some((bed, images)) = paused_fleet("canary", 700).await else {
        return;
    };
    three_waiting(&bed).await;
    // The registry goes away before the canary is granted: its pull can only end once the
    // registry is back, which the test brings back after stopping the controller.
    bed.cluster.registry.stop();
    let follow_out = bed.cluster.dir.path().join("rollout-status.out");
    let follow = follow_rollout(&bed.operator, &follow_out);
    resume(&bed).await;
    let (first_granted, first_controller) = paced_rollout(&bed, &images[..2]).await;
    let done =
        |r: Option<PoolRollout>, d: String, _: String| r.filter(|r| r.done == 3).map(|r| (r, d));
    let (rollout, degraded) = bed
        .pool_when("the pool reports the rollout done", done)
        .await;
    let counts = (rollout.granted, rollout.done, rollout.failed);
    assert_eq!((rollout.target.as_str(), counts), ("apps@1", (3, 3, 0)));
    assert!(degraded.is_empty(), "{degraded}");
    let canary = (0..3)
        .min_by_key(|&i| first_granted[i].unwrap_or(usize::MAX))
        .unwrap();
    followed_to_the_end(follow, &follow_out, FLEET_NODES[canary]).await;
    // One grant per node, each in its own wave: the canary by the first controller, then one
    // at a time by the restarted one, which did not grant the canary again.
    let m = metrics(bed.controller_port).await;
    assert_eq!(
        (
            first_controller,
            metric(&m, "pinset_api_writes_total{kind=\"node_grant\"}"),
            metric(&m, "pinset_rollout_waves_total{pool=\"worker\"}"),
            metric(&m, "pinset_pool_rollout_paused{pool=\"worker\"}"),
        ),
        ((1, 1), 2, 2, 0),
        "{m}"
    );
    bed.pool_events(&["RolloutWave"]).await;
}

/// `pinset rollout status worker` following the rollout, its picture drawn, its output in `out`.
fn follow_rollout(operator: &str, out: &Path) -> Child {
    support::follow_worker_rollout(operator.as_ref(), "120s", &out.with_extension("svg"))
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Watch the rollout of `images` to its end every 100 ms, holding its invariants, and take the
/// controller away while the canary's pull waits on the registry (see the test above): each
/// node's first tick with a grant, and the first controller's grants and waves.
async fn paced_rollout(bed: &FleetBed, images: &[String]) -> (Vec<Option<usize>>, (u64, u64)) {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut first_granted: Vec<Option<usize>> = vec![None; 3];
    let (mut outage, mut first_controller) = (None, (0, 0));
    for tick in 0.. {
        let l = bed.look(1, images).await;
        for i in 0..3 {
            let who = FLEET_NODES[i];
            assert!(
                l.granted[i] || l.present[i] == 0,
                "{who} pulled without a grant: {l:?}"
            );
            if !l.granted[i] || first_granted[i].is_some() {
                continue;
            }
            first_granted[i] = Some(tick);
            let earlier_done = (0..3).filter(|&j| j != i && l.done[j]).count();
            let order = first_granted.iter().flatten().count() - 1;
            assert_eq!(
                earlier_done, order,
                "{who} granted before those ahead finished: {l:?}"
            );
            if order == 0 {
                first_controller = grants_and_waves(bed.controller_port, 1).await;
                bed.stop_controller();
                assert!(!l.done[i], "the canary pinned without a registry: {l:?}");
                bed.cluster.registry.restart();
                outage = Some(i);
            }
        }
        if outage.is_some_and(|c| l.done[c]) {
            let granted = l.granted.iter().filter(|g| **g).count();
            assert_eq!(granted, 1, "a grant without a controller: {l:?}");
            bed.controller("controller-2.log", &[]);
            outage = None;
        }
        let pulling = (0..3).filter(|&i| l.granted[i] && !l.done[i]).count();
        assert!(pulling <= 1, "more than one node pulling at once: {l:?}");
        if l.done.iter().all(|d| *d) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not done in 90 s: {l:?}\n{}",
            bed.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (first_granted, first_controller)
}

/// `pinset rollout status` ended with the rollout, and drew it: a bar per node, one after the
/// other, `canary` first.
async fn followed_to_the_end(follow: Child, out: &Path, canary: &str) {
    let followed = tokio::task::spawn_blocking(move || follow.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let text = std::fs::read_to_string(out).unwrap();
    let stderr = String::from_utf8_lossy(&followed.stderr);
    let success = "MachineConfigPool worker successfully rolled out: 3 of 3 nodes at apps@1";
    assert_eq!(
        (followed.status.code(), text.lines().last()),
        (Some(0), Some(success)),
        "{text}\n{stderr}"
    );
    let waiting = "Waiting for MachineConfigPool worker to roll out: 0 of 3";
    assert!(text.starts_with(waiting), "{text}");
    let bars: Vec<_> = support::timeline_bars(&out.with_extension("svg"))
        .into_iter()
        .filter(|b| b.3 == "pull")
        .collect();
    assert_eq!(bars.len(), 3, "{bars:?}");
    let one_at_a_time = bars.windows(2).all(|w| w[1].0 >= w[0].1);
    assert!(one_at_a_time, "one node at a time: {bars:?}");
    assert_eq!(bars[0].2, canary, "{bars:?}");
}

/// A set with an image that does not exist: the canary fails, the pool holds and is Degraded
/// naming the canary and the image, `rollout status` says so, and the other nodes never pull.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_canary_holds_the_pool_and_no_other_node_pulls() {
    let Some((bed, images)) = FleetBed::with_images("held", 1, 720).await else {
        return;
    };
    let missing = bed.cluster.registry.missing_image();
    bed.cluster.create_pool("worker", &["worker"]).await;
    let wanted = [images[0].clone(), missing.clone()];
    bed.cluster.create_set("apps", "worker", &wanted).await;
    bed.run(&[]);
    let failed = |r: Option<PoolRollout>, d: String, _: String| {
        r.filter(|r| r.failed == 1 && d.contains("canary node w-"))
            .map(|r| (r, d))
    };
    let (held, degraded) = bed
        .pool_when("the pool holds on the failed canary", failed)
        .await;
    support::assert_says(&degraded, &[&missing]);
    assert_eq!(
        (held.granted, held.target.as_str()),
        (1, "apps@1"),
        "{held:?}"
    );
    let l = bed.look(1, &images).await;
    let canary = FLEET_NODES[l.granted.iter().position(|g| *g).expect("a canary")];
    support::assert_says(&degraded, &[&format!("canary node {canary}")]);
    let (code, out, err) = worker_status_now(&bed.operator, &[]).await;
    assert!(
        code == 1
            && err.contains("MachineConfigPool worker is Degraded")
            && err.contains(&format!("canary node {canary}"))
            && err.contains(&missing),
        "{out}\n{err}"
    );
    throughout(20, || async {
        let l = bed.look(1, &images).await;
        for i in (0..3).filter(|&i| FLEET_NODES[i] != canary) {
            let untouched = !l.granted[i] && l.present[i] == 0;
            assert!(untouched, "a held node pulled: {l:?}");
        }
    })
    .await;
    let other = FLEET_NODES.iter().find(|n| **n != canary).unwrap();
    let status = bed
        .nodes
        .get(other)
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    let progressing = condition::find(&status.conditions, CONDITION_PROGRESSING).unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", "WaitingForRolloutGrant"),
        "{progressing:?}"
    );
    bed.pool_events(&["RolloutHeld"]).await;
}

/// The pool's fleet module misbehaves (`pinset.test/hostile-fleet`): it grants every node at
/// once, over the pool's ceiling of one, then it loops. Each decision is the default fleet
/// policy's instead — the canary alone, held when it fails; one node at a time — and the pool
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_fleet_module_is_replaced_by_the_default_for_each_decision() {
    let Some((bed, images)) = FleetBed::with_images("hostile", 2, 730).await else {
        return;
    };
    let missing = bed.cluster.registry.missing_image();
    let annotations = [
        ("pinset.io/rollout-max-pulling", "1"),
        ("pinset.test/hostile-fleet", "all"),
    ];
    support::create_annotated_pool(&bed.cluster.client, "worker", &["worker"], &annotations).await;
    let wanted = [images[0].clone(), missing.clone()];
    bed.cluster.create_set("apps", "worker", &wanted).await;
    let hostile = support::policy_dir().join("pinset_test_policy_hostile.wasm");
    bed.run(&[format!("--fleet-policy=worker={}", hostile.display())]);
    let over_the_ceiling = |r: Option<PoolRollout>, _: String, f: String| {
        r.filter(|r| r.failed == 1 && f.contains("ceiling"))
            .map(|r| (r, f))
    };
    let (held, fallback) = bed
        .pool_when("the pool names the fallback", over_the_ceiling)
        .await;
    support::assert_says(&fallback, &["hostile"]);
    assert_eq!((held.granted, held.failed), (1, 1), "{held:?}");
    throughout(10, || async {
        let l = bed.look(1, &images[..1]).await;
        let granted = l.granted.iter().filter(|g| **g).count();
        assert_eq!(granted, 1, "the canary alone: {l:?}");
    })
    .await;
    // The module loops now; the set is fixed, and its new generation rolls out all the same.
    let looping = json!({"metadata": {"annotations": {"pinset.test/hostile-fleet": "loop"}}});
    let patch = Patch::Merge(looping);
    bed.pools
        .patch("worker", &PatchParams::default(), &patch)
        .await
        .unwrap();
    bed.set_images(&images).await;
    let looped = rolled_out_one_at_a_time(&bed, 2, &images).await;
    support::assert_says(&looped, &["deadline"]);
    bed.pool_events(&["RolloutHeld", "RolloutWave", "PolicyFallback"])
        .await;
}

/// Every node pins generation `generation` of `apps` (`images`), never more than one pulling,
/// and the pool counts them done: the pool's PolicyFallback message.
async fn rolled_out_one_at_a_time(bed: &FleetBed, generation: i64, images: &[String]) -> String {
    let what = format!("every node pins generation {generation}");
    let done = eventually(&what, &|| bed.logs(), || async {
        let l = bed.look(generation, images).await;
        let pulling = (0..3).filter(|&i| l.granted[i] && !l.done[i]).count();
        assert!(pulling <= 1, "more than the ceiling pulling: {l:?}");
        match l.done.iter().all(|d| *d) {
            true => Ok(l),
            false => Err(format!("{l:?}")),
        }
    })
    .await;
    assert_eq!(done.present, vec![images.len(); 3]);
    let target = format!("apps@{generation}");
    let counted = |r: Option<PoolRollout>, d: String, f: String| {
        r.filter(|r| r.target == target && (r.done, r.failed) == (3, 0) && d.is_empty())
            .map(|_| f)
    };
    bed.pool_when("the pool counts every node done", counted)
        .await
}
