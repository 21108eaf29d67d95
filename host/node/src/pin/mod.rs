//! Pin back ends: how the runtime is told which images the kubelet must never collect.
//!
//! - [`crio::CrioPins`]: the CRI-O drop-in `50-pinned-images` + a reload command;
//! - [`containerd::ContainerdPins`]: the image label `io.cri-containerd.pinned=pinned`, set
//!   through containerd's images API.

pub mod containerd;
pub mod crio;
pub mod reload;

use std::collections::BTreeSet;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("pin drop-in {path}: {action}: {source}")]
    File {
        path: std::path::PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("reloading CRI-O ({how}): {why}")]
    Reload { how: String, why: String },
    #[error("containerd {call} on {socket} for image {image}: {message}")]
    Containerd {
        socket: std::path::PathBuf,
        call: &'static str,
        image: String,
        message: String,
    },
}

/// What applying a pin set changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PinChange {
    pub pinned: Vec<String>,
    pub unpinned: Vec<String>,
    /// The runtime was told (file rewritten and reloaded, labels changed).
    pub applied: bool,
    /// What the back end found changed behind pinset's back (and put back).
    pub drift: Vec<pinset_core::drift::Drift>,
}

impl PinChange {
    /// What the runtime was told, in the back end's terms.
    pub fn describe(&self, backend: &str) -> &'static str {
        match (self.applied, backend) {
            (false, _) => "unchanged",
            (true, "crio") => "drop-in written, CRI-O reloaded",
            (true, _) => "image labels updated",
        }
    }
}

/// Makes exactly `images` the pinned images managed by pinset. Images dropped from every set are
/// unpinned, never deleted.
pub trait PinBackend: Send + Sync {
    fn name(&self) -> &'static str;

    /// Whether `images` are already exactly the pins, judging by what the runtime reported
    /// pinned in the last snapshot, so [`PinBackend::apply`] can be skipped. Default: never.
    fn satisfied(
        &self,
        images: &BTreeSet<String>,
        runtime_pinned: &std::collections::HashSet<String>,
    ) -> bool {
        let _ = (images, runtime_pinned);
        false
    }

    /// Make `images` the pins. `runtime_pinned` is what the runtime reported pinned in the
    /// reconcile's last snapshot: a back end whose record is right but whose runtime lost the
    /// pins (CRI-O reloaded without them) tells the runtime again.
    fn apply(
        &self,
        images: &BTreeSet<String>,
        runtime_pinned: &std::collections::HashSet<String>,
    ) -> impl Future<Output = Result<PinChange, PinError>> + Send;
}

/// A back end chosen at run time (`--pin`).
pub enum AnyPins {
    Crio(crio::CrioPins),
    Containerd(Box<containerd::ContainerdPins>),
}

impl PinBackend for AnyPins {
    fn name(&self) -> &'static str {
        match self {
            AnyPins::Crio(p) => p.name(),
            AnyPins::Containerd(p) => p.name(),
        }
    }

    fn satisfied(
        &self,
        images: &std::collections::BTreeSet<String>,
        runtime_pinned: &std::collections::HashSet<String>,
    ) -> bool {
        match self {
            AnyPins::Crio(p) => p.satisfied(images, runtime_pinned),
            AnyPins::Containerd(p) => p.satisfied(images, runtime_pinned),
        }
    }

    async fn apply(
        &self,
        images: &std::collections::BTreeSet<String>,
        runtime_pinned: &std::collections::HashSet<String>,
    ) -> Result<PinChange, PinError> {
        match self {
            AnyPins::Crio(p) => p.apply(images, runtime_pinned).await,
            AnyPins::Containerd(p) => p.apply(images, runtime_pinned).await,
        }
    }
}
