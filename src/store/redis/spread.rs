//! A request whose hits live on several standalone shards: one group per shard, all
//! queued at once on the shards' coalescers, and what some shards consumed is given
//! back when the request as a whole is denied.
//!
//! It runs in the caller's task rather than a task of its own, which cost a spawn, a
//! copy of the hits and a wake-up per request. The refund must still happen when the
//! caller stops waiting (the limiter's store timeout) while groups are out: dropping
//! [`Spread`] then hands the groups still out to a task, which waits for them and
//! gives back what was consumed should the request turn out denied. A refund that
//! has started runs in a task too, so dropping the caller does not cut it short.
//!
//! The tally of the answers ([`tally`]) also serves a cluster's request over several
//! slots, which `Inner::decide` runs in a task of its own.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::algorithm::{Micros, Verdict};
use crate::store::{admitted, Hit, Mode, StoreError, Verdicts};

use super::coalesce::{self, Pending};
use super::scripts::{Group, HitArgs, Reply};
use super::{Backend, Inner, Spent};

/// Groups a request makes at most without allocating (a request spans few shards).
const FEW: usize = 4;

/// One shard's (or, for a cluster, one slot's) share of the request.
pub(super) struct Out {
    target: usize,
    /// The request's hits in this group, in order.
    indexes: SmallVec<[usize; FEW]>,
    state: State,
}

impl Out {
    /// A share already answered (a cluster's calls, awaited together).
    pub(super) fn answered(
        target: usize,
        indexes: &[usize],
        reply: Result<Reply, StoreError>,
    ) -> Out {
        Out {
            target,
            indexes: SmallVec::from_slice(indexes),
            state: State::Answered(reply),
        }
    }
}

enum State {
    /// Not queued yet: nothing of it can have been consumed.
    Unsent,
    Waiting(Pending),
    Answered(Result<Reply, StoreError>),
}

/// The groups of one request, given to a task of their own if dropped unsettled.
struct Spread<'a> {
    inner: &'a Arc<Inner>,
    hits: &'a [Hit],
    sent: Micros,
    outs: SmallVec<[Out; FEW]>,
    settled: bool,
}

/// Decides `hits`, which span several standalone shards.
pub(super) async fn decide(inner: &Arc<Inner>, hits: &[Hit]) -> Result<Verdicts, StoreError> {
    let Backend::Shards(shards) = &inner.backend else {
        unreachable!("spread::decide is for standalone shards");
    };
    let sent = inner.local_now();
    if let Some(v) = inner.cached(hits, sent) {
        return Ok(v);
    }
    let mut outs: SmallVec<[Out; FEW]> = SmallVec::new();
    for (i, h) in hits.iter().enumerate() {
        let target = super::shard::jump_hash(h.placement, shards.len());
        match outs.iter_mut().find(|o| o.target == target) {
            Some(o) => o.indexes.push(i),
            None => outs.push(Out {
                target,
                indexes: SmallVec::from_slice(&[i]),
                state: State::Unsent,
            }),
        }
    }
    for o in &outs {
        inner.health(o.target).check()?;
    }
    let quota = |o: &Out| o.indexes.iter().any(|&i| hits[i].mode == Mode::Quota);
    let quota_groups = outs.iter().filter(|o| quota(o)).count();
    let fixed_now = inner.fixed_clock.as_ref().map(|c| c.now());
    let mut spread = Spread {
        inner,
        hits,
        sent,
        outs,
        settled: false,
    };
    for o in spread.outs.iter_mut() {
        let group = Group {
            keys: o
                .indexes
                .iter()
                .map(|&i| super::shard::redis_key(&inner.prefix, &hits[i]))
                .collect(),
            hits: o.indexes.iter().map(|&i| HitArgs::new(&hits[i])).collect(),
            quota_elsewhere: quota_groups > usize::from(quota(o)),
        };
        o.state = match shards[o.target].coalescer.enqueue(group, fixed_now).await {
            Ok(pending) => State::Waiting(pending),
            Err(e) => State::Answered(Err(e)),
        };
    }
    answers(&mut spread.outs).await;
    spread.settled = true;
    let tally = tally(inner, hits, sent, &spread.outs);
    if let Some(consumed) = tally.to_refund() {
        // In a task: once started, the refund finishes even if the caller gives up.
        let (inner, hits) = (inner.clone(), hits.to_vec());
        let _ = tokio::spawn(async move { inner.refund(&hits, &consumed).await }).await;
    }
    tally.finish(inner, hits)
}

/// Waits for every group still out.
async fn answers(outs: &mut [Out]) {
    for o in outs {
        if let State::Waiting(pending) = &mut o.state {
            let reply = pending.await.unwrap_or_else(|_| Err(coalesce::closed()));
            o.state = State::Answered(reply);
        }
    }
}

impl Drop for Spread<'_> {
    fn drop(&mut self) {
        if self.settled
            || !self
                .outs
                .iter()
                .any(|o| matches!(o.state, State::Waiting(_)))
        {
            return;
        }
        // The caller stopped waiting with groups out: they may consume, so see them
        // through and give back what they took if the request is denied.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.inner.clone();
        let hits = self.hits.to_vec();
        let sent = self.sent;
        let mut outs = std::mem::take(&mut self.outs);
        runtime.spawn(async move {
            answers(&mut outs).await;
            if let Some(consumed) = tally(&inner, &hits, sent, &outs).to_refund() {
                inner.refund(&hits, &consumed).await;
            }
        });
    }
}

/// What the groups' answers add up to.
pub(super) struct Tally {
    verdicts: Vec<Verdict>,
    /// Per shard that consumed: its consumed hits and their refund tokens.
    consumed: Vec<Spent>,
    failed: Option<StoreError>,
    admitted: bool,
    /// The earliest of the shards' decisions, on the local clock (see `offset`); a
    /// cluster's count from the send.
    decided: Micros,
}

pub(super) fn tally(inner: &Inner, hits: &[Hit], sent: Micros, outs: &[Out]) -> Tally {
    let mut verdicts = vec![Verdict::default(); hits.len()];
    let mut consumed = Vec::new();
    let mut failed = None;
    let mut decided = Micros::MAX;
    for o in outs {
        match &o.state {
            State::Answered(Ok(reply)) => {
                decided = decided.min(inner.decided_at(o.target, sent, reply.now));
                let mut spent = Vec::new();
                for (&i, &(v, token)) in o.indexes.iter().zip(&reply.verdicts) {
                    verdicts[i] = v;
                    if reply.consumed && v.admitted && hits[i].hits > 0 {
                        spent.push((i, token));
                    }
                }
                if !spent.is_empty() {
                    consumed.push((o.target, spent));
                }
            }
            State::Answered(Err(e)) => failed = failed.or(Some(e.clone())),
            State::Unsent | State::Waiting(_) => {
                failed = failed.or(Some(StoreError::Unavailable("not decided".into())))
            }
        }
    }
    let admitted = failed.is_none() && admitted(hits.iter().map(|h| h.mode), &verdicts);
    Tally {
        verdicts,
        consumed,
        failed,
        admitted,
        decided,
    }
}

impl Tally {
    /// What to give back: everything consumed, when the request is not admitted.
    pub(super) fn to_refund(&self) -> Option<Vec<Spent>> {
        (!self.admitted && !self.consumed.is_empty()).then(|| self.consumed.clone())
    }

    /// The request's verdicts (remembered by the denial cache), or the first error.
    pub(super) fn finish(self, inner: &Inner, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let at = self.decided.min(inner.local_now());
        inner
            .cache
            .remember(hits, &self.verdicts, self.admitted, at);
        Ok(Verdicts {
            admitted: self.admitted,
            verdicts: self.verdicts,
        })
    }
}
