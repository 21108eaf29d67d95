//! The check a module passes before it decides for a node or a pool: a fresh instance answers
//! `info` and every hook of its contract once, on the current facts ([`Hooks::probe`]), within
//! its limits and without a single fallback.

use crate::{Fallback, Guarded, Hooks, Module};
use pinset_policy_sdk::PolicyInfo;

/// Ask a fresh instance of `module` everything its contract asks, on `probe` (a node's facts:
/// its images, disk, labels and pressure; or a pool's current rollout request). The first
/// fallback, naming the module and the hook, is the error; else what the module says it is.
pub fn smoke_test<C: Hooks>(
    module: &Module<C>,
    probe: C::Probe<'_>,
) -> Result<PolicyInfo, Fallback> {
    let mut guarded = Guarded::of(module).without_warnings();
    let info = guarded.info();
    C::probe(&mut guarded, probe);
    match guarded.take_fallbacks().into_iter().next() {
        Some(fallback) => Err(fallback),
        None => Ok(info),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, NodeContract, WasmRuntime};

    #[test]
    fn the_default_passes_and_names_itself() {
        let runtime = WasmRuntime::new().unwrap();
        let module = runtime
            .load("d", crate::EMBEDDED_DEFAULT, None, Limits::default())
            .unwrap();
        let mut request = pinset_policy_sdk::AdmissionRequest::default();
        request.node.ready = true;
        request.node.allocatable_ephemeral_bytes = Some(100 << 30);
        (request.images).push("q.io/a@sha256:01", ["s"], false, Some(1_000), &[]);
        let pressure = pinset_policy_sdk::Pressure::default();
        let info = smoke_test::<NodeContract>(&module, (&request, &pressure)).unwrap();
        assert_eq!(info.name, "default");
    }
}
