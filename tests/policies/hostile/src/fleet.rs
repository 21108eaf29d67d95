//! The fleet side of the hostile policy: misbehaves as the pool's `pinset.test/hostile-fleet`
//! annotation says (trap, loop, alloc, sleep, print, probe the sandbox, flood the log, answer
//! nonsense); without it, answers like the default fleet policy.

use pinset_policy_sdk::reference::fleet as default;
use pinset_policy_sdk::*;

pub const FLEET_MODE_ANNOTATION: &str = "pinset.test/hostile-fleet";

#[derive(Default)]
pub struct HostileFleet;

impl Fleet for HostileFleet {
    fn info(&self) -> PolicyInfo {
        PolicyInfo::new("hostile-fleet", "0.1.0", "misbehaves on request")
    }

    fn grant(&self, request: &Rollout) -> Grant {
        let all: Vec<u32> = (0..request.nodes.len() as u32).collect();
        match request.annotation(FLEET_MODE_ANNOTATION) {
            Some("trap") => panic!("hostile fleet policy traps on purpose"),
            Some("loop") => crate::spin(),
            Some("alloc") => crate::hoard(),
            Some("all") => Grant::new(all, "everyone at once"),
            // What the module received, as a digest: the host's columns decoded by the SDK must
            // give back the request the host was given.
            Some("echo") => Grant::none(format!("{:016x}", fnv1a(&format!("{request:?}")))),
            Some("out-of-range") => Grant::new(vec![request.nodes.len() as u32 + 5], "nobody"),
            Some("twice") => Grant::new(vec![0, 0], "the first node twice"),
            Some("max-pulls") => Grant {
                max_pulls: Some(1000),
                ..default::grant(request)
            },
            Some("sleep") => {
                // Blocks in a host call (WASI clocks and poll), where epoch interruption cannot
                // reach.
                std::thread::sleep(std::time::Duration::from_secs(20));
                default::grant(request)
            }
            Some("stdout") => {
                println!(
                    "hostile fleet policy writes to stdout {}",
                    "x".repeat(100_000)
                );
                default::grant(request)
            }
            Some("stderr") => {
                eprintln!(
                    "hostile fleet policy writes to stderr {}",
                    "x".repeat(100_000)
                );
                default::grant(request)
            }
            // What the sandbox lets it see, in the reason: no environment, no directory.
            Some("probe") => {
                let env = std::env::vars().count();
                let root = std::fs::read_dir("/").is_ok();
                let args = std::env::args().count();
                Grant {
                    reason: format!("env {env} args {args} root {root}"),
                    ..default::grant(request)
                }
            }
            Some("giant-reason") => Grant {
                reason: "z\n".repeat(2 << 20),
                ..default::grant(request)
            },
            Some("log-flood") => {
                for n in 0..1_000 {
                    log(
                        Level::Info,
                        &format!("fleet line {n} {}", "y".repeat(2_000)),
                    );
                }
                default::grant(request)
            }
            _ => default::grant(request),
        }
    }
}

/// FNV-1a, 64 bits: a digest both sides of the sandbox compute alike.
pub fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
