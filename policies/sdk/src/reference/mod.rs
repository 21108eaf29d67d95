//! The reference's decisions: what a [`Policy`](crate::Policy) or a [`Fleet`](crate::Fleet)
//! decides for every method it does not write, and all that pinset's default policy
//! (`policies/default`) decides.
//!
//! | decision     | rule                                                                          |
//! |--------------|-------------------------------------------------------------------------------|
//! | admission    | node Ready, no DiskPressure, allocatable ephemeral storage ≥ 16 GiB, and      |
//! |              | 2 × (compressed bytes of absent images, shared layers once, ALL sets) <       |
//! |              | allocatable − 16 GiB                                                          |
//! | order        | the sets' order (the host has already removed duplicates)                     |
//! | concurrency  | 1 on control-plane nodes, 5 elsewhere                                         |
//! | throttle     | 1 s after every pull                                                          |
//! | rollout      | a canary, then waves of 10 % of the pool ([`fleet`])                          |
//!
//! Images of unknown size cannot be counted; they are admitted and named in the reason. The
//! functions are public so that a policy can build on them: admit what the reference admits,
//! then narrow it.

pub mod fleet;

use crate::prelude::*;
use crate::types::{Admission, AdmissionRequest, Images, NodeFacts, Pressure, PullOutcome};
use crate::{GIB, fmt_bytes, identity_order};

/// Ephemeral storage a node keeps for everything else.
pub const RESERVED_BYTES: u64 = 16 * GIB;
/// Images are compressed: unpacking takes about as much again.
pub const DECOMPRESSION_FACTOR: u64 = 2;
pub const CONTROL_PLANE_CONCURRENCY: u32 = 1;
pub const WORKER_CONCURRENCY: u32 = 5;
pub const THROTTLE_MS: u64 = 1_000;

/// The sets' order.
pub fn order(_node: &NodeFacts, images: &Images) -> Vec<u32> {
    identity_order(images)
}

/// One pull at a time on control-plane nodes, five elsewhere.
pub fn concurrency(node: &NodeFacts) -> u32 {
    node.by_role(CONTROL_PLANE_CONCURRENCY, WORKER_CONCURRENCY)
}

/// A fixed pause after every pull.
pub fn throttle(_node: &NodeFacts, _outcome: &PullOutcome, _pressure: &Pressure) -> u64 {
    THROTTLE_MS
}

/// The reference admission, summed over all sets of the node.
///
/// `#[inline]`: compiled in the policy's crate, with the image arithmetic it calls, as a
/// policy's own `admit` is (out of line in the SDK's codegen units the 500-image hook ran 10 %
/// slower, natively and in the sandbox alike; BENCHMARKS.md).
#[inline]
pub fn admit(request: &AdmissionRequest) -> Admission {
    let node = &request.node;
    if let Some(reason) = node_gate(node) {
        return Admission::reject(reason);
    }
    let Some(allocatable) = node.allocatable_ephemeral_bytes else {
        return Admission::reject(format!(
            "node {} does not report allocatable ephemeral-storage",
            node.name
        ));
    };
    if allocatable < RESERVED_BYTES {
        return Admission::reject(format!(
            "node {} has {} allocatable ephemeral-storage, less than the {} reserve",
            node.name,
            fmt_bytes(allocatable),
            fmt_bytes(RESERVED_BYTES)
        ));
    }
    let images = &request.images;
    let bytes = images.pull_bytes(images.absent());
    if bytes.images == 0 {
        return Admission::admit_all("every image is present");
    }
    let needed = bytes.known.saturating_mul(DECOMPRESSION_FACTOR);
    let usable = allocatable - RESERVED_BYTES;
    let unknown = match bytes.unknown_images {
        0 => String::new(),
        n => format!("; {n} image(s) of unknown size not counted"),
    };
    if needed < usable {
        Admission::admit_all(format!(
            "{} image(s) to pull need {} (2 × {}), {} usable{unknown}",
            bytes.images,
            fmt_bytes(needed),
            fmt_bytes(bytes.known),
            fmt_bytes(usable)
        ))
    } else {
        Admission::reject(format!(
            "not enough disk on node {}: {} image(s) need {} (2 × {}) but only {} is usable \
             (allocatable {} − {} reserve){unknown}",
            node.name,
            bytes.images,
            fmt_bytes(needed),
            fmt_bytes(bytes.known),
            fmt_bytes(usable),
            fmt_bytes(allocatable),
            fmt_bytes(RESERVED_BYTES)
        ))
    }
}

/// The node conditions every pull needs: `Some(reason)` when the node may not pull.
#[inline]
pub fn node_gate(node: &NodeFacts) -> Option<String> {
    if !node.ready {
        Some(format!("node {} is not Ready", node.name))
    } else if node.disk_pressure {
        Some(format!("node {} has DiskPressure", node.name))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Verdict;

    fn node(control_plane: bool, allocatable: u64) -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            control_plane,
            ready: true,
            allocatable_ephemeral_bytes: Some(allocatable),
            ..Default::default()
        }
    }

    fn request(allocatable: u64, sizes: &[u64]) -> AdmissionRequest {
        let mut images = Images::new();
        for (i, &s) in sizes.iter().enumerate() {
            let layer = images.add_layer(s);
            images.push(
                &format!("r/{i}@sha256:{i:064x}"),
                ["set"],
                false,
                Some(s),
                &[layer],
            );
        }
        AdmissionRequest {
            node: node(false, allocatable),
            images,
            ..Default::default()
        }
    }

    #[test]
    fn disk_boundary_is_strict() {
        // usable = 4 GiB; 2 × 2 GiB == 4 GiB is not strictly less: rejected.
        let at_limit = admit(&request(20 * GIB, &[GIB, GIB]));
        assert_eq!(at_limit.verdict, Verdict::Reject, "{}", at_limit.reason);
        assert!(
            at_limit.reason.contains("not enough disk"),
            "{}",
            at_limit.reason
        );
        let below = admit(&request(20 * GIB, &[GIB, GIB - 1]));
        assert_eq!(below.verdict, Verdict::AdmitAll, "{}", below.reason);
    }

    #[test]
    fn small_allocatable_and_conditions_reject() {
        assert_eq!(admit(&request(16 * GIB - 1, &[])).verdict, Verdict::Reject);
        let mut r = request(100 * GIB, &[GIB]);
        r.node.ready = false;
        assert!(admit(&r).reason.contains("not Ready"));
        r.node.ready = true;
        r.node.disk_pressure = true;
        assert!(admit(&r).reason.contains("DiskPressure"));
        r.node.disk_pressure = false;
        r.node.allocatable_ephemeral_bytes = None;
        assert!(admit(&r).reason.contains("allocatable"));
    }

    #[test]
    fn unknown_sizes_are_admitted_and_named() {
        let mut r = request(100 * GIB, &[GIB]);
        r.images.push("x@sha256:00", ["set"], false, None, &[]);
        let a = admit(&r);
        assert_eq!(a.verdict, Verdict::AdmitAll);
        assert!(
            a.reason.contains("1 image(s) of unknown size"),
            "{}",
            a.reason
        );
    }

    #[test]
    fn concurrency_and_throttle_follow_the_reference() {
        assert_eq!(concurrency(&node(true, 0)), 1);
        assert_eq!(concurrency(&node(false, 0)), 5);
        assert_eq!(
            throttle(
                &node(true, 0),
                &PullOutcome::default(),
                &Pressure::default()
            ),
            1000
        );
    }
}
