//! Which rule governs a quota bucket. A `BucketId` is a map of strings; it is matched
//! against its domain's descriptors as one descriptor whose entries are the map's
//! pairs, in whatever order the descriptor tree asks for them (see
//! [`Domain::find_unordered`](crate::policy::Domain::find_unordered)): the
//! same policy written for ShouldRateLimit governs RLQS buckets, and the order of
//! Envoy's `bucket_id_builder` entries does not matter.

use crate::algorithm::Limit;
use crate::limiter::key::{counter_key, offender, Hashing};
use crate::policy::{Policy, Rule};

/// How the policy treats a bucket.
#[derive(Debug, Clone, PartialEq)]
pub enum Governed<'p> {
    /// No limit applies: the domain is unknown or no rule matches (`None`), or the
    /// rule is `unlimited`, in `shadow_mode` (which never denies), or `algorithm:
    /// concurrency` (requests in flight, which RLQS cannot count).
    Free(Option<&'p Rule>),
    /// `rule`'s `limit` applies, and the other limits of its `rate_limits` list
    /// after it (`limits`, never empty); `key` names the bucket's counter (and its
    /// demand records): the rule's counter key for the matched entries.
    Limited {
        rule: &'p Rule,
        limits: Vec<Limit>,
        key: String,
        /// The bucket's values as the top-offenders view and bans show them.
        shown: String,
    },
}

/// The rule for `entries` (a bucket's pairs, sorted by key) in `domain`.
pub fn govern<'p>(
    policy: &'p Policy,
    domain: &str,
    entries: &[(String, String)],
    hashing: &Hashing,
) -> Governed<'p> {
    let Some(dom) = policy.domain(domain) else {
        return Governed::Free(None);
    };
    let mut order = Vec::with_capacity(entries.len());
    let Some(id) = dom.find_unordered(entries, &mut order) else {
        return Governed::Free(None);
    };
    let rule = policy.rule(id);
    // A concurrency rule counts requests in flight: Envoy reports no request's end,
    // and its slots as a rate (so many per lease) would be another limit entirely.
    let Some(limit) = rule
        .limit
        .filter(|_| !rule.shadow_mode && rule.lease.is_none())
    else {
        return Governed::Free(Some(rule));
    };
    let mut limits = Vec::with_capacity(1 + rule.also.len());
    limits.push(limit);
    limits.extend(
        rule.also
            .iter()
            .map(|&other| policy.rule(other))
            .filter(|other| !other.shadow_mode)
            .filter_map(|other| other.limit),
    );
    let ordered: Vec<(&str, &str)> = order
        .iter()
        .map(|&i| (entries[i].0.as_str(), entries[i].1.as_str()))
        .collect();
    let mut key = String::with_capacity(64);
    counter_key(domain, rule, &ordered, hashing, &mut key);
    let mut shown = String::new();
    offender(rule, &ordered, hashing, &mut shown);
    Governed::Limited {
        rule,
        limits,
        key,
        shown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Policy {
        crate::policy::compile(crate::policy::parse_str("p.yaml", text).unwrap()).unwrap()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = p
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_bucket_takes_the_rule_and_counter_key_of_the_same_descriptor() {
        let p = policy(
            "domain: edge\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: path\n        rate_limit: {unit: second, requests_per_unit: 20}\n  - key: free\n    rate_limit: {unlimited: true}\n  - key: watch\n    rate_limit: {unit: second, requests_per_unit: 1}\n    shadow_mode: true\n",
        );
        let h = Hashing::default();
        let Governed::Limited {
            rule,
            limits,
            key,
            shown,
        } = govern(
            &p,
            "edge",
            &pairs(&[("path", "/a"), ("tenant", "acme")]),
            &h,
        )
        else {
            panic!("limited")
        };
        assert_eq!(rule.path, "tenant/path");
        assert_eq!(limits.len(), 1);
        assert_eq!(limits[0].requests, 20);
        assert_eq!(key, "edge|tenant=acme|path=/a");
        assert_eq!(shown, "acme|/a");
        let free = |pairs_: &[(&str, &str)]| match govern(&p, "edge", &pairs(pairs_), &h) {
            Governed::Free(rule) => rule.map(|r| r.path.clone()),
            other => panic!("free: {other:?}"),
        };
        assert_eq!(free(&[("free", "x")]).as_deref(), Some("free"));
        assert_eq!(free(&[("watch", "x")]).as_deref(), Some("watch"));
        assert_eq!(free(&[("other", "x")]), None);
        assert_eq!(
            govern(&p, "nowhere", &pairs(&[("tenant", "a")]), &h),
            Governed::Free(None)
        );
    }
}
