//! Limiter outcomes as Envoy's `RateLimitResponse`.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as ProtoUnit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::{self as pbuf, value::Kind};

use crate::algorithm::Micros;
use crate::limiter::Outcome;
use crate::policy::{Rule, Unit};

use super::headers::{headers, HeaderStyle};

/// Builds the response for one outcome.
pub fn response(outcome: &Outcome, style: HeaderStyle) -> RateLimitResponse {
    let policy = &outcome.policy;
    let statuses = outcome
        .statuses
        .iter()
        .map(|s| {
            let code = if s.over_limit {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32;
            let Some(rule) = s.rule.map(|r| policy.rule(r)) else {
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

fn current_limit(rule: &Rule) -> RateLimit {
    RateLimit {
        name: rule.name.clone().unwrap_or_default(),
        requests_per_unit: rule.requests_per_unit,
        unit: proto_unit(rule.unit) as i32,
    }
}

fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Unknown => ProtoUnit::Unknown,
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
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
        let Some(rule) = s.rule.map(|r| outcome.policy.rule(r)) else {
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
