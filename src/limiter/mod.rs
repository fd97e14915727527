//! The decision path: a request's descriptors become rule hits, the store decides
//! them in one batch, and the verdicts become an [`Outcome`].
//!
//! Nothing here knows about gRPC or HTTP; `service/` adapts the wire formats to it.
//! This file holds the [`Limiter`] and its decision, read top to bottom; each step
//! lives in a file of its own: `plan` (descriptors to hits), `deadline` (the store
//! call within the caller's wait), `settle` (verdicts to statuses), `failure` (a
//! failing store, and `failure_mode: local`), `shed`, `sentences` (penalties and
//! blocks).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};

use crate::algorithm::NO_DEADLINE;
use crate::clock::{Clock, SystemClock};
use crate::policy::{Entry, FailureMode, Policy};
use crate::store::{Probe, Store};

mod deadline;
pub mod explain;
mod failure;
pub mod key;
pub mod local;
mod outcome;
pub mod overrides;
pub mod penalty;
mod plan;
mod sentences;
mod settings;
mod settle;
pub mod shed;

pub use deadline::{store_wait, DEADLINE_MARGIN};
pub use failure::PeerReach;
pub use outcome::{Ban, Descriptor, Outcome, Status, StoreFailure};
pub use overrides::Override;
use overrides::OverrideRules;
use penalty::Penalties;
pub use sentences::BlockError;
pub use settings::{DeniedSpend, OverrideCounter, ResetResolution, Settings, StoreErrorAnswer};
use shed::Chance;

/// Decides requests against the current policy and a store.
#[derive(Debug)]
pub struct Limiter<S> {
    policy: Arc<ArcSwap<Policy>>,
    store: S,
    settings: Settings,
    penalties: Penalties,
    overrides: OverrideRules,
    chance: Arc<dyn Chance>,
    /// Places calendar windows (read only for calendar rules) and times penalties.
    clock: Arc<dyn Clock>,
    /// `failure_mode: local`: this replica's share while the store is away.
    local: local::Local,
}

/// The `failure_mode: local` state of a limiter on `store`, with `settings`.
fn local_for<S: Store>(clock: Arc<dyn Clock>, settings: &Settings, store: &S) -> local::Local {
    local::Local::new(clock, settings.local_replicas, settings.max_keys)
        .with_shards(store.shards().len())
}

impl<S: Store> Limiter<S> {
    pub fn new(policy: Arc<ArcSwap<Policy>>, store: S, settings: Settings) -> Self {
        Limiter {
            local: local_for(Arc::new(SystemClock), &settings, &store),
            policy,
            store,
            penalties: Penalties::new(Arc::new(SystemClock), penalty::DEFAULT_MAX_TRACKED),
            overrides: OverrideRules::default(),
            chance: Arc::new(shed::ThreadChance),
            clock: Arc::new(SystemClock),
            settings,
        }
    }

    /// Draws soft-shedding chances from `chance` (tests fix the seed).
    pub fn with_chance(mut self, chance: Arc<dyn Chance>) -> Self {
        self.chance = chance;
        self
    }

    /// Uses `clock` for penalties and to place calendar windows (the store keeps
    /// its own clock to decide by).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.penalties = Penalties::new(clock.clone(), penalty::DEFAULT_MAX_TRACKED);
        self.local = local_for(clock.clone(), &self.settings, &self.store);
        self.clock = clock;
        self
    }

    /// Denial counts and bans of rules with a `penalty`.
    pub fn penalties(&self) -> &Penalties {
        &self.penalties
    }

    /// Which values are hashed where keys are shown.
    pub fn hashing(&self) -> &key::Hashing {
        &self.settings.hashing
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// What to answer when the store cannot (a domain may override it).
    pub fn failure_mode(&self) -> FailureMode {
        self.settings.failure_mode
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Decides one request. The descriptors are already validated by the caller.
    pub async fn decide<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
    ) -> Outcome {
        self.decide_within(domain, descriptors, None).await
    }

    /// As [`Limiter::decide`], for a caller who gives up `left` from now: the store
    /// is waited for at most [`store_wait`] of it when that is shorter than the store
    /// timeout, and no leaky_bucket turn is taken that comes past
    /// [`Limiter::hold_budget`] ([`Hit::max_delay`]).
    ///
    /// [`Hit::max_delay`]: crate::store::Hit::max_delay
    pub async fn decide_within<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
        left: Option<Duration>,
    ) -> Outcome {
        self.decide_probed(domain, descriptors, left, None).await
    }

    /// As [`Limiter::decide_within`], telling `probe` of each round trip the store
    /// makes for it (the service traces them).
    pub async fn decide_probed<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
        left: Option<Duration>,
        probe: Option<&dyn Probe>,
    ) -> Outcome {
        // A guard, not a clone: the one reference count the outcome needs is taken
        // once, below, on a count every core's requests write.
        let guard = self.policy.load();
        let policy: &Policy = &guard;
        let mut statuses: Vec<Status> = descriptors
            .iter()
            .map(|d| Status::undecided(d.hits, d.spend))
            .collect();
        let Some(dom) = policy.domain(domain) else {
            return Outcome::undecided(Guard::into_inner(guard), false, statuses, Vec::new());
        };

        // A leaky_bucket answer held past the caller's deadline would reach a
        // caller that has given up: such a turn is not taken.
        let max_delay = left.map_or(NO_DEADLINE, |l| self.hold_budget(l));
        let wait = left.map(store_wait);
        let (overrides, order, mut hits, failure_mode) =
            self.plan(policy, dom, domain, descriptors, max_delay, &mut statuses);

        let mut outcome = Outcome::undecided(Guard::into_inner(guard), true, statuses, overrides);
        if hits.is_empty() {
            return outcome;
        }
        // A banned or blocked key is denied at once, without asking the store.
        let asked = penalty::Asked {
            domain,
            descriptors,
            hashing: &self.settings.hashing,
        };
        let sentenced =
            penalty::apply_sentences(&self.penalties, &asked, &order, &mut hits, &mut outcome);
        if sentenced.denied {
            self.note_offenders(domain, descriptors, &mut outcome, &order, &hits);
            return outcome;
        }

        // Other domains, and a store that cannot be away, pay nothing for this:
        // `configured` stays empty and inline.
        let decide_locally = failure_mode == FailureMode::Local && self.store.can_be_away();
        let configured = if decide_locally {
            self.local.reserve(&mut hits)
        } else {
            local::Configured::new()
        };
        let decided = self.ask_store(&hits, wait, probe).await;
        let decided = if decide_locally {
            self.local_answer(&mut hits, &configured, decided, &mut outcome)
        } else {
            decided
        };
        self.settle(&mut outcome, &order, &hits, decided, failure_mode);
        penalty::deny_charges(&sentenced.charges, &mut outcome);
        if outcome.over_limit
            && outcome.store_decided()
            && !outcome.local
            && self.settings.denied_spend == DeniedSpend::AdmittingLimits
        {
            self.spend_denied(&order, &hits, &mut outcome, wait, probe)
                .await;
        }
        // Soft shedding draws a chance, so it is the decision's alone: an explanation
        // (which settles too) shows the limits as they stand.
        if outcome.store_decided() && !outcome.over_limit {
            self.shed(&order, &hits, &mut outcome);
        }
        if outcome.over_limit && outcome.store_decided() {
            let pending = self.note_offenders(domain, descriptors, &mut outcome, &order, &hits);
            // Counted in the store, which a local decision cannot reach in time.
            if !pending.is_empty() && !outcome.local {
                self.strike(pending, &mut outcome).await;
            }
        }
        outcome
    }
}

/// A limiter over a memory store for unit tests: `policy` is file-form YAML, and the
/// store, penalties and windows all read `clock`.
#[cfg(test)]
pub(crate) fn test_limiter(
    policy: &str,
    clock: &crate::clock::ManualClock,
    settings: Settings,
) -> Limiter<crate::store::MemoryStore> {
    let docs = crate::policy::parse_str("p.yaml", policy).expect("parses");
    let policy = crate::policy::compile(docs).expect("compiles");
    let store = crate::store::MemoryStore::new(Arc::new(clock.clone()), 1000);
    Limiter::new(Arc::new(ArcSwap::from_pointee(policy)), store, settings)
        .with_clock(Arc::new(clock.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Micros, SECOND};
    use crate::clock::ManualClock;
    use crate::store::Spend;

    const HOUR: Micros = 3_600 * SECOND;

    /// 2 per hour and 3 per day on one key, both exact (sliding logs).
    const TWO_RATES: &str = "domain: d
descriptors:
  - key: api_key
    rate_limits:
      - {unit: hour, requests_per_unit: 2, algorithm: sliding_window_log}
      - {unit: day, requests_per_unit: 3, algorithm: sliding_window_log, name: daily}
";

    async fn one(limiter: &Limiter<crate::store::MemoryStore>) -> Outcome {
        let entries = [("api_key", "k1")];
        limiter.decide("d", &[Descriptor::new(&entries, 1)]).await
    }

    /// The limit a status reports: (requests_per_unit, unit).
    fn reported(o: &Outcome) -> (u32, &'static str) {
        let rule = o.rule(&o.statuses[0]).expect("a rule");
        (rule.requests_per_unit, rule.unit.as_str())
    }

    /// The memory store cannot be away: `failure_mode: local` leaves its limits
    /// whole even while the heartbeat says replicas are missing.
    #[tokio::test]
    async fn local_mode_on_the_memory_store_reserves_nothing() {
        let clock = ManualClock::new(1_000 * HOUR);
        let settings = Settings {
            failure_mode: FailureMode::Local,
            ..Settings::default()
        };
        let limiter = test_limiter(TWO_RATES, &clock, settings);
        limiter.local().learn(crate::store::Replicas {
            live: 1,
            missing: 2,
        });
        assert!(!one(&limiter).await.over_limit);
        assert!(
            !one(&limiter).await.over_limit,
            "the hour's 2, not a third of it"
        );
        assert!(one(&limiter).await.over_limit);
    }

    #[tokio::test]
    async fn several_rates_on_one_key_decide_all_or_nothing_and_report_the_nearest() {
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(TWO_RATES, &clock, Settings::default());

        // Hour: 1 left, day: 2 left. The hour is nearest.
        let o = one(&limiter).await;
        assert!(!o.over_limit);
        assert_eq!(reported(&o), (2, "hour"));
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 1);

        let o = one(&limiter).await;
        assert!(!o.over_limit);
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 0);

        // The hour denies; the day, which had room, spends nothing.
        let o = one(&limiter).await;
        assert!(o.over_limit && o.statuses[0].over_limit);
        assert_eq!(reported(&o), (2, "hour"));
        let v = o.statuses[0].verdict.unwrap();
        assert!(v.retry_after > 0 && v.retry_after <= HOUR);

        // A new hour: the day has exactly one left (the denial spent none of it), and
        // it is now the limit nearest its end, so the answer describes it.
        clock.advance(HOUR);
        let o = one(&limiter).await;
        assert!(!o.over_limit);
        assert_eq!(reported(&o), (3, "day"));
        assert_eq!(
            o.rule(&o.statuses[0]).unwrap().name.as_deref(),
            Some("daily")
        );
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 0);

        // The day denies although the hour has room; the wait is the day's.
        clock.advance(HOUR);
        let o = one(&limiter).await;
        assert!(o.over_limit);
        assert_eq!(reported(&o), (3, "day"));
        let v = o.statuses[0].verdict.unwrap();
        assert!(
            v.retry_after > HOUR,
            "the day's wait, not the hour's: {v:?}"
        );
    }

    /// 2 per second and 3 per local day in Berlin on one key.
    const CALENDAR: &str = "domain: d
descriptors:
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {window: calendar_day, time_zone: Europe/Berlin, requests_per_unit: 3, name: daily}
";

    #[tokio::test]
    async fn a_calendar_day_is_placed_by_the_limiters_clock_across_a_23_hour_day() {
        // 2026-03-29 00:30 in Berlin (CET): that day has 23 hours, to 22:00 UTC.
        let start = 1_774_740_600 * SECOND;
        let clock = ManualClock::new(start);
        let limiter = test_limiter(CALENDAR, &clock, Settings::default());
        for _ in 0..3 {
            assert!(!one(&limiter).await.over_limit);
            clock.advance(HOUR);
        }
        // The day's fourth: denied by the day, until local midnight (22:00 UTC).
        let o = one(&limiter).await;
        assert!(o.over_limit);
        assert_eq!(reported(&o), (3, "day"));
        let midnight = 1_774_821_600 * SECOND;
        let v = o.statuses[0].verdict.unwrap();
        assert_eq!(v.retry_after, midnight - clock.now());
        clock.set(midnight - 1);
        assert!(one(&limiter).await.over_limit);
        clock.set(midnight);
        let o = one(&limiter).await;
        assert!(!o.over_limit);
        // The new day is 24 hours long, and starts at local midnight.
        let policy = limiter.policy();
        let entries = [("api_key", "k1")];
        let mut statuses = [Status::undecided(1, Spend::IfAdmitted)];
        let (_, _, hits, _) = limiter.plan(
            &policy,
            policy.domain("d").unwrap(),
            "d",
            &[Descriptor::new(&entries, 1)],
            NO_DEADLINE,
            &mut statuses,
        );
        assert_eq!(hits[1].key, "d|api_key=k1|~calendar_day@Europe/Berlin");
        assert_eq!(hits[1].limit.window, 24 * HOUR);
        assert_eq!(hits[1].limit.phase, midnight % (24 * HOUR));
    }

    #[tokio::test]
    async fn concurrency_holds_a_slot_until_its_refund_or_its_lease() {
        let policy = "domain: d
descriptors:
  - key: api_key
    rate_limit: {algorithm: concurrency, requests_per_unit: 2, lease: 5m}
";
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(policy, &clock, Settings::default());
        let entries = [("api_key", "k1")];
        let start = Descriptor {
            spend: Spend::Always,
            ..Descriptor::new(&entries, 1)
        };
        let end = Descriptor {
            spend: Spend::Refund,
            ..Descriptor::new(&entries, 1)
        };
        // Two streams start; a third is refused (and its stream-end refund, which
        // Envoy sends for a denied request too, gives its slot back).
        assert!(!limiter.decide("d", &[start]).await.over_limit);
        clock.advance(SECOND);
        assert!(!limiter.decide("d", &[start]).await.over_limit);
        assert!(limiter.decide("d", &[start]).await.over_limit);
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        assert!(limiter.decide("d", &[start]).await.over_limit);
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        // One stream ends: its slot is free at once.
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        assert!(!limiter.decide("d", &[start]).await.over_limit);
        assert!(limiter.decide("d", &[start]).await.over_limit);
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        // No refund ever comes for the two in flight (a crashed Envoy): their slots
        // are held until their leases end, five minutes after they were taken (a
        // refund takes the newest entry, so the entries left are of 0 s and 1 s).
        clock.set(1_000 * HOUR + 5 * 60 * SECOND);
        let o = limiter.decide("d", &[start]).await;
        assert!(!o.over_limit, "the first slot's lease has ended");
        assert!(limiter.decide("d", &[start]).await.over_limit);
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        clock.advance(SECOND);
        assert!(!limiter.decide("d", &[start]).await.over_limit);
    }

    #[tokio::test]
    async fn several_rates_are_one_store_batch_on_one_placement() {
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(TWO_RATES, &clock, Settings::default());
        let policy = limiter.policy();
        let dom = policy.domain("d").unwrap();
        let entries = [("api_key", "k1")];
        let mut statuses = [Status::undecided(1, Spend::IfAdmitted)];
        let (_, order, hits, _) = limiter.plan(
            &policy,
            dom,
            "d",
            &[Descriptor::new(&entries, 1)],
            NO_DEADLINE,
            &mut statuses,
        );
        assert_eq!(order[..], [0, 0], "one status, two hits");
        assert_eq!(hits.len(), 2);
        assert_eq!(
            hits[0].key, "d|api_key=k1",
            "the first limit keeps the plain key"
        );
        assert_eq!(hits[1].key, "d|api_key=k1|~86400s");
        assert_eq!(hits[0].placement, hits[1].placement, "decided together");
        assert_eq!(hits[1].limit.requests, 3);
    }

    /// 100 tokens a day, and a small limit that sheds from half its use.
    const CHARGES: &str = "domain: d
descriptors:
  - key: tokens
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}
  - key: small
    rate_limit: {unit: day, requests_per_unit: 10, algorithm: fixed_window, shed: {from: 0.5}}
";

    fn spent<'a>(
        entries: &'a [(&'a str, &'a str)],
        hits: u64,
        spend: Spend,
    ) -> Descriptor<'a, (&'a str, &'a str)> {
        Descriptor {
            spend,
            ..Descriptor::new(entries, hits)
        }
    }

    async fn remaining(
        limiter: &Limiter<crate::store::MemoryStore>,
        entries: &[(&str, &str)],
    ) -> u64 {
        let o = limiter.decide("d", &[Descriptor::new(entries, 0)]).await;
        o.statuses[0].verdict.expect("decided").remaining
    }

    #[tokio::test]
    async fn a_charge_or_refund_beside_an_over_limit_charge_is_spent_once() {
        let clock = ManualClock::new(1_000 * HOUR);
        let settings = Settings {
            denied_spend: DeniedSpend::AdmittingLimits,
            ..Settings::default()
        };
        let limiter = test_limiter(CHARGES, &clock, settings);
        let (tokens, small) = ([("tokens", "x")], [("small", "y")]);
        assert!(
            limiter
                .decide("d", &[spent(&small, 20, Spend::Always)])
                .await
                .over_limit
        );
        let both = [
            spent(&tokens, 10, Spend::Always),
            spent(&small, 1, Spend::Always),
        ];
        assert!(limiter.decide("d", &both).await.over_limit);
        assert_eq!(remaining(&limiter, &tokens).await, 90, "charged once");
        let both = [
            spent(&tokens, 5, Spend::Refund),
            spent(&small, 1, Spend::Always),
        ];
        assert!(limiter.decide("d", &both).await.over_limit);
        assert_eq!(remaining(&limiter, &tokens).await, 95, "given back once");
    }

    #[tokio::test]
    async fn shedding_never_denies_a_refund_or_a_charge() {
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(CHARGES, &clock, Settings::default())
            .with_chance(Arc::new(shed::SeededChance::new(7)));
        let small = [("small", "y")];
        assert!(
            limiter
                .decide("d", &[spent(&small, 9, Spend::Always)])
                .await
                .statuses[0]
                .verdict
                .unwrap()
                .admitted
        );
        for n in 0..6 {
            let o = limiter
                .decide("d", &[spent(&small, 1, Spend::Refund)])
                .await;
            assert!(!o.over_limit && !o.statuses[0].shed, "refund {n}: {o:?}");
            let o = limiter
                .decide("d", &[spent(&small, 1, Spend::Always)])
                .await;
            assert!(!o.over_limit && !o.statuses[0].shed, "charge {n}: {o:?}");
        }
        assert_eq!(
            remaining(&limiter, &small).await,
            1,
            "every charge and refund counted"
        );
        // A request past `from` is still shed now and then.
        let mut shed = 0;
        for _ in 0..40 {
            let o = limiter.decide("d", &[Descriptor::new(&small, 0)]).await;
            shed += usize::from(o.statuses[0].shed);
        }
        assert!(shed > 0, "nothing shed past from");
    }

    #[tokio::test]
    async fn a_denied_request_of_another_descriptor_spends_none_of_the_rates() {
        let policy = "domain: d
descriptors:
  - key: api_key
    rate_limits:
      - {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
      - {unit: day, requests_per_unit: 6, algorithm: fixed_window}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 0, algorithm: fixed_window}
";
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(policy, &clock, Settings::default());
        let key = [("api_key", "k")];
        let ip = [("ip", "10.0.0.1")];
        let both = [Descriptor::new(&key, 1), Descriptor::new(&ip, 1)];
        let o = limiter.decide("d", &both).await;
        assert!(o.over_limit);
        // Both rates of the admitted descriptor report what the request would have
        // left them, and kept it: the next request alone finds them untouched.
        let o = limiter.decide("d", &[Descriptor::new(&key, 1)]).await;
        assert!(!o.over_limit);
        assert_eq!(reported(&o), (5, "hour"));
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 4);
    }
}
