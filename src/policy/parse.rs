//! Reading policy documents of both forms: envoyproxy/ratelimit files (`domain` +
//! `descriptors`) and `RateLimitPolicy` resources, from YAML text (several documents
//! per file) or from a Kubernetes object's JSON `spec`.

use super::descriptor::descriptors;
use super::fields::{string, text, Ctx, Field, Fields, Form};
use super::model::{Document, DocumentKind};
use super::node::{shorten, Node, Value};
use super::{yaml, FailureMode, Layer, PolicyError};

/// The apiVersion and kind of the resource form.
pub const API_VERSION: &str = "sluice.dev/v1alpha1";
/// See [`API_VERSION`].
pub const KIND: &str = "RateLimitPolicy";

/// Parses one file's text: every document, either form. `source` names the file in
/// errors. Fails with every error found when any document is invalid.
pub fn parse_str(source: &str, text: &str) -> Result<Vec<Document>, Vec<PolicyError>> {
    let (docs, errors) = parse_partial(source, text);
    if errors.is_empty() {
        Ok(docs)
    } else {
        Err(errors)
    }
}

/// Converts a `RateLimitPolicy`'s `spec` as Kubernetes hands it over. Errors name
/// `namespace/name` and have no line.
pub fn parse_resource_spec(
    namespace: &str,
    name: &str,
    spec: &serde_json::Value,
) -> Result<Document, Vec<PolicyError>> {
    let source = format!("{namespace}/{name}");
    let mut ctx = Ctx::new(&source, Form::Resource);
    let Some(node) = Node::from_json(spec) else {
        ctx.error(None, "spec is nested too deeply");
        return Err(ctx.errors);
    };
    let kind = DocumentKind::Resource {
        namespace: Some(namespace.to_string()),
        name: name.to_string(),
    };
    let doc = body(&mut ctx, &node, "spec", kind);
    match doc {
        Some(doc) if ctx.errors.is_empty() => Ok(doc),
        _ => {
            if ctx.errors.is_empty() {
                ctx.error(None, "invalid spec");
            }
            Err(ctx.errors)
        }
    }
}

/// Converts a document of the file form given as JSON (an xDS `RateLimitConfig`
/// turned into envoyproxy/ratelimit's document), with every check a file gets.
/// Errors name `source` and have no line.
pub fn parse_file_json(
    source: &str,
    doc: &serde_json::Value,
) -> Result<Document, Vec<PolicyError>> {
    let mut ctx = Ctx::new(source, Form::File);
    let Some(node) = Node::from_json(doc) else {
        ctx.error(None, "the document is nested too deeply");
        return Err(ctx.errors);
    };
    match body(&mut ctx, &node, "document", DocumentKind::File) {
        Some(doc) if ctx.errors.is_empty() => Ok(doc),
        _ => {
            if ctx.errors.is_empty() {
                ctx.error(None, "invalid document");
            }
            Err(ctx.errors)
        }
    }
}

/// Parses a file's text, keeping the valid documents next to the errors of the
/// others, so a loader can still report conflicts between the valid ones.
pub(crate) fn parse_partial(source: &str, text: &str) -> (Vec<Document>, Vec<PolicyError>) {
    let nodes = match yaml::load(text) {
        Ok(nodes) => nodes,
        Err(e) => {
            let error = PolicyError {
                file: source.to_string(),
                line: e.line,
                message: e.message,
            };
            return (Vec::new(), vec![error]);
        }
    };
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    let mut any = false;
    for node in nodes.iter().filter(|n| n.value != Value::Null) {
        any = true;
        let mut ctx = Ctx::new(source, Form::File);
        let doc = document(&mut ctx, node);
        match doc {
            Some(doc) if ctx.errors.is_empty() => docs.push(doc),
            _ => errors.extend(ctx.errors),
        }
    }
    if !any {
        errors.push(PolicyError {
            file: source.to_string(),
            line: None,
            message:
                "no policy document: expected 'domain' and 'descriptors', or a RateLimitPolicy"
                    .to_string(),
        });
    }
    errors.sort_by_key(|e| e.line);
    (docs, errors)
}

/// One YAML document of either form.
fn document(ctx: &mut Ctx, node: &Node) -> Option<Document> {
    let Value::Map(entries) = &node.value else {
        ctx.error(
            node.line,
            format!(
                "a policy document must be a mapping, found {}",
                node.describe()
            ),
        );
        return None;
    };
    let is_resource = entries
        .iter()
        .any(|(k, _)| matches!(&k.value, Value::Str(s) if s == "apiVersion" || s == "kind"));
    if is_resource {
        ctx.form = Form::Resource;
        resource(ctx, node)
    } else {
        body(ctx, node, "document", DocumentKind::File)
    }
}

/// A `RateLimitPolicy` object.
fn resource(ctx: &mut Ctx, node: &Node) -> Option<Document> {
    let mut f = Fields::open(ctx, node, KIND)?;
    let api_version = f.get(ctx, "api_version").and_then(|a| string(ctx, a));
    let kind = f.get(ctx, "kind").and_then(|k| string(ctx, k));
    if api_version.as_deref() != Some(API_VERSION) || kind.as_deref() != Some(KIND) {
        let show = |v: Option<String>| v.map_or("(none)".to_string(), |v| shorten(&v));
        ctx.error(
            node.line,
            format!(
                "unsupported document: apiVersion {}, kind {} (expected apiVersion {API_VERSION}, kind {KIND})",
                show(api_version),
                show(kind)
            ),
        );
        return None;
    }
    let (namespace, name) = match f.get(ctx, "metadata") {
        Some(meta) => metadata(ctx, meta)?,
        None => {
            ctx.error(f.line, "RateLimitPolicy needs 'metadata' with a 'name'");
            return None;
        }
    };
    let spec = f.get(ctx, "spec");
    f.ignore(ctx, "status");
    let line = f.line;
    f.finish(ctx, KIND);
    let Some(spec) = spec else {
        ctx.error(line, "RateLimitPolicy needs a 'spec'");
        return None;
    };
    let mut doc = body(
        ctx,
        spec.node,
        "spec",
        DocumentKind::Resource { namespace, name },
    )?;
    // The document starts at the object, not at its spec.
    doc.line = node.line;
    Some(doc)
}

/// `metadata`: `name` is required; `namespace` is optional; labels, annotations and
/// the rest are accepted and ignored.
fn metadata(ctx: &mut Ctx, field: Field<'_>) -> Option<(Option<String>, String)> {
    let mut f = Fields::open_field(ctx, field, "metadata")?;
    let name = f.get(ctx, "name").and_then(|n| string(ctx, n));
    let namespace = f
        .get(ctx, "namespace")
        .and_then(|n| string(ctx, n))
        .filter(|n| !n.is_empty());
    match name {
        Some(name) if !name.is_empty() => Some((namespace, name)),
        _ => {
            ctx.error(f.line, "'metadata' needs a non-empty 'name'");
            None
        }
    }
}

/// The shared body: a file document, or a resource's `spec`.
fn body(ctx: &mut Ctx, node: &Node, what: &str, kind: DocumentKind) -> Option<Document> {
    let mut f = Fields::open(ctx, node, what)?;
    let domain = f.get(ctx, "domain").and_then(|d| string(ctx, d));
    let failure_mode = f.get(ctx, "failure_mode").and_then(|field| {
        let name = text(ctx, field)?;
        let mode = FailureMode::parse(&name);
        if mode.is_none() {
            ctx.error(
                field.line(),
                format!(
                    "'{}' must be open, closed or local, found '{}'",
                    field.name,
                    shorten(&name)
                ),
            );
        }
        mode
    });
    let shard_by = match f.get(ctx, "shard_by") {
        Some(field) => match string(ctx, field) {
            Some(s) if s.is_empty() => {
                ctx.error(field.line(), format!("'{}' must not be empty", field.name));
                None
            }
            other => other,
        },
        None => None,
    };
    let tree = match f.get(ctx, "descriptors") {
        Some(field) => descriptors(ctx, field, Layer::default()),
        None => Vec::new(),
    };
    let line = f.line;
    f.finish(ctx, what);
    let domain = match domain {
        Some(d) if !d.is_empty() => d,
        _ => {
            let place = if what == "spec" { " in spec" } else { "" };
            ctx.error(line, format!("missing or empty 'domain'{place}"));
            return None;
        }
    };
    // Limits of this document that replace one another in a circle.
    let source = ctx.source.clone();
    let mut limits = Vec::new();
    super::replaces::limits(&source, &tree, &mut limits);
    for (first, message) in super::replaces::circles(&limits) {
        ctx.error(limits[first].line, message);
    }
    Some(Document {
        source: ctx.source.clone(),
        line,
        kind,
        domain,
        failure_mode,
        shard_by,
        descriptors: tree,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<PolicyError> {
        parse_str("t.yaml", text).expect_err("should be refused")
    }

    fn one(text: &str) -> Document {
        let mut docs = parse_str("t.yaml", text).unwrap_or_else(|e| panic!("{e:#?}"));
        assert_eq!(docs.len(), 1);
        docs.remove(0)
    }

    #[test]
    fn scalar_values_are_read_as_written() {
        let doc = one("domain: 42\ndescriptors:\n  - key: port\n    value: 8080\n  - key: on\n");
        assert_eq!(doc.domain, "42");
        assert_eq!(doc.descriptors[0].value.as_deref(), Some("8080"));
        assert_eq!(doc.descriptors[1].key, "on");
    }

    #[test]
    fn empty_value_means_key_only_and_null_lists_are_empty() {
        let doc = one("domain: d\ndescriptors:\n  - key: k\n    value: ''\n    descriptors:\n");
        assert_eq!(doc.descriptors[0].value, None);
        assert!(doc.descriptors[0].descriptors.is_empty());
    }

    #[test]
    fn bom_and_crlf() {
        let doc = one("\u{feff}domain: d\r\ndescriptors:\r\n  - key: k\r\n");
        assert_eq!(doc.descriptors[0].line, Some(3));
    }

    #[test]
    fn document_must_be_a_mapping() {
        let e = errors("- a\n- b\n");
        assert_eq!(e[0].line, Some(1));
        assert!(e[0].message.contains("must be a mapping, found a list"));
    }

    #[test]
    fn several_errors_in_one_document_are_all_reported_in_line_order() {
        let e = errors(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: parsec, requests_per_unit: 1}\n  - key: b\n    bogus: 1\n",
        );
        let lines: Vec<_> = e.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![Some(4), Some(6)], "{e:#?}");
    }

    #[test]
    fn resource_needs_metadata_name_and_spec() {
        let base = "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\n";
        let e = errors(&format!("{base}spec: {{domain: d}}\n"));
        assert!(e[0].message.contains("needs 'metadata'"), "{e:#?}");
        let e = errors(&format!(
            "{base}metadata: {{namespace: x}}\nspec: {{domain: d}}\n"
        ));
        assert_eq!(e[0].line, Some(3));
        assert!(e[0].message.contains("non-empty 'name'"), "{e:#?}");
        let e = errors(&format!("{base}metadata: {{name: x}}\n"));
        assert!(e[0].message.contains("needs a 'spec'"), "{e:#?}");
        let e = errors(&format!(
            "{base}metadata: {{name: x}}\nspec: {{domain: d}}\nextra: 1\n"
        ));
        assert_eq!(e[0].line, Some(5));
        assert!(e[0]
            .message
            .contains("unknown field 'extra' in RateLimitPolicy"));
    }

    #[test]
    fn failure_mode_local_reads_in_both_forms() {
        let file = one("domain: d\nfailure_mode: local\ndescriptors:\n  - key: k\n");
        assert_eq!(file.failure_mode, Some(FailureMode::Local));
        let resource = one(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: p}\nspec:\n  domain: d\n  failureMode: local\n",
        );
        assert_eq!(resource.failure_mode, Some(FailureMode::Local));
    }

    #[test]
    fn resource_reads_camel_case_and_ignores_status() {
        let doc = one(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: p, uid: abc}\nspec:\n  domain: d\n  failureMode: open\n  descriptors:\n    - key: k\n      layer: tenant\n      quotaMode: true\n      valueToMetric: true\n      detailedMetric: true\n      descriptors:\n        - key: c\n          rateLimit: {unit: minute, requestsPerUnit: 3, unlimited: false}\nstatus: {anything: [1, 2]}\n",
        );
        assert_eq!(doc.line, Some(1));
        assert_eq!(
            doc.kind,
            DocumentKind::Resource {
                namespace: None,
                name: "p".into()
            }
        );
        assert_eq!(doc.failure_mode, Some(FailureMode::Open));
        let k = &doc.descriptors[0];
        assert!(k.quota_mode && k.value_to_metric && k.detailed_metric);
        assert_eq!(k.descriptors[0].layer, Layer::Tenant);
        assert_eq!(
            k.descriptors[0]
                .rate_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            3
        );
    }

    #[test]
    fn wrong_api_version_is_named() {
        let e = errors("apiVersion: sluice.dev/v2\nkind: RateLimitPolicy\nmetadata: {name: p}\n");
        assert!(e[0]
            .message
            .contains("apiVersion sluice.dev/v2, kind RateLimitPolicy"));
    }

    #[test]
    fn metadata_must_be_a_mapping() {
        let e = errors("domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n");
        assert_eq!(e[0].line, Some(4));
        assert!(e[0].message.contains("'metadata' must be a mapping"));
    }

    #[test]
    fn unlimited_refuses_sluice_fields_too() {
        let e = errors(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      window: 1s\n      algorithm: token_bucket\n      burst: 3\n",
        );
        let lines: Vec<_> = e.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![Some(6), Some(7), Some(8)], "{e:#?}");
    }

    #[test]
    fn burst_must_be_positive() {
        let e = errors(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 0}\n",
        );
        assert!(
            e[0].message.contains("'burst' must not be below 1"),
            "{e:#?}"
        );
    }

    #[test]
    fn json_spec_errors_have_no_line() {
        let spec = serde_json::json!({"domain": "d", "descriptors": [{"key": "k", "layer": 3}]});
        let e = parse_resource_spec("ns", "n", &spec).unwrap_err();
        assert_eq!(e[0].file, "ns/n");
        assert_eq!(e[0].line, None);
        assert!(e[0].message.contains("unknown layer '3'"), "{e:#?}");
        let spec = serde_json::json!({"domain": "d", "descriptors": [{"key": ["x"]}]});
        let e = parse_resource_spec("ns", "n", &spec).unwrap_err();
        assert!(
            e[0].message
                .contains("'key' must be a string, found a list"),
            "{e:#?}"
        );
    }
}
