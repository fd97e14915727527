//! The headers each export carries: the settings' own (`--otlp-headers`, else
//! `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`), and no others of the user's.
//!
//! The OTLP exporter also reads those variables itself and puts their headers over
//! the ones it is given, which would let a variable win over its flag (and send
//! the variable's credentials where the flag named others). So the export's HTTP
//! client and gRPC interceptor here take off what the exporter added from a
//! variable and put the settings' headers back, on each export.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use opentelemetry_http::{HttpClient, HttpError};

/// The headers an export ends with.
#[derive(Debug, Clone, Default)]
pub struct Headers {
    /// What the exporter may have added from a variable.
    unset: Vec<HeaderName>,
    set: Vec<(HeaderName, HeaderValue)>,
}

impl Headers {
    /// The settings' `headers` (already checked), against what the exporter reads
    /// from `env`: `OTEL_EXPORTER_OTLP_TRACES_HEADERS` if set, else
    /// `OTEL_EXPORTER_OTLP_HEADERS`, as it does.
    pub fn new(headers: &[(String, String)], env: &dyn Fn(&str) -> Option<String>) -> Headers {
        let read = env("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|| env("OTEL_EXPORTER_OTLP_HEADERS"))
            .unwrap_or_default();
        let unset = read
            .split(',')
            .filter_map(|item| item.split_once('='))
            .filter_map(|(k, _)| HeaderName::from_bytes(k.trim().as_bytes()).ok())
            .collect();
        let set = headers
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    HeaderName::from_bytes(k.as_bytes()).ok()?,
                    HeaderValue::from_str(v).ok()?,
                ))
            })
            .collect();
        Headers { unset, set }
    }

    /// Makes `headers` (an export's) carry these.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.unset {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
    }

    /// As [`Headers::apply`], on a gRPC export's metadata.
    pub fn apply_grpc(&self, request: tonic::Request<()>) -> tonic::Request<()> {
        let (metadata, extensions, message) = request.into_parts();
        let mut headers = metadata.into_headers();
        self.apply(&mut headers);
        tonic::Request::from_parts(
            tonic::metadata::MetadataMap::from_headers(headers),
            extensions,
            message,
        )
    }
}

/// The OTLP/HTTP exporter's client: hyper's (over TLS for https://), with
/// [`Headers`] on each export.
#[derive(Debug)]
pub struct Client {
    pub inner: Box<dyn HttpClient>,
    pub headers: Arc<Headers>,
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, mut request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        self.headers.apply(request.headers_mut());
        self.inner.send_bytes(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)], env: &[(&str, &str)]) -> HeaderMap {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let h = Headers::new(&pairs, &get);
        // What the exporter sends: its own headers, and the variable's over those
        // it was given.
        let mut sent = HeaderMap::new();
        sent.insert("content-type", "application/x-protobuf".parse().unwrap());
        for (k, v) in &pairs {
            sent.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let read = get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|| get("OTEL_EXPORTER_OTLP_HEADERS"))
            .unwrap_or_default();
        for (k, v) in read.split(',').filter_map(|i| i.split_once('=')) {
            sent.insert(
                HeaderName::from_bytes(k.trim().as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h.apply(&mut sent);
        sent
    }

    #[test]
    fn the_flags_headers_win_over_the_variables() {
        let sent = headers(
            &[("authorization", "flag")],
            &[("OTEL_EXPORTER_OTLP_HEADERS", "authorization=env,x-env=1")],
        );
        assert_eq!(sent["authorization"], "flag");
        assert_eq!(sent.get("x-env"), None);
        assert_eq!(sent["content-type"], "application/x-protobuf");
        let sent = headers(
            &[("x-tenant", "flag")],
            &[("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=env")],
        );
        assert_eq!(sent["x-tenant"], "flag");
    }

    #[test]
    fn without_the_flag_the_settings_headers_are_sent_as_read() {
        // The settings merged both variables, the signal's winning: so do exports.
        let sent = headers(
            &[("authorization", "a"), ("X-Tenant", "2")],
            &[
                ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=a,x-tenant=1"),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Tenant=2"),
            ],
        );
        assert_eq!(sent["authorization"], "a");
        assert_eq!(sent["x-tenant"], "2");
        assert_eq!(sent.len(), 3);
    }
}
