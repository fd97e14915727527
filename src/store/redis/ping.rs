//! Probes of quiet shards: a shard's health is otherwise learnt from its calls
//! alone, so one that died while idle would read up, and one backed off would read
//! down after it came back, until a request happened to reach it. A background task
//! asks each shard that no call has answered since its last look (standalone
//! shards, Sentinel masters, a cluster's masters), bounded by the store timeout,
//! and tells its health ([`Health::probe_due`], [`Health::probed`] keep the
//! schedule). Nothing is added to the request path.
//!
//! Each is asked for a write that writes nothing ([`write_probe`]): Redis refuses
//! it as it refuses a decide call on a replica (`READONLY`), at `maxmemory`
//! (`OOM`) and to a connection without the right password, which a `PING` would
//! not show. A cluster master's probe key carries a hash tag that places it in
//! one of that master's slots ([`ClusterProbes`]), as a write elsewhere would be
//! redirected; a redirect means the slot map changed, which is read again. Where
//! the write is refused for another reason (an ACL without `SET`) the shard is
//! asked for a `PING` instead.
//!
//! While a cluster master the slot map names does not answer, the map is also read
//! again every [`MAP_WHILE_FAILING`]: a master that died or hangs is replaced by its
//! replica once the cluster's node timeout passes, and nothing else would tell
//! sluice so (the old master answers no call to redirect it, and calls to a master
//! backed off are not sent at all).

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use sluice_redis::cluster::{self, Node, Router};
use sluice_redis::{Pool, Request, Value};

use crate::store::StoreError;

use super::cluster::Cluster;
use super::error::is_redirect;
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
    let mut cluster_probes = ClusterProbes::default();
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
            Backend::Cluster(c) => {
                watch_cluster(c, &mut cluster_probes, &inner.prefix, timeout).await
            }
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
/// there marks the map stale, as a call's does), with a write to a key in one of
/// its slots (`probes`). While no map is known, the cluster as a whole is probed by
/// reading one.
async fn watch_cluster(
    cluster: &Cluster,
    probes: &mut ClusterProbes,
    prefix: &str,
    timeout: Duration,
) -> Instant {
    let masters = cluster.masters_now();
    probes.keep(&masters);
    if masters.is_empty() {
        let router = cluster.router();
        look(&cluster.health, || read_map(router, timeout)).await;
        return next_look(std::iter::once(&*cluster.health));
    }
    let healths: Vec<Arc<Health>> = masters
        .iter()
        .map(|n| cluster.node_health(&n.name))
        .collect();
    let router = cluster.router();
    let writes: Vec<Option<Arc<Request>>> = masters
        .iter()
        .map(|node| probes.of(router, node, prefix))
        .collect();
    let rounds = masters
        .iter()
        .zip(&healths)
        .zip(writes)
        .map(|((node, health), write)| {
            look(health, move || probe_node(router, node, write, timeout))
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

/// One cluster master: `write` (a key in one of its slots), or a `PING` where
/// there is none or the master refuses it for what says nothing of it (an ACL,
/// `CLUSTERDOWN`). A redirect says the slot map changed: it is read again, and
/// the master gets a `PING` this time.
async fn probe_node(
    router: &Arc<Router>,
    node: &Node,
    write: Option<Arc<Request>>,
    timeout: Duration,
) -> Result<Asked, StoreError> {
    if let Some(write) = write {
        match run_on(router, node, write, timeout).await? {
            Value::Error(text) if is_redirect(&text) => router.refresh_soon(),
            Value::Error(text) => {
                let e = StoreError::from(sluice_redis::error::reply(text));
                if Asked::sees(&e).is_some() {
                    return Err(e);
                }
            }
            _ => return Ok(Asked::Write),
        }
    }
    let answer = run_on(router, node, Arc::new(ping()), timeout).await?;
    pong(answer).map(|()| Asked::Ping)
}

async fn run_on(
    router: &Arc<Router>,
    node: &Node,
    req: Arc<Request>,
    timeout: Duration,
) -> Result<Value, StoreError> {
    match tokio::time::timeout(timeout, router.run_on(node, req)).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// Tags tried for a master's probe key: the decimal numbers below this place a
/// key in every slot (the first 109,758 do).
const TAGS: u32 = 1 << 17;

/// Per cluster master (by name), its write probe: [`write_probe`] of a key whose
/// hash tag places it in one of the master's slots, and that slot. Kept while the
/// slot map gives the slot to the master; another is found when it does not.
#[derive(Default)]
struct ClusterProbes(HashMap<String, (u16, Arc<Request>)>);

impl ClusterProbes {
    /// The probe of `node` (`None` if the map gives it no slot).
    fn of(&mut self, router: &Router, node: &Node, prefix: &str) -> Option<Arc<Request>> {
        let owns = |slot| router.owner(slot).is_some_and(|n| n.name == node.name);
        if let Some((slot, req)) = self.0.get(&node.name) {
            if owns(*slot) {
                return Some(req.clone());
            }
        }
        let (tag, slot) = (0..TAGS)
            .map(|t| (t, tag_slot(t)))
            .find(|&(_, s)| owns(s))?;
        let req = Arc::new(write_probe_key(&format!("{prefix}probe{{{tag}}}")));
        self.0.insert(node.name.clone(), (slot, req.clone()));
        Some(req)
    }

    /// Forgets the probes of nodes that are no longer `masters`.
    fn keep(&mut self, masters: &[Arc<Node>]) {
        self.0
            .retain(|name, _| masters.iter().any(|m| m.name == *name));
    }
}

/// The slot of a key whose hash tag is `tag` in decimal.
fn tag_slot(tag: u32) -> u16 {
    let mut buf = [0u8; 10];
    let mut rest = &mut buf[..];
    let _ = write!(rest, "{tag}");
    let len = 10 - rest.len();
    cluster::slot(&buf[..len])
}

/// Reads the slot map (at most once per the router's refresh interval): an error
/// when no node names a master.
async fn read_map(router: &Arc<Router>, timeout: Duration) -> Result<Asked, StoreError> {
    let read = router.masters();
    match tokio::time::timeout(timeout.max(Duration::from_secs(1)), read).await {
        Ok(masters) if !masters.is_empty() => Ok(Asked::Ping),
        Ok(_) => Err(StoreError::failed(
            crate::store::ErrorKind::Connection,
            match router.unread() {
                Some(why) if why.contains("cluster support disabled") => format!(
                    "no node names the cluster's masters: {why} (a standalone Redis: give it with --redis)"
                ),
                Some(why) => format!("no node names the cluster's masters: {why}"),
                None => "no node names the cluster's masters".to_string(),
            },
        )),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// `SET <prefix>probe "" XX`: a write Redis checks as it checks a decide call
/// before running it (refused by a replica, at `maxmemory` with `noeviction`,
/// without the right password) that writes nothing, as no such key exists (a
/// counter's key has a `{` right after the prefix; a cluster master's probe key,
/// `<prefix>probe{<tag>}`, has not either). It is one of the commands sluice's ACL
/// allows on keys under the prefix.
fn write_probe(prefix: &str) -> Request {
    write_probe_key(&format!("{prefix}probe"))
}

/// [`write_probe`] of `key`.
fn write_probe_key(key: &str) -> Request {
    let mut req = Request::default();
    req.start(4);
    req.arg(b"SET");
    req.arg(key.as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slot has a tag below [`TAGS`]: a master owning a single slot still
    /// gets a write probe.
    #[test]
    fn the_tags_place_a_key_in_every_slot() {
        let mut placed = vec![false; usize::from(cluster::SLOTS)];
        for tag in 0..TAGS {
            placed[usize::from(tag_slot(tag))] = true;
        }
        assert_eq!(placed.iter().filter(|&&p| !p).count(), 0);
        // The slot Redis gives the probe's key is its tag's.
        let key = format!("sluice:probe{{{}}}", 12345);
        assert_eq!(cluster::slot(key.as_bytes()), tag_slot(12345));
        assert_ne!(
            cluster::slot(b"sluice:probe{7}"),
            cluster::slot(b"sluice:probe{8}")
        );
    }

    #[test]
    fn redirects_are_told_from_other_refusals() {
        assert!(is_redirect("MOVED 3999 127.0.0.1:6381"));
        assert!(is_redirect("ASK 3999 127.0.0.1:6381"));
        assert!(!is_redirect(
            "OOM command not allowed when used memory > 'maxmemory'."
        ));
        assert!(!is_redirect("CLUSTERDOWN Hash slot not served"));
    }
}
