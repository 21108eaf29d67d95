//! What the integration tests share: the test bed of `pinset-testkit`, and the `pinset` binary
//! of this package (only its own tests know where cargo built it).

#![allow(dead_code, unused_imports)]

pub use pinset_testkit::*;

use pinset_registry::mirrors::Endpoint;
use pinset_registry::oci::{Descriptor, ImageManifest, OCI_CONFIG, OCI_MANIFEST};
use std::process::Command;
use std::time::Duration;

/// The `pinset` binary cargo built for these tests.
pub const PINSET: &str = env!("CARGO_BIN_EXE_pinset");

/// Assert that `text` (a command's output, an error, a document) says each of `phrases`; a
/// failure lists the phrases missing and shows the whole text.
#[track_caller]
pub fn assert_says(text: &str, phrases: &[&str]) {
    let missing: Vec<&str> = phrases
        .iter()
        .copied()
        .filter(|p| !text.contains(p))
        .collect();
    assert!(missing.is_empty(), "missing {missing:?} in:\n{text}");
}

#[test]
fn assert_says_names_what_is_missing() {
    assert_says("pulled 3, pinned 3", &["pulled 3", "pinned 3"]);
    let missed = std::panic::catch_unwind(|| assert_says("pulled 3", &["pulled", "pinned", "3"]))
        .expect_err("a phrase is missing");
    let said = missed.downcast_ref::<String>().unwrap();
    assert_eq!(said, "missing [\"pinned\"] in:\npulled 3");
}

/// Run the `pinset` binary with `args`: (exit code, stdout, stderr).
pub fn pinset(args: &[&str]) -> (i32, String, String) {
    pinset_with(args, &[])
}

/// [`pinset`] with these environment variables too.
pub fn pinset_with(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = without_terminal(Command::new(PINSET).args(args))
        .env("PINSET_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .expect("run pinset");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`pinset`] off the async runtime's threads (a command may block for seconds).
pub async fn pinset_blocking(args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        pinset(&args)
    })
    .await
    .expect("pinset ran")
}

/// `pinset rollout status worker --timeout TIMEOUT --timeline SVG` as `kubeconfig`'s user, to
/// follow the pool's rollout to its end (its output for the caller to take).
pub fn follow_worker_rollout(
    kubeconfig: &std::path::Path,
    timeout: &str,
    svg: &std::path::Path,
) -> Command {
    let mut command = Command::new(PINSET);
    command
        .args(["rollout", "status", "worker", "--timeout", timeout])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--timeline")
        .arg(svg)
        .env("PINSET_LOG", "warn");
    command
}

/// `pinset plan --sets SETS --node NODE -o json EXTRA…`, which must succeed: the plan.
pub async fn plan_json(
    sets: &std::path::Path,
    node: &std::path::Path,
    extra: &[&str],
) -> serde_json::Value {
    let mut args = vec![
        "plan".to_string(),
        "--sets".into(),
        sets.display().to_string(),
    ];
    args.extend(["--node".into(), node.display().to_string()]);
    args.extend(["-o", "json"].iter().chain(extra).map(|a| a.to_string()));
    let (code, out, err) = pinset_blocking(args).await;
    assert_eq!(code, 0, "pinset plan: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("pinset plan -o json: {e}: {out}"))
}

/// `command` run in a session of its own, without a controlling terminal: what it would ask
/// on one (a key's password) it must take from its arguments or environment, as in CI.
pub fn without_terminal(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    }
}

/// The bars of a timeline's `.trace.json` (next to `svg`), by start: (start µs, end µs, what
/// the bar is of — an image, or a rollout's node —, its kind: `pull`, `failed`, …).
pub fn timeline_bars(svg: &std::path::Path) -> Vec<(f64, f64, String, String)> {
    let text = std::fs::read_to_string(svg.with_extension("trace.json")).unwrap();
    let trace: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut bars: Vec<_> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let start = e["ts"].as_f64().unwrap();
            (
                start,
                start + e["dur"].as_f64().unwrap(),
                e["args"]["image"].as_str().unwrap().to_string(),
                e["cat"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    bars.sort_by(|a, b| a.0.total_cmp(&b.0));
    bars
}

/// `n` image references by digest, `registry.test/{repo}/1@sha256:…` onwards.
pub fn digests(repo: &str, n: usize) -> Vec<String> {
    (1..=n)
        .map(|i| format!("registry.test/{repo}/{i}@sha256:{i:064x}"))
        .collect()
}

/// A PinnedImageSet of the worker role as YAML, at `generation` when given.
pub fn set_yaml(name: &str, generation: Option<i64>, refs: &[String]) -> String {
    let generation = generation.map_or(String::new(), |g| format!("  generation: {g}\n"));
    let mut s = format!(
        "apiVersion: machineconfiguration.openshift.io/v1\nkind: PinnedImageSet\nmetadata:\n  \
         name: {name}\n{generation}  labels: {{machineconfiguration.openshift.io/role: worker}}\n\
         spec:\n  pinnedImages:\n"
    );
    for r in refs {
        s.push_str(&format!("    - name: {r}\n"));
    }
    s
}

/// A Ready worker Node `w1` with 50Gi of ephemeral storage as YAML; `labels` are more labels
/// (`key: value, …`), or empty.
pub fn worker_yaml(labels: &str) -> String {
    let more = if labels.is_empty() {
        String::new()
    } else {
        format!(", {labels}")
    };
    format!(
        "kind: Node\nmetadata: {{name: w1, labels: {{node-role.kubernetes.io/worker: ''{more}}}}}\n\
         status:\n  allocatable: {{ephemeral-storage: 50Gi}}\n  conditions: [{{type: Ready, \
         status: 'True'}}]\n"
    )
}

/// A worker node as `pinset node` meets it: its Node and sets in files, and the in-process CRI
/// service (a real gRPC server on a unix socket) able to pull `images` (1 MiB each), pins in a
/// CRI-O drop-in directory. The server stops when this is dropped.
pub struct SimNode {
    pub dir: tempfile::TempDir,
    pub sets: std::path::PathBuf,
    pub node: std::path::PathBuf,
    pub dropins: std::path::PathBuf,
    pub sim: pinset_cri_sim::SimulatedRuntime,
    pub server: pinset_cri_sim::SimServer,
}

impl SimNode {
    /// The node's files (`node_labels` as [`worker_yaml`]) and its runtime, serving on `rt`;
    /// `prepare` runs before it serves (faults injected, images preloaded).
    pub fn start(
        rt: &tokio::runtime::Runtime,
        images: &[String],
        node_labels: &str,
        prepare: impl FnOnce(&pinset_cri_sim::SimulatedRuntime),
    ) -> Self {
        use pinset_cri_sim::{SimConfig, SimulatedRuntime};
        let dir = tempfile::tempdir().unwrap();
        let (sets, node) = (dir.path().join("sets.yaml"), dir.path().join("node.yaml"));
        std::fs::write(&node, worker_yaml(node_labels)).unwrap();
        let dropins = dir.path().join("crio.conf.d");
        let drop_in = dropins.join(pinset_node::pin::crio::DROP_IN);
        let sim = SimulatedRuntime::new(SimConfig::uniform(images, 1 << 20, drop_in));
        prepare(&sim);
        let server = rt
            .block_on(sim.serve(&dir.path().join("cri.sock")))
            .unwrap();
        Self {
            dir,
            sets,
            node,
            dropins,
            sim,
            server,
        }
    }

    /// Write the sets file: set `name` of `refs`, at `generation` when given.
    pub fn write_set(&self, name: &str, generation: Option<i64>, refs: &[String]) {
        std::fs::write(&self.sets, set_yaml(name, generation, refs)).unwrap();
    }

    /// `pinset node` on this node: its sets, Node, runtime and drop-ins, CRI-O not reloaded,
    /// no registry sizing.
    pub fn node_args(&self) -> Vec<String> {
        let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
        vec![
            "node".into(),
            "--sets".into(),
            path(&self.sets),
            "--node".into(),
            path(&self.node),
            "--cri".into(),
            self.server.endpoint(),
            "--crio-dropin-dir".into(),
            path(&self.dropins),
            "--crio-reload".into(),
            String::new(),
            "--no-sizing".into(),
        ]
    }
}

/// A registry whose link is down: it accepts connections and never answers. Counts them.
pub struct Dark {
    pub addr: String,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Dark {
    pub fn start() -> Dark {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming().flatten() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(stream);
            }
        });
        Dark { addr, accepted }
    }

    pub fn connections(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

pub const GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const TAR_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// `data` gzipped (the fast level: fixtures, not archives).
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, data).unwrap();
    gz.finish().unwrap()
}

/// Push an image of `layers` (media type, bytes) tagged `tag`; its manifest digest.
pub async fn push_layers(
    client: &pinset_registry::Client,
    registry: &str,
    repo: &str,
    tag: &str,
    layers: &[(&str, Vec<u8>)],
) -> String {
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let layers: Vec<(&str, &[u8])> = layers.iter().map(|(t, l)| (*t, &l[..])).collect();
    push_oci_image(client, (registry, repo, tag), config, &layers)
        .await
        .0
}

/// The benches' repetitions: `REPEATS`, default 5.
pub fn repeats() -> usize {
    repeats_or(5)
}

/// Repetitions of a benchmark: `REPEATS`, else `default`.
pub fn repeats_or(default: usize) -> usize {
    std::env::var("REPEATS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(default)
}

/// A MachineConfigPool `name` for the nodes labelled `node_label`, selecting the sets of `roles`.
pub fn pool(name: &str, roles: &[&str], node_label: &str) -> pinset_k8s::api::MachineConfigPool {
    serde_json::from_value(serde_json::json!({
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

/// A PinnedImageSet `name` of `images` for role `role`, as the JSON an operator writes (the
/// server may refuse it: the tests of its validation send it as it is).
pub fn set_json(name: &str, role: &str, images: &[String]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "PinnedImageSet",
        "metadata": {"name": name, "labels": {"machineconfiguration.openshift.io/role": role}},
        "spec": {"pinnedImages": images.iter().map(|n| serde_json::json!({"name": n})).collect::<Vec<_>>()}
    })
}

/// [`set_json`], typed.
pub fn set(name: &str, role: &str, images: &[String]) -> pinset_k8s::api::PinnedImageSet {
    serde_json::from_value(set_json(name, role, images)).unwrap()
}

/// Create pool `name` of the nodes labelled `node-role.kubernetes.io/NAME`, selecting the sets
/// of `roles`.
pub async fn create_pool(client: &kube::Client, name: &str, roles: &[&str]) {
    create_annotated_pool(client, name, roles, &[]).await
}

/// [`create_pool`], the pool annotated with `annotations` (key, value).
pub async fn create_annotated_pool(
    client: &kube::Client,
    name: &str,
    roles: &[&str],
    annotations: &[(&str, &str)],
) {
    let label = format!("node-role.kubernetes.io/{name}");
    let mut pool = pool(name, roles, &label);
    if !annotations.is_empty() {
        let owned = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()));
        pool.metadata.annotations = Some(owned.collect());
    }
    kube::Api::<pinset_k8s::api::MachineConfigPool>::all(client.clone())
        .create(&Default::default(), &pool)
        .await
        .unwrap();
}

/// Create set `name` of `images` for the nodes of `role`.
pub async fn create_set(client: &kube::Client, name: &str, role: &str, images: &[String]) {
    kube::Api::<pinset_k8s::api::PinnedImageSet>::all(client.clone())
        .create(&Default::default(), &set(name, role, images))
        .await
        .unwrap();
}

/// The labels of a node with these roles.
pub fn roles(roles: &[&str]) -> Vec<(String, String)> {
    roles
        .iter()
        .map(|r| (format!("node-role.kubernetes.io/{r}"), String::new()))
        .collect()
}

/// `DIR/NAME.yaml`: Node `name` with `labels`, Ready, no disk pressure, 100 Gi of ephemeral
/// storage (`--node-file`).
pub fn node_file(
    dir: &std::path::Path,
    name: &str,
    labels: &[(String, String)],
) -> std::path::PathBuf {
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

/// A two-platform image `repo` on `registry`: this machine's platform with layer `mine`, the
/// other (amd64 or arm64) with `theirs`, the other listed first; the index's digest.
pub async fn push_two_platforms(
    client: &pinset_registry::Client,
    registry: &str,
    repo: &str,
    mine: Vec<u8>,
    theirs: Vec<u8>,
) -> String {
    let other = if arch() == "amd64" { "arm64" } else { "amd64" };
    let (mine, _) = push_image(client, registry, repo, arch(), &[mine]).await;
    let (theirs, _) = push_image(client, registry, repo, other, &[theirs]).await;
    let entries = [(other, theirs, 0), (arch(), mine, 0)];
    push_index(client, registry, repo, &entries).await
}

/// `pinset args`, which must exit 0: its stdout, trimmed.
pub fn pinset_ok(args: &[&str]) -> String {
    let (code, out, err) = pinset(args);
    assert_eq!(code, 0, "pinset {args:?}: {err}");
    out.trim().to_string()
}

/// Push the module `file` to `registry` (plain HTTP) as `repo_tag` with `pinset policy push`;
/// the reference by digest it prints.
pub fn push_policy(registry: &str, file: &std::path::Path, repo_tag: &str) -> String {
    let target = format!("{registry}/{repo_tag}");
    let file = file.to_str().unwrap();
    pinset_ok(&[
        "policy",
        "push",
        file,
        &target,
        "--insecure-registry",
        registry,
    ])
}

/// Sign `reference` on `registry` (plain HTTP) with `key`, whose password is empty.
pub fn sign_policy(registry: &str, reference: &str, key: &std::path::Path) {
    let key = key.to_str().unwrap();
    pinset_ok(&[
        "policy",
        "sign",
        reference,
        "--key",
        key,
        "--insecure-registry",
        registry,
    ]);
}

/// A cosign key pair at `prefix`.key and `prefix`.pub, its password empty: (the private key's
/// path, the public key).
pub fn keygen_empty(prefix: &std::path::Path) -> (std::path::PathBuf, String) {
    let prefix_arg = prefix.to_str().unwrap();
    let empty = "--allow-empty-password";
    pinset_ok(&["policy", "keygen", "--output-key-prefix", prefix_arg, empty]);
    let public = std::fs::read_to_string(prefix.with_extension("pub")).unwrap();
    (prefix.with_extension("key"), public)
}

/// One worker node's world for an agent run as its own process, as deployed: a registry holding
/// `count` images of `bytes` each (`seed` makes them unique), containerd, an API server with
/// Events, pool `worker` and set `set` of those images, and Node `w-0` (a worker) served in
/// front of it ([`core_api::CoreApi`]); [`WorkerBed::agent`] starts `pinset agent` as that node
/// as in a pod. No controller runs in it: the agent pulls without a grant (`--rollout=free`).
pub struct WorkerBed {
    pub registry: Registry,
    pub containerd: Containerd,
    pub server: apiserver::ApiServer,
    pub client: kube::Client,
    pub core: core_api::CoreApi,
    pub dir: tempfile::TempDir,
    /// The agent's flags (no kubeconfig: it finds the API as a pod does).
    pub args: Vec<String>,
}

impl WorkerBed {
    pub async fn start(set: &str, count: usize, bytes: usize, seed: u64) -> Option<WorkerBed> {
        let registry = Registry::start()?;
        let containerd = Containerd::start(&registry.host)?;
        let server = apiserver::ApiServer::start().await?;
        server.install_crds().await;
        server.install_events().await;
        let client = server.client().await;
        let refs = push_images(&registry, set, count, bytes, seed).await;
        create_pool(&client, "worker", &["worker"]).await;
        create_set(&client, set, "worker", &refs).await;
        let dir = tempfile::tempdir().unwrap();
        let identity = core_api::Identity {
            upstream: client.clone(),
            user: "admin".into(),
            groups: vec!["system:masters".into()],
            authorizer: None,
        };
        let core = core_api::CoreApi::start(&server, identity).await;
        core.apply(worker_node("w-0"));
        let args = worker_agent_args(&containerd.endpoint(), &registry.host);
        Some(WorkerBed {
            registry,
            containerd,
            server,
            client,
            core,
            dir,
            args,
        })
    }

    /// `pinset agent` with [`WorkerBed::args`] (more may be added) as in a pod: the API's
    /// address in `KUBERNETES_SERVICE_HOST`/`_PORT`, a service account's token, CA and
    /// namespace at `/var/run/secrets/kubernetes.io/serviceaccount` — in a mount namespace of
    /// its own (`unshare`, as root), over a private `/run` — and no kubeconfig: kube's client
    /// takes its in-cluster configuration, reading no YAML. The process is the agent itself.
    pub fn agent(&self) -> Command {
        let account = self.dir.path().join("serviceaccount");
        std::fs::create_dir_all(&account).unwrap();
        std::fs::copy(self.server.ca_certificate(), account.join("ca.crt")).unwrap();
        std::fs::write(account.join("token"), "a-token-the-bed-does-not-check").unwrap();
        std::fs::write(account.join("namespace"), "pinset").unwrap();
        let home = self.dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let script = "mount -t tmpfs tmpfs /run && mkdir -p \"$SA_DIR\" && cp \"$SA\"/* \"$SA_DIR\" && exec \"$@\"";
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--", "sh", "-c", script, "sh", PINSET])
            .args(&self.args)
            .env("SA", &account)
            .env("SA_DIR", "/run/secrets/kubernetes.io/serviceaccount")
            .env("KUBERNETES_SERVICE_HOST", self.core.addr.ip().to_string())
            .env("KUBERNETES_SERVICE_PORT", self.core.addr.port().to_string())
            .env("HOME", &home)
            .env_remove("KUBECONFIG");
        command
    }
}

/// Worker Node `name` as the core API serves it: Ready, no disk pressure, 100 GiB of ephemeral
/// storage.
pub fn worker_node(name: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name, "labels": {"node-role.kubernetes.io/worker": ""}},
        "status": {
            "allocatable": {"ephemeral-storage": "100Gi"},
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DiskPressure", "status": "False"}
            ]
        }
    })
}

/// The flags of `pinset agent` for worker node `w-0` on the runtime at `cri`, pulling from
/// `registry` over plain HTTP, without waiting for a controller's grants.
pub fn worker_agent_args(cri: &str, registry: &str) -> Vec<String> {
    vec![
        "agent".into(),
        format!("--metrics-addr=127.0.0.1:{}", free_port()),
        "--node-name=w-0".into(),
        format!("--cri={cri}"),
        "--pin=containerd".into(),
        format!("--insecure-registry={registry}"),
        "--rollout=free".into(),
    ]
}

/// The Wasm runtime the test binary shares (an engine is costly to build; modules are not
/// shared between tests).
pub fn wasm_runtime() -> &'static pinset_policy::WasmRuntime {
    static RT: std::sync::OnceLock<pinset_policy::WasmRuntime> = std::sync::OnceLock::new();
    RT.get_or_init(|| pinset_policy::WasmRuntime::new().expect("a Wasm runtime"))
}

/// Loading the component `stem` as a `C` policy, which must fail: the error and its message.
pub fn refused_as<C: pinset_policy::Contract>(stem: &str) -> (pinset_policy::LoadError, String) {
    let path = policy_path(stem);
    let Err(err) = wasm_runtime().load_file_as::<C>(&path, None, pinset_policy::Limits::default())
    else {
        panic!("{stem} loaded as a {} policy", C::ROLE.kind);
    };
    let msg = err.to_string();
    (err, msg)
}

pub const PRIVATE_USER: &str = "AWS";
pub const PRIVATE_PASSWORD: &str = "from-the-plugin";

/// A token service that grants a pull token only to `PRIVATE_USER:PRIVATE_PASSWORD` (basic
/// authentication, as pinset and containerd send it), a push token to anyone (the test's own
/// pushes); it counts what it granted and refused. containerd first POSTs an OAuth form, which this one, like
/// some registries, does not serve (404): containerd then asks with basic authentication.
pub struct TokenService {
    pub addr: String,
    granted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl TokenService {
    pub fn start() -> TokenService {
        use base64::Engine;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let granted: std::sync::Arc<std::sync::atomic::AtomicUsize> = Default::default();
        let refused: std::sync::Arc<std::sync::atomic::AtomicUsize> = Default::default();
        let (g, r) = (granted.clone(), refused.clone());
        let pair = base64::engine::general_purpose::STANDARD
            .encode(format!("{PRIVATE_USER}:{PRIVATE_PASSWORD}"));
        let expected = format!("authorization: basic {pair}");
        // Lives as long as the test process; each answer closes its connection.
        std::thread::spawn(move || {
            use std::io::Write;
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let head = read_head(&mut stream).to_lowercase();
                let status = if head.starts_with("post ") {
                    "404 Not Found"
                } else if head.contains("push") {
                    "200 OK"
                } else if head.lines().any(|l| l.trim() == expected.to_lowercase()) {
                    g.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    "200 OK"
                } else {
                    r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    "401 Unauthorized"
                };
                let body = r#"{"token":"pinset-test","access_token":"pinset-test"}"#;
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        TokenService {
            addr,
            granted,
            refused,
        }
    }

    pub fn granted(&self) -> usize {
        self.granted.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn refused(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A request's line and headers (at most 64 KiB).
fn read_head(stream: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A private registry: the bed's registry behind [`TokenService`], with `count` images of one
/// layer of about `layer_bytes` pushed.
pub struct PrivateRegistry {
    pub tokens: TokenService,
    pub registry: Registry,
    pub refs: Vec<String>,
}

impl PrivateRegistry {
    pub async fn start(count: usize, layer_bytes: usize) -> Option<PrivateRegistry> {
        let tokens = TokenService::start();
        let auth = format!(
            "auth:\n  silly:\n    realm: http://{}/token\n    service: pinset-test\n",
            tokens.addr
        );
        let registry = Registry::start_with(&auth)?;
        let refs = push_images(&registry, "private", count, layer_bytes, 700).await;
        Some(PrivateRegistry {
            tokens,
            registry,
            refs,
        })
    }
}

/// A node's provider configuration for `registry`, its plugin (the shell, as `ecr-login`, its
/// script in its arguments) giving `PRIVATE_USER:PRIVATE_PASSWORD` for it and counting its runs
/// in `runs`; the configuration file, the bin directory and `runs`.
pub fn provider_for(
    registry: &str,
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let runs = dir.join("runs");
    let answer = serde_json::json!({
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderResponse",
        "cacheKeyType": "Registry",
        "cacheDuration": "6h",
        "auth": {registry: {"username": PRIVATE_USER, "password": PRIVATE_PASSWORD}},
    });
    let script = format!(
        "cat >/dev/null; echo run >> {}; printf '%s' '{answer}'",
        runs.display()
    );
    let (config, bin) = provider_running(registry, dir, &script);
    (config, bin, runs)
}

/// A node's provider configuration for `registry` whose plugin, `ecr-login`, runs `script` in
/// the shell: the configuration file and the bin directory.
pub fn provider_running(
    registry: &str,
    dir: &std::path::Path,
    script: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // A link, not a written script: an executable just written may be held open by another
    // test's fork ("text file busy").
    std::os::unix::fs::symlink("/bin/sh", bin.join("ecr-login")).unwrap();
    let config = dir.join("credential-providers.yaml");
    let yaml = format!(
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
         - name: ecr-login\n  matchImages: [{registry:?}]\n  defaultCacheDuration: 12h\n  \
         apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: ['-c', {script:?}]\n"
    );
    std::fs::write(&config, yaml).unwrap();
    (config, bin)
}

pub fn plugin_runs(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}
