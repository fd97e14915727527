//! The modules' dependencies point one way: the decision core (algorithms, policies,
//! stores, the limiter) knows nothing of the transport, the sources or the metrics
//! above it, so each can be read, tested and changed on its own. This test reads
//! every `crate::` path in `src/` and fails on one that points up.
//!
//! The rule extends to the workspace's crates: the gRPC server (`sluice-grpc`) and
//! the Redis client (`sluice-redis`) sit below everything and depend on no crate of
//! Sluice's; the core never uses the gRPC server, and only the store uses the Redis
//! client (the Redis store, and the error kinds every store reports, which are the
//! client's).

use std::collections::BTreeSet;
use std::path::Path;

/// What each module may use, besides itself. Modules not listed (`config`, `http`,
/// `server`, `lib.rs`, `main.rs`) sit at the top and may use anything.
const ALLOWED: &[(&str, &[&str])] = &[
    ("algorithm", &[]),
    ("hash", &[]),
    // Errors as one line, for logs and the command line.
    ("errors", &[]),
    // Telling systemd the service's state.
    ("notify", &[]),
    // Envoy's wire messages, generated: they use nothing of Sluice's.
    ("pb", &[]),
    ("clock", &["algorithm"]),
    // A certificate's validity dates, for every side that loads one.
    ("cert", &["clock"]),
    ("policy", &["algorithm", "clock", "hash", "pb"]),
    ("store", &["algorithm", "cert", "clock", "hash"]),
    (
        "limiter",
        &["algorithm", "clock", "hash", "policy", "store"],
    ),
    // Quota sharing (RLQS) decides beside the limiter, with its penalties.
    (
        "quota",
        &["algorithm", "clock", "hash", "policy", "store", "limiter"],
    ),
    (
        "telemetry",
        &["algorithm", "clock", "hash", "policy", "store", "limiter"],
    ),
    // Spans and their export know nothing of rate limits either.
    ("trace", &["errors"]),
    (
        "service",
        &[
            "algorithm",
            "clock",
            "hash",
            "policy",
            "store",
            "limiter",
            "quota",
            "telemetry",
            "trace",
            "pb",
        ],
    ),
    ("crd", &["policy"]),
    (
        "source",
        &[
            "algorithm",
            "cert",
            "clock",
            "hash",
            "policy",
            "telemetry",
            "crd",
            "config",
            "errors",
            "pb",
        ],
    ),
];

/// The names that follow `crate::` in `text`, including each of a `crate::{a, b}`.
fn used_modules(text: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            used.extend(group.split(',').map(|p| ident(p.trim())));
        } else {
            used.insert(ident(rest));
        }
    }
    used.remove("");
    used
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found only {files:?}");
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs");
        let Some((_, allowed)) = ALLOWED.iter().find(|(m, _)| *m == module) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for used in used_modules(&text) {
            if used != module && !allowed.contains(&used.as_str()) {
                wrong.push(format!("{}: {module} uses crate::{used}", rel.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that point up:\n{}",
        wrong.join("\n")
    );
}

/// The workspace crates each module may use, besides external ones. Modules not
/// listed sit at the top and may use any.
const CRATES: &[(&str, &[&str])] = &[
    ("algorithm", &[]),
    ("hash", &[]),
    ("clock", &[]),
    ("policy", &[]),
    // The Redis store is built on the Redis client; the store's error kinds are the
    // client's.
    ("store", &["sluice_redis"]),
    ("limiter", &[]),
    ("telemetry", &[]),
    ("trace", &[]),
    ("crd", &[]),
    ("source", &[]),
    ("service", &["sluice_grpc"]),
];

/// Whether `text` uses the crate `name` (a path or a `use`, not a name that merely
/// starts with it, such as a metric's).
fn uses_crate(text: &str, name: &str) -> bool {
    text.contains(&format!("{name}::")) || text.contains(&format!("use {name}"))
}

#[test]
fn core_modules_use_no_infrastructure_crate_above_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs");
        let Some((_, allowed)) = CRATES.iter().find(|(m, _)| *m == module) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for krate in ["sluice_grpc", "sluice_redis"] {
            if !allowed.contains(&krate) && uses_crate(&text, krate) {
                wrong.push(format!("{}: {module} uses {krate}", rel.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "uses that point up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_infrastructure_crates_depend_on_no_crate_of_sluice() {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let ours: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    for krate in ["sluice-grpc", "sluice-redis"] {
        let package = packages
            .iter()
            .find(|p| p["name"] == krate)
            .unwrap_or_else(|| panic!("{krate} is a workspace member: {ours:?}"));
        let deps: Vec<&str> = package["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|d| d["name"].as_str())
            .collect();
        assert!(
            deps.contains(&"tokio"),
            "{krate}'s dependencies read: {deps:?}"
        );
        let inward: Vec<&&str> = deps.iter().filter(|d| ours.contains(d)).collect();
        assert!(inward.is_empty(), "{krate} depends on {inward:?}");
    }
}

#[test]
fn a_crate_is_used_by_its_paths_not_by_a_name_that_starts_with_it() {
    assert!(uses_crate("use sluice_grpc::{frame, Code};", "sluice_grpc"));
    assert!(uses_crate(
        "let s = sluice_redis::error::reply(e);",
        "sluice_redis"
    ));
    assert!(!uses_crate(r#""sluice_grpc_connections""#, "sluice_grpc"));
}

#[test]
fn the_reader_sees_grouped_and_plain_paths() {
    let found = used_modules(
        "use crate::{policy::Rule, store::Hit};\nlet x = crate::hash::stable_hash(b);",
    );
    assert_eq!(
        found,
        ["hash", "policy", "store"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

/// With autotests off, a new `tests/*.rs` file is compiled only when listed: one that
/// is not would be a test suite that silently never runs.
#[test]
fn every_test_file_is_in_the_integration_binary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let listed = std::fs::read_to_string(dir.join("integration.rs")).unwrap();
    let manifest = std::fs::read_to_string(dir.join("../Cargo.toml")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".rs"))
        else {
            continue;
        };
        let own_binary = manifest.contains(&format!("path = \"tests/{name}.rs\""));
        if !own_binary && !listed.contains(&format!("\nmod {name};\n")) {
            missing.push(name.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "tests/{{{}}}.rs: neither a module of tests/integration.rs nor a [[test]] of Cargo.toml",
        missing.join(",")
    );
}
