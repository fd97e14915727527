//! The xDS source: `RateLimitConfig` resources (one per domain) from an xDS server
//! such as Envoy Gateway's, over ADS (`StreamAggregatedResources`), state of the
//! world, wildcard, as envoyproxy/ratelimit subscribes.
//!
//! Every response holds the whole set; it is converted ([`convert`]) and handed to
//! the [`Hub`], which merges its domains with the files' into the one policy. A
//! version that compiles is ACKed (its version and nonce); one that does not is
//! NACKed (the last good version, the nonce and `error_detail` with the reason) and
//! the last good policy keeps serving. A control plane resends a NACKed version at
//! once (go-control-plane does), so the same refusal is logged and counted once, and
//! repeated NACKs of it wait a little longer each time ([`Subscription`]) instead of
//! spinning. A version refused is tried again as soon as the policy files change
//! (and when the server sends it after that), since a fixed file may let it in;
//! taken, it is ACKed with the nonce it came with.
//!
//! A lost stream is retried after a jittered exponential back-off; the last good
//! policy serves meanwhile, and `sluice_xds_connected` reads 0. Each connection
//! reads the TLS files again, so a renewed Secret (a rotated authority included) is
//! taken at the next retry. Each new stream starts from the empty version, and a
//! version is new when its number or its contents differ from the last accepted, so
//! a restarted control plane that numbers its versions from 1 again is not mistaken
//! for one that has nothing new, even when it sends the number last accepted.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::pb::envoy::config::core::v3::{node::UserAgentVersionType, Node};
use crate::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use crate::pb::google::rpc::Status as RpcStatus;
use crate::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prometheus::IntGauge;
use prost::Message;
use rand::Rng;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::hub::Hub;
use crate::config::{XdsArgs, XdsUrl};
use crate::policy::{Document, PolicyError};
use crate::telemetry::printable::printable;
use crate::telemetry::Metrics;

pub mod convert;

/// How long a subscription may go unanswered before the log names the node id.
const QUIET_SUBSCRIPTION: Duration = Duration::from_secs(5);

/// The resource type subscribed to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// gRPC's INVALID_ARGUMENT, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Reconnect back-off: first wait, and the cap it doubles up to.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// How a server that is gone is noticed. A gRPC server closes a client that sends
/// HTTP/2 PINGs more often than every 5 minutes (`too_many_pings`: gRPC's default,
/// which Envoy Gateway's xDS server keeps), so a quiet stream pinged faster would
/// be cut every few minutes. A vanished host (its node lost, a network cut) is
/// noticed by TCP keepalive probes, which no server polices; a hung server, which
/// the kernel still answers for, by PINGs just slower than that.
struct Keepalive {
    /// Quiet time before the first TCP probe.
    idle: Duration,
    /// Between unanswered TCP probes.
    interval: Duration,
    /// Unanswered TCP probes before the connection is given up.
    retries: u32,
    /// Between HTTP/2 PINGs while the stream is open.
    ping: Duration,
    /// How long a PING may go unanswered.
    ping_timeout: Duration,
}

const KEEPALIVE: Keepalive = Keepalive {
    idle: Duration::from_secs(30),
    interval: Duration::from_secs(10),
    retries: 3,
    ping: Duration::from_secs(330),
    ping_timeout: Duration::from_secs(20),
};

/// Repeated NACKs of one refused version: first pause, and the cap.
const RENACK_FIRST: Duration = Duration::from_millis(250);
const RENACK_MAX: Duration = Duration::from_secs(4);

/// Why the xDS source cannot start.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("{flag} {path}: {error}")]
    Read {
        flag: &'static str,
        path: String,
        error: std::io::Error,
    },
    #[error("{flag} {path}: {what}")]
    Pem {
        flag: &'static str,
        path: String,
        what: &'static str,
    },
    #[error("--xds-server {0} uses TLS: give the authority that signs its certificate with --xds-tls-ca")]
    NoCa(String),
    #[error("--xds-server {0}: plain http:// takes no --xds-tls-* flags; use https://")]
    TlsOnPlain(String),
    #[error("--xds-server {url}: {error}")]
    Endpoint { url: String, error: String },
}

/// Subscribes to `RateLimitConfig`s and feeds the hub.
pub struct XdsSource {
    cfg: XdsArgs,
    server: XdsUrl,
    max_message_bytes: usize,
    subscription: Subscription,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    /// Set once a first version is accepted.
    loaded: Arc<AtomicBool>,
    /// `sluice_xds_connected`: 1 while a stream is open.
    connected: IntGauge,
}

impl XdsSource {
    /// Checks the settings and reads the TLS files, so that a bad one stops start-up.
    /// They are read again at each connection.
    pub fn new(
        cfg: &XdsArgs,
        url: &XdsUrl,
        hub: Arc<Hub>,
        metrics: Arc<Metrics>,
        loaded: Arc<AtomicBool>,
    ) -> Result<XdsSource, XdsError> {
        endpoint(cfg, url)?;
        if let (true, Some(cert)) = (url.tls, &cfg.xds_tls_cert) {
            crate::cert::warn_if_out_of_date(cert, "the xDS server", crate::cert::now_seconds());
        }
        metrics.declare_policy_source("xds");
        let connected = metrics.xds_connected();
        Ok(XdsSource {
            cfg: cfg.clone(),
            server: url.clone(),
            max_message_bytes: cfg.xds_max_message_bytes,
            subscription: Subscription::new(&cfg.xds_node_id),
            hub,
            metrics,
            loaded,
            connected,
        })
    }

    /// Subscribes until `shutdown` resolves, reconnecting as long as it takes.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut retry = RETRY_FIRST;
        loop {
            let (why, answered) = self.stream(shutdown.as_mut()).await;
            self.connected.set(0);
            let Some(why) = why else { return };
            if answered {
                retry = RETRY_FIRST;
            }
            let wait = jittered(retry);
            tracing::warn!(server = %self.server.url, error = %why, retry_in = ?wait, "xDS stream lost; the last good policy keeps serving");
            retry = (retry * 2).min(RETRY_MAX);
            tokio::select! {
                _ = shutdown.as_mut() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One stream, until it fails (`Some(reason)`) or `shutdown` resolves (`None`);
    /// also whether the server answered on it. The TLS files are read afresh: a
    /// renewed Secret (a new authority, new certificates) takes effect at the next
    /// connection, where the old files would be refused at every retry.
    async fn stream(
        &mut self,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> (Option<String>, bool) {
        let endpoint = match endpoint(&self.cfg, &self.server) {
            Ok(e) => e,
            Err(e) => return (Some(e.to_string()), false),
        };
        let channel: Channel = tokio::select! {
            _ = shutdown.as_mut() => return (None, false),
            c = endpoint.connect() => match c {
                Ok(c) => c,
                Err(e) => return (Some(crate::errors::chain(&e)), false),
            },
        };
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.max_message_bytes);
        let (tx, rx) = futures::channel::mpsc::unbounded();
        self.subscription.stream_opened();
        let _ = tx.unbounded_send(self.subscription.first_request());
        // A gRPC server may send nothing, its headers included, until it has a
        // configuration for the node: the one mistake this wait cannot tell from a
        // slow server, so it is named once the wait is long.
        let call = client.stream_aggregated_resources(rx);
        tokio::pin!(call);
        let quiet = tokio::time::sleep(QUIET_SUBSCRIPTION);
        tokio::pin!(quiet);
        let mut told = false;
        let mut responses = loop {
            tokio::select! {
                _ = shutdown.as_mut() => return (None, false),
                r = &mut call => match r {
                    Ok(r) => break r.into_inner(),
                    Err(status) => return (Some(status.to_string()), false),
                },
                _ = &mut quiet, if !told => {
                    told = true;
                    tracing::warn!(
                        server = %self.server.url,
                        node = %self.subscription.node.id,
                        "no answer from the xDS server {} s after subscribing: a server sends \
                         nothing until it has a configuration for this node id (--xds-node-id)",
                        QUIET_SUBSCRIPTION.as_secs()
                    );
                }
            }
        };
        tracing::info!(server = %self.server.url, "xDS stream open; subscribed to RateLimitConfig");
        self.connected.set(1);
        let mut answered = false;
        // The version last refused, tried again as soon as the files change: a fixed
        // file may let it in, and a server need not send it again.
        let mut refused: Option<DiscoveryResponse> = None;
        let mut files = self.hub.files_swapped();
        loop {
            let (response, recheck) = tokio::select! {
                _ = shutdown.as_mut() => return (None, answered),
                m = responses.message() => match m {
                    Ok(Some(r)) => (r, false),
                    Ok(None) => return (Some("the server closed the stream".into()), answered),
                    Err(status) => return (Some(status.to_string()), answered),
                },
                Ok(()) = files.changed(), if refused.is_some() => match refused.take() {
                    Some(r) => (r, true),
                    None => continue,
                },
            };
            answered |= !recheck;
            let context = *files.borrow_and_update();
            let hub = &self.hub;
            let answer = self
                .subscription
                .answer(&response, context, |docs| hub.set_xds(docs));
            self.report(&answer);
            if matches!(answer.verdict, Ack::Ignored { .. }) {
                continue;
            }
            let again = matches!(answer.verdict, Ack::Refused { first: false, .. });
            if matches!(answer.verdict, Ack::Refused { .. }) {
                refused = Some(response);
            }
            if recheck && again {
                // Still refused for the reason the server was told.
                continue;
            }
            if !answer.pause.is_zero() {
                tokio::select! {
                    _ = shutdown.as_mut() => return (None, answered),
                    _ = tokio::time::sleep(answer.pause) => {}
                }
            }
            if tx.unbounded_send(answer.request).is_err() {
                return (Some("the request stream closed".into()), answered);
            }
        }
    }

    fn report(&self, answer: &Answer) {
        match &answer.verdict {
            Ack::Accepted {
                version,
                domains,
                new,
            } => {
                self.loaded.store(true, Ordering::SeqCst);
                if *new {
                    self.metrics.policy_reload("xds", true);
                    tracing::info!(version = %version, domains, "xDS version accepted");
                } else {
                    tracing::debug!(version = %version, "xDS version sent again; unchanged");
                }
            }
            Ack::Refused {
                version,
                message,
                first: true,
            } => {
                self.metrics.policy_reload("xds", false);
                self.hub
                    .refuse("xds", format!("version {version}: {message}"));
                tracing::error!(version = %version, error = %printable(message), "xDS version refused (NACK); the last good policy keeps serving");
            }
            Ack::Refused { version, .. } => {
                tracing::debug!(version = %version, pause = ?answer.pause, "xDS version refused again");
            }
            Ack::Ignored { type_url } => {
                tracing::warn!(type_url = %printable(type_url), "xDS response of a type Sluice did not subscribe to; ignored");
            }
        }
    }
}

/// The endpoint for `url`, with TLS from the `--xds-tls-*` files.
fn endpoint(cfg: &XdsArgs, url: &XdsUrl) -> Result<Endpoint, XdsError> {
    let bad = |error: String| XdsError::Endpoint {
        url: url.url.clone(),
        error,
    };
    let mut endpoint = Endpoint::from_shared(url.url.clone())
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_keepalive(Some(KEEPALIVE.idle))
        .tcp_keepalive_interval(Some(KEEPALIVE.interval))
        .tcp_keepalive_retries(Some(KEEPALIVE.retries))
        .http2_keep_alive_interval(KEEPALIVE.ping)
        .keep_alive_timeout(KEEPALIVE.ping_timeout);
    let any_tls =
        cfg.xds_tls_cert.is_some() || cfg.xds_tls_ca.is_some() || cfg.xds_tls_server_name.is_some();
    if !url.tls {
        if any_tls {
            return Err(XdsError::TlsOnPlain(url.url.clone()));
        }
        return Ok(endpoint);
    }
    let Some(ca_path) = &cfg.xds_tls_ca else {
        return Err(XdsError::NoCa(url.url.clone()));
    };
    let ca = read_pem(ca_path, "--xds-tls-ca", Pem::Certificates)?;
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(
            cfg.xds_tls_server_name
                .clone()
                .unwrap_or_else(|| url.host.clone()),
        );
    if let (Some(cert), Some(key)) = (&cfg.xds_tls_cert, &cfg.xds_tls_key) {
        let cert = read_pem(cert, "--xds-tls-cert", Pem::Certificates)?;
        let key = read_pem(key, "--xds-tls-key", Pem::Key)?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    endpoint = endpoint
        .tls_config(tls)
        .map_err(|e| bad(crate::errors::chain(&e)))?;
    Ok(endpoint)
}

enum Pem {
    Certificates,
    Key,
}

/// Reads a PEM file and checks it holds what it should, for an error at start-up
/// rather than a failed handshake later.
fn read_pem(path: &std::path::Path, flag: &'static str, what: Pem) -> Result<Vec<u8>, XdsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|error| XdsError::Read {
        flag,
        path: shown.clone(),
        error,
    })?;
    let ok = match what {
        Pem::Certificates => {
            let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&bytes).collect();
            matches!(certs, Ok(c) if !c.is_empty())
        }
        Pem::Key => PrivateKeyDer::from_pem_slice(&bytes).is_ok(),
    };
    if !ok {
        return Err(XdsError::Pem {
            flag,
            path: shown,
            what: match what {
                Pem::Certificates => "no PEM certificate in the file",
                Pem::Key => "no PEM private key (PKCS#1, PKCS#8 or SEC1) in the file",
            },
        });
    }
    Ok(bytes)
}

/// `base` give or take half, so replicas that lost the server together do not
/// return together.
fn jittered(base: Duration) -> Duration {
    base.mul_f64(rand::rng().random_range(0.5..1.5))
}

// === impl Subscription ===

/// The client's side of the SotW protocol for one type, across streams.
#[derive(Debug)]
pub struct Subscription {
    node: Node,
    /// The last version accepted ("" before any).
    accepted: String,
    /// The digest of its contents: a restarted control plane may send the version
    /// number last accepted with other contents, which is news all the same.
    accepted_digest: Option<u64>,
    /// The last version refused, while the server keeps sending it.
    refused: Option<Refusal>,
    /// The version accepted on the stream open now, which a NACK names as the one
    /// kept. Empty on a new stream: the version accepted from a server before a
    /// restart is no version of the new one, and naming it would tell the new
    /// server that its own version of that number is already here (go-control-plane
    /// then never sends it).
    stream_version: String,
}

#[derive(Debug, Clone)]
struct Refusal {
    version: String,
    digest: u64,
    /// What the other sources were when it was refused (see [`Subscription::answer`]).
    context: u64,
    message: String,
    pause: Duration,
}

/// What to send back for one response, and what happened.
#[derive(Debug)]
pub struct Answer {
    /// The ACK or NACK; not sent for [`Ack::Ignored`].
    pub request: DiscoveryRequest,
    pub verdict: Ack,
    /// How long to wait before sending `request` (repeated NACKs only).
    pub pause: Duration,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Ack {
    /// ACK. `new` unless the same version, with the same contents, was accepted just
    /// before.
    Accepted {
        version: String,
        domains: usize,
        new: bool,
    },
    /// NACK; `first` the first time this version (same contents) is refused.
    Refused {
        version: String,
        message: String,
        first: bool,
    },
    /// A response of a type Sluice did not subscribe to: neither ACKed nor
    /// NACKed, as Envoy treats one, and no RateLimitConfig version is refused.
    Ignored { type_url: String },
}

impl Subscription {
    pub fn new(node_id: &str) -> Subscription {
        Subscription {
            node: Node {
                id: node_id.to_string(),
                user_agent_name: "sluice".into(),
                user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                    env!("CARGO_PKG_VERSION").into(),
                )),
                ..Default::default()
            },
            accepted: String::new(),
            accepted_digest: None,
            refused: None,
            stream_version: String::new(),
        }
    }

    /// A new stream opens: nothing is accepted on it yet.
    pub fn stream_opened(&mut self) {
        self.stream_version.clear();
    }

    /// The request that opens a stream: wildcard, no version, no nonce.
    pub fn first_request(&self) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(self.node.clone()),
            type_url: TYPE_URL.into(),
            ..Default::default()
        }
    }

    /// Decides `response` with `apply` (which installs the documents, or says why
    /// not) and builds the ACK or NACK. `context` stands for the documents a
    /// version must compile with (the files): a refusal is remembered for the
    /// context it was made in, and the same version is tried again in another, since
    /// a fixed file may let it in.
    pub fn answer(
        &mut self,
        response: &DiscoveryResponse,
        context: u64,
        apply: impl FnOnce(Vec<Document>) -> Result<(), Vec<PolicyError>>,
    ) -> Answer {
        if response.type_url != TYPE_URL {
            return Answer {
                request: self.first_request(),
                verdict: Ack::Ignored {
                    type_url: response.type_url.clone(),
                },
                pause: Duration::ZERO,
            };
        }
        let digest = digest(response);
        if let Some(r) = self.refused.as_mut() {
            if r.version == response.version_info && r.digest == digest && r.context == context {
                let pause = r.pause;
                r.pause = (r.pause * 2).min(RENACK_MAX);
                let (version, message) = (r.version.clone(), r.message.clone());
                return Answer {
                    request: self.nack(response, &message),
                    verdict: Ack::Refused {
                        version,
                        message,
                        first: false,
                    },
                    pause,
                };
            }
        }
        let result = documents(response).and_then(|docs| {
            let n = docs
                .iter()
                .map(|d| &d.domain)
                .collect::<std::collections::HashSet<_>>()
                .len();
            apply(docs).map(|()| n).map_err(|e| join(&e))
        });
        match result {
            Ok(domains) => {
                let new = self.accepted != response.version_info
                    || self.accepted_digest != Some(digest)
                    || self.refused.is_some();
                self.accepted = response.version_info.clone();
                self.stream_version = response.version_info.clone();
                self.accepted_digest = Some(digest);
                self.refused = None;
                Answer {
                    request: DiscoveryRequest {
                        version_info: response.version_info.clone(),
                        response_nonce: response.nonce.clone(),
                        ..self.first_request()
                    },
                    verdict: Ack::Accepted {
                        version: response.version_info.clone(),
                        domains,
                        new,
                    },
                    pause: Duration::ZERO,
                }
            }
            Err(message) => {
                // Tried again in a new context and refused for the same reason: no news.
                let again = self.refused.as_ref().is_some_and(|r| {
                    r.version == response.version_info && r.digest == digest && r.message == message
                });
                self.refused = Some(Refusal {
                    version: response.version_info.clone(),
                    digest,
                    context,
                    message: message.clone(),
                    pause: RENACK_FIRST,
                });
                Answer {
                    request: self.nack(response, &message),
                    verdict: Ack::Refused {
                        version: response.version_info.clone(),
                        message,
                        first: !again,
                    },
                    pause: Duration::ZERO,
                }
            }
        }
    }

    fn nack(&self, response: &DiscoveryResponse, message: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.stream_version.clone(),
            response_nonce: response.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: INVALID_ARGUMENT,
                message: message.to_string(),
                details: Vec::new(),
            }),
            ..self.first_request()
        }
    }
}

/// The response's documents, or every reason it cannot be read.
fn documents(response: &DiscoveryResponse) -> Result<Vec<Document>, String> {
    let mut docs = Vec::with_capacity(response.resources.len());
    let mut errors = Vec::new();
    for (i, any) in response.resources.iter().enumerate() {
        if any.type_url != TYPE_URL {
            errors.push(format!("resource {i} has type {:?}", any.type_url));
            continue;
        }
        match RateLimitConfig::decode(any.value.as_slice()) {
            Ok(config) => match convert::document(&config) {
                Ok(doc) => docs.push(doc),
                Err(e) => errors.push(join(&e)),
            },
            Err(e) => errors.push(format!("resource {i} does not decode: {e}")),
        }
    }
    if errors.is_empty() {
        Ok(docs)
    } else {
        Err(errors.join("; "))
    }
}

fn join(errors: &[PolicyError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What identifies a response's contents (the nonce differs on every send), in
/// whatever order its resources come: go-control-plane lists a snapshot's resources
/// in Go's map order, which changes from one send to the next.
fn digest(response: &DiscoveryResponse) -> u64 {
    let mut resources: Vec<(&str, &[u8])> = response
        .resources
        .iter()
        .map(|any| (any.type_url.as_str(), any.value.as_slice()))
        .collect();
    resources.sort_unstable();
    let mut h = DefaultHasher::new();
    response.type_url.hash(&mut h);
    resources.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use crate::pb::ratelimit::config::ratelimit::v3::{
        RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    };
    use prost_types::Any;

    use super::*;

    fn config(domain: &str, key: &str) -> Any {
        let c = RateLimitConfig {
            name: domain.into(),
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                key: key.into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Second as i32,
                    requests_per_unit: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        };
        Any {
            type_url: TYPE_URL.into(),
            value: c.encode_to_vec(),
        }
    }

    fn response(version: &str, nonce: &str, resources: Vec<Any>) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: version.into(),
            nonce: nonce.into(),
            type_url: TYPE_URL.into(),
            resources,
            ..Default::default()
        }
    }

    /// Applies as the hub does: the documents must compile together.
    fn apply(docs: Vec<Document>) -> Result<(), Vec<PolicyError>> {
        crate::policy::compile(docs).map(|_| ())
    }

    #[test]
    fn the_first_request_is_a_wildcard_with_the_node() {
        let s = Subscription::new("envoy-ratelimit");
        let r = s.first_request();
        assert_eq!(r.type_url, TYPE_URL);
        assert!(
            r.resource_names.is_empty() && r.version_info.is_empty() && r.response_nonce.is_empty()
        );
        assert_eq!(r.node.unwrap().id, "envoy-ratelimit");
    }

    #[test]
    fn good_versions_are_acked_and_a_bad_one_nacked_with_the_last_good() {
        let mut s = Subscription::new("n");
        let a = s.answer(
            &response("1", "a", vec![config("d1", "k"), config("d2", "k")]),
            0,
            apply,
        );
        assert_eq!(
            a.verdict,
            Ack::Accepted {
                version: "1".into(),
                domains: 2,
                new: true
            }
        );
        assert_eq!(
            (
                a.request.version_info.as_str(),
                a.request.response_nonce.as_str()
            ),
            ("1", "a")
        );
        assert!(a.request.error_detail.is_none());

        // Two configs defining the same path of one domain do not compile.
        let bad = response("2", "b", vec![config("d1", "k"), config("d1", "k")]);
        let a = s.answer(&bad, 0, apply);
        let Ack::Refused {
            version,
            message,
            first: true,
        } = &a.verdict
        else {
            panic!("{:?}", a.verdict)
        };
        assert_eq!(version, "2");
        assert!(message.contains("duplicate descriptor"), "{message}");
        assert_eq!(
            (
                a.request.version_info.as_str(),
                a.request.response_nonce.as_str()
            ),
            ("1", "b")
        );
        let detail = a.request.error_detail.unwrap();
        assert_eq!(
            (detail.code, detail.message.as_str()),
            (INVALID_ARGUMENT, message.as_str())
        );
        assert_eq!(a.pause, Duration::ZERO);

        // Sent again at once: refused without another first, each NACK waiting longer.
        let mut pauses = Vec::new();
        for nonce in ["c", "d", "e", "f", "g", "h", "i"] {
            let again = response("2", nonce, bad.resources.clone());
            let a = s.answer(&again, 0, |_| {
                panic!("a known refusal is not applied again")
            });
            assert!(matches!(a.verdict, Ack::Refused { first: false, .. }));
            assert_eq!(a.request.response_nonce, nonce);
            assert_eq!(a.request.version_info, "1");
            pauses.push(a.pause);
        }
        assert_eq!(pauses[0], RENACK_FIRST);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*pauses.last().unwrap(), RENACK_MAX);

        // A fixed version is accepted at once.
        let a = s.answer(&response("3", "j", vec![config("d1", "k")]), 0, apply);
        assert_eq!(
            a.verdict,
            Ack::Accepted {
                version: "3".into(),
                domains: 1,
                new: true
            }
        );
        assert_eq!(a.pause, Duration::ZERO);
        // The same version again (a new stream) is accepted, not new.
        let a = s.answer(&response("3", "k", vec![config("d1", "k")]), 0, apply);
        assert!(matches!(a.verdict, Ack::Accepted { new: false, .. }));
    }

    /// After a restart, a NACK names no version accepted from the server before it.
    #[test]
    fn a_nack_on_a_new_stream_names_no_version_of_the_old_one() {
        let mut s = Subscription::new("n");
        let a = s.answer(&response("2", "a", vec![config("d1", "k")]), 0, apply);
        assert!(matches!(a.verdict, Ack::Accepted { .. }));
        // The server restarts: its version 1 does not compile.
        s.stream_opened();
        let bad = response("1", "b", vec![config("d1", "k"), config("d1", "k")]);
        let a = s.answer(&bad, 0, apply);
        assert!(matches!(a.verdict, Ack::Refused { first: true, .. }));
        assert_eq!(
            a.request.version_info, "",
            "its version 2 is still to come, not here"
        );
        // Once one of its versions is taken, a NACK names that one.
        let a = s.answer(&response("2", "c", vec![config("d2", "k")]), 0, apply);
        assert!(matches!(a.verdict, Ack::Accepted { new: true, .. }));
        let a = s.answer(&response("3", "d", bad.resources.clone()), 0, apply);
        assert_eq!(a.request.version_info, "2");
    }

    /// A restarted control plane numbers from 1 again: the number last accepted with
    /// other contents is a new version; the same contents in another order are not.
    #[test]
    fn the_same_version_number_with_other_contents_is_new() {
        let mut s = Subscription::new("n");
        let two = vec![config("d1", "k"), config("d2", "k")];
        let a = s.answer(&response("1", "a", two.clone()), 0, apply);
        assert!(matches!(a.verdict, Ack::Accepted { new: true, .. }));
        let reordered = two.into_iter().rev().collect();
        let a = s.answer(&response("1", "b", reordered), 0, apply);
        assert!(matches!(a.verdict, Ack::Accepted { new: false, .. }));
        let other = vec![config("d1", "k"), config("d2", "other")];
        let a = s.answer(&response("1", "c", other.clone()), 0, apply);
        assert_eq!(
            a.verdict,
            Ack::Accepted {
                version: "1".into(),
                domains: 2,
                new: true
            }
        );
        assert_eq!(a.request.version_info, "1");
        let a = s.answer(&response("1", "d", other), 0, apply);
        assert!(matches!(a.verdict, Ack::Accepted { new: false, .. }));
    }

    /// A version refused for clashing with the files is tried again once they
    /// change; refused again for the same reason, it is no news.
    #[test]
    fn a_refusal_holds_only_until_the_files_change() {
        let mut s = Subscription::new("n");
        let clash = |_: Vec<Document>| {
            Err(vec![PolicyError {
                file: "f.yaml".into(),
                line: Some(3),
                message: "duplicate descriptor".into(),
            }])
        };
        let v2 = |nonce: &str| response("2", nonce, vec![config("d", "k")]);
        let a = s.answer(&v2("a"), 0, clash);
        assert!(matches!(a.verdict, Ack::Refused { first: true, .. }));
        let a = s.answer(&v2("b"), 0, |_| panic!("same files: not tried again"));
        assert!(matches!(a.verdict, Ack::Refused { first: false, .. }));
        let a = s.answer(&v2("b"), 1, clash);
        assert!(
            matches!(a.verdict, Ack::Refused { first: false, .. }),
            "the same reason is not news"
        );
        let a = s.answer(&v2("b"), 2, apply);
        assert!(matches!(a.verdict, Ack::Accepted { new: true, .. }));
        assert_eq!(
            (
                a.request.version_info.as_str(),
                a.request.response_nonce.as_str()
            ),
            ("2", "b")
        );
    }

    #[test]
    fn unreadable_resources_are_nacked_with_the_reason() {
        let mut s = Subscription::new("n");
        let mut wrong = response("1", "a", vec![config("d", "k")]);
        wrong.resources[0].type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        let a = s.answer(&wrong, 0, apply);
        assert!(
            matches!(&a.verdict, Ack::Refused { message, .. } if message.contains("resource 0 has type"))
        );
        assert_eq!(a.request.version_info, "");
        let garbage = response(
            "1",
            "b",
            vec![Any {
                type_url: TYPE_URL.into(),
                value: vec![0xff, 0xff],
            }],
        );
        let a = s.answer(&garbage, 0, apply);
        assert!(
            matches!(&a.verdict, Ack::Refused { message, .. } if message.contains("does not decode"))
        );
        let empty = response("2", "c", vec![]);
        assert!(matches!(
            s.answer(&empty, 0, apply).verdict,
            Ack::Accepted { domains: 0, .. }
        ));
    }

    /// A response of another type (a misbehaving server's) is no RateLimitConfig
    /// version: ignored, as Envoy ignores one, with nothing refused or counted.
    #[test]
    fn a_response_of_another_type_is_ignored() {
        let mut s = Subscription::new("n");
        let good = response("1", "a", vec![config("d", "k")]);
        assert!(matches!(
            s.answer(&good, 0, apply).verdict,
            Ack::Accepted { new: true, .. }
        ));
        let mut other = response("7", "b", vec![config("d", "k")]);
        other.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        let a = s.answer(&other, 0, |_| panic!("nothing is applied"));
        assert_eq!(
            a.verdict,
            Ack::Ignored {
                type_url: other.type_url.clone()
            }
        );
        // What was accepted stands: the same version again is no news.
        assert!(matches!(
            s.answer(&response("1", "c", vec![config("d", "k")]), 0, apply)
                .verdict,
            Ack::Accepted { new: false, .. }
        ));
    }

    #[test]
    fn pings_are_slower_than_grpc_servers_allow_and_a_vanished_host_is_noticed() {
        let k = KEEPALIVE;
        // gRPC's default `keepalive.EnforcementPolicy.MinTime`.
        assert!(k.ping > Duration::from_secs(300));
        assert!(k.idle + k.interval * k.retries <= Duration::from_secs(60));
    }

    #[test]
    fn back_off_jitter_stays_within_half() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(2));
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(3),
                "{d:?}"
            );
        }
    }
}
