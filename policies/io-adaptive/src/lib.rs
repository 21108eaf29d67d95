//! Throttle that follows the node's I/O pressure.
//!
//! The reference's fixed 1 s pause is too long on an idle worker and too short on a control-plane
//! node whose etcd shares the disk. This policy reads Linux PSI (`io some avg10`) after every pull
//! and pauses longer the busier the disk is. Control-plane nodes never pull more than one image at
//! a time; after a failed pull it backs off. Admission is the reference's.

use pinset_policy_sdk::*;

pub const CONTROL_PLANE_CONCURRENCY: u32 = 1;
pub const WORKER_CONCURRENCY: u32 = 4;
/// Pause after a failed pull, whatever the pressure.
pub const AFTER_FAILURE_MS: u64 = 2_000;

/// (io pressure at least, pause on workers ms, pause on control-plane nodes ms), highest first.
pub const PRESSURE_STEPS: [(f32, u64, u64); 4] = [
    (50.0, 15_000, 30_000),
    (20.0, 5_000, 10_000),
    (5.0, 1_000, 3_000),
    (0.0, 0, 500),
];

/// Pause when the kernel gives no pressure information: the reference's 1 s.
pub const NO_PSI_MS: u64 = 1_000;

#[derive(Default)]
pub struct IoAdaptive;

impl Policy for IoAdaptive {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new(
            "io-adaptive",
            env!("CARGO_PKG_VERSION"),
            "throttle grows with io pressure (PSI); control-plane nodes pull one at a time",
        )
    }

    fn concurrency(&self, node: &NodeFacts) -> u32 {
        node.by_role(CONTROL_PLANE_CONCURRENCY, WORKER_CONCURRENCY)
    }

    fn throttle(&self, node: &NodeFacts, outcome: &PullOutcome, pressure: &Pressure) -> u64 {
        let by_pressure = match pressure.io {
            None => NO_PSI_MS,
            Some(io) => {
                let (_, worker, cp) = PRESSURE_STEPS
                    .iter()
                    .copied()
                    .find(|&(at_least, _, _)| io >= at_least)
                    .unwrap_or(PRESSURE_STEPS[PRESSURE_STEPS.len() - 1]);
                node.by_role(cp, worker)
            }
        };
        if let Some(io) = pressure.io
            && by_pressure >= 5_000
        {
            log(
                Level::Info,
                &format!("io pressure {io:.1}%: pausing {by_pressure} ms"),
            );
        }
        if outcome.error.is_some() {
            by_pressure.max(AFTER_FAILURE_MS)
        } else {
            by_pressure
        }
    }
}

export_policy!(IoAdaptive);

#[cfg(test)]
mod tests {
    use super::*;

    fn at(io: Option<f32>, control_plane: bool, failed: bool) -> u64 {
        let node = NodeFacts {
            control_plane,
            ..Default::default()
        };
        let outcome = PullOutcome {
            error: failed.then(|| "boom".into()),
            ..Default::default()
        };
        IoAdaptive.throttle(
            &node,
            &outcome,
            &Pressure {
                io,
                ..Default::default()
            },
        )
    }

    #[test]
    fn pause_grows_with_pressure() {
        assert_eq!(at(Some(0.0), false, false), 0);
        assert_eq!(at(Some(4.99), false, false), 0);
        assert_eq!(at(Some(5.0), false, false), 1_000);
        assert_eq!(at(Some(25.0), false, false), 5_000);
        assert_eq!(at(Some(80.0), false, false), 15_000);
        assert_eq!(at(Some(80.0), true, false), 30_000);
        assert_eq!(at(Some(0.0), true, false), 500);
        assert_eq!(at(None, false, false), 1_000);
        assert_eq!(at(Some(0.0), false, true), 2_000);
        // NaN compares false everywhere: falls through to the lowest step.
        assert_eq!(at(Some(f32::NAN), false, false), 0);
    }
}
