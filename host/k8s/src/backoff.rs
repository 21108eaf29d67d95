//! Retry delays of the agent and the controller: exponential, capped, with jitter — a fleet of
//! agents that failed together (a registry outage, an API server restart) must not retry in step.
//! Built on `backon`; the per-image pull retries of a reconcile keep the reference's fixed 1, 2,
//! 4, 8 s (`pinset_node::executor::Backoff`).

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// The wait before retry number `attempt` (1-based): `min · 2^(attempt-1)`, capped at `max`,
/// plus a random jitter of up to as much again (so between that delay and twice it).
pub fn delay(min: Duration, max: Duration, attempt: u32) -> Duration {
    // Past 32 doublings every delay is `max`: no need to walk further.
    let step = attempt.clamp(1, 32) as usize;
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
        .nth(step - 1)
        .unwrap_or(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter_of_up_to_as_much_again() {
        let (min, max) = (Duration::from_secs(10), Duration::from_secs(300));
        for (attempt, base) in [(1, 10), (2, 20), (3, 40), (6, 300), (1_000_000, 300)] {
            let base = Duration::from_secs(base);
            for _ in 0..50 {
                let d = delay(min, max, attempt);
                assert!(d >= base && d <= base * 2, "attempt {attempt}: {d:?}");
            }
        }
    }

    #[test]
    fn agents_that_failed_together_do_not_retry_in_step() {
        let waits: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| delay(Duration::from_secs(10), Duration::from_secs(300), 3))
            .collect();
        assert!(waits.len() > 10, "{waits:?}");
    }
}
