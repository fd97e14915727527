//! fixed_window: one counter per window aligned to the Unix epoch (or to the limit's
//! `phase`: a calendar window's local midnight).
//!
//! window_start = now - (now - phase) mod window. A request of `hits` is admitted when
//! count + hits <= requests, where count is the stored count if the stored window is
//! the current one and 0 otherwise. A denied request can only go through once the
//! window ends, so retry_after = window_start + window - now (exact), or `u64::MAX`
//! when hits > requests.

use super::{Limit, Micros, Step, Verdict};

/// Stored state of one fixed_window counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// Start of the window the count belongs to (a multiple of the window length).
    pub window_start: Micros,
    /// Hits admitted in that window.
    pub count: u64,
}

/// Decides one request of `hits` at `now`.
pub fn decide(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Step<State> {
    let window = limit.window.max(1);
    let current = window_start(now, window, limit.phase);
    let (start, count) = match state {
        // A stored window later than `now` means the clock stepped back: keep counting
        // in it rather than forget hits already admitted.
        Some(s) if s.window_start >= current && s.window_start % window == limit.phase % window => {
            (s.window_start, s.count)
        }
        // A window off this limit's grid is one of another length (the policy's unit
        // changed) that started in the current window: its hits were admitted in this
        // one and count here, which ends where this limit's windows end.
        Some(s) if s.window_start >= current => (current, s.count),
        _ => (current, 0),
    };
    let end = start.saturating_add(window);
    let reset = end.saturating_sub(now);
    let used = u128::from(count) + u128::from(hits);
    if used <= u128::from(limit.requests) {
        // `used` fits in u64 here because it is at most `requests`.
        let used = used as u64;
        let next = (hits > 0).then_some(State {
            window_start: start,
            count: used,
        });
        return Step {
            verdict: Verdict {
                admitted: true,
                remaining: limit.requests - used,
                reset,
                ..Verdict::default()
            },
            next,
        };
    }
    // Denied: the next window starts empty, so any request of at most `requests` hits
    // goes through there and nothing earlier changes the count.
    // (`reset` is 0 only when the window end saturated at the end of time.)
    let retry_after = if hits > limit.requests || reset == 0 {
        u64::MAX
    } else {
        reset
    };
    Step {
        verdict: Verdict {
            admitted: false,
            remaining: limit.requests.saturating_sub(count),
            reset,
            retry_after,
            delay: 0,
            next_room: 0,
            owed: 0,
            late: false,
        },
        next: None,
    }
}

/// The start of the window holding `now`: the latest time at or before `now` that is
/// `phase` modulo `window`.
pub fn window_start(now: Micros, window: Micros, phase: Micros) -> Micros {
    let (phase, r) = (phase % window, now % window);
    // How far `now` is into its window; below `window`, and no sum overflows.
    let into = if r >= phase {
        r - phase
    } else {
        r + (window - phase)
    };
    // Before the first window (a test's early clock): the epoch.
    now.saturating_sub(into)
}

/// When the state can be dropped: once its window has ended, the count no longer
/// applies.
pub fn expires_at(limit: &Limit, state: &State) -> Micros {
    state.window_start.saturating_add(limit.window.max(1))
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testkit::{self, hit, run, scenarios, shared_properties, T0};
    use crate::algorithm::{decide, Algorithm, Limit, Micros, State, SECOND};
    use proptest::prelude::*;

    const A: Algorithm = Algorithm::FixedWindow;

    fn limit(requests: u64, window: Micros) -> Limit {
        testkit::limit(A, requests, window, requests)
    }

    #[test]
    fn a_shorter_windows_count_carries_into_a_longer_one_that_ends_on_its_own_grid() {
        // A per-second limit made per-minute mid-minute (T0 is 20 s into a minute, so
        // the minute ends at T0 + 40 s).
        let now = T0 + 30 * SECOND + SECOND / 2;
        let mut s = None;
        for _ in 0..3 {
            assert!(hit(&limit(5, SECOND), &mut s, now, 1).admitted);
        }
        let minute = limit(5, 60 * SECOND);
        let v = hit(&minute, &mut s, now, 1);
        assert!(v.admitted);
        assert_eq!(v.remaining, 1, "the second's hits count in the minute");
        assert_eq!(
            v.reset,
            9 * SECOND + SECOND / 2,
            "the minute ends at T0 + 40 s"
        );
        let v = hit(&minute, &mut s, now, 2);
        assert!(!v.admitted);
        assert_eq!(v.retry_after, 9 * SECOND + SECOND / 2);
        assert!(hit(&minute, &mut s, T0 + 40 * SECOND, 5).admitted);
    }

    #[test]
    fn admits_up_to_the_limit_then_denies_until_the_window_ends() {
        let l = limit(3, 10 * SECOND);
        let mut s = None;
        let now = T0 + 4 * SECOND;
        for left in (0..3).rev() {
            let v = hit(&l, &mut s, now, 1);
            assert!(v.admitted);
            assert_eq!(v.remaining, left);
            assert_eq!(v.reset, 6 * SECOND);
            assert_eq!(v.retry_after, 0);
            assert_eq!(v.delay, 0);
        }
        let v = hit(&l, &mut s, now, 1);
        assert!(!v.admitted);
        assert_eq!(v.remaining, 0);
        assert_eq!(v.retry_after, 6 * SECOND);
        // Last microsecond of the window: still denied; first of the next: admitted.
        assert!(!hit(&l, &mut s, T0 + 10 * SECOND - 1, 1).admitted);
        let v = hit(&l, &mut s, T0 + 10 * SECOND, 1);
        assert!(v.admitted);
        assert_eq!(v.remaining, 2);
        assert_eq!(v.reset, 10 * SECOND);
    }

    #[test]
    fn multiple_hits_and_checks() {
        let l = limit(5, SECOND);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 3).admitted);
        let v = hit(&l, &mut s, T0, 3);
        assert!(!v.admitted);
        assert_eq!(v.remaining, 2);
        assert_eq!(v.retry_after, SECOND);
        // A check neither counts nor is denied at exactly the limit.
        let step = decide(&l, s.as_ref(), T0, 0);
        assert!(step.verdict.admitted);
        assert_eq!(step.verdict.remaining, 2);
        assert_eq!(step.next, None);
        assert!(hit(&l, &mut s, T0, 2).admitted);
        assert!(decide(&l, s.as_ref(), T0, 0).verdict.admitted);
        // More than the limit can never go through.
        assert_eq!(hit(&l, &mut s, T0, 6).retry_after, u64::MAX);
    }

    #[test]
    fn check_is_denied_when_already_over_a_lowered_limit() {
        let s = State::FixedWindow(super::State {
            window_start: T0,
            count: 5,
        });
        let v = decide(&limit(3, SECOND), Some(&s), T0 + 10, 0).verdict;
        assert!(!v.admitted);
        assert_eq!(v.retry_after, SECOND - 10);
    }

    #[test]
    fn zero_requests_denies_everything() {
        let l = limit(0, SECOND);
        let v = decide(&l, None, T0, 1);
        assert!(!v.verdict.admitted);
        assert_eq!(v.verdict.retry_after, u64::MAX);
        assert_eq!(v.next, None);
        let v = decide(&l, None, T0, 0).verdict;
        assert!(v.admitted);
        assert_eq!(v.remaining, 0);
    }

    #[test]
    fn tiny_window_and_extreme_times_do_not_panic() {
        let l = limit(1, 1);
        let mut s = None;
        assert!(hit(&l, &mut s, 0, 1).admitted);
        let v = hit(&l, &mut s, 0, 1);
        assert_eq!(v.retry_after, 1);
        assert!(hit(&l, &mut s, 1, 1).admitted);
        let big = limit(u64::MAX, u64::MAX);
        let mut s = None;
        assert!(hit(&big, &mut s, u64::MAX, u64::MAX).admitted);
        assert!(!hit(&big, &mut s, u64::MAX, 1).admitted);
    }

    #[test]
    fn clock_stepping_back_keeps_the_newer_window() {
        let l = limit(1, SECOND);
        let mut s = None;
        assert!(hit(&l, &mut s, T0 + SECOND, 1).admitted);
        assert!(!hit(&l, &mut s, T0 + SECOND - 1, 1).admitted);
    }

    #[test]
    fn a_window_after_a_clock_step_back_resets_when_the_newer_window_ends() {
        // The count is the newer window's, so the wait is until that window ends:
        // telling the end of the older one would send the client back while denied.
        for phase in [0, 3 * SECOND] {
            let mut l = limit(1, 10 * SECOND);
            l.phase = phase;
            let newer = T0 + 10 * SECOND + phase;
            let mut s = None;
            assert!(hit(&l, &mut s, newer, 1).admitted);
            let now = newer - 1;
            let v = hit(&l, &mut s, now, 1);
            assert!(!v.admitted);
            assert_eq!((v.remaining, v.reset), (0, 10 * SECOND + 1), "{phase}");
            assert_eq!(v.retry_after, 10 * SECOND + 1, "{phase}");
            assert!(!hit(&l, &mut s, newer + 10 * SECOND - 1, 1).admitted);
            assert!(hit(&l, &mut s, newer + 10 * SECOND, 1).admitted);
        }
    }

    #[test]
    fn a_phase_moves_every_window_start() {
        // Windows of 10 s starting at 3 s past each multiple of 10 s.
        let mut l = limit(1, 10 * SECOND);
        l.phase = 3 * SECOND;
        let mut s = None;
        let v = hit(&l, &mut s, T0 + 2 * SECOND, 1);
        assert!(v.admitted);
        // That window started at T0 - 7 s and ends at T0 + 3 s.
        assert_eq!(v.reset, SECOND);
        assert!(!hit(&l, &mut s, T0 + 3 * SECOND - 1, 1).admitted);
        let v = hit(&l, &mut s, T0 + 3 * SECOND, 1);
        assert!(v.admitted);
        assert_eq!(v.reset, 10 * SECOND);
        assert_eq!(
            super::window_start(T0 + 12 * SECOND, 10 * SECOND, 3 * SECOND),
            T0 + 3 * SECOND
        );
        // A phase of a whole window is no phase; a time before the first window is
        // the epoch's.
        assert_eq!(super::window_start(T0 + 5, 10 * SECOND, 10 * SECOND), T0);
        assert_eq!(super::window_start(2, 10, 7), 0);
    }

    shared_properties!(A);

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn never_more_than_requests_per_aligned_window((l, start, steps) in scenarios(A)) {
            let (admitted, _, _) = run(&l, start, &steps);
            for a in &admitted {
                let w0 = a.at - a.at % l.window;
                let sum: u64 = admitted
                    .iter()
                    .filter(|b| b.at >= w0 && b.at < w0 + l.window)
                    .map(|b| b.hits)
                    .sum();
                prop_assert!(sum <= l.requests);
            }
        }
    }
}
