//! One set of test bodies that every store must pass. `store_contract!` expands them
//! for a store constructor: `tests/store_memory.rs` runs them on the memory store,
//! `tests/redis.rs` on the Redis store.

use sluice::algorithm::{Algorithm, Limit, SECOND};
use sluice::store::{Hit, Mode, Spend};

/// A hit on `key` with a per-minute limit of `requests`.
pub fn hit(key: &str, algorithm: Algorithm, requests: u64, hits: u64) -> Hit {
    Hit {
        key: key.to_string(),
        placement: sluice::hash::stable_hash(key.as_bytes()),
        limit: Limit {
            algorithm,
            requests,
            window: 60 * SECOND,
            burst: requests,
            phase: 0,
        },
        hits,
        mode: Mode::Enforce,
        spend: Spend::IfAdmitted,
        fallback: Default::default(),
        max_delay: sluice::algorithm::NO_DEADLINE,
    }
}

/// A charge of `hits` on `key`: a cost reported after the response, spent whole.
pub fn charge(key: &str, algorithm: Algorithm, requests: u64, hits: u64) -> Hit {
    Hit {
        spend: Spend::Always,
        ..hit(key, algorithm, requests, hits)
    }
}

/// A refund of `hits` on `key`: Envoy's `is_negative_hits`.
pub fn refund(key: &str, algorithm: Algorithm, requests: u64, hits: u64) -> Hit {
    Hit {
        spend: Spend::Refund,
        ..hit(key, algorithm, requests, hits)
    }
}

/// Expands the contract tests for `$make`, an async expression giving a fresh store
/// whose keys do not collide with other tests (`$prefix` is prepended to keys).
// Each test binary includes `common`; only the store tests expand the suite.
#[allow(unused_macros)]
macro_rules! store_contract {
    ($make:expr) => {
        use sluice::algorithm::Algorithm;
        use sluice::store::{Mode, Store};
        use $crate::common::contract::{charge, hit, refund};

        #[tokio::test]
        async fn admits_up_to_the_limit_then_denies() {
            for alg in Algorithm::ALL {
                let store = $make;
                let key = format!("contract-limit-{}", alg.as_str());
                for i in 0..5 {
                    let v = store.decide(&[hit(&key, alg, 5, 1)]).await.unwrap();
                    assert!(v.admitted, "{alg:?} request {i}");
                }
                let v = store.decide(&[hit(&key, alg, 5, 1)]).await.unwrap();
                assert!(!v.admitted, "{alg:?} sixth request");
                assert!(!v.verdicts[0].admitted);
                assert!(v.verdicts[0].retry_after > 0);
            }
        }

        #[tokio::test]
        async fn a_peek_answers_like_a_decision_and_spends_nothing() {
            for alg in Algorithm::ALL {
                let store = $make;
                let key = format!("contract-peek-{}", alg.as_str());
                let one = [hit(&key, alg, 3, 1)];
                let fresh = store.peek(&one).await.unwrap();
                assert!(fresh.admitted, "{alg:?}");
                assert_eq!(fresh.verdicts[0].remaining, 2, "{alg:?} fresh");
                let decided = store.decide(&one).await.unwrap();
                assert_eq!(decided.verdicts[0].remaining, 2, "{alg:?} first hit");
                for _ in 0..3 {
                    let v = store.peek(&one).await.unwrap();
                    assert_eq!(v.verdicts[0].remaining, 1, "{alg:?} peek");
                }
                store.decide(&one).await.unwrap();
                store.decide(&one).await.unwrap();
                let full = store.peek(&one).await.unwrap();
                assert!(!full.admitted, "{alg:?} full");
                assert!(full.verdicts[0].retry_after > 0, "{alg:?}");
                let v = store.decide(&one).await.unwrap();
                assert!(
                    !v.admitted,
                    "{alg:?}: the peeks spent nothing and added nothing"
                );
            }
        }

        #[tokio::test]
        async fn a_denied_batch_consumes_nothing() {
            for alg in Algorithm::ALL {
                let store = $make;
                let a = format!("contract-a-{}", alg.as_str());
                let b = format!("contract-b-{}", alg.as_str());
                // b has room for 1; a batch of (a, b x2) is denied and spends nothing.
                let v = store
                    .decide(&[hit(&a, alg, 10, 1), hit(&b, alg, 1, 2)])
                    .await
                    .unwrap();
                assert!(!v.admitted, "{alg:?}");
                assert!(v.verdicts[0].admitted && !v.verdicts[1].admitted);
                let check = store
                    .decide(&[hit(&a, alg, 10, 0), hit(&b, alg, 1, 0)])
                    .await
                    .unwrap();
                assert_eq!(check.verdicts[0].remaining, 10, "{alg:?}: a was charged");
                assert_eq!(check.verdicts[1].remaining, 1, "{alg:?}: b was charged");
            }
        }

        #[tokio::test]
        async fn the_same_key_twice_in_a_batch_counts_twice() {
            let store = $make;
            let v = store
                .decide(&[
                    hit("contract-twice", Algorithm::FixedWindow, 3, 2),
                    hit("contract-twice", Algorithm::FixedWindow, 3, 2),
                ])
                .await
                .unwrap();
            assert!(!v.admitted, "4 hits on a limit of 3");
            let v = store
                .decide(&[hit("contract-twice", Algorithm::FixedWindow, 3, 3)])
                .await
                .unwrap();
            assert!(v.admitted, "nothing was spent by the denied batch");
        }

        #[tokio::test]
        async fn shadow_and_quota_modes() {
            let store = $make;
            let mut shadow = hit("contract-shadow", Algorithm::FixedWindow, 0, 1);
            shadow.mode = Mode::Shadow;
            let v = store
                .decide(&[shadow, hit("contract-enf", Algorithm::FixedWindow, 5, 1)])
                .await
                .unwrap();
            assert!(v.admitted, "shadow denial does not deny");
            assert!(!v.verdicts[0].admitted);
            assert_eq!(
                v.verdicts[1].remaining, 4,
                "the enforced counter was consumed"
            );

            let mut qa = hit("contract-qa", Algorithm::FixedWindow, 0, 1);
            qa.mode = Mode::Quota;
            let mut qb = hit("contract-qb", Algorithm::FixedWindow, 1, 1);
            qb.mode = Mode::Quota;
            let v = store.decide(&[qa.clone(), qb.clone()]).await.unwrap();
            assert!(v.admitted, "one quota still has room");
            let v = store.decide(&[qa, qb]).await.unwrap();
            assert!(!v.admitted, "every quota is spent");
        }

        #[tokio::test]
        async fn a_window_made_longer_keeps_its_hits_and_ends_on_its_own_grid() {
            // A per-second limit made per-day, as a policy's unit change does: the
            // second's hit counts in the day, which ends where a fresh key's day
            // ends, not a day after that second.
            const SECOND: u64 = sluice::algorithm::SECOND;
            let store = $make;
            for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
                let key = format!("contract-longer-{}", alg.as_str());
                let fresh = format!("contract-longer-fresh-{}", alg.as_str());
                let with = |key: &str, window| {
                    let mut h = hit(key, alg, 5, 1);
                    h.limit.window = window;
                    h
                };
                assert!(store.decide(&[with(&key, SECOND)]).await.unwrap().admitted);
                let day = 86_400 * SECOND;
                let v = store
                    .decide(&[with(&key, day), with(&fresh, day)])
                    .await
                    .unwrap();
                assert!(v.admitted, "{alg:?}");
                assert_eq!(
                    v.verdicts[0].remaining, 3,
                    "{alg:?}: the second's hit counts"
                );
                let (changed, fresh) = (v.verdicts[0].reset, v.verdicts[1].reset);
                assert!(
                    changed.abs_diff(fresh) < SECOND,
                    "{alg:?}: resets {changed} and {fresh} µs"
                );
            }
        }

        #[tokio::test]
        async fn a_full_bucket_gives_its_whole_burst_at_one_instant() {
            // 3 a second and 37 a day: intervals of no whole number of microseconds.
            const SECOND: u64 = sluice::algorithm::SECOND;
            let limits = [(3, SECOND), (37, 86_400 * SECOND)];
            let splits: [&[u64]; 5] = [&[1, 1, 1], &[2, 1], &[1, 2], &[3], &[1; 37]];
            let store = $make;
            for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
                for (n, parts) in splits.iter().enumerate() {
                    let burst: u64 = parts.iter().sum();
                    let (requests, window) = limits[usize::from(burst == 37)];
                    let key = format!("contract-burst-{}-{n}", alg.as_str());
                    let part = |hits| {
                        let mut h = hit(&key, alg, requests, hits);
                        h.limit.window = window;
                        h
                    };
                    let mut left = burst;
                    for &p in *parts {
                        let v = store.decide(&[part(p)]).await.unwrap();
                        assert!(v.admitted, "{alg:?} {parts:?}: {p} denied, {left} left");
                        left -= p;
                        assert_eq!(v.verdicts[0].remaining, left, "{alg:?} {parts:?}");
                    }
                    let v = store.decide(&[part(1)]).await.unwrap();
                    assert!(
                        !v.admitted,
                        "{alg:?} {parts:?}: one more at the same instant"
                    );
                }
            }
        }

        #[tokio::test]
        async fn a_leaky_turn_past_the_callers_wait_is_denied_and_takes_nothing() {
            use sluice::algorithm::{NO_DEADLINE, SECOND};
            let store = $make;
            // 5 a minute: a turn every 12 s.
            let queue = |max_delay| sluice::store::Hit {
                max_delay,
                ..hit("contract-late-queue", Algorithm::LeakyBucket, 5, 1)
            };
            let other = hit("contract-late-other", Algorithm::FixedWindow, 5, 1);
            let v = store.decide(&[queue(0)]).await.unwrap();
            assert!(v.admitted && v.verdicts[0].delay == 0, "{v:?}");
            // The next turn is 12 s away: a caller who waits 1 s is denied at once,
            // and its request's other limit spends nothing either.
            let v = store.decide(&[other.clone(), queue(SECOND)]).await.unwrap();
            assert!(!v.admitted, "{v:?}");
            let late = v.verdicts[1];
            assert!(!late.admitted && late.late, "{late:?}");
            assert_eq!((late.delay, late.retry_after), (0, 11 * SECOND));
            assert_eq!((late.remaining, late.reset), (4, 12 * SECOND));
            // Nothing was taken: a caller who waits gets the turn at 12 s, and the
            // other limit still has its 5.
            let v = store
                .decide(&[other.clone(), queue(NO_DEADLINE)])
                .await
                .unwrap();
            assert!(v.admitted, "{v:?}");
            assert_eq!(v.verdicts[1].delay, 12 * SECOND);
            assert_eq!(v.verdicts[0].remaining, 4);
            // A wait of exactly the turn is enough.
            let v = store.decide(&[queue(24 * SECOND)]).await.unwrap();
            assert!(v.admitted && v.verdicts[0].delay == 24 * SECOND, "{v:?}");
        }

        #[tokio::test]
        async fn zero_hits_check_without_counting() {
            let store = $make;
            for _ in 0..3 {
                let v = store
                    .decide(&[hit("contract-zero", Algorithm::SlidingWindowCounter, 2, 0)])
                    .await
                    .unwrap();
                assert!(v.admitted);
                assert_eq!(v.verdicts[0].remaining, 2);
            }
        }

        /// A limit of 0 never admits: its reset is one window (a fixed window's
        /// end), for a check as for a denial, never 0.
        #[tokio::test]
        async fn a_zero_limit_resets_in_one_window() {
            let store = $make;
            let window = sluice::algorithm::SECOND * 60;
            for alg in Algorithm::ALL {
                for hits in [0, 1] {
                    let v = store
                        .decide(&[hit(&format!("contract-never-{alg:?}"), alg, 0, hits)])
                        .await
                        .unwrap();
                    assert_eq!(v.admitted, hits == 0, "{alg:?}");
                    let reset = v.verdicts[0].reset;
                    if alg == Algorithm::FixedWindow {
                        assert!(reset > 0 && reset <= window, "{alg:?}: {reset}");
                    } else {
                        assert_eq!(reset, window, "{alg:?} {hits} hits");
                    }
                }
            }
        }

        #[tokio::test]
        async fn a_charge_past_the_limit_is_spent_whole_and_owed() {
            for alg in Algorithm::ALL {
                let store = $make;
                let key = format!("contract-charge-{}", alg.as_str());
                let check = [hit(&key, alg, 5, 0)];
                assert!(store.decide(&check).await.unwrap().admitted, "{alg:?}");
                // 3 fit; 4 more do not, and are spent anyway: 2 are owed.
                let v = store.decide(&[charge(&key, alg, 5, 3)]).await.unwrap();
                assert!(v.admitted, "{alg:?}");
                assert_eq!(v.verdicts[0].remaining, 2, "{alg:?}");
                assert_eq!(v.verdicts[0].owed, 0, "{alg:?}");
                let v = store.decide(&[charge(&key, alg, 5, 4)]).await.unwrap();
                assert!(!v.admitted, "{alg:?}: 4 on 2 left fitted");
                assert_eq!(v.verdicts[0].remaining, 0, "{alg:?}");
                assert!(v.verdicts[0].retry_after > 0, "{alg:?}");
                assert_eq!(v.verdicts[0].owed, 2, "{alg:?}");
                // A peek (the admin API's Explain) shows the debt and keeps it.
                let v = store.peek(&[hit(&key, alg, 5, 1)]).await.unwrap();
                assert_eq!(v.verdicts[0].owed, 2, "{alg:?}: peeked");
                assert_eq!(store.peek(&check).await.unwrap().verdicts[0].owed, 2);
                // Owing, the counter refuses the next check and the next request.
                let v = store.decide(&check).await.unwrap();
                assert!(!v.admitted, "{alg:?}: a check passed while owing");
                let v = store.decide(&[hit(&key, alg, 5, 1)]).await.unwrap();
                assert!(!v.admitted, "{alg:?}");
                // The same 4 as a request would have been refused and spent nothing.
                let plain = format!("contract-plain-{}", alg.as_str());
                store.decide(&[hit(&plain, alg, 5, 3)]).await.unwrap();
                let v = store.decide(&[hit(&plain, alg, 5, 4)]).await.unwrap();
                assert!(!v.admitted, "{alg:?}");
                let v = store.decide(&[hit(&plain, alg, 5, 0)]).await.unwrap();
                assert_eq!(
                    v.verdicts[0].remaining, 2,
                    "{alg:?}: a denied request spent"
                );
            }
        }

        /// A cost no wait admits (12 on a limit of 5), charged or requested, or
        /// peeked: its answer carries the wait until the key admits one hit (what
        /// its retry-after is made of), the same a one-hit request is told.
        #[tokio::test]
        async fn a_cost_larger_than_the_limit_is_told_when_the_key_admits_again() {
            for alg in Algorithm::ALL {
                let store = $make;
                let key = format!("contract-never-{}", alg.as_str());
                let v = store.decide(&[charge(&key, alg, 5, 12)]).await.unwrap();
                let charged = v.verdicts[0];
                assert!(
                    !charged.admitted && charged.retry_after == u64::MAX,
                    "{alg:?}"
                );
                let one = store.decide(&[hit(&key, alg, 5, 1)]).await.unwrap();
                let wait = one.verdicts[0].retry_after;
                assert!(!one.admitted && wait > 0 && wait < u64::MAX, "{alg:?}");
                assert_eq!(charged.next_room, wait, "{alg:?}: charged");
                let v = store.decide(&[hit(&key, alg, 5, 12)]).await.unwrap();
                assert_eq!(v.verdicts[0].retry_after, u64::MAX, "{alg:?}");
                assert_eq!(v.verdicts[0].next_room, wait, "{alg:?}: requested");
                let v = store.peek(&[hit(&key, alg, 5, 12)]).await.unwrap();
                assert_eq!(v.verdicts[0].next_room, wait, "{alg:?}: peeked");
            }
        }

        #[tokio::test]
        async fn a_batch_of_charges_spends_every_one_though_one_is_over() {
            for alg in Algorithm::ALL {
                let store = $make;
                let roomy = format!("contract-charges-a-{}", alg.as_str());
                let tight = format!("contract-charges-b-{}", alg.as_str());
                let v = store
                    .decide(&[charge(&roomy, alg, 10, 3), charge(&tight, alg, 2, 3)])
                    .await
                    .unwrap();
                assert!(!v.admitted, "{alg:?}");
                assert!(v.verdicts[0].admitted && !v.verdicts[1].admitted, "{alg:?}");
                let v = store.decide(&[hit(&roomy, alg, 10, 0)]).await.unwrap();
                assert_eq!(
                    v.verdicts[0].remaining, 7,
                    "{alg:?}: the roomy charge was given back"
                );
                let v = store.decide(&[hit(&tight, alg, 2, 0)]).await.unwrap();
                assert!(!v.admitted, "{alg:?}: the tight charge was not spent");
            }
        }

        #[tokio::test]
        async fn a_refund_gives_hits_back_floored_at_empty_and_never_denies() {
            for alg in Algorithm::ALL {
                let store = $make;
                let key = format!("contract-refund-{}", alg.as_str());
                let check = [hit(&key, alg, 10, 0)];
                store.decide(&[hit(&key, alg, 10, 7)]).await.unwrap();
                let v = store.decide(&[refund(&key, alg, 10, 4)]).await.unwrap();
                assert!(v.admitted && v.verdicts[0].admitted, "{alg:?}");
                assert_eq!(v.verdicts[0].remaining, 7, "{alg:?}");
                assert_eq!(store.decide(&check).await.unwrap().verdicts[0].remaining, 7);
                let v = store.decide(&[refund(&key, alg, 10, 50)]).await.unwrap();
                assert_eq!(v.verdicts[0].remaining, 10, "{alg:?}: below empty");
                let v = store.decide(&[hit(&key, alg, 10, 11)]).await.unwrap();
                assert!(!v.admitted, "{alg:?}: room past the limit");
                // Owed after a charge past the limit: a refund repays it and is not
                // refused, however far over the counter is.
                store.decide(&[charge(&key, alg, 10, 25)]).await.unwrap();
                let v = store.decide(&[refund(&key, alg, 10, 5)]).await.unwrap();
                assert!(v.admitted, "{alg:?}: a refund was refused");
                assert!(!store.decide(&check).await.unwrap().admitted, "{alg:?}");
                store.decide(&[refund(&key, alg, 10, 17)]).await.unwrap();
                let v = store.decide(&check).await.unwrap();
                assert_eq!(v.verdicts[0].remaining, 7, "{alg:?}");
                // A refund to a key never seen changes nothing.
                let fresh = format!("contract-refund-fresh-{}", alg.as_str());
                let v = store.decide(&[refund(&fresh, alg, 10, 3)]).await.unwrap();
                assert_eq!(v.verdicts[0].remaining, 10, "{alg:?}");
            }
        }

        #[tokio::test]
        async fn a_reservation_settles_its_estimate_and_the_actual_in_one_call() {
            for alg in Algorithm::ALL {
                let store = $make;
                let key = format!("contract-reserve-{}", alg.as_str());
                // Reserve 5 at the request; at its end give the 5 back and charge the
                // 8 it cost, in either order in one call.
                store.decide(&[charge(&key, alg, 20, 5)]).await.unwrap();
                let v = store
                    .decide(&[refund(&key, alg, 20, 5), charge(&key, alg, 20, 8)])
                    .await
                    .unwrap();
                assert!(v.admitted, "{alg:?}");
                assert_eq!(v.verdicts[1].remaining, 12, "{alg:?}");
                store.decide(&[charge(&key, alg, 20, 5)]).await.unwrap();
                let v = store
                    .decide(&[charge(&key, alg, 20, 3), refund(&key, alg, 20, 5)])
                    .await
                    .unwrap();
                assert!(v.admitted, "{alg:?}");
                let v = store.decide(&[hit(&key, alg, 20, 0)]).await.unwrap();
                assert_eq!(v.verdicts[0].remaining, 9, "{alg:?}: 8 + 3 spent");
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use store_contract;
