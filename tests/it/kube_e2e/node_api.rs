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
    core: CoreApi,
    nodes: Api<MachineConfigNode>,
    _runtime: support::Containerd,
    cluster: Cluster,
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
        let (cluster, runtime) = Cluster::with_runtime().await?;
        let registry = &cluster.registry;
        let base = support::push_images(registry, "base", 1, 100_000, 1200).await;
        let tools = support::push_images(registry, "tools", 1, 100_000, 1300).await;
        cluster.create_pool("worker", &["worker"]).await;
        cluster.create_pool("infra", &["worker", "infra"]).await;
        cluster.create_set("base", "worker", &base).await;
        cluster.create_set("tools", "infra", &tools).await;
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
        let kubeconfig = core.kubeconfig(&cluster.agent_kc, cluster.dir.path(), "agent-core");
        let args = [
            "agent".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--metrics-addr=127.0.0.1:{}", support::free_port()),
            "--node-name=w-0".into(),
            format!("--cri={}", runtime.endpoint()),
            "--pin=containerd".into(),
            format!("--insecure-registry={}", registry.host),
            format!("--retry-seconds={retry}"),
            "--rollout=free".into(),
        ];
        let agent = Proc::start(&args, cluster.dir.path().join("agent.log"));
        let nodes = Api::all(cluster.client.clone());
        Some(NodeApiBed {
            agent,
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
