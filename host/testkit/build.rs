//! Builds every policy of the workspace — the shipped ones in `policies/` and the test-only ones
//! in `tests/policies/` — for `wasm32-wasip2`, and tells the crate where the components are
//! (`PINSET_WASM_POLICY_DIR`, read by [`policy_path`](crate::policy_path)).

#[path = "../policy/wasm_build.rs"]
mod wasm_build;

/// (package, file stem) of every policy built here.
const POLICIES: [(&str, &str); 12] = [
    ("pinset-policy-default", "pinset_policy_default"),
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
    wasm_build::build(&workspace, &target, &components, &POLICIES);
    println!(
        "cargo:rustc-env=PINSET_WASM_POLICY_DIR={}",
        components.display()
    );
}
