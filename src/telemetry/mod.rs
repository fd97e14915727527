//! Metrics in the Prometheus text format, and the top-offenders view.
//!
//! One [`Metrics`] value is built at start-up and passed around in an `Arc`, never a
//! global, so each test builds its own. Label sets are bounded by the policies: the
//! `rule` label is the matched path of keys, never a request value. The one exception
//! is `sluice_top_offenders`' `key`, at most [`top::TOP`] per rule.
//!
//! **Recording is cheap and takes no lock and no shared cache line.** Looking a
//! labelled counter up by its label values (`with_label_values`) hashes the labels
//! and takes the vector's lock on every call, and a `prometheus` counter or histogram
//! is one atomic that every core writes. Sluice does neither on the request path:
//! - `PolicyHandles` holds, for one compiled [`Policy`] (recognised by pointer), a
//!   lazily filled slot per rule id pointing at that rule's [`RuleStats`]. The current
//!   `PolicyHandles` is read through an `ArcSwap` (no lock, no shared reference count
//!   touched), so finding a rule's counters is an index, not a lookup.
//! - The per-rule outcome and ban counts, the deny-ratio rings ([`ratio`]) and the
//!   decision-time histogram are striped ([`striped`]): each thread adds to its own
//!   cache-line-aligned copy; a scrape adds the copies up and writes the text format
//!   for these families itself.
//! - Only denials touch the top-offenders sketch ([`top`]), whose locks are per rule,
//!   per 10 s sub-window and per shard of the key space.
//!
//! `RuleStats` are kept by (domain, rule path, layer), so counters stay monotonic and
//! windows survive a policy reload; they are few (bounded by the rules ever loaded).
//! `benches/metrics.rs` measures the cost (BENCHMARKS.md, "Sluice's own work per request").
//!
//! The ratio and the top offenders are computed at scrape time (`render`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use prometheus::{
    Encoder, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::algorithm::{Micros, SECOND};
use crate::clock::{Clock, SystemClock};
use crate::limiter::key::Hashing;
use crate::limiter::{Ban, Descriptor, Outcome};
use crate::policy::{Entry, FailureMode, Policy, Rule};
use crate::store::{ErrorKind, Evictions, Report};

pub mod erl;
pub mod limits;
pub mod ratio;
pub mod rlqs;
pub mod signals;
pub mod striped;
pub mod top;

use ratio::DenyWindow;
use signals::regular::RegularKeys;
use signals::spike::Spike;
use signals::subnet::{Subnets, TopSubnets};
use striped::{escape_label, Histogram, Stripes, LATENCY_BOUNDS};
use top::TopOffenders;

/// The `outcome` label values of `sluice_requests_total`.
pub const OUTCOMES: [&str; 8] = [
    "ok",
    "over_limit",
    "shadow_over_limit",
    "failed_open",
    "failed_closed",
    "banned",
    "shed",
    "blocked",
];
const OK: usize = 0;
const OVER_LIMIT: usize = 1;
const SHADOW_OVER_LIMIT: usize = 2;
const FAILED_OPEN: usize = 3;
const FAILED_CLOSED: usize = 4;
const BANNED: usize = 5;
const SHED: usize = 6;
const BLOCKED: usize = 7;

/// `--near-limit-ratio`'s default, envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`.
pub const DEFAULT_NEAR_LIMIT_RATIO: f64 = 0.8;

/// Whether `status`, admitted by `rule`, left its counter past `ratio` of the limit:
/// the threshold envoyproxy/ratelimit's `near_limit` uses, counted per descriptor.
fn near_limit(rule: &Rule, status: &crate::limiter::Status, ratio: f64) -> bool {
    let (Some(limit), Some(v)) = (rule.limit, status.verdict) else {
        return false;
    };
    let capacity = match limit.algorithm {
        crate::algorithm::Algorithm::TokenBucket | crate::algorithm::Algorithm::LeakyBucket => {
            limit.burst
        }
        _ => limit.requests,
    };
    let threshold = (capacity as f64 * ratio).floor() as u64;
    v.admitted && status.hits > 0 && capacity.saturating_sub(v.remaining) > threshold
}

/// Counts a denial for the subnet of each of `entries`' values that is an address,
/// shown hashed under `--hash-keys`.
fn count_subnets<E: Entry>(subnets: &Subnets, now: Micros, entries: &[E], hashing: &Hashing) {
    for e in entries {
        if let Some((net, bit)) = signals::subnet::subnet_of(e.value()) {
            let v6 = net.contains(':');
            if hashing.all {
                let mut shown = String::with_capacity(32);
                crate::limiter::key::push_value(&mut shown, &net, hashing);
                subnets.add(now, &shown, bit, v6);
            } else {
                subnets.add(now, &net, bit, v6);
            }
        }
    }
}

/// (domain, rule path, layer).
type StatsKey = (String, String, &'static str);

/// One stripe of a rule's counts.
#[derive(Debug, Default)]
struct RuleCounts {
    outcomes: [AtomicU64; OUTCOMES.len()],
    bans: AtomicU64,
    /// Admitted descriptors that left their counter past the near-limit ratio.
    near_limit: AtomicU64,
}

/// Everything counted for one (domain, rule path, layer).
#[derive(Debug)]
pub struct RuleStats {
    pub domain: String,
    pub rule: String,
    pub layer: &'static str,
    counts: Stripes<RuleCounts>,
    ratio: Stripes<DenyWindow>,
    pub top: TopOffenders,
    /// The busiest keys' request times ([`signals::regular`]).
    regular: RegularKeys,
    /// Denials by /24 and /64 ([`signals::subnet`]).
    subnets: Subnets,
    /// Whether the rule is `sensitive` in the policy serving now, and its denial
    /// spike ([`signals::spike`]).
    sensitive: AtomicBool,
    spike: Spike,
}

impl RuleStats {
    /// (decided, denied) over the last minute.
    pub fn window_totals(&self, now: Micros) -> (u64, u64) {
        self.ratio.iter().fold((0, 0), |(c, d), w| {
            let (c2, d2) = w.totals(now);
            (c + c2, d + d2)
        })
    }

    fn outcome(&self, i: usize) -> u64 {
        self.counts
            .iter()
            .map(|c| c.outcomes[i].load(Ordering::Relaxed))
            .sum()
    }

    fn bans(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| c.bans.load(Ordering::Relaxed))
            .sum()
    }

    fn near_limit(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| c.near_limit.load(Ordering::Relaxed))
            .sum()
    }
}

/// The handles of one compiled policy, by rule id.
#[derive(Debug)]
struct PolicyHandles {
    /// Keeps the policy's allocation (not the policy) alive, so a new policy never
    /// gets the same address while this cache entry exists.
    policy: Weak<Policy>,
    rules: Box<[OnceLock<Arc<RuleStats>>]>,
    /// envoyproxy/ratelimit's series of each rule, when exported (else empty).
    erl: Box<[OnceLock<Arc<erl::Counts>>]>,
}

/// One rule's view for `/debug/top`.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleTop {
    pub domain: String,
    pub rule: String,
    /// Limited descriptors decided over the last minute.
    pub decided: u64,
    /// Of those, denied (over limit or banned).
    pub denied: u64,
    /// The worst keys, most denials first.
    pub top: Vec<(String, u64)>,
}

/// One rule's signals for `/debug/signals`.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSignals {
    pub domain: String,
    pub rule: String,
    /// Machine-regular keys, the busiest first.
    pub regular: Vec<signals::regular::Regular>,
    /// The subnets denied most, and with the most distinct addresses denied.
    pub subnets: TopSubnets,
    /// For a sensitive rule: its denials of the last minute against its baseline.
    pub spike: Option<DenialSpike>,
}

/// A sensitive rule's denials of the last minute against its own baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DenialSpike {
    /// Denials over the last minute (the minute before weighted by its part in it).
    pub recent: f64,
    /// Denials per minute, an EWMA over 30 minutes (`None` in the first minute).
    pub baseline: Option<f64>,
    /// `recent / max(baseline, 1)`.
    pub ratio: f64,
}

impl DenialSpike {
    /// Over the threshold: listed in `/debug/signals`.
    pub fn is_spike(&self) -> bool {
        signals::spike::is_spike(self.ratio, self.recent)
    }
}

/// Every metric sluice exports.
#[derive(Debug)]
pub struct Metrics {
    enabled: bool,
    clock: Arc<dyn Clock>,
    /// The share of a limit past which an admitted descriptor is near it.
    near_limit_ratio: f64,
    /// Hashes a descriptor's values to tell keys apart in the signals.
    key_hasher: ahash::RandomState,
    regular_keys: IntGaugeVec,
    top_subnets: IntGaugeVec,
    top_subnet_addresses: IntGaugeVec,
    denial_spike_ratio: GaugeVec,
    registry: Registry,
    unknown_domain: IntCounter,
    bad_requests: IntCounter,
    expired_calls: IntCounter,
    decision_seconds: Histogram,
    store_errors: IntCounterVec,
    policy_reloads: IntCounterVec,
    tls_reloads: IntCounterVec,
    grpc_connections: IntGauge,
    grpc_closed: IntCounterVec,
    active_keys: IntGaugeVec,
    evictions: IntCounterVec,
    /// `sluice_denial_cache_answers_total`, counted in stripes (an attack makes it a
    /// per-request counter) and carried into the registry at scrape time.
    cache_answers: IntCounter,
    cache_answer_stripes: Stripes<AtomicU64>,
    active_bans: IntGauge,
    deny_ratio: GaugeVec,
    recent_denials: IntGaugeVec,
    top_offenders: IntGaugeVec,
    handles: ArcSwapOption<PolicyHandles>,
    limits: limits::Limits,
    rlqs: rlqs::QuotaStats,
    /// envoyproxy/ratelimit's series, with `--prometheus-addr`.
    erl: Option<erl::ErlStats>,
    /// Rule stats by (domain, rule path, layer); locked only when a policy's rule is
    /// first seen and at scrape time.
    stats: Mutex<HashMap<StatsKey, Arc<RuleStats>>>,
    /// Serialises scrapes, which reset and refill the computed gauges.
    scrape: Mutex<()>,
    /// `sluice_store_failures_total{store}`: calls the failure mode answered (store
    /// errors, timeouts, back-off), resolved on the first failure so an outage does
    /// not look labels up per request. Per-shard errors are the stores' own count in
    /// `sluice_store_errors_total`; keeping the two apart means neither double counts.
    store_failures: OnceLock<IntCounter>,
    store_failures_vec: IntCounterVec,
    store_failing: AtomicBool,
    failures_in_outage: AtomicU64,
    refusing: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition")
}

impl Metrics {
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// Metrics that record nothing (for measuring their cost); `/metrics` still renders.
    pub fn disabled() -> Self {
        Metrics {
            enabled: false,
            ..Self::new()
        }
    }

    /// Metrics whose windows read `clock`; tests inject a manual one.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let registry = Registry::new();
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
        let expired_calls = IntCounter::new(
            "sluice_deadline_exceeded_total",
            "Calls whose grpc-timeout had passed before they were decided (DEADLINE_EXCEEDED, no store call).",
        )
        .expect("static metric definition");
        let store_errors = counter_vec(
            "sluice_store_errors_total",
            "Store calls that failed or timed out, by shard and kind of error.",
            &["store", "shard", "kind"],
        );
        let store_failures_vec = counter_vec(
            "sluice_store_failures_total",
            "Calls answered by the failure mode because the store failed, timed out or was backing off.",
            &["store"],
        );
        let policy_reloads = counter_vec(
            "sluice_policy_reloads_total",
            "Policy reloads by source and result (ok, error).",
            &["source", "result"],
        );
        let tls_reloads = counter_vec(
            "sluice_tls_reloads_total",
            "TLS certificate reloads by port (grpc, http) and result (ok, error: the last good certificate kept serving).",
            &["port", "result"],
        );
        let grpc_connections = IntGauge::new(
            "sluice_grpc_connections",
            "Connections open on the gRPC port.",
        )
        .expect("static metric definition");
        let grpc_closed = counter_vec(
            "sluice_grpc_connections_closed_total",
            "gRPC connections sluice closed: refused (--grpc-max-connections), handshake_failed, handshake_timeout, keepalive_timeout (a PING went unanswered), idle (--grpc-idle-timeout).",
            &["reason"],
        );
        let active_keys = IntGaugeVec::new(
            Opts::new(
                "sluice_active_keys",
                "Counters currently held by the store.",
            ),
            &["store"],
        )
        .expect("static metric definition");
        let evictions = counter_vec(
            "sluice_evictions_total",
            "At --max-keys, counters the memory store dropped to make room (reason expired or idle) and new keys it could not keep (refused, answered by the failure mode).",
            &["reason"],
        );
        let cache_answers = IntCounter::new(
            "sluice_denial_cache_answers_total",
            "Requests denied from the Redis store's local over-limit cache, without a Redis call.",
        )
        .expect("static metric definition");
        let active_bans = IntGauge::new(
            "sluice_penalty_active_bans",
            "Keys serving a penalty ban in this process.",
        )
        .expect("static metric definition");
        let deny_ratio = GaugeVec::new(
            Opts::new(
                "sluice_deny_ratio",
                "Denied / decided descriptors of a rule over the last 60 s.",
            ),
            &["domain", "rule"],
        )
        .expect("static metric definition");
        let recent_denials = IntGaugeVec::new(
            Opts::new(
                "sluice_recent_denials",
                "Denied descriptors of a rule over the last 60 s (the deny ratio's numerator).",
            ),
            &["domain", "rule"],
        )
        .expect("static metric definition");
        let top_offenders = IntGaugeVec::new(
            Opts::new(
                "sluice_top_offenders",
                "Denials over the last 60 s of the 10 keys a rule denied most (rank 1 = most).",
            ),
            &["domain", "rule", "key", "rank"],
        )
        .expect("static metric definition");
        let regular_keys = IntGaugeVec::new(
            Opts::new(
                "sluice_regular_keys",
                "Busy keys of a rule whose last 20 gaps between requests barely vary (coefficient of variation under 0.1): scripts on a timer.",
            ),
            &["domain", "rule"],
        )
        .expect("static metric definition");
        let top_subnets = IntGaugeVec::new(
            Opts::new(
                "sluice_top_subnets",
                "Denials over the last 60 s of the 10 subnets (/24, /64) a rule denied most (rank 1 = most).",
            ),
            &["domain", "rule", "subnet", "rank"],
        )
        .expect("static metric definition");
        let top_subnet_addresses = IntGaugeVec::new(
            Opts::new(
                "sluice_top_subnet_addresses",
                "Distinct addresses denied over the last 60 s in the 10 subnets (/24, /64) of a rule with the most (rank 1 = most).",
            ),
            &["domain", "rule", "subnet", "rank"],
        )
        .expect("static metric definition");
        let denial_spike_ratio = GaugeVec::new(
            Opts::new(
                "sluice_denial_spike_ratio",
                "A sensitive rule's denials over the last 60 s against its baseline (denials per minute, an EWMA over 30 minutes, at least 1).",
            ),
            &["domain", "rule"],
        )
        .expect("static metric definition");
        for c in [
            Box::new(regular_keys.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(denial_spike_ratio.clone()),
            Box::new(top_subnets.clone()),
            Box::new(top_subnet_addresses.clone()),
            Box::new(unknown_domain.clone()),
            Box::new(bad_requests.clone()),
            Box::new(expired_calls.clone()),
            Box::new(store_errors.clone()),
            Box::new(store_failures_vec.clone()),
            Box::new(policy_reloads.clone()),
            Box::new(tls_reloads.clone()),
            Box::new(grpc_connections.clone()),
            Box::new(grpc_closed.clone()),
            Box::new(active_keys.clone()),
            Box::new(evictions.clone()),
            Box::new(cache_answers.clone()),
            Box::new(active_bans.clone()),
            Box::new(deny_ratio.clone()),
            Box::new(recent_denials.clone()),
            Box::new(top_offenders.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        // Series that dashboards and alerts read exist (at 0) from the start.
        for result in ["ok", "error"] {
            policy_reloads.with_label_values(&["file", result]);
        }
        for (reason, _) in Evictions::default().by_reason() {
            evictions.with_label_values(&[reason]);
        }
        let limits = limits::Limits::new(&registry);
        let rlqs = rlqs::QuotaStats::new(&registry);
        Metrics {
            enabled: true,
            clock,
            near_limit_ratio: DEFAULT_NEAR_LIMIT_RATIO,
            key_hasher: ahash::RandomState::new(),
            regular_keys,
            top_subnets,
            top_subnet_addresses,
            denial_spike_ratio,
            limits,
            rlqs,
            registry,
            unknown_domain,
            bad_requests,
            expired_calls,
            decision_seconds: Histogram::default(),
            store_errors,
            policy_reloads,
            tls_reloads,
            grpc_connections,
            grpc_closed,
            active_keys,
            evictions,
            cache_answers,
            cache_answer_stripes: Default::default(),
            active_bans,
            deny_ratio,
            recent_denials,
            top_offenders,
            handles: ArcSwapOption::empty(),
            erl: None,
            stats: Mutex::new(HashMap::new()),
            scrape: Mutex::new(()),
            store_failures: OnceLock::new(),
            store_failures_vec,
            store_failing: AtomicBool::new(false),
            failures_in_outage: AtomicU64::new(0),
            refusing: AtomicBool::new(false),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Counts as near its limit (`sluice_near_limit_total`) an admitted descriptor
    /// that leaves its counter past `ratio` of the limit (`--near-limit-ratio`).
    pub fn with_near_limit_ratio(mut self, ratio: f64) -> Self {
        self.near_limit_ratio = ratio;
        self
    }

    /// Also exports envoyproxy/ratelimit's per-limit series ([`erl`]), counting as
    /// near the limit the hits past `near_limit_ratio` of it.
    pub fn with_erl(mut self, near_limit_ratio: f64) -> Self {
        self.erl = Some(erl::ErlStats::new(near_limit_ratio));
        self
    }

    /// Counts one decided request.
    pub fn record(&self, domain: &str, outcome: &Outcome, took: Duration) {
        self.record_inner::<(&str, &str)>(domain, outcome, took, None);
    }

    /// Counts one decided request and feeds the signals that read its keys
    /// (`hashing` writes them as the top-offenders view does).
    pub fn record_request<E: Entry>(
        &self,
        domain: &str,
        outcome: &Outcome,
        descriptors: &[Descriptor<'_, E>],
        hashing: &Hashing,
        took: Duration,
    ) {
        self.record_inner(domain, outcome, took, Some((descriptors, hashing)));
    }

    fn record_inner<E: Entry>(
        &self,
        domain: &str,
        outcome: &Outcome,
        took: Duration,
        request: Option<(&[Descriptor<'_, E>], &Hashing)>,
    ) {
        if !self.enabled {
            return;
        }
        self.decision_seconds.observe(took);
        if !outcome.domain_known {
            self.unknown_domain.inc();
            return;
        }
        self.store_health(outcome);
        let guard = self.handles.load();
        let fresh;
        let handles: &PolicyHandles = match guard.as_deref() {
            Some(h) if std::ptr::eq(h.policy.as_ptr(), Arc::as_ptr(&outcome.policy)) => h,
            _ => {
                fresh = Arc::new(PolicyHandles {
                    policy: Arc::downgrade(&outcome.policy),
                    rules: (0..outcome.policy.rules.len())
                        .map(|_| OnceLock::new())
                        .collect(),
                    erl: (0..self.erl.as_ref().map_or(0, |_| outcome.policy.rules.len()))
                        .map(|_| OnceLock::new())
                        .collect(),
                });
                self.handles.store(Some(fresh.clone()));
                &fresh
            }
        };
        let mut now = None;
        for (i, s) in outcome.statuses.iter().enumerate() {
            // An override is counted under the rule it replaced; one that replaced
            // none has no series of its own (its labels would be the request's keys).
            let (Some(rule_id), Some(rule)) = (s.rule, outcome.rule(s)) else {
                continue;
            };
            let st = handles.rules[rule_id].get_or_init(|| {
                let configured = outcome.policy.rule(rule_id);
                let st = self.rule_stats(domain, configured);
                if configured.sensitive {
                    st.sensitive.store(true, Ordering::Relaxed);
                }
                st
            });
            let label = match (&outcome.failure, s.verdict) {
                _ if s.ban == Ban::Active => BANNED,
                _ if s.ban == Ban::Blocked => BLOCKED,
                _ if s.shed => SHED,
                (Some(f), _) if f.mode == FailureMode::Open => FAILED_OPEN,
                (Some(_), _) => FAILED_CLOSED,
                (None, Some(v)) if !v.admitted && rule.shadow_mode => SHADOW_OVER_LIMIT,
                (None, _) if s.over_limit => OVER_LIMIT,
                _ => OK,
            };
            let (counts, owned) = st.counts.local();
            striped::add(&counts.outcomes[label], owned, 1);
            if s.ban == Ban::Started {
                striped::add(&counts.bans, owned, 1);
            }
            if label == OK && near_limit(rule, s, self.near_limit_ratio) {
                striped::add(&counts.near_limit, owned, 1);
            }
            if let Some(erl) = &self.erl {
                let counts = handles.erl[rule_id]
                    .get_or_init(|| erl.counts(domain, outcome.policy.rule(rule_id)));
                erl.record(counts, rule, s);
            }
            let decided = rule.limit.is_some()
                && (s.verdict.is_some()
                    || outcome.failure.is_some()
                    || matches!(s.ban, Ban::Active | Ban::Blocked));
            if decided {
                let now =
                    *now.get_or_insert_with(|| outcome.now.unwrap_or_else(|| self.clock.now()));
                let denied = matches!(label, OVER_LIMIT | BANNED | SHED | BLOCKED);
                let (ratio, owned) = st.ratio.local();
                ratio.record(now, denied, owned);
                let entries = request.and_then(|(d, hashing)| Some((d.get(i)?.entries, hashing)));
                if let Some((entries, hashing)) = entries {
                    let hash = self.key_hash(rule, entries);
                    st.regular.arrival(now, hash, |out| {
                        crate::limiter::key::offender(rule, entries, hashing, out)
                    });
                }
                if denied {
                    if let Some(key) = outcome.offender(i) {
                        st.top.add(now, key);
                    }
                    if rule.sensitive {
                        st.spike.denial(now);
                    }
                    if let Some((entries, hashing)) = entries {
                        count_subnets(&st.subnets, now, entries, hashing);
                    }
                }
            }
        }
    }

    /// A descriptor's key for the signals: its values (a `share_threshold` level's
    /// pattern), hashed without allocating.
    fn key_hash<E: Entry>(&self, rule: &Rule, entries: &[E]) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.key_hasher.build_hasher();
        for (i, e) in entries.iter().enumerate() {
            match rule.shared.get(i).and_then(|s| s.as_deref()) {
                Some(pattern) => h.write(pattern.as_bytes()),
                None => h.write(e.value().as_bytes()),
            }
            h.write_u8(0xff);
        }
        h.finish()
    }

    /// Every rule's signals now, by domain and rule.
    pub fn signals(&self) -> Vec<RuleSignals> {
        let now = self.clock.now();
        let mut out: Vec<RuleSignals> = Vec::new();
        for st in self.all_stats() {
            let regular = st.regular.regular(now);
            let subnets = st.subnets.top(now);
            let spike = st.sensitive.load(Ordering::Relaxed).then(|| {
                let (recent, baseline) = st.spike.view(now);
                DenialSpike {
                    recent,
                    baseline,
                    ratio: signals::spike::ratio(recent, baseline),
                }
            });
            if regular.is_empty() && subnets.by_denials.is_empty() && spike.is_none() {
                continue;
            }
            match out.last_mut() {
                // The same path under two layers: one view (each subnet ranked by
                // its count under one layer).
                Some(last) if last.domain == st.domain && last.rule == st.rule => {
                    last.regular.extend(regular);
                    last.spike = match (last.spike, spike) {
                        (Some(a), Some(b)) => {
                            let recent = a.recent + b.recent;
                            let baseline = match (a.baseline, b.baseline) {
                                (Some(x), Some(y)) => Some(x + y),
                                (x, y) => x.or(y),
                            };
                            Some(DenialSpike {
                                recent,
                                baseline,
                                ratio: signals::spike::ratio(recent, baseline),
                            })
                        }
                        (a, b) => a.or(b),
                    };
                    last.subnets.by_denials.extend(subnets.by_denials);
                    last.subnets.by_addresses.extend(subnets.by_addresses);
                    let s = &mut last.subnets;
                    s.by_denials.sort_by(|a, b| {
                        b.denials
                            .cmp(&a.denials)
                            .then_with(|| a.subnet.cmp(&b.subnet))
                    });
                    s.by_addresses.sort_by(|a, b| {
                        b.addresses
                            .cmp(&a.addresses)
                            .then_with(|| a.subnet.cmp(&b.subnet))
                    });
                    s.by_denials.truncate(signals::subnet::TOP);
                    s.by_addresses.truncate(signals::subnet::TOP);
                }
                _ => out.push(RuleSignals {
                    domain: st.domain.clone(),
                    rule: st.rule.clone(),
                    regular,
                    subnets,
                    spike,
                }),
            }
        }
        out
    }

    fn rule_stats(&self, domain: &str, rule: &Rule) -> Arc<RuleStats> {
        let layer = rule.layer.as_str();
        self.stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((domain.to_string(), rule.path.clone(), layer))
            .or_insert_with(|| {
                Arc::new(RuleStats {
                    domain: domain.to_string(),
                    rule: rule.path.clone(),
                    layer,
                    counts: Stripes::default(),
                    ratio: Stripes::default(),
                    top: TopOffenders::default(),
                    regular: RegularKeys::default(),
                    subnets: Subnets::default(),
                    sensitive: AtomicBool::new(false),
                    spike: Spike::default(),
                })
            })
            .clone()
    }

    /// Every rule's stats, sorted by domain, rule and layer.
    fn all_stats(&self) -> Vec<Arc<RuleStats>> {
        let mut all: Vec<Arc<RuleStats>> = self
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| (&a.domain, &a.rule, a.layer).cmp(&(&b.domain, &b.rule, b.layer)));
        all
    }

    /// Logs the store's state changes (failing, answering again), never per request.
    fn store_health(&self, outcome: &Outcome) {
        match &outcome.failure {
            Some(f) => {
                self.store_failures
                    .get_or_init(|| self.store_failures_vec.with_label_values(&[f.store]))
                    .inc();
                self.failures_in_outage.fetch_add(1, Ordering::Relaxed);
                if !self.store_failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        store = f.store,
                        error = %f.error,
                        failure_mode = ?f.mode,
                        "store failing; answering by the failure mode"
                    );
                }
            }
            None => {
                if self.store_failing.load(Ordering::Relaxed)
                    && outcome.statuses.iter().any(|s| s.verdict.is_some())
                    && self.store_failing.swap(false, Ordering::Relaxed)
                {
                    tracing::info!(
                        failed_calls = self.failures_in_outage.swap(0, Ordering::Relaxed),
                        "store answering again"
                    );
                }
            }
        }
    }

    pub fn bad_request(&self) {
        self.bad_requests.inc();
    }

    /// The Rate Limit Quota Service's series.
    pub fn rlqs(&self) -> &rlqs::QuotaStats {
        &self.rlqs
    }

    /// A call answered DEADLINE_EXCEEDED: its caller had given up before it was
    /// decided.
    pub fn expired_call(&self) {
        self.expired_calls.inc();
    }

    /// Makes a policy source's reload series exist (at 0) before its first reload.
    pub fn declare_policy_source(&self, source: &str) {
        for result in ["ok", "error"] {
            self.policy_reloads.with_label_values(&[source, result]);
        }
    }

    /// A new policy is serving: exports its limits (`sluice_limit`), and marks as
    /// sensitive the rule paths where it has a `sensitive` descriptor (and only those).
    pub fn policy_swapped(&self, policy: &Policy) {
        self.limits.set(policy);
        let sensitive: std::collections::HashSet<(&str, &str, &str)> = policy
            .rules_by_domain()
            .into_iter()
            .filter(|(_, r)| r.sensitive)
            .map(|(d, r)| (d, r.path.as_str(), r.layer.as_str()))
            .collect();
        for st in self.all_stats() {
            let at = (st.domain.as_str(), st.rule.as_str(), st.layer);
            st.sensitive
                .store(sensitive.contains(&at), Ordering::Relaxed);
        }
    }

    pub fn policy_reload(&self, source: &str, ok: bool) {
        self.policy_reloads
            .with_label_values(&[source, if ok { "ok" } else { "error" }])
            .inc();
    }

    /// The gRPC port's connections, set at scrape time: those open now, and those
    /// closed since start, by reason.
    pub fn set_connections(&self, open: usize, closed: &[(&str, u64)]) {
        self.grpc_connections.set(open as i64);
        for (reason, count) in closed {
            let counter = self.grpc_closed.with_label_values(&[reason]);
            counter.inc_by(count.saturating_sub(counter.get()));
        }
    }

    /// Exports a TLS port's reload counters at 0 before its first reload.
    pub fn declare_tls_port(&self, port: &str) {
        for result in ["ok", "error"] {
            self.tls_reloads.with_label_values(&[port, result]);
        }
    }

    /// A change of a port's TLS files, loaded (`ok`) or refused.
    pub fn tls_reload(&self, port: &str, ok: bool) {
        self.tls_reloads
            .with_label_values(&[port, if ok { "ok" } else { "error" }])
            .inc();
    }

    /// The store's gauges, set at scrape time. Logs when the memory store starts (and
    /// stops) refusing new keys.
    pub fn set_store_state(&self, store: &str, active_keys: usize, evictions: &Evictions) {
        self.active_keys
            .with_label_values(&[store])
            .set(active_keys as i64);
        self.store_failures_vec.with_label_values(&[store]);
        let mut refusing = false;
        for (reason, total) in evictions.by_reason() {
            let counter = self.evictions.with_label_values(&[reason]);
            let seen = counter.get();
            if total > seen {
                counter.inc_by(total - seen);
                refusing |= reason == "refused";
            }
        }
        if self.refusing.swap(refusing, Ordering::Relaxed) != refusing {
            if refusing {
                tracing::warn!(
                    store,
                    active_keys,
                    "store full (--max-keys) of counters in use: new keys answered by the failure mode"
                );
            } else {
                tracing::info!(store, active_keys, "store no longer refusing new keys");
            }
        }
    }

    /// Bans in force, set at scrape time.
    pub fn set_active_bans(&self, n: usize) {
        self.active_bans.set(n as i64);
    }

    /// Every rule's deny ratio and worst keys over the last minute, by domain and rule.
    pub fn top_offenders(&self) -> Vec<RuleTop> {
        let now = self.clock.now();
        let mut out: Vec<RuleTop> = Vec::new();
        for st in self.all_stats() {
            let (decided, denied) = st.window_totals(now);
            let top = st.top.top(now, top::TOP);
            if decided == 0 && top.is_empty() {
                continue;
            }
            match out.last_mut() {
                // The same path under two layers: one view.
                Some(last) if last.domain == st.domain && last.rule == st.rule => {
                    last.decided += decided;
                    last.denied += denied;
                    let mut merged: HashMap<String, u64> = last.top.drain(..).collect();
                    for (k, n) in top {
                        *merged.entry(k).or_default() += n;
                    }
                    let mut merged: Vec<(String, u64)> = merged.into_iter().collect();
                    merged.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                    merged.truncate(top::TOP);
                    last.top = merged;
                }
                _ => out.push(RuleTop {
                    domain: st.domain.clone(),
                    rule: st.rule.clone(),
                    decided,
                    denied,
                    top,
                }),
            }
        }
        out
    }

    /// Writes the striped families in the text format.
    fn render_striped(&self, out: &mut String) {
        use std::fmt::Write;
        let stats = self.all_stats();
        if !stats.is_empty() {
            out.push_str(
                "# HELP sluice_requests_total Descriptors decided, by matched rule and outcome \
                 (ok, over_limit, shadow_over_limit, failed_open, failed_closed, banned, shed).\n\
                 # TYPE sluice_requests_total counter\n",
            );
            for st in &stats {
                for (i, o) in OUTCOMES.iter().enumerate() {
                    out.push_str("sluice_requests_total{domain=\"");
                    escape_label(&st.domain, out);
                    let _ = write!(out, "\",layer=\"{}\",outcome=\"{o}\",rule=\"", st.layer);
                    escape_label(&st.rule, out);
                    let _ = writeln!(out, "\"}} {}", st.outcome(i));
                }
            }
            out.push_str(
                "# HELP sluice_penalty_bans_total Sentences (bans, tightenings, blocks) started by a rule's penalty.\n\
                 # TYPE sluice_penalty_bans_total counter\n",
            );
            let mut bans: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
            for st in &stats {
                *bans.entry((&st.domain, &st.rule)).or_default() += st.bans();
            }
            for ((domain, rule), n) in bans {
                out.push_str("sluice_penalty_bans_total{domain=\"");
                escape_label(domain, out);
                out.push_str("\",rule=\"");
                escape_label(rule, out);
                let _ = writeln!(out, "\"}} {n}");
            }
            out.push_str(
                "# HELP sluice_near_limit_total Admitted descriptors that left their counter past --near-limit-ratio of the limit.\n\
                 # TYPE sluice_near_limit_total counter\n",
            );
            let mut near: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
            for st in &stats {
                *near.entry((&st.domain, &st.rule)).or_default() += st.near_limit();
            }
            for ((domain, rule), n) in near {
                out.push_str("sluice_near_limit_total{domain=\"");
                escape_label(domain, out);
                out.push_str("\",rule=\"");
                escape_label(rule, out);
                let _ = writeln!(out, "\"}} {n}");
            }
        }
        let h = self.decision_seconds.totals();
        out.push_str(
            "# HELP sluice_decision_seconds Time spent inside sluice per call.\n\
             # TYPE sluice_decision_seconds histogram\n",
        );
        for (bound, n) in LATENCY_BOUNDS.iter().zip(&h.cumulative) {
            let _ = writeln!(out, "sluice_decision_seconds_bucket{{le=\"{bound}\"}} {n}");
        }
        let count = h.cumulative.last().copied().unwrap_or(0);
        let _ = writeln!(out, "sluice_decision_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "sluice_decision_seconds_sum {}", h.sum_seconds);
        let _ = writeln!(out, "sluice_decision_seconds_count {count}");
    }

    /// Refills the gauges computed at scrape time.
    fn refresh(&self) {
        self.regular_keys.reset();
        self.top_subnets.reset();
        self.top_subnet_addresses.reset();
        self.denial_spike_ratio.reset();
        for s in self.signals() {
            if let Some(spike) = s.spike {
                self.denial_spike_ratio
                    .with_label_values(&[&s.domain, &s.rule])
                    .set(spike.ratio);
            }
            self.regular_keys
                .with_label_values(&[&s.domain, &s.rule])
                .set(s.regular.len() as i64);
            for (rank, n) in s.subnets.by_denials.iter().enumerate() {
                let rank = (rank + 1).to_string();
                self.top_subnets
                    .with_label_values(&[&s.domain, &s.rule, &n.subnet, &rank])
                    .set(n.denials as i64);
            }
            for (rank, n) in s.subnets.by_addresses.iter().enumerate() {
                let rank = (rank + 1).to_string();
                self.top_subnet_addresses
                    .with_label_values(&[&s.domain, &s.rule, &n.subnet, &rank])
                    .set(n.addresses as i64);
            }
        }
        self.deny_ratio.reset();
        self.recent_denials.reset();
        self.top_offenders.reset();
        for t in self.top_offenders() {
            let labels = [t.domain.as_str(), t.rule.as_str()];
            if t.decided > 0 {
                self.deny_ratio
                    .with_label_values(&labels)
                    .set(t.denied as f64 / t.decided as f64);
                self.recent_denials
                    .with_label_values(&labels)
                    .set(t.denied as i64);
            }
            for (rank, (key, denials)) in t.top.iter().enumerate() {
                let rank = (rank + 1).to_string();
                self.top_offenders
                    .with_label_values(&[&t.domain, &t.rule, key, &rank])
                    .set(*denials as i64);
            }
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh();
        let answers: u64 = self
            .cache_answer_stripes
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum();
        self.cache_answers
            .inc_by(answers.saturating_sub(self.cache_answers.get()));
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        let mut text = String::from_utf8(buf).unwrap_or_default();
        self.render_striped(&mut text);
        if let Some(erl) = &self.erl {
            erl.render(&mut text);
        }
        text
    }
}

/// Seconds of a micros duration, for JSON.
pub fn secs(us: Micros) -> f64 {
    us as f64 / SECOND as f64
}

/// The stores report their shards' errors and cached denials here.
impl Report for Metrics {
    /// Exports the shard's error counters, one per kind, at 0: a counter that first
    /// appears at 1 is lost to `rate()` and `increase()`.
    fn shard_declared(&self, store: &str, shard: &str) {
        for kind in ErrorKind::ALL {
            self.store_errors
                .with_label_values(&[store, shard, kind.as_str()]);
        }
    }

    /// Only on failed calls, never per request: the label lookup is a hash of three
    /// borrowed strings, with no allocation once the series exists.
    fn store_error(&self, store: &str, shard: &str, kind: ErrorKind) {
        self.store_errors
            .with_label_values(&[store, shard, kind.as_str()])
            .inc();
    }

    /// Per request under an attack, so counted in stripes.
    fn denial_cache_answer(&self) {
        let (count, owned) = self.cache_answer_stripes.local();
        striped::add(count, owned, 1);
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::{Descriptor, Limiter, Settings};
    use crate::store::MemoryStore;

    const T0: Micros = 1_700_000_000 * SECOND;

    const POLICY: &str = r#"
domain: d
descriptors:
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 2
      algorithm: fixed_window
      penalty: {violations: 3, within: 10s, ban: 1m}
"#;

    fn setup(clock: &ManualClock, hash_keys: bool) -> (Limiter<MemoryStore>, Metrics) {
        let settings = Settings {
            hashing: crate::limiter::key::Hashing {
                all: hash_keys,
                hash: secret_hash(),
            },
            ..Settings::default()
        };
        let limiter = crate::limiter::test_limiter(POLICY, clock, settings);
        (limiter, Metrics::with_clock(Arc::new(clock.clone())))
    }

    fn secret_hash() -> crate::hash::ValueHash {
        crate::hash::ValueHash::from_secret(b"the replicas' shared secret").unwrap()
    }

    async fn ask(l: &Limiter<MemoryStore>, m: &Metrics, ip: &str) {
        let entries = [("ip", ip)];
        let outcome = l.decide("d", &[Descriptor::new(&entries[..], 1)]).await;
        m.record("d", &outcome, Duration::from_micros(10));
    }

    #[tokio::test]
    async fn ratio_top_offenders_and_bans_are_exported() {
        let clock = ManualClock::new(T0);
        let (l, m) = setup(&clock, false);
        for _ in 0..10 {
            ask(&l, &m, "6.6.6.6").await;
        }
        for i in 0..10 {
            ask(&l, &m, &format!("10.0.0.{i}")).await;
        }
        let text = m.render();
        // 20 decisions: 6.6.6.6 admitted twice, denied 3 times, then banned 5 times.
        assert!(
            text.contains(r#"sluice_deny_ratio{domain="d",rule="ip"} 0.4"#),
            "{text}"
        );
        assert!(text.contains(r#"sluice_recent_denials{domain="d",rule="ip"} 8"#));
        assert!(
            text.contains(r#"sluice_top_offenders{domain="d",key="6.6.6.6",rank="1",rule="ip"} 8"#),
            "{text}"
        );
        assert!(text.contains(r#"sluice_penalty_bans_total{domain="d",rule="ip"} 1"#));
        assert!(text.contains(
            r#"sluice_requests_total{domain="d",layer="service",outcome="banned",rule="ip"} 5"#
        ));
        assert!(text.contains(
            r#"sluice_requests_total{domain="d",layer="service",outcome="over_limit",rule="ip"} 3"#
        ));
        // A minute and a quarter later the window is empty and the series are gone.
        clock.advance(75 * SECOND);
        let text = m.render();
        assert!(!text.contains("sluice_deny_ratio{"), "{text}");
        assert!(!text.contains("sluice_top_offenders{"), "{text}");
        assert!(m.top_offenders().is_empty());
    }

    #[tokio::test]
    async fn shed_and_near_limit_are_counted_per_rule() {
        let policy = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window, shed: {from: 0.5}}\n";
        let clock = ManualClock::new(T0);
        let l = crate::limiter::test_limiter(policy, &clock, Settings::default())
            .with_chance(Arc::new(crate::limiter::shed::SeededChance::new(5)));
        let m = Metrics::with_clock(Arc::new(clock.clone())).with_near_limit_ratio(0.8);
        let (mut shed, mut near) = (0, 0);
        for k in 0..50 {
            let ip = format!("10.0.0.{k}");
            let entries = [("ip", ip.as_str())];
            for n in 1..=12 {
                let o = l.decide("d", &[Descriptor::new(&entries[..], 1)]).await;
                m.record("d", &o, Duration::from_micros(10));
                shed += usize::from(o.statuses[0].shed);
                // Admitted to 9 or 10 of 10: past 0.8 of the limit.
                near += usize::from(!o.over_limit && n >= 9);
            }
        }
        assert!(shed > 0 && near > 0, "{shed} {near}");
        let text = m.render();
        for line in [
            format!(r#"sluice_requests_total{{domain="d",layer="service",outcome="shed",rule="ip"}} {shed}"#),
            format!(r#"sluice_near_limit_total{{domain="d",rule="ip"}} {near}"#),
            r#"sluice_requests_total{domain="d",layer="service",outcome="over_limit",rule="ip"} 100"#.to_string(),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }
    }

    /// One client every 20 ms, another with exponential gaps of the same mean
    /// (seeded), through the limiter: only the first is listed, with `--hash-keys`
    /// as its hash.
    #[tokio::test]
    async fn a_client_on_a_timer_is_listed_as_regular() {
        use rand::{Rng, SeedableRng};
        let policy = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";
        for hash_keys in [false, true] {
            let clock = ManualClock::new(T0);
            let settings = Settings {
                hashing: crate::limiter::key::Hashing {
                    all: hash_keys,
                    hash: secret_hash(),
                },
                ..Settings::default()
            };
            let l = crate::limiter::test_limiter(policy, &clock, settings);
            let m = Metrics::with_clock(Arc::new(clock.clone()));
            let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
            let mut events: Vec<(Micros, &str)> = Vec::new();
            let (mut bot, mut person) = (T0, T0);
            for _ in 0..60 {
                bot += 20_000;
                events.push((bot, "6.6.6.6"));
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                person += (-u.ln() * 20_000.0) as Micros;
                events.push((person, "10.0.0.1"));
            }
            events.sort();
            for (t, ip) in events {
                clock.set(t);
                let entries = [("ip", ip)];
                let d = [Descriptor::new(&entries[..], 1)];
                let o = l.decide("d", &d).await;
                m.record_request("d", &o, &d, l.hashing(), Duration::from_micros(10));
            }
            let signals = m.signals();
            assert_eq!(signals.len(), 1, "{signals:?}");
            let regular = &signals[0].regular;
            assert_eq!(regular.len(), 1, "{regular:?}");
            let mut shown = String::new();
            if hash_keys {
                secret_hash().push_hex(&mut shown, b"6.6.6.6");
            } else {
                shown.push_str("6.6.6.6");
            }
            assert_eq!(regular[0].key, shown);
            assert_eq!(regular[0].requests, 60);
            assert!((regular[0].mean_interval - 0.02).abs() < 1e-9);
            let text = m.render();
            assert!(
                text.contains(r#"sluice_regular_keys{domain="d",rule="ip"} 1"#),
                "{text}"
            );
            assert!(!text.contains("6.6.6.6") || !hash_keys);
        }
    }

    /// 50 addresses of one /24 each a little over the limit, beside 10 loud
    /// addresses of their own networks: no address of the /24 is a top offender, the
    /// /24 is the first subnet by denials and by addresses.
    #[tokio::test]
    async fn a_subnet_of_quiet_offenders_ranks_first() {
        for hash_keys in [false, true] {
            let clock = ManualClock::new(T0);
            let settings = Settings {
                hashing: crate::limiter::key::Hashing {
                    all: hash_keys,
                    hash: secret_hash(),
                },
                ..Settings::default()
            };
            // POLICY: 2 a minute, banned after 3 denials in 10 s.
            let l = crate::limiter::test_limiter(POLICY, &clock, settings);
            let m = Metrics::with_clock(Arc::new(clock.clone()));
            let send = |ip: String| {
                let (l, m) = (&l, &m);
                async move {
                    let entries = [("ip", ip.as_str())];
                    let d = [Descriptor::new(&entries[..], 1)];
                    let o = l.decide("d", &d).await;
                    m.record_request("d", &o, &d, l.hashing(), Duration::from_micros(10));
                }
            };
            for i in 0..50 {
                for _ in 0..3 {
                    send(format!("10.1.2.{i}")).await;
                }
            }
            for i in 0..10 {
                for _ in 0..6 {
                    send(format!("192.168.{i}.1")).await;
                }
            }
            let shown = |v: &str| {
                let mut out = String::new();
                crate::limiter::key::push_value(&mut out, v, l.hashing());
                out
            };
            let top = &m.top_offenders()[0].top;
            assert_eq!(top.len(), 10);
            assert!(top.iter().all(|(_, n)| *n == 4), "{top:?}");
            let quiet: Vec<String> = (0..50).map(|i| shown(&format!("10.1.2.{i}"))).collect();
            assert!(top.iter().all(|(k, _)| !quiet.contains(k)), "{top:?}");
            let s = &m.signals()[0].subnets;
            let net = shown("10.1.2.0/24");
            assert_eq!(
                (s.by_denials[0].subnet.as_str(), s.by_denials[0].denials),
                (net.as_str(), 50)
            );
            assert_eq!(
                (
                    s.by_addresses[0].subnet.as_str(),
                    s.by_addresses[0].addresses
                ),
                (net.as_str(), 50)
            );
            assert_eq!(s.by_denials[1].denials, 4);
            let text = m.render();
            let series =
                format!(r#"sluice_top_subnets{{domain="d",rank="1",rule="ip",subnet="{net}"}} 50"#);
            assert!(text.contains(&series), "{series} in {text}");
            assert!(text.contains(&format!(
                r#"sluice_top_subnet_addresses{{domain="d",rank="1",rule="ip",subnet="{net}"}} 50"#
            )));
            assert_eq!(text.contains("10.1.2."), !hash_keys);
        }
    }

    /// A login path denying 2 a minute for half an hour, then 30 in one minute: its
    /// spike ratio is about 15 and it is listed. The same denials of `/search`, on
    /// the same rule path but not sensitive, do not count.
    #[tokio::test]
    async fn a_sensitive_rule_spikes_against_its_own_baseline() {
        let policy = "domain: d\ndescriptors:\n  - key: path\n    value: /login\n    sensitive: true\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: path\n    value: /search\n    rate_limit: {unit: second, requests_per_unit: 0}\n";
        let start = T0 - T0 % (60 * SECOND);
        let clock = ManualClock::new(start);
        let l = crate::limiter::test_limiter(policy, &clock, Settings::default());
        let m = Metrics::with_clock(Arc::new(clock.clone()));
        let deny = |path: &'static str| {
            let (l, m) = (&l, &m);
            async move {
                let entries = [("path", path)];
                let o = l.decide("d", &[Descriptor::new(&entries[..], 1)]).await;
                assert!(o.over_limit);
                m.record("d", &o, Duration::from_micros(10));
            }
        };
        for minute in 0..30 {
            for i in 0..2 {
                clock.set(start + minute * 60 * SECOND + i * 20 * SECOND);
                deny("/login").await;
                deny("/search").await;
            }
        }
        clock.set(start + 30 * 60 * SECOND);
        let calm = m.signals();
        let spike = calm[0].spike.unwrap();
        assert!((spike.baseline.unwrap() - 2.0).abs() < 1e-9, "{spike:?}");
        assert!(!spike.is_spike(), "{spike:?}");
        for i in 0..30 {
            clock.set(start + 30 * 60 * SECOND + i * SECOND);
            deny("/login").await;
            deny("/search").await;
        }
        let spike = m.signals()[0].spike.unwrap();
        // The 30 of this minute and minute 29's 2 weighted by 31 of its 60 s.
        let recent = 30.0 + 2.0 * 31.0 / 60.0;
        assert!((spike.recent - recent).abs() < 1e-9, "{spike:?}");
        assert!((spike.ratio - recent / 2.0).abs() < 1e-9, "{spike:?}");
        assert!(spike.is_spike());
        let text = m.render();
        assert!(
            text.contains(r#"sluice_denial_spike_ratio{domain="d",rule="path"} 15.51"#),
            "{text}"
        );
        // Three quiet minutes later the last minute is empty: ratio 0.
        clock.advance(3 * 60 * SECOND);
        let spike = m.signals()[0].spike.unwrap();
        assert_eq!((spike.recent, spike.ratio), (0.0, 0.0));
        assert!(!spike.is_spike());
        // A policy where /login is no longer sensitive: its gauge goes.
        let plain = policy.replace("    sensitive: true\n", "");
        let docs = crate::policy::parse_str("p.yaml", &plain).unwrap();
        m.policy_swapped(&crate::policy::compile(docs).unwrap());
        assert!(m.signals().iter().all(|s| s.spike.is_none()));
        assert!(!m.render().contains("sluice_denial_spike_ratio{"));
    }

    #[tokio::test]
    async fn hash_keys_shows_hashes_in_the_top_offenders() {
        let clock = ManualClock::new(T0);
        let (l, m) = setup(&clock, true);
        for _ in 0..5 {
            ask(&l, &m, "6.6.6.6").await;
        }
        let top = m.top_offenders();
        assert_eq!(top.len(), 1);
        assert_eq!(top[0].top.len(), 1);
        let mut keyed = String::new();
        secret_hash().push_hex(&mut keyed, b"6.6.6.6");
        assert_eq!(top[0].top[0].0, keyed);
        let text = m.render();
        assert!(!text.contains("6.6.6.6"));
        assert!(text.contains(&keyed), "{text}");
    }

    /// Captures what a tracing subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn store_state_changes_are_logged_once_each() {
        use crate::limiter::{Status, StoreFailure};
        let docs = crate::policy::parse_str("p.yaml", POLICY).expect("parses");
        let policy = Arc::new(crate::policy::compile(docs).expect("compiles"));
        let outcome = |failed: bool| Outcome {
            policy: policy.clone(),
            domain_known: true,
            over_limit: false,
            statuses: vec![Status {
                rule: Some(0),
                limit_override: None,
                over_limit: false,
                verdict: (!failed).then(crate::algorithm::Verdict::default),
                hits: 1,
                ban: Ban::None,
                shed: false,
                tightened: false,
            }],
            delay: 0,
            failure: failed.then(|| StoreFailure {
                error: "store timed out".into(),
                mode: FailureMode::Open,
                store: "redis",
            }),
            offenders: Vec::new(),
            now: None,
            overrides: Vec::new(),
        };
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let m = Metrics::new();
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                m.record("d", &outcome(false), Duration::ZERO);
            }
            for _ in 0..5 {
                m.record("d", &outcome(true), Duration::ZERO);
            }
            for _ in 0..3 {
                m.record("d", &outcome(false), Duration::ZERO);
            }
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("store failing") && lines[0].contains("redis"));
        assert!(lines[1].contains("store answering again") && lines[1].contains("failed_calls=5"));
        assert!(m
            .render()
            .contains(r#"sluice_store_failures_total{store="redis"} 5"#));
        assert!(m.render().contains(
            r#"sluice_requests_total{domain="d",layer="service",outcome="failed_open",rule="ip"} 5"#
        ));
    }

    #[tokio::test]
    async fn disabled_metrics_record_nothing() {
        let clock = ManualClock::new(T0);
        let (l, _) = setup(&clock, false);
        let m = Metrics::disabled();
        ask(&l, &m, "1.1.1.1").await;
        assert!(!m.render().contains("sluice_requests_total{"));
    }

    #[test]
    fn store_errors_are_counted_per_shard_and_kind_from_zero() {
        let m = Metrics::new();
        let report: &dyn Report = &m;
        report.shard_declared("redis", "10.0.0.1:6379");
        let text = m.render();
        for kind in ErrorKind::ALL {
            let zero = format!(
                "sluice_store_errors_total{{kind=\"{kind}\",shard=\"10.0.0.1:6379\",store=\"redis\"}} 0\n"
            );
            assert!(text.contains(&zero), "{zero} in {text}");
        }
        report.store_error("redis", "10.0.0.1:6379", ErrorKind::ReadOnly);
        report.store_error("redis", "10.0.0.1:6379", ErrorKind::ReadOnly);
        report.store_error("redis", "10.0.0.1:6379", ErrorKind::Oom);
        let text = m.render();
        assert!(text.contains(
            r#"sluice_store_errors_total{kind="readonly",shard="10.0.0.1:6379",store="redis"} 2"#
        ));
        assert!(text.contains(
            r#"sluice_store_errors_total{kind="oom",shard="10.0.0.1:6379",store="redis"} 1"#
        ));
        assert!(text.contains(
            r#"sluice_store_errors_total{kind="connection",shard="10.0.0.1:6379",store="redis"} 0"#
        ));
    }
}
