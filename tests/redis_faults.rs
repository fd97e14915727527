//! The real binary on a real redis-server put into each fault state: a replica
//! (READONLY), a replica without its master (MASTERDOWN), a busy script (BUSY), no
//! memory (OOM), a password (NOAUTH), loading (LOADING), a stalled server
//! (timeout), a key of the wrong type (a script error), a cluster without its
//! slots (CLUSTERDOWN) and a cluster master wanting a password (NOAUTH); a shard killed or stopped while no call reaches it,
//! which its probes find; and a cluster master stopped until its replica is
//! promoted, which then decides its slots.
//!
//! In each, every call is answered within the store timeout and a margin, by the
//! domain's failure mode (one domain fails open, one closed), the error is counted
//! with its kind, and outages back the shard off (`/debug/store`) while a script
//! error does not. Then the fault is lifted and the shard comes back.
//!
//! The tests run one at a time: each bounds answer times, and several binaries and
//! servers competing for two cores would measure the machine instead.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::redis::{available, free_port, RedisServer};
use serde_json::Value;
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

const STORE_TIMEOUT: Duration = Duration::from_millis(50);
/// Longest answer allowed: the store timeout and room for a loaded 2-core machine.
const BOUND: Duration = Duration::from_millis(80);

const POLICY: &str = r#"
domain: open
failure_mode: open
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000, algorithm: fixed_window}
---
domain: closed
failure_mode: closed
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000, algorithm: fixed_window}
"#;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type Client = RateLimitServiceClient<Channel>;

/// A shard, the binary deciding on it, and a connection to inspect and break it.
struct Fault {
    redis: RedisServer,
    sluice: common::Server,
    client: Client,
    admin: redis::aio::MultiplexedConnection,
    /// The shard as `/debug/store` and the metrics name it.
    name: String,
    /// Calls made so far: each uses a user of its own.
    calls: u64,
    /// The slowest answer while a fault was on.
    slowest: Duration,
    /// The binary's store timeout.
    timeout: Duration,
}

impl Fault {
    /// `None` (loudly) without redis-server.
    async fn start(redis_args: &[&str]) -> Option<Fault> {
        if !available() {
            return None;
        }
        let redis = RedisServer::start_with(redis_args).await;
        let url = redis.url();
        Some(Self::with(redis, &["--redis", &url], None).await)
    }

    async fn with(redis: RedisServer, store: &[&str], name: Option<&str>) -> Fault {
        Self::with_timeout(redis, store, name, STORE_TIMEOUT).await
    }

    async fn with_timeout(
        redis: RedisServer,
        store: &[&str],
        name: Option<&str>,
        timeout: Duration,
    ) -> Fault {
        let flag = format!("{}ms", timeout.as_millis());
        let mut args = vec!["--store-timeout", &flag];
        args.extend_from_slice(store);
        let sluice = common::Server::start(POLICY, &args);
        let mut f = Fault {
            client: sluice.client().await,
            admin: redis.conn().await,
            name: name.map_or_else(|| redis.addr(), str::to_string),
            sluice,
            redis,
            calls: 0,
            slowest: Duration::ZERO,
            timeout,
        };
        // Connected and deciding before any fault.
        for domain in ["open", "closed"] {
            f.decided_before_the_fault(domain).await;
        }
        assert_eq!(f.shard()["state"], "up");
        f
    }

    /// Waits until a call of `domain` is decided by the shard: OK, and not answered
    /// by the failure mode (which says OK too for the open domain). A call the
    /// failure mode answered is made again only when it took the whole store timeout
    /// and no store error but a timeout was counted: the debug binary on a loaded
    /// 2-core machine misses the 50 ms store timeout now and then, the first call
    /// after start (which may wait for the shard's connection and script load) most.
    /// A late call is not always counted as a timeout (the shard may answer after
    /// the caller gave up), so its duration is the test. Any other answer fails.
    async fn decided_before_the_fault(&mut self, domain: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let failed = self.answered_by_failure_mode(domain);
            let errors = self.errors_but_timeouts();
            let (code, took) = self.call(domain).await;
            let by_shard = self.answered_by_failure_mode(domain) == failed;
            if code == common::OK && by_shard {
                return;
            }
            assert!(
                !by_shard
                    && took >= self.timeout
                    && self.errors_but_timeouts() == errors
                    && Instant::now() < deadline,
                "{domain} call {} before the fault: answered {code} in {took:?}, by the \
                 failure mode: {}, not for a store timeout: {}",
                self.calls,
                !by_shard,
                store_errors(&self.sluice)
            );
        }
    }

    /// One call for a new user of `domain`: its code and how long it took.
    async fn call(&mut self, domain: &str) -> (i32, Duration) {
        self.calls += 1;
        let user = format!("u{}", self.calls);
        let req = common::request(domain, vec![common::desc(&[("user", &user)])]);
        let started = Instant::now();
        let code = common::call(&mut self.client, req).await.overall_code;
        (code, started.elapsed())
    }

    /// The shard's entry in `/debug/store`.
    fn shard(&self) -> Value {
        self.sluice.store_shard(&self.name)
    }

    /// A counter's value in `/metrics` (0 when absent).
    fn counter(&self, series: &str) -> u64 {
        let (_, text) = common::http(&self.sluice.http, "GET", "/metrics", "");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0, |n| n.parse().expect("a count"))
    }

    /// Errors of `kind`, over every shard (a cluster counts them per master).
    fn errors(&self, kind: &str) -> u64 {
        let (_, text) = common::http(&self.sluice.http, "GET", "/metrics", "");
        let series = format!("sluice_store_errors_total{{kind=\"{kind}\",");
        text.lines()
            .filter_map(|l| l.strip_prefix(&series)?.split_once("} "))
            .map(|(_, n)| n.parse::<u64>().expect("a count"))
            .sum()
    }

    /// Store errors of every kind but a timeout, over every shard.
    fn errors_but_timeouts(&self) -> u64 {
        let (_, text) = common::http(&self.sluice.http, "GET", "/metrics", "");
        text.lines()
            .filter(|l| l.starts_with("sluice_store_errors_total{"))
            .filter(|l| !l.contains("kind=\"timeout\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    fn answered_by_failure_mode(&self, domain: &str) -> u64 {
        self.counter(&format!(
            "sluice_requests_total{{domain=\"{domain}\",layer=\"service\",outcome=\"failed_{domain}\",rule=\"user\"}}"
        ))
    }

    /// Calls both domains in turns while the fault is on, until the shard backs off
    /// with `kind` as its last error. Every answer comes within [`BOUND`]; open calls
    /// are OK and, once one closed call has been denied by the failure mode, every
    /// later one is too (none is decided by the faulty shard). Returns the shard's
    /// `/debug/store` entry.
    async fn until_backed_off(&mut self, kind: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut denied = false;
        loop {
            self.both_answered(&mut denied).await;
            let shard = self.shard();
            if shard["state"] == "backing_off" && shard["last_error"]["kind"] == kind {
                assert!(denied, "no closed call was denied: {shard}");
                return shard;
            }
            assert!(
                Instant::now() < deadline,
                "never backed off on {kind}: {shard}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn both_answered(&mut self, denied: &mut bool) {
        for domain in ["open", "closed"] {
            let (code, took) = self.call(domain).await;
            self.slowest = self.slowest.max(took);
            assert!(took < BOUND, "{domain} call {} took {took:?}", self.calls);
            if domain == "open" {
                assert_eq!(code, common::OK, "open call {}", self.calls);
            } else if code == common::OVER_LIMIT {
                *denied = true;
            } else {
                assert!(!*denied, "closed call {} decided mid-fault", self.calls);
            }
        }
    }

    /// The whole check of one outage, from the fault on to just before it is lifted.
    async fn outage(&mut self, kind: &str) {
        let errors_before = self.errors(kind);
        let failed_open = self.answered_by_failure_mode("open");
        let failed_closed = self.answered_by_failure_mode("closed");
        let shard = self.until_backed_off(kind).await;
        assert!(shard["backoff_until"].is_string(), "{shard}");
        assert!(shard["last_error"]["message"].is_string(), "{shard}");
        // Backing off: answered at once, still by the failure mode.
        let mut denied = true;
        for _ in 0..5 {
            self.both_answered(&mut denied).await;
        }
        assert!(self.errors(kind) > errors_before, "{kind} not counted");
        assert!(self.answered_by_failure_mode("open") > failed_open);
        assert!(self.answered_by_failure_mode("closed") > failed_closed);
        let (status, _) = common::http(&self.sluice.http, "GET", "/readyz", "");
        assert_eq!(status, 200, "an outage of the store is not this replica's");
        self.wait_for_line("redis shard down");
        eprintln!("{kind}: slowest answer {:?}", self.slowest);
    }

    /// Waits until the binary logs a line containing `text`.
    fn wait_for_line(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.sluice.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return line,
                Ok(line) => seen.push(line),
                Err(_) => panic!("no line with {text:?} in {seen:#?}"),
            }
        }
    }

    /// Waits for the line saying the shard is down: it names the shard and
    /// carries Redis's error `text`.
    fn logged_down(&self, text: &str) {
        let line = self.wait_for_line("redis shard");
        assert!(line.contains("down"), "{line}");
        assert!(line.contains(&format!("shard={}", self.name)), "{line}");
        assert!(line.contains(text), "{line}");
    }

    /// Once the fault is lifted: calls are decided by the shard again. The state is
    /// read before each call: the probe may bring the shard up while a call made on
    /// the backed-off shard is being answered by the failure mode.
    async fn recovers(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let shard = self.shard();
            let (code, _) = self.call("closed").await;
            if shard["state"] == "up" {
                assert_eq!(code, common::OK, "decided by the shard: {shard}");
                return;
            }
            assert!(Instant::now() < deadline, "never up again: {shard}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Reads the shard's `/debug/store` entry, with no call made, until `want`
    /// holds of it; `sluice_degraded` agrees.
    async fn until_quiet(&self, what: &str, want: impl Fn(&str) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        let calls = self.calls;
        loop {
            let shard = self.shard();
            if want(shard["state"].as_str().unwrap_or_default()) {
                let degraded = self
                    .sluice
                    .metric("sluice_degraded", &[("shard", &self.name)]);
                let up = shard["state"] == "up";
                assert_eq!(degraded, Some(if up { 0.0 } else { 1.0 }), "{shard}");
                assert_eq!(self.calls, calls);
                return shard;
            }
            assert!(
                Instant::now() < deadline,
                "never {what} with no call: {shard}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The shard reads backed off (or on trial) with no call made.
    async fn until_quiet_down(&self, kind: &str) {
        let shard = self
            .until_quiet("down", |s| s == "backing_off" || s == "trying")
            .await;
        assert_eq!(shard["last_error"]["kind"], kind, "{shard}");
    }

    /// The shard reads up with no call made, and the next call is decided by it.
    async fn until_quiet_up(&mut self) {
        self.until_quiet("up", |s| s == "up").await;
        let failed = self.answered_by_failure_mode("closed");
        let (code, _) = self.call("closed").await;
        assert_eq!(code, common::OK, "decided by the shard: {}", self.shard());
        assert_eq!(self.answered_by_failure_mode("closed"), failed);
    }

    /// Sends a command to the shard.
    async fn admin(&mut self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut self.admin).await
    }

    /// Waits until the shard answers PING with the error `code`.
    async fn wait_for_reply(&mut self, code: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.admin(&["PING"]).await {
                Err(e) if e.code() == Some(code) => return,
                other => assert!(Instant::now() < deadline, "PING: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A command that blocks the server (or its connection), sent on a connection of its
/// own; its reply is read when the test is ready for it.
struct Blocking(BufReader<TcpStream>);

impl Blocking {
    fn send(server: &RedisServer, inline: &str) -> Blocking {
        let mut s = TcpStream::connect(server.addr()).expect("connect");
        s.write_all(format!("{inline}\r\n").as_bytes())
            .expect("send");
        Blocking(BufReader::new(s))
    }

    /// The reply's first line, within `limit`.
    fn reply(mut self, limit: Duration) -> String {
        self.0
            .get_ref()
            .set_read_timeout(Some(limit))
            .expect("timeout");
        let mut line = String::new();
        self.0.read_line(&mut line).expect("a reply in time");
        line.trim_end().to_string()
    }
}

#[tokio::test]
async fn a_shard_turned_replica_answers_readonly_and_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    // A failover that left the URL on the old master: it now replicates another.
    let master = RedisServer::start().await;
    let port = master.port.to_string();
    f.admin(&["REPLICAOF", "127.0.0.1", &port]).await.unwrap();
    f.outage("readonly").await;
    f.admin(&["REPLICAOF", "NO", "ONE"]).await.unwrap();
    f.recovers().await;
}

#[tokio::test]
async fn a_replica_without_its_master_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    f.admin(&["CONFIG", "SET", "replica-serve-stale-data", "no"])
        .await
        .unwrap();
    let nobody = free_port().to_string();
    f.admin(&["REPLICAOF", "127.0.0.1", &nobody]).await.unwrap();
    // Called by function (Redis 7), the decide call is a write that a replica refuses
    // as READONLY before it would answer MASTERDOWN (as it does to EVALSHA).
    f.outage("readonly").await;
    f.admin(&["REPLICAOF", "NO", "ONE"]).await.unwrap();
    f.recovers().await;
}

#[tokio::test]
async fn a_shard_busy_running_a_script_answers_busy_and_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    // Redis answers BUSY to everyone else once a script has run this long.
    f.admin(&["CONFIG", "SET", "busy-reply-threshold", "10"])
        .await
        .unwrap();
    let busy = Blocking::send(&f.redis, "EVAL \"while true do end\" 0");
    f.wait_for_reply("BUSY").await;
    f.outage("busy").await;
    f.admin(&["SCRIPT", "KILL"]).await.unwrap();
    let killed = busy.reply(Duration::from_secs(5));
    assert!(killed.contains("Script killed"), "{killed}");
    f.recovers().await;
}

#[tokio::test]
async fn a_shard_out_of_memory_answers_oom_and_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    f.admin(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await
        .unwrap();
    f.admin(&["CONFIG", "SET", "maxmemory", "1"]).await.unwrap();
    f.outage("oom").await;
    f.admin(&["CONFIG", "SET", "maxmemory", "0"]).await.unwrap();
    f.recovers().await;
}

#[tokio::test]
async fn an_acl_that_refuses_a_command_the_scripts_run_answers_noauth_and_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    // The scripts read Redis's clock: an ACL without TIME refuses it inside them
    // ("The user executing the script can't run this command"), which waiting does
    // not mend, as a refused password does not.
    f.admin(&["ACL", "SETUSER", "default", "-time"])
        .await
        .unwrap();
    f.outage("noauth").await;
    f.admin(&["ACL", "SETUSER", "default", "+time"])
        .await
        .unwrap();
    f.recovers().await;
}

#[tokio::test]
async fn a_shard_that_starts_wanting_a_password_answers_noauth_and_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    wants_a_password(&mut f).await;
}

/// The shard starts wanting a password: an outage, `noauth`, until it wants none.
async fn wants_a_password(f: &mut Fault) {
    // Connections opened before stay authenticated: close sluice's (not this one).
    f.admin(&["CONFIG", "SET", "requirepass", "s3cret"])
        .await
        .unwrap();
    f.admin(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .await
        .unwrap();
    f.outage("noauth").await;
    f.admin(&["CONFIG", "SET", "requirepass", ""])
        .await
        .unwrap();
    f.recovers().await;
}

#[tokio::test]
async fn a_shard_loading_its_dataset_answers_loading_and_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&["--enable-debug-command", "local"]).await else {
        return;
    };
    // Loading 5,000 keys at 1 ms each: seconds of LOADING, answered while it lasts.
    f.admin(&["DEBUG", "POPULATE", "5000"]).await.unwrap();
    f.admin(&["CONFIG", "SET", "key-load-delay", "1000"])
        .await
        .unwrap();
    f.admin(&[
        "CONFIG",
        "SET",
        "loading-process-events-interval-bytes",
        "1024",
    ])
    .await
    .unwrap();
    let reload = Blocking::send(&f.redis, "DEBUG RELOAD");
    f.wait_for_reply("LOADING").await;
    f.outage("loading").await;
    assert_eq!(reload.reply(Duration::from_secs(60)), "+OK");
    f.admin(&["CONFIG", "SET", "key-load-delay", "0"])
        .await
        .unwrap();
    f.recovers().await;
}

#[tokio::test]
async fn a_stalled_shard_times_out_within_the_store_timeout_and_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&["--enable-debug-command", "local"]).await else {
        return;
    };
    let sleep = Blocking::send(&f.redis, "DEBUG SLEEP 3");
    f.outage("timeout").await;
    assert_eq!(sleep.reply(Duration::from_secs(10)), "+OK");
    f.recovers().await;
}

#[tokio::test]
async fn a_script_error_is_answered_by_the_failure_mode_logged_once_and_never_backs_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    let victim = |domain: &str| common::request(domain, vec![common::desc(&[("user", "victim")])]);
    for domain in ["open", "closed"] {
        let r = common::call(&mut f.client, victim(domain)).await;
        assert_eq!(r.overall_code, common::OK);
    }
    // Both victims' counters become lists: every decide call on them fails inside
    // the script (WRONGTYPE), on a shard that is otherwise fine.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*victim*")
        .query_async(&mut f.admin)
        .await
        .unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in &keys {
        f.admin(&["DEL", key]).await.unwrap();
        f.admin(&["RPUSH", key, "not a counter"]).await.unwrap();
    }
    let started = Instant::now();
    let mut rounds = 0;
    // Past the span and count that would back an outage off, several times over.
    while rounds < 20 || started.elapsed() < Duration::from_millis(300) {
        for (domain, code) in [("open", common::OK), ("closed", common::OVER_LIMIT)] {
            let asked = Instant::now();
            let r = common::call(&mut f.client, victim(domain)).await;
            let took = asked.elapsed();
            assert!(took < BOUND, "{domain} took {took:?}");
            assert_eq!(r.overall_code, code, "{domain}: the failure mode answers");
        }
        rounds += 1;
        let shard = f.shard();
        assert_ne!(shard["state"], "backing_off", "a script error is no outage");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let shard = f.shard();
    assert_eq!(shard["state"], "failing", "{shard}");
    assert_eq!(shard["last_error"]["kind"], "script", "{shard}");
    let message = shard["last_error"]["message"].as_str().unwrap();
    assert!(message.contains("WRONGTYPE"), "{shard}");
    assert_eq!(f.errors("script"), 2 * rounds, "one per call");
    // Loud, but once for the whole flood.
    let loud = f.wait_for_line("redis call failed on a working shard");
    assert!(
        loud.contains("ERROR") && loud.contains("WRONGTYPE"),
        "{loud}"
    );
    let more: Vec<_> = f
        .sluice
        .drain_lines()
        .into_iter()
        .filter(|l| l.contains("redis call failed on a working shard"))
        .collect();
    assert!(more.is_empty(), "{more:#?}");
    for key in &keys {
        f.admin(&["DEL", key]).await.unwrap();
    }
    f.recovers().await;
}

/// `CLUSTER INFO` of the node at `port` says `cluster_state:ok` (or not).
fn cluster_ok(port: u16) -> bool {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "cluster", "info"])
        .output()
        .expect("redis-cli cluster info");
    String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok")
}

/// A cluster as small as one can be, one node holding every slot, with sluice on
/// it and deciding; `None` when Redis is not installed.
async fn one_node_cluster() -> Option<Fault> {
    if !available() {
        return None;
    }
    let node = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ])
    .await;
    let mut admin = node.conn().await;
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query_async(&mut admin)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster_ok(node.port) {
        assert!(Instant::now() < deadline, "cluster never ok");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (url, addr) = (node.url(), node.addr());
    let f = Fault::with(node, &["--redis-cluster", &url], Some("cluster")).await;
    assert_eq!(f.shard()["nodes"], serde_json::json!([addr]));
    Some(f)
}

#[tokio::test]
async fn a_cluster_without_its_slots_answers_clusterdown_and_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = one_node_cluster().await else {
        return;
    };
    f.admin(&["CLUSTER", "DELSLOTSRANGE", "0", "16383"])
        .await
        .unwrap();
    f.outage("clusterdown").await;
    f.admin(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])
        .await
        .unwrap();
    f.recovers().await;
}

/// A cluster master that starts wanting a password refuses the calls, the slot
/// map's reading and the probes alike: backed off until it takes them again.
#[tokio::test]
async fn a_cluster_master_that_starts_wanting_a_password_answers_noauth_and_is_backed_off() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = one_node_cluster().await else {
        return;
    };
    wants_a_password(&mut f).await;
}

/// The users `c0..c{n}` whose counters `node` holds (its keys name them).
async fn users_on(node: &RedisServer, n: usize) -> Vec<usize> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut node.conn().await)
        .await
        .expect("KEYS");
    let holds = |i: usize| {
        let name = format!("user=c{i}");
        keys.iter().any(|k| {
            k.match_indices(&name).any(|(at, _)| {
                let next = k.as_bytes().get(at + name.len());
                !next.is_some_and(u8::is_ascii_digit)
            })
        })
    };
    (0..n).filter(|&i| holds(i)).collect()
}

/// Sluice's store errors by kind (those counted), and its shards, to say why a call
/// was answered by the failure mode.
fn store_errors(sluice: &common::Server) -> String {
    let (_, metrics) = common::http(&sluice.http, "GET", "/metrics", "");
    let errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_store_errors_total") && !l.ends_with(" 0"))
        .collect();
    let (_, shards) = common::http(&sluice.http, "GET", "/debug/store", "");
    format!("store errors {errors:?}; shards {shards}")
}

/// Store timeouts sluice counted, on every shard but `stopped` (a master the test
/// stopped, whose timeouts are the fault's).
fn timeouts(sluice: &common::Server, stopped: Option<&str>) -> f64 {
    let (_, metrics) = common::http(&sluice.http, "GET", "/metrics", "");
    metrics
        .lines()
        .filter(|l| l.starts_with("sluice_store_errors_total{kind=\"timeout\","))
        .filter(|l| stopped.is_none_or(|s| !l.contains(&format!("shard=\"{s}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until a call for user `c{user}` of the fail-closed domain is decided (OK).
/// A call answered by the failure mode is made again only when it was for a store
/// timeout on a shard other than `stopped`: the debug binary on a loaded 2-core
/// machine misses the 50 ms store timeout now and then, the first calls after start
/// (which connect and load the script) most. Any other failure-mode answer (an
/// error reply, a timeout on the stopped master, a count over the limit) fails.
async fn decided(
    sluice: &common::Server,
    call: &mut impl AsyncFnMut(usize) -> i32,
    user: usize,
    stopped: Option<&str>,
    what: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = timeouts(sluice, stopped);
        let code = call(user).await;
        if code == common::OK {
            return;
        }
        assert!(
            timeouts(sluice, stopped) > before && Instant::now() < deadline,
            "user c{user} {what}: answered {code}, not for a store timeout: {}",
            store_errors(sluice)
        );
    }
}

/// A 3-master cluster whose survivors serve their slots while one master is down
/// (else the whole cluster refuses after the node timeout), and sluice on it with
/// `policy` and `store_timeout`.
async fn cluster_serving_its_survivors(
    policy: &str,
    store_timeout: Duration,
) -> (common::redis::RedisCluster, common::Server) {
    let cluster = common::redis::RedisCluster::start(3).await;
    for node in &cluster.nodes {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query_async(&mut node.conn().await)
            .await
            .unwrap();
    }
    let urls = cluster.urls().join(",");
    let timeout = format!("{}ms", store_timeout.as_millis());
    let sluice = common::Server::start(
        policy,
        &["--store-timeout", &timeout, "--redis-cluster", &urls],
    );
    (cluster, sluice)
}

#[tokio::test]
async fn one_cluster_master_down_leaves_the_others_deciding() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let (mut cluster, sluice) = cluster_serving_its_survivors(POLICY, STORE_TIMEOUT).await;
    let mut client = sluice.client().await;
    const USERS: usize = 30;
    let mut call = async |i: usize| {
        let req = common::request("closed", vec![common::desc(&[("user", &format!("c{i}"))])]);
        common::call(&mut client, req).await.overall_code
    };
    for i in 0..USERS {
        decided(&sluice, &mut call, i, None, "before the fault").await;
    }
    let down = users_on(&cluster.nodes[0], USERS).await;
    assert!(
        !down.is_empty() && down.len() < USERS,
        "the users spread over the masters: {down:?} on the first"
    );
    let dead = cluster.nodes[0].addr();
    cluster.nodes[0].kill();

    // Until the dead master has been backed off, tried again and backed off
    // longer: its users are answered by the failure mode (closed), every other
    // user is decided by its own master, in every round.
    let store = |name: &str| sluice.store_shard(name);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut back_offs = std::collections::BTreeSet::new();
    while back_offs.len() < 2 {
        for i in 0..USERS {
            let want = if down.contains(&i) {
                common::OVER_LIMIT
            } else {
                common::OK
            };
            assert_eq!(call(i).await, want, "user c{i} while {dead} is down");
        }
        let node = store(&dead);
        if let Some(until) = node["backoff_until"].as_str() {
            back_offs.insert(until.to_string());
        }
        assert!(Instant::now() < deadline, "never backed off twice: {node}");
    }
    // The cluster as a whole is degraded, by its one master; the others are up.
    assert_ne!(store("cluster")["state"], "up");
    for node in &cluster.nodes[1..] {
        assert_eq!(store(&node.addr())["state"], "up", "{}", node.addr());
    }
    let (_, metrics) = common::http(&sluice.http, "GET", "/metrics", "");
    let degraded = |shard: &str| format!("sluice_degraded{{shard=\"{shard}\"}} ");
    assert!(
        metrics.contains(&format!("{}1", degraded(&dead))),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("{}1", degraded("cluster"))));
    let other = cluster.nodes[1].addr();
    assert!(metrics.contains(&format!("{}0", degraded(&other))));
    // One line when the master went down, none saying it came back.
    let lines: Vec<String> = sluice.lines.try_iter().collect();
    let down_lines = lines.iter().filter(|l| l.contains("redis shard down"));
    assert_eq!(down_lines.count(), 1, "{lines:#?}");
    assert!(
        !lines.iter().any(|l| l.contains("redis shard up")),
        "{lines:#?}"
    );
}

/// `CLIENT LIST` of `server`: a line per connection, with its last command.
async fn client_list(server: &RedisServer) -> String {
    redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut server.conn().await)
        .await
        .expect("CLIENT LIST")
}

/// A Redis that closes idle connections (`timeout`, as a NAT or a load balancer
/// that cuts idle TCP does): a healthy shard, so every call is decided by it.
#[tokio::test]
async fn connections_redis_closed_while_idle_carry_no_call() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&["--timeout", "1"]).await else {
        return;
    };
    for round in 0..3 {
        // Until Redis has closed the connections decisions went by (the block
        // list's, read every second, stays open).
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let list = client_list(&f.redis).await;
            if !list.contains("cmd=fcall") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: never closed: {list}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..4 {
            let (code, _) = f.call("closed").await;
            assert_eq!(code, common::OK, "round {round}, call {}", f.calls);
        }
    }
    assert_eq!(f.errors("connection"), 0, "a closed connection was used");
}

/// Two domains, one failing open and one closed, each with a wide limit `a` and a
/// limit `b` of 1000 an hour.
const SPLIT: &str = r#"
domain: open
failure_mode: open
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: fixed_window}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: fixed_window}
---
domain: closed
failure_mode: closed
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: fixed_window}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: fixed_window}
"#;

/// The values `{key}0..{key}{n}` of `domain` whose counters `node` holds.
async fn values_on(node: &RedisServer, domain: &str, key: &str, n: usize) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut node.conn().await)
        .await
        .expect("KEYS");
    (0..n)
        .map(|i| format!("{key}{i}"))
        .filter(|v| {
            let name = format!("{domain}|{key}={v}");
            keys.iter().any(|k| {
                k.match_indices(&name).any(|(at, _)| {
                    let next = k.as_bytes().get(at + name.len());
                    !next.is_some_and(u8::is_ascii_digit)
                })
            })
        })
        .collect()
}

/// A request's overall code and each descriptor's code and remaining.
type Answer = (i32, Vec<(i32, u32)>);

/// A request of one hit per descriptor (`key`, `value`).
async fn ask(client: &mut Client, domain: &str, descriptors: &[(&str, &str)]) -> Answer {
    let descriptors = descriptors
        .iter()
        .map(|&(k, v)| common::desc(&[(k, v)]))
        .collect();
    let r = common::call(client, common::request(domain, descriptors)).await;
    let statuses = r.statuses.iter().map(|s| (s.code, s.limit_remaining));
    (r.overall_code, statuses.collect())
}

/// What `b=value` of `domain` has left, asked without spending (a cost of 0).
async fn left(client: &mut Client, domain: &str, value: &str) -> u32 {
    let req = common::request(domain, vec![common::desc_hits(&[("b", value)], 0)]);
    common::call(client, req).await.statuses[0].limit_remaining
}

/// Values of `a` and of `b` counted once each by [`count_each`]: enough that each
/// shard holds some.
const SPREAD: usize = 24;

/// Asks once for each of the values `a0`, `b0`, ... of [`SPREAD`], all admitted.
async fn count_each(client: &mut Client, domain: &str) {
    for i in 0..SPREAD {
        for key in ["a", "b"] {
            let value = format!("{key}{i}");
            let (code, _) = ask(client, domain, &[(key, &value)]).await;
            assert_eq!(code, common::OK, "{domain} {value}");
        }
    }
}

/// Per domain, a value of `a` whose counter lives on `down` and two values of `b`
/// whose counters live elsewhere, each counted once.
async fn split_values(
    client: &mut Client,
    down: &RedisServer,
    domain: &str,
) -> (String, String, String) {
    count_each(client, domain).await;
    let a = values_on(down, domain, "a", SPREAD).await;
    let b_down = values_on(down, domain, "b", SPREAD).await;
    let b: Vec<String> = (0..SPREAD)
        .map(|i| format!("b{i}"))
        .filter(|v| !b_down.contains(v))
        .collect();
    assert!(
        !a.is_empty() && b.len() >= 2,
        "{domain}: a on the shard {a:?}, b elsewhere {b:?}"
    );
    (a[0].clone(), b[0].clone(), b[1].clone())
}

/// With one shard down, `failure_mode: open` lifts only the limits on that shard: a
/// request that also touches a healthy shard is still denied by that shard's full
/// limit, and counted on it when admitted. `closed` denies such a request and counts
/// nothing.
#[tokio::test]
async fn one_shard_down_lifts_only_its_own_limits() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let mut shards = [RedisServer::start().await, RedisServer::start().await];
    let urls = format!("{},{}", shards[0].url(), shards[1].url());
    let timeout = format!("{}ms", STORE_TIMEOUT.as_millis());
    let sluice = common::Server::start(SPLIT, &["--store-timeout", &timeout, "--redis", &urls]);
    lifts_only_the_failed(&sluice, &mut shards[0]).await;
}

/// As [`one_shard_down_lifts_only_its_own_limits`], for a request over masters of a
/// Redis Cluster.
#[tokio::test]
async fn one_cluster_master_down_lifts_only_its_own_limits() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let (mut cluster, sluice) = cluster_serving_its_survivors(SPLIT, STORE_TIMEOUT).await;
    lifts_only_the_failed(&sluice, &mut cluster.nodes[0]).await;
}

/// Stops `down`, one of `sluice`'s shards (or masters), and checks that only the
/// limits it holds are lifted.
async fn lifts_only_the_failed(sluice: &common::Server, down: &mut RedisServer) {
    let mut client = sluice.client().await;
    let (a, full, room) = split_values(&mut client, down, "open").await;
    let (closed_a, closed_b, _) = split_values(&mut client, down, "closed").await;
    // `full` has no room left (a cost of 999 fills it): a request with `a` is denied
    // by it alone.
    let fill = common::request("open", vec![common::desc_hits(&[("b", &full)], 999)]);
    assert_eq!(
        common::call(&mut client, fill).await.overall_code,
        common::OK
    );
    let denied = (
        common::OVER_LIMIT,
        vec![(common::OK, 999_999), (common::OVER_LIMIT, 0)],
    );
    assert_eq!(
        ask(&mut client, "open", &[("a", &a), ("b", &full)]).await,
        denied
    );

    let dead = down.addr();
    down.kill();
    // Until the dead shard has been backed off, and a few calls after: the healthy
    // shard decides its limits whether the dead one's calls fail or are not tried.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut admitted, mut after) = (0u32, 0);
    while after < 5 {
        let (code, statuses) = ask(&mut client, "open", &[("a", &a), ("b", &full)]).await;
        assert_eq!(
            code,
            common::OVER_LIMIT,
            "open [a, full b] while {dead} is down"
        );
        // `a` shows what failing open shows; `b` its own denial.
        assert_eq!(statuses, [(common::OK, 0), (common::OVER_LIMIT, 0)]);
        let (code, statuses) = ask(&mut client, "open", &[("a", &a), ("b", &room)]).await;
        assert_eq!(
            code,
            common::OK,
            "open [a, b with room] while {dead} is down"
        );
        admitted += 1;
        assert_eq!(statuses, [(common::OK, 0), (common::OK, 999 - admitted)]);
        let pair = [("a", closed_a.as_str()), ("b", closed_b.as_str())];
        let (code, statuses) = ask(&mut client, "closed", &pair).await;
        assert_eq!(
            code,
            common::OVER_LIMIT,
            "closed [a, b] while {dead} is down"
        );
        assert_eq!(statuses[1].0, common::OVER_LIMIT);
        if sluice.store_shard(&dead)["state"] == "backing_off" {
            after += 1;
        }
        assert!(
            Instant::now() < deadline,
            "never backed off: {}",
            sluice.store_shard(&dead)
        );
    }
    // What the admitted requests spent on the healthy shard stays spent; the closed
    // domain's denied requests spent nothing there.
    assert_eq!(left(&mut client, "open", &room).await, 999 - admitted);
    assert_eq!(left(&mut client, "closed", &closed_b).await, 999);

    let count = |outcome: &str, rule: &str| {
        let labels = [
            ("domain", "open"),
            ("layer", "service"),
            ("outcome", outcome),
            ("rule", rule),
        ];
        sluice
            .metric("sluice_requests_total", &labels)
            .unwrap_or(0.0) as u32
    };
    assert!(
        count("failed_open", "a") >= 2 * admitted,
        "a counted as failed open"
    );
    assert!(
        count("over_limit", "b") >= admitted,
        "b's denials counted as such"
    );
    let failures = sluice.metric("sluice_store_failures_total", &[("store", "redis")]);
    assert!(
        failures.unwrap_or(0.0) >= f64::from(3 * admitted),
        "{failures:?}"
    );
}

/// The store timeout of the hung-shard tests: long enough that on a loaded machine
/// the hung shard's call is clearly the one that does not answer in time.
const HUNG_TIMEOUT: Duration = Duration::from_millis(250);

/// As [`one_shard_down_lifts_only_its_own_limits`], for a shard that hangs (a
/// stopped process: its connections open, nothing answered) among three: from the
/// first requests, before the shard has failed enough to be backed off, each
/// request waits for it until the store timeout, and then the healthy shards'
/// verdicts decide.
#[tokio::test]
async fn one_shard_hung_lifts_only_its_own_limits() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let shards = [
        RedisServer::start().await,
        RedisServer::start().await,
        RedisServer::start().await,
    ];
    let urls: Vec<String> = shards.iter().map(RedisServer::url).collect();
    let timeout = format!("{}ms", HUNG_TIMEOUT.as_millis());
    let sluice = common::Server::start(
        SPLIT,
        &["--store-timeout", &timeout, "--redis", &urls.join(",")],
    );
    lifts_only_the_hung(&sluice, &shards[0], [&shards[1], &shards[2]]).await;
}

/// Among three shards, the one stopped is the one the "store failing" warning
/// names, with the error's kind, though the request's first limit lives on a
/// shard that answers: an operator reads which server to look at from the line
/// that says the failure mode is answering.
#[tokio::test]
async fn the_store_failing_warning_names_the_stopped_shard_and_the_error_kind() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let shards = [
        RedisServer::start().await,
        RedisServer::start().await,
        RedisServer::start().await,
    ];
    let urls: Vec<String> = shards.iter().map(RedisServer::url).collect();
    let timeout = format!("{}ms", HUNG_TIMEOUT.as_millis());
    let sluice = common::Server::start(
        SPLIT,
        &["--store-timeout", &timeout, "--redis", &urls.join(",")],
    );
    let mut client = sluice.client().await;
    let (stopped, healthy) = (&shards[1], [&shards[0], &shards[2]]);
    let (a, [b, _]) = values_by_shard(&mut client, stopped, healthy, "open").await;
    stopped.freeze();
    let (code, _) = ask(&mut client, "open", &[("b", &b[0]), ("a", &a)]).await;
    assert_eq!(code, common::OK, "open, the stopped shard's limit lifted");
    let lines = sluice
        .wait_line(Duration::from_secs(10), "store failing", |l| {
            l.contains("store failing")
        })
        .await;
    let line = lines.last().unwrap();
    assert!(
        line.contains(&format!("shard={}", stopped.addr())) && line.contains("kind=timeout"),
        "{line}"
    );
    stopped.thaw();
}

/// As [`one_shard_hung_lifts_only_its_own_limits`], for a request over masters of
/// a Redis Cluster, one of them hung.
#[tokio::test]
async fn one_cluster_master_hung_lifts_only_its_own_limits() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let (cluster, sluice) = cluster_serving_its_survivors(SPLIT, HUNG_TIMEOUT).await;
    let [hung, one, other] = &cluster.nodes[..] else {
        panic!("three masters");
    };
    lifts_only_the_hung(&sluice, hung, [one, other]).await;
}

/// `f`'s output and how long it took.
async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let out = f.await;
    (out, started.elapsed())
}

/// Per domain, counted once each: a value of `a` whose counter lives on `hung`, and
/// the values of `b` whose counters live on each of `healthy`.
async fn values_by_shard(
    client: &mut Client,
    hung: &RedisServer,
    healthy: [&RedisServer; 2],
    domain: &str,
) -> (String, [Vec<String>; 2]) {
    count_each(client, domain).await;
    let a = values_on(hung, domain, "a", SPREAD).await;
    let b = [
        values_on(healthy[0], domain, "b", SPREAD).await,
        values_on(healthy[1], domain, "b", SPREAD).await,
    ];
    assert!(
        !a.is_empty() && b[0].len() >= 2 && !b[1].is_empty(),
        "{domain}: a on the hung shard {a:?}, b on the healthy ones {b:?}"
    );
    (a[0].clone(), b)
}

/// Waits until `b=value` of `domain` has `want` left.
async fn until_left(client: &mut Client, domain: &str, value: &str, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = left(client, domain, value).await;
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "{domain} b={value}: {now} left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Freezes `hung`, one of `sluice`'s shards (or masters), and checks, with requests
/// sent together before it is backed off, that only the limits it holds are lifted:
/// the `healthy` shards' verdicts decide, what they admit stays spent, and what they
/// took for a denied request is given back.
async fn lifts_only_the_hung(
    sluice: &common::Server,
    hung: &RedisServer,
    healthy: [&RedisServer; 2],
) {
    let mut client = sluice.client().await;
    let (a, [near, far]) = values_by_shard(&mut client, hung, healthy, "open").await;
    let (closed_a, [closed_near, _]) = values_by_shard(&mut client, hung, healthy, "closed").await;
    let closed_b = &closed_near[0];
    let (room, room_too, full) = (&near[0], &near[1], &far[0]);
    let fill = common::request("open", vec![common::desc_hits(&[("b", full)], 999)]);
    assert_eq!(
        common::call(&mut client, fill).await.overall_code,
        common::OK
    );

    let name = hung.addr();
    hung.freeze();
    let ask_in = |domain: &'static str, pair: Vec<(&'static str, String)>| {
        let mut client = client.clone();
        timed(async move {
            let pair: Vec<(&str, &str)> = pair.iter().map(|(k, v)| (*k, v.as_str())).collect();
            ask(&mut client, domain, &pair).await
        })
    };
    let (
        (denied, denied_in),
        (admitted, admitted_in),
        (refunded, refunded_in),
        (closed, closed_in),
    ) = tokio::join!(
        ask_in("open", vec![("a", a.clone()), ("b", full.clone())]),
        ask_in("open", vec![("a", a.clone()), ("b", room.clone())]),
        ask_in(
            "open",
            vec![
                ("a", a.clone()),
                ("b", room_too.clone()),
                ("b", full.clone())
            ]
        ),
        ask_in(
            "closed",
            vec![("a", closed_a.clone()), ("b", closed_b.clone())]
        ),
    );
    // Each waited for the hung shard (a backed-off one is not waited for), and no
    // longer than the store timeout allows.
    for (what, took) in [
        ("open [a, full b]", denied_in),
        ("open [a, b with room]", admitted_in),
        ("open [a, b with room, full b]", refunded_in),
        ("closed [a, b]", closed_in),
    ] {
        assert!(
            took >= HUNG_TIMEOUT && took < HUNG_TIMEOUT * 3,
            "{what} took {took:?} with {name} hung"
        );
    }
    // `a` shows what failing open shows; each `b` its own verdict (one that
    // admitted a denied request shows what it still has).
    let (ok, over) = (common::OK, common::OVER_LIMIT);
    assert_eq!(
        denied,
        (over, vec![(ok, 0), (over, 0)]),
        "open [a, full b] with {name} hung"
    );
    assert_eq!(
        admitted,
        (ok, vec![(ok, 0), (ok, 998)]),
        "open [a, b with room] with {name} hung"
    );
    assert_eq!(
        refunded,
        (over, vec![(ok, 0), (ok, 999), (over, 0)]),
        "open [a, b with room, full b] with {name} hung"
    );
    assert_eq!(closed.0, over, "closed [a, b] with {name} hung");
    assert_eq!(closed.1[1].0, over);

    // The admitted request's spending on the healthy shard stays spent; what the
    // denied ones took there is given back.
    assert_eq!(left(&mut client, "open", room).await, 998);
    until_left(&mut client, "open", room_too, 999).await;
    until_left(&mut client, "closed", closed_b, 999).await;
    let lifted = sluice.metric(
        "sluice_requests_total",
        &[
            ("domain", "open"),
            ("layer", "service"),
            ("outcome", "failed_open"),
            ("rule", "a"),
        ],
    );
    assert_eq!(lifted, Some(3.0), "a counted as failed open");
    hung.thaw();
}

#[tokio::test]
async fn an_idle_shard_killed_reads_down_and_restarted_reads_up_with_no_call() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    f.redis.kill();
    f.until_quiet_down("connection").await;
    f.redis.restart().await;
    f.until_quiet_up().await;
}

#[tokio::test]
async fn an_idle_shard_stopped_reads_down_and_continued_reads_up_with_no_call() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    f.redis.freeze();
    f.until_quiet_down("timeout").await;
    f.redis.thaw();
    f.until_quiet_up().await;
}

/// With a store timeout past a second, the probes of a hung idle shard fail a
/// timeout apart: they still make a streak and back it off (its calls are then
/// answered by the failure mode at once rather than each waiting the timeout).
#[tokio::test]
async fn an_idle_shard_stopped_reads_down_with_a_store_timeout_past_a_second() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let redis = RedisServer::start_with(&[]).await;
    let url = redis.url();
    let timeout = Duration::from_millis(1500);
    let mut f = Fault::with_timeout(redis, &["--redis", &url], None, timeout).await;
    f.redis.freeze();
    f.until_quiet_down("timeout").await;
    f.redis.thaw();
    f.until_quiet_up().await;
}

#[tokio::test]
async fn an_idle_cluster_master_stopped_reads_down_and_continued_reads_up() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let (cluster, sluice) = cluster_serving_its_survivors(POLICY, STORE_TIMEOUT).await;
    // Calls on every master, so the slot map is known; then none.
    call_every_master(&sluice).await;
    let stopped = cluster.nodes[0].addr();
    let state = |name: &str| sluice.store_shard(name)["state"].clone();
    cluster.nodes[0].freeze();
    common::eventually(
        Duration::from_secs(10),
        "the stopped master reads down",
        || {
            let s = state(&stopped);
            async move { s == "backing_off" || s == "trying" }
        },
    )
    .await;
    assert_ne!(state("cluster"), "up");
    assert_eq!(state(&cluster.nodes[1].addr()), "up");
    cluster.nodes[0].thaw();
    common::eventually(Duration::from_secs(10), "the master reads up again", || {
        let (s, c) = (state(&stopped), state("cluster"));
        async move { s == "up" && c == "up" }
    })
    .await;
}

/// A cluster master at `maxmemory` (with `noeviction`) refuses its slots' decide
/// calls but answers a PING. Its probe writes to a key in one of its slots, so
/// idle it reads down with no call, the others staying up, and up again within
/// a probe's interval once undone.
#[tokio::test]
async fn an_idle_cluster_master_out_of_memory_reads_down_and_back_up_with_no_call() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let (cluster, sluice) = cluster_serving_its_survivors(POLICY, STORE_TIMEOUT).await;
    let mut client = sluice.client().await;
    const USERS: usize = 30;
    let mut call = async |i: usize| {
        let req = common::request("closed", vec![common::desc(&[("user", &format!("c{i}"))])]);
        common::call(&mut client, req).await.overall_code
    };
    // Calls on every master, so the slot map is known; then none until it is up.
    for i in 0..USERS {
        decided(&sluice, &mut call, i, None, "before the fault").await;
    }
    let users = users_on(&cluster.nodes[0], USERS).await;
    assert!(!users.is_empty(), "no user on the first master");
    let (full, other) = (cluster.nodes[0].addr(), cluster.nodes[1].addr());
    let state = |name: &str| sluice.store_shard(name);
    let degraded = |name: &str| sluice.metric("sluice_degraded", &[("shard", name)]);
    let mut admin = cluster.nodes[0].conn().await;
    let mut config_set = async |name: &str, value: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut admin)
            .await
            .unwrap();
    };
    config_set("maxmemory-policy", "noeviction").await;
    config_set("maxmemory", "1").await;
    common::eventually(
        Duration::from_secs(10),
        "the master out of memory reads down",
        || {
            let s = state(&full)["state"].clone();
            async move { s == "backing_off" || s == "trying" }
        },
    )
    .await;
    let shard = state(&full);
    assert_eq!(shard["last_error"]["kind"], "oom", "{shard}");
    assert_eq!(degraded(&full), Some(1.0));
    assert_eq!(degraded(&other), Some(0.0));
    assert_eq!(state(&other)["state"], "up");
    assert_ne!(state("cluster")["state"], "up");

    // With no call, only the probe can see it undone.
    config_set("maxmemory", "0").await;
    common::eventually(Duration::from_secs(10), "the master reads up again", || {
        let (s, c) = (
            state(&full)["state"].clone(),
            state("cluster")["state"].clone(),
        );
        async move { s == "up" && c == "up" }
    })
    .await;
    assert_eq!(degraded(&full), Some(0.0));
    // Decided by the master again (closed would refuse it otherwise).
    assert_eq!(call(users[0]).await, common::OK);
}

/// Decides 30 users, enough to reach every master of a three-master cluster, so
/// the slot map is known.
async fn call_every_master(sluice: &common::Server) {
    let mut client = sluice.client().await;
    let mut call = async |i: usize| {
        let req = common::request("closed", vec![common::desc(&[("user", &format!("c{i}"))])]);
        common::call(&mut client, req).await.overall_code
    };
    for i in 0..30 {
        decided(sluice, &mut call, i, None, "before the fault").await;
    }
}

/// Sends `args` to `node`.
async fn on(node: &RedisServer, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut node.conn().await).await
}

/// The slot of a master's probe moved to another master while no call came: its
/// probe meets `MOVED`, the slot map is read again and the probe goes to a slot
/// the master still serves, so it still reads down at `maxmemory`.
#[tokio::test]
async fn an_idle_cluster_master_whose_probe_slot_moved_reads_down_out_of_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    let (cluster, sluice) = cluster_serving_its_survivors(POLICY, STORE_TIMEOUT).await;
    call_every_master(&sluice).await;
    let (from, to) = (&cluster.nodes[0], &cluster.nodes[1]);
    // The probe's key: the first tag whose slot the master serves (it does not
    // redirect a write to it).
    let mut tag = 0;
    let mut admin = from.conn().await;
    loop {
        let key = format!("sluice:probe{{{tag}}}");
        let set = redis::cmd("SET").arg(&key).arg("").arg("XX").to_owned();
        let answer: redis::RedisResult<redis::Value> = set.query_async(&mut admin).await;
        if answer.is_ok() {
            break;
        }
        tag += 1;
    }
    let slot = sluice_redis::cluster::slot(format!("probe{{{tag}}}").as_bytes()).to_string();
    let id = |v: redis::RedisResult<redis::Value>| match v {
        Ok(redis::Value::BulkString(b)) => String::from_utf8(b).unwrap(),
        other => panic!("CLUSTER MYID: {other:?}"),
    };
    let (from_id, to_id) = (
        id(on(from, &["CLUSTER", "MYID"]).await),
        id(on(to, &["CLUSTER", "MYID"]).await),
    );
    // Move it, as a resharding does (any counter in it deleted first).
    if let Ok(redis::Value::Array(keys)) =
        on(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]).await
    {
        for key in keys {
            if let redis::Value::BulkString(k) = key {
                on(from, &["DEL", &String::from_utf8(k).unwrap()])
                    .await
                    .unwrap();
            }
        }
    }
    on(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id])
        .await
        .unwrap();
    on(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id])
        .await
        .unwrap();
    for node in [to, from, &cluster.nodes[2]] {
        on(node, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id])
            .await
            .unwrap();
    }
    on(from, &["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await
        .unwrap();
    on(from, &["CONFIG", "SET", "maxmemory", "1"])
        .await
        .unwrap();
    let state = |name: &str| sluice.store_shard(name);
    common::eventually(
        Duration::from_secs(10),
        "the master out of memory reads down",
        || {
            let s = state(&from.addr())["state"].clone();
            async move { s == "backing_off" || s == "trying" }
        },
    )
    .await;
    let shard = state(&from.addr());
    assert_eq!(shard["last_error"]["kind"], "oom", "{shard}");
    assert_eq!(state(&to.addr())["state"], "up");
}

#[tokio::test]
async fn a_shard_backed_off_by_its_calls_reads_up_once_back_with_no_call() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    f.redis.kill();
    f.until_backed_off("connection").await;
    f.redis.restart().await;
    f.until_quiet_up().await;
}

/// A shard that starts refusing sluice's writes while no call reaches it answers
/// a PING through it: a failover that left the URL on the old master (now a
/// replica), `maxmemory` reached, a password set. The probe asks as a decide call
/// does, so the shard reads down with no call, the log naming it and Redis's
/// error, and up again with no call once the state is undone.
#[tokio::test]
async fn an_idle_shard_turned_replica_reads_down_and_back_up_with_no_call() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    let master = RedisServer::start().await;
    let port = master.port.to_string();
    f.admin(&["REPLICAOF", "127.0.0.1", &port]).await.unwrap();
    f.until_quiet_down("readonly").await;
    f.logged_down("READONLY You can't write against a read only replica");
    f.admin(&["REPLICAOF", "NO", "ONE"]).await.unwrap();
    f.until_quiet_up().await;
}

#[tokio::test]
async fn an_idle_shard_out_of_memory_reads_down_and_back_up_with_no_call() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    f.admin(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await
        .unwrap();
    f.admin(&["CONFIG", "SET", "maxmemory", "1"]).await.unwrap();
    f.until_quiet_down("oom").await;
    f.logged_down("OOM command not allowed");
    f.admin(&["CONFIG", "SET", "maxmemory", "0"]).await.unwrap();
    f.until_quiet_up().await;
}

#[tokio::test]
async fn an_idle_shard_that_starts_wanting_a_password_reads_down_and_back_up_with_no_call() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    // Connections opened before stay authenticated: close sluice's (not this one).
    f.admin(&["CONFIG", "SET", "requirepass", "rotated"])
        .await
        .unwrap();
    f.admin(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .await
        .unwrap();
    f.until_quiet_down("noauth").await;
    f.logged_down("NOAUTH");
    f.admin(&["CONFIG", "SET", "requirepass", ""])
        .await
        .unwrap();
    f.until_quiet_up().await;
}

/// Backed off by its calls' READONLY, the shard comes back within a probe's
/// interval of being undone, with no trial call (which, after a long outage,
/// would wait out a back-off of up to 5 s).
#[tokio::test]
async fn a_shard_backed_off_as_a_replica_reads_up_once_promoted_with_no_call() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut f) = Fault::start(&[]).await else {
        return;
    };
    let master = RedisServer::start().await;
    let port = master.port.to_string();
    f.admin(&["REPLICAOF", "127.0.0.1", &port]).await.unwrap();
    f.until_backed_off("readonly").await;
    f.admin(&["REPLICAOF", "NO", "ONE"]).await.unwrap();
    f.until_quiet_up().await;
}

/// `ROLE` of `node`: `master` or `slave` (or what stood in the way).
async fn role_of(node: &RedisServer) -> String {
    let asked = async {
        let mut conn = node.conn().await;
        redis::cmd("ROLE").query_async(&mut conn).await
    };
    match tokio::time::timeout(Duration::from_secs(1), asked).await {
        Ok(Ok(redis::Value::Array(items))) => match items.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

/// Waits (a minute at most) until `replica` has been promoted, and says when.
async fn promoted(replica: &RedisServer) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if role_of(replica).await == "master" {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{} never promoted",
            replica.addr()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Longest wait, once the cluster has promoted a stopped master's replica, until
/// sluice's calls for that master's slots are decided by it: the slot map is read
/// every 200 ms while a master is failing, and room for a loaded 2-core machine.
/// Sluice would otherwise learn of it only when the stopped master's back-off
/// (growing to 5 s) let a call through to time out.
const PROMOTED_BOUND: Duration = Duration::from_millis(600);

/// A master stopped (`SIGSTOP`: connections open, nothing answered, no `MOVED`) is
/// replaced by its replica once the cluster's node timeout passes; its slots are
/// decided again soon after, whether no call (a first master) or a steady stream of
/// them (a second one, backed off meanwhile) reaches sluice.
#[tokio::test]
async fn a_stopped_cluster_master_s_promoted_replica_decides_its_slots_soon() {
    let _one = ONE_AT_A_TIME.lock().await;
    if !available() {
        return;
    }
    // Three masters, each with a replica.
    let mut cluster = common::redis::RedisCluster::start(3).await;
    for master in 0..3 {
        cluster.add_replica(master).await;
    }
    let urls = cluster.urls()[..3].join(",");
    let timeout = format!("{}ms", STORE_TIMEOUT.as_millis());
    let sluice = common::Server::start(
        POLICY,
        &["--store-timeout", &timeout, "--redis-cluster", &urls],
    );
    let mut client = sluice.client().await;
    const USERS: usize = 30;
    let mut call = async |user: usize| {
        let req = common::request(
            "closed",
            vec![common::desc(&[("user", &format!("c{user}"))])],
        );
        common::call(&mut client, req).await.overall_code
    };
    for i in 0..USERS {
        decided(&sluice, &mut call, i, None, "before the fault").await;
    }
    let masters_named = || {
        let (_, body) = common::http(&sluice.http, "GET", "/debug/store", "");
        body
    };

    // No call: the map names the replica, and the first call is decided by it.
    let user = users_on(&cluster.nodes[0], USERS).await[0];
    cluster.nodes[0].freeze();
    let at = promoted(&cluster.nodes[3]).await;
    let replica = cluster.nodes[3].addr();
    while !masters_named().contains(&format!("\"name\":\"{replica}\"")) {
        assert!(
            at.elapsed() < PROMOTED_BOUND,
            "{replica} not taken for a master {:?} after its promotion: {}",
            at.elapsed(),
            masters_named()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let frozen = cluster.nodes[0].addr();
    decided(
        &sluice,
        &mut call,
        user,
        Some(&frozen),
        "on the promoted replica",
    )
    .await;

    // A call every 10 ms: answered by the failure mode while the master is stopped,
    // then decided by its replica.
    let user = users_on(&cluster.nodes[1], USERS).await[0];
    cluster.nodes[1].freeze();
    let stopped = Instant::now();
    let replica = &cluster.nodes[4];
    let mut at: Option<Instant> = None;
    let mut role_asked = Instant::now();
    loop {
        let code = call(user).await;
        if let Some(at) = at {
            if code == common::OK {
                break;
            }
            let waited = at.elapsed();
            assert!(
                waited < PROMOTED_BOUND,
                "user c{user} not decided {waited:?} after {} was promoted",
                replica.addr()
            );
        } else if role_asked.elapsed() >= Duration::from_millis(20) {
            role_asked = Instant::now();
            if role_of(replica).await == "master" {
                at = Some(Instant::now());
            }
            assert!(stopped.elapsed() < Duration::from_secs(60), "no promotion");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let frozen = cluster.nodes[1].addr();
    for _ in 0..10 {
        decided(&sluice, &mut call, user, Some(&frozen), "after the switch").await;
    }
    cluster.nodes[0].thaw();
    cluster.nodes[1].thaw();
}
