//! One bucket of a report: its rule, its tracking, its penalty, and its action, or
//! the share left to finish once its demand over every stream is known.

use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action,
};
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

use crate::algorithm::{Micros, SECOND};
use crate::limiter::penalty::{encode_info, BanInfo, Source};
use crate::policy::{Policy, Rule};
use crate::quota::share::demand;
use crate::quota::{self, govern, Assignment, Governed};
use crate::service::rlqs::peers::Nudge;
use crate::service::MAX_ENTRIES;
use crate::store::{Share, Store, StoreError};

use super::action::assignment;
use super::bucket::{bucket_hash, digest, id_bytes, BucketKey, Irregular, MAX_BUCKET_ID_BYTES};
use super::{Denials, Pending, Step, Stream, Tracked};

impl<S: Store> Stream<S> {
    /// One bucket's action, or what is left to do once its demand is shared, and
    /// the rule that governs it. `label` is the domain as the metrics
    /// show it, `index` the bucket's place in its report.
    pub(super) fn decide<'p>(
        &mut self,
        policy: &'p Policy,
        domain: &str,
        label: &str,
        index: usize,
        usage: &BucketQuotaUsage,
        now: Micros,
    ) -> (Step, Option<&'p Rule>) {
        let settings = &self.quotas.settings;
        let mut ttl = settings.ttl_secs();
        let quotas = &self.quotas;
        let Some(id) = usage
            .bucket_id
            .as_ref()
            .map(|b| &b.bucket)
            .filter(|b| !b.is_empty())
        else {
            quotas.irregular(label, Irregular::NoEntries, index, 0, 0);
            return (Step::Omit, None);
        };
        let size = id_bytes(id);
        // A policy is at most MAX_ENTRIES deep and has no empty key: no rule matches
        // these, so they are answered so without walking the tree.
        let unmatchable = if id.len() > MAX_ENTRIES {
            Some(Irregular::TooManyEntries)
        } else if id.keys().any(String::is_empty) {
            Some(Irregular::EmptyKey)
        } else {
            None
        };
        if let Some(why) = unmatchable {
            quotas.irregular(label, why, index, id.len(), size);
            return (Step::Done(assignment(Assignment::AllowAll, ttl)), None);
        }
        let mut entries: BucketKey = id.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        entries.sort_unstable();
        let limiter = &self.quotas.service.limiter;
        let governed = govern(policy, domain, &entries, limiter.hashing());
        let rule_of = match &governed {
            Governed::Free(rule) => *rule,
            Governed::Limited { rule, .. } => Some(*rule),
        };
        let failure = policy
            .domain(domain)
            .and_then(|d| d.failure_mode)
            .unwrap_or(limiter.failure_mode());

        // An id too large to keep is decided all the same (a padded header escapes
        // no limit) and tracked under its digest, so it costs the stream no more
        // than a short one. The answer echoes the id as sent; no share is pushed to
        // it unasked, which would need the id kept.
        let large = size > MAX_BUCKET_ID_BYTES;
        let (entries, size) = if large {
            quotas.irregular(label, Irregular::IdTooLarge, index, id.len(), size);
            let digest = digest(&entries);
            let size = id_bytes(digest.iter().map(|(k, v)| (k, v)));
            (digest, size)
        } else {
            (entries, size)
        };
        let known = self.buckets.contains_key(&entries);
        if !known
            && (self.buckets.len() >= settings.max_buckets
                || self.bucket_bytes.saturating_add(size) > settings.max_bucket_bytes)
        {
            // Untracked, a bucket still serves its key's block or ban: looking it up
            // costs no room, and a new bucket (a client back after its bucket was
            // abandoned) must not pass a block for want of it.
            let denied = match &governed {
                Governed::Limited { rule, key, .. } => {
                    quota::sentence(limiter.penalties(), rule, key).denied_for
                }
                Governed::Free(_) => None,
            };
            let a = match denied {
                Some(left) => {
                    ttl = quota::sentence_ttl(ttl, left);
                    Assignment::DenyAll
                }
                None => quota::untracked(&governed, failure),
            };
            return (Step::Done(assignment(a, ttl)), rule_of);
        }
        if !known {
            self.quotas.service.metrics.rlqs().buckets_changed(1);
            self.bucket_bytes += size;
        }
        // The stream at its bounds, this bucket counted.
        let full = self.buckets.len() + usize::from(!known) >= settings.max_buckets
            || self.bucket_bytes.saturating_add(MAX_BUCKET_ID_BYTES) > settings.max_bucket_bytes;
        let tracked = self
            .buckets
            .entry(entries.clone())
            .or_insert_with(|| Tracked {
                id: (!large).then(|| usage.bucket_id.clone()).flatten(),
                ..Tracked::default()
            });
        let count = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        if count == 0 {
            // A report with no requests says none came since the one before it: the
            // bucket has been idle since then, not since this report.
            let since = *tracked
                .idle_since
                .get_or_insert(tracked.reported.unwrap_or(now));
            // Not before Envoy's bucket has refilled: abandoned sooner, it would
            // come back full with the client's next request. But a stream at its
            // bounds makes room: a new client would get the failure mode.
            let refill = tracked
                .last
                .filter(|_| !full)
                .map_or(0, quota::share::refill);
            let kept = (settings.abandon_after.as_micros() as Micros).max(refill);
            if now.saturating_sub(since) >= kept {
                let gone = self.buckets.remove(&entries);
                self.quotas.service.metrics.rlqs().buckets_changed(-1);
                self.bucket_bytes = self.bucket_bytes.saturating_sub(size);
                if let Some((key, member)) = gone.and_then(|t| Some((t.demand_key?, t.member))) {
                    self.quotas.peers.leave(&key, &self.id);
                    let member = member.unwrap_or_else(|| self.id.clone());
                    self.quotas.demand.forget(vec![key], member);
                }
                return (Step::Done(Action::AbandonAction(AbandonAction {})), rule_of);
            }
        } else {
            tracked.idle_since = None;
        }
        let measured = tracked.reported.map(|t| now.saturating_sub(t));
        tracked.reported = Some(now);

        let chosen = match governed {
            Governed::Free(_) => Assignment::AllowAll,
            Governed::Limited {
                rule,
                mut limits,
                key,
                shown,
            } => {
                if tracked.demand_key.as_deref() != Some(key.as_str()) {
                    // New, or governed otherwise since a policy change.
                    if let Some(old) = tracked.demand_key.take() {
                        self.quotas.peers.leave(&old, &self.id);
                    }
                    self.quotas.peers.join(&key, &self.id, &self.nudges);
                    tracked.demand_key = Some(key.clone());
                    tracked.member = rule
                        .shared
                        .iter()
                        .any(Option::is_some)
                        .then(|| format!("{}/{:016x}", self.id, bucket_hash(usage)));
                }
                // Envoy's denials count towards the penalty as ShouldRateLimit's do,
                // but for those under a DENY_ALL this stream sent: here, or in a
                // store that shares sentences once the report is decided.
                let info = || BanInfo {
                    domain: domain.to_string(),
                    rule: rule.path.clone(),
                    key: shown.clone(),
                };
                let counted = quota::counted(rule, usage.num_requests_denied, tracked.last);
                let shared = limiter.shares_sentences();
                let penalized = if shared {
                    quota::sentence(limiter.penalties(), rule, &key)
                } else {
                    quota::penalize(limiter.penalties(), rule, &key, counted, info)
                };
                let strike = rule
                    .penalty
                    .filter(|_| shared && counted > 0 && penalized.denied_for.is_none())
                    .map(|penalty| {
                        Box::new(Denials {
                            penalty,
                            denials: counted,
                            info: encode_info(&info(), Source::Penalty),
                        })
                    });
                if penalized.started {
                    self.quotas.service.metrics.sentence_started(domain, rule);
                }
                // A DENY_ALL of a sentence that has since ended is no assignment to
                // keep while the store is away.
                let last = tracked.last.filter(|a| *a != Assignment::DenyAll);
                if let Some(factor_ppm) = penalized.tightened {
                    quota::tighten(&mut limits, factor_ppm);
                }
                let from_limit = tracked.limits == limits;
                if !from_limit {
                    tracked.limits.clone_from(&limits);
                }
                if let Some(left) = penalized.denied_for {
                    ttl = quota::sentence_ttl(ttl, left);
                    Assignment::DenyAll
                } else if limits.iter().any(|l| l.requests == 0) {
                    Assignment::DenyAll
                } else {
                    // Saturating: an absurd span only makes the demand ~0.
                    let reported = usage
                        .time_elapsed
                        .map_or(0, |d| (d.seconds.max(0) as Micros).saturating_mul(SECOND));
                    let own = demand(
                        usage.num_requests_allowed,
                        usage.num_requests_denied,
                        reported,
                        measured,
                    );
                    return (
                        Step::Share(Pending {
                            entries,
                            key,
                            member: tracked.member.clone(),
                            shown,
                            limits,
                            own,
                            kept: last.filter(|_| from_limit),
                            last,
                            reshare: tracked.fraction.filter(|_| !from_limit),
                            failure,
                            strike,
                        }),
                        rule_of,
                    );
                }
            }
        };
        tracked.last = Some(chosen);
        (Step::Done(assignment(chosen, ttl)), rule_of)
    }

    /// The action of a bucket whose key the store says is denied for `left` more
    /// (a sentence its denials started, or another replica's): `DENY_ALL`, alive
    /// no longer than the sentence.
    pub(super) fn sentenced(&mut self, entries: &BucketKey, left: Micros) -> Action {
        if let Some(t) = self.buckets.get_mut(entries) {
            t.last = Some(Assignment::DenyAll);
        }
        let ttl = quota::sentence_ttl(self.quotas.settings.ttl_secs(), left);
        assignment(Assignment::DenyAll, ttl)
    }

    /// The action of a bucket [`Stream::decide`] left `pending`, given its demand
    /// over every stream (`share`).
    pub(super) fn shared(&mut self, pending: Pending, share: Result<Share, StoreError>) -> Action {
        let Pending {
            entries,
            key,
            member: _,
            shown,
            limits,
            own,
            kept,
            last,
            reshare,
            failure,
            strike: _,
        } = pending;
        let chosen = match share {
            Ok(all) => {
                let tracked = self.buckets.get_mut(&entries);
                // A demand that moved past the hysteresis may move the other
                // streams' shares: tell them now (but for an id kept as its digest,
                // which no stream keeps to push to).
                let moved = quota::moved(tracked.as_ref().and_then(|t| t.own), own);
                let pushed = tracked.as_ref().is_some_and(|t| t.id.is_some());
                if let Some(t) = tracked {
                    t.own = Some(own);
                    t.fraction = Some(quota::share::fraction(own, all));
                }
                if moved && pushed {
                    let nudge = Nudge {
                        entries: entries.clone(),
                        key,
                        share: all,
                    };
                    self.quotas.peers.nudge(&self.id, nudge);
                }
                quota::shared(&limits, own, all, kept)
            }
            // The store is away: the last assignment holds (its share of a reloaded
            // limit when that changed); a bucket never assigned takes the domain's
            // failure mode.
            Err(e) => {
                tracing::debug!(error = %e, bucket = %shown, "rlqs demand not shared");
                match reshare {
                    Some(fraction) => quota::share::tightest(&limits, fraction),
                    None => quota::unshared(last, failure),
                }
            }
        };
        if let Some(t) = self.buckets.get_mut(&entries) {
            t.last = Some(chosen);
        }
        assignment(chosen, self.quotas.settings.ttl_secs())
    }
}
