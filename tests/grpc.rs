//! The gRPC port's own server on the wire: refusals a client can see (compressed,
//! undecodable, too large, unknown method) and the health service through shutdown.

use crate::common;

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use common::*;
use prost::Message;
use sluice::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const POLICY: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";
const RLQS_SERVICE: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;

/// Sends message bytes as they are and returns the answer's bytes.
#[derive(Clone, Copy)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

async fn raw_call(server: &Server, path: &'static str, body: Bytes) -> Result<Bytes, Status> {
    let channel = Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc.unary(
        tonic::Request::new(body),
        PathAndQuery::from_static(path),
        Raw,
    )
    .await
    .map(|r| r.into_inner())
}

#[tokio::test]
async fn an_undecodable_message_gets_invalid_argument() {
    let server = Server::start(POLICY, &[]);
    // Field 1 (domain, a string) sent as a varint.
    let err = raw_call(
        &server,
        SHOULD_RATE_LIMIT,
        Bytes::from_static(&[0x08, 0x05]),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("undecodable RateLimitRequest"),
        "{err:?}"
    );
    // Counted, as every INVALID_ARGUMENT is, and logged: Envoy answers its client
    // by failure_mode_deny, and nothing else would tell the operator why.
    assert_eq!(
        server.metric("sluice_invalid_requests_total", &[]),
        Some(1.0)
    );
    let lines = server
        .wait_line(Duration::from_secs(5), "undecodable", |l| {
            l.contains("undecodable ShouldRateLimit request refused")
        })
        .await;
    let line = lines.last().unwrap();
    assert!(line.contains("undecodable RateLimitRequest"), "{line}");
    // A well-formed but invalid request keeps its own message.
    let err = raw_call(&server, SHOULD_RATE_LIMIT, Bytes::new())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(err.message(), "domain must not be empty");
    assert_eq!(
        server.metric("sluice_invalid_requests_total", &[]),
        Some(2.0)
    );
}

/// The encoding of a one-entry request for `d` whose value is `value` with its
/// `!` replaced by `byte`: prost will not build a `String` that is not UTF-8.
fn with_byte(value: &str, byte: u8) -> Bytes {
    let mut bytes = request("d", vec![desc(&[("k", value)])]).encode_to_vec();
    let i = bytes.iter().position(|&b| b == b'!').expect("a `!`");
    bytes[i] = byte;
    Bytes::from(bytes)
}

/// Envoy copies header and query values into descriptors unchecked: a value that
/// is not UTF-8 is decided against its limit (read as `from_utf8_lossy` reads it),
/// not refused, which would make Envoy fail open on every limit of the request.
#[tokio::test]
async fn a_value_that_is_not_utf8_is_decided_against_its_limit() {
    let server = Server::start(POLICY, &[]);
    let answer = |bytes: Bytes| async {
        let reply = raw_call(&server, SHOULD_RATE_LIMIT, bytes)
            .await
            .expect("decided, not refused");
        RateLimitResponse::decode(reply).expect("a RateLimitResponse")
    };
    // `k` allows 5 a minute.
    for i in 0..5 {
        let r = answer(with_byte("evil!", 0xff)).await;
        assert_eq!(r.overall_code, OK, "call {i}");
        assert_eq!(r.statuses[0].limit_remaining, 4 - i);
    }
    let r = answer(with_byte("evil!", 0xff)).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    // Another bad byte in its place is read the same way: the same counter.
    let r = answer(with_byte("evil!", 0xfe)).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    // A valid value keeps its own.
    let mut c = server.client().await;
    let r = call(&mut c, request("d", vec![desc(&[("k", "evil")])])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        server.metric("sluice_invalid_requests_total", &[]),
        Some(0.0)
    );
}

/// Busy connections hold their answers back until the other connections have had
/// their turn (`sluice_grpc`'s `Deferred`): every call must still be answered, and
/// counted once.
#[tokio::test]
async fn bursts_of_calls_on_several_connections_are_all_answered() {
    let server = Server::start(POLICY, &[]);
    let clients = [server.client().await, server.client().await];
    let burst = (0..64)
        .flat_map(|_| clients.iter().cloned())
        .map(
            |mut c| async move { call(&mut c, request("d", vec![desc(&[("k", "burst")])])).await },
        );
    let answers = tokio::time::timeout(Duration::from_secs(20), futures::future::join_all(burst))
        .await
        .expect("every call of the burst is answered");
    assert_eq!(answers.len(), 128);
    let admitted = answers.iter().filter(|a| a.overall_code == OK).count();
    let denied = answers
        .iter()
        .filter(|a| a.overall_code == OVER_LIMIT)
        .count();
    assert_eq!(
        (admitted, denied),
        (5, 123),
        "exactly the limit is admitted"
    );
}

#[tokio::test]
async fn an_unknown_method_is_unimplemented() {
    let server = Server::start(POLICY, &[]);
    for path in [
        "/envoy.service.ratelimit.v3.RateLimitService/Nope",
        "/pb.Other/ShouldRateLimit",
    ] {
        let err = raw_call(&server, path, Bytes::new()).await.unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented, "{path}: {err:?}");
    }
}

#[tokio::test]
async fn a_message_over_max_request_bytes_is_refused() {
    let server = Server::start(POLICY, &["--max-request-bytes", "1KiB"]);
    let big = Bytes::from(vec![0u8; 1025]);
    let err = raw_call(&server, SHOULD_RATE_LIMIT, big).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("--max-request-bytes"), "{err:?}");
    // The operator sees it: counted each time, logged once (Envoy would answer its
    // client by failure_mode_deny, and sends the next such request at once).
    let err = raw_call(&server, SHOULD_RATE_LIMIT, Bytes::from(vec![0u8; 4096]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let oversized = server.metric("sluice_oversized_requests_total", &[]);
    assert_eq!(oversized, Some(2.0));
    let refused = |l: &str| l.contains("ShouldRateLimit request refused");
    let lines = server
        .wait_line(Duration::from_secs(5), "refused", refused)
        .await;
    let line = lines.last().unwrap();
    assert!(line.contains("larger than the limit of 1024"), "{line}");
    let again = server.drain_lines().into_iter().filter(|l| refused(l));
    assert_eq!(again.count(), 0);
    // The connection and the server are still fine, and a request within the limit
    // (a value of 900 bytes) is decided.
    let mut c = server.client().await;
    let value = "v".repeat(900);
    let r = call(&mut c, request("d", vec![desc(&[("k", &value)])])).await;
    assert_eq!(r.overall_code, OK);
}

/// The 5-byte prefix declares the message's length: one declared over the limit is
/// refused at once, before its bytes are sent; bytes past the limit are refused as
/// they arrive, whatever the prefix says.
#[tokio::test]
async fn an_oversized_request_is_refused_before_it_is_all_read() {
    let server = Server::start(POLICY, &[]);
    let (mut h2, _) = server.h2().await;
    let post = || server.grpc_post(SHOULD_RATE_LIMIT).body(()).unwrap();
    // Declares 1 MiB, sends 100 bytes of it and waits.
    let (resp, mut declared) = h2.send_request(post(), false).unwrap();
    let mut head = bytes::BytesMut::new();
    head.put_u8(0);
    head.put_u32(1024 * 1024);
    head.put_slice(&[0u8; 100]);
    declared.send_data(head.freeze(), false).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .expect("refused without waiting for the rest")
        .unwrap();
    assert_eq!(resp.headers()["grpc-status"], "8", "{:?}", resp.headers());
    // Declares 10 bytes, then keeps sending past the default 64 KiB.
    let (resp, mut flood) = h2.send_request(post(), false).unwrap();
    let mut head = bytes::BytesMut::new();
    head.put_u8(0);
    head.put_u32(10);
    flood.send_data(head.freeze(), false).unwrap();
    for _ in 0..5 {
        flood
            .send_data(Bytes::from(vec![0u8; 16 * 1024]), false)
            .unwrap();
    }
    let resp = tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .expect("refused while the request goes on")
        .unwrap();
    assert_eq!(resp.headers()["grpc-status"], "8", "{:?}", resp.headers());
}

/// tonic cannot send a compressed message without a compression feature, so this
/// one speaks HTTP/2 itself: a message with the compressed flag set.
#[tokio::test]
async fn a_compressed_message_is_refused_with_unimplemented() {
    let server = Server::start(POLICY, &[]);
    let (mut h2, _) = server.h2().await;
    let req = server
        .grpc_post(SHOULD_RATE_LIMIT)
        .header("grpc-encoding", "gzip")
        .body(())
        .unwrap();
    let (resp, mut send) = h2.send_request(req, false).unwrap();
    send.send_data(Bytes::from_static(&[1, 0, 0, 0, 2, 0x1f, 0x8b]), true)
        .unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    let h = resp.headers();
    assert_eq!(h["grpc-status"], "12", "{h:?}");
    assert_eq!(h["grpc-message"], "compressed messages are not supported");
    assert!(resp.body().is_end_stream(), "trailers-only");
}

#[tokio::test]
async fn health_check_and_watch_follow_shutdown() {
    // The checks below must all be answered between SIGTERM and the end of the drain
    // delay, on a machine that may be busy: the delay is the window they have.
    const DRAIN: Duration = Duration::from_secs(5);
    let drain = format!("{}s", DRAIN.as_secs());
    let mut server = Server::start(POLICY, &["--drain-delay", &drain]);
    let channel = Channel::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(channel);
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    // envoyproxy/ratelimit's own name, and RLQS's, for probes that name them.
    let names = ["", RLS, "ratelimit", RLQS_SERVICE];
    for s in names {
        let r = h.check(check(s)).await.unwrap().into_inner();
        assert_eq!(r.status, SERVING, "{s:?}");
    }
    let err = h.check(check("other")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = h.watch(check("other")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let mut watch = h.watch(check("")).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, SERVING);

    let mut c = server.client().await;
    server.terminate();
    // The change comes as a message on the open watch, before the drain delay ends
    // and the watch with it (an end instead would fail the unwrap).
    let next = tokio::time::timeout(DRAIN, watch.message())
        .await
        .expect("a change within the drain delay")
        .unwrap()
        .expect("NOT_SERVING before the watch ends");
    assert_eq!(next.status, NOT_SERVING);
    // During the drain delay, Check says so too, and decisions go on.
    for s in names {
        let r = h.check(check(s)).await.unwrap().into_inner();
        assert_eq!(r.status, NOT_SERVING, "{s:?}");
    }
    let r = call(&mut c, request("d", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.overall_code, OK);
    // Once the server stops, the watch ends rather than holding shutdown up, and the
    // process exits cleanly: after the drain delay, within the shutdown grace (10 s by
    // default) that bounds the wait for calls in flight.
    let limit = DRAIN + Duration::from_secs(10);
    let end = tokio::time::timeout(limit, watch.message())
        .await
        .expect("the watch ends when the server stops");
    match end {
        Ok(None) => {}
        Err(e) => assert_eq!(e.code(), Code::Unavailable, "{e:?}"),
        Ok(Some(m)) => panic!("unexpected message {m:?}"),
    }
    let status = server.wait_exit(limit).await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn bytes_that_are_not_http2_close_only_their_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(POLICY, &[]);
    let mut tcp = tokio::net::TcpStream::connect(&server.grpc).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\x00\xff")
        .await
        .unwrap();
    let mut sink = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut sink)).await;
    assert!(read.is_ok(), "the connection is closed");
    let mut c = server.client().await;
    let r = call(&mut c, request("d", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn a_silent_connection_does_not_hold_shutdown_up() {
    let mut server = Server::start(POLICY, &["--drain-delay", "0s"]);
    // Connected, and never a byte of HTTP/2.
    let _silent = tokio::net::TcpStream::connect(&server.grpc).await.unwrap();
    // Accepted: connections are accepted in the order they arrive, so one answered
    // call on a later connection shows the silent one is the server's now.
    {
        let mut c = server.client().await;
        let r = call(&mut c, request("d", vec![desc(&[("k", "v")])])).await;
        assert_eq!(r.overall_code, OK);
    }
    server.terminate();
    let status = server.wait_exit(Duration::from_secs(3)).await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_get_or_a_non_grpc_body_is_refused() {
    let server = Server::start(POLICY, &[]);
    let (mut h2, _) = server.h2().await;
    let url = format!("http://{}{SHOULD_RATE_LIMIT}", server.grpc);
    let get = http::Request::get(&url)
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let json = http::Request::post(&url)
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    for (req, want) in [(get, 405), (json, 415)] {
        let (resp, _) = h2.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), want);
        assert_eq!(resp.headers()["grpc-status"], "12");
    }
}

/// Routed on its headers: a method the port does not serve is answered while its
/// request is still open (a streaming client may never end it).
#[tokio::test]
async fn an_unknown_method_is_answered_before_its_request_ends() {
    let server = Server::start(POLICY, &[]);
    let (mut h2, _) = server.h2().await;
    let req = server
        .grpc_post("/envoy.service.ratelimit.v3.RateLimitService/StreamRateLimits")
        .body(())
        .unwrap();
    let (resp, mut send) = h2.send_request(req, false).unwrap();
    send.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), false)
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .expect("answered without waiting for the request to end")
        .unwrap();
    assert_eq!(resp.headers()["grpc-status"], "12");
    assert!(resp.body().is_end_stream(), "trailers-only");
}

/// A raw call of ShouldRateLimit with the given `grpc-timeout`: the response's
/// headers (the status of a trailers-only answer) or its trailers, and its message.
/// Unlike tonic's client, it does not give up at the deadline itself, so a test can
/// tell the server's answer time from the client's (on a loaded machine, the
/// client's clock counts the scheduling of both processes).
async fn call_with_timeout(
    server: &Server,
    timeout: &str,
    message: Bytes,
) -> (http::HeaderMap, Option<RateLimitResponse>) {
    let (mut h2, _) = server.h2().await;
    let req = server
        .grpc_post(SHOULD_RATE_LIMIT)
        .header("grpc-timeout", timeout)
        .body(())
        .unwrap();
    let (resp, mut send) = h2.send_request(req, false).unwrap();
    let mut framed = bytes::BytesMut::new();
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(&message);
    send.send_data(framed.freeze(), true).unwrap();
    let resp = resp.await.unwrap();
    if resp.headers().contains_key("grpc-status") {
        return (resp.headers().clone(), None);
    }
    let mut body = resp.into_body();
    let mut data = bytes::BytesMut::new();
    while let Some(d) = body.data().await {
        data.extend_from_slice(&d.unwrap());
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    let answer = (data.len() >= 5)
        .then(|| RateLimitResponse::decode(&data[5..]).expect("a RateLimitResponse"));
    (trailers, answer)
}

/// A caller whose deadline has passed has given up: answered DEADLINE_EXCEEDED, and
/// none of its hits counted.
#[tokio::test]
async fn a_call_past_its_deadline_is_refused_without_counting() {
    use prost::Message;
    let server = Server::start(POLICY, &[]);
    let message = Bytes::from(request("d", vec![desc(&[("k", "late")])]).encode_to_vec());
    for _ in 0..3 {
        let (h, _) = call_with_timeout(&server, "0n", message.clone()).await;
        assert_eq!(h["grpc-status"], "4", "{h:?}");
    }
    // A generous deadline is decided as usual, and finds the counter untouched.
    let (h, _) = call_with_timeout(&server, "5S", message.clone()).await;
    assert_eq!(h["grpc-status"], "0", "{h:?}");
    let mut c = server.client().await;
    let r = call(&mut c, request("d", vec![desc(&[("k", "late")])])).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 3,
        "only the two decided calls counted"
    );
    let (_, metrics) = http(&server.http, "GET", "/metrics", "");
    assert!(
        metrics.contains("sluice_deadline_exceeded_total 3"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("deadline"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A malformed timeout is refused as grpc-go refuses it.
    let (h, _) = call_with_timeout(&server, "soon", message).await;
    assert_eq!(h["grpc-status"], "13", "{h:?}");
}

/// Envoy gives up at its filter timeout, then applies its own failure mode; the
/// domain's must answer first. With Redis asleep and a store timeout of a second, a
/// call with a 50 ms deadline waits for the store only 40 ms (four fifths of it,
/// `store_wait`'s unit test) and is answered by the domain's failure mode. Sluice's
/// own decision time (`sluice_decision_seconds`) puts both calls in the 100 ms
/// bucket, a tenth of the store timeout: on a loaded 2-core machine the wake-up
/// after the 40 ms wait can come later than the 10 ms a 50 ms bound would leave.
/// The client's clock, which that scheduling moves further, is held to a looser
/// bound, under the store timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_store_answers_by_the_failure_mode_before_the_deadline() {
    if !common::redis::available() {
        return;
    }
    let redis = common::redis::RedisServer::start_with(&["--enable-debug-command", "local"]).await;
    let policy = format!(
        "{POLICY}---\ndomain: strict\nfailure_mode: closed\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
    );
    let server = Server::start(&policy, &["--redis", &redis.url(), "--store-timeout", "1s"]);
    let mut c = server.client().await;
    let r = call(&mut c, request("d", vec![desc(&[("k", "v")])])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 4, "decided by Redis");

    let decided = |bucket: &str| {
        let (_, metrics) = http(&server.http, "GET", "/metrics", "");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(bucket)?.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{bucket} in\n{metrics}"))
    };
    let spent = || {
        let (_, metrics) = http(&server.http, "GET", "/metrics", "");
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("sluice_decision_seconds_sum")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("sluice_decision_seconds_sum in\n{metrics}"))
    };
    let under_100ms = r#"sluice_decision_seconds_bucket{le="0.1"}"#;
    let all = "sluice_decision_seconds_count";
    let (fast_before, all_before, spent_before) = (decided(under_100ms), decided(all), spent());
    redis.sleep(3).await;
    for (domain, want) in [("d", OK), ("strict", OVER_LIMIT)] {
        let message = Bytes::from(request(domain, vec![desc(&[("k", "v")])]).encode_to_vec());
        let started = std::time::Instant::now();
        let (status, answer) = call_with_timeout(&server, "50m", message).await;
        let took = started.elapsed();
        assert_eq!(status["grpc-status"], "0", "{domain}: {status:?}");
        let answer = answer.expect("a response");
        assert_eq!(
            answer.overall_code, want,
            "{domain}: the domain's failure mode"
        );
        assert!(
            took < Duration::from_millis(500),
            "{domain}: answered in {took:?}, not after the store timeout"
        );
    }
    assert_eq!(decided(all) - all_before, 2);
    assert_eq!(
        decided(under_100ms) - fast_before,
        2,
        "both decided by the deadline's wait, not the store timeout: {:.3} s for both",
        spent() - spent_before
    );
    let (_, metrics) = http(&server.http, "GET", "/metrics", "");
    for outcome in ["failed_open", "failed_closed"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("sluice_requests_total")
                    && l.contains(&format!("outcome=\"{outcome}\""))
                    && !l.ends_with(" 0")),
            "{outcome} counted"
        );
    }
}

/// An HTTP/2 frame: its header, then `payload`.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A `ShouldRateLimit` call on `stream` as raw frames: its headers (HPACK literals,
/// no table, no Huffman) and its message, which ends the stream.
fn raw_should_rate_limit(stream: u32, message: &[u8]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "sluice"),
        (":path", SHOULD_RATE_LIMIT),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", "20m"),
    ] {
        block.push(0); // a literal header field without indexing, a new name
        for s in [name, value] {
            block.push(s.len() as u8);
            block.extend_from_slice(s.as_bytes());
        }
    }
    let mut data = vec![0];
    data.extend_from_slice(&(message.len() as u32).to_be_bytes());
    data.extend_from_slice(message);
    let mut out = h2_frame(0x1, 0x4, stream, &block); // HEADERS, END_HEADERS
    out.extend(h2_frame(0x0, 0x1, stream, &data)); // DATA, END_STREAM
    out
}

/// Envoy resets a call's stream when its filter `timeout` passes, then answers its
/// client by `failure_mode_deny`. A sluice that was stalled meanwhile reads the call
/// and its reset together: the call is not decided, and none of its hits count, so
/// a client Envoy refused while sluice was paused is not also charged for it.
#[tokio::test]
async fn a_call_whose_client_reset_it_before_it_was_read_counts_nothing() {
    use prost::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(POLICY, &[]);
    let message = request("d", vec![desc(&[("k", "gave-up")])]).encode_to_vec();
    // Preface and SETTINGS, then three calls each followed by its RST_STREAM
    // (CANCEL), all in one write: sluice finds each reset before it reads the call.
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend(h2_frame(0x4, 0, 0, &[]));
    for stream in [1, 3, 5] {
        bytes.extend(raw_should_rate_limit(stream, &message));
        bytes.extend(h2_frame(0x3, 0, stream, &8u32.to_be_bytes()));
    }
    let mut tcp = tokio::net::TcpStream::connect(&server.grpc).await.unwrap();
    tcp.write_all(&bytes).await.unwrap();
    // Then a call that waits for its answer.
    tcp.write_all(&raw_should_rate_limit(7, &message))
        .await
        .unwrap();
    let mut got = bytes::BytesMut::new();
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            while got.len() >= 9 {
                let len = u32::from_be_bytes([0, got[0], got[1], got[2]]) as usize;
                if got.len() < 9 + len {
                    break;
                }
                let frame = got.split_to(9 + len);
                let stream =
                    u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & !(1 << 31);
                if frame[3] == 0x0 && stream == 7 && len > 5 {
                    return RateLimitResponse::decode(&frame[9 + 5..])
                        .expect("a RateLimitResponse");
                }
            }
            let mut buf = [0u8; 4096];
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed before the answer");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the fourth call is answered");
    assert_eq!(
        answer.statuses[0].limit_remaining, 4,
        "only the call that was not reset counted (limit 5)"
    );
    eventually(
        Duration::from_secs(5),
        "the three counted as abandoned",
        || async { server.metric("sluice_abandoned_calls_total", &[]) == Some(3.0) },
    )
    .await;
}
