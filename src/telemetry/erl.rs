//! envoyproxy/ratelimit's per-limit series, as Envoy Gateway's dashboards read them:
//! `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}`
//! with `domain`, `key1` and `key2` (served with `--prometheus-addr`).
//!
//! envoyproxy/ratelimit counts each limit under a statsd name
//! `ratelimit.service.rate_limit.DOMAIN.KEY_VALUE[.KEY_VALUE...].STAT`, and Envoy
//! Gateway's statsd-exporter mapping (`statsd_conf.yaml`) turns it into the series
//! above: `key1` and `key2` are the first two levels of the limit's descriptor path
//! as configured (`key_value`, or `key` for a level without a value), deeper levels
//! are not in the labels, and a limit of one level has no `key2` (here `key2=""`,
//! which PromQL does not tell from no label). The labels are therefore bounded by the
//! policy, never by request values (envoyproxy/ratelimit's `detailed_metric` and
//! overrides name request values; sluice counts those under the rule matched). Past
//! [`MAX_SERIES`] label sets, new ones are counted under `key1="other"`,
//! `key2="other"`. A policy change drops the label sets no limit of the new policy
//! has ([`ErlStats::policy_swapped`]), as sluice's own series of a removed rule go,
//! and a decision made on the policy before, recorded after the change, does not
//! bring them back: a label set is made only for a limit of the policy serving.
//!
//! Counts are in hits (`hits_addend`), as there: `total_hits` every hit decided;
//! `within_limit` the admitted ones; `over_limit` the denied ones (shadow limits
//! too); `shadow_mode` those a shadow limit would have denied; `near_limit` the
//! admitted hits past `--near-limit-ratio` of the limit.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use super::striped::{self, escape_label, Stripes};
use crate::limiter::Status;
use crate::policy::{Policy, Rule};

/// Most label sets kept apart.
pub const MAX_SERIES: usize = 4096;

/// The families, in the order of [`Counts`]' slots.
const FAMILIES: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];
const TOTAL: usize = 0;
const OVER: usize = 1;
const NEAR: usize = 2;
const WITHIN: usize = 3;
const SHADOW: usize = 4;

/// (domain, key1, key2).
type Labels = (String, String, String);

/// One label set's counts, striped.
#[derive(Debug, Default)]
pub struct Counts(Stripes<[AtomicU64; 5]>);

/// Slots of [`ErlStats`]' service-wide counters.
const GLOBAL_SHADOW: usize = 0;
const TOTAL_REQUESTS: usize = 1;
const REDIS_ERROR: usize = 2;
const SERVICE_ERROR: usize = 3;

/// Upper bounds of `ratelimit_service_response_time_seconds`' buckets in
/// nanoseconds: the statsd exporter's default buckets, which envoyproxy/ratelimit's
/// Prometheus sink and Envoy Gateway's mapping both use.
const RESPONSE_BOUNDS_NANOS: [u64; 11] = [
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// One stripe of the response-time histogram: a count per bucket (the last is
/// `+Inf`) and the sum in nanoseconds.
#[derive(Debug, Default)]
struct ResponseTimes {
    buckets: [AtomicU64; RESPONSE_BOUNDS_NANOS.len() + 1],
    sum_nanos: AtomicU64,
}

/// Why envoyproxy/ratelimit's `ShouldRateLimit` answered with an error, as its
/// `should_rate_limit_error{err_type}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// The counter store failed and the call was answered with an error
    /// (`--store-error-answer error`): `redis_error`.
    Store,
    /// The service refused the request (INVALID_ARGUMENT, or HTTP 400 to a `/json`
    /// body that parsed): `service_error`.
    BadRequest,
}

/// The label sets and their counts, and those the serving policy's limits have.
#[derive(Debug, Default)]
struct Series {
    counts: BTreeMap<Labels, Arc<Counts>>,
    /// `None` until a policy is swapped in ([`ErlStats::policy_swapped`]).
    serving: Option<HashSet<Labels>>,
}

/// Every label set's counts.
#[derive(Debug)]
pub struct ErlStats {
    near_limit_ratio: f64,
    series: Mutex<Series>,
    service: Stripes<[AtomicU64; 4]>,
    response_times: Stripes<ResponseTimes>,
}

impl ErlStats {
    pub fn new(near_limit_ratio: f64) -> ErlStats {
        ErlStats {
            near_limit_ratio,
            series: Mutex::default(),
            service: Stripes::default(),
            response_times: Stripes::default(),
        }
    }

    /// A request `--shadow-mode` alone answered OK.
    pub fn global_shadow(&self) {
        let (slots, owned) = self.service.local();
        striped::add(&slots[GLOBAL_SHADOW], owned, 1);
    }

    /// A gRPC `ShouldRateLimit` call answered (OK, OVER_LIMIT or an error) in
    /// `took`, from its decoded request to its answer.
    pub fn call(&self, took: std::time::Duration) {
        let (slots, owned) = self.service.local();
        striped::add(&slots[TOTAL_REQUESTS], owned, 1);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let i = RESPONSE_BOUNDS_NANOS.partition_point(|&b| b < nanos);
        let (slot, owned) = self.response_times.local();
        striped::add(&slot.buckets[i], owned, 1);
        striped::add(&slot.sum_nanos, owned, nanos);
    }

    /// A `ShouldRateLimit` call (gRPC or `POST /json`) answered with an error.
    pub fn error(&self, e: CallError) {
        let slot = match e {
            CallError::Store => REDIS_ERROR,
            CallError::BadRequest => SERVICE_ERROR,
        };
        let (slots, owned) = self.service.local();
        striped::add(&slots[slot], owned, 1);
    }

    /// The service-wide counter in `slot`, summed over the stripes.
    fn service_total(&self, slot: usize) -> u64 {
        self.service
            .iter()
            .map(|s| s[slot].load(std::sync::atomic::Ordering::Relaxed))
            .fold(0, u64::saturating_add)
    }

    /// The service-wide series: `global_shadow_mode`, `total_requests`,
    /// `should_rate_limit_error` and `response_time_seconds`, as envoyproxy/ratelimit's
    /// Prometheus sink (and Envoy Gateway's statsd mapping) name them.
    fn render_service(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP ratelimit_service_global_shadow_mode envoyproxy/ratelimit's global_shadow_mode: requests answered OK only because of --shadow-mode (SHADOW_MODE).\n\
             # TYPE ratelimit_service_global_shadow_mode counter\n\
             ratelimit_service_global_shadow_mode {}",
            self.service_total(GLOBAL_SHADOW)
        );
        let _ = writeln!(
            out,
            "# HELP ratelimit_service_total_requests envoyproxy/ratelimit's total_requests: gRPC calls by method.\n\
             # TYPE ratelimit_service_total_requests counter\n\
             ratelimit_service_total_requests{{grpc_method=\"ShouldRateLimit\"}} {}",
            self.service_total(TOTAL_REQUESTS)
        );
        let _ = writeln!(
            out,
            "# HELP ratelimit_service_should_rate_limit_error envoyproxy/ratelimit's should_rate_limit errors: calls answered with an error because the counter store failed (redis_error) or the request was refused (service_error).\n\
             # TYPE ratelimit_service_should_rate_limit_error counter\n\
             ratelimit_service_should_rate_limit_error{{err_type=\"redis_error\"}} {}\n\
             ratelimit_service_should_rate_limit_error{{err_type=\"service_error\"}} {}",
            self.service_total(REDIS_ERROR),
            self.service_total(SERVICE_ERROR)
        );
        let mut counts = [0u64; RESPONSE_BOUNDS_NANOS.len() + 1];
        let mut sum = 0u64;
        for slot in self.response_times.iter() {
            for (c, b) in counts.iter_mut().zip(&slot.buckets) {
                *c += b.load(std::sync::atomic::Ordering::Relaxed);
            }
            sum = sum.wrapping_add(slot.sum_nanos.load(std::sync::atomic::Ordering::Relaxed));
        }
        let name = "ratelimit_service_response_time_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} envoyproxy/ratelimit's response_time: gRPC calls' time from the decoded request to the answer, by method.\n# TYPE {name} histogram"
        );
        let mut running = 0;
        for (i, c) in counts.iter().enumerate() {
            running += c;
            let le = match RESPONSE_BOUNDS_NANOS.get(i) {
                Some(&b) => format!("{}", b as f64 / 1e9),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(
                out,
                "{name}_bucket{{grpc_method=\"ShouldRateLimit\",le=\"{le}\"}} {running}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_sum{{grpc_method=\"ShouldRateLimit\"}} {}\n{name}_count{{grpc_method=\"ShouldRateLimit\"}} {running}",
            sum as f64 / 1e9
        );
    }

    /// The counts of `rule` of `domain` (looked up once per rule and policy). A
    /// rule the serving policy no longer has (a decision made on the policy before
    /// it, recorded after the swap) gets counts of its own that no series shows:
    /// its label set, dropped by the swap, is not made again.
    pub fn counts(&self, domain: &str, rule: &Rule) -> Arc<Counts> {
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let mut key = labels(domain, &rule.stat_key);
        if series.serving.as_ref().is_some_and(|s| !s.contains(&key)) {
            return Arc::default();
        }
        if !series.counts.contains_key(&key) && series.counts.len() >= MAX_SERIES {
            key = (key.0, "other".into(), "other".into());
        }
        series.counts.entry(key).or_default().clone()
    }

    /// `policy` now serves: the label sets of limits it no longer has are dropped,
    /// those it keeps keep their counts (and a domain it keeps, its `other` set).
    pub fn policy_swapped(&self, policy: &Policy) {
        let wanted: HashSet<Labels> = policy
            .rules_by_domain()
            .into_iter()
            .flat_map(|(d, r)| {
                r.limit_ids()
                    .map(move |id| labels(d, &policy.rule(id).stat_key))
            })
            .collect();
        let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        series.counts.retain(|key, _| {
            wanted.contains(key)
                || (key.1 == "other" && key.2 == "other" && policy.domains.contains_key(&key.0))
        });
        series.serving = Some(wanted);
    }

    /// Counts one decided descriptor: `rule` decided `status`.
    pub fn record(&self, counts: &Counts, rule: &Rule, status: &Status) {
        let Some(limit) = rule.limit else { return };
        let (slots, owned) = counts.0.local();
        let hits = status.hits;
        striped::add(&slots[TOTAL], owned, hits);
        let Some(v) = status.verdict else { return };
        if v.admitted {
            striped::add(&slots[WITHIN], owned, hits);
            // Admitted hits past the near-limit threshold, as envoyproxy/ratelimit
            // counts them: the part of this request above it.
            let threshold = (limit.requests as f64 * self.near_limit_ratio).floor() as u64;
            let after = limit.requests.saturating_sub(v.remaining);
            let before = after.saturating_sub(hits);
            let near = after.saturating_sub(threshold.max(before));
            if near > 0 {
                striped::add(&slots[NEAR], owned, near);
            }
        } else {
            // A request that crosses the limit: envoyproxy/ratelimit counts only the
            // hits past it as over, and those below it, past the near-limit
            // threshold, as near.
            let before = limit.requests.saturating_sub(v.remaining);
            let after = before.saturating_add(hits);
            if before < limit.requests && after > limit.requests {
                let threshold = (limit.requests as f64 * self.near_limit_ratio).floor() as u64;
                striped::add(&slots[OVER], owned, after - limit.requests);
                let near = limit.requests.saturating_sub(threshold.max(before));
                if near > 0 {
                    striped::add(&slots[NEAR], owned, near);
                }
            } else {
                striped::add(&slots[OVER], owned, hits);
            }
            // Only a rule's own shadow_mode: under --shadow-mode alone the status
            // says OVER_LIMIT, and the request counts in `global_shadow_mode`.
            if rule.shadow_mode && !rule.global_shadow {
                striped::add(&slots[SHADOW], owned, hits);
            }
        }
    }

    /// Writes the five families and the service-wide counters in the text format.
    pub fn render(&self, out: &mut String) {
        self.render_service(out);
        let series = self.series.lock().unwrap_or_else(|p| p.into_inner());
        for (i, family) in FAMILIES.iter().enumerate() {
            let _ = writeln!(
                out,
                "# HELP ratelimit_service_rate_limit_{family} envoyproxy/ratelimit's {family}, in hits, by domain and first two descriptor levels.\n\
                 # TYPE ratelimit_service_rate_limit_{family} counter"
            );
            for ((domain, key1, key2), counts) in series.counts.iter() {
                let n: u64 = counts
                    .0
                    .iter()
                    .map(|s| s[i].load(std::sync::atomic::Ordering::Relaxed))
                    .fold(0, u64::saturating_add);
                let _ = write!(out, "ratelimit_service_rate_limit_{family}{{domain=\"");
                escape_label(domain, out);
                out.push_str("\",key1=\"");
                escape_label(key1, out);
                out.push_str("\",key2=\"");
                escape_label(key2, out);
                let _ = writeln!(out, "\"}} {n}");
            }
        }
    }
}

/// envoyproxy/ratelimit's `config_load_success` and `config_load_error`, as its
/// statsd names reach Prometheus through Envoy Gateway's exporter: policy loads,
/// the first one included, that were taken and that were refused (every source).
pub fn render_config_loads(out: &mut String, success: u64, error: u64) {
    for (name, n, what) in [
        ("success", success, "taken"),
        (
            "error",
            error,
            "refused (the last good policy kept serving)",
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP ratelimit_service_config_load_{name} envoyproxy/ratelimit's config_load_{name}: policy loads {what}.\n\
             # TYPE ratelimit_service_config_load_{name} counter\n\
             ratelimit_service_config_load_{name} {n}"
        );
    }
}

/// The labels Envoy Gateway's mapping gives the statsd name of a limit with
/// `stat_key` in `domain`: the name is sanitised as envoyproxy/ratelimit does
/// (`:` and `|` become `_`, so do the dots of IPv4 addresses) and split at dots.
pub fn labels(domain: &str, stat_key: &str) -> Labels {
    let name = sanitize(&format!("{domain}.{stat_key}"));
    let mut parts = name.split('.');
    let domain = parts.next().unwrap_or_default().to_string();
    let key1 = parts.next().unwrap_or_default().to_string();
    let key2 = parts.next().unwrap_or_default().to_string();
    (domain, key1, key2)
}

/// envoyproxy/ratelimit's `SanitizeStatName`.
fn sanitize(name: &str) -> String {
    let replaced = name.replace([':', '|'], "_");
    let bytes = replaced.as_bytes();
    let mut out = String::with_capacity(replaced.len());
    let mut i = 0;
    while i < bytes.len() {
        if let Some(len) = ipv4_at(bytes, i) {
            out.push_str(&replaced[i..i + len].replace('.', "_"));
            i += len;
        } else {
            let c = replaced[i..].chars().next().unwrap_or_default();
            out.push(c);
            i += c.len_utf8().max(1);
        }
    }
    out
}

/// The length of a dotted quad starting at `i`, as envoyproxy/ratelimit's regex
/// (`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`, leftmost) matches there; taking digits
/// greedily needs no backtracking, since fewer digits would leave a digit, not a dot.
fn ipv4_at(b: &[u8], i: usize) -> Option<usize> {
    let mut at = i;
    for part in 0..4 {
        if part > 0 {
            if b.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
        let digits = b[at..]
            .iter()
            .take(3)
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        at += digits;
    }
    Some(at - i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Verdict;
    use crate::limiter::Ban;

    #[test]
    fn labels_are_envoy_gateways_mapping_of_the_statsd_name() {
        let route = "httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example";
        let key = format!("{route}_{route}.rule-0-match-0_rule-0-match-0");
        assert_eq!(
            labels("default/eg/http", &key),
            (
                "default/eg/http".into(),
                format!("{route}_{route}"),
                "rule-0-match-0_rule-0-match-0".into()
            )
        );
        // A CIDR's dots are an address's; deeper levels are not labels.
        let (_, key1, key2) = labels(
            "d",
            "r_r.masked_remote_address_192.168.0.0/16.remote_address",
        );
        assert_eq!(
            (key1.as_str(), key2.as_str()),
            ("r_r", "masked_remote_address_192_168_0_0/16")
        );
        // One level: no key2.
        assert_eq!(labels("d", "k_v").2, "");
        assert_eq!(sanitize("a:b|c 10.0.0.1.5 1.2.3"), "a_b_c 10_0_0_1.5 1.2.3");
        assert_eq!(sanitize("1234.5.6.7"), "1234_5_6_7");
    }

    fn rule(requests: u64, shadow: bool) -> Rule {
        let docs = crate::policy::parse_str(
            "p.yaml",
            &format!(
                "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: {shadow}\n    rate_limit: {{unit: minute, requests_per_unit: {requests}}}\n"
            ),
        )
        .unwrap();
        crate::policy::compile(docs).unwrap().rules.remove(0)
    }

    fn status(admitted: bool, remaining: u64, hits: u64) -> Status {
        Status {
            rule: Some(0),
            limit_override: None,
            over_limit: !admitted,
            verdict: Some(Verdict {
                admitted,
                remaining,
                ..Verdict::default()
            }),
            hits,
            spend: crate::store::Spend::IfAdmitted,
            ban: Ban::None,
            shed: false,
            tightened: None,
            answered_by: None,
            spent_denied: false,
        }
    }

    fn totals(stats: &ErlStats) -> String {
        let mut out = String::new();
        stats.render(&mut out);
        out
    }

    #[test]
    fn hits_are_counted_as_envoyproxy_ratelimit_counts_them() {
        let stats = ErlStats::new(0.8);
        let r = rule(10, false);
        let c = stats.counts("d", &r);
        // 10 a minute, near from 8: 7 hits, 2 more to 9 (1 past 8), then a denial
        // of 3 that crosses the limit: 1 of its hits below it (near, past 8), 2
        // past it (over), as envoyproxy/ratelimit's checkOverLimitThreshold splits
        // them. Then a denial of 2 at the limit: both over.
        stats.record(&c, &r, &status(true, 3, 7));
        stats.record(&c, &r, &status(true, 1, 2));
        stats.record(&c, &r, &status(false, 1, 3));
        stats.record(&c, &r, &status(false, 0, 2));
        let text = totals(&stats);
        for (family, n) in [
            ("total_hits", 14),
            ("within_limit", 9),
            ("near_limit", 2),
            ("over_limit", 4),
            ("shadow_mode", 0),
        ] {
            let line = format!(
                "ratelimit_service_rate_limit_{family}{{domain=\"d\",key1=\"k\",key2=\"\"}} {n}"
            );
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        let shadow = rule(1, true);
        let s = ErlStats::new(0.8);
        let c = s.counts("d", &shadow);
        s.record(&c, &shadow, &status(false, 0, 2));
        let text = totals(&s);
        assert!(
            text.contains(
                "ratelimit_service_rate_limit_shadow_mode{domain=\"d\",key1=\"k\",key2=\"\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "ratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"k\",key2=\"\"} 2"
            ),
            "{text}"
        );
    }

    #[test]
    fn service_series_are_named_and_bucketed_as_envoyproxy_ratelimits_sink_serves_them() {
        use std::time::Duration;
        let stats = ErlStats::new(0.8);
        stats.call(Duration::from_micros(300));
        stats.call(Duration::from_millis(5));
        stats.call(Duration::from_millis(30));
        stats.call(Duration::from_secs(11));
        stats.error(CallError::Store);
        stats.error(CallError::BadRequest);
        stats.error(CallError::BadRequest);
        stats.global_shadow();
        let text = totals(&stats);
        let m = "grpc_method=\"ShouldRateLimit\"";
        for line in [
            "ratelimit_service_global_shadow_mode 1".to_string(),
            format!("ratelimit_service_total_requests{{{m}}} 4"),
            "ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"} 1".into(),
            "ratelimit_service_should_rate_limit_error{err_type=\"service_error\"} 2".into(),
            // A bound holds the calls that took exactly as long.
            format!("ratelimit_service_response_time_seconds_bucket{{{m},le=\"0.005\"}} 2"),
            format!("ratelimit_service_response_time_seconds_bucket{{{m},le=\"0.025\"}} 2"),
            format!("ratelimit_service_response_time_seconds_bucket{{{m},le=\"0.05\"}} 3"),
            format!("ratelimit_service_response_time_seconds_bucket{{{m},le=\"10\"}} 3"),
            format!("ratelimit_service_response_time_seconds_bucket{{{m},le=\"+Inf\"}} 4"),
            format!("ratelimit_service_response_time_seconds_sum{{{m}}} 11.0353"),
            format!("ratelimit_service_response_time_seconds_count{{{m}}} 4"),
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} in\n{text}");
        }
        for family in [
            "ratelimit_service_total_requests counter",
            "ratelimit_service_should_rate_limit_error counter",
            "ratelimit_service_response_time_seconds histogram",
        ] {
            assert!(text.contains(&format!("# TYPE {family}\n")), "{family}");
        }
    }

    #[test]
    fn totals_past_the_largest_number_show_the_largest_number() {
        let stats = ErlStats::new(0.8);
        let r = rule(10, false);
        let c = stats.counts("d", &r);
        // Two stripes near the top, as threads adding charges of 2^50 leave them.
        for stripe in c.0.iter().take(2) {
            stripe[TOTAL].store(u64::MAX - 1, std::sync::atomic::Ordering::Relaxed);
        }
        let text = totals(&stats);
        let line = format!(
            "ratelimit_service_rate_limit_total_hits{{domain=\"d\",key1=\"k\",key2=\"\"}} {}",
            u64::MAX
        );
        assert!(text.contains(&line), "{line} in\n{text}");
    }

    #[test]
    fn label_sets_are_capped_with_an_other_bucket() {
        let stats = ErlStats::new(0.8);
        let mut r = rule(1, false);
        for i in 0..(MAX_SERIES + 5) {
            r.stat_key = format!("k_{i}");
            stats.counts("d", &r);
        }
        let series = stats.series.lock().unwrap();
        assert_eq!(series.counts.len(), MAX_SERIES + 1);
        assert!(series.counts.contains_key(&(
            "d".to_string(),
            "other".to_string(),
            "other".to_string()
        )));
    }

    #[test]
    fn a_policy_change_drops_the_label_sets_of_limits_it_no_longer_has() {
        use crate::telemetry::testkit::policy;
        let both = policy(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        );
        let stats = ErlStats::new(0.8);
        stats.policy_swapped(&both);
        for (id, hits) in [(0, 3), (1, 2)] {
            let r = both.rule(id);
            let counts = stats.counts("d", r);
            stats.record(&counts, r, &status(true, 1, hits));
        }
        let text = totals(&stats);
        assert!(
            text.contains(
                r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="tenant",key2=""} 2"#
            ),
            "{text}"
        );
        stats.policy_swapped(&policy(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        ));
        let text = totals(&stats);
        assert!(!text.contains("tenant"), "{text}");
        assert!(
            text.contains(
                r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="k",key2=""} 3"#
            ),
            "the limit that stays keeps its count: {text}"
        );
    }
}
