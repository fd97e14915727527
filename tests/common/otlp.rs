//! An OTLP/HTTP trace receiver on loopback, for tests of what sluice exports.

use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;

/// An OTLP/HTTP receiver on loopback, as a collector would be: every span of every
/// `POST /v1/traces`, with its resource's `service.name`.
pub struct Receiver {
    pub addr: std::net::SocketAddr,
    spans: std::sync::Arc<std::sync::Mutex<Vec<(String, Span)>>>,
    /// Each export's header lines, lowercased.
    heads: Heads,
    /// Served over TLS (https://).
    tls: bool,
}

type Heads = std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>;

impl Receiver {
    pub async fn start() -> Receiver {
        Receiver::start_on(None).await
    }

    /// A receiver over TLS with `server`'s certificate (for localhost and
    /// 127.0.0.1), requiring client certificates signed by `client_ca` if given.
    pub async fn start_tls(
        server: &super::tls::Pair,
        client_ca: Option<&std::path::Path>,
    ) -> Receiver {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots
                    .add(CertificateDer::from_pem_file(ca).unwrap())
                    .unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let chain = CertificateDer::pem_file_iter(&server.cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&server.key).unwrap();
        let config = builder.with_single_cert(chain, key).unwrap();
        Receiver::start_on(Some(std::sync::Arc::new(config))).await
    }

    async fn start_on(tls: Option<std::sync::Arc<rustls::ServerConfig>>) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let heads = Heads::default();
        let (sink, seen) = (spans.clone(), heads.clone());
        let acceptor = tls.clone().map(tokio_rustls::TlsAcceptor::from);
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (sink, seen, acceptor) = (sink.clone(), seen.clone(), acceptor.clone());
                tokio::spawn(async move {
                    match acceptor {
                        None => serve_otlp(conn, sink, seen).await,
                        // A handshake refused (an unknown client) takes no export.
                        Some(a) => {
                            if let Ok(conn) = a.accept(conn).await {
                                serve_otlp(conn, sink, seen).await
                            }
                        }
                    }
                });
            }
        });
        Receiver {
            addr,
            spans,
            heads,
            tls: tls.is_some(),
        }
    }

    pub fn spans(&self) -> Vec<(String, Span)> {
        self.spans.lock().unwrap().clone()
    }

    /// The header lines of each export received, lowercased (`name: value`).
    pub fn heads(&self) -> Vec<Vec<String>> {
        self.heads.lock().unwrap().clone()
    }
}

/// HTTP/1.1 requests of one connection: each body is an ExportTraceServiceRequest.
async fn serve_otlp(
    mut conn: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    sink: std::sync::Arc<std::sync::Mutex<Vec<(String, Span)>>>,
    heads: Heads,
) {
    use prost::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 8192];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 8192];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        heads
            .lock()
            .unwrap()
            .push(head.lines().skip(1).map(str::to_string).collect());
        let body: Vec<u8> = buf.drain(..head_end + length).skip(head_end).collect();
        if let Ok(req) = ExportTraceServiceRequest::decode(body.as_slice()) {
            let mut spans = sink.lock().unwrap();
            for rs in req.resource_spans {
                let service = rs
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|kv| kv.key == "service.name")
                    .map(|kv| text(kv.value.as_ref()))
                    .unwrap_or_default();
                for ss in rs.scope_spans {
                    spans.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
                }
            }
        }
        let ok =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if conn.write_all(ok).await.is_err() {
            return;
        }
    }
}

/// An attribute value as text (strings as they are, numbers in decimal).
pub fn text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

pub fn attr(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| text(kv.value.as_ref()))
}

impl Receiver {
    /// Its endpoint, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// A sluice serving `policy` that exports its spans here, in batches sent
    /// every 100 ms; `env` adds to its environment.
    pub fn serve(&self, policy: &str, env: &[(&str, &str)]) -> super::Server {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policy.yaml");
        std::fs::write(&file, policy).unwrap();
        let endpoint = self.endpoint();
        let mut env = env.to_vec();
        env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()));
        env.push(("OTEL_BSP_SCHEDULE_DELAY", "100"));
        super::Server::start_env(dir, &[file], &[], &env)
    }

    /// The spans received once `done` holds of them, or panics at `limit`.
    pub async fn wait(
        &self,
        limit: Duration,
        what: &str,
        done: impl Fn(&[Span]) -> bool,
    ) -> Vec<Span> {
        let deadline = Instant::now() + limit;
        loop {
            let spans: Vec<Span> = self.spans().into_iter().map(|(_, s)| s).collect();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} in {limit:?}: {spans:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// An id as the hex digits backends show.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|x| format!("{x:02x}")).collect()
}
