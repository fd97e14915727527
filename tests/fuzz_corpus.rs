//! The fuzz targets' corpora (`fuzz/corpus/TARGET/`), replayed on stable Rust with
//! the targets' own checks: every input a fuzzing run kept, and every crash it found
//! once fixed, stays a test.

#[path = "../fuzz/src/checks.rs"]
mod checks;

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "{target}: {} fails", path.display());
        n += 1;
    }
    assert!(n > 0, "{target}: empty corpus");
}

#[test]
fn request_decode_corpus() {
    replay("request_decode", checks::request_decode);
}

#[test]
fn policy_parse_corpus() {
    replay("policy_parse", checks::policy_parse);
}

#[test]
fn json_request_corpus() {
    replay("json_request", checks::json_request);
}

#[test]
fn resp_parse_corpus() {
    replay("resp_parse", checks::resp_parse);
}

#[test]
fn rlqs_reports_corpus() {
    replay("rlqs_reports", checks::rlqs_reports);
}

#[test]
fn resource_spec_corpus() {
    replay("resource_spec", checks::resource_spec);
}

#[test]
fn xds_config_corpus() {
    replay("xds_config", checks::xds_config);
}
