//! Windowed maxima: the highest value a rule's answers showed over the last
//! period, for the gauges that read a level from the answers (`sluice_in_flight`,
//! `sluice_debt`).
//!
//! The window is a time span (`--peak-window`), not "since the last scrape": a gauge
//! reset by each scrape would split its peaks between two Prometheus servers
//! scraping one replica, and a human reading `/metrics` would steal them from both.
//! Time is cut into periods of one window; a [`Peak`] keeps the highest value of the
//! current period and of the one before, and reads as the higher of the two. It
//! thus covers at least the last whole window, so a scraper whose interval is at
//! most the window sees every peak, and a value falls back at most two windows
//! after it was last reported.
//!
//! Recording is at most two loads and two stores, on the thread's own stripe
//! ([`striped`](super::striped)): a slot holds its period and its value, whole (a
//! key's debt adds up over charges past any 32 bits). A new period stores the value
//! first and then, with release ordering, the period, so a reader that sees the new
//! period sees its value; one that still sees the old period may see the new value a
//! period early (a recent value either way). A thread that shares its stripe with
//! another may lose a higher value to a lower one of the same period (the runtime's
//! workers own theirs, and a gauge of a level is corrected by the next answer).

use std::sync::atomic::{AtomicU64, Ordering};

use super::striped::Stripes;

/// The highest value recorded in the current and the previous period.
#[derive(Debug, Default)]
pub struct Peak {
    /// Per stripe, the slots of even and odd periods.
    slots: Stripes<[Slot; 2]>,
}

/// One period's highest value.
#[derive(Debug, Default)]
struct Slot {
    period: AtomicU64,
    value: AtomicU64,
}

impl Peak {
    /// Records `value`, seen in `period` (the time divided by the window).
    pub fn record(&self, period: u64, value: u64) {
        let (slots, _) = self.slots.local();
        let slot = &slots[(period % 2) as usize];
        if slot.period.load(Ordering::Acquire) == period {
            if slot.value.load(Ordering::Relaxed) < value {
                slot.value.store(value, Ordering::Relaxed);
            }
            return;
        }
        slot.value.store(value, Ordering::Relaxed);
        slot.period.store(period, Ordering::Release);
    }

    /// The highest value recorded in `period` or the one before; 0 if none.
    pub fn get(&self, period: u64) -> u64 {
        self.slots
            .iter()
            .flatten()
            .filter(|s| {
                let seen = s.period.load(Ordering::Acquire);
                seen == period || seen == period.wrapping_sub(1)
            })
            .map(|s| s.value.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_highest_of_this_period_and_the_last() {
        let p = Peak::default();
        assert_eq!(p.get(10), 0, "nothing recorded");
        p.record(10, 3);
        p.record(10, 7);
        p.record(10, 5);
        assert_eq!(p.get(10), 7);
        // The next period starts lower: the last one's peak still shows.
        p.record(11, 2);
        assert_eq!(p.get(11), 7);
        // Two periods on, only the lower value is recent.
        assert_eq!(p.get(12), 2);
        p.record(12, 1);
        assert_eq!(p.get(12), 2);
        assert_eq!(p.get(13), 1);
        // Nothing for two whole periods: nothing to show.
        assert_eq!(p.get(14), 0);
    }

    #[test]
    fn a_new_period_replaces_its_slot_even_with_a_lower_value() {
        let p = Peak::default();
        p.record(4, 9);
        // Period 6 shares period 4's slot: 9 is stale, 1 is the value now.
        p.record(6, 1);
        assert_eq!(p.get(6), 1);
        assert_eq!(p.get(7), 1);
    }

    #[test]
    fn values_past_32_bits_read_whole() {
        let p = Peak::default();
        p.record(1, 5_000_000_000);
        assert_eq!(p.get(1), 5_000_000_000);
        p.record(1, 5);
        p.record(2, u64::MAX);
        assert_eq!(p.get(2), u64::MAX);
        assert_eq!(p.get(3), u64::MAX);
        assert_eq!(p.get(4), 0);
    }

    #[test]
    fn a_value_recorded_on_another_thread_counts() {
        let p = std::sync::Arc::new(Peak::default());
        let other = p.clone();
        std::thread::spawn(move || other.record(3, 9))
            .join()
            .unwrap();
        p.record(3, 2);
        assert_eq!(p.get(3), 9);
    }
}
