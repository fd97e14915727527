//! Why a call to the admin API failed, when the connection failed it: the port is
//! asked again, apart from the call, to tell a TLS port reached in plain text, a
//! port that does not speak HTTP/2, a TLS handshake it refused, or a plain-text
//! port reached over TLS.

use super::connect::{status_text, ConnectArgs, ConnectError};

/// Why a call failed when the failure is the connection's, not an answer of the
/// admin API: a port that is not the admin API's (the gRPC port answers an unknown
/// method, the HTTP port a 404), a TLS port reached in plain text, or a TLS
/// handshake the port refused. TLS 1.3 tells a client its certificate was refused
/// only after the handshake, and a call's first write can lose that alert to a
/// broken pipe, so the port is asked again here, reading before writing. `None`:
/// the admin API answered, or nothing more can be said.
pub async fn unanswered(args: &ConnectArgs, s: &tonic::Status) -> Option<ConnectError> {
    let server = &args.server;
    let failed = |message: String| ConnectError::Connect {
        server: server.clone(),
        message,
    };
    if s.code() == tonic::Code::Unimplemented {
        return Some(failed(format!(
            "it does not serve sluice's admin API ({}): --server names the admin port (--admin-addr, by default {}), not the gRPC or HTTP port",
            status_text(s),
            crate::config::DEFAULT_ADMIN_ADDR
        )));
    }
    // A status tonic made of a transport error carries it; the server's do not.
    std::error::Error::source(s)?;
    let (url, tls) = args.url().ok()?;
    let probe = match tls {
        true => tls_refusal(args, &url).await,
        false => match not_h2(&url).await {
            Some(why) => Some(why.to_string()),
            None => http1(&url).await.then(|| {
                format!(
                    "it does not serve sluice's admin API (it answers HTTP/1.1, not gRPC): --server names the admin port (--admin-addr, by default {}), not the HTTP port",
                    crate::config::DEFAULT_ADMIN_ADDR
                )
            }),
        },
    };
    // The probe's reason alone: the call's own error is a broken pipe or a closed
    // connection, whichever the race gave.
    probe.map(failed)
}

/// HOST:PORT of an http:// or https:// URL, and its host (IPv6 without brackets).
fn authority(url: &str) -> (&str, &str) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    (
        authority,
        host.trim_start_matches('[').trim_end_matches(']'),
    )
}

/// How long a probe of the port waits for it to connect or to speak.
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the port answers an HTTP/2 preface with, when it is not HTTP/2: a TLS
/// alert record (a TLS port), or anything but the SETTINGS frame an HTTP/2 server
/// starts with. `None`: HTTP/2, or no answer in time.
async fn not_h2(url: &str) -> Option<&'static str> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (authority, _) = authority(url);
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(authority).await.ok()?;
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .ok()?;
        // A frame header: length (3 bytes), type (4: SETTINGS), flags, stream.
        let mut head = [0u8; 9];
        let mut got = 0;
        while got < head.len() {
            match stream.read(&mut head[got..]).await.ok()? {
                0 => break,
                n => got += n,
            }
        }
        Some(match head {
            // An alert record (content type 21) of TLS 1.x.
            [0x15, 0x03, ..] => Some(
                "it answers in TLS: give --tls-ca, the CA that signs its certificate (and --tls-cert and --tls-key for mutual TLS)",
            ),
            _ if got == head.len() && head[3] == 4 => None,
            _ if got == 0 => None,
            _ => Some(
                "it does not speak gRPC (HTTP/2): --server names sluice's admin port (--admin-addr)",
            ),
        })
    };
    tokio::time::timeout(PROBE_WAIT, probe)
        .await
        .ok()
        .flatten()
        .flatten()
}

/// Whether the port answers an HTTP/1.1 request in HTTP/1.1, as Sluice's HTTP port
/// does: it closes an HTTP/2 preface without a word.
async fn http1(url: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (authority, _) = authority(url);
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(authority).await.ok()?;
        let request = format!("GET / HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 7];
        stream.read_exact(&mut head).await.ok()?;
        Some(&head == b"HTTP/1.")
    };
    matches!(
        tokio::time::timeout(PROBE_WAIT, probe).await,
        Ok(Some(true))
    )
}

/// The alert with which the port refused a TLS handshake it seemed to take: read
/// after the handshake, without writing, so that no broken pipe hides it.
async fn tls_refusal(args: &ConnectArgs, url: &str) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let (authority, host) = authority(url);
    let config = super::connect::client_config(args).ok()?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).ok()?;
    let probe = async {
        let tcp = tokio::net::TcpStream::connect(authority).await.ok()?;
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let mut stream = connector.connect(name, tcp).await.ok()?;
        let mut byte = [0u8; 1];
        stream.read(&mut byte).await.err()
    };
    let e = tokio::time::timeout(PROBE_WAIT, probe).await.ok()??;
    let alert = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    let rustls::Error::AlertReceived(description) = alert else {
        return None;
    };
    let hint = match (description, &args.tls_cert) {
        (rustls::AlertDescription::CertificateRequired, _) => {
            ": it takes only clients with a certificate; give --tls-cert and --tls-key"
        }
        (_, Some(_)) => {
            ": it did not accept --tls-cert; is it signed by the CA of its --admin-tls-client-ca, named as its --admin-tls-client-san asks (if it has one), and within its validity period?"
        }
        (_, None) => "",
    };
    Some(format!("it refused the TLS handshake ({alert}){hint}"))
}

/// Whether a TLS connection failed because the port answered in something else.
pub(super) fn not_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    use rustls::{Error, InvalidMessage};
    let mut next = Some(e);
    while let Some(e) = next {
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<Error>());
        if let Some(Error::InvalidMessage(InvalidMessage::InvalidContentType)) = inner {
            return true;
        }
        next = e.source();
    }
    false
}
