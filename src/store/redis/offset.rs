//! When a shard decided, on the local clock: the over-limit cache counts a key's wait
//! from there.
//!
//! A decision is made at the shard's `TIME` inside the script, some time after the
//! request was sent. Counting a wait from the send time is safe (never later than the
//! truth) but ends every cached denial early by the request's queueing and round
//! trip, and the requests that arrive in that gap go to Redis only to be denied;
//! on an oversubscribed machine the gap is milliseconds. Here each call's
//! `redis_now - sent` is an upper bound of the offset between the shard's clock and
//! the local one (the decision came after the send), so the smallest recent one,
//! `bound`, is the tightest: `redis_now - bound` is a local time no later than the
//! decision and no earlier than the send.
//!
//! Only samples of the last one to two seconds count, so that the two clocks drifting
//! apart (tens of µs per second at worst) cannot make the bound stale. A forward step
//! of the shard's wall clock (not a slew) can place a decision up to the step late
//! for those seconds; Redis's own windows jump with such a step anyway.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use crate::algorithm::{Micros, SECOND};

/// How long a sample counts: between one and two of these.
const EPOCH: Micros = SECOND;

/// One shard's clock-offset bound.
#[derive(Debug)]
pub struct Offset {
    epoch: AtomicU64,
    current: AtomicI64,
    previous: AtomicI64,
}

impl Default for Offset {
    fn default() -> Self {
        Offset {
            epoch: AtomicU64::new(0),
            current: AtomicI64::new(i64::MAX),
            previous: AtomicI64::new(i64::MAX),
        }
    }
}

impl Offset {
    /// Records a call sent at local `sent` that the shard decided at its `redis_now`,
    /// and returns the local time to count the decision's waits from: between `sent`
    /// and the true time of the decision. Lock-free; racing callers may lose a sample,
    /// which only loosens the bound.
    pub fn decided_at(&self, sent: Micros, redis_now: Micros) -> Micros {
        let (Ok(s), Ok(r)) = (i64::try_from(sent), i64::try_from(redis_now)) else {
            return sent;
        };
        let sample = r - s;
        let epoch = sent / EPOCH;
        let seen = self.epoch.load(Relaxed);
        if epoch > seen
            && self
                .epoch
                .compare_exchange(seen, epoch, Relaxed, Relaxed)
                .is_ok()
        {
            let last = self.current.swap(i64::MAX, Relaxed);
            // Samples older than the previous epoch are dropped.
            let kept = if epoch == seen + 1 { last } else { i64::MAX };
            self.previous.store(kept, Relaxed);
        }
        // Read first: most samples are not a new minimum, and a load leaves the cache
        // line shared between the threads where a read-modify-write would move it.
        let mut current = self.current.load(Relaxed);
        if sample < current {
            current = self.current.fetch_min(sample, Relaxed).min(sample);
        }
        let bound = current.min(self.previous.load(Relaxed));
        // bound <= this call's own sample, so the result is >= sent (and a bound
        // from clocks far apart, too far to subtract, leaves `sent`).
        r.checked_sub(bound.min(sample))
            .and_then(|t| u64::try_from(t).ok())
            .unwrap_or(sent)
            .max(sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_are_placed_between_the_send_and_the_truth() {
        // The shard's clock runs 5 s ahead; each call waits in a queue (0-3 ms) and
        // then 100 µs more before the script reads the time.
        let offset = Offset::default();
        let delta = 5 * SECOND;
        let mut x: u64 = 7;
        let mut gained = 0;
        for i in 0..10_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let sent = 1_000 * SECOND + i * 300;
            let true_local = sent + 100 + (x >> 33) % 3_000;
            let at = offset.decided_at(sent, true_local + delta);
            assert!(
                at >= sent && at <= true_local,
                "call {i}: {sent} {at} {true_local}"
            );
            gained += at - sent;
        }
        // Most of the queueing is recovered once a quick call has been seen.
        assert!(gained / 10_000 > 1_000, "{}", gained / 10_000);
    }

    #[test]
    fn old_samples_stop_counting() {
        let offset = Offset::default();
        // A quick call while the shard's clock was 1,000 µs ahead...
        assert_eq!(
            offset.decided_at(10 * SECOND, 10 * SECOND + 1_000),
            10 * SECOND
        );
        // ...then it is only 500 µs ahead, and calls take 2,000 µs: while the old
        // sample counts, decisions are placed 500 µs early (safe), then it is dropped.
        let slow = |t: Micros| offset.decided_at(t, t + 500 + 2_000);
        assert_eq!(slow(10 * SECOND + 100), 10 * SECOND + 100 + 1_500);
        assert_eq!(slow(11 * SECOND), 11 * SECOND + 1_500);
        assert_eq!(slow(12 * SECOND), 12 * SECOND);
        assert_eq!(slow(12 * SECOND + 10), 12 * SECOND + 10);
    }

    #[test]
    fn clocks_too_far_apart_to_subtract_leave_the_send_time() {
        let offset = Offset::default();
        let sent = i64::MAX as Micros;
        // A shard whose clock read 0, then one that read the largest time.
        assert_eq!(offset.decided_at(sent, 0), sent);
        assert_eq!(offset.decided_at(sent, sent), sent);
    }
}
