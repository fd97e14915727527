//! The HTTP ports' guard: a cap on the connections open at once, and a limit on how
//! long a connection may stay silent (a request Sluice is answering is not a
//! client's silence). Without them, clients that connect and send half a request
//! (or nothing) hold a descriptor each until the process runs out, and then the
//! gRPC port can accept no Envoy either.
//!
//! On a port served over TLS the guard is under the TLS listener: a connection holds
//! its slot from accept, its handshake included, so clients that connect and never
//! finish a handshake are capped like the others; its silence is counted in the
//! bytes on the wire.
//!
//! A failed accept (out of file descriptors) is waited out, not retried at once
//! ([`sluice_grpc::Accept`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus::IntCounter;
use sluice_grpc::Accept;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// An axum listener guarded by a [`Guard`]: past `max` open connections, new ones
/// are closed as soon as accepted (counted in `refused`); a connection that
/// neither sends nor takes a byte for `silence` is closed.
pub struct Guarded {
    inner: Accept,
    slots: Arc<Semaphore>,
    /// The cap, for the log.
    max: usize,
    silence: Duration,
    refused: IntCounter,
}

/// One guard's settings; each port it wraps gets slots of its own.
#[derive(Debug, Clone)]
pub struct Guard {
    pub max: usize,
    pub silence: Duration,
    pub refused: IntCounter,
}

impl Guard {
    /// `port` names the listener in the log.
    pub fn wrap(&self, listener: TcpListener, port: &'static str) -> Guarded {
        Guarded {
            inner: Accept::new(listener, port),
            slots: Arc::new(Semaphore::new(self.max.clamp(1, Semaphore::MAX_PERMITS))),
            max: self.max,
            silence: self.silence,
            refused: self.refused.clone(),
        }
    }
}

impl axum::serve::Listener for Guarded {
    type Io = Quiet<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (io, addr) = self.inner.accept().await;
            match self.slots.clone().try_acquire_owned() {
                Ok(slot) => return (Quiet::new(io, self.silence, slot), addr),
                Err(_) => {
                    self.refused.inc();
                    drop(io);
                    self.inner.refused(addr, "--http-max-connections", self.max);
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// The calls open on a connection, and since when none has been: the admin port's
/// idle timeout reads it, and an HTTP port's guard, which takes a connection
/// answering a call (a `/json` call held for its `leaky_bucket` turn) for no silent
/// one.
#[derive(Debug)]
pub struct Activity {
    born: Instant,
    open: AtomicUsize,
    /// Milliseconds from `born` to the end of the last call.
    idle_since: AtomicU64,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            born: Instant::now(),
            open: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
        })
    }

    /// Marks a call open, until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Call {
        self.open.fetch_add(1, Ordering::SeqCst);
        Call(self.clone())
    }

    fn busy(&self) -> bool {
        self.open.load(Ordering::SeqCst) > 0
    }

    /// When the connection will have been idle for `idle`; `None` while a call is
    /// open.
    pub fn idle_until(&self, idle: Duration) -> Option<Instant> {
        if self.busy() {
            return None;
        }
        let since = Duration::from_millis(self.idle_since.load(Ordering::SeqCst));
        Some(self.born + since + idle)
    }
}

/// A call open on a connection, until dropped.
#[derive(Debug)]
pub struct Call(Arc<Activity>);

impl Drop for Call {
    fn drop(&mut self) {
        let activity = &self.0;
        let ms = activity.born.elapsed().as_millis() as u64;
        activity.idle_since.store(ms, Ordering::SeqCst);
        activity.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A guarded connection's [`Activity`] as each of its requests is handed it
/// ([`crate::serve_http`]); the `/json` handler ([`crate::http`]) marks its call
/// once the body is read.
#[derive(Debug, Clone)]
pub struct Answering(pub Arc<Activity>);

/// A connection that ends with an error once it has been silent (no byte read or
/// written) for its limit while answering no request; its slot is given back when
/// it is dropped.
pub struct Quiet<T> {
    io: T,
    silence: Duration,
    deadline: Pin<Box<Sleep>>,
    pub(crate) activity: Arc<Activity>,
    _slot: OwnedSemaphorePermit,
}

impl<T> Quiet<T> {
    fn new(io: T, silence: Duration, slot: OwnedSemaphorePermit) -> Self {
        Quiet {
            io,
            silence,
            deadline: Box::pin(tokio::time::sleep(silence)),
            activity: Activity::new(),
            _slot: slot,
        }
    }

    fn heard(&mut self) {
        let next = Instant::now() + self.silence;
        self.deadline.as_mut().reset(next);
    }

    /// When the inner I/O waits: an error if the silence has run out while no
    /// request was being answered.
    fn waiting<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        while self.deadline.as_mut().poll(cx).is_ready() {
            if !self.activity.busy() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection silent too long",
                )));
            }
            // The server's silence: counted afresh from here.
            self.heard();
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Quiet<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.heard();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.waiting(cx),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Quiet<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    this.heard();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.waiting(cx),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.waiting(cx),
            done => done,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn slot() -> OwnedSemaphorePermit {
        Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_ends_and_a_talking_one_lives() {
        let (client, server) = tokio::io::duplex(64);
        let mut quiet = Quiet::new(server, Duration::from_secs(10), slot());
        let mut client = client;
        let mut buf = [0u8; 8];
        // Bytes every 6 s keep it open past 10 s.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            client.write_all(b"x").await.unwrap();
            assert_eq!(quiet.read(&mut buf).await.unwrap(), 1);
        }
        // Then 10 s of silence end it.
        let started = Instant::now();
        let e = quiet.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_answering_a_request_is_not_silent() {
        let (_client, server) = tokio::io::duplex(64);
        let mut quiet = Quiet::new(server, Duration::from_secs(10), slot());
        let answer = quiet.activity.begin();
        let mut buf = [0u8; 8];
        // Held for 35 s: the silence is the server's.
        let read = tokio::time::timeout(Duration::from_secs(35), quiet.read(&mut buf)).await;
        assert!(read.is_err(), "closed while answering: {read:?}");
        // Answered: 10 s of silence end it, counted from the last check.
        drop(answer);
        let started = Instant::now();
        let e = quiet.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(
            started.elapsed() <= Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }
}
