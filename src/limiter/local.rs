//! `failure_mode: local`: while a counter's shard cannot be reached, this replica
//! decides the counter in its own memory with its share of the limit (the limit
//! divided by the replicas serving), by the same algorithm, and adds what it spent to
//! the shared counter once the shard answers again.
//!
//! Two pieces, each off the healthy path but for the first:
//! - `Memo`: what the store last said of a counter (how much of it was used, and
//!   until when that holds). Written for `local` domains on every store answer, with
//!   atomic stores into a fixed table (`memo`): no lock, no allocation, no clock read
//!   (the time is the ticker's, [`Local::tick`]). A local counter starts from it, so
//!   an outage does not hand out a fresh window.
//! - the counters decided locally, and what each spent until the store has taken
//!   it: at most `--max-keys` of them (`counters`).
//!
//! A replica that has never had a store answer since it started (neither a decision
//! of a `local` domain nor a heartbeat) knows nothing of the counters: its local
//! counters start with their share already spent.
//!
//! The heartbeat also tells which replicas stopped beating a moment ago: *missing*,
//! they may be serving cut off from the store, deciding alone with their shares.
//! While any is, the live replicas decide in the store on each limit less the
//! missing replicas' shares ([`Local::reserve`]), so the total stays near the limit.
//!
//! The heartbeat only tells that a few seconds late. A replica that finds a shard
//! unreachable also asks its live peers at once whether they reach it: one that
//! does counts it missing from then on ([`held`]), and until every peer has
//! answered the cut-off replica admits nothing of that shard's counters
//! ([`peers`]).

#[cfg(test)]
mod concurrent;
mod counters;
pub mod held;
mod memo;
pub mod peers;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use crate::algorithm::{Algorithm, Limit, Micros, Verdict};
use crate::clock::Clock;
use crate::store::{member, parse_member, Beats, Heard, Hit, Replicas, Spend, Store, Verdicts};

use counters::Counters;
use held::{Held, HeldPeer};
use memo::Memo;
use peers::{CutStatus, Peer, Peers};

/// How heartbeats (sent every second) count: a replica is live for 3 s after its
/// latest beat (two beats may be late), then missing for up to 30 s: long enough to
/// cover a partition of that length, short enough that a replica that crashed
/// (it did not leave the count) holds the others back only briefly.
pub const BEATS: Beats = Beats {
    live: std::time::Duration::from_secs(3),
    hold: std::time::Duration::from_secs(30),
};

/// A request's configured limits, kept while its hits carry reserved ones: inline
/// for the few hits a request carries.
pub type Configured = smallvec::SmallVec<[Limit; 8]>;

/// How a replica count was learned, for `/debug/store` and the share metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareSource {
    /// Nothing learned yet: `--local-share-replicas`.
    Configured,
    /// The replicas heartbeating in the store.
    Store,
    /// The ready endpoints of this replica's own Service, counted from Kubernetes:
    /// in force when known and at least the store's count.
    Kubernetes,
}

impl ShareSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareSource::Configured => "configured",
            ShareSource::Store => "store",
            ShareSource::Kubernetes => "kubernetes",
        }
    }
}

/// A limit's share for one of `replicas`: requests and burst divided, rounded to
/// the nearest, at least 1 where the limit admits anything (a share of 0 would
/// answer as `closed`). The window, algorithm and phase are the limit's own.
pub fn share(limit: &Limit, replicas: u32) -> Limit {
    let n = u64::from(replicas.max(1));
    let part = |v: u64| {
        if v == 0 {
            0
        } else {
            (v.saturating_add(n / 2) / n).max(1)
        }
    };
    Limit {
        requests: part(limit.requests),
        burst: part(limit.burst),
        ..*limit
    }
}

/// What the live replicas decide `limit` on in the store while `missing` of
/// `replicas` may be deciding alone: the limit less their shares, requests and
/// burst alike, never below 0.
pub fn reserved(limit: &Limit, replicas: u32, missing: u32) -> Limit {
    let part = share(limit, replicas);
    let missing = u64::from(missing);
    Limit {
        requests: limit
            .requests
            .saturating_sub(part.requests.saturating_mul(missing)),
        burst: limit
            .burst
            .saturating_sub(part.burst.saturating_mul(missing)),
        ..*limit
    }
}

/// What a full counter holds: its burst for buckets, its requests otherwise.
fn capacity(limit: &Limit) -> u64 {
    match limit.algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => limit.burst,
        _ => limit.requests,
    }
}

/// One counter decided locally, as `/debug/store` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalCounter {
    pub key: String,
    /// Spent locally, not yet added to the shared counter.
    pub unsettled: u64,
}

/// The local share's state, for `/debug/store` and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalStatus {
    pub replicas: u32,
    /// Of `replicas`, those that stopped beating a moment ago: their shares are
    /// reserved.
    pub missing: u32,
    pub source: ShareSource,
    /// The count Kubernetes gave, whether in force or not.
    pub kubernetes: Option<u32>,
    /// Decisions made locally since the process started.
    pub decisions: u64,
    /// Counters decided locally and not yet settled (at most 100 listed).
    pub counters: Vec<LocalCounter>,
    /// Counters decided locally and not yet settled, all of them.
    pub unsettled_counters: usize,
    /// The most counters decided locally that are kept (`--max-keys`).
    pub max_counters: usize,
    /// New keys not kept since the start, the local counters full: each lifted
    /// as `open` lifts a counter on a failed shard.
    pub refused: u64,
    /// Requests denied while waiting for the peers' answers.
    pub withheld: u64,
    /// Where the peers reach this replica (`None`: the side channel is off).
    pub advertise: Option<String>,
    /// The live peers the latest heartbeat listed.
    pub peers: Vec<Peer>,
    /// The shards this replica is cut off from.
    pub cut_off: Vec<CutStatus>,
    /// Peers cut off from a shard this replica reaches: their shares are reserved.
    pub held: Vec<HeldPeer>,
}

/// A settlement's outcome, per counter.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Amounts the store took now.
    pub added: u64,
    /// Hits given back by the amounts the store took now (refunds made locally).
    pub refunded: u64,
    /// Amounts the store had already taken (a retry after a lost answer).
    pub already: u64,
    /// Counters whose settlement failed (tried again on the next tick).
    pub failed: u64,
}

/// This replica's share of every `local` domain's limits.
pub struct Local {
    clock: Arc<dyn Clock>,
    counters: Counters,
    memo: Memo,
    /// The clock as of the last tick: what the memo's writers read instead of a clock.
    coarse: AtomicU64,
    /// The store's count once learned, `--local-share-replicas` until then.
    replicas: AtomicU32,
    /// Of `replicas`, those whose shares are reserved: the store's missing ones and
    /// the live peers held ([`held`]).
    missing: AtomicU32,
    /// Of `replicas`, those the store holds as missing.
    beat_missing: AtomicU32,
    learned: AtomicBool,
    /// The count Kubernetes gave (0: none).
    kubernetes: AtomicU32,
    /// A store answer has been seen since the process started.
    ever_up: AtomicBool,
    decisions: AtomicU64,
    /// Names this replica in the store's heartbeat set and in settlement tokens.
    replica_id: String,
    /// Where the peers reach this replica, once the server has said.
    address: OnceLock<Option<String>>,
    peers: Peers,
    held: Held,
    /// The live peers that some shard the latest heartbeat reached lists as not
    /// live (missing there, so `beat_missing` may count them): a hold does not count
    /// them again. Its lock also makes each reckoning of `missing` whole.
    partly: Mutex<Vec<String>>,
    withheld: AtomicU64,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("replica_id", &self.replica_id)
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

impl Local {
    /// Local counters on `clock`, at most `max_keys` of them, assuming `replicas`
    /// serve until the store tells.
    pub fn new(clock: Arc<dyn Clock>, replicas: u32, max_keys: usize) -> Local {
        let replica_id = format!("{:016x}", rand::random::<u64>());
        Local {
            counters: Counters::new(clock.clone(), max_keys),
            coarse: AtomicU64::new(clock.now()),
            clock,
            memo: Memo::new(),
            replicas: AtomicU32::new(replicas.max(1)),
            missing: AtomicU32::new(0),
            beat_missing: AtomicU32::new(0),
            learned: AtomicBool::new(false),
            kubernetes: AtomicU32::new(0),
            ever_up: AtomicBool::new(false),
            decisions: AtomicU64::new(0),
            replica_id,
            address: OnceLock::new(),
            peers: Peers::default(),
            held: Held::default(),
            partly: Mutex::default(),
            withheld: AtomicU64::new(0),
        }
    }

    /// For a store of `shards` shards: a lost shard's calls take no lock shared by
    /// every shard, however many there are.
    pub fn with_shards(mut self, shards: usize) -> Local {
        self.peers = Peers::new(shards);
        self
    }

    /// Where the peers reach this replica's HTTP server (`None`: nowhere, and this
    /// replica asks no peer). Set once, before the first heartbeat; later calls
    /// change nothing.
    pub fn advertise(&self, address: Option<String>) {
        let on = address.is_some();
        if self.address.set(address).is_ok() {
            self.peers.ask(on);
        }
    }

    /// Whether [`Local::advertise`] has been called.
    pub fn advertised(&self) -> bool {
        self.address.get().is_some()
    }

    /// This replica's member of the heartbeat set: its id, and its address.
    pub fn member(&self) -> String {
        member(
            &self.replica_id,
            self.address.get().and_then(|a| a.as_deref()),
        )
    }

    /// The live peers and this replica's standing per shard.
    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// The limiter's clock.
    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    /// This replica's id in the store's heartbeat set.
    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    /// Replicas assumed to share each limit now: the larger of the counts the
    /// store and Kubernetes gave, the configured one while neither did.
    pub fn replicas(&self) -> u32 {
        self.in_force().0
    }

    pub fn source(&self) -> ShareSource {
        self.in_force().1
    }

    /// The larger count is the safer one: a replica that counts too many admits
    /// less than its share; one that counts too few lets the total exceed the limit.
    fn in_force(&self) -> (u32, ShareSource) {
        let kubernetes = self.kubernetes.load(Relaxed);
        let own = self.replicas.load(Relaxed);
        let learned = self.learned.load(Relaxed);
        match (kubernetes, learned) {
            (0, true) => (own, ShareSource::Store),
            (0, false) => (own, ShareSource::Configured),
            (k, true) if k < own => (own, ShareSource::Store),
            (k, _) => (k, ShareSource::Kubernetes),
        }
    }

    /// The count Kubernetes gave (the ready endpoints of this replica's Service), if
    /// it gave one.
    pub fn kubernetes(&self) -> Option<u32> {
        Some(self.kubernetes.load(Relaxed)).filter(|&n| n > 0)
    }

    /// Kubernetes counted `n` replicas serving; 0 forgets its count (none is ready,
    /// so it says nothing of this replica, which serves).
    pub fn learn_from_kubernetes(&self, n: u32) {
        let before = self.kubernetes.swap(n, Relaxed);
        if before != n {
            tracing::info!(
                replicas = n,
                before,
                in_force = self.replicas(),
                "local share: replica count from Kubernetes"
            );
        }
    }

    /// Of [`Local::replicas`], those that stopped beating a moment ago.
    pub fn missing(&self) -> u32 {
        self.missing.load(Relaxed)
    }

    /// The store counted these replicas heartbeating (this one live among them): it
    /// has answered, so counters it never mentioned start with a whole share.
    pub fn learn(&self, counted: Replicas) {
        let n = counted.total();
        if n == 0 {
            return;
        }
        self.beat_missing.store(counted.missing, Relaxed);
        self.reckon_missing();
        self.ever_up.store(true, Relaxed);
        if !self.learned.swap(true, Relaxed) {
            tracing::info!(
                replicas = n,
                "local share: replica count learned from the store"
            );
        }
        let before = self.replicas.swap(n, Relaxed);
        if before != n {
            tracing::debug!(replicas = n, before, "local share: replica count changed");
        }
    }

    /// What a heartbeat heard: the count, the live peers (where they are reached),
    /// and which held peers beat again.
    pub fn hear(&self, heard: &Heard) {
        let mut peers: Vec<Peer> = Vec::new();
        for (m, _) in heard.shards.iter().flat_map(|s| &s.live) {
            let (id, address) = parse_member(m);
            if id == self.replica_id || peers.iter().any(|p| p.id == id) {
                continue;
            }
            peers.push(Peer {
                id: id.to_string(),
                address: address.map(str::to_string),
            });
        }
        peers.sort_by(|a, b| a.id.cmp(&b.id));
        let partly = peers
            .iter()
            .filter(|p| {
                !heard
                    .shards
                    .iter()
                    .all(|s| s.live.iter().any(|(m, _)| parse_member(m).0 == p.id))
            })
            .map(|p| p.id.clone())
            .collect();
        *lock(&self.partly) = partly;
        self.peers.learn(peers);
        // A shard the heartbeat reached answers again: once no call there has
        // failed for a moment, this replica stops asking about it.
        let now = self.clock.now();
        for s in &heard.shards {
            self.peers.back(s.shard, now);
        }
        self.held.beat_again(&heard.shards, now);
        self.learn(heard.replicas);
    }

    /// A live peer is cut off from `shard`, which this replica reached at
    /// `reached_at` (the shard's clock): its share is reserved from now until its
    /// word lapses. Whether it was held (a replica that is not a live peer is not:
    /// the heartbeat counts it already, or not at all).
    pub fn hold(&self, id: &str, shard: usize, reached_at: u64) -> bool {
        if id == self.replica_id || !self.peers.is_live(id) {
            return false;
        }
        self.held.hold(id, shard, reached_at, self.clock.now());
        self.reckon_missing();
        true
    }

    /// The replicas whose shares are reserved: the store's missing ones, and the
    /// held peers it still counts live on every shard (one cut off from some shards
    /// only is missing on those already).
    fn reckon_missing(&self) {
        // One reckoning at a time: a hold's and a heartbeat's at once could otherwise
        // store the older count last.
        let partly = lock(&self.partly);
        let held = self
            .held
            .among(|id| self.peers.is_live(id) && !partly.iter().any(|p| p == id));
        let missing = self.beat_missing.load(Relaxed).saturating_add(held);
        let was = self.missing.swap(missing, Relaxed);
        if was != missing {
            tracing::info!(
                missing,
                held,
                "local share: replicas missing changed (a missing one's share is held back from the limits decided in the store)"
            );
        }
    }

    /// A call to `shard` failed: whether this replica may decide its counters with
    /// its share now ([`Peers::may_share`]).
    pub fn may_share(&self, shard: usize) -> bool {
        self.peers.may_share(shard, self.clock.now())
    }

    /// `hits` denied without spending anything: this replica waits for its peers'
    /// answers before it admits anything of their shard's counters.
    pub fn withhold(&self, hits: &[Hit]) -> Verdicts {
        self.decisions.fetch_add(1, Relaxed);
        self.withheld.fetch_add(1, Relaxed);
        let verdicts: Vec<Verdict> = hits
            .iter()
            .map(|h| Verdict {
                admitted: false,
                remaining: 0,
                reset: h.limit.window,
                // The peers answer within about the store timeout; a client told to
                // come back then finds the share decided.
                retry_after: peers::ASK_EVERY,
                ..Verdict::default()
            })
            .collect();
        Verdicts {
            admitted: crate::store::admitted(hits.iter().map(|h| h.mode), &verdicts),
            verdicts,
            now: None,
            failed: None,
        }
    }

    /// While replicas are missing, lowers each hit's limit to what the live
    /// replicas decide in the store ([`reserved`]) and answers the configured
    /// limits, to [`restore`] before a local decision; with none missing, one
    /// relaxed load and nothing else. Refunds keep their limit: they give back what
    /// was taken.
    pub fn reserve(&self, hits: &mut [Hit]) -> Configured {
        let mut configured = Configured::new();
        let missing = self.missing.load(Relaxed);
        if missing == 0 {
            return configured;
        }
        let replicas = self.replicas();
        for hit in hits.iter_mut() {
            configured.push(hit.limit);
            if hit.spend != Spend::Refund {
                hit.limit = reserved(&hit.limit, replicas, missing);
            }
        }
        configured
    }

    /// Moves the memo's clock on and drops expired local counters; the server runs
    /// it every 100 ms.
    pub fn tick(&self) {
        let now = self.clock.now();
        self.coarse.store(now, Relaxed);
        self.counters.tick();
        if self.held.expire(now) {
            self.reckon_missing();
        }
    }

    /// Remembers what the store answered for `hits` (a `local` domain's, healthy).
    pub fn remember(&self, hits: &[Hit], decided: &Verdicts) {
        if !self.ever_up.load(Relaxed) {
            self.ever_up.store(true, Relaxed);
        }
        let now = self.coarse.load(Relaxed);
        for (hit, v) in hits.iter().zip(&decided.verdicts) {
            let used = capacity(&hit.limit).saturating_sub(v.remaining);
            // A request denied as a whole did not consume what this limit admitted.
            let used = if v.admitted && !decided.admitted && !hit.spend.always() {
                used.saturating_sub(hit.hits)
            } else {
                used
            };
            self.memo.write(hit, used, now.saturating_add(v.reset));
        }
    }

    /// Decides `hits` on this replica's share, as the store would have on the whole
    /// limit. A key it cannot keep (`--max-keys` counters decided locally, each
    /// owing spending) is lifted, as `open` lifts a counter on a failed shard.
    pub fn decide(&self, hits: &[Hit]) -> Verdicts {
        self.decisions.fetch_add(1, Relaxed);
        let replicas = self.replicas();
        let now = self.clock.now();
        let known = self.ever_up.load(Relaxed);
        self.counters.decide(hits, replicas, |hit, limit| {
            // What the store last said of the counter, in this replica's part;
            // nothing known at all: the share is spent.
            match self.memo.read(hit, now) {
                Some(used) => used.div_ceil(u64::from(replicas.max(1))),
                None if known => 0,
                None => capacity(limit),
            }
        })
    }

    /// Whether some counter decided locally has not left the table yet (its
    /// spending is not settled, or it was decided a moment ago).
    pub fn has_unsettled(&self) -> bool {
        self.counters.has_unsettled()
    }

    /// Adds each counter's local spending to `store`, once per amount: an amount
    /// keeps its token until the store confirms it. A counter fully settled leaves
    /// the table, so its next local decision starts a new episode.
    pub async fn settle<S: Store>(&self, store: &S) -> Settled {
        self.counters.settle(store, &self.replica_id).await
    }

    /// The unsettled spending of `key`, while it is decided locally (admin API).
    pub fn counter(&self, key: &str) -> Option<u64> {
        self.counters.counter(key)
    }

    /// The spending decided locally that the store has not taken, all counters'.
    pub fn unsettled_hits(&self) -> u64 {
        self.counters.unsettled_hits()
    }

    /// The share's state and the counters decided locally.
    pub fn status(&self) -> LocalStatus {
        let (replicas, source) = self.in_force();
        LocalStatus {
            replicas,
            missing: self.missing(),
            source,
            kubernetes: self.kubernetes(),
            decisions: self.decisions.load(Relaxed),
            counters: self.counters.listed(),
            unsettled_counters: self.counters.held(),
            max_counters: self.counters.max_keys(),
            refused: self.counters.refused(),
            withheld: self.withheld.load(Relaxed),
            advertise: self.address.get().cloned().flatten(),
            peers: self.peers.known(),
            cut_off: self.peers.status(self.clock.now()),
            held: self.held.status(self.clock.now()),
        }
    }
}

/// Puts back the limits [`Local::reserve`] lowered.
pub fn restore(hits: &mut [Hit], configured: &Configured) {
    for (hit, limit) in hits.iter_mut().zip(configured) {
        hit.limit = *limit;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long since `at`. A time later than `now` (the wall clock stepped back)
/// counts as long past, so a step back ends the side channel's waits instead of
/// stretching them by the step.
fn since(now: Micros, at: Micros) -> Micros {
    now.checked_sub(at).unwrap_or(Micros::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;
    use std::collections::HashMap;

    use crate::store::{Board, Fallback, MemoryStore, Mode, Settlement, StoreError};

    const MINUTE: Micros = 60 * SECOND;

    fn limit(algorithm: Algorithm, requests: u64) -> Limit {
        Limit {
            algorithm,
            requests,
            window: MINUTE,
            burst: requests,
            phase: 0,
        }
    }

    fn hit(key: &str, limit: Limit) -> Hit {
        Hit {
            key: key.to_string(),
            placement: 7,
            limit,
            hits: 1,
            mode: Mode::Enforce,
            spend: Spend::IfAdmitted,
            fallback: Fallback::Admit,
            max_delay: crate::algorithm::NO_DEADLINE,
        }
    }

    /// Admitted one-hit requests on `h` until the first denial (at most 1000).
    fn admitted_until_denied(local: &Local, h: &Hit) -> u64 {
        (0..1000)
            .take_while(|_| local.decide(std::slice::from_ref(h)).admitted)
            .count() as u64
    }

    /// The store's verdict that `remaining` of `h`'s limit is left, for a minute.
    fn store_said(local: &Local, h: &Hit, remaining: u64) {
        let v = Verdicts {
            admitted: true,
            verdicts: vec![crate::algorithm::Verdict {
                admitted: true,
                remaining,
                reset: MINUTE,
                ..Default::default()
            }],
            now: None,
            failed: None,
        };
        local.remember(std::slice::from_ref(h), &v);
    }

    #[test]
    fn a_share_is_the_limit_divided_rounded_to_the_nearest_and_never_zero_from_some() {
        let l = limit(Algorithm::TokenBucket, 100);
        assert_eq!(share(&l, 3).requests, 33);
        assert_eq!(share(&l, 3).burst, 33);
        assert_eq!(share(&l, 1), l);
        assert_eq!(share(&limit(Algorithm::FixedWindow, 10), 4).requests, 3);
        assert_eq!(share(&limit(Algorithm::FixedWindow, 1), 3).requests, 1);
        assert_eq!(share(&limit(Algorithm::FixedWindow, 0), 3).requests, 0);
        // A count of 0 (never learned) is one replica, not a division by zero.
        assert_eq!(share(&l, 0).requests, 100);
        assert_eq!(share(&l, 3).window, MINUTE);
    }

    #[test]
    fn a_local_counter_starts_from_what_the_store_last_said_and_gets_a_fresh_share_next_window() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 4, 1000);
        local.tick();
        let h = hit("d|k=v", limit(Algorithm::FixedWindow, 100));
        // 40 of 100 used: this replica's part of it is 10 of its 25.
        store_said(&local, &h, 60);
        assert_eq!(admitted_until_denied(&local, &h), 15);
        clock.advance(MINUTE);
        assert_eq!(admitted_until_denied(&local, &h), 25);
        assert_eq!(local.status().decisions, 15 + 1 + 25 + 1);
    }

    #[test]
    fn a_counter_the_store_never_mentioned_starts_with_the_whole_share() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 3, 1000);
        let seen = hit("d|k=seen", limit(Algorithm::FixedWindow, 30));
        store_said(&local, &seen, 30);
        let other = hit("d|k=other", limit(Algorithm::SlidingWindowCounter, 30));
        assert_eq!(admitted_until_denied(&local, &other), 10);
    }

    #[test]
    fn a_rule_reloaded_to_another_algorithm_starts_from_the_stores_word_on_that_algorithms_counter()
    {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 3, 1000);
        local.tick();
        // The fixed window is spent in the store...
        let window = hit("d|k=v", limit(Algorithm::FixedWindow, 30));
        store_said(&local, &window, 0);
        // ...and the rule reloaded to a token bucket, whose counter there is fresh:
        // so is the share.
        let bucket = hit("d|k=v", limit(Algorithm::TokenBucket, 30));
        assert_eq!(admitted_until_denied(&local, &bucket), 10);
        // Reloaded back, the window is still spent.
        assert_eq!(admitted_until_denied(&local, &window), 0);
    }

    #[test]
    fn what_the_store_said_is_forgotten_once_its_reset_has_passed() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 2, 1000);
        local.tick();
        let h = hit("d|k=v", limit(Algorithm::FixedWindow, 20));
        store_said(&local, &h, 0);
        clock.advance(MINUTE);
        assert_eq!(admitted_until_denied(&local, &h), 10);
    }

    #[test]
    fn a_replica_that_never_reached_the_store_starts_with_its_share_spent() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 2, 1000);
        let h = hit("d|k=v", limit(Algorithm::FixedWindow, 20));
        assert_eq!(admitted_until_denied(&local, &h), 0);
        clock.advance(MINUTE);
        assert_eq!(admitted_until_denied(&local, &h), 10);
    }

    #[test]
    fn learning_the_replica_count_changes_the_share_and_its_source() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 1, 1000);
        assert_eq!(local.source(), ShareSource::Configured);
        local.learn(Replicas::default());
        assert_eq!(
            (local.replicas(), local.source()),
            (1, ShareSource::Configured)
        );
        local.learn(Replicas {
            live: 5,
            missing: 0,
        });
        assert_eq!((local.replicas(), local.source()), (5, ShareSource::Store));
        // The heartbeat's answer is the store answering: a counter no decision of
        // this replica ever reached the store for starts with a whole share, not
        // with its share spent.
        let h = hit("d|k=v", limit(Algorithm::FixedWindow, 50));
        assert_eq!(admitted_until_denied(&local, &h), 10);
    }

    fn live(live: u32) -> Replicas {
        Replicas { live, missing: 0 }
    }

    #[test]
    fn the_larger_of_the_stores_and_kubernetess_counts_is_in_force() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 2, 1000);
        let now = |l: &Local| (l.replicas(), l.source(), l.kubernetes());
        // Kubernetes alone: its count, even below the configured one.
        local.learn_from_kubernetes(1);
        assert_eq!(now(&local), (1, ShareSource::Kubernetes, Some(1)));
        local.learn(live(3));
        assert_eq!(now(&local), (3, ShareSource::Store, Some(1)));
        local.learn_from_kubernetes(4);
        assert_eq!(now(&local), (4, ShareSource::Kubernetes, Some(4)));
        let h = hit("d|k=v", limit(Algorithm::FixedWindow, 40));
        assert_eq!(admitted_until_denied(&local, &h), 10);
        // Equal counts: Kubernetes's, so its watch shows as working.
        local.learn(live(4));
        assert_eq!(local.source(), ShareSource::Kubernetes);
        // No ready endpoint: Kubernetes says nothing, the store's count stands.
        local.learn_from_kubernetes(0);
        assert_eq!(now(&local), (4, ShareSource::Store, None));
        let fresh = Local::new(Arc::new(clock), 2, 1000);
        fresh.learn_from_kubernetes(0);
        assert_eq!(now(&fresh), (2, ShareSource::Configured, None));
        assert_eq!(fresh.status().source, ShareSource::Configured);
    }

    /// A store that takes settlements by token, failing while told to: one that
    /// failed after taking the amount (a lost answer) when `lose` is set.
    #[derive(Default)]
    struct Settling {
        down: AtomicBool,
        lose: AtomicBool,
        tokens: Mutex<std::collections::HashSet<String>>,
        added: Mutex<HashMap<String, u64>>,
    }

    impl Settling {
        fn settle_one(&self, s: &Settlement) -> Result<bool, StoreError> {
            if self.down.load(Relaxed) {
                return Err(StoreError::BackingOff);
            }
            if !lock(&self.tokens).insert(s.token.clone()) {
                return Ok(false);
            }
            assert_eq!(
                (s.hit.spend, s.refund),
                (Spend::Always, 0),
                "a charge alone"
            );
            *lock(&self.added).entry(s.hit.key.clone()).or_default() += s.hit.hits;
            if self.lose.swap(false, Relaxed) {
                return Err(StoreError::Timeout);
            }
            Ok(true)
        }
    }

    impl Board for Settling {}

    impl Store for Settling {
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
            "settling"
        }
        async fn settle(&self, batch: &[Settlement]) -> Vec<Result<bool, StoreError>> {
            batch.iter().map(|s| self.settle_one(s)).collect()
        }
    }

    #[tokio::test]
    async fn local_spending_reaches_the_store_once_across_failed_and_lost_settlements() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 2, 1000);
        local.tick();
        let h = hit("d|k=v", limit(Algorithm::FixedWindow, 100));
        store_said(&local, &h, 100);
        for _ in 0..7 {
            assert!(local.decide(std::slice::from_ref(&h)).admitted);
        }
        let store = Settling::default();
        store.down.store(true, Relaxed);
        assert_eq!(local.settle(&store).await.failed, 1);
        assert_eq!(local.status().counters[0].unsettled, 7);
        // The shard answers, but its answer is lost: the amount keeps its token.
        store.down.store(false, Relaxed);
        store.lose.store(true, Relaxed);
        assert_eq!(local.settle(&store).await.failed, 1);
        // Spent meanwhile: settled under a token of its own, after the first.
        assert!(local.decide(std::slice::from_ref(&h)).admitted);
        let s = local.settle(&store).await;
        assert_eq!((s.already, s.added), (7, 0));
        let s = local.settle(&store).await;
        assert_eq!((s.already, s.added), (0, 1));
        assert_eq!(lock(&store.added).get("d|k=v"), Some(&8));
        // Settled, but decided a moment ago: it stays until idle.
        assert!(local.has_unsettled());
        clock.advance(SECOND);
        assert_eq!(local.settle(&store).await, Settled::default());
        assert!(!local.has_unsettled());
        assert!(local.status().counters.is_empty());
        assert_eq!(local.settle(&store).await, Settled::default());
    }

    #[tokio::test]
    async fn a_counter_only_denied_leaves_once_idle_and_starts_afresh_in_the_next_outage() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 2, 1000);
        local.tick();
        let h = hit("d|k=v", limit(Algorithm::FixedWindow, 100));
        store_said(&local, &h, 0);
        assert_eq!(admitted_until_denied(&local, &h), 0);
        let store = Settling::default();
        local.settle(&store).await;
        assert_eq!(local.status().unsettled_counters, 1, "still in its outage");
        clock.advance(SECOND);
        local.settle(&store).await;
        assert_eq!(local.status().unsettled_counters, 0);
        assert!(!local.has_unsettled());
        // Later, the store said 60 are left: the next outage starts from that.
        local.tick();
        store_said(&local, &h, 60);
        assert_eq!(admitted_until_denied(&local, &h), 30);
    }

    #[tokio::test]
    async fn a_new_episode_after_settlement_starts_from_the_store_again() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 2, 1000);
        local.tick();
        let h = hit("d|k=v", limit(Algorithm::FixedWindow, 100));
        store_said(&local, &h, 100);
        assert_eq!(admitted_until_denied(&local, &h), 50);
        clock.advance(SECOND);
        local.settle(&Settling::default()).await;
        // The store, with the 50 added and 30 more from elsewhere, says 20 are left.
        store_said(&local, &h, 20);
        assert_eq!(admitted_until_denied(&local, &h), 10);
    }

    #[test]
    fn a_reserved_limit_leaves_out_the_missing_replicas_shares_and_never_goes_below_zero() {
        let l = limit(Algorithm::TokenBucket, 20);
        let r = reserved(&l, 3, 1);
        assert_eq!((r.requests, r.burst, r.window), (13, 13, MINUTE));
        assert_eq!(reserved(&l, 4, 2).requests, 10);
        assert_eq!(reserved(&l, 3, 0), l);
        // A share is at least 1: two missing of three leave a limit of 1 nothing.
        assert_eq!(
            reserved(&limit(Algorithm::FixedWindow, 1), 3, 2).requests,
            0
        );
        // More missing than the count assumed (a configured count) leaves nothing.
        assert_eq!(reserved(&l, 1, 2).requests, 0);
    }

    #[test]
    fn hits_are_reserved_only_while_replicas_are_missing_and_refunds_never() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 1, 1000);
        let l = limit(Algorithm::FixedWindow, 30);
        let refund = Hit {
            spend: Spend::Refund,
            ..hit("d|k=b", l)
        };
        let mut hits = vec![hit("d|k=a", l), refund];
        local.learn(Replicas {
            live: 3,
            missing: 0,
        });
        assert!(local.reserve(&mut hits).is_empty());
        assert_eq!(hits[0].limit, l);

        local.learn(Replicas {
            live: 2,
            missing: 1,
        });
        assert_eq!((local.replicas(), local.missing()), (3, 1));
        assert_eq!(local.status().missing, 1);
        let configured = local.reserve(&mut hits);
        assert_eq!(hits[0].limit.requests, 20);
        assert_eq!(hits[1].limit, l, "a refund gives back what was taken");
        restore(&mut hits, &configured);
        assert_eq!(hits[0].limit, l);

        // Back: the reservation lifts.
        local.learn(Replicas {
            live: 3,
            missing: 0,
        });
        assert!(local.reserve(&mut hits).is_empty());
        assert_eq!(hits[0].limit, l);
    }

    /// One replica's way to the shared counters (a memory store standing in for
    /// Redis), which fails as a hung shard while `cut`; a settlement is the charge
    /// Redis would make.
    struct Reach {
        shared: Arc<MemoryStore>,
        cut: AtomicBool,
        /// Its shards (none listed: one), every counter on the last.
        shards: usize,
    }

    impl Reach {
        fn up(&self) -> Result<(), StoreError> {
            if self.cut.load(Relaxed) {
                Err(StoreError::Timeout)
            } else {
                Ok(())
            }
        }
    }

    impl Board for Reach {}

    impl Store for Reach {
        async fn decide(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
            self.up()?;
            self.shared.decide(hits).await
        }
        async fn peek(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
            self.up()?;
            self.shared.peek(hits).await
        }
        fn active_keys(&self) -> usize {
            0
        }
        fn name(&self) -> &'static str {
            "reach"
        }
        fn shards(&self) -> Vec<crate::store::ShardStatus> {
            vec![crate::store::ShardStatus::in_memory(); self.shards]
        }
        fn shard_of(&self, _: &Hit) -> usize {
            self.shards.saturating_sub(1)
        }
        async fn settle(&self, batch: &[Settlement]) -> Vec<Result<bool, StoreError>> {
            let mut out = Vec::new();
            for s in batch {
                out.push(match self.up() {
                    Ok(()) => self
                        .shared
                        .decide(&s.hits().collect::<Vec<_>>())
                        .await
                        .map(|_| true),
                    Err(e) => Err(e),
                });
            }
            out
        }
    }

    const SHARED: &str = "domain: d
failure_mode: local
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 30, algorithm: fixed_window}
---
domain: o
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 30, algorithm: fixed_window}
";

    type Replica = crate::limiter::Limiter<Reach>;

    fn replica(clock: &ManualClock, shared: &Arc<MemoryStore>) -> Replica {
        replica_of(clock, shared, 0)
    }

    /// A replica over a store of `shards` shards.
    fn replica_of(clock: &ManualClock, shared: &Arc<MemoryStore>, shards: usize) -> Replica {
        let docs = crate::policy::parse_str("p.yaml", SHARED).expect("parses");
        let policy = crate::policy::compile(docs).expect("compiles");
        let store = Reach {
            shared: shared.clone(),
            cut: AtomicBool::new(false),
            shards,
        };
        let settings = crate::limiter::Settings::default();
        crate::limiter::Limiter::new(
            Arc::new(arc_swap::ArcSwap::from_pointee(policy)),
            store,
            settings,
        )
        .with_clock(Arc::new(clock.clone()))
    }

    /// Requests of `user` in `domain`, `calls` of them round robin over `all`: how
    /// many were admitted.
    async fn admitted(all: &[Replica], domain: &str, user: &str, calls: usize) -> u64 {
        let entries = [("user", user)];
        let mut n = 0;
        for i in 0..calls {
            let o = all[i % all.len()]
                .decide(domain, &[crate::limiter::Descriptor::new(&entries, 1)])
                .await;
            n += u64::from(!o.over_limit);
        }
        n
    }

    fn count(all: &[Replica], live: u32, missing: u32) {
        for r in all {
            r.local().learn(Replicas { live, missing });
        }
    }

    #[tokio::test]
    async fn with_many_shards_a_lost_shards_calls_take_no_lock_shared_by_every_shard() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let shared = Arc::new(MemoryStore::new(Arc::new(clock.clone()), 1000));
        let one = [replica_of(&clock, &shared, 100)];
        count(&one, 1, 0);
        one[0].local().tick();
        one[0].store().cut.store(true, Relaxed);
        // Shard 99 lost: with no peer to ask, the share at once.
        assert_eq!(admitted(&one, "d", "u", 1).await, 1);
        // Its next calls are answered while the lock over every shard's standing is
        // held (a round being sent, the admin page being read).
        let answered = one[0].local().peers().while_locked(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(admitted(&one, "d", "u", 2))
        });
        assert_eq!(answered, Ok(2));
    }

    #[tokio::test]
    async fn a_replica_cut_off_from_the_store_gets_its_share_reserved_by_the_others_once_missing() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let shared = Arc::new(MemoryStore::new(Arc::new(clock.clone()), 1000));
        let all: Vec<Replica> = (0..3).map(|_| replica(&clock, &shared)).collect();
        count(&all, 3, 0);
        for r in &all {
            r.local().tick();
        }
        all[2].store().cut.store(true, Relaxed);
        // Before the others count it missing, the cut-off replica's third comes on
        // top of the limit the others decide in the store.
        assert_eq!(admitted(&all, "d", "early", 120).await, 40);
        // Counted missing, its third is reserved: the limit in all.
        count(&all[..2], 2, 1);
        assert_eq!(admitted(&all, "d", "late", 120).await, 30);
        // The others show what is left of the reserved limit.
        let entries = [("user", "fresh")];
        let o = all[0]
            .decide("d", &[crate::limiter::Descriptor::new(&entries, 1)])
            .await;
        assert_eq!(o.statuses[0].verdict.map(|v| v.remaining), Some(19));
        // A domain that is not local loses nothing.
        assert_eq!(admitted(&all[..2], "o", "other", 60).await, 30);

        // Back: its spending is added, the reservation lifts, the counts are exact.
        all[2].store().cut.store(false, Relaxed);
        count(&all, 3, 0);
        assert_eq!(all[2].local_tick().await.added, 20);
        assert_eq!(admitted(&all, "d", "late", 30).await, 0);
        assert_eq!(admitted(&all, "d", "after", 120).await, 30);
    }

    /// Every replica of `all` hears the others beat, each with an address.
    fn peering(all: &[Replica]) {
        let live = all
            .iter()
            .map(|r| {
                r.local().advertise(Some("127.0.0.1:8080".into()));
                (r.local().member(), 1_000)
            })
            .collect();
        let heard = Heard {
            replicas: Replicas {
                live: all.len() as u32,
                missing: 0,
            },
            shards: vec![crate::store::ShardBeats { shard: 0, live }],
        };
        for r in all {
            r.local().hear(&heard);
        }
    }

    #[tokio::test]
    async fn a_replica_cut_off_alone_admits_nothing_until_its_peers_answer_and_they_hold_its_share_a_while(
    ) {
        let clock = ManualClock::new(1_000 * MINUTE);
        let shared = Arc::new(MemoryStore::new(Arc::new(clock.clone()), 1000));
        let all: Vec<Replica> = (0..3).map(|_| replica(&clock, &shared)).collect();
        peering(&all);
        for r in &all {
            r.local().tick();
            assert_eq!(r.local().peers().known().len(), 2);
        }
        all[2].store().cut.store(true, Relaxed);
        // Waiting for the peers: denied, nothing spent, nothing owed.
        assert_eq!(admitted(&all[2..], "d", "k", 5).await, 0);
        let status = all[2].local().status();
        assert_eq!((status.withheld, status.unsettled_counters), (5, 0));
        assert_eq!(status.cut_off[0].standing, peers::Standing::Waiting);
        // The questions: both peers reach the shard and hold the cut one's share.
        let rounds = all[2].local().peers().due(clock.now());
        assert_eq!(rounds.len(), 1);
        let cut_id = all[2].local().replica_id().to_string();
        let mut answers = Vec::new();
        for r in &all[..2] {
            let reach = r.peer_cut_off(&cut_id, 0).await;
            assert!(reach.reached && reach.reserved);
            assert_eq!(r.local().missing(), 1);
            answers.push((r.local().replica_id().to_string(), peers::Answer::Reached));
        }
        clock.advance(5_000);
        all[2]
            .local()
            .peers()
            .answered(0, rounds[0].episode, &answers, clock.now());
        assert_eq!(
            all[2].local().status().cut_off[0].standing,
            peers::Standing::Alone
        );
        // From the first call after the cut: the limit in all.
        assert_eq!(admitted(&all, "d", "k", 120).await, 30);
        // Not renewed, the holds lapse and the reservation lifts.
        clock.advance(held::HOLD);
        for r in &all[..2] {
            r.local().tick();
            assert_eq!(r.local().missing(), 0);
            assert!(r.local().status().held.is_empty());
        }
        // Not a live peer, or this replica itself: nothing held.
        assert!(!all[0].peer_cut_off("stranger", 0).await.reserved);
        let own = all[0].local().replica_id().to_string();
        assert!(!all[0].peer_cut_off(&own, 0).await.reserved);
        assert_eq!(all[0].local().missing(), 0);
    }

    #[test]
    fn a_held_peer_is_counted_missing_once_as_the_heartbeat_takes_over_and_lifts_when_it_beats_again(
    ) {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 1, 1000);
        local.advertise(Some("10.0.0.1:8080".into()));
        let heard = |live: &[(&str, u64)], missing: u32| Heard {
            replicas: Replicas {
                live: live.len() as u32,
                missing,
            },
            shards: vec![crate::store::ShardBeats {
                shard: 0,
                live: live.iter().map(|(m, b)| (m.to_string(), *b)).collect(),
            }],
        };
        let me = local.member();
        local.hear(&heard(&[(&me, 100), ("cut@10.0.0.3:8080", 100)], 0));
        assert!(local.hold("cut", 0, 150));
        assert_eq!((local.replicas(), local.missing()), (2, 1));
        // The heartbeat counts it missing: still one, not two.
        local.hear(&heard(&[(&me, 1_100)], 1));
        assert_eq!((local.replicas(), local.missing()), (2, 1));
        // It stopped asking and beats again (after it was reached): live, nothing
        // reserved.
        clock.advance(held::QUIET);
        local.hear(&heard(&[(&me, 2_100), ("cut@10.0.0.3:8080", 2_050)], 0));
        assert_eq!(local.missing(), 0);
        assert!(local.status().held.is_empty());
    }

    #[test]
    fn a_held_peer_cut_off_from_one_shard_only_is_counted_missing_once() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let local = Local::new(Arc::new(clock.clone()), 1, 1000);
        local.advertise(Some("10.0.0.1:8080".into()));
        let me = local.member();
        let shard = |shard: usize, live: &[(&str, u64)]| crate::store::ShardBeats {
            shard,
            live: live.iter().map(|(m, b)| (m.to_string(), *b)).collect(),
        };
        let heard = |missing: u32, shards: Vec<crate::store::ShardBeats>| Heard {
            replicas: Replicas { live: 2, missing },
            shards,
        };
        let cut = "cut@10.0.0.3:8080";
        // Cut off from shard 1 only: held while shard 1 still lists it live...
        let beat = |at| [(me.as_str(), at), (cut, at)];
        local.hear(&heard(0, vec![shard(0, &beat(100)), shard(1, &beat(100))]));
        assert!(local.hold("cut", 1, 150));
        assert_eq!(local.missing(), 1);
        // ...and, once shard 1 counts it missing, counted there alone, though it
        // still beats on shard 0.
        local.hear(&heard(
            1,
            vec![shard(0, &beat(1_100)), shard(1, &[(&me, 1_100)])],
        ));
        assert!(local.hold("cut", 1, 1_150));
        assert_eq!(local.missing(), 1);
        // It stopped asking and beats on shard 1 again: nothing reserved.
        clock.advance(held::QUIET);
        local.hear(&heard(
            0,
            vec![shard(0, &beat(2_100)), shard(1, &beat(2_100))],
        ));
        assert_eq!(local.missing(), 0);
    }

    #[tokio::test]
    async fn with_no_peer_to_ask_a_cut_off_replica_decides_with_its_share_at_once() {
        let clock = ManualClock::new(1_000 * MINUTE);
        let shared = Arc::new(MemoryStore::new(Arc::new(clock.clone()), 1000));
        let one = replica(&clock, &shared);
        one.local().advertise(Some("127.0.0.1:8080".into()));
        count(std::slice::from_ref(&one), 3, 0);
        one.local().tick();
        one.store().cut.store(true, Relaxed);
        assert_eq!(admitted(std::slice::from_ref(&one), "d", "k", 20).await, 10);
        assert_eq!(
            one.local().status().cut_off[0].standing,
            peers::Standing::NoPeers
        );
    }
}
