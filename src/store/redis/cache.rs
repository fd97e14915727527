//! A local cache of over-limit decisions: once Redis says a key is over its limit
//! for a request of `hits` until T, a request of as many hits on that key with the
//! same limit is denied from memory until T, with no Redis call, when every
//! other hit of the request is remembered as over limit too: a hit the cache knows
//! nothing of goes to Redis with the rest, so its status is its real state. An
//! admission that leaves a key with no room is remembered the same way, until the
//! time its next hit fits (the script's `next_room`). A leaky_bucket turn denied as
//! too late for its caller (`Verdict::late`) is not remembered: it holds for that
//! caller's deadline only.
//!
//! T is the time the call was *sent* plus retry_after: the script ran after that, so
//! T is never later than the truth and no request is denied that Redis would admit.
//! Other replicas' hits can only push the true time later. A larger request waits
//! longer under most algorithms (a bucket refills token by token), so it goes to
//! Redis rather than get a smaller request's wait. The reset a cached answer gives
//! counts down from the one Redis gave, from the time the call was sent. The map is bounded: when
//! full, expired entries go, and if none had expired, everything does.
//!
//! Redis may lose what it said (a restart without persistence, `FLUSHALL`, an
//! operator's `DEL` to reset a key): a denial is therefore answered from memory for
//! at most [`RECHECK`] before Redis is asked again, so a lost counter is admitted
//! again within that, on every replica, while a flood on a full key still costs
//! Redis one call per key per [`RECHECK`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::algorithm::{Limit, Micros, Verdict};
use crate::store::{Hit, Mode, Verdicts};

/// The longest a remembered denial is answered before Redis is asked again.
pub const RECHECK: Micros = 1_000_000;

#[derive(Debug, Clone)]
struct Denied {
    /// When the call that told it was sent.
    sent: Micros,
    /// When the denial ends, as Redis said.
    until: Micros,
    limit: Limit,
    hits: u64,
    verdict: Verdict,
}

impl Denied {
    /// Until when it is answered from memory: its end, or [`RECHECK`] after the
    /// call that told it, whichever comes first.
    fn recheck(&self) -> Micros {
        self.until.min(self.sent.saturating_add(RECHECK))
    }
}

/// See the module doc.
#[derive(Debug)]
pub struct DenialCache {
    map: Mutex<HashMap<String, Denied, ahash::RandomState>>,
    /// The map's length, readable without the lock: most requests find it empty.
    len: AtomicUsize,
    capacity: usize,
}

impl DenialCache {
    pub fn new(capacity: usize) -> Self {
        DenialCache {
            map: Mutex::new(HashMap::default()),
            len: AtomicUsize::new(0),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Denied, ahash::RandomState>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The request's answer when *every* hit is known to be over limit at `now`:
    /// each hit's own remembered denial. A request with any other hit goes to Redis,
    /// so that hit's status is its real state (remaining, reset), not a guess; the
    /// script then denies it without spending, as the cache would have.
    pub fn lookup(&self, hits: &[Hit], now: Micros) -> Option<Verdicts> {
        if self.capacity == 0 || self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let map = self.lock();
        // Most requests' keys are not in the map: look the first one up before
        // allocating.
        let first = known(&map, hits.first()?, now)?;
        let mut verdicts = Vec::with_capacity(hits.len());
        verdicts.push(first);
        for h in &hits[1..] {
            verdicts.push(known(&map, h, now)?);
        }
        drop(map);
        Some(Verdicts {
            admitted: false,
            verdicts,
            now: None,
            failed: None,
        })
    }

    /// Remembers the enforced denials of a decided request, sent at `sent`, and the
    /// admissions (of a request that was `admitted`, so they were spent) that left a
    /// key with no room: an attacker's next request is then denied without a round
    /// trip too.
    pub fn remember(&self, hits: &[Hit], verdicts: &[Verdict], admitted: bool, sent: Micros) {
        if self.capacity == 0 {
            return;
        }
        let mut map = None;
        for (i, (h, v)) in hits.iter().zip(verdicts).enumerate() {
            if h.mode != Mode::Enforce || h.hits == 0 {
                continue;
            }
            // A key's second hit in a batch was judged with the first one's hits
            // added, which the denied request never spent: not a fact about the key.
            if hits[..i].iter().any(|e| e.key == h.key) {
                continue;
            }
            let (wait, min_hits, verdict) = if v.admitted {
                let full =
                    admitted && v.remaining == 0 && !hits[i + 1..].iter().any(|e| e.key == h.key);
                match full.then(|| next_room(v)).flatten() {
                    Some(wait) => (
                        wait,
                        1,
                        Verdict {
                            admitted: false,
                            delay: 0,
                            next_room: 0,
                            owed: 0,
                            ..*v
                        },
                    ),
                    None => continue,
                }
            } else if v.retry_after == u64::MAX || v.late {
                // A late turn is denied for its caller's deadline only: one with a
                // longer deadline is admitted.
                continue;
            } else {
                (v.retry_after, h.hits, *v)
            };
            let map = map.get_or_insert_with(|| self.lock());
            if map.len() >= self.capacity {
                map.retain(|_, d| d.recheck() > sent);
                if map.len() >= self.capacity {
                    map.clear();
                }
            }
            map.insert(
                h.key.clone(),
                Denied {
                    sent,
                    until: sent.saturating_add(wait),
                    limit: h.limit,
                    hits: min_hits,
                    verdict,
                },
            );
            self.len.store(map.len(), Ordering::Relaxed);
        }
    }

    /// Forgets what is known of `keys`: a refund has given them room back, so a
    /// denial remembered before it may no longer hold.
    pub fn forget<'k>(&self, mut keys: impl Iterator<Item = &'k str>) {
        if self.len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut map = self.lock();
        if keys.any(|k| map.remove(k).is_some()) {
            // Go on through the rest (`any` stopped at the first).
            for k in keys {
                map.remove(k);
            }
            self.len.store(map.len(), Ordering::Relaxed);
        }
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `h`'s remembered denial at `now`, if one holds for it: an enforced hit of the
/// remembered hits on the same limit, before the denial's end.
fn known(
    map: &HashMap<String, Denied, ahash::RandomState>,
    h: &Hit,
    now: Micros,
) -> Option<Verdict> {
    let d = map.get(&h.key)?;
    let holds =
        h.mode == Mode::Enforce && h.hits == d.hits && h.limit == d.limit && d.recheck() > now;
    let aged = d.verdict.reset.saturating_sub(now.saturating_sub(d.sent));
    holds.then(|| Verdict {
        admitted: false,
        retry_after: d.until - now,
        reset: aged.max(d.until - now),
        // A check or a request owes nothing, whatever the remembered charge owed.
        owed: 0,
        ..d.verdict
    })
}

/// After an admission that left no room, how long until a one-hit request could pass:
/// the script's `next_room`, exact like a denial's retry_after, so measured from the
/// time the call was sent it is never later than the truth. `None` when there is
/// nothing to remember (no wait, or never).
fn next_room(v: &Verdict) -> Option<Micros> {
    Some(v.next_room).filter(|&t| t > 0 && t != u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::store::testkit::hit;

    fn denied(retry_after: Micros) -> Verdict {
        Verdict {
            admitted: false,
            retry_after,
            reset: retry_after,
            ..Verdict::default()
        }
    }

    /// Redis may lose a counter (a restart, FLUSHALL): a denial is answered from
    /// memory for RECHECK at most, with Redis's own retry-after counting down.
    #[test]
    fn a_long_denial_is_asked_again_after_the_recheck() {
        let c = DenialCache::new(10);
        let h = hit("k", Algorithm::FixedWindow, 5, 1);
        let hour = 3_600_000_000;
        c.remember(std::slice::from_ref(&h), &[denied(hour)], false, 1_000);
        let v = c.lookup(std::slice::from_ref(&h), 1_000 + RECHECK - 1);
        let v = v.expect("cached within the recheck");
        assert_eq!(v.verdicts[0].retry_after, hour - RECHECK + 1);
        assert!(
            c.lookup(std::slice::from_ref(&h), 1_000 + RECHECK)
                .is_none(),
            "asked again"
        );
    }

    #[test]
    fn denies_from_memory_until_retry_after_and_only_same_sized_requests() {
        let c = DenialCache::new(10);
        let h = hit("k", Algorithm::FixedWindow, 5, 2);
        c.remember(std::slice::from_ref(&h), &[denied(100)], false, 1_000);
        let v = c.lookup(std::slice::from_ref(&h), 1_050).expect("cached");
        assert!(!v.admitted);
        assert_eq!(v.verdicts[0].retry_after, 50);
        assert!(
            c.lookup(std::slice::from_ref(&h), 1_100).is_none(),
            "expired"
        );
        let smaller = hit("k", Algorithm::FixedWindow, 5, 1);
        assert!(c.lookup(&[smaller], 1_050).is_none());
        // A larger one's wait is not the remembered one's.
        let larger = hit("k", Algorithm::FixedWindow, 5, 3);
        assert!(c.lookup(&[larger], 1_050).is_none());
        let other_limit = hit("k", Algorithm::FixedWindow, 6, 2);
        assert!(c.lookup(&[other_limit], 1_050).is_none());
        let mut shadow = h.clone();
        shadow.mode = Mode::Shadow;
        assert!(c.lookup(&[shadow], 1_050).is_none());
    }

    /// A token bucket of 5 an hour, empty: one token is 720 s away, three are 2,160 s
    /// away. A three-hit request after a cached one-hit denial goes to Redis, not
    /// answered with the one-hit wait (earlier than the truth).
    #[test]
    fn a_larger_request_is_not_given_a_smaller_ones_wait() {
        use crate::algorithm::{decide, SECOND};
        let limit = Limit {
            algorithm: Algorithm::TokenBucket,
            requests: 5,
            window: 3_600 * SECOND,
            burst: 5,
            phase: 0,
        };
        let now = 1_700_000_000 * SECOND;
        let full = decide(&limit, None, now, 5);
        assert!(full.verdict.admitted);
        let mut one = hit("k", Algorithm::TokenBucket, 5, 1);
        one.limit = limit;
        let three = Hit {
            hits: 3,
            ..one.clone()
        };
        let denied_one = decide(&limit, full.next.as_ref(), now, 1).verdict;
        let denied_three = decide(&limit, full.next.as_ref(), now, 3).verdict;
        assert!(!denied_one.admitted && !denied_three.admitted);
        assert!(denied_three.retry_after > denied_one.retry_after);
        let c = DenialCache::new(10);
        // Remembered both ways: the admission that filled the key, and a denial.
        c.remember(std::slice::from_ref(&one), &[full.verdict], true, now);
        assert!(c.lookup(std::slice::from_ref(&three), now).is_none());
        c.remember(std::slice::from_ref(&one), &[denied_one], false, now);
        assert!(c.lookup(std::slice::from_ref(&three), now).is_none());
        let cached = c.lookup(std::slice::from_ref(&one), now).unwrap();
        assert_eq!(cached.verdicts[0].retry_after, denied_one.retry_after);
    }

    /// The reset of a cached answer counts down as the real one does, never past
    /// the denial's own end.
    #[test]
    fn a_cached_reset_counts_down() {
        let c = DenialCache::new(10);
        let h = hit("k", Algorithm::FixedWindow, 5, 1);
        let v = Verdict {
            admitted: false,
            retry_after: 100,
            reset: 2_000,
            ..Verdict::default()
        };
        c.remember(std::slice::from_ref(&h), &[v], false, 1_000);
        let at = |now| c.lookup(std::slice::from_ref(&h), now).unwrap().verdicts[0].reset;
        assert_eq!(at(1_000), 2_000);
        assert_eq!(at(1_040), 1_960);
        assert_eq!(at(1_099), 1_901);
    }

    /// A request with a hit the cache knows nothing of is not answered from it:
    /// that hit's status must be its real state, which only Redis has. When every
    /// hit is remembered, each gets its own remembered denial.
    #[test]
    fn answers_only_when_every_hit_is_known_each_with_its_own_state() {
        let c = DenialCache::new(10);
        let over = hit("over", Algorithm::FixedWindow, 10, 1);
        let other = hit("other", Algorithm::FixedWindow, 20, 1);
        c.remember(std::slice::from_ref(&over), &[denied(100)], false, 1_000);
        assert!(c.lookup(std::slice::from_ref(&over), 1_010).is_some());
        assert!(
            c.lookup(&[other.clone(), over.clone()], 1_010).is_none(),
            "the other descriptor's state is not known here"
        );
        assert!(c.lookup(&[over.clone(), other.clone()], 1_010).is_none());

        c.remember(std::slice::from_ref(&other), &[denied(500)], false, 1_000);
        let v = c.lookup(&[other, over], 1_010).expect("both known");
        assert!(!v.admitted);
        assert_eq!(v.verdicts.len(), 2);
        assert_eq!(v.verdicts[0].retry_after, 490);
        assert_eq!(v.verdicts[1].retry_after, 90);
        assert!(v.verdicts.iter().all(|v| !v.admitted));
    }

    #[test]
    fn stays_bounded() {
        let c = DenialCache::new(4);
        for i in 0..10 {
            let h = hit(&format!("k{i}"), Algorithm::FixedWindow, 5, 1);
            c.remember(&[h], &[denied(100)], false, 1_000);
        }
        assert!(c.len() <= 4);
        c.remember(
            &[hit("never", Algorithm::FixedWindow, 5, 9)],
            &[denied(u64::MAX)],
            false,
            0,
        );
        assert!(c
            .lookup(&[hit("never", Algorithm::FixedWindow, 5, 9)], 1)
            .is_none());
    }

    /// An admission that leaves no room is remembered exactly as long as the
    /// algorithm itself would deny a one-hit request: checked against the algorithms,
    /// the sliding ones with earlier hits still weighing (the previous window, older
    /// log entries), so the room comes back part-way through a window.
    #[test]
    fn a_full_admission_is_remembered_exactly_as_long_as_it_denies() {
        use crate::algorithm::{decide, SECOND};
        let now = 1_700_000_000 * SECOND + 123_457;
        for (alg, requests, burst, earlier) in [
            (Algorithm::FixedWindow, 3, 3, None),
            (Algorithm::TokenBucket, 7, 3, None),
            (Algorithm::LeakyBucket, 5, 2, None),
            (Algorithm::SlidingWindowCounter, 4, 4, None),
            (
                Algorithm::SlidingWindowCounter,
                4,
                4,
                Some((now - 700_000, 3)),
            ),
            (Algorithm::SlidingWindowLog, 4, 4, None),
            (Algorithm::SlidingWindowLog, 4, 4, Some((now - 700_000, 2))),
        ] {
            let limit = Limit {
                algorithm: alg,
                requests,
                window: SECOND,
                burst,
                phase: 0,
            };
            let mut state = None;
            if let Some((at, hits)) = earlier {
                let d = decide(&limit, None, at, hits);
                assert!(d.verdict.admitted, "{alg:?}");
                state = d.next;
            }
            let mut last = None;
            while let Some(v) = {
                let d = decide(&limit, state.as_ref(), now, 1);
                d.verdict.admitted.then(|| {
                    state = d.next;
                    d.verdict
                })
            } {
                last = Some(v);
            }
            let v = last.expect("admitted at least once");
            assert_eq!(v.remaining, 0, "{alg:?}");
            let mut h = hit("k", alg, requests, 1);
            h.limit = limit;
            let c = DenialCache::new(10);
            c.remember(std::slice::from_ref(&h), &[v], false, now);
            assert!(
                c.lookup(std::slice::from_ref(&h), now).is_none(),
                "{alg:?}: not spent"
            );
            c.remember(std::slice::from_ref(&h), &[v], true, now);
            let cached = c.lookup(std::slice::from_ref(&h), now).expect("remembered");
            assert_eq!(cached.verdicts[0].next_room, 0, "{alg:?}");
            let until = now + cached.verdicts[0].retry_after;
            assert!(
                !decide(&limit, state.as_ref(), until - 1, 1)
                    .verdict
                    .admitted,
                "{alg:?}"
            );
            assert!(
                decide(&limit, state.as_ref(), until, 1).verdict.admitted,
                "{alg:?}"
            );
            assert!(
                c.lookup(std::slice::from_ref(&h), until).is_none(),
                "{alg:?}"
            );
        }
        // A full admission without a finite next_room is not remembered.
        let c = DenialCache::new(10);
        let h = hit("s", Algorithm::SlidingWindowCounter, 1, 1);
        for next_room in [0, u64::MAX] {
            let full = Verdict {
                admitted: true,
                reset: SECOND,
                next_room,
                ..Verdict::default()
            };
            c.remember(std::slice::from_ref(&h), &[full], true, 0);
            assert!(c.lookup(std::slice::from_ref(&h), 1).is_none());
        }
    }
}
