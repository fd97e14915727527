//! The running server through a real gRPC client: matching, layers, responses,
//! headers, bad requests, leaky-bucket pacing, HTTP endpoints, hot reload and a
//! full memory store under a flood of distinct keys.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

const POLICY: &str = r#"
domain: shop
descriptors:
  - key: remote_address
    layer: edge
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window, name: per_ip}
  - key: service
    value: checkout
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: tenant
    layer: tenant
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket}
  - key: path
    value: /exact
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: path
    value: /wild*
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    descriptors:
      - key: action
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: plan
    value: gold
    rate_limit:
      unit: minute
      requests_per_unit: 100
      name: gold
      replaces: [{name: per_ip}]
    metadata: {tier: gold}
  - key: queue
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: leaky_bucket, burst: 3}
  - key: svc
    value: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: svc
    value: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

fn remaining(resp: &sluice::pb::envoy::service::ratelimit::v3::RateLimitResponse, i: usize) -> u32 {
    resp.statuses[i].limit_remaining
}

#[tokio::test]
async fn counts_down_then_denies_with_limit_and_headers() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    // A fixed window of a minute: the eleven calls of one address in one.
    let (answers, r) = in_one_window(Duration::from_secs(60), async |n| {
        let address = || {
            request(
                "shop",
                vec![desc(&[("remote_address", &format!("10.0.{n}.1"))])],
            )
        };
        let mut answers = Vec::new();
        for _ in 0..10 {
            answers.push(call(&mut c, address()).await);
        }
        (answers, call(&mut c, address()).await)
    })
    .await;
    for (r, expected) in answers.iter().zip((0..10).rev()) {
        assert_eq!(r.overall_code, OK);
        assert_eq!(remaining(r, 0), expected);
        let limit = r.statuses[0].current_limit.as_ref().expect("current_limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_str()),
            (10, 2, "per_ip")
        );
        let reset = r.statuses[0].duration_until_reset.as_ref().expect("reset");
        assert!(reset.seconds <= 60);
        assert_eq!(
            header(r, "x-ratelimit-remaining"),
            Some(expected.to_string().as_str())
        );
        assert_eq!(
            header(r, "x-ratelimit-limit"),
            Some("10, 10;w=60;name=\"per_ip\"")
        );
        assert!(header(r, "retry-after").is_none());
    }
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].code, OVER_LIMIT);
    let retry: u64 = header(&r, "retry-after")
        .expect("retry-after")
        .parse()
        .unwrap();
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds as u64;
    // Never earlier than the true wait (the window's end), at most 10 % later.
    assert!(
        retry >= reset.max(1) && retry <= (reset + 1) * 11 / 10 + 1,
        "retry {retry} reset {reset}"
    );
    // Another address has its own counter.
    let r = call(
        &mut c,
        request("shop", vec![desc(&[("remote_address", "10.0.0.2")])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn a_denied_request_spends_nothing_of_its_other_layers() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    // The edge counts in a fixed window of a minute: the calls in one, the checks
    // before and after them included. The service counter (one value) is not fresh
    // in a second run: what the denials spend is read as a difference.
    let (admitted, denied, before, after) = in_one_window(Duration::from_secs(60), async |n| {
        let ip = format!("10.1.{n}.1");
        let tenant = format!("acme-{n}");
        let layered = || {
            request(
                "shop",
                vec![
                    desc(&[("remote_address", &ip)]),
                    desc(&[("service", "checkout")]),
                    desc(&[("tenant", &tenant)]),
                ],
            )
        };
        let check = || {
            request(
                "shop",
                vec![
                    desc_hits(&[("remote_address", &ip)], 0),
                    desc_hits(&[("service", "checkout")], 0),
                ],
            )
        };
        let before = call(&mut c, check()).await;
        let mut admitted = Vec::new();
        for _ in 0..2 {
            admitted.push(call(&mut c, layered()).await);
        }
        // The tenant allows 2 per minute: the next three are denied by the tenant
        // layer.
        let mut denied = Vec::new();
        for _ in 0..3 {
            denied.push(call(&mut c, layered()).await);
        }
        (admitted, denied, before, call(&mut c, check()).await)
    })
    .await;
    for r in &admitted {
        assert_eq!(r.overall_code, OK);
    }
    for r in &denied {
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(r.statuses[0].code, OK);
        assert_eq!(r.statuses[1].code, OK);
        assert_eq!(r.statuses[2].code, OVER_LIMIT);
    }
    // Edge and service counters show only the two admitted requests.
    assert_eq!(before.overall_code, OK);
    assert_eq!(after.overall_code, OK);
    assert_eq!(remaining(&before, 0), 10, "a fresh edge counter");
    assert_eq!(
        remaining(&after, 0),
        8,
        "edge counter was charged by denied requests"
    );
    assert_eq!(
        remaining(&before, 1) - remaining(&after, 1),
        2,
        "service counter was charged by denied requests"
    );
}

#[tokio::test]
async fn matching_prefers_exact_then_wildcard_then_key_and_respects_depth() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let r = call(
        &mut c,
        request(
            "shop",
            vec![
                desc(&[("path", "/exact")]),
                desc(&[("path", "/wildcard")]),
                desc(&[("path", "/other")]),
                desc(&[("user", "u1")]),
                desc(&[("user", "u1"), ("action", "buy")]),
                desc(&[("path", "/exact"), ("extra", "x")]),
                desc(&[("nothing", "here")]),
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    let rpu = |i: usize| {
        r.statuses[i]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    assert_eq!(rpu(0), Some(7), "exact value");
    assert_eq!(rpu(1), Some(6), "wildcard value");
    assert_eq!(rpu(2), Some(5), "key only");
    assert_eq!(rpu(3), None, "user alone has no limit at depth 1");
    assert_eq!(rpu(4), Some(3), "nested limit at depth 2");
    assert_eq!(rpu(5), None, "longer descriptor than the matched depth");
    assert_eq!(rpu(6), None, "unknown key");
}

#[tokio::test]
async fn unlimited_shadow_share_threshold_and_replaces() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    for _ in 0..5 {
        let r = call(&mut c, request("shop", vec![desc(&[("free", "x")])])).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    }
    // Shadow mode: over its limit, reported OK and never denies.
    for _ in 0..3 {
        let r = call(&mut c, request("shop", vec![desc(&[("shadow", "s")])])).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].code, OK);
    }
    // share_threshold: every value under files/* shares one counter of 2.
    let f = |v: &str| request("shop", vec![desc(&[("files", v)])]);
    assert_eq!(call(&mut c, f("files/a")).await.overall_code, OK);
    assert_eq!(call(&mut c, f("files/b")).await.overall_code, OK);
    assert_eq!(call(&mut c, f("files/c")).await.overall_code, OVER_LIMIT);
    // replaces: the gold plan's limit replaces per_ip for requests carrying both.
    for _ in 0..10 {
        call(
            &mut c,
            request("shop", vec![desc(&[("remote_address", "10.9.9.9")])]),
        )
        .await;
    }
    let both = request(
        "shop",
        vec![
            desc(&[("remote_address", "10.9.9.9")]),
            desc(&[("plan", "gold")]),
        ],
    );
    let r = call(&mut c, both).await;
    assert_eq!(r.overall_code, OK, "per_ip is replaced by gold");
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(
        r.statuses[1]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        100
    );
    // metadata of the admitted rule is in dynamic_metadata, under `metadata`.
    let md = r.dynamic_metadata.expect("dynamic_metadata");
    assert_eq!(md.fields.keys().collect::<Vec<_>>(), ["metadata"]);
    let Some(prost_types::value::Kind::StructValue(inner)) = &md.fields["metadata"].kind else {
        panic!("metadata is a struct: {md:?}");
    };
    assert!(inner.fields.contains_key("tier"), "{md:?}");
    // `/json` answers it too, as protobuf's JSON mapping writes a Struct.
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"plan","value":"gold"}]}]}"#;
    let (s, b) = http(&server.http, "POST", "/json", body);
    assert_eq!(s, 200, "{b}");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        v["dynamicMetadata"],
        serde_json::json!({"metadata": {"tier": "gold"}}),
        "{b}"
    );
}

#[tokio::test]
async fn hits_addend_counts_and_zero_only_checks() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let mut req = request("shop", vec![desc(&[("service", "checkout")])]);
    req.hits_addend = 4;
    let r = call(&mut c, req).await;
    assert_eq!(remaining(&r, 0), 6);
    let r = call(
        &mut c,
        request("shop", vec![desc_hits(&[("service", "checkout")], 0)]),
    )
    .await;
    assert_eq!(remaining(&r, 0), 6, "hits_addend 0 checks without counting");
    let r = call(
        &mut c,
        request("shop", vec![desc_hits(&[("service", "checkout")], 7)]),
    )
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT, "7 more do not fit in 6");
    // A descriptor's own cost is a charge (docs/costs.md): spent whole even when it
    // does not fit, so the 7 are owed and a check that follows is refused.
    let r = call(
        &mut c,
        request("shop", vec![desc_hits(&[("service", "checkout")], 0)]),
    )
    .await;
    assert_eq!(
        r.overall_code, OVER_LIMIT,
        "the charge past the limit is owed"
    );
    assert_eq!(remaining(&r, 0), 0);
}

/// docs/responses.md: a request of more hits than its limit can ever admit is denied
/// and spends nothing; its `retry-after` is one window, its header's remaining 0
/// (an OVER_LIMIT answer), while its status keeps what the limit has left.
#[tokio::test]
async fn a_request_larger_than_its_limit_is_told_one_window_and_spends_nothing() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let mut req = request("shop", vec![desc(&[("service", "checkout")])]);
    req.hits_addend = 11;
    let r = call(&mut c, req).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(remaining(&r, 0), 10, "nothing spent: {r:?}");
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("0"));
    let retry: u64 = header(&r, "retry-after")
        .expect("retry-after")
        .parse()
        .unwrap();
    // One window of a minute, jittered by at most 10 %.
    assert!((60..=66).contains(&retry), "retry-after {retry}");
    let r = call(
        &mut c,
        request("shop", vec![desc(&[("service", "checkout")])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(remaining(&r, 0), 9);
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("9"));
}

#[tokio::test]
async fn quota_mode_denies_only_when_every_quota_is_spent() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let q = || request("shop", vec![desc(&[("svc", "a")]), desc(&[("svc", "b")])]);
    assert_eq!(call(&mut c, q()).await.overall_code, OK); // a 1/1, b 1/2
    let r = call(&mut c, q()).await; // b 2/2
    assert_eq!(r.overall_code, OK, "b still has quota");
    // a is over its quota and says so, as envoyproxy/ratelimit answers.
    assert_eq!((r.statuses[0].code, r.statuses[1].code), (OVER_LIMIT, OK));
    let r = call(&mut c, q()).await;
    assert_eq!(r.overall_code, OVER_LIMIT, "both spent");
    assert_eq!(
        (r.statuses[0].code, r.statuses[1].code),
        (OVER_LIMIT, OVER_LIMIT)
    );
    // Only the denied request's descriptors count as denials; a's quota past its
    // limit in the request b admitted counts apart, neither ok nor denied.
    let outcome = |o: &str| {
        let labels = [
            ("domain", "shop"),
            ("layer", "service"),
            ("rule", "svc"),
            ("outcome", o),
        ];
        server.metric("sluice_requests_total", &labels)
    };
    assert_eq!(
        (
            outcome("ok"),
            outcome("quota_over_limit"),
            outcome("over_limit")
        ),
        (Some(3.0), Some(1.0), Some(2.0))
    );
}

#[tokio::test]
async fn bad_requests_get_invalid_argument() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let too_many: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    let too_many: Vec<(&str, &str)> = too_many
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let cases = vec![
        (
            "empty domain",
            request("", vec![desc(&[("a", "b")])]),
            "domain",
        ),
        ("no descriptors", request("shop", vec![]), "descriptor"),
        (
            "empty key",
            request("shop", vec![desc(&[("", "v")])]),
            "empty key",
        ),
        (
            "33 entries",
            request("shop", vec![desc(&too_many)]),
            "at most 32",
        ),
    ];
    for (what, req, msg) in cases {
        let err = c.should_rate_limit(req).await.expect_err(what);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}");
        assert!(err.message().contains(msg), "{what}: {}", err.message());
    }
    // A descriptor without entries (Envoy sends one when a `skip_if_absent` action
    // finds nothing) matches nothing; the request's other limits still apply.
    // A fixed window of a minute: the eleven calls in one.
    let r = in_one_window(Duration::from_secs(60), async |n| {
        let ip = format!("10.7.{n}.7");
        for _ in 0..10 {
            call(
                &mut c,
                request("shop", vec![desc(&[("remote_address", &ip)])]),
            )
            .await;
        }
        call(
            &mut c,
            request("shop", vec![desc(&[]), desc(&[("remote_address", &ip)])]),
        )
        .await
    })
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    // The server is still fine.
    let r = call(&mut c, request("shop", vec![desc(&[("path", "/x")])])).await;
    assert_eq!(r.overall_code, OK);
    // Unknown domains are allowed.
    let r = call(&mut c, request("nope", vec![desc(&[("path", "/x")])])).await;
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn leaky_bucket_holds_oks_in_turn_and_denies_a_full_queue_at_once() {
    let server = Server::start(POLICY, &[]);
    let c = server.client().await;
    let start = Instant::now();
    // 5 per second with a queue of 3: four requests at once; three are admitted at
    // 0, 200 and 400 ms, the fourth finds the queue full.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            let r = call(&mut c, request("shop", vec![desc(&[("queue", "q")])])).await;
            (r.overall_code, start.elapsed())
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    results.sort_by_key(|r| r.1);
    let oks: Vec<Duration> = results.iter().filter(|r| r.0 == OK).map(|r| r.1).collect();
    let denied: Vec<Duration> = results
        .iter()
        .filter(|r| r.0 == OVER_LIMIT)
        .map(|r| r.1)
        .collect();
    assert_eq!(oks.len(), 3, "{results:?}");
    assert_eq!(denied.len(), 1, "{results:?}");
    // The OKs leave in turn, at the rate (lower bounds only: never early).
    assert!(oks[1] >= Duration::from_millis(190), "{oks:?}");
    assert!(oks[2] >= Duration::from_millis(390), "{oks:?}");
    // The full-queue answer is not held.
    assert!(denied[0] < oks[2], "{results:?}");
}

#[tokio::test]
async fn a_leaky_turn_past_the_grpc_timeout_is_denied_at_once_and_not_taken() {
    late_turns_are_denied_at_once_and_not_taken(&[]).await;
}

/// A leaky queue of 2 a second (a turn every 500 ms) beside a counter: a request
/// whose turn would come after its `grpc-timeout` is OVER_LIMIT before it, and
/// spends neither its turn nor the counter; the next request, with time to wait,
/// gets the turn the late one did not take. `extra`: the store's flags.
///
/// Turns 500 ms apart leave room for a loaded machine's stalls: the late request is
/// late only if it reaches sluice more than its hold (most of its 250 ms) before
/// the next turn.
pub(crate) async fn late_turns_are_denied_at_once_and_not_taken(extra: &[&str]) {
    let policy = r#"
domain: late
descriptors:
  - key: queue
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: leaky_bucket, burst: 5}
  - key: count
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
"#;
    let server = Server::start(policy, extra);
    let mut c = server.client().await;
    let both = |timeout| {
        let mut r = tonic::Request::new(request(
            "late",
            vec![desc(&[("queue", "q")]), desc(&[("count", "c")])],
        ));
        r.set_timeout(timeout);
        r
    };
    let first = Instant::now();
    let r = c.should_rate_limit(both(Duration::from_secs(5))).await;
    let r = r.expect("the first turn").into_inner();
    assert_eq!((r.overall_code, r.statuses[1].limit_remaining), (OK, 99));
    // The next turn is 500 ms after the first: too late for 250 ms.
    let late = Duration::from_millis(250);
    let sent = Instant::now();
    let r = c.should_rate_limit(both(late)).await;
    let took = sent.elapsed();
    let r = r.expect("an answer before the deadline").into_inner();
    assert_eq!(r.overall_code, OVER_LIMIT, "{r:?}");
    assert!(took < late, "answered after {took:?}");
    assert_eq!(r.statuses[0].code, OVER_LIMIT, "{r:?}");
    assert!(header(&r, "retry-after").is_some(), "{r:?}");
    let r = c.should_rate_limit(both(Duration::from_secs(5))).await;
    let released = first.elapsed();
    let r = r.expect("the second turn").into_inner();
    assert_eq!(r.overall_code, OK, "{r:?}");
    // The late request spent nothing of the counter, and its turn (500 ms after the
    // first) is this one's: had it been taken, this one's would be at 1,000 ms.
    assert_eq!(r.statuses[1].limit_remaining, 98, "{r:?}");
    assert!(
        released >= Duration::from_millis(500) && released < Duration::from_millis(950),
        "released {released:?} after the first"
    );
}

#[tokio::test]
async fn http_endpoints_and_grpc_health() {
    let server = Server::start(POLICY, &[]);
    assert_eq!(http(&server.http, "GET", "/healthz", "").0, 200);
    assert_eq!(http(&server.http, "GET", "/readyz", "").0, 200);
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"tenant","value":"t1"}]}]}"#;
    let (s, b) = http(&server.http, "POST", "/json", body);
    assert_eq!(s, 200, "{b}");
    assert!(b.contains("\"overallCode\":\"OK\""), "{b}");
    assert_eq!(http(&server.http, "POST", "/json", body).0, 200);
    let (s, b) = http(&server.http, "POST", "/json", body);
    assert_eq!(s, 429, "{b}");
    assert!(b.contains("OVER_LIMIT"), "{b}");
    // A refund, its hits written as protobuf's JSON mapping (and grpcurl) writes a
    // 64-bit integer: the room comes back.
    let refund = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"tenant","value":"t1"}],"hitsAddend":"2","isNegativeHits":true}]}"#;
    let (s, b) = http(&server.http, "POST", "/json", refund);
    assert_eq!(s, 200, "{b}");
    let (s, b) = http(&server.http, "POST", "/json", body);
    assert_eq!(s, 200, "{b}");
    let (s, b) = http(&server.http, "POST", "/json", "{not json");
    assert_eq!(s, 400, "{b}");
    let (s, _) = http(
        &server.http,
        "POST",
        "/json",
        r#"{"domain":"","descriptors":[]}"#,
    );
    assert_eq!(s, 400);
    let (s, m) = http(&server.http, "GET", "/metrics", "");
    assert_eq!(s, 200);
    // Both 400s, the unparseable body's too.
    assert_eq!(sample(&m, "sluice_invalid_requests_total", &[]), Some(2.0));
    assert!(m.contains("sluice_requests_total{"), "{m}");
    assert!(m.contains("outcome=\"over_limit\""), "{m}");

    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(channel);
    let r = h
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, 1, "SERVING");
}

#[tokio::test]
async fn ietf_and_off_header_styles() {
    let server = Server::start(POLICY, &["--response-headers", "ietf"]);
    let mut c = server.client().await;
    let r = call(
        &mut c,
        request("shop", vec![desc(&[("service", "checkout")])]),
    )
    .await;
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"service\";q=10;w=60")
    );
    assert_eq!(
        header(&r, "ratelimit").map(|v| v.starts_with("\"service\";r=9;t=")),
        Some(true)
    );
    assert!(header(&r, "x-ratelimit-limit").is_none());

    let server = Server::start(POLICY, &["--response-headers", "off"]);
    let mut c = server.client().await;
    let r = call(
        &mut c,
        request("shop", vec![desc(&[("service", "checkout")])]),
    )
    .await;
    assert!(r.response_headers_to_add.is_empty());
    assert_eq!(remaining(&r, 0), 9, "statuses still carry the numbers");
}

/// With `--response-headers off` Envoy writes the headers itself
/// (`enable_x_ratelimit_headers`), and its `x-ratelimit-reset` is the reset's whole
/// seconds alone: a reset of 0.6 s would tell a denied client 0, to come back at
/// once. So the statuses' resets are then whole seconds, rounded up; sluice's own
/// headers keep the microseconds, and `--reset-resolution` still decides.
#[tokio::test]
async fn with_the_headers_left_to_envoy_resets_are_whole_seconds() {
    let tenant = || request("shop", vec![desc(&[("tenant", "t-reset")])]);
    let reset = |r: &sluice::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0].duration_until_reset.expect("a reset")
    };
    for (args, whole) in [
        (&["--response-headers", "off"][..], true),
        (
            &["--response-headers", "off", "--reset-resolution", "micros"][..],
            false,
        ),
        (&[][..], false),
    ] {
        let server = Server::start(POLICY, args);
        let mut c = server.client().await;
        // Two tokens a minute: each hit takes 30 s to come back.
        let mut last = None;
        for _ in 0..3 {
            last = Some(call(&mut c, tenant()).await);
        }
        let denied = last.unwrap();
        assert_eq!(denied.overall_code, 2, "{args:?}: the third is denied");
        let d = reset(&denied);
        assert!(d.seconds >= 1, "{args:?}: {d:?}");
        assert_eq!(d.nanos == 0, whole, "{args:?}: {d:?}");
    }
}

#[tokio::test]
async fn an_edited_policy_takes_effect_and_a_broken_edit_is_refused() {
    let server = Server::start(POLICY, &[]);
    let c = server.client().await;
    // Keep calls flowing during every reload: none may fail.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let mut c = c.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                c.should_rate_limit(request("shop", vec![desc(&[("path", "/p")])]))
                    .await
                    .expect("no failed call during reload");
                n += 1;
            }
            n
        })
    };
    let edited = POLICY.replace("requests_per_unit: 7}", "requests_per_unit: 70}");
    write_atomic(&server.policy_path(), &edited);
    let mut c2 = c.clone();
    eventually(Duration::from_secs(2), "edited limit is served", || {
        let mut c = c2.clone();
        async move {
            let r = call(
                &mut c,
                request("shop", vec![desc_hits(&[("path", "/exact")], 0)]),
            )
            .await;
            r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit)
                == Some(70)
        }
    })
    .await;

    write_atomic(
        &server.policy_path(),
        "domain: shop\ndescriptors:\n  - key: path\n    ratelimit: {}\n",
    );
    // The refusal is counted, and was logged before, naming file and line.
    let refused = [("source", "file"), ("result", "error")];
    eventually(
        Duration::from_secs(5),
        "the refused reload is counted",
        || {
            let n = server.metric("sluice_policy_reloads_total", &refused);
            async move { n == Some(1.0) }
        },
    )
    .await;
    server
        .wait_line(
            Duration::from_secs(5),
            "the refusal names file and line",
            |l| l.contains("policy.yaml:4"),
        )
        .await;
    let r = call(
        &mut c2,
        request("shop", vec![desc_hits(&[("path", "/exact")], 0)]),
    )
    .await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(70),
        "the last good policy keeps serving"
    );
    // While the broken file stays, the refusal stands (an alert can hold on it);
    // fixing the file clears it.
    eventually(Duration::from_secs(5), "the refusal is standing", || {
        let n = server.metric("sluice_policy_refused", &[("source", "file")]);
        async move { n == Some(1.0) }
    })
    .await;
    write_atomic(&server.policy_path(), POLICY);
    eventually(Duration::from_secs(5), "the refusal is cleared", || {
        let n = server.metric("sluice_policy_refused", &[("source", "file")]);
        async move { n == Some(0.0) }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(load.await.unwrap() > 0);
}

/// Tokio's threads of a running process, by name (sluice starts no blocking ones
/// without Redis, so these are the workers).
fn worker_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|name| name.starts_with("tokio-r"))
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn one_worker_thread_serves_and_limits_the_same() {
    let server = Server::start(POLICY, &["--worker-threads", "1"]);
    if std::path::Path::new("/proc/self/task").exists() {
        // A blocking-pool thread (same name prefix) may live a while after start-up
        // (10 s keep-alive); a second worker would never go away.
        let deadline = Instant::now() + Duration::from_secs(15);
        while worker_threads(server.child.id()) != 1 {
            assert!(
                Instant::now() < deadline,
                "{} runtime threads",
                worker_threads(server.child.id())
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let mut c = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..4 {
        let r = call(
            &mut c,
            request("shop", vec![desc(&[("user", "u1"), ("action", "buy")])]),
        )
        .await;
        codes.push(r.overall_code);
    }
    assert_eq!(codes, [OK, OK, OK, OVER_LIMIT]);
}

/// 5 a day per user: a flood of distinct users must not buy the attacker more.
const PER_USER: &str = r#"
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: fixed_window}
"#;

/// The per-user counts take seconds (thousands of calls) in fixed windows of a day:
/// a run that a day's end cut in two is run again on a fresh server.
const DAY: Duration = Duration::from_secs(86_400);

fn per_user(user: &str) -> sluice::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    request("shop", vec![desc(&[("user", user)])])
}

/// A series' value on the metrics page.
fn series(server: &Server, name: &str) -> u64 {
    let (status, text) = http(&server.http, "GET", "/metrics", "");
    assert_eq!(status, 200);
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("{name} missing from\n{text}"));
    line[name.len()..].trim().parse().expect("a count")
}

#[tokio::test]
async fn a_flood_of_distinct_keys_resets_no_counter() {
    let (attacker, after_flood, steady, [active, refused, idle, expired]) =
        in_one_window(DAY, async |_| {
            let server = Server::start(PER_USER, &["--max-keys", "1000"]);
            let mut c = server.client().await;
            let mut attacker = Vec::new();
            for _ in 0..6 {
                attacker.push(call(&mut c, per_user("attacker")).await);
            }
            for i in 0..100 {
                for _ in 0..2 {
                    call(&mut c, per_user(&format!("steady-{i}"))).await;
                }
            }
            // Ten times --max-keys distinct users, each answered (OK: the failure mode
            // is open) whether or not the store could keep its counter.
            let senders = (0..8).map(|first| {
                let mut c = c.clone();
                async move {
                    for i in (first..10_000).step_by(8) {
                        let r = call(&mut c, per_user(&format!("flood-{i}"))).await;
                        assert_eq!(r.overall_code, OK, "flood-{i}");
                    }
                }
            });
            futures::future::join_all(senders).await;
            let mut after_flood = Vec::new();
            for _ in 0..5 {
                after_flood.push(call(&mut c, per_user("attacker")).await);
            }
            let mut steady = Vec::new();
            for i in 0..100 {
                steady.push(call(&mut c, per_user(&format!("steady-{i}"))).await);
            }
            let counts = [
                r#"sluice_active_keys{store="memory"}"#,
                r#"sluice_evictions_total{reason="refused"}"#,
                r#"sluice_evictions_total{reason="idle"}"#,
                r#"sluice_evictions_total{reason="expired"}"#,
            ]
            .map(|name| series(&server, name));
            (attacker, after_flood, steady, counts)
        })
        .await;
    for (r, left) in attacker.iter().zip((0..5).rev()) {
        assert_eq!((r.overall_code, remaining(r, 0)), (OK, left));
    }
    assert_eq!(attacker[5].overall_code, OVER_LIMIT);
    for r in &after_flood {
        assert_eq!(
            r.overall_code, OVER_LIMIT,
            "the attacker's counter was reset"
        );
    }
    for (i, r) in steady.iter().enumerate() {
        assert_eq!((r.overall_code, remaining(r, 0)), (OK, 2), "steady-{i}");
    }
    // Nothing dropped: every counter is in its day. The store is full, and each
    // flood key past those it could hold was refused.
    assert_eq!(active, 1000);
    assert_eq!(refused, 10_000 - (1000 - 101));
    assert_eq!(idle, 0);
    assert_eq!(expired, 0);
}

/// A full store answers a new key of a `closed` domain as `closed` answers a failed
/// shard: denied, counted `failed_closed` and as a store failure, and no offender
/// (the limit was not reached: the store had no room for its counter).
#[tokio::test]
async fn a_full_store_denies_new_keys_of_a_closed_domain_as_a_failed_shard() {
    let closed = format!("{PER_USER}failure_mode: closed\n");
    let (kept, counts, newcomer, [failed_closed, over_limit, failures, refused], top, offenders) =
        in_one_window(DAY, async |_| {
            let server = Server::start(&closed, &["--max-keys", "64"]);
            let mut c = server.client().await;
            // One counter a shard: 2,000 users fill every shard, and those kept count on.
            let mut kept = Vec::new();
            for i in 0..2000 {
                let user = format!("u-{i}");
                if call(&mut c, per_user(&user)).await.overall_code == OK {
                    kept.push(user);
                }
            }
            let mut counts = Vec::new();
            for user in &kept {
                counts.push(call(&mut c, per_user(user)).await);
            }
            // Asked again and again, as an offender would be.
            let mut newcomer = Vec::new();
            for _ in 0..10 {
                newcomer.push(call(&mut c, per_user("newcomer")).await);
            }
            let outcome = |o: &str| {
                let label = format!("outcome=\"{o}\"");
                summed(&server, "sluice_requests_total", &[&label])
            };
            let metrics = [
                outcome("failed_closed"),
                outcome("over_limit"),
                series(&server, r#"sluice_store_failures_total{store="memory"}"#),
                series(&server, r#"sluice_evictions_total{reason="refused"}"#),
            ];
            let (status, top) = http(&server.http, "GET", "/debug/top", "");
            assert_eq!(status, 200, "{top}");
            let top: serde_json::Value = serde_json::from_str(&top).expect("JSON");
            let (_, text) = http(&server.http, "GET", "/metrics", "");
            let offenders: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with("sluice_top_offenders{"))
                .map(str::to_string)
                .collect();
            (kept, counts, newcomer, metrics, top, offenders)
        })
        .await;
    assert_eq!(kept.len(), 64);
    for (user, r) in kept.iter().zip(&counts) {
        assert_eq!((r.overall_code, remaining(r, 0)), (OK, 3), "{user}");
    }
    for r in &newcomer {
        assert_eq!(r.overall_code, OVER_LIMIT, "{r:?}");
        assert_eq!(r.statuses[0].code, OVER_LIMIT, "{r:?}");
    }
    let not_kept = 2000 - 64 + 10;
    assert_eq!(refused, not_kept);
    assert_eq!(failed_closed, not_kept);
    assert_eq!(failures, not_kept);
    assert_eq!(over_limit, 0, "no limit was reached");
    let rules = top["rules"].as_array().expect("rules");
    for rule in rules {
        let none = rule["top"].as_array().is_none_or(Vec::is_empty);
        assert!(none, "no offender: {rule}");
    }
    assert_eq!(offenders, Vec::<String>::new());
}

/// Under `--store-error-answer error`, a new key a full store cannot keep in a
/// `closed` domain is answered with an error, as a failed shard is, so that Envoy's
/// `failure_mode_deny` decides; the kept keys are answered as before.
#[tokio::test]
async fn a_full_store_answers_new_keys_of_a_closed_domain_with_an_error_when_told() {
    let closed = format!("{PER_USER}failure_mode: closed\n");
    let args = ["--max-keys", "64", "--store-error-answer", "error"];
    let (kept, kept_again, newcomer) = in_one_window(DAY, async |_| {
        let server = Server::start(&closed, &args);
        let mut c = server.client().await;
        let mut kept = Vec::new();
        for i in 0..2000 {
            let user = format!("u-{i}");
            if c.should_rate_limit(per_user(&user)).await.is_ok() {
                kept.push(user);
            }
        }
        let kept_again = call(&mut c, per_user(&kept[0])).await;
        let newcomer = c.should_rate_limit(per_user("newcomer")).await;
        (kept, kept_again, newcomer)
    })
    .await;
    assert_eq!(kept.len(), 64);
    assert_eq!(
        (kept_again.overall_code, remaining(&kept_again, 0)),
        (OK, 3)
    );
    let error = newcomer.expect_err("an error answer");
    assert_eq!(error.code(), tonic::Code::Unknown, "{error:?}");
}

/// The sum of the samples of `name` whose labels include each of `labels`.
fn summed(server: &Server, name: &str, labels: &[&str]) -> u64 {
    let (status, text) = http(&server.http, "GET", "/metrics", "");
    assert_eq!(status, 200);
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn a_full_store_lifts_new_keys_of_an_open_domain_as_failed_open() {
    const USERS: usize = 2000;
    let (answers, kept_again, [failed_open, failures, refused]) = in_one_window(DAY, async |_| {
        let server = Server::start(PER_USER, &["--max-keys", "64"]);
        let mut c = server.client().await;
        // One counter a shard: of 2,000 users, 64 are kept, each counting. (The
        // shards' hash is seeded per process: 500 users left a shard empty one run
        // in 40; 2,000 leave none.)
        let mut answers = Vec::new();
        for i in 0..USERS {
            answers.push(call(&mut c, per_user(&format!("u-{i}"))).await);
        }
        let kept: Vec<usize> = (0..USERS)
            .filter(|&i| remaining(&answers[i], 0) == 4)
            .collect();
        let mut kept_again = Vec::new();
        for &i in &kept {
            kept_again.push(call(&mut c, per_user(&format!("u-{i}"))).await);
        }
        let counts = [
            summed(
                &server,
                "sluice_requests_total",
                &[r#"outcome="failed_open""#],
            ),
            series(&server, r#"sluice_store_failures_total{store="memory"}"#),
            series(&server, r#"sluice_evictions_total{reason="refused"}"#),
        ];
        (answers, kept_again, counts)
    })
    .await;
    assert_eq!(kept_again.len(), 64);
    for r in &kept_again {
        assert_eq!((r.overall_code, remaining(r, 0)), (OK, 3));
    }
    // The others: OK, as `open` answers a counter it cannot keep: no limit shown
    // that is not being kept, and counted as the failure mode's answers.
    let lifted: Vec<_> = answers.iter().filter(|r| remaining(r, 0) != 4).collect();
    assert_eq!(lifted.len(), USERS - 64);
    for r in &lifted {
        assert_eq!((r.overall_code, remaining(r, 0)), (OK, 0));
    }
    let not_kept = (USERS - 64) as u64;
    assert_eq!(failed_open, not_kept);
    assert_eq!(failures, not_kept);
    assert_eq!(refused, not_kept);
}

/// A reload refused for a key holding a terminal's control sequence logs the key
/// escaped: the ERROR line sets no window title on the operator's terminal.
#[tokio::test]
async fn a_refused_reload_logs_control_characters_escaped() {
    let server = Server::start(POLICY, &[]);
    write_atomic(&server.policy_path(), crate::cli::TITLE_KEY_TWICE);
    let lines = server
        .wait_line(Duration::from_secs(5), "the refusal", |l| {
            l.contains("policy refused")
        })
        .await;
    let refusal = lines.last().unwrap();
    assert!(refusal.contains("'k\\u{1b}]0;pwn\\u{7}'"), "{refusal}");
    assert!(!refusal.contains(['\u{1b}', '\u{7}']), "{refusal:?}");
}

/// `POST /json` reads at most `--max-request-bytes`: a larger body is refused with
/// 413 before the rest of it is sent.
#[test]
fn a_json_body_over_max_request_bytes_is_refused_before_it_is_all_read() {
    use std::io::{Read, Write};
    let server = Server::start(POLICY, &["--max-request-bytes", "1KiB"]);
    let within = format!(
        r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"tenant","value":"{}"}}]}}]}}"#,
        "t".repeat(900)
    );
    assert_eq!(http(&server.http, "POST", "/json", &within).0, 200);
    let over = format!(
        r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"tenant","value":"{}"}}]}}]}}"#,
        "t".repeat(1100)
    );
    let (s, b) = http(&server.http, "POST", "/json", &over);
    assert_eq!(s, 413, "{b}");
    assert!(b.contains("--max-request-bytes"), "{b}");

    // Declared at 10 MiB, sent in part, with the socket left open: the answer comes
    // without the rest. The same for a chunked body that runs past the limit.
    for (headers, sent) in [
        ("Content-Length: 10485760\r\n", vec![b' '; 2048]),
        (
            "Transfer-Encoding: chunked\r\n",
            b"800\r\n"
                .iter()
                .copied()
                .chain(vec![b' '; 2048])
                .chain(*b"\r\n")
                .collect(),
        ),
    ] {
        let mut s = std::net::TcpStream::connect(&server.http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let head = format!(
            "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}\r\n"
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&sent).unwrap();
        let mut answer = [0u8; 12];
        s.read_exact(&mut answer)
            .expect("answered while the body is still open");
        assert_eq!(&answer, b"HTTP/1.1 413", "{headers}");
    }
    // Each refusal counts, as a gRPC one does.
    let oversized = server.metric("sluice_oversized_requests_total", &[]);
    assert_eq!(oversized, Some(3.0));
}

/// A `POST /json` whose Content-Length is over `--max-request-bytes` is refused
/// with 413 before any of its body is sent: no `100 Continue` asks for it, and no
/// wait for bytes that would be refused anyway.
#[test]
fn a_json_body_declared_over_max_request_bytes_is_refused_unread() {
    use std::io::{Read, Write};
    let server = Server::start(POLICY, &["--max-request-bytes", "1KiB"]);
    for expect in ["", "Expect: 100-continue\r\n"] {
        let mut s = std::net::TcpStream::connect(&server.http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let head = format!(
            "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 99999999999\r\n{expect}\r\n"
        );
        s.write_all(head.as_bytes()).unwrap();
        let mut answer = [0u8; 12];
        s.read_exact(&mut answer)
            .unwrap_or_else(|e| panic!("{expect:?}: no answer before the body: {e}"));
        assert_eq!(&answer, b"HTTP/1.1 413", "{expect:?}");
    }
    let oversized = server.metric("sluice_oversized_requests_total", &[]);
    assert_eq!(oversized, Some(2.0));
}

#[tokio::test]
async fn default_algorithm_applies_to_limits_that_name_none() {
    let policy = "domain: d\ndescriptors:\n  - key: plain\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: named\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window_log}\n";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, policy).unwrap();
    let server = Server::start_env(
        dir,
        &[path],
        &[],
        &[("SLUICE_DEFAULT_ALGORITHM", "fixed_window")],
    );
    let (status, body) = http(&server.http, "GET", "/debug/policies", "");
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let algorithm = |path: &str| {
        json["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["path"] == path)
            .map(|r| r["algorithm"].clone())
    };
    assert_eq!(algorithm("plain"), Some("fixed_window".into()));
    assert_eq!(algorithm("named"), Some("sliding_window_log".into()));
}

/// A limit of 0 never admits: under every algorithm its denial says when to come
/// back, in `duration_until_reset` and `x-ratelimit-reset` as in `retry-after`: one
/// window, or the end of the current one for a fixed window, never 0.
#[tokio::test]
async fn a_zero_limit_tells_a_reset_under_every_algorithm() {
    const ALGORITHMS: [&str; 5] = [
        "fixed_window",
        "sliding_window_counter",
        "sliding_window_log",
        "token_bucket",
        "leaky_bucket",
    ];
    let policy: String = ALGORITHMS
        .iter()
        .map(|a| {
            format!(
                "  - key: {a}\n    rate_limit: {{unit: minute, requests_per_unit: 0, algorithm: {a}}}\n"
            )
        })
        .collect();
    let server = Server::start(&format!("domain: zero\ndescriptors:\n{policy}"), &[]);
    let mut c = server.client().await;
    for a in ALGORITHMS {
        let r = call(&mut c, request("zero", vec![desc(&[(a, "x")])])).await;
        assert_eq!(r.overall_code, OVER_LIMIT, "{a}");
        let d = r.statuses[0].duration_until_reset.expect("a reset");
        let reset = d.seconds as u64 + u64::from(d.nanos > 0);
        if a == "fixed_window" {
            assert!((1..=60).contains(&reset), "{a}: {d:?}");
        } else {
            assert_eq!(reset, 60, "{a}: {d:?}");
        }
        assert_eq!(
            header(&r, "x-ratelimit-reset"),
            Some(reset.to_string().as_str()),
            "{a}"
        );
        let retry: u64 = header(&r, "retry-after")
            .expect("retry-after")
            .parse()
            .unwrap();
        assert!(retry >= reset, "{a}: retry-after {retry}, reset {reset}");
    }
}
