//! `penalty` (README, "Policy reference"): a key denied `violations` times within `within` is
//! denied outright for `ban`.
//!
//! Kept in the decision path rather than in a store, so it works with every store:
//! [`Penalties`] is consulted before the store (a banned key is OVER_LIMIT at once,
//! with no store call, and `retry-after` is the rest of the ban) and fed after each
//! decision with the denials of rules that carry a penalty. Only enforced limits
//! count and ban: a `shadow_mode` limit never denies, so it never bans, and a
//! `quota_mode` limit is left to its quota rule. A banned request spends nothing of
//! its other limits, like any denied request.
//!
//! Denials are counted per counter key with the same estimate as the default
//! algorithm (sliding window counter: the previous span's count weighted by how much
//! of it is still in the window, plus the current span's), so memory per key is a few
//! words whatever `violations` is. The map is sharded like the memory store and
//! bounded ([`DEFAULT_MAX_TRACKED`] keys): when a shard is full, expired records go
//! first, then a key that is not banned; keys serving a ban are never dropped early.
//!
//! **Several replicas:** each process keeps its own penalty memory. Behind a shared
//! Redis store, a client spread over N replicas needs up to N times `violations`
//! denials before every replica bans it, and a ban is enforced by the replicas that
//! counted it. A Redis-held ban key (set by the script that denies) is the natural
//! next step; until then, penalties are exact with one replica or with sticky
//! routing of each client to one replica.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Ban, Outcome, Status};
use crate::algorithm::{Micros, Verdict};
use crate::clock::Clock;
use crate::policy::{Penalty, Rule};
use crate::store::{Hit, Mode};

/// Keys tracked at most, over all shards.
pub const DEFAULT_MAX_TRACKED: usize = 100_000;
const SHARDS: usize = 16;

/// Where a ban is shown: `/debug/top` groups bans by domain and rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanInfo {
    pub domain: String,
    /// The rule's path (the metrics label).
    pub rule: String,
    /// The display form of the key (values, hashed as in counter keys).
    pub key: String,
}

/// A ban in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveBan {
    pub info: BanInfo,
    /// When the ban ends (clock micros).
    pub until: Micros,
    /// How long it still lasts.
    pub remaining: Micros,
}

#[derive(Debug)]
struct Record {
    /// Start of the current counting span.
    start: Micros,
    prev: u64,
    cur: u64,
    /// 0 when not banned.
    banned_until: Micros,
    within: Micros,
    info: Option<Box<BanInfo>>,
}

impl Record {
    fn expired(&self, now: Micros) -> bool {
        self.banned_until <= now && now >= self.start.saturating_add(2 * self.within)
    }
}

type Shard = HashMap<String, Record, ahash::RandomState>;

/// Denial counts and bans of keys whose rule has a `penalty`.
#[derive(Debug)]
pub struct Penalties {
    shards: Vec<Mutex<Shard>>,
    hasher: ahash::RandomState,
    shard_cap: usize,
    clock: Arc<dyn Clock>,
    bans_started: AtomicU64,
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
        }
    }

    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        lock(&self.shards[(self.hasher.hash_one(key) as usize) % SHARDS])
    }

    /// If `key` is serving a ban at `now`, how long the ban still lasts.
    pub fn banned(&self, key: &str, now: Micros) -> Option<Micros> {
        let shard = self.shard(key);
        let r = shard.get(key)?;
        (r.banned_until > now).then(|| r.banned_until - now)
    }

    /// Counts one denial of `key`; returns the ban length when this denial starts a
    /// ban. `info` is called only then.
    pub fn deny(
        &self,
        key: &str,
        penalty: &Penalty,
        now: Micros,
        info: impl FnOnce() -> BanInfo,
    ) -> Option<Micros> {
        let within = penalty.within.max(1);
        let mut shard = self.shard(key);
        if !shard.contains_key(key) && !make_room(&mut shard, self.shard_cap, now) {
            return None;
        }
        let r = shard.entry(key.to_string()).or_insert(Record {
            start: now,
            prev: 0,
            cur: 0,
            banned_until: 0,
            within,
            info: None,
        });
        if r.banned_until > now {
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
        r.banned_until = now.saturating_add(penalty.ban);
        r.prev = 0;
        r.cur = 0;
        r.start = now;
        r.info = Some(Box::new(info()));
        self.bans_started.fetch_add(1, Ordering::Relaxed);
        Some(penalty.ban)
    }

    /// Every ban in force, longest remaining first.
    pub fn active(&self) -> Vec<ActiveBan> {
        let now = self.clock.now();
        let mut out: Vec<ActiveBan> = self
            .shards
            .iter()
            .flat_map(|m| {
                lock(m)
                    .values()
                    .filter(|r| r.banned_until > now)
                    .filter_map(|r| {
                        Some(ActiveBan {
                            info: (**r.info.as_ref()?).clone(),
                            until: r.banned_until,
                            remaining: r.banned_until - now,
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

    /// Keys serving a ban now.
    pub fn active_count(&self) -> usize {
        let now = self.clock.now();
        self.shards
            .iter()
            .map(|m| lock(m).values().filter(|r| r.banned_until > now).count())
            .sum()
    }

    /// Bans started since the process began.
    pub fn bans_started(&self) -> u64 {
        self.bans_started.load(Ordering::Relaxed)
    }

    /// Keys tracked (counting or banned).
    pub fn tracked(&self) -> usize {
        self.shards.iter().map(|m| lock(m).len()).sum()
    }

    /// Drops records that neither count nor ban any more.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let mut removed = 0;
        for m in &self.shards {
            let mut shard = lock(m);
            let before = shard.len();
            shard.retain(|_, r| !r.expired(now));
            removed += before - shard.len();
        }
        removed
    }
}

/// Marks the enforced descriptors whose key is serving a ban as OVER_LIMIT, with the
/// rest of the ban as their wait. Returns whether any was (the request is then denied
/// and the store is not asked).
pub fn apply_bans(
    penalties: &Penalties,
    order: &[usize],
    hits: &[Hit],
    outcome: &mut Outcome,
) -> bool {
    let mut now = None;
    let mut any = false;
    for (&i, hit) in order.iter().zip(hits) {
        let Some(rule) = outcome.rule(&outcome.statuses[i]) else {
            continue;
        };
        if rule.penalty.is_none() || hit.mode != Mode::Enforce {
            continue;
        }
        let status = &mut outcome.statuses[i];
        let now = *now.get_or_insert_with(|| penalties.now());
        if let Some(left) = penalties.banned(&hit.key, now) {
            status.over_limit = true;
            status.ban = Ban::Active;
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
    if any {
        outcome.over_limit = true;
    }
    any
}

/// Counts a denial by `rule` towards its penalty; when it starts a ban, marks the
/// status and makes its wait at least the ban.
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
    if let Some(ban) = started {
        status.ban = Ban::Started;
        if let Some(v) = status.verdict.as_mut() {
            v.retry_after = v.retry_after.max(ban);
        }
    }
}

/// Frees a slot in a full shard: expired records first, then any key not banned.
/// False when every tracked key is banned (the new key is then not tracked).
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
        .find(|(_, r)| r.banned_until <= now)
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

    fn info() -> BanInfo {
        BanInfo {
            domain: "d".into(),
            rule: "ip".into(),
            key: "1.2.3.4".into(),
        }
    }

    fn penalty() -> Penalty {
        Penalty {
            violations: 3,
            within: 10 * SECOND,
            ban: 60 * SECOND,
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
            Some(60 * SECOND)
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
}
