//! The admin port's accept loop: at most `--admin-max-connections` open at once
//! (more are closed as soon as accepted), TLS handshakes in tasks of their own
//! within the handshake timeout, and failed accepts waited out. Without these,
//! clients that connect and stay silent hold a descriptor each until the process
//! has none left, and then neither Envoy's port nor `/metrics` can accept.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sluice_grpc::{Accept, Stats};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::conn::{Conn, Slot};
use crate::tls::{handshake, HandshakeFailure, Tls};

/// How the admin port treats its connections.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most connections open at once, handshakes included.
    pub max_connections: usize,
    /// Longest TLS handshake and HTTP/2 preface of a new connection.
    pub handshake_timeout: Duration,
    /// A connection with no call for this long is closed; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// How often an HTTP/2 PING checks the client is there; `None`: never.
    pub keepalive_interval: Option<Duration>,
    /// How long a PING may go unanswered.
    pub keepalive_timeout: Duration,
}

/// Accepted connections, ready for tonic.
pub struct Incoming {
    accept: Accept,
    slots: Arc<Semaphore>,
    limits: Limits,
    tls: Option<Arc<Tls>>,
    stats: Arc<Stats>,
    handshakes: JoinSet<Option<Conn>>,
}

impl Incoming {
    pub fn new(accept: Accept, limits: Limits, tls: Option<Arc<Tls>>, stats: Arc<Stats>) -> Self {
        let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
        Incoming {
            accept,
            slots: Arc::new(Semaphore::new(max)),
            limits,
            tls,
            stats,
            handshakes: JoinSet::new(),
        }
    }

    /// The next connection (its TLS handshake done).
    pub async fn next(&mut self) -> Conn {
        loop {
            tokio::select! {
                (tcp, peer) = self.accept.accept() => {
                    let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                        self.stats.refused.fetch_add(1, Ordering::Relaxed);
                        let max = self.limits.max_connections;
                        self.accept.refused(peer, "--admin-max-connections", max);
                        continue;
                    };
                    let _ = tcp.set_nodelay(true);
                    let slot = Slot::new(permit, self.stats.clone());
                    let deadline = Instant::now() + self.limits.handshake_timeout;
                    let idle = self.limits.idle_timeout;
                    let Some(tls) = &self.tls else {
                        return Conn::new(Box::new(tcp), deadline, idle, slot);
                    };
                    let tls = tls.clone();
                    self.handshakes.spawn(async move {
                        match handshake(&tls, tcp, deadline, &peer).await {
                            Ok(tls) => Some(Conn::new(Box::new(tls), deadline, idle, slot)),
                            Err(failure) => {
                                let stats = slot.stats();
                                let count = match failure {
                                    HandshakeFailure::Failed => &stats.handshake_failed,
                                    HandshakeFailure::TimedOut => &stats.handshake_timeout,
                                };
                                count.fetch_add(1, Ordering::Relaxed);
                                None
                            }
                        }
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
}
