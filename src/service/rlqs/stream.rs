//! One `StreamRateLimitQuotas` stream: an Envoy's usage reports for one domain in,
//! one `RateLimitQuotaResponse` out for each, with an action for every bucket the
//! report carries (Envoy 1.40 reports every bucket each time, idle ones too), each
//! echoing its `BucketId` exactly as sent. Every report is answered at once: Envoy
//! applies an assignment only while the stream is open.
//!
//! The stream remembers per bucket when it last reported (demand is measured on
//! Sluice's clock, not Envoy's whole seconds), its last demand, the last assignment
//! (sent again when the share hardly moved, so Envoy keeps its token bucket) and
//! since when it has been idle (for `abandon_action`). When the stream ends, its
//! demand records go.
//!
//! Between reports the stream also listens to its [`Peers`](super::Peers): when
//! another stream of a bucket on this replica reports a demand that moves this one's
//! share past the hysteresis, the new assignment goes to Envoy at once, unasked
//! (Envoy applies any response on the open stream), so the shares keep to the limit
//! while the load shifts instead of overshooting for up to one interval.
//!
//! This file holds the stream's state and a report's answer; `task` runs the
//! stream, `decode` reads a report, `decide` answers one bucket, `bucket` keys a
//! bucket id and `action` writes an assignment as Envoy's protobuf; `tests` answers
//! reports through a real limiter and store.

use std::collections::HashMap;
use std::sync::Arc;

use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::pb::envoy::service::rate_limit_quota::v3::BucketId;
use crate::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;

use crate::algorithm::{Limit, Micros, SECOND};
use crate::policy::{FailureMode, Penalty, Rule};
use crate::quota::{self, govern, Assignment, Governed};
use crate::store::{Share, Store, StoreError};
use sluice_grpc::{Code, GrpcError};

use super::peers::{Nudge, INBOX};
use super::Quotas;

mod action;
mod bucket;
mod decide;
mod decode;
mod task;

use action::{assignment, kind};
use bucket::BucketKey;
pub(super) use bucket::Irregular;
pub use task::{serve, serve_traced, Traced};

/// A report message read as [`serve`] reads it, for the fuzz target that drives a
/// [`Stream`] without a connection.
#[doc(hidden)]
pub use decode::decode as decode_report;

/// What the stream remembers of one bucket.
#[derive(Debug, Default)]
struct Tracked {
    /// Its id as Envoy sent it, echoed in assignments sent unasked; `None` for an
    /// id too large to keep, which gets none.
    id: Option<BucketId>,
    /// When the stream last reported it (Sluice's clock).
    reported: Option<Micros>,
    /// Its demand at that report, requests per second.
    own: Option<f64>,
    /// The assignment last sent.
    last: Option<Assignment>,
    /// Its fraction of the limit when last shared: a reloaded limit is shared by it
    /// while the store is away.
    fraction: Option<f64>,
    /// The rule's limits when it was: others (a policy reload) are sent at once,
    /// however little the share moved.
    limits: Vec<Limit>,
    /// Since when its reports have carried no requests.
    idle_since: Option<Micros>,
    /// Its demand record's key, when a limit governs it.
    demand_key: Option<String>,
    /// Its record's name under that key when not the stream's id: a counter that
    /// several values share (`share_threshold`) is the key of several buckets, each
    /// with a record of its own, or they would overwrite each other's demand.
    member: Option<String>,
}

/// One Envoy's stream for one domain.
#[derive(Debug)]
pub struct Stream<S: Store> {
    quotas: Arc<Quotas<S>>,
    /// Names this stream's demand records, unique across replicas.
    id: String,
    domain: Option<String>,
    buckets: HashMap<BucketKey, Tracked>,
    /// The bytes of the tracked buckets' ids ([`id_bytes`]).
    ///
    /// [`id_bytes`]: bucket::id_bytes
    bucket_bytes: usize,
    /// Where peers' nudges arrive; `inbox` is taken by [`serve`].
    nudges: mpsc::Sender<Arc<Nudge>>,
    pub inbox: Option<mpsc::Receiver<Arc<Nudge>>>,
}

/// A bucket's answer as [`Stream::decide`] leaves it.
enum Step {
    Done(Action),
    /// No action Envoy could take: left out of the answer.
    Omit,
    /// A limited bucket's share, to finish once its demand is shared.
    Share(Pending),
}

/// What a limited bucket's share is made from, beside its demand over every stream.
struct Pending {
    /// The bucket as the stream tracks it.
    entries: BucketKey,
    /// Its demand record's key and name ([`Tracked::member`]), and its values as
    /// logs show them.
    key: String,
    member: Option<String>,
    shown: String,
    limits: Vec<Limit>,
    /// This stream's demand, requests per second.
    own: f64,
    /// The last assignment, when a share that hardly moved may keep it.
    kept: Option<Assignment>,
    /// The last assignment, to hold while the store is away.
    last: Option<Assignment>,
    /// The fraction it was shared, when the limit has changed since: the new limit
    /// is shared by it while the store is away, rather than the old one held.
    reshare: Option<f64>,
    failure: FailureMode,
    /// Its denials, to count towards its penalty in a store that shares sentences.
    strike: Option<Box<Denials>>,
}

/// A report's denials of a bucket's key, counted in the store with the other
/// buckets' demand.
struct Denials {
    penalty: Penalty,
    denials: u64,
    /// Kept with a sentence they start ([`encode_info`](crate::limiter::penalty::encode_info)).
    info: String,
}

impl<S: Store> Stream<S> {
    pub fn new(quotas: Arc<Quotas<S>>) -> Self {
        quotas.service.metrics.rlqs().stream_opened();
        let (nudges, inbox) = mpsc::channel(INBOX);
        Stream {
            quotas,
            id: format!("{:016x}", rand::random::<u64>()),
            domain: None,
            buckets: HashMap::new(),
            bucket_bytes: 0,
            nudges,
            inbox: Some(inbox),
        }
    }

    /// Another stream of a bucket this one reports has reported: the assignment to
    /// send unasked if this stream's share, from its own last demand against the
    /// bucket's new total, moved past the hysteresis. Only token buckets move: a
    /// bucket on a blanket rule or a ban waits for its own next report.
    pub fn nudged(&mut self, nudge: &Nudge) -> Option<RateLimitQuotaResponse> {
        let domain = self.domain.as_deref()?;
        let tracked = self.buckets.get_mut(&nudge.entries)?;
        let id = tracked.id.clone()?;
        if tracked.demand_key.as_deref() != Some(nudge.key.as_str()) {
            return None;
        }
        let own = tracked.own?;
        let last @ Assignment::TokenBucket { .. } = tracked.last? else {
            return None;
        };
        let policy = self.quotas.service.limiter.policy();
        let hashing = self.quotas.service.limiter.hashing();
        let Governed::Limited {
            rule,
            mut limits,
            key,
            ..
        } = govern(&policy, domain, &nudge.entries, hashing)
        else {
            return None;
        };
        if key != nudge.key {
            return None;
        }
        // The key's sentence holds between reports too: a denied key waits for its
        // own report, a tightened one is shared its tightened limit.
        let sentence = quota::sentence(self.quotas.service.limiter.penalties(), rule, &key);
        if sentence.denied_for.is_some() {
            return None;
        }
        if let Some(factor_ppm) = sentence.tightened {
            quota::tighten(&mut limits, factor_ppm);
        }
        let kept = Some(last).filter(|_| tracked.limits == limits);
        let fraction = quota::share::fraction(own, nudge.share);
        tracked.fraction = Some(fraction);
        let chosen = quota::shared(&limits, own, nudge.share, kept);
        if chosen == last {
            return None;
        }
        tracked.last = Some(chosen);
        tracked.limits = limits;
        let action = assignment(chosen, self.quotas.settings.ttl_secs());
        self.quotas
            .service
            .metrics
            .rlqs()
            .assignment(domain, &rule.path, kind(&action));
        Some(RateLimitQuotaResponse {
            bucket_action: vec![BucketAction {
                bucket_id: Some(id),
                bucket_action: Some(action),
            }],
        })
    }

    /// The answer to one report: an action per bucket, in the report's order.
    pub async fn answer(
        &mut self,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, GrpcError> {
        let domain = self.domain_of(&reports.domain)?;
        let policy = self.quotas.service.limiter.policy();
        let now = self.quotas.clock.now();
        // The domain as a label: only one the policy defines.
        let shown = if policy.domain(&domain).is_some() {
            domain.as_str()
        } else {
            ""
        };
        let metrics = self.quotas.service.metrics.clone();
        let stats = metrics.rlqs();
        stats.report(shown);
        let steps: Vec<(Step, Option<&Rule>)> = reports
            .bucket_quota_usages
            .iter()
            .enumerate()
            .map(|(i, usage)| self.decide(&policy, &domain, shown, i, usage, now))
            .collect();
        // Every bucket's demand is shared at once: with the store slow or away, the
        // report waits for one store call's timeout, not one per bucket (40 buckets
        // would take 20 s, past the assignments' TTL).
        // A bucket's denials to count in a store that shares sentences go with its
        // demand.
        let quotas = self.quotas.clone();
        let ttl_us = quotas.settings.ttl_secs() * SECOND;
        let limiter = &quotas.service.limiter;
        let pending = || {
            steps.iter().filter_map(|(step, _)| match step {
                Step::Share(p) => Some(p),
                Step::Done(_) | Step::Omit => None,
            })
        };
        let (mut shares, struck) = futures::join!(
            futures::future::join_all(pending().map(|p| {
                let member = p.member.as_deref().unwrap_or(&self.id);
                quotas.demand.report(&p.key, member, p.own, ttl_us)
            })),
            futures::future::join_all(pending().map(|p| async move {
                let d = p.strike.as_ref()?;
                limiter
                    .strike_many(&p.key, &d.penalty, d.denials, &d.info)
                    .await
            })),
        );
        settle_counters(&steps, &mut shares);
        let mut shares = shares.into_iter().zip(struck);
        let mut actions = Vec::with_capacity(steps.len());
        for ((step, rule), usage) in steps.into_iter().zip(reports.bucket_quota_usages) {
            let action = match step {
                Step::Done(action) => action,
                Step::Omit => continue,
                Step::Share(p) => {
                    let (share, sentence) = shares.next().expect("one share per bucket asked");
                    if let (Some(s), Some(rule)) = (&sentence, rule) {
                        if s.started {
                            metrics.sentence_started(&domain, rule);
                        }
                    }
                    match sentence.filter(|s| s.kind.denies()) {
                        Some(s) => self.sentenced(&p.entries, s.remaining),
                        None => self.shared(p, share),
                    }
                }
            };
            stats.assignment(shown, rule.map_or("", |r| r.path.as_str()), kind(&action));
            actions.push(BucketAction {
                bucket_id: usage.bucket_id,
                bucket_action: Some(action),
            });
        }
        Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    /// The stream's domain: set by its first message; a later one may repeat it or
    /// leave it empty.
    fn domain_of(&mut self, domain: &str) -> Result<String, GrpcError> {
        match &self.domain {
            None if domain.is_empty() => Err(GrpcError::new(
                Code::InvalidArgument,
                "the first RateLimitQuotaUsageReports of a stream must name its domain",
            )),
            None => {
                self.domain = Some(domain.to_string());
                Ok(domain.to_string())
            }
            Some(d) if domain.is_empty() || domain == d => Ok(d.clone()),
            Some(d) => Err(GrpcError::new(
                Code::InvalidArgument,
                format!("the stream's domain is '{d}'; a report names '{domain}'"),
            )),
        }
    }
}

/// Gives the buckets of one report that share a counter (values of a
/// `share_threshold` wildcard) its total as its last record in the report answered
/// it. Each record's answer holds only the records written before it: shared from
/// its own, the first bucket would get the limit as if the others had no demand, and
/// no nudge reaches buckets of the stream that reported them.
fn settle_counters(steps: &[(Step, Option<&Rule>)], shares: &mut [Result<Share, StoreError>]) {
    // One bucket shares with no other of its report: nothing to settle.
    if shares.len() < 2 {
        return;
    }
    let keys = || {
        steps.iter().filter_map(|(step, _)| match step {
            Step::Share(p) => Some(p.key.as_str()),
            Step::Done(_) | Step::Omit => None,
        })
    };
    // Per counter: how many buckets of the report it holds, and its last total.
    let mut counters: HashMap<&str, (u32, Option<Share>)> = HashMap::new();
    for (key, share) in keys().zip(shares.iter()) {
        let (buckets, last) = counters.entry(key).or_default();
        *buckets += 1;
        if let Ok(share) = share {
            *last = Some(*share);
        }
    }
    for (key, share) in keys().zip(shares.iter_mut()) {
        if let (Ok(share), Some((2.., Some(last)))) = (share, counters.get(key)) {
            *share = *last;
        }
    }
}

impl<S: Store> Drop for Stream<S> {
    fn drop(&mut self) {
        let stats = self.quotas.service.metrics.rlqs();
        stats.stream_closed();
        stats.buckets_changed(-(self.buckets.len() as i64));
        let mut keys = Vec::new();
        for t in self.buckets.values_mut() {
            let Some(key) = t.demand_key.take() else {
                continue;
            };
            self.quotas.peers.leave(&key, &self.id);
            match t.member.take() {
                Some(member) => self.quotas.demand.forget(vec![key], member),
                None => keys.push(key),
            }
        }
        if !keys.is_empty() {
            self.quotas
                .demand
                .forget(keys, std::mem::take(&mut self.id));
        }
    }
}

#[cfg(test)]
mod tests;
