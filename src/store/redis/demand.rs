//! RLQS demand in Redis: one hash per quota bucket with a field per stream (its
//! demand and expiry), written and summed by `demand.lua` in one call, so every
//! replica's streams of a bucket share one limit. The hash expires with its last
//! record; an ended stream's fields are deleted in the background.

use std::time::Duration;

use futures::future::BoxFuture;

use sluice_redis::{Request, Value};

use crate::algorithm::Micros;
use crate::store::demand::{Demand, Share};
use crate::store::{ErrorKind, StoreError};

use super::scripts::Call;
use super::{shard, Backend, RedisStore};

/// Longest wait for a demand call: reports come every few seconds and wait for their
/// answer, not a request.
const DEMAND_TIMEOUT: Duration = Duration::from_millis(500);

impl RedisStore {
    /// The Redis key of a bucket's demand hash.
    fn demand_key(&self, bucket: &str) -> String {
        format!("{}rlqs:{bucket}", self.inner.prefix)
    }

    /// The standalone shard of `key` (0 in a cluster).
    fn demand_shard(&self, key: &str) -> usize {
        match &self.inner.backend {
            Backend::Shards(s) => {
                shard::jump_hash(crate::hash::stable_hash(key.as_bytes()), s.len())
            }
            Backend::Cluster(_) => 0,
        }
    }

    async fn invoke(&self, key: &str, call: Call<'_>) -> Result<Value, StoreError> {
        self.inner
            .invoke_at(self.demand_shard(key), &call, DEMAND_TIMEOUT)
            .await
    }
}

/// The demand script's reply: the bucket's summed demand (as text) and its streams.
fn share(reply: Value) -> Option<(f64, u32)> {
    let items = reply.into_array()?;
    let [total, streams] = items.as_slice() else {
        return None;
    };
    let total = total.as_text()?.parse().ok()?;
    Some((total, u32::try_from(streams.as_int()?).ok()?))
}

impl Demand for RedisStore {
    fn report<'a>(
        &'a self,
        bucket: &'a str,
        stream: &'a str,
        demand: f64,
        ttl: Micros,
    ) -> BoxFuture<'a, Result<Share, StoreError>> {
        Box::pin(async move {
            let key = self.demand_key(bucket);
            let mut call = self.inner.scripts.demand.call();
            call.key(&key)
                .arg(stream)
                .arg(format!("{:.6}", demand.max(0.0)))
                .arg((ttl / 1000).max(1));
            let reply = self.invoke(&key, call).await?;
            let (total, streams) = share(reply).ok_or_else(|| {
                StoreError::failed(ErrorKind::Protocol, "demand script answered no sum")
            })?;
            Ok(Share { total, streams })
        })
    }

    fn forget(&self, buckets: Vec<String>, stream: String) {
        let store = self.clone();
        tokio::spawn(async move {
            for bucket in buckets {
                let key = store.demand_key(&bucket);
                let shard = store.demand_shard(&key);
                let parts: [&[u8]; 3] = [b"HDEL", key.as_bytes(), stream.as_bytes()];
                let r = match &store.inner.backend {
                    Backend::Shards(s) => match s[shard].conn.get() {
                        Ok(pool) => {
                            let mut req = Request::default();
                            req.start(parts.len());
                            for p in parts {
                                req.arg(p);
                            }
                            pool.query(&req).await.map_err(StoreError::from)
                        }
                        Err(_) => return,
                    },
                    Backend::Cluster(c) => c.command(&parts).await,
                };
                let r = match r {
                    Ok(Value::Error(e)) => Err(sluice_redis::error::reply(e).into()),
                    r => r,
                };
                if let Err(e) = r {
                    // The record expires on its own.
                    tracing::debug!(error = %e, "rlqs demand record not deleted");
                    return;
                }
            }
        });
    }
}
