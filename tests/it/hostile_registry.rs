//! A registry that misbehaves on purpose (`pinset_testkit::hostile`) driven through the commands
//! that read registries: `plan` and `node` (a node's sizing), `set from-images` (tags), `policy
//! pull` and `policy verify` (artifacts and signatures). Whatever the registry sends, each
//! command stays under 128 MiB of memory and its documented deadline, and says what happened in
//! one line; credentials never leave for another host. The agent and the controller meet the
//! same registry in `kube_e2e` (`a_hostile_policy_registry_stalls_neither_…`).

use crate::support;
use pinset_testkit::hostile::{Hostile, Misbehaviour};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The most memory a command may take, whatever a registry sends.
const MAX_RSS_KIB: i64 = 128 << 10;

/// The fields of `/proc/PID/status` kept at the peak: where the memory went.
const MEMORY_FIELDS: &[&str] = &[
    "VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads",
];

/// What a run of `pinset` did: exit code, output, peak memory (KiB), time.
struct Run {
    code: i32,
    out: String,
    err: String,
    max_rss_kib: i64,
    /// `/proc/PID/status`'s memory and thread lines when the peak was read: where it went.
    at_peak: String,
    took: Duration,
}

/// Run `pinset args`, its peak RSS read from `/proc/PID/status` (`VmHWM`, the high-water mark
/// of the process's own memory since it started: a rusage would also count the test process's
/// memory the child had before its exec) until it exits.
fn measured(args: &[&str]) -> Run {
    let started = Instant::now();
    let mut child = Command::new(support::PINSET)
        .args(args)
        .env("PINSET_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let (pid, mut peak, mut at_peak) = (child.id(), 0, String::new());
    let status = loop {
        let now = support::procfs::status_kib(pid, "VmHWM:");
        if now > peak {
            (peak, at_peak) = (now, support::procfs::status_lines(pid, MEMORY_FIELDS));
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Run {
        code: status.code().unwrap_or(-1),
        out: out.join().unwrap(),
        err: err.join().unwrap(),
        max_rss_kib: peak as i64,
        at_peak,
        took: started.elapsed(),
    }
}

/// `pinset set from-images apps ADDR/team/app:v1 --insecure-registry ADDR EXTRA…`, measured.
fn from_images(addr: &str, extra: &[&str]) -> Run {
    let image = format!("{addr}/team/app:v1");
    let mut args = vec![
        "set",
        "from-images",
        "apps",
        &image,
        "--insecure-registry",
        addr,
    ];
    args.extend(extra);
    measured(&args)
}

/// `pinset plan` of a set of `image` (in `dir`) for `node`, `hostile` an insecure registry,
/// with `extra` flags.
fn plan(dir: &Path, node: &Path, hostile: &Hostile, image: &str, extra: &[&str]) -> Run {
    let sets = dir.join("sets.yaml");
    std::fs::write(&sets, support::set_yaml("apps", None, &[image.to_string()])).unwrap();
    let mut args = vec!["plan", "--sets", sets.to_str().unwrap()];
    args.extend([
        "--node",
        node.to_str().unwrap(),
        "--insecure-registry",
        &hostile.addr,
    ]);
    args.extend(extra);
    measured(&args)
}

impl Run {
    /// The run stayed under [`MAX_RSS_KIB`] and `within`; its peak and time are printed for the
    /// BENCHMARKS table.
    fn assert_bounded(&self, what: &str, within: Duration) {
        // A failure says all the run said, for the next reader to tell where the memory went.
        assert!(
            self.max_rss_kib < MAX_RSS_KIB,
            "{what}: {} KiB in {:?} ({}); stderr: {}",
            self.max_rss_kib,
            self.took,
            self.at_peak,
            self.err
        );
        assert!(
            self.took < within,
            "{what}: {:?}; stderr: {}",
            self.took,
            self.err
        );
        eprintln!("{what}: peak RSS {} KiB, {:?}", self.max_rss_kib, self.took);
    }
}

/// Every way a registry can misbehave that a single server plays.
fn misbehaviours() -> Vec<(&'static str, Misbehaviour)> {
    vec![
        ("an endless chunked body", Misbehaviour::EndlessBody),
        ("a terabyte Content-Length", Misbehaviour::HugeLength),
        ("a byte a second", Misbehaviour::Trickle),
        ("an endless token", Misbehaviour::HugeToken),
        ("a 401 for its own token", Misbehaviour::AuthLoop),
        ("a redirect to itself", Misbehaviour::RedirectLoop),
    ]
}

fn digest() -> String {
    format!("sha256:{}", "a".repeat(64))
}

/// `plan` sizes a set whose image is on the hostile registry: the image is left unsized with the
/// registry and the cause said, within the sizing budget, in bounded memory.
#[test]
fn plan_survives_every_misbehaving_registry() {
    let (dir, node) = support::scratch_file("node.yaml", support::worker_yaml(""));
    for (what, how) in misbehaviours() {
        let hostile = Hostile::start(how);
        let image = format!("{}/team/app@{}", hostile.addr, digest());
        let run = plan(
            dir.path(),
            &node,
            &hostile,
            &image,
            &["--sizing-budget", "8"],
        );
        assert_eq!(run.code, 0, "{what}: {}", run.err);
        assert!(
            run.err.contains(&hostile.addr) && run.err.contains("unsized"),
            "{what}: the image left unsized is said: {}",
            run.err
        );
        run.assert_bounded(what, Duration::from_secs(20));
    }
}

/// `node` sizes before it pulls: an image of the hostile registry is left unsized, said naming
/// the registry, within the sizing budget and in bounded memory — and the set is still pulled
/// and pinned (sizing informs admission; the runtime pulls).
#[test]
fn node_pins_its_set_whatever_the_sizing_registry_sends() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (what, how) in misbehaviours() {
        let hostile = Hostile::start(how);
        let image = format!("{}/team/app@{}", hostile.addr, digest());
        let node = support::SimNode::start(&rt, std::slice::from_ref(&image), "", |_| {});
        node.write_set("apps", None, std::slice::from_ref(&image));
        let mut args = node.node_args();
        args.retain(|a| a != "--no-sizing");
        args.extend(
            ["--insecure-registry", &hostile.addr, "--sizing-budget", "8"].map(String::from),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = measured(&args);
        assert_eq!(run.code, 0, "{what}: {}", run.err);
        assert!(
            run.err.contains(&hostile.addr) && run.err.contains("unsized"),
            "{what}: the image left unsized is said: {}",
            run.err
        );
        let drop_in = node.dropins.join(pinset_node::pin::crio::DROP_IN);
        let pinned = std::fs::read_to_string(&drop_in).unwrap_or_default();
        assert!(pinned.contains(&image), "{what}: pinned: {pinned}");
        run.assert_bounded(&format!("{what}: node"), Duration::from_secs(20));
    }
}

/// `set from-images` resolving a tag on the hostile registry fails, naming the image, in
/// bounded memory and time.
#[test]
fn set_from_images_refuses_every_misbehaving_registry() {
    for (what, how) in misbehaviours() {
        let hostile = Hostile::start(how);
        let run = from_images(&hostile.addr, &[]);
        assert_eq!(run.code, 1, "{what}: {}{}", run.out, run.err);
        assert!(run.err.contains("team/app"), "{what}: {}", run.err);
        // The registry can tell pinset's requests, and the command, from a runtime's.
        let agent = format!("pinset/{} (set from-images)", env!("CARGO_PKG_VERSION"));
        let seen = hostile.seen();
        assert!(
            !seen.is_empty() && seen.iter().all(|s| s.user_agent.as_ref() == Some(&agent)),
            "{what}: {seen:?}"
        );
        run.assert_bounded(what, Duration::from_secs(40));
    }
}

/// `policy pull` and `policy verify` of an artifact on the hostile registry fail with one line
/// naming it, within the fetch deadline and in bounded memory.
#[test]
fn policy_pull_and_verify_refuse_every_misbehaving_registry() {
    let dir = tempfile::tempdir().unwrap();
    support::keygen_empty(&dir.path().join("cosign"));
    let key = dir.path().join("cosign.pub");
    for (what, how) in misbehaviours() {
        let hostile = Hostile::start(how);
        let reference = format!("oci://{}/policies/p@{}", hostile.addr, digest());
        let out = dir.path().join("p.wasm");
        for args in [
            vec!["policy", "pull", &reference, "-o", out.to_str().unwrap()],
            vec![
                "policy",
                "verify",
                &reference,
                "--key",
                key.to_str().unwrap(),
            ],
        ] {
            let mut args = args;
            args.extend(["--insecure-registry", &hostile.addr]);
            let run = measured(&args);
            assert_eq!(run.code, 1, "{what}: {args:?}: {}{}", run.out, run.err);
            assert!(
                run.err.contains("policies/p") && run.err.trim().lines().count() <= 2,
                "{what}: {args:?}: {}",
                run.err
            );
            run.assert_bounded(&format!("{what}: {}", args[1]), Duration::from_secs(130));
            assert!(!out.exists(), "{what}: nothing written");
        }
    }
}

/// A registry lying about what it serves: a manifest that is not the digest asked for is
/// refused; layer sizes no image has (negative, past 1 TiB) leave the image unsized with why.
#[test]
fn lies_about_digests_and_sizes_are_not_believed() {
    let manifest = |sizes: &[i64]| {
        let layers: Vec<String> = sizes
            .iter()
            .map(|s| format!(r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:{}","size":{s}}}"#, "b".repeat(64)))
            .collect();
        format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:{}","size":2}},"layers":[{}]}}"#,
            "c".repeat(64),
            layers.join(",")
        )
    };
    let (dir, node) = support::scratch_file("node.yaml", support::worker_yaml(""));
    let cases = [
        (manifest(&[5000]), "not the one asked for"),
        (manifest(&[-1, 5000]), "negative size (-1)"),
        (manifest(&[i64::MAX, i64::MAX]), "not believed"),
    ];
    for (body, said) in cases {
        // By digest: the real digest of the body, except for the digest lie.
        let asked = match said {
            "not the one asked for" => digest(),
            _ => support::sha256(body.as_bytes()),
        };
        let hostile = Hostile::start(Misbehaviour::Serve {
            content_type: "application/vnd.oci.image.manifest.v1+json".into(),
            body: body.into_bytes(),
        });
        let image = format!("{}/team/app@{asked}", hostile.addr);
        let run = plan(dir.path(), &node, &hostile, &image, &["-o", "json"]);
        assert_eq!(run.code, 0, "{said}: {}", run.err);
        let plan: serde_json::Value = serde_json::from_str(&run.out).unwrap();
        assert!(
            plan["pulls"][0]["sizeBytes"].is_null(),
            "{said}: {}",
            run.out
        );
        assert!(run.err.contains(said), "{said}: {}", run.err);
    }
}

/// Credentials for a registry go to its own token realm, and never to a realm on another host:
/// that one is asked for an anonymous token.
#[test]
fn credentials_go_to_the_registry_s_own_realm_only() {
    let dir = tempfile::tempdir().unwrap();
    for (realm_host, sent) in [("127.0.0.1", true), ("localhost", false)] {
        let realm = Hostile::start(Misbehaviour::Serve {
            content_type: "application/json".into(),
            body: br#"{"token":"t"}"#.to_vec(),
        });
        let port = realm.addr.rsplit(':').next().unwrap();
        let registry = Hostile::start(Misbehaviour::Realm(format!(
            "http://{realm_host}:{port}/token"
        )));
        let auth = dir.path().join("config.json");
        let secret = base64_of("user:secret");
        std::fs::write(
            &auth,
            format!(
                r#"{{"auths": {{"{}": {{"auth": "{secret}"}}}}}}"#,
                registry.addr
            ),
        )
        .unwrap();
        let run = from_images(&registry.addr, &["--auth", auth.to_str().unwrap()]);
        assert_eq!(run.code, 1, "{}", run.err);
        let seen = realm.seen();
        assert!(!seen.is_empty(), "the realm was asked");
        let carried = seen
            .iter()
            .any(|s| s.authorization.as_deref() == Some(&format!("Basic {secret}")));
        assert_eq!(carried, sent, "{realm_host}: {seen:?}");
    }
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}
