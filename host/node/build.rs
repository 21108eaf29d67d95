//! Generates the CRI ImageService client and server, and containerd's images client, from
//! `proto/`, compiled with protox: no `protoc` needed.

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let proto_dir = manifest_dir.join("../../proto");
    println!("cargo:rerun-if-changed={}", proto_dir.display());
    let files = [
        proto_dir.join("cri_image.proto"),
        proto_dir.join("containerd_images.proto"),
    ];
    let fds = protox::compile(files, [&proto_dir]).unwrap_or_else(|e| panic!("proto/: {e}"));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the CRI code: {e}"));
}
