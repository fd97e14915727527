//! The in-memory store: counters in this process, decided by the algorithms directly.
//!
//! Counters are spread over many small `std::sync::Mutex`-guarded maps rather than one
//! global lock: a decision holds only the shards of its own keys, for a few hundred
//! nanoseconds, and never across an `.await`, so a blocking mutex is cheaper than an
//! async one. A request's shards are locked in ascending order, which keeps
//! multi-key decisions atomic without deadlock. At `--max-keys` a shard drops only
//! counters that are expired or idle, never one in use or denying (`shard`).

#[cfg(test)]
mod concurrent;
mod shard;

use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::algorithm::{self, Decision, Limit, Micros, State, Verdict};
use crate::clock::Clock;

use self::shard::Shard;
use super::{
    admitted, Board, Evictions, Failed, Fallback, Hit, ShardStatus, Store, StoreError, Verdicts,
};

/// Shards of the key space; a power of two well above the core count keeps
/// contention low without wasting memory on empty maps.
pub(crate) const SHARDS: usize = 64;

/// Hits a batch may carry with its scratch on the stack.
const SMALL: usize = 8;

#[derive(Debug)]
struct Entry {
    state: State,
    expires_at: Micros,
    /// Until then the counter is in use (its last counted hit is within its window)
    /// or denying, and a full shard never drops it. At most `expires_at`.
    keep_until: Micros,
}

impl Entry {
    /// The entry for `state`, stored by a hit at `now` that `verdict` admitted.
    fn new(limit: &Limit, state: State, verdict: &Verdict, now: Micros) -> Entry {
        let mut entry = Entry {
            state,
            expires_at: 0,
            keep_until: 0,
        };
        entry.stored(limit, verdict, now);
        entry
    }

    /// Sets the times of the state just stored by a hit at `now` that `verdict`
    /// admitted; the new `keep_until`.
    fn stored(&mut self, limit: &Limit, verdict: &Verdict, now: Micros) -> Micros {
        self.expires_at = algorithm::expires_at(limit, &self.state);
        // With nothing left, the counter denies a one-hit request until `next_room`
        // has passed, which may be after its window has (a bucket refilling slowly).
        let denying = if verdict.remaining == 0 {
            now.saturating_add(verdict.next_room)
        } else {
            0
        };
        self.keep_until = now
            .saturating_add(limit.window)
            .max(denying)
            .min(self.expires_at);
        self.keep_until
    }

    /// Rewrites a bucket written under another rate in `limit`'s
    /// ([`algorithm::rebase`]), whatever the decision; its new `keep_until` then.
    fn rebase(&mut self, limit: &Limit, now: Micros) -> Option<Micros> {
        if !algorithm::rebase(limit, &mut self.state, now) {
            return None;
        }
        self.expires_at = algorithm::expires_at(limit, &self.state);
        self.keep_until = self.keep_until.min(self.expires_at);
        Some(self.keep_until)
    }

    /// Keeps the counter at least until `until` (a denial's retry time), within its
    /// life; the new `keep_until` when that raised it.
    fn deny_until(&mut self, until: Micros) -> Option<Micros> {
        let keep = until.min(self.expires_at);
        (keep > self.keep_until).then(|| {
            self.keep_until = keep;
            keep
        })
    }
}

/// A counter: its key and its entry, in one slot of a shard's table.
#[derive(Debug)]
struct Slot {
    key: Key,
    entry: Entry,
}

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
    /// Each shard's counters are found by the key's hash, which the store computes
    /// once per hit and uses for the shard as well: a `HashMap` would hash the key
    /// again for every lookup and insertion.
    shards: Vec<Mutex<Shard>>,
    /// Hashes keys for both the shard and the slot within it. Seeded per process
    /// rather than a stable hash: each shard holds `--max-keys / SHARDS` keys, and a
    /// predictable hash would let a client aim a flood of keys at one shard and
    /// fill it with a sixty-fourth of the keys.
    hasher: ahash::RandomState,
    clock: Arc<dyn Clock>,
}

impl MemoryStore {
    /// A store holding at most `max_keys` counters (at least one a shard).
    pub fn new(clock: Arc<dyn Clock>, max_keys: usize) -> Self {
        // The remainder goes one each to the first shards, so the caps add up.
        let cap = |i: usize| (max_keys / SHARDS + usize::from(i < max_keys % SHARDS)).max(1);
        MemoryStore {
            shards: (0..SHARDS)
                .map(|i| Mutex::new(Shard::new(cap(i))))
                .collect(),
            hasher: ahash::RandomState::new(),
            clock,
        }
    }

    /// Drops every counter that has expired; returns how many. The server calls this
    /// periodically so idle keys do not pile up.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let hasher = |s: &Slot| self.hash(s.key.as_bytes());
        self.shards.iter().map(|s| lock(s).sweep(now, hasher)).sum()
    }

    /// Drops the counter of `key`, if it is held: its owner has no more use for it
    /// (`failure_mode: local`, a counter settled). Whether one was.
    pub fn forget(&self, key: &str) -> bool {
        let hash = self.hash(key.as_bytes());
        lock(&self.shards[Self::shard_of(hash)]).remove(hash, key)
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

    /// Decides a batch under the locks of its shards, at once (what [`Store::decide`]
    /// answers).
    pub fn decide_now(&self, hits: &[Hit]) -> Verdicts {
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

        // Where each hit's key already has a slot, found before any counter is
        // dropped to make room for a new key, so that none of the batch's own is,
        // and so that storing the next state does not look the key up again. A
        // repeated key has the slot its earlier hit found.
        let mut slots: SmallVec<[Option<usize>; SMALL]> = SmallVec::with_capacity(hits.len());
        for (i, hit) in hits.iter().enumerate() {
            // Equal keys have equal hashes; the hash is the cheaper comparison.
            let same = (0..i)
                .rev()
                .find(|&j| hashes[j] == hashes[i] && hits[j].key == hit.key);
            slots.push(match same {
                Some(j) => slots[j],
                None => guards[guard_of(shard_ids[i])]
                    .table
                    .find_bucket_index(hashes[i], |s| s.holds(&hit.key)),
            });
        }

        // Check every hit first. A key that appears twice in one batch sees the state
        // its earlier hit would leave, as if the two were sent one after the other.
        let mut verdicts = Vec::with_capacity(hits.len());
        let mut next: SmallVec<[Option<State>; SMALL]> = SmallVec::with_capacity(hits.len());
        // Whether each hit is a new key given room in its shard.
        let mut room: SmallVec<[bool; SMALL]> = SmallVec::with_capacity(hits.len());
        // New keys not kept and lifted (allocates only when there are some).
        let mut lifted = Vec::new();
        // Changes made in place, to keep or take back once the batch is decided.
        let mut changes: SmallVec<[Option<algorithm::Change>; SMALL]> =
            SmallVec::with_capacity(hits.len());
        for (i, hit) in hits.iter().enumerate() {
            let earlier = (0..i)
                .rev()
                .find(|&j| hashes[j] == hashes[i] && hits[j].key == hit.key && next[j].is_some());
            // A key the batch names once is decided in place where it can be; one
            // named again sees its earlier hits' states, so it takes copies.
            let once = || {
                !(0..hits.len()).any(|j| j != i && hashes[j] == hashes[i] && hits[j].key == hit.key)
            };
            let shard = &mut guards[guard_of(shard_ids[i])];
            let in_place = slots[i]
                .filter(|_| algorithm::in_place(hit.limit.algorithm) && once())
                .and_then(|b| shard.table.get_bucket_mut(b))
                .filter(|s| s.entry.expires_at > now)
                .and_then(|s| hit.decide_in_place(&mut s.entry.state, now));
            let mut decision = match (in_place, earlier) {
                (Some((verdict, change)), _) => {
                    changes.push(Some(change));
                    Decision {
                        verdict,
                        next: None,
                    }
                }
                (None, Some(j)) => {
                    changes.push(None);
                    hit.decide(next[j].as_ref(), now)
                }
                (None, None) => {
                    changes.push(None);
                    let slot = slots[i]
                        .and_then(|b| shard.table.get_bucket_mut(b))
                        .filter(|s| s.entry.expires_at > now);
                    // As decide.lua: only the batch's first hit on a key rebases it;
                    // a later one reads it as it is.
                    let first =
                        || !(0..i).any(|j| hashes[j] == hashes[i] && hits[j].key == hit.key);
                    match slot {
                        Some(slot) => {
                            let rebased = first()
                                .then(|| slot.entry.rebase(&hit.limit, now))
                                .flatten();
                            let decision = hit.decide(Some(&slot.entry.state), now);
                            if let Some(keep) = rebased {
                                shard.kept(keep);
                            }
                            decision
                        }
                        None => hit.decide(None, now),
                    }
                }
            };
            let mut new_key = false;
            let verdict = &mut decision.verdict;
            match (earlier, slots[i]) {
                (None, None) if decision.next.is_some() => {
                    let pending = (0..i)
                        .filter(|&j| room[j] && shard_ids[j] == shard_ids[i])
                        .count();
                    let busy = |b: usize| {
                        (0..hits.len()).any(|j| shard_ids[j] == shard_ids[i] && slots[j] == Some(b))
                    };
                    match shard.make_room(now, pending, busy) {
                        Ok(()) => new_key = true,
                        Err(soonest) => {
                            refuse(hit, verdict, soonest - now);
                            lifted.push(i);
                            decision.next = None;
                        }
                    }
                }
                (None, Some(b)) if !verdict.admitted && verdict.remaining == 0 => {
                    let until = now.saturating_add(verdict.retry_after);
                    let raised = shard
                        .table
                        .get_bucket_mut(b)
                        .and_then(|s| s.entry.deny_until(until));
                    if let Some(keep) = raised {
                        shard.kept(keep);
                    }
                }
                _ => {}
            }
            verdicts.push(decision.verdict);
            next.push(decision.next);
            room.push(new_key);
        }

        let admitted = admitted(hits.iter().map(|h| h.mode), &verdicts);
        // Before any new key is added, which may move the slots found above.
        for (i, change) in changes.into_iter().enumerate() {
            let (Some(change), Some(b)) = (change, slots[i]) else {
                continue;
            };
            if !change.changed() {
                continue;
            }
            let hit = &hits[i];
            let shard = &mut guards[guard_of(shard_ids[i])];
            let Some(slot) = shard.table.get_bucket_mut(b) else {
                continue;
            };
            if hit.spent(admitted) {
                let keep = slot.entry.stored(&hit.limit, &verdicts[i], now);
                shard.kept(keep);
            } else {
                algorithm::undo(&mut slot.entry.state, change);
            }
        }
        // A charge's state is stored even when the request is denied.
        if admitted || hits.iter().any(|h| h.spend.always()) {
            for (i, state) in next.into_iter().enumerate() {
                let Some(state) = state else { continue };
                let hit = &hits[i];
                if !hit.spent(admitted) {
                    continue;
                }
                let entry = Entry::new(&hit.limit, state, &verdicts[i], now);
                let shard = &mut guards[guard_of(shard_ids[i])];
                // A slot found above may have moved since, if an earlier hit's new key
                // grew the table: it is used only while it still holds the key. A key
                // found nowhere above may since have been added by its earlier hit.
                let slot = slots[i]
                    .filter(|&b| shard.table.get_bucket(b).is_some_and(|s| s.holds(&hit.key)))
                    .or_else(|| {
                        shard
                            .table
                            .find_bucket_index(hashes[i], |s| s.holds(&hit.key))
                    });
                match slot.and_then(|b| shard.table.get_bucket_mut(b)) {
                    Some(slot) => {
                        let keep = entry.keep_until;
                        slot.entry = entry;
                        shard.kept(keep);
                    }
                    None => {
                        let slot = Slot::new(&hit.key, entry);
                        shard.insert(hashes[i], slot, |s| self.hash(s.key.as_bytes()));
                    }
                }
            }
        }
        Verdicts {
            admitted,
            verdicts,
            now: Some(now),
            failed: not_kept(lifted),
        }
    }

    /// [`Store::peek`]: each hit decided on the state its counter holds (or the one
    /// its batch's earlier hit of the same key would leave), under one shard lock at a
    /// time, writing nothing.
    fn peek_now(&self, hits: &[Hit]) -> Verdicts {
        let now = self.clock.now();
        let mut verdicts = Vec::with_capacity(hits.len());
        let mut next: Vec<Option<State>> = Vec::with_capacity(hits.len());
        for (i, hit) in hits.iter().enumerate() {
            let earlier = (0..i)
                .rev()
                .find(|&j| hits[j].key == hit.key && next[j].is_some());
            let owed = |state: Option<&State>| algorithm::owed_now(&hit.limit, state, now);
            let (decision, owed) = match earlier {
                Some(j) => (hit.decide(next[j].as_ref(), now), owed(next[j].as_ref())),
                None => {
                    let hash = self.hash(hit.key.as_bytes());
                    let shard = lock(&self.shards[Self::shard_of(hash)]);
                    let state = shard
                        .table
                        .find(hash, |s| s.holds(&hit.key))
                        .filter(|s| s.entry.expires_at > now)
                        .map(|s| &s.entry.state);
                    (hit.decide(state, now), owed(state))
                }
            };
            verdicts.push(Verdict {
                owed,
                ..decision.verdict
            });
            next.push(decision.next);
        }
        Verdicts {
            admitted: admitted(hits.iter().map(|h| h.mode), &verdicts),
            verdicts,
            now: Some(now),
            failed: None,
        }
    }

    /// A batch of one hit, the commonest: one lock, one lookup for a key that
    /// exists, and none of the batch's scratch (whose inline arrays are copied
    /// whole when made).
    fn decide_one(&self, hit: &Hit) -> Verdicts {
        let now = self.clock.now();
        let hash = self.hash(hit.key.as_bytes());
        let mut guard = lock(&self.shards[Self::shard_of(hash)]);
        let shard = &mut *guard;
        if let Some(slot) = shard.table.find_mut(hash, |s| s.holds(&hit.key)) {
            let live = slot.entry.expires_at > now;
            let rebased = live.then(|| slot.entry.rebase(&hit.limit, now)).flatten();
            let in_place = live
                .then(|| hit.decide_in_place(&mut slot.entry.state, now))
                .flatten();
            let (decision, change) = match in_place {
                Some((verdict, change)) => (
                    Decision {
                        verdict,
                        next: None,
                    },
                    Some(change),
                ),
                None => (hit.decide(live.then_some(&slot.entry.state), now), None),
            };
            let verdicts = vec![decision.verdict];
            let admitted = admitted(std::iter::once(hit.mode), &verdicts);
            let verdict = &verdicts[0];
            let keep = match (decision.next, change) {
                (Some(state), _) if hit.spent(admitted) => {
                    slot.entry = Entry::new(&hit.limit, state, verdict, now);
                    Some(slot.entry.keep_until)
                }
                (_, Some(change)) if change.changed() => {
                    if hit.spent(admitted) {
                        Some(slot.entry.stored(&hit.limit, verdict, now))
                    } else {
                        algorithm::undo(&mut slot.entry.state, change);
                        None
                    }
                }
                (None, _) if !verdict.admitted && verdict.remaining == 0 => slot
                    .entry
                    .deny_until(now.saturating_add(verdict.retry_after)),
                _ => None,
            };
            for keep in [keep, rebased].into_iter().flatten() {
                shard.kept(keep);
            }
            return Verdicts {
                admitted,
                verdicts,
                now: Some(now),
                failed: None,
            };
        }

        // A key the shard does not hold: a fresh counter, kept if there is room.
        let mut decision = hit.decide(None, now);
        let mut lifted = Vec::new();
        if let Some(state) = decision.next.take() {
            match shard.make_room(now, 0, |_| false) {
                Ok(()) => {
                    let entry = Entry::new(&hit.limit, state, &decision.verdict, now);
                    let slot = Slot::new(&hit.key, entry);
                    shard.insert(hash, slot, |s| self.hash(s.key.as_bytes()));
                }
                Err(soonest) => {
                    refuse(hit, &mut decision.verdict, soonest - now);
                    lifted.push(0);
                }
            }
        }
        let verdicts = vec![decision.verdict];
        Verdicts {
            admitted: admitted(std::iter::once(hit.mode), &verdicts),
            verdicts,
            now: Some(now),
            failed: not_kept(lifted),
        }
    }
}

/// Answers a new key that a full shard cannot keep as its hit's fallback (its
/// domain's failure mode) answers a counter on a failed shard; the key is named in
/// [`Verdicts::failed`] either way. `Admit` (or `Local`): lifted, a placeholder
/// verdict taken as admitted. `Deny`: a denial until a counter of the shard may go
/// (`wait`), at the soonest, which denies the request as the hit's mode does.
fn refuse(hit: &Hit, verdict: &mut Verdict, wait: Micros) {
    *verdict = match hit.fallback {
        Fallback::Deny => Verdict {
            admitted: false,
            remaining: 0,
            reset: wait,
            retry_after: wait.max(1),
            delay: 0,
            next_room: 0,
            owed: 0,
            late: false,
        },
        Fallback::Admit | Fallback::Local => Failed::placeholder(),
    };
}

/// The hits of a batch not kept for want of room ([`refuse`]), if any.
fn not_kept(lifted: Vec<usize>) -> Option<Failed> {
    (!lifted.is_empty()).then_some(Failed {
        error: StoreError::Full,
        hits: lifted,
    })
}

impl Slot {
    fn new(key: &str, entry: Entry) -> Slot {
        Slot {
            key: Key::new(key.as_bytes()),
            entry,
        }
    }

    /// Whether this slot counts `key`.
    fn holds(&self, key: &str) -> bool {
        // The state's tag is read before the key is compared, though unused here:
        // a slot spans more than one cache line, and with many keys all miss. Read
        // together, the misses overlap; read in turn (key now, state in the
        // algorithm), each cold key waits for them one after another.
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

/// Sentences stay in the limiter's process: nothing to share.
impl Board for MemoryStore {}

impl Store for MemoryStore {
    async fn decide(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        Ok(self.decide_now(hits))
    }

    async fn peek(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        Ok(self.peek_now(hits))
    }

    fn active_keys(&self) -> usize {
        self.shards.iter().map(|s| lock(s).table.len()).sum()
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

    /// In the process: never away, so `failure_mode: local` has nothing to do.
    fn can_be_away(&self) -> bool {
        false
    }

    fn evictions(&self) -> Evictions {
        self.shards.iter().fold(Evictions::default(), |sum, s| {
            let e = lock(s).evictions;
            Evictions {
                expired: sum.expired + e.expired,
                idle: sum.idle + e.idle,
                refused: sum.refused + e.refused,
            }
        })
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
            phase: 0,
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
    fn a_peek_spends_nothing_and_keeps_nothing() {
        let clock = ManualClock::new(1_000 * SECOND);
        let store = MemoryStore::new(Arc::new(clock.clone()), 1000);
        let mut h = hit("k", Algorithm::FixedWindow, 3, 1);
        h.limit = fixed(3);
        let one = std::slice::from_ref(&h);
        let peeked = store.peek_now(one);
        assert!(peeked.admitted);
        assert_eq!(peeked.verdicts[0].remaining, 2, "what the hit would leave");
        assert_eq!(store.active_keys(), 0, "a peek creates no counter");
        assert_eq!(store.decide_now(one).verdicts[0].remaining, 2);
        for _ in 0..3 {
            assert_eq!(store.peek_now(one).verdicts[0].remaining, 1);
        }
        assert_eq!(store.decide_now(one).verdicts[0].remaining, 1);
        assert_eq!(store.decide_now(one).verdicts[0].remaining, 0);
        let full = store.peek_now(one);
        assert!(!full.admitted && full.verdicts[0].retry_after > 0);
        // The same key twice in one peek: the second sees what the first would leave.
        let mut fresh = hit("fresh", Algorithm::FixedWindow, 3, 2);
        fresh.limit = fixed(3);
        let twice = store.peek_now(&[fresh.clone(), fresh]);
        assert!(!twice.admitted);
        assert_eq!(twice.verdicts[0].remaining, 1);
        assert!(!twice.verdicts[1].admitted);
        assert_eq!(store.active_keys(), 1);
    }

    #[test]
    fn a_forgotten_counter_starts_afresh_and_a_swept_table_gives_its_memory_back() {
        let clock = ManualClock::new(1_000 * SECOND);
        let store = MemoryStore::new(Arc::new(clock.clone()), 100_000);
        let one = |key: &str| {
            let mut h = hit(key, Algorithm::FixedWindow, 1, 1);
            h.limit = fixed(1);
            store.decide_now(std::slice::from_ref(&h)).admitted
        };
        assert!(one("k"));
        assert!(!one("k"));
        assert!(store.forget("k"));
        assert!(!store.forget("k"));
        assert!(one("k"), "started afresh");
        let capacity = || -> usize { store.shards.iter().map(|s| lock(s).table.capacity()).sum() };
        for i in 0..20_000 {
            assert!(one(&format!("flood-{i}")));
        }
        assert!(capacity() >= 20_000);
        clock.advance(2 * SECOND);
        assert_eq!(store.sweep(), 20_001);
        assert!(capacity() < 1_000, "{}", capacity());
        // The shrunk tables keep counting.
        for i in 0..2_000 {
            assert!(one(&format!("after-{i}")));
            assert!(!one(&format!("after-{i}")));
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// Requests of sliding_window_log hits on a few keys, some named twice, beside
        /// a limit that denies some of the requests: the store answers as deciding
        /// each hit on a copy of its counter's state does (a key named again seeing
        /// its earlier hit's), keeping the copies only when the request is admitted.
        #[test]
        fn logs_decided_in_place_answer_as_copies_do(
            requests in proptest::collection::vec(
                (
                    proptest::collection::vec((0..4usize, 0..3u64), 1..6),
                    proptest::prelude::any::<bool>(),
                    0..400_000u64,
                ),
                1..40,
            ),
        ) {
            let clock = ManualClock::new(1_000 * SECOND);
            let store = MemoryStore::new(Arc::new(clock.clone()), 1000);
            let mut kept: std::collections::HashMap<String, State> = Default::default();
            let log = Limit {
                algorithm: Algorithm::SlidingWindowLog,
                requests: 5,
                window: SECOND,
                burst: 5,
                phase: 0,
            };
            for (keys, gate_denies, advance) in requests {
                clock.advance(advance);
                let now = clock.now();
                let mut hits: Vec<Hit> = keys
                    .iter()
                    .map(|&(k, n)| Hit {
                        limit: log,
                        ..hit(&format!("log-{k}"), Algorithm::SlidingWindowLog, 5, n)
                    })
                    .collect();
                let gate = if gate_denies { 0 } else { 1_000_000 };
                hits.push(Hit {
                    limit: fixed(gate),
                    ..hit("gate", Algorithm::FixedWindow, gate, 1)
                });
                let got = store.decide_now(&hits);
                let mut copies = kept.clone();
                let mut want = Vec::new();
                for h in &hits {
                    let d = h.decide(copies.get(&h.key), now);
                    want.push(d.verdict);
                    if let Some(n) = d.next {
                        copies.insert(h.key.clone(), n);
                    }
                }
                let admitted = admitted(hits.iter().map(|h| h.mode), &want);
                if admitted {
                    kept = copies;
                }
                proptest::prop_assert_eq!(got.admitted, admitted);
                proptest::prop_assert_eq!(got.verdicts, want);
            }
        }
    }
}
