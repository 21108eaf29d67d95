//! The bounds every decision must respect, whoever made it. An answer outside them is an error
//! of the policy, never something pinset acts on.

use super::{MAX_CONCURRENCY, MAX_THROTTLE};
use pinset_policy_sdk::{Grant, RolloutRequest, Verdict};

/// `order` must be a permutation of `0..len`.
pub fn order(order: &[u32], len: usize) -> Result<(), String> {
    if order.len() != len {
        return Err(format!(
            "order has {} entries for {len} images",
            order.len()
        ));
    }
    distinct("order", order, len)
}

/// An admitted subset must name only given images, each once.
pub fn verdict(verdict: &Verdict, images: usize) -> Result<(), String> {
    let Verdict::AdmitSome(subset) = verdict else {
        return Ok(());
    };
    distinct("admitted subset", subset, images)
}

/// Every index names one of `len` images, none twice (`what` names the list in the error).
fn distinct(what: &str, indices: &[u32], len: usize) -> Result<(), String> {
    let mut seen = vec![false; len];
    for &i in indices {
        let slot = seen
            .get_mut(i as usize)
            .ok_or_else(|| format!("{what} names image {i} of {len}"))?;
        if std::mem::replace(slot, true) {
            return Err(format!("{what} names image {i} twice"));
        }
    }
    Ok(())
}

pub fn concurrency(n: u32) -> Result<(), String> {
    if (1..=MAX_CONCURRENCY).contains(&n) {
        Ok(())
    } else {
        Err(format!("concurrency {n} is outside 1..={MAX_CONCURRENCY}"))
    }
}

pub fn throttle_ms(ms: u64) -> Result<(), String> {
    if u128::from(ms) <= MAX_THROTTLE.as_millis() {
        Ok(())
    } else {
        Err(format!(
            "throttle {ms} ms exceeds {} ms",
            MAX_THROTTLE.as_millis()
        ))
    }
}

/// A fleet grant must name nodes of the request, each once, allow 1..=64 pulls per node when
/// it caps them, and keep the pool within its ceiling (`pinset.io/rollout-max-pulling`), as
/// [`pinset_core::rollout::over_ceiling`] counts it: the nodes holding a slot plus every node
/// the grant adds, whatever its state; a grant that adds nobody is within it.
pub fn grant(grant: &Grant, request: &RolloutRequest) -> Result<(), String> {
    let n = request.nodes.len();
    let mut seen = vec![false; n];
    for &i in &grant.nodes {
        let slot = seen
            .get_mut(i as usize)
            .ok_or_else(|| format!("grant names node {i} of {n}"))?;
        if std::mem::replace(slot, true) {
            return Err(format!("grant names node {i} twice"));
        }
    }
    if let Some(m) = grant.max_pulls
        && !(1..=crate::MAX_PULLS).contains(&m)
    {
        return Err(format!("max-pulls {m} is outside 1..={}", crate::MAX_PULLS));
    }
    if grant.hold.is_some() && !grant.nodes.is_empty() {
        return Err(format!(
            "the decision holds the rollout yet grants {} node(s)",
            grant.nodes.len()
        ));
    }
    if let Some((after, ceiling)) = pinset_core::rollout::over_ceiling(request, &grant.nodes) {
        return Err(format!(
            "grant leaves {after} nodes pulling at once, over the pool's ceiling of {ceiling} ({})",
            pinset_policy_sdk::MAX_PULLING_ANNOTATION
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations() {
        assert!(order(&[2, 0, 1], 3).is_ok());
        assert!(order(&[], 0).is_ok());
        assert_eq!(
            order(&[0, 0, 1], 3).unwrap_err(),
            "order names image 0 twice"
        );
        assert!(order(&[0, 1], 3).unwrap_err().contains("2 entries"));
        assert!(order(&[0, 1, 3], 3).unwrap_err().contains("image 3 of 3"));
    }

    #[test]
    fn subsets() {
        assert!(verdict(&Verdict::AdmitSome(vec![1, 0]), 2).is_ok());
        assert!(verdict(&Verdict::AdmitSome(vec![]), 0).is_ok());
        assert!(verdict(&Verdict::AdmitSome(vec![2]), 2).is_err());
        assert!(verdict(&Verdict::AdmitSome(vec![1, 1]), 2).is_err());
        assert!(verdict(&Verdict::Reject, 0).is_ok());
    }

    #[test]
    fn numeric_bounds() {
        assert!(concurrency(1).is_ok() && concurrency(64).is_ok());
        assert!(concurrency(0).is_err() && concurrency(65).is_err());
        assert!(throttle_ms(0).is_ok() && throttle_ms(600_000).is_ok());
        assert!(throttle_ms(600_001).is_err());
    }
}
