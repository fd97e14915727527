//! A request whose hits live on several standalone shards: one group per shard, all
//! queued at once on the shards' coalescers, and what some shards consumed is given
//! back when the request as a whole is denied.
//!
//! A shard that fails (or backs off) leaves its hits undecided. With `failure_mode:
//! open` ([`Fallback::Admit`]) only they are lifted: the other shards' verdicts
//! decide the request, what they consumed is kept if it is admitted and given back
//! if it is denied, and the verdicts name the undecided hits ([`Failed`]). Any other
//! failure mode fails the whole request, as a failed call to one shard does.
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
use std::time::SystemTime;

use smallvec::SmallVec;

use crate::algorithm::{Micros, Verdict};
use crate::store::{
    admitted, ErrorKind, Failed, Fallback, Hit, Mode, Probe, Spend, StoreError, Verdicts,
};

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
    /// The shard (or slot) of this share.
    pub(super) fn target(&self) -> usize {
        self.target
    }

    /// This share as a script group, with its keys from `key` (by hit index).
    pub(super) fn group(
        &self,
        hits: &[Hit],
        outs: &[Out],
        key: impl FnMut(usize) -> String,
    ) -> Group {
        let quota = |o: &Out| o.indexes.iter().any(|&i| hits[i].mode == Mode::Quota);
        Group {
            keys: self.indexes.iter().copied().map(key).collect(),
            hits: self
                .indexes
                .iter()
                .map(|&i| HitArgs::new(&hits[i]))
                .collect(),
            quota_elsewhere: outs.iter().filter(|&o| quota(o)).count() > usize::from(quota(self)),
        }
    }

    /// Records this share's answer (a cluster's calls, awaited together).
    pub(super) fn answer(&mut self, reply: Result<Reply, StoreError>) {
        self.state = State::Answered(reply);
    }

    /// Whether this share is still to be sent (its shard was not found failing).
    pub(super) fn unsent(&self) -> bool {
        matches!(self.state, State::Unsent)
    }
}

/// Checks the health of each share's shard (`health`, by the share's position and
/// target) before anything is sent: a share whose shard backs off is answered by its
/// error. `Err` when that fails the whole request (a failure mode other than
/// `open`); nothing was sent then.
pub(super) fn check(
    outs: &mut [Out],
    hits: &[Hit],
    health: impl Fn(usize, usize) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    for (k, o) in outs.iter_mut().enumerate() {
        if let Err(e) = health(k, o.target) {
            if !lifts(hits, o) {
                return Err(e);
            }
            o.state = State::Answered(Err(e));
        }
    }
    Ok(())
}

/// Whether `o`'s hits are lifted alone when their shard fails (`failure_mode: open`).
fn lifts(hits: &[Hit], o: &Out) -> bool {
    o.indexes
        .iter()
        .all(|&i| hits[i].fallback == Fallback::Admit)
}

/// The request's hits grouped by `target` (shard or slot, from a hit's index and
/// itself), each group's hits in the request's order.
pub(super) fn group(hits: &[Hit], target: impl Fn(usize, &Hit) -> usize) -> SmallVec<[Out; FEW]> {
    let mut outs: SmallVec<[Out; FEW]> = SmallVec::new();
    for (i, h) in hits.iter().enumerate() {
        let target = target(i, h);
        match outs.iter_mut().find(|o| o.target == target) {
            Some(o) => o.indexes.push(i),
            None => outs.push(Out {
                target,
                indexes: SmallVec::from_slice(&[i]),
                state: State::Unsent,
            }),
        }
    }
    outs
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
/// `probe` hears of each shard's call.
pub(super) async fn decide(
    inner: &Arc<Inner>,
    hits: &[Hit],
    probe: Option<&dyn Probe>,
) -> Result<Verdicts, StoreError> {
    let Backend::Shards(shards) = &inner.backend else {
        unreachable!("spread::decide is for standalone shards");
    };
    let sent = inner.local_now();
    if let Some(v) = inner.cached(hits, sent) {
        return Ok(v);
    }
    let mut outs = group(hits, |_, h| {
        super::shard::jump_hash(h.placement, shards.len())
    });
    check(&mut outs, hits, |_, target| inner.health(target).check())?;
    let fixed_now = inner.fixed_clock.as_ref().map(|c| c.now());
    let mut spread = Spread {
        inner,
        hits,
        sent,
        outs,
        settled: false,
    };
    let started = probe.map(|_| SystemTime::now());
    for k in 0..spread.outs.len() {
        let o = &spread.outs[k];
        if !o.unsent() {
            continue;
        }
        let key = |i| super::shard::redis_key(&inner.prefix, &hits[i]);
        let group = o.group(hits, &spread.outs, key);
        let queued = shards[o.target].coalescer.enqueue(group, fixed_now).await;
        spread.outs[k].state = match queued {
            Ok(pending) => State::Waiting(pending),
            Err(e) => State::Answered(Err(e)),
        };
    }
    match (probe, started) {
        (Some(probe), Some(started)) => {
            // Each shard's answer is awaited in turn, so a call's end is when this
            // request saw it: no earlier than the shard answered.
            for o in spread.outs.iter_mut() {
                if let State::Waiting(pending) = &mut o.state {
                    let answer = coalesce::outcome(pending).await;
                    let error = answer.as_ref().err();
                    inner.tell(probe, o.target, "decide", o.indexes.len(), started, error);
                    o.state = State::Answered(answer);
                }
            }
        }
        _ => answers(&mut spread.outs).await,
    }
    spread.settled = true;
    let mut tally = tally(inner, hits, sent, &spread.outs);
    if let Some(consumed) = tally.take_refund() {
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
            o.state = State::Answered(coalesce::outcome(pending).await);
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
            if let Some(consumed) = tally(&inner, &hits, sent, &outs).take_refund() {
                inner.refund(&hits, &consumed).await;
            }
        });
    }
}

/// What the groups' answers add up to.
pub(super) struct Tally {
    verdicts: Vec<Verdict>,
    /// When the request is not admitted: per shard that consumed, its consumed hits
    /// and their refund tokens.
    refund: Vec<Spent>,
    /// The first error of a group that was not decided.
    failed: Option<StoreError>,
    /// The hits of the groups not decided, ascending (empty, unallocated, when every
    /// group was).
    undecided: Vec<usize>,
    /// An undecided hit fails the whole request (its failure mode is not `open`).
    whole: bool,
    admitted: bool,
    /// The earliest of the shards' decisions, on the local clock (see `offset`); a
    /// cluster's count from the send.
    decided: Micros,
}

pub(super) fn tally(inner: &Inner, hits: &[Hit], sent: Micros, outs: &[Out]) -> Tally {
    let mut verdicts = vec![Verdict::default(); hits.len()];
    let mut failed = None;
    let mut undecided = Vec::new();
    let mut whole = false;
    let mut decided = Micros::MAX;
    for o in outs {
        let error = match &o.state {
            State::Answered(Ok(reply)) => {
                decided = decided.min(inner.decided_at(o.target, sent, reply.now));
                for (&i, &(v, _)) in o.indexes.iter().zip(&reply.verdicts) {
                    verdicts[i] = v;
                }
                continue;
            }
            State::Answered(Err(e)) => Some(e),
            State::Unsent | State::Waiting(_) => None,
        };
        failed.get_or_insert_with(|| {
            error
                .cloned()
                .unwrap_or_else(|| StoreError::failed(ErrorKind::Connection, "not decided"))
        });
        whole |= !lifts(hits, o);
        for &i in &o.indexes {
            verdicts[i] = Failed::placeholder();
        }
        undecided.extend_from_slice(&o.indexes);
    }
    undecided.sort_unstable();
    let admitted = !whole && admitted(hits.iter().map(|h| h.mode), &verdicts);
    // Only a request not admitted gives anything back: an admitted one (the usual
    // case) lists nothing.
    let mut refund = Vec::new();
    if !admitted {
        for o in outs {
            let State::Answered(Ok(reply)) = &o.state else {
                continue;
            };
            let spent: Vec<(usize, i64)> = o
                .indexes
                .iter()
                .zip(&reply.verdicts)
                .filter(|&(&i, &(v, _))| {
                    // A charge is spent whatever the request's fate.
                    reply.consumed
                        && v.admitted
                        && hits[i].hits > 0
                        && hits[i].spend == Spend::IfAdmitted
                })
                .map(|(&i, &(_, token))| (i, token))
                .collect();
            if !spent.is_empty() {
                refund.push((o.target, spent));
            }
        }
    }
    Tally {
        verdicts,
        refund,
        failed,
        undecided,
        whole,
        admitted,
        decided,
    }
}

impl Tally {
    /// What to give back, if anything: what the shards consumed of a request that is
    /// not admitted.
    pub(super) fn take_refund(&mut self) -> Option<Vec<Spent>> {
        (!self.refund.is_empty()).then(|| std::mem::take(&mut self.refund))
    }

    /// The request's verdicts (remembered by the denial cache, which passes the
    /// placeholders of undecided hits by), or the first error when it fails whole.
    pub(super) fn finish(self, inner: &Inner, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        let failed = match self.failed {
            Some(e) if self.whole => return Err(e),
            Some(error) => Some(Failed {
                error,
                hits: self.undecided,
            }),
            None => None,
        };
        let at = self.decided.min(inner.local_now());
        inner
            .cache
            .remember(hits, &self.verdicts, self.admitted, at);
        Ok(Verdicts {
            admitted: self.admitted,
            verdicts: self.verdicts,
            now: None,
            failed,
        })
    }
}
