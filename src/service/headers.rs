//! Rate-limit response headers that sluice asks Envoy to add (`--response-headers`).
//!
//! They describe the descriptor closest to its limit. `retry-after` is never earlier
//! than the true wait and carries up to 10 % random jitter, so that denied clients do
//! not all come back in the same second.

use rand::Rng;

use crate::algorithm::{Micros, SECOND};
use crate::limiter::Outcome;
use crate::policy::answer;

/// Which header set to emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// None; Envoy's own `enable_x_ratelimit_headers` can read the statuses instead.
    Off,
    /// `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset`.
    #[default]
    Draft03,
    /// `RateLimit-Policy` and `RateLimit` of draft-ietf-httpapi-ratelimit-headers.
    Ietf,
}

/// Whole seconds, rounded up, so a client that waits this long is not early.
fn ceil_secs(us: Micros) -> u64 {
    us.div_ceil(SECOND)
}

/// The headers for one outcome, as (name, value) pairs.
pub fn headers(outcome: &Outcome, style: HeaderStyle) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    each_header(outcome, style, &mut String::new(), |name, value| {
        out.push((name, value.to_string()));
    });
    out
}

/// Calls `emit` with each header of [`headers`], in order, each value written into
/// `scratch`: the gRPC answer is encoded from these without a String per header.
pub fn each_header(
    outcome: &Outcome,
    style: HeaderStyle,
    scratch: &mut String,
    mut emit: impl FnMut(&'static str, &str),
) {
    if style == HeaderStyle::Off {
        return;
    }
    // The closest descriptor: the one with the least remaining; among denied ones, the
    // one with the longest wait.
    let closest = outcome
        .statuses
        .iter()
        .filter_map(|s| {
            let rule = outcome.rule(s)?;
            // An unlimited rule has no limit to describe.
            Some((s, rule, rule.limit?, s.verdict?))
        })
        .min_by_key(|(s, _, _, v)| (!s.over_limit, v.remaining, u64::MAX - v.retry_after));

    if let Some((status, rule, limit, v)) = closest {
        let remaining = if outcome.over_limit { 0 } else { v.remaining };
        // A key a penalty tightened states the limit it was decided against, which
        // its remaining counts down from.
        let tightened = status.tightened.map(|_| status.requests_per_unit(rule));
        let s = &mut *scratch;
        match style {
            HeaderStyle::Draft03 => {
                match tightened {
                    Some(rpu) => {
                        s.clear();
                        answer::push_draft03_limit(s, rule, rpu, &limit);
                        emit("x-ratelimit-limit", s);
                    }
                    None => emit("x-ratelimit-limit", &rule.rendered.draft03_limit),
                }
                s.clear();
                push_u64(s, remaining);
                emit("x-ratelimit-remaining", s);
                s.clear();
                push_u64(s, ceil_secs(v.reset));
                emit("x-ratelimit-reset", s);
            }
            HeaderStyle::Ietf => {
                match tightened {
                    Some(rpu) => {
                        s.clear();
                        answer::push_ietf_policy(s, &rule.rendered.ietf_name, rpu, &limit);
                        emit("ratelimit-policy", s);
                    }
                    None => emit("ratelimit-policy", &rule.rendered.ietf_policy),
                }
                // "\"{name}\";r={remaining};t={reset}".
                s.clear();
                s.push_str(&rule.rendered.ietf_name);
                s.push_str(";r=");
                push_u64(s, remaining);
                s.push_str(";t=");
                push_u64(s, ceil_secs(v.reset));
                emit("ratelimit", s);
            }
            HeaderStyle::Off => {}
        }
    }

    if outcome.over_limit {
        scratch.clear();
        push_u64(scratch, retry_after_secs(outcome));
        emit("retry-after", scratch);
    }
}

/// `n` in decimal, as `to_string` writes it, without the formatting machinery.
fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// The wait before the request could pass: the longest wait of the limits that
/// denied it (all of them must have room), plus jitter.
fn retry_after_secs(outcome: &Outcome) -> u64 {
    let wait = outcome
        .statuses
        .iter()
        .filter(|s| s.over_limit)
        .filter_map(|s| {
            let v = s.verdict?;
            Some(if v.retry_after == u64::MAX {
                // Never admissible as sent (more hits than the limit): the window, or
                // the key's debt when longer.
                v.retry_wait(outcome.rule(s)?.limit?.window)
            } else {
                v.retry_after
            })
        })
        .max()
        // No verdict: the store failed closed. Ask for a short pause.
        .unwrap_or(SECOND);
    jittered(wait, rand::rng().random_range(0.0..=0.1))
}

/// `wait` in whole seconds rounded up, stretched by `jitter` (0.0 to 0.1). The
/// stretch is rounded down: rounded to nearest, a 5 s wait could be told 6 s, 20 %.
pub fn jittered(wait: Micros, jitter: f64) -> u64 {
    let base = ceil_secs(wait).max(1);
    let extra = (base as f64 * jitter).floor() as u64;
    base + extra
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_never_shortens_and_stays_within_ten_percent() {
        assert_eq!(jittered(1, 0.0), 1);
        assert_eq!(jittered(SECOND, 0.0), 1);
        assert_eq!(jittered(SECOND + 1, 0.0), 2);
        assert_eq!(jittered(30 * SECOND, 0.1), 33);
        for wait in 1..=100 {
            let s = jittered(wait * SECOND, 0.1);
            assert!(s >= wait && s * 10 <= wait * 11, "{wait} s told {s} s");
        }
        for j in [0.0, 0.05, 0.1] {
            let s = jittered(59 * SECOND + 500_000, j);
            assert!((60..=66).contains(&s), "{s}");
        }
    }

    /// A shed request is answered with a `retry-after` of the drain back under
    /// `from`, jittered, never shorter.
    #[tokio::test]
    async fn a_shed_request_gets_the_drain_as_retry_after() {
        use std::sync::Arc;
        let policy = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {window: 100s, requests_per_unit: 10, algorithm: token_bucket, shed: {from: 0.5}}\n";
        let clock = crate::clock::ManualClock::new(1_700_000_000 * SECOND);
        let limiter = crate::limiter::test_limiter(policy, &clock, Default::default())
            .with_chance(Arc::new(crate::limiter::shed::SeededChance::new(9)));
        let entries = [("ip", "1.2.3.4")];
        for _ in 0..10 {
            let o = limiter
                .decide("d", &[crate::limiter::Descriptor::new(&entries[..], 1)])
                .await;
            let s = o.statuses[0];
            if !s.shed {
                assert!(!o.over_limit);
                continue;
            }
            // Bucket of 10 refilled at one per 10 s: back under 5 in 10 s per token
            // above 5.
            let used = 10 - s.verdict.unwrap().remaining;
            let wait = (used - 5) * 10;
            let mut scratch = String::new();
            let mut retry = None;
            each_header(&o, HeaderStyle::Draft03, &mut scratch, |name, value| {
                if name == "retry-after" {
                    retry = Some(value.parse::<u64>().unwrap());
                }
            });
            let retry = retry.expect("retry-after on a shed answer");
            assert!(
                (wait..=wait + wait / 10 + 1).contains(&retry),
                "{retry} for {wait}"
            );
            return;
        }
        panic!("nothing was shed up to the limit");
    }

    /// A cost larger than the limit, charged: no wait admits another as large, and
    /// the key owes until its weighted count has decayed, 12.96 s here, past the
    /// 10 s window. The client is told to wait for that, jittered, not one window.
    #[tokio::test]
    async fn a_charge_past_a_window_of_debt_is_told_to_wait_for_it() {
        let policy = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {window: 10s, requests_per_unit: 10}\n";
        let clock = crate::clock::ManualClock::new(1_700_000_000 * SECOND + 3_440_000);
        let limiter = crate::limiter::test_limiter(policy, &clock, Default::default());
        let entries = [("k", "v")];
        let charge = crate::limiter::Descriptor {
            spend: crate::store::Spend::Always,
            ..crate::limiter::Descriptor::new(&entries[..], 25)
        };
        let o = limiter.decide("d", &[charge]).await;
        assert!(o.over_limit);
        let mut retry = None;
        each_header(
            &o,
            HeaderStyle::Draft03,
            &mut String::new(),
            |name, value| {
                if name == "retry-after" {
                    retry = Some(value.parse::<u64>().unwrap());
                }
            },
        );
        let retry = retry.expect("retry-after on OVER_LIMIT");
        assert!((13..=14).contains(&retry), "retry-after {retry}");
        // Then a one-hit request is admitted, and not a microsecond earlier.
        let one = [crate::limiter::Descriptor::new(&entries[..], 1)];
        clock.advance(12_960_000 - 1);
        assert!(limiter.decide("d", &one).await.over_limit);
        clock.advance(1);
        assert!(!limiter.decide("d", &one).await.over_limit);
    }

    #[test]
    fn numbers_are_written_as_before() {
        for n in [0, 7, 10, 99, 1_000_000_000, u64::from(u32::MAX), u64::MAX] {
            let mut s = String::from("x");
            push_u64(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }
}
