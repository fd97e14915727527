//! The Rate Limit Quota Service's series: streams open, buckets tracked, usage
//! reports received and assignments sent, by kind.
//!
//! Labels are bounded as everywhere else: `domain` is a domain the policy defines
//! (empty for any other a stream names) and `rule` the matched path of keys (empty
//! when no rule governs the bucket), never a bucket's values. Recorded once per
//! report and per bucket in it, every few seconds per Envoy and never per request,
//! so the labelled lookups here cost nothing that matters.
//!
//! A policy change drops the series of the domains and rules it no longer has
//! ([`QuotaStats::policy_swapped`]), as the per-rule series of `ShouldRateLimit`
//! decisions go with their rule.

use std::collections::HashSet;

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Registry};

use crate::policy::Policy;

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

    /// `policy` now serves: the series of domains it does not define, and of rules
    /// it does not have, are dropped (a dashboard shows no assignments of a rule
    /// that is gone). Those of domain "" and rule "" (no policy's domain, no rule)
    /// stay.
    pub fn policy_swapped(&self, policy: &Policy) {
        let domains: HashSet<&str> = policy.domains.keys().map(String::as_str).collect();
        let rules: HashSet<(&str, &str)> = policy
            .rules_by_domain()
            .into_iter()
            .flat_map(|(d, r)| {
                std::iter::once(r.id)
                    .chain(r.also.iter().copied())
                    .map(move |id| (d, policy.rule(id).path.as_str()))
            })
            .collect();
        let kept = |labels: &[&str]| match labels {
            [domain, rule, ..] => {
                domain.is_empty()
                    || (domains.contains(domain)
                        && (rule.is_empty() || rules.contains(&(*domain, *rule))))
            }
            [domain] => domain.is_empty() || domains.contains(domain),
            [] => true,
        };
        prune(&self.reports, &["domain"], &kept);
        prune(&self.assignments, &["domain", "rule", "kind"], &|l| {
            kept(&l[..2])
        });
        prune(&self.irregular, &["domain", "reason"], &|l| kept(&l[..1]));
    }
}

/// Removes the series of `family` whose values of `labels` (in that order, the
/// family's own) `kept` refuses.
fn prune(family: &IntCounterVec, labels: &[&str], kept: &dyn Fn(&[&str]) -> bool) {
    for mf in family.collect() {
        for metric in mf.get_metric() {
            let values: Vec<&str> = labels
                .iter()
                .map(|name| {
                    metric
                        .get_label()
                        .iter()
                        .find(|l| l.name() == *name)
                        .map_or("", |l| l.value())
                })
                .collect();
            if !kept(&values) {
                let _ = family.remove_label_values(&values);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::testkit::{policy, render};

    #[test]
    fn a_policy_change_drops_the_series_of_rules_and_domains_it_no_longer_has() {
        let registry = Registry::new();
        let stats = QuotaStats::new(&registry);
        let both = "domain: web\ndescriptors:\n  - key: route\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 5}\n---\ndomain: old\ndescriptors:\n  - key: route\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
        stats.policy_swapped(&policy(both));
        for (domain, rule) in [
            ("web", "route"),
            ("web", "tenant"),
            ("web", ""),
            ("old", "route"),
            ("", ""),
        ] {
            stats.report(domain);
            stats.assignment(domain, rule, AssignmentKind::TokenBucket);
            stats.irregular(domain, "no_entries");
        }
        let text = render(&registry);
        assert!(
            text.contains(r#"rule="tenant""#) && text.contains(r#"domain="old""#),
            "{text}"
        );

        stats.policy_swapped(&policy(
            "domain: web\ndescriptors:\n  - key: route\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        ));
        let text = render(&registry);
        assert!(!text.contains(r#"rule="tenant""#), "{text}");
        assert!(!text.contains(r#"domain="old""#), "{text}");
        for kept in [
            r#"sluice_rlqs_assignments_total{domain="web",kind="token_bucket",rule="route"} 1"#,
            r#"sluice_rlqs_assignments_total{domain="web",kind="token_bucket",rule=""} 1"#,
            r#"sluice_rlqs_assignments_total{domain="",kind="token_bucket",rule=""} 1"#,
            r#"sluice_rlqs_reports_total{domain="web"} 3"#,
            r#"sluice_rlqs_reports_total{domain=""} 1"#,
            r#"sluice_rlqs_irregular_buckets_total{domain="web",reason="no_entries"} 3"#,
        ] {
            assert!(text.contains(kept), "{kept} in\n{text}");
        }
    }
}
