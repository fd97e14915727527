//! The Rate Limit Quota Service's series: streams open, buckets tracked, usage
//! reports received and assignments sent, by kind.
//!
//! Labels are bounded as everywhere else: `domain` is a domain the policy defines
//! (empty for any other a stream names) and `rule` the matched path of keys (empty
//! when no rule governs the bucket), never a bucket's values. Recorded once per
//! report and per bucket in it, every few seconds per Envoy and never per request,
//! so the labelled lookups here cost nothing that matters.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};

use super::{counter_vec, int_counter, int_gauge, registered};

/// What an assignment told Envoy to do with a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignmentKind {
    TokenBucket,
    AllowAll,
    DenyAll,
    Abandon,
}

impl AssignmentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AssignmentKind::TokenBucket => "token_bucket",
            AssignmentKind::AllowAll => "allow_all",
            AssignmentKind::DenyAll => "deny_all",
            AssignmentKind::Abandon => "abandon",
        }
    }
}

/// The RLQS families, registered in the metrics' registry.
#[derive(Debug)]
pub struct QuotaStats {
    streams: IntGauge,
    buckets: IntGauge,
    reports: IntCounterVec,
    assignments: IntCounterVec,
    oversized: IntCounter,
    irregular: IntCounterVec,
}

impl QuotaStats {
    pub fn new(registry: &Registry) -> QuotaStats {
        let gauge = |name: &str, help: &str| registered(registry, int_gauge(name, help));
        let counter = |name: &str, help: &str, labels: &[&str]| {
            registered(registry, counter_vec(name, help, labels))
        };
        QuotaStats {
            streams: gauge(
                "sluice_rlqs_streams",
                "StreamRateLimitQuotas streams open (one per Envoy and domain).",
            ),
            buckets: gauge(
                "sluice_rlqs_buckets",
                "Quota buckets tracked, over every open stream (a bucket two Envoys report counts twice).",
            ),
            reports: counter(
                "sluice_rlqs_reports_total",
                "Usage reports received and answered (refused ones count in sluice_invalid_requests_total).",
                &["domain"],
            ),
            assignments: counter(
                "sluice_rlqs_assignments_total",
                "Bucket actions sent, by kind: token_bucket, allow_all, deny_all, abandon.",
                &["domain", "rule", "kind"],
            ),
            oversized: registered(
                registry,
                int_counter(
                    "sluice_rlqs_oversized_reports_total",
                    "Usage reports refused as larger than a stream takes (RESOURCE_EXHAUSTED: the stream ends).",
                ),
            ),
            irregular: counter(
                "sluice_rlqs_irregular_buckets_total",
                "Buckets of usage reports answered apart from the rest of their report, by reason: id_too_large (over 4096 bytes: decided against its limit, tracked under a digest), too_many_entries or empty_key (no rule can match: ALLOW_ALL), no_entries (left out of the answer: Envoy takes no assignment without an id).",
                &["domain", "reason"],
            ),
        }
    }

    pub fn stream_opened(&self) {
        self.streams.inc();
    }

    pub fn stream_closed(&self) {
        self.streams.dec();
    }

    /// `n` buckets more (or fewer, negative) are tracked.
    pub fn buckets_changed(&self, n: i64) {
        self.buckets.add(n);
    }

    /// One report answered, for `domain` ("" when no policy defines it).
    pub fn report(&self, domain: &str) {
        self.reports.with_label_values(&[domain]).inc();
    }

    /// One report refused for its size.
    pub fn oversized(&self) {
        self.oversized.inc();
    }

    /// One bucket of a report for `domain` answered apart, for `reason`.
    pub fn irregular(&self, domain: &str, reason: &str) {
        self.irregular.with_label_values(&[domain, reason]).inc();
    }

    /// One bucket's action, under `domain` and `rule` ("" when none governs it).
    pub fn assignment(&self, domain: &str, rule: &str, kind: AssignmentKind) {
        self.assignments
            .with_label_values(&[domain, rule, kind.as_str()])
            .inc();
    }
}
