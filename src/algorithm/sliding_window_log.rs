//! sliding_window_log: every admitted hit's timestamp, kept for one window. Exact.
//!
//! An entry recorded at `t` counts while `now < t + window`, i.e. over the half-open
//! interval [t, t + window). A request of `hits` at `now` is admitted when
//! sum(hits of entries with t + window > now) + hits <= requests. Since every entry in
//! any interval [a, a + window) that contains `now` satisfies t > now - window, it was
//! counted, so admitted hits in any such interval never exceed `requests`.
//!
//! Entries are (timestamp, hits) pairs in strictly increasing timestamp order: hits
//! admitted in the same microsecond share one entry. If the clock steps back, the new
//! hits are recorded at the latest stored timestamp instead, which only makes them
//! count longer. Memory is at most `requests` entries per counter.

use super::{Limit, Micros, Step, Verdict};

/// Stored state of one sliding_window_log counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// (timestamp, hits admitted at that timestamp), strictly increasing timestamps.
    /// Entries older than one window may remain until the next admitted request
    /// prunes them; they are ignored.
    pub entries: Vec<(Micros, u64)>,
}

/// Whether an entry at `t` still counts at `now`.
fn live(t: Micros, window: Micros, now: Micros) -> bool {
    u128::from(t) + u128::from(window) > u128::from(now)
}

/// `t + window - now` for a live entry, saturated to `u64::MAX` (which reads as never).
fn until_expiry(t: Micros, window: Micros, now: Micros) -> Micros {
    let d = u128::from(t) + u128::from(window) - u128::from(now);
    u64::try_from(d).unwrap_or(u64::MAX)
}

/// Decides one request of `hits` at `now`.
pub fn decide(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Step<State> {
    let window = limit.window.max(1);
    let entries: &[(Micros, u64)] = state.map_or(&[], |s| &s.entries);
    // Timestamps increase, so the expired entries are a prefix.
    let live_entries = &entries[entries.partition_point(|&(t, _)| !live(t, window, now))..];
    let used: u128 = live_entries.iter().map(|&(_, h)| u128::from(h)).sum();
    let requests = u128::from(limit.requests);

    if used + u128::from(hits) <= requests {
        let remaining = (requests - used - u128::from(hits)) as u64;
        let (next, last) = if hits == 0 {
            (None, live_entries.last().map(|&(t, _)| t))
        } else {
            let mut kept = Vec::with_capacity(live_entries.len() + 1);
            kept.extend_from_slice(live_entries);
            let at = match kept.last_mut() {
                Some((t, h)) if *t >= now => {
                    *h += hits; // fits: the live sum stays <= requests
                    *t
                }
                _ => {
                    kept.push((now, hits));
                    now
                }
            };
            (Some(State { entries: kept }), Some(at))
        };
        return Step {
            verdict: Verdict {
                admitted: true,
                remaining,
                reset: last.map_or(0, |t| until_expiry(t, window, now)),
                ..Verdict::default()
            },
            next,
        };
    }

    // Denied: entries expire oldest first; wait for the first one whose expiry frees
    // enough room. Just before it, that entry still counts, so the wait is exact.
    let mut retry_after = u64::MAX;
    if u128::from(hits) <= requests {
        let excess = used + u128::from(hits) - requests;
        let mut freed = 0u128;
        for &(t, h) in live_entries {
            freed += u128::from(h);
            if freed >= excess {
                retry_after = until_expiry(t, window, now);
                break;
            }
        }
    }
    Step {
        verdict: Verdict {
            admitted: false,
            remaining: requests.saturating_sub(used) as u64,
            reset: live_entries
                .last()
                .map_or(0, |&(t, _)| until_expiry(t, window, now)),
            retry_after,
            delay: 0,
            next_room: 0,
            owed: 0,
            late: false,
        },
        next: None,
    }
}

/// When the state can be dropped: once its newest entry has left the window.
pub fn expires_at(limit: &Limit, state: &State) -> Micros {
    state
        .entries
        .last()
        .map_or(0, |&(t, _)| t.saturating_add(limit.window.max(1)))
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testkit::{self, hit, run, scenarios, shared_properties};
    use crate::algorithm::{decide, Algorithm, Limit, Micros, State, SECOND};
    use proptest::prelude::*;

    const A: Algorithm = Algorithm::SlidingWindowLog;

    /// Off any window boundary: nothing here may depend on alignment.
    const T0: Micros = testkit::T0 + 123_456;

    fn limit(requests: u64, window: Micros) -> Limit {
        testkit::limit(A, requests, window, requests)
    }

    fn own(s: Option<State>) -> Option<super::State> {
        s.map(|s| match s {
            State::SlidingWindowLog(s) => s,
            other => panic!("not a sliding_window_log state: {other:?}"),
        })
    }

    #[test]
    fn entries_expire_exactly_one_window_later() {
        let l = limit(2, 10 * SECOND);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 1).admitted);
        let v = hit(&l, &mut s, T0 + 3 * SECOND, 1);
        assert!(v.admitted);
        assert_eq!(v.remaining, 0);
        assert_eq!(v.reset, 10 * SECOND);
        let v = hit(&l, &mut s, T0 + 5 * SECOND, 1);
        assert!(!v.admitted);
        assert_eq!(v.retry_after, 5 * SECOND);
        assert_eq!(v.reset, 8 * SECOND);
        assert!(!hit(&l, &mut s, T0 + 10 * SECOND - 1, 1).admitted);
        let v = hit(&l, &mut s, T0 + 10 * SECOND, 1);
        assert!(v.admitted);
        assert_eq!(v.remaining, 0);
        // The first entry was pruned.
        assert_eq!(own(s).map(|s| s.entries.len()), Some(2));
    }

    #[test]
    fn retry_waits_for_enough_entries_to_expire() {
        let l = limit(5, 10 * SECOND);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 2).admitted);
        assert!(hit(&l, &mut s, T0 + SECOND, 1).admitted);
        assert!(hit(&l, &mut s, T0 + 2 * SECOND, 2).admitted);
        // 3 hits need 3 free: the entries at T0 (2) and T0+1s (1) must go.
        let v = hit(&l, &mut s, T0 + 2 * SECOND, 3);
        assert!(!v.admitted);
        assert_eq!(v.retry_after, 9 * SECOND);
        // 4 need the one at T0+2s gone too.
        assert_eq!(hit(&l, &mut s, T0 + 2 * SECOND, 4).retry_after, 10 * SECOND);
        assert_eq!(hit(&l, &mut s, T0 + 2 * SECOND, 6).retry_after, u64::MAX);
        // Checks: admitted at exactly the limit, no state change.
        let step = decide(&l, s.as_ref(), T0 + 2 * SECOND, 0);
        assert!(step.verdict.admitted);
        assert_eq!(step.next, None);
    }

    #[test]
    fn same_microsecond_hits_share_an_entry() {
        let l = limit(10, SECOND);
        let mut s = None;
        hit(&l, &mut s, T0, 2);
        hit(&l, &mut s, T0, 3);
        assert_eq!(own(s).map(|s| s.entries), Some(vec![(T0, 5)]));
    }

    #[test]
    fn clock_stepping_back_records_at_the_latest_timestamp() {
        let l = limit(10, SECOND);
        let mut s = None;
        hit(&l, &mut s, T0, 2);
        hit(&l, &mut s, T0 - 100, 1);
        assert_eq!(own(s).map(|s| s.entries), Some(vec![(T0, 3)]));
    }

    #[test]
    fn zero_requests_and_extremes() {
        let l = limit(0, SECOND);
        assert_eq!(decide(&l, None, T0, 1).verdict.retry_after, u64::MAX);
        assert!(decide(&l, None, T0, 0).verdict.admitted);
        let big = limit(u64::MAX, u64::MAX);
        let mut s = None;
        assert!(hit(&big, &mut s, u64::MAX, u64::MAX).admitted);
        let v = hit(&big, &mut s, u64::MAX, 1);
        assert!(!v.admitted);
        assert_eq!(v.retry_after, u64::MAX);
    }

    shared_properties!(A);

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn never_more_than_requests_in_any_window_interval(
            (l, start, steps) in scenarios(A),
        ) {
            let (admitted, s, _) = run(&l, start, &steps);
            // The busiest interval [a, a + window) starts at an admitted timestamp.
            for a in admitted.iter().map(|a| a.at) {
                let sum: u64 = admitted
                    .iter()
                    .filter(|b| b.at >= a && b.at < a + l.window)
                    .map(|b| b.hits)
                    .sum();
                prop_assert!(sum <= l.requests, "{} hits in [{}, +{})", sum, a, l.window);
            }
            if let Some(s) = own(s) {
                prop_assert!(s.entries.len() as u64 <= l.requests);
                prop_assert!(s.entries.windows(2).all(|p| p[0].0 < p[1].0));
            }
        }
    }
}
