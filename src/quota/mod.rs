//! Quota sharing (RLQS): a bucket's limit divided among the Envoys that report it.
//!
//! Each Envoy reports, per bucket, what it admitted and denied; the bucket's rule
//! comes from the same policy as ShouldRateLimit's ([`govern`]), its demand is
//! shared with the other streams and replicas through the store
//! ([`Demand`](crate::store::Demand)), and each Envoy is assigned a token bucket of
//! its share ([`share`]). This module decides; the RLQS service only carries the
//! reports in and the assignments out, and tells its other streams when a share
//! moved.

mod bucket;
pub mod share;

pub use bucket::{govern, Governed};
pub use share::{Assignment, HYSTERESIS};

use crate::algorithm::{Limit, Micros, SECOND};
use crate::limiter::penalty::{BanInfo, InForce, Penalties};
use crate::policy::{tightened, FailureMode, Rule};
use crate::store::Share;

/// What a bucket gets when this stream tracks no more buckets: a free bucket is
/// free, a limited one takes the failure mode (`local` has no share to keep yet, so
/// it lets through as `open` does).
pub fn untracked(governed: &Governed<'_>, failure: FailureMode) -> Assignment {
    match (governed, failure) {
        (Governed::Free(_), _) | (_, FailureMode::Open | FailureMode::Local) => {
            Assignment::AllowAll
        }
        (_, FailureMode::Closed) => Assignment::DenyAll,
    }
}

/// What a limited bucket gets while its demand cannot be shared (the store away):
/// its last assignment holds; a bucket never assigned takes the failure mode.
pub fn unshared(last: Option<Assignment>, failure: FailureMode) -> Assignment {
    last.unwrap_or(match failure {
        FailureMode::Open | FailureMode::Local => Assignment::AllowAll,
        FailureMode::Closed => Assignment::DenyAll,
    })
}

/// The token bucket for this stream's demand `own` among everyone's `all` under
/// every one of `limits`, or `last` when the share hardly moved, so Envoy keeps its
/// bucket.
pub fn shared(limits: &[Limit], own: f64, all: Share, last: Option<Assignment>) -> Assignment {
    share::settle(share::tightest(limits, share::fraction(own, all)), last)
}

/// Whether this stream's demand moved past the hysteresis since `last`: the other
/// streams' shares may then have moved too.
pub fn moved(last: Option<f64>, own: f64) -> bool {
    last.is_none_or(|o| (own - o).abs() > HYSTERESIS * o.max(1.0))
}

/// What a report's denials did to a bucket's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Penalized {
    /// They started a sentence (counted in `sluice_penalty_bans_total`).
    pub started: bool,
    /// The key is denied outright (a ban or a block) for this much longer.
    pub denied_for: Option<Micros>,
    /// The key serves a tightening: its limit scaled by this factor (millionths).
    pub tightened: Option<u32>,
}

/// Counts `counted` denials of a bucket's key towards its rule's penalty, as
/// ShouldRateLimit's denials are counted (in one step, however many), then says
/// whether that started a sentence and which sentence the key serves.
pub fn penalize(
    penalties: &Penalties,
    rule: &Rule,
    key: &str,
    counted: u64,
    info: impl Fn() -> BanInfo,
) -> Penalized {
    let now = penalties.now();
    let started = rule.penalty.as_ref().is_some_and(|penalty| {
        penalties
            .deny_many(key, penalty, now, counted, info)
            .is_some()
    });
    let mut penalized = sentence(penalties, rule, key);
    penalized.started = started;
    penalized
}

/// How many of a report's `denied` count towards `rule`'s penalty: none without
/// one, and none under a `DENY_ALL` the stream sent. `last` is the assignment
/// Envoy enforced while it denied them: denials under a `DENY_ALL` Sluice sent (for
/// a ban, a block, a zero limit) are Sluice's own answer carried on until the next
/// report, not requests past the limit. Counted, they would start a new ban as
/// each one ended, for as long as the client sends at all.
pub fn counted(rule: &Rule, denied: u64, last: Option<Assignment>) -> u64 {
    if rule.penalty.is_none() || last == Some(Assignment::DenyAll) {
        0
    } else {
        denied
    }
}

/// The sentence `key` serves under `rule`, as ShouldRateLimit looks it up: an
/// operator's block whatever the rule, a penalty's sentence only while the rule
/// has a penalty.
pub fn sentence(penalties: &Penalties, rule: &Rule, key: &str) -> Penalized {
    let now = penalties.now();
    match penalties.in_force(key, now, rule.penalty.is_some()) {
        Some(InForce::Denied { left, .. }) => Penalized {
            denied_for: Some(left),
            ..Penalized::default()
        },
        Some(InForce::Tightened { factor_ppm }) => Penalized {
            tightened: Some(factor_ppm),
            ..Penalized::default()
        },
        None => Penalized::default(),
    }
}

/// `limits` (a rule's own, then its `rate_limits` list's others) as a tightened key
/// is held to them: the sentence is kept under the rule's own key, so, as in
/// ShouldRateLimit, only the rule's own limit is scaled.
pub fn tighten(limits: &mut [Limit], factor_ppm: u32) {
    if let Some(own) = limits.first_mut() {
        own.requests = tightened(own.requests, factor_ppm);
        own.burst = tightened(own.burst, factor_ppm);
    }
}

/// The time to live of a `DENY_ALL` sent for a sentence with `left` to run: the
/// stream's `ttl`, but never past the sentence's end (whole seconds, rounded up), so
/// Envoy stops denying when the ban ends rather than when its assignment expires.
pub fn sentence_ttl(ttl: u64, left: Micros) -> u64 {
    ttl.min(left.div_ceil(SECOND)).max(1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::clock::ManualClock;
    use crate::policy::{Penalty, Sentence};

    /// A report of `denied` denials made under `last`, counted as the stream counts
    /// them.
    fn report(
        penalties: &Penalties,
        rule: &Rule,
        key: &str,
        denied: u64,
        last: Option<Assignment>,
        info: impl Fn() -> BanInfo,
    ) -> Penalized {
        penalize(penalties, rule, key, counted(rule, denied, last), info)
    }

    fn limit(requests: u64) -> Limit {
        Limit {
            requests,
            window: SECOND,
            algorithm: Algorithm::FixedWindow,
            burst: requests,
            phase: 0,
        }
    }

    #[test]
    fn the_failure_mode_answers_for_buckets_without_a_share() {
        assert_eq!(
            untracked(&Governed::Free(None), FailureMode::Closed),
            Assignment::AllowAll
        );
        assert_eq!(unshared(None, FailureMode::Closed), Assignment::DenyAll);
        assert_eq!(unshared(None, FailureMode::Local), Assignment::AllowAll);
        let last = shared(
            &[limit(20)],
            1.0,
            Share {
                total: 4.0,
                streams: 2,
            },
            None,
        );
        assert_eq!(unshared(Some(last), FailureMode::Closed), last);
    }

    #[test]
    fn a_share_that_hardly_moved_keeps_the_last_bucket() {
        let all = Share {
            total: 4.0,
            streams: 2,
        };
        let first = shared(&[limit(20)], 1.0, all, None);
        let Assignment::TokenBucket {
            tokens_per_fill, ..
        } = first
        else {
            panic!("a token bucket: {first:?}");
        };
        assert_eq!(
            tokens_per_fill, 50,
            "a quarter of 20 a second, ten seconds a fill"
        );
        let near = Share {
            total: 4.2,
            streams: 2,
        };
        assert_eq!(shared(&[limit(20)], 1.0, near, Some(first)), first);
        assert!(!moved(Some(10.0), 10.5));
        assert!(moved(Some(10.0), 12.0));
        assert!(moved(None, 0.0));
    }

    /// The assignment of a lone stream's bucket under a limit of 1 a second.
    fn lone_bucket() -> Option<Assignment> {
        let alone = Share {
            total: 1.0,
            streams: 1,
        };
        Some(shared(&[limit(1)], 1.0, alone, None))
    }

    fn info() -> BanInfo {
        BanInfo {
            domain: "d".into(),
            rule: "k".into(),
            key: "v".into(),
        }
    }

    #[test]
    fn envoys_denials_count_towards_the_penalty_once_per_sentence() {
        let clock = ManualClock::new(1_700_000_000 * SECOND);
        let penalties = Penalties::new(Arc::new(clock.clone()), 100);
        let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        let policy =
            crate::policy::compile(crate::policy::parse_str("p.yaml", text).unwrap()).unwrap();
        let mut rule = policy.rule(0).clone();
        let bucket = lone_bucket();
        let banned = |rule: &Rule, key: &str, denied: u64| {
            report(&penalties, rule, key, denied, bucket, info)
                .denied_for
                .is_some()
        };
        assert!(!banned(&rule, "d|k=v", 100), "no penalty");
        rule.penalty = Some(Penalty {
            violations: 3,
            within: 10 * SECOND,
            sentence: Sentence::Ban(60 * SECOND),
            block: None,
        });
        assert!(!banned(&rule, "d|k=v", 2));
        assert_eq!(
            report(&penalties, &rule, "d|k=v", 1, bucket, info),
            Penalized {
                started: true,
                denied_for: Some(60 * SECOND),
                tightened: None,
            },
            "the third denial bans"
        );
        assert_eq!(penalties.bans_started(), 1);
        assert_eq!(
            report(&penalties, &rule, "d|k=v", 5, bucket, info),
            Penalized {
                started: false,
                denied_for: Some(60 * SECOND),
                tightened: None,
            },
            "banned still, and once"
        );
        // Billions of denials against a penalty of a billion violations are counted
        // exactly and start one ban (counted one by one, this test would not end).
        rule.penalty = Some(Penalty {
            violations: 1_000_000_000,
            ..rule.penalty.unwrap()
        });
        assert!(!banned(&rule, "d|k=w", 999_999_999));
        assert!(banned(&rule, "d|k=w", u64::MAX));
        assert!(banned(&rule, "d|k=w", u64::MAX), "banned still");
        assert_eq!(penalties.bans_started(), 2);
    }

    #[test]
    fn denials_under_sluices_own_deny_all_start_no_ban() {
        let clock = ManualClock::new(1_700_000_000 * SECOND);
        let penalties = Penalties::new(Arc::new(clock.clone()), 100);
        let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      penalty: {violations: 3, within: 10s, ban: 30s}\n";
        let policy =
            crate::policy::compile(crate::policy::parse_str("p.yaml", text).unwrap()).unwrap();
        let rule = policy.rule(0);
        let deny = Some(Assignment::DenyAll);
        assert_eq!(
            report(&penalties, rule, "d|k=v", 3, None, info).denied_for,
            Some(30 * SECOND)
        );
        clock.advance(31 * SECOND);
        // Envoy denied everything until it heard the ban was over: no new ban.
        assert_eq!(
            report(&penalties, rule, "d|k=v", 500, deny, info),
            Penalized::default()
        );
        assert_eq!(penalties.bans_started(), 1);
        // Denials under its share count again.
        let bucket = lone_bucket();
        assert!(report(&penalties, rule, "d|k=v", 3, bucket, info).started);
    }

    #[test]
    fn a_sentences_deny_all_lives_no_longer_than_the_sentence() {
        assert_eq!(sentence_ttl(15, 30 * SECOND), 15);
        assert_eq!(sentence_ttl(15, 4 * SECOND + 1), 5, "rounded up");
        assert_eq!(sentence_ttl(15, 1), 1);
        assert_eq!(sentence_ttl(15, 0), 1, "at least a second");
    }
}
