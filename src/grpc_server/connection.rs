//! One connection: its TLS and HTTP/2 handshakes, then every call on it, driven in
//! this one task.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::call::call;
use super::{Handler, Shared};

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

/// Serves one accepted connection until it closes or the server stops.
pub(super) async fn run<H: Handler>(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared<H>>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(acceptor) = tls else {
        return http2(tcp, &shared, stop).await;
    };
    let accepted = tokio::select! {
        a = acceptor.accept(tcp) => a,
        _ = stop.wait_for(|s| *s) => return,
    };
    match accepted {
        Ok(io) => http2(io, &shared, stop).await,
        // Also every TCP probe that connects and closes: not worth a warning.
        Err(e) => tracing::debug!(error = %e, "TLS handshake failed"),
    }
}

/// The HTTP/2 connection over `io`: accepts streams and drives their calls.
async fn http2<H, IO>(io: IO, shared: &Shared<H>, mut stop: watch::Receiver<bool>)
where
    H: Handler,
    IO: AsyncRead + AsyncWrite + Unpin,
{
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
    let handler = &shared.handler;
    let settings = &shared.settings;
    let for_calls = stop.clone();
    let mut stopped = pin!(stop.wait_for(|s| *s));
    let mut draining = false;
    let mut closing = false;
    let mut calls = FuturesUnordered::new();
    let mut deferred: Option<Arc<Deferred>> = None;
    // One poll serves everything that is ready: new streams are accepted, calls
    // are driven, and the connection is polled again to write what they sent.
    poll_fn(|cx| loop {
        if let Some(d) = &deferred {
            // Woken before the deferred wake-up (by h2, the socket or the stop
            // signal): keep waiting. It comes once the worker has
            // polled for I/O, and the full poll that follows looks at all of them
            // again.
            if !d.fired.load(Ordering::Acquire) {
                return Poll::Pending;
            }
            deferred = None;
        }
        if !draining && stopped.as_mut().poll(cx).is_ready() {
            draining = true;
            conn.graceful_shutdown();
        }
        let mut progress = false;
        loop {
            match conn.poll_accept(cx) {
                Poll::Ready(Some(Ok((req, respond)))) => {
                    calls.push(call(handler, settings, req, respond, &for_calls));
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
        if answered >= DEFER_AFTER && !draining {
            deferred = Some(Deferred::until_io_polled(cx));
            return Poll::Pending;
        }
        if draining && !closing && calls.is_empty() && !conn.has_streams() {
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
