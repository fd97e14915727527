//! sliding_window_counter: the current and previous epoch-aligned windows, weighted.
//!
//! With start = now - now % window and elapsed = now - start, the estimate is
//! previous * (1 - elapsed / window) + current. A request of `hits` is admitted when
//! estimate + hits <= requests, computed exactly in integers as
//!
//!   previous * (window - elapsed) + (current + hits) * window <= requests * window
//!
//! i.e. current + hits <= floor((requests * window - previous * (window - elapsed)) /
//! window). With no new hits the estimate never increases (at a boundary the previous
//! weight has reached 0 and the current count becomes the previous at full weight),
//! so the first admissible time can be solved for and retry_after is exact.

use super::{Limit, Micros, Step, Verdict};

/// Stored state of one sliding_window_counter counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// Start of the current window (a multiple of the window length).
    pub window_start: Micros,
    /// Hits admitted in the window before it.
    pub previous: u64,
    /// Hits admitted in it.
    pub current: u64,
}

/// The counters as seen at `now`, after rolling the stored windows forward.
struct View {
    start: Micros,
    elapsed: Micros,
    previous: u64,
    current: u64,
}

fn view(window: Micros, state: Option<&State>, now: Micros) -> View {
    let start = now - now % window;
    let (start, previous, current) = match state {
        // A stored window later than `now` means the clock stepped back: keep it, with
        // elapsed 0 (the previous window at full weight), rather than forget hits.
        Some(s) if s.window_start >= start && s.window_start % window == 0 => {
            (s.window_start, s.previous, s.current)
        }
        // A window off this limit's grid is one of another length (the policy's unit
        // changed) that started in the current window: its counts weigh as they
        // did, in the current window, so its reset and retry-after are this limit's.
        Some(s) if s.window_start >= start => (start, s.previous, s.current),
        Some(s) if s.window_start.checked_add(window) == Some(start) => (start, s.current, 0),
        _ => (start, 0, 0),
    };
    View {
        start,
        elapsed: now.saturating_sub(start),
        previous,
        current,
    }
}

/// Largest `current + hits` admissible with `previous` weighted by `window - elapsed`:
/// floor((requests * window - previous * (window - elapsed)) / window), `None` when
/// negative.
fn allowance(requests: u64, window: Micros, previous: u64, elapsed: Micros) -> Option<u128> {
    let w = u128::from(window);
    let weighted = u128::from(previous) * (w - u128::from(elapsed));
    (u128::from(requests) * w)
        .checked_sub(weighted)
        .map(|x| x / w)
}

/// First elapsed time within a window at which `previous` (weighted by
/// window - elapsed) leaves room for `need` more: elapsed >= window -
/// floor(need * window / previous). `None` if not before the window ends.
fn first_elapsed(need: u64, previous: u64, window: Micros) -> Option<Micros> {
    if previous == 0 {
        return Some(0);
    }
    let w = u128::from(window);
    let room = u128::from(need) * w / u128::from(previous);
    // The difference is at most `window`, so it fits in Micros.
    (room > 0).then(|| w.saturating_sub(room) as Micros)
}

/// `at - now` in u128, saturated to `u64::MAX` (which reads as never).
fn until(at: u128, now: Micros) -> Micros {
    u64::try_from(at.saturating_sub(u128::from(now))).unwrap_or(u64::MAX)
}

/// Decides one request of `hits` at `now`.
pub fn decide(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Step<State> {
    let window = limit.window.max(1);
    let w = u128::from(window);
    let v = view(window, state, now);
    let allowed = allowance(limit.requests, window, v.previous, v.elapsed);
    let wanted = u128::from(v.current) + u128::from(hits);
    let admitted = allowed.is_some_and(|a| wanted <= a);
    let current = if admitted {
        wanted
    } else {
        u128::from(v.current)
    };
    // Both are at most `requests` (admission implies it), so they fit in u64.
    let remaining = allowed.map_or(0, |a| a.saturating_sub(current)) as u64;
    // Back to full once nothing is weighted: the current count stops weighing at the
    // end of the next window, the previous one at the end of this one.
    let start = u128::from(v.start);
    // A limit of 0 is never back to any allowance: one window, as `retry-after`.
    let reset = if limit.requests == 0 {
        window
    } else if current > 0 {
        until(start + 2 * w, now)
    } else if v.previous > 0 {
        until(start + w, now)
    } else {
        0
    };

    if admitted {
        let next = (hits > 0).then_some(State {
            window_start: v.start,
            previous: v.previous,
            current: current as u64,
        });
        return Step {
            verdict: Verdict {
                admitted: true,
                remaining,
                reset,
                ..Verdict::default()
            },
            next,
        };
    }

    // Denied: the first time the estimate leaves room, in this window, the next one
    // (where the current count becomes the previous), or the one after (empty).
    let retry_at = if hits > limit.requests {
        None
    } else {
        let this_window = limit
            .requests
            .checked_sub(v.current)
            .and_then(|r| r.checked_sub(hits))
            .filter(|_| v.previous > 0)
            .and_then(|need| first_elapsed(need, v.previous, window))
            .map(|e| start + u128::from(e));
        let next_window = first_elapsed(limit.requests - hits, v.current, window)
            .map(|e| start + w + u128::from(e));
        Some(this_window.or(next_window).unwrap_or(start + 2 * w))
    };
    Step {
        verdict: Verdict {
            admitted: false,
            remaining,
            reset,
            retry_after: retry_at.map_or(u64::MAX, |at| until(at, now)),
            delay: 0,
            next_room: 0,
            owed: 0,
            late: false,
        },
        next: None,
    }
}

/// When the state can be dropped: when the current count has stopped weighing (end of
/// the following window), or the previous one if the current count is 0.
pub fn expires_at(limit: &Limit, state: &State) -> Micros {
    let window = limit.window.max(1);
    let windows = if state.current > 0 {
        2
    } else if state.previous > 0 {
        1
    } else {
        0
    };
    state
        .window_start
        .saturating_add(window.saturating_mul(windows))
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testkit::{self, hit, run, scenarios, shared_properties, Admitted, T0};
    use crate::algorithm::{decide, Algorithm, Limit, Micros, State, SECOND};
    use proptest::prelude::*;

    const A: Algorithm = Algorithm::SlidingWindowCounter;

    fn limit(requests: u64, window: Micros) -> Limit {
        testkit::limit(A, requests, window, requests)
    }

    fn own(s: Option<State>) -> Option<super::State> {
        s.map(|s| match s {
            State::SlidingWindowCounter(s) => s,
            other => panic!("not a sliding_window_counter state: {other:?}"),
        })
    }

    #[test]
    fn a_shorter_windows_counts_weigh_in_the_longer_window_they_started_in() {
        // A per-second limit made per-minute mid-minute (T0 is 20 s into a minute:
        // this minute runs from T0 - 20 s to T0 + 40 s).
        let now = T0 + 30 * SECOND + SECOND / 2;
        let mut s = None;
        for _ in 0..3 {
            assert!(hit(&limit(5, SECOND), &mut s, now, 1).admitted);
        }
        let minute = limit(5, 60 * SECOND);
        let v = hit(&minute, &mut s, now, 1);
        assert!(v.admitted);
        assert_eq!(v.remaining, 1, "the second's hits count in the minute");
        // They weigh until the end of the next minute, T0 + 100 s.
        assert_eq!(v.reset, T0 + 100 * SECOND - now);
        assert_eq!(
            own(s.clone()).map(|s| s.window_start),
            Some(T0 - 20 * SECOND)
        );
        let v = hit(&minute, &mut s, now, 2);
        assert!(!v.admitted);
        // 4 weigh in the next minute: 2 fit once 4 * (1 - e) <= 3, at e = 15 s.
        assert_eq!(v.retry_after, T0 + 55 * SECOND - now);
    }

    #[test]
    fn previous_window_is_weighted_by_what_is_left_of_it() {
        let l = limit(10, 10 * SECOND);
        let mut s = None;
        assert!(hit(&l, &mut s, T0 + 9 * SECOND, 8).admitted);
        // 2.5 s into the next window: estimate = 8 * 0.75 = 6, so 4 more fit.
        let now = T0 + 12_500_000;
        let v = hit(&l, &mut s, now, 5);
        assert!(!v.admitted);
        assert_eq!(v.remaining, 4);
        // 5 fit once 8 * (1 - e) <= 5, i.e. e >= 3.75 s.
        assert_eq!(v.retry_after, 13_750_000 - 12_500_000);
        assert!(!hit(&l, &mut s, T0 + 13_750_000 - 1, 5).admitted);
        let v = hit(&l, &mut s, now, 4);
        assert!(v.admitted);
        assert_eq!(v.remaining, 0);
        // The 4 stop weighing at the end of the window after this one.
        assert_eq!(v.reset, T0 + 30 * SECOND - now);
        assert_eq!(
            own(s),
            Some(super::State {
                window_start: T0 + 10 * SECOND,
                previous: 8,
                current: 4
            })
        );
    }

    #[test]
    fn state_two_windows_old_is_forgotten() {
        let l = limit(3, SECOND);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 3).admitted);
        assert!(!hit(&l, &mut s, T0 + SECOND, 1).admitted);
        let v = hit(&l, &mut s, T0 + 2 * SECOND, 3);
        assert!(v.admitted);
        assert_eq!(own(s).map(|s| (s.previous, s.current)), Some((0, 3)));
    }

    #[test]
    fn retry_can_land_in_the_next_window_or_the_one_after() {
        let l = limit(4, 10 * SECOND);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 4).admitted);
        // Current full: 4 hits need the 4 to weigh 0, i.e. two windows on.
        let v = hit(&l, &mut s, T0 + SECOND, 4);
        assert_eq!(v.retry_after, 19 * SECOND);
        // 2 hits need 4 * (1 - e) <= 2 in the next window: e >= 5 s.
        let v = hit(&l, &mut s, T0 + SECOND, 2);
        assert_eq!(v.retry_after, 14 * SECOND);
        assert_eq!(hit(&l, &mut s, T0, 5).retry_after, u64::MAX);
    }

    #[test]
    fn a_counter_after_a_clock_step_back_weighs_its_previous_window_in_full() {
        let l = limit(10, 10 * SECOND);
        let mut s = None;
        assert!(hit(&l, &mut s, T0 + 9 * SECOND, 8).admitted);
        assert!(hit(&l, &mut s, T0 + 10 * SECOND, 2).admitted);
        // Back half a second into the older window: the newer one is kept, at the
        // start of its window, where 8 + 2 fill the limit. Weighing the 8 by the
        // older window's elapsed time would admit 7 more.
        let now = T0 + 9 * SECOND + SECOND / 2;
        let v = hit(&l, &mut s, now, 1);
        assert!(!v.admitted);
        assert_eq!(v.remaining, 0);
        // 1 fits once 8 * (1 - e) + 2 + 1 <= 10, at e = 1.25 s into the newer window.
        assert_eq!(v.retry_after, T0 + 11_250_000 - now);
        // The 2 weigh until the end of the window after the newer one.
        assert_eq!(v.reset, T0 + 30 * SECOND - now);
    }

    #[test]
    fn checks_do_not_count() {
        let l = limit(2, SECOND);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 2).admitted);
        let step = decide(&l, s.as_ref(), T0, 0);
        assert!(step.verdict.admitted);
        assert_eq!(step.next, None);
        // Over a lowered limit, a check is denied.
        let v = decide(&limit(1, SECOND), s.as_ref(), T0, 0).verdict;
        assert!(!v.admitted);
        assert_eq!(v.retry_after, SECOND + SECOND / 2);
    }

    #[test]
    fn zero_requests_and_extremes() {
        let l = limit(0, SECOND);
        assert_eq!(decide(&l, None, T0, 1).verdict.retry_after, u64::MAX);
        assert!(decide(&l, None, T0, 0).verdict.admitted);
        let big = limit(u64::MAX, u64::MAX);
        let mut s = None;
        assert!(hit(&big, &mut s, u64::MAX - 1, u64::MAX).admitted);
        assert!(!hit(&big, &mut s, u64::MAX, 1).admitted);
        let tiny = limit(1, 1);
        let mut s = None;
        assert!(hit(&tiny, &mut s, 5, 1).admitted);
        let v = hit(&tiny, &mut s, 5, 1);
        assert_eq!(v.retry_after, 2);
        assert!(!hit(&tiny, &mut s, 6, 1).admitted);
        assert!(hit(&tiny, &mut s, 7, 1).admitted);
    }

    fn sum_in(admitted: &[Admitted], from: Micros, len: Micros) -> u64 {
        admitted
            .iter()
            .filter(|a| a.at >= from && a.at < from + len)
            .map(|a| a.hits)
            .sum()
    }

    /// A limit of 0 never admits: its reset says one window, as `retry-after` does,
    /// not "full again now", which would send a client straight back.
    #[test]
    fn a_zero_limit_resets_in_one_window() {
        let zero = limit(0, 10 * SECOND);
        for hits in [0, 1] {
            let v = decide(&zero, None, T0, hits).verdict;
            assert_eq!((v.remaining, v.reset), (0, 10 * SECOND), "{hits} hits");
        }
    }

    shared_properties!(A);

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn bounded_per_aligned_window_and_any_interval((l, start, steps) in scenarios(A)) {
            let (admitted, _, _) = run(&l, start, &steps);
            for a in admitted.iter().map(|a| a.at) {
                prop_assert!(sum_in(&admitted, a - a % l.window, l.window) <= l.requests);
                prop_assert!(sum_in(&admitted, a, l.window) <= 2 * l.requests);
            }
        }
    }
}
