//! Accepting connections through failures that last. Out of file descriptors
//! (`EMFILE`), the listening socket stays readable, so a loop that retries at once
//! spins a core on failing `accept` calls and logs each one. Here a failed accept
//! waits before the next, longer each time up to a bound, and the failures are
//! logged at most once a second, counted. Connections a port closes at once for
//! its cap ([`Accept::refused`]) are logged at most once every ten seconds.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// The first wait after a failed accept; it doubles with each failure that follows.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest wait: a port is back this soon after descriptors are freed.
const MAX_PAUSE: Duration = Duration::from_millis(200);
/// How often a lasting failure is logged.
const LOG_EVERY: Duration = Duration::from_secs(1);
/// How often connections refused for a port's cap are logged while it stays full.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// A listener whose [`Accept::accept`] returns only connections: failures are
/// waited out and logged.
#[derive(Debug)]
pub struct Accept {
    listener: TcpListener,
    port: &'static str,
    failing: Option<Failing>,
    /// When a refused connection was last logged, and how many were refused since.
    refused_logged: Option<Instant>,
    refused_unlogged: u64,
}

/// A run of failed accepts.
#[derive(Debug)]
struct Failing {
    since: Instant,
    failures: u64,
    unlogged: u64,
    logged: Option<Instant>,
    pause: Duration,
}

impl Accept {
    /// `port` names the listener in the log (`grpc`, `admin`, `http`).
    pub fn new(listener: TcpListener, port: &'static str) -> Self {
        Accept {
            listener,
            port,
            failing: None,
            refused_logged: None,
            refused_unlogged: 0,
        }
    }

    /// Logs a connection from `peer` closed at once because `max` are open (`flag`
    /// sets the cap): at most once every ten seconds, with the number refused since.
    pub fn refused(&mut self, peer: SocketAddr, flag: &'static str, max: usize) {
        self.refused_unlogged += 1;
        let now = Instant::now();
        if self
            .refused_logged
            .is_none_or(|at| now.duration_since(at) >= REFUSED_LOG_EVERY)
        {
            tracing::warn!(
                port = self.port,
                %peer,
                max,
                refused = self.refused_unlogged,
                "connection refused: {flag} are open"
            );
            self.refused_logged = Some(now);
            self.refused_unlogged = 0;
        }
    }

    /// The next connection. Cancel-safe: dropped while it waits, the run of failures
    /// and the next pause are kept.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok(accepted) => {
                    self.recovered();
                    return accepted;
                }
                // The one connection went before it was accepted: the next may not.
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    let pause = self.failed(&e);
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Counts a failure, logs when due, and says how long to wait.
    fn failed(&mut self, e: &io::Error) -> Duration {
        let now = Instant::now();
        let failing = self.failing.get_or_insert(Failing {
            since: now,
            failures: 0,
            unlogged: 0,
            logged: None,
            pause: FIRST_PAUSE,
        });
        failing.failures += 1;
        failing.unlogged += 1;
        if failing
            .logged
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY)
        {
            tracing::warn!(
                port = self.port,
                error = %e,
                failures = failing.unlogged,
                "accept failing: new connections wait (out of file descriptors?)"
            );
            failing.logged = Some(now);
            failing.unlogged = 0;
        }
        let pause = failing.pause;
        failing.pause = (pause * 2).min(MAX_PAUSE);
        pause
    }

    fn recovered(&mut self) {
        if let Some(failing) = self.failing.take() {
            tracing::warn!(
                port = self.port,
                failures = failing.failures,
                failing_for = ?failing.since.elapsed(),
                "accepting again"
            );
        }
    }
}

/// An error of the one connection being accepted, not of the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn accept() -> Accept {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Accept::new(listener, "test")
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_double_up_to_a_bound_and_reset_once_accepting() {
        let mut a = accept().await;
        let e = io::Error::from_raw_os_error(24);
        let pauses: Vec<_> = (0..8).map(|_| a.failed(&e)).collect();
        let ms: Vec<_> = pauses.iter().map(|p| p.as_millis()).collect();
        assert_eq!(ms, [10, 20, 40, 80, 160, 200, 200, 200]);
        assert_eq!(a.failing.as_ref().unwrap().failures, 8);
        a.recovered();
        assert!(a.failing.is_none());
        assert_eq!(a.failed(&e), FIRST_PAUSE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lasting_failure_is_logged_once_a_second_with_its_count() {
        let mut a = accept().await;
        let e = io::Error::from_raw_os_error(24);
        a.failed(&e);
        // Logged at once: nothing left unlogged.
        assert_eq!(a.failing.as_ref().unwrap().unlogged, 0);
        for _ in 0..5 {
            tokio::time::advance(Duration::from_millis(100)).await;
            a.failed(&e);
        }
        assert_eq!(a.failing.as_ref().unwrap().unlogged, 5);
        tokio::time::advance(Duration::from_millis(500)).await;
        a.failed(&e);
        assert_eq!(a.failing.as_ref().unwrap().unlogged, 0);
    }
}
