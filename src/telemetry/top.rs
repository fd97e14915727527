//! Top offenders: the keys with the most denials of one rule over the last minute,
//! in bounded memory.
//!
//! Each sub-window of [`SUB_WINDOW`] keeps a Space-Saving sketch (Metwally, Agrawal,
//! El Abbadi 2005) of [`CAPACITY`] counters per shard: a key already held is counted;
//! a new key takes a free counter, or replaces the smallest one and inherits its count
//! (the count then over-estimates by at most that inherited error). Any key with more
//! than `n / CAPACITY` of a shard's `n` denials is guaranteed to be held, so heavy
//! hitters are never lost, and memory never grows with the number of distinct keys.
//!
//! Keys are spread over [`SHARDS`] sketches by a hash of the key, so two threads
//! denying different keys rarely take the same lock, and a key lives in one shard only
//! (the merge at read time is an exact union). [`SUB_WINDOWS`] sub-windows rotate: the
//! view merges the current one and the previous ones, so it covers at least the last
//! 60 s and at most 70 s. Only denials take these locks; admitted requests never do.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::algorithm::{Micros, SECOND};
use crate::hash::stable_hash;

/// Counters per sketch.
pub const CAPACITY: usize = 64;
/// Sketches per sub-window, chosen by key hash.
pub const SHARDS: usize = 4;
/// Length of one sub-window.
pub const SUB_WINDOW: Micros = 10 * SECOND;
/// Sub-windows merged by a read: the current one and six before it.
pub const SUB_WINDOWS: usize = 7;
/// Keys reported per rule.
pub const TOP: usize = 10;

#[derive(Debug, Clone)]
struct Counter {
    key: Box<str>,
    count: u64,
    /// How much of `count` may belong to keys this counter replaced.
    error: u64,
}

/// A Space-Saving sketch with a fixed number of counters.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    index: HashMap<Box<str>, usize, ahash::RandomState>,
    counters: Vec<Counter>,
}

impl SpaceSaving {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        SpaceSaving {
            capacity,
            // Nothing is allocated until the first denial: a rule that never denies
            // costs a few words per sketch.
            index: HashMap::with_hasher(ahash::RandomState::new()),
            counters: Vec::new(),
        }
    }

    /// Counts `n` occurrences of `key`.
    pub fn add(&mut self, key: &str, n: u64) {
        if let Some(&i) = self.index.get(key) {
            self.counters[i].count += n;
            return;
        }
        if self.counters.len() < self.capacity {
            self.index.insert(key.into(), self.counters.len());
            self.counters.push(Counter {
                key: key.into(),
                count: n,
                error: 0,
            });
            return;
        }
        // Replace the smallest counter; the new key inherits its count as error.
        let (i, min) = self
            .counters
            .iter()
            .enumerate()
            .map(|(i, c)| (i, c.count))
            .min_by_key(|&(_, c)| c)
            .expect("capacity is at least 1");
        let old = std::mem::replace(
            &mut self.counters[i],
            Counter {
                key: key.into(),
                count: min + n,
                error: min,
            },
        );
        self.index.remove(&old.key);
        self.index.insert(key.into(), i);
    }

    /// Counters in use; never more than the capacity.
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn clear(&mut self) {
        self.index.clear();
        self.counters.clear();
    }

    /// (key, estimated count, error bound) of every counter, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.counters.iter().map(|c| (&*c.key, c.count, c.error))
    }

    /// The `n` largest counters, largest first (ties by key).
    pub fn top(&self, n: usize) -> Vec<(String, u64)> {
        let mut all: Vec<(String, u64)> = self.iter().map(|(k, c, _)| (k.to_string(), c)).collect();
        sort_ranked(&mut all);
        all.truncate(n);
        all
    }
}

fn sort_ranked(all: &mut [(String, u64)]) {
    all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
}

#[derive(Debug)]
struct Slot {
    /// Which sub-window (`now / SUB_WINDOW`) this slot currently holds.
    epoch: u64,
    sketch: SpaceSaving,
}

/// The denials of one rule by key over a sliding minute.
#[derive(Debug)]
pub struct TopOffenders {
    /// `slots[sub_window][shard]`.
    slots: Vec<Vec<Mutex<Slot>>>,
}

impl Default for TopOffenders {
    fn default() -> Self {
        TopOffenders {
            slots: (0..SUB_WINDOWS)
                .map(|_| {
                    (0..SHARDS)
                        .map(|_| {
                            Mutex::new(Slot {
                                epoch: u64::MAX,
                                sketch: SpaceSaving::new(CAPACITY),
                            })
                        })
                        .collect()
                })
                .collect(),
        }
    }
}

fn lock(m: &Mutex<Slot>) -> std::sync::MutexGuard<'_, Slot> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TopOffenders {
    /// Counts one denial of `key` at `now`.
    pub fn add(&self, now: Micros, key: &str) {
        let epoch = now / SUB_WINDOW;
        let shard = (stable_hash(key.as_bytes()) % SHARDS as u64) as usize;
        let mut slot = lock(&self.slots[(epoch % SUB_WINDOWS as u64) as usize][shard]);
        if slot.epoch != epoch {
            slot.epoch = epoch;
            // A fresh sketch rather than `clear`: memory of a burst is given back.
            slot.sketch = SpaceSaving::new(CAPACITY);
        }
        slot.sketch.add(key, 1);
    }

    /// The `n` keys with the most denials in the window ending at `now`, most first.
    pub fn top(&self, now: Micros, n: usize) -> Vec<(String, u64)> {
        let epoch = now / SUB_WINDOW;
        let mut merged: HashMap<String, u64, ahash::RandomState> = HashMap::default();
        for shards in &self.slots {
            for m in shards {
                let mut slot = lock(m);
                if slot.epoch > epoch || epoch - slot.epoch >= SUB_WINDOWS as u64 {
                    if slot.epoch != u64::MAX && slot.epoch < epoch {
                        // Out of the window: free it now rather than at its next use.
                        slot.epoch = u64::MAX;
                        slot.sketch = SpaceSaving::new(CAPACITY);
                    }
                    continue;
                }
                for (k, c, _) in slot.sketch.iter() {
                    *merged.entry(k.to_string()).or_default() += c;
                }
            }
        }
        let mut all: Vec<(String, u64)> = merged.into_iter().collect();
        sort_ranked(&mut all);
        all.truncate(n);
        all
    }

    /// Counters in use over every sub-window and shard.
    pub fn entries(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .map(|m| lock(m).sketch.len())
            .sum()
    }

    /// The most counters this can ever hold.
    pub fn max_entries() -> usize {
        SUB_WINDOWS * SHARDS * CAPACITY
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::clock::{Clock, ManualClock};

    const T0: Micros = 1_700_000_000 * SECOND;

    #[test]
    fn sketch_counts_exactly_below_capacity() {
        let mut s = SpaceSaving::new(4);
        for (k, n) in [("a", 3), ("b", 1), ("c", 2)] {
            for _ in 0..n {
                s.add(k, 1);
            }
        }
        assert_eq!(s.top(2), vec![("a".to_string(), 3), ("c".to_string(), 2)]);
    }

    #[test]
    fn sketch_replaces_the_smallest_counter_and_stays_at_capacity() {
        let mut s = SpaceSaving::new(2);
        s.add("a", 5);
        s.add("b", 1);
        s.add("c", 1);
        assert_eq!(s.len(), 2);
        // c took b's counter and inherited its count as error.
        let c: Vec<_> = s.iter().filter(|(k, _, _)| *k == "c").collect();
        assert_eq!(c, vec![("c", 2, 1)]);
        assert_eq!(s.top(1), vec![("a".to_string(), 5)]);
    }

    /// 1,000,000 decisions from 100,000 keys, 5 of which cause 30 %
    /// of the denials; those 5 are the top 5 and memory stays bounded.
    #[test]
    fn five_heavy_keys_among_a_hundred_thousand_are_the_top_five() {
        let clock = ManualClock::new(T0);
        let top = TopOffenders::default();
        let mut rng = SmallRng::seed_from_u64(7);
        let heavy: Vec<String> = (0..5).map(|i| format!("heavy-{i}")).collect();
        let light: Vec<String> = (0..99_995)
            .map(|i| format!("10.{}.{}", i / 256, i % 256))
            .collect();

        // 1,000,000 decisions of which 400,000 are denials; 120,000 of the denials
        // (30 %) come from the 5 heavy keys, the rest from the 99,995 others.
        let mut events: Vec<(usize, bool)> = Vec::with_capacity(1_000_000);
        for i in 0..120_000 {
            events.push((i % 5, true));
        }
        for _ in 0..280_000 {
            events.push((5 + rng.random_range(0..light.len()), true));
        }
        for _ in 0..600_000 {
            events.push((5 + rng.random_range(0..light.len()), false));
        }
        events.shuffle(&mut rng);

        let mut max_entries = 0;
        for (n, (who, denied)) in events.iter().enumerate() {
            // Spread over 50 s of injected time: all inside the window.
            clock.set(T0 + (n as u64) * 50);
            if *denied {
                let key = if *who < 5 {
                    &heavy[*who]
                } else {
                    &light[*who - 5]
                };
                top.add(clock.now(), key);
            }
            if n % 100_000 == 0 {
                max_entries = max_entries.max(top.entries());
            }
        }
        max_entries = max_entries.max(top.entries());

        let ranked = top.top(clock.now(), TOP);
        assert_eq!(ranked.len(), TOP);
        let mut first5: Vec<&str> = ranked[..5].iter().map(|(k, _)| k.as_str()).collect();
        first5.sort_unstable();
        assert_eq!(first5, heavy.iter().map(String::as_str).collect::<Vec<_>>());
        for (_, count) in &ranked[..5] {
            // Each heavy key was denied 24,000 times; the sketch may over-count a bit.
            assert!(*count >= 24_000, "{ranked:?}");
        }
        // Memory is bounded by the sketches' capacity, not by the 100,000 keys: every
        // sketch that saw traffic is full, none holds more.
        assert!(max_entries <= TopOffenders::max_entries(), "{max_entries}");
        for shards in &top.slots {
            for m in shards {
                let slot = lock(m);
                assert!(slot.sketch.len() <= CAPACITY);
                if slot.epoch != u64::MAX {
                    assert_eq!(slot.sketch.len(), CAPACITY);
                }
            }
        }
    }

    #[test]
    fn the_window_slides() {
        let clock = ManualClock::new(T0);
        let top = TopOffenders::default();
        for _ in 0..3 {
            top.add(clock.now(), "old");
        }
        clock.advance(30 * SECOND);
        top.add(clock.now(), "new");
        assert_eq!(
            top.top(clock.now(), TOP),
            vec![("old".to_string(), 3), ("new".to_string(), 1)]
        );
        // 60 s after the first denials they may still show (the window is 60 to 70 s);
        // after 70 s they are gone, and the newer one stays.
        clock.advance(40 * SECOND);
        assert_eq!(top.top(clock.now(), TOP), vec![("new".to_string(), 1)]);
        clock.advance(60 * SECOND);
        assert!(top.top(clock.now(), TOP).is_empty());
    }

    #[test]
    fn a_random_heavy_hitter_is_always_found() {
        let mut rng = SmallRng::seed_from_u64(11);
        let mut s = SpaceSaving::new(CAPACITY);
        let n = 50_000;
        for _ in 0..n {
            if rng.random_bool(0.1) {
                s.add("hot", 1);
            } else {
                s.add(&rng.random_range(0..10_000u32).to_string(), 1);
            }
        }
        assert_eq!(s.top(1)[0].0, "hot");
        assert_eq!(s.len(), CAPACITY);
    }
}
