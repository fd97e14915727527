//! Sluice: an external rate-limit service for Envoy.
#![forbid(unsafe_code)]

pub mod admin;
pub mod algorithm;
pub mod cert;
pub mod cli;
pub mod clock;
pub mod compat;
pub mod config;
pub mod crd;
pub mod errors;
pub mod guard;
pub mod hash;
pub mod http;
pub mod limiter;
pub mod notify;
pub mod pb;
pub mod peers;
pub mod policy;
pub mod quota;
pub mod serve_http;
pub mod server;
pub mod service;
pub mod source;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod trace;
