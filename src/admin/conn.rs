//! One admin connection as tonic sees it: the socket (or its TLS stream), closed
//! when the client's HTTP/2 preface has not arrived by the handshake deadline, or
//! once no call has been open on it for the idle timeout; and the tower layer that
//! tells it when its calls begin and end (tonic hands each request the
//! connection's [`Activity`] as its connect info).
//!
//! tonic drives the HTTP/2 connection itself and offers no hook per connection, so
//! the limits sit where it reads: a connection past one reads as ended. An idle one
//! thus closes without GOAWAY; it has no call, so none is lost.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use sluice_grpc::Stats;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use crate::guard::{Activity, Call};

/// The client's connection preface and the header of its first frame (SETTINGS):
/// read in full, the HTTP/2 handshake is the server's to finish.
const PREFACE_BYTES: usize = 24 + 9;

/// A socket or a TLS stream over one.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// A connection's place among the admin port's open connections: counted in
/// `open` while held.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    stats: Arc<Stats>,
}

impl Slot {
    pub fn new(permit: OwnedSemaphorePermit, stats: Arc<Stats>) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        Slot {
            _permit: permit,
            stats,
        }
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An accepted admin connection, handed to tonic.
pub struct Conn {
    io: Box<dyn Io>,
    activity: Arc<Activity>,
    /// Bytes of the preface still to come; 0 once it has.
    preface_left: usize,
    idle: Option<Duration>,
    /// The handshake deadline while the preface is awaited, then the next check of
    /// the idle timeout; `None` with neither.
    timer: Option<Pin<Box<Sleep>>>,
    ended: bool,
    slot: Slot,
}

impl Conn {
    /// `io` must send its preface by `handshake` (TLS is done by then); once it has,
    /// it may go `idle` without a call.
    pub fn new(io: Box<dyn Io>, handshake: Instant, idle: Option<Duration>, slot: Slot) -> Self {
        Conn {
            io,
            activity: Activity::new(),
            preface_left: PREFACE_BYTES,
            idle,
            timer: Some(Box::pin(tokio::time::sleep_until(handshake))),
            ended: false,
            slot,
        }
    }

    fn received(&mut self, n: usize) {
        if self.preface_left == 0 {
            return;
        }
        self.preface_left = self.preface_left.saturating_sub(n);
        if self.preface_left == 0 {
            self.timer = self.idle.map(|idle| Box::pin(tokio::time::sleep(idle)));
        }
    }

    /// When the socket has nothing to read: whether a limit has run out (an error
    /// for a handshake too slow, the end of the stream for an idle connection).
    fn waiting(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let Some(timer) = &mut self.timer else {
                return Poll::Pending;
            };
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let stats = self.slot.stats();
            if self.preface_left > 0 {
                self.ended = true;
                stats.handshake_timeout.fetch_add(1, Ordering::Relaxed);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 preface within the handshake timeout",
                )));
            }
            let Some(idle) = self.idle else {
                return Poll::Pending;
            };
            let now = Instant::now();
            match self.activity.idle_until(idle) {
                Some(at) if at <= now => {
                    self.ended = true;
                    stats.idle.fetch_add(1, Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
                Some(at) => timer.as_mut().reset(at),
                // A call is open: look again an idle period on.
                None => timer.as_mut().reset(now + idle),
            }
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.received(buf.filled().len() - before);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.waiting(cx),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Arc<Activity>;

    fn connect_info(&self) -> Arc<Activity> {
        self.activity.clone()
    }
}

/// Marks each call open on its connection from its request until its response
/// body is done or dropped.
#[derive(Debug, Clone, Copy)]
pub struct CallsLayer;

impl<S> tower_layer::Layer<S> for CallsLayer {
    type Service = Calls<S>;

    fn layer(&self, inner: S) -> Calls<S> {
        Calls { inner }
    }
}

#[derive(Debug, Clone)]
pub struct Calls<S> {
    inner: S,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for Calls<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Tracked<R>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let call = req.extensions().get::<Arc<Activity>>().map(|a| a.begin());
        self.inner
            .call(req)
            .map(move |answer| {
                answer.map(|r| resource_exhausted(r).map(|body| Tracked { body, _call: call }))
            })
            .boxed()
    }
}

/// tonic refuses a request message over its limit OUT_OF_RANGE; gRPC's status code
/// guide gives a message larger than the configured maximum RESOURCE_EXHAUSTED, as
/// the gRPC port answers. No admin call answers OUT_OF_RANGE of its own, so one in
/// the headers (a refusal before the call) is tonic's.
fn resource_exhausted<R>(mut answer: http::Response<R>) -> http::Response<R> {
    let headers = answer.headers_mut();
    if headers.get("grpc-status").is_some_and(|s| s == "11") {
        let code = tonic::Code::ResourceExhausted as i32;
        headers.insert("grpc-status", http::HeaderValue::from(code));
    }
    answer
}

/// A response body that holds its call open.
#[derive(Debug)]
pub struct Tracked<B> {
    body: B,
    _call: Option<Call>,
}

impl<B: http_body::Body + Unpin> http_body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::Semaphore;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

    fn conn(idle: Option<Duration>) -> (tokio::io::DuplexStream, Conn, Arc<Stats>) {
        let (client, server) = tokio::io::duplex(1024);
        let stats = Arc::new(Stats::default());
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let handshake = Instant::now() + Duration::from_secs(5);
        let conn = Conn::new(
            Box::new(server),
            handshake,
            idle,
            Slot::new(permit, stats.clone()),
        );
        (client, conn, stats)
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_its_preface_by_the_deadline_is_closed() {
        let (mut client, mut conn, stats) = conn(None);
        // Part of the preface is not enough.
        client.write_all(&PREFACE[..20]).await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 20);
        let started = Instant::now();
        let e = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(stats.handshake_timeout.load(Ordering::Relaxed), 1);
        assert_eq!(stats.open.load(Ordering::Relaxed), 1);
        drop(conn);
        assert_eq!(stats.open.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn after_its_preface_a_connection_lives_while_a_call_is_open() {
        let (mut client, mut conn, stats) = conn(Some(Duration::from_secs(60)));
        client.write_all(PREFACE).await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(conn.read(&mut buf).await.unwrap(), PREFACE.len());
        // A call that lasts 100 s keeps it past the handshake and idle timeouts.
        let call = conn.activity.begin();
        let reading = tokio::spawn(async move {
            let n = conn.read(&mut buf).await;
            (n.map_err(|e| e.kind()), conn)
        });
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!reading.is_finished());
        drop(call);
        let ended = Instant::now();
        let (n, _conn) = reading.await.unwrap();
        assert_eq!(n, Ok(0), "the stream ends once idle");
        assert_eq!(ended.elapsed(), Duration::from_secs(60));
        assert_eq!(stats.idle.load(Ordering::Relaxed), 1);
        assert_eq!(stats.handshake_timeout.load(Ordering::Relaxed), 0);
    }
}
