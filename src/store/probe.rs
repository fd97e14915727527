//! What a store tells its caller about its round trips, when asked: the server it
//! called, the script, and how long the call took, so the service can trace each
//! call as a child of the request's span.
//!
//! A hook rather than timings in every [`Verdicts`](super::Verdicts): the store
//! reads no clock and fills nothing unless a caller passes a [`Probe`], and the
//! service passes one only for a sampled call. The store knows nothing of tracing;
//! the service turns each [`StoreCall`] into a span.

use std::time::SystemTime;

use super::StoreError;

/// One round trip to a store's server, once it has ended.
#[derive(Debug)]
pub struct StoreCall<'a> {
    /// `redis`.
    pub system: &'static str,
    /// The server the call went to: a host or a socket's path; `None` when the
    /// store cannot tell (a Redis Cluster routes the call itself).
    pub host: Option<&'a str>,
    pub port: Option<u16>,
    /// The command (`FCALL` on Redis 7 shards, else `EVALSHA`).
    pub operation: &'static str,
    /// The script the command ran (`decide`, `refund`).
    pub script: &'static str,
    /// Counters the call decided for this request.
    pub keys: usize,
    pub started: SystemTime,
    pub ended: SystemTime,
    pub error: Option<&'a StoreError>,
}

/// Hears of a store's calls made for one request.
pub trait Probe: Send + Sync {
    fn call(&self, call: &StoreCall<'_>);
}

/// `host:port` (or a socket's path) split for [`StoreCall`].
pub fn split_address(address: &str) -> (&str, Option<u16>) {
    match address.rsplit_once(':') {
        Some((host, port)) if !host.contains('/') => match port.parse() {
            Ok(p) => (host.trim_start_matches('[').trim_end_matches(']'), Some(p)),
            Err(_) => (address, None),
        },
        _ => (address, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(split_address("10.0.0.7:6379"), ("10.0.0.7", Some(6379)));
        assert_eq!(
            split_address("redis-0.redis:6380"),
            ("redis-0.redis", Some(6380))
        );
        assert_eq!(split_address("[::1]:6379"), ("::1", Some(6379)));
        assert_eq!(split_address("/run/redis.sock"), ("/run/redis.sock", None));
        assert_eq!(split_address("mymaster"), ("mymaster", None));
    }
}
