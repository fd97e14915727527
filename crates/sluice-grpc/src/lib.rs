//! A lean gRPC server written directly on `h2`: unary, server-streaming, client-
//! streaming and bidirectional calls, over plain TCP or TLS.
//!
//! Each accepted connection is one Tokio task. That task drives the HTTP/2
//! connection and every call on it, held in a `FuturesUnordered`: no task is
//! spawned per call, and one wake of the connection task can read, decide and
//! answer many calls. Envoy opens one HTTP/2 connection per worker thread, so the
//! connections, and with them the work, still spread over the cores.
//!
//! A call is routed as soon as its headers arrive ([`Handler::route`]): an unknown
//! method is answered UNIMPLEMENTED at once, whatever its body does. Messages are
//! never compressed: a compressed request is refused with UNIMPLEMENTED. A call's
//! `grpc-timeout` reaches the handler as a [`Deadline`]; a client that gives up
//! resets its stream, and the call is dropped then, or never handed to the handler
//! when the reset came before its request was read ([`Handler::abandoned`]).

#![forbid(unsafe_code)]

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

mod accept;
mod call;
mod connection;
mod deadline;
mod message;
mod refusal;
mod status;

pub use accept::Accept;
pub use deadline::Deadline;
pub use message::{frame, frame_into, Messages};
pub use refusal::{refusal, Refusal, RefusalLog};
pub use status::{status_of, Code, GrpcError};

/// A successful call's messages, each framed by [`frame`].
pub enum Reply {
    /// Exactly one message (unary, client-streaming).
    One(Bytes),
    /// Messages until the stream ends, the client goes or the server stops
    /// (server-streaming, bidirectional). An `Err` item ends the call with that
    /// status.
    Stream(BoxStream<'static, Result<Bytes, GrpcError>>),
}

/// How a method takes its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One request message (unary and server-streaming methods): read to the end of
    /// the request before the handler is called.
    Unary,
    /// A stream of request messages (client-streaming and bidirectional methods),
    /// handed over as they arrive.
    Streaming,
}

/// Answers calls.
pub trait Handler: Send + Sync + 'static {
    /// What [`Handler::route`] names a method by.
    type Method: Copy + Send + Sync + 'static;

    /// The method a `:path` names and how it takes its requests; `None` for a path
    /// this handler does not serve (answered UNIMPLEMENTED before the body is read).
    fn route(&self, path: &str) -> Option<(Self::Method, Kind)>;

    /// The largest request message `method` takes, given the server's
    /// [`Settings::max_message`] (`max`): a method whose messages are larger by
    /// nature (a batch of reports) may take more. By default, `max`.
    fn max_message(&self, _method: Self::Method, max: usize) -> usize {
        max
    }

    /// A [`Kind::Unary`] request refused before the handler saw it (`error`: too
    /// large, badly framed, compressed), so that the handler may count or log it.
    /// By default nothing is done.
    fn refused(&self, _method: Self::Method, _error: &GrpcError) {}

    /// A [`Kind::Unary`] call whose client reset the stream before its request was
    /// read (it gave up, at its deadline or otherwise): the handler is not called,
    /// and this may count it. By default nothing is done.
    fn abandoned(&self, _method: Self::Method) {}

    /// A [`Kind::Unary`] call: `message` is the request without its prefix;
    /// `deadline` comes from its `grpc-timeout`.
    fn call(
        &self,
        method: Self::Method,
        message: Bytes,
        deadline: Option<Deadline>,
    ) -> impl Future<Output = Result<Reply, GrpcError>> + Send;

    /// [`Handler::call`], given the call's request headers too (a handler that
    /// reads the trace context). By default the headers are not looked at.
    fn call_with_headers(
        &self,
        method: Self::Method,
        message: Bytes,
        deadline: Option<Deadline>,
        _headers: &http::HeaderMap,
    ) -> impl Future<Output = Result<Reply, GrpcError>> + Send {
        self.call(method, message, deadline)
    }

    /// [`Handler::stream`], given the call's request headers too.
    fn stream_with_headers(
        &self,
        method: Self::Method,
        messages: Messages,
        deadline: Option<Deadline>,
        _headers: &http::HeaderMap,
    ) -> impl Future<Output = Result<Reply, GrpcError>> + Send {
        self.stream(method, messages, deadline)
    }

    /// A [`Kind::Streaming`] call: the request messages as they arrive.
    fn stream(
        &self,
        _method: Self::Method,
        _messages: Messages,
        _deadline: Option<Deadline>,
    ) -> impl Future<Output = Result<Reply, GrpcError>> + Send {
        async { Err(GrpcError::new(Code::Unimplemented, "no streaming methods")) }
    }
}

/// How the server treats connections and requests.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Largest request message buffered (`--max-request-bytes`), unless the
    /// handler allows a method more ([`Handler::max_message`]); a larger one is
    /// refused with RESOURCE_EXHAUSTED as soon as its prefix declares it, or its
    /// bytes go past it.
    pub max_message: usize,
    /// How often an HTTP/2 PING checks that the client is still there; `None`: never.
    pub keepalive_interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// A connection without a call for this long is closed with GOAWAY; `None`:
    /// never.
    pub idle_timeout: Option<Duration>,
    /// Longest TLS and HTTP/2 handshake of a new connection.
    pub handshake_timeout: Duration,
    /// Longest a request message may take to arrive once begun (a unary call's
    /// from its headers, or sooner by its `grpc-timeout`): a call still waiting for
    /// the rest then is answered DEADLINE_EXCEEDED and its bytes freed. A stream
    /// idle between messages is not limited.
    pub message_timeout: Duration,
    /// Most bytes of unfinished request messages held at once, over all
    /// connections: a message that would wait for its rest past this is refused
    /// with RESOURCE_EXHAUSTED. A message that arrives whole is never counted.
    pub max_buffered: usize,
    /// Most connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

impl Default for Settings {
    /// Envoy keeps one connection per worker open for as long as it runs and
    /// answers PINGs, so none of these closes it.
    fn default() -> Self {
        Settings {
            // A RateLimitRequest from Envoy is well under 1 KiB.
            max_message: 64 * 1024,
            keepalive_interval: Some(Duration::from_secs(30)),
            keepalive_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(3600)),
            handshake_timeout: Duration::from_secs(10),
            message_timeout: Duration::from_secs(10),
            max_buffered: 64 * 1024 * 1024,
            max_connections: usize::MAX,
        }
    }
}

/// Counts of the server's connections, read by the metrics at scrape time.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections open now.
    pub open: AtomicUsize,
    /// Closed as soon as accepted: `max_connections` were open.
    pub refused: AtomicU64,
    /// TLS or HTTP/2 handshakes that failed.
    pub handshake_failed: AtomicU64,
    /// Handshakes that did not finish within the handshake timeout.
    pub handshake_timeout: AtomicU64,
    /// Closed because a keepalive PING went unanswered.
    pub keepalive_timeout: AtomicU64,
    /// Closed with GOAWAY after the idle timeout.
    pub idle: AtomicU64,
    /// Bytes of unfinished request messages held now (see
    /// [`Settings::max_buffered`]).
    pub buffered: AtomicUsize,
}

impl Stats {
    /// The connections closed by the server so far, by reason.
    pub fn closed(&self) -> [(&'static str, u64); 5] {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("refused", n(&self.refused)),
            ("handshake_failed", n(&self.handshake_failed)),
            ("handshake_timeout", n(&self.handshake_timeout)),
            ("keepalive_timeout", n(&self.keepalive_timeout)),
            ("idle", n(&self.idle)),
        ]
    }
}

/// What every connection task shares.
struct Shared<H> {
    handler: H,
    settings: Settings,
    stats: Arc<Stats>,
    /// TLS handshakes refused over a certificate or protocol, logged.
    refusals: RefusalLog,
}

/// A gRPC server: a handler, its settings, and TLS when configured.
pub struct Server<H> {
    handler: H,
    settings: Settings,
    tls: Option<Arc<Acceptors>>,
    stats: Arc<Stats>,
}

/// Gives each new connection the TLS settings of the moment (certificates change).
type Acceptors = dyn Fn() -> TlsAcceptor + Send + Sync;

impl<H: Handler> Server<H> {
    /// A plain-text server with default settings.
    pub fn new(handler: H) -> Self {
        Server {
            handler,
            settings: Settings::default(),
            tls: None,
            stats: Arc::default(),
        }
    }

    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// Serves TLS: each connection is accepted by the acceptor `tls` gives at the
    /// time, so a renewed certificate serves the connections that follow.
    pub fn tls(mut self, tls: impl Fn() -> TlsAcceptor + Send + Sync + 'static) -> Self {
        self.tls = Some(Arc::new(tls));
        self
    }

    /// The server's connection counts.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Serves every connection `listener` accepts until `stop` resolves; then stops
    /// accepting, sends GOAWAY on every connection and returns once the calls in
    /// flight have been answered and the connections closed (streaming calls end at
    /// the stop).
    /// A failed accept (out of file descriptors) is waited out, not retried at once
    /// ([`Accept`]).
    pub async fn serve(self, listener: TcpListener, stop: impl Future<Output = ()>) {
        let mut listener = Accept::new(listener, "grpc");
        let max = self.settings.max_connections;
        let shared = Arc::new(Shared {
            handler: self.handler,
            settings: self.settings,
            stats: self.stats,
            refusals: RefusalLog::default(),
        });
        let stats = &shared.stats;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut conns = JoinSet::new();
        let mut stop = pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                (io, peer) = listener.accept() => {
                    if conns.len() >= max {
                        // Closed at once: the client sees the connection reset and
                        // tries another replica, and this one keeps its
                        // descriptors for the connections it has.
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        listener.refused(peer, "--grpc-max-connections", max);
                        continue;
                    }
                    // Small gRPC frames must not wait on Nagle's algorithm (Envoy's
                    // filter timeout is 20 ms by default; a delayed ACK alone can
                    // cost 40 ms).
                    let _ = io.set_nodelay(true);
                    let tls = self.tls.as_ref().map(|t| t());
                    conns.spawn(connection::run(io, tls, shared.clone(), stop_rx.clone()));
                }
                // Reap finished connections so the set does not grow.
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
            stats.open.store(conns.len(), Ordering::Relaxed);
        }
        drop(listener);
        let _ = stop_tx.send(true);
        while conns.join_next().await.is_some() {
            stats.open.store(conns.len(), Ordering::Relaxed);
        }
    }
}

/// Serves `handler` with default settings, in plain text (see [`Server::serve`]).
pub async fn serve<H: Handler>(listener: TcpListener, handler: H, stop: impl Future<Output = ()>) {
    Server::new(handler).serve(listener, stop).await
}

/// The README's example, compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
