//! The memory store under many tasks at once, as several Envoy workers calling one
//! Sluice drive it: on a multi-thread runtime, on a manual clock that stands still,
//! so every outcome is fixed by the counts alone and no window is crossed.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::algorithm::{Algorithm, Limit, Micros, SECOND};
use crate::clock::{Clock, ManualClock};
use crate::store::memory::{MemoryStore, SHARDS};
use crate::store::testkit::{hit_of as hit, hourly, on_workers, HOUR};
use crate::store::{Hit, Spend, Store};

/// A multiple of every window used here.
const T0: Micros = 10_000 * HOUR;

/// What `key` has left of `limit`, read without spending.
fn remaining(store: &MemoryStore, key: &str, limit: Limit) -> u64 {
    store
        .peek_now(&[hit(key, limit, 0, Spend::IfAdmitted)])
        .verdicts[0]
        .remaining
}

#[test]
fn one_key_hit_by_many_tasks_admits_what_one_caller_would() {
    for algorithm in Algorithm::ALL {
        let limit = hourly(algorithm, 100);
        let clock = ManualClock::new(T0);
        let store = Arc::new(MemoryStore::new(Arc::new(clock.clone()), 1000));
        // 64 tasks, 40 requests each of 1 to 3 hits: far more than the limit.
        let s = store.clone();
        let admitted: Vec<Vec<(u64, bool)>> = on_workers(64, move |task| {
            let store = s.clone();
            async move {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(task as u64);
                let mut asked = Vec::new();
                for _ in 0..40 {
                    let n = rng.random_range(1..=3);
                    let v = store
                        .decide(&[hit("k", limit, n, Spend::IfAdmitted)])
                        .await
                        .expect("the memory store answers");
                    asked.push((n, v.admitted));
                    tokio::task::yield_now().await;
                }
                asked
            }
        });
        let asked: Vec<(u64, bool)> = admitted.into_iter().flatten().collect();
        let spent: u64 = asked.iter().filter(|a| a.1).map(|a| a.0).sum();
        let left = remaining(&store, "k", limit);
        // The clock stands still: what is left only shrank, so every denial asked
        // for more than is left now, and what was admitted is what is gone.
        assert_eq!(spent + left, 100, "{algorithm:?}: admitted {spent}");
        assert!(left < 3, "{algorithm:?}: {left} left");
        for &(n, ok) in &asked {
            assert!(ok || n > left, "{algorithm:?}: {n} denied with {left} left");
        }
    }
}

/// Keys that `store` places on `n` different shards.
fn on_distinct_shards(store: &MemoryStore, n: usize) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let mut shards = Vec::new();
    for i in 0.. {
        let key = format!("multi-{i}");
        let shard = MemoryStore::shard_of(store.hash(key.as_bytes()));
        if !shards.contains(&shard) {
            shards.push(shard);
            keys.push(key);
        }
        if keys.len() == n {
            break;
        }
    }
    keys
}

#[test]
fn overlapping_requests_over_shards_in_any_order_spend_only_when_admitted() {
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone()), 1000));
    // Six keys on six shards, each of its own algorithm and limit.
    let keys = on_distinct_shards(&store, 6);
    let limits: Vec<Limit> = (0..keys.len())
        .map(|i| hourly(Algorithm::ALL[i % Algorithm::ALL.len()], 40 + 10 * i as u64))
        .collect();
    let (k, l) = (keys.clone(), limits.clone());
    let s = store.clone();
    let requests: Vec<Vec<(Vec<usize>, bool)>> = on_workers(64, move |task| {
        let (store, keys, limits) = (s.clone(), k.clone(), l.clone());
        async move {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(1000 + task as u64);
            let mut out = Vec::new();
            for _ in 0..30 {
                // Two to four keys, in any order: their shards locked in another
                // order than the request names them.
                let mut named: Vec<usize> = (0..keys.len()).collect();
                named.shuffle(&mut rng);
                named.truncate(rng.random_range(2..=4));
                let hits: Vec<Hit> = named
                    .iter()
                    .map(|&i| hit(&keys[i], limits[i], 1, Spend::IfAdmitted))
                    .collect();
                let v = store.decide(&hits).await.expect("answered");
                out.push((named, v.admitted));
                tokio::task::yield_now().await;
            }
            out
        }
    });
    let requests: Vec<(Vec<usize>, bool)> = requests.into_iter().flatten().collect();
    let left: Vec<u64> = (0..keys.len())
        .map(|i| remaining(&store, &keys[i], limits[i]))
        .collect();
    let admitted = requests.iter().filter(|r| r.1).count();
    assert!(admitted > 0 && admitted < requests.len(), "{admitted}");
    for (i, key) in keys.iter().enumerate() {
        let counted = requests
            .iter()
            .filter(|(named, ok)| *ok && named.contains(&i))
            .count() as u64;
        assert_eq!(
            limits[i].requests - left[i],
            counted,
            "{key} ({:?}): spent only by admitted requests",
            limits[i].algorithm
        );
    }
    // Nothing comes back on a standing clock: a request denied was denied by a key
    // that has nothing left now.
    for (named, ok) in &requests {
        assert!(*ok || named.iter().any(|&i| left[i] == 0), "{named:?}");
    }
}

#[test]
fn slots_given_back_while_others_ask_leave_the_counter_whole() {
    for algorithm in Algorithm::ALL {
        let limit = hourly(algorithm, 20);
        let clock = ManualClock::new(T0);
        let store = Arc::new(MemoryStore::new(Arc::new(clock.clone()), 1000));
        let held = Arc::new(AtomicU64::new(0));
        let (s, h) = (store.clone(), held.clone());
        // 32 tasks take a slot, add and give back a cost reported meanwhile (a
        // charge, then its refund), and give the slot back: as a concurrency limit
        // and a stream's cost do.
        let taken: Vec<u64> = on_workers(32, move |_| {
            let (store, held) = (s.clone(), h.clone());
            async move {
                let ask = |n, spend| {
                    let store = store.clone();
                    async move { store.decide(&[hit("k", limit, n, spend)]).await.unwrap() }
                };
                let mut taken = 0;
                for _ in 0..50 {
                    if !ask(1, Spend::IfAdmitted).await.admitted {
                        tokio::task::yield_now().await;
                        continue;
                    }
                    taken += 1;
                    // Counted here only after the store counted it, and uncounted
                    // before it is given back: never more than the store holds.
                    let now_held = held.fetch_add(1, Relaxed) + 1;
                    assert!(now_held <= 20, "{algorithm:?}: {now_held} slots held");
                    let _ = ask(2, Spend::Always).await;
                    tokio::task::yield_now().await;
                    let _ = ask(2, Spend::Refund).await;
                    held.fetch_sub(1, Relaxed);
                    let _ = ask(1, Spend::Refund).await;
                }
                taken
            }
        });
        let taken: u64 = taken.iter().sum();
        assert!(taken > 20, "{algorithm:?}: slots reused ({taken})");
        assert_eq!(remaining(&store, "k", limit), 20, "{algorithm:?}");
    }
}

#[test]
fn a_flood_of_keys_from_many_tasks_keeps_the_bound_and_every_count_in_use() {
    // 8 counters a shard; keys that deny for an hour and keys in use within an
    // hour's window, then a flood of one-second keys from many tasks while the
    // clock moves on, so that flood keys go idle and make room for others.
    let max_keys = 8 * SHARDS;
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone()), max_keys));
    let held = hourly(Algorithm::FixedWindow, 3);
    for i in 0..32 {
        for _ in 0..3 {
            store.decide_now(&[hit(&format!("denying-{i}"), held, 1, Spend::IfAdmitted)]);
        }
        store.decide_now(&[hit(&format!("counting-{i}"), held, 1, Spend::IfAdmitted)]);
    }
    let second = Limit {
        window: SECOND,
        ..hourly(Algorithm::FixedWindow, 2)
    };
    let (s, c) = (store.clone(), clock.clone());
    let most: Vec<usize> = on_workers(33, move |task| {
        let (store, clock) = (s.clone(), c.clone());
        async move {
            let mut most = 0;
            for j in 0..2_000 {
                if task == 32 {
                    // The clock, and the bound as each step leaves it.
                    clock.advance(SECOND / 20);
                    most = most.max(store.active_keys());
                } else {
                    let key = format!("flood-{task}-{j}");
                    let _ = store
                        .decide(&[hit(&key, second, 1, Spend::IfAdmitted)])
                        .await;
                }
                tokio::task::yield_now().await;
            }
            most
        }
    });
    assert!(most[32] <= max_keys, "{} counters", most[32]);
    assert!(store.active_keys() <= max_keys);
    // Each flood key was refused, or kept and then dropped, or is still held: none
    // counted twice, and none of the others dropped.
    let e = store.evictions();
    let flood_held = store.active_keys() as u64 - 64;
    assert_eq!(
        e.refused + e.idle + e.expired + flood_held,
        32 * 2_000,
        "{e:?}"
    );
    assert!(e.idle + e.expired > 0, "{e:?}");
    assert!(clock.now() < T0 + HOUR, "still the same hour");
    for i in 0..32 {
        let v = store.decide_now(&[hit(&format!("denying-{i}"), held, 1, Spend::IfAdmitted)]);
        assert!(!v.admitted && v.failed.is_none(), "denying-{i} reset");
        assert_eq!(
            remaining(&store, &format!("counting-{i}"), held),
            2,
            "counting-{i}"
        );
    }
}
