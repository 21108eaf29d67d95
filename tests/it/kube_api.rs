//! pinset's CRDs served by a real API server (apiextensions-apiserver + etcd): the server itself
//! refuses bad objects with messages a user understands, and serves the seed's example unchanged.

use crate::support;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use pinset_k8s::api::{MachineConfigNode, MachineConfigPool, PinnedImageSet};
use serde_json::json;
use std::time::Duration;

const DIGEST: &str = "86d26e7ebcccd6f07a75db5b1e56283b25c2ee1c6a755d6ffc5a4d59beb9c504";

fn image(n: usize) -> String {
    format!("quay.io/pinset/img{n}@sha256:{DIGEST}")
}

fn set(name: &str, images: &[String]) -> serde_json::Value {
    support::set_json(name, "worker", images)
}

async fn create_err(api: &Api<PinnedImageSet>, obj: serde_json::Value) -> String {
    let obj: PinnedImageSet = serde_json::from_value(obj).unwrap();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => panic!("the server accepted {}", obj.metadata.name.unwrap()),
        Err(e) => e.to_string(),
    }
}

/// An API server serving pinset's CRDs, a client of it, and the three kinds' APIs. A test binds
/// `server` (or `_server`) when it takes the rest apart: the server stops when it is dropped.
struct Cluster {
    server: support::apiserver::ApiServer,
    client: kube::Client,
    pools: Api<MachineConfigPool>,
    sets: Api<PinnedImageSet>,
    nodes: Api<MachineConfigNode>,
}

/// A [`Cluster`]; `None` (after a loud message) on a machine without the test bed.
async fn cluster() -> Option<Cluster> {
    let server = support::apiserver::ApiServer::start().await?;
    server.install_crds().await;
    let client = server.client().await;
    Some(Cluster {
        pools: Api::all(client.clone()),
        sets: Api::all(client.clone()),
        nodes: Api::all(client.clone()),
        server,
        client,
    })
}

/// The seed's example, as written (v1alpha1), is served and read back as v1; a set's images are
/// refused by name when not by digest, malformed, repeated, too many, none or too long, and 500
/// are accepted.
#[tokio::test]
async fn the_server_serves_the_seeds_example_and_validates_sets() {
    let Some(Cluster {
        server,
        client,
        sets,
        ..
    }) = cluster().await
    else {
        return;
    };
    let alpha = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "machineconfiguration.openshift.io",
            "v1alpha1",
            "PinnedImageSet",
        ),
        "pinnedimagesets",
    );
    let seed: DynamicObject = serde_saphyr::from_str(
        &std::fs::read_to_string(support::workspace().join("deploy/example-set.yaml")).unwrap(),
    )
    .unwrap();
    Api::<DynamicObject>::all_with(client.clone(), &alpha)
        .create(&PostParams::default(), &seed)
        .await
        .unwrap_or_else(|e| panic!("the seed example: {e}\n{}", server.log()));
    let back = sets.get("test-pinned").await.unwrap();
    assert_eq!(back.spec.pinned_images.len(), 2);

    let tag = create_err(
        &sets,
        set("tagged", &["quay.io/openshift/origin-cli:latest".into()]),
    )
    .await;
    support::assert_says(&tag, &["tags are not allowed", "spec.pinnedImages[0].name"]);
    let short = create_err(&sets, set("short", &["quay.io/x/y@sha256:abc".into()])).await;
    support::assert_says(&short, &["64 lowercase hexadecimal digits"]);
    let upper = create_err(
        &sets,
        set(
            "upper",
            &[format!("quay.io/x/y@sha256:{}", DIGEST.to_uppercase())],
        ),
    )
    .await;
    support::assert_says(&upper, &["64 lowercase hexadecimal digits"]);
    let dup = create_err(&sets, set("dup", &[image(1), image(2), image(1)])).await;
    support::assert_says(&dup, &["Duplicate value"]);
    let many: Vec<String> = (0..501).map(image).collect();
    let too_many = create_err(&sets, set("too-many", &many)).await;
    support::assert_says(&too_many, &["500"]);
    let empty = create_err(&sets, set("empty", &[])).await;
    support::assert_says(&empty, &["spec.pinnedImages"]);
    let long = format!("quay.io/{}/y@sha256:{DIGEST}", "a".repeat(400));
    let long = create_err(&sets, set("long", &[long])).await;
    support::assert_says(&long, &["447"]);
    // 500 unique images is the limit, and it is accepted.
    let limit: PinnedImageSet = serde_json::from_value(set("limit", &many[..500])).unwrap();
    sets.create(&PostParams::default(), &limit).await.unwrap();
}

/// A MachineConfigNode is named like its node, and its status follows the generation rules.
#[tokio::test]
async fn the_server_validates_node_status_generations() {
    let Some(c) = cluster().await else {
        return;
    };
    let nodes = &c.nodes;
    let mcn = |name: &str, node: &str| -> MachineConfigNode {
        serde_json::from_value(json!({
            "apiVersion": "machineconfiguration.openshift.io/v1",
            "kind": "MachineConfigNode",
            "metadata": {"name": name},
            "spec": {"node": {"name": node}, "pool": {"name": "worker"}}
        }))
        .unwrap()
    };
    let e = nodes
        .create(&PostParams::default(), &mcn("w-1", "w-2"))
        .await
        .unwrap_err()
        .to_string();
    support::assert_says(&e, &["metadata.name must equal spec.node.name"]);
    nodes
        .create(&PostParams::default(), &mcn("w-1", "w-1"))
        .await
        .unwrap();
    let status = |entry: serde_json::Value| {
        json!({
            "apiVersion": "machineconfiguration.openshift.io/v1",
            "kind": "MachineConfigNode",
            "metadata": {"name": "w-1"},
            "status": {"pinnedImageSets": [entry]}
        })
    };
    let apply = |v: serde_json::Value| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch_status(
                    "w-1",
                    &PatchParams::apply("test").force(),
                    &Patch::Apply(&v),
                )
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    };
    apply(status(
        json!({"name": "a", "desiredGeneration": 3, "currentGeneration": 2}),
    ))
    .await
    .unwrap();
    let e = apply(status(
        json!({"name": "a", "desiredGeneration": 1, "currentGeneration": 2}),
    ))
    .await
    .unwrap_err();
    support::assert_says(&e, &["greater than or equal to currentGeneration"]);
    let e = apply(status(json!({"name": "a", "desiredGeneration": 2})))
        .await
        .unwrap_err();
    support::assert_says(&e, &["desiredGeneration must not decrease"]);
    let e = apply(status(
        json!({"name": "a", "desiredGeneration": 3, "currentGeneration": 1}),
    ))
    .await
    .unwrap_err();
    support::assert_says(&e, &["currentGeneration must not decrease"]);
    let e = apply(status(json!({"name": "a", "desiredGeneration": 3, "currentGeneration": 2, "lastFailedGeneration": 3}))).await.unwrap_err();
    support::assert_says(&e, &["lastFailedGenerationError is required"]);
    let e = apply(status(json!({"name": "a", "desiredGeneration": 0})))
        .await
        .unwrap_err();
    support::assert_says(&e, &["desiredGeneration"]);
    apply(status(json!({"name": "a", "desiredGeneration": 4, "currentGeneration": 2, "lastFailedGeneration": 4, "lastFailedGenerationError": "q.io/x@sha256:00: not found"}))).await.unwrap();
}

/// A policy module named by tag is refused in words, not by a regular expression; a bad sha256
/// is named by its field; a module by digest is accepted.
#[tokio::test]
async fn the_server_refuses_a_policy_module_by_tag_in_words() {
    let Some(c) = cluster().await else {
        return;
    };
    let client = &c.client;
    let policies: Api<pinset_k8s::api::PolicyConfiguration> = Api::all(client.clone());
    let config = |module: &str, sha256: Option<&str>| {
        serde_json::from_value(json!({
            "apiVersion": "pinset.io/v1alpha1", "kind": "PolicyConfiguration",
            "metadata": {"name": "cluster"},
            "spec": {"pools": {"worker": {"module": module, "sha256": sha256}}}
        }))
        .unwrap()
    };
    let e = policies
        .create(
            &PostParams::default(),
            &config("oci://r.example/p:v3", None),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("spec.pools[worker].module")
            && e.contains("oci://REGISTRY/REPOSITORY@sha256:<64 hex digits>")
            && e.contains("a tag can move")
            && !e.contains("should match"),
        "{e}"
    );
    let e = policies
        .create(&PostParams::default(), &config("/p/a.wasm", Some("ABC")))
        .await
        .unwrap_err()
        .to_string();
    support::assert_says(&e, &["spec.pools.worker.sha256"]);
    let good = format!("oci://r.example/p@sha256:{DIGEST}");
    policies
        .create(&PostParams::default(), &config(&good, None))
        .await
        .unwrap();
}

fn pool(name: &str, roles: &[&str]) -> MachineConfigPool {
    support::pool(name, roles, &format!("node-role.kubernetes.io/{name}"))
}

/// The embedded default fleet policy for every pool.
fn default_fleet() -> pinset_k8s::controller::FleetTable {
    let runtime = pinset_policy::WasmRuntime::new().unwrap();
    pinset_k8s::controller::FleetTable::embedded(&runtime).unwrap()
}

/// Run the controller in this process until `done` holds, then stop it; its metrics.
async fn run_controller_until<F, Fut>(client: kube::Client, done: F) -> pinset_k8s::metrics::Metrics
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let metrics = pinset_k8s::metrics::Metrics::new();
    run_controller_with(client, metrics.clone(), done).await;
    metrics
}

/// Reconciles of `kind` (`pool`, `set`, `node`) the controller has finished, from its metrics.
fn reconciles(metrics: &pinset_k8s::metrics::Metrics, kind: &str) -> u64 {
    let prefix = format!("pinset_reconcile_seconds_count{{kind=\"{kind}\"}} ");
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0)
}

/// The controller has reconciled at least `pools` pools and `sets` sets, and every pool status
/// those reconciles computed has been written: what they were to write has been written.
fn idle(metrics: &pinset_k8s::metrics::Metrics, pools: u64, sets: u64) -> bool {
    reconciles(metrics, "pool") >= pools
        && reconciles(metrics, "set") >= sets
        && metrics.pool_status_writes_pending() == 0
}

/// [`run_controller_until`] with metrics the caller holds (to read them while it runs).
async fn run_controller_with<F, Fut>(
    client: kube::Client,
    metrics: pinset_k8s::metrics::Metrics,
    mut done: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    support::init_logging(&std::env::var("PINSET_TEST_LOG").unwrap_or_else(|_| "warn".into()));
    let (stop, task) = spawn_controller_with(&client, metrics.clone());
    let converged = "the controller converging";
    support::wait_for(converged, Duration::from_secs(60), || {
        let check = done();
        async move { check.await.then_some(()).ok_or("not yet".to_string()) }
    })
    .await;
    stop_controller(stop, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_writes_pool_selections_once() {
    let Some(Cluster {
        server: _server,
        client,
        pools,
        sets,
        ..
    }) = cluster().await
    else {
        return;
    };
    let pp = PostParams::default();
    pools
        .create(&pp, &pool("worker", &["worker"]))
        .await
        .unwrap();
    pools
        .create(&pp, &pool("infra", &["worker", "infra"]))
        .await
        .unwrap();
    sets.create(&pp, &serde_json::from_value(set("w", &[image(1)])).unwrap())
        .await
        .unwrap();
    let mut infra_set: PinnedImageSet =
        serde_json::from_value(set("i", &[image(2), image(3)])).unwrap();
    infra_set.metadata.labels = Some(
        [(
            "machineconfiguration.openshift.io/role".to_string(),
            "infra".to_string(),
        )]
        .into(),
    );
    sets.create(&pp, &infra_set).await.unwrap();

    let converged = || async {
        selection(&pools, "worker").await == Some(vec!["w".to_string()])
            && selection(&pools, "infra").await == Some(vec!["i".to_string(), "w".to_string()])
            && sets
                .get("i")
                .await
                .ok()
                .and_then(|s| s.status)
                .is_some_and(|s| s.image_count == 2 && s.pools == vec!["infra"])
            && sets
                .get("w")
                .await
                .ok()
                .and_then(|s| s.status)
                .is_some_and(|s| s.pools == vec!["infra", "worker"])
    };
    let first = run_controller_until(client.clone(), converged).await;
    assert_eq!(first.api_writes("pool_spec"), 2);
    assert_eq!(first.api_writes("set_status"), 2);

    // A fresh controller on a converged cluster writes nothing: once it has reconciled both
    // pools and both sets and has no pool status left to write, it has written nothing.
    let quiet = pinset_k8s::metrics::Metrics::new();
    run_controller_with(client.clone(), quiet.clone(), || {
        let m = quiet.clone();
        async move { idle(&m, 2, 2) }
    })
    .await;
    assert_eq!(
        quiet.api_writes("pool_spec")
            + quiet.api_writes("set_status")
            + quiet.api_writes("pool_status"),
        0,
        "{}",
        quiet.encode()
    );
}

/// A [`cluster`] with pool `worker` (role worker) and set `w` (one image) selected by it.
async fn worker_with_one_set() -> Option<Cluster> {
    let c = cluster().await?;
    let pp = PostParams::default();
    c.pools
        .create(&pp, &pool("worker", &["worker"]))
        .await
        .unwrap();
    let w = serde_json::from_value(set("w", &[image(1)])).unwrap();
    c.sets.create(&pp, &w).await.unwrap();
    Some(c)
}

/// A [`worker_with_one_set`] under a controller in this process, with the metrics it counts,
/// once the pool selects `w`.
struct Controlled {
    cluster: Cluster,
    metrics: pinset_k8s::metrics::Metrics,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn worker_under_controller() -> Option<Controlled> {
    let cluster = worker_with_one_set().await?;
    let metrics = pinset_k8s::metrics::Metrics::new();
    let (stop, task) = spawn_controller_with(&cluster.client, metrics.clone());
    selects(&cluster, "worker", &["w"], Duration::from_secs(60)).await;
    Some(Controlled {
        cluster,
        metrics,
        stop,
        task,
    })
}

/// The names of the sets pool `name` selects, if it exists and has a selection.
async fn selection(pools: &Api<MachineConfigPool>, name: &str) -> Option<Vec<String>> {
    let pool = pools.get(name).await.ok()?;
    Some(
        pool.spec
            .pinned_image_sets?
            .into_iter()
            .map(|s| s.name)
            .collect(),
    )
}

/// Wait up to `within` for pool `name` to select exactly `want`; past it, fail with the
/// selection last read and the API server's log.
async fn selects(cluster: &Cluster, name: &str, want: &[&str], within: Duration) {
    let what = format!("pool {name} selecting {want:?}");
    let every = Duration::from_millis(50);
    support::poll_until(&what, within, every, &|| cluster.server.log(), || async {
        let now = selection(&cluster.pools, name).await;
        match now.as_ref().is_some_and(|v| v.iter().eq(want.iter())) {
            true => Ok(()),
            false => Err(format!("{now:?}")),
        }
    })
    .await
}

/// Wait until pool `name`'s status speaks of its current generation and the controller has no
/// pool status left to write (none pending is not enough: a pool whose reconcile has not handed
/// its status over yet has none pending either).
async fn pool_status_lands(
    pools: &Api<MachineConfigPool>,
    name: &str,
    metrics: &pinset_k8s::metrics::Metrics,
) {
    let what = format!("pool {name}'s status");
    support::wait_for(&what, Duration::from_secs(60), || async {
        let p = pools.get(name).await.map_err(|e| e.to_string())?;
        let observed = p.status.as_ref().and_then(|s| s.observed.as_ref());
        let generation = observed.map(|o| o.generation);
        match generation == p.metadata.generation && metrics.pool_status_writes_pending() == 0 {
            true => Ok(()),
            false => Err(format!(
                "observed {generation:?} of {:?}",
                p.metadata.generation
            )),
        }
    })
    .await
}

/// Wait until set `name`'s status says it is in `pools` and the controller has no pool status
/// left to write.
async fn set_lands_in(
    sets: &Api<PinnedImageSet>,
    name: &str,
    pools: &[&str],
    metrics: &pinset_k8s::metrics::Metrics,
) {
    support::wait_for(&format!("set {name}"), Duration::from_secs(60), || async {
        let status = sets.get(name).await.ok().and_then(|s| s.status);
        let listed = status
            .as_ref()
            .is_some_and(|s| s.pools.iter().eq(pools.iter()));
        let pending = metrics.pool_status_writes_pending();
        match listed && pending == 0 {
            true => Ok(()),
            false => Err(format!(
                "status {status:?}, {pending} pool statuses pending"
            )),
        }
    })
    .await
}

/// A pool is reconciled again when its annotations change (the rollout ceiling lives there), and
/// not when the controller's own status write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_reacts_to_its_annotations_not_to_its_own_status() {
    let Some(cluster) = worker_with_one_set().await else {
        return;
    };
    let (client, pools) = (cluster.client.clone(), cluster.pools.clone());
    let reason = || async {
        pools
            .get("worker")
            .await
            .ok()
            .and_then(|p| p.status?.rollout)
            .map(|r| (r.target, r.reason))
    };
    // 0: the rollout status appears; 1: annotated, its reason names the bad value; 2: a barrier
    // annotation sent once that status is written; 3: the barrier reconciled.
    let metrics = pinset_k8s::metrics::Metrics::new();
    let step = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(0));
    let barrier_after = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    run_controller_with(client.clone(), metrics.clone(), || {
        let (step, barrier_after, m) = (step.clone(), barrier_after.clone(), metrics.clone());
        let current = step.load(std::sync::atomic::Ordering::Relaxed);
        let (pools, reason) = (pools.clone(), reason);
        let annotate = move |key: &'static str, value: &'static str| {
            let pools = pools.clone();
            async move {
                let patch = json!({"metadata": {"annotations": {key: value}}});
                pools
                    .patch("worker", &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .unwrap();
            }
        };
        async move {
            let next = match (current, reason().await) {
                (0, Some((target, _))) if target == "w@1" => {
                    annotate("pinset.io/rollout-max-pulling", "lots").await;
                    1
                }
                (1, Some((_, why)))
                    if why.contains("\"lots\" is neither a count nor a percentage")
                        && m.pool_status_writes_pending() == 0 =>
                {
                    // The status is written; the watch delivers its event before the barrier's
                    // (one stream, in resourceVersion order), so a reconcile of the pool's own
                    // status would be counted before the barrier's is.
                    barrier_after
                        .store(reconciles(&m, "pool"), std::sync::atomic::Ordering::Relaxed);
                    annotate("pinset.io/test-barrier", "1").await;
                    2
                }
                (2, _)
                    if reconciles(&m, "pool")
                        > barrier_after.load(std::sync::atomic::Ordering::Relaxed)
                        && m.pool_status_writes_pending() == 0 =>
                {
                    3
                }
                (s, _) => s,
            };
            step.store(next, std::sync::atomic::Ordering::Relaxed);
            next == 3
        }
    })
    .await;
    let text = metrics.encode();
    let reconciles = reconciles(&metrics, "pool");
    assert_eq!(metrics.api_writes("pool_status"), 2, "{text}");
    // The pool's creation and the set joining it, its selection written (a spec change), the
    // annotation, the barrier: at most five. Reacting to its own two status writes would add two.
    assert!(reconciles <= 5, "{reconciles} pool reconciles:\n{text}");
}

/// Another controller writes its own condition on the pool's status, again and again, while
/// pinset writes its status. pinset's writes carry the resourceVersion they were computed from,
/// so a write overtaken by the other's meets a conflict (409) instead of overwriting it. The
/// pool's watch reports no status change (a pool is reconciled for its spec, labels and
/// annotations), so the status lane itself must have the pool reconciled again: once the other
/// writer stops, pinset's status lands, and the other's condition is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_status_overtaken_by_another_writer_is_retried_until_it_lands() {
    let Some(cluster) = worker_with_one_set().await else {
        return;
    };
    let (client, pools) = (cluster.client.clone(), cluster.pools.clone());
    let metrics = pinset_k8s::metrics::Metrics::new();
    // Started once pinset's first status is there (two writers from the start would only
    // delay it).
    let other = std::sync::OnceLock::new();
    let reason = || async {
        let status = pools.get("worker").await.ok()?.status?;
        Some((status.rollout?.reason, status.conditions))
    };
    // Each step annotates the pool with a bad ceiling (the reason names it), until a status
    // write after an annotation met a conflict and that status has not landed: then the other
    // writer stops, and only the lane's own retry can bring it. (A step that meets no conflict
    // in 3 s, or whose status lands first, is followed by the next.)
    let values = [
        "lots", "heaps", "plenty", "loads", "oodles", "scores", "piles", "masses", "tons", "stacks",
    ];
    let state = std::sync::Mutex::new(Steps::default());
    run_controller_with(client.clone(), metrics.clone(), || {
        let (pools, metrics, other, state) = (pools.clone(), metrics.clone(), &other, &state);
        async move {
            let Some((why, _)) = reason().await else {
                return false;
            };
            let s = state.lock().unwrap().clone();
            let shown = s.step > 0 && why.contains(&format!("\"{}\" is neither", values[s.step - 1]));
            if s.stopped {
                return shown;
            }
            let conflicted = metrics.api_write_conflicts("pool_status") > s.conflicts_before;
            let waited = s.annotated_at.is_some_and(|t| t.elapsed() > Duration::from_secs(3));
            if s.step > 0 && conflicted && !shown {
                other.get().map(OtherWriter::stop).expect("started").await;
                state.lock().unwrap().stopped = true;
            } else if s.step == 0 || shown || waited {
                assert!(s.step < values.len(), "no status write met a conflict");
                other.get_or_init(|| OtherWriter::start(pools.clone()));
                let patch = json!({"metadata": {"annotations": {"pinset.io/rollout-max-pulling": values[s.step]}}});
                pools
                    .patch("worker", &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .unwrap();
                *state.lock().unwrap() = Steps {
                    step: s.step + 1,
                    stopped: false,
                    conflicts_before: metrics.api_write_conflicts("pool_status"),
                    annotated_at: Some(std::time::Instant::now()),
                };
            }
            false
        }
    })
    .await;
    let (_, conditions) = reason().await.expect("a status");
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "OtherControllerSynced"),
        "the other writer's condition is kept: {conditions:?}"
    );
    assert!(metrics.api_write_conflicts("pool_status") >= 1);
}

/// Where the test above stands: annotations applied, the other writer stopped, the conflicts
/// counted when the last annotation was applied, and when.
#[derive(Clone, Default)]
struct Steps {
    step: usize,
    stopped: bool,
    conflicts_before: u64,
    annotated_at: Option<std::time::Instant>,
}

/// Another field manager writing a condition of its own on pool `worker`'s status, from
/// [`OtherWriter::LOOPS`] loops at once (each waits for its write to land).
struct OtherWriter {
    stop: tokio_util::sync::CancellationToken,
    tasks: tokio::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl OtherWriter {
    const LOOPS: usize = 4;

    fn start(pools: Api<MachineConfigPool>) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let tasks = (0..Self::LOOPS)
            .map(|writer| {
                let (token, pools) = (stop.clone(), pools.clone());
                tokio::spawn(async move {
                    let apply = PatchParams::apply("other-controller").force();
                    for n in 0u64.. {
                        if token.is_cancelled() {
                            return;
                        }
                        let body = json!({
                            "apiVersion": "machineconfiguration.openshift.io/v1",
                            "kind": "MachineConfigPool",
                            "status": {"conditions": [{
                                "type": "OtherControllerSynced", "status": "True",
                                "reason": "Synced", "message": format!("writer {writer} pass {n}"),
                                "lastTransitionTime": "2026-12-02T00:00:00Z",
                            }]},
                        });
                        let _ = pools
                            .patch_status("worker", &apply, &Patch::Apply(&body))
                            .await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            tasks: tokio::sync::Mutex::new(tasks),
        }
    }

    async fn stop(&self) {
        self.stop.cancel();
        for task in self.tasks.lock().await.drain(..) {
            task.await.unwrap();
        }
    }
}

/// The API server restarts under a running controller (its watches break; resuming them may
/// meet 410 Gone): the controller rides it out, reacts to a change made after the restart, and
/// writes only what that change needs — no re-write of what was already converged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_rides_out_an_api_server_restart_without_rewriting() {
    let Some(Controlled {
        cluster,
        metrics,
        stop,
        task,
    }) = worker_under_controller().await
    else {
        return;
    };
    let (server, sets) = (&cluster.server, &cluster.sets);
    let sixty = Duration::from_secs(60);
    // The set's status and the pool's status land too.
    set_lands_in(sets, "w", &["worker"], &metrics).await;
    pool_status_lands(&cluster.pools, "worker", &metrics).await;
    let writes = |m: &pinset_k8s::metrics::Metrics| {
        (
            m.api_writes("pool_spec"),
            m.api_writes("set_status"),
            m.api_writes("pool_status"),
        )
    };
    let before = writes(&metrics);

    server.restart().await;
    // The restarted server serves the custom resources again once it has read their CRDs.
    let w2: PinnedImageSet = serde_json::from_value(set("w2", &[image(2)])).unwrap();
    let every = Duration::from_millis(200);
    support::poll_until("w2 created", sixty, every, &|| server.log(), || async {
        let created = sets.create(&PostParams::default(), &w2).await;
        created.map(drop).map_err(|e| e.to_string())
    })
    .await;
    selects(&cluster, "worker", &["w", "w2"], sixty).await;
    set_lands_in(sets, "w2", &["worker"], &metrics).await;
    pool_status_lands(&cluster.pools, "worker", &metrics).await;
    let after = writes(&metrics);
    assert_eq!(
        after.0 - before.0,
        1,
        "one pool selection written: {before:?} → {after:?}"
    );
    assert_eq!(
        after.1 - before.1,
        1,
        "only the new set's status: {before:?} → {after:?}"
    );
    assert!(after.2 - before.2 <= 1, "{before:?} → {after:?}");
    stop_controller(stop, task).await;
}

/// One of the controller's watches failing for long (here the MachineConfigNode CRD is deleted:
/// its watch meets 404 after 404, each retried later than the last) does not stall the others: a
/// set created while it fails is selected at once. Each watch backs off on its own errors; a
/// backoff shared by the three (kube's controller adds one unless told not to) would sleep after
/// each of the node watch's errors as long as that watch does — 0.8, 1.6, 3.2, 6.4, 12.8 s… with
/// jitter of up to as much again — and read no pool or set meanwhile: once the node watch has
/// failed four times it is in its fourth sleep, of at least 6.4 s, so a set selected within 2 s
/// proves the others unstalled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_watch_does_not_stall_the_others() {
    let Some(Controlled {
        cluster,
        metrics,
        stop,
        task: controller,
    }) = worker_under_controller().await
    else {
        return;
    };
    let (client, sets) = (&cluster.client, &cluster.sets);

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mcn = "machineconfignodes.machineconfiguration.openshift.io";
    crds.delete(mcn, &Default::default()).await.unwrap();
    // Each failure of the node watch is counted under its kind when it happens.
    let count = |kind| metrics.watch_interruptions(kind);
    let four = "the node watch failing four times";
    support::wait_for(four, Duration::from_secs(60), || async {
        match count("MachineConfigNode") >= 4 {
            true => Ok(()),
            false => Err(metrics.encode()),
        }
    })
    .await;
    let w2: PinnedImageSet = serde_json::from_value(set("w2", &[image(2)])).unwrap();
    sets.create(&PostParams::default(), &w2).await.unwrap();
    // Within 2 s, while the node watch fails.
    selects(&cluster, "worker", &["w", "w2"], Duration::from_secs(2)).await;
    // The healthy watches were never interrupted.
    assert_eq!(count("MachineConfigPool") + count("PinnedImageSet"), 0);
    stop_controller(stop, controller).await;
}

/// Where OpenShift's Machine Config Operator owns the CRDs (annotations of its release payload,
/// as on a real cluster), `pinset controller` and `pinset agent` refuse to start with a message
/// that says what to do, and write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinset_refuses_to_run_beside_openshifts_machine_config_operator() {
    let Some(server) = support::apiserver::ApiServer::start().await else {
        return;
    };
    let mut crds = pinset_k8s::api::crds();
    for crd in &mut crds {
        crd.metadata.labels = None;
        crd.metadata.annotations = Some(
            [
                (
                    "api-approved.openshift.io",
                    "https://github.com/openshift/api/pull/1453",
                ),
                (
                    "include.release.openshift.io/self-managed-high-availability",
                    "true",
                ),
                ("include.release.openshift.io/single-node-developer", "true"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        );
    }
    server.install(crds).await;
    let client = server.client().await;
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    pools
        .create(&PostParams::default(), &pool("worker", &["worker"]))
        .await
        .unwrap();
    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    sets.create(
        &PostParams::default(),
        &serde_json::from_value(set("s", &[image(1)])).unwrap(),
    )
    .await
    .unwrap();
    let before = pools.get("worker").await.unwrap().metadata.resource_version;

    let (dir, node) = support::scratch_file(
        "node.yaml",
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: w-0\n  labels: {node-role.kubernetes.io/worker: \"\"}\n",
    );
    let kubeconfig = format!("--kubeconfig={}", server.kubeconfig.display());
    let node_file = format!("--node-file={}", node.display());
    let dead_cri = format!("--cri=unix://{}", dir.path().join("none.sock").display());
    let metrics = "--metrics-addr=127.0.0.1:0".to_string();
    for args in [
        vec![
            "controller".to_string(),
            kubeconfig.clone(),
            metrics.clone(),
        ],
        vec![
            "agent".into(),
            kubeconfig.clone(),
            metrics.clone(),
            "--node-name=w-0".into(),
            node_file.clone(),
            dead_cri.clone(),
        ],
    ] {
        let started = std::time::Instant::now();
        let (code, _, err) = support::pinset_blocking(args).await;
        assert_eq!(code, 1, "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        support::assert_says(
            &err,
            &[
                "belongs to OpenShift (annotation",
                "Machine Config Operator",
                "see docs/openshift.md",
            ],
        );
        assert_eq!(
            err.matches("belongs to OpenShift").count(),
            1,
            "said once: {err}"
        );
    }
    let after = pools.get("worker").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before,
        "the pool was written"
    );
    assert!(after.spec.pinned_image_sets.is_none());
    let set = sets.get("s").await.unwrap();
    assert!(set.status.is_none(), "the set's status was written");
    let nodes: Api<MachineConfigNode> = Api::all(client);
    assert!(
        nodes
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "a node report was written"
    );
}

/// What an agent reports for set `apps` on node `name`: at `current`, or failed at `failed`.
async fn agent_reports(
    nodes: &Api<MachineConfigNode>,
    name: &str,
    desired: i64,
    current: Option<i64>,
    failed: Option<i64>,
) {
    agent_reports_ready(nodes, name, true, desired, current, failed).await
}

/// [`agent_reports`], the node Ready or not.
async fn agent_reports_ready(
    nodes: &Api<MachineConfigNode>,
    name: &str,
    ready: bool,
    desired: i64,
    current: Option<i64>,
    failed: Option<i64>,
) {
    let mut set =
        json!({"name": "apps", "desiredGeneration": desired, "currentGeneration": current});
    if let Some(g) = failed {
        set["lastFailedGeneration"] = json!(g);
        set["lastFailedGenerationError"] = json!(format!("{}: manifest unknown", image(9)));
    }
    let status = json!({
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigNode",
        "metadata": {"name": name},
        "status": {"pinnedImageSets": [set], "nodeState": {"ready": ready}}
    });
    nodes
        .patch_status(
            name,
            &PatchParams::apply("test-agent").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
}

/// A MachineConfigNode in pool `worker` for each of `names`, reporting `apps` generation 1
/// wanted, as a starting agent does.
async fn worker_nodes(nodes: &Api<MachineConfigNode>, names: &[&str]) {
    for name in names {
        let mcn: MachineConfigNode = serde_json::from_value(json!({
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigNode",
            "metadata": {"name": name},
            "spec": {"node": {"name": name}, "pool": {"name": "worker"}}
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &mcn).await.unwrap();
        agent_reports(nodes, name, 1, None, None).await;
    }
}

/// A controller run in this process: the token that stops it, and its task.
type Running = (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
);

/// The controller in this process with the embedded default fleet policy, until the token is
/// cancelled.
fn spawn_controller(client: &kube::Client) -> Running {
    spawn_controller_with(client, pinset_k8s::metrics::Metrics::new())
}

/// [`spawn_controller`] with metrics the caller holds.
fn spawn_controller_with(client: &kube::Client, metrics: pinset_k8s::metrics::Metrics) -> Running {
    spawn_controller_as(client, metrics, default_fleet())
}

/// [`spawn_controller`] with the fleet policies of `fleet`.
fn spawn_controller_with_fleet(
    client: &kube::Client,
    fleet: pinset_k8s::controller::FleetTable,
) -> Running {
    spawn_controller_as(client, pinset_k8s::metrics::Metrics::new(), fleet)
}

fn spawn_controller_as(
    client: &kube::Client,
    metrics: pinset_k8s::metrics::Metrics,
    fleet: pinset_k8s::controller::FleetTable,
) -> Running {
    let stop = tokio_util::sync::CancellationToken::new();
    let controller = tokio::spawn(pinset_k8s::controller::run(
        client.clone(),
        metrics,
        pinset_k8s::controller::FleetPolicies::new(fleet, None),
        None,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        stop.clone(),
    ));
    (stop, controller)
}

/// Stop a controller started by the test: it must still be running, and stop within 10 s.
async fn stop_controller(
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
) {
    assert!(!task.is_finished(), "the controller is still running");
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the controller stops")
        .expect("the controller's task ends without a panic");
}

/// Pool `worker` with `annotations`, set `apps` of one image for it, and a MachineConfigNode in
/// the pool for each of `names` (as starting agents report them): a rollout about to start.
async fn worker_rollout(c: &Cluster, annotations: &[(&str, &str)], names: &[&str]) {
    support::create_annotated_pool(&c.client, "worker", &["worker"], annotations).await;
    let apps = serde_json::from_value(set("apps", &[image(1)])).unwrap();
    c.sets.create(&PostParams::default(), &apps).await.unwrap();
    worker_nodes(&c.nodes, names).await;
}

/// The generation of `apps` node `name` is granted, if any.
async fn granted(nodes: &Api<MachineConfigNode>, name: &str) -> Option<i64> {
    let n = nodes.get(name).await.ok()?;
    let grant = n.spec.rollout_grant?;
    grant
        .sets
        .iter()
        .find(|s| s.name == "apps")
        .map(|s| s.generation)
}

/// Play both agents until each has pinned generation `g` of `apps` (or, with `fail`, until the
/// first node granted `g` has reported it failed).
async fn play_agents(nodes: &Api<MachineConfigNode>, g: i64, fail: bool) {
    let mut reported = [false; 2];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !reported.iter().all(|r| *r) {
        assert!(
            std::time::Instant::now() < deadline,
            "no grant of generation {g} in 60 s"
        );
        for (i, name) in ["n0", "n1"].iter().enumerate() {
            if !reported[i] && granted(nodes, name).await >= Some(g) {
                let (current, failed) = if fail {
                    (Some(g - 1), Some(g))
                } else {
                    (Some(g), None)
                };
                agent_reports(nodes, name, g, current, failed).await;
                reported[i] = true;
                if fail {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `pinset rollout ARGS` as the cluster's administrator, off the async runtime.
async fn rollout_now(cluster: &Cluster, args: &[&str]) -> (i32, String, String) {
    let kc = cluster.server.kubeconfig.display().to_string();
    let args = ["rollout"].iter().chain(args).map(|a| a.to_string());
    support::pinset_blocking(args.chain(["--kubeconfig".into(), kc]).collect()).await
}

/// A cluster with the pool `worker` (paused by `pinset rollout pause` when `paused`), the set
/// `apps` of two images, its nodes n0 and n1 (played by the test) and the controller; once
/// `pinset rollout status` reads the pool's status of `apps@1`, which it returns.
async fn rollout_bed(paused: bool) -> Option<(Cluster, Running, serde_json::Value)> {
    let cluster = cluster().await?;
    let pp = PostParams::default();
    let worker = pool("worker", &["worker"]);
    cluster.pools.create(&pp, &worker).await.unwrap();
    if paused {
        let (code, out, _) = rollout_now(&cluster, &["pause", "worker"]).await;
        assert_eq!((code, out.trim()), (0, "machineconfigpool/worker paused"));
    }
    let apps = serde_json::from_value(set("apps", &[image(1), image(2)])).unwrap();
    cluster.sets.create(&pp, &apps).await.unwrap();
    worker_nodes(&cluster.nodes, &["n0", "n1"]).await;
    let running = spawn_controller(&cluster.client);
    let status = ["status", "worker", "--watch=false", "-o", "json"];
    let observed = support::wait_for("the pool's status", Duration::from_secs(30), || async {
        let (code, out, err) = rollout_now(&cluster, &status).await;
        assert_eq!(code, 0, "{err}");
        let read: serde_json::Value = serde_json::from_str(&out).unwrap();
        let observed = read["observed"] == json!(true);
        observed.then_some(read.clone()).ok_or(read.to_string())
    })
    .await;
    Some((cluster, running, observed))
}

/// `pinset rollout pause` and `resume` say what they did, refuse to do it twice, and name a
/// pool that does not exist (as `status` does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinset_rollout_pause_and_resume_refuse_twice_and_name_an_unknown_pool() {
    let Some(c) = cluster().await else {
        return;
    };
    let worker = pool("worker", &["worker"]);
    c.pools
        .create(&PostParams::default(), &worker)
        .await
        .unwrap();
    let (code, out, _) = rollout_now(&c, &["pause", "worker"]).await;
    assert_eq!((code, out.trim()), (0, "machineconfigpool/worker paused"));
    let (code, _, err) = rollout_now(&c, &["pause", "worker"]).await;
    assert!(
        code == 1 && err.contains("worker is already paused"),
        "{err}"
    );
    let (code, out, err) = rollout_now(&c, &["resume", "worker"]).await;
    assert_eq!(
        (code, out.trim()),
        (0, "machineconfigpool/worker resumed"),
        "{err}"
    );
    let (code, _, err) = rollout_now(&c, &["resume", "worker"]).await;
    assert!(code == 1 && err.contains("worker is not paused"), "{err}");
    for args in [
        &["pause", "nosuch"][..],
        &["status", "nosuch", "--watch=false"],
    ] {
        let (code, _, err) = rollout_now(&c, args).await;
        let named = err.contains("MachineConfigPool nosuch not found");
        assert!(code == 1 && named, "{args:?}: {err}");
    }
}

/// A paused pool reads Paused (as JSON: its target, its nodes waiting), and a follow of it
/// times out saying where it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinset_rollout_status_of_a_paused_pool_reads_paused_and_a_follow_times_out() {
    let Some((c, (stop, controller), paused)) = rollout_bed(true).await else {
        return;
    };
    let read = ["standing", "target", "waiting", "nodes"].map(|k| &paused[k]);
    let want = [json!("Paused"), json!("apps@1"), json!(2), json!(2)];
    assert_eq!(read, want.each_ref(), "{paused}");
    let (code, out, err) = rollout_now(&c, &["status", "worker", "--timeout", "3s"]).await;
    assert_eq!(code, 1, "{out}\n{err}");
    let timed_out = "timed out after 3s waiting for MachineConfigPool worker";
    support::assert_says(&err, &[timed_out]);
    let waited = "Waiting for MachineConfigPool worker to roll out: 0 of 2 nodes at apps@1 (2 waiting): paused";
    support::assert_says(&out, &[waited]);
    stop_controller(stop, controller).await;
}

/// `pinset rollout status` follows a rollout to its end (exit 0) through an API server restart
/// (said once, as retrying), and draws it: a bar per node, the second starting once the
/// canary's ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinset_rollout_status_follows_a_rollout_to_its_end_through_an_api_server_restart() {
    let Some((c, (stop, controller), _)) = rollout_bed(false).await else {
        return;
    };
    let pictures = tempfile::tempdir().unwrap();
    let svg = pictures.path().join("rollout.svg");
    let (first, mut lines, follow) = follow_worker(&c, &svg).await;
    // The API server restarts under the follow (and the controller): both ride it out.
    c.server.restart().await;
    play_agents(&c.nodes, 1, false).await;
    let status = tokio::task::spawn_blocking(move || follow.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let mut rest = Vec::new();
    while let Some(line) = lines.recv().await {
        rest.push(line);
    }
    let err = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(0), "{first}\n{rest:?}\n{err}");
    // The restart, said once per interruption, naming the watch; not again by kube's client.
    support::assert_says(&err, &["(retrying)"]);
    let from_kube = err.contains("failed with error") || err.contains("eof in poll");
    assert!(!from_kube, "{err}");
    let start = "Waiting for MachineConfigPool worker to roll out: 0 of 2 nodes at apps@1";
    assert!(first.starts_with(start), "{first}");
    let end = "MachineConfigPool worker successfully rolled out: 2 of 2 nodes at apps@1";
    assert_eq!(rest.last().map(String::as_str), Some(end), "{rest:?}");
    support::assert_says(&err, &[&format!("timeline: {}", svg.display())]);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let bars = support::timeline_bars(&svg);
    assert!(bars.iter().all(|b| b.3 == "pull"), "{bars:?}");
    assert_eq!(bars.len(), 2, "{bars:?}");
    let one_after_the_other = bars[1].0 >= bars[0].1;
    assert!(
        one_after_the_other,
        "the nodes pulled one after the other: {bars:?}"
    );
    stop_controller(stop, controller).await;
}

/// `pinset rollout status worker --timeout 60s --timeline SVG`, started: its first line (where
/// it starts from), the lines after it as they come, and the process.
async fn follow_worker(
    c: &Cluster,
    svg: &std::path::Path,
) -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<String>,
    std::process::Child,
) {
    let mut follow = support::follow_worker_rollout(&c.server.kubeconfig, "60s", svg)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(follow.stdout.take().unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(out) {
            let _ = tx.send(line.unwrap());
        }
    });
    let first = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the follow prints where it starts")
        .unwrap();
    (first, rx, follow)
}

/// A new generation whose canary fails: `pinset rollout status` ends with the pool Degraded,
/// naming the node and the image (exit 1), in YAML as asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinset_rollout_status_ends_on_a_failed_canary_naming_it() {
    let Some((c, (stop, controller), _)) = rollout_bed(false).await else {
        return;
    };
    play_agents(&c.nodes, 1, false).await;
    let mut two = c.sets.get("apps").await.unwrap();
    let added = serde_json::from_value(json!({"name": image(9)})).unwrap();
    two.spec.pinned_images.push(added);
    c.sets
        .replace("apps", &PostParams::default(), &two)
        .await
        .unwrap();
    play_agents(&c.nodes, 2, true).await;
    let args = ["status", "worker", "--timeout", "60s", "-o", "yaml"];
    let (code, out, err) = rollout_now(&c, &args).await;
    assert_eq!(code, 1, "{out}\n{err}");
    let held: serde_json::Value = serde_saphyr::from_str(&out).unwrap();
    let read = ["standing", "failed", "target"].map(|k| &held[k]);
    let want = [json!("Degraded"), json!(1), json!("apps@2")];
    assert_eq!(read, want.each_ref(), "{out}");
    let members = held["members"].as_array().unwrap();
    let canary = members
        .iter()
        .find(|m| m["phase"] == json!("failed"))
        .unwrap();
    let name = canary["name"].as_str().unwrap();
    support::assert_says(
        &err,
        &[
            "MachineConfigPool worker is Degraded",
            name,
            "manifest unknown",
        ],
    );
    stop_controller(stop, controller).await;
}

/// The node granted `generation` of `apps` among `names`, other than `not`, once one is.
async fn next_granted(nodes: &Api<MachineConfigNode>, names: &[&str], not: &[&str]) -> String {
    support::wait_for("a node granted", Duration::from_secs(30), || async {
        for name in names.iter().filter(|n| !not.contains(n)) {
            if granted(nodes, name).await >= Some(1) {
                return Ok(name.to_string());
            }
        }
        Err(format!("none of {names:?} but {not:?}"))
    })
    .await
}

/// A node that disappears mid-rollout frees its slot: with one node at a time, the node granted
/// after the canary is deleted while it pulls, and the last node is granted in its place at
/// once (the deletion triggers the pool; the periodic resync would come minutes later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_disappears_mid_rollout_frees_its_slot() {
    let Some(c) = cluster().await else {
        return;
    };
    let names = ["n0", "n1", "n2"];
    worker_rollout(&c, &[], &names).await;
    let nodes = &c.nodes;
    let (stop, controller) = spawn_controller(&c.client);
    let canary = next_granted(nodes, &names, &[]).await;
    agent_reports(nodes, &canary, 1, Some(1), None).await;
    let second = next_granted(nodes, &names, &[&canary]).await;
    // The slot is taken: the third node waits while the second pulls. The pool's status, written
    // by the decision that granted the second, says so.
    rollout_until(&c.pools, "two granted, one waiting", |r| {
        r.granted == 2 && r.waiting == 1
    })
    .await;
    let third = names
        .iter()
        .find(|n| ![&canary, &second].contains(&&n.to_string()))
        .unwrap();
    assert_eq!(
        granted(nodes, third).await,
        None,
        "two nodes pulling at once"
    );
    nodes.delete(&second, &Default::default()).await.unwrap();
    let replaced = next_granted(nodes, &[third], &[]).await;
    assert_eq!(&replaced, third);
    stop_controller(stop, controller).await;
}

/// The pool's rollout reason and whether its PolicyFallback condition is True (with its message).
async fn pool_rollout(pools: &Api<MachineConfigPool>, name: &str) -> (String, Option<String>) {
    let status = pools.get(name).await.unwrap().status.unwrap_or_default();
    let fallback = pinset_k8s::condition::true_message(
        &status.conditions,
        pinset_k8s::api::CONDITION_POLICY_FALLBACK,
    )
    .map(str::to_string);
    (
        status.rollout.map(|r| r.reason).unwrap_or_default(),
        fallback,
    )
}

/// The worker pool's `status.rollout` once `check` holds (30 s at most).
async fn rollout_until(
    pools: &Api<MachineConfigPool>,
    what: &str,
    check: impl Fn(&pinset_k8s::api::PoolRollout) -> bool,
) -> pinset_k8s::api::PoolRollout {
    support::wait_for(what, Duration::from_secs(30), || async {
        let rollout = pools
            .get("worker")
            .await
            .ok()
            .and_then(|p| p.status?.rollout);
        rollout
            .clone()
            .filter(|r| check(r))
            .ok_or(format!("the pool's rollout is {rollout:?}"))
    })
    .await
}

/// The worker pool's rollout reason and fallback message once `check` holds on them (30 s at
/// most).
async fn pool_until(
    pools: &Api<MachineConfigPool>,
    what: &str,
    check: impl Fn(&str, Option<&str>) -> bool,
) -> (String, Option<String>) {
    support::wait_for(what, Duration::from_secs(30), || async {
        let (reason, fallback) = pool_rollout(pools, "worker").await;
        match check(&reason, fallback.as_deref()) {
            true => Ok((reason, fallback)),
            false => Err(format!("reason {reason:?}, fallback {fallback:?}")),
        }
    })
    .await
}

/// The ceiling is checked on the nodes the controller writes grants to: a fleet module that
/// grants every node of a pool whose only Ready, waiting node fits the ceiling of 2 — beside a
/// node that is not Ready and one whose set failed before any grant — is refused (3 grants would
/// be written), the default answers with its canary, and the pool's fallback names the ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_refuses_a_grant_over_the_ceiling_whatever_the_nodes_state() {
    let Some(c) = cluster().await else {
        return;
    };
    let ceiling = [
        ("pinset.io/rollout-max-pulling", "2"),
        ("pinset.test/hostile-fleet", "all"),
    ];
    worker_rollout(&c, &ceiling, &["n0", "n1", "n2"]).await;
    let (pools, nodes) = (&c.pools, &c.nodes);
    agent_reports_ready(nodes, "n0", false, 1, None, None).await;
    agent_reports(nodes, "n1", 1, None, Some(1)).await;
    let runtime = pinset_policy::WasmRuntime::new().unwrap();
    let mut fleet = default_fleet();
    let hostile = support::policy_path("pinset_test_policy_hostile");
    fleet.by_pool.insert(
        "worker".into(),
        runtime
            .load_file_as::<pinset_policy::FleetContract>(
                &hostile,
                None,
                pinset_policy::Limits::default(),
            )
            .unwrap(),
    );
    let (stop, controller) = spawn_controller_with_fleet(&c.client, fleet);
    let (_, fallback) = pool_until(pools, "the fallback is reported", |_, f| f.is_some()).await;
    let fallback = fallback.unwrap();
    support::assert_says(
        &fallback,
        &["3 nodes pulling at once, over the pool's ceiling of 2"],
    );
    assert_eq!(granted(nodes, "n2").await, Some(1), "the default's canary");
    // The status the decision wrote counts the one grant it made.
    rollout_until(pools, "one node granted", |r| r.granted == 1).await;
    for name in ["n0", "n1"] {
        assert_eq!(granted(nodes, name).await, None, "{name} granted");
    }
    stop_controller(stop, controller).await;
}

/// A ceiling lowered mid-rollout leaves the pool over it: the default policy grants nobody until
/// its nodes are done, and that answer is no policy failure (no fallback, no condition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ceiling_lowered_mid_rollout_is_waited_out_without_a_fallback() {
    let Some(c) = cluster().await else {
        return;
    };
    let names = ["n0", "n1", "n2", "n3"];
    worker_rollout(&c, &[("pinset.io/rollout-max-pulling", "3")], &names).await;
    let (pools, nodes) = (&c.pools, &c.nodes);
    let (stop, controller) = spawn_controller(&c.client);
    let canary = next_granted(nodes, &names, &[]).await;
    agent_reports(nodes, &canary, 1, Some(1), None).await;
    for name in names {
        support::wait_for(name, Duration::from_secs(30), || async {
            granted(nodes, name)
                .await
                .ok_or("never granted".to_string())
        })
        .await;
    }
    pools
        .patch(
            "worker",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "pinset.io/rollout-max-pulling": "1"
            }}})),
        )
        .await
        .unwrap();
    let (reason, fallback) = pool_until(pools, "the lowered ceiling is seen", |r, _| {
        r.contains("wave of 1: 3 node(s) in flight")
    })
    .await;
    assert_eq!(fallback, None, "{reason}");
    stop_controller(stop, controller).await;
}

/// The API of one of pinset's kinds as raw JSON: what is read back is what the server kept, not
/// what pinset's types make of it.
fn raw(client: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("machineconfiguration.openshift.io", "v1", kind);
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

/// An object as OpenShift writes it: (kind, plural, name, the object with its spec, its status).
type OpenShiftObject = (
    &'static str,
    &'static str,
    &'static str,
    serde_json::Value,
    serde_json::Value,
);

/// One object of each kind as OpenShift writes it — with the fields of its v1
/// MachineConfigPool, MachineConfigNode and PinnedImageSet that pinset does not use, spec and
/// status.
fn openshift_objects() -> [OpenShiftObject; 3] {
    let pool_spec = json!({
        "machineConfigSelector": {"matchLabels": {"machineconfiguration.openshift.io/role": "worker"}},
        "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}},
        "paused": true,
        "maxUnavailable": "10%",
        "configuration": {
            "name": "rendered-worker-0f1e2d",
            "source": [
                {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig", "name": "00-worker"},
                {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig", "name": "99-worker-ssh"}
            ]
        },
        "osImageStream": {"name": "rhel-10"}
    });
    let pool_status = json!({
        "observedGeneration": 3,
        "configuration": {"name": "rendered-worker-0f1e2d"},
        "machineCount": 3, "updatedMachineCount": 2, "readyMachineCount": 2,
        "unavailableMachineCount": 1, "degradedMachineCount": 0,
        "certExpirys": [{"bundle": "KubeAPIServerServingCAData", "subject": "CN=admin-kubeconfig-signer", "expiry": "2036-12-01T00:00:00Z"}],
        "poolSynchronizersStatus": [{
            "poolSynchronizerType": "PinnedImageSets", "machineCount": 3, "updatedMachineCount": 2,
            "readyMachineCount": 2, "availableMachineCount": 2, "unavailableMachineCount": 1, "observedGeneration": 3
        }]
    });
    let node_spec = json!({
        "node": {"name": "worker-0"}, "pool": {"name": "worker"},
        "configVersion": {"desired": "rendered-worker-0f1e2d"},
        "configImage": {"desiredImage": format!("quay.io/openshift/os@sha256:{DIGEST}")}
    });
    let node_status = json!({
        "observedGeneration": 2,
        "configVersion": {"current": "rendered-worker-0a0b0c", "desired": "rendered-worker-0f1e2d"},
        "configImage": {"currentImage": format!("quay.io/openshift/os@sha256:{DIGEST}")},
        "pinnedImageSets": [{"name": "release", "desiredGeneration": 2, "currentGeneration": 1}]
    });
    let set_status = json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "AsExpected", "message": "",
                        "lastTransitionTime": "2026-12-01T00:00:00Z"}]
    });
    [
        (
            "MachineConfigPool",
            "machineconfigpools",
            "worker",
            json!({"spec": pool_spec}),
            pool_status,
        ),
        (
            "MachineConfigNode",
            "machineconfignodes",
            "worker-0",
            json!({"spec": node_spec}),
            node_status,
        ),
        (
            "PinnedImageSet",
            "pinnedimagesets",
            "release",
            set("release", &[image(1)]),
            set_status,
        ),
    ]
}

/// Write `object` (kind, plural, name, spec, status) as OpenShift would: created, then its
/// status patched.
async fn write_as_openshift(
    client: &kube::Client,
    (kind, plural, name, body, status): &OpenShiftObject,
) -> Api<DynamicObject> {
    let api = raw(client, kind, plural);
    let mut object = body.clone();
    object["apiVersion"] = json!("machineconfiguration.openshift.io/v1");
    object["kind"] = json!(kind);
    object["metadata"] = json!({"name": name});
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    let warnings = api.create(&PostParams::default(), &object).await;
    warnings.unwrap_or_else(|e| panic!("{kind}: {e}"));
    let status = Patch::Merge(json!({"status": status}));
    let patched = api
        .patch_status(name, &PatchParams::default(), &status)
        .await;
    patched.unwrap_or_else(|e| panic!("{kind} status: {e}"));
    api
}

/// Objects written for OpenShift — with the fields of its v1 MachineConfigPool,
/// MachineConfigNode and PinnedImageSet that pinset does not use, spec and status — are served
/// and read back unchanged (nothing pruned).
#[tokio::test]
async fn objects_written_for_openshift_keep_every_field() {
    let Some(c) = cluster().await else {
        return;
    };
    for case in openshift_objects() {
        let api = write_as_openshift(&c.client, &case).await;
        let (kind, _, name, body, status) = case;
        let back = api.get(name).await.unwrap();
        assert_eq!(back.data["spec"], body["spec"], "{kind}: spec read back");
        // Every field written is kept as written (the server may default pinset's own, as
        // PinnedImageSet's imageCount).
        for (field, value) in status.as_object().unwrap() {
            assert_eq!(
                &back.data["status"][field], value,
                "{kind}: status.{field} read back"
            );
        }
    }
}

/// A cluster holding the pool `worker` as OpenShift wrote it ([`openshift_objects`]), and the
/// pools' API.
async fn cluster_with_openshifts_pool() -> Option<(Cluster, Api<DynamicObject>)> {
    let c = cluster().await?;
    let [openshift_pool, ..] = openshift_objects();
    let pools = write_as_openshift(&c.client, &openshift_pool).await;
    Some((c, pools))
}

/// OpenShift's status rules hold where pinset writes: no count over the pool's machines, the
/// observed generation moves back only to zero, no more nodes ready than available.
#[tokio::test]
async fn openshifts_status_rules_hold_on_a_pool() {
    let Some((_cluster, pools)) = cluster_with_openshifts_pool().await else {
        return;
    };
    let over = json!({"status": {"poolSynchronizersStatus": [{
        "poolSynchronizerType": "PinnedImageSets", "machineCount": 3, "updatedMachineCount": 4,
        "readyMachineCount": 2, "availableMachineCount": 2, "unavailableMachineCount": 1
    }]}});
    let e = pools
        .patch_status("worker", &PatchParams::default(), &Patch::Merge(over))
        .await
        .unwrap_err()
        .to_string();
    support::assert_says(
        &e,
        &["machineCount must be greater than or equal to updatedMachineCount"],
    );
    // OpenShift's verdicts, case for case: the observed generation (3 now) moves back only to
    // zero, and no more nodes are ready than available.
    let synchronizer = |available: i64, generation: i64| {
        json!({"status": {"poolSynchronizersStatus": [{
            "poolSynchronizerType": "PinnedImageSets", "machineCount": 3, "updatedMachineCount": 2,
            "readyMachineCount": 2, "availableMachineCount": available, "unavailableMachineCount": 1,
            "observedGeneration": generation
        }]}})
    };
    let write = |status: serde_json::Value| {
        let pools = pools.clone();
        async move {
            pools
                .patch_status("worker", &PatchParams::default(), &Patch::Merge(status))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    let e = write(synchronizer(2, 2)).await.unwrap_err();
    support::assert_says(
        &e,
        &["observedGeneration must not move backwards except to zero"],
    );
    let e = write(synchronizer(1, 3)).await.unwrap_err();
    support::assert_says(
        &e,
        &["availableMachineCount must be greater than or equal to readyMachineCount"],
    );
    write(synchronizer(2, 0)).await.expect("back to zero");
    write(synchronizer(2, 1)).await.expect("on from zero");
    let e = write(synchronizer(-1, 1)).await.unwrap_err();
    support::assert_says(&e, &["availableMachineCount: Invalid value"]);
}

/// A pool names its sets as OpenShift does (DNS subdomains only), and a MachineConfigNode named
/// unlike its node is refused, saying why.
#[tokio::test]
async fn set_names_and_node_names_follow_openshifts_rules() {
    let Some((c, pools)) = cluster_with_openshifts_pool().await else {
        return;
    };
    for (name, ok) in [
        ("release-4.17.3", true),
        ("Release_4", false),
        ("-a", false),
    ] {
        let spec = json!({"spec": {"pinnedImageSets": [{"name": name}]}});
        let got = pools
            .patch("worker", &PatchParams::default(), &Patch::Merge(spec))
            .await;
        assert_eq!(got.is_ok(), ok, "{name}: {got:?}");
        if let Err(e) = got {
            assert!(
                e.to_string().contains("spec.pinnedImageSets[0].name"),
                "{e}"
            );
        }
    }

    let nodes = raw(&c.client, "MachineConfigNode", "machineconfignodes");
    let wrong: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigNode",
        "metadata": {"name": "worker-1"},
        "spec": {"node": {"name": "worker-2"}, "pool": {"name": "worker"}}
    }))
    .unwrap();
    let e = nodes
        .create(&PostParams::default(), &wrong)
        .await
        .unwrap_err()
        .to_string();
    support::assert_says(&e, &["metadata.name must equal spec.node.name"]);
}

/// A node's MachineConfigNode is owned by its Node once the agent knows the Node's uid (the
/// garbage collector then deletes it with the Node, as OpenShift's): the owner reference stays
/// through the controller's grants and the agent's status, and follows the Node when it is
/// created again under the same name (a new uid).
#[tokio::test]
async fn a_machine_config_node_is_owned_by_its_node_through_every_writer() {
    let Some(c) = cluster().await else {
        return;
    };
    use pinset_k8s::{agent, apply, controller};
    let (first, second) = (
        "3f1c2a4e-0000-4000-8000-000000000001",
        "3f1c2a4e-0000-4000-8000-000000000002",
    );
    let spec = json!({"node": {"name": "n0"}, "pool": {"name": "worker"}});
    let owners = |uid: &str| vec![apply::node_owner("n0", uid)];
    let agent_spec = |owners: Vec<serde_json::Value>| {
        let (nodes, spec) = (c.nodes.clone(), spec.clone());
        async move { apply::node_spec(&nodes, "n0", agent::FIELD_MANAGER, spec, &owners).await }
    };
    let owned_by = || async {
        let mcn = c.nodes.get("n0").await.unwrap();
        let refs = mcn.metadata.owner_references.unwrap_or_default();
        refs.iter()
            .map(|r| format!("{}/{} {} {}", r.api_version, r.kind, r.name, r.uid))
            .collect::<Vec<_>>()
    };
    agent_spec(owners(first)).await.unwrap();
    assert_eq!(owned_by().await, [format!("v1/Node n0 {first}")]);
    let grant = json!({"rolloutGrant": {"sets": [{"name": "apps", "generation": 1}]}});
    apply::node_part(&c.nodes, "n0", controller::FIELD_MANAGER, "spec", grant)
        .await
        .unwrap();
    let status = json!({"pinnedImageSets": [{"name": "apps", "desiredGeneration": 1}]});
    apply::node_part(&c.nodes, "n0", agent::FIELD_MANAGER, "status", status)
        .await
        .unwrap();
    assert_eq!(
        owned_by().await,
        [format!("v1/Node n0 {first}")],
        "a grant and a status keep the owner"
    );
    agent_spec(owners(second)).await.unwrap();
    assert_eq!(
        owned_by().await,
        [format!("v1/Node n0 {second}")],
        "the Node created again owns it, the one deleted no longer"
    );
    let mcn = c.nodes.get("n0").await.unwrap();
    assert_eq!(granted(&c.nodes, "n0").await, Some(1), "{mcn:?}");
}
