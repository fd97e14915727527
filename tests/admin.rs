//! The admin API (`--admin-addr`) through real clients: `grpcurl` over reflection
//! (no proto file), in plain text and over mutual TLS; Explain for each matching
//! case of the policy reference against what ShouldRateLimit then answers on the same
//! server; the watch streams through sluice's generated tonic client; `sluice
//! explain` against the server and against the policy file alone.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::tls::{admin_over_mutual_tls, mutual_tls_flags, Ca};
use common::tools::{grpcurl, text, tool};
use common::*;
use serde_json::Value;
use sluice::admin::pb;
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const POLICY: &str = include_str!("fixtures/explain.yaml");

/// A uint64 as proto3 JSON writes it (a string), or a number.
fn u64_of(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().expect("a uint64"),
        Value::Number(n) => n.as_u64().expect("a uint64"),
        Value::Null => 0,
        other => panic!("not a uint64: {other}"),
    }
}

#[test]
fn grpcurl_lists_describes_and_calls_the_admin_api_without_proto_files() {
    let Some(bin) = tool("grpcurl") else {
        return;
    };
    let ca = Ca::new("admin-ca");
    let client = ca.client("operator");
    let plain = Server::start(POLICY, &[]);
    let mtls = admin_over_mutual_tls(POLICY, &ca);
    let tls = (ca, client);
    for (server, tls) in [(&plain, None), (&mtls, Some(&tls))] {
        let out = grpcurl(&bin, &server.admin, tls, &["", "list"]);
        assert!(out.status.success(), "{}", text(&out));
        let listed = String::from_utf8_lossy(&out.stdout);
        for service in ["sluice.admin.v1.Admin", "grpc.health.v1.Health"] {
            assert!(listed.lines().any(|l| l == service), "{listed}");
        }
        let out = grpcurl(
            &bin,
            &server.admin,
            tls,
            &["", "describe", "sluice.admin.v1.Admin"],
        );
        assert!(out.status.success(), "{}", text(&out));
        let described = String::from_utf8_lossy(&out.stdout);
        for rpc in [
            "Explain",
            "ListPolicies",
            "WatchOffenders",
            "WatchDecisions",
        ] {
            assert!(described.contains(&format!("rpc {rpc}")), "{described}");
        }
        let out = grpcurl(
            &bin,
            &server.admin,
            tls,
            &[
                "-d",
                r#"{"service": "sluice.admin.v1.Admin"}"#,
                "",
                "grpc.health.v1.Health/Check",
            ],
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("SERVING"),
            "{}",
            text(&out)
        );
        let out = grpcurl(
            &bin,
            &server.admin,
            tls,
            &["-d", "{}", "", "sluice.admin.v1.Admin/ListPolicies"],
        );
        assert!(out.status.success(), "{}", text(&out));
        let policies: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let rules = policies["domains"][0]["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), 8, "{policies:#}");
        // Rules of one path name the value they match.
        let stat_keys: Vec<&str> = rules.iter().filter_map(|r| r["statKey"].as_str()).collect();
        for key in [
            "tenant_acme",
            "tenant_beta-*",
            "tenant",
            "tenant.path_/search",
        ] {
            assert!(stat_keys.contains(&key), "{key}: {policies:#}");
        }
        assert!(policies["sources"][0]["source"]
            .as_str()
            .unwrap()
            .ends_with("policy.yaml"));
    }
    // Without the client certificate the mutual-TLS port refuses.
    let out = grpcurl(&bin, &mtls.admin, None, &["-insecure", "", "list"]);
    assert!(!out.status.success(), "{}", text(&out));
}

/// One request of the policy reference's matching cases: its descriptors (each a
/// list of entries), and the domain.
struct Case {
    what: &'static str,
    domain: &'static str,
    descriptors: Vec<Vec<(&'static str, &'static str)>>,
}

fn cases() -> Vec<Case> {
    let one = |what, entries: &[(&'static str, &'static str)]| Case {
        what,
        domain: "api",
        descriptors: vec![entries.to_vec()],
    };
    vec![
        one("exact", &[("tenant", "acme")]),
        one("wildcard", &[("tenant", "beta-9")]),
        one("key only", &[("tenant", "zeta")]),
        one("nested", &[("tenant", "zeta"), ("path", "/search")]),
        one("depth", &[("tenant", "acme"), ("path", "/search")]),
        one("shadow", &[("client", "c1")]),
        one("unlimited", &[("health", "h")]),
        Case {
            what: "replaces",
            domain: "api",
            descriptors: vec![vec![("plan", "free")], vec![("plan", "promo")]],
        },
        Case {
            what: "unknown domain",
            domain: "nowhere",
            descriptors: vec![vec![("tenant", "acme")]],
        },
    ]
}

fn explain_json(c: &Case) -> String {
    let descriptors: Vec<Value> = c
        .descriptors
        .iter()
        .map(|d| {
            let entries: Vec<Value> = d
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect();
            serde_json::json!({ "entries": entries })
        })
        .collect();
    serde_json::json!({"domain": c.domain, "descriptors": descriptors}).to_string()
}

#[tokio::test]
async fn explain_agrees_with_what_should_rate_limit_then_does_and_spends_nothing() {
    let Some(bin) = tool("grpcurl") else {
        return;
    };
    agreement(&bin, &Server::start(POLICY, &[])).await;
}

#[tokio::test]
async fn explain_agrees_with_should_rate_limit_on_redis_and_spends_nothing() {
    let Some(bin) = tool("grpcurl") else {
        return;
    };
    if !common::redis::available() {
        return;
    }
    let redis = common::redis::RedisServer::start().await;
    let server = Server::start(POLICY, &["--redis", &redis.url()]);
    agreement(&bin, &server).await;
}

/// Every case, four rounds each: Explain twice (the same answer: nothing spent),
/// then ShouldRateLimit, which must answer what Explain said.
async fn agreement(bin: &Path, server: &Server) {
    let bin = bin.to_path_buf();
    let mut rls = server.client().await;
    for c in cases() {
        // Four rounds: fresh counters, partly spent, and (for the small limits) over
        // the limit.
        for round in 0..4 {
            let body = explain_json(&c);
            // Explain twice, then the call: the second Explain sees what the first
            // saw (nothing spent), and the call does what they said. The small limits
            // count per minute (one in fixed windows): a round that a minute's end cut
            // in two is done again on the counters as they then are, which Explain
            // reads afresh.
            let (explained, resp) = in_one_window(Duration::from_secs(60), async |_| {
                let mut explained = Vec::new();
                for _ in 0..2 {
                    let out = grpcurl(
                        &bin,
                        &server.admin,
                        None,
                        &["-d", &body, "", "sluice.admin.v1.Admin/Explain"],
                    );
                    assert!(out.status.success(), "{}: {}", c.what, text(&out));
                    let e: Value = serde_json::from_slice(&out.stdout).expect("JSON");
                    explained.push(e);
                }
                let req = request(c.domain, c.descriptors.iter().map(|d| desc(d)).collect());
                (explained, call(&mut rls, req).await)
            })
            .await;
            let e = &explained[0];
            let strip = |v: &Value| {
                let mut v = v.clone();
                for d in v["descriptors"].as_array_mut().into_iter().flatten() {
                    if let Some(c) = d.get_mut("counter").and_then(Value::as_object_mut) {
                        c.remove("resetMicros");
                        c.remove("retryAfterMicros");
                    }
                }
                v.as_object_mut().unwrap().remove("responseHeaders");
                v
            };
            assert_eq!(
                strip(&explained[0]),
                strip(&explained[1]),
                "{}: spent",
                c.what
            );

            let want = if e["overallCode"] == "OVER_LIMIT" {
                Code::OverLimit
            } else {
                Code::Ok
            };
            assert_eq!(resp.overall_code(), want, "{} round {round}: {e:#}", c.what);
            let ds = e["descriptors"].as_array().expect("descriptors");
            assert_eq!(ds.len(), resp.statuses.len(), "{}", c.what);
            for (d, s) in ds.iter().zip(&resp.statuses) {
                let code = if d["code"] == "OVER_LIMIT" {
                    Code::OverLimit
                } else {
                    Code::Ok
                };
                assert_eq!(s.code(), code, "{} round {round}: {d:#}", c.what);
                match d.get("counter") {
                    Some(counter) => {
                        assert_eq!(
                            u64::from(s.limit_remaining),
                            u64_of(&counter["remaining"]),
                            "{} round {round}: what the explained hits would leave",
                            c.what
                        );
                        let rule = &d["rule"];
                        let limit = s.current_limit.as_ref().expect("a limit");
                        assert_eq!(
                            u64::from(limit.requests_per_unit),
                            u64_of(&counter["limit"]),
                            "{}: the limit in force, as the answer states it",
                            c.what
                        );
                        assert_eq!(
                            u64::from(limit.requests_per_unit),
                            u64_of(&rule["requestsPerUnit"]),
                            "{}",
                            c.what
                        );
                    }
                    None => assert!(
                        s.current_limit.is_none() || d["rule"]["unlimited"] == true,
                        "{}: {d:#} {s:?}",
                        c.what
                    ),
                }
            }
            match c.what {
                "exact" => {
                    assert_eq!(ds[0]["levels"][0]["kind"], "EXACT");
                    // 3 a minute: over in the last round, and Explain gives the wait.
                    if round == 3 {
                        assert_eq!(e["overallCode"], "OVER_LIMIT", "{e:#}");
                        let headers = e["responseHeaders"].as_array().unwrap();
                        assert!(headers.iter().any(|h| h["key"] == "retry-after"), "{e:#}");
                    }
                }
                "wildcard" => {
                    assert_eq!(ds[0]["levels"][0]["kind"], "WILDCARD");
                    assert_eq!(ds[0]["levels"][0]["pattern"], "beta-*");
                }
                "key only" => assert_eq!(ds[0]["levels"][0]["kind"], "KEY_ONLY"),
                "nested" => assert_eq!(ds[0]["rule"]["path"], "tenant/path"),
                "depth" => {
                    let why = ds[0]["noMatch"].as_str().unwrap();
                    assert!(why.contains("exactly its depth"), "{why}");
                    assert!(ds[0].get("rule").is_none());
                }
                "shadow" => {
                    assert_eq!(ds[0]["rule"]["shadowMode"], true);
                    if round > 0 {
                        assert_eq!(ds[0]["reason"], "shadow: over limit, not enforced");
                    }
                }
                "unlimited" => assert_eq!(ds[0]["rule"]["unlimited"], true),
                "replaces" => {
                    assert!(ds[0]["replacedBy"].as_str().unwrap().contains("'free'"));
                    assert!(ds[1]["rule"]["replaces"][0] == "free");
                }
                "unknown domain" => assert!(e.get("domainKnown").is_none()),
                other => panic!("{other}"),
            }
        }
    }
}

#[tokio::test]
async fn sluice_explain_prints_for_people_and_as_json_from_a_server_or_the_policy() {
    let server = Server::start(POLICY, &[]);
    let mut rls = server.client().await;
    call(&mut rls, request("api", vec![desc(&[("tenant", "acme")])])).await;
    let sluice = env!("CARGO_BIN_EXE_sluice");
    let run = |extra: &[&str]| {
        let out = Command::new(sluice)
            .args(["explain", "--domain", "api", "tenant=acme"])
            .args(extra)
            .output()
            .expect("run sluice explain");
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let people = run(&["--server", &server.admin]);
    assert!(people.contains("matched:  tenant=acme (exact)"), "{people}");
    assert!(
        people.contains("1 hit(s) fit: 1 left"),
        "one spent: {people}"
    );
    let json: Value = serde_json::from_str(&run(&["--server", &server.admin, "--json"])).unwrap();
    assert_eq!(json["descriptors"][0]["counter"]["remaining"], 1);
    let policy = server.policy_path();
    let alone: Value =
        serde_json::from_str(&run(&["--config", policy.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(
        alone["descriptors"][0]["counter"]["remaining"], 2,
        "fresh counters"
    );

    // A charge of 5 on a bucket of 2 (at a token a minute): the key owes 3, and
    // Explain says so without spending.
    let charge = request(
        "api",
        vec![desc_hits(&[("tenant", "zed"), ("path", "/search")], 5)],
    );
    assert_eq!(
        call(&mut rls, charge).await.overall_code,
        Code::OverLimit as i32
    );
    let owing = |extra: &[&str]| {
        let args = [&["--domain", "api", "tenant=zed", "path=/search"], extra].concat();
        explained(&server.admin, &args)
    };
    let people = owing(&[]);
    assert!(people.contains("do not fit: 0 left"), "{people}");
    assert!(people.contains("owes 3 hit(s)"), "{people}");
    let json: Value = serde_json::from_str(&owing(&["--json"])).unwrap();
    assert_eq!(json["descriptors"][0]["counter"]["owed"], 3, "{json}");

    let out = Command::new(sluice)
        .args(["explain", "--domain", "api", "tenant"])
        .args(["--config", policy.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("'tenant' is not KEY=VALUE"));
    let out = Command::new(sluice)
        .args(["explain", "--domain", "", "a=b", "--server", &server.admin])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("domain must not be empty"),
        "{}",
        text(&out)
    );
}

/// `sluice explain ARGS` against the admin API at `admin`, which must succeed: its
/// output.
fn explained(admin: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("explain")
        .args(args)
        .args(["--server", admin])
        .output()
        .expect("run sluice explain");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// A bucket of 10 an hour whose key, denied twice, is tightened to a fifth.
const TIGHTENING: &str = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit:\n      unit: hour\n      requests_per_unit: 10\n      algorithm: token_bucket\n      name: per_ip\n      penalty: {violations: 2, within: 1h, tighten: {factor: 0.2, for: 1h}}\n";

/// A key a penalty tightened is explained with the limit in force for it, as
/// ShouldRateLimit's `current_limit` states it, the rule's configured one beside it.
async fn tightened_key_is_explained_with_the_limit_in_force(server: &Server) {
    let mut rls = server.client().await;
    let ip = || request("d", vec![desc(&[("ip", "1.1.1.1")])]);
    // Ten admitted, then denials until the penalty tightens the key.
    let mut tightened = None;
    for _ in 0..100 {
        let r = call(&mut rls, ip()).await;
        let limit = r.statuses[0].current_limit.as_ref().expect("a limit");
        if limit.requests_per_unit != 10 {
            tightened = Some(limit.requests_per_unit);
            break;
        }
    }
    assert_eq!(tightened, Some(2), "tightened to a fifth of 10");
    let explain = |extra: &[&str]| {
        explained(
            &server.admin,
            &[&["--domain", "d", "ip=1.1.1.1"], extra].concat(),
        )
    };
    let people = explain(&[]);
    assert!(
        people.contains(", under a tightened limit of 2 per hour (configured 10)\n"),
        "{people}"
    );
    assert!(
        people.contains("header x-ratelimit-limit: 2, 2;w=3600;name=\"per_ip\""),
        "{people}"
    );
    let json: Value = serde_json::from_str(&explain(&["--json"])).unwrap();
    let d = &json["descriptors"][0];
    assert_eq!(d["counter"]["tightened"], true, "{json}");
    assert_eq!(d["counter"]["limit"], 2, "{json}");
    assert_eq!(d["rule"]["requestsPerUnit"], 10, "{json}");
}

#[tokio::test]
async fn sluice_explain_states_a_tightened_keys_limit_in_force() {
    tightened_key_is_explained_with_the_limit_in_force(&Server::start(TIGHTENING, &[])).await;
}

#[tokio::test]
async fn sluice_explain_states_a_tightened_keys_limit_in_force_on_redis() {
    if !common::redis::available() {
        return;
    }
    let redis = common::redis::RedisServer::start().await;
    let server = Server::start(TIGHTENING, &["--redis", &redis.url()]);
    tightened_key_is_explained_with_the_limit_in_force(&server).await;
}

#[tokio::test]
async fn watch_offenders_shows_the_keys_being_denied() {
    let server = Server::start(POLICY, &[]);
    let mut admin = server.admin_client().await;
    let mut rls = server.client().await;
    for _ in 0..6 {
        call(&mut rls, request("api", vec![desc(&[("tenant", "acme")])])).await;
    }
    let r = rule_snapshot(&mut admin, "api", "tenant", |r| r.denied == 3).await;
    assert_eq!(r.decided, 6);
    assert!((r.deny_ratio - 0.5).abs() < 1e-9);
    assert_eq!(r.offenders[0].key, "acme");
    assert_eq!(r.offenders[0].denials, 3);
}

/// The first WatchOffenders entry of `rule` in `domain` that is `ready`, within 10 s.
async fn rule_snapshot(
    admin: &mut pb::admin_client::AdminClient<tonic::transport::Channel>,
    domain: &str,
    rule: &str,
    ready: impl Fn(&pb::RuleTop) -> bool,
) -> pb::RuleTop {
    let mut feed = admin
        .watch_offenders(pb::Filter {
            domain: domain.into(),
            interval_ms: 100,
            ..Default::default()
        })
        .await
        .expect("WatchOffenders")
        .into_inner();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let snap = tokio::time::timeout(left, feed.message())
            .await
            .expect("a snapshot in time")
            .expect("the stream")
            .expect("not ended");
        if let Some(r) = snap.rules.into_iter().find(|r| r.rule == rule && ready(r)) {
            return r;
        }
    }
}

#[tokio::test]
async fn watch_decisions_samples_live_decisions_within_its_rate() {
    let server = Server::start(POLICY, &[]);
    let mut admin = server.admin_client().await;
    let mut feed = admin
        .watch_decisions(pb::Filter {
            denied_only: true,
            max_per_second: 2,
            ..Default::default()
        })
        .await
        .expect("WatchDecisions")
        .into_inner();
    let mut rls = server.client().await;
    // The watcher is registered once the call is answered; 3 admitted, 20 denied.
    for _ in 0..23 {
        call(&mut rls, request("api", vec![desc(&[("tenant", "acme")])])).await;
    }
    let first = tokio::time::timeout(Duration::from_secs(10), feed.message())
        .await
        .expect("a sample in time")
        .unwrap()
        .unwrap();
    assert_eq!(first.domain, "api");
    assert_eq!(first.overall_code, pb::Code::OverLimit as i32);
    assert_eq!(first.descriptors[0].rule, "tenant");
    assert_eq!(first.descriptors[0].key, "acme");
    // At most 2 a second were sent: the next denial's sample tells what was dropped.
    let mut got = 1;
    while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_millis(200), feed.message())
        .await
        .map(|m| m.transpose())
    {
        got += 1;
    }
    assert!(got <= 4, "{got} samples of 20 at 2 a second");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        call(&mut rls, request("api", vec![desc(&[("tenant", "acme")])])).await;
        if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(100), feed.message())
            .await
            .map(|m| m.transpose())
        {
            if d.dropped > 0 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no sample said what was dropped");
    }
}

/// Watch streams are capped over the admin port, at 16 of either kind: each costs
/// Envoy's calls (a WatchDecisions watcher takes a sample of each decision, a
/// WatchOffenders stream a snapshot every 100 ms, on the runtime the calls run on),
/// and ten connections of 200 streams each slowed ShouldRateLimit past Envoy's
/// timeout. One past the cap is refused with RESOURCE_EXHAUSTED, saying so; a
/// stream that ends gives its place back.
#[tokio::test]
async fn watch_streams_past_the_cap_are_refused_until_one_ends() {
    let server = Server::start(POLICY, &[]);
    let mut admin = server.admin_client().await;
    let mut decisions = Vec::new();
    let mut offenders = Vec::new();
    for _ in 0..8 {
        let feed = admin.watch_decisions(pb::Filter::default()).await;
        decisions.push(feed.expect("WatchDecisions under the cap").into_inner());
        let feed = admin.watch_offenders(pb::Filter::default()).await;
        offenders.push(feed.expect("WatchOffenders under the cap").into_inner());
    }
    // A 17th stream of either kind is refused, saying why.
    fn refused<T>(answer: Result<T, tonic::Status>) {
        let status = answer.map(|_| ()).expect_err("a 17th stream");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("16 watch streams"),
            "{}",
            status.message()
        );
    }
    refused(admin.watch_decisions(pb::Filter::default()).await);
    refused(admin.watch_offenders(pb::Filter::default()).await);
    // The other streams still deliver.
    let snapshot = tokio::time::timeout(Duration::from_secs(5), offenders[0].message()).await;
    assert!(matches!(snapshot, Ok(Ok(Some(_)))), "{snapshot:?}");
    drop(decisions.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    let _reopened = loop {
        if let Ok(feed) = admin.watch_decisions(pb::Filter::default()).await {
            break feed.into_inner();
        }
        assert!(Instant::now() < deadline, "no place given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
}

#[test]
fn the_admin_port_is_off_on_request_and_an_explicit_address_must_bind() {
    let off = Server::start(POLICY, &["--admin-addr", "off"]);
    assert_eq!(off.admin, "off");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config", off.policy_path().to_str().unwrap()])
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--admin-addr", &addr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--admin-addr") && err.contains(&addr), "{err}");
}

/// `--admin-tls-client-san` (here as `SLUICE_ADMIN_TLS_CLIENT_SAN`): of the client
/// certificates the admin CA signs, only one carrying the name may call the port,
/// which can block keys; another is refused in its handshake, which `sluice explain`
/// reports, and logged and counted as the gRPC port's refusals are.
#[tokio::test]
async fn the_admin_port_takes_only_client_certificates_with_its_name() {
    let ca = Ca::new("admin-ca");
    let flags = mutual_tls_flags("admin", &ca.server(), &ca.cert());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let env = [("SLUICE_ADMIN_TLS_CLIENT_SAN", "ops.example.com")];
    let server = Server::start_env(dir, &[policy], &flags, &env);
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let explain = |client: &common::tls::Pair| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["explain", "--domain", "api", "tenant=acme"])
            .args(["--server", &server.admin, "--tls-ca", &path(&ca.cert())])
            .args([
                "--tls-cert",
                &path(&client.cert),
                "--tls-key",
                &path(&client.key),
            ])
            .output()
            .expect("run sluice explain")
    };
    let out = explain(&ca.client_for("ops.example.com"));
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("matched:  tenant=acme (exact)"), "{said}");

    let out = explain(&ca.client_for("intruder.example.com"));
    assert!(!out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("refused the TLS handshake") && said.contains("--admin-tls-client-san"),
        "{said}"
    );
    let lines = server
        .wait_line(Duration::from_secs(10), "the refused certificate", |l| {
            l.contains("WARN") && l.contains("the client's certificate is not accepted")
        })
        .await;
    let line = lines.last().unwrap();
    assert!(
        line.contains("admin") && line.contains("NotValidForName"),
        "the port and the reason are given: {line}"
    );
    let closed = ("port", "admin");
    eventually(Duration::from_secs(10), "the refusal counted", || async {
        let labels = [closed, ("reason", "handshake_failed")];
        server
            .metric("sluice_grpc_connections_closed_total", &labels)
            .is_some_and(|n| n >= 1.0)
    })
    .await;
}

const SIGNALS_POLICY: &str = r#"
domain: edge
descriptors:
  # A log: exact, whenever the calls run.
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: sliding_window_log}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

#[tokio::test]
async fn watch_offenders_carries_the_signals_and_the_block_list_takes_operators_blocks() {
    let server = Server::start(SIGNALS_POLICY, &[]);
    let mut admin = server.admin_client().await;
    let mut rls = server.client().await;
    // Three addresses of one /24, each denied twice.
    for host in 1..=3 {
        let ip = format!("10.1.2.{host}");
        for _ in 0..3 {
            call(
                &mut rls,
                request("edge", vec![desc(&[("remote_address", &ip)])]),
            )
            .await;
        }
    }
    let rule = rule_snapshot(&mut admin, "edge", "remote_address", |r| {
        !r.subnets_by_denials.is_empty()
    })
    .await;
    let top = &rule.subnets_by_denials[0];
    assert_eq!(top.subnet, "10.1.2.0/24");
    assert_eq!((top.denials, top.addresses), (6, 3));
    assert_eq!(rule.subnets_by_addresses[0].subnet, "10.1.2.0/24");

    // An operator's block of a user: denied, listed, then lifted.
    let entry = pb::request_descriptor::Entry {
        key: "user".into(),
        value: "mallory".into(),
    };
    let put = admin
        .block(pb::BlockRequest {
            domain: "edge".into(),
            entries: vec![entry.clone()],
            for_micros: 0,
        })
        .await
        .expect("Block")
        .into_inner();
    assert_eq!((put.kind.as_str(), put.rule.as_str()), ("block", "user"));
    assert!(put.remaining_micros > 3_500_000_000 && put.remaining_micros <= 3_600_000_000);
    let r = call(
        &mut rls,
        request("edge", vec![desc(&[("user", "mallory")])]),
    )
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    let (status, body) = http(&server.http, "GET", "/debug/blocks", "");
    assert_eq!(status, 200);
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["shared"], false, "{listed}");
    assert_eq!(listed["sentences"][0]["key"], "mallory", "{listed}");
    assert_eq!(listed["sentences"][0]["source"], "operator", "{listed}");
    let blocks = admin
        .list_blocks(pb::ListBlocksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(blocks.sentences.len(), 1);
    assert_eq!(blocks.sentences[0].counter, put.counter);
    let lifted = admin
        .unblock(pb::UnblockRequest {
            counter: put.counter.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(lifted.lifted);
    let r = call(
        &mut rls,
        request("edge", vec![desc(&[("user", "mallory")])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    // Nothing to block: no entries, or entries no rule limits.
    let none = admin
        .block(pb::BlockRequest {
            domain: "edge".into(),
            ..Default::default()
        })
        .await
        .expect_err("no entries");
    assert_eq!(none.code(), tonic::Code::InvalidArgument);
    // No domain: a wrong argument as in Explain, not a domain that is not found.
    let mallory = vec![pb::request_descriptor::Entry {
        key: "user".into(),
        value: "mallory".into(),
    }];
    let no_domain = admin
        .block(pb::BlockRequest {
            entries: mallory.clone(),
            ..Default::default()
        })
        .await
        .expect_err("no domain");
    assert_eq!(
        (no_domain.code(), no_domain.message()),
        (
            tonic::Code::InvalidArgument,
            "domain: give the policy's domain"
        )
    );
    let no_domain = admin
        .unblock(pb::UnblockRequest {
            entries: mallory,
            ..Default::default()
        })
        .await
        .expect_err("no domain");
    assert_eq!(no_domain.code(), tonic::Code::InvalidArgument);
}

/// A block longer than any store keeps is refused, and puts nothing on the list; the
/// longest one is listed for its whole length and denies.
#[tokio::test]
async fn a_block_longer_than_the_longest_is_refused_and_blocks_nothing() {
    let server = Server::start(SIGNALS_POLICY, &[]);
    let mut admin = server.admin_client().await;
    let mut rls = server.client().await;
    let block = |for_micros: u64| pb::BlockRequest {
        domain: "edge".into(),
        entries: vec![pb::request_descriptor::Entry {
            key: "user".into(),
            value: "mallory".into(),
        }],
        for_micros,
    };
    for too_long in [(1 << 50) + 1, 1 << 63, u64::MAX] {
        let err = admin.block(block(too_long)).await.expect_err("too long");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().contains(&format!(
                "for_micros: {too_long} is longer than the longest block, 1125899906842624"
            )),
            "{}",
            err.message()
        );
    }
    let listed = admin
        .list_blocks(pb::ListBlocksRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sentences.is_empty(), "{listed:?}");
    let r = call(
        &mut rls,
        request("edge", vec![desc(&[("user", "mallory")])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);

    let put = admin
        .block(block(1 << 50))
        .await
        .expect("Block")
        .into_inner();
    assert!(put.remaining_micros > (1 << 50) - 60_000_000, "{put:?}");
    let r = call(
        &mut rls,
        request("edge", vec![desc(&[("user", "mallory")])]),
    )
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT);
}

/// Each WatchOffenders snapshot lists the sentences in force at its tick: a block
/// put between two snapshots is in the second, not a whole interval later.
#[tokio::test]
async fn each_offenders_snapshot_lists_the_sentences_in_force_at_its_tick() {
    let server = Server::start(SIGNALS_POLICY, &[]);
    let mut admin = server.admin_client().await;
    let mut feed = admin
        .watch_offenders(pb::Filter {
            domain: "edge".into(),
            interval_ms: 3000,
            ..Default::default()
        })
        .await
        .expect("WatchOffenders")
        .into_inner();
    let first = feed.message().await.unwrap().expect("a first snapshot");
    assert!(first.bans.is_empty(), "{first:?}");
    admin
        .block(pb::BlockRequest {
            domain: "edge".into(),
            entries: vec![pb::request_descriptor::Entry {
                key: "user".into(),
                value: "mallory".into(),
            }],
            for_micros: 0,
        })
        .await
        .expect("Block");
    let second = tokio::time::timeout(Duration::from_secs(10), feed.message())
        .await
        .expect("a second snapshot within the interval")
        .unwrap()
        .expect("a second snapshot");
    let keys: Vec<&str> = second.bans.iter().map(|b| b.key.as_str()).collect();
    assert_eq!(keys, ["mallory"], "{second:?}");
}

/// Unblock with neither a counter nor entries says what it takes.
#[tokio::test]
async fn unblock_naming_nothing_says_what_it_takes() {
    let server = Server::start(SIGNALS_POLICY, &[]);
    let mut admin = server.admin_client().await;
    let err = admin
        .unblock(pb::UnblockRequest::default())
        .await
        .expect_err("nothing named");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("counter") && err.message().contains("entries"),
        "{}",
        err.message()
    );
}

/// A block's log line carries its key quoted and escaped: a key holding a newline
/// (a value a client sent, copied from the top offenders) cannot start a forged
/// line in the text log, nor can the counter an Unblock names.
#[tokio::test]
async fn a_blocked_key_cannot_forge_a_log_line() {
    let server = Server::start(SIGNALS_POLICY, &[]);
    let mut admin = server.admin_client().await;
    // No `=` or `|`: a value holding one is shown hashed.
    let forged = "ERROR sluice: forged line";
    let put = admin
        .block(pb::BlockRequest {
            domain: "edge".into(),
            entries: vec![pb::request_descriptor::Entry {
                key: "user".into(),
                value: format!("mallory\n{forged}\r"),
            }],
            for_micros: 0,
        })
        .await
        .expect("Block")
        .into_inner();
    let lifted = admin
        .unblock(pb::UnblockRequest {
            counter: put.counter.clone(),
            ..Default::default()
        })
        .await
        .expect("Unblock")
        .into_inner();
    assert!(lifted.lifted);
    let lines = server.lines_until_reload().await;
    let blocked: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("blocked by an operator"))
        .collect();
    assert_eq!(blocked.len(), 1, "{lines:#?}");
    assert!(
        blocked[0].contains(r#"key="mallory\nERROR sluice: forged line\r""#),
        "{blocked:?}"
    );
    let lifted: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("sentence lifted by an operator"))
        .collect();
    assert_eq!(lifted.len(), 1, "{lines:#?}");
    assert!(lifted[0].contains(r"\nERROR sluice: forged"), "{lifted:?}");
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with(forged) || l.contains('\r')),
        "{lines:#?}"
    );
}

/// An edit the server refuses shows in ListPolicies as in `/debug/policies`: the
/// file's documents serve their last good version, and the refusal says why, until
/// the file is fixed.
#[tokio::test]
async fn list_policies_shows_a_refused_file_edit_until_it_is_fixed() {
    let server = Server::start(POLICY, &[]);
    let mut admin = server.admin_client().await;
    let before = list_policies(&mut admin).await;
    assert_eq!(before.sources[0].status, "loaded", "{before:?}");
    assert!(before.refused.is_empty(), "{before:?}");
    let rules = before.domains[0].rules.len();

    write_atomic(
        &server.policy_path(),
        "domain: api\ndescriptors:\n  - key: [\n",
    );
    let mut p = before.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.refused.is_empty() {
        assert!(Instant::now() < deadline, "no refusal listed: {p:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        p = list_policies(&mut admin).await;
    }
    assert_eq!(p.refused.len(), 1, "{p:?}");
    assert_eq!(p.refused[0].source, "file", "{p:?}");
    assert!(p.refused[0].error.contains("policy.yaml:"), "{p:?}");
    assert_eq!(p.sources[0].status, "last_good", "{p:?}");
    assert_eq!(p.sources[0].error, p.refused[0].error, "{p:?}");
    // The last good rules are what serve, and what is listed.
    assert_eq!(p.domains[0].rules.len(), rules, "{p:?}");

    write_atomic(&server.policy_path(), POLICY);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.refused.is_empty() || p.sources[0].status != "loaded" {
        assert!(Instant::now() < deadline, "still refused: {p:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        p = list_policies(&mut admin).await;
    }
    assert!(p.sources[0].error.is_empty(), "{p:?}");
}

async fn list_policies(
    admin: &mut pb::admin_client::AdminClient<tonic::transport::Channel>,
) -> pb::Policies {
    admin
        .list_policies(pb::ListPoliciesRequest::default())
        .await
        .expect("ListPolicies")
        .into_inner()
}

/// `sluice explain` against a server whose policy file's latest edit was refused
/// says so on stderr, with the refusal's file and line, beside an explanation that
/// the last good version decided; once the file is fixed, it says nothing more.
#[tokio::test]
async fn explain_warns_that_a_refused_edit_leaves_the_last_good_policy_answering() {
    let server = Server::start(POLICY, &[]);
    let explain = || {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["explain", "--server", &server.admin, "--domain", "api"])
            .arg("tenant=acme")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(stdout.contains("rule:"), "{stdout}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert_eq!(explain(), "");

    write_atomic(
        &server.policy_path(),
        "domain: api\ndescriptors:\n  - key: [\n",
    );
    let mut admin = server.admin_client().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while list_policies(&mut admin).await.refused.is_empty() {
        assert!(Instant::now() < deadline, "no refusal listed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let warned = explain();
    assert!(
        warned.starts_with("warning: the server refused the latest change of its file policies")
            && warned.contains("policy.yaml:"),
        "{warned}"
    );
    assert_eq!(warned.lines().count(), 1, "{warned}");

    write_atomic(&server.policy_path(), POLICY);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !list_policies(&mut admin).await.refused.is_empty() {
        assert!(Instant::now() < deadline, "still refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(explain(), "");
}

/// A message over the admin port's 4 MiB is refused RESOURCE_EXHAUSTED, as the gRPC
/// port refuses one over --max-request-bytes (gRPC's status codes guide: a message
/// larger than the configured maximum), not OUT_OF_RANGE.
#[tokio::test]
async fn an_admin_message_over_its_limit_is_resource_exhausted() {
    let server = Server::start("domain: d\n", &[]);
    let mut admin = server.admin_client().await;
    let big = pb::ExplainRequest {
        domain: "d".repeat(5 << 20),
        ..Default::default()
    };
    let err = admin.explain(big).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    // The port serves on.
    let policies = admin.list_policies(pb::ListPoliciesRequest::default());
    policies.await.unwrap();
}
