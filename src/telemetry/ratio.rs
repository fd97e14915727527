//! Decided and denied counts of one rule over the last 60 seconds, for
//! `sluice_deny_ratio`.
//!
//! A ring of 60 per-second buckets, each one `AtomicU64` packing the bucket's second
//! (16 low bits) with the decided and denied counts (24 bits each). Recording is one
//! compare-and-swap on the current second's bucket: no lock, and a bucket from an old
//! second is reset by the same swap that first counts into it, so no count is ever
//! lost or mixed between seconds. Reads (at scrape time) add the buckets whose second
//! lies in the window. Counts saturate at 2^24 - 1 per rule per second per process,
//! far above what one process decides.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithm::{Micros, SECOND};

/// Length of the window in seconds.
pub const WINDOW_SECS: u64 = 60;

const SEC_BITS: u32 = 16;
const COUNT_BITS: u32 = 24;
const SEC_MASK: u64 = (1 << SEC_BITS) - 1;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;

fn pack(decided: u64, denied: u64) -> u64 {
    decided.min(COUNT_MAX) | (denied.min(COUNT_MAX) << COUNT_BITS)
}

fn unpack(count: u64) -> (u64, u64) {
    (count & COUNT_MAX, (count >> COUNT_BITS) & COUNT_MAX)
}

/// The ring both windows keep: a bucket a second, each one word packing the second
/// (16 low bits) with what the window counts for it (48 bits).
#[derive(Debug)]
struct Ring {
    buckets: [AtomicU64; WINDOW_SECS as usize],
}

impl Default for Ring {
    fn default() -> Self {
        Ring {
            // Second 0 with zero counts: never read as live unless `now` is second 0.
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Ring {
    /// Replaces the count of `now`'s second with `f(count)` (below 2^48), `f(0)`
    /// when the bucket holds an older second. `owned`: the caller is the ring's only
    /// writer (see [`super::striped::stripe`]), so a plain store does.
    fn update(&self, now: Micros, owned: bool, f: impl Fn(u64) -> u64) {
        let sec = now / SECOND;
        let tag = sec & SEC_MASK;
        let bucket = &self.buckets[(sec % WINDOW_SECS) as usize];
        let mut old = bucket.load(Ordering::Relaxed);
        loop {
            let count = if old & SEC_MASK == tag {
                old >> SEC_BITS
            } else {
                0
            };
            let new = tag | (f(count) << SEC_BITS);
            if owned {
                bucket.store(new, Ordering::Relaxed);
                return;
            }
            match bucket.compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => old = actual,
            }
        }
    }

    /// The counts of the seconds in the window ending at `now`.
    fn counts(&self, now: Micros) -> impl Iterator<Item = u64> + '_ {
        let tag = (now / SECOND) & SEC_MASK;
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            // Age of the bucket in seconds, modulo the 16-bit second tag.
            .filter(move |&w| (tag.wrapping_sub(w & SEC_MASK) & SEC_MASK) < WINDOW_SECS)
            .map(|w| w >> SEC_BITS)
    }
}

/// Per-second decided/denied counts over the last [`WINDOW_SECS`] seconds.
#[derive(Debug, Default)]
pub struct DenyWindow(Ring);

impl DenyWindow {
    /// Counts one decision at `now`. `owned`: the caller is the window's only
    /// writer (see [`super::striped::stripe`]), so a plain store does.
    pub fn record(&self, now: Micros, denied: bool, owned: bool) {
        self.0.update(now, owned, |count| {
            let (decided, d) = unpack(count);
            pack(decided + 1, d + u64::from(denied))
        });
    }

    /// (decided, denied) over the window ending at `now`.
    pub fn totals(&self, now: Micros) -> (u64, u64) {
        self.0
            .counts(now)
            .map(unpack)
            .fold((0, 0), |(decided, denied), (c, d)| {
                (decided + c, denied + d)
            })
    }
}

/// Hits per second over the last [`WINDOW_SECS`] seconds (a rule's cost spent or
/// refunded, for `sluice top`), in the ring [`DenyWindow`] keeps, with a sum a second
/// that saturates at 2^48 - 1.
#[derive(Debug, Default)]
pub struct SumWindow(Ring);

const SUM_MAX: u64 = (1 << (64 - SEC_BITS)) - 1;

impl SumWindow {
    /// Adds `n` at `now`; `owned` as in [`DenyWindow::record`].
    pub fn add(&self, now: Micros, n: u64, owned: bool) {
        self.0
            .update(now, owned, |sum| sum.saturating_add(n).min(SUM_MAX));
    }

    /// The sum over the window ending at `now`.
    pub fn total(&self, now: Micros) -> u64 {
        self.0.counts(now).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Micros = 1_700_000_000 * SECOND;

    #[test]
    fn ratio_over_the_last_minute() {
        let w = DenyWindow::default();
        for i in 0..100 {
            w.record(T0 + i * 10_000, i % 4 == 0, true);
        }
        assert_eq!(w.totals(T0), (100, 25));
        // Still inside the window 59 s later, gone after 60 s.
        assert_eq!(w.totals(T0 + 59 * SECOND), (100, 25));
        assert_eq!(w.totals(T0 + 60 * SECOND), (0, 0));
    }

    #[test]
    fn old_buckets_are_reset_by_the_next_second_that_uses_them() {
        let w = DenyWindow::default();
        w.record(T0, true, true);
        w.record(T0 + 30 * SECOND, false, true);
        // Same bucket as T0, one minute later.
        w.record(T0 + 60 * SECOND, false, true);
        assert_eq!(w.totals(T0 + 60 * SECOND), (2, 0));
        assert_eq!(w.totals(T0 + 95 * SECOND), (1, 0));
        assert_eq!(w.totals(T0 + 120 * SECOND), (0, 0));
    }

    #[test]
    fn concurrent_records_are_all_counted() {
        let w = std::sync::Arc::new(DenyWindow::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000 {
                        w.record(T0 + (i % 3) * SECOND, i % 2 == 0, false);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(w.totals(T0 + 2 * SECOND), (40_000, 20_000));
    }

    #[test]
    fn sums_over_the_last_minute() {
        let w = SumWindow::default();
        w.add(T0, 60, true);
        w.add(T0 + 10 * SECOND, 40, false);
        assert_eq!(w.total(T0 + 10 * SECOND), 100);
        assert_eq!(
            w.total(T0 + 60 * SECOND),
            40,
            "the first second left the window"
        );
        w.add(T0 + 60 * SECOND, 5, true);
        assert_eq!(w.total(T0 + 60 * SECOND), 45, "its bucket starts afresh");
        assert_eq!(w.total(T0 + 200 * SECOND), 0);
    }

    #[test]
    fn counts_saturate_instead_of_spilling() {
        assert_eq!(unpack(pack(COUNT_MAX + 10, 3)), (COUNT_MAX, 3));
    }
}
