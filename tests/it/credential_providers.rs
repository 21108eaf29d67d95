//! The kubelet's image credential providers, end to end: a registry (the bed's, behind a token
//! service that grants pulls to one credential only), a provider plugin run as the kubelet runs
//! it that gives that credential, and pinset sizing (`pinset plan`) and pulling through a real
//! containerd with it — and failing to without it.

use crate::support;

use pinset_core::status::NodeStatus;
use pinset_node::executor::Backoff;
use pinset_registry::auth::Credentials;
use pinset_registry::credential_provider::Providers;
use std::sync::Arc;
use std::time::Duration;
use support::{PrivateRegistry, plugin_runs, provider_for, provider_running};

/// `pinset plan` sizes a private registry's images with the credential a provider gives (the
/// plugin run once: its answer is kept for the registry); without the provider, the registry
/// refuses and the sizes are unknown.
#[tokio::test]
async fn plan_sizes_a_private_registrys_images_with_a_providers_credential() {
    let Some(private) = PrivateRegistry::start(2, 40_000).await else {
        return;
    };
    let (tokens, registry, refs) = (&private.tokens, &private.registry, &private.refs);
    let dir = tempfile::tempdir().unwrap();
    let (config, bin, count) = provider_for(&registry.host, dir.path());
    let sets = dir.path().join("sets.yaml");
    std::fs::write(&sets, support::set_yaml("apps", None, refs)).unwrap();
    let node = dir.path().join("node.yaml");
    std::fs::write(&node, support::worker_yaml("")).unwrap();
    let insecure = ["--insecure-registry", &registry.host];

    let plan = support::plan_json(&sets, &node, &insecure).await;
    let sizes = |plan: &serde_json::Value| -> Vec<Option<u64>> {
        let pulls = plan["pulls"].as_array().unwrap().iter();
        pulls.map(|p| p["sizeBytes"].as_u64()).collect()
    };
    assert_eq!(sizes(&plan), [None, None], "without a credential: {plan}");
    assert!(tokens.refused() > 0 && tokens.granted() == 0);

    let with_provider = [
        &insecure[..],
        &[
            "--image-credential-provider-config",
            config.to_str().unwrap(),
            "--image-credential-provider-bin-dir",
            bin.to_str().unwrap(),
        ],
    ]
    .concat();
    let plan = support::plan_json(&sets, &node, &with_provider).await;
    assert!(
        sizes(&plan).iter().all(|s| s.is_some_and(|b| b >= 40_000)),
        "{plan}"
    );
    assert!(tokens.granted() > 0);
    assert_eq!(plugin_runs(&count), 1, "the answer kept for the registry");
}

/// containerd pulls a private image with the credential pinset passes it through CRI, from the
/// provider; the same pull with a plugin that fails fails, naming the image and the plugin's
/// failure.
#[tokio::test]
async fn containerd_pulls_a_private_image_with_a_providers_credential() {
    let Some(private) = PrivateRegistry::start(2, 40_000).await else {
        return;
    };
    let (tokens, registry, refs) = (&private.tokens, &private.registry, &private.refs);
    let Some(containerd) = support::Containerd::start(&registry.host) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (config, bin, count) = provider_for(&registry.host, dir.path());
    let quick = Backoff {
        attempts: 2,
        first: Duration::from_millis(20),
        cap: Duration::from_millis(50),
    };
    let node = support::node("worker");
    let wanted = support::desired_for(&node, "worker", "private", &refs[..1]);

    let with = |config: &std::path::Path, bin: &std::path::Path| {
        let providers = Providers::load(config, bin).unwrap();
        let credentials = Arc::new(Credentials::default().with_providers(Arc::new(providers)));
        support::reconciler_with(&containerd, &registry.host, quick, false, credentials)
    };

    // A plugin that fails: no credential, the registry refuses, and the failure says why.
    let broken = tempfile::tempdir().unwrap();
    let script = "cat >/dev/null; echo 'no instance role' >&2; exit 1";
    let (broken_config, broken_bin) = provider_running(&registry.host, broken.path(), script);
    let mut status = NodeStatus::default();
    let failing = with(&broken_config, &broken_bin);
    let report = support::reconcile_default(&failing, &wanted, &node, &mut status, None)
        .await
        .unwrap();
    assert_eq!(report.outcome.failed.len(), 1, "{report:?}");
    let err = status.sets["private"].last_failed_generation_error.clone();
    support::assert_says(
        &err.unwrap_or_default(),
        &[
            &refs[0],
            "pulled without a credential: the image credential provider failed",
            "ecr-login: exit status: 1: no instance role",
        ],
    );
    assert!(tokens.refused() > 0);
    assert_eq!(tokens.granted(), 0);

    let private = with(&config, &bin);
    let mut status = NodeStatus::default();
    let report = support::reconcile_default(&private, &wanted, &node, &mut status, None)
        .await
        .unwrap();
    assert_eq!(report.outcome.pulled.len(), 1, "{report:?} {status:?}");
    let image = private.cri().image_status(&refs[0]).await.unwrap();
    assert!(
        image.is_some_and(|i| i.pinned),
        "{} pulled and pinned",
        refs[0]
    );
    assert!(tokens.granted() > 0);
    assert_eq!(plugin_runs(&count), 1);
}

/// A policy module in the private registry: `pinset plan --policy oci://…` cannot fetch it
/// without the provider (the refusal named), and decides with it given the provider — the
/// flags reach policies as they reach images.
#[test]
fn a_policy_in_a_private_registry_is_fetched_with_a_providers_credential() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(private) = runtime.block_on(PrivateRegistry::start(1, 10_000)) else {
        return;
    };
    let host = private.registry.host.as_str();
    let module = support::policy_path("pinset_policy_smallest_first");
    let target = format!("{host}/policies/private:v1");
    let insecure = ["--insecure-registry", host];
    let push = [
        &["policy", "push", module.to_str().unwrap(), &target][..],
        &insecure,
    ]
    .concat();
    let (code, out, err) = support::pinset(&push);
    assert_eq!(code, 0, "{err}");
    let policy = format!("oci://{}", out.trim());

    let dir = tempfile::tempdir().unwrap();
    let (config, bin, _) = provider_for(host, dir.path());
    let demo = support::workspace().join("examples/demo");
    let (sets, nodes) = (demo.join("sets.yaml"), demo.join("nodes.yaml"));
    let plan = [
        "plan",
        "--sets",
        sets.to_str().unwrap(),
        "--node",
        nodes.to_str().unwrap(),
        "--node-name",
        "worker-0",
        "--no-sizing",
        "--policy",
        &policy,
    ];
    let (code, _, err) = support::pinset(&[&plan[..], &insecure].concat());
    assert_eq!(code, 1, "{err}");
    support::assert_says(&err, &[out.trim(), "authenticating"]);

    let providers = [
        "--image-credential-provider-config",
        config.to_str().unwrap(),
        "--image-credential-provider-bin-dir",
        bin.to_str().unwrap(),
    ];
    let (code, out, err) = support::pinset(&[&plan[..], &insecure, &providers].concat());
    assert_eq!(code, 0, "{err}");
    support::assert_says(&out, &["policy smallest-first 0.1.0", &policy]);
}

/// The kubelet's two flags go together: one without the other is refused with both named,
/// wherever it stands (before the command or after it).
#[test]
fn one_credential_provider_flag_without_the_other_is_refused() {
    for args in [
        &[
            "--image-credential-provider-config",
            "c.yaml",
            "completion",
            "bash",
        ][..],
        &[
            "completion",
            "bash",
            "--image-credential-provider-config",
            "c.yaml",
        ],
        &[
            "completion",
            "bash",
            "--image-credential-provider-bin-dir",
            "bin",
        ],
    ] {
        let (code, _, err) = support::pinset(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        support::assert_says(
            &err,
            &[
                "--image-credential-provider-config and --image-credential-provider-bin-dir",
                "give both or neither",
            ],
        );
    }
}
