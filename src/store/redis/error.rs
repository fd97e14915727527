//! The Redis client's errors as the store's: the same kinds, names and messages, so
//! metrics, logs and `/debug/store` read a Redis failure as they always have.

use crate::store::{ErrorKind, StoreError};

impl From<sluice_redis::ErrorKind> for ErrorKind {
    fn from(kind: sluice_redis::ErrorKind) -> Self {
        use sluice_redis::ErrorKind as Redis;
        match kind {
            Redis::Connection => ErrorKind::Connection,
            Redis::Timeout => ErrorKind::Timeout,
            Redis::Loading => ErrorKind::Loading,
            Redis::Busy => ErrorKind::Busy,
            Redis::MasterDown => ErrorKind::MasterDown,
            Redis::ClusterDown => ErrorKind::ClusterDown,
            Redis::TryAgain => ErrorKind::TryAgain,
            Redis::ReadOnly => ErrorKind::ReadOnly,
            Redis::Oom => ErrorKind::Oom,
            Redis::NoAuth => ErrorKind::NoAuth,
            Redis::Tls => ErrorKind::Tls,
            Redis::Script => ErrorKind::Script,
            Redis::Protocol => ErrorKind::Protocol,
        }
    }
}

impl From<sluice_redis::Error> for StoreError {
    fn from(e: sluice_redis::Error) -> Self {
        match e {
            sluice_redis::Error::Timeout => StoreError::Timeout,
            sluice_redis::Error::Failed { kind, message } => StoreError::Failed {
                kind: kind.into(),
                message,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_kind_keeps_its_name_and_its_outage_reading() {
        let reply = |code: &str| sluice_redis::error::reply(format!("{code} detail"));
        let kinds = [
            reply("LOADING"),
            reply("BUSY"),
            reply("MASTERDOWN"),
            reply("CLUSTERDOWN"),
            reply("TRYAGAIN"),
            reply("READONLY"),
            reply("OOM"),
            reply("NOAUTH"),
            reply("WRONGTYPE"),
            sluice_redis::Error::failed(sluice_redis::ErrorKind::Connection, "x"),
            sluice_redis::Error::failed(sluice_redis::ErrorKind::Tls, "x"),
            sluice_redis::Error::failed(sluice_redis::ErrorKind::Protocol, "x"),
            sluice_redis::Error::Timeout,
        ];
        let mut seen = std::collections::HashSet::new();
        for e in kinds {
            let kind = e.kind();
            let store = StoreError::from(e.clone());
            let converted = store.kind().expect("a tried call has a kind");
            assert_eq!(converted.as_str(), kind.as_str(), "{e}");
            assert_eq!(converted.is_outage(), kind.is_outage(), "{e}");
            assert_eq!(store.message(), e.message(), "{e}");
            seen.insert(converted);
        }
        assert_eq!(seen.len(), ErrorKind::ALL.len(), "every kind converted");
    }

    #[test]
    fn a_failure_reads_as_the_store_error_users_saw() {
        let e = StoreError::from(sluice_redis::error::reply(
            "READONLY You can't write against a read only replica.".into(),
        ));
        assert_eq!(
            e.to_string(),
            "store readonly error: READONLY You can't write against a read only replica."
        );
        assert_eq!(
            StoreError::from(sluice_redis::Error::Timeout),
            StoreError::Timeout
        );
    }
}
