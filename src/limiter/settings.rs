//! The decision path's settings, from the command line.

use std::time::Duration;

use super::key;
use crate::policy::FailureMode;

/// Settings of the decision path, from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Failure mode of domains that do not set their own.
    pub failure_mode: FailureMode,
    /// Longest wait for the store before the failure mode decides.
    pub store_timeout: Duration,
    /// Which values are hashed in counter keys, and under what key.
    pub hashing: key::Hashing,
    /// What a denied request spends of its other limits.
    pub denied_spend: DeniedSpend,
    /// How precisely `duration_until_reset` is reported.
    pub resets: ResetResolution,
    /// How a store failure is answered.
    pub store_errors: StoreErrorAnswer,
    /// Replicas assumed to share a `local` domain's limits until the store tells
    /// (`--local-share-replicas`).
    pub local_replicas: u32,
    /// Most counters a `local` domain decides in memory while the store is away
    /// (`--max-keys`).
    pub max_keys: usize,
    /// Which counter a descriptor's `limit` override spends.
    pub override_counter: OverrideCounter,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            failure_mode: FailureMode::Open,
            store_timeout: Duration::from_millis(15),
            hashing: key::Hashing::default(),
            denied_spend: DeniedSpend::Nothing,
            resets: ResetResolution::Micros,
            store_errors: StoreErrorAnswer::FailureMode,
            local_replicas: 1,
            max_keys: 1_000_000,
            override_counter: OverrideCounter::Apart,
        }
    }
}

/// What a request denied by one limit spends of its other limits
/// (`--denied-requests-spend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeniedSpend {
    /// Nothing: the request was not let through, so it costs nothing (sluice's
    /// default).
    #[default]
    Nothing,
    /// Its hits on every limit that admitted it, as envoyproxy/ratelimit counts
    /// unless `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`: one more store call,
    /// made only for denied requests.
    AdmittingLimits,
}

/// Which counter a descriptor's `limit` override spends (`--override-counter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverrideCounter {
    /// One of its own, keyed by the domain, the entries and the unit, apart from
    /// the matched rule's (sluice's default).
    #[default]
    Apart,
    /// The matched rule's when the override counts the same window the same way
    /// (its unit and algorithm), as envoyproxy/ratelimit keys both by domain,
    /// entries and window; its own otherwise.
    Shared,
}

/// How `duration_until_reset` is reported (`--reset-resolution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResetResolution {
    /// To the microsecond (sluice's default).
    #[default]
    Micros,
    /// Rounded up to whole seconds, as envoyproxy/ratelimit answers.
    Seconds,
}

/// How a request is answered when the store fails (`--store-error-answer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreErrorAnswer {
    /// By the domain's failure mode (sluice's default).
    #[default]
    FailureMode,
    /// With an error (gRPC `UNKNOWN`, HTTP 500), as envoyproxy/ratelimit answers, so
    /// Envoy's `failure_mode_deny` decides.
    Error,
}
