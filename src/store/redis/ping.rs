//! Probes of quiet shards: a shard's health is otherwise learnt from its calls
//! alone, so one that died while idle would read up, and one backed off would read
//! down after it came back, until a request happened to reach it. A background task
//! asks each shard that no call has answered since its last look (standalone
//! shards, Sentinel masters, a cluster's masters), bounded by the store timeout,
//! and tells its health ([`Health::probe_due`], [`Health::probed`] keep the
//! schedule). Nothing is added to the request path.
//!
//! A standalone shard or Sentinel master is asked for a write that writes nothing
//! ([`write_probe`]): Redis refuses it as it refuses a decide call on a replica
//! (`READONLY`), at `maxmemory` (`OOM`) and to a connection without the right
//! password, which a `PING` would not show. Where it is refused for another reason
//! (an ACL without `SET`) the shard is asked for a `PING` instead. A cluster's
//! masters get a `PING`.
//!
//! While a cluster master the slot map names does not answer, the map is also read
//! again every [`MAP_WHILE_FAILING`]: a master that died or hangs is replaced by its
//! replica once the cluster's node timeout passes, and nothing else would tell
//! sluice so (the old master answers no call to redirect it, and calls to a master
//! backed off are not sent at all).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sluice_redis::cluster::{Node, Router};
use sluice_redis::{Pool, Request, Value};

use crate::store::StoreError;

use super::cluster::Cluster;
use super::health::{Asked, Health, PROBE_EVERY};
use super::{Backend, Inner, ShardConn};

/// How often the slot map is read while a master it names does not answer: a
/// replica promoted in its place takes that master's slots' calls at most this long
/// (and a read) after the cluster has promoted it. One `CLUSTER SLOTS` at a time,
/// to a node that answers first.
pub const MAP_WHILE_FAILING: Duration = Duration::from_millis(200);

/// Probes the store's quiet shards until the store is dropped.
pub(super) async fn watch(inner: Weak<Inner>) {
    // The shards were just connected and their key count is being read: the first
    // look an interval on does not race it for a second pooled connection.
    tokio::time::sleep(PROBE_EVERY).await;
    loop {
        let Some(inner) = inner.upgrade() else { return };
        let timeout = inner.call_timeout;
        let next = match &inner.backend {
            Backend::Shards(shards) => {
                let probe = write_probe(&inner.prefix);
                let rounds = shards
                    .iter()
                    .map(|s| look(&s.health, || ping_shard(&s.conn, &probe, timeout)));
                futures::future::join_all(rounds).await;
                next_look(shards.iter().map(|s| &*s.health))
            }
            Backend::Cluster(c) => watch_cluster(c, timeout).await,
        };
        drop(inner);
        tokio::time::sleep_until(next.into()).await;
    }
}

/// Probes `health`'s shard with `ping` if it is due.
async fn look<F, P>(health: &Health, ping: F)
where
    F: FnOnce() -> P,
    P: std::future::Future<Output = Result<Asked, StoreError>>,
{
    if health.probe_due(Instant::now()) {
        let result = ping().await;
        health.probed(&result, Instant::now());
    }
}

/// When the next look is due, over `healths`.
fn next_look<'a>(healths: impl Iterator<Item = &'a Health>) -> Instant {
    let soonest = Instant::now() + PROBE_EVERY;
    healths
        .filter_map(Health::next_probe)
        .fold(soonest, Instant::min)
}

/// One standalone shard, at its address or its Sentinel master's current one.
async fn ping_shard(
    conn: &ShardConn,
    probe: &Request,
    timeout: Duration,
) -> Result<Asked, StoreError> {
    let result = match conn.get() {
        Ok(pool) => probe_pool(&pool, probe, timeout).await,
        Err(e) => Err(e),
    };
    if let (ShardConn::Sentinel(master), Err(e)) = (conn, &result) {
        if e.is_transient() {
            // As a failed call does: the master may have moved.
            master.suspect();
        }
    }
    result
}

/// `probe` ([`write_probe`]), or a `PING` where the server refuses it for what
/// says nothing of the shard.
async fn probe_pool(pool: &Pool, probe: &Request, timeout: Duration) -> Result<Asked, StoreError> {
    match ask(pool, probe, timeout).await {
        Ok(()) => Ok(Asked::Write),
        Err(e) if Asked::sees(&e).is_some() => Err(e),
        // An ACL refusing it (NOPERM): a PING still says whether the shard answers.
        Err(_) => ask(pool, &ping(), timeout).await.map(|()| Asked::Ping),
    }
}

async fn ask(pool: &Pool, req: &Request, timeout: Duration) -> Result<(), StoreError> {
    match tokio::time::timeout(timeout, pool.query(req)).await {
        Ok(answer) => pong(answer?),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// Each master the slot map names, on the connection its calls go over (a failure
/// there marks the map stale, as a call's does). While no map is known, the cluster
/// as a whole is probed by reading one.
async fn watch_cluster(cluster: &Cluster, timeout: Duration) -> Instant {
    let masters = cluster.masters_now();
    if masters.is_empty() {
        let router = cluster.router();
        look(&cluster.health, || read_map(router, timeout)).await;
        return next_look(std::iter::once(&*cluster.health));
    }
    let healths: Vec<Arc<Health>> = masters
        .iter()
        .map(|n| cluster.node_health(&n.name))
        .collect();
    let rounds = masters.iter().zip(&healths).map(|(node, health)| {
        let router = cluster.router();
        look(health, move || ping_node(router, node, timeout))
    });
    futures::future::join_all(rounds).await;
    if healths.iter().any(|h| !h.is_failing()) {
        // A master answers: the cluster is reached (as a call's success says).
        cluster.health.probed(&Ok(Asked::Ping), Instant::now());
    }
    let next = next_look(healths.iter().map(|h| &**h));
    if healths.iter().any(|h| h.unanswering()) {
        // Its replica may have taken its slots by now.
        cluster.router().refresh_soon();
        return next.min(Instant::now() + MAP_WHILE_FAILING);
    }
    next
}

async fn ping_node(
    router: &Arc<Router>,
    node: &Node,
    timeout: Duration,
) -> Result<Asked, StoreError> {
    let sent = router.run_on(node, Arc::new(ping()));
    match tokio::time::timeout(timeout, sent).await {
        Ok(answer) => pong(answer?).map(|()| Asked::Ping),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// Reads the slot map (at most once per the router's refresh interval): an error
/// when no node names a master.
async fn read_map(router: &Arc<Router>, timeout: Duration) -> Result<Asked, StoreError> {
    let read = router.masters();
    match tokio::time::timeout(timeout.max(Duration::from_secs(1)), read).await {
        Ok(masters) if !masters.is_empty() => Ok(Asked::Ping),
        Ok(_) => Err(StoreError::failed(
            crate::store::ErrorKind::Connection,
            "no node names the cluster's masters",
        )),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// `SET <prefix>probe "" XX`: a write Redis checks as it checks a decide call
/// before running it (refused by a replica, at `maxmemory` with `noeviction`,
/// without the right password) that writes nothing, as no such key exists (a
/// counter's key has a `{` right after the prefix). It is one of the commands
/// sluice's ACL allows on keys under the prefix.
fn write_probe(prefix: &str) -> Request {
    let mut req = Request::default();
    req.start(4);
    req.arg(b"SET");
    req.arg(format!("{prefix}probe").as_bytes());
    req.arg(b"");
    req.arg(b"XX");
    req
}

fn ping() -> Request {
    let mut req = Request::default();
    req.start(1);
    req.arg(b"PING");
    req
}

/// A PING's answer; an error reply as its [`StoreError`].
fn pong(value: Value) -> Result<(), StoreError> {
    match value {
        Value::Error(e) => Err(sluice_redis::error::reply(e).into()),
        _ => Ok(()),
    }
}
