//! The controller's watch streams: only the changes a reconciler cares about (its caches drop
//! `managedFields` through [`crate::strip_managed_fields`]).

use crate::metrics::Metrics;
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use std::collections::HashMap;
use std::time::Duration;

/// The controller's answer to kube's `trigger_backoff`: none. Each watch already backs off on its
/// own errors (`default_backoff`); the controller's default would add one more backoff, shared by
/// every watch it merges and sleeping without reading any of them. One failing watch then stalled
/// the others for as long as its own growing delay (12.8 s and more after five errors, 30 s at
/// most), and after an API server restart the errors of all three watches added up in it. The
/// watches' errors now stop where they arrive ([`changed_objects`]); this keeps one that ever gets
/// through from sleeping them all.
pub(super) struct OwnBackoffOnly;

impl Iterator for OwnBackoffOnly {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for OwnBackoffOnly {
    fn reset(&mut self) {}
}

/// A watch of every `K`, kept in a new cache without `managedFields` and retried on its own
/// backoff: the cache, and the objects whose `key` changed ([`changed_objects`]).
pub(super) fn cached_changes<K: crate::WatchedKind, T: PartialEq + Send + 'static>(
    api: kube::Api<K>,
    key: impl Fn(&K) -> T + Send + 'static,
    metrics: Metrics,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send,
) {
    let (reader, events) = crate::cached_watch(api, crate::watcher_config());
    (reader, changed_objects(events, key, metrics))
}

/// The objects of a watch whose `key` changed since they were last seen, and every deletion.
/// Its errors stop here, said and counted ([`crate::watch_interrupted`]): the watch retries on
/// its own backoff and the controller has nothing to do with them.
fn changed_objects<K, T, S>(
    events: S,
    key: impl Fn(&K) -> T + Send + 'static,
    metrics: Metrics,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send
where
    K: kube::Resource<DynamicType = ()> + Send + 'static,
    T: PartialEq + Send + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let mut seen: HashMap<String, T> = HashMap::new();
    events.flat_map(move |event| {
        let out: Vec<Result<K, watcher::Error>> = match event {
            Err(e) => {
                crate::watch_interrupted::<K>(&metrics, &e);
                vec![]
            }
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                let k = key(&o);
                let name = o.name_any();
                if seen.get(&name) == Some(&k) {
                    vec![]
                } else {
                    seen.insert(name, k);
                    vec![Ok(o)]
                }
            }
            Ok(watcher::Event::Delete(o)) => {
                seen.remove(&o.name_any());
                vec![Ok(o)]
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => vec![],
        };
        futures::stream::iter(out)
    })
}

/// Reconcile errors are logged by the error policy, watch errors where they arrive
/// ([`changed_objects`]); here the controller's own.
pub(super) fn log_outcome<K, E: std::error::Error, W: std::error::Error>(
    outcome: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, W>>,
) -> std::future::Ready<()>
where
    K: kube::Resource,
{
    match outcome {
        Ok((obj, _)) => tracing::trace!(object = %obj, "reconciled"),
        Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
        Err(e) => tracing::warn!(error = %e, "controller"),
    }
    std::future::ready(())
}
