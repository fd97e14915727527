//! Compiles the protobuf APIs with protox, a protobuf compiler in Rust, so that
//! building needs no `protoc` binary: Sluice's own (`proto/sluice/`), whose encoded
//! descriptor set is kept for gRPC reflection on the admin port, and the few Envoy
//! and envoyproxy/ratelimit files Sluice speaks (`proto/third_party/`), compiled here
//! instead of depending on a crate that compiles every Envoy API.

use std::path::PathBuf;

/// The Envoy services and messages Sluice uses; their imports come along.
const ENVOY: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/service/rate_limit_quota/v3/rlqs.proto",
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
];

/// Packages of annotations only (field options Envoy's own tools read): nothing
/// of them is a message Sluice sends or reads, so no code is written for them.
const ANNOTATIONS: &[&str] = &[
    "validate",
    "udpa.annotations",
    "xds.annotations.v3",
    "envoy.annotations",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);

    let proto = "proto/sluice/admin/v1/admin.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    std::fs::write(
        out.join("sluice_admin_v1.binpb"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;

    println!("cargo:rerun-if-changed=proto/third_party");
    let mut envoy = protox::compile(ENVOY, ["proto/third_party"])?;
    envoy.file.retain(|f| !ANNOTATIONS.contains(&f.package()));
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .include_file("envoy.rs")
        .compile_fds(envoy)?;
    Ok(())
}
