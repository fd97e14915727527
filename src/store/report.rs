//! How a store tells the rest of the process about its health without knowing who
//! listens: events pushed through [`Report`] (metrics implement it), and each shard's
//! state pulled as [`ShardStatus`] (`/debug/store` shows it).

use std::time::SystemTime;

use super::ErrorKind;

/// Receives a store's events. Called on the request path (a denial answered from the
/// cache) and on failed calls, so implementations must be cheap and never block.
pub trait Report: Send + Sync + 'static {
    /// A shard exists: its error series can be exported at 0 before its first error.
    fn shard_declared(&self, store: &str, shard: &str);

    /// A call to `shard` failed.
    fn store_error(&self, store: &str, shard: &str, kind: ErrorKind);

    /// A request was denied from a local cache of denials, without a store call.
    fn denial_cache_answer(&self);

    /// A shard that had failed answered again (a call, or a probe that ends its
    /// outage): once per recovery, never per request.
    fn shard_answered(&self, _store: &str, _shard: &str) {}
}

/// Where a shard stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardState {
    /// Counters in this process: nothing to reach.
    InMemory,
    /// Answering.
    Up,
    /// Failed since its last success, not (yet) backed off.
    Failing,
    /// Left alone until the back-off ends: calls are answered by the failure mode at
    /// once.
    BackingOff,
    /// The back-off is over and the next calls try the shard again; none has
    /// succeeded yet.
    Trying,
}

impl ShardState {
    pub fn as_str(self) -> &'static str {
        match self {
            ShardState::InMemory => "in_memory",
            ShardState::Up => "up",
            ShardState::Failing => "failing",
            ShardState::BackingOff => "backing_off",
            ShardState::Trying => "trying",
        }
    }
}

/// A shard's latest error, kept after it recovers.
#[derive(Debug, Clone, PartialEq)]
pub struct LastError {
    pub kind: ErrorKind,
    pub message: String,
    pub at: SystemTime,
}

/// One shard (or a whole cluster) as `/debug/store` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardStatus {
    /// `host:port` (never a password), `cluster`, or `local` for the memory store.
    pub name: String,
    /// A cluster's seed nodes, or a Sentinel shard's current master (`host:port`);
    /// empty otherwise.
    pub nodes: Vec<String>,
    pub state: ShardState,
    pub last_error: Option<LastError>,
    /// When the back-off ends, while backing off.
    pub backoff_until: Option<SystemTime>,
}

impl ShardStatus {
    /// The memory store's one entry.
    pub fn in_memory() -> Self {
        ShardStatus {
            name: "local".to_string(),
            nodes: Vec::new(),
            state: ShardState::InMemory,
            last_error: None,
            backoff_until: None,
        }
    }
}
