//! Time as the decision path sees it: one injected clock, so every test is
//! deterministic and no decision reads the wall clock behind the caller's back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::algorithm::Micros;

/// A source of "now" in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Micros;
}

/// The process clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as Micros)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to; for tests.
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start: Micros) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start)))
    }

    pub fn set(&self, now: Micros) {
        self.0.store(now, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Micros) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}

/// Lets something happen at most once a period: a log line about an event a
/// client may repeat many times a second.
#[derive(Debug)]
pub struct Every {
    period: Micros,
    /// When it last happened (0: never).
    last: AtomicU64,
}

impl Every {
    pub const fn new(period: Micros) -> Self {
        Every {
            period,
            last: AtomicU64::new(0),
        }
    }

    /// Whether it may happen `now`: the first time, and then once `period` has
    /// passed since the last time it did. Of callers racing, one gets true.
    pub fn due(&self, now: Micros) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < self.period {
            return false;
        }
        self.last
            .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}
/// `t` in RFC 3339, UTC, to the millisecond (`2024-05-01T12:00:00.250Z`), for JSON
/// read by people; times before 1970 show as the epoch.
pub fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_date((secs / 86_400) as i64);
    let rest = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_date(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lets_one_through_per_period() {
        let every = Every::new(60);
        assert!(every.due(1_000));
        assert!(!every.due(1_000));
        assert!(!every.due(1_059));
        assert!(every.due(1_060));
        assert!(!every.due(1_100));
        // A clock at 0 still counts as a first time, and the next waits a period.
        let early = Every::new(60);
        assert!(early.due(0));
        assert!(!early.due(30));
    }
    use std::time::Duration;

    #[test]
    fn rfc3339_known_answers() {
        let at = |secs: u64, ms: u64| {
            rfc3339(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 0), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(951_868_799, 999), "2000-02-29T23:59:59.999Z");
        assert_eq!(at(1_700_000_000, 250), "2023-11-14T22:13:20.250Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00.000Z"
        );
    }
}
