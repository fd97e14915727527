//! The counter store as series: its errors and failure-mode answers, the counters it
//! holds, the memory store's evictions and the Redis store's denial-cache answers.

use std::sync::atomic::AtomicU64;

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Registry};

use super::striped::Stripes;
use super::{counter_vec, int_counter, int_gauge_vec, registered};
use crate::store::Evictions;

#[derive(Debug)]
pub(super) struct StoreStats {
    pub(super) store_errors: IntCounterVec,
    pub(super) store_failures_vec: IntCounterVec,
    pub(super) active_keys: IntGaugeVec,
    pub(super) evictions: IntCounterVec,
    pub(super) cache_answers: IntCounter,
    pub(super) cache_answer_stripes: Stripes<AtomicU64>,
}

impl StoreStats {
    pub(super) fn new(registry: &Registry) -> StoreStats {
        let store_errors = registered(
            registry,
            counter_vec(
                "sluice_store_errors_total",
                "Store calls that failed or timed out, by shard and kind of error.",
                &["store", "shard", "kind"],
            ),
        );
        let store_failures_vec = registered(
            registry,
            counter_vec(
                "sluice_store_failures_total",
                "Calls answered by the failure mode because the store failed, timed out or was backing off.",
                &["store"],
            ),
        );
        let active_keys = registered(
            registry,
            int_gauge_vec(
                "sluice_active_keys",
                "Counters currently held by the store.",
                &["store"],
            ),
        );
        let evictions = registered(
            registry,
            counter_vec(
                "sluice_evictions_total",
                "At --max-keys, counters the memory store dropped to make room (reason expired or idle) and new keys it could not keep (refused, answered by the failure mode).",
                &["reason"],
            ),
        );
        let cache_answers = registered(
            registry,
            int_counter(
                "sluice_denial_cache_answers_total",
                "Requests denied from the Redis store's local over-limit cache, without a Redis call.",
            ),
        );
        // Series that dashboards and alerts read exist (at 0) from the start.
        for (reason, _) in Evictions::default().by_reason() {
            evictions.with_label_values(&[reason]);
        }
        StoreStats {
            store_errors,
            store_failures_vec,
            active_keys,
            evictions,
            cache_answers,
            cache_answer_stripes: Default::default(),
        }
    }
}
