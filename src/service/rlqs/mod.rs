//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`): Envoy
//! counts requests into buckets, reports each bucket's usage every few seconds on one
//! bidirectional stream, and enforces locally the quota Sluice assigns in answer.
//!
//! - `bucket.rs`: which rule of the domain's policy governs a `BucketId`;
//! - `share.rs`: a stream's demand, its share of the limit, and the token bucket;
//! - `stream.rs`: one stream: reports in, one answer per report out, and an
//!   assignment unasked when another stream's report moves this one's share;
//! - `peers.rs`: the streams of each bucket on this replica, for those nudges.
//!
//! Streams of one bucket meet in a [`Demand`] table (this process's memory, or Redis
//! so that every replica's streams share one limit).

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::store::{Demand, Store};

use super::Service;

mod peers;
mod stream;

pub use peers::{Nudge, Peers};
pub use stream::{serve, serve_traced, Stream, Traced};

/// The method on the gRPC port.
pub const STREAM_RATE_LIMIT_QUOTAS: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// How assignments are made, from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Each assignment's time to live in Envoy (whole seconds, at least one). Envoy
    /// 1.40 reports every 5 s; a few intervals ride out a lost report or a restart.
    pub ttl: Duration,
    /// A bucket reported with no requests for this long is abandoned: Envoy drops it
    /// and creates it again with the next request that falls into it.
    pub abandon_after: Duration,
    /// Most buckets tracked per stream; past it, new buckets are answered by the
    /// domain's failure mode without being tracked.
    pub max_buckets: usize,
    /// Most bytes of bucket ids (keys and values) tracked per stream; past it, new
    /// buckets are answered as past `max_buckets`.
    pub max_bucket_bytes: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ttl: Duration::from_secs(15),
            abandon_after: Duration::from_secs(60),
            max_buckets: 10_000,
            max_bucket_bytes: 8 << 20,
        }
    }
}

impl Settings {
    /// The TTL as Envoy reads it: whole seconds, at least one.
    pub fn ttl_secs(&self) -> u64 {
        self.ttl.as_secs().max(1)
    }
}

/// What every stream shares: the service (policy, penalties, failure modes), the
/// demand table and the clock.
#[derive(Debug)]
pub struct Quotas<S> {
    pub service: Arc<Service<S>>,
    pub demand: Arc<dyn Demand>,
    pub clock: Arc<dyn Clock>,
    pub settings: Settings,
    /// This replica's streams by bucket.
    pub peers: Peers,
}

impl<S: Store> Quotas<S> {
    pub fn new(
        service: Arc<Service<S>>,
        demand: Arc<dyn Demand>,
        clock: Arc<dyn Clock>,
        settings: Settings,
    ) -> Self {
        Quotas {
            service,
            demand,
            clock,
            settings,
            peers: Peers::default(),
        }
    }
}
