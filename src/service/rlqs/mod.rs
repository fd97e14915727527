//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`): Envoy
//! counts requests into buckets, reports each bucket's usage every few seconds on one
//! bidirectional stream, and enforces locally the quota Sluice assigns in answer.
//!
//! - `bucket.rs`: which rule of the domain's policy governs a `BucketId`;
//! - `share.rs`: a stream's demand, its share of the limit, and the token bucket;
//! - `stream.rs`: one stream: reports in, one answer per report out, and an
//!   assignment unasked when another stream's report moves this one's share (its
//!   task, its decoding, each bucket's answer and the actions under `stream/`);
//! - `peers.rs`: the streams of each bucket on this replica, for those nudges.
//!
//! Streams of one bucket meet in a [`Demand`] table (this process's memory, or Redis
//! so that every replica's streams share one limit).

use std::sync::Arc;
use std::time::Duration;

use sluice_grpc::GrpcError;

use crate::algorithm::{Micros, SECOND};
use crate::clock::{Clock, Every};
use crate::service::MAX_ENTRIES;
use crate::store::{Demand, Store};

use super::Service;

mod peers;
mod stream;

pub use peers::{Nudge, Peers};
#[doc(hidden)]
pub use stream::decode_report;
use stream::Irregular;
pub use stream::{serve, serve_traced, Stream, Traced};

/// The service's name, as health checks and reflection give it.
pub const SERVICE_NAME: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

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

/// Bytes a report spends on one bucket besides its id's keys and values, at most:
/// the usage's and the id's framing (3 each), each id entry's (9: the entry, its key
/// and its value, each a tag and a length under 16 KiB), `time_elapsed` (24) and the
/// two counts (11 each).
const BUCKET_FRAMING: usize = 3 + 3 + 9 * MAX_ENTRIES + 24 + 2 * 11;

/// Room in a report for what is not its buckets (its domain).
const REPORT_FRAMING: usize = 64 << 10;

impl Settings {
    /// The TTL as Envoy reads it: whole seconds, at least one.
    pub fn ttl_secs(&self) -> u64 {
        self.ttl.as_secs().max(1)
    }

    /// The largest report a stream takes: one of every bucket it may track, with
    /// ids of all the bytes it may track (about 11 MiB by default). Envoy sends every
    /// bucket in each report, so a smaller limit would end the stream of an Envoy
    /// with many buckets at every report.
    pub fn max_report_bytes(&self) -> usize {
        self.max_buckets
            .saturating_mul(BUCKET_FRAMING)
            .saturating_add(self.max_bucket_bytes)
            .saturating_add(REPORT_FRAMING)
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
    /// Oversized reports are logged at most once a minute.
    oversized_log: Every,
    /// So are buckets answered apart from their report.
    irregular_log: Every,
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
            oversized_log: Every::new(LOG_EVERY),
            irregular_log: Every::new(LOG_EVERY),
        }
    }

    /// A report refused for its size (`refused`): counted, and logged at most once
    /// a minute, as Envoy sends it again on a new stream at every interval.
    pub fn oversized(&self, refused: &GrpcError) {
        self.service.metrics.rlqs().oversized();
        if self.oversized_log.due(self.clock.now()) {
            tracing::warn!(
                error = %refused.message,
                "RLQS report refused, the stream ended (sluice_rlqs_oversized_reports_total)"
            );
        }
    }

    /// Bucket `index` of a report for `domain` (as the metrics show it) answered
    /// apart, for `why`: counted, and logged at most once a minute, as Envoy
    /// reports the bucket again at every interval. Its values stay out of the log:
    /// they are what Envoy's matchers took from requests.
    fn irregular(&self, domain: &str, why: Irregular, index: usize, entries: usize, bytes: usize) {
        self.service.metrics.rlqs().irregular(domain, why.as_str());
        if self.irregular_log.due(self.clock.now()) {
            tracing::warn!(
                domain,
                reason = why.as_str(),
                index,
                entries,
                bytes,
                answer = why.answer(),
                "RLQS bucket answered apart from its report (sluice_rlqs_irregular_buckets_total)"
            );
        }
    }
}

/// The least time between two log lines of oversized reports.
const LOG_EVERY: Micros = 60 * SECOND;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use crate::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
    use prost::Message;

    #[test]
    fn a_report_of_every_bucket_a_stream_may_track_is_taken() {
        let settings = Settings::default();
        // Every bucket with the most entries, the ids together all the bytes a
        // stream tracks, and the widest numbers protobuf can carry.
        let per_bucket = settings.max_bucket_bytes / settings.max_buckets;
        let usage = |i: usize| {
            let bucket = (0..MAX_ENTRIES)
                .map(|e| {
                    let key = format!("{e:02}{i:08}");
                    let value = "v".repeat(per_bucket / MAX_ENTRIES - key.len());
                    (key, value)
                })
                .collect();
            BucketQuotaUsage {
                bucket_id: Some(BucketId { bucket }),
                time_elapsed: Some(prost_types::Duration {
                    seconds: i64::MIN,
                    nanos: -1,
                }),
                num_requests_allowed: u64::MAX,
                num_requests_denied: u64::MAX,
            }
        };
        let report = RateLimitQuotaUsageReports {
            domain: "d".repeat(1_000),
            bucket_quota_usages: (0..settings.max_buckets).map(usage).collect(),
        };
        let size = report.encoded_len();
        assert!(size > 10 << 20, "{size}");
        assert!(size <= settings.max_report_bytes(), "{size}");
    }
}
