//! An agent as deployed: its Node from the core API (no `--node-file`), watched. The test API
//! server serves no core API; [`CoreApi`] serves the Nodes in front of it, decided by the same
//! RBAC, and forwards everything else to it as the agent's service account.

use super::*;
use serde_json::Value;
use support::core_api::{CoreApi, Identity};

/// Pools `worker` and `infra` (the latter taking the sets of both roles), set `base` (worker)
/// and `tools` (infra) of one image each, Node `w-0` labelled worker in the core API, and its
/// agent on a containerd of its own, reading the Node from the API.
struct NodeApiBed {
    agent: Proc,
    /// The agent's metrics port.
    metrics_port: u16,
    core: CoreApi,
    nodes: Api<MachineConfigNode>,
    _runtime: support::Containerd,
    cluster: Cluster,
}

/// A bed for the startup taint: the component's RBAC, a set that cannot be pulled when
/// `broken`, and the core API failing its first patches of Nodes with `failing_patches`.
#[derive(Default)]
struct Tainted {
    broken: bool,
    failing_patches: Vec<u16>,
}

const WORKER: &str = "node-role.kubernetes.io/worker";
const INFRA: &str = "node-role.kubernetes.io/infra";

/// Worker Node `w-0` with `labels` instead.
fn node(labels: Value) -> Value {
    let mut node = support::worker_node("w-0");
    node["metadata"]["labels"] = labels;
    node
}

impl NodeApiBed {
    /// The bed with w-0 a Ready worker and its agent retrying a failed round after 1 s.
    async fn start() -> Option<NodeApiBed> {
        Self::start_with(node(json!({WORKER: ""})), 1).await
    }

    /// The bed with `w0` as Node w-0 and its agent retrying a failed round after `retry` s.
    async fn start_with(w0: Value, retry: u64) -> Option<NodeApiBed> {
        Self::start_full(w0, retry, &[], None).await
    }

    /// The bed with w-0 registered with the startup taint ([`tainted`], created at `created`,
    /// else now), its agent given `taint` flags (`--startup-taint…`), as `bed` says.
    async fn start_tainted(
        created: Option<&str>,
        taint: &[&str],
        bed: Tainted,
    ) -> Option<NodeApiBed> {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let w0 = tainted(created.unwrap_or(&now));
        Self::start_full(w0, 1, taint, Some(bed)).await
    }

    /// [`NodeApiBed::start_with`], the agent also given `extra` flags; with `taint`, the
    /// manifests' RBAC with `deploy/components/startup-taint`, and worker set `broken` of an
    /// image the registry does not have when it says so.
    async fn start_full(
        w0: Value,
        retry: u64,
        extra: &[&str],
        taint: Option<Tainted>,
    ) -> Option<NodeApiBed> {
        let (cluster, runtime) = Cluster::with_runtime().await?;
        let registry = &cluster.registry;
        let base = support::push_images(registry, "base", 1, 100_000, 1200).await;
        let tools = support::push_images(registry, "tools", 1, 100_000, 1300).await;
        cluster.create_pool("worker", &["worker"]).await;
        cluster.create_pool("infra", &["worker", "infra"]).await;
        cluster.create_set("base", "worker", &base).await;
        cluster.create_set("tools", "infra", &tools).await;
        let failing_patches = taint.as_ref().map(|t| t.failing_patches.clone());
        if let Some(Tainted { broken, .. }) = taint {
            let deploy = support::workspace().join("deploy");
            let component = deploy.join("components/startup-taint");
            let rbac = support::rbac::Rbac::render_with(&deploy, &[&component]).unwrap();
            cluster
                .authorizer
                .set_rules(rbac.with_binding("pinset-rollout", OPERATOR));
            if broken {
                let missing = format!("{}/team/missing@sha256:{}", registry.host, "0".repeat(64));
                cluster.create_set("broken", "worker", &[missing]).await;
            }
        }
        let identity = Identity {
            upstream: cluster.server.client_from(&cluster.agent_kc).await,
            user: "system:serviceaccount:pinset:pinset-agent".into(),
            groups: ["system:serviceaccounts", "system:serviceaccounts:pinset"]
                .map(String::from)
                .to_vec(),
            authorizer: Some(cluster.authorizer.clone()),
        };
        let core = CoreApi::start(&cluster.server, identity).await;
        core.apply(w0);
        core.fail_patches(&failing_patches.unwrap_or_default());
        let kubeconfig = core.kubeconfig(&cluster.agent_kc, cluster.dir.path(), "agent-core");
        let metrics_port = support::free_port();
        let args = [
            "agent".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--metrics-addr=127.0.0.1:{metrics_port}"),
            "--node-name=w-0".into(),
            format!("--cri={}", runtime.endpoint()),
            "--pin=containerd".into(),
            format!("--insecure-registry={}", registry.host),
            format!("--retry-seconds={retry}"),
            "--rollout=free".into(),
        ];
        let args = [
            &args[..],
            &extra.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        ]
        .concat();
        let agent = Proc::start(&args, cluster.dir.path().join("agent.log"));
        let nodes = Api::all(cluster.client.clone());
        Some(NodeApiBed {
            agent,
            metrics_port,
            core,
            nodes,
            _runtime: runtime,
            cluster,
        })
    }

    /// [`NodeApiBed::start`], once w-0 has pinned the worker set.
    async fn settled() -> Option<NodeApiBed> {
        let bed = NodeApiBed::start().await?;
        let (logs, what) = (|| bed.logs(), "w-0 pins the worker set");
        node_settles(&bed.nodes, "w-0", &[("base", 1)], what, &logs).await;
        Some(bed)
    }

    fn logs(&self) -> String {
        self.cluster.logs_with(&self.agent)
    }

    /// The requests of the agent's service account the RBAC rules decided on nodes.
    fn node_requests(&self) -> Vec<String> {
        let decisions = self.cluster.authorizer.decisions().into_iter();
        let of_nodes =
            decisions.filter(|d| d.request.resource == "nodes" && d.request.group.is_empty());
        of_nodes.map(|d| d.request.verb).collect()
    }
}

/// A node relabelled into a pool pulls and pins that pool's sets at once — its Node is watched,
/// not read again at the next 10-minute resync — and its report names its new primary pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_relabelled_into_a_pool_pins_its_sets_at_once() {
    let Some(bed) = NodeApiBed::settled().await else {
        return;
    };
    bed.core.apply(node(json!({WORKER: "", INFRA: ""})));
    let what = "w-0 pins the infra pool's sets too";
    let logs = || bed.logs();
    node_settles(&bed.nodes, "w-0", &[("base", 1), ("tools", 1)], what, &logs).await;
    let report = bed.nodes.get("w-0").await.unwrap();
    assert_eq!(
        report.spec.pool.name, "infra",
        "the custom pool is its primary"
    );
    let verbs = bed.node_requests();
    assert!(verbs.contains(&"watch".to_string()), "{verbs:?}");
    assert_eq!(bed.cluster.refused(), Vec::<String>::new());
}

/// The node's MachineConfigNode is owned by its Node (the uid the core API gave it): the garbage
/// collector deletes it with the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_machine_config_node_of_an_agent_on_the_api_is_owned_by_its_node() {
    let Some(bed) = NodeApiBed::settled().await else {
        return;
    };
    let uid = bed.core.node("w-0").unwrap()["metadata"]["uid"].clone();
    let report = bed.nodes.get("w-0").await.unwrap();
    let owners = report.metadata.owner_references.unwrap_or_default();
    let owners: Vec<_> = owners
        .iter()
        .map(|o| {
            (
                o.api_version.as_str(),
                o.kind.as_str(),
                o.name.as_str(),
                json!(o.uid),
            )
        })
        .collect();
    assert_eq!(owners, [("v1", "Node", "w-0", uid)]);
    assert_eq!(bed.cluster.refused(), Vec::<String>::new());
}

/// A node that is not Ready fails its round (the reference's gate); once its Node is Ready
/// again it is reconciled at once — the agent idles on its Node's watch — not at its next
/// retry, ten minutes away here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_ready_again_is_reconciled_at_once_not_at_its_next_retry() {
    let mut down = node(json!({WORKER: ""}));
    down["status"]["conditions"][0]["status"] = json!("False");
    let Some(bed) = NodeApiBed::start_with(down, 600).await else {
        return;
    };
    let logs = || bed.logs();
    let failed = eventually("w-0 fails its round: not Ready", &logs, || async {
        let n = bed.nodes.get_opt("w-0").await.map_err(|e| e.to_string())?;
        let st = n.and_then(|n| n.status).unwrap_or_default();
        let degraded = condition::find(&st.conditions, CONDITION_DEGRADED);
        match degraded {
            Some(c) if c.status == "True" => Ok(c.message.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    support::assert_says(&failed, &["Ready"]);
    bed.core.apply(node(json!({WORKER: ""})));
    let what = "w-0 pins the worker set once Ready, long before its retry";
    node_settles(&bed.nodes, "w-0", &[("base", 1)], what, &logs).await;
}

fn broken() -> Tainted {
    Tainted {
        broken: true,
        ..Default::default()
    }
}

/// The taints of Node w-0 as the core API serves it: (key, effect).
fn taints(core: &CoreApi) -> Vec<(String, String)> {
    let node = core.node("w-0").unwrap_or_default();
    let taints = node["spec"]["taints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let field = |t: &Value, f: &str| t[f].as_str().unwrap_or_default().to_string();
    taints
        .iter()
        .map(|t| (field(t, "key"), field(t, "effect")))
        .collect()
}

/// Worker Node w-0 registered with the startup taint and another one, created at `created`.
fn tainted(created: &str) -> Value {
    let mut w0 = node(json!({WORKER: ""}));
    w0["metadata"]["creationTimestamp"] = json!(created);
    w0["spec"]["taints"] = json!([
        {"key": "pinset.io/images-pending", "effect": "NoSchedule"},
        {"key": "example.com/gpu", "value": "a100", "effect": "NoSchedule"}
    ]);
    w0
}

/// A node registered with the startup taint takes no pods until its sets are pinned: the agent
/// lifts the taint once they are — its other taints kept, as the patch names the Node's
/// version — and says why in an Event; a patch of nodes, which the component's RBAC grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_taint_is_lifted_once_the_nodes_sets_are_pinned() {
    let taint = ["--startup-taint=pinset.io/images-pending:NoSchedule"];
    let Some(bed) = NodeApiBed::start_tainted(None, &taint, Tainted::default()).await else {
        return;
    };
    let logs = || bed.logs();
    node_settles(&bed.nodes, "w-0", &[("base", 1)], "w-0 pins its set", &logs).await;
    eventually("the startup taint is lifted", &logs, || async {
        let left = taints(&bed.core);
        let gpu = [("example.com/gpu".to_string(), "NoSchedule".to_string())];
        (left == gpu).then_some(()).ok_or(format!("{left:?}"))
    })
    .await;
    let node = bed.core.node("w-0").unwrap();
    assert_eq!(node["spec"]["taints"][0]["value"], "a100", "{node}");
    let note = bed.cluster.event_note("w-0", "StartupTaintLifted").await;
    support::assert_says(
        &note,
        &[
            "pinset.io/images-pending:NoSchedule",
            "every PinnedImageSet of the node's pools is pinned (1 set(s))",
        ],
    );
    assert!(bed.node_requests().contains(&"patch".to_string()));
    assert_eq!(bed.cluster.refused(), Vec::<String>::new());
}

/// A set that cannot be pulled keeps the taint: the node reports the failure, and the taint
/// stays (watched for a second after, not awaited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_that_cannot_be_pulled_keeps_the_taint() {
    // KEY alone: any effect of the key.
    let any_effect = ["--startup-taint=pinset.io/images-pending"];
    let Some(bed) = NodeApiBed::start_tainted(None, &any_effect, broken()).await else {
        return;
    };
    let failed = "w-0 reports the broken set failed";
    eventually(failed, &|| bed.logs(), || async {
        let n = bed.nodes.get("w-0").await.map_err(|e| e.to_string())?;
        let sets = node_state(&n).0;
        let pinned = sets.contains(&("base".into(), 1, Some(1)));
        let failed = (n.status.as_ref()).is_some_and(|s| {
            (s.pinned_image_sets.iter())
                .any(|p| p.name == "broken" && p.last_failed_generation == Some(1))
        });
        (pinned && failed).then_some(()).ok_or(format!("{sets:?}"))
    })
    .await;
    throughout(10, || async {
        assert_eq!(taints(&bed.core).len(), 2, "{}", bed.logs());
    })
    .await;
    support::assert_says(&bed.agent.log(), &["startup taint kept", "broken failed"]);
}

/// Past the deadline (`--startup-taint-deadline-seconds`) the taint is lifted whatever is not
/// pinned, the Event naming what was missing: a set that cannot be pulled does not keep a node
/// from pods for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_deadline_the_taint_is_lifted_whatever_is_missing() {
    let taint = [
        "--startup-taint=pinset.io/images-pending",
        "--startup-taint-deadline-seconds=3600",
    ];
    let long_ago = Some("2020-01-01T00:00:00Z");
    let Some(bed) = NodeApiBed::start_tainted(long_ago, &taint, broken()).await else {
        return;
    };
    let logs = || bed.logs();
    eventually(
        "the startup taint is lifted at the deadline",
        &logs,
        || async {
            let left = taints(&bed.core);
            (left.len() == 1).then_some(()).ok_or(format!("{left:?}"))
        },
    )
    .await;
    let note = bed.cluster.event_note("w-0", "StartupTaintLifted").await;
    support::assert_says(
        &note,
        &[
            "not all pinned 3600 s after the node was created (the deadline)",
            "broken failed",
        ],
    );
    let counted = r#"pinset_startup_taint_lifts_total{kind="deadline"} 1"#;
    support::assert_says(&metrics(bed.metrics_port).await, &[counted]);
}

/// A lift the API server fails (a 500), or refuses because the Node changed since it was read
/// (a 409), is tried again at the agent's retry (1 s here), not at its next resync ten minutes
/// away — neither wakes the agent's loop by itself: the node is not kept from pods by a
/// passing error. The tries are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lift_the_api_server_fails_or_refuses_is_tried_again_soon() {
    let taint = ["--startup-taint=pinset.io/images-pending:NoSchedule"];
    let failing = Tainted {
        failing_patches: vec![500, 409],
        ..Default::default()
    };
    let Some(bed) = NodeApiBed::start_tainted(None, &taint, failing).await else {
        return;
    };
    let lifted = "the startup taint is lifted after two failed tries";
    eventually(lifted, &|| bed.logs(), || async {
        let left = taints(&bed.core);
        (left.len() == 1).then_some(()).ok_or(format!("{left:?}"))
    })
    .await;
    let log = bed.agent.log();
    let tries = log.matches("cannot lift the startup taint; trying again");
    assert_eq!(tries.count(), 1, "{log}");
    let metrics = metrics(bed.metrics_port).await;
    support::assert_says(
        &metrics,
        &[
            r#"pinset_startup_taint_lifts_total{kind="failed"} 1"#,
            r#"pinset_api_write_conflicts_total{kind="node_taints"} 1"#,
            r#"pinset_startup_taint_lifts_total{kind="pinned"} 1"#,
            r#"pinset_api_writes_total{kind="node_taints"} 1"#,
        ],
    );
}
