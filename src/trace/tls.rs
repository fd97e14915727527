//! TLS to an https:// collector: its authorities (the system's, or the configured
//! CA's) and the client certificate, read when tracing starts. A file that cannot
//! be used stops start-up, naming the flag or variable that gave it, rather than
//! failing each export later.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use super::config::Tls;

/// A client configuration for `tls`, offering no ALPN protocol (hyper's connector
/// adds its own, and refuses a configuration that has some).
pub fn client_config(tls: &Tls) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    match &tls.ca {
        Some((name, path)) => {
            for cert in certificates(name, path)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("{name}={}: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "no trusted certificate authorities found for the https:// collector \
                     (SSL_CERT_FILE, SSL_CERT_DIR); give one with --otlp-tls-ca: {:?}",
                    found.errors
                ));
            }
        }
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
    match (&tls.cert, &tls.key) {
        (Some((cert_name, cert)), Some((key_name, key))) => {
            let chain = certificates(cert_name, cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                format!(
                    "{key_name}={}: no usable PEM private key (PKCS#1, PKCS#8 or SEC1): {e}",
                    key.display()
                )
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("{cert_name} and {key_name}: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// The same for the gRPC exporter's tonic channel (checked through
/// [`client_config`] first: tonic would find a bad file only when connecting).
pub fn tonic_config(tls: &Tls) -> Result<tonic::transport::ClientTlsConfig, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    client_config(tls)?;
    let read = |name: &str, path: &Path| {
        std::fs::read(path).map_err(|e| format!("{name}={}: {e}", path.display()))
    };
    let mut config = ClientTlsConfig::new();
    config = match &tls.ca {
        Some((name, path)) => config.ca_certificate(Certificate::from_pem(read(name, path)?)),
        None => config.with_native_roots(),
    };
    if let (Some((cert_name, cert)), Some((key_name, key))) = (&tls.cert, &tls.key) {
        config = config.identity(Identity::from_pem(
            read(cert_name, cert)?,
            read(key_name, key)?,
        ));
    }
    Ok(config)
}

/// The PEM certificates in `path`, at least one.
fn certificates(name: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{name}={shown}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{name}={shown}: no PEM certificate in the file"));
    }
    Ok(certs)
}
