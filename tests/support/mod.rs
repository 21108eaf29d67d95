//! What the integration tests share: the test bed of `pinset-testkit`, and the `pinset` binary
//! of this package (only its own tests know where cargo built it).

#![allow(dead_code, unused_imports)]

pub use pinset_testkit::*;

use std::process::Command;

/// The `pinset` binary cargo built for these tests.
pub const PINSET: &str = env!("CARGO_BIN_EXE_pinset");

/// Run the `pinset` binary with `args`: (exit code, stdout, stderr).
pub fn pinset(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(PINSET)
        .args(args)
        .env("PINSET_LOG", "warn")
        .output()
        .expect("run pinset");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
