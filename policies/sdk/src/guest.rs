//! Glue between the generated component bindings and [`crate::Policy`] (wasm32 only).

use crate::prelude::*;

use crate::bindings::pinset::policy::{host, types as wit};
use crate::{Policy, types};

pub fn log(level: types::Level, message: &str) {
    let level = match level {
        types::Level::Debug => wit::Level::Debug,
        types::Level::Info => wit::Level::Info,
        types::Level::Warn => wit::Level::Warn,
        types::Level::Error => wit::Level::Error,
    };
    host::log(level, message);
}

fn node(n: wit::NodeFacts) -> types::NodeFacts {
    types::NodeFacts {
        name: n.name,
        labels: n.labels,
        pools: n.pools,
        control_plane: n.control_plane,
        ready: n.ready,
        disk_pressure: n.disk_pressure,
        allocatable_ephemeral_bytes: n.allocatable_ephemeral_bytes,
    }
}

/// The contract's columns moved into an [`types::Images`] (from [`crate::image_columns!`]).
macro_rules! move_columns {
    ([$t:ident] $($name:ident: $owned:ty => $borrowed:ty, $wit:literal;)*) => {
        types::Images::from_columns(types::Columns {
            $($name: $t.$name,)*
        })
    };
}

/// The contract's columns, moved into the SDK's table without copying.
fn table(t: wit::Images) -> types::Images {
    crate::image_columns!(move_columns, t)
}

pub fn info<P: Policy + Default>() -> wit::PolicyInfo {
    let i = P::default().info();
    wit::PolicyInfo {
        name: i.name,
        version: i.version,
        description: i.description,
    }
}

pub fn admit<P: Policy + Default>(r: wit::AdmissionRequest) -> wit::Admission {
    let request = types::AdmissionRequest {
        node: node(r.node),
        disk: types::DiskFacts {
            capacity_bytes: r.disk.capacity_bytes,
            used_bytes: r.disk.used_bytes,
            available_bytes: r.disk.available_bytes,
        },
        images: table(r.images),
    };
    let a = P::default().admit(&request);
    let verdict = match a.verdict {
        types::Verdict::AdmitAll => wit::Verdict::AdmitAll,
        types::Verdict::AdmitSome(v) => wit::Verdict::AdmitSome(v),
        types::Verdict::Reject => wit::Verdict::Reject,
    };
    wit::Admission {
        verdict,
        reason: a.reason,
    }
}

pub fn order<P: Policy + Default>(n: wit::NodeFacts, images: wit::Images) -> Vec<u32> {
    P::default().order(&node(n), &table(images))
}

pub fn concurrency<P: Policy + Default>(n: wit::NodeFacts) -> u32 {
    P::default().concurrency(&node(n))
}

pub fn throttle<P: Policy + Default>(
    n: wit::NodeFacts,
    o: wit::PullOutcome,
    p: wit::Pressure,
) -> u64 {
    let outcome = types::PullOutcome {
        reference: o.reference,
        error: o.error,
        bytes: o.bytes,
        duration_ms: o.duration_ms,
        remaining: o.remaining,
    };
    let pressure = types::Pressure {
        io: p.io,
        cpu: p.cpu,
        memory: p.memory,
    };
    P::default().throttle(&node(n), &outcome, &pressure)
}
