//! pinset's test bed (a dev-dependency only): a real registry (`docker-registry` from Debian) on
//! loopback, OCI images built here — tar layers of chosen sizes with random content — pushed
//! through the registry's HTTP API, a real containerd ([`Containerd`]), a real API server
//! ([`apiserver::ApiServer`]) with the core API's Nodes in front of it ([`core_api`]), and
//! every policy of the workspace built for Wasm, the test-only
//! ones included ([`policy_path`]). No docker, no downloads.
//!
//! A test that needs the bed calls [`Registry::start`] (or [`Containerd::start`], …): where the
//! binary is missing it panics, naming what did not start — the bed is mandatory. Only a
//! developer's quick loop may skip those tests, by asking: with `PINSET_SKIP_BED=1` they return
//! `None` after a loud message (`scripts/test.sh` refuses the variable).
//!
//! May depend on every pinset crate; nothing but tests and benchmarks may depend on it, so
//! nothing test-only is built into `pinset`.

pub mod apiserver;
pub mod core_api;
mod costly;
pub use costly::costly_component;
pub mod hostile;
pub mod procfs;
pub mod rbac;
mod wait;
pub use wait::{poll_until, wait_for};

use pinset_registry::Client;
use pinset_registry::mirrors::Endpoint;
use pinset_registry::oci::{Descriptor, ImageManifest, OCI_CONFIG, OCI_INDEX, OCI_MANIFEST};
use sha2::{Digest, Sha256};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

/// Whether the bed is mandatory: always, unless `PINSET_SKIP_BED` is set (to anything but `0`).
pub fn bed_required() -> bool {
    std::env::var_os("PINSET_SKIP_BED").is_none_or(|v| v == "0")
}

/// A part of the bed is missing: fail, naming it, or skip loudly where skipping was asked for.
pub fn skip_or_fail(what: &str) {
    if bed_required() {
        panic!(
            "test bed: {what} (scripts/test.sh installs the bed; PINSET_SKIP_BED=1 skips the tests \
             that need it)"
        );
    }
    eprintln!("\n*** SKIPPING (PINSET_SKIP_BED): test bed unavailable: {what} ***\n");
}

/// wasm-pkg-tools' `wkg` (scripts/test.sh installs it under /opt/pinset-bed/wkg): the real tool
/// policy artifacts interoperate with. `$PINSET_WKG` names another.
pub fn wkg() -> Option<PathBuf> {
    let found = std::env::var_os("PINSET_WKG")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/opt/pinset-bed/wkg/bin/wkg")])
        .find(|p| p.exists());
    if found.is_none() {
        skip_or_fail("wkg is not installed");
    }
    found
}

/// A loopback HTTP server that answers every request with `status`, `content_type` and `body`
/// (a registry or token service that misbehaves in ways a real one cannot be made to); its
/// address. It lives as long as the test process; each answer closes its connection.
pub fn answering(status: &'static str, content_type: &'static str, body: &'static str) -> String {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.read(&mut [0u8; 4096]);
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// A loopback port nothing listens on, for a process a test starts. Taken below Linux's
/// ephemeral range (32768–60999), where outgoing connections never land, and handed out once per
/// test process: a port the kernel assigns (`bind :0`) is free only until the listener closes,
/// and under parallel tests an outgoing connection or another test took it before the process
/// bound it ("Address already in use").
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Test binaries run one after another: each starts at its own offset.
    let start = std::process::id() * 7919 % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free port left in {FIRST}..{}", FIRST + SPAN);
        let port = (FIRST + (start + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A `docker-registry` serving on 127.0.0.1 with storage in a temporary directory. Stopped (by
/// PID) when dropped, whatever the test's outcome.
pub struct Registry {
    pub host: String,
    /// The process; replaced when it restarts (a test stops and restarts it while it shares
    /// the registry).
    child: std::sync::Mutex<Child>,
    binary: PathBuf,
    config: PathBuf,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// A reference by digest to an image this registry does not hold.
    pub fn missing_image(&self) -> String {
        format!("{}/pinset/missing@sha256:{}", self.host, "0".repeat(64))
    }

    pub fn start() -> Option<Registry> {
        Self::start_with("")
    }

    /// A registry with `extra` appended to its configuration (YAML), e.g. an `auth:` section.
    pub fn start_with(extra: &str) -> Option<Registry> {
        let binary = ["/usr/bin/docker-registry", "/usr/sbin/docker-registry"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists());
        let Some(binary) = binary else {
            skip_or_fail("docker-registry is not installed");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  delete: {{enabled: true}}\nhttp:\n  addr: 127.0.0.1:{port}\n{extra}",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = spawn_registry(&binary, &config);
        let host = format!("127.0.0.1:{port}");
        let registry = Registry {
            host,
            child: std::sync::Mutex::new(child),
            binary,
            config,
            _dir: dir,
        };
        registry.wait_ready();
        Some(registry)
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&self.host).is_err() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {} within 30 s",
                self.host
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop serving (kill by PID); the storage is kept for [`Registry::restart`].
    pub fn stop(&self) {
        reap(&mut self.child.lock().expect("the registry's process"));
    }

    /// Serve again on the same address with the same storage.
    pub fn restart(&self) {
        let mut child = self.child.lock().expect("the registry's process");
        reap(&mut child);
        *child = spawn_registry(&self.binary, &self.config);
        drop(child);
        self.wait_ready();
    }

    pub fn pid(&self) -> u32 {
        self.child.lock().expect("the registry's process").id()
    }

    /// The registry's log so far: its access log names every request it served
    /// (`"GET /v2/… HTTP/1.1" 200`).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.config.with_file_name("registry.log")).unwrap_or_default()
    }

    /// The requests of the access log for `/v2/` paths other than the API probe.
    pub fn requests(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains("\"GET /v2/") || l.contains("\"HEAD /v2/"))
            .filter(|l| !l.contains(" /v2/ "))
            .map(String::from)
            .collect()
    }

    /// The registry's storage (its filesystem driver's root): what a test tampers with to play
    /// a registry serving damaged blobs.
    pub fn storage(&self) -> PathBuf {
        self._dir.path().join("data")
    }

    /// pinset's registry client, speaking plain HTTP to this registry.
    pub fn client(&self) -> std::sync::Arc<Client> {
        std::sync::Arc::new(Client::new(vec![self.host.clone()], Default::default()))
    }
}

/// docker-registry with its output (errors and the access log of every request) appended to
/// `registry.log` beside its configuration.
fn spawn_registry(binary: &std::path::Path, config: &std::path::Path) -> Child {
    let mut command = Command::new(binary);
    command.args(["serve", config.to_str().unwrap()]);
    spawn_logged(&mut command, &config.with_file_name("registry.log"))
}

/// Start `command` with its output (stdout and stderr) appended to the file `log`.
pub fn spawn_logged(command: &mut Command, log: &std::path::Path) -> Child {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let out = file.try_clone().expect("the log file, again");
    command
        .stdout(out)
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("start {:?}: {e}", command.get_program()))
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Ok(child) = self.child.get_mut() {
            reap(child);
        }
    }
}

/// Kill a child process and wait for it, so that it leaves no zombie (it may have ended).
pub fn reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A scratch directory named `PREFIX…` (removed when dropped).
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("a scratch directory {prefix}…: {e}"))
}

/// A scratch directory holding a file `name` of `contents`: the directory (removed when
/// dropped) and the file's path.
pub fn scratch_file(name: &str, contents: impl AsRef<[u8]>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    (dir, path)
}

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// An uncompressed tar holding one file `name` with `content` (ustar format).
pub fn tar_layer(name: &str, content: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |buf: &mut [u8], v: u64| {
        let s = format!("{:0width$o}\0", v, width = buf.len() - 1);
        buf.copy_from_slice(s.as_bytes());
    };
    octal(&mut header[100..108], 0o644);
    octal(&mut header[108..116], 0);
    octal(&mut header[116..124], 0);
    octal(&mut header[124..136], content.len() as u64);
    octal(&mut header[136..148], 0);
    header[148..156].copy_from_slice(b"        ");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    let sum: u32 = header.iter().map(|&b| b as u32).sum();
    let s = format!("{sum:06o}\0 ");
    header[148..156].copy_from_slice(s.as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(content);
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

pub fn sha256(data: &[u8]) -> String {
    format!(
        "sha256:{}",
        Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// A layer of about `size` bytes of random content.
pub fn layer(seed: u64, size: usize) -> Vec<u8> {
    tar_layer(
        &format!("data-{seed}.bin"),
        &random_bytes(seed, size.saturating_sub(1536)),
    )
}

/// What a push in the bed may take (a bench pushes 256 MiB layers).
const PUSH: Duration = Duration::from_secs(600);

/// Push an image of `layers` to `repo` for `arch` (its tag); returns its manifest digest and the
/// pushed manifest (whose layer sizes are what a registry reports).
pub async fn push_image(
    client: &Client,
    registry: &str,
    repo: &str,
    arch: &str,
    layers: &[Vec<u8>],
) -> (String, ImageManifest) {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("\"{}\"", sha256(l)))
        .collect();
    let config = format!(
        r#"{{"architecture":"{arch}","os":"linux","config":{{"Cmd":["/data"]}},"rootfs":{{"type":"layers","diff_ids":[{}]}}}}"#,
        diff_ids.join(",")
    );
    let layers: Vec<(&str, &[u8])> = layers.iter().map(|l| (LAYER_MEDIA_TYPE, &l[..])).collect();
    let target = (registry, repo, arch);
    push_oci_image(client, target, config.as_bytes(), &layers).await
}

/// Push the blobs `config` and `layers` (media type, bytes) and their OCI manifest to
/// (registry, repo, tag): the manifest's digest and the manifest.
pub async fn push_oci_image(
    client: &Client,
    (registry, repo, tag): (&str, &str, &str),
    config: &[u8],
    layers: &[(&str, &[u8])],
) -> (String, ImageManifest) {
    let endpoint = Endpoint::source(registry, repo);
    for blob in layers.iter().map(|(_, b)| *b).chain([config]) {
        client
            .push_blob(&endpoint, blob.to_vec().into(), PUSH)
            .await
            .unwrap_or_else(|e| panic!("push a blob to {registry}/{repo}: {e}"));
    }
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.into()),
        config: Descriptor::of(OCI_CONFIG, config),
        layers: layers.iter().map(|(t, l)| Descriptor::of(t, l)).collect(),
        annotations: None,
    };
    let body = serde_json::to_vec(&manifest).unwrap();
    let digest = client
        .push_manifest(&endpoint, tag, OCI_MANIFEST, body.into(), PUSH)
        .await
        .unwrap_or_else(|e| panic!("push {registry}/{repo}:{tag}: {e}"));
    (digest, manifest)
}

/// Push an index of (architecture, manifest digest, manifest size) entries, tagged `index`;
/// returns its digest.
pub async fn push_index(
    client: &Client,
    registry: &str,
    repo: &str,
    entries: &[(&str, String, i64)],
) -> String {
    let manifests: Vec<serde_json::Value> = entries
        .iter()
        .map(|(arch, digest, size)| {
            serde_json::json!({
                "mediaType": OCI_MANIFEST,
                "digest": digest,
                "size": size,
                "platform": {"architecture": arch, "os": "linux"},
            })
        })
        .collect();
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": manifests,
    }))
    .unwrap();
    client
        .push_manifest(
            &Endpoint::source(registry, repo),
            "index",
            OCI_INDEX,
            index.into(),
            PUSH,
        )
        .await
        .unwrap_or_else(|e| panic!("push index {registry}/{repo}: {e}"))
}

/// The size of the manifest `digest` as the registry serves it.
pub async fn manifest_size(client: &Client, registry: &str, repo: &str, digest: &str) -> i64 {
    let fetched = client
        .manifest(&Endpoint::source(registry, repo), digest, PUSH)
        .await
        .unwrap_or_else(|e| panic!("fetch manifest {registry}/{repo}@{digest}: {e}"));
    fetched.body.len() as i64
}

/// Where the test bed keeps containerd (see `tests/bed/fetch-containerd.sh`).
pub fn containerd_binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("PINSET_CONTAINERD").map(PathBuf::from),
        Some(PathBuf::from(
            "/opt/pinset-bed/containerd/usr/bin/containerd",
        )),
    ];
    candidates.into_iter().flatten().find(|p| p.exists())
}

/// containerd with its CRI plugin on a unix socket in a temporary directory, pulling from
/// `registry` over plain HTTP (`hosts.toml`). Stopped by PID when dropped.
pub struct Containerd {
    pub socket: PathBuf,
    child: Child,
    binary: PathBuf,
    config: PathBuf,
    dir: tempfile::TempDir,
}

impl Containerd {
    pub fn start(registry: &str) -> Option<Containerd> {
        Self::start_with_root_limit(registry, None)
    }

    /// containerd whose root (content store and snapshots) is a tmpfs of `limit` bytes when
    /// given, so that pulls can fill it up.
    pub fn start_with_root_limit(registry: &str, limit: Option<u64>) -> Option<Containerd> {
        let hosts = format!(
            "server = \"http://{registry}\"\n\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        Self::start_with_hosts(&[(registry, &hosts)], limit)
    }

    /// containerd whose registry hosts directory holds `(host directory, hosts.toml)` files.
    pub fn start_with_hosts(hosts: &[(&str, &str)], limit: Option<u64>) -> Option<Containerd> {
        let Some(binary) = containerd_binary() else {
            skip_or_fail("containerd 1.7 is not installed (tests/bed/fetch-containerd.sh)");
            return None;
        };
        let dir = scratch_dir("pinset-containerd-");
        let d = dir.path();
        for (host, text) in hosts {
            let host_dir = d.join("certs.d").join(host);
            std::fs::create_dir_all(&host_dir).unwrap();
            std::fs::write(host_dir.join("hosts.toml"), text).unwrap();
        }
        if let Some(bytes) = limit {
            let root = d.join("root");
            std::fs::create_dir_all(&root).unwrap();
            let mounted = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
                .arg(&root)
                .status()
                .is_ok_and(|s| s.success());
            if !mounted {
                skip_or_fail(
                    "cannot mount a size-limited tmpfs for containerd's root (needs root)",
                );
                return None;
            }
        }
        let socket = d.join("containerd.sock");
        let config = d.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n[grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"{certs}\"\n",
                root = d.join("root").display(),
                state = d.join("state").display(),
                sock = socket.display(),
                certs = d.join("certs.d").display(),
            ),
        )
        .unwrap();
        let child = spawn_containerd(&binary, &config, d);
        let c = Containerd {
            socket,
            child,
            binary,
            config,
            dir,
        };
        c.wait_ready();
        Some(c)
    }

    /// Until containerd's CRI image service answers: its socket accepts connections before the
    /// CRI plugin has started, and calls until then fail with "server is not initialized yet".
    /// A minute: a deadline, not a wait — on two cores with four tests starting their beds at
    /// once, 15 s left little margin.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let endpoint = self.endpoint();
        // On a thread of its own: this may be called from inside a test's async runtime.
        let answered = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a test runtime");
            runtime.block_on(cri_answers(endpoint, deadline))
        })
        .join()
        .expect("the readiness probe does not panic");
        if let Err(last) = answered {
            panic!(
                "containerd's CRI did not answer on {} within 60 s ({last}): {}",
                self.socket.display(),
                self.log()
            );
        }
    }

    /// Kill containerd (by PID) and start it again on the same socket, root and state.
    pub fn restart(&mut self) {
        reap(&mut self.child);
        let _ = std::fs::remove_file(&self.socket);
        self.child = spawn_containerd(&self.binary, &self.config, self.dir.path());
        self.wait_ready();
    }

    /// Its registry hosts directory (`config_path`): `HOST/hosts.toml` files.
    pub fn hosts_dir(&self) -> PathBuf {
        self.dir.path().join("certs.d")
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// containerd's own client, `ctr`, on this containerd's socket and `namespace`.
    pub fn ctr(&self, namespace: &str) -> Command {
        let mut c = Command::new(self.binary.with_file_name("ctr"));
        c.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", namespace]);
        c
    }
}

/// Ask `ListImages` on `endpoint` every 20 ms until it answers (the last failure when `deadline`
/// passes first).
async fn cri_answers(endpoint: String, deadline: Instant) -> Result<(), String> {
    use pinset_node::cri::client::{CriClient, CriConfig};
    let client = CriClient::new(CriConfig {
        endpoint,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    loop {
        match client.list_images().await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e.to_string()),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

fn spawn_containerd(
    binary: &std::path::Path,
    config: &std::path::Path,
    dir: &std::path::Path,
) -> Child {
    // The shim (containerd-shim-runc-v2) lies beside containerd; runc is Debian's (/usr/sbin).
    let bin_dir = binary.parent().unwrap();
    let path = format!(
        "{}:/usr/sbin:/usr/bin:/sbin:/bin:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new(binary);
    command
        .args(["--config", config.to_str().unwrap()])
        .env("PATH", path);
    spawn_logged(&mut command, &dir.join("containerd.log"))
}

impl Drop for Containerd {
    fn drop(&mut self) {
        reap(&mut self.child);
        let root = self.dir.path().join("root");
        // A size-limited root is a tmpfs mount: unmount it (lazily: snapshot mounts may linger)
        // before the directory is removed. Without one, `umount` fails harmlessly.
        let _ = Command::new("umount")
            .args(["-R", "-l"])
            .arg(&root)
            .stderr(Stdio::null())
            .status();
    }
}

/// The registry's name for this machine's architecture.
pub fn arch() -> &'static str {
    if std::env::consts::ARCH == "aarch64" {
        "arm64"
    } else {
        "amd64"
    }
}

/// A Ready node with `node-role.kubernetes.io/<role>` and 100 GiB allocatable.
pub fn node(role: &str) -> pinset_core::desired::NodeInfo {
    pinset_core::desired::NodeInfo {
        name: format!("{role}-0"),
        labels: [(format!("node-role.kubernetes.io/{role}"), String::new())].into(),
        ready: true,
        disk_pressure: false,
        allocatable_ephemeral_bytes: Some(100 << 30),
    }
}

/// What `node` wants of one set, `name`, of `refs` for the nodes of `role`, in the standard
/// pools.
pub fn desired_for(
    node: &pinset_core::desired::NodeInfo,
    role: &str,
    name: &str,
    refs: &[String],
) -> pinset_core::desired::Desired {
    use pinset_core::desired;
    let set = desired::PinnedImageSet::for_role(name, role, refs);
    desired::desired(node, &desired::standard_pools(), &[set])
}

/// The embedded default policy, compiled.
pub fn default_policy() -> pinset_policy::PolicyModule {
    let wasm = pinset_policy::WasmRuntime::new().unwrap();
    wasm.load(
        "embedded:default",
        pinset_policy::EMBEDDED_DEFAULT,
        None,
        pinset_policy::Limits::default(),
    )
    .unwrap()
}

/// The decisions of one reconcile with `policy`, as the agent makes them: a fresh instance,
/// guarded.
pub fn decisions(
    policy: &pinset_policy::PolicyModule,
) -> Box<dyn pinset_core::decisions::Decisions> {
    Box::new(pinset_policy::Guarded::of(policy))
}

/// The decisions of one reconcile with the embedded default policy (compiled once).
pub fn default_decisions() -> Box<dyn pinset_core::decisions::Decisions> {
    static DEFAULT: std::sync::OnceLock<pinset_policy::PolicyModule> = std::sync::OnceLock::new();
    decisions(DEFAULT.get_or_init(default_policy))
}

/// A reconcile cancelled `settle` after its `n`th pull started: its report, and how long after
/// the cancellation it returned (`None`: fewer than `n` pulls started, nothing was cancelled).
pub async fn reconcile_cancelled<S, B>(
    reconciler: &pinset_node::Reconciler<S, B>,
    (desired, node): (
        &pinset_core::desired::Desired,
        &pinset_core::desired::NodeInfo,
    ),
    decisions: Box<dyn pinset_core::decisions::Decisions>,
    status: &mut pinset_core::status::NodeStatus,
    (n, settle): (usize, Duration),
) -> (pinset_node::Report, Option<Duration>)
where
    S: pinset_registry::size::Sizer + 'static,
    B: pinset_node::pin::PinBackend,
{
    let cancel = tokio_util::sync::CancellationToken::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let trigger = cancel.clone();
    let cancelled_at = tokio::spawn(async move {
        let mut started = 0;
        while let Some(e) = rx.recv().await {
            if matches!(e, pinset_node::executor::Event::Started { .. }) {
                started += 1;
                if started == n {
                    tokio::time::sleep(settle).await;
                    trigger.cancel();
                    return Some(Instant::now());
                }
            }
        }
        None
    });
    let report = reconciler
        .reconcile(desired, node, decisions, status, cancel, Some(tx))
        .await
        .expect("a cancelled reconcile returns its report");
    let returned = Instant::now();
    let at = cancelled_at.await.expect("the cancelling task");
    (report, at.map(|at| returned.duration_since(at)))
}

/// The misbehaviours of the test-only hostile policy that must not cost pinset anything but a
/// fallback: printing, panicking, waiting through WASI, probing WASI, flooding or forging the
/// log, a giant reason (chosen by the node label `pinset.test/hostile`).
pub const HOSTILE_MODES: [&str; 8] = [
    "trap",
    "stderr",
    "stdout",
    "sleep",
    "probe",
    "log-flood",
    "log-forge",
    "giant-reason",
];

/// Where the workspace's policy components are built.
pub fn policy_dir() -> PathBuf {
    PathBuf::from(env!("PINSET_WASM_POLICY_DIR"))
}

/// Logs of the code under test to stderr, filtered by `filter` (tracing EnvFilter syntax); kube's
/// client only when the filter names it, as `pinset` does.
pub fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(pinset_k8s::quiet_client(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(pinset_k8s::quiet_client("warn")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// A component built from the workspace (`policies/*` and `tests/policies/*`), by file stem,
/// e.g. `pinset_test_policy_hostile`.
pub fn policy_path(stem: &str) -> PathBuf {
    let path = PathBuf::from(env!("PINSET_WASM_POLICY_DIR")).join(format!("{stem}.wasm"));
    if stem == "pinset_policy_default" {
        write_embedded_default(&path);
    }
    path
}

/// The default policy is built once, by `pinset-policy`, which embeds it: its bytes are written
/// beside the other components (once per test process; a temporary file renamed into place, so
/// concurrent test processes never read a partial file).
fn write_embedded_default(path: &std::path::Path) {
    static WRITTEN: std::sync::Once = std::sync::Once::new();
    WRITTEN.call_once(|| {
        let bytes = pinset_policy::EMBEDDED_DEFAULT;
        if std::fs::read(path).is_ok_and(|on_disk| on_disk == bytes) {
            return;
        }
        let dir = path.parent().expect("the components directory");
        let mut tmp = tempfile::NamedTempFile::new_in(dir).unwrap();
        std::io::Write::write_all(&mut tmp, bytes).unwrap();
        tmp.persist(path).unwrap();
    });
}

/// One reconcile of `desired` on `node` with the default policy, never cancelled, its events
/// sent to `events` when given.
pub async fn reconcile_default<S, B>(
    reconciler: &pinset_node::Reconciler<S, B>,
    desired: &pinset_core::desired::Desired,
    node: &pinset_core::desired::NodeInfo,
    status: &mut pinset_core::status::NodeStatus,
    events: Option<tokio::sync::mpsc::UnboundedSender<pinset_node::executor::Event>>,
) -> Result<pinset_node::Report, pinset_node::ReconcileError>
where
    S: pinset_registry::size::Sizer + 'static,
    B: pinset_node::pin::PinBackend,
{
    let cancel = tokio_util::sync::CancellationToken::new();
    let decisions = default_decisions();
    reconciler
        .reconcile(desired, node, decisions, status, cancel, events)
        .await
}

/// The bed wired as a node agent would be: CRI and pins on containerd's socket, sizes from the
/// registry when `sizing`, the given retry schedule, no pressure.
pub fn reconciler(
    containerd: &Containerd,
    registry: &str,
    backoff: pinset_node::executor::Backoff,
    sizing: bool,
) -> pinset_node::Reconciler<
    pinset_registry::size::RegistrySizer,
    pinset_node::pin::containerd::ContainerdPins,
> {
    let credentials = std::sync::Arc::new(pinset_registry::auth::Credentials::default());
    reconciler_with(containerd, registry, backoff, sizing, credentials)
}

/// [`reconciler`] with these registry credentials, for pulls and sizes alike.
pub fn reconciler_with(
    containerd: &Containerd,
    registry: &str,
    backoff: pinset_node::executor::Backoff,
    sizing: bool,
    credentials: std::sync::Arc<pinset_registry::auth::Credentials>,
) -> pinset_node::Reconciler<
    pinset_registry::size::RegistrySizer,
    pinset_node::pin::containerd::ContainerdPins,
> {
    use pinset_registry::size::{Cached, RegistrySizer};
    use std::sync::Arc;
    let endpoint = containerd.endpoint();
    let cri = pinset_node::cri::client::CriClient::new(pinset_node::cri::client::CriConfig {
        endpoint: endpoint.clone(),
        ..Default::default()
    })
    .unwrap();
    let pins = pinset_node::pin::containerd::ContainerdPins::new(&endpoint).unwrap();
    let mut reconciler = pinset_node::Reconciler::new(cri, pins)
        .with_credentials(credentials.clone())
        .with_backoff(backoff)
        .with_pressure(pinset_policy_sdk::Pressure::default);
    if sizing {
        reconciler = reconciler.with_sizer(Arc::new(Cached::new(RegistrySizer::new(
            vec![registry.to_string()],
            credentials,
        ))));
    }
    reconciler
}

/// Push `count` images of one random layer of about `layer_bytes` each; their digest references.
pub async fn push_images(
    registry: &Registry,
    prefix: &str,
    count: usize,
    layer_bytes: usize,
    seed: u64,
) -> Vec<String> {
    let client = registry.client();
    let mut refs = Vec::with_capacity(count);
    for i in 0..count {
        let repo = format!("pinset/{prefix}{i}");
        let l = layer(seed + i as u64, layer_bytes);
        let (digest, _) = push_image(&client, &registry.host, &repo, arch(), &[l]).await;
        refs.push(format!("{}/{repo}@{digest}", registry.host));
    }
    refs
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}
