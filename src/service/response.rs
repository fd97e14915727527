//! Limiter outcomes as Envoy's `RateLimitResponse`.

use std::cell::RefCell;

use crate::pb::envoy::config::core::v3::HeaderValue;
use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use crate::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use bytes::{BufMut, Bytes};
use prost_types::{self as pbuf, value::Kind};

use crate::algorithm::Micros;
use crate::limiter::Outcome;
use crate::policy::answer::current_limit;

use super::headers::{each_header, headers, HeaderStyle};

/// Builds the response for one outcome.
pub fn response(outcome: &Outcome, style: HeaderStyle) -> RateLimitResponse {
    let statuses = outcome
        .statuses
        .iter()
        .map(|s| {
            let code = if s.over_limit {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32;
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
                current_limit: Some(current_limit(rule)),
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
        dynamic_metadata: metadata(outcome),
        ..Default::default()
    }
}

/// The answer to `outcome` as one gRPC frame, byte for byte what
/// `sluice_grpc::frame(&response(outcome, style))` gives, written straight from the
/// outcome: building the message first costs a Vec, Strings and a second walk per
/// answer. Fields go in tag order and zero values are left out, as prost does.
///
/// The answer is written into this thread's scratch buffers and copied out at its
/// exact size: a growable buffer frozen into `Bytes` costs a second allocation
/// (`Bytes` adds a shared header unless length and capacity agree).
pub fn framed_response(outcome: &Outcome, style: HeaderStyle) -> Bytes {
    thread_local! {
        static SCRATCH: RefCell<(Vec<u8>, String)> = const { RefCell::new((Vec::new(), String::new())) };
    }
    // Encoding never calls back into this function, so the borrow is never taken twice.
    SCRATCH.with_borrow_mut(|(buf, text)| {
        buf.clear();
        encode_framed(outcome, style, buf, text);
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
fn encode_framed(outcome: &Outcome, style: HeaderStyle, buf: &mut Vec<u8>, text: &mut String) {
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
    if let Some(m) = metadata(outcome) {
        put_len_key(buf, 6, prost::Message::encoded_len(&m));
        // Cannot fail on a buffer that grows.
        let _ = prost::Message::encode(&m, buf);
    }
    let len = (buf.len() - 5) as u32;
    buf[1..5].copy_from_slice(&len.to_be_bytes());
}

/// One `DescriptorStatus` (field 2), in the three shapes [`response`] builds.
fn put_status(buf: &mut Vec<u8>, outcome: &Outcome, s: &crate::limiter::Status) {
    let code = if s.over_limit {
        Code::OverLimit
    } else {
        Code::Ok
    } as u64;
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
    let limit = rule.map(|r| &*r.rendered.current_limit);
    let reset = reset.map(|us| {
        let seconds = us / 1_000_000;
        let nanos = (us % 1_000_000) * 1000;
        (seconds, nanos)
    });
    let duration_len = reset.map(|(s, n)| varint_field_len(s) + varint_field_len(n));
    let len = varint_field_len(code)
        + limit.map_or(0, |l| nested_len(l.len()))
        + varint_field_len(u64::from(remaining))
        + duration_len.map_or(0, nested_len);
    put_len_key(buf, 2, len);
    put_varint_field(buf, 1, code);
    if let Some(limit) = limit {
        put_len_key(buf, 2, limit.len());
        buf.put_slice(limit);
    }
    put_varint_field(buf, 3, u64::from(remaining));
    if let (Some((seconds, nanos)), Some(duration_len)) = (reset, duration_len) {
        put_len_key(buf, 4, duration_len);
        put_varint_field(buf, 1, seconds);
        put_varint_field(buf, 2, nanos);
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

/// The matched rules' `metadata`, merged (later descriptors win on equal keys).
fn metadata(outcome: &Outcome) -> Option<pbuf::Struct> {
    let mut merged = serde_json::Map::new();
    for s in &outcome.statuses {
        let Some(rule) = outcome.rule(s) else {
            continue;
        };
        if let Some(serde_json::Value::Object(m)) = &rule.metadata {
            merged.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    if merged.is_empty() {
        return None;
    }
    Some(to_struct(&merged))
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
            tightened: false,
            answered_by: None,
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
            // The store failed closed: no verdicts.
            (
                true,
                vec![status(plain, true, None), status(named, true, None)],
            ),
        ];
        for (over_limit, statuses) in cases {
            let outcome = Outcome {
                policy: policy.clone(),
                domain_known: true,
                over_limit,
                statuses,
                delay: 0,
                failure: None,
                offenders: Vec::new(),
                now: None,
                overrides: Vec::new(),
                local: false,
            };
            for style in [HeaderStyle::Off, HeaderStyle::Draft03, HeaderStyle::Ietf] {
                let want = frame(&response(&outcome, style));
                let got = framed_response(&outcome, style);
                assert_eq!(got, want, "{style:?} {:?}", outcome.statuses);
            }
        }
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
