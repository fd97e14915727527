//! How long a caller's deadline lets the store be waited for and a leaky_bucket
//! answer be held, and the store call raced against that wait.

use std::time::Duration;

use super::Limiter;
use crate::algorithm::{Micros, NO_DEADLINE};
use crate::store::{Hit, Probe, Store, StoreError};

/// The least time kept back from a caller's deadline (see [`store_wait`]).
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(2);

/// The longest store wait that still lets the answer reach a caller who gives up
/// `left` from now: `left` less a fifth of it, and less at least
/// [`DEADLINE_MARGIN`]. The caller's timer started before it sent the call, and the
/// answer still has to leave sluice (after a Tokio timer that fires up to a
/// millisecond late) and cross the network; a fifth leaves room for both on a busy
/// node, where a tenth did not. Envoy's default 20 ms leaves 16 ms, so
/// the default `--store-timeout` of 15 ms still decides; a 50 ms deadline waits at
/// most 40 ms.
pub fn store_wait(left: Duration) -> Duration {
    left.saturating_sub((left / 5).max(DEADLINE_MARGIN))
}

impl<S: Store> Limiter<S> {
    /// The longest a leaky_bucket answer may be held for a caller who gives up
    /// `left` from now: `left` less the store's longest call and
    /// [`DEADLINE_MARGIN`] twice (a timer late, the answer on its way), or less a
    /// fifth of it when that is smaller. So Envoy's default 20 ms holds 16 ms, as
    /// [`store_wait`] waits, and a 6 s timeout holds all but about 20 ms of it.
    pub fn hold_budget(&self, left: Duration) -> Micros {
        let call = self.settings.store_timeout.min(store_wait(left));
        let margin = (left / 5).min(call + DEADLINE_MARGIN * 2);
        let hold = left.saturating_sub(margin.max(DEADLINE_MARGIN));
        Micros::try_from(hold.as_micros()).unwrap_or(NO_DEADLINE)
    }

    /// Asks the store, waiting at most the store timeout, or the caller's `wait`
    /// when shorter. The store is told the wait too: over several shards it answers
    /// by then with what those that answered decided ([`Store::decide_within`]).
    pub(super) async fn ask_store(
        &self,
        hits: &[Hit],
        wait: Option<Duration>,
        probe: Option<&dyn Probe>,
    ) -> Result<crate::store::Verdicts, StoreError> {
        let wait = wait.map_or(self.settings.store_timeout, |w| {
            w.min(self.settings.store_timeout)
        });
        let call = std::pin::pin!(self.store.decide_within(hits, wait, probe));
        self.race_store(call, wait).await
    }

    /// A store call, raced against `wait`. The caller pins the call: taken by value
    /// and pinned here, it would be held twice in this future's state, and each
    /// request's future (which holds this one) would be moved and allocated at twice
    /// its size.
    async fn race_store(
        &self,
        mut call: std::pin::Pin<
            &mut impl std::future::Future<Output = Result<crate::store::Verdicts, StoreError>>,
        >,
        wait: Duration,
    ) -> Result<crate::store::Verdicts, StoreError> {
        // A store that answers on the first poll (the memory store always does) needs
        // no timer; only a pending call is raced.
        if let Some(result) = futures::FutureExt::now_or_never(&mut call) {
            return result;
        }
        match tokio::time::timeout(wait, &mut call).await {
            Ok(result) => result,
            // The request's one timer, the store's too: polled once more past the
            // wait, a request over several shards answers with what those that
            // answered decided. Anything still pending is the failure mode's.
            Err(_) => futures::FutureExt::now_or_never(call).unwrap_or(Err(StoreError::Timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{test_limiter, Settings};

    #[test]
    fn a_hold_leaves_the_store_call_and_a_margin_before_the_deadline() {
        let clock = crate::clock::ManualClock::new(0);
        let limiter = test_limiter(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
            &clock,
            Settings::default(),
        );
        let ms = |n: u64| Duration::from_millis(n);
        // Short deadlines keep a fifth, as the store's wait does (Envoy's 20 ms).
        assert_eq!(limiter.hold_budget(ms(20)), 16_000);
        assert_eq!(limiter.hold_budget(ms(50)), 40_000);
        // Long ones keep the store's longest call (15 ms) and 4 ms, not a fifth.
        assert_eq!(limiter.hold_budget(ms(6_000)), 5_981_000);
        assert_eq!(limiter.hold_budget(ms(1)), 0);
        assert_eq!(limiter.hold_budget(Duration::ZERO), 0);
    }
}
