//! The gRPC port through the clients its users run: `grpcurl` (reflection, no proto
//! files), `grpc-health-probe` (Kubernetes probes) and Python's `grpcio`.
//! scripts/install-tools.sh installs them; scripts/test.sh sets
//! `SLUICE_REQUIRE_TOOLS`, so that a missing one fails there instead of skipping.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::*;

const POLICY: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

/// A Go tool from the Go bin directories or PATH; `None` (after a loud message) when
/// it is missing and not required.
fn tool(name: &str) -> Option<PathBuf> {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    let mut dirs = vec![home.join("go/bin")];
    for var in ["GOPATH", "GOBIN"] {
        if let Some(d) = std::env::var_os(var) {
            let d = PathBuf::from(d);
            dirs.insert(0, if var == "GOPATH" { d.join("bin") } else { d });
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = dirs
        .into_iter()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        missing(name);
    }
    found
}

fn missing(name: &str) {
    assert!(
        std::env::var_os("SLUICE_REQUIRE_TOOLS").is_none(),
        "SLUICE_REQUIRE_TOOLS is set but {name} is missing: run scripts/install-tools.sh"
    );
    eprintln!("\n*** SKIPPED: {name} not found; run scripts/install-tools.sh ***\n");
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run the client")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn grpcurl_lists_and_describes_the_port_without_proto_files() {
    let Some(grpcurl) = tool("grpcurl") else {
        return;
    };
    let server = Server::start(POLICY, &[]);
    let grpcurl = |args: &[&str]| {
        run(Command::new(&grpcurl)
            .args(["-plaintext", "-max-time", "10", &server.grpc])
            .args(args))
    };
    let out = grpcurl(&["list"]);
    assert!(out.status.success(), "{}", text(&out));
    let listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        listed,
        [
            "envoy.service.ratelimit.v3.RateLimitService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ],
        "{}",
        text(&out)
    );
    let out = grpcurl(&["describe", "envoy.service.ratelimit.v3.RateLimitRequest"]);
    let described = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        described.contains(
            "repeated .envoy.extensions.common.ratelimit.v3.RateLimitDescriptor descriptors = 2"
        ),
        "{}",
        text(&out)
    );
}

#[test]
fn grpcurl_calls_should_rate_limit_and_health() {
    let Some(grpcurl) = tool("grpcurl") else {
        return;
    };
    let server = Server::start(POLICY, &[]);
    let call = |method: &str, body: &str| {
        run(Command::new(&grpcurl).args([
            "-plaintext",
            "-max-time",
            "10",
            "-d",
            body,
            &server.grpc,
            method,
        ]))
    };
    let request = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let method = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let codes: Vec<serde_json::Value> = (0..3)
        .map(|_| {
            let out = call(method, request);
            assert!(out.status.success(), "{}", text(&out));
            let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
            answer["overallCode"].clone()
        })
        .collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"]);
    let out = call("grpc.health.v1.Health/Check", "{}");
    assert!(out.status.success(), "{}", text(&out));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(answer["status"], "SERVING");
}
