//! Builds policy crates of the workspace for `wasm32-wasip2` with a nested `cargo build`. Shared
//! by the build scripts of `pinset-policy` (the embedded default policy) and `pinset-testkit`
//! (every policy, the test-only ones included).

use std::path::{Path, PathBuf};
use std::process::Command;

pub const TARGET: &str = "wasm32-wasip2";

/// The workspace root, two levels above the crate being built.
pub fn workspace() -> PathBuf {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    manifest_dir
        .ancestors()
        .nth(2)
        .expect("host/<crate> sits in the workspace")
        .to_path_buf()
}

/// `<target>/<name>`: the nested build's own target directory. Each caller has its own, so two
/// build scripts running at once never overwrite each other's artifacts.
pub fn target_dir(workspace: &Path, name: &str) -> PathBuf {
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join(name)
}

/// Rebuild when the contract, the policies or the lock file change.
pub fn watch(workspace: &Path, dirs: &[&str]) {
    // The guest build flags (`.cargo/config.toml`) shape the modules too.
    for watched in dirs
        .iter()
        .chain(&["wit", "Cargo.lock", ".cargo/config.toml"])
    {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
}

/// Build each `(package, file stem)` and copy its component into `out`.
pub fn build(workspace: &Path, target_dir: &Path, out: &Path, policies: &[(&str, &str)]) {
    std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("create {}: {e}", out.display()));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // One build per policy: in a shared build, cargo would unify the features of
    // `pinset-policy-default` and export its decisions from every policy that reuses its rules.
    for &(package, stem) in policies {
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(workspace)
            .args(["build", "--release", "--target", TARGET, "-p", package])
            .arg("--target-dir")
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
