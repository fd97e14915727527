//! A connection's byte stream: TCP, TLS over TCP (rustls) or a Unix socket.
//!
//! TLS trusts the system's authorities, read once per process with
//! `rustls-native-certs`, which honours `SSL_CERT_FILE` and `SSL_CERT_DIR` (a private
//! CA goes there). `#insecure` targets skip verifying the certificate but still
//! check the handshake's signatures.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::store::{ErrorKind, StoreError};

use super::super::classify;
use super::target::{Addr, Target};

pub enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
}

/// Opens the stream to `target` (the caller bounds the wait).
pub async fn open(target: &Target) -> Result<Stream, StoreError> {
    let (host, port) = match &target.addr {
        Addr::Unix(path) => {
            let s = UnixStream::connect(path)
                .await
                .map_err(|e| classify::io("connect", &e))?;
            return Ok(Stream::Unix(s));
        }
        Addr::Tcp { host, port } => (host, *port),
    };
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| classify::io("connect", &e))?;
    // One small request at a time: Nagle's algorithm would hold it for an ACK.
    let _ = tcp.set_nodelay(true);
    let Some(tls) = target.tls else {
        return Ok(Stream::Tcp(tcp));
    };
    let config = config(tls.insecure)?;
    let name = ServerName::try_from(host.clone()).map_err(|e| {
        StoreError::failed(
            ErrorKind::Connection,
            format!("TLS server name {host}: {e}"),
        )
    })?;
    let s = TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| StoreError::failed(ErrorKind::Connection, format!("TLS: {e}")))?;
    Ok(Stream::Tls(Box::new(s)))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The client configuration, built once (the authorities are read once).
fn config(insecure: bool) -> Result<Arc<ClientConfig>, StoreError> {
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
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "no trusted certificate authorities found (SSL_CERT_FILE, SSL_CERT_DIR): {:?}",
                    found.errors
                ));
            }
            let config = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
    };
    built
        .clone()
        .map_err(|e| StoreError::failed(ErrorKind::Connection, format!("TLS: {e}")))
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
