//! Per-shard health: after repeated failures a shard is left alone for a short,
//! growing back-off, and calls to it fail at once with `StoreError::BackingOff`
//! instead of each waiting out the store timeout. The first call after the back-off
//! is a trial: success brings the shard back, failure doubles the back-off.
//!
//! Logs one line per state change (down, up), never one per request.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::StoreError;
use crate::telemetry::Metrics;

/// Consecutive failures that take a shard down.
pub const FAILURES_TO_BACK_OFF: u32 = 3;
/// First back-off; doubled by each failed trial up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct State {
    failures: u32,
    down_until: Option<Instant>,
    backoff: Duration,
}

/// The health of one shard (or of the whole cluster).
#[derive(Debug)]
pub struct Health {
    /// The shard as logs and metrics name it (host:port, no password).
    pub name: String,
    state: Mutex<State>,
    metrics: Option<Arc<Metrics>>,
}

impl Health {
    pub fn new(name: String, metrics: Option<Arc<Metrics>>) -> Self {
        if let Some(m) = &metrics {
            // Export the shard's error counter at 0 from the start, so dashboards and
            // alerts see every shard before its first failure.
            m.declare_store_shard("redis", &name);
        }
        Health {
            name,
            state: Mutex::new(State::default()),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Err(BackingOff)` while the shard is backing off.
    pub fn check(&self) -> Result<(), StoreError> {
        match self.lock().down_until {
            Some(until) if Instant::now() < until => Err(StoreError::BackingOff),
            _ => Ok(()),
        }
    }

    /// Whether the shard is currently considered down.
    pub fn is_down(&self) -> bool {
        self.lock().failures >= FAILURES_TO_BACK_OFF
    }

    pub fn success(&self) {
        let mut s = self.lock();
        if s.failures >= FAILURES_TO_BACK_OFF {
            tracing::info!(shard = %self.name, "redis shard up");
        }
        *s = State::default();
    }

    pub fn failure(&self, error: &str) {
        if let Some(m) = &self.metrics {
            m.store_error("redis", &self.name);
        }
        let mut s = self.lock();
        s.failures = s.failures.saturating_add(1);
        if s.failures < FAILURES_TO_BACK_OFF {
            return;
        }
        if s.failures == FAILURES_TO_BACK_OFF {
            s.backoff = FIRST_BACKOFF;
            tracing::warn!(
                shard = %self.name,
                error,
                backoff_ms = s.backoff.as_millis() as u64,
                "redis shard down: backing off"
            );
        } else {
            // Many calls may fail at once (a burst in flight, or the trials let
            // through when a back-off ends): grow the back-off once per round, not
            // once per call.
            if s.down_until.is_some_and(|until| Instant::now() < until) {
                return;
            }
            s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
        }
        s.down_until = Some(Instant::now() + s.backoff);
    }

    /// Records the outcome of a call when dropped; a call dropped before it finished
    /// (the limiter's store timeout) counts as a failure.
    pub fn guard(&self) -> CallGuard<'_> {
        CallGuard {
            health: self,
            done: false,
        }
    }
}

/// See [`Health::guard`].
#[derive(Debug)]
pub struct CallGuard<'a> {
    health: &'a Health,
    done: bool,
}

impl CallGuard<'_> {
    pub fn finish<T>(mut self, result: &Result<T, StoreError>) {
        self.done = true;
        match result {
            Ok(_) => self.health.success(),
            Err(StoreError::Protocol(_)) => {} // a bug or bad reply, not an outage
            Err(e) => self.health.failure(&e.to_string()),
        }
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.health.failure("timed out");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_failures_back_off_and_success_recovers() {
        let h = Health::new("s".into(), None);
        for _ in 0..2 {
            h.failure("x");
            assert!(h.check().is_ok());
        }
        h.failure("x");
        assert!(matches!(h.check(), Err(StoreError::BackingOff)));
        assert!(h.is_down());
        h.success();
        assert!(h.check().is_ok());
        assert!(!h.is_down());
    }

    #[test]
    fn failures_are_counted_per_shard() {
        let metrics = Arc::new(Metrics::new());
        let h = Health::new("10.0.0.1:6379".into(), Some(metrics.clone()));
        h.failure("x");
        h.failure("x");
        let text = metrics.render();
        assert!(
            text.contains(r#"sluice_store_errors_total{shard="10.0.0.1:6379",store="redis"} 2"#),
            "{text}"
        );
    }

    #[test]
    fn failed_trials_grow_the_backoff_and_dropped_calls_count() {
        let h = Health::new("s".into(), None);
        for _ in 0..3 {
            drop(h.guard());
        }
        assert!(h.is_down());
        // Failures while backing off (calls already in flight) change nothing.
        for _ in 0..5 {
            h.failure("in flight");
        }
        assert_eq!(h.lock().backoff, FIRST_BACKOFF);
        // Each failed round after a back-off doubles it, up to the maximum.
        for round in 1..=10u32 {
            h.lock().down_until = Some(Instant::now() - Duration::from_millis(1));
            assert!(h.check().is_ok(), "trial allowed");
            h.failure("trial");
            h.failure("trial");
            let want = (FIRST_BACKOFF * 2u32.pow(round)).min(MAX_BACKOFF);
            assert_eq!(h.lock().backoff, want, "round {round}");
        }
    }
}
