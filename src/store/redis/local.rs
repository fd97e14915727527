//! `failure_mode: local` in Redis: the replicas' heartbeat set, which tells each
//! replica how many share a limit, how many of those have stopped beating (they
//! may be deciding alone) and where the live ones are reached, a probe of one shard
//! for a peer cut off from it, and the settlement of local spending, marked by its
//! token so that it is added once.
//!
//! An amount may give hits back before it charges (refunds made while deciding
//! locally): both go in one decide call after the mark, the refund first.
//!
//! The mark and the charge are two calls: a mark whose charge then fails (the shard
//! fell again between them) loses that amount rather than risk adding it twice, and
//! the shard is checked healthy before the mark to keep that window small. On a
//! standalone shard each call carries many amounts (marks, then the charges of
//! those newly marked); a cluster's marks live on other slots than their counters,
//! so there they go one amount at a time.

use std::sync::LazyLock;
use std::time::Duration;

use crate::store::{Beats, Heard, Hit, Replicas, Settlement, ShardBeats, StoreError};

use super::scripts::Lua;
use super::{Backend, RedisStore};
use sluice_redis::Value;

static HEARTBEAT: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/local.lua")));

/// Takes a replica out of the heartbeat set.
static LEAVE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("return redis.call('ZREM', KEYS[1], ARGV[1])\n"));

/// A shard's clock, in milliseconds (the heartbeat set's scores), read through a
/// script so that a cluster routes it by the set's key.
static TIME: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new("local t = redis.call('TIME')\nreturn tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n")
});

/// Sets the settlement mark unless it is there: `OK`, or nil when it was.
static MARK: LazyLock<Lua> =
    LazyLock::new(|| Lua::new("return redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1])\n"));

/// Sets each settlement mark unless it is there: 1 for each set, 0 for each that was.
static MARKS: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        "local set = {}\nfor i, key in ipairs(KEYS) do\n  set[i] = redis.call('SET', key, '1', 'NX', 'PX', ARGV[1]) and 1 or 0\nend\nreturn set\n",
    )
});

/// Settlements marked in one call, then charged in one.
const MARK_BATCH: usize = 256;

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
    /// Each shard that answered also lists its live members.
    pub(super) async fn beat(&self, member: &str, beats: Beats) -> Result<Heard, StoreError> {
        let key = self.replicas_key();
        let calls = (0..self.heartbeat_targets()).map(|target| {
            let key = key.clone();
            async move {
                let mut call = HEARTBEAT.call();
                call.key(key)
                    .arg(member)
                    .arg(beats.live.as_millis())
                    .arg(beats.hold.as_millis());
                let wait = self.inner.off_path_wait();
                let reply = self.inner.invoke_at(target, &call, wait).await;
                // A heartbeat writes: a shard that takes it is up, though no
                // decision has reached it since it came back.
                if let (Ok(_), super::Backend::Shards(s)) = (&reply, &self.inner.backend) {
                    s[target].health.success();
                }
                reply
            }
        });
        let mut best: Option<(u32, u32)> = None;
        let mut error = None;
        let mut shards = Vec::new();
        for (shard, reply) in futures::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            match reply {
                Ok(v) => {
                    let (live, missing, members) = counts(v);
                    let (total, most) = best.unwrap_or((0, 0));
                    best = Some((total.max(live.saturating_add(missing)), most.max(missing)));
                    shards.push(ShardBeats {
                        shard,
                        live: members,
                    });
                }
                Err(e) => error = Some(e),
            }
        }
        match (best, error) {
            (Some((total, missing)), _) => Ok(Heard {
                replicas: Replicas {
                    live: total.saturating_sub(missing),
                    missing,
                },
                shards,
            }),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(Heard::default()),
        }
    }

    /// [`crate::store::Store::reach`]: the shard's clock, within the store timeout.
    pub(super) async fn probe(&self, shard: usize) -> Result<u64, StoreError> {
        if shard >= self.heartbeat_targets() {
            return Err(StoreError::failed(
                crate::store::ErrorKind::Protocol,
                format!("no shard {shard}"),
            ));
        }
        let mut call = TIME.call();
        call.key(self.replicas_key());
        let v = self
            .inner
            .invoke_at(shard, &call, self.inner.call_timeout)
            .await?;
        v.as_int()
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| {
                StoreError::failed(crate::store::ErrorKind::Protocol, "TIME: not a number")
            })
    }

    /// Takes `member` out of the heartbeat set on every shard it can reach.
    pub(super) async fn unbeat(&self, member: &str) -> Result<(), StoreError> {
        let key = self.replicas_key();
        let calls = (0..self.heartbeat_targets()).map(|target| {
            let key = key.clone();
            async move {
                let mut call = LEAVE.call();
                call.key(key).arg(member);
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
    pub(super) fn heartbeat_targets(&self) -> usize {
        match &self.inner.backend {
            Backend::Shards(s) => s.len(),
            Backend::Cluster(_) => 1,
        }
    }

    /// [`crate::store::Store::settle`]: per standalone shard, a call marks up to
    /// [`MARK_BATCH`] tokens and one charges the counters whose marks are new; the
    /// shards at once. A shard's failure answers the rest of its amounts.
    pub(super) async fn settle_all(&self, batch: &[Settlement]) -> Vec<Result<bool, StoreError>> {
        let mut out: Vec<Result<bool, StoreError>> = vec![Ok(false); batch.len()];
        let Backend::Shards(shards) = &self.inner.backend else {
            for (s, result) in batch.iter().zip(out.iter_mut()) {
                *result = self.settle_once(s).await;
            }
            return out;
        };
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); shards.len()];
        for (i, s) in batch.iter().enumerate() {
            by_shard[self.inner.target(&s.hit)].push(i);
        }
        let calls = by_shard
            .iter()
            .enumerate()
            .filter(|(_, members)| !members.is_empty())
            .map(|(target, members)| async move {
                let mut results = Vec::with_capacity(members.len());
                let mut failed: Option<StoreError> = None;
                for chunk in members.chunks(MARK_BATCH) {
                    let answer = match &failed {
                        Some(e) => Err(e.clone()),
                        None => self.settle_on(target, batch, chunk).await,
                    };
                    match answer {
                        Ok(r) => results.extend(r),
                        Err(e) => {
                            results.extend(chunk.iter().map(|_| Err(e.clone())));
                            failed = Some(e);
                        }
                    }
                }
                (members, results)
            });
        for (members, results) in futures::future::join_all(calls).await {
            for (&i, result) in members.iter().zip(results) {
                out[i] = result;
            }
        }
        out
    }

    /// The amounts `chunk` names of `batch`, all on standalone shard `target`:
    /// marked in one call, and those newly marked charged in another.
    async fn settle_on(
        &self,
        target: usize,
        batch: &[Settlement],
        chunk: &[usize],
    ) -> Result<Vec<Result<bool, StoreError>>, StoreError> {
        self.inner.health(target).check()?;
        let mut call = MARKS.call();
        for &i in chunk {
            call.key(format!("{}settled:{}", self.inner.prefix, batch[i].token));
        }
        call.arg(MARK_TTL.as_millis());
        let wait = self.inner.off_path_wait();
        let reply = self.inner.invoke_at(target, &call, wait).await?;
        let marked = super::scripts::integers(reply)?;
        if marked.len() != chunk.len() {
            return Err(StoreError::failed(
                crate::store::ErrorKind::Protocol,
                "settlement marks: one answer per mark expected",
            ));
        }
        let new: Vec<Hit> = chunk
            .iter()
            .zip(&marked)
            .filter(|(_, &m)| m == 1)
            .flat_map(|(&i, _)| batch[i].hits())
            .collect();
        let charged = if new.is_empty() {
            Ok(())
        } else {
            self.inner.decide_one(&new, None).await.map(|_| ())
        };
        Ok(marked
            .iter()
            .map(|&m| match m {
                1 => charged.clone().map(|()| true),
                _ => Ok(false),
            })
            .collect())
    }

    /// One amount: marks its token on the counter's shard, and gives back and
    /// charges the counter (one call, in that order) only when the mark is new.
    async fn settle_once(&self, s: &Settlement) -> Result<bool, StoreError> {
        let target = self.inner.target(&s.hit);
        self.inner.health(target).check()?;
        let mut call = MARK.call();
        call.key(format!("{}settled:{}", self.inner.prefix, s.token))
            .arg(MARK_TTL.as_millis());
        let wait = self.inner.off_path_wait();
        let marked = self.inner.invoke_at(target, &call, wait).await?;
        if matches!(marked, Value::Nil) {
            return Ok(false);
        }
        let hits: Vec<Hit> = s.hits().collect();
        self.inner.decide_one(&hits, None).await?;
        Ok(true)
    }
}

/// A heartbeat's `{live, missing, member, beat, ...}`; anything else reads as
/// nothing counted, and a member without a number as none.
fn counts(v: Value) -> (u32, u32, Vec<(String, u64)>) {
    let n = |v: &Value| v.as_int().and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let Value::Array(items) = v else {
        return (0, 0, Vec::new());
    };
    let members = items
        .get(2..)
        .unwrap_or_default()
        .chunks_exact(2)
        .filter_map(|pair| {
            let member = pair[0].as_text()?;
            let beat = u64::try_from(pair[1].as_int()?).ok()?;
            Some((member, beat))
        })
        .collect();
    (
        items.first().map_or(0, n),
        items.get(1).map_or(0, n),
        members,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_reply_gives_the_counts_and_the_live_members() {
        let text = |t: &str| Value::Bulk(t.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Int(2),
            Value::Int(1),
            text("a@10.0.0.1:8080"),
            Value::Int(1_700_000_000_123),
            text("b"),
            Value::Int(1_700_000_000_456),
        ]);
        assert_eq!(
            counts(reply),
            (
                2,
                1,
                vec![
                    ("a@10.0.0.1:8080".to_string(), 1_700_000_000_123),
                    ("b".to_string(), 1_700_000_000_456)
                ]
            )
        );
        // An older script's reply: the counts alone.
        let old = Value::Array(vec![Value::Int(3), Value::Int(0)]);
        assert_eq!(counts(old), (3, 0, Vec::new()));
        assert_eq!(counts(Value::Nil), (0, 0, Vec::new()));
    }
}
