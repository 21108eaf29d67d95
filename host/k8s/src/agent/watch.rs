//! What the agent watches: the pools and sets (reflector caches), the node's facts (the Node
//! object or a file), and whether the desired state changed.

use super::{AgentConfig, AgentError};
use crate::api::{MachineConfigPool, PinnedImageSet};
use crate::convert;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use pinset_core::desired::{self, Desired, NodeInfo};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

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

/// Return as soon as the desired state differs from `running` (a pool or set changed, or the
/// node file).
pub(super) async fn until_changed(
    config: &AgentConfig,
    client: &Client,
    pools: &Store<MachineConfigPool>,
    sets: &Store<PinnedImageSet>,
    running: &Desired,
    node: &NodeInfo,
    mut changed: watch::Receiver<u64>,
) {
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
        if &desired_of(&node, pools, sets) != running {
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

pub(super) fn spawn_reflector<K>(
    client: Client,
    changes: watch::Sender<u64>,
    shutdown: CancellationToken,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let api: Api<K> = Api::all(client);
    let stream = watcher(api, crate::watcher_config())
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = stream.next() => n,
            };
            match next {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(kind = %K::kind(&()), error = %e, "watch interrupted; resuming")
                }
                Some(Ok(_)) => changes.send_modify(|n| *n += 1),
            }
        }
    });
    reader
}
