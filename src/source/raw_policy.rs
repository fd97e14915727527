//! A `RateLimitPolicy` as the watch reads it: its metadata, and its `spec` and
//! `status` as raw JSON text.
//!
//! kube's client reads a whole list of objects in one go, and serde_json refuses
//! to build a value nested deeper than 128 levels. Read as values
//! (`DynamicObject`), one deeply nested spec (`descriptors`, or `metadata` under
//! them, which the schema leaves open) failed the list of every object, so no
//! policy of the cluster was served. Skipped over as text, which has no such
//! limit, a spec fails only its own parse, and only that policy is `Invalid`.

use std::borrow::Cow;

use kube::api::ApiResource;
use kube::core::{DynamicResourceScope, ObjectMeta};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
pub struct RawPolicy {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<Box<RawValue>>,
    #[serde(default)]
    pub status: Option<Box<RawValue>>,
}

impl kube::Resource for RawPolicy {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The fields of a spec read without building it, so they are known even of a
/// spec too deep to read whole: what an unreadable policy still claims.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Shallow {
    domain: Option<String>,
    failure_mode: Option<String>,
    shard_by: Option<String>,
}

impl RawPolicy {
    /// The spec as a value (`Null` when absent), or why it cannot be read, with
    /// its top-level fields (`domain`, `failureMode`, `shardBy`) as far as known.
    pub fn spec(&self) -> Result<Value, (String, Value)> {
        let Some(raw) = &self.spec else {
            return Ok(Value::Null);
        };
        serde_json::from_str(raw.get()).map_err(|e| {
            let shallow = serde_json::from_str::<Shallow>(raw.get()).ok();
            let mut known = serde_json::Map::new();
            if let Some(s) = shallow {
                for (field, value) in [
                    ("domain", s.domain),
                    ("failureMode", s.failure_mode),
                    ("shardBy", s.shard_by),
                ] {
                    if let Some(v) = value {
                        known.insert(field.to_string(), Value::String(v));
                    }
                }
            }
            (
                format!(
                    "spec cannot be read: {e} (descriptors nest at most 32 levels, and \
                     the JSON of a spec at most 128)"
                ),
                Value::Object(known),
            )
        })
    }

    /// The status's conditions as last written, each as the API server holds it
    /// (another controller's may carry fields Sluice does not know).
    pub fn conditions(&self) -> Vec<Value> {
        let Some(status) = &self.status else {
            return Vec::new();
        };
        match serde_json::from_str::<Value>(status.get()) {
            Ok(Value::Object(mut status)) => match status.remove("conditions") {
                Some(Value::Array(conditions)) => conditions,
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list as the API server sends it: one item nested past serde_json's limit
    /// for values.
    fn list(depth: usize) -> String {
        let mut deep = String::from("{\"key\":\"leaf\"}");
        for i in 0..depth {
            deep = format!("{{\"key\":\"k{i}\",\"descriptors\":[{deep}]}}");
        }
        let item = |name: &str, spec: &str| {
            format!(
                "{{\"apiVersion\":\"sluice.dev/v1alpha1\",\"kind\":\"RateLimitPolicy\",\
                 \"metadata\":{{\"name\":\"{name}\",\"namespace\":\"ns\"}},\"spec\":{spec}}}"
            )
        };
        let good = item(
            "good",
            "{\"domain\":\"ok\",\"descriptors\":[{\"key\":\"user\",\"rateLimit\":{\"unit\":\"minute\",\"requestsPerUnit\":5}}]}",
        );
        let bad = item(
            "deep",
            &format!("{{\"domain\":\"deep\",\"failureMode\":\"closed\",\"descriptors\":[{deep}]}}"),
        );
        format!(
            "{{\"apiVersion\":\"sluice.dev/v1alpha1\",\"kind\":\"RateLimitPolicyList\",\
             \"metadata\":{{\"resourceVersion\":\"7\"}},\"items\":[{bad},{good}]}}"
        )
    }

    #[test]
    fn a_spec_too_deep_to_read_fails_alone_not_the_list() {
        let text = list(100);
        // As the objects were read before: the whole list fails.
        let as_values =
            serde_json::from_str::<kube::core::ObjectList<kube::api::DynamicObject>>(&text);
        assert!(as_values.is_err(), "the list no longer fails as values");
        let list: kube::core::ObjectList<RawPolicy> =
            serde_json::from_str(&text).expect("the list reads");
        assert_eq!(list.items.len(), 2);
        let (why, known) = list.items[0].spec().expect_err("too deep");
        assert!(why.contains("recursion limit"), "{why}");
        assert_eq!(known["domain"], "deep");
        assert_eq!(known["failureMode"], "closed");
        let good = list.items[1].spec().expect("reads");
        assert_eq!(good["domain"], "ok");
        assert!(crate::policy::parse_resource_spec("ns", "good", &good).is_ok());
    }
}
