//! The container runtime, over CRI (`runtime.v1.ImageService`, gRPC on a unix socket).
//!
//! - [`client::CriClient`]: pinset's client, with connect and per-call timeouts and reconnects;
//! - [`proto`]: the generated CRI image and runtime services' messages and clients (clients
//!   only: the `pinset-cri-sim` crate routes its methods itself), [`containerd_proto`]:
//!   containerd's images API.
//!
//! Both are generated from `proto/` by prost and tonic once and checked in (`generated/`), so a
//! build compiles no protobuf compiler; `scripts/codegen` writes them, and its `--check` (run by
//! scripts/test.sh) fails when they differ from what `proto/` gives.

pub mod client;

/// Generated from `proto/cri_image.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    include!("generated/runtime.v1.rs");
}

/// Generated from `proto/containerd_images.proto`.
#[allow(clippy::all, missing_docs)]
pub mod containerd_proto {
    include!("generated/containerd.services.images.v1.rs");
}
