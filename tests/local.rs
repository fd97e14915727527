//! `failure_mode: local` on a real redis-server: three limiters (three replicas)
//! share one shard, count each other through it, and when it hangs or dies each
//! decides with its third of the limit; when it comes back their local spending
//! reaches the shared counter once, their refunds as refunds. One replica cut off alone is counted missing by
//! the others, which then leave its third to it; with the side channel (servers
//! that advertise their HTTP ports) they do so from its first call after the cut.
//!
//! The tests run one at a time: one bounds answer times.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use common::redis::{available, RedisCluster, RedisServer};
use sluice::algorithm::{Algorithm, Limit, NO_DEADLINE, SECOND};
use sluice::limiter::{Descriptor, Limiter, Settings};
use sluice::policy::FailureMode;
use sluice::store::redis::Options;
use sluice::store::{Beats, Fallback, Hit, Mode, RedisStore, Replicas, Settlement, Spend, Store};

/// Long enough that a loaded machine's stalls, which other tests and builds cause
/// here, neither fail a healthy shard's calls nor add up to a second timeout.
const STORE_TIMEOUT: Duration = Duration::from_millis(100);
/// The longest answer while the shard is away: under two store timeouts, so one
/// waited out at most, and no hang. The latency bound itself (store timeout +
/// 10 ms) is measured by scripts/fault-hosts.py, which tells a machine's stalls
/// from Sluice's own time; here other tests share the cores.
const BOUND: Duration = STORE_TIMEOUT
    .saturating_mul(2)
    .saturating_sub(Duration::from_millis(1));
/// The store timeout of the servers that peer ([`peering`]): each answer crosses
/// three processes (the test's, sluice's, Redis'), and on loaded cores their stalls
/// add up to more than 30 ms, which would fail a healthy shard's calls and break
/// [`BOUND`] without a second timeout waited out. Short enough still that a
/// replica's failed calls, each third call of a test, come within a second of each
/// other, so that its shard backs off as a hung shard does.
const PEER_STORE_TIMEOUT: Duration = Duration::from_millis(250);
/// [`BOUND`] for the servers that peer: under two of their store timeouts.
const PEER_BOUND: Duration = Duration::from_millis(2 * 250 - 1);
const REPLICAS: usize = 3;
/// A token bucket refilling 60 a day: no window boundary to land on during a test,
/// and no refill worth a token within one.
const LIMIT: u64 = 60;
const POLICY: &str = "domain: d
failure_mode: local
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 60, algorithm: token_bucket}
";

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type Replica = Limiter<RedisStore>;

fn store(url: &str) -> RedisStore {
    let mut opts = Options::new(vec![url.to_string()], false);
    opts.call_timeout = STORE_TIMEOUT;
    RedisStore::new(opts, None).expect("store")
}

fn replica(url: &str) -> Replica {
    replica_of(url, Arc::new(ArcSwap::from_pointee(compiled(POLICY))))
}

fn compiled(yaml: &str) -> sluice::policy::Policy {
    sluice::policy::compile(sluice::policy::parse_str("p.yaml", yaml).unwrap()).expect("compiles")
}

/// A replica on `url` deciding by `policy`, which the test may reload.
fn replica_of(url: &str, policy: Arc<ArcSwap<sluice::policy::Policy>>) -> Replica {
    let store = store(url);
    let settings = Settings {
        failure_mode: FailureMode::Open,
        store_timeout: STORE_TIMEOUT,
        ..Settings::default()
    };
    Limiter::new(policy, store, settings)
}

/// Three replicas on `redis`, each knowing that three serve.
async fn replicas(redis: &RedisServer) -> Vec<Replica> {
    let all: Vec<Replica> = (0..REPLICAS).map(|_| replica(&redis.url())).collect();
    counted(all).await
}

/// `all`, once each has counted them all.
async fn counted(all: Vec<Replica>) -> Vec<Replica> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while all.iter().any(|r| r.local().replicas() != REPLICAS as u32) {
        assert!(
            Instant::now() < deadline,
            "the replicas never counted three"
        );
        for r in &all {
            r.heartbeat().await.expect("heartbeat");
        }
    }
    all
}

/// One hit of `user`: (admitted, decided locally, how long it took).
async fn call(r: &Replica, user: &str, hits: u64) -> (bool, bool, Duration) {
    let entries = [("user", user)];
    let started = Instant::now();
    let o = r.decide("d", &[Descriptor::new(&entries, hits)]).await;
    assert!(o.failure.is_none(), "a local domain never fails: {o:?}");
    (!o.over_limit, o.local, started.elapsed())
}

/// What the shared counter of `user` has left, as `r` reads it from the store.
async fn remaining(r: &Replica, user: &str) -> u64 {
    let entries = [("user", user)];
    let o = r.decide("d", &[Descriptor::new(&entries, 0)]).await;
    assert!(!o.local, "the store answers again");
    o.statuses[0].verdict.expect("a verdict").remaining
}

/// Ticks every replica (settling what it can) until `done` or the deadline.
async fn settle_until(all: &[Replica], why: &str, mut done: impl FnMut(&[Replica]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for r in all {
            r.local_tick().await;
        }
        if done(all) {
            return;
        }
        assert!(Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_shard_is_answered_from_each_replicas_share_within_the_limit_in_total() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start().await;
    let all = replicas(&redis).await;
    // 18 of 60 spent through the store, the replicas taking turns.
    for i in 0..18 {
        let (admitted, local, _) = call(&all[i % REPLICAS], "u1", 1).await;
        assert!(admitted && !local);
    }

    redis.freeze();
    let mut admitted = 0;
    let mut slowest = Duration::ZERO;
    for r in &all {
        for _ in 0..LIMIT {
            let (ok, local, took) = call(r, "u1", 1).await;
            assert!(local, "decided locally while the shard hangs");
            slowest = slowest.max(took);
            if !ok {
                break;
            }
            admitted += 1;
        }
    }
    redis.thaw();
    let total = 18 + admitted;
    eprintln!("admitted {total} of {LIMIT} in all; slowest answer {slowest:?}");
    assert!(
        (LIMIT * 8 / 10..=LIMIT * 12 / 10).contains(&total),
        "admitted {total} of {LIMIT} in all"
    );
    assert!(slowest <= BOUND, "slowest answer {slowest:?}");
    let status = all[0].local().status();
    assert_eq!(status.replicas, 3);
    assert_eq!(status.counters.len(), 1);
    assert!(status.counters[0].key.contains("user=u1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_spending_reaches_a_restarted_shard_once() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start().await;
    let all = replicas(&redis).await;
    // Each replica has reached the store (so knows it is not new) before it dies.
    for r in &all {
        let (admitted, local, _) = call(r, "warm", 1).await;
        assert!(admitted && !local);
    }
    redis.kill();
    for r in &all {
        for _ in 0..5 {
            let (admitted, local, _) = call(r, "u2", 1).await;
            assert!(admitted && local);
        }
        // A request of two hits counts two.
        let (_, local, _) = call(r, "u2", 2).await;
        assert!(local);
    }
    // Nothing reaches a dead shard; the spending waits.
    for r in &all {
        assert_eq!(r.local_tick().await.added, 0);
        assert!(r.local().has_unsettled());
    }

    redis.restart().await;
    settle_until(&all, "the local spending never settled", |all| {
        all.iter().all(|r| !r.local().has_unsettled())
    })
    .await;
    // 3 replicas x (5 + 2): the restarted shard held nothing before.
    assert_eq!(remaining(&all[0], "u2").await, LIMIT - 21);
    // More ticks (reconnects, retries) add nothing again.
    for _ in 0..3 {
        for r in &all {
            let s = r.local_tick().await;
            assert_eq!((s.added, s.already), (0, 0));
        }
    }
    assert_eq!(remaining(&all[1], "u2").await, LIMIT - 21);
    assert!(all[2].local().status().counters.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_reloaded_to_another_algorithm_during_the_outage_gets_what_it_admitted() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start().await;
    let policies: Vec<_> = (0..REPLICAS)
        .map(|_| Arc::new(ArcSwap::from_pointee(compiled(POLICY))))
        .collect();
    let all = policies
        .iter()
        .map(|p| replica_of(&redis.url(), p.clone()))
        .collect();
    let all = counted(all).await;
    for r in &all {
        let (admitted, local, _) = call(r, "warm", 1).await;
        assert!(admitted && !local);
    }
    redis.kill();
    // Each replica admits a few under the token bucket...
    for r in &all {
        for _ in 0..5 {
            let (admitted, local, _) = call(r, "u5", 1).await;
            assert!(admitted && local);
        }
    }
    // ...then the rule is reloaded to a sliding window of the same 60 a day: a
    // counter of its own in the store, fresh, so each replica admits its share.
    let reloaded = POLICY.replace("token_bucket", "sliding_window_log");
    for p in &policies {
        p.store(Arc::new(compiled(&reloaded)));
    }
    let mut admitted = 0;
    for r in &all {
        for _ in 0..LIMIT {
            let (ok, local, _) = call(r, "u5", 1).await;
            assert!(local);
            if !ok {
                break;
            }
            admitted += 1;
        }
    }
    assert_eq!(admitted, LIMIT, "each replica's share of the new rule");

    redis.restart().await;
    settle_until(&all, "the local spending never settled", |all| {
        all.iter().all(|r| !r.local().has_unsettled())
    })
    .await;
    // The new rule's counter holds what it admitted: spent, it admits nothing
    // more (charged to the bucket's counter, it would admit its limit again).
    assert_eq!(remaining(&all[0], "u5").await, 0);
    for r in &all {
        let (ok, local, _) = call(r, "u5", 1).await;
        assert!(!ok && !local, "the store denies the spent key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_during_the_outage_starts_with_its_share_spent() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start().await;
    let url = redis.url();
    redis.kill();
    let late = replica(&url);
    let (admitted, local, _) = call(&late, "u3", 1).await;
    assert!(
        local && !admitted,
        "no share to hand out before knowing the counter"
    );
}

/// One call on `key`=`value`, a descriptor per amount of `hits` spent as its
/// [`Spend`]: (admitted, decided locally, how long it took).
async fn spend(
    r: &Replica,
    key: &str,
    value: &str,
    hits: &[(u64, Spend)],
) -> (bool, bool, Duration) {
    let entries = [(key, value)];
    let descriptors: Vec<_> = hits
        .iter()
        .map(|&(hits, spend)| Descriptor {
            spend,
            ..Descriptor::new(&entries, hits)
        })
        .collect();
    let started = Instant::now();
    let o = r.decide("d", &descriptors).await;
    assert!(o.failure.is_none(), "a local domain never fails: {o:?}");
    (!o.over_limit, o.local, started.elapsed())
}

/// Calls `r` on a key of its own until its shard is backed off for at least
/// another store timeout: a call made then is answered locally at once and never
/// reaches the shard (the trial calls at the end of a back-off would, and count in
/// Redis when it wakes: docs/local-share.md, *A call that timed out may still
/// count*).
async fn until_backed_off(r: &Replica) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let until = r.store().shards()[0].backoff_until;
        let left = until.and_then(|u| u.duration_since(std::time::SystemTime::now()).ok());
        if left.is_some_and(|left| left > STORE_TIMEOUT) {
            return;
        }
        assert!(Instant::now() < deadline, "the shard never backed off");
        let (_, local, _) = call(r, "spare", 1).await;
        assert!(local);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_made_during_the_outage_reach_the_shared_counter() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start().await;
    let policy = format!(
        "{POLICY}  - key: stream\n    rate_limit: {{algorithm: concurrency, requests_per_unit: 1, lease: 5m}}\n"
    );
    let r = replica_of(
        &redis.url(),
        Arc::new(ArcSwap::from_pointee(compiled(&policy))),
    );
    // Before the outage: a reservation of 30 charged, and the one slot taken.
    let (admitted, local, _) = spend(&r, "user", "u6", &[(30, Spend::Always)]).await;
    assert!(admitted && !local);
    let (admitted, local, _) = spend(&r, "stream", "s1", &[(1, Spend::IfAdmitted)]).await;
    assert!(admitted && !local);

    redis.freeze();
    until_backed_off(&r).await;
    // The stream ends while the shard hangs: the 30 given back and the actual 10
    // charged in one call, and the slot given back. Answered at once, locally.
    let stream_end = [(30, Spend::Refund), (10, Spend::Always)];
    let (admitted, local, took) = spend(&r, "user", "u6", &stream_end).await;
    assert!(admitted && local && took < STORE_TIMEOUT, "{took:?}");
    let (admitted, local, took) = spend(&r, "stream", "s1", &[(1, Spend::Refund)]).await;
    assert!(admitted && local && took < STORE_TIMEOUT, "{took:?}");

    redis.thaw();
    settle_until(
        std::slice::from_ref(&r),
        "the local spending never settled",
        |all| !all[0].local().has_unsettled(),
    )
    .await;
    // What Redis would hold had it answered throughout: only the 10 spent.
    assert_eq!(remaining(&r, "u6").await, LIMIT - 10);
    // The slot is free again, long before its lease ends.
    let (admitted, local, _) = spend(&r, "stream", "s1", &[(1, Spend::IfAdmitted)]).await;
    assert!(
        admitted && !local,
        "the slot given back during the outage is free"
    );
}

/// Settles on `store`, on a counter that held 30 of 60, 40 given back then 10
/// charged under one token, twice: the refund stops at an empty counter before the
/// charge (charged first, the two would leave it empty), and the retry adds nothing.
async fn gives_back_then_charges_once(store: &RedisStore) {
    let limit = Limit {
        algorithm: Algorithm::TokenBucket,
        requests: LIMIT,
        window: 86_400 * SECOND,
        burst: LIMIT,
        phase: 0,
    };
    let hit = |hits: u64, spend: Spend| Hit {
        key: "d|user=settled".to_string(),
        placement: 7,
        limit,
        hits,
        mode: Mode::Enforce,
        spend,
        fallback: Fallback::Local,
        max_delay: NO_DEADLINE,
    };
    store
        .decide(&[hit(30, Spend::Always)])
        .await
        .expect("charged");
    let settlement = Settlement {
        hit: hit(10, Spend::Always),
        refund: 40,
        token: "replica:1".to_string(),
    };
    let first = store.settle(std::slice::from_ref(&settlement)).await;
    assert_eq!(first, vec![Ok(true)]);
    let again = store.settle(std::slice::from_ref(&settlement)).await;
    assert_eq!(again, vec![Ok(false)], "one token, taken once");
    let left = store
        .decide(&[hit(0, Spend::IfAdmitted)])
        .await
        .expect("read");
    assert_eq!(left.verdicts[0].remaining, LIMIT - 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_gives_back_then_charges_once_on_a_shard_and_a_cluster() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start().await;
    gives_back_then_charges_once(&store(&redis.url())).await;
    let cluster = RedisCluster::start(3).await;
    let store = RedisStore::new(Options::new(cluster.urls(), true), None).expect("store");
    gives_back_then_charges_once(&store).await;
}

/// Polls `ok` every 50 ms until it holds; panics with `why` after 10 s.
async fn wait_until(why: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_counts_itself_answers_locally_shows_it_and_settles() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start().await;
    let url = redis.url();
    let sluice = common::Server::start(POLICY, &["--redis", &url, "--store-timeout", "30ms"]);
    let mut client = sluice.client().await;
    // The heartbeat has counted this replica: a share learned, not configured.
    wait_until("the replica never counted itself", || {
        sluice.metric("sluice_local_share_learned", &[]) == Some(1.0)
    })
    .await;
    assert_eq!(sluice.metric("sluice_local_share", &[]), Some(1.0));
    let mut call = async |user: &str| {
        let req = common::request("d", vec![common::desc(&[("user", user)])]);
        common::call(&mut client, req).await
    };
    assert_eq!(call("warm").await.overall_code, common::OK);

    redis.kill();
    for _ in 0..4 {
        assert_eq!(call("u4").await.overall_code, common::OK);
    }
    assert_eq!(
        sluice.metric("sluice_local_decisions_total", &[]),
        Some(4.0)
    );
    let shard = redis.addr();
    wait_until("the shard never showed as degraded", || {
        sluice.metric("sluice_degraded", &[("shard", &shard)]) == Some(1.0)
    })
    .await;
    let (status, body) = common::http(&sluice.http, "GET", "/debug/store", "");
    assert_eq!(status, 200);
    let store: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(store["local"]["replicas_from"], "store", "{body}");
    assert_eq!(store["local"]["counters"][0]["key"], "d|user=u4", "{body}");
    assert_eq!(store["local"]["counters"][0]["unsettled"], 4, "{body}");
    // The admin API's Explain says so too (with grpcurl, when it is installed).
    if let Some(bin) = common::tools::tool("grpcurl") {
        let body =
            r#"{"domain": "d", "descriptors": [{"entries": [{"key": "user", "value": "u4"}]}]}"#;
        let out = std::process::Command::new(bin)
            .args([
                "-plaintext",
                "-d",
                body,
                &sluice.admin,
                "sluice.admin.v1.Admin/Explain",
            ])
            .output()
            .expect("grpcurl runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let e: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(e["descriptors"][0]["local"], true, "{text}");
        assert_eq!(e["descriptors"][0]["localUnsettled"], "4", "{text}");
        let error = e["storeError"].as_str().unwrap_or_default();
        assert!(error.ends_with("(failure mode local answers)"), "{text}");
    }

    redis.restart().await;
    wait_until("the local spending never settled", || {
        sluice.metric("sluice_local_unsettled_counters", &[]) == Some(0.0)
    })
    .await;
    let reply = call("u4").await;
    assert!(reply.statuses[0].current_limit.is_some());
    // Four spent locally, this one in Redis: 60 - 5.
    assert_eq!(reply.statuses[0].limit_remaining, 55);
    assert_eq!(
        sluice.metric("sluice_degraded", &[("shard", &shard)]),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_keeps_at_most_max_keys_counters_and_settles_those_exactly() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start().await;
    let url = redis.url();
    const MAX: usize = 40;
    let max = MAX.to_string();
    let sluice = common::Server::start(
        POLICY,
        &[
            "--redis",
            &url,
            "--store-timeout",
            "30ms",
            "--max-keys",
            &max,
        ],
    );
    let mut client = sluice.client().await;
    wait_until("the replica never counted itself", || {
        sluice.metric("sluice_local_share_learned", &[]) == Some(1.0)
    })
    .await;
    let mut call = async |user: &str, hits: u64| {
        let req = common::request("d", vec![common::desc_hits(&[("user", user)], hits)]);
        common::call(&mut client, req).await
    };
    assert_eq!(call("warm", 1).await.overall_code, common::OK);

    redis.kill();
    // MAX keys kept, each owing what it admitted; three times as many new keys
    // after them are lifted: OK, with no limit shown that is not being kept.
    for i in 0..MAX {
        let reply = call(&format!("k{i}"), 2).await;
        assert_eq!(reply.overall_code, common::OK);
        assert_eq!(reply.statuses[0].limit_remaining, 58, "k{i} kept");
    }
    for i in MAX..4 * MAX {
        let reply = call(&format!("k{i}"), 1).await;
        assert_eq!(reply.overall_code, common::OK, "k{i}");
        assert_eq!(reply.statuses[0].limit_remaining, 0, "k{i} not kept");
    }
    let metric = |name: &str| sluice.metric(name, &[]);
    assert_eq!(metric("sluice_local_unsettled_counters"), Some(MAX as f64));
    assert_eq!(metric("sluice_local_refused_total"), Some(3.0 * MAX as f64));
    // Counted as the failure mode's answers, as `open` counts them.
    let (_, text) = common::http(&sluice.http, "GET", "/metrics", "");
    let failed_open: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("sluice_requests_total{") && l.contains(r#"outcome="failed_open""#)
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(failed_open, 3.0 * MAX as f64);
    // A kept key goes on counting down to its limit, then denies.
    let reply = call("k0", 58).await;
    assert_eq!(
        (reply.overall_code, reply.statuses[0].limit_remaining),
        (common::OK, 0)
    );
    assert_eq!(call("k0", 1).await.overall_code, common::OVER_LIMIT);

    redis.restart().await;
    wait_until("the local spending never settled", || {
        metric("sluice_local_unsettled_counters") == Some(0.0)
    })
    .await;
    // In batches: a call marks their tokens, one adds them (and a heartbeat a
    // second), not a call or two per counter.
    let mut conn = redis.conn().await;
    let calls = common::redis::script_calls(&mut conn).await;
    assert!(calls < 10, "{calls} script calls to settle {MAX} counters");
    // Exactly what each kept key admitted; nothing of the lifted ones.
    assert_eq!(call("k0", 1).await.overall_code, common::OVER_LIMIT);
    for i in 1..MAX {
        let reply = call(&format!("k{i}"), 1).await;
        assert_eq!(reply.statuses[0].limit_remaining, 57, "k{i}");
    }
    let reply = call(&format!("k{MAX}"), 1).await;
    assert_eq!(reply.statuses[0].limit_remaining, 59);
}

/// A TCP relay to a shard that can be cut: cut, it closes its connections and stops
/// listening, so the replica behind it alone cannot reach the shard; restored, it
/// listens on the same port again.
struct Relay {
    port: u16,
    upstream: String,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Relay {
    async fn start(upstream: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let port = listener.local_addr().expect("bound").port();
        let task = tokio::spawn(relay(listener, upstream.clone()));
        Relay {
            port,
            upstream,
            task: Some(task),
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn cut(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    async fn restore(&mut self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("binds its port again");
        self.task = Some(tokio::spawn(relay(listener, self.upstream.clone())));
    }
}

/// Relays each connection to `upstream` until aborted, which drops them all.
async fn relay(listener: tokio::net::TcpListener, upstream: String) {
    let mut conns = tokio::task::JoinSet::new();
    while let Ok((mut down, _)) = listener.accept().await {
        let upstream = upstream.clone();
        conns.spawn(async move {
            if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_counts_a_silent_replica_missing_then_gone_and_one_that_leaves_at_once() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start().await;
    let store = store(&redis.url());
    // A live span well over a loaded machine's pause between two beats.
    let beats = Beats {
        live: Duration::from_secs(1),
        hold: Duration::from_millis(2500),
    };
    let beat = async |id: &str| {
        store
            .heartbeat(id, beats)
            .await
            .expect("beats")
            .expect("a shared store")
            .replicas
    };
    for id in ["a", "b", "c"] {
        beat(id).await;
    }
    // c stops beating: live, then missing once its beat is older than the live
    // span, then gone once older than the hold. Redis's clock decides.
    let mut seen = vec![beat("a").await];
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.last()
        != Some(&Replicas {
            live: 2,
            missing: 0,
        })
    {
        assert!(Instant::now() < deadline, "counts seen: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        beat("b").await;
        let now = beat("a").await;
        if seen.last() != Some(&now) {
            seen.push(now);
        }
    }
    assert_eq!(
        seen,
        [
            Replicas {
                live: 3,
                missing: 0
            },
            Replicas {
                live: 2,
                missing: 1
            },
            Replicas {
                live: 2,
                missing: 0
            },
        ]
    );
    // b stops cleanly: out of the count at once, never missing.
    store.leave("b").await.expect("leaves");
    assert_eq!(
        beat("a").await,
        Replicas {
            live: 1,
            missing: 0
        }
    );
}

/// Without the side channel (limiters that advertise no address), as before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_alone_keeps_its_share_and_the_others_reserve_it_once_they_count_it_missing(
) {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start().await;
    let mut relay = Relay::start(redis.addr()).await;
    let all = counted(vec![
        replica(&redis.url()),
        replica(&redis.url()),
        replica(&relay.url()),
    ])
    .await;
    let share = LIMIT / REPLICAS as u64;
    // Round robin, `per` calls each: how many were admitted, and the slowest answer.
    let spend = async |user: &str, per: u64| {
        let (mut admitted, mut slowest) = (0, Duration::ZERO);
        for _ in 0..per {
            for r in &all {
                let (ok, _, took) = call(r, user, 1).await;
                admitted += u64::from(ok);
                slowest = slowest.max(took);
            }
        }
        (admitted, slowest)
    };

    relay.cut();
    // Until the others count it missing, the cut-off replica's third comes on top
    // of the limit they decide in Redis.
    let (early, _) = spend("early", LIMIT).await;
    eprintln!("before the others noticed: {early} of {LIMIT}");
    assert_eq!(early, LIMIT + share);

    let cut = Instant::now();
    let deadline = cut + Duration::from_secs(10);
    while all[..2].iter().any(|r| r.local().missing() != 1) {
        assert!(
            Instant::now() < deadline,
            "the cut-off replica never counted missing"
        );
        for r in &all[..2] {
            r.heartbeat().await.expect("the others reach the shard");
        }
        assert!(all[2].heartbeat().await.is_err(), "cut off");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("counted missing {:?} after the cut", cut.elapsed());
    assert_eq!(all[0].local().replicas(), 3, "missing, still sharing");

    let (admitted, slowest) = spend("during", LIMIT).await;
    eprintln!("once noticed: {admitted} of {LIMIT}; slowest answer {slowest:?}");
    assert!(
        (LIMIT * 8 / 10..=LIMIT * 12 / 10).contains(&admitted),
        "admitted {admitted} of {LIMIT} in all"
    );
    assert!(slowest <= BOUND, "slowest answer {slowest:?}");

    relay.restore().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut beating = true;
        for r in &all {
            beating &= r.heartbeat().await.is_ok();
        }
        if beating && all.iter().all(|r| r.local().missing() == 0) {
            break;
        }
        assert!(Instant::now() < deadline, "the reservation never lifted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    settle_until(&all, "the local spending never settled", |all| {
        all.iter().all(|r| !r.local().has_unsettled())
    })
    .await;
    // The others' reserved limit and the cut-off replica's third: all of it.
    assert_eq!(remaining(&all[0], "during").await, 0);
    let (after, _) = spend("after", LIMIT).await;
    assert_eq!(after, LIMIT, "exact again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stops_cleanly_leaves_the_count_and_one_that_dies_is_counted_missing() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start().await;
    let url = redis.url();
    let args = ["--redis", &url, "--drain-delay", "0s"];
    let watcher = common::Server::start(POLICY, &args);
    let mut stopping = common::Server::start(POLICY, &args);
    let mut dying = common::Server::start(POLICY, &args);
    wait_until("the replicas never counted three", || {
        watcher.metric("sluice_local_share", &[]) == Some(3.0)
    })
    .await;
    assert_eq!(
        watcher.metric("sluice_local_missing_replicas", &[]),
        Some(0.0)
    );

    // A clean stop (SIGTERM) takes the replica out at once: the share grows
    // back well within the 30 s a missing replica is held.
    stopping.terminate();
    assert!(stopping.wait_exit(Duration::from_secs(10)).await.success());
    wait_until("the stopped replica never left the count", || {
        watcher.metric("sluice_local_share", &[]) == Some(2.0)
    })
    .await;
    assert_eq!(
        watcher.metric("sluice_local_missing_replicas", &[]),
        Some(0.0)
    );

    // One that dies stays in the count, missing: its share is reserved.
    dying.child.kill().expect("kill -9");
    let _ = dying.child.wait();
    wait_until("the dead replica never counted missing", || {
        watcher.metric("sluice_local_missing_replicas", &[]) == Some(1.0)
    })
    .await;
    assert_eq!(watcher.metric("sluice_local_share", &[]), Some(2.0));
    let (status, body) = common::http(&watcher.http, "GET", "/debug/store", "");
    assert_eq!(status, 200);
    let store: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(store["local"]["missing_replicas"], 1, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_one_shard_is_counted_missing_by_the_others_and_live_by_itself() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let (a, b) = (RedisServer::start().await, RedisServer::start().await);
    let mut relay = Relay::start(a.addr()).await;
    let both = |first: String| {
        let mut opts = Options::new(vec![first, b.url()], false);
        opts.call_timeout = STORE_TIMEOUT;
        RedisStore::new(opts, None).expect("store")
    };
    let (others, partial) = (both(a.url()), both(relay.url()));
    // A live span well over a loaded machine's pause between two beats.
    let beats = Beats {
        live: Duration::from_secs(1),
        hold: Duration::from_secs(5),
    };
    let three = Replicas {
        live: 3,
        missing: 0,
    };
    let beat = async |store: &RedisStore, id: &str| {
        store
            .heartbeat(id, beats)
            .await
            .map(|h| h.map(|h| h.replicas))
    };
    beat(&others, "o1").await.expect("beats");
    beat(&partial, "p").await.expect("beats");
    assert_eq!(beat(&others, "o2").await.expect("beats"), Some(three));

    relay.cut();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        beat(&others, "o1")
            .await
            .expect("the others reach both shards");
        let own = beat(&partial, "p").await.expect("one shard still answers");
        assert_eq!(own, Some(three), "live where it beats");
        let seen = beat(&others, "o2").await.expect("beats");
        if seen
            == Some(Replicas {
                live: 2,
                missing: 1,
            })
        {
            break;
        }
        assert_eq!(seen, Some(three));
        assert!(Instant::now() < deadline, "never counted missing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fixed window of 60 a day: a window algorithm counts what the others admitted
/// before a reservation against the reserved limit in full (a bucket forgives part
/// of it), so the total is exactly bounded by the limit.
const WINDOW_POLICY: &str = "domain: d
failure_mode: local
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 60, algorithm: fixed_window}
";

/// The `local` object of a server's `/debug/store`.
fn debug_local(server: &common::Server) -> serde_json::Value {
    let (status, body) = common::http(&server.http, "GET", "/debug/store", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    v["local"].clone()
}

/// Three servers whose heartbeats list the two others with their addresses.
async fn peering(urls: [&str; 3], policy: &str) -> Vec<common::Server> {
    let timeout = format!("{}ms", PEER_STORE_TIMEOUT.as_millis());
    peering_with(urls, policy, &timeout).await
}

/// [`peering`] with `store_timeout`.
async fn peering_with(urls: [&str; 3], policy: &str, store_timeout: &str) -> Vec<common::Server> {
    let all: Vec<common::Server> = urls
        .iter()
        .map(|&url| {
            let args = ["--redis", url, "--store-timeout", store_timeout];
            common::Server::start(policy, &args)
        })
        .collect();
    wait_until("the servers never listed each other as peers", || {
        all.iter().all(|s| {
            let peers = debug_local(s)["peers"].clone();
            peers.as_array().is_some_and(|p| {
                p.len() == REPLICAS - 1 && p.iter().all(|p| p["address"].is_string())
            })
        })
    })
    .await;
    all
}

type Client =
    sluice::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
        tonic::transport::Channel,
    >;

/// `per` calls of `user` to each server in turn: admitted, and the slowest answer.
async fn spend_over(clients: &mut [Client], user: &str, per: u64) -> (u64, Duration) {
    let (mut admitted, mut slowest) = (0, Duration::ZERO);
    for _ in 0..per {
        for c in clients.iter_mut() {
            let req = common::request("d", vec![common::desc(&[("user", user)])]);
            let started = Instant::now();
            let reply = common::call(c, req).await;
            slowest = slowest.max(started.elapsed());
            admitted += u64::from(reply.overall_code == common::OK);
        }
    }
    (admitted, slowest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_alone_asks_its_peers_and_the_key_stays_within_its_limit_from_the_first_call(
) {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start().await;
    let mut relay = Relay::start(redis.addr()).await;
    let all = peering([&redis.url(), &redis.url(), &relay.url()], WINDOW_POLICY).await;
    let mut clients = Vec::new();
    for s in &all {
        clients.push(s.client().await);
    }
    // Every replica has had a store answer about the key's counter before.
    let (warm, _) = spend_over(&mut clients, "cut", 1).await;
    assert_eq!(warm, 3);

    relay.cut();
    let (admitted, slowest) = spend_over(&mut clients, "cut", LIMIT).await;
    let total = warm + admitted;
    let cut = debug_local(&all[2]);
    eprintln!("cut off alone: {total} of {LIMIT}; slowest answer {slowest:?}; {cut}");
    assert!(
        (LIMIT * 8 / 10..=LIMIT).contains(&total),
        "admitted {total} of {LIMIT} in all"
    );
    assert!(slowest <= PEER_BOUND, "slowest answer {slowest:?}");
    assert_eq!(cut["cut_off"][0]["standing"], "cut_off_alone", "{cut}");
    assert_eq!(cut["cut_off"][0]["reached_by"], 2, "{cut}");
    let answered = cut["cut_off"][0]["answered_in_seconds"]
        .as_f64()
        .expect("answered");
    eprintln!(
        "the peers answered {:.1} ms after the first failure",
        answered * 1e3
    );
    for peer in &all[..2] {
        let local = debug_local(peer);
        assert_eq!(local["held"][0]["replica"], cut["replica"], "{local}");
        assert_eq!(local["held"].as_array().map(Vec::len), Some(1), "{local}");
        assert_eq!(local["missing_replicas"], 1, "{local}");
    }
    assert!(all[2]
        .metric(
            "sluice_local_share_peer_queries_total",
            &[("answer", "reached")]
        )
        .is_some_and(|n| n >= 2.0));

    // Questions that are not a live peer's change nothing; bad ones are refused.
    let post = |body: &str| common::http(&all[0].http, "POST", "/local-share/cut", body);
    let (status, body) = post(r#"{"replica": "stranger", "shard": 0}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, r#"{"reached":true,"reserved":false}"#);
    for bad in [
        "",
        "{",
        r#"{"replica": "a b", "shard": 0}"#,
        r#"{"replica": "x", "shard": 7}"#,
        r#"{"replica": "x", "shard": -1}"#,
        r#"{"replica": "x", "shard": 0, "more": 1}"#,
    ] {
        let (status, body) = post(bad);
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("error"), "{body}");
    }
    assert_eq!(debug_local(&all[0])["missing_replicas"], 1);

    // Back: the questions stop, the holds lift, the counts are exact again.
    relay.restore().await;
    wait_until("the cut-off replica never found the shard again", || {
        debug_local(&all[2])["cut_off"]
            .as_array()
            .is_some_and(Vec::is_empty)
            && all.iter().all(|s| {
                let l = debug_local(s);
                l["held"].as_array().is_some_and(Vec::is_empty) && l["missing_replicas"] == 0
            })
    })
    .await;
    wait_until("the local spending never settled", || {
        all[2].metric("sluice_local_unsettled_counters", &[]) == Some(0.0)
    })
    .await;
    let (after, _) = spend_over(&mut clients, "after", LIMIT).await;
    assert_eq!(after, LIMIT, "exact again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_does_not_hold_back_the_questions_to_the_others() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start().await;
    let mut relay = Relay::start(redis.addr()).await;
    // A store timeout past a hold's span: a round that waits out a silent peer
    // outlasts the holds of those that answered.
    let (shard, cut) = (redis.url(), relay.url());
    let urls = [shard.as_str(), shard.as_str(), cut.as_str()];
    let all = peering_with(urls, WINDOW_POLICY, "2500ms").await;
    let mut cut_off = [all[2].client().await];
    assert_eq!(spend_over(&mut cut_off, "silent", 1).await.0, 1);
    // all[1] stops answering anything, as a stopped process does.
    let silent = all[1].child.id() as libc::pid_t;
    assert_eq!(unsafe { libc::kill(silent, libc::SIGSTOP) }, 0);
    relay.cut();
    let cut_at = Instant::now();
    spend_over(&mut cut_off, "silent", 1).await;
    // all[0] is asked every half second all the same (four rounds within two
    // seconds), so its hold never lapses; one round per wait for the silent peer
    // would take ten.
    let reached = || {
        all[2]
            .metric(
                "sluice_local_share_peer_queries_total",
                &[("answer", "reached")],
            )
            .unwrap_or(0.0)
    };
    while reached() < 4.0 {
        let waited = cut_at.elapsed();
        assert!(
            waited < Duration::from_secs(5),
            "{} answers from the peer that reaches the shard in {waited:?}",
            reached()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        debug_local(&all[0])["held"][0]["replica"],
        debug_local(&all[2])["replica"]
    );
    assert_eq!(unsafe { libc::kill(silent, libc::SIGCONT) }, 0);
    relay.restore().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_shard_hangs_for_every_replica_the_peers_say_so_and_each_keeps_its_share() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start().await;
    let url = redis.url();
    let all = peering([&url, &url, &url], WINDOW_POLICY).await;
    let mut clients = Vec::new();
    for s in &all {
        clients.push(s.client().await);
    }
    let (warm, _) = spend_over(&mut clients, "down", 1).await;
    assert_eq!(warm, 3);

    redis.freeze();
    // More calls than the limit: those made while the peers probe the hung shard
    // are denied, and each replica spends its share after.
    let (admitted, slowest) = spend_over(&mut clients, "down", 2 * LIMIT).await;
    let standings: Vec<serde_json::Value> = all
        .iter()
        .map(|s| debug_local(s)["cut_off"][0]["standing"].clone())
        .collect();
    // Read during the outage: once the shard is back, a replica may count the
    // others missing for a moment (when the outage outlasted the heartbeats' live
    // span, until they beat again), which is no reservation made while it was away.
    for s in &all {
        assert_eq!(debug_local(s)["missing_replicas"], 0, "nobody reserved");
    }
    redis.thaw();
    let total = warm + admitted;
    eprintln!("down for all: {total} of {LIMIT}; slowest answer {slowest:?}; {standings:?}");
    assert!(
        (LIMIT * 8 / 10..=LIMIT * 12 / 10).contains(&total),
        "admitted {total} of {LIMIT} in all"
    );
    assert!(slowest <= PEER_BOUND, "slowest answer {slowest:?}");
    assert!(
        standings.iter().all(|s| s == "down_for_all"),
        "{standings:?}"
    );
}

/// A replica told to stop while the shard is away cannot hand over what it decided
/// locally: it says so as it exits, with the amount, rather than losing it quietly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_during_an_outage_says_what_spending_it_loses() {
    if !available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut redis = RedisServer::start().await;
    let url = redis.url();
    let args = [
        "--redis",
        &url,
        "--store-timeout",
        "30ms",
        "--drain-delay",
        "0s",
    ];
    let mut sluice = common::Server::start(POLICY, &args);
    let mut client = sluice.client().await;
    let req = || common::request("d", vec![common::desc(&[("user", "u3")])]);
    assert_eq!(
        common::call(&mut client, req()).await.overall_code,
        common::OK
    );
    redis.kill();
    for _ in 0..3 {
        assert_eq!(
            common::call(&mut client, req()).await.overall_code,
            common::OK
        );
    }
    assert_eq!(
        sluice.metric("sluice_local_unsettled_counters", &[]),
        Some(1.0)
    );
    sluice.terminate();
    let lines = sluice
        .wait_line(Duration::from_secs(10), "the loss logged", |l| {
            l.contains("lost with this exit")
        })
        .await;
    let line = lines.last().expect("a line");
    assert!(
        line.contains("hits=3") && line.contains("counters=1"),
        "{line}"
    );
    assert!(sluice.wait_exit(Duration::from_secs(10)).await.success());
}
