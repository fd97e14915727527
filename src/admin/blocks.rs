//! Block, Unblock and ListBlocks: the block list as operators see and change it.

use tonic::Status;

use crate::limiter::penalty::ActiveBan;
use crate::limiter::{BlockError, Limiter};
use crate::store::Store;

use super::pb;

/// A block with no length given lasts an hour.
const DEFAULT_SPAN_MICROS: u64 = 3_600_000_000;

/// The longest block, as the longest duration of a policy: a store adds it to its
/// clock (the Redis board as a Lua number written with `%d`), where a longer one
/// overflowed and the block vanished while the call said it was put.
const MAX_SPAN_MICROS: u64 = crate::policy::duration::MAX;

fn status(e: BlockError) -> Status {
    match e {
        BlockError::Unknown(m) => Status::not_found(m),
        BlockError::NotEnforced(m) => Status::failed_precondition(m),
        BlockError::Store(m) => Status::unavailable(m),
    }
}

/// The domain and entries naming a key; both must be given, as Explain asks.
fn named<'a>(
    domain: &str,
    list: &'a [pb::request_descriptor::Entry],
) -> Result<Vec<(&'a str, &'a str)>, Status> {
    if domain.is_empty() {
        return Err(Status::invalid_argument("domain: give the policy's domain"));
    }
    entries(list)
}

fn entries(list: &[pb::request_descriptor::Entry]) -> Result<Vec<(&str, &str)>, Status> {
    if list.is_empty() {
        return Err(Status::invalid_argument("entries: give at least one"));
    }
    Ok(list
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect())
}

/// One sentence as the API shows it.
pub fn to_pb(b: &ActiveBan) -> pb::Sentence {
    pb::Sentence {
        domain: b.info.domain.clone(),
        rule: b.info.rule.clone(),
        key: b.info.key.clone(),
        counter: b.counter.clone(),
        kind: b.kind.as_str().to_string(),
        source: b.source.as_str().to_string(),
        remaining_micros: b.remaining,
        factor: f64::from(b.factor_ppm) / 1e6,
    }
}

pub async fn block<S: Store>(
    limiter: &Limiter<S>,
    req: pb::BlockRequest,
) -> Result<pb::Sentence, Status> {
    let entries = named(&req.domain, &req.entries)?;
    if req.for_micros > MAX_SPAN_MICROS {
        return Err(Status::invalid_argument(format!(
            "for_micros: {} is longer than the longest block, {MAX_SPAN_MICROS} (about 35 years)",
            req.for_micros
        )));
    }
    let span = if req.for_micros == 0 {
        DEFAULT_SPAN_MICROS
    } else {
        req.for_micros
    };
    let put = limiter
        .block(&req.domain, &entries, span)
        .await
        .map_err(status)?;
    // The key as a string, not `%`: the text format quotes and escapes it, so a key
    // holding a newline (a client's value) cannot start a forged log line. The
    // domain and rule are the policy's.
    tracing::warn!(
        domain = %put.info.domain,
        rule = %put.info.rule,
        key = put.info.key.as_str(),
        seconds = span / 1_000_000,
        "blocked by an operator"
    );
    Ok(to_pb(&put))
}

pub async fn unblock<S: Store>(
    limiter: &Limiter<S>,
    req: pb::UnblockRequest,
) -> Result<pb::UnblockResponse, Status> {
    let counter = if !req.counter.is_empty() {
        req.counter
    } else {
        if req.entries.is_empty() {
            return Err(Status::invalid_argument(
                "name the sentence: its counter (as ListBlocks shows it), or its domain and entries",
            ));
        }
        let entries = named(&req.domain, &req.entries)?;
        limiter
            .sentence_key(&req.domain, &entries)
            .map_err(status)?
            .0
    };
    let lifted = limiter.unblock(&counter).await.map_err(status)?;
    if lifted {
        tracing::warn!(counter = counter.as_str(), "sentence lifted by an operator");
    }
    Ok(pb::UnblockResponse { lifted, counter })
}

pub fn list<S: Store>(limiter: &Limiter<S>, req: &pb::ListBlocksRequest) -> pb::Sentences {
    pb::Sentences {
        sentences: limiter
            .sentences()
            .iter()
            .filter(|b| req.domain.is_empty() || b.info.domain == req.domain)
            .map(to_pb)
            .collect(),
    }
}
