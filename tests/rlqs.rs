//! The Rate Limit Quota Service through the real server's gRPC port: streams opened
//! with the generated RLQS client, the way Envoy's rate_limit_quota filter talks.
//! Two replicas behind one Redis share one limit between the streams they serve.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::otlp::{attr, text, Receiver};
use common::redis::{available, RedisServer};
use common::Server;
use futures::channel::mpsc;
use futures::SinkExt;
use opentelemetry_proto::tonic::trace::v1::{span, Span};
use prost_types::Duration as PbDuration;
use sluice::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use sluice::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use sluice::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use sluice::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use sluice::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tonic::Streaming;

const POLICY: &str = "domain: rlqs\ndescriptors:\n  - key: route\n    value: api\n    rate_limit: {unit: second, requests_per_unit: 20}\n";

/// The bucket {route: api}.
fn api() -> BucketId {
    let mut bucket = HashMap::new();
    bucket.insert("route".to_string(), "api".to_string());
    BucketId { bucket }
}

/// One open stream: reports go in, answers come out.
struct Quota {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
}

impl Quota {
    async fn open(server: &Server) -> Quota {
        Self::open_with(server, &[]).await
    }

    /// A stream opened with `metadata` (a `traceparent`, as Envoy sends it).
    async fn open_with(server: &Server, metadata: &[(&'static str, &str)]) -> Quota {
        let url = format!("http://{}", server.grpc);
        let mut client = RateLimitQuotaServiceClient::connect(url)
            .await
            .expect("connect");
        let (tx, rx) = mpsc::channel(4);
        let mut request = tonic::Request::new(rx);
        for (k, v) in metadata {
            request
                .metadata_mut()
                .insert(*k, v.parse().expect("metadata"));
        }
        let answers = client
            .stream_rate_limit_quotas(request)
            .await
            .expect("stream")
            .into_inner();
        Quota { tx, rx: answers }
    }

    /// Reports `requests` in the last `secs` for the bucket {route: api, extra...};
    /// returns the answer's token bucket `(max_tokens, tokens_per_fill)` (per 10 s
    /// for the policy's 20 a second) and TTL.
    async fn report(&mut self, requests: u64, secs: i64) -> (Option<(u32, u32)>, i64) {
        self.report_bucket(&api(), requests / 2, requests - requests / 2, secs)
            .await
    }

    /// Reports `allowed` and `denied` requests in the last `secs` for the bucket
    /// `id`; returns the answer as [`Quota::read`] does.
    async fn report_bucket(
        &mut self,
        id: &BucketId,
        allowed: u64,
        denied: u64,
        secs: i64,
    ) -> (Option<(u32, u32)>, i64) {
        self.tx
            .send(RateLimitQuotaUsageReports {
                domain: "rlqs".into(),
                bucket_quota_usages: vec![BucketQuotaUsage {
                    bucket_id: Some(id.clone()),
                    time_elapsed: Some(PbDuration {
                        seconds: secs,
                        nanos: 0,
                    }),
                    num_requests_allowed: allowed,
                    num_requests_denied: denied,
                }],
            })
            .await
            .expect("send");
        self.read(id).await
    }

    /// The next message on the stream, an answer or an assignment sent unasked, for
    /// the one bucket `id`: its token bucket `(max_tokens, tokens_per_fill)` and TTL.
    async fn read(&mut self, id: &BucketId) -> (Option<(u32, u32)>, i64) {
        let answer = tokio::time::timeout(Duration::from_secs(5), self.rx.message())
            .await
            .expect("answered within 5 s")
            .expect("no error")
            .expect("a message");
        let action = &answer.bucket_action[0];
        assert_eq!(
            action.bucket_id.as_ref(),
            Some(id),
            "the bucket id is echoed"
        );
        let Some(Action::QuotaAssignmentAction(q)) = &action.bucket_action else {
            panic!("an assignment: {action:?}")
        };
        let ttl = q.assignment_time_to_live.unwrap().seconds;
        match q.rate_limit_strategy.unwrap().strategy.unwrap() {
            Strategy::TokenBucket(tb) => (Some((tb.max_tokens, tb.tokens_per_fill.unwrap())), ttl),
            other => {
                assert!(matches!(other, Strategy::BlanketRule(_)), "{other:?}");
                (None, ttl)
            }
        }
    }
}

#[tokio::test]
async fn streams_on_one_server_share_its_limit_by_demand() {
    let server = Server::start(POLICY, &["--rlqs-assignment-ttl", "12s"]);
    let mut a = Quota::open(&server).await;
    let mut b = Quota::open(&server).await;
    assert_eq!(a.report(45, 1).await, (Some((20, 200)), 12), "alone: all");
    assert_eq!(b.report(15, 1).await.0, Some((5, 50)), "15 of 60 a second");
    // b's report moved the split: a's new share comes unasked, before a reports.
    assert_eq!(
        a.read(&api()).await,
        (Some((15, 150)), 12),
        "45 of 60, pushed"
    );
    assert_eq!(a.report(45, 1).await.0, Some((15, 150)), "45 of 60");
    // A stream that ends takes its demand with it.
    drop(b);
    let mut shares = None;
    for _ in 0..50 {
        shares = a.report(45, 1).await.0;
        if shares == Some((20, 200)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shares, Some((20, 200)), "alone again");
}

#[tokio::test]
async fn a_policy_reload_reaches_an_open_stream_at_its_next_report() {
    let server = Server::start(POLICY, &[]);
    let mut q = Quota::open(&server).await;
    assert_eq!(q.report(45, 1).await.0, Some((20, 200)));
    // Only the burst changes: the rate, and so tokens_per_fill, stay.
    let burst = POLICY.replace(
        "requests_per_unit: 20}",
        "requests_per_unit: 20, algorithm: token_bucket, burst: 60}",
    );
    common::write_atomic(&server.policy_path(), &burst);
    server
        .wait_line(Duration::from_secs(10), "the policy reload", |l| {
            l.contains("policy reloaded from files")
        })
        .await;
    assert_eq!(q.report(45, 1).await.0, Some((60, 200)), "the new burst");
}

/// The bucket {client: ip} of a rule with a penalty, 10 a second.
const PENALTY: &str = "domain: rlqs\ndescriptors:\n  - key: client\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      penalty: {violations: 3, within: 10s, ban: 2s}\n";

#[tokio::test]
async fn a_penalty_ban_ends_while_the_client_keeps_sending() {
    let server = Server::start(PENALTY, &[]);
    let mut q = Quota::open(&server).await;
    let client = BucketId {
        bucket: [("client".to_string(), "10.0.0.1".to_string())].into(),
    };
    assert!(q.report_bucket(&client, 10, 0, 1).await.0.is_some());
    // Three denials: DENY_ALL for the 2 s of the ban, not the 15 s TTL.
    assert_eq!(q.report_bucket(&client, 10, 3, 1).await, (None, 2));
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // Envoy denied everything until now: the ban is over all the same.
    let after = q.report_bucket(&client, 0, 40, 2).await;
    assert!(after.0.is_some(), "a token bucket again: {after:?}");
    assert_eq!(
        server.metric(
            "sluice_penalty_bans_total",
            &[("domain", "rlqs"), ("rule", "client")]
        ),
        Some(1.0)
    );
}

/// Polls `/metrics` until `name{labels}` reads `want` (5 s at most).
async fn wait_metric(server: &Server, name: &str, labels: &[(&str, &str)], want: f64) {
    let mut have = None;
    for _ in 0..100 {
        have = server.metric(name, labels);
        if have == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name}{labels:?} is {have:?}, want {want}");
}

#[tokio::test]
async fn metrics_show_streams_buckets_reports_and_assignments() {
    let server = Server::start(POLICY, &[]);
    assert_eq!(server.metric("sluice_rlqs_streams", &[]), Some(0.0));
    let mut a = Quota::open(&server).await;
    let mut b = Quota::open(&server).await;
    a.report(45, 1).await;
    a.report(45, 1).await;
    b.report(15, 1).await;
    assert_eq!(a.read(&api()).await.0, Some((15, 150)), "pushed");
    assert_eq!(server.metric("sluice_rlqs_streams", &[]), Some(2.0));
    assert_eq!(server.metric("sluice_rlqs_buckets", &[]), Some(2.0));
    assert_eq!(
        server.metric("sluice_rlqs_reports_total", &[("domain", "rlqs")]),
        Some(3.0)
    );
    let kind = |k| [("domain", "rlqs"), ("rule", "route"), ("kind", k)];
    assert_eq!(
        server.metric("sluice_rlqs_assignments_total", &kind("token_bucket")),
        Some(4.0)
    );
    assert_eq!(
        server.metric("sluice_rlqs_assignments_total", &kind("deny_all")),
        None
    );
    // An Envoy that goes takes its stream and its buckets out of the gauges.
    drop(b);
    wait_metric(&server, "sluice_rlqs_streams", &[], 1.0).await;
    assert_eq!(server.metric("sluice_rlqs_buckets", &[]), Some(1.0));
}

/// A rule a reload removed takes its RLQS assignment series out of `/metrics`, and
/// out of the `--prometheus-addr` port's, as a `ShouldRateLimit` rule's series go;
/// the rule that stays keeps its count.
#[tokio::test]
async fn a_removed_rules_assignment_series_leave_with_it() {
    let tenant = "  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 20}\n";
    let server = Server::start(
        &format!("{POLICY}{tenant}"),
        &["--prometheus-addr", "127.0.0.1:0"],
    );
    let prometheus = server.prometheus_addr();
    let mut q = Quota::open(&server).await;
    q.report(10, 1).await;
    let mut t = HashMap::new();
    t.insert("tenant".to_string(), "t1".to_string());
    q.report_bucket(&BucketId { bucket: t }, 5, 0, 1).await;
    fn assigned(rule: &str) -> [(&str, &str); 3] {
        [("domain", "rlqs"), ("rule", rule), ("kind", "token_bucket")]
    }
    let scrapes = || {
        let (_, own) = common::http(&prometheus, "GET", "/metrics", "");
        let (_, http) = common::http(&server.http, "GET", "/metrics", "");
        [http, own]
    };
    for text in scrapes() {
        for rule in ["route", "tenant"] {
            let n = common::sample(&text, "sluice_rlqs_assignments_total", &assigned(rule));
            assert_eq!(n, Some(1.0), "{rule} in\n{text}");
        }
    }

    common::write_atomic(&server.policy_path(), POLICY);
    common::eventually(
        Duration::from_secs(10),
        "the tenant rule's series gone",
        || {
            let gone = scrapes()
                .iter()
                .all(|text| !text.contains("rule=\"tenant\""));
            async move { gone }
        },
    )
    .await;
    for text in scrapes() {
        let n = common::sample(&text, "sluice_rlqs_assignments_total", &assigned("route"));
        assert_eq!(n, Some(1.0), "the rule that stays keeps its count:\n{text}");
    }
}

#[tokio::test]
async fn a_report_without_domain_ends_the_stream_with_invalid_argument() {
    let server = Server::start(POLICY, &[]);
    let invalid = server.metric("sluice_invalid_requests_total", &[]);
    let url = format!("http://{}", server.grpc);
    let mut client = RateLimitQuotaServiceClient::connect(url).await.unwrap();
    let reports = futures::stream::iter(vec![RateLimitQuotaUsageReports::default()]);
    let status = match client.stream_rate_limit_quotas(reports).await {
        Err(s) => s,
        Ok(r) => r.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("must name its domain"),
        "{status:?}"
    );
    assert_eq!(
        server.metric("sluice_invalid_requests_total", &[]),
        invalid.map(|n| n + 1.0)
    );
    assert_eq!(
        server.metric("sluice_rlqs_reports_total", &[("domain", "")]),
        None,
        "a refused report is not counted as answered"
    );
    wait_metric(&server, "sluice_rlqs_streams", &[], 0.0).await;
}

/// The token bucket `(max_tokens, tokens_per_fill)` of each action of `answer`, by
/// the id it echoes (`None` for a blanket rule).
fn token_buckets(answer: &RateLimitQuotaResponse) -> Vec<(BucketId, Option<(u32, u32)>)> {
    answer
        .bucket_action
        .iter()
        .map(|a| {
            let Some(Action::QuotaAssignmentAction(q)) = &a.bucket_action else {
                panic!("an assignment: {a:?}")
            };
            let tb = match q.rate_limit_strategy.unwrap().strategy.unwrap() {
                Strategy::TokenBucket(tb) => Some((tb.max_tokens, tb.tokens_per_fill.unwrap())),
                _ => None,
            };
            (a.bucket_id.clone().expect("an id"), tb)
        })
        .collect()
}

#[tokio::test]
async fn a_bucket_id_past_its_size_is_decided_and_the_stream_goes_on() {
    // {route: api} at 20 a second, any {client: ...} at 10.
    let policy = format!(
        "{POLICY}  - key: client\n    rate_limit: {{unit: second, requests_per_unit: 10}}\n"
    );
    let server = Server::start(&policy, &[]);
    // A client header of 5,000 bytes, as Envoy's bucket_id_builder takes it.
    let big = BucketId {
        bucket: [("client".to_string(), "x".repeat(5_000))].into(),
    };
    let mut q = Quota::open(&server).await;
    for n in 1..=2 {
        let usage = |id: &BucketId| BucketQuotaUsage {
            bucket_id: Some(id.clone()),
            time_elapsed: Some(PbDuration {
                seconds: 1,
                nanos: 0,
            }),
            num_requests_allowed: 5,
            num_requests_denied: 0,
        };
        q.tx.send(RateLimitQuotaUsageReports {
            domain: "rlqs".into(),
            bucket_quota_usages: vec![usage(&api()), usage(&big)],
        })
        .await
        .expect("the stream is open");
        let answer = tokio::time::timeout(Duration::from_secs(5), q.rx.message())
            .await
            .expect("answered within 5 s")
            .expect("no error: the stream goes on")
            .expect("an answer");
        // Each decided against its own limit, the long id echoed as sent.
        assert_eq!(
            token_buckets(&answer),
            vec![(api(), Some((20, 200))), (big.clone(), Some((10, 100)))],
            "report {n}"
        );
    }
    let irregular = [("domain", "rlqs"), ("reason", "id_too_large")];
    assert_eq!(
        server.metric("sluice_rlqs_irregular_buckets_total", &irregular),
        Some(2.0)
    );
    assert_eq!(
        server
            .metric("sluice_invalid_requests_total", &[])
            .unwrap_or(0.0),
        0.0
    );
    assert_eq!(server.metric("sluice_rlqs_streams", &[]), Some(1.0));
    assert_eq!(server.metric("sluice_rlqs_buckets", &[]), Some(2.0));
    server
        .wait_line(Duration::from_secs(5), "the bucket's log line", |l| {
            l.contains("RLQS bucket answered apart") && l.contains("id_too_large")
        })
        .await;
}

#[tokio::test]
async fn replicas_behind_one_redis_share_one_limit() {
    if !available() {
        eprintln!("SKIP: redis-server not installed");
        return;
    }
    let mut redis = RedisServer::start().await;
    let url = redis.url();
    let one = Server::start(POLICY, &["--redis", &url]);
    let two = Server::start(POLICY, &["--redis", &url]);
    let mut a = Quota::open(&one).await;
    let mut b = Quota::open(&two).await;
    assert_eq!(a.report(45, 1).await.0, Some((20, 200)));
    // b's replica sees a's demand through Redis.
    assert_eq!(b.report(15, 1).await.0, Some((5, 50)));
    assert_eq!(a.report(45, 1).await.0, Some((15, 150)));
    // Redis gone: each stream keeps its last assignment.
    redis.kill();
    assert_eq!(a.report(90, 1).await.0, Some((15, 150)));
    assert_eq!(b.report(90, 1).await.0, Some((5, 50)));
}

/// A rule with a minute's ban after three denials, and streams' assignments alive
/// 90 s: an answer alive 60 s is the ban's `DENY_ALL`.
const MINUTE_BAN: &str = "domain: rlqs\ndescriptors:\n  - key: client\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      penalty: {violations: 3, within: 1m, ban: 1m}\n";

#[tokio::test]
async fn replicas_behind_one_redis_count_denials_and_ban_as_one() {
    if !available() {
        eprintln!("SKIP: redis-server not installed");
        return;
    }
    let redis = RedisServer::start().await;
    let url = redis.url();
    let flags = ["--redis", &url, "--rlqs-assignment-ttl", "90s"];
    let one = Server::start(MINUTE_BAN, &flags);
    let two = Server::start(MINUTE_BAN, &flags);
    let client = BucketId {
        bucket: [("client".to_string(), "10.0.0.1".to_string())].into(),
    };
    let mut a = Quota::open(&one).await;
    let mut b = Quota::open(&two).await;
    let (bucket, ttl) = a.report_bucket(&client, 10, 2, 1).await;
    assert!(bucket.is_some() && ttl == 90, "two denials ban no one");
    // The third denial, reported to the other replica, reaches the count.
    assert_eq!(b.report_bucket(&client, 10, 1, 1).await, (None, 60));
    assert_eq!(
        two.metric(
            "sluice_penalty_bans_total",
            &[("domain", "rlqs"), ("rule", "client")]
        ),
        Some(1.0)
    );
    // The first replica denies the key too: its streams, and ShouldRateLimit.
    let mut rls = one.client().await;
    common::eventually(
        Duration::from_secs(5),
        "the ban holds on ShouldRateLimit",
        || {
            let mut rls = rls.clone();
            async move {
                let asked = common::request("rlqs", vec![common::desc(&[("client", "10.0.0.1")])]);
                common::call(&mut rls, asked).await.overall_code == common::OVER_LIMIT
            }
        },
    )
    .await;
    let (bucket, ttl) = a.report_bucket(&client, 1, 0, 1).await;
    assert!(
        bucket.is_none() && ttl <= 60,
        "the other stream is denied: {ttl}"
    );
    assert_eq!(
        common::call(
            &mut rls,
            common::request("rlqs", vec![common::desc(&[("client", "10.0.0.2")])])
        )
        .await
        .overall_code,
        common::OK,
        "another client is not"
    );
}

#[tokio::test]
async fn with_redis_hung_a_report_of_many_buckets_is_answered_within_one_store_wait() {
    if !available() {
        eprintln!("SKIP: redis-server not installed");
        return;
    }
    let redis = RedisServer::start().await;
    let policy = "domain: rlqs\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 10}\n";
    let server = Server::start(policy, &["--redis", &redis.url()]);
    let mut q = Quota::open(&server).await;
    let report = RateLimitQuotaUsageReports {
        domain: "rlqs".into(),
        bucket_quota_usages: (0..40)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [("client".to_string(), format!("10.0.0.{i}"))].into(),
                }),
                num_requests_allowed: 1,
                ..Default::default()
            })
            .collect(),
    };
    q.tx.send(report.clone()).await.unwrap();
    let first = q.rx.message().await.unwrap().expect("an answer");
    redis.freeze();
    let asked = std::time::Instant::now();
    q.tx.send(report).await.unwrap();
    // One bucket after the other, 40 waits of 500 ms: 20 s, past the 15 s TTL.
    let answer = tokio::time::timeout(Duration::from_secs(3), q.rx.message())
        .await
        .expect("answered within one store wait")
        .unwrap()
        .expect("an answer");
    let took = asked.elapsed();
    redis.thaw();
    assert_eq!(
        answer, first,
        "each bucket keeps its last assignment ({took:?})"
    );
}

/// A report of `buckets` buckets {client: ...}, each value `width` bytes.
fn clients(buckets: usize, width: usize) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "rlqs".into(),
        bucket_quota_usages: (0..buckets)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [("client".to_string(), format!("{i:0width$}"))].into(),
                }),
                num_requests_allowed: 1,
                ..Default::default()
            })
            .collect(),
    }
}

#[tokio::test]
async fn a_report_of_thousands_of_buckets_is_answered_and_a_too_large_one_counted() {
    use prost::Message;
    let server = Server::start(POLICY, &[]);
    let many = clients(3_000, 16);
    assert!(many.encoded_len() > 64 * 1024, "past --max-request-bytes");
    let mut q = Quota::open(&server).await;
    q.tx.send(many).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), q.rx.message())
        .await
        .expect("answered")
        .expect("no error")
        .expect("an answer");
    assert_eq!(answer.bucket_action.len(), 3_000);
    // Past what a stream may track: refused, counted and logged.
    let huge = clients(10_001, 1_200);
    let mut q = Quota::open(&server).await;
    q.tx.send(huge).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), q.rx.message())
        .await
        .expect("answered")
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    wait_metric(&server, "sluice_rlqs_oversized_reports_total", &[], 1.0).await;
    server
        .wait_line(Duration::from_secs(5), "the refusal's log line", |l| {
            l.contains("RLQS report refused")
        })
        .await;
}

/// Each RLQS report gets a server span, the child of the `traceparent` the stream
/// opened with, with the domain, the bucket count and one event per bucket naming
/// its assignment, exported over OTLP/HTTP to a receiver; the bucket's values
/// (what Envoy's matchers took from requests) appear in none.
#[tokio::test]
async fn each_report_is_a_span_under_the_streams_traceparent() {
    let receiver = Receiver::start().await;
    let server = receiver.serve(POLICY, &[("OTEL_SERVICE_NAME", "sluice-rlqs")]);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut q = Quota::open_with(&server, &[("traceparent", parent)]).await;
    q.report(10, 1).await;
    q.report(10, 1).await;

    const REPORT: &str =
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let reports = loop {
        let reports: Vec<(String, Span)> = receiver
            .spans()
            .into_iter()
            .filter(|(_, s)| s.name == REPORT)
            .collect();
        if reports.len() >= 2 || std::time::Instant::now() > deadline {
            break reports;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(reports.len(), 2, "one span per report: {reports:?}");
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    for (service, span) in &reports {
        assert_eq!(service, "sluice-rlqs");
        assert_eq!(hex(&span.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&span.parent_span_id), "00f067aa0ba902b7");
        assert_eq!(span.kind, span::SpanKind::Server as i32);
        assert_eq!(
            attr(&span.attributes, "ratelimit.domain").as_deref(),
            Some("rlqs")
        );
        assert_eq!(
            attr(&span.attributes, "ratelimit.buckets").as_deref(),
            Some("1")
        );
        assert_eq!(
            attr(&span.attributes, "rpc.method").as_deref(),
            Some("StreamRateLimitQuotas")
        );
        let buckets: Vec<_> = span
            .events
            .iter()
            .filter(|e| e.name == "ratelimit.bucket")
            .collect();
        assert_eq!(buckets.len(), 1, "{:?}", span.events);
        assert_eq!(
            attr(&buckets[0].attributes, "ratelimit.assignment").as_deref(),
            Some("token_bucket")
        );
        let values = span
            .attributes
            .iter()
            .chain(span.events.iter().flat_map(|e| &e.attributes))
            .map(|kv| text(kv.value.as_ref()))
            .collect::<Vec<_>>();
        assert!(
            !values.iter().any(|v| v == "api"),
            "a bucket value: {values:?}"
        );
    }
    assert_ne!(reports[0].1.span_id, reports[1].1.span_id, "a span each");
}

/// A report that is not a `RateLimitQuotaUsageReports` at all ends its stream with
/// INVALID_ARGUMENT and, as any report, gets its span under the stream's
/// `traceparent`: the refusal, not an error of Sluice's.
#[tokio::test]
async fn an_undecodable_report_has_a_span_with_its_refusal() {
    let receiver = Receiver::start().await;
    let server = receiver.serve(POLICY, &[]);
    let (mut h2, _conn) = server.h2().await;
    let request = server
        .grpc_post("/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .body(())
        .unwrap();
    let (response, mut send) = h2.send_request(request, false).unwrap();
    // One gRPC message of three bytes that are not protobuf.
    let frame = bytes::Bytes::from_static(&[0, 0, 0, 0, 3, 0x12, 0x05, 0x0a]);
    send.send_data(frame, true).unwrap();
    let mut body = response.await.unwrap().into_body();
    while let Some(chunk) = body.data().await {
        chunk.unwrap();
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"3"[..]),
        "{trailers:?}"
    );

    let spans = receiver
        .wait(Duration::from_secs(20), "span of the report", |s| {
            s.iter()
                .any(|s| common::otlp::hex(&s.trace_id) == "4bf92f3577b34da6a3ce929d0e0e4736")
        })
        .await;
    let span = spans
        .iter()
        .find(|s| common::otlp::hex(&s.trace_id) == "4bf92f3577b34da6a3ce929d0e0e4736")
        .unwrap();
    assert_eq!(
        span.name,
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
    );
    // INVALID_ARGUMENT is Envoy's fault, not Sluice's: no error status, as
    // OpenTelemetry's conventions for gRPC servers say, and the reason on the span.
    assert_eq!(
        span.status.as_ref().map_or(0, |s| s.code),
        opentelemetry_proto::tonic::trace::v1::status::StatusCode::Unset as i32,
        "{span:?}"
    );
    assert!(
        common::otlp::attr(&span.attributes, "ratelimit.refusal").is_some(),
        "{span:?}"
    );
}
