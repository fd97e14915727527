//! The stream's task: reports and peers' nudges in, one answer out for each, and a
//! span per report when traced.

use std::sync::Arc;

use crate::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;
use bytes::Bytes;
use futures::StreamExt;
use opentelemetry::KeyValue;

use crate::service::rlqs::peers::Nudge;
use crate::service::rlqs::Quotas;
use crate::store::Store;
use crate::trace::context::Incoming;
use crate::trace::{Call, Tracer};
use sluice_grpc::{frame, Code, GrpcError, Messages, Reply};

use super::action::kind;
use super::decode::decode;
use super::Stream;

/// What the stream wakes up for.
enum Event {
    Message(Result<Bytes, GrpcError>),
    Nudge(Arc<Nudge>),
}

/// Serves one stream: each report message is answered with one response, and a
/// peer's nudge that moves a share with one more; a bad message ends the stream
/// with INVALID_ARGUMENT.
pub fn serve<S: Store>(quotas: Arc<Quotas<S>>, messages: Messages) -> Reply {
    serve_traced(quotas, messages, None)
}

/// Tracing of a stream's reports: each gets a span, the child of the trace context
/// the stream opened with.
#[derive(Debug, Clone)]
pub struct Traced {
    pub tracer: Arc<Tracer>,
    pub parent: Option<Incoming>,
}

/// The span of one report's answer.
const REPORT_SPAN: &str =
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// [`serve`], with a span per report when `traced`.
pub fn serve_traced<S: Store>(
    quotas: Arc<Quotas<S>>,
    messages: Messages,
    traced: Option<Traced>,
) -> Reply {
    let mut stream = Stream::new(quotas);
    let inbox = stream.inbox.take().expect("a new stream holds its inbox");
    let start = Some((messages, inbox, stream));
    let answers = futures::stream::unfold(start, move |state| {
        let traced = traced.clone();
        async move {
            let (mut messages, mut inbox, mut stream) = state?;
            let answer = loop {
                // Reports first: a report answers for every bucket anyway.
                let event = tokio::select! {
                    biased;
                    m = messages.next() => Event::Message(m?),
                    Some(n) = inbox.recv() => Event::Nudge(n),
                };
                match event {
                    Event::Message(Ok(m)) => {
                        let Some(t) = &traced else {
                            match decode(&m) {
                                Ok(reports) => break stream.answer(reports).await,
                                Err(e) => break Err(e),
                            }
                        };
                        // A report that cannot be read gets its span too, an error.
                        let mut call = t.tracer.call_with_parent(REPORT_SPAN, t.parent);
                        let (buckets, answer) = match decode(&m) {
                            Ok(reports) => {
                                let buckets = reports.bucket_quota_usages.len();
                                (buckets, stream.answer(reports).await)
                            }
                            Err(e) => (0, Err(e)),
                        };
                        if call.recording() {
                            report_span(&mut call, stream.domain.as_deref(), buckets, &answer);
                        }
                        break answer;
                    }
                    Event::Message(Err(e)) => break Err(e),
                    Event::Nudge(n) => {
                        if let Some(pushed) = stream.nudged(&n) {
                            break Ok(pushed);
                        }
                    }
                }
            };
            Some(match answer {
                Ok(response) => (Ok(frame(&response)), Some((messages, inbox, stream))),
                // The error ends the call; nothing is read after it.
                Err(e) => {
                    match e.code {
                        Code::InvalidArgument => stream.quotas.service.metrics.bad_request(),
                        Code::ResourceExhausted => stream.quotas.oversized(&e),
                        _ => {}
                    }
                    (Err(e), None)
                }
            })
        }
    });
    Reply::Stream(answers.boxed())
}

/// A report's answer on its span: the domain, how many buckets, and one event per
/// bucket with the assignment it got (the SDK keeps the first 128 and counts the
/// rest as dropped). Bucket ids are what Envoy's matchers took from
/// requests (client values), so they stay out, as descriptor values do.
fn report_span(
    call: &mut Call,
    domain: Option<&str>,
    buckets: usize,
    answer: &Result<RateLimitQuotaResponse, GrpcError>,
) {
    call.set("rpc.system", "grpc");
    call.set(
        "rpc.service",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    );
    call.set("rpc.method", "StreamRateLimitQuotas");
    if let Some(d) = domain {
        call.set("ratelimit.domain", d.to_string());
    }
    call.set("ratelimit.buckets", buckets as i64);
    match answer {
        Ok(response) => {
            for (i, a) in response.bucket_action.iter().enumerate() {
                let Some(action) = &a.bucket_action else {
                    continue;
                };
                call.event(
                    "ratelimit.bucket",
                    vec![
                        KeyValue::new("ratelimit.bucket.index", i as i64),
                        KeyValue::new("ratelimit.assignment", kind(action).as_str()),
                    ],
                );
            }
        }
        Err(e) => {
            let failed = crate::trace::grpc_server_failed(e.code as i64);
            crate::service::span::unanswered(call, failed, e.message.clone());
        }
    }
}
