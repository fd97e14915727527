//! What each fuzz target asserts of one input. Shared by the fuzz targets and by
//! `tests/fuzz_corpus.rs`, which replays the committed corpora on stable Rust.

use prost::Message;
use sluice::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::service::decode::{decode_lossy, Request};

/// The in-place request decoder against prost: when it answers, its answer is the
/// view of prost's decoding; when prost refuses a message, so does it. The lossy
/// decoder (the fallback) is prost wherever prost decodes, and reads a message prost
/// refuses only for a string that is not UTF-8, otherwise keeping prost's error.
pub fn request_decode(data: &[u8]) {
    let prost = RateLimitRequest::decode(data);
    if let Some(fast) = Request::decode(data) {
        let prost = prost
            .as_ref()
            .expect("Request::decode read a message prost refuses");
        assert_eq!(fast, Request::of(prost), "the decoders disagree");
    }
    match (prost, decode_lossy(data)) {
        (Ok(prost), lossy) => assert_eq!(lossy, Ok(prost), "the lossy decoder differs"),
        (Err(refused), Ok(_)) => assert!(
            refused.to_string().contains("UTF-8"),
            "the lossy decoder read a message prost refuses: {refused}"
        ),
        (Err(refused), Err(e)) => assert_eq!(e, refused, "the lossy decoder's error differs"),
    }
}

/// The policy parser on any text, both forms: an error list or documents, never a
/// panic; documents compile to a policy or to errors.
pub fn policy_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match sluice::policy::parse_str("fuzz.yaml", text) {
        Ok(docs) => {
            let _ = sluice::policy::compile(docs);
        }
        Err(errors) => assert!(!errors.is_empty(), "an error result with no error"),
    }
}

/// `POST /json`'s body: a request or a clear error; a request survives the trip
/// through protobuf, and the in-place decoder reads its encoding as prost does.
pub fn json_request(data: &[u8]) {
    let Ok(req) = sluice::service::json::parse_request(data) else {
        return;
    };
    let bytes = req.encode_to_vec();
    let back = RateLimitRequest::decode(bytes.as_slice()).expect("prost reads its own encoding");
    assert_eq!(back, req);
    if let Some(fast) = Request::decode(&bytes) {
        assert_eq!(fast, Request::of(&req));
    }
}

/// Redis replies, through both readers (the decide script's and the general one):
/// an answer, an error or "incomplete", never a panic. Read as it arrives, a reply is
/// incomplete until its last byte and then the same answer, taking the same bytes, as
/// with more bytes after it; where both readers read a reply they agree.
pub fn resp_parse(data: &[u8]) {
    use sluice_redis::connection::{parse, Answer};
    use sluice_redis::{value, Value};
    arrives_whole(data, parse);
    arrives_whole(data, value::parse);
    if let (Ok(Some((answer, n))), Ok(Some((general, m)))) = (parse(data), value::parse(data)) {
        assert_eq!(n, m, "both readers take the same bytes");
        match answer {
            Answer::Integers(ints) => assert_eq!(
                general,
                Value::Array(ints.into_iter().map(Value::Int).collect())
            ),
            Answer::Error(e) => assert_eq!(general, Value::Error(e)),
            Answer::Status => assert!(matches!(general, Value::Status(_) | Value::Int(_))),
        }
    }
}

fn arrives_whole<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    parse: sluice_redis::connection::Parser<T>,
) {
    let Ok(Some(answer)) = parse(data) else {
        return;
    };
    let first = (1..=data.len())
        .find(|&n| matches!(parse(&data[..n]), Ok(Some(_))))
        .expect("the whole buffer is an answer");
    assert_eq!(parse(&data[..first]).ok().flatten().as_ref(), Some(&answer));
    for n in 0..first {
        assert!(
            matches!(parse(&data[..n]), Ok(None)),
            "the first {n} bytes of a reply are not incomplete: {:?}",
            parse(&data[..n])
        );
    }
}

/// The policy the RLQS reports are answered against: a limit, a free rule, a zero
/// limit, a shadow rule, a wildcard with a penalty, a shared counter over a list of
/// limits, a window of no whole seconds and a limit too large for 32-bit tokens;
/// `failure_mode: closed`, so that a limited bucket is never let through whole.
const RLQS_POLICY: &str = "\
domain: edge
failure_mode: closed
descriptors:
  - key: route
    value: api
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: route
    value: free
    rate_limit: {unlimited: true}
  - key: route
    value: closed
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: route
    value: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: client
    rate_limit:
      unit: second
      requests_per_unit: 10
      penalty: {violations: 3, within: 10s, ban: 30s}
  - key: tenant
    value: t*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 600, algorithm: token_bucket, burst: 50}
    descriptors:
      - key: path
        rate_limits:
          - {unit: second, requests_per_unit: 5}
          - {unit: hour, requests_per_unit: 1000}
  - key: user
    rate_limit: {window: 1500ms, requests_per_unit: 3000000000}
";

/// RLQS reports, as two streams of one Envoy-facing service read and answer them:
/// the input is records of a control byte (bit 0: which stream; the rest: seconds
/// the clock moves first), a little-endian `u16` length and that many bytes of a
/// `RateLimitQuotaUsageReports`. A report is refused with INVALID_ARGUMENT (which
/// ends its stream, as `serve` ends it) or answered with one action per bucket
/// that has an id, in order, each echoing its id: ALLOW_ALL where no limit
/// governs the bucket, otherwise DENY_ALL or a token bucket within every limit
/// of its rule; an abandon only for a bucket reported idle. What a report's
/// demand pushes to the other stream obeys the same bounds.
pub fn rlqs_reports(data: &[u8]) {
    use sluice::algorithm::SECOND;
    use sluice::clock::ManualClock;
    use sluice::limiter::Limiter;
    use sluice::service::rlqs::{decode_report, Quotas, Settings, Stream};
    use sluice::service::{HeaderStyle, Service};
    use sluice::store::{MemoryDemand, MemoryStore};
    use sluice::telemetry::Metrics;
    use std::collections::HashMap;
    use std::sync::{Arc, OnceLock};

    static POLICY: OnceLock<sluice::policy::Policy> = OnceLock::new();
    let policy = POLICY.get_or_init(|| {
        let docs = sluice::policy::parse_str("rlqs.yaml", RLQS_POLICY).expect("the policy parses");
        sluice::policy::compile(docs).expect("the policy compiles")
    });
    let clock = ManualClock::new(1_000 * SECOND);
    let swap = Arc::new(arc_swap::ArcSwap::from_pointee(policy.clone()));
    let store = MemoryStore::new(Arc::new(clock.clone()), 1000);
    let limiter = Limiter::new(swap, store, Default::default()).with_clock(Arc::new(clock.clone()));
    let service = Service::new(limiter, HeaderStyle::Off, Arc::new(Metrics::new()));
    let settings = Settings {
        // Small enough for an input to reach.
        max_buckets: 8,
        max_bucket_bytes: 6 << 10,
        ..Settings::default()
    };
    let quotas = Arc::new(Quotas::new(
        Arc::new(service),
        Arc::new(MemoryDemand::new(Arc::new(clock.clone()))),
        Arc::new(clock.clone()),
        settings,
    ));
    let mut streams: [Option<Stream<MemoryStore>>; 2] = [
        Some(Stream::new(quotas.clone())),
        Some(Stream::new(quotas.clone())),
    ];
    let mut inboxes: Vec<_> = streams
        .iter_mut()
        .map(|s| s.as_mut().and_then(|s| s.inbox.take()).expect("an inbox"))
        .collect();
    let mut domains: [Option<String>; 2] = [None, None];

    let mut rest = data;
    while let Some((&control, after)) = rest.split_first() {
        let (len, after) = match after {
            [a, b, after @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), after),
            _ => (after.len(), &[][..]),
        };
        let (message, after) = after.split_at(len.min(after.len()));
        rest = after;
        clock.advance(u64::from(control >> 1) * SECOND);
        let which = usize::from(control & 1);
        let Some(stream) = streams[which].as_mut() else {
            continue;
        };
        let answered = decode_report(&bytes::Bytes::copy_from_slice(message)).and_then(|r| {
            let reports = r.clone();
            futures::executor::block_on(stream.answer(r)).map(|answer| (reports, answer))
        });
        let (reports, answer) = match answered {
            Ok(both) => both,
            Err(e) => {
                assert_eq!(e.code, sluice_grpc::Code::InvalidArgument, "{e:?}");
                // The stream ends, as `serve` ends it.
                streams[which] = None;
                continue;
            }
        };
        if domains[which].is_none() {
            domains[which] = Some(reports.domain.clone());
        }
        let domain = domains[which].as_deref().expect("a domain once answered");
        let with_id: Vec<_> = reports
            .bucket_quota_usages
            .iter()
            .filter(|u| u.bucket_id.as_ref().is_some_and(|b| !b.bucket.is_empty()))
            .collect();
        assert_eq!(
            answer.bucket_action.len(),
            with_id.len(),
            "one action for each bucket with an id"
        );
        let mut counters: HashMap<String, (f64, f64, Vec<_>)> = HashMap::new();
        for (action, usage) in answer.bucket_action.iter().zip(with_id) {
            assert_eq!(action.bucket_id, usage.bucket_id, "the id echoed");
            let idle = usage.num_requests_allowed == 0 && usage.num_requests_denied == 0;
            if let Some(r) = rlqs_action_within(policy, domain, action, idle) {
                let (sum, slack, ids) = counters.entry(r.counter).or_insert((0.0, 0.0, vec![]));
                *sum += r.rate;
                // A share is rounded up to one token, and one that moved by less than
                // a tenth is sent unchanged.
                *slack += r.floor + r.rate * 0.12;
                ids.push((&action.bucket_id, r.limit));
            }
        }
        // Buckets of one report under one counter (a `share_threshold` wildcard)
        // share its limit: together, within it. (A bucket twice in one report, which
        // Envoy never sends, is its own rival.)
        for (counter, (sum, slack, ids)) in counters {
            let distinct = ids
                .iter()
                .enumerate()
                .all(|(i, (a, _))| ids[..i].iter().all(|(b, _)| a != b));
            if distinct {
                let limit = ids[0].1;
                assert!(
                    sum <= limit + slack,
                    "{counter}: {sum}/s assigned under {limit}/s to {} buckets",
                    ids.len()
                );
            }
        }
        // Nudges the report sent the other streams: each stream's inbox in turn.
        for (i, inbox) in inboxes.iter_mut().enumerate() {
            while let Ok(nudge) = inbox.try_recv() {
                let Some(stream) = streams[i].as_mut() else {
                    continue;
                };
                if let Some(pushed) = stream.nudged(&nudge) {
                    assert_eq!(pushed.bucket_action.len(), 1, "one bucket pushed");
                    let domain = domains[i].as_deref().expect("a stream nudged has a domain");
                    rlqs_action_within(policy, domain, &pushed.bucket_action[0], false);
                }
            }
        }
    }
}

/// One bucket's action against the rule that governs its id in `domain`.
fn rlqs_action_within(
    policy: &sluice::policy::Policy,
    domain: &str,
    action: &sluice::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction,
    idle: bool,
) -> Option<Refill> {
    use sluice::algorithm::SECOND;
    use sluice::limiter::key::Hashing;
    use sluice::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
    use sluice::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
    use sluice::quota::{govern, Governed};

    let id = action
        .bucket_id
        .as_ref()
        .expect("an action names its bucket");
    let q = match action.bucket_action.as_ref().expect("an action") {
        Action::AbandonAction(_) => {
            assert!(idle, "a bucket with requests abandoned");
            return None;
        }
        Action::QuotaAssignmentAction(q) => q,
    };
    let ttl = q.assignment_time_to_live.expect("a TTL");
    assert!(ttl.seconds >= 1 && ttl.nanos == 0, "{ttl:?}");
    let strategy = q
        .rate_limit_strategy
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .expect("a strategy");
    let mut entries: Vec<(String, String)> = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    entries.sort_unstable();
    // The policy's keys are short and plain: no hashing changes which rule matches.
    let governed = if entries.len() > sluice::policy::MAX_ENTRIES
        || entries.iter().any(|(k, _)| k.is_empty())
    {
        Governed::Free(None)
    } else {
        govern(policy, domain, &entries, &Hashing::default())
    };
    let limits = match governed {
        Governed::Free(_) => {
            assert_eq!(
                *strategy,
                Strategy::BlanketRule(BlanketRule::AllowAll as i32),
                "a bucket no limit governs is let through"
            );
            return None;
        }
        Governed::Limited { limits, key, .. } => (limits, key),
    };
    let (limits, key) = limits;
    match strategy {
        Strategy::BlanketRule(r) => {
            assert_eq!(
                *r,
                BlanketRule::DenyAll as i32,
                "a limited bucket let through"
            );
            None
        }
        Strategy::TokenBucket(tb) => {
            let tokens = u128::from(tb.tokens_per_fill.expect("tokens per fill"));
            let fill = tb.fill_interval.expect("a fill interval");
            assert!(fill.seconds >= 1 && fill.nanos == 0, "{fill:?}");
            let fill = fill.seconds as u128 * u128::from(SECOND);
            for l in &limits {
                let window = u128::from(l.window);
                assert!(
                    tokens * window <= u128::from(l.requests) * fill,
                    "{tb:?} refills faster than {l:?}"
                );
                // Envoy refills continuously: a window of no whole seconds holds
                // its own burst, not a whole second's.
                let burst = u128::from(l.burst.max(l.requests).max(1));
                assert!(
                    u128::from(tb.max_tokens) <= burst,
                    "{tb:?} holds more than {l:?}"
                );
            }
            let per_second = |n: u128, span: u128| n as f64 * SECOND as f64 / span as f64;
            Some(Refill {
                counter: key,
                rate: per_second(tokens, fill),
                floor: per_second(1, fill),
                limit: limits
                    .iter()
                    .map(|l| per_second(u128::from(l.requests), u128::from(l.window)))
                    .fold(f64::INFINITY, f64::min),
            })
        }
        Strategy::RequestsPerTimeUnit(_) => panic!("never sent"),
    }
}

/// A token bucket assigned to a bucket under a counter, in requests a second.
struct Refill {
    counter: String,
    rate: f64,
    /// One token per fill: the least a share is rounded up to.
    floor: f64,
    /// The tightest of the counter's limits.
    limit: f64,
}

/// A RateLimitPolicy's `spec` as the Kubernetes API hands it over (any JSON): a
/// document or a non-empty list of errors, each naming the object and saying what
/// is wrong; a document compiles to a policy that serves its domain, or to errors
/// naming the object. A refused spec still claims its domain when it names one.
pub fn resource_spec(data: &[u8]) {
    let Ok(spec) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let place = "shop/checkout";
    let named = |errors: &[sluice::policy::PolicyError]| {
        assert!(!errors.is_empty(), "an error result with no error");
        for e in errors {
            assert_eq!(e.file, place, "{e}");
            assert!(!e.message.trim().is_empty(), "{e:?}");
        }
    };
    match sluice::policy::parse_resource_spec("shop", "checkout", &spec) {
        Ok(doc) => {
            let domain = doc.domain.clone();
            match sluice::policy::compile(vec![doc]) {
                Ok(policy) => assert!(policy.domain(&domain).is_some(), "{domain:?} not served"),
                Err(errors) => named(&errors),
            }
        }
        Err(errors) => {
            named(&errors);
            let claimed = sluice::source::claim::claimed("shop", "checkout", &spec);
            let domain = spec.get("domain").and_then(serde_json::Value::as_str);
            assert_eq!(claimed.map(|d| d.domain), domain.map(String::from));
        }
    }
}

/// A `RateLimitConfig` resource from an xDS server, in a response as the xDS
/// source answers it: ACKed when it converts and compiles, otherwise NACKed with
/// INVALID_ARGUMENT and a message naming the resource (its name, else its domain)
/// or saying why it does not decode. The same response again gets the same
/// verdict, as no news.
pub fn xds_config(data: &[u8]) {
    use sluice::pb::envoy::service::discovery::v3::DiscoveryResponse;
    use sluice::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
    use sluice::source::xds::{Ack, Subscription, TYPE_URL};

    let response = DiscoveryResponse {
        version_info: "7".into(),
        nonce: "n".into(),
        type_url: TYPE_URL.into(),
        resources: vec![prost_types::Any {
            type_url: TYPE_URL.into(),
            value: data.to_vec(),
        }],
        ..Default::default()
    };
    let apply = |docs: Vec<sluice::policy::Document>| sluice::policy::compile(docs).map(|_| ());
    let mut sub = Subscription::new("node");
    sub.stream_opened();
    let first = sub.answer(&response, 0, apply);
    assert_eq!(first.request.response_nonce, "n");
    match &first.verdict {
        Ack::Accepted {
            version,
            domains,
            new,
        } => {
            assert!(
                RateLimitConfig::decode(data).is_ok(),
                "an undecodable resource taken"
            );
            assert_eq!((version.as_str(), *domains, *new), ("7", 1, true));
            assert_eq!(first.request.version_info, "7");
            assert_eq!(first.request.error_detail, None);
        }
        Ack::Refused {
            version,
            message,
            first: news,
        } => {
            assert_eq!((version.as_str(), *news), ("7", true));
            match RateLimitConfig::decode(data) {
                Ok(config) => {
                    let name = if config.name.is_empty() {
                        &config.domain
                    } else {
                        &config.name
                    };
                    let place = format!("xds:{name}");
                    assert!(
                        message.starts_with(&place),
                        "{message:?} names no {place:?}"
                    );
                }
                Err(_) => assert!(
                    message.starts_with("resource 0 does not decode"),
                    "{message}"
                ),
            }
            let detail = first
                .request
                .error_detail
                .as_ref()
                .expect("a NACK says why");
            assert_eq!((detail.code, &detail.message), (3, message));
            // Nothing accepted on this stream: the NACK names no version.
            assert_eq!(first.request.version_info, "");
        }
        Ack::Ignored { type_url } => panic!("a {TYPE_URL} response ignored as {type_url}"),
    }
    let again = sub.answer(&response, 0, apply);
    match (first.verdict, again.verdict) {
        (Ack::Accepted { .. }, Ack::Accepted { new, .. }) => {
            assert!(!new, "the same version is news")
        }
        (
            Ack::Refused { message: a, .. },
            Ack::Refused {
                message: b, first, ..
            },
        ) => {
            assert!(!first, "the same refusal is news");
            assert_eq!(a, b);
        }
        (a, b) => panic!("{a:?}, then {b:?}"),
    }
}
