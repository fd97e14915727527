//! TLS handshakes that fail over a certificate or a protocol, told apart from the
//! rest. A client that connects and goes (a TCP probe, a port scan) fails its
//! handshake too, and is not worth a line; but a client whose certificate is refused
//! (expired, signed by another CA, without the required name), or which refuses the
//! port's certificate, is a configuration that fails every call it makes: Envoy then
//! fails open, and nothing is limited. Those are logged as warnings, with the peer
//! and the reason, at most once every ten seconds per port with the number since.

use std::fmt::Display;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio_rustls::rustls::{AlertDescription, Error};

/// How often refused handshakes are logged while they go on.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What a failed handshake says about the configuration, when it says something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client's certificate was refused, or it sent none (mutual TLS).
    ClientCertificate,
    /// The client refused the port's certificate (its alert says why).
    ServerCertificate,
    /// The client offered no application protocol the port speaks (ALPN).
    Protocol,
    /// The client does not speak TLS (a plain-text client on a TLS port).
    NotTls,
}

impl Refusal {
    /// What the refusal means, for the log.
    pub fn meaning(self) -> &'static str {
        match self {
            Refusal::ClientCertificate => {
                "TLS handshake refused: the client's certificate is not accepted (mutual TLS); its calls fail"
            }
            Refusal::ServerCertificate => {
                "TLS handshake refused by the client: it does not accept this port's certificate; its calls fail"
            }
            Refusal::Protocol => {
                "TLS handshake refused: the client offers no protocol this port speaks (ALPN); its calls fail"
            }
            Refusal::NotTls => {
                "TLS handshake refused: the client does not speak TLS (plain text to a TLS port?); its calls fail"
            }
        }
    }
}

/// Whether the handshake error `e` is a [`Refusal`]; `None` for a connection that
/// merely went (closed, reset) or a handshake that failed otherwise.
pub fn refusal(e: &io::Error) -> Option<Refusal> {
    let tls = e.get_ref()?.downcast_ref::<Error>()?;
    match tls {
        Error::InvalidCertificate(_) | Error::NoCertificatesPresented => {
            Some(Refusal::ClientCertificate)
        }
        Error::AlertReceived(alert) => match alert {
            AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::UnrecognisedName => Some(Refusal::ServerCertificate),
            AlertDescription::NoApplicationProtocol => Some(Refusal::Protocol),
            _ => None,
        },
        Error::NoApplicationProtocol => Some(Refusal::Protocol),
        Error::InvalidMessage(_) => Some(Refusal::NotTls),
        _ => None,
    }
}

/// Logs a port's refused handshakes at most once every ten seconds, with the number
/// refused since the last line. Lock-free: racing callers log once between them.
#[derive(Debug, Default)]
pub struct RefusalLog {
    /// When a line was last written, in milliseconds since the process's first
    /// refusal log was made, plus one (0: never).
    logged_at: AtomicU64,
    /// Refusals since the last line.
    unlogged: AtomicU64,
}

impl RefusalLog {
    /// The handshake of a connection from `peer` to `port` failed with `e`: logged
    /// as a warning when it is a [`Refusal`] and a line is due, at debug level
    /// otherwise. Returns the refusal, if it is one.
    pub fn handshake_failed(
        &self,
        port: &str,
        peer: &dyn Display,
        e: &io::Error,
    ) -> Option<Refusal> {
        let Some(refusal) = refusal(e) else {
            // Also every TCP probe that connects and closes: not worth a warning.
            tracing::debug!(port, %peer, error = %e, "TLS handshake failed");
            return None;
        };
        let refused = self.unlogged.fetch_add(1, Ordering::Relaxed) + 1;
        static BASE: OnceLock<Instant> = OnceLock::new();
        let now = BASE.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1;
        let last = self.logged_at.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= LOG_EVERY.as_millis() as u64;
        if due
            && self
                .logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.unlogged.fetch_sub(refused, Ordering::Relaxed);
            tracing::warn!(port, %peer, error = %e, refused, "{}", refusal.meaning());
        }
        Some(refusal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_rustls::rustls::{CertificateError, InvalidMessage};

    fn io(e: Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn certificate_and_protocol_failures_are_refusals_and_a_closed_connection_is_not() {
        let expired = io(Error::InvalidCertificate(CertificateError::Expired));
        assert_eq!(refusal(&expired), Some(Refusal::ClientCertificate));
        let none = io(Error::NoCertificatesPresented);
        assert_eq!(refusal(&none), Some(Refusal::ClientCertificate));
        let unknown_ca = io(Error::AlertReceived(AlertDescription::UnknownCA));
        assert_eq!(refusal(&unknown_ca), Some(Refusal::ServerCertificate));
        let alpn = io(Error::NoApplicationProtocol);
        assert_eq!(refusal(&alpn), Some(Refusal::Protocol));
        let plain = io(Error::InvalidMessage(InvalidMessage::InvalidContentType));
        assert_eq!(refusal(&plain), Some(Refusal::NotTls));
        let gone = io::Error::from(io::ErrorKind::UnexpectedEof);
        assert_eq!(refusal(&gone), None);
        let closed = io(Error::AlertReceived(AlertDescription::CloseNotify));
        assert_eq!(refusal(&closed), None);
    }
}
