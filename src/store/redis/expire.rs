//! Redis's active expire cycle against the store timeout.
//!
//! Redis deletes expired keys in a "slow" cycle that runs `hz` times a second
//! (`serverCron`) and may hold the server for up to `perc` percent of one tick:
//! `1_000_000 * perc / hz / 100` microseconds, where `perc` is
//! `25 + 2 * (active-expire-effort - 1)`. While many keys expire (per-second limits
//! over many clients) the cycle uses all of it, and nothing else is answered
//! meanwhile. At the default `hz 10` that is 25 ms, longer than the default
//! `--store-timeout` of 15 ms: calls that arrive as a cycle starts time out and their
//! requests get the failure mode, under a normal load.
//!
//! So when a shard first answers, sluice reads its `hz` (and `active-expire-effort`)
//! once with `CONFIG GET`, off the request path, and logs one warning when the cycle
//! can outlast the store timeout. Managed Redis often disables or renames `CONFIG`:
//! then nothing is said and nothing is retried.

use std::time::Duration;

use sluice_redis::{Pool, Request, Value};

/// Redis clamps `hz` to this range (`CONFIG_MIN_HZ`, `CONFIG_MAX_HZ`).
const HZ: (u64, u64) = (1, 500);
/// And `active-expire-effort` to this one.
const EFFORT: (u64, u64) = (1, 10);
/// The `hz` the warning suggests at least (2.5 ms cycles at the default effort).
const SUGGESTED_HZ: u64 = 100;
/// Longest wait for each `CONFIG GET`.
const CONFIG_TIMEOUT: Duration = Duration::from_secs(1);

/// The share of a tick, in percent, a slow cycle may take at this (clamped)
/// `active-expire-effort`.
fn cycle_percent(effort: u64) -> u64 {
    25 + 2 * (effort.clamp(EFFORT.0, EFFORT.1) - 1)
}

/// The longest a slow expire cycle may block Redis at this `hz` and
/// `active-expire-effort` (both clamped to what Redis accepts).
pub fn expire_cycle_limit(hz: u64, effort: u64) -> Duration {
    Duration::from_micros(1_000_000 * cycle_percent(effort) / hz.clamp(HZ.0, HZ.1) / 100)
}

/// The warning for shard `shard` when its expire cycle can last as long as
/// `store_timeout` or longer (a call that arrives as the cycle starts waits all of it
/// plus its round trip); `None` when it cannot.
pub fn expire_cycle_warning(
    shard: &str,
    hz: u64,
    effort: u64,
    store_timeout: Duration,
) -> Option<String> {
    let limit = expire_cycle_limit(hz, effort);
    if limit < store_timeout {
        return None;
    }
    let effort = effort.clamp(EFFORT.0, EFFORT.1);
    let settings = if effort == 1 {
        format!("hz {hz}")
    } else {
        format!("hz {hz} and active-expire-effort {effort}")
    };
    // The smallest hz whose cycle ends within half the timeout, at least 100.
    let half_us = (store_timeout.as_micros() as u64 / 2).max(1);
    let needed = (1_000_000 * cycle_percent(effort) / 100).div_ceil(half_us);
    let suggested = needed.max(SUGGESTED_HZ).min(HZ.1);
    Some(format!(
        "redis {shard} has {settings}: its expire cycle can block it for up to {limit:?} \
         and --store-timeout is {store_timeout:?}, so calls can time out and their requests \
         get the failure mode. Set `hz {suggested}` in its redis.conf (or raise \
         --store-timeout)"
    ))
}

/// A `CONFIG GET name` reply (`[name, value]`) as a number.
fn config_number(reply: Value, name: &str) -> Option<u64> {
    let items = reply.into_array()?;
    let mut pairs = items.chunks_exact(2);
    pairs
        .find(|p| p[0].as_text().as_deref() == Some(name))?
        .get(1)?
        .as_text()?
        .trim()
        .parse()
        .ok()
}

async fn config_get(pool: &Pool, name: &str) -> Option<u64> {
    let mut req = Request::default();
    req.start(3);
    req.arg(b"CONFIG");
    req.arg(b"GET");
    req.arg(name.as_bytes());
    let reply = tokio::time::timeout(CONFIG_TIMEOUT, pool.query(&req)).await;
    match reply {
        Ok(Ok(Value::Error(e))) => {
            tracing::debug!(error = %e, "CONFIG GET {name} refused");
            None
        }
        Ok(Ok(v)) => config_number(v, name),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "CONFIG GET {name} failed");
            None
        }
        Err(_) => None,
    }
}

/// Reads a server's (a standalone shard's or a cluster master's) `hz` and `active-expire-effort` once and returns the
/// warning of [`expire_cycle_warning`], if any. `None` also when `CONFIG GET hz`
/// fails (disabled or renamed); a missing effort counts as the default, 1.
pub async fn check(pool: &Pool, shard: &str, store_timeout: Duration) -> Option<String> {
    let hz = config_get(pool, "hz").await?;
    let effort = config_get(pool, "active-expire-effort").await.unwrap_or(1);
    expire_cycle_warning(shard, hz, effort, store_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn config_replies_read_as_numbers() {
        let text = |t: &str| Value::Bulk(t.as_bytes().to_vec());
        let reply = Value::Array(vec![text("hz"), text("100")]);
        assert_eq!(config_number(reply, "hz"), Some(100));
        let other = Value::Array(vec![text("maxmemory"), text("0")]);
        assert_eq!(config_number(other, "hz"), None);
        assert_eq!(config_number(Value::Array(vec![]), "hz"), None);
        assert_eq!(config_number(Value::Nil, "hz"), None);
    }

    #[test]
    fn the_cycle_is_a_quarter_of_a_tick_at_the_default_effort() {
        assert_eq!(expire_cycle_limit(10, 1), MS * 25);
        assert_eq!(expire_cycle_limit(100, 1), Duration::from_micros(2_500));
        assert_eq!(expire_cycle_limit(1, 1), MS * 250);
        assert_eq!(expire_cycle_limit(500, 1), Duration::from_micros(500));
        assert_eq!(expire_cycle_limit(3, 1), Duration::from_micros(83_333));
    }

    #[test]
    fn more_effort_takes_two_more_percent_a_step() {
        // 25 + 2 * (effort - 1) percent of a tick.
        assert_eq!(expire_cycle_limit(10, 2), MS * 27);
        assert_eq!(expire_cycle_limit(10, 10), MS * 43);
        assert_eq!(expire_cycle_limit(100, 10), Duration::from_micros(4_300));
    }

    #[test]
    fn values_redis_would_refuse_are_clamped_as_redis_does() {
        assert_eq!(expire_cycle_limit(0, 1), expire_cycle_limit(1, 1));
        assert_eq!(expire_cycle_limit(10_000, 1), expire_cycle_limit(500, 1));
        assert_eq!(expire_cycle_limit(10, 0), expire_cycle_limit(10, 1));
        assert_eq!(expire_cycle_limit(10, 99), expire_cycle_limit(10, 10));
    }

    #[test]
    fn warns_only_when_the_cycle_can_outlast_the_store_timeout() {
        let warning = expire_cycle_warning("127.0.0.1:6379", 10, 1, MS * 15).expect("warned");
        assert_eq!(
            warning,
            "redis 127.0.0.1:6379 has hz 10: its expire cycle can block it for up to 25ms \
             and --store-timeout is 15ms, so calls can time out and their requests get the \
             failure mode. Set `hz 100` in its redis.conf (or raise --store-timeout)"
        );
        assert_eq!(expire_cycle_warning("s", 100, 1, MS * 15), None);
        assert_eq!(expire_cycle_warning("s", 10, 1, MS * 26), None);
        // A call arriving as the cycle starts waits all of it plus its round trip.
        assert!(expire_cycle_warning("s", 10, 1, MS * 25).is_some());
        // hz 100 at the highest effort still fits 15 ms.
        assert_eq!(expire_cycle_warning("s", 100, 10, MS * 15), None);
        let w = expire_cycle_warning("s", 10, 10, MS * 30).expect("43 ms");
        assert!(w.contains("hz 10 and active-expire-effort 10"), "{w}");
        assert!(w.contains("up to 43ms"), "{w}");
    }

    #[test]
    fn a_short_store_timeout_suggests_a_higher_hz() {
        // 2 ms: the cycle must end within 1 ms, so hz 250 (1 ms cycles).
        let w = expire_cycle_warning("s", 100, 1, MS * 2).expect("2.5 ms >= 2 ms");
        assert!(w.contains("Set `hz 250`"), "{w}");
        // Never more than Redis accepts.
        let w = expire_cycle_warning("s", 10, 1, Duration::from_micros(100)).expect("warned");
        assert!(w.contains("Set `hz 500`"), "{w}");
    }
}
