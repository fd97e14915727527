//! The penalty table: per key, its denials (counted with the sliding window
//! counter's estimate) and the sentence it serves, sharded and bounded.

use std::collections::{HashMap, HashSet};
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

    fn expired(&self, now: Micros) -> bool {
        !self.sentenced(now)
            && now >= self.start.saturating_add(2 * self.within)
            && (self.pens == 0 || now >= self.pens_start.saturating_add(self.pens_within))
    }

    fn lift(&mut self) {
        self.until = 0;
        self.factor_ppm = 0;
        self.shared = false;
    }
}

type Shard = HashMap<String, Record, ahash::RandomState>;

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
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Shard::with_hasher(ahash::RandomState::new())))
                .collect(),
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

    /// The sentence `key` is serving at `now`, if any.
    pub fn in_force(&self, key: &str, now: Micros) -> Option<InForce> {
        let shard = self.shard(key);
        let r = shard.get(key)?;
        if !r.sentenced(now) {
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
        match self.in_force(key, now)? {
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
        let within = penalty.within.max(1);
        let mut shard = self.shard(key);
        if !shard.contains_key(key) && !make_room(&mut shard, self.shard_cap, now) {
            return None;
        }
        let r = shard
            .entry(key.to_string())
            .or_insert_with(|| Record::fresh(now, within));
        if r.sentenced(now) && r.kind.denies() {
            return None;
        }
        r.within = within;
        if now >= r.start.saturating_add(within) {
            let spans = (now - r.start) / within;
            r.prev = if spans == 1 { r.cur } else { 0 };
            r.cur = 0;
            r.start += spans * within;
        }
        // A clock stepped back reads as the span's start.
        let left = u128::from(within - now.saturating_sub(r.start).min(within));
        let before =
            ((u128::from(r.prev) * left / u128::from(within)) as u64).saturating_add(r.cur);
        // The denials it takes to reach the violations, one at least.
        let needed = penalty.violations.max(1).saturating_sub(before).max(1);
        if denials < needed {
            r.cur = r.cur.saturating_add(denials);
            return None;
        }
        r.prev = 0;
        r.cur = 0;
        r.start = now;
        let (mut kind, mut span, factor_ppm) = parts(&penalty.sentence);
        if let Some(b) = penalty.block {
            if r.pens == 0 || now >= r.pens_start.saturating_add(b.within) {
                r.pens_start = now;
                r.pens = 0;
            }
            r.pens += 1;
            r.pens_within = b.within;
            if r.pens >= b.bans.max(1) {
                kind = Kind::Block;
                span = b.span;
                r.pens = 0;
            }
        }
        r.kind = kind;
        r.until = now.saturating_add(span);
        r.factor_ppm = factor_ppm;
        r.source = Source::Penalty;
        r.shared = false;
        r.info = Some(Box::new(info()));
        self.bans_started.fetch_add(1, Ordering::Relaxed);
        Some(Started { kind, span })
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
        let mut shard = self.shard(key);
        if !shard.contains_key(key) {
            // A sentence is never refused for room: it evicts a key without one, or
            // grows the shard past its cap (sentences are bounded by their own list).
            make_room(&mut shard, self.shard_cap, now);
        }
        let r = shard
            .entry(key.to_string())
            .or_insert_with(|| Record::fresh(now, 1));
        r.kind = kind;
        r.until = now.saturating_add(span);
        r.factor_ppm = factor_ppm;
        r.source = source;
        r.shared = shared;
        r.info = Some(Box::new(info));
    }

    /// Lifts the sentence of `key` and forgets its counts; whether it had one.
    pub fn lift(&self, key: &str) -> bool {
        let now = self.now();
        let mut shard = self.shard(key);
        match shard.remove(key) {
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
            for (key, r) in lock(m).iter_mut() {
                if r.shared && r.sentenced(now) && !listed.contains(key.as_str()) {
                    r.lift();
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

    /// Every sentence in force, longest remaining first.
    pub fn active(&self) -> Vec<ActiveBan> {
        let now = self.clock.now();
        let mut out: Vec<ActiveBan> = self
            .shards
            .iter()
            .flat_map(|m| {
                lock(m)
                    .iter()
                    .filter(|(_, r)| r.sentenced(now))
                    .filter_map(|(k, r)| {
                        Some(ActiveBan {
                            info: (**r.info.as_ref()?).clone(),
                            kind: r.kind,
                            source: r.source,
                            counter: k.clone(),
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

    /// Keys denied outright now (banned or blocked).
    pub fn active_count(&self) -> usize {
        let now = self.clock.now();
        self.shards
            .iter()
            .map(|m| {
                lock(m)
                    .values()
                    .filter(|r| r.sentenced(now) && r.kind.denies())
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
        self.shards.iter().map(|m| lock(m).len()).sum()
    }

    /// Drops records that neither count nor sentence any more.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let mut removed = 0;
        let mut operators = false;
        for m in &self.shards {
            let mut shard = lock(m);
            let before = shard.len();
            shard.retain(|_, r| !r.expired(now));
            removed += before - shard.len();
            operators |= shard
                .values()
                .any(|r| r.source == Source::Operator && r.sentenced(now));
        }
        if !operators {
            self.operator_blocks.store(false, Ordering::Relaxed);
        }
        removed
    }
}

/// Frees a slot in a full shard: expired records first, then any key without a
/// sentence. False when every tracked key is sentenced (the new key is then not
/// tracked).
fn make_room(shard: &mut Shard, cap: usize, now: Micros) -> bool {
    if shard.len() < cap {
        return true;
    }
    shard.retain(|_, r| !r.expired(now));
    if shard.len() < cap {
        return true;
    }
    let victim = shard
        .iter()
        .find(|(_, r)| !r.sentenced(now))
        .map(|(k, _)| k.clone());
    match victim {
        Some(k) => {
            shard.remove(&k);
            true
        }
        None => false,
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
}
