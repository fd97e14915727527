//! The gRPC port through the clients its users run, each in plain text and over
//! mutual TLS: `grpcurl` (reflection, no proto files), `grpc-health-probe`
//! (Kubernetes probes) and Python's `grpcio`. scripts/install-tools.sh installs them;
//! scripts/test.sh sets `SLUICE_REQUIRE_TOOLS`, so that a missing one fails there
//! instead of skipping.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::tls::{Ca, Pair};
use common::tools::{grpcurl, missing, text, tool};
use common::*;
use prost::Message;
use sluice::pb::envoy::service::ratelimit::v3::RateLimitResponse;

const POLICY: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
const SHOULD_RATE_LIMIT: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

fn grpcio() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import grpc"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        missing("python3 grpcio");
    }
    ok
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run the client")
}

/// A sluice in plain text, or one that serves mutual TLS with a client certificate
/// for the clients.
struct Target {
    server: Server,
    /// (CA, client certificate) when the port speaks TLS.
    tls: Option<(Ca, Pair)>,
}

fn targets() -> Vec<Target> {
    let plain = Target {
        server: Server::start(POLICY, &[]),
        tls: None,
    };
    let ca = Ca::new("test-ca");
    let pair = ca.server();
    let client = ca.client("client");
    let server = Server::start(
        POLICY,
        &[
            "--grpc-tls-cert",
            pair.cert.to_str().unwrap(),
            "--grpc-tls-key",
            pair.key.to_str().unwrap(),
            "--grpc-tls-client-ca",
            ca.cert().to_str().unwrap(),
        ],
    );
    vec![
        plain,
        Target {
            server,
            tls: Some((ca, client)),
        },
    ]
}

impl Target {
    fn name(&self) -> &'static str {
        if self.tls.is_some() {
            "mtls"
        } else {
            "plain"
        }
    }

    fn grpcurl(&self, bin: &PathBuf, args: &[&str]) -> Output {
        grpcurl(bin, &self.server.grpc, self.tls.as_ref(), args)
    }
}

#[test]
fn grpcurl_lists_and_describes_the_port_without_proto_files() {
    let Some(grpcurl) = tool("grpcurl") else {
        return;
    };
    for t in targets() {
        // Flags before the "" and the method after it.
        let out = t.grpcurl(&grpcurl, &["", "list"]);
        assert!(out.status.success(), "{}: {}", t.name(), text(&out));
        let listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(
            listed,
            [
                "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
                "envoy.service.ratelimit.v3.RateLimitService",
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            ],
            "{}: {}",
            t.name(),
            text(&out)
        );
        let out = t.grpcurl(
            &grpcurl,
            &[
                "",
                "describe",
                "envoy.service.ratelimit.v3.RateLimitRequest",
            ],
        );
        let described = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}: {}", t.name(), text(&out));
        assert!(
            described.contains(
                "repeated .envoy.extensions.common.ratelimit.v3.RateLimitDescriptor descriptors = 2"
            ),
            "{}: {}",
            t.name(),
            text(&out)
        );
    }
}

#[test]
fn grpcurl_calls_should_rate_limit_and_health() {
    let Some(grpcurl) = tool("grpcurl") else {
        return;
    };
    for t in targets() {
        let request = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
        let codes: Vec<serde_json::Value> = (0..3)
            .map(|_| {
                let out = t.grpcurl(&grpcurl, &["-d", request, "", SHOULD_RATE_LIMIT]);
                assert!(out.status.success(), "{}: {}", t.name(), text(&out));
                let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
                answer["overallCode"].clone()
            })
            .collect();
        assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"], "{}", t.name());
        let out = t.grpcurl(&grpcurl, &["-d", "{}", "", "grpc.health.v1.Health/Check"]);
        assert!(out.status.success(), "{}: {}", t.name(), text(&out));
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(answer["status"], "SERVING", "{}", t.name());
    }
}

#[test]
fn grpc_health_probe_passes_while_serving() {
    let Some(probe) = tool("grpc-health-probe") else {
        return;
    };
    for t in targets() {
        let probe = |service: &str| {
            let mut cmd = Command::new(&probe);
            cmd.arg(format!("-addr={}", t.server.grpc))
                .arg(format!("-service={service}"))
                .args(["-connect-timeout=5s", "-rpc-timeout=5s"]);
            if let Some((ca, client)) = &t.tls {
                cmd.arg("-tls")
                    .arg(format!("-tls-ca-cert={}", ca.cert().display()))
                    .arg(format!("-tls-client-cert={}", client.cert.display()))
                    .arg(format!("-tls-client-key={}", client.key.display()));
            }
            run(&mut cmd)
        };
        for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
            let out = probe(service);
            assert!(
                out.status.success(),
                "{} {service:?}: {}",
                t.name(),
                text(&out)
            );
            assert!(text(&out).contains("status: SERVING"), "{}", text(&out));
        }
        // A service the port does not serve fails the probe.
        let out = probe("no.such.Service");
        assert!(!out.status.success(), "{}: {}", t.name(), text(&out));
        // So does a server that is shutting down (readiness off, still listening).
        if t.tls.is_none() {
            let server = Server::start(POLICY, &["--drain-delay", "20s"]);
            server.terminate();
            let mut cmd = Command::new(tool("grpc-health-probe").unwrap());
            cmd.arg(format!("-addr={}", server.grpc))
                .args(["-connect-timeout=5s", "-rpc-timeout=5s"]);
            eventually_sync(std::time::Duration::from_secs(15), "NOT_SERVING", || {
                let out = run(&mut cmd);
                !out.status.success() && text(&out).contains("NOT_SERVING")
            });
            drop(server);
        }
    }
}

/// Polls `f` until it holds, for tests without a runtime.
fn eventually_sync(limit: std::time::Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("timed out waiting for: {what}");
}

/// Python's grpcio sends what the test encodes (no generated stubs) and prints the
/// answer's bytes.
const PY_CLIENT: &str = r#"
import sys, grpc
addr, method, body = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
if len(sys.argv) > 4:
    ca, cert, key = (open(p, "rb").read() for p in sys.argv[4:7])
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    channel = grpc.secure_channel(addr, creds, options=[("grpc.ssl_target_name_override", "localhost")])
else:
    channel = grpc.insecure_channel(addr)
call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
for _ in range(3):
    print(call(body, timeout=10).hex())
"#;

#[test]
fn python_grpcio_calls_should_rate_limit() {
    if !grpcio() {
        return;
    }
    for t in targets() {
        let body = request("d", vec![desc(&[("k", "py")])]).encode_to_vec();
        let mut cmd = Command::new("python3");
        cmd.args(["-c", PY_CLIENT, &t.server.grpc])
            .arg(format!("/{SHOULD_RATE_LIMIT}"))
            .arg(hex(&body));
        if let Some((ca, client)) = &t.tls {
            cmd.arg(ca.cert()).arg(&client.cert).arg(&client.key);
        }
        let out = run(&mut cmd);
        assert!(out.status.success(), "{}: {}", t.name(), text(&out));
        let codes: Vec<i32> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                RateLimitResponse::decode(&unhex(l)[..])
                    .expect("a RateLimitResponse")
                    .overall_code
            })
            .collect();
        assert_eq!(codes, [OK, OK, OVER_LIMIT], "{}: {}", t.name(), text(&out));
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}
