//! What the agent watches: the pools and sets (reflector caches), the node's facts (its Node
//! object, followed by a watch of that one object, or a file), and whether the desired state
//! changed.

use super::{AgentConfig, AgentError};
use crate::api::{MachineConfigNode, MachineConfigPool, PinnedImageSet};
use crate::convert;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use pinset_core::desired::{self, Desired, NodeInfo};
use pinset_core::rollout::RolloutGrant;
use std::sync::Arc;
use std::time::Duration;

/// The node's facts, and its Node object's uid when they came from the API — the owner of its
/// MachineConfigNode. A node file names no object of a cluster: no uid from it.
#[derive(Debug)]
pub(super) struct NodeRead {
    pub(super) facts: NodeInfo,
    pub(super) uid: Option<String>,
}

/// Node facts: the `--node-file`, or the Node object — as the watch of it last saw it, read from
/// the API while the watch has not seen it (the agent just started, or its role may not watch
/// Nodes).
pub(super) async fn node_info(
    config: &AgentConfig,
    client: &Client,
    caches: &super::Caches,
) -> Result<NodeRead, AgentError> {
    let name = &config.node_name;
    if let Some(file) = &config.node_file {
        let facts = node_from_file(name, file)?;
        return Ok(NodeRead { facts, uid: None });
    }
    let node = api_node(config, client, caches).await?;
    read_api_node(name, &node)
}

/// The node's Node object, as the watch of it last saw it, read from the API while the watch
/// has not seen it.
pub(super) async fn api_node(
    config: &AgentConfig,
    client: &Client,
    caches: &super::Caches,
) -> Result<Arc<Node>, AgentError> {
    if let Some(node) = watched_node(config, caches) {
        return Ok(node);
    }
    let api: Api<Node> = Api::all(client.clone());
    let node = api.get(&config.node_name).await;
    let node = node.map_err(|source| AgentError::NodeApi {
        node: config.node_name.clone(),
        source,
    })?;
    Ok(Arc::new(node))
}

/// The node's Node object as its watch last saw it: `None` while it has not seen it (or with a
/// node file, which has no watch).
fn watched_node(config: &AgentConfig, caches: &super::Caches) -> Option<Arc<Node>> {
    let watched = caches.node.as_ref()?;
    watched.get(&ObjectRef::new(&config.node_name))
}

fn read_api_node(name: &str, node: &Node) -> Result<NodeRead, AgentError> {
    let facts = convert::node(node).map_err(|source| AgentError::Convert {
        node: name.to_string(),
        source,
    })?;
    let uid = node.metadata.uid.clone();
    Ok(NodeRead { facts, uid })
}

fn node_from_file(name: &str, file: &std::path::Path) -> Result<NodeInfo, AgentError> {
    let mut objects = crate::objects::Objects::default();
    crate::objects::load_file(file, pinset_core::yaml::Fields::Strict, &mut objects).map_err(
        |source| AgentError::NodeFile {
            node: name.to_string(),
            source: Box::new(source),
        },
    )?;
    (objects.nodes.into_iter().find(|n| n.name == name)).ok_or_else(|| AgentError::NodeMissing {
        node: name.to_string(),
        file: file.to_path_buf(),
    })
}

/// The node's facts from the watch of its Node object: `None` while it has not seen the object
/// (or with a node file, which has no watch).
fn cached_node(
    config: &AgentConfig,
    caches: &super::Caches,
) -> Option<Result<NodeRead, AgentError>> {
    let node = watched_node(config, caches)?;
    Some(read_api_node(&config.node_name, &node))
}

/// The desired state of `node` from the cached pools and sets. A pool that cannot be read (a bad
/// selector) is skipped with a warning; the controller reports it on the pool.
pub fn desired_of(
    node: &NodeInfo,
    pools: &Store<MachineConfigPool>,
    sets: &Store<PinnedImageSet>,
) -> Desired {
    let pools: Vec<_> = pools
        .state()
        .iter()
        .filter_map(|p| match convert::pool(p) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "pool skipped");
                None
            }
        })
        .collect();
    let sets: Vec<_> = sets.state().iter().map(|s| convert::set(s)).collect();
    desired::desired(node, &pools, &sets)
}

/// The node's rollout grant from its cached MachineConfigNode: `None` when the agent does not
/// wait for grants (`--rollout=free`), an empty grant while the controller has granted nothing.
pub(super) fn grant_of(
    config: &AgentConfig,
    own: &Store<MachineConfigNode>,
) -> Option<RolloutGrant> {
    if !config.wait_for_grants {
        return None;
    }
    let mcn = own.get(&ObjectRef::new(&config.node_name));
    Some(
        mcn.and_then(|m| m.spec.rollout_grant.clone())
            .map(|g| convert::grant(&g))
            .unwrap_or_default(),
    )
}

/// The desired state of the node under its grant.
pub(super) fn desired_now(
    config: &AgentConfig,
    node: &NodeInfo,
    caches: &super::Caches,
) -> Desired {
    let mut desired = desired_of(node, &caches.pools, &caches.sets);
    // A policy's grant changes no pull: it is not part of the desired state (it does not
    // restart a reconcile in progress; the swap waits for the round to end).
    desired.grant = grant_of(config, &caches.own).map(|g| pinset_core::rollout::sets_only(&g));
    desired
}

/// Return as soon as the desired state differs from `running`: a pool, a set or the node's grant
/// changed, or a node label that moves it between pools (in its Node object or its file). What
/// a reconcile in flight is cancelled for.
pub(super) async fn until_changed(
    config: &AgentConfig,
    caches: &super::Caches,
    running: &Desired,
    node: &NodeInfo,
) {
    until(config, caches, node, |now| {
        &desired_now(config, now, caches) != running
    })
    .await
}

/// [`until_changed`], or a fact of the node a policy decides on changed (a label, readiness,
/// disk pressure, ephemeral storage; not a heartbeat or the kubelet's image list, which are no
/// facts), or the watch of the node's MachineConfigNode saw it deleted (by hand, or with its
/// CRD): what ends an idle agent's wait — a node Ready again, or with room again, is
/// reconciled at once rather than at its next retry, and a MachineConfigNode gone is written
/// again.
pub(super) async fn until_changed_or_facts(
    config: &AgentConfig,
    caches: &super::Caches,
    running: &Desired,
    node: &NodeInfo,
) {
    let own_deleted = || {
        caches
            .own_deleted
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    if own_deleted() {
        return;
    }
    until(config, caches, node, |now| {
        own_deleted() || now != node || &desired_now(config, now, caches) != running
    })
    .await
}

/// The node's MachineConfigNode is not in the cache of its watch.
pub(super) fn own_missing(config: &AgentConfig, caches: &super::Caches) -> bool {
    let own = ObjectRef::new(&config.node_name);
    caches.own.get(&own).is_none()
}

/// Wait for each change of the caches (or of the node file, polled every second) until
/// `changed` holds for the node's facts as they are then.
async fn until(
    config: &AgentConfig,
    caches: &super::Caches,
    last: &NodeInfo,
    mut changed: impl FnMut(&NodeInfo) -> bool,
) {
    let mut signal = caches.changed.clone();
    let mut file_stamp = stamp(config);
    loop {
        tokio::select! {
            r = signal.changed() => if r.is_err() { std::future::pending::<()>().await },
            _ = tokio::time::sleep(Duration::from_secs(1)), if config.node_file.is_some() => {
                let now = stamp(config);
                if now == file_stamp { continue; }
                file_stamp = now;
            }
        }
        if changed(&facts_now(config, caches, last)) {
            return;
        }
    }
}

/// The node's facts as they are now, `last` where they cannot be read (said in the log).
fn facts_now(config: &AgentConfig, caches: &super::Caches, last: &NodeInfo) -> NodeInfo {
    let now = match &config.node_file {
        Some(file) => Some(node_from_file(&config.node_name, file)),
        None => cached_node(config, caches).map(|read| read.map(|r| r.facts)),
    };
    match now {
        Some(Ok(node)) => node,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "node facts unreadable; keeping the last ones");
            last.clone()
        }
        None => last.clone(),
    }
}

fn stamp(config: &AgentConfig) -> Option<std::time::SystemTime> {
    config
        .node_file
        .as_ref()
        .and_then(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::{self, store::Writer};
    use kube::runtime::watcher::Event;
    use serde_json::json;

    /// Pools `worker` and `infra`, each taking the sets of its role, with set `base` (worker)
    /// and `tools` (infra); the node's own Node object, followed as the agent follows it.
    struct World {
        caches: super::super::Caches,
        config: AgentConfig,
        watch: NodeWatch,
    }

    /// What the watch of the node's Node object sees, and the signal the agent's reflectors give.
    struct NodeWatch {
        nodes: Writer<Node>,
        changes: tokio::sync::watch::Sender<u64>,
    }

    fn filled<K: Clone + kube::Resource<DynamicType = ()>>(objects: Vec<K>) -> Store<K> {
        let (store, mut writer) = reflector::store();
        for o in objects {
            writer.apply_watcher_event(&Event::Apply(o));
        }
        store
    }

    fn world() -> World {
        let pool = |name: &str| -> MachineConfigPool {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {
                    "machineConfigSelector":
                        {"matchLabels": {"machineconfiguration.openshift.io/role": name}},
                    "nodeSelector": {"matchLabels": {format!("node-role.kubernetes.io/{name}"): ""}}
                }
            }))
            .unwrap()
        };
        let set = |name: &str, role: &str| -> PinnedImageSet {
            let image = format!("q.io/x/{name}@sha256:{}", "a".repeat(64));
            serde_json::from_value(json!({
                "metadata": {"name": name, "generation": 1,
                             "labels": {"machineconfiguration.openshift.io/role": role}},
                "spec": {"pinnedImages": [{"name": image}]}
            }))
            .unwrap()
        };
        let (changes, changed) = tokio::sync::watch::channel(0);
        let (node, nodes) = reflector::store();
        let caches = super::super::Caches {
            pools: filled(vec![pool("worker"), pool("infra")]),
            sets: filled(vec![set("base", "worker"), set("tools", "infra")]),
            own: filled(vec![]),
            node: Some(node),
            own_deleted: Default::default(),
            changed,
        };
        let mut config = AgentConfig::new("w-0".into());
        config.wait_for_grants = false;
        World {
            caches,
            config,
            watch: NodeWatch { nodes, changes },
        }
    }

    /// Node `w-0` with `labels`, Ready, its heartbeat at `beat` and `images` in its image list.
    fn api_node(labels: serde_json::Value, beat: &str, images: &[&str]) -> Node {
        let images: Vec<_> = images.iter().map(|i| json!({"names": [i]})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "w-0", "uid": W0_UID, "labels": labels},
            "status": {
                "allocatable": {"ephemeral-storage": "100Gi"},
                "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": beat}],
                "images": images
            }
        }))
        .unwrap()
    }

    impl NodeWatch {
        /// The watch sees `node`, and says so as the agent's reflectors do.
        fn sees(&mut self, node: Node) {
            self.nodes.apply_watcher_event(&Event::Apply(node));
            self.changes.send_modify(|n| *n += 1);
        }
    }

    impl World {
        fn sets(&self, node: &NodeInfo) -> Vec<String> {
            let desired = desired_now(&self.config, node, &self.caches);
            desired.sets.iter().map(|s| s.name.clone()).collect()
        }
    }

    /// A world whose watch has seen `node`: it, the node's facts and the desired state from them.
    fn seeing(node: Node) -> (World, NodeInfo, Desired) {
        let mut w = world();
        w.watch.sees(node);
        let facts = cached_node(&w.config, &w.caches).unwrap().unwrap().facts;
        let running = desired_now(&w.config, &facts, &w.caches);
        (w, facts, running)
    }

    /// `node`, its Ready condition False.
    fn not_ready(mut node: Node) -> Node {
        let conditions = node.status.as_mut().unwrap().conditions.as_mut().unwrap();
        conditions[0].status = "False".into();
        node
    }

    /// `wait` is still waiting once polled; after `change`, it ends within 10 s.
    async fn ends_only_after(wait: impl Future<Output = ()>, change: impl FnOnce(), what: &str) {
        let mut wait = std::pin::pin!(wait);
        tokio::select! {
            () = &mut wait => panic!("the wait ended with nothing changed"),
            () = tokio::task::yield_now() => {}
        }
        change();
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect(what);
    }

    const WORKER: &str = "node-role.kubernetes.io/worker";
    const W0_UID: &str = "0b6f5c1e-7a51-4c59-9d0e-2f5d3c9a8e11";
    const INFRA: &str = "node-role.kubernetes.io/infra";

    #[tokio::test]
    async fn the_facts_come_from_the_watched_node_without_a_request() {
        let mut w = world();
        w.watch
            .sees(api_node(json!({WORKER: ""}), "2026-12-07T00:00:00Z", &[]));
        // Nothing listens there: a request would fail with NodeApi.
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let node = node_info(&w.config, &client, &w.caches).await.unwrap();
        assert_eq!(node.facts.name, "w-0");
        assert_eq!(node.uid.as_deref(), Some(W0_UID));
        assert_eq!(w.sets(&node.facts), ["base"]);
    }

    #[tokio::test]
    async fn a_node_relabelled_into_a_pool_ends_the_wait_with_that_pool_s_sets() {
        let (mut w, node, running) =
            seeing(api_node(json!({WORKER: ""}), "2026-12-07T00:00:00Z", &[]));
        let wait = until_changed(&w.config, &w.caches, &running, &node);
        let relabelled = api_node(json!({WORKER: "", INFRA: ""}), "2026-12-07T00:00:00Z", &[]);
        let what = "the new label ends the wait";
        ends_only_after(wait, || w.watch.sees(relabelled), what).await;
        let now = facts_now(&w.config, &w.caches, &node);
        assert_eq!(w.sets(&now), ["tools", "base"]);
    }

    #[tokio::test]
    async fn an_idle_wait_ends_when_the_node_is_ready_again() {
        let (mut w, node, running) = seeing(not_ready(api_node(
            json!({WORKER: ""}),
            "2026-12-07T00:00:00Z",
            &[],
        )));
        assert!(!node.ready);
        let idle = until_changed_or_facts(&w.config, &w.caches, &running, &node);
        let up = api_node(json!({WORKER: ""}), "2026-12-07T00:01:00Z", &[]);
        let what = "Ready again ends the idle wait";
        ends_only_after(idle, || w.watch.sees(up), what).await;
        // A reconcile in flight is not cancelled for it: its desired state is the same.
        let now = facts_now(&w.config, &w.caches, &node);
        assert!(now.ready);
        assert_eq!(desired_now(&w.config, &now, &w.caches), running);
    }

    #[tokio::test]
    async fn an_idle_wait_ends_when_the_machine_config_node_is_deleted() {
        let (w, node, running) = seeing(api_node(json!({WORKER: ""}), "2026-12-07T00:00:00Z", &[]));
        let idle = until_changed_or_facts(&w.config, &w.caches, &running, &node);
        let (deleted, changes) = (&w.caches.own_deleted, &w.watch.changes);
        let deletion = || {
            deleted.store(true, std::sync::atomic::Ordering::Relaxed);
            changes.send_modify(|n| *n += 1);
        };
        ends_only_after(idle, deletion, "the deletion ends the idle wait").await;
        // And a wait that starts after it ends at once.
        let again = until_changed_or_facts(&w.config, &w.caches, &running, &node);
        tokio::time::timeout(Duration::from_secs(10), again)
            .await
            .expect("a deletion not yet taken ends a new wait");
    }

    #[test]
    fn a_heartbeat_or_a_new_image_list_changes_no_decision() {
        let (mut w, node, running) =
            seeing(api_node(json!({WORKER: ""}), "2026-12-07T00:00:00Z", &[]));
        w.watch.sees(api_node(
            json!({WORKER: ""}),
            "2026-12-07T00:05:00Z",
            &["q.io/x/base:1"],
        ));
        let now = facts_now(&w.config, &w.caches, &node);
        assert_eq!(now, node);
        assert_eq!(desired_now(&w.config, &now, &w.caches), running);
        // And a fact it decides on does.
        let down = api_node(json!({WORKER: ""}), "2026-12-07T00:06:00Z", &[]);
        w.watch.sees(not_ready(down));
        assert!(!facts_now(&w.config, &w.caches, &node).ready);
    }

    #[test]
    fn without_the_watched_node_the_last_facts_stay() {
        let w = world();
        let last = worker_facts();
        assert_eq!(facts_now(&w.config, &w.caches, &last), last);
        assert!(cached_node(&w.config, &w.caches).is_none());
    }

    fn worker_facts() -> NodeInfo {
        convert::node(&api_node(json!({WORKER: ""}), "2026-12-07T00:00:00Z", &[])).unwrap()
    }
}
