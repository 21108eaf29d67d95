//! Per-hook latency of a Wasm policy against the native reference policy on the same inputs
//! ([`synth`]'s), a floor module or a fleet: what `pinset policy bench` and the
//! benchmarks measure with. A crate of its own: the agent and the controller do not carry it.

pub mod synth;

use pinset_policy::{
    FleetContract, FleetInstance, FleetModule, Native, NodeContract, PolicyError, PolicyInstance,
    PolicyModule,
};
use pinset_policy_sdk::{AdmissionRequest, Pressure, PullOutcome};
use std::time::{Duration, Instant};

/// Median and 99th percentile of a set of samples, and how much the median itself moves
/// within the run.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub median: Duration,
    pub p99: Duration,
    /// The spread (largest − smallest) of the medians of [`BLOCKS`] consecutive blocks of the
    /// samples: what the machine's noise does to a median over this run. A difference between
    /// two runs smaller than their noise says nothing.
    pub noise: Duration,
}

/// Blocks of samples a run's noise is estimated over.
pub const BLOCKS: usize = 5;

impl Stats {
    /// `samples` in the order they were taken (the noise is over consecutive blocks).
    pub fn of(samples: Vec<Duration>) -> Self {
        assert!(!samples.is_empty(), "no samples");
        let block = samples.len().div_ceil(BLOCKS);
        let medians: Vec<Duration> = samples
            .chunks(block)
            .map(|b| median(&mut b.to_vec()))
            .collect();
        let noise = match (medians.iter().max(), medians.iter().min()) {
            (Some(hi), Some(lo)) => *hi - *lo,
            _ => Duration::ZERO,
        };
        let mut sorted = samples;
        sorted.sort_unstable();
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        Stats {
            median: at(0.5),
            p99: at(0.99),
            noise,
        }
    }
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[(samples.len() - 1) / 2]
}

/// What a row's second column measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// The native reference: the default policy's own source compiled into pinset, a baseline
    /// for the embedded default module.
    Native,
    /// The same native reference beside another module: the default's code, no baseline for
    /// that module (no ratio is drawn from it).
    NativeDefault,
    /// The floor module, which decides nothing (`--floor`).
    Floor,
}

impl Baseline {
    /// The word `policy bench` prints and writes (`baseline` in its JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            Baseline::Native => "native",
            Baseline::NativeDefault => "native default",
            Baseline::Floor => "floor",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Row {
    pub what: String,
    pub wasm: Stats,
    /// The baseline's figures: the native reference's, or the floor module's.
    pub native: Stats,
    /// What `native` measured.
    pub baseline: Baseline,
}

impl Row {
    /// Wasm median over the baseline's median, when the baseline is one for the module measured.
    pub fn ratio(&self) -> Option<f64> {
        (self.baseline != Baseline::NativeDefault)
            .then(|| self.wasm.median.as_secs_f64() / self.native.median.as_secs_f64().max(1e-9))
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

/// What a reconcile asks a policy before its pulls: `admit`, `order`, `concurrency` and one
/// `throttle` (the *reconcile* row, with a new instance).
fn reconcile(
    p: &mut dyn PolicyInstance,
    request: &AdmissionRequest,
    outcome: &PullOutcome,
    pressure: &Pressure,
) -> Result<(), PolicyError> {
    p.admit(request)?;
    p.order(&request.node, &request.images)?;
    p.concurrency(&request.node)?;
    p.throttle(&request.node, outcome, pressure)?;
    Ok(())
}

/// One row's work, applied to either implementation.
type Step<'a> = Box<dyn Fn(&mut dyn PolicyInstance) -> Result<(), PolicyError> + 'a>;

/// One run of `step`, on `kept`, or on a new instance when `fresh` makes one (its making
/// timed too: a fresh instance is what that row measures); its time.
fn time_step(
    step: &Step,
    kept: &mut dyn PolicyInstance,
    fresh: Option<&dyn Fn() -> Box<dyn PolicyInstance>>,
) -> Result<std::time::Duration, PolicyError> {
    let started = Instant::now();
    match fresh {
        Some(new) => step(new().as_mut())?,
        None => step(kept)?,
    }
    Ok(started.elapsed())
}

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
    let mut native = Native::<NodeContract>::reference();
    let warmup = (iterations / 10).max(3);

    // One closure per row, applied to either implementation. `fresh` makes a new instance.
    let reconcile = |p: &mut dyn PolicyInstance| reconcile(p, &request, &outcome, &pressure);
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
        let new_wasm = || Box::new(module.instance()) as Box<dyn PolicyInstance>;
        let new_native =
            || Box::new(Native::<NodeContract>::reference()) as Box<dyn PolicyInstance>;
        for i in 0..warmup + iterations {
            let wasm_time = time_step(&step, &mut wasm, fresh.then_some(&new_wasm))?;
            let native_time = time_step(&step, &mut native, fresh.then_some(&new_native))?;
            if i >= warmup {
                wasm_samples.push(wasm_time);
                native_samples.push(native_time);
            }
        }
        rows.push(Row {
            what: what.to_string(),
            wasm: Stats::of(wasm_samples),
            native: Stats::of(native_samples),
            baseline: Baseline::Native,
        });
        tick(what);
    }
    Ok(rows)
}

/// The fleet hook of `module` against the native default fleet policy, for a pool of `nodes`
/// nodes ([`synth::fleet`]), each call in a fresh instance as the controller makes it.
pub fn fleet(module: &FleetModule, nodes: usize, iterations: usize) -> Result<Row, PolicyError> {
    let request = synth::fleet(nodes);
    let warmup = (iterations / 10).max(3);
    let (mut wasm, mut native) = (Vec::new(), Vec::new());
    for i in 0..warmup + iterations {
        let started = Instant::now();
        module.instance().grant(&request)?;
        let wasm_time = started.elapsed();
        let started = Instant::now();
        Native::<FleetContract>::reference().grant(&request)?;
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
        baseline: Baseline::Native,
    })
}

/// A fresh instance and a whole reconcile of `module` against the same of `floor` (a module
/// that decides nothing: what the sandbox costs by itself), on the same inputs. Each module's
/// calls run as one block: interleaved, every instantiation would take a pooled slot last used
/// by the other module, which costs each of them a slot re-initialisation (~2 µs here) that a
/// reconcile never pays. The sandbox's cost is followed as these two rows: the reconcile at most 2× the
/// floor's, a fresh instance at most 10 µs (BENCHMARKS.md).
pub fn against_floor(
    module: &PolicyModule,
    floor: &PolicyModule,
    images: usize,
    iterations: usize,
) -> Result<Vec<Row>, PolicyError> {
    let request = synth::request(images, 42);
    let (outcome, pressure) = synth::outcome(&request);
    let node = &request.node;
    let reconcile = |p: &mut dyn PolicyInstance| reconcile(p, &request, &outcome, &pressure);
    let instance = |p: &mut dyn PolicyInstance| p.concurrency(node).map(drop);
    let warmup = (iterations / 10).max(3);
    let mut rows = Vec::new();
    type Step<'a> = &'a dyn Fn(&mut dyn PolicyInstance) -> Result<(), PolicyError>;
    let block = |m: &PolicyModule, step: Step| -> Result<Vec<Duration>, PolicyError> {
        let mut samples = Vec::with_capacity(iterations);
        for i in 0..warmup + iterations {
            let started = Instant::now();
            step(&mut m.instance())?;
            if i >= warmup {
                samples.push(started.elapsed());
            }
        }
        Ok(samples)
    };
    for (what, step) in [(ROWS[4], &instance as Step), (ROWS[5], &reconcile as Step)] {
        let ours = block(module, step)?;
        let theirs = block(floor, step)?;
        rows.push(Row {
            what: format!("{what}, against the floor module"),
            wasm: Stats::of(ours),
            native: Stats::of(theirs),
            baseline: Baseline::Floor,
        });
    }
    Ok(rows)
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
