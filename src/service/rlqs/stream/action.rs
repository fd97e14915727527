//! An assignment as the protobuf action Envoy applies, and its kind for the metrics.

use crate::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    BucketAction as Action, QuotaAssignmentAction,
};
use crate::quota::Assignment;
use crate::telemetry::rlqs::AssignmentKind;
use prost_types::Duration as PbDuration;

/// What an action tells Envoy, for the metrics.
pub(super) fn kind(action: &Action) -> AssignmentKind {
    let Action::QuotaAssignmentAction(q) = action else {
        return AssignmentKind::Abandon;
    };
    match q
        .rate_limit_strategy
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
    {
        Some(Strategy::BlanketRule(r)) if *r == BlanketRule::DenyAll as i32 => {
            AssignmentKind::DenyAll
        }
        Some(Strategy::TokenBucket(_)) => AssignmentKind::TokenBucket,
        _ => AssignmentKind::AllowAll,
    }
}

/// The protobuf of an assignment alive for `ttl` seconds.
pub(super) fn assignment(a: Assignment, ttl: u64) -> Action {
    let strategy = match a {
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval,
        } => Strategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(tokens_per_fill),
            fill_interval: Some(seconds(fill_interval)),
        }),
    };
    Action::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: Some(seconds(ttl)),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    })
}

fn seconds(s: u64) -> PbDuration {
    PbDuration {
        seconds: s.min(i64::MAX as u64) as i64,
        nanos: 0,
    }
}
