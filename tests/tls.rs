//! TLS on the gRPC and HTTP ports: server certificates, client certificates (mutual
//! TLS), and certificates renewed in place the way a Kubernetes Secret update does
//! it, while calls go on; certificates out of their validity period refused; and
//! connections in their handshake capped.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use common::tls::{
    client_config, connect, der, mutual_tls_flags, served, tls_flags, Ca, Pair, SecretVolume,
};
use common::*;
use prost::Message;
use sluice::pb::envoy::service::ratelimit::v3::RateLimitResponse;

const POLICY: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000000}\n";
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

fn start(args: &[String]) -> Server {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(POLICY, &args)
}

/// An HTTP/2 connection over TLS to the gRPC port.
async fn h2_tls(
    server: &Server,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<h2::client::SendRequest<Bytes>> {
    let tls = connect(&server.grpc, config).await?;
    let (h2, conn) = h2::client::handshake(tls)
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(h2)
}

/// One ShouldRateLimit call on `h2`: its overall code, or what went wrong.
async fn should_rate_limit(h2: &mut h2::client::SendRequest<Bytes>) -> Result<i32, String> {
    let message = request("d", vec![desc(&[("k", "v")])]).encode_to_vec();
    let mut body = BytesMut::new();
    body.put_u8(0);
    body.put_u32(message.len() as u32);
    body.put_slice(&message);
    let req = http::Request::post(format!("https://localhost{SHOULD_RATE_LIMIT}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let mut ready = h2.clone().ready().await.map_err(|e| e.to_string())?;
    let (resp, mut send) = ready.send_request(req, false).map_err(|e| e.to_string())?;
    send.send_data(body.freeze(), true)
        .map_err(|e| e.to_string())?;
    let mut resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .map_err(|_| "no answer in 10 s".to_string())?
        .map_err(|e| e.to_string())?
        .into_body();
    let mut answer = BytesMut::new();
    while let Some(d) = resp.data().await {
        answer.extend_from_slice(&d.map_err(|e| e.to_string())?);
    }
    let trailers = resp.trailers().await.map_err(|e| e.to_string())?;
    let status = trailers.as_ref().and_then(|t| t.get("grpc-status"));
    if status.is_none_or(|s| s != "0") || answer.len() < 5 {
        return Err(format!("gRPC status {status:?}"));
    }
    RateLimitResponse::decode(&answer[5..])
        .map(|r| r.overall_code)
        .map_err(|e| e.to_string())
}

/// A fresh TLS connection and one call on it.
async fn call_once(server: &Server, config: Arc<rustls::ClientConfig>) -> Result<i32, String> {
    let mut h2 = h2_tls(server, config).await.map_err(|e| e.to_string())?;
    should_rate_limit(&mut h2).await
}

fn metric(server: &Server, line_start: &str) -> Option<u64> {
    let (_, m) = http(&server.http, "GET", "/metrics", "");
    m.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The gRPC port's certificate reloads with `result` (`ok`, `error`).
fn grpc_reloads(server: &Server, result: &str) -> Option<u64> {
    let series = format!(r#"sluice_tls_reloads_total{{port="grpc",result="{result}"}}"#);
    metric(server, &series)
}

#[tokio::test]
async fn the_grpc_port_serves_tls_and_refuses_plain_text() {
    let ca = Ca::new("test-ca");
    let pair = ca.server();
    let server = start(&tls_flags("grpc", &pair.cert, &pair.key));
    let config = client_config(&ca.cert(), None, b"h2");
    assert_eq!(call_once(&server, config.clone()).await, Ok(OK));
    // The served certificate is the one configured, offered with ALPN h2.
    let tls = connect(&server.grpc, config).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(
        tls.get_ref().1.peer_certificates().unwrap()[0].to_vec(),
        der(&pair.cert)
    );
    // HTTP/2 in plain text is not understood.
    let tcp = tokio::net::TcpStream::connect(&server.grpc).await.unwrap();
    let plain = tokio::time::timeout(Duration::from_secs(10), async {
        let (mut h2, conn) = h2::client::handshake(tcp)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        should_rate_limit(&mut h2).await
    })
    .await
    .expect("refused in time");
    assert!(plain.is_err(), "{plain:?}");
}

#[tokio::test]
async fn tls_1_2_is_served_too() {
    let ca = Ca::new("test-ca");
    let pair = ca.server();
    let server = start(&tls_flags("grpc", &pair.cert, &pair.key));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der(&ca.cert()).into()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let config = Arc::new(config);
    let tls = connect(&server.grpc, config.clone()).await.unwrap();
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert_eq!(call_once(&server, config).await, Ok(OK));
}

#[tokio::test]
async fn mutual_tls_requires_a_certificate_the_client_ca_signed() {
    let ca = Ca::new("test-ca");
    let clients = Ca::new("client-ca");
    let other = Ca::new("other-ca");
    let pair = ca.server();
    let server = start(&mutual_tls_flags("grpc", &pair, &clients.cert()));
    let envoy = clients.client("envoy");
    let with = |p: Option<&Pair>| client_config(&ca.cert(), p, b"h2");
    assert_eq!(call_once(&server, with(Some(&envoy))).await, Ok(OK));
    let none = call_once(&server, with(None)).await;
    assert!(none.is_err(), "no client certificate: {none:?}");
    let stranger = other.client("stranger");
    let wrong = call_once(&server, with(Some(&stranger))).await;
    assert!(wrong.is_err(), "a certificate of another CA: {wrong:?}");
}

/// A client whose certificate the gRPC port refuses fails every call, and Envoy then
/// fails open: the refusal is logged as a warning with the peer and the reason, not
/// only counted, so an operator sees why nothing is limited. So is a client that
/// refuses the port's certificate.
#[tokio::test]
async fn a_refused_certificate_is_logged_with_the_peer_and_the_reason() {
    let ca = Ca::new("test-ca");
    let clients = Ca::new("client-ca");
    let other = Ca::new("other-ca");
    let pair = ca.server();
    let server = start(&mutual_tls_flags("grpc", &pair, &clients.cert()));
    let stranger = other.client("stranger");
    let wrong = call_once(&server, client_config(&ca.cert(), Some(&stranger), b"h2")).await;
    assert!(wrong.is_err(), "a certificate of another CA: {wrong:?}");
    let lines = server
        .wait_line(
            Duration::from_secs(10),
            "the refused client certificate",
            |l| l.contains("WARN") && l.contains("the client's certificate is not accepted"),
        )
        .await;
    let line = lines.last().unwrap();
    assert!(line.contains("127.0.0.1:"), "the peer is named: {line}");
    assert!(
        line.contains("UnknownIssuer"),
        "the reason is given: {line}"
    );

    // A client that trusts another CA refuses the port's certificate.
    let server = start(&tls_flags("grpc", &pair.cert, &pair.key));
    let distrust = call_once(&server, client_config(&other.cert(), None, b"h2")).await;
    assert!(
        distrust.is_err(),
        "a client trusting another CA: {distrust:?}"
    );
    server
        .wait_line(
            Duration::from_secs(10),
            "the client refusing the port's certificate",
            |l| l.contains("WARN") && l.contains("does not accept this port's certificate"),
        )
        .await;
}

/// The certificate is renewed in place (the `..data` swap of a Secret volume) while
/// connections old and new make calls: none fails, connections open before the
/// swap go on, and new ones get the new certificate. Then files that do not load
/// leave it serving, logged and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_reaches_new_connections_while_calls_go_on() {
    let ca = Ca::new("test-ca");
    let first = ca.server();
    let second = ca.server();
    let volume = SecretVolume::new(&first, Some(&ca.cert()));
    let server = start(&tls_flags(
        "grpc",
        &volume.path("tls.crt"),
        &volume.path("tls.key"),
    ));
    let config = client_config(&ca.cert(), None, b"h2");
    assert_eq!(
        served(&server.grpc, config.clone()).await.unwrap(),
        der(&first.cert)
    );
    let mut open = h2_tls(&server, config.clone()).await.unwrap();
    assert_eq!(should_rate_limit(&mut open).await, Ok(OK));

    // Load: calls on the open connection and on new connections, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut load = Vec::new();
    for fresh in [false, true] {
        let (stop, done, failures, config) =
            (stop.clone(), done.clone(), failures.clone(), config.clone());
        let mut h2 = open.clone();
        let grpc = server.grpc.clone();
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let result = if fresh {
                    match connect(&grpc, config.clone()).await {
                        Ok(tls) => match h2::client::handshake(tls).await {
                            Ok((mut h2, conn)) => {
                                tokio::spawn(async move {
                                    let _ = conn.await;
                                });
                                should_rate_limit(&mut h2).await
                            }
                            Err(e) => Err(e.to_string()),
                        },
                        Err(e) => Err(e.to_string()),
                    }
                } else {
                    should_rate_limit(&mut h2).await
                };
                match result {
                    Ok(_) => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.lock().unwrap().push(e),
                }
            }
        }));
    }
    eventually(Duration::from_secs(10), "calls under way", || {
        let n = done.load(Ordering::Relaxed);
        async move { n >= 20 }
    })
    .await;
    volume.update(&second, Some(&ca.cert()));
    let config2 = config.clone();
    let grpc = server.grpc.clone();
    let want = der(&second.cert);
    eventually(
        Duration::from_secs(10),
        "new connections get the new certificate",
        || {
            let (config, grpc, want) = (config2.clone(), grpc.clone(), want.clone());
            async move { served(&grpc, config).await.is_ok_and(|c| c == want) }
        },
    )
    .await;
    let after = done.load(Ordering::Relaxed);
    eventually(
        Duration::from_secs(10),
        "calls go on after the swap",
        || {
            let n = done.load(Ordering::Relaxed);
            async move { n >= after + 20 }
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    assert_eq!(
        *failures.lock().unwrap(),
        Vec::<String>::new(),
        "no call failed"
    );
    // The connection opened before the swap still works.
    assert_eq!(should_rate_limit(&mut open).await, Ok(OK));
    assert_eq!(grpc_reloads(&server, "ok"), Some(1));

    // A key that is not the certificate's, then a certificate file that is not PEM:
    // each refused, and the second certificate serves on.
    let third = ca.server();
    volume.update(
        &Pair {
            cert: third.cert.clone(),
            key: first.key.clone(),
        },
        Some(&ca.cert()),
    );
    eventually(
        Duration::from_secs(10),
        "the mismatched pair counted",
        || async { grpc_reloads(&server, "error") == Some(1) },
    )
    .await;
    let garbage = ca.dir.path().join("garbage.crt");
    std::fs::write(&garbage, "not a certificate").unwrap();
    volume.update(
        &Pair {
            cert: garbage,
            key: third.key.clone(),
        },
        Some(&ca.cert()),
    );
    eventually(Duration::from_secs(10), "the garbage counted", || async {
        grpc_reloads(&server, "error") == Some(2)
    })
    .await;
    assert_eq!(
        served(&server.grpc, config.clone()).await.unwrap(),
        der(&second.cert)
    );
    assert_eq!(call_once(&server, config).await, Ok(OK));
    // Each refusal is logged (by the reader thread, maybe after the metric moved).
    for which in ["the mismatched pair", "the garbage"] {
        server
            .wait_line(
                Duration::from_secs(10),
                &format!("TLS files refused: {which}"),
                |l| l.contains("TLS files refused"),
            )
            .await;
    }
}

#[test]
fn bad_tls_files_stop_start_up_with_the_file_named() {
    let ca = Ca::new("test-ca");
    let pair = ca.server();
    let other = ca.server();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap();
    let missing = dir.path().join("missing.crt");
    for (args, want) in [
        (
            tls_flags("grpc", &missing, &pair.key),
            "missing.crt".to_string(),
        ),
        (
            tls_flags("http", &pair.cert, &other.key),
            "--http-tls".to_string(),
        ),
    ] {
        let out = serve_command(&dir.path().join("policy.yaml"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: started");
        assert!(stderr.contains(&want), "{args:?}: {stderr}");
    }
}

/// `/metrics` behind TLS, with client certificates required.
#[tokio::test]
async fn the_http_port_serves_https_with_client_certificates() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = Ca::new("test-ca");
    let pair = ca.server();
    let server = start(&mutual_tls_flags("http", &pair, &ca.cert()));
    let scraper = ca.client("prometheus");
    let get = |identity: Option<Pair>| {
        let config = client_config(&ca.cert(), identity.as_ref(), b"http/1.1");
        let addr = server.http.clone();
        async move {
            let mut tls = connect(&addr, config).await.map_err(|e| e.to_string())?;
            tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            tls.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
            Ok::<String, String>(String::from_utf8_lossy(&out).into_owned())
        }
    };
    let page = get(Some(scraper)).await.unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(
        page.contains("sluice_tls_reloads_total{port=\"http\",result=\"ok\"} 0"),
        "{page}"
    );
    let refused = get(None).await;
    assert!(
        refused.as_ref().map_or(true, |p| p.is_empty()),
        "{refused:?}"
    );
    // Plain HTTP is not served.
    let plain = std::panic::catch_unwind(|| http(&server.http, "GET", "/healthz", ""));
    assert!(plain.map_or(true, |(status, _)| status != 200));
}

/// `serve` with a server certificate out of its validity period: it stops before
/// listening, with exit status 1 and the file and the date named.
#[test]
fn an_expired_or_not_yet_valid_certificate_stops_start_up_with_its_date() {
    let ca = Ca::new("test-ca");
    let expired = ca.server_dated("200101000000Z", "200201000000Z");
    let early = ca.server_dated("20900101000000Z", "20910101000000Z");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap();
    for (port, pair, want) in [
        (
            "grpc",
            &expired,
            "the certificate expired at 2020-02-01T00:00:00Z",
        ),
        (
            "http",
            &early,
            "the certificate is not valid before 2090-01-01T00:00:00Z",
        ),
    ] {
        let mut child = serve_command(&dir.path().join("policy.yaml"))
            .args(["--admin-addr", "off"])
            .args(tls_flags(port, &pair.cert, &pair.key))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{port}: serve started with {}", pair.cert.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{port}: {stderr}");
        assert!(!stderr.contains("sluice listening"), "{port}: {stderr}");
        let named = format!("--{port}-tls-*: {}: {want}", pair.cert.display());
        assert!(
            stderr.contains(&named),
            "{port}: want {named:?} in {stderr}"
        );
    }
}

/// A key that is not the certificate's, left so, is refused: reported at a second
/// look a moment later (a key written after its certificate is no error), not a
/// whole `--reload-interval` later, after a SIGHUP as after a poll.
#[tokio::test]
async fn a_mismatched_key_is_reported_soon_after_a_sighup_despite_a_long_interval() {
    let ca = Ca::new("test-ca");
    let pair = ca.server();
    let other = ca.server();
    let mut flags = tls_flags("grpc", &pair.cert, &pair.key);
    flags.extend(["--reload-interval".to_string(), "1h".to_string()]);
    let server = start(&flags);
    std::fs::copy(&other.key, &pair.key).unwrap();
    server.signal(libc::SIGHUP);
    server
        .wait_line(Duration::from_secs(10), "the refusal logged", |l| {
            l.contains("TLS files refused") && l.contains("is not the key of")
        })
        .await;
    assert_eq!(grpc_reloads(&server, "error"), Some(1));
}

/// A renewal to an expired certificate is refused, logged and counted; the
/// certificate before it serves on, and the expiry gauge stays with it. A good
/// renewal after it is taken, and the gauge follows.
#[tokio::test]
async fn an_expired_renewal_is_refused_and_the_serving_certificate_kept() {
    let ca = Ca::new("test-ca");
    let first = ca.server_dated("200101000000Z", "20991231235959Z");
    let expired = ca.server_dated("200101000000Z", "200201000000Z");
    let second = ca.server_dated("200101000000Z", "20980101000000Z");
    let volume = SecretVolume::new(&first, None);
    let server = start(&tls_flags(
        "grpc",
        &volume.path("tls.crt"),
        &volume.path("tls.key"),
    ));
    let expiry = r#"sluice_tls_certificate_expiry_timestamp_seconds{port="grpc"}"#;
    // What SluiceTLSReloadRefused fires on: 1 while the refused files stay.
    let refused = r#"sluice_tls_refused{port="grpc"}"#;
    // 2099-12-31T23:59:59Z
    assert_eq!(metric(&server, expiry), Some(4_102_444_799));
    assert_eq!(metric(&server, refused), Some(0));
    let config = client_config(&ca.cert(), None, b"h2");

    volume.update(&expired, None);
    eventually(Duration::from_secs(10), "the refusal counted", || async {
        grpc_reloads(&server, "error") == Some(1)
    })
    .await;
    server
        .wait_line(Duration::from_secs(10), "the refusal logged", |l| {
            l.contains("TLS files refused") && l.contains("expired at 2020-02-01T00:00:00Z")
        })
        .await;
    // New connections still complete their handshake, with the first certificate.
    assert_eq!(
        served(&server.grpc, config.clone()).await.unwrap(),
        der(&first.cert)
    );
    assert_eq!(call_once(&server, config.clone()).await, Ok(OK));
    assert_eq!(metric(&server, expiry), Some(4_102_444_799));
    assert_eq!(metric(&server, refused), Some(1));

    volume.update(&second, None);
    eventually(Duration::from_secs(10), "the renewal taken", || async {
        grpc_reloads(&server, "ok") == Some(1)
    })
    .await;
    assert_eq!(
        served(&server.grpc, config.clone()).await.unwrap(),
        der(&second.cert)
    );
    // 2098-01-01T00:00:00Z
    assert_eq!(metric(&server, expiry), Some(4_039_372_800));
    assert_eq!(grpc_reloads(&server, "error"), Some(1));
    assert_eq!(metric(&server, refused), Some(0));
}

/// Connections to an HTTPS port that never send a ClientHello hold a slot of
/// `--http-max-connections` from accept: past it, the next is closed at once and
/// counted, and one that goes frees its slot for a client that completes its
/// handshake.
#[tokio::test]
async fn connections_still_in_their_handshake_count_against_the_http_cap() {
    use tokio::io::AsyncReadExt;
    let ca = Ca::new("test-ca");
    let pair = ca.server();
    let mut args = tls_flags("http", &pair.cert, &pair.key);
    // The handshake timeout far beyond the test, so only the cap can close them.
    args.extend(
        [
            "--http-max-connections",
            "2",
            "--handshake-timeout",
            "120s",
            "--prometheus-addr",
            "127.0.0.1:0",
        ]
        .map(String::from),
    );
    let server = start(&args);
    // Plain text, with slots of its own: where the refusals can be read.
    let prometheus = server.prometheus_addr();
    let refused = || {
        let (_, m) = http(&prometheus, "GET", "/metrics", "");
        sample(&m, "sluice_http_connections_refused_total", &[])
    };
    assert_eq!(refused(), Some(0.0));
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(tokio::net::TcpStream::connect(&server.http).await.unwrap());
    }
    // The third is closed without a byte, long before the handshake timeout.
    let mut third = tokio::net::TcpStream::connect(&server.http).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the third connection is closed at once: {read:?}"
    );
    assert_eq!(refused(), Some(1.0));
    // The first two are still open, waiting for a ClientHello.
    for tcp in &silent {
        assert!(
            matches!(tcp.try_read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a silent connection is still open"
        );
    }
    // One goes: a client that completes its handshake gets its slot.
    drop(silent.pop());
    let config = client_config(&ca.cert(), None, b"http/1.1");
    let addr = server.http.clone();
    eventually(Duration::from_secs(10), "a handshake completes", || {
        let (addr, config) = (addr.clone(), config.clone());
        async move { served(&addr, config).await.is_ok() }
    })
    .await;
}

/// A client certificate out of its validity period, for Redis: `serve` starts (the
/// store connects lazily and the file is read again at each connection), with a
/// warning naming the file and the date.
#[test]
fn an_expired_redis_client_certificate_is_warned_of_at_start() {
    let ca = Ca::new("test-ca");
    let expired = ca.server_dated("200101000000Z", "200201000000Z");
    // Nothing listens there: the warning comes before any connection.
    let url = format!(
        "rediss://127.0.0.1:35001/?tls_cert={}&tls_key={}#insecure",
        expired.cert.display(),
        expired.key.display()
    );
    let server = start(&["--redis".to_string(), url]);
    let warning = server
        .startup
        .iter()
        .find(|l| l.contains("client certificate presented to Redis 127.0.0.1:35001 has expired"))
        .unwrap_or_else(|| panic!("no warning in {:#?}", server.startup));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("2020-02-01T00:00:00Z"), "{warning}");
    assert!(
        warning.contains(&expired.cert.display().to_string()),
        "{warning}"
    );
}

/// Over TLS too, a request head sent a byte at a time is answered 408 and closed
/// once `--handshake-timeout` has passed, however often its bytes come.
#[tokio::test]
async fn an_https_request_sent_a_byte_at_a_time_is_closed_with_408() {
    let ca = Ca::new("test-ca");
    let pair = ca.server();
    let mut args = tls_flags("http", &pair.cert, &pair.key);
    args.extend(["--handshake-timeout", "1s"].map(String::from));
    let server = start(&args);
    let config = client_config(&ca.cert(), None, b"http/1.1");
    let tls = connect(&server.http, config).await.unwrap();
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-a: {}\r\n\r\n",
        "a".repeat(60)
    );
    let gap = Duration::from_millis(200);
    let (answer, took) = trickle(tls, head.as_bytes(), gap, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
}
