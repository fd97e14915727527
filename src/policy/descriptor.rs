//! Converting descriptor trees into the model: each descriptor's key, value, layer
//! and flags, with envoyproxy/ratelimit's checks and Sluice's own. A descriptor's
//! limits are read in `rate_limit.rs`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::fields::{
    at_line, boolean, flag, list, not_a_string, string, text, Ctx, Field, Fields, Form,
};
use super::model::DescriptorNode;
use super::node::{shorten, Value};
use super::rate_limit::{rate_limit, rate_limits};
use super::{Layer, MAX_ENTRIES};

/// Reads a `descriptors` list whose items inherit `layer`. Invalid items are left
/// out after their errors are recorded.
pub(crate) fn descriptors(ctx: &mut Ctx, field: Field<'_>, layer: Layer) -> Vec<DescriptorNode> {
    let Some(items) = list(ctx, field) else {
        return Vec::new();
    };
    // Refused here, not only where the tree is built, so the policy is invalid
    // (its last good version serves) rather than at odds with others.
    if ctx.path.len() >= MAX_ENTRIES && !items.is_empty() {
        ctx.error(
            field.key_line.or(field.line()),
            format!(
                "'descriptors' nested {} deep; a request's descriptor carries at most \
                 {MAX_ENTRIES} entries, so none could reach them",
                ctx.path.len() + 1
            ),
        );
        return Vec::new();
    }
    let mut out: Vec<DescriptorNode> = Vec::with_capacity(items.len());
    // Where each key/value was first defined at this level: line and index.
    let mut seen: HashMap<(String, Option<String>), (Option<usize>, usize)> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        ctx.path.push((i, None));
        let d = descriptor(ctx, item, layer);
        ctx.path.pop();
        let Some(d) = d else {
            continue;
        };
        match seen.entry((d.key.clone(), d.value.clone())) {
            Entry::Occupied(first) => {
                let (first_line, first_index) = *first.get();
                // Without lines (a Kubernetes object), both are named by position.
                let first_at = match (d.line, first_line) {
                    (None, None) => {
                        ctx.path.push((first_index, None));
                        let at = format!(" (first defined at {})", ctx.location());
                        ctx.path.pop();
                        at
                    }
                    _ => at_line(first_line, "first defined at"),
                };
                ctx.path.push((i, None));
                ctx.error(
                    d.line,
                    format!(
                        "duplicate descriptor {}{first_at}",
                        describe_path(&d.key, d.value.as_deref()),
                    ),
                );
                ctx.path.pop();
            }
            Entry::Vacant(slot) => {
                slot.insert((d.line, i));
                out.push(d);
            }
        }
    }
    out
}

/// `key 'k' value 'v'` or `key 'k' with no value`, for messages.
pub(crate) fn describe_path(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("key '{}' value '{}'", shorten(key), shorten(v)),
        None => format!("key '{}' with no value", shorten(key)),
    }
}

fn descriptor(ctx: &mut Ctx, node: &super::node::Node, parent: Layer) -> Option<DescriptorNode> {
    let mut f = Fields::open(ctx, node, "descriptor")?;
    let key_field = f.get(ctx, "key");
    // A key that is there but no string has had its error (`string` says why).
    let key_refused = key_field.is_some();
    let key = key_field.and_then(|k| string(ctx, k));
    let value = f
        .get(ctx, "value")
        .and_then(|v| value(ctx, v))
        .filter(|v| !v.is_empty());
    if let (Some(k), Some(here)) = (&key, ctx.path.last_mut()) {
        here.1 = Some(describe_path(k, value.as_deref()));
    }
    let layer = match f.get(ctx, "layer") {
        Some(field) => text(ctx, field).and_then(|s| {
            let layer = parse_layer(&s);
            if layer.is_none() {
                ctx.error(
                    field.line(),
                    format!(
                        "unknown layer '{}' (expected edge, service or tenant)",
                        shorten(&s)
                    ),
                );
            }
            layer
        }),
        None => None,
    }
    .unwrap_or(parent);
    let single = f.get(ctx, "rate_limit");
    let several = f.get(ctx, "rate_limits");
    let (rate_limit, also) = match (single, several) {
        (Some(_), Some(list)) => {
            ctx.error(
                list.key_line,
                format!(
                    "a descriptor takes either '{}' or '{}', not both",
                    ctx.form.spell("rate_limit"),
                    list.name
                ),
            );
            (None, Vec::new())
        }
        (Some(one), None) => (rate_limit(ctx, one), Vec::new()),
        (None, Some(list)) => {
            let mut limits = rate_limits(ctx, list).into_iter();
            (limits.next(), limits.collect())
        }
        (None, None) => (None, Vec::new()),
    };
    let children = match f.get(ctx, "descriptors") {
        Some(field) => descriptors(ctx, field, layer),
        None => Vec::new(),
    };
    let shadow_mode = flag(ctx, &mut f, "shadow_mode");
    let detailed_metric = flag(ctx, &mut f, "detailed_metric");
    let share_field = f.get(ctx, "share_threshold");
    let share_threshold = share_field.and_then(|s| boolean(ctx, s)).unwrap_or(false);
    let quota_mode = flag(ctx, &mut f, "quota_mode");
    let value_to_metric = flag(ctx, &mut f, "value_to_metric");
    let sensitive = flag(ctx, &mut f, "sensitive");
    let metadata = match f.get(ctx, "metadata") {
        Some(field) if matches!(field.node.value, Value::Map(_)) => match field.node.to_json() {
            Ok(json) => Some(json),
            Err((line, message)) => {
                ctx.error(line, format!("in '{}': {message}", field.name));
                None
            }
        },
        Some(field) => {
            ctx.error(
                field.line(),
                format!(
                    "'{}' must be a mapping, found {}",
                    field.name,
                    field.node.describe()
                ),
            );
            None
        }
        None => None,
    };
    let line = f.line;
    f.finish(ctx, "descriptor");
    let key = match key {
        Some(k) if !k.is_empty() => k,
        None if key_refused => return None,
        _ => {
            ctx.error(line, "descriptor has an empty or missing 'key'");
            return None;
        }
    };
    // envoyproxy/ratelimit refuses this too: without a '*' there is nothing to share,
    // and loading it would leave the author believing values share one counter.
    let wildcard = key.contains('*') || value.as_deref().is_some_and(|v| v.contains('*'));
    if share_threshold && !wildcard {
        let name = ctx.form.spell("share_threshold");
        ctx.error(
            share_field.and_then(|s| s.line()).or(line),
            format!(
                "'{name}' shares one counter among the values a wildcard matches, \
                 but {} has no '*'",
                describe_path(&key, value.as_deref())
            ),
        );
    }
    Some(DescriptorNode {
        line,
        key,
        value,
        rate_limit,
        also,
        descriptors: children,
        shadow_mode,
        detailed_metric,
        share_threshold,
        quota_mode,
        value_to_metric,
        sensitive,
        metadata,
        layer,
    })
}

/// A descriptor's `value`. The CRD's schema takes a string or an integer
/// (`x-kubernetes-int-or-string`: `value: 8080` is natural for a port or a status
/// code), and the API server keeps an integer as the number kubectl read, served as
/// its decimal digits. So the resource form takes an integer written as those
/// digits, and nothing else that is not a string.
fn value(ctx: &mut Ctx, field: Field<'_>) -> Option<String> {
    if ctx.form == Form::Resource {
        if let Value::Int(i, written) = &field.node.value {
            if i64::try_from(*i).is_ok_and(|i| i.to_string() == *written) {
                return Some(written.clone());
            }
            ctx.error(
                field.line(),
                format!(
                    "'{}': {written} is read as an integer by kubectl and would be served as other digits or refused; quote it: \"{written}\"",
                    field.name
                ),
            );
            return None;
        }
        if let Some(message) = not_a_string(field, "a string or an integer") {
            ctx.error(field.line(), message);
            return None;
        }
    }
    text(ctx, field)
}

fn parse_layer(s: &str) -> Option<Layer> {
    match s {
        "edge" => Some(Layer::Edge),
        "service" => Some(Layer::Service),
        "tenant" => Some(Layer::Tenant),
        _ => None,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use crate::policy::{parse_resource_spec, parse_str, Unit};

    /// The errors of a RateLimitPolicy whose one descriptor (line 7) is `descriptor`.
    fn resource_errors(descriptor: &str) -> String {
        errors(&format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: p}}\nspec:\n  domain: d\n  descriptors:\n    - {descriptor}\n"
        ))
    }

    /// A RateLimitPolicy refuses what the CRD's schema refuses, so `sluice validate`
    /// predicts `kubectl apply`: booleans and numbers where the schema wants a string
    /// (kubectl's YAML reader types plain scalars), unit spellings outside the
    /// schema's enum, durations with spaces around them, windows past its maxLength,
    /// counts past int64.
    #[test]
    fn resource_form_refuses_what_the_crd_schema_refuses() {
        for (descriptor, message) in [
            (
                "{key: on}",
                "p.yaml:7: 'key': on is read as a boolean by kubectl; quote it: \"on\"",
            ),
            (
                "{key: n}",
                "p.yaml:7: 'key': n is read as a boolean by kubectl; quote it: \"n\"",
            ),
            (
                "{key: 42}",
                "p.yaml:7: 'key': 42 is read as an integer by kubectl; quote it: \"42\"",
            ),
            (
                "{key: k, value: true}",
                "p.yaml:7: 'value': true is read as a boolean by kubectl; quote it: \"true\"",
            ),
            (
                "{key: k, value: 1.5}",
                "p.yaml:7: 'value': 1.5 is read as a number by kubectl; quote it: \"1.5\"",
            ),
            (
                "{key: k, value: 0x1F}",
                "p.yaml:7: 'value': 0x1F is read as an integer by kubectl and would be served as other digits or refused; quote it: \"0x1F\"",
            ),
            (
                "{key: k, value: 010}",
                "p.yaml:7: 'value': 010 is read as an integer by kubectl",
            ),
            (
                "{key: k, rateLimit: {unit: Minute, requestsPerUnit: 5}}",
                "p.yaml:7: rate limit unit 'Minute' must be all lowercase or all uppercase in a RateLimitPolicy (minute or MINUTE), as its schema lists them",
            ),
            (
                "{key: k, rateLimit: {window: ' 10s', requestsPerUnit: 5}}",
                "p.yaml:7: 'window': ' 10s' has spaces around it, which a RateLimitPolicy's schema refuses; write '10s'",
            ),
            (
                "{key: k, rateLimit: {window: 'calendar_day ', requestsPerUnit: 5}}",
                "p.yaml:7: 'window': 'calendar_day ' has spaces around it",
            ),
            (
                "{key: k, rateLimit: {window: 1s1s1s1s1s1s1s1s1s1s1s1s1s1s1s1s1s, requestsPerUnit: 5}}",
                "p.yaml:7: 'window' is 34 characters long; a RateLimitPolicy's schema allows at most 32",
            ),
            (
                "{key: k, rateLimit: {algorithm: concurrency, lease: '5m ', requestsPerUnit: 5}}",
                "p.yaml:7: 'lease': '5m ' has spaces around it",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 5, penalty: {violations: 3, within: ' 1m', ban: 1m}}}",
                "p.yaml:7: 'within': ' 1m' has spaces around it",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 5, algorithm: token_bucket, burst: 9223372036854775808}}",
                "p.yaml:7: 'burst' must be at most 1125899906842624, found 9223372036854775808",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 010}}",
                "p.yaml:7: 'requestsPerUnit': 010 has a leading zero, which kubectl reads as an octal number; write it without",
            ),
            (
                "{key: 1_000}",
                "p.yaml:7: 'key': 1_000 is read as an integer by kubectl; quote it: \"1_000\"",
            ),
            (
                "{key: k, value: 1_000}",
                "p.yaml:7: 'value': 1_000 is read as an integer by kubectl and would be served as other digits",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 5, name: 7}}",
                "p.yaml:7: 'name': 7 is read as an integer by kubectl; quote it: \"7\"",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 5, replaces: [{name: yes}]}}",
                "p.yaml:7: 'name': yes is read as a boolean by kubectl; quote it: \"yes\"",
            ),
            (
                "{key: k, rateLimit: {window: calendar_day, timeZone: 1, requestsPerUnit: 5}}",
                "p.yaml:7: 'timeZone': 1 is read as an integer by kubectl; quote it: \"1\"",
            ),
        ] {
            let e = resource_errors(descriptor);
            assert!(e.starts_with(message), "{descriptor}:\n  {message}\nnot in\n  {e}");
        }
        // The key's one error says why; no second one calls it missing.
        assert_eq!(
            resource_errors("{key: on}"),
            "p.yaml:7: 'key': on is read as a boolean by kubectl; quote it: \"on\""
        );
        let e = errors(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: p}\nspec:\n  domain: 42\n",
        );
        assert!(
            e.starts_with("p.yaml:5: 'domain': 42 is read as an integer by kubectl; quote it"),
            "{e}"
        );
        let e = errors(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: p, namespace: off}\nspec: {domain: d}\n",
        );
        assert!(e.contains("'namespace': off is read as a boolean"), "{e}");
    }

    /// What the schema takes, the resource form takes: a value written as an
    /// integer (served as its digits), quoted text, a unit in lowercase or
    /// uppercase, a window of exactly the schema's maxLength.
    #[test]
    fn resource_form_takes_what_the_crd_schema_takes() {
        let doc = |descriptor: &str| {
            let text = format!(
                "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: p}}\nspec:\n  domain: d\n  descriptors:\n    - {descriptor}\n"
            );
            let mut docs =
                parse_str("p.yaml", &text).unwrap_or_else(|e| panic!("{descriptor}: {e:?}"));
            docs.remove(0).descriptors.remove(0)
        };
        assert_eq!(
            doc("{key: port, value: 8080}").value.as_deref(),
            Some("8080")
        );
        assert_eq!(doc("{key: code, value: -1}").value.as_deref(), Some("-1"));
        assert_eq!(doc("{key: 'on', value: 'true'}").key, "on");
        assert_eq!(
            doc("{key: k, value: '0x1F'}").value.as_deref(),
            Some("0x1F")
        );
        let d = doc("{key: k, rateLimit: {unit: second, requestsPerUnit: 1_000}}");
        assert_eq!(d.rate_limit.unwrap().requests_per_unit, 1000);
        for unit in ["minute", "MINUTE"] {
            let d = doc(&format!(
                "{{key: k, rateLimit: {{unit: {unit}, requestsPerUnit: 5}}}}"
            ));
            assert_eq!(d.rate_limit.unwrap().unit, Some(Unit::Minute));
        }
        let d = doc(&format!(
            "{{key: k, rateLimit: {{window: {}, requestsPerUnit: 5}}}}",
            "1s".repeat(16)
        ));
        assert_eq!(
            d.rate_limit.unwrap().window,
            Some(16 * crate::algorithm::SECOND)
        );
        // From the API server (JSON): an integer value is the integer's digits; a
        // boolean where a string belongs is named as such (below the schema's depth
        // the API server checks nothing, so sluice does).
        let spec =
            serde_json::json!({"domain": "d", "descriptors": [{"key": "port", "value": 8080}]});
        let parsed = parse_resource_spec("ns", "p", &spec).unwrap();
        assert_eq!(parsed.descriptors[0].value.as_deref(), Some("8080"));
        let spec = serde_json::json!({"domain": "d", "descriptors": [{"key": true, "value": 1.5}]});
        let e = parse_resource_spec("ns", "p", &spec).unwrap_err();
        let e: Vec<_> = e.iter().map(|e| e.message.as_str()).collect();
        assert!(
            e.contains(&"at descriptors[0]: 'key' must be a string, found the boolean true"),
            "{e:?}"
        );
        assert!(
            e.contains(
                &"at descriptors[0]: 'value' must be a string or an integer, found the number 1.5"
            ),
            "{e:?}"
        );
    }

    /// A duplicate in an object is named by place, both of them, as a file's are by
    /// line.
    #[test]
    fn resource_duplicates_name_both_places() {
        let spec = serde_json::json!({"domain": "d", "descriptors": [
            {"key": "a", "rateLimit": {"unit": "second", "requestsPerUnit": 1}},
            {"key": "b", "descriptors": [
                {"key": "c", "rateLimit": {"unit": "second", "requestsPerUnit": 1}},
                {"key": "c", "value": "x", "rateLimit": {"unit": "second", "requestsPerUnit": 1}},
                {"key": "c", "rateLimit": {"unit": "second", "requestsPerUnit": 2}}
            ]},
            {"key": "a", "rateLimit": {"unit": "second", "requestsPerUnit": 2}}
        ]});
        let e = parse_resource_spec("ns", "p", &spec).unwrap_err();
        let e: Vec<_> = e.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            e,
            [
                "at descriptors[1].descriptors[2]: duplicate descriptor key 'c' with no value \
                 (first defined at descriptors[1].descriptors[0])",
                "at descriptors[2]: duplicate descriptor key 'a' with no value \
                 (first defined at descriptors[0])",
            ]
        );
    }

    /// An object has no lines: its errors say which descriptor, by place and key, as
    /// a file's say by line.
    #[test]
    fn resource_errors_name_the_descriptor_path() {
        let spec = serde_json::json!({"domain": "d", "descriptors": [
            {"key": "a", "rateLimit": {"unit": "second", "requestsPerUnit": 1}},
            {"key": "b", "descriptors": [
                {"key": "c", "value": "x", "rateLimit": {"unit": "second", "requestsPerUnit": 1, "burst": 0}}
            ]}
        ]});
        let e = parse_resource_spec("ns", "p", &spec).unwrap_err();
        assert!(
            e[0].message
                .starts_with("at descriptors[1].descriptors[0] (key 'c' value 'x'): "),
            "{e:?}"
        );
        // A file's errors keep their line alone.
        let file = "domain: d\ndescriptors:\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}\n";
        let e = parse_str("f.yaml", file).unwrap_err();
        assert!(!e[0].message.starts_with("at "), "{e:?}");
        assert_eq!(e[0].line, Some(4));
    }

    /// `share_threshold` with nothing to share is refused in both forms, as
    /// envoyproxy/ratelimit refuses it; a '*' in the value or the key is enough.
    #[test]
    fn share_threshold_needs_a_wildcard() {
        let file = |d: &str| errors(&format!("domain: d\ndescriptors:\n  - {d}\n"));
        assert_eq!(
            file("{key: k, value: v, share_threshold: true}"),
            "p.yaml:3: 'share_threshold' shares one counter among the values a wildcard matches, but key 'k' value 'v' has no '*'"
        );
        assert!(
            file("{key: k, share_threshold: true}").contains("key 'k' with no value has no '*'")
        );
        assert_eq!(
            resource_errors("{key: k, value: v, shareThreshold: true}"),
            "p.yaml:7: 'shareThreshold' shares one counter among the values a wildcard matches, but key 'k' value 'v' has no '*'"
        );
        for fine in [
            "{key: k, value: v*, share_threshold: true}",
            "{key: k*, share_threshold: true}",
            "{key: k, value: v, share_threshold: false}",
        ] {
            assert_eq!(file(fine), "", "{fine}");
        }
    }

    /// The file form (envoyproxy/ratelimit's) keeps reading what that service reads:
    /// any scalar as text, units in any case, durations with spaces around them.
    #[test]
    fn file_form_keeps_its_leniency() {
        let text = "domain: d
descriptors:
  - key: on
    value: 0x1F
    rate_limit: {unit: Minute, requests_per_unit: 5}
  - key: k
    value: 1.5
    rate_limit: {window: ' 10s', requests_per_unit: 5, name: 7}
";
        let docs = parse_str("p.yaml", text).unwrap_or_else(|e| panic!("{e:?}"));
        let d = &docs[0].descriptors;
        assert_eq!(
            (d[0].key.as_str(), d[0].value.as_deref()),
            ("on", Some("0x1F"))
        );
        assert_eq!(d[0].rate_limit.as_ref().unwrap().unit, Some(Unit::Minute));
        assert_eq!(d[1].value.as_deref(), Some("1.5"));
        let rl = d[1].rate_limit.as_ref().unwrap();
        assert_eq!(
            (rl.window, rl.name.as_deref()),
            (Some(10 * crate::algorithm::SECOND), Some("7"))
        );
    }

    /// Both forms read an integer as its YAML 1.1 reader does where the readings can
    /// agree (`5.0` and `1e3` are 5 and 1000, `0x10` is 16) and refuse a leading zero,
    /// which that reader takes for octal.
    #[test]
    fn integers_read_as_kubectl_and_envoyproxy_ratelimit_read_them() {
        let count = |text: String| {
            parse_str("p.yaml", &text)
                .map(|mut d| d.remove(0).descriptors.remove(0).rate_limit.unwrap())
                .map(|rate_limit| rate_limit.requests_per_unit)
                .map_err(|e| e[0].to_string())
        };
        let file = |n: &str| {
            count(format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {n}}}\n"
            ))
        };
        let resource = |n: &str| {
            count(format!(
                "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: p}}\nspec:\n  domain: d\n  descriptors:\n    - {{key: k, rateLimit: {{unit: second, requestsPerUnit: {n}}}}}\n"
            ))
        };
        for (n, want) in [("5", 5), ("5.0", 5), ("1e3", 1000), ("0x10", 16), ("0", 0)] {
            assert_eq!(file(n), Ok(want), "{n}");
            assert_eq!(resource(n), Ok(want), "{n}");
        }
        assert_eq!(
            file("010"),
            Err("p.yaml:4: 'requests_per_unit': 010 has a leading zero, which envoyproxy/ratelimit reads as an octal number; write it without".into())
        );
        assert!(resource("010")
            .unwrap_err()
            .contains("which kubectl reads as an octal number"));
        for n in [
            "5.5",
            "1e30",
            ".inf",
            ".nan",
            "0.99999999999999999",
            "4.0000000000000000001",
            "1e-400",
            "1e-99999999999999999999",
        ] {
            let want = format!("'requests_per_unit' must be an integer, found the number {n}");
            assert!(file(n).unwrap_err().ends_with(&want), "{n}: {:?}", file(n));
            assert!(
                resource(n).unwrap_err().contains("must be an integer"),
                "{n}"
            );
        }
    }

    /// The errors of a policy file `text`, a line each (empty when it loads).
    pub(in crate::policy) fn errors(text: &str) -> String {
        match parse_str("p.yaml", text) {
            Ok(_) => String::new(),
            Err(e) => e
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}
