//! Test scaffolding and the properties every algorithm must satisfy.
//!
//! Everything goes through the generic [`decide`] / [`expires_at`] dispatch, so one
//! property serves all five algorithms: the `algorithm` field of the [`Limit`] picks
//! which one runs. Each algorithm's file invokes [`shared_properties!`] for itself and
//! keeps only its own unit tests and invariant.

use super::{
    decide, expires_at, fixed_window, leaky_bucket, sliding_window_counter, sliding_window_log,
    token_bucket, Algorithm, Limit, Micros, State, Verdict, MAX_BURST, MAX_FILL, SECOND,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// A realistic epoch time, aligned to 10 s so fixed windows start on it.
pub(crate) const T0: Micros = 1_700_000_000 * SECOND;

/// (limit, start time, steps of (time advance, hits)).
pub(crate) type Scenario = (Limit, Micros, Vec<(u64, u64)>);

/// An admitted request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admitted {
    /// When it was decided.
    pub at: Micros,
    pub hits: u64,
    /// How long the answer was held (leaky_bucket only; 0 elsewhere).
    pub delay: Micros,
}

pub(crate) fn limit(algorithm: Algorithm, requests: u64, window: Micros, burst: u64) -> Limit {
    Limit {
        algorithm,
        requests,
        window,
        burst,
        phase: 0,
    }
}

/// Whether `burst` is a parameter of its own; the window algorithms ignore it and the
/// policies set it to `requests`, so their strategies do too.
fn has_burst(a: Algorithm) -> bool {
    matches!(a, Algorithm::TokenBucket | Algorithm::LeakyBucket)
}

/// `remaining` of an untouched counter.
pub(crate) fn full(l: &Limit) -> u64 {
    if !has_burst(l.algorithm) {
        l.requests
    } else if l.requests == 0 {
        0
    } else {
        l.burst
    }
}

/// When `retry_after == u64::MAX` is allowed: the request can never fit.
fn never_fits(l: &Limit, hits: u64) -> bool {
    if has_burst(l.algorithm) {
        hits > l.burst || l.requests == 0
    } else {
        hits > l.requests
    }
}

/// Decides and commits the next state, as a store would.
pub(crate) fn hit(l: &Limit, s: &mut Option<State>, now: Micros, hits: u64) -> Verdict {
    let d = decide(l, s.as_ref(), now, hits);
    if let Some(n) = d.next {
        *s = Some(n);
    }
    d.verdict
}

/// Runs a scenario; returns the admitted requests and the final state and time.
pub(crate) fn run(
    l: &Limit,
    start: Micros,
    steps: &[(u64, u64)],
) -> (Vec<Admitted>, Option<State>, Micros) {
    let mut s = None;
    let mut now = start;
    let mut admitted = Vec::new();
    for &(dt, h) in steps {
        now += dt;
        let fresh = s.is_none();
        let v = hit(l, &mut s, now, h);
        if v.admitted && h > 0 {
            assert!(!fresh || v.delay == 0, "first request waited");
            admitted.push(Admitted {
                at: now,
                hits: h,
                delay: v.delay,
            });
        }
    }
    (admitted, s, now)
}

pub(crate) fn limits(a: Algorithm) -> impl Strategy<Value = Limit> {
    (
        0u64..8,
        prop_oneof![1u64..4, 4u64..2_000, Just(SECOND)],
        0u64..10,
    )
        .prop_map(move |(r, w, b)| limit(a, r, w, if has_burst(a) { b } else { r }))
}

pub(crate) fn scenarios(a: Algorithm) -> impl Strategy<Value = Scenario> {
    limits(a).prop_flat_map(|l| {
        let w = l.window;
        // Fixed windows also take steps past a whole window, to cross boundaries.
        let max_dt = if l.algorithm == Algorithm::FixedWindow {
            w + w / 2
        } else {
            w / 2 + 1
        };
        (
            Just(l),
            T0..T0 + 10 * w,
            prop::collection::vec((0..=max_dt, 0u64..=l.burst + 1), 1..60),
        )
    })
}

/// Any u64, with the edges (0, 1, u64::MAX) often.
pub(crate) fn edgy() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        any::<u64>()
    ]
}

/// Any limit of algorithm `a`, edges included.
pub(crate) fn any_limit(a: Algorithm) -> impl Strategy<Value = Limit> {
    (edgy(), edgy(), edgy())
        .prop_map(move |(r, w, b)| limit(a, r, w, if has_burst(a) { b } else { r }))
}

/// Any state of algorithm `a`, edges included (log entries kept sorted and unique, as
/// the algorithm stores them).
pub(crate) fn any_state(a: Algorithm) -> BoxedStrategy<State> {
    match a {
        Algorithm::FixedWindow => (edgy(), edgy())
            .prop_map(|(window_start, count)| {
                State::FixedWindow(fixed_window::State {
                    window_start,
                    count,
                })
            })
            .boxed(),
        Algorithm::SlidingWindowLog => prop::collection::vec((edgy(), edgy()), 0..5)
            .prop_map(|mut entries| {
                entries.sort_unstable();
                entries.dedup_by_key(|e| e.0);
                State::SlidingWindowLog(sliding_window_log::State::new(entries))
            })
            .boxed(),
        Algorithm::SlidingWindowCounter => (edgy(), edgy(), edgy())
            .prop_map(|(window_start, previous, current)| {
                State::SlidingWindowCounter(sliding_window_counter::State {
                    window_start,
                    previous,
                    current,
                })
            })
            .boxed(),
        Algorithm::TokenBucket => (edgy(), edgy(), any_rate())
            .prop_map(|(tat, rem, rate)| State::TokenBucket(token_bucket::State { tat, rem, rate }))
            .boxed(),
        Algorithm::LeakyBucket => (edgy(), edgy(), any_rate())
            .prop_map(|(tat, rem, rate)| State::LeakyBucket(leaky_bucket::State { tat, rem, rate }))
            .boxed(),
    }
}

/// A bucket state's rate: none (an older sluice's), or any other.
fn any_rate() -> impl Strategy<Value = token_bucket::Rate> {
    prop_oneof![
        Just(token_bucket::Rate::default()),
        (edgy(), edgy()).prop_map(|(requests, window)| token_bucket::Rate { requests, window }),
    ]
}

/// `parts` of at least one hit each, cut from `sizes` so that they add up to `burst`.
pub(crate) fn split(burst: u64, sizes: &[u64]) -> Vec<u64> {
    let mut parts = Vec::new();
    let mut left = burst;
    for &s in sizes.iter().cycle().take(burst as usize) {
        if left == 0 {
            break;
        }
        let part = s.clamp(1, left);
        parts.push(part);
        left -= part;
    }
    parts
}

/// A full bucket (an empty queue) at `now` admits exactly `burst` hits in requests of
/// `parts`, each leaving what is left as `remaining`, and then not one hit more.
pub(crate) fn whole_burst_at_one_instant(
    l: &Limit,
    now: Micros,
    parts: &[u64],
) -> Result<(), TestCaseError> {
    let mut s = None;
    let mut left = l.burst;
    for &part in parts {
        let v = hit(l, &mut s, now, part);
        prop_assert!(v.admitted, "{} of {} left, {} denied", left, l.burst, part);
        left -= part;
        prop_assert_eq!(v.remaining, left);
    }
    prop_assert_eq!(left, 0);
    let v = hit(l, &mut s, now, 1);
    prop_assert!(!v.admitted);
    // The next token comes one emission interval later, rounded up to a microsecond.
    let interval = u128::from(l.window).div_ceil(u128::from(l.requests));
    prop_assert_eq!(u128::from(v.retry_after), interval);
    Ok(())
}

/// A bucket that takes the longest a policy allows to fill ([`MAX_FILL`]) gives its
/// whole burst at one instant, now and up to 7 × 2^50 µs (the year 2219).
pub(crate) fn longest_fills_give_their_whole_burst(a: Algorithm) {
    const YEAR: Micros = 365 * 86_400 * SECOND;
    let late = 7 * MAX_FILL - 1;
    for (requests, window) in [
        (1, 1),
        (1, SECOND),
        (7, 86_400 * SECOND),
        (1, YEAR),
        (u64::from(u32::MAX), YEAR),
    ] {
        let most = u128::from(MAX_FILL) * u128::from(requests) / u128::from(window);
        let burst = u64::try_from(most).unwrap().min(MAX_BURST);
        let l = limit(a, requests, window, burst);
        whole_burst_at_one_instant(&l, T0, &[burst]).unwrap();
        whole_burst_at_one_instant(&l, T0, &[1, burst - 1]).unwrap();
        let mut s = None;
        let v = hit(&l, &mut s, late, burst);
        assert!(v.admitted, "{l:?} late");
        assert_eq!(v.remaining, 0, "{l:?} late");
    }
}

/// Bucket limits with room (requests and burst > 0), windows from 1 µs to a year.
pub(crate) fn bucket_splits(a: Algorithm) -> impl Strategy<Value = (Limit, Micros, Vec<u64>)> {
    const YEAR: Micros = 365 * 86_400 * SECOND;
    (
        prop_oneof![1u64..10, 1u64..100_000, Just(1 << 40)],
        prop_oneof![
            1u64..10,
            1u64..10 * SECOND,
            Just(86_400 * SECOND),
            Just(YEAR)
        ],
        1u64..80,
        T0..T0 + 10 * YEAR,
        prop::collection::vec(1u64..10, 1..20),
    )
        .prop_map(move |(r, w, b, now, sizes)| (limit(a, r, w, b), now, split(b, &sizes)))
}

/// A state at or after `expires_at` decides like a fresh counter.
pub(crate) fn expired_state_decides_like_none(
    (l, start, steps): &Scenario,
    later: u64,
    hits: u64,
) -> Result<(), TestCaseError> {
    let (_, s, _) = run(l, *start, steps);
    if let Some(s) = s {
        let t = expires_at(l, &s) + later;
        prop_assert_eq!(decide(l, Some(&s), t, hits), decide(l, None, t, hits));
    }
    Ok(())
}

/// `remaining`, `retry_after`, `next_room` and `reset` are exact, not just safe bounds.
pub(crate) fn verdict_fields_are_exact(
    (l, start, steps): &Scenario,
    hits: u64,
) -> Result<(), TestCaseError> {
    let (_, s, now) = run(l, *start, steps);
    let d = decide(l, s.as_ref(), now, hits);
    let v = d.verdict;
    let after = d.next.or(s.clone());
    let full = full(l);
    if v.admitted {
        prop_assert_eq!(v.retry_after, 0);
        prop_assert!(v.remaining <= full);
        // `remaining` more fit right now, one more does not.
        prop_assert!(decide(l, after.as_ref(), now, v.remaining).verdict.admitted);
        prop_assert!(
            !decide(l, after.as_ref(), now, v.remaining + 1)
                .verdict
                .admitted
        );
    } else {
        prop_assert_eq!(v.delay, 0);
        if v.retry_after == u64::MAX {
            prop_assert!(never_fits(l, hits));
        } else {
            // Admitted at now + retry_after, denied one microsecond earlier.
            prop_assert!(v.retry_after > 0);
            let at = now + v.retry_after;
            prop_assert!(decide(l, s.as_ref(), at, hits).verdict.admitted);
            prop_assert!(!decide(l, s.as_ref(), at - 1, hits).verdict.admitted);
        }
    }
    // `next_room`: after a full admission, or a denial that no wait ends, exactly
    // when one more hit fits.
    let full_now = v.admitted && v.remaining == 0 && hits > 0;
    let never = !v.admitted && v.retry_after == u64::MAX && hits > 0;
    if full_now || never {
        if v.next_room == u64::MAX {
            prop_assert!(never_fits(l, 1));
        } else if v.next_room == 0 {
            // Denied as sent, but one hit fits already.
            prop_assert!(never);
            prop_assert!(decide(l, after.as_ref(), now, 1).verdict.admitted);
        } else {
            let at = now + v.next_room;
            prop_assert!(decide(l, after.as_ref(), at, 1).verdict.admitted);
            prop_assert!(!decide(l, after.as_ref(), at - 1, 1).verdict.admitted);
        }
    } else {
        prop_assert_eq!(v.next_room, 0);
    }
    // Back to the full allowance once `reset` has passed...
    let at_reset = decide(l, after.as_ref(), now + v.reset, 0).verdict;
    prop_assert_eq!(at_reset.remaining, full);
    // ...and not before, except for fixed windows, whose reset is the window end even
    // when the counter is already empty, and a limit of 0, whose reset is one window
    // though its allowance (none) is always full.
    if v.reset > 0 && l.algorithm != Algorithm::FixedWindow && l.requests > 0 {
        let before = decide(l, after.as_ref(), now + v.reset - 1, 0).verdict;
        prop_assert!(before.remaining < full);
    }
    Ok(())
}

/// Random inputs, edges included, never panic and give a coherent decision.
pub(crate) fn arbitrary_inputs_do_not_panic(
    l: &Limit,
    s: &State,
    now: Micros,
    hits: u64,
) -> Result<(), TestCaseError> {
    let d = decide(l, Some(s), now, hits);
    prop_assert_eq!(d.next.is_some(), d.verdict.admitted && hits > 0);
    prop_assert!(d.verdict.admitted || d.verdict.retry_after > 0);
    let _ = decide(l, None, now, hits);
    let _ = expires_at(l, s);
    // Rebased to the limit's rate, a state owes what it owed: the same verdict.
    let mut rebased = s.clone();
    if crate::algorithm::rebase(l, &mut rebased, now) {
        prop_assert_eq!(decide(l, Some(&rebased), now, hits).verdict, d.verdict);
    }
    Ok(())
}

/// The shared properties as `#[test]`s for one algorithm, 200 cases each; invoked in
/// each algorithm's test module so the test names stay where they were.
macro_rules! shared_properties {
    ($algorithm:expr) => {
        proptest::proptest! {
            #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

            #[test]
            fn expired_state_decides_like_none(
                sc in $crate::algorithm::testkit::scenarios($algorithm),
                later in 0u64..3_000,
                hits in 0u64..10,
            ) {
                $crate::algorithm::testkit::expired_state_decides_like_none(&sc, later, hits)?;
            }

            #[test]
            fn verdict_fields_are_exact(
                sc in $crate::algorithm::testkit::scenarios($algorithm),
                hits in 0u64..10,
            ) {
                $crate::algorithm::testkit::verdict_fields_are_exact(&sc, hits)?;
            }

            #[test]
            fn arbitrary_inputs_do_not_panic(
                l in $crate::algorithm::testkit::any_limit($algorithm),
                s in $crate::algorithm::testkit::any_state($algorithm),
                now in $crate::algorithm::testkit::edgy(),
                hits in $crate::algorithm::testkit::edgy(),
            ) {
                $crate::algorithm::testkit::arbitrary_inputs_do_not_panic(&l, &s, now, hits)?;
            }
        }
    };
}
pub(crate) use shared_properties;
