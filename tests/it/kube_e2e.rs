//! pinset in a cluster, end to end: a real API server (apiextensions-apiserver + etcd), the
//! `pinset controller` and two `pinset agent` processes (a control-plane node and a node of a
//! custom `infra` pool, each with `--node-file` and its own real containerd), images pushed to a
//! real registry. Asserts pool specs and status, MachineConfigNode status and conditions, and
//! what containerd reports, after creation, a set update (generation 2), a set deletion, a
//! failing image, and SIGTERM. The container image `scripts/image.sh` builds runs under the
//! bed's containerd (runc), and the agent inside it pins a set.

use crate::support;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use pinset_k8s::api::{
    CONDITION_DEGRADED, CONDITION_PROGRESSING, MachineConfigNode, MachineConfigPool, PinnedImageSet,
};
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
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `check` until it returns `Some`, or fail with `what` and the logs.
async fn eventually<T, F, Fut>(what: &str, logs: &dyn Fn() -> String, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("{what}: not reached in 90 s; last: {last}\n{}", logs())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(150)).await,
        }
    }
}

fn pool(name: &str, roles: &[&str], node_label: &str) -> MachineConfigPool {
    serde_json::from_value(json!({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfigPool",
        "metadata": {"name": name},
        "spec": {
            "machineConfigSelector": {"matchExpressions": [
                {"key": "machineconfiguration.openshift.io/role", "operator": "In", "values": roles}
            ]},
            "nodeSelector": {"matchLabels": {node_label: ""}}
        }
    }))
    .unwrap()
}

fn set(name: &str, role: &str, images: &[String]) -> PinnedImageSet {
    serde_json::from_value(json!({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "PinnedImageSet",
        "metadata": {"name": name, "labels": {"machineconfiguration.openshift.io/role": role}},
        "spec": {"pinnedImages": images.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}
    }))
    .unwrap()
}

/// The labels of a node with these roles.
fn roles(roles: &[&str]) -> Vec<(String, String)> {
    roles
        .iter()
        .map(|r| (format!("node-role.kubernetes.io/{r}"), String::new()))
        .collect()
}

fn node_file(dir: &Path, name: &str, labels: &[(String, String)]) -> PathBuf {
    let labels: String = labels
        .iter()
        .map(|(k, v)| format!("    {k}: \"{v}\"\n"))
        .collect();
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n{labels}status:\n  allocatable: {{ephemeral-storage: 100Gi}}\n  conditions:\n    - {{type: Ready, status: \"True\"}}\n    - {{type: DiskPressure, status: \"False\"}}\n"
        ),
    )
    .unwrap();
    path
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
    let degraded = st
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_DEGRADED)?;
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

fn node_state(n: &MachineConfigNode) -> NodeState {
    let st = n.status.clone().unwrap_or_default();
    let cond = |t: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.status.clone())
            .unwrap_or_default()
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

/// Policy modules pushed to the cluster's registry: the hostile test module signed, the default
/// unsigned; the public key agents require.
struct ShippedPolicies {
    signed: String,
    unsigned: String,
    public_key: String,
    registry: String,
    dir: std::path::PathBuf,
}

impl ShippedPolicies {
    fn push(cluster: &Cluster, dir: &std::path::Path) -> ShippedPolicies {
        let host = cluster.registry.host.clone();
        let run = |args: &[&str]| {
            let (code, out, err) = support::pinset(args);
            assert_eq!(code, 0, "pinset {args:?}: {err}");
            out.trim().to_string()
        };
        let push = |stem: &str, tag: &str| {
            let file = support::policy_path(stem);
            let target = format!("{host}/policies/{tag}");
            run(&[
                "policy",
                "push",
                file.to_str().unwrap(),
                &target,
                "--insecure-registry",
                &host,
            ])
        };
        let signed = push("pinset_test_policy_hostile", "hostile:e2e");
        let unsigned = push("pinset_policy_default", "default:e2e");
        let prefix = dir.join("cosign");
        run(&[
            "policy",
            "keygen",
            "--output-key-prefix",
            prefix.to_str().unwrap(),
            "--allow-empty-password",
        ]);
        let key = prefix.with_extension("key");
        run(&[
            "policy",
            "sign",
            &signed,
            "--key",
            key.to_str().unwrap(),
            "--insecure-registry",
            &host,
        ]);
        let public_key = std::fs::read_to_string(prefix.with_extension("pub")).unwrap();
        ShippedPolicies {
            signed,
            unsigned,
            public_key,
            registry: host,
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
}

fn cri(runtime: &support::Containerd) -> pinset_node::cri::client::CriClient {
    pinset_node::cri::client::CriClient::new(pinset_node::cri::client::CriConfig {
        endpoint: runtime.endpoint(),
        ..Default::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_and_agents_pin_sets_and_report_through_a_real_api_server() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let Some(cp_runtime) = support::Containerd::start(&cluster.registry.host) else {
        return;
    };
    let Some(infra_runtime) = support::Containerd::start(&cluster.registry.host) else {
        return;
    };
    let (registry, server, client) = (&cluster.registry, &cluster.server, cluster.client.clone());
    let dir = &cluster.dir;
    let kubeconfig = cluster.controller_kc.to_str().unwrap().to_string();

    let master_imgs = support::push_images(registry, "m", 2, 150_000, 100).await;
    let worker_imgs = support::push_images(registry, "w", 3, 150_000, 200).await;
    let infra_imgs = support::push_images(registry, "i", 2, 150_000, 300).await;

    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    let nodes: Api<MachineConfigNode> = Api::all(client.clone());
    let pp = PostParams::default();
    pools
        .create(
            &pp,
            &pool("master", &["master"], "node-role.kubernetes.io/master"),
        )
        .await
        .unwrap();
    pools
        .create(
            &pp,
            &pool("worker", &["worker"], "node-role.kubernetes.io/worker"),
        )
        .await
        .unwrap();
    pools
        .create(
            &pp,
            &pool(
                "infra",
                &["worker", "infra"],
                "node-role.kubernetes.io/infra",
            ),
        )
        .await
        .unwrap();
    sets.create(&pp, &set("master-set", "master", &master_imgs))
        .await
        .unwrap();
    sets.create(&pp, &set("worker-set", "worker", &worker_imgs[..2]))
        .await
        .unwrap();
    sets.create(&pp, &set("infra-set", "infra", &infra_imgs))
        .await
        .unwrap();

    let controller_port = support::free_port();
    let controller = Proc::start(
        &[
            "controller".into(),
            format!("--kubeconfig={kubeconfig}"),
            format!("--metrics-addr=127.0.0.1:{controller_port}"),
        ],
        dir.path().join("controller.log"),
    );
    // Policies shipped as the configuration ships them: OCI artifacts by digest, a signature
    // required. infra's module is signed and runs; master's is not and is refused for master
    // only: cp-0 decides with the default and says why.
    let policies = ShippedPolicies::push(&cluster, dir.path());
    let cp_port = support::free_port();
    let mut cp = cluster.agent(
        "cp-0",
        &roles(&["master", "control-plane"]),
        &cp_runtime,
        cp_port,
        "cp-0.log",
        &policies.agent_args("master", &policies.unsigned, "cp-0"),
    );
    // The infra pool runs (from its signed artifact) a policy that writes to stderr in every
    // hook (which crashed the agent's async path while WASI streams entered a runtime of their
    // own) and answers like the default: it passes the smoke test on the node's facts, decides
    // every reconcile, and the node pulls and pins without a fallback. (A module that traps is
    // refused by that test: `a_pool_policy_change_rolls_out_canary_first_and_a_bad_one_is_held`.)
    let mut infra_labels = roles(&["worker", "infra"]);
    infra_labels.push(("pinset.test/hostile".into(), "stderr".into()));
    let infra = cluster.agent(
        "infra-0",
        &infra_labels,
        &infra_runtime,
        support::free_port(),
        "infra-0.log",
        &policies.agent_args("infra", &policies.signed, "infra-0"),
    );
    let logs = || {
        format!(
            "--- controller ---\n{}\n--- cp-0 ---\n{}\n--- infra-0 ---\n{}\n{}",
            controller.log(),
            cp.log(),
            infra.log(),
            server.log()
        )
    };

    // The controller writes each pool's sets, sorted; the custom pool also gets the worker sets.
    for (pool, want) in [
        ("master", vec!["master-set"]),
        ("worker", vec!["worker-set"]),
        ("infra", vec!["infra-set", "worker-set"]),
    ] {
        eventually(&format!("pool {pool} lists {want:?}"), &logs, || async {
            let p = pools.get(pool).await.map_err(|e| e.to_string())?;
            (pool_sets(&p) == want)
                .then_some(())
                .ok_or(format!("{:?}", pool_sets(&p)))
        })
        .await;
    }

    // Each node pulls and pins its pools' sets (each set once) and says so.
    eventually("cp-0 done", &logs, || async {
        let n = nodes.get("cp-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        (state == settled(&[("master-set", 1)]))
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    eventually("infra-0 done", &logs, || async {
        let n = nodes.get("infra-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        let want = settled(&[("infra-set", 1), ("worker-set", 1)]);
        (state == want && n.spec.pool.name == "infra")
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    let infra_mcn = nodes.get("infra-0").await.unwrap();
    let fallback = infra_mcn
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == pinset_k8s::api::CONDITION_POLICY_FALLBACK)
        .cloned()
        .unwrap();
    assert_eq!(fallback.status, "False", "{fallback:?}");
    let cp_fallback = nodes.get("cp-0").await.unwrap().status.unwrap().conditions;
    let refused = cp_fallback
        .iter()
        .find(|c| c.type_ == pinset_k8s::api::CONDITION_POLICY_FALLBACK)
        .unwrap();
    assert_eq!(refused.status, "True", "{refused:?}");
    for said in [
        "pool master",
        policies.unsigned.as_str(),
        "no cosign signature",
        "deciding with embedded:default",
    ] {
        assert!(refused.message.contains(said), "{said:?} in {refused:?}");
    }
    assert!(
        !refused.message.contains("trapped"),
        "the default it decides with never falls back: {refused:?}"
    );
    // Each node says which module it decides with: infra-0 the signed artifact, cp-0 the default.
    let running = |mcn: &MachineConfigNode| mcn.status.as_ref().unwrap().policy.clone().unwrap();
    let infra_policy = running(&infra_mcn);
    assert_eq!(
        (infra_policy.name.as_str(), infra_policy.module.as_str()),
        ("hostile", format!("oci://{}", policies.signed).as_str())
    );
    let hostile_bytes = std::fs::read(support::policy_path("pinset_test_policy_hostile")).unwrap();
    // One name for the module: the digest the configuration names it by; its bytes' digest
    // beside it, named as such.
    let manifest_digest = policies.signed.rsplit_once('@').unwrap().1;
    assert_eq!(infra_policy.digest, manifest_digest);
    assert_eq!(
        infra_policy.module_digest.as_deref(),
        Some(support::sha256(&hostile_bytes).as_str())
    );
    let cp_policy = running(&nodes.get("cp-0").await.unwrap());
    assert_eq!(cp_policy.name, "default");
    assert_eq!(cp_policy.module, pinset_policy::EMBEDDED_DEFAULT_NAME);
    // The pool says it too, naming the node.
    eventually("pool master names the refusal", &logs, || async {
        let p = pools.get("master").await.map_err(|e| e.to_string())?;
        let c = p
            .status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| c.type_ == pinset_k8s::api::CONDITION_POLICY_FALLBACK)
            .ok_or("no PolicyFallback condition")?;
        (c.status == "True"
            && c.reason == "PolicyRefused"
            && c.message.contains("node cp-0")
            && c.message.contains(&policies.unsigned))
        .then_some(())
        .ok_or(format!("{c:?}"))
    })
    .await;
    let progress = infra_mcn.status.unwrap().pinned_image_progress.unwrap();
    assert_eq!((progress.images_done, progress.images_total), (4, 4));
    let (cp_cri, infra_cri) = (cri(&cp_runtime), cri(&infra_runtime));
    for r in &master_imgs {
        assert!(
            cp_cri.image_status(r).await.unwrap().unwrap().pinned,
            "{r} pinned on cp-0"
        );
    }
    for r in worker_imgs[..2].iter().chain(&infra_imgs) {
        assert!(
            infra_cri.image_status(r).await.unwrap().unwrap().pinned,
            "{r} pinned on infra-0"
        );
    }
    assert!(
        infra_cri
            .image_status(&master_imgs[0])
            .await
            .unwrap()
            .is_none(),
        "master images stay off workers"
    );

    // Pool counts: each node counts in its primary pool only.
    for (pool, want) in [("master", (1, 1)), ("infra", (1, 1)), ("worker", (0, 0))] {
        eventually(&format!("pool {pool} counts {want:?}"), &logs, || async {
            let p = pools.get(pool).await.map_err(|e| e.to_string())?;
            match pool_counts(&p) {
                Some((m, u, d, _)) if (m, u) == want && d == "False" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    // Set status: size and pools, for kubectl.
    eventually("worker-set status", &logs, || async {
        let s = sets.get("worker-set").await.map_err(|e| e.to_string())?;
        let st = s.status.unwrap_or_default();
        (st.image_count == 2 && st.pools == vec!["infra", "worker"])
            .then_some(())
            .ok_or(format!("{st:?}"))
    })
    .await;

    // Generation 2 of the worker set adds an image.
    sets.patch(
        "worker-set",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"pinnedImages": worker_imgs.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}})),
    )
    .await
    .unwrap();
    eventually("infra-0 at worker-set generation 2", &logs, || async {
        let n = nodes.get("infra-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        (state == settled(&[("infra-set", 1), ("worker-set", 2)]))
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    assert!(
        infra_cri
            .image_status(&worker_imgs[2])
            .await
            .unwrap()
            .unwrap()
            .pinned
    );

    // Deleting a set: out of the pool, out of the node's status, unpinned but still present.
    sets.delete("infra-set", &DeleteParams::default())
        .await
        .unwrap();
    eventually("infra pool without infra-set", &logs, || async {
        let p = pools.get("infra").await.map_err(|e| e.to_string())?;
        (pool_sets(&p) == vec!["worker-set"])
            .then_some(())
            .ok_or(format!("{:?}", pool_sets(&p)))
    })
    .await;
    eventually(
        "infra-0 without infra-set, its images unpinned",
        &logs,
        || async {
            let n = nodes.get("infra-0").await.map_err(|e| e.to_string())?;
            let names: Vec<String> = node_state(&n).0.into_iter().map(|s| s.0).collect();
            let image = infra_cri
                .image_status(&infra_imgs[0])
                .await
                .map_err(|e| e.to_string())?;
            match image {
                Some(i) if names == vec!["worker-set"] && !i.pinned => Ok(()),
                other => Err(format!("{names:?} {other:?}")),
            }
        },
    )
    .await;

    // An image that does not exist: the node is Degraded naming it; so is its pool.
    let missing = format!("{}/pinset/missing@sha256:{}", registry.host, "0".repeat(64));
    sets.create(
        &pp,
        &set("broken", "master", std::slice::from_ref(&missing)),
    )
    .await
    .unwrap();
    let message = eventually("cp-0 degraded", &logs, || async {
        let n = nodes.get("cp-0").await.map_err(|e| e.to_string())?;
        let st = n.status.unwrap_or_default();
        let d = st
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_DEGRADED)
            .cloned();
        match d {
            Some(c) if c.status == "True" => Ok(c.message),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        message.contains(&missing) && message.contains("broken"),
        "{message}"
    );
    let pool_message = eventually("master pool degraded", &logs, || async {
        let p = pools.get("master").await.map_err(|e| e.to_string())?;
        match pool_counts(&p) {
            Some((1, 0, d, m)) if d == "True" => Ok(m),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        pool_message.contains("node cp-0")
            && pool_message.contains("PinnedImageSet broken")
            && pool_message.contains(&missing),
        "{pool_message}"
    );
    // Events, as `kubectl get events` shows them: sets pinned and failed on the node's
    // MachineConfigNode, cp-0's refusal of its unsigned module, the pool turning Degraded.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let want = [
        ("MachineConfigNode", "cp-0", "SetPinned"),
        ("MachineConfigNode", "cp-0", "SetFailed"),
        ("MachineConfigNode", "cp-0", "PolicyRejected"),
        ("MachineConfigPool", "master", "PoolDegraded"),
    ];
    let seen = eventually("events recorded", &logs, || async {
        let list = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let seen: Vec<(String, String, String, String)> = list
            .items
            .iter()
            .map(|e| {
                let r = e.regarding.clone().unwrap_or_default();
                let note = e.note.clone().unwrap_or_default();
                (
                    r.kind.unwrap_or_default(),
                    r.name.unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    note,
                )
            })
            .collect();
        let all = want.iter().all(|(k, n, r)| {
            seen.iter()
                .any(|(k2, n2, r2, _)| (k2.as_str(), n2.as_str(), r2.as_str()) == (*k, *n, *r))
        });
        all.then_some(seen.clone()).ok_or(format!("{seen:?}"))
    })
    .await;
    let failed = seen.iter().find(|e| e.2 == "SetFailed").unwrap();
    assert!(
        failed.3.contains("broken") && failed.3.contains(&missing),
        "{failed:?}"
    );
    assert_eq!(
        seen.iter()
            .filter(|e| e.1 == "cp-0" && e.2 == "SetPinned" && e.3.contains("master-set"))
            .count(),
        1,
        "a set is announced pinned once, not at every resync: {seen:?}"
    );
    // The set that is fine stays done on that node.
    let cp_sets = node_state(&nodes.get("cp-0").await.unwrap()).0;
    assert!(
        cp_sets.contains(&("master-set".into(), 1, Some(1))),
        "{cp_sets:?}"
    );

    // Metrics of the agent and the controller.
    let m = metrics(cp_port).await;
    assert!(m.contains("pinset_images_pulled_total 2"), "{m}");
    assert!(m.contains("pinset_image_pull_failures_total"), "{m}");
    assert!(m.contains("pinset_policy_call_seconds_bucket"), "{m}");
    for port in [cp_port, controller_port] {
        for path in ["/healthz", "/readyz"] {
            let r = get(port, path).await;
            assert!(r.starts_with("HTTP/1.0 200"), "{path}: {r}");
        }
    }
    let c = metrics(controller_port).await;
    assert!(
        c.contains("pinset_api_writes_total{kind=\"pool_spec\"}"),
        "{c}"
    );
    // The build, the node's sets by state, the last time every set was pinned.
    let build = format!(
        "pinset_build_info{{version=\"{}\",commit=\"",
        env!("CARGO_PKG_VERSION")
    );
    assert!(m.contains(&build) && c.contains(&build), "{build}\n{m}");
    for state in ["pinned", "failed", "pending"] {
        assert!(
            m.contains(&format!("pinset_node_sets{{state=\"{state}\"}}")),
            "{m}"
        );
    }
    let last = metric(&m, "pinset_last_successful_reconcile_timestamp_seconds");
    assert!(
        last > 1_700_000_000,
        "a reconcile pinned every set: {last}\n{m}"
    );

    let refused = cluster.refused();
    assert!(
        refused.is_empty(),
        "refused by RBAC: {refused:?}\n{}",
        logs()
    );
    let asked = cluster.authorizer.decisions();
    for who in ["pinset-controller", "pinset-agent"] {
        let user = format!("system:serviceaccount:pinset:{who}");
        let n = asked.iter().filter(|d| d.request.user == user).count();
        assert!(
            n > 10,
            "{who} was authorized by the manifests' RBAC {n} time(s)"
        );
    }
    // SIGTERM: the agent stops within seconds.
    let took = cp.terminate();
    assert!(took < Duration::from_secs(5), "agent took {took:?} to stop");
    drop(infra);
    drop(controller);
    // Every request of the controller and the agents was allowed by the manifests' RBAC.
    assert_eq!(cluster.refused(), Vec::<String>::new());
}

/// Images of `refs` containerd has, and how many of them it reports pinned.
/// The master pool and one set `release` of `count` images of 1 MiB pushed to the bed's
/// registry (a control-plane node pulls one at a time with a 1 s pause: about a second per
/// image); the images, and the MachineConfigNode API.
async fn release_set(
    cluster: &Cluster,
    prefix: &str,
    count: usize,
    seed: u64,
) -> (Vec<String>, Api<MachineConfigNode>) {
    let client = cluster.client.clone();
    let refs = support::push_images(&cluster.registry, prefix, count, 1 << 20, seed).await;
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    let pp = PostParams::default();
    pools
        .create(
            &pp,
            &pool("master", &["master"], "node-role.kubernetes.io/master"),
        )
        .await
        .unwrap();
    sets.create(&pp, &set("release", "master", &refs))
        .await
        .unwrap();
    (refs, Api::all(client))
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_run_is_finished_by_the_next_one_without_pulling_twice() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let Some(runtime) = support::Containerd::start(&cluster.registry.host) else {
        return;
    };
    let server = &cluster.server;
    let (refs, nodes) = release_set(&cluster, "k", 10, 700).await;
    let cri = cri(&runtime);

    let mut first = cluster.agent(
        "cp-0",
        &roles(&["master"]),
        &runtime,
        support::free_port(),
        "first.log",
        &["--rollout=free".into()],
    );
    let logs = || format!("{}\n{}", first.log(), server.log());
    // Kill it once some images are in and others are not.
    eventually("some images pulled", &logs, || async {
        let (present, _) = present_and_pinned(&cri, &refs).await;
        (2..refs.len())
            .contains(&present)
            .then_some(())
            .ok_or(format!("{present} present"))
    })
    .await;
    unsafe { libc::kill(first.child.id() as i32, libc::SIGKILL) };
    let _ = first.child.wait();
    let (present, pinned) = present_and_pinned(&cri, &refs).await;
    assert!(
        present < refs.len(),
        "killed too late: every image was already pulled"
    );
    assert_eq!(
        pinned, 0,
        "nothing is pinned before the whole set is verified"
    );

    let port = support::free_port();
    let second = cluster.agent(
        "cp-0",
        &roles(&["master"]),
        &runtime,
        port,
        "second.log",
        &["--rollout=free".into()],
    );
    let logs = || format!("{}\n{}", second.log(), server.log());
    eventually("the restarted agent finishes the set", &logs, || async {
        let n = nodes.get("cp-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        (state == settled(&[("release", 1)]))
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    assert_eq!(
        present_and_pinned(&cri, &refs).await,
        (refs.len(), refs.len())
    );
    let m = metrics(port).await;
    assert_eq!(
        metric(&m, "pinset_images_pulled_total"),
        (refs.len() - present) as u64,
        "only the images missing at restart are pulled again\n{m}"
    );
}

/// The API server goes away mid-run: the agent keeps pulling and pins the set without it, and
/// publishes the final status once the server is back (nothing waits for the next resync).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_works_through_an_api_server_outage_and_publishes_when_it_returns() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let Some(runtime) = support::Containerd::start(&cluster.registry.host) else {
        return;
    };
    let server = &cluster.server;
    let (refs, nodes) = release_set(&cluster, "o", 6, 900).await;
    let cri = cri(&runtime);
    let agent = cluster.agent(
        "cp-0",
        &roles(&["master"]),
        &runtime,
        support::free_port(),
        "agent.log",
        &["--rollout=free".into()],
    );
    let logs = || format!("{}\n{}", agent.log(), server.log());
    eventually("the first image pulled", &logs, || async {
        let (present, _) = present_and_pinned(&cri, &refs).await;
        (present >= 1)
            .then_some(())
            .ok_or(format!("{present} present"))
    })
    .await;
    server.stop();
    let (present, _) = present_and_pinned(&cri, &refs).await;
    assert!(present < refs.len(), "stopped too late: {present} present");
    // Without the API server, the agent finishes its work.
    eventually(
        "every image pulled and pinned, API server down",
        &logs,
        || async {
            let state = present_and_pinned(&cri, &refs).await;
            (state == (refs.len(), refs.len()))
                .then_some(())
                .ok_or(format!("{state:?}"))
        },
    )
    .await;
    server.restart().await;
    let started = std::time::Instant::now();
    eventually("the final status published", &logs, || async {
        let n = nodes.get("cp-0").await.map_err(|e| e.to_string())?;
        let state = node_state(&n);
        (state == settled(&[("release", 1)]))
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    // Within the agent's retry interval (1 s here), not its 10-minute resync.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(agent.log().contains("status not published"), "{}", logs());
}

/// The containerd namespace the image tests import pinset's image into (the CRI's is `k8s.io`).
const IMAGE_NAMESPACE: &str = "pinset-image";

/// `target/image/pinset.tar` (scripts/image.sh) imported into `runtime`: the reference it
/// carries, checked against the version and the annotations. `None` (skipped where PINSET_SKIP_BED asks; else the test fails)
/// when the archive was not built.
fn import_image(runtime: &support::Containerd) -> Option<String> {
    let archive = support::workspace().join("target/image/pinset.tar");
    if !archive.exists() {
        support::skip_or_fail(
            "target/image/pinset.tar is missing (bash scripts/image.sh builds it)",
        );
        return None;
    }
    let out = runtime
        .ctr(IMAGE_NAMESPACE)
        .args(["images", "import"])
        .arg(&archive)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "ctr images import: {said}\n{}",
        runtime.log()
    );
    let reference = format!("localhost/pinset:{}", env!("CARGO_PKG_VERSION"));
    let out = runtime
        .ctr(IMAGE_NAMESPACE)
        .args(["images", "ls", "-q"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.lines().any(|l| l == reference),
        "{reference} not imported: {listed}"
    );
    Some(reference)
}

/// A file of the image archive (an OCI layout in a tar), parsed as JSON.
fn archive_json(path: &str) -> serde_json::Value {
    let archive = support::workspace().join("target/image/pinset.tar");
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(&archive)
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{path} in {}", archive.display());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `ctr run` of the image in the foreground (runc), on the host's network, `mounts` bound
/// (source, destination) read-write, as root like the DaemonSet; deleted when dropped.
struct Container<'a> {
    runtime: &'a support::Containerd,
    id: String,
    proc: Proc,
}

impl<'a> Container<'a> {
    fn run(
        runtime: &'a support::Containerd,
        reference: &str,
        mounts: &[(&Path, &str)],
        env: &[&str],
        args: &[String],
        log: PathBuf,
    ) -> Container<'a> {
        let id = format!("pinset-{}-{}", std::process::id(), support::free_port());
        let mut command = runtime.ctr(IMAGE_NAMESPACE);
        command.args(["run", "--rm", "--net-host", "--user", "0:0"]);
        for (source, destination) in mounts {
            command.arg("--mount").arg(format!(
                "type=bind,src={},dst={destination},options=rbind:rw",
                source.display()
            ));
        }
        for e in env {
            command.args(["--env", e]);
        }
        command.arg(reference).arg(&id).arg("/pinset").args(args);
        let proc = Proc::spawn(command, log);
        Container { runtime, id, proc }
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let ctr = |args: &[&str]| {
            let _ = self.runtime.ctr(IMAGE_NAMESPACE).args(args).output();
        };
        ctr(&["task", "kill", "--signal", "SIGKILL", &self.id]);
        let _ = self.proc.child.wait();
        ctr(&["task", "delete", "--force", &self.id]);
        ctr(&["containers", "delete", &self.id]);
    }
}

/// The image carries its version and source commit, and `pinset --version` runs in it under
/// containerd's own runtime (runc), as its default non-root user.
#[test]
fn the_image_runs_under_containerd_and_says_its_version() {
    let Some(runtime) = support::Containerd::start("127.0.0.1:1") else {
        return;
    };
    let Some(reference) = import_image(&runtime) else {
        return;
    };
    let index = archive_json("./index.json");
    let manifest_digest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .replace(':', "/");
    let manifest = archive_json(&format!("./blobs/{manifest_digest}"));
    let annotations = &manifest["annotations"];
    assert_eq!(
        annotations["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let revision = annotations["org.opencontainers.image.revision"]
        .as_str()
        .unwrap();
    assert!(
        revision.len() >= 40 && revision[..40].chars().all(|c| c.is_ascii_hexdigit()),
        "{revision}"
    );
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .replace(':', "/");
    let config = archive_json(&format!("./blobs/{config_digest}"));
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Labels"]["org.opencontainers.image.revision"],
        revision
    );

    let out = runtime
        .ctr(IMAGE_NAMESPACE)
        .args([
            "run",
            "--rm",
            &reference,
            &format!("pinset-version-{}", std::process::id()),
            "/pinset",
            "--version",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        runtime.log()
    );
    let expected = format!(
        "pinset {} (commit {}",
        env!("CARGO_PKG_VERSION"),
        &revision[..12]
    );
    assert!(
        stdout.starts_with(&expected),
        "{stdout:?} does not start with {expected:?}"
    );
    assert!(
        stdout.contains("policy contracts pinset:policy/decisions@")
            && stdout.contains(" pinset:fleet/rollout@"),
        "{stdout}"
    );
}

/// The agent, run from the image as the DaemonSet runs it — no --cri, no --pin (the runtime's
/// socket found at /run/containerd/containerd.sock and asked which runtime it is), the drop-in
/// directory, a kubeconfig and its node's facts bind-mounted — pins a set of the bed's registry
/// and reports it pinned through the real API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_from_the_image_pins_a_set() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let Some(runtime) = support::Containerd::start(&cluster.registry.host) else {
        return;
    };
    let Some(reference) = import_image(&runtime) else {
        return;
    };
    let (refs, nodes) = release_set(&cluster, "img", 3, 900).await;
    let node = node_file(cluster.dir.path(), "cp-0", &roles(&["master"]));
    let dropins = cluster.dir.path().join("crio.conf.d");
    std::fs::create_dir_all(&dropins).unwrap();
    let port = support::free_port();
    let started = Instant::now();
    let agent = Container::run(
        &runtime,
        &reference,
        &[
            (&runtime.socket, "/run/containerd/containerd.sock"),
            (&dropins, "/host/etc/crio/crio.conf.d"),
            (&cluster.agent_kc, "/etc/pinset/kubeconfig"),
            (&node, "/etc/pinset/node.yaml"),
        ],
        &["NODE_NAME=cp-0", "PINSET_LOG=info"],
        &[
            "agent".into(),
            "--kubeconfig=/etc/pinset/kubeconfig".into(),
            "--node-file=/etc/pinset/node.yaml".into(),
            // No controller here: pull as soon as the set appears.
            "--rollout=free".into(),
            format!("--metrics-addr=127.0.0.1:{port}"),
            format!("--insecure-registry={}", cluster.registry.host),
            "--retry-seconds=1".into(),
        ],
        cluster.dir.path().join("image-agent.log"),
    );
    let logs = || format!("{}\n{}", agent.proc.log(), runtime.log());
    eventually("the agent in the image is ready", &logs, || async {
        let ready = tokio::time::timeout(Duration::from_secs(1), try_get(port, "/readyz"))
            .await
            .map_err(|_| "no answer in 1 s".to_string())??;
        let status = ready.lines().next().unwrap_or_default();
        status
            .contains(" 200 ")
            .then_some(())
            .ok_or(status.to_string())
    })
    .await;
    let ready_after = started.elapsed();
    eventually("the node reports the set pinned", &logs, || async {
        let n = nodes
            .get_opt("cp-0")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no node report yet")?;
        let state = node_state(&n);
        (state == settled(&[("release", 1)]))
            .then_some(())
            .ok_or(format!("{state:?}"))
    })
    .await;
    eprintln!(
        "agent from the image: ready after {ready_after:?}, set of {} images pinned after {:?}",
        refs.len(),
        started.elapsed()
    );
    assert_eq!(
        present_and_pinned(&cri(&runtime), &refs).await,
        (refs.len(), refs.len())
    );
    let log = agent.proc.log();
    assert!(
        log.contains("containerd"),
        "the runtime was asked which it is: {log}"
    );
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
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = metrics(port).await;
        let g = metric(&m, "pinset_api_writes_total{kind=\"node_grant\"}");
        let w = metric(&m, "pinset_rollout_waves_total{pool=\"worker\"}");
        if g >= at_least && w >= at_least {
            return (g, w);
        }
        assert!(
            Instant::now() < deadline,
            "{at_least} grant(s) and wave(s) not counted:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn fleet_pool() -> MachineConfigPool {
    pool("worker", &["worker"], "node-role.kubernetes.io/worker")
}

/// The pool's rollout status and its Degraded and PolicyFallback conditions.
fn rollout_of(p: &MachineConfigPool) -> (Option<pinset_k8s::api::PoolRollout>, String, String) {
    let st = p.status.clone().unwrap_or_default();
    let cond = |t: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == t && c.status == "True")
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    (
        st.rollout.clone(),
        cond(CONDITION_DEGRADED),
        cond(pinset_k8s::api::CONDITION_POLICY_FALLBACK),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_policy_paces_three_nodes_holds_on_a_failed_canary_and_survives_hostile_modules() {
    let Some(mut cluster) = Cluster::start().await else {
        return;
    };
    let mut runtimes = Vec::new();
    for _ in FLEET_NODES {
        let Some(r) = support::Containerd::start(&cluster.registry.host) else {
            return;
        };
        runtimes.push(r);
    }
    let cris: Vec<_> = runtimes.iter().map(cri).collect();
    let client = cluster.client.clone();
    let kubeconfig = cluster.controller_kc.display().to_string();
    let operator = cluster.operator_kc.display().to_string();
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    let nodes: Api<MachineConfigNode> = Api::all(client.clone());
    let images = support::push_images(&cluster.registry, "fleet", 3, 150_000, 700).await;
    // The pool starts paused: the set arrives, and no node may pull until the pause is lifted.
    let mut paused_pool = fleet_pool();
    paused_pool.metadata.annotations =
        Some([("pinset.io/rollout-paused".to_string(), "true".to_string())].into());
    pools
        .create(&PostParams::default(), &paused_pool)
        .await
        .unwrap();
    sets.create(&PostParams::default(), &set("apps", "worker", &images[..2]))
        .await
        .unwrap();
    let controller_port = support::free_port();
    let start_controller = |extra: &[String], log: &str| {
        let mut args = vec![
            "controller".to_string(),
            format!("--kubeconfig={kubeconfig}"),
            format!("--metrics-addr=127.0.0.1:{controller_port}"),
        ];
        args.extend_from_slice(extra);
        Proc::start(&args, cluster.dir.path().join(log))
    };
    let controller = std::cell::RefCell::new(start_controller(&[], "fleet-controller.log"));
    let agents: Vec<Proc> = FLEET_NODES
        .iter()
        .zip(&runtimes)
        .map(|(name, runtime)| {
            let mut labels = roles(&["worker"]);
            labels.push(("topology.kubernetes.io/zone".into(), format!("zone-{name}")));
            cluster.agent(
                name,
                &labels,
                runtime,
                support::free_port(),
                &format!("{name}.log"),
                &[],
            )
        })
        .collect();
    let logs = || {
        let mut out = format!("--- controller ---\n{}\n", controller.borrow().log());
        for (name, a) in FLEET_NODES.iter().zip(&agents) {
            out.push_str(&format!("--- {name} ---\n{}\n", a.log()));
        }
        out
    };

    // 0. Paused: all three nodes report, wait, and none is granted until the annotation goes.
    let why = eventually(
        "the paused pool counts its three waiting nodes",
        &logs,
        || async {
            let p = pools.get("worker").await.map_err(|e| e.to_string())?;
            match rollout_of(&p).0 {
                Some(r) if r.waiting == 3 && r.reason.starts_with("paused by") => Ok(r.reason),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(why.contains("3 wait, 0/3 at the target"), "{why}");
    let m = metrics(controller_port).await;
    assert_eq!(
        metric(&m, "pinset_pool_rollout_paused{pool=\"worker\"}"),
        1,
        "{m}"
    );
    for _ in 0..10 {
        let l = look(&nodes, &cris, "apps", 1, &images[..2]).await;
        assert!(
            l.granted.iter().all(|g| !g) && l.present.iter().all(|p| *p == 0),
            "a paused pool granted or pulled: {l:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The registry goes away before the canary is granted: its pull can only end once the
    // registry is back, which the test brings back after stopping the controller (below).
    cluster.registry.stop();
    // `pinset rollout status` follows the rollout from here to its end; `resume` lifts the pause.
    let follow_out = cluster.dir.path().join("rollout-status.out");
    let follow = Command::new(support::PINSET)
        .args(["rollout", "status", "worker", "--timeout", "120s"])
        .args(["--kubeconfig", &operator])
        .arg("--timeline")
        .arg(follow_out.with_extension("svg"))
        .env("PINSET_LOG", "warn")
        .stdout(std::fs::File::create(&follow_out).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let kc = operator.clone();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        support::pinset(&["rollout", "resume", "worker", "--kubeconfig", &kc])
    })
    .await
    .unwrap();
    assert_eq!(
        (code, out.trim()),
        (0, "machineconfigpool/worker resumed"),
        "{err}"
    );

    // 1. The canary pulls first; the others only after it pinned, one at a time (10 % of 3
    //    nodes rounds up to one), never more than one node pulling, never a pull without a grant.
    //    Losing the controller never stops a node that holds a grant: the controller is stopped
    //    once the canary is granted (its pull waiting on the registry), the registry comes back,
    //    the canary pins the set alone, and a restarted controller goes on without granting it
    //    again.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut first_granted: Vec<Option<usize>> = vec![None; 3];
    let mut tick = 0;
    let mut outage: Option<usize> = None;
    let mut first_controller = (0, 0);
    loop {
        let l = look(&nodes, &cris, "apps", 1, &images[..2]).await;
        for i in 0..3 {
            assert!(
                l.granted[i] || l.present[i] == 0,
                "{} pulled without a grant: {l:?}\n{}",
                FLEET_NODES[i],
                logs()
            );
            if l.granted[i] && first_granted[i].is_none() {
                first_granted[i] = Some(tick);
                let earlier_done = (0..3).filter(|&j| j != i && l.done[j]).count();
                let order = first_granted.iter().flatten().count() - 1;
                assert_eq!(
                    earlier_done, order,
                    "{} granted before the node(s) granted ahead of it finished: {l:?}",
                    FLEET_NODES[i]
                );
                if order == 0 {
                    first_controller = grants_and_waves(controller_port, 1).await;
                    controller.borrow_mut().terminate();
                    assert!(!l.done[i], "the canary pinned without a registry: {l:?}");
                    cluster.registry.restart();
                    outage = Some(i);
                }
            }
        }
        if outage.is_some_and(|c| l.done[c]) {
            assert_eq!(
                l.granted.iter().filter(|g| **g).count(),
                1,
                "a grant without a controller: {l:?}"
            );
            *controller.borrow_mut() = start_controller(&[], "fleet-controller-2.log");
            outage = None;
        }
        let pulling = (0..3).filter(|&i| l.granted[i] && !l.done[i]).count();
        assert!(pulling <= 1, "more than one node pulling at once: {l:?}");
        if l.done.iter().all(|d| *d) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rollout not done in 90 s: {l:?}\n{}",
            logs()
        );
        tick += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The canary is whichever node's report the controller saw first. That each grant came
    // alone is not read off the 100 ms samples (a 150 kB pull and the next grant fit in one):
    // the controller's metrics below count 3 grants written in 3 waves.
    // The pool's status follows the nodes' reports through the status lane, a moment later.
    let (rollout, degraded) = eventually("the pool reports the rollout done", &logs, || async {
        let p = pools.get("worker").await.map_err(|e| e.to_string())?;
        match rollout_of(&p) {
            (Some(r), d, _) if r.done == 3 => Ok((r, d)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        (
            rollout.target.as_str(),
            rollout.granted,
            rollout.done,
            rollout.failed
        ),
        ("apps@1", 3, 3, 0),
        "{rollout:?}"
    );
    assert!(degraded.is_empty(), "{degraded}");
    let followed = tokio::task::spawn_blocking(move || follow.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let out = std::fs::read_to_string(&follow_out).unwrap();
    assert_eq!(
        (followed.status.code(), out.lines().last()),
        (
            Some(0),
            Some("MachineConfigPool worker successfully rolled out: 3 of 3 nodes at apps@1")
        ),
        "{out}\n{}",
        String::from_utf8_lossy(&followed.stderr)
    );
    assert!(
        out.starts_with("Waiting for MachineConfigPool worker to roll out: 0 of 3"),
        "{out}"
    );
    // Its picture: a bar per node, one after the other, the canary first.
    let bars: Vec<_> = support::timeline_bars(&follow_out.with_extension("svg"))
        .into_iter()
        .filter(|b| b.3 == "pull")
        .collect();
    assert_eq!(bars.len(), 3, "{bars:?}");
    assert!(
        bars.windows(2).all(|w| w[1].0 >= w[0].1),
        "one node at a time: {bars:?}"
    );
    let canary = (0..3)
        .min_by_key(|&i| first_granted[i].unwrap_or(usize::MAX))
        .unwrap();
    assert_eq!(bars[0].2, FLEET_NODES[canary], "{bars:?}");
    // One grant per node, each in its own wave: the canary by the first controller, then one
    // at a time by the restarted one, which did not grant the canary again.
    let m = metrics(controller_port).await;
    assert_eq!(
        (
            first_controller,
            metric(&m, "pinset_api_writes_total{kind=\"node_grant\"}"),
            metric(&m, "pinset_rollout_waves_total{pool=\"worker\"}"),
            metric(&m, "pinset_pool_rollout_paused{pool=\"worker\"}"),
        ),
        ((1, 1), 2, 2, 0),
        "{m}"
    );

    // 2. Generation 2 adds an image and one that does not exist: the canary fails, the pool
    //    holds and is Degraded naming the canary and the image; the others never pull.
    let missing = format!(
        "{}/pinset/missing@sha256:{}",
        cluster.registry.host,
        "0".repeat(64)
    );
    let gen2 = [images[0].clone(), images[2].clone(), missing.clone()];
    sets.patch(
        "apps",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"pinnedImages": gen2.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}})),
    )
    .await
    .unwrap();
    let held = eventually("the pool holds on the failed canary", &logs, || async {
        let p = pools.get("worker").await.map_err(|e| e.to_string())?;
        match rollout_of(&p) {
            (Some(r), d, _) if r.failed == 1 && d.contains("canary node w-") => Ok((r, d)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(held.1.contains(&missing), "{}", held.1);
    assert_eq!(
        (held.0.granted, held.0.target.as_str()),
        (1, "apps@2"),
        "{:?}",
        held.0
    );
    let l = look(&nodes, &cris, "apps", 2, &images[2..3]).await;
    let canary = l.granted.iter().position(|g| *g).expect("a canary");
    assert!(
        held.1
            .contains(&format!("canary node {}", FLEET_NODES[canary])),
        "{}",
        held.1
    );
    let kc = operator.clone();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        support::pinset(&[
            "rollout",
            "status",
            "worker",
            "--watch=false",
            "--kubeconfig",
            &kc,
        ])
    })
    .await
    .unwrap();
    assert!(
        code == 1
            && err.contains("MachineConfigPool worker is Degraded")
            && err.contains(&format!("canary node {}", FLEET_NODES[canary]))
            && err.contains(&missing),
        "{out}\n{err}"
    );
    for _ in 0..20 {
        let l = look(&nodes, &cris, "apps", 2, &images[2..3]).await;
        for i in (0..3).filter(|&i| i != canary) {
            assert!(
                !l.granted[i] && l.present[i] == 0,
                "a held node pulled: {l:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waiting = nodes.get(FLEET_NODES[(canary + 1) % 3]).await.unwrap();
    let progressing = waiting
        .status
        .unwrap_or_default()
        .conditions
        .into_iter()
        .find(|c| c.type_ == CONDITION_PROGRESSING)
        .unwrap();
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("True", "WaitingForRolloutGrant"),
        "{progressing:?}"
    );

    // 3. The controller restarts with a hostile fleet module that grants every node at once,
    //    over the pool's ceiling of one: contained (the default answers, the pool says why), no
    //    node granted again, the counts unchanged.
    controller.borrow_mut().terminate();
    pools
        .patch(
            "worker",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "pinset.io/rollout-max-pulling": "1",
                "pinset.test/hostile-fleet": "all",
            }}})),
        )
        .await
        .unwrap();
    let hostile = support::policy_dir().join("pinset_test_policy_hostile.wasm");
    *controller.borrow_mut() = start_controller(
        &[format!("--fleet-policy=worker={}", hostile.display())],
        "fleet-controller-2.log",
    );
    let fallback = eventually("the pool names the fleet fallback", &logs, || async {
        let p = pools.get("worker").await.map_err(|e| e.to_string())?;
        match rollout_of(&p) {
            (Some(r), _, f) if f.contains("ceiling") => Ok((r, f)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(fallback.1.contains("hostile"), "{}", fallback.1);
    assert_eq!(
        (fallback.0.granted, fallback.0.failed),
        (1, 1),
        "{:?}",
        fallback.0
    );
    let m = metrics(controller_port).await;
    assert_eq!(
        metric(&m, "pinset_api_writes_total{kind=\"node_grant\"}"),
        0,
        "the restarted controller granted again:\n{m}"
    );

    // 4. The set is fixed (generation 3) while the module loops: every decision falls back to
    //    the default, which rolls the pool out canary first.
    pools
        .patch(
            "worker",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"pinset.test/hostile-fleet": "loop"}}}),
            ),
        )
        .await
        .unwrap();
    sets.patch(
        "apps",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"pinnedImages": gen2[..2].iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}})),
    )
    .await
    .unwrap();
    let done = eventually("every node pins generation 3", &logs, || async {
        let l = look(&nodes, &cris, "apps", 3, &gen2[..2]).await;
        let pulling = (0..3).filter(|&i| l.granted[i] && !l.done[i]).count();
        assert!(pulling <= 1, "more than the ceiling pulling: {l:?}");
        l.done
            .iter()
            .all(|d| *d)
            .then_some(l)
            .ok_or("not yet".to_string())
    })
    .await;
    assert_eq!(done.present, vec![2, 2, 2]);
    let fallback = eventually("the pool counts every node done", &logs, || async {
        let p = pools.get("worker").await.map_err(|e| e.to_string())?;
        match rollout_of(&p) {
            (Some(r), d, f) if (r.done, r.failed) == (3, 0) && d.is_empty() => Ok(f),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(fallback.contains("deadline"), "{fallback}");

    // Events: paused and resumed, waves started, the canary failed, the fleet policy fell back
    // (recorded behind the grants: waited for).
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    eventually("the pool's Events", &logs, || async {
        let reasons: Vec<String> = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("worker"))
            .filter_map(|e| e.reason.clone())
            .collect();
        let wanted = [
            "RolloutPaused",
            "RolloutResumed",
            "RolloutWave",
            "RolloutHeld",
            "PolicyFallback",
        ];
        let missing: Vec<_> = wanted
            .iter()
            .filter(|w| !reasons.iter().any(|r| r == *w))
            .collect();
        missing
            .is_empty()
            .then_some(())
            .ok_or(format!("missing {missing:?} among {reasons:?}"))
    })
    .await;
    // The agents' metric: nothing waits any more.
    drop(agents);
}

/// Node policy modules pushed for a policy rollout (references without `oci://`): v1 the
/// default, v2 the hostile module (it traps in `order` on nodes labelled so), v3 the
/// unthrottled one — each signed — and the floor module, unsigned. (A module is trusted by its
/// digest: v3's bytes pushed unsigned elsewhere would be the signed v3.)
struct Releases {
    v1: String,
    v2: String,
    v3: String,
    unsigned: String,
    public_key: String,
}

impl Releases {
    fn push(cluster: &Cluster, dir: &Path) -> Releases {
        let host = cluster.registry.host.clone();
        let run = |args: &[&str]| {
            let (code, out, err) = support::pinset(args);
            assert_eq!(code, 0, "pinset {args:?}: {err}");
            out.trim().to_string()
        };
        let prefix = dir.join("cosign");
        run(&[
            "policy",
            "keygen",
            "--output-key-prefix",
            prefix.to_str().unwrap(),
            "--allow-empty-password",
        ]);
        let key = prefix.with_extension("key");
        let push = |stem: &str, repo: &str, sign: bool| {
            let file = support::policy_path(stem);
            let target = format!("{host}/policies/{repo}:e2e");
            let pushed = run(&[
                "policy",
                "push",
                file.to_str().unwrap(),
                &target,
                "--insecure-registry",
                &host,
            ]);
            if sign {
                run(&[
                    "policy",
                    "sign",
                    &pushed,
                    "--key",
                    key.to_str().unwrap(),
                    "--insecure-registry",
                    &host,
                ]);
            }
            pushed
        };
        Releases {
            v1: push("pinset_policy_default", "worker", true),
            v2: push("pinset_test_policy_hostile", "worker-v2", true),
            v3: push("pinset_test_policy_unthrottled", "worker-v3", true),
            unsigned: push("pinset_test_policy_floor", "worker-unsigned", false),
            public_key: std::fs::read_to_string(prefix.with_extension("pub")).unwrap(),
        }
    }

    /// The PolicyConfiguration naming `module` for pool worker, and `fleet` as every pool's
    /// fleet policy when given; signatures required.
    async fn configure(&self, client: &kube::Client, module: &str, fleet: Option<&str>) -> Instant {
        let api: Api<pinset_k8s::api::PolicyConfiguration> = Api::all(client.clone());
        let mut object = json!({
            "apiVersion": "pinset.io/v1alpha1",
            "kind": "PolicyConfiguration",
            "metadata": {"name": "cluster"},
            "spec": {
                "verify": {"keys": [self.public_key]},
                "pools": {"worker": {"module": format!("oci://{module}")}}
            }
        });
        if let Some(fleet) = fleet {
            object["spec"]["fleet"] = json!({"module": {"module": format!("oci://{fleet}")}});
        }
        api.patch(
            "cluster",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap();
        Instant::now()
    }
}

/// The module each fleet node says it runs, and the one it last refused.
async fn node_policies(nodes: &Api<MachineConfigNode>) -> Vec<(Option<String>, Option<String>)> {
    let mut out = Vec::new();
    for name in FLEET_NODES {
        let st = nodes
            .get(name)
            .await
            .ok()
            .and_then(|n| n.status)
            .unwrap_or_default();
        out.push((
            st.policy.map(|p| p.module),
            st.policy_rejected
                .map(|r| format!("{}: {}", r.module, r.cause)),
        ));
    }
    out
}

/// Which fleet nodes hold a grant for the policy entry of `module`.
async fn policy_granted(nodes: &Api<MachineConfigNode>, module: &str) -> Vec<bool> {
    let entry = pinset_core::rollout::policy_set(&format!("oci://{module}"));
    let mut out = Vec::new();
    for name in FLEET_NODES {
        let grant = nodes
            .get(name)
            .await
            .ok()
            .and_then(|n| n.spec.rollout_grant);
        out.push(grant.is_some_and(|g| g.sets.iter().any(|s| s.name == entry)));
    }
    out
}

/// A fleet node's state against the policy entry of `module`: granted it, and running it.
fn policy_state(mcn: &MachineConfigNode, entry: &str, module: &str) -> (bool, bool) {
    let granted = mcn
        .spec
        .rollout_grant
        .as_ref()
        .is_some_and(|g| g.sets.iter().any(|s| s.name == entry));
    let running = mcn
        .status
        .as_ref()
        .and_then(|s| s.policy.as_ref())
        .is_some_and(|p| p.module == module);
    (granted, running)
}

/// Apply `change` (which returns when it was made), then follow the fleet nodes through a
/// watch — every change in the API server's order, however fast the rollout — until each runs
/// `module`, checking that no node was granted it before the first granted one (the canary)
/// ran it. The canary's index, and the times from the change to the canary and to the whole
/// pool running it.
async fn follow_policy_rollout(
    nodes: &Api<MachineConfigNode>,
    module: &str,
    change: impl Future<Output = Instant>,
    logs: &dyn Fn() -> String,
) -> (usize, Duration, Duration) {
    use futures::StreamExt;
    let module = format!("oci://{module}");
    let entry = pinset_core::rollout::policy_set(&module);
    let mut events = std::pin::pin!(kube::runtime::watcher(nodes.clone(), Default::default()));
    let mut state = [(false, false); FLEET_NODES.len()];
    // The nodes as they are before the change.
    while let Some(event) = events.next().await {
        match event.unwrap() {
            kube::runtime::watcher::Event::InitDone => break,
            kube::runtime::watcher::Event::InitApply(n) => {
                if let Some(i) = FLEET_NODES
                    .iter()
                    .position(|f| Some(*f) == n.metadata.name.as_deref())
                {
                    state[i] = policy_state(&n, &entry, &module);
                }
            }
            _ => {}
        }
    }
    assert!(
        state.iter().all(|s| !s.0 && !s.1),
        "{module} already granted: {state:?}"
    );
    let since = change.await;
    let mut canary: Option<(usize, Option<Duration>)> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let next = tokio::time::timeout_at(deadline, events.next()).await;
        let event =
            next.unwrap_or_else(|_| panic!("{module} not rolled out: {state:?}\n{}", logs()));
        let Some(Ok(kube::runtime::watcher::Event::Apply(n))) = event else {
            continue;
        };
        let Some(i) = FLEET_NODES
            .iter()
            .position(|f| Some(*f) == n.metadata.name.as_deref())
        else {
            continue;
        };
        state[i] = policy_state(&n, &entry, &module);
        assert!(
            state[i].0 || !state[i].1,
            "{} swapped without a grant\n{}",
            FLEET_NODES[i],
            logs()
        );
        if canary.is_none() && state[i].0 {
            canary = Some((i, None));
        }
        let Some((c, _)) = canary else { continue };
        if state[c].1 {
            canary.as_mut().unwrap().1.get_or_insert(since.elapsed());
        }
        let others = (0..FLEET_NODES.len())
            .filter(|&j| j != c && state[j].0)
            .count();
        assert!(
            others == 0 || canary.unwrap().1.is_some(),
            "{} granted {module} before the canary {} ran it: {state:?}\n{}",
            FLEET_NODES[i],
            FLEET_NODES[c],
            logs()
        );
        if state.iter().all(|s| s.1) {
            return (c, canary.unwrap().1.unwrap(), since.elapsed());
        }
    }
}

/// `pinset rollout status worker --timeout 90s -o json` as `kubeconfig`, started now:
/// (exit code, stdout, stderr).
fn follow_worker(kubeconfig: &str) -> tokio::task::JoinHandle<(i32, String, String)> {
    let kc = kubeconfig.to_string();
    tokio::task::spawn_blocking(move || {
        let args = [
            "rollout",
            "status",
            "worker",
            "--timeout",
            "90s",
            "-o",
            "json",
        ];
        support::pinset(&[&args[..], &["--kubeconfig", &kc]].concat())
    })
}

/// `pinset rollout status worker -o json` started right after `change` landed, with no pause
/// between them (as a pipeline runs them): (exit code, the last status, stderr).
async fn status_after(
    change: impl Future<Output = Instant>,
    kubeconfig: &str,
) -> (i32, serde_json::Value, String) {
    change.await;
    let (code, out, err) = follow_worker(kubeconfig).await.unwrap();
    let status = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    (code, status, err)
}

/// A pool's node policy changes while pinset runs: a module that traps is refused by the canary
/// in its smoke test and holds the pool; a good one rolls out canary-first without restarting
/// an agent; an unsigned one never decides anywhere; a restarted agent runs its last module from
/// its cache with the registry gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_policy_change_rolls_out_canary_first_and_a_bad_one_is_held() {
    let Some(mut cluster) = Cluster::start().await else {
        return;
    };
    let mut runtimes = Vec::new();
    for _ in FLEET_NODES {
        let Some(r) = support::Containerd::start(&cluster.registry.host) else {
            return;
        };
        runtimes.push(r);
    }
    let client = cluster.client.clone();
    let kubeconfig = cluster.controller_kc.display().to_string();
    let operator = cluster.operator_kc.display().to_string();
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let sets: Api<PinnedImageSet> = Api::all(client.clone());
    let nodes: Api<MachineConfigNode> = Api::all(client.clone());
    let releases = Releases::push(&cluster, cluster.dir.path());
    releases.configure(&client, &releases.v1, None).await;
    let images = support::push_images(&cluster.registry, "policy-rollout", 2, 50_000, 900).await;
    pools
        .create(&PostParams::default(), &fleet_pool())
        .await
        .unwrap();
    sets.create(&PostParams::default(), &set("apps", "worker", &images))
        .await
        .unwrap();
    let controller_port = support::free_port();
    let controller = Proc::start(
        &[
            "controller".into(),
            format!("--kubeconfig={kubeconfig}"),
            format!("--metrics-addr=127.0.0.1:{controller_port}"),
            "--policy-configuration=cluster".into(),
            format!("--policy-insecure-registry={}", cluster.registry.host),
        ],
        cluster.dir.path().join("policy-controller.log"),
    );
    let (registry_host, dir) = (
        cluster.registry.host.clone(),
        cluster.dir.path().to_path_buf(),
    );
    let agent_args = |name: &str| {
        vec![
            "--policy-configuration=cluster".to_string(),
            format!("--policy-insecure-registry={registry_host}"),
            format!(
                "--policy-cache={}",
                dir.join(format!("{name}-cache")).display()
            ),
        ]
    };
    let labels = {
        let mut l = roles(&["worker"]);
        l.push(("pinset.test/hostile".into(), "trap-order".into()));
        l
    };
    let ports: Vec<u16> = FLEET_NODES.iter().map(|_| support::free_port()).collect();
    let agents: Vec<Proc> = FLEET_NODES
        .iter()
        .zip(&runtimes)
        .zip(&ports)
        .map(|((name, runtime), port)| {
            cluster.agent(
                name,
                &labels,
                runtime,
                *port,
                &format!("policy-{name}.log"),
                &agent_args(name),
            )
        })
        .collect();
    let agents = std::cell::RefCell::new(agents);
    let logs = || {
        let mut out = format!("--- controller ---\n{}\n", controller.log());
        for (name, a) in FLEET_NODES.iter().zip(agents.borrow().iter()) {
            out.push_str(&format!("--- {name} ---\n{}\n", a.log()));
        }
        out
    };
    let pids: Vec<u32> = agents.borrow().iter().map(|a| a.child.id()).collect();

    // 1. v1 on every node, the set pinned; the pool counts three nodes on v1's digest.
    let v1 = format!("oci://{}", releases.v1);
    eventually("every node runs v1 and pins the set", &logs, || async {
        let p = node_policies(&nodes).await;
        let l = look(&nodes, &[], "apps", 1, &images).await;
        (p.iter().all(|(m, _)| m.as_deref() == Some(v1.as_str())) && l.done.iter().all(|d| *d))
            .then_some(())
            .ok_or(format!("{p:?} {l:?}"))
    })
    .await;
    // Counted by the digest the operator wrote (v1's manifest digest), not its bytes'.
    let default_digest = releases.v1.rsplit_once('@').unwrap().1.to_string();
    eventually(
        "the pool counts its nodes per policy digest",
        &logs,
        || async {
            let st = pools
                .get("worker")
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            match st.policies.as_slice() {
                [p] if p.nodes == 3 && p.digest == default_digest && p.module == v1 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // 2. v2 traps in `order` on these nodes: the canary refuses it in its smoke test, the pool
    //    holds Degraded naming the node, the module and the cause; the others never take it.
    //    `rollout status`, run at once after the patch, waits for the controller to see it and
    //    exits 1 on the hold (never 0 on the status of v1's rollout).
    let v2_digest = releases.v2.rsplit_once('@').unwrap().1.to_string();
    let (code, status, err) =
        status_after(releases.configure(&client, &releases.v2, None), &operator).await;
    assert_eq!(code, 1, "{status}\n{err}\n{}", logs());
    assert_eq!(status["standing"], "Degraded", "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or("")
            .contains(&v2_digest),
        "{status}"
    );
    assert!(
        err.contains("MachineConfigPool worker is Degraded"),
        "{err}"
    );
    let held = eventually(
        "the canary refuses v2 and the pool holds",
        &logs,
        || async {
            let (_, degraded, _) =
                rollout_of(&pools.get("worker").await.map_err(|e| e.to_string())?);
            (degraded.contains("canary node") && degraded.contains(&v2_digest))
                .then_some(degraded.clone())
                .ok_or(degraded)
        },
    )
    .await;
    for said in ["smoke test", "order", "trap"] {
        assert!(held.contains(said), "{said:?} in {held}");
    }
    let policies = node_policies(&nodes).await;
    let refused: Vec<usize> = (0..3).filter(|&i| policies[i].1.is_some()).collect();
    assert_eq!(refused.len(), 1, "{policies:?}");
    assert!(held.contains(FLEET_NODES[refused[0]]), "{held}");
    for _ in 0..20 {
        let granted = policy_granted(&nodes, &releases.v2).await;
        let p = node_policies(&nodes).await;
        for i in (0..3).filter(|i| *i != refused[0]) {
            assert!(
                !granted[i],
                "{} granted v2 after the canary refused it",
                FLEET_NODES[i]
            );
        }
        assert!(
            p.iter().all(|(m, _)| m.as_deref() == Some(v1.as_str())),
            "v1 everywhere: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The fleet policy changes on the running controller mid-rollout (the canary granted, the
    // others held): the hostile module's fleet side, which answers as the default without its
    // annotation, decides from now on; no grant is written again.
    let grants = |m: &str| metric(m, "pinset_api_writes_total{kind=\"node_grant\"}");
    let written = grants(&metrics(controller_port).await);
    let fleet = Some(releases.v2.as_str());
    releases.configure(&client, &releases.v2, fleet).await;
    eventually("the controller swaps its fleet policy", &logs, || async {
        let (rollout, degraded, _) =
            rollout_of(&pools.get("worker").await.map_err(|e| e.to_string())?);
        let policy = rollout.map(|r| r.policy).unwrap_or_default();
        (policy.contains("worker-v2") && degraded.contains("canary node"))
            .then_some(())
            .ok_or(format!("{policy} / {degraded}"))
    })
    .await;
    assert_eq!(
        grants(&metrics(controller_port).await),
        written,
        "no grant written again"
    );

    // 3. v3 is good: the canary first, then waves; every node runs it; no agent restarted.
    //    `rollout status`, started the moment the patch lands, follows it to the end: exit 0.
    let follower = std::cell::RefCell::new(None);
    let change = async {
        let at = releases.configure(&client, &releases.v3, fleet).await;
        *follower.borrow_mut() = Some(follow_worker(&operator));
        at
    };
    let (canary, to_canary, to_pool) =
        follow_policy_rollout(&nodes, &releases.v3, change, &logs).await;
    let followed = follower.borrow_mut().take().unwrap();
    let (code, out, err) = followed.await.unwrap();
    assert_eq!(code, 0, "{out}\n{err}\n{}", logs());
    let followed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let v3_entry = pinset_core::rollout::policy_set(&format!("oci://{}", releases.v3));
    assert_eq!(followed["standing"], "Complete", "{followed}");
    assert!(
        followed["target"].as_str().unwrap().contains(&v3_entry) && followed["done"] == 3,
        "the status of the change just made: {followed}"
    );
    eprintln!(
        "policy rollout v3: canary {} after {to_canary:?}, whole pool (3 nodes) after {to_pool:?}",
        FLEET_NODES[canary]
    );
    // `pinset rollout status` follows the policy entry like a set: the pool is complete.
    let kc = operator.clone();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        support::pinset(&[
            "rollout",
            "status",
            "worker",
            "--watch=false",
            "-o",
            "json",
            "--kubeconfig",
            &kc,
        ])
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entry = pinset_core::rollout::policy_set(&format!("oci://{}", releases.v3));
    assert!(
        status["target"].as_str().unwrap().contains(&entry),
        "{status}"
    );
    assert_eq!(status["done"], 3, "{status}");
    for (agent, pid) in agents.borrow_mut().iter_mut().zip(&pids) {
        assert_eq!(agent.child.id(), *pid);
        assert!(
            agent.child.try_wait().unwrap().is_none(),
            "an agent exited\n{}",
            logs()
        );
    }
    let m = metrics(ports[canary]).await;
    assert!(
        metric(&m, "pinset_policy_swaps_total{result=\"swapped\"}") >= 2,
        "{m}"
    );
    assert!(
        metric(&m, "pinset_policy_swaps_total{result=\"rejected\"}") >= 1,
        "{m}"
    );
    let v3_digest = releases.v3.rsplit_once('@').unwrap().1.to_string();
    assert!(m.contains(&format!("digest=\"{v3_digest}\"")), "{m}");
    eventually(
        "the pool reports the rollout and its Degraded lifts",
        &logs,
        || async {
            let p = pools.get("worker").await.map_err(|e| e.to_string())?;
            let (_, degraded, _) = rollout_of(&p);
            let counts = p.status.unwrap_or_default().policies;
            (degraded.is_empty() && counts.len() == 1 && counts[0].digest == v3_digest)
                .then_some(())
                .ok_or(format!("{degraded} {counts:?}"))
        },
    )
    .await;
    // The Events say it: the canary's refusal of v2, each swap, the pool's rollout of v3.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let v3_entry = pinset_core::rollout::policy_set(&format!("oci://{}", releases.v3));
    let v3_hex = v3_entry.trim_start_matches("policy@");
    eventually("the policy Events are recorded", &logs, || async {
        let list = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let seen: Vec<(String, String, String)> = list
            .items
            .iter()
            .map(|e| {
                let r = e.regarding.clone().unwrap_or_default();
                let why = (
                    e.reason.clone().unwrap_or_default(),
                    e.note.clone().unwrap_or_default(),
                );
                (r.name.unwrap_or_default(), why.0, why.1)
            })
            .collect();
        let has = |name: &str, reason: &str, note: &str| {
            seen.iter()
                .any(|(n, r, t)| n == name && r == reason && t.contains(note))
        };
        let canary_name = FLEET_NODES[refused[0]];
        (has(canary_name, "PolicyRejected", &v2_digest)
            && has(canary_name, "PolicySwapped", "unthrottled")
            && has("worker", "PolicyRolledOut", v3_hex))
        .then_some(())
        .ok_or(format!("{seen:?}"))
    })
    .await;

    // 4. An unsigned module never reaches a node: the controller checks its signature before
    //    the pool's target names it; the pool is Degraded naming it, no node is granted it,
    //    every node keeps v3.
    let (code, status, err) = status_after(
        releases.configure(&client, &releases.unsigned, fleet),
        &operator,
    )
    .await;
    assert_eq!(code, 1, "{status}\n{err}");
    let why = status["message"].as_str().unwrap_or_default().to_string();
    assert!(
        why.contains("worker-unsigned")
            && why.contains("(Unsigned)")
            && why.contains("no cosign signature")
            && why.contains("every node keeps its module"),
        "{why}"
    );
    // A digest the registry does not hold is not found, not unsigned.
    let (repo, _) = releases.unsigned.rsplit_once('@').unwrap();
    let missing = format!("{repo}@sha256:{}", "0".repeat(64));
    let (code, status, err) =
        status_after(releases.configure(&client, &missing, fleet), &operator).await;
    assert_eq!(code, 1, "{status}\n{err}");
    let why = status["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("(NotFound)") && !why.contains("no cosign signature"),
        "{why}"
    );
    releases.configure(&client, &releases.unsigned, fleet).await;
    // The Degraded status was written by the decision that left the module out of the target.
    let granted = policy_granted(&nodes, &releases.unsigned).await;
    assert!(
        granted.iter().all(|g| !g),
        "a node was granted the unsigned module"
    );
    let p = node_policies(&nodes).await;
    let v3 = format!("oci://{}", releases.v3);
    assert!(
        p.iter().all(|(m, _)| m.as_deref() == Some(v3.as_str())),
        "{p:?}"
    );
    // 4b. A policy change while a pull is in flight: the reconcile finishes with the module it
    //     started with, nothing is cancelled, and the node swaps after it.
    let late = support::push_images(&cluster.registry, "policy-late", 1, 50_000, 901).await;
    cluster.registry.stop();
    sets.create(&PostParams::default(), &set("late", "worker", &late))
        .await
        .unwrap();
    let puller = eventually("a canary is granted the new set", &logs, || async {
        let l = look(&nodes, &[], "late", 1, &late).await;
        l.granted.iter().position(|g| *g).ok_or(format!("{l:?}"))
    })
    .await;
    let again_lines = |i: usize| {
        agents.borrow()[i]
            .log()
            .matches("the desired state changed: reconciling again")
            .count()
    };
    // The pull waits on the registry (the agent retries it): the policy changes meanwhile.
    eventually(
        "the canary pulls the new set, its registry away",
        &logs,
        || async {
            let n = nodes
                .get(FLEET_NODES[puller])
                .await
                .map_err(|e| e.to_string())?;
            let (sets, progressing, _) = node_state(&n);
            let pulling =
                progressing == "True" && sets.iter().any(|s| s.0 == "late" && s.2.is_none());
            pulling
                .then_some(())
                .ok_or(format!("{sets:?} progressing {progressing}"))
        },
    )
    .await;
    let restarts_before = again_lines(puller);
    releases.configure(&client, &releases.v1, fleet).await;
    let v1_digest = releases.v1.rsplit('@').next().unwrap().to_string();
    eventually("the pool's target names v1", &logs, || async {
        let (rollout, _, _) = rollout_of(&pools.get("worker").await.map_err(|e| e.to_string())?);
        let target = rollout.map(|r| r.target).unwrap_or_default();
        target.contains(&v1_digest).then_some(()).ok_or(target)
    })
    .await;
    cluster.registry.restart();
    eventually("every node pins the new set and runs v1", &logs, || async {
        let l = look(&nodes, &[], "late", 1, &late).await;
        let p = node_policies(&nodes).await;
        let on_v1 = p.iter().all(|(m, _)| m.as_deref() == Some(v1.as_str()));
        (l.done.iter().all(|d| *d) && on_v1)
            .then_some(())
            .ok_or(format!("{l:?} {p:?}"))
    })
    .await;
    assert_eq!(
        again_lines(puller),
        restarts_before,
        "the policy change cancelled {}'s reconcile\n{}",
        FLEET_NODES[puller],
        logs()
    );
    let change = releases.configure(&client, &releases.v3, fleet);
    let (_, to_canary, to_pool) = follow_policy_rollout(&nodes, &releases.v3, change, &logs).await;
    eprintln!("policy rollout v3 again: canary after {to_canary:?}, whole pool after {to_pool:?}");
    // A set change, followed the moment it is made: exit 0 once every node pins its generation.
    let more = support::push_images(&cluster.registry, "policy-more", 1, 50_000, 902).await;
    let change = async {
        let mut apps = sets.get("apps").await.unwrap();
        let extra = pinset_k8s::api::PinnedImageRef {
            name: more[0].clone(),
        };
        apps.spec.pinned_images.push(extra);
        sets.replace("apps", &PostParams::default(), &apps)
            .await
            .unwrap();
        Instant::now()
    };
    let (code, status, err) = status_after(change, &operator).await;
    assert_eq!(code, 0, "{status}\n{err}\n{}", logs());
    assert!(
        status["target"].as_str().unwrap().starts_with("apps@2,") && status["done"] == 3,
        "{status}"
    );

    // 5. The registry goes away and an agent restarts: it decides with v3 from its cache.
    cluster.registry.stop();
    let restarted = (canary + 1) % 3;
    agents.borrow_mut()[restarted].terminate();
    let name = FLEET_NODES[restarted];
    let again = cluster.agent(
        name,
        &labels,
        &runtimes[restarted],
        ports[restarted],
        &format!("policy-{name}-restarted.log"),
        &agent_args(name),
    );
    agents.borrow_mut()[restarted] = again;
    eventually(
        "the restarted agent runs v3 from its cache",
        &logs,
        || async {
            let m = try_get(ports[restarted], "/metrics").await?;
            m.contains(&format!("digest=\"{v3_digest}\""))
                .then_some(())
                .ok_or(m)
        },
    )
    .await;
    let log = agents.borrow()[restarted].log();
    assert!(
        log.contains("deciding with the module the node ran before the restart"),
        "{log}"
    );
    assert!(!log.contains("refused"), "{log}");

    // 6. The manual's recipe (docs/policy-rollout.md), run as written: its lines with the
    //    registry, the module, the key and the digest it printed filled in, in one shell whose
    //    registries file and kubeconfig are this cluster's.
    cluster.registry.restart();
    readme_recipe(&cluster, &logs).await;
}

/// The shell block of docs/policy-rollout.md ("Changing a pool's policy"), each command with
/// its `…` filled in, run by bash in order; every one exits 0 and the pool then counts its
/// nodes on the module.
async fn readme_recipe(cluster: &Cluster, logs: &dyn Fn() -> String) {
    let page = support::workspace().join("docs/policy-rollout.md");
    let readme = std::fs::read_to_string(page).unwrap();
    let section = readme.split("# Changing a pool's policy").nth(1).unwrap();
    let block = section
        .split("```sh\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let commands: Vec<String> = block
        .replace("\\\n", " ")
        .lines()
        .map(|l| l.split("  #").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands.len(), 5, "{block}");
    let dir = cluster.dir.path();
    let host = cluster.registry.host.clone();
    let sources = dir.join("registries.yaml");
    std::fs::write(&sources, format!("insecureRegistries: [{host}]\n")).unwrap();
    let credentials = dir.join("no-credentials.json");
    std::fs::write(&credentials, "{}").unwrap();
    let module = support::policy_path("pinset_policy_smallest_first");
    let fill = |c: &str, digest: &str| {
        c.replace("registry.example.com", &host)
            .replace("policy.wasm", module.to_str().unwrap())
            .replace("~/.docker/config.json", credentials.to_str().unwrap())
            .replace("cosign.key", dir.join("cosign.key").to_str().unwrap())
            .replace("sha256:…", digest)
    };
    let bin = std::path::Path::new(support::PINSET)
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut digest = String::new();
    for command in &commands[..4] {
        let line = fill(command, &digest);
        if line.starts_with("kubectl ") {
            kubectl_patch(cluster, &line).await;
            continue;
        }
        let (kc, env, path) = (
            cluster.server.kubeconfig.clone(),
            sources.clone(),
            path.clone(),
        );
        let out = tokio::task::spawn_blocking(move || {
            // A deadline on each line: the recipe's `rollout status` waits as long as it takes.
            let mut command = std::process::Command::new("timeout");
            support::without_terminal(command.args(["180", "bash", "-c", &line]))
                .env("PATH", path)
                .env("PINSET_REGISTRIES", env)
                .env("KUBECONFIG", kc)
                .env("PINSET_LOG", "warn")
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{command}: {stdout}{stderr}\n{}",
            logs()
        );
        if digest.is_empty() {
            digest = stdout.trim().rsplit_once('@').unwrap().1.to_string();
        }
    }
    // `kubectl get mcp worker -o jsonpath='{.status.policies}'`: the pool's counts land with
    // the controller's next status write, so asked until they do.
    assert!(
        commands[4].contains("{.status.policies}"),
        "{}",
        commands[4]
    );
    let pools: Api<MachineConfigPool> = Api::all(cluster.client.clone());
    eventually(
        "the pool counts its nodes on the module just rolled out",
        logs,
        || async {
            let p = pools.get("worker").await.map_err(|e| e.to_string())?;
            let counts = p.status.unwrap_or_default().policies;
            match counts.as_slice() {
                [c] if c.digest == digest && c.nodes == 3 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// A recipe's `kubectl patch KIND NAME --type merge -p 'JSON'`, done through the API with the
/// line's own JSON: kubectl asks for the core API group's discovery, which the test API server
/// (apiextensions-apiserver) does not serve.
async fn kubectl_patch(cluster: &Cluster, line: &str) {
    assert!(
        line.starts_with("kubectl patch policyconfiguration cluster --type merge"),
        "{line}"
    );
    let json = line.split("-p '").nth(1).unwrap().trim_end_matches('\'');
    let patch: serde_json::Value = serde_json::from_str(json).unwrap();
    let api: Api<pinset_k8s::api::PolicyConfiguration> = Api::all(cluster.client.clone());
    api.patch(
        "cluster",
        &Default::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
}

/// One rule removed from the manifests' RBAC — the agent's right to patch its
/// MachineConfigNode's status, the commonest way a fresh install fails — and the agent's first
/// request that needs it is refused by the API server: the agent says who may not do what and
/// where to grant it, never as an outage, and retries with backoff (its node is not granted the
/// rollout meanwhile: the controller grants from the reports it cannot write); once the rule is
/// back, the status lands, the set is pulled and pinned, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_missing_from_the_manifests_is_a_clear_refusal_retried_until_granted() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let Some(runtime) = support::Containerd::start(&cluster.registry.host) else {
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
    let pp = PostParams::default();
    let pools: Api<MachineConfigPool> = Api::all(cluster.client.clone());
    let worker = pool("worker", &["worker"], "node-role.kubernetes.io/worker");
    pools.create(&pp, &worker).await.unwrap();
    let sets: Api<PinnedImageSet> = Api::all(cluster.client.clone());
    sets.create(&pp, &set("apps", "worker", &images))
        .await
        .unwrap();
    let controller = Proc::start(
        &[
            "controller".into(),
            format!("--kubeconfig={}", cluster.controller_kc.display()),
            format!("--metrics-addr=127.0.0.1:{}", support::free_port()),
        ],
        cluster.dir.path().join("controller.log"),
    );
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
    let bob = bob.display().to_string();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        support::pinset(&[
            "rollout",
            "status",
            "worker",
            "--watch=false",
            "--kubeconfig",
            &bob,
        ])
    })
    .await
    .unwrap();
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

/// The node policy of node `name`: the module it runs, the reason of the refusal it reports (if
/// any), and its PolicyFallback condition's (status, reason).
async fn policy_of(
    nodes: &Api<MachineConfigNode>,
    name: &str,
) -> Result<(Option<String>, Option<String>, (String, String)), String> {
    let st = nodes
        .get(name)
        .await
        .map_err(|e| e.to_string())?
        .status
        .unwrap_or_default();
    let fallback = st
        .conditions
        .iter()
        .find(|c| c.type_ == pinset_k8s::api::CONDITION_POLICY_FALLBACK)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default();
    Ok((
        st.policy.map(|p| p.module),
        st.policy_rejected.map(|r| r.reason),
        fallback,
    ))
}

/// Trust on the unhappy path, on one node. The registry goes away while the pool's policy
/// changes: the canary waits for it — no refusal, no hold, the node keeps its module — and takes
/// the new module once the registry is back (the recheck schedule's first wait, 30 s). Then the
/// trusted key is replaced by one that signed nothing: the running module is checked again at
/// once and retired for the default, said as a refused signature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_away_is_waited_for_and_a_removed_key_retires_what_it_vouched_for() {
    let Some(mut cluster) = Cluster::start().await else {
        return;
    };
    let Some(runtime) = support::Containerd::start(&cluster.registry.host) else {
        return;
    };
    let client = cluster.client.clone();
    let pools: Api<MachineConfigPool> = Api::all(client.clone());
    let nodes: Api<MachineConfigNode> = Api::all(client.clone());
    let releases = Releases::push(&cluster, cluster.dir.path());
    releases.configure(&client, &releases.v1, None).await;
    pools
        .create(&PostParams::default(), &fleet_pool())
        .await
        .unwrap();
    let host = cluster.registry.host.clone();
    let controller = Proc::start(
        &[
            "controller".into(),
            format!("--kubeconfig={}", cluster.controller_kc.display()),
            format!("--metrics-addr=127.0.0.1:{}", support::free_port()),
            "--policy-configuration=cluster".into(),
            format!("--policy-insecure-registry={host}"),
        ],
        cluster.dir.path().join("trust-controller.log"),
    );
    let name = FLEET_NODES[0];
    let agent = cluster.agent(
        name,
        &roles(&["worker"]),
        &runtime,
        support::free_port(),
        "trust-agent.log",
        &[
            "--policy-configuration=cluster".into(),
            format!("--policy-insecure-registry={host}"),
            format!(
                "--policy-cache={}",
                cluster.dir.path().join("trust-cache").display()
            ),
        ],
    );
    let logs = || {
        format!(
            "--- controller ---\n{}\n--- agent ---\n{}",
            controller.log(),
            agent.log()
        )
    };
    let (v1, v3) = (
        format!("oci://{}", releases.v1),
        format!("oci://{}", releases.v3),
    );
    eventually("the node runs v1", &logs, || async {
        let (module, ..) = policy_of(&nodes, name).await?;
        (module.as_deref() == Some(v1.as_str()))
            .then_some(())
            .ok_or(format!("{module:?}"))
    })
    .await;

    // The registry goes away, and the pool's policy changes to v3, which no node has.
    cluster.registry.stop();
    releases.configure(&client, &releases.v3, None).await;
    eventually("the canary waits for the registry", &logs, || async {
        let (module, rejected, fallback) = policy_of(&nodes, name).await?;
        let waiting = fallback == ("False".into(), "WaitingForRegistry".into());
        (waiting && rejected.is_none() && module.as_deref() == Some(v1.as_str()))
            .then_some(())
            .ok_or(format!("{module:?} {rejected:?} {fallback:?}"))
    })
    .await;
    let (_, degraded, _) = rollout_of(&pools.get("worker").await.unwrap());
    assert!(
        degraded.is_empty(),
        "a registry away holds nothing: {degraded}"
    );

    // Back: the recheck takes v3.
    cluster.registry.restart();
    eventually(
        "the node takes v3 once the registry is back",
        &logs,
        || async {
            let (module, rejected, _) = policy_of(&nodes, name).await?;
            (module.as_deref() == Some(v3.as_str()) && rejected.is_none())
                .then_some(())
                .ok_or(format!("{module:?} {rejected:?}"))
        },
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
    eventually(
        "the module no trusted key vouches for is retired",
        &logs,
        || async {
            let (module, rejected, _) = policy_of(&nodes, name).await?;
            let default = module.as_deref() == Some(pinset_policy::EMBEDDED_DEFAULT_NAME);
            (default && rejected.as_deref() == Some("SignatureRefused"))
                .then_some(())
                .ok_or(format!("{module:?} {rejected:?}"))
        },
    )
    .await;
}
