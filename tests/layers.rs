//! The modules' dependencies point one way: the decision core (algorithms, policies,
//! stores, the limiter) knows nothing of the transport, the sources or the metrics
//! above it, so each can be read, tested and changed on its own. This test reads
//! every `crate::` path in `src/` and fails on one that points up.

use std::collections::BTreeSet;
use std::path::Path;

/// What each module may use, besides itself. Modules not listed (`config`, `http`,
/// `server`, `lib.rs`, `main.rs`) sit at the top and may use anything.
const ALLOWED: &[(&str, &[&str])] = &[
    ("algorithm", &[]),
    ("hash", &[]),
    ("clock", &["algorithm"]),
    ("policy", &["algorithm", "clock", "hash"]),
    ("store", &["algorithm", "clock", "hash"]),
    (
        "limiter",
        &["algorithm", "clock", "hash", "policy", "store"],
    ),
    (
        "telemetry",
        &["algorithm", "clock", "hash", "policy", "store", "limiter"],
    ),
    // The HTTP/2 transport knows nothing of rate limits.
    ("grpc_server", &[]),
    // Spans and their export know nothing of rate limits either.
    ("trace", &[]),
    (
        "service",
        &[
            "algorithm",
            "clock",
            "hash",
            "policy",
            "store",
            "limiter",
            "telemetry",
            "grpc_server",
            "trace",
        ],
    ),
    ("crd", &["policy"]),
    (
        "source",
        &[
            "algorithm",
            "clock",
            "hash",
            "policy",
            "telemetry",
            "crd",
            "config",
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
