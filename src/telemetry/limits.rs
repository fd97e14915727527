//! The configured limits as series: `sluice_limit` (requests per window) and
//! `sluice_limit_window_seconds`, so a dashboard can draw usage against the limit.
//!
//! Two names rather than one with a `field` label: the two values are different
//! units, and a `sum()` or `max()` over one family must never add seconds to
//! requests. With equal label sets the rate is a plain division,
//! `sluice_limit / sluice_limit_window_seconds`, with no `ignoring(field)`.
//!
//! Labels are `domain`, `rule` (the matched path of keys, as in every other family),
//! `algorithm`, and `descriptor`: envoyproxy/ratelimit's name of the limit (each level
//! as `key_value`, or `key` alone, joined by `.`). `rule` alone does not name a limit:
//! `path=/login` and `path=/search` are both rule `path`, with different limits. All
//! of these come from the policy, never from requests. The further limits of a
//! `rate_limits` list have their window after the descriptor, as in their counter
//! keys (`api_key|~86400s`).
//!
//! Set at each policy swap ([`Limits::set`]); the series of rules no longer loaded
//! are removed, so a dashboard never shows a limit that is gone.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus::{GaugeVec, Registry};

use super::{gauge_vec, registered};

use crate::algorithm::SECOND;
use crate::limiter::key::push_window;
use crate::policy::Policy;

/// (domain, rule, algorithm, descriptor).
type Labels = [String; 4];

/// The two families and the label sets they hold now.
#[derive(Debug)]
pub struct Limits {
    requests: GaugeVec,
    window: GaugeVec,
    current: Mutex<HashSet<Labels>>,
}

const LABELS: [&str; 4] = ["domain", "rule", "algorithm", "descriptor"];

impl Limits {
    /// Both families, registered in `registry`.
    pub fn new(registry: &Registry) -> Limits {
        let gauge = |name: &str, help: &str| registered(registry, gauge_vec(name, help, &LABELS));
        Limits {
            requests: gauge(
                "sluice_limit",
                "Requests (hits) a configured limit admits per window, per key.",
            ),
            window: gauge(
                "sluice_limit_window_seconds",
                "The window of a configured limit, in seconds.",
            ),
            current: Mutex::new(HashSet::new()),
        }
    }

    /// Exports the limits of `policy` and removes the series of any other.
    pub fn set(&self, policy: &Policy) {
        let mut next = HashSet::new();
        for (domain, first) in policy.rules_by_domain() {
            // A `rate_limits` list's further limits are rules of their own, which no
            // tree reaches: each is exported too, its `descriptor` ending in its window
            // as its counter key does (`api_key|~86400s`), so that two limits of one
            // algorithm do not share a label set.
            for id in first.limit_ids() {
                let rule = policy.rule(id);
                let Some(limit) = rule.limit else { continue };
                let mut descriptor = rule.stat_key.clone();
                if id != first.id {
                    push_window(&mut descriptor, rule);
                }
                let labels: Labels = [
                    domain.to_string(),
                    rule.path.clone(),
                    limit.algorithm.as_str().to_string(),
                    descriptor,
                ];
                let refs = labels.each_ref().map(String::as_str);
                self.requests
                    .with_label_values(&refs)
                    .set(limit.requests as f64);
                self.window
                    .with_label_values(&refs)
                    .set(limit.window as f64 / SECOND as f64);
                next.insert(labels);
            }
        }
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        for gone in current.difference(&next) {
            let refs = gone.each_ref().map(String::as_str);
            let _ = self.requests.remove_label_values(&refs);
            let _ = self.window.remove_label_values(&refs);
        }
        *current = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::testkit::{policy, render};

    #[test]
    fn limits_are_exported_per_descriptor_and_removed_with_their_rule() {
        let registry = Registry::new();
        let limits = Limits::new(&registry);
        limits.set(&policy(
            r#"
domain: web
descriptors:
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: path
    value: /search
    rate_limit: {window: 10s, requests_per_unit: 100}
  - key: free
    rate_limit: {unlimited: true}
---
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 20, algorithm: token_bucket}
"#,
        ));
        let text = render(&registry);
        for line in [
            r#"sluice_limit{algorithm="fixed_window",descriptor="path_/login",domain="web",rule="path"} 5"#,
            r#"sluice_limit_window_seconds{algorithm="fixed_window",descriptor="path_/login",domain="web",rule="path"} 60"#,
            r#"sluice_limit{algorithm="sliding_window_counter",descriptor="path_/search",domain="web",rule="path"} 100"#,
            r#"sluice_limit_window_seconds{algorithm="sliding_window_counter",descriptor="path_/search",domain="web",rule="path"} 10"#,
            r#"sluice_limit{algorithm="token_bucket",descriptor="remote_address",domain="edge",rule="remote_address"} 20"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        // An unlimited rule has no limit to show.
        assert!(!text.contains("rule=\"free\""), "{text}");

        // The next policy drops /search and changes /login's algorithm: the old
        // series go, the new ones are there.
        limits.set(&policy(
            r#"
domain: web
descriptors:
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_log}
"#,
        ));
        let text = render(&registry);
        assert!(
            text.contains(r#"sluice_limit{algorithm="sliding_window_log",descriptor="path_/login",domain="web",rule="path"} 3"#),
            "{text}"
        );
        for gone in ["/search", "fixed_window", "edge"] {
            assert!(!text.contains(gone), "{gone} in\n{text}");
        }
    }

    /// Every limit of a `rate_limits` list is a series: "10 per second and 10,000
    /// per day" shows both, the further one named by its window, so that two limits
    /// of one algorithm are two series rather than one overwriting the other.
    #[test]
    fn every_limit_of_a_list_is_exported() {
        let registry = Registry::new();
        let limits = Limits::new(&registry);
        limits.set(&policy(
            r#"
domain: api
descriptors:
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: day, requests_per_unit: 10000}
      - {window: calendar_month, time_zone: Europe/Berlin, requests_per_unit: 1000000}
"#,
        ));
        let text = render(&registry);
        for line in [
            r#"sluice_limit{algorithm="sliding_window_counter",descriptor="api_key",domain="api",rule="api_key"} 10"#,
            r#"sluice_limit_window_seconds{algorithm="sliding_window_counter",descriptor="api_key",domain="api",rule="api_key"} 1"#,
            r#"sluice_limit{algorithm="sliding_window_counter",descriptor="api_key|~86400s",domain="api",rule="api_key"} 10000"#,
            r#"sluice_limit_window_seconds{algorithm="sliding_window_counter",descriptor="api_key|~86400s",domain="api",rule="api_key"} 86400"#,
            r#"sluice_limit{algorithm="fixed_window",descriptor="api_key|~calendar_month@Europe/Berlin",domain="api",rule="api_key"} 1000000"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        // A policy without the list drops its further limits' series with the rest.
        limits.set(&policy(
            "domain: api\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
        ));
        assert!(!render(&registry).contains("|~"), "{}", render(&registry));
    }
}
