//! Observability through the real binary: `/metrics` families, `/debug/top`,
//! `/debug/policies`, `/debug/store`, penalties, `--hash-keys`, quiet logs and JSON
//! logs, and the Grafana dashboard and Prometheus rules in `deploy/` against what
//! `/metrics` exports.

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use sluice::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

const POLICY: &str = r#"
domain: shop
descriptors:
  - key: remote_address
    layer: edge
    sensitive: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
      # A log, exact: the counts below are the same whenever they run.
      algorithm: sliding_window_log
      penalty: {violations: 3, within: 1m, ban: 10m}
  - key: tenant
    layer: tenant
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
"#;

fn metrics(server: &Server) -> String {
    let (status, body) = http(&server.http, "GET", "/metrics", "");
    assert_eq!(status, 200);
    body
}

fn json_get(server: &Server, path: &str) -> Value {
    let (status, body) = http(&server.http, "GET", path, "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("JSON body")
}

/// Sends `n` requests for one remote address; returns how many were OVER_LIMIT. They
/// take milliseconds, all within the limit's minute.
async fn hammer(server: &Server, ip: &str, n: usize) -> usize {
    let mut c = server.client().await;
    let mut denied = 0;
    for _ in 0..n {
        let r = call(
            &mut c,
            request("shop", vec![desc(&[("remote_address", ip)])]),
        )
        .await;
        if r.overall_code == OVER_LIMIT {
            denied += 1;
        }
    }
    denied
}

/// The metric names a text exposition carries (`# TYPE` lines and samples).
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let name = if let Some(rest) = line.strip_prefix("# TYPE ") {
            rest.split_whitespace().next()
        } else if line.starts_with('#') {
            None
        } else {
            line.split(['{', ' ']).next()
        };
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            names.insert(n.to_string());
        }
    }
    names
}

#[tokio::test]
async fn metrics_export_every_family_of_the_spec() {
    let server = Server::start(POLICY, &[]);
    assert_eq!(hammer(&server, "6.6.6.6", 8).await, 6);
    assert_eq!(hammer(&server, "10.0.0.1", 1).await, 0);
    let mut c = server.client().await;
    call(&mut c, request("nowhere", vec![desc(&[("a", "b")])])).await;
    call(&mut c, request("shop", vec![desc(&[("free", "x")])])).await;

    let text = metrics(&server);
    let names = exported_names(&text);
    for family in [
        "sluice_requests_total",
        "sluice_deny_ratio",
        "sluice_top_offenders",
        "sluice_recent_denials",
        "sluice_decision_seconds_bucket",
        "sluice_store_failures_total",
        "sluice_policy_reloads_total",
        "sluice_active_keys",
        "sluice_evictions_total",
        "sluice_penalty_bans_total",
        "sluice_penalty_active_bans",
        "sluice_unknown_domain_requests_total",
    ] {
        assert!(names.contains(family), "{family} missing from\n{text}");
    }
    // 9 decisions of remote_address, 6 denied (3 over the limit, then 3 banned).
    assert!(
        text.contains(r#"sluice_deny_ratio{domain="shop",rule="remote_address"} 0.666"#),
        "{text}"
    );
    assert!(text.contains(
        r#"sluice_top_offenders{domain="shop",key="6.6.6.6",rank="1",rule="remote_address"} 6"#
    ));
    assert!(text.contains(
        r#"sluice_requests_total{domain="shop",layer="edge",outcome="banned",rule="remote_address"} 3"#
    ));
    assert!(text.contains(
        r#"sluice_requests_total{domain="shop",layer="edge",outcome="over_limit",rule="remote_address"} 3"#
    ));
    assert!(text.contains(r#"sluice_penalty_bans_total{domain="shop",rule="remote_address"} 1"#));
    assert!(text.contains("sluice_penalty_active_bans 1"));
    assert!(text.contains(r#"sluice_store_failures_total{store="memory"} 0"#));
    assert!(text.contains(r#"sluice_policy_reloads_total{result="ok",source="file"} 1"#));
    assert!(text.contains(r#"sluice_policy_refused{source="file"} 0"#));
    // The process series dashboards made for envoyproxy/ratelimit chart.
    for family in ["process_resident_memory_bytes", "process_open_fds"] {
        let value = sample(&text, family, &[]).unwrap_or_else(|| panic!("{family} missing"));
        assert!(value > 0.0, "{family} {value}");
    }
    // Label sets are bounded: no value appears outside the top-offenders key.
    for line in text.lines().filter(|l| l.contains("10.0.0.1")) {
        assert!(line.starts_with("sluice_top_offenders"), "{line}");
    }

    // A refused reload is counted.
    write_atomic(
        &server.policy_path(),
        "domain: shop\ndescriptors: [{key: a, oops: 1}]\n",
    );
    eventually(Duration::from_secs(5), "refused reload counted", || async {
        metrics(&server).contains(r#"sluice_policy_reloads_total{result="error",source="file"} 1"#)
    })
    .await;
}

/// Every family `/metrics` exports is named in docs/observability.md, the page
/// operators read to know what a series means: a family added (or renamed) without
/// its line there fails here. The process families are named there too.
#[tokio::test]
async fn every_exported_family_is_in_the_observability_page() {
    let server = Server::start(POLICY, &[]);
    assert_eq!(hammer(&server, "6.6.6.6", 4).await, 2);
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/observability.md"),
    )
    .unwrap();
    let text = metrics(&server);
    let missing: Vec<String> = exported_names(&text)
        .into_iter()
        .map(|n| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(&n);
            family.to_string()
        })
        .filter(|family| {
            !page.contains(&format!("`{family}`")) && !page.contains(&format!("`{family}{{"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "exported but not in docs/observability.md: {missing:?}"
    );
}

#[tokio::test]
async fn banned_keys_are_denied_with_the_ban_as_retry_after() {
    let server = Server::start(POLICY, &["--response-headers", "draft03"]);
    let mut c = server.client().await;
    let mut last = None;
    for _ in 0..6 {
        last = Some(
            call(
                &mut c,
                request("shop", vec![desc(&[("remote_address", "6.6.6.6")])]),
            )
            .await,
        );
    }
    let r = last.unwrap();
    assert_eq!(r.overall_code, OVER_LIMIT);
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    // The ban is 10 minutes, far longer than the one-minute window.
    assert!(retry >= 590, "{retry}");
    // Another key is not banned.
    let other = call(
        &mut c,
        request("shop", vec![desc(&[("remote_address", "7.7.7.7")])]),
    )
    .await;
    assert_eq!(other.overall_code, OK);
}

#[tokio::test]
async fn debug_top_ranks_offenders_and_lists_bans() {
    let server = Server::start(POLICY, &[]);
    hammer(&server, "6.6.6.6", 10).await;
    hammer(&server, "5.5.5.5", 3).await;
    let mut c = server.client().await;
    for t in ["a", "a", "a", "b"] {
        call(&mut c, request("shop", vec![desc(&[("tenant", t)])])).await;
    }

    let top = json_get(&server, "/debug/top");
    assert_eq!(top["window_seconds"], 60);
    let rules = top["rules"].as_array().unwrap();
    let edge = rules
        .iter()
        .find(|r| r["rule"] == "remote_address")
        .expect("remote_address");
    assert_eq!(edge["domain"], "shop");
    assert_eq!(edge["top"][0]["rank"], 1);
    assert_eq!(edge["top"][0]["key"], "6.6.6.6");
    assert_eq!(edge["top"][0]["denials"], 8);
    assert_eq!(edge["top"][1]["key"], "5.5.5.5");
    assert_eq!(edge["top"][1]["denials"], 1);
    assert_eq!(edge["denied"], 9);
    assert_eq!(edge["decided"], 13);
    assert_eq!(edge["banned"][0]["key"], "6.6.6.6");
    assert!(edge["banned"][0]["remaining_seconds"].as_f64().unwrap() > 500.0);
    let tenant = rules.iter().find(|r| r["rule"] == "tenant").unwrap();
    assert_eq!(tenant["top"][0]["key"], "a");
    assert_eq!(tenant["top"][0]["denials"], 2);
    // Cost: the two admitted requests' hits.
    assert_eq!(tenant["spent"], 2);
    assert_eq!(tenant["refunded"], 0);
    assert_eq!(top["bans"].as_array().unwrap().len(), 1);

    // A charge of 5 past the limit is spent whole; a refund of 2 is given back.
    call(
        &mut c,
        request("shop", vec![desc_hits(&[("tenant", "c")], 5)]),
    )
    .await;
    let refund = RateLimitDescriptor {
        is_negative_hits: true,
        ..desc_hits(&[("tenant", "c")], 2)
    };
    call(&mut c, request("shop", vec![refund])).await;
    let top = json_get(&server, "/debug/top");
    let rules = top["rules"].as_array().unwrap();
    let tenant = rules.iter().find(|r| r["rule"] == "tenant").unwrap();
    assert_eq!(tenant["spent"], 7, "{tenant}");
    assert_eq!(tenant["refunded"], 2, "{tenant}");
    let edge = rules
        .iter()
        .find(|r| r["rule"] == "remote_address")
        .unwrap();
    assert_eq!(edge["refunded"], 0, "{edge}");
}

const USAGE: &str = r#"
domain: llm
descriptors:
  - key: api_key
    rate_limit: {algorithm: concurrency, requests_per_unit: 5, lease: 5m}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
"#;

/// Streams in flight and debt through the real server: N streams started at once
/// show as `sluice_in_flight` N, which falls once they end; what charges past the
/// limit leave a key owing shows as `sluice_debt`. Each gauge is read while the answers keep reporting its
/// level, so a slow machine cannot let the window pass before the scrape.
#[tokio::test]
async fn in_flight_and_debt_are_gauges_per_rule() {
    const N: usize = 3;
    let server = Server::start(USAGE, &["--peak-window", "1s"]);
    let labels = |rule| [("domain", "llm"), ("rule", rule)];
    // A stream takes a slot at its start (a cost of 1) and gives it back at its
    // end (a refund of 1), as Envoy's per-route rate limits send them.
    let start = || request("llm", vec![desc_hits(&[("api_key", "k1")], 1)]);
    let end = || {
        let refund = RateLimitDescriptor {
            is_negative_hits: true,
            ..desc_hits(&[("api_key", "k1")], 1)
        };
        request("llm", vec![refund])
    };
    let mut clients = Vec::new();
    for _ in 0..N {
        clients.push(server.client().await);
    }
    let answers = futures::future::join_all(clients.iter_mut().map(|c| call(c, start()))).await;
    assert!(answers.iter().all(|r| r.overall_code == OK));
    let c = &mut clients[0];
    let check = || request("llm", vec![desc_hits(&[("api_key", "k1")], 0)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // A check (cost 0) spends nothing and reports the slots in use.
        assert_eq!(call(c, check()).await.overall_code, OK);
        let seen = server.metric("sluice_in_flight", &labels("api_key"));
        if seen == Some(N as f64) {
            break;
        }
        assert!(Instant::now() < deadline, "in flight: {seen:?}, not {N}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.metric("sluice_in_flight", &labels("tokens")), None);

    for _ in 0..N {
        assert_eq!(call(c, end()).await.overall_code, OK);
    }
    eventually(Duration::from_secs(10), "in flight back to 0", || async {
        server.metric("sluice_in_flight", &labels("api_key")) == Some(0.0)
    })
    .await;

    // Two charges of 25 tokens on a limit of 10 per minute: both spent, and the key
    // owes 40. A fresh key each round, so the gauge never shows more (two charges
    // split by the minute's end owe 15 each).
    let charge = |key: &str| request("llm", vec![desc_hits(&[("tokens", key)], 25)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    for round in 0.. {
        let key = format!("k{round}");
        for _ in 0..2 {
            assert_eq!(call(c, charge(&key)).await.overall_code, OVER_LIMIT);
        }
        let seen = server.metric("sluice_debt", &labels("tokens"));
        if seen == Some(40.0) {
            break;
        }
        assert!(Instant::now() < deadline, "debt: {seen:?}, not 40");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.metric("sluice_debt", &labels("api_key")), None);
}

/// Through the gRPC port: 30 addresses of one /24, each denied once, rank their
/// subnet first in `/debug/signals` and `sluice_top_subnets`; the limits show as
/// `sluice_limit`.
#[tokio::test]
async fn debug_signals_ranks_a_subnet_of_quiet_offenders() {
    let server = Server::start(POLICY, &[]);
    // 2 a minute: each address's third call is denied.
    for i in 0..30 {
        hammer(&server, &format!("10.9.8.{i}"), 3).await;
    }
    hammer(&server, "6.6.6.6", 4).await;
    let signals = json_get(&server, "/debug/signals");
    assert_eq!(signals["regular"]["intervals"], 20);
    let edge = signals["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "remote_address")
        .expect("remote_address");
    assert_eq!(edge["subnets_by_denials"][0]["subnet"], "10.9.8.0/24");
    assert_eq!(edge["subnets_by_denials"][0]["denials"], 30);
    assert_eq!(edge["subnets_by_addresses"][0]["addresses"], 30);
    assert_eq!(edge["subnets_by_denials"][1]["subnet"], "6.6.6.0/24");
    let text = metrics(&server);
    assert!(
        text.contains(r#"sluice_top_subnets{domain="shop",rank="1",rule="remote_address",subnet="10.9.8.0/24"} 30"#),
        "{text}"
    );
    assert!(text.contains(
        r#"sluice_limit{algorithm="sliding_window_log",descriptor="remote_address",domain="shop",rule="remote_address"} 2"#
    ));
    assert!(text.contains(
        r#"sluice_limit_window_seconds{algorithm="sliding_window_log",descriptor="remote_address",domain="shop",rule="remote_address"} 60"#
    ));
}

#[tokio::test]
async fn hash_keys_hides_raw_values_in_top_offenders() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    // A Secret mounted as a file often ends in a newline: it is not part of the key.
    std::fs::write(&secret, "a shared secret of the replicas\n").unwrap();
    let server = Server::start(
        POLICY,
        &[
            "--hash-keys",
            "--hash-secret-file",
            secret.to_str().unwrap(),
        ],
    );
    hammer(&server, "6.6.6.6", 5).await;
    let top = json_get(&server, "/debug/top");
    let key = top["rules"][0]["top"][0]["key"]
        .as_str()
        .unwrap()
        .to_string();
    // The keyed hash every replica with this secret computes, and nobody without it.
    let mut keyed = String::new();
    sluice::hash::ValueHash::from_secret(b"a shared secret of the replicas")
        .unwrap()
        .push_hex(&mut keyed, b"6.6.6.6");
    assert_eq!(key, keyed);
    assert_eq!(top["bans"][0]["key"], key.as_str());
    let text = metrics(&server);
    assert!(!text.contains("6.6.6.6"));
    assert!(text.contains(&format!("key=\"{key}\"")));
    let (_, body) = http(&server.http, "GET", "/debug/top", "");
    assert!(!body.contains("6.6.6.6"));
    let (_, body) = http(&server.http, "GET", "/debug/signals", "");
    assert!(!body.contains("6.6.6"), "{body}");
    assert!(body.contains("subnets_by_denials"), "{body}");
}

#[tokio::test]
async fn debug_policies_shows_sources_rules_and_status() {
    let server = Server::start(POLICY, &[]);
    let p = json_get(&server, "/debug/policies");
    let policies = p["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 1);
    let one = &policies[0];
    assert!(one["source"].as_str().unwrap().ends_with("policy.yaml"));
    assert_eq!(one["origin"], "file");
    assert_eq!(one["form"], "envoy");
    assert_eq!(one["domain"], "shop");
    assert_eq!(one["status"]["state"], "loaded");
    let rules: Vec<&str> = one["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(rules, vec!["remote_address", "tenant", "free"]);
    // Each rule of the top-level list names its domain: paths repeat across domains.
    let tops: Vec<(&str, &str)> = p["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["domain"].as_str().unwrap(), r["path"].as_str().unwrap()))
        .collect();
    assert!(tops.contains(&("shop", "tenant")), "{tops:?}");
    assert!(tops.iter().all(|(d, _)| *d == "shop"), "{tops:?}");
}

/// Rules of one path (a key's default and a value's own, a list's limits) are told
/// apart by the descriptor they match, as envoyproxy/ratelimit names it.
#[tokio::test]
async fn debug_policies_tells_apart_the_rules_of_one_path() {
    let server = Server::start(
        r#"
domain: shop
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: remote_address
    value: "10.*"
    rate_limit: {unlimited: true}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limits:
          - {unit: second, requests_per_unit: 5}
          - {unit: day, requests_per_unit: 1000}
"#,
        &[],
    );
    let p = json_get(&server, "/debug/policies");
    let mut rules: Vec<(String, String, Value)> = p["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |f: &str| r[f].as_str().unwrap().to_string();
            (s("path"), s("stat_key"), r["requests_per_unit"].clone())
        })
        .collect();
    rules.sort_by(|a, b| (&a.1, a.2.as_u64()).cmp(&(&b.1, b.2.as_u64())));
    let want = [
        ("remote_address", "remote_address", 600),
        ("remote_address", "remote_address_10.*", 0),
        ("tenant/plan", "tenant.plan_free", 5),
        ("tenant/plan", "tenant.plan_free", 1000),
    ];
    let got: Vec<(&str, &str, u64)> = rules
        .iter()
        .map(|(p, k, n)| (p.as_str(), k.as_str(), n.as_u64().unwrap()))
        .collect();
    assert_eq!(got, want);
}

/// A refused edit shows: the file's documents serve their last good version, and
/// the refusal says why, until the file is fixed.
#[tokio::test]
async fn debug_policies_shows_a_refused_file_edit_until_it_is_fixed() {
    let server = Server::start(POLICY, &[]);
    write_atomic(
        &server.policy_path(),
        "domain: shop\ndescriptors:\n  - key: [\n",
    );
    let mut p = Value::Null;
    eventually(Duration::from_secs(10), "the refusal shown", || {
        p = json_get(&server, "/debug/policies");
        let refused = p["refused"].as_array().is_some_and(|r| !r.is_empty());
        async move { refused }
    })
    .await;
    assert_eq!(p["refused"][0]["source"], "file", "{p}");
    let error = p["refused"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("policy.yaml:"), "{p}");
    let shop = &p["policies"][0];
    assert_eq!(shop["domain"], "shop", "{p}");
    assert_eq!(shop["status"]["state"], "last_good", "{p}");
    assert_eq!(shop["status"]["error"], error, "{p}");

    write_atomic(&server.policy_path(), POLICY);
    eventually(Duration::from_secs(10), "the refusal gone", || {
        let p = json_get(&server, "/debug/policies");
        let loaded = p["policies"][0]["status"]["state"] == "loaded"
            && p["refused"].as_array().is_some_and(Vec::is_empty);
        async move { loaded }
    })
    .await;
}

#[tokio::test]
async fn debug_policies_tells_resources_in_files_from_plain_documents() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.yaml");
    let resource = dir.path().join("resource.yaml");
    std::fs::write(&plain, POLICY).unwrap();
    std::fs::write(
        &resource,
        "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\n\
         metadata: {name: checkout, namespace: shop}\n\
         spec:\n  domain: edge\n  descriptors:\n\
         \x20   - key: user\n      rateLimit: {unit: minute, requestsPerUnit: 5}\n",
    )
    .unwrap();
    let server = Server::start_with(dir, &[plain, resource], &[]);
    let p = json_get(&server, "/debug/policies");
    let policies = p["policies"].as_array().unwrap();
    let edge = policies
        .iter()
        .find(|p| p["domain"] == "edge")
        .unwrap_or_else(|| panic!("{p}"));
    assert_eq!(edge["form"], "RateLimitPolicy");
    assert_eq!(edge["origin"], "file");
    assert_eq!(edge["resource"], "shop/checkout");
    assert_eq!(edge["rules"], serde_json::json!(["user"]));
    assert_eq!(edge["status"]["state"], "loaded");
}

#[tokio::test]
async fn debug_store_says_the_memory_store_is_in_memory() {
    let server = Server::start(POLICY, &[]);
    let s = json_get(&server, "/debug/store");
    assert_eq!(s["store"], "memory", "{s}");
    let shards = s["shards"].as_array().expect("shards");
    assert_eq!(shards.len(), 1, "{s}");
    assert_eq!(shards[0]["name"], "local", "{s}");
    assert_eq!(shards[0]["state"], "in_memory", "{s}");
    assert!(shards[0]["last_error"].is_null(), "{s}");
    assert!(shards[0]["backoff_until"].is_null(), "{s}");
}

#[tokio::test]
async fn a_burst_of_requests_logs_nothing_at_info() {
    let server = Server::start(POLICY, &[]);
    // Every start-up line read and dropped.
    server.lines_until_reload().await;
    hammer(&server, "6.6.6.6", 200).await;
    hammer(&server, "10.9.8.7", 50).await;
    let mut c = server.client().await;
    for i in 0..50 {
        call(
            &mut c,
            request("shop", vec![desc(&[("tenant", &format!("t{i}"))])]),
        )
        .await;
    }
    http(
        &server.http,
        "POST",
        "/json",
        r#"{"domain":"shop","descriptors":[{"entries":[{"key":"tenant","value":"x"}]}]}"#,
    );
    metrics(&server);
    let lines = server.lines_until_reload().await;
    assert!(lines.is_empty(), "log lines during a burst: {lines:?}");

    // A policy change is logged.
    write_atomic(
        &server.policy_path(),
        &POLICY.replace("requests_per_unit: 1}", "requests_per_unit: 5}"),
    );
    server
        .wait_line(Duration::from_secs(5), "a policy change is logged", |l| {
            l.contains("policy reloaded")
        })
        .await;
}

#[test]
fn log_format_json_prints_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, POLICY).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("serve")
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--reload-interval", "100ms", "--log-format", "json"])
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut http_addr = None;
    while Instant::now() < deadline && http_addr.is_none() {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        let v: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["fields"]["message"] == "sluice listening" {
            http_addr = v["fields"]["http"].as_str().map(str::to_string);
        }
        lines.push(v);
    }
    let http_addr = http_addr.expect("listening line");
    assert!(lines
        .iter()
        .all(|v| v["level"].is_string() && v["timestamp"].is_string()));

    // A policy change: one JSON line; requests: none.
    write_atomic(
        &path,
        &POLICY.replace("requests_per_unit: 1}", "requests_per_unit: 3}"),
    );
    for _ in 0..20 {
        http(
            &http_addr,
            "POST",
            "/json",
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"tenant","value":"x"}]}]}"#,
        );
    }
    let mut after = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            let v: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            let reloaded = v["fields"]["message"] == "policy reloaded from files";
            after.push(v);
            if reloaded {
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0]["fields"]["message"], "policy reloaded from files");
}

/// Every `expr` string anywhere in a JSON document.
fn json_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => json_exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| json_exprs(i, out)),
        _ => {}
    }
}

/// The `sluice_*` metric names a PromQL expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("sluice_") {
        let start = i + at;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary {
            names.insert(expr[start..end].to_string());
        }
        i = end;
    }
    names
}

/// A rule's series exist at 0 from the moment its policy serves, for the outcomes it
/// can have: its first request counts in `rate()` and `increase()`, which miss a
/// series that first appears at 1. A rule a reload removed leaves `/metrics`.
#[tokio::test]
async fn a_rules_series_start_at_zero_and_leave_with_the_rule() {
    let server = Server::start(POLICY, &[]);
    let requests = |text: &str| -> BTreeSet<String> {
        text.lines()
            .filter(|l| l.starts_with("sluice_requests_total{"))
            .map(str::to_string)
            .collect()
    };
    let series = |layer: &str, outcome: &str, rule: &str| {
        format!(
            r#"sluice_requests_total{{domain="shop",layer="{layer}",outcome="{outcome}",rule="{rule}"}} 0"#
        )
    };
    let before = requests(&metrics(&server));
    // A limited rule with a penalty, in a domain that leaves the failure mode to
    // --failure-mode: decided, denied, banned, or answered by either failure mode.
    for outcome in ["ok", "over_limit", "banned", "failed_open", "failed_closed"] {
        let s = series("edge", outcome, "remote_address");
        assert!(before.contains(&s), "{s} missing: {before:?}");
    }
    // An unlimited rule is only ever decided OK.
    let expected: BTreeSet<String> = [
        series("edge", "ok", "remote_address"),
        series("edge", "over_limit", "remote_address"),
        series("edge", "banned", "remote_address"),
        series("edge", "failed_open", "remote_address"),
        series("edge", "failed_closed", "remote_address"),
        series("tenant", "ok", "tenant"),
        series("tenant", "over_limit", "tenant"),
        series("tenant", "failed_open", "tenant"),
        series("tenant", "failed_closed", "tenant"),
        series("service", "ok", "free"),
    ]
    .into();
    assert_eq!(before, expected);

    let without_tenant = POLICY.replace(
        "  - key: tenant\n    layer: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
        "",
    );
    assert_ne!(without_tenant, POLICY);
    write_atomic(&server.policy_path(), &without_tenant);
    eventually(Duration::from_secs(10), "tenant gone", || {
        let text = metrics(&server);
        let gone = !text.contains(r#"rule="tenant""#);
        async move { gone }
    })
    .await;
    let after = requests(&metrics(&server));
    assert!(
        after.contains(&series("edge", "ok", "remote_address")),
        "{after:?}"
    );
    assert!(
        after.contains(&series("service", "ok", "free")),
        "{after:?}"
    );
}

/// With `--prometheus-addr`, envoyproxy/ratelimit's series of a limit a reload
/// removed leave both metrics ports, as sluice's own series of its rule do; a limit
/// that stays keeps its count.
#[tokio::test]
async fn envoyproxy_ratelimit_series_of_a_removed_limit_leave_with_it() {
    let server = Server::start(POLICY, &["--prometheus-addr", "127.0.0.1:0"]);
    let prometheus = server.prometheus_addr();
    let mut c = server.client().await;
    call(&mut c, request("shop", vec![desc(&[("tenant", "t")])])).await;
    call(
        &mut c,
        request("shop", vec![desc(&[("remote_address", "10.0.0.1")])]),
    )
    .await;
    let scrapes = || {
        let (_, own) = http(&prometheus, "GET", "/metrics", "");
        [metrics(&server), own]
    };
    let hits = |text: &str, key1: &str| {
        sample(
            text,
            "ratelimit_service_rate_limit_total_hits",
            &[("domain", "shop"), ("key1", key1), ("key2", "")],
        )
    };
    for text in scrapes() {
        assert_eq!(hits(&text, "tenant"), Some(1.0), "{text}");
        assert_eq!(hits(&text, "remote_address"), Some(1.0), "{text}");
    }

    let without_tenant = POLICY.replace(
        "  - key: tenant\n    layer: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
        "",
    );
    assert_ne!(without_tenant, POLICY);
    write_atomic(&server.policy_path(), &without_tenant);
    eventually(
        Duration::from_secs(10),
        "the tenant limit's series gone",
        || {
            let gone = scrapes().iter().all(|t| !t.contains(r#"key1="tenant""#));
            async move { gone }
        },
    )
    .await;
    for text in scrapes() {
        assert!(!text.contains(r#"rule="tenant""#), "{text}");
        assert_eq!(hits(&text, "remote_address"), Some(1.0), "{text}");
    }
}

#[tokio::test]
async fn dashboard_and_alerts_use_only_exported_metrics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/sluice-dashboard.json")).unwrap(),
    )
    .expect("dashboard is JSON");
    let mut exprs = Vec::new();
    json_exprs(&dashboard["panels"], &mut exprs);
    let dashboard_names: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    // Each series is read from the jobs the dashboard's `job` variable selects, so
    // two deployments scraped by one Prometheus are not added together.
    for e in &exprs {
        let selected = e.matches("sluice_").count();
        assert_eq!(e.matches("{job=~\"$job\"").count(), selected, "{e}");
    }
    for needed in [
        "sluice_deny_ratio",
        "sluice_top_offenders",
        "sluice_decision_seconds_bucket",
        "sluice_store_errors_total",
        "sluice_policy_reloads_total",
        "sluice_limit",
        "sluice_near_limit_total",
        "sluice_denial_spike_ratio",
        "sluice_regular_keys",
        "sluice_top_subnets",
        "sluice_degraded",
        "sluice_store_failures_total",
        "sluice_local_decisions_total",
        "sluice_local_refused_total",
        "sluice_local_unsettled_counters",
        "sluice_tls_certificate_expiry_timestamp_seconds",
        "sluice_tls_reloads_total",
        "sluice_tls_refused",
        "sluice_rlqs_streams",
        "sluice_rlqs_assignments_total",
    ] {
        assert!(dashboard_names.contains(needed), "dashboard lacks {needed}");
    }
    // Counts each replica makes of what it decided add up over the job, as the
    // alerts read them (SluiceSubnetDenied, SluiceRegularKeys): a panel showing the
    // busiest replica's would show less than the alert that pages on the rule.
    for e in &exprs {
        for family in [
            "sluice_top_offenders",
            "sluice_top_subnets",
            "sluice_top_subnet_addresses",
            "sluice_regular_keys",
            "sluice_recent_denials",
        ] {
            if metric_names(e).contains(family) {
                assert!(
                    e.starts_with("sum by ("),
                    "{family} not summed over replicas: {e}"
                );
            }
        }
    }

    let rules_text =
        std::fs::read_to_string(root.join("deploy/prometheus/sluice-rules.yaml")).unwrap();
    let docs = yaml_rust2::YamlLoader::load_from_str(&rules_text).expect("rules are YAML");
    let doc = &docs[0];
    assert_eq!(doc["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(doc["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    let mut alert_names = BTreeSet::new();
    let mut alert_exprs = Vec::new();
    for group in doc["spec"]["groups"].as_vec().expect("groups") {
        assert!(group["name"].as_str().is_some());
        for rule in group["rules"].as_vec().expect("rules") {
            let alert = rule["alert"].as_str().expect("alert name");
            assert!(rule["labels"]["severity"].as_str().is_some(), "{alert}");
            assert!(rule["annotations"]["summary"].as_str().is_some(), "{alert}");
            alert_names.insert(alert.to_string());
            alert_exprs.push(rule["expr"].as_str().expect("expr").to_string());
        }
    }
    for needed in [
        "SluiceSystemicDenials",
        "SluiceStoreErrors",
        "SluiceRefusingNewKeys",
        "SluicePolicyReloadRefused",
        "SluiceSensitiveDenialSpike",
        "SluiceSubnetDenied",
        "SluiceRegularKeys",
        "SluiceFailingOverStore",
        "SluiceHighDenyRatio",
        "SluiceDecidingLocally",
        "SluiceLocalRefusingNewKeys",
    ] {
        assert!(alert_names.contains(needed), "missing alert {needed}");
    }
    // The denial alert looks at many keys, never at one: it needs the top offender's
    // share to be small and several distinct offenders, each counted over replicas.
    let systemic = &alert_exprs[0];
    assert!(
        systemic.contains("max by (job, domain, rule) (sum by (job, domain, rule, key) (sluice_top_offenders))")
            && systemic.contains("count by (job, domain, rule) (count by (job, domain, rule, key) (sluice_top_offenders))"),
        "{systemic}"
    );
    let alert_metric_names: BTreeSet<String> =
        alert_exprs.iter().flat_map(|e| metric_names(e)).collect();

    // Every name both files use is exported by the real server once it has traffic.
    let server = Server::start(POLICY, &[]);
    hammer(&server, "6.6.6.6", 8).await;
    let exported = exported_names(&metrics(&server));
    // The TLS series exist only where a port serves TLS; tests/tls.rs reads both
    // from a server that does.
    let with_tls = [
        "sluice_tls_certificate_expiry_timestamp_seconds",
        "sluice_tls_reloads_total",
        "sluice_tls_refused",
    ];
    // The RLQS series by domain exist once an Envoy reported; tests/rlqs.rs reads
    // them from a server that had one.
    let with_rlqs = ["sluice_rlqs_reports_total", "sluice_rlqs_assignments_total"];
    for name in dashboard_names.iter().chain(&alert_metric_names) {
        if with_tls.contains(&name.as_str()) || with_rlqs.contains(&name.as_str()) {
            continue;
        }
        assert!(
            exported.contains(name),
            "{name} is not exported; exported: {exported:?}"
        );
    }
}

/// Without a scrape of /metrics (no Prometheus, or a long scrape interval), a full
/// store's refusals are logged all the same, within a second or so.
#[tokio::test]
async fn a_full_memory_store_is_logged_without_a_scrape() {
    let server = Server::start(POLICY, &["--max-keys", "64"]);
    let mut c = server.client().await;
    for i in 0..200 {
        call(
            &mut c,
            request("shop", vec![desc(&[("tenant", &format!("t{i}"))])]),
        )
        .await;
    }
    server
        .wait_line(Duration::from_secs(5), "the full store logged", |l| {
            l.contains("WARN") && l.contains("new keys answered by the failure mode")
        })
        .await;
}

#[tokio::test]
async fn a_full_memory_store_is_logged_once_as_a_state_change() {
    let server = Server::start(POLICY, &["--max-keys", "64"]);
    server.lines_until_reload().await;
    let mut c = server.client().await;
    for i in 0..500 {
        call(
            &mut c,
            request("shop", vec![desc(&[("tenant", &format!("t{i}"))])]),
        )
        .await;
    }
    let text = metrics(&server);
    // One counter a shard, each in use for its minute: every key past those the
    // shards hold is refused, none is dropped.
    let value = |text: &str, series: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(series)).expect(series);
        line[series.len()..].trim().parse().expect("a count")
    };
    let refused = r#"sluice_evictions_total{reason="refused"}"#;
    let held = value(&text, r#"sluice_active_keys{store="memory"}"#);
    assert!((60..=64).contains(&held), "{text}");
    assert_eq!(value(&text, refused), 500 - held, "{text}");
    assert_eq!(value(&text, r#"sluice_evictions_total{reason="idle"}"#), 0);
    // A second scrape while still refusing logs nothing new.
    for i in 500..600 {
        call(
            &mut c,
            request("shop", vec![desc(&[("tenant", &format!("t{i}"))])]),
        )
        .await;
    }
    assert!(value(&metrics(&server), refused) > 500 - held);
    // Logged once, as the refusals start.
    let lines = server
        .wait_line(Duration::from_secs(5), "the full store logged", |l| {
            l.contains("new keys answered by the failure mode")
        })
        .await;
    assert!(lines.last().unwrap().contains("WARN"), "{lines:?}");
    // Refusals going on, scraped or not, log nothing more.
    for i in 600..700 {
        call(
            &mut c,
            request("shop", vec![desc(&[("tenant", &format!("t{i}"))])]),
        )
        .await;
    }
    metrics(&server);
    let lines = server.lines_until_reload().await;
    assert!(lines.is_empty(), "{lines:?}");
}

#[tokio::test]
async fn a_flood_of_distinct_denied_keys_keeps_label_sets_bounded() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    for i in 0..300 {
        let t = format!("tenant-{i}");
        for _ in 0..2 {
            call(&mut c, request("shop", vec![desc(&[("tenant", &t)])])).await;
        }
    }
    let text = metrics(&server);
    let offenders = text
        .lines()
        .filter(|l| l.starts_with("sluice_top_offenders{"))
        .count();
    assert_eq!(offenders, 10, "{text}");
    // No other series carries a request value.
    assert_eq!(
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains("tenant-"))
            .count(),
        10
    );
    assert!(
        text.contains(r#"sluice_deny_ratio{domain="shop",rule="tenant"} 0.5"#),
        "{text}"
    );
    let top = json_get(&server, "/debug/top");
    assert_eq!(top["rules"][0]["top"].as_array().unwrap().len(), 10);
}

/// A decision through `POST /json` is traced as a `ShouldRateLimit` call is: the
/// same span, with the same `ratelimit.*` attributes, the child of the call's
/// `traceparent`, exported over OTLP; a call whose parent was not sampled exports
/// nothing, and a refused body's span says why, without an error status.
#[tokio::test]
async fn a_json_decision_is_traced_as_a_grpc_one_is() {
    use common::otlp::{attr, hex, Receiver};
    use opentelemetry_proto::tonic::trace::v1::{span, status::StatusCode, Span};

    let receiver = Receiver::start().await;
    let server = receiver.serve(POLICY, &[]);
    let parent = |trace: &str| format!("00-{trace}-00f067aa0ba902b7-01");
    const GRPC: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const JSON: &str = "5ce929d0e0e47364bf92f3577b34da6a";
    const UNSAMPLED: &str = "6e47364bf92f3577b34da6a5ce929d0e";
    const REFUSED: &str = "7b34da6a5ce929d0e6e47364bf92f357";
    const GRPC_REFUSED: &str = "8b34da6a5ce929d0e6e47364bf92f357";

    // The tenant's limit is 1 a minute: each second call is over it.
    let mut c = server.client().await;
    for _ in 0..2 {
        let mut req = tonic::Request::new(request("shop", vec![desc(&[("tenant", "g")])]));
        let traceparent = parent(GRPC).parse().unwrap();
        req.metadata_mut().insert("traceparent", traceparent);
        c.should_rate_limit(req).await.expect("ShouldRateLimit");
    }
    // A request without a domain is refused: INVALID_ARGUMENT.
    let mut req = tonic::Request::new(request("", vec![desc(&[("tenant", "g")])]));
    req.metadata_mut()
        .insert("traceparent", parent(GRPC_REFUSED).parse().unwrap());
    let refusal = c.should_rate_limit(req).await.unwrap_err();
    assert_eq!(refusal.code(), tonic::Code::InvalidArgument);
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"tenant","value":"j"}]}]}"#;
    let unsampled = format!("00-{UNSAMPLED}-00f067aa0ba902b7-00");
    let (status, _) = http_with(
        &server.http,
        "POST",
        "/json",
        &[("traceparent", &unsampled)],
        body,
    );
    assert_eq!(status, 200, "decided as usual");
    let (status, _) = http_with(
        &server.http,
        "POST",
        "/json",
        &[("traceparent", &parent(JSON))],
        body,
    );
    assert_eq!(status, 429);
    let (status, _) = http_with(
        &server.http,
        "POST",
        "/json",
        &[("traceparent", &parent(REFUSED))],
        "{",
    );
    assert_eq!(status, 400);

    let of = |spans: &[Span], trace: &str| -> Vec<Span> {
        spans
            .iter()
            .filter(|s| hex(&s.trace_id) == trace)
            .cloned()
            .collect()
    };
    let spans = receiver
        .wait(
            Duration::from_secs(20),
            "spans of both gRPC calls and both traced /json calls",
            |s| {
                of(s, GRPC).len() == 2
                    && of(s, JSON).len() == 1
                    && of(s, REFUSED).len() == 1
                    && of(s, GRPC_REFUSED).len() == 1
            },
        )
        .await;
    assert!(
        of(&spans, UNSAMPLED).is_empty(),
        "an unsampled parent's call is not exported"
    );
    let grpc = of(&spans, GRPC)
        .into_iter()
        .find(|s| attr(&s.attributes, "ratelimit.outcome").as_deref() == Some("over_limit"))
        .expect("the gRPC call over the limit");
    let json = &of(&spans, JSON)[0];
    assert_eq!(json.name, grpc.name);
    assert_eq!(
        json.name,
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    assert_eq!(json.kind, span::SpanKind::Server as i32);
    assert_eq!(hex(&json.parent_span_id), "00f067aa0ba902b7");
    let decision = |s: &Span| -> Vec<(String, Option<String>)> {
        let mut keys: Vec<String> = s
            .attributes
            .iter()
            .map(|kv| kv.key.clone())
            .filter(|k| k.starts_with("ratelimit."))
            .collect();
        keys.sort();
        keys.into_iter()
            .map(|k| {
                let v = attr(&s.attributes, &k);
                (k, v)
            })
            .collect()
    };
    assert_eq!(
        decision(json),
        decision(&grpc),
        "the same decision attributes"
    );
    assert_eq!(
        attr(&json.attributes, "ratelimit.rule").as_deref(),
        Some("tenant")
    );
    assert_eq!(
        json.events.len(),
        grpc.events.len(),
        "one event per descriptor"
    );
    for (key, want) in [
        ("http.request.method", "POST"),
        ("http.route", "/json"),
        ("http.response.status_code", "429"),
    ] {
        assert_eq!(attr(&json.attributes, key).as_deref(), Some(want), "{key}");
    }
    // No descriptor value on the span.
    let text = format!("{:?} {:?}", json.attributes, json.events);
    assert!(!text.contains("\"j\""), "{text}");

    // A refused body is the client's fault: no error status (OpenTelemetry's
    // conventions for a server's 4xx), and the reason on the span.
    let refused = &of(&spans, REFUSED)[0];
    assert_eq!(
        refused.status.as_ref().map_or(0, |s| s.code),
        StatusCode::Unset as i32,
        "{refused:?}"
    );
    assert_eq!(
        attr(&refused.attributes, "http.response.status_code").as_deref(),
        Some("400")
    );
    let reason = attr(&refused.attributes, "ratelimit.refusal").unwrap_or_default();
    assert!(reason.contains("JSON"), "{refused:?}");
    let refused = &of(&spans, GRPC_REFUSED)[0];
    assert_eq!(
        refused.status.as_ref().map_or(0, |s| s.code),
        StatusCode::Unset as i32,
        "{refused:?}"
    );
    assert_eq!(
        attr(&refused.attributes, "rpc.grpc.status_code").as_deref(),
        Some("3")
    );
    let reason = attr(&refused.attributes, "ratelimit.refusal").unwrap_or_default();
    assert!(reason.contains("domain"), "{refused:?}");
}

/// `--otlp-headers` wins over `OTEL_EXPORTER_OTLP_HEADERS`, as each flag wins over
/// its variable: the collector hears the flag's credentials, and none of the
/// variable's headers.
#[tokio::test]
async fn the_otlp_headers_flag_wins_over_the_variable() {
    use common::otlp::Receiver;

    let receiver = Receiver::start().await;
    let server = receiver.serve(
        POLICY,
        &[
            ("SLUICE_OTLP_HEADERS", "authorization=from-flag"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=from-env,x-from-env=1",
            ),
        ],
    );
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"tenant","value":"h"}]}]}"#;
    let (status, _) = http(&server.http, "POST", "/json", body);
    assert_eq!(status, 200);
    receiver
        .wait(Duration::from_secs(10), "the call's span", |s| {
            !s.is_empty()
        })
        .await;
    for head in receiver.heads() {
        let named = |name: &str| -> Vec<&String> {
            head.iter()
                .filter(|l| l.starts_with(&format!("{name}:")))
                .collect()
        };
        assert_eq!(
            named("authorization"),
            ["authorization: from-flag"],
            "{head:?}"
        );
        assert!(named("x-from-env").is_empty(), "{head:?}");
    }
}

/// Spans reach an https:// collector that requires a client certificate, with the
/// collector's CA and Sluice's certificate given by flags; the same set through
/// OpenTelemetry's variables works too. A sluice that trusts another authority, or
/// presents no certificate, sends the collector nothing and counts its spans as
/// failed; a CA file that cannot be read stops start-up, naming its flag.
#[tokio::test]
async fn spans_reach_a_collector_over_mutual_tls() {
    use common::otlp::{hex, Receiver};
    use common::tls::Ca;

    let ca = Ca::new("collector-ca");
    let receiver = Receiver::start_tls(&ca.server(), Some(&ca.cert())).await;
    let client = ca.client("sluice");
    let (ca_file, cert, key) = (
        ca.cert().display().to_string(),
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    let decide = |server: &common::Server, trace: &str| {
        let body =
            r#"{"domain":"shop","descriptors":[{"entries":[{"key":"tenant","value":"t"}]}]}"#;
        let parent = format!("00-{trace}-00f067aa0ba902b7-01");
        let (status, _) = http_with(
            &server.http,
            "POST",
            "/json",
            &[("traceparent", &parent)],
            body,
        );
        assert!(status == 200 || status == 429, "{status}");
    };
    let exported = |trace: &'static str| {
        move |spans: &[opentelemetry_proto::tonic::trace::v1::Span]| {
            spans.iter().any(|s| hex(&s.trace_id) == trace)
        }
    };

    // By flags, then by OpenTelemetry's variables.
    let by_flags = [
        ("SLUICE_OTLP_TLS_CA", ca_file.as_str()),
        ("SLUICE_OTLP_TLS_CERT", cert.as_str()),
        ("SLUICE_OTLP_TLS_KEY", key.as_str()),
    ];
    let by_variables = [
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca_file.as_str()),
        ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert.as_str()),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", key.as_str()),
    ];
    for (trace, env) in [
        ("1bf92f3577b34da6a3ce929d0e0e4736", by_flags),
        ("2bf92f3577b34da6a3ce929d0e0e4736", by_variables),
    ] {
        let server = receiver.serve(POLICY, &env);
        decide(&server, trace);
        let what = format!("the span sent with {env:?}");
        receiver
            .wait(Duration::from_secs(20), &what, exported(trace))
            .await;
    }

    // Trusting another authority, then presenting no certificate: each batch is
    // lost, and counted.
    let other = Ca::new("other-ca");
    let other_ca = other.cert().display().to_string();
    const REFUSED: &str = "3bf92f3577b34da6a3ce929d0e0e4736";
    for env in [
        vec![
            ("SLUICE_OTLP_TLS_CA", other_ca.as_str()),
            ("SLUICE_OTLP_TLS_CERT", cert.as_str()),
            ("SLUICE_OTLP_TLS_KEY", key.as_str()),
        ],
        vec![("SLUICE_OTLP_TLS_CA", ca_file.as_str())],
    ] {
        let server = receiver.serve(POLICY, &env);
        decide(&server, REFUSED);
        let failed = || {
            server
                .metric("sluice_trace_spans_total", &[("result", "failed")])
                .unwrap_or(0.0)
        };
        eventually(
            Duration::from_secs(20),
            "spans counted as failed",
            || async { failed() >= 1.0 },
        )
        .await;
        assert!(
            !receiver
                .spans()
                .iter()
                .any(|(_, s)| hex(&s.trace_id) == REFUSED),
            "{env:?}: the collector took a span"
        );
    }

    // A CA file that is not there stops start-up, naming the flag.
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let out = common::Server::command(
        &[policy],
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
            ("SLUICE_OTLP_TLS_CA", "/nonexistent/ca.pem"),
        ],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--otlp-tls-ca=/nonexistent/ca.pem"),
        "{stderr}"
    );
}
