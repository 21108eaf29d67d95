//! The pure core: domain types and rules with no I/O.

pub mod plan;
pub mod quantity;
