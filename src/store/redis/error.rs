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

/// An error reply to a call on a standalone shard or Sentinel master. `MOVED` or
/// `ASK` there comes from a Redis Cluster node given as a standalone shard, which
/// serves only its own slots' keys: the message says so, and what to give instead.
pub fn shard_reply(text: String) -> StoreError {
    let text = if is_redirect(&text) {
        format!(
            "{text}: this server is a Redis Cluster node, which serves only its own \
             slots' keys; give the cluster's nodes with --redis-cluster, not --redis"
        )
    } else {
        text
    };
    sluice_redis::error::reply(text).into()
}

/// `MOVED` or `ASK`: the key's slot is (being) served by another cluster node.
pub fn is_redirect(text: &str) -> bool {
    text.starts_with("MOVED ") || text.starts_with("ASK ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_on_a_standalone_shard_says_to_give_the_cluster() {
        let e = shard_reply("MOVED 3999 127.0.0.1:6381".into());
        assert_eq!(e.kind(), Some(sluice_redis::ErrorKind::Script));
        assert!(
            e.message().starts_with("MOVED 3999 127.0.0.1:6381: "),
            "{e}"
        );
        assert!(e.message().contains("--redis-cluster"), "{e}");
        let e = shard_reply("ASK 1 127.0.0.1:6381".into());
        assert!(e.message().contains("--redis-cluster"), "{e}");
        let e = shard_reply("READONLY You can't write against a read only replica.".into());
        assert_eq!(e.kind(), Some(sluice_redis::ErrorKind::ReadOnly));
        assert_eq!(
            e.message(),
            "READONLY You can't write against a read only replica."
        );
    }

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
