//! Rate-limit response headers that sluice asks Envoy to add (`--response-headers`).
//!
//! They describe the descriptor closest to its limit. `retry-after` is never earlier
//! than the true wait and carries up to 10 % random jitter, so that denied clients do
//! not all come back in the same second.

use rand::Rng;

use crate::algorithm::{Micros, SECOND};
use crate::limiter::Outcome;

/// Which header set to emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
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
    if style == HeaderStyle::Off {
        return out;
    }
    let policy = &outcome.policy;
    // The closest descriptor: the one with the least remaining; among denied ones, the
    // one with the longest wait.
    let closest = outcome
        .statuses
        .iter()
        .filter_map(|s| {
            let rule = policy.rule(s.rule?);
            let limit = rule.limit?;
            Some((s, rule, limit, s.verdict?))
        })
        .min_by_key(|(s, _, _, v)| (!s.over_limit, v.remaining, u64::MAX - v.retry_after));

    if let Some((_, rule, limit, v)) = closest {
        let window = ceil_secs(limit.window);
        let remaining = if outcome.over_limit { 0 } else { v.remaining };
        match style {
            HeaderStyle::Draft03 => {
                let mut l = format!(
                    "{}, {};w={}",
                    rule.requests_per_unit, rule.requests_per_unit, window
                );
                if let Some(name) = &rule.name {
                    l.push_str(&format!(";name=\"{}\"", sf_escape(name)));
                }
                out.push(("x-ratelimit-limit", l));
                out.push(("x-ratelimit-remaining", remaining.to_string()));
                out.push(("x-ratelimit-reset", ceil_secs(v.reset).to_string()));
            }
            HeaderStyle::Ietf => {
                let name = sf_escape(rule.name.as_deref().unwrap_or(&rule.path));
                out.push((
                    "ratelimit-policy",
                    format!("\"{name}\";q={};w={window}", rule.requests_per_unit),
                ));
                out.push((
                    "ratelimit",
                    format!("\"{name}\";r={remaining};t={}", ceil_secs(v.reset)),
                ));
            }
            HeaderStyle::Off => {}
        }
    }

    if outcome.over_limit {
        out.push(("retry-after", retry_after_secs(outcome).to_string()));
    }
    out
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
                // Never admissible as sent (more hits than the limit): the window.
                outcome.policy.rule(s.rule?).limit?.window
            } else {
                v.retry_after
            })
        })
        .max()
        // No verdict: the store failed closed. Ask for a short pause.
        .unwrap_or(SECOND);
    jittered(wait, rand::rng().random_range(0.0..=0.1))
}

/// `wait` in whole seconds rounded up, stretched by `jitter` (0.0 to 0.1).
pub fn jittered(wait: Micros, jitter: f64) -> u64 {
    let base = ceil_secs(wait).max(1);
    let extra = (base as f64 * jitter).round() as u64;
    base + extra
}

/// Structured-field strings may not hold `"` or `\` unescaped.
fn sf_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
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
        for j in [0.0, 0.05, 0.1] {
            let s = jittered(59 * SECOND + 500_000, j);
            assert!((60..=66).contains(&s), "{s}");
        }
    }
}
