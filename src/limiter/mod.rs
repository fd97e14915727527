//! The decision path: a request's descriptors become rule hits, the store decides
//! them in one batch, and the verdicts become an [`Outcome`].
//!
//! Nothing here knows about gRPC or HTTP; `service/` adapts the wire formats to it.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};

use crate::algorithm::{Micros, Verdict, NO_DEADLINE};
use crate::clock::{Clock, SystemClock};
use crate::policy::{Entry, FailureMode, Layer, Policy, Rule};
use crate::store::{Fallback, Hit, Mode, Probe, Spend, Store, StoreError};

pub mod explain;
pub mod key;
pub mod local;
pub mod overrides;
pub mod penalty;
pub mod shed;

pub use overrides::Override;
use overrides::OverrideRules;
use penalty::Penalties;
use shed::Chance;

/// The least time kept back from a caller's deadline (see [`store_wait`]).
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(2);

/// The longest store wait that still lets the answer reach a caller who gives up
/// `left` from now: `left` less a fifth of it, and less at least
/// [`DEADLINE_MARGIN`]. The caller's timer started before it sent the call, and the
/// answer still has to leave sluice (after a Tokio timer that fires up to a
/// millisecond late) and cross the network; a fifth leaves room for both on a busy
/// node, where a tenth did not. Envoy's default 20 ms leaves 16 ms, so
/// the default `--store-timeout` of 15 ms still decides; a 50 ms deadline waits at
/// most 40 ms.
pub fn store_wait(left: Duration) -> Duration {
    left.saturating_sub((left / 5).max(DEADLINE_MARGIN))
}

/// Settings of the decision path, from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Failure mode of domains that do not set their own.
    pub failure_mode: FailureMode,
    /// Longest wait for the store before the failure mode decides.
    pub store_timeout: Duration,
    /// Which values are hashed in counter keys, and under what key.
    pub hashing: key::Hashing,
    /// What a denied request spends of its other limits.
    pub denied_spend: DeniedSpend,
    /// How precisely `duration_until_reset` is reported.
    pub resets: ResetResolution,
    /// How a store failure is answered.
    pub store_errors: StoreErrorAnswer,
    /// Replicas assumed to share a `local` domain's limits until the store tells
    /// (`--local-share-replicas`).
    pub local_replicas: u32,
    /// Most counters a `local` domain decides in memory while the store is away
    /// (`--max-keys`).
    pub max_keys: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            failure_mode: FailureMode::Open,
            store_timeout: Duration::from_millis(15),
            hashing: key::Hashing::default(),
            denied_spend: DeniedSpend::Nothing,
            resets: ResetResolution::Micros,
            store_errors: StoreErrorAnswer::FailureMode,
            local_replicas: 1,
            max_keys: 1_000_000,
        }
    }
}

/// What a request denied by one limit spends of its other limits
/// (`--denied-requests-spend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeniedSpend {
    /// Nothing: the request was not let through, so it costs nothing (sluice's
    /// default).
    #[default]
    Nothing,
    /// Its hits on every limit that admitted it, as envoyproxy/ratelimit counts
    /// unless `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`: one more store call,
    /// made only for denied requests.
    AdmittingLimits,
}

/// How `duration_until_reset` is reported (`--reset-resolution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResetResolution {
    /// To the microsecond (sluice's default).
    #[default]
    Micros,
    /// Rounded up to whole seconds, as envoyproxy/ratelimit answers.
    Seconds,
}

/// How a request is answered when the store fails (`--store-error-answer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreErrorAnswer {
    /// By the domain's failure mode (sluice's default).
    #[default]
    FailureMode,
    /// With an error (gRPC `UNKNOWN`, HTTP 500), as envoyproxy/ratelimit answers, so
    /// Envoy's `failure_mode_deny` decides.
    Error,
}

/// One request descriptor as the limiter sees it.
#[derive(Debug, Clone, Copy)]
pub struct Descriptor<'a, E> {
    pub entries: &'a [E],
    /// Hits to add; 0 checks without counting.
    pub hits: u64,
    /// Whether the hits are spent only if the request is admitted, or always (a
    /// charge: a cost reported after the response).
    pub spend: Spend,
    /// The request's own limit for this descriptor, in place of the matched one.
    pub limit: Option<Override>,
}

impl<'a, E> Descriptor<'a, E> {
    /// A descriptor without a `limit` override.
    pub fn new(entries: &'a [E], hits: u64) -> Self {
        Descriptor {
            entries,
            hits,
            spend: Spend::IfAdmitted,
            limit: None,
        }
    }
}

/// What happened to one descriptor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Status {
    /// The matched rule (after `replaces`), if any. With an override it is still
    /// the rule matched, under whose name the decision is counted in metrics.
    pub rule: Option<usize>,
    /// The descriptor's `limit` override, an index into [`Outcome::overrides`]: it
    /// decided in place of `rule` ([`Outcome::rule`]).
    pub limit_override: Option<usize>,
    /// Whether this descriptor reports OVER_LIMIT.
    pub over_limit: bool,
    /// The store's verdict, for limited rules that were decided.
    pub verdict: Option<Verdict>,
    /// The descriptor's hits (its `hits_addend`).
    pub hits: u64,
    /// How its hits spend: with the request's admission, always (a charge), or
    /// given back (a refund).
    pub spend: Spend,
    /// Whether a `penalty` ban denied this descriptor or started with it.
    pub ban: Ban,
    /// Denied by soft shedding (`shed`) although its limit had room.
    pub shed: bool,
    /// Decided against its penalty's tightened limit.
    pub tightened: bool,
    /// That tightening's factor (millionths): the answer states the limit so scaled.
    pub tighten_ppm: u32,
    /// When the matched rule carries several limits (`rate_limits`): the one of its
    /// [`Rule::also`] whose verdict this status reports, the one nearest its limit
    /// ([`Outcome::rule`] answers with it). `None` when it is the matched rule's own.
    pub answered_by: Option<usize>,
}

impl Status {
    /// A descriptor of `hits`, spent as `spend`, not yet matched or decided.
    fn undecided(hits: u64, spend: Spend) -> Self {
        Status {
            rule: None,
            limit_override: None,
            over_limit: false,
            verdict: None,
            hits,
            spend,
            ban: Ban::None,
            shed: false,
            tightened: false,
            tighten_ppm: 0,
            answered_by: None,
        }
    }
}

/// A descriptor's part in a `penalty` (see [`penalty`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ban {
    #[default]
    None,
    /// Denied without a store call: the key is serving a ban.
    Active,
    /// Denied without a store call: the key is on the block list.
    Blocked,
    /// Denied by its limit, and this denial started a sentence (a ban, a
    /// tightening or a block).
    Started,
}

/// Why a block could not be put or lifted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// The domain or entries name no limited rule.
    #[error("{0}")]
    Unknown(String),
    /// The entries' rule never denies (shadow or quota mode), so a block there
    /// would deny nothing.
    #[error("{0}")]
    NotEnforced(String),
    /// The store holding the shared block list failed.
    #[error("the store did not take it: {0}")]
    Store(String),
}

/// A replica's answer to a peer cut off from a shard ([`Limiter::peer_cut_off`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerReach {
    /// This replica reached the shard just now.
    pub reached: bool,
    /// And it reserves the peer's share.
    pub reserved: bool,
}

/// Why the store's answer was not used, for the whole request or for the
/// descriptors whose shard failed.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreFailure {
    pub error: String,
    pub mode: FailureMode,
    /// How the request must be answered: by `mode`, or with an error.
    pub answer: StoreErrorAnswer,
    /// The store's name, for metrics and logs.
    pub store: &'static str,
    /// The store decided the request's other limits (`failure_mode: open` over
    /// shards of which some failed, or a key the memory store could not keep): only
    /// the descriptors without a verdict were answered by `mode`, and the decided
    /// ones still deny.
    pub partial: bool,
    /// No room to keep a key's counter (`--max-keys`), not a failing store: the
    /// store logs when its refusals start and end.
    pub full: bool,
}

/// The limiter's answer to one request.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The policy the request was decided with; statuses refer to its rules.
    pub policy: Arc<Policy>,
    pub domain_known: bool,
    pub over_limit: bool,
    pub statuses: Vec<Status>,
    /// How long to hold an OK answer (leaky_bucket queues).
    pub delay: Micros,
    /// Set when the store failed and the failure mode answered, for every
    /// descriptor or (when [`StoreFailure::partial`]) for those without a verdict.
    pub failure: Option<StoreFailure>,
    /// (status index, key) of each denied descriptor, the key being its values as the
    /// top-offenders view shows them ([`key::offender`]). Empty when nothing is denied.
    pub offenders: Vec<(usize, String)>,
    /// When the store decided, if it read the process clock ([`Verdicts::now`]).
    ///
    /// [`Verdicts::now`]: crate::store::Verdicts::now
    pub now: Option<Micros>,
    /// The rules of the request's `limit` overrides ([`Status::limit_override`]).
    pub overrides: Vec<Arc<Rule>>,
    /// Decided in this replica's memory with its share of the limits: the store
    /// could not be reached and the domain's failure mode is `local`.
    pub local: bool,
}

impl Outcome {
    /// A request matched (or not: `domain_known`) and not yet decided.
    fn undecided(
        policy: Arc<Policy>,
        domain_known: bool,
        statuses: Vec<Status>,
        overrides: Vec<Arc<Rule>>,
    ) -> Self {
        Outcome {
            policy,
            domain_known,
            over_limit: false,
            statuses,
            delay: 0,
            failure: None,
            offenders: Vec::new(),
            now: None,
            overrides,
            local: false,
        }
    }

    /// The rule that decided `status`: its override's, else the matched rule (or,
    /// for a rule with several limits, the one its answer describes).
    pub fn rule(&self, status: &Status) -> Option<&Rule> {
        effective(&self.policy, &self.overrides, status)
    }

    /// Whether `--shadow-mode` alone kept this answer OK: a limit it put in shadow
    /// is over (every one of the request's quota-mode limits, for those), as
    /// envoyproxy/ratelimit counts `global_shadow_mode`.
    pub fn shadowed_denial(&self) -> bool {
        if !self.policy.defaults.shadow_mode || self.over_limit {
            return false;
        }
        let (mut quota, mut quota_over) = (0, 0);
        for s in &self.statuses {
            let Some(rule) = self.rule(s).filter(|r| r.limit.is_some()) else {
                continue;
            };
            if rule.quota_mode {
                quota += 1;
                quota_over += usize::from(s.over_limit);
            } else if s.over_limit && rule.global_shadow {
                return true;
            }
        }
        quota > 0 && quota == quota_over
    }

    /// The store's error, when it failed and the request is to be answered with an
    /// error rather than by the failure mode ([`StoreErrorAnswer::Error`]). A request
    /// that a decided limit denies is answered OVER_LIMIT all the same: the error
    /// stands only for what the failure mode would have answered.
    pub fn error_answer(&self) -> Option<&str> {
        let f = self
            .failure
            .as_ref()
            .filter(|f| f.answer == StoreErrorAnswer::Error)?;
        let decided_denial = || {
            self.statuses
                .iter()
                .any(|s| s.over_limit && s.verdict.is_some())
        };
        if f.partial && self.over_limit && decided_denial() {
            return None;
        }
        Some(f.error.as_str())
    }

    /// Whether the store decided the request, wholly or but for the descriptors whose
    /// shard failed (which carry no verdict): its verdicts stand, and deny.
    pub fn store_decided(&self) -> bool {
        self.failure.as_ref().is_none_or(|f| f.partial)
    }

    /// The top-offenders key of the denied descriptor at `status`.
    pub fn offender(&self, status: usize) -> Option<&str> {
        self.offenders
            .iter()
            .find(|(i, _)| *i == status)
            .map(|(_, k)| k.as_str())
    }
}

/// Indices into a request's statuses (the status of each hit, its order): inline
/// for the few descriptors a request carries, so planning allocates only the hits.
type Statuses = smallvec::SmallVec<[usize; 8]>;

/// Decides requests against the current policy and a store.
#[derive(Debug)]
pub struct Limiter<S> {
    policy: Arc<ArcSwap<Policy>>,
    store: S,
    settings: Settings,
    penalties: Penalties,
    overrides: OverrideRules,
    chance: Arc<dyn Chance>,
    /// Places calendar windows (read only for calendar rules) and times penalties.
    clock: Arc<dyn Clock>,
    /// `failure_mode: local`: this replica's share while the store is away.
    local: local::Local,
}

impl<S: Store> Limiter<S> {
    pub fn new(policy: Arc<ArcSwap<Policy>>, store: S, settings: Settings) -> Self {
        Limiter {
            policy,
            store,
            penalties: Penalties::new(Arc::new(SystemClock), penalty::DEFAULT_MAX_TRACKED),
            overrides: OverrideRules::default(),
            chance: Arc::new(shed::ThreadChance),
            clock: Arc::new(SystemClock),
            local: local::Local::new(
                Arc::new(SystemClock),
                settings.local_replicas,
                settings.max_keys,
            ),
            settings,
        }
    }

    /// Draws soft-shedding chances from `chance` (tests fix the seed).
    pub fn with_chance(mut self, chance: Arc<dyn Chance>) -> Self {
        self.chance = chance;
        self
    }

    /// Uses `clock` for penalties and to place calendar windows (the store keeps
    /// its own clock to decide by).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.penalties = Penalties::new(clock.clone(), penalty::DEFAULT_MAX_TRACKED);
        self.local = local::Local::new(
            clock.clone(),
            self.settings.local_replicas,
            self.settings.max_keys,
        );
        self.clock = clock;
        self
    }

    /// Whether some domain (or the flag's default) answers a store outage locally.
    pub fn uses_local(&self) -> bool {
        self.settings.failure_mode == FailureMode::Local
            || self
                .policy
                .load()
                .domains
                .values()
                .any(|d| d.failure_mode == Some(FailureMode::Local))
    }

    /// This replica's share of `local` domains' limits.
    pub fn local(&self) -> &local::Local {
        &self.local
    }

    /// Moves the local share's clock on and adds local spending to the store once
    /// it answers again. The server runs it every 100 ms.
    pub async fn local_tick(&self) -> local::Settled {
        self.local.tick();
        self.local.settle(&self.store).await
    }

    /// Counts this replica as serving in a shared store and learns how many are,
    /// and how many of those are missing. The server runs it every second;
    /// `Ok(false)` when the store shares nothing.
    pub async fn heartbeat(&self) -> Result<bool, StoreError> {
        match self
            .store
            .heartbeat(&self.local.member(), local::BEATS)
            .await?
        {
            Some(heard) => {
                self.local.hear(&heard);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Takes this replica out of a shared store's count as it stops cleanly, so
    /// the others do not hold its share back as if it were cut off.
    pub async fn leave(&self) -> Result<(), StoreError> {
        self.store.leave(&self.local.member()).await
    }

    /// The peer `replica` says it is cut off from `shard`: if this replica reaches
    /// the shard now, it reserves the peer's share (while the peer is live) until
    /// its word lapses. Off the request path; at most the store timeout.
    pub async fn peer_cut_off(&self, replica: &str, shard: usize) -> PeerReach {
        match self.store.reach(shard).await {
            Ok(at) => PeerReach {
                reached: true,
                reserved: self.local.hold(replica, shard, at),
            },
            Err(e) => {
                tracing::debug!(shard, error = %e, "local share: a peer is cut off from a shard this replica does not reach either");
                PeerReach {
                    reached: false,
                    reserved: false,
                }
            }
        }
    }

    /// Denial counts and bans of rules with a `penalty`.
    pub fn penalties(&self) -> &Penalties {
        &self.penalties
    }

    /// Which values are hashed where keys are shown.
    pub fn hashing(&self) -> &key::Hashing {
        &self.settings.hashing
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// What to answer when the store cannot (a domain may override it).
    pub fn failure_mode(&self) -> FailureMode {
        self.settings.failure_mode
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Decides one request. The descriptors are already validated by the caller.
    pub async fn decide<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
    ) -> Outcome {
        self.decide_within(domain, descriptors, None).await
    }

    /// As [`Limiter::decide`], for a caller who gives up `left` from now: the store
    /// is waited for at most [`store_wait`] of it when that is shorter than the store
    /// timeout, and no leaky_bucket turn is taken that comes past
    /// [`Limiter::hold_budget`] ([`Hit::max_delay`]).
    pub async fn decide_within<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
        left: Option<Duration>,
    ) -> Outcome {
        self.decide_probed(domain, descriptors, left, None).await
    }

    /// The longest a leaky_bucket answer may be held for a caller who gives up
    /// `left` from now: `left` less the store's longest call and
    /// [`DEADLINE_MARGIN`] twice (a timer late, the answer on its way), or less a
    /// fifth of it when that is smaller. So Envoy's default 20 ms holds 16 ms, as
    /// [`store_wait`] waits, and a 6 s timeout holds all but about 20 ms of it.
    pub fn hold_budget(&self, left: Duration) -> Micros {
        let call = self.settings.store_timeout.min(store_wait(left));
        let margin = (left / 5).min(call + DEADLINE_MARGIN * 2);
        let hold = left.saturating_sub(margin.max(DEADLINE_MARGIN));
        Micros::try_from(hold.as_micros()).unwrap_or(NO_DEADLINE)
    }

    /// As [`Limiter::decide_within`], telling `probe` of each round trip the store
    /// makes for it (the service traces them).
    pub async fn decide_probed<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
        left: Option<Duration>,
        probe: Option<&dyn Probe>,
    ) -> Outcome {
        // A guard, not a clone: the one reference count the outcome needs is taken
        // once, below, on a count every core's requests write.
        let guard = self.policy.load();
        let policy: &Policy = &guard;
        let mut statuses: Vec<Status> = descriptors
            .iter()
            .map(|d| Status::undecided(d.hits, d.spend))
            .collect();
        let Some(dom) = policy.domain(domain) else {
            return Outcome::undecided(Guard::into_inner(guard), false, statuses, Vec::new());
        };

        // A leaky_bucket answer held past the caller's deadline would reach a
        // caller that has given up: such a turn is not taken.
        let max_delay = left.map_or(NO_DEADLINE, |l| self.hold_budget(l));
        let wait = left.map(store_wait);
        let (overrides, order, mut hits, failure_mode) =
            self.plan(policy, dom, domain, descriptors, max_delay, &mut statuses);

        let mut outcome = Outcome::undecided(Guard::into_inner(guard), true, statuses, overrides);
        if hits.is_empty() {
            return outcome;
        }
        // A banned or blocked key is denied at once, without asking the store.
        if penalty::apply_sentences(&self.penalties, &order, &mut hits, &mut outcome) {
            self.note_offenders(domain, descriptors, &mut outcome, &order, &hits);
            return outcome;
        }

        // Other domains, and a store that cannot be away, pay nothing for this:
        // `configured` stays empty and inline.
        let decide_locally = failure_mode == FailureMode::Local && self.store.can_be_away();
        let configured = if decide_locally {
            self.local.reserve(&mut hits)
        } else {
            local::Configured::new()
        };
        let decided = self.ask_store(&hits, wait, probe).await;
        let decided = if decide_locally {
            self.local_answer(&mut hits, &configured, decided, &mut outcome)
        } else {
            decided
        };
        self.settle(&mut outcome, &order, &hits, decided, failure_mode);
        if outcome.over_limit
            && outcome.store_decided()
            && !outcome.local
            && self.settings.denied_spend == DeniedSpend::AdmittingLimits
        {
            self.spend_denied(&order, &hits, &mut outcome, wait, probe)
                .await;
        }
        // Soft shedding draws a chance, so it is the decision's alone: an explanation
        // (which settles too) shows the limits as they stand.
        if outcome.store_decided() && !outcome.over_limit {
            self.shed(&order, &hits, &mut outcome);
        }
        if outcome.over_limit && outcome.store_decided() {
            let pending = self.note_offenders(domain, descriptors, &mut outcome, &order, &hits);
            // Counted in the store, which a local decision cannot reach in time.
            if !pending.is_empty() && !outcome.local {
                self.strike(pending, &mut outcome).await;
            }
        }
        outcome
    }

    /// Puts the key `entries` name in `domain` on the block list for `span`: in
    /// process, and in a store that shares sentences. The entries must match a
    /// limited rule.
    pub async fn block<E: Entry>(
        &self,
        domain: &str,
        entries: &[E],
        span: Micros,
    ) -> Result<penalty::ActiveBan, BlockError> {
        let (key, info, mode) = self.sentence_of(domain, entries)?;
        if mode != Mode::Enforce {
            let why = match mode {
                Mode::Quota => "quota_mode",
                _ => "shadow mode",
            };
            return Err(BlockError::NotEnforced(format!(
                "rule '{}' of domain '{domain}' is in {why}: it denies nothing, so a block \
                 there would not be enforced",
                info.rule
            )));
        }
        let text = penalty::encode_info(&info, penalty::Source::Operator);
        let shared = self.store.shares_sentences();
        if shared {
            let sentence = crate::store::Sentenced {
                key: key.clone(),
                kind: crate::store::Kind::Block,
                remaining: span,
                factor_ppm: 0,
                info: text,
                started: true,
            };
            self.store
                .sentence(&sentence)
                .await
                .map_err(|e| BlockError::Store(e.to_string()))?;
        }
        self.penalties.put(
            &key,
            crate::store::Kind::Block,
            span,
            0,
            info.clone(),
            penalty::Source::Operator,
            shared,
        );
        let now = self.penalties.now();
        Ok(penalty::ActiveBan {
            info,
            kind: crate::store::Kind::Block,
            source: penalty::Source::Operator,
            counter: key,
            until: now.saturating_add(span),
            remaining: span,
            factor_ppm: 0,
        })
    }

    /// Lifts the sentence of a counter key, here and in a store that shares
    /// sentences; whether one was in force.
    pub async fn unblock(&self, counter: &str) -> Result<bool, BlockError> {
        let mut lifted = false;
        if self.store.shares_sentences() {
            lifted = self
                .store
                .pardon(counter)
                .await
                .map_err(|e| BlockError::Store(e.to_string()))?;
        }
        Ok(self.penalties.lift(counter) || lifted)
    }

    /// The counter key `entries` name in `domain`, and who it is.
    pub fn sentence_key<E: Entry>(
        &self,
        domain: &str,
        entries: &[E],
    ) -> Result<(String, penalty::BanInfo), BlockError> {
        self.sentence_of(domain, entries)
            .map(|(key, info, _)| (key, info))
    }

    /// [`Limiter::sentence_key`], and whether its rule's denials deny.
    fn sentence_of<E: Entry>(
        &self,
        domain: &str,
        entries: &[E],
    ) -> Result<(String, penalty::BanInfo, Mode), BlockError> {
        let guard = self.policy.load();
        let policy: &Policy = &guard;
        let dom = policy
            .domain(domain)
            .ok_or_else(|| BlockError::Unknown(format!("no policy has domain '{domain}'")))?;
        let descriptors = [Descriptor::new(entries, 1)];
        let mut statuses = [Status::undecided(1, Spend::IfAdmitted)];
        let (overrides, _order, hits, _) = self.plan(
            policy,
            dom,
            domain,
            &descriptors,
            NO_DEADLINE,
            &mut statuses,
        );
        let Some(hit) = hits.into_iter().next() else {
            return Err(BlockError::Unknown(
                "the entries match no limited rule of the domain".to_string(),
            ));
        };
        let rule = effective(policy, &overrides, &statuses[0]).ok_or_else(|| {
            BlockError::Unknown("the entries match no limited rule of the domain".to_string())
        })?;
        let mut shown = String::new();
        key::offender(rule, entries, &self.settings.hashing, &mut shown);
        Ok((
            hit.key,
            penalty::BanInfo {
                domain: domain.to_string(),
                rule: rule.path.clone(),
                key: shown,
            },
            hit.mode,
        ))
    }

    /// Brings in the sentences of a store that shares them (other replicas'
    /// bans, operators' blocks and unblocks). The server runs it every second.
    pub async fn sync_sentences(&self) -> Result<(), StoreError> {
        if !self.store.shares_sentences() {
            return Ok(());
        }
        let list = self.store.sentences().await?;
        self.penalties.sync(&list);
        Ok(())
    }

    /// Counts denials in a store that shares sentences, and keeps the sentences it
    /// answers with. A failed count is logged: the denial stands, uncounted.
    async fn strike(&self, pending: Vec<penalty::Pending>, outcome: &mut Outcome) {
        for p in pending {
            let strike = p.strike();
            let call = self.store.strike(&strike);
            let answer = match tokio::time::timeout(self.settings.store_timeout, call).await {
                Ok(answer) => answer,
                Err(_) => Err(StoreError::Timeout),
            };
            match answer {
                Ok(Some(s)) => {
                    self.penalties.learn(&s);
                    if s.started {
                        penalty::mark_started(&mut outcome.statuses[p.status], s.kind, s.remaining);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "penalty count failed"),
            }
        }
    }

    /// Matches each descriptor (its rule, its override, `replaces`) into `statuses`
    /// and builds the hits of its limited rules, edge first, then service, then
    /// tenant: the overrides' rules, the status of each hit (a status once per limit
    /// of its rule, its own limit first), the hits, and the domain's failure mode.
    fn plan<E: Entry>(
        &self,
        policy: &Policy,
        dom: &crate::policy::Domain,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
        max_delay: Micros,
        statuses: &mut [Status],
    ) -> (Vec<Arc<Rule>>, Statuses, Vec<Hit>, FailureMode) {
        for (status, d) in statuses.iter_mut().zip(descriptors) {
            status.rule = dom.find(d.entries);
        }
        let mut overrides = Vec::new();
        for (status, d) in statuses.iter_mut().zip(descriptors) {
            let Some(limit) = d.limit else { continue };
            let layer = status
                .rule
                .map_or(Layer::default(), |r| policy.rule(r).layer);
            if let Some(rule) = self
                .overrides
                .rule(d.entries, layer, limit, &policy.defaults)
            {
                status.limit_override = Some(overrides.len());
                overrides.push(rule);
            }
        }
        drop_replaced(policy, statuses);

        // Limited rules become hits, edge first, then service, then tenant.
        let mut order: Statuses = (0..descriptors.len())
            .filter(|&i| {
                effective(policy, &overrides, &statuses[i]).is_some_and(|r| r.limit.is_some())
            })
            .collect();
        order.sort_by_key(|&i| effective(policy, &overrides, &statuses[i]).map(|r| r.layer));
        let mut hits = Vec::with_capacity(order.len());
        // The status of each hit: `order`, with a status repeated for each further
        // limit of its rule.
        let mut per_hit = Statuses::with_capacity(order.len());
        let places_keys = self.store.places_keys();
        let failure_mode = dom.failure_mode.unwrap_or(self.settings.failure_mode);
        let fallback = match failure_mode {
            FailureMode::Open => Fallback::Admit,
            FailureMode::Closed => Fallback::Deny,
            FailureMode::Local => Fallback::Local,
        };
        for &i in &order {
            let Some(rule) = effective(policy, &overrides, &statuses[i]) else {
                continue;
            };
            let Some(limit) = rule.limit_at(|| self.clock.now()) else {
                continue;
            };
            let mut key = String::with_capacity(64);
            if statuses[i].limit_override.is_some() {
                key::override_key(
                    domain,
                    descriptors[i].entries,
                    rule.unit,
                    &self.settings.hashing,
                    &mut key,
                );
            } else {
                key::counter_key(
                    domain,
                    rule,
                    descriptors[i].entries,
                    &self.settings.hashing,
                    &mut key,
                );
            }
            let placement = if places_keys {
                placement(dom.shard_by.as_deref(), descriptors[i].entries, &key)
            } else {
                0
            };
            let mode = if rule.shadow_mode {
                Mode::Shadow
            } else if rule.quota_mode {
                Mode::Quota
            } else {
                Mode::Enforce
            };
            hits.push(Hit {
                key,
                placement,
                limit,
                hits: descriptors[i].hits,
                mode,
                spend: descriptors[i].spend,
                fallback,
                max_delay,
            });
            per_hit.push(i);
            // The rule's other limits (`rate_limits`) follow its own, on its
            // placement and its key with the window added, so one store call (one
            // script per shard) decides them all.
            let own = hits.len() - 1;
            for &other in &rule.also {
                let other = policy.rule(other);
                let Some(other_limit) = other.limit_at(|| self.clock.now()) else {
                    continue;
                };
                let own = &hits[own];
                let mut other_key = String::with_capacity(own.key.len() + 24);
                other_key.push_str(&own.key);
                key::push_window(&mut other_key, other);
                let hit = Hit {
                    key: other_key,
                    limit: other_limit,
                    ..*own
                };
                hits.push(hit);
                per_hit.push(i);
            }
        }

        (overrides, per_hit, hits, failure_mode)
    }

    /// Writes the store's answer (or its failure, answered by `failure_mode`) into
    /// `outcome`'s statuses for the hits of `order`.
    fn settle(
        &self,
        outcome: &mut Outcome,
        order: &[usize],
        hits: &[Hit],
        decided: Result<crate::store::Verdicts, StoreError>,
        failure_mode: FailureMode,
    ) {
        match decided {
            Ok(decided) => {
                outcome.over_limit = !decided.admitted;
                outcome.now = decided.now;
                if let Some(failed) = &decided.failed {
                    outcome.failure = Some(self.failure(&failed.error, failure_mode, true));
                }
                // Which of its rule's limits the hit is: 0 for the rule's own, k for
                // its `also[k - 1]`.
                let mut nth = 0;
                for (n, ((&i, hit), verdict)) in
                    order.iter().zip(hits).zip(&decided.verdicts).enumerate()
                {
                    nth = if n > 0 && order[n - 1] == i {
                        nth + 1
                    } else {
                        0
                    };
                    if decided.failed.as_ref().is_some_and(|f| f.contains(n)) {
                        // Its shard failed (lifted: `open`), or its key was not kept:
                        // it shows what a request the failure mode answers shows,
                        // denied when `closed`. A rule's limits share a shard, so the
                        // whole status is.
                        if failure_mode == FailureMode::Closed && hit.mode != Mode::Shadow {
                            outcome.statuses[i].over_limit = true;
                        }
                        continue;
                    }
                    let also = match (nth, outcome.statuses[i].rule) {
                        (0, _) | (_, None) => None,
                        (k, Some(r)) => outcome.policy.rule(r).also.get(k - 1).copied(),
                    };
                    let global_shadow = hit.mode == Mode::Shadow
                        && effective(&outcome.policy, &outcome.overrides, &outcome.statuses[i])
                            .is_some_and(|r| r.global_shadow);
                    let status = &mut outcome.statuses[i];
                    let mut verdict = *verdict;
                    if verdict.admitted && !decided.admitted && hit.spend == Spend::IfAdmitted {
                        // Admitted by this limit but not consumed: the request was denied.
                        verdict.remaining = verdict.remaining.saturating_add(hit.hits);
                    }
                    if self.settings.resets == ResetResolution::Seconds {
                        verdict.reset = whole_seconds(verdict.reset);
                    }
                    // Shadow limits never deny: a rule's own shadow_mode reports OK, while
                    // under --shadow-mode alone the status tells the truth (as
                    // envoyproxy/ratelimit's SHADOW_MODE). A quota limit past its
                    // limit reports OVER_LIMIT even when the request is admitted (its
                    // other quota limits had room), as envoyproxy/ratelimit does.
                    let over_limit = !verdict.admitted
                        && match hit.mode {
                            Mode::Enforce | Mode::Quota => true,
                            Mode::Shadow => global_shadow,
                        };
                    if nth == 0 {
                        status.verdict = Some(verdict);
                        status.answered_by = None;
                        status.over_limit = over_limit;
                    } else {
                        // A further limit of the same rule: the status describes the
                        // limit nearest its end, as the headers pick a descriptor.
                        let nearer = status.verdict.is_none_or(|current| {
                            nearness(over_limit, &verdict) < nearness(status.over_limit, &current)
                        });
                        if nearer {
                            status.verdict = Some(verdict);
                            status.answered_by = also;
                        }
                        status.over_limit |= over_limit;
                    }
                    if decided.admitted {
                        outcome.delay = outcome.delay.max(verdict.delay);
                    }
                }
            }
            Err(error) => {
                let mode = failure_mode;
                outcome.over_limit = mode == FailureMode::Closed;
                for (&i, hit) in order.iter().zip(hits) {
                    outcome.statuses[i].over_limit = outcome.over_limit && hit.mode != Mode::Shadow;
                }
                outcome.failure = Some(self.failure(&error, mode, false));
            }
        }
    }

    /// The failure of `error`, answered by `mode`: for the whole request, or only
    /// for the hits the store could not decide (`partial`).
    fn failure(&self, error: &StoreError, mode: FailureMode, partial: bool) -> StoreFailure {
        StoreFailure {
            error: error.to_string(),
            mode,
            answer: self.settings.store_errors,
            store: self.store.name(),
            partial,
            full: *error == StoreError::Full,
        }
    }

    /// [`DeniedSpend::AdmittingLimits`]: a denied request spends its hits on the
    /// limits that admitted it, in a second store call of those hits alone, whose
    /// verdicts become their statuses. A failure of that call leaves the statuses as
    /// the denial wrote them (nothing spent).
    async fn spend_denied(
        &self,
        order: &[usize],
        hits: &[Hit],
        outcome: &mut Outcome,
        wait: Option<Duration>,
        probe: Option<&dyn Probe>,
    ) {
        let (at, spend): (Vec<usize>, Vec<Hit>) = order
            .iter()
            .zip(hits)
            .filter(|(&i, h)| {
                // A charge or a refund was spent whatever the request's fate.
                h.hits > 0
                    && h.spend == Spend::IfAdmitted
                    && outcome.statuses[i]
                        .verdict
                        .is_some_and(|v| v.admitted && !outcome.statuses[i].over_limit)
            })
            .map(|(&i, h)| (i, h.clone()))
            .unzip();
        if spend.is_empty() {
            return;
        }
        let Ok(decided) = self.ask_store(&spend, wait, probe).await else {
            return;
        };
        for (n, ((&i, hit), verdict)) in at.iter().zip(&spend).zip(&decided.verdicts).enumerate() {
            if decided.failed.as_ref().is_some_and(|f| f.contains(n)) {
                // Its shard failed since: left as the denial wrote it.
                continue;
            }
            let status = &mut outcome.statuses[i];
            let mut verdict = *verdict;
            if verdict.admitted && !decided.admitted {
                verdict.remaining = verdict.remaining.saturating_add(hit.hits);
            }
            if self.settings.resets == ResetResolution::Seconds {
                verdict.reset = whole_seconds(verdict.reset);
            }
            status.verdict = Some(verdict);
            status.over_limit = !verdict.admitted && hit.mode != Mode::Shadow;
        }
    }

    /// Soft shedding of an admitted request: each enforced limit with `shed` past its
    /// `from` may deny it. A charge or a refund is no request to shed: it was spent.
    fn shed(&self, order: &[usize], hits: &[Hit], outcome: &mut Outcome) {
        let policy = &outcome.policy;
        for (&i, hit) in order.iter().zip(hits) {
            if hit.mode != Mode::Enforce || hit.spend.always() {
                continue;
            }
            let status = &mut outcome.statuses[i];
            let Some(rule) = effective(policy, &outcome.overrides, status) else {
                continue;
            };
            if rule.shed.is_none() {
                continue;
            }
            let Some(verdict) = status.verdict.as_mut() else {
                continue;
            };
            if shed::decide(rule, verdict, &*self.chance) {
                status.shed = true;
                status.over_limit = true;
                outcome.over_limit = true;
            }
        }
        if outcome.over_limit {
            outcome.delay = 0;
        }
    }

    /// Fills `outcome.offenders` for denied descriptors and counts their denials
    /// towards penalties: here, or (returned) in a store that shares sentences.
    /// Runs only when the request is denied.
    fn note_offenders<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
        outcome: &mut Outcome,
        order: &[usize],
        hits: &[Hit],
    ) -> Vec<penalty::Pending> {
        let policy = outcome.policy.clone();
        let overrides = std::mem::take(&mut outcome.overrides);
        let shared = self.store.shares_sentences();
        let mut pending = Vec::new();
        for (n, (&i, hit)) in order.iter().zip(hits).enumerate() {
            // A rule's further limits (`rate_limits`) share its status: one offender,
            // counted under the rule's own key.
            if n > 0 && order[n - 1] == i {
                continue;
            }
            let status = &mut outcome.statuses[i];
            let Some(rule) = effective(&policy, &overrides, status) else {
                continue;
            };
            // A descriptor the failure mode answered is no offender.
            if !status.over_limit || (outcome.failure.is_some() && status.verdict.is_none()) {
                continue;
            }
            let mut shown = String::new();
            key::offender(
                rule,
                descriptors[i].entries,
                &self.settings.hashing,
                &mut shown,
            );
            // Shedding is soft: it never counts towards a penalty.
            if status.ban == Ban::None && hit.mode == Mode::Enforce && !status.shed {
                match (&rule.penalty, shared) {
                    (Some(p), true) => {
                        let info = || penalty::BanInfo {
                            domain: domain.to_string(),
                            rule: rule.path.clone(),
                            key: shown.clone(),
                        };
                        // A tightened key is still denied often: its further denials
                        // are counted here, and only a count that reaches `violations`
                        // goes to the store, so a flood from it is not a flood of
                        // store calls.
                        let reached = status.tightened
                            && self
                                .penalties
                                .deny(&hit.key, p, self.penalties.now(), info)
                                .is_some();
                        if !status.tightened || reached {
                            pending.push(penalty::Pending {
                                status: i,
                                key: hit.key.clone(),
                                penalty: *p,
                                reached,
                                info: penalty::encode_info(&info(), penalty::Source::Penalty),
                            });
                        }
                    }
                    (Some(_), false) => {
                        penalty::count_denial(&self.penalties, domain, rule, hit, status, &shown)
                    }
                    (None, _) => {}
                }
            }
            outcome.offenders.push((i, shown));
        }
        outcome.overrides = overrides;
        pending
    }

    /// `failure_mode: local`: the store's answer is remembered, and a store that
    /// cannot be reached is answered from this replica's share of the configured
    /// limits. A script or protocol error (a working store) is no outage: it stays
    /// an error, answered as `open`.
    fn local_answer(
        &self,
        hits: &mut [Hit],
        configured: &local::Configured,
        decided: Result<crate::store::Verdicts, StoreError>,
        outcome: &mut Outcome,
    ) -> Result<crate::store::Verdicts, StoreError> {
        match decided {
            Ok(v) => {
                self.local.remember(hits, &v);
                Ok(v)
            }
            Err(e) if e.is_transient() => {
                outcome.local = true;
                local::restore(hits, configured);
                // A charge or a refund is spent whatever the answer: it is counted
                // locally even while the peers have not answered.
                if !self.may_share(hits) && !hits.iter().any(|h| h.spend.always()) {
                    return Ok(self.local.withhold(hits));
                }
                Ok(self.local.decide(hits))
            }
            Err(e) => Err(e),
        }
    }

    /// Whether this replica may decide `hits` with its share: on each shard they
    /// live on whose calls fail, its peers have answered, or it has none to ask
    /// ([`local::peers`]).
    fn may_share(&self, hits: &[Hit]) -> bool {
        let mut shards: smallvec::SmallVec<[usize; 8]> =
            hits.iter().map(|h| self.store.shard_of(h)).collect();
        shards.sort_unstable();
        shards.dedup();
        if shards.len() > 1 {
            // The shards that answer are not cut off; if none says it failed yet
            // (the failure is being recorded), every one may be.
            let failing: smallvec::SmallVec<[usize; 8]> = shards
                .iter()
                .copied()
                .filter(|&s| self.store.shard_failing(s))
                .collect();
            if !failing.is_empty() {
                shards = failing;
            }
        }
        // Not short-circuited: each shard is told, so each starts its questions.
        let mut ok = true;
        for &s in &shards {
            ok &= self.local.may_share(s);
        }
        ok
    }

    /// Asks the store, waiting at most the store timeout, or the caller's `wait`
    /// when shorter. The store is told the wait too: over several shards it answers
    /// by then with what those that answered decided ([`Store::decide_within`]).
    async fn ask_store(
        &self,
        hits: &[Hit],
        wait: Option<Duration>,
        probe: Option<&dyn Probe>,
    ) -> Result<crate::store::Verdicts, StoreError> {
        let wait = wait.map_or(self.settings.store_timeout, |w| {
            w.min(self.settings.store_timeout)
        });
        let call = std::pin::pin!(self.store.decide_within(hits, wait, probe));
        self.race_store(call, wait).await
    }

    /// A store call, raced against `wait`. The caller pins the call: taken by value
    /// and pinned here, it would be held twice in this future's state, and each
    /// request's future (which holds this one) would be moved and allocated at twice
    /// its size.
    async fn race_store(
        &self,
        mut call: std::pin::Pin<
            &mut impl std::future::Future<Output = Result<crate::store::Verdicts, StoreError>>,
        >,
        wait: Duration,
    ) -> Result<crate::store::Verdicts, StoreError> {
        // A store that answers on the first poll (the memory store always does) needs
        // no timer; only a pending call is raced.
        if let Some(result) = futures::FutureExt::now_or_never(&mut call) {
            return result;
        }
        match tokio::time::timeout(wait, &mut call).await {
            Ok(result) => result,
            // The request's one timer, the store's too: polled once more past the
            // wait, a request over several shards answers with what those that
            // answered decided. Anything still pending is the failure mode's.
            Err(_) => futures::FutureExt::now_or_never(call).unwrap_or(Err(StoreError::Timeout)),
        }
    }
}

/// How near its limit a verdict is, smallest nearest: denied before admitted, then
/// the least remaining, then the longest wait (the order in which the response
/// headers pick the descriptor they describe).
fn nearness(over_limit: bool, v: &Verdict) -> (bool, u64, u64) {
    (!over_limit, v.remaining, u64::MAX - v.retry_after)
}

/// `us` rounded up to whole seconds, as envoyproxy/ratelimit reports a reset.
fn whole_seconds(us: Micros) -> Micros {
    us.div_ceil(crate::algorithm::SECOND)
        .saturating_mul(crate::algorithm::SECOND)
}

/// The rule that decides `status`: its override's, else the matched rule.
fn effective<'p>(
    policy: &'p Policy,
    overrides: &'p [Arc<Rule>],
    status: &Status,
) -> Option<&'p Rule> {
    match status.limit_override {
        Some(i) => Some(&overrides[i]),
        None => status.answered_by.or(status.rule).map(|r| policy.rule(r)),
    }
}

/// envoyproxy/ratelimit's `replaces`: a matched limit whose name another matched
/// limit replaces does not apply to this request. An override, unnamed and with no
/// `replaces` of its own there, neither replaces nor is replaced.
fn drop_replaced(policy: &Policy, statuses: &mut [Status]) {
    let configured = |s: &Status| s.rule.filter(|_| s.limit_override.is_none());
    let any_replaces = statuses
        .iter()
        .filter_map(configured)
        .any(|r| !policy.rule(r).replaces.is_empty());
    if !any_replaces {
        return;
    }
    let replaced: Vec<&str> = statuses
        .iter()
        .filter_map(configured)
        .flat_map(|r| policy.rule(r).replaces.iter().map(String::as_str))
        .collect();
    for status in statuses.iter_mut() {
        if let Some(r) = configured(status) {
            if let Some(name) = &policy.rule(r).name {
                if replaced.contains(&name.as_str()) {
                    status.rule = None;
                }
            }
        }
    }
}

/// The hash that places a counter: the `shard_by` entry's value when the descriptor
/// carries it, else the counter key itself.
fn placement<E: Entry>(shard_by: Option<&str>, entries: &[E], key: &str) -> u64 {
    if let Some(shard_key) = shard_by {
        if let Some(e) = entries.iter().find(|e| e.key() == shard_key) {
            return crate::hash::stable_hash(e.value().as_bytes());
        }
    }
    crate::hash::stable_hash(key.as_bytes())
}

/// A limiter over a memory store for unit tests: `policy` is file-form YAML, and the
/// store, penalties and windows all read `clock`.
#[cfg(test)]
pub(crate) fn test_limiter(
    policy: &str,
    clock: &crate::clock::ManualClock,
    settings: Settings,
) -> Limiter<crate::store::MemoryStore> {
    let docs = crate::policy::parse_str("p.yaml", policy).expect("parses");
    let policy = crate::policy::compile(docs).expect("compiles");
    let store = crate::store::MemoryStore::new(Arc::new(clock.clone()), 1000);
    Limiter::new(Arc::new(ArcSwap::from_pointee(policy)), store, settings)
        .with_clock(Arc::new(clock.clone()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hold_leaves_the_store_call_and_a_margin_before_the_deadline() {
        let clock = crate::clock::ManualClock::new(0);
        let limiter = test_limiter(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            &clock,
            Settings::default(),
        );
        let ms = |n: u64| Duration::from_millis(n);
        // Short deadlines keep a fifth, as the store's wait does (Envoy's 20 ms).
        assert_eq!(limiter.hold_budget(ms(20)), 16_000);
        assert_eq!(limiter.hold_budget(ms(50)), 40_000);
        // Long ones keep the store's longest call (15 ms) and 4 ms, not a fifth.
        assert_eq!(limiter.hold_budget(ms(6_000)), 5_981_000);
        assert_eq!(limiter.hold_budget(ms(1)), 0);
        assert_eq!(limiter.hold_budget(Duration::ZERO), 0);
    }

    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;

    const HOUR: Micros = 3_600 * SECOND;

    /// 2 per hour and 3 per day on one key, both exact (sliding logs).
    const TWO_RATES: &str = "domain: d
descriptors:
  - key: api_key
    rate_limits:
      - {unit: hour, requests_per_unit: 2, algorithm: sliding_window_log}
      - {unit: day, requests_per_unit: 3, algorithm: sliding_window_log, name: daily}
";

    async fn one(limiter: &Limiter<crate::store::MemoryStore>) -> Outcome {
        let entries = [("api_key", "k1")];
        limiter.decide("d", &[Descriptor::new(&entries, 1)]).await
    }

    /// The limit a status reports: (requests_per_unit, unit).
    fn reported(o: &Outcome) -> (u32, &'static str) {
        let rule = o.rule(&o.statuses[0]).expect("a rule");
        (rule.requests_per_unit, rule.unit.as_str())
    }

    /// The memory store cannot be away: `failure_mode: local` leaves its limits
    /// whole even while the heartbeat says replicas are missing.
    #[tokio::test]
    async fn local_mode_on_the_memory_store_reserves_nothing() {
        let clock = ManualClock::new(1_000 * HOUR);
        let settings = Settings {
            failure_mode: FailureMode::Local,
            ..Settings::default()
        };
        let limiter = test_limiter(TWO_RATES, &clock, settings);
        limiter.local().learn(crate::store::Replicas {
            live: 1,
            missing: 2,
        });
        assert!(!one(&limiter).await.over_limit);
        assert!(
            !one(&limiter).await.over_limit,
            "the hour's 2, not a third of it"
        );
        assert!(one(&limiter).await.over_limit);
    }

    #[tokio::test]
    async fn several_rates_on_one_key_decide_all_or_nothing_and_report_the_nearest() {
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(TWO_RATES, &clock, Settings::default());

        // Hour: 1 left, day: 2 left. The hour is nearest.
        let o = one(&limiter).await;
        assert!(!o.over_limit);
        assert_eq!(reported(&o), (2, "hour"));
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 1);

        let o = one(&limiter).await;
        assert!(!o.over_limit);
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 0);

        // The hour denies; the day, which had room, spends nothing.
        let o = one(&limiter).await;
        assert!(o.over_limit && o.statuses[0].over_limit);
        assert_eq!(reported(&o), (2, "hour"));
        let v = o.statuses[0].verdict.unwrap();
        assert!(v.retry_after > 0 && v.retry_after <= HOUR);

        // A new hour: the day has exactly one left (the denial spent none of it), and
        // it is now the limit nearest its end, so the answer describes it.
        clock.advance(HOUR);
        let o = one(&limiter).await;
        assert!(!o.over_limit);
        assert_eq!(reported(&o), (3, "day"));
        assert_eq!(
            o.rule(&o.statuses[0]).unwrap().name.as_deref(),
            Some("daily")
        );
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 0);

        // The day denies although the hour has room; the wait is the day's.
        clock.advance(HOUR);
        let o = one(&limiter).await;
        assert!(o.over_limit);
        assert_eq!(reported(&o), (3, "day"));
        let v = o.statuses[0].verdict.unwrap();
        assert!(
            v.retry_after > HOUR,
            "the day's wait, not the hour's: {v:?}"
        );
    }

    /// 2 per second and 3 per local day in Berlin on one key.
    const CALENDAR: &str = "domain: d
descriptors:
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {window: calendar_day, time_zone: Europe/Berlin, requests_per_unit: 3, name: daily}
";

    #[tokio::test]
    async fn a_calendar_day_is_placed_by_the_limiters_clock_across_a_23_hour_day() {
        // 2026-03-29 00:30 in Berlin (CET): that day has 23 hours, to 22:00 UTC.
        let start = 1_774_740_600 * SECOND;
        let clock = ManualClock::new(start);
        let limiter = test_limiter(CALENDAR, &clock, Settings::default());
        for _ in 0..3 {
            assert!(!one(&limiter).await.over_limit);
            clock.advance(HOUR);
        }
        // The day's fourth: denied by the day, until local midnight (22:00 UTC).
        let o = one(&limiter).await;
        assert!(o.over_limit);
        assert_eq!(reported(&o), (3, "day"));
        let midnight = 1_774_821_600 * SECOND;
        let v = o.statuses[0].verdict.unwrap();
        assert_eq!(v.retry_after, midnight - clock.now());
        clock.set(midnight - 1);
        assert!(one(&limiter).await.over_limit);
        clock.set(midnight);
        let o = one(&limiter).await;
        assert!(!o.over_limit);
        // The new day is 24 hours long, and starts at local midnight.
        let policy = limiter.policy();
        let entries = [("api_key", "k1")];
        let mut statuses = [Status::undecided(1, Spend::IfAdmitted)];
        let (_, _, hits, _) = limiter.plan(
            &policy,
            policy.domain("d").unwrap(),
            "d",
            &[Descriptor::new(&entries, 1)],
            NO_DEADLINE,
            &mut statuses,
        );
        assert_eq!(hits[1].key, "d|api_key=k1|~calendar_day@Europe/Berlin");
        assert_eq!(hits[1].limit.window, 24 * HOUR);
        assert_eq!(hits[1].limit.phase, midnight % (24 * HOUR));
    }

    #[tokio::test]
    async fn concurrency_holds_a_slot_until_its_refund_or_its_lease() {
        let policy = "domain: d
descriptors:
  - key: api_key
    rate_limit: {algorithm: concurrency, requests_per_unit: 2, lease: 5m}
";
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(policy, &clock, Settings::default());
        let entries = [("api_key", "k1")];
        let start = Descriptor {
            spend: Spend::Always,
            ..Descriptor::new(&entries, 1)
        };
        let end = Descriptor {
            spend: Spend::Refund,
            ..Descriptor::new(&entries, 1)
        };
        // Two streams start; a third is refused (and its stream-end refund, which
        // Envoy sends for a denied request too, gives its slot back).
        assert!(!limiter.decide("d", &[start]).await.over_limit);
        clock.advance(SECOND);
        assert!(!limiter.decide("d", &[start]).await.over_limit);
        assert!(limiter.decide("d", &[start]).await.over_limit);
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        assert!(limiter.decide("d", &[start]).await.over_limit);
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        // One stream ends: its slot is free at once.
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        assert!(!limiter.decide("d", &[start]).await.over_limit);
        assert!(limiter.decide("d", &[start]).await.over_limit);
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        // No refund ever comes for the two in flight (a crashed Envoy): their slots
        // are held until their leases end, five minutes after they were taken (a
        // refund takes the newest entry, so the entries left are of 0 s and 1 s).
        clock.set(1_000 * HOUR + 5 * 60 * SECOND);
        let o = limiter.decide("d", &[start]).await;
        assert!(!o.over_limit, "the first slot's lease has ended");
        assert!(limiter.decide("d", &[start]).await.over_limit);
        assert!(!limiter.decide("d", &[end]).await.over_limit);
        clock.advance(SECOND);
        assert!(!limiter.decide("d", &[start]).await.over_limit);
    }

    #[tokio::test]
    async fn several_rates_are_one_store_batch_on_one_placement() {
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(TWO_RATES, &clock, Settings::default());
        let policy = limiter.policy();
        let dom = policy.domain("d").unwrap();
        let entries = [("api_key", "k1")];
        let mut statuses = [Status::undecided(1, Spend::IfAdmitted)];
        let (_, order, hits, _) = limiter.plan(
            &policy,
            dom,
            "d",
            &[Descriptor::new(&entries, 1)],
            NO_DEADLINE,
            &mut statuses,
        );
        assert_eq!(order[..], [0, 0], "one status, two hits");
        assert_eq!(hits.len(), 2);
        assert_eq!(
            hits[0].key, "d|api_key=k1",
            "the first limit keeps the plain key"
        );
        assert_eq!(hits[1].key, "d|api_key=k1|~86400s");
        assert_eq!(hits[0].placement, hits[1].placement, "decided together");
        assert_eq!(hits[1].limit.requests, 3);
    }

    /// 100 tokens a day, and a small limit that sheds from half its use.
    const CHARGES: &str = "domain: d
descriptors:
  - key: tokens
    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}
  - key: small
    rate_limit: {unit: day, requests_per_unit: 10, algorithm: fixed_window, shed: {from: 0.5}}
";

    fn spent<'a>(
        entries: &'a [(&'a str, &'a str)],
        hits: u64,
        spend: Spend,
    ) -> Descriptor<'a, (&'a str, &'a str)> {
        Descriptor {
            spend,
            ..Descriptor::new(entries, hits)
        }
    }

    async fn remaining(
        limiter: &Limiter<crate::store::MemoryStore>,
        entries: &[(&str, &str)],
    ) -> u64 {
        let o = limiter.decide("d", &[Descriptor::new(entries, 0)]).await;
        o.statuses[0].verdict.expect("decided").remaining
    }

    #[tokio::test]
    async fn a_charge_or_refund_beside_an_over_limit_charge_is_spent_once() {
        let clock = ManualClock::new(1_000 * HOUR);
        let settings = Settings {
            denied_spend: DeniedSpend::AdmittingLimits,
            ..Settings::default()
        };
        let limiter = test_limiter(CHARGES, &clock, settings);
        let (tokens, small) = ([("tokens", "x")], [("small", "y")]);
        assert!(
            limiter
                .decide("d", &[spent(&small, 20, Spend::Always)])
                .await
                .over_limit
        );
        let both = [
            spent(&tokens, 10, Spend::Always),
            spent(&small, 1, Spend::Always),
        ];
        assert!(limiter.decide("d", &both).await.over_limit);
        assert_eq!(remaining(&limiter, &tokens).await, 90, "charged once");
        let both = [
            spent(&tokens, 5, Spend::Refund),
            spent(&small, 1, Spend::Always),
        ];
        assert!(limiter.decide("d", &both).await.over_limit);
        assert_eq!(remaining(&limiter, &tokens).await, 95, "given back once");
    }

    #[tokio::test]
    async fn shedding_never_denies_a_refund_or_a_charge() {
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(CHARGES, &clock, Settings::default())
            .with_chance(Arc::new(shed::SeededChance::new(7)));
        let small = [("small", "y")];
        assert!(
            limiter
                .decide("d", &[spent(&small, 9, Spend::Always)])
                .await
                .statuses[0]
                .verdict
                .unwrap()
                .admitted
        );
        for n in 0..6 {
            let o = limiter
                .decide("d", &[spent(&small, 1, Spend::Refund)])
                .await;
            assert!(!o.over_limit && !o.statuses[0].shed, "refund {n}: {o:?}");
            let o = limiter
                .decide("d", &[spent(&small, 1, Spend::Always)])
                .await;
            assert!(!o.over_limit && !o.statuses[0].shed, "charge {n}: {o:?}");
        }
        assert_eq!(
            remaining(&limiter, &small).await,
            1,
            "every charge and refund counted"
        );
        // A request past `from` is still shed now and then.
        let mut shed = 0;
        for _ in 0..40 {
            let o = limiter.decide("d", &[Descriptor::new(&small, 0)]).await;
            shed += usize::from(o.statuses[0].shed);
        }
        assert!(shed > 0, "nothing shed past from");
    }

    /// A memory store whose counters with `down` in their key sit on a shard that
    /// fails: it decides the others alone, as the Redis store does for `open`.
    struct HalfDown(crate::store::MemoryStore);

    impl crate::store::Board for HalfDown {}

    impl Store for HalfDown {
        async fn decide(&self, hits: &[Hit]) -> Result<crate::store::Verdicts, StoreError> {
            let down = |h: &Hit| h.key.contains("down");
            let up: Vec<Hit> = hits.iter().filter(|h| !down(h)).cloned().collect();
            let decided = self.0.decide(&up).await?;
            let mut up_verdicts = decided.verdicts.into_iter();
            let verdicts = hits
                .iter()
                .map(|h| match down(h) {
                    true => crate::store::Failed::placeholder(),
                    false => up_verdicts.next().expect("a verdict"),
                })
                .collect();
            let failed = (0..hits.len()).filter(|&i| down(&hits[i])).collect();
            Ok(crate::store::Verdicts {
                admitted: decided.admitted,
                verdicts,
                now: decided.now,
                failed: Some(crate::store::Failed {
                    error: StoreError::BackingOff,
                    hits: failed,
                }),
            })
        }

        async fn peek(&self, hits: &[Hit]) -> Result<crate::store::Verdicts, StoreError> {
            self.0.peek(hits).await
        }

        fn active_keys(&self) -> usize {
            0
        }

        fn name(&self) -> &'static str {
            "redis"
        }
    }

    /// A limiter failing open on [`HalfDown`] (as `wrap` makes it): `down`'s limit
    /// of 5 an hour on the failing shard, `up`'s of 1 on the healthy one.
    fn half_down<S: Store>(settings: Settings, wrap: impl FnOnce(HalfDown) -> S) -> Limiter<S> {
        let policy = "domain: d
failure_mode: open
descriptors:
  - key: down
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: up
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: fixed_window}
";
        let clock = ManualClock::new(1_000 * HOUR);
        let docs = crate::policy::parse_str("p.yaml", policy).expect("parses");
        let policy = crate::policy::compile(docs).expect("compiles");
        let store = wrap(HalfDown(crate::store::MemoryStore::new(
            Arc::new(clock.clone()),
            1000,
        )));
        Limiter::new(Arc::new(ArcSwap::from_pointee(policy)), store, settings)
            .with_clock(Arc::new(clock))
    }

    /// A request over a failed and a healthy shard, failing open: the failed
    /// descriptor is answered as failing open answers, the healthy one still
    /// denies, is an offender, and answers OVER_LIMIT even where store errors are
    /// answered with an error.
    #[tokio::test]
    async fn a_failed_shard_lifts_its_descriptors_and_the_others_still_deny() {
        let settings = Settings {
            store_errors: StoreErrorAnswer::Error,
            ..Settings::default()
        };
        let limiter = half_down(settings, |store| store);
        let (down, up) = ([("down", "x")], [("up", "y")]);
        let both = [Descriptor::new(&down, 1), Descriptor::new(&up, 1)];

        let o = limiter.decide("d", &both).await;
        assert!(!o.over_limit);
        assert_eq!(o.statuses[0].verdict, None, "lifted: no verdict");
        assert!(!o.statuses[0].over_limit);
        assert_eq!(o.statuses[1].verdict.unwrap().remaining, 0, "counted");
        assert!(o.failure.as_ref().is_some_and(|f| f.partial));
        assert!(o.error_answer().is_some(), "the failure mode's answer");

        let o = limiter.decide("d", &both).await;
        assert!(o.over_limit, "the healthy limit is full");
        assert!(o.statuses[1].over_limit && !o.statuses[0].over_limit);
        assert_eq!(o.statuses[0].verdict, None);
        assert_eq!(o.error_answer(), None, "decided: OVER_LIMIT, not an error");
        let offenders: Vec<usize> = o.offenders.iter().map(|(i, _)| *i).collect();
        assert_eq!(offenders, [1]);
    }

    /// [`HalfDown`] whose failing shard hangs instead: the request is answered at
    /// the caller's wait, with the healthy shard's verdicts, when the caller polls
    /// it then (it sets no timer), as the Redis store answers a request over a hung
    /// shard and a healthy one.
    struct HalfHung(HalfDown);

    impl crate::store::Board for HalfHung {}

    impl Store for HalfHung {
        async fn decide(&self, hits: &[Hit]) -> Result<crate::store::Verdicts, StoreError> {
            self.0.decide(hits).await
        }

        async fn decide_within(
            &self,
            hits: &[Hit],
            wait: Duration,
            _: Option<&dyn Probe>,
        ) -> Result<crate::store::Verdicts, StoreError> {
            let until = tokio::time::Instant::now() + wait;
            std::future::poll_fn(|_| {
                if tokio::time::Instant::now() < until {
                    std::task::Poll::Pending
                } else {
                    std::task::Poll::Ready(())
                }
            })
            .await;
            let mut decided = self.0.decide(hits).await?;
            if let Some(failed) = &mut decided.failed {
                failed.error = StoreError::Timeout;
            }
            Ok(decided)
        }

        async fn peek(&self, hits: &[Hit]) -> Result<crate::store::Verdicts, StoreError> {
            self.0.peek(hits).await
        }

        fn active_keys(&self) -> usize {
            0
        }

        fn name(&self) -> &'static str {
            "redis"
        }
    }

    /// A request over a hung and a healthy shard, failing open, from a caller whose
    /// deadline is shorter than the store timeout: the store is told that wait and
    /// answers by it, so the healthy shard's full limit still denies.
    #[tokio::test(start_paused = true)]
    async fn a_shard_hung_past_the_callers_wait_lifts_only_its_descriptors() {
        let settings = Settings {
            store_timeout: Duration::from_millis(100),
            ..Settings::default()
        };
        let limiter = half_down(settings, HalfHung);
        let (down, up) = ([("down", "x")], [("up", "y")]);
        let both = [Descriptor::new(&down, 1), Descriptor::new(&up, 1)];
        let left = Some(Duration::from_millis(20));

        let started = tokio::time::Instant::now();
        let o = limiter.decide_within("d", &both, left).await;
        assert_eq!(started.elapsed(), store_wait(Duration::from_millis(20)));
        assert!(!o.over_limit);
        assert_eq!(o.statuses[0].verdict, None, "lifted: no verdict");
        let healthy = o.statuses[1].verdict.expect("the healthy shard's verdict");
        assert_eq!(healthy.remaining, 0, "counted");
        assert!(o.failure.as_ref().is_some_and(|f| f.partial));

        let o = limiter.decide_within("d", &both, left).await;
        assert!(o.over_limit, "the healthy limit is full");
        assert!(o.statuses[1].over_limit && !o.statuses[0].over_limit);
    }

    #[tokio::test]
    async fn a_denied_request_of_another_descriptor_spends_none_of_the_rates() {
        let policy = "domain: d
descriptors:
  - key: api_key
    rate_limits:
      - {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
      - {unit: day, requests_per_unit: 6, algorithm: fixed_window}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 0, algorithm: fixed_window}
";
        let clock = ManualClock::new(1_000 * HOUR);
        let limiter = test_limiter(policy, &clock, Settings::default());
        let key = [("api_key", "k")];
        let ip = [("ip", "10.0.0.1")];
        let both = [Descriptor::new(&key, 1), Descriptor::new(&ip, 1)];
        let o = limiter.decide("d", &both).await;
        assert!(o.over_limit);
        // Both rates of the admitted descriptor report what the request would have
        // left them, and kept it: the next request alone finds them untouched.
        let o = limiter.decide("d", &[Descriptor::new(&key, 1)]).await;
        assert!(!o.over_limit);
        assert_eq!(reported(&o), (5, "hour"));
        assert_eq!(o.statuses[0].verdict.unwrap().remaining, 4);
    }
}
