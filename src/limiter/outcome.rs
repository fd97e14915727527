//! What goes into a decision and what comes out: a request's descriptors, each
//! one's status, and the limiter's answer to the request.

use std::sync::Arc;

use super::{Override, StoreErrorAnswer};
use crate::algorithm::{Micros, Verdict};
use crate::policy::{FailureMode, Policy, Rule};
use crate::store::{Spend, StoreError};

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
    /// Decided against its penalty's tightened limit: the tightening's factor
    /// (millionths), which scales the limit its answer states.
    pub tightened: Option<u32>,
    /// When the matched rule carries several limits (`rate_limits`): the one of its
    /// [`Rule::also`] whose verdict this status reports, the one nearest its limit
    /// ([`Outcome::rule`] answers with it). `None` when it is the matched rule's own.
    pub answered_by: Option<usize>,
    /// Its hits were spent though the request was denied: it admitted them, and
    /// `--denied-requests-spend admitting-limits` spends them ([`DeniedSpend`]).
    ///
    /// [`DeniedSpend`]: super::DeniedSpend
    pub spent_denied: bool,
}

impl Status {
    /// The requests per unit `rule` (this status's) allows it: the rule's own, or
    /// a tightened key's share of them, which its remaining counts down from.
    pub fn requests_per_unit(&self, rule: &Rule) -> u32 {
        match self.tightened {
            Some(factor_ppm) => crate::policy::answer::tightened_requests(rule, factor_ppm),
            None => rule.requests_per_unit,
        }
    }

    /// A descriptor of `hits`, spent as `spend`, not yet matched or decided.
    pub(super) fn undecided(hits: u64, spend: Spend) -> Self {
        Status {
            rule: None,
            limit_override: None,
            over_limit: false,
            verdict: None,
            hits,
            spend,
            ban: Ban::None,
            shed: false,
            tightened: None,
            answered_by: None,
            spent_denied: false,
        }
    }
}

/// A descriptor's part in a `penalty` (see [`penalty`]).
///
/// [`penalty`]: super::penalty
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

/// Why the store's answer was not used, for the whole request or for the
/// descriptors whose shard failed.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreFailure {
    /// Cloned from the store's error: no allocation but a failed call's message.
    /// Its kind is the one `sluice_store_errors_total` labels; [`StoreError::Full`]
    /// is no room to keep a key's counter (`--max-keys`), not a failing store (the
    /// store logs when its refusals start and end).
    pub error: StoreError,
    /// The shard whose call failed (`host:port`), when the store has shards of its
    /// own: the first one of the request that failed.
    pub shard: Option<Arc<str>>,
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
    ///
    /// [`key::offender`]: super::key::offender
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
    pub(super) fn undecided(
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
    pub fn error_answer(&self) -> Option<&StoreError> {
        let f = self
            .failure
            .as_ref()
            .filter(|f| f.answer == StoreErrorAnswer::Error)?;
        // A ban or a block denies whatever the store did (a charge on a sentenced
        // key asked it).
        if self
            .statuses
            .iter()
            .any(|s| matches!(s.ban, Ban::Active | Ban::Blocked))
        {
            return None;
        }
        let decided_denial = || {
            self.statuses
                .iter()
                .any(|s| s.over_limit && s.verdict.is_some())
        };
        if f.partial && self.over_limit && decided_denial() {
            return None;
        }
        Some(&f.error)
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

/// The rule that decides `status`: its override's, else the matched rule.
pub(super) fn effective<'p>(
    policy: &'p Policy,
    overrides: &'p [Arc<Rule>],
    status: &Status,
) -> Option<&'p Rule> {
    match status.limit_override {
        Some(i) => Some(&overrides[i]),
        None => status.answered_by.or(status.rule).map(|r| policy.rule(r)),
    }
}
