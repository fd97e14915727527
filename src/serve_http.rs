//! Serves the HTTP ports' connections (HTTP/1.1, on hyper) with a bound on how long a
//! request head may take to arrive whole, counted from its wait for it: the guard's
//! silence limit ([`crate::guard`]) alone lets a client that sends a byte now and
//! then hold its connection, and its slot, for ever. A request begun and not whole
//! in time is answered 408 and its connection closed; a connection idle between
//! requests is closed without an answer. A `POST /json` body has the same bound
//! ([`crate::http`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;
use tower_service::Service;

use crate::guard::{Activity, Answering, Quiet};

/// What a timed-out request is answered before its connection closes.
const REQUEST_TIMEOUT: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// The bound on a request's arrival, and where requests that overrun it count.
#[derive(Debug, Clone)]
pub struct Bound {
    pub request: Duration,
    pub timed_out: IntCounter,
}

/// A guarded connection, whose [`Activity`] each of its requests is handed.
pub trait Watched {
    fn activity(&self) -> &Arc<Activity>;
}

impl Watched for Quiet<TcpStream> {
    fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }
}

impl<T: Watched> Watched for TlsStream<T> {
    fn activity(&self) -> &Arc<Activity> {
        self.get_ref().0.activity()
    }
}

/// Serves `app` on `listener` until `stop`, then lets each connection finish the
/// request it is answering and waits for them all.
pub async fn serve<L>(
    mut listener: L,
    app: Router,
    bound: Bound,
    stop: impl Future<Output = ()> + Send + 'static,
) where
    L: Listener,
    L::Io: Watched + AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (stopping, _) = tokio::sync::watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            (io, _) = listener.accept() => {
                let conn = connection(io, app.clone(), bound.clone(), stopping.subscribe());
                connections.spawn(conn);
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    stopping.send_replace(true);
    while connections.join_next().await.is_some() {}
}

/// Serves one connection: its requests, each handed the connection's activity.
async fn connection<IO>(
    io: IO,
    app: Router,
    bound: Bound,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) where
    IO: Watched + AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let info = ConnectInfo(Answering(io.activity().clone()));
    let mut io = TokioIo::new(Begun { io, begun: false });
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let mut request = request.map(axum::body::Body::new);
        request.extensions_mut().insert(info.clone());
        app.clone().call(request)
    });
    let served = {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(bound.request);
        let conn = builder.serve_connection(&mut io, service);
        tokio::pin!(conn);
        let mut stopped = false;
        loop {
            tokio::select! {
                served = conn.as_mut() => break served,
                Ok(_) = stopping.wait_for(|s| *s), if !stopped => {
                    stopped = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    };
    let Err(e) = served else { return };
    // A head begun and not finished in time; not a connection idle between requests.
    if e.is_timeout() && io.inner().begun {
        bound.timed_out.inc();
        let answer = async {
            let io = &mut io.inner_mut().io;
            io.write_all(REQUEST_TIMEOUT).await?;
            io.shutdown().await
        };
        let _ = tokio::time::timeout(bound.request, answer).await;
    }
}

/// A connection that knows whether the client has sent a byte since the server last
/// wrote one: a request begun.
struct Begun<T> {
    io: T,
    begun: bool,
}

impl<T: AsyncRead + Unpin> AsyncRead for Begun<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.begun = true;
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Begun<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.begun = false;
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.begun = false;
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
