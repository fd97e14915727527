//! The penalty table: per key, its denials (counted with the sliding window
//! counter's estimate) and the sentence it serves, sharded and bounded.
//!
//! A full shard must find the record to drop without reading the shard, or every
//! new key of a flood would pay a scan (and most when every record serves a
//! sentence and none may go). Each shard that has been full keeps two queues of
//! its keys: those not known to serve a sentence by when they expire, and those
//! found serving one by when it ends. An entry is a lower bound: a record whose
//! time moves later is queued again at its new time when its old one comes up; one
//! whose time moves earlier is queued again at once. So the record that expires
//! soonest of those without a sentence is found in logarithmic time, and a shard of
//! sentences refuses a new key after one look at each queue.

use std::cmp::Ordering as Order;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{decode_info, parts, ActiveBan, BanInfo, InForce, Source, Started};
use crate::algorithm::Micros;
use crate::clock::Clock;
use crate::policy::Penalty;
use crate::store::{Kind, Sentenced};

const SHARDS: usize = 16;

#[derive(Debug)]
struct Record {
    /// Start of the current counting span.
    start: Micros,
    prev: u64,
    cur: u64,
    within: Micros,
    /// The sentence in force: its kind, its end (0: none), a tightening's factor.
    kind: Kind,
    until: Micros,
    factor_ppm: u32,
    /// Sentences started within the current block span: its start, count and length.
    pens_start: Micros,
    pens: u64,
    pens_within: Micros,
    source: Source,
    /// Learned from a sharing store, so [`Penalties::sync`] may lift it.
    shared: bool,
    info: Option<Box<BanInfo>>,
}

impl Record {
    fn fresh(now: Micros, within: Micros) -> Self {
        Record {
            start: now,
            prev: 0,
            cur: 0,
            within,
            kind: Kind::Ban,
            until: 0,
            factor_ppm: 0,
            pens_start: 0,
            pens: 0,
            pens_within: 0,
            source: Source::Penalty,
            shared: false,
            info: None,
        }
    }

    fn sentenced(&self, now: Micros) -> bool {
        self.until > now
    }

    /// When it stops carrying anything: no sentence, no denial left in its estimate,
    /// no sentence left in its block span.
    fn expires_at(&self) -> Micros {
        let pens = if self.pens == 0 {
            0
        } else {
            self.pens_start.saturating_add(self.pens_within)
        };
        self.until
            .max(self.start.saturating_add(self.within.saturating_mul(2)))
            .max(pens)
    }

    fn expired(&self, now: Micros) -> bool {
        now >= self.expires_at()
    }

    /// The times the shard's queues order it by.
    fn due(&self) -> (Micros, Micros) {
        (self.expires_at(), self.until)
    }

    /// Counts `denials` at `now`; the sentence they start, if any (`info` is the
    /// caller's to set).
    fn deny(&mut self, penalty: &Penalty, now: Micros, denials: u64) -> Option<Started> {
        if self.sentenced(now) && self.kind.denies() {
            return None;
        }
        let within = penalty.within.max(1);
        self.within = within;
        if now >= self.start.saturating_add(within) {
            let spans = (now - self.start) / within;
            self.prev = if spans == 1 { self.cur } else { 0 };
            self.cur = 0;
            self.start += spans * within;
        }
        // A clock stepped back reads as the span's start.
        let left = u128::from(within - now.saturating_sub(self.start).min(within));
        let before =
            ((u128::from(self.prev) * left / u128::from(within)) as u64).saturating_add(self.cur);
        // The denials it takes to reach the violations, one at least.
        let needed = penalty.violations.max(1).saturating_sub(before).max(1);
        if denials < needed {
            self.cur = self.cur.saturating_add(denials);
            return None;
        }
        self.prev = 0;
        self.cur = 0;
        self.start = now;
        let (mut kind, mut span, factor_ppm) = parts(&penalty.sentence);
        if let Some(b) = penalty.block {
            if self.pens == 0 || now >= self.pens_start.saturating_add(b.within) {
                self.pens_start = now;
                self.pens = 0;
            }
            self.pens += 1;
            self.pens_within = b.within;
            if self.pens >= b.bans.max(1) {
                kind = Kind::Block;
                span = b.span;
                self.pens = 0;
            }
        }
        self.kind = kind;
        self.until = now.saturating_add(span);
        self.factor_ppm = factor_ppm;
        self.source = Source::Penalty;
        self.shared = false;
        Some(Started { kind, span })
    }

    fn lift(&mut self) {
        self.until = 0;
        self.factor_ppm = 0;
        self.shared = false;
    }
}

/// A key queued at a time: when its record may expire, or when its sentence ends.
/// Ordered so that a `BinaryHeap` gives the soonest first.
#[derive(Debug)]
struct Due {
    at: Micros,
    key: Arc<str>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Order> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> Order {
        other.at.cmp(&self.at)
    }
}

/// Whether a record's times moved earlier than `before` ([`Record::due`]): it must
/// then be queued again at once, since its entries may be past them. A time moved
/// later needs nothing: its old entry, when it comes up, queues it again.
fn earlier(now: (Micros, Micros), before: (Micros, Micros)) -> bool {
    now.0 < before.0 || now.1 < before.1
}

/// Queue entries kept beyond one a record before the queues are rebuilt.
const SLACK: usize = 64;

/// One shard: its records, and the two queues a full shard picks the record to drop
/// from (see the module's doc).
#[derive(Debug, Default)]
struct Shard {
    records: HashMap<Arc<str>, Record, ahash::RandomState>,
    /// Records not known to serve a sentence, by `expires_at` (each queued at or
    /// before it, unless found serving one and moved to `held`).
    open: BinaryHeap<Due>,
    /// Records found serving a sentence, by its end (each queued at or before it).
    held: BinaryHeap<Due>,
    /// Whether the queues list the records: only since the shard was last full,
    /// for below its cap nothing is dropped and a new key pays for no queue.
    queued: bool,
}

impl Shard {
    /// Adds a record for a key the shard does not hold.
    fn insert(&mut self, key: &str, record: Record) -> &mut Record {
        let key: Arc<str> = Arc::from(key);
        if self.queued {
            self.queue(Due {
                at: record.expires_at(),
                key: key.clone(),
            });
        }
        self.records.entry(key).or_insert(record)
    }

    /// Queues `key` again at once, after a time of its record moved earlier (see
    /// [`earlier`]).
    fn requeue_key(&mut self, key: &str) {
        if !self.queued {
            return;
        }
        if let Some((k, r)) = self.records.get_key_value(key) {
            let due = Due {
                at: r.expires_at(),
                key: k.clone(),
            };
            self.queue(due);
        }
    }

    fn queue(&mut self, due: Due) {
        if self.open.len() + self.held.len() > 2 * self.records.len() + SLACK {
            self.requeue();
        }
        self.open.push(due);
    }

    /// After a sweep: a shard left well below its cap stops queueing (a new key pays
    /// for no queue until it is full again, which takes as many new keys as its
    /// queues would cost to rebuild).
    fn swept(&mut self, cap: usize) {
        if self.records.len() < cap / 2 {
            self.queued = false;
            self.open = BinaryHeap::new();
            self.held = BinaryHeap::new();
        } else if self.queued {
            self.requeue();
        }
    }

    /// Queues every record once, dropping the entries of records gone or moved.
    fn requeue(&mut self) {
        self.held.clear();
        let mut open = std::mem::take(&mut self.open).into_vec();
        open.clear();
        open.extend(self.records.iter().map(|(k, r)| Due {
            at: r.expires_at(),
            key: k.clone(),
        }));
        self.open = BinaryHeap::from(open);
    }

    /// The record `due` names, if it is still the one queued.
    fn current(&self, due: &Due) -> Option<&Record> {
        self.records
            .get_key_value(&*due.key)
            .filter(|(k, _)| Arc::ptr_eq(k, &due.key))
            .map(|(_, r)| r)
    }

    /// Frees a slot in a full shard by dropping, of the records without a sentence,
    /// the one that expires soonest: an expired one whenever there is one. False
    /// when every record serves a sentence (the new key is then not tracked).
    fn make_room(&mut self, cap: usize, now: Micros) -> bool {
        if self.records.len() < cap {
            return true;
        }
        if !self.queued {
            self.requeue();
            self.queued = true;
        }
        // Sentences ended: those records may go again.
        while self.held.peek().is_some_and(|d| d.at <= now) {
            let Some(due) = self.held.pop() else { break };
            let Some(r) = self.current(&due) else {
                continue;
            };
            let sentenced = r.sentenced(now);
            let at = if sentenced { r.until } else { r.expires_at() };
            let due = Due { at, key: due.key };
            if sentenced {
                self.held.push(due);
            } else {
                self.open.push(due);
            }
        }
        while let Some(due) = self.open.pop() {
            let Some(r) = self.current(&due) else {
                continue;
            };
            if r.sentenced(now) {
                let until = r.until;
                self.held.push(Due {
                    at: until,
                    key: due.key,
                });
                continue;
            }
            let at = r.expires_at();
            if at > due.at {
                self.open.push(Due { at, key: due.key });
                continue;
            }
            // Every other record without a sentence is queued at or after `due.at`,
            // and expires no sooner.
            self.records.remove(&*due.key);
            return true;
        }
        false
    }
}

/// Denial counts and sentences of keys whose rule has a `penalty`, and operators'
/// blocks.
#[derive(Debug)]
pub struct Penalties {
    shards: Vec<Mutex<Shard>>,
    hasher: ahash::RandomState,
    shard_cap: usize,
    clock: Arc<dyn Clock>,
    bans_started: AtomicU64,
    /// Whether an operator's block may be in force: those cover rules with no
    /// penalty, so every hit is looked up while one is.
    operator_blocks: AtomicBool,
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Penalties {
    pub fn new(clock: Arc<dyn Clock>, max_tracked: usize) -> Self {
        Penalties {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: ahash::RandomState::new(),
            shard_cap: max_tracked.div_ceil(SHARDS).max(1),
            clock,
            bans_started: AtomicU64::new(0),
            operator_blocks: AtomicBool::new(false),
        }
    }

    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        lock(&self.shards[(self.hasher.hash_one(key) as usize) % SHARDS])
    }

    /// Whether hits of rules without a penalty must be looked up too.
    pub fn operator_blocks(&self) -> bool {
        self.operator_blocks.load(Ordering::Relaxed)
    }

    /// The sentence `key` is serving at `now`, if any: of any source when
    /// `penalised` (its rule has a `penalty`), else an operator's only. A reload that
    /// takes a rule's `penalty` away stops the sentences it gave, whether or not an
    /// operator's block elsewhere has every hit looked up.
    pub fn in_force(&self, key: &str, now: Micros, penalised: bool) -> Option<InForce> {
        let shard = self.shard(key);
        let r = shard.records.get(key)?;
        if !r.sentenced(now) || !(penalised || r.source == Source::Operator) {
            return None;
        }
        Some(match r.kind {
            Kind::Tighten => InForce::Tightened {
                factor_ppm: r.factor_ppm,
            },
            kind => InForce::Denied {
                left: r.until - now,
                blocked: kind == Kind::Block,
            },
        })
    }

    /// If `key` is denied outright at `now` (a ban or a block), for how much longer.
    pub fn banned(&self, key: &str, now: Micros) -> Option<Micros> {
        match self.in_force(key, now, true)? {
            InForce::Denied { left, .. } => Some(left),
            InForce::Tightened { .. } => None,
        }
    }

    /// Counts one denial of `key`; returns the sentence this denial starts, if it
    /// does. `info` is called only then.
    pub fn deny(
        &self,
        key: &str,
        penalty: &Penalty,
        now: Micros,
        info: impl FnOnce() -> BanInfo,
    ) -> Option<Started> {
        self.deny_many(key, penalty, now, 1, info)
    }

    /// Counts `denials` denials of `key` at `now` in one step, as as many calls of
    /// [`Penalties::deny`] would: returns the sentence they start, if any. At most
    /// one starts; the denials after it fall within it, as they would one by one.
    pub fn deny_many(
        &self,
        key: &str,
        penalty: &Penalty,
        now: Micros,
        denials: u64,
        info: impl FnOnce() -> BanInfo,
    ) -> Option<Started> {
        if denials == 0 {
            return None;
        }
        let mut guard = self.shard(key);
        let shard = &mut *guard;
        let r = if shard.records.contains_key(key) {
            shard.records.get_mut(key)?
        } else {
            if !shard.make_room(self.shard_cap, now) {
                return None;
            }
            shard.insert(key, Record::fresh(now, penalty.within.max(1)))
        };
        let before = r.due();
        let started = r.deny(penalty, now, denials);
        if started.is_some() {
            r.info = Some(Box::new(info()));
            self.bans_started.fetch_add(1, Ordering::Relaxed);
        }
        if earlier(r.due(), before) {
            shard.requeue_key(key);
        }
        started
    }

    /// Puts a sentence in force on `key` for `span` (an operator's block, or one
    /// decided elsewhere). `shared`: it came from a sharing store.
    #[allow(clippy::too_many_arguments)]
    pub fn put(
        &self,
        key: &str,
        kind: Kind,
        span: Micros,
        factor_ppm: u32,
        info: BanInfo,
        source: Source,
        shared: bool,
    ) {
        let now = self.now();
        if source == Source::Operator {
            self.operator_blocks.store(true, Ordering::Relaxed);
        }
        let mut guard = self.shard(key);
        let shard = &mut *guard;
        let r = if shard.records.contains_key(key) {
            let Some(r) = shard.records.get_mut(key) else {
                return;
            };
            r
        } else {
            // A sentence is never refused for room: it evicts a key without one, or
            // grows the shard past its cap (sentences are bounded by their own list).
            shard.make_room(self.shard_cap, now);
            shard.insert(key, Record::fresh(now, 1))
        };
        let before = r.due();
        r.kind = kind;
        r.until = now.saturating_add(span);
        r.factor_ppm = factor_ppm;
        r.source = source;
        r.shared = shared;
        r.info = Some(Box::new(info));
        if earlier(r.due(), before) {
            shard.requeue_key(key);
        }
    }

    /// Lifts the sentence of `key` and forgets its counts; whether it had one.
    pub fn lift(&self, key: &str) -> bool {
        let now = self.now();
        let mut shard = self.shard(key);
        match shard.records.remove(key) {
            Some(r) => r.sentenced(now),
            None => false,
        }
    }

    /// Makes the sentences learned from a sharing store match `list` (every
    /// sentence in force there): new ones are put, lifted ones are lifted.
    pub fn sync(&self, list: &[Sentenced]) {
        let now = self.now();
        let listed: HashSet<&str> = list.iter().map(|s| s.key.as_str()).collect();
        for m in &self.shards {
            let mut guard = lock(m);
            let Shard {
                records,
                open,
                queued,
                ..
            } = &mut *guard;
            for (key, r) in records.iter_mut() {
                if r.shared && r.sentenced(now) && !listed.contains(&**key) {
                    r.lift();
                    // Free now: queued where a full shard looks first.
                    if *queued {
                        open.push(Due {
                            at: r.expires_at(),
                            key: key.clone(),
                        });
                    }
                }
            }
        }
        for s in list {
            self.learn(s);
        }
    }

    /// Keeps a sentence a sharing store answered with.
    pub fn learn(&self, s: &Sentenced) {
        let (info, source) = decode_info(&s.info);
        self.put(
            &s.key,
            s.kind,
            s.remaining,
            s.factor_ppm,
            info,
            source,
            true,
        );
    }

    /// Every sentence in force, longest remaining first (served or not: the
    /// limiter lists those served, [`Limiter::sentences`](crate::limiter::Limiter::sentences)).
    #[cfg(test)]
    pub fn active(&self) -> Vec<ActiveBan> {
        self.active_where(|_, _| true)
    }

    /// The sentences in force that `keep` keeps, longest remaining first.
    pub fn active_where(&self, keep: impl Fn(&BanInfo, Source) -> bool) -> Vec<ActiveBan> {
        let now = self.clock.now();
        let mut out: Vec<ActiveBan> = self
            .shards
            .iter()
            .flat_map(|m| {
                lock(m)
                    .records
                    .iter()
                    .filter(|(_, r)| r.sentenced(now))
                    .filter_map(|(k, r)| {
                        let info = r.info.as_deref().filter(|i| keep(i, r.source))?;
                        Some(ActiveBan {
                            info: info.clone(),
                            kind: r.kind,
                            source: r.source,
                            counter: k.to_string(),
                            until: r.until,
                            remaining: r.until - now,
                            factor_ppm: r.factor_ppm,
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        out.sort_by(|a, b| {
            b.remaining
                .cmp(&a.remaining)
                .then(a.info.key.cmp(&b.info.key))
        });
        out
    }

    /// Keys denied outright now (banned or blocked), served or not.
    #[cfg(test)]
    pub fn active_count(&self) -> usize {
        self.active_count_where(|_, _| true)
    }

    /// Keys denied outright now (banned or blocked), of the sentences `keep` keeps.
    pub fn active_count_where(&self, keep: impl Fn(&BanInfo, Source) -> bool) -> usize {
        let now = self.clock.now();
        self.shards
            .iter()
            .map(|m| {
                lock(m)
                    .records
                    .values()
                    .filter(|r| r.sentenced(now) && r.kind.denies())
                    .filter(|r| r.info.as_deref().is_some_and(|i| keep(i, r.source)))
                    .count()
            })
            .sum()
    }

    /// Sentences started here since the process began.
    pub fn bans_started(&self) -> u64 {
        self.bans_started.load(Ordering::Relaxed)
    }

    /// Keys tracked (counting or sentenced).
    pub fn tracked(&self) -> usize {
        self.shards.iter().map(|m| lock(m).records.len()).sum()
    }

    /// Drops records that neither count nor sentence any more.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let mut removed = 0;
        let mut operators = false;
        for m in &self.shards {
            let mut shard = lock(m);
            let before = shard.records.len();
            shard.records.retain(|_, r| !r.expired(now));
            removed += before - shard.records.len();
            shard.swept(self.shard_cap);
            operators |= shard
                .records
                .values()
                .any(|r| r.source == Source::Operator && r.sentenced(now));
        }
        if !operators {
            self.operator_blocks.store(false, Ordering::Relaxed);
        }
        removed
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;
    use crate::policy::Sentence;

    const T0: Micros = 1_700_000_000 * SECOND;

    pub(crate) fn info() -> BanInfo {
        BanInfo {
            domain: "d".into(),
            rule: "ip".into(),
            key: "1.2.3.4".into(),
        }
    }

    pub(crate) fn penalty() -> Penalty {
        Penalty {
            violations: 3,
            within: 10 * SECOND,
            sentence: Sentence::Ban(60 * SECOND),
            block: None,
        }
    }

    #[test]
    fn n_denials_within_the_span_start_a_ban_that_ends() {
        let clock = ManualClock::new(T0);
        let p = Penalties::new(Arc::new(clock.clone()), 1000);
        assert_eq!(p.deny("k", &penalty(), clock.now(), info), None);
        clock.advance(SECOND);
        assert_eq!(p.deny("k", &penalty(), clock.now(), info), None);
        assert_eq!(p.banned("k", clock.now()), None);
        clock.advance(SECOND);
        assert_eq!(
            p.deny("k", &penalty(), clock.now(), info),
            Some(Started {
                kind: Kind::Ban,
                span: 60 * SECOND
            })
        );
        assert_eq!(p.banned("k", clock.now()), Some(60 * SECOND));
        assert_eq!(p.bans_started(), 1);
        assert_eq!(p.active_count(), 1);
        let active = p.active();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].info, info());
        clock.advance(59 * SECOND);
        assert_eq!(p.banned("k", clock.now()), Some(SECOND));
        clock.advance(SECOND);
        assert_eq!(p.banned("k", clock.now()), None);
        assert!(p.active().is_empty());
        // The count starts afresh after a ban.
        assert_eq!(p.deny("k", &penalty(), clock.now(), info), None);
    }

    #[test]
    fn many_denials_count_in_one_step_as_they_would_one_by_one() {
        let clock = ManualClock::new(T0);
        let p = Penalties::new(Arc::new(clock.clone()), 1000);
        assert_eq!(p.deny_many("k", &penalty(), clock.now(), 0, info), None);
        assert_eq!(p.deny_many("k", &penalty(), clock.now(), 2, info), None);
        assert_eq!(p.banned("k", clock.now()), None);
        assert!(
            p.deny("k", &penalty(), clock.now(), info).is_some(),
            "the third"
        );
        assert_eq!(
            p.deny_many("k", &penalty(), clock.now(), u64::MAX, info),
            None
        );
        assert_eq!(p.bans_started(), 1);
        // Past the violations at once: one ban.
        assert!(p
            .deny_many("j", &penalty(), clock.now(), u64::MAX, info)
            .is_some());
        assert_eq!(p.bans_started(), 2);
        // Half the last span's denials still count, as the estimate reads them.
        clock.advance(15 * SECOND);
        assert_eq!(p.deny_many("i", &penalty(), clock.now(), 2, info), None);
        clock.advance(15 * SECOND);
        assert_eq!(p.deny_many("i", &penalty(), clock.now(), 1, info), None);
        assert!(p.deny_many("i", &penalty(), clock.now(), 1, info).is_some());
    }

    #[test]
    fn a_clock_stepped_back_or_the_longest_span_overflows_nothing() {
        let clock = ManualClock::new(T0);
        let p = Penalties::new(Arc::new(clock.clone()), 1000);
        let longest = Penalty {
            within: Micros::MAX,
            ..penalty()
        };
        assert_eq!(p.deny("k", &longest, clock.now(), info), None);
        assert_eq!(p.deny("k", &longest, clock.now() - SECOND, info), None);
        assert!(p.deny("k", &longest, clock.now(), info).is_some());
    }

    #[test]
    fn denials_spread_wider_than_the_span_do_not_ban() {
        let clock = ManualClock::new(T0);
        let p = Penalties::new(Arc::new(clock.clone()), 1000);
        for _ in 0..10 {
            assert_eq!(p.deny("k", &penalty(), clock.now(), info), None);
            clock.advance(12 * SECOND);
        }
        assert_eq!(p.bans_started(), 0);
        // Other keys are counted apart.
        for _ in 0..2 {
            p.deny("a", &penalty(), clock.now(), info);
            p.deny("b", &penalty(), clock.now(), info);
        }
        assert_eq!(p.bans_started(), 0);
    }

    #[test]
    fn the_estimate_spans_the_boundary_of_two_spans() {
        let clock = ManualClock::new(T0);
        let p = Penalties::new(Arc::new(clock.clone()), 1000);
        let at = |s: u64| T0 + s * SECOND;
        assert!(p.deny("k", &penalty(), at(0), info).is_none());
        assert!(p.deny("k", &penalty(), at(9), info).is_none());
        // At 12 s only the denials at 9 and 12 are within the last 10 s.
        assert!(p.deny("k", &penalty(), at(12), info).is_none());
        // At 13 s: 9, 12 and 13.
        assert!(p.deny("k", &penalty(), at(13), info).is_some());
    }

    #[test]
    fn memory_stays_bounded_and_bans_are_kept() {
        let clock = ManualClock::new(T0);
        let p = Penalties::new(Arc::new(clock.clone()), 64);
        let one = Penalty {
            violations: 1,
            ..penalty()
        };
        assert!(p.deny("banned", &one, clock.now(), info).is_some());
        for i in 0..10_000 {
            p.deny(&format!("k{i}"), &penalty(), clock.now(), info);
        }
        assert!(p.tracked() <= 64, "{}", p.tracked());
        assert!(p.banned("banned", clock.now()).is_some());
        clock.advance(120 * SECOND);
        p.sweep();
        assert_eq!(p.tracked(), 0);
    }

    /// `n` keys, `prefix-0` first, that `p` keeps in one shard.
    fn mates(p: &Penalties, prefix: &str, n: usize) -> Vec<String> {
        let shard = |k: &str| (p.hasher.hash_one(k) as usize) % SHARDS;
        let first = shard(&format!("{prefix}-0"));
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|k| shard(k) == first)
            .take(n)
            .collect()
    }

    fn holds(p: &Penalties, key: &str) -> bool {
        p.shard(key).records.contains_key(key)
    }

    fn within(secs: u64) -> Penalty {
        Penalty {
            within: secs * SECOND,
            ..penalty()
        }
    }

    #[test]
    fn a_full_shard_drops_the_count_that_runs_out_soonest_and_never_a_sentence() {
        let clock = ManualClock::new(T0);
        // Eight records a shard.
        let p = Penalties::new(Arc::new(clock.clone()), 8 * SHARDS);
        let keys = mates(&p, "k", 16);
        let one = Penalty {
            violations: 1,
            ..penalty()
        };
        assert!(p.deny(&keys[0], &one, clock.now(), info).is_some());
        // Seven counts, whose estimates run out in a shuffled order: 2 x 30 s for the
        // first, 2 x 10 s for the second...
        let spans = [30, 10, 60, 20, 70, 40, 50];
        for (key, secs) in keys[1..8].iter().zip(spans) {
            assert_eq!(p.deny(key, &within(secs), clock.now(), info), None);
        }
        clock.advance(SECOND);
        // Each new key takes the place of the count nearest its end; the ban stays.
        let mut by_end: Vec<_> = keys[1..8].iter().zip(spans).collect();
        by_end.sort_by_key(|&(_, secs)| secs);
        for (new, (gone, _)) in keys[8..14].iter().zip(&by_end) {
            assert!(holds(&p, gone), "{gone}");
            p.deny(new, &within(100), clock.now(), info);
            assert!(!holds(&p, gone), "{gone} kept for {new}");
            assert!(holds(&p, new) && holds(&p, &keys[0]));
        }
        assert!(p.banned(&keys[0], clock.now()).is_some());
        assert_eq!(p.tracked(), 8);
    }

    #[test]
    fn a_shard_of_sentences_refuses_new_keys_until_one_ends() {
        let clock = ManualClock::new(T0);
        let p = Penalties::new(Arc::new(clock.clone()), 4 * SHARDS);
        let keys = mates(&p, "s", 8);
        let one = |secs: u64| Penalty {
            violations: 1,
            sentence: Sentence::Ban(secs * SECOND),
            ..penalty()
        };
        for (key, secs) in keys[..4].iter().zip([40, 10, 30, 20]) {
            assert!(p.deny(key, &one(secs), clock.now(), info).is_some());
        }
        for key in &keys[4..] {
            assert_eq!(p.deny(key, &one(5), clock.now(), info), None, "{key}");
            assert!(!holds(&p, key));
        }
        // The 10 s ban ends: that record may go, and only it.
        clock.advance(10 * SECOND);
        assert!(p.deny(&keys[4], &one(5), clock.now(), info).is_some());
        assert!(!holds(&p, &keys[1]));
        assert!(p.deny(&keys[5], &one(5), clock.now(), info).is_none());
        assert!(!holds(&p, &keys[5]));
        for key in [&keys[0], &keys[2], &keys[3], &keys[4]] {
            assert!(p.banned(key, clock.now()).is_some(), "{key}");
        }
        // A sentence lifted by the shared list frees its record at once.
        p.put(
            &keys[6],
            Kind::Ban,
            60 * SECOND,
            0,
            info(),
            Source::Penalty,
            true,
        );
        assert!(holds(&p, &keys[6]), "a sentence grows the shard");
        p.sync(&[]);
        p.deny(&keys[7], &within(10), clock.now(), info);
        assert!(holds(&p, &keys[7]) && !holds(&p, &keys[6]));
    }

    /// A record as the rule for dropping one reads it.
    #[derive(Debug, Clone, Copy)]
    struct Seen {
        expires_at: Micros,
        sentenced: bool,
    }

    fn seen(p: &Penalties, key: &str, now: Micros) -> HashMap<String, Seen> {
        p.shard(key)
            .records
            .iter()
            .map(|(k, r)| {
                let s = Seen {
                    expires_at: r.expires_at(),
                    sentenced: r.sentenced(now),
                };
                (k.to_string(), s)
            })
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Denials, sentences put and lifted, the shared list and sweeps, on one shard
        /// of 4 records: a sweep drops only expired records; otherwise a record goes
        /// only to make room for a new key, and then it is,
        /// of those without a sentence, one that expires soonest (an expired one
        /// whenever there is one); a new key is left untracked only when every
        /// record serves a sentence.
        #[test]
        fn a_full_shard_drops_only_the_soonest_to_expire_of_the_unsentenced(
            ops in proptest::collection::vec((0..12usize, 0..7u8, 0..40u64), 1..300),
        ) {
            let clock = ManualClock::new(T0);
            let p = Penalties::new(Arc::new(clock.clone()), 4 * SHARDS);
            let keys = mates(&p, "p", 12);
            for (k, what, quarters) in ops {
                clock.advance(quarters * SECOND / 4);
                let now = clock.now();
                let key = &keys[k];
                let before = seen(&p, key, now);
                let short = Penalty {
                    violations: 2,
                    within: 5 * SECOND,
                    sentence: Sentence::Ban(3 * SECOND),
                    block: None,
                };
                let mut lifted = None;
                match what {
                    0 | 1 => {
                        p.deny(key, &short, now, info);
                    }
                    2 => {
                        p.deny(key, &within(20), now, info);
                    }
                    3 => p.put(key, Kind::Block, 7 * SECOND, 0, info(), Source::Operator, true),
                    4 => {
                        p.lift(key);
                        lifted = Some(key.clone());
                    }
                    5 => {
                        p.sync(&[]);
                        lifted = Some(String::new());
                    }
                    _ => {
                        p.sweep();
                        let after = seen(&p, key, now);
                        for (k, s) in &before {
                            proptest::prop_assert!(
                                after.contains_key(k) || (!s.sentenced && s.expires_at <= now),
                                "{} swept", k
                            );
                        }
                        continue;
                    }
                }
                let after = seen(&p, key, now);
                let gone: Vec<&String> = before
                    .keys()
                    .filter(|k| !after.contains_key(*k) && Some(*k) != lifted.as_ref())
                    .collect();
                proptest::prop_assert!(gone.len() <= 1, "{:?}", gone);
                if let Some(g) = gone.first() {
                    let soonest = before
                        .values()
                        .filter(|s| !s.sentenced)
                        .map(|s| s.expires_at)
                        .min();
                    proptest::prop_assert!(!before[*g].sentenced, "{} was serving", g);
                    proptest::prop_assert_eq!(Some(before[*g].expires_at), soonest);
                    proptest::prop_assert!(!before.contains_key(key));
                }
                if what < 3 && !before.contains_key(key) && !after.contains_key(key) {
                    proptest::prop_assert!(before.len() >= 4);
                    proptest::prop_assert!(before.values().all(|s| s.sentenced));
                }
            }
        }
    }
}
