//! Builds the example policies (`policies/`) and the test-only ones (`tests/policies/`, a
//! workspace of their own) for `wasm32-wasip2`, and tells the crate where the components are
//! (`PINSET_WASM_POLICY_DIR`, read by [`policy_path`](crate::policy_path)). The default policy
//! is not built here: `pinset-policy` embeds it, and `policy_path` writes those bytes.

#[path = "../policy/wasm_build.rs"]
mod wasm_build;

/// (package, file stem) of the example policies, members of the host workspace.
const EXAMPLES: [(&str, &str); 4] = [
    (
        "pinset-policy-smallest-first",
        "pinset_policy_smallest_first",
    ),
    ("pinset-policy-io-adaptive", "pinset_policy_io_adaptive"),
    (
        "pinset-policy-admit-what-fits",
        "pinset_policy_admit_what_fits",
    ),
    ("pinset-policy-zone-by-zone", "pinset_policy_zone_by_zone"),
];

/// (package, file stem) of the test-only policies (`tests/policies/Cargo.toml`).
const TEST_ONLY: [(&str, &str); 7] = [
    ("pinset-test-policy-hostile", "pinset_test_policy_hostile"),
    (
        "pinset-test-policy-future-contract",
        "pinset_test_policy_future_contract",
    ),
    (
        "pinset-test-policy-unthrottled",
        "pinset_test_policy_unthrottled",
    ),
    ("pinset-test-policy-floor", "pinset_test_policy_floor"),
    (
        "pinset-test-policy-fleet-0-2-0",
        "pinset_test_policy_fleet_0_2_0",
    ),
    ("pinset-test-policy-mismatch", "pinset_test_policy_mismatch"),
    (
        "pinset-test-policy-future-fleet",
        "pinset_test_policy_future_fleet",
    ),
];

fn main() {
    let workspace = wasm_build::workspace();
    wasm_build::watch(&workspace, &["policies", "tests/policies"]);
    let target = wasm_build::target_dir(&workspace, "wasm-policies");
    let components = target.join("components");
    // One generation for both workspaces' policies (the test-only ones use the SDK too).
    let bindings = wasm_build::sdk_bindings(&target);
    wasm_build::build(&workspace, &target, &bindings, &components, &EXAMPLES, "");
    wasm_build::build(
        &workspace.join("tests/policies"),
        &target,
        &bindings,
        &components,
        &TEST_ONLY,
        "",
    );
    println!(
        "cargo:rustc-env=PINSET_WASM_POLICY_DIR={}",
        components.display()
    );
}
