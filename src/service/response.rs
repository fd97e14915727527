//! Limiter outcomes as Envoy's `RateLimitResponse`.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::pb::envoy::config::core::v3::HeaderValue;
use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use crate::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use bytes::{BufMut, Bytes};
use prost_types::{self as pbuf, value::Kind};

use crate::algorithm::Micros;
use crate::limiter::Outcome;
use crate::policy::answer::{current_limit, unit_value};

use super::decode::Request;
use super::headers::{each_header, headers, HeaderStyle};

/// The code a descriptor's status reports.
fn status_code(s: &crate::limiter::Status) -> Code {
    if s.over_limit {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// Builds the response for one outcome. With `echo` (`--response-dynamic-metadata`)
/// the request is echoed in `dynamic_metadata` (docs/responses.md, "Dynamic metadata").
pub fn response(
    outcome: &Outcome,
    style: HeaderStyle,
    echo: Option<&Request<'_>>,
) -> RateLimitResponse {
    let statuses = outcome
        .statuses
        .iter()
        .map(|s| {
            let code = status_code(s) as i32;
            let Some(rule) = outcome.rule(s) else {
                return DescriptorStatus {
                    code,
                    ..Default::default()
                };
            };
            if rule.limit.is_none() {
                // unlimited: what envoyproxy/ratelimit answers.
                return DescriptorStatus {
                    code,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                };
            }
            let (remaining, reset) = s.verdict.map_or((0, 0), |v| (v.remaining, v.reset));
            DescriptorStatus {
                code,
                // A key a penalty tightened: the limit it was decided against.
                current_limit: Some(current_limit(rule, s.requests_per_unit(rule))),
                limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(duration(reset)),
                ..Default::default()
            }
        })
        .collect();

    let response_headers_to_add = headers(outcome, style)
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.to_string(),
            value,
            ..Default::default()
        })
        .collect();

    RateLimitResponse {
        overall_code: if outcome.over_limit {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses,
        response_headers_to_add,
        dynamic_metadata: dynamic_metadata(outcome, echo),
        ..Default::default()
    }
}

/// The answer to `outcome` as one gRPC frame, byte for byte what
/// `sluice_grpc::frame(&response(outcome, style, echo))` gives, written straight from the
/// outcome: building the message first costs a Vec, Strings and a second walk per
/// answer. Fields go in tag order and zero values are left out, as prost does.
///
/// The answer is written into this thread's scratch buffers and copied out at its
/// exact size: a growable buffer frozen into `Bytes` costs a second allocation
/// (`Bytes` adds a shared header unless length and capacity agree).
pub fn framed_response(outcome: &Outcome, style: HeaderStyle, echo: Option<&Request<'_>>) -> Bytes {
    thread_local! {
        static SCRATCH: RefCell<(Vec<u8>, String)> = const { RefCell::new((Vec::new(), String::new())) };
    }
    // Encoding never calls back into this function, so the borrow is never taken twice.
    SCRATCH.with_borrow_mut(|(buf, text)| {
        buf.clear();
        encode_framed(outcome, style, echo, buf, text);
        let answer = Bytes::copy_from_slice(buf);
        if buf.capacity() > MAX_SCRATCH {
            // An answer with large metadata: do not keep its buffer for ever.
            *buf = Vec::new();
        }
        answer
    })
}

/// Largest scratch buffer a thread keeps between answers.
const MAX_SCRATCH: usize = 64 * 1024;

/// Writes the framed answer into `buf` (empty), with `text` as scratch.
fn encode_framed(
    outcome: &Outcome,
    style: HeaderStyle,
    echo: Option<&Request<'_>>,
    buf: &mut Vec<u8>,
    text: &mut String,
) {
    // The gRPC prefix: not compressed, then the length, filled in at the end.
    buf.put_bytes(0, 5);
    let overall = if outcome.over_limit {
        Code::OverLimit
    } else {
        Code::Ok
    };
    put_varint_field(buf, 1, overall as u64);
    for s in &outcome.statuses {
        put_status(buf, outcome, s);
    }
    each_header(outcome, style, text, |name, value| {
        let len = string_field_len(name) + string_field_len(value);
        put_len_key(buf, 3, len);
        put_string_field(buf, 1, name);
        put_string_field(buf, 2, value);
    });
    if let Some(m) = dynamic_metadata(outcome, echo) {
        put_len_key(buf, 6, prost::Message::encoded_len(&m));
        // Cannot fail on a buffer that grows.
        let _ = prost::Message::encode(&m, buf);
    }
    let len = (buf.len() - 5) as u32;
    buf[1..5].copy_from_slice(&len.to_be_bytes());
}

/// One `DescriptorStatus` (field 2), in the three shapes [`response`] builds.
fn put_status(buf: &mut Vec<u8>, outcome: &Outcome, s: &crate::limiter::Status) {
    let code = status_code(s) as u64;
    let (rule, remaining, reset) = match outcome.rule(s) {
        None => (None, 0, None),
        Some(rule) if rule.limit.is_none() => (None, u32::MAX, None),
        Some(rule) => {
            let (remaining, reset) = s.verdict.map_or((0, 0), |v| (v.remaining, v.reset));
            (
                Some(rule),
                u32::try_from(remaining).unwrap_or(u32::MAX),
                Some(reset),
            )
        }
    };
    let limit = rule.map(|r| match s.tightened {
        // A key a penalty tightened: the limit it was decided against, its fields
        // written here (the rendered ones are the rule's own).
        Some(_) => Limit::Tightened {
            name: r.name.as_deref().unwrap_or(""),
            rpu: u64::from(s.requests_per_unit(r)),
            unit: unit_value(r) as u64,
        },
        None => Limit::Rendered(&r.rendered.current_limit),
    });
    let reset = reset.map(|us| {
        let seconds = us / 1_000_000;
        let nanos = (us % 1_000_000) * 1000;
        (seconds, nanos)
    });
    let duration_len = reset.map(|(s, n)| varint_field_len(s) + varint_field_len(n));
    let len = varint_field_len(code)
        + limit.as_ref().map_or(0, |l| nested_len(l.len()))
        + varint_field_len(u64::from(remaining))
        + duration_len.map_or(0, nested_len);
    put_len_key(buf, 2, len);
    put_varint_field(buf, 1, code);
    if let Some(limit) = limit {
        put_len_key(buf, 2, limit.len());
        match limit {
            Limit::Rendered(bytes) => buf.put_slice(bytes),
            // Envoy's field numbers: requests_per_unit 1, unit 2, name 3.
            Limit::Tightened { name, rpu, unit } => {
                put_varint_field(buf, 1, rpu);
                put_varint_field(buf, 2, unit);
                put_string_field(buf, 3, name);
            }
        }
    }
    put_varint_field(buf, 3, u64::from(remaining));
    if let (Some((seconds, nanos)), Some(duration_len)) = (reset, duration_len) {
        put_len_key(buf, 4, duration_len);
        put_varint_field(buf, 1, seconds);
        put_varint_field(buf, 2, nanos);
    }
}

/// A status's `current_limit` (field 2): the rule's, encoded when the policy was
/// compiled, or a tightened key's, written field by field.
enum Limit<'a> {
    Rendered(&'a [u8]),
    Tightened { name: &'a str, rpu: u64, unit: u64 },
}

impl Limit<'_> {
    /// The message's length, without its own key and length.
    fn len(&self) -> usize {
        match *self {
            Limit::Rendered(bytes) => bytes.len(),
            Limit::Tightened { name, rpu, unit } => {
                string_field_len(name) + varint_field_len(rpu) + varint_field_len(unit)
            }
        }
    }
}

fn varint_len(v: u64) -> usize {
    // 7 bits a byte; 0 still takes one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// The key of field `tag` (below 16, so one byte).
fn put_key(buf: &mut Vec<u8>, tag: u8, wire_type: u8) {
    debug_assert!(tag < 16);
    buf.put_u8(tag << 3 | wire_type);
}

/// A varint field: left out when 0.
fn varint_field_len(v: u64) -> usize {
    if v == 0 {
        0
    } else {
        1 + varint_len(v)
    }
}

fn put_varint_field(buf: &mut Vec<u8>, tag: u8, v: u64) {
    if v != 0 {
        put_key(buf, tag, 0);
        put_varint(buf, v);
    }
}

/// A string field: left out when empty.
fn string_field_len(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        nested_len(s.len())
    }
}

fn put_string_field(buf: &mut Vec<u8>, tag: u8, s: &str) {
    if !s.is_empty() {
        put_len_key(buf, tag, s.len());
        buf.put_slice(s.as_bytes());
    }
}

/// A length-delimited field whose content is `len` bytes (a present message is
/// written even when empty).
fn nested_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn put_len_key(buf: &mut Vec<u8>, tag: u8, len: usize) {
    put_key(buf, tag, 2);
    put_varint(buf, len as u64);
}

fn duration(us: Micros) -> pbuf::Duration {
    pbuf::Duration {
        seconds: (us / 1_000_000) as i64,
        nanos: ((us % 1_000_000) * 1000) as i32,
    }
}

/// The answer's `dynamic_metadata`, shaped as envoyproxy/ratelimit's: under
/// `metadata`, the `metadata` of the descriptors a limit answered OK (not those over
/// their limit, unlimited or unmatched ones), merged in request order with the first
/// value kept on equal keys and mappings merged key by key; with `echo` also the
/// request's `domain`, `descriptors` (entries as `key=value`, and each one's `limit`
/// and `hitsAddend` when sent) and `hitsAddend` (when not 0). `None` when there is
/// nothing to send, found without allocating.
fn dynamic_metadata(outcome: &Outcome, echo: Option<&Request<'_>>) -> Option<pbuf::Struct> {
    let passed = |s: &crate::limiter::Status| {
        let rule = outcome.rule(s)?;
        rule.limit?;
        match (&rule.metadata, status_code(s)) {
            (Some(serde_json::Value::Object(m)), Code::Ok) => Some(m),
            _ => None,
        }
    };
    if echo.is_none() && !outcome.statuses.iter().any(|s| passed(s).is_some()) {
        return None;
    }
    let mut merged = BTreeMap::new();
    for m in outcome.statuses.iter().filter_map(passed) {
        merge(&mut merged, m);
    }
    let mut fields = BTreeMap::new();
    if let Some(req) = echo {
        fields.insert("domain".to_string(), string(req.domain.to_string()));
        let descriptors = req.descriptors.iter().map(|d| {
            let entries = req.entries[d.entries.clone()]
                .iter()
                .map(|(k, v)| string(format!("{k}={v}")))
                .collect();
            let mut f = BTreeMap::new();
            f.insert("entries".to_string(), list(entries));
            if let Some(l) = d.limit {
                f.insert("limit".to_string(), string(override_text(l)));
            }
            if let Some(h) = d.hits_addend {
                f.insert("hitsAddend".to_string(), number(h as f64));
            }
            struct_value(f)
        });
        fields.insert("descriptors".to_string(), list(descriptors.collect()));
        if req.hits_addend != 0 {
            fields.insert("hitsAddend".to_string(), number(f64::from(req.hits_addend)));
        }
    }
    if !merged.is_empty() {
        fields.insert("metadata".to_string(), struct_value(merged));
    }
    Some(pbuf::Struct { fields })
}

/// Adds `src` to `dest`, keeping what `dest` has: two mappings under one key merge,
/// anything else stays `dest`'s (envoyproxy/ratelimit's `mergeMetadata`).
fn merge(
    dest: &mut BTreeMap<String, pbuf::Value>,
    src: &serde_json::Map<String, serde_json::Value>,
) {
    for (k, v) in src {
        match (dest.get_mut(k), v) {
            (None, _) => {
                dest.insert(k.clone(), to_value(v));
            }
            (
                Some(pbuf::Value {
                    kind: Some(Kind::StructValue(inner)),
                }),
                serde_json::Value::Object(m),
            ) => merge(&mut inner.fields, m),
            (Some(_), _) => {}
        }
    }
}

/// A descriptor's `limit` as envoyproxy/ratelimit writes it (Go's protobuf text
/// form, zero fields left out): `requests_per_unit:10 unit:MINUTE`.
fn override_text(l: super::decode::LimitOverride) -> String {
    use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    let mut out = Vec::new();
    if l.requests_per_unit != 0 {
        out.push(format!("requests_per_unit:{}", l.requests_per_unit));
    }
    if l.unit != 0 {
        match Unit::try_from(l.unit) {
            Ok(u) => out.push(format!("unit:{}", u.as_str_name())),
            Err(_) => out.push(format!("unit:{}", l.unit)),
        }
    }
    out.join(" ")
}

fn string(s: String) -> pbuf::Value {
    pbuf::Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn number(n: f64) -> pbuf::Value {
    pbuf::Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<pbuf::Value>) -> pbuf::Value {
    pbuf::Value {
        kind: Some(Kind::ListValue(pbuf::ListValue { values })),
    }
}

fn struct_value(fields: BTreeMap<String, pbuf::Value>) -> pbuf::Value {
    pbuf::Value {
        kind: Some(Kind::StructValue(pbuf::Struct { fields })),
    }
}

fn to_struct(map: &serde_json::Map<String, serde_json::Value>) -> pbuf::Struct {
    pbuf::Struct {
        fields: map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
    }
}

fn to_value(v: &serde_json::Value) -> pbuf::Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(pbuf::ListValue {
            values: a.iter().map(to_value).collect(),
        }),
        J::Object(m) => Kind::StructValue(to_struct(m)),
    };
    pbuf::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::algorithm::{Verdict, SECOND};
    use crate::limiter::{Ban, Status};
    use crate::policy::Policy;
    use sluice_grpc::frame;

    const POLICY: &str = r#"
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: named
    rate_limit: {unit: hour, requests_per_unit: 300, name: "a \"quoted\" \\ name"}
    # One key per map: a Struct's fields are a HashMap, encoded in its (random) order.
    metadata: {tier: [gold, 2, 1.5, null, true, {k: [v]}]}
  - key: free
    rate_limit: {unlimited: true}
  - key: big
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: m1
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {svc: {name: one, a: 1}, only1: x}
  - key: m2
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {svc: {name: two, b: 2}, only2: why, list: [1]}
  - key: m3
    rate_limit: {unlimited: true}
    metadata: {free: true}
"#;

    fn policy() -> Arc<Policy> {
        let docs = crate::policy::parse_str("p.yaml", POLICY).expect("parses");
        Arc::new(crate::policy::compile(docs).expect("compiles"))
    }

    fn rule(policy: &Policy, path: &str) -> Option<usize> {
        policy.rules.iter().position(|r| r.path == path)
    }

    fn status(rule: Option<usize>, over_limit: bool, verdict: Option<Verdict>) -> Status {
        Status {
            rule,
            limit_override: None,
            over_limit,
            verdict,
            hits: 1,
            spend: crate::store::Spend::IfAdmitted,
            ban: Ban::None,
            shed: false,
            tightened: None,
            answered_by: None,
            spent_denied: false,
        }
    }

    fn verdict(admitted: bool, remaining: u64, reset: u64, retry_after: u64) -> Verdict {
        Verdict {
            admitted,
            remaining,
            reset,
            retry_after,
            ..Verdict::default()
        }
    }

    #[test]
    fn hand_encoding_matches_prost() {
        let policy = policy();
        let plain = rule(&policy, "plain");
        let named = rule(&policy, "named");
        let free = rule(&policy, "free");
        let big = rule(&policy, "big");
        assert!(plain.is_some() && named.is_some() && free.is_some() && big.is_some());
        // Retry-after waits stay under 5 s so the 10 % jitter rounds to nothing.
        let cases: Vec<(bool, Vec<Status>)> = vec![
            (false, vec![]),
            (false, vec![status(None, false, None)]),
            (false, vec![status(free, false, None)]),
            (
                false,
                vec![status(
                    plain,
                    false,
                    Some(verdict(true, 9, 59 * SECOND + 1, 0)),
                )],
            ),
            (false, vec![status(plain, false, None)]),
            (
                false,
                vec![
                    status(plain, false, Some(verdict(true, 0, 0, 0))),
                    status(named, false, Some(verdict(true, 299, 3_599 * SECOND, 0))),
                    status(free, false, None),
                    status(None, false, None),
                ],
            ),
            (
                true,
                vec![
                    status(plain, true, Some(verdict(false, 0, 1_500_000, 1_500_000))),
                    status(named, false, Some(verdict(true, 12, 7, 0))),
                ],
            ),
            (
                true,
                vec![status(named, true, Some(verdict(false, 0, 3, 2 * SECOND)))],
            ),
            // Never admissible: the wait is the window (a second here).
            (
                true,
                vec![status(big, true, Some(verdict(false, 0, 3, u64::MAX)))],
            ),
            (
                false,
                vec![status(
                    big,
                    false,
                    Some(verdict(true, 3_999_999_999, 999_999, 0)),
                )],
            ),
            (
                false,
                vec![status(
                    big,
                    false,
                    Some(verdict(true, u64::MAX, u64::MAX, 0)),
                )],
            ),
            // A key a penalty tightened to a fifth of 10.
            (
                false,
                vec![Status {
                    tightened: Some(200_000),
                    ..status(plain, false, Some(verdict(true, 1, 59 * SECOND, 0)))
                }],
            ),
            // The store failed closed: no verdicts.
            (
                true,
                vec![status(plain, true, None), status(named, true, None)],
            ),
        ];
        for (over_limit, statuses) in cases {
            let outcome = Outcome {
                policy: policy.clone(),
                ..outcome(over_limit, statuses)
            };
            let req = echoed();
            for style in [HeaderStyle::Off, HeaderStyle::Draft03, HeaderStyle::Ietf] {
                for echo in [None, Some(&req)] {
                    let want = frame(&response(&outcome, style, echo));
                    let got = framed_response(&outcome, style, echo);
                    assert_eq!(got, want, "{style:?} {:?}", outcome.statuses);
                }
            }
        }
    }

    /// A key a penalty tightened is answered with the limit it is decided against,
    /// which its remaining counts down from: `current_limit`, `x-ratelimit-limit`
    /// and `ratelimit-policy` all say 2 (a fifth of 10), on both encodings.
    #[tokio::test]
    async fn a_tightened_key_is_answered_with_its_tightened_limit() {
        use crate::clock::ManualClock;
        use crate::limiter::{Descriptor, Settings};
        use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
        const POLICY: &str = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n      algorithm: fixed_window\n      name: per_ip\n      penalty: {violations: 2, within: 1m, tighten: {factor: 0.2, for: 10m}}\n";
        let clock = ManualClock::new(1_700_000_000 * SECOND);
        let l = crate::limiter::test_limiter(POLICY, &clock, Settings::default());
        let ask = || async {
            let ip = [("ip", "1.1.1.1")];
            l.decide("d", &[Descriptor::new(&ip[..], 1)]).await
        };
        let limit_of = |o: &Outcome| {
            let r = response(o, HeaderStyle::Draft03, None);
            assert_eq!(frame(&r), framed_response(o, HeaderStyle::Draft03, None));
            let ietf = response(o, HeaderStyle::Ietf, None);
            assert_eq!(frame(&ietf), framed_response(o, HeaderStyle::Ietf, None));
            let header = |r: &RateLimitResponse, name: &str| {
                r.response_headers_to_add
                    .iter()
                    .find(|h| h.key == name)
                    .map(|h| h.value.clone())
                    .unwrap_or_default()
            };
            (
                r.statuses[0].current_limit.clone().unwrap(),
                r.statuses[0].limit_remaining,
                header(&r, "x-ratelimit-limit"),
                header(&r, "x-ratelimit-remaining"),
                header(&ietf, "ratelimit-policy"),
            )
        };
        let full = ask().await;
        assert_eq!(
            limit_of(&full),
            (
                RateLimit {
                    name: "per_ip".into(),
                    requests_per_unit: 10,
                    unit: 2
                },
                9,
                "10, 10;w=60;name=\"per_ip\"".to_string(),
                "9".to_string(),
                "\"per_ip\";q=10;w=60".to_string(),
            )
        );
        // Two denials past the limit tighten the key to a fifth.
        while !ask().await.over_limit {}
        ask().await;
        clock.advance(61 * SECOND);
        let tight = ask().await;
        assert!(tight.statuses[0].tightened.is_some() && !tight.over_limit);
        assert_eq!(
            limit_of(&tight),
            (
                RateLimit {
                    name: "per_ip".into(),
                    requests_per_unit: 2,
                    unit: 2
                },
                1,
                "2, 2;w=60;name=\"per_ip\"".to_string(),
                "1".to_string(),
                "\"per_ip\";q=2;w=60".to_string(),
            )
        );
    }

    /// A request of two descriptors, one with its own limit and hits_addend.
    fn echoed() -> Request<'static> {
        use super::super::decode::{LimitOverride, WireDescriptor};
        Request {
            domain: "d",
            hits_addend: 3,
            descriptors: vec![
                WireDescriptor {
                    entries: 0..2,
                    ..Default::default()
                },
                WireDescriptor {
                    entries: 2..3,
                    hits_addend: Some(0),
                    limit: Some(LimitOverride {
                        requests_per_unit: 10,
                        unit: 2,
                    }),
                    ..Default::default()
                },
            ],
            entries: vec![("a", "1"), ("b", ""), ("c", "x=y")],
        }
    }

    fn outcome(over_limit: bool, statuses: Vec<Status>) -> Outcome {
        Outcome {
            policy: policy(),
            domain_known: true,
            over_limit,
            statuses,
            delay: 0,
            failure: None,
            offenders: Vec::new(),
            now: None,
            overrides: Vec::new(),
            local: false,
        }
    }

    /// The answer's dynamic_metadata as JSON, as Envoy's filter hands it on.
    fn metadata_of(outcome: &Outcome, echo: Option<&Request<'_>>) -> Option<serde_json::Value> {
        let m = response(outcome, HeaderStyle::Off, echo).dynamic_metadata?;
        Some(crate::service::json::struct_json(&m))
    }

    #[test]
    fn metadata_of_the_descriptors_that_passed_is_nested_and_the_first_value_wins() {
        use serde_json::json;
        let p = policy();
        let (m1, m2, m3) = (rule(&p, "m1"), rule(&p, "m2"), rule(&p, "m3"));
        let ok = || Some(verdict(true, 0, SECOND, 0));
        let over = || Some(verdict(false, 0, SECOND, SECOND));
        // Both passed: merged under `metadata`, m1's values kept, mappings merged.
        let both = outcome(
            false,
            vec![status(m1, false, ok()), status(m2, false, ok())],
        );
        assert_eq!(
            metadata_of(&both, None),
            Some(json!({"metadata": {
                "svc": {"name": "one", "a": 1.0, "b": 2.0},
                "only1": "x", "only2": "why", "list": [1.0],
            }}))
        );
        // The over-limit descriptor's metadata is left out; an unlimited rule's too.
        let denied = outcome(
            true,
            vec![
                status(m1, true, over()),
                status(m2, false, ok()),
                status(m3, false, None),
            ],
        );
        assert_eq!(
            metadata_of(&denied, None),
            Some(
                json!({"metadata": {"svc": {"name": "two", "b": 2.0}, "only2": "why", "list": [1.0]}})
            )
        );
        // Nothing passed with metadata: no dynamic_metadata at all.
        let none = outcome(
            true,
            vec![status(m1, true, over()), status(m3, false, None)],
        );
        assert_eq!(metadata_of(&none, None), None);
        let plain = outcome(false, vec![status(rule(&p, "plain"), false, ok())]);
        assert_eq!(metadata_of(&plain, None), None);
    }

    #[test]
    fn the_request_is_echoed_when_asked_as_envoyproxy_ratelimit_writes_it() {
        use serde_json::json;
        let p = policy();
        let req = echoed();
        let ok = || Some(verdict(true, 0, SECOND, 0));
        let plain = outcome(
            false,
            vec![
                status(rule(&p, "plain"), false, ok()),
                status(None, false, None),
            ],
        );
        let request = json!({
            "domain": "d",
            "descriptors": [
                {"entries": ["a=1", "b="]},
                {"entries": ["c=x=y"], "limit": "requests_per_unit:10 unit:MINUTE", "hitsAddend": 0.0},
            ],
            "hitsAddend": 3.0,
        });
        assert_eq!(metadata_of(&plain, Some(&req)), Some(request.clone()));
        let with = outcome(false, vec![status(rule(&p, "m1"), false, ok())]);
        let mut both = request;
        both["metadata"] = json!({"svc": {"name": "one", "a": 1.0}, "only1": "x"});
        assert_eq!(metadata_of(&with, Some(&req)), Some(both));
        // hitsAddend 0 (absent) is left out, as protobuf leaves it.
        let zero = Request {
            hits_addend: 0,
            ..req.clone()
        };
        let got = metadata_of(&plain, Some(&zero)).unwrap();
        assert!(got.get("hitsAddend").is_none(), "{got}");
    }

    #[test]
    fn varint_lengths() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v), "{v}");
            assert_eq!(varint_len(v), prost::encoding::encoded_len_varint(v), "{v}");
        }
    }
}
