//! Redis Sentinel with the real binary: a master, a replica and three
//! `redis-sentinel`s on loopback. Sluice finds the master through the sentinels;
//! `SENTINEL FAILOVER` under load moves it to the replica. Every call is answered
//! (no gRPC error, none hung), a denial during the switch comes only from the
//! domain's failure mode, then the new master decides, in the same process, and
//! counts are exact on it.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis::{available, script_calls, RedisServer};
use common::sentinel::{self, Sentinels};
use serde_json::Value;

/// Long enough that a loaded 2-core machine's stalls do not show as failure-mode
/// answers after the switch; what the switch itself does (connections refused or
/// closed, READONLY) fails at once whatever the timeout.
const STORE_TIMEOUT: Duration = Duration::from_millis(200);
/// Longest answer allowed: the store timeout and room for a loaded 2-core machine.
const BOUND: Duration = Duration::from_millis(500);
const MASTER: &str = "counters";
/// The limit of the `fresh` key, counted exactly on the new master.
const FRESH_LIMIT: usize = 20;

/// A huge limit: every denial of `user` is the failure mode's.
const POLICY: &str = r#"
domain: closed
failure_mode: closed
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000000, algorithm: fixed_window}
  - key: fresh
    rate_limit: {unit: day, requests_per_unit: 20, algorithm: token_bucket}
"#;

/// One answered call of the load: when, its code or gRPC error, how long.
struct Answer {
    at: Instant,
    code: Result<i32, String>,
    took: Duration,
}

fn shard(sluice: &common::Server) -> Value {
    sluice.store_shard(MASTER)
}

fn master_node(sluice: &common::Server) -> Option<String> {
    shard(sluice)["nodes"][0].as_str().map(str::to_string)
}

/// A sluice on the sentinels at `urls` (master [`MASTER`], the harness's store
/// timeout), once it has found the master at `addr`.
async fn on_sentinels(urls: &str, addr: &str) -> common::Server {
    let timeout = format!("{}ms", STORE_TIMEOUT.as_millis());
    let sluice = common::Server::start(
        POLICY,
        &[
            "--store-timeout",
            &timeout,
            "--redis-sentinel",
            urls,
            "--redis-sentinel-master",
            MASTER,
        ],
    );
    common::eventually(Duration::from_secs(10), "the master found", || async {
        master_node(&sluice).as_deref() == Some(addr)
    })
    .await;
    sluice
}

async fn role(redis: &RedisServer) -> String {
    let mut conn = redis.conn().await;
    let v: redis::Value = redis::cmd("ROLE")
        .query_async(&mut conn)
        .await
        .expect("ROLE");
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

/// How the master is lost.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Loss {
    /// `SENTINEL FAILOVER`: the old master lives on and is turned into a replica.
    Failover,
    /// The master is killed; the sentinels fail over once they agree it is down.
    Kill,
    /// The master hangs (`SIGSTOP`): calls time out until the sentinels fail over,
    /// then it comes back still a master until they turn it into a replica.
    Stop,
}

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_answers_by_the_failure_mode_then_from_the_new_master() {
    master_lost_under_load(Loss::Failover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_is_answered_by_the_failure_mode_until_the_new_one_decides() {
    master_lost_under_load(Loss::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_is_answered_by_the_failure_mode_until_the_new_one_decides() {
    master_lost_under_load(Loss::Stop).await;
}

async fn master_lost_under_load(loss: Loss) {
    if !available() || !sentinel::available() {
        return;
    }
    // Each bounds answer times: two at once on two cores would measure the machine.
    let _one = ONE_AT_A_TIME.lock().await;
    let mut master = RedisServer::start().await;
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).await;
    let sentinels = Sentinels::start(3, MASTER, master.port).await;
    sentinels.wait_settled(1).await;

    let mut sluice = on_sentinels(&sentinels.urls().join(","), &master.addr()).await;

    // Load: unique users, so no answer but the failure mode's can deny.
    let stop = Arc::new(AtomicBool::new(false));
    let next_user = Arc::new(AtomicU64::new(0));
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let mut load = Vec::new();
    for _ in 0..8 {
        let mut client = sluice.client().await;
        let (stop, next_user, answers) = (stop.clone(), next_user.clone(), answers.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let user = format!("u{}", next_user.fetch_add(1, Ordering::Relaxed));
                let req = common::request("closed", vec![common::desc(&[("user", &user)])]);
                let started = Instant::now();
                let code = client
                    .should_rate_limit(req)
                    .await
                    .map(|r| r.into_inner().overall_code)
                    .map_err(|s| s.to_string());
                let took = started.elapsed();
                answers.lock().unwrap().push(Answer {
                    at: Instant::now(),
                    code,
                    took,
                });
            }
        }));
    }
    common::eventually(Duration::from_secs(10), "load under way", || async {
        answers.lock().unwrap().len() >= 200
    })
    .await;
    let before: Vec<i32> = answers
        .lock()
        .unwrap()
        .iter()
        .map(|a| a.code.clone().unwrap_or(0))
        .collect();
    assert!(
        before.iter().all(|&c| c == common::OK),
        "denials before the failover: {before:?}"
    );

    let mut new_master = replica.conn().await;
    let calls_before = script_calls(&mut new_master).await;
    let mut old_master = master.conn().await;
    match loss {
        Loss::Failover => sentinels.failover().await,
        Loss::Kill => master.kill(),
        Loss::Stop => master.freeze(),
    }
    common::eventually(
        Duration::from_secs(30),
        "sluice on the new master",
        || async { master_node(&sluice).as_deref() == Some(replica.addr().as_str()) },
    )
    .await;
    let switched = Instant::now();
    let settled = switched + Duration::from_millis(500);
    // Calls leave the old master (alive after a failover, and still taking writes
    // until the sentinels turn it into a replica) once sluice has moved.
    let old_calls = match loss {
        Loss::Failover => Some(script_calls(&mut old_master).await),
        Loss::Kill => None,
        Loss::Stop => {
            // Back, it answers what was sent before the switch, then nothing more.
            master.thaw();
            // A connection made after it has read what its clients sent while
            // hung (sluice's calls from before the switch), so its count is read
            // after theirs.
            Some(script_calls(&mut master.conn().await).await)
        }
    };
    common::eventually(
        Duration::from_secs(20),
        "load on the new master",
        || async {
            let answers = answers.lock().unwrap();
            answers.iter().filter(|a| a.at > settled).count() >= 300
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("load task");
    }

    if let Some(old_calls) = old_calls {
        let mut old_master = master.conn().await;
        let now = script_calls(&mut old_master).await;
        assert!(
            now <= old_calls + 2,
            "the old master still decides: {old_calls} -> {now} calls"
        );
    }
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let errors: Vec<&String> = answers
        .iter()
        .filter_map(|a| a.code.as_ref().err())
        .collect();
    assert!(errors.is_empty(), "gRPC errors: {errors:?}");
    let slowest = answers.iter().map(|a| a.took).max().unwrap_or_default();
    assert!(slowest <= BOUND, "a call took {slowest:?}");
    let denied = answers
        .iter()
        .filter(|a| a.code == Ok(common::OVER_LIMIT))
        .count() as f64;
    let failed_closed = sluice
        .metric(
            "sluice_requests_total",
            &[
                ("domain", "closed"),
                ("layer", "service"),
                ("rule", "user"),
                ("outcome", "failed_closed"),
            ],
        )
        .unwrap_or(0.0);
    let mut took: Vec<Duration> = answers.iter().map(|a| a.took).collect();
    took.sort();
    eprintln!(
        "{} calls, {denied} answered by the failure mode, p99 {:?}, slowest {slowest:?}, over 60 ms: {}",
        answers.len(),
        took[took.len() * 99 / 100],
        took.iter().filter(|t| **t > Duration::from_millis(60)).count()
    );
    assert_eq!(
        denied,
        failed_closed,
        "every denial is the failure mode's ({} calls)",
        answers.len()
    );
    if loss != Loss::Failover {
        // The sentinels take a second to agree the master is down: meanwhile the
        // failure mode answers.
        assert!(
            denied > 0.0,
            "no failure-mode answer with the master dead or hung"
        );
        // The log says the shard went down, and came back once on the new master.
        let lines: Vec<String> = sluice.lines.try_iter().collect();
        let at = |text| lines.iter().position(|l: &String| l.contains(text));
        let (down, up) = (at("redis shard down"), at("redis shard up"));
        assert!(down.is_some() && up > down, "down, then up: {lines:#?}");
    }
    // Once sluice names the new master, it decides: the calls answered a moment
    // after are all admitted.
    let after: Vec<i32> = answers
        .iter()
        .filter(|a| a.at > settled)
        .map(|a| a.code.clone().unwrap_or(0))
        .collect();
    assert!(after.len() >= 100, "{} calls after the switch", after.len());
    assert!(
        after.iter().all(|&c| c == common::OK),
        "denied after the switch: {after:?}"
    );
    assert_eq!(role(&replica).await, "master");
    // Sentinel closes the clients of a server it promotes: a new connection.
    let mut new_master = replica.conn().await;
    let calls_after = script_calls(&mut new_master).await;
    assert!(
        calls_after >= calls_before + after.len() as u64 / 64,
        "the new master decided: {calls_before} -> {calls_after} calls"
    );

    // Exact counts on the new master: a fresh key admits its limit and no more,
    // with calls racing each other.
    let ok = Arc::new(AtomicU64::new(0));
    let mut racers = Vec::new();
    for _ in 0..3 {
        let mut client = sluice.client().await;
        let ok = ok.clone();
        racers.push(tokio::spawn(async move {
            for _ in 0..FRESH_LIMIT {
                let req = common::request("closed", vec![common::desc(&[("fresh", "k")])]);
                if common::call(&mut client, req).await.overall_code == common::OK {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for r in racers {
        r.await.expect("racer");
    }
    assert_eq!(ok.load(Ordering::Relaxed), FRESH_LIMIT as u64);
    let keys = common::redis::keys(&mut new_master).await;
    assert!(
        keys.iter()
            .any(|k| k.contains("fresh") && k.ends_with(":tb")),
        "the fresh key lives on the new master: {keys:?}"
    );
    assert!(
        sluice.child.try_wait().expect("try_wait").is_none(),
        "no restart"
    );
    drop(master);
}

/// A sentinel cut off from its peers (here by an ACL that keeps it from their
/// announcements on the servers) goes on naming the old master after a failover.
/// Listed first, it is the one sluice asks first; sluice still follows the others
/// to the new master as soon as one announces it, before the old one is demoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_sentinel_asked_first_does_not_keep_calls_on_the_old_master() {
    stale_sentinel_first(true).await;
}

/// As above, with sluice's subscriptions refused (an ACL on the sentinels with no
/// channel): once the old master is demoted, its `READONLY` sends sluice past the
/// stale sentinel to the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_sentinel_asked_first_is_passed_once_the_old_master_is_demoted() {
    stale_sentinel_first(false).await;
}

async fn stale_sentinel_first(announcements: bool) {
    if !available() || !sentinel::available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let master = RedisServer::start().await;
    let port = master.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).await;
    // No channel for this user: its sentinel hears no other sentinel's hello. Nor
    // may it turn the new master back into a replica of the old, as a sentinel cut
    // off by the network could not either.
    let user = [
        "SETUSER",
        "cutoff",
        "on",
        ">pw",
        "+@all",
        "-replicaof",
        "-slaveof",
    ];
    for server in [&master, &replica] {
        let _: () = redis::cmd("ACL")
            .arg(&user)
            .arg(&["~*", "resetchannels"])
            .query_async(&mut server.conn().await)
            .await
            .expect("ACL SETUSER");
    }
    let sentinels = Sentinels::start(3, MASTER, master.port).await;
    let cutoff = format!("sentinel auth-user {MASTER} cutoff\nsentinel auth-pass {MASTER} pw");
    let stale = Sentinels::start_with(1, MASTER, master.port, &cutoff).await;
    sentinels.wait_settled(1).await;
    stale.wait_settled(1).await;
    // Alone, it must never fail over by itself (that would bring it up to date).
    stale
        .command(0, &["set", MASTER, "quorum", "2"])
        .await
        .expect("SENTINEL SET quorum");

    let mut urls = sentinels.urls();
    if !announcements {
        for url in &urls {
            let user = ["setuser", "deaf", "on", ">pw", "+@all", "resetchannels"];
            let mut conn = redis::Client::open(url.as_str())
                .expect("sentinel URL")
                .get_multiplexed_async_connection()
                .await
                .expect("sentinel connection");
            let _: () = redis::cmd("ACL")
                .arg(&user)
                .query_async(&mut conn)
                .await
                .expect("ACL SETUSER on a sentinel");
        }
        urls = sentinels
            .ports
            .iter()
            .map(|p| format!("redis://deaf:pw@127.0.0.1:{p}"))
            .collect();
    }
    let sluice = on_sentinels(&[stale.urls(), urls].concat().join(","), &master.addr()).await;

    sentinels.failover().await;
    common::eventually(
        Duration::from_secs(30),
        "the sentinels name the replica",
        || async { sentinels.master_addr(0).await == Some(replica.addr()) },
    )
    .await;
    let named = Instant::now();
    common::eventually(
        Duration::from_secs(30),
        "sluice on the new master",
        || async { master_node(&sluice).as_deref() == Some(replica.addr().as_str()) },
    )
    .await;
    let took = named.elapsed();
    assert_eq!(
        stale.master_addr(0).await,
        Some(master.addr()),
        "the cut-off sentinel still names the old master"
    );
    if announcements {
        // Sooner than the sentinels demote the old master (up to 10 s): no count
        // lost.
        assert!(
            took < Duration::from_secs(5),
            "moved {took:?} after the switch"
        );
    }
    let mut client = sluice.client().await;
    for i in 0..20 {
        let user = format!("after-{i}");
        let req = common::request("closed", vec![common::desc(&[("user", &user)])]);
        assert_eq!(
            common::call(&mut client, req).await.overall_code,
            common::OK
        );
    }
    let keys = common::redis::keys(&mut replica.conn().await).await;
    assert!(
        keys.iter().any(|k| k.contains("after-19")),
        "decided on the new master: {keys:?}"
    );
    assert_eq!(shard(&sluice)["state"], "up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_with_a_password_is_reached_with_the_password_of_its_url() {
    if !available() || !sentinel::available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let master = RedisServer::start_with(&["--requirepass", "s3cret"]).await;
    let auth = format!("sentinel auth-pass {MASTER} s3cret");
    let sentinels = Sentinels::start_with(1, MASTER, master.port, &auth).await;
    sentinels.wait_settled(0).await;
    let urls = sentinels.urls().join(",");
    let start = |spec: &str| {
        common::Server::start(
            POLICY,
            &["--redis-sentinel", &urls, "--redis-sentinel-master", spec],
        )
    };
    let good = start(&format!("redis://:s3cret@{MASTER}"));
    let client = good.client().await;
    common::eventually(Duration::from_secs(10), "decided on the master", || {
        let mut client = client.clone();
        async move {
            let req = common::request("closed", vec![common::desc(&[("user", "a")])]);
            common::call(&mut client, req).await.overall_code == common::OK
        }
    })
    .await;
    let keys = common::redis::keys(
        &mut master
            .conn_as(&format!("redis://:s3cret@{}", master.addr()))
            .await,
    )
    .await;
    assert!(keys.iter().any(|k| k.contains("user=a")), "{keys:?}");

    // The wrong password: the master is found, refuses, and the failure mode answers.
    let bad = start(&format!("redis://:wrong@{MASTER}"));
    let client = bad.client().await;
    common::eventually(Duration::from_secs(10), "the refusal counted", || {
        let mut client = client.clone();
        let bad = &bad;
        async move {
            let req = common::request("closed", vec![common::desc(&[("user", "b")])]);
            let code = common::call(&mut client, req).await.overall_code;
            code == common::OVER_LIMIT
                && bad
                    .metric(
                        "sluice_store_errors_total",
                        &[("store", "redis"), ("shard", MASTER), ("kind", "noauth")],
                    )
                    .is_some_and(|n| n > 0.0)
        }
    })
    .await;
    let last = &shard(&bad)["last_error"];
    assert_eq!(last["kind"], "noauth", "{last}");
    let message = last["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("no master known for {MASTER}: {}", master.addr()))
            && message.contains("WRONGPASS"),
        "{message}"
    );
    drop(client);
}

/// With every sentinel gone silent, calls go on to the master last found, and the
/// log says once that a failover would not be seen meanwhile, then once that a
/// sentinel answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sentinels_are_logged_once_and_calls_go_on_to_the_master() {
    if !available() || !sentinel::available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let master = RedisServer::start().await;
    let sentinels = Sentinels::start(2, MASTER, master.port).await;
    sentinels.wait_settled(0).await;
    let urls = sentinels.urls().join(",");
    let sluice = common::Server::start(
        POLICY,
        &["--redis-sentinel", &urls, "--redis-sentinel-master", MASTER],
    );
    let mut client = sluice.client().await;
    /// What the key has left when the master decided the call, else `None`.
    async fn remaining(
        client: &mut sluice::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
            tonic::transport::Channel,
        >,
    ) -> Option<u32> {
        let req = common::request("closed", vec![common::desc(&[("user", "quiet")])]);
        let r = common::call(client, req).await;
        (r.overall_code == common::OK).then(|| r.statuses[0].limit_remaining)
    }
    common::eventually(Duration::from_secs(10), "decided on the master", || {
        let mut client = client.clone();
        async move { remaining(&mut client).await.is_some() }
    })
    .await;

    sentinels.signal_all(libc::SIGSTOP);
    let mut lines = sluice
        .wait_line(Duration::from_secs(15), "no sentinel answers", |l| {
            l.contains("no sentinel answers")
        })
        .await;
    assert!(
        lines.last().unwrap().contains(&master.addr()),
        "names the master calls go on to: {lines:#?}"
    );
    // Over several of sluice's rounds of asking, the master decides every call (a
    // `closed` domain would deny one the store failed).
    let mut last = remaining(&mut client).await.expect("decided by the master");
    let quiet = Instant::now() + 3 * sluice_redis::sentinel::POLL;
    while Instant::now() < quiet {
        let now = remaining(&mut client).await.expect("decided by the master");
        assert!(now < last, "counted on the master");
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sentinels.signal_all(libc::SIGCONT);
    lines.extend(
        sluice
            .wait_line(Duration::from_secs(15), "a sentinel answers again", |l| {
                l.contains("a sentinel answers again")
            })
            .await,
    );
    let count = |text: &str| lines.iter().filter(|l| l.contains(text)).count();
    assert_eq!(count("no sentinel answers"), 1, "{lines:#?}");
}

#[tokio::test]
async fn several_masters_are_shards_of_their_own() {
    if !available() || !sentinel::available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let a = RedisServer::start().await;
    let b = RedisServer::start().await;
    // One sentinel watching both: `counters` at a, `other` at b.
    let also = format!("sentinel monitor other 127.0.0.1 {} 1", b.port);
    let sentinels = Sentinels::start_with(1, MASTER, a.port, &also).await;
    sentinels.wait_settled(0).await;
    let urls = sentinels.urls().join(",");
    let masters = format!("{MASTER},other");
    // Placement is under test, not the timeout: the harness's store timeout keeps a
    // slow call on a loaded machine from being denied by `closed`.
    let sluice = common::Server::start(
        POLICY,
        &[
            "--redis-sentinel",
            &urls,
            "--redis-sentinel-master",
            &masters,
        ],
    );
    let mut client = sluice.client().await;
    common::eventually(Duration::from_secs(10), "both masters found", || async {
        let (_, body) = common::http(&sluice.http, "GET", "/debug/store", "");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        let node = |name: &str| {
            v["shards"]
                .as_array()
                .and_then(|s| s.iter().find(|s| s["name"] == name))
                .and_then(|s| s["nodes"][0].as_str().map(str::to_string))
        };
        node(MASTER) == Some(a.addr()) && node("other") == Some(b.addr())
    })
    .await;
    for i in 0..40 {
        let user = format!("spread-{i}");
        let req = common::request("closed", vec![common::desc(&[("user", &user)])]);
        let code = common::call(&mut client, req).await.overall_code;
        let store = || common::http(&sluice.http, "GET", "/debug/store", "").1;
        assert_eq!(code, common::OK, "{user}: {}", store());
    }
    let on_a = common::redis::keys(&mut a.conn().await).await.len();
    let on_b = common::redis::keys(&mut b.conn().await).await.len();
    assert_eq!(on_a + on_b, 40, "each counter on one master");
    assert!(on_a > 5 && on_b > 5, "spread over both: {on_a} and {on_b}");
}

#[tokio::test]
async fn a_tls_master_is_reached_over_tls_at_the_address_the_sentinel_gives() {
    if !available() || !sentinel::available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let master = RedisServer::start_tls().await;
    let d = master.dir.path();
    // The sentinel watches the master over TLS too.
    let tls = format!(
        "tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-replication yes",
        d.join("server.crt").display(),
        d.join("server.key").display(),
        d.join("ca.crt").display(),
    );
    let sentinels = Sentinels::start_with(1, MASTER, master.port, &tls).await;
    sentinels.wait_settled(0).await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("policy.yaml"), POLICY).expect("policy");
    let configs = [dir.path().join("policy.yaml")];
    let ca = d.join("ca.crt");
    let urls = sentinels.urls().join(",");
    let spec = format!("rediss://{MASTER}");
    // The count below is exact only if no call is answered by the closed failure
    // mode: 15 ms is too short a wait on a loaded 2-core machine.
    let timeout = format!("{}ms", STORE_TIMEOUT.as_millis());
    let sluice = common::Server::start_env(
        dir,
        &configs,
        &[
            "--store-timeout",
            &timeout,
            "--redis-sentinel",
            &urls,
            "--redis-sentinel-master",
            &spec,
        ],
        &[("SSL_CERT_FILE", ca.to_str().expect("utf-8 path"))],
    );
    let client = sluice.client().await;
    // Closed failure mode and a limit of 20: OVER_LIMIT after 20 admissions means the
    // master decided, over TLS.
    common::eventually(Duration::from_secs(10), "decided over TLS", || {
        let mut client = client.clone();
        async move {
            let req = common::request("closed", vec![common::desc(&[("fresh", "tls")])]);
            common::call(&mut client, req).await.overall_code == common::OK
        }
    })
    .await;
    let mut client = client.clone();
    let mut ok = 1;
    for _ in 0..FRESH_LIMIT {
        let req = common::request("closed", vec![common::desc(&[("fresh", "tls")])]);
        if common::call(&mut client, req).await.overall_code == common::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, FRESH_LIMIT);
    let denied = sluice.metric(
        "sluice_requests_total",
        &[
            ("domain", "closed"),
            ("layer", "service"),
            ("rule", "fresh"),
            ("outcome", "over_limit"),
        ],
    );
    assert_eq!(denied, Some(1.0), "the master's own denial");
    assert_eq!(master_node(&sluice), Some(master.addr()));
    assert_eq!(shard(&sluice)["state"], "up");
}

#[test]
fn a_master_given_an_address_is_refused_with_a_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).expect("policy");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .arg("--config")
        .arg(&policy)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "off"])
        .args(["--redis-sentinel", "redis://127.0.0.1:1"])
        .args(["--redis-sentinel-master", "redis://counters:6379"])
        .output()
        .expect("run sluice");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("give no port"), "{stderr}");
    assert!(
        stderr.contains("sluice: --redis-sentinel-master / --redis-sentinel: invalid Redis URL"),
        "names the flags the URL came from: {stderr}"
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .arg("--config")
        .arg(&policy)
        .args(["--redis-sentinel", "redis://127.0.0.1:1"])
        .output()
        .expect("run sluice");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--redis-sentinel-master"), "{stderr}");
}

/// The closed domain's answer for a fresh user: OVER_LIMIT while no master decides.
async fn denied_by_the_failure_mode(sluice: &common::Server) {
    let client = sluice.client().await;
    common::eventually(Duration::from_secs(10), "the failure mode answered", || {
        let mut client = client.clone();
        async move {
            let req = common::request("closed", vec![common::desc(&[("user", "x")])]);
            common::call(&mut client, req).await.overall_code == common::OVER_LIMIT
        }
    })
    .await;
}

/// The log lines up to the first `found` one, from start-up on (the sentinels are
/// asked before sluice listens).
async fn logged(sluice: &common::Server, what: &str, found: impl Fn(&str) -> bool) -> Vec<String> {
    if let Some(at) = sluice.startup.iter().position(|l| found(l)) {
        return sluice.startup[..=at].to_vec();
    }
    let mut lines = sluice.startup.clone();
    lines.extend(sluice.wait_line(Duration::from_secs(10), what, found).await);
    lines
}

/// A master name no sentinel knows (a typo) is not an outage of the sentinels: sluice
/// starts, the failure mode answers, and the log says once, naming the names the
/// sentinels do watch, what to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_name_no_sentinel_knows_is_said_plainly() {
    if !available() || !sentinel::available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let master = RedisServer::start().await;
    let sentinels = Sentinels::start(2, MASTER, master.port).await;
    sentinels.wait_settled(0).await;
    let urls = sentinels.urls().join(",");
    let sluice = common::Server::start(
        POLICY,
        &[
            "--redis-sentinel",
            &urls,
            "--redis-sentinel-master",
            "countres",
        ],
    );
    denied_by_the_failure_mode(&sluice).await;
    let lines = logged(&sluice, "the unknown name", |l| {
        l.contains("no sentinel knows a master named countres")
    })
    .await;
    let said = lines.last().unwrap();
    assert!(said.contains("ERROR"), "{said}");
    assert!(
        said.contains("--redis-sentinel-master") && said.contains(MASTER),
        "says what to fix and what the sentinels watch: {said}"
    );
    // What calls fail with, in /debug/store (a call made before the sentinels were
    // first asked fails with "not asked yet").
    common::eventually(Duration::from_secs(10), "the shard's error", || async {
        let last = &sluice.store_shard("countres")["last_error"];
        let message = last["message"].as_str().unwrap_or_default();
        message.contains("no sentinel knows the name")
            && message.contains("--redis-sentinel-master")
    })
    .await;
    // Said once, though sluice keeps asking (a sentinel may be told of the name).
    let later = sluice.lines_until_reload().await;
    assert!(
        !later
            .iter()
            .any(|l| l.contains("no sentinel knows a master")),
        "{later:#?}"
    );
    assert!(
        !lines
            .iter()
            .chain(&later)
            .any(|l| l.contains("no sentinel answers")),
        "the sentinels answer: {lines:#?}"
    );
}

/// Sentinels that refuse sluice's password answered: the log says the password was
/// refused, not that no sentinel answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_password_refused_is_said_plainly() {
    if !available() || !sentinel::available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let master = RedisServer::start().await;
    let sentinels = Sentinels::start(2, MASTER, master.port).await;
    sentinels.wait_settled(0).await;
    for url in sentinels.urls() {
        let client = redis::Client::open(url.as_str()).expect("sentinel URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("sentinel");
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "default", "resetpass", ">s3cret"])
            .query_async(&mut conn)
            .await
            .expect("ACL SETUSER");
    }
    let urls: Vec<String> = sentinels
        .ports
        .iter()
        .map(|p| format!("redis://:wrong@127.0.0.1:{p}"))
        .collect();
    let sluice = common::Server::start(
        POLICY,
        &[
            "--redis-sentinel",
            &urls.join(","),
            "--redis-sentinel-master",
            MASTER,
        ],
    );
    denied_by_the_failure_mode(&sluice).await;
    let lines = logged(&sluice, "the refusal", |l| {
        l.contains("sluice_redis::sentinel")
    })
    .await;
    let said = lines.last().unwrap();
    assert!(
        said.contains("refuse") && said.contains("password") && said.contains("WRONGPASS"),
        "{said}"
    );
    assert!(
        !said.contains("no sentinel answers"),
        "the sentinels answered: {said}"
    );
    // A call made before the first round was answered fails as `connection`.
    common::eventually(Duration::from_secs(10), "the refusal counted", || async {
        sluice.store_shard(MASTER)["last_error"]["kind"] == "noauth"
    })
    .await;
}
