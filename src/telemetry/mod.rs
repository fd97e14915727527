//! Metrics in the Prometheus text format.
//!
//! One [`Metrics`] value is built at start-up and passed around in an `Arc`, never a
//! global, so each test builds its own. Label sets are bounded by the policies: the
//! `rule` label is the matched path of keys, never a request value.

use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::limiter::Outcome;

/// Every metric sluice exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    unknown_domain: IntCounter,
    bad_requests: IntCounter,
    decision_seconds: Histogram,
    store_errors: IntCounterVec,
    policy_reloads: IntCounterVec,
    active_keys: IntGaugeVec,
    evictions: IntCounter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "sluice_requests_total",
                "Descriptors decided, by matched rule and outcome.",
            ),
            &["domain", "layer", "rule", "outcome"],
        )
        .expect("static metric definition");
        let unknown_domain = IntCounter::new(
            "sluice_unknown_domain_requests_total",
            "Requests naming a domain no policy defines (answered OK).",
        )
        .expect("static metric definition");
        let bad_requests = IntCounter::new(
            "sluice_invalid_requests_total",
            "Requests refused with INVALID_ARGUMENT.",
        )
        .expect("static metric definition");
        let decision_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_decision_seconds",
                "Time spent inside sluice per call.",
            )
            .buckets(vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05,
                0.1,
            ]),
        )
        .expect("static metric definition");
        let store_errors = IntCounterVec::new(
            Opts::new(
                "sluice_store_errors_total",
                "Store calls that failed or timed out.",
            ),
            &["store", "shard"],
        )
        .expect("static metric definition");
        let policy_reloads = IntCounterVec::new(
            Opts::new(
                "sluice_policy_reloads_total",
                "Policy reloads by source and result.",
            ),
            &["source", "result"],
        )
        .expect("static metric definition");
        let active_keys = IntGaugeVec::new(
            Opts::new(
                "sluice_active_keys",
                "Counters currently held by the store.",
            ),
            &["store"],
        )
        .expect("static metric definition");
        let evictions = IntCounter::new(
            "sluice_evictions_total",
            "Live counters dropped because the memory store reached --max-keys.",
        )
        .expect("static metric definition");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(unknown_domain.clone()),
            Box::new(bad_requests.clone()),
            Box::new(decision_seconds.clone()),
            Box::new(store_errors.clone()),
            Box::new(policy_reloads.clone()),
            Box::new(active_keys.clone()),
            Box::new(evictions.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Metrics {
            registry,
            requests,
            unknown_domain,
            bad_requests,
            decision_seconds,
            store_errors,
            policy_reloads,
            active_keys,
            evictions,
        }
    }

    /// Counts one decided request.
    pub fn record(&self, domain: &str, outcome: &Outcome, took: Duration) {
        self.decision_seconds.observe(took.as_secs_f64());
        if !outcome.domain_known {
            self.unknown_domain.inc();
            return;
        }
        if outcome.failure.is_some() {
            self.store_errors.with_label_values(&["store", "all"]).inc();
        }
        for s in &outcome.statuses {
            let Some(rule) = s.rule.map(|r| outcome.policy.rule(r)) else {
                continue;
            };
            let result = match (&outcome.failure, s.verdict) {
                (Some(f), _) if f.mode == crate::policy::FailureMode::Open => "failed_open",
                (Some(_), _) => "failed_closed",
                (None, Some(v)) if !v.admitted && rule.shadow_mode => "shadow_over_limit",
                (None, _) if s.over_limit => "over_limit",
                _ => "ok",
            };
            self.requests
                .with_label_values(&[domain, rule.layer.as_str(), &rule.path, result])
                .inc();
        }
    }

    /// Counts one failed call to one shard of a store.
    pub fn store_error(&self, store: &str, shard: &str) {
        self.store_errors.with_label_values(&[store, shard]).inc();
    }

    pub fn bad_request(&self) {
        self.bad_requests.inc();
    }

    pub fn policy_reload(&self, source: &str, ok: bool) {
        self.policy_reloads
            .with_label_values(&[source, if ok { "ok" } else { "error" }])
            .inc();
    }

    pub fn set_store_state(&self, store: &str, active_keys: usize, evictions: u64) {
        self.active_keys
            .with_label_values(&[store])
            .set(active_keys as i64);
        let seen = self.evictions.get();
        if evictions > seen {
            self.evictions.inc_by(evictions - seen);
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
