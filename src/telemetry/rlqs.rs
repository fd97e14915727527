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
//! decisions go with their rule, and a report decided on the policy before, answered
//! after the change (it waited for the store meanwhile), does not bring them back:
//! each count is taken under a read lock the swap takes to write, against the
//! serving policy's domains and rules (one uncontended read lock per report and per
//! bucket answered, never per `ShouldRateLimit` call).

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

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
    /// The serving policy's rule paths by domain; `None` until a policy is swapped
    /// in, when every series may be counted.
    serving: RwLock<Option<HashMap<String, HashSet<String>>>>,
}

/// Whether the series of `domain` and `rule` ("" for none) belong to the serving
/// policy: those of domain "" always do, and those of rule "" in a domain it has.
fn serves(serving: &Option<HashMap<String, HashSet<String>>>, domain: &str, rule: &str) -> bool {
    domain.is_empty()
        || serving.as_ref().is_none_or(|s| {
            s.get(domain)
                .is_some_and(|rules| rule.is_empty() || rules.contains(rule))
        })
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
                    "Usage reports refused as larger than a stream takes, or as arriving in pieces while --grpc-max-buffered-request-bytes are held (RESOURCE_EXHAUSTED: the stream ends).",
                ),
            ),
            irregular: counter(
                "sluice_rlqs_irregular_buckets_total",
                "Buckets of usage reports answered apart from the rest of their report, by reason: id_too_large (over 4096 bytes: decided against its limit, tracked under a digest), too_many_entries or empty_key (no rule can match: ALLOW_ALL), no_entries (left out of the answer: Envoy takes no assignment without an id).",
                &["domain", "reason"],
            ),
            serving: RwLock::new(None),
        }
    }

    /// Read by each count (shared), written by a swap.
    fn serving(&self) -> std::sync::RwLockReadGuard<'_, Option<HashMap<String, HashSet<String>>>> {
        self.serving.read().unwrap_or_else(|p| p.into_inner())
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
        let serving = self.serving();
        if serves(&serving, domain, "") {
            self.reports.with_label_values(&[domain]).inc();
        }
    }

    /// One report refused for its size.
    pub fn oversized(&self) {
        self.oversized.inc();
    }

    /// One bucket of a report for `domain` answered apart, for `reason`.
    pub fn irregular(&self, domain: &str, reason: &str) {
        let serving = self.serving();
        if serves(&serving, domain, "") {
            self.irregular.with_label_values(&[domain, reason]).inc();
        }
    }

    /// One bucket's action, under `domain` and `rule` ("" when none governs it).
    pub fn assignment(&self, domain: &str, rule: &str, kind: AssignmentKind) {
        let serving = self.serving();
        if serves(&serving, domain, rule) {
            self.assignments
                .with_label_values(&[domain, rule, kind.as_str()])
                .inc();
        }
    }

    /// `policy` now serves: the series of domains it does not define, and of rules
    /// it does not have, are dropped (a dashboard shows no assignments of a rule
    /// that is gone). Those of domain "" and rule "" (no policy's domain, no rule)
    /// stay.
    pub fn policy_swapped(&self, policy: &Policy) {
        let mut rules: HashMap<String, HashSet<String>> = policy
            .domains
            .keys()
            .map(|d| (d.clone(), HashSet::new()))
            .collect();
        for (d, r) in policy.rules_by_domain() {
            let paths = rules.entry(d.to_string()).or_default();
            for id in r.limit_ids() {
                paths.insert(policy.rule(id).path.clone());
            }
        }
        let mut serving = self.serving.write().unwrap_or_else(|p| p.into_inner());
        let now = Some(rules);
        let kept = |labels: &[&str]| match labels {
            [domain, rule, ..] => serves(&now, domain, rule),
            [domain] => serves(&now, domain, ""),
            [] => true,
        };
        prune(&self.reports, &["domain"], &kept);
        prune(&self.assignments, &["domain", "rule", "kind"], &|l| {
            kept(&l[..2])
        });
        prune(&self.irregular, &["domain", "reason"], &|l| kept(&l[..1]));
        *serving = now;
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

    /// A report decided on the policy a reload then replaced, answered after the
    /// reload (it waited for the store across it), does not bring back the series of
    /// the rules and domains the new policy removed.
    #[test]
    fn a_report_answered_across_a_reload_does_not_bring_back_a_removed_rule() {
        let registry = Registry::new();
        let stats = QuotaStats::new(&registry);
        stats.policy_swapped(&policy(
            "domain: web\ndescriptors:\n  - key: route\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 5}\n---\ndomain: old\ndescriptors:\n  - key: route\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        ));
        stats.policy_swapped(&policy(
            "domain: web\ndescriptors:\n  - key: route\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
        ));
        // What the reports decided on the old policy record now.
        stats.assignment("web", "tenant", AssignmentKind::TokenBucket);
        stats.assignment("old", "route", AssignmentKind::TokenBucket);
        stats.report("old");
        stats.irregular("old", "no_entries");
        let text = render(&registry);
        assert!(!text.contains(r#"rule="tenant""#), "{text}");
        assert!(!text.contains(r#"domain="old""#), "{text}");
        // The rules and domains the policy keeps, and those of none, still count.
        stats.assignment("web", "route", AssignmentKind::AllowAll);
        stats.assignment("web", "", AssignmentKind::AllowAll);
        stats.assignment("", "", AssignmentKind::AllowAll);
        stats.report("web");
        stats.irregular("", "empty_key");
        let text = render(&registry);
        for kept in [
            r#"sluice_rlqs_assignments_total{domain="web",kind="allow_all",rule="route"} 1"#,
            r#"sluice_rlqs_assignments_total{domain="web",kind="allow_all",rule=""} 1"#,
            r#"sluice_rlqs_assignments_total{domain="",kind="allow_all",rule=""} 1"#,
            r#"sluice_rlqs_reports_total{domain="web"} 1"#,
            r#"sluice_rlqs_irregular_buckets_total{domain="",reason="empty_key"} 1"#,
        ] {
            assert!(text.contains(kept), "{kept} in\n{text}");
        }
    }

    /// A scrape's HELP names both refusals the counter counts, as the docs do: an
    /// operator seeing it rise with small reports needs the buffered-bytes bound.
    #[test]
    fn the_oversized_reports_help_names_both_reasons() {
        let registry = Registry::new();
        QuotaStats::new(&registry);
        let text = render(&registry);
        let help = text
            .lines()
            .find(|l| l.starts_with("# HELP sluice_rlqs_oversized_reports_total "))
            .expect("the counter's help");
        assert!(help.contains("larger than a stream takes"), "{help}");
        assert!(help.contains("--grpc-max-buffered-request-bytes"), "{help}");
    }
}
