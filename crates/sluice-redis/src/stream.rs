//! A connection's byte stream: TCP, TLS over TCP (rustls) or a Unix socket.
//!
//! TLS trusts the system's authorities, read once per process with
//! `rustls-native-certs`, which honours `SSL_CERT_FILE` and `SSL_CERT_DIR` (a private
//! CA goes there), or the target's own `tls_ca` file, read at each connection. A
//! trusted certificate that the server presents as its own is accepted as pinned
//! (`pin.rs`). `#insecure` targets skip verifying the certificate but still
//! check the handshake's signatures; `tls_skip_hostname` ones skip only the name. A target's `tls_cert` and `tls_key` are
//! presented as the client's certificate.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::error::{self, Error, ErrorKind};
use crate::pin::PinnedOrChained;
use crate::target::{Addr, Target, Tls};

pub enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
}

/// Opens the stream to `target` (the caller bounds the wait).
pub async fn open(target: &Target) -> Result<Stream, Error> {
    let (host, port) = match &target.addr {
        Addr::Unix(path) => {
            let s = UnixStream::connect(path)
                .await
                .map_err(|e| error::io("connect", &e))?;
            return Ok(Stream::Unix(s));
        }
        Addr::Tcp { host, port } => (host, *port),
    };
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| error::io("connect", &e))?;
    // One small request at a time: Nagle's algorithm would hold it for an ACK.
    let _ = tcp.set_nodelay(true);
    let Some(tls) = &target.tls else {
        return Ok(Stream::Tcp(tcp));
    };
    let config = match (&tls.ca, &tls.client, tls.insecure) {
        (None, None, insecure) if !tls.skip_hostname => config(insecure)?,
        _ => files_config(tls)?,
    };
    let name = ServerName::try_from(host.clone()).map_err(|e| {
        Error::failed(
            ErrorKind::Connection,
            format!("TLS server name {host}: {e}"),
        )
    })?;
    let s = TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| {
            // A certificate refused (either way) is not mended by waiting: `tls`.
            let refused = e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>());
            let kind = if refused {
                ErrorKind::Tls
            } else {
                ErrorKind::Connection
            };
            Error::failed(kind, format!("TLS with {host}: {e}"))
        })?;
    Ok(Stream::Tls(Box::new(s)))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The client configuration, built once (the authorities are read once).
fn config(insecure: bool) -> Result<Arc<ClientConfig>, Error> {
    static VERIFIED: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
    static INSECURE: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
    let built = if insecure {
        INSECURE.get_or_init(|| {
            let builder = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?;
            let verifier = Arc::new(AnyCertificate(provider()));
            Ok(Arc::new(
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(verifier)
                    .with_no_client_auth(),
            ))
        })
    } else {
        VERIFIED.get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs.iter().cloned());
            if added == 0 {
                return Err(format!(
                    "no trusted certificate authorities found (SSL_CERT_FILE, SSL_CERT_DIR): {:?}",
                    found.errors
                ));
            }
            let verifier = PinnedOrChained::new(found.certs, provider())?;
            let config = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
    };
    built
        .clone()
        .map_err(|e| Error::failed(ErrorKind::Tls, format!("TLS: {e}")))
}

/// A client configuration from a target's files (`tls_ca`, `tls_cert`, `tls_key`),
/// read at each connection: a renewed certificate is used from the next one. A file
/// that cannot be used is a `tls` error naming it.
fn files_config(tls: &Tls) -> Result<Arc<ClientConfig>, Error> {
    let fail = |m: String| Error::failed(ErrorKind::Tls, format!("TLS: {m}"));
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = if tls.insecure {
        Arc::new(AnyCertificate(provider()))
    } else {
        let trusted = match &tls.ca {
            Some(path) => certificates(path).map_err(fail)?,
            None => {
                let found = rustls_native_certs::load_native_certs();
                found.certs
            }
        };
        let verifier = PinnedOrChained::new(trusted, provider()).map_err(|e| match &tls.ca {
            Some(path) => fail(format!("{}: {e}", path.display())),
            None => fail(e),
        })?;
        Arc::new(verifier.skip_hostname(tls.skip_hostname))
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &tls.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = certificates(cert).map_err(fail)?;
            let pem = std::fs::read(key).map_err(|e| fail(format!("{}: {e}", key.display())))?;
            let key_der = PrivateKeyDer::from_pem_slice(&pem)
                .map_err(|e| fail(format!("{}: no usable private key: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| fail(format!("{} and {}: {e}", cert.display(), key.display())))?
        }
    };
    Ok(Arc::new(config))
}

/// The PEM certificates of a file.
fn certificates(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// `#insecure`: any certificate, but a handshake signed by its key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
