//! The Rate Limit Quota Service through the real server's gRPC port: streams opened
//! with the generated RLQS client, the way Envoy's rate_limit_quota filter talks.
//! Two replicas behind one Redis share one limit between the streams they serve.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::redis::{available, RedisServer};
use common::Server;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use futures::channel::mpsc;
use futures::SinkExt;
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
        let url = format!("http://{}", server.grpc);
        let mut client = RateLimitQuotaServiceClient::connect(url)
            .await
            .expect("connect");
        let (tx, rx) = mpsc::channel(4);
        let answers = client
            .stream_rate_limit_quotas(rx)
            .await
            .expect("stream")
            .into_inner();
        Quota { tx, rx: answers }
    }

    /// Reports `requests` in the last `secs` for the bucket {route: api, extra...};
    /// returns the answer's token bucket `(max_tokens, tokens_per_fill)` (per 10 s
    /// for the policy's 20 a second) and TTL.
    async fn report(&mut self, requests: u64, secs: i64) -> (Option<(u32, u32)>, i64) {
        let id = api();
        self.tx
            .send(RateLimitQuotaUsageReports {
                domain: "rlqs".into(),
                bucket_quota_usages: vec![BucketQuotaUsage {
                    bucket_id: Some(id.clone()),
                    time_elapsed: Some(PbDuration {
                        seconds: secs,
                        nanos: 0,
                    }),
                    num_requests_allowed: requests / 2,
                    num_requests_denied: requests - requests / 2,
                }],
            })
            .await
            .expect("send");
        self.read(&id).await
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
            Strategy::TokenBucket(tb) => (
                Some((tb.max_tokens, tb.tokens_per_fill.unwrap().value)),
                ttl,
            ),
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
