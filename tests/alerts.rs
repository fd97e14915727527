//! The shipped alerts (deploy/prometheus/sluice-rules.yaml) against a real Prometheus
//! scraping a real sluice every second: each alert's expression, its `for` left out,
//! is silent while the server is healthy and holds once its condition is caused for
//! real (a killed Redis, a refused password, a slow Redis, a flood of keys past
//! `--max-keys`, a refused policy, an expiring certificate, an attack). The promtool
//! tests (deploy/prometheus/tests) check the expressions' logic on series written by
//! hand; these check that the series, labels and values they read are the ones sluice
//! exports, from its first scrape on. The Helm chart's PrometheusRule carries the same
//! expressions (scripts/test-alerts.sh compares them).
//!
//! Needs `prometheus` (Debian's package, which scripts/test.sh installs): skipped
//! loudly without it, failed under `SLUICE_REQUIRE_TOOLS`.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::redis::{available, free_port, RedisServer};
use common::tls::{tls_flags, Ca, SecretVolume};
use common::tools;
use common::*;
use serde_json::Value;

/// Left out of the healthy checks: on a loaded test machine a debug build can take
/// over 10 ms on one of its first few calls, which is the whole p99 of a few calls.
/// [`a_slow_redis_fires_slow_decisions`] shows it firing when decisions are slow.
const SLOW: &str = "SluiceSlowDecisions";

/// How long an alert may take to fire once its condition holds: a scrape (1 s), the
/// traffic that causes it, and a loaded machine.
const FIRE: Duration = Duration::from_secs(30);

/// Each alert's expressions, by name: the rule file's, and the Helm chart's when
/// `helm` renders it (for a release whose job is `sluice` in namespace `default`, as
/// [`Prometheus`] scrapes).
fn alert_exprs() -> BTreeMap<String, Vec<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("deploy/prometheus/sluice-rules.yaml"))
        .expect("read the rules");
    let mut exprs = BTreeMap::new();
    add_exprs(&text, &mut exprs);
    let Some(helm) = binary("helm", "scripts/install-kube.sh installs it") else {
        return exprs;
    };
    let out = Command::new(helm)
        .args(["template", "sluice"])
        .arg(root.join("charts/sluice"))
        .args(["--kube-version", "1.30.0", "--namespace", "default"])
        .args([
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "fullnameOverride=sluice",
        ])
        .output()
        .expect("run helm");
    assert!(out.status.success(), "{}", tools::text(&out));
    let chart = add_exprs(&String::from_utf8_lossy(&out.stdout), &mut exprs);
    assert!(chart.contains(&"SluiceDown".to_string()), "{chart:?}");
    exprs
}

/// Adds the alerts of the PrometheusRule in the YAML stream `text` to `exprs`;
/// their names.
fn add_exprs(text: &str, exprs: &mut BTreeMap<String, Vec<String>>) -> Vec<String> {
    let docs = yaml_rust2::YamlLoader::load_from_str(text).expect("rules are YAML");
    let rule = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("PrometheusRule"))
        .expect("a PrometheusRule");
    let mut names = Vec::new();
    for group in rule["spec"]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            let name = rule["alert"].as_str().expect("alert").to_string();
            let expr = rule["expr"].as_str().expect("expr").to_string();
            exprs.entry(name.clone()).or_default().push(expr);
            names.push(name);
        }
    }
    names
}

/// `name` on PATH or in the Go bin directory; `None` (after a loud message) when it
/// is missing and not required.
fn binary(name: &str, install: &str) -> Option<PathBuf> {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([home.join("go/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("SLUICE_REQUIRE_TOOLS").is_none(),
            "SLUICE_REQUIRE_TOOLS is set but {name} is missing: {install}"
        );
        eprintln!("\n*** SKIPPED: {name} not found; {install} ***\n");
    }
    found
}

/// `prometheus`, or `None` after a loud message.
fn prometheus_binary() -> Option<PathBuf> {
    binary(
        "prometheus",
        "apt-get install prometheus (scripts/test.sh does)",
    )
}

/// One series of a query's answer: its labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// A real Prometheus on a loopback port, scraping sluices' `/metrics` every second
/// (job `sluice`), its data in a temporary directory; killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    exprs: BTreeMap<String, Vec<String>>,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts scraping `targets` (HTTP addresses), and waits until it has scraped
    /// each of them.
    async fn start(binary: &Path, targets: &[&str]) -> Prometheus {
        let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n  - job_name: sluice\n    static_configs:\n      - targets: [{}]\n        labels: {{namespace: default}}\n",
            list.join(", ")
        );
        // A port bound then released may be taken by another process first: then
        // again on another.
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("tempdir");
            let file = dir.path().join("prometheus.yml");
            std::fs::write(&file, &config).expect("write prometheus.yml");
            let addr = format!("127.0.0.1:{}", free_port());
            let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
            let child = Command::new(binary)
                .arg(format!("--config.file={}", file.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn prometheus");
            let mut p = Prometheus {
                child,
                addr,
                exprs: alert_exprs(),
                _dir: dir,
            };
            if p.ready().await {
                for t in targets {
                    p.scraped(t).await;
                }
                return p;
            }
        }
        panic!("prometheus did not start on any of 5 ports");
    }

    /// Whether it answers `/-/ready` within a while (false: it exited, or never did).
    async fn ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.child.try_wait().expect("wait").is_some() {
                return false;
            }
            if std::net::TcpStream::connect(&self.addr).is_ok()
                && http(&self.addr, "GET", "/-/ready", "").0 == 200
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// The instant query `expr`'s series now.
    fn query(&self, expr: &str) -> Vec<Sample> {
        use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
        let path = format!(
            "/api/v1/query?query={}",
            utf8_percent_encode(expr, NON_ALPHANUMERIC)
        );
        let (status, body) = http(&self.addr, "GET", &path, "");
        assert_eq!(status, 200, "{expr}: {body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        v["data"]["result"]
            .as_array()
            .expect("a vector")
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .expect("labels")
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect();
                let value = s["value"][1].as_str().expect("value").parse().expect("f64");
                (labels, value)
            })
            .collect()
    }

    /// What each expression of `alert` (the rule file's, the chart's) gives now.
    fn alert(&self, alert: &str) -> Vec<Vec<Sample>> {
        let exprs = self
            .exprs
            .get(alert)
            .unwrap_or_else(|| panic!("no alert {alert} in sluice-rules.yaml or the chart"));
        exprs.iter().map(|e| self.query(e)).collect()
    }

    /// Waits until a scrape of `target` that began after this call is stored, so that
    /// what was done before it shows in queries.
    async fn scraped(&self, target: &str) {
        let since = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let expr = format!("timestamp(up{{instance=\"{target}\"}} == 1)");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.query(&expr).iter().any(|(_, at)| *at > since + 0.001) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{target} not scraped: {:?}",
                self.query("up")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asserts that `alert`'s expression has no series now.
    fn silent(&self, alert: &str) {
        let now = self.alert(alert);
        assert!(now.iter().all(Vec::is_empty), "{alert} holds: {now:?}");
    }

    /// Asserts that every alert but `except` is silent now.
    fn all_silent_but(&self, except: &[&str]) {
        for alert in self.exprs.keys() {
            if !except.contains(&alert.as_str()) {
                self.silent(alert);
            }
        }
    }

    /// Runs `drive` (traffic that keeps the condition going) until `alert`'s
    /// expression has a series carrying `labels`; panics after [`FIRE`].
    async fn fires(&self, alert: &str, labels: &[(&str, &str)], mut drive: impl AsyncFnMut()) {
        let deadline = Instant::now() + FIRE;
        loop {
            drive().await;
            let now = self.alert(alert);
            let matches = |(l, _): &Sample| {
                labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            };
            if now.iter().all(|each| each.iter().any(matches)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{alert} did not fire with {labels:?}; it gives {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Nothing to keep going: the condition was caused once.
async fn idle() {}

/// `n` requests of `domain` with `key` set to `value(i)`, `each` times each, over
/// `POST /json`; the number denied.
fn hits(
    server: &Server,
    domain: &str,
    key: &str,
    n: usize,
    each: usize,
    value: impl Fn(usize) -> String,
) -> usize {
    let mut denied = 0;
    for i in 0..n {
        for _ in 0..each {
            let body = format!(
                r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"{key}","value":"{}"}}]}}]}}"#,
                value(i)
            );
            let (status, answer) = http(&server.http, "POST", "/json", &body);
            // 429: OVER_LIMIT, as Envoy's HTTP filter answers it.
            assert!(status == 200 || status == 429, "{status} {answer}");
            if status == 429 {
                denied += 1;
            }
        }
    }
    denied
}

const SIGNALS: &str = r#"
domain: web
descriptors:
  - key: remote_address
    sensitive: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
      # Denials past the third are bans: they count as denials all the same.
      penalty: {violations: 3, within: 1m, ban: 10m}
  - key: script
    rate_limit: {unit: second, requests_per_unit: 1000}
"#;

/// One client hammering a login rule is a deny ratio, not a page; thirty addresses of
/// one /24 each over the limit are a systemic denial, a denial spike and a subnet;
/// keys on a timer are regular keys.
#[tokio::test]
async fn denial_and_signal_alerts_fire_on_real_traffic() {
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let server = Server::start(SIGNALS, &[]);
    let prom = Prometheus::start(&binary, &[&server.http]).await;
    assert_eq!(
        hits(&server, "web", "remote_address", 5, 1, |i| format!(
            "192.0.2.{i}"
        )),
        0
    );
    prom.scraped(&server.http).await;
    prom.all_silent_but(&[SLOW]);

    // One client: denied, and nobody paged.
    assert_eq!(
        hits(&server, "web", "remote_address", 1, 30, |_| "6.6.6.6"
            .into()),
        29
    );
    prom.fires(
        "SluiceHighDenyRatio",
        &[("domain", "web"), ("rule", "remote_address")],
        idle,
    )
    .await;
    for alert in [
        "SluiceSystemicDenials",
        "SluiceSensitiveDenialSpike",
        "SluiceSubnetDenied",
    ] {
        prom.silent(alert);
    }

    // Thirty addresses of one /24, each denied five times.
    assert_eq!(
        hits(&server, "web", "remote_address", 30, 6, |i| format!(
            "10.1.2.{}",
            i + 1
        )),
        150
    );
    let rule = [("domain", "web"), ("rule", "remote_address")];
    prom.fires("SluiceSystemicDenials", &rule, idle).await;
    prom.fires("SluiceSensitiveDenialSpike", &rule, idle).await;
    prom.fires(
        "SluiceSubnetDenied",
        &[
            ("domain", "web"),
            ("rule", "remote_address"),
            ("subnet", "10.1.2.0/24"),
        ],
        idle,
    )
    .await;
    // Most of those denials were bans.
    let bans = prom.query("sum(sluice_penalty_active_bans)");
    assert_eq!(bans[0].1, 31.0, "{bans:?}");

    // Eight keys every 200 ms (five are enough), each on a timer of its own: scripts.
    let keys: Vec<(&Server, String)> = (0..8).map(|k| (&server, format!("job-{k}"))).collect();
    scripts(&keys).await;
    prom.fires(
        "SluiceRegularKeys",
        &[("domain", "web"), ("rule", "script")],
        idle,
    )
    .await;
}

/// Clients pinned to two replicas, each seeing twelve addresses of one /24: neither
/// replica alone has twenty, the job does. The alerts add the replicas' series up
/// (their `instance` and `rank` differ) and page once for the rule.
#[tokio::test]
async fn an_attack_split_over_two_replicas_pages_once() {
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let a = Server::start(SIGNALS, &[]);
    let b = Server::start(SIGNALS, &[]);
    let prom = Prometheus::start(&binary, &[&a.http, &b.http]).await;
    prom.all_silent_but(&[SLOW]);
    let denied_a = hits(&a, "web", "remote_address", 12, 6, |i| {
        format!("10.1.2.{}", i + 1)
    });
    let denied_b = hits(&b, "web", "remote_address", 12, 6, |i| {
        format!("10.1.2.{}", i + 13)
    });
    assert_eq!((denied_a, denied_b), (60, 60));
    let subnet = [
        ("domain", "web"),
        ("rule", "remote_address"),
        ("subnet", "10.1.2.0/24"),
    ];
    prom.fires("SluiceSubnetDenied", &subnet, idle).await;
    let rule = [("domain", "web"), ("rule", "remote_address")];
    prom.fires("SluiceSystemicDenials", &rule, idle).await;
    prom.fires("SluiceSensitiveDenialSpike", &rule, idle).await;
    for alert in [
        "SluiceSubnetDenied",
        "SluiceSystemicDenials",
        "SluiceSensitiveDenialSpike",
    ] {
        for each in prom.alert(alert) {
            assert_eq!(each.len(), 1, "{alert}: {each:?}");
            assert!(!each[0].0.contains_key("instance"), "{alert}: {each:?}");
        }
    }
    // It fires at twenty addresses; the scrape that brings the last four may come later.
    eventually(FIRE, "SluiceSubnetDenied at 24 addresses", || async {
        prom.alert("SluiceSubnetDenied")
            .iter()
            .all(|each| each.len() == 1 && each[0].1 == 24.0)
    })
    .await;
}

/// For each of `servers`, 22 requests of its `script` key 200 ms apart, through a
/// client of its own: a script on a timer, pinned to the replica it calls.
async fn scripts(servers: &[(&Server, String)]) {
    let mut running = Vec::new();
    for (server, key) in servers {
        let mut c = server.client().await;
        let key = key.clone();
        running.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            for _ in 0..22 {
                tick.tick().await;
                let r = call(&mut c, request("web", vec![desc(&[("script", &key)])])).await;
                assert_eq!(r.overall_code, OK);
            }
        }));
    }
    for r in running {
        r.await.expect("script");
    }
}

/// Five scripts pinned to two replicas, three on one and two on the other: neither
/// replica alone sees five keys on a timer, the job does. The alert adds the
/// replicas' counts up and raises one ticket for the rule.
#[tokio::test]
async fn scripts_pinned_to_two_replicas_count_once() {
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let a = Server::start(SIGNALS, &[]);
    let b = Server::start(SIGNALS, &[]);
    let prom = Prometheus::start(&binary, &[&a.http, &b.http]).await;
    prom.all_silent_but(&[SLOW]);
    let pinned: Vec<(&Server, String)> = (0..5)
        .map(|k| (if k < 3 { &a } else { &b }, format!("job-{k}")))
        .collect();
    scripts(&pinned).await;
    let rule = [("domain", "web"), ("rule", "script")];
    prom.fires("SluiceRegularKeys", &rule, idle).await;
    let by_replica = prom.query("sluice_regular_keys{rule=\"script\"}");
    let mut counts: Vec<f64> = by_replica.iter().map(|(_, n)| *n).collect();
    counts.sort_by(f64::total_cmp);
    assert_eq!(counts, [2.0, 3.0], "{by_replica:?}");
    for each in prom.alert("SluiceRegularKeys") {
        assert_eq!(each.len(), 1, "{each:?}");
        assert!(!each[0].0.contains_key("instance"), "{each:?}");
        assert_eq!(each[0].1, 5.0, "{each:?}");
    }
}

/// A refused policy edit fires at once, with its source; a job with no replica
/// scraped is down (the chart's SluiceDown).
#[tokio::test]
async fn a_refused_policy_edit_fires() {
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let mut server = Server::start(SIGNALS, &[]);
    let prom = Prometheus::start(&binary, &[&server.http]).await;
    prom.all_silent_but(&[SLOW]);
    write_atomic(
        &server.policy_path(),
        "domain: web\ndescriptors: [{key: a, oops: 1}]\n",
    );
    eventually(Duration::from_secs(10), "the edit refused", || async {
        server.metric("sluice_policy_refused", &[("source", "file")]) == Some(1.0)
    })
    .await;
    prom.fires("SluicePolicyReloadRefused", &[("source", "file")], idle)
        .await;
    // Superseded by a change that loads: the gauge falls, and the alert fires on, for
    // ten minutes, on the refusal counted.
    write_atomic(&server.policy_path(), SIGNALS);
    eventually(
        Duration::from_secs(10),
        "Prometheus sees the gauge fall",
        || {
            let down = !prom.query("max(sluice_policy_refused) == 0").is_empty();
            async move { down }
        },
    )
    .await;
    prom.fires("SluicePolicyReloadRefused", &[("source", "file")], idle)
        .await;

    // No replica scraped: the job is down. Only the chart has the alert (rendered
    // where helm is).
    if prom.exprs.contains_key("SluiceDown") {
        prom.silent("SluiceDown");
        server.child.kill().expect("kill sluice");
        let _ = server.child.wait();
        prom.fires("SluiceDown", &[], idle).await;
    }
}

/// The memory store at `--max-keys`: a flood of new keys is refused while every
/// counter is in use (answered by the failure mode, which does not page again as
/// failing over), and idle counters make room once their window has passed.
#[tokio::test]
async fn a_full_memory_store_fires_its_alerts() {
    let Some(binary) = prometheus_binary() else {
        return;
    };
    // Three hits leave a counter full again after 3 s, idle after 1 s.
    let policy = "domain: web\ndescriptors:\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 10}\n";
    let server = Server::start(policy, &["--max-keys", "64"]);
    let prom = Prometheus::start(&binary, &[&server.http]).await;
    hits(&server, "web", "path", 10, 1, |i| format!("/{i}"));
    prom.scraped(&server.http).await;
    prom.all_silent_but(&[SLOW]);

    let mut round = 0;
    let mut flood = async || {
        round += 1;
        hits(&server, "web", "path", 100, 3, |i| format!("/{round}/{i}"));
    };
    prom.fires("SluiceRefusingNewKeys", &[], &mut flood).await;
    // The refused keys are answered by the failure mode: one cause, one page.
    prom.silent("SluiceFailingOverStore");
    prom.fires("SluiceDroppingIdleCounters", &[], &mut flood)
        .await;
}

const STORE: &str = r#"
domain: web
failure_mode: open
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1000}
---
domain: shut
failure_mode: closed
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1000}
---
domain: local
failure_mode: local
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000}
"#;

/// Redis killed: domains answered by their failure mode, the shard failing, the
/// `local` domain decided in memory, and once its counters reach `--max-keys`, its
/// new keys refused, while the `closed` domain's denials still page.
#[tokio::test]
async fn store_alerts_fire_while_redis_is_down() {
    if !available() {
        return;
    }
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let mut redis = RedisServer::start().await;
    let server = Server::start(STORE, &["--redis", &redis.url(), "--max-keys", "64"]);
    let prom = Prometheus::start(&binary, &[&server.http]).await;
    hits(&server, "web", "ip", 10, 1, |i| format!("a{i}"));
    hits(&server, "local", "user", 10, 1, |i| format!("u{i}"));
    prom.scraped(&server.http).await;
    prom.all_silent_but(&[SLOW]);

    redis.kill();
    let mut traffic = async || {
        hits(&server, "web", "ip", 20, 1, |i| format!("a{i}"));
        hits(&server, "local", "user", 20, 1, |i| format!("u{i}"));
        // Denied by the closed failure mode, not by a limit.
        hits(&server, "shut", "ip", 20, 1, |i| format!("c{i}"));
    };
    prom.fires("SluiceFailingOverStore", &[("domain", "web")], &mut traffic)
        .await;
    prom.fires(
        "SluiceFailingOverStore",
        &[("domain", "shut")],
        &mut traffic,
    )
    .await;
    // An outage does not read as clients over their limits.
    for alert in ["SluiceHighDenyRatio", "SluiceSystemicDenials"] {
        prom.silent(alert);
    }
    prom.fires("SluiceDecidingLocally", &[], &mut traffic).await;
    prom.fires(
        "SluiceStoreErrors",
        &[("store", "redis"), ("shard", &redis.addr())],
        &mut traffic,
    )
    .await;
    prom.silent("SluiceStoreMisconfigured");
    prom.silent("SluiceLocalRefusingNewKeys");

    let mut round = 0;
    let mut new_keys = async || {
        round += 1;
        hits(&server, "local", "user", 100, 1, |i| format!("{round}-{i}"));
        hits(&server, "shut", "ip", 20, 1, |i| format!("c{i}"));
    };
    prom.fires("SluiceLocalRefusingNewKeys", &[], &mut new_keys)
        .await;
    // The refused keys explain failed_open answers only: the closed domain, denied
    // by its failure mode meanwhile, still pages as failing over.
    prom.fires(
        "SluiceFailingOverStore",
        &[("domain", "shut")],
        &mut new_keys,
    )
    .await;
    prom.fires("SluiceLocalRefusingNewKeys", &[], &mut new_keys)
        .await;
}

/// A Redis that refuses sluice's password pages once, as misconfigured, by kind.
#[tokio::test]
async fn a_refused_password_fires_store_misconfigured() {
    if !available() {
        return;
    }
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let redis = RedisServer::start_with(&["--requirepass", "s3cret"]).await;
    let server = Server::start(STORE, &["--redis", &redis.url()]);
    let prom = Prometheus::start(&binary, &[&server.http]).await;
    let mut traffic = async || {
        hits(&server, "web", "ip", 20, 1, |i| format!("a{i}"));
    };
    prom.fires(
        "SluiceStoreMisconfigured",
        &[
            ("store", "redis"),
            ("shard", &redis.addr()),
            ("kind", "noauth"),
        ],
        &mut traffic,
    )
    .await;
    prom.silent("SluiceFailingOverStore");
    prom.silent("SluiceStoreErrors");
}

/// A Redis whose certificate sluice does not trust pages as misconfigured, kind
/// `tls`.
#[tokio::test]
async fn an_untrusted_redis_certificate_fires_store_misconfigured() {
    if !available() {
        return;
    }
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let redis = RedisServer::start_tls().await;
    let url = format!("rediss://localhost:{}", redis.port);
    let server = Server::start(STORE, &["--redis", &url]);
    let prom = Prometheus::start(&binary, &[&server.http]).await;
    let mut traffic = async || {
        hits(&server, "web", "ip", 20, 1, |i| format!("a{i}"));
    };
    prom.fires(
        "SluiceStoreMisconfigured",
        &[("store", "redis"), ("kind", "tls")],
        &mut traffic,
    )
    .await;
    prom.silent("SluiceFailingOverStore");
    prom.silent("SluiceStoreErrors");
}

/// A Redis that answers, slowly: decisions wait for it, and p99 passes 10 ms.
#[tokio::test]
async fn a_slow_redis_fires_slow_decisions() {
    if !available() {
        return;
    }
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let redis = RedisServer::start_with(&["--enable-debug-command", "local"]).await;
    let server = Server::start(STORE, &["--redis", &redis.url()]);
    let prom = Prometheus::start(&binary, &[&server.http]).await;

    // Redis busy 50 ms at a time, over and over, on a connection of its own.
    let mut admin = redis.conn().await;
    let slow = tokio::spawn(async move {
        loop {
            let _: Result<(), _> = ::redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("0.05")
                .query_async(&mut admin)
                .await;
        }
    });
    let mut traffic = async || {
        let mut tasks = Vec::new();
        for t in 0..8 {
            let mut c = server.client().await;
            tasks.push(tokio::spawn(async move {
                for i in 0..5 {
                    call(
                        &mut c,
                        request("web", vec![desc(&[("ip", &format!("s{t}-{i}"))])]),
                    )
                    .await;
                }
            }));
        }
        for t in tasks {
            t.await.expect("client");
        }
    };
    prom.fires("SluiceSlowDecisions", &[], &mut traffic).await;
    slow.abort();
}

/// `date -u` of `at` as openssl's `YYYYMMDDHHMMSSZ`.
fn asn1_time(at: SystemTime) -> String {
    let secs = at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{secs}"), "+%Y%m%d%H%M%SZ"])
        .output()
        .expect("date");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A serving certificate a few seconds from its end warns, then pages once past it;
/// a renewal refused fires until a change loads.
#[tokio::test]
async fn tls_alerts_fire_on_real_certificates() {
    let Some(binary) = prometheus_binary() else {
        return;
    };
    let ca = Ca::new("test-ca");
    let now = SystemTime::now();
    let ends = ca.server_dated(
        &asn1_time(now - Duration::from_secs(3600)),
        &asn1_time(now + Duration::from_secs(25)),
    );
    let volume = SecretVolume::new(&ends, None);
    let flags = tls_flags("grpc", &volume.path("tls.crt"), &volume.path("tls.key"));
    let server = Server::start(
        SIGNALS,
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let prom = Prometheus::start(&binary, &[&server.http]).await;
    prom.fires("SluiceTLSCertificateExpiresSoon", &[("port", "grpc")], idle)
        .await;
    prom.silent("SluiceTLSCertificateExpired");
    prom.silent("SluiceTLSReloadRefused");
    prom.fires("SluiceTLSCertificateExpired", &[("port", "grpc")], idle)
        .await;
    prom.silent("SluiceTLSCertificateExpiresSoon");

    let expired = ca.server_dated("200101000000Z", "200201000000Z");
    volume.update(&expired, None);
    prom.fires("SluiceTLSReloadRefused", &[("port", "grpc")], idle)
        .await;
}
