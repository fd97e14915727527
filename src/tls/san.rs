//! A client certificate checked for a name as well as its authority
//! (`--grpc-tls-client-san`, envoyproxy/ratelimit's `GRPC_CLIENT_TLS_SAN`): the
//! certificate must chain to the client CA, as without a name, and carry the name
//! among its DNS subject alternative names, matched by webpki's rules (a `*.`
//! wildcard in the certificate matches one label, and is taken only with at least
//! two labels after it: `*.example.com`, not `*.local`; Go also takes the latter).

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

/// [`ClientCertVerifier`] of the authority (`inner`) and then of the name.
#[derive(Debug)]
pub struct NamedClient {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl NamedClient {
    /// `name` must be a DNS name; the error says why it is not.
    pub fn new(inner: Arc<dyn ClientCertVerifier>, name: &str) -> Result<Self, String> {
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| format!("{name:?} is not a DNS name: {e}"))?;
        if !matches!(name, ServerName::DnsName(_)) {
            return Err(format!("{name:?} is not a DNS name"));
        }
        Ok(NamedClient { inner, name })
    }
}

impl ClientCertVerifier for NamedClient {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
