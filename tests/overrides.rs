//! What Envoy Gateway's Envoy sends, through the running server: a descriptor's
//! `limit` override (per-tenant limits from request metadata) and per-descriptor
//! `hits_addend` (request and response cost), over gRPC and `/json`.

use crate::common;

use common::*;
use sluice::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use sluice::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

/// Envoy Gateway's shape: the route, then one entry per rule match.
const POLICY: &str = r#"
domain: default/eg/http
descriptors:
  - key: httproute/default/api/rule/0/match/0/api_example_com
    value: httproute/default/api/rule/0/match/0/api_example_com
    descriptors:
      - key: rule-0-match-0
        rate_limit: {unit: MINUTE, requests_per_unit: 2}
"#;
const DOMAIN: &str = "default/eg/http";
const ROUTE: &str = "httproute/default/api/rule/0/match/0/api_example_com";
const MINUTE: i32 = 2;
const HOUR: i32 = 3;

fn tenant(name: &str, limit: Option<(u32, i32)>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
            requests_per_unit,
            unit,
        }),
        ..desc(&[(ROUTE, ROUTE), ("rule-0-match-0", name)])
    }
}

#[tokio::test]
async fn a_limit_override_sets_each_tenants_limit_and_counts_apart() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    // Tenant a pays for 4 a minute, tenant b for 1; the configured limit is 2.
    for left in (0..4).rev() {
        let r = call(
            &mut c,
            request(DOMAIN, vec![tenant("a", Some((4, MINUTE)))]),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (4, MINUTE));
        assert_eq!(r.statuses[0].limit_remaining, left);
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("4, 4;w=60"));
    }
    let r = call(
        &mut c,
        request(DOMAIN, vec![tenant("a", Some((4, MINUTE)))]),
    )
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert!(header(&r, "retry-after").is_some());

    let r = call(
        &mut c,
        request(DOMAIN, vec![tenant("b", Some((1, MINUTE)))]),
    )
    .await;
    assert_eq!(r.overall_code, OK, "tenant b has its own count");
    let r = call(
        &mut c,
        request(DOMAIN, vec![tenant("b", Some((1, MINUTE)))]),
    )
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT);

    // Without metadata Envoy sends no override: the configured limit, its own count.
    let r = call(&mut c, request(DOMAIN, vec![tenant("a", None)])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(first_limit(&r), Some(2));

    // Tenant a upgraded within the minute: what it spent still counts.
    let r = call(
        &mut c,
        request(DOMAIN, vec![tenant("a", Some((6, MINUTE)))]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    // Another unit is another count.
    let r = call(&mut c, request(DOMAIN, vec![tenant("a", Some((1, HOUR)))])).await;
    assert_eq!(r.overall_code, OK);

    // The same through /json.
    let body = format!(
        r#"{{"domain":"{DOMAIN}","descriptors":[{{"entries":[{{"key":"{ROUTE}","value":"{ROUTE}"}},{{"key":"rule-0-match-0","value":"c"}}],"limit":{{"requestsPerUnit":1,"unit":"MINUTE"}}}}]}}"#
    );
    assert_eq!(http(&server.http, "POST", "/json", &body).0, 200);
    let (status, answer) = http(&server.http, "POST", "/json", &body);
    assert_eq!(status, 429, "{answer}");
    assert!(answer.contains(r#""requestsPerUnit":1"#), "{answer}");
}

#[tokio::test]
async fn an_override_with_no_unit_is_refused() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    for unit in [0, 42] {
        let err = c
            .should_rate_limit(request(DOMAIN, vec![tenant("a", Some((4, unit)))]))
            .await
            .expect_err("no unit");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().contains("limit override has unit"),
            "{}",
            err.message()
        );
    }
    let r = call(
        &mut c,
        request(DOMAIN, vec![tenant("a", Some((4, MINUTE)))]),
    )
    .await;
    assert_eq!(r.overall_code, OK, "nothing was spent by the refused calls");
    assert_eq!(r.statuses[0].limit_remaining, 3);
}

#[tokio::test]
async fn request_and_response_costs_are_hits_addends() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let costly = |hits: u64| RateLimitDescriptor {
        hits_addend: Some(hits),
        ..tenant("a", Some((10, MINUTE)))
    };
    // A request cost of 3, then (apply_on_stream_done) a response cost of 5.
    let r = call(&mut c, request(DOMAIN, vec![costly(3)])).await;
    assert_eq!(r.statuses[0].limit_remaining, 7);
    let r = call(&mut c, request(DOMAIN, vec![costly(5)])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    // A cost of 0 checks without spending.
    let r = call(&mut c, request(DOMAIN, vec![costly(0)])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 2));
    // A cost larger than what is left is a charge for work already done: spent
    // whole (OVER_LIMIT says it did not fit), and the 1 over is owed, so the next
    // check refuses the next request.
    let r = call(&mut c, request(DOMAIN, vec![costly(3)])).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OVER_LIMIT, 0)
    );
    let r = call(&mut c, request(DOMAIN, vec![costly(0)])).await;
    assert_eq!(r.overall_code, OVER_LIMIT, "a check passed while owing");
}

/// Envoy Gateway's `cost.response` (and the AI Gateway's token quotas): a check
/// before each request (`cost.request` 0, or no cost: 1) and the tokens charged when
/// the stream ends. A client whose every response costs more than is left is
/// refused after its budget, where refusing the charges would let it spend forever.
#[tokio::test]
async fn a_client_whose_responses_overshoot_is_denied_after_its_budget() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let with_cost = |hits: u64| RateLimitDescriptor {
        hits_addend: Some(hits),
        ..tenant("llm", Some((100, MINUTE)))
    };
    let mut served = 0;
    let mut spent = 0;
    for _ in 0..10 {
        let r = call(&mut c, request(DOMAIN, vec![with_cost(0)])).await;
        if r.overall_code != OK {
            break;
        }
        served += 1;
        // Every response costs 60 tokens: more than the 40 left after the first.
        call(&mut c, request(DOMAIN, vec![with_cost(60)])).await;
        spent += 60;
    }
    assert_eq!(
        served, 2,
        "the budget of 100 admits two requests, then denies"
    );
    assert!(
        spent <= 100 + 60,
        "spent {spent}: over the limit plus one cost"
    );
    // A request with no cost of its own (the AI Gateway's check: 1) is refused too.
    let r = call(
        &mut c,
        request(DOMAIN, vec![tenant("llm", Some((100, MINUTE)))]),
    )
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT);
}

/// A reservation: an estimate charged at the request, then at stream end the
/// estimate given back (`is_negative_hits`) and the actual cost charged, in one call.
/// Refunds never answer OVER_LIMIT and stop at an empty counter.
#[tokio::test]
async fn refunds_give_reservations_back() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let cost = |hits: u64, refund: bool| RateLimitDescriptor {
        hits_addend: Some(hits),
        is_negative_hits: refund,
        ..tenant("r", Some((100, MINUTE)))
    };
    let mut served = 0;
    for _ in 0..10 {
        let r = call(&mut c, request(DOMAIN, vec![cost(50, false)])).await;
        if r.overall_code != OK {
            break;
        }
        served += 1;
        let r = call(
            &mut c,
            request(DOMAIN, vec![cost(50, true), cost(10, false)]),
        )
        .await;
        assert_eq!(r.overall_code, OK);
    }
    assert_eq!(served, 6, "estimates of 50 costing 10 each, on 100");
    // 60 spent, 50 more charged for the denied reservation: 110, 10 owed. A refund of
    // far more than was spent answers OK and leaves the counter empty, not in credit.
    let r = call(&mut c, request(DOMAIN, vec![cost(500, true)])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 100));
    let r = call(&mut c, request(DOMAIN, vec![cost(101, false)])).await;
    assert_eq!(
        r.overall_code, OVER_LIMIT,
        "a refund left room past the limit"
    );
    // is_negative_hits next to a descriptor without a cost of its own: refused.
    let err = c
        .should_rate_limit(request(
            DOMAIN,
            vec![cost(5, true), tenant("r", Some((100, MINUTE)))],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("is_negative_hits"),
        "{}",
        err.message()
    );
}

/// A tenant that names one entry `route=r|tenant` with the value `t1` spends its own
/// counter, not that of the request with the entries `route=r` and `tenant=t1`.
#[tokio::test]
async fn an_entry_key_holding_separators_cannot_spend_another_tenants_override() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let with_limit = |entries: &[(&str, &str)]| RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: HOUR,
        }),
        ..desc(entries)
    };
    let victim = with_limit(&[("route", "r"), ("tenant", "t1")]);
    let forged = with_limit(&[("route=r|tenant", "t1")]);
    let r = call(&mut c, request(DOMAIN, vec![forged.clone()])).await;
    assert_eq!(r.overall_code, OK);
    let r = call(&mut c, request(DOMAIN, vec![forged])).await;
    assert_eq!(r.overall_code, OVER_LIMIT, "the forger spent its own hour");
    let r = call(&mut c, request(DOMAIN, vec![victim.clone()])).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OK, 0),
        "the victim's counter was untouched"
    );
    let r = call(&mut c, request(DOMAIN, vec![victim])).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
}

/// A `hits_addend` past 2^50 (more than any counter holds) is refused, over gRPC and
/// `/json`, and spends nothing.
#[tokio::test]
async fn a_hits_addend_past_the_largest_count_is_refused() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let costly = |hits: u64| RateLimitDescriptor {
        hits_addend: Some(hits),
        ..tenant("big", Some((10, MINUTE)))
    };
    for hits in [(1 << 50) + 1, u64::MAX] {
        let err = c
            .should_rate_limit(request(DOMAIN, vec![costly(1), costly(hits)]))
            .await
            .expect_err("too many hits");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message()
                .contains(&format!("descriptor 2: hits_addend {hits} is more"))
                && err.message().contains("at most 1125899906842624"),
            "{}",
            err.message()
        );
    }
    let body = format!(
        r#"{{"domain":"{DOMAIN}","descriptors":[{{"entries":[{{"key":"{ROUTE}","value":"{ROUTE}"}},{{"key":"rule-0-match-0","value":"big"}}],"hitsAddend":18446744073709551615}}]}}"#
    );
    let (status, answer) = http(&server.http, "POST", "/json", &body);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("hits_addend"), "{answer}");
    // Nothing was spent, and the largest allowed cost is a charge like any other.
    let r = call(&mut c, request(DOMAIN, vec![costly(0)])).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 10));
    let r = call(&mut c, request(DOMAIN, vec![costly(1 << 50)])).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OVER_LIMIT, 0)
    );
    let (status, metrics) = http(&server.http, "GET", "/metrics", "");
    assert_eq!(
        status, 200,
        "a scrape after the largest charges still answers"
    );
    assert!(metrics.contains("sluice_cost_total"), "{metrics}");
}

/// More descriptors than any route sends are refused before any is decided.
#[tokio::test]
async fn a_request_with_too_many_descriptors_is_refused() {
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let many = vec![tenant("crowd", Some((1000, MINUTE))); 257];
    let err = c
        .should_rate_limit(request(DOMAIN, many))
        .await
        .expect_err("too many descriptors");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message()
            .contains("request has 257 descriptors; at most 256 are allowed"),
        "{}",
        err.message()
    );
    let r = call(
        &mut c,
        request(DOMAIN, vec![tenant("crowd", Some((1000, MINUTE))); 256]),
    )
    .await;
    assert_eq!(
        (r.overall_code, r.statuses[255].limit_remaining),
        (OK, 744),
        "256 are decided, and the refused call spent nothing"
    );
}

/// Envoy Gateway sends a tenant's limit from metadata on every request: an
/// operator's block of the tenant still denies it, over gRPC and `/json`.
#[tokio::test]
async fn an_operators_block_denies_a_request_that_carries_its_own_limit() {
    use sluice::admin::pb;
    let server = Server::start(POLICY, &[]);
    let mut c = server.client().await;
    let generous = Some((1_000, HOUR));
    let r = call(&mut c, request(DOMAIN, vec![tenant("eve", generous)])).await;
    assert_eq!(r.overall_code, OK);
    let entry = |key: &str, value: &str| pb::request_descriptor::Entry {
        key: key.into(),
        value: value.into(),
    };
    server
        .admin_client()
        .await
        .block(pb::BlockRequest {
            domain: DOMAIN.into(),
            entries: vec![entry(ROUTE, ROUTE), entry("rule-0-match-0", "eve")],
            for_micros: 0,
        })
        .await
        .expect("Block");
    let r = call(&mut c, request(DOMAIN, vec![tenant("eve", generous)])).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let wait: u64 = header(&r, "retry-after")
        .expect("retry-after")
        .parse()
        .unwrap();
    assert!(wait > 3_000, "the block's hour, not the limit's: {wait}");
    let body = format!(
        r#"{{"domain":"{DOMAIN}","descriptors":[{{"entries":[{{"key":"{ROUTE}","value":"{ROUTE}"}},{{"key":"rule-0-match-0","value":"eve"}}],"limit":{{"requests_per_unit":1000,"unit":"HOUR"}}}}]}}"#
    );
    let (status, answer) = http(&server.http, "POST", "/json", &body);
    assert_eq!(status, 429, "{answer}");
    // Another tenant under the same override is not blocked.
    let r = call(&mut c, request(DOMAIN, vec![tenant("bob", generous)])).await;
    assert_eq!(r.overall_code, OK);
}
