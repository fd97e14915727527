//! A span per admin API call, when tracing is on: a tower layer around tonic's
//! routes, the child of the call's `traceparent` or B3 headers like the gRPC port's
//! calls. The admin port is off the request path, so a boxed future per call costs
//! nothing that matters here.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::trace::Tracer;

/// Wraps each service in [`Traced`].
#[derive(Debug, Clone)]
pub struct TraceLayer(pub Option<Arc<Tracer>>);

impl<S> tower_layer::Layer<S> for TraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced {
            inner,
            tracer: self.0.clone(),
        }
    }
}

/// A service whose calls each get a span named by their gRPC method.
#[derive(Debug, Clone)]
pub struct Traced<S> {
    inner: S,
    tracer: Option<Arc<Tracer>>,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for Traced<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let Some(tracer) = &self.tracer else {
            return self.inner.call(req).boxed();
        };
        // `/package.Service/Method` as OpenTelemetry names RPC spans.
        let path = req.uri().path();
        let name = path.strip_prefix('/').unwrap_or(path).to_string();
        let (service, method) = name.split_once('/').unwrap_or((&name, ""));
        let (service, method) = (service.to_string(), method.to_string());
        let mut call = tracer.call(name, req.headers());
        let answer = self.inner.call(req);
        async move {
            let answer = answer.await;
            if call.recording() {
                call.set("rpc.system", "grpc");
                call.set("rpc.service", service);
                call.set("rpc.method", method);
                if let Ok(response) = &answer {
                    // A failed call answers its status in the headers (trailers-only);
                    // a successful one in trailers this layer does not wait for.
                    let code = response
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok()?.parse::<i64>().ok())
                        .unwrap_or(0);
                    call.set("rpc.grpc.status_code", code);
                    if crate::trace::grpc_server_failed(code) {
                        let message = response
                            .headers()
                            .get("grpc-message")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        call.error(message);
                    }
                }
            }
            answer
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{ready, Ready};
    use std::sync::Mutex;
    use std::time::Duration;

    use opentelemetry::trace::{SpanId, Status};
    use opentelemetry::Value;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SpanData, SpanExporter};
    use tower_layer::Layer;
    use tower_service::Service;

    use super::*;
    use crate::trace::{Counters, TracingArgs};

    #[derive(Debug, Clone, Default)]
    struct Collector(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Collector {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.lock().unwrap().extend(batch);
            Ok(())
        }
    }

    /// Answers every call, with this grpc-status in its headers if any.
    #[derive(Debug, Clone)]
    struct Answer(Option<&'static str>);

    impl Service<http::Request<()>> for Answer {
        type Response = http::Response<()>;
        type Error = Infallible;
        type Future = Ready<Result<http::Response<()>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            let mut r = http::Response::new(());
            if let Some(code) = self.0 {
                r.headers_mut().insert("grpc-status", code.parse().unwrap());
                r.headers_mut()
                    .insert("grpc-message", "no such domain".parse().unwrap());
            }
            ready(Ok(r))
        }
    }

    fn counter(name: &str) -> prometheus::IntCounter {
        prometheus::IntCounter::new(name, name).unwrap()
    }

    #[tokio::test]
    async fn each_admin_call_is_a_span_named_by_its_method() {
        let args = TracingArgs {
            tracing: true,
            ..TracingArgs::default()
        };
        let settings = crate::trace::settings(&args, &|_| None).unwrap().unwrap();
        let spans = Collector::default();
        let counters = Counters {
            exported: counter("e"),
            dropped: counter("d"),
            failed: counter("f"),
        };
        let tracer = Arc::new(Tracer::start_with(&settings, spans.clone(), counters));
        let call = |status: Option<&'static str>| {
            let mut svc = TraceLayer(Some(tracer.clone())).layer(Answer(status));
            let req = http::Request::builder()
                .uri("/sluice.admin.v1.Admin/Explain")
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .body(())
                .unwrap();
            svc.call(req)
        };
        call(None).await.unwrap();
        call(Some("5")).await.unwrap();
        call(Some("13")).await.unwrap();
        // Without a tracer the layer only passes calls through.
        let mut plain = TraceLayer(None).layer(Answer(None));
        plain.call(http::Request::new(())).await.unwrap();
        tracer.stop(Duration::from_secs(5)).await;
        let spans = spans.0.lock().unwrap().clone();
        assert_eq!(spans.len(), 3);
        for s in &spans {
            assert_eq!(s.name, "sluice.admin.v1.Admin/Explain");
            assert_eq!(
                s.parent_span_id,
                SpanId::from_hex("00f067aa0ba902b7").unwrap()
            );
            let attr = |k: &str| {
                s.attributes
                    .iter()
                    .find(|kv| kv.key.as_str() == k)
                    .map(|kv| kv.value.clone())
            };
            assert_eq!(attr("rpc.method"), Some(Value::from("Explain")));
            assert_eq!(
                attr("rpc.service"),
                Some(Value::from("sluice.admin.v1.Admin"))
            );
        }
        assert_eq!(spans[0].status, Status::Unset);
        // NOT_FOUND is the caller's fault; INTERNAL the server's.
        assert_eq!(spans[1].status, Status::Unset);
        assert_eq!(spans[2].status, Status::error("no such domain"));
    }
}
