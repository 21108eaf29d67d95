//! Builds the default policy (`policies/default`) for `wasm32-wasip2` and embeds it: the module a
//! node runs when it is given none.

#[path = "wasm_build.rs"]
mod wasm_build;

use std::path::PathBuf;

fn main() {
    let workspace = wasm_build::workspace();
    wasm_build::watch(&workspace, &["policies/default", "policies/sdk"]);
    let target = wasm_build::target_dir(&workspace, "wasm-default-policy");
    let bindings = wasm_build::sdk_bindings(&target);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    wasm_build::build(
        &workspace,
        &target,
        &bindings,
        &out_dir,
        &[("pinset-policy-default", "pinset_policy_default")],
        "export",
    );
    std::fs::rename(
        out_dir.join("pinset_policy_default.wasm"),
        out_dir.join("default-policy.wasm"),
    )
    .expect("the default policy was just copied here");
}
