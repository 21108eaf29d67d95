use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_policy_paces_three_nodes_holds_on_a_failed_canary_and_survives_hostile_modules() {
    let Some((mut cluster, runtimes)) = Cluster::for_fleet().await else {
        return;
    };
    let cris: Vec<_> = runtimes.iter().map(cri).collect();
    let client = cluster.client.clone();
    let operator = cluster.operator_kc.display().to_string();
    let (pools, sets, nodes) = cluster.apis();
    let images = support::push_images(&cluster.registry, "fleet", 3, 150_000, 700).await;
    // The pool starts paused: the set arrives, and no node may pull until the pause is lifted.
    let mut paused_pool = pool("worker", &["worker"], "node-role.kubernetes.io/worker");
    paused_pool.metadata.annotations =
        Some([("pinset.io/rollout-paused".to_string(), "true".to_string())].into());
    pools
        .create(&PostParams::default(), &paused_pool)
        .await
        .unwrap();
    cluster.create_set("apps", "worker", &images[..2]).await;
    let controller_port = support::free_port();
    let controller =
        std::cell::RefCell::new(cluster.controller(controller_port, "fleet-controller.log", &[]));
    let agents: Vec<Proc> = FLEET_NODES
        .iter()
        .zip(&runtimes)
        .map(|(name, runtime)| {
            let mut labels = roles(&["worker"]);
            labels.push(("topology.kubernetes.io/zone".into(), format!("zone-{name}")));
            cluster.agent(
                name,
                &labels,
                runtime,
                support::free_port(),
                &format!("{name}.log"),
                &[],
            )
        })
        .collect();
    let logs = || {
        let mut out = format!("--- controller ---\n{}\n", controller.borrow().log());
        for (name, a) in FLEET_NODES.iter().zip(&agents) {
            out.push_str(&format!("--- {name} ---\n{}\n", a.log()));
        }
        out
    };

    // 0. Paused: all three nodes report, wait, and none is granted until the annotation goes.
    let why = eventually(
        "the paused pool counts its three waiting nodes",
        &logs,
        || async {
            let p = pools.get("worker").await.map_err(|e| e.to_string())?;
            match rollout_of(&p).0 {
                Some(r) if r.waiting == 3 && r.reason.starts_with("paused by") => Ok(r.reason),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(why.contains("3 wait, 0/3 at the target"), "{why}");
    let m = metrics(controller_port).await;
    assert_eq!(
        metric(&m, "pinset_pool_rollout_paused{pool=\"worker\"}"),
        1,
        "{m}"
    );
    for _ in 0..10 {
        let l = look(&nodes, &cris, "apps", 1, &images[..2]).await;
        assert!(
            l.granted.iter().all(|g| !g) && l.present.iter().all(|p| *p == 0),
            "a paused pool granted or pulled: {l:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The registry goes away before the canary is granted: its pull can only end once the
    // registry is back, which the test brings back after stopping the controller (below).
    cluster.registry.stop();
    // `pinset rollout status` follows the rollout from here to its end; `resume` lifts the pause.
    let follow_out = cluster.dir.path().join("rollout-status.out");
    let follow = Command::new(support::PINSET)
        .args(["rollout", "status", "worker", "--timeout", "120s"])
        .args(["--kubeconfig", &operator])
        .arg("--timeline")
        .arg(follow_out.with_extension("svg"))
        .env("PINSET_LOG", "warn")
        .stdout(std::fs::File::create(&follow_out).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let resume = ["rollout", "resume", "worker", "--kubeconfig", &operator];
    let (code, out, err) = support::pinset_blocking(resume.map(String::from).to_vec()).await;
    assert_eq!(
        (code, out.trim()),
        (0, "machineconfigpool/worker resumed"),
        "{err}"
    );

    // 1. The canary pulls first; the others only after it pinned, one at a time (10 % of 3
    //    nodes rounds up to one), never more than one node pulling, never a pull without a grant.
    //    Losing the controller never stops a node that holds a grant: the controller is stopped
    //    once the canary is granted (its pull waiting on the registry), the registry comes back,
    //    the canary pins the set alone, and a restarted controller goes on without granting it
    //    again.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut first_granted: Vec<Option<usize>> = vec![None; 3];
    let mut tick = 0;
    let mut outage: Option<usize> = None;
    let mut first_controller = (0, 0);
    loop {
        let l = look(&nodes, &cris, "apps", 1, &images[..2]).await;
        for i in 0..3 {
            assert!(
                l.granted[i] || l.present[i] == 0,
                "{} pulled without a grant: {l:?}\n{}",
                FLEET_NODES[i],
                logs()
            );
            if l.granted[i] && first_granted[i].is_none() {
                first_granted[i] = Some(tick);
                let earlier_done = (0..3).filter(|&j| j != i && l.done[j]).count();
                let order = first_granted.iter().flatten().count() - 1;
                assert_eq!(
                    earlier_done, order,
                    "{} granted before the node(s) granted ahead of it finished: {l:?}",
                    FLEET_NODES[i]
                );
                if order == 0 {
                    first_controller = grants_and_waves(controller_port, 1).await;
                    controller.borrow_mut().terminate();
                    assert!(!l.done[i], "the canary pinned without a registry: {l:?}");
                    cluster.registry.restart();
                    outage = Some(i);
                }
            }
        }
        if outage.is_some_and(|c| l.done[c]) {
            assert_eq!(
                l.granted.iter().filter(|g| **g).count(),
                1,
                "a grant without a controller: {l:?}"
            );
            *controller.borrow_mut() =
                cluster.controller(controller_port, "fleet-controller-2.log", &[]);
            outage = None;
        }
        let pulling = (0..3).filter(|&i| l.granted[i] && !l.done[i]).count();
        assert!(pulling <= 1, "more than one node pulling at once: {l:?}");
        if l.done.iter().all(|d| *d) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rollout not done in 90 s: {l:?}\n{}",
            logs()
        );
        tick += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The canary is whichever node's report the controller saw first. That each grant came
    // alone is not read off the 100 ms samples (a 150 kB pull and the next grant fit in one):
    // the controller's metrics below count 3 grants written in 3 waves.
    // The pool's status follows the nodes' reports through the status lane, a moment later.
    let (rollout, degraded) = eventually("the pool reports the rollout done", &logs, || async {
        let p = pools.get("worker").await.map_err(|e| e.to_string())?;
        match rollout_of(&p) {
            (Some(r), d, _) if r.done == 3 => Ok((r, d)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        (
            rollout.target.as_str(),
            rollout.granted,
            rollout.done,
            rollout.failed
        ),
        ("apps@1", 3, 3, 0),
        "{rollout:?}"
    );
    assert!(degraded.is_empty(), "{degraded}");
    let followed = tokio::task::spawn_blocking(move || follow.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let out = std::fs::read_to_string(&follow_out).unwrap();
    assert_eq!(
        (followed.status.code(), out.lines().last()),
        (
            Some(0),
            Some("MachineConfigPool worker successfully rolled out: 3 of 3 nodes at apps@1")
        ),
        "{out}\n{}",
        String::from_utf8_lossy(&followed.stderr)
    );
    assert!(
        out.starts_with("Waiting for MachineConfigPool worker to roll out: 0 of 3"),
        "{out}"
    );
    // Its picture: a bar per node, one after the other, the canary first.
    let bars: Vec<_> = support::timeline_bars(&follow_out.with_extension("svg"))
        .into_iter()
        .filter(|b| b.3 == "pull")
        .collect();
    assert_eq!(bars.len(), 3, "{bars:?}");
    assert!(
        bars.windows(2).all(|w| w[1].0 >= w[0].1),
        "one node at a time: {bars:?}"
    );
    let canary = (0..3)
        .min_by_key(|&i| first_granted[i].unwrap_or(usize::MAX))
        .unwrap();
    assert_eq!(bars[0].2, FLEET_NODES[canary], "{bars:?}");
    // One grant per node, each in its own wave: the canary by the first controller, then one
    // at a time by the restarted one, which did not grant the canary again.
    let m = metrics(controller_port).await;
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

    // 2. Generation 2 adds an image and one that does not exist: the canary fails, the pool
    //    holds and is Degraded naming the canary and the image; the others never pull.
    let missing = format!(
        "{}/pinset/missing@sha256:{}",
        cluster.registry.host,
        "0".repeat(64)
    );
    let gen2 = [images[0].clone(), images[2].clone(), missing.clone()];
    sets.patch(
        "apps",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"pinnedImages": gen2.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}})),
    )
    .await
    .unwrap();
    let held = eventually("the pool holds on the failed canary", &logs, || async {
        let p = pools.get("worker").await.map_err(|e| e.to_string())?;
        match rollout_of(&p) {
            (Some(r), d, _) if r.failed == 1 && d.contains("canary node w-") => Ok((r, d)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(held.1.contains(&missing), "{}", held.1);
    assert_eq!(
        (held.0.granted, held.0.target.as_str()),
        (1, "apps@2"),
        "{:?}",
        held.0
    );
    let l = look(&nodes, &cris, "apps", 2, &images[2..3]).await;
    let canary = l.granted.iter().position(|g| *g).expect("a canary");
    assert!(
        held.1
            .contains(&format!("canary node {}", FLEET_NODES[canary])),
        "{}",
        held.1
    );
    let (code, out, err) = worker_status_now(&operator, &[]).await;
    assert!(
        code == 1
            && err.contains("MachineConfigPool worker is Degraded")
            && err.contains(&format!("canary node {}", FLEET_NODES[canary]))
            && err.contains(&missing),
        "{out}\n{err}"
    );
    for _ in 0..20 {
        let l = look(&nodes, &cris, "apps", 2, &images[2..3]).await;
        for i in (0..3).filter(|&i| i != canary) {
            assert!(
                !l.granted[i] && l.present[i] == 0,
                "a held node pulled: {l:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waiting = nodes.get(FLEET_NODES[(canary + 1) % 3]).await.unwrap();
    let status = waiting.status.unwrap_or_default();
    let progressing = condition::find(&status.conditions, CONDITION_PROGRESSING).unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", "WaitingForRolloutGrant"),
        "{progressing:?}"
    );

    // 3. The controller restarts with a hostile fleet module that grants every node at once,
    //    over the pool's ceiling of one: contained (the default answers, the pool says why), no
    //    node granted again, the counts unchanged.
    controller.borrow_mut().terminate();
    pools
        .patch(
            "worker",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "pinset.io/rollout-max-pulling": "1",
                "pinset.test/hostile-fleet": "all",
            }}})),
        )
        .await
        .unwrap();
    let hostile = support::policy_dir().join("pinset_test_policy_hostile.wasm");
    *controller.borrow_mut() = cluster.controller(
        controller_port,
        "fleet-controller-2.log",
        &[format!("--fleet-policy=worker={}", hostile.display())],
    );
    let fallback = eventually("the pool names the fleet fallback", &logs, || async {
        let p = pools.get("worker").await.map_err(|e| e.to_string())?;
        match rollout_of(&p) {
            (Some(r), _, f) if f.contains("ceiling") => Ok((r, f)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(fallback.1.contains("hostile"), "{}", fallback.1);
    assert_eq!(
        (fallback.0.granted, fallback.0.failed),
        (1, 1),
        "{:?}",
        fallback.0
    );
    let m = metrics(controller_port).await;
    assert_eq!(
        metric(&m, "pinset_api_writes_total{kind=\"node_grant\"}"),
        0,
        "the restarted controller granted again:\n{m}"
    );

    // 4. The set is fixed (generation 3) while the module loops: every decision falls back to
    //    the default, which rolls the pool out canary first.
    pools
        .patch(
            "worker",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"pinset.test/hostile-fleet": "loop"}}}),
            ),
        )
        .await
        .unwrap();
    sets.patch(
        "apps",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"pinnedImages": gen2[..2].iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}})),
    )
    .await
    .unwrap();
    let done = eventually("every node pins generation 3", &logs, || async {
        let l = look(&nodes, &cris, "apps", 3, &gen2[..2]).await;
        let pulling = (0..3).filter(|&i| l.granted[i] && !l.done[i]).count();
        assert!(pulling <= 1, "more than the ceiling pulling: {l:?}");
        l.done
            .iter()
            .all(|d| *d)
            .then_some(l)
            .ok_or("not yet".to_string())
    })
    .await;
    assert_eq!(done.present, vec![2, 2, 2]);
    let fallback = eventually("the pool counts every node done", &logs, || async {
        let p = pools.get("worker").await.map_err(|e| e.to_string())?;
        match rollout_of(&p) {
            (Some(r), d, f) if (r.done, r.failed) == (3, 0) && d.is_empty() => Ok(f),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(fallback.contains("deadline"), "{fallback}");

    // Events: paused and resumed, waves started, the canary failed, the fleet policy fell back
    // (recorded behind the grants: waited for).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    eventually("the pool's Events", &logs, || async {
        let reasons: Vec<String> = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("worker"))
            .filter_map(|e| e.reason.clone())
            .collect();
        let wanted = [
            "RolloutPaused",
            "RolloutResumed",
            "RolloutWave",
            "RolloutHeld",
            "PolicyFallback",
        ];
        let missing: Vec<_> = wanted
            .iter()
            .filter(|w| !reasons.iter().any(|r| r == *w))
            .collect();
        missing
            .is_empty()
            .then_some(())
            .ok_or(format!("missing {missing:?} among {reasons:?}"))
    })
    .await;
    // The agents' metric: nothing waits any more.
    drop(agents);
}
