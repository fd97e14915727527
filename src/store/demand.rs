//! Demand tables for the Rate Limit Quota Service: how many requests per second each
//! Envoy stream brings to one quota bucket, so that a bucket's limit can be shared
//! among the streams in proportion to their demand.
//!
//! Each stream writes its own record (demand and expiry) under the bucket and reads
//! back the sum over every record that has not expired. In memory that is one
//! replica's streams; in Redis ([`super::RedisStore`]) every replica's, so any number
//! of replicas share one limit. A record lives for as long as the stream's last
//! assignment may still be in force in Envoy, then drops out of the sum by itself,
//! so a replica or an Envoy that goes away without a word stops counting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use crate::algorithm::Micros;
use crate::clock::Clock;

use super::StoreError;

/// A bucket's demand over every live stream, the reporting one included.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// Requests per second, summed.
    pub total: f64,
    /// Streams with a live record.
    pub streams: u32,
}

/// Where streams' demands meet. Called once per bucket per usage report (every few
/// seconds per Envoy), far off ShouldRateLimit's path, hence the boxed futures.
pub trait Demand: Send + Sync + std::fmt::Debug {
    /// Records `demand` (requests per second) of `stream` for `bucket`, alive for
    /// `ttl`, and returns the bucket's [`Share`] now.
    fn report<'a>(
        &'a self,
        bucket: &'a str,
        stream: &'a str,
        demand: f64,
        ttl: Micros,
    ) -> BoxFuture<'a, Result<Share, StoreError>>;

    /// Drops `stream`'s records of `buckets`: the stream has ended, and its Envoy
    /// will report on another one. Best effort; records expire anyway.
    fn forget(&self, buckets: Vec<String>, stream: String);
}

/// One stream's record under a bucket.
#[derive(Debug, Clone)]
struct Record {
    stream: String,
    demand: f64,
    expires: Micros,
}

/// Demand of this process's streams. One mutex: it is taken once per bucket per
/// report, a few times a second in all, never by ShouldRateLimit.
#[derive(Debug)]
pub struct MemoryDemand {
    clock: Arc<dyn Clock>,
    buckets: Mutex<HashMap<String, Vec<Record>>>,
}

impl MemoryDemand {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemoryDemand {
            clock,
            buckets: Mutex::default(),
        }
    }

    /// Buckets with at least one record.
    pub fn buckets(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Record>>> {
        // A panic elsewhere leaves the records as they were: still usable.
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, bucket: &str, stream: &str, demand: f64, ttl: Micros) -> Share {
        let now = self.clock.now();
        let mut buckets = self.lock();
        let records = buckets.entry(bucket.to_string()).or_default();
        records.retain(|r| r.expires > now && r.stream != stream);
        records.push(Record {
            stream: stream.to_string(),
            demand: demand.max(0.0),
            expires: now.saturating_add(ttl),
        });
        Share {
            total: records.iter().map(|r| r.demand).sum(),
            streams: records.len() as u32,
        }
    }
}

impl Demand for MemoryDemand {
    fn report<'a>(
        &'a self,
        bucket: &'a str,
        stream: &'a str,
        demand: f64,
        ttl: Micros,
    ) -> BoxFuture<'a, Result<Share, StoreError>> {
        let share = self.record(bucket, stream, demand, ttl);
        Box::pin(std::future::ready(Ok(share)))
    }

    fn forget(&self, buckets: Vec<String>, stream: String) {
        let mut all = self.lock();
        for bucket in buckets {
            if let Some(records) = all.get_mut(&bucket) {
                records.retain(|r| r.stream != stream);
                if records.is_empty() {
                    all.remove(&bucket);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;

    fn report(d: &MemoryDemand, bucket: &str, stream: &str, demand: f64) -> Share {
        futures::executor::block_on(d.report(bucket, stream, demand, 15 * SECOND)).unwrap()
    }

    #[test]
    fn streams_sum_per_bucket_and_a_new_report_replaces_the_old() {
        let clock = ManualClock::new(1_000 * SECOND);
        let d = MemoryDemand::new(Arc::new(clock.clone()));
        assert_eq!(
            report(&d, "b", "s1", 30.0),
            Share {
                total: 30.0,
                streams: 1
            }
        );
        assert_eq!(
            report(&d, "b", "s2", 10.0),
            Share {
                total: 40.0,
                streams: 2
            }
        );
        assert_eq!(
            report(&d, "b", "s1", 20.0),
            Share {
                total: 30.0,
                streams: 2
            }
        );
        assert_eq!(
            report(&d, "other", "s1", 5.0),
            Share {
                total: 5.0,
                streams: 1
            }
        );
    }

    #[test]
    fn records_expire_and_ended_streams_are_forgotten() {
        let clock = ManualClock::new(1_000 * SECOND);
        let d = MemoryDemand::new(Arc::new(clock.clone()));
        report(&d, "b", "s1", 30.0);
        clock.advance(10 * SECOND);
        report(&d, "b", "s2", 10.0);
        clock.advance(6 * SECOND);
        // s1's record is 16 s old: past its 15 s.
        assert_eq!(
            report(&d, "b", "s2", 10.0),
            Share {
                total: 10.0,
                streams: 1
            }
        );
        report(&d, "c", "s2", 1.0);
        d.forget(vec!["b".into(), "c".into()], "s2".into());
        assert_eq!(d.buckets(), 0);
    }
}
