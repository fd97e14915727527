//! leaky_bucket: a queue of `burst` hits that drains at `requests` per `window`.
//!
//! Stored as the virtual time `tat` at which the queue is empty. At `now` it holds
//! (max(tat, now) - now) * requests / window hits. A request of `hits` finds room when
//!
//!   hits <= burst  and  (base - now) * requests <= (burst - hits) * window
//!
//! with base = max(tat, now) (exact, in u128: the same test as token_bucket). It is
//! admitted with delay = base - now: its turn comes when the hits queued before it
//! have drained, at once for an empty queue. Its hits then occupy the queue until
//! tat = base + ceil(hits * window / requests); rounding up keeps the upstream rate at
//! or below the limit. A request that finds no room is denied at once. A check
//! (`hits == 0`) joins no queue (delay 0) and is judged as in token_bucket.
//!
//! Guarantees (tested): the release time (now + delay) of each admitted request is at
//! least the previous release plus previous hits * window / requests, and the hits
//! admitted but not yet released at any admission, plus the new ones, never exceed
//! `burst`.

use super::token_bucket::Gcra;
use super::{Limit, Micros, Step, Verdict};

/// Stored state of one leaky_bucket counter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// When the queue will have drained (microseconds).
    pub tat: Micros,
}

/// Decides one request of `hits` at `now`. A check (`hits == 0`) joins no queue, so
/// its delay is 0.
pub fn decide(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Step<State> {
    // `requests == 0`: the queue never drains, so no hit is ever admitted.
    let Some(g) = Gcra::new(limit) else {
        return Step {
            verdict: Verdict {
                admitted: hits == 0,
                retry_after: if hits == 0 { 0 } else { u64::MAX },
                ..Verdict::default()
            },
            next: None,
        };
    };
    let tat = state.map_or(now, |s| s.tat);
    let base = tat.max(now);
    let backlog = base - now;
    let next_tat = g.next_tat(base, hits);
    if g.fits(backlog, hits) {
        if hits == 0 {
            return Step {
                verdict: Verdict {
                    admitted: true,
                    remaining: g.remaining(backlog),
                    reset: backlog,
                    ..Verdict::default()
                },
                next: None,
            };
        }
        if let Some(tat) = next_tat {
            return Step {
                verdict: Verdict {
                    admitted: true,
                    remaining: g.remaining(tat - now),
                    reset: tat - now,
                    retry_after: 0,
                    delay: backlog,
                },
                next: Some(State { tat }),
            };
        }
    }
    Step {
        verdict: Verdict {
            admitted: false,
            remaining: g.remaining(backlog),
            reset: backlog,
            // The queue only shrinks while waiting, but base + cost never does: one
            // that runs past the end of time never fits.
            retry_after: match next_tat {
                Some(_) => g.retry_after(tat, now, hits),
                None => u64::MAX,
            },
            delay: 0,
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
    use super::*;
    use crate::algorithm::{Algorithm, SECOND};
    use proptest::prelude::*;

    fn limit(requests: u64, window: Micros, burst: u64) -> Limit {
        Limit {
            algorithm: Algorithm::LeakyBucket,
            requests,
            window,
            burst,
        }
    }

    fn hit(l: &Limit, s: &mut Option<State>, now: Micros, hits: u64) -> Verdict {
        let step = decide(l, s.as_ref(), now, hits);
        if let Some(n) = step.next {
            *s = Some(n);
        }
        step.verdict
    }

    const T0: Micros = 1_700_000_000 * SECOND + 4_321;

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
        let l = limit(1, u64::MAX / 2, 2);
        let mut s = None;
        assert!(hit(&l, &mut s, T0, 1).admitted);
        assert_eq!(hit(&l, &mut s, T0, 1).retry_after, u64::MAX);
        let big = limit(u64::MAX, 1, u64::MAX);
        let mut s = None;
        assert!(hit(&big, &mut s, u64::MAX - 1, u64::MAX).admitted);
        assert!(!hit(&big, &mut s, u64::MAX, u64::MAX).admitted);
    }

    fn limits() -> impl Strategy<Value = Limit> {
        (
            0u64..8,
            prop_oneof![1u64..4, 4u64..2_000, Just(SECOND)],
            0u64..10,
        )
            .prop_map(|(r, w, b)| limit(r, w, b))
    }

    fn scenarios() -> impl Strategy<Value = (Limit, Micros, Vec<(u64, u64)>)> {
        limits().prop_flat_map(|l| {
            let w = l.window;
            (
                Just(l),
                T0..T0 + 10 * w,
                prop::collection::vec((0..=w / 2 + 1, 0u64..=l.burst + 1), 1..60),
            )
        })
    }

    /// An admitted request: (decided at, released at, hits).
    type Admitted = (Micros, Micros, u64);

    fn run(
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
                admitted.push((now, now + v.delay, h));
            }
        }
        (admitted, s, now)
    }

    /// Any u64, with the edges (0, 1, u64::MAX) often.
    fn edgy() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0),
            Just(1),
            Just(u64::MAX - 1),
            Just(u64::MAX),
            any::<u64>()
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn releases_are_spaced_and_the_queue_holds_at_most_burst(
            (l, start, steps) in scenarios(),
        ) {
            let (admitted, _, _) = run(&l, start, &steps);
            let (r, w) = (u128::from(l.requests), u128::from(l.window));
            for pair in admitted.windows(2) {
                let ((_, r0, h0), (_, r1, _)) = (pair[0], pair[1]);
                prop_assert!(r1 >= r0);
                prop_assert!(u128::from(r1 - r0) * r >= u128::from(h0) * w);
            }
            for (i, &(now, _, _)) in admitted.iter().enumerate() {
                let queued: u64 = admitted[..=i]
                    .iter()
                    .filter(|(_, release, _)| *release >= now)
                    .map(|(_, _, h)| h)
                    .sum();
                prop_assert!(queued <= l.burst, "{} queued at {}", queued, now);
            }
        }

        #[test]
        fn expired_state_decides_like_none(
            (l, start, steps) in scenarios(), later in 0u64..3_000, hits in 0u64..10,
        ) {
            let (_, s, _) = run(&l, start, &steps);
            if let Some(s) = s {
                let t = expires_at(&l, &s) + later;
                prop_assert_eq!(decide(&l, Some(&s), t, hits), decide(&l, None, t, hits));
            }
        }

        #[test]
        fn verdict_fields_are_exact((l, start, steps) in scenarios(), hits in 0u64..10) {
            let (_, s, now) = run(&l, start, &steps);
            let step = decide(&l, s.as_ref(), now, hits);
            let v = step.verdict;
            let after = step.next.clone().or(s.clone());
            let full = if l.requests == 0 { 0 } else { l.burst };
            if v.admitted {
                prop_assert_eq!(v.retry_after, 0);
                // Released when the queue ahead of it has drained.
                let queue_empty = s.as_ref().map_or(now, |s| s.tat).max(now);
                let expected_delay = if hits == 0 { 0 } else { queue_empty - now };
                prop_assert_eq!(v.delay, expected_delay);
                prop_assert!(decide(&l, after.as_ref(), now, v.remaining).verdict.admitted);
                prop_assert!(!decide(&l, after.as_ref(), now, v.remaining + 1).verdict.admitted);
            } else {
                prop_assert_eq!(v.delay, 0);
                if v.retry_after == u64::MAX {
                    prop_assert!(hits > l.burst || l.requests == 0);
                } else {
                    prop_assert!(v.retry_after > 0);
                    let at = now + v.retry_after;
                    prop_assert!(decide(&l, s.as_ref(), at, hits).verdict.admitted);
                    prop_assert!(!decide(&l, s.as_ref(), at - 1, hits).verdict.admitted);
                }
            }
            let at_reset = decide(&l, after.as_ref(), now + v.reset, 0).verdict;
            prop_assert_eq!(at_reset.remaining, full);
            if v.reset > 0 {
                let before = decide(&l, after.as_ref(), now + v.reset - 1, 0).verdict;
                prop_assert!(before.remaining < full);
            }
        }

        #[test]
        fn arbitrary_inputs_do_not_panic(r in edgy(), w in edgy(), b in edgy(), tat in edgy(), now in edgy(), hits in edgy()) {
            let l = Limit { algorithm: Algorithm::LeakyBucket, requests: r, window: w, burst: b };
            let s = State { tat };
            let step = decide(&l, Some(&s), now, hits);
            prop_assert_eq!(step.next.is_some(), step.verdict.admitted && hits > 0);
            prop_assert!(step.verdict.admitted || step.verdict.retry_after > 0);
            let _ = decide(&l, None, now, hits);
            let _ = expires_at(&l, &s);
        }
    }
}
