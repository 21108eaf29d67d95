//! Glue between the generated fleet bindings and [`crate::Fleet`] (wasm32, feature `fleet`).

use crate::fleet_bindings::pinset::fleet::{host, types as wit};
use crate::{Fleet, fleet as types};

pub fn log(level: crate::Level, message: &str) {
    let level = match level {
        crate::Level::Debug => wit::Level::Debug,
        crate::Level::Info => wit::Level::Info,
        crate::Level::Warn => wit::Level::Warn,
        crate::Level::Error => wit::Level::Error,
    };
    host::log(level, message);
}

pub fn info<F: Fleet + Default>() -> wit::PolicyInfo {
    let i = F::default().info();
    wit::PolicyInfo {
        name: i.name,
        version: i.version,
        description: i.description,
    }
}

/// Entries `from .. to` of a compressed-sparse-row column for row `i`, clamped to `len`
/// (the host builds these columns; a malformed one yields empty rows, never a panic).
fn row(starts: &[u32], i: usize, len: usize) -> std::ops::Range<usize> {
    let from = (starts.get(i).copied().unwrap_or(0) as usize).min(len);
    let to = (starts.get(i + 1).copied().unwrap_or(0) as usize).clamp(from, len);
    from..to
}

/// The string table of `c`, one slice per string.
fn strings(c: &wit::Nodes) -> Vec<&str> {
    (0..c.string_starts.len().saturating_sub(1))
        .map(|j| {
            c.strings
                .get(row(&c.string_starts, j, c.strings.len()))
                .unwrap_or("")
        })
        .collect()
}

/// Every node of the columns as the SDK's [`types::FleetNode`].
fn nodes(c: &wit::Nodes) -> Vec<types::FleetNode> {
    let table = strings(c);
    let text = |j: u32| table.get(j as usize).copied().unwrap_or("").to_string();
    let at = |col: &[u64], i: usize| col.get(i).copied().unwrap_or(0);
    let set = |k: usize| types::SetState {
        name: text(c.set_names.get(k).copied().unwrap_or(u32::MAX)),
        desired_generation: c.desired_generations.get(k).copied().unwrap_or(0),
        current_generation: (c.current_known.get(k) == Some(&1))
            .then(|| c.current_generations.get(k).copied().unwrap_or(0)),
        last_failed_generation: (c.failed_known.get(k) == Some(&1))
            .then(|| c.failed_generations.get(k).copied().unwrap_or(0)),
        last_failed_error: (c.error_known.get(k) == Some(&1))
            .then(|| text(c.errors.get(k).copied().unwrap_or(u32::MAX))),
    };
    (0..c.names.len())
        .map(|i| types::FleetNode {
            name: text(c.names[i]),
            labels: row(
                &c.label_starts,
                i,
                c.label_keys.len().min(c.label_values.len()),
            )
            .map(|k| (text(c.label_keys[k]), text(c.label_values[k])))
            .collect(),
            ready: c.ready.get(i) == Some(&1),
            granted: c.granted.get(i) == Some(&1),
            phase: match c.phase.get(i) {
                Some(wit::Phase::Pulling) => types::Phase::Pulling,
                Some(wit::Phase::Done) => types::Phase::Done,
                Some(wit::Phase::Failed) => types::Phase::Failed,
                Some(wit::Phase::Waiting) | None => types::Phase::Waiting,
            },
            progress: types::NodeProgress {
                images_done: at(&c.images_done, i),
                images_total: at(&c.images_total, i),
                bytes_done: at(&c.bytes_done, i),
                bytes_total: at(&c.bytes_total, i),
                pulling_for_ms: (c.pulling.get(i) == Some(&1)).then(|| at(&c.pulling_for_ms, i)),
            },
            sets: row(&c.set_starts, i, c.set_names.len()).map(set).collect(),
        })
        .collect()
}

pub fn grant<F: Fleet + Default>(r: wit::RolloutRequest) -> wit::RolloutGrant {
    let request = types::RolloutRequest {
        pool: types::FleetPool {
            name: r.pool.name,
            annotations: r.pool.annotations,
            max_pulling: r.pool.max_pulling,
        },
        target: types::Target {
            sets: r
                .target
                .sets
                .into_iter()
                .map(|s| types::TargetSet {
                    name: s.name,
                    generation: s.generation,
                    images: s.images,
                    bytes: s.bytes,
                })
                .collect(),
            images: r.target.images,
            bytes: r.target.bytes,
        },
        nodes: nodes(&r.nodes),
    };
    let g = F::default().grant(&request);
    wit::RolloutGrant {
        nodes: g.nodes,
        max_pulls: g.max_pulls,
        reason: g.reason,
    }
}
