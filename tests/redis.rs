//! The Redis store against real redis-server processes: the store contract, Lua
//! against Rust, placement, passwords, the local denial cache, failure and recovery,
//! and exactness across replicas of the real binary.
//!
//! Every test returns early with a loud message when redis-server is not installed.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::{available, command_calls, keys, script_calls, RedisCluster, RedisServer};
use sluice::algorithm::{Algorithm, Limit, Micros, SECOND};
use sluice::clock::{Clock, ManualClock};
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::store::redis::cluster::Cluster;
use sluice::store::redis::{shard, Options, RedisStore};
use sluice::store::{Board, Fallback, Hit, MemoryStore, Mode, Spend, Store, StoreError, Verdicts};
use tonic::transport::Channel;

/// What a probed decision waits for its shards, as the limiter's store timeout.
const WAIT: Duration = Duration::from_secs(1);

/// A Redis store with the servers it runs on, which live as long as it does.
struct TestStore {
    store: RedisStore,
    servers: Vec<RedisServer>,
    metrics: Arc<sluice::telemetry::Metrics>,
}

impl TestStore {
    /// Decides a batch of one hit.
    async fn one(&self, h: &Hit) -> Verdicts {
        decide_one(&self.store, h).await
    }

    /// Decides `h` (of one hit) until its limit is reached, then once more: denied.
    async fn fill(&self, h: &Hit) {
        for _ in 0..h.limit.requests {
            assert!(self.one(h).await.admitted);
        }
        assert!(!self.one(h).await.admitted);
    }

    /// A store on `shards` fresh servers, on Redis TIME or on `clock`.
    async fn start(shards: usize, clock: Option<Arc<dyn Clock>>) -> TestStore {
        let mut servers = Vec::new();
        for _ in 0..shards {
            servers.push(RedisServer::start().await);
        }
        let urls = servers.iter().map(RedisServer::url).collect();
        let metrics = Arc::new(sluice::telemetry::Metrics::new());
        let mut opts = Options::new(urls, false);
        opts.fixed_clock = clock;
        let store = RedisStore::new(opts, Some(metrics.clone())).expect("store");
        TestStore {
            store,
            servers,
            metrics,
        }
    }
}

impl Board for TestStore {}

impl Store for TestStore {
    async fn decide(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        self.store.decide(hits).await
    }

    async fn peek(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        self.store.peek(hits).await
    }

    fn active_keys(&self) -> usize {
        0
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

/// A store on `server` alone, on Redis TIME.
fn store_on(server: &RedisServer) -> RedisStore {
    RedisStore::new(Options::new(vec![server.url()], false), None).expect("store")
}

/// `store`'s decision on a batch of `h` alone.
async fn decide_one(store: &RedisStore, h: &Hit) -> Verdicts {
    store
        .decide(std::slice::from_ref(h))
        .await
        .expect("decided")
}

/// `None` (and a loud message) when redis-server is missing.
async fn start(shards: usize) -> Option<TestStore> {
    if !available() {
        return None;
    }
    Some(TestStore::start(shards, None).await)
}

/// As [`start`], deciding at one instant (the start of an hour), as the memory
/// store's contract does: on Redis TIME a window could end between two calls of a
/// test that counts exactly and start its count again.
async fn start_fixed(shards: usize) -> Option<TestStore> {
    if !available() {
        return None;
    }
    let clock = ManualClock::new(1_764_000_000 * SECOND);
    Some(TestStore::start(shards, Some(Arc::new(clock))).await)
}

mod contract_one_shard {
    use super::*;
    crate::common::contract::store_contract!(match start_fixed(1).await {
        Some(s) => s,
        None => return,
    });
}

mod contract_two_shards {
    use super::*;
    // Two-key batches usually span both shards: what one consumed is given back.
    crate::common::contract::store_contract!(match start_fixed(2).await {
        Some(s) => s,
        None => return,
    });
}

/// The contract's hit, with a limit of `requests` per `window`.
fn hit(key: &str, algorithm: Algorithm, requests: u64, window: Micros, hits: u64) -> Hit {
    let h = common::contract::hit(key, algorithm, requests, hits);
    Hit {
        limit: Limit { window, ..h.limit },
        ..h
    }
}

/// A small deterministic generator, so a failure replays.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test]
async fn lua_decides_exactly_like_the_rust_algorithms() {
    lua_matches_rust(7, false).await;
}

/// The same comparison where half the batches settle costs: charges spent whole past
/// the limit and refunds given back, mixed in one call, on every algorithm.
#[tokio::test]
async fn lua_charges_and_refunds_exactly_like_the_rust_algorithms() {
    lua_matches_rust(11, true).await;
}

/// Random batches decided by the memory store (the Rust algorithms) and by Lua on two
/// Redis shards at the same fixed times must answer the same; with `settles`, half
/// the batches are charges and refunds.
async fn lua_matches_rust(seed: u64, settles: bool) {
    if !available() {
        return;
    }
    let servers = [RedisServer::start().await, RedisServer::start().await];
    let clock = ManualClock::new(1_764_000_000 * SECOND + 123_457);
    let mut opts = Options::new(servers.iter().map(RedisServer::url).collect(), false);
    opts.fixed_clock = Some(Arc::new(clock.clone()));
    opts.cache_capacity = 0;
    let redis = RedisStore::new(opts, None).expect("store");
    let memory = MemoryStore::new(Arc::new(clock.clone()), 100_000);

    // (requests, window, burst): small and realistic limits, including ones whose
    // requests * window is far beyond 2^53 (a million per day, 2^40 per hour), and
    // ones whose interval is no whole number of microseconds (3 a second, 37 a day).
    let limits: [(u64, Micros, u64); 10] = [
        (5, SECOND, 5),
        (3, SECOND, 3),
        (37, DAY, 37),
        (3, 10, 1),
        (7, 1_000, 3),
        (1_000, 60 * SECOND, 1_000),
        (1_000_000, DAY, 50_000),
        (1 << 40, 3_600 * SECOND, 1 << 40),
        (10, 7 * DAY, 4),
        (0, SECOND, 3),
    ];
    let algorithms = sluice::algorithm::Algorithm::ALL;
    let mut rng = Lcg(seed);
    let mut compared = 0;
    let mut full = 0;
    let mut owing = 0;
    let mut never = 0;
    let mut late = 0;
    // Each shared key's last rate, and the hits read under another.
    let mut rates = std::collections::HashMap::new();
    let mut rescaled = 0;
    for step in 0..2_000 {
        let n = 1 + rng.next(3) as usize;
        let settle = settles && rng.next(2) == 0;
        let mut batch = Vec::new();
        for _ in 0..n {
            let (r, w, b) = limits[rng.next(limits.len() as u64) as usize];
            let alg = algorithms[rng.next(5) as usize];
            // A quarter of the buckets' keys change limits, as a policy change does:
            // their state is read under another rate.
            let bucket = matches!(alg, Algorithm::TokenBucket | Algorithm::LeakyBucket);
            let key = match rng.next(4) {
                0 if bucket => format!("eq-{}-any-{}", alg.as_str(), rng.next(3)),
                _ => format!("eq-{}-{}-{}-{}", alg.as_str(), r, w, rng.next(3)),
            };
            if rates
                .insert(key.clone(), (r, w))
                .is_some_and(|was| was != (r, w))
            {
                rescaled += 1;
            }
            let hits = match rng.next(10) {
                0 => 0,
                1 => r.saturating_add(1).min(1 << 41),
                2 => 1 + rng.next(5),
                // A large share of the limit: counts whose products with windows
                // pass 2^53 (the scripts' slow, exact path).
                3 => rng.next(r / 2 + 2),
                // A charge whose bucket debt runs past the end of time (2^53 µs):
                // as much as fits is owed.
                4 if settle => 1 << 40,
                _ => 1,
            };
            let mut h = hit(&key, alg, r, w, hits);
            h.limit.burst = b;
            h.mode = match rng.next(12) {
                0 => Mode::Shadow,
                1 => Mode::Quota,
                _ => Mode::Enforce,
            };
            if settle {
                h.spend = match rng.next(3) {
                    0 => Spend::Refund,
                    _ => Spend::Always,
                };
            }
            // A caller's deadline: a leaky_bucket turn past it is denied.
            if alg == Algorithm::LeakyBucket && rng.next(2) == 0 {
                h.max_delay = rng.next(2 * w.min(SECOND));
            }
            batch.push(h);
        }
        let want = memory.decide(&batch).await.expect("memory");
        let got = redis.decide(&batch).await.expect("redis");
        // `now` aside: only the memory store decides on the process clock.
        assert_eq!(
            (got.admitted, &got.verdicts),
            (want.admitted, &want.verdicts),
            "step {step}: {batch:#?}"
        );
        compared += batch.len();
        full += want.verdicts.iter().filter(|v| v.next_room > 0).count();
        late += want.verdicts.iter().filter(|v| v.late).count();
        owing += want.verdicts.iter().filter(|v| v.owed > 0).count();
        // Denials no wait ends, whose retry-after waits for one hit to fit.
        never += want
            .verdicts
            .iter()
            .filter(|v| v.retry_after == u64::MAX && v.next_room > 0 && v.next_room < u64::MAX)
            .count();
        if settles {
            // A peek (Explain) reports what each key owes now, alike. Keys of windows
            // under a second are left out: Redis expires them on its own clock, which
            // runs on while this test's stands still, so one may be gone by the peek.
            let asked: Vec<Hit> = batch
                .iter()
                .filter(|h| h.limit.window >= SECOND)
                .map(|h| Hit {
                    spend: Spend::IfAdmitted,
                    ..h.clone()
                })
                .collect();
            let owed = |v: Verdicts| v.verdicts.iter().map(|v| v.owed).collect::<Vec<_>>();
            let want = owed(memory.peek(&asked).await.expect("memory peek"));
            let got = owed(redis.peek(&asked).await.expect("redis peek"));
            assert_eq!(got, want, "step {step}: peek {asked:#?}");
        }
        // Mostly small steps (within windows), sometimes a jump over them.
        let dt = match rng.next(20) {
            0 => rng.next(3 * DAY),
            1..=3 => rng.next(2 * 60 * SECOND),
            _ => rng.next(300_000),
        };
        clock.advance(dt);
    }
    assert!(compared > 2_000);
    // Enough buckets read under another rate than they were last used with.
    assert!(rescaled > 100, "{rescaled} hits under a changed rate");
    // Enough admissions that left no room, so next_room was compared too.
    assert!(full > 100, "{full} full admissions");
    // And enough requests larger than their limit on keys with no room, so the wait
    // until one hit fits was compared for them too.
    assert!(never > 10, "{never} denials that no wait ends");
    // Enough leaky_bucket turns past their caller's deadline.
    if !settles {
        assert!(late > 20, "{late} late turns");
    }
    // With charges, enough that left their key owing, so what it owes was compared.
    if settles {
        assert!(owing > 100, "{owing} charges that left a debt");
    }
}

/// One server and a store on it deciding at the clock's time (from a fixed instant),
/// without the denial cache; `None` without redis-server.
async fn fixed_time_store() -> Option<(RedisServer, ManualClock, RedisStore)> {
    let server = RedisServer::if_available().await?;
    let clock = ManualClock::new(1_764_000_000 * SECOND);
    let mut opts = Options::new(vec![server.url()], false);
    opts.fixed_clock = Some(Arc::new(clock.clone()));
    opts.cache_capacity = 0;
    let store = RedisStore::new(opts, None).expect("store");
    Some((server, clock, store))
}

/// A calendar budget on Redis, decided on the script's clock with the window the
/// limiter computes (`Calendar::limit`): a 25-hour Berlin day is one budget, local
/// midnight starts the next, and a month ends at local midnight of the 1st, as the
/// memory store decides on the same clock.
#[tokio::test]
async fn calendar_windows_reset_at_local_midnight_on_redis_as_in_memory() {
    let Some((_server, clock, redis)) = fixed_time_store().await else {
        return;
    };
    let memory = MemoryStore::new(Arc::new(clock.clone()), 1_000);
    let at = |s: &str| {
        let t: jiff::Timestamp = s.parse().expect("a time");
        t.as_microsecond() as Micros
    };
    let day = sluice::policy::Calendar::new(sluice::policy::Period::Day, "Europe/Berlin")
        .expect("a zone");
    let month = sluice::policy::Calendar::new(sluice::policy::Period::Month, "Europe/Berlin")
        .expect("a zone");
    // (time, calendar, key, hits, admitted, reset or retry_after in seconds)
    let steps: [(&str, &sluice::policy::Calendar, &str, u64, bool, u64); 9] = [
        // 2026-10-25 has 25 hours: local 00:30 and 23:30 are one day.
        (
            "2026-10-24T22:30:00Z",
            &day,
            "cal-day",
            2,
            true,
            24 * 3600 + 1800,
        ),
        ("2026-10-25T22:30:00Z", &day, "cal-day", 1, true, 1800),
        ("2026-10-25T22:59:59Z", &day, "cal-day", 1, false, 1),
        ("2026-10-25T23:00:00Z", &day, "cal-day", 3, true, 24 * 3600),
        // March 2026 ends at 22:00 UTC on the 31st (CEST), and April has 30 days.
        (
            "2026-03-01T00:00:00Z",
            &month,
            "cal-month",
            3,
            true,
            30 * 86_400 + 22 * 3600,
        ),
        ("2026-03-31T21:59:59Z", &month, "cal-month", 1, false, 1),
        (
            "2026-03-31T22:00:00Z",
            &month,
            "cal-month",
            3,
            true,
            30 * 86_400,
        ),
        ("2026-04-30T21:59:00Z", &month, "cal-month", 1, false, 60),
        (
            "2026-04-30T22:00:00Z",
            &month,
            "cal-month",
            1,
            true,
            31 * 86_400,
        ),
    ];
    for (time, calendar, key, hits, admitted, wait) in steps {
        clock.set(at(time));
        let mut h = hit(key, Algorithm::FixedWindow, 3, 86_400 * SECOND, hits);
        h.limit = calendar.limit(h.limit, clock.now());
        let (on_redis, in_memory) = on_both(&redis, &memory, &h).await;
        let v = on_redis.verdicts[0];
        assert_eq!(v.admitted, admitted, "{time} {key}");
        let shown = if admitted { v.reset } else { v.retry_after };
        assert_eq!(shown, wait * SECOND, "{time} {key}");
        assert_eq!(
            (v.admitted, v.remaining, v.reset, v.retry_after),
            {
                let m = in_memory.verdicts[0];
                (m.admitted, m.remaining, m.reset, m.retry_after)
            },
            "{time} {key}: Redis and memory differ"
        );
    }
}

/// `algorithm: concurrency` on Redis as in memory, on one clock: +1 per stream (a
/// charge), -1 at its refund, and a slot whose refund never comes is free once its
/// lease ends.
#[tokio::test]
async fn concurrency_slots_are_refunded_or_leased_on_redis_as_in_memory() {
    let Some((_server, clock, redis)) = fixed_time_store().await else {
        return;
    };
    let memory = MemoryStore::new(Arc::new(clock.clone()), 1_000);
    let text = "domain: d
descriptors:
  - key: k
    rate_limit: {algorithm: concurrency, requests_per_unit: 2, lease: 5m}
";
    let policy = sluice::policy::compile(sluice::policy::parse_str("p.yaml", text).unwrap())
        .expect("compiles");
    let limit = policy.rules[0].limit.expect("a limit");
    let t0 = clock.now();
    let mut slot = hit("inflight", Algorithm::SlidingWindowLog, 2, 1, 1);
    slot.limit = limit;
    // (seconds after t0, refund, admitted)
    let steps = [
        (0, false, true),
        (1, false, true),
        (2, false, false),
        (2, true, true),
        (3, true, true),
        (3, false, true),
        (4, false, false),
        (4, true, true),
        // Two slots are held with no refund coming; a refund takes the newest entry,
        // so they are the entries of 0 s and 3 s, each free when its lease ends.
        (300, false, true),
        (300, false, false),
        (300, true, true),
        (302, false, false),
        (302, true, true),
        (303, false, true),
    ];
    for (at, refund, admitted) in steps {
        clock.set(t0 + at * SECOND);
        slot.spend = if refund { Spend::Refund } else { Spend::Always };
        let (on_redis, in_memory) = on_both(&redis, &memory, &slot).await;
        assert_eq!(on_redis.admitted, admitted, "{at} s, refund {refund}");
        assert_eq!(
            in_memory.admitted, admitted,
            "{at} s, refund {refund}: memory"
        );
        assert_eq!(
            on_redis.verdicts[0].remaining, in_memory.verdicts[0].remaining,
            "{at} s, refund {refund}"
        );
    }
}

/// What charges past the limit leave a key owing reaches `sluice_debt` through the
/// real binary on Redis: two charges of 25 on a limit of 10 owe 40, in a window and
/// in a bucket (the decide script's answer, not the memory store's).
#[tokio::test]
async fn sluice_debt_shows_what_a_key_owes_on_redis() {
    let Some(server) = RedisServer::if_available().await else {
        return;
    };
    let policy = r#"
domain: llm
descriptors:
  - key: window
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window_counter}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}
"#;
    // The harness's store timeout, which no busy machine reaches: a timed-out charge
    // would be answered by the failure mode, not by Redis.
    let sluice = common::Server::start(policy, &["--redis", &server.url(), "--peak-window", "1s"]);
    let mut client = sluice.client().await;
    let labels = |rule| [("domain", "llm"), ("rule", rule)];
    // Both costs in one call, as Envoy reports them at stream end. A fresh key each
    // round: the gauge only ever shows 40 or less, and is read while answers keep
    // reporting it.
    let deadline = Instant::now() + Duration::from_secs(10);
    for round in 0.. {
        let key = format!("k{round}");
        let charge = || {
            common::request(
                "llm",
                vec![
                    common::desc_hits(&[("window", &key)], 25),
                    common::desc_hits(&[("bucket", &key)], 25),
                ],
            )
        };
        for _ in 0..2 {
            let r = common::call(&mut client, charge()).await;
            assert_eq!(r.overall_code, common::OVER_LIMIT);
        }
        let seen = (
            sluice.metric("sluice_debt", &labels("window")),
            sluice.metric("sluice_debt", &labels("bucket")),
        );
        if seen == (Some(40.0), Some(40.0)) {
            break;
        }
        assert!(Instant::now() < deadline, "debt: {seen:?}, not 40 and 40");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Spent on Redis, not in the replica's memory: a check there is refused.
    let check = common::request("llm", vec![common::desc_hits(&[("bucket", "k0")], 0)]);
    let r = common::call(&mut client, check).await;
    assert_eq!(r.overall_code, common::OVER_LIMIT);
    let mut conn = server.conn().await;
    assert!(keys(&mut conn).await.iter().any(|k| k.contains("k0")));
}

/// `h` decided on Redis and on the memory store, in that order.
async fn on_both(redis: &RedisStore, memory: &MemoryStore, h: &Hit) -> (Verdicts, Verdicts) {
    let one = std::slice::from_ref(h);
    let on_redis = redis.decide(one).await.expect("decided on Redis");
    let in_memory = memory.decide(one).await.expect("decided in memory");
    (on_redis, in_memory)
}

/// A sliding log's members, oldest first.
async fn log_members(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .expect("ZRANGE")
}

#[tokio::test]
async fn a_sliding_log_written_by_an_older_sluice_counts_and_is_rewritten() {
    let Some((server, clock, store)) = fixed_time_store().await else {
        return;
    };
    let t = clock.now();
    let h = hit("legacy", Algorithm::SlidingWindowLog, 5, 60 * SECOND, 1);
    let key = shard::redis_key("sluice:", &h);
    let mut conn = server.conn().await;
    // The members an older sluice wrote ("timestamp:hits"), one already expired.
    for (at, hits) in [
        (t - 70 * SECOND, 3),
        (t - 30 * SECOND, 1),
        (t - 20 * SECOND, 2),
        (t - 10 * SECOND, 1),
    ] {
        let _: () = redis::cmd("ZADD")
            .arg(&key)
            .arg(at)
            .arg(format!("{at}:{hits}"))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    // A check reads them (4 live hits) and writes nothing.
    let check = Hit {
        hits: 0,
        ..h.clone()
    };
    let v = decide_one(&store, &check).await;
    assert_eq!(v.verdicts[0].remaining, 1);
    assert_eq!(log_members(&mut conn, &key).await.len(), 4);
    // An admission rewrites the live entries with what came before each.
    let v = decide_one(&store, &h).await;
    assert!(v.admitted);
    assert_eq!(v.verdicts[0].remaining, 0);
    let t = |ago: u64| t - ago * SECOND;
    assert_eq!(
        log_members(&mut conn, &key).await,
        [
            format!("{}:0:1", t(30)),
            format!("{}:1:2", t(20)),
            format!("{}:3:1", t(10)),
            format!("{}:4:1", t(0)),
        ]
    );
    // Full: denied until the oldest live entry leaves the window.
    let v = decide_one(&store, &h).await;
    assert!(!v.admitted);
    assert_eq!(v.verdicts[0].retry_after, 30 * SECOND);
    // A request of three hits waits for the first three live hits to expire.
    let three = Hit {
        hits: 3,
        ..h.clone()
    };
    let v = decide_one(&store, &three).await;
    assert_eq!(v.verdicts[0].retry_after, 40 * SECOND);
}

#[tokio::test]
async fn a_sliding_log_refund_keeps_the_live_count_exact() {
    use sluice::store::redis::scripts::{self, refund_call, Scripts};
    let Some((server, clock, store)) = fixed_time_store().await else {
        return;
    };
    let h = hit("refund-log", Algorithm::SlidingWindowLog, 3, 60 * SECOND, 1);
    let key = shard::redis_key("sluice:", &h);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let v = decide_one(&store, &h).await;
        assert!(v.admitted);
        tokens.push(clock.now() as i64);
        clock.advance(SECOND);
    }
    assert!(!decide_one(&store, &h).await.admitted);
    // The middle entry is given back (its request was denied on another shard):
    // the entry after it no longer counts it.
    let mut conn = server.conn().await;
    let scripts = Scripts::default();
    let call = refund_call(
        &scripts,
        "sluice:",
        std::slice::from_ref(&h),
        &[(0, tokens[1])],
    );
    scripts::invoke(&server.pool(), &call).await.unwrap();
    assert_eq!(
        log_members(&mut conn, &key).await,
        [format!("{}:0:1", tokens[0]), format!("{}:1:1", tokens[2])]
    );
    let v = decide_one(&store, &h).await;
    assert!(v.admitted, "the refunded hit is room again");
    assert_eq!(v.verdicts[0].remaining, 0);
    let v = decide_one(&store, &h).await;
    assert!(!v.admitted);
    // Room again when the oldest entry leaves the window, 60 s after it came.
    assert_eq!(
        v.verdicts[0].retry_after,
        tokens[0] as u64 + 60 * SECOND - clock.now()
    );
}

#[tokio::test]
async fn each_key_lives_on_exactly_the_shard_its_placement_picks() {
    let Some(t) = start(3).await else { return };
    let n = 300;
    for i in 0..n {
        let h = hit(
            &format!("placed-{i}"),
            Algorithm::FixedWindow,
            10,
            60 * SECOND,
            1,
        );
        assert!(t.store.decide(&[h]).await.expect("decide").admitted);
    }
    let mut total = 0;
    for (index, server) in t.servers.iter().enumerate() {
        let mut conn = server.conn().await;
        let ks = keys(&mut conn).await;
        total += ks.len();
        assert!(ks.len() > n / 6, "shard {index} holds only {}", ks.len());
        for k in ks {
            let counter = k
                .split_once("}:")
                .and_then(|(_, rest)| rest.strip_suffix(":fw"))
                .expect("key format");
            let placement = sluice::hash::stable_hash(counter.as_bytes());
            assert_eq!(shard::jump_hash(placement, 3), index, "{k}");
        }
    }
    assert_eq!(total, n, "every key on exactly one shard");
}

#[tokio::test]
async fn keys_expire_when_idle() {
    let Some(t) = start(1).await else { return };
    for alg in sluice::algorithm::Algorithm::ALL {
        let h = hit(&format!("ttl-{}", alg.as_str()), alg, 5, 60 * SECOND, 1);
        assert!(t.store.decide(&[h]).await.expect("decide").admitted);
    }
    let mut conn = t.servers[0].conn().await;
    for k in keys(&mut conn).await {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        // Fixed windows end sooner; everything else within two windows.
        assert!(ttl > 0 && ttl <= 120_000, "{k}: {ttl}");
    }
}

/// A fixed window or sliding counter written again in its window keeps the expiry it
/// has (its window's end: decide.lua rewrites it with KEEPTTL), while a state left
/// from an earlier window, however long its TTL, gets the new window's expiry.
#[tokio::test]
async fn counters_expire_at_the_end_of_the_window_they_count() {
    let Some(t) = start(1).await else { return };
    let mut conn = t.servers[0].conn().await;
    let probe = conn.clone();
    let pttl = |k: String| {
        let mut c = probe.clone();
        async move {
            let v: i64 = redis::cmd("PTTL")
                .arg(&k)
                .query_async(&mut c)
                .await
                .expect("PTTL");
            v
        }
    };
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let name = format!("window-{}", alg.as_str());
        let h = hit(&name, alg, 100, 3_600 * SECOND, 1);
        assert!(t.one(&h).await.admitted);
        let key = keys(&mut conn)
            .await
            .into_iter()
            .find(|k| k.contains(&name))
            .expect("key written");
        let first = pttl(key.clone()).await;
        assert!(first > 0 && first <= 3_600_000 * 2, "{alg:?}: {first}");

        // Again in the same window: counted, and the expiry did not move later.
        let r = t.one(&h).await;
        assert_eq!(r.verdicts[0].remaining, 98, "{alg:?}");
        let second = pttl(key.clone()).await;
        assert!(
            second > 0 && second <= first,
            "{alg:?}: {first} then {second}"
        );

        // A state from two windows ago with a TTL far past this window's end: the
        // next write counts from zero and ends with this window.
        let value: String = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let start: i64 = value.split(' ').next().unwrap().parse().unwrap();
        let stale = match alg {
            Algorithm::FixedWindow => format!("{} 50", start - 2 * 3_600_000_000),
            _ => format!("{} 0 50", start - 2 * 3_600_000_000),
        };
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(stale)
            .arg("PX")
            .arg(10 * 3_600_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let r = t.one(&h).await;
        assert_eq!(
            r.verdicts[0].remaining, 99,
            "{alg:?}: the stale count is gone"
        );
        let third = pttl(key.clone()).await;
        assert!(
            third > 0 && third <= second,
            "{alg:?}: {second} then {third}"
        );
    }
}

#[tokio::test]
async fn passwords_in_urls_work() {
    if !available() {
        return;
    }
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]).await;
    let url = format!("redis://:s3cret@127.0.0.1:{}", server.port);
    let store = RedisStore::new(Options::new(vec![url], false), None).expect("store");
    let h = hit("auth", Algorithm::TokenBucket, 2, SECOND, 1);
    assert!(store.decide(&[h]).await.expect("decide").admitted);

    let bad = format!("redis://:wrong@127.0.0.1:{}", server.port);
    let store = RedisStore::new(Options::new(vec![bad], false), None).expect("store");
    let h = hit("auth", Algorithm::TokenBucket, 2, SECOND, 1);
    assert!(store.decide(&[h]).await.is_err());
    assert_eq!(store.shard_names(), vec![server.addr()]);

    // A user of its own (ACL) and a database number: the counter lands in that
    // database, under that user.
    let mut admin = redis::Client::open(format!("redis://:s3cret@127.0.0.1:{}", server.port))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "limiter", "on", ">pw2", "~*", "+@all"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://limiter:pw2@127.0.0.1:{}/3", server.port);
    let store = RedisStore::new(Options::new(vec![url], false), None).expect("store");
    let h = hit("in-db-3", Algorithm::TokenBucket, 2, SECOND, 1);
    assert!(store.decide(&[h]).await.expect("decide").admitted);
    let _: () = redis::cmd("SELECT")
        .arg(3)
        .query_async(&mut admin)
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*in-db-3*")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
}

/// Redis can lose what it said (a restart without persistence, FLUSHALL, an
/// operator's DEL): a key denied from memory is admitted again once Redis has
/// forgotten it, within the cache's recheck, not at the end of its hour.
#[tokio::test]
async fn a_counter_redis_lost_is_not_denied_from_memory_for_long() {
    let Some(t) = start(1).await else { return };
    let mut conn = t.servers[0].conn().await;
    let h = hit("lost", Algorithm::FixedWindow, 3, 3_600 * SECOND, 1);
    t.fill(&h).await;
    assert_eq!(t.store.cached_denials(), 1);
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !t.one(&h).await.admitted {
        assert!(
            std::time::Instant::now() < deadline,
            "still denied from memory"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn over_limit_keys_are_answered_from_memory_until_retry_after() {
    let Some(t) = start(1).await else { return };
    let mut conn = t.servers[0].conn().await;
    let h = hit("cached", Algorithm::FixedWindow, 3, 3_600 * SECOND, 1);
    t.fill(&h).await;
    let before = script_calls(&mut conn).await;
    for _ in 0..200 {
        let v = t.one(&h).await;
        assert!(!v.admitted);
        assert!(v.verdicts[0].retry_after > 0);
    }
    assert_eq!(script_calls(&mut conn).await, before, "no Redis call");
    assert_eq!(t.store.cached_denials(), 1);
    // Operators see what the cache saved: the 200, and the first denial (the third
    // admission filled the key and primed the cache).
    assert!(
        t.metrics
            .render()
            .contains("sluice_denial_cache_answers_total 201\n"),
        "{}",
        t.metrics.render()
    );

    // A check (0 hits) and another key still go to Redis.
    let check = hit("cached", Algorithm::FixedWindow, 3, 3_600 * SECOND, 0);
    t.store.decide(&[check]).await.unwrap();
    assert_eq!(script_calls(&mut conn).await, before + 1);

    // An admission that fills a sliding key primes the cache too: the next request
    // is denied from memory.
    for alg in [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog] {
        let h = hit(&format!("full-{}", alg.as_str()), alg, 3, 3_600 * SECOND, 1);
        for _ in 0..3 {
            assert!(t.one(&h).await.admitted);
        }
        let before = script_calls(&mut conn).await;
        let v = t.one(&h).await;
        assert!(!v.admitted, "{alg:?}");
        assert!(v.verdicts[0].retry_after > 0, "{alg:?}");
        assert_eq!(
            script_calls(&mut conn).await,
            before,
            "{alg:?}: no Redis call"
        );
    }

    // A short denial expires and Redis is asked again.
    let short = hit("short", Algorithm::TokenBucket, 10, SECOND, 1);
    let mut short = short;
    short.limit.burst = 1;
    assert!(t.one(&short).await.admitted);
    let v = t.one(&short).await;
    let denied = Instant::now();
    assert!(!v.admitted);
    // Asked again until admitted: no call made 5 ms past retry-after is still denied.
    let free = Duration::from_micros(v.verdicts[0].retry_after) + Duration::from_millis(5);
    loop {
        let asked = denied.elapsed();
        if t.one(&short).await.admitted {
            break;
        }
        assert!(
            asked < free,
            "still denied {asked:?} after a denial for {free:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn scripts_are_reloaded_after_a_restart() {
    let Some(mut t) = start(1).await else { return };
    let h = hit("reload", Algorithm::SlidingWindowLog, 100, 60 * SECOND, 1);
    assert!(t.one(&h).await.admitted);
    let mut conn = t.servers[0].conn().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(t.one(&h).await.admitted);
    t.servers[0].restart().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match t.store.decide(std::slice::from_ref(&h)).await {
            Ok(v) => {
                assert!(v.admitted);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "no recovery: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Calls a store from 8 callers until stopped, counting how each call ended.
struct Load {
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Counts {
    ok: AtomicU64,
    /// Answered at once because the shard was backing off.
    backing_off: AtomicU64,
    /// Any other store error (timeouts, connection errors).
    failed: AtomicU64,
    /// Calls each caller has completed.
    done: [AtomicU64; CALLERS],
}

const CALLERS: usize = 8;

impl Load {
    fn start(store: Arc<RedisStore>) -> Load {
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..CALLERS)
            .map(|c| {
                let (store, stop, counts) = (store.clone(), stop.clone(), counts.clone());
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while !stop.load(Relaxed) {
                        let key = format!("load-{c}-{}", i % 50);
                        i += 1;
                        let h = hit(&key, Algorithm::FixedWindow, 1_000_000, 60 * SECOND, 1);
                        let counter = match store.decide(&[h]).await {
                            Ok(_) => &counts.ok,
                            Err(StoreError::BackingOff) => &counts.backing_off,
                            Err(_) => &counts.failed,
                        };
                        counter.fetch_add(1, Relaxed);
                        counts.done[c].fetch_add(1, Relaxed);
                        // Paces the load; not a wait for anything.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                })
            })
            .collect();
        Load {
            counts,
            stop,
            tasks,
        }
    }

    /// Calls each caller has completed so far.
    fn done(&self) -> [u64; CALLERS] {
        std::array::from_fn(|c| self.counts.done[c].load(Relaxed))
    }

    /// Waits until every caller has completed `more` calls since `since`.
    async fn wait_calls(&self, since: [u64; CALLERS], more: u64) {
        common::eventually(Duration::from_secs(10), "calls of every caller", || {
            let done = self.done();
            async move { done.iter().zip(since).all(|(&d, s)| d >= s + more) }
        })
        .await;
    }

    async fn stop(self) -> Arc<Counts> {
        self.stop.store(true, Relaxed);
        for t in self.tasks {
            t.await.expect("load task");
        }
        self.counts
    }
}

/// When each call to a store failed, as the shard's health heard of it.
#[derive(Debug, Default)]
struct FailedCalls(std::sync::Mutex<Vec<Instant>>);

impl sluice::store::Report for FailedCalls {
    fn shard_declared(&self, _: &str, _: &str) {}

    fn store_error(&self, _: &str, _: &str, _: sluice::store::ErrorKind) {
        self.0.lock().unwrap().push(Instant::now());
    }

    fn denial_cache_answer(&self) {}
}

impl FailedCalls {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The calls failed after the first `from`: how many, and first to last.
    fn since(&self, from: usize) -> (usize, Duration) {
        let at = self.0.lock().unwrap();
        let new = &at[from.min(at.len())..];
        let span = match (new.first(), new.last()) {
            (Some(first), Some(last)) => last.duration_since(*first),
            _ => Duration::ZERO,
        };
        (new.len(), span)
    }
}

/// One shard whose calls give up after 15 ms (the default `--store-timeout`), under a
/// steady load: every caller has made 20 calls already. Its failed calls are
/// recorded. `None` without redis-server.
async fn loaded_shard() -> Option<(RedisServer, Arc<RedisStore>, Load, Arc<FailedCalls>)> {
    let server = RedisServer::if_available().await?;
    let mut opts = Options::new(vec![server.url()], false);
    opts.call_timeout = Duration::from_millis(15);
    let failed = Arc::new(FailedCalls::default());
    let store = Arc::new(RedisStore::new(opts, Some(failed.clone())).expect("store"));
    let load = Load::start(store.clone());
    load.wait_calls([0; CALLERS], 20).await;
    Some((server, store, load, failed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_that_times_out_the_calls_in_flight_does_not_back_off() {
    use sluice::store::redis::health::{FAILURES_TO_BACK_OFF, MIN_FAILING};
    let Some((server, store, load, failed)) = loaded_shard().await else {
        return;
    };
    // A stall of 35 ms: each of the two calls in flight passes the store timeout
    // (15 ms), then the next ones, which carry the requests queued meanwhile: three
    // or four failed calls (enough to back off by count alone) about 15 ms apart,
    // first to last, well within health::MIN_FAILING; then Redis answers again.
    // Stall until a stall fails that many calls. A round whose failures spread over
    // MIN_FAILING after all (a busy machine ran a timer late) is an outage by the
    // rule and proves nothing here: the shard is let recover and the round is done
    // again.
    let short = MIN_FAILING.saturating_sub(Duration::from_millis(5));
    let mut burst = None;
    for _ in 0..10 {
        let from = failed.count();
        let backing_off = load.counts.backing_off.load(Relaxed);
        server.stall(Duration::from_millis(35)).await;
        // Every call the stall held has ended: each caller has finished the call it
        // had in flight at the thaw, and one more.
        load.wait_calls(load.done(), 2).await;
        let (calls, span) = failed.since(from);
        if span >= short {
            common::eventually(Duration::from_secs(10), "the shard back up", || async {
                !store.shard_down(0)
            })
            .await;
            continue;
        }
        if calls >= FAILURES_TO_BACK_OFF as usize {
            let backed_off = load.counts.backing_off.load(Relaxed) - backing_off;
            burst = Some((calls, span, backed_off, store.shard_down(0)));
            break;
        }
    }
    let counts = load.stop().await;
    let Some((calls, span, backed_off, down)) = burst else {
        panic!("no stall failed {FAILURES_TO_BACK_OFF} calls within {short:?}: {counts:?}");
    };
    assert_eq!(
        (backed_off, down),
        (0, false),
        "{calls} calls failed over {span:?}: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_shard_is_backed_off_quickly_then_recovers() {
    let Some((server, store, load, _)) = loaded_shard().await else {
        return;
    };
    server.freeze();
    let frozen = Instant::now();
    while !store.shard_down(0) {
        // About the store timeout plus health::MIN_FAILING (65 ms); slack for a busy CI.
        assert!(
            frozen.elapsed() < Duration::from_millis(600),
            "not backed off"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = frozen.elapsed();
    // Answered at once, without waiting out the store timeout.
    let err = store
        .decide(&[hit("probe", Algorithm::FixedWindow, 1, SECOND, 1)])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::BackingOff), "{err}");
    // Still hung: the load is answered by the back-off too.
    common::eventually(
        Duration::from_secs(5),
        "load answered by the back-off",
        || {
            let n = load.counts.backing_off.load(Relaxed);
            async move { n > 0 }
        },
    )
    .await;
    server.thaw();
    let deadline = Instant::now() + Duration::from_secs(15);
    while store.shard_down(0) {
        assert!(Instant::now() < deadline, "did not recover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let counts = load.stop().await;
    assert!(
        counts.backing_off.load(Relaxed) > 0 && counts.ok.load(Relaxed) > 0,
        "{counts:?}"
    );
    eprintln!("backed off {took:?} after the freeze: {counts:?}");
}

#[tokio::test]
async fn a_killed_shard_fails_fast_then_recovers_by_itself() {
    let Some(mut server) = RedisServer::if_available().await else {
        return;
    };
    // Calls bounded by the store's own timeout, as `--store-timeout` bounds them.
    let timeout = Duration::from_millis(100);
    let mut opts = Options::new(vec![server.url()], false);
    opts.call_timeout = timeout;
    let store = Arc::new(RedisStore::new(opts, None).expect("store"));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    // Load: 8 callers.
    let mut tasks = Vec::new();
    for c in 0..8 {
        let store = store.clone();
        let stop = stop.clone();
        let admitted = admitted.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut failed, mut backing_off, mut slowest) =
                (0u64, 0u64, 0u64, Duration::ZERO);
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let h = hit(
                    &format!("load-{c}-{}", i % 50),
                    Algorithm::SlidingWindowCounter,
                    1_000_000,
                    60 * SECOND,
                    1,
                );
                i += 1;
                let started = Instant::now();
                match store.decide(&[h]).await {
                    Ok(_) => {
                        ok += 1;
                        admitted.fetch_add(1, Relaxed);
                    }
                    // Answered at once while the shard is down.
                    Err(StoreError::BackingOff) => backing_off += 1,
                    // The failure mode answers.
                    Err(_) => failed += 1,
                }
                slowest = slowest.max(started.elapsed());
                // Paces the load; not a wait for anything.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (ok, failed, backing_off, slowest)
        }));
    }
    let answered = |n: u64| {
        let admitted = admitted.clone();
        move || {
            let a = admitted.load(Relaxed);
            async move { a >= n }
        }
    };
    common::eventually(Duration::from_secs(10), "80 calls answered", answered(80)).await;
    server.kill();
    let killed = Instant::now();
    while !store.shard_down(0) {
        assert!(
            killed.elapsed() < Duration::from_millis(800),
            "the shard is not backed off 800 ms after it was killed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    let err = store
        .decide(&[hit("probe", Algorithm::FixedWindow, 1, SECOND, 1)])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::BackingOff), "{err}");
    assert!(started.elapsed() < Duration::from_millis(100), "{err}");
    server.restart().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while store.shard_down(0) {
        assert!(Instant::now() < deadline, "did not recover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The load is answered by the shard again.
    let before = admitted.load(Relaxed);
    common::eventually(
        Duration::from_secs(10),
        "80 calls answered after the recovery",
        answered(before + 80),
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut failed, mut backing_off) = (0, 0, 0);
    for task in tasks {
        let (o, f, b, slowest) = task.await.unwrap();
        ok += o;
        failed += f;
        backing_off += b;
        // Every call answered within the store's timeout (plus scheduling slack).
        assert!(
            slowest < timeout + Duration::from_millis(400),
            "{slowest:?}"
        );
    }
    // The load found the shard failing, then answered by the back-off at once.
    assert!(
        ok > 0 && failed > 0 && backing_off > 0,
        "ok {ok} failed {failed} backing off {backing_off}"
    );
    let v = store
        .decide(&[hit("after", Algorithm::FixedWindow, 1, SECOND, 1)])
        .await
        .expect("recovered");
    assert!(v.admitted);
}

const REPLICA_POLICY: &str = r#"
domain: exact
descriptors:
  - key: fixed_window
    rate_limit: {unit: day, requests_per_unit: 1000, algorithm: fixed_window}
  - key: sliding_window_log
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_window_log}
  - key: sliding_window_counter
    rate_limit: {unit: day, requests_per_unit: 1000, algorithm: sliding_window_counter}
  - key: token_bucket
    rate_limit: {unit: day, requests_per_unit: 1000, algorithm: token_bucket, burst: 1000}
  - key: remote_address
    layer: edge
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
  - key: service
    layer: service
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window_log}
  - key: tenant
    layer: tenant
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
"#;

/// A shard back after an outage, which no decision has reached since: the
/// replicas' heartbeat (a write) brings it up, so `/debug/store` and
/// `sluice_degraded` do not say it is down while it answers.
#[tokio::test]
async fn a_heartbeat_brings_a_shard_back_up_without_a_decision() {
    let Some(mut t) = start(1).await else { return };
    let probe = || hit("hb-probe", Algorithm::FixedWindow, 1_000, 60 * SECOND, 1);
    t.store.decide(&[probe()]).await.expect("up");
    t.servers[0].kill();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !t.store.shard_down(0) {
        assert!(Instant::now() < deadline, "never backed off");
        let _ = t.store.decide(&[probe()]).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t.servers[0].restart().await;
    let beats = sluice::store::Beats {
        live: Duration::from_secs(2),
        hold: Duration::from_secs(30),
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let beat = t.store.heartbeat("me", beats).await;
        let state = t.store.shards()[0].state;
        if state == sluice::store::ShardState::Up {
            assert!(beat.is_ok(), "{beat:?}");
            break;
        }
        assert!(Instant::now() < deadline, "still {state:?}: {beat:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three replicas of the real binary sharing two shards.
fn replicas(shards: &[RedisServer]) -> Vec<common::Server> {
    let urls: Vec<String> = shards.iter().map(RedisServer::url).collect();
    let urls = urls.join(",");
    (0..3)
        .map(|_| {
            common::Server::start(
                REPLICA_POLICY,
                // Closed: a store failure would show up as a missing admission.
                &[
                    "--redis",
                    &urls,
                    "--store-timeout",
                    "5s",
                    "--failure-mode",
                    "closed",
                ],
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sharing_shards_admit_exactly_the_limit() {
    if !available() {
        return;
    }
    // Windows of a day (an hour for the log, exact in any window the run fits in)
    // keep the count free of refills during the run; a run that a day's end cut in
    // two (the fixed window's count started again) is run again on a fresh key.
    let shards = [RedisServer::start().await, RedisServer::start().await];
    let servers = replicas(&shards);
    for alg in [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
    ] {
        let started = Instant::now();
        let admitted = common::in_one_window(Duration::from_secs(86_400), async |n| {
            let value = format!("one-{n}");
            common::admitted_across(&servers, 16, 5_000, "exact", (alg, &value)).await
        })
        .await;
        assert_eq!(admitted, 1_000, "{alg}");
        eprintln!("{alg}: 5000 requests in {:?}", started.elapsed());
    }

    // Layers: the tenant denies; edge and service keep only the admitted requests,
    // wherever their counters live. The edge counts in an hour's fixed window: the
    // calls and the check after them in one, on fresh keys in a second run. The
    // edge's counter and the tenant's are on different shards, so the give-back
    // crosses shards.
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(s.client().await);
    }
    let on_shard = |key: &str, prefix: &str, index: usize, run: u32| {
        (1..=255)
            .map(|i| format!("{prefix}{run}.{i}"))
            .find(|v| {
                let counter = format!("exact|{key}={v}");
                shard::jump_hash(sluice::hash::stable_hash(counter.as_bytes()), 2) == index
            })
            .expect("a value on each shard")
    };
    let r = common::in_one_window(Duration::from_secs(3_600), async |n| {
        let (ip, service, tenant) = (
            on_shard("remote_address", "10.1.", 0, n),
            format!("checkout-{n}"),
            on_shard("tenant", "acme-", 1, n),
        );
        let layered = || {
            common::request(
                "exact",
                vec![
                    common::desc(&[("remote_address", &ip)]),
                    common::desc(&[("service", &service)]),
                    common::desc(&[("tenant", &tenant)]),
                ],
            )
        };
        two_then_denied(&mut clients, layered, 8).await;
        let check = common::request(
            "exact",
            vec![
                common::desc_hits(&[("remote_address", &ip)], 0),
                common::desc_hits(&[("service", &service)], 0),
            ],
        );
        common::call(&mut clients[1], check).await
    })
    .await;
    assert_eq!(r.statuses[0].limit_remaining, 98, "edge charged by denials");
    assert_eq!(
        r.statuses[1].limit_remaining, 98,
        "service charged by denials"
    );
    let mut on = Vec::new();
    for s in &shards {
        let ks = keys(&mut s.conn().await).await;
        on.push(
            ks.iter()
                .filter(|k| {
                    k.contains("remote_address") || k.contains("service") || k.contains("tenant")
                })
                .count(),
        );
    }
    // The three counters are spread over both shards, so the give-back crossed shards.
    assert!(
        on.iter().all(|&n| n > 0),
        "layered counters per shard: {on:?}"
    );
}

/// A database the server does not have (`/99` with `databases 16`) fails every
/// connection, as an outage (`connection`), with what to fix.
#[tokio::test]
async fn a_database_the_server_lacks_says_so() {
    if !available() {
        return;
    }
    let server = RedisServer::start_with(&["--databases", "16"]).await;
    let url = format!("{}/99", server.url());
    let store = RedisStore::new(Options::new(vec![url], false), None).expect("store");
    let h = hit("db", Algorithm::FixedWindow, 5, 60 * SECOND, 1);
    let e = store.decide(&[h]).await.expect_err("no database 99");
    assert_eq!(e.kind(), Some(sluice_redis::ErrorKind::Connection), "{e}");
    assert!(
        e.message().contains("DB index is out of range")
            && e.message().contains("database 99")
            && e.message().contains("databases"),
        "{e}"
    );
}

/// A cluster node given as a standalone shard (`--redis` for `--redis-cluster`)
/// redirects the keys of the other masters' slots: their calls fail saying to give
/// the cluster with `--redis-cluster`, not with a bare `MOVED`.
#[tokio::test]
async fn a_cluster_node_given_as_a_shard_says_to_use_redis_cluster() {
    let Some(cluster) = RedisCluster::if_available(3).await else {
        return;
    };
    let store =
        RedisStore::new(Options::new(vec![cluster.urls()[0].clone()], false), None).expect("store");
    // Keys spread over the slots: about two in three are the other masters'.
    let mut moved = None;
    for i in 0..64 {
        let h = hit(
            &format!("moved-{i}"),
            Algorithm::FixedWindow,
            5,
            60 * SECOND,
            1,
        );
        if let Err(e) = store.decide(&[h]).await {
            moved = Some(e);
            break;
        }
    }
    let e = moved.expect("a key of another master's slots");
    assert!(e.message().starts_with("MOVED "), "Redis's reply kept: {e}");
    assert!(
        e.message().contains("Redis Cluster") && e.message().contains("--redis-cluster"),
        "says what to do: {e}"
    );
}

#[tokio::test]
async fn a_cluster_decides_by_slot_and_gives_back_across_slots() {
    let Some(cluster) = RedisCluster::if_available(3).await else {
        return;
    };
    let mut opts = Options::new(cluster.urls(), true);
    opts.key_count_interval = Duration::from_millis(50);
    // One instant at the start of an hour: no count starts again between the calls,
    // and no fixed window's key expires before the keys are counted.
    opts.fixed_clock = Some(Arc::new(ManualClock::new(1_764_000_000 * SECOND)));
    let store = RedisStore::new(opts, None).expect("store");
    for alg in sluice::algorithm::Algorithm::ALL {
        let key = format!("cluster-{}", alg.as_str());
        for i in 0..5 {
            let v = store.decide(&[hit(&key, alg, 5, 60 * SECOND, 1)]).await;
            assert!(v.expect("decide").admitted, "{alg:?} request {i}");
        }
        let v = store
            .decide(&[hit(&key, alg, 5, 60 * SECOND, 1)])
            .await
            .unwrap();
        assert!(!v.admitted, "{alg:?} sixth request");

        // Two keys in different slots: the admitted one is given back.
        let (a, b) = (
            format!("cl-a-{}", alg.as_str()),
            format!("cl-b-{}", alg.as_str()),
        );
        let both = |on_a, on_b| {
            [
                hit(&a, alg, 10, 60 * SECOND, on_a),
                hit(&b, alg, 1, 60 * SECOND, on_b),
            ]
        };
        let v = store.decide(&both(1, 2)).await.unwrap();
        assert!(!v.admitted && v.verdicts[0].admitted, "{alg:?}");
        let check = store.decide(&both(0, 0)).await.unwrap();
        assert_eq!(check.verdicts[0].remaining, 10, "{alg:?}: a was charged");
    }
    // A traced call names the master the slot map gives its slot, as a standalone
    // shard's call names the shard; a request over several slots has a call per
    // slot, each naming its master.
    let ears = Ears::default();
    let one = hit("probed-one", Algorithm::FixedWindow, 5, 60 * SECOND, 1);
    let v = store
        .decide_within(std::slice::from_ref(&one), WAIT, Some(&ears))
        .await;
    assert!(v.expect("decide").admitted);
    let heard = std::mem::take(&mut *ears.0.lock().unwrap());
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert_eq!(heard[0].0.as_deref(), Some("127.0.0.1"), "{heard:?}");
    let node = cluster.nodes.iter().find(|n| Some(n.port) == heard[0].1);
    let node = node.unwrap_or_else(|| panic!("no master at {heard:?}"));
    let keys: Vec<String> = on_node(node, &["KEYS", "*probed-one*"]).await;
    assert!(!keys.is_empty(), "the counter is not on the master named");
    let (a, b) = (
        hit("probed-a", Algorithm::FixedWindow, 5, 60 * SECOND, 1),
        hit("probed-b", Algorithm::FixedWindow, 5, 60 * SECOND, 1),
    );
    let v = store.decide_within(&[a, b], WAIT, Some(&ears)).await;
    assert!(v.expect("decide").admitted);
    let heard = std::mem::take(&mut *ears.0.lock().unwrap());
    let mut named: Vec<Option<u16>> = heard.iter().map(|h| h.1).collect();
    named.sort();
    let mut holding = Vec::new();
    for key in ["*probed-a*", "*probed-b*"] {
        for node in &cluster.nodes {
            let keys: Vec<String> = on_node(node, &["KEYS", key]).await;
            if !keys.is_empty() {
                holding.push(Some(node.port));
            }
        }
    }
    holding.sort();
    assert_eq!(
        named, holding,
        "one call per slot, by its master: {heard:?}"
    );

    // Counters spread over every master.
    admit_distinct_keys(&store, "spread", 60).await;
    let mut total = 0;
    for node in &cluster.nodes {
        let size: u64 = redis::cmd("DBSIZE")
            .query_async(&mut node.conn().await)
            .await
            .unwrap();
        assert!(size > 5, "node {} holds {size} keys", node.port);
        total += size as usize;
    }
    // sluice_active_keys counts the keys of every master.
    wait_for_active_keys(&store, total).await;

    // The binary with --redis-cluster: layered counters on different slots.
    let sluice = common::Server::start(
        REPLICA_POLICY,
        &[
            "--redis-cluster",
            &cluster.urls().join(","),
            "--store-timeout",
            "5s",
            "--failure-mode",
            "closed",
        ],
    );
    let mut clients = [sluice.client().await];
    let layered = || {
        common::request(
            "exact",
            vec![
                common::desc(&[("remote_address", "10.9.9.9")]),
                common::desc(&[("tenant", "cluster")]),
            ],
        )
    };
    two_then_denied(&mut clients, layered, 4).await;
    let check = common::request(
        "exact",
        vec![common::desc_hits(&[("remote_address", "10.9.9.9")], 0)],
    );
    let r = common::call(&mut clients[0], check).await;
    assert_eq!(r.statuses[0].limit_remaining, 98, "edge charged by denials");

    // One probe cannot answer for a Cluster's nodes: `failure_mode: local`'s side
    // channel stays off, and a peer's question is refused.
    let (status, body) = common::http(&sluice.http, "GET", "/debug/store", "");
    assert_eq!(status, 200, "{body}");
    let store: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(store["local"]["advertise"].is_null(), "{store}");
    let question = r#"{"replica": "other", "shard": 0}"#;
    let (status, body) = common::http(&sluice.http, "POST", "/local-share/cut", question);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Cluster"), "{body}");
}

/// Runs `args` on a cluster node and returns its reply.
async fn on_node<T: redis::FromRedisValue>(node: &RedisServer, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut node.conn().await)
        .await
        .unwrap_or_else(|e| panic!("{args:?} on {}: {e}", node.port))
}

/// EVALSHA calls `node` refused (redirected, among others), from `INFO commandstats`.
async fn rejected_evalsha(node: &RedisServer) -> u64 {
    let info: String = on_node(node, &["INFO", "commandstats"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|f| f.strip_prefix("rejected_calls="))
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `--redis-cluster` given a standalone Redis: the log says what Redis answered
/// and which flag a standalone Redis wants, not only that no master is known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_redis_given_as_a_cluster_says_so() {
    let Some(redis) = RedisServer::if_available().await else {
        return;
    };
    let sluice = common::Server::start(REPLICA_POLICY, &["--redis-cluster", &redis.url()]);
    sluice
        .wait_line(
            Duration::from_secs(20),
            "the shard down with Redis's reason",
            |l| {
                l.contains("redis shard down")
                    && l.contains("ERR This instance has cluster support disabled")
                    && l.contains("a standalone Redis: give it with --redis")
            },
        )
        .await;
}

#[tokio::test]
async fn a_cluster_s_slot_map_is_read_once_not_per_call() {
    let Some(cluster) = RedisCluster::if_available(3).await else {
        return;
    };
    let store = RedisStore::new(Options::new(cluster.urls(), true), None).expect("store");
    admit_distinct_keys(&store, "map", 100).await;
    let mut reads = 0;
    for node in &cluster.nodes {
        reads += command_calls(&mut node.conn().await, "cluster|slots").await;
    }
    assert_eq!(reads, 1, "CLUSTER SLOTS calls over 100 decisions");
}

/// A policy of one fixed window of 7 requests per hour.
const SEVEN_PER_HOUR: &str = r#"
domain: burst
descriptors:
  - key: fw7
    rate_limit: {unit: hour, requests_per_unit: 7, algorithm: fixed_window}
"#;

/// A cluster master without sluice's script (a new cluster; `SCRIPT FLUSH`, a restart
/// without persistence or a promoted replica alike) is given it by one `SCRIPT LOAD`
/// that the waiting calls share, never by one full-text `EVAL` per call: a burst of
/// those outlasted the store timeout and was answered by the failure mode.
#[tokio::test]
async fn a_burst_on_a_cluster_master_without_the_script_is_decided_exactly() {
    let Some(cluster) = RedisCluster::if_available(3).await else {
        return;
    };
    let sluice = common::Server::start(
        SEVEN_PER_HOUR,
        &["--redis-cluster", &cluster.urls().join(",")],
    );
    let loads = || async {
        let mut loads = Vec::new();
        for node in &cluster.nodes {
            loads.push(command_calls(&mut node.conn().await, "script|load").await);
        }
        loads
    };
    let client = sluice.client().await;
    // Loaded on every master at start, before any request.
    let decide = sluice::store::redis::scripts::Scripts::default().decide;
    common::eventually(
        Duration::from_secs(10),
        "the script loaded on every master",
        || async {
            let mut all = true;
            for node in &cluster.nodes {
                let held: Vec<i64> = on_node(node, &["SCRIPT", "EXISTS", decide.hash()]).await;
                all &= held == [1];
            }
            all
        },
    )
    .await;
    for round in 0..4 {
        let before = loads().await;
        if round > 0 {
            for node in &cluster.nodes {
                let _: String = on_node(node, &["SCRIPT", "FLUSH"]).await;
            }
        }
        // 64 requests on a fresh key, all in flight at once.
        let value = format!("round-{round}");
        let req = common::request("burst", vec![common::desc(&[("fw7", &value)])]);
        let calls = (0..64).map(|_| {
            let (mut client, req) = (client.clone(), req.clone());
            async move { common::call(&mut client, req).await.overall_code }
        });
        let codes = futures::future::join_all(calls).await;
        let admitted = codes.iter().filter(|&&c| c == common::OK).count();
        assert_eq!(
            admitted, 7,
            "round {round}: 64 concurrent requests, limit 7"
        );
        let (status, metrics) = common::http(&sluice.http, "GET", "/metrics", "");
        assert_eq!(status, 200);
        let failed: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("sluice_requests_total") && l.contains("outcome=\"failed_"))
            .filter(|l| !l.ends_with(" 0"))
            .collect();
        assert!(failed.is_empty(), "round {round}: {failed:?}");
        for node in &cluster.nodes {
            let mut conn = node.conn().await;
            let texts = command_calls(&mut conn, "eval").await;
            assert_eq!(
                texts, 0,
                "round {round}: the script's text sent to {}",
                node.port
            );
        }
        // A load per master for the burst, not per call; and one for the block
        // list's script, which its master's once-a-second listing loads again.
        let after = loads().await;
        assert!(
            before.iter().zip(&after).all(|(b, a)| a - b <= 2),
            "round {round}: SCRIPT LOAD calls per master went from {before:?} to {after:?}"
        );
    }
}

#[tokio::test]
async fn a_migrated_slot_keeps_decisions_exact_through_ask_and_moved() {
    let Some(cluster) = RedisCluster::if_available(3).await else {
        return;
    };
    let mut opts = Options::new(cluster.urls(), true);
    // One instant throughout: no window boundary passes between the calls.
    opts.fixed_clock = Some(Arc::new(ManualClock::new(1_764_000_000 * SECOND)));
    let store = RedisStore::new(opts, None).expect("store");
    let h = |hits| hit("migrating", Algorithm::FixedWindow, 10, 600 * SECOND, hits);
    let mut left = 10;
    let mut decide = |what: &'static str| {
        let store = &store;
        left -= 1;
        let want = left;
        async move {
            let v = store.decide(&[h(1)]).await.expect(what);
            assert!(v.admitted, "{what}");
            assert_eq!(v.verdicts[0].remaining, want, "{what}");
        }
    };
    decide("before").await;
    decide("before").await;
    let key = shard::redis_key("sluice:", &h(1));
    let slot = shard::slot(key.as_bytes()).to_string();
    let mut owner = None;
    for (i, node) in cluster.nodes.iter().enumerate() {
        let n: u64 = on_node(node, &["CLUSTER", "COUNTKEYSINSLOT", &slot]).await;
        if n > 0 {
            owner = Some(i);
        }
    }
    let from = &cluster.nodes[owner.expect("a node holds the counter")];
    let to = &cluster.nodes[(owner.unwrap() + 1) % 3];
    let from_id: String = on_node(from, &["CLUSTER", "MYID"]).await;
    let to_id: String = on_node(to, &["CLUSTER", "MYID"]).await;

    // Half way: the slot is migrating and its keys have moved, so the old owner
    // answers ASK.
    let () = on_node(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]).await;
    let () = on_node(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]).await;
    let keys: Vec<String> = on_node(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]).await;
    assert!(!keys.is_empty());
    let port = to.port.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().map(String::as_str));
    let _: String = on_node(from, &migrate).await;
    let mut to_conn = to.conn().await;
    let asked = command_calls(&mut to_conn, "asking").await;
    decide("while migrating").await;
    decide("while migrating").await;
    assert!(
        command_calls(&mut to_conn, "asking").await >= asked + 2,
        "sent after ASKING"
    );

    // Done: every node says the slot is the new owner's, and the old one answers
    // MOVED.
    for node in [to, from].into_iter().chain(cluster.nodes.iter()) {
        let () = on_node(node, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]).await;
    }
    let redirected = rejected_evalsha(from).await;
    decide("moved").await;
    decide("moved").await;
    decide("moved").await;
    // The first call after the move was redirected; the next ones went straight to
    // the new owner.
    assert_eq!(rejected_evalsha(from).await, redirected + 1);
    let n: u64 = on_node(to, &["CLUSTER", "COUNTKEYSINSLOT", &slot]).await;
    assert!(n > 0, "the counter lives on the new owner");
    for _ in 0..left {
        assert!(store.decide(&[h(1)]).await.unwrap().admitted);
    }
    assert!(
        !store.decide(&[h(1)]).await.unwrap().admitted,
        "the 11th is denied"
    );
}

#[tokio::test]
async fn a_killed_master_s_replica_takes_its_slots_calls() {
    failover(false).await;
}

/// A master that hangs (stopped, so connections to it open but nothing answers) is
/// replaced as a dead one is, though each of its calls and map reads times out.
#[tokio::test]
async fn a_hung_master_s_replica_takes_its_slots_calls() {
    failover(true).await;
}

/// Decides on a key, fails its master over to a new replica (killed or, with `hang`,
/// stopped) and decides on: the count goes on where it was.
async fn failover(hang: bool) {
    let Some(mut cluster) = RedisCluster::if_available(3).await else {
        return;
    };
    let mut opts = Options::new(cluster.urls(), true);
    // Calls give up sooner than a read of the map from a hung node: the read must
    // go on without them.
    opts.timeout = Duration::from_millis(500);
    opts.call_timeout = Duration::from_millis(100);
    // One instant throughout: the count must not start again at a window boundary
    // while the failover takes its seconds.
    opts.fixed_clock = Some(Arc::new(ManualClock::new(1_764_000_000 * SECOND)));
    let store = RedisStore::new(opts, None).expect("store");
    let h = |hits| hit("failover", Algorithm::FixedWindow, 10, 600 * SECOND, hits);
    for left in [9, 8, 7] {
        let v = store.decide(&[h(1)]).await.expect("decide");
        assert_eq!(v.verdicts[0].remaining, left);
    }
    let key = shard::redis_key("sluice:", &h(1));
    let slot = shard::slot(key.as_bytes()).to_string();
    let mut owner = 0;
    for (i, node) in cluster.nodes.iter().enumerate() {
        let n: u64 = on_node(node, &["CLUSTER", "COUNTKEYSINSLOT", &slot]).await;
        if n > 0 {
            owner = i;
        }
    }
    cluster.add_replica(owner).await;
    // The counter has reached the replica before its master dies.
    let acked: i64 = on_node(&cluster.nodes[owner], &["WAIT", "1", "5000"]).await;
    assert_eq!(acked, 1);
    if hang {
        cluster.nodes[owner].freeze();
    } else {
        cluster.nodes[owner].kill();
    }
    let replica = cluster.nodes.last().expect("the replica");
    let deadline = Instant::now() + Duration::from_secs(60);
    let v = loop {
        assert!(
            Instant::now() < deadline,
            "never decided after the failover"
        );
        match store.decide(&[h(1)]).await {
            Ok(v) => break v,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let role: Vec<redis::Value> = on_node(replica, &["ROLE"]).await;
    assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
    assert!(v.admitted);
    assert_eq!(v.verdicts[0].remaining, 6, "the replica's counter went on");
    let v = store.decide(&[h(1)]).await.expect("decide");
    assert_eq!(v.verdicts[0].remaining, 5);
    // A replica never gets the script: loaded on it before the first call, not sent
    // as text by the calls.
    let mut conn = replica.conn().await;
    assert_eq!(command_calls(&mut conn, "eval").await, 0);
    assert!(command_calls(&mut conn, "script|load").await >= 1);
}

/// Sends `n` requests made by `request`, in turn through `clients`: the tenant's
/// limit of 2 (REPLICA_POLICY) admits the first two and denies the rest.
async fn two_then_denied(
    clients: &mut [RateLimitServiceClient<Channel>],
    request: impl Fn() -> RateLimitRequest,
    n: usize,
) {
    for i in 0..n {
        let client = &mut clients[i % clients.len()];
        let r = common::call(client, request()).await;
        let expected = if i < 2 {
            common::OK
        } else {
            common::OVER_LIMIT
        };
        assert_eq!(r.overall_code, expected, "request {i}");
    }
}

/// What a key holds: its string or its sorted set with scores, for comparisons.
async fn dump(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap();
    match kind.as_str() {
        "string" => vec![redis::cmd("GET").arg(key).query_async(conn).await.unwrap()],
        "zset" => redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(conn)
            .await
            .unwrap(),
        _ => vec![kind],
    }
}

/// Of `n` shards, a key that lives on shard `index`.
fn key_on(prefix: &str, index: usize, n: usize) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| shard::jump_hash(sluice::hash::stable_hash(k.as_bytes()), n) == index)
        .expect("some key lands on every shard")
}

/// A request over both shards of `t`: `a` on shard 0 (`algorithm`, one hit an hour),
/// `b` on shard 1 (a fixed window of `b_requests` an hour); and `a` with no hits, to
/// read its room. Both shards have their connections and scripts in place.
async fn over_two_shards(
    t: &TestStore,
    prefix: &str,
    algorithm: Algorithm,
    b_requests: u64,
) -> (Hit, Hit, Hit) {
    const HOUR: Micros = 3_600 * SECOND;
    let a = hit(&key_on(prefix, 0, 2), algorithm, 1, HOUR, 1);
    let b = hit(
        &key_on(prefix, 1, 2),
        Algorithm::FixedWindow,
        b_requests,
        HOUR,
        1,
    );
    let peek = Hit {
        hits: 0,
        ..a.clone()
    };
    let b_peek = Hit {
        hits: 0,
        ..b.clone()
    };
    t.store
        .decide(&[peek.clone(), b_peek])
        .await
        .expect("decided");
    (a, b, peek)
}

/// 3 per second with a burst of 3: a token every 333,333.3 µs.
fn three_a_second(key: &str, algorithm: Algorithm, hits: u64) -> Hit {
    hit(key, algorithm, 3, SECOND, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_to_a_full_bucket_get_its_whole_burst() {
    // At one instant, as requests coalesced into one script call share its TIME.
    let Some(t) = start_fixed(1).await else {
        return;
    };
    let store = Arc::new(t.store.clone());
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let key = format!("burst-concurrent-{}", alg.as_str());
        let admitted = flood(&store, 4, |_| vec![three_a_second(&key, alg, 1)]).await;
        assert_eq!(admitted, 3, "{alg:?}");
        let v = t.one(&three_a_second(&key, alg, 1)).await;
        assert!(!v.admitted);
        // The next token, 333,333.3 µs on.
        assert_eq!(v.verdicts[0].retry_after, 333_334, "{alg:?}");
    }
}

#[tokio::test]
async fn a_bucket_written_by_an_older_sluice_reads_as_its_rounded_up_time() {
    let Some((server, clock, store)) = fixed_time_store().await else {
        return;
    };
    let t = clock.now();
    let h = three_a_second("older", Algorithm::TokenBucket, 1);
    let key = shard::redis_key("sluice:", &h);
    let mut conn = server.conn().await;
    // Two hits as an older sluice stored them: each cost rounded up, no remainder.
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(t + 666_668)
        .query_async(&mut conn)
        .await
        .unwrap();
    let v = decide_one(&store, &h).await;
    assert!(!v.admitted);
    assert_eq!(v.verdicts[0].retry_after, 2);
    clock.advance(2);
    let v = decide_one(&store, &h).await;
    assert!(v.admitted);
    // Written in the new form: tat rounded up, its remainder in thirds of a µs, and
    // the rate they count in.
    assert_eq!(
        dump(&mut conn, &key).await,
        [format!("{} 2 3 1000000", t + 1_000_002)]
    );
}

#[tokio::test]
async fn a_bucket_refund_gives_back_exactly_what_was_taken() {
    let Some(t) = start_fixed(2).await else {
        return;
    };
    let mut conn = t.servers[0].conn().await;
    for alg in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let a = three_a_second(&key_on(&format!("give-{}", alg.as_str()), 0, 2), alg, 1);
        let key = shard::redis_key("sluice:", &a);
        // Shard 1 denies every request with `a` in it.
        let b = hit(
            &key_on(&format!("deny-{}", alg.as_str()), 1, 2),
            Algorithm::FixedWindow,
            0,
            SECOND,
            1,
        );
        assert!(t.one(&a).await.admitted);
        let before = dump(&mut conn, &key).await;
        for _ in 0..5 {
            let v = t.store.decide(&[a.clone(), b.clone()]).await.unwrap();
            assert!(!v.admitted);
            assert!(v.verdicts[0].admitted, "shard 0 admitted, then gave back");
        }
        assert_eq!(dump(&mut conn, &key).await, before, "{alg:?}");
        assert!(t.one(&a).await.admitted);
        assert!(t.one(&a).await.admitted);
        assert!(!t.one(&a).await.admitted);
    }
}

#[tokio::test]
async fn a_request_over_two_shards_is_given_back_even_after_its_caller_gave_up() {
    let Some(t) = start_fixed(2).await else {
        return;
    };
    // `b` admits nothing.
    let (a, b, peek) = over_two_shards(&t, "gave-up", Algorithm::FixedWindow, 0).await;

    t.servers[1].freeze();
    // The limiter's store timeout: the caller stops waiting while shard 1 hangs.
    let gave_up = tokio::time::timeout(Duration::from_millis(200), t.store.decide(&[a, b])).await;
    let left = t.one(&peek).await.verdicts[0].remaining;
    t.servers[1].thaw();
    assert!(
        gave_up.is_err(),
        "shard 1 was frozen, yet the request was decided"
    );
    assert_eq!(left, 0, "shard 0 consumed a's hit while shard 1 hung");

    // Shard 1 then denies the request: what shard 0 consumed comes back.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = t.one(&peek).await.verdicts[0].remaining;
        if left == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "a's hit was never given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_request_over_two_shards_one_of_them_dead_spends_nothing_on_the_other() {
    let Some(mut t) = start(2).await else { return };
    // `b` has room.
    let (mut a, mut b, peek) = over_two_shards(&t, "dead", Algorithm::TokenBucket, 100).await;
    // Failing closed: a failed shard fails the whole request.
    a.fallback = Fallback::Deny;
    b.fallback = Fallback::Deny;

    t.servers[1].kill();
    // Shard 0 admits and consumes; shard 1 fails: the request is not decided and
    // shard 0's hit comes back before the caller has its answer.
    t.store.decide(&[a, b]).await.expect_err("shard 1 is dead");
    let left = t.one(&peek).await.verdicts[0].remaining;
    assert_eq!(left, 1, "shard 0 kept a's hit of an undecided request");
}

#[tokio::test]
async fn failing_open_a_dead_shard_lifts_its_hits_alone_and_the_others_are_spent() {
    let Some(mut t) = start(2).await else { return };
    // `b` has room; `a` has one hit left.
    let (a, b, peek) = over_two_shards(&t, "open", Algorithm::TokenBucket, 100).await;
    assert_eq!(a.fallback, Fallback::Admit);

    t.servers[1].kill();
    // Shard 0 decides `a`; `b`, on the dead shard, is lifted and named.
    let v = t
        .store
        .decide(&[a.clone(), b.clone()])
        .await
        .expect("a decided");
    assert!(v.admitted);
    assert_eq!(v.failed.map(|f| f.hits), Some(vec![1]));
    assert_eq!(t.one(&peek).await.verdicts[0].remaining, 0, "a's hit spent");
    // Now `a` denies, b's shard dead or not, and the request spends nothing.
    let v = t.store.decide(&[a, b]).await.expect("a decided");
    assert!(!v.admitted && !v.verdicts[0].admitted);
    assert_eq!(v.failed.map(|f| f.hits), Some(vec![1]));
}

#[tokio::test]
async fn one_call_with_several_groups_decides_like_the_groups_one_by_one() {
    use sluice::store::redis::scripts::{self, Group, HitArgs, Scripts};
    use sluice_redis::{Pool, Request};
    let Some(server) = RedisServer::if_available().await else {
        return;
    };
    let mut conn = server.conn().await;
    let pool = server.pool();
    let scripts = Scripts::default();
    let algorithms = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ];
    let modes = [Mode::Enforce, Mode::Enforce, Mode::Shadow, Mode::Quota];
    let mut rng = Lcg(11);
    let mut now: Micros = 1_000 * SECOND;
    for round in 0..300 {
        // Minutes, so that no key's TTL (real time) runs out while a round compares.
        now += rng.next(120 * SECOND);
        // The same groups on two key spaces: "a:" in one call, "b:" one call each.
        let mut a = Vec::new();
        let mut b = Vec::new();
        for _ in 0..1 + rng.next(6) {
            let hits: Vec<Hit> = (0..1 + rng.next(3))
                .map(|_| {
                    let alg = algorithms[rng.next(5) as usize];
                    let key = format!("k{}", rng.next(3));
                    let window = (1 + rng.next(4)) * 60 * SECOND;
                    let mut h = hit(&key, alg, 1 + rng.next(5), window, rng.next(3));
                    h.mode = modes[rng.next(4) as usize];
                    h
                })
                .collect();
            let quota_elsewhere = rng.next(4) == 0;
            for (prefix, side) in [("a:", &mut a), ("b:", &mut b)] {
                side.push(Group {
                    keys: hits.iter().map(|h| shard::redis_key(prefix, h)).collect(),
                    hits: hits.iter().map(HitArgs::new).collect(),
                    quota_elsewhere,
                });
            }
        }
        // The decide call as a shard's task writes it.
        async fn decide(pool: &Pool, scripts: &Scripts, groups: &[&Group], now: u64) -> Vec<i64> {
            let write = |req: &mut Request, text: bool| {
                let by = if text {
                    scripts::By::Text
                } else {
                    scripts::By::Hash(scripts.decide.hash())
                };
                scripts::write_decide(req, by, groups, Some(now));
            };
            let reply = scripts::run(write, |req| async move { Ok(pool.query(&req).await?) });
            scripts::integers(reply.await.expect("decide")).expect("integers")
        }
        let together = decide(&pool, &scripts, &a.iter().collect::<Vec<_>>(), now).await;
        // Each reply ends with the call's time: one for the call, one per group.
        let mut one_by_one = Vec::new();
        for g in &b {
            let mut r = decide(&pool, &scripts, &[g], now).await;
            assert_eq!(r.pop(), Some(now as i64));
            one_by_one.extend(r);
        }
        one_by_one.push(now as i64);
        assert_eq!(together, one_by_one, "round {round}");
        for g in &a {
            for key in &g.keys {
                let other = key.replacen("a:", "b:", 1);
                assert_eq!(
                    dump(&mut conn, key).await,
                    dump(&mut conn, &other).await,
                    "round {round}: {key}"
                );
            }
        }
    }
}

/// Requests sent at once by the flood tests, each on a day's limits.
const FLOOD: usize = 2_000;
const DAY: Micros = 86_400 * SECOND;

/// One shard at one instant (on Redis TIME a day's window could end during a flood),
/// its store shared by `flood`'s tasks, and a connection to read its command counts.
async fn flooded() -> Option<(
    TestStore,
    Arc<RedisStore>,
    redis::aio::MultiplexedConnection,
)> {
    let t = start_fixed(1).await?;
    let store = Arc::new(t.store.clone());
    let conn = t.servers[0].conn().await;
    Some((t, store, conn))
}

/// Sends `n` concurrent requests (request `i` is `hits(i)`), returns how many passed.
async fn flood(store: &Arc<RedisStore>, n: usize, hits: impl Fn(usize) -> Vec<Hit>) -> usize {
    let calls = (0..n).map(|i| {
        let (store, hits) = (store.clone(), hits(i));
        tokio::spawn(async move { store.decide(&hits).await.expect("decide").admitted })
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .filter(|r| *r.as_ref().expect("task"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_script_calls_and_stay_exact() {
    let Some((_t, store, mut conn)) = flooded().await else {
        return;
    };
    const N: usize = FLOOD;

    // All admitted (no denial cache in play): far fewer calls than requests.
    let before = script_calls(&mut conn).await;
    let admitted = flood(&store, N, |i| {
        vec![hit(
            &format!("co-{}", i % 100),
            Algorithm::TokenBucket,
            1 << 30,
            DAY,
            1,
        )]
    })
    .await;
    assert_eq!(admitted, N);
    let calls = script_calls(&mut conn).await - before;
    eprintln!("{calls} decide calls for {N} concurrent requests");
    assert!(
        calls < N as u64 / 4,
        "{calls} decide calls for {N} requests"
    );

    // Every request hits "co-a" (limit 500) and "co-b" (limit 300): 300 pass, and the
    // 1,700 denied by "co-b" must not spend "co-a", though they share calls with
    // admitted ones.
    let admitted = flood(&store, N, |_| {
        vec![
            hit("co-a", Algorithm::TokenBucket, 500, DAY, 1),
            hit("co-b", Algorithm::TokenBucket, 300, DAY, 1),
        ]
    })
    .await;
    assert_eq!(admitted, 300);
    let admitted = flood(&store, N, |_| {
        vec![hit("co-a", Algorithm::TokenBucket, 500, DAY, 1)]
    })
    .await;
    assert_eq!(admitted, 200, "co-a had 200 left");

    // One key per algorithm, hit concurrently: exactly its limit passes.
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        // 37 a day: an interval of 2,335,135,135.1 µs, so exact only without
        // rounding each cost.
        let key = format!("co-one-{}", alg.as_str());
        let admitted = flood(&store, 500, |_| vec![hit(&key, alg, 37, DAY, 1)]).await;
        assert_eq!(admitted, 37, "{alg:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_a_hot_key_coalesced_in_one_call_read_it_once() {
    // Checks (cost 0) change no counter; coalesced into one script call, they must
    // cost Redis one read of their key, as requests that spend do.
    let Some((_t, store, mut conn)) = flooded().await else {
        return;
    };
    const N: usize = FLOOD;
    let limit = |hits| {
        hit(
            "hot-check",
            Algorithm::SlidingWindowCounter,
            1 << 30,
            DAY,
            hits,
        )
    };
    assert_eq!(flood(&store, 1, |_| vec![limit(1)]).await, 1);

    let (calls, gets) = (
        script_calls(&mut conn).await,
        command_calls(&mut conn, "get").await,
    );
    assert_eq!(flood(&store, N, |_| vec![limit(0)]).await, N);
    let calls = script_calls(&mut conn).await - calls;
    let gets = command_calls(&mut conn, "get").await - gets;
    assert!(calls < N as u64 / 4, "{calls} decide calls for {N} checks");
    assert_eq!(gets, calls, "{gets} reads of the key in {calls} calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_the_shards_few_connections() {
    let Some(t) = start(1).await else { return };
    let store = Arc::new(t.store.clone());
    let calls = (0..64).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            let h = hit(&format!("mux-{i}"), Algorithm::TokenBucket, 10, SECOND, 1);
            store.decide(&[h]).await.expect("decide").admitted
        })
    });
    for c in futures::future::join_all(calls).await {
        assert!(c.expect("task"));
    }
    let mut conn = t.servers[0].conn().await;
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut conn)
        .await
        .unwrap();
    let clients: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients");
    // This inspecting connection, the shard's decide connections (one per call in
    // flight), and (once the key count has run) the one for refunds, key counts and
    // probes: not one per caller.
    let most = 2 + sluice::store::redis::coalesce::CALLS_IN_FLIGHT as u64;
    assert!((2..=most).contains(&clients), "{info}");
}

#[tokio::test]
async fn the_binary_reaches_redis_over_tls() {
    if !available() {
        return;
    }
    let server = RedisServer::start_tls().await;
    let ca = server.dir.path().join("ca.crt");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("policy.yaml"), REPLICA_POLICY).expect("policy");
    let configs = [dir.path().join("policy.yaml")];
    let url = format!("rediss://localhost:{}", server.port);
    // rustls trusts the system roots; SSL_CERT_FILE points them at the test CA.
    let sluice = common::Server::start_env(
        dir,
        &configs,
        &[
            "--redis",
            &url,
            "--store-timeout",
            "5s",
            "--failure-mode",
            "closed",
        ],
        &[("SSL_CERT_FILE", ca.to_str().expect("utf-8 path"))],
    );
    let mut client = sluice.client().await;
    let req = || common::request("exact", vec![common::desc(&[("tenant", "tls")])]);
    assert_eq!(
        common::call(&mut client, req()).await.overall_code,
        common::OK
    );
    assert_eq!(
        common::call(&mut client, req()).await.overall_code,
        common::OK
    );
    // Closed failure mode: OVER_LIMIT here means Redis answered "over limit".
    let r = common::call(&mut client, req()).await;
    assert_eq!(r.overall_code, common::OVER_LIMIT);
    let metrics = common::http(&sluice.http, "GET", "/metrics", "").1;
    let errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_store_errors_total{"))
        .collect();
    assert!(
        !errors.is_empty(),
        "every shard's error counter is exported"
    );
    assert!(errors.iter().all(|l| l.ends_with(" 0")), "{metrics}");
}

/// The binary on `url` with `REPLICA_POLICY`, a closed failure mode and no extra
/// trusted authority (the test CA is not among the system's).
fn sluice_at(url: &str) -> common::Server {
    common::Server::start(
        REPLICA_POLICY,
        &[
            "--redis",
            url,
            "--store-timeout",
            "5s",
            "--failure-mode",
            "closed",
        ],
    )
}

#[tokio::test]
async fn tls_shards_verify_the_certificate_unless_the_url_says_insecure() {
    if !available() {
        return;
    }
    let server = RedisServer::start_tls().await;
    let shard = format!("localhost:{}", server.port);
    let req = || common::request("exact", vec![common::desc(&[("tenant", "tls")])]);

    // An authority Sluice does not trust: no call reaches Redis, the failure mode
    // (closed) answers, and the shard's error says why.
    let verified = sluice_at(&format!("rediss://{shard}"));
    let mut client = verified.client().await;
    assert_eq!(
        common::call(&mut client, req()).await.overall_code,
        common::OVER_LIMIT
    );
    let errors = verified.metric(
        "sluice_store_errors_total",
        &[("store", "redis"), ("shard", &shard), ("kind", "tls")],
    );
    assert!(errors.is_some_and(|n| n > 0.0), "{errors:?}");
    let (_, body) = common::http(&verified.http, "GET", "/debug/store", "");
    assert!(body.contains("certificate"), "{body}");

    // #insecure: encrypted without verifying; Redis decides: twice OK (the failure
    // mode would have denied), then the limit of 2.
    let insecure = sluice_at(&format!("rediss://{shard}/#insecure"));
    let mut client = insecure.client().await;
    for want in [common::OK, common::OK, common::OVER_LIMIT] {
        assert_eq!(common::call(&mut client, req()).await.overall_code, want);
    }
    let errors = insecure.metric(
        "sluice_store_errors_total",
        &[
            ("store", "redis"),
            ("shard", &shard),
            ("kind", "connection"),
        ],
    );
    assert_eq!(errors, Some(0.0));
}

#[tokio::test]
async fn a_shard_is_connected_and_its_script_loaded_before_the_first_request() {
    use sluice::store::redis::scripts::Scripts;
    let Some(server) = RedisServer::if_available().await else {
        return;
    };
    let store = store_on(&server);
    let name = Scripts::default().decide_library.name().to_string();
    let conn = server.conn().await;
    // Before any request, the decide function is loaded under the name Sluice calls.
    common::eventually(Duration::from_secs(5), "the decide function loaded", || {
        let mut conn = conn.clone();
        let name = name.clone();
        async move { library_loaded(&mut conn, &name).await }
    })
    .await;
    let mut conn = conn;
    let h = hit("warm", Algorithm::FixedWindow, 5, 60 * SECOND, 1);
    assert!(store.decide(&[h]).await.expect("decide").admitted);
    // One round trip: FCALL found its function; no script, no reload.
    assert_eq!(command_calls(&mut conn, "fcall").await, 1);
    assert_eq!(command_calls(&mut conn, "evalsha").await, 0);
    assert_eq!(command_calls(&mut conn, "eval").await, 0);
}

/// A server that refuses the decide function for a passing reason (out of memory:
/// `maxmemory` with `noeviction`) when Sluice first connects gets it once the reason
/// passes: calls go by `FCALL` again, not by script for the life of the process.
#[tokio::test]
async fn the_decide_function_is_loaded_once_a_passing_refusal_passes() {
    use sluice::store::redis::scripts::Scripts;
    let Some(server) = RedisServer::if_available().await else {
        return;
    };
    let mut conn = server.conn().await;
    for (k, v) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", k, v])
            .query_async(&mut conn)
            .await
            .expect("CONFIG SET");
    }
    let store = store_on(&server);
    let h = hit("oom", Algorithm::FixedWindow, 5, 60 * SECOND, 1);
    let refused = store.decide(std::slice::from_ref(&h)).await.unwrap_err();
    assert_eq!(
        refused.kind(),
        Some(sluice_redis::ErrorKind::Oom),
        "{refused}"
    );
    let name = Scripts::default().decide_library.name().to_string();
    assert!(!library_loaded(&mut conn, &name).await);

    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    // The shard may back off a while after the refusals.
    common::eventually(
        Duration::from_secs(20),
        "a decision once memory is back",
        || {
            let (store, h) = (&store, h.clone());
            async move { store.decide(std::slice::from_ref(&h)).await.is_ok() }
        },
    )
    .await;
    assert!(library_loaded(&mut conn, &name).await, "the library loaded");
    assert!(
        command_calls(&mut conn, "fcall").await >= 1,
        "decided by FCALL"
    );
}

/// Whether the function library `name` is loaded on the server.
async fn library_loaded(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> bool {
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg(&["LIST", "LIBRARYNAME", name])
        .query_async(conn)
        .await
        .expect("FUNCTION LIST");
    matches!(libraries, redis::Value::Array(l) if !l.is_empty())
}

#[tokio::test]
async fn the_decide_function_is_loaded_again_after_a_flush() {
    use sluice::store::redis::scripts::Scripts;
    let Some(server) = RedisServer::if_available().await else {
        return;
    };
    let store = store_on(&server);
    let h = hit(
        "flushed",
        Algorithm::SlidingWindowCounter,
        3,
        60 * SECOND,
        1,
    );
    for _ in 0..2 {
        assert!(decide_one(&store, &h).await.admitted);
    }
    let mut conn = server.conn().await;
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The counts live in the keys, not the function: the third fits, the fourth not.
    assert!(decide_one(&store, &h).await.admitted);
    assert!(!decide_one(&store, &h).await.admitted);
    let name = Scripts::default().decide_library.name().to_string();
    assert!(library_loaded(&mut conn, &name).await);
    assert_eq!(command_calls(&mut conn, "evalsha").await, 0);
}

/// A server or a user that may load functions but not call them (`FCALL` renamed
/// away, or an ACL without it) is called by script: every decision is Redis's.
#[tokio::test]
async fn a_server_or_user_without_fcall_alone_decides_by_script() {
    if !available() {
        return;
    }
    let renamed = RedisServer::start_with(&["--rename-command", "FCALL", ""]).await;
    let acl = RedisServer::start().await;
    let mut admin = acl.conn().await;
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "nofcall", "on", ">pw", "~*", "+@all", "-fcall"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_764_000_000 * SECOND));
    for (server, url) in [
        (&renamed, renamed.url()),
        (&acl, format!("redis://nofcall:pw@127.0.0.1:{}", acl.port)),
    ] {
        let mut opts = Options::new(vec![url.clone()], false);
        opts.fixed_clock = Some(clock.clone());
        let store = RedisStore::new(opts, None).expect("store");
        let h = hit("no-fcall", Algorithm::FixedWindow, 3, 60 * SECOND, 1);
        for n in 0..3 {
            let v = store.decide(std::slice::from_ref(&h)).await;
            assert!(v.expect("decided").admitted, "{url}: call {n}");
        }
        let v = store.decide(std::slice::from_ref(&h)).await;
        assert!(!v.expect("decided").admitted, "{url}: the fourth");
        let mut conn = server.conn().await;
        assert!(command_calls(&mut conn, "evalsha").await >= 3, "{url}");
    }
}

#[tokio::test]
async fn a_user_without_functions_decides_by_script_on_the_same_counters() {
    let Some(server) = RedisServer::if_available().await else {
        return;
    };
    let mut admin = server.conn().await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "scripts",
            "on",
            ">pw",
            "~*",
            "+@all",
            "-function",
            "-fcall",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    // Both at one instant: the exact counts below stay in one window.
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_764_000_000 * SECOND));
    let at_one_instant = |url: String| {
        let mut opts = Options::new(vec![url], false);
        opts.fixed_clock = Some(clock.clone());
        RedisStore::new(opts, None).expect("store")
    };
    let by_function = at_one_instant(server.url());
    let by_script = at_one_instant(format!("redis://scripts:pw@127.0.0.1:{}", server.port));
    // One counter, two replicas calling it differently (as during an upgrade, or
    // with an ACL that forbids functions): together they admit exactly the limit.
    let h = hit("mixed", Algorithm::FixedWindow, 3, 60 * SECOND, 1);
    let one = std::slice::from_ref(&h);
    assert!(by_function.decide(one).await.unwrap().admitted);
    assert!(by_script.decide(one).await.unwrap().admitted);
    assert!(by_function.decide(one).await.unwrap().admitted);
    assert!(!by_script.decide(one).await.unwrap().admitted);
    assert!(!by_function.decide(one).await.unwrap().admitted);
    // The last denial came from by_function's over-limit cache, primed by its
    // admission that filled the counter.
    assert_eq!(command_calls(&mut admin, "fcall").await, 2);
    assert_eq!(command_calls(&mut admin, "evalsha").await, 2);
}

#[tokio::test]
async fn a_shard_on_a_unix_socket_decides_like_one_on_tcp() {
    if !available() {
        return;
    }
    let sockets = tempfile::tempdir().expect("tempdir");
    let socket = sockets.path().join("redis.sock");
    let socket = socket.to_str().expect("utf-8 path");
    let server =
        RedisServer::start_with(&["--unixsocket", socket, "--unixsocketperm", "700"]).await;
    let mut opts = Options::new(vec![format!("unix://{socket}")], false);
    // One instant: no window ends between the three calls.
    opts.fixed_clock = Some(Arc::new(ManualClock::new(1_764_000_000 * SECOND)));
    let store = RedisStore::new(opts, None).expect("store");
    let h = hit("over-unix", Algorithm::FixedWindow, 2, 60 * SECOND, 1);
    let mut admitted = Vec::new();
    for _ in 0..3 {
        let v = decide_one(&store, &h).await;
        admitted.push(v.admitted);
    }
    assert_eq!(admitted, [true, true, false]);
    let keys = common::redis::keys(&mut server.conn().await).await;
    assert!(keys.iter().any(|k| k.contains("over-unix")), "{keys:?}");
    // Named by its path in metrics and /debug/store.
    assert_eq!(store.shard_names(), [socket]);
}

/// The binary on one fresh redis-server with `REPLICA_POLICY` and `extra` flags;
/// `None` without redis-server.
async fn sluice_on_one_shard(extra: &[&str]) -> Option<(RedisServer, common::Server)> {
    let redis_server = RedisServer::if_available().await?;
    let url = redis_server.url();
    let mut args = vec!["--redis", url.as_str()];
    args.extend_from_slice(extra);
    let sluice = common::Server::start(REPLICA_POLICY, &args);
    Some((redis_server, sluice))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_answers_by_failure_mode_while_redis_is_down() {
    let Some((mut redis_server, sluice)) =
        sluice_on_one_shard(&["--store-timeout", "100ms", "--failure-mode", "open"]).await
    else {
        return;
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for c in 0..4 {
        let mut client = sluice.client().await;
        let stop = stop.clone();
        let total = total.clone();
        load.push(tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let mut answered = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let req = common::request(
                    "exact",
                    vec![common::desc(&[("fixed_window", &format!("load-{c}"))])],
                );
                let started = Instant::now();
                // Any gRPC error fails the test: the failure mode must answer.
                let r = client.should_rate_limit(req).await.expect("answered");
                assert_eq!(r.into_inner().overall_code, common::OK, "open");
                slowest = slowest.max(started.elapsed());
                answered += 1;
                total.fetch_add(1, Relaxed);
                // Paces the load; not a wait for anything.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (answered, slowest)
        }));
    }
    common::eventually(Duration::from_secs(10), "40 calls answered", || {
        let n = total.load(Relaxed);
        async move { n >= 40 }
    })
    .await;
    redis_server.kill();
    // The shard is found down, and the failure mode then answers 40 more calls.
    let mut lines = sluice
        .wait_line(Duration::from_secs(10), "the shard down", |l| {
            l.contains("redis shard down")
        })
        .await;
    let failures = |n: f64| {
        let sluice = &sluice;
        move || {
            let f = sluice.metric("sluice_store_failures_total", &[("store", "redis")]);
            async move { f >= Some(n) }
        }
    };
    let at_down = sluice
        .metric("sluice_store_failures_total", &[("store", "redis")])
        .expect("store failures are exported");
    common::eventually(
        Duration::from_secs(10),
        "40 calls answered by the failure mode",
        failures(at_down + 40.0),
    )
    .await;
    // Failing open, the replica answers: it stays in the endpoints.
    assert_eq!(common::http(&sluice.http, "GET", "/readyz", "").0, 200);
    redis_server.restart().await;
    // Recovered once the limit is enforced again (2 per hour for a tenant).
    let mut client = sluice.client().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = common::call(
            &mut client,
            common::request("exact", vec![common::desc(&[("tenant", "after")])]),
        )
        .await;
        if r.overall_code == common::OVER_LIMIT {
            break;
        }
        assert!(Instant::now() < deadline, "never enforced again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in load {
        let (answered, slowest) = task.await.expect("load task");
        assert!(answered > 10);
        assert!(
            slowest < Duration::from_millis(600),
            "slowest call {slowest:?}"
        );
    }
    lines.extend(
        sluice
            .wait_line(Duration::from_secs(10), "the shard up", |l| {
                l.contains("redis shard up")
            })
            .await,
    );
    lines.extend(sluice.lines_until_reload().await);
    let down = lines
        .iter()
        .filter(|l| l.contains("redis shard down"))
        .count();
    let up = lines
        .iter()
        .filter(|l| l.contains("redis shard up"))
        .count();
    assert_eq!((down, up), (1, 1), "one line per state change: {lines:#?}");
    let metrics = common::http(&sluice.http, "GET", "/metrics", "").1;
    let refused = format!(
        "sluice_store_errors_total{{kind=\"connection\",shard=\"{}\",store=\"redis\"}} ",
        redis_server.addr()
    );
    let count = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&refused))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(count.is_some_and(|n| n > 0), "{metrics}");
}

#[tokio::test]
async fn lua_muldiv_is_exact_beyond_2_pow_53() {
    let Some(server) = RedisServer::if_available().await else {
        return;
    };
    let mut conn = server.conn().await;
    let script = redis::Script::new(concat!(
        include_str!("../src/store/redis/lua/common.lua"),
        "local q, r = muldiv(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))\n",
        "return {fmt(q), fmt(r)}\n"
    ));
    let mut rng = Lcg(11);
    let max = 1u64 << 52;
    let mut slow = 0;
    for i in 0..400 {
        // 1 + a random value of up to `bits` bits (Lcg draws 31 bits at a time).
        let pick = |rng: &mut Lcg, bits: u64| {
            let wide = (rng.next(1 << 31) << 31) | rng.next(1 << 31);
            1 + (wide & ((1u64 << bits.min(52)) - 1))
        };
        let (ba, bb, bc) = (20 + rng.next(33), 20 + rng.next(33), 1 + rng.next(52));
        let a = pick(&mut rng, ba);
        let b = pick(&mut rng, bb);
        let c = pick(&mut rng, bc).min(max);
        let (q, r) = (
            u128::from(a) * u128::from(b) / u128::from(c),
            u128::from(a) * u128::from(b) % u128::from(c),
        );
        let got: (String, String) = script
            .arg(a)
            .arg(b)
            .arg(c)
            .invoke_async(&mut conn)
            .await
            .expect("eval");
        if q < 1 << 53 {
            if u128::from(a) * u128::from(b) >= 1 << 53 {
                slow += 1;
            }
            assert_eq!(
                got,
                (q.to_string(), r.to_string()),
                "case {i}: {a} * {b} / {c}"
            );
        } else {
            assert_eq!(
                got.0,
                (1u64 << 53).to_string(),
                "case {i}: overflow is HUGE"
            );
        }
    }
    assert!(
        slow > 50,
        "only {slow} products past 2^53 with exact quotients"
    );
}

#[test]
fn a_bad_redis_url_is_refused_at_start_without_showing_the_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, REPLICA_POLICY).expect("policy");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(&policy)
        .args([
            "--redis",
            "redis://:s3cret@127.0.0.1:notaport",
            "--grpc-addr",
            "127.0.0.1:0",
        ])
        .args(["--http-addr", "127.0.0.1:0"])
        .output()
        .expect("run sluice");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("invalid Redis URL"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_bans_a_repeat_offender_with_the_redis_store() {
    let Some(redis_server) = RedisServer::if_available().await else {
        return;
    };
    let url = redis_server.url();
    let policy = r#"
domain: pen
descriptors:
  - key: client
    rate_limit:
      unit: minute
      requests_per_unit: 1
      algorithm: sliding_window_log
      penalty: {violations: 2, within: 1m, ban: 10m}
"#;
    let sluice = common::Server::start(policy, &["--redis", &url, "--store-timeout", "200ms"]);
    let mut client = sluice.client().await;
    let req = |who: &str| common::request("pen", vec![common::desc(&[("client", who)])]);
    assert_eq!(
        common::call(&mut client, req("mallory")).await.overall_code,
        common::OK
    );
    // Two denials within the span start a ten-minute ban.
    for _ in 0..2 {
        let r = common::call(&mut client, req("mallory")).await;
        assert_eq!(r.overall_code, common::OVER_LIMIT);
    }
    let r = common::call(&mut client, req("mallory")).await;
    assert_eq!(r.overall_code, common::OVER_LIMIT);
    let retry: u64 = common::header(&r, "retry-after")
        .expect("retry-after")
        .parse()
        .expect("seconds");
    // The window alone would free up within a minute; the ban lasts ten.
    assert!(
        retry >= 540,
        "retry-after {retry} is the ban, not the window"
    );
    // Other clients are untouched, and the ban shows in the metrics.
    assert_eq!(
        common::call(&mut client, req("alice")).await.overall_code,
        common::OK
    );
    let metrics = common::http(&sluice.http, "GET", "/metrics", "").1;
    assert!(
        metrics.contains("sluice_penalty_active_bans 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"sluice_penalty_bans_total{domain="pen",rule="client"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn active_keys_follow_the_counters_on_every_shard() {
    if !available() {
        return;
    }
    let servers = [RedisServer::start().await, RedisServer::start().await];
    let mut opts = Options::new(servers.iter().map(RedisServer::url).collect(), false);
    opts.key_count_interval = Duration::from_millis(50);
    // At the start of an hour: no key expires with its window before it is counted.
    opts.fixed_clock = Some(Arc::new(ManualClock::new(1_764_000_000 * SECOND)));
    let store = RedisStore::new(opts, None).expect("store");
    admit_distinct_keys(&store, "k", 40).await;
    wait_for_active_keys(&store, 40).await;
    // Both shards hold some: the count is their sum.
    for server in &servers {
        assert!(!keys(&mut server.conn().await).await.is_empty());
    }
    // Counters gone (expired, or flushed as here): the count follows.
    for server in &servers {
        let () = redis::cmd("FLUSHALL")
            .query_async(&mut server.conn().await)
            .await
            .unwrap();
    }
    wait_for_active_keys(&store, 0).await;
}

/// Admits one hit on each of `n` fresh fixed-window keys of an hour. Each expires at
/// its window's end: a test that counts them decides at the start of an hour.
async fn admit_distinct_keys(store: &RedisStore, prefix: &str, n: usize) {
    for i in 0..n {
        let h = hit(
            &format!("{prefix}-{i}"),
            Algorithm::FixedWindow,
            5,
            3600 * SECOND,
            1,
        );
        assert!(store.decide(&[h]).await.unwrap().admitted);
    }
}

/// Until `sluice_active_keys` reads `want` (5 s at most).
async fn wait_for_active_keys(store: &RedisStore, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.active_keys() != want {
        assert!(
            Instant::now() < deadline,
            "active keys {} instead of {want}",
            store.active_keys()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/debug/store`'s entry for the shard at `addr`.
fn store_shard(sluice: &common::Server, addr: &str) -> serde_json::Value {
    let (status, body) = common::http(&sluice.http, "GET", "/debug/store", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["store"], "redis", "{body}");
    v["shards"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == addr))
        .cloned()
        .unwrap_or_else(|| panic!("no shard {addr} in {body}"))
}

#[tokio::test]
async fn failing_closed_a_replica_stays_ready_while_its_shard_is_down() {
    // A store timeout long enough that a loaded machine's first calls (connections
    // being opened) are answered by Redis: this test is about readiness, not latency.
    let Some((mut redis_server, sluice)) =
        sluice_on_one_shard(&["--failure-mode", "closed", "--store-timeout", "250ms"]).await
    else {
        return;
    };
    let addr = redis_server.addr();
    let readyz = || common::http(&sluice.http, "GET", "/readyz", "").0;
    let mut client = sluice.client().await;
    let req = || common::request("exact", vec![common::desc(&[("fixed_window", "f")])]);
    assert_eq!(
        common::call(&mut client, req()).await.overall_code,
        common::OK
    );
    let up = store_shard(&sluice, &addr);
    assert_eq!(up["state"], "up", "{up}");
    assert!(up["last_error"].is_null(), "{up}");
    redis_server.kill();
    // Every call is denied by the closed failure mode, the replica stays ready (every
    // replica shares the shard: out of the endpoints, Envoy's own failure mode would
    // answer), and /debug/store says why.
    let deadline = Instant::now() + Duration::from_secs(10);
    let down = loop {
        let r = common::call(&mut client, req()).await;
        assert_eq!(r.overall_code, common::OVER_LIMIT, "closed");
        assert_eq!(readyz(), 200, "a store outage is not this replica's");
        let shard = store_shard(&sluice, &addr);
        if shard["state"] == "backing_off" {
            break shard;
        }
        assert!(Instant::now() < deadline, "never backed off: {shard}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(down["last_error"]["kind"], "connection", "{down}");
    assert!(down["last_error"]["at"].is_string(), "{down}");
    assert!(down["backoff_until"].is_string(), "{down}");
    let left = down["backoff_remaining_seconds"].as_f64().expect("seconds");
    assert!(left > 0.0 && left <= 5.0, "{down}");
    redis_server.restart().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let code = common::call(&mut client, req()).await.overall_code;
        let shard = store_shard(&sluice, &addr);
        if shard["state"] == "up" {
            assert_eq!(code, common::OK, "decided by Redis again: {shard}");
            assert_eq!(
                shard["last_error"]["kind"], "connection",
                "the last error stays: {shard}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "not up again: {shard}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(readyz(), 200);
}

/// `CONFIG GET` calls a server has answered.
async fn config_gets(server: &RedisServer) -> u64 {
    command_calls(&mut server.conn().await, "config|get").await
}

/// Key counts (`DBSIZE`) a server has answered.
async fn key_counts(server: &RedisServer) -> u64 {
    command_calls(&mut server.conn().await, "dbsize").await
}

#[tokio::test]
async fn the_expire_cycle_check_reads_hz_from_the_server() {
    if !available() {
        return;
    }
    use sluice::store::redis::expire;
    let timeout = Duration::from_millis(15);
    let slow = RedisServer::start_with(&["--hz", "10"]).await;
    let warning = expire::check(&slow.pool(), &slow.addr(), timeout).await;
    let warning = warning.expect("hz 10: a 25 ms cycle outlasts 15 ms");
    assert!(
        warning.starts_with(&format!("redis {} has hz 10:", slow.addr())),
        "{warning}"
    );
    assert!(warning.contains("up to 25ms"), "{warning}");
    assert!(warning.contains("Set `hz 100`"), "{warning}");
    // A longer store timeout is enough for it.
    let longer = Duration::from_millis(30);
    assert_eq!(
        expire::check(&slow.pool(), &slow.addr(), longer).await,
        None
    );

    let fast = RedisServer::start_with(&["--hz", "100"]).await;
    assert_eq!(
        expire::check(&fast.pool(), &fast.addr(), timeout).await,
        None
    );

    // active-expire-effort is read too: 43 % of a tick at hz 20 is 21.5 ms.
    let effort = RedisServer::start_with(&["--hz", "20", "--active-expire-effort", "10"]).await;
    let warning = expire::check(&effort.pool(), &effort.addr(), timeout).await;
    let warning = warning.expect("21.5 ms outlasts 15 ms");
    assert!(
        warning.contains("hz 20 and active-expire-effort 10"),
        "{warning}"
    );
    assert!(warning.contains("up to 21.5ms"), "{warning}");

    // CONFIG renamed away, as managed Redis does: nothing to say, no error.
    let managed =
        RedisServer::start_with(&["--hz", "10", "--rename-command", "CONFIG", "HIDDEN"]).await;
    assert_eq!(
        expire::check(&managed.pool(), &managed.addr(), timeout).await,
        None
    );
}

#[tokio::test]
async fn the_store_checks_each_shards_expire_cycle_once() {
    if !available() {
        return;
    }
    // hz 1: a cycle of up to 250 ms outlasts the 200 ms timeout, so each shard warns,
    // and the calls below have a timeout a busy machine keeps (15 ms, the default,
    // timed some out on a loaded machine).
    let servers = [
        RedisServer::start_with(&["--hz", "1"]).await,
        RedisServer::start_with(&["--hz", "1"]).await,
    ];
    let mut opts = Options::new(servers.iter().map(RedisServer::url).collect(), false);
    opts.key_count_interval = Duration::from_millis(20);
    opts.call_timeout = Duration::from_millis(200);
    let store = RedisStore::new(opts, None).expect("store");
    // The check is one CONFIG GET hz and one of active-expire-effort per shard, made
    // when the shard first answers a key count...
    for server in &servers {
        common::eventually(Duration::from_secs(5), "the check", || async {
            config_gets(server).await >= 2
        })
        .await;
    }
    // ...and not again as ten more key counts come and go.
    for server in &servers {
        let counted = key_counts(server).await;
        common::eventually(Duration::from_secs(5), "ten more key counts", || async {
            key_counts(server).await >= counted + 10
        })
        .await;
    }
    for server in &servers {
        assert_eq!(config_gets(server).await, 2);
    }
    // Nor do requests ask.
    admit_distinct_keys(&store, "hz", 20).await;
    for server in &servers {
        assert_eq!(config_gets(server).await, 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_warns_once_about_a_shard_whose_expire_cycle_outlasts_the_timeout() {
    if !available() {
        return;
    }
    let slow = RedisServer::start_with(&["--hz", "10"]).await;
    let fast = RedisServer::start_with(&["--hz", "100"]).await;
    // One key, so that sluice_active_keys shows when the first key count is done.
    let () = redis::cmd("SET")
        .arg("a-key")
        .arg(1)
        .query_async(&mut fast.conn().await)
        .await
        .unwrap();
    let urls = format!("{},{}", slow.url(), fast.url());
    // The default --store-timeout, given as the harness gives every test 2 s.
    let sluice = common::Server::start(
        REPLICA_POLICY,
        &["--redis", &urls, "--store-timeout", "15ms"],
    );
    let is_warning = |l: &String| l.contains("expire cycle");
    // The check can finish before sluice says it listens.
    let mut lines = sluice.startup.clone();
    // Both shards are checked in the first key count, which is done once it is
    // counted; then every line is read up to a reload logged after it.
    common::eventually(Duration::from_secs(10), "the first key count", || {
        let keys = sluice.metric("sluice_active_keys", &[("store", "redis")]);
        async move { keys == Some(1.0) }
    })
    .await;
    lines.extend(sluice.lines_until_reload().await);
    let warnings: Vec<&String> = lines.iter().filter(|l| is_warning(l)).collect();
    assert_eq!(warnings.len(), 1, "{lines:#?}");
    let w = warnings[0];
    assert!(w.contains("WARN"), "{w}");
    assert!(
        w.contains(&format!("redis {} has hz 10:", slow.addr())),
        "{w}"
    );
    assert!(w.contains("--store-timeout is 15ms"), "{w}");
    assert!(!w.contains(&fast.addr()), "{w}");
    assert_eq!(config_gets(&slow).await, 2);
    assert_eq!(config_gets(&fast).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expire_cycle_is_checked_on_every_cluster_master() {
    let Some(cluster) = RedisCluster::if_available(3).await else {
        return;
    };
    // Nodes start with Redis's default hz 10; one is raised to 100.
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("hz")
        .arg("100")
        .query_async(&mut cluster.nodes[0].conn().await)
        .await
        .unwrap();
    let nodes = Cluster::new(
        &cluster.urls(),
        Duration::from_secs(1),
        Duration::from_secs(1),
        None,
    )
    .expect("cluster");
    let warnings = nodes.expire_warnings(Duration::from_millis(15)).await;
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    for node in &cluster.nodes[1..] {
        let want = format!("redis {} has hz 10:", node.addr());
        assert!(
            warnings.iter().any(|w| w.starts_with(&want)),
            "{warnings:#?}"
        );
    }
    assert!(nodes
        .expire_warnings(Duration::from_millis(30))
        .await
        .is_empty());
}

/// The address's limit is a log: its two admitted requests fill it for a minute
/// after them, whenever they run.
const LOOP_POLICY: &str = r#"
domain: shop
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 2
      algorithm: sliding_window_log
      penalty:
        violations: 3
        within: 1m
        ban: 2s
        block: {bans: 2, within: 1h, for: 1h}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

/// Three sluices sharing `redis`, and a client of each.
async fn three_replicas(
    policy: &str,
    redis: &RedisServer,
) -> (Vec<common::Server>, Vec<RateLimitServiceClient<Channel>>) {
    let url = redis.url();
    let servers: Vec<common::Server> = (0..3)
        .map(|_| common::Server::start(policy, &["--redis", &url]))
        .collect();
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(s.client().await);
    }
    (servers, clients)
}

/// The sentences `/debug/blocks` of `server` lists for `key`, as (kind, source).
fn sentences_of(server: &common::Server, key: &str) -> Vec<(String, String)> {
    let (status, body) = common::http(&server.http, "GET", "/debug/blocks", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["shared"], true, "{v}");
    v["sentences"]
        .as_array()
        .expect("sentences")
        .iter()
        .filter(|s| s["key"] == key)
        .map(|s| {
            (
                s["kind"].as_str().unwrap_or("").to_string(),
                s["source"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Waits until every replica lists one sentence for `key`: a `kind` of its penalty.
async fn every_replica_lists(servers: &[common::Server], key: &str, kind: &str, what: &str) {
    let want = [(kind.to_string(), "penalty".to_string())];
    for s in servers {
        common::eventually(Duration::from_secs(5), what, || async {
            sentences_of(s, key) == want
        })
        .await;
    }
}

/// The requests to `shop` that `server` counted with `outcome` on its
/// `remote_address` rule.
fn counted_as(server: &common::Server, outcome: &str) -> f64 {
    let labels = [
        ("domain", "shop"),
        ("layer", "service"),
        ("outcome", outcome),
        ("rule", "remote_address"),
    ];
    server
        .metric("sluice_requests_total", &labels)
        .unwrap_or(0.0)
}

/// Waits until every replica's client gets `code` for `user`.
async fn every_replica_answers(
    clients: &[RateLimitServiceClient<Channel>],
    user: &str,
    code: i32,
    what: &str,
) {
    for c in clients {
        common::eventually(Duration::from_secs(5), what, || {
            let mut c = c.clone();
            async move { code_of(&mut c, "user", user).await == code }
        })
        .await;
    }
}

/// The sentences a replica's admin API lists for domain `shop`.
async fn list_shop_blocks(
    admin: &mut sluice::admin::pb::admin_client::AdminClient<Channel>,
) -> sluice::admin::pb::Sentences {
    admin
        .list_blocks(sluice::admin::pb::ListBlocksRequest {
            domain: "shop".into(),
        })
        .await
        .expect("list")
        .into_inner()
}

/// A request from address `ip` on each replica, each denied.
async fn denied_on_each(clients: &mut [RateLimitServiceClient<Channel>], ip: &str) {
    for c in clients.iter_mut() {
        assert_eq!(code_of(c, "remote_address", ip).await, common::OVER_LIMIT);
    }
}

async fn code_of(client: &mut RateLimitServiceClient<Channel>, key: &str, value: &str) -> i32 {
    common::call(
        client,
        common::request("shop", vec![common::desc(&[(key, value)])]),
    )
    .await
    .overall_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_redis_ban_block_and_unblock_a_key_as_one() {
    let Some(redis_server) = RedisServer::if_available().await else {
        return;
    };
    let (servers, mut clients) = three_replicas(LOOP_POLICY, &redis_server).await;

    // Two admitted, then one denial on each replica: three violations in all, though
    // no replica saw more than one. The third starts the ban.
    let ip = "203.0.113.7";
    for (i, want) in [
        common::OK,
        common::OK,
        common::OVER_LIMIT,
        common::OVER_LIMIT,
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(
            code_of(&mut clients[i % 3], "remote_address", ip).await,
            want,
            "call {i}"
        );
    }
    assert!(servers.iter().all(|s| sentences_of(s, ip).is_empty()));
    assert_eq!(
        code_of(&mut clients[2], "remote_address", ip).await,
        common::OVER_LIMIT
    );
    every_replica_lists(&servers, ip, "ban", "every replica lists the ban").await;
    // Banned on every replica: denied without a store call, as `banned`.
    denied_on_each(&mut clients, ip).await;
    for s in &servers {
        common::eventually(
            Duration::from_secs(5),
            "the ban is counted as banned",
            || async { counted_as(s, "banned") >= 1.0 },
        )
        .await;
    }

    // The ban ends; three more denials (the log still holds the two admitted
    // requests) are the key's second sentence, which `block` turns into a block on
    // every replica.
    for s in &servers {
        common::eventually(Duration::from_secs(10), "the ban ends", || async {
            sentences_of(s, ip).is_empty()
        })
        .await;
    }
    denied_on_each(&mut clients, ip).await;
    every_replica_lists(&servers, ip, "block", "every replica lists the block").await;
    denied_on_each(&mut clients, ip).await;
    assert!(counted_as(&servers[0], "blocked") >= 1.0);
    // Another address is untouched.
    assert_eq!(
        code_of(&mut clients[1], "remote_address", "198.51.100.1").await,
        common::OK
    );

    // An operator blocks a user on one replica (a rule with no penalty): every
    // replica denies it; an unblock on another replica lifts it everywhere.
    use sluice::admin::pb;
    let mut admin0 = servers[0].admin_client().await;
    let mut admin2 = servers[2].admin_client().await;
    let entry = |k: &str, v: &str| pb::request_descriptor::Entry {
        key: k.to_string(),
        value: v.to_string(),
    };
    let put = admin0
        .block(pb::BlockRequest {
            domain: "shop".into(),
            entries: vec![entry("user", "mallory")],
            for_micros: 600 * SECOND,
        })
        .await
        .expect("block")
        .into_inner();
    assert_eq!(
        (put.kind.as_str(), put.source.as_str()),
        ("block", "operator")
    );
    every_replica_answers(
        &clients,
        "mallory",
        common::OVER_LIMIT,
        "the operator's block holds",
    )
    .await;
    let listed = list_shop_blocks(&mut admin2).await;
    assert!(listed
        .sentences
        .iter()
        .any(|s| s.key == "mallory" && s.kind == "block"));
    assert!(listed
        .sentences
        .iter()
        .any(|s| s.key == ip && s.kind == "block"));
    let lifted = admin2
        .unblock(pb::UnblockRequest {
            domain: "shop".into(),
            entries: vec![entry("user", "mallory")],
            ..Default::default()
        })
        .await
        .expect("unblock")
        .into_inner();
    assert!(lifted.lifted);
    assert_eq!(lifted.counter, put.counter);
    every_replica_answers(&clients, "mallory", common::OK, "the unblock holds").await;
    // A block of what no rule limits is refused, naming why.
    let refused = admin0
        .block(pb::BlockRequest {
            domain: "shop".into(),
            entries: vec![entry("path", "/")],
            for_micros: 0,
        })
        .await
        .expect_err("no rule");
    assert_eq!(refused.code(), tonic::Code::NotFound);
    assert!(refused.message().contains("no limited rule"), "{refused:?}");

    // The longest block (2^50 µs, about 35 years) holds in Redis like a short one;
    // a longer one is refused rather than written past what the board keeps.
    let too_long = admin0
        .block(pb::BlockRequest {
            domain: "shop".into(),
            entries: vec![entry("user", "eve")],
            for_micros: u64::MAX,
        })
        .await
        .expect_err("too long");
    assert_eq!(too_long.code(), tonic::Code::InvalidArgument);
    admin0
        .block(pb::BlockRequest {
            domain: "shop".into(),
            entries: vec![entry("user", "eve")],
            for_micros: 1 << 50,
        })
        .await
        .expect("the longest block");
    every_replica_answers(
        &clients,
        "eve",
        common::OVER_LIMIT,
        "the longest block holds",
    )
    .await;
    let listed = list_shop_blocks(&mut admin2).await;
    let eve = listed
        .sentences
        .iter()
        .find(|s| s.key == "eve")
        .expect("listed on another replica");
    assert!(eve.remaining_micros > (1 << 50) - 60 * SECOND, "{eve:?}");
}

const TIGHTEN_POLICY: &str = r#"
domain: shop
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 10
      algorithm: fixed_window
      penalty:
        violations: 3
        within: 1m
        tighten: {factor: 0.2, for: 1m}
"#;

/// The hour Redis's clock is in: the window of an hour-long fixed window.
async fn redis_hour(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, _micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs / 3600
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_redis_tighten_a_key_as_one() {
    let Some(redis_server) = RedisServer::if_available().await else {
        return;
    };
    let (servers, mut clients) = three_replicas(TIGHTEN_POLICY, &redis_server).await;
    let mut conn = redis_server.conn().await;
    // Everything below is counted in one hour-long window and needs no window to
    // end (that the tightened limit holds in later windows is tested in process, on
    // a manual clock). A round that straddles the end of an hour (by Redis's clock)
    // is run again with fresh keys.
    for round in 0..3 {
        let hour = redis_hour(&mut conn).await;
        let (scraper, reader) = (format!("scraper{round}"), format!("reader{round}"));
        // A request for more than the whole limit (the request's `hits_addend`, not
        // a charge: spent only if admitted), once on each replica: each denied
        // without spending, and no replica sees more than one denial. The third
        // tightens the key everywhere.
        for c in clients.iter_mut() {
            let batch = RateLimitRequest {
                hits_addend: 11,
                ..common::request("shop", vec![common::desc(&[("user", &scraper)])])
            };
            assert_eq!(
                common::call(c, batch).await.overall_code,
                common::OVER_LIMIT
            );
        }
        let what = "every replica lists the tightening";
        every_replica_lists(&servers, &scraper, "tighten", what).await;
        // A fifth of the limit, across all replicas together, while another key
        // keeps the whole limit.
        let mut tight = 0;
        let mut other = 0;
        for i in 0..12 {
            if code_of(&mut clients[i % 3], "user", &scraper).await == common::OK {
                tight += 1;
            }
            if code_of(&mut clients[(i + 1) % 3], "user", &reader).await == common::OK {
                other += 1;
            }
        }

        // A flood from the tightened key costs Redis a call per `violations` denials
        // at most (each replica counts them itself), not a call per denial; one more
        // if the replica has to ask whether the key is still spent.
        let before = script_calls(&mut conn).await;
        let mut denied = 0;
        for _ in 0..30 {
            if code_of(&mut clients[0], "user", &scraper).await == common::OVER_LIMIT {
                denied += 1;
            }
        }
        let calls = script_calls(&mut conn).await - before;
        if redis_hour(&mut conn).await != hour {
            continue;
        }
        assert_eq!((tight, other), (2, 10));
        assert_eq!(denied, 30);
        assert!(
            calls <= denied / 3 + 1,
            "{calls} script calls for {denied} denials"
        );
        return;
    }
    panic!("three rounds each straddled the end of an hour");
}

/// What a probe heard: (host, port, script, keys, ok, took).
type Heard = Vec<(
    Option<String>,
    Option<u16>,
    &'static str,
    usize,
    bool,
    Duration,
)>;

/// Records each store call it hears of, and the command each went by.
#[derive(Default)]
struct Ears(std::sync::Mutex<Heard>, std::sync::Mutex<Vec<&'static str>>);

impl sluice::store::Probe for Ears {
    fn call(&self, c: &sluice::store::StoreCall<'_>) {
        let took = c.ended.duration_since(c.started).unwrap_or_default();
        self.1.lock().unwrap().push(c.operation);
        self.0.lock().unwrap().push((
            c.host.map(str::to_string),
            c.port,
            c.script,
            c.keys,
            c.error.is_none(),
            took,
        ));
    }
}

/// A probed decision tells of each shard it called, by the shard's address, with the
/// script and its keys: one call for a request on one shard, one per shard for a
/// request over two, none when the over-limit cache answers; an unprobed decision
/// decides the same.
#[tokio::test]
async fn a_probe_hears_each_shard_call_with_its_address() {
    let Some(t) = start(2).await else { return };
    const HOUR: Micros = 3_600 * SECOND;
    let port = |i: usize| {
        t.servers[i]
            .addr()
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u16>()
            .ok()
    };
    let on0 = hit(&key_on("probe", 0, 2), Algorithm::FixedWindow, 1, HOUR, 1);
    let on1 = hit(&key_on("probe", 1, 2), Algorithm::FixedWindow, 5, HOUR, 1);

    let ears = Ears::default();
    let v = t
        .store
        .decide_within(std::slice::from_ref(&on0), WAIT, Some(&ears))
        .await
        .unwrap();
    assert!(v.admitted);
    let heard = std::mem::take(&mut *ears.0.lock().unwrap());
    assert_eq!(heard.len(), 1, "{heard:?}");
    let (host, p, script, keys, ok, took) = &heard[0];
    assert_eq!((host.as_deref(), *p), (Some("127.0.0.1"), port(0)));
    assert_eq!((*script, *keys, *ok), ("decide", 1, true));
    assert!(*took > Duration::ZERO, "a round trip takes time");
    // The test servers are Redis 7: the decide function is called by FCALL.
    assert_eq!(*ears.1.lock().unwrap(), ["FCALL"]);

    // Over both shards (on0 is now full: denied, so on1's hit is given back).
    let v = t
        .store
        .decide_within(&[on0.clone(), on1.clone()], WAIT, Some(&ears))
        .await
        .unwrap();
    assert!(!v.admitted);
    let heard = std::mem::take(&mut *ears.0.lock().unwrap());
    let mut ports: Vec<_> = heard.iter().map(|h| h.1).collect();
    ports.sort();
    let mut want = vec![port(0), port(1)];
    want.sort();
    assert_eq!(ports, want, "one call per shard: {heard:?}");
    assert!(heard.iter().all(|h| h.2 == "decide" && h.3 == 1 && h.4));

    // The denial of on0 alone is now cached: no call, nothing heard.
    let v = t
        .store
        .decide_within(std::slice::from_ref(&on0), WAIT, Some(&ears))
        .await
        .unwrap();
    assert!(!v.admitted);
    assert!(ears.0.lock().unwrap().is_empty(), "answered from the cache");

    // Unprobed, the same store decides as usual.
    let v = t.one(&on1).await;
    assert!(v.admitted);
    assert_eq!(
        v.verdicts[0].remaining, 4,
        "5 an hour, the refunded hit not counted"
    );
}

/// On Redis, as in memory: a leaky_bucket turn past the caller's `grpc-timeout` is
/// OVER_LIMIT at once, and the script takes neither the turn nor the request's
/// other counter.
#[tokio::test]
async fn the_binary_denies_a_late_leaky_turn_at_once_without_taking_it() {
    let Some(redis_server) = RedisServer::if_available().await else {
        return;
    };
    let url = redis_server.url();
    // A store timeout past a loaded machine's stalls: a Redis call that outlasted
    // the default 15 ms would be answered by the failure mode, not by the script.
    let args = ["--redis", &url, "--store-timeout", "1s"];
    crate::server::late_turns_are_denied_at_once_and_not_taken(&args).await;
}
