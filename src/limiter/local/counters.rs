//! `failure_mode: local`'s counters: those this replica decides in its own memory
//! while their shard cannot be reached, and what each spent until the store has
//! taken it.
//!
//! - the local counters: a [`MemoryStore`] on the limiter's clock, its keys tagged
//!   with the episode (the first local decision of a counter since its last
//!   settlement), so a later outage never finds an old episode's state. It is made
//!   on the first local decision: a replica whose store never fails holds nothing.
//! - the table: per counter, what it spent locally in its episode until the store
//!   has taken it, and what it gave back beyond that (a refund of what the store
//!   had counted before). Each amount goes to the store under a token
//!   ([`Store::settle`]) kept until the store confirms it, so a retry after a lost
//!   answer is not counted twice. Per shard of the store, many amounts go in one
//!   call.
//!
//! A counter owes the store "give back `refund`, then charge `spent`": a charge
//! adds to `spent`, a refund takes from `spent` first and owes the rest as
//! `refund`. That pair leaves the store's counter where the hits one by one would
//! have, floor at empty included (a refund past what the counter holds, then a
//! charge, is not the charge less the refund), so it goes as one amount, in that
//! order. What is on its way is left alone: later hits owe after it.
//!
//! The table holds at most `--max-keys` counters, as the memory store does. A
//! counter that owes nothing (only denied, or settled) may go to make room: its
//! next decision starts it again from the store's word, as it started. When every
//! counter owes spending, a new key is not kept: it is lifted as `open` lifts a
//! counter on a failed shard ([`StoreError::Full`]), the request's other limits
//! still decide, and nothing of it reaches the store. Dropping a counter that owes
//! would lose its spending and hand its key a fresh share: a flood of new keys
//! would reset everyone's.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::algorithm::{Algorithm, Limit, Micros, NO_DEADLINE};
use crate::clock::Clock;
use crate::store::memory;
use crate::store::{
    Failed, Fallback, Hit, MemoryStore, Mode, Settlement, Spend, Store, StoreError, Verdicts,
};

use super::{lock, share, since, LocalCounter, Settled};

/// Shards of the table (touched only while deciding locally).
const SHARDS: usize = 16;

/// A counter not decided locally for this long, its spending settled, leaves the
/// table: the outage is over for it.
const IDLE: Micros = crate::algorithm::SECOND;

/// How often a full table is searched for counters that owe nothing: a flood of
/// new keys into a table of owing counters costs each one comparison.
const CLEAR_EVERY: Micros = 100_000;

/// Amounts per settlement call (the store groups them by shard).
const SETTLE_BATCH: usize = 512;

/// Most amounts one settlement sends: a tick after a long outage stays short, and
/// the next takes the rest.
const SETTLE_PER_TICK: usize = 16_384;

/// Counters listed by [`Counters::listed`].
const LISTED: usize = 100;

/// A shared counter: its key, its placement and its algorithm, which together
/// name it in the store (a policy that changes a rule's algorithm or `shard_by`
/// starts another counter there, and so here).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Id {
    key: String,
    placement: u64,
    algorithm: Algorithm,
}

/// An [`Id`] borrowed from a hit, to look one up without building it.
struct IdOf<'a>(&'a Hit);

impl Hash for Id {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.key.as_str(), self.placement, self.algorithm).hash(state);
    }
}

impl Hash for IdOf<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (
            self.0.key.as_str(),
            self.0.placement,
            self.0.limit.algorithm,
        )
            .hash(state);
    }
}

impl hashbrown::Equivalent<Id> for IdOf<'_> {
    fn equivalent(&self, id: &Id) -> bool {
        self.0.key == id.key
            && self.0.placement == id.placement
            && self.0.limit.algorithm == id.algorithm
    }
}

impl Id {
    fn of(hit: &Hit) -> Id {
        Id {
            key: hit.key.clone(),
            placement: hit.placement,
            algorithm: hit.limit.algorithm,
        }
    }
}

/// A counter decided locally since its last settlement.
#[derive(Debug, Clone)]
struct Pending {
    /// The shared counter's limit (the whole one) as its latest local decision
    /// had it, to settle with: the store charges what was spent under the rule in
    /// force, as it would have decided it (a reload during the outage may have
    /// changed the limit or its unit).
    limit: Limit,
    placement: u64,
    /// Names the local counter ([`local_key`]).
    episode: u64,
    /// Spent locally and not offered to the store yet.
    spent: u64,
    /// Given back locally beyond `spent`, not offered yet: owed to the store as a
    /// refund, before `spent`.
    refund: u64,
    /// The amount on its way to the store, until the store confirms.
    settling: Option<Offer>,
    /// The latest local decision (limiter clock).
    touched: Micros,
    /// Decisions between finding it and recording what they spent: until they
    /// have, it stays, whatever it owes and however long they take.
    deciding: u32,
}

/// An amount offered to the store: `refund` given back, then `charge` spent,
/// under the token numbered `seq`.
#[derive(Debug, Clone, Copy)]
struct Offer {
    refund: u64,
    charge: u64,
    seq: u64,
}

impl Pending {
    /// Whether the store has yet to take some of its spending or refunds.
    fn owes(&self) -> bool {
        self.spent > 0 || self.refund > 0 || self.settling.is_some()
    }

    /// Whether it may leave the table at `now`: it owes nothing, no decision is
    /// under way on it, and none has been for `idle`.
    fn may_go(&self, now: Micros, idle: Micros) -> bool {
        !self.owes() && self.deciding == 0 && idle_for(self, now) >= idle
    }

    /// Spent locally and not taken by the store yet, on its way or not.
    fn unsettled(&self) -> u64 {
        let offered = self.settling.map_or(0, |o| o.charge);
        self.spent.saturating_add(offered)
    }

    /// `hits` given back: off what it spent and has not offered, and the rest owed
    /// to the store as a refund.
    fn give_back(&mut self, hits: u64) {
        let netted = hits.min(self.spent);
        self.spent -= netted;
        self.refund = self.refund.saturating_add(hits - netted);
    }

    /// The amount to offer now: the one on its way, or all it owes under a new
    /// token numbered by `sequence`.
    fn offer(&mut self, sequence: &AtomicU64) -> Offer {
        *self.settling.get_or_insert_with(|| Offer {
            refund: std::mem::take(&mut self.refund),
            charge: std::mem::take(&mut self.spent),
            seq: sequence.fetch_add(1, Relaxed),
        })
    }

    /// `amount` of it on the shared counter `key`: a charge, spent whatever the
    /// verdict.
    fn charge(&self, key: String, amount: u64) -> Hit {
        Hit {
            key,
            placement: self.placement,
            limit: self.limit,
            hits: amount,
            mode: Mode::Enforce,
            spend: Spend::Always,
            fallback: Fallback::Local,
            max_delay: NO_DEADLINE,
        }
    }
}

/// One shard of the table.
#[derive(Debug, Default)]
struct Table {
    counters: hashbrown::HashMap<Id, Pending, ahash::RandomState>,
}

impl Table {
    /// Gives memory back once the shard holds under a quarter of its capacity
    /// (the keys of an outage settled).
    fn shrink(&mut self) {
        let (len, capacity) = (self.counters.len(), self.counters.capacity());
        if capacity > 64 && len < capacity / 4 {
            self.counters.shrink_to(len * 2);
        }
    }
}

/// One settlement's progress.
#[derive(Debug, Default)]
struct Round {
    /// The limiter's clock when it began.
    now: Micros,
    /// The shards that failed: their other amounts wait for the next round.
    down: Vec<usize>,
    /// Some amount is left for the next round.
    left: bool,
    out: Settled,
}

impl Round {
    /// An amount not taken, to offer again next round.
    fn failed(&mut self) {
        self.out.failed += 1;
        self.left = true;
    }
}

/// How long `p` has gone undecided at `now`. One decided after `now` was read (a
/// request racing the caller) has not.
fn idle_for(p: &Pending, now: Micros) -> Micros {
    now.saturating_sub(p.touched)
}

/// The local counter of `key` in `episode`.
fn local_key(episode: u64, key: &str) -> String {
    format!("{episode:x}#{key}")
}

/// The token of the amount numbered `seq`: this replica's, so no other's collides.
fn token(replica: &str, seq: u64) -> String {
    format!("{replica}:{seq:x}")
}

/// `hit` on the local counter `key`, of `limit`.
fn local_hit(hit: &Hit, key: String, limit: Limit) -> Hit {
    Hit {
        key,
        placement: hit.placement,
        limit,
        hits: hit.hits,
        mode: hit.mode,
        spend: hit.spend,
        fallback: hit.fallback,
        max_delay: hit.max_delay,
    }
}

/// A decision begun ([`Counters::begin`]): the hits on the local counters, and
/// those of `hits` whose counters the table cannot keep, ascending.
struct Begun {
    local: Vec<Hit>,
    lifted: Vec<usize>,
}

/// The counters decided locally, at most `--max-keys` of them.
pub(super) struct Counters {
    clock: Arc<dyn Clock>,
    /// The local counters' store. Each of its shards has room for the whole table,
    /// so that however the table's keys spread over them, it keeps every one: the
    /// table bounds what it holds. Made with the table, not by the first local
    /// decision: that comes in an outage, which is no time to wait.
    memory: MemoryStore,
    tables: Box<[Mutex<Table>]>,
    hasher: ahash::RandomState,
    /// Counters in the tables, all shards.
    held: AtomicUsize,
    max_keys: usize,
    /// Numbers episodes and settlement tokens.
    sequence: AtomicU64,
    /// Some counter has been decided locally and is still in the table (read on
    /// every tick).
    unsettled: AtomicBool,
    /// When (limiter clock) the full table was last searched for counters that owe
    /// nothing.
    cleared: AtomicU64,
    /// New keys not kept, the table full of counters that owe, since the start.
    refused: AtomicU64,
    /// Whether new keys are being refused: logged when it starts and ends.
    refusing: AtomicBool,
}

impl Counters {
    /// Counters on `clock`, at most `max_keys` (at least one).
    pub(super) fn new(clock: Arc<dyn Clock>, max_keys: usize) -> Counters {
        let room = max_keys.max(1).saturating_mul(memory::SHARDS);
        Counters {
            memory: MemoryStore::new(clock.clone(), room),
            clock,
            tables: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: ahash::RandomState::new(),
            held: AtomicUsize::new(0),
            max_keys: max_keys.max(1),
            sequence: AtomicU64::new(0),
            unsettled: AtomicBool::new(false),
            cleared: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            refusing: AtomicBool::new(false),
        }
    }

    fn table(&self, key: &str) -> &Mutex<Table> {
        let h = self.hasher.hash_one(key);
        &self.tables[(h >> 32) as usize % SHARDS]
    }

    /// Decides `hits` on this replica's share of their limits (of `replicas`), as
    /// the store would have on the whole limits. A counter new to the table starts
    /// with `seed` of its share (the limit given) spent. A key the table has no
    /// room for is lifted ([`Verdicts::failed`]).
    pub(super) fn decide(
        &self,
        hits: &[Hit],
        replicas: u32,
        seed: impl Fn(&Hit, &Limit) -> u64,
    ) -> Verdicts {
        let now = self.clock.now();
        let begun = self.begin(hits, replicas, now, seed);
        self.finish(hits, begun, now)
    }

    /// A decision's first half: finds or makes each hit's counter in the table.
    fn begin(
        &self,
        hits: &[Hit],
        replicas: u32,
        now: Micros,
        seed: impl Fn(&Hit, &Limit) -> u64,
    ) -> Begun {
        let memory = &self.memory;
        let mut local: Vec<Hit> = Vec::with_capacity(hits.len());
        // The hits whose counters the table cannot keep, ascending.
        let mut lifted: Vec<usize> = Vec::new();
        for (i, hit) in hits.iter().enumerate() {
            let limit = share(&hit.limit, replicas);
            let mut table = lock(self.table(&hit.key));
            let known = table.counters.get_mut(&IdOf(hit)).map(|p| {
                p.touched = now;
                p.limit = hit.limit;
                p.deciding = p.deciding.saturating_add(1);
                p.episode
            });
            let episode = match known {
                Some(episode) => episode,
                None if self.room(&mut table, now) => {
                    let episode = self.sequence.fetch_add(1, Relaxed);
                    let seed = seed(hit, &limit);
                    if seed > 0 {
                        let charge = Hit {
                            hits: seed,
                            mode: Mode::Enforce,
                            spend: Spend::Always,
                            ..local_hit(hit, local_key(episode, &hit.key), limit)
                        };
                        memory.decide_now(std::slice::from_ref(&charge));
                    }
                    let pending = Pending {
                        limit: hit.limit,
                        placement: hit.placement,
                        episode,
                        spent: 0,
                        refund: 0,
                        settling: None,
                        touched: now,
                        deciding: 1,
                    };
                    table.counters.insert(Id::of(hit), pending);
                    episode
                }
                None => {
                    lifted.push(i);
                    continue;
                }
            };
            drop(table);
            local.push(local_hit(hit, local_key(episode, &hit.key), limit));
        }
        Begun { local, lifted }
    }

    /// A decision's second half: decides the kept hits on the local counters and
    /// records what each spent in the table.
    fn finish(&self, hits: &[Hit], begun: Begun, now: Micros) -> Verdicts {
        let Begun { mut local, lifted } = begun;
        let memory = &self.memory;
        if lifted.iter().any(|&i| hits[i].mode == Mode::Quota) {
            // A lifted quota limit admits: the others can no longer deny by quota.
            for h in local.iter_mut().filter(|h| h.mode == Mode::Quota) {
                h.mode = Mode::Shadow;
            }
        }
        let decided = if local.is_empty() {
            Verdicts {
                admitted: true,
                verdicts: Vec::new(),
                now: Some(now),
                failed: None,
            }
        } else {
            memory.decide_now(&local)
        };
        let decided = if lifted.is_empty() {
            decided
        } else {
            with_lifted(decided, &lifted, hits.len())
        };
        self.unsettled.store(true, Relaxed);
        for (i, hit) in hits.iter().enumerate() {
            if lifted.binary_search(&i).is_ok() {
                continue;
            }
            let not_kept = decided.failed.as_ref().is_some_and(|f| f.contains(i));
            let spent = !not_kept && hit.spent(decided.admitted) && hit.hits > 0;
            let mut table = lock(self.table(&hit.key));
            let Some(p) = table.counters.get_mut(&IdOf(hit)) else {
                continue;
            };
            p.deciding = p.deciding.saturating_sub(1);
            if spent {
                match hit.spend {
                    Spend::Refund => p.give_back(hit.hits),
                    _ => p.spent = p.spent.saturating_add(hit.hits),
                }
            }
        }
        decided
    }

    /// Takes room for a new counter in `table` (its lock held): below the bound,
    /// or once the counters that owe nothing have gone (searched for at most every
    /// [`CLEAR_EVERY`]: this shard, and every other not locked at the moment, which
    /// cannot deadlock). One decided within that time stays, and one a request is
    /// deciding: the request must find it to record what it spent. A refusal is counted, and logged when the refusals start.
    fn room(&self, table: &mut Table, now: Micros) -> bool {
        if self.take() {
            return true;
        }
        let cleared = self.cleared.load(Relaxed);
        if since(now, cleared) >= CLEAR_EVERY
            && self
                .cleared
                .compare_exchange(cleared, now, Relaxed, Relaxed)
                .is_ok()
        {
            let owes_nothing = |p: &Pending| p.may_go(now, CLEAR_EVERY);
            let mut gone = self.drop_where(table, owes_nothing);
            for other in self.tables.iter() {
                if let Ok(mut other) = other.try_lock() {
                    gone += self.drop_where(&mut other, owes_nothing);
                }
            }
            if gone > 0 && self.take() {
                return true;
            }
        }
        self.refused.fetch_add(1, Relaxed);
        if !self.refusing.load(Relaxed) && !self.refusing.swap(true, Relaxed) {
            tracing::warn!(
                max_keys = self.max_keys,
                "failure_mode local: --max-keys counters decided locally, each owing spending to the store; \
                 new keys are not kept, and are answered as failure_mode open answers"
            );
        }
        false
    }

    /// One more counter, if the bound allows.
    fn take(&self) -> bool {
        if self.held.fetch_add(1, Relaxed) < self.max_keys {
            return true;
        }
        self.held.fetch_sub(1, Relaxed);
        false
    }

    /// Drops the counters of `table` that `go` picks, with their local state; how
    /// many.
    fn drop_where(&self, table: &mut Table, go: impl Fn(&Pending) -> bool) -> usize {
        let before = table.counters.len();
        table.counters.retain(|id, p| {
            let gone = go(p);
            if gone {
                self.memory.forget(&local_key(p.episode, &id.key));
            }
            !gone
        });
        let gone = before - table.counters.len();
        self.held.fetch_sub(gone, Relaxed);
        gone
    }

    /// Drops expired local counters, and logs when a full table has room again;
    /// every tick.
    pub(super) fn tick(&self) {
        self.memory.sweep();
        if self.refusing.load(Relaxed)
            && self.held.load(Relaxed) < self.max_keys
            && self.refusing.swap(false, Relaxed)
        {
            tracing::info!(
                refused = self.refused.load(Relaxed),
                "failure_mode local: below --max-keys counters decided locally again; new keys are kept"
            );
        }
    }

    /// Whether some counter decided locally has not left the table yet (its
    /// spending is not settled, or it was decided within the last `IDLE`).
    pub(super) fn has_unsettled(&self) -> bool {
        self.unsettled.load(Relaxed)
    }

    /// Adds each counter's local spending to `store`, once per amount: an amount
    /// keeps its token (`replica`'s) until the store confirms it. A counter fully
    /// settled leaves the table once idle, so its next local decision starts a new
    /// episode. A shard that fails is not asked again until the next settlement.
    pub(super) async fn settle<S: Store>(&self, store: &S, replica: &str) -> Settled {
        let mut round = Round {
            now: self.clock.now(),
            ..Round::default()
        };
        if !self.unsettled.load(Relaxed) {
            return round.out;
        }
        let now = round.now;
        let mut queue: Vec<(usize, Settlement)> = Vec::new();
        let mut sent = 0;
        for table in self.tables.iter() {
            // Give every counter that owes a token for what it owes so far.
            // One that spent nothing leaves once no local decision has touched it
            // for a while, so a later outage starts it afresh from the store's word.
            {
                let mut t = lock(table);
                self.drop_where(&mut t, |p| p.may_go(now, IDLE));
                for (id, p) in t.counters.iter_mut().filter(|(_, p)| p.owes()) {
                    let at = store.shard_of(&p.charge(String::new(), 0));
                    if round.down.contains(&at) {
                        round.failed();
                        continue;
                    }
                    if sent == SETTLE_PER_TICK {
                        round.left = true;
                        continue;
                    }
                    let offer = p.offer(&self.sequence);
                    let settlement = Settlement {
                        hit: p.charge(id.key.clone(), offer.charge),
                        refund: offer.refund,
                        token: token(replica, offer.seq),
                    };
                    queue.push((at, settlement));
                    sent += 1;
                }
            }
            while queue.len() >= SETTLE_BATCH {
                let chunk: Vec<_> = queue.drain(..SETTLE_BATCH).collect();
                self.send(store, chunk, &mut round).await;
            }
        }
        while !queue.is_empty() {
            let chunk: Vec<_> = queue.drain(..queue.len().min(SETTLE_BATCH)).collect();
            self.send(store, chunk, &mut round).await;
        }
        for table in self.tables.iter() {
            lock(table).shrink();
        }
        if !round.left {
            // A local decision racing this one sets it again.
            self.unsettled.store(self.held.load(Relaxed) > 0, Relaxed);
        }
        round.out
    }

    /// Offers `chunk` (each amount with its counter's shard) to `store`, but for
    /// the shards that failed this round, and takes the answers.
    async fn send<S: Store>(&self, store: &S, chunk: Vec<(usize, Settlement)>, round: &mut Round) {
        let (shards, chunk): (Vec<usize>, Vec<Settlement>) = chunk
            .into_iter()
            .filter(|(at, _)| {
                let down = round.down.contains(at);
                if down {
                    round.failed();
                }
                !down
            })
            .unzip();
        if chunk.is_empty() {
            return;
        }
        let results = store.settle(&chunk).await;
        for ((s, at), result) in chunk.iter().zip(shards).zip(results) {
            let amount = s.hit.hits;
            match result {
                Ok(added) => {
                    if added {
                        round.out.added = round.out.added.saturating_add(amount);
                        round.out.refunded = round.out.refunded.saturating_add(s.refund);
                    } else {
                        round.out.already = round.out.already.saturating_add(amount);
                    }
                    let mut t = lock(self.table(&s.hit.key));
                    let Some(p) = t.counters.get_mut(&IdOf(&s.hit)) else {
                        continue;
                    };
                    p.settling = None;
                    if p.may_go(round.now, IDLE) {
                        let episode = p.episode;
                        t.counters.remove(&IdOf(&s.hit));
                        self.held.fetch_sub(1, Relaxed);
                        self.memory.forget(&local_key(episode, &s.hit.key));
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "local spending not settled yet");
                    round.failed();
                    if !round.down.contains(&at) {
                        round.down.push(at);
                    }
                }
            }
        }
    }

    /// The unsettled spending of `key`, while it is decided locally (of all its
    /// counters: a reload may have changed its algorithm during the outage).
    pub(super) fn counter(&self, key: &str) -> Option<u64> {
        lock(self.table(key))
            .counters
            .iter()
            .filter(|(id, _)| id.key == key)
            .map(|(_, p)| p.unsettled())
            .reduce(u64::saturating_add)
    }

    /// Counters in the table, all of them.
    pub(super) fn held(&self) -> usize {
        self.held.load(Relaxed)
    }

    /// New keys not kept since the start, the table full.
    pub(super) fn refused(&self) -> u64 {
        self.refused.load(Relaxed)
    }

    /// The most counters the table holds (`--max-keys`).
    pub(super) fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Up to [`LISTED`] counters of the table, by key.
    pub(super) fn listed(&self) -> Vec<LocalCounter> {
        let mut listed = Vec::new();
        for table in self.tables.iter() {
            let t = lock(table);
            let room = LISTED - listed.len();
            listed.extend(t.counters.iter().take(room).map(|(id, p)| LocalCounter {
                key: id.key.clone(),
                unsettled: p.unsettled(),
            }));
            if listed.len() == LISTED {
                break;
            }
        }
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        listed
    }

    /// The spending of every counter the store has not taken.
    pub(super) fn unsettled_hits(&self) -> u64 {
        self.tables
            .iter()
            .map(|t| {
                lock(t)
                    .counters
                    .values()
                    .map(Pending::unsettled)
                    .sum::<u64>()
            })
            .sum()
    }
}

/// The verdicts of a batch of `n` hits from those of its kept hits (`decided`, in
/// order) and a placeholder for each of `lifted` (ascending): those, and any kept
/// hit the local counters' store could not keep either, are lifted as not kept.
fn with_lifted(decided: Verdicts, lifted: &[usize], n: usize) -> Verdicts {
    let kept_failed = decided.failed.map(|f| f.hits).unwrap_or_default();
    let mut kept = decided.verdicts.into_iter().enumerate();
    let mut verdicts = Vec::with_capacity(n);
    let mut failed = Vec::with_capacity(lifted.len() + kept_failed.len());
    for i in 0..n {
        if lifted.binary_search(&i).is_ok() {
            verdicts.push(Failed::placeholder());
            failed.push(i);
        } else if let Some((k, v)) = kept.next() {
            if kept_failed.binary_search(&k).is_ok() {
                failed.push(i);
            }
            verdicts.push(v);
        }
    }
    Verdicts {
        admitted: decided.admitted,
        verdicts,
        now: decided.now,
        failed: Some(Failed {
            error: StoreError::Full,
            hits: failed,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;
    use crate::store::Board;
    use std::collections::HashMap;

    const MINUTE: Micros = 60 * SECOND;

    /// `requests` a minute, fixed windows.
    fn per_minute(requests: u64) -> Limit {
        Limit {
            algorithm: Algorithm::FixedWindow,
            requests,
            window: MINUTE,
            burst: requests,
            phase: 0,
        }
    }

    /// One hit on `key` of `limit`, in a `local` domain, on shard `placement`.
    fn hit(key: &str, limit: Limit, placement: u64) -> Hit {
        Hit {
            key: key.to_string(),
            placement,
            limit,
            hits: 1,
            mode: Mode::Enforce,
            spend: Spend::IfAdmitted,
            fallback: Fallback::Local,
            max_delay: NO_DEADLINE,
        }
    }

    /// Counters of at most `max_keys`, one replica serving; a new counter starts
    /// with what `seeds` says of its key spent (nothing, for a key it does not name).
    struct Fixture {
        clock: ManualClock,
        counters: Counters,
        seeds: Mutex<HashMap<String, u64>>,
    }

    impl Fixture {
        fn new(max_keys: usize) -> Fixture {
            let clock = ManualClock::new(1_000 * MINUTE);
            Fixture {
                counters: Counters::new(Arc::new(clock.clone()), max_keys),
                clock,
                seeds: Mutex::default(),
            }
        }

        fn decide(&self, hits: &[Hit]) -> Verdicts {
            self.counters.decide(hits, 1, |h, _| {
                lock(&self.seeds).get(&h.key).copied().unwrap_or(0)
            })
        }

        fn admitted(&self, h: &Hit) -> bool {
            let decided = self.decide(std::slice::from_ref(h));
            assert!(decided.failed.is_none(), "{} kept", h.key);
            decided.admitted
        }

        /// Counters in the local counters' store.
        fn kept(&self) -> usize {
            self.counters.memory.active_keys()
        }
    }

    /// A shared store of two shards (by placement), which takes settlements once
    /// per token and fails those of a shard while it is down; it records each
    /// call's size per shard.
    #[derive(Default)]
    struct Shared {
        down: Mutex<Vec<usize>>,
        tokens: Mutex<std::collections::HashSet<String>>,
        added: Mutex<HashMap<String, u64>>,
        calls: Mutex<Vec<(usize, usize)>>,
        /// Each amount taken: the counter's key, the limit it was charged with, and
        /// the amount.
        charged: Mutex<Vec<(String, Limit, u64)>>,
        /// Each counter's count as the store would hold it: refunds floored at
        /// empty, as the store floors them.
        counts: Mutex<HashMap<String, u64>>,
        /// The next settlement is taken but its answer lost.
        lose: AtomicBool,
    }

    impl Shared {
        /// What `s` leaves on its counter.
        fn apply(&self, s: &Settlement) {
            let mut counts = lock(&self.counts);
            let count = counts.entry(s.hit.key.clone()).or_default();
            for h in s.hits() {
                match h.spend {
                    Spend::Refund => *count = count.saturating_sub(h.hits),
                    _ => *count += h.hits,
                }
            }
        }

        fn count(&self, key: &str) -> u64 {
            lock(&self.counts).get(key).copied().unwrap_or(0)
        }
    }

    impl Board for Shared {}

    impl Store for Shared {
        async fn decide(&self, _: &[Hit]) -> Result<Verdicts, StoreError> {
            Err(StoreError::Timeout)
        }
        async fn peek(&self, _: &[Hit]) -> Result<Verdicts, StoreError> {
            Err(StoreError::Timeout)
        }
        fn active_keys(&self) -> usize {
            0
        }
        fn name(&self) -> &'static str {
            "shared"
        }
        fn shard_of(&self, hit: &Hit) -> usize {
            hit.placement as usize % 2
        }
        async fn settle(&self, batch: &[Settlement]) -> Vec<Result<bool, StoreError>> {
            for shard in 0..2 {
                let n = batch
                    .iter()
                    .filter(|s| self.shard_of(&s.hit) == shard)
                    .count();
                if n > 0 {
                    lock(&self.calls).push((shard, n));
                }
            }
            batch
                .iter()
                .map(|s| {
                    if lock(&self.down).contains(&self.shard_of(&s.hit)) {
                        return Err(StoreError::BackingOff);
                    }
                    if !lock(&self.tokens).insert(s.token.clone()) {
                        return Ok(false);
                    }
                    *lock(&self.added).entry(s.hit.key.clone()).or_default() += s.hit.hits;
                    lock(&self.charged).push((s.hit.key.clone(), s.hit.limit, s.hit.hits));
                    self.apply(s);
                    if self.lose.swap(false, Relaxed) {
                        return Err(StoreError::Timeout);
                    }
                    Ok(true)
                })
                .collect()
        }
    }

    #[tokio::test]
    async fn at_max_keys_a_new_key_is_lifted_while_the_kept_ones_count_and_settle_exactly() {
        let f = Fixture::new(3);
        let l = per_minute(2);
        let kept: Vec<Hit> = (0..3).map(|i| hit(&format!("d|k={i}"), l, 0)).collect();
        for h in &kept {
            assert!(f.admitted(h));
        }
        // Full of counters that owe: the fourth key is lifted, and not kept.
        let new = hit("d|k=new", l, 0);
        for _ in 0..3 {
            let decided = f.decide(std::slice::from_ref(&new));
            assert!(decided.admitted);
            let failed = decided.failed.expect("lifted");
            assert_eq!((failed.error, failed.hits), (StoreError::Full, vec![0]));
        }
        assert_eq!((f.counters.held(), f.counters.refused()), (3, 3));
        assert_eq!(f.counters.counter("d|k=new"), None);
        // The kept keys go on counting on their own.
        assert!(f.admitted(&kept[0]));
        assert!(!f.admitted(&kept[0]));
        // Settled: what each kept key admitted, exactly; nothing of the lifted one.
        let store = Shared::default();
        let s = f.counters.settle(&store, "r").await;
        assert_eq!((s.added, s.failed), (4, 0));
        let added = lock(&store.added).clone();
        assert_eq!(added.len(), 3);
        assert_eq!((added["d|k=0"], added["d|k=1"], added["d|k=2"]), (2, 1, 1));
        // Idle, the counters leave the table and their local store: room again.
        f.clock.advance(IDLE);
        f.counters.settle(&store, "r").await;
        assert_eq!((f.counters.held(), f.kept()), (0, 0));
        assert!(!f.counters.has_unsettled());
        f.counters.tick();
        assert!(f.admitted(&new));
        assert_eq!(f.counters.held(), 1);
    }

    #[tokio::test]
    async fn a_reload_that_changes_the_algorithm_settles_each_rules_spending_on_its_own_counter() {
        let f = Fixture::new(100);
        // Two of a fixed window's 4 a minute admitted locally.
        let window = hit("d|k=a", per_minute(4), 0);
        assert!(f.admitted(&window));
        assert!(f.admitted(&window));
        // Reloaded to a token bucket: the store starts another counter for it, and
        // so does the replica.
        let bucket = Limit {
            algorithm: Algorithm::TokenBucket,
            ..per_minute(3)
        };
        let bucket = hit("d|k=a", bucket, 0);
        for _ in 0..3 {
            assert!(f.admitted(&bucket));
        }
        assert!(!f.admitted(&bucket));
        assert_eq!(f.counters.counter("d|k=a"), Some(5));
        // Each rule's spending goes to its own counter, with its own limit: the
        // bucket's 3 reach the bucket, which decides from now on.
        let store = Shared::default();
        let s = f.counters.settle(&store, "r").await;
        assert_eq!((s.added, s.failed), (5, 0));
        let mut charged = lock(&store.charged).clone();
        charged.sort_by_key(|c| c.2);
        assert_eq!(
            charged,
            vec![
                ("d|k=a".to_string(), window.limit, 2),
                ("d|k=a".to_string(), bucket.limit, 3)
            ]
        );
        // Back to the window within the outage: its counter goes on where it was.
        assert!(f.admitted(&window));
        assert!(f.admitted(&window));
        assert!(!f.admitted(&window));
    }

    #[tokio::test]
    async fn a_reload_that_changes_the_limit_or_its_unit_settles_with_the_rule_in_force() {
        let f = Fixture::new(100);
        let per_second = Limit {
            window: SECOND,
            ..per_minute(2)
        };
        let h = hit("d|k=a", per_second, 0);
        assert!(f.admitted(&h));
        // Reloaded to 3 a minute: the counter (the same in the store) goes on under
        // the new rule, and what it spent is charged as the store decides it now,
        // over a minute's window (over a second's, the store would forget it at
        // the next second, and the minute's counter admit it again).
        let per_minute = hit("d|k=a", per_minute(3), 0);
        assert!(f.admitted(&per_minute));
        assert!(f.admitted(&per_minute));
        assert!(!f.admitted(&per_minute));
        let store = Shared::default();
        f.counters.settle(&store, "r").await;
        assert_eq!(
            lock(&store.charged).clone(),
            vec![("d|k=a".to_string(), per_minute.limit, 3)]
        );
    }

    #[tokio::test]
    async fn a_counter_that_owes_nothing_makes_room_and_starts_again_as_it_started() {
        let f = Fixture::new(2);
        let l = per_minute(2);
        // Spent in the store: denied, owing nothing.
        lock(&f.seeds).insert("d|k=spent".into(), 2);
        let spent = hit("d|k=spent", l, 0);
        assert!(!f.admitted(&spent));
        let owing = hit("d|k=owing", l, 0);
        assert!(f.admitted(&owing));
        assert_eq!(f.kept(), 2);
        // A new key takes the room of the one that owes nothing, once it has not
        // been decided for a moment.
        let new = hit("d|k=new", l, 0);
        assert!(f.decide(std::slice::from_ref(&new)).failed.is_some());
        f.clock.advance(CLEAR_EVERY);
        assert!(f.admitted(&new));
        assert_eq!((f.counters.held(), f.counters.refused()), (2, 1));
        assert_eq!(f.kept(), 2, "its local counter went with it");
        // Every counter owes: the next new key is lifted, even once searched again.
        f.clock.advance(CLEAR_EVERY);
        let later = f.decide(std::slice::from_ref(&spent));
        assert_eq!(later.failed.map(|f| f.hits), Some(vec![0]));
        assert_eq!(f.counters.refused(), 2);
        // Settled and gone, the room is back: the dropped key starts as it started.
        f.clock.advance(IDLE);
        f.counters.settle(&Shared::default(), "r").await;
        assert_eq!(f.counters.held(), 0);
        assert!(!f.admitted(&spent));
    }

    impl Fixture {
        /// A decision of `h` whose thread stalls between its halves while `meanwhile`
        /// runs: its verdict.
        async fn stalled<F: std::future::Future<Output = ()>>(
            &self,
            h: &Hit,
            meanwhile: impl FnOnce() -> F,
        ) -> Verdicts {
            let hits = std::slice::from_ref(h);
            let now = self.clock.now();
            let begun = self.counters.begin(hits, 1, now, |_, _| 0);
            meanwhile().await;
            self.counters.finish(hits, begun, now)
        }
    }

    #[tokio::test]
    async fn spending_decided_across_a_stall_is_settled_though_a_full_table_was_cleared_meanwhile()
    {
        let f = Fixture::new(2);
        let l = per_minute(5);
        let slow = hit("d|k=slow", l, 0);
        // A new key's request finds room for its counter (which owes nothing yet)
        // and stalls; meanwhile the table fills, and another new key searches it for
        // counters that owe nothing.
        let (b, c) = (hit("d|k=b", l, 0), hit("d|k=c", l, 0));
        let mut new = None;
        let decided = f
            .stalled(&slow, || async {
                f.clock.advance(CLEAR_EVERY);
                assert!(f.admitted(&b));
                new = Some(f.decide(std::slice::from_ref(&c)));
            })
            .await;
        assert!(decided.admitted);
        let store = Shared::default();
        f.counters.settle(&store, "r").await;
        let added = lock(&store.added).clone();
        assert_eq!(added.get("d|k=slow"), Some(&1), "{added:?}");
        // The stalled request's counter was in use: the new key had no room.
        let new = new.expect("decided");
        assert_eq!(new.failed.map(|f| f.hits), Some(vec![0]));
        assert_eq!(f.counters.held(), 2);
    }

    #[tokio::test]
    async fn spending_decided_across_a_stall_is_settled_though_a_settlement_ran_meanwhile() {
        let f = Fixture::new(100);
        let h = hit("d|k=a", per_minute(5), 0);
        assert!(f.admitted(&h));
        let store = Shared::default();
        f.counters.settle(&store, "r").await;
        // Settled, its counter owes nothing; a request on it stalls for a second,
        // while a settlement runs.
        let decided = f
            .stalled(&h, || async {
                f.clock.advance(IDLE);
                f.counters.settle(&store, "r").await;
            })
            .await;
        assert!(decided.admitted);
        f.counters.settle(&store, "r").await;
        assert_eq!(lock(&store.added).get("d|k=a"), Some(&2));
    }

    #[test]
    fn a_lifted_key_leaves_its_request_to_the_kept_limits() {
        let f = Fixture::new(1);
        let l = per_minute(1);
        let kept = hit("d|k=kept", l, 0);
        assert!(f.admitted(&kept));
        // Denied by the kept limit: nothing spent, the lifted one placeholder.
        let decided = f.decide(&[kept.clone(), hit("d|k=new", l, 0)]);
        assert!(!decided.admitted);
        assert_eq!(decided.failed.map(|f| f.hits), Some(vec![1]));
        assert_eq!(f.counters.counter("d|k=kept"), Some(1));
        // A lifted quota limit admits the request though the kept one is over.
        let quota = |key: &str| Hit {
            mode: Mode::Quota,
            ..hit(key, l, 0)
        };
        let decided = f.decide(&[quota("d|k=kept"), quota("d|k=new")]);
        assert!(decided.admitted);
        assert!(!decided.verdicts[0].admitted);
        assert_eq!(decided.verdicts[1], Failed::placeholder());
    }

    #[tokio::test]
    async fn settlement_goes_in_batches_and_asks_a_failing_shard_once_a_round() {
        // More than a batch in each shard of the table.
        const KEYS: u64 = 12_000;
        let f = Fixture::new(100_000);
        let l = per_minute(5);
        for i in 0..KEYS {
            assert!(f.admitted(&hit(&format!("d|k={i}"), l, i)));
        }
        let store = Shared::default();
        lock(&store.down).push(1);
        let s = f.counters.settle(&store, "r").await;
        assert_eq!((s.added, s.failed), (KEYS / 2, KEYS / 2));
        let calls = std::mem::take(&mut *lock(&store.calls));
        assert!(calls.iter().all(|&(_, n)| n <= SETTLE_BATCH), "{calls:?}");
        // Shard 0 in batches; shard 1 asked once, then left until the next round.
        assert_eq!(calls.iter().filter(|c| c.0 == 1).count(), 1, "{calls:?}");
        assert!(calls.len() < 100, "{calls:?}");
        lock(&store.down).clear();
        let s = f.counters.settle(&store, "r").await;
        assert_eq!((s.added, s.already, s.failed), (KEYS / 2, 0, 0));
        assert!(lock(&store.added).values().all(|&n| n == 1));
        assert_eq!(lock(&store.added).len(), KEYS as usize);
    }

    /// A store down for settlements, through which a request decides a new key,
    /// `late`, in the middle of the first call, a while after the round began.
    struct Racing {
        f: Arc<Fixture>,
        late: Hit,
        raced: AtomicBool,
    }

    impl Board for Racing {}

    impl Store for Racing {
        async fn decide(&self, _: &[Hit]) -> Result<Verdicts, StoreError> {
            Err(StoreError::Timeout)
        }
        async fn peek(&self, _: &[Hit]) -> Result<Verdicts, StoreError> {
            Err(StoreError::Timeout)
        }
        fn active_keys(&self) -> usize {
            0
        }
        fn name(&self) -> &'static str {
            "racing"
        }
        async fn settle(&self, batch: &[Settlement]) -> Vec<Result<bool, StoreError>> {
            if !self.raced.swap(true, Relaxed) {
                self.f.clock.advance(2 * IDLE);
                self.f.decide(std::slice::from_ref(&self.late));
            }
            vec![Err(StoreError::BackingOff); batch.len()]
        }
    }

    #[tokio::test]
    async fn a_counter_decided_while_a_settlement_runs_stays() {
        let f = Arc::new(Fixture::new(100_000));
        let l = per_minute(5);
        for i in 0..2_000u64 {
            assert!(f.admitted(&hit(&format!("d|k={i}"), l, 0)));
        }
        // A key of the last shard of the table, which the round reaches after its
        // first call; denied, it owes nothing.
        let last = &f.counters.tables[SHARDS - 1];
        let late = (0..)
            .map(|i| hit(&format!("d|late={i}"), l, 0))
            .find(|h| std::ptr::eq(f.counters.table(&h.key), last))
            .expect("a key of the last shard");
        lock(&f.seeds).insert(late.key.clone(), 5);
        let store = Racing {
            f: f.clone(),
            late: late.clone(),
            raced: AtomicBool::new(false),
        };
        f.counters.settle(&store, "r").await;
        assert!(store.raced.load(Relaxed));
        assert_eq!(
            f.counters.counter(&late.key),
            Some(0),
            "dropped by the round"
        );
        assert_eq!(f.counters.held(), 2_001);
    }

    #[tokio::test]
    async fn the_table_gives_its_memory_back_once_settled() {
        let f = Fixture::new(100_000);
        let l = per_minute(5);
        for i in 0..20_000u64 {
            assert!(f.admitted(&hit(&format!("d|k={i}"), l, 0)));
        }
        let capacity = |f: &Fixture| -> usize {
            f.counters
                .tables
                .iter()
                .map(|t| lock(t).counters.capacity())
                .sum()
        };
        assert!(capacity(&f) >= 20_000);
        assert_eq!(f.kept(), 20_000);
        f.clock.advance(IDLE);
        let store = Shared::default();
        while f.counters.has_unsettled() {
            f.counters.settle(&store, "r").await;
        }
        assert_eq!((f.counters.held(), f.kept()), (0, 0));
        assert!(capacity(&f) < 1_000, "{}", capacity(&f));
    }

    /// `hits` of `spend` on `key` of `limit`, in a `local` domain.
    fn spend(key: &str, limit: Limit, hits: u64, spend: Spend) -> Hit {
        Hit {
            hits,
            spend,
            ..hit(key, limit, 0)
        }
    }

    #[tokio::test]
    async fn a_refund_made_locally_reaches_the_store_as_a_refund_beyond_what_it_nets() {
        let f = Fixture::new(100);
        let l = Limit {
            algorithm: Algorithm::TokenBucket,
            ..per_minute(100)
        };
        let store = Shared::default();
        // Reservations of 50 spent in the store before the outage.
        for key in ["d|k=a", "d|k=b"] {
            lock(&store.counts).insert(key.into(), 50);
            lock(&f.seeds).insert(key.into(), 50);
        }
        // The stream-end calls, during it: the 50 given back and the actual 10
        // charged, in either order.
        let a = [
            spend("d|k=a", l, 50, Spend::Refund),
            spend("d|k=a", l, 10, Spend::Always),
        ];
        let b = [
            spend("d|k=b", l, 10, Spend::Always),
            spend("d|k=b", l, 50, Spend::Refund),
        ];
        assert!(f.decide(&a).admitted);
        assert!(f.decide(&b).admitted);
        // Spent locally, then partly given back: netted here, nothing to refund.
        let c = hit("d|k=c", l, 0);
        for _ in 0..5 {
            assert!(f.admitted(&c));
        }
        assert!(f.decide(&[spend("d|k=c", l, 3, Spend::Refund)]).admitted);
        // A refund of a counter the store holds empty leaves it empty.
        assert!(f.decide(&[spend("d|k=d", l, 5, Spend::Refund)]).admitted);
        f.counters.settle(&store, "r").await;
        // What the store would hold had it answered throughout.
        let counts: Vec<u64> = ["d|k=a", "d|k=b", "d|k=c", "d|k=d"]
            .iter()
            .map(|k| store.count(k))
            .collect();
        assert_eq!(counts, vec![10, 10, 2, 0]);
        // Taken once: more rounds change nothing.
        f.clock.advance(IDLE);
        f.counters.settle(&store, "r").await;
        assert_eq!(store.count("d|k=a"), 10);
        assert_eq!(f.counters.held(), 0);
    }

    #[tokio::test]
    async fn a_refund_made_while_spending_is_on_its_way_is_owed_after_it_once() {
        let f = Fixture::new(100);
        let l = Limit {
            algorithm: Algorithm::TokenBucket,
            ..per_minute(100)
        };
        let h = hit("d|k=a", l, 0);
        for _ in 0..10 {
            assert!(f.admitted(&h));
        }
        // The store takes the 10, but its answer is lost: they stay on their way.
        let store = Shared::default();
        store.lose.store(true, Relaxed);
        assert_eq!(f.counters.settle(&store, "r").await.failed, 1);
        assert_eq!(store.count("d|k=a"), 10);
        // A slot given back meanwhile is not taken off the amount on its way.
        assert!(f.decide(&[spend("d|k=a", l, 4, Spend::Refund)]).admitted);
        for _ in 0..3 {
            f.counters.settle(&store, "r").await;
        }
        assert_eq!(store.count("d|k=a"), 6);
        f.clock.advance(IDLE);
        f.counters.settle(&store, "r").await;
        assert_eq!((store.count("d|k=a"), f.counters.held()), (6, 0));
    }
}
