//! The wire side: Envoy's RateLimitService over gRPC and the same request as JSON.
//!
//! This module only converts: protobuf (or JSON) in, [`limiter`](crate::limiter)
//! types through, protobuf (or JSON) out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::limiter::{Descriptor, Limiter, Outcome, Override};
use crate::policy::Unit;
use crate::store::{Spend, Store};
use crate::telemetry::striped::Stripes;
use crate::telemetry::Metrics;
use crate::trace::Call;

pub mod decode;
pub mod grpc;
pub mod headers;
pub mod json;
pub mod reflection;
pub mod response;
pub mod rlqs;
pub mod span;
pub mod tap;

use crate::store::MAX_HITS;
pub use headers::HeaderStyle;

pub use crate::policy::MAX_ENTRIES;

/// Most descriptors one request may carry. Envoy sends one per `rate_limits` action
/// list of the route (Envoy Gateway one per rule match), a handful in practice; a
/// request of thousands (a 64 KiB message holds about 8,000) would only make the
/// store compare them with each other under its locks.
pub const MAX_DESCRIPTORS: usize = 256;

pub use crate::limiter::{store_wait, DEADLINE_MARGIN};

/// A request that cannot be decided, with the reason sent back to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Checks a request as docs/responses.md says and turns it into limiter
/// input.
pub fn descriptors<'r>(
    req: &'r decode::Request<'_>,
) -> Result<Vec<Descriptor<'r, (&'r str, &'r str)>>, BadRequest> {
    if req.domain.is_empty() {
        return Err(BadRequest("domain must not be empty".into()));
    }
    if req.descriptors.is_empty() {
        return Err(BadRequest(
            "request must carry at least one descriptor".into(),
        ));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(BadRequest(format!(
            "request has {} descriptors; at most {MAX_DESCRIPTORS} are allowed",
            req.descriptors.len()
        )));
    }
    // hits_addend: the descriptor's own value wins (0 checks without counting);
    // otherwise the request's, where 0 means 1.
    let request_hits = u64::from(req.hits_addend.max(1));
    // A settlement: every descriptor carries its own hits_addend, or gives hits back
    // (`is_negative_hits`). That is how Envoy sends a route rate limit's
    // `hits_addend` (a number, `%RESP(...)%`, `%DYNAMIC_METADATA(...)%`), and the
    // call it makes at stream end (`apply_on_stream_done`, which Envoy Gateway's
    // `cost.response` and the AI Gateway's token quotas generate) always does. Its
    // costs are charges, spent whole even past the limit as envoyproxy/ratelimit
    // spends every hit (0 still only checks), and its refunds are given back. A
    // call with any descriptor without a cost of its own is a request: it spends
    // only if admitted, and may not carry refunds.
    let settles = req
        .descriptors
        .iter()
        .all(|d| d.is_negative_hits || d.hits_addend.is_some());
    if !settles {
        if let Some(i) = req.descriptors.iter().position(|d| d.is_negative_hits) {
            let j = req
                .descriptors
                .iter()
                .position(|d| !d.is_negative_hits && d.hits_addend.is_none())
                .unwrap_or(0);
            // Counted from 1, as `sluice explain` numbers descriptors.
            let (i, j) = (i + 1, j + 1);
            return Err(BadRequest(format!(
                "descriptor {i}: is_negative_hits gives hits back only in a call whose \
                 every descriptor carries its own hits_addend (a charge or a refund); \
                 descriptor {j} has none"
            )));
        }
    }
    req.descriptors
        .iter()
        .enumerate()
        .map(|(index, d)| {
            // Messages count descriptors and entries from 1, as `sluice explain`
            // numbers them.
            let i = index + 1;
            // A descriptor with no entries matches nothing and is answered OK, not
            // INVALID_ARGUMENT: Envoy sends such descriptors when a
            // `skip_if_absent` action finds no header, and refusing the whole call
            // would make Envoy fail open on every other limit of the request.
            let entries = &req.entries[d.entries.clone()];
            if entries.len() > MAX_ENTRIES {
                return Err(BadRequest(format!(
                    "descriptor {i} has {} entries; at most {MAX_ENTRIES} are allowed",
                    entries.len()
                )));
            }
            if let Some(j) = entries.iter().position(|e| e.0.is_empty()) {
                return Err(BadRequest(format!(
                    "descriptor {i} entry {} has an empty key",
                    j + 1
                )));
            }
            let hits = d.hits_addend.unwrap_or(request_hits);
            if hits > MAX_HITS {
                return Err(BadRequest(format!(
                    "descriptor {i}: hits_addend {hits} is more than any counter holds; \
                     at most {MAX_HITS} are allowed"
                )));
            }
            let spend = match (d.is_negative_hits, settles) {
                (true, _) => Spend::Refund,
                (false, true) => Spend::Always,
                (false, false) => Spend::IfAdmitted,
            };
            let limit = match d.limit {
                None => None,
                Some(l) => match Unit::from_proto(l.unit) {
                    Some(unit) if unit != Unit::Unknown => Some(Override {
                        requests_per_unit: l.requests_per_unit,
                        unit,
                    }),
                    _ => {
                        return Err(BadRequest(format!(
                            "descriptor {i}: limit override has unit {}; expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
                            l.unit
                        )))
                    }
                },
            };
            Ok(Descriptor {
                entries,
                hits,
                spend,
                limit,
            })
        })
        .collect()
}

/// Everything a request handler needs, shared by the gRPC and HTTP servers.
#[derive(Debug)]
pub struct Service<S> {
    pub limiter: Limiter<S>,
    pub headers: HeaderStyle,
    /// Echo the request in each answer's `dynamic_metadata`
    /// (`--response-dynamic-metadata`).
    pub echo_request: bool,
    pub metrics: Arc<Metrics>,
    /// Live decisions sampled for the admin API's WatchDecisions.
    pub tap: Arc<tap::Tap>,
    /// HTTP `/json` calls being decided or held right now, counted per thread stripe
    /// (one shared count is a cache line both cores write twice per request);
    /// shutdown waits for the sum to reach zero. gRPC calls are not counted: the
    /// gRPC server returns only once every call it took is answered.
    pub in_flight: Stripes<AtomicUsize>,
    /// Times each decision for `sluice_decision_seconds`: the CPU's time-stamp
    /// counter where it is steady, several times cheaper to read than
    /// `clock_gettime` on the request path (docs/performance-notes.md, "Metrics").
    latency: quanta::Clock,
}

/// Counts a call as in flight until dropped, however the call ends.
pub struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    /// Counts on this thread's stripe; the call leaves from the same one, wherever
    /// it is polled last.
    fn enter(counter: &'a Stripes<AtomicUsize>) -> Self {
        // Always an atomic addition: the call may end on another thread.
        let (stripe, _) = counter.local();
        stripe.fetch_add(1, Ordering::SeqCst);
        InFlight(stripe)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<S: Store> Service<S> {
    /// A service with no calls in flight.
    pub fn new(limiter: Limiter<S>, headers: HeaderStyle, metrics: Arc<Metrics>) -> Self {
        Service {
            limiter,
            headers,
            echo_request: false,
            metrics,
            tap: Arc::default(),
            in_flight: Stripes::default(),
            latency: quanta::Clock::new(),
        }
    }

    /// Echoes the request in each answer's `dynamic_metadata` when `on`.
    pub fn echoing_request(mut self, on: bool) -> Self {
        self.echo_request = on;
        self
    }

    /// Counts an HTTP call as in flight until the guard is dropped.
    pub fn enter(&self) -> InFlight<'_> {
        InFlight::enter(&self.in_flight)
    }

    /// HTTP calls in flight right now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum()
    }

    /// Validates, decides and holds a leaky-bucket OK until the request's turn, for
    /// a caller who gives up `left` from now (when given): the store is waited for
    /// at most [`store_wait`] of it and `--store-timeout`, and a leaky_bucket turn
    /// that would come too late is not taken ([`Limiter::hold_budget`](crate::limiter::Limiter::hold_budget)): the
    /// request is OVER_LIMIT at once.
    pub async fn should_rate_limit(
        &self,
        req: &decode::Request<'_>,
        left: Option<Duration>,
    ) -> Result<Outcome, BadRequest> {
        self.decide(req, left, None).await
    }

    /// [`Service::should_rate_limit`], writing the decision onto `call`'s span.
    pub async fn should_rate_limit_traced(
        &self,
        req: &decode::Request<'_>,
        left: Option<Duration>,
        call: &mut Call,
    ) -> Result<Outcome, BadRequest> {
        self.decide(req, left, Some(call)).await
    }

    async fn decide(
        &self,
        req: &decode::Request<'_>,
        left: Option<Duration>,
        call: Option<&mut Call>,
    ) -> Result<Outcome, BadRequest> {
        let started = self.latency.raw();
        let descriptors = match descriptors(req) {
            Ok(d) => d,
            Err(e) => {
                self.metrics.bad_request();
                self.metrics
                    .erl_error(crate::telemetry::erl::CallError::BadRequest);
                // The caller writes the refusal on the span, with its answer.
                return Err(e);
            }
        };
        // Only a sampled call hears of the store's calls: otherwise the store reads
        // no clock and makes no span.
        let probe = call
            .as_deref()
            .filter(|c| c.recording())
            .map(span::StoreSpans);
        let outcome = self
            .limiter
            .decide_probed(
                req.domain,
                &descriptors,
                left,
                probe.as_ref().map(|p| p as &dyn crate::store::Probe),
            )
            .await;
        let took = self.latency.delta(started, self.latency.raw());
        if outcome.error_answer().is_some() {
            self.metrics
                .erl_error(crate::telemetry::erl::CallError::Store);
        }
        self.metrics.record_request(
            req.domain,
            &outcome,
            &descriptors,
            self.limiter.hashing(),
            took,
        );
        // Tracing off: this one branch is all it costs.
        if let Some(call) = call {
            if call.recording() {
                let keys = descriptors.iter().map(|d| d.entries);
                span::decision(call, req.domain, keys, &outcome);
                // Inside the call's log span, so the line carries the trace id.
                tracing::debug!(
                    domain = req.domain,
                    over_limit = outcome.over_limit,
                    "ShouldRateLimit decided"
                );
                if let Some(id) = call.trace_id() {
                    self.metrics.exemplar(took, id);
                }
            }
        }
        if self.tap.watched() {
            let hashing = self.limiter.hashing();
            self.tap
                .offer(req.domain, &descriptors, &outcome, took, hashing);
        }
        if !outcome.over_limit && outcome.delay > 0 {
            // The queue position is taken; the answer waits for its turn without
            // holding a thread.
            tokio::time::sleep(std::time::Duration::from_micros(outcome.delay)).await;
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_wait_leaves_a_margin_before_the_deadline() {
        let ms = Duration::from_millis;
        assert_eq!(store_wait(ms(20)), ms(16));
        assert_eq!(store_wait(ms(50)), ms(40));
        assert_eq!(store_wait(ms(1000)), ms(800));
        assert_eq!(store_wait(ms(5)), ms(3));
        assert_eq!(store_wait(ms(2)), Duration::ZERO);
        assert_eq!(store_wait(Duration::ZERO), Duration::ZERO);
    }

    /// A request of descriptors, each (its own hits_addend, is_negative_hits).
    fn request(shape: &[(Option<u64>, bool)]) -> decode::Request<'static> {
        decode::Request {
            domain: "d",
            hits_addend: 0,
            descriptors: shape
                .iter()
                .enumerate()
                .map(
                    |(i, &(hits_addend, is_negative_hits))| decode::WireDescriptor {
                        entries: i..i + 1,
                        hits_addend,
                        is_negative_hits,
                        limit: None,
                    },
                )
                .collect(),
            entries: vec![("k", "v"); shape.len()],
        }
    }

    fn spends(shape: &[(Option<u64>, bool)]) -> Result<Vec<(u64, Spend)>, String> {
        let req = request(shape);
        descriptors(&req)
            .map(|d| d.iter().map(|d| (d.hits, d.spend)).collect())
            .map_err(|e| e.0)
    }

    #[test]
    fn a_call_whose_every_descriptor_has_its_own_cost_settles() {
        use Spend::*;
        // Envoy's stream-end call (apply_on_stream_done): charges, spent whole.
        assert_eq!(
            spends(&[(Some(60), false), (Some(60), false)]),
            Ok(vec![(60, Always), (60, Always)])
        );
        // A check (cost 0) spends nothing however it is marked.
        assert_eq!(spends(&[(Some(0), false)]), Ok(vec![(0, Always)]));
        // A descriptor without a cost of its own: a request, spent only if admitted.
        assert_eq!(
            spends(&[(Some(5), false), (None, false)]),
            Ok(vec![(5, IfAdmitted), (1, IfAdmitted)])
        );
        // A reservation's end: the estimate back, the actual charged, in one call.
        assert_eq!(
            spends(&[(Some(50), true), (Some(10), false)]),
            Ok(vec![(50, Refund), (10, Always)])
        );
        // A refund without a cost of its own gives back the request's hits (1).
        assert_eq!(spends(&[(None, true)]), Ok(vec![(1, Refund)]));
    }

    #[test]
    fn a_refund_in_a_request_is_refused_with_the_reason() {
        let err = spends(&[(Some(5), true), (None, false)]).unwrap_err();
        assert!(
            err.contains("descriptor 1: is_negative_hits") && err.contains("descriptor 2 has none"),
            "{err}"
        );
    }

    #[test]
    fn hits_past_the_largest_count_and_too_many_descriptors_are_refused() {
        assert_eq!(
            spends(&[(Some(MAX_HITS), false)]),
            Ok(vec![(MAX_HITS, Spend::Always)])
        );
        for hits in [MAX_HITS + 1, u64::MAX] {
            let err = spends(&[(Some(1), false), (Some(hits), true)]).unwrap_err();
            assert!(
                err.starts_with(&format!("descriptor 2: hits_addend {hits} is more"))
                    && err.contains(&format!("at most {MAX_HITS}")),
                "{err}"
            );
        }
        assert!(spends(&vec![(None, false); MAX_DESCRIPTORS]).is_ok());
        let err = spends(&vec![(None, false); MAX_DESCRIPTORS + 1]).unwrap_err();
        assert_eq!(err, "request has 257 descriptors; at most 256 are allowed");
    }
}
