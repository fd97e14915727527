//! Several rates on one key (`rate_limits`) through the running server: the answer
//! describes the limit nearest its end, a limit's denial spends nothing of the
//! others, and with Redis every limit of a key is decided in one script call.

use crate::common;

use common::redis::{available, keys, script_calls, RedisServer};
use common::*;
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, RateLimit};

/// Sliding logs: exact, with no window boundary a test could straddle.
const POLICY: &str = "domain: api
descriptors:
  - key: api_key
    rate_limits:
      - {unit: hour, requests_per_unit: 2, algorithm: sliding_window_log}
      - {unit: day, requests_per_unit: 5, algorithm: sliding_window_log, name: daily}
  - key: tenant
    rate_limits:
      - {unit: hour, requests_per_unit: 5, algorithm: sliding_window_log}
      - {unit: day, requests_per_unit: 2, algorithm: sliding_window_log, name: daily}
";

const HOUR_SECS: u64 = 3_600;

fn reported(
    resp: &sluice::pb::envoy::service::ratelimit::v3::RateLimitResponse,
) -> (u32, i32, String) {
    let limit: &RateLimit = resp.statuses[0]
        .current_limit
        .as_ref()
        .expect("current_limit");
    (limit.requests_per_unit, limit.unit, limit.name.clone())
}

fn retry_after(resp: &sluice::pb::envoy::service::ratelimit::v3::RateLimitResponse) -> u64 {
    header(resp, "retry-after")
        .expect("retry-after on a denial")
        .parse()
        .expect("whole seconds")
}

const HOUR: i32 = 3;
const DAY: i32 = 4;

/// The requests of both tests, against a server on any store.
async fn two_keys_two_rates(server: &Server) {
    let mut client = server.client().await;
    let key = || request("api", vec![desc(&[("api_key", "k1")])]);

    // The hour (1 left) is nearer its limit than the day (4 left).
    let r = call(&mut client, key()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(reported(&r), (2, HOUR, String::new()));
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert!(header(&r, "x-ratelimit-limit")
        .unwrap()
        .starts_with("2, 2;w=3600"));
    assert_eq!(header(&r, "x-ratelimit-remaining"), Some("1"));

    let r = call(&mut client, key()).await;
    assert_eq!(r.overall_code, Code::Ok as i32);

    // The hour denies, and the answer describes it: the wait is within the hour.
    let r = call(&mut client, key()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(reported(&r), (2, HOUR, String::new()));
    assert!(
        retry_after(&r) <= HOUR_SECS * 11 / 10,
        "{}",
        retry_after(&r)
    );

    // Another key: the day (2 per day) is the nearer limit, and it denies for longer
    // than the hour would.
    let tenant = || request("api", vec![desc(&[("tenant", "t1")])]);
    let r = call(&mut client, tenant()).await;
    assert_eq!(reported(&r), (2, DAY, "daily".to_string()));
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert!(header(&r, "x-ratelimit-limit")
        .unwrap()
        .starts_with("2, 2;w=86400;name=\"daily\""));
    call(&mut client, tenant()).await;
    let r = call(&mut client, tenant()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(reported(&r), (2, DAY, "daily".to_string()));
    assert!(
        retry_after(&r) > HOUR_SECS,
        "the day's wait: {}",
        retry_after(&r)
    );
}

#[tokio::test]
async fn several_rates_on_one_key_in_memory() {
    let server = Server::start(POLICY, &[]);
    two_keys_two_rates(&server).await;
}

#[tokio::test]
async fn several_rates_on_one_key_are_one_script_call_on_redis() {
    if !available() {
        return;
    }
    let shards = [RedisServer::start().await, RedisServer::start().await];
    let urls = format!("{},{}", shards[0].url(), shards[1].url());
    let server = Server::start(POLICY, &["--redis", &urls]);
    let mut conns = Vec::new();
    for s in &shards {
        conns.push(s.conn().await);
    }
    let mut before = 0;
    for c in &mut conns {
        before += script_calls(c).await;
    }
    // Two admitted requests of two rates each: two calls, not four.
    let mut client = server.client().await;
    for _ in 0..2 {
        let r = call(
            &mut client,
            request("api", vec![desc(&[("api_key", "k2")])]),
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let mut after = 0;
    for c in &mut conns {
        after += script_calls(c).await;
    }
    assert_eq!(after - before, 2, "one script call per request");
    // Both counters of the key live on one shard.
    let mut holders = Vec::new();
    for c in &mut conns {
        let k: Vec<String> = keys(c)
            .await
            .into_iter()
            .filter(|k| k.contains("api_key=k2"))
            .collect();
        holders.push(k.len());
    }
    holders.sort_unstable();
    assert_eq!(holders, [0, 2], "both rates of one key on one shard");

    two_keys_two_rates(&server).await;
}
