//! A bucket's limit shared among the Envoys reporting it: each stream's demand from
//! its usage report, its share of the limit, and the token bucket Envoy enforces.
//!
//! Envoy 1.40's token bucket refills continuously at `tokens_per_fill /
//! fill_interval` (the interval cut to whole seconds), holds `max_tokens`, and starts
//! full whenever an assignment changes it; an identical assignment keeps the bucket
//! as it is. So a share that moved only a little is sent unchanged ([`settle`]): a
//! fresh full bucket on every report would admit up to `max_tokens` more each time.
//! Because the refill is continuous, a fill interval of several windows carries the
//! same rate with finer steps ([`WINDOWS_PER_FILL`]).

use crate::algorithm::{Limit, Micros, SECOND};
use crate::store::Share;

/// A share that moved by less than this fraction keeps the last assignment.
pub const HYSTERESIS: f64 = 0.1;

/// Windows per fill interval. Shares are rounded down to whole tokens per fill, so
/// with one window per fill each Envoy could leave up to a request per window unused
/// (18 of 20 a second for two Envoys at 3:1, whose exact shares 15 and 5 measure a
/// hair under). Ten windows cut that to a tenth of a request per window; the rate
/// and `max_tokens` stay the rule's.
pub const WINDOWS_PER_FILL: u64 = 10;

/// What one Envoy is told to do with one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    AllowAll,
    DenyAll,
    /// Envoy's token bucket; `fill_interval` in whole seconds (at least 1).
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval: u64,
    },
}

/// A stream's demand for a bucket in requests per second: what it admitted and
/// denied since its last report, over the time since then. `measured` is that time
/// on Sluice's clock, from the stream's previous report of the bucket; Envoy's own
/// `time_elapsed` (`reported`) is rounded down to whole seconds (0 in a new bucket's
/// first report), so the longer of the two is taken: Sluice's figure as a rule, and
/// Envoy's when the previous report reached Sluice late (a bucket's first report can
/// come seconds after its first request while the stream opens, and the next one
/// counts from the request). At least one second either way, so a first report's
/// single request does not read as a flood.
pub fn demand(allowed: u64, denied: u64, reported: Micros, measured: Option<Micros>) -> f64 {
    let span = measured.unwrap_or(0).max(reported).max(SECOND);
    allowed.saturating_add(denied) as f64 / (span as f64 / SECOND as f64)
}

/// This stream's fraction of the bucket: its demand over everyone's, or an even
/// split while no stream has any demand.
pub fn fraction(own: f64, all: Share) -> f64 {
    if all.total > 0.0 {
        (own / all.total).clamp(0.0, 1.0)
    } else {
        1.0 / f64::from(all.streams.max(1))
    }
}

/// The token bucket for `fraction` of `limit`. The fill interval is
/// [`WINDOWS_PER_FILL`] of the limit's windows in whole seconds (one window when the
/// tokens would not fit Envoy's 32 bits), so the rate is the rule's own:
/// `requests x fraction` per window. `max_tokens` is the same fraction of the burst
/// (token_bucket's `burst`; one window's requests for the other algorithms, a
/// window of less than a second included). Both
/// round down, so the streams' sum stays within the limit, but never to 0: a bucket
/// with no tokens never refills, and an idle Envoy must be able to let its first
/// requests through to show its demand in its next report.
pub fn token_bucket(limit: &Limit, fraction: f64) -> Assignment {
    if limit.requests == 0 {
        return Assignment::DenyAll;
    }
    let window = limit.window.div_ceil(SECOND).max(1);
    // Requests per whole-second window, when the window is no whole number of seconds.
    let scale = (window * SECOND) as f64 / limit.window as f64;
    let burst = match limit.algorithm {
        crate::algorithm::Algorithm::TokenBucket => limit.burst,
        _ => limit.requests,
    };
    let windows = if limit.requests as f64 * scale * WINDOWS_PER_FILL as f64 <= f64::from(u32::MAX)
    {
        WINDOWS_PER_FILL
    } else {
        1
    };
    // The epsilon keeps 20 x 0.75 at 15 whatever the last bit of the product.
    let part = |n: f64| ((n * fraction + 1e-9).floor() as u64).clamp(1, u64::from(u32::MAX)) as u32;
    Assignment::TokenBucket {
        // The capacity is not scaled: Envoy refills continuously, so a bucket of
        // one window's requests keeps a short window's burst at the rule's rate.
        max_tokens: part(burst.max(1) as f64),
        tokens_per_fill: part(limit.requests as f64 * scale * windows as f64),
        fill_interval: window.saturating_mul(windows),
    }
}

/// How long Envoy's bucket of `a` takes to fill again once drained. A bucket
/// abandoned sooner comes back full with the next request, so it is kept idle at
/// least this long.
pub fn refill(a: Assignment) -> Micros {
    match a {
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval,
        } => (u128::from(max_tokens) * u128::from(fill_interval) * u128::from(SECOND))
            .div_ceil(u128::from(tokens_per_fill.max(1)))
            .min(u128::from(Micros::MAX)) as Micros,
        Assignment::AllowAll | Assignment::DenyAll => 0,
    }
}

/// The token bucket for `fraction` of each of `limits` (a `rate_limits` list) that
/// passes none of them: the slowest refill of their buckets and the smallest
/// capacity. `AllowAll` for no limit at all.
pub fn tightest(limits: &[Limit], fraction: f64) -> Assignment {
    let buckets = limits.iter().map(|l| token_bucket(l, fraction));
    buckets
        .reduce(|a, b| match (a, b) {
            (
                Assignment::TokenBucket {
                    max_tokens: ma,
                    tokens_per_fill: ta,
                    fill_interval: fa,
                },
                Assignment::TokenBucket {
                    max_tokens: mb,
                    tokens_per_fill: tb,
                    fill_interval: fb,
                },
            ) => {
                // ta / fa <= tb / fb, without rounding.
                let (tokens_per_fill, fill_interval) =
                    if u128::from(ta) * u128::from(fb) <= u128::from(tb) * u128::from(fa) {
                        (ta, fa)
                    } else {
                        (tb, fb)
                    };
                Assignment::TokenBucket {
                    max_tokens: ma.min(mb),
                    tokens_per_fill,
                    fill_interval,
                }
            }
            (Assignment::DenyAll, _) | (_, Assignment::DenyAll) => Assignment::DenyAll,
            (Assignment::AllowAll, other) | (other, Assignment::AllowAll) => other,
        })
        .unwrap_or(Assignment::AllowAll)
}

/// The assignment to send: `new`, or `last` when both are token buckets of the same
/// interval whose rates differ by less than [`HYSTERESIS`], so Envoy keeps its bucket.
pub fn settle(new: Assignment, last: Option<Assignment>) -> Assignment {
    let (
        Assignment::TokenBucket {
            tokens_per_fill: n,
            fill_interval: fi,
            ..
        },
        Some(
            old @ Assignment::TokenBucket {
                tokens_per_fill: o,
                fill_interval: oi,
                ..
            },
        ),
    ) = (new, last)
    else {
        return new;
    };
    let moved = (f64::from(n) - f64::from(o)).abs() / f64::from(o.max(1));
    if fi == oi && moved < HYSTERESIS {
        old
    } else {
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    fn per_second(requests: u64) -> Limit {
        Limit {
            algorithm: Algorithm::SlidingWindowCounter,
            requests,
            window: SECOND,
            burst: requests,
            phase: 0,
        }
    }

    fn bucket(max_tokens: u32, tokens_per_fill: u32, fill_interval: u64) -> Assignment {
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval,
        }
    }

    #[test]
    fn demand_reads_sluices_clock_before_envoys_rounded_seconds() {
        // 230 requests over 4.6 s measured here; Envoy says 4 s.
        let d = demand(200, 30, 4 * SECOND, Some(4_600_000));
        assert!((d - 50.0).abs() < 1e-9, "{d}");
        // No previous report: Envoy's figure.
        assert_eq!(demand(200, 30, 5 * SECOND, None), 46.0);
        // The previous report came 4 s late: 75 requests over Envoy's 4 s, not the
        // 0.6 s between the two reports here.
        assert_eq!(demand(58, 17, 4 * SECOND, Some(600_000)), 18.75);
        // A new bucket's first report: one request, time_elapsed 0.
        assert_eq!(demand(1, 0, 0, None), 1.0);
        assert_eq!(demand(0, 0, 5 * SECOND, Some(5 * SECOND)), 0.0);
    }

    #[test]
    fn shares_follow_demand_and_split_evenly_when_idle() {
        let all = Share {
            total: 60.0,
            streams: 2,
        };
        assert_eq!(fraction(45.0, all), 0.75);
        assert_eq!(fraction(15.0, all), 0.25);
        let idle = Share {
            total: 0.0,
            streams: 4,
        };
        assert_eq!(fraction(0.0, idle), 0.25);
        // A stale sum below this stream's own demand never gives more than all.
        assert_eq!(fraction(80.0, all), 1.0);
    }

    #[test]
    fn token_buckets_carry_the_rules_rate_in_whole_seconds() {
        // 150 per 10 s: the rule's 20 a second times 0.75.
        assert_eq!(token_bucket(&per_second(20), 0.75), bucket(15, 150, 10));
        assert_eq!(token_bucket(&per_second(20), 0.25), bucket(5, 50, 10));
        // A share a hair under 15 a second loses a tenth of a request, not one.
        assert_eq!(token_bucket(&per_second(20), 0.7499), bucket(14, 149, 10));
        // 600 a minute: refilled over 60 s, so the rate is exact.
        let minute = Limit {
            window: 60 * SECOND,
            ..per_second(600)
        };
        assert_eq!(token_bucket(&minute, 0.5), bucket(300, 3000, 600));
        // 5 per 250 ms is 20 per second: Envoy cannot take 250 ms. Its bucket
        // refills continuously, so it holds one window's 5, not a second's 20.
        let quarter = Limit {
            window: 250_000,
            ..per_second(5)
        };
        assert_eq!(token_bucket(&quarter, 1.0), bucket(5, 200, 10));
        assert_eq!(token_bucket(&quarter, 0.5), bucket(2, 100, 10));
        // 3 per 1.5 s is 4 per 2 s, and holds 3.
        let longer = Limit {
            window: 1_500_000,
            ..per_second(3)
        };
        assert_eq!(token_bucket(&longer, 1.0), bucket(3, 40, 20));
        // token_bucket's burst is its capacity.
        let tb = Limit {
            algorithm: Algorithm::TokenBucket,
            burst: 40,
            ..per_second(10)
        };
        assert_eq!(token_bucket(&tb, 0.5), bucket(20, 50, 10));
        // Ten windows of a huge limit would not fit 32 bits: one window per fill.
        let huge = per_second(1_000_000_000);
        assert_eq!(
            token_bucket(&huge, 0.5),
            bucket(500_000_000, 500_000_000, 1)
        );
    }

    #[test]
    fn a_tiny_share_still_refills_and_a_zero_limit_denies() {
        assert_eq!(token_bucket(&per_second(20), 0.001), bucket(1, 1, 10));
        assert_eq!(token_bucket(&per_second(0), 0.5), Assignment::DenyAll);
    }

    #[test]
    fn a_bucket_refills_in_its_capacity_over_its_rate() {
        assert_eq!(refill(bucket(20, 200, 10)), SECOND);
        assert_eq!(refill(bucket(2, 20, 36_000)), 3_600 * SECOND);
        assert_eq!(refill(bucket(1, 3, 1)), 333_334);
        assert_eq!(refill(Assignment::AllowAll), 0);
        assert_eq!(refill(Assignment::DenyAll), 0);
    }

    #[test]
    fn a_list_of_limits_gets_the_slowest_refill_and_the_smallest_burst() {
        let daily = Limit {
            algorithm: Algorithm::FixedWindow,
            window: 86_400 * SECOND,
            ..per_second(864_000)
        };
        // 10 a second, and 864,000 a day (also 10 a second, but a day's burst).
        assert_eq!(tightest(&[per_second(10), daily], 0.5), bucket(5, 50, 10));
        // 1 a second under the day's cap: its refill, the second's burst.
        let slow = Limit {
            requests: 86_400,
            burst: 86_400,
            ..daily
        };
        assert_eq!(
            tightest(&[per_second(10), slow], 1.0),
            bucket(10, 864_000, 864_000)
        );
        assert_eq!(
            tightest(&[per_second(10), per_second(0)], 1.0),
            Assignment::DenyAll
        );
        assert_eq!(
            tightest(&[per_second(20)], 0.75),
            token_bucket(&per_second(20), 0.75)
        );
    }

    #[test]
    fn small_moves_keep_the_last_bucket_and_large_ones_replace_it() {
        let last = bucket(15, 15, 1);
        assert_eq!(settle(bucket(16, 16, 1), Some(last)), last);
        assert_eq!(settle(bucket(14, 14, 1), Some(last)), last);
        assert_eq!(settle(bucket(17, 17, 1), Some(last)), bucket(17, 17, 1));
        assert_eq!(settle(bucket(10, 10, 1), Some(last)), bucket(10, 10, 1));
        assert_eq!(settle(bucket(15, 15, 1), None), bucket(15, 15, 1));
        assert_eq!(settle(Assignment::DenyAll, Some(last)), Assignment::DenyAll);
        assert_eq!(settle(last, Some(Assignment::AllowAll)), last);
    }
}
