//! Builds the Wasm policies of the workspace for `wasm32-wasip2` and embeds the default one;
//! generates the CRI gRPC code from `proto/`.
//!
//! Every policy crate (`policies/*`, and the test-only `tests/policies/*`) is compiled by a
//! nested `cargo build` into `<target>/wasm-policies`; the components are collected in its
//! `components/`. The default policy's component is copied into `OUT_DIR` and included in the
//! binary; the directory of all of them is exported to the crate's tests as
//! `PINSET_WASM_POLICY_DIR`.

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

/// (package, file stem) of every policy built here.
const POLICIES: [(&str, &str); 7] = [
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
    ("pinset-test-policy-hostile", "pinset_test_policy_hostile"),
    (
        "pinset-test-policy-future-contract",
        "pinset_test_policy_future_contract",
    ),
    (
        "pinset-test-policy-unthrottled",
        "pinset_test_policy_unthrottled",
    ),
];

fn main() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .parent()
        .expect("host/ sits in the workspace")
        .to_path_buf();
    for watched in ["wit", "policies", "tests/policies", "Cargo.lock"] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    let target_root = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let wasm_target_dir = target_root.join("wasm-policies");
    compile_protos(&workspace);

    let artifacts = wasm_target_dir.join("components");
    build_policies(&workspace, &wasm_target_dir, &artifacts);

    let out_dir = PathBuf::from(env("OUT_DIR"));
    let default = artifacts.join("pinset_policy_default.wasm");
    std::fs::copy(&default, out_dir.join("default-policy.wasm"))
        .unwrap_or_else(|e| panic!("copy {}: {e}", default.display()));
    println!(
        "cargo:rustc-env=PINSET_WASM_POLICY_DIR={}",
        artifacts.display()
    );
}

/// Build every policy and copy its component into `out`.
fn build_policies(workspace: &Path, target_dir: &Path, out: &Path) {
    std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("create {}: {e}", out.display()));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // One build per policy: in a shared build, cargo would unify the features of
    // `pinset-policy-default` and export its decisions from every policy that reuses its rules.
    for (package, stem) in POLICIES {
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(workspace)
            .args([
                "build",
                "--release",
                "--target",
                TARGET,
                "-p",
                package,
                "--target-dir",
            ])
            .arg(target_dir);
        // Flags meant for the host build must not leak into the guest build.
        for var in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTFLAGS",
            "CARGO_BUILD_TARGET",
            "CARGO_TARGET_DIR",
        ] {
            cmd.env_remove(var);
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo for {package}: {e}"));
        if !status.success() {
            panic!(
                "building policy {package} for {TARGET} failed (see above). If the target is \
                 missing, install it with `rustup target add {TARGET}`."
            );
        }
        // A policy that depends on another rebuilds the other's cdylib without its export:
        // take each artifact right after its own build.
        let wasm = target_dir
            .join(TARGET)
            .join("release")
            .join(format!("{stem}.wasm"));
        let kept = out.join(format!("{stem}.wasm"));
        std::fs::copy(&wasm, &kept).unwrap_or_else(|e| {
            panic!("building {package} did not produce {}: {e}", wasm.display())
        });
    }
}

/// The CRI ImageService client and server, and containerd's images client, compiled with
/// protox: no `protoc` needed.
fn compile_protos(workspace: &Path) {
    let proto_dir = workspace.join("proto");
    println!("cargo:rerun-if-changed={}", proto_dir.display());
    let files = [
        proto_dir.join("cri_image.proto"),
        proto_dir.join("containerd_images.proto"),
    ];
    let fds = protox::compile(files, [&proto_dir]).unwrap_or_else(|e| panic!("proto/: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the CRI code: {e}"));
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}
