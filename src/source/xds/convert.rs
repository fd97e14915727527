//! An xDS `RateLimitConfig` (one per domain, as Envoy Gateway publishes them) into
//! the policy model, with the meaning of the same document as a file: the config
//! becomes envoyproxy/ratelimit's YAML document (as envoyproxy/ratelimit's own xDS
//! client converts it) and goes through every check a file gets.

use crate::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost_types::{value::Kind, Struct, Value as ProtoValue};
use serde_json::{json, Map, Value};

use crate::policy::{self, Document, PolicyError};

/// Most nesting converted: deeper trees are refused by the policy parser anyway.
const MAX_DEPTH: usize = 64;

/// The document of `config`; errors name `xds:NAME` (the resource's name, else its
/// domain).
pub fn document(config: &RateLimitConfig) -> Result<Document, Vec<PolicyError>> {
    let name = if config.name.is_empty() {
        &config.domain
    } else {
        &config.name
    };
    let source = format!("xds:{name}");
    let descriptors = match descriptors(&config.descriptors, 0) {
        Some(d) => d,
        None => {
            return Err(vec![PolicyError {
                file: source,
                line: None,
                message: format!("descriptors nest deeper than {MAX_DEPTH} levels"),
            }])
        }
    };
    let doc = json!({"domain": config.domain, "descriptors": descriptors});
    policy::parse_file_json(&source, &doc)
}

fn descriptors(list: &[RateLimitDescriptor], depth: usize) -> Option<Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    list.iter()
        .map(|d| descriptor(d, depth))
        .collect::<Option<Vec<_>>>()
        .map(Value::Array)
}

fn descriptor(d: &RateLimitDescriptor, depth: usize) -> Option<Value> {
    let mut out = Map::new();
    out.insert("key".into(), json!(d.key));
    // An empty value matches any value, as in a file.
    if !d.value.is_empty() {
        out.insert("value".into(), json!(d.value));
    }
    if let Some(rl) = &d.rate_limit {
        out.insert("rate_limit".into(), rate_limit(rl));
    }
    if !d.descriptors.is_empty() {
        out.insert(
            "descriptors".into(),
            descriptors(&d.descriptors, depth + 1)?,
        );
    }
    for (name, set) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if set {
            out.insert(name.into(), json!(true));
        }
    }
    if let Some(m) = &d.metadata {
        out.insert("metadata".into(), from_struct(m));
    }
    Some(Value::Object(out))
}

fn rate_limit(rl: &RateLimitPolicy) -> Value {
    let mut out = Map::new();
    // envoyproxy/ratelimit writes the unit's name; UNKNOWN (no unit) is left out
    // where `unlimited` needs none, and refused by name where a unit is needed.
    let unit = RateLimitUnit::try_from(rl.unit).map_or("UNKNOWN", |u| u.as_str_name());
    if !(rl.unlimited && rl.unit == RateLimitUnit::Unknown as i32) {
        out.insert("unit".into(), json!(unit));
    }
    out.insert("requests_per_unit".into(), json!(rl.requests_per_unit));
    if rl.unlimited {
        out.insert("unlimited".into(), json!(true));
    }
    if !rl.name.is_empty() {
        out.insert("name".into(), json!(rl.name));
    }
    if !rl.replaces.is_empty() {
        let replaces: Vec<Value> = rl
            .replaces
            .iter()
            .map(|r| json!({"name": r.name}))
            .collect();
        out.insert("replaces".into(), Value::Array(replaces));
    }
    Value::Object(out)
}

fn from_struct(s: &Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), from_value(v)))
            .collect(),
    )
}

fn from_value(v: &ProtoValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => from_struct(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(from_value).collect()),
    }
}

#[cfg(test)]
mod tests {
    use crate::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::{compile, Unit};

    fn limit(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..Default::default()
        })
    }

    fn node(
        key: &str,
        value: &str,
        rate_limit: Option<RateLimitPolicy>,
        children: Vec<RateLimitDescriptor>,
    ) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit,
            descriptors: children,
            ..Default::default()
        }
    }

    /// Envoy Gateway's shape: the route, a header match, then the client address.
    fn gateway_config() -> RateLimitConfig {
        let mut address = node(
            "remote_address",
            "",
            limit(RateLimitUnit::Second, 5),
            vec![],
        );
        address.shadow_mode = true;
        RateLimitConfig {
            name: "default/eg/http".into(),
            domain: "default/eg/http".into(),
            descriptors: vec![node(
                "httproute/default/a/rule/0/match/0/*",
                "httproute/default/a/rule/0/match/0/*",
                None,
                vec![
                    node(
                        "rule-0-match-0",
                        "rule-0-match-0",
                        limit(RateLimitUnit::Minute, 10),
                        vec![],
                    ),
                    node("masked_remote_address", "10.0.0.0/8", None, vec![address]),
                ],
            )],
        }
    }

    #[test]
    fn a_gateway_config_means_what_the_same_file_means() {
        let from_xds = document(&gateway_config()).unwrap();
        assert_eq!(from_xds.source, "xds:default/eg/http");
        let file = r#"
domain: default/eg/http
descriptors:
  - key: "httproute/default/a/rule/0/match/0/*"
    value: "httproute/default/a/rule/0/match/0/*"
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {unit: MINUTE, requests_per_unit: 10}
      - key: masked_remote_address
        value: 10.0.0.0/8
        descriptors:
          - key: remote_address
            shadow_mode: true
            rate_limit: {unit: SECOND, requests_per_unit: 5}
"#;
        let from_file = policy::parse_str("f.yaml", file).unwrap().remove(0);
        assert_eq!(from_xds.descriptors, strip_lines(from_file.descriptors));
        let p = compile(vec![from_xds]).unwrap();
        let d = p.domain("default/eg/http").unwrap();
        let route = "httproute/default/a/rule/0/match/0/*";
        let r = d
            .find(&[
                (route, route),
                ("masked_remote_address", "10.0.0.0/8"),
                ("remote_address", "10.1.2.3"),
            ])
            .map(|id| p.rule(id))
            .unwrap();
        assert_eq!(
            (r.requests_per_unit, r.unit, r.shadow_mode),
            (5, Unit::Second, true)
        );
        assert_eq!(r.limit.unwrap().algorithm, Algorithm::SlidingWindowCounter);
    }

    fn strip_lines(mut ds: Vec<policy::DescriptorNode>) -> Vec<policy::DescriptorNode> {
        for d in &mut ds {
            d.line = None;
            if let Some(rl) = d.rate_limit.as_mut() {
                rl.line = None;
            }
            d.descriptors = strip_lines(std::mem::take(&mut d.descriptors));
        }
        ds
    }

    #[test]
    fn unlimited_names_and_replaces_and_metadata_carry_over() {
        let mut tier = Struct::default();
        tier.fields.insert(
            "tier".into(),
            ProtoValue {
                kind: Some(Kind::StringValue("gold".into())),
            },
        );
        let mut gold = node(
            "plan",
            "gold",
            Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: 100,
                name: "gold".into(),
                replaces: vec![RateLimitReplace {
                    name: "base".into(),
                }],
                ..Default::default()
            }),
            vec![],
        );
        gold.metadata = Some(tier);
        let free = node(
            "free",
            "",
            Some(RateLimitPolicy {
                unlimited: true,
                ..Default::default()
            }),
            vec![],
        );
        let config = RateLimitConfig {
            name: String::new(),
            domain: "d".into(),
            descriptors: vec![gold, free],
        };
        let doc = document(&config).unwrap();
        assert_eq!(doc.source, "xds:d");
        let p = compile(vec![doc]).unwrap();
        let gold = p.rule(p.domain("d").unwrap().find(&[("plan", "gold")]).unwrap());
        assert_eq!(gold.name.as_deref(), Some("gold"));
        assert_eq!(gold.replaces, ["base"]);
        assert_eq!(gold.unit, Unit::Hour);
        assert_eq!(gold.metadata, Some(json!({"tier": "gold"})));
        let free = p.rule(p.domain("d").unwrap().find(&[("free", "x")]).unwrap());
        assert!(free.limit.is_none());
    }

    #[test]
    fn bad_configs_are_refused_with_the_files_messages() {
        let dup = RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![node("k", "v", limit(RateLimitUnit::Second, 1), vec![]); 2],
        };
        let e = document(&dup).unwrap_err();
        assert_eq!(
            e[0].to_string(),
            "xds:n: at descriptors[1]: duplicate descriptor key 'k' value 'v' \
             (first defined at descriptors[0])"
        );
        let no_unit = RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![node("k", "", limit(RateLimitUnit::Unknown, 1), vec![])],
        };
        let e = document(&no_unit).unwrap_err();
        assert!(
            e[0].message.contains("invalid rate limit unit 'UNKNOWN'"),
            "{e:?}"
        );
        let no_domain = RateLimitConfig::default();
        assert!(document(&no_domain).unwrap_err()[0]
            .message
            .contains("domain"));
        let mut deep = node("k", "", None, vec![]);
        for _ in 0..(MAX_DEPTH + 2) {
            deep = node("k", "", None, vec![deep]);
        }
        let deep = RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors: vec![deep],
        };
        assert!(document(&deep).unwrap_err()[0]
            .message
            .contains("nest deeper"));
    }
}
