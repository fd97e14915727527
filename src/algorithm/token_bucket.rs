//! token_bucket: capacity `burst`, refilled continuously at `requests` per `window`.
//!
//! Stored as GCRA: the theoretical arrival time at which the bucket is full again.
//! Each hit costs window / requests µs (the emission interval), so at `now` the
//! bucket holds burst - (max(tat, now) - now) * requests / window tokens.
//!
//! The arithmetic is exact, in ticks of 1 / requests µs, where a hit costs exactly
//! `window` ticks: nothing is rounded per request, so rounding errors cannot add up
//! and a full bucket gives its whole burst at one instant however it is split into
//! requests. The exact tat is stored as whole microseconds rounded up, `tat`, and
//! what that rounding added, `rem` ticks (0 <= rem < requests): exact tat = tat - rem
//! / requests. With base = max(exact tat, now), a request of `hits` is admitted when
//!
//!   hits <= burst  and  (base - now) * requests <= (burst - hits) * window
//!
//! and then the exact tat becomes base + hits * window / requests. So over any span T
//! admitted hits stay <= burst + requests * T / window, exactly. A check (`hits ==
//! 0`) is refused only when the bucket owes more than its capacity rounded up to a
//! microsecond, tat - now > ceil(burst * window / requests): never for a state this
//! limit wrote, nor for one an older sluice wrote (it rounded each cost up and kept
//! no remainder, so its state reads as rem = 0, the rounded-up time), only for a
//! state of another limit (a larger burst before a policy change). `requests == 0`
//! admits nothing, and its reset is one window.
//!
//! A state also names the rate it was written under. Read under another rate (a
//! policy changed since), the bucket owes the same hits, not the same time: its
//! backlog is rescaled, exactly, to backlog * window / old window ticks of the new
//! rate (rounded up to a tick), and the state is rewritten so (`rebase`), whatever
//! the decision, so that the debt drains at the new rate from the change on. So a
//! bucket emptied under 5 a minute and made 5 a second owes 5 hits, one second,
//! not the rest of the minute, and one lowered from 10 to 5 after 8 hits owes 8, as
//! the window algorithms keep their count. A state without a rate (written by an
//! older sluice) reads as written under the limit in force. A debt the scripts'
//! doubles cannot rescale (the old backlog's whole hits reach 2^53) keeps its time;
//! one whose rescaled tat would reach [`END_OF_TIME`] lasts until just before it;
//! both as decide.lua does.
//!
//! The same arithmetic serves leaky_bucket, where the tat is when the queue drains.

use super::{Limit, Micros, Step, Verdict};

/// The first microsecond a bucket's state may not reach: the Redis scripts count
/// time in doubles, exact below 2^53 (the year 2255), so both stores stop there.
pub const END_OF_TIME: Micros = 1 << 53;

/// Stored state of one token_bucket counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// Theoretical arrival time, when the bucket is full again, in microseconds
    /// rounded up.
    pub tat: Micros,
    /// What the rounding up added, in 1 / requests µs: the exact time is tat - rem /
    /// requests. Below `requests`; a larger value (a state of another limit) reads as
    /// 0.
    pub rem: u64,
    /// The rate `tat` and `rem` count in.
    pub rate: Rate,
}

/// The rate a bucket's state was written under: `requests` per `window`. Zero
/// (`Rate::default()`) in a state an older sluice wrote: read as the limit's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rate {
    pub requests: u64,
    pub window: Micros,
}

impl Rate {
    /// The rate of `limit`, as its states record it.
    pub fn of(limit: &Limit) -> Rate {
        Rate {
            requests: limit.requests,
            window: limit.window.max(1),
        }
    }
}

/// Admission arithmetic shared with leaky_bucket, in ticks of 1 / requests µs.
/// `requests > 0` everywhere.
pub(super) struct Gcra {
    burst: u64,
    /// The limit's rate, which its states record.
    pub(super) rate: Rate,
}

/// The state after an admission.
pub(super) struct Next {
    pub(super) tat: Micros,
    pub(super) rem: u64,
    /// Its backlog at the decision's `now`, in ticks.
    pub(super) backlog: u128,
}

/// Where a decision at `now` starts.
pub(super) struct Start {
    now: Micros,
    /// max(exact tat, now) - now in ticks: what the bucket owes (the queue holds).
    /// Relative to `now`, so that its divisions stay on small numbers.
    pub(super) backlog: u128,
}

impl Gcra {
    /// `None` when `requests == 0` (nothing is ever admitted).
    pub(super) fn new(limit: &Limit) -> Option<Gcra> {
        (limit.requests > 0).then(|| Gcra {
            burst: limit.burst,
            rate: Rate::of(limit),
        })
    }

    /// Ticks in a microsecond: the limit's requests.
    fn requests(&self) -> u128 {
        u128::from(self.rate.requests)
    }

    /// Ticks in a hit: the limit's window in µs.
    fn window(&self) -> u128 {
        u128::from(self.rate.window)
    }

    /// Whether a state written under `rate` counts in this limit's ticks: its own
    /// rate, or none (an older sluice's).
    fn counts_in(&self, rate: Rate) -> bool {
        rate.requests == 0 || rate.window == 0 || rate == self.rate
    }

    /// The decision's backlog at `now` for a stored (tat, rem) written under `rate`.
    pub(super) fn start(&self, state: Option<(Micros, u64, Rate)>, now: Micros) -> Start {
        let backlog = match state {
            Some((tat, rem, rate)) if tat > now => {
                let kept = || backlog(tat - now, rem, self.requests());
                if self.counts_in(rate) {
                    kept()
                } else {
                    self.rescaled(tat - now, rem, rate, now)
                        .unwrap_or_else(kept)
                }
            }
            // The exact tat is at most `tat`, so not after now.
            _ => 0,
        };
        Start { now, backlog }
    }

    /// The backlog of a tat `ahead` µs after now less `rem` ticks, both of `rate`,
    /// as ticks of this limit owing the same hits: old * window / rate.window,
    /// rounded up, at most that of a tat just before [`END_OF_TIME`]. `None` when
    /// ahead * rate.requests / rate.window reaches 2^53: decide.lua's doubles count
    /// no further.
    fn rescaled(&self, ahead: Micros, rem: u64, rate: Rate, now: Micros) -> Option<u128> {
        let (requests, window) = (u128::from(rate.requests), u128::from(rate.window));
        if u128::from(ahead) * requests / window >= 1 << 53 {
            return None;
        }
        let old = backlog(ahead, rem, requests);
        let (hits, part) = (old / window, old % window);
        // hits < 2^53 and both windows fit in u64: no overflow.
        let owed = hits * self.window() + (part * self.window()).div_ceil(window);
        let end = u128::from((END_OF_TIME - 1).saturating_sub(now)) * self.requests();
        Some(owed.min(end))
    }

    /// `backlog` ticks in whole microseconds, rounded up: the stored tat - now.
    pub(super) fn wait(&self, backlog: u128) -> Micros {
        // At most the stored tat, so it fits.
        backlog.div_ceil(self.requests()) as Micros
    }

    /// Whether `hits` fit with `backlog` ticks owed: backlog <= (burst - hits) *
    /// window; for a check, wait(backlog) <= ceil(burst * window / requests).
    pub(super) fn fits(&self, backlog: u128, hits: u64) -> bool {
        let Some(room) = self.burst.checked_sub(hits) else {
            return false;
        };
        let room = u128::from(room) * self.window();
        if hits == 0 {
            u128::from(self.wait(backlog)) <= room.div_ceil(self.requests())
        } else {
            backlog <= room
        }
    }

    /// The state once `hits` are added at max(exact tat, now). `None` if its tat
    /// is not before [`END_OF_TIME`], as decide.lua's `gcra` counts.
    pub(super) fn next(&self, start: &Start, hits: u64) -> Option<Next> {
        let backlog = start
            .backlog
            .checked_add(u128::from(hits) * self.window())?;
        let whole = backlog / self.requests();
        let part = backlog - whole * self.requests();
        let (ahead, rem) = if part == 0 {
            (whole, 0)
        } else {
            (whole + 1, self.requests() - part)
        };
        let tat = start.now.checked_add(Micros::try_from(ahead).ok()?)?;
        Some(Next {
            tat: (tat < END_OF_TIME).then_some(tat)?,
            // rem < requests <= u64::MAX.
            rem: rem as u64,
            backlog,
        })
    }

    /// Hits that still fit with `backlog` ticks owed: burst - ceil(backlog / window),
    /// at least 0.
    pub(super) fn remaining(&self, backlog: u128) -> u64 {
        let owed = backlog.div_ceil(self.window());
        // At most `burst`, so it fits in u64.
        u128::from(self.burst).saturating_sub(owed) as u64
    }

    /// For a denied request: the wait until `hits` fit, the first whole microsecond
    /// at which the backlog has shrunk to what they allow. `u64::MAX` when hits >
    /// burst.
    pub(super) fn retry_after(&self, start: &Start, hits: u64) -> Micros {
        let Some(room) = self.burst.checked_sub(hits) else {
            return u64::MAX;
        };
        let room = u128::from(room) * self.window();
        let wait = if hits == 0 {
            u128::from(self.wait(start.backlog)).saturating_sub(room.div_ceil(self.requests()))
        } else {
            start.backlog.saturating_sub(room).div_ceil(self.requests())
        };
        // At most the stored tat - now, so it fits.
        wait as Micros
    }
}

/// The backlog of a stored tat `ahead` µs after now, less `rem` ticks of 1 /
/// `requests` µs; a remainder not below `requests` (another limit's) reads as 0.
fn backlog(ahead: Micros, rem: u64, requests: u128) -> u128 {
    let rem = u128::from(rem);
    let rem = if rem < requests { rem } else { 0 };
    // ahead * requests >= requests > rem.
    u128::from(ahead) * requests - rem
}

/// Decides one request of `hits` at `now`.
pub fn decide(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Step<State> {
    let Some(g) = Gcra::new(limit) else {
        return never(hits, limit.window.max(1));
    };
    let start = g.start(state.map(|s| (s.tat, s.rem, s.rate)), now);
    let next = g.next(&start, hits);
    if g.fits(start.backlog, hits) {
        if hits == 0 {
            return admit(g.remaining(start.backlog), g.wait(start.backlog), None);
        }
        if let Some(n) = next {
            let state = State {
                tat: n.tat,
                rem: n.rem,
                rate: g.rate,
            };
            return admit(g.remaining(n.backlog), n.tat - now, Some(state));
        }
    }
    // Waiting never shrinks base + cost below its value now, so a cost that runs past
    // the end of time never fits.
    let retry_after = match next {
        Some(_) => g.retry_after(&start, hits),
        None => u64::MAX,
    };
    Step {
        verdict: Verdict {
            admitted: false,
            remaining: g.remaining(start.backlog),
            reset: g.wait(start.backlog),
            retry_after,
            delay: 0,
            next_room: 0,
            owed: 0,
            late: false,
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

/// `requests == 0`: checks pass, every hit is denied for good. The bucket is full
/// (of nothing) at once, but a client told a reset of 0 would come straight back:
/// the reset is one window, as `retry-after` says. The leaky bucket's queue, which
/// never drains, answers the same.
pub(super) fn never<S>(hits: u64, window: Micros) -> Step<S> {
    Step {
        verdict: Verdict {
            admitted: hits == 0,
            reset: window,
            retry_after: if hits == 0 { 0 } else { u64::MAX },
            ..Verdict::default()
        },
        next: None,
    }
}

/// Rewrites a bucket's state written under another rate than `limit`'s in that
/// rate, owing what it owes at `now` (see the module doc), in place; whether it
/// changed. Not when it already counts in that rate, has none, is full, or the
/// limit admits nothing. Stored whatever the decision, so that the debt drains at
/// the new rate from the change on: read afresh each time, it would drain at the
/// old one. Serves leaky_bucket's state too.
pub fn rebase(limit: &Limit, state: &mut State, now: Micros) -> bool {
    let Some(g) = Gcra::new(limit) else {
        return false;
    };
    if state.tat <= now || g.counts_in(state.rate) {
        return false;
    }
    let start = g.start(Some((state.tat, state.rem, state.rate)), now);
    let Some(n) = g.next(&start, 0) else {
        return false;
    };
    *state = State {
        tat: n.tat,
        rem: n.rem,
        rate: g.rate,
    };
    true
}

/// When the state can be dropped: once the bucket is full again.
pub fn expires_at(_limit: &Limit, state: &State) -> Micros {
    state.tat
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testkit::{self, bucket_splits, hit, run, scenarios, shared_properties};
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
        assert_eq!(
            s,
            Some(State::TokenBucket(super::State {
                tat: 104,
                rem: 2,
                rate: super::Rate::of(&l)
            }))
        );
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
        use super::END_OF_TIME;
        let l = limit(1, (END_OF_TIME - T0) / 2 + 1, 2);
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
        assert!(hit(&big, &mut s, END_OF_TIME - 2, u64::MAX).admitted);
        assert!(!hit(&big, &mut s, END_OF_TIME - 1, u64::MAX).admitted);
        assert!(
            !hit(&big, &mut s, u64::MAX, 1).admitted,
            "past the end of time"
        );
    }

    const DAY: Micros = 86_400 * SECOND;

    /// Every way of cutting `n` hits into requests, in order.
    fn every_split(n: u64) -> Vec<Vec<u64>> {
        if n == 0 {
            return vec![Vec::new()];
        }
        (1..=n)
            .flat_map(|first| {
                every_split(n - first).into_iter().map(move |mut rest| {
                    rest.insert(0, first);
                    rest
                })
            })
            .collect()
    }

    #[test]
    fn an_uneven_interval_gives_the_whole_burst_at_one_instant_in_every_split() {
        // 333,333.3 µs and 2,335,135,135.1 µs per token: rounding each cost up would
        // deny the last hit of the burst.
        for l in [limit(3, SECOND, 3), limit(7, 1_000, 7), limit(3, 10, 3)] {
            for parts in every_split(l.burst) {
                testkit::whole_burst_at_one_instant(&l, T0, &parts).unwrap();
            }
        }
        let l = limit(37, DAY, 37);
        let mut splits = vec![
            vec![1; 37],
            vec![37],
            vec![5; 7].into_iter().chain([2]).collect(),
        ];
        splits.extend((1..37).map(|k| vec![k, 37 - k]));
        splits.extend((1..36).map(|k| vec![1; k].into_iter().chain([37 - k as u64]).collect()));
        for parts in splits {
            testkit::whole_burst_at_one_instant(&l, T0, &parts).unwrap();
        }
    }

    #[test]
    fn two_of_three_leave_one() {
        let l = limit(3, SECOND, 3);
        let mut s = None;
        assert_eq!(hit(&l, &mut s, T0, 2).remaining, 1);
        // Exactly two intervals owed: 666,666 µs and two thirds, stored rounded up.
        assert_eq!(
            s,
            Some(State::TokenBucket(super::State {
                tat: T0 + 666_667,
                rem: 1,
                rate: super::Rate::of(&l)
            }))
        );
        let v = hit(&l, &mut s, T0, 1);
        assert!(v.admitted);
        assert_eq!((v.remaining, v.reset), (0, SECOND));
    }

    #[test]
    fn dense_attempts_get_exactly_burst_plus_rate_times_span() {
        // One attempt after another, every 100 ms for 10 s at 3 per second, and every
        // hour for a day at 37 a day: the bound is met exactly at the span's end, where
        // the last token comes back at the very microsecond.
        for (l, step, steps, most) in [
            (limit(3, SECOND, 3), 100_000, 100, 3 + 30),
            (limit(37, DAY, 37), DAY / 24, 24, 37 + 37),
        ] {
            let mut s = None;
            let mut admitted = 0;
            for k in 0..=steps {
                while hit(&l, &mut s, T0 + k * step, 1).admitted {
                    admitted += 1;
                }
            }
            assert_eq!(admitted, most, "{l:?}");
        }
    }

    #[test]
    fn a_state_without_remainder_reads_as_rounded_up() {
        // An older sluice stored 2 of 3 per second as tat + 666,668 (each cost rounded
        // up) and no remainder: read as that time, it still denies the third hit, and
        // admits it 2 µs later.
        let l = limit(3, SECOND, 3);
        let old = State::TokenBucket(super::State {
            tat: T0 + 666_668,
            rem: 0,
            rate: Default::default(),
        });
        let v = decide(&l, Some(&old), T0, 1).verdict;
        assert!(!v.admitted);
        assert_eq!(v.retry_after, 2);
        assert!(decide(&l, Some(&old), T0 + 2, 1).verdict.admitted);
        // A remainder of another limit (not below its requests) reads as 0 too.
        let odd = State::TokenBucket(super::State {
            tat: T0 + 666_668,
            rem: 3,
            rate: Default::default(),
        });
        assert_eq!(decide(&l, Some(&odd), T0, 1), decide(&l, Some(&old), T0, 1));
    }

    /// A policy change keeps what a bucket owes in hits, not in time: emptied under 5
    /// an hour and made 5 a second, it owes 5 hits, one second's worth, not the rest
    /// of the hour. The stores rebase the state at the first read after the change.
    #[test]
    fn a_bucket_owes_the_same_hits_at_a_new_rate() {
        let rebased = |l: &Limit, s: &Option<State>, now: Micros| {
            let mut st = s.clone().expect("a state");
            assert!(crate::algorithm::rebase(l, &mut st, now), "{st:?}");
            assert!(!crate::algorithm::rebase(l, &mut st, now), "once");
            Some(st)
        };
        let hour = limit(5, 3_600 * SECOND, 5);
        let mut s = None;
        for _ in 0..5 {
            assert!(hit(&hour, &mut s, T0, 1).admitted);
        }
        let second = limit(5, SECOND, 5);
        let v = decide(&second, s.as_ref(), T0, 1).verdict;
        assert!(!v.admitted);
        assert_eq!((v.remaining, v.retry_after, v.reset), (0, 200_000, SECOND));
        let mut s = rebased(&second, &s, T0);
        assert!(!hit(&second, &mut s, T0 + 199_999, 1).admitted);
        assert!(hit(&second, &mut s, T0 + 200_000, 1).admitted);
        let Some(State::TokenBucket(st)) = &s else {
            panic!("{s:?}")
        };
        assert_eq!(st.rate, super::Rate::of(&second));

        // Lowered from 10 to 5 a second after 8 hits: 8 owed, more than the 5 the
        // bucket holds, so it admits again once 4 are owed, 800 ms on.
        let ten = limit(10, SECOND, 10);
        let mut s = None;
        assert!(hit(&ten, &mut s, T0, 8).admitted);
        let five = limit(5, SECOND, 5);
        let v = decide(&five, s.as_ref(), T0, 1).verdict;
        assert_eq!((v.admitted, v.retry_after), (false, 800_000));
        let s = rebased(&five, &s, T0);
        assert!(!decide(&five, s.as_ref(), T0 + 799_999, 1).verdict.admitted);
        assert!(decide(&five, s.as_ref(), T0 + 800_000, 1).verdict.admitted);

        // A share of a hit carries exactly: 100 ms after one hit at 3 a second (a
        // third of a second each), 0.7 of it is owed; at 6 a second, 116,667 µs, and
        // at 1 a minute, 42 seconds.
        let three = limit(3, SECOND, 3);
        let mut s = None;
        assert!(hit(&three, &mut s, T0, 1).admitted);
        let now = T0 + 100_000;
        for (l, owed) in [
            (limit(6, SECOND, 1), 116_667),
            (limit(1, 60 * SECOND, 1), 42 * SECOND),
        ] {
            let v = decide(&l, s.as_ref(), now, 0).verdict;
            assert_eq!((v.remaining, v.reset), (0, owed), "{l:?}");
            let s = rebased(&l, &s, now);
            assert!(!decide(&l, s.as_ref(), now + owed - 1, 1).verdict.admitted);
            assert!(decide(&l, s.as_ref(), now + owed, 1).verdict.admitted);
        }
    }

    /// A debt past what the scripts rescale keeps its time; one past the end of time
    /// at the new rate lasts until just before it, whatever that rate. Neither
    /// overflows.
    #[test]
    fn debts_too_large_to_rescale() {
        let fast = limit(1 << 40, 1, 1 << 40);
        let state = State::TokenBucket(super::State {
            tat: T0 + 5 * SECOND,
            rem: 0,
            rate: super::Rate::of(&fast),
        });
        let slow = limit(1, SECOND, 1);
        let v = decide(&slow, Some(&state), T0, 0).verdict;
        assert_eq!(v.reset, 5 * SECOND);
        assert_eq!(
            decide(&slow, Some(&state), T0, 1).verdict.retry_after,
            5 * SECOND
        );

        // A million hits at 1 or 2 a day: far past the end of time. The cap counts in
        // ticks of the new rate, so at 2 a day too it is just before the end of time,
        // not a fraction of it.
        let owing = State::TokenBucket(super::State {
            tat: T0 + 1_000_000 * SECOND,
            rem: 0,
            rate: super::Rate::of(&slow),
        });
        for per_day in [1, 2] {
            let l = limit(per_day, DAY, 1);
            let v = decide(&l, Some(&owing), T0, 0).verdict;
            assert_eq!((v.remaining, v.reset), (0, super::END_OF_TIME - 1 - T0));
            let v = decide(&l, Some(&owing), T0, 1).verdict;
            assert_eq!((v.admitted, v.retry_after), (false, u64::MAX), "{per_day}");
        }
    }

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
