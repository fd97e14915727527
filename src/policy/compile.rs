//! Merging documents into one [`Policy`]: documents naming the same domain merge
//! their trees, a key/value path defined twice is refused naming both places, and
//! each `rate_limit` becomes a [`Rule`] in the matcher tree.

use std::collections::HashMap;

use crate::algorithm::Limit;

use super::descriptor::describe_path;
use super::matcher::{self, Pattern};
use super::model::{DescriptorNode, Document, RateLimit};
use super::replaces;
use super::{
    Defaults, Domain, FailureMode, Policy, PolicyError, Rule, SourceInfo, Unit, MAX_ENTRIES,
};

/// Where something was defined, for messages naming both places of a conflict.
#[derive(Debug, Clone)]
pub(super) struct Origin {
    source: String,
    line: Option<usize>,
}

impl Origin {
    pub(super) fn new(source: &str, line: Option<usize>) -> Origin {
        Origin {
            source: source.to_string(),
            line,
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}", self.source, line),
            None => write!(f, "{}", self.source),
        }
    }
}

pub(super) type Path = Vec<(String, Option<String>)>;

/// What the documents of one domain taken so far define: its settings and every
/// key/value path, each with where it was defined first.
#[derive(Debug, Default)]
pub(super) struct Defined {
    failure_mode: Option<(FailureMode, Origin)>,
    shard_by: Option<(String, Origin)>,
    pub(super) paths: HashMap<Path, Origin>,
}

impl Defined {
    /// `failure_mode` and `shard_by`: documents of one domain may repeat them but
    /// not disagree. Pushes `doc`'s disagreements with the domain's.
    pub(super) fn settings_clash(&self, doc: &Document, errors: &mut Vec<PolicyError>) {
        let here = Origin::new(&doc.source, doc.line);
        if let (Some(mode), Some((prev, at))) = (doc.failure_mode, &self.failure_mode) {
            if mode != *prev {
                errors.push(conflict(
                    &here,
                    format!(
                        "domain '{}': failure mode {} conflicts with {} set at {at}",
                        doc.domain,
                        mode.as_str(),
                        prev.as_str()
                    ),
                ));
            }
        }
        if let (Some(key), Some((prev, at))) = (&doc.shard_by, &self.shard_by) {
            if key != prev {
                errors.push(conflict(
                    &here,
                    format!(
                        "domain '{}': shard_by '{key}' conflicts with '{prev}' set at {at}",
                        doc.domain
                    ),
                ));
            }
        }
    }

    /// Takes `doc`'s settings where the domain has none yet.
    pub(super) fn take_settings(&mut self, doc: &Document) {
        let here = || Origin::new(&doc.source, doc.line);
        if let (Some(mode), None) = (doc.failure_mode, &self.failure_mode) {
            self.failure_mode = Some((mode, here()));
        }
        if let (Some(key), None) = (&doc.shard_by, &self.shard_by) {
            self.shard_by = Some((key.clone(), here()));
        }
    }
}

/// The message for descriptor `d` of `domain`, whose path is already defined at
/// `first`.
pub(super) fn duplicate(d: &DescriptorNode, domain: &str, first: &Origin) -> String {
    format!(
        "duplicate descriptor {} in domain '{domain}': already defined at {first}",
        describe_path(&d.key, d.value.as_deref())
    )
}

#[derive(Default)]
struct DomainBuild {
    domain: Domain,
    defined: Defined,
}

/// What the recursive insertion writes to besides the tree.
struct Out<'a> {
    doc: &'a Document,
    defaults: &'a Defaults,
    defined: &'a mut HashMap<Path, Origin>,
    rules: &'a mut Vec<Rule>,
    errors: &'a mut Vec<PolicyError>,
}

/// Compiles documents into one policy with the built-in defaults; see
/// [`compile_with`].
pub fn compile(docs: Vec<Document>) -> Result<Policy, Vec<PolicyError>> {
    compile_with(docs, &Defaults::default())
}

/// Compiles documents into one policy, in order: rule ids follow the documents and
/// their descriptors. `defaults` fill what a document leaves out; whether documents
/// compile never depends on them. Fails with every conflict found.
pub fn compile_with(docs: Vec<Document>, defaults: &Defaults) -> Result<Policy, Vec<PolicyError>> {
    let mut domains: HashMap<String, DomainBuild> = HashMap::new();
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    let mut sources = Vec::with_capacity(docs.len());
    for doc in &docs {
        sources.push(SourceInfo {
            source: doc.source.clone(),
            domain: doc.domain.clone(),
            line: doc.line,
            resource: doc.resource_name(),
        });
        let build = domains.entry(doc.domain.clone()).or_default();
        build.domain.name = doc.domain.clone();
        build.defined.settings_clash(doc, &mut errors);
        build.defined.take_settings(doc);
        let mut out = Out {
            doc,
            defaults,
            defined: &mut build.defined.paths,
            rules: &mut rules,
            errors: &mut errors,
        };
        let mut trail = Trail::default();
        for d in &doc.descriptors {
            insert(&mut out, &mut build.domain.root, d, &mut trail);
        }
    }
    replace_circles(&docs, &mut errors);
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Policy {
        domains: domains
            .into_iter()
            .map(|(name, mut b)| {
                b.domain.failure_mode = b.defined.failure_mode.map(|(mode, _)| mode);
                b.domain.shard_by = b.defined.shard_by.map(|(key, _)| key);
                (name, b.domain)
            })
            .collect(),
        rules,
        sources,
        defaults: *defaults,
    })
}

/// Limits of one domain that replace one another in a circle, across its documents
/// (the parser has refused a circle within one).
fn replace_circles(docs: &[Document], errors: &mut Vec<PolicyError>) {
    let mut by_domain: HashMap<&str, Vec<replaces::Limit<'_>>> = HashMap::new();
    for doc in docs {
        let limits = by_domain.entry(doc.domain.as_str()).or_default();
        replaces::limits(&doc.source, &doc.descriptors, limits);
    }
    let mut domains: Vec<_> = by_domain.into_iter().collect();
    domains.sort_by_key(|(name, _)| *name);
    for (_, limits) in domains {
        for (first, message) in replaces::circles(&limits) {
            errors.push(PolicyError {
                file: limits[first].source.to_string(),
                line: limits[first].line,
                message,
            });
        }
    }
}

pub(super) fn conflict(at: &Origin, message: String) -> PolicyError {
    PolicyError {
        file: at.source.clone(),
        line: at.line,
        message,
    }
}

/// The way from the root to the current descriptor.
#[derive(Default)]
struct Trail {
    path: Path,
    keys: Vec<String>,
    shared: Vec<Option<String>>,
}

fn insert(out: &mut Out<'_>, parent: &mut matcher::Node, d: &DescriptorNode, trail: &mut Trail) {
    let here = Origin {
        source: out.doc.source.clone(),
        line: d.line,
    };
    if trail.path.len() == MAX_ENTRIES {
        let message = format!(
            "descriptor {} in domain '{}' is nested {} deep; a request's descriptor \
             carries at most {} entries, so none could reach it",
            describe_path(&d.key, d.value.as_deref()),
            out.doc.domain,
            MAX_ENTRIES + 1,
            MAX_ENTRIES
        );
        out.errors.push(conflict(&here, message));
        return;
    }
    trail.path.push((d.key.clone(), d.value.clone()));
    if let Some(first) = out.defined.get(&trail.path) {
        let message = duplicate(d, &out.doc.domain, first);
        out.errors.push(conflict(&here, message));
        trail.path.pop();
        return;
    }
    out.defined.insert(trail.path.clone(), here);
    trail.keys.push(d.key.clone());
    trail.shared.push(match &d.value {
        Some(v) if d.share_threshold && d.is_wildcard() => Some(v.clone()),
        _ => None,
    });

    let level = parent.children.entry(d.key.clone()).or_default();
    let node = match &d.value {
        None => &mut **level.any.get_or_insert_with(Box::default),
        Some(v) if d.is_wildcard() => level.add_wildcard(Pattern::new(v)),
        Some(v) => level.exact.entry(v.clone()).or_default(),
    };
    if let Some(own) = d.rate_limit.as_ref().and_then(|rl| rule(out, d, rl, trail)) {
        let id = own.id;
        node.rule = Some(id);
        out.rules.push(own);
        // The other limits of a `rate_limits` list: rules of their own, reached
        // only through this one's `also`, never through the tree.
        for rl in &d.also {
            if let Some(other) = rule(out, d, rl, trail) {
                out.rules[id].also.push(other.id);
                out.rules.push(other);
            }
        }
    }
    for child in &d.descriptors {
        insert(out, node, child, trail);
    }

    trail.path.pop();
    trail.keys.pop();
    trail.shared.pop();
}

/// The rule of `rl`, one of `d`'s limits, numbered as the next in `out.rules`.
fn rule(out: &mut Out<'_>, d: &DescriptorNode, rl: &RateLimit, trail: &Trail) -> Option<Rule> {
    let id = out.rules.len();
    let limit = if rl.unlimited {
        None
    } else {
        let Some(window) = rl.window_micros().filter(|w| *w > 0) else {
            let here = Origin {
                source: out.doc.source.clone(),
                line: rl.line.or(d.line),
            };
            out.errors.push(conflict(
                &here,
                "rate_limit needs 'unit' or 'window'".into(),
            ));
            return None;
        };
        let requests = u64::from(rl.requests_per_unit);
        Some(Limit {
            algorithm: rl.algorithm.unwrap_or(out.defaults.algorithm),
            requests,
            window,
            burst: rl.burst.unwrap_or(requests),
            phase: 0,
        })
    };
    let mut rule = Rule {
        id,
        path: trail.keys.join("/"),
        name: rl.name.clone(),
        limit,
        requests_per_unit: rl.requests_per_unit,
        unit: if rl.unlimited {
            Unit::Unknown
        } else {
            rl.report_unit()
        },
        replaces: rl.replaces.clone(),
        shadow_mode: d.shadow_mode || out.defaults.shadow_mode,
        global_shadow: out.defaults.shadow_mode && !d.shadow_mode,
        quota_mode: d.quota_mode,
        layer: d.layer,
        penalty: rl.penalty,
        shed: rl.shed,
        sensitive: d.sensitive,
        metadata: d.metadata.clone(),
        shared: trail.shared.clone(),
        rendered: Default::default(),
        also: Vec::new(),
        calendar: rl.calendar.clone(),
        lease: rl.lease,
        stat_key: trail
            .path
            .iter()
            .map(|(k, v)| match v {
                Some(v) => format!("{k}_{v}"),
                None => k.clone(),
            })
            .collect::<Vec<_>>()
            .join("."),
    };
    rule.rendered = super::answer::render(&rule);
    Some(rule)
}

#[cfg(test)]
mod tests {
    use super::super::parse_str;
    use super::*;

    fn docs(text: &str) -> Vec<Document> {
        parse_str("c.yaml", text).unwrap_or_else(|e| panic!("{e:#?}"))
    }

    #[test]
    fn duplicates_across_documents_of_one_file_name_both_lines() {
        let d = docs(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n---\ndomain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
        );
        let e = compile(d).unwrap_err();
        assert_eq!(e.len(), 1);
        assert_eq!(
            e[0].to_string(),
            "c.yaml:8: duplicate descriptor key 'k' with no value in domain 'd': already defined at c.yaml:3"
        );
    }

    /// A descriptor nested deeper than a request's descriptor may go is refused
    /// at load: every request reaching it would be refused instead.
    #[test]
    fn descriptors_nest_no_deeper_than_a_request_reaches() {
        let nested = |depth: usize| {
            let mut text = String::from("domain: d\ndescriptors:\n");
            for i in 0..depth {
                let pad = "  ".repeat(2 * i + 1);
                text += &format!("{pad}- key: k{i}\n");
                if i + 1 < depth {
                    text += &format!("{pad}  descriptors:\n");
                }
            }
            let pad = "  ".repeat(2 * depth);
            text + &format!("{pad}rate_limit: {{unit: second, requests_per_unit: 1}}\n")
        };
        let p = compile(docs(&nested(MAX_ENTRIES))).expect("32 deep loads");
        let entries: Vec<(String, String)> = (0..MAX_ENTRIES)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        let entries: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert!(p.domain("d").unwrap().find(&entries).is_some());

        // Refused as the file is read: the policy is invalid, not in conflict.
        let e = crate::policy::parse_str("c.yaml", &nested(MAX_ENTRIES + 1)).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        let line = 2 + 2 * MAX_ENTRIES;
        assert_eq!(
            e[0].to_string(),
            format!(
                "c.yaml:{line}: 'descriptors' nested 33 deep; a request's descriptor carries \
                 at most 32 entries, so none could reach them"
            )
        );
        // A RateLimitPolicy's spec too: Invalid, so its last good version serves.
        let mut tree = serde_json::json!({"key": "k32"});
        for i in (0..MAX_ENTRIES).rev() {
            tree = serde_json::json!({"key": format!("k{i}"), "descriptors": [tree]});
        }
        let spec = serde_json::json!({"domain": "d", "descriptors": [tree]});
        let e = crate::policy::parse_resource_spec("ns", "p", &spec).unwrap_err();
        assert!(
            e[0].message.contains("'descriptors' nested 33 deep"),
            "{e:?}"
        );
    }

    #[test]
    fn different_domains_do_not_clash() {
        let d = docs(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n---\ndomain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
        );
        let p = compile(d).unwrap();
        assert_eq!(p.domains.len(), 2);
        assert_eq!(p.rules.len(), 2);
        let b = p.domain("b").unwrap().find(&[("k", "v")]).unwrap();
        assert_eq!(p.rule(b).requests_per_unit, 2);
        assert!(p.rules.iter().enumerate().all(|(i, r)| r.id == i));
    }

    #[test]
    fn entries_given_as_a_set_match_in_the_trees_order() {
        let d = docs(
            "domain: d\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: path\n        value: /search\n        rate_limit: {unit: second, requests_per_unit: 5}\n      - key: path\n        rate_limit: {unit: second, requests_per_unit: 50}\n  - key: path\n    value: /search\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 7}\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 9}\n",
        );
        let p = compile(d).unwrap();
        let dom = p.domain("d").unwrap();
        let mut order = Vec::new();
        let rpu = |id: Option<usize>| id.map(|id| p.rule(id).requests_per_unit);
        // Sorted by key, path comes before tenant; the tree takes tenant first.
        let set = [("path", "/search"), ("tenant", "acme")];
        assert_eq!(rpu(dom.find_unordered(&set, &mut order)), Some(5));
        assert_eq!(order, vec![1, 0]);
        let set = [("path", "/other"), ("tenant", "acme")];
        assert_eq!(rpu(dom.find_unordered(&set, &mut order)), Some(50));
        // path=/search at the root leads to user: the first branch tried.
        let set = [("path", "/search"), ("user", "u1")];
        assert_eq!(rpu(dom.find_unordered(&set, &mut order)), Some(7));
        assert_eq!(order, vec![0, 1]);
        assert_eq!(
            rpu(dom.find_unordered(&[("client", "c")], &mut order)),
            Some(9)
        );
        // Every entry must be used: an extra entry matches nothing, as in find.
        let set = [("client", "c"), ("zone", "z")];
        assert_eq!(dom.find_unordered(&set, &mut order), None);
        // A node without a limit of its own applies nothing.
        assert_eq!(dom.find_unordered(&[("tenant", "acme")], &mut order), None);
        let none: [(&str, &str); 0] = [];
        assert_eq!(dom.find_unordered(&none, &mut order), None);
    }

    #[test]
    fn shard_by_conflict_names_both() {
        let d = docs("domain: d\nshard_by: tenant\n---\ndomain: d\nshard_by: user\n---\ndomain: d\nshard_by: tenant\n");
        let e = compile(d).unwrap_err();
        assert_eq!(e.len(), 1, "{e:#?}");
        assert_eq!(e[0].line, Some(4));
        assert!(e[0]
            .message
            .contains("shard_by 'user' conflicts with 'tenant' set at c.yaml:1"));
    }

    #[test]
    fn windows_report_their_unit_when_exact() {
        let d = docs(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {window: 1h, requests_per_unit: 1}\n  - key: b\n    rate_limit: {window: 61m, requests_per_unit: 1}\n  - key: c\n    rate_limit: {window: 7d, requests_per_unit: 1}\n",
        );
        let p = compile(d).unwrap();
        let units: Vec<Unit> = p.rules.iter().map(|r| r.unit).collect();
        assert_eq!(units, vec![Unit::Hour, Unit::Unknown, Unit::Week]);
        assert_eq!(
            p.rules[1].limit.unwrap().window,
            61 * 60 * crate::algorithm::SECOND
        );
    }

    #[test]
    fn default_algorithm_fills_only_limits_that_name_none() {
        use crate::algorithm::Algorithm;
        let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_window_log}\n";
        let algorithms = |defaults: &Defaults| -> Vec<Algorithm> {
            compile_with(docs(text), defaults)
                .unwrap()
                .rules
                .iter()
                .map(|r| r.limit.unwrap().algorithm)
                .collect()
        };
        assert_eq!(
            algorithms(&Defaults::default()),
            [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog]
        );
        let fixed = Defaults {
            algorithm: Algorithm::FixedWindow,
            ..Defaults::default()
        };
        assert_eq!(
            algorithms(&fixed),
            [Algorithm::FixedWindow, Algorithm::SlidingWindowLog]
        );
        // A token bucket by default: its burst is requests_per_unit.
        let bucket = Defaults {
            algorithm: Algorithm::TokenBucket,
            ..Defaults::default()
        };
        let p = compile_with(docs(text), &bucket).unwrap();
        assert_eq!(p.rules[0].limit.unwrap().algorithm, Algorithm::TokenBucket);
        assert_eq!(p.rules[0].limit.unwrap().burst, 1);
    }

    #[test]
    fn burst_needs_a_named_algorithm_whatever_the_default() {
        let e = super::super::parse_str(
            "c.yaml",
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n",
        )
        .unwrap_err();
        assert!(e[0].message.contains("name one with 'algorithm'"), "{e:?}");
    }

    #[test]
    fn sources_list_every_document() {
        let d = docs("domain: a\n---\napiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: p, namespace: ns}\nspec: {domain: b}\n");
        let p = compile(d).unwrap();
        assert_eq!(p.sources.len(), 2);
        assert_eq!(p.sources[0].resource, None);
        assert_eq!(p.sources[1].resource.as_deref(), Some("ns/p"));
        assert_eq!(p.sources[1].line, Some(3));
    }
}
