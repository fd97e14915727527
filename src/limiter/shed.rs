//! Soft shedding (`shed: {from: 0.9}`): a request the store admitted, that brings a
//! counter past `from` of its limit, is denied with a probability rising linearly
//! from 0 there to 1 at the limit, so clients meet a slope before the wall.
//!
//! The store decides first (check and consume in one step), so a shed request has
//! spent its hits: shedding brings the hard limit nearer, never past it. Only
//! enforced limits shed; shadow and quota limits never do. The draw is taken only
//! past `from`, so a request below it costs one comparison.

use std::sync::Mutex;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::outcome::effective;
use super::{Limiter, Outcome};
use crate::algorithm::{Algorithm, Micros, Verdict};
use crate::policy::Rule;
use crate::store::{Hit, Mode, Store};

/// A source of uniform draws in `[0, 1)`; injected so tests fix the seed.
pub trait Chance: Send + Sync + std::fmt::Debug {
    fn draw(&self) -> f64;
}

/// Each thread's own generator: no lock, no shared state.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadChance;

impl Chance for ThreadChance {
    fn draw(&self) -> f64 {
        rand::rng().random::<f64>()
    }
}

/// One seeded generator behind a lock; for tests.
#[derive(Debug)]
pub struct SeededChance(Mutex<SmallRng>);

impl SeededChance {
    pub fn new(seed: u64) -> Self {
        SeededChance(Mutex::new(SmallRng::seed_from_u64(seed)))
    }
}

impl Chance for SeededChance {
    fn draw(&self) -> f64 {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .random::<f64>()
    }
}

/// Whether `rule` sheds the request it admitted with `verdict`; if so, `verdict`
/// becomes a denial whose `retry_after` is the time for the counter to drain back to
/// `from` (the window's end for fixed windows).
pub fn decide(rule: &Rule, verdict: &mut Verdict, chance: &dyn Chance) -> bool {
    let (Some(shed), Some(limit)) = (rule.shed, rule.limit) else {
        return false;
    };
    if !verdict.admitted {
        return false;
    }
    let capacity = match limit.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => limit.burst,
        _ => limit.requests,
    };
    let used = capacity.saturating_sub(verdict.remaining);
    let p = shed.probability(used, capacity);
    if p <= 0.0 || chance.draw() >= p {
        return false;
    }
    verdict.admitted = false;
    verdict.delay = 0;
    verdict.retry_after = drain(limit.algorithm, verdict.reset, used, capacity, shed.from);
    true
}

/// The wait until a counter at `used` of `capacity` is back under `from` of it, for a
/// counter that empties in `reset`.
fn drain(algorithm: Algorithm, reset: Micros, used: u64, capacity: u64, from: f64) -> Micros {
    if algorithm == Algorithm::FixedWindow || used == 0 {
        return reset;
    }
    let under = (capacity as f64 * from).floor() as u64;
    let excess = used.saturating_sub(under) as f64 / used as f64;
    (reset as f64 * excess).ceil() as Micros
}

impl<S: Store> Limiter<S> {
    /// Soft shedding of an admitted request: each enforced limit with `shed` past its
    /// `from` may deny it. A charge or a refund is no request to shed: it was spent.
    pub(super) fn shed(&self, order: &[usize], hits: &[Hit], outcome: &mut Outcome) {
        let policy = &outcome.policy;
        for (&i, hit) in order.iter().zip(hits) {
            if hit.mode != Mode::Enforce || hit.spend.always() {
                continue;
            }
            let status = &mut outcome.statuses[i];
            let Some(rule) = effective(policy, &outcome.overrides, status) else {
                continue;
            };
            if rule.shed.is_none() {
                continue;
            }
            let Some(verdict) = status.verdict.as_mut() else {
                continue;
            };
            if decide(rule, verdict, &*self.chance) {
                status.shed = true;
                status.over_limit = true;
                outcome.over_limit = true;
            }
        }
        if outcome.over_limit {
            outcome.delay = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;
    use arc_swap::ArcSwap;

    use crate::limiter::{test_limiter, Descriptor, Limiter, Settings};

    const T0: Micros = 1_700_000_000 * SECOND;

    /// 10 a minute, shedding from half: the n-th request of a key brings its counter
    /// to n (a shed request has spent its hit), so it is shed with probability
    /// (n - 5) / 5, and never at 5 or below.
    #[tokio::test]
    async fn shedding_probability_rises_linearly_to_the_limit_with_a_fixed_seed() {
        let policy = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window, shed: {from: 0.5}}\n";
        let clock = ManualClock::new(T0);
        let docs = crate::policy::parse_str("p.yaml", policy).unwrap();
        let policy = crate::policy::compile(docs).unwrap();
        let store = crate::store::MemoryStore::new(Arc::new(clock.clone()), 100_000);
        let limiter = Limiter::new(
            Arc::new(ArcSwap::from_pointee(policy)),
            store,
            Settings::default(),
        )
        .with_chance(Arc::new(SeededChance::new(27)));
        const KEYS: usize = 2000;
        let mut shed = [0usize; 12];
        let mut denied = [0usize; 12];
        for k in 0..KEYS {
            let ip = format!("10.0.{}.{}", k / 256, k % 256);
            let entries = [("ip", ip.as_str())];
            for n in 1..=11 {
                let o = limiter
                    .decide("d", &[Descriptor::new(&entries[..], 1)])
                    .await;
                let s = o.statuses[0];
                assert_eq!(o.over_limit, s.over_limit);
                denied[n] += usize::from(s.over_limit);
                shed[n] += usize::from(s.shed);
                if s.shed {
                    let v = s.verdict.unwrap();
                    assert!(!v.admitted && v.retry_after > 0, "{v:?}");
                }
            }
        }
        assert_eq!(denied[1..=5], [0; 5], "at or below 'from' nothing is shed");
        for n in 6..=10 {
            let expected = (n as f64 - 5.0) / 5.0;
            let seen = shed[n] as f64 / KEYS as f64;
            assert!(
                (seen - expected).abs() < 0.04,
                "request {n}: shed {seen}, expected {expected}"
            );
            assert_eq!(denied[n], shed[n]);
        }
        // At the limit every request is shed; past it the limit itself denies.
        assert_eq!(shed[10], KEYS);
        assert_eq!((denied[11], shed[11]), (KEYS, 0));
    }

    #[tokio::test]
    async fn shadow_limits_never_shed() {
        let policy = "domain: d\ndescriptors:\n  - key: ip\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 2, shed: {from: 0.1}}\n";
        let clock = ManualClock::new(T0);
        let limiter = test_limiter(policy, &clock, Settings::default())
            .with_chance(Arc::new(SeededChance::new(1)));
        let entries = [("ip", "1.1.1.1")];
        for _ in 0..5 {
            let o = limiter
                .decide("d", &[Descriptor::new(&entries[..], 1)])
                .await;
            assert!(!o.over_limit && !o.statuses[0].shed);
        }
    }

    #[test]
    fn the_wait_is_the_drain_back_under_from() {
        // 100 of 100 used, emptying in 10 s: back under 80 in 2 s.
        assert_eq!(
            drain(Algorithm::TokenBucket, 10 * SECOND, 100, 100, 0.8),
            2 * SECOND
        );
        assert_eq!(
            drain(Algorithm::FixedWindow, 7 * SECOND, 100, 100, 0.8),
            7 * SECOND
        );
    }
}
