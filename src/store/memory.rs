//! The in-memory store: counters in this process, decided by the algorithms directly.
//!
//! Counters are spread over many small `std::sync::Mutex`-guarded maps rather than one
//! global lock: a decision holds only the shards of its own keys, for a few hundred
//! nanoseconds, and never across an `.await`, so a blocking mutex is cheaper than an
//! async one. A request's shards are locked in ascending order, which keeps
//! multi-key decisions atomic without deadlock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::algorithm::{self, Micros, State};
use crate::clock::Clock;

use super::{admitted, Hit, ShardStatus, Store, StoreError, Verdicts};

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

/// A counter: its key and its entry, in one slot of a shard's table.
#[derive(Debug)]
struct Slot {
    key: Key,
    entry: Entry,
}

/// A shard's counters, found by the key's hash, which the store computes once per
/// hit and uses for the shard as well: a `HashMap` would hash the key again for
/// every lookup and insertion.
type Shard = hashbrown::HashTable<Slot>;

/// Longest key kept inside the map's own memory.
const INLINE: usize = 38;

/// A counter key, inline when short (most are: `domain|key=value` with an address or
/// an id), so a lookup compares it where the map's slot already is instead of
/// following a pointer to a heap string, which with many keys is one more cache miss
/// per decision.
#[derive(Debug)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Key {
    fn new(b: &[u8]) -> Key {
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

/// Counters kept in this process.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Vec<Mutex<Shard>>,
    /// Hashes keys for both the shard and the slot within it. Seeded per process
    /// rather than a stable hash: each shard holds `--max-keys / SHARDS` keys, and a
    /// predictable hash would let a client aim a flood of keys at one shard and
    /// evict its neighbours' counters with a sixty-fourth of the keys.
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
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
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
            map.retain(|s| s.entry.expires_at > now);
            removed += before - map.len();
        }
        removed
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// A hash's shard. The table within the shard reads the hash's low bits (the
    /// bucket) and top seven (the tag), so the shard takes bits from the middle:
    /// keys of one shard then still differ in both.
    fn shard_of(hash: u64) -> usize {
        (hash >> 40) as usize % SHARDS
    }

    /// Decides a batch under the locks of its shards.
    fn decide_now(&self, hits: &[Hit]) -> Verdicts {
        if let [hit] = hits {
            return self.decide_one(hit);
        }
        let now = self.clock.now();
        // Requests carry a few descriptors: their scratch stays on the stack.
        let hashes: SmallVec<[u64; SMALL]> =
            hits.iter().map(|h| self.hash(h.key.as_bytes())).collect();
        let shard_ids: SmallVec<[usize; SMALL]> =
            hashes.iter().map(|&h| Self::shard_of(h)).collect();
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
        // Where each hit's key already has a slot, so that storing its next state
        // does not look the key up again.
        let mut slots: SmallVec<[Option<usize>; SMALL]> = SmallVec::with_capacity(hits.len());
        for (i, hit) in hits.iter().enumerate() {
            // Equal keys have equal hashes; the hash is the cheaper comparison.
            let earlier = (0..i)
                .rev()
                .find(|&j| hashes[j] == hashes[i] && hits[j].key == hit.key && next[j].is_some());
            let map = &guards[guard_of(shard_ids[i])];
            // A repeated key has the slot its earlier hit found: nothing moves yet.
            let slot = match earlier {
                Some(j) => slots[j],
                None => map.find_bucket_index(hashes[i], |s| s.holds(&hit.key)),
            };
            let decision = match earlier {
                Some(j) => algorithm::decide(&hit.limit, next[j].as_ref(), now, hit.hits),
                None => {
                    let state = slot
                        .and_then(|b| map.get_bucket(b))
                        .filter(|s| s.entry.expires_at > now)
                        .map(|s| &s.entry.state);
                    algorithm::decide(&hit.limit, state, now, hit.hits)
                }
            };
            verdicts.push(decision.verdict);
            next.push(decision.next);
            slots.push(slot);
        }

        let admitted = admitted(hits.iter().map(|h| h.mode), &verdicts);
        if admitted {
            for (i, state) in next.into_iter().enumerate() {
                let Some(state) = state else { continue };
                let hit = &hits[i];
                let entry = Entry {
                    expires_at: algorithm::expires_at(&hit.limit, &state),
                    state,
                };
                let map = &mut guards[guard_of(shard_ids[i])];
                // A slot found above may have moved since, if an earlier hit's new key
                // grew the table: it is used only while it still holds the key. A key
                // found nowhere above may since have been added by its earlier hit.
                let slot = slots[i]
                    .filter(|&b| map.get_bucket(b).is_some_and(|s| s.holds(&hit.key)))
                    .or_else(|| map.find_bucket_index(hashes[i], |s| s.holds(&hit.key)));
                match slot.and_then(|b| map.get_bucket_mut(b)) {
                    Some(slot) => slot.entry = entry,
                    None => self.insert(map, hashes[i], &hit.key, entry),
                }
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
        let hash = self.hash(hit.key.as_bytes());
        let mut map = lock(&self.shards[Self::shard_of(hash)]);
        let mut slot = map.find_mut(hash, |s| s.holds(&hit.key));
        let state = slot
            .as_deref()
            .filter(|s| s.entry.expires_at > now)
            .map(|s| &s.entry.state);
        let decision = algorithm::decide(&hit.limit, state, now, hit.hits);
        let verdicts = vec![decision.verdict];
        let admitted = admitted(std::iter::once(hit.mode), &verdicts);
        if let (true, Some(state)) = (admitted, decision.next) {
            let expires_at = algorithm::expires_at(&hit.limit, &state);
            let entry = Entry { state, expires_at };
            match slot.take() {
                Some(s) => s.entry = entry,
                None => self.insert(&mut map, hash, &hit.key, entry),
            }
        }
        Verdicts {
            admitted,
            verdicts,
            now: Some(now),
        }
    }

    /// Adds a counter for `key`, whose hash is `hash` and which `map` does not hold.
    fn insert(&self, map: &mut Shard, hash: u64, key: &str, entry: Entry) {
        if map.len() >= self.shard_cap {
            // Full of live keys: drop an arbitrary one. Its owner gets a fresh counter,
            // which is the price of a memory bound under a flood of distinct keys.
            let victim = map.iter().next().map(|s| self.hash(s.key.as_bytes()));
            // The first slot on the victim's probe sequence with its tag: the victim
            // or another key, either of which will do.
            if let Some(Ok(found)) = victim.map(|h| map.find_entry(h, |_| true)) {
                found.remove();
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        let slot = Slot {
            key: Key::new(key.as_bytes()),
            entry,
        };
        map.insert_unique(hash, slot, |s| self.hash(s.key.as_bytes()));
    }
}

impl Slot {
    /// Whether this slot counts `key`.
    fn holds(&self, key: &str) -> bool {
        // The state's tag is read before the key is compared, though unused here:
        // an 80-byte slot spans two cache lines, and with many keys both miss. Read
        // together, the misses overlap; read in turn (key now, state in the
        // algorithm), they cost 55-60 ns more per cold key.
        std::hint::black_box(std::mem::discriminant(&self.entry.state));
        self.key.as_bytes() == key.as_bytes()
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

    fn shards(&self) -> Vec<ShardStatus> {
        vec![ShardStatus::in_memory()]
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
    use crate::algorithm::{Algorithm, Limit, SECOND};
    use crate::clock::ManualClock;
    use crate::store::testkit::hit;

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
    fn a_batch_that_grows_the_tables_still_counts_its_existing_keys() {
        let store = MemoryStore::new(Arc::new(ManualClock::new(1_000 * SECOND)), 100_000);
        let counted = |key: &str| {
            let mut h = hit(key, Algorithm::FixedWindow, 10, 1);
            h.limit = fixed(10);
            h
        };
        assert!(store.decide_now(&[counted("old")]).admitted);
        // The existing key around 500 new ones, enough to grow every shard's table
        // while the batch is stored: the old key's slot, found before the new keys
        // went in, is written only if it still holds the old key.
        let mut batch = vec![counted("old")];
        batch.extend((0..500).map(|i| counted(&format!("new-{i}"))));
        batch.push(counted("old"));
        let decided = store.decide_now(&batch);
        assert!(decided.admitted);
        assert_eq!(decided.verdicts[0].remaining, 8);
        assert_eq!(decided.verdicts[501].remaining, 7);
        assert_eq!(store.active_keys(), 501);
        // Every key once more: the old key has counted 4 hits, each new one 2.
        let after = store.decide_now(&batch[..501]);
        assert_eq!(after.verdicts[0].remaining, 6, "old");
        for (i, v) in after.verdicts[1..].iter().enumerate() {
            assert_eq!(v.remaining, 8, "new-{i}");
        }
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
