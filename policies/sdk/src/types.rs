//! The contract's records as plain Rust values (mirrors `wit/policy.wit`).

/// Facts about the node the reconcile runs on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    pub name: String,
    /// (key, value) pairs sorted by key.
    pub labels: Vec<(String, String)>,
    /// Pools of the node, primary first.
    pub pools: Vec<String>,
    pub control_plane: bool,
    pub ready: bool,
    pub disk_pressure: bool,
    pub allocatable_ephemeral_bytes: Option<u64>,
}

/// The filesystem holding the runtime's images.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DiskFacts {
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
}

/// One image wanted on the node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Image {
    pub reference: String,
    pub sets: Vec<String>,
    pub present: bool,
    pub size_bytes: Option<u64>,
    /// Indices into [`AdmissionRequest::layer_sizes`]; empty when the size is unknown.
    pub layers: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdmissionRequest {
    pub node: NodeFacts,
    pub disk: DiskFacts,
    pub images: Vec<Image>,
    pub layer_sizes: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    AdmitAll,
    /// Indices into [`AdmissionRequest::images`].
    AdmitSome(Vec<u32>),
    Reject,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    pub verdict: Verdict,
    pub reason: String,
}

impl Admission {
    pub fn admit_all(reason: impl Into<String>) -> Self {
        Self { verdict: Verdict::AdmitAll, reason: reason.into() }
    }
    pub fn admit_some(images: Vec<u32>, reason: impl Into<String>) -> Self {
        Self { verdict: Verdict::AdmitSome(images), reason: reason.into() }
    }
    pub fn reject(reason: impl Into<String>) -> Self {
        Self { verdict: Verdict::Reject, reason: reason.into() }
    }
}

/// Pressure stall information, `some avg10` in percent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pressure {
    pub io: Option<f32>,
    pub cpu: Option<f32>,
    pub memory: Option<f32>,
}

/// The pull that just finished.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PullOutcome {
    pub reference: String,
    /// None on success.
    pub error: Option<String>,
    pub bytes: Option<u64>,
    pub duration_ms: u64,
    pub remaining: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyInfo {
    pub name: String,
    pub version: String,
    pub description: String,
}

impl PolicyInfo {
    pub fn new(name: &str, version: &str, description: &str) -> Self {
        Self { name: name.into(), version: version.into(), description: description.into() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}
