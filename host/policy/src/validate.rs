//! The bounds every decision must respect, whoever made it. An answer outside them is an error
//! of the policy, never something pinset acts on.

use super::{MAX_CONCURRENCY, MAX_THROTTLE};
use pinset_policy_sdk::Verdict;

/// `order` must be a permutation of `0..len`.
pub fn order(order: &[u32], len: usize) -> Result<(), String> {
    if order.len() != len {
        return Err(format!(
            "order has {} entries for {len} images",
            order.len()
        ));
    }
    let mut seen = vec![false; len];
    for &i in order {
        let slot = seen
            .get_mut(i as usize)
            .ok_or_else(|| format!("order names image {i} of {len}"))?;
        if std::mem::replace(slot, true) {
            return Err(format!("order names image {i} twice"));
        }
    }
    Ok(())
}

/// An admitted subset must name only given images, each once.
pub fn verdict(verdict: &Verdict, images: usize) -> Result<(), String> {
    let Verdict::AdmitSome(subset) = verdict else {
        return Ok(());
    };
    let mut seen = vec![false; images];
    for &i in subset {
        let slot = seen
            .get_mut(i as usize)
            .ok_or_else(|| format!("admitted subset names image {i} of {images}"))?;
        if std::mem::replace(slot, true) {
            return Err(format!("admitted subset names image {i} twice"));
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
