//! The integration tests, one module per area, in one test binary: each binary links
//! the whole service and its dependencies again, so one binary instead of one per
//! file saves most of the suite's link time and compiles the shared harness
//! (`common`) once. Run one area with its module path, e.g.
//! `cargo test --test integration redis::`.
//!
//! `policy_alloc` stays a binary of its own: it installs a counting global allocator.

mod common;

mod admin;
mod alerts;
mod cli;
mod connections;
mod dropin;
mod envoy_gateway;
mod fuzz_corpus;
mod grpc;
mod grpc_clients;
mod kube;
mod layers;
mod lifecycle;
mod local;
mod observe;
mod overrides;
mod policy;
mod policy_change;
mod rates;
mod redis;
mod redis_faults;
mod redis_hot_key;
mod redis_sentinel;
mod reflection;
mod rlqs;
mod server;
mod store_memory;
mod tls;
mod top;
mod xds;
