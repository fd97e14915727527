//! The limiter's hooks: sentences acted on before the store is asked, denials
//! counted after it answered.

use super::{BanInfo, InForce, Penalties};
use crate::algorithm::{Micros, Verdict};
use crate::limiter::{Ban, Outcome, Status};
use crate::policy::{tightened, Rule};
use crate::store::{Hit, Kind, Mode};

/// Acts on the sentences of the request's keys before the store is asked: an
/// enforced descriptor whose key is banned or blocked is marked OVER_LIMIT with the
/// rest of the sentence as its wait; a tightened key's hit gets its scaled limit.
/// Returns whether any was denied (the request is then denied and the store is not
/// asked). A charge or a refund is never denied by a sentence: it reports what a
/// request already served cost or gave back, so it reaches the store.
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
        let penalised = rule.penalty.is_some();
        if (!penalised && !operators) || hit.mode != Mode::Enforce {
            continue;
        }
        let now = *now.get_or_insert_with(|| penalties.now());
        match penalties.in_force(&hit.key, now, penalised) {
            None => {}
            Some(InForce::Tightened { factor_ppm }) => {
                hit.limit.requests = tightened(hit.limit.requests, factor_ppm);
                hit.limit.burst = tightened(hit.limit.burst, factor_ppm);
                outcome.statuses[i].tightened = Some(factor_ppm);
            }
            Some(InForce::Denied { .. }) if hit.spend.always() => {}
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
                    owed: 0,
                    late: false,
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
