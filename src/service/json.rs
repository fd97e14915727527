//! `POST /json`: a RateLimitRequest in JSON, answered with the RateLimitResponse in
//! JSON (protobuf's JSON mapping, as envoyproxy/ratelimit's `/json` does).

use crate::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::{Entry as ProtoEntry, RateLimitOverride},
    RateLimitDescriptor,
};
use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as ProtoUnit, Code,
};
use crate::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::BadRequest;

// `null` stands for a field's default anywhere, as protobuf's JSON mapping has it.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default, deserialize_with = "nullable")]
    domain: String,
    #[serde(default, deserialize_with = "nullable")]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "hits")]
    hits_addend: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default, deserialize_with = "nullable")]
    entries: Vec<JsonEntry>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "hits")]
    hits_addend: Option<u64>,
    #[serde(default, alias = "isNegativeHits", deserialize_with = "nullable")]
    is_negative_hits: bool,
    #[serde(default)]
    limit: Option<JsonLimit>,
}

fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// An unsigned integer as protobuf's JSON mapping takes one: a number, integral
/// even when written `2.0` or `1e1`, or its digits in a string.
fn unsigned(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => whole(n),
        Value::String(digits) => digits.parse().ok(),
        _ => None,
    }
}

fn whole(n: &serde_json::Number) -> Option<u64> {
    n.as_u64().or_else(|| {
        let f = n.as_f64()?;
        // 2^64 is exactly representable; anything integral below it fits.
        (f >= 0.0 && f.fract() == 0.0 && f < 18_446_744_073_709_551_616.0).then_some(f as u64)
    })
}

/// A `hits_addend`: a number, or its digits in a string, which is how protobuf's JSON
/// mapping writes a 64-bit integer (grpcurl prints it so) and which it also takes for
/// 32-bit ones.
fn hits<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    let n = match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => unsigned(&v),
    };
    n.and_then(|n| T::try_from(n).ok())
        .map(Some)
        .ok_or_else(|| {
            serde::de::Error::custom(
                "hitsAddend must be an unsigned integer in range, as a number or its digits in a string",
            )
        })
}

/// `RateLimitOverride`; `unit` by name (`MINUTE`) or number, as protobuf's JSON
/// mapping allows.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLimit {
    #[serde(default, alias = "requestsPerUnit", deserialize_with = "requests")]
    requests_per_unit: u32,
    #[serde(default)]
    unit: Option<Value>,
}

fn requests<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(0),
        Some(v) => unsigned(&v)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                serde::de::Error::custom(
                    "requestsPerUnit must be an unsigned 32-bit integer, as a number or its digits in a string",
                )
            }),
    }
}

impl JsonLimit {
    fn into_proto(self) -> Result<RateLimitOverride, BadRequest> {
        let unit = match self.unit {
            None | Some(Value::Null) => 0,
            Some(Value::String(name)) => ProtoUnit::from_str_name(&name)
                .ok_or_else(|| BadRequest(format!("invalid JSON request: unknown unit {name:?}")))?
                as i32,
            Some(Value::Number(n)) => whole(&n)
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| BadRequest(format!("invalid JSON request: unknown unit {n}")))?,
            Some(other) => {
                return Err(BadRequest(format!(
                    "invalid JSON request: unit must be a name or a number, not {other}"
                )))
            }
        };
        Ok(RateLimitOverride {
            requests_per_unit: self.requests_per_unit,
            unit,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default, deserialize_with = "nullable")]
    key: String,
    #[serde(default, deserialize_with = "nullable")]
    value: String,
}

/// Parses the JSON body into the protobuf request.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, BadRequest> {
    // serde would also read a struct from an array of its fields in order.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(BadRequest(
            "invalid JSON request: the body must be a JSON object (a RateLimitRequest)".into(),
        ));
    }
    let req: JsonRequest = serde_json::from_slice(body)
        .map_err(|e| BadRequest(format!("invalid JSON request: {e}")))?;
    let descriptors = req
        .descriptors
        .into_iter()
        .map(|d| {
            Ok(RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| ProtoEntry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                hits_addend: d.hits_addend,
                is_negative_hits: d.is_negative_hits,
                limit: d.limit.map(JsonLimit::into_proto).transpose()?,
            })
        })
        .collect::<Result<_, BadRequest>>()?;
    Ok(RateLimitRequest {
        domain: req.domain,
        hits_addend: req.hits_addend.unwrap_or(0),
        descriptors,
    })
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).unwrap_or(Code::Unknown).as_str_name()
}

/// A `google.protobuf.Duration` as protobuf's JSON mapping writes it: whole
/// seconds and 0, 3, 6 or 9 digits of fraction (strict parsers, Go's `protojson`
/// among them, refuse any other count).
fn duration_text(d: &prost_types::Duration) -> String {
    let (s, n) = (d.seconds, d.nanos);
    match n {
        0 => format!("{s}s"),
        _ if n % 1_000_000 == 0 => format!("{s}.{:03}s", n / 1_000_000),
        _ if n % 1_000 == 0 => format!("{s}.{:06}s", n / 1_000),
        _ => format!("{s}.{n:09}s"),
    }
}

/// Renders the response in protobuf's JSON mapping.
pub fn render_response(resp: &RateLimitResponse) -> Value {
    let statuses: Vec<Value> = resp
        .statuses
        .iter()
        .map(|s| {
            let mut m = Map::new();
            m.insert("code".into(), json!(code_name(s.code)));
            if let Some(l) = &s.current_limit {
                let mut limit = Map::new();
                if !l.name.is_empty() {
                    limit.insert("name".into(), json!(l.name));
                }
                limit.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                let unit = ProtoUnit::try_from(l.unit).unwrap_or(ProtoUnit::Unknown);
                limit.insert("unit".into(), json!(unit.as_str_name()));
                m.insert("currentLimit".into(), Value::Object(limit));
            }
            m.insert("limitRemaining".into(), json!(s.limit_remaining));
            if let Some(d) = &s.duration_until_reset {
                m.insert("durationUntilReset".into(), json!(duration_text(d)));
            }
            Value::Object(m)
        })
        .collect();
    let headers: Vec<Value> = resp
        .response_headers_to_add
        .iter()
        .map(|h| json!({"key": h.key, "value": h.value}))
        .collect();
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code_name(resp.overall_code)));
    out.insert("statuses".into(), Value::Array(statuses));
    if !headers.is_empty() {
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(m) = &resp.dynamic_metadata {
        out.insert("dynamicMetadata".into(), struct_json(m));
    }
    Value::Object(out)
}

/// A `google.protobuf.Struct` as protobuf's JSON mapping writes it: a plain object.
pub fn struct_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::NullValue(_)) | None => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_have_three_six_or_nine_digits_of_fraction() {
        let d = |seconds, nanos| duration_text(&prost_types::Duration { seconds, nanos });
        assert_eq!(d(0, 0), "0s");
        assert_eq!(d(60, 0), "60s");
        assert_eq!(d(0, 500_000_000), "0.500s");
        // As a float this was 1.6033330000000001s.
        assert_eq!(d(1, 603_333_000), "1.603333s");
        assert_eq!(d(1, 582_717_999), "1.582717999s");
        assert_eq!(d(2, 1), "2.000000001s");
    }

    #[test]
    fn parses_snake_and_camel_case() {
        let r = parse_request(
            br#"{"domain":"d","hitsAddend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],"hits_addend":0}]}"#,
        )
        .unwrap();
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].entries[0].value, "v");
        assert_eq!(r.descriptors[0].hits_addend, Some(0));
    }

    #[test]
    fn reads_a_limit_override_by_unit_name_or_number() {
        let r = parse_request(
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requestsPerUnit":5,"unit":"MINUTE"}},{"entries":[],"limit":{"requests_per_unit":1,"unit":4}}]}"#,
        )
        .unwrap();
        let limit = |i: usize| {
            r.descriptors[i]
                .limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit))
        };
        assert_eq!(limit(0), Some((5, 2)));
        assert_eq!(limit(1), Some((1, 4)));
        let e = parse_request(br#"{"domain":"d","descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#);
        assert!(e.unwrap_err().0.contains("FORTNIGHT"));
    }

    /// A refund, with its hits as protobuf's JSON mapping writes a 64-bit integer
    /// (digits in a string, as grpcurl prints them) or as a number.
    #[test]
    fn reads_a_refund_and_hits_as_digits() {
        let r = parse_request(
            br#"{"domain":"d","hitsAddend":"3","descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":"25","isNegativeHits":true},{"hits_addend":7,"is_negative_hits":false}]}"#,
        )
        .unwrap();
        assert_eq!(r.hits_addend, 3);
        assert_eq!(
            (
                r.descriptors[0].hits_addend,
                r.descriptors[0].is_negative_hits
            ),
            (Some(25), true)
        );
        assert_eq!(
            (
                r.descriptors[1].hits_addend,
                r.descriptors[1].is_negative_hits
            ),
            (Some(7), false)
        );
        for bad in [
            r#"{"descriptors":[{"hitsAddend":"-1"}]}"#,
            r#"{"descriptors":[{"hitsAddend":2.5}]}"#,
            r#"{"descriptors":[{"hitsAddend":true}]}"#,
            r#"{"hitsAddend":"4294967296"}"#,
        ] {
            let e = parse_request(bad.as_bytes()).unwrap_err().0;
            assert!(
                e.contains("hitsAddend must be an unsigned integer"),
                "{bad}: {e}"
            );
        }
    }

    /// What protobuf's JSON mapping allows and Go's protojson (envoyproxy/ratelimit's
    /// `/json`) takes: `null` for a default, integers written `2.0` or `1e1`.
    #[test]
    fn reads_nulls_as_defaults_and_integral_numbers_in_any_form() {
        let r = parse_request(
            br#"{"domain":"d","hitsAddend":2.0,"descriptors":[{"entries":[{"key":"k","value":null}],"hitsAddend":1e1,"isNegativeHits":null,"limit":{"requestsPerUnit":5e0,"unit":2.0}},{"entries":null}]}"#,
        )
        .unwrap();
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].entries[0].value, "");
        assert_eq!(r.descriptors[0].hits_addend, Some(10));
        assert!(!r.descriptors[0].is_negative_hits);
        let limit = r.descriptors[0].limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (5, 2));
        assert!(r.descriptors[1].entries.is_empty());
        let r = parse_request(br#"{"domain":null,"descriptors":null,"hitsAddend":null}"#).unwrap();
        assert_eq!(
            (r.domain.as_str(), r.descriptors.len(), r.hits_addend),
            ("", 0, 0)
        );
        for bad in [
            r#"{"descriptors":[{"limit":{"requestsPerUnit":1.5}}]}"#,
            r#"{"descriptors":[{"limit":{"requestsPerUnit":4294967296}}]}"#,
            r#"{"descriptors":[{"limit":{"requestsPerUnit":-1}}]}"#,
        ] {
            let e = parse_request(bad.as_bytes()).unwrap_err().0;
            assert!(e.contains("requestsPerUnit must be"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused_as_such() {
        for bad in ["[]", r#"["d",[]]"#, " 5", "", "null"] {
            let e = parse_request(bad.as_bytes()).unwrap_err().0;
            assert!(e.contains("must be a JSON object"), "{bad}: {e}");
        }
        assert!(parse_request(b" \n {\"domain\":\"d\"}").is_ok());
    }

    #[test]
    fn refuses_malformed_json_and_unknown_fields() {
        assert!(parse_request(b"{").is_err());
        assert!(parse_request(br#"{"domain":"d","bogus":1}"#).is_err());
        assert!(parse_request(br#"{"domain":5}"#).is_err());
    }
}
