//! TLS for the gRPC and HTTP ports: a certificate, its key and, for mutual TLS, the
//! CA that client certificates must chain to, read from files and read again when
//! they change.
//!
//! The files are polled like the policy files (src/source/file.rs): a Kubernetes
//! Secret update swaps the `..data` symlink, and no event fires on the file the user
//! named. New connections get the new certificate; connections already open keep
//! theirs. Files that do not load (a key that is not the certificate's, a file
//! written half way) leave the last good certificate serving, and are logged and
//! counted in `sluice_tls_reloads_total{port,result="error"}`.

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

use crate::telemetry::Metrics;

mod listener;
mod san;

pub use listener::TlsListener;

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
}

/// A port's TLS settings, swapped whole when the files change.
#[derive(Debug)]
pub struct Tls {
    /// `grpc` or `http`, for logs and metrics.
    port: &'static str,
    files: TlsFiles,
    alpn: Vec<Vec<u8>>,
    config: ArcSwap<ServerConfig>,
    /// A hash of the files' contents as last read.
    last: Mutex<u64>,
    metrics: Arc<Metrics>,
}

impl Tls {
    /// Loads `files` for `port`, offering `alpn` (`h2` for gRPC).
    pub fn load(
        port: &'static str,
        files: TlsFiles,
        alpn: &[&[u8]],
        metrics: Arc<Metrics>,
    ) -> Result<Tls, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let contents = Contents::read(&files)?;
        let config = contents.config(&files, &alpn)?;
        metrics.declare_tls_port(port);
        Ok(Tls {
            port,
            last: Mutex::new(contents.fingerprint()),
            files,
            alpn,
            config: ArcSwap::from_pointee(config),
            metrics,
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
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if *last == fingerprint {
            return false;
        }
        *last = fingerprint;
        drop(last);
        match contents.config(&self.files, &self.alpn) {
            Ok(config) => {
                self.config.store(Arc::new(config));
                tracing::info!(port = self.port, cert = %self.files.cert.display(), "TLS certificate reloaded");
                self.metrics.tls_reload(self.port, true);
                true
            }
            Err(e) => {
                tracing::error!(port = self.port, error = %e, "TLS files refused; the last good certificate keeps serving");
                self.metrics.tls_reload(self.port, false);
                false
            }
        }
    }

    /// A read error, logged and counted once for as long as it stays the same.
    fn refuse(&self, e: &TlsError, fingerprint: u64) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if *last != fingerprint {
            *last = fingerprint;
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
        loop {
            tokio::select! {
                _ = &mut stop => return,
                // At once on SIGHUP; without a sender the branch is off.
                Ok(()) = rereads.changed() => self.check_off_runtime().await,
                _ = tick.tick() => self.check_off_runtime().await,
            }
        }
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

    /// A server configuration of these contents: TLS 1.3 and 1.2, ring's ciphers.
    fn config(&self, files: &TlsFiles, alpn: &[Vec<u8>]) -> Result<ServerConfig, TlsError> {
        let certs = certificates(&files.cert, &self.cert)?;
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
        Ok(config)
    }
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
