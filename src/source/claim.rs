//! What an invalid `RateLimitPolicy` still claims: the descriptor paths (and the
//! domain settings) its spec names, read leniently from the raw spec. The hub keeps
//! them from newer policies, so an invalid edit to an older policy never hands its
//! paths to another one, and every replica reaches the same verdicts whether or not
//! it saw the policy's last good version.

use serde_json::Value;

use crate::policy::{DescriptorNode, Document, DocumentKind, FailureMode};

/// The paths and settings `spec` names, as a document without limits; `None` when
/// it names no domain.
pub fn claimed(namespace: &str, name: &str, spec: &Value) -> Option<Document> {
    let domain = spec.get("domain")?.as_str()?.to_string();
    let failure_mode = spec
        .get("failureMode")
        .and_then(Value::as_str)
        .and_then(FailureMode::parse);
    Some(Document {
        source: format!("{namespace}/{name}"),
        line: None,
        kind: DocumentKind::Resource {
            namespace: Some(namespace.to_string()),
            name: name.to_string(),
        },
        domain,
        failure_mode,
        shard_by: spec
            .get("shardBy")
            .and_then(Value::as_str)
            .map(String::from),
        descriptors: nodes(spec.get("descriptors")),
    })
}

/// Every descriptor with a readable key and value, each path once.
fn nodes(list: Option<&Value>) -> Vec<DescriptorNode> {
    let mut out: Vec<DescriptorNode> = Vec::new();
    for item in list.and_then(Value::as_array).into_iter().flatten() {
        let Some(key) = item.get("key").and_then(Value::as_str) else {
            continue;
        };
        let value = match item.get("value") {
            None | Some(Value::Null) => None,
            Some(Value::String(v)) => Some(v.clone()),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            Some(_) => continue,
        };
        if key.is_empty() || out.iter().any(|n| n.key == key && n.value == value) {
            continue;
        }
        out.push(DescriptorNode {
            key: key.to_string(),
            value,
            descriptors: nodes(item.get("descriptors")),
            ..DescriptorNode::default()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_read_past_what_makes_the_spec_invalid() {
        let spec = serde_json::json!({
            "domain": "d",
            "failureMode": "closed",
            "descriptors": [
                {"key": "user", "rateLimit": {"unit": "fortnight"}},
                {"key": "user", "rateLimit": {"unit": "second"}},
                {"key": "port", "value": 8080, "descriptors": [{"key": "path", "value": "/a"}]},
                {"key": 7},
                {"key": "odd", "value": {"not": "a value"}},
            ]
        });
        let doc = claimed("ns", "a", &spec).unwrap();
        assert_eq!(doc.domain, "d");
        assert_eq!(doc.failure_mode, Some(FailureMode::Closed));
        let paths: Vec<(&str, Option<&str>)> = doc
            .descriptors
            .iter()
            .map(|n| (n.key.as_str(), n.value.as_deref()))
            .collect();
        assert_eq!(paths, [("user", None), ("port", Some("8080"))]);
        assert_eq!(doc.descriptors[1].descriptors[0].key, "path");
        assert!(doc.descriptors[0].rate_limit.is_none());
        assert!(claimed("ns", "a", &serde_json::json!({"descriptors": []})).is_none());
    }
}
