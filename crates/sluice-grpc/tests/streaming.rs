//! The lean gRPC server's streaming calls, through its library API: a test handler
//! with a client-streaming and a bidirectional method (and a unary one), called over
//! plain HTTP/2.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use sluice_grpc::{Code, Deadline, GrpcError, Handler, Kind, Messages, Reply, Server, Settings};

/// `Len` (unary) answers with the length of its message; `Sum` answers once with
/// the total length of the messages it was sent; `Echo` answers each message with
/// itself, as it arrives, and counts in `echoed` the answers the server has taken
/// to send.
#[derive(Default)]
struct Test {
    echoed: Arc<AtomicUsize>,
}

#[derive(Clone, Copy)]
enum Method {
    Sum,
    Echo,
    Len,
}

fn framed(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + message.len());
    b.put_u8(0);
    b.put_u32(message.len() as u32);
    b.put_slice(message);
    b.freeze()
}

impl Handler for Test {
    type Method = Method;

    fn route(&self, path: &str) -> Option<(Method, Kind)> {
        match path {
            "/test.Test/Sum" => Some((Method::Sum, Kind::Streaming)),
            "/test.Test/Echo" => Some((Method::Echo, Kind::Streaming)),
            "/test.Test/Len" => Some((Method::Len, Kind::Unary)),
            _ => None,
        }
    }

    /// `Sum` takes messages 8 times the server's limit.
    fn max_message(&self, method: Method, max: usize) -> usize {
        match method {
            Method::Sum => max * 8,
            _ => max,
        }
    }

    async fn call(&self, _: Method, m: Bytes, _: Option<Deadline>) -> Result<Reply, GrpcError> {
        Ok(Reply::One(framed(m.len().to_string().as_bytes())))
    }

    async fn stream(
        &self,
        method: Method,
        mut messages: Messages,
        _: Option<Deadline>,
    ) -> Result<Reply, GrpcError> {
        match method {
            Method::Sum => {
                let mut total = 0usize;
                while let Some(m) = messages.next().await {
                    total += m?.len();
                }
                Ok(Reply::One(framed(total.to_string().as_bytes())))
            }
            Method::Echo => {
                let echoed = self.echoed.clone();
                Ok(Reply::Stream(
                    messages
                        .map(move |m| {
                            echoed.fetch_add(1, Ordering::Relaxed);
                            m.map(|m| framed(&m))
                        })
                        .boxed(),
                ))
            }
            Method::Len => Err(GrpcError::new(Code::Internal, "a unary method")),
        }
    }
}

struct Running {
    addr: std::net::SocketAddr,
    stats: Arc<sluice_grpc::Stats>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(settings: Settings) -> Running {
    start_with(Test::default(), settings).await
}

async fn start_with(handler: Test, settings: Settings) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = Server::new(handler).settings(settings);
    let stats = server.stats();
    tokio::spawn(server.serve(listener, async {
        let _ = rx.await;
    }));
    Running {
        addr,
        stats,
        _stop: tx,
    }
}

async fn client(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    h2.ready().await.unwrap()
}

fn post(addr: std::net::SocketAddr, path: &str) -> http::Request<()> {
    http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// Opens a call to `path`, its request body left open.
fn open(
    h2: &mut h2::client::SendRequest<Bytes>,
    addr: std::net::SocketAddr,
    path: &str,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    h2.send_request(post(addr, path), false).unwrap()
}

/// The response's headers, within a few seconds.
async fn headers(resp: h2::client::ResponseFuture) -> http::Response<h2::RecvStream> {
    tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .expect("answered in time")
        .unwrap()
}

/// Sends `message` whole on a new call to `path`: its one answer and grpc-status.
async fn whole(
    h2: &mut h2::client::SendRequest<Bytes>,
    addr: std::net::SocketAddr,
    path: &str,
    message: &[u8],
) -> (Bytes, String) {
    let (resp, mut send) = open(h2, addr, path);
    send.send_data(framed(message), true).unwrap();
    let mut body = headers(resp).await.into_body();
    let answer = data(&mut body).await;
    (answer, grpc_status(&mut body).await)
}

/// The next DATA of a response body, within a few seconds.
async fn data(body: &mut h2::RecvStream) -> Bytes {
    let chunk = tokio::time::timeout(Duration::from_secs(5), body.data())
        .await
        .expect("an answer in time")
        .expect("more data")
        .unwrap();
    let _ = body.flow_control().release_capacity(chunk.len());
    chunk
}

async fn grpc_status(body: &mut h2::RecvStream) -> String {
    let trailers = tokio::time::timeout(Duration::from_secs(5), body.trailers())
        .await
        .expect("trailers in time")
        .unwrap()
        .expect("trailers");
    trailers["grpc-status"].to_str().unwrap().to_string()
}

#[tokio::test]
async fn a_bidirectional_call_answers_each_message_as_it_arrives() {
    let server = start(Settings::default()).await;
    let mut h2 = client(server.addr).await;
    let (resp, mut send) = open(&mut h2, server.addr, "/test.Test/Echo");
    send.send_data(framed(b"one"), false).unwrap();
    let mut body = resp.await.unwrap().into_body();
    // Answered while the request goes on.
    assert_eq!(data(&mut body).await, framed(b"one"));
    // A message split over two DATA frames, then two in one.
    let two = framed(b"two");
    send.send_data(two.slice(..3), false).unwrap();
    send.send_data(two.slice(3..), false).unwrap();
    assert_eq!(data(&mut body).await, two);
    let mut both = BytesMut::new();
    both.extend_from_slice(&framed(b"3"));
    both.extend_from_slice(&framed(b"4"));
    send.send_data(both.freeze(), true).unwrap();
    let mut rest = BytesMut::new();
    while rest.len() < 12 {
        rest.extend_from_slice(&data(&mut body).await);
    }
    assert_eq!(
        &rest[..],
        &[&framed(b"3")[..], &framed(b"4")[..]].concat()[..]
    );
    assert_eq!(grpc_status(&mut body).await, "0");
}

#[tokio::test]
async fn a_client_streaming_call_answers_once_the_requests_end() {
    let server = start(Settings::default()).await;
    let mut h2 = client(server.addr).await;
    let (resp, mut send) = open(&mut h2, server.addr, "/test.Test/Sum");
    for m in [&b"ab"[..], b"cde", b""] {
        send.send_data(framed(m), false).unwrap();
    }
    send.send_data(Bytes::new(), true).unwrap();
    let mut body = resp.await.unwrap().into_body();
    assert_eq!(data(&mut body).await, framed(b"5"));
    assert_eq!(grpc_status(&mut body).await, "0");
}

#[tokio::test]
async fn a_streamed_message_over_the_limit_is_refused_before_it_is_sent() {
    let server = start(Settings {
        max_message: 16,
        ..Settings::default()
    })
    .await;
    let mut h2 = client(server.addr).await;
    let (resp, mut send) = open(&mut h2, server.addr, "/test.Test/Echo");
    send.send_data(framed(b"small"), false).unwrap();
    // Only the prefix of a message declared at 1 MiB.
    send.send_data(Bytes::from_static(&[0, 0, 0x10, 0, 0]), false)
        .unwrap();
    let mut body = resp.await.unwrap().into_body();
    assert_eq!(data(&mut body).await, framed(b"small"));
    assert_eq!(grpc_status(&mut body).await, "8");
}

#[tokio::test]
async fn a_method_may_take_larger_messages_than_the_server() {
    let server = start(Settings {
        max_message: 16,
        ..Settings::default()
    })
    .await;
    let mut h2 = client(server.addr).await;
    let answer = whole(&mut h2, server.addr, "/test.Test/Sum", &[7; 100]).await;
    assert_eq!(answer, (framed(b"100"), "0".to_string()));
    // Past its own limit, refused as any other.
    let (resp, mut send) = open(&mut h2, server.addr, "/test.Test/Sum");
    send.send_data(framed(&[7; 129]), true).unwrap();
    // Refused before an answer: the status comes in the headers (trailers-only).
    let refused = resp.await.unwrap();
    assert_eq!(refused.headers()["grpc-status"], "8");
}

#[tokio::test]
async fn a_stream_that_ends_inside_a_message_is_internal() {
    let server = start(Settings::default()).await;
    let mut h2 = client(server.addr).await;
    let (resp, mut send) = open(&mut h2, server.addr, "/test.Test/Sum");
    send.send_data(Bytes::from_static(&[0, 0, 0, 0, 9, 1, 2]), true)
        .unwrap();
    assert_eq!(headers(resp).await.headers()["grpc-status"], "13");
}

#[tokio::test]
async fn an_unknown_method_is_answered_before_its_request_ends() {
    let server = start(Settings::default()).await;
    let mut h2 = client(server.addr).await;
    // Headers only: the request body never ends.
    let (resp, _send) = open(&mut h2, server.addr, "/test.Test/Nope");
    // Answered without waiting for the body.
    let resp = headers(resp).await;
    assert_eq!(resp.headers()["grpc-status"], "12");
    assert!(resp.body().is_end_stream(), "trailers-only");
}

#[tokio::test]
async fn a_client_that_does_not_read_holds_the_answers_back() {
    let echoed = Arc::new(AtomicUsize::new(0));
    let test = Test {
        echoed: echoed.clone(),
    };
    let server = start_with(test, Settings::default()).await;
    // A stream window of 1 KiB, never opened further until the client reads.
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (h2, conn) = h2::client::Builder::new()
        .initial_window_size(1024)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut h2 = h2.ready().await.unwrap();
    let (resp, mut send) = open(&mut h2, server.addr, "/test.Test/Echo");
    let message = [7u8; 100];
    const SENT: usize = 200;
    for _ in 0..SENT {
        send.send_data(framed(&message), false).unwrap();
    }
    send.send_data(Bytes::new(), true).unwrap();
    let mut body = resp.await.unwrap().into_body();
    // Unbounded, the server would take all 200 answers (21 KB) at once and queue
    // them for the client; the window holds 9 of the 105-byte answers. Once it has
    // filled the window, the server is given time to run further ahead.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while echoed.load(Ordering::Relaxed) < 9 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the window not filled"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let taken = echoed.load(Ordering::Relaxed);
    assert!(taken <= 12, "{taken} answers taken for a window of 1 KiB");
    // Once the client reads, the rest follow.
    let mut got = 0;
    while got < SENT * 105 {
        got += data(&mut body).await.len();
    }
    assert_eq!(got, SENT * 105);
    assert_eq!(grpc_status(&mut body).await, "0");
    assert_eq!(echoed.load(Ordering::Relaxed), SENT);
}

#[tokio::test]
async fn a_unary_call_is_read_with_no_limit_at_all() {
    let server = start(Settings {
        max_message: usize::MAX,
        ..Settings::default()
    })
    .await;
    let mut h2 = client(server.addr).await;
    let answer = whole(&mut h2, server.addr, "/test.Test/Len", b"four").await;
    assert_eq!(answer, (framed(b"4"), "0".to_string()));
}

/// The first `len` bytes of a message of `declared` bytes: a body that never ends.
fn begun(declared: u32, len: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + len);
    b.put_u8(0);
    b.put_u32(declared);
    b.put_bytes(7, len);
    b.freeze()
}

/// Waits until the server holds `want` bytes of unfinished messages.
async fn until_buffered(server: &Running, want: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.stats.buffered.load(Ordering::Relaxed) != want {
        let held = server.stats.buffered.load(Ordering::Relaxed);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server holds {held} bytes of unfinished messages, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

// Real time, not paused: over real sockets paused time jumps to the next timer
// whenever the runtime parks for I/O, and fires the limits early. Each test
// bounds only from below (no timer fires early) and waits with a deadline.

#[tokio::test]
async fn a_unary_body_that_never_ends_is_answered_within_the_message_timeout() {
    let limit = Duration::from_millis(300);
    let server = start(Settings {
        message_timeout: limit,
        ..Settings::default()
    })
    .await;
    let mut h2 = client(server.addr).await;
    let started = tokio::time::Instant::now();
    let (resp, mut send) = open(&mut h2, server.addr, "/test.Test/Len");
    send.send_data(begun(100, 50), false).unwrap();
    assert_eq!(headers(resp).await.headers()["grpc-status"], "4");
    assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
    assert_eq!(server.stats.buffered.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_unary_body_is_limited_by_its_own_timeout_when_shorter() {
    let server = start(Settings {
        message_timeout: Duration::from_secs(3600),
        ..Settings::default()
    })
    .await;
    let mut h2 = client(server.addr).await;
    let mut req = post(server.addr, "/test.Test/Len");
    req.headers_mut()
        .insert("grpc-timeout", "200m".parse().unwrap());
    let started = tokio::time::Instant::now();
    let (resp, mut send) = h2.send_request(req, false).unwrap();
    send.send_data(begun(100, 50), false).unwrap();
    // Answered by the call's own deadline, not the hour.
    assert_eq!(headers(resp).await.headers()["grpc-status"], "4");
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn a_stream_may_idle_between_messages_but_not_inside_one() {
    let limit = Duration::from_millis(200);
    let server = start(Settings {
        message_timeout: limit,
        ..Settings::default()
    })
    .await;
    let mut h2 = client(server.addr).await;
    let (resp, mut send) = open(&mut h2, server.addr, "/test.Test/Echo");
    send.send_data(framed(b"one"), false).unwrap();
    let mut body = resp.await.unwrap().into_body();
    assert_eq!(data(&mut body).await, framed(b"one"));
    // Idle for several limits between messages, as RLQS streams are between
    // reports: not an unfinished message.
    tokio::time::sleep(limit * 4).await;
    send.send_data(framed(b"two"), false).unwrap();
    assert_eq!(data(&mut body).await, framed(b"two"));
    // A message begun and never finished ends the call.
    let started = tokio::time::Instant::now();
    send.send_data(begun(10, 3), false).unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), grpc_status(&mut body))
            .await
            .unwrap(),
        "4"
    );
    assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
    assert_eq!(server.stats.buffered.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn past_the_buffered_bound_unfinished_bodies_are_refused_and_whole_ones_answered() {
    let server = start(Settings {
        max_buffered: 64 * 1024,
        // Longer than the test: what is held stays held.
        message_timeout: Duration::from_secs(3600),
        ..Settings::default()
    })
    .await;
    let mut slow = client(server.addr).await;
    // 20,005 bytes each, in two DATA frames (16 KiB the most): three fit.
    let mut held = Vec::new();
    for i in 1..=3 {
        let (resp, mut send) = open(&mut slow, server.addr, "/test.Test/Len");
        send.send_data(begun(40_000, 20_000), false).unwrap();
        until_buffered(&server, i * 20_005).await;
        held.push((resp, send));
    }
    let (resp, mut send) = open(&mut slow, server.addr, "/test.Test/Len");
    send.send_data(begun(40_000, 20_000), false).unwrap();
    // Refused at once.
    assert_eq!(headers(resp).await.headers()["grpc-status"], "8");
    until_buffered(&server, 3 * 20_005).await;
    // A whole request is not counted: answered on this connection and on another.
    let mut fast = client(server.addr).await;
    for h2 in [&mut slow, &mut fast] {
        let answer = whole(h2, server.addr, "/test.Test/Len", b"whole").await;
        assert_eq!(answer, (framed(b"5"), "0".to_string()));
    }
    // A client that resets its stream frees what it held.
    let (resp, mut send) = held.pop().unwrap();
    send.send_reset(h2::Reason::CANCEL);
    drop((resp, send));
    until_buffered(&server, 2 * 20_005).await;
}
