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
//!
//! A log can hold as many entries as its limit has requests, so no decision reads
//! them all: the state keeps the sum of its hits, the expired entries are a prefix
//! found by bisection, and a denial reads only as many entries as its excess (one,
//! for a request of one hit). [`decide`] still copies the live entries into the
//! state it returns; a store that keeps the state it decides on uses
//! [`decide_in_place`], which drops the expired front and records the admitted hits
//! where they are, in amortised constant time.

use std::collections::VecDeque;

use super::{Limit, Micros, Step, Verdict};

/// Stored state of one sliding_window_log counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// (timestamp, hits admitted at that timestamp), strictly increasing timestamps.
    /// Entries older than one window may remain until a decision drops them; they
    /// are ignored.
    entries: VecDeque<(Micros, u64)>,
    /// The hits of every entry held, live or not.
    total: u128,
}

/// Hits [`decide_in_place`] recorded, which [`State::undo`] takes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Added {
    hits: u64,
    /// Added to the newest entry rather than as a new one.
    merged: bool,
}

impl State {
    /// A log of (timestamp, hits) entries, in strictly increasing timestamp order.
    pub fn new(entries: impl IntoIterator<Item = (Micros, u64)>) -> State {
        let entries: VecDeque<(Micros, u64)> = entries.into_iter().collect();
        let total = entries.iter().map(|&(_, h)| u128::from(h)).sum();
        State { entries, total }
    }

    /// The entries, oldest first; expired ones may remain at the front.
    pub fn entries(&self) -> &VecDeque<(Micros, u64)> {
        &self.entries
    }

    /// Where the live entries start: the expired ones are a prefix.
    fn live_from(&self, window: Micros, now: Micros) -> usize {
        self.entries
            .partition_point(|&(t, _)| !live(t, window, now))
    }

    /// The hits of the entries from `from` on, read from whichever side is shorter.
    fn hits_from(&self, from: usize) -> u128 {
        let sum = |r: std::collections::vec_deque::Iter<'_, (Micros, u64)>| {
            r.map(|&(_, h)| u128::from(h)).sum::<u128>()
        };
        if from <= self.entries.len() / 2 {
            self.total - sum(self.entries.range(..from))
        } else {
            sum(self.entries.range(from..))
        }
    }

    /// Records `hits` admitted at `now` on a log whose entries are all live.
    fn add(&mut self, now: Micros, hits: u64) -> Added {
        self.total += u128::from(hits);
        match self.entries.back_mut() {
            Some((t, h)) if *t >= now => {
                *h += hits; // fits: the live sum stays <= requests
                Added { hits, merged: true }
            }
            _ => {
                self.entries.push_back((now, hits));
                Added {
                    hits,
                    merged: false,
                }
            }
        }
    }

    /// Takes back hits [`decide_in_place`] recorded (the last change to the log).
    pub fn undo(&mut self, added: Added) {
        self.total -= u128::from(added.hits);
        if added.merged {
            if let Some((_, h)) = self.entries.back_mut() {
                *h -= added.hits;
            }
        } else {
            self.entries.pop_back();
        }
    }

    /// Drops the entries that no longer count.
    fn prune(&mut self, window: Micros, now: Micros) {
        while let Some(&(t, h)) = self.entries.front() {
            if live(t, window, now) {
                break;
            }
            self.total -= u128::from(h);
            self.entries.pop_front();
        }
        // A log that held many more entries than it does gives the room back.
        if self.entries.capacity() > 64 && self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
        }
    }

    /// Gives back `hits` from the newest entries (a refund), as far as there are.
    pub(super) fn give_back(&mut self, hits: u64) {
        let mut left = hits;
        while left > 0 {
            let Some(last) = self.entries.back_mut() else {
                break;
            };
            if last.1 > left {
                last.1 -= left;
                self.total -= u128::from(left);
                break;
            }
            left -= last.1;
            self.total -= u128::from(last.1);
            self.entries.pop_back();
        }
    }
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
    let empty = State::default();
    let s = state.unwrap_or(&empty);
    let window = limit.window.max(1);
    let from = s.live_from(window, now);
    let verdict = judge(limit, s, from, now, hits);
    let next = (verdict.admitted && hits > 0).then(|| {
        let live = s.entries.len() - from;
        let mut entries = VecDeque::with_capacity(live + 1);
        entries.extend(s.entries.range(from..).copied());
        let mut next = State {
            entries,
            total: s.hits_from(from),
        };
        next.add(now, hits);
        next
    });
    Step { verdict, next }
}

/// [`decide`] on a state the caller keeps: the expired entries are dropped and an
/// admitted request's hits are recorded in `state` itself. Returns what was
/// recorded, if anything, for [`State::undo`] should the caller not keep the
/// decision. The verdict, and the live entries after, are [`decide`]'s.
pub fn decide_in_place(
    limit: &Limit,
    state: &mut State,
    now: Micros,
    hits: u64,
) -> (Verdict, Option<Added>) {
    state.prune(limit.window.max(1), now);
    let verdict = judge(limit, state, 0, now, hits);
    let added = (verdict.admitted && hits > 0).then(|| state.add(now, hits));
    (verdict, added)
}

/// The verdict on `hits` at `now`, without the state it would leave.
pub(super) fn verdict(limit: &Limit, state: &State, now: Micros, hits: u64) -> Verdict {
    judge(
        limit,
        state,
        state.live_from(limit.window.max(1), now),
        now,
        hits,
    )
}

/// One window after `newest`, the newest live entry (0 without one); always one
/// window for a limit of 0, which is never back to any allowance (as `retry-after`).
fn reset(limit: &Limit, newest: Option<Micros>, now: Micros) -> Micros {
    let window = limit.window.max(1);
    if limit.requests == 0 {
        return window;
    }
    newest.map_or(0, |t| until_expiry(t, window, now))
}

/// The verdict on `hits` at `now` of a log whose live entries start at `from`.
fn judge(limit: &Limit, s: &State, from: usize, now: Micros, hits: u64) -> Verdict {
    let window = limit.window.max(1);
    let used = s.hits_from(from);
    let requests = u128::from(limit.requests);
    // The newest live entry: the newest entry, if it is live.
    let last = s.entries.back().filter(|_| from < s.entries.len());

    if used + u128::from(hits) <= requests {
        let remaining = (requests - used - u128::from(hits)) as u64;
        let at = match last {
            _ if hits == 0 => last.map(|&(t, _)| t),
            Some(&(t, _)) if t >= now => Some(t),
            _ => Some(now),
        };
        return Verdict {
            admitted: true,
            remaining,
            reset: reset(limit, at, now),
            ..Verdict::default()
        };
    }

    // Denied: entries expire oldest first; wait for the first one whose expiry frees
    // enough room. Just before it, that entry still counts, so the wait is exact.
    let mut retry_after = u64::MAX;
    if u128::from(hits) <= requests {
        let excess = used + u128::from(hits) - requests;
        let mut freed = 0u128;
        for &(t, h) in s.entries.range(from..) {
            freed += u128::from(h);
            if freed >= excess {
                retry_after = until_expiry(t, window, now);
                break;
            }
        }
    }
    Verdict {
        admitted: false,
        remaining: requests.saturating_sub(used) as u64,
        reset: reset(limit, last.map(|&(t, _)| t), now),
        retry_after,
        delay: 0,
        next_room: 0,
        owed: 0,
        late: false,
    }
}

/// When the state can be dropped: once its newest entry has left the window.
pub fn expires_at(limit: &Limit, state: &State) -> Micros {
    state
        .entries
        .back()
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
        assert_eq!(own(s).map(|s| s.entries().len()), Some(2));
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
        assert_eq!(own(s).map(|s| s.entries().clone()), Some([(T0, 5)].into()));
    }

    #[test]
    fn clock_stepping_back_records_at_the_latest_timestamp() {
        let l = limit(10, SECOND);
        let mut s = None;
        hit(&l, &mut s, T0, 2);
        hit(&l, &mut s, T0 - 100, 1);
        assert_eq!(own(s).map(|s| s.entries().clone()), Some([(T0, 3)].into()));
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

    /// The live entries of a state, as a decision reads them.
    fn live_entries(s: &super::State, l: &Limit, now: Micros) -> Vec<(Micros, u64)> {
        s.entries()
            .iter()
            .copied()
            .filter(|&(t, _)| super::live(t, l.window.max(1), now))
            .collect()
    }

    #[test]
    fn a_long_log_decided_in_place_keeps_only_its_window() {
        // 60,000 a minute, one a millisecond for two minutes: the first minute's
        // entries go as the second's come.
        let l = limit(60_000, 60 * SECOND);
        let mut s = super::State::default();
        for ms in 0..120_000 {
            let (v, added) = super::decide_in_place(&l, &mut s, T0 + ms * 1000, 1);
            assert!(v.admitted, "{ms}");
            assert!(added.is_some());
        }
        assert_eq!(s.entries().len(), 60_000);
        assert_eq!(s.entries().front(), Some(&(T0 + 60_000_000, 1)));
        let (v, added) = super::decide_in_place(&l, &mut s, T0 + 119_999_999, 1);
        assert!(!v.admitted && added.is_none());
        assert_eq!(v.retry_after, 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Deciding in place answers as deciding on the stored state and storing its
        /// next does, and leaves the same live entries; a change taken back leaves
        /// the state as if the request had not come.
        #[test]
        fn deciding_in_place_answers_and_stores_as_deciding_on_a_copy(
            (l, start, steps) in scenarios(A),
            kept in prop::collection::vec(any::<bool>(), 60),
        ) {
            let mut copied: Option<State> = None;
            let mut held = State::SlidingWindowLog(super::State::default());
            let mut now = start;
            for (&(dt, hits), keep) in steps.iter().zip(kept) {
                now += dt;
                let want = decide(&l, copied.as_ref(), now, hits);
                let (got, change) = crate::algorithm::decide_in_place(&l, &mut held, now, hits)
                    .expect("decided in place");
                prop_assert_eq!(got, want.verdict);
                prop_assert_eq!(change.changed(), want.next.is_some());
                if keep {
                    if let Some(n) = want.next {
                        copied = Some(n);
                    }
                } else {
                    crate::algorithm::undo(&mut held, change);
                }
                let want_live = match &copied {
                    Some(State::SlidingWindowLog(c)) => live_entries(c, &l, now),
                    _ => Vec::new(),
                };
                let State::SlidingWindowLog(h) = &held else {
                    unreachable!("a log stays a log")
                };
                prop_assert_eq!(live_entries(h, &l, now), want_live);
            }
        }
    }

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
                let entries = s.entries();
                prop_assert!(entries.len() as u64 <= l.requests);
                prop_assert!(entries.iter().zip(entries.iter().skip(1)).all(|(a, b)| a.0 < b.0));
            }
        }
    }
}
