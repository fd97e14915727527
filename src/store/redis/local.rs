//! `failure_mode: local` in Redis: the replicas' heartbeat set, which tells each
//! replica how many share a limit and how many of those have stopped beating (they
//! may be deciding alone), and the settlement of local spending, marked by its token
//! so that it is added once.
//!
//! The mark and the charge are two calls: a mark whose charge then fails (the shard
//! fell again between them) loses that amount rather than risk adding it twice, and
//! the shard is checked healthy before the mark to keep that window small.

use std::sync::LazyLock;
use std::time::Duration;

use crate::store::{Beats, Hit, Replicas, StoreError};

use super::scripts::Lua;
use super::{shard, Backend, RedisStore};
use sluice_redis::Value;

static HEARTBEAT: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/local.lua")));

/// Takes a replica out of the heartbeat set.
static LEAVE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("return redis.call('ZREM', KEYS[1], ARGV[1])\n"));

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
    /// largest count any shard holds, live and missing: a replica cut off from one
    /// shard only is missing there, and its share is reserved on every shard's
    /// counters (the cautious side: those of the shards it reaches admit less).
    pub(super) async fn beat(&self, replica: &str, beats: Beats) -> Result<Replicas, StoreError> {
        let key = self.replicas_key();
        let calls = (0..self.heartbeat_targets()).map(|target| {
            let key = key.clone();
            async move {
                let mut call = HEARTBEAT.call();
                call.key(key)
                    .arg(replica)
                    .arg(beats.live.as_millis())
                    .arg(beats.hold.as_millis());
                let wait = self.inner.off_path_wait();
                self.inner.invoke_at(target, &call, wait).await
            }
        });
        let mut best: Option<(u32, u32)> = None;
        let mut error = None;
        for reply in futures::future::join_all(calls).await {
            match reply {
                Ok(v) => {
                    let (live, missing) = counts(v);
                    let (total, most) = best.unwrap_or((0, 0));
                    best = Some((total.max(live + missing), most.max(missing)));
                }
                Err(e) => error = Some(e),
            }
        }
        match (best, error) {
            (Some((total, missing)), _) => Ok(Replicas {
                live: total - missing,
                missing,
            }),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(Replicas::default()),
        }
    }

    /// Takes `replica` out of the heartbeat set on every shard it can reach.
    pub(super) async fn unbeat(&self, replica: &str) -> Result<(), StoreError> {
        let key = self.replicas_key();
        let calls = (0..self.heartbeat_targets()).map(|target| {
            let key = key.clone();
            async move {
                let mut call = LEAVE.call();
                call.key(key).arg(replica);
                let wait = self.inner.off_path_wait();
                self.inner.invoke_at(target, &call, wait).await
            }
        });
        let mut error = None;
        for reply in futures::future::join_all(calls).await {
            if let Err(e) = reply {
                error = Some(e);
            }
        }
        error.map_or(Ok(()), Err)
    }

    /// Where heartbeats go: every standalone shard, or the cluster once.
    fn heartbeat_targets(&self) -> usize {
        match &self.inner.backend {
            Backend::Shards(s) => s.len(),
            Backend::Cluster(_) => 1,
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

/// A heartbeat's `{live, missing}`; anything else reads as nothing counted.
fn counts(v: Value) -> (u32, u32) {
    let n = |v: &Value| v.as_int().and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    match v {
        Value::Array(items) => (items.first().map_or(0, n), items.get(1).map_or(0, n)),
        _ => (0, 0),
    }
}
