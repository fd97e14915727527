//! Counter stores: where the state of every counter lives.
//!
//! A store takes one request's batch of hits and decides them together: every limit
//! is checked, and the new states are committed only if the request as a whole is
//! admitted ([`admitted`]). A request denied by one limit spends nothing of the
//! others. The memory store runs the algorithms directly; the Redis store runs Lua
//! scripts that mirror them.

use std::future::Future;
use std::sync::Arc;

use crate::algorithm::{self, Decision, Limit, Micros, State, Verdict};

pub mod board;
pub mod demand;
mod error;
pub mod memory;
pub mod probe;
pub mod redis;
mod report;
#[cfg(test)]
pub(crate) mod testkit;

pub use self::redis::RedisStore;
pub use board::{Board, Kind, Sentenced, Strike};
pub use demand::{Demand, MemoryDemand, Share};
pub use error::{ErrorKind, StoreError};
pub use memory::MemoryStore;
pub use probe::{Probe, StoreCall};
pub use report::{LastError, Report, ShardState, ShardStatus};

/// Most hits one hit may carry (a request's `hits_addend`, refused past it): 2^50,
/// the most a counter holds. The Redis scripts clamp every number to it, a charge of
/// it already exhausts any limit, and sums of larger ones overflow.
pub const MAX_HITS: u64 = 1 << 50;

/// How a hit's verdict counts towards the request's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Denial denies the request.
    Enforce,
    /// Reported, never denies (`shadow_mode`).
    Shadow,
    /// Denies only when every quota hit of the request is denied (`quota_mode`).
    Quota,
}

/// One counter touched by a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// The counter's key: domain, rule path and values (long values hashed).
    pub key: String,
    /// The value that places the key on a shard: the key itself, or the `shard_by`
    /// entry's value so one tenant's counters live together. 0 for a store that
    /// does not place keys ([`Store::places_keys`]).
    pub placement: u64,
    pub limit: Limit,
    /// Hits to add; 0 checks without counting.
    pub hits: u64,
    pub mode: Mode,
    /// Whether the hits are spent only with the request's admission, or always (a
    /// charge).
    pub spend: Spend,
    /// The answer when the store cannot keep this hit's counter (a full memory
    /// store's new key).
    pub fallback: Fallback,
    /// leaky_bucket: the longest its answer may be held for its turn, the caller's
    /// deadline less a margin ([`algorithm::decide_within`]); a later turn is denied
    /// and not taken. [`algorithm::NO_DEADLINE`] for a caller without one. The other
    /// algorithms ignore it.
    pub max_delay: Micros,
}

/// When a hit's counter is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Spend {
    /// Only if the request as a whole is admitted ([`admitted`]): a request denied by
    /// one limit spends nothing of the others.
    #[default]
    IfAdmitted,
    /// Always, whole, even past the limit (a cost reported after the response,
    /// [`algorithm::charge`]): what exceeds the limit is owed.
    Always,
    /// Given back (Envoy's `is_negative_hits`, [`algorithm::refund`]), floored at an
    /// empty counter, always, and never denied.
    Refund,
}

impl Spend {
    /// Whether the hit's state is stored whatever the request's fate. A batch holds
    /// such hits only, or none (the service's rule); the stores rely on it.
    pub fn always(self) -> bool {
        self != Spend::IfAdmitted
    }
}

impl Hit {
    /// This hit's decision on `state` at `now`, as its [`Spend`] makes it.
    pub fn decide(&self, state: Option<&State>, now: Micros) -> Decision {
        match self.spend {
            Spend::IfAdmitted => {
                algorithm::decide_within(&self.limit, state, now, self.hits, self.max_delay)
            }
            Spend::Always => algorithm::charge(&self.limit, state, now, self.hits),
            Spend::Refund => algorithm::refund(&self.limit, state, now, self.hits),
        }
    }

    /// [`Hit::decide`] on a state the store keeps, changed where it is
    /// ([`algorithm::decide_in_place`]): `None` where that does not apply (another
    /// algorithm, a charge or a refund), and the store then uses [`Hit::decide`].
    pub fn decide_in_place(
        &self,
        state: &mut State,
        now: Micros,
    ) -> Option<(Verdict, algorithm::Change)> {
        if self.spend != Spend::IfAdmitted {
            return None;
        }
        algorithm::decide_in_place(&self.limit, state, now, self.hits)
    }

    /// Whether this hit's next state is stored, given the request's fate.
    pub fn spent(&self, admitted: bool) -> bool {
        admitted || self.spend.always()
    }
}

/// How a store answers a hit whose counter it cannot keep or reach; the limiter sets
/// it from the domain's failure mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// A key it cannot keep ([`StoreError::Full`]) or a counter on a shard that
    /// fails (or hangs past the caller's wait): the hit is lifted, and the
    /// request's other hits still decide it and are spent if it is admitted
    /// ([`Verdicts::failed`]). `failure_mode: open`.
    #[default]
    Admit,
    /// Denied; a counter on a shard that fails fails the whole request, and a key
    /// it cannot keep is denied and named in [`Verdicts::failed`], which the
    /// limiter answers as a failed shard (`failure_mode: closed`).
    Deny,
    /// As `Admit` for a key it cannot keep; a counter on a shard that fails fails the
    /// whole request, which the limiter then decides in memory (`failure_mode: local`),
    /// where a key that cannot be kept either is lifted too.
    Local,
}

/// A batch's outcome: one verdict per hit, in order, and the request's fate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verdicts {
    pub admitted: bool,
    pub verdicts: Vec<Verdict>,
    /// The time the store decided at, on the process clock, when it read one (the
    /// memory store does; Redis decides on Redis's clock). Metrics reuse it rather
    /// than read the clock again.
    pub now: Option<Micros>,
    /// Hits the store could not decide while it decided the others: their shard
    /// failed, or did not answer within the caller's wait (only for hits whose
    /// fallback is [`Fallback::Admit`]), or their keys could not be kept (any
    /// fallback). `None`, and nothing allocated, when every hit was decided.
    pub failed: Option<Failed>,
}

/// The hits of a batch a store could not decide ([`Verdicts::failed`]). They were
/// taken as admitted for the request's fate, so the others decided it: denied, it
/// spent nothing anywhere; admitted, the others were spent. Their verdicts are
/// placeholders, admitted with no limit in sight: nothing to show or remember. A key
/// not kept with [`Fallback::Deny`] is the exception: taken as denied, its verdict
/// a denial that the limiter does not show either (it answers as a failed shard).
#[derive(Debug, Clone, PartialEq)]
pub struct Failed {
    /// Why the first of them could not be decided.
    pub error: StoreError,
    /// Their indexes in the batch, ascending.
    pub hits: Vec<usize>,
}

impl Failed {
    /// Whether the hit at `index` was not decided.
    pub fn contains(&self, index: usize) -> bool {
        self.hits.binary_search(&index).is_ok()
    }

    /// The verdict that stands for an undecided hit.
    pub fn placeholder() -> Verdict {
        Verdict {
            admitted: true,
            remaining: u64::MAX,
            ..Verdict::default()
        }
    }
}

/// Decides batches of hits. One call per request; implementations make at most one
/// round trip per shard. Penalty sentences are a [`Board`] apart: a store that shares
/// none takes its defaults.
pub trait Store: Board + Send + Sync + 'static {
    /// Decides `hits` together: all checked, all consumed only if [`admitted`].
    fn decide(&self, hits: &[Hit]) -> impl Future<Output = Result<Verdicts, StoreError>> + Send;

    /// [`Store::decide`] for a caller who waits `wait` from the first poll, telling
    /// `probe` (when given) of each round trip to a server; a store that makes none,
    /// as the memory store, ignores both.
    ///
    /// A store over several servers answers a request whose hits span them, when
    /// polled at or after `wait`, with what the servers that answered decided: the
    /// hits of one that has not answered are undecided, as if it had failed
    /// ([`Verdicts::failed`]). It sets no timer for that: the caller, who bounds the
    /// call anyway (the limiter's store timeout), polls it once more when its own
    /// timer of `wait` fires. A call on one server is left to that timer.
    fn decide_within(
        &self,
        hits: &[Hit],
        wait: std::time::Duration,
        probe: Option<&dyn Probe>,
    ) -> impl Future<Output = Result<Verdicts, StoreError>> + Send {
        let _ = (wait, probe);
        self.decide(hits)
    }

    /// What [`Store::decide`] would answer for `hits` now, without changing any
    /// counter: nothing is consumed, created, or kept alive (the admin API's
    /// Explain). A key repeated in `hits` sees the state its earlier hit would leave.
    fn peek(&self, hits: &[Hit]) -> impl Future<Output = Result<Verdicts, StoreError>> + Send;

    /// Number of live counters, for metrics.
    fn active_keys(&self) -> usize;

    /// A short name for metrics and logs (`memory`, `redis`).
    fn name(&self) -> &'static str;

    /// Whether the store reads [`Hit::placement`]; when not, the limiter does not
    /// compute it.
    fn places_keys(&self) -> bool {
        true
    }

    /// Whether a call can fail for want of the store (a server that can be away):
    /// only then has `failure_mode: local` anything to remember or decide.
    fn can_be_away(&self) -> bool {
        true
    }

    /// Whether one probe tells whether a shard answers, so that a peer can answer
    /// for it (`failure_mode: local`'s side channel): not for a Redis Cluster,
    /// whose counters all count as one shard spread over its nodes.
    fn probes_shards(&self) -> bool {
        self.can_be_away()
    }

    /// Counters dropped, and new keys refused, to keep memory bounded.
    fn evictions(&self) -> Evictions {
        Evictions::default()
    }

    /// Each shard's state, for `/debug/store` (off the request path).
    fn shards(&self) -> Vec<ShardStatus> {
        Vec::new()
    }

    /// Adds each of `batch` (a refund then a charge: spending decided elsewhere,
    /// `failure_mode: local`) to its counter once per token, both or neither,
    /// answering each in order: `Ok(false)` when the store had already taken that
    /// token. A store that every replica does not share has nothing to add to.
    fn settle(
        &self,
        batch: &[Settlement],
    ) -> impl Future<Output = Vec<Result<bool, StoreError>>> + Send {
        let n = batch.len();
        async move { vec![Ok(true); n] }
    }

    /// Counts this replica (`member`: its id, and its address for the others,
    /// [`member`]) as serving now, and answers how many replicas are: those that
    /// beat within `beats.live`, and those whose last beat is older but within
    /// `beats.hold`, with the live ones of each shard reached (`None` for a store no
    /// other replica shares).
    fn heartbeat(
        &self,
        _member: &str,
        _beats: Beats,
    ) -> impl Future<Output = Result<Option<Heard>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// Takes this replica (`member`, as it beats) out of the count at once: it
    /// stops cleanly, so the others need not wait out its hold.
    fn leave(&self, _member: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// The shard `hit`'s counter lives on, as [`Store::shards`] lists them. Read
    /// only when a call failed (`failure_mode: local`).
    fn shard_of(&self, _hit: &Hit) -> usize {
        0
    }

    /// Whether calls to `shard` have failed since its last success: one relaxed
    /// load, read only when a call failed and off the request path.
    fn shard_failing(&self, _shard: usize) -> bool {
        false
    }

    /// The name of `shard` (as [`Store::shards`] lists it, `host:port`) for a log
    /// line about a failed call; `None` when the store has no shards of its own (a
    /// Redis Cluster counts as one). Read only when a call failed; shared, so
    /// naming it allocates nothing.
    fn shard_name(&self, _shard: usize) -> Option<Arc<str>> {
        None
    }

    /// Asks `shard` now, within the store timeout, whether it answers: its own
    /// clock in milliseconds (what its heartbeat set is scored by). Off the request
    /// path: a peer cut off from the shard asks this replica to check.
    fn reach(&self, _shard: usize) -> impl Future<Output = Result<u64, StoreError>> + Send {
        async { Ok(0) }
    }
}

/// Spending decided elsewhere (`failure_mode: local`), to add to its counter once
/// ([`Store::settle`]): `refund` hits given back first, then the charge.
#[derive(Debug, Clone, PartialEq)]
pub struct Settlement {
    /// The charge: the counter's hit, carrying the amount (0 for a refund alone).
    pub hit: Hit,
    /// Hits given back before the charge, as a refund ([`Spend::Refund`]: floored
    /// at an empty counter). The order matters at that floor, so one token covers
    /// both and the store applies them together.
    pub refund: u64,
    /// Marks the amount as taken: the store adds nothing for a token it has seen.
    pub token: String,
}

impl Settlement {
    /// The hits the store applies for it, in order: the refund, then the charge;
    /// none of no hits.
    pub fn hits(&self) -> impl Iterator<Item = Hit> + '_ {
        let refund = (self.refund > 0).then(|| Hit {
            hits: self.refund,
            spend: Spend::Refund,
            ..self.hit.clone()
        });
        let charge = (self.hit.hits > 0).then(|| self.hit.clone());
        refund.into_iter().chain(charge)
    }
}

/// A heartbeat's member: the replica's id, then `@` and the address where the
/// others reach its HTTP server when it has one. A member without `@` (a replica
/// of an older version, or one that advertises nothing) has no address.
pub fn member(id: &str, address: Option<&str>) -> String {
    match address {
        Some(a) => format!("{id}@{a}"),
        None => id.to_string(),
    }
}

/// A member's id and address ([`member`]).
pub fn parse_member(member: &str) -> (&str, Option<&str>) {
    match member.split_once('@') {
        Some((id, address)) if !address.is_empty() => (id, Some(address)),
        Some((id, _)) => (id, None),
        None => (member, None),
    }
}

/// What a heartbeat heard ([`Store::heartbeat`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Heard {
    /// The largest count any shard holds.
    pub replicas: Replicas,
    /// Each shard that answered, with the members that beat on it within the
    /// live span.
    pub shards: Vec<ShardBeats>,
}

/// One shard's heartbeat set as a beat read it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardBeats {
    /// The shard, as [`Store::shards`] lists them.
    pub shard: usize,
    /// The live members ([`member`]) and their latest beats, on the shard's clock
    /// (ms).
    pub live: Vec<(String, u64)>,
}

/// How long a heartbeat counts ([`Store::heartbeat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beats {
    /// A replica that beat within this is live.
    pub live: std::time::Duration,
    /// A replica whose last beat is older than `live` but within this is missing:
    /// it may be serving without reaching the store.
    pub hold: std::time::Duration,
}

/// The replicas a shared store counts ([`Store::heartbeat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replicas {
    /// Beat within the live span (the caller included).
    pub live: u32,
    /// Beat within the hold but not the live span.
    pub missing: u32,
}

impl Replicas {
    /// Live and missing: the replicas a limit is shared by.
    pub fn total(self) -> u32 {
        self.live.saturating_add(self.missing)
    }
}

/// A shared store is a store: the server keeps a handle for housekeeping.
impl<S: Store> Store for Arc<S> {
    fn decide(&self, hits: &[Hit]) -> impl Future<Output = Result<Verdicts, StoreError>> + Send {
        (**self).decide(hits)
    }

    fn decide_within(
        &self,
        hits: &[Hit],
        wait: std::time::Duration,
        probe: Option<&dyn Probe>,
    ) -> impl Future<Output = Result<Verdicts, StoreError>> + Send {
        (**self).decide_within(hits, wait, probe)
    }

    fn peek(&self, hits: &[Hit]) -> impl Future<Output = Result<Verdicts, StoreError>> + Send {
        (**self).peek(hits)
    }

    fn active_keys(&self) -> usize {
        (**self).active_keys()
    }

    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn places_keys(&self) -> bool {
        (**self).places_keys()
    }

    fn can_be_away(&self) -> bool {
        (**self).can_be_away()
    }

    fn probes_shards(&self) -> bool {
        (**self).probes_shards()
    }

    fn evictions(&self) -> Evictions {
        (**self).evictions()
    }

    fn shards(&self) -> Vec<ShardStatus> {
        (**self).shards()
    }

    fn settle(
        &self,
        batch: &[Settlement],
    ) -> impl Future<Output = Vec<Result<bool, StoreError>>> + Send {
        (**self).settle(batch)
    }

    fn heartbeat(
        &self,
        member: &str,
        beats: Beats,
    ) -> impl Future<Output = Result<Option<Heard>, StoreError>> + Send {
        (**self).heartbeat(member, beats)
    }

    fn leave(&self, member: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).leave(member)
    }

    fn shard_of(&self, hit: &Hit) -> usize {
        (**self).shard_of(hit)
    }

    fn shard_failing(&self, shard: usize) -> bool {
        (**self).shard_failing(shard)
    }

    fn shard_name(&self, shard: usize) -> Option<Arc<str>> {
        (**self).shard_name(shard)
    }

    fn reach(&self, shard: usize) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).reach(shard)
    }
}

/// What a store bounded in keys (the memory store at `--max-keys`) has given up, by
/// reason, since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Evictions {
    /// Counters whose state had expired (they carried nothing), dropped to make room
    /// before the periodic sweep did.
    pub expired: u64,
    /// Counters not used within their window and not denying, dropped to make room:
    /// their keys start afresh.
    pub idle: u64,
    /// New keys not kept because every counter of their shard was in use or
    /// denying; each was answered by its failure mode (lifted, or denied).
    pub refused: u64,
}

impl Evictions {
    /// Each count with its reason, as `sluice_evictions_total{reason}` names it.
    pub fn by_reason(&self) -> [(&'static str, u64); 3] {
        [
            ("expired", self.expired),
            ("idle", self.idle),
            ("refused", self.refused),
        ]
    }
}

/// Whether a request is admitted given each hit's verdict: no enforced limit denies
/// it, and not every quota limit denies it. Both stores (and the Lua scripts) use
/// exactly this rule.
pub fn admitted(modes: impl Iterator<Item = Mode>, verdicts: &[Verdict]) -> bool {
    let mut quota_seen = false;
    let mut quota_ok = false;
    for (mode, v) in modes.zip(verdicts) {
        match mode {
            Mode::Enforce if !v.admitted => return false,
            Mode::Quota => {
                quota_seen = true;
                quota_ok |= v.admitted;
            }
            _ => {}
        }
    }
    !quota_seen || quota_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(admitted: bool) -> Verdict {
        Verdict {
            admitted,
            ..Verdict::default()
        }
    }

    #[test]
    fn a_member_carries_an_address_and_a_bare_id_has_none() {
        let m = member("00ab", Some("10.0.0.7:8080"));
        assert_eq!(m, "00ab@10.0.0.7:8080");
        assert_eq!(parse_member(&m), ("00ab", Some("10.0.0.7:8080")));
        assert_eq!(parse_member("00ab"), ("00ab", None));
        assert_eq!(member("00ab", None), "00ab");
        assert_eq!(parse_member("00ab@"), ("00ab", None));
        assert_eq!(
            parse_member("00ab@[::1]:8080"),
            ("00ab", Some("[::1]:8080"))
        );
    }

    #[test]
    fn one_enforced_denial_denies_the_request() {
        let modes = [Mode::Enforce, Mode::Enforce];
        assert!(!admitted(modes.into_iter(), &[v(true), v(false)]));
        assert!(admitted(modes.into_iter(), &[v(true), v(true)]));
    }

    #[test]
    fn shadow_denial_never_denies() {
        let modes = [Mode::Shadow, Mode::Enforce];
        assert!(admitted(modes.into_iter(), &[v(false), v(true)]));
    }

    #[test]
    fn quota_denies_only_when_every_quota_limit_is_over() {
        let modes = [Mode::Quota, Mode::Quota];
        assert!(admitted(modes.into_iter(), &[v(false), v(true)]));
        assert!(!admitted(modes.into_iter(), &[v(false), v(false)]));
    }
}
