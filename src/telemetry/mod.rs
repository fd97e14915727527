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
//!
//! Each family of series is made and registered by the module that owns it:
//! connections and TLS reloads (`connections`), the store (`store`), denials and
//! bans (`denials`), the signals ([`signals`]), limits ([`limits`]), RLQS ([`rlqs`]),
//! `failure_mode: local` ([`local`]) and envoyproxy/ratelimit's names ([`erl`]);
//! `Metrics` holds one of each, inline, so recording costs no extra indirection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use prometheus::{Encoder, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

use crate::algorithm::{Micros, SECOND};
use crate::clock::{Clock, SystemClock};
use crate::limiter::key::Hashing;
use crate::limiter::{Ban, Descriptor, Outcome};
use crate::policy::{Entry, FailureMode, Policy, Rule};
use crate::store::{ErrorKind, Evictions, Report, Spend};

mod connections;
mod denials;
#[cfg(target_os = "linux")]
mod process;
mod record;
mod render;
mod store;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

pub mod erl;
pub mod exemplar;
pub mod limits;
pub mod local;
pub mod peak;
pub mod printable;
pub mod ratio;
pub mod rlqs;
pub mod signals;
pub mod striped;
pub mod top;

use ratio::{DenyWindow, SumWindow};
use signals::regular::RegularKeys;
use signals::spike::Spike;
use signals::subnet::{Subnets, TopSubnets};
use striped::{escape_label, Histogram, Stripes, LATENCY_BOUNDS};
use top::TopOffenders;

/// The `outcome` label values of `sluice_requests_total`.
pub const OUTCOMES: [&str; 9] = [
    "ok",
    "over_limit",
    "shadow_over_limit",
    "failed_open",
    "failed_closed",
    "banned",
    "shed",
    "blocked",
    "quota_over_limit",
];
const OK: usize = 0;
const OVER_LIMIT: usize = 1;
const SHADOW_OVER_LIMIT: usize = 2;
const FAILED_OPEN: usize = 3;
const FAILED_CLOSED: usize = 4;
const BANNED: usize = 5;
const SHED: usize = 6;
const BLOCKED: usize = 7;
/// A `quota_mode` limit past its limit in a request another quota limit admitted.
const QUOTA_OVER_LIMIT: usize = 8;

/// `--near-limit-ratio`'s default, envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`.
pub const DEFAULT_NEAR_LIMIT_RATIO: f64 = 0.8;

/// `--peak-window`'s default: the Helm chart's scrape interval, so that each scrape
/// sees every peak since the one before ([`peak`]).
pub const DEFAULT_PEAK_WINDOW: Duration = Duration::from_secs(15);

/// (domain, rule path, layer).
type StatsKey = (String, String, &'static str);

/// One stripe of a rule's counts.
#[derive(Debug, Default)]
struct RuleCounts {
    outcomes: [AtomicU64; OUTCOMES.len()],
    bans: AtomicU64,
    /// Admitted descriptors that left their counter past the near-limit ratio.
    near_limit: AtomicU64,
    /// Hits spent ([`COST_KINDS`]: admitted requests', a denied request's on the
    /// limits that admitted it when it spends them, and every charge's), given
    /// back by refunds, and charged past the limit (the cost of charges that did
    /// not fit, spent and owed).
    cost: [AtomicU64; COST_KINDS.len()],
}

/// The `kind` label of `sluice_cost_total`, in `RuleCounts::cost`'s order.
pub const COST_KINDS: [&str; 3] = ["spent", "refunded", "over"];

/// Everything counted for one (domain, rule path, layer).
#[derive(Debug)]
pub struct RuleStats {
    pub domain: String,
    pub rule: String,
    pub layer: &'static str,
    counts: Stripes<RuleCounts>,
    /// The `outcome`s of [`OUTCOMES`] exported at 0, a bit each: those the serving
    /// policy's rule can have (others show once counted).
    exported: AtomicU16,
    ratio: Stripes<DenyWindow>,
    /// Hits spent and refunded over the last minute, for `sluice top`.
    spent: Stripes<SumWindow>,
    refunded: Stripes<SumWindow>,
    pub top: TopOffenders,
    /// The busiest keys' request times ([`signals::regular`]).
    regular: RegularKeys,
    /// Denials by /24 and /64 ([`signals::subnet`]).
    subnets: Subnets,
    /// Whether the rule is `sensitive` in the policy serving now, and its denial
    /// spike ([`signals::spike`]).
    sensitive: AtomicBool,
    spike: Spike,
    /// `algorithm: concurrency`: the most slots in use a decision reported
    /// (`sluice_in_flight`), made on a concurrency rule's first decision.
    in_flight: OnceLock<Box<peak::Peak>>,
    /// The most a key owed after a charge (`sluice_debt`), made on the first charge
    /// that left one owing.
    debt: OnceLock<Box<peak::Peak>>,
}

impl RuleStats {
    /// (decided, denied) over the last minute.
    /// Hits spent and refunded over the minute ending at `now`.
    pub fn cost_totals(&self, now: Micros) -> (u64, u64) {
        let spent = self
            .spent
            .iter()
            .map(|w| w.total(now))
            .fold(0, u64::saturating_add);
        let refunded = self
            .refunded
            .iter()
            .map(|w| w.total(now))
            .fold(0, u64::saturating_add);
        (spent, refunded)
    }

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
            .fold(0, u64::saturating_add)
    }

    fn bans(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| c.bans.load(Ordering::Relaxed))
            .fold(0, u64::saturating_add)
    }

    fn near_limit(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| c.near_limit.load(Ordering::Relaxed))
            .fold(0, u64::saturating_add)
    }

    /// Hits of one kind of [`COST_KINDS`].
    pub fn cost(&self, kind: usize) -> u64 {
        self.counts
            .iter()
            .map(|c| c.cost[kind].load(Ordering::Relaxed))
            .fold(0, u64::saturating_add)
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
    /// Hits spent (as `sluice_cost_total` counts them) and given back by
    /// refunds over the last minute: the rule's cost, where a call may cost more
    /// than one.
    pub spent: u64,
    pub refunded: u64,
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
    /// The period of the windowed maxima ([`peak`]), in microseconds.
    peak_window: Micros,
    /// Hashes a descriptor's values to tell keys apart in the signals.
    key_hasher: ahash::RandomState,
    registry: Registry,
    unknown_domain: IntCounter,
    bad_requests: IntCounter,
    oversized_requests: IntCounter,
    expired_calls: IntCounter,
    abandoned_calls: IntCounter,
    decision_seconds: Histogram,
    /// Trace ids of sampled calls per `decision_seconds` bucket (OpenMetrics only).
    exemplars: exemplar::Exemplars,
    policy_reloads: IntCounterVec,
    /// By source: 1 while its latest change is refused (the last good one serves).
    policy_refused: prometheus::IntGaugeVec,
    /// `sluice_denial_cache_answers_total`, counted in stripes (an attack makes it a
    /// per-request counter) and carried into the registry at scrape time.
    handles: ArcSwapOption<PolicyHandles>,
    connections: connections::ConnectionStats,
    store: store::StoreStats,
    denials: denials::DenialStats,
    signals: signals::gauges::SignalStats,
    limits: limits::Limits,
    rlqs: rlqs::QuotaStats,
    /// `failure_mode: local`'s series, set at scrape time.
    local: local::LocalStats,
    /// envoyproxy/ratelimit's series, with `--prometheus-addr`.
    erl: Option<erl::ErlStats>,
    /// Rule stats by (domain, rule path, layer); locked only when a policy's rule is
    /// first seen, when a policy is swapped in and at scrape time.
    stats: Mutex<record::RuleTable>,
    /// Serialises scrapes, which reset and refill the computed gauges.
    scrape: Mutex<()>,
    /// `sluice_store_failures_total{store}`: calls the failure mode answered (store
    /// errors, timeouts, back-off), resolved on the first failure so an outage does
    /// not look labels up per request. Per-shard errors are the stores' own count in
    /// `sluice_store_errors_total`; keeping the two apart means neither double counts.
    store_failures: OnceLock<IntCounter>,
    trace_spans: OnceLock<IntCounterVec>,
    xds_connected: OnceLock<prometheus::IntGauge>,
    store_failing: AtomicBool,
    failures_in_outage: AtomicU64,
    /// When the failure mode last answered, on `clock`: the store counts as answering
    /// again only after [`record::STORE_QUIET`] without one.
    last_store_failure: AtomicU64,
    /// A shard that had failed answered again since the last failure-mode answer:
    /// the store's own word that an outage ended, when no decision came to say so.
    store_answered: AtomicBool,
    /// The memory store is refusing new keys (logged when it starts and stops).
    refusing: AtomicBool,
    /// New keys refused by the memory store, as last looked at by
    /// [`Metrics::watch_refusals`].
    refusals_seen: AtomicU64,
    /// Looks since the last refusal, while refusing.
    quiet_looks: AtomicU64,
}

/// How many looks (one a second) without a refused key end a run of refusals: a
/// flood with short pauses is one run, logged once.
const REFUSALS_QUIET_LOOKS: u64 = 30;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers `c` and hands it back, to keep: each module's series are made and
/// registered in one statement.
fn registered<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

// The families' constructors fail only on a malformed name or label, which these
// static definitions do not have.
fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition")
}

fn int_counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("static metric definition")
}

fn int_gauge(name: &str, help: &str) -> prometheus::IntGauge {
    prometheus::IntGauge::new(name, help).expect("static metric definition")
}

fn int_gauge_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::IntGaugeVec {
    prometheus::IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition")
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
    prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("static metric definition")
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
        // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds
        // and the rest, read from /proc at each scrape: what envoyproxy/ratelimit's
        // Go client serves, and what dashboards built for it chart.
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(process::Process::for_self()))
            .expect("metric names are unique");
        let unknown_domain = registered(
            &registry,
            int_counter(
                "sluice_unknown_domain_requests_total",
                "Requests naming a domain no policy defines (answered OK).",
            ),
        );
        let bad_requests = registered(
            &registry,
            int_counter(
                "sluice_invalid_requests_total",
                "Requests refused with INVALID_ARGUMENT.",
            ),
        );
        let oversized_requests = registered(
            &registry,
            int_counter(
                "sluice_oversized_requests_total",
                "ShouldRateLimit requests (gRPC, or POST /json) refused as larger than --max-request-bytes, or (gRPC) as arriving in pieces while --grpc-max-buffered-request-bytes of unfinished requests were held (RESOURCE_EXHAUSTED, HTTP 413).",
            ),
        );
        let expired_calls = registered(
            &registry,
            int_counter(
                "sluice_deadline_exceeded_total",
                "Calls whose grpc-timeout had passed before they were decided (DEADLINE_EXCEEDED, no store call).",
            ),
        );
        let abandoned_calls = registered(
            &registry,
            int_counter(
                "sluice_abandoned_calls_total",
                "ShouldRateLimit calls whose client had reset the stream before they were read (Envoy gives up at its filter timeout): not decided, nothing counted.",
            ),
        );
        let policy_reloads = registered(
            &registry,
            counter_vec(
                "sluice_policy_reloads_total",
                "Policy reloads by source and result (ok, error).",
                &["source", "result"],
            ),
        );
        let policy_refused = registered(
            &registry,
            int_gauge_vec(
                "sluice_policy_refused",
                "1 while a policy source's latest change is refused and the last good policy keeps serving (a restart would not load it), 0 otherwise.",
                &["source"],
            ),
        );
        // Series that dashboards and alerts read exist (at 0) from the start.
        for result in ["ok", "error"] {
            policy_reloads.with_label_values(&["file", result]);
        }
        policy_refused.with_label_values(&["file"]);
        let connections = connections::ConnectionStats::new(&registry);
        let store = store::StoreStats::new(&registry);
        let denials = denials::DenialStats::new(&registry);
        let signals = signals::gauges::SignalStats::new(&registry);
        let limits = limits::Limits::new(&registry);
        let rlqs = rlqs::QuotaStats::new(&registry);
        let local = local::LocalStats::new(&registry);
        Metrics {
            enabled: true,
            clock,
            near_limit_ratio: DEFAULT_NEAR_LIMIT_RATIO,
            peak_window: DEFAULT_PEAK_WINDOW.as_micros() as Micros,
            key_hasher: ahash::RandomState::new(),
            connections,
            store,
            denials,
            signals,
            limits,
            rlqs,
            local,
            registry,
            unknown_domain,
            bad_requests,
            oversized_requests,
            expired_calls,
            abandoned_calls,
            decision_seconds: Histogram::default(),
            exemplars: Default::default(),
            policy_reloads,
            policy_refused,
            handles: ArcSwapOption::empty(),
            erl: None,
            stats: Mutex::default(),
            scrape: Mutex::new(()),
            store_failures: OnceLock::new(),
            trace_spans: OnceLock::new(),
            xds_connected: OnceLock::new(),
            store_failing: AtomicBool::new(false),
            failures_in_outage: AtomicU64::new(0),
            last_store_failure: AtomicU64::new(0),
            store_answered: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            refusals_seen: AtomicU64::new(0),
            quiet_looks: AtomicU64::new(0),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// A sampled call's trace id, as the exemplar of its `sluice_decision_seconds`
    /// bucket.
    pub fn exemplar(&self, took: Duration, trace_id: [u8; 16]) {
        self.exemplars.offer(took, trace_id, self.clock.now());
    }

    /// Whether tracing is on, so exemplars may exist ([`Metrics::trace_spans`] was
    /// called).
    pub fn has_exemplars(&self) -> bool {
        self.trace_spans.get().is_some()
    }

    /// `sluice_trace_spans_total`'s counters (exported, dropped, failed), registered
    /// on first use: the series exist only when tracing is on.
    pub fn trace_spans(&self) -> [IntCounter; 3] {
        let vec = self.trace_spans.get_or_init(|| {
            let vec = IntCounterVec::new(
                prometheus::Opts::new(
                    "sluice_trace_spans_total",
                    "Finished trace spans: exported, dropped (the export queue was full) or failed (the collector did not take their batch).",
                ),
                &["result"],
            )
            .expect("valid metric");
            let _ = self.registry.register(Box::new(vec.clone()));
            vec
        });
        ["exported", "dropped", "failed"].map(|r| vec.with_label_values(&[r]))
    }

    /// `sluice_xds_connected`, registered on first use: the series exists only with
    /// `--xds-server`.
    pub fn xds_connected(&self) -> prometheus::IntGauge {
        self.xds_connected
            .get_or_init(|| {
                let gauge = int_gauge(
                    "sluice_xds_connected",
                    "1 while a stream to the xDS server is open, 0 while it is retried.",
                );
                let _ = self.registry.register(Box::new(gauge.clone()));
                gauge
            })
            .clone()
    }

    /// Counts as near its limit (`sluice_near_limit_total`) an admitted descriptor
    /// that leaves its counter past `ratio` of the limit (`--near-limit-ratio`).
    pub fn with_near_limit_ratio(mut self, ratio: f64) -> Self {
        self.near_limit_ratio = ratio;
        self
    }

    /// Reports `sluice_in_flight` and `sluice_debt` as the highest value over the
    /// last `window` at least, two at most (`--peak-window`; [`peak`]).
    pub fn with_peak_window(mut self, window: Duration) -> Self {
        self.peak_window = (window.as_micros() as Micros).max(1);
        self
    }

    /// The period of the windowed maxima holding `now`.
    fn peak_period(&self, now: Micros) -> u64 {
        now / self.peak_window
    }

    /// Also exports envoyproxy/ratelimit's per-limit series ([`erl`]), counting as
    /// near the limit the hits past `near_limit_ratio` of it.
    pub fn with_erl(mut self, near_limit_ratio: f64) -> Self {
        self.erl = Some(erl::ErlStats::new(near_limit_ratio));
        self
    }

    pub fn bad_request(&self) {
        self.bad_requests.inc();
    }

    /// Whether envoyproxy/ratelimit's series are kept (`--prometheus-addr`): only
    /// then is a gRPC call's time taken for [`Metrics::erl_call`].
    pub fn erl_enabled(&self) -> bool {
        self.enabled && self.erl.is_some()
    }

    /// A gRPC `ShouldRateLimit` call answered in `took`, for envoyproxy/ratelimit's
    /// `total_requests` and `response_time_seconds`.
    pub fn erl_call(&self, took: Duration) {
        if let (true, Some(erl)) = (self.enabled, &self.erl) {
            erl.call(took);
        }
    }

    /// A `ShouldRateLimit` call answered with an error, for envoyproxy/ratelimit's
    /// `should_rate_limit_error`.
    pub fn erl_error(&self, e: erl::CallError) {
        if let (true, Some(erl)) = (self.enabled, &self.erl) {
            erl.error(e);
        }
    }

    /// A `ShouldRateLimit` request refused for its size, unread.
    pub fn oversized_request(&self) {
        self.oversized_requests.inc();
    }

    /// The Rate Limit Quota Service's series.
    pub fn rlqs(&self) -> &rlqs::QuotaStats {
        &self.rlqs
    }

    /// `failure_mode: local`'s series.
    pub fn local(&self) -> &local::LocalStats {
        &self.local
    }

    /// A call answered DEADLINE_EXCEEDED: its caller had given up before it was
    /// decided.
    pub fn expired_call(&self) {
        self.expired_calls.inc();
    }

    /// A call whose client reset its stream before it was read: not decided.
    pub fn abandoned_call(&self) {
        self.abandoned_calls.inc();
    }

    /// Makes a policy source's reload series exist (at 0) before its first reload.
    pub fn declare_policy_source(&self, source: &str) {
        for result in ["ok", "error"] {
            self.policy_reloads.with_label_values(&[source, result]);
        }
        self.policy_refused.with_label_values(&[source]);
    }

    /// A new policy is serving: exports its limits (`sluice_limit`), exports each of
    /// its rules' series at 0 (a series that first appears at 1 is lost to `rate()`
    /// and `increase()`) and drops those of rules it no longer has (their RLQS and
    /// envoyproxy/ratelimit series too), and marks as sensitive the rule paths where
    /// it has a `sensitive` descriptor (and only those).
    pub fn policy_swapped(&self, policy: &Policy) {
        self.limits.set(policy);
        self.declare_rules(policy);
        self.rlqs.policy_swapped(policy);
        if let Some(erl) = &self.erl {
            erl.policy_swapped(policy);
        }
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

    /// Whether `source`'s latest change is refused now (`sluice_policy_refused`).
    pub fn policy_refused(&self, source: &str, refused: bool) {
        self.policy_refused
            .with_label_values(&[source])
            .set(i64::from(refused));
    }

    pub fn policy_reload(&self, source: &str, ok: bool) {
        self.policy_reloads
            .with_label_values(&[source, if ok { "ok" } else { "error" }])
            .inc();
    }

    /// A gRPC port's connections (`grpc` or `admin`), set at scrape time: those
    /// open now, and those closed since start, by reason.
    pub fn set_connections(&self, port: &str, open: usize, closed: &[(&str, u64)]) {
        let stats = &self.connections;
        stats
            .grpc_connections
            .with_label_values(&[port])
            .set(open as i64);
        for (reason, count) in closed {
            let counter = stats.grpc_closed.with_label_values(&[port, reason]);
            counter.inc_by(count.saturating_sub(counter.get()));
        }
    }

    /// Counts the connections an HTTP port refused (its guard holds it).
    pub fn http_refused(&self) -> IntCounter {
        self.connections.http_refused.clone()
    }

    /// Counts the connections an HTTP port closed because a request did not arrive
    /// whole in time.
    pub fn http_timed_out(&self) -> IntCounter {
        self.connections.http_timed_out.clone()
    }

    /// Counts a `POST /json` body not read whole in time (its connection closes).
    pub fn body_timed_out(&self) {
        self.connections.http_timed_out.inc();
    }

    /// Exports a TLS port's reload counters, and its refused gauge, at 0 before its
    /// first reload.
    pub fn declare_tls_port(&self, port: &str) {
        for result in ["ok", "error"] {
            self.connections
                .tls_reloads
                .with_label_values(&[port, result]);
        }
        self.connections.tls_refused.with_label_values(&[port]);
    }

    /// The `notAfter` (seconds since the epoch) of the certificate `port` serves.
    pub fn tls_certificate_expiry(&self, port: &str, not_after: i64) {
        self.connections
            .tls_expiry
            .with_label_values(&[port])
            .set(not_after);
    }

    /// A change of a port's TLS files, loaded (`ok`) or refused: refused, the port
    /// stays refused (`sluice_tls_refused`) until a change loads.
    pub fn tls_reload(&self, port: &str, ok: bool) {
        self.connections
            .tls_reloads
            .with_label_values(&[port, if ok { "ok" } else { "error" }])
            .inc();
        self.connections
            .tls_refused
            .with_label_values(&[port])
            .set(i64::from(!ok));
    }

    /// The store's gauges, set at scrape time.
    pub fn set_store_state(&self, store: &str, active_keys: usize, evictions: &Evictions) {
        self.store
            .active_keys
            .with_label_values(&[store])
            .set(active_keys as i64);
        self.store.store_failures_vec.with_label_values(&[store]);
        for (reason, total) in evictions.by_reason() {
            let counter = self.store.evictions.with_label_values(&[reason]);
            let seen = counter.get();
            if total > seen {
                counter.inc_by(total - seen);
            }
        }
    }

    /// Called once a second with the memory store's new keys refused so far: logs
    /// when it starts refusing them, and when it has refused none for
    /// `REFUSALS_QUIET_LOOKS` looks. Whether or not /metrics is scraped.
    pub fn watch_refusals(&self, store: &str, active_keys: impl Fn() -> usize, refused: u64) {
        let seen = self.refusals_seen.swap(refused, Ordering::Relaxed);
        if refused > seen {
            self.quiet_looks.store(0, Ordering::Relaxed);
            if !self.refusing.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    store,
                    active_keys = active_keys(),
                    refused = refused - seen,
                    "store full (--max-keys) of counters in use: new keys answered by the failure mode"
                );
            }
        } else if self.refusing.load(Ordering::Relaxed)
            && self.quiet_looks.fetch_add(1, Ordering::Relaxed) + 1 >= REFUSALS_QUIET_LOOKS
        {
            self.refusing.store(false, Ordering::Relaxed);
            tracing::info!(
                store,
                active_keys = active_keys(),
                "store no longer refusing new keys"
            );
        }
    }

    /// Bans in force, set at scrape time.
    pub fn set_active_bans(&self, n: usize) {
        self.denials.active_bans.set(n as i64);
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
            self.store
                .store_errors
                .with_label_values(&[store, shard, kind.as_str()]);
        }
    }

    /// Only on failed calls, never per request: the label lookup is a hash of three
    /// borrowed strings, with no allocation once the series exists.
    fn store_error(&self, store: &str, shard: &str, kind: ErrorKind) {
        self.store
            .store_errors
            .with_label_values(&[store, shard, kind.as_str()])
            .inc();
    }

    /// Per request under an attack, so counted in stripes.
    fn denial_cache_answer(&self) {
        let (count, owned) = self.store.cache_answer_stripes.local();
        striped::add(count, owned, 1);
    }
    /// Once per recovery of a shard: read by the next failure-mode answer.
    fn shard_answered(&self, _store: &str, _shard: &str) {
        self.store_answered.store(true, Ordering::Relaxed);
    }
}
