//! token_bucket: capacity `burst`, refilled continuously at `requests` per `window`.
//!
//! Stored as GCRA: `tat`, the theoretical arrival time at which the bucket is full
//! again. Each hit costs window / requests of time (the emission interval), so at
//! `now` the bucket holds burst - (max(tat, now) - now) * requests / window tokens.
//! With base = max(tat, now), a request of `hits` is admitted when
//!
//!   hits <= burst  and  (base - now) * requests <= (burst - hits) * window
//!
//! (exact: base - now <= floor((burst - hits) * window / requests)), and then
//! tat = base + ceil(hits * window / requests). Rounding the stored cost up only ever
//! takes tokens away, so over any span T admitted hits stay <= burst + requests * T /
//! window. A check (`hits == 0`) is refused only when the bucket owes more than the
//! rounding allows: base - now > ceil(burst * window / requests). `requests == 0`
//! admits nothing.
//!
//! The same arithmetic serves leaky_bucket, where `tat` is when the queue drains.

use super::{Limit, Micros, Step, Verdict};

/// Stored state of one token_bucket counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// Theoretical arrival time: when the bucket is full again (microseconds).
    pub tat: Micros,
}

/// Admission arithmetic shared with leaky_bucket. `requests > 0` everywhere.
pub(super) struct Gcra {
    requests: u128,
    window: u128,
    burst: u64,
}

impl Gcra {
    /// `None` when `requests == 0` (nothing is ever admitted).
    pub(super) fn new(limit: &Limit) -> Option<Gcra> {
        (limit.requests > 0).then(|| Gcra {
            requests: u128::from(limit.requests),
            window: u128::from(limit.window.max(1)),
            burst: limit.burst,
        })
    }

    /// The largest backlog (max(tat, now) - now) at which `hits` still fit:
    /// floor((burst - hits) * window / requests), `None` when hits > burst. A check
    /// (`hits == 0`) is only refused once the bucket owes more than its capacity beyond
    /// the rounding of stored costs: ceil(burst * window / requests).
    pub(super) fn slack(&self, hits: u64) -> Option<u128> {
        let room = u128::from(self.burst.checked_sub(hits)?) * self.window;
        Some(if hits == 0 {
            room.div_ceil(self.requests)
        } else {
            room / self.requests
        })
    }

    /// Whether `hits` fit with `backlog` already owed.
    pub(super) fn fits(&self, backlog: Micros, hits: u64) -> bool {
        self.slack(hits)
            .is_some_and(|slack| u128::from(backlog) <= slack)
    }

    /// The time `hits` add to the backlog: ceil(hits * window / requests). `None` if
    /// `base` plus that does not fit in Micros.
    pub(super) fn next_tat(&self, base: Micros, hits: u64) -> Option<Micros> {
        let cost = (u128::from(hits) * self.window).div_ceil(self.requests);
        u64::try_from(u128::from(base) + cost).ok()
    }

    /// Hits that still fit with `backlog` owed: burst - ceil(backlog * requests /
    /// window), at least 0.
    pub(super) fn remaining(&self, backlog: Micros) -> u64 {
        let owed = (u128::from(backlog) * self.requests).div_ceil(self.window);
        // At most `burst`, so it fits in u64.
        u128::from(self.burst).saturating_sub(owed) as u64
    }

    /// For a denied request: the wait until the backlog has shrunk to the slack,
    /// i.e. until tat - slack. `u64::MAX` when hits > burst.
    pub(super) fn retry_after(&self, tat: Micros, now: Micros, hits: u64) -> Micros {
        self.slack(hits).map_or(u64::MAX, |slack| {
            let at = u128::from(tat).saturating_sub(slack);
            // `at <= tat`, so the difference fits.
            at.saturating_sub(u128::from(now)) as Micros
        })
    }
}

/// Decides one request of `hits` at `now`.
pub fn decide(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Step<State> {
    let Some(g) = Gcra::new(limit) else {
        return never(hits);
    };
    let tat = state.map_or(now, |s| s.tat);
    let base = tat.max(now);
    let backlog = base - now;
    if g.fits(backlog, hits) {
        if hits == 0 {
            return admit(g.remaining(backlog), backlog, None);
        }
        if let Some(tat) = g.next_tat(base, hits) {
            return admit(g.remaining(tat - now), tat - now, Some(State { tat }));
        }
    }
    // Waiting never shrinks base + cost below its value now, so a cost that runs past
    // the end of time never fits.
    let retry_after = if g.next_tat(base, hits).is_none() {
        u64::MAX
    } else {
        g.retry_after(tat, now, hits)
    };
    Step {
        verdict: Verdict {
            admitted: false,
            remaining: g.remaining(backlog),
            reset: backlog,
            retry_after,
            delay: 0,
            next_room: 0,
        },
        next: None,
    }
}

fn admit(remaining: u64, reset: Micros, next: Option<State>) -> Step<State> {
    Step {
        verdict: Verdict {
            admitted: true,
            remaining,
            reset,
            ..Verdict::default()
        },
        next,
    }
}

/// `requests == 0`: checks pass, every hit is denied for good.
fn never(hits: u64) -> Step<State> {
    Step {
        verdict: Verdict {
            admitted: hits == 0,
            retry_after: if hits == 0 { 0 } else { u64::MAX },
            ..Verdict::default()
        },
        next: None,
    }
}

/// When the state can be dropped: once the bucket is full again.
pub fn expires_at(_limit: &Limit, state: &State) -> Micros {
    state.tat
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testkit::{self, hit, run, scenarios, shared_properties};
    use crate::algorithm::{decide, Algorithm, Limit, Micros, State, SECOND};
    use proptest::prelude::*;

    const A: Algorithm = Algorithm::TokenBucket;

    /// Off any window boundary: nothing here may depend on alignment.
    const T0: Micros = testkit::T0 + 777;

    fn limit(requests: u64, window: Micros, burst: u64) -> Limit {
        testkit::limit(A, requests, window, burst)
    }

    #[test]
    fn burst_then_refill_at_the_rate() {
        // 10 per second (one per 100 ms), capacity 3.
        let l = limit(10, SECOND, 3);
        let mut s = None;
        for left in (0..3).rev() {
            let v = hit(&l, &mut s, T0, 1);
            assert!(v.admitted);
            assert_eq!(v.remaining, left);
        }
        let v = hit(&l, &mut s, T0, 1);
        assert!(!v.admitted);
        assert_eq!(v.retry_after, 100_000);
        assert_eq!(v.reset, 300_000);
        assert!(!hit(&l, &mut s, T0 + 99_999, 1).admitted);
        assert!(hit(&l, &mut s, T0 + 100_000, 1).admitted);
        // Two tokens take 200 ms to come back.
        let v = hit(&l, &mut s, T0 + 100_000, 2);
        assert_eq!(v.retry_after, 200_000);
        // Full after a long pause, never more than the capacity.
        let v = hit(&l, &mut s, T0 + 10 * SECOND, 0);
        assert_eq!(v.remaining, 3);
        assert_eq!(v.reset, 0);
    }

    #[test]
    fn uneven_interval_is_exact_in_the_admission_and_rounded_up_in_the_state() {
        // 3 per 10 µs: an interval of 10/3 µs, burst 1.
        let l = limit(3, 10, 1);
        let mut s = None;
        assert!(hit(&l, &mut s, 100, 1).admitted);
        assert_eq!(s, Some(State::TokenBucket(super::State { tat: 104 })));
        let v = hit(&l, &mut s, 100, 1);
        assert_eq!(v.retry_after, 4);
        assert!(hit(&l, &mut s, 104, 1).admitted);
    }

    #[test]
    fn hits_above_burst_never_fit_and_zero_limits() {
        let l = limit(10, SECOND, 3);
        assert_eq!(decide(&l, None, T0, 4).verdict.retry_after, u64::MAX);
        let zero = limit(0, SECOND, 3);
        assert_eq!(decide(&zero, None, T0, 1).verdict.retry_after, u64::MAX);
        assert!(decide(&zero, None, T0, 0).verdict.admitted);
        let no_burst = limit(10, SECOND, 0);
        assert_eq!(decide(&no_burst, None, T0, 1).verdict.retry_after, u64::MAX);
        assert!(decide(&no_burst, None, T0, 0).verdict.admitted);
    }

    #[test]
    fn checks_do_not_consume() {
        let l = limit(1, SECOND, 1);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 1).admitted);
        let step = decide(&l, s.as_ref(), T0, 0);
        assert!(step.verdict.admitted);
        assert_eq!(step.verdict.remaining, 0);
        assert_eq!(step.next, None);
    }

    #[test]
    fn extremes_do_not_panic_or_over_admit() {
        let l = limit(1, u64::MAX / 2, 2);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 1).admitted);
        // The second hit's cost would run past the end of time.
        let v = hit(&l, &mut s, T0, 1);
        assert!(!v.admitted);
        assert_eq!(v.retry_after, u64::MAX);
        let endless = limit(1, u64::MAX, 2);
        assert_eq!(decide(&endless, None, T0, 1).verdict.retry_after, u64::MAX);
        let big = limit(u64::MAX, 1, u64::MAX);
        let mut s = None;
        assert!(hit(&big, &mut s, u64::MAX - 1, u64::MAX).admitted);
        assert!(!hit(&big, &mut s, u64::MAX, u64::MAX).admitted);
    }

    shared_properties!(A);

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn never_more_than_burst_plus_rate_times_span((l, start, steps) in scenarios(A)) {
            let (admitted, _, _) = run(&l, start, &steps);
            // Times are non-decreasing, so every span [t_i, t_j] is covered by i..=j
            // with i the first of its timestamp.
            for i in 0..admitted.len() {
                let mut sum = 0u128;
                for j in i..admitted.len() {
                    sum += u128::from(admitted[j].hits);
                    let span = u128::from(admitted[j].at - admitted[i].at);
                    let w = u128::from(l.window);
                    prop_assert!(
                        sum * w <= u128::from(l.burst) * w + u128::from(l.requests) * span,
                        "{} hits over {} us", sum, span,
                    );
                }
            }
        }
    }
}
