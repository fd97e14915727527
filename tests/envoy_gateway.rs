//! Sluice in Envoy Gateway's rate limit Deployment: started as `ratelimit` with
//! exactly the environment Envoy Gateway gives envoyproxy/ratelimit (from its
//! `internal/infrastructure/kubernetes/ratelimit/`), only the addresses and the
//! certificate paths pointed at this test's xDS server, Redis and files, and the
//! ports on loopback.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::certs::Certs;
use common::redis::{available, RedisServer};
use common::xds::{binary, fixture, XdsServer};
use common::*;
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

const DOMAIN: &str = "default/eg/http";
const ROUTE: &str = "httproute/default/api/rule/0/match/0/*";
const WAIT: Duration = Duration::from_secs(20);

/// `/bin/ratelimit` as Envoy Gateway runs it: sluice under that name.
fn ratelimit_binary(dir: &Path) -> std::path::PathBuf {
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), &link).expect("link");
    link
}

/// Envoy Gateway's variables, as its Deployment sets them.
fn envoy_gateway_env(xds: &XdsServer, certs: &Certs, redis: &RedisServer) -> Vec<(String, String)> {
    let cert = |n: &str| certs.path(n).display().to_string();
    [
        ("RUNTIME_ROOT", "/data".to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("USE_STATSD", "false".into()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("localhost:{}", xds.port()),
        ),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", cert("tls.crt")),
        ("GRPC_SERVER_TLS_KEY", cert("tls.key")),
        ("GRPC_SERVER_TLS_CA_CERT", cert("ca.crt")),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert("tls.crt")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", cert("tls.key")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", cert("ca.crt")),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", redis.addr()),
        ("USE_PROMETHEUS", "true".into()),
        // Envoy Gateway's `:19001`, on a port of the kernel's choosing.
        ("PROMETHEUS_ADDR", ":0".into()),
        (
            "PROMETHEUS_MAPPER_YAML",
            "/etc/statsd-exporter/conf.yaml".into(),
        ),
        // Not set by Envoy Gateway (whose pod has its own ports: 8080 and 8081 on
        // every address): here every address too, on ports of the kernel's choosing.
        ("PORT", "0".into()),
        ("GRPC_PORT", "0".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn command(bin: &Path, env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

#[tokio::test]
async fn started_as_ratelimit_with_envoy_gateways_environment() {
    if !available() {
        return;
    }
    let Some(xds_bin) = binary() else { return };
    let certs = Certs::envoy_gateway();
    let xds = XdsServer::start_tls(
        &xds_bin,
        &certs,
        &[fixture("gateway.yaml"), fixture("shared.yaml")],
    );
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let bin = ratelimit_binary(dir.path());
    let env = envoy_gateway_env(&xds, &certs, &redis);

    // TLS with no key to serve it is refused, with the missing variable named.
    let no_key: Vec<_> = env
        .iter()
        .filter(|(k, _)| k != "GRPC_SERVER_TLS_KEY")
        .cloned()
        .collect();
    let out = command(&bin, &no_key).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("GRPC_SERVER_USE_TLS=true") && stderr.contains("GRPC_SERVER_TLS_KEY"),
        "{stderr}"
    );

    // Envoy Gateway's whole environment serves: the gRPC port over TLS with the
    // Secret's certificate.
    let server = Server::spawn(command(&bin, &env), dir);
    let healthcheck = || http(&server.http, "GET", "/healthcheck", "");
    eventually(WAIT, "/healthcheck OK", || async {
        healthcheck() == (200, "OK".to_string())
    })
    .await;
    // Every address is IPv6's too, as envoyproxy/ratelimit (Go) listens on
    // `0.0.0.0`: the probes and Envoy reach a pod of an IPv6 cluster by its IPv6
    // address.
    let port = |addr: &str| addr.rsplit(':').next().expect("a port").to_string();
    for ip in ["127.0.0.1", "[::1]"] {
        let at = format!("{ip}:{}", port(&server.http));
        assert_eq!(
            http(&at, "GET", "/healthcheck", ""),
            (200, "OK".to_string()),
            "/healthcheck at {at}"
        );
    }
    // Each ignored variable is named once; the honoured ones are not.
    let warned: Vec<&String> = server
        .startup
        .iter()
        .filter(|l| l.contains("is ignored"))
        .collect();
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(warned.iter().any(|l| l.contains("GRPC_SERVER_TLS_CA_CERT")));
    assert!(warned.iter().any(|l| l.contains("PROMETHEUS_MAPPER_YAML")));
    // Plain text is not answered; Envoy's client (its certificate from the same
    // Secret) is.
    let plain = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut c = RateLimitServiceClient::new(channel);
        assert!(c
            .should_rate_limit(request(DOMAIN, vec![desc(&[("k", "v")])]))
            .await
            .is_err());
    }
    let (ca, crt, key) = (
        certs.path("ca.crt"),
        certs.path("tls.crt"),
        certs.path("tls.key"),
    );
    let client = || async {
        server
            .tls_client(&ca, Some((&crt, &key)))
            .await
            .expect("TLS")
    };

    // The xDS configs arrive over mTLS and counters live in Redis. Waited for with
    // checks (no hits): they spend nothing and count in no series.
    let d = || desc(&[(ROUTE, ROUTE), ("rule-0-match-0", "rule-0-match-0")]);
    let check = || desc_hits(&[(ROUTE, ROUTE), ("rule-0-match-0", "rule-0-match-0")], 0);
    eventually(WAIT, "the gateway's limits", || async {
        let mut c = client().await;
        let r = call(&mut c, request(DOMAIN, vec![check()])).await;
        r.statuses[0].current_limit.is_some()
    })
    .await;
    // Envoy's calls reach the gRPC port by IPv6 too.
    let v6 = {
        use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
        let read = |p: &Path| std::fs::read(p).expect("a certificate file");
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&ca)))
            .domain_name("localhost")
            .identity(Identity::from_pem(read(&crt), read(&key)));
        let channel = Channel::from_shared(format!("https://[::1]:{}", port(&server.grpc)))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .expect("the gRPC port at [::1]");
        RateLimitServiceClient::new(channel)
    };
    let r = call(&mut v6.clone(), request(DOMAIN, vec![check()])).await;
    assert!(r.statuses[0].current_limit.is_some(), "over IPv6: {r:?}");

    // PROMETHEUS_ADDR serves the metrics...
    let prometheus = server
        .startup
        .iter()
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("prometheus="))
        })
        .expect("the metrics address logged")
        .to_string();
    let (status, text) = http(&prometheus, "GET", "/metrics", "");
    assert_eq!(status, 200);
    assert!(text.contains("sluice_requests_total"), "{text}");
    let v6 = format!("[::1]:{}", port(&prometheus));
    assert_eq!(http(&v6, "GET", "/metrics", "").0, 200, "/metrics at {v6}");
    // ...and envoyproxy/ratelimit's series that Envoy Gateway's dashboards read.
    let families = [
        "total_hits",
        "within_limit",
        "near_limit",
        "over_limit",
        "shadow_mode",
    ];
    let labels = format!(
        r#"{{domain="{DOMAIN}",key1="{ROUTE}_{ROUTE}",key2="rule-0-match-0_rule-0-match-0"}}"#
    );
    let series = || {
        let (status, text) = http(&prometheus, "GET", "/metrics", "");
        assert_eq!(status, 200);
        families.map(|family| {
            let name = format!("ratelimit_service_rate_limit_{family}{labels} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&name))
                .map_or(0, |n| n.parse::<u64>().expect("a count"))
        })
    };

    // Five hits on the limit of 3 a minute, in one fixed window, and what the series
    // gained meanwhile. The descriptor's values are the gateway's, so a run that a
    // minute's end cut in two is run again on the same counter: each run first reads
    // what is left of it with a check, and a fresh one has all 3.
    let (run, left, answers, gained) = in_one_window(Duration::from_secs(60), async |run| {
        let mut c = client().await;
        let left = call(&mut c, request(DOMAIN, vec![check()])).await.statuses[0].limit_remaining;
        let before = series();
        let mut answers = Vec::new();
        for _ in 0..5 {
            answers.push(call(&mut c, request(DOMAIN, vec![d()])).await);
        }
        let after = series();
        let gained: [u64; 5] = std::array::from_fn(|i| after[i] - before[i]);
        (run, u64::from(left), answers, gained)
    })
    .await;
    if run == 0 {
        assert_eq!(left, 3, "a fresh counter");
    }
    let codes: Vec<i32> = answers.iter().map(|r| r.overall_code).collect();
    let want: Vec<i32> = (0..5)
        .map(|i| if i < left { OK } else { OVER_LIMIT })
        .collect();
    assert_eq!(codes, want, "3 a minute, {left} left");
    for r in &answers {
        assert!(
            r.response_headers_to_add.is_empty(),
            "Envoy Gateway's Envoy adds the headers itself"
        );
    }
    let keys = Command::new("redis-cli")
        .args(["-p", redis.addr().rsplit(':').next().unwrap(), "--scan"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    assert!(keys.contains("rule-0-match-0"), "counters in Redis: {keys}");
    // Five hits on a limit of 3 (all of it left): three within it, the third past
    // 80 % of it, two denied.
    assert_eq!(
        gained,
        [5, left, u64::from(left > 0), 5 - left, 0],
        "{families:?} of {labels}"
    );
}
