//! The `sluice` command line: validate, serve's refusals.

use std::process::Command;

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

#[test]
fn validate_accepts_good_files_and_names_file_and_line_of_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    let out = sluice().arg("validate").arg(&good).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    let out = sluice()
        .arg("validate")
        .arg(&good)
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:4:", bad.display())), "{err}");
    assert!(err.contains("fortnight"), "{err}");
}

#[test]
fn serve_without_policies_says_how_to_give_them() {
    let out = sluice()
        .arg("serve")
        .env_remove("SLUICE_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--config") && err.contains("--kube"), "{err}");
}

#[test]
fn serve_refuses_to_start_on_a_bad_policy() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "descriptors: []\n").unwrap();
    let out = sluice()
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml"), "{err}");
}

#[test]
fn bench_policies_load() {
    for file in [
        "benches/policy.yaml",
        "benches/memory-policy.yaml",
        "benches/reference/config/bench.yaml",
    ] {
        let out = sluice().args(["validate", file]).output().unwrap();
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn logs_to_a_pipe_carry_no_colour_escapes() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    let mut child = sluice()
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&policy)
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // The reader ends when the child's stderr closes, so a hung start fails the test
    // by the kill below rather than hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.contains("sluice listening"))
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => lines.push(line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines.iter().any(|l| l.contains("sluice listening")),
        "{lines:?}"
    );
    assert!(
        lines.iter().all(|l| !l.contains('\x1b')),
        "colour escapes in piped logs: {lines:?}"
    );
}

/// `serve` with `args` on a valid policy, expected to refuse to start: its stderr.
fn serve_refusal(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    let out = sluice()
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&policy)
        .args(args)
        .env_remove("SLUICE_HASH_SECRET")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success(), "started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn hash_keys_without_a_secret_refuses_to_start_and_says_why() {
    let err = serve_refusal(&["--hash-keys"], &[]);
    assert!(
        err.contains("--hash-keys needs a secret") && err.contains("--hash-secret-file"),
        "{err}"
    );
}

#[test]
fn a_short_or_unreadable_hash_secret_is_refused() {
    let err = serve_refusal(&["--hash-keys"], &[("SLUICE_HASH_SECRET", "short")]);
    assert!(err.contains("at least 16 bytes"), "{err}");
    assert!(!err.contains("short\""), "the secret is echoed: {err}");
    let err = serve_refusal(&["--hash-secret-file", "/nonexistent/secret"], &[]);
    assert!(err.contains("/nonexistent/secret"), "{err}");
}
