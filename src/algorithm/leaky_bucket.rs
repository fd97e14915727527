//! leaky_bucket: a queue of `burst` hits that drains at `requests` per `window`.
//!
//! Stored as the virtual time at which the queue is empty, exact as in token_bucket
//! (whole microseconds rounded up, `tat`, less `rem` / requests). At `now` the queue
//! holds (max(tat, now) - now) * requests / window hits. A request of `hits` finds
//! room when
//!
//!   hits <= burst  and  (base - now) * requests <= (burst - hits) * window
//!
//! with base = max(exact tat, now) (exact, in u128: the same test as token_bucket).
//! It is admitted with delay = base - now rounded up to a microsecond: its turn comes
//! when the hits queued before it have drained, at once for an empty queue. Its hits
//! then occupy the queue until base + hits * window / requests, exactly, so a queue of
//! `burst` takes `burst` hits at one instant however they are split into requests. A
//! request that finds no room is denied at once. A check (`hits == 0`) joins no
//! queue (delay 0) and is judged as in token_bucket.
//!
//! A caller that gives up after `max_delay` (its deadline) is not admitted to a turn
//! it would not wait for: when the delay would exceed it, the request is denied at
//! once (`late`), takes no place, and may retry after delay - max_delay, when the
//! queue ahead has drained that far. A full queue is denied as for any caller.
//!
//! Guarantees (tested): the release times (now + delay) of admitted requests i < j
//! are at least the hits of i..j-1 times window / requests apart, less under one
//! microsecond (each release is the microsecond at or after its exact turn, so the
//! rounding never adds up); and the hits admitted but not yet released at any
//! admission, plus the new ones, never exceed `burst`.

use super::token_bucket::{never, Gcra};
use super::{Limit, Micros, Step, Verdict};

/// Stored state of one leaky_bucket counter: token_bucket's, whose `tat` is when the
/// queue will have drained.
pub type State = super::token_bucket::State;

/// Decides one request of `hits` at `now` for a caller that waits at most
/// `max_delay` for its turn. A check (`hits == 0`) joins no queue, so its delay is 0.
pub fn decide(
    limit: &Limit,
    state: Option<&State>,
    now: Micros,
    hits: u64,
    max_delay: Micros,
) -> Step<State> {
    // `requests == 0`: the queue never drains, so no hit is ever admitted.
    let Some(g) = Gcra::new(limit) else {
        return never(hits, limit.window.max(1));
    };
    let start = g.start(state.map(|s| (s.tat, s.rem, s.rate)), now);
    let next = g.next(&start, hits);
    let wait = g.wait(start.backlog);
    if g.fits(start.backlog, hits) {
        if hits == 0 {
            return Step {
                verdict: Verdict {
                    admitted: true,
                    remaining: g.remaining(start.backlog),
                    reset: wait,
                    ..Verdict::default()
                },
                next: None,
            };
        }
        if let Some(n) = next {
            if wait > max_delay {
                // Its turn comes after the caller has given up: taking it would
                // slow the queue for everyone behind and serve no one.
                return Step {
                    verdict: Verdict {
                        admitted: false,
                        remaining: g.remaining(start.backlog),
                        reset: wait,
                        // The queue ahead drains a microsecond per microsecond.
                        retry_after: wait - max_delay,
                        late: true,
                        ..Verdict::default()
                    },
                    next: None,
                };
            }
            return Step {
                verdict: Verdict {
                    admitted: true,
                    remaining: g.remaining(n.backlog),
                    reset: n.tat - now,
                    retry_after: 0,
                    delay: wait,
                    next_room: 0,
                    owed: 0,
                    late: false,
                },
                next: Some(State {
                    tat: n.tat,
                    rem: n.rem,
                    rate: g.rate,
                }),
            };
        }
    }
    Step {
        verdict: Verdict {
            admitted: false,
            remaining: g.remaining(start.backlog),
            reset: wait,
            // The queue only shrinks while waiting, but base + cost never does: one
            // that runs past the end of time never fits.
            retry_after: match next {
                Some(_) => g.retry_after(&start, hits),
                None => u64::MAX,
            },
            delay: 0,
            next_room: 0,
            owed: 0,
            late: false,
        },
        next: None,
    }
}

/// When the state can be dropped: once the queue has drained.
pub fn expires_at(_limit: &Limit, state: &State) -> Micros {
    state.tat
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testkit::{self, bucket_splits, hit, run, scenarios, shared_properties};
    use crate::algorithm::{decide, Algorithm, Limit, Micros, State, SECOND};
    use proptest::prelude::*;

    const A: Algorithm = Algorithm::LeakyBucket;

    /// Off any window boundary: nothing here may depend on alignment.
    const T0: Micros = testkit::T0 + 4_321;

    fn limit(requests: u64, window: Micros, burst: u64) -> Limit {
        testkit::limit(A, requests, window, burst)
    }

    #[test]
    fn queued_requests_wait_their_turn() {
        // 5 per second (one per 200 ms), queue of 3.
        let l = limit(5, SECOND, 3);
        let mut s = None;
        let delays: Vec<_> = (0..3).map(|_| hit(&l, &mut s, T0, 1)).collect();
        assert_eq!(
            delays
                .iter()
                .map(|v| (v.admitted, v.delay, v.remaining))
                .collect::<Vec<_>>(),
            vec![(true, 0, 2), (true, 200_000, 1), (true, 400_000, 0)]
        );
        assert_eq!(delays[2].reset, 600_000);
        let v = hit(&l, &mut s, T0, 1);
        assert!(!v.admitted);
        assert_eq!(v.delay, 0);
        assert_eq!(v.retry_after, 200_000);
        assert!(!hit(&l, &mut s, T0 + 199_999, 1).admitted);
        let v = hit(&l, &mut s, T0 + 200_000, 1);
        assert!(v.admitted);
        assert_eq!(v.delay, 400_000);
    }

    #[test]
    fn multi_hit_requests_take_several_slots() {
        let l = limit(10, SECOND, 4);
        let mut s = None;
        assert_eq!(hit(&l, &mut s, T0, 3).delay, 0);
        let v = hit(&l, &mut s, T0, 2);
        assert!(!v.admitted);
        assert_eq!(v.retry_after, 100_000);
        let v = hit(&l, &mut s, T0 + 100_000, 2);
        assert!(v.admitted);
        assert_eq!(v.delay, 200_000);
        assert_eq!(hit(&l, &mut s, T0, 5).retry_after, u64::MAX);
    }

    #[test]
    fn checks_and_zero_limits() {
        let l = limit(5, SECOND, 1);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 1).admitted);
        let step = decide(&l, s.as_ref(), T0, 0);
        assert!(step.verdict.admitted);
        assert_eq!(step.verdict.delay, 0);
        assert_eq!(step.next, None);
        let zero = limit(0, SECOND, 5);
        assert_eq!(decide(&zero, None, T0, 1).verdict.retry_after, u64::MAX);
        assert!(decide(&zero, None, T0, 0).verdict.admitted);
        let no_queue = limit(5, SECOND, 0);
        assert_eq!(decide(&no_queue, None, T0, 1).verdict.retry_after, u64::MAX);
    }

    #[test]
    fn extremes_do_not_panic() {
        use crate::algorithm::token_bucket::END_OF_TIME;
        let l = limit(1, (END_OF_TIME - T0) / 2 + 1, 2);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 1).admitted);
        assert_eq!(hit(&l, &mut s, T0, 1).retry_after, u64::MAX);
        let big = limit(u64::MAX, 1, u64::MAX);
        let mut s = None;
        assert!(hit(&big, &mut s, END_OF_TIME - 2, u64::MAX).admitted);
        assert!(!hit(&big, &mut s, END_OF_TIME - 1, u64::MAX).admitted);
        assert!(
            !hit(&big, &mut s, u64::MAX, 1).admitted,
            "past the end of time"
        );
    }

    #[test]
    fn an_uneven_interval_queues_the_whole_burst_at_one_instant() {
        // 3 per second: turns every 333,333.3 µs, each held to the microsecond at or
        // after it.
        let l = limit(3, SECOND, 3);
        let mut s = None;
        let v: Vec<_> = (0..3).map(|_| hit(&l, &mut s, T0, 1)).collect();
        assert_eq!(
            v.iter()
                .map(|v| (v.admitted, v.delay, v.remaining))
                .collect::<Vec<_>>(),
            vec![(true, 0, 2), (true, 333_334, 1), (true, 666_667, 0)]
        );
        assert!(!hit(&l, &mut s, T0, 1).admitted);
        for parts in [vec![2, 1], vec![1, 2], vec![3]] {
            testkit::whole_burst_at_one_instant(&l, T0, &parts).unwrap();
        }
        let day = limit(37, 86_400 * SECOND, 37);
        for parts in [vec![1; 37], vec![36, 1], vec![1, 36], vec![37]] {
            testkit::whole_burst_at_one_instant(&day, T0, &parts).unwrap();
        }
    }

    #[test]
    fn a_turn_past_the_callers_deadline_is_denied_at_once_and_not_taken() {
        use crate::algorithm::{decide_within, NO_DEADLINE};
        // 5 per second (a turn every 200 ms), queue of 3.
        let l = limit(5, SECOND, 3);
        let mut s = None;
        assert_eq!(hit(&l, &mut s, T0, 1).delay, 0);
        // The next turn is 200 ms away: a caller who waits 150 ms is denied at once,
        // may retry when the turn is 150 ms away, and leaves the queue as it was.
        let late = decide_within(&l, s.as_ref(), T0, 1, 150_000);
        assert_eq!(late.next, None);
        let v = late.verdict;
        assert!(!v.admitted && v.late, "{v:?}");
        assert_eq!((v.delay, v.retry_after), (0, 50_000));
        assert_eq!((v.remaining, v.reset), (2, 200_000));
        assert!(
            !decide_within(&l, s.as_ref(), T0 + 49_999, 1, 150_000)
                .verdict
                .admitted
        );
        let then = decide_within(&l, s.as_ref(), T0 + 50_000, 1, 150_000).verdict;
        assert!(then.admitted && !then.late);
        assert_eq!(then.delay, 150_000);
        // Exactly its turn is soon enough; and a caller without a deadline gets the
        // turn the late one did not take.
        assert!(
            decide_within(&l, s.as_ref(), T0, 1, 200_000)
                .verdict
                .admitted
        );
        let v = hit(&l, &mut s, T0, 1);
        assert_eq!((v.admitted, v.delay), (true, 200_000));
        // A full queue is denied as for any caller: no `late`, the usual retry.
        assert!(hit(&l, &mut s, T0, 1).admitted);
        let v = decide_within(&l, s.as_ref(), T0, 1, 0).verdict;
        assert!(!v.admitted && !v.late, "{v:?}");
        assert_eq!(v.retry_after, 200_000);
        // A check joins no queue, so no deadline denies it.
        assert!(decide_within(&l, s.as_ref(), T0, 0, 0).verdict.admitted);
        assert_eq!(NO_DEADLINE, u64::MAX);
    }

    // Also: `testkit::run` checks that a fresh counter's first request is not held,
    // and the shared `verdict_fields_are_exact` that a denial is never held.
    /// A limit of 0 never admits: its reset says one window, as `retry-after` does,
    /// not "full again now", which would send a client straight back.
    #[test]
    fn a_zero_limit_resets_in_one_window() {
        let zero = limit(0, 10 * SECOND, 3);
        for hits in [0, 1] {
            let v = decide(&zero, None, T0, hits).verdict;
            assert_eq!((v.remaining, v.reset), (0, 10 * SECOND), "{hits} hits");
        }
    }

    shared_properties!(A);

    #[test]
    fn a_bucket_that_takes_the_longest_allowed_to_fill_gives_its_whole_burst() {
        testkit::longest_fills_give_their_whole_burst(A);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn the_whole_burst_at_one_instant_in_any_split((l, now, parts) in bucket_splits(A)) {
            testkit::whole_burst_at_one_instant(&l, now, &parts)?;
        }

        #[test]
        fn releases_are_spaced_and_the_queue_holds_at_most_burst(
            (l, start, steps) in scenarios(A),
        ) {
            let (admitted, _, _) = run(&l, start, &steps);
            let release = |i: usize| admitted[i].at + admitted[i].delay;
            let (r, w) = (u128::from(l.requests), u128::from(l.window));
            for i in 0..admitted.len() {
                // The hits of i..j take (j's release - i's release) at the rate, short
                // of it by less than a microsecond of rounding.
                let mut hits = 0u128;
                for j in i + 1..admitted.len() {
                    hits += u128::from(admitted[j - 1].hits);
                    prop_assert!(release(j) >= release(j - 1));
                    let apart = u128::from(release(j) - release(i));
                    prop_assert!((apart + 1) * r > hits * w, "{} hits {} us apart", hits, apart);
                }
            }
            for (i, now) in admitted.iter().map(|a| a.at).enumerate() {
                // Waiting (released later), and waiting or leaving now: the latter
                // over `burst` by less than a microsecond's drain.
                let waiting: u64 = (0..=i)
                    .filter(|&k| k == i || release(k) > now)
                    .map(|k| admitted[k].hits)
                    .sum();
                prop_assert!(waiting <= l.burst, "{} waiting at {}", waiting, now);
                let held: u64 = (0..=i)
                    .filter(|&k| release(k) >= now)
                    .map(|k| admitted[k].hits)
                    .sum();
                prop_assert!(
                    u128::from(held) * w < u128::from(l.burst) * w + r,
                    "{} held at {}", held, now,
                );
            }
        }

        #[test]
        fn a_deadline_denies_exactly_the_turns_that_come_after_it(
            (l, start, steps) in scenarios(A), hits in 0u64..10, max_delay in 0u64..3_000,
        ) {
            use crate::algorithm::decide_within;
            let (_, s, now) = run(&l, start, &steps);
            let free = decide(&l, s.as_ref(), now, hits);
            let bound = decide_within(&l, s.as_ref(), now, hits, max_delay);
            if !free.verdict.admitted || free.verdict.delay <= max_delay {
                // Soon enough, or denied anyway: the deadline changes nothing.
                prop_assert_eq!(bound, free);
            } else {
                // Too late: denied, nothing taken, and admitted with the same
                // deadline exactly `retry_after` later, not a microsecond sooner.
                let v = bound.verdict;
                prop_assert!(!v.admitted && v.late);
                prop_assert_eq!(bound.next, None);
                prop_assert_eq!(v.delay, 0);
                prop_assert_eq!(v.retry_after, free.verdict.delay - max_delay);
                prop_assert!(v.remaining >= hits);
                let at = now + v.retry_after;
                let then = decide_within(&l, s.as_ref(), at, hits, max_delay).verdict;
                prop_assert!(then.admitted && then.delay == max_delay, "{:?}", then);
                prop_assert!(!decide_within(&l, s.as_ref(), at - 1, hits, max_delay).verdict.admitted);
            }
        }

        #[test]
        fn admitted_requests_are_held_until_the_queue_ahead_drains(
            (l, start, steps) in scenarios(A), hits in 0u64..10,
        ) {
            let (_, s, now) = run(&l, start, &steps);
            let v = decide(&l, s.as_ref(), now, hits).verdict;
            if v.admitted {
                let tat = match s {
                    Some(State::LeakyBucket(s)) => s.tat,
                    _ => now,
                };
                let expected_delay = if hits == 0 { 0 } else { tat.max(now) - now };
                prop_assert_eq!(v.delay, expected_delay);
            }
        }
    }
}
