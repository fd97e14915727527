//! token_bucket (placeholder until implemented).

use super::{Limit, Micros, Step, Verdict};

/// Stored state of one token_bucket counter.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct State {}

/// Decides one request.
pub fn decide(_limit: &Limit, _state: Option<&State>, _now: Micros, _hits: u64) -> Step<State> {
    Step {
        verdict: Verdict::default(),
        next: None,
    }
}

/// When the state can be dropped.
pub fn expires_at(_limit: &Limit, _state: &State) -> Micros {
    0
}
