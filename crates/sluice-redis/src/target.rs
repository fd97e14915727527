//! Where a shard is and how to speak to it, from its URL.
//!
//! The forms redis-rs and envoyproxy/ratelimit users already write:
//! `redis://[[user]:password@]host[:port][/db]`, `rediss://` for TLS (with the
//! fragment `#insecure` to skip verifying the server's certificate, `?tls_ca=PATH`
//! for the authorities (or pinned certificate) of this server,
//! `?tls_cert=PATH&tls_key=PATH` for a client certificate, and
//! `?tls_skip_hostname=true` to accept a certificate for another name), and
//! `unix:///path/redis.sock[?db=N][&user=U][&pass=P]` (or `redis+unix://`).
//! Sluice speaks RESP2, so `?protocol=resp3` is refused rather than ignored.

use std::path::PathBuf;
use std::time::Duration;

use url::Url;

/// The default Redis port.
const PORT: u16 = 6379;

/// How a connection reaches its server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// TLS over a TCP address.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tls {
    /// Accept any certificate (`#insecure`): encryption without authentication.
    pub insecure: bool,
    /// `?tls_ca=PATH`: PEM certificates trusted for this server instead of the
    /// system's authorities. A certificate in it that the server presents as its own
    /// is accepted as pinned, even self-signed and marked CA.
    pub ca: Option<PathBuf>,
    /// `?tls_cert=PATH&tls_key=PATH`: the client certificate (PEM chain) and its key
    /// presented to the server.
    pub client: Option<(PathBuf, PathBuf)>,
    /// `?tls_skip_hostname=true`: the certificate need not name the server; it
    /// must still chain to (or be) a trusted one (envoyproxy/ratelimit's
    /// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`).
    pub skip_hostname: bool,
}

/// One server's address, TLS, credentials and database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub addr: Addr,
    pub tls: Option<Tls>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
    /// Longest wait to connect (and authenticate).
    pub timeout: Duration,
}

/// `text` percent-decoded; `what` names it in the error when the bytes are not
/// UTF-8 (sent with their bad bytes replaced, a password would be refused as
/// wrong, with nothing to say why).
fn decoded(text: &str, what: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded"))
}

impl Target {
    /// Reads a URL; the error says what is wrong with it.
    pub fn parse(text: &str, timeout: Duration) -> Result<Target, String> {
        // `host:6379` parses as a URL of scheme `host`; `host` or `redis//host` as a
        // relative one: none is what was meant.
        const WRITE: &str =
            "not a URL: write redis://HOST:PORT (rediss:// for TLS, unix:///PATH for a socket)";
        let url = match Url::parse(text) {
            Ok(url) if url.cannot_be_a_base() => return Err(WRITE.into()),
            Ok(url) => url,
            Err(url::ParseError::RelativeUrlWithoutBase) => return Err(WRITE.into()),
            Err(e) => return Err(e.to_string()),
        };
        let mut target = Target {
            addr: Addr::Unix(PathBuf::new()),
            tls: None,
            username: None,
            password: None,
            db: 0,
            timeout,
        };
        let mut db: Option<&str> = None;
        let query: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let (mut ca, mut cert, mut key) = (None, None, None);
        let mut skip_hostname = None;
        for (k, v) in &query {
            match k.as_str() {
                "tls_ca" => ca = Some(PathBuf::from(v)),
                "tls_cert" => cert = Some(PathBuf::from(v)),
                "tls_key" => key = Some(PathBuf::from(v)),
                "tls_skip_hostname" => match v.as_str() {
                    "true" | "1" => skip_hostname = Some(true),
                    "false" | "0" => skip_hostname = Some(false),
                    _ => return Err(format!("tls_skip_hostname={v}: expected true or false")),
                },
                "protocol" if v == "resp2" || v == "2" => {}
                "protocol" => return Err(format!("protocol {v}: sluice speaks RESP2")),
                "db" => db = Some(v),
                "user" => target.username = Some(v.clone()),
                "pass" | "password" => target.password = Some(v.clone()),
                _ => return Err(format!("unknown setting {k:?}")),
            }
        }
        match url.scheme() {
            "redis" | "rediss" | "valkey" | "valkeys" => {
                let host = match url.host() {
                    Some(url::Host::Ipv6(ip)) => ip.to_string(),
                    Some(h) => h.to_string(),
                    None => return Err("no host".into()),
                };
                if host.is_empty() {
                    return Err("no host".into());
                }
                target.addr = Addr::Tcp {
                    host,
                    port: url.port().unwrap_or(PORT),
                };
                if matches!(url.scheme(), "rediss" | "valkeys") {
                    let client = match (cert.take(), key.take()) {
                        (Some(c), Some(k)) => Some((c, k)),
                        (None, None) => None,
                        _ => return Err("tls_cert and tls_key go together".into()),
                    };
                    target.tls = Some(Tls {
                        insecure: url.fragment() == Some("insecure"),
                        ca: ca.take(),
                        client,
                        skip_hostname: skip_hostname.take().unwrap_or(false),
                    });
                } else if url.fragment().is_some() {
                    return Err("a fragment (#insecure) is for rediss:// only".into());
                }
                if !url.username().is_empty() {
                    target.username = Some(decoded(url.username(), "user name")?);
                }
                if let Some(p) = url.password() {
                    target.password = Some(decoded(p, "password")?);
                }
                let path = url.path().trim_matches('/');
                if !path.is_empty() {
                    db = Some(path);
                }
            }
            "unix" | "redis+unix" | "valkey+unix" => {
                if url.path().is_empty() {
                    return Err("no socket path".into());
                }
                target.addr = Addr::Unix(PathBuf::from(decoded(url.path(), "socket path")?));
            }
            other => {
                return Err(format!(
                    "unknown scheme {other}://: use redis://, rediss:// (TLS) or unix://"
                ))
            }
        }
        if ca.is_some() || cert.is_some() || key.is_some() || skip_hostname.is_some() {
            return Err(
                "tls_ca, tls_cert, tls_key and tls_skip_hostname are for rediss:// only".into(),
            );
        }
        if let Some(db) = db {
            target.db = db
                .parse()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| format!("database {db:?} is not a number"))?;
        }
        Ok(target)
    }

    /// This target's settings at another TCP address (a Sentinel's master, a
    /// cluster node): TLS, credentials and database stay.
    pub fn at(&self, host: &str, port: u16) -> Target {
        Target {
            addr: Addr::Tcp {
                host: host.to_string(),
                port,
            },
            ..self.clone()
        }
    }

    /// `host:port` (or the socket's path), for logs and metric labels.
    pub fn name(&self) -> String {
        match &self.addr {
            Addr::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
            Addr::Tcp { host, port } => format!("{host}:{port}"),
            Addr::Unix(path) => path.display().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_or_password_not_utf8_once_decoded_is_refused() {
        let e = parse("redis://:ab%FFcd@127.0.0.1:6379").unwrap_err();
        assert_eq!(e, "the password is not UTF-8 once percent-decoded");
        let e = parse("redis://us%C3er:pw@127.0.0.1:6379").unwrap_err();
        assert_eq!(e, "the user name is not UTF-8 once percent-decoded");
        let t = parse("redis://:%C3%A9t%C3%A9@127.0.0.1:6379").unwrap();
        assert_eq!(t.password.as_deref(), Some("été"));
    }

    fn parse(url: &str) -> Result<Target, String> {
        Target::parse(url, Duration::from_secs(1))
    }

    #[test]
    fn tcp_urls_carry_credentials_and_database() {
        let t = parse("redis://user:p%40ss@10.0.0.1:6380/2").unwrap();
        assert_eq!(
            t.addr,
            Addr::Tcp {
                host: "10.0.0.1".into(),
                port: 6380
            }
        );
        assert_eq!(t.username.as_deref(), Some("user"));
        assert_eq!(t.password.as_deref(), Some("p@ss"));
        assert_eq!((t.db, t.tls), (2, None));
        let t = parse("redis://:secret@host").unwrap();
        assert_eq!(
            (t.username.as_deref(), t.password.as_deref()),
            (None, Some("secret"))
        );
        assert_eq!(t.name(), "host:6379");
        let t = parse("redis://[::1]:7000").unwrap();
        assert_eq!(t.name(), "[::1]:7000");
    }

    #[test]
    fn tls_and_sockets() {
        let t = parse("rediss://cache.internal:6380").unwrap();
        assert_eq!(t.tls, Some(Tls::default()));
        let t = parse("rediss://cache.internal:6380/#insecure").unwrap();
        assert_eq!(
            t.tls,
            Some(Tls {
                insecure: true,
                ..Tls::default()
            })
        );
        let t = parse("rediss://h:1?tls_ca=/c/ca.pem&tls_cert=/c/me.pem&tls_key=/c/me%20key.pem")
            .unwrap();
        assert_eq!(
            t.tls,
            Some(Tls {
                insecure: false,
                ca: Some("/c/ca.pem".into()),
                client: Some(("/c/me.pem".into(), "/c/me key.pem".into())),
                skip_hostname: false,
            })
        );
        let t = parse("rediss://10.0.0.5:6380?tls_ca=/c/ca.pem&tls_skip_hostname=true").unwrap();
        assert_eq!(
            t.tls,
            Some(Tls {
                ca: Some("/c/ca.pem".into()),
                skip_hostname: true,
                ..Tls::default()
            })
        );
        let t = parse("unix:///run/redis.sock?db=3&pass=pw").unwrap();
        assert_eq!(t.addr, Addr::Unix("/run/redis.sock".into()));
        assert_eq!((t.db, t.password.as_deref()), (3, Some("pw")));
        assert_eq!(t.name(), "/run/redis.sock");
        let t = parse("redis://h:1?protocol=resp2").unwrap();
        assert_eq!(t.name(), "h:1");
    }

    #[test]
    fn bad_urls_say_why() {
        for (url, why) in [
            ("http://h:1", "scheme"),
            ("redis://h:1/x", "database"),
            ("redis://h:1/-1", "database"),
            ("redis://h:1?protocol=resp3", "RESP2"),
            ("redis://h:1?color=red", "unknown setting"),
            ("redis://h:1#insecure", "rediss"),
            ("redis://h:1?tls_ca=/ca.pem", "rediss:// only"),
            ("unix:///s.sock?tls_cert=/c&tls_key=/k", "rediss:// only"),
            ("rediss://h:1?tls_cert=/c", "go together"),
            ("redis://h:1?tls_skip_hostname=true", "rediss:// only"),
            (
                "rediss://h:1?tls_skip_hostname=yes",
                "expected true or false",
            ),
            ("redis://h:99999", "port"),
            ("not a url", "not a URL: write redis://HOST:PORT"),
            ("localhost:6379", "not a URL"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn a_target_moves_with_its_settings() {
        let t = parse("rediss://u:pw@mymaster/4")
            .unwrap()
            .at("10.1.1.1", 7001);
        assert_eq!(t.name(), "10.1.1.1:7001");
        assert_eq!((t.db, t.password.as_deref()), (4, Some("pw")));
        assert!(t.tls.is_some());
    }
}
