//! How the generator sends one ShouldRateLimit call: straight on an `h2` client
//! connection (the default), or through tonic's `Channel` (`--client tonic`, the
//! client most Rust callers would use).
//!
//! The generator shares the machine with the service it measures, so its CPU per
//! request is taken from the service. tonic's `Channel` hands each call to a buffer
//! task and then to hyper's client dispatch; the `h2` path opens the stream from the
//! worker itself, sends a body framed before the run, and reads back only the DATA and
//! the trailers.

use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use clap::ValueEnum;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri};
use tokio::net::TcpStream;
use tonic::Status;

use crate::codec;

/// Which HTTP/2 client sends the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// `h2` directly: one stream per call, no extra task hop.
    H2,
    /// tonic's `Channel` (tower buffer + hyper client).
    Tonic,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::H2 => "h2",
            Kind::Tonic => "tonic",
        }
    }
}

/// One worker's handle on one connection; clones share the connection.
#[derive(Clone)]
pub enum Client {
    H2 {
        send: h2::client::SendRequest<Bytes>,
        /// The request head, cloned for every call.
        head: Request<()>,
    },
    Tonic(tonic::client::Grpc<tonic::transport::Channel>),
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl Client {
    /// Opens one HTTP/2 connection to `addr` (host:port).
    pub async fn connect(kind: Kind, addr: &str) -> anyhow::Result<Client> {
        match kind {
            Kind::H2 => {
                let send = tokio::time::timeout(CONNECT_TIMEOUT, handshake(addr))
                    .await
                    .map_err(|_| anyhow::anyhow!("cannot connect to {addr}: timed out"))?
                    .map_err(|e| anyhow::anyhow!("cannot connect to {addr}: {e}"))?;
                Ok(Client::H2 {
                    send,
                    head: head(addr)?,
                })
            }
            Kind::Tonic => {
                let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
                    .tcp_nodelay(true)
                    .connect_timeout(CONNECT_TIMEOUT);
                let ch = endpoint
                    .connect()
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot connect to {addr}: {e}"))?;
                Ok(Client::Tonic(tonic::client::Grpc::new(ch)))
            }
        }
    }

    /// One ShouldRateLimit call. `body` is a gRPC-framed RateLimitRequest (see
    /// [`sluice_grpc::frame_into`]); returns the response's `overall_code`.
    pub async fn call(&mut self, body: Bytes) -> Result<i32, Status> {
        match self {
            Client::H2 { send, head } => call_h2(send, head, body).await,
            Client::Tonic(grpc) => {
                codec::should_rate_limit(grpc, body.slice(codec::PREFIX..)).await
            }
        }
    }
}

async fn handshake(addr: &str) -> anyhow::Result<h2::client::SendRequest<Bytes>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    // A 1 MiB connection window, as sluice's server and gRPC clients use. With h2's
    // default 64 KiB, its budget for small DATA frames read late (half the window) is
    // about 150 answers: past some 600 calls in flight on 4 connections the client
    // closed its own connections with ENHANCE_YOUR_CALM ("too_many_data_frames").
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(1024 * 1024)
        .initial_connection_window_size(1024 * 1024)
        .handshake(tcp)
        .await?;
    // The connection's driver. Its error, if any, also fails every stream on it, and
    // those failures are what the workers report.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// The request head every call sends. The URI is built from a leaked string so that
/// its parts are static and cloning them touches no shared reference count.
fn head(addr: &str) -> anyhow::Result<Request<()>> {
    let uri: &'static str = String::leak(format!("http://{addr}{}", codec::PATH));
    let mut req = Request::new(());
    *req.method_mut() = Method::POST;
    *req.uri_mut() = Uri::try_from(uri)?;
    let headers = req.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    Ok(req)
}

async fn call_h2(
    send: &mut h2::client::SendRequest<Bytes>,
    head: &Request<()>,
    body: Bytes,
) -> Result<i32, Status> {
    // A stream the server refused before doing anything (REFUSED_STREAM) is sent again,
    // as gRPC clients do: the first calls on a connection can go out before the
    // server's SETTINGS with its stream limit arrive.
    let mut refused = 0;
    loop {
        match call_h2_once(send, head, body.clone()).await {
            Err(Failed::H2(e)) if e.reason() == Some(h2::Reason::REFUSED_STREAM) && refused < 3 => {
                refused += 1
            }
            Err(Failed::H2(e)) => return Err(h2_error(e)),
            Err(Failed::Status(s)) => return Err(s),
            Ok(code) => return Ok(code),
        }
    }
}

/// Why one attempt of a call failed.
enum Failed {
    H2(h2::Error),
    Status(Status),
}

impl From<h2::Error> for Failed {
    fn from(e: h2::Error) -> Self {
        Failed::H2(e)
    }
}

impl From<Status> for Failed {
    fn from(s: Status) -> Self {
        Failed::Status(s)
    }
}

async fn call_h2_once(
    send: &mut h2::client::SendRequest<Bytes>,
    head: &Request<()>,
    body: Bytes,
) -> Result<i32, Failed> {
    // Waits while the connection is at the peer's limit of concurrent streams.
    poll_fn(|cx| send.poll_ready(cx)).await?;
    let (response, mut stream) = send.send_request(head.clone(), false)?;
    stream.send_data(body, true)?;
    let (parts, mut body) = response.await?.into_parts();
    if parts.status != StatusCode::OK {
        return Err(Status::unknown(format!("HTTP status {}", parts.status)).into());
    }
    // Trailers-only: an error comes in the headers, with no body.
    if let Some(status) = grpc_status(&parts.headers) {
        return Err(status
            .err()
            .unwrap_or_else(|| Status::internal("no response message"))
            .into());
    }
    let mut message = Bytes::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        // One DATA frame almost always holds the whole (small) message.
        message = if message.is_empty() {
            chunk
        } else {
            Bytes::from([&message[..], &chunk[..]].concat())
        };
    }
    let trailers = body.trailers().await?;
    match trailers.as_ref().and_then(grpc_status) {
        Some(Ok(())) => Ok(codec::unframe_code(&message)?),
        Some(Err(status)) => Err(status.into()),
        None => Err(Status::internal("response without grpc-status").into()),
    }
}

/// The `grpc-status` in these headers, if any: `Ok` for 0, else the error with its
/// (percent-decoded) message.
fn grpc_status(headers: &HeaderMap) -> Option<Result<(), Status>> {
    let code = headers.get("grpc-status")?;
    if code == "0" {
        return Some(Ok(()));
    }
    Status::from_header_map(headers).map(Err)
}

fn h2_error(e: h2::Error) -> Status {
    Status::unavailable(format!("h2: {e}"))
}
