//! Machine-regular keys: of one rule's busiest keys, those whose last [`INTERVALS`]
//! gaps between requests barely vary (coefficient of variation under
//! [`MAX_CV`]), the mark of a script on a timer rather than a person.
//!
//! The keys are held in a Space-Saving sketch ([`super::super::top`] explains it) of
//! [`SLOTS`] keys in each of [`SHARDS`] shards, so memory never grows with the number
//! of keys. Each held key keeps the times of its last `INTERVALS + 1` requests.
//!
//! Every decided request passes here, so the common path is cheap: the key's hash is
//! looked for among its shard's held hashes (atomics, no lock). Only a held key, or
//! one that may take a slot, takes the shard's lock: a key not held tries to come in
//! on one request in [`SAMPLE`] once the shard is full (then counted as `SAMPLE`),
//! so a flood of distinct keys takes the lock on an eighth of its requests. The key
//! as shown is written once, when a held key has enough requests to be judged, never
//! for the flood's one-off keys. The spread is computed when read.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::algorithm::{Micros, SECOND};

/// Gaps between requests judged (so a key needs `INTERVALS + 1` requests).
pub const INTERVALS: usize = 20;
const TIMES: usize = INTERVALS + 1;
/// A key whose gaps have a coefficient of variation under this is regular. A person
/// clicking, or requests arriving at random (exponential gaps), are near 1.
pub const MAX_CV: f64 = 0.1;
/// Shards of a rule's sketch, chosen by key hash.
pub const SHARDS: usize = 8;
/// Keys held per shard.
pub const SLOTS: usize = 16;
/// Once a shard is full, a key not held tries to come in on one request in this many.
pub const SAMPLE: u64 = 8;
/// A key with no request for this long is no longer listed.
pub const FRESH: Micros = 60 * SECOND;

#[derive(Debug)]
struct Slot {
    hash: u64,
    /// Requests seen (estimated: a sampled entry counts `SAMPLE`, and an entry
    /// inherits the count of the one it replaced).
    count: u64,
    /// The last request times, a ring; `len` of them are set.
    times: [Micros; TIMES],
    len: usize,
    next: usize,
    /// The key as shown, written once the key has `TIMES` requests.
    shown: Option<Box<str>>,
}

impl Slot {
    fn new(hash: u64, count: u64, now: Micros) -> Slot {
        let mut slot = Slot {
            hash,
            count,
            times: [0; TIMES],
            len: 0,
            next: 0,
            shown: None,
        };
        slot.push(now);
        slot
    }

    fn push(&mut self, now: Micros) {
        self.times[self.next] = now;
        self.next = (self.next + 1) % TIMES;
        self.len = (self.len + 1).min(TIMES);
    }

    fn last(&self) -> Micros {
        self.times[(self.next + TIMES - 1) % TIMES]
    }

    /// Mean gap and coefficient of variation of the last `INTERVALS` gaps.
    fn spread(&self) -> Option<(f64, f64)> {
        if self.len < TIMES {
            return None;
        }
        let at = |i: usize| self.times[(self.next + i) % TIMES] as f64;
        let gaps = (1..TIMES).map(|i| at(i) - at(i - 1));
        let mean = gaps.clone().sum::<f64>() / INTERVALS as f64;
        if mean <= 0.0 {
            return None;
        }
        let var = gaps.map(|g| (g - mean) * (g - mean)).sum::<f64>() / INTERVALS as f64;
        Some((mean, var.sqrt() / mean))
    }
}

#[derive(Debug)]
struct Shard {
    /// The held keys' hashes (0: free), read without the lock.
    held: [AtomicU64; SLOTS],
    slots: Mutex<Vec<Slot>>,
}

/// One rule's busiest keys and their recent request times.
#[derive(Debug)]
pub struct RegularKeys {
    shards: Box<[Shard]>,
}

impl Default for RegularKeys {
    fn default() -> Self {
        RegularKeys {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    held: Default::default(),
                    // Nothing is allocated until the rule's first request.
                    slots: Mutex::new(Vec::new()),
                })
                .collect(),
        }
    }
}

/// A regular key as `/debug/signals` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Regular {
    pub key: String,
    pub requests: u64,
    /// Mean gap between requests, in seconds.
    pub mean_interval: f64,
    pub cv: f64,
}

thread_local! {
    static SAMPLER: Cell<u64> = const { Cell::new(0x9E37_79B9_7F4A_7C15) };
}

/// One request in `SAMPLE`, from a per-thread xorshift (no shared state).
fn sampled() -> bool {
    SAMPLER.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x % SAMPLE == 0
    })
}

impl RegularKeys {
    /// A request of the key with `hash` at `now`; `show` writes the key as shown,
    /// called at most once per held key.
    pub fn arrival(&self, now: Micros, hash: u64, show: impl FnOnce(&mut String)) {
        let hash = hash.max(1);
        let shard = &self.shards[(hash >> 32) as usize % SHARDS];
        let mut free = false;
        let mut held = false;
        for h in &shard.held {
            match h.load(Ordering::Relaxed) {
                0 => free = true,
                x if x == hash => {
                    held = true;
                    break;
                }
                _ => {}
            }
        }
        if !held && !free && !sampled() {
            return;
        }
        let mut slots = shard.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = slots.iter_mut().find(|s| s.hash == hash) {
            slot.count += 1;
            slot.push(now);
            if slot.shown.is_none() && slot.len == TIMES {
                let mut shown = String::new();
                show(&mut shown);
                slot.shown = Some(shown.into());
            }
            return;
        }
        if slots.len() < SLOTS {
            shard.held[slots.len()].store(hash, Ordering::Relaxed);
            slots.push(Slot::new(hash, 1, now));
            return;
        }
        // Full: the key takes the smallest counter's place and inherits its count.
        let Some((i, min)) = slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.count))
            .min_by_key(|&(_, c)| c)
        else {
            return;
        };
        slots[i] = Slot::new(hash, min + SAMPLE, now);
        shard.held[i].store(hash, Ordering::Relaxed);
    }

    /// The held keys seen within [`FRESH`] of `now` whose gaps are regular, the
    /// busiest first.
    pub fn regular(&self, now: Micros) -> Vec<Regular> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let slots = shard.slots.lock().unwrap_or_else(|p| p.into_inner());
            for slot in slots.iter() {
                if now.saturating_sub(slot.last()) > FRESH {
                    continue;
                }
                let (Some((mean, cv)), Some(key)) = (slot.spread(), &slot.shown) else {
                    continue;
                };
                if cv < MAX_CV {
                    out.push(Regular {
                        key: key.to_string(),
                        requests: slot.count,
                        mean_interval: mean / SECOND as f64,
                        cv,
                    });
                }
            }
        }
        out.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.key.cmp(&b.key)));
        out
    }

    /// Keys held over every shard; never more than [`RegularKeys::max_entries`].
    pub fn entries(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.slots.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    pub fn max_entries() -> usize {
        SHARDS * SLOTS
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::clock::{Clock, ManualClock};

    const T0: Micros = 1_700_000_000 * SECOND;
    const MS: Micros = 1000;

    fn hash(key: &str) -> u64 {
        crate::hash::stable_hash(key.as_bytes())
    }

    fn arrive(r: &RegularKeys, now: Micros, key: &str) {
        r.arrival(now, hash(key), |out| out.push_str(key));
    }

    /// One key every 20 ms exactly and one with exponential gaps of the same 20 ms
    /// mean (seeded), interleaved in time: only the first is regular.
    #[test]
    fn a_timer_is_regular_and_random_arrivals_are_not() {
        let r = RegularKeys::default();
        let mut rng = SmallRng::seed_from_u64(27);
        let mut events: Vec<(Micros, &str)> = Vec::new();
        let (mut bot, mut person) = (T0, T0);
        for _ in 0..100 {
            bot += 20 * MS;
            events.push((bot, "bot"));
            // Exponential with mean 20 ms: -ln(U) x 20 ms.
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            person += (-u.ln() * 20_000.0) as Micros;
            events.push((person, "person"));
        }
        events.sort();
        for (t, key) in &events {
            arrive(&r, *t, key);
        }
        let now = events.last().unwrap().0;
        let found = r.regular(now);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key, "bot");
        assert_eq!(found[0].requests, 100);
        assert!((found[0].mean_interval - 0.020).abs() < 1e-9);
        assert!(found[0].cv < 1e-9);
        // A minute after its last request the key is no longer listed.
        assert!(r.regular(now + FRESH + 1).is_empty());
    }

    #[test]
    fn fewer_requests_than_the_intervals_are_not_judged() {
        let r = RegularKeys::default();
        for i in 0..INTERVALS as u64 {
            arrive(&r, T0 + i * 20 * MS, "short");
        }
        assert!(r.regular(T0 + SECOND).is_empty());
        arrive(&r, T0 + INTERVALS as u64 * 20 * MS, "short");
        assert_eq!(r.regular(T0 + SECOND).len(), 1);
    }

    /// A million distinct keys, one request each, around a bot with one request in 50
    /// (every millisecond): memory stays at the sketch's size, the flood never writes
    /// a key as shown, and the bot is still found.
    #[test]
    fn a_million_keys_stay_in_bounded_memory_and_the_bot_is_found() {
        let clock = ManualClock::new(T0);
        let r = RegularKeys::default();
        let mut shown_written = 0;
        for i in 0..1_000_000u64 {
            clock.set(T0 + i * 20);
            if i % 50 == 0 {
                r.arrival(clock.now(), hash("bot"), |out| {
                    shown_written += 1;
                    out.push_str("bot")
                });
            }
            r.arrival(clock.now(), hash(&i.to_string()), |_| {
                panic!("a one-off key is never written")
            });
            if i % 100_000 == 0 {
                assert!(r.entries() <= RegularKeys::max_entries());
            }
        }
        assert_eq!(r.entries(), RegularKeys::max_entries());
        assert_eq!(shown_written, 1);
        let found = r.regular(clock.now());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key, "bot");
    }
}
