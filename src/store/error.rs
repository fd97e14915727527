//! Why a store could not decide, in one set of kinds that metrics, logs and
//! `/debug/store` share, whichever path (and whichever client) met the error.

/// What went wrong with a store call.
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
    /// The server wants a password sluice did not give, or refused it (`NOAUTH`,
    /// `WRONGPASS`, `NOPERM`).
    NoAuth,
    /// The TLS handshake failed over a certificate: the server's was not trusted,
    /// or the server refused sluice's (or asked for one it was not given); also a
    /// `tls_ca`, `tls_cert` or `tls_key` file that cannot be used. Configuration:
    /// waiting does not mend it.
    Tls,
    /// The script call failed on a working server: a script error, a key of the
    /// wrong type, a command the server does not know. A bug or a misconfiguration,
    /// not an outage.
    Script,
    /// A reply sluice cannot read, or an internal failure.
    Protocol,
}

impl ErrorKind {
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

    /// The `kind` label of `sluice_store_errors_total` and the name in `/debug/store`.
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
    /// stopped for a while (the shard's back-off) than each one tried. A script or
    /// protocol error comes from a server that works: it is answered by the failure
    /// mode and logged loudly, but waiting would not mend it.
    pub fn is_outage(self) -> bool {
        !matches!(self, ErrorKind::Script | ErrorKind::Protocol)
    }

    /// Whether a PING meets the outage as a call does (no connection, no answer in
    /// time, a TLS handshake refused, a server loading or busy with a script), so a
    /// PING answered says it is over. A replica refusing writes, a server out of
    /// memory, an ACL refusing a script's command: a PING is answered through them
    /// (the probe's write sees a replica, a full server and a password refused:
    /// `Asked::sees` in the Redis store).
    pub fn fails_ping(self) -> bool {
        matches!(
            self,
            ErrorKind::Connection
                | ErrorKind::Timeout
                | ErrorKind::Tls
                | ErrorKind::Loading
                | ErrorKind::Busy
        )
    }

    /// Whether the error says sluice's settings do not fit the server (a password,
    /// a certificate): Redis can never be reached until someone changes them, so
    /// every failed try is logged as an error.
    pub fn is_configuration(self) -> bool {
        matches!(self, ErrorKind::NoAuth | ErrorKind::Tls)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a store could not decide.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// No answer in time (a variant of its own, so a timeout allocates nothing).
    #[error("store timed out")]
    Timeout,
    /// The shard is backing off after repeated failures: not tried at all.
    #[error("store backing off after repeated failures")]
    BackingOff,
    /// No room to keep the key's counter (`--max-keys`): every counter that could
    /// make room is in use. Not a failing store: the key alone is answered by its
    /// failure mode, and the store logs when it starts and stops refusing.
    #[error("store full (--max-keys) of counters in use: the key is not kept")]
    Full,
    #[error("store {kind} error: {message}")]
    Failed { kind: ErrorKind, message: String },
}

impl StoreError {
    pub fn failed(kind: ErrorKind, message: impl Into<String>) -> Self {
        StoreError::Failed {
            kind,
            message: message.into(),
        }
    }

    /// The kind of a store's error; `None` for a call not tried (back-off, a key
    /// not kept).
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            StoreError::Timeout => Some(ErrorKind::Timeout),
            StoreError::BackingOff | StoreError::Full => None,
            StoreError::Failed { kind, .. } => Some(*kind),
        }
    }

    /// The error without its kind, as `/debug/store` shows it.
    pub fn message(&self) -> &str {
        match self {
            StoreError::Timeout => "timed out",
            StoreError::BackingOff => "backing off",
            StoreError::Full => "full (--max-keys)",
            StoreError::Failed { message, .. } => message,
        }
    }

    /// Whether trying again later may succeed (as opposed to a bug or bad reply).
    pub fn is_transient(&self) -> bool {
        self.kind().is_none_or(ErrorKind::is_outage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn errors_name_their_kind() {
        let e = StoreError::failed(ErrorKind::ReadOnly, "READONLY You can't write");
        assert_eq!(
            e.to_string(),
            "store readonly error: READONLY You can't write"
        );
        assert_eq!(e.kind(), Some(ErrorKind::ReadOnly));
        assert!(e.is_transient());
        assert!(!StoreError::failed(ErrorKind::Script, "x").is_transient());
        assert_eq!(StoreError::Timeout.kind(), Some(ErrorKind::Timeout));
        assert_eq!(StoreError::BackingOff.kind(), None);
        assert!(StoreError::BackingOff.is_transient());
    }
}
