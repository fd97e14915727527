//! Verifying a Redis server's certificate against the authorities sluice trusts for
//! it, with one addition: a certificate that is itself one of those trusted (a
//! self-signed server certificate handed over as the authority, as
//! `openssl req -x509` makes it, marked CA) is accepted as *pinned* when the server
//! presents it: byte for byte the trusted one, within its dates and carrying the
//! server's name. webpki alone refuses it (`CaUsedAsEndEntity`); Go's TLS, which
//! envoyproxy/ratelimit's users have, accepts it. Any other certificate must chain
//! to the authorities as usual.
//!
//! With the name check skipped (envoyproxy/ratelimit's
//! `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`), both ways still check the rest: the
//! chain (or the pinned bytes), the dates and the handshake's signatures.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

/// See the module doc.
#[derive(Debug)]
pub struct PinnedOrChained {
    pinned: Vec<CertificateDer<'static>>,
    chained: Arc<WebPkiServerVerifier>,
    provider: Arc<CryptoProvider>,
    skip_hostname: bool,
}

impl PinnedOrChained {
    /// Trusts `certs` (authorities, or pinned server certificates); the error says
    /// why they cannot be used.
    pub fn new(
        certs: Vec<CertificateDer<'static>>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(certs.iter().cloned());
        if added == 0 {
            return Err("no usable certificate among the trusted ones".into());
        }
        let chained =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| e.to_string())?;
        Ok(PinnedOrChained {
            pinned: certs,
            chained,
            provider,
            skip_hostname: false,
        })
    }

    /// Accepts a certificate whatever names it carries, when `skip`.
    pub fn skip_hostname(mut self, skip: bool) -> Self {
        self.skip_hostname = skip;
        self
    }
}

impl ServerCertVerifier for PinnedOrChained {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if !self
            .pinned
            .iter()
            .any(|p| p.as_ref() == end_entity.as_ref())
        {
            let verified =
                self.chained
                    .verify_server_cert(end_entity, intermediates, name, ocsp, now);
            // webpki checks the chain (and revocation) before the name, so a refusal
            // for the name alone means everything else passed.
            return match verified {
                Err(Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) if self.skip_hostname => Ok(ServerCertVerified::assertion()),
                other => other,
            };
        }
        let bad = || Error::InvalidCertificate(CertificateError::BadEncoding);
        let (not_before, not_after) = validity(end_entity).ok_or_else(bad)?;
        let now = now.as_secs() as i64;
        if now < not_before {
            return Err(Error::InvalidCertificate(CertificateError::NotValidYet));
        }
        if now > not_after {
            return Err(Error::InvalidCertificate(CertificateError::Expired));
        }
        if self.skip_hostname {
            return Ok(ServerCertVerified::assertion());
        }
        webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| bad())?
            .verify_is_valid_for_subject_name(name)
            .map_err(|_| Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A certificate's `notBefore` and `notAfter` in Unix seconds, read from its DER:
/// Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL,
/// serialNumber, signature, issuer, validity SEQUENCE { notBefore, notAfter }, ...
fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (cert, _) = sequence(der)?;
    let (tbs, _) = sequence(cert)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = tlv(rest)?.2;
    }
    for _ in 0..3 {
        rest = tlv(rest)?.2;
    }
    let (validity, _) = sequence(rest)?;
    let (not_before, rest) = time(validity)?;
    let (not_after, _) = time(rest)?;
    Some((not_before, not_after))
}

/// One DER element: its tag, its content and what follows it.
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let first = *b.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let len = b
            .get(2..2 + n)?
            .iter()
            .fold(0usize, |acc, &x| (acc << 8) | usize::from(x));
        (len, 2 + n)
    };
    let end = header.checked_add(len)?;
    Some((tag, b.get(header..end)?, b.get(end..)?))
}

fn sequence(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (tag, content, rest) = tlv(b)?;
    (tag == 0x30).then_some((content, rest))
}

/// A UTCTime or GeneralizedTime (`...Z`, as RFC 5280 requires) in Unix seconds.
fn time(b: &[u8]) -> Option<(i64, &[u8])> {
    let (tag, content, rest) = tlv(b)?;
    let text = std::str::from_utf8(content).ok()?.strip_suffix('Z')?;
    let (year, text) = match tag {
        0x17 => {
            let yy: i64 = text.get(..2)?.parse().ok()?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
        }
        0x18 => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    if text.len() != 10 || !text.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let n = |at: usize| -> i64 { text[at..at + 2].parse().unwrap_or(0) };
    let (month, day, hour, minute, second) = (n(0), n(2), n(4), n(6), n(8));
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some((days * 86_400 + hour * 3600 + minute * 60 + second, rest))
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_count_from_the_epoch() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 12, 2), 20_789);
    }

    #[test]
    fn times_of_both_encodings_are_read() {
        // UTCTime 261202063000Z and GeneralizedTime 20501231235959Z.
        let utc = [&[0x17, 13][..], b"261202063000Z"].concat();
        let (t, rest) = time(&utc).unwrap();
        assert_eq!(t, 20_789 * 86_400 + 6 * 3600 + 30 * 60);
        assert!(rest.is_empty());
        let general = [&[0x18, 15][..], b"20501231235959Z"].concat();
        let (t, _) = time(&general).unwrap();
        assert_eq!(t, (days_from_civil(2050, 12, 31) + 1) * 86_400 - 1);
        for bad in [
            [&[0x17, 13][..], b"261302063000Z"].concat(),
            [&[0x17, 12][..], b"2612020630Z0"].concat(),
            [&[0x17, 40][..], b"261202063000Z"].concat(),
            vec![0x17],
        ] {
            assert!(time(&bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn garbage_is_no_certificate() {
        assert!(validity(&[]).is_none());
        assert!(validity(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        assert!(validity(&[0x30, 0x03, 0x30, 0x01, 0x00]).is_none());
    }
}
