//! Reaching a running sluice's admin API, in plain text or over (mutual) TLS.

use std::path::PathBuf;

use clap::Args;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::admin::pb::admin_client::AdminClient;

/// Where the admin API is and how to reach it.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// A running sluice's admin API: HOST:PORT, http://HOST:PORT, or https://HOST:PORT
    /// with --tls-ca.
    #[arg(
        long,
        env = "SLUICE_SERVER",
        default_value = crate::config::DEFAULT_ADMIN_ADDR,
        value_parser = parse_server
    )]
    pub server: String,
    /// PEM CA that signs the admin port's certificate (TLS).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate for an admin port with mutual TLS (with --tls-key and
    /// --tls-ca).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// Why the admin API could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot reach the admin API at {server}: {message}")]
    Connect { server: String, message: String },
    #[error("{}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// TLS flags that do not fit `--server`: they would go unused.
    #[error("{0}")]
    Flags(String),
}

/// `--server`: HOST:PORT, http://HOST:PORT or https://HOST:PORT, the port 1-65535.
/// Checked here: tonic takes a port out of range for no port and dials port 80.
pub fn parse_server(s: &str) -> Result<String, String> {
    const HINT: &str = "expected HOST:PORT, http://HOST:PORT or https://HOST:PORT";
    let rest = match s.split_once("://") {
        None => s,
        Some(("http" | "https", rest)) => rest,
        Some((scheme, _)) => return Err(format!("unknown scheme '{scheme}://'; {HINT}")),
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    // An IPv6 address holds colons of its own: its port follows `]:`.
    let split = match authority.starts_with('[') {
        true => authority
            .rsplit_once("]:")
            .map(|(host, port)| (&authority[..host.len() + 1], port)),
        false => authority.rsplit_once(':'),
    };
    let Some((host, port)) = split else {
        return Err(format!("'{s}' has no port; {HINT}"));
    };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        }
    };
    if !host_ok {
        return Err(format!("'{host}' is not a host name or address; {HINT}"));
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("'{port}' is not a port number; {HINT}"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(s.to_string()),
        _ => Err(format!("port {port} is out of range: expected 1-65535")),
    }
}

impl ConnectArgs {
    /// The admin API's URL and whether it is reached over TLS: with https://, or
    /// with --tls-ca and no scheme. Refuses TLS flags that would go unused, and
    /// https:// without the CA that would check the server.
    pub fn url(&self) -> Result<(String, bool), ConnectError> {
        let server = &self.server;
        let refuse = |message: String| Err(ConnectError::Flags(message));
        match server.split_once("://").map(|(scheme, _)| scheme) {
            Some("http") if self.tls_ca.is_some() || self.tls_cert.is_some() => refuse(format!(
                "--server {server}: plain http:// takes no --tls-ca, --tls-cert or --tls-key; use https://"
            )),
            Some("https") if self.tls_ca.is_none() => refuse(format!(
                "--server {server}: https:// needs --tls-ca, the CA that signs the admin port's certificate"
            )),
            Some(scheme) => Ok((server.clone(), scheme == "https")),
            None if self.tls_ca.is_some() => Ok((format!("https://{server}"), true)),
            None if self.tls_cert.is_some() => refuse(
                "--tls-cert and --tls-key are for TLS, which needs --tls-ca (the CA that signs the admin port's certificate)"
                    .to_string(),
            ),
            None => Ok((format!("http://{server}"), false)),
        }
    }
}

/// What a failed call says: its message, then the causes beneath it. A TLS
/// handshake the server refused (no client certificate) is only "transport error"
/// at the top.
pub fn status_text(s: &tonic::Status) -> String {
    use std::error::Error;
    let Some(cause) = s.source() else {
        return s.message().to_string();
    };
    // The first cause often repeats the message ("transport error").
    let causes = crate::errors::chain(cause);
    if causes.starts_with(s.message()) {
        causes
    } else {
        format!("{}: {causes}", s.message())
    }
}

/// The TLS client `connect` sets up, as rustls takes it: the files of `--tls-ca`,
/// `--tls-cert` and `--tls-key` checked, each named with why it cannot be used
/// (tonic finds a bad one only when connecting, and says "transport error").
pub(super) fn client_config(args: &ConnectArgs) -> Result<rustls::ClientConfig, ConnectError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let refused = |message: String| ConnectError::Flags(message);
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|error| ConnectError::Read {
            path: p.clone(),
            error,
        })
    };
    let certificates = |flag: &str, p: &PathBuf| {
        let certs = CertificateDer::pem_slice_iter(&read(p)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| refused(format!("{flag} {}: {e}", p.display())))?;
        match certs.is_empty() {
            true => Err(refused(format!(
                "{flag} {}: no PEM certificate in the file",
                p.display()
            ))),
            false => Ok(certs),
        }
    };
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = &args.tls_ca {
        for cert in certificates("--tls-ca", ca)? {
            roots
                .add(cert)
                .map_err(|e| refused(format!("--tls-ca {}: {e}", ca.display())))?;
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| refused(e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let chain = certificates("--tls-cert", cert)?;
            let private = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| {
                refused(format!(
                    "--tls-key {}: no PEM private key (PKCS#1, PKCS#8 or SEC1): {e}",
                    key.display()
                ))
            })?;
            builder.with_client_auth_cert(chain, private).map_err(|e| {
                refused(format!(
                    "--tls-key {} is not the key of --tls-cert {} ({e})",
                    key.display(),
                    cert.display()
                ))
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Longest wait for the admin port to connect (its TLS handshake too) and for each
/// call's answer: a stopped server's port still accepts connections, and a port
/// that is not the admin API's may never answer.
pub const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The error of a connection or call that went unanswered for [`ANSWER_WAIT`].
pub fn unanswered_in_time(server: &str) -> ConnectError {
    ConnectError::Connect {
        server: server.to_string(),
        message: format!(
            "no answer within {}s (a server stopped or overloaded, or a port that is not its admin API)",
            ANSWER_WAIT.as_secs()
        ),
    }
}

/// A client of the admin API at `args.server`.
pub async fn connect(args: &ConnectArgs) -> Result<AdminClient<Channel>, ConnectError> {
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|error| ConnectError::Read {
            path: p.clone(),
            error,
        })
    };
    let failed = |message: String| ConnectError::Connect {
        server: args.server.clone(),
        message,
    };
    let (url, tls) = args.url()?;
    let mut endpoint = Endpoint::from_shared(url)
        .map_err(|e| failed(e.to_string()))?
        .connect_timeout(std::time::Duration::from_secs(5));
    if tls {
        client_config(args)?;
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &args.tls_ca {
            config = config.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| failed(e.to_string()))?;
    }
    let connected = tokio::time::timeout(ANSWER_WAIT, endpoint.connect())
        .await
        .map_err(|_| unanswered_in_time(&args.server))?;
    let channel = connected.map_err(|e| {
        let mut message = crate::errors::chain(&e);
        if tls && super::probe::not_tls(&e) {
            message.push_str(
                ": it does not answer in TLS (give http://HOST:PORT, or leave out --tls-ca)",
            );
        }
        failed(message)
    })?;
    Ok(AdminClient::new(channel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_host_and_port_with_a_port_in_range() {
        for good in [
            "127.0.0.1:8082",
            "localhost:1",
            "http://sluice-admin.ns.svc:65535",
            "https://[::1]:8082/",
        ] {
            assert_eq!(parse_server(good).as_deref(), Ok(good), "{good}");
        }
        for (bad, says) in [
            (
                "127.0.0.1:99999",
                "port 99999 is out of range: expected 1-65535",
            ),
            ("127.0.0.1:0", "port 0 is out of range"),
            ("http://h:184467440737095516160", "out of range"),
            ("127.0.0.1", "'127.0.0.1' has no port"),
            ("http://h:80x", "'80x' is not a port number"),
            ("http://h:", "'' is not a port number"),
            ("ftp://h:21", "unknown scheme 'ftp://'"),
            ("http://h:80/admin", "is not a port number"),
            ("http://user@h:80", "'user@h' is not a host name or address"),
            ("::1:8082", "is not a host name or address"),
            ("[::1]", "'[::1]' has no port"),
            ("http://[::1]/", "'http://[::1]/' has no port"),
            ("[::1]:99999", "port 99999 is out of range"),
            ("[::g]:8082", "'[::g]' is not a host name or address"),
            (":8082", "'' is not a host name or address"),
        ] {
            let e = parse_server(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn tls_flags_must_be_used() {
        let args = |server: &str, ca: bool, cert: bool| ConnectArgs {
            server: server.to_string(),
            tls_ca: ca.then(|| "ca.pem".into()),
            tls_cert: cert.then(|| "c.pem".into()),
            tls_key: cert.then(|| "k.pem".into()),
        };
        let url = |server: &str, ca: bool, cert: bool| {
            args(server, ca, cert).url().map_err(|e| e.to_string())
        };
        assert_eq!(url("h:1", false, false), Ok(("http://h:1".into(), false)));
        assert_eq!(url("h:1", true, false), Ok(("https://h:1".into(), true)));
        assert_eq!(url("h:1", true, true), Ok(("https://h:1".into(), true)));
        assert_eq!(
            url("https://h:1", true, true),
            Ok(("https://h:1".into(), true))
        );
        assert_eq!(
            url("http://h:1", false, false),
            Ok(("http://h:1".into(), false))
        );
        for (server, ca, cert, says) in [
            ("http://h:1", true, false, "plain http:// takes no --tls-ca"),
            ("http://h:1", false, true, "plain http:// takes no --tls-ca"),
            ("https://h:1", false, false, "https:// needs --tls-ca"),
            ("https://h:1", false, true, "https:// needs --tls-ca"),
            ("h:1", false, true, "--tls-cert and --tls-key are for TLS"),
        ] {
            let e = url(server, ca, cert).unwrap_err();
            assert!(e.contains(says), "{server} {ca} {cert}: {e}");
        }
    }

    #[test]
    fn a_failed_call_names_its_causes() {
        let mut s = tonic::Status::unavailable("transport error");
        let cause = std::io::Error::other("received fatal alert: CertificateRequired");
        s.set_source(std::sync::Arc::new(cause));
        assert_eq!(
            status_text(&s),
            "transport error: received fatal alert: CertificateRequired"
        );
        assert_eq!(status_text(&tonic::Status::not_found("no")), "no");
        let mut s = tonic::Status::unknown("transport error");
        s.set_source(std::sync::Arc::new(std::io::Error::other(
            "transport error: eof",
        )));
        assert_eq!(status_text(&s), "transport error: eof");
    }
}
