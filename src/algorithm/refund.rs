//! Refunds: hits given back (Envoy's `is_negative_hits`), floored at zero.
//!
//! A refund returns what an earlier hit took: a reservation's estimate when the
//! actual cost is charged, a slot of a concurrency limit when the stream ends. It
//! never denies and never leaves a counter below empty: a window's count stops at 0,
//! a bucket's debt at none (a full bucket, an empty queue). What it gives back is
//! taken from the newest hits, so a window that has moved on keeps what it has
//! forgotten forgotten.
//!
//! Each algorithm's state is first brought to `now` by the algorithm itself (one hit
//! decided under a limit that admits anything, then taken off again), so a refund
//! follows the same window alignment and roll-over as a decision, whatever they are.

use super::{
    decide_alone, fixed_window, sliding_window_counter, token_bucket, Decision, Limit, Micros,
    State, Verdict, NO_DEADLINE,
};

/// Gives `hits` back to the counter of `limit` at `now`. The verdict is always
/// admitted and describes the state after (what a check would then see, but never
/// OVER_LIMIT); `next` is `None` when there was nothing to give back to.
pub fn refund(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Decision {
    // A counter never seen has nothing to give back: no state is made for it.
    let next = match state {
        Some(_) if hits > 0 => give_back(limit, state, now, hits),
        _ => None,
    };
    let check = decide_alone(limit, next.as_ref().or(state), now, 0, NO_DEADLINE).verdict;
    Decision {
        verdict: Verdict {
            admitted: true,
            remaining: check.remaining,
            reset: check.reset,
            ..Verdict::default()
        },
        next,
    }
}

/// The state with `hits` fewer, or `None` when the counter holds nothing at `now`.
fn give_back(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Option<State> {
    // One hit more, at now, under a limit that takes anything: the state rolled
    // forward to now the algorithm's own way. It then gives back that hit too.
    let rolled = decide_alone(&super::charge::lifted(limit), state, now, 1, NO_DEADLINE).next?;
    let hits = hits.saturating_add(1);
    Some(match rolled {
        State::FixedWindow(s) => State::FixedWindow(fixed_window::State {
            count: s.count.saturating_sub(hits),
            ..s
        }),
        State::SlidingWindowCounter(s) => {
            let from_current = hits.min(s.current);
            State::SlidingWindowCounter(sliding_window_counter::State {
                current: s.current - from_current,
                previous: s.previous.saturating_sub(hits - from_current),
                ..s
            })
        }
        State::SlidingWindowLog(mut s) => {
            s.give_back(hits);
            State::SlidingWindowLog(s)
        }
        // Rolled under `limit`'s rate, which their states now record.
        State::TokenBucket(s) => State::TokenBucket(shorten(limit, now, s, hits)),
        State::LeakyBucket(s) => State::LeakyBucket(shorten(limit, now, s, hits)),
    })
}

/// A bucket's state with `hits` of its backlog at `now` taken off, at most all of
/// it. Exact, in ticks of 1 / requests µs as in token_bucket (a hit is `window`
/// ticks; exact tat = tat - rem / requests).
fn shorten(limit: &Limit, now: Micros, s: token_bucket::State, hits: u64) -> token_bucket::State {
    let (tat, rem) = (s.tat, u128::from(s.rem));
    let requests = u128::from(limit.requests.max(1));
    let backlog = if tat > now {
        (u128::from(tat - now) * requests).saturating_sub(rem)
    } else {
        0
    };
    let left = backlog.saturating_sub(u128::from(hits) * u128::from(limit.window.max(1)));
    let whole = left.div_ceil(requests);
    // At most the old tat - now, so it fits; the remainder is below `requests`.
    token_bucket::State {
        tat: now + whole as Micros,
        rem: (whole * requests - left) as u64,
        ..s
    }
}

#[cfg(test)]
mod tests {
    use super::refund;
    use crate::algorithm::testkit::{self, T0};
    use crate::algorithm::{charge, decide, Algorithm, Limit, State, SECOND};

    fn give(l: &Limit, s: &mut Option<State>, now: u64, hits: u64) -> u64 {
        let d = refund(l, s.as_ref(), now, hits);
        assert!(d.verdict.admitted, "a refund was refused");
        assert_eq!((d.verdict.retry_after, d.verdict.delay), (0, 0));
        if let Some(n) = d.next {
            *s = Some(n);
        }
        d.verdict.remaining
    }

    fn remaining(l: &Limit, s: &Option<State>, now: u64) -> u64 {
        decide(l, s.as_ref(), now, 0).verdict.remaining
    }

    /// Hits taken and given back leave the counter where it was, in every algorithm.
    #[test]
    fn a_refund_gives_back_what_was_taken() {
        for a in Algorithm::ALL {
            let l = testkit::limit(a, 10, 10 * SECOND, 10);
            let mut s = None;
            testkit::hit(&l, &mut s, T0, 7);
            assert_eq!(remaining(&l, &s, T0), 3, "{a:?}");
            assert_eq!(give(&l, &mut s, T0, 4), 7, "{a:?}");
            assert_eq!(remaining(&l, &s, T0), 7, "{a:?}");
            assert!(testkit::hit(&l, &mut s, T0, 7).admitted, "{a:?}");
        }
    }

    /// More given back than was taken stops at an empty counter: never more room
    /// than the limit, never OVER_LIMIT, and a refund to a fresh counter is a no-op.
    #[test]
    fn refunds_are_floored_at_zero() {
        for a in Algorithm::ALL {
            let l = testkit::limit(a, 10, 10 * SECOND, 10);
            let mut s = None;
            assert_eq!(give(&l, &mut s, T0, 5), 10, "{a:?}: fresh");
            testkit::hit(&l, &mut s, T0, 2);
            assert_eq!(give(&l, &mut s, T0, 50), 10, "{a:?}");
            assert!(
                !testkit::hit(&l, &mut s, T0, 11).admitted,
                "{a:?}: room past the limit"
            );
            assert!(testkit::hit(&l, &mut s, T0, 10).admitted, "{a:?}");
        }
    }

    /// A refund also repays debt: a charge past the limit and its refund cancel out.
    #[test]
    fn a_refund_repays_what_a_charge_owes() {
        for a in Algorithm::ALL {
            let l = testkit::limit(a, 10, 10 * SECOND, 10);
            let mut s = charge(&l, None, T0, 25).next;
            assert!(!decide(&l, s.as_ref(), T0, 0).verdict.admitted, "{a:?}");
            let d = refund(&l, s.as_ref(), T0, 20);
            assert!(d.verdict.admitted, "{a:?}: a refund answered OVER_LIMIT");
            s = d.next;
            assert_eq!(remaining(&l, &s, T0), 5, "{a:?}");
        }
    }

    /// A sliding counter gives back from its current window first, then from the
    /// previous one: the newest hits.
    #[test]
    fn a_sliding_counter_refund_past_its_current_window_comes_off_the_previous() {
        let l = testkit::limit(Algorithm::SlidingWindowCounter, 10, 10 * SECOND, 10);
        let mut s = None;
        assert!(testkit::hit(&l, &mut s, T0 + 9 * SECOND, 8).admitted);
        let now = T0 + 10 * SECOND;
        assert!(testkit::hit(&l, &mut s, now, 1).admitted);
        assert_eq!(remaining(&l, &s, now), 1);
        // 1 from the current window, 3 from the previous: 5 and 0 are left.
        assert_eq!(give(&l, &mut s, now, 4), 5);
        assert_eq!(
            s,
            Some(State::SlidingWindowCounter(
                crate::algorithm::sliding_window_counter::State {
                    window_start: now,
                    previous: 5,
                    current: 0,
                }
            ))
        );
    }

    /// A bucket whose hits cost an uneven interval gives back exactly: the hits
    /// refunded fit again at the same instant, not one more.
    #[test]
    fn a_bucket_refund_at_an_uneven_interval_gives_back_exactly_the_hits() {
        for a in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            // 3 a second: a third of a second each, stored rounded up.
            let l = testkit::limit(a, 3, SECOND, 3);
            let mut s = None;
            assert!(testkit::hit(&l, &mut s, T0, 2).admitted, "{a:?}");
            assert_eq!(give(&l, &mut s, T0, 1), 2, "{a:?}");
            assert!(testkit::hit(&l, &mut s, T0, 2).admitted, "{a:?}");
            let v = testkit::hit(&l, &mut s, T0, 1);
            assert!(!v.admitted, "{a:?}");
            assert_eq!(v.retry_after, 333_334, "{a:?}");
        }
    }

    /// A sliding log gives back its newest entries whole: once they are refunded
    /// the log resets when the entry before them expires, not when they would have.
    #[test]
    fn a_sliding_log_refund_of_its_newest_entries_resets_from_the_one_before() {
        let l = testkit::limit(Algorithm::SlidingWindowLog, 10, 10 * SECOND, 10);
        let mut s = None;
        assert!(testkit::hit(&l, &mut s, T0, 3).admitted);
        assert!(testkit::hit(&l, &mut s, T0 + SECOND, 2).admitted);
        let now = T0 + 2 * SECOND;
        let d = refund(&l, s.as_ref(), now, 2);
        assert_eq!((d.verdict.remaining, d.verdict.reset), (7, 8 * SECOND));
        let s = d.next;
        let v = decide(&l, s.as_ref(), now, 0).verdict;
        assert_eq!((v.remaining, v.reset), (7, 8 * SECOND));
    }

    /// A fixed window that has ended has nothing to give back to: its hits are
    /// already forgotten, and the new window's count is not lowered below zero.
    #[test]
    fn a_window_that_moved_on_keeps_its_new_count() {
        let l = testkit::limit(Algorithm::FixedWindow, 10, 10 * SECOND, 10);
        let mut s = None;
        testkit::hit(&l, &mut s, T0, 8);
        testkit::hit(&l, &mut s, T0 + 10 * SECOND, 3);
        assert_eq!(give(&l, &mut s, T0 + 10 * SECOND, 8), 10);
    }
}
