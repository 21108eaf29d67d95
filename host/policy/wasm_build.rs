//! Builds policy crates of the workspace for `wasm32-wasip2` with a nested `cargo build`. Shared
//! by the build scripts of `pinset-policy` (the embedded default policy) and `pinset-testkit`
//! (every policy, the test-only ones included).
//!
//! The SDK's bindings are generated here, by the host build (`policies/sdk/bindgen.rs`, on the
//! `wit-parser` the host compiles anyway for wasmtime), and handed to the nested builds
//! (`PINSET_SDK_BINDINGS`): a guest build then compiles the SDK and the policy, no generator.

#[path = "../../policies/sdk/bindgen.rs"]
mod bindgen;

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

/// The SDK's bindings generated from the repository's `wit/` into `<target_dir>/sdk-bindings`,
/// once per build script, for every [`build`] into `target_dir`.
pub fn sdk_bindings(target_dir: &Path) -> PathBuf {
    let wit = self::workspace().join("wit");
    bindgen::generate(&wit, &target_dir.join("sdk-bindings"))
        .unwrap_or_else(|e| panic!("the policy SDK's bindings: {e}"))
}

/// Build each `(package, file stem)` with the SDK's `bindings` ([`sdk_bindings`]) and the cargo
/// `features` given (comma-separated, may be empty), and copy its component into `out`.
pub fn build(
    workspace: &Path,
    target_dir: &Path,
    bindings: &Path,
    out: &Path,
    policies: &[(&str, &str)],
    features: &str,
) {
    std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("create {}: {e}", out.display()));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // One build per policy: in a shared build, cargo would unify the SDK's features
    // (`decisions`, `fleet`, `no-std`) across them, and a module would declare bindings for a
    // contract it does not export.
    for &(package, stem) in policies {
        let mut cmd = guest_build(&cargo, workspace, target_dir, package, bindings);
        if !features.is_empty() {
            cmd.args(["--features", features]);
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

/// `cargo build` of one guest package, with the SDK's `bindings` and the guest's flags only: the
/// ones the repository's `.cargo/config.toml` gives `wasm32-wasip2`, and the paths rustc would
/// embed remapped (the repository, cargo's home, the bindings), so a module's bytes do not depend
/// on where it was built — a crate outside the building workspace (the SDK, for the test-only
/// policies) is named by its absolute path otherwise.
fn guest_build(
    cargo: &str,
    workspace: &Path,
    target_dir: &Path,
    package: &str,
    bindings: &Path,
) -> Command {
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args([
            "build",
            "--locked",
            "--release",
            "--target",
            TARGET,
            "-p",
            package,
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .env("PINSET_SDK_BINDINGS", bindings);
    // Flags meant for the host build must not leak into the guest build.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    let root = self::workspace();
    let home = std::env::var("CARGO_HOME")
        .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap_or_default()));
    let mut flags = vec![
        format!("--remap-path-prefix={}=.", root.display()),
        format!("--remap-path-prefix={home}=/cargo"),
        format!(
            "--remap-path-prefix={}=/pinset-sdk-bindings",
            bindings.display()
        ),
    ];
    flags.extend(configured_flags(&root));
    // This variable replaces the configuration's flags for the target: they are repeated above.
    cmd.env("CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS", flags.join(" "));
    cmd
}

/// The `rustflags` list of `[target.wasm32-wasip2]` in the repository's `.cargo/config.toml`.
fn configured_flags(root: &Path) -> Vec<String> {
    let config = root.join(".cargo/config.toml");
    let text =
        std::fs::read_to_string(&config).unwrap_or_else(|e| panic!("{}: {e}", config.display()));
    let section = text
        .split("[target.wasm32-wasip2]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .unwrap_or_else(|| panic!("{}: no [target.wasm32-wasip2]", config.display()));
    let list = section
        .split_once("rustflags = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .unwrap_or_else(|| panic!("{}: no rustflags for wasm32-wasip2", config.display()));
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}
