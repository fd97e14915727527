//! A descriptor's `limit` override (Envoy's `RateLimitOverride`, which Envoy Gateway
//! fills from request metadata for per-tenant limits): it replaces the matched limit
//! of that descriptor.
//!
//! As in envoyproxy/ratelimit, an override applies in a known domain whether or not a
//! rule matches the descriptor, and its counter is keyed by the domain, every entry
//! and the unit ([`super::key::override_key`]): requests that send different
//! `requests_per_unit` in one unit share one count (a tenant moved to a larger plan
//! keeps what it spent this window), apart from the configured limit's counter;
//! with `--override-counter shared`, an override that counts the matched rule's
//! window the same way spends the rule's counter instead, as envoyproxy/ratelimit
//! keys both alike.
//!
//! The rule an override stands for is built once per shape (keys, layer, limit,
//! defaults) and kept in a small copy-on-write table read without a lock, so its
//! answer parts are not rendered again on every request. Overrides come in few
//! shapes (routes times plans); past [`MAX_SHAPES`] a new shape is built per request.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use arc_swap::ArcSwap;
use hashbrown::HashTable;

use crate::policy::{Defaults, Entry, Layer, Rule, Unit};

/// Most override shapes kept.
pub const MAX_SHAPES: usize = 1024;

/// `requests_per_unit` per `unit`, in place of the matched limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Override {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

#[derive(Debug, Clone)]
struct Shape {
    hash: u64,
    keys: Box<[Box<str>]>,
    rule: Arc<Rule>,
}

/// The rules of the override shapes seen so far.
#[derive(Debug, Default)]
pub struct OverrideRules {
    table: ArcSwap<HashTable<Shape>>,
    hasher: ahash::RandomState,
}

impl OverrideRules {
    /// The rule for `limit` on a descriptor with `entries` whose matched rule (if
    /// any) is of `layer`; `None` for a unit of no fixed length.
    pub fn rule<E: Entry>(
        &self,
        entries: &[E],
        layer: Layer,
        limit: Override,
        defaults: &Defaults,
    ) -> Option<Arc<Rule>> {
        let mut h = self.hasher.build_hasher();
        (layer, limit.requests_per_unit, limit.unit, defaults).hash(&mut h);
        for e in entries {
            e.key().hash(&mut h);
        }
        let hash = h.finish();
        let same = |s: &Shape| {
            let r = &s.rule;
            r.requests_per_unit == limit.requests_per_unit
                && r.unit == limit.unit
                && r.layer == layer
                && r.shadow_mode == defaults.shadow_mode
                && r.limit.is_some_and(|l| l.algorithm == defaults.algorithm)
                && s.keys.len() == entries.len()
                && s.keys.iter().zip(entries).all(|(k, e)| &**k == e.key())
        };
        if let Some(shape) = self.table.load().find(hash, same) {
            return Some(shape.rule.clone());
        }
        let path = entries
            .iter()
            .map(|e| e.key())
            .collect::<Vec<_>>()
            .join("/");
        let rule = Arc::new(Rule::overriding(
            path,
            layer,
            limit.requests_per_unit,
            limit.unit,
            defaults,
        )?);
        let shape = Shape {
            hash,
            keys: entries.iter().map(|e| e.key().into()).collect(),
            rule: rule.clone(),
        };
        self.table.rcu(|table| {
            if table.len() >= MAX_SHAPES || table.find(hash, same).is_some() {
                return Arc::clone(table);
            }
            let mut next = HashTable::clone(table);
            next.insert_unique(hash, shape.clone(), |s| s.hash);
            Arc::new(next)
        });
        Some(rule)
    }

    /// Shapes kept.
    pub fn len(&self) -> usize {
        self.table.load().len()
    }

    /// Whether no shape is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, SECOND};
    use crate::clock::ManualClock;
    use crate::limiter::{Descriptor, Limiter, Outcome, Settings};
    use crate::store::MemoryStore;

    const POLICY: &str = r#"
domain: d
descriptors:
  - key: route
    value: r
    descriptors:
      - key: tenant
        rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
  - key: plan
    rate_limit: {name: basic, unit: minute, requests_per_unit: 1}
  - key: upgrade
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: basic}]}
"#;

    fn limiter() -> Limiter<MemoryStore> {
        let clock = ManualClock::new(1_700_000_000 * SECOND);
        crate::limiter::test_limiter(POLICY, &clock, Settings::default())
    }

    async fn ask(
        l: &Limiter<MemoryStore>,
        domain: &str,
        entries: &[(&str, &str)],
        limit: Option<Override>,
    ) -> Outcome {
        let d = Descriptor {
            entries,
            hits: 1,
            spend: crate::store::Spend::IfAdmitted,
            limit,
        };
        l.decide(domain, &[d]).await
    }

    fn per_minute(requests_per_unit: u32) -> Option<Override> {
        Some(Override {
            requests_per_unit,
            unit: Unit::Minute,
        })
    }

    const T1: [(&str, &str); 2] = [("route", "r"), ("tenant", "t1")];

    #[tokio::test]
    async fn an_override_replaces_the_matched_limit_with_a_counter_of_its_own() {
        let l = limiter();
        for left in (0..5).rev() {
            let o = ask(&l, "d", &T1, per_minute(5)).await;
            assert!(!o.over_limit);
            let rule = o.rule(&o.statuses[0]).unwrap();
            assert_eq!((rule.requests_per_unit, rule.unit), (5, Unit::Minute));
            assert_eq!(o.statuses[0].verdict.unwrap().remaining, left);
            // Counted under the rule it replaced.
            assert_eq!(
                o.policy.rule(o.statuses[0].rule.unwrap()).path,
                "route/tenant"
            );
        }
        assert!(ask(&l, "d", &T1, per_minute(5)).await.over_limit);
        // The configured limit (2 a minute) kept its own count.
        let o = ask(&l, "d", &T1, None).await;
        assert!(!o.over_limit);
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 1);
    }

    #[tokio::test]
    async fn one_unit_one_count_whatever_the_requests_per_unit() {
        let l = limiter();
        for _ in 0..3 {
            assert!(!ask(&l, "d", &T1, per_minute(5)).await.over_limit);
        }
        // A larger plan in the same unit keeps what was spent.
        let o = ask(&l, "d", &T1, per_minute(10)).await;
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 6);
        // Another unit counts apart.
        let per_hour = Some(Override {
            requests_per_unit: 5,
            unit: Unit::Hour,
        });
        let o = ask(&l, "d", &T1, per_hour).await;
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 4);
        // Another tenant counts apart.
        let o = ask(&l, "d", &[("route", "r"), ("tenant", "t2")], per_minute(5)).await;
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 4);
    }

    #[tokio::test]
    async fn an_override_needs_a_known_domain_but_no_matching_rule() {
        let l = limiter();
        let o = ask(&l, "d", &[("nothing", "x")], per_minute(1)).await;
        assert!(!o.over_limit);
        assert_eq!(o.statuses[0].rule, None);
        assert_eq!(o.rule(&o.statuses[0]).unwrap().path, "nothing");
        assert!(
            ask(&l, "d", &[("nothing", "x")], per_minute(1))
                .await
                .over_limit
        );
        let o = ask(&l, "elsewhere", &[("nothing", "x")], per_minute(0)).await;
        assert!(!o.over_limit && !o.domain_known);
        assert!(o.rule(&o.statuses[0]).is_none());
    }

    #[tokio::test]
    async fn an_override_neither_replaces_nor_is_replaced() {
        let l = limiter();
        // `upgrade` replaces `basic` when both match; overridden, it replaces nothing.
        let basic = Descriptor::new(&[("plan", "p")][..], 1);
        let upgrade = [("upgrade", "u")];
        let overridden = Descriptor {
            spend: crate::store::Spend::IfAdmitted,
            entries: &upgrade[..],
            hits: 1,
            limit: per_minute(10),
        };
        let o = l.decide("d", &[basic, overridden]).await;
        assert!(o.statuses[0].verdict.is_some(), "basic still applies");
        assert!(!o.over_limit);
        assert!(
            l.decide("d", &[basic, overridden]).await.over_limit,
            "basic allows 1"
        );
        // An overridden `basic` is not dropped by `upgrade`.
        let plan = [("plan", "q")];
        let basic_overridden = Descriptor {
            spend: crate::store::Spend::IfAdmitted,
            entries: &plan[..],
            hits: 1,
            limit: per_minute(3),
        };
        let plain_upgrade = Descriptor::new(&upgrade[..], 1);
        let o = l.decide("d", &[plain_upgrade, basic_overridden]).await;
        assert_eq!(o.rule(&o.statuses[1]).unwrap().requests_per_unit, 3);
        assert_eq!(o.statuses[1].verdict.unwrap().remaining, 2);
    }

    const FIXED: Defaults = Defaults {
        algorithm: Algorithm::FixedWindow,
        shadow_mode: false,
    };
    const BUCKET: Defaults = Defaults {
        algorithm: Algorithm::TokenBucket,
        shadow_mode: false,
    };

    const PER_MINUTE: Override = Override {
        requests_per_unit: 5,
        unit: Unit::Minute,
    };

    #[test]
    fn one_rule_per_shape_is_built_and_reused() {
        let rules = OverrideRules::default();
        let a = rules
            .rule(
                &[("route", "r"), ("tenant", "t1")],
                Layer::Service,
                PER_MINUTE,
                &FIXED,
            )
            .unwrap();
        assert_eq!(a.path, "route/tenant");
        assert_eq!(a.limit.unwrap().requests, 5);
        assert_eq!(a.limit.unwrap().window, 60 * crate::algorithm::SECOND);
        assert!(!a.rendered.current_limit.is_empty());
        // Another tenant, same shape: the same rule.
        let b = rules
            .rule(
                &[("route", "r"), ("tenant", "t2")],
                Layer::Service,
                PER_MINUTE,
                &FIXED,
            )
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(rules.len(), 1);
        // Any difference in limit, keys, layer or algorithm is another shape.
        let other = Override {
            requests_per_unit: 6,
            ..PER_MINUTE
        };
        for r in [
            rules.rule(
                &[("route", "r"), ("tenant", "t")],
                Layer::Service,
                other,
                &FIXED,
            ),
            rules.rule(
                &[("route", "r"), ("user", "t")],
                Layer::Service,
                PER_MINUTE,
                &FIXED,
            ),
            rules.rule(
                &[("route", "r"), ("tenant", "t")],
                Layer::Tenant,
                PER_MINUTE,
                &FIXED,
            ),
            rules.rule(
                &[("route", "r"), ("tenant", "t")],
                Layer::Service,
                PER_MINUTE,
                &BUCKET,
            ),
        ] {
            assert!(!Arc::ptr_eq(&a, &r.unwrap()));
        }
        assert_eq!(rules.len(), 5);
    }

    #[test]
    fn the_table_stays_bounded() {
        let rules = OverrideRules::default();
        for rpu in 0..(MAX_SHAPES as u32 + 10) {
            let limit = Override {
                requests_per_unit: rpu,
                unit: Unit::Second,
            };
            let r = rules.rule(&[("k", "v")], Layer::Service, limit, &FIXED);
            assert_eq!(r.unwrap().requests_per_unit, rpu);
        }
        assert_eq!(rules.len(), MAX_SHAPES);
    }

    #[test]
    fn a_unit_of_no_length_has_no_rule() {
        let limit = Override {
            requests_per_unit: 1,
            unit: Unit::Unknown,
        };
        let rules = OverrideRules::default();
        assert!(rules
            .rule(&[("k", "v")], Layer::Service, limit, &FIXED)
            .is_none());
    }
}
