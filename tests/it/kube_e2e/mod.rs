//! pinset in a cluster, end to end: a real API server (apiextensions-apiserver + etcd) under the
//! RBAC of `deploy/`, `pinset controller` and `pinset agent` processes (each agent with
//! `--node-file` and its own real containerd), images and policy modules pushed to a real
//! registry. This file holds the fixtures every scenario shares — the cluster ([`Cluster`]: its
//! registry, API server, identities and scratch directory; [`Cluster::agent`],
//! [`Cluster::controller`]), the objects' builders ([`pool`], [`set`], [`roles`]), what the tests
//! read back ([`node_state`], [`pool_counts`], [`rollout_of`], [`policy_of`], [`look`]), the
//! policy releases ([`Releases`]) and [`eventually`] — and one file per
//! subject holds its scenarios:
//!
//! - `pinning`: sets pulled, pinned and reported by two nodes in three pools (creation, a new
//!   generation, deletion, a failing image, Events, metrics, SIGTERM); an agent killed mid-run;
//!   an API server outage;
//! - `image`: the container image `scripts/image.sh` builds, run under containerd, its agent
//!   pinning a set;
//! - `fleet` (on [`FleetBed`], three worker nodes and the controller): a paused pool, the canary
//!   and one node at a time through a controller restart, a failed canary held, hostile fleet
//!   modules replaced by the default;
//! - `policy_rollout` (on [`FleetBed`] too): a pool counted by the policy digest written, a
//!   module the canary refuses holding the pool, a good one rolled out canary-first, a policy
//!   change waiting for a pull, `rollout status` following a set change; on one node
//!   ([`PolicyNode`]): refusals before any node, the module cache, the manual's recipe run as
//!   written;
//! - `trust`: a rule missing from the manifests, a registry away and a key removed, a registry
//!   that misbehaves on purpose.

mod fleet;
mod fleet_bed;
mod image;
mod node_api;
mod pinning;
mod policy_rollout;
mod trust;

use crate::support::{self, node_file, roles};
use fleet_bed::FleetBed;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use pinset_k8s::api::{
    CONDITION_DEGRADED, CONDITION_PROGRESSING, MachineConfigNode, MachineConfigPool, PinnedImageSet,
};
use pinset_k8s::condition;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `pinset` process, its log kept in a file; killed when dropped.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn start(args: &[String], log: PathBuf) -> Proc {
        let mut command = Command::new(support::PINSET);
        command.args(args).env(
            "PINSET_LOG",
            std::env::var("PINSET_TEST_LOG").unwrap_or_else(|_| "info".into()),
        );
        Proc::spawn(command, log)
    }

    /// `command` with its stdout discarded and its stderr in `log`.
    fn spawn(mut command: Command, log: PathBuf) -> Proc {
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        Proc { child, log }
    }

    fn log(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        let keep: usize = std::env::var("PINSET_TEST_LOG_LINES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(40);
        lines[lines.len().saturating_sub(keep)..].join("\n")
    }

    /// SIGTERM, then the time the process took to exit.
    fn terminate(&mut self) -> Duration {
        let started = Instant::now();
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "exit status {status}: {}", self.log());
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        support::reap(&mut self.child);
    }
}

/// Poll `check` every 150 ms until it returns `Ok`, or fail after 90 s with `what`, its last
/// `Err` and the logs.
async fn eventually<T, F, Fut>(what: &str, logs: &dyn Fn() -> String, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let (within, every) = (Duration::from_secs(90), Duration::from_millis(150));
    support::poll_until(what, within, every, logs, check).await
}

/// Run `check` (which asserts) `looks` times, 100 ms apart: what must stay true for a while — a
/// pause kept, a hold standing — is watched for that long, not awaited.
async fn throughout<F, Fut>(looks: u32, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..looks {
        check().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pool_sets(p: &MachineConfigPool) -> Vec<String> {
    p.spec
        .pinned_image_sets
        .iter()
        .flatten()
        .map(|s| s.name.clone())
        .collect()
}

/// (machineCount, updatedMachineCount, Degraded status and message) of a pool.
fn pool_counts(p: &MachineConfigPool) -> Option<(i64, i64, String, String)> {
    let st = p.status.as_ref()?;
    let sync = st
        .pool_synchronizers_status
        .iter()
        .find(|s| s.pool_synchronizer_type == "PinnedImageSets")?;
    let degraded = condition::find(&st.conditions, CONDITION_DEGRADED)?;
    Some((
        sync.machine_count,
        sync.updated_machine_count,
        degraded.status.clone(),
        degraded.message.clone(),
    ))
}

/// Per set (name, desired, current generation), and the Progressing and Degraded statuses.
type NodeState = (Vec<(String, i64, Option<i64>)>, String, String);

/// The state of a node done with `sets` (name, generation): each at its generation, neither
/// progressing nor degraded.
fn settled(sets: &[(&str, i64)]) -> NodeState {
    let sets = sets
        .iter()
        .map(|&(name, generation)| (name.to_string(), generation, Some(generation)))
        .collect();
    (sets, "False".into(), "False".into())
}

/// Wait until node `name` reports exactly `sets` (name, generation) pinned, neither Degraded nor
/// Progressing; else fail with `what` and the logs.
async fn node_settles(
    nodes: &Api<MachineConfigNode>,
    name: &str,
    sets: &[(&str, i64)],
    what: &str,
    logs: &dyn Fn() -> String,
) {
    let want = settled(sets);
    eventually(what, logs, || async {
        let n = nodes.get_opt(name).await.map_err(|e| e.to_string())?;
        let state = node_state(&n.ok_or("no node report yet")?);
        (state == want).then_some(()).ok_or(format!("{state:?}"))
    })
    .await;
}

fn node_state(n: &MachineConfigNode) -> NodeState {
    let st = n.status.clone().unwrap_or_default();
    let cond = |t: &str| {
        let c = condition::find(&st.conditions, t);
        c.map(|c| c.status.clone()).unwrap_or_default()
    };
    (
        st.pinned_image_sets
            .iter()
            .map(|s| (s.name.clone(), s.desired_generation, s.current_generation))
            .collect(),
        cond(CONDITION_PROGRESSING),
        cond(CONDITION_DEGRADED),
    )
}

async fn metrics(port: u16) -> String {
    get(port, "/metrics").await
}

/// The whole HTTP response (status line, headers, body) to `GET path`.
async fn get(port: u16, path: &str) -> String {
    try_get(port, path).await.unwrap()
}

async fn try_get(port: u16, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = |e: std::io::Error| format!("GET 127.0.0.1:{port}{path}: {e}");
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(e)?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await
        .map_err(e)?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.map_err(e)?;
    Ok(out)
}

/// The registry and the API server with pinset's CRDs, a client (the test's own, in
/// `system:masters`) and a scratch directory. The server authorizes every other client with the
/// RBAC rendered from `deploy/` (`authorizer`): the controller, the agents and the rollout CLI
/// run as their own identities — the components' service accounts, and an operator bound to the
/// `pinset-rollout` ClusterRole — so a rule missing from the manifests fails the test with 403.
struct Cluster {
    registry: support::Registry,
    server: support::apiserver::ApiServer,
    client: kube::Client,
    dir: tempfile::TempDir,
    authorizer: support::rbac::Authorizer,
    controller_kc: std::path::PathBuf,
    agent_kc: std::path::PathBuf,
    operator_kc: std::path::PathBuf,
}

/// The operator the tests run `pinset rollout` as.
const OPERATOR: &str = "alice";

/// Every test ends with what the manifests' RBAC refused: nothing, or the test fails (the one
/// test that removes a rule clears the authorizer's record once it has seen the refusal).
impl Drop for Cluster {
    fn drop(&mut self) {
        self.record_rule_usage();
        let refused = self.refused();
        if !refused.is_empty() && !std::thread::panicking() {
            panic!("requests refused by the manifests' RBAC: {refused:?}");
        }
    }
}

impl Cluster {
    async fn start() -> Option<Cluster> {
        let registry = support::Registry::start()?;
        let Some(rbac) = support::rbac::Rbac::render(&support::workspace().join("deploy")) else {
            support::skip_or_fail("kubectl is not installed: the manifests cannot be rendered");
            return None;
        };
        let rbac = rbac.with_binding("pinset-rollout", OPERATOR);
        let authorizer = support::rbac::Authorizer::start(rbac);
        let server = support::apiserver::ApiServer::start_authorized(&authorizer).await?;
        server.install_crds().await;
        server.install_events().await;
        let client = server.client().await;
        let dir = tempfile::tempdir().unwrap();
        let account = |name: &str| {
            server.kubeconfig_as(
                &format!("system:serviceaccount:pinset:{name}"),
                &[
                    "system:serviceaccounts",
                    "system:serviceaccounts:pinset",
                    "system:authenticated",
                ],
            )
        };
        let (controller_kc, agent_kc) = (account("pinset-controller"), account("pinset-agent"));
        let operator_kc = server.kubeconfig_as(OPERATOR, &["system:authenticated"]);
        Some(Cluster {
            registry,
            server,
            client,
            dir,
            authorizer,
            controller_kc,
            agent_kc,
            operator_kc,
        })
    }

    /// Append which rule allowed which request to `$PINSET_RBAC_USAGE` (JSON lines), when set:
    /// the rule table of docs/RBAC.md is made from a run of this suite.
    fn record_rule_usage(&self) {
        let Some(path) = std::env::var_os("PINSET_RBAC_USAGE") else {
            return;
        };
        let mut lines = String::new();
        for d in self.authorizer.decisions() {
            if let Some(rule) = &d.allowed_by {
                let line =
                    json!({"role": rule.role, "rule": rule.index, "request": d.request.describe()});
                lines.push_str(&format!("{line}\n"));
            }
        }
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        file.write_all(lines.as_bytes()).unwrap();
    }

    /// The requests the authorizer refused (none, when the manifests grant what pinset needs).
    fn refused(&self) -> Vec<String> {
        self.authorizer
            .unexpected_refusals()
            .iter()
            .map(|d| d.request.describe())
            .collect()
    }

    /// A [`Cluster`] and one containerd able to pull from its registry; `None` where the bed
    /// may be skipped and is not there.
    async fn with_runtime() -> Option<(Cluster, support::Containerd)> {
        let cluster = Cluster::start().await?;
        let runtime = support::Containerd::start(&cluster.registry.host)?;
        Some((cluster, runtime))
    }

    /// `n` containerds of their own, each able to pull from the cluster's registry.
    fn runtimes(&self, n: usize) -> Option<Vec<support::Containerd>> {
        (0..n)
            .map(|_| support::Containerd::start(&self.registry.host))
            .collect()
    }

    /// `pinset controller` as its service account, serving metrics on `port`, logging to `log`
    /// in the scratch directory, with `extra` flags.
    fn controller(&self, port: u16, log: &str, extra: &[String]) -> Proc {
        let mut args = vec![
            "controller".into(),
            format!("--kubeconfig={}", self.controller_kc.display()),
            format!("--metrics-addr=127.0.0.1:{port}"),
        ];
        args.extend_from_slice(extra);
        Proc::start(&args, self.dir.path().join(log))
    }

    /// `pinset agent` for node `name` (facts from a node file with `labels`), on `runtime`,
    /// serving metrics on `port`, logging to `log` in the scratch directory, with `extra` flags.
    fn agent(
        &self,
        name: &str,
        labels: &[(String, String)],
        runtime: &support::Containerd,
        port: u16,
        log: &str,
        extra: &[String],
    ) -> Proc {
        let node = node_file(self.dir.path(), name, labels);
        let mut args = vec![
            "agent".into(),
            format!("--kubeconfig={}", self.agent_kc.display()),
            format!("--metrics-addr=127.0.0.1:{port}"),
            format!("--node-name={name}"),
            format!("--node-file={}", node.display()),
            format!("--cri={}", runtime.endpoint()),
            "--pin=containerd".into(),
            format!("--insecure-registry={}", self.registry.host),
            "--retry-seconds=1".into(),
        ];
        args.extend_from_slice(extra);
        Proc::start(&args, self.dir.path().join(log))
    }
}

fn cri(runtime: &support::Containerd) -> pinset_node::cri::client::CriClient {
    pinset_node::cri::client::CriClient::new(pinset_node::cri::client::CriConfig {
        endpoint: runtime.endpoint(),
        ..Default::default()
    })
    .unwrap()
}

/// What [`release_bed`] starts: the cluster, its containerd, the release set's images, the
/// MachineConfigNode API and the containerd's CRI as the test asks it.
type ReleaseBed = (
    Cluster,
    support::Containerd,
    Vec<String>,
    Api<MachineConfigNode>,
    pinset_node::cri::client::CriClient,
);

/// A [`Cluster`] and one containerd, with the master pool and one set `release` of `count`
/// images of 1 MiB pushed to the bed's registry (a control-plane node pulls one at a time with
/// a 1 s pause: about a second per image); `None` as [`Cluster::with_runtime`].
async fn release_bed(prefix: &str, count: usize, seed: u64) -> Option<ReleaseBed> {
    let (cluster, runtime) = Cluster::with_runtime().await?;
    let refs = support::push_images(&cluster.registry, prefix, count, 1 << 20, seed).await;
    cluster.create_pool("master", &["master"]).await;
    cluster.create_set("release", "master", &refs).await;
    let (nodes, cri) = (Api::all(cluster.client.clone()), cri(&runtime));
    Some((cluster, runtime, refs, nodes, cri))
}

impl Cluster {
    /// Create pool `name` of the nodes labelled `node-role.kubernetes.io/NAME`, taking the sets
    /// of `set_roles`.
    async fn create_pool(&self, name: &str, set_roles: &[&str]) {
        support::create_pool(&self.client, name, set_roles).await
    }

    /// Create set `name` of `images` for the nodes of `role`.
    async fn create_set(&self, name: &str, role: &str, images: &[String]) {
        support::create_set(&self.client, name, role, images).await
    }

    /// The note of the Event of `reason` regarding the object `name`, once recorded.
    async fn event_note(&self, name: &str, reason: &str) -> String {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(self.client.clone());
        let what = format!("an Event {reason} about {name}");
        eventually(&what, &|| self.server.log(), || async {
            let list = events.list(&Default::default()).await;
            let list = list.map_err(|e| e.to_string())?;
            let about = |e: &&k8s_openapi::api::events::v1::Event| {
                let regarding = e.regarding.as_ref().and_then(|r| r.name.as_deref());
                regarding == Some(name) && e.reason.as_deref() == Some(reason)
            };
            let found = list.items.iter().find(about).and_then(|e| e.note.clone());
            found.ok_or(format!("{} Events", list.items.len()))
        })
        .await
    }
}

impl Cluster {
    /// The agent of node cp-0 (the master pool of [`release_bed`]) on `runtime`, free to pull
    /// without a grant, serving metrics on `port` and logging to `log`.
    fn release_agent(&self, runtime: &support::Containerd, port: u16, log: &str) -> Proc {
        let free = ["--rollout=free".into()];
        self.agent("cp-0", &roles(&["master"]), runtime, port, log, &free)
    }

    /// `agent`'s log and the API server's: what a failed wait shows.
    fn logs_with(&self, agent: &Proc) -> String {
        format!("{}\n{}", agent.log(), self.server.log())
    }
}

/// `pinset rollout status worker --watch=false` with `extra` flags as `kubeconfig`, off the
/// async runtime: its exit code, stdout and stderr.
async fn worker_status_now(kubeconfig: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args: Vec<String> = ["rollout", "status", "worker", "--watch=false"]
        .iter()
        .chain(extra)
        .map(|a| a.to_string())
        .collect();
    args.extend(["--kubeconfig".to_string(), kubeconfig.to_string()]);
    support::pinset_blocking(args).await
}

/// Images of `refs` containerd has, and how many of them it reports pinned.
async fn present_and_pinned(
    cri: &pinset_node::cri::client::CriClient,
    refs: &[String],
) -> (usize, usize) {
    let (mut present, mut pinned) = (0, 0);
    for r in refs {
        if let Some(image) = cri.image_status(r).await.unwrap() {
            present += 1;
            pinned += usize::from(image.pinned);
        }
    }
    (present, pinned)
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// One look at the fleet: per node (name) whether it holds a grant for `set` at `generation`,
/// whether it pinned that generation, and how many of `images` its containerd holds.
#[derive(Debug)]
struct FleetLook {
    granted: Vec<bool>,
    done: Vec<bool>,
    present: Vec<usize>,
}

const FLEET_NODES: [&str; 3] = ["w-0", "w-1", "w-2"];

/// containerd first, then the MachineConfigNodes: a grant precedes any pull, so a node seen
/// without a grant after its images were counted had none when they were.
async fn look(
    nodes: &Api<MachineConfigNode>,
    cris: &[pinset_node::cri::client::CriClient],
    set_name: &str,
    generation: i64,
    images: &[String],
) -> FleetLook {
    let mut present = Vec::new();
    for cri in cris {
        present.push(present_and_pinned(cri, images).await.0);
    }
    let list = nodes.list(&Default::default()).await.unwrap();
    let find = |name: &str| {
        list.items
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    };
    let granted = FLEET_NODES
        .iter()
        .map(|name| {
            find(name)
                .and_then(|n| n.spec.rollout_grant.clone())
                .is_some_and(|g| {
                    g.sets
                        .iter()
                        .any(|s| s.name == set_name && s.generation >= generation)
                })
        })
        .collect();
    let done = FLEET_NODES
        .iter()
        .map(|name| {
            find(name).is_some_and(|n| {
                node_state(n)
                    .0
                    .iter()
                    .any(|s| s.0 == set_name && s.2 == Some(generation))
            })
        })
        .collect();
    FleetLook {
        granted,
        done,
        present,
    }
}

/// The controller's grant writes and waves, once it has counted at least `at_least` of each.
async fn grants_and_waves(port: u16, at_least: u64) -> (u64, u64) {
    let what = format!("{at_least} grant(s) and wave(s) counted");
    support::wait_for(&what, Duration::from_secs(10), || async {
        let m = metrics(port).await;
        let g = metric(&m, "pinset_api_writes_total{kind=\"node_grant\"}");
        let w = metric(&m, "pinset_rollout_waves_total{pool=\"worker\"}");
        (g >= at_least && w >= at_least).then_some((g, w)).ok_or(m)
    })
    .await
}

/// The pool's rollout status and its Degraded and PolicyFallback conditions.
fn rollout_of(p: &MachineConfigPool) -> (Option<pinset_k8s::api::PoolRollout>, String, String) {
    let st = p.status.clone().unwrap_or_default();
    let cond = |t: &str| {
        let message = condition::true_message(&st.conditions, t);
        message.unwrap_or_default().to_string()
    };
    (
        st.rollout.clone(),
        cond(CONDITION_DEGRADED),
        cond(pinset_k8s::api::CONDITION_POLICY_FALLBACK),
    )
}

/// Node policy modules pushed for a policy rollout (references without `oci://`): v1 the
/// default, v2 the hostile module (it traps in `order` on nodes labelled so), v3 the
/// unthrottled one — each signed — and the floor module, unsigned. (A module is trusted by its
/// digest: v3's bytes pushed unsigned elsewhere would be the signed v3.)
#[derive(Clone)]
struct Releases {
    v1: String,
    v2: String,
    v3: String,
    unsigned: String,
    public_key: String,
    /// The registry they were pushed to, and the directory agents' configurations go to.
    registry: String,
    dir: PathBuf,
}

impl Releases {
    fn push(cluster: &Cluster, dir: &Path) -> Releases {
        let host = cluster.registry.host.clone();
        let (key, public_key) = support::keygen_empty(&dir.join("cosign"));
        let push = |stem: &str, repo: &str, sign: bool| {
            let file = support::policy_path(stem);
            let pushed = support::push_policy(&host, &file, &format!("policies/{repo}:e2e"));
            if sign {
                support::sign_policy(&host, &pushed, &key);
            }
            pushed
        };
        Releases {
            v1: push("pinset_policy_default", "worker", true),
            v2: push("pinset_test_policy_hostile", "worker-v2", true),
            v3: push("pinset_test_policy_unthrottled", "worker-v3", true),
            unsigned: push("pinset_test_policy_floor", "worker-unsigned", false),
            public_key,
            registry: host.clone(),
            dir: dir.to_path_buf(),
        }
    }

    /// An agent's flags: a policy configuration naming `module` for `pool`, signatures
    /// required, and a cache of its own.
    fn agent_args(&self, pool: &str, module: &str, node: &str) -> Vec<String> {
        let config = self.dir.join(format!("{node}-policies.yaml"));
        let yaml = format!(
            "verify:\n  keys: [{:?}]\npools:\n  {pool}:\n    module: oci://{module}\n",
            self.public_key
        );
        std::fs::write(&config, yaml).unwrap();
        vec![
            format!("--policy-config={}", config.display()),
            format!("--policy-insecure-registry={}", self.registry),
            format!(
                "--policy-cache={}",
                self.dir.join(format!("{node}-cache")).display()
            ),
        ]
    }

    /// The PolicyConfiguration naming `module` for pool worker, and `fleet` as every pool's
    /// fleet policy when given; signatures required.
    async fn configure(&self, client: &kube::Client, module: &str, fleet: Option<&str>) -> Instant {
        let mut spec = json!({
            "verify": {"keys": [self.public_key]},
            "pools": {"worker": {"module": format!("oci://{module}")}}
        });
        if let Some(fleet) = fleet {
            spec["fleet"] = json!({"module": {"module": format!("oci://{fleet}")}});
        }
        support::apiserver::configure_policies(client, "e2e", spec)
            .await
            .expect("the policy configuration");
        Instant::now()
    }
}

/// One worker node, `w-0`, and the controller, both following the PolicyConfiguration
/// `cluster` (v1 of [`Releases`] configured for the worker pool, signatures required), the agent
/// on a containerd of its own with a module cache; the node runs v1.
struct PolicyNode {
    controller: Proc,
    agent: Proc,
    agent_port: u16,
    releases: Releases,
    nodes: Api<MachineConfigNode>,
    runtime: support::Containerd,
    cluster: Cluster,
}

impl PolicyNode {
    const NAME: &str = "w-0";

    /// Started, logging to files named after `log`, once the node runs v1.
    async fn start(log: &str) -> Option<PolicyNode> {
        let (cluster, runtime) = Cluster::with_runtime().await?;
        let client = cluster.client.clone();
        let releases = Releases::push(&cluster, cluster.dir.path());
        releases.configure(&client, &releases.v1, None).await;
        cluster.create_pool("worker", &["worker"]).await;
        let follow = [
            "--policy-configuration=cluster".to_string(),
            format!("--policy-insecure-registry={}", cluster.registry.host),
        ];
        let port = support::free_port();
        let controller = cluster.controller(port, &format!("{log}-controller.log"), &follow);
        let agent_port = support::free_port();
        let agent = Self::agent(&cluster, &runtime, agent_port, &format!("{log}-agent.log"));
        let node = PolicyNode {
            controller,
            agent,
            agent_port,
            nodes: Api::all(client),
            releases,
            runtime,
            cluster,
        };
        node.runs(&node.releases.v1).await;
        Some(node)
    }

    fn agent(cluster: &Cluster, runtime: &support::Containerd, port: u16, log: &str) -> Proc {
        let cache = cluster.dir.path().join("w-0-cache");
        let args = [
            "--policy-configuration=cluster".to_string(),
            format!("--policy-insecure-registry={}", cluster.registry.host),
            format!("--policy-cache={}", cache.display()),
        ];
        cluster.agent(Self::NAME, &roles(&["worker"]), runtime, port, log, &args)
    }

    /// The agent stopped (SIGTERM) and started again on the same port and cache, logging to `log`.
    fn restart_agent(&mut self, log: &str) {
        self.agent.terminate();
        self.agent = Self::agent(&self.cluster, &self.runtime, self.agent_port, log);
    }

    fn logs(&self) -> String {
        let (controller, agent) = (self.controller.log(), self.agent.log());
        format!("--- controller ---\n{controller}\n--- agent ---\n{agent}")
    }

    /// Wait until the node says it runs `module` (a reference of [`Releases`]).
    async fn runs(&self, module: &str) {
        let want = format!("oci://{module}");
        let runs = |(running, ..): &NodePolicy| running.as_deref() == Some(want.as_str());
        self.policy_becomes(&format!("the node runs {want}"), runs)
            .await;
    }

    /// Wait until what the node says of its policy ([`policy_of`]) is as `wanted` says.
    async fn policy_becomes(&self, what: &str, wanted: impl Fn(&NodePolicy) -> bool) {
        eventually(what, &|| self.logs(), || async {
            let said = policy_of(&self.nodes, Self::NAME).await?;
            wanted(&said).then_some(()).ok_or(format!("{said:?}"))
        })
        .await;
    }
}

/// What a node says of its policy, as [`policy_of`] reads it.
type NodePolicy = (Option<String>, Option<String>, (String, String));

/// The node policy of node `name`: the module it runs, the reason of the refusal it reports (if
/// any), and its PolicyFallback condition's (status, reason).
async fn policy_of(nodes: &Api<MachineConfigNode>, name: &str) -> Result<NodePolicy, String> {
    let st = nodes
        .get(name)
        .await
        .map_err(|e| e.to_string())?
        .status
        .unwrap_or_default();
    let fallback = condition::find(&st.conditions, pinset_k8s::api::CONDITION_POLICY_FALLBACK)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default();
    Ok((
        st.policy.map(|p| p.module),
        st.policy_rejected.map(|r| r.reason),
        fallback,
    ))
}

/// The peak memory of a running process (`VmHWM`, KiB).
fn peak_kib(p: &Proc) -> u64 {
    support::procfs::status_kib(p.child.id(), "VmHWM:")
}
