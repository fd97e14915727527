//! What the telemetry modules' tests share: a compiled policy, and a registry as
//! Prometheus would scrape it.

use prometheus::{Encoder, Registry, TextEncoder};

use crate::policy::Policy;

/// `text` (one policy file) compiled; panics on a bad test policy.
pub fn policy(text: &str) -> Policy {
    crate::policy::compile(crate::policy::parse_str("p.yaml", text).unwrap()).unwrap()
}

/// `registry` in Prometheus's text format.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .unwrap();
    String::from_utf8(buf).unwrap()
}
