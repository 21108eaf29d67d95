//! pinset's default policy: the reference behaviour, with the disk check done once for all sets
//! of the node, and the reference's rollout (a canary, then waves of 10 %).
//!
//! It writes no decision of its own: every one is the SDK's default, the reference's rules in
//! `pinset_policy_sdk::reference` (the table of what they decide is there). A policy that
//! changes one decision writes that one and keeps the others alike.
//! The same source is compiled into pinset as its native fallback policy. It needs no standard
//! library (natively it is linked with pinset's): the module imports the contract's interfaces
//! and nothing else (no WASI).

// Built as the module (`export`), the SDK's `no-std` brings the panic handler, which a `std` here
// would define a second time.
#![cfg_attr(all(target_arch = "wasm32", feature = "export"), no_std)]

use pinset_policy_sdk::*;

#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultPolicy;

impl Policy for DefaultPolicy {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new(
            "default",
            env!("CARGO_PKG_VERSION"),
            "reference behaviour: 1 pull at a time on control-plane nodes, 5 elsewhere, 1 s \
             throttle, disk admission against allocatable minus 16 GiB across all sets",
        )
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultFleet;

impl Fleet for DefaultFleet {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new(
            "default-fleet",
            env!("CARGO_PKG_VERSION"),
            "one canary node per pool first; after it pins the target, waves of max(1, 10%) of \
             the pool's nodes (pinset.io/rollout-max-pulling overrides); a failed canary holds \
             the rest",
        )
    }
}

#[cfg(feature = "export")]
export_policy!(DefaultPolicy);
#[cfg(feature = "export")]
export_fleet!(DefaultFleet);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_is_the_references() {
        let node = |control_plane| NodeFacts {
            name: "n".into(),
            ready: true,
            control_plane,
            allocatable_ephemeral_bytes: Some(20 * GIB),
            ..Default::default()
        };
        let mut images = Images::new();
        let layer = images.add_layer(3 * GIB);
        images.push("q.io/a@sha256:00", ["s"], false, Some(3 * GIB), &[layer]);
        let request = AdmissionRequest {
            node: node(false),
            images,
            ..Default::default()
        };
        let (a, b) = (DefaultPolicy.admit(&request), reference::admit(&request));
        assert_eq!((a.verdict, a.reason), (b.verdict, b.reason));
        assert_eq!(DefaultPolicy.concurrency(&node(true)), 1);
        assert_eq!(DefaultPolicy.concurrency(&node(false)), 5);
        let pause =
            DefaultPolicy.throttle(&node(false), &PullOutcome::default(), &Pressure::default());
        assert_eq!(pause, reference::THROTTLE_MS);
    }
}
