//! Denial spikes of a `sensitive` rule (a login or password-reset path): denials of
//! the last minute against the rule's own baseline, an exponentially weighted mean of
//! its denials per minute over [`BASELINE_MINUTES`] minutes. Credential stuffing
//! shows as a jump against the rule's own normal, whatever that normal is.
//!
//! The baseline takes each whole minute (aligned to the clock) once it has passed,
//! so the minute being counted never dilutes its own spike, and minutes without a
//! denial pull it down. The last minute is estimated as the sliding-window counter
//! does: the minute before, weighted by the part of it still in the last 60 s, plus
//! the current one. Only the sensitive rules' own denials count, not those of other
//! limits sharing their rule path. The mean starts at zero (the minutes before a
//! rule's first denial were quiet), and a baseline under one denial a minute counts
//! as one, so a quiet rule's first denials read as their count rather than as
//! infinity. Only denials of sensitive rules and reads take the lock.

use std::sync::Mutex;

use crate::algorithm::{Micros, SECOND};

/// The baseline's span: each minute weighs `1 / BASELINE_MINUTES` of it.
pub const BASELINE_MINUTES: f64 = 30.0;
/// A ratio at or over this, with at least [`MIN_DENIALS`] denials in the last
/// minute, is a spike (listed in `/debug/signals`).
pub const SPIKE_RATIO: f64 = 3.0;
pub const MIN_DENIALS: u64 = 10;
const MINUTE: Micros = 60 * SECOND;

#[derive(Debug, Default)]
struct State {
    /// The minute (`now / 60 s`) being counted, and its denials so far.
    minute: u64,
    count: u64,
    /// Denials of the minute before `minute`.
    previous: u64,
    /// Denials per minute, weighted; `None` until a first minute has passed.
    baseline: Option<f64>,
}

impl State {
    /// Closes the minutes before `now`'s into the baseline.
    fn roll(&mut self, now: Micros) {
        let minute = now / MINUTE;
        if minute <= self.minute {
            return;
        }
        let alpha = 1.0 / BASELINE_MINUTES;
        let closed = self.count as f64;
        // Before a rule's first denial its minutes were quiet: the mean starts at
        // zero, not at the first minute with denials, which would make an attack's
        // own first minute its baseline.
        let b = self.baseline.unwrap_or(0.0);
        let mut baseline = b + alpha * (closed - b);
        // Minutes with no denial between then and now.
        let idle = (minute - self.minute - 1).min(10 * BASELINE_MINUTES as u64);
        baseline *= (1.0 - alpha).powi(idle as i32);
        self.baseline = Some(baseline);
        self.previous = if minute == self.minute + 1 {
            self.count
        } else {
            0
        };
        self.minute = minute;
        self.count = 0;
    }
}

/// One sensitive rule's denials per minute and their baseline.
#[derive(Debug, Default)]
pub struct Spike {
    state: Mutex<Option<State>>,
}

impl Spike {
    /// Counts one denial at `now`.
    pub fn denial(&self, now: Micros) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = state.get_or_insert_with(|| State {
            minute: now / MINUTE,
            ..State::default()
        });
        s.roll(now);
        s.count += 1;
    }

    /// At `now`: the denials of the last minute (estimated), and the baseline
    /// (denials per minute) once a minute has passed since the first denial.
    pub fn view(&self, now: Micros) -> (f64, Option<f64>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = state.as_mut() else {
            return (0.0, None);
        };
        s.roll(now);
        let elapsed = (now % MINUTE) as f64 / MINUTE as f64;
        (
            s.previous as f64 * (1.0 - elapsed) + s.count as f64,
            s.baseline,
        )
    }
}

/// `recent` denials against `baseline` denials per minute (at least one).
pub fn ratio(recent: f64, baseline: Option<f64>) -> f64 {
    recent / baseline.unwrap_or(0.0).max(1.0)
}

/// Whether `ratio` with `recent` denials over the last minute is a spike.
pub fn is_spike(ratio: f64, recent: f64) -> bool {
    ratio >= SPIKE_RATIO && recent >= MIN_DENIALS as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Micros = 1_700_000_000 * SECOND - 1_700_000_000 * SECOND % MINUTE;

    #[test]
    fn the_baseline_follows_denials_per_minute_and_decays_when_quiet() {
        let s = Spike::default();
        let baseline = |now| s.view(now).1;
        assert_eq!(baseline(T0), None);
        // 30 minutes of 4 denials a minute: the mean, started at zero, has come most
        // of the way to 4.
        for m in 0..30 {
            for i in 0..4 {
                s.denial(T0 + m * MINUTE + i * SECOND);
            }
        }
        let (recent, b) = s.view(T0 + 30 * MINUTE);
        let settled = 4.0 * (1.0 - (29.0_f64 / 30.0).powi(30));
        assert!((b.unwrap() - settled).abs() < 1e-9, "{b:?}");
        assert_eq!(recent, 4.0, "the whole minute before");
        // 40 denials in the next minute; once the minute has passed the baseline
        // moves by a thirtieth of the difference.
        for i in 0..40 {
            s.denial(T0 + 30 * MINUTE + i * SECOND);
        }
        let (recent, b) = s.view(T0 + 30 * MINUTE + 45 * SECOND);
        assert_eq!(recent, 40.0 + 4.0 * 0.25);
        assert!((ratio(recent, b) - 41.0 / settled).abs() < 1e-9);
        let after = settled + (40.0 - settled) / 30.0;
        let b = baseline(T0 + 31 * MINUTE).unwrap();
        assert!((b - after).abs() < 1e-9, "{b}");
        // Ten quiet minutes later it has decayed by (29/30)^10... after the minute
        // of 0 closes too.
        let quiet = baseline(T0 + 41 * MINUTE).unwrap();
        assert_eq!(s.view(T0 + 41 * MINUTE).0, 0.0);
        let expected = after * (29.0_f64 / 30.0).powi(10);
        assert!((quiet - expected).abs() < 1e-9, "{quiet} {expected}");
    }

    #[test]
    fn an_attack_on_a_quiet_rule_stays_a_spike_whatever_second_it_starts() {
        // A rule with no denial so far, then 800 denials a minute, starting at any
        // second of a minute: every minute's view for the next ten minutes is a
        // spike, so an alert with a `for` of a few minutes fires.
        for start in [1, 30, 59] {
            let s = Spike::default();
            let begin = T0 + 20 * MINUTE + start * SECOND;
            let mut now = begin;
            while now < begin + 10 * MINUTE {
                for _ in 0..800 / 60 {
                    s.denial(now);
                }
                now += SECOND;
                if (now - begin).is_multiple_of(15 * SECOND) && now - begin >= MINUTE {
                    let (recent, b) = s.view(now);
                    let r = ratio(recent, b);
                    assert!(
                        is_spike(r, recent),
                        "start {start}s, at {}s: {recent} / {b:?}",
                        (now - begin) / SECOND
                    );
                }
            }
        }
    }

    #[test]
    fn a_quiet_rule_counts_its_baseline_as_one() {
        assert_eq!(ratio(12.0, None), 12.0);
        assert_eq!(ratio(12.0, Some(0.25)), 12.0);
        assert!(is_spike(12.0, 12.0));
        assert!(!is_spike(5.0, 5.0), "too few denials");
        assert!(!is_spike(2.0, 200.0), "not enough above the baseline");
    }
}
