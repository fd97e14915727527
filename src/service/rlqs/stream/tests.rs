//! A stream's answers to reports, through the real limiter, store and peers.

use super::bucket::MAX_BUCKET_ID_BYTES;
use super::decode::{decode, raw};
use super::*;
use crate::clock::ManualClock;
use crate::limiter::Limiter;
use crate::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::pb::envoy::service::rate_limit_quota::v3::BucketId;
use crate::policy::Policy;
use crate::service::MAX_ENTRIES;
use crate::service::{HeaderStyle, Service};
use crate::store::{Demand, MemoryDemand, MemoryStore, Share, StoreError};
use crate::telemetry::Metrics;
use bytes::Bytes;
use futures::executor::block_on;
use futures::future::BoxFuture;
use prost::Message;
use prost_types::Duration as PbDuration;

const POLICY: &str = "domain: edge\ndescriptors:\n  - key: route\n    value: api\n    rate_limit: {unit: second, requests_per_unit: 20}\n  - key: route\n    value: free\n    rate_limit: {unlimited: true}\n  - key: route\n    value: closed\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: client\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      penalty: {violations: 3, within: 10s, ban: 30s}\n";

struct Fixture {
    clock: ManualClock,
    quotas: Arc<Quotas<MemoryStore>>,
    demand: Arc<MemoryDemand>,
    /// The policy serving, to swap as a reload does.
    policy: Arc<arc_swap::ArcSwap<Policy>>,
}

fn fixture() -> Fixture {
    fixture_with(|clock| Arc::new(MemoryDemand::new(Arc::new(clock.clone()))))
}

fn fixture_with(demand: impl Fn(&ManualClock) -> Arc<MemoryDemand>) -> Fixture {
    let clock = ManualClock::new(1_000 * SECOND);
    let policy = Arc::new(arc_swap::ArcSwap::from_pointee(compiled(POLICY)));
    let store = MemoryStore::new(Arc::new(clock.clone()), 1000);
    let limiter =
        Limiter::new(policy.clone(), store, Default::default()).with_clock(Arc::new(clock.clone()));
    let service = Arc::new(Service::new(
        limiter,
        HeaderStyle::Off,
        Arc::new(Metrics::new()),
    ));
    let demand = demand(&clock);
    let quotas = Quotas::new(
        service,
        demand.clone(),
        Arc::new(clock.clone()),
        super::super::Settings::default(),
    );
    Fixture {
        clock,
        quotas: Arc::new(quotas),
        demand,
        policy,
    }
}

fn compiled(text: &str) -> Policy {
    crate::policy::compile(crate::policy::parse_str("p.yaml", text).unwrap()).unwrap()
}

fn id(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn usage(pairs: &[(&str, &str)], allowed: u64, denied: u64, secs: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id(pairs)),
        time_elapsed: Some(PbDuration {
            seconds: secs,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_string(),
        bucket_quota_usages: usages,
    }
}

/// The one action of a one-bucket answer, as an assignment (or `None`: abandon).
fn only(answer: RateLimitQuotaResponse) -> Option<(Assignment, i64)> {
    assert_eq!(answer.bucket_action.len(), 1);
    match answer.bucket_action[0].bucket_action? {
        Action::AbandonAction(_) => None,
        Action::QuotaAssignmentAction(q) => {
            let ttl = q.assignment_time_to_live.unwrap().seconds;
            let a = match q.rate_limit_strategy?.strategy? {
                Strategy::BlanketRule(1) => Assignment::DenyAll,
                Strategy::BlanketRule(_) => Assignment::AllowAll,
                Strategy::TokenBucket(tb) => Assignment::TokenBucket {
                    max_tokens: tb.max_tokens,
                    tokens_per_fill: tb.tokens_per_fill.unwrap(),
                    fill_interval: tb.fill_interval.unwrap().seconds as u64,
                },
                Strategy::RequestsPerTimeUnit(_) => panic!("never sent"),
            };
            Some((a, ttl))
        }
    }
}

/// `tokens` a second for the policy's per-second limits: ten times that per 10 s.
fn bucket(tokens: u32) -> Assignment {
    Assignment::TokenBucket {
        max_tokens: tokens,
        tokens_per_fill: tokens * 10,
        fill_interval: 10,
    }
}

const API: &[(&str, &str)] = &[("route", "api")];

#[test]
fn two_envoys_share_the_limit_by_their_demand() {
    let f = fixture();
    let mut a = Stream::new(f.quotas.clone());
    let mut b = Stream::new(f.quotas.clone());
    // Each bucket's first report: one request, time_elapsed 0.
    let first = block_on(a.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    assert_eq!(first.bucket_action[0].bucket_id, Some(id(API)), "echoed");
    assert_eq!(only(first), Some((bucket(20), 15)), "alone, a gets all");
    let b1 = block_on(b.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    assert_eq!(only(b1), Some((bucket(10), 15)));
    // 5 s later: a saw 45 requests a second, b 15 (allowed and denied alike).
    f.clock.advance(5 * SECOND);
    let a2 = block_on(a.answer(report("", vec![usage(API, 100, 125, 4)]))).unwrap();
    // b's last record (1/s) is still in the sum: 225/5 = 45 of 46, 19 tokens,
    // within a tenth of the 20 sent: a keeps its bucket.
    assert_eq!(only(a2).unwrap().0, bucket(20));
    f.clock.advance(SECOND);
    let b2 = block_on(b.answer(report("edge", vec![usage(API, 20, 70, 5)]))).unwrap();
    // 90 requests over the 6 s since b's last report.
    assert_eq!(only(b2).unwrap().0, bucket(5));
    f.clock.advance(4 * SECOND);
    let a3 = block_on(a.answer(report("", vec![usage(API, 75, 150, 4)]))).unwrap();
    assert_eq!(only(a3).unwrap().0, bucket(15), "45 of 60 a second");
    // The share hardly moves: the same bucket is sent, so Envoy keeps its tokens.
    f.clock.advance(5 * SECOND);
    let a4 = block_on(a.answer(report("", vec![usage(API, 75, 160, 5)]))).unwrap();
    assert_eq!(only(a4).unwrap().0, bucket(15));
    drop(a);
    drop(b);
    assert_eq!(f.demand.buckets(), 0, "ended streams leave no records");
}

/// The nudges waiting in a stream's inbox, each answered as `serve` would.
fn pushed(s: &mut Stream<MemoryStore>) -> Vec<Option<(Assignment, i64)>> {
    let mut inbox = s.inbox.take().expect("inbox");
    let mut out = Vec::new();
    while let Ok(n) = inbox.try_recv() {
        out.push(s.nudged(&n).map(|r| {
            assert_eq!(r.bucket_action[0].bucket_id, Some(id(API)), "echoed");
            only(r).expect("an assignment")
        }));
    }
    s.inbox = Some(inbox);
    out
}

#[test]
fn a_report_that_moves_the_split_pushes_the_other_streams_new_share() {
    let f = fixture();
    let mut a = Stream::new(f.quotas.clone());
    let mut b = Stream::new(f.quotas.clone());
    block_on(a.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    assert_eq!(pushed(&mut b), vec![], "b reports nothing yet");
    // b joins with one request: a's 20 would make 30 with b's 10.
    let b1 = block_on(b.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    assert_eq!(only(b1).unwrap().0, bucket(10));
    assert_eq!(
        pushed(&mut a),
        vec![Some((bucket(10), 15))],
        "a is cut at once"
    );
    // a's real demand, 45 a second: b's 10 shrinks to its 1/46, kept at 1.
    f.clock.advance(5 * SECOND);
    let a2 = block_on(a.answer(report("edge", vec![usage(API, 100, 125, 5)]))).unwrap();
    let share = |max_tokens, tokens_per_fill| Assignment::TokenBucket {
        max_tokens,
        tokens_per_fill,
        fill_interval: 10,
    };
    assert_eq!(only(a2).unwrap().0, share(19, 195), "45/46 of 20 a second");
    assert_eq!(pushed(&mut b), vec![Some((share(1, 4), 15))], "1/46 of it");
    // b's 15 a second: a is pushed down to 15 of 60.
    f.clock.advance(SECOND);
    block_on(b.answer(report("edge", vec![usage(API, 20, 70, 6)]))).unwrap();
    assert_eq!(pushed(&mut a), vec![Some((bucket(15), 15))]);
    // Steady demand: no nudge; a demand that moved but leaves the other's share
    // within the hysteresis: a nudge, and nothing sent.
    f.clock.advance(5 * SECOND);
    block_on(b.answer(report("edge", vec![usage(API, 20, 55, 5)]))).unwrap();
    assert_eq!(pushed(&mut a), vec![]);
    f.clock.advance(5 * SECOND);
    block_on(b.answer(report("edge", vec![usage(API, 20, 65, 5)]))).unwrap();
    assert_eq!(
        pushed(&mut a),
        vec![None],
        "45 of 62: 14.5, within a tenth of 15"
    );
    drop(a);
    drop(b);
    assert_eq!(f.quotas.peers.buckets(), 0, "ended streams leave the table");
}

#[test]
fn a_reloaded_policy_reaches_an_open_stream_at_its_next_report() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    let steady = |s: &mut Stream<MemoryStore>| {
        let a = block_on(s.answer(report("edge", vec![usage(API, 50, 0, 5)]))).unwrap();
        only(a).unwrap().0
    };
    assert_eq!(steady(&mut s), bucket(20));
    // A burst of its own: the rate is the same, max_tokens is not.
    let burst = POLICY.replace(
        "requests_per_unit: 20}",
        "requests_per_unit: 20, algorithm: token_bucket, burst: 60}",
    );
    f.policy.store(Arc::new(compiled(&burst)));
    f.clock.advance(5 * SECOND);
    let sixty = Assignment::TokenBucket {
        max_tokens: 60,
        tokens_per_fill: 200,
        fill_interval: 10,
    };
    assert_eq!(steady(&mut s), sixty);
    // A rate 5 % up: within the hysteresis, sent all the same.
    let faster = POLICY.replace("requests_per_unit: 20}", "requests_per_unit: 21}");
    f.policy.store(Arc::new(compiled(&faster)));
    f.clock.advance(5 * SECOND);
    assert_eq!(steady(&mut s), bucket(21));
    // The demand moving a little under the same policy keeps the bucket.
    f.clock.advance(5 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(API, 52, 0, 5)]))).unwrap();
    assert_eq!(only(a).unwrap().0, bucket(21));
}

#[test]
fn a_rate_limits_list_is_held_to_its_tightest_limit() {
    let f = fixture();
    let list = POLICY.replace(
        "rate_limit: {unit: second, requests_per_unit: 20}",
        "rate_limits:\n      - {unit: second, requests_per_unit: 20}\n      - {unit: minute, requests_per_unit: 600}",
    );
    f.policy.store(Arc::new(compiled(&list)));
    let mut s = Stream::new(f.quotas.clone());
    let a = block_on(s.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    // 600 a minute is 10 a second: the minute's refill, the second's burst.
    let tightest = Assignment::TokenBucket {
        max_tokens: 20,
        tokens_per_fill: 6_000,
        fill_interval: 600,
    };
    assert_eq!(only(a).unwrap().0, tightest);
}

#[test]
fn buckets_under_one_shared_counter_share_its_limit() {
    let f = fixture();
    let shared = format!(
        "{POLICY}  - key: path\n    value: /api/*\n    share_threshold: true\n    rate_limit: {{unit: second, requests_per_unit: 20}}\n"
    );
    f.policy.store(Arc::new(compiled(&shared)));
    let mut s = Stream::new(f.quotas.clone());
    let (a, b) = (&[("path", "/api/a")], &[("path", "/api/b")]);
    // 30 and 10 requests a second under one counter of 20 a second.
    let mut both = |a_rate: u64, b_rate: u64| {
        let usages = vec![usage(a, a_rate * 5, 0, 5), usage(b, b_rate * 5, 0, 5)];
        let answer = block_on(s.answer(report("edge", usages))).unwrap();
        answer
            .bucket_action
            .iter()
            .map(|a| {
                let one = RateLimitQuotaResponse {
                    bucket_action: vec![a.clone()],
                };
                only(one).unwrap().0
            })
            .collect::<Vec<Assignment>>()
    };
    // From the first report on: a is not given the whole limit for reporting
    // before b.
    assert_eq!(both(30, 10), [bucket(15), bucket(5)], "3/4 and 1/4 of 20");
    f.clock.advance(5 * SECOND);
    assert_eq!(both(30, 10), [bucket(15), bucket(5)]);
    // The load swaps: a's new share counts b's new demand, reported after it.
    f.clock.advance(5 * SECOND);
    assert_eq!(both(10, 30), [bucket(5), bucket(15)]);
    drop(s);
    assert_eq!(f.demand.buckets(), 0, "their records go with the stream");
}

#[test]
fn blanket_rules_for_unlimited_unknown_and_zero_limits() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    let ask = |s: &mut Stream<MemoryStore>, pairs: &[(&str, &str)]| {
        only(block_on(s.answer(report("edge", vec![usage(pairs, 3, 0, 1)]))).unwrap())
            .unwrap()
            .0
    };
    assert_eq!(ask(&mut s, &[("route", "free")]), Assignment::AllowAll);
    assert_eq!(ask(&mut s, &[("route", "elsewhere")]), Assignment::AllowAll);
    assert_eq!(ask(&mut s, &[("route", "closed")]), Assignment::DenyAll);
    let mut other = Stream::new(f.quotas.clone());
    let unknown = block_on(other.answer(report("nowhere", vec![usage(API, 3, 0, 1)])));
    assert_eq!(only(unknown.unwrap()).unwrap().0, Assignment::AllowAll);
    assert_eq!(f.demand.buckets(), 0, "only limited buckets keep demand");
}

#[test]
fn at_its_bounds_a_stream_abandons_idle_slow_buckets_to_make_room() {
    // Kept until they refill, a slow rule's buckets would fill the stream for an
    // hour, and every new client meanwhile would get the failure mode.
    let mut f = fixture();
    Arc::get_mut(&mut f.quotas).unwrap().settings.max_buckets = 2;
    let text =
        format!("{POLICY}  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 2}}\n");
    f.policy.store(Arc::new(compiled(&text)));
    let mut s = Stream::new(f.quotas.clone());
    let users = |counts: [u64; 2]| {
        let u = ["u1", "u2"].iter().zip(counts);
        report(
            "edge",
            u.map(|(u, n)| usage(&[("user", u)], n, 0, 5)).collect(),
        )
    };
    block_on(s.answer(users([1, 1]))).unwrap();
    for _ in 0..11 {
        f.clock.advance(5 * SECOND);
        block_on(s.answer(users([0, 1]))).unwrap();
    }
    // u1 idle for --rlqs-abandon-after: with no room for a new bucket, it goes.
    f.clock.advance(5 * SECOND);
    let answer = each(block_on(s.answer(users([0, 1]))).unwrap());
    assert_eq!(answer[0].1, None, "abandoned");
    assert!(answer[1].1.is_some());
    let u3 = report("edge", vec![usage(&[("user", "u3")], 1, 0, 0)]);
    let a = only(block_on(s.answer(u3)).unwrap()).unwrap().0;
    assert!(matches!(a, Assignment::TokenBucket { .. }), "{a:?}");
}

#[test]
fn a_concurrency_rule_does_not_turn_into_a_rate() {
    // 3 in flight: RLQS sees no stream end to give a slot back, and 3 per lease
    // (5 minutes) is no limit the rule's users asked for.
    let f = fixture();
    let text = format!(
        "{POLICY}  - key: upload\n    rate_limit: {{algorithm: concurrency, requests_per_unit: 3, lease: 5m}}\n"
    );
    f.policy.store(Arc::new(compiled(&text)));
    let mut s = Stream::new(f.quotas.clone());
    let a = block_on(s.answer(report("edge", vec![usage(&[("upload", "u1")], 40, 0, 5)])));
    assert_eq!(only(a.unwrap()).unwrap().0, Assignment::AllowAll);
    assert_eq!(f.demand.buckets(), 0);
}

/// The value of the series `series` (name and labels as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_count_streams_buckets_reports_and_assignments_by_kind() {
    let f = fixture();
    let metrics = f.quotas.service.metrics.clone();
    let mut a = Stream::new(f.quotas.clone());
    let mut b = Stream::new(f.quotas.clone());
    let buckets =
        |pairs: &[&[(&str, &str)]]| pairs.iter().map(|p| usage(p, 3, 0, 1)).collect::<Vec<_>>();
    let all: &[&[(&str, &str)]] = &[
        API,
        &[("route", "free")],
        &[("route", "closed")],
        &[("route", "elsewhere")],
    ];
    block_on(a.answer(report("edge", buckets(all)))).unwrap();
    block_on(a.answer(report("", buckets(&all[..1])))).unwrap();
    block_on(b.answer(report("nowhere", buckets(&all[..2])))).unwrap();
    let text = metrics.render();
    let at = |series: &str| sample(&text, series);
    assert_eq!(at("sluice_rlqs_streams"), Some(2.0), "{text}");
    assert_eq!(at("sluice_rlqs_buckets"), Some(6.0));
    assert_eq!(at("sluice_rlqs_reports_total{domain=\"edge\"}"), Some(2.0));
    // A domain no policy defines is shown empty: a label Envoy cannot inflate.
    assert_eq!(at("sluice_rlqs_reports_total{domain=\"\"}"), Some(1.0));
    let sent = |domain: &str, kind: &str, rule: &str| {
        at(&format!(
            "sluice_rlqs_assignments_total{{domain=\"{domain}\",kind=\"{kind}\",rule=\"{rule}\"}}"
        ))
    };
    assert_eq!(sent("edge", "token_bucket", "route"), Some(2.0));
    // route=free is an unlimited rule; route=elsewhere matches none.
    assert_eq!(sent("edge", "allow_all", "route"), Some(1.0));
    assert_eq!(sent("edge", "allow_all", ""), Some(1.0));
    assert_eq!(sent("edge", "deny_all", "route"), Some(1.0));
    assert_eq!(sent("", "allow_all", ""), Some(2.0));
    drop(a);
    let text = metrics.render();
    assert_eq!(sample(&text, "sluice_rlqs_streams"), Some(1.0));
    assert_eq!(sample(&text, "sluice_rlqs_buckets"), Some(2.0));
}

#[test]
fn a_penalty_ban_ends_while_the_client_keeps_sending() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    let c = &[("client", "10.0.0.1")];
    let a = block_on(s.answer(report("edge", vec![usage(c, 10, 0, 1)]))).unwrap();
    assert!(matches!(only(a).unwrap().0, Assignment::TokenBucket { .. }));
    f.clock.advance(5 * SECOND);
    // Three denials within 10 s: banned for 30 s.
    let a = block_on(s.answer(report("edge", vec![usage(c, 10, 3, 5)]))).unwrap();
    assert_eq!(only(a).unwrap(), (Assignment::DenyAll, 15));
    assert_eq!(f.quotas.service.limiter.penalties().active_count(), 1);
    // Envoy denies everything meanwhile; its DENY_ALL ends with the ban.
    for _ in 0..5 {
        f.clock.advance(5 * SECOND);
        let a = block_on(s.answer(report("edge", vec![usage(c, 0, 40, 5)]))).unwrap();
        assert_eq!(only(a).unwrap().0, Assignment::DenyAll);
    }
    f.clock.advance(SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(c, 0, 8, 1)]))).unwrap();
    assert_eq!(
        only(a).unwrap(),
        (Assignment::DenyAll, 4),
        "4 s of the ban left"
    );
    // The ban is over; the denials Envoy made under its DENY_ALL start no other.
    f.clock.advance(5 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(c, 0, 40, 5)]))).unwrap();
    assert!(
        matches!(only(a).unwrap().0, Assignment::TokenBucket { .. }),
        "requests pass again"
    );
    // Denials by the token bucket count again.
    f.clock.advance(5 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(c, 10, 3, 5)]))).unwrap();
    assert_eq!(only(a).unwrap().0, Assignment::DenyAll);
}

#[test]
fn an_operators_block_denies_a_bucket_whose_rule_has_no_penalty() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    let a = block_on(s.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    assert!(matches!(only(a).unwrap().0, Assignment::TokenBucket { .. }));
    // `route=api` has no penalty; ShouldRateLimit denies a blocked key all the same.
    let limiter = &f.quotas.service.limiter;
    block_on(limiter.block("edge", API, 8 * SECOND)).expect("blocked");
    f.clock.advance(5 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(API, 5, 0, 5)]))).unwrap();
    assert_eq!(
        only(a).unwrap(),
        (Assignment::DenyAll, 3),
        "3 s of the block left"
    );
    f.clock.advance(5 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(API, 0, 9, 5)]))).unwrap();
    assert!(
        matches!(only(a).unwrap().0, Assignment::TokenBucket { .. }),
        "the block is over"
    );
}

#[test]
fn a_tightened_key_gets_its_share_of_the_tightened_limit() {
    let f = fixture();
    f.policy.store(Arc::new(compiled(
        "domain: edge\ndescriptors:\n  - key: client\n    rate_limit:\n      unit: second\n      requests_per_unit: 20\n      penalty: {violations: 3, within: 10s, tighten: {factor: 0.25, for: 30s}}\n",
    )));
    let mut s = Stream::new(f.quotas.clone());
    let c = &[("client", "10.0.0.1")];
    let a = block_on(s.answer(report("edge", vec![usage(c, 10, 0, 1)]))).unwrap();
    assert_eq!(only(a).unwrap().0, bucket(20));
    // Three denials within 10 s: tightened to a quarter for 30 s.
    f.clock.advance(5 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(c, 20, 3, 5)]))).unwrap();
    assert_eq!(only(a).unwrap().0, bucket(5));
    // Another stream of the same bucket moves the split: what is pushed to this one
    // is its share of the tightened limit too.
    let mut other = Stream::new(f.quotas.clone());
    block_on(other.answer(report("edge", vec![usage(c, 1, 0, 0)]))).unwrap();
    f.clock.advance(5 * SECOND);
    block_on(other.answer(report("edge", vec![usage(c, 115, 0, 5)]))).unwrap();
    let mut inbox = s.inbox.take().expect("inbox");
    let mut sent = Vec::new();
    while let Ok(n) = inbox.try_recv() {
        sent.extend(s.nudged(&n).and_then(only));
    }
    assert!(
        !sent.is_empty(),
        "the other stream's demand moved this one's share"
    );
    for (a, _) in sent {
        let Assignment::TokenBucket { max_tokens, .. } = a else {
            panic!("a token bucket: {a:?}");
        };
        assert!(max_tokens <= 5, "{a:?}");
    }
    // The tightening over, the whole limit is shared again.
    f.clock.advance(30 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(c, 100, 0, 5)]))).unwrap();
    let Assignment::TokenBucket { max_tokens, .. } = only(a).unwrap().0 else {
        panic!("a token bucket");
    };
    assert!(max_tokens > 5, "{max_tokens}");
}

#[test]
fn a_ban_envoys_denials_start_is_counted_once() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    let c = &[("client", "10.0.0.1")];
    for _ in 0..3 {
        block_on(s.answer(report("edge", vec![usage(c, 10, 3, 1)]))).unwrap();
        f.clock.advance(SECOND);
    }
    let text = f.quotas.service.metrics.render();
    assert_eq!(
        sample(
            &text,
            "sluice_penalty_bans_total{domain=\"edge\",rule=\"client\"}"
        ),
        Some(1.0),
        "{text}"
    );
}

#[test]
fn an_idle_bucket_is_abandoned_and_comes_back_fresh() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    block_on(s.answer(report("edge", vec![usage(API, 5, 0, 0)]))).unwrap();
    // Each idle report covers the 5 s since the one before: the twelfth shows
    // the bucket idle for 60 s, --rlqs-abandon-after.
    for _ in 0..11 {
        f.clock.advance(5 * SECOND);
        let a = block_on(s.answer(report("edge", vec![usage(API, 0, 0, 5)]))).unwrap();
        assert!(only(a).is_some(), "not yet");
    }
    f.clock.advance(5 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(API, 0, 0, 5)]))).unwrap();
    assert_eq!(only(a), None, "idle for 60 s: abandoned");
    assert_eq!(f.demand.buckets(), 0);
    let text = f.quotas.service.metrics.render();
    assert_eq!(sample(&text, "sluice_rlqs_buckets"), Some(0.0), "{text}");
    assert_eq!(
        sample(
            &text,
            "sluice_rlqs_assignments_total{domain=\"edge\",kind=\"abandon\",rule=\"route\"}"
        ),
        Some(1.0)
    );
    let a = block_on(s.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    assert_eq!(only(a).unwrap().0, bucket(20));
}

#[test]
fn a_slow_buckets_abandon_waits_until_envoys_bucket_has_refilled() {
    // 2 an hour: Envoy's bucket holds 2 and takes an hour to refill. Abandoned
    // sooner, the client's next request would make Envoy a new bucket, full.
    let f = fixture();
    let slow = POLICY.replace(
        "value: api\n    rate_limit: {unit: second, requests_per_unit: 20}",
        "value: api\n    rate_limit: {unit: hour, requests_per_unit: 2}",
    );
    f.policy.store(Arc::new(compiled(&slow)));
    let mut s = Stream::new(f.quotas.clone());
    let hourly = Assignment::TokenBucket {
        max_tokens: 2,
        tokens_per_fill: 20,
        fill_interval: 36_000,
    };
    let first = block_on(s.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    assert_eq!(only(first).unwrap().0, hourly);
    f.clock.advance(5 * SECOND);
    block_on(s.answer(report("edge", vec![usage(API, 2, 3, 5)]))).unwrap();
    let idle = |s: &mut Stream<MemoryStore>| {
        f.clock.advance(5 * SECOND);
        let a = block_on(s.answer(report("edge", vec![usage(API, 0, 0, 5)]))).unwrap();
        only(a).map(|(a, _)| a)
    };
    // Idle for --rlqs-abandon-after (60 s) and well past it, short of the hour.
    for _ in 0..(3_600 / 5 - 1) {
        assert_eq!(idle(&mut s), Some(hourly), "kept while it refills");
    }
    assert_eq!(idle(&mut s), None, "refilled after an hour idle: abandoned");
}

/// An action as [`only`] reads it, with the id it echoes.
type Echoed = (Option<BucketId>, Option<(Assignment, i64)>);

/// Each action of an answer.
fn each(answer: RateLimitQuotaResponse) -> Vec<Echoed> {
    answer
        .bucket_action
        .into_iter()
        .map(|a| {
            let id = a.bucket_id.clone();
            let one = RateLimitQuotaResponse {
                bucket_action: vec![a],
            };
            (id, only(one))
        })
        .collect()
}

#[test]
fn bad_reports_are_refused_and_change_nothing() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    let e = block_on(s.answer(report("", vec![usage(API, 1, 0, 0)]))).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    assert!(e.message.contains("must name its domain"), "{}", e.message);
    block_on(s.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    let e = block_on(s.answer(report("other", vec![usage(API, 500, 0, 1)]))).unwrap_err();
    assert!(e.message.contains("domain is 'edge'"), "{}", e.message);
    // The refused report's 500 requests were not counted.
    f.clock.advance(SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(API, 1, 0, 1)]))).unwrap();
    assert_eq!(only(a).unwrap().0, bucket(20));
}

#[test]
fn a_bucket_no_rule_can_match_is_answered_apart_and_the_stream_goes_on() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    // What Envoy reports for a request whose only bucket_id_builder header is
    // present but empty: Envoy leaves the entry out.
    let empty = BucketQuotaUsage {
        bucket_id: Some(BucketId::default()),
        ..usage(API, 1, 0, 1)
    };
    let none = BucketQuotaUsage {
        bucket_id: None,
        ..usage(API, 1, 0, 1)
    };
    let keys: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("k{i:02}")).collect();
    let wide: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    let answer = block_on(s.answer(report(
        "edge",
        vec![
            usage(API, 100, 0, 1),
            empty,
            usage(&[("", "x"), ("route", "api")], 1, 0, 1),
            none,
            usage(&wide, 1, 0, 1),
        ],
    )))
    .expect("answered, not refused");
    // The buckets without an id are left out: Envoy takes no action without one.
    assert_eq!(
        each(answer),
        vec![
            (Some(id(API)), Some((bucket(20), 15))),
            (
                Some(id(&[("", "x"), ("route", "api")])),
                Some((Assignment::AllowAll, 15))
            ),
            (Some(id(&wide)), Some((Assignment::AllowAll, 15))),
        ]
    );
    assert_eq!(s.buckets.len(), 1, "only the regular bucket is tracked");
    // The report's 100 requests of route=api were counted: a second stream's
    // share is cut by them.
    let mut other = Stream::new(f.quotas.clone());
    let a = block_on(other.answer(report("edge", vec![usage(API, 100, 0, 1)]))).unwrap();
    assert_eq!(only(a).unwrap().0, bucket(10));
    let text = f.quotas.service.metrics.render();
    let irregular = |reason: &str| {
        sample(
            &text,
            &format!("sluice_rlqs_irregular_buckets_total{{domain=\"edge\",reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(irregular("no_entries"), Some(2.0), "{text}");
    assert_eq!(irregular("empty_key"), Some(1.0));
    assert_eq!(irregular("too_many_entries"), Some(1.0));
    assert_eq!(irregular("id_too_large"), None);
    assert_eq!(
        sample(
            &text,
            "sluice_rlqs_assignments_total{domain=\"edge\",kind=\"allow_all\",rule=\"\"}"
        ),
        Some(2.0)
    );
    // The stream goes on.
    f.clock.advance(5 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(API, 100, 0, 5)]))).unwrap();
    assert!(matches!(only(a).unwrap().0, Assignment::TokenBucket { .. }));
}

#[test]
fn a_bucket_value_that_is_not_utf8_is_repaired_and_decided() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    let usage = |key: &[u8], value: &[u8]| raw::Usage {
        bucket_id: Some(raw::Id {
            bucket: vec![raw::Pair {
                key: key.to_vec(),
                value: value.to_vec(),
            }],
        }),
        num_requests_allowed: 1,
        ..Default::default()
    };
    // What Envoy sends for a client whose header holds the byte 0xff.
    let message = raw::Reports {
        domain: b"edge".to_vec(),
        bucket_quota_usages: vec![usage(b"route", b"api"), usage(b"client", b"evil\xff")],
    }
    .encode_to_vec();
    assert!(RateLimitQuotaUsageReports::decode(message.as_slice()).is_err());
    let reports = decode(&Bytes::from(message)).expect("repaired, not refused");
    let repaired = id(&[("client", "evil\u{FFFD}")]);
    assert_eq!(
        reports.bucket_quota_usages[1].bucket_id,
        Some(repaired.clone())
    );
    let answer = block_on(s.answer(reports)).unwrap();
    // Both buckets decided against their limits; the stream goes on.
    assert_eq!(
        each(answer),
        vec![
            (Some(id(API)), Some((bucket(20), 15))),
            (Some(repaired), Some((bucket(10), 15))),
        ]
    );
    // A report that is not protobuf at all is still refused.
    let e = decode(&Bytes::from_static(&[0x12, 0x05, 0x0a])).unwrap_err();
    assert_eq!(e.code, Code::InvalidArgument);
    assert!(e
        .message
        .starts_with("undecodable RateLimitQuotaUsageReports"));
}

#[test]
fn an_oversized_bucket_id_is_decided_against_its_limit_and_the_stream_goes_on() {
    let f = fixture();
    let mut a = Stream::new(f.quotas.clone());
    // A client header of 5,000 bytes, as Envoy takes it into the bucket id.
    let long = "v".repeat(5_000);
    let big: &[(&str, &str)] = &[("client", &long)];
    let both = |allowed| report("edge", vec![usage(API, 1, 0, 0), usage(big, allowed, 0, 0)]);
    let answer = block_on(a.answer(both(1))).expect("answered, not refused");
    // Both decided against their limits (20 and 10 a second), the long id echoed
    // exactly as sent.
    assert_eq!(
        each(answer),
        vec![
            (Some(id(API)), Some((bucket(20), 15))),
            (Some(id(big)), Some((bucket(10), 15))),
        ]
    );
    // Tracked under its 64-byte digest, not its 5,006 bytes.
    assert_eq!((a.buckets.len(), a.bucket_bytes), (2, 8 + 64));
    // Its limit is shared with another Envoy's stream reporting it, as any other.
    let mut b = Stream::new(f.quotas.clone());
    let answer = block_on(b.answer(report("edge", vec![usage(big, 1, 0, 0)]))).unwrap();
    assert_eq!(only(answer).unwrap().0, bucket(5));
    assert!(
        a.inbox.as_mut().unwrap().try_recv().is_err(),
        "no share is pushed to an id kept as its digest"
    );
    // The stream goes on: the next report is answered, the bucket known.
    f.clock.advance(5 * SECOND);
    let answer = block_on(a.answer(both(50))).unwrap();
    assert_eq!(answer.bucket_action.len(), 2);
    assert_eq!(answer.bucket_action[1].bucket_id, Some(id(big)));
    assert_eq!((a.buckets.len(), a.bucket_bytes), (2, 8 + 64));
    let text = f.quotas.service.metrics.render();
    assert_eq!(
        sample(
            &text,
            "sluice_rlqs_irregular_buckets_total{domain=\"edge\",reason=\"id_too_large\"}"
        ),
        Some(3.0),
        "{text}"
    );
    // Idle for --rlqs-abandon-after: abandoned, its bytes given back.
    let idle = || report("edge", vec![usage(big, 0, 0, 5)]);
    block_on(a.answer(idle())).unwrap();
    f.clock.advance(60 * SECOND);
    assert_eq!(only(block_on(a.answer(idle())).unwrap()), None, "abandoned");
    assert_eq!((a.buckets.len(), a.bucket_bytes), (1, 8));
    // The largest id kept as it is.
    let most = "v".repeat(MAX_BUCKET_ID_BYTES - 6);
    block_on(a.answer(report("edge", vec![usage(&[("client", &most)], 1, 0, 0)]))).unwrap();
    assert_eq!(a.bucket_bytes, 8 + MAX_BUCKET_ID_BYTES);
}

#[test]
fn past_its_bytes_a_stream_tracks_no_new_buckets() {
    let mut f = fixture();
    let quotas = Arc::get_mut(&mut f.quotas).unwrap();
    quotas.settings.max_bucket_bytes = 3_000;
    let mut s = Stream::new(f.quotas.clone());
    let value = |c: char| c.to_string().repeat(1_000);
    let (a, b, c) = (value('a'), value('b'), value('c'));
    for v in [&a, &b] {
        block_on(s.answer(report("edge", vec![usage(&[("client", v)], 1, 0, 0)]))).unwrap();
    }
    assert_eq!((s.buckets.len(), s.bucket_bytes), (2, 2_012));
    // A third would pass the budget: answered by the failure mode (open), not kept.
    let third =
        block_on(s.answer(report("edge", vec![usage(&[("client", &c)], 1, 0, 0)]))).unwrap();
    assert_eq!(only(third).unwrap().0, Assignment::AllowAll);
    assert_eq!(s.buckets.len(), 2);
    // A known bucket is still answered from its share.
    let known =
        block_on(s.answer(report("edge", vec![usage(&[("client", &a)], 1, 0, 1)]))).unwrap();
    assert!(matches!(
        only(known).unwrap().0,
        Assignment::TokenBucket { .. }
    ));
    // An abandoned bucket gives its bytes back.
    let idle = || report("edge", vec![usage(&[("client", &b)], 0, 0, 1)]);
    block_on(s.answer(idle())).unwrap();
    f.clock.advance(60 * SECOND);
    assert_eq!(only(block_on(s.answer(idle())).unwrap()), None, "abandoned");
    assert_eq!((s.buckets.len(), s.bucket_bytes), (1, 1_006));
    block_on(s.answer(report("edge", vec![usage(&[("client", &c)], 1, 0, 0)]))).unwrap();
    assert_eq!(s.buckets.len(), 2);
}

#[test]
fn a_blocked_key_past_the_streams_bounds_is_denied_still() {
    let mut f = fixture();
    let quotas = Arc::get_mut(&mut f.quotas).unwrap();
    quotas.settings.max_buckets = 1;
    let mut s = Stream::new(f.quotas.clone());
    block_on(s.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    // The stream tracks no more buckets: a new one takes the failure mode (open)...
    let c = &[("client", "10.0.0.1")];
    let a = block_on(s.answer(report("edge", vec![usage(c, 1, 0, 0)]))).unwrap();
    assert_eq!(only(a).unwrap().0, Assignment::AllowAll);
    // ...but not one an operator blocked, which ShouldRateLimit denies.
    let limiter = &f.quotas.service.limiter;
    block_on(limiter.block("edge", c, 8 * SECOND)).expect("blocked");
    let a = block_on(s.answer(report("edge", vec![usage(c, 1, 0, 1)]))).unwrap();
    assert_eq!(only(a).unwrap(), (Assignment::DenyAll, 8));
    assert_eq!(s.buckets.len(), 1, "and it is not tracked");
}

#[test]
fn an_ended_ban_is_not_held_while_the_store_is_away() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    let c = &[("client", "10.0.0.1")];
    block_on(s.answer(report("edge", vec![usage(c, 10, 3, 1)]))).unwrap();
    let a = block_on(s.answer(report("edge", vec![usage(c, 10, 3, 1)]))).unwrap();
    assert_eq!(only(a).unwrap().0, Assignment::DenyAll, "banned");
    s.quotas = Arc::new(Quotas::new(
        f.quotas.service.clone(),
        Arc::new(Down),
        Arc::new(f.clock.clone()),
        super::super::Settings::default(),
    ));
    f.clock.advance(31 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(c, 0, 40, 5)]))).unwrap();
    assert_eq!(
        only(a).unwrap().0,
        Assignment::AllowAll,
        "failure_mode open"
    );
}

#[test]
fn an_absurd_time_elapsed_is_answered() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    let a = block_on(s.answer(report("edge", vec![usage(API, 10, 0, i64::MAX)]))).unwrap();
    assert!(matches!(only(a).unwrap().0, Assignment::TokenBucket { .. }));
}

/// A demand table whose store is down.
#[derive(Debug)]
struct Down;

impl Demand for Down {
    fn report<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: f64,
        _: Micros,
    ) -> BoxFuture<'a, Result<Share, StoreError>> {
        Box::pin(async { Err(StoreError::Timeout) })
    }
    fn forget(&self, _: Vec<String>, _: String) {}
}

/// A demand table whose calls each wait until `n` are in flight, then fail as a
/// store that timed out does.
#[derive(Debug)]
struct Gathered(tokio::sync::Barrier);

impl Demand for Gathered {
    fn report<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: f64,
        _: Micros,
    ) -> BoxFuture<'a, Result<Share, StoreError>> {
        Box::pin(async {
            self.0.wait().await;
            Err(StoreError::Timeout)
        })
    }
    fn forget(&self, _: Vec<String>, _: String) {}
}

#[tokio::test]
async fn a_reports_buckets_wait_for_the_store_together() {
    let f = fixture();
    let buckets = 40;
    let clients: Vec<String> = (0..buckets).map(|i| format!("10.0.0.{i}")).collect();
    let usages = || {
        clients
            .iter()
            .map(|c| usage(&[("client", c)], 1, 0, 1))
            .collect::<Vec<_>>()
    };
    let mut s = Stream::new(f.quotas.clone());
    let first = s.answer(report("edge", usages())).await.unwrap();
    s.quotas = Arc::new(Quotas::new(
        f.quotas.service.clone(),
        Arc::new(Gathered(tokio::sync::Barrier::new(buckets))),
        Arc::new(f.clock.clone()),
        super::super::Settings::default(),
    ));
    // One bucket after the other, the first call would wait for ever here (and
    // 40 store timeouts against a paused Redis).
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.answer(report("edge", usages())),
    )
    .await
    .expect("the calls are made together")
    .unwrap();
    assert_eq!(answer, first, "each bucket keeps its last assignment");
}

#[test]
fn with_the_store_down_the_last_assignment_holds_else_the_failure_mode() {
    let f = fixture();
    let mut s = Stream::new(f.quotas.clone());
    block_on(s.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    let down = Quotas::new(
        f.quotas.service.clone(),
        Arc::new(Down),
        Arc::new(f.clock.clone()),
        super::super::Settings::default(),
    );
    // The same stream state, now over a store that fails.
    s.quotas = Arc::new(down);
    f.clock.advance(5 * SECOND);
    let a = block_on(s.answer(report("edge", vec![usage(API, 300, 0, 5)]))).unwrap();
    assert_eq!(only(a).unwrap().0, bucket(20), "kept");
    let c = &[("client", "x")];
    let a = block_on(s.answer(report("edge", vec![usage(c, 3, 0, 5)]))).unwrap();
    assert_eq!(
        only(a).unwrap().0,
        Assignment::AllowAll,
        "failure_mode open"
    );
}

#[test]
fn with_the_store_down_a_reloaded_limit_still_reaches_the_stream() {
    let f = fixture();
    let mut a = Stream::new(f.quotas.clone());
    let mut b = Stream::new(f.quotas.clone());
    block_on(a.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    block_on(b.answer(report("edge", vec![usage(API, 1, 0, 0)]))).unwrap();
    f.clock.advance(5 * SECOND);
    block_on(a.answer(report("edge", vec![usage(API, 150, 75, 4)]))).unwrap();
    block_on(b.answer(report("edge", vec![usage(API, 75, 0, 4)]))).unwrap();
    f.clock.advance(5 * SECOND);
    let steady = block_on(a.answer(report("edge", vec![usage(API, 150, 75, 5)]))).unwrap();
    assert_eq!(only(steady).unwrap().0, bucket(15), "three quarters of 20");
    let down = Quotas::new(
        f.quotas.service.clone(),
        Arc::new(Down),
        Arc::new(f.clock.clone()),
        super::super::Settings::default(),
    );
    a.quotas = Arc::new(down);
    // The operator cuts the limit to 8 a second while Redis is away: a keeps its
    // three quarters, of the new limit.
    let cut = POLICY.replace("requests_per_unit: 20}", "requests_per_unit: 8}");
    f.policy.store(Arc::new(compiled(&cut)));
    f.clock.advance(5 * SECOND);
    let a3 = block_on(a.answer(report("edge", vec![usage(API, 150, 75, 5)]))).unwrap();
    assert_eq!(only(a3).unwrap().0, bucket(6));
    f.clock.advance(5 * SECOND);
    let a4 = block_on(a.answer(report("edge", vec![usage(API, 30, 0, 5)]))).unwrap();
    assert_eq!(
        only(a4).unwrap().0,
        bucket(6),
        "kept until the store is back"
    );
}
