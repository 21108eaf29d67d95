//! Glue between the generated component bindings and [`crate::Policy`] (wasm32 only).

use crate::prelude::*;

use crate::bindings::pinset::policy::{host, types as wit};
use crate::{Policy, types};

host_log!();

/// A record of the contract moved into the SDK's struct of the same name, from the record's one
/// list ([`crate::node_facts_fields!`] and its siblings). The pattern names every field without
/// `..`: a field the WIT has and the list lacks, or the reverse, or a type that differs, fails to
/// compile here.
macro_rules! move_record {
    ([$from:expr, $ty:ident] $($(#[$m:meta])* $name:ident: $owned:ty => $borrowed:ty, $wit:literal;)*) => {{
        let wit::$ty { $($name),* } = $from;
        types::$ty { $($name),* }
    }};
}

fn node(n: wit::NodeFacts) -> types::NodeFacts {
    crate::node_facts_fields!(move_record, n, NodeFacts)
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
    let disk = r.disk;
    let request = types::AdmissionRequest {
        node: node(r.node),
        disk: crate::disk_facts_fields!(move_record, disk, DiskFacts),
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
    let outcome = crate::pull_outcome_fields!(move_record, o, PullOutcome);
    let pressure = crate::pressure_fields!(move_record, p, Pressure);
    P::default().throttle(&node(n), &outcome, &pressure)
}
