//! A bounded sample of live decisions, for the admin API's WatchDecisions.
//!
//! The request path pays one relaxed load of a count nobody writes while no one
//! watches. With watchers, each gets at most its `max_per_second` samples a second
//! through a bounded channel filled with `try_send`: a slow reader loses samples
//! (counted, and told in its next one) and never holds a request up.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use crate::limiter::{key, Descriptor, Outcome};
use crate::policy::Entry;

/// Samples a watcher's channel holds before new ones are dropped.
const CHANNEL: usize = 256;

/// Most samples a second any watcher may ask for.
pub const MAX_PER_SECOND: u32 = 1000;

/// One sampled decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub unix_micros: u64,
    pub domain: String,
    pub over_limit: bool,
    pub latency: Duration,
    pub descriptors: Vec<Sampled>,
    /// Samples this watcher missed since its previous one.
    pub dropped: u64,
}

/// One descriptor of a sampled decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The matched rule's path; empty when none matched.
    pub rule: String,
    /// The values as the top-offenders view shows them (hashed under --hash-keys).
    pub key: String,
    pub over_limit: bool,
    pub remaining: Option<u64>,
    /// What became of it, as `sluice_requests_total`'s `outcome` label says
    /// (`failed_open`, `failed_closed`: the failure mode answered).
    pub outcome: &'static str,
}

/// What a watcher wants to see.
#[derive(Debug, Clone, Default)]
pub struct Interest {
    pub domain: Option<String>,
    pub rule_prefix: Option<String>,
    pub denied_only: bool,
    /// Samples a second, 1..=[`MAX_PER_SECOND`].
    pub max_per_second: u32,
}

#[derive(Debug)]
struct Watcher {
    id: u64,
    interest: Interest,
    tx: mpsc::Sender<Sample>,
    /// (second << 32) | samples sent in it.
    budget: AtomicU64,
    dropped: AtomicU64,
}

impl Watcher {
    /// Takes one sample from this second's budget.
    fn admit(&self, second: u64) -> bool {
        let max = u64::from(self.interest.max_per_second);
        let mut word = self.budget.load(Ordering::Relaxed);
        loop {
            let (sec, n) = (word >> 32, word & 0xffff_ffff);
            let next = if sec == second & 0xffff_ffff {
                if n >= max {
                    return false;
                }
                word + 1
            } else {
                ((second & 0xffff_ffff) << 32) | 1
            };
            match self.budget.compare_exchange_weak(
                word,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(w) => word = w,
            }
        }
    }

    fn wants(&self, domain: &str, outcome: &Outcome) -> bool {
        let i = &self.interest;
        if i.domain.as_deref().is_some_and(|d| d != domain) {
            return false;
        }
        if i.denied_only && !outcome.over_limit {
            return false;
        }
        match &i.rule_prefix {
            None => true,
            Some(p) => outcome
                .statuses
                .iter()
                .filter_map(|s| outcome.rule(s))
                .any(|r| r.path.starts_with(p.as_str())),
        }
    }
}

/// The decisions' sampling point, shared by the service and the admin API.
#[derive(Debug, Default)]
pub struct Tap {
    watching: AtomicUsize,
    watchers: ArcSwap<Vec<Arc<Watcher>>>,
    /// Serialises subscribing and leaving (never taken on the request path).
    change: Mutex<u64>,
}

/// A watcher's samples; leaving is dropping it.
#[derive(Debug)]
pub struct Subscription {
    tap: Arc<Tap>,
    id: u64,
    pub samples: mpsc::Receiver<Sample>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _guard = self.tap.change.lock().unwrap_or_else(|p| p.into_inner());
        let mut list: Vec<Arc<Watcher>> = self.tap.watchers.load().as_ref().clone();
        list.retain(|w| w.id != self.id);
        self.tap.watching.store(list.len(), Ordering::Relaxed);
        self.tap.watchers.store(Arc::new(list));
    }
}

impl Tap {
    /// Whether anyone watches: the request path's only cost when no one does.
    #[inline]
    pub fn watched(&self) -> bool {
        self.watching.load(Ordering::Relaxed) > 0
    }

    /// Starts a watcher.
    pub fn subscribe(self: &Arc<Self>, mut interest: Interest) -> Subscription {
        interest.max_per_second = interest.max_per_second.clamp(1, MAX_PER_SECOND);
        let (tx, samples) = mpsc::channel(CHANNEL);
        let mut next = self.change.lock().unwrap_or_else(|p| p.into_inner());
        *next += 1;
        let id = *next;
        let mut list: Vec<Arc<Watcher>> = self.watchers.load().as_ref().clone();
        list.push(Arc::new(Watcher {
            id,
            interest,
            tx,
            budget: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }));
        self.watching.store(list.len(), Ordering::Relaxed);
        self.watchers.store(Arc::new(list));
        Subscription {
            tap: self.clone(),
            id,
            samples,
        }
    }

    /// Offers one decision to the watchers (call only when [`Tap::watched`]).
    pub fn offer<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
        outcome: &Outcome,
        latency: Duration,
        hashing: &key::Hashing,
    ) {
        let watchers = self.watchers.load();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut sample: Option<Sample> = None;
        for w in watchers.iter() {
            if !w.wants(domain, outcome) {
                continue;
            }
            if !w.admit(now.as_secs()) {
                w.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let sample = sample
                .get_or_insert_with(|| build(domain, descriptors, outcome, latency, hashing, now));
            let mut one = sample.clone();
            one.dropped = w.dropped.swap(0, Ordering::Relaxed);
            if let Err(mpsc::error::TrySendError::Full(s) | mpsc::error::TrySendError::Closed(s)) =
                w.tx.try_send(one)
            {
                w.dropped.fetch_add(1 + s.dropped, Ordering::Relaxed);
            }
        }
    }
}

fn build<E: Entry>(
    domain: &str,
    descriptors: &[Descriptor<'_, E>],
    outcome: &Outcome,
    latency: Duration,
    hashing: &key::Hashing,
    now: Duration,
) -> Sample {
    let descriptors = outcome
        .statuses
        .iter()
        .zip(descriptors)
        .map(|(s, d)| {
            let rule = outcome.rule(s);
            let mut shown = String::new();
            if let Some(rule) = rule {
                key::offender(rule, d.entries, hashing, &mut shown);
            }
            Sampled {
                rule: rule.map(|r| r.path.clone()).unwrap_or_default(),
                key: shown,
                over_limit: s.over_limit,
                remaining: s.verdict.map(|v| v.remaining),
                outcome: super::span::outcome_of(outcome, s),
            }
        })
        .collect();
    Sample {
        unix_micros: now.as_micros() as u64,
        domain: domain.to_string(),
        over_limit: outcome.over_limit,
        latency,
        descriptors,
        dropped: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;
    use crate::limiter::{test_limiter, Settings};

    const POLICY: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

    #[tokio::test]
    async fn watchers_get_at_most_their_rate_and_learn_what_they_missed() {
        let clock = ManualClock::new(1_000 * SECOND);
        let limiter = test_limiter(POLICY, &clock, Settings::default());
        let tap = Arc::new(Tap::default());
        assert!(!tap.watched());
        let mut sub = tap.subscribe(Interest {
            max_per_second: 2,
            ..Interest::default()
        });
        let denied = tap.subscribe(Interest {
            denied_only: true,
            max_per_second: 100,
            ..Interest::default()
        });
        assert!(tap.watched());
        let d = [Descriptor::new(&[("k", "a")][..], 1)];
        let mut offered = 0;
        for _ in 0..5 {
            let o = limiter.decide("d", &d).await;
            tap.offer("d", &d, &o, Duration::from_micros(3), limiter.hashing());
            offered += 1;
        }
        // Within one second (unless the test straddles one: then one more fits).
        let mut got = Vec::new();
        while let Ok(s) = sub.samples.try_recv() {
            got.push(s);
        }
        assert!((2..=3).contains(&got.len()), "{got:?}");
        assert_eq!(got[0].descriptors[0].rule, "k");
        assert_eq!(got[0].descriptors[0].key, "a");
        assert!(!got[0].over_limit && got[1].over_limit);
        drop(denied);
        drop(sub);
        assert!(!tap.watched(), "{offered} offered; every watcher left");
    }

    #[tokio::test]
    async fn a_decision_the_failure_mode_answered_says_so() {
        let clock = ManualClock::new(1_000 * SECOND);
        let limiter = test_limiter(POLICY, &clock, Settings::default());
        let tap = Arc::new(Tap::default());
        let mut sub = tap.subscribe(Interest {
            max_per_second: 100,
            ..Interest::default()
        });
        let d = [Descriptor::new(&[("k", "a")][..], 1)];
        let decided = limiter.decide("d", &d).await;
        tap.offer("d", &d, &decided, Duration::ZERO, limiter.hashing());
        // The same request when the store failed: no verdict, the mode answered.
        for mode in [
            crate::policy::FailureMode::Open,
            crate::policy::FailureMode::Closed,
        ] {
            let mut failed = decided.clone();
            failed.statuses[0].verdict = None;
            failed.statuses[0].over_limit = mode == crate::policy::FailureMode::Closed;
            failed.over_limit = failed.statuses[0].over_limit;
            failed.failure = Some(crate::limiter::StoreFailure {
                error: crate::store::StoreError::Timeout,
                shard: None,
                mode,
                answer: Default::default(),
                store: "redis",
                partial: false,
            });
            tap.offer("d", &d, &failed, Duration::ZERO, limiter.hashing());
        }
        let outcomes: Vec<&str> = std::iter::from_fn(|| sub.samples.try_recv().ok())
            .map(|s| s.descriptors[0].outcome)
            .collect();
        assert_eq!(outcomes, ["ok", "failed_open", "failed_closed"]);
    }

    #[tokio::test]
    async fn a_full_channel_drops_and_counts_without_waiting() {
        let clock = ManualClock::new(1_000 * SECOND);
        let limiter = test_limiter(POLICY, &clock, Settings::default());
        let tap = Arc::new(Tap::default());
        let mut sub = tap.subscribe(Interest {
            max_per_second: MAX_PER_SECOND,
            ..Interest::default()
        });
        let d = [Descriptor::new(&[("k", "a")][..], 1)];
        let o = limiter.decide("d", &d).await;
        for _ in 0..CHANNEL + 10 {
            tap.offer("d", &d, &o, Duration::ZERO, limiter.hashing());
        }
        let mut n = 0;
        while sub.samples.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, CHANNEL);
        tap.offer("d", &d, &o, Duration::ZERO, limiter.hashing());
        let next = sub.samples.try_recv().expect("room again");
        assert_eq!(next.dropped, 10);
    }
}
