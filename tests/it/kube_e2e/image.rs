use super::*;

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
    support::assert_says(
        &stdout,
        &[
            "policy contracts pinset:policy/decisions@",
            " pinset:fleet/rollout@",
        ],
    );
}

/// The agent, run from the image as the DaemonSet runs it — no --cri, no --pin (the runtime's
/// socket found at /run/containerd/containerd.sock and asked which runtime it is), the drop-in
/// directory, a kubeconfig and its node's facts bind-mounted — pins a set of the bed's registry
/// and reports it pinned through the real API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_from_the_image_pins_a_set() {
    let Some((cluster, runtime, refs, nodes, _)) = release_bed("img", 3, 900).await else {
        return;
    };
    let Some(reference) = import_image(&runtime) else {
        return;
    };
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
    node_settles(
        &nodes,
        "cp-0",
        &[("release", 1)],
        "the node reports the set pinned",
        &logs,
    )
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
