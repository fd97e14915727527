//! Builders for the stores' unit tests.

use crate::algorithm::{Algorithm, Limit, SECOND};

use super::{Hit, Mode, Spend};

/// A hit on `key` with a per-minute limit of `requests`.
pub fn hit(key: &str, algorithm: Algorithm, requests: u64, hits: u64) -> Hit {
    Hit {
        key: key.to_string(),
        placement: crate::hash::stable_hash(key.as_bytes()),
        limit: Limit {
            algorithm,
            requests,
            window: 60 * SECOND,
            burst: requests,
            phase: 0,
        },
        hits,
        mode: Mode::Enforce,
        spend: Spend::IfAdmitted,
        fallback: Default::default(),
        max_delay: crate::algorithm::NO_DEADLINE,
    }
}
