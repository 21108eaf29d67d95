//! The contract's bindings for a `wasm32` build (`bindgen.rs`): the directory named by
//! `PINSET_SDK_BINDINGS` when the build is pinset's own (its build scripts generate them once for
//! every policy), else generated here into `OUT_DIR` (feature `bindgen`). The SDK includes them
//! from `PINSET_SDK_BINDINGS_DIR`. A native build (unit tests, the host's fallback) needs none.

#[cfg(feature = "bindgen")]
#[path = "bindgen.rs"]
mod bindgen;

use std::path::PathBuf;

const DIR_VAR: &str = "PINSET_SDK_BINDINGS";

fn main() {
    println!("cargo:rerun-if-env-changed={DIR_VAR}");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("wasm32") {
        return;
    }
    // Given: `include!` reads the files (a missing one is an error naming its path) and tracks
    // them, so a change to them rebuilds the SDK without this script.
    let dir = match std::env::var_os(DIR_VAR) {
        Some(dir) => PathBuf::from(dir),
        None => generated(),
    };
    println!("cargo:rustc-env=PINSET_SDK_BINDINGS_DIR={}", dir.display());
}

#[cfg(feature = "bindgen")]
fn generated() -> PathBuf {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let wit = manifest.join("../../wit");
    println!("cargo:rerun-if-changed={}", wit.display());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("bindings");
    bindgen::generate(&wit, &out).unwrap_or_else(|e| panic!("the contract's bindings: {e}"))
}

#[cfg(not(feature = "bindgen"))]
fn generated() -> PathBuf {
    panic!(
        "pinset-policy-sdk for wasm32 needs the contract's bindings: enable its `bindgen` \
         feature (in the policy's Cargo.toml, or `--features pinset-policy-sdk/bindgen`); \
         pinset's own builds set {DIR_VAR} instead"
    )
}
