//! The container runtime, over CRI (`runtime.v1.ImageService`, gRPC on a unix socket).
//!
//! - [`client::CriClient`]: pinset's client, with connect and per-call timeouts and reconnects;
//! - [`sim::SimulatedRuntime`]: an in-process CRI image service for `pinset demo` and fault
//!   injection tests: a real gRPC server on a unix socket that simulates a registry (per-image
//!   sizes, bandwidth) and a disk of given size.

pub mod client;
pub mod sim;

/// Generated from `proto/cri_image.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("runtime.v1");
}

/// Generated from `proto/containerd_images.proto`.
#[allow(clippy::all, missing_docs)]
pub mod containerd_proto {
    tonic::include_proto!("containerd.services.images.v1");
}
