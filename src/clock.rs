//! Time as the decision path sees it: one injected clock, so every test is
//! deterministic and no decision reads the wall clock behind the caller's back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::algorithm::Micros;

/// A source of "now" in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Micros;
}

/// The process clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as Micros)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to; for tests.
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start: Micros) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start)))
    }

    pub fn set(&self, now: Micros) {
        self.0.store(now, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Micros) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}
