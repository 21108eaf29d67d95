//! Records the source commit for `pinset --version` and the image's labels: `PINSET_COMMIT` when
//! set (scripts/image.sh sets it), else `git rev-parse` of the checkout, else `unknown`. In the
//! release profile the binary — the one the image holds — is linked without its symbol table
//! (panics still name file:line): the profile's `strip` cannot say it, since cargo forgets it for
//! a package with an override of its own (this one's `opt-level`).

use std::path::Path;
use std::process::Command;

fn main() {
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        println!("cargo:rustc-link-arg-bins=-Wl,--strip-all");
    }
    println!("cargo:rerun-if-env-changed=PINSET_COMMIT");
    let git = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.git");
    // A new commit or checkout appends to logs/HEAD; only watched when it exists (a path that
    // does not exist would rerun this script on every build).
    let head_log = git.join("logs/HEAD");
    if head_log.exists() {
        println!("cargo:rerun-if-changed={}", head_log.display());
    }
    let commit = std::env::var("PINSET_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PINSET_COMMIT={commit}");
}
