use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use pinset_k8s::api::CONDITION_POLICY_FALLBACK;

/// Three pools on a real API server with their sets — master (node cp-0: its unsigned module
/// refused, the default decides), worker, and infra (node infra-0, which also takes the worker
/// sets: a signed module that writes to stderr in every hook and answers like the default) —
/// the controller, and an agent per node on a containerd of its own; both nodes settled.
struct ThreePools {
    controller: Proc,
    cp: Proc,
    infra: Proc,
    controller_port: u16,
    cp_port: u16,
    master_imgs: Vec<String>,
    worker_imgs: Vec<String>,
    infra_imgs: Vec<String>,
    policies: Releases,
    cp_runtime: support::Containerd,
    infra_runtime: support::Containerd,
    pools: Api<MachineConfigPool>,
    sets: Api<PinnedImageSet>,
    nodes: Api<MachineConfigNode>,
    cluster: Cluster,
}

impl ThreePools {
    async fn start() -> Option<ThreePools> {
        let cluster = Cluster::start().await?;
        let cp_runtime = support::Containerd::start(&cluster.registry.host)?;
        let infra_runtime = support::Containerd::start(&cluster.registry.host)?;
        let registry = &cluster.registry;
        let master_imgs = support::push_images(registry, "m", 2, 150_000, 100).await;
        let worker_imgs = support::push_images(registry, "w", 3, 150_000, 200).await;
        let infra_imgs = support::push_images(registry, "i", 2, 150_000, 300).await;
        cluster.create_pool("master", &["master"]).await;
        cluster.create_pool("worker", &["worker"]).await;
        cluster.create_pool("infra", &["worker", "infra"]).await;
        cluster
            .create_set("master-set", "master", &master_imgs)
            .await;
        cluster
            .create_set("worker-set", "worker", &worker_imgs[..2])
            .await;
        cluster.create_set("infra-set", "infra", &infra_imgs).await;
        let controller_port = support::free_port();
        let controller = cluster.controller(controller_port, "controller.log", &[]);
        // Policies shipped as the configuration ships them: OCI artifacts by digest, a
        // signature required.
        let policies = Releases::push(&cluster, cluster.dir.path());
        let cp_port = support::free_port();
        let cp_roles = roles(&["master", "control-plane"]);
        let cp_args = policies.agent_args("master", &policies.unsigned, "cp-0");
        let cp = cluster.agent(
            "cp-0",
            &cp_roles,
            &cp_runtime,
            cp_port,
            "cp-0.log",
            &cp_args,
        );
        // (A module that traps is refused by the smoke test on the node's facts:
        // `a_pool_policy_change_rolls_out_canary_first_and_a_bad_one_is_held`.)
        let mut infra_labels = roles(&["worker", "infra"]);
        infra_labels.push(("pinset.test/hostile".into(), "stderr".into()));
        let infra_args = policies.agent_args("infra", &policies.v2, "infra-0");
        let port = support::free_port();
        let infra = cluster.agent(
            "infra-0",
            &infra_labels,
            &infra_runtime,
            port,
            "infra-0.log",
            &infra_args,
        );
        let client = cluster.client.clone();
        let three = ThreePools {
            controller,
            cp,
            infra,
            controller_port,
            cp_port,
            master_imgs,
            worker_imgs,
            infra_imgs,
            policies,
            cp_runtime,
            infra_runtime,
            pools: Api::all(client.clone()),
            sets: Api::all(client.clone()),
            nodes: Api::all(client),
            cluster,
        };
        three.settled("cp-0", &[("master-set", 1)]).await;
        three
            .settled("infra-0", &[("infra-set", 1), ("worker-set", 1)])
            .await;
        Some(three)
    }

    fn logs(&self) -> String {
        format!(
            "--- controller ---\n{}\n--- cp-0 ---\n{}\n--- infra-0 ---\n{}\n{}",
            self.controller.log(),
            self.cp.log(),
            self.infra.log(),
            self.cluster.server.log()
        )
    }

    /// Node `name` has pinned exactly `sets` (name, generation) and says so.
    async fn settled(&self, name: &str, sets: &[(&str, i64)]) {
        let what = format!("{name} settled at {sets:?}");
        node_settles(&self.nodes, name, sets, &what, &|| self.logs()).await;
    }

    /// The condition `type_` of node `name`.
    async fn node_condition(&self, name: &str, type_: &str) -> Condition {
        let status = self
            .nodes
            .get(name)
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        condition::find(&status.conditions, type_).unwrap().clone()
    }

    /// The sets of pool `pool` are `want` (sorted), once the controller has written them.
    async fn pool_lists(&self, pool: &str, want: &[&str]) {
        eventually(
            &format!("pool {pool} lists {want:?}"),
            &|| self.logs(),
            || async {
                let p = self.pools.get(pool).await.map_err(|e| e.to_string())?;
                (pool_sets(&p) == want)
                    .then_some(())
                    .ok_or(format!("{:?}", pool_sets(&p)))
            },
        )
        .await;
    }
}

/// Each pool gets its sets (the custom pool the worker sets too), each node pulls and pins its
/// pools' sets once — none of another role's — each node counts in its primary pool only, and
/// a set's status says its size and pools; every request was allowed by the manifests' RBAC,
/// and the agent stops within seconds of a SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_pins_the_sets_of_its_pools_and_each_pool_counts_its_own_nodes() {
    let Some(mut t) = ThreePools::start().await else {
        return;
    };
    t.pool_lists("master", &["master-set"]).await;
    t.pool_lists("worker", &["worker-set"]).await;
    t.pool_lists("infra", &["infra-set", "worker-set"]).await;
    let infra_mcn = eventually("infra-0 in pool infra", &|| t.logs(), || async {
        let n = t.nodes.get("infra-0").await.map_err(|e| e.to_string())?;
        let pool = n.spec.pool.name.clone();
        (pool == "infra").then_some(n).ok_or(pool)
    })
    .await;
    let progress = infra_mcn.status.unwrap().pinned_image_progress.unwrap();
    assert_eq!((progress.images_done, progress.images_total), (4, 4));
    let (cp_cri, infra_cri) = (cri(&t.cp_runtime), cri(&t.infra_runtime));
    for r in &t.master_imgs {
        let image = cp_cri.image_status(r).await.unwrap();
        assert!(image.is_some_and(|i| i.pinned), "{r} pinned on cp-0");
    }
    for r in t.worker_imgs[..2].iter().chain(&t.infra_imgs) {
        let image = infra_cri.image_status(r).await.unwrap();
        assert!(image.is_some_and(|i| i.pinned), "{r} pinned on infra-0");
    }
    let master_on_infra = infra_cri.image_status(&t.master_imgs[0]).await.unwrap();
    assert!(master_on_infra.is_none(), "master images stay off workers");
    for (pool, want) in [("master", (1, 1)), ("infra", (1, 1)), ("worker", (0, 0))] {
        eventually(
            &format!("pool {pool} counts {want:?}"),
            &|| t.logs(),
            || async {
                let p = t.pools.get(pool).await.map_err(|e| e.to_string())?;
                match pool_counts(&p) {
                    Some((m, u, d, _)) if (m, u) == want && d == "False" => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    }
    eventually("worker-set status", &|| t.logs(), || async {
        let s = t.sets.get("worker-set").await.map_err(|e| e.to_string())?;
        let st = s.status.unwrap_or_default();
        (st.image_count == 2 && st.pools == vec!["infra", "worker"])
            .then_some(())
            .ok_or(format!("{st:?}"))
    })
    .await;
    let asked = t.cluster.authorizer.decisions();
    for who in ["pinset-controller", "pinset-agent"] {
        let user = format!("system:serviceaccount:pinset:{who}");
        let n = asked.iter().filter(|d| d.request.user == user).count();
        assert!(
            n > 10,
            "{who} was authorized by the manifests' RBAC {n} time(s)"
        );
    }
    let took = t.cp.terminate();
    assert!(took < Duration::from_secs(5), "agent took {took:?} to stop");
}

/// Each node says which module it decides with, by the digest the configuration names it
/// (its bytes' digest beside it): infra-0 its signed module, which writes to stderr in every
/// hook and decides without a fallback; cp-0 the default, its unsigned module refused — said on
/// the node (PolicyFallback True) and on its pool, naming the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_says_which_module_decides_and_a_refused_one_is_named_on_node_and_pool() {
    let Some(t) = ThreePools::start().await else {
        return;
    };
    let infra_fallback = t.node_condition("infra-0", CONDITION_POLICY_FALLBACK).await;
    assert_eq!(infra_fallback.status, "False", "{infra_fallback:?}");
    let refused = t.node_condition("cp-0", CONDITION_POLICY_FALLBACK).await;
    assert_eq!(refused.status, "True", "{refused:?}");
    let unsigned = t.policies.unsigned.as_str();
    for said in [
        "pool master",
        unsigned,
        "no cosign signature",
        "deciding with embedded:default",
    ] {
        assert!(refused.message.contains(said), "{said:?} in {refused:?}");
    }
    assert!(
        !refused.message.contains("trapped"),
        "the default it decides with never falls back: {refused:?}"
    );
    let running = |mcn: MachineConfigNode| mcn.status.unwrap().policy.unwrap();
    let infra_policy = running(t.nodes.get("infra-0").await.unwrap());
    let v2 = format!("oci://{}", t.policies.v2);
    assert_eq!(
        (infra_policy.name.as_str(), infra_policy.module.as_str()),
        ("hostile", v2.as_str())
    );
    let hostile_bytes = std::fs::read(support::policy_path("pinset_test_policy_hostile")).unwrap();
    let manifest_digest = t.policies.v2.rsplit_once('@').unwrap().1;
    assert_eq!(infra_policy.digest, manifest_digest);
    let module_digest = support::sha256(&hostile_bytes);
    assert_eq!(
        infra_policy.module_digest.as_deref(),
        Some(module_digest.as_str())
    );
    let cp_policy = running(t.nodes.get("cp-0").await.unwrap());
    assert_eq!(cp_policy.name, "default");
    assert_eq!(cp_policy.module, pinset_policy::EMBEDDED_DEFAULT_NAME);
    eventually("pool master names the refusal", &|| t.logs(), || async {
        let p = t.pools.get("master").await.map_err(|e| e.to_string())?;
        let status = p.status.unwrap_or_default();
        let c = condition::find(&status.conditions, CONDITION_POLICY_FALLBACK)
            .ok_or("no PolicyFallback condition")?;
        (c.status == "True"
            && c.reason == "PolicyRefused"
            && c.message.contains("node cp-0")
            && c.message.contains(unsigned))
        .then_some(())
        .ok_or(format!("{c:?}"))
    })
    .await;
}

/// A set's new generation is pinned where it applies; a deleted set leaves its pool and the
/// node's status, and its images are unpinned but still present.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_set_is_pinned_again_and_a_deleted_one_unpinned() {
    let Some(t) = ThreePools::start().await else {
        return;
    };
    let all: Vec<_> = t.worker_imgs.iter().map(|n| json!({"name": n})).collect();
    let patch = Patch::Merge(json!({"spec": {"pinnedImages": all}}));
    t.sets
        .patch("worker-set", &PatchParams::default(), &patch)
        .await
        .unwrap();
    t.settled("infra-0", &[("infra-set", 1), ("worker-set", 2)])
        .await;
    let infra_cri = cri(&t.infra_runtime);
    let added = infra_cri.image_status(&t.worker_imgs[2]).await.unwrap();
    assert!(added.is_some_and(|i| i.pinned), "the added image is pinned");

    t.sets
        .delete("infra-set", &DeleteParams::default())
        .await
        .unwrap();
    t.pool_lists("infra", &["worker-set"]).await;
    let what = "infra-0 without infra-set, its images unpinned";
    eventually(what, &|| t.logs(), || async {
        let n = t.nodes.get("infra-0").await.map_err(|e| e.to_string())?;
        let names: Vec<String> = node_state(&n).0.into_iter().map(|s| s.0).collect();
        let image = infra_cri.image_status(&t.infra_imgs[0]).await;
        match image.map_err(|e| e.to_string())? {
            Some(i) if names == vec!["worker-set"] && !i.pinned => Ok(()),
            other => Err(format!("{names:?} {other:?}")),
        }
    })
    .await;
}

/// An image that does not exist: the node is Degraded naming it and its set, so is its pool,
/// and the set that is fine stays done; the Events say so as `kubectl get events` shows them
/// (sets pinned — once, not at every resync — and failed, the module refused, the pool
/// Degraded); the agent's and the controller's metrics count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_degrades_node_and_pool_with_events_and_metrics() {
    let Some(t) = ThreePools::start().await else {
        return;
    };
    let missing = t.cluster.registry.missing_image();
    t.cluster
        .create_set("broken", "master", std::slice::from_ref(&missing))
        .await;
    let message = eventually("cp-0 degraded", &|| t.logs(), || async {
        let n = t.nodes.get("cp-0").await.map_err(|e| e.to_string())?;
        let st = n.status.unwrap_or_default();
        match condition::find(&st.conditions, CONDITION_DEGRADED) {
            Some(c) if c.status == "True" => Ok(c.message.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    support::assert_says(&message, &[&missing, "broken"]);
    let pool_message = eventually("master pool degraded", &|| t.logs(), || async {
        let p = t.pools.get("master").await.map_err(|e| e.to_string())?;
        match pool_counts(&p) {
            Some((1, 0, d, m)) if d == "True" => Ok(m),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    support::assert_says(
        &pool_message,
        &["node cp-0", "PinnedImageSet broken", missing.as_str()],
    );
    let seen = events_seen(&t).await;
    let failed = seen.iter().find(|e| e.2 == "SetFailed").unwrap();
    assert!(
        failed.3.contains("broken") && failed.3.contains(&missing),
        "{failed:?}"
    );
    let pinned = |e: &&(String, String, String, String)| {
        e.1 == "cp-0" && e.2 == "SetPinned" && e.3.contains("master-set")
    };
    let announced = seen.iter().filter(pinned).count();
    assert_eq!(announced, 1, "a set is announced pinned once: {seen:?}");
    let cp_sets = node_state(&t.nodes.get("cp-0").await.unwrap()).0;
    assert!(
        cp_sets.contains(&("master-set".into(), 1, Some(1))),
        "{cp_sets:?}"
    );
    assert_metrics(&t).await;
}

/// The Events of the cluster once cp-0's pinned and failed sets, its refused module and the
/// master pool's Degraded are among them: (kind, name, reason, note).
async fn events_seen(t: &ThreePools) -> Vec<(String, String, String, String)> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(t.cluster.client.clone());
    let want = [
        ("MachineConfigNode", "cp-0", "SetPinned"),
        ("MachineConfigNode", "cp-0", "SetFailed"),
        ("MachineConfigNode", "cp-0", "PolicyRejected"),
        ("MachineConfigPool", "master", "PoolDegraded"),
    ];
    eventually("events recorded", &|| t.logs(), || async {
        let list = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let seen: Vec<(String, String, String, String)> = list
            .items
            .iter()
            .map(|e| {
                let r = e.regarding.clone().unwrap_or_default();
                let reason = e.reason.clone().unwrap_or_default();
                let note = e.note.clone().unwrap_or_default();
                (
                    r.kind.unwrap_or_default(),
                    r.name.unwrap_or_default(),
                    reason,
                    note,
                )
            })
            .collect();
        let has = |(k, n, r): &(&str, &str, &str)| {
            seen.iter()
                .any(|e| (e.0.as_str(), e.1.as_str(), e.2.as_str()) == (*k, *n, *r))
        };
        want.iter()
            .all(has)
            .then_some(seen.clone())
            .ok_or(format!("{seen:?}"))
    })
    .await
}

/// The agent's pulls, failures, policy calls, sets by state and last successful reconcile; the
/// controller's writes; both builds and health endpoints.
async fn assert_metrics(t: &ThreePools) {
    let m = metrics(t.cp_port).await;
    support::assert_says(
        &m,
        &[
            "pinset_images_pulled_total 2",
            "pinset_image_pull_failures_total",
            "pinset_policy_call_seconds_bucket",
        ],
    );
    for port in [t.cp_port, t.controller_port] {
        for path in ["/healthz", "/readyz"] {
            let r = get(port, path).await;
            assert!(r.starts_with("HTTP/1.0 200"), "{path}: {r}");
        }
    }
    let c = metrics(t.controller_port).await;
    support::assert_says(&c, &["pinset_api_writes_total{kind=\"pool_spec\"}"]);
    let build = format!(
        "pinset_build_info{{version=\"{}\",commit=\"",
        env!("CARGO_PKG_VERSION")
    );
    assert!(m.contains(&build) && c.contains(&build), "{build}\n{m}");
    for state in ["pinned", "failed", "pending"] {
        let family = format!("pinset_node_sets{{state=\"{state}\"}}");
        support::assert_says(&m, &[&family]);
    }
    let last = metric(&m, "pinset_last_successful_reconcile_timestamp_seconds");
    assert!(
        last > 1_700_000_000,
        "a reconcile pinned every set: {last}\n{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_run_is_finished_by_the_next_one_without_pulling_twice() {
    let Some((cluster, runtime, refs, nodes, cri)) = release_bed("k", 10, 700).await else {
        return;
    };
    let mut first = cluster.release_agent(&runtime, support::free_port(), "first.log");
    let logs = || cluster.logs_with(&first);
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
    let logs = || cluster.logs_with(&second);
    node_settles(
        &nodes,
        "cp-0",
        &[("release", 1)],
        "the restarted agent finishes the set",
        &logs,
    )
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
    let Some((cluster, runtime, refs, nodes, cri)) = release_bed("o", 6, 900).await else {
        return;
    };
    let server = &cluster.server;
    let agent = cluster.release_agent(&runtime, support::free_port(), "agent.log");
    let logs = || cluster.logs_with(&agent);
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
    node_settles(
        &nodes,
        "cp-0",
        &[("release", 1)],
        "the final status published",
        &logs,
    )
    .await;
    // Within the agent's retry interval (1 s here), not its 10-minute resync.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(agent.log().contains("status not published"), "{}", logs());
}

/// A node's MachineConfigNode deleted under a running agent (by hand, or with its CRD) is
/// written again, spec and status, without a restart and before the next resync: the pool
/// would otherwise stop counting the node, and the controller have nowhere to grant it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_config_node_deleted_under_its_agent_is_written_again() {
    let Some((cluster, runtime, _refs, nodes, _cri)) = release_bed("d", 2, 1100).await else {
        return;
    };
    let agent = cluster.release_agent(&runtime, support::free_port(), "agent.log");
    let logs = || cluster.logs_with(&agent);
    let what = "the agent pins the set";
    node_settles(&nodes, "cp-0", &[("release", 1)], what, &logs).await;
    let before = nodes.get("cp-0").await.unwrap();
    nodes
        .delete("cp-0", &DeleteParams::default())
        .await
        .unwrap();
    let what = "the MachineConfigNode written again, its set still pinned";
    node_settles(&nodes, "cp-0", &[("release", 1)], what, &logs).await;
    let after = nodes.get("cp-0").await.unwrap();
    assert_ne!(after.metadata.uid, before.metadata.uid, "a new object");
    assert_eq!(after.spec.pool.name, "master");
    assert_eq!(after.spec.node.name, "cp-0");
    assert!(
        agent
            .log()
            .contains("the MachineConfigNode is gone; writing it again"),
        "{}",
        agent.log()
    );
}
