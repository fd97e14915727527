//! Calendar windows: a budget per local day or month in an IANA time zone, reset at
//! local midnight (of the 1st, for a month), daylight saving included.
//!
//! A calendar window is a fixed window whose length and start change with the
//! calendar (a 23- or 25-hour day, a 28- to 31-day month). The limiter asks
//! [`Calendar::limit`] for the window holding its clock's `now` and hands the store a
//! plain `fixed_window` limit of that length, with the window's start as its `phase`,
//! so neither store (nor the Redis scripts) knows about time zones. With Redis the
//! script still decides on Redis's clock: a replica whose clock is off by a few
//! milliseconds near midnight has the script place the request in the neighbouring
//! window, whose start is still exact (the current window's end); only its length,
//! and so the reset it reports, may be the current one's.
//!
//! Only `fixed_window` takes a calendar window: the sliding algorithms and the
//! buckets count in spans of one fixed length, which a calendar does not have.

use std::sync::atomic::{AtomicU64, Ordering};

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::algorithm::{Limit, Micros, SECOND};

use super::Unit;

/// Which calendar span a window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// From local midnight to the next.
    Day,
    /// From local midnight of the 1st to that of the next month's 1st.
    Month,
}

impl Period {
    /// The spelling in policies (`calendar_day`), `None` for any other.
    pub fn parse(s: &str) -> Option<Period> {
        match s {
            "calendar_day" => Some(Period::Day),
            "calendar_month" => Some(Period::Month),
            _ => None,
        }
    }

    /// The spelling in policies.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "calendar_day",
            Period::Month => "calendar_month",
        }
    }

    /// The unit reported in `current_limit` (Envoy's DAY, MONTH).
    pub fn unit(self) -> Unit {
        match self {
            Period::Day => Unit::Day,
            Period::Month => Unit::Month,
        }
    }

    /// The length the rule states where one number is needed (the headers' `w=`,
    /// `sluice explain`'s window): a day, or the 30 days of envoyproxy/ratelimit's
    /// month. The store is given each window's true length.
    pub fn nominal(self) -> Micros {
        match self {
            Period::Day => 86_400 * SECOND,
            Period::Month => 30 * 86_400 * SECOND,
        }
    }
}

/// A calendar window: its period and time zone, and the last window it computed.
pub struct Calendar {
    period: Period,
    zone_name: String,
    zone: TimeZone,
    /// The last window computed, as start seconds << 24 | length seconds (0: none),
    /// so a request in the same window (nearly all) costs one relaxed load: no lock,
    /// no zone arithmetic.
    last: AtomicU64,
}

/// Bits of [`Calendar::last`] that hold the length in seconds (up to 194 days).
const LEN_BITS: u32 = 24;

impl Calendar {
    /// A calendar window in the IANA zone `zone_name` (`Europe/Berlin`, `UTC`), from
    /// the zone rules built into Sluice; the message says why a zone is refused.
    pub fn new(period: Period, zone_name: &str) -> Result<Calendar, String> {
        let zone = jiff::tz::TimeZoneDatabase::bundled()
            .get(zone_name)
            .map_err(|_| {
                format!(
                    "unknown time zone '{}' (expected an IANA name such as Europe/Berlin, America/New_York or UTC)",
                    super::node::shorten(zone_name)
                )
            })?;
        Ok(Calendar {
            period,
            zone_name: zone_name.to_string(),
            zone,
            last: AtomicU64::new(0),
        })
    }

    pub fn period(&self) -> Period {
        self.period
    }

    /// The zone's IANA name as the policy wrote it.
    pub fn zone_name(&self) -> &str {
        &self.zone_name
    }

    /// `base` (a `fixed_window` limit) over the calendar window holding `now`: its
    /// true length, starting at its local midnight.
    pub fn limit(&self, base: Limit, now: Micros) -> Limit {
        let (start, len) = self.window(now);
        Limit {
            window: len,
            phase: start % len,
            ..base
        }
    }

    /// The calendar window holding `now`: its start and length in microseconds.
    pub fn window(&self, now: Micros) -> (Micros, Micros) {
        let packed = self.last.load(Ordering::Relaxed);
        if packed != 0 {
            let start = (packed >> LEN_BITS) * SECOND;
            let len = (packed & ((1 << LEN_BITS) - 1)) * SECOND;
            if start <= now && now - start < len {
                return (start, len);
            }
        }
        let (start, len) = self.compute(now);
        if start.is_multiple_of(SECOND) && len.is_multiple_of(SECOND) {
            let (s, l) = (start / SECOND, len / SECOND);
            if s < 1 << (64 - LEN_BITS) && l < 1 << LEN_BITS {
                self.last.store(s << LEN_BITS | l, Ordering::Relaxed);
            }
        }
        (start, len)
    }

    /// The window holding `now`, from the zone's rules. A time the zone arithmetic
    /// cannot place (years beyond 9999) gets a window of the nominal length aligned
    /// to the epoch.
    fn compute(&self, now: Micros) -> (Micros, Micros) {
        let fallback = || {
            let len = self.period.nominal();
            (now - now % len, len)
        };
        let Ok(at) = Timestamp::from_microsecond(i64::try_from(now).unwrap_or(i64::MAX)) else {
            return fallback();
        };
        let here = at.to_zoned(self.zone.clone());
        let bounds = match self.period {
            Period::Day => here
                .start_of_day()
                .and_then(|s| Ok((here.tomorrow()?.start_of_day()?, s))),
            Period::Month => here.first_of_month().and_then(|first| {
                let s = first.start_of_day()?;
                let next = first.checked_add(1.month())?.start_of_day()?;
                Ok((next, s))
            }),
        };
        let Ok((end, start)) = bounds else {
            return fallback();
        };
        let micros = |z: &jiff::Zoned| u64::try_from(z.timestamp().as_microsecond()).ok();
        match (micros(&start), micros(&end)) {
            (Some(s), Some(e)) if s <= now && now < e => (s, e - s),
            _ => fallback(),
        }
    }
}

impl Clone for Calendar {
    fn clone(&self) -> Self {
        Calendar {
            period: self.period,
            zone_name: self.zone_name.clone(),
            zone: self.zone.clone(),
            last: AtomicU64::new(self.last.load(Ordering::Relaxed)),
        }
    }
}

/// Two calendars are the same window when their period and zone are.
impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.period == other.period && self.zone_name == other.zone_name
    }
}

impl std::fmt::Debug for Calendar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calendar")
            .field("period", &self.period)
            .field("zone", &self.zone_name)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{decide, Algorithm};

    const HOUR: Micros = 3_600 * SECOND;

    /// Microseconds of an RFC 3339 instant.
    fn at(s: &str) -> Micros {
        let t: Timestamp = s.parse().expect("a timestamp");
        u64::try_from(t.as_microsecond()).expect("after the epoch")
    }

    fn berlin(period: Period) -> Calendar {
        Calendar::new(period, "Europe/Berlin").expect("a zone")
    }

    #[test]
    fn a_day_runs_from_local_midnight_to_the_next() {
        let c = berlin(Period::Day);
        // 2026-07-14 in Berlin is UTC+2: midnight is 22:00 UTC the day before.
        let (start, len) = c.window(at("2026-07-14T12:00:00Z"));
        assert_eq!(start, at("2026-07-13T22:00:00Z"));
        assert_eq!(len, 24 * HOUR);
        // The last microsecond of the day is in it; midnight starts the next.
        assert_eq!(c.window(at("2026-07-14T21:59:59.999999Z")).0, start);
        assert_eq!(c.window(at("2026-07-14T22:00:00Z")).0, start + len);
    }

    #[test]
    fn daylight_saving_makes_a_23_and_a_25_hour_day() {
        let c = berlin(Period::Day);
        // 2026-03-29: clocks go from 02:00 to 03:00 (CET to CEST).
        let (start, len) = c.window(at("2026-03-29T10:00:00Z"));
        assert_eq!(start, at("2026-03-28T23:00:00Z"));
        assert_eq!(len, 23 * HOUR);
        assert_eq!(
            c.window(at("2026-03-29T22:00:00Z")),
            (start + len, 24 * HOUR)
        );
        // 2026-10-25: clocks go from 03:00 back to 02:00.
        let (start, len) = c.window(at("2026-10-25T10:00:00Z"));
        assert_eq!(start, at("2026-10-24T22:00:00Z"));
        assert_eq!(len, 25 * HOUR);
        assert_eq!(
            c.window(at("2026-10-25T23:00:00Z")),
            (start + len, 24 * HOUR)
        );
    }

    #[test]
    fn a_month_runs_from_midnight_of_the_first() {
        let c = berlin(Period::Month);
        let (start, len) = c.window(at("2026-02-14T12:00:00Z"));
        assert_eq!(start, at("2026-01-31T23:00:00Z"));
        assert_eq!(len, 28 * 24 * HOUR);
        // The last instant of February, local time, then March 1st; March loses an
        // hour to daylight saving.
        assert_eq!(c.window(at("2026-02-28T22:59:59Z")).0, start);
        let (march, len) = c.window(at("2026-02-28T23:00:00Z"));
        assert_eq!(march, at("2026-02-28T23:00:00Z"));
        assert_eq!(len, 31 * 24 * HOUR - HOUR);
        // New York's month ends at its own midnight, five hours after UTC's.
        let ny = Calendar::new(Period::Month, "America/New_York").expect("a zone");
        assert_eq!(
            ny.window(at("2026-02-01T04:59:59Z")).0,
            at("2026-01-01T05:00:00Z")
        );
        assert_eq!(
            ny.window(at("2026-02-01T05:00:00Z")).0,
            at("2026-02-01T05:00:00Z")
        );
    }

    #[test]
    fn a_cached_window_is_left_for_a_time_before_it() {
        let c = Calendar::new(Period::Day, "UTC").expect("a zone");
        let day = 24 * HOUR;
        assert_eq!(
            c.window(at("2026-07-14T12:00:00Z")).0,
            at("2026-07-14T00:00:00Z")
        );
        // The clock stepped back a day: the earlier day, not the cached one.
        assert_eq!(
            c.window(at("2026-07-13T12:00:00Z")),
            (at("2026-07-13T00:00:00Z"), day)
        );
    }

    #[test]
    fn the_limit_counts_one_budget_per_local_day_across_a_25_hour_day() {
        let c = berlin(Period::Day);
        let base = Limit {
            algorithm: Algorithm::FixedWindow,
            requests: 2,
            window: Period::Day.nominal(),
            burst: 2,
            phase: 0,
        };
        let mut state = None;
        let mut hit = |now: Micros| {
            let d = decide(&c.limit(base, now), state.as_ref(), now, 1);
            if let Some(next) = d.next {
                state = Some(next);
            }
            d.verdict
        };
        // Local 00:30 and 23:30 of 2026-10-25 are 25 hours apart: one day.
        assert!(hit(at("2026-10-24T22:30:00Z")).admitted);
        let v = hit(at("2026-10-25T22:30:00Z"));
        assert!(v.admitted);
        assert_eq!(v.reset, 30 * 60 * SECOND);
        let v = hit(at("2026-10-25T22:59:59Z"));
        assert!(!v.admitted);
        assert_eq!(v.retry_after, SECOND);
        // Local midnight of the 26th: a new budget.
        assert!(hit(at("2026-10-25T23:00:00Z")).admitted);
    }

    #[test]
    fn an_unknown_zone_is_refused() {
        let e = Calendar::new(Period::Day, "Europe/Atlantis").unwrap_err();
        assert!(e.starts_with("unknown time zone 'Europe/Atlantis'"), "{e}");
        assert!(Calendar::new(Period::Day, "").is_err());
    }
}
