//! Charges: costs known only after the response, spent whole even past the limit.
//!
//! Envoy reports what a request cost (tokens, bytes, upstream time) in a second
//! `ShouldRateLimit` when the stream ends, and ignores the answer. Refusing such a
//! charge because it does not fit would let a client whose every response costs more
//! than its remainder spend without limit, so a charge is always spent, and what
//! exceeds the limit is owed: the windows stay over until they have absorbed it,
//! and a bucket's debt delays its next admission by the excess / rate. Checks
//! (cost 0) before each request then deny while anything is owed, so over any
//! window a client spends at most the limit plus the cost of the requests already
//! running when it ran out.

use super::{
    decide, decide_alone, Algorithm, Decision, Limit, Micros, State, Verdict, NO_DEADLINE,
};

/// Decides a charge of `hits` against `limit` at `now`: a cost known only after the
/// work is done (Envoy's second call at stream end), which is spent whole even past
/// the limit. The verdict says whether it fitted; `next` is the state with the whole
/// cost spent either way, so what is over the limit is owed: a window counts it until
/// the window has absorbed it, a bucket's debt delays its next admission by
/// hits / rate. A denied verdict describes the state after the charge (its
/// `retry_after` is the wait for another charge as large, its `next_room` the wait
/// for one hit). A charge holds no answer
/// (`delay` 0): it pays for a request already served. `hits == 0` is a check, as in
/// [`decide`](super::decide).
pub fn charge(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Decision {
    let mut d = decide(limit, state, now, hits);
    d.verdict.delay = 0;
    if d.verdict.admitted || hits == 0 {
        return d;
    }
    // The same decision under a limit that admits anything: the state then moves
    // exactly as an admission would move it (window alignment and bucket rate
    // unchanged), whatever the algorithm.
    let spent = match decide_alone(&lifted(limit), state, now, hits, NO_DEADLINE) {
        spent if spent.next.is_some() => spent,
        // Past the end of time (a bucket's debt) or of u64: as much as can be
        // owed is, so the key stays denied rather than the charge being lost.
        _ => match most_spendable(limit, state, now, hits) {
            Some(spent) => spent,
            None => return d,
        },
    };
    let Some(next) = spent.next else {
        return d;
    };
    let after = decide_alone(limit, Some(&next), now, hits, NO_DEADLINE).verdict;
    let next_room = decide_alone(limit, Some(&next), now, 1, NO_DEADLINE)
        .verdict
        .retry_after;
    Decision {
        verdict: Verdict {
            admitted: false,
            delay: 0,
            next_room,
            owed: owed(limit, spent.verdict.remaining),
            ..after
        },
        next: Some(next),
    }
}

/// The lifted decision of the largest part of `hits` whose state still fits (a
/// bucket's before the end of time); `None` when not one hit does. Whether a part
/// fits only changes once as it grows, so a bisection finds it. decide.lua mirrors
/// it.
fn most_spendable(
    limit: &Limit,
    state: Option<&State>,
    now: Micros,
    hits: u64,
) -> Option<Decision> {
    let lift = lifted(limit);
    // `lo` fits (0 trivially), `hi` does not.
    let (mut lo, mut hi) = (0, hits);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if decide_alone(&lift, state, now, mid, NO_DEADLINE)
            .next
            .is_some()
        {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo > 0).then(|| decide_alone(&lift, state, now, lo, NO_DEADLINE))
}

/// What a key with `state` owes at `now`, in hits, as a charge's verdict says it
/// ([`Verdict::owed`]): 0 when it is not past its limit. The admin API's Explain
/// shows it.
pub fn owed_now(limit: &Limit, state: Option<&State>, now: Micros) -> u64 {
    let bucket = matches!(
        limit.algorithm,
        Algorithm::TokenBucket | Algorithm::LeakyBucket
    );
    if bucket && limit.requests == 0 {
        // No rate prices a hit: such a bucket spends no charge, so owes nothing.
        return 0;
    }
    owed(
        limit,
        decide_alone(&lifted(limit), state, now, 0, NO_DEADLINE)
            .verdict
            .remaining,
    )
}

/// What a key owes after a charge, from the `remaining` of the charge's decision
/// under [`lifted`]: the lift less that is what the new state holds (a window's
/// count, weighted for the sliding counter; a bucket's hits below full, rounded up
/// as `remaining` rounds), and what it holds past the real capacity is owed. The
/// same arithmetic for every algorithm, so decide.lua mirrors it in one line.
fn owed(limit: &Limit, lifted_remaining: u64) -> u64 {
    let capacity = match limit.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => limit.burst,
        _ => limit.requests,
    };
    (u64::MAX - lifted_remaining).saturating_sub(capacity)
}

/// `limit` with room for any charge: the windows' count, or the buckets' capacity,
/// at its largest. The rate (requests per window) of a bucket is kept: it prices a
/// hit.
pub(super) fn lifted(limit: &Limit) -> Limit {
    match limit.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => Limit {
            burst: u64::MAX,
            ..*limit
        },
        _ => Limit {
            requests: u64::MAX,
            ..*limit
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{charge, owed_now};
    use crate::algorithm::testkit::{self, limits, T0};
    use crate::algorithm::{decide, Algorithm, Limit, Micros, State, SECOND};
    use proptest::prelude::*;

    /// Charges `hits` and stores the state, as a store does whatever the verdict.
    fn spend(l: &Limit, s: &mut Option<State>, now: Micros, hits: u64) -> bool {
        let d = charge(l, s.as_ref(), now, hits);
        assert_eq!(d.verdict.delay, 0, "a charge holds no answer");
        if let Some(n) = d.next {
            *s = Some(n);
        }
        d.verdict.admitted
    }

    /// Whether a request may start: a check (cost 0), which spends nothing.
    fn check(l: &Limit, s: &Option<State>, now: Micros) -> bool {
        let d = decide(l, s.as_ref(), now, 0);
        assert!(d.next.is_none(), "a check changed the state");
        d.verdict.admitted
    }

    /// A client whose every response costs more than its limit's whole allowance is
    /// refused once its first charge is owed, in every algorithm; the same charges
    /// as plain requests would all have been refused and spent nothing.
    #[test]
    fn a_client_that_always_overshoots_is_denied_after_its_budget() {
        for a in Algorithm::ALL {
            let l = testkit::limit(a, 10, 10 * SECOND, 10);
            let mut s = None;
            assert!(check(&l, &s, T0), "{a:?}");
            assert!(!spend(&l, &mut s, T0, 25), "{a:?}: 25 on 10 fitted");
            assert!(!check(&l, &s, T0 + 1), "{a:?}: admitted while owing");
            assert!(!decide(&l, s.as_ref(), T0 + 1, 1).verdict.admitted, "{a:?}");
            let mut plain = None;
            assert!(!testkit::hit(&l, &mut plain, T0, 25).admitted);
            assert_eq!(plain, None, "{a:?}: a denied request spent");
        }
    }

    /// A bucket's debt delays the next admission by the excess / rate, exactly.
    #[test]
    fn bucket_debt_delays_the_next_admission_by_excess_over_rate() {
        for a in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            // 10 per second, capacity 10: a charge of 30 from full owes 20 = 2 s.
            let l = testkit::limit(a, 10, SECOND, 10);
            let mut s = None;
            let d = charge(&l, None, T0, 30);
            assert!(!d.verdict.admitted);
            assert_eq!(d.verdict.remaining, 0);
            assert_eq!(d.verdict.next_room, 2 * SECOND + SECOND / 10, "{a:?}");
            assert_eq!(d.verdict.owed, 20, "{a:?}");
            s = d.next.or(s);
            assert!(!check(&l, &s, T0 + 2 * SECOND - 1), "{a:?}");
            assert!(check(&l, &s, T0 + 2 * SECOND), "{a:?}");
            assert!(!decide(&l, s.as_ref(), T0 + 2 * SECOND, 1).verdict.admitted);
            assert!(
                decide(&l, s.as_ref(), T0 + 2 * SECOND + SECOND / 10, 1)
                    .verdict
                    .admitted
            );
        }
    }

    /// A charge whose debt would run past the end of time owes as much as a state
    /// can hold: the key stays denied, where the charge used to be lost.
    #[test]
    fn a_bucket_charge_past_the_end_of_time_is_owed_not_lost() {
        use crate::algorithm::token_bucket::END_OF_TIME;
        for a in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            // 100 a day: ten million hits take 27 centuries to pay back.
            let l = testkit::limit(a, 100, 86_400 * SECOND, 100);
            let d = charge(&l, None, T0, 10_000_000);
            assert!(!d.verdict.admitted, "{a:?}");
            let s = d.next.expect("the state with the debt");
            assert!(d.verdict.owed > 8_000_000, "{a:?}: {:?}", d.verdict);
            assert!(!check(
                &l,
                &Some(s.clone()),
                T0 + 100 * 365 * 86_400 * SECOND
            ));
            let tat = match &s {
                State::TokenBucket(s) => s.tat,
                State::LeakyBucket(s) => s.tat,
                other => panic!("{other:?}"),
            };
            assert!(
                tat < END_OF_TIME && tat > END_OF_TIME - 86_400 * SECOND,
                "{a:?}: {tat}"
            );
            // Already at the end of time: nothing more can be owed, nothing changes.
            let again = charge(&l, Some(&s), T0, 10_000_000);
            assert!(again.next.is_none() && !again.verdict.admitted, "{a:?}");
        }
    }

    /// A window stays over until it has absorbed the overshoot: a fixed window until
    /// it ends, a sliding one until the weighted estimate falls back under.
    #[test]
    fn windows_stay_over_until_they_absorb_the_overshoot() {
        let l = testkit::limit(Algorithm::FixedWindow, 10, 10 * SECOND, 10);
        let mut s = None;
        spend(&l, &mut s, T0 + SECOND, 15);
        assert!(!check(&l, &s, T0 + 10 * SECOND - 1));
        assert!(check(&l, &s, T0 + 10 * SECOND));

        // Sliding counter: 20 spent in [T0, T0 + 10 s) weighs 20 * (1 - f) in the
        // next window, under 10 (a check passes at 10) from halfway through it.
        let l = testkit::limit(Algorithm::SlidingWindowCounter, 10, 10 * SECOND, 10);
        let mut s = None;
        spend(&l, &mut s, T0 + SECOND, 20);
        assert!(!check(&l, &s, T0 + 15 * SECOND - 1));
        assert!(check(&l, &s, T0 + 15 * SECOND));

        // Sliding log: the charge counts for exactly one window from when it was made.
        let l = testkit::limit(Algorithm::SlidingWindowLog, 10, 10 * SECOND, 10);
        let mut s = None;
        spend(&l, &mut s, T0 + SECOND, 20);
        assert!(!check(&l, &s, T0 + 11 * SECOND - 1));
        assert!(check(&l, &s, T0 + 11 * SECOND));
    }

    /// A sliding window counter's charge past the limit answers, as every denial
    /// does, the first instant a request of its cost fits again: a microsecond
    /// earlier it is still denied. The debt weighs on the next window, decaying
    /// linearly, so that instant can be well past the window the charge was made in.
    #[test]
    fn a_sliding_counter_charge_answers_when_its_cost_fits_again() {
        let w = 10 * SECOND;
        let l = testkit::limit(Algorithm::SlidingWindowCounter, 10, w, 10);
        let fits_at = |s: &Option<State>, at: Micros, hits: u64| {
            decide(&l, s.as_ref(), at, hits).verdict.admitted
        };
        // (spent before, when; the charge, when; when a request of its cost fits).
        let cases: [(u64, Micros, u64, Micros, Micros); 4] = [
            // Over within its window: 14 weigh 14 * (1 - e) + 6 <= 10 from e = 5/7.
            (8, T0 + SECOND, 6, T0 + 2 * SECOND, T0 + w + 7_142_858),
            // A full window before it: the charge's 5 alone, at full weight, next.
            (10, T0 + 5 * SECOND, 5, T0 + w + 2 * SECOND, T0 + 2 * w),
            // Most of the debt in the window before: 9 + 4 weigh 13 at full weight.
            (9, T0, 4, T0 + SECOND, T0 + w + 5_384_616),
            // A charge of the whole limit on a full window: two windows on.
            (10, T0, 10, T0 + 3 * SECOND, T0 + 2 * w),
        ];
        for (before, t1, cost, t2, fits) in cases {
            let mut s = None;
            assert!(spend(&l, &mut s, t1, before));
            let d = charge(&l, s.as_ref(), t2, cost);
            assert!(!d.verdict.admitted, "{cost} after {before}");
            s = d.next;
            let wait = d.verdict.retry_wait(w);
            assert_eq!(t2 + wait, fits, "{cost} after {before}");
            assert!(!fits_at(&s, fits - 1, cost), "{cost} after {before}");
            assert!(fits_at(&s, fits, cost), "{cost} after {before}");
        }

        // A charge larger than the limit: no wait admits another as large, so the
        // answer is the wait until the key admits anything, here past one window:
        // 25 spent 3.44 s into a window weigh 25 * (1 - e) + 1 <= 10 from e = 0.64
        // of the next, 12.96 s on.
        let t = T0 + 3_440_000;
        let d = charge(&l, None, t, 25);
        assert_eq!(d.verdict.retry_after, u64::MAX);
        let wait = d.verdict.retry_wait(w);
        assert_eq!(wait, 12_960_000);
        let s = d.next;
        assert!(!fits_at(&s, t + wait - 1, 1));
        assert!(fits_at(&s, t + wait, 1));
        // A plain request as large is denied and spends nothing, and is told the
        // same: when the key (owing from the charge) admits again.
        let v = decide(&l, s.as_ref(), t + SECOND, 25).verdict;
        assert_eq!(v.retry_wait(w), wait - SECOND);
        // On a fresh key, one window, as before.
        assert_eq!(decide(&l, None, t, 25).verdict.retry_wait(w), w);
    }

    /// Every algorithm: a charge larger than the limit is told to wait at least
    /// until the key admits a request again, never one window if its debt lasts
    /// longer; nor longer than that or one window, whichever is later.
    #[test]
    fn a_charge_larger_than_the_limit_waits_for_its_debt() {
        let day = 86_400 * SECOND;
        // 7 s into a day.
        let t = T0 - T0 % day + 7 * SECOND;
        for a in Algorithm::ALL {
            let l = testkit::limit(a, 100, day, 100);
            let d = charge(&l, None, t, 1_000);
            let v = d.verdict;
            assert_eq!(v.retry_after, u64::MAX, "{a:?}");
            let wait = v.retry_wait(day);
            let s = d.next;
            let at = t + wait;
            assert!(decide(&l, s.as_ref(), at, 1).verdict.admitted, "{a:?}");
            match a {
                // 900 owed at 100 a day: nine days, and one hit's 864 s.
                Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                    assert_eq!(wait, 9 * day + 864 * SECOND, "{a:?}");
                    assert!(!decide(&l, s.as_ref(), at - 1, 1).verdict.admitted);
                }
                // Sliding counter: 1000 * (1 - e) + 1 <= 100 from e = 0.901 of the
                // next day; the charge was made 7 s into this one.
                Algorithm::SlidingWindowCounter => {
                    assert_eq!(wait, 2 * day - 7 * SECOND - day / 1000 * 99, "{a:?}");
                    assert!(!decide(&l, s.as_ref(), at - 1, 1).verdict.admitted);
                }
                // The log forgets the charge a day after it, the fixed window at its
                // end: one window.
                _ => assert_eq!(wait, day, "{a:?}"),
            }
        }

        // A bucket owing to the end of time admits nothing again: it is told to wait
        // until it is full, centuries on, not one day.
        for a in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            let l = testkit::limit(a, 100, day, 100);
            let d = charge(&l, None, T0, 10_000_000);
            assert_eq!(d.verdict.next_room, u64::MAX, "{a:?}");
            let wait = d.verdict.retry_wait(day);
            assert_eq!(wait, d.verdict.reset, "{a:?}");
            assert!(wait > 100 * 365 * day, "{a:?}: {wait}");
        }
    }

    /// What a key owes adds up over charges that did not fit (two charges of 25 on
    /// a limit of 10 owe 40, not 25), in every algorithm, and is 0 for a charge
    /// that fits and for a check.
    #[test]
    fn owed_adds_up_over_charges() {
        for a in Algorithm::ALL {
            let l = testkit::limit(a, 10, 10 * SECOND, 10);
            let first = charge(&l, None, T0, 4);
            assert_eq!(first.verdict.owed, 0, "{a:?}: 4 of 10 fitted");
            let mut s = first.next;
            for (cost, owed) in [(25, 19), (25, 44), (0, 0), (1, 45)] {
                let d = charge(&l, s.as_ref(), T0, cost);
                assert_eq!(d.verdict.owed, owed, "{a:?}: a charge of {cost}");
                s = d.next.or(s);
            }
            // What a peek reports: the same debt, read from the state.
            assert_eq!(owed_now(&l, s.as_ref(), T0), 45, "{a:?}");
            assert_eq!(owed_now(&l, None, T0), 0, "{a:?}");
            // A limit of 0: a window owes every hit charged, a bucket spends none.
            let zero = testkit::limit(a, 0, 10 * SECOND, 0);
            let d = charge(&zero, None, T0, 3);
            let bucket = matches!(a, Algorithm::TokenBucket | Algorithm::LeakyBucket);
            let want = if bucket { 0 } else { 3 };
            assert_eq!(d.verdict.owed, want, "{a:?}");
            assert_eq!(owed_now(&zero, d.next.as_ref(), T0), want, "{a:?}");
        }
        // A bucket pays its debt back at the rate: owed falls by one hit per tenth
        // of a second, rounded up.
        for a in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            let l = testkit::limit(a, 10, SECOND, 10);
            let s = charge(&l, None, T0, 30).next;
            // 30 - 5 - a microsecond's worth, plus 1.
            let later = charge(&l, s.as_ref(), T0 + SECOND / 2 + 1, 1).verdict;
            assert_eq!(later.owed, 16, "{a:?}");
        }
        // A fixed window's debt ends with its window.
        let l = testkit::limit(Algorithm::FixedWindow, 10, 10 * SECOND, 10);
        let s = charge(&l, None, T0, 25).next;
        let next_window = T0 - T0 % (10 * SECOND) + 10 * SECOND;
        assert_eq!(charge(&l, s.as_ref(), next_window, 11).verdict.owed, 1);
    }

    /// A charge that fits is an ordinary admission; a check charges nothing.
    #[test]
    fn a_charge_that_fits_is_an_admission_and_zero_is_a_check() {
        for a in Algorithm::ALL {
            let l = testkit::limit(a, 10, 10 * SECOND, 10);
            let as_charge = charge(&l, None, T0, 4);
            let mut as_request = decide(&l, None, T0, 4);
            as_request.verdict.delay = 0;
            assert_eq!(as_charge, as_request, "{a:?}");
            assert!(as_charge.verdict.admitted);
            assert_eq!(charge(&l, None, T0, 0).next, None, "{a:?}");
        }
    }

    /// A limit of `a` that admits something, and the steps of a run: (advance, hits,
    /// whether a charge).
    fn runs_of(a: Algorithm) -> impl Strategy<Value = (Limit, Vec<(u64, u64, bool)>)> {
        limits(a)
            .prop_map(|l| Limit {
                requests: l.requests.max(1),
                burst: l.burst.max(1),
                ..l
            })
            .prop_flat_map(|l| {
                let step = (0..l.window / 2 + 2, 0u64..25, any::<bool>());
                (Just(l), prop::collection::vec(step, 1..40))
            })
    }

    fn runs() -> impl Strategy<Value = (Limit, Vec<(u64, u64, bool)>)> {
        prop_oneof![
            runs_of(Algorithm::FixedWindow),
            runs_of(Algorithm::SlidingWindowLog),
            runs_of(Algorithm::SlidingWindowCounter),
            runs_of(Algorithm::TokenBucket),
            runs_of(Algorithm::LeakyBucket),
        ]
    }

    proptest! {
        /// A charge is spent whole: what a check reports remaining drops by exactly
        /// the cost (to zero, with the rest owed), in every algorithm and state.
        #[test]
        fn a_charge_is_spent_whole((l, steps) in runs()) {
            let mut s = None;
            let mut now = T0;
            for (dt, hits, is_charge) in steps {
                now += dt;
                if is_charge {
                    let before = decide(&l, s.as_ref(), now, 0).verdict.remaining;
                    spend(&l, &mut s, now, hits);
                    let after = decide(&l, s.as_ref(), now, 0).verdict.remaining;
                    prop_assert_eq!(after, before.saturating_sub(hits));
                } else {
                    testkit::hit(&l, &mut s, now, hits);
                }
            }
        }

        /// Every denial, of a charge or a request, in every algorithm: the wait its
        /// retry-after is made of ([`Verdict::retry_wait`](crate::algorithm::Verdict::retry_wait))
        /// ends exactly when a request of its cost fits again; when none ever
        /// will, not before one hit fits, and no later than that or one window.
        #[test]
        fn a_denial_waits_exactly_until_its_cost_or_one_hit_fits((l, steps) in runs()) {
            let mut s = None;
            let mut now = T0;
            for (dt, hits, is_charge) in steps {
                now += dt;
                let d = if is_charge {
                    charge(&l, s.as_ref(), now, hits)
                } else {
                    decide(&l, s.as_ref(), now, hits)
                };
                let v = d.verdict;
                s = d.next.or(s);
                if v.admitted {
                    continue;
                }
                let wait = v.retry_wait(l.window);
                let fits = |at: Micros, hits: u64| decide(&l, s.as_ref(), at, hits).verdict.admitted;
                if v.retry_after != u64::MAX {
                    prop_assert!(wait > 0);
                    prop_assert!(fits(now + wait, hits), "{:?}", v);
                    prop_assert!(!fits(now + wait - 1, hits), "{:?}", v);
                } else if v.next_room != u64::MAX {
                    prop_assert_eq!(wait, v.next_room.max(l.window));
                    prop_assert!(fits(now + wait, 1), "{:?}", v);
                    if v.next_room > 0 {
                        prop_assert!(!fits(now + v.next_room - 1, 1), "{:?}", v);
                    }
                } else {
                    prop_assert!(wait >= l.window);
                }
            }
        }

        /// A window owes exactly while it denies a check: what it owes is what
        /// holds it over its limit.
        #[test]
        fn a_window_owes_exactly_while_a_check_is_denied((l, steps) in runs()) {
            let window = !matches!(l.algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket);
            let mut s = None;
            let mut now = T0;
            for (dt, hits, is_charge) in steps {
                now += dt;
                if !is_charge {
                    testkit::hit(&l, &mut s, now, hits);
                    continue;
                }
                let d = charge(&l, s.as_ref(), now, hits);
                if d.verdict.admitted || hits == 0 {
                    prop_assert_eq!(d.verdict.owed, 0);
                }
                if let Some(n) = d.next {
                    s = Some(n);
                }
                let checked = decide(&l, s.as_ref(), now, 0).verdict.admitted;
                if hits == 0 {
                    // A check leaves an earlier debt as it was and reports none.
                } else if window {
                    prop_assert_eq!(d.verdict.owed > 0, !checked);
                } else if !checked {
                    prop_assert!(d.verdict.owed > 0 || d.verdict.admitted);
                }
            }
        }

        /// The overshoot bound: a client that checks before each request and is
        /// charged its cost when it ends, one request at a time, spends in any
        /// fixed window at most the limit plus its largest cost (the one request
        /// that started before the counter went over).
        #[test]
        fn fixed_window_spends_at_most_the_limit_plus_one_cost(
            (l, steps) in runs_of(Algorithm::FixedWindow)
        ) {
            let mut s = None;
            let mut now = T0;
            let mut spent: Vec<(Micros, u64)> = Vec::new();
            for (dt, cost, _) in steps {
                now += dt;
                if check(&l, &s, now) {
                    spend(&l, &mut s, now, cost);
                    spent.push((now - now % l.window, cost));
                }
            }
            let mut windows: std::collections::BTreeMap<Micros, (u64, u64)> = Default::default();
            for (w, c) in spent {
                let e = windows.entry(w).or_default();
                e.0 += c;
                e.1 = e.1.max(c);
            }
            for (w, (total, largest)) in windows {
                prop_assert!(total <= l.requests + largest, "window {}: {} spent", w, total);
            }
        }

        /// The same bound for the token bucket over any span T from its start:
        /// spent <= burst + rate * T + the largest cost (T counted to the
        /// microsecond after, as a check rounds the bucket's debt to one).
        #[test]
        fn token_bucket_spends_at_most_its_bound_plus_one_cost(
            (l, steps) in runs_of(Algorithm::TokenBucket)
        ) {
            let mut s = None;
            let mut now = T0;
            let (mut total, mut largest) = (0u128, 0u128);
            for (dt, cost, _) in steps {
                now += dt;
                if check(&l, &s, now) {
                    spend(&l, &mut s, now, cost);
                    total += u128::from(cost);
                    largest = largest.max(u128::from(cost));
                    let span = u128::from(now - T0) + 1;
                    let refill = (span * u128::from(l.requests)).div_ceil(u128::from(l.window));
                    prop_assert!(total <= u128::from(l.burst) + refill + largest);
                }
            }
        }
    }
}
