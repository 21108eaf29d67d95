use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_and_agents_pin_sets_and_report_through_a_real_api_server() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let Some(cp_runtime) = support::Containerd::start(&cluster.registry.host) else {
        return;
    };
    let Some(infra_runtime) = support::Containerd::start(&cluster.registry.host) else {
        return;
    };
    let (registry, server, client) = (&cluster.registry, &cluster.server, cluster.client.clone());
    let dir = &cluster.dir;

    let master_imgs = support::push_images(registry, "m", 2, 150_000, 100).await;
    let worker_imgs = support::push_images(registry, "w", 3, 150_000, 200).await;
    let infra_imgs = support::push_images(registry, "i", 2, 150_000, 300).await;

    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    let nodes: Api<MachineConfigNode> = Api::all(client.clone());
    let pp = PostParams::default();
    pools
        .create(
            &pp,
            &pool("master", &["master"], "node-role.kubernetes.io/master"),
        )
        .await
        .unwrap();
    pools
        .create(
            &pp,
            &pool("worker", &["worker"], "node-role.kubernetes.io/worker"),
        )
        .await
        .unwrap();
    pools
        .create(
            &pp,
            &pool(
                "infra",
                &["worker", "infra"],
                "node-role.kubernetes.io/infra",
            ),
        )
        .await
        .unwrap();
    sets.create(&pp, &set("master-set", "master", &master_imgs))
        .await
        .unwrap();
    sets.create(&pp, &set("worker-set", "worker", &worker_imgs[..2]))
        .await
        .unwrap();
    sets.create(&pp, &set("infra-set", "infra", &infra_imgs))
        .await
        .unwrap();

    let controller_port = support::free_port();
    let controller = cluster.controller(controller_port, "controller.log", &[]);
    // Policies shipped as the configuration ships them: OCI artifacts by digest, a signature
    // required. infra's module is signed and runs; master's is not and is refused for master
    // only: cp-0 decides with the default and says why.
    let policies = Releases::push(&cluster, dir.path());
    let cp_port = support::free_port();
    let mut cp = cluster.agent(
        "cp-0",
        &roles(&["master", "control-plane"]),
        &cp_runtime,
        cp_port,
        "cp-0.log",
        &policies.agent_args("master", &policies.unsigned, "cp-0"),
    );
    // The infra pool runs (from its signed artifact) a policy that writes to stderr in every
    // hook (which crashed the agent's async path while WASI streams entered a runtime of their
    // own) and answers like the default: it passes the smoke test on the node's facts, decides
    // every reconcile, and the node pulls and pins without a fallback. (A module that traps is
    // refused by that test: `a_pool_policy_change_rolls_out_canary_first_and_a_bad_one_is_held`.)
    let mut infra_labels = roles(&["worker", "infra"]);
    infra_labels.push(("pinset.test/hostile".into(), "stderr".into()));
    let infra = cluster.agent(
        "infra-0",
        &infra_labels,
        &infra_runtime,
        support::free_port(),
        "infra-0.log",
        &policies.agent_args("infra", &policies.v2, "infra-0"),
    );
    let logs = || {
        format!(
            "--- controller ---\n{}\n--- cp-0 ---\n{}\n--- infra-0 ---\n{}\n{}",
            controller.log(),
            cp.log(),
            infra.log(),
            server.log()
        )
    };

    // The controller writes each pool's sets, sorted; the custom pool also gets the worker sets.
    for (pool, want) in [
        ("master", vec!["master-set"]),
        ("worker", vec!["worker-set"]),
        ("infra", vec!["infra-set", "worker-set"]),
    ] {
        eventually(&format!("pool {pool} lists {want:?}"), &logs, || async {
            let p = pools.get(pool).await.map_err(|e| e.to_string())?;
            (pool_sets(&p) == want)
                .then_some(())
                .ok_or(format!("{:?}", pool_sets(&p)))
        })
        .await;
    }

    // Each node pulls and pins its pools' sets (each set once) and says so.
    eventually("cp-0 done", &logs, || async {
        let n = nodes.get("cp-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        (state == settled(&[("master-set", 1)]))
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    eventually("infra-0 done", &logs, || async {
        let n = nodes.get("infra-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        let want = settled(&[("infra-set", 1), ("worker-set", 1)]);
        (state == want && n.spec.pool.name == "infra")
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    let infra_mcn = nodes.get("infra-0").await.unwrap();
    let fallback = infra_mcn
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == pinset_k8s::api::CONDITION_POLICY_FALLBACK)
        .cloned()
        .unwrap();
    assert_eq!(fallback.status, "False", "{fallback:?}");
    let cp_fallback = nodes.get("cp-0").await.unwrap().status.unwrap().conditions;
    let refused = cp_fallback
        .iter()
        .find(|c| c.type_ == pinset_k8s::api::CONDITION_POLICY_FALLBACK)
        .unwrap();
    assert_eq!(refused.status, "True", "{refused:?}");
    for said in [
        "pool master",
        policies.unsigned.as_str(),
        "no cosign signature",
        "deciding with embedded:default",
    ] {
        assert!(refused.message.contains(said), "{said:?} in {refused:?}");
    }
    assert!(
        !refused.message.contains("trapped"),
        "the default it decides with never falls back: {refused:?}"
    );
    // Each node says which module it decides with: infra-0 the signed artifact, cp-0 the default.
    let running = |mcn: &MachineConfigNode| mcn.status.as_ref().unwrap().policy.clone().unwrap();
    let infra_policy = running(&infra_mcn);
    assert_eq!(
        (infra_policy.name.as_str(), infra_policy.module.as_str()),
        ("hostile", format!("oci://{}", policies.v2).as_str())
    );
    let hostile_bytes = std::fs::read(support::policy_path("pinset_test_policy_hostile")).unwrap();
    // One name for the module: the digest the configuration names it by; its bytes' digest
    // beside it, named as such.
    let manifest_digest = policies.v2.rsplit_once('@').unwrap().1;
    assert_eq!(infra_policy.digest, manifest_digest);
    assert_eq!(
        infra_policy.module_digest.as_deref(),
        Some(support::sha256(&hostile_bytes).as_str())
    );
    let cp_policy = running(&nodes.get("cp-0").await.unwrap());
    assert_eq!(cp_policy.name, "default");
    assert_eq!(cp_policy.module, pinset_policy::EMBEDDED_DEFAULT_NAME);
    // The pool says it too, naming the node.
    eventually("pool master names the refusal", &logs, || async {
        let p = pools.get("master").await.map_err(|e| e.to_string())?;
        let c = p
            .status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| c.type_ == pinset_k8s::api::CONDITION_POLICY_FALLBACK)
            .ok_or("no PolicyFallback condition")?;
        (c.status == "True"
            && c.reason == "PolicyRefused"
            && c.message.contains("node cp-0")
            && c.message.contains(&policies.unsigned))
        .then_some(())
        .ok_or(format!("{c:?}"))
    })
    .await;
    let progress = infra_mcn.status.unwrap().pinned_image_progress.unwrap();
    assert_eq!((progress.images_done, progress.images_total), (4, 4));
    let (cp_cri, infra_cri) = (cri(&cp_runtime), cri(&infra_runtime));
    for r in &master_imgs {
        assert!(
            cp_cri.image_status(r).await.unwrap().unwrap().pinned,
            "{r} pinned on cp-0"
        );
    }
    for r in worker_imgs[..2].iter().chain(&infra_imgs) {
        assert!(
            infra_cri.image_status(r).await.unwrap().unwrap().pinned,
            "{r} pinned on infra-0"
        );
    }
    assert!(
        infra_cri
            .image_status(&master_imgs[0])
            .await
            .unwrap()
            .is_none(),
        "master images stay off workers"
    );

    // Pool counts: each node counts in its primary pool only.
    for (pool, want) in [("master", (1, 1)), ("infra", (1, 1)), ("worker", (0, 0))] {
        eventually(&format!("pool {pool} counts {want:?}"), &logs, || async {
            let p = pools.get(pool).await.map_err(|e| e.to_string())?;
            match pool_counts(&p) {
                Some((m, u, d, _)) if (m, u) == want && d == "False" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    // Set status: size and pools, for kubectl.
    eventually("worker-set status", &logs, || async {
        let s = sets.get("worker-set").await.map_err(|e| e.to_string())?;
        let st = s.status.unwrap_or_default();
        (st.image_count == 2 && st.pools == vec!["infra", "worker"])
            .then_some(())
            .ok_or(format!("{st:?}"))
    })
    .await;

    // Generation 2 of the worker set adds an image.
    sets.patch(
        "worker-set",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"pinnedImages": worker_imgs.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}})),
    )
    .await
    .unwrap();
    eventually("infra-0 at worker-set generation 2", &logs, || async {
        let n = nodes.get("infra-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        (state == settled(&[("infra-set", 1), ("worker-set", 2)]))
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    assert!(
        infra_cri
            .image_status(&worker_imgs[2])
            .await
            .unwrap()
            .unwrap()
            .pinned
    );

    // Deleting a set: out of the pool, out of the node's status, unpinned but still present.
    sets.delete("infra-set", &DeleteParams::default())
        .await
        .unwrap();
    eventually("infra pool without infra-set", &logs, || async {
        let p = pools.get("infra").await.map_err(|e| e.to_string())?;
        (pool_sets(&p) == vec!["worker-set"])
            .then_some(())
            .ok_or(format!("{:?}", pool_sets(&p)))
    })
    .await;
    eventually(
        "infra-0 without infra-set, its images unpinned",
        &logs,
        || async {
            let n = nodes.get("infra-0").await.map_err(|e| e.to_string())?;
            let names: Vec<String> = node_state(&n).0.into_iter().map(|s| s.0).collect();
            let image = infra_cri
                .image_status(&infra_imgs[0])
                .await
                .map_err(|e| e.to_string())?;
            match image {
                Some(i) if names == vec!["worker-set"] && !i.pinned => Ok(()),
                other => Err(format!("{names:?} {other:?}")),
            }
        },
    )
    .await;

    // An image that does not exist: the node is Degraded naming it; so is its pool.
    let missing = format!("{}/pinset/missing@sha256:{}", registry.host, "0".repeat(64));
    sets.create(
        &pp,
        &set("broken", "master", std::slice::from_ref(&missing)),
    )
    .await
    .unwrap();
    let message = eventually("cp-0 degraded", &logs, || async {
        let n = nodes.get("cp-0").await.map_err(|e| e.to_string())?;
        let st = n.status.unwrap_or_default();
        let d = st
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_DEGRADED)
            .cloned();
        match d {
            Some(c) if c.status == "True" => Ok(c.message),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        message.contains(&missing) && message.contains("broken"),
        "{message}"
    );
    let pool_message = eventually("master pool degraded", &logs, || async {
        let p = pools.get("master").await.map_err(|e| e.to_string())?;
        match pool_counts(&p) {
            Some((1, 0, d, m)) if d == "True" => Ok(m),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        pool_message.contains("node cp-0")
            && pool_message.contains("PinnedImageSet broken")
            && pool_message.contains(&missing),
        "{pool_message}"
    );
    // Events, as `kubectl get events` shows them: sets pinned and failed on the node's
    // MachineConfigNode, cp-0's refusal of its unsigned module, the pool turning Degraded.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let want = [
        ("MachineConfigNode", "cp-0", "SetPinned"),
        ("MachineConfigNode", "cp-0", "SetFailed"),
        ("MachineConfigNode", "cp-0", "PolicyRejected"),
        ("MachineConfigPool", "master", "PoolDegraded"),
    ];
    let seen = eventually("events recorded", &logs, || async {
        let list = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let seen: Vec<(String, String, String, String)> = list
            .items
            .iter()
            .map(|e| {
                let r = e.regarding.clone().unwrap_or_default();
                let note = e.note.clone().unwrap_or_default();
                (
                    r.kind.unwrap_or_default(),
                    r.name.unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    note,
                )
            })
            .collect();
        let all = want.iter().all(|(k, n, r)| {
            seen.iter()
                .any(|(k2, n2, r2, _)| (k2.as_str(), n2.as_str(), r2.as_str()) == (*k, *n, *r))
        });
        all.then_some(seen.clone()).ok_or(format!("{seen:?}"))
    })
    .await;
    let failed = seen.iter().find(|e| e.2 == "SetFailed").unwrap();
    assert!(
        failed.3.contains("broken") && failed.3.contains(&missing),
        "{failed:?}"
    );
    assert_eq!(
        seen.iter()
            .filter(|e| e.1 == "cp-0" && e.2 == "SetPinned" && e.3.contains("master-set"))
            .count(),
        1,
        "a set is announced pinned once, not at every resync: {seen:?}"
    );
    // The set that is fine stays done on that node.
    let cp_sets = node_state(&nodes.get("cp-0").await.unwrap()).0;
    assert!(
        cp_sets.contains(&("master-set".into(), 1, Some(1))),
        "{cp_sets:?}"
    );

    // Metrics of the agent and the controller.
    let m = metrics(cp_port).await;
    assert!(m.contains("pinset_images_pulled_total 2"), "{m}");
    assert!(m.contains("pinset_image_pull_failures_total"), "{m}");
    assert!(m.contains("pinset_policy_call_seconds_bucket"), "{m}");
    for port in [cp_port, controller_port] {
        for path in ["/healthz", "/readyz"] {
            let r = get(port, path).await;
            assert!(r.starts_with("HTTP/1.0 200"), "{path}: {r}");
        }
    }
    let c = metrics(controller_port).await;
    assert!(
        c.contains("pinset_api_writes_total{kind=\"pool_spec\"}"),
        "{c}"
    );
    // The build, the node's sets by state, the last time every set was pinned.
    let build = format!(
        "pinset_build_info{{version=\"{}\",commit=\"",
        env!("CARGO_PKG_VERSION")
    );
    assert!(m.contains(&build) && c.contains(&build), "{build}\n{m}");
    for state in ["pinned", "failed", "pending"] {
        assert!(
            m.contains(&format!("pinset_node_sets{{state=\"{state}\"}}")),
            "{m}"
        );
    }
    let last = metric(&m, "pinset_last_successful_reconcile_timestamp_seconds");
    assert!(
        last > 1_700_000_000,
        "a reconcile pinned every set: {last}\n{m}"
    );

    let refused = cluster.refused();
    assert!(
        refused.is_empty(),
        "refused by RBAC: {refused:?}\n{}",
        logs()
    );
    let asked = cluster.authorizer.decisions();
    for who in ["pinset-controller", "pinset-agent"] {
        let user = format!("system:serviceaccount:pinset:{who}");
        let n = asked.iter().filter(|d| d.request.user == user).count();
        assert!(
            n > 10,
            "{who} was authorized by the manifests' RBAC {n} time(s)"
        );
    }
    // SIGTERM: the agent stops within seconds.
    let took = cp.terminate();
    assert!(took < Duration::from_secs(5), "agent took {took:?} to stop");
    drop(infra);
    drop(controller);
    // Every request of the controller and the agents was allowed by the manifests' RBAC.
    assert_eq!(cluster.refused(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_run_is_finished_by_the_next_one_without_pulling_twice() {
    let Some((cluster, runtime)) = Cluster::with_runtime().await else {
        return;
    };
    let server = &cluster.server;
    let (refs, nodes) = release_set(&cluster, "k", 10, 700).await;
    let cri = cri(&runtime);

    let mut first = cluster.release_agent(&runtime, support::free_port(), "first.log");
    let logs = || format!("{}\n{}", first.log(), server.log());
    // Kill it once some images are in and others are not.
    eventually("some images pulled", &logs, || async {
        let (present, _) = present_and_pinned(&cri, &refs).await;
        (2..refs.len())
            .contains(&present)
            .then_some(())
            .ok_or(format!("{present} present"))
    })
    .await;
    unsafe { libc::kill(first.child.id() as i32, libc::SIGKILL) };
    let _ = first.child.wait();
    let (present, pinned) = present_and_pinned(&cri, &refs).await;
    assert!(
        present < refs.len(),
        "killed too late: every image was already pulled"
    );
    assert_eq!(
        pinned, 0,
        "nothing is pinned before the whole set is verified"
    );

    let port = support::free_port();
    let second = cluster.release_agent(&runtime, port, "second.log");
    let logs = || format!("{}\n{}", second.log(), server.log());
    eventually("the restarted agent finishes the set", &logs, || async {
        let n = nodes.get("cp-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        (state == settled(&[("release", 1)]))
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    assert_eq!(
        present_and_pinned(&cri, &refs).await,
        (refs.len(), refs.len())
    );
    let m = metrics(port).await;
    assert_eq!(
        metric(&m, "pinset_images_pulled_total"),
        (refs.len() - present) as u64,
        "only the images missing at restart are pulled again\n{m}"
    );
}

/// The API server goes away mid-run: the agent keeps pulling and pins the set without it, and
/// publishes the final status once the server is back (nothing waits for the next resync).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_works_through_an_api_server_outage_and_publishes_when_it_returns() {
    let Some((cluster, runtime)) = Cluster::with_runtime().await else {
        return;
    };
    let server = &cluster.server;
    let (refs, nodes) = release_set(&cluster, "o", 6, 900).await;
    let cri = cri(&runtime);
    let agent = cluster.release_agent(&runtime, support::free_port(), "agent.log");
    let logs = || format!("{}\n{}", agent.log(), server.log());
    eventually("the first image pulled", &logs, || async {
        let (present, _) = present_and_pinned(&cri, &refs).await;
        (present >= 1)
            .then_some(())
            .ok_or(format!("{present} present"))
    })
    .await;
    server.stop();
    let (present, _) = present_and_pinned(&cri, &refs).await;
    assert!(present < refs.len(), "stopped too late: {present} present");
    // Without the API server, the agent finishes its work.
    eventually(
        "every image pulled and pinned, API server down",
        &logs,
        || async {
            let state = present_and_pinned(&cri, &refs).await;
            (state == (refs.len(), refs.len()))
                .then_some(())
                .ok_or(format!("{state:?}"))
        },
    )
    .await;
    server.restart().await;
    let started = std::time::Instant::now();
    eventually("the final status published", &logs, || async {
        let n = nodes.get("cp-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        (state == settled(&[("release", 1)]))
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    // Within the agent's retry interval (1 s here), not its 10-minute resync.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(agent.log().contains("status not published"), "{}", logs());
}
