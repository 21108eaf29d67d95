use super::*;

/// One rule removed from the manifests' RBAC — the agent's right to patch its
/// MachineConfigNode's status, the commonest way a fresh install fails — and the agent's first
/// request that needs it is refused by the API server: the agent says who may not do what and
/// where to grant it, never as an outage, and retries with backoff (its node is not granted the
/// rollout meanwhile: the controller grants from the reports it cannot write); once the rule is
/// back, the status lands, the set is pulled and pinned, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_missing_from_the_manifests_is_a_clear_refusal_retried_until_granted() {
    let Some((cluster, runtime)) = Cluster::with_runtime().await else {
        return;
    };
    let full = support::rbac::Rbac::render(&support::workspace().join("deploy"))
        .unwrap()
        .with_binding("pinset-rollout", OPERATOR);
    let status_patch = support::rbac::Request {
        user: "system:serviceaccount:pinset:pinset-agent".into(),
        verb: "patch".into(),
        group: "machineconfiguration.openshift.io".into(),
        resource: "machineconfignodes".into(),
        subresource: "status".into(),
        name: "w-0".into(),
        ..Default::default()
    };
    let rule = full.allows(&status_patch).expect("the manifests grant it");
    cluster.authorizer.set_rules(full.without(&rule));
    let images = support::push_images(&cluster.registry, "rbac", 1, 50_000, 700).await;
    cluster.create_pool("worker", &["worker"]).await;
    cluster.create_set("apps", "worker", &images).await;
    let controller = cluster.controller(support::free_port(), "controller.log", &[]);
    let agent = cluster.agent(
        "w-0",
        &roles(&["worker"]),
        &runtime,
        support::free_port(),
        "w-0.log",
        &[],
    );
    let logs = || agent.log();
    let all_logs = || {
        let refused: Vec<String> = cluster.refused();
        format!(
            "{}\n--- controller ---\n{}\nrefused: {refused:?}",
            agent.log(),
            controller.log()
        )
    };
    let said = "forbidden: system:serviceaccount:pinset:pinset-agent may not patch machineconfignodes/status (machineconfiguration.openshift.io); grant it in pinset's ClusterRole";
    eventually("the refusal said", &logs, || async {
        match logs().contains(said) {
            true => Ok(()),
            false => Err("not yet".to_string()),
        }
    })
    .await;
    // Retried, not given up: the same request refused again, a backoff apart.
    let refused = || {
        cluster
            .authorizer
            .decisions()
            .into_iter()
            .filter(|d| d.allowed_by.is_none() && d.request.subresource == "status")
            .count()
    };
    eventually("the write retried", &logs, || async {
        match refused() {
            n if n >= 2 => Ok(()),
            n => Err(format!("{n} refusal(s)")),
        }
    })
    .await;
    assert!(
        !logs().contains("is the API server down"),
        "a refusal is not an outage"
    );
    // An operator never bound to pinset-rollout: the command says who may not do what.
    cluster.authorizer.may_refuse("bob");
    let bob = cluster
        .server
        .kubeconfig_as("bob", &["system:authenticated"]);
    let (code, out, err) = worker_status_now(&bob.display().to_string(), &[]).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        // (Whichever of the command's four watches is refused first.)
        err.contains("error: forbidden: bob may not list ")
            && ["machineconfiguration.openshift.io", "pinset.io"]
                .iter()
                .any(|g| err.contains(&format!("({g}); grant it in pinset's ClusterRole"))),
        "{err}"
    );
    // The rule back: the next retry lands.
    cluster.authorizer.set_rules(full);
    cluster.authorizer.forget_refusals();
    let nodes: Api<MachineConfigNode> = Api::all(cluster.client.clone());
    eventually("the status published once granted", &all_logs, || async {
        match nodes.get_opt("w-0").await {
            Ok(Some(n)) if node_state(&n) == settled(&[("apps", 1)]) => Ok(()),
            other => Err(format!("{:?}", other.map(|n| n.map(|n| node_state(&n))))),
        }
    })
    .await;
}

/// Trust on the unhappy path, on one node. The registry goes away while the pool's policy
/// changes: the canary waits for it — no refusal, no hold, the node keeps its module — and takes
/// the new module once the registry is back (the recheck schedule's first wait, 30 s). Then the
/// trusted key is replaced by one that signed nothing: the running module is checked again at
/// once and retired for the default, said as a refused signature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_away_is_waited_for_and_a_removed_key_retires_what_it_vouched_for() {
    let Some(n) = PolicyNode::start("trust").await else {
        return;
    };
    let client = n.cluster.client.clone();
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let releases = n.releases.clone();
    let v3 = format!("oci://{}", releases.v3);
    let v1 = format!("oci://{}", releases.v1);

    // The registry goes away, and the pool's policy changes to v3, which no node has.
    n.cluster.registry.stop();
    releases.configure(&client, &releases.v3, None).await;
    n.policy_becomes(
        "the canary waits for the registry",
        |(module, rejected, fallback)| {
            let waiting = *fallback == ("False".into(), "WaitingForRegistry".into());
            waiting && rejected.is_none() && module.as_deref() == Some(v1.as_str())
        },
    )
    .await;
    let (_, degraded, _) = rollout_of(&pools.get("worker").await.unwrap());
    assert!(
        degraded.is_empty(),
        "a registry away holds nothing: {degraded}"
    );

    // Back: the recheck takes v3.
    n.cluster.registry.restart();
    n.policy_becomes(
        "the node takes v3 once the registry is back",
        |(module, rejected, _)| module.as_deref() == Some(v3.as_str()) && rejected.is_none(),
    )
    .await;

    // The trusted key is replaced by one that signed nothing.
    let other = pinset_registry::signature::SigningKey::generate(b"")
        .unwrap()
        .1
        .public()
        .to_pem();
    let rotated = Releases {
        public_key: other,
        ..releases
    };
    rotated.configure(&client, &rotated.v3, None).await;
    n.policy_becomes(
        "the module no trusted key vouches for is retired",
        |(module, rejected, _)| {
            module.as_deref() == Some(pinset_policy::EMBEDDED_DEFAULT_NAME)
                && rejected.as_deref() == Some("SignatureRefused")
        },
    )
    .await;
}

/// A policy registry that misbehaves on purpose — a body that never ends, then bytes a second —
/// while the agent and the controller run. The controller, configured with a node module and a
/// fleet module there, ends each check at its cap or deadline, says so naming the registry, and
/// goes on reconciling: it selects a set created meanwhile. An agent told a pool module there
/// (`--pool-policy`) checks it in the background, decides with the default meanwhile and pins
/// the set: its rounds never wait on the registry. Neither passes 128 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_policy_registry_stalls_neither_the_agent_nor_the_controller() {
    use pinset_testkit::hostile::{Hostile, Misbehaviour};
    let Some((cluster, runtime)) = Cluster::with_runtime().await else {
        return;
    };
    let client = cluster.client.clone();
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let nodes: Api<MachineConfigNode> = Api::all(client.clone());
    let releases = Releases::push(&cluster, cluster.dir.path());
    cluster.create_pool("worker", &["worker"]).await;
    let hostile = [
        ("an endless body", Hostile::start(Misbehaviour::EndlessBody)),
        ("a byte a second", Hostile::start(Misbehaviour::Trickle)),
    ];
    let insecure: Vec<String> = hostile
        .iter()
        .map(|(_, h)| format!("--insecure-registry={}", h.addr))
        .collect();
    let mut args = vec!["--policy-configuration=cluster".into()];
    args.extend(insecure.iter().cloned());
    let controller = cluster.controller(support::free_port(), "hostile-controller.log", &args);
    let name = FLEET_NODES[0];
    let mut wanted: Vec<(String, i64)> = Vec::new();
    // What the node says of the module: refused (an answer pinset will not read), or not
    // checked yet (no complete answer in time: the registry is away, asked again with backoff).
    let said = [
        (Some("RegistryRefused"), ("True", "PolicyRefused")),
        (None, ("False", "WaitingForRegistry")),
    ];
    for (i, (what, registry)) in hostile.iter().enumerate() {
        let module = format!(
            "{}/policies/p@sha256:{}",
            registry.addr,
            i.to_string().repeat(64)
        );
        releases.configure(&client, &module, Some(&module)).await;
        let mut extra = insecure.clone();
        extra.push(format!("--pool-policy=worker=oci://{module}"));
        let agent = cluster.agent(
            name,
            &roles(&["worker"]),
            &runtime,
            support::free_port(),
            &format!("hostile-agent-{i}.log"),
            &extra,
        );
        let logs = || {
            format!(
                "--- controller ---\n{}\n--- agent ---\n{}",
                controller.log(),
                agent.log()
            )
        };
        let set_name = format!("apps-{i}");
        let images =
            support::push_images(&cluster.registry, &set_name, 1, 50_000, 900 + i as u64).await;
        cluster.create_set(&set_name, "worker", &images).await;
        wanted.push((set_name.clone(), 1));
        // The node pins every set deciding with the default and says why, the controller selects
        // the new set for the pool, and both have asked the registry and logged it, naming it.
        let want: Vec<(&str, i64)> = wanted.iter().map(|(s, g)| (s.as_str(), *g)).collect();
        eventually(&format!("{what}: both at work"), &logs, || async {
            let node = nodes.get(name).await.map_err(|e| e.to_string())?;
            let (running, rejected, fallback) = policy_of(&nodes, name).await?;
            let (want_rejected, (status, reason)) = said[i];
            let reported = rejected.as_deref() == want_rejected
                && fallback == (status.to_string(), reason.to_string());
            let selected = pool_sets(&pools.get("worker").await.map_err(|e| e.to_string())?);
            let logged = !registry.seen().is_empty()
                && agent.log().contains(&registry.addr)
                && controller.log().contains(&registry.addr);
            let pinned = node_state(&node) == settled(&want);
            let default = running.as_deref() == Some(pinset_policy::EMBEDDED_DEFAULT_NAME);
            (pinned && default && reported && selected.contains(&set_name) && logged)
                .then_some(())
                .ok_or(format!(
                    "pinned {pinned} ({:?}), running {running:?}, reported {rejected:?} \
                     {fallback:?}, selected {selected:?}, logged {logged}",
                    node_state(&node)
                ))
        })
        .await;
        let peak = peak_kib(&agent);
        assert!(
            peak > 0 && peak < 128 << 10,
            "{what}: the agent's peak {peak} KiB\n{}",
            logs()
        );
        eprintln!("{what}: the agent's peak RSS {peak} KiB");
    }
    let peak = peak_kib(&controller);
    assert!(
        peak > 0 && peak < 128 << 10,
        "the controller's peak {peak} KiB\n{}",
        controller.log()
    );
    eprintln!("the controller's peak RSS {peak} KiB");
}
