//! The limiter's hooks: sentences acted on before the store is asked, denials
//! counted after it answered.

use super::{BanInfo, InForce, Penalties};
use crate::algorithm::{Micros, Verdict};
use crate::limiter::key::{self, Hashing};
use crate::limiter::{Ban, Descriptor, Outcome, Status};
use crate::policy::{tightened, Entry, Policy, Rule};
use crate::store::{Hit, Kind, Mode, Spend};

/// The request whose keys' sentences are looked up.
pub struct Asked<'a, E> {
    pub domain: &'a str,
    pub descriptors: &'a [Descriptor<'a, E>],
    pub hashing: &'a Hashing,
}

/// What the sentences did to a request: whether any denied it before the store is
/// asked, and the charges on sentenced keys, to be answered OVER_LIMIT once the
/// store has spent them ([`deny_charges`]).
#[derive(Default)]
pub struct Sentenced {
    pub denied: bool,
    /// Each: the charge's status, the sentence's time left, and whether it is an
    /// operator's block.
    pub charges: Vec<(usize, Micros, bool)>,
}

/// Acts on the sentences of the request's keys before the store is asked: an
/// enforced descriptor whose key is banned or blocked is marked OVER_LIMIT with the
/// rest of the sentence as its wait; a tightened key's hit gets its scaled limit.
/// The request is then denied and the store not asked.
///
/// A descriptor with a `limit` override is looked up under its matched rule's key
/// and penalty, where operators block and bans start: the override changes its
/// limit, not whose key it is. A charge on a sentenced key still reaches the store,
/// which spends it (it may report a request already served), and is answered
/// OVER_LIMIT after; a refund is never denied.
pub fn apply_sentences<E: Entry>(
    penalties: &Penalties,
    asked: &Asked<'_, E>,
    order: &[usize],
    hits: &mut [Hit],
    outcome: &mut Outcome,
) -> Sentenced {
    let operators = penalties.operator_blocks();
    let mut now = None;
    let mut sentenced = Sentenced::default();
    // The matched rules' keys, written in turn: one buffer for the request.
    let mut matched_key = String::new();
    for (&i, hit) in order.iter().zip(hits.iter_mut()) {
        let status = &outcome.statuses[i];
        let matched = matched_under_override(&outcome.policy, status);
        let Some(rule) = matched.or_else(|| outcome.rule(status)) else {
            continue;
        };
        let penalised = rule.penalty.is_some();
        if (!penalised && !operators) || hit.mode != Mode::Enforce {
            continue;
        }
        let now = *now.get_or_insert_with(|| penalties.now());
        let found = match matched {
            Some(rule) => {
                key::counter_key(
                    asked.domain,
                    rule,
                    asked.descriptors[i].entries,
                    asked.hashing,
                    &mut matched_key,
                );
                penalties.in_force(&matched_key, now, penalised)
            }
            None => penalties.in_force(&hit.key, now, penalised),
        };
        match found {
            None => {}
            Some(InForce::Tightened { factor_ppm }) => {
                hit.limit.requests = tightened(hit.limit.requests, factor_ppm);
                hit.limit.burst = tightened(hit.limit.burst, factor_ppm);
                outcome.statuses[i].tightened = Some(factor_ppm);
            }
            Some(InForce::Denied { .. }) if hit.spend == Spend::Refund => {}
            Some(InForce::Denied { left, blocked }) if hit.spend == Spend::Always => {
                sentenced.charges.push((i, left, blocked));
            }
            Some(InForce::Denied { left, blocked }) => {
                let status = &mut outcome.statuses[i];
                status.over_limit = true;
                status.ban = if blocked { Ban::Blocked } else { Ban::Active };
                status.verdict = Some(denied_for(left));
                sentenced.denied = true;
            }
        }
    }
    if sentenced.denied {
        outcome.over_limit = true;
    }
    sentenced
}

/// With a `limit` override, the limited rule the descriptor's entries match: its
/// key holds the descriptor's sentences and penalty counts (the override changes
/// the limit, not whose key it is). `None` without an override.
pub fn matched_under_override<'p>(policy: &'p Policy, status: &Status) -> Option<&'p Rule> {
    status
        .limit_override
        .and(status.rule)
        .map(|r| policy.rule(r))
        .filter(|r| r.limit.is_some())
}

/// Answers the charges on sentenced keys OVER_LIMIT, once the store has spent
/// them: their wait is at least the sentence's.
pub fn deny_charges(charges: &[(usize, Micros, bool)], outcome: &mut Outcome) {
    for &(i, left, blocked) in charges {
        let status = &mut outcome.statuses[i];
        status.over_limit = true;
        status.ban = if blocked { Ban::Blocked } else { Ban::Active };
        let mut verdict = denied_for(left);
        if let Some(spent) = status.verdict {
            // Whether the charge fitted its limit: one that did is not `over`.
            verdict.admitted = spent.admitted;
            verdict.reset = verdict.reset.max(spent.reset);
            verdict.retry_after = verdict.retry_after.max(spent.retry_after);
            verdict.owed = spent.owed;
        }
        status.verdict = Some(verdict);
        outcome.over_limit = true;
    }
}

/// A sentence's denial, `left` still to serve.
fn denied_for(left: Micros) -> Verdict {
    Verdict {
        admitted: false,
        remaining: 0,
        reset: left,
        retry_after: left,
        delay: 0,
        next_room: 0,
        owed: 0,
        late: false,
    }
}

/// Marks `status` for a sentence its denial started: its wait is at least the
/// sentence when it denies outright.
pub fn mark_started(status: &mut Status, kind: Kind, span: Micros) {
    status.ban = Ban::Started;
    if kind.denies() {
        if let Some(v) = status.verdict.as_mut() {
            v.retry_after = v.retry_after.max(span);
            // A request no wait admits waits for the key to admit one hit
            // (`Verdict::retry_wait`), which the sentence puts off.
            if v.retry_after == u64::MAX && v.next_room != u64::MAX {
                v.next_room = v.next_room.max(span);
            }
        }
    }
}

/// Counts a denial by `rule` towards its penalty, in process; when it starts a
/// sentence, marks the status.
pub fn count_denial(
    penalties: &Penalties,
    domain: &str,
    rule: &Rule,
    key: &str,
    status: &mut Status,
    shown: &str,
) {
    let Some(penalty) = &rule.penalty else {
        return;
    };
    let started = penalties.deny(key, penalty, penalties.now(), || BanInfo {
        domain: domain.to_string(),
        rule: rule.path.clone(),
        key: shown.to_string(),
    });
    if let Some(s) = started {
        mark_started(status, s.kind, s.span);
    }
}
