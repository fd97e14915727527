//! Sluice's own admin API (`proto/sluice/admin/v1/admin.proto`).

/// The messages and the `Admin` service, generated from `proto/` by build.rs.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("sluice.admin.v1");
}

/// The admin API's encoded descriptors, for reflection.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sluice_admin_v1.binpb"));
