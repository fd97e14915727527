//! One shard of the memory store: its counters, and which of them may go when it is
//! full.
//!
//! A full shard makes room for a new key only by dropping a counter whose
//! `keep_until` has passed: its state has expired, or it is idle (its window has
//! passed since its last counted hit, and it is not denying). A counter in use within
//! its window or denying is never dropped, so no flood of new keys resets anyone's
//! count; when a full shard holds nothing else, the new key is refused and the store
//! answers it by its failure mode. Dropping a counter still in use would be a silent
//! fail-open, whatever failure mode the operator chose.
//!
//! Finding a victim must not cost a scan of the shard per new key, or a flood would
//! buy one with every request. A scan lists the counters that keep least long (the
//! least recently used, each measured against its own window) and bounds how soon
//! any other may go. New keys then take listed victims as they fall due; while
//! nothing is due, a refusal costs one comparison. Every write of a counter lowers
//! the bound to its own `keep_until`, so a counter written since the scan is never
//! missed: the choice stays exact, only the work is amortised.

use std::collections::BinaryHeap;

use crate::algorithm::Micros;
use crate::store::Evictions;

use super::Slot;

/// Counters a scan lists per this many the shard holds: a scan reads the whole
/// shard, and is paid for by the evictions it lists.
const SCAN_SHARE: usize = 4;

/// Fewest and most counters a scan lists.
const LISTED: (usize, usize) = (8, 4096);

/// A table of at most this capacity is never shrunk: too little to give back.
const SHRINK_FROM: usize = 64;

#[derive(Debug)]
pub(super) struct Shard {
    pub(super) table: hashbrown::HashTable<Slot>,
    /// Most counters the shard holds.
    cap: usize,
    /// Counters that may go next, as (keep_until, bucket) at the last scan, the
    /// soonest last. An entry whose bucket no longer holds that `keep_until` (the
    /// counter was used since, or dropped) is skipped.
    victims: Vec<(Micros, usize)>,
    /// Most counters a scan lists. The list is allocated by the first scan (a
    /// shard that never fills never needs it), so a store is cheap to create.
    listed: usize,
    /// No counter keeps less long than this unless it is listed in `victims` with
    /// its current `keep_until`: the least `keep_until` the last scan left unlisted,
    /// lowered by every one written since. 0 before the first scan.
    free_at: Micros,
    /// Counted here, under the shard's lock, and summed when metrics are scraped.
    pub(super) evictions: Evictions,
}

impl Shard {
    pub(super) fn new(cap: usize) -> Self {
        Shard {
            table: hashbrown::HashTable::new(),
            cap,
            victims: Vec::new(),
            listed: (cap / SCAN_SHARE).clamp(LISTED.0, LISTED.1),
            free_at: 0,
            evictions: Evictions::default(),
        }
    }

    /// Notes a counter's new `keep_until`; every write of one calls this.
    #[inline]
    pub(super) fn kept(&mut self, keep_until: Micros) {
        self.free_at = self.free_at.min(keep_until);
    }

    /// Adds a counter the table does not hold, once room has been made for it.
    pub(super) fn insert(&mut self, hash: u64, slot: Slot, hasher: impl Fn(&Slot) -> u64) {
        if self.table.len() == self.table.capacity() {
            // This insert may move every counter to another bucket: the list would
            // name the wrong ones, so it goes, and the bound with it.
            self.victims.clear();
            self.free_at = 0;
        }
        self.kept(slot.entry.keep_until);
        self.table.insert_unique(hash, slot, hasher);
    }

    /// Makes room for one more counter besides `pending` ones already given room, by
    /// dropping a counter that may go (never one in a bucket `busy` names). `Err`
    /// with the soonest time a counter may go when none may now: the new key is
    /// refused (and counted so).
    pub(super) fn make_room(
        &mut self,
        now: Micros,
        pending: usize,
        busy: impl Fn(usize) -> bool,
    ) -> Result<(), Micros> {
        let mut scanned = false;
        loop {
            if self.table.len() + pending < self.cap {
                return Ok(());
            }
            if self.drop_listed(now, &busy) {
                continue;
            }
            let soonest = self
                .victims
                .last()
                .map_or(self.free_at, |&(keep, _)| keep.min(self.free_at));
            if soonest > now || scanned {
                self.evictions.refused += 1;
                return Err(soonest.max(now));
            }
            self.scan(now, &busy);
            scanned = true;
        }
    }

    /// Drops the listed counter that is due soonest, if one is due; whether it did.
    fn drop_listed(&mut self, now: Micros, busy: &impl Fn(usize) -> bool) -> bool {
        while let Some(&(keep, bucket)) = self.victims.last() {
            if keep > now {
                return false;
            }
            self.victims.pop();
            let Ok(found) = self.table.get_bucket_entry(bucket) else {
                continue; // dropped since
            };
            let entry = &found.get().entry;
            if entry.keep_until != keep {
                continue; // written since, which lowered the bound
            }
            if busy(bucket) {
                // Unlisted now, so the bound must cover it.
                self.free_at = self.free_at.min(keep);
                continue;
            }
            let expired = entry.expires_at <= now;
            found.remove();
            if expired {
                self.evictions.expired += 1;
            } else {
                self.evictions.idle += 1;
            }
            return true;
        }
        false
    }

    /// Drops every expired counter (but `busy` ones) and lists those that keep least
    /// long, with the bound on the rest.
    fn scan(&mut self, now: Micros, busy: &impl Fn(usize) -> bool) {
        let most = self.listed;
        let mut list = std::mem::take(&mut self.victims);
        list.clear();
        list.reserve_exact(most);
        // A max-heap of the `most` least: its top is the first to give way.
        let mut heap = BinaryHeap::from(list);
        let mut rest = Micros::MAX;
        for bucket in 0..self.table.num_buckets() {
            let Ok(found) = self.table.get_bucket_entry(bucket) else {
                continue;
            };
            let entry = &found.get().entry;
            if entry.expires_at <= now && !busy(bucket) {
                found.remove();
                self.evictions.expired += 1;
                continue;
            }
            let item = (entry.keep_until, bucket);
            if heap.len() < most {
                heap.push(item);
                continue;
            }
            if let Some(mut top) = heap.peek_mut() {
                if item < *top {
                    rest = rest.min(top.0);
                    *top = item;
                } else {
                    rest = rest.min(item.0);
                }
            }
        }
        let mut list = heap.into_sorted_vec();
        list.reverse();
        self.victims = list;
        self.free_at = rest;
    }

    /// Drops every expired counter; how many. A table left holding under a quarter
    /// of its capacity (the keys of a flood, or of an outage, gone) is shrunk to
    /// twice what it holds, so the memory goes back.
    pub(super) fn sweep(&mut self, now: Micros, hasher: impl Fn(&Slot) -> u64) -> usize {
        let before = self.table.len();
        self.table.retain(|s| s.entry.expires_at > now);
        let held = self.table.len();
        if self.table.capacity() > SHRINK_FROM && held < self.table.capacity() / 4 {
            // Shrinking moves counters to other buckets: the list would name the
            // wrong ones, so it goes, and the bound with it (as when one grows).
            self.victims.clear();
            self.free_at = 0;
            self.table.shrink_to(held * 2, hasher);
        }
        before - held
    }

    /// Drops the counter of `key` (its hash `hash`), if the shard holds it.
    pub(super) fn remove(&mut self, hash: u64, key: &str) -> bool {
        match self.table.find_entry(hash, |s| s.holds(key)) {
            Ok(found) => {
                found.remove();
                true
            }
            Err(_) => false,
        }
    }
}

/// What a full shard keeps and drops, through the store's decisions, on an injected
/// clock. Keys are chosen to share one shard, so a shard's cap is what a test fills.
#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use proptest::prelude::*;

    use crate::algorithm::{Algorithm, Limit, Micros, Verdict, SECOND};
    use crate::clock::{Clock, ManualClock};
    use crate::store::memory::{MemoryStore, SHARDS};
    use crate::store::{Evictions, Failed, Fallback, Hit, Spend, Store, StoreError};

    const HOUR: Micros = 3600 * SECOND;

    /// A multiple of every window used here, so windows start at T0.
    const T0: Micros = 36_000 * SECOND;

    fn limit(algorithm: Algorithm, requests: u64, window: Micros, burst: u64) -> Limit {
        Limit {
            algorithm,
            requests,
            window,
            burst,
            phase: 0,
        }
    }

    fn fixed(requests: u64, window: Micros) -> Limit {
        limit(Algorithm::FixedWindow, requests, window, requests)
    }

    fn hit(key: &str, limit: Limit, hits: u64) -> Hit {
        Hit {
            fallback: Fallback::Admit,
            ..crate::store::testkit::hit_of(key, limit, hits, Spend::IfAdmitted)
        }
    }

    /// A store whose shards hold `per_shard` counters each.
    fn store(per_shard: usize) -> (MemoryStore, ManualClock) {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::new(Arc::new(clock.clone()), per_shard * SHARDS);
        (store, clock)
    }

    fn ask(store: &MemoryStore, key: &str, limit: Limit, hits: u64) -> Verdict {
        store.decide_now(&[hit(key, limit, hits)]).verdicts[0]
    }

    /// The hits of `hits`, admitted by the others, that `store` lifted as not kept.
    fn lifted(store: &MemoryStore, hits: &[Hit]) -> Vec<usize> {
        let decided = store.decide_now(hits);
        assert!(decided.admitted);
        let failed = decided.failed.expect("some hit not kept");
        assert_eq!(failed.error, StoreError::Full);
        for &i in &failed.hits {
            assert_eq!(decided.verdicts[i], Failed::placeholder());
        }
        failed.hits
    }

    /// `n` keys, `prefix-0` first, that `store` places in one shard.
    fn shard_mates(store: &MemoryStore, prefix: &str, n: usize) -> Vec<String> {
        let shard = |k: &str| MemoryStore::shard_of(store.hash(k.as_bytes()));
        let first = shard(&format!("{prefix}-0"));
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|k| shard(k) == first)
            .take(n)
            .collect()
    }

    fn evictions(expired: u64, idle: u64, refused: u64) -> Evictions {
        Evictions {
            expired,
            idle,
            refused,
        }
    }

    #[test]
    fn a_flood_resets_no_denying_or_counting_counter() {
        // 10 counters a shard (640 in all), limits of 5 an hour.
        let (store, _clock) = store(10);
        let five = fixed(5, HOUR);
        for _ in 0..5 {
            assert!(ask(&store, "attacker", five, 1).admitted);
        }
        assert!(!ask(&store, "attacker", five, 1).admitted);
        for i in 0..100 {
            for _ in 0..2 {
                assert!(ask(&store, &format!("steady-{i}"), five, 1).admitted);
            }
        }
        for i in 0..6400 {
            ask(&store, &format!("flood-{i}"), five, 1);
        }
        assert!(!ask(&store, "attacker", five, 1).admitted, "attacker reset");
        for i in 0..100 {
            let v = ask(&store, &format!("steady-{i}"), five, 1);
            assert_eq!(v.remaining, 2, "steady-{i}");
        }
        assert_eq!(store.active_keys(), 640);
        // Every shard full: 640 kept, of which 101 before the flood.
        assert_eq!(store.evictions(), evictions(0, 0, 6400 - (640 - 101)));
    }

    #[test]
    fn a_full_shard_drops_expired_then_idle_and_refuses_when_all_are_in_use() {
        let (store, clock) = store(3);
        let keys = shard_mates(&store, "k", 6);
        let [expiring, idling, using, new1, new2, new3] = &keys[..] else {
            unreachable!()
        };
        let second = fixed(5, SECOND);
        // 3 of 5 tokens taken, one back every 10 s: in use for 10 s, full in 30 s.
        let slow = limit(Algorithm::TokenBucket, 1, 10 * SECOND, 5);
        let hourly = fixed(5, HOUR);
        ask(&store, expiring, second, 1);
        ask(&store, idling, slow, 3);
        clock.advance(15 * SECOND);
        ask(&store, using, hourly, 1);

        assert!(ask(&store, new1, hourly, 1).admitted);
        assert_eq!(store.evictions(), evictions(1, 0, 0), "the expired first");
        assert!(ask(&store, new2, hourly, 1).admitted);
        assert_eq!(store.evictions(), evictions(1, 1, 0), "then the idle one");
        assert_eq!(ask(&store, idling, slow, 0).remaining, 5, "started afresh");
        // Left: three counters in use. The new key is lifted (open), not kept.
        for _ in 0..2 {
            assert_eq!(lifted(&store, &[hit(new3, hourly, 1)]), [0]);
        }
        assert_eq!(store.evictions(), evictions(1, 1, 2));
        assert_eq!(store.active_keys(), 3);
        assert_eq!(ask(&store, using, hourly, 0).remaining, 4);
        assert_eq!(ask(&store, new1, hourly, 0).remaining, 4);
    }

    #[test]
    fn idle_counters_go_least_recently_used_first() {
        let (store, clock) = store(2);
        let keys = shard_mates(&store, "lru", 4);
        // Full again 30 s after 3 hits; idle 10 s after the last.
        let slow = limit(Algorithm::TokenBucket, 1, 10 * SECOND, 5);
        let reference = MemoryStore::new(Arc::new(clock.clone()), 1000);
        ask(&store, &keys[0], slow, 3);
        clock.advance(SECOND);
        ask(&store, &keys[1], slow, 3);
        ask(&reference, &keys[1], slow, 3);
        clock.advance(15 * SECOND);
        ask(&store, &keys[2], slow, 1);
        assert_eq!(store.evictions(), evictions(0, 1, 0));
        assert_eq!(
            ask(&store, &keys[0], slow, 0).remaining,
            5,
            "the older went"
        );
        assert_eq!(
            ask(&store, &keys[1], slow, 0),
            ask(&reference, &keys[1], slow, 0),
            "the newer kept its count"
        );
    }

    #[test]
    fn a_counter_denying_past_its_window_is_kept_until_it_admits() {
        let (store, clock) = store(2);
        let keys = shard_mates(&store, "deny", 4);
        // 2 per 10 s, both taken at the window's start: the next window starts with
        // 2 behind it at full weight, and a hit fits only once that weight is 1/2,
        // at 15 s, after the counter's own window since its last hit.
        let limit = limit(Algorithm::SlidingWindowCounter, 2, 10 * SECOND, 2);
        ask(&store, &keys[0], limit, 2);
        clock.advance(12 * SECOND);
        ask(&store, &keys[1], limit, 1);
        ask(&store, &keys[2], limit, 1);
        assert_eq!(store.evictions(), evictions(0, 0, 1));
        clock.set(T0 + 15 * SECOND - 1);
        assert!(!ask(&store, &keys[0], limit, 1).admitted, "still denying");
        clock.set(T0 + 15 * SECOND);
        ask(&store, &keys[3], limit, 1);
        assert_eq!(store.evictions(), evictions(0, 1, 1), "no longer denying");
        assert_eq!(ask(&store, &keys[0], limit, 0).remaining, 2);
    }

    #[test]
    fn a_denial_under_a_lowered_limit_keeps_the_counter() {
        let (store, clock) = store(1);
        let keys = shard_mates(&store, "lowered", 2);
        // 50 of 100 tokens taken, one back a second: in use for a second only.
        let before = limit(Algorithm::TokenBucket, 1, SECOND, 100);
        ask(&store, &keys[0], before, 50);
        clock.advance(SECOND + SECOND / 2);
        // The policy now allows a burst of 10: 48.5 tokens behind, denied for 39.5 s.
        let after = limit(Algorithm::TokenBucket, 1, SECOND, 10);
        let v = ask(&store, &keys[0], after, 1);
        assert!(!v.admitted);
        assert_eq!(v.retry_after, 39 * SECOND + SECOND / 2);
        clock.advance(SECOND);
        ask(&store, &keys[1], after, 1);
        assert_eq!(store.evictions(), evictions(0, 0, 1));
        assert!(!ask(&store, &keys[0], after, 1).admitted);
    }

    #[test]
    fn a_refused_key_is_answered_by_its_fallback() {
        let (store, clock) = store(1);
        let keys = shard_mates(&store, "mode", 2);
        let hourly = fixed(5, HOUR);
        ask(&store, &keys[0], hourly, 1);
        clock.advance(HOUR / 4);
        let mut closed = hit(&keys[1], hourly, 1);
        closed.fallback = Fallback::Deny;
        let v = store.decide_now(std::slice::from_ref(&closed));
        assert!(!v.admitted);
        // Not kept: named, for the limiter to answer as a failed shard.
        let failed = v.failed.as_ref().expect("not kept");
        assert_eq!(
            (&failed.error, &failed.hits[..]),
            (&StoreError::Full, &[0][..])
        );
        // Room comes when the counter held ends its window.
        assert_eq!(v.verdicts[0].retry_after, 3 * HOUR / 4);
        assert_eq!(v.verdicts[0].remaining, 0);
        // Open: lifted as a counter on a failed shard is, with no verdict to show.
        assert_eq!(lifted(&store, &[hit(&keys[1], hourly, 1)]), [0]);
        assert_eq!(store.evictions(), evictions(0, 0, 2));
        clock.advance(3 * HOUR / 4);
        assert!(store.decide_now(std::slice::from_ref(&closed)).admitted);
        assert_eq!(store.evictions(), evictions(1, 0, 2));
    }

    #[test]
    fn a_refusal_in_closed_mode_spends_nothing_of_its_request() {
        let (store, _clock) = store(1);
        let keys = shard_mates(&store, "batch", 2);
        let hourly = fixed(5, HOUR);
        ask(&store, &keys[0], hourly, 1);
        // Another shard's counter in the same request.
        let shard = |k: &str| MemoryStore::shard_of(store.hash(k.as_bytes()));
        let other = (0..)
            .map(|i| format!("other-{i}"))
            .find(|k| shard(k) != shard(&keys[0]))
            .unwrap();
        ask(&store, &other, hourly, 1);
        let mut refused = hit(&keys[1], hourly, 1);
        refused.fallback = Fallback::Deny;
        let v = store.decide_now(&[hit(&other, hourly, 1), refused]);
        assert!(!v.admitted);
        assert!(v.verdicts[0].admitted && !v.verdicts[1].admitted);
        assert_eq!(v.failed.map(|f| f.hits), Some(vec![1]));
        assert_eq!(ask(&store, &other, hourly, 0).remaining, 4, "other spent");
    }

    #[test]
    fn a_key_lifted_in_open_mode_leaves_its_request_to_the_others() {
        let (store, _clock) = store(1);
        let keys = shard_mates(&store, "lift", 2);
        let hourly = fixed(5, HOUR);
        ask(&store, &keys[0], hourly, 1);
        let shard = |k: &str| MemoryStore::shard_of(store.hash(k.as_bytes()));
        let other = (0..)
            .map(|i| format!("other-{i}"))
            .find(|k| shard(k) != shard(&keys[0]))
            .unwrap();
        // The other limit admits: the request is, and counts there.
        let request = |other_hits| {
            [
                hit(&other, fixed(2, HOUR), other_hits),
                hit(&keys[1], hourly, 1),
            ]
        };
        assert_eq!(lifted(&store, &request(1)), [1]);
        assert_eq!(ask(&store, &other, fixed(2, HOUR), 0).remaining, 1);
        // It denies: the request is denied, the lifted key no reason to admit it.
        let denied = store.decide_now(&request(2));
        assert!(!denied.admitted);
        assert_eq!(denied.failed.map(|f| f.hits), Some(vec![1]));
        assert_eq!(ask(&store, &other, fixed(2, HOUR), 0).remaining, 1);
        assert_eq!(store.evictions(), evictions(0, 0, 2));
    }

    #[test]
    fn a_batch_never_drops_its_own_counters_to_make_room() {
        let (store, clock) = store(1);
        let keys = shard_mates(&store, "own", 2);
        let slow = limit(Algorithm::TokenBucket, 1, 10 * SECOND, 5);
        ask(&store, &keys[0], slow, 3);
        clock.advance(15 * SECOND); // idle, 3.5 tokens
        let v = store.decide_now(&[hit(&keys[0], slow, 1), hit(&keys[1], slow, 1)]);
        assert!(v.admitted);
        assert_eq!(v.verdicts[0].remaining, 2, "counted on its own state");
        assert_eq!(store.evictions(), evictions(0, 0, 1));
        assert_eq!(ask(&store, &keys[0], slow, 0).remaining, 2);
    }

    #[test]
    fn new_keys_of_one_batch_share_the_room_made() {
        let (store, clock) = store(2);
        let keys = shard_mates(&store, "share", 4);
        let second = fixed(5, SECOND);
        let hourly = fixed(5, HOUR);
        ask(&store, &keys[0], second, 1);
        ask(&store, &keys[1], hourly, 1);
        clock.advance(SECOND);
        // One counter may go, for two new keys: one is kept, one refused.
        let both = [hit(&keys[2], hourly, 1), hit(&keys[3], hourly, 1)];
        assert_eq!(lifted(&store, &both), [1]);
        assert_eq!(store.evictions(), evictions(1, 0, 1));
        assert_eq!(store.active_keys(), 2);
        assert_eq!(ask(&store, &keys[2], hourly, 0).remaining, 4);
        assert_eq!(ask(&store, &keys[3], hourly, 0).remaining, 5, "not kept");
    }

    #[test]
    fn a_growing_table_loses_no_victim_it_listed() {
        // Room is made by listed victims while the table grows and rehashes under
        // them: every key comes and goes through one shard of 64 counters. Each
        // empties a bucket of one token a second, so it goes (expired) exactly a
        // second after its hit, when the 64th key after it comes.
        let (store, clock) = store(64);
        let keys = shard_mates(&store, "grow", 4096);
        let bucket = limit(Algorithm::TokenBucket, 1, SECOND, 1);
        for (i, key) in keys.iter().enumerate() {
            assert!(ask(&store, key, bucket, 1).admitted, "{i}");
            clock.advance(SECOND / 64);
        }
        assert_eq!(store.evictions(), evictions(4096 - 64, 0, 0));
    }

    /// One step of the property below: a hit on one of a few keys (`key`), after the
    /// clock moved `advance` microseconds.
    #[derive(Debug, Clone)]
    struct Step {
        key: usize,
        advance: Micros,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            (0..48usize, 0..1_500_000u64).prop_map(|(key, advance)| Step { key, advance }),
            1..400,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Fixed windows, 48 keys over shards of 1 counter. A key counts exactly as it
        /// would in a store with room, unless it was refused in its current window;
        /// and a key is refused only when every counter of its shard is in its
        /// window.
        #[test]
        fn counters_in_their_window_are_never_reset(steps in steps()) {
            let (store, clock) = store(1);
            let reference = MemoryStore::new(Arc::new(clock.clone()), 1000);
            let windows = [SECOND, 3 * SECOND, 10 * SECOND];
            let mut refused_in: HashMap<usize, Micros> = HashMap::new();
            for step in steps {
                clock.advance(step.advance);
                let now = clock.now();
                let window = windows[step.key % windows.len()];
                let limit = fixed(3, window);
                let key = format!("p-{}", step.key);
                let mut h = hit(&key, limit, 1);
                h.fallback = Fallback::Deny;
                let before = store.evictions().refused;
                let got = store.decide_now(std::slice::from_ref(&h)).verdicts[0];
                let want = reference.decide_now(std::slice::from_ref(&h)).verdicts[0];
                let start = now - now % window;
                if store.evictions().refused > before {
                    let shard = MemoryStore::shard_of(store.hash(key.as_bytes()));
                    let held = super::super::lock(&store.shards[shard]);
                    prop_assert!(held.table.iter().all(|s| s.entry.keep_until > now));
                    refused_in.insert(step.key, start);
                } else if refused_in.get(&step.key) != Some(&start) {
                    prop_assert_eq!(got, want, "{} at {}", key, now - T0);
                }
            }
        }
    }
}
