//! Per-hook latency of a Wasm policy against the native reference policy on the same inputs.

use super::{NativePolicy, PolicyError, PolicyInstance, PolicyModule, synth};
use std::time::{Duration, Instant};

/// Median and 99th percentile of a set of samples.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub median: Duration,
    pub p99: Duration,
}

impl Stats {
    pub fn of(mut samples: Vec<Duration>) -> Self {
        assert!(!samples.is_empty(), "no samples");
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Stats {
            median: at(0.5),
            p99: at(0.99),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Row {
    pub what: String,
    pub wasm: Stats,
    pub native: Stats,
}

impl Row {
    /// Wasm median over native median.
    pub fn ratio(&self) -> f64 {
        self.wasm.median.as_secs_f64() / self.native.median.as_secs_f64().max(1e-9)
    }
}

/// What each row measures, in order.
pub const ROWS: [&str; 6] = [
    "admit",
    "order",
    "concurrency",
    "throttle",
    "new instance",
    "reconcile (new instance + admit + order + concurrency + 1 throttle)",
];

/// Measure every row `iterations` times (after a short warm-up). `tick` is called after each row.
pub fn run(
    module: &PolicyModule,
    images: usize,
    iterations: usize,
    mut tick: impl FnMut(&'static str),
) -> Result<Vec<Row>, PolicyError> {
    let request = synth::request(images, 42);
    let (outcome, pressure) = synth::outcome(&request);
    let node = &request.node;
    let mut wasm = module.instance();
    let mut native = NativePolicy::reference();
    let warmup = (iterations / 10).max(3);

    // One closure per row, applied to either implementation. `fresh` makes a new instance.
    type Step<'a> = Box<dyn Fn(&mut dyn PolicyInstance) -> Result<(), PolicyError> + 'a>;
    let reconcile = |p: &mut dyn PolicyInstance| -> Result<(), PolicyError> {
        p.admit(&request)?;
        p.order(node, &request.images)?;
        p.concurrency(node)?;
        p.throttle(node, &outcome, &pressure)?;
        Ok(())
    };
    let steps: [(Step, bool); 6] = [
        (Box::new(|p| p.admit(&request).map(drop)), false),
        (
            Box::new(|p| p.order(node, &request.images).map(drop)),
            false,
        ),
        (Box::new(|p| p.concurrency(node).map(drop)), false),
        (
            Box::new(|p| p.throttle(node, &outcome, &pressure).map(drop)),
            false,
        ),
        (Box::new(|p| p.concurrency(node).map(drop)), true),
        (Box::new(reconcile), true),
    ];

    let mut rows = Vec::new();
    for (what, (step, fresh)) in ROWS.into_iter().zip(steps) {
        let mut wasm_samples = Vec::with_capacity(iterations);
        let mut native_samples = Vec::with_capacity(iterations);
        for i in 0..warmup + iterations {
            let started = Instant::now();
            if fresh {
                let mut instance = module.instance();
                step(&mut instance)?;
            } else {
                step(&mut wasm)?;
            }
            let wasm_time = started.elapsed();
            let started = Instant::now();
            if fresh {
                let mut instance = NativePolicy::reference();
                step(&mut instance)?;
            } else {
                step(&mut native)?;
            }
            let native_time = started.elapsed();
            if i >= warmup {
                wasm_samples.push(wasm_time);
                native_samples.push(native_time);
            }
        }
        rows.push(Row {
            what: what.to_string(),
            wasm: Stats::of(wasm_samples),
            native: Stats::of(native_samples),
        });
        tick(what);
    }
    Ok(rows)
}

/// The fleet hook of `module` against the native default fleet policy, for a pool of `nodes`
/// nodes ([`synth::fleet`]), each call in a fresh instance as the controller makes it.
pub fn fleet(
    module: &crate::FleetModule,
    nodes: usize,
    iterations: usize,
) -> Result<Row, PolicyError> {
    use crate::FleetInstance;
    let request = synth::fleet(nodes);
    let warmup = (iterations / 10).max(3);
    let (mut wasm, mut native) = (Vec::new(), Vec::new());
    for i in 0..warmup + iterations {
        let started = Instant::now();
        module.instance().grant(&request)?;
        let wasm_time = started.elapsed();
        let started = Instant::now();
        crate::NativeFleet::reference().grant(&request)?;
        let native_time = started.elapsed();
        if i >= warmup {
            wasm.push(wasm_time);
            native.push(native_time);
        }
    }
    Ok(Row {
        what: format!("fleet grant, {nodes}-node pool (new instance + grant)"),
        wasm: Stats::of(wasm),
        native: Stats::of(native),
    })
}

/// Pool sizes the fleet rows measure.
pub const FLEET_NODES: [usize; 2] = [300, 3000];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_pick_median_and_p99() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let s = Stats::of(samples);
        assert_eq!(s.median, Duration::from_micros(51));
        assert_eq!(s.p99, Duration::from_micros(99));
    }
}
