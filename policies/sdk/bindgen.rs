//! The SDK's component bindings: wit-bindgen's guest code for each contract of `wit/`, generated
//! at build time, never checked in. One generator, two callers, one output:
//!
//! - the SDK's own build script (`build.rs`, feature `bindgen`): a policy built outside pinset's
//!   workspace (`pinset policy new`) generates its bindings when it is built;
//! - pinset's build scripts that build policies for `wasm32-wasip2` (`host/policy/wasm_build.rs`):
//!   they generate the bindings once, with the generator the host build already compiles for
//!   wasmtime's own bindings (the same `wit-parser` and `wit-component`), and hand them to the
//!   nested guest builds (`PINSET_SDK_BINDINGS`), which then compile no generator at all.
//!
//! Included by path (`#[path]`) into those build scripts: it uses nothing but `std` and the
//! `wit-bindgen-core` and `wit-bindgen-rust` crates both declare. The files it writes (`policy.rs`,
//! `fleet.rs`) are the ones the SDK's `build.rs` expects in a given directory.

use std::path::{Path, PathBuf};

/// One contract's bindings: where its WIT is (under the repository's `wit/`), which world, the
/// export macro the SDK wraps, the module the generated code names itself by, and its file.
struct Contract {
    wit: &'static str,
    world: &'static str,
    export_macro: &'static str,
    module: &'static str,
    file: &'static str,
}

const CONTRACTS: [Contract; 2] = [
    Contract {
        wit: ".",
        world: "policy",
        export_macro: "__export_decisions",
        module: "pinset_policy_sdk::bindings",
        file: "policy.rs",
    },
    Contract {
        wit: "fleet",
        world: "fleet-policy",
        export_macro: "__export_rollout",
        module: "pinset_policy_sdk::fleet_bindings",
        file: "fleet.rs",
    },
];

/// Generate every contract's bindings from the WIT in `wit` into `out`. A file is written only
/// when its text changes, so a build that reruns this recompiles no policy for nothing.
pub fn generate(wit: &Path, out: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    for contract in &CONTRACTS {
        let text = bindings(&wit.join(contract.wit), contract)?;
        let path = out.join(contract.file);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(out.to_path_buf())
}

/// wit-bindgen's guest code of one contract, with the options the SDK's export macros rely on.
fn bindings(wit: &Path, contract: &Contract) -> Result<String, String> {
    use wit_bindgen_core::wit_parser::Resolve;
    use wit_bindgen_core::{Files, WorldGenerator};

    // `{:#}`: wit-parser's and wit-bindgen's errors with their causes (file:line of the WIT).
    let at =
        |e: &dyn std::fmt::Display| format!("{} (world {}): {e:#}", wit.display(), contract.world);
    let mut resolve = Resolve::default();
    let (package, _) = resolve.push_path(wit).map_err(|e| at(&e))?;
    let world = resolve
        .select_world(&[package], Some(contract.world))
        .map_err(|e| at(&e))?;
    let opts = wit_bindgen_rust::Opts {
        format: true,
        pub_export_macro: true,
        export_macro_name: Some(contract.export_macro.into()),
        default_bindings_module: Some(contract.module.into()),
        ..Default::default()
    };
    let mut files = Files::default();
    opts.build()
        .generate(&mut resolve, world, &mut files)
        .map_err(|e| at(&e))?;
    let (_, text) = files
        .iter()
        .next()
        .ok_or_else(|| at(&"wit-bindgen wrote no file"))?;
    Ok(String::from_utf8_lossy(text).into_owned())
}
