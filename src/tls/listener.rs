//! The HTTP ports' listener with TLS: hands axum connections whose handshake is
//! done. Its handshake, bounded and logged, serves the admin port too.
//!
//! Handshakes run in tasks of their own, each bounded by the handshake timeout, so a
//! client that connects and stays silent holds up neither the others nor the
//! accept loop. The listener under it accepts: for an HTTP port, its guard
//! ([`crate::guard::Guarded`]), so a connection holds its slot from accept, through
//! its handshake, until it closes, and connections that never finish a handshake
//! count against `--http-max-connections` like any other.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

use super::Tls;

/// A connection whose handshake is done, and its peer; `None` when it failed.
type Handshaken<L> = Option<(
    TlsStream<<L as axum::serve::Listener>::Io>,
    <L as axum::serve::Listener>::Addr,
)>;

/// Why a TLS handshake did not finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The client broke it off, or sent what TLS does not allow.
    Failed,
    /// It was not done by its deadline.
    TimedOut,
}

/// The server's side of a TLS handshake on `io` with `tls`'s certificate of the
/// moment, bounded by `deadline`. A failure over a certificate or protocol (a
/// refused client certificate, a client refusing the port's) is logged as a
/// warning with `peer`, at most every ten seconds; any other at debug level.
pub async fn handshake<IO: AsyncRead + AsyncWrite + Unpin>(
    tls: &Tls,
    io: IO,
    deadline: Instant,
    peer: &impl Display,
) -> Result<TlsStream<IO>, HandshakeFailure> {
    match tokio::time::timeout_at(deadline, tls.acceptor().accept(io)).await {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => {
            tls.refusals.handshake_failed(tls.port, peer, &e);
            Err(HandshakeFailure::Failed)
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            Err(HandshakeFailure::TimedOut)
        }
    }
}

/// A listener whose connections speak TLS.
pub struct TlsListener<L: axum::serve::Listener> {
    inner: L,
    tls: Arc<Tls>,
    timeout: Duration,
    handshakes: JoinSet<Handshaken<L>>,
}

impl<L: axum::serve::Listener> TlsListener<L> {
    pub fn new(inner: L, tls: Arc<Tls>, timeout: Duration) -> Self {
        TlsListener {
            inner,
            tls,
            timeout,
            handshakes: JoinSet::new(),
        }
    }
}

impl<L> axum::serve::Listener for TlsListener<L>
where
    L: axum::serve::Listener,
    L::Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    L::Addr: Display + Send + Sync + 'static,
{
    type Io = TlsStream<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                // The guard under it waits out failed accepts.
                (io, peer) = self.inner.accept() => {
                    let port = self.tls.clone();
                    let deadline = Instant::now() + self.timeout;
                    self.handshakes.spawn(async move {
                        let tls = handshake(&port, io, deadline, &peer).await.ok()?;
                        Some((tls, peer))
                    });
                }
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(conn)) = done {
                        return conn;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}
