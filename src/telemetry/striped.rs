//! Striped counters: the request path's metrics without shared cache lines.
//!
//! A plain atomic counter (and `prometheus`' own counters and histograms, which are
//! plain atomics) is one cache line written by every core: two threads counting the
//! same rule bounce that line between them on every request. Here every counter has
//! [`STRIPES`] copies, each on its own cache line; a thread always writes the stripe
//! it was given on first use, and a scrape adds the stripes up. The first
//! [`OWNED`] threads (the runtime's workers, in practice) each own a stripe that no
//! other thread writes, so they count with a plain load and store instead of a
//! locked read-modify-write; later threads share the other stripes and add
//! atomically.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Copies of each counter; more than the cores sluice is usually given.
pub const STRIPES: usize = 8;

/// Aligns its content to its own cache lines (128 bytes: two 64-byte lines, which
/// also defeats the adjacent-line prefetcher).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

/// Stripes owned by one thread each; the rest are shared.
pub const OWNED: usize = STRIPES / 2;

/// This thread's stripe, given on first use, and whether the thread owns it (no
/// other thread ever writes it). An owned stripe is never handed on, not even when
/// its thread ends: its owner's load and store would lose another writer's
/// additions.
pub fn stripe() -> Stripe {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Stripe = assign(NEXT.fetch_add(1, Ordering::Relaxed));
    }
    STRIPE.with(|s| *s)
}

/// The stripe of the `n`th thread to count: its own for the first [`OWNED`], then
/// the shared ones in turn.
fn assign(n: usize) -> Stripe {
    if n < OWNED {
        Stripe {
            index: n,
            owned: true,
        }
    } else {
        Stripe {
            index: OWNED + (n - OWNED) % (STRIPES - OWNED),
            owned: false,
        }
    }
}

/// A thread's stripe (see [`stripe`]).
#[derive(Debug, Clone, Copy)]
pub struct Stripe {
    pub index: usize,
    pub owned: bool,
}

/// Adds `n` to this thread's copy of a counter.
pub fn add(counter: &AtomicU64, owned: bool, n: u64) {
    if owned {
        // The only writer: a plain read and write, which readers see whole.
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    } else {
        counter.fetch_add(n, Ordering::Relaxed);
    }
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
    /// This thread's copy, and whether the thread owns it (see [`stripe`]).
    pub fn local(&self) -> (&T, bool) {
        let s = stripe();
        (&self.0[s.index].0, s.owned)
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|p| &p.0)
    }
}

/// Upper bounds of `sluice_decision_seconds`' buckets in nanoseconds, so that
/// observing needs no floating point.
const BOUNDS_NANOS: [u64; 12] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    15_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
];

/// The same bounds in seconds, as exported. A division of two exact integers rounds
/// once, so each is the very `f64` its decimal (0.00005, ...) reads as.
pub const LATENCY_BOUNDS: [f64; BOUNDS_NANOS.len()] = {
    let mut seconds = [0.0; BOUNDS_NANOS.len()];
    let mut i = 0;
    while i < seconds.len() {
        seconds[i] = BOUNDS_NANOS[i] as f64 / 1e9;
        i += 1;
    }
    seconds
};

/// The bucket (an index into [`LATENCY_BOUNDS`], or its length for `+Inf`) of a
/// duration in nanoseconds.
pub fn bucket_of(nanos: u64) -> usize {
    BOUNDS_NANOS
        .iter()
        .position(|b| nanos <= *b)
        .unwrap_or(BOUNDS_NANOS.len())
}

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
    pub fn observe(&self, took: Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let (slot, owned) = self.0.local();
        let i = bucket_of(nanos);
        add(&slot.buckets[i], owned, 1);
        add(&slot.sum_nanos, owned, nanos);
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
                        h.observe(Duration::from_micros(200));
                    }
                    h.observe(Duration::from_secs(1));
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
    fn bounds_are_exported_as_decimal_seconds() {
        // The `le` labels scrapers and dashboards read.
        let shown: Vec<String> = LATENCY_BOUNDS.iter().map(|b| b.to_string()).collect();
        assert_eq!(
            shown,
            [
                "0.00005", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
                "0.015", "0.025", "0.05", "0.1"
            ]
        );
        // `le`: a duration equal to a bound counts in that bound's bucket.
        let h = Histogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_nanos(50_001));
        let t = h.totals();
        assert_eq!(&t.cumulative[..2], &[1, 2]);
    }

    #[test]
    fn an_owned_stripe_is_never_given_to_another_thread() {
        let given: Vec<Stripe> = (0..10 * STRIPES).map(assign).collect();
        for (n, s) in given.iter().enumerate() {
            assert!(s.index < STRIPES, "thread {n}: stripe {}", s.index);
            assert_eq!(s.owned, n < OWNED, "thread {n}");
            if s.owned {
                let holders = given.iter().filter(|t| t.index == s.index).count();
                assert_eq!(holders, 1, "owned stripe {} given {holders} times", s.index);
            }
        }
        // The shared stripes are all used, in turn.
        let shared: std::collections::BTreeSet<usize> =
            given.iter().filter(|s| !s.owned).map(|s| s.index).collect();
        assert_eq!(shared, (OWNED..STRIPES).collect());
    }

    #[test]
    fn more_threads_than_stripes_lose_no_count() {
        // Whichever stripes these threads get (the test binary's other threads may
        // have taken the owned ones), every addition must show in the sum.
        let counter = std::sync::Arc::new(Stripes::<AtomicU64>::default());
        let threads: Vec<_> = (0..2 * STRIPES)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let (c, owned) = counter.local();
                        add(c, owned, 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let sum: u64 = counter.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(sum, 2 * STRIPES as u64 * 10_000);
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
