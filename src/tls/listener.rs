//! The HTTP port's listener with TLS: hands axum connections whose handshake is
//! done.
//!
//! Handshakes run in tasks of their own, each bounded by the handshake timeout, so a
//! client that connects and stays silent holds up neither the others nor the
//! accept loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;

use super::Tls;

/// A TCP listener whose connections speak TLS.
pub struct TlsListener {
    tcp: TcpListener,
    tls: Arc<Tls>,
    timeout: Duration,
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, tls: Arc<Tls>, timeout: Duration) -> Self {
        TlsListener {
            tcp,
            tls,
            timeout,
            handshakes: JoinSet::new(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        let acceptor = self.tls.acceptor();
                        let timeout = self.timeout;
                        self.handshakes.spawn(async move {
                            match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                                Ok(Ok(tls)) => Some((tls, peer)),
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "HTTP TLS handshake failed");
                                    None
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "HTTP TLS handshake timed out");
                                    None
                                }
                            }
                        });
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: wait rather than spin.
                        tracing::warn!(error = %e, "HTTP accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(conn)) = done {
                        return conn;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}
