//! `pinset policy new` gives a crate that builds outside this workspace: its unit tests pass
//! natively, `build.sh` builds the component with one sha256 in two directories, and its
//! scenarios pass under `pinset policy test`.

use crate::support;

use std::path::Path;
use std::process::Command;

/// `command` with nothing of this workspace's build in its environment.
fn outside_the_workspace(mut command: Command) -> Command {
    for var in [
        "CARGO_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_MANIFEST_DIR",
    ] {
        command.env_remove(var);
    }
    command
}

/// cargo (the one running these tests) in `dir`, outside the workspace.
fn cargo_in(dir: &Path) -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
    command.current_dir(dir);
    outside_the_workspace(command)
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?}:\n{text}");
    text
}

/// `policy new` into `dir`, with this checkout's SDK and its lock file (the versions this
/// workspace was tested with; the build then needs no registry).
fn scaffold(dir: &Path) {
    let workspace = support::workspace();
    let (code, _, err) = support::pinset(&[
        "policy",
        "new",
        "edge-sites",
        "--fleet",
        "--dir",
        dir.to_str().unwrap(),
        "--sdk-path",
        workspace.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    std::fs::copy(workspace.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
}

/// `build.sh` in `dir` (its own target directory); the module's path and sha256.
fn build(dir: &Path) -> (std::path::PathBuf, String) {
    let mut build = outside_the_workspace(Command::new(dir.join("build.sh")));
    let out = run(build.arg("--offline"));
    let sha = out
        .lines()
        .find(|l| l.contains("edge_sites.wasm sha256:"))
        .and_then(|l| l.split("sha256:").nth(1))
        .unwrap_or_else(|| panic!("no sha256 in: {out}"))
        .trim()
        .to_string();
    (
        dir.join("target/wasm32-wasip2/release/edge_sites.wasm"),
        sha,
    )
}

#[test]
fn a_new_policy_tests_builds_reproducibly_and_passes_its_scenarios_outside_the_workspace() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("elsewhere/b"));
    scaffold(&a);
    scaffold(&b);
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "README.md",
        "build.sh",
        "scenarios/worker.yaml",
        "scenarios/canary-first.yaml",
    ] {
        assert!(a.join(file).exists(), "{file}");
    }

    let tests = run(cargo_in(&a).args(["test", "--offline"]));
    support::assert_says(&tests, &["test result: ok. 3 passed"]);

    let (module, sha_a) = build(&a);
    let (_, sha_b) = build(&b);
    assert_eq!(sha_a, sha_b, "one source, two directories, one module");
    assert_eq!(
        support::sha256(&std::fs::read(&module).unwrap()),
        format!("sha256:{sha_a}")
    );
    let bytes = std::fs::read(&module).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let home = std::env::var("CARGO_HOME")
        .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap()));
    for machine_path in [
        root.path().to_str().unwrap(),
        support::workspace().to_str().unwrap(),
        &home,
    ] {
        assert!(
            !text.contains(machine_path),
            "the module embeds {machine_path}"
        );
    }

    // The repository's own modules embed no machine's paths either.
    for entry in std::fs::read_dir(support::policy_dir()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        for machine_path in [support::workspace().to_str().unwrap(), &home] {
            assert!(
                !text.contains(machine_path),
                "{} embeds {machine_path}",
                path.display()
            );
        }
    }

    let (code, out, err) = support::pinset(&[
        "policy",
        "test",
        "--policy",
        module.to_str().unwrap(),
        a.join("scenarios").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    support::assert_says(&out, &["3 passed, 0 failed"]);

    // A directory that holds anything is left as it is.
    let (code, _, err) = support::pinset(&[
        "policy",
        "new",
        "again",
        "--dir",
        a.to_str().unwrap(),
        "--sdk-git",
        "https://example.com/p.git",
    ]);
    assert_eq!(code, 1, "{err}");
    support::assert_says(&err, &["not empty"]);
}
