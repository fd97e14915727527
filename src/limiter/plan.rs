//! Planning a request: each descriptor matched to its rule (or its `limit`
//! override, less the rules another `replaces`), and the hits its limited rules
//! make, placed on their shards, for one store call.

use std::sync::Arc;

use super::outcome::effective;
use super::{key, Descriptor, Limiter, OverrideCounter, Status};
use crate::algorithm::Micros;
use crate::policy::{Entry, FailureMode, Layer, Policy, Rule};
use crate::store::{Fallback, Hit, Mode, Store};

/// Indices into a request's statuses (the status of each hit, its order): inline
/// for the few descriptors a request carries, so planning allocates only the hits.
pub(super) type Statuses = smallvec::SmallVec<[usize; 8]>;

impl<S: Store> Limiter<S> {
    /// Matches each descriptor (its rule, its override, `replaces`) into `statuses`
    /// and builds the hits of its limited rules, edge first, then service, then
    /// tenant: the overrides' rules, the status of each hit (a status once per limit
    /// of its rule, its own limit first), the hits, and the domain's failure mode.
    pub(super) fn plan<E: Entry>(
        &self,
        policy: &Policy,
        dom: &crate::policy::Domain,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
        max_delay: Micros,
        statuses: &mut [Status],
    ) -> (Vec<Arc<Rule>>, Statuses, Vec<Hit>, FailureMode) {
        for (status, d) in statuses.iter_mut().zip(descriptors) {
            status.rule = dom.find(d.entries);
        }
        let mut overrides = Vec::new();
        for (status, d) in statuses.iter_mut().zip(descriptors) {
            let Some(limit) = d.limit else { continue };
            let layer = status
                .rule
                .map_or(Layer::default(), |r| policy.rule(r).layer);
            if let Some(rule) = self
                .overrides
                .rule(d.entries, layer, limit, &policy.defaults)
            {
                status.limit_override = Some(overrides.len());
                overrides.push(rule);
            }
        }
        drop_replaced(policy, statuses);

        // Limited rules become hits, edge first, then service, then tenant.
        let mut order: Statuses = (0..descriptors.len())
            .filter(|&i| {
                effective(policy, &overrides, &statuses[i]).is_some_and(|r| r.limit.is_some())
            })
            .collect();
        order.sort_by_key(|&i| effective(policy, &overrides, &statuses[i]).map(|r| r.layer));
        let mut hits = Vec::with_capacity(order.len());
        // The status of each hit: `order`, with a status repeated for each further
        // limit of its rule.
        let mut per_hit = Statuses::with_capacity(order.len());
        let places_keys = self.store.places_keys();
        let failure_mode = dom.failure_mode.unwrap_or(self.settings.failure_mode);
        let fallback = match failure_mode {
            FailureMode::Open => Fallback::Admit,
            FailureMode::Closed => Fallback::Deny,
            FailureMode::Local => Fallback::Local,
        };
        for &i in &order {
            let Some(rule) = effective(policy, &overrides, &statuses[i]) else {
                continue;
            };
            let Some(limit) = rule.limit_at(|| self.clock.now()) else {
                continue;
            };
            let mut key = String::with_capacity(64);
            let counter = match statuses[i].limit_override {
                Some(_) => statuses[i]
                    .rule
                    .map(|id| policy.rule(id))
                    .filter(|configured| {
                        self.settings.override_counter == OverrideCounter::Shared
                            && shares_counter(configured, rule)
                    }),
                None => Some(rule),
            };
            if let Some(counter) = counter {
                key::counter_key(
                    domain,
                    counter,
                    descriptors[i].entries,
                    &self.settings.hashing,
                    &mut key,
                );
            } else {
                key::override_key(
                    domain,
                    descriptors[i].entries,
                    rule.unit,
                    &self.settings.hashing,
                    &mut key,
                );
            }
            let placement = if places_keys {
                placement(dom.shard_by.as_deref(), descriptors[i].entries, &key)
            } else {
                0
            };
            let mode = if rule.shadow_mode {
                Mode::Shadow
            } else if rule.quota_mode {
                Mode::Quota
            } else {
                Mode::Enforce
            };
            hits.push(Hit {
                key,
                placement,
                limit,
                hits: descriptors[i].hits,
                mode,
                spend: descriptors[i].spend,
                fallback,
                max_delay,
            });
            per_hit.push(i);
            // The rule's other limits (`rate_limits`) follow its own, on its
            // placement and its key with the window added, so one store call (one
            // script per shard) decides them all.
            let own = hits.len() - 1;
            for &other in &rule.also {
                let other = policy.rule(other);
                let Some(other_limit) = other.limit_at(|| self.clock.now()) else {
                    continue;
                };
                let own = &hits[own];
                let mut other_key = String::with_capacity(own.key.len() + 24);
                other_key.push_str(&own.key);
                key::push_window(&mut other_key, other);
                let hit = Hit {
                    key: other_key,
                    limit: other_limit,
                    ..*own
                };
                hits.push(hit);
                per_hit.push(i);
            }
        }

        (overrides, per_hit, hits, failure_mode)
    }
}

/// Whether an override's `rule` may spend the `configured` rule's counter
/// (`--override-counter shared`): only where both count the same window the same
/// way, so one count means the same under either limit. A bucket's state is tokens
/// at a rate, and a shared level's values are its pattern, so neither is shared.
fn shares_counter(configured: &Rule, rule: &Rule) -> bool {
    use crate::algorithm::Algorithm::{FixedWindow, SlidingWindowCounter, SlidingWindowLog};
    let window = |r: &Rule| {
        r.limit
            .filter(|l| {
                matches!(
                    l.algorithm,
                    FixedWindow | SlidingWindowCounter | SlidingWindowLog
                )
            })
            .map(|l| (l.algorithm, l.window, l.phase))
    };
    let counted = window(configured);
    configured.calendar.is_none()
        && configured.shared.iter().all(Option::is_none)
        && counted.is_some()
        && counted == window(rule)
}

/// envoyproxy/ratelimit's `replaces`: a matched limit whose name another matched
/// limit replaces does not apply to this request. An override, unnamed and with no
/// `replaces` of its own there, neither replaces nor is replaced.
fn drop_replaced(policy: &Policy, statuses: &mut [Status]) {
    let configured = |s: &Status| s.rule.filter(|_| s.limit_override.is_none());
    let any_replaces = statuses
        .iter()
        .filter_map(configured)
        .any(|r| !policy.rule(r).replaces.is_empty());
    if !any_replaces {
        return;
    }
    let replaced: Vec<&str> = statuses
        .iter()
        .filter_map(configured)
        .flat_map(|r| policy.rule(r).replaces.iter().map(String::as_str))
        .collect();
    for status in statuses.iter_mut() {
        if let Some(r) = configured(status) {
            if let Some(name) = &policy.rule(r).name {
                if replaced.contains(&name.as_str()) {
                    status.rule = None;
                }
            }
        }
    }
}

/// The hash that places a counter: the `shard_by` entry's value when the descriptor
/// carries it, else the counter key itself.
fn placement<E: Entry>(shard_by: Option<&str>, entries: &[E], key: &str) -> u64 {
    if let Some(shard_key) = shard_by {
        if let Some(e) = entries.iter().find(|e| e.key() == shard_key) {
            return crate::hash::stable_hash(e.value().as_bytes());
        }
    }
    crate::hash::stable_hash(key.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::{compile, parse_str, Defaults, Unit};

    #[test]
    fn an_override_shares_only_a_window_counted_alike() {
        let policy = compile(
            parse_str(
                "f.yaml",
                "domain: d
descriptors:
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
  - key: shared
    value: a*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}
",
            )
            .unwrap(),
        )
        .unwrap();
        let rule = |key: &str, value: &str| {
            let d = policy.domain("d").unwrap();
            policy.rule(d.find(&[(key, value)]).unwrap())
        };
        let defaults = |algorithm| Defaults {
            algorithm,
            shadow_mode: false,
        };
        let plan = |n, unit, algorithm| {
            Rule::overriding("k".into(), Layer::default(), n, unit, &defaults(algorithm)).unwrap()
        };
        let fixed = Algorithm::FixedWindow;
        assert!(shares_counter(
            rule("fixed", "x"),
            &plan(5, Unit::Hour, fixed)
        ));
        assert!(!shares_counter(
            rule("fixed", "x"),
            &plan(5, Unit::Minute, fixed)
        ));
        let sliding = Algorithm::SlidingWindowCounter;
        assert!(!shares_counter(
            rule("fixed", "x"),
            &plan(5, Unit::Hour, sliding)
        ));
        let bucket = Algorithm::TokenBucket;
        assert!(!shares_counter(
            rule("bucket", "x"),
            &plan(5, Unit::Hour, bucket)
        ));
        assert!(!shares_counter(
            rule("shared", "ab"),
            &plan(5, Unit::Hour, fixed)
        ));
    }
}
