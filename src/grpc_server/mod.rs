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
//! resets its stream, and the call is dropped then.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

mod call;
mod connection;
mod deadline;
mod message;
mod status;

pub use deadline::Deadline;
pub use message::{frame, frame_into, Messages};
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

    /// A [`Kind::Unary`] call: `message` is the request without its prefix;
    /// `deadline` comes from its `grpc-timeout`.
    fn call(
        &self,
        method: Self::Method,
        message: Bytes,
        deadline: Option<Deadline>,
    ) -> impl Future<Output = Result<Reply, GrpcError>> + Send;

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

/// How the server treats requests.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Largest request message buffered (`--max-request-bytes`); a larger one is
    /// refused with RESOURCE_EXHAUSTED as soon as its prefix declares it, or its
    /// bytes go past it.
    pub max_message: usize,
}

impl Default for Settings {
    fn default() -> Self {
        // A RateLimitRequest from Envoy is well under 1 KiB.
        Settings {
            max_message: 64 * 1024,
        }
    }
}

/// What every connection task shares.
struct Shared<H> {
    handler: H,
    settings: Settings,
}

/// A gRPC server: a handler, its settings, and TLS when configured.
pub struct Server<H> {
    handler: H,
    settings: Settings,
    tls: Option<Arc<Acceptors>>,
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

    /// Serves every connection `listener` accepts until `stop` resolves; then stops
    /// accepting, sends GOAWAY on every connection and returns once the calls in
    /// flight have been answered and the connections closed (streaming calls end at
    /// the stop).
    pub async fn serve(self, listener: TcpListener, stop: impl Future<Output = ()>) {
        let shared = Arc::new(Shared {
            handler: self.handler,
            settings: self.settings,
        });
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
                        let tls = self.tls.as_ref().map(|t| t());
                        conns.spawn(connection::run(io, tls, shared.clone(), stop_rx.clone()));
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: wait rather than spin.
                        tracing::warn!(error = %e, "gRPC accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
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
}

/// Serves `handler` with default settings, in plain text (see [`Server::serve`]).
pub async fn serve<H: Handler>(listener: TcpListener, handler: H, stop: impl Future<Output = ()>) {
    Server::new(handler).serve(listener, stop).await
}
