//! `failure_mode: local` decided by many tasks at once, as several Envoy workers
//! calling one replica while its store is away drive it: on a multi-thread
//! runtime, on a manual clock that stands still.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::Local;
use crate::algorithm::{Algorithm, Limit};
use crate::clock::ManualClock;
use crate::store::testkit::{hit_of, hourly, on_workers, HOUR};
use crate::store::{
    Board, Fallback, Hit, Replicas, Settlement, Spend, Store, StoreError, Verdicts,
};

/// A hit decided locally while its shard (3) is away.
fn hit(key: &str, limit: Limit, hits: u64, spend: Spend) -> Hit {
    Hit {
        placement: 3,
        fallback: Fallback::Local,
        ..hit_of(key, limit, hits, spend)
    }
}

/// A replica of `replicas` that has heard from the store (counters it never
/// mentioned start with a whole share), on a clock standing at the start of an hour.
fn local(replicas: u32, max_keys: usize) -> Arc<Local> {
    let clock = ManualClock::new(10_000 * HOUR);
    let local = Local::new(Arc::new(clock), replicas, max_keys);
    local.learn(Replicas {
        live: replicas,
        missing: 0,
    });
    Arc::new(local)
}

/// The shared store as settlement sees it: what it took, net of refunds.
#[derive(Default)]
struct Taken {
    net: AtomicU64,
    refunded: AtomicU64,
}

impl Board for Taken {}

impl Store for Taken {
    async fn decide(&self, _hits: &[Hit]) -> Result<Verdicts, StoreError> {
        Err(StoreError::BackingOff)
    }

    async fn peek(&self, _hits: &[Hit]) -> Result<Verdicts, StoreError> {
        Err(StoreError::BackingOff)
    }

    fn active_keys(&self) -> usize {
        0
    }

    fn name(&self) -> &'static str {
        "taken"
    }

    async fn settle(&self, batch: &[Settlement]) -> Vec<Result<bool, StoreError>> {
        for s in batch {
            self.net.fetch_add(s.hit.hits, Relaxed);
            self.refunded.fetch_add(s.refund, Relaxed);
        }
        vec![Ok(true); batch.len()]
    }
}

#[test]
fn many_tasks_on_one_key_admit_the_share_and_settle_each_hit_once() {
    for algorithm in Algorithm::ALL {
        // 300 an hour over 3 replicas: a share of 100.
        let limit = hourly(algorithm, 300);
        let local = local(3, 1000);
        let taken = Arc::new(Taken::default());
        let (l, t) = (local.clone(), taken.clone());
        // 48 tasks take slots and give some back (a concurrency limit's release),
        // while one more settles what they spent, as the ticker does.
        let out: Vec<(u64, u64)> = on_workers(49, move |task| {
            let (local, taken) = (l.clone(), t.clone());
            async move {
                let (mut admitted, mut given_back) = (0, 0);
                for j in 0..60 {
                    if task == 48 {
                        local.settle(&*taken).await;
                    } else if local
                        .decide(&[hit("d|k", limit, 1, Spend::IfAdmitted)])
                        .admitted
                    {
                        admitted += 1;
                        if j % 4 == 0 {
                            local.decide(&[hit("d|k", limit, 1, Spend::Refund)]);
                            given_back += 1;
                        }
                    }
                    tokio::task::yield_now().await;
                }
                (admitted, given_back)
            }
        });
        let admitted: u64 = out.iter().map(|o| o.0).sum();
        let given_back: u64 = out.iter().map(|o| o.1).sum();
        // Nothing refills on a standing clock but what was given back.
        assert_eq!(admitted - given_back, 100, "{algorithm:?}");
        assert!(given_back > 0, "{algorithm:?}");
        // What was settled while they decided, and the rest: each hit once.
        settle_rest(&local, &taken);
        assert_eq!(local.unsettled_hits(), 0, "{algorithm:?}");
        let net = taken.net.load(Relaxed) - taken.refunded.load(Relaxed);
        assert_eq!(
            net, 100,
            "{algorithm:?}: settled, net of what was given back"
        );
    }
}

/// Settles what is left.
fn settle_rest(local: &Local, taken: &Taken) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(local.settle(taken));
}

#[test]
fn overlapping_requests_over_many_keys_spend_only_when_admitted() {
    // Two keys in both orders from many tasks; each request names both.
    let local = local(2, 1000);
    let (a, b) = (
        hourly(Algorithm::FixedWindow, 100),
        hourly(Algorithm::TokenBucket, 160),
    );
    let l = local.clone();
    let out: Vec<u64> = on_workers(48, move |task| {
        let local = l.clone();
        async move {
            let mut admitted = 0;
            for _ in 0..40 {
                let (x, y) = (
                    hit("d|a", a, 1, Spend::IfAdmitted),
                    hit("d|b", b, 1, Spend::IfAdmitted),
                );
                let hits = if task % 2 == 0 { [x, y] } else { [y, x] };
                admitted += u64::from(local.decide(&hits).admitted);
                tokio::task::yield_now().await;
            }
            admitted
        }
    });
    let admitted: u64 = out.iter().sum();
    // Shares of 50 and 80: the first denies once its 50 are spent, and the second
    // was spent only by the requests admitted.
    assert_eq!(admitted, 50);
    assert_eq!(local.counters.counter("d|a"), Some(50));
    assert_eq!(local.counters.counter("d|b"), Some(50));
}

#[test]
fn the_local_counters_keep_every_key_below_max_keys() {
    // However the keys of a full table spread over the local counters' shards,
    // each is kept and counted: none is lifted before --max-keys counters owe.
    for round in 0..40 {
        let local = local(1, 512);
        let limit = hourly(Algorithm::FixedWindow, 5);
        for i in 0..512 {
            let v = local.decide(&[hit(&format!("d|k={i}"), limit, 1, Spend::IfAdmitted)]);
            assert!(
                v.admitted && v.failed.is_none(),
                "round {round}: key {i} of 512 not kept"
            );
        }
        let v = local.decide(&[hit("d|k=one-more", limit, 1, Spend::IfAdmitted)]);
        assert!(v.failed.is_some(), "the 513th is not kept");
        assert_eq!(local.unsettled_hits(), 512);
    }
}
