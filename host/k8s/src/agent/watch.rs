//! What the agent watches: the pools and sets (reflector caches), the node's facts (the Node
//! object or a file), and whether the desired state changed.

use super::{AgentConfig, AgentError};
use crate::api::{MachineConfigNode, MachineConfigPool, PinnedImageSet};
use crate::convert;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use pinset_core::desired::{self, Desired, NodeInfo};
use pinset_core::rollout::RolloutGrant;
use std::time::Duration;

/// Node facts: the `--node-file` or the Node object.
pub(super) async fn node_info(
    config: &AgentConfig,
    client: &Client,
) -> Result<NodeInfo, AgentError> {
    let name = &config.node_name;
    match &config.node_file {
        Some(file) => {
            let mut objects = crate::objects::Objects::default();
            crate::objects::load_file(file, pinset_core::yaml::Fields::Strict, &mut objects)
                .map_err(|source| AgentError::NodeFile {
                    node: name.clone(),
                    source,
                })?;
            objects
                .nodes
                .into_iter()
                .find(|n| &n.name == name)
                .ok_or_else(|| AgentError::NodeMissing {
                    node: name.clone(),
                    file: file.clone(),
                })
        }
        None => {
            let api: Api<Node> = Api::all(client.clone());
            let node = api.get(name).await.map_err(|source| AgentError::NodeApi {
                node: name.clone(),
                source,
            })?;
            convert::node(&node).map_err(|source| AgentError::Convert {
                node: name.clone(),
                source,
            })
        }
    }
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

/// Return as soon as the desired state differs from `running` (a pool, a set or the node's
/// grant changed, or the node file).
pub(super) async fn until_changed(
    config: &AgentConfig,
    client: &Client,
    caches: &super::Caches,
    running: &Desired,
    node: &NodeInfo,
) {
    let mut changed = caches.changed.clone();
    let mut file_stamp = stamp(config);
    loop {
        tokio::select! {
            r = changed.changed() => if r.is_err() { std::future::pending::<()>().await },
            _ = tokio::time::sleep(Duration::from_secs(1)), if config.node_file.is_some() => {
                let now = stamp(config);
                if now == file_stamp { continue; }
                file_stamp = now;
            }
        }
        let node = if config.node_file.is_some() {
            match node_info(config, client).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "node file unreadable; keeping the last facts");
                    node.clone()
                }
            }
        } else {
            node.clone()
        };
        if &desired_now(config, &node, caches) != running {
            return;
        }
    }
}

fn stamp(config: &AgentConfig) -> Option<std::time::SystemTime> {
    config
        .node_file
        .as_ref()
        .and_then(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
}
