//! The layering of docs/ARCHITECTURE.md as a fact of the dependency graph: what each crate may
//! not depend on, directly or through another crate, checked with `cargo tree`.

use std::collections::BTreeSet;
use std::process::Command;

/// Every package in the normal (non-dev, non-build) dependency tree of `krate`.
fn dependencies(krate: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--locked", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", krate])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {krate}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

fn forbid(krate: &str, forbidden: &[&str]) {
    let deps = dependencies(krate);
    assert!(
        deps.contains(krate),
        "{krate} is not in its own tree: {deps:?}"
    );
    let found: Vec<&&str> = forbidden.iter().filter(|f| deps.contains(**f)).collect();
    assert!(found.is_empty(), "{krate} depends on {found:?}");
}

#[test]
fn the_core_depends_on_no_runtime_and_no_adapter() {
    forbid(
        "pinset-core",
        &[
            "tokio",
            "tonic",
            "kube",
            "wasmtime",
            "hyper",
            "pinset-policy",
            "pinset-registry",
            "pinset-node",
            "pinset-k8s",
        ],
    );
}

/// The network edge reads registries and nothing else: no runtime of the node (CRI), no
/// Kubernetes, no Wasm; and no HTTP client library that would read bodies for it (every answer
/// goes through its own bounded reader).
#[test]
fn the_registry_edge_is_the_only_registry_client() {
    forbid(
        "pinset-registry",
        &[
            "tonic",
            "kube",
            "wasmtime",
            "pinset-policy",
            "pinset-node",
            "pinset-k8s",
            "reqwest",
            "oci-client",
        ],
    );
    for krate in ["pinset", "pinset-node", "pinset-k8s"] {
        forbid(krate, &["reqwest", "oci-client"]);
    }
}

#[test]
fn the_policy_layer_knows_neither_the_node_nor_kubernetes_nor_metrics() {
    forbid(
        "pinset-policy",
        &[
            "tonic",
            "kube",
            "hyper",
            "prometheus-client",
            "pinset-registry",
            "pinset-node",
            "pinset-k8s",
        ],
    );
}

#[test]
fn the_node_takes_its_decisions_as_an_argument() {
    forbid(
        "pinset-node",
        &["wasmtime", "kube", "pinset-policy", "pinset-k8s"],
    );
}

#[test]
fn nothing_test_only_is_built_into_the_binary() {
    forbid(
        "pinset",
        &[
            "pinset-testkit",
            "pinset-test-policy-hostile",
            "pinset-test-policy-unthrottled",
            "pinset-test-policy-future-contract",
            "pinset-test-policy-floor",
            "pinset-test-policy-fleet-0-2-0",
            "pinset-test-policy-mismatch",
            "pinset-test-policy-future-fleet",
        ],
    );
    forbid("pinset-k8s", &["pinset-testkit", "pinset-cri-sim"]);
}

/// The agent and the controller (pinset-k8s, over the node and the policy layer) carry no
/// benchmark machinery (the synthetic inputs included): `pinset policy bench`, the benches and
/// the tests take it from its own crate.
#[test]
fn the_agent_and_the_controller_carry_no_benchmark() {
    for krate in ["pinset-k8s", "pinset-node", "pinset-policy"] {
        forbid(krate, &["pinset-policy-bench"]);
    }
}
