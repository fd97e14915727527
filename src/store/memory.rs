//! The in-memory store: counters in this process, decided by the algorithms directly.
//!
//! Counters are spread over many small `std::sync::Mutex`-guarded maps rather than one
//! global lock: a decision holds only the shards of its own keys, for a few hundred
//! nanoseconds, and never across an `.await`, so a blocking mutex is cheaper than an
//! async one. A request's shards are locked in ascending order, which keeps
//! multi-key decisions atomic without deadlock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::algorithm::{self, Micros, State};
use crate::clock::Clock;

use super::{admitted, Hit, Store, StoreError, Verdicts};

/// Shards of the key space; a power of two well above the core count keeps
/// contention low without wasting memory on empty maps.
const SHARDS: usize = 64;

/// Hits a batch may carry with its scratch on the stack.
const SMALL: usize = 8;

#[derive(Debug)]
struct Entry {
    state: State,
    expires_at: Micros,
}

type Shard = HashMap<Key, Entry, ahash::RandomState>;

/// Longest key kept inside the map's own memory.
const INLINE: usize = 38;

/// A counter key, inline when short (most are: `domain|key=value` with an address or
/// an id), so a lookup compares it where the map's slot already is instead of
/// following a pointer to a heap string, which with many keys is one more cache miss
/// per decision. Compared and hashed as bytes, so maps look it up by `&[u8]`.
#[derive(Debug, Clone)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Key {
    fn new(key: &str) -> Key {
        let b = key.as_bytes();
        if b.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..b.len()].copy_from_slice(b);
            Key::Inline {
                len: b.len() as u8,
                bytes,
            }
        } else {
            Key::Heap(b.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Heap(b) => b,
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    // As `[u8]` hashes, which `Borrow<[u8]>` requires.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl std::borrow::Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

/// Counters kept in this process.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Vec<Mutex<Shard>>,
    hasher: ahash::RandomState,
    /// Most keys one shard may hold (`--max-keys` spread over the shards).
    shard_cap: usize,
    clock: Arc<dyn Clock>,
    evictions: AtomicU64,
}

impl MemoryStore {
    /// A store holding at most about `max_keys` counters.
    pub fn new(clock: Arc<dyn Clock>, max_keys: usize) -> Self {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::with_hasher(ahash::RandomState::new())))
                .collect(),
            hasher: ahash::RandomState::new(),
            shard_cap: max_keys.div_ceil(SHARDS).max(1),
            clock,
            evictions: AtomicU64::new(0),
        }
    }

    /// Drops every counter that has expired; returns how many. The server calls this
    /// periodically so idle keys do not pile up.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let mut removed = 0;
        for shard in &self.shards {
            let mut map = lock(shard);
            let before = map.len();
            map.retain(|_, e| e.expires_at > now);
            removed += before - map.len();
        }
        removed
    }

    /// A key's lock shard, from a per-process random hash rather than the stable
    /// placement hash: each shard holds `--max-keys / SHARDS` keys, and a predictable
    /// hash would let a client aim a flood of keys at one shard and evict its
    /// neighbours' counters with a sixty-fourth of the keys.
    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// Decides a batch under the locks of its shards.
    fn decide_now(&self, hits: &[Hit]) -> Verdicts {
        if let [hit] = hits {
            return self.decide_one(hit);
        }
        let now = self.clock.now();
        // Requests carry a few descriptors: their scratch stays on the stack.
        let shard_ids: SmallVec<[usize; SMALL]> =
            hits.iter().map(|h| self.shard_of(&h.key)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; SMALL]> =
            order.iter().map(|&i| lock(&self.shards[i])).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).unwrap_or(0);

        // Check every hit first. A key that appears twice in one batch sees the state
        // its earlier hit would leave, as if the two were sent one after the other.
        let mut verdicts = Vec::with_capacity(hits.len());
        let mut next: SmallVec<[Option<State>; SMALL]> = SmallVec::with_capacity(hits.len());
        for (i, hit) in hits.iter().enumerate() {
            // Equal keys have equal shards; the shard is the cheaper comparison.
            let earlier = (0..i).rev().find(|&j| {
                shard_ids[j] == shard_ids[i] && hits[j].key == hit.key && next[j].is_some()
            });
            let decision = match earlier {
                Some(j) => algorithm::decide(&hit.limit, next[j].as_ref(), now, hit.hits),
                None => {
                    let map = &guards[guard_of(shard_ids[i])];
                    let state = map
                        .get(hit.key.as_bytes())
                        .filter(|e| e.expires_at > now)
                        .map(|e| &e.state);
                    algorithm::decide(&hit.limit, state, now, hit.hits)
                }
            };
            verdicts.push(decision.verdict);
            next.push(decision.next);
        }

        let admitted = admitted(hits.iter().map(|h| h.mode), &verdicts);
        if admitted {
            for (i, state) in next.into_iter().enumerate() {
                let Some(state) = state else { continue };
                let expires_at = algorithm::expires_at(&hits[i].limit, &state);
                let map = &mut guards[guard_of(shard_ids[i])];
                self.insert(map, &hits[i].key, Entry { state, expires_at });
            }
        }
        Verdicts {
            admitted,
            verdicts,
            now: Some(now),
        }
    }

    /// A batch of one hit, the commonest: one lock, one lookup for a key that
    /// exists, and none of the batch's scratch (whose inline arrays are copied
    /// whole when made).
    fn decide_one(&self, hit: &Hit) -> Verdicts {
        let now = self.clock.now();
        let mut map = lock(&self.shards[self.shard_of(&hit.key)]);
        let mut slot = map
            .get_mut(hit.key.as_bytes())
            .filter(|e| e.expires_at > now);
        let decision =
            algorithm::decide(&hit.limit, slot.as_deref().map(|e| &e.state), now, hit.hits);
        let verdicts = vec![decision.verdict];
        let admitted = admitted(std::iter::once(hit.mode), &verdicts);
        if let (true, Some(state)) = (admitted, decision.next) {
            let expires_at = algorithm::expires_at(&hit.limit, &state);
            let entry = Entry { state, expires_at };
            match slot.take() {
                Some(e) => *e = entry,
                None => self.insert(&mut map, &hit.key, entry),
            }
        }
        Verdicts {
            admitted,
            verdicts,
            now: Some(now),
        }
    }

    fn insert(&self, map: &mut Shard, key: &str, entry: Entry) {
        if let Some(slot) = map.get_mut(key.as_bytes()) {
            *slot = entry;
            return;
        }
        if map.len() >= self.shard_cap {
            // Full of live keys: drop an arbitrary one. Its owner gets a fresh counter,
            // which is the price of a memory bound under a flood of distinct keys.
            if let Some(victim) = map.keys().next().cloned() {
                map.remove(&victim);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        map.insert(Key::new(key), entry);
    }
}

/// Locks a shard even if a previous holder panicked: the maps hold plain data that a
/// panic cannot leave half-written in a way that matters for rate limiting.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Store for MemoryStore {
    async fn decide(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        Ok(self.decide_now(hits))
    }

    fn active_keys(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    /// Its shards follow a per-process hash of the key instead.
    fn places_keys(&self) -> bool {
        false
    }

    fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::algorithm::{Limit, SECOND};
    use crate::clock::ManualClock;

    crate::store_contract!(MemoryStore::new(
        Arc::new(ManualClock::new(1_000 * SECOND)),
        1000
    ));

    fn fixed(requests: u64) -> Limit {
        Limit {
            algorithm: Algorithm::FixedWindow,
            requests,
            window: SECOND,
            burst: requests,
        }
    }

    #[test]
    fn short_and_long_keys_count_apart() {
        let store = MemoryStore::new(Arc::new(ManualClock::new(1_000 * SECOND)), 1000);
        // Inline (up to INLINE bytes) and on the heap, and two that differ only past
        // the inline length.
        let long = "d|client=".to_string() + &"x".repeat(INLINE);
        let keys = [
            "d|client=a".to_string(),
            "d|client=".to_string() + &"a".repeat(INLINE - 9),
            long.clone() + "1",
            long + "2",
        ];
        assert_eq!(keys[1].len(), INLINE);
        for key in &keys {
            let mut h = hit(key, Algorithm::FixedWindow, 1, 1);
            h.limit = fixed(2);
            let one = std::slice::from_ref(&h);
            assert!(store.decide_now(one).admitted, "{key}");
            assert!(store.decide_now(one).admitted, "{key}");
            assert!(!store.decide_now(one).admitted, "{key}");
        }
        assert_eq!(store.active_keys(), keys.len());
    }

    #[test]
    fn batches_beyond_the_stack_scratch_decide_alike() {
        let store = MemoryStore::new(Arc::new(ManualClock::new(1_000 * SECOND)), 1000);
        // 3 * SMALL hits on SMALL keys, each key three times: the heap path, with
        // repeats that see their earlier hits' states.
        let hits: Vec<Hit> = (0..3 * SMALL)
            .map(|i| {
                let mut h = hit(&format!("k{}", i % SMALL), Algorithm::FixedWindow, 3, 1);
                h.limit = fixed(3);
                h
            })
            .collect();
        let first = store.decide_now(&hits);
        assert!(first.admitted);
        let remaining: Vec<u64> = first.verdicts.iter().map(|v| v.remaining).collect();
        let want: Vec<u64> = (0..3 * SMALL).map(|i| 2 - (i / SMALL) as u64).collect();
        assert_eq!(remaining, want);
        assert_eq!(store.active_keys(), SMALL);
        let second = store.decide_now(&hits);
        assert!(!second.admitted);
        assert!(second.verdicts.iter().all(|v| !v.admitted));
    }

    #[test]
    fn idle_keys_expire_and_are_swept() {
        let clock = ManualClock::new(1_000 * SECOND);
        let store = MemoryStore::new(Arc::new(clock.clone()), 1000);
        let mut h = hit("k", Algorithm::FixedWindow, 1, 1);
        h.limit = fixed(1);
        assert!(store.decide_now(std::slice::from_ref(&h)).admitted);
        assert!(!store.decide_now(std::slice::from_ref(&h)).admitted);
        assert_eq!(store.active_keys(), 1);
        clock.advance(SECOND);
        assert!(
            store.decide_now(std::slice::from_ref(&h)).admitted,
            "new window"
        );
        clock.advance(5 * SECOND);
        assert_eq!(store.sweep(), 1);
        assert_eq!(store.active_keys(), 0);
    }

    #[test]
    fn a_flood_of_distinct_keys_stays_under_max_keys() {
        let clock = ManualClock::new(1_000 * SECOND);
        let store = MemoryStore::new(Arc::new(clock), 640);
        for i in 0..10_000 {
            let mut h = hit(&format!("flood-{i}"), Algorithm::FixedWindow, 5, 1);
            h.limit = fixed(5);
            assert!(store.decide_now(&[h]).admitted);
        }
        assert!(store.active_keys() <= 640, "{}", store.active_keys());
        assert!(store.evictions() >= 10_000 - 640);
    }
}
