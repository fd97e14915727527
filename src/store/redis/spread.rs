//! A request whose hits live on several shards (standalone shards, or slots of a
//! Redis Cluster): one group per shard (or slot), all sent at once, and what some
//! shards consumed is given back when the request as a whole is denied. A standalone
//! shard's group is queued on its coalescer; a cluster's is a call in a task of its
//! own, so that it runs to its end (its master's health hears how it went) whoever
//! waits for it.
//!
//! A shard that fails (or backs off) leaves its hits undecided, and so does one that
//! has not answered by the request's deadline (a hung shard: a stopped process, a
//! network that drops its packets), which the caller gives as a wait
//! ([`crate::store::Store::decide_within`]). With `failure_mode: open`
//! ([`Fallback::Admit`]) only they are lifted: the other shards' verdicts decide the
//! request, what they consumed is kept if it is admitted and given back if it is
//! denied, and the verdicts name the undecided hits ([`Failed`]). Any other failure
//! mode fails the whole request, as a failed call to one shard does.
//!
//! The deadline costs no timer: the caller races the request against the same wait
//! with its own, and polls it once more when that fires; a poll that finds a group
//! still out reads the clock and, past the deadline, answers without it. The group
//! itself is not cut short: its call is shared with other requests (a coalesced
//! batch) and bounded by the call timeout, which counts it for the shard's health. A
//! request denied then hands it to a task that gives back what it consumes should it
//! answer after all; an admitted one lets it go, and a group not sent yet is then
//! dropped unsent. Nothing is waited for past the deadline, not even the refund of
//! a denied request, which then finishes in its task.
//!
//! It runs in the caller's task rather than a task of its own, which cost a spawn, a
//! copy of the hits and a wake-up per request. The refund must still happen when the
//! caller stops waiting (the limiter's store timeout) while groups are out: dropping
//! [`Spread`] then hands the groups still out to a task, which waits for them and
//! gives back what was consumed should the request turn out denied. A refund that
//! has started runs in a task too, so dropping the caller does not cut it short.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use smallvec::SmallVec;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::algorithm::{Micros, Verdict};
use crate::store::{
    admitted, ErrorKind, Failed, Fallback, Hit, Mode, Probe, Spend, StoreError, Verdicts,
};

use super::coalesce;
use super::scripts::{Group, HitArgs, Reply};
use super::{Backend, Inner, Spent};

/// Groups a request makes at most without allocating (a request spans few shards).
const FEW: usize = 4;

/// One shard's (or, for a cluster, one slot's) share of the request.
struct Out {
    target: usize,
    /// The request's hits in this group, in order.
    indexes: SmallVec<[usize; FEW]>,
    state: State,
}

impl Out {
    /// This share as a script group, with its keys from `key` (by hit index).
    fn group(&self, hits: &[Hit], outs: &[Out], key: impl FnMut(usize) -> String) -> Group {
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

    fn waiting(&self) -> bool {
        matches!(self.state, State::Waiting(_))
    }
}

/// Checks the health of each share's shard before anything is sent: a share whose
/// shard backs off is answered by its error. `Err` when that fails the whole request
/// (a failure mode other than `open`); nothing was sent then.
fn check(outs: &mut [Out], hits: &[Hit], inner: &Inner) -> Result<(), StoreError> {
    for o in outs.iter_mut() {
        if let Err(e) = inner.health(o.target).check() {
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

/// The request's hits grouped by their shard (or slot), each group's hits in the
/// request's order.
fn group(inner: &Inner, hits: &[Hit]) -> SmallVec<[Out; FEW]> {
    let mut outs: SmallVec<[Out; FEW]> = SmallVec::new();
    for (i, h) in hits.iter().enumerate() {
        let target = inner.target(h);
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
    /// Not sent yet: nothing of it can have been consumed.
    Unsent,
    Waiting(Pending),
    Answered(Result<Reply, StoreError>),
}

/// A share's answer on its way.
enum Pending {
    /// Queued on a standalone shard's coalescer; dropped before the call is sent,
    /// the share is not sent.
    Queued(coalesce::Pending),
    /// A cluster's call, in a task of its own.
    Called(JoinHandle<Result<Reply, StoreError>>),
}

impl Future for Pending {
    type Output = Result<Reply, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Pending::Queued(queued) => coalesce::poll_outcome(queued, cx),
            Pending::Called(task) => Pin::new(task).poll(cx).map(|joined| {
                joined.unwrap_or_else(|e| {
                    Err(StoreError::failed(
                        ErrorKind::Protocol,
                        format!("store task failed: {e}"),
                    ))
                })
            }),
        }
    }
}

/// Sends `group`, the share of the request on `target`.
async fn send(
    inner: &Arc<Inner>,
    target: usize,
    group: Group,
    fixed_now: Option<Micros>,
) -> Result<Pending, StoreError> {
    match &inner.backend {
        Backend::Shards(shards) => {
            let queued = shards[target].coalescer.enqueue(group, fixed_now).await?;
            Ok(Pending::Queued(queued))
        }
        Backend::Cluster(_) => {
            let inner = inner.clone();
            Ok(Pending::Called(tokio::spawn(async move {
                let health = inner.health(target);
                inner.send_group(target, &health, group, fixed_now).await
            })))
        }
    }
}

/// The groups of one request, given to a task of their own if dropped unsettled.
struct Spread<'a> {
    inner: &'a Arc<Inner>,
    hits: &'a [Hit],
    sent: Micros,
    outs: SmallVec<[Out; FEW]>,
    settled: bool,
}

/// Decides `hits`, which span several shards (or slots), waiting `wait` for them.
/// `probe` hears of each shard's call.
pub(super) async fn decide(
    inner: &Arc<Inner>,
    hits: &[Hit],
    wait: Duration,
    probe: Option<&dyn Probe>,
) -> Result<Verdicts, StoreError> {
    let sent = inner.local_now();
    if let Some(v) = inner.cached(hits, sent) {
        return Ok(v);
    }
    // On the clock of the caller's timer, which starts after this.
    let until = Instant::now() + wait;
    let mut outs = group(inner, hits);
    check(&mut outs, hits, inner)?;
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
        if !matches!(o.state, State::Unsent) {
            continue;
        }
        let key = |i| super::shard::redis_key(&inner.prefix, &hits[i]);
        let group = o.group(hits, &spread.outs, key);
        spread.outs[k].state = match send(inner, o.target, group, fixed_now).await {
            Ok(pending) => State::Waiting(pending),
            Err(e) => State::Answered(Err(e)),
        };
    }
    let told = probe.zip(started);
    answers_until(inner, &mut spread.outs, until, told).await;
    if let Some((probe, started)) = told {
        for o in spread.outs.iter().filter(|o| o.waiting()) {
            let late = Some(&StoreError::Timeout);
            inner.tell(probe, o.target, "decide", o.indexes.len(), started, late);
        }
    }
    spread.settled = true;
    let mut tally = tally(inner, hits, sent, &spread.outs);
    if !tally.admitted && spread.outs.iter().any(Out::waiting) {
        // Denied without a hung shard's verdict: what it consumes, should it answer
        // after all, is given back.
        let late = spread.outs.drain(..).filter(Out::waiting).collect();
        hand_off(inner, hits, sent, late, Late::Denied);
    }
    if let Some(consumed) = tally.take_refund() {
        // In a task: once started, the refund finishes even if the caller gives up.
        // It is waited for, so that the next request sees it, until the deadline
        // at most: the caller's timer fires then.
        let (inner, hits) = (inner.clone(), hits.to_vec());
        let refund = tokio::spawn(async move { inner.refund(&hits, &consumed).await });
        wait_until(refund, until).await;
    }
    tally.finish(inner, hits)
}

/// Waits for `task` until `until` at most, leaving it to run on past that.
async fn wait_until<T>(mut task: JoinHandle<T>, until: Instant) {
    std::future::poll_fn(|cx| match Pin::new(&mut task).poll(cx) {
        Poll::Pending if Instant::now() < until => Poll::Pending,
        _ => Poll::Ready(()),
    })
    .await
}

/// Waits for the groups still out until `until`, telling `told`'s probe of each
/// answer (the calls started at its time); the groups that have not answered by
/// then are left out. It sets no timer: see the module doc.
async fn answers_until(
    inner: &Inner,
    outs: &mut [Out],
    until: Instant,
    told: Option<(&dyn Probe, SystemTime)>,
) {
    std::future::poll_fn(|cx| {
        let mut out = false;
        for o in outs.iter_mut() {
            let State::Waiting(pending) = &mut o.state else {
                continue;
            };
            let Poll::Ready(answer) = Pin::new(pending).poll(cx) else {
                out = true;
                continue;
            };
            if let Some((probe, started)) = told {
                // A call's end is when this request saw it: no earlier than the
                // shard answered.
                let error = answer.as_ref().err();
                inner.tell(probe, o.target, "decide", o.indexes.len(), started, error);
            }
            o.state = State::Answered(answer);
        }
        // One clock read per wake that leaves a group out: a request over several
        // shards wakes about once per shard.
        if out && Instant::now() < until {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await
}

/// Waits for every group still out.
async fn answers(outs: &mut [Out]) {
    for o in outs {
        if let State::Waiting(pending) = &mut o.state {
            o.state = State::Answered(pending.await);
        }
    }
}

/// Why groups still out are handed to a task.
enum Late {
    /// The request was denied without them: whatever they consume is given back.
    Denied,
    /// The caller stopped waiting before the request was decided: what was consumed
    /// is given back if, with their answers, the request turns out denied.
    Undecided,
}

/// Hands `outs` to a task that waits for the groups still out and gives back what
/// `late` says.
fn hand_off(
    inner: &Arc<Inner>,
    hits: &[Hit],
    sent: Micros,
    mut outs: SmallVec<[Out; FEW]>,
    late: Late,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let inner = inner.clone();
    let hits = hits.to_vec();
    runtime.spawn(async move {
        answers(&mut outs).await;
        let consumed = match late {
            Late::Denied => consumed(&hits, &outs),
            Late::Undecided => tally(&inner, &hits, sent, &outs)
                .take_refund()
                .unwrap_or_default(),
        };
        if !consumed.is_empty() {
            inner.refund(&hits, &consumed).await;
        }
    });
}

impl Drop for Spread<'_> {
    fn drop(&mut self) {
        if self.settled || !self.outs.iter().any(Out::waiting) {
            return;
        }
        // The caller stopped waiting with groups out: they may consume, so see them
        // through and give back what they took if the request is denied.
        let outs = std::mem::take(&mut self.outs);
        hand_off(self.inner, self.hits, self.sent, outs, Late::Undecided);
    }
}

/// What the groups' answers add up to.
struct Tally {
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

fn tally(inner: &Inner, hits: &[Hit], sent: Micros, outs: &[Out]) -> Tally {
    let mut verdicts = vec![Verdict::default(); hits.len()];
    let mut failed = None;
    let mut undecided = Vec::new();
    let mut whole = false;
    let mut decided = Micros::MAX;
    for o in outs {
        if let State::Answered(Ok(reply)) = &o.state {
            decided = decided.min(inner.decided_at(o.target, sent, reply.now));
            for (&i, &(v, _)) in o.indexes.iter().zip(&reply.verdicts) {
                verdicts[i] = v;
            }
            continue;
        }
        failed.get_or_insert_with(|| match &o.state {
            State::Answered(Err(e)) => e.clone(),
            // Its shard did not answer by the request's deadline.
            State::Waiting(_) => StoreError::Timeout,
            _ => StoreError::failed(ErrorKind::Connection, "not decided"),
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
    let refund = if admitted {
        Vec::new()
    } else {
        consumed(hits, outs)
    };
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

/// Per group of `outs` that answered and consumed, its consumed hits and their
/// refund tokens: what to give back of a request that is not admitted.
fn consumed(hits: &[Hit], outs: &[Out]) -> Vec<Spent> {
    let mut refund = Vec::new();
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
    refund
}

impl Tally {
    /// What to give back, if anything: what the shards consumed of a request that is
    /// not admitted.
    fn take_refund(&mut self) -> Option<Vec<Spent>> {
        (!self.refund.is_empty()).then(|| std::mem::take(&mut self.refund))
    }

    /// The request's verdicts (remembered by the denial cache, which passes the
    /// placeholders of undecided hits by), or the first error when it fails whole.
    fn finish(self, inner: &Inner, hits: &[Hit]) -> Result<Verdicts, StoreError> {
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
