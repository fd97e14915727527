//! The store's verdicts written into a request's statuses: which descriptor is over
//! its limit, what it reports, and (`--denied-requests-spend`) what a denied request
//! spends of the limits that admitted it.

use std::time::Duration;

use super::outcome::effective;
use super::{Limiter, Outcome, ResetResolution};
use crate::algorithm::{Micros, Verdict};
use crate::policy::FailureMode;
use crate::store::{Hit, Mode, Probe, Spend, Store, StoreError};

impl<S: Store> Limiter<S> {
    /// Writes the store's answer (or its failure, answered by `failure_mode`) into
    /// `outcome`'s statuses for the hits of `order`.
    pub(super) fn settle(
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
                    // Its first undecided hit is of the group whose error it is.
                    let hit = failed.hits.first().and_then(|&i| hits.get(i));
                    outcome.failure =
                        Some(self.failure(&failed.error, failure_mode, true, hits, hit));
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
                outcome.failure = Some(self.failure(&error, mode, false, hits, None));
            }
        }
    }

    /// [`DeniedSpend::AdmittingLimits`]: a denied request spends its hits on the
    /// limits that admitted it, in a second store call of those hits alone, whose
    /// verdicts become their statuses. A failure of that call leaves the statuses as
    /// the denial wrote them (nothing spent).
    ///
    /// [`DeniedSpend::AdmittingLimits`]: super::DeniedSpend::AdmittingLimits
    pub(super) async fn spend_denied(
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
            status.spent_denied = verdict.admitted && decided.admitted;
            status.verdict = Some(verdict);
            status.over_limit = !verdict.admitted && hit.mode != Mode::Shadow;
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
