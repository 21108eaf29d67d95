use super::Hook;
use std::path::PathBuf;
use std::time::Duration;

/// A policy call that did not produce a usable decision. Each names the policy and the hook.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error("policy {policy}: hook {hook} overran its {deadline:?} deadline")]
    Deadline {
        policy: String,
        hook: Hook,
        deadline: Duration,
    },
    #[error("policy {policy}: hook {hook} exceeded the {cap_bytes}-byte memory cap")]
    MemoryCap {
        policy: String,
        hook: Hook,
        cap_bytes: usize,
    },
    #[error("policy {policy}: hook {hook} trapped: {message}")]
    Trap {
        policy: String,
        hook: Hook,
        message: String,
    },
    #[error("policy {policy}: hook {hook} returned an invalid decision: {reason}")]
    Invalid {
        policy: String,
        hook: Hook,
        reason: String,
    },
}

impl PolicyError {
    pub fn hook(&self) -> Hook {
        match self {
            PolicyError::Deadline { hook, .. }
            | PolicyError::MemoryCap { hook, .. }
            | PolicyError::Trap { hook, .. }
            | PolicyError::Invalid { hook, .. } => *hook,
        }
    }

    /// A short, stable word for metrics labels.
    pub fn kind(&self) -> &'static str {
        match self {
            PolicyError::Deadline { .. } => "deadline",
            PolicyError::MemoryCap { .. } => "memory",
            PolicyError::Trap { .. } => "trap",
            PolicyError::Invalid { .. } => "invalid",
        }
    }
}

/// A policy module that cannot be used at all. Each names the module.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("policy module {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("policy module {module}: sha256 is {actual}, expected {expected}; refusing to load it")]
    Sha256Mismatch {
        module: String,
        expected: String,
        actual: String,
    },
    #[error("policy module {module}: --policy-sha256 {value:?} is not 64 hex digits")]
    BadSha256 { module: String, value: String },
    #[error("policy module {module}: not a valid WebAssembly component: {cause}")]
    Compile { module: String, cause: String },
    /// `bytes`: its size, when known (a read stopped at the bound knows none).
    #[error(
        "policy module {module}: {}over the limit of {max} bytes (--policy-max-module-mib)",
        pinset_core::input::size_said(*bytes)
    )]
    TooLarge {
        module: String,
        bytes: Option<u64>,
        max: usize,
    },
    #[error(
        "policy module {module}: implements {found}, but this pinset implements {expected}; \
         rebuild the policy against the WIT (wit/) of this release"
    )]
    Contract {
        module: String,
        expected: String,
        found: String,
    },
    /// The module implements pinset's other contract (a fleet policy given as a node policy, or
    /// the reverse): not a version problem, so no advice to rebuild.
    #[error("policy module {module}: implements {found}, not {expected}: {hint}")]
    OtherContract {
        module: String,
        expected: String,
        found: String,
        hint: String,
    },
    /// Compiling it went past a bound of the child compiler (time, memory, output).
    #[error("policy module {module}: too costly to compile: {cause}")]
    TooCostly { module: String, cause: String },
    #[error("policy module {module}: compiling it in a child process ({exe}): {cause}")]
    Compiler {
        module: String,
        exe: PathBuf,
        cause: String,
    },
    /// A function of the contract whose type differs from the host's under the same version
    /// (a WIT changed on one side only).
    #[error(
        "policy module {module}: function `{function}` of {interface} does not match this \
         pinset's contract: {cause}"
    )]
    Mismatch {
        module: String,
        interface: &'static str,
        function: &'static str,
        cause: String,
    },
    #[error("policy module {module}: cannot be instantiated: {cause}")]
    Instantiate { module: String, cause: String },
    #[error("policy module {module}: imports what the sandbox does not offer: {cause}")]
    Link { module: String, cause: String },
    #[error("wasm engine: {0}")]
    Engine(String),
}
