//! The gRPC and admin ports' connection limits: idle connections closed (with
//! GOAWAY on the gRPC port), clients that stop answering PINGs dropped, handshakes
//! bounded in time, and connections beyond `--grpc-max-connections` or
//! `--admin-max-connections` refused, each counted; connections that behave (as
//! Envoy's do) kept; and a process out of file descriptors waiting, not spinning,
//! until connections go.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use sluice::admin::pb;
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POLICY: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";

/// `sluice_grpc_connections_closed_total{port, reason}`.
fn closed_on(server: &Server, port: &str, reason: &str) -> u64 {
    let labels = [("port", port), ("reason", reason)];
    let name = "sluice_grpc_connections_closed_total";
    server
        .metric(name, &labels)
        .unwrap_or_else(|| panic!("no {name}{labels:?}")) as u64
}

fn closed(server: &Server, reason: &str) -> u64 {
    closed_on(server, "grpc", reason)
}

/// `sluice_grpc_connections{port}`.
fn open_on(server: &Server, port: &str) -> u64 {
    server
        .metric("sluice_grpc_connections", &[("port", port)])
        .unwrap_or_else(|| panic!("no sluice_grpc_connections{{port={port}}}")) as u64
}

fn open_connections(server: &Server) -> u64 {
    open_on(server, "grpc")
}

/// Reads until the server closes the connection; how long that took.
async fn until_closed(tcp: &mut tokio::net::TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + limit).into(), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection is still open after {limit:?}"),
        }
    }
}

/// The client's side of an HTTP/2 handshake, and nothing after it: no SETTINGS
/// acknowledgement, no PING answered.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// A health check (an empty message) on `h2`, answered: its HTTP status.
async fn health_check(server: &Server, h2: &mut h2::client::SendRequest<bytes::Bytes>) -> u16 {
    let req = server
        .grpc_post("/grpc.health.v1.Health/Check")
        .body(())
        .unwrap();
    let (resp, mut send) = h2.send_request(req, false).unwrap();
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    resp.await.unwrap().status().as_u16()
}

#[tokio::test]
async fn an_idle_connection_is_closed_with_goaway_and_a_busy_one_is_kept() {
    let server = Server::start(POLICY, &["--grpc-idle-timeout", "1s"]);
    // An idle client: one call, then nothing.
    let (mut h2, conn) = server.h2().await;
    let mut client = server.client().await;
    // A client that keeps calling, on a connection of its own.
    let busy = tokio::spawn(async move {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            call(&mut client, request("d", vec![desc(&[("k", "v")])])).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        client
    });
    health_check(&server, &mut h2).await;
    let started = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the idle connection is closed")
        .unwrap();
    let took = started.elapsed();
    assert!(ended.is_ok(), "closed cleanly with GOAWAY: {ended:?}");
    assert!(
        took >= Duration::from_millis(900),
        "not before the idle timeout: {took:?}"
    );
    // The busy connection went on through all of it.
    let mut client = busy.await.unwrap();
    call(&mut client, request("d", vec![desc(&[("k", "v")])])).await;
    assert_eq!(closed(&server, "idle"), 1);
}

#[tokio::test]
async fn a_client_that_stops_answering_pings_is_dropped() {
    let server = Server::start(
        POLICY,
        &[
            "--grpc-keepalive-interval",
            "200ms",
            "--grpc-keepalive-timeout",
            "300ms",
        ],
    );
    // h2's client answers PINGs, as Envoy does: kept past many intervals.
    let (h2, alive) = server.h2().await;
    let mut silent = tokio::net::TcpStream::connect(&server.grpc).await.unwrap();
    silent.write_all(PREFACE).await.unwrap();
    let took = until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(
        took >= Duration::from_millis(400),
        "closed after an unanswered PING: {took:?}"
    );
    assert!(!alive.is_finished(), "a client that answers is kept");
    let mut h2 = h2.ready().await.unwrap();
    assert_eq!(health_check(&server, &mut h2).await, 200);
    assert_eq!(closed(&server, "keepalive_timeout"), 1);
}

/// A sluice whose handshakes must finish within `timeout`, its `port` (`grpc` or
/// `admin`) serving TLS with `pair` when given.
fn with_handshake_timeout(timeout: &str, port: &str, pair: Option<&common::tls::Pair>) -> Server {
    let mut args = vec!["--handshake-timeout".to_string(), timeout.to_string()];
    if let Some(pair) = pair {
        args.extend(common::tls::tls_flags(port, &pair.cert, &pair.key));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(POLICY, &args)
}

#[tokio::test]
async fn a_handshake_that_does_not_finish_in_time_is_closed() {
    // The CA holds the files: it lives as long as the test.
    let ca = common::tls::Ca::new("test-ca");
    let pair = ca.server();
    for tls in [false, true] {
        let server = with_handshake_timeout("300ms", "grpc", tls.then_some(&pair));
        // Connected, and silent.
        let mut tcp = tokio::net::TcpStream::connect(&server.grpc).await.unwrap();
        let took = until_closed(&mut tcp, Duration::from_secs(5)).await;
        assert!(took >= Duration::from_millis(250), "tls {tls}: {took:?}");
        // The count follows the close: the client may see the close first.
        common::eventually(Duration::from_secs(5), "the close is counted", || async {
            closed(&server, "handshake_timeout") == 1
        })
        .await;
    }
}

#[tokio::test]
async fn connections_beyond_the_maximum_are_refused() {
    let server = Server::start(POLICY, &["--grpc-max-connections", "2"]);
    let a = server.client().await;
    let mut b = server.client().await;
    call(&mut b, request("d", vec![desc(&[("k", "v")])])).await;
    eventually(Duration::from_secs(5), "two connections open", || async {
        open_connections(&server) == 2
    })
    .await;
    let mut third = tokio::net::TcpStream::connect(&server.grpc).await.unwrap();
    third.write_all(PREFACE).await.unwrap();
    until_closed(&mut third, Duration::from_secs(5)).await;
    assert_eq!(closed(&server, "refused"), 1);
    assert_eq!(refusals_logged(&server, "--grpc-max-connections").await, 1);
    // Once one goes, a new one is served.
    drop(a);
    eventually(Duration::from_secs(5), "one connection closed", || async {
        open_connections(&server) == 1
    })
    .await;
    let mut c = server.client().await;
    let r = call(&mut c, request("d", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.overall_code, OK);
}

/// Clients that send half a request and fall silent can neither hold the HTTP port
/// past `--http-max-connections` nor keep their connections past
/// `--handshake-timeout`; the gRPC port answers throughout.
#[tokio::test]
async fn http_connections_are_capped_and_silent_ones_closed() {
    let server = Server::start(
        POLICY,
        &["--http-max-connections", "2", "--handshake-timeout", "1s"],
    );
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut tcp = tokio::net::TcpStream::connect(&server.http).await.unwrap();
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-a: ")
            .await
            .unwrap();
        stalled.push(tcp);
    }
    // A third is closed unanswered.
    let mut third = tokio::net::TcpStream::connect(&server.http).await.unwrap();
    let _ = third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut answer));
    let _ = read.await.expect("the third connection is closed");
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    let mut c = server.client().await;
    let r = call(&mut c, request("d", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.overall_code, OK);
    // The silent ones are closed, and their slots serve again.
    for tcp in &mut stalled {
        until_closed(tcp, Duration::from_secs(10)).await;
    }
    let (status, m) = http(&server.http, "GET", "/metrics", "");
    assert_eq!(status, 200);
    assert_eq!(
        sample(&m, "sluice_http_connections_refused_total", &[]),
        Some(1.0)
    );
    assert_eq!(refusals_logged(&server, "--http-max-connections").await, 1);
}

/// Clients that send a request head, or a body, a byte at a time (each
/// gap well under `--handshake-timeout`) are answered 408 and closed once it has
/// passed, on the HTTP and the Prometheus port alike, and counted: they cannot hold
/// the slots the kubelet's probes need. A client that sends whole requests is kept
/// however long it goes on; one idle between them is closed without an answer.
#[tokio::test]
async fn requests_sent_a_byte_at_a_time_are_closed_with_408() {
    let server = Server::start(
        POLICY,
        &[
            // Room for a closed connection whose slot is still being given back.
            "--http-max-connections",
            "2",
            "--handshake-timeout",
            "1s",
            "--prometheus-addr",
            "127.0.0.1:0",
        ],
    );
    let gap = Duration::from_millis(200);
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-a: {}\r\n\r\n",
        "a".repeat(60)
    );
    for addr in [server.http.clone(), server.prometheus_addr()] {
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (answer, took) = trickle(tcp, head.as_bytes(), gap, Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{addr}: {answer}");
        assert!(
            took < Duration::from_secs(3),
            "{addr}: closed after {took:?}"
        );
    }
    // A /json head sent whole, its body a byte at a time.
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let mut tcp = tokio::net::TcpStream::connect(&server.http).await.unwrap();
    let json_head = format!(
        "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(json_head.as_bytes()).await.unwrap();
    let (answer, took) = trickle(tcp, body.as_bytes(), gap, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
    // As is a peer's question to /local-share/cut.
    let question = format!(r#"{{"replica":"{}","shard":0}}"#, "r".repeat(40));
    let mut tcp = tokio::net::TcpStream::connect(&server.http).await.unwrap();
    let cut_head = format!(
        "POST /local-share/cut HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        question.len()
    );
    tcp.write_all(cut_head.as_bytes()).await.unwrap();
    let (answer, took) = trickle(tcp, question.as_bytes(), gap, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
    // Whole requests, each within the bound, keep a connection past it.
    let mut tcp = tokio::net::TcpStream::connect(&server.http).await.unwrap();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\nok") {
            let mut buf = [0u8; 512];
            let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
                .await
                .expect("answered")
                .unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&buf[..n]);
        }
        assert!(answer.starts_with(b"HTTP/1.1 200"));
    }
    // Then idle: closed, with nothing sent.
    let (answer, _) = trickle(tcp, b"", gap, Duration::from_secs(10)).await;
    assert_eq!(answer, "");
    assert_eq!(http(&server.http, "GET", "/healthz", "").0, 200);
    let timed_out = [("reason", "request_timeout")];
    assert_eq!(
        server.metric("sluice_http_connections_closed_total", &timed_out),
        Some(4.0)
    );
}

/// A `/json` call held for its `leaky_bucket` turn is a server that has not yet
/// answered, not a silent client: it gets its answer however long past
/// `--handshake-timeout` its turn comes.
#[tokio::test]
async fn a_json_call_held_for_its_turn_outlives_the_silence_limit() {
    let policy = "domain: q\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky_bucket, burst: 5}\n";
    let server = Server::start(policy, &["--handshake-timeout", "1s"]);
    let body = r#"{"domain":"q","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    // The first four turns fall within 3 s of one another; the fourth waits out
    // most of them.
    let mut calls = Vec::new();
    for _ in 0..4 {
        let addr = server.http.clone();
        calls.push(std::thread::spawn(move || {
            let started = Instant::now();
            let (status, answer) = http(&addr, "POST", "/json", body);
            (status, answer, started.elapsed())
        }));
    }
    let mut longest = Duration::ZERO;
    for call in calls {
        let (status, answer, took) = call.join().unwrap();
        assert_eq!(status, 200, "after {took:?}: {answer}");
        longest = longest.max(took);
    }
    assert!(
        longest > Duration::from_secs(1),
        "a turn was held: {longest:?}"
    );
}

/// How many log lines so far say that connections past `flag` were refused.
async fn refusals_logged(server: &Server, flag: &str) -> usize {
    let said = format!("connection refused: {flag} are open");
    let lines = server.lines_until_reload().await;
    lines.iter().filter(|l| l.contains(&said)).count()
}

#[tokio::test]
async fn unfinished_request_bodies_are_bounded_in_bytes_and_time() {
    let server = Server::start(
        POLICY,
        &[
            "--grpc-max-buffered-request-bytes",
            "64KiB",
            "--handshake-timeout",
            "1s",
        ],
    );
    let (h2, _) = server.h2().await;
    let mut h2 = h2.ready().await.unwrap();
    // Eight calls that each send 20,000 bytes of a 40,000-byte message and stop:
    // no more than four fit in 64 KiB however they arrive.
    let mut begun = bytes::BytesMut::from(&[0u8, 0, 0, 0x9c, 0x40][..]);
    begun.resize(5 + 20_000, 7);
    let begun = begun.freeze();
    let mut calls = Vec::new();
    for _ in 0..8 {
        let req = server
            .grpc_post("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .body(())
            .unwrap();
        let (resp, mut send) = h2.send_request(req, false).unwrap();
        send.send_data(begun.clone(), false).unwrap();
        calls.push((resp, send));
    }
    // Which calls fit depends on how their frames interleave: the first's opening
    // frame may be held while the others fill the bound, and its rest refused.
    let (first, _) = calls.remove(0);
    let mut codes = Vec::new();
    for (resp, _send) in calls {
        codes.push(grpc_status_of(resp).await);
    }
    assert!(codes.iter().any(|c| c == "8"), "some refused: {codes:?}");
    assert!(
        server.metric("sluice_oversized_requests_total", &[]) >= Some(1.0),
        "refusals are counted"
    );
    // Envoy's requests arrive whole and are never counted (the crate's tests show
    // them answered while the bound is full).
    let mut client = server.client().await;
    let r = call(&mut client, request("d", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.overall_code, OK);
    codes.push(grpc_status_of(first).await);
    // Those that fit the bound are ended by the time limit.
    assert!(codes.iter().all(|c| c == "8" || c == "4"), "{codes:?}");
    let held = codes.iter().filter(|c| *c == "4").count();
    assert!((1..=4).contains(&held), "{codes:?}");
}

/// The `grpc-status` an unfinished call is ended with, within ten seconds.
async fn grpc_status_of(resp: h2::client::ResponseFuture) -> String {
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .expect("every unfinished call is ended")
        .unwrap();
    resp.headers()["grpc-status"].to_str().unwrap().to_string()
}

/// A gRPC health check over a connection of its own: `Ok` once answered SERVING.
async fn health_on(addr: &str) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|x| e(&x))?;
    let (h2, conn) = h2::client::handshake(tcp).await.map_err(|x| e(&x))?;
    tokio::spawn(conn);
    let req = http::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let mut h2 = h2.ready().await.map_err(|x| e(&x))?;
    let (resp, mut send) = h2.send_request(req, false).map_err(|x| e(&x))?;
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .map_err(|x| e(&x))?;
    let mut body = resp.await.map_err(|x| e(&x))?.into_body();
    let mut message = Vec::new();
    while let Some(data) = body.data().await {
        message.extend_from_slice(&data.map_err(|x| e(&x))?);
    }
    let trailers = body.trailers().await.map_err(|x| e(&x))?;
    let status = trailers.as_ref().and_then(|t| t.get("grpc-status"));
    // HealthCheckResponse { status: SERVING } after the 5-byte prefix.
    match (status, message.as_slice()) {
        (Some(s), [0, 0, 0, 0, 2, 8, 1]) if s == "0" => Ok(()),
        _ => Err(format!("answered {status:?} {message:?}")),
    }
}

/// Clients that connect to the admin port and send nothing (or half an HTTP/2
/// preface) hold their descriptors no longer than `--handshake-timeout`, in plain
/// text and over TLS, and the port serves on.
#[tokio::test]
async fn silent_admin_connections_are_closed_after_the_handshake_timeout() {
    // The CA holds the files: it lives as long as the test.
    let ca = common::tls::Ca::new("test-ca");
    let pair = ca.server();
    for tls in [false, true] {
        let server = with_handshake_timeout("1s", "admin", tls.then_some(&pair));
        let started = Instant::now();
        let mut silent = Vec::new();
        for _ in 0..20 {
            silent.push(tokio::net::TcpStream::connect(&server.admin).await.unwrap());
        }
        if !tls {
            silent[0].write_all(&PREFACE[..20]).await.unwrap();
        }
        for tcp in &mut silent {
            until_closed(tcp, Duration::from_secs(10)).await;
            let took = started.elapsed();
            assert!(took >= Duration::from_millis(800), "tls {tls}: {took:?}");
        }
        common::eventually(Duration::from_secs(5), "the closes are counted", || async {
            closed_on(&server, "admin", "handshake_timeout") == 20 && open_on(&server, "admin") == 0
        })
        .await;
        if !tls {
            health_on(&server.admin)
                .await
                .expect("the admin port serves");
        }
    }
}

/// Past `--admin-max-connections`, new admin connections are closed as soon as
/// accepted and counted, while Envoy's port answers; once one goes, the admin
/// port serves again.
#[tokio::test]
async fn admin_connections_beyond_the_maximum_are_refused() {
    let server = Server::start(
        POLICY,
        &["--admin-max-connections", "3", "--handshake-timeout", "60s"],
    );
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::net::TcpStream::connect(&server.admin).await.unwrap());
    }
    eventually(
        Duration::from_secs(5),
        "three admin connections open",
        || async { open_on(&server, "admin") == 3 },
    )
    .await;
    for _ in 0..5 {
        let mut more = tokio::net::TcpStream::connect(&server.admin).await.unwrap();
        let _ = more.write_all(PREFACE).await;
        until_closed(&mut more, Duration::from_secs(5)).await;
    }
    let mut client = server.client().await;
    let r = call(&mut client, request("d", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(closed_on(&server, "admin", "refused"), 5);
    assert_eq!(closed(&server, "refused"), 0, "the gRPC port refused none");
    // Logged once, not once per connection.
    assert_eq!(refusals_logged(&server, "--admin-max-connections").await, 1);
    drop(held.pop());
    eventually(
        Duration::from_secs(5),
        "one admin connection closed",
        || async { open_on(&server, "admin") == 2 },
    )
    .await;
    health_on(&server.admin)
        .await
        .expect("the admin port serves");
}

/// An admin connection with no call for `--grpc-idle-timeout` is closed; one whose
/// WatchDecisions stream is open, however quiet, is kept and still delivers.
#[tokio::test]
async fn idle_admin_connections_are_closed_and_open_streams_kept() {
    let server = Server::start(POLICY, &["--grpc-idle-timeout", "1s"]);
    let mut admin = server.admin_client().await;
    let mut decisions = admin
        .watch_decisions(pb::Filter::default())
        .await
        .expect("WatchDecisions")
        .into_inner();
    // An idle client: one call, then nothing.
    let tcp = tokio::net::TcpStream::connect(&server.admin).await.unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::post(format!(
        "http://{}/grpc.health.v1.Health/Check",
        server.admin
    ))
    .header("content-type", "application/grpc")
    .body(())
    .unwrap();
    let mut h2 = h2.ready().await.unwrap();
    let (resp, mut send) = h2.send_request(req, false).unwrap();
    send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .unwrap();
    let mut body = resp.await.unwrap().into_body();
    while body.data().await.is_some() {}
    let started = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the idle connection is closed")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(800), "{took:?}");
    // The stream's connection, older and silent all along, outlived it: a
    // decision still reaches the stream.
    let mut client = server.client().await;
    call(&mut client, request("d", vec![desc(&[("k", "v")])])).await;
    let decision = tokio::time::timeout(Duration::from_secs(5), decisions.message())
        .await
        .expect("the stream delivers")
        .expect("the stream is open");
    assert!(decision.is_some());
    assert_eq!(closed_on(&server, "admin", "idle"), 1);
}

/// An admin client that stops answering PINGs is dropped; one that answers is kept.
#[tokio::test]
async fn an_admin_client_that_stops_answering_pings_is_dropped() {
    let server = Server::start(
        POLICY,
        &[
            "--grpc-keepalive-interval",
            "200ms",
            "--grpc-keepalive-timeout",
            "300ms",
        ],
    );
    let tcp = tokio::net::TcpStream::connect(&server.admin).await.unwrap();
    let (_h2, conn) = h2::client::handshake(tcp).await.unwrap();
    let alive = tokio::spawn(conn);
    let mut silent = tokio::net::TcpStream::connect(&server.admin).await.unwrap();
    silent.write_all(PREFACE).await.unwrap();
    let took = until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(!alive.is_finished(), "a client that answers is kept");
}

/// The process's open descriptors.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The CPU time the process has spent, user and system.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // After the command name: state, then utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

/// Every port answers: ShouldRateLimit, `/metrics`, the admin port's health.
async fn answers(server: &Server) -> bool {
    let metrics = || -> std::io::Result<bool> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&server.http)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out.starts_with("HTTP/1.1 200"))
    };
    let url = format!("http://{}", server.grpc);
    let decided = async {
        let mut client = RateLimitServiceClient::connect(url).await.ok()?;
        let req = request("d", vec![desc(&[("k", "v")])]);
        client.should_rate_limit(req).await.ok()
    };
    let decided = tokio::time::timeout(Duration::from_secs(2), decided).await;
    matches!(decided, Ok(Some(_)))
        && metrics().unwrap_or(false)
        && health_on(&server.admin).await.is_ok()
}

/// With a low open-file limit, each port in turn filled with silent connections
/// until the process has no descriptor left: its accept loop waits instead of
/// retrying at once, so the process spends next to no CPU, and logs the failures
/// about once a second with their count; once the connections go, every port
/// answers again.
#[tokio::test]
async fn out_of_descriptors_the_accept_loops_wait_and_the_service_recovers() {
    const LIMIT: usize = 64;
    for port in ["admin", "grpc", "http"] {
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, POLICY).unwrap();
        // Caps above the limit, so that the descriptors run out.
        let mut cmd = Server::command(
            &[policy],
            &[
                "--admin-max-connections",
                "1000",
                "--grpc-max-connections",
                "1000",
                "--http-max-connections",
                "1000",
                "--handshake-timeout",
                "60s",
                "--reload-interval",
                "1h",
            ],
            &[],
        );
        limit_open_files(&mut cmd, LIMIT as u64);
        let server = Server::spawn(cmd, dir);
        let pid = server.child.id();
        let addr = match port {
            "admin" => &server.admin,
            "grpc" => &server.grpc,
            _ => &server.http,
        };
        let mut held = Vec::new();
        for _ in 0..LIMIT + 40 {
            held.push(std::net::TcpStream::connect(addr).unwrap());
        }
        eventually(
            Duration::from_secs(10),
            "every descriptor taken",
            || async { open_files(pid) >= LIMIT },
        )
        .await;
        server.drain_lines();
        // The rate is measured over a window, out of descriptors throughout.
        let (cpu, started) = (cpu_time(pid), Instant::now());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (spent, window) = (cpu_time(pid) - cpu, started.elapsed());
        assert!(open_files(pid) >= LIMIT, "{port}: still out of descriptors");
        assert!(
            spent < Duration::from_millis(300),
            "{port}: {spent:?} of CPU in {window:?} out of descriptors"
        );
        let failing: Vec<String> = server
            .drain_lines()
            .into_iter()
            .filter(|l| l.contains("accept failing"))
            .collect();
        assert!(
            !failing.is_empty() && failing.len() <= window.as_secs() as usize + 1,
            "{port}: about one line a second: {failing:#?}"
        );
        for line in &failing {
            assert!(line.contains(&format!("port=\"{port}\"")), "{line}");
            assert!(line.contains("failures="), "{line}");
        }
        drop(held);
        eventually(Duration::from_secs(10), "every port answers again", || {
            answers(&server)
        })
        .await;
    }
}
