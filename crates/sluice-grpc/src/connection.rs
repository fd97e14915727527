//! One connection: its TLS and HTTP/2 handshakes, then every call on it, driven in
//! this one task, and its upkeep (keepalive PINGs, the idle timeout).

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use h2::{Ping, PingPong};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;

use super::call::call;
use super::{Handler, Settings, Shared};

/// Serves one accepted connection until it closes or the server stops.
pub(super) async fn run<H: Handler>(
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared<H>>,
    mut stop: watch::Receiver<bool>,
) {
    // One budget for both handshakes: a client that connects and stays silent, or
    // stops half way, holds a descriptor no longer than this.
    let deadline = Instant::now() + shared.settings.handshake_timeout;
    let Some(acceptor) = tls else {
        return http2(tcp, deadline, &shared, stop).await;
    };
    let peer = tcp.peer_addr().ok();
    let accepted = tokio::select! {
        a = tokio::time::timeout_at(deadline, acceptor.accept(tcp)) => a,
        _ = stop.wait_for(|s| *s) => return,
    };
    match accepted {
        Ok(Ok(io)) => http2(io, deadline, &shared, stop).await,
        Ok(Err(e)) => {
            // A refused certificate is logged as a warning; a TCP probe that
            // connects and closes only at debug level.
            let peer = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
            shared.refusals.handshake_failed("grpc", &peer, &e);
            shared
                .stats
                .handshake_failed
                .fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            shared
                .stats
                .handshake_timeout
                .fetch_add(1, Ordering::Relaxed);
        }
    }
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

/// The HTTP/2 connection over `io`: accepts streams and drives their calls.
async fn http2<H, IO>(
    io: IO,
    handshake_by: Instant,
    shared: &Shared<H>,
    mut stop: watch::Receiver<bool>,
) where
    H: Handler,
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let stats = &shared.stats;
    let handshake = tokio::select! {
        h = tokio::time::timeout_at(handshake_by, builder().handshake::<_, Bytes>(io)) => h,
        _ = stop.wait_for(|s| *s) => return,
    };
    let mut conn = match handshake {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "HTTP/2 handshake failed");
            stats.handshake_failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(_) => {
            tracing::debug!("HTTP/2 handshake timed out");
            stats.handshake_timeout.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let handler = &shared.handler;
    let settings = &shared.settings;
    let mut upkeep = Upkeep::new(settings, conn.ping_pong());
    let for_calls = stop.clone();
    let mut stopped = pin!(stop.wait_for(|s| *s));
    let mut draining = false;
    let mut closing = false;
    let mut accepted = 0u64;
    let mut calls = FuturesUnordered::new();
    let mut deferred: Option<Arc<Deferred>> = None;
    // One poll serves everything that is ready: new streams are accepted, calls
    // are driven, and the connection is polled again to write what they sent.
    poll_fn(|cx| loop {
        if let Some(d) = &deferred {
            // Woken before the deferred wake-up (by h2, the socket, the stop signal
            // or the upkeep timer): keep waiting. It comes once the worker has
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
                    calls.push(call(handler, settings, stats, req, respond, &for_calls));
                    accepted += 1;
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
        if let Some(upkeep) = &mut upkeep {
            if upkeep.poll_due(cx) {
                let busy = !calls.is_empty() || conn.has_streams();
                match upkeep.tick(accepted, busy, cx) {
                    Tick::Dead => {
                        tracing::debug!("keepalive PING unanswered: closing the connection");
                        stats.keepalive_timeout.fetch_add(1, Ordering::Relaxed);
                        return Poll::Ready(());
                    }
                    Tick::Idle if !draining => {
                        tracing::debug!("connection idle: closing it with GOAWAY");
                        stats.idle.fetch_add(1, Ordering::Relaxed);
                        draining = true;
                        conn.graceful_shutdown();
                    }
                    _ => {}
                }
                // A PING or GOAWAY was queued: the connection writes it when polled.
                progress = true;
            }
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

/// What an upkeep tick found.
#[derive(Debug, PartialEq, Eq)]
enum Tick {
    Nothing,
    /// The last keepalive PING went unanswered for the keepalive timeout.
    Dead,
    /// No call for the idle timeout.
    Idle,
}

/// Keepalive PINGs and the idle timeout of one connection, on one timer.
///
/// The timer fires every `tick` (the keepalive interval, or a quarter of the idle
/// timeout when that is shorter), and at a PING's deadline. The calls themselves
/// never touch it: a tick looks at whether any stream arrived since the last one,
/// so a connection is closed between one idle timeout and one tick more after its
/// last call.
struct Upkeep {
    timer: Pin<Box<Sleep>>,
    tick: std::time::Duration,
    ping: Option<PingPong>,
    interval: Option<std::time::Duration>,
    timeout: std::time::Duration,
    idle: Option<std::time::Duration>,
    last_ping: Instant,
    pong_due: Option<Instant>,
    idle_since: Instant,
    seen: u64,
}

impl Upkeep {
    /// `None` when neither keepalive nor the idle timeout is on.
    fn new(settings: &Settings, ping: Option<PingPong>) -> Option<Upkeep> {
        let tick = [
            settings.keepalive_interval,
            settings.idle_timeout.map(|i| i / 4),
        ]
        .into_iter()
        .flatten()
        .min()?;
        let now = Instant::now();
        Some(Upkeep {
            timer: Box::pin(tokio::time::sleep_until(now + tick)),
            tick,
            ping,
            interval: settings.keepalive_interval,
            timeout: settings.keepalive_timeout,
            idle: settings.idle_timeout,
            last_ping: now,
            pong_due: None,
            idle_since: now,
            seen: 0,
        })
    }

    /// Whether the timer fired (a PING's answer is taken on the way).
    fn poll_due(&mut self, cx: &mut Context<'_>) -> bool {
        if self.pong_due.is_some() {
            if let Some(ping) = &mut self.ping {
                if let Poll::Ready(answer) = ping.poll_pong(cx) {
                    // An error means the connection is going; its own poll says so.
                    let _ = answer;
                    self.pong_due = None;
                }
            }
        }
        self.timer.as_mut().poll(cx).is_ready()
    }

    /// Runs a tick: `accepted` counts the streams accepted so far, `busy` says
    /// whether any is still open. Arms the timer again.
    fn tick(&mut self, accepted: u64, busy: bool, cx: &mut Context<'_>) -> Tick {
        let now = Instant::now();
        if self.pong_due.is_some_and(|due| now >= due) {
            return Tick::Dead;
        }
        let mut found = Tick::Nothing;
        if busy || accepted != self.seen {
            self.seen = accepted;
            self.idle_since = now;
        } else if self.idle.is_some_and(|idle| now - self.idle_since >= idle) {
            found = Tick::Idle;
        }
        if let (Some(interval), Some(ping)) = (self.interval, &mut self.ping) {
            if self.pong_due.is_none() && now - self.last_ping >= interval {
                if ping.send_ping(Ping::opaque()).is_ok() {
                    self.pong_due = Some(now + self.timeout);
                }
                self.last_ping = now;
            }
        }
        let mut next = now + self.tick;
        if let Some(due) = self.pong_due {
            next = next.min(due);
        }
        self.timer.as_mut().reset(next);
        // Registers the wake-up of the new deadline.
        let _ = self.timer.as_mut().poll(cx);
        found
    }
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
