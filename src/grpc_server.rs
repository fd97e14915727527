//! A lean gRPC server written directly on `h2`, for unary calls (and the odd
//! server-streaming one, such as health `Watch`).
//!
//! Each accepted connection is one Tokio task. That task drives the HTTP/2
//! connection and every request on it, held in a `FuturesUnordered`: no task is
//! spawned per request, and one wake of the connection task can read, decide and
//! answer many requests. Envoy opens one HTTP/2 connection per worker thread, so the
//! connections, and with them the work, still spread over the cores.
//!
//! Messages are never compressed: a compressed request is refused with
//! UNIMPLEMENTED. `grpc-timeout` is not read; a client that gives up resets its
//! stream, and the call is dropped then.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{BoxStream, FuturesUnordered, StreamExt};
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Largest request message accepted, as in tonic and grpc-go.
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// The gRPC status codes this server sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 3,
    NotFound = 5,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
}

/// A call's failure: sent as a trailers-only response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcError {
    pub code: Code,
    pub message: String,
}

impl GrpcError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        GrpcError {
            code,
            message: message.into(),
        }
    }

    /// The answer to a path no handler serves.
    pub fn unimplemented(path: &str) -> Self {
        GrpcError::new(Code::Unimplemented, format!("unknown method {path}"))
    }
}

/// A successful call's messages, each framed by [`frame`].
pub enum Reply {
    /// Exactly one message (unary).
    One(Bytes),
    /// Messages until the stream ends, the client goes or the server stops
    /// (server-streaming). An `Err` item ends the call with that status.
    Stream(BoxStream<'static, Result<Bytes, GrpcError>>),
}

/// Answers calls: `path` is the request's `:path`, `message` the request message
/// without its 5-byte gRPC prefix.
pub trait Handler: Send + Sync + 'static {
    fn call(
        &self,
        path: &str,
        message: Bytes,
    ) -> impl Future<Output = Result<Reply, GrpcError>> + Send;
}

/// Serves `handler` on every connection `listener` accepts until `stop` resolves;
/// then stops accepting, sends GOAWAY on every connection and returns once the
/// calls in flight have been answered and the connections closed (streaming calls
/// end at the stop).
pub async fn serve<H: Handler>(listener: TcpListener, handler: H, stop: impl Future<Output = ()>) {
    let handler = Arc::new(handler);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut stop = pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((io, _)) => {
                    // Small gRPC frames must not wait on Nagle's algorithm (Envoy's
                    // filter timeout is 20 ms by default; a delayed ACK alone can
                    // cost 40 ms).
                    let _ = io.set_nodelay(true);
                    conns.spawn(connection(io, handler.clone(), stop_rx.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "gRPC accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            // Reap finished connections so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
}

/// HTTP/2 settings: hyper's server defaults (1 MiB stream and connection windows,
/// 16 KiB frames and header lists, 400 KiB send buffer, 200 concurrent streams, at
/// most 1024 streams reset for local errors).
fn builder() -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    b.initial_window_size(1024 * 1024)
        .initial_connection_window_size(1024 * 1024)
        .max_frame_size(16 * 1024)
        .max_header_list_size(16 * 1024)
        .max_send_buffer_size(400 * 1024)
        .max_concurrent_streams(200)
        .max_local_error_reset_streams(Some(1024));
    b
}

/// One connection: accepts streams and drives their calls, all in this task.
async fn connection<H: Handler>(io: TcpStream, handler: Arc<H>, mut stop: watch::Receiver<bool>) {
    // A client that connects and stays silent must not hold shutdown up.
    let handshake = tokio::select! {
        h = builder().handshake::<_, Bytes>(io) => h,
        _ = stop.wait_for(|s| *s) => return,
    };
    let mut conn = match handshake {
        Ok(conn) => conn,
        Err(e) => {
            tracing::debug!(error = %e, "HTTP/2 handshake failed");
            return;
        }
    };
    let for_calls = stop.clone();
    let mut stopped = pin!(stop.wait_for(|s| *s));
    let mut stopping = false;
    let mut closing = false;
    let mut calls = FuturesUnordered::new();
    let mut deferred: Option<Arc<Deferred>> = None;
    // One poll serves everything that is ready: new streams are accepted, calls
    // are driven, and the connection is polled again to write what they sent.
    poll_fn(|cx| loop {
        if let Some(d) = &deferred {
            // Woken before the deferred wake-up (by h2, the socket or the stop
            // signal): keep waiting. It comes once the worker has polled for I/O,
            // and the full poll that follows looks at all of them again.
            if !d.fired.load(Ordering::Acquire) {
                return Poll::Pending;
            }
            deferred = None;
        }
        if !stopping && stopped.as_mut().poll(cx).is_ready() {
            stopping = true;
            conn.graceful_shutdown();
        }
        let mut progress = false;
        loop {
            match conn.poll_accept(cx) {
                Poll::Ready(Some(Ok((req, respond)))) => {
                    calls.push(call(&*handler, req, respond, &for_calls));
                    progress = true;
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(error = %e, "HTTP/2 connection error");
                    return Poll::Ready(());
                }
                // Closed, or GOAWAY sent and every stream done.
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => break,
            }
        }
        let mut answered = 0;
        while let Poll::Ready(Some(())) = calls.poll_next_unpin(cx) {
            progress = true;
            answered += 1;
        }
        if answered >= DEFER_AFTER && !stopping {
            deferred = Some(Deferred::until_io_polled(cx));
            return Poll::Pending;
        }
        if stopping && !closing && calls.is_empty() && !conn.has_streams() {
            // Every call is answered and its last frame is out of the stream queues:
            // close now rather than wait for the client to acknowledge GOAWAY (a
            // client that never does would hold shutdown up). Streams it opened
            // meanwhile are beyond GOAWAY's last stream id, which tells the client
            // they were not processed and may be retried.
            closing = true;
            conn.abrupt_shutdown(h2::Reason::NO_ERROR);
            progress = true;
        }
        if !progress {
            return Poll::Pending;
        }
    })
    .await;
}

/// Answers from one poll of a connection after which its writes wait for the
/// worker's next poll for I/O (see [`Deferred`]).
const DEFER_AFTER: usize = 8;

/// A busy connection's answers, held back until the worker has polled for I/O and
/// run the other connections that were ready. Their answers then leave together,
/// so a client that reads several connections (Envoy's workers, the load
/// generator) is woken once for all of them instead of once per connection; waking
/// a sleeping thread costs the writer more than the write. Only for batches of
/// `DEFER_AFTER` or more: a lightly loaded connection answers at once, since
/// holding back small batches leaves the server idle while the client catches up
/// (measured: docs/performance-notes.md, "HTTP/2 server").
struct Deferred {
    fired: AtomicBool,
    task: Waker,
}

impl Deferred {
    /// Arranges the wake-up through `tokio::task::yield_now`, which Tokio defers
    /// until its worker has polled the I/O driver. Were it to wake at once instead,
    /// the connection would just write at once, as without deferral.
    fn until_io_polled(cx: &mut Context<'_>) -> Arc<Deferred> {
        let d = Arc::new(Deferred {
            fired: AtomicBool::new(false),
            task: cx.waker().clone(),
        });
        let waker = futures::task::waker(d.clone());
        let _ = pin!(tokio::task::yield_now()).poll(&mut Context::from_waker(&waker));
        d
    }
}

impl futures::task::ArcWake for Deferred {
    fn wake_by_ref(d: &Arc<Self>) {
        d.fired.store(true, Ordering::Release);
        d.task.wake_by_ref();
    }
}

/// One stream: reads the request, calls the handler, sends the answer. Errors of
/// the stream itself (the client reset it, the connection went) end it silently.
async fn call<H: Handler>(
    handler: &H,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    stop: &watch::Receiver<bool>,
) {
    let (parts, body) = req.into_parts();
    if parts.method != http::Method::POST {
        let e = GrpcError::new(Code::Unimplemented, "gRPC calls are POST requests");
        return refuse(&mut respond, StatusCode::METHOD_NOT_ALLOWED, &e);
    }
    let grpc = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if !grpc {
        let e = GrpcError::new(Code::Unimplemented, "content-type must be application/grpc");
        return refuse(&mut respond, StatusCode::UNSUPPORTED_MEDIA_TYPE, &e);
    }
    let message = match read_message(body).await {
        Ok(Some(m)) => m,
        Ok(None) => return,
        Err(e) => return refuse(&mut respond, StatusCode::OK, &e),
    };
    let answer = {
        let mut answer = pin!(handler.call(parts.uri.path(), message));
        // Poll the call first: most finish at once, without looking for a reset.
        let polled = poll_fn(|cx| {
            if let Poll::Ready(a) = answer.as_mut().poll(cx) {
                return Poll::Ready(Some(a));
            }
            match respond.poll_reset(cx) {
                Poll::Ready(_) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        });
        match polled.await {
            Some(a) => a,
            None => return, // the client gave up; drop the call
        }
    };
    match answer {
        Ok(Reply::One(m)) => {
            let Ok(mut send) = respond.send_response(ok_headers(), false) else {
                return;
            };
            if send.send_data(m, false).is_ok() {
                let _ = send.send_trailers(status(Code::Ok, ""));
            }
        }
        Ok(Reply::Stream(s)) => stream(respond, s, stop.clone()).await,
        Err(e) => refuse(&mut respond, StatusCode::OK, &e),
    }
}

/// Sends a server-streaming reply until it ends, the client resets the stream or the
/// server stops (then UNAVAILABLE, so that the client goes elsewhere).
async fn stream(
    mut respond: SendResponse<Bytes>,
    mut messages: BoxStream<'static, Result<Bytes, GrpcError>>,
    mut stop: watch::Receiver<bool>,
) {
    let Ok(mut send) = respond.send_response(ok_headers(), false) else {
        return;
    };
    let mut stopped = pin!(stop.wait_for(|s| *s));
    loop {
        enum Next {
            Item(Option<Result<Bytes, GrpcError>>),
            Reset,
            Stop,
        }
        let next = poll_fn(|cx| {
            if send.poll_reset(cx).is_ready() {
                return Poll::Ready(Next::Reset);
            }
            if stopped.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Next::Stop);
            }
            messages.poll_next_unpin(cx).map(Next::Item)
        })
        .await;
        let trailers = match next {
            Next::Item(Some(Ok(m))) => {
                if send.send_data(m, false).is_err() {
                    return;
                }
                continue;
            }
            Next::Item(Some(Err(e))) => status(e.code, &e.message),
            Next::Item(None) => status(Code::Ok, ""),
            Next::Reset => return,
            Next::Stop => status(Code::Unavailable, "server is shutting down"),
        };
        let _ = send.send_trailers(trailers);
        return;
    }
}

/// Reads the request body and takes the one message out of it. `Ok(None)`: the
/// stream broke (reset, connection gone) and there is no one to answer.
async fn read_message(mut body: RecvStream) -> Result<Option<Bytes>, GrpcError> {
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else {
            return Ok(None);
        };
        // The window reopens as data is read, not when the call is answered.
        let _ = body.flow_control().release_capacity(chunk.len());
        len += chunk.len();
        if len > MAX_MESSAGE + 5 {
            return Err(too_large(len - 5));
        }
        match (&first, &mut more) {
            (None, _) => first = Some(chunk),
            (Some(f), None) => {
                let mut buf = BytesMut::with_capacity(f.len() + chunk.len());
                buf.extend_from_slice(f);
                buf.extend_from_slice(&chunk);
                more = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&chunk),
        }
    }
    let body = match (first, more) {
        (_, Some(buf)) => buf.freeze(),
        (Some(f), None) => f,
        (None, None) => Bytes::new(),
    };
    unframe(body).map(Some)
}

/// The message inside one length-prefixed gRPC frame.
fn unframe(mut body: Bytes) -> Result<Bytes, GrpcError> {
    if body.len() < 5 {
        return Err(GrpcError::new(
            Code::Internal,
            "the request carries no complete gRPC message",
        ));
    }
    if body[0] != 0 {
        return Err(GrpcError::new(
            Code::Unimplemented,
            "compressed messages are not supported",
        ));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(too_large(len));
    }
    if body.len() - 5 != len {
        return Err(GrpcError::new(
            Code::Internal,
            format!(
                "the request's gRPC frame declares {len} bytes but {} follow; a unary call carries exactly one message",
                body.len() - 5
            ),
        ));
    }
    Ok(body.split_off(5))
}

fn too_large(len: usize) -> GrpcError {
    GrpcError::new(
        Code::ResourceExhausted,
        format!("request message of {len} bytes is larger than the limit of {MAX_MESSAGE}"),
    )
}

/// `message` encoded behind its 5-byte gRPC prefix, in one buffer: an answer is
/// encoded once and never copied.
pub fn frame(message: &impl prost::Message) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + message.encoded_len());
    frame_into(message, &mut buf);
    buf.freeze()
}

/// Appends `message` to `buf` as one gRPC frame: not compressed, big-endian length.
pub fn frame_into(message: &impl prost::Message, buf: &mut impl BufMut) {
    let len = message.encoded_len();
    buf.put_u8(0);
    buf.put_u32(len as u32);
    // Cannot fail on a buffer that grows (Vec, BytesMut).
    let _ = message.encode(buf);
}

fn ok_headers() -> Response<()> {
    let mut r = Response::new(());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    r
}

/// A trailers-only answer: headers with the status, and the stream ends.
fn refuse(respond: &mut SendResponse<Bytes>, http_status: StatusCode, e: &GrpcError) {
    let mut r = ok_headers();
    *r.status_mut() = http_status;
    r.headers_mut().extend(status(e.code, &e.message));
    let _ = respond.send_response(r, true);
}

fn status(code: Code, message: &str) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(2);
    h.insert("grpc-status", HeaderValue::from(code as u16));
    if !message.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
            h.insert("grpc-message", v);
        }
    }
    h
}

/// `grpc-message` encoding: printable ASCII except `%` as is, every other byte of
/// the UTF-8 text as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        // prost encodes a String as google.protobuf.StringValue: field 1.
        let f = frame(&"abc".to_string());
        assert_eq!(&f[..], &[0, 0, 0, 0, 5, 0x0a, 3, b'a', b'b', b'c']);
        assert_eq!(
            unframe(f).unwrap(),
            Bytes::from_static(&[0x0a, 3, b'a', b'b', b'c'])
        );
        assert_eq!(unframe(frame(&String::new())).unwrap(), Bytes::new());
    }

    #[test]
    fn bad_frames_get_their_codes() {
        let code = |b: &'static [u8]| unframe(Bytes::from_static(b)).unwrap_err().code;
        assert_eq!(code(b""), Code::Internal);
        assert_eq!(code(&[0, 0, 0]), Code::Internal);
        assert_eq!(code(&[1, 0, 0, 0, 1, 7]), Code::Unimplemented);
        assert_eq!(code(&[0, 0, 0, 0, 9, 7]), Code::Internal);
        assert_eq!(code(&[0, 0, 0, 0, 1, 7, 7]), Code::Internal);
        assert_eq!(code(&[0, 0xff, 0xff, 0xff, 0xff]), Code::ResourceExhausted);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b%c"), "a b%25c");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }
}
