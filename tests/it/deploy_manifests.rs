//! The manifests in deploy/ stay true to the binary. Each install variant is rendered with
//! `kubectl kustomize` (the whole install, the base without CRDs, the base with every
//! component) and checked: the CRDs are exactly what `pinset crds` prints, the image is the one
//! `scripts/image.sh` names, every flag exists, every path a flag names lies under a mount, the
//! runtime sockets are mounted, and the agent's and the controller's security settings hold.

use crate::support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The image reference `scripts/image.sh` gives the image it builds.
fn image_ref() -> String {
    format!("localhost/pinset:{}", env!("CARGO_PKG_VERSION"))
}

fn parse_stream(text: &str, what: &str) -> Vec<Value> {
    let docs = serde_saphyr::from_multiple::<Option<Value>>(text);
    let docs = docs.unwrap_or_else(|e| panic!("{what}: {e}"));
    docs.into_iter().flatten().collect()
}

/// `kubectl kustomize DIR`, parsed; `None` (skipped where PINSET_SKIP_BED asks; else the test fails) without kubectl.
fn render(dir: &Path) -> Option<Vec<Value>> {
    let out = match Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(out) => out,
        Err(e) => {
            support::skip_or_fail(&format!("kubectl is not installed ({e})"));
            return None;
        }
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(parse_stream(
        &String::from_utf8(out.stdout).unwrap(),
        &dir.display().to_string(),
    ))
}

fn deploy() -> std::path::PathBuf {
    support::workspace().join("deploy")
}

/// The controller's and the agent's ClusterRoles (not the operators' `pinset-rollout`, which
/// only reads pools, sets and nodes and pauses a pool).
fn component_roles(docs: &[Value]) -> Vec<&Value> {
    of_kind(docs, "ClusterRole")
        .into_iter()
        .filter(|r| r["metadata"]["name"] != "pinset-rollout")
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn names(docs: &[&Value]) -> BTreeSet<String> {
    docs.iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn crds_match_the_binary() {
    let (code, out, err) = support::pinset(&["crds"]);
    assert_eq!(code, 0, "{err}");
    let path = deploy().join("components/crds/crds.yaml");
    let file = std::fs::read_to_string(&path).unwrap();
    assert!(
        out == file,
        "{} is stale: regenerate it with `cargo run -p pinset -- crds > deploy/components/crds/crds.yaml`",
        path.display()
    );
    let docs = parse_stream(&file, "crds.yaml");
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["spec"]["names"]["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        vec![
            "PinnedImageSet",
            "MachineConfigPool",
            "MachineConfigNode",
            "PolicyConfiguration"
        ]
    );
    for d in &docs {
        assert_eq!(
            d["metadata"]["labels"]["app.kubernetes.io/part-of"], "pinset",
            "pinset's CRDs say they are pinset's (the OpenShift check tells them apart)"
        );
    }
}

/// `--flag` names a subcommand accepts, from its `--help`.
fn flags(subcommand: &str) -> BTreeSet<String> {
    let (code, out, err) = support::pinset(&[subcommand, "--help"]);
    assert_eq!(code, 0, "{err}");
    out.split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| {
            let w = w.trim_end_matches([',', '.']);
            w.split('=').next().unwrap().to_string()
        })
        .collect()
}

/// A workload's container: its args are real flags of the binary, its image is the script's,
/// and every absolute path a flag names lies under one of its mounts.
fn check_container(workload: &Value) {
    let name = workload["metadata"]["name"].as_str().unwrap();
    let pod = &workload["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"].as_str(),
        Some(image_ref().as_str()),
        "{name}: image"
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let known = flags(args[0]);
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_array()
        .map(|m| m.iter().map(|m| m["mountPath"].as_str().unwrap()).collect())
        .unwrap_or_default();
    let volumes: BTreeSet<&str> = pod["volumes"]
        .as_array()
        .map(|v| v.iter().map(|v| v["name"].as_str().unwrap()).collect())
        .unwrap_or_default();
    for m in container["volumeMounts"].as_array().into_iter().flatten() {
        let volume = m["name"].as_str().unwrap();
        assert!(
            volumes.contains(volume),
            "{name}: mount of undeclared volume {volume}"
        );
    }
    for arg in &args[1..] {
        let (flag, value) = arg.split_once('=').unwrap_or((arg, ""));
        assert!(
            known.contains(flag),
            "{name}: {flag} is not a flag of `pinset {}`",
            args[0]
        );
        if value.starts_with('/') {
            assert!(
                mounts.iter().any(|m| Path::new(value).starts_with(m)),
                "{name}: {flag}={value} lies under no mount ({mounts:?})"
            );
        }
    }
}

fn check_agent(agent: &Value) {
    check_container(agent);
    let pod = &agent["spec"]["template"]["spec"];
    assert_eq!(
        pod["hostPID"], true,
        "CRI-O is signalled through the host's PID namespace"
    );
    let container = &pod["containers"][0];
    let args = serde_saphyr::to_string(&container["args"]).unwrap();
    assert!(
        !args.contains("--cri=") && !args.contains("--pin="),
        "runtime chosen by the node: {args}"
    );
    assert!(
        !args.contains("--crio-reload"),
        "CRI-O reloaded by signal, no shell: {args}"
    );
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    // Every standard socket the agent probes for is reachable.
    for socket in ["/run/crio/crio.sock", "/run/containerd/containerd.sock"] {
        assert!(
            mounts.iter().any(|m| Path::new(socket).starts_with(m)),
            "{socket} is not mounted: {mounts:?}"
        );
    }
    // The runtime's mirror configuration, read where the runtime reads it, never written.
    for file in [
        pinset_registry::mirrors::REGISTRIES_CONF,
        "/etc/containers/registries.conf.d/50-mirrors.conf",
        pinset_registry::mirrors::CONTAINERD_HOSTS_DIR,
    ] {
        let mount = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| Path::new(file).starts_with(m["mountPath"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{file} is not mounted: {mounts:?}"));
        assert_eq!(mount["readOnly"], true, "{file}: {mount:?}");
    }
    for volume in pod["volumes"].as_array().unwrap() {
        assert_ne!(
            volume["hostPath"]["type"], "FileOrCreate",
            "a missing host file must not be created in the kubelet's place: {volume:?}"
        );
    }
}

fn check_controller(controller: &Value) {
    check_container(controller);
    let pod = &controller["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let sc = &pod["containers"][0]["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    assert!(sc["privileged"].is_null() || sc["privileged"] == false);
}

/// What every variant holds: the namespace's Pod Security level, the workloads, RBAC that names
/// exactly pinset's CRDs for the ownership check.
fn check_base(docs: &[Value], crd_names: &BTreeSet<String>) {
    let ns = &of_kind(docs, "Namespace")[0];
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged",
        "the agent is privileged with hostPID"
    );
    check_controller(of_kind(docs, "Deployment")[0]);
    check_agent(of_kind(docs, "DaemonSet")[0]);
    check_policy_configuration(docs);
    check_node_rules(docs);
    for role in component_roles(docs) {
        let rule = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resources"][0] == "customresourcedefinitions")
            .unwrap_or_else(|| {
                panic!(
                    "{:?}: may not read the CRDs' owner",
                    role["metadata"]["name"]
                )
            });
        let named: BTreeSet<String> = rule["resourceNames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect();
        assert_eq!(&named, crd_names);
    }
}

/// The agent may watch its Node (it follows its own facts by a watch, named by a field
/// selector) and write no Node, and may delete MachineConfigNodes (what an API server that
/// enforces owner-reference permissions asks of who names the Node as the owner); the
/// controller reads no Node at all.
fn check_node_rules(docs: &[Value]) {
    let verbs = |role: &str, resource: &str| -> Vec<String> {
        let role = (of_kind(docs, "ClusterRole").into_iter())
            .find(|r| r["metadata"]["name"] == role)
            .unwrap_or_else(|| panic!("no ClusterRole {role}"));
        let rules = role["rules"].as_array().unwrap().iter();
        let of = rules.filter(|r| (r["resources"].as_array().unwrap()).contains(&resource.into()));
        of.flat_map(|r| r["verbs"].as_array().unwrap().clone())
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(verbs("pinset-agent", "nodes"), ["get", "list", "watch"]);
    assert!(verbs("pinset-controller", "nodes").is_empty());
    let mcn = verbs("pinset-agent", "machineconfignodes");
    assert!(mcn.contains(&"delete".to_string()), "{mcn:?}");
}

/// The controller and the agent follow one PolicyConfiguration, and each ClusterRole lets its
/// service account get, list and watch that one object, nothing else of pinset.io.
fn check_policy_configuration(docs: &[Value]) {
    let flag = |workload: &Value| -> String {
        let args = workload["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap();
        args.iter()
            .filter_map(|a| a.as_str()?.strip_prefix("--policy-configuration="))
            .next()
            .unwrap_or_else(|| {
                panic!(
                    "{:?}: no --policy-configuration",
                    workload["metadata"]["name"]
                )
            })
            .to_string()
    };
    let name = flag(of_kind(docs, "DaemonSet")[0]);
    assert_eq!(
        flag(of_kind(docs, "Deployment")[0]),
        name,
        "one configuration"
    );
    assert_eq!(name, pinset_k8s::api::POLICY_CONFIGURATION);
    for role in component_roles(docs) {
        let rules: Vec<&Value> = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["apiGroups"][0] == pinset_k8s::api::PINSET_GROUP)
            .collect();
        assert_eq!(rules.len(), 1, "{:?}", role["metadata"]["name"]);
        assert_eq!(
            rules[0]["resources"],
            serde_json::json!(["policyconfigurations"])
        );
        assert_eq!(rules[0]["resourceNames"], serde_json::json!([name]));
        assert_eq!(
            rules[0]["verbs"],
            serde_json::json!(["get", "list", "watch"])
        );
    }
}

#[test]
fn every_variant_renders_with_kubectl_and_matches_the_binary() {
    let (_, crds, _) = support::pinset(&["crds"]);
    let crd_docs = parse_stream(&crds, "pinset crds");
    let crd_names = names(&crd_docs.iter().collect::<Vec<_>>());
    // The ownership check reads OpenShift's kinds only.
    let openshift: BTreeSet<String> = pinset_k8s::ownership::CRD_NAMES
        .iter()
        .map(|n| n.to_string())
        .collect();

    let Some(full) = render(&deploy()) else {
        return;
    };
    check_base(&full, &openshift);
    assert_eq!(
        names(&of_kind(&full, "CustomResourceDefinition")),
        crd_names
    );

    let base = render(&deploy().join("base")).unwrap();
    check_base(&base, &openshift);
    assert!(
        of_kind(&base, "CustomResourceDefinition").is_empty(),
        "the base leaves the CRDs out"
    );

    // The base with every component, as a user's kustomization would combine them (kustomize
    // takes relative paths only: the directory lies in target/, two levels below deploy/'s).
    let dir = tempfile::tempdir_in(support::workspace().join("target")).unwrap();
    let components = [
        "crds",
        "metrics",
        "openshift",
        "eks-credential-provider",
        "startup-taint",
    ]
    .map(|c| format!("  - ../../deploy/components/{c}\n"))
    .concat();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../deploy/base\ncomponents:\n{components}images:\n  - name: localhost/pinset\n    newName: registry.example.com/pinset\n    newTag: test\n"
        ),
    )
    .unwrap();
    let all = render(dir.path()).unwrap();
    for workload in of_kind(&all, "Deployment")
        .into_iter()
        .chain(of_kind(&all, "DaemonSet"))
    {
        assert_eq!(
            workload["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.example.com/pinset:test",
            "kustomize `images:` points the manifests at a pushed copy"
        );
    }
    let monitors = of_kind(&all, "ServiceMonitor");
    assert_eq!(monitors.len(), 1);
    let services = of_kind(&all, "Service");
    assert_eq!(services.len(), 2);
    for service in services {
        assert_eq!(
            service["spec"]["ports"][0]["port"], 9464,
            "the --metrics-addr port"
        );
    }
    // The kubelet's credential providers: both flags, their paths under a read-only mount.
    let agent = of_kind(&all, "DaemonSet")[0];
    let container = &agent["spec"]["template"]["spec"]["containers"][0];
    let args = serde_saphyr::to_string(&container["args"]).unwrap();
    let dir = "/host/etc/eks/image-credential-provider";
    support::assert_says(
        &args,
        &[
            &format!("--image-credential-provider-config={dir}/config.json"),
            &format!("--image-credential-provider-bin-dir={dir}"),
        ],
    );
    let mounts = container["volumeMounts"].as_array().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m["mountPath"] == dir && m["readOnly"] == true),
        "{mounts:?}"
    );
    // The startup taint: the flag, and the agent's right to patch nodes.
    support::assert_says(
        &args,
        &["--startup-taint=pinset.io/images-pending:NoSchedule"],
    );
    let taint_role = of_kind(&all, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "pinset-agent-startup-taint")
        .expect("the startup taint's ClusterRole");
    assert_eq!(
        taint_role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}])
    );
    let flags = flags("agent");
    assert!(flags.contains("--image-credential-provider-config"));
    assert!(flags.contains("--image-credential-provider-bin-dir"));
    assert!(flags.contains("--startup-taint"));
    let bindings: BTreeSet<&str> = of_kind(&all, "RoleBinding")
        .iter()
        .map(|b| b["roleRef"]["name"].as_str().unwrap())
        .collect();
    assert!(
        bindings.contains("system:openshift:scc:privileged"),
        "{bindings:?}"
    );
}

#[test]
fn the_example_set_is_a_pinned_image_set() {
    let text = std::fs::read_to_string(deploy().join("example-set.yaml")).unwrap();
    let example = &parse_stream(&text, "example-set.yaml")[0];
    assert_eq!(example["kind"], "PinnedImageSet");
}

#[test]
fn the_example_policy_is_the_configuration_pinset_follows() {
    let text = std::fs::read_to_string(deploy().join("example-policy.yaml")).unwrap();
    let example: pinset_k8s::api::PolicyConfiguration = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(
        example.metadata.name.as_deref(),
        Some(pinset_k8s::api::POLICY_CONFIGURATION)
    );
}
