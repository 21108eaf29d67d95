//! Synthetic, deterministic policy inputs: a worker node and `n` absent images of 1–3 sets
//! each, with layers drawn partly from a shared base pool (as real images share base layers)
//! and partly of their own; pools of fleet nodes. `pinset policy bench`, the benchmarks and the
//! tests measure and compare policies with them; nothing that runs on a node uses them.

use pinset_policy_sdk::{
    AdmissionRequest, DiskFacts, GIB, Images, NodeFacts, Pressure, PullOutcome,
};

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn node(control_plane: bool) -> NodeFacts {
    let role = if control_plane { "master" } else { "worker" };
    let labels = [
        ("kubernetes.io/hostname".into(), format!("{role}-0")),
        ("kubernetes.io/os".into(), "linux".into()),
        (format!("node-role.kubernetes.io/{role}"), String::new()),
        ("topology.kubernetes.io/zone".into(), "zone-a".into()),
    ];
    let node = pinset_core::desired::NodeInfo {
        name: format!("{role}-0.example.internal"),
        labels: labels.into_iter().collect(),
        ready: true,
        disk_pressure: false,
        allocatable_ephemeral_bytes: Some(100_000 * GIB),
    };
    node.facts(&[role.into()])
}

/// An admission request with `n` absent images.
pub fn request(n: usize, seed: u64) -> AdmissionRequest {
    let mut rng = Rng(seed.max(1));
    let mut images = Images::new();
    let base: Vec<u32> = (0..32)
        .map(|_| images.add_layer(5_000_000 + rng.below(100_000_000)))
        .collect();
    let sets = ["release-payload", "operators", "workloads"];
    for i in 0..n {
        let mut layers = vec![base[rng.below(base.len() as u64) as usize]];
        for _ in 0..(2 + rng.below(6)) {
            layers.push(images.add_layer(100_000 + rng.below(50_000_000)));
        }
        let size = layers
            .iter()
            .map(|&l| images.layer_sizes()[l as usize])
            .sum();
        let owning = 1 + rng.below(3) as usize;
        let reference = format!(
            "registry.example.internal:5000/release/component-{i}@sha256:{:016x}{:016x}{:016x}{:016x}",
            rng.next(),
            rng.next(),
            rng.next(),
            rng.next()
        );
        images.push(
            &reference,
            sets[..owning].iter().copied(),
            false,
            Some(size),
            &layers,
        );
    }
    AdmissionRequest {
        node: node(false),
        disk: DiskFacts {
            capacity_bytes: Some(200_000 * GIB),
            used_bytes: Some(1_000 * GIB),
            available_bytes: Some(199_000 * GIB),
        },
        images,
    }
}

pub fn outcome(request: &AdmissionRequest) -> (PullOutcome, Pressure) {
    let first = request.images.get(0);
    (
        PullOutcome {
            reference: first.map(|i| i.reference.to_string()).unwrap_or_default(),
            error: None,
            bytes: first.and_then(|i| i.size_bytes),
            duration_ms: 850,
            remaining: request.images.len().saturating_sub(1) as u32,
        },
        Pressure {
            io: Some(3.5),
            cpu: Some(10.0),
            memory: Some(0.0),
        },
    )
}

/// A pool of `nodes` nodes in three zones mid-rollout of a two-set target: the canary done, a
/// wave of a tenth pulling (one of them failed), the rest waiting; labels as cloud nodes carry.
pub fn fleet(nodes: usize) -> pinset_policy_sdk::RolloutRequest {
    use pinset_policy_sdk::{FleetPool, RolloutRequest, Target, TargetSet};
    let target = Target {
        sets: vec![
            TargetSet {
                name: "platform".into(),
                generation: 4,
                images: 120,
                bytes: 18 << 30,
            },
            TargetSet {
                name: "apps".into(),
                generation: 2,
                images: 30,
                bytes: 6 << 30,
            },
        ],
        images: 150,
        bytes: 24 << 30,
    };
    let wave = (nodes / 10).max(1);
    let nodes = (0..nodes).map(|i| fleet_node(i, wave, &target)).collect();
    RolloutRequest {
        pool: FleetPool {
            name: "worker".into(),
            annotations: vec![],
            max_pulling: None,
        },
        target,
        nodes,
    }
}

/// Node `i` of [`fleet`]'s pool.
fn fleet_node(
    i: usize,
    wave: usize,
    target: &pinset_policy_sdk::Target,
) -> pinset_policy_sdk::FleetNode {
    use pinset_policy_sdk::{FleetNode, NodeProgress, Phase, SetState};
    let (granted, phase) = match i {
        0 => (true, Phase::Done),
        1 => (true, Phase::Failed),
        i if i <= wave => (true, Phase::Pulling),
        _ => (false, Phase::Waiting),
    };
    let labels = vec![
        (
            "kubernetes.io/hostname".to_string(),
            format!("worker-{i:05}"),
        ),
        ("node-role.kubernetes.io/worker".into(), String::new()),
        (
            "node.kubernetes.io/instance-type".into(),
            "m6i.4xlarge".into(),
        ),
        ("topology.kubernetes.io/region".into(), "eu-west-1".into()),
        (
            "topology.kubernetes.io/zone".into(),
            format!("eu-west-1{}", ["a", "b", "c"][i % 3]),
        ),
    ];
    FleetNode {
        name: format!("worker-{i:05}"),
        labels,
        ready: i % 50 != 7,
        granted,
        phase,
        progress: NodeProgress {
            images_done: if phase == Phase::Done {
                150
            } else {
                (i % 150) as u64
            },
            images_total: 150,
            bytes_done: (i as u64 % 150) << 27,
            bytes_total: 24 << 30,
            pulling_for_ms: (phase == Phase::Pulling).then_some(30_000),
        },
        sets: target
            .sets
            .iter()
            .map(|s| SetState {
                name: s.name.clone(),
                desired_generation: s.generation,
                current_generation: Some(s.generation - i64::from(phase != Phase::Done)),
                last_failed_generation: (phase == Phase::Failed).then_some(s.generation),
                last_failed_error: (phase == Phase::Failed)
                    .then(|| "image q.io/x@sha256:…: 429 Too Many Requests".to_string()),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_shares_base_layers() {
        let a = request(200, 7);
        assert_eq!(a, request(200, 7));
        assert_eq!(a.images.len(), 200);
        let known = a.images.pull_bytes(a.images.absent()).known;
        let naive: u64 = a.images.iter().map(|i| i.size_bytes.unwrap()).sum();
        assert!(known < naive, "shared base layers must count once");
    }
}
