//! Why a store could not decide, in one set of kinds that metrics, logs and
//! `/debug/store` share, whichever path met the error.

/// What went wrong with a store call: the Redis client's kinds, one enum for the
/// client that reads the errors and for the metrics, logs and `/debug/store` that
/// name them (the memory store fails on no server). Its names are the `kind` label
/// of `sluice_store_errors_total` and the names in `/debug/store`.
pub use sluice_redis::ErrorKind;

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
    fn kinds_keep_the_names_users_read() {
        // The `kind` label of `sluice_store_errors_total`, the names in
        // `/debug/store` and in docs/failure-modes.md: a rename in the Redis client
        // must not pass unnoticed.
        let names: Vec<_> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "connection",
                "timeout",
                "loading",
                "busy",
                "masterdown",
                "clusterdown",
                "tryagain",
                "readonly",
                "oom",
                "noauth",
                "tls",
                "script",
                "protocol",
            ]
        );
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
