//! A certificate's validity period (RFC 5280 `Validity`: `notBefore`, `notAfter`),
//! read from its DER at load time. rustls serves a certificate whatever its dates,
//! and webpki, which checks them when verifying a peer, does not expose them; the
//! few fields before `Validity` in `TBSCertificate` are walked here instead of
//! pulling in an X.509 parser.

use std::fmt;
use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// How far in the future a certificate's `notBefore` may be and still be served:
/// cert-manager and most CAs stamp a new certificate with the time of issue, and a
/// replica whose clock is a little behind the issuer's must not refuse it.
pub const CLOCK_SKEW_SECS: i64 = 300;

/// When a certificate is valid, in seconds since the Unix epoch (both ends included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

/// Why a certificate cannot be served at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfDate {
    /// `notAfter` has passed.
    Expired,
    /// `notBefore` is more than [`CLOCK_SKEW_SECS`] away.
    NotYetValid,
}

impl Validity {
    /// The validity of the DER certificate `der`; the error says what is malformed.
    pub fn of(der: &[u8]) -> Result<Validity, &'static str> {
        const NOT_A_CERTIFICATE: &str = "not an X.509 certificate";
        let (cert, _) = expect(der, SEQUENCE).ok_or(NOT_A_CERTIFICATE)?;
        let (tbs, _) = expect(cert, SEQUENCE).ok_or(NOT_A_CERTIFICATE)?;
        // version [0] EXPLICIT (absent for v1), serialNumber, signature, issuer.
        let mut rest = tbs;
        if rest.first() == Some(&VERSION) {
            rest = tlv(rest).ok_or(NOT_A_CERTIFICATE)?.2;
        }
        let (_, rest) = expect(rest, INTEGER).ok_or(NOT_A_CERTIFICATE)?;
        let (_, rest) = expect(rest, SEQUENCE).ok_or(NOT_A_CERTIFICATE)?;
        let (_, rest) = expect(rest, SEQUENCE).ok_or(NOT_A_CERTIFICATE)?;
        let (validity, _) = expect(rest, SEQUENCE).ok_or(NOT_A_CERTIFICATE)?;
        let (not_before, rest) = time(validity).ok_or("malformed notBefore")?;
        let (not_after, _) = time(rest).ok_or("malformed notAfter")?;
        Ok(Validity {
            not_before,
            not_after,
        })
    }

    /// Whether the certificate may be served at `now` (seconds since the epoch).
    pub fn check(&self, now: i64) -> Result<(), OutOfDate> {
        if now > self.not_after {
            Err(OutOfDate::Expired)
        } else if self.not_before > now.saturating_add(CLOCK_SKEW_SECS) {
            Err(OutOfDate::NotYetValid)
        } else {
            Ok(())
        }
    }
}

/// Warns when the client certificate in `path`, which Sluice presents to `peer`,
/// is out of its validity period at `now` (seconds): the peer will refuse every
/// handshake. Only a warning: the refusals show where they happen (the store's
/// `tls` errors, `sluice_xds_connected`), the file is read again at each
/// connection, and a renewal may be on its way. A file that cannot be read is
/// left to the code that reads it.
pub fn warn_if_out_of_date(path: &Path, peer: &str, now: i64) {
    let Ok(pem) = std::fs::read(path) else {
        return;
    };
    let Some(Ok(cert)) = CertificateDer::pem_slice_iter(&pem).next() else {
        return;
    };
    let Ok(validity) = Validity::of(&cert) else {
        return;
    };
    match validity.check(now) {
        Ok(()) => {}
        Err(OutOfDate::Expired) => tracing::warn!(
            cert = %path.display(),
            expired = %Stamp(validity.not_after),
            "the client certificate presented to {peer} has expired: {peer} will refuse it"
        ),
        Err(OutOfDate::NotYetValid) => tracing::warn!(
            cert = %path.display(),
            valid_from = %Stamp(validity.not_before),
            "the client certificate presented to {peer} is not valid yet: {peer} will refuse it"
        ),
    }
}

/// The system clock's time in whole seconds since the epoch.
pub fn now_seconds() -> i64 {
    use crate::clock::Clock;
    i64::try_from(crate::clock::SystemClock.now() / 1_000_000).unwrap_or(i64::MAX)
}

/// Seconds since the epoch as an RFC 3339 UTC time, for messages.
pub struct Stamp(pub i64);

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match jiff::Timestamp::from_second(self.0) {
            Ok(t) => write!(f, "{t}"),
            Err(_) => write!(f, "{} s after the epoch", self.0),
        }
    }
}

const INTEGER: u8 = 0x02;
const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
const VERSION: u8 = 0xa0;

/// One DER element: its tag, its contents and what follows it.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, input) = input.split_first()?;
    let (&first, mut input) = input.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        // Long form: 1 to 4 bytes of length; a certificate is never larger.
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || input.len() < n {
            return None;
        }
        let (bytes, rest) = input.split_at(n);
        input = rest;
        bytes.iter().fold(0usize, |l, &b| (l << 8) | usize::from(b))
    };
    if input.len() < len {
        return None;
    }
    let (contents, rest) = input.split_at(len);
    Some((tag, contents, rest))
}

fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    match tlv(input)? {
        (t, contents, rest) if t == tag => Some((contents, rest)),
        _ => None,
    }
}

/// A `Time`: UTCTime `YYMMDDHHMMSSZ` (years 1950 to 2049) or GeneralizedTime
/// `YYYYMMDDHHMMSSZ`, the only forms RFC 5280 allows.
fn time(input: &[u8]) -> Option<(i64, &[u8])> {
    let (tag, contents, rest) = tlv(input)?;
    let (year, digits) = match (tag, contents.len()) {
        (UTC_TIME, 13) => {
            let yy = number(&contents[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &contents[2..])
        }
        (GENERALIZED_TIME, 15) => (number(&contents[..4])?, &contents[4..]),
        _ => return None,
    };
    if digits[10] != b'Z' {
        return None;
    }
    let field = |i: usize| number(&digits[i..i + 2]).and_then(|n| i8::try_from(n).ok());
    let at = jiff::civil::DateTime::new(
        i16::try_from(year).ok()?,
        field(0)?,
        field(2)?,
        field(4)?,
        field(6)?,
        field(8)?,
        0,
    )
    .ok()?;
    let seconds = at
        .to_zoned(jiff::tz::TimeZone::UTC)
        .ok()?
        .timestamp()
        .as_second();
    Some((seconds, rest))
}

fn number(digits: &[u8]) -> Option<i64> {
    digits.iter().try_fold(0i64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + i64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made by tls/testdata/make.sh: a CA's certificates for localhost, valid from
    // 2030-01-01T00:00:00Z to 2030-02-01T00:00:00Z (UTCTime), and from
    // 2051-01-01T00:00:00Z to 2052-01-01T00:00:00Z (GeneralizedTime, past 2049).
    const UTC: &[u8] = include_bytes!("tls/testdata/2030.crt");
    const GENERALIZED: &[u8] = include_bytes!("tls/testdata/2051.crt");
    const JAN_2030: i64 = 1_893_456_000;
    const FEB_2030: i64 = 1_896_134_400;
    const JAN_2051: i64 = 2_556_144_000;
    const JAN_2052: i64 = 2_587_680_000;

    fn validity(pem: &[u8]) -> Validity {
        Validity::of(&CertificateDer::from_pem_slice(pem).unwrap()).unwrap()
    }

    #[test]
    fn both_time_forms_are_read() {
        assert_eq!(
            validity(UTC),
            Validity {
                not_before: JAN_2030,
                not_after: FEB_2030
            }
        );
        assert_eq!(
            validity(GENERALIZED),
            Validity {
                not_before: JAN_2051,
                not_after: JAN_2052
            }
        );
    }

    #[test]
    fn valid_expired_and_not_yet_valid() {
        let v = validity(UTC);
        // Valid, both ends included.
        assert_eq!(v.check(JAN_2030), Ok(()));
        assert_eq!(v.check(JAN_2030 + 86_400), Ok(()));
        assert_eq!(v.check(FEB_2030), Ok(()));
        // Expired from the second after notAfter: no skew is allowed there, since
        // the certificate is about to go either way.
        assert_eq!(v.check(FEB_2030 + 1), Err(OutOfDate::Expired));
        assert_eq!(v.check(FEB_2030 + 365 * 86_400), Err(OutOfDate::Expired));
        // Not yet valid more than five minutes before notBefore; within them the
        // clock is taken to be behind the issuer's.
        assert_eq!(v.check(JAN_2030 - CLOCK_SKEW_SECS), Ok(()));
        assert_eq!(
            v.check(JAN_2030 - CLOCK_SKEW_SECS - 1),
            Err(OutOfDate::NotYetValid)
        );
        assert_eq!(v.check(0), Err(OutOfDate::NotYetValid));
    }

    #[test]
    fn dates_are_shown_in_utc() {
        assert_eq!(Stamp(FEB_2030).to_string(), "2030-02-01T00:00:00Z");
    }

    #[test]
    fn malformed_certificates_are_errors_not_panics() {
        let der = CertificateDer::from_pem_slice(UTC).unwrap().to_vec();
        for cut in 0..der.len() {
            assert!(Validity::of(&der[..cut]).is_err(), "cut at {cut}");
        }
        assert!(Validity::of(b"").is_err());
        assert!(Validity::of(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(Validity::of(&[0x30, 0x80]).is_err());
        // A notAfter that is not a date.
        let at = der
            .windows(13)
            .position(|w| w == b"300201000000Z")
            .expect("notAfter");
        let mut bad = der.clone();
        bad[at + 2] = b'1';
        bad[at + 3] = b'3';
        assert_eq!(Validity::of(&bad), Err("malformed notAfter"));
    }
}
