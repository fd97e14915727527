//! Compiles Sluice's own protobuf API (`proto/`) with protox, a protobuf compiler in
//! Rust, so that building needs no `protoc` binary. The encoded descriptor set is
//! kept for gRPC reflection on the admin port.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/sluice/admin/v1/admin.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("sluice_admin_v1.binpb"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
