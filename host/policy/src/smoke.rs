//! The check a node policy module passes before it replaces the one a node runs: a fresh
//! instance answers `info` and every hook once, on the node's current facts, within its limits
//! and without a single fallback.

use crate::{Decisions as _, Fallback, FleetModule, Guarded, GuardedFleet, PolicyModule};
use pinset_policy_sdk::{AdmissionRequest, PolicyInfo, Pressure, PullOutcome, RolloutRequest};

/// Ask every hook of a fresh instance of `module` on `request` (the node's facts: its images,
/// disk and labels) and `pressure`. The first fallback, naming the module and the hook, is the
/// error; else what the module says it is.
pub fn smoke_test(
    module: &PolicyModule,
    request: &AdmissionRequest,
    pressure: &Pressure,
) -> Result<PolicyInfo, Fallback> {
    let mut guarded = Guarded::new(Box::new(module.instance())).without_warnings();
    let info = guarded.info();
    let node = &request.node;
    guarded.admit(request);
    let order = guarded.order(node, &request.images);
    guarded.concurrency(node);
    let first = order.first().and_then(|&i| request.images.get(i as usize));
    let outcome = PullOutcome {
        reference: first.map(|i| i.reference.to_string()).unwrap_or_default(),
        error: None,
        bytes: first.and_then(|i| i.size_bytes),
        duration_ms: 1_000,
        remaining: request.images.len().saturating_sub(1) as u32,
    };
    guarded.throttle(node, &outcome, pressure);
    match guarded.take_fallbacks().into_iter().next() {
        Some(fallback) => Err(fallback),
        None => Ok(info),
    }
}

/// The check a fleet module passes before it decides for a pool: a fresh instance answers a
/// grant on the pool's current `request`, within its limits and valid. The fallback, naming
/// the module and the hook, is the error.
pub fn fleet_smoke_test(module: &FleetModule, request: &RolloutRequest) -> Result<(), Fallback> {
    let decided = GuardedFleet::new(Box::new(module.instance()))
        .without_warnings()
        .grant(request);
    match decided.fallback {
        Some(fallback) => Err(fallback),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, WasmRuntime};

    #[test]
    fn the_default_passes_and_names_itself() {
        let runtime = WasmRuntime::new().unwrap();
        let module = runtime
            .load("d", crate::EMBEDDED_DEFAULT, None, Limits::default())
            .unwrap();
        let request = crate::synth::request(50, 7);
        let (_, pressure) = crate::synth::outcome(&request);
        let info = smoke_test(&module, &request, &pressure).unwrap();
        assert_eq!(info.name, "default");
    }
}
