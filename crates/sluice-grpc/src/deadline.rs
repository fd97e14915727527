//! A call's deadline, from its `grpc-timeout` header.
//!
//! Envoy sends its filter `timeout` (20 ms by default) as `grpc-timeout` and gives up
//! when it passes. The deadline counts from the moment the call's headers arrive, so
//! time spent waiting for the body counts against it, as it does for the client.
//! Envoy's body comes with its headers, and then the call is decided in the same
//! poll that read them: the whole timeout is left, and no clock is read. Only a
//! call that has to wait for its body (or streams) takes the time.

use std::time::Duration;

use http::{HeaderMap, HeaderName};

use super::status::{Code, GrpcError};

/// A prepared name: looking up a `&str` parses it first, three times the cost.
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// When a call must be answered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// The timeout the client gave.
    pub timeout: Duration,
    /// When the headers arrived, for a call that waited since; `None` for one
    /// decided in the poll that read its headers.
    since: Option<quanta::Instant>,
}

impl Deadline {
    /// A deadline `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        Deadline {
            timeout,
            since: Some(quanta::Instant::now()),
        }
    }

    /// A deadline `timeout` from now, for a call handled in the poll it arrived in.
    pub(super) fn at_once(timeout: Duration) -> Self {
        Deadline {
            timeout,
            since: None,
        }
    }

    /// A deadline `timeout` from `since`, when the headers arrived.
    pub(super) fn since(timeout: Duration, since: quanta::Instant) -> Self {
        Deadline {
            timeout,
            since: Some(since),
        }
    }

    /// The time left before the deadline; zero once it has passed.
    pub fn remaining(&self) -> Duration {
        match self.since {
            None => self.timeout,
            Some(t) => self
                .timeout
                .saturating_sub(quanta::Instant::now().saturating_duration_since(t)),
        }
    }

    /// The timeout of a call with these request headers, if it has one.
    pub fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, GrpcError> {
        let Some(value) = headers.get(GRPC_TIMEOUT) else {
            return Ok(None);
        };
        parse_timeout(value.as_bytes()).map(Some).ok_or_else(|| {
            GrpcError::new(
                Code::Internal,
                format!(
                    "malformed grpc-timeout {:?}",
                    String::from_utf8_lossy(value.as_bytes())
                ),
            )
        })
    }
}

/// `grpc-timeout`: at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
fn parse_timeout(v: &[u8]) -> Option<Duration> {
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_in_every_unit() {
        assert_eq!(parse_timeout(b"20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_timeout(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_timeout(b"0n"), Some(Duration::ZERO));
    }

    #[test]
    fn malformed_timeouts_are_refused() {
        for bad in [&b""[..], b"m", b"20", b"20x", b"-1m", b"123456789m", b"2 m"] {
            assert_eq!(
                parse_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut h = HeaderMap::new();
        h.insert("grpc-timeout", "soon".parse().unwrap());
        assert_eq!(Deadline::timeout(&h).unwrap_err().code, Code::Internal);
        assert_eq!(Deadline::timeout(&HeaderMap::new()), Ok(None));
    }

    #[test]
    fn a_deadline_counts_down_to_zero() {
        // quanta's mock clock stands in for the real one on this thread: time passes
        // only when the test moves it.
        let (clock, time) = quanta::Clock::mock();
        quanta::with_clock(&clock, || {
            time.increment(Duration::from_secs(1));
            let ms = Duration::from_millis;
            // Headers that arrived 15 ms ago, with 20 ms to answer: 5 ms left.
            let arrived = quanta::Instant::now() - ms(15);
            let d = Deadline::since(ms(20), arrived);
            assert_eq!(d.remaining(), ms(5));
            time.increment(ms(4));
            assert_eq!(d.remaining(), ms(1));
            // Passed: zero, not an underflow.
            time.increment(ms(6));
            assert_eq!(d.remaining(), Duration::ZERO);
            // One taken now counts from now.
            let later = Deadline::after(ms(20));
            time.increment(ms(8));
            assert_eq!(later.remaining(), ms(12));
            assert_eq!(Deadline::after(Duration::ZERO).remaining(), Duration::ZERO);
            // A call decided in the poll that read its headers keeps the whole
            // timeout, however long ago the clock says it began.
            let at_once = Deadline::at_once(ms(20));
            time.increment(ms(30));
            assert_eq!(at_once.remaining(), ms(20));
        });
    }
}
