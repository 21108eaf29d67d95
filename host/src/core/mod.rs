//! The pure core: domain types and rules with no I/O.

pub mod desired;
pub mod executor;
pub mod plan;
pub mod pool;
pub mod quantity;
pub mod reference;
pub mod selector;
pub mod status;
