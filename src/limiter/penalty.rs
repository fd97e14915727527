//! `penalty` (docs/observability.md, "Closing the loop"): a key denied `violations` times within
//! `within` is sentenced: banned (denied outright) for `ban`, or tightened (its limit
//! multiplied by `factor`) for `tighten.for`. With `block`, a key sentenced `bans`
//! times within `block.within` goes on the block list: denied outright for
//! `block.for`. Operators add and lift blocks through the admin API.
//!
//! [`Penalties`] is consulted before the store: a banned or blocked key is OVER_LIMIT
//! at once, with no store call, and `retry-after` is the rest of its sentence; a
//! tightened key is decided against its scaled limit. It is fed after each decision
//! with the denials of rules that carry a penalty. Only enforced limits count: a
//! `shadow_mode` limit never denies, and a `quota_mode` limit is left to its quota
//! rule. Soft shedding never counts.
//!
//! **One replica or many.** With the memory store the counts and sentences are this
//! process's own. With a store that shares them ([`Store::shares_sentences`], Redis),
//! every denial is counted in the store, so a client spread over replicas is
//! sentenced as one; the sentence comes back in the reply and is kept here, and
//! `sync` brings in the sentences other replicas started (the server runs it every
//! second), so each replica denies a banned key without a store call.
//!
//! Denials are counted per counter key with the same estimate as the default
//! algorithm (sliding window counter), so memory per key is a few words whatever
//! `violations` is. The map is sharded like the memory store and bounded
//! ([`DEFAULT_MAX_TRACKED`] keys): when a shard is full, expired records go first,
//! then a key without a sentence; keys serving a sentence are never dropped early.
//!
//! [`Store::shares_sentences`]: crate::store::Store::shares_sentences

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Ban, Outcome, Status};
use crate::algorithm::{Micros, Verdict};
use crate::clock::Clock;
use crate::policy::{tightened, Penalty, Rule, Sentence};
use crate::store::{Hit, Kind, Mode, Sentenced, Strike};

/// Keys tracked at most, over all shards.
pub const DEFAULT_MAX_TRACKED: usize = 100_000;
const SHARDS: usize = 16;

/// Whose key a sentence is on: shown by `/debug/blocks` and the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanInfo {
    pub domain: String,
    /// The rule's path (the metrics label).
    pub rule: String,
    /// The display form of the key (values, hashed as in counter keys).
    pub key: String,
}

/// Who put a sentence in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A rule's `penalty`.
    Penalty,
    /// An operator, through the admin API.
    Operator,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Penalty => "penalty",
            Source::Operator => "operator",
        }
    }
}

/// A sentence in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveBan {
    pub info: BanInfo,
    pub kind: Kind,
    pub source: Source,
    /// The counter key (what Unblock takes).
    pub counter: String,
    /// When it ends (clock micros).
    pub until: Micros,
    /// How long it still lasts.
    pub remaining: Micros,
    /// A tightening's factor, in millionths (0 otherwise).
    pub factor_ppm: u32,
}

/// A sentence as the limiter acts on it before asking the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InForce {
    /// Denied outright for this long more; `blocked` when on the block list.
    Denied { left: Micros, blocked: bool },
    /// Decided against its limit scaled by this factor (millionths).
    Tightened { factor_ppm: u32 },
}

/// A sentence a denial started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub kind: Kind,
    pub span: Micros,
}

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
        if now >= r.start + within {
            let spans = (now - r.start) / within;
            r.prev = if spans == 1 { r.cur } else { 0 };
            r.cur = 0;
            r.start += spans * within;
        }
        r.cur += 1;
        let left = u128::from(within - (now - r.start));
        let estimate = (u128::from(r.prev) * left / u128::from(within)) as u64 + r.cur;
        if estimate < penalty.violations.max(1) {
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

/// A penalty's sentence as the store names it: kind, length, factor (millionths).
fn parts(sentence: &Sentence) -> (Kind, Micros, u32) {
    match *sentence {
        Sentence::Ban(d) => (Kind::Ban, d, 0),
        Sentence::Tighten { factor_ppm, span } => (Kind::Tighten, span, factor_ppm),
    }
}

/// The `info` a sharing store keeps beside a sentence: who the key is and who
/// sentenced it, as a JSON array.
pub fn encode_info(info: &BanInfo, source: Source) -> String {
    serde_json::json!([info.domain, info.rule, info.key, source.as_str()]).to_string()
}

pub fn decode_info(text: &str) -> (BanInfo, Source) {
    let parts: Vec<String> = serde_json::from_str(text).unwrap_or_default();
    let part = |i: usize| parts.get(i).cloned().unwrap_or_default();
    let source = if part(3) == "operator" {
        Source::Operator
    } else {
        Source::Penalty
    };
    (
        BanInfo {
            domain: part(0),
            rule: part(1),
            key: part(2),
        },
        source,
    )
}

/// Acts on the sentences of the request's keys before the store is asked: an
/// enforced descriptor whose key is banned or blocked is marked OVER_LIMIT with the
/// rest of the sentence as its wait; a tightened key's hit gets its scaled limit.
/// Returns whether any was denied (the request is then denied and the store is not
/// asked).
pub fn apply_sentences(
    penalties: &Penalties,
    order: &[usize],
    hits: &mut [Hit],
    outcome: &mut Outcome,
) -> bool {
    let operators = penalties.operator_blocks();
    let mut now = None;
    let mut any = false;
    for (&i, hit) in order.iter().zip(hits.iter_mut()) {
        let Some(rule) = outcome.rule(&outcome.statuses[i]) else {
            continue;
        };
        if (rule.penalty.is_none() && !operators) || hit.mode != Mode::Enforce {
            continue;
        }
        let now = *now.get_or_insert_with(|| penalties.now());
        match penalties.in_force(&hit.key, now) {
            None => {}
            Some(InForce::Tightened { factor_ppm }) => {
                hit.limit.requests = tightened(hit.limit.requests, factor_ppm);
                hit.limit.burst = tightened(hit.limit.burst, factor_ppm);
                outcome.statuses[i].tightened = true;
            }
            Some(InForce::Denied { left, blocked }) => {
                let status = &mut outcome.statuses[i];
                status.over_limit = true;
                status.ban = if blocked { Ban::Blocked } else { Ban::Active };
                status.verdict = Some(Verdict {
                    admitted: false,
                    remaining: 0,
                    reset: left,
                    retry_after: left,
                    delay: 0,
                    next_room: 0,
                });
                any = true;
            }
        }
    }
    if any {
        outcome.over_limit = true;
    }
    any
}

/// Marks `status` for a sentence its denial started: its wait is at least the
/// sentence when it denies outright.
pub fn mark_started(status: &mut Status, kind: Kind, span: Micros) {
    status.ban = Ban::Started;
    if kind.denies() {
        if let Some(v) = status.verdict.as_mut() {
            v.retry_after = v.retry_after.max(span);
        }
    }
}

/// Counts a denial by `rule` towards its penalty, in process; when it starts a
/// sentence, marks the status.
pub fn count_denial(
    penalties: &Penalties,
    domain: &str,
    rule: &Rule,
    hit: &Hit,
    status: &mut Status,
    shown: &str,
) {
    let Some(penalty) = &rule.penalty else {
        return;
    };
    let started = penalties.deny(&hit.key, penalty, penalties.now(), || BanInfo {
        domain: domain.to_string(),
        rule: rule.path.clone(),
        key: shown.to_string(),
    });
    if let Some(s) = started {
        mark_started(status, s.kind, s.span);
    }
}

/// A denial to count in a sharing store, built while the outcome is settled and
/// sent after.
#[derive(Debug)]
pub struct Pending {
    pub status: usize,
    pub key: String,
    pub penalty: Penalty,
    /// Counted here to `violations` already (a tightened key): the store's count
    /// is reached with this one denial.
    pub reached: bool,
    pub info: String,
}

impl Pending {
    pub fn strike(&self) -> Strike<'_> {
        let (kind, span, factor_ppm) = parts(&self.penalty.sentence);
        Strike {
            key: &self.key,
            violations: if self.reached {
                1
            } else {
                self.penalty.violations.max(1)
            },
            within: self.penalty.within.max(1),
            kind,
            span,
            factor_ppm,
            block: self
                .penalty
                .block
                .map(|b| (b.bans.max(1), b.within.max(1), b.span)),
            info: &self.info,
        }
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
mod tests {
    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;

    const T0: Micros = 1_700_000_000 * SECOND;

    pub(super) fn info() -> BanInfo {
        BanInfo {
            domain: "d".into(),
            rule: "ip".into(),
            key: "1.2.3.4".into(),
        }
    }

    pub(super) fn penalty() -> Penalty {
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

#[cfg(test)]
mod limiter_tests {

    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;
    use crate::limiter::{Descriptor, Limiter, Settings};
    use crate::store::{MemoryStore, Store};

    const T0: Micros = 1_700_000_000 * SECOND;

    const POLICY: &str = r#"
domain: d
descriptors:
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 1
      algorithm: fixed_window
      penalty: {violations: 2, within: 10s, ban: 5m}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

    fn limiter(clock: &ManualClock) -> Limiter<MemoryStore> {
        crate::limiter::test_limiter(POLICY, clock, Settings::default())
    }

    async fn ask(l: &Limiter<MemoryStore>, ip: &str) -> Outcome {
        let ip_entries = [("ip", ip)];
        let user = [("user", "u")];
        l.decide(
            "d",
            &[
                Descriptor::new(&ip_entries[..], 1),
                Descriptor::new(&user[..], 1),
            ],
        )
        .await
    }

    #[tokio::test]
    async fn a_key_denied_n_times_is_banned_without_store_calls() {
        let clock = ManualClock::new(T0);
        let l = limiter(&clock);
        assert!(!ask(&l, "1.1.1.1").await.over_limit);
        let first = ask(&l, "1.1.1.1").await;
        assert!(first.over_limit);
        assert_eq!(first.statuses[0].ban, Ban::None);
        assert_eq!(first.offender(0), Some("1.1.1.1"));
        let second = ask(&l, "1.1.1.1").await;
        assert_eq!(second.statuses[0].ban, Ban::Started);
        assert!(second.statuses[0].verdict.unwrap().retry_after >= 300 * SECOND);

        // A minute later the limit would admit again, but the ban holds.
        clock.advance(61 * SECOND);
        let keys_before = l.store().active_keys();
        let banned = ask(&l, "1.1.1.1").await;
        assert!(banned.over_limit);
        assert_eq!(banned.statuses[0].ban, Ban::Active);
        assert_eq!(
            banned.statuses[0].verdict.unwrap().retry_after,
            239 * SECOND
        );
        // The user counter was not spent: no store call was made.
        assert_eq!(banned.statuses[1].verdict, None);
        assert_eq!(l.store().active_keys(), keys_before);
        assert_eq!(l.penalties().active().len(), 1);
        assert_eq!(l.penalties().active()[0].info.key, "1.1.1.1");

        // Other keys are unaffected; the ban ends.
        assert!(!ask(&l, "2.2.2.2").await.over_limit);
        clock.advance(240 * SECOND);
        assert!(!ask(&l, "1.1.1.1").await.over_limit);
    }

    const LOOP: &str = r#"
domain: d
descriptors:
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 10
      algorithm: fixed_window
      penalty:
        violations: 2
        within: 1m
        tighten: {factor: 0.2, for: 10m}
        block: {bans: 2, within: 1h, for: 1d}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
"#;

    async fn one(l: &Limiter<MemoryStore>, key: &str, value: &str) -> Outcome {
        let entries = [(key, value)];
        l.decide("d", &[Descriptor::new(&entries[..], 1)]).await
    }

    async fn admitted_in_a_row(l: &Limiter<MemoryStore>, ip: &str) -> u64 {
        let mut n = 0;
        while !one(l, "ip", ip).await.over_limit {
            n += 1;
            assert!(n <= 100, "never denied");
        }
        n
    }

    #[tokio::test]
    async fn repeat_violations_tighten_the_limit_then_block_the_key() {
        let clock = ManualClock::new(T0);
        let l = crate::limiter::test_limiter(LOOP, &clock, Settings::default());
        // The full limit, then a second denial tightens it to a fifth.
        assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 10);
        let second = one(&l, "ip", "1.1.1.1").await;
        assert_eq!(second.statuses[0].ban, Ban::Started);
        assert_eq!(l.penalties().active()[0].kind, Kind::Tighten);

        // Next minute: 2 of 10, and another key keeps its full limit.
        clock.advance(61 * SECOND);
        assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 2);
        let tight = one(&l, "ip", "1.1.1.1").await;
        assert!(tight.statuses[0].tightened);
        assert_eq!(admitted_in_a_row(&l, "2.2.2.2").await, 10);

        // That was the key's second violation under the tighter limit: its second
        // sentence, which the block counts, so it is blocked.
        assert_eq!(tight.statuses[0].ban, Ban::Started);
        let listed = l.penalties().active();
        let b = listed.iter().find(|b| b.info.key == "1.1.1.1").unwrap();
        assert_eq!((b.kind, b.source), (Kind::Block, Source::Penalty));
        clock.advance(61 * SECOND);
        let keys_before = l.store().active_keys();
        let blocked = one(&l, "ip", "1.1.1.1").await;
        assert!(blocked.over_limit);
        assert_eq!(blocked.statuses[0].ban, Ban::Blocked);
        let wait = blocked.statuses[0].verdict.unwrap().retry_after;
        assert!(wait > 86_000 * SECOND && wait <= 86_400 * SECOND, "{wait}");
        assert_eq!(l.store().active_keys(), keys_before);

        // The block ends after its day; the key starts afresh at its full limit.
        clock.advance(86_400 * SECOND);
        assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 10);
    }

    #[tokio::test]
    async fn a_tightening_ends_and_the_full_limit_returns() {
        let clock = ManualClock::new(T0);
        let l = crate::limiter::test_limiter(LOOP, &clock, Settings::default());
        assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 10);
        one(&l, "ip", "1.1.1.1").await;
        clock.advance(11 * 60 * SECOND);
        assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 10);
    }

    #[tokio::test]
    async fn an_operator_blocks_and_unblocks_a_key_of_a_rule_without_penalty() {
        let clock = ManualClock::new(T0);
        let l = crate::limiter::test_limiter(LOOP, &clock, Settings::default());
        assert!(!one(&l, "user", "mallory").await.over_limit);
        let put = l
            .block("d", &[("user", "mallory")], 300 * SECOND)
            .await
            .unwrap();
        assert_eq!((put.kind, put.source), (Kind::Block, Source::Operator));
        assert_eq!(put.info.rule, "user");
        let denied = one(&l, "user", "mallory").await;
        assert_eq!(denied.statuses[0].ban, Ban::Blocked);
        assert_eq!(
            denied.statuses[0].verdict.unwrap().retry_after,
            300 * SECOND
        );
        // Other users pass.
        assert!(!one(&l, "user", "alice").await.over_limit);

        assert!(l.unblock(&put.counter).await.unwrap());
        assert!(!l.unblock(&put.counter).await.unwrap());
        assert!(!one(&l, "user", "mallory").await.over_limit);

        // What names no limited rule is refused, and nothing is listed.
        assert!(matches!(
            l.block("nope", &[("user", "x")], SECOND).await,
            Err(crate::limiter::BlockError::Unknown(_))
        ));
        assert!(matches!(
            l.block("d", &[("path", "/")], SECOND).await,
            Err(crate::limiter::BlockError::Unknown(_))
        ));
        assert!(l.penalties().active().is_empty());
        // An operator's block also ends on its own.
        l.block("d", &[("user", "eve")], 10 * SECOND).await.unwrap();
        clock.advance(10 * SECOND);
        assert!(!one(&l, "user", "eve").await.over_limit);
        l.penalties().sweep();
        assert!(!l.penalties().operator_blocks());
    }

    #[test]
    fn sync_lifts_what_the_shared_list_no_longer_holds_and_keeps_local_sentences() {
        use super::tests::{info, penalty};
        let clock = ManualClock::new(T0);
        let p = Penalties::new(Arc::new(clock.clone()), 1000);
        let shared = |key: &str, kind| Sentenced {
            key: key.to_string(),
            kind,
            remaining: 60 * SECOND,
            factor_ppm: 0,
            info: encode_info(&info(), Source::Operator),
            started: false,
        };
        p.sync(&[shared("a", Kind::Block), shared("b", Kind::Ban)]);
        assert_eq!(p.banned("a", clock.now()), Some(60 * SECOND));
        assert!(p.operator_blocks());
        let one = Penalty {
            violations: 1,
            ..penalty()
        };
        assert!(p.deny("local", &one, clock.now(), info).is_some());
        p.sync(&[shared("b", Kind::Ban)]);
        assert_eq!(p.banned("a", clock.now()), None);
        assert!(p.banned("b", clock.now()).is_some());
        assert!(p.banned("local", clock.now()).is_some());
        let active = p.active();
        assert_eq!(active.len(), 2);
        assert_eq!(
            active.iter().find(|b| b.counter == "b").unwrap().info,
            info()
        );
    }
}
