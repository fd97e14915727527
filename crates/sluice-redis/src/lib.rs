//! Sluice's Redis client: connections that serve one call at a time, RESP2 requests
//! and replies, TCP, TLS (with pinned certificates) and Unix sockets, a small pool
//! per server, a Redis Cluster client and Redis Sentinel.
//!
//! It knows nothing of rate limits: the counters, their scripts and how a shard
//! backs off live in Sluice's `store::redis`, which calls this crate.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod connection;
pub mod error;
mod pin;
pub mod pool;
pub mod sentinel;
pub mod stream;
pub mod target;
pub mod value;

pub use connection::{Answer, Request, Wire};
pub use error::{Error, ErrorKind};
pub use pool::Pool;
pub use target::Target;
pub use value::Value;

/// The README's example, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
