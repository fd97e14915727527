//! The Redis client's errors as the store's: the same kind (the store's kinds are
//! the client's) and message, so metrics, logs and `/debug/store` read a Redis
//! failure as the client read it.

use crate::store::StoreError;

impl From<sluice_redis::Error> for StoreError {
    fn from(e: sluice_redis::Error) -> Self {
        match e {
            sluice_redis::Error::Timeout => StoreError::Timeout,
            sluice_redis::Error::Failed { kind, message } => StoreError::Failed { kind, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_keeps_its_kind_and_message() {
        for code in ["LOADING", "READONLY", "NOAUTH", "WRONGTYPE"] {
            let e = sluice_redis::error::reply(format!("{code} detail"));
            let store = StoreError::from(e.clone());
            assert_eq!(store.kind(), Some(e.kind()), "{e}");
            assert_eq!(store.message(), e.message(), "{e}");
        }
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
