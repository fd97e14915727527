//! Policy loading, validation and matching over the project's own fixtures
//! (tests/fixtures), the example policy, and, when present beside the repository,
//! the shared envoyproxy/ratelimit conformance corpus.

use std::path::{Path, PathBuf};

use sluice::algorithm::{Algorithm, SECOND};
use sluice::policy::{
    compile, load_paths, parse_resource_spec, parse_str, DocumentKind, FailureMode, Layer, Policy,
    PolicyError, Rule, Unit,
};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn load(rels: &[&str]) -> Policy {
    let paths: Vec<PathBuf> = rels.iter().map(|r| fixture(r)).collect();
    match load_paths(&paths) {
        Ok((policy, _)) => policy,
        Err(errors) => panic!("{rels:?} should load: {errors:#?}"),
    }
}

fn errors_of(rels: &[&str]) -> Vec<PolicyError> {
    let paths: Vec<PathBuf> = rels.iter().map(|r| fixture(r)).collect();
    match load_paths(&paths) {
        Ok(_) => panic!("{rels:?} should be refused"),
        Err(errors) => errors,
    }
}

/// The rule matched by `entries` in `domain`.
fn find<'p>(policy: &'p Policy, domain: &str, entries: &[(&str, &str)]) -> Option<&'p Rule> {
    let id = policy.domain(domain)?.find(entries)?;
    Some(policy.rule(id))
}

fn rpu(policy: &Policy, domain: &str, entries: &[(&str, &str)]) -> Option<u32> {
    find(policy, domain, entries).map(|r| r.requests_per_unit)
}

#[test]
fn every_load_fixture_loads() {
    let dir = fixture("load");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    assert!(names.len() >= 9);
    for path in names {
        if let Err(errors) = load_paths(std::slice::from_ref(&path)) {
            panic!("{} should load: {errors:#?}", path.display());
        }
    }
}

#[test]
fn reject_fixtures_name_file_line_and_problem() {
    // (file, line, part of the message)
    let cases: &[(&str, Option<usize>, &str)] = &[
        (
            "bad_unit.yaml",
            Some(5),
            "invalid rate limit unit 'fortnight'",
        ),
        ("bad_yaml.yaml", Some(3), "invalid YAML"),
        ("bad_yaml_quote.yaml", Some(1), "invalid YAML"),
        (
            "duplicate_key.yaml",
            Some(6),
            "duplicate descriptor key 'k' value 'v' (first defined at line 3)",
        ),
        (
            "duplicate_key_only.yaml",
            Some(4),
            "duplicate descriptor key 'k' with no value (first defined at line 3)",
        ),
        ("empty_domain.yaml", Some(1), "missing or empty 'domain'"),
        (
            "empty_domain_quoted.yaml",
            Some(1),
            "missing or empty 'domain'",
        ),
        (
            "empty_key.yaml",
            Some(3),
            "descriptor has an empty or missing 'key'",
        ),
        (
            "misspelled_field.yaml",
            Some(5),
            "unknown field 'ratelimit' in descriptor (did you mean 'rate_limit'?)",
        ),
        (
            "misspelled_field2.yaml",
            Some(7),
            "unknown field 'requestsperunit' in rate_limit (did you mean 'requests_per_unit'?)",
        ),
        (
            "non_map_list.yaml",
            Some(3),
            "descriptor must be a mapping, found the string 'x'",
        ),
        (
            "non_string_key.yaml",
            Some(1),
            "key '1.5' in document is not a string",
        ),
        (
            "replaces_empty.yaml",
            Some(7),
            "'replaces' entry has an empty or missing 'name'",
        ),
        (
            "share_threshold_no_wildcard.yaml",
            Some(5),
            "'share_threshold' shares one counter among the values a wildcard matches, but key 'object' value 'docs/readme' has no '*'",
        ),
        (
            "replaces_self.yaml",
            Some(7),
            "names this limit itself ('mine')",
        ),
        (
            "replaces_each_other.yaml",
            Some(5),
            "limits 'free_plan' (FILE:5) and 'burst_cap' (FILE:12) replace each other: when both match one request neither applies",
        ),
        (
            "unlimited_with_unit.yaml",
            Some(6),
            "should not specify 'unit' when 'unlimited' is true",
        ),
        (
            "burst_with_window_algorithm.yaml",
            Some(7),
            "'burst' only applies to token_bucket and leaky_bucket: name one with 'algorithm'",
        ),
        (
            "unit_and_window.yaml",
            Some(6),
            "either 'unit' or 'window', not both",
        ),
        ("no_unit.yaml", Some(4), "needs 'unit' or 'window'"),
        (
            "missing_requests_per_unit.yaml",
            Some(4),
            "needs 'requests_per_unit'",
        ),
        ("negative_requests.yaml", Some(6), "must not be negative"),
        (
            "too_many_requests.yaml",
            Some(6),
            "must be at most 4294967295",
        ),
        ("bad_window.yaml", Some(5), "'window': unknown unit"),
        (
            "penalty_incomplete.yaml",
            Some(7),
            "'penalty' needs 'within'",
        ),
        ("bad_layer.yaml", Some(4), "unknown layer 'backend'"),
        (
            "bad_failure_mode.yaml",
            Some(2),
            "must be open, closed or local, found 'maybe'",
        ),
        (
            "string_for_bool.yaml",
            Some(4),
            "'shadow_mode' must be true or false, found the string 'true'",
        ),
        (
            "resource_snake_case.yaml",
            Some(9),
            "unknown field 'rate_limit' in descriptor (did you mean 'rateLimit'?)",
        ),
        (
            "wrong_kind.yaml",
            Some(1),
            "unsupported document: apiVersion v1, kind ConfigMap",
        ),
        (
            "second_document_bad.yaml",
            Some(9),
            "unknown algorithm 'gcra'",
        ),
        ("no_document.yaml", None, "no policy document"),
        (
            "duplicate_field.yaml",
            Some(2),
            "duplicate key 'domain' in document (first at line 1)",
        ),
    ];
    let dir = fixture("reject");
    let on_disk = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(on_disk, cases.len(), "every reject fixture has a case");
    for (name, line, fragment) in cases {
        let path = dir.join(name);
        let errors = errors_of(&[&format!("reject/{name}")]);
        let fragment = fragment.replace("FILE", &path.display().to_string());
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(
            errors
                .iter()
                .any(|e| e.line == *line && e.message.contains(&fragment)),
            "{name}: expected line {line:?} with {fragment:?}, got {shown:#?}"
        );
        for text in &shown {
            assert!(text.starts_with(&path.display().to_string()), "{text}");
        }
    }
}

/// A file written for envoyproxy/ratelimit with YAML merge keys loads unchanged.
#[test]
fn merge_keys_load_as_envoy_ratelimit_reads_them() {
    let text = "domain: api\ndescriptors:\n\
                \x20 - key: tenant\n    rate_limit: &base\n      unit: minute\n      requests_per_unit: 100\n\
                \x20 - key: path\n    rate_limit:\n      <<: *base\n      requests_per_unit: 10\n";
    let docs = parse_str("merge.yaml", text).unwrap_or_else(|e| panic!("{e:#?}"));
    let p = compile(docs).unwrap();
    assert_eq!(rpu(&p, "api", &[("tenant", "t")]), Some(100));
    assert_eq!(rpu(&p, "api", &[("path", "/")]), Some(10));
    assert_eq!(
        find(&p, "api", &[("path", "/")]).unwrap().unit,
        Unit::Minute
    );
}

#[test]
fn display_is_file_colon_line() {
    let errors = errors_of(&["reject/misspelled_field.yaml"]);
    let text = errors[0].to_string();
    let want = format!(
        "{}:5: unknown field 'ratelimit' in descriptor (did you mean 'rate_limit'?)",
        fixture("reject/misspelled_field.yaml").display()
    );
    assert_eq!(text, want);
}

#[test]
fn exact_beats_default_and_allow_listed_values_have_no_limit() {
    let p = load(&["load/nested_defaults.yaml"]);
    let d = "shop";
    assert_eq!(rpu(&p, d, &[("client", "mobile")]), None);
    assert_eq!(
        rpu(&p, d, &[("client", "mobile"), ("route", "/cart")]),
        Some(16)
    );
    assert_eq!(
        rpu(&p, d, &[("client", "mobile"), ("route", "/x")]),
        Some(8)
    );
    assert_eq!(
        rpu(&p, d, &[("client", "desktop"), ("route", "/cart")]),
        None
    );
    assert_eq!(rpu(&p, d, &[("region", "eu")]), Some(60));
    assert_eq!(rpu(&p, d, &[("region", "us")]), Some(40));
    assert_eq!(rpu(&p, d, &[("region", "internal")]), None);
    assert_eq!(rpu(&p, d, &[("plan", "gold")]), Some(100));
    assert_eq!(
        rpu(&p, d, &[("plan", "gold"), ("seat", "admin")]),
        Some(500)
    );
    assert_eq!(rpu(&p, d, &[("plan", "gold"), ("seat", "user")]), None);
    assert_eq!(rpu(&p, d, &[("plan", "silver")]), None);
    assert_eq!(rpu(&p, d, &[("nope", "x")]), None);
    assert_eq!(rpu(&p, "other-domain", &[("region", "eu")]), None);
    let empty: [(&str, &str); 0] = [];
    assert_eq!(p.domain(d).unwrap().find(&empty), None);

    let batch = find(&p, d, &[("batch", "x")]).unwrap();
    assert_eq!(batch.unit, Unit::Hour);
    let report = find(&p, d, &[("report", "x")]).unwrap();
    assert_eq!(report.name.as_deref(), Some("report_daily"));
    assert_eq!(report.unit, Unit::Day);
    let health = find(&p, d, &[("health", "x")]).unwrap();
    assert_eq!(health.limit, None);
    let limit = find(&p, d, &[("region", "eu")]).unwrap().limit.unwrap();
    assert_eq!(limit.algorithm, Algorithm::SlidingWindowCounter);
    assert_eq!(limit.window, 60 * SECOND);
    assert_eq!(limit.requests, 60);
    assert_eq!(limit.burst, 60);
}

#[test]
fn depth_must_match_and_walks_stop_at_leaves() {
    let p = load(&["load/nested_defaults.yaml"]);
    // region=eu has a limit but no children: a longer descriptor matches nothing.
    assert_eq!(rpu(&p, "shop", &[("region", "eu"), ("extra", "1")]), None);
    // A limit on an intermediate node applies only to a descriptor of its depth.
    assert_eq!(rpu(&p, "shop", &[("plan", "gold"), ("unknown", "1")]), None);
}

#[test]
fn wildcards_exact_then_file_order_then_key_only() {
    let p = load(&["load/wildcards.yaml"]);
    let d = "globs";
    assert_eq!(rpu(&p, d, &[("prefix", "img-large")]), Some(2));
    assert_eq!(rpu(&p, d, &[("prefix", "img-small")]), Some(1));
    assert_eq!(rpu(&p, d, &[("prefix", "img")]), Some(1));
    assert_eq!(rpu(&p, d, &[("prefix", "video")]), Some(3));
    assert_eq!(rpu(&p, d, &[("middle", "v1beta")]), Some(4));
    assert_eq!(rpu(&p, d, &[("middle", "vbeta")]), Some(4));
    assert_eq!(rpu(&p, d, &[("middle", "v1alpha")]), None);
    assert_eq!(rpu(&p, d, &[("multi", "a-b-c")]), Some(5));
    assert_eq!(rpu(&p, d, &[("multi", "abc")]), Some(5));
    assert_eq!(rpu(&p, d, &[("multi", "acb")]), None);
    assert_eq!(rpu(&p, d, &[("order", "xyz")]), Some(6));
    assert_eq!(rpu(&p, d, &[("order", "xy*")]), Some(7));
    assert_eq!(rpu(&p, d, &[("outer", "o1"), ("inner", "inside")]), Some(8));
    assert_eq!(rpu(&p, d, &[("outer", "o1")]), None);
    assert_eq!(rpu(&p, d, &[("outer", "o2"), ("inner", "inside")]), None);
}

#[test]
fn share_threshold_records_the_pattern_per_level() {
    let p = load(&["load/shared_counters.yaml"]);
    let d = "sharing";
    let r = find(&p, d, &[("object", "docs/a")]).unwrap();
    assert_eq!(r.shared, vec![Some("docs/*".to_string())]);
    let r = find(&p, d, &[("object", "docs/readme")]).unwrap();
    assert_eq!(r.requests_per_unit, 1);
    assert_eq!(r.shared, vec![None]);
    let r = find(&p, d, &[("zone", "z1"), ("rack", "r9"), ("host", "h")]).unwrap();
    assert_eq!(r.path, "zone/rack/host");
    assert_eq!(r.shared, vec![Some("z*".to_string()), None, None]);
    let r = find(&p, d, &[("org", "org-x"), ("repo", "r1-main")]).unwrap();
    assert_eq!(
        r.shared,
        vec![Some("org-*".to_string()), Some("r*-main".to_string())]
    );
}

#[test]
fn replaces_shadow_quota_and_metadata_are_kept() {
    let p = load(&["load/replaces_quota_metadata.yaml"]);
    let d = "api";
    let r = find(&p, d, &[("team", "search")]).unwrap();
    assert_eq!(r.replaces, vec!["global_cap", "other_cap"]);
    let r = find(&p, d, &[("caller", "c"), ("op", "blocked")]).unwrap();
    assert_eq!(r.requests_per_unit, 0);
    assert_eq!(r.limit.unwrap().requests, 0);
    assert_eq!(r.name.as_deref(), Some("blocked_cap"));
    assert!(
        find(&p, d, &[("caller", "c"), ("op", "trial")])
            .unwrap()
            .shadow_mode
    );
    assert_eq!(
        find(&p, d, &[("caller", "c"), ("op", "free")])
            .unwrap()
            .limit,
        None
    );
    assert_eq!(rpu(&p, d, &[("caller", "c"), ("op", "read")]), Some(4));
    assert_eq!(rpu(&p, d, &[("caller", "c")]), Some(5));
    let r = find(&p, d, &[("service", "billing")]).unwrap();
    assert!(r.quota_mode);
    assert_eq!(
        r.metadata,
        Some(serde_json::json!({"quota": {"owner": "billing", "tiers": [1, 2]}}))
    );
}

#[test]
fn documents_of_one_domain_merge_across_files() {
    let (p, docs) = load_paths(&[
        fixture("load/merge_one.yaml"),
        fixture("load/merge_two.yaml"),
    ])
    .unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(rpu(&p, "merged", &[("alpha", "a1")]), Some(11));
    assert_eq!(rpu(&p, "merged", &[("beta", "b1")]), Some(22));
    assert_eq!(
        p.domain("merged").unwrap().failure_mode,
        Some(FailureMode::Closed)
    );
    assert_eq!(p.sources.len(), 2);
    assert!(p.sources.iter().all(|s| s.domain == "merged"));
}

#[test]
fn the_same_path_in_two_files_names_both() {
    let errors = errors_of(&["conflict/dup_a.yaml", "conflict/dup_b.yaml"]);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let e = &errors[0];
    assert_eq!(e.file, fixture("conflict/dup_b.yaml").display().to_string());
    assert_eq!(e.line, Some(9));
    let first = format!("{}:3", fixture("conflict/dup_a.yaml").display());
    assert!(e.message.contains(&first), "{}", e.message);
    assert!(
        e.message.contains("key 'user' value 'alice'"),
        "{}",
        e.message
    );
}

/// Limits of two files that replace each other are refused, naming both places:
/// when both matched one request, neither would apply.
#[test]
fn limits_of_two_files_that_replace_each_other_name_both() {
    let errors = errors_of(&["conflict/replaces_a.yaml", "conflict/replaces_b.yaml"]);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let e = &errors[0];
    let (a, b) = (
        fixture("conflict/replaces_a.yaml").display().to_string(),
        fixture("conflict/replaces_b.yaml").display().to_string(),
    );
    assert_eq!((e.file.as_str(), e.line), (a.as_str(), Some(4)));
    assert_eq!(
        e.message,
        format!("limits 'plan_cap' ({a}:4) and 'ip_cap' ({b}:4) replace each other: when both match one request neither applies, so the request is limited by neither; keep 'replaces' on one of them only")
    );
}

/// A `RateLimitPolicy` resource named `name` (in `namespace`, if any) for `domain`.
fn resource(name: &str, namespace: Option<&str>, domain: &str) -> String {
    let ns = namespace.map_or(String::new(), |ns| format!(", namespace: {ns}"));
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: {name}{ns}}}\n\
         spec:\n  domain: {domain}\n  descriptors:\n    - key: k\n      \
         rateLimit: {{unit: second, requestsPerUnit: 1}}\n"
    )
}

/// `kubectl apply` keeps one object per namespace and name: two resources of the
/// same name in the files would load in sluice but not in Kubernetes, so they are
/// refused, naming both places.
#[test]
fn two_resources_of_one_name_and_namespace_are_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.yaml");
    std::fs::write(
        &one,
        format!(
            "{}---\n{}",
            resource("a", Some("shop"), "api"),
            resource("a", Some("shop"), "api2")
        ),
    )
    .unwrap();
    let errors = load_paths(std::slice::from_ref(&one)).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].to_string(),
        format!(
            "{0}:10: duplicate RateLimitPolicy 'a' (namespace 'shop'): already defined at \
             {0}:1; kubectl apply would keep only the last one",
            one.display()
        )
    );

    // Across files (and directories) of one --config, without a namespace too.
    let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
    std::fs::write(&a, resource("p", None, "dx")).unwrap();
    std::fs::write(&b, resource("p", None, "dy")).unwrap();
    let errors = load_paths(&[a.clone(), b.clone()]).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].file, b.display().to_string());
    assert!(
        errors[0].message.contains("'p' (no namespace)")
            && errors[0].message.contains(&format!("{}:1", a.display())),
        "{}",
        errors[0].message
    );

    // Another namespace is another object. A resource without a namespace goes
    // wherever kubectl's context says, so it is told apart from every named one.
    std::fs::write(&b, resource("p", Some("shop"), "dy")).unwrap();
    let c = dir.path().join("c.yaml");
    std::fs::write(&c, resource("p", Some("default"), "dz")).unwrap();
    let (policy, _) = load_paths(&[a, b, c]).unwrap();
    assert_eq!(policy.domains.len(), 3);
}

#[test]
fn conflicting_domain_settings_are_refused() {
    let errors = errors_of(&["conflict/mode_open.yaml", "conflict/mode_closed.yaml"]);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0]
        .message
        .contains("failure mode closed conflicts with open"));
    assert!(errors[0].message.contains("mode_open.yaml:1"));
}

#[test]
fn sluice_fields_and_layer_inheritance() {
    let p = load(&["load/sluice_fields.yaml"]);
    let d = "extras";
    let domain = p.domain(d).unwrap();
    assert_eq!(domain.failure_mode, Some(FailureMode::Closed));
    assert_eq!(domain.shard_by.as_deref(), Some("tenant"));

    let edge = find(&p, d, &[("remote_address", "10.0.0.1")]).unwrap();
    assert_eq!(edge.layer, Layer::Edge);
    assert_eq!(edge.limit.unwrap().algorithm, Algorithm::FixedWindow);

    let tenant = find(&p, d, &[("tenant", "acme")]).unwrap();
    assert_eq!(tenant.layer, Layer::Tenant);
    assert_eq!(tenant.unit, Unit::Unknown);
    let limit = tenant.limit.unwrap();
    assert_eq!(limit.algorithm, Algorithm::TokenBucket);
    assert_eq!(
        (limit.requests, limit.window, limit.burst),
        (100, 10 * SECOND, 200)
    );

    let search = find(&p, d, &[("tenant", "acme"), ("path", "/search")]).unwrap();
    assert_eq!(search.layer, Layer::Tenant, "inherited from tenant");
    assert_eq!(search.path, "tenant/path");
    assert_eq!(search.unit, Unit::Second);
    let limit = search.limit.unwrap();
    assert_eq!(limit.algorithm, Algorithm::LeakyBucket);
    assert_eq!((limit.requests, limit.window, limit.burst), (5, SECOND, 10));

    let other = find(&p, d, &[("tenant", "acme"), ("path", "/other")]).unwrap();
    assert_eq!(other.layer, Layer::Service, "overridden");
    assert_eq!(other.unit, Unit::Minute, "a 1m window reports as minute");
    assert_eq!(other.limit.unwrap().algorithm, Algorithm::SlidingWindowLog);

    let login = find(&p, d, &[("login", "u")]).unwrap();
    assert_eq!(login.layer, Layer::Service);
    assert_eq!(login.unit, Unit::Unknown);
    let limit = login.limit.unwrap();
    assert_eq!((limit.window, limit.burst), (90 * SECOND, 5));
    let penalty = login.penalty.unwrap();
    assert_eq!(penalty.violations, 3);
    assert_eq!(penalty.within, 600 * SECOND);
    assert_eq!(
        penalty.sentence,
        sluice::policy::Sentence::Ban(3_600 * SECOND)
    );
}

#[test]
fn file_and_resource_forms_in_one_file() {
    let path = fixture("load/mixed_forms.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let docs = parse_str("mixed_forms.yaml", &text).unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].kind, DocumentKind::File);
    assert_eq!(docs[0].line, Some(2));
    assert_eq!(
        docs[1].kind,
        DocumentKind::Resource {
            namespace: Some("shop".into()),
            name: "checkout".into()
        }
    );
    assert_eq!(docs[1].source, "mixed_forms.yaml");
    let p = compile(docs).unwrap();
    let domain = p.domain("mixed").unwrap();
    assert_eq!(domain.failure_mode, Some(FailureMode::Closed));
    assert_eq!(domain.shard_by.as_deref(), Some("tenant"));
    assert_eq!(rpu(&p, "mixed", &[("header_match", "bots")]), Some(1));
    let r = find(&p, "mixed", &[("tenant", "t1"), ("path", "/search")]).unwrap();
    assert!(r.shadow_mode);
    assert_eq!(r.layer, Layer::Tenant);
    assert_eq!(r.limit.unwrap().burst, 10);
    assert_eq!(
        p.sources[1].resource.as_deref(),
        Some("shop/checkout"),
        "{:?}",
        p.sources
    );
}

#[test]
fn resource_spec_from_json() {
    let spec = serde_json::json!({
        "domain": "edge",
        "failureMode": "closed",
        "descriptors": [
            {"key": "remote_address", "layer": "edge",
             "rateLimit": {"unit": "minute", "requestsPerUnit": 600}},
            {"key": "tenant", "layer": "tenant",
             "rateLimit": {"requestsPerUnit": 100, "window": "10s",
                           "algorithm": "token_bucket", "burst": 200}}
        ]
    });
    let doc = parse_resource_spec("shop", "checkout", &spec).unwrap();
    assert_eq!(doc.source, "shop/checkout");
    assert_eq!(doc.line, None);
    let p = compile(vec![doc]).unwrap();
    assert_eq!(rpu(&p, "edge", &[("remote_address", "1.2.3.4")]), Some(600));

    let bad = serde_json::json!({
        "domain": "edge",
        "descriptors": [{"key": "k", "rate_limit": {"unit": "minute"}}]
    });
    let errors = parse_resource_spec("shop", "bad", &bad).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].to_string(),
        "shop/bad: at descriptors[0] (key 'k' with no value): unknown field 'rate_limit' in descriptor (did you mean 'rateLimit'?)"
    );
    let errors =
        parse_resource_spec("shop", "bad", &serde_json::json!({"descriptors": []})).unwrap_err();
    assert_eq!(
        errors[0].to_string(),
        "shop/bad: missing or empty 'domain' in spec"
    );
}

#[test]
fn directories_skip_dotfiles_and_follow_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("..2024_01_01");
    std::fs::create_dir(&data).unwrap();
    std::fs::copy(fixture("load/merge_one.yaml"), data.join("one.yaml")).unwrap();
    std::fs::copy(fixture("load/merge_two.yaml"), data.join("two.yml")).unwrap();
    std::fs::write(data.join("notes.txt"), "not yaml: [").unwrap();
    // The layout of a mounted ConfigMap: ..data -> ..<timestamp>, name -> ..data/name.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&data, dir.path().join("..data")).unwrap();
        for name in ["one.yaml", "two.yml", "notes.txt"] {
            std::os::unix::fs::symlink(Path::new("..data").join(name), dir.path().join(name))
                .unwrap();
        }
        std::fs::write(dir.path().join(".hidden.yaml"), "not yaml: [").unwrap();
        let (p, docs) = load_paths(&[dir.path().to_path_buf()]).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(rpu(&p, "merged", &[("beta", "b1")]), Some(22));
    }
}

#[test]
fn missing_paths_are_errors_and_all_errors_are_collected() {
    let errors = errors_of(&[
        "does/not/exist.yaml",
        "reject/bad_unit.yaml",
        "reject/empty_key.yaml",
    ]);
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert_eq!(errors[0].line, None);
    assert!(errors[0].message.contains("cannot read"));
}

#[test]
fn example_policy_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/policy.yaml");
    let (p, docs) = load_paths(&[path]).unwrap_or_else(|e| panic!("{e:#?}"));
    assert!(docs.len() >= 3);
    assert!(docs
        .iter()
        .any(|d| matches!(d.kind, DocumentKind::Resource { .. })));
    let layers: std::collections::HashSet<Layer> = p.rules.iter().map(|r| r.layer).collect();
    assert_eq!(layers.len(), 3, "edge, service and tenant rules");
}

/// The shared corpus of envoyproxy/ratelimit files, when it is beside the
/// repository (as in CI). `SLUICE_CONFORMANCE` may point at it from elsewhere.
/// Absent, the test is skipped with a note, unless `CI` is set (CI runs with the
/// corpus beside the clone) or `SLUICE_REQUIRE_CORPUS` is: then it fails.
fn conformance_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("SLUICE_CONFORMANCE") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance"),
    };
    let dir = dir.join("envoy-ratelimit");
    if dir.is_dir() {
        return Some(dir);
    }
    let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"));
    let required = std::env::var_os("SLUICE_REQUIRE_CORPUS").is_some();
    assert!(
        !ci && !required,
        "the conformance corpus is missing: {} is not a directory (CI or \
         SLUICE_REQUIRE_CORPUS is set; point SLUICE_CONFORMANCE at the corpus)",
        dir.display()
    );
    // Straight to stderr, past the test harness's capture, so a skip is seen.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "\n*** SKIPPED the conformance corpus test: {} is not a directory \
             (set SLUICE_CONFORMANCE to the corpus) ***\n",
            dir.display()
        )
        .as_bytes(),
    );
    None
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files
}

#[test]
fn the_conformance_corpus_loads_and_refuses_as_envoy_ratelimit_does() {
    let Some(dir) = conformance_dir() else {
        return;
    };
    let loads = yaml_files(&dir.join("load"));
    assert!(!loads.is_empty());
    for path in &loads {
        if let Err(errors) = load_paths(std::slice::from_ref(path)) {
            panic!("{} should load: {errors:#?}", path.display());
        }
    }
    let merge: Vec<PathBuf> = loads
        .iter()
        .filter(|p| p.to_string_lossy().contains("merge_domain_key"))
        .cloned()
        .collect();
    assert_eq!(merge.len(), 2, "the corpus has two merge_domain_key files");
    let (p, _) = load_paths(&merge).unwrap();
    assert_eq!(rpu(&p, "test-domain", &[("key1", "value1")]), Some(10));
    assert_eq!(rpu(&p, "test-domain", &[("key2", "value2")]), Some(20));
    let rejects = yaml_files(&dir.join("reject"));
    assert!(!rejects.is_empty());
    for path in &rejects {
        let Err(errors) = load_paths(std::slice::from_ref(path)) else {
            panic!("{} should be refused", path.display());
        };
        let file = path.display().to_string();
        for e in &errors {
            assert_eq!(e.file, file);
            assert!(!e.message.is_empty());
        }
        // Every case but an empty stream has a known line.
        assert!(errors.iter().any(|e| e.line.is_some()), "{errors:#?}");
    }
}

#[test]
fn a_control_character_is_refused_with_its_line_not_read_as_the_end_of_the_file() {
    // A NUL in the middle of a file (a corrupted copy, a crash mid-write) must not
    // end the policy there and silently drop the rules after it, nor end up in a
    // domain or key: YAML allows no control character but tab and line breaks, and
    // envoyproxy/ratelimit's reader refuses them too.
    let limit = "    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let text = format!("domain: api\ndescriptors:\n  - key: a\n{limit}  - key: b\0\0\n{limit}");
    let errors = parse_str("nul.yaml", &text).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].to_string(),
        "nul.yaml:5: control character U+0000 at column 11, which YAML does not allow (is the file corrupted?)"
    );
    let errors = parse_str("bell.yaml", "domain: \"api\u{7}\"\ndescriptors: []\n").unwrap_err();
    assert_eq!(errors[0].line, Some(1));
    assert!(
        errors[0].message.contains("U+0007 at column 13"),
        "{errors:#?}"
    );
    // Tabs, CRLF line ends, a byte-order mark and other characters are text.
    let text = format!(
        "\u{feff}domain: \"caf\u{e9}\t\u{1F600}\"\r\ndescriptors:\r\n  - key: a\r\n{limit}"
    );
    assert_eq!(parse_str("ok.yaml", &text).unwrap().len(), 1);
}

#[test]
fn a_file_that_is_not_utf8_is_refused_with_the_line_and_column_of_its_first_bad_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latin1.yaml");
    std::fs::write(&path, b"domain: api\ndescriptors:\n  - key: caf\xe9\n").unwrap();
    let errors = load_paths(std::slice::from_ref(&path)).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].to_string(),
        format!(
            "{}:3: not UTF-8: byte 0xE9 at column 13; save the file as UTF-8",
            path.display()
        )
    );
}

/// Every policy the book shows loads: each ```yaml block of docs/ (and of the
/// README) that is a policy, or a piece of one (a `spec:`, a `descriptors:` list, a
/// descriptor, a one-line `rateLimit:`), is parsed and compiled as `sluice
/// validate` would, wrapped into a whole document when it is a piece. A reader
/// copies these first, so one that stops loading is a defect. Blocks of other
/// configuration (Envoy, Kubernetes, Helm) are left out by their first key.
#[test]
fn every_policy_block_of_the_docs_loads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.push(root.join("README.md"));
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let rel = file.strip_prefix(root).unwrap().display().to_string();
        for (line, block) in yaml_blocks(&text) {
            let Some(doc) = as_policy(&block) else {
                continue;
            };
            let source = format!("{rel}:{line}");
            let loaded = parse_str(&source, &doc).and_then(compile);
            if let Err(errors) = loaded {
                failures.push(format!("{source}:\n{block}\n=> {errors:#?}"));
            }
            checked.push(source);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The reference pages' examples are among them (a change to the fences or to the
    // wrapping below would otherwise skip them silently).
    for page in [
        "docs/policies.md",
        "docs/rates.md",
        "docs/calendar.md",
        "docs/costs.md",
        "docs/local-share.md",
        "docs/responses.md",
        "docs/observability.md",
    ] {
        assert!(
            checked.iter().any(|s| s.starts_with(&format!("{page}:"))),
            "no policy block checked in {page}: {checked:?}"
        );
    }
}

/// The ```yaml (or ```yml) fenced blocks of a Markdown text, with the line of each
/// opening fence.
fn yaml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        match &mut open {
            None if fence.starts_with("```yaml") || fence.starts_with("```yml") => {
                open = Some((i + 1, String::new()));
            }
            Some(_) if fence.starts_with("```") => blocks.extend(open.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// `block` as a whole policy document, when it is a policy or a piece of one.
fn as_policy(block: &str) -> Option<String> {
    let first = block
        .lines()
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))?;
    let indent = first.len() - first.trim_start().len();
    let key = first.trim_start();
    let indented = |by: &str| -> String {
        block
            .lines()
            .map(|l| format!("{by}{}\n", l.get(indent..).unwrap_or(l.trim_start())))
            .collect()
    };
    // A limit says how many: Envoy Gateway's `rateLimit:` settings do not.
    let limits = ["requestsPerUnit", "requests_per_unit", "unlimited"]
        .iter()
        .any(|f| block.contains(f));
    let resource =
        "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: doc}\n";
    if key.starts_with("domain:") {
        Some(block.to_string())
    } else if key.starts_with("apiVersion:") {
        block
            .contains("kind: RateLimitPolicy")
            .then(|| block.to_string())
    } else if key.starts_with("spec:") {
        Some(format!("{resource}{block}"))
    } else if key.starts_with("descriptors:") {
        Some(format!("domain: doc\n{}", indented("")))
    } else if key.starts_with("- key:") {
        Some(format!("domain: doc\ndescriptors:\n{}", indented("  ")))
    } else if key.starts_with("rateLimit:") || key.starts_with("rateLimits:") {
        limits.then(|| {
            format!(
                "{resource}spec:\n  domain: doc\n  descriptors:\n    - key: doc\n{}",
                indented("      ")
            )
        })
    } else if key.starts_with("rate_limit:") || key.starts_with("rate_limits:") {
        // Envoy's route `rate_limits` (with `actions`) is no policy.
        (limits && !block.contains("actions:")).then(|| {
            format!(
                "domain: doc\ndescriptors:\n  - key: doc\n{}",
                indented("    ")
            )
        })
    } else {
        None
    }
}
