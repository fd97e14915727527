//! Sluice: an external rate-limit service for Envoy.
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod policy;
