//! `failure_mode: local` in Redis: the replicas' heartbeat set, which tells each
//! replica how many share a limit, and the settlement of local spending, marked by
//! its token so that it is added once.
//!
//! The mark and the charge are two calls: a mark whose charge then fails (the shard
//! fell again between them) loses that amount rather than risk adding it twice, and
//! the shard is checked healthy before the mark to keep that window small.

use std::sync::LazyLock;
use std::time::Duration;

use crate::store::{Hit, StoreError};

use super::scripts::Lua;
use super::{shard, Backend, RedisStore};
use sluice_redis::Value;

static HEARTBEAT: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/local.lua")));

/// Sets the settlement mark unless it is there: `OK`, or nil when it was.
static MARK: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("return redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1])\n"));

/// How long a settlement's mark is kept: longer than any retry of it.
const MARK_TTL: Duration = Duration::from_secs(3600);

impl RedisStore {
    /// The replicas' heartbeat set.
    fn replicas_key(&self) -> String {
        format!("{}replicas", self.inner.prefix)
    }

    /// Beats on every shard (a lost shard must not lose the count), and answers the
    /// largest count any shard holds.
    pub(super) async fn beat(&self, replica: &str, ttl: Duration) -> Result<u32, StoreError> {
        let key = self.replicas_key();
        let targets = match &self.inner.backend {
            Backend::Shards(s) => s.len(),
            Backend::Cluster(_) => 1,
        };
        let calls = (0..targets).map(|target| {
            let key = key.clone();
            async move {
                let mut call = HEARTBEAT.call();
                call.key(key).arg(replica).arg(ttl.as_millis());
                let wait = self.inner.off_path_wait();
                self.inner.invoke_at(target, &call, wait).await
            }
        });
        let mut best: Option<u32> = None;
        let mut error = None;
        for reply in futures::future::join_all(calls).await {
            match reply {
                Ok(v) => {
                    let n = v.as_int().and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
                    best = Some(best.map_or(n, |b| b.max(n)));
                }
                Err(e) => error = Some(e),
            }
        }
        match (best, error) {
            (Some(n), _) => Ok(n),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(0),
        }
    }

    /// [`crate::store::Store::settle`]: marks `token` on the counter's shard, and
    /// charges the counter only when the mark is new.
    pub(super) async fn settle_once(&self, hit: &Hit, token: &str) -> Result<bool, StoreError> {
        let key = shard::redis_key(&self.inner.prefix, hit);
        let target = self.inner.target(hit, &key);
        self.inner.health(target).check()?;
        let mut call = MARK.call();
        call.key(format!("{}settled:{token}", self.inner.prefix))
            .arg(MARK_TTL.as_millis());
        let wait = self.inner.off_path_wait();
        let marked = self.inner.invoke_at(target, &call, wait).await?;
        if matches!(marked, Value::Nil) {
            return Ok(false);
        }
        self.decide_with(std::slice::from_ref(hit), None).await?;
        Ok(true)
    }
}
