//! One reading of Redis's error replies and of I/O errors, for every path (decide
//! calls, pooled calls, cluster nodes, Sentinel): the kind decides whether the shard
//! backs off, so the same reply must get the same kind wherever it was read.
//!
//! An error reply starts with a code word (`-READONLY You can't write ...`). Inside a
//! script, Redis 7 passes a failed command's code on (`-OOM command not allowed ...
//! script: ...`), so the code of a decide call's reply says what the server is
//! going through, not only that the script failed.

use crate::store::{ErrorKind, StoreError};

/// The kind of an error reply, given without its leading `-`.
pub fn reply_kind(text: &str) -> ErrorKind {
    let (code, detail) = text.split_once(' ').unwrap_or((text, ""));
    code_kind(code, detail)
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
        // Redis 7 refuses a long command from a connection that has not
        // authenticated with this instead of NOAUTH, then closes it.
        "ERR" if detail.starts_with("Protocol error: unauthenticated") => ErrorKind::NoAuth,
        "ERR" if detail.starts_with("Protocol error") => ErrorKind::Protocol,
        // Sent just before the server closes a connection it will not serve.
        "ERR" if detail.starts_with("max number of clients reached") => ErrorKind::Connection,
        // ERR from the script itself, WRONGTYPE, NOSCRIPT after EVAL, MOVED from a
        // cluster node given as a standalone shard, ...: the server works, the call
        // does not.
        _ => ErrorKind::Script,
    }
}

/// An error reply to a call (text without the leading `-`).
pub fn reply(text: String) -> StoreError {
    StoreError::failed(reply_kind(&text), text)
}

/// An I/O error while connecting, writing or reading (`what`).
pub fn io(what: &str, e: &std::io::Error) -> StoreError {
    if e.kind() == std::io::ErrorKind::TimedOut {
        return StoreError::Timeout;
    }
    // A TLS alert or certificate refusal surfaces on a read or write too (TLS 1.3
    // servers check the client's certificate after the handshake).
    if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
        return StoreError::failed(ErrorKind::Tls, format!("{what}: TLS: {e}"));
    }
    StoreError::failed(ErrorKind::Connection, format!("{what}: {e}"))
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

    #[test]
    fn every_reply_text_has_its_kind() {
        for &(text, kind) in REPLIES {
            assert_eq!(reply_kind(text), kind, "{text:?}");
            let e = reply(text.to_string());
            assert_eq!(e.kind(), Some(kind), "{text:?}");
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
            assert_eq!(e.kind(), Some(ErrorKind::Connection), "{k:?}");
            assert!(e.message().starts_with("connect: "), "{e}");
        }
        assert_eq!(io("read", &Error::from(Io::TimedOut)), StoreError::Timeout);
        let alert = Error::new(
            Io::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        let e = io("read", &alert);
        assert_eq!(e.kind(), Some(ErrorKind::Tls), "{e}");
        assert!(e.kind().is_some_and(ErrorKind::is_configuration));
    }
}
