//! The container runtime, over CRI (`runtime.v1.ImageService`, gRPC on a unix socket).
//!
//! - [`client::CriClient`]: pinset's client, with connect and per-call timeouts and reconnects;
//! - [`proto`]: the generated CRI image service (client and server: the `pinset-cri-sim` crate
//!   serves it), [`containerd_proto`]: containerd's images API.

pub mod client;

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
