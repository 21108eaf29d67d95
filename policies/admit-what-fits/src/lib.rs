//! Admit the largest prefix of the images that fits, instead of all or nothing.
//!
//! The reference rejects the whole node when the sets do not fit, so nothing gets pinned. This
//! policy measures against the image filesystem's real free space (falling back to allocatable
//! ephemeral storage) minus a reserve, walks the images in the sets' order and admits them until
//! the next one would not fit. The reason names the first image left out.

use pinset_policy_sdk::*;

/// Kept free on the image filesystem: 10 % of its capacity, at least this much.
pub const MIN_RESERVE_BYTES: u64 = 4 * GIB;
pub const RESERVE_PERCENT: u64 = 10;

#[derive(Default)]
pub struct AdmitWhatFits;

/// Bytes the images may use on this node and where that figure came from.
pub fn budget(request: &AdmissionRequest) -> Option<(u64, &'static str)> {
    let disk = &request.disk;
    if let Some(available) = disk.available_bytes {
        let reserve = disk.capacity_bytes.map_or(MIN_RESERVE_BYTES, |c| {
            (c / 100 * RESERVE_PERCENT).max(MIN_RESERVE_BYTES)
        });
        return Some((
            available.saturating_sub(reserve),
            "image filesystem free space",
        ));
    }
    let allocatable = request.node.allocatable_ephemeral_bytes?;
    Some((
        allocatable.saturating_sub(reference::RESERVED_BYTES),
        "allocatable ephemeral-storage",
    ))
}

impl Policy for AdmitWhatFits {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new(
            "admit-what-fits",
            env!("CARGO_PKG_VERSION"),
            "admits the largest prefix of the images that fits in free space minus a reserve",
        )
    }

    fn admit(&self, request: &AdmissionRequest) -> Admission {
        if let Some(reason) = reference::node_gate(&request.node) {
            return Admission::reject(reason);
        }
        let Some((budget, source)) = budget(request) else {
            return Admission::reject(format!(
                "node {} reports neither image filesystem free space nor allocatable storage",
                request.node.name
            ));
        };
        let images = &request.images;
        let mut seen = vec![false; images.layer_sizes().len()];
        let mut used = 0u64;
        let mut admitted = Vec::new();
        let absent: Vec<u32> = images.absent().collect();
        for &i in &absent {
            let image = images
                .get(i as usize)
                .expect("absent() yields valid indices");
            // Bytes of the layers not yet counted, each once even if listed twice.
            let mut bytes = 0u64;
            let mut fresh = Vec::new();
            for &l in image.layers {
                if !seen[l as usize] && !fresh.contains(&l) {
                    fresh.push(l);
                    bytes = bytes.saturating_add(images.layer_sizes()[l as usize]);
                }
            }
            let bytes = bytes.saturating_mul(2);
            if used.saturating_add(bytes) > budget {
                let reason = format!(
                    "{} of {} image(s) fit in {} of {source}; {} (needs {}) and later images left out",
                    admitted.len(),
                    absent.len(),
                    fmt_bytes(budget),
                    image.reference,
                    fmt_bytes(bytes)
                );
                return if admitted.is_empty() {
                    Admission::reject(reason)
                } else {
                    Admission::admit_some(admitted, reason)
                };
            }
            for l in fresh {
                seen[l as usize] = true;
            }
            used += bytes;
            admitted.push(i);
        }
        Admission::admit_all(format!(
            "{} image(s) need {} of {} of {source}",
            absent.len(),
            fmt_bytes(used),
            fmt_bytes(budget)
        ))
    }
}

export_policy!(AdmitWhatFits);

#[cfg(test)]
mod tests {
    use super::*;

    fn request(available: u64, sizes: &[u64]) -> AdmissionRequest {
        AdmissionRequest {
            node: NodeFacts {
                name: "w".into(),
                ready: true,
                ..Default::default()
            },
            disk: DiskFacts {
                capacity_bytes: Some(100 * GIB),
                available_bytes: Some(available),
                ..Default::default()
            },
            images: {
                let mut images = Images::new();
                for (i, &s) in sizes.iter().enumerate() {
                    let l = images.add_layer(s);
                    images.push(&format!("img{i}"), ["s"], false, Some(s), &[l]);
                }
                images
            },
        }
    }

    #[test]
    fn admits_the_prefix_that_fits() {
        // budget = 20 GiB − 10 GiB reserve = 10 GiB; 2 × (2 + 2) fits, 2 × 2 more does not.
        let a = AdmitWhatFits.admit(&request(20 * GIB, &[2 * GIB, 2 * GIB, 2 * GIB, GIB / 2]));
        assert_eq!(a.verdict, Verdict::AdmitSome(vec![0, 1]), "{}", a.reason);
        assert!(a.reason.contains("img2"), "{}", a.reason);
    }

    #[test]
    fn all_or_nothing_edges() {
        assert_eq!(
            AdmitWhatFits.admit(&request(20 * GIB, &[GIB])).verdict,
            Verdict::AdmitAll
        );
        assert_eq!(
            AdmitWhatFits.admit(&request(20 * GIB, &[6 * GIB])).verdict,
            Verdict::Reject
        );
    }
}
