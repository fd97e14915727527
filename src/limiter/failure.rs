//! When the store fails: the failure a request is answered by, and
//! `failure_mode: local`, which answers from this replica's share of the limits,
//! with that share's upkeep among the replicas.

use super::{local, Limiter, Outcome, StoreFailure};
use crate::policy::FailureMode;
use crate::store::{Hit, Store, StoreError};

/// A replica's answer to a peer cut off from a shard ([`Limiter::peer_cut_off`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerReach {
    /// This replica reached the shard just now.
    pub reached: bool,
    /// And it reserves the peer's share.
    pub reserved: bool,
}

impl<S: Store> Limiter<S> {
    /// The failure of `error`, answered by `mode`: for the whole request, or only
    /// for the hits the store could not decide (`partial`). `failed` is a hit of the
    /// request whose call failed, when known; otherwise the failing shard is the one
    /// every hit of `hits` lives on, or the first of theirs that is failing.
    pub(super) fn failure(
        &self,
        error: &StoreError,
        mode: FailureMode,
        partial: bool,
        hits: &[Hit],
        failed: Option<&Hit>,
    ) -> StoreFailure {
        let shard = if *error == StoreError::Full {
            None
        } else {
            self.failed_shard(hits, failed)
        };
        StoreFailure {
            error: error.clone(),
            shard: shard.and_then(|s| self.store.shard_name(s)),
            mode,
            answer: self.settings.store_errors,
            store: self.store.name(),
            partial,
        }
    }

    /// The shard whose call failed: `failed`'s, or the one all of `hits` live on,
    /// or the first of theirs whose calls are failing.
    fn failed_shard(&self, hits: &[Hit], failed: Option<&Hit>) -> Option<usize> {
        if let Some(hit) = failed {
            return Some(self.store.shard_of(hit));
        }
        let first = self.store.shard_of(hits.first()?);
        if hits[1..].iter().all(|h| self.store.shard_of(h) == first) {
            return Some(first);
        }
        hits.iter()
            .map(|h| self.store.shard_of(h))
            .find(|&s| self.store.shard_failing(s))
    }

    /// Whether some domain (or the flag's default) answers a store outage locally.
    pub fn uses_local(&self) -> bool {
        self.settings.failure_mode == FailureMode::Local
            || self
                .policy
                .load()
                .domains
                .values()
                .any(|d| d.failure_mode == Some(FailureMode::Local))
    }

    /// This replica's share of `local` domains' limits.
    pub fn local(&self) -> &local::Local {
        &self.local
    }

    /// Moves the local share's clock on and adds local spending to the store once
    /// it answers again. The server runs it every 100 ms.
    pub async fn local_tick(&self) -> local::Settled {
        self.local.tick();
        self.local.settle(&self.store).await
    }

    /// Counts this replica as serving in a shared store and learns how many are,
    /// and how many of those are missing. The server runs it every second;
    /// `Ok(false)` when the store shares nothing.
    pub async fn heartbeat(&self) -> Result<bool, StoreError> {
        match self
            .store
            .heartbeat(&self.local.member(), local::BEATS)
            .await?
        {
            Some(heard) => {
                self.local.hear(&heard);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Takes this replica out of a shared store's count as it stops cleanly, so
    /// the others do not hold its share back as if it were cut off.
    pub async fn leave(&self) -> Result<(), StoreError> {
        self.store.leave(&self.local.member()).await
    }

    /// The peer `replica` says it is cut off from `shard`: if this replica reaches
    /// the shard now, it reserves the peer's share (while the peer is live) until
    /// its word lapses. Off the request path; at most the store timeout.
    pub async fn peer_cut_off(&self, replica: &str, shard: usize) -> PeerReach {
        match self.store.reach(shard).await {
            Ok(at) => PeerReach {
                reached: true,
                reserved: self.local.hold(replica, shard, at),
            },
            Err(e) => {
                tracing::debug!(shard, error = %e, "local share: a peer is cut off from a shard this replica does not reach either");
                PeerReach {
                    reached: false,
                    reserved: false,
                }
            }
        }
    }

    /// `failure_mode: local`: the store's answer is remembered, and a store that
    /// cannot be reached is answered from this replica's share of the configured
    /// limits. A script or protocol error (a working store) is no outage: it stays
    /// an error, answered as `open`.
    pub(super) fn local_answer(
        &self,
        hits: &mut [Hit],
        configured: &local::Configured,
        decided: Result<crate::store::Verdicts, StoreError>,
        outcome: &mut Outcome,
    ) -> Result<crate::store::Verdicts, StoreError> {
        match decided {
            Ok(v) => {
                self.local.remember(hits, &v);
                Ok(v)
            }
            Err(e) if e.is_transient() => {
                outcome.local = true;
                local::restore(hits, configured);
                // A charge or a refund is spent whatever the answer: it is counted
                // locally even while the peers have not answered.
                if !self.may_share(hits) && !hits.iter().any(|h| h.spend.always()) {
                    return Ok(self.local.withhold(hits));
                }
                Ok(self.local.decide(hits))
            }
            Err(e) => Err(e),
        }
    }

    /// Whether this replica may decide `hits` with its share: on each shard they
    /// live on whose calls fail, its peers have answered, or it has none to ask
    /// ([`local::peers`]).
    fn may_share(&self, hits: &[Hit]) -> bool {
        let mut shards: smallvec::SmallVec<[usize; 8]> =
            hits.iter().map(|h| self.store.shard_of(h)).collect();
        shards.sort_unstable();
        shards.dedup();
        if shards.len() > 1 {
            // The shards that answer are not cut off; if none says it failed yet
            // (the failure is being recorded), every one may be.
            let failing: smallvec::SmallVec<[usize; 8]> = shards
                .iter()
                .copied()
                .filter(|&s| self.store.shard_failing(s))
                .collect();
            if !failing.is_empty() {
                shards = failing;
            }
        }
        // Not short-circuited: each shard is told, so each starts its questions.
        let mut ok = true;
        for &s in &shards {
            ok &= self.local.may_share(s);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use arc_swap::ArcSwap;

    use super::*;
    use crate::algorithm::{Micros, SECOND};
    use crate::clock::ManualClock;
    use crate::limiter::{store_wait, Descriptor, Settings, StoreErrorAnswer};
    use crate::store::Probe;

    const HOUR: Micros = 3_600 * SECOND;

    /// A memory store whose counters with `down` in their key sit on a shard that
    /// fails: it decides the others alone, as the Redis store does for `open`.
    struct HalfDown(crate::store::MemoryStore);

    impl crate::store::Board for HalfDown {}

    impl Store for HalfDown {
        async fn decide(&self, hits: &[Hit]) -> Result<crate::store::Verdicts, StoreError> {
            let down = |h: &Hit| h.key.contains("down");
            let up: Vec<Hit> = hits.iter().filter(|h| !down(h)).cloned().collect();
            let decided = self.0.decide(&up).await?;
            let mut up_verdicts = decided.verdicts.into_iter();
            let verdicts = hits
                .iter()
                .map(|h| match down(h) {
                    true => crate::store::Failed::placeholder(),
                    false => up_verdicts.next().expect("a verdict"),
                })
                .collect();
            let failed = (0..hits.len()).filter(|&i| down(&hits[i])).collect();
            Ok(crate::store::Verdicts {
                admitted: decided.admitted,
                verdicts,
                now: decided.now,
                failed: Some(crate::store::Failed {
                    error: StoreError::BackingOff,
                    hits: failed,
                }),
            })
        }

        async fn peek(&self, hits: &[Hit]) -> Result<crate::store::Verdicts, StoreError> {
            self.0.peek(hits).await
        }

        fn active_keys(&self) -> usize {
            0
        }

        fn name(&self) -> &'static str {
            "redis"
        }
    }

    /// A limiter failing open on [`HalfDown`] (as `wrap` makes it): `down`'s limit
    /// of 5 an hour on the failing shard, `up`'s of 1 on the healthy one.
    fn half_down<S: Store>(settings: Settings, wrap: impl FnOnce(HalfDown) -> S) -> Limiter<S> {
        let policy = "domain: d
failure_mode: open
descriptors:
  - key: down
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: up
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: fixed_window}
";
        let clock = ManualClock::new(1_000 * HOUR);
        let docs = crate::policy::parse_str("p.yaml", policy).expect("parses");
        let policy = crate::policy::compile(docs).expect("compiles");
        let store = wrap(HalfDown(crate::store::MemoryStore::new(
            Arc::new(clock.clone()),
            1000,
        )));
        Limiter::new(Arc::new(ArcSwap::from_pointee(policy)), store, settings)
            .with_clock(Arc::new(clock))
    }

    /// A request over a failed and a healthy shard, failing open: the failed
    /// descriptor is answered as failing open answers, the healthy one still
    /// denies, is an offender, and answers OVER_LIMIT even where store errors are
    /// answered with an error.
    #[tokio::test]
    async fn a_failed_shard_lifts_its_descriptors_and_the_others_still_deny() {
        let settings = Settings {
            store_errors: StoreErrorAnswer::Error,
            ..Settings::default()
        };
        let limiter = half_down(settings, |store| store);
        let (down, up) = ([("down", "x")], [("up", "y")]);
        let both = [Descriptor::new(&down, 1), Descriptor::new(&up, 1)];

        let o = limiter.decide("d", &both).await;
        assert!(!o.over_limit);
        assert_eq!(o.statuses[0].verdict, None, "lifted: no verdict");
        assert!(!o.statuses[0].over_limit);
        assert_eq!(o.statuses[1].verdict.unwrap().remaining, 0, "counted");
        assert!(o.failure.as_ref().is_some_and(|f| f.partial));
        assert!(o.error_answer().is_some(), "the failure mode's answer");

        let o = limiter.decide("d", &both).await;
        assert!(o.over_limit, "the healthy limit is full");
        assert!(o.statuses[1].over_limit && !o.statuses[0].over_limit);
        assert_eq!(o.statuses[0].verdict, None);
        assert_eq!(o.error_answer(), None, "decided: OVER_LIMIT, not an error");
        let offenders: Vec<usize> = o.offenders.iter().map(|(i, _)| *i).collect();
        assert_eq!(offenders, [1]);
    }

    /// [`HalfDown`] whose failing shard hangs instead: the request is answered at
    /// the caller's wait, with the healthy shard's verdicts, when the caller polls
    /// it then (it sets no timer), as the Redis store answers a request over a hung
    /// shard and a healthy one.
    struct HalfHung(HalfDown);

    impl crate::store::Board for HalfHung {}

    impl Store for HalfHung {
        async fn decide(&self, hits: &[Hit]) -> Result<crate::store::Verdicts, StoreError> {
            self.0.decide(hits).await
        }

        async fn decide_within(
            &self,
            hits: &[Hit],
            wait: Duration,
            _: Option<&dyn Probe>,
        ) -> Result<crate::store::Verdicts, StoreError> {
            let until = tokio::time::Instant::now() + wait;
            std::future::poll_fn(|_| {
                if tokio::time::Instant::now() < until {
                    std::task::Poll::Pending
                } else {
                    std::task::Poll::Ready(())
                }
            })
            .await;
            let mut decided = self.0.decide(hits).await?;
            if let Some(failed) = &mut decided.failed {
                failed.error = StoreError::Timeout;
            }
            Ok(decided)
        }

        async fn peek(&self, hits: &[Hit]) -> Result<crate::store::Verdicts, StoreError> {
            self.0.peek(hits).await
        }

        fn active_keys(&self) -> usize {
            0
        }

        fn name(&self) -> &'static str {
            "redis"
        }
    }

    /// A request over a hung and a healthy shard, failing open, from a caller whose
    /// deadline is shorter than the store timeout: the store is told that wait and
    /// answers by it, so the healthy shard's full limit still denies.
    #[tokio::test(start_paused = true)]
    async fn a_shard_hung_past_the_callers_wait_lifts_only_its_descriptors() {
        let settings = Settings {
            store_timeout: Duration::from_millis(100),
            ..Settings::default()
        };
        let limiter = half_down(settings, HalfHung);
        let (down, up) = ([("down", "x")], [("up", "y")]);
        let both = [Descriptor::new(&down, 1), Descriptor::new(&up, 1)];
        let left = Some(Duration::from_millis(20));

        let started = tokio::time::Instant::now();
        let o = limiter.decide_within("d", &both, left).await;
        assert_eq!(started.elapsed(), store_wait(Duration::from_millis(20)));
        assert!(!o.over_limit);
        assert_eq!(o.statuses[0].verdict, None, "lifted: no verdict");
        let healthy = o.statuses[1].verdict.expect("the healthy shard's verdict");
        assert_eq!(healthy.remaining, 0, "counted");
        assert!(o.failure.as_ref().is_some_and(|f| f.partial));

        let o = limiter.decide_within("d", &both, left).await;
        assert!(o.over_limit, "the healthy limit is full");
        assert!(o.statuses[1].over_limit && !o.statuses[0].over_limit);
    }
}
