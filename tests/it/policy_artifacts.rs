//! Policy modules shipped as OCI artifacts, against the bed's real registry (`docker-registry`)
//! and wasm-pkg-tools' real `wkg`: push and pull, signatures in cosign's format, `oci://`
//! references with verification and the node cache, and every bad input refused by name.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn module() -> PathBuf {
    support::policy_path("pinset_policy_smallest_first")
}

/// The file `pulled` holds the bytes of [`module`].
fn assert_is_the_module(pulled: &Path) {
    let same = std::fs::read(pulled).unwrap() == std::fs::read(module()).unwrap();
    assert!(same, "{} differs from the module pushed", pulled.display());
}

/// `pinset` with `args` and `COSIGN_PASSWORD`: (exit code, stdout, stderr).
fn pinset(args: &[&str]) -> (i32, String, String) {
    support::pinset_with(args, &[("COSIGN_PASSWORD", "pinset-test")])
}

/// Push `file` as `repo:tag` with pinset; the reference by digest it prints.
fn push(registry: &support::Registry, file: &Path, repo_tag: &str) -> String {
    support::push_policy(&registry.host, file, repo_tag)
}

fn pull(host: &str, reference: &str, out: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec![
        "policy",
        "pull",
        reference,
        "-o",
        out.to_str().unwrap(),
        "--insecure-registry",
        host,
    ];
    args.extend_from_slice(extra);
    let (code, _, err) = pinset(&args);
    (code, err)
}

#[test]
fn a_pushed_module_pulls_back_equal_and_one_module_has_one_digest() {
    let Some(registry) = support::Registry::start() else {
        return;
    };
    let reference = push(&registry, &module(), "policies/smallest:v1");
    let prefix = format!("{}/policies/smallest@sha256:", registry.host);
    assert!(reference.starts_with(&prefix), "{reference}");
    assert_eq!(
        push(&registry, &module(), "policies/smallest:v1"),
        reference,
        "pushing one module twice gives one manifest digest"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pulled.wasm");
    for by in [
        reference.clone(),
        format!("{}/policies/smallest:v1", registry.host),
    ] {
        let (code, err) = pull(&registry.host, &by, &out, &[]);
        assert_eq!(code, 0, "{err}");
        assert_is_the_module(&out);
    }
}

#[test]
fn wkg_and_pinset_pull_what_the_other_pushed() {
    let (Some(registry), Some(wkg)) = (support::Registry::start(), support::wkg()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read(module()).unwrap();
    push(&registry, &module(), "policies/by-pinset:v1");
    let by_wkg = dir.path().join("by-wkg.wasm");
    let status = Command::new(&wkg)
        .args([
            "oci",
            "pull",
            &format!("{}/policies/by-pinset:v1", registry.host),
        ])
        .args(["--insecure", &registry.host, "-o", by_wkg.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success(), "wkg pulls pinset's artifact");
    assert_eq!(std::fs::read(&by_wkg).unwrap(), original);

    let status = Command::new(&wkg)
        .args([
            "oci",
            "push",
            &format!("{}/policies/by-wkg:v1", registry.host),
        ])
        .arg(module())
        .args(["--insecure", &registry.host])
        .status()
        .unwrap();
    assert!(status.success(), "wkg pushes");
    let out = dir.path().join("by-pinset.wasm");
    let (code, err) = pull(
        &registry.host,
        &format!("{}/policies/by-wkg:v1", registry.host),
        &out,
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), original);
}

/// Push a hand-made artifact, tagged `v1`: `layer` under a Wasm config (no compile: the
/// registry is what is tested, not the module).
async fn push_raw(registry: &support::Registry, repo: &str, layer: Vec<u8>) {
    use pinset_registry::oci::{Descriptor, OCI_MANIFEST, manifest_json};
    let client = registry.client();
    let endpoint = pinset_registry::mirrors::Endpoint::source(&registry.host, repo);
    let deadline = std::time::Duration::from_secs(60);
    let config = Descriptor::of("application/vnd.wasm.config.v0+json", b"{}");
    let layers = [Descriptor::of("application/wasm", &layer)];
    for blob in [b"{}".to_vec(), layer] {
        client
            .push_blob(&endpoint, blob.into(), deadline)
            .await
            .unwrap();
    }
    let manifest = manifest_json(&config, &layers);
    client
        .push_manifest(&endpoint, "v1", OCI_MANIFEST, manifest.into(), deadline)
        .await
        .unwrap();
}

#[tokio::test]
async fn bad_artifacts_and_registries_are_refused_by_name_and_nothing_is_half_written() {
    let Some(registry) = support::Registry::start() else {
        return;
    };
    let (_dir, out) = support::scratch_file("kept.wasm", b"the previous module");
    let host = registry.host.clone();
    let refused = |reference: &str, extra: &[&str], expect: &[&str]| {
        let (code, err) = pull(&host, reference, &out, extra);
        assert_eq!(code, 1, "{reference}: {err}");
        for e in expect {
            assert!(err.contains(e), "{reference}: expected {e:?} in: {err}");
        }
        assert_eq!(
            std::fs::read(&out).unwrap(),
            b"the previous module",
            "{reference}"
        );
    };

    // A container image is not a module.
    let images = support::push_images(&registry, "apps/web", 1, 20_000, 7).await;
    refused(
        &images[0],
        &[],
        &[&images[0], "not a Wasm artifact", "container image"],
    );

    // Over the size limit: refused from the manifest, before the layer is read.
    push_raw(&registry, "policies/big", vec![0u8; 3 << 20]).await;
    let big = format!("{}/policies/big:v1", registry.host);
    refused(
        &big,
        &["--max-module-mib", "2"],
        &["policies/big@sha256:", "over the limit"],
    );

    // A registry serving other bytes than the manifest's digest.
    let reference = push(&registry, &module(), "policies/tampered:v1");
    let layer = support::sha256(&std::fs::read(module()).unwrap());
    let hex = layer.strip_prefix("sha256:").unwrap();
    let blob = registry.storage().join(format!(
        "docker/registry/v2/blobs/sha256/{}/{hex}/data",
        &hex[..2]
    ));
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    refused(
        &reference,
        &[],
        &[
            &reference,
            &format!("layer {layer}"),
            "the registry served bytes of digest",
        ],
    );

    // Unknown artifact, then the registry down.
    refused(
        &format!("{}/policies/none:v1", registry.host),
        &[],
        &["policies/none:v1"],
    );
    registry.stop();
    refused(&reference, &[], &[&reference, "Connection refused"]);
}

/// A token service on loopback answering every request with `status` and `body`.
fn token_service(status: &'static str, body: &'static str) -> String {
    support::answering(status, "application/json", body)
}

/// A registry that wants a bearer token from `realm`, and a `config.json` with credentials for it.
fn token_registry(realm: String, dir: &Path) -> Option<(support::Registry, std::path::PathBuf)> {
    let auth =
        format!("auth:\n  silly:\n    realm: http://{realm}/token\n    service: pinset-test\n");
    let registry = support::Registry::start_with(&auth)?;
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"auths":{{"{}":{{"auth":"dXNlcjpwdw=="}}}}}}"#,
            registry.host
        ),
    )
    .unwrap();
    Some((registry, config))
}

#[test]
fn push_and_pull_go_through_the_token_flow_with_the_credentials_file() {
    let realm = token_service(
        "200 OK",
        r#"{"token":"pinset-test","access_token":"pinset-test","expires_in":300}"#,
    );
    let dir = tempfile::tempdir().unwrap();
    let Some((registry, config)) = token_registry(realm, dir.path()) else {
        return;
    };
    let target = format!("{}/policies/private:v1", registry.host);
    let with_auth = [
        "--insecure-registry",
        &registry.host,
        "--auth",
        config.to_str().unwrap(),
    ];
    let file = module();
    let mut args = vec!["policy", "push", file.to_str().unwrap(), &target];
    args.extend_from_slice(&with_auth);
    let (code, out, err) = pinset(&args);
    assert_eq!(code, 0, "{err}");
    let out_file = dir.path().join("pulled.wasm");
    let mut args = vec![
        "policy",
        "pull",
        out.trim(),
        "-o",
        out_file.to_str().unwrap(),
    ];
    args.extend_from_slice(&with_auth);
    let (code, _, err) = pinset(&args);
    assert_eq!(code, 0, "{err}");
    assert_is_the_module(&out_file);
}

#[test]
fn a_registry_refusing_the_credentials_is_named() {
    let realm = token_service(
        "401 Unauthorized",
        r#"{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}"#,
    );
    let dir = tempfile::tempdir().unwrap();
    let Some((registry, config)) = token_registry(realm, dir.path()) else {
        return;
    };
    let target = format!("{}/policies/private:v1", registry.host);
    let (code, _, err) = pinset(&[
        "policy",
        "push",
        module().to_str().unwrap(),
        &target,
        "--insecure-registry",
        &registry.host,
        "--auth",
        config.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    support::assert_says(&err, &[&target, "authenticating"]);
}

/// A plain-HTTP registry is named once, for images and policies alike: without it, the error
/// says the registry answers in plain HTTP and how to mark it; with the registries file (by
/// `--registries` or `$PINSET_REGISTRIES`) or `--insecure-registry`, every command reaches it,
/// the controller's policy fetch included; a bad file is refused at FILE:LINE:COL.
#[test]
fn a_plain_http_registry_is_named_once_for_images_and_policies() {
    let Some(registry) = support::Registry::start() else {
        return;
    };
    let host = registry.host.as_str();
    let dir = tempfile::tempdir().unwrap();
    let file = module();
    let target = format!("{host}/policies/sources:v1");
    let push_args = ["policy", "push", file.to_str().unwrap(), &target];
    let run = |env: Option<&Path>, args: &[&str]| {
        let mut command = Command::new(support::PINSET);
        support::without_terminal(command.args(args))
            .env("PINSET_LOG", "warn")
            .env_remove("PINSET_REGISTRIES")
            .env("XDG_CONFIG_HOME", dir.path().join("no-config"));
        if let Some(f) = env {
            command.env("PINSET_REGISTRIES", f);
        }
        let out = command.output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout),
            text(&out.stderr),
        )
    };
    let (code, _, err) = run(None, &push_args);
    assert_eq!(code, 1, "{err}");
    support::assert_says(
        &err,
        &[
            &format!("{host} answers in plain HTTP, not TLS"),
            &format!("--insecure-registry {host}"),
            "insecureRegistries",
        ],
    );
    let sources = dir.path().join("registries.yaml");
    std::fs::write(&sources, format!("insecureRegistries: [{host}]\n")).unwrap();
    let (code, pushed, err) = run(Some(&sources), &push_args);
    assert_eq!(code, 0, "{err}");
    let pushed = pushed.trim().to_string();
    let flag = ["--registries", sources.to_str().unwrap()];
    let out = dir.path().join("pulled.wasm");
    let pull = ["policy", "pull", &pushed, "-o", out.to_str().unwrap()];
    let (code, _, err) = run(None, &[&pull[..], &flag[..]].concat());
    assert_eq!(code, 0, "{err}");
    // The controller's policy fetch, with the one flag images use: the module is fetched (and
    // then refused as a node policy where a fleet policy is asked for).
    let controller = [
        "controller",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--fleet-policy",
    ];
    let oci = format!("oci://{pushed}");
    let (code, _, err) = run(
        None,
        &[&controller[..], &[&oci, "--insecure-registry", host]].concat(),
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("it is a node pull policy") && !err.contains("plain HTTP"),
        "{err}"
    );
    std::fs::write(
        &sources,
        format!("insecureRegistries: [{host}]\ninsecure: true\n"),
    )
    .unwrap();
    let (code, _, err) = run(Some(&sources), &push_args);
    assert_eq!(code, 1);
    support::assert_says(&err, &[&format!("{}:2:1", sources.display()), "insecure"]);
}

/// The controller's `--fleet-policy oci://…` is fetched and verified before it connects: an
/// unsigned module stops it naming the reference, a signed one gets it as far as its kubeconfig.
#[test]
fn the_controller_verifies_an_oci_fleet_policy_before_it_starts() {
    let Some(registry) = support::Registry::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "cosign");
    let fleet = support::policy_path("pinset_policy_zone_by_zone");
    let signed = push(&registry, &fleet, "policies/fleet:signed");
    let unsigned = push(&registry, &fleet, "policies/fleet-unsigned:v1");
    let (code, out) = sign_or_verify(&registry, "sign", &signed, &key);
    assert_eq!(code, 0, "{out}");
    let controller = |reference: &str| {
        pinset(&[
            "controller",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--fleet-policy",
            &format!("oci://{reference}"),
            "--policy-verify-key",
            &public,
            "--policy-insecure-registry",
            &registry.host,
        ])
    };
    let (code, _, err) = controller(&unsigned);
    assert_eq!(code, 1, "{err}");
    support::assert_says(&err, &[&unsigned, "no cosign signature"]);
    let (code, _, err) = controller(&signed);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("/nonexistent/kubeconfig") && !err.contains("signature"),
        "{err}"
    );
}

/// `policy keygen` into `dir/name`; (private key, public key).
fn keygen(dir: &Path, name: &str) -> (String, String) {
    let prefix = dir.join(name);
    let (code, _, err) = pinset(&[
        "policy",
        "keygen",
        "--output-key-prefix",
        prefix.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let file = |ext: &str| prefix.with_extension(ext).to_str().unwrap().to_string();
    (file("key"), file("pub"))
}

/// A key is never written without a password unless asked, and `sign` says where the password
/// it tried came from: cosign's rules, without a terminal to ask on.
#[test]
fn a_key_gets_a_password_unless_an_empty_one_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let run = |env: Option<&str>, args: &[&str]| {
        let mut command = Command::new(support::PINSET);
        support::without_terminal(command.args(args)).env_remove("COSIGN_PASSWORD");
        if let Some(p) = env {
            command.env("COSIGN_PASSWORD", p);
        }
        let out = command.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), err)
    };
    let prefix = |n: &str| dir.path().join(n).display().to_string();
    let keygen = ["policy", "keygen", "--output-key-prefix"];
    let (code, err) = run(None, &[&keygen[..], &[&prefix("a")]].concat());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("COSIGN_PASSWORD is unset") && err.contains("--allow-empty-password"));
    assert!(!dir.path().join("a.key").exists(), "nothing written");
    let (code, err) = run(Some(""), &[&keygen[..], &[&prefix("b")]].concat());
    assert_eq!(code, 1, "{err}");
    support::assert_says(&err, &["the password is empty"]);
    let c = prefix("c");
    let empty = [&keygen[..], &[&c, "--allow-empty-password"]].concat();
    assert_eq!(run(None, &empty).0, 0);
    assert_eq!(
        run(Some("s3cret"), &[&keygen[..], &[&prefix("d")]].concat()).0,
        0
    );
    // Signing with the password unset: the error says so (the registry is never reached).
    let sign = ["policy", "sign", "127.0.0.1:9/p@sha256:", "--key"];
    let reference = format!("{}{}", sign[2], "a".repeat(64));
    let (code, err) = run(
        None,
        &[&sign[..2], &[&reference, "--key", &prefix("d.key")]].concat(),
    );
    assert_eq!(code, 1, "{err}");
    support::assert_says(&err, &["$COSIGN_PASSWORD is unset", "d.key"]);
    let (code, err) = run(
        Some("wrong"),
        &[&sign[..2], &[&reference, "--key", &prefix("d.key")]].concat(),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("wrong password") && !err.contains("unset"),
        "{err}"
    );
}

fn sign_or_verify(
    registry: &support::Registry,
    verb: &str,
    reference: &str,
    key: &str,
) -> (i32, String) {
    let (code, out, err) = pinset(&[
        "policy",
        verb,
        reference,
        "--key",
        key,
        "--insecure-registry",
        &registry.host,
    ]);
    (code, format!("{out}{err}"))
}

/// Rewrite the signature manifest of `from` as the one of `to`, through `edit`.
async fn forge(
    registry: &support::Registry,
    from: &str,
    to: &str,
    edit: impl Fn(&mut serde_json::Value),
) {
    let tag = |r: &str| {
        let (name, digest) = r.split_once('@').unwrap();
        format!("{name}:{}.sig", digest.replace(':', "-"))
    };
    let client = registry.client();
    let deadline = std::time::Duration::from_secs(30);
    let at = |r: &str| {
        let (name, _) = r.split_once('@').unwrap();
        let repo = name.split_once('/').unwrap().1.to_string();
        pinset_registry::mirrors::Endpoint::source(&registry.host, &repo)
    };
    let source_tag = tag(from);
    let fetched = client
        .manifest(&at(from), source_tag.rsplit(':').next().unwrap(), deadline)
        .await
        .unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&fetched.body).unwrap();
    edit(&mut manifest);
    let target_tag = tag(to);
    client
        .push_manifest(
            &at(to),
            target_tag.rsplit(':').next().unwrap(),
            pinset_registry::oci::OCI_MANIFEST,
            serde_json::to_vec(&manifest).unwrap().into(),
            deadline,
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_signature_verifies_only_with_its_key_and_for_the_digest_it_signed() {
    let Some(registry) = support::Registry::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (k1, p1) = keygen(dir.path(), "one");
    let (_, p2) = keygen(dir.path(), "two");
    let signed = push(&registry, &module(), "policies/signed:v1");
    let other = push(
        &registry,
        &support::policy_path("pinset_policy_admit_what_fits"),
        "policies/signed:v2",
    );
    let third = push(
        &registry,
        &support::policy_path("pinset_policy_io_adaptive"),
        "policies/signed:v3",
    );

    let (code, out) = sign_or_verify(&registry, "sign", &signed, &k1);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(".sig"),
        "prints the signature's reference: {out}"
    );
    let (code, out) = sign_or_verify(
        &registry,
        "verify",
        &format!("{}/policies/signed:v1", registry.host),
        &p1,
    );
    assert_eq!(code, 0, "a tag resolves to the signed digest: {out}");
    let (code, out) = sign_or_verify(&registry, "verify", &signed, &p2);
    assert_eq!(code, 1, "{out}");
    support::assert_says(&out, &[&signed, "another key"]);
    let (code, out) = sign_or_verify(&registry, "verify", &other, &p1);
    assert_eq!(code, 1, "{out}");
    support::assert_says(&out, &["no cosign signature"]);

    // The signature of one digest placed as another's.
    forge(&registry, &signed, &other, |_| {}).await;
    let (code, out) = sign_or_verify(&registry, "verify", &other, &p1);
    assert_eq!(code, 1, "{out}");
    let digest = signed.split_once('@').unwrap().1;
    support::assert_says(&out, &[&format!("it signs {digest}, not this digest")]);

    // A corrupted signature of the right digest.
    let (code, out) = sign_or_verify(&registry, "sign", &third, &k1);
    assert_eq!(code, 0, "{out}");
    forge(&registry, &third, &third, |m| {
        let s = m["layers"][0]["annotations"]["dev.cosignproject.cosign/signature"]
            .as_str()
            .unwrap();
        let flipped = format!(
            "{}{}",
            &s[..10],
            s[10..].replacen('A', "B", 1).replacen('Q', "R", 1)
        );
        m["layers"][0]["annotations"]["dev.cosignproject.cosign/signature"] = flipped.into();
    })
    .await;
    let (code, out) = sign_or_verify(&registry, "verify", &third, &p1);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("corrupted") || out.contains("not base64"),
        "{out}"
    );
}

/// `pinset policy info` with the module named by `oci://`: the path every command and the agent
/// load a module through.
fn info(registry: &support::Registry, reference: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "policy",
        "info",
        "--policy",
        reference,
        "--policy-insecure-registry",
        &registry.host,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    pinset(&args)
}

#[test]
fn an_oci_module_loads_verified_and_from_the_cache_when_the_registry_is_away() {
    let Some(registry) = support::Registry::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "cosign");
    let cache = dir.path().join("cache");
    let signed = push(&registry, &module(), "policies/node:v1");
    let (code, out) = sign_or_verify(&registry, "sign", &signed, &key);
    assert_eq!(code, 0, "{out}");
    let unsigned = push(
        &registry,
        &support::policy_path("pinset_policy_admit_what_fits"),
        "policies/node:v2",
    );
    let verified = [
        "--policy-verify-key",
        public.as_str(),
        "--policy-cache",
        cache.to_str().unwrap(),
    ];
    let sha = support::sha256(&std::fs::read(module()).unwrap());

    let (code, out, err) = info(&registry, &format!("oci://{signed}"), &verified);
    assert_eq!(code, 0, "{err}");
    support::assert_says(&out, &[sha.strip_prefix("sha256:").unwrap()]);
    let compiled: Vec<_> = std::fs::read_dir(cache.join("compiled"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        compiled
            .iter()
            .any(|f| f.starts_with(sha.strip_prefix("sha256:").unwrap()) && f.ends_with(".cwasm")),
        "the compiled module is kept by the module's digest: {compiled:?}"
    );
    let (code, _, err) = info(&registry, &format!("oci://{unsigned}"), &verified);
    assert_eq!(code, 1, "{err}");
    support::assert_says(&err, &[&unsigned, "no cosign signature"]);
    let (code, _, err) = info(
        &registry,
        &format!("oci://{}/policies/node:v1", registry.host),
        &[],
    );
    assert_eq!(code, 1, "{err}");
    support::assert_says(&err, &["by digest"]);

    // The registry away: the cache serves the verified module; a damaged cache file does not.
    registry.stop();
    let (code, _, err) = info(&registry, &format!("oci://{signed}"), &verified);
    assert_eq!(code, 0, "from the cache: {err}");
    let hex = signed.split_once("@sha256:").unwrap().1;
    let cached = cache.join(format!("{hex}.wasm"));
    let full = std::fs::read(&cached).unwrap();
    std::fs::write(&cached, &full[..full.len() / 2]).unwrap();
    let (code, _, err) = info(&registry, &format!("oci://{signed}"), &verified);
    assert_eq!(code, 1, "a truncated cache file is not used: {err}");
    support::assert_says(&err, &[&signed]);
    registry.restart();
    let (code, _, err) = info(&registry, &format!("oci://{signed}"), &verified);
    assert_eq!(code, 0, "fetched again: {err}");
    assert_eq!(std::fs::read(&cached).unwrap(), full);
}
