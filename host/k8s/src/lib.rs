//! The Kubernetes adapter of pinset.
//!
//! - [`api`]: the API types and CRDs — the single definition of PinnedImageSet,
//!   MachineConfigPool and MachineConfigNode (and k8s-openapi's Node) that both the cluster path
//!   and the YAML reader ([`objects`]) use; [`convert`]: from them to the core's types;
//! - [`controller`]: the pool controller; [`agent`]: the node agent;
//! - [`metrics`], [`http`]: Prometheus metrics and the endpoint serving them, health and
//!   readiness;
//! - [`ownership`]: refuses to run where OpenShift's Machine Config Operator owns the CRDs;
//! - [`rollout_status`]: a pool's rollout as `pinset rollout` shows it, paused and resumed.
//!
//! The rules stay in `pinset-core` (which sets a pool lists, how nodes count) and the node crate
//! (one reconcile); this crate reads and writes objects. May depend on: core, node, policy, the
//! policy SDK's contract types (a fleet request, a grant), kube, k8s-openapi, hyper. Must not hold domain rules of its own.

pub mod agent;
pub mod api;
pub mod apply;
pub mod backoff;
pub mod condition;
pub mod controller;
pub mod convert;
pub mod events;
pub mod forbidden;
pub mod http;
pub mod metrics;
pub mod objects;
pub mod ownership;
pub mod policy_config;
pub mod policy_loader;
pub mod rollout_status;
pub mod workloads;

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error(
        "no Kubernetes configuration found (in-cluster, $KUBECONFIG or ~/.kube/config); pass --kubeconfig: {0}"
    )]
    Infer(kube::config::InferConfigError),
    #[error("Kubernetes client: {0}")]
    Client(kube::Error),
}

/// A client from `kubeconfig`, else the usual discovery (in-cluster, then `$KUBECONFIG` or
/// `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |source| ClientError::Kubeconfig {
                path: path.into(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::infer().await.map_err(ClientError::Infer)?,
    };
    kube::Client::try_from(config).map_err(ClientError::Client)
}

/// How pinset's watches list: from the API server's watch cache (`resourceVersion=0`), then watch
/// from the version that cache served. A quorum list would return etcd's newest version, which a
/// watch cache fed by an etcd without progress notifications (etcd 3.4) may not reach until the
/// next write to that resource: the watch would then wait on "too large resource version".
pub fn watcher_config() -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().any_semantic()
}

/// A kind pinset watches, read whole: each is named below, so that a new watch names its kind
/// here first.
pub(crate) trait WatchedKind:
    kube::Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl WatchedKind for k8s_openapi::api::core::v1::Node {}
impl WatchedKind for api::MachineConfigNode {}
impl WatchedKind for api::PinnedImageSet {}
impl WatchedKind for api::MachineConfigPool {}
impl WatchedKind for api::PolicyConfiguration {}

/// Every watch of pinset's: the objects of `api` that `config` selects, kept in a new cache
/// without `managedFields`, retried on the watch's own backoff (0.8 s doubling to 30 s). The
/// cache, and the watch's events once the cache has taken them.
pub(crate) fn cached_watch<K: WatchedKind>(
    api: kube::Api<K>,
    config: kube::runtime::watcher::Config,
) -> (
    kube::runtime::reflector::Store<K>,
    impl futures::Stream<Item = kube::runtime::watcher::Result<kube::runtime::watcher::Event<K>>>
    + Send
    + 'static,
) {
    use kube::runtime::WatchStreamExt;
    let (reader, writer) = kube::runtime::reflector::store();
    let events = kube::runtime::watcher(api, config)
        .default_backoff()
        .modify(strip_managed_fields)
        .reflect(writer);
    (reader, events)
}

/// Follow every `K` that `config` selects in a new cache (see [`cached_watch`]) until `shutdown`:
/// `on_change` with each event once the cache took it, watch errors said and counted where they
/// arrive.
pub(crate) fn spawn_reflector<K: WatchedKind>(
    client: kube::Client,
    config: kube::runtime::watcher::Config,
    on_change: impl Fn(&kube::runtime::watcher::Event<K>) + Send + 'static,
    metrics: metrics::Metrics,
    shutdown: tokio_util::sync::CancellationToken,
) -> kube::runtime::reflector::Store<K> {
    use futures::StreamExt;
    let (reader, stream) = cached_watch(kube::Api::<K>::all(client), config);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = stream.next() => n,
            };
            match next {
                None => return,
                Some(Err(e)) => watch_interrupted::<K>(&metrics, &e),
                Some(Ok(event)) => on_change(&event),
            }
        }
    });
    reader
}

/// A watch of `K` was interrupted (it resumes on its own backoff): said once, naming the kind,
/// and counted (`pinset_watch_interruptions_total{kind}`).
pub(crate) fn watch_interrupted<K: kube::Resource<DynamicType = ()>>(
    metrics: &metrics::Metrics,
    error: &kube::runtime::watcher::Error,
) {
    let kind = match K::kind(&()) {
        std::borrow::Cow::Borrowed(kind) => kind,
        std::borrow::Cow::Owned(_) => "other",
    };
    match forbidden::refusal(error) {
        Some(why) => tracing::warn!(kind, error = %why, "watch refused; retrying with backoff"),
        None => tracing::warn!(kind, %error, "watch interrupted; resuming"),
    }
    metrics.count_watch_interruption(kind);
}

/// Log filter `filter` with kube's client silenced unless it names it. The client logs each failed
/// request itself (`ERROR failed with error client error (Connect)`) and each closed watch
/// connection (`WARN eof in poll`); pinset reports the same failure where it handles it, once,
/// naming the object, the watch or the write.
pub fn quiet_client(filter: &str) -> String {
    if filter.contains("kube_client") {
        filter.to_string()
    } else {
        format!("{filter},kube_client=off")
    }
}

/// Now, in milliseconds since the Unix epoch (how rollouts date progress).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Caches keep what pinset reads; `managedFields` (often the largest part of an object) go.
pub(crate) fn strip_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    #[test]
    fn kubes_client_is_silent_unless_the_filter_names_it() {
        assert_eq!(super::quiet_client("info"), "info,kube_client=off");
        assert_eq!(
            super::quiet_client("pinset=debug"),
            "pinset=debug,kube_client=off"
        );
        assert_eq!(
            super::quiet_client("info,kube_client=debug"),
            "info,kube_client=debug"
        );
    }
}
