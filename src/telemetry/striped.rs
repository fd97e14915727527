//! Striped counters: the request path's metrics without shared cache lines.
//!
//! A plain atomic counter (and `prometheus`' own counters and histograms, which are
//! plain atomics) is one cache line written by every core: two threads counting the
//! same rule bounce that line between them on every request. Here every counter has
//! [`STRIPES`] copies, each on its own cache line; a thread always writes the stripe
//! it was given on first use, and a scrape adds the stripes up. Writes stay relaxed
//! atomic additions, reads are rare.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Copies of each counter; more than the cores sluice is usually given.
pub const STRIPES: usize = 8;

/// Aligns its content to its own cache lines (128 bytes: two 64-byte lines, which
/// also defeats the adjacent-line prefetcher).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

/// This thread's stripe, assigned round-robin on first use.
pub fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

/// One value per stripe.
#[derive(Debug)]
pub struct Stripes<T>(pub [Padded<T>; STRIPES]);

impl<T: Default> Default for Stripes<T> {
    fn default() -> Self {
        Stripes(std::array::from_fn(|_| Padded(T::default())))
    }
}

impl<T> Stripes<T> {
    /// This thread's copy.
    pub fn local(&self) -> &T {
        &self.0[stripe()].0
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|p| &p.0)
    }
}

/// Upper bounds of `sluice_decision_seconds`' buckets.
pub const LATENCY_BOUNDS: [f64; 12] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1,
];

/// One stripe of a latency histogram: a count per bucket (the last is `+Inf`), the
/// total count and the sum in nanoseconds.
#[derive(Debug, Default)]
pub struct HistogramSlot {
    buckets: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
}

/// A histogram of durations, striped.
#[derive(Debug, Default)]
pub struct Histogram(Stripes<HistogramSlot>);

/// A histogram's totals: cumulative bucket counts (the last is `+Inf`, the count),
/// and the sum in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramTotals {
    pub cumulative: Vec<u64>,
    pub sum_seconds: f64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        let slot = self.0.local();
        let i = LATENCY_BOUNDS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(LATENCY_BOUNDS.len());
        slot.buckets[i].fetch_add(1, Ordering::Relaxed);
        slot.sum_nanos
            .fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }

    pub fn totals(&self) -> HistogramTotals {
        let mut counts = vec![0u64; LATENCY_BOUNDS.len() + 1];
        let mut sum = 0u64;
        for slot in self.0.iter() {
            for (c, b) in counts.iter_mut().zip(&slot.buckets) {
                *c += b.load(Ordering::Relaxed);
            }
            sum = sum.wrapping_add(slot.sum_nanos.load(Ordering::Relaxed));
        }
        let mut running = 0;
        for c in &mut counts {
            running += *c;
            *c = running;
        }
        HistogramTotals {
            cumulative: counts,
            sum_seconds: sum as f64 / 1e9,
        }
    }
}

/// Writes a label value escaped for the text format.
pub fn escape_label(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_get_stripes_and_sums_see_them_all() {
        let h = std::sync::Arc::new(Histogram::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        h.observe(0.0002);
                    }
                    h.observe(1.0);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let t = h.totals();
        assert_eq!(t.cumulative[0], 0);
        assert_eq!(t.cumulative[2], 4000);
        assert_eq!(*t.cumulative.last().unwrap(), 4004);
        assert!((t.sum_seconds - 4.8).abs() < 1e-6, "{}", t.sum_seconds);
    }

    #[test]
    fn padded_values_do_not_share_lines() {
        assert_eq!(std::mem::align_of::<Padded<AtomicU64>>(), 128);
        assert_eq!(std::mem::size_of::<Stripes<AtomicU64>>(), 128 * STRIPES);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = String::new();
        escape_label("a\"b\\c\nd", &mut s);
        assert_eq!(s, "a\\\"b\\\\c\\nd");
    }
}
