//! Policies over xDS from the test xDS server (go-control-plane's snapshot cache over
//! ADS and mTLS, as Envoy Gateway serves its rate limit service): configs in Envoy
//! Gateway's shape are served and answered per, updates apply, a bad version is
//! NACKed and the last good kept, a restarted server is reconnected, readiness waits
//! for the first version unless told not to.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::certs::Certs;
use common::xds::{binary, fixture, XdsServer};
use common::*;

const DOMAIN: &str = "default/eg/http";
const ROUTE: &str = "httproute/default/api/rule/0/match/0/*";
const WAIT: Duration = Duration::from_secs(20);

/// A request that the gateway fixture's header rule limits.
fn header_request() -> sluice::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    request(
        DOMAIN,
        vec![desc(&[
            (ROUTE, ROUTE),
            ("rule-0-match-0", "rule-0-match-0"),
        ])],
    )
}

/// Sluice subscribed over mTLS with Envoy Gateway's certificates, with no other
/// policy.
fn sluice(xds: &XdsServer, certs: &Certs, extra: &[&str]) -> Server {
    sluice_trusting(xds, certs, "ca.crt", extra)
}

/// As [`sluice`], trusting only the authority of `ca` (a file of `certs`) for the
/// server's certificate.
fn sluice_trusting(xds: &XdsServer, certs: &Certs, ca: &str, extra: &[&str]) -> Server {
    let url = format!("https://localhost:{}", xds.port());
    let (cert, key, ca) = (certs.path("tls.crt"), certs.path("tls.key"), certs.path(ca));
    let mut args = vec![
        "--xds-server",
        &url,
        "--xds-node-id",
        "envoy-ratelimit",
        "--xds-tls-cert",
        cert.to_str().unwrap(),
        "--xds-tls-key",
        key.to_str().unwrap(),
        "--xds-tls-ca",
        ca.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start_with(tempfile::tempdir().unwrap(), &[], &args)
}

/// Waits until the header rule answers with a limit of `n` (a new version applied).
async fn header_limit_becomes(server: &Server, n: u32, what: &str) {
    eventually(WAIT, what, || async {
        let mut c = server.client().await;
        let r = call(&mut c, header_request()).await;
        first_limit(&r) == Some(n)
    })
    .await;
}

fn ready(server: &Server) -> bool {
    http(&server.http, "GET", "/readyz", "").0 == 200
}

/// Waits until `server` is ready; panics naming `what` after [`WAIT`].
async fn until_ready(server: &Server, what: &str) {
    eventually(WAIT, what, || async { ready(server) }).await;
}

/// The test xDS server serving the gateway fixtures over mTLS with Envoy Gateway's
/// certificates; `None` (after a loud message) without its binary.
fn gateway_xds() -> Option<(XdsServer, Certs)> {
    let bin = binary()?;
    let certs = Certs::envoy_gateway();
    let xds = XdsServer::start_tls(&bin, &certs, &gateway_files());
    Some((xds, certs))
}

fn metric(server: &Server, series: &str) -> Option<f64> {
    let (_, text) = http(&server.http, "GET", "/metrics", "");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// How many requests the server saw that refused version `version`.
fn nacks(xds: &XdsServer, version: &str) -> usize {
    xds.requests()
        .iter()
        .filter(|r| r["error_message"].is_string() && r["version_info"] != version)
        .count()
}

/// The gateway fixture with its first limit of 3 changed to `n`, written in `dir`.
fn gateway_limited_to(dir: &tempfile::TempDir, n: u32) -> PathBuf {
    let changed = dir.path().join("changed.yaml");
    std::fs::write(
        &changed,
        std::fs::read_to_string(fixture("gateway.yaml"))
            .unwrap()
            .replacen(
                "requests_per_unit: 3",
                &format!("requests_per_unit: {n}"),
                1,
            ),
    )
    .unwrap();
    changed
}

fn gateway_files() -> Vec<PathBuf> {
    vec![fixture("gateway.yaml"), fixture("shared.yaml")]
}

#[tokio::test]
async fn envoy_gateway_configs_over_mtls_are_answered_and_updates_apply() {
    let Some((xds, certs)) = gateway_xds() else {
        return;
    };
    // The configs name no algorithm: a log counts them exactly, whenever the calls
    // run.
    let server = sluice(&xds, &certs, &["--default-algorithm", "sliding_window_log"]);
    until_ready(&server, "ready once the first version is in").await;

    // 3 a minute.
    let mut c = server.client().await;
    for _ in 0..3 {
        assert_eq!(call(&mut c, header_request()).await.overall_code, OK);
    }
    let r = call(&mut c, header_request()).await;
    assert_eq!(r.overall_code, OVER_LIMIT, "3 a minute");
    assert_eq!(first_limit(&r), Some(3));
    // The per-address rule under its CIDR, and the shared rule's own domain.
    let by_address = |ip: &str| {
        desc(&[
            (ROUTE, ROUTE),
            ("masked_remote_address", "127.0.0.0/8"),
            ("remote_address", ip),
        ])
    };
    for _ in 0..2 {
        assert_eq!(
            call(&mut c, request(DOMAIN, vec![by_address("127.0.0.9")]))
                .await
                .overall_code,
            OK
        );
    }
    assert_eq!(
        call(&mut c, request(DOMAIN, vec![by_address("127.0.0.9")]))
            .await
            .overall_code,
        OVER_LIMIT
    );
    assert_eq!(
        call(&mut c, request(DOMAIN, vec![by_address("127.0.0.8")]))
            .await
            .overall_code,
        OK
    );
    let shared = desc(&[
        ("default/shared/rule/0", "default/shared/rule/0"),
        ("rule-0-match-0", "rule-0-match-0"),
    ]);
    let r = call(&mut c, request("default/shared", vec![shared])).await;
    assert_eq!(first_limit(&r), Some(1));

    // The ACK names the version and the nonce; the node is Envoy Gateway's. It
    // leaves once the version is applied, so it may still be on its way.
    eventually(WAIT, "version 1 ACKed with its nonce", || async {
        xds.requests().iter().any(|r| {
            r["version_info"] == "1" && r["response_nonce"] != "" && r["error_message"].is_null()
        })
    })
    .await;
    let requests = xds.requests();
    assert_eq!(requests[0]["node_id"], "envoy-ratelimit");
    assert_eq!(requests[0]["version_info"], "");
    assert_eq!(
        metric(
            &server,
            r#"sluice_policy_reloads_total{result="ok",source="xds"}"#
        ),
        Some(1.0)
    );

    // Version 2 raises the header rule's limit to 10.
    let raised = std::fs::read_to_string(fixture("gateway.yaml"))
        .unwrap()
        .replacen("requests_per_unit: 3", "requests_per_unit: 10", 1);
    let v = xds.publish(&format!(
        "{raised}\n---\n{}",
        std::fs::read_to_string(fixture("shared.yaml")).unwrap()
    ));
    assert_eq!(v, "2");
    header_limit_becomes(&server, 10, "version 2 applied").await;
    // A config removed from the snapshot removes its domain.
    xds.publish_files(&[fixture("gateway.yaml")]);
    eventually(WAIT, "the shared domain gone", || async {
        let (_, body) = http(&server.http, "GET", "/debug/policies", "");
        !body.contains("default/shared/rule/0")
    })
    .await;
}

/// Envoy Gateway's Envoy writes the `x-ratelimit-*` headers itself from the statuses
/// (`enable_x_ratelimit_headers`): over xDS sluice adds none of its own unless asked,
/// so each header reaches the client once.
#[tokio::test]
async fn over_xds_the_x_ratelimit_headers_are_left_to_envoy_unless_asked_for() {
    let Some((xds, certs)) = gateway_xds() else {
        return;
    };
    let by_default = sluice(&xds, &certs, &[]);
    let asked = sluice(&xds, &certs, &["--response-headers", "draft03"]);
    for server in [&by_default, &asked] {
        until_ready(server, "ready once the first version is in").await;
    }
    let mut c = by_default.client().await;
    let r = call(&mut c, header_request()).await;
    assert_eq!(r.overall_code, OK);
    assert!(
        r.response_headers_to_add.is_empty(),
        "{:?}",
        r.response_headers_to_add
    );
    // What Envoy's headers are written from is all there.
    let status = &r.statuses[0];
    assert_eq!(status.current_limit.as_ref().unwrap().requests_per_unit, 3);
    assert_eq!(status.limit_remaining, 2);
    assert!(status.duration_until_reset.is_some());

    let mut c = asked.client().await;
    let r = call(&mut c, header_request()).await;
    let names: Vec<&str> = r
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        ]
    );
}

#[tokio::test]
async fn a_bad_version_is_nacked_once_per_response_and_the_last_good_keeps_serving() {
    let Some((xds, certs)) = gateway_xds() else {
        return;
    };
    let server = sluice(&xds, &certs, &[]);
    until_ready(&server, "first version in").await;

    assert_eq!(xds.publish_files(&[fixture("bad.yaml")]), "2");
    eventually(WAIT, "a NACK of version 2", || async {
        nacks(&xds, "2") > 0
    })
    .await;
    let refusal = xds
        .requests()
        .into_iter()
        .find(|r| r["error_message"].is_string())
        .unwrap();
    assert_eq!(
        refusal["version_info"], "1",
        "a NACK names the last good version"
    );
    assert_eq!(refusal["error_code"], 3);
    let message = refusal["error_message"].as_str().unwrap();
    assert!(
        message.contains("xds:default/eg/http") && message.contains("duplicate descriptor"),
        "{message}"
    );

    // go-control-plane's snapshot cache (Envoy Gateway's) answers a NACK, which names
    // the last good version, by sending the refused version again at once, each time
    // as a new response. Sluice answers each response with one NACK, and waits longer
    // before each NACK of the same refusal (250 ms, doubling): no response is
    // answered twice, no request is sent unprompted, and the exchange does not spin.
    eventually(WAIT, "five NACKs of version 2", || async {
        nacks(&xds, "2") >= 5
    })
    .await;
    let sent: Vec<serde_json::Value> = xds
        .responses()
        .into_iter()
        .filter(|r| r["version_info"] == "2")
        .collect();
    let refusals: Vec<serde_json::Value> = xds
        .requests()
        .into_iter()
        .filter(|r| r["error_message"].is_string())
        .collect();
    let stream = &sent[0]["stream"];
    assert!(sent.iter().chain(&refusals).all(|r| &r["stream"] == stream));
    let nonces: Vec<&str> = refusals
        .iter()
        .map(|r| r["response_nonce"].as_str().unwrap())
        .collect();
    let mut unique = nonces.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        nonces.len(),
        "a response NACKed twice: {nonces:?}"
    );
    for n in &nonces {
        assert!(
            sent.iter().any(|r| r["nonce"] == *n),
            "NACK of nonce {n}, no response of version 2 had it: {sent:?}"
        );
    }
    // Every response of version 2 is NACKed but the last, whose NACK may be waiting.
    assert!(
        sent.len() - nonces.len() <= 1,
        "{} responses of version 2, {} NACKs",
        sent.len(),
        nonces.len()
    );
    let at: Vec<i64> = refusals
        .iter()
        .map(|r| r["unix_nanos"].as_i64().unwrap())
        .collect();
    for (k, gap) in at.windows(2).map(|w| w[1] - w[0]).take(4).enumerate() {
        let pause = Duration::from_millis(250 << k).as_nanos() as i64;
        assert!(
            gap >= pause * 9 / 10,
            "NACK {} came {gap} ns after the one before",
            k + 2
        );
    }
    // Counted and logged once.
    assert_eq!(
        metric(
            &server,
            r#"sluice_policy_reloads_total{result="error",source="xds"}"#
        ),
        Some(1.0)
    );
    let logged = server
        .drain_lines()
        .iter()
        .filter(|l| l.contains("xDS version refused"))
        .count();
    assert_eq!(logged, 1);
    // Version 1 still serves, and so does readiness.
    let mut c = server.client().await;
    let r = call(&mut c, header_request()).await;
    assert_eq!(first_limit(&r), Some(3));
    assert!(ready(&server));
    // /debug/policies says the version serving is the last good one, and why.
    let debug = || {
        let (_, body) = http(&server.http, "GET", "/debug/policies", "");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let p = debug();
    assert_eq!(p["refused"][0]["source"], "xds", "{p}");
    let error = p["refused"][0]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("version 2: ") && error.contains("duplicate descriptor"),
        "{p}"
    );
    let served = p["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["domain"] == DOMAIN);
    let served = served.unwrap_or_else(|| panic!("{p}"));
    assert_eq!(served["origin"], "xds", "{p}");
    assert_eq!(served["status"]["state"], "last_good", "{p}");

    // A good version is taken at once.
    xds.publish(
        &std::fs::read_to_string(fixture("gateway.yaml"))
            .unwrap()
            .replacen("requests_per_unit: 3", "requests_per_unit: 4", 1),
    );
    header_limit_becomes(&server, 4, "version 3 applied").await;
    assert_eq!(debug()["refused"], serde_json::json!([]));
}

/// A version holding limits that replace each other (both would drop out of a
/// request matching both) is NACKed with the words `sluice validate` gives for the
/// same limits in a file, and the last good version keeps serving.
#[tokio::test]
async fn a_version_whose_limits_replace_each_other_is_nacked() {
    let Some((xds, certs)) = gateway_xds() else {
        return;
    };
    let server = sluice(&xds, &certs, &[]);
    until_ready(&server, "first version in").await;

    let circle = format!(
        "name: {DOMAIN}\ndomain: {DOMAIN}\ndescriptors:\n  - key: plan\n    rate_limit: {{name: plan_cap, replaces: [{{name: ip_cap}}], requests_per_unit: 60, unit: MINUTE}}\n  - key: ip\n    rate_limit: {{name: ip_cap, replaces: [{{name: plan_cap}}], requests_per_unit: 5, unit: SECOND}}\n"
    );
    assert_eq!(xds.publish(&circle), "2");
    eventually(WAIT, "a NACK of version 2", || async {
        nacks(&xds, "2") > 0
    })
    .await;
    let refusal = xds
        .requests()
        .into_iter()
        .find(|r| r["error_message"].is_string())
        .unwrap();
    let message = refusal["error_message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "limits 'plan_cap' (xds:{DOMAIN}, key 'plan' with no value) and 'ip_cap' (xds:{DOMAIN}, key 'ip' with no value) replace each other: when both match one request neither applies"
        )),
        "{message}"
    );
    // Version 1 still serves.
    let mut c = server.client().await;
    let r = call(&mut c, header_request()).await;
    assert_eq!(first_limit(&r), Some(3));
}

/// A restarted server numbers its versions from 1 again: its version 1, with other
/// contents than the version 1 taken before, is applied, logged and counted as a new
/// version; sent again with the same contents (the server restarted once more), it is
/// not counted again.
#[tokio::test]
async fn a_restarted_xds_server_is_reconnected_and_its_first_version_taken() {
    let Some((mut xds, certs)) = gateway_xds() else {
        return;
    };
    // --prometheus-addr adds envoyproxy/ratelimit's series to /metrics.
    let server = sluice(&xds, &certs, &["--prometheus-addr", "127.0.0.1:0"]);
    until_ready(&server, "first version in").await;
    let taken = |server: &Server| {
        (
            metric(
                server,
                r#"sluice_policy_reloads_total{result="ok",source="xds"}"#,
            ),
            metric(server, "ratelimit_service_config_load_success"),
        )
    };
    assert_eq!(taken(&server), (Some(1.0), Some(1.0)));

    xds.kill();
    // Meanwhile the last good policy serves.
    let mut c = server.client().await;
    let r = call(&mut c, header_request()).await;
    assert_eq!(first_limit(&r), Some(3));
    eventually(WAIT, "the lost stream logged", || async {
        server
            .drain_lines()
            .iter()
            .any(|l| l.contains("xDS stream lost"))
    })
    .await;

    // The new server numbers from 1 again, with other contents.
    let dir = tempfile::tempdir().unwrap();
    let changed = gateway_limited_to(&dir, 7);
    xds.restart(Some(std::slice::from_ref(&changed)));
    header_limit_becomes(&server, 7, "the restarted server's version 1 applied").await;
    assert_eq!(
        xds.requests()[0]["version_info"],
        "",
        "a new stream starts from no version"
    );
    server
        .wait_line(WAIT, "the new version 1 logged", |l| {
            l.contains("xDS version accepted") && l.contains("version=1")
        })
        .await;
    eventually(WAIT, "the new version 1 counted", || async {
        taken(&server) == (Some(2.0), Some(2.0))
    })
    .await;

    // The same contents as version 1 again: ACKed, neither logged nor counted.
    xds.restart(Some(&[changed]));
    eventually(WAIT, "version 1 ACKed again", || async {
        xds.requests()
            .iter()
            .any(|r| r["version_info"] == "1" && r["response_nonce"] != "")
    })
    .await;
    assert_eq!(taken(&server), (Some(2.0), Some(2.0)));
    assert!(
        !server
            .drain_lines()
            .iter()
            .any(|l| l.contains("xDS version accepted")),
        "the same version and contents are no news"
    );
}

/// A restarted server whose first version is refused, and whose next version
/// carries the number last accepted from the server before: that version is sent
/// and applied. A NACK naming the old server's version would tell the new one it
/// is already here, and it would never be sent.
#[tokio::test]
async fn after_a_restart_and_a_refusal_the_next_version_is_taken_whatever_its_number() {
    let Some((mut xds, certs)) = gateway_xds() else {
        return;
    };
    let server = sluice(&xds, &certs, &[]);
    until_ready(&server, "first version in").await;
    let dir = tempfile::tempdir().unwrap();
    let five = gateway_limited_to(&dir, 5);
    assert_eq!(xds.publish_files(&[five]), "2");
    header_limit_becomes(&server, 5, "version 2 applied").await;

    xds.restart(Some(&[fixture("bad.yaml")]));
    eventually(WAIT, "the restarted server's version 1 NACKed", || async {
        nacks(&xds, "1") > 0
    })
    .await;
    let seven = gateway_limited_to(&dir, 7);
    assert_eq!(xds.publish_files(&[seven]), "2");
    header_limit_becomes(&server, 7, "the restarted server's version 2 applied").await;
}

/// Envoy Gateway's certificates renewed under a new authority (the Secret's files
/// replaced, the server restarted with the new ones) are read at the next
/// reconnection, without a restart; meanwhile `sluice_xds_connected` shows the
/// stream down.
#[tokio::test]
async fn a_renewed_certificate_authority_is_read_when_reconnecting() {
    let Some((mut xds, certs)) = gateway_xds() else {
        return;
    };
    let server = sluice(&xds, &certs, &[]);
    until_ready(&server, "first version in").await;
    assert_eq!(metric(&server, "sluice_xds_connected"), Some(1.0));

    xds.kill();
    eventually(WAIT, "the lost stream shown", || async {
        metric(&server, "sluice_xds_connected") == Some(0.0)
    })
    .await;
    let renewed = Certs::envoy_gateway();
    for name in [
        "ca.crt",
        "envoy-gateway.crt",
        "envoy-gateway.key",
        "tls.crt",
        "tls.key",
    ] {
        write_atomic(
            &certs.path(name),
            &std::fs::read_to_string(renewed.path(name)).unwrap(),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let changed = gateway_limited_to(&dir, 5);
    xds.restart(Some(&[changed]));
    header_limit_becomes(&server, 5, "the renewed server's version applied").await;
    assert_eq!(metric(&server, "sluice_xds_connected"), Some(1.0));
}

#[tokio::test]
async fn readiness_waits_for_the_first_version_unless_started_without() {
    let Some((mut xds, certs)) = gateway_xds() else {
        return;
    };
    xds.kill();
    let waiting = sluice(&xds, &certs, &[]);
    let forced = sluice(&xds, &certs, &["--xds-start-without-config"]);
    until_ready(&forced, "ready without a config when told to").await;
    assert!(!ready(&waiting), "not ready before any version");
    // Requests are answered meanwhile: no domain is known yet.
    let mut c = waiting.client().await;
    assert_eq!(call(&mut c, header_request()).await.overall_code, OK);

    xds.restart(None);
    until_ready(&waiting, "ready once the server is up").await;
}

#[tokio::test]
async fn a_server_of_another_authority_is_refused() {
    let Some((xds, certs)) = gateway_xds() else {
        return;
    };
    let server = sluice_trusting(&xds, &certs, "other-ca.crt", &[]);
    eventually(WAIT, "the refused certificate logged", || async {
        server
            .drain_lines()
            .iter()
            .any(|l| l.contains("xDS stream lost") && l.to_lowercase().contains("certificate"))
    })
    .await;
    assert!(!ready(&server));
    assert!(xds.requests().is_empty());
}

/// A version refused for clashing with a policy file is taken once the file is
/// fixed, though the server sends nothing new.
#[tokio::test]
async fn a_version_refused_for_a_file_is_taken_once_the_file_is_fixed() {
    let Some(bin) = binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("xds.yaml");
    std::fs::write(
        &config,
        "name: xd\ndomain: xd\ndescriptors:\n  - key: user\n    rate_limit: {unit: MINUTE, requests_per_unit: 4}\n",
    )
    .unwrap();
    let xds = XdsServer::start_plain(&bin, &[config]);
    let url = format!("http://{}", xds.addr);
    let file = |key: &str| {
        format!("domain: xd\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: 9}}\n")
    };
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, file("user")).unwrap();
    let server = Server::start_with(
        tempfile::tempdir().unwrap(),
        std::slice::from_ref(&policy),
        &["--xds-server", &url, "--xds-node-id", "envoy-ratelimit"],
    );
    eventually(WAIT, "the clashing version NACKed", || async {
        nacks(&xds, "1") > 0
    })
    .await;
    assert!(!ready(&server), "no version taken yet");

    std::fs::write(&policy, file("path")).unwrap();
    until_ready(&server, "ready once the fixed file lets version 1 in").await;
    let mut c = server.client().await;
    let r = call(&mut c, request("xd", vec![desc(&[("user", "u")])])).await;
    assert_eq!(first_limit(&r), Some(4), "the xDS version serves");
    // The ACK leaves once the version is applied (readiness comes first), and
    // reaches the server when the machine gets to it.
    eventually(WAIT, "version 1 ACKed", || async {
        xds.requests()
            .last()
            .is_some_and(|r| r["version_info"] == "1" && r["error_message"].is_null())
    })
    .await;
}

#[tokio::test]
async fn plain_http_xds_and_bad_flags() {
    let Some(bin) = binary() else { return };
    let xds = XdsServer::start_plain(&bin, &gateway_files());
    let url = format!("http://{}", xds.addr);
    // The default node id is not the one the snapshot is for: subscribed, never
    // answered, not ready.
    let unknown_node =
        Server::start_with(tempfile::tempdir().unwrap(), &[], &["--xds-server", &url]);
    eventually(WAIT, "subscribed as node sluice", || async {
        xds.requests().iter().any(|r| r["node_id"] == "sluice")
    })
    .await;
    assert!(!ready(&unknown_node));
    // The log names the likely mistake.
    unknown_node
        .wait_line(WAIT, "the unanswered subscription logged", |l| {
            l.contains("no answer from the xDS server") && l.contains("node=sluice")
        })
        .await;
    let server = Server::start_with(
        tempfile::tempdir().unwrap(),
        &[],
        &["--xds-server", &url, "--xds-node-id", "envoy-ratelimit"],
    );
    until_ready(&server, "ready over plain http").await;

    // https:// without an authority, and an unreadable key, stop start-up.
    for (args, says) in [
        (vec!["--xds-server", "https://localhost:1"], "--xds-tls-ca"),
        (
            vec!["--xds-server", "localhost:1"],
            "expected http://HOST:PORT",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("serve")
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
    let certs = Certs::envoy_gateway();
    let ca = certs.path("ca.crt");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "serve",
            "--xds-server",
            "https://localhost:1",
            "--xds-tls-ca",
        ])
        .arg(&ca)
        .arg("--xds-tls-cert")
        .arg(&ca)
        .arg("--xds-tls-key")
        .arg(&ca)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--xds-tls-key") && stderr.contains("no PEM private key"),
        "{stderr}"
    );
}

/// The Envoy Gateway release whose translator outputs are served (downloaded by
/// scripts/install-test-xds.sh into Go's module cache).
const EG_VERSION: &str = "v1.9.1";

/// Envoy Gateway's translator outputs (`internal/xds/translator/testdata/out/
/// ratelimit-config/` of github.com/envoyproxy/gateway): `SLUICE_EG_RATELIMIT_CONFIGS`,
/// else the release in Go's module cache.
fn translator_outputs() -> Option<Vec<PathBuf>> {
    let dir = match std::env::var_os("SLUICE_EG_RATELIMIT_CONFIGS") {
        Some(d) => PathBuf::from(d),
        None => {
            let out = std::process::Command::new("go")
                .args(["env", "GOMODCACHE"])
                .output()
                .ok()?;
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
                .join(format!("github.com/envoyproxy/gateway@{EG_VERSION}"))
                .join("internal/xds/translator/testdata/out/ratelimit-config")
        }
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        if std::env::var_os("SLUICE_REQUIRE_XDS").is_some() {
            panic!(
                "SLUICE_REQUIRE_XDS is set but {} is missing: run scripts/install-test-xds.sh",
                dir.display()
            );
        }
        eprintln!("skipped: no {}", dir.display());
        return None;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && !p.to_string_lossy().ends_with(".routes.yaml")
        })
        .collect();
    files.sort();
    Some(files)
}

/// One limit of a config: its domain, the entries that lead to it (a key with no
/// value gets one), and its requests per unit and unit, or `None` when unlimited.
type Leaf = (String, Vec<(String, String)>, Option<(u32, i32)>);

fn leaves(file: &std::path::Path) -> Vec<Leaf> {
    fn walk(
        domain: &str,
        nodes: &yaml_rust2::Yaml,
        path: &mut Vec<(String, String)>,
        out: &mut Vec<Leaf>,
    ) {
        for node in nodes.as_vec().into_iter().flatten() {
            let key = node["key"].as_str().unwrap_or_default().to_string();
            let value = match node["value"].as_str() {
                Some(v) if !v.is_empty() => v.to_string(),
                _ => "any-value".to_string(),
            };
            path.push((key, value));
            let limit = &node["rate_limit"];
            if limit.as_hash().is_some() {
                let unit = match limit["unit"].as_str().unwrap_or_default() {
                    "SECOND" => 1,
                    "MINUTE" => 2,
                    "HOUR" => 3,
                    "DAY" => 4,
                    "MONTH" => 5,
                    "YEAR" => 6,
                    "WEEK" => 7,
                    other => panic!("{domain}: unit {other}"),
                };
                let n = limit["requests_per_unit"].as_i64().unwrap_or_default() as u32;
                let unlimited = limit["unlimited"].as_bool().unwrap_or(false);
                out.push((
                    domain.to_string(),
                    path.clone(),
                    (!unlimited).then_some((n, unit)),
                ));
            }
            walk(domain, &node["descriptors"], path, out);
            path.pop();
        }
    }
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    for doc in yaml_rust2::YamlLoader::load_from_str(&text).unwrap() {
        let domain = doc["domain"].as_str().unwrap_or_default().to_string();
        walk(&domain, &doc["descriptors"], &mut Vec::new(), &mut out);
    }
    out
}

/// Every RateLimitConfig Envoy Gateway's translator writes in its tests is accepted
/// over xDS, and each of its limits answers a request for its entries with that
/// limit.
#[tokio::test]
async fn envoy_gateways_translator_outputs_are_accepted_and_enforced() {
    let Some(files) = translator_outputs() else {
        return;
    };
    let Some(bin) = binary() else { return };
    assert!(files.len() >= 20, "{files:?}");
    let xds = XdsServer::start_plain(&bin, &[]);
    let url = format!("http://{}", xds.addr);
    let server = Server::start_with(
        tempfile::tempdir().unwrap(),
        &[],
        &["--xds-server", &url, "--xds-node-id", "envoy-ratelimit"],
    );
    let mut c = server.client().await;
    let mut checked = 0;
    for file in &files {
        let version = xds.publish_files(std::slice::from_ref(file));
        eventually(
            WAIT,
            &format!("an answer to {}", file.display()),
            || async {
                let requests = xds.requests();
                requests.iter().any(|r| r["error_message"].is_string())
                    || requests.iter().any(|r| r["version_info"] == version)
            },
        )
        .await;
        let refused: Vec<_> = xds
            .requests()
            .into_iter()
            .filter(|r| r["error_message"].is_string())
            .collect();
        assert!(
            refused.is_empty(),
            "{} refused: {refused:?}",
            file.display()
        );
        for (domain, entries, limit) in leaves(file) {
            let pairs: Vec<(&str, &str)> = entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let r = call(&mut c, request(&domain, vec![desc(&pairs)])).await;
            let got = r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit));
            assert_eq!(got, limit, "{}: {domain} {entries:?}", file.display());
            checked += 1;
        }
    }
    assert!(checked >= files.len(), "{checked} limits checked");
}
