//! Redis in envoyproxy/ratelimit's environment (`REDIS_URL`, `REDIS_TYPE`,
//! `REDIS_TLS*`, `REDIS_AUTH`, ...) as `--redis`, `--redis-cluster` or
//! `--redis-sentinel` URLs, and passwords hidden where URLs are shown.

use super::translate::Translate;
use super::{refuse, Refusal};

impl Translate<'_> {
    pub(super) fn redis(&mut self) -> Result<(), Refusal> {
        let Some(url) = self.get("REDIS_URL").map(String::from) else {
            return Ok(());
        };
        let socket = self.get("REDIS_SOCKET_TYPE").map(str::to_ascii_lowercase);
        let unix = match socket.as_deref() {
            Some("tcp") => false,
            Some("unix") => true,
            Some(other) => return Err(refuse("REDIS_SOCKET_TYPE", other, "expected tcp or unix")),
            // envoyproxy/ratelimit's default is unix; a host:port is meant as TCP.
            None => url.starts_with('/'),
        };
        let tls = self.truthy("REDIS_TLS")?;
        let tls = if tls {
            Some(self.redis_tls_files()?)
        } else {
            for var in [
                "REDIS_TLS_CACERT",
                "REDIS_TLS_CLIENT_CERT",
                "REDIS_TLS_CLIENT_KEY",
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            ] {
                let skip_off =
                    var == "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION" && !self.truthy(var)?;
                if let Some(v) = self.get(var).filter(|_| !skip_off) {
                    self.out.warnings.push(format!(
                        "{var}={v} is ignored: Redis is spoken in plain text unless REDIS_TLS=true"
                    ));
                }
            }
            None
        };
        let tls = tls.as_deref();
        let auth = self.get("REDIS_AUTH").map(String::from);
        if unix {
            let single = self
                .get("REDIS_TYPE")
                .is_none_or(|t| t.eq_ignore_ascii_case("SINGLE"));
            if !single || url.contains(',') {
                return Err(refuse(
                    "REDIS_SOCKET_TYPE",
                    "unix",
                    "a Unix socket is one standalone Redis (REDIS_TYPE=SINGLE, one path)",
                ));
            }
            self.flag("--redis", Some(unix_url(&url, auth.as_deref())));
            if let Some(prefix) = self.get("CACHE_KEY_PREFIX").map(String::from) {
                self.flag("--redis-key-prefix", Some(prefix));
            }
            return Ok(());
        }
        let urls: Vec<String> = url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| redis_url(u, tls, auth.as_deref()))
            .collect();
        let kind = self
            .get("REDIS_TYPE")
            .unwrap_or("SINGLE")
            .to_ascii_uppercase();
        match kind.as_str() {
            "SINGLE" if urls.len() == 1 => self.flag("--redis", Some(urls.join(","))),
            "SINGLE" => {
                return Err(refuse(
                    "REDIS_URL",
                    &url,
                    "REDIS_TYPE=SINGLE takes one address",
                ))
            }
            "CLUSTER" => self.flag("--redis-cluster", Some(urls.join(","))),
            "SENTINEL" => {
                // `master,sentinel,...`: REDIS_AUTH is the master's password,
                // REDIS_SENTINEL_AUTH the sentinels'; REDIS_TLS is for both.
                let mut parts = url.split(',').map(str::trim).filter(|u| !u.is_empty());
                let (Some(master), Some(first)) = (parts.next(), parts.next()) else {
                    return Err(refuse("REDIS_URL", &url, "REDIS_TYPE=SENTINEL takes the master's name, then the sentinels: NAME,HOST:PORT,..."));
                };
                let sentinel_auth = self.get("REDIS_SENTINEL_AUTH").map(String::from);
                let sentinels: Vec<String> = std::iter::once(first)
                    .chain(parts)
                    .map(|u| redis_url(u, tls, sentinel_auth.as_deref()))
                    .collect();
                self.flag("--redis-sentinel", Some(sentinels.join(",")));
                self.flag(
                    "--redis-sentinel-master",
                    Some(redis_url(master, tls, auth.as_deref())),
                );
            }
            _ => {
                return Err(refuse(
                    "REDIS_TYPE",
                    &kind,
                    "expected SINGLE, CLUSTER or SENTINEL",
                ))
            }
        }
        if let Some(prefix) = self.get("CACHE_KEY_PREFIX").map(String::from) {
            self.flag("--redis-key-prefix", Some(prefix));
        }
        Ok(())
    }

    /// `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY` and
    /// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION` as the query of a `rediss://` URL
    /// (empty when none is set).
    fn redis_tls_files(&self) -> Result<String, Refusal> {
        use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
        let mut query = Vec::new();
        if let Some(ca) = self.get("REDIS_TLS_CACERT") {
            query.push(format!(
                "tls_ca={}",
                utf8_percent_encode(ca, NON_ALPHANUMERIC)
            ));
        }
        match (
            self.get("REDIS_TLS_CLIENT_CERT"),
            self.get("REDIS_TLS_CLIENT_KEY"),
        ) {
            (Some(cert), Some(key)) => {
                query.push(format!(
                    "tls_cert={}",
                    utf8_percent_encode(cert, NON_ALPHANUMERIC)
                ));
                query.push(format!(
                    "tls_key={}",
                    utf8_percent_encode(key, NON_ALPHANUMERIC)
                ));
            }
            (None, None) => {}
            (Some(v), None) => {
                return Err(refuse(
                    "REDIS_TLS_CLIENT_CERT",
                    v,
                    "REDIS_TLS_CLIENT_KEY is not set; a client certificate needs its key",
                ))
            }
            (None, Some(v)) => {
                return Err(refuse(
                    "REDIS_TLS_CLIENT_KEY",
                    v,
                    "REDIS_TLS_CLIENT_CERT is not set; a client key needs its certificate",
                ))
            }
        }
        if self.truthy("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")? {
            query.push("tls_skip_hostname=true".into());
        }
        Ok(if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        })
    }
}

/// `text` with the password of every URL in it (`scheme://user:PASSWORD@host`, and
/// the `pass=`/`password=` of a query, as in a `unix://` URL) replaced by `***`.
pub fn hide_passwords(text: &str) -> String {
    let parts: Vec<String> = text.split(',').map(hide_url_password).collect();
    parts.join(",")
}

fn hide_url_password(part: &str) -> String {
    let Some(start) = part.find("://").map(|i| i + 3) else {
        return part.to_string();
    };
    let (head, rest) = part.split_at(start);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k == "pass" || k == "password" => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{head}{authority}{tail}")
}

/// A socket path as a `unix://` URL, `REDIS_AUTH` (`password` or `user:password`)
/// in its query.
fn unix_url(path: &str, auth: Option<&str>) -> String {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let mut url = format!("unix://{}", path.trim());
    if let Some(auth) = auth {
        let (user, pass) = match auth.split_once(':') {
            Some((u, p)) => (Some(u), p),
            None => (None, auth),
        };
        url.push('?');
        if let Some(user) = user {
            url.push_str(&format!(
                "user={}&",
                utf8_percent_encode(user, NON_ALPHANUMERIC)
            ));
        }
        url.push_str(&format!(
            "pass={}",
            utf8_percent_encode(pass, NON_ALPHANUMERIC)
        ));
    }
    url
}

/// `host:port` (or a URL as given) as a Redis URL with `auth` (`password` or
/// `user:password`, as envoyproxy/ratelimit splits it), over TLS when `tls` gives
/// the TLS files' query (maybe empty).
fn redis_url(addr: &str, tls: Option<&str>, auth: Option<&str>) -> String {
    if addr.contains("://") {
        return addr.to_string();
    }
    let scheme = if tls.is_some() { "rediss" } else { "redis" };
    let userinfo = match auth {
        None => String::new(),
        Some(a) => match a.split_once(':') {
            Some((user, pass)) => format!("{}:{}@", encode(user), encode(pass)),
            None => format!(":{}@", encode(a)),
        },
    };
    format!("{scheme}://{userinfo}{addr}{}", tls.unwrap_or_default())
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
