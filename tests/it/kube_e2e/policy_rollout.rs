use super::*;
use pinset_k8s::api::PoolRollout;

/// Each fleet node's MachineConfigNode as the API server has it now (`None`: not read).
async fn fleet_mcns(nodes: &Api<MachineConfigNode>) -> Vec<Option<MachineConfigNode>> {
    let mut out = Vec::new();
    for name in FLEET_NODES {
        out.push(nodes.get(name).await.ok());
    }
    out
}

/// The module each fleet node says it runs, and the one it last refused.
async fn node_policies(nodes: &Api<MachineConfigNode>) -> Vec<(Option<String>, Option<String>)> {
    let policies = |mcn: Option<MachineConfigNode>| {
        let st = mcn.and_then(|n| n.status).unwrap_or_default();
        let rejected = st.policy_rejected;
        (
            st.policy.map(|p| p.module),
            rejected.map(|r| format!("{}: {}", r.module, r.cause)),
        )
    };
    fleet_mcns(nodes).await.into_iter().map(policies).collect()
}

/// Which fleet nodes hold a grant for the policy entry of `module`.
async fn policy_granted(nodes: &Api<MachineConfigNode>, module: &str) -> Vec<bool> {
    let entry = pinset_core::rollout::policy_set(&format!("oci://{module}"));
    let granted = |mcn: Option<MachineConfigNode>| {
        let grant = mcn.and_then(|n| n.spec.rollout_grant);
        grant.is_some_and(|g| g.sets.iter().any(|s| s.name == entry))
    };
    fleet_mcns(nodes).await.into_iter().map(granted).collect()
}

/// A fleet node's state against the policy entry of `module`: granted it, and running it.
fn policy_state(mcn: &MachineConfigNode, entry: &str, module: &str) -> (bool, bool) {
    let granted = mcn
        .spec
        .rollout_grant
        .as_ref()
        .is_some_and(|g| g.sets.iter().any(|s| s.name == entry));
    let running = mcn
        .status
        .as_ref()
        .and_then(|s| s.policy.as_ref())
        .is_some_and(|p| p.module == module);
    (granted, running)
}

/// Apply `change` (which returns when it was made), then follow the fleet nodes through a
/// watch — every change in the API server's order, however fast the rollout — until each runs
/// `module`, checking that no node was granted it before the first granted one (the canary)
/// ran it. The canary's index, and the times from the change to the canary and to the whole
/// pool running it.
async fn follow_policy_rollout(
    nodes: &Api<MachineConfigNode>,
    module: &str,
    change: impl Future<Output = Instant>,
    logs: &dyn Fn() -> String,
) -> (usize, Duration, Duration) {
    use futures::StreamExt;
    let module = format!("oci://{module}");
    let entry = pinset_core::rollout::policy_set(&module);
    let mut events = std::pin::pin!(kube::runtime::watcher(nodes.clone(), Default::default()));
    let mut state = [(false, false); FLEET_NODES.len()];
    // The nodes as they are before the change.
    while let Some(event) = events.next().await {
        match event.unwrap() {
            kube::runtime::watcher::Event::InitDone => break,
            kube::runtime::watcher::Event::InitApply(n) => {
                if let Some(i) = FLEET_NODES
                    .iter()
                    .position(|f| Some(*f) == n.metadata.name.as_deref())
                {
                    state[i] = policy_state(&n, &entry, &module);
                }
            }
            _ => {}
        }
    }
    assert!(
        state.iter().all(|s| !s.0 && !s.1),
        "{module} already granted: {state:?}"
    );
    let since = change.await;
    let mut canary: Option<(usize, Option<Duration>)> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let next = tokio::time::timeout_at(deadline, events.next()).await;
        let event =
            next.unwrap_or_else(|_| panic!("{module} not rolled out: {state:?}\n{}", logs()));
        let Some(Ok(kube::runtime::watcher::Event::Apply(n))) = event else {
            continue;
        };
        let Some(i) = FLEET_NODES
            .iter()
            .position(|f| Some(*f) == n.metadata.name.as_deref())
        else {
            continue;
        };
        state[i] = policy_state(&n, &entry, &module);
        assert!(
            state[i].0 || !state[i].1,
            "{} swapped without a grant\n{}",
            FLEET_NODES[i],
            logs()
        );
        if canary.is_none() && state[i].0 {
            canary = Some((i, None));
        }
        let Some((c, _)) = canary else { continue };
        if state[c].1 {
            canary.as_mut().unwrap().1.get_or_insert(since.elapsed());
        }
        let others = (0..FLEET_NODES.len())
            .filter(|&j| j != c && state[j].0)
            .count();
        assert!(
            others == 0 || canary.unwrap().1.is_some(),
            "{} granted {module} before the canary {} ran it: {state:?}\n{}",
            FLEET_NODES[i],
            FLEET_NODES[c],
            logs()
        );
        if state.iter().all(|s| s.1) {
            return (c, canary.unwrap().1.unwrap(), since.elapsed());
        }
    }
}

/// `pinset rollout status worker --timeout 90s -o json` as `kubeconfig`, started now:
/// (exit code, stdout, stderr).
fn follow_worker(kubeconfig: &str) -> tokio::task::JoinHandle<(i32, String, String)> {
    let status = [
        "rollout",
        "status",
        "worker",
        "--timeout",
        "90s",
        "-o",
        "json",
    ];
    let args = status.into_iter().chain(["--kubeconfig", kubeconfig]);
    tokio::spawn(support::pinset_blocking(args.map(String::from).collect()))
}

/// `pinset rollout status worker -o json` started right after `change` landed, with no pause
/// between them (as a pipeline runs them): (exit code, the last status, stderr).
async fn status_after(
    change: impl Future<Output = Instant>,
    kubeconfig: &str,
) -> (i32, serde_json::Value, String) {
    change.await;
    let (code, out, err) = follow_worker(kubeconfig).await.unwrap();
    let status = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    (code, status, err)
}

/// A [`FleetBed`] whose agents and controller follow the PolicyConfiguration `cluster` (v1 of
/// [`Releases`] for the pool `worker`, signatures required; the nodes labelled for the hostile
/// module to trap in `order`), with the set `apps` of two `prefix` images: once every node runs
/// v1 and pins the set. The releases and the images.
async fn policy_fleet(prefix: &str, seed: u64) -> Option<(FleetBed, Releases, Vec<String>)> {
    let bed = FleetBed::start().await?;
    let cluster = &bed.cluster;
    let releases = Releases::push(cluster, cluster.dir.path());
    releases
        .configure(&cluster.client, &releases.v1, None)
        .await;
    let images = support::push_images(&cluster.registry, prefix, 2, 50_000, seed).await;
    cluster.create_pool("worker", &["worker"]).await;
    cluster.create_set("apps", "worker", &images).await;
    let follow = [
        "--policy-configuration=cluster".to_string(),
        format!("--policy-insecure-registry={}", cluster.registry.host),
    ];
    bed.controller("controller.log", &follow);
    let trap_order = [("pinset.test/hostile".to_string(), "trap-order".to_string())];
    let dir = cluster.dir.path();
    bed.agents(&trap_order, |name| {
        let cache = dir.join(format!("{name}-cache"));
        let mut args = follow.to_vec();
        args.push(format!("--policy-cache={}", cache.display()));
        args
    });
    let v1 = format!("oci://{}", releases.v1);
    eventually(
        "every node runs v1 and pins the set",
        &|| bed.logs(),
        || async {
            let p = node_policies(&bed.nodes).await;
            let l = bed.look(1, &[]).await;
            let on_v1 = p.iter().all(|(m, _)| m.as_deref() == Some(v1.as_str()));
            match on_v1 && l.done.iter().all(|d| *d) {
                true => Ok(()),
                false => Err(format!("{p:?} {l:?}")),
            }
        },
    )
    .await;
    Some((bed, releases, images))
}

/// The digest of a reference `…@sha256:…`.
fn digest_of(reference: &str) -> String {
    reference.rsplit_once('@').unwrap().1.to_string()
}

/// The pool counts its nodes by the digest the operator wrote (v1's manifest digest), not by
/// its bytes'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_counts_its_nodes_by_the_policy_digest_the_operator_wrote() {
    let Some((bed, releases, _)) = policy_fleet("policy-count", 900).await else {
        return;
    };
    let (v1, written) = (format!("oci://{}", releases.v1), digest_of(&releases.v1));
    eventually(
        "the pool counts its nodes per policy digest",
        &|| bed.logs(),
        || async {
            let pool = bed.pools.get("worker").await.map_err(|e| e.to_string())?;
            let st = pool.status.unwrap_or_default();
            match st.policies.as_slice() {
                [p] if p.nodes == 3 && p.digest == written && p.module == v1 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// A module that traps in `order` on these nodes: the canary refuses it in its smoke test, the
/// pool holds Degraded naming the node, the module and the cause, and the others never take it.
/// `rollout status`, run at once after the change, waits for the controller to see it and exits
/// 1 on the hold (never 0 on the status of v1's rollout). A fleet policy swapped on the running
/// controller then decides, and writes no grant again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_the_canary_refuses_holds_the_pool_through_a_fleet_policy_swap() {
    let Some((bed, releases, _)) = policy_fleet("policy-held", 910).await else {
        return;
    };
    let (client, logs) = (&bed.cluster.client, || bed.logs());
    let (v1, v2_digest) = (format!("oci://{}", releases.v1), digest_of(&releases.v2));
    let change = releases.configure(client, &releases.v2, None);
    let (code, status, err) = status_after(change, &bed.operator).await;
    assert_eq!(code, 1, "{status}\n{err}\n{}", logs());
    assert_eq!(status["standing"], "Degraded", "{status}");
    let message = status["message"].as_str().unwrap_or("");
    assert!(message.contains(&v2_digest), "{status}");
    support::assert_says(&err, &["MachineConfigPool worker is Degraded"]);
    let canary_refused = |_: Option<PoolRollout>, degraded: String, _: String| {
        let held = degraded.contains("canary node") && degraded.contains(&v2_digest);
        held.then_some(degraded)
    };
    let held = bed
        .pool_when("the canary refuses v2 and the pool holds", canary_refused)
        .await;
    support::assert_says(&held, &["smoke test", "order", "trap"]);
    let policies = node_policies(&bed.nodes).await;
    let refused: Vec<usize> = (0..3).filter(|&i| policies[i].1.is_some()).collect();
    assert_eq!(refused.len(), 1, "{policies:?}");
    let canary = FLEET_NODES[refused[0]];
    support::assert_says(&held, &[canary]);
    throughout(20, || async {
        let granted = policy_granted(&bed.nodes, &releases.v2).await;
        let others = (0..3).filter(|i| *i != refused[0]);
        let other_granted = others.filter(|&i| granted[i]).map(|i| FLEET_NODES[i]);
        let other_granted: Vec<_> = other_granted.collect();
        assert!(
            other_granted.is_empty(),
            "{other_granted:?} granted v2 after the canary refused it"
        );
        let p = node_policies(&bed.nodes).await;
        let on_v1 = p.iter().all(|(m, _)| m.as_deref() == Some(v1.as_str()));
        assert!(on_v1, "v1 everywhere: {p:?}");
    })
    .await;
    bed.events_of(canary, &[("PolicyRejected", &v2_digest)])
        .await;
    // The hostile module's fleet side, which answers as the default without its annotation,
    // decides from now on: the pool's rollout names it, the hold stands, no grant is written.
    let grants = |m: &str| metric(m, "pinset_api_writes_total{kind=\"node_grant\"}");
    let written = grants(&metrics(bed.controller_port).await);
    releases
        .configure(client, &releases.v2, Some(&releases.v2))
        .await;
    let swapped = |r: Option<PoolRollout>, degraded: String, _: String| {
        let policy = r.map(|r| r.policy).unwrap_or_default();
        (policy.contains("worker-v2") && degraded.contains("canary node")).then_some(())
    };
    bed.pool_when("the controller swaps its fleet policy", swapped)
        .await;
    let now = grants(&metrics(bed.controller_port).await);
    assert_eq!(now, written, "no grant written again");
}

/// A good module rolls out canary first, then in waves, until every node runs it; no agent
/// restarts. `rollout status`, started the moment the change lands, follows it to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_module_rolls_out_canary_first_and_no_agent_restarts() {
    let Some((bed, releases, _)) = policy_fleet("policy-good", 920).await else {
        return;
    };
    let (client, logs) = (&bed.cluster.client, || bed.logs());
    let agents_before = bed.agents_running();
    let follower = std::cell::RefCell::new(None);
    let change = async {
        let at = releases.configure(client, &releases.v3, None).await;
        *follower.borrow_mut() = Some(follow_worker(&bed.operator));
        at
    };
    let (canary, to_canary, to_pool) =
        follow_policy_rollout(&bed.nodes, &releases.v3, change, &logs).await;
    let followed = follower.borrow_mut().take().unwrap();
    let (code, out, err) = followed.await.unwrap();
    assert_eq!(code, 0, "{out}\n{err}\n{}", logs());
    let followed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let v3_entry = pinset_core::rollout::policy_set(&format!("oci://{}", releases.v3));
    assert_eq!(followed["standing"], "Complete", "{followed}");
    let target = followed["target"].as_str().unwrap();
    assert!(
        target.contains(&v3_entry) && followed["done"] == 3,
        "the status of the change just made: {followed}"
    );
    let canary = FLEET_NODES[canary];
    eprintln!("policy rollout: canary {canary} after {to_canary:?}, 3 nodes after {to_pool:?}");
    assert_eq!(
        bed.agents_running(),
        agents_before,
        "an agent exited\n{}",
        logs()
    );
    let v3_digest = digest_of(&releases.v3);
    let i = FLEET_NODES.iter().position(|n| *n == canary).unwrap();
    let m = metrics(bed.agent_ports[i]).await;
    let swapped = metric(&m, "pinset_policy_swaps_total{result=\"swapped\"}");
    assert!(swapped >= 1, "{m}");
    support::assert_says(&m, &[&format!("digest=\"{v3_digest}\"")]);
    let counted = |_: Option<PoolRollout>, degraded: String, _: String| Some(degraded);
    let on_v3 = eventually("the pool counts every node on v3", &logs, || async {
        let pool = bed.pools.get("worker").await.map_err(|e| e.to_string())?;
        let counts = pool.status.unwrap_or_default().policies;
        match counts.as_slice() {
            [p] if p.digest == v3_digest && p.nodes == 3 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    on_v3.await;
    let degraded = bed.pool_when("the pool's conditions", counted).await;
    assert!(degraded.is_empty(), "{degraded}");
    let v3_hex = v3_entry.trim_start_matches("policy@");
    bed.events_of(canary, &[("PolicySwapped", "unthrottled")])
        .await;
    bed.events_of("worker", &[("PolicyRolledOut", v3_hex)])
        .await;
}

/// A policy change while a pull is in flight: the reconcile finishes with the module it started
/// with, nothing is cancelled, and the node swaps after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_during_a_pull_waits_for_the_pull() {
    let Some((bed, releases, _)) = policy_fleet("policy-pull", 930).await else {
        return;
    };
    let (cluster, logs) = (&bed.cluster, || bed.logs());
    let late = support::push_images(&cluster.registry, "policy-late", 1, 50_000, 931).await;
    cluster.registry.stop();
    cluster.create_set("late", "worker", &late).await;
    let puller = eventually("a canary is granted the new set", &logs, || async {
        let l = look(&bed.nodes, &[], "late", 1, &late).await;
        l.granted.iter().position(|g| *g).ok_or(format!("{l:?}"))
    })
    .await;
    let again = "the desired state changed: reconciling again";
    let again_lines = || bed.agent_log(puller).matches(again).count();
    // The pull waits on the registry (the agent retries it): the policy changes meanwhile.
    eventually(
        "the canary pulls the new set, its registry away",
        &logs,
        || async {
            let n = bed.nodes.get(FLEET_NODES[puller]).await;
            let (sets, progressing, _) = node_state(&n.map_err(|e| e.to_string())?);
            let pulling =
                progressing == "True" && sets.iter().any(|s| s.0 == "late" && s.2.is_none());
            pulling
                .then_some(())
                .ok_or(format!("{sets:?} progressing {progressing}"))
        },
    )
    .await;
    let restarts_before = again_lines();
    releases
        .configure(&cluster.client, &releases.v3, None)
        .await;
    let v3_digest = digest_of(&releases.v3);
    let names_v3 =
        |r: Option<PoolRollout>, _: String, _: String| r.filter(|r| r.target.contains(&v3_digest));
    bed.pool_when("the pool's target names v3", names_v3).await;
    cluster.registry.restart();
    let v3 = format!("oci://{}", releases.v3);
    eventually("every node pins the new set and runs v3", &logs, || async {
        let l = look(&bed.nodes, &[], "late", 1, &late).await;
        let p = node_policies(&bed.nodes).await;
        let on_v3 = p.iter().all(|(m, _)| m.as_deref() == Some(v3.as_str()));
        match l.done.iter().all(|d| *d) && on_v3 {
            true => Ok(()),
            false => Err(format!("{l:?} {p:?}")),
        }
    })
    .await;
    let who = FLEET_NODES[puller];
    let cancelled = format!("the policy change cancelled {who}'s reconcile\n{}", logs());
    assert_eq!(again_lines(), restarts_before, "{cancelled}");
}

/// A set change, `rollout status` run the moment it is made: exit 0 once every node pins its
/// new generation, the status of that generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_status_follows_a_set_change_to_its_end() {
    let Some((bed, _, _)) = policy_fleet("policy-set", 940).await else {
        return;
    };
    let more = support::push_images(&bed.cluster.registry, "policy-more", 1, 50_000, 941).await;
    let change = async {
        let mut apps = bed.sets.get("apps").await.unwrap();
        let extra = pinset_k8s::api::PinnedImageRef {
            name: more[0].clone(),
        };
        apps.spec.pinned_images.push(extra);
        let params = PostParams::default();
        bed.sets.replace("apps", &params, &apps).await.unwrap();
        Instant::now()
    };
    let (code, status, err) = status_after(change, &bed.operator).await;
    assert_eq!(code, 0, "{status}\n{err}\n{}", bed.logs());
    let target = status["target"].as_str().unwrap();
    assert!(
        target.starts_with("apps@2,") && status["done"] == 3,
        "{status}"
    );
}

/// An unsigned module never reaches a node: the controller checks its signature before the
/// pool's target names it. A digest the registry lacks is not found, not unsigned. Each is said
/// by `rollout status` run at once after the change (exit 1, the cause named); the node is
/// never granted the module and keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsigned_or_missing_module_is_refused_before_any_node() {
    let Some(n) = PolicyNode::start("refused").await else {
        return;
    };
    let client = n.cluster.client.clone();
    let operator = n.cluster.operator_kc.display().to_string();
    let releases = &n.releases;
    let change = releases.configure(&client, &releases.unsigned, None);
    let (code, status, err) = status_after(change, &operator).await;
    assert_eq!(code, 1, "{status}\n{err}\n{}", n.logs());
    let why = status["message"].as_str().unwrap_or_default().to_string();
    support::assert_says(
        &why,
        &[
            "worker-unsigned",
            "(Unsigned)",
            "no cosign signature",
            "every node keeps its module",
        ],
    );
    let (repo, _) = releases.unsigned.rsplit_once('@').unwrap();
    let missing = format!("{repo}@sha256:{}", "0".repeat(64));
    let change = releases.configure(&client, &missing, None);
    let (code, status, err) = status_after(change, &operator).await;
    assert_eq!(code, 1, "{status}\n{err}\n{}", n.logs());
    let why = status["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("(NotFound)") && !why.contains("no cosign signature"),
        "{why}"
    );
    releases.configure(&client, &releases.unsigned, None).await;
    let granted = policy_granted(&n.nodes, &releases.unsigned).await;
    assert!(
        granted.iter().all(|g| !g),
        "a node was granted the unsigned module"
    );
    let (module, ..) = policy_of(&n.nodes, PolicyNode::NAME).await.unwrap();
    assert_eq!(module, Some(format!("oci://{}", releases.v1)));
}

/// An agent restarted while the registry is away decides with the module it ran before, from
/// its cache: no refusal, no fall back to the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_decides_from_its_cache_with_the_registry_gone() {
    let Some(mut n) = PolicyNode::start("cache").await else {
        return;
    };
    let client = n.cluster.client.clone();
    n.releases.configure(&client, &n.releases.v3, None).await;
    n.runs(&n.releases.v3).await;
    n.cluster.registry.stop();
    n.restart_agent("cache-agent-restarted.log");
    let v3_digest = n.releases.v3.rsplit_once('@').unwrap().1.to_string();
    let port = n.agent_port;
    eventually(
        "the restarted agent runs v3 from its cache",
        &|| n.logs(),
        || async {
            let m = try_get(port, "/metrics").await?;
            m.contains(&format!("digest=\"{v3_digest}\""))
                .then_some(())
                .ok_or(m)
        },
    )
    .await;
    n.runs(&n.releases.v3).await;
    let log = n.agent.log();
    let from_cache = "deciding with the module the node ran before the restart";
    support::assert_says(&log, &[from_cache]);
    assert!(!log.contains("refused"), "{log}");
}

/// The manual's recipe for changing a pool's policy (docs/policy-rollout.md), run as written:
/// its lines with the registry, the module, the key and the digest it printed filled in, in one
/// shell whose registries file and kubeconfig are this cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manuals_recipe_changes_a_pools_policy_as_written() {
    let Some(n) = PolicyNode::start("recipe").await else {
        return;
    };
    readme_recipe(&n.cluster, 1, &|| n.logs()).await;
}

/// The shell block of docs/policy-rollout.md ("Changing a pool's policy"), each command with
/// its `…` filled in, run by bash in order; every one exits 0 and the pool then counts its
/// `nodes` on the module.
async fn readme_recipe(cluster: &Cluster, nodes: u32, logs: &dyn Fn() -> String) {
    let page = support::workspace().join("docs/policy-rollout.md");
    let readme = std::fs::read_to_string(page).unwrap();
    let section = readme.split("# Changing a pool's policy").nth(1).unwrap();
    let block = section
        .split("```sh\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let commands: Vec<String> = block
        .replace("\\\n", " ")
        .lines()
        .map(|l| l.split("  #").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands.len(), 5, "{block}");
    let dir = cluster.dir.path();
    let host = cluster.registry.host.clone();
    let sources = dir.join("registries.yaml");
    std::fs::write(&sources, format!("insecureRegistries: [{host}]\n")).unwrap();
    let credentials = dir.join("no-credentials.json");
    std::fs::write(&credentials, "{}").unwrap();
    let module = support::policy_path("pinset_policy_smallest_first");
    let fill = |c: &str, digest: &str| {
        c.replace("registry.example.com", &host)
            .replace("policy.wasm", module.to_str().unwrap())
            .replace("~/.docker/config.json", credentials.to_str().unwrap())
            .replace("cosign.key", dir.join("cosign.key").to_str().unwrap())
            .replace("sha256:…", digest)
    };
    let bin = std::path::Path::new(support::PINSET)
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut digest = String::new();
    for command in &commands[..4] {
        let line = fill(command, &digest);
        if line.starts_with("kubectl ") {
            kubectl_patch(cluster, &line).await;
            continue;
        }
        let (kc, env, path) = (
            cluster.server.kubeconfig.clone(),
            sources.clone(),
            path.clone(),
        );
        let out = tokio::task::spawn_blocking(move || {
            // A deadline on each line: the recipe's `rollout status` waits as long as it takes.
            let mut command = std::process::Command::new("timeout");
            support::without_terminal(command.args(["180", "bash", "-c", &line]))
                .env("PATH", path)
                .env("PINSET_REGISTRIES", env)
                .env("KUBECONFIG", kc)
                .env("PINSET_LOG", "warn")
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{command}: {stdout}{stderr}\n{}",
            logs()
        );
        if digest.is_empty() {
            digest = stdout.trim().rsplit_once('@').unwrap().1.to_string();
        }
    }
    // `kubectl get mcp worker -o jsonpath='{.status.policies}'`: the pool's counts land with
    // the controller's next status write, so asked until they do.
    assert!(
        commands[4].contains("{.status.policies}"),
        "{}",
        commands[4]
    );
    let pools: Api<MachineConfigPool> = Api::all(cluster.client.clone());
    eventually(
        "the pool counts its nodes on the module just rolled out",
        logs,
        || async {
            let p = pools.get("worker").await.map_err(|e| e.to_string())?;
            let counts = p.status.unwrap_or_default().policies;
            match counts.as_slice() {
                [c] if c.digest == digest && c.nodes == nodes => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// A recipe's `kubectl patch KIND NAME --type merge -p 'JSON'`, done through the API with the
/// line's own JSON: kubectl asks for the core API group's discovery, which the test API server
/// (apiextensions-apiserver) does not serve.
async fn kubectl_patch(cluster: &Cluster, line: &str) {
    assert!(
        line.starts_with("kubectl patch policyconfiguration cluster --type merge"),
        "{line}"
    );
    let json = line.split("-p '").nth(1).unwrap().trim_end_matches('\'');
    let patch: serde_json::Value = serde_json::from_str(json).unwrap();
    let api: Api<pinset_k8s::api::PolicyConfiguration> = Api::all(cluster.client.clone());
    api.patch(
        "cluster",
        &Default::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
}
