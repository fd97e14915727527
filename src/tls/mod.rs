//! TLS for the gRPC and HTTP ports: a certificate, its key and, for mutual TLS, the
//! CA that client certificates must chain to, read from files and read again when
//! they change.
//!
//! The files are polled like the policy files (src/source/file.rs): a Kubernetes
//! Secret update swaps the `..data` symlink, and no event fires on the file the user
//! named. New connections get the new certificate; connections already open keep
//! theirs. Files that do not load (a key that is not the certificate's, a file
//! written half way) leave the last good certificate serving, and are logged and
//! counted in `sluice_tls_reloads_total{port,result="error"}` once they are found
//! the same at a second check (at most a second later, `SETTLE`): a certificate
//! and its key written one after the other are a mismatched pair for a moment, and
//! no refused renewal.
//!
//! A certificate out of its validity period is refused the same way, and stops
//! start-up: served, it would fail every handshake, and Envoy, failing open by
//! default, would let every request through unlimited. One whose `notBefore` is
//! near ([`validity::CLOCK_SKEW_SECS`]) is served; one further ahead is taken once
//! its time comes, without waiting for the files to change again. The serving
//! certificate's `notAfter` is `sluice_tls_certificate_expiry_timestamp_seconds{port}`.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::clock::Clock;
use crate::telemetry::Metrics;

mod listener;
mod san;

use crate::cert::{self as validity, OutOfDate, Stamp, Validity};
pub use listener::{handshake, HandshakeFailure, TlsListener};

/// Where a port's TLS files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates; when set, clients must present a certificate they sign.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: a DNS name the client certificate must also carry among
    /// its subject alternative names.
    pub client_san: Option<String>,
}

/// Why TLS files do not load.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: no PEM certificate in it", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)", path.display())]
    NoKey { path: PathBuf },
    #[error("{}: malformed PEM: {message}", path.display())]
    Pem { path: PathBuf, message: String },
    #[error("{} is not the key of {}", key.display(), cert.display())]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("{} and {}: {error}", cert.display(), key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        error: rustls::Error,
    },
    #[error("client CA {}: {message}", path.display())]
    ClientCa { path: PathBuf, message: String },
    #[error("{}: the certificate cannot be read: {message}", path.display())]
    Certificate {
        path: PathBuf,
        message: &'static str,
    },
    #[error("{}: the certificate expired at {} (it is now {})", path.display(), Stamp(*not_after), Stamp(*now))]
    Expired {
        path: PathBuf,
        not_after: i64,
        now: i64,
    },
    #[error(
        "{}: the certificate is not valid before {} (it is now {}; up to {} s ahead is allowed for clock skew)",
        path.display(), Stamp(*not_before), Stamp(*now), validity::CLOCK_SKEW_SECS
    )]
    NotYetValid {
        path: PathBuf,
        not_before: i64,
        now: i64,
    },
}

/// A port's TLS settings, swapped whole when the files change.
#[derive(Debug)]
pub struct Tls {
    /// `grpc` or `http`, for logs and metrics.
    port: &'static str,
    files: TlsFiles,
    alpn: Vec<Vec<u8>>,
    config: ArcSwap<ServerConfig>,
    last: Mutex<Last>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    /// Handshakes refused over a certificate or protocol, logged.
    refusals: sluice_grpc::RefusalLog,
}

/// How soon files refused as possibly mid-update (a certificate written, its key
/// not yet) are read again, at most: their refusal is reported if they are the same.
const SETTLE: Duration = Duration::from_secs(1);

/// The files as last read.
#[derive(Debug, Clone, Copy)]
struct Last {
    /// A hash of their contents.
    fingerprint: u64,
    /// Refused as not yet valid: the time (seconds) from which they would be taken.
    valid_from: Option<i64>,
    /// Refused as incomplete (see [`TlsError::may_be_mid_update`]) and not reported
    /// yet: reported if the next check finds the same files.
    unreported: bool,
}

impl Last {
    fn seen(fingerprint: u64) -> Last {
        Last {
            fingerprint,
            valid_from: None,
            unreported: false,
        }
    }
}

impl TlsError {
    /// Whether files refused so may be in the middle of an update: a certificate
    /// and its key written one after the other (`cp`, a configuration tool) are a
    /// mismatched pair in between, and a file being written is incomplete. A
    /// certificate out of its validity period is refused whole.
    fn may_be_mid_update(&self) -> bool {
        !matches!(
            self,
            TlsError::Expired { .. } | TlsError::NotYetValid { .. }
        )
    }
}

impl Tls {
    /// Loads `files` for `port`, offering `alpn` (`h2` for gRPC); `clock` tells
    /// whether the certificate is within its validity period.
    pub fn load(
        port: &'static str,
        files: TlsFiles,
        alpn: &[&[u8]],
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Result<Tls, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let contents = Contents::read(&files)?;
        let (config, validity) = contents.config(&files, &alpn, seconds(&*clock))?;
        metrics.declare_tls_port(port);
        metrics.tls_certificate_expiry(port, validity.not_after);
        tracing::info!(port, cert = %files.cert.display(), expires = %Stamp(validity.not_after), "TLS certificate loaded");
        Ok(Tls {
            port,
            last: Mutex::new(Last::seen(contents.fingerprint())),
            files,
            alpn,
            config: ArcSwap::from_pointee(config),
            metrics,
            clock,
            refusals: sluice_grpc::RefusalLog::default(),
        })
    }

    /// An acceptor with the current certificate, for one new connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.load_full())
    }

    /// Reads the files again and, if they changed and load, swaps the new
    /// certificate in. Returns whether it did.
    pub fn check(&self) -> bool {
        let contents = match Contents::read(&self.files) {
            Ok(c) => c,
            // A missing file in the middle of an update: the next poll sees the
            // finished one. Counted once for as long as the error stays the same.
            Err(e) => return self.refuse(&e, hash_of(&e.to_string())),
        };
        let fingerprint = contents.fingerprint();
        let now = seconds(&*self.clock);
        // Only the watcher calls this: the lock is never waited on.
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        // The same files, refused as not yet valid, are tried again once their
        // time has come; that try is counted only if it succeeds. The same files
        // refused as incomplete are reported now: they were not mid-update.
        let same = last.fingerprint == fingerprint;
        let settled = same && last.unreported;
        if same && !settled && last.valid_from.is_none_or(|t| t > now) {
            return false;
        }
        let again = same && !settled;
        *last = Last::seen(fingerprint);
        match contents.config(&self.files, &self.alpn, now) {
            Ok((config, validity)) => {
                self.config.store(Arc::new(config));
                tracing::info!(port = self.port, cert = %self.files.cert.display(), expires = %Stamp(validity.not_after), "TLS certificate reloaded");
                self.metrics.tls_reload(self.port, true);
                self.metrics
                    .tls_certificate_expiry(self.port, validity.not_after);
                true
            }
            Err(e) => {
                if let TlsError::NotYetValid { not_before, .. } = &e {
                    last.valid_from = Some(not_before - validity::CLOCK_SKEW_SECS);
                }
                if !settled && e.may_be_mid_update() {
                    // Reported at the next check if the files stay so.
                    last.unreported = true;
                } else if !again {
                    tracing::error!(port = self.port, error = %e, "TLS files refused; the last good certificate keeps serving");
                    self.metrics.tls_reload(self.port, false);
                }
                false
            }
        }
    }

    /// A read error, logged and counted once for as long as it stays the same,
    /// from the second check that finds it (a file replaced is missing a moment).
    fn refuse(&self, e: &TlsError, fingerprint: u64) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.fingerprint != fingerprint {
            *last = Last::seen(fingerprint);
            last.unreported = true;
        } else if last.unreported {
            last.unreported = false;
            tracing::error!(port = self.port, error = %e, "TLS files refused; the last good certificate keeps serving");
            self.metrics.tls_reload(self.port, false);
        }
        false
    }

    /// Polls the files every `interval`, and at once when `rereads` changes
    /// (SIGHUP), until `stop` resolves.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        stop: impl std::future::Future<Output = ()>,
        mut rereads: tokio::sync::watch::Receiver<()>,
    ) {
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Files refused as possibly mid-update are checked again soon, not a whole
        // (perhaps long) interval later, so that a refusal is not reported late.
        let settle = interval.min(SETTLE);
        let mut pending = false;
        loop {
            tokio::select! {
                _ = &mut stop => return,
                // At once on SIGHUP; without a sender the branch is off.
                Ok(()) = rereads.changed() => {}
                _ = tick.tick() => {}
                _ = tokio::time::sleep(settle), if pending => {}
            }
            self.check_off_runtime().await;
            pending = self.unreported();
        }
    }

    /// Whether the files as last read were refused as possibly mid-update, and
    /// not reported yet.
    fn unreported(&self) -> bool {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unreported
    }

    /// Small files, but a slow volume must not stall a worker thread.
    async fn check_off_runtime(self: &Arc<Self>) {
        let tls = self.clone();
        let _ = tokio::task::spawn_blocking(move || tls.check()).await;
    }
}

/// The bytes of a port's TLS files.
#[derive(Hash)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Contents {
    fn read(files: &TlsFiles) -> Result<Contents, TlsError> {
        Ok(Contents {
            cert: read(&files.cert)?,
            key: read(&files.key)?,
            client_ca: files.client_ca.as_deref().map(read).transpose()?,
        })
    }

    fn fingerprint(&self) -> u64 {
        hash_of(self)
    }

    /// A server configuration of these contents: TLS 1.3 and 1.2, ring's ciphers;
    /// and the validity of its certificate, which must hold at `now` (seconds).
    fn config(
        &self,
        files: &TlsFiles,
        alpn: &[Vec<u8>],
        now: i64,
    ) -> Result<(ServerConfig, Validity), TlsError> {
        let certs = certificates(&files.cert, &self.cert)?;
        // The server's own certificate only: the chain's others are the client's to
        // judge, and a client may reach a root by another path than an expired
        // cross-signature in the file.
        let validity = Validity::of(&certs[0]).map_err(|message| TlsError::Certificate {
            path: files.cert.clone(),
            message,
        })?;
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| match e {
            rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
                path: files.key.clone(),
            },
            e => TlsError::Pem {
                path: files.key.clone(),
                message: e.to_string(),
            },
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("ring supports TLS 1.2 and 1.3");
        let builder = match (&files.client_ca, &self.client_ca) {
            (Some(path), Some(pem)) => {
                let ca_error = |message: String| TlsError::ClientCa {
                    path: path.clone(),
                    message,
                };
                let mut roots = RootCertStore::empty();
                for ca in certificates(path, pem)? {
                    roots.add(ca).map_err(|e| ca_error(e.to_string()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| ca_error(e.to_string()))?;
                match &files.client_san {
                    Some(name) => builder.with_client_cert_verifier(Arc::new(
                        san::NamedClient::new(verifier, name).map_err(ca_error)?,
                    )),
                    None => builder.with_client_cert_verifier(verifier),
                }
            }
            _ => builder.with_no_client_auth(),
        };
        // Checks that the key is the certificate's.
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|error| match error {
                rustls::Error::InconsistentKeys(_) => TlsError::Mismatch {
                    cert: files.cert.clone(),
                    key: files.key.clone(),
                },
                error => TlsError::Pair {
                    cert: files.cert.clone(),
                    key: files.key.clone(),
                    error,
                },
            })?;
        config.alpn_protocols = alpn.to_vec();
        // After the pair is checked, so a wrong key is named as such whatever the dates.
        let path = || files.cert.clone();
        match validity.check(now) {
            Ok(()) => Ok((config, validity)),
            Err(OutOfDate::Expired) => Err(TlsError::Expired {
                path: path(),
                not_after: validity.not_after,
                now,
            }),
            Err(OutOfDate::NotYetValid) => Err(TlsError::NotYetValid {
                path: path(),
                not_before: validity.not_before,
                now,
            }),
        }
    }
}

/// The clock's time in whole seconds since the epoch.
fn seconds(clock: &dyn Clock) -> i64 {
    i64::try_from(clock.now() / 1_000_000).unwrap_or(i64::MAX)
}

fn hash_of(x: &impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        path: path.to_path_buf(),
        error,
    })
}

/// Every certificate in a PEM file; at least one.
fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    // testdata/make.sh: one key, its certificates valid through January 2030 and
    // through 2051.
    const KEY: &[u8] = include_bytes!("testdata/localhost.key");
    const JAN_2030: &[u8] = include_bytes!("testdata/2030.crt");
    const YEAR_2051: &[u8] = include_bytes!("testdata/2051.crt");
    /// Another key, and a certificate of it with the dates of `JAN_2030`.
    const OTHER_KEY: &[u8] = include_bytes!("testdata/other.key");
    const OTHER_JAN_2030: &[u8] = include_bytes!("testdata/other-2030.crt");
    const NOT_AFTER_2030: i64 = 1_896_134_400;
    const NOT_BEFORE_2051: i64 = 2_556_144_000;
    const NOT_AFTER_2051: i64 = 2_587_680_000;
    const DAY: i64 = 86_400;

    struct Fixture {
        dir: tempfile::TempDir,
        clock: ManualClock,
        metrics: Arc<Metrics>,
    }

    impl Fixture {
        fn new(cert: &[u8], now: i64) -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("tls.key"), KEY).unwrap();
            std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
            Fixture {
                dir,
                clock: ManualClock::new(now as u64 * 1_000_000),
                metrics: Arc::new(Metrics::new()),
            }
        }

        fn files(&self) -> TlsFiles {
            TlsFiles {
                cert: self.dir.path().join("tls.crt"),
                key: self.dir.path().join("tls.key"),
                client_ca: None,
                client_san: None,
            }
        }

        fn load(&self) -> Result<Tls, TlsError> {
            Tls::load(
                "grpc",
                self.files(),
                &[b"h2"],
                self.metrics.clone(),
                Arc::new(self.clock.clone()),
            )
        }

        fn set_now(&self, now: i64) {
            self.clock.set(now as u64 * 1_000_000);
        }

        fn write_cert(&self, cert: &[u8]) {
            std::fs::write(self.dir.path().join("tls.crt"), cert).unwrap();
        }

        fn write_key(&self, key: &[u8]) {
            std::fs::write(self.dir.path().join("tls.key"), key).unwrap();
        }

        /// A line of the metrics page, by its start.
        fn metric(&self, start: &str) -> Option<String> {
            self.metrics
                .render()
                .lines()
                .find(|l| l.starts_with(start))
                .map(str::to_string)
        }

        fn errors(&self) -> Option<String> {
            self.metric(r#"sluice_tls_reloads_total{port="grpc",result="error"}"#)
        }

        fn expiry(&self) -> Option<String> {
            self.metric("sluice_tls_certificate_expiry_timestamp_seconds{")
        }
    }

    #[test]
    fn a_certificate_in_its_period_loads_and_its_expiry_is_exported() {
        let f = Fixture::new(JAN_2030, NOT_AFTER_2030 - DAY);
        f.load().unwrap();
        assert_eq!(
            f.expiry().as_deref(),
            Some(r#"sluice_tls_certificate_expiry_timestamp_seconds{port="grpc"} 1896134400"#)
        );
    }

    #[test]
    fn an_expired_or_not_yet_valid_certificate_does_not_load() {
        let f = Fixture::new(JAN_2030, NOT_AFTER_2030 + 1);
        let e = f.load().unwrap_err();
        assert!(matches!(e, TlsError::Expired { .. }), "{e:?}");
        let shown = e.to_string();
        assert!(shown.contains("tls.crt"), "{shown}");
        assert!(shown.contains("expired at 2030-02-01T00:00:00Z"), "{shown}");

        let f = Fixture::new(YEAR_2051, NOT_BEFORE_2051 - validity::CLOCK_SKEW_SECS - 1);
        let e = f.load().unwrap_err();
        assert!(matches!(e, TlsError::NotYetValid { .. }), "{e:?}");
        let shown = e.to_string();
        assert!(
            shown.contains("tls.crt: the certificate is not valid before 2051-01-01T00:00:00Z"),
            "{shown}"
        );
        // Within the clock skew allowed, it loads.
        f.set_now(NOT_BEFORE_2051 - validity::CLOCK_SKEW_SECS);
        f.load().unwrap();
    }

    #[test]
    fn an_expired_renewal_is_refused_once_and_the_last_good_one_serves() {
        let f = Fixture::new(YEAR_2051, NOT_BEFORE_2051 + DAY);
        let tls = f.load().unwrap();
        let serving = tls.config.load_full();
        f.write_cert(JAN_2030);
        assert!(!tls.check());
        assert!(Arc::ptr_eq(&serving, &tls.config.load_full()));
        assert!(f.errors().unwrap().ends_with(" 1"));
        assert!(f.expiry().unwrap().ends_with(" 2587680000"));
        // Counted once while the files stay so.
        assert!(!tls.check());
        assert!(f.errors().unwrap().ends_with(" 1"));
    }

    /// `sluice_tls_refused` says 1 for as long as the refused files stay on disk
    /// (the counter moves once), and 0 once a change loads: what an alert on a
    /// refused renewal keeps firing on.
    #[test]
    fn a_refused_renewal_shows_until_a_change_loads() {
        let f = Fixture::new(YEAR_2051, NOT_BEFORE_2051 + DAY);
        let refused = || f.metric(r#"sluice_tls_refused{port="grpc"}"#);
        let tls = f.load().unwrap();
        assert_eq!(
            refused().as_deref(),
            Some(r#"sluice_tls_refused{port="grpc"} 0"#)
        );
        f.write_cert(JAN_2030);
        assert!(!tls.check());
        for _ in 0..3 {
            assert!(refused().unwrap().ends_with(" 1"), "{:?}", refused());
            f.set_now(NOT_BEFORE_2051 + 2 * DAY);
            assert!(!tls.check());
        }
        assert!(f.errors().unwrap().ends_with(" 1"));
        f.write_cert(YEAR_2051);
        assert!(tls.check());
        assert!(refused().unwrap().ends_with(" 0"), "{:?}", refused());
    }

    /// `cp new.crt tls.crt; cp new.key tls.key`: a check between the two finds a
    /// certificate and a key that do not match. That is no refused renewal: it is
    /// reported only if the next check finds the files the same.
    #[test]
    fn a_certificate_and_key_written_one_after_the_other_are_taken_without_an_error() {
        let f = Fixture::new(JAN_2030, NOT_AFTER_2030 - 2 * DAY);
        let tls = f.load().unwrap();
        let serving = tls.config.load_full();
        f.write_cert(OTHER_JAN_2030);
        assert!(!tls.check());
        assert!(Arc::ptr_eq(&serving, &tls.config.load_full()));
        f.write_key(OTHER_KEY);
        assert!(tls.check());
        assert!(!Arc::ptr_eq(&serving, &tls.config.load_full()));
        assert!(f.errors().unwrap().ends_with(" 0"), "{:?}", f.errors());

        // Left mismatched, the pair is refused at the next check, and once.
        let serving = tls.config.load_full();
        f.write_key(KEY);
        assert!(!tls.check());
        assert!(f.errors().unwrap().ends_with(" 0"), "{:?}", f.errors());
        assert!(!tls.check());
        assert!(f.errors().unwrap().ends_with(" 1"), "{:?}", f.errors());
        assert!(!tls.check());
        assert!(f.errors().unwrap().ends_with(" 1"), "{:?}", f.errors());
        assert!(Arc::ptr_eq(&serving, &tls.config.load_full()));
        // A file missing a moment (replaced by delete and create) is no error
        // either.
        std::fs::remove_file(f.dir.path().join("tls.key")).unwrap();
        assert!(!tls.check());
        f.write_key(OTHER_KEY);
        assert!(tls.check());
        assert!(f.errors().unwrap().ends_with(" 1"), "{:?}", f.errors());
    }

    #[test]
    fn a_renewal_ahead_of_its_time_is_taken_when_its_time_comes() {
        let f = Fixture::new(JAN_2030, NOT_AFTER_2030 - 2 * DAY);
        let tls = f.load().unwrap();
        let serving = tls.config.load_full();
        f.write_cert(YEAR_2051);
        assert!(!tls.check());
        assert!(Arc::ptr_eq(&serving, &tls.config.load_full()));
        assert!(f.errors().unwrap().ends_with(" 1"));
        // Still early: nothing changes, nothing more is counted.
        f.set_now(NOT_BEFORE_2051 - validity::CLOCK_SKEW_SECS - 1);
        assert!(!tls.check());
        assert!(Arc::ptr_eq(&serving, &tls.config.load_full()));
        assert!(f.errors().unwrap().ends_with(" 1"));
        // Its time has come, the files unchanged: it serves.
        f.set_now(NOT_BEFORE_2051 - validity::CLOCK_SKEW_SECS);
        assert!(tls.check());
        assert!(!Arc::ptr_eq(&serving, &tls.config.load_full()));
        assert!(f.errors().unwrap().ends_with(" 1"));
        assert!(f
            .metric(r#"sluice_tls_reloads_total{port="grpc",result="ok"}"#)
            .unwrap()
            .ends_with(" 1"));
        assert_eq!(
            f.expiry().unwrap(),
            format!(
                r#"sluice_tls_certificate_expiry_timestamp_seconds{{port="grpc"}} {NOT_AFTER_2051}"#
            )
        );
    }
}
