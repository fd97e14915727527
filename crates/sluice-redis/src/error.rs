//! What went wrong with a call to Redis, in one reading of Redis's error replies and
//! of I/O errors for every path (plain calls, pooled calls, cluster nodes, Sentinel):
//! a caller backs off by the kind, so the same reply must get the same kind wherever
//! it was read.
//!
//! An error reply starts with a code word (`-READONLY You can't write ...`). Inside a
//! script, Redis 7 passes a failed command's code on (`-OOM command not allowed ...
//! script: ...`), so the code of a script call's reply says what the server is
//! going through, not only that the script failed.

/// What went wrong with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Could not connect, or the connection broke.
    Connection,
    /// No answer within the call's timeout.
    Timeout,
    /// The server is loading its dataset (`LOADING`).
    Loading,
    /// The server is running a script past its busy threshold (`BUSY`).
    Busy,
    /// A replica lost its master and serves no stale data (`MASTERDOWN`).
    MasterDown,
    /// The cluster cannot serve the slot (`CLUSTERDOWN`).
    ClusterDown,
    /// The slot is moving between cluster nodes (`TRYAGAIN`).
    TryAgain,
    /// The server is a replica: writes refused (`READONLY`, typically after a
    /// failover when the URL still names the old master).
    ReadOnly,
    /// The server is at `maxmemory` and evicts nothing (`OOM`).
    Oom,
    /// The server wants a password it was not given, refused it, has none for the one
    /// sent, or its ACL refuses a command (`NOAUTH`, `WRONGPASS`, `NOPERM`, or `ERR`
    /// with those reasons).
    NoAuth,
    /// The TLS handshake failed over a certificate, or a certificate or key file
    /// cannot be used.
    Tls,
    /// The call failed on a working server: a script error, a key of the wrong type,
    /// a command the server does not know.
    Script,
    /// A reply that cannot be read, or an internal failure.
    Protocol,
}

impl ErrorKind {
    /// Every kind, for a caller that counts each from zero.
    pub const ALL: [ErrorKind; 13] = [
        ErrorKind::Connection,
        ErrorKind::Timeout,
        ErrorKind::Loading,
        ErrorKind::Busy,
        ErrorKind::MasterDown,
        ErrorKind::ClusterDown,
        ErrorKind::TryAgain,
        ErrorKind::ReadOnly,
        ErrorKind::Oom,
        ErrorKind::NoAuth,
        ErrorKind::Tls,
        ErrorKind::Script,
        ErrorKind::Protocol,
    ];

    /// The kind's name: `connection`, `timeout`, `readonly`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connection => "connection",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Loading => "loading",
            ErrorKind::Busy => "busy",
            ErrorKind::MasterDown => "masterdown",
            ErrorKind::ClusterDown => "clusterdown",
            ErrorKind::TryAgain => "tryagain",
            ErrorKind::ReadOnly => "readonly",
            ErrorKind::Oom => "oom",
            ErrorKind::NoAuth => "noauth",
            ErrorKind::Tls => "tls",
            ErrorKind::Script => "script",
            ErrorKind::Protocol => "protocol",
        }
    }

    /// Whether the server cannot serve for now, so that calls to it are better
    /// stopped for a while than each one tried. A script or protocol error comes
    /// from a server that works and refuses this call: waiting would not mend it.
    pub fn is_outage(self) -> bool {
        !matches!(self, ErrorKind::Script | ErrorKind::Protocol)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a call to Redis failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// No answer in time (a variant of its own, so a timeout allocates nothing).
    #[error("redis timed out")]
    Timeout,
    #[error("redis {kind} error: {message}")]
    Failed { kind: ErrorKind, message: String },
}

impl Error {
    pub fn failed(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error::Failed {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Timeout => ErrorKind::Timeout,
            Error::Failed { kind, .. } => *kind,
        }
    }

    /// The error without its kind.
    pub fn message(&self) -> &str {
        match self {
            Error::Timeout => "timed out",
            Error::Failed { message, .. } => message,
        }
    }
}

/// The kind of an error reply, given without its leading `-`.
pub fn reply_kind(text: &str) -> ErrorKind {
    let (code, detail) = text.split_once(' ').unwrap_or((text, ""));
    code_kind(code, detail)
}

/// `ERR` replies that mean what NOAUTH and NOPERM mean: Redis 7's answer to a long
/// command from a connection that has not authenticated (before it closes it), a
/// password sent to a server that has none (Redis 6 and later, then before 6), and
/// an ACL refusing a command a script runs.
const NOAUTH_ERR: [&str; 4] = [
    "Protocol error: unauthenticated",
    "AUTH <password> called without any password",
    "Client sent AUTH, but no password is set",
    "The user executing the script can't run this command",
];

/// How the `ERR` replies begin that Redis sends just before it closes the
/// connection: a protocol error (a command too long for a connection that has not
/// authenticated, say), and a server at its client limit.
const PROTOCOL_ERROR: &str = "Protocol error";
const MAX_CLIENTS: &str = "max number of clients reached";

/// Whether Redis closes the connection after sending error reply `text` (without
/// its leading `-`, and perhaps with more bytes after it).
pub(crate) fn closes_connection(text: &[u8]) -> bool {
    text.strip_prefix(b"ERR ").is_some_and(|detail| {
        detail.starts_with(PROTOCOL_ERROR.as_bytes()) || detail.starts_with(MAX_CLIENTS.as_bytes())
    })
}

/// The kind of an error reply's code word and the rest of its text.
fn code_kind(code: &str, detail: &str) -> ErrorKind {
    match code {
        "LOADING" => ErrorKind::Loading,
        "BUSY" => ErrorKind::Busy,
        "MASTERDOWN" => ErrorKind::MasterDown,
        "CLUSTERDOWN" => ErrorKind::ClusterDown,
        "TRYAGAIN" => ErrorKind::TryAgain,
        "READONLY" => ErrorKind::ReadOnly,
        "OOM" => ErrorKind::Oom,
        "NOAUTH" | "WRONGPASS" | "NOPERM" => ErrorKind::NoAuth,
        "ERR" if NOAUTH_ERR.iter().any(|reason| detail.starts_with(reason)) => ErrorKind::NoAuth,
        "ERR" if detail.starts_with(PROTOCOL_ERROR) => ErrorKind::Protocol,
        // Sent just before the server closes a connection it will not serve.
        "ERR" if detail.starts_with(MAX_CLIENTS) => ErrorKind::Connection,
        // ERR from the script itself, WRONGTYPE, NOSCRIPT after EVAL, MOVED from a
        // cluster node given as a standalone shard, ...: the server works, the call
        // does not.
        _ => ErrorKind::Script,
    }
}

/// An error reply to a call (text without the leading `-`).
pub fn reply(text: String) -> Error {
    Error::failed(reply_kind(&text), text)
}

/// An I/O error while connecting, writing or reading (`what`).
pub fn io(what: &str, e: &std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::TimedOut {
        return Error::Timeout;
    }
    // A TLS alert or certificate refusal surfaces on a read or write too (TLS 1.3
    // servers check the client's certificate after the handshake).
    if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
        return Error::failed(ErrorKind::Tls, format!("{what}: TLS: {e}"));
    }
    Error::failed(ErrorKind::Connection, format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replies as Redis 7 sends them, to plain commands and from inside a script.
    const REPLIES: &[(&str, ErrorKind)] = &[
        ("LOADING Redis is loading the dataset in memory", ErrorKind::Loading),
        (
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            ErrorKind::Busy,
        ),
        (
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            ErrorKind::MasterDown,
        ),
        ("CLUSTERDOWN The cluster is down", ErrorKind::ClusterDown),
        ("CLUSTERDOWN Hash slot not served", ErrorKind::ClusterDown),
        (
            "TRYAGAIN Multiple keys request during rehashing of slot",
            ErrorKind::TryAgain,
        ),
        (
            "READONLY You can't write against a read only replica. script: a303555b, on @user_script:1.",
            ErrorKind::ReadOnly,
        ),
        ("READONLY You can't write against a read only replica.", ErrorKind::ReadOnly),
        (
            "OOM command not allowed when used memory > 'maxmemory'. script: a303555b, on @user_script:1.",
            ErrorKind::Oom,
        ),
        ("NOAUTH Authentication required.", ErrorKind::NoAuth),
        (
            "WRONGPASS invalid username-password pair or user is disabled.",
            ErrorKind::NoAuth,
        ),
        (
            "NOPERM User sluice has no permissions to run the 'evalsha' command",
            ErrorKind::NoAuth,
        ),
        (
            "ERR Protocol error: unauthenticated multibulk length",
            ErrorKind::NoAuth,
        ),
        ("ERR Protocol error: unauthenticated bulk length", ErrorKind::NoAuth),
        (
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            ErrorKind::NoAuth,
        ),
        ("ERR Client sent AUTH, but no password is set", ErrorKind::NoAuth),
        (
            "ERR The user executing the script can't run this command or subcommand script: 104ae65d, on @user_script:1.",
            ErrorKind::NoAuth,
        ),
        ("ERR Protocol error: invalid bulk length", ErrorKind::Protocol),
        ("ERR max number of clients reached", ErrorKind::Connection),
        (
            "ERR user_script:12: Script attempted to access nonexistent global variable 'x' script: 4b0c, on @user_script:12.",
            ErrorKind::Script,
        ),
        (
            "ERR Error running script (call to f_4b0c): @user_script:12: attempt to compare nil with number",
            ErrorKind::Script,
        ),
        (
            "WRONGTYPE Operation against a key holding the wrong kind of value script: 4b0c, on @user_script:40.",
            ErrorKind::Script,
        ),
        ("NOSCRIPT No matching script. Please use EVAL.", ErrorKind::Script),
        ("ERR unknown command 'EVALSHA', with args beginning with: ", ErrorKind::Script),
        ("MOVED 3999 127.0.0.1:6381", ErrorKind::Script),
        // Codes are whole words: these are not BUSY or READONLY.
        ("BUSYKEY Target key name already exists.", ErrorKind::Script),
        ("READONLYX made up", ErrorKind::Script),
        ("OOM", ErrorKind::Oom),
        ("", ErrorKind::Script),
    ];

    /// Only the replies Redis closes the connection after mark it: not an error of
    /// the call, nor one that merely mentions the words.
    #[test]
    fn only_replies_redis_closes_after_close_the_connection() {
        for closes in [
            "ERR Protocol error: unauthenticated multibulk length\r\n",
            "ERR Protocol error: invalid bulk length\r\n",
            "ERR max number of clients reached\r\n",
        ] {
            assert!(closes_connection(closes.as_bytes()), "{closes}");
        }
        for stays in [
            "NOAUTH Authentication required.\r\n",
            "ERR user_script:1: Protocol error in the script\r\n",
            "WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            "ERR",
        ] {
            assert!(!closes_connection(stays.as_bytes()), "{stays}");
        }
    }

    #[test]
    fn kinds_have_distinct_names_and_only_script_and_protocol_are_not_outages() {
        let names: std::collections::HashSet<_> =
            ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), ErrorKind::ALL.len());
        let not_outages: Vec<_> = ErrorKind::ALL
            .into_iter()
            .filter(|k| !k.is_outage())
            .collect();
        assert_eq!(not_outages, [ErrorKind::Script, ErrorKind::Protocol]);
    }

    #[test]
    fn every_reply_text_has_its_kind() {
        for &(text, kind) in REPLIES {
            assert_eq!(reply_kind(text), kind, "{text:?}");
            let e = reply(text.to_string());
            assert_eq!(e.kind(), kind, "{text:?}");
            assert_eq!(e.message(), text);
        }
    }

    #[test]
    fn io_errors_are_connection_errors_or_timeouts() {
        use std::io::{Error, ErrorKind as Io};
        for k in [
            Io::ConnectionRefused,
            Io::ConnectionReset,
            Io::BrokenPipe,
            Io::UnexpectedEof,
        ] {
            let e = io("connect", &Error::from(k));
            assert_eq!(e.kind(), ErrorKind::Connection, "{k:?}");
            assert!(e.message().starts_with("connect: "), "{e}");
        }
        assert_eq!(
            io("read", &Error::from(Io::TimedOut)),
            super::Error::Timeout
        );
        let alert = Error::new(
            Io::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        let e = io("read", &alert);
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    }
}
