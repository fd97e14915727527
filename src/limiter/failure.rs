//! When the store fails: the failure a request is answered by, and
//! `failure_mode: local`, which answers from this replica's share of the limits,
//! with that share's upkeep among the replicas.

use super::{local, Limiter, Outcome, StoreFailure};
use crate::policy::FailureMode;
use crate::store::{Hit, Store, StoreError};

/// A replica's answer to a peer cut off from a shard ([`Limiter::peer_cut_off`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerReach {
    /// This replica reached the shard just now.
    pub reached: bool,
    /// And it reserves the peer's share.
    pub reserved: bool,
}

impl<S: Store> Limiter<S> {
    /// The failure of `error`, answered by `mode`: for the whole request, or only
    /// for the hits the store could not decide (`partial`).
    pub(super) fn failure(
        &self,
        error: &StoreError,
        mode: FailureMode,
        partial: bool,
    ) -> StoreFailure {
        StoreFailure {
            error: error.to_string(),
            mode,
            answer: self.settings.store_errors,
            store: self.store.name(),
            partial,
            full: *error == StoreError::Full,
        }
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

    /// `failure_mode: local`: the store's answer is remembered, and a store that
    /// cannot be reached is answered from this replica's share of the configured
    /// limits. A script or protocol error (a working store) is no outage: it stays
    /// an error, answered as `open`.
    pub(super) fn local_answer(
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
}
