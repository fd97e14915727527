//! The `RateLimitPolicy` custom resource (`sluice.dev/v1alpha1`) and its
//! CustomResourceDefinition, as printed by `sluice crd` and committed in
//! `crds/ratelimitpolicies.yaml` (a test fails if the two differ).
//!
//! The spec types mirror the resource form of a policy (camelCase). The watcher does
//! not deserialize into them: it hands each object's raw `spec` to
//! [`crate::policy::parse_resource_spec`], so one odd object can never break the
//! watch of all the others, and every check lives in one place (the parser).
//!
//! **Why the schema is written by hand.** A descriptor holds `descriptors`, a tree.
//! Kubernetes requires *structural* schemas, which cannot refer to themselves, so a
//! derived recursive schema is refused. The schema below spells the descriptor out
//! [`SCHEMA_DEPTH`] levels deep (with every check: enums for unit, algorithm, layer
//! and failure mode, a pattern for durations, bounds for numbers, and CEL rules for
//! combinations, the latter on the first [`CEL_DEPTH`] levels). Below that depth a descriptor is an object with
//! `x-kubernetes-preserve-unknown-fields: true`: the API server accepts it as is and
//! sluice's parser checks it, marking the policy `Invalid` if it is wrong. Real
//! envoyproxy/ratelimit trees rarely go past three or four levels.

// `printcolumn(...)` repeats `type_ = "string"`, which this lint mistakes for a
// duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Descriptor levels the CRD's schema checks; deeper levels are checked by sluice.
pub const SCHEMA_DEPTH: usize = 8;

/// Descriptor levels whose `rateLimit` carries CEL rules for field combinations.
/// The API server estimates the cost of every rule times the most objects a request
/// could hold and refuses the CRD when the sum passes its budget; rules at all
/// [`SCHEMA_DEPTH`] levels cost 2.3 times that budget. Deeper combinations are
/// checked by sluice (the policy is then `Invalid`).
pub const CEL_DEPTH: usize = 4;

/// The condition type sluice reports.
pub const ACCEPTED: &str = "Accepted";

/// A policy: a domain and its descriptor tree, as in envoyproxy/ratelimit's files.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "RateLimitPolicy",
    plural = "ratelimitpolicies",
    singular = "ratelimitpolicy",
    namespaced,
    shortname = "rlp",
    status = "RateLimitPolicyStatus",
    doc = "Rate limits for one domain, served by sluice to Envoy's rate limit filter.",
    printcolumn(name = "Domain", type_ = "string", json_path = ".spec.domain"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[kube(schema = "derived")]
#[serde(rename_all = "camelCase")]
pub struct RateLimitPolicySpec {
    /// The domain Envoy's rate limit filter names.
    pub domain: String,
    /// `open`, `closed` or `local`: what to answer for this domain when the counter
    /// store cannot be reached (`local`: each replica decides with its share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<String>,
    /// An entry key whose value places all of a descriptor's counters on one shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_by: Option<String>,
    /// The descriptor tree.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptors: Vec<DescriptorSpec>,
}

/// One node of the descriptor tree.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DescriptorSpec {
    pub key: String,
    /// A string or an integer, as the schema allows (`value: 8080`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitSpec>,
    /// Several limits on this descriptor, all of which must admit a request
    /// (instead of `rateLimit`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rate_limits: Vec<RateLimitSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptors: Vec<DescriptorSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow_mode: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detailed_metric: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_threshold: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_mode: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitive: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_to_metric: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// A descriptor's `rateLimit`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_unit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlimited: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<ReplacesSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub penalty: Option<PenaltySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shed: Option<ShedSpec>,
}

/// `shed`: past `from` of the limit, requests are denied with a rising probability.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ShedSpec {
    pub from: f64,
}

/// An entry of `replaces`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ReplacesSpec {
    pub name: String,
}

/// `penalty`: denied `violations` times within `within` -> banned for `ban`, or
/// tightened by `tighten`; with `block`, chronic offenders go on the block list.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct PenaltySpec {
    pub violations: i64,
    pub within: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tighten: Option<TightenSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<BlockSpec>,
}

/// `tighten`: the key's limit multiplied by `factor` for `for`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct TightenSpec {
    pub factor: f64,
    #[serde(rename = "for")]
    pub span: String,
}

/// `block`: penalised `bans` times within `within` -> denied outright for `for`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct BlockSpec {
    pub bans: i64,
    pub within: String,
    #[serde(rename = "for")]
    pub span: String,
}

/// What sluice reports about a policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitPolicyStatus {
    /// The `metadata.generation` the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`: True when the policy serves; False with reason `Invalid` or
    /// `Conflicted` and a message saying what to change. Other controllers may
    /// add conditions of other types; Sluice keeps them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A standard Kubernetes condition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type (`Accepted`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase reason: `Accepted`, `Invalid` or `Conflicted`.
    #[serde(default)]
    pub reason: String,
    /// What happened, for a person.
    #[serde(default)]
    pub message: String,
    /// The `metadata.generation` this condition describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

impl JsonSchema for RateLimitPolicySpec {
    fn schema_name() -> Cow<'static, str> {
        "RateLimitPolicySpec".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        Schema::try_from(spec_schema()).expect("the spec schema is an object")
    }
}

/// The structural OpenAPI schema of `spec` (see the module docs for its depth).
pub fn spec_schema() -> Value {
    json!({
        "description": "A policy in the resource form: envoyproxy/ratelimit's document with camelCase fields.",
        "type": "object",
        "required": ["domain"],
        "properties": {
            "domain": {
                "description": "The domain Envoy's rate limit filter names.",
                "type": "string",
                "minLength": 1
            },
            "failureMode": {
                "description": "What to answer for this domain when the counter store cannot be reached: open, closed, or local (each replica decides with its share of the limit).",
                "type": "string",
                "enum": ["open", "closed", "local"]
            },
            "shardBy": {
                "description": "An entry key (e.g. tenant) whose value places all counters of a descriptor carrying it on one shard.",
                "type": "string",
                "minLength": 1
            },
            "descriptors": descriptors_schema(1)
        },
        // The oldest policy naming a domain decides which namespace owns it: were
        // an old policy free to name another domain, its namespace would take that
        // domain, and the other namespace's policies would stop serving.
        "x-kubernetes-validations": [{
            "rule": "self.domain == oldSelf.domain",
            "message": "spec.domain cannot change: the oldest policy naming a domain decides which namespace owns it; create a new policy for the other domain (and delete this one)"
        }]
    })
}

fn descriptors_schema(depth: usize) -> Value {
    if depth > SCHEMA_DEPTH {
        return json!({
            "description": format!(
                "Descriptors nested deeper than {SCHEMA_DEPTH} levels: not checked by the API server, checked by sluice."
            ),
            "type": "array",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        });
    }
    json!({
        "description": "Descriptors: matched against the entries of a request's descriptor, level by level.",
        "type": "array",
        "items": {
            "type": "object",
            "required": ["key"],
            "properties": {
                "key": {"description": "The entry key to match.", "type": "string", "minLength": 1},
                "value": {
                    "description": "The entry value to match, a string or an integer (value: 8080 matches the entry value \"8080\"); '*' is a wildcard. Absent: any value.",
                    "x-kubernetes-int-or-string": true
                },
                "layer": {
                    "description": "edge, service (default) or tenant; inherited by nested descriptors.",
                    "type": "string",
                    "enum": ["edge", "service", "tenant"]
                },
                "rateLimit": rate_limit_schema(depth),
                "rateLimits": rate_limits_schema(),
                "descriptors": descriptors_schema(depth + 1),
                "shadowMode": {"description": "Count and report, never deny.", "type": "boolean"},
                "detailedMetric": {"description": "Metrics carry the full descriptor value.", "type": "boolean"},
                "shareThreshold": {"description": "With a wildcard value: one counter shared by every matching value.", "type": "boolean"},
                "quotaMode": {"description": "Deny only when every quota-mode descriptor is over its limit.", "type": "boolean"},
                "valueToMetric": {"description": "Use the descriptor value in the metric name.", "type": "boolean"},
                "sensitive": {"description": "A login or password-reset path: its denials get a spike gauge against their own 30-minute baseline.", "type": "boolean"},
                "metadata": {
                    "description": "Returned in the response's dynamic metadata when this descriptor matches.",
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true
                }
            }
        }
    })
}

fn duration_schema(what: &str) -> Value {
    json!({
        "description": format!("{what}: a duration such as 250ms, 10s, 5m, 1h or 1m30s."),
        "type": "string",
        "pattern": "^(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(us|µs|ms|s|m|h|d))+$"
    })
}

/// `rateLimits`: a list of `rateLimit`s. Its items carry no CEL rules (a list
/// multiplies their estimated cost); sluice's parser checks their combinations, and
/// that no two share a window, marking the policy `Invalid` otherwise.
fn rate_limits_schema() -> Value {
    let mut item = rate_limit_schema(CEL_DEPTH + 1);
    item["description"] =
        json!("One of the limits: requestsPerUnit and one of unit or window (no unlimited, replaces, penalty or shed).");
    json!({
        "description": "Several limits on this descriptor instead of rateLimit (such as 10 per second and 10000 per day): a request passes only when every one admits it, and the answer describes the one nearest its limit. Windows must differ.",
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_RATE_LIMITS,
        "items": item
    })
}

/// The most limits a `rateLimits` list holds (the parser's bound too).
const MAX_RATE_LIMITS: usize = crate::policy::MAX_RATE_LIMITS;

/// The longest `window` (the parser's bound for the resource form too).
const MAX_WINDOW_CHARS: usize = crate::policy::MAX_WINDOW_CHARS;

fn rate_limit_schema(depth: usize) -> Value {
    const UNITS: [&str; 14] = [
        "second", "minute", "hour", "day", "week", "month", "year", "SECOND", "MINUTE", "HOUR",
        "DAY", "WEEK", "MONTH", "YEAR",
    ];
    let mut schema = json!({
        "description": "The limit at this node. Needs requestsPerUnit and one of unit or window (lease with algorithm: concurrency), or unlimited: true alone.",
        "type": "object",
        "properties": {
            "unit": {"description": "The window: one unit.", "type": "string", "enum": UNITS},
            "requestsPerUnit": {
                "description": "Requests allowed per unit (or window).",
                "type": "integer",
                "format": "int64",
                "minimum": 0,
                "maximum": 4_294_967_295u64
            },
            "unlimited": {"description": "No limit: matches, and stops less specific limits.", "type": "boolean"},
            "name": {"description": "A name other limits can replace.", "type": "string"},
            "replaces": {
                "description": "Limits (by name) this one replaces when both match.",
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string", "minLength": 1}}
                }
            },
            "algorithm": {
                "description": "How requests are counted (default sliding_window_counter); concurrency counts the requests in flight, with lease.",
                "type": "string",
                "enum": ["fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "leaky_bucket", "concurrency"]
            },
            "window": {
                "description": "The window, instead of unit: a duration such as 250ms, 10s, 5m, 1h or 1m30s, or calendar_day / calendar_month (local days or months in timeZone, counted by fixed_window).",
                "type": "string",
                "maxLength": MAX_WINDOW_CHARS,
                "pattern": "^((([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(us|µs|ms|s|m|h|d))+|calendar_day|calendar_month)$"
            },
            "timeZone": {
                "description": "The IANA time zone of a calendar window (Europe/Berlin); UTC when not given.",
                "type": "string",
                "minLength": 1,
                "maxLength": 64
            },
            "lease": duration_schema("With algorithm: concurrency, instead of unit or window, how long a slot is held at most when its refund never comes (longer than the longest stream)"),
            "burst": {
                "description": "token_bucket: capacity; leaky_bucket: queue length (default requestsPerUnit). The bucket must fill from empty within 2^50 µs (about 35 years): burst × window / requestsPerUnit at most that.",
                "type": "integer",
                "format": "int64",
                "minimum": 1,
                "maximum": crate::policy::MAX_BURST
            },
            "penalty": {
                "description": "A key denied `violations` times within `within` is banned (denied outright) for `ban`, or has its limit tightened by `tighten`; with `block`, a key penalised `bans` times within its span goes on the block list.",
                "type": "object",
                "required": ["violations", "within"],
                "properties": {
                    "violations": {"type": "integer", "format": "int64", "minimum": 1},
                    "within": duration_schema("The span over which denials count"),
                    "ban": duration_schema("How long the key is denied"),
                    "tighten": {
                        "description": "Instead of a ban: the key's limit multiplied by `factor` for `for`.",
                        "type": "object",
                        "required": ["factor", "for"],
                        "properties": {
                            "factor": {"type": "number", "exclusiveMinimum": true, "minimum": 0, "exclusiveMaximum": true, "maximum": 1},
                            "for": duration_schema("How long the tighter limit holds")
                        }
                    },
                    "block": {
                        "description": "A key penalised `bans` times within `within` is put on the block list and denied outright for `for`.",
                        "type": "object",
                        "required": ["bans", "within", "for"],
                        "properties": {
                            "bans": {"type": "integer", "format": "int64", "minimum": 1},
                            "within": duration_schema("The span over which penalties count"),
                            "for": duration_schema("How long the key stays blocked")
                        }
                    }
                }
            },
            "shed": {
                "description": "Soft shedding: past `from` of the limit, requests are denied with a probability rising linearly to 1 at the limit.",
                "type": "object",
                "required": ["from"],
                "properties": {
                    "from": {"type": "number", "exclusiveMinimum": true, "minimum": 0, "exclusiveMaximum": true, "maximum": 1}
                }
            }
        },
    });
    if depth <= CEL_DEPTH {
        schema["x-kubernetes-validations"] = json!([
            {
                "rule": "!has(self.unlimited) || !self.unlimited || (!has(self.unit) && !has(self.window))",
                "message": "unit and window cannot be set when unlimited is true"
            },
            {
                "rule": "(has(self.unlimited) && self.unlimited) || has(self.requestsPerUnit)",
                "message": "requestsPerUnit is required unless unlimited is true"
            },
            {
                "rule": "(has(self.unlimited) && self.unlimited) || has(self.lease) || has(self.unit) != has(self.window)",
                "message": "set exactly one of unit or window (or lease with algorithm: concurrency, or unlimited: true)"
            }
            // No CEL rules for calendar windows (timeZone without one, another
            // algorithm): the schema's whole CEL budget is nearly spent across the
            // nesting levels, so sluice's parser checks them and marks the policy
            // Invalid, as it does for the items of rateLimits.
        ]);
    }
    schema
}

/// The CustomResourceDefinition as YAML, exactly as committed in
/// `crds/ratelimitpolicies.yaml`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(RateLimitPolicy::crd()).expect("the CRD serializes");
    let mut body = String::new();
    yaml_rust2::YamlEmitter::new(&mut body)
        .dump(&to_yaml(&crd))
        .expect("writing to a String cannot fail");
    format!("# Generated by `sluice crd` from src/crd.rs; do not edit by hand.\n{body}\n")
}

/// A JSON value as the YAML emitter's document (the policy parser's YAML crate,
/// rather than a second YAML library for this one document).
fn to_yaml(value: &Value) -> yaml_rust2::Yaml {
    use yaml_rust2::Yaml;
    match value {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Yaml::Integer(i),
            None => Yaml::Real(n.to_string()),
        },
        Value::String(s) => Yaml::String(s.clone()),
        Value::Array(items) => Yaml::Array(items.iter().map(to_yaml).collect()),
        Value::Object(map) => Yaml::Hash(
            map.iter()
                .map(|(k, v)| (Yaml::String(k.clone()), to_yaml(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crd_matches_the_types() {
        let committed = include_str!("../crds/ratelimitpolicies.yaml");
        assert!(
            committed == crd_yaml(),
            "crds/ratelimitpolicies.yaml is out of date: run `cargo run -q -- crd > crds/ratelimitpolicies.yaml`"
        );
    }

    /// The YAML `sluice crd` prints reads back as the CRD itself, value for value:
    /// strings that look like numbers, booleans or YAML syntax stay strings.
    #[test]
    fn crd_yaml_reads_back_as_the_crd() {
        use kube::CustomResourceExt;
        fn to_json(y: &yaml_rust2::Yaml) -> Value {
            use yaml_rust2::Yaml;
            match y {
                Yaml::Null => Value::Null,
                Yaml::Boolean(b) => json!(b),
                Yaml::Integer(i) => json!(i),
                Yaml::Real(r) => json!(r.parse::<f64>().unwrap()),
                Yaml::String(s) => json!(s),
                Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
                Yaml::Hash(h) => Value::Object(
                    h.iter()
                        .map(|(k, v)| (k.as_str().unwrap().to_string(), to_json(v)))
                        .collect(),
                ),
                other => panic!("unexpected YAML node {other:?}"),
            }
        }
        let docs = yaml_rust2::YamlLoader::load_from_str(&crd_yaml()).unwrap();
        assert_eq!(docs.len(), 1);
        let expected = serde_json::to_value(RateLimitPolicy::crd()).unwrap();
        assert_eq!(to_json(&docs[0]), expected);
        // The schema's duration pattern holds `\`, `|` and `µ`, which must survive.
        assert!(crd_yaml().contains("us|µs|ms"));
    }

    #[test]
    fn schema_nests_to_the_fixed_depth_then_preserves_unknown_fields() {
        let schema = spec_schema();
        let mut level = &schema["properties"]["descriptors"];
        for _ in 0..SCHEMA_DEPTH {
            assert_eq!(level["items"]["required"], json!(["key"]));
            level = &level["items"]["properties"]["descriptors"];
        }
        assert_eq!(
            level["items"]["x-kubernetes-preserve-unknown-fields"],
            json!(true)
        );
    }

    #[test]
    fn typed_spec_round_trips_through_the_parser() {
        let spec = RateLimitPolicySpec {
            domain: "edge".into(),
            descriptors: vec![DescriptorSpec {
                key: "tenant".into(),
                rate_limit: Some(RateLimitSpec {
                    unit: Some("minute".into()),
                    requests_per_unit: Some(10),
                    ..Default::default()
                }),
                descriptors: vec![DescriptorSpec {
                    key: "port".into(),
                    value: Some(IntOrString::Int(8080)),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json["descriptors"][0]["descriptors"][0]["value"],
            json!(8080)
        );
        let doc = crate::policy::parse_resource_spec("ns", "p", &json).unwrap();
        assert_eq!(doc.domain, "edge");
        assert_eq!(doc.descriptors[0].key, "tenant");
        let port = &doc.descriptors[0].descriptors[0];
        assert_eq!(port.value.as_deref(), Some("8080"));
    }

    /// Kubernetes takes structural schemas only: every field names its type, except
    /// an int-or-string one, which must name none.
    #[test]
    fn schema_is_structural_with_int_or_string_values() {
        fn walk(schema: &Value, at: &str) {
            let int_or_string = schema["x-kubernetes-int-or-string"] == json!(true);
            if int_or_string {
                assert!(
                    schema.get("type").is_none(),
                    "{at}: int-or-string with a type"
                );
            } else {
                assert!(schema["type"].is_string(), "{at}: no type");
            }
            if let Some(props) = schema["properties"].as_object() {
                for (name, prop) in props {
                    walk(prop, &format!("{at}.{name}"));
                }
            }
            if schema.get("items").is_some() {
                walk(&schema["items"], &format!("{at}[]"));
            }
        }
        let schema = spec_schema();
        walk(&schema, "spec");
        let mut level = &schema["properties"]["descriptors"];
        for _ in 0..SCHEMA_DEPTH {
            let value = &level["items"]["properties"]["value"];
            assert_eq!(value["x-kubernetes-int-or-string"], json!(true));
            assert_eq!(level["items"]["properties"]["key"]["type"], json!("string"));
            level = &level["items"]["properties"]["descriptors"];
        }
    }
}
