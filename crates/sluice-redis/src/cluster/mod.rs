//! A Redis Cluster client: calls routed to the node that serves their keys' slot.
//!
//! The slot map comes from `CLUSTER SLOTS`, read on first use from a seed or a known
//! node (so a caller starts while the cluster is down) and again when it is stale:
//! after a redirect or an outage reply (at the next call), and at once, in the
//! background, when a node does not answer (a connection error, or a call or `PING`
//! its caller stopped waiting for: a master that died or hangs may have been replaced
//! by its replica, which no redirect will tell, as the old master answers nothing).
//! Reads are bounded: one at a time and one per [`REFRESH_EVERY`] at most, they ask
//! the nodes that failed last, and a call that finds its slot mapped does not wait
//! for one. A call goes to the slot its caller names
//! ([`slot`] of its first key: the caller keeps every call within one slot); a node
//! that does not serve it redirects it, `MOVED` (the slot moved: the map is corrected
//! at once) or `ASK` (the slot is migrating: this call goes there after `ASKING`), at
//! most [`MAX_REDIRECTS`] times.
//!
//! Each node has its calls pipelined ([`pipe`]) and a small [`Pool`] for the calls
//! off the hot path (the map itself, key counts, `CONFIG GET`). Every node speaks
//! with the first seed's TLS, credentials and database.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use crate::target::Addr;
use crate::{error, Error, ErrorKind, Pool, Request, Target, Value};

pub mod pipe;
pub mod slots;

use pipe::Pipe;
use slots::Redirect;

/// Most redirects one call follows.
pub const MAX_REDIRECTS: usize = 2;
/// Least time between two reads of the slot map.
pub const REFRESH_EVERY: Duration = Duration::from_millis(100);
/// A slot no known node serves.
const UNMAPPED: u16 = u16::MAX;

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the text between
/// the first `{` and the next `}`, when not empty) or of the whole key.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&c| c == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&c| c == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % SLOTS
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// One node of the cluster.
pub struct Node {
    /// `host:port`.
    pub name: String,
    host: String,
    /// Connections for calls off the hot path ([`Router::run`] pipelines).
    pub pool: Pool,
    pipe: Pipe,
    /// Its last call failed or went unanswered: asked last for the slot map.
    failed: AtomicBool,
}

impl Node {
    fn new(target: Target, timeout: Duration) -> Arc<Node> {
        let host = match &target.addr {
            Addr::Tcp { host, .. } => host.clone(),
            Addr::Unix(_) => String::new(),
        };
        Arc::new(Node {
            name: target.name(),
            host,
            pipe: Pipe::spawn(target.clone(), timeout),
            pool: Pool::new(target),
            failed: AtomicBool::new(false),
        })
    }

    /// A call to the node failed or went unanswered.
    fn failed(&self) {
        if !self.failed.load(Ordering::Relaxed) {
            self.failed.store(true, Ordering::Relaxed);
        }
    }

    /// The node answered a call (one load while it keeps answering).
    fn answered(&self) {
        if self.failed.load(Ordering::Relaxed) {
            self.failed.store(false, Ordering::Relaxed);
        }
    }
}

/// Which node serves each slot.
#[derive(Clone)]
struct Map {
    /// Per slot, its node's index in `nodes` (or [`UNMAPPED`]).
    slots: Vec<u16>,
    /// The masters first (`nodes[..masters]`), then other nodes met.
    nodes: Vec<Arc<Node>>,
    masters: usize,
}

impl Map {
    fn node(&self, slot: u16) -> Option<&Arc<Node>> {
        match self.slots.get(usize::from(slot)) {
            Some(&i) if i != UNMAPPED => self.nodes.get(usize::from(i)),
            _ => None,
        }
    }

    fn find(&self, name: &str) -> Option<&Arc<Node>> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

/// The slot map and the nodes, shared with the map's reads in the background.
pub struct Router {
    /// What every node's connections use but the address (the first seed's URL).
    template: Target,
    seed_nodes: Vec<Arc<Node>>,
    map: ArcSwap<Map>,
    /// Held while the map is read; when it was last read.
    refresh: Arc<tokio::sync::Mutex<Option<Instant>>>,
    /// The map may be wrong: read it again at the next call.
    stale: AtomicBool,
    /// Why the last read of the map failed, until one succeeds: said where the
    /// cluster is reported down (a standalone Redis answers that it has cluster
    /// support disabled). Touched only by reads of the map.
    unread: std::sync::Mutex<Option<String>>,
    timeout: Duration,
}

/// Suspects the node ([`Router::suspect`]) if the call it watches is dropped
/// unanswered (its caller's timeout): the node may be gone or hung.
struct Watch<'a> {
    router: &'a Arc<Router>,
    node: &'a Node,
    answered: bool,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.router.suspect(self.node);
        }
    }
}

impl Router {
    /// A client of the cluster that `seeds` are nodes of; `None` without a seed. No
    /// connection is made until the first call. Must run inside a Tokio runtime.
    pub fn new(seeds: Vec<Target>, timeout: Duration) -> Option<Arc<Router>> {
        let template = seeds.first()?.clone();
        let seed_nodes: Vec<Arc<Node>> = seeds.into_iter().map(|t| Node::new(t, timeout)).collect();
        let map = Map {
            slots: vec![UNMAPPED; usize::from(SLOTS)],
            nodes: seed_nodes.clone(),
            masters: 0,
        };
        Some(Arc::new(Router {
            template,
            seed_nodes,
            map: ArcSwap::from_pointee(map),
            refresh: Arc::new(tokio::sync::Mutex::new(None)),
            stale: AtomicBool::new(false),
            unread: std::sync::Mutex::new(None),
            timeout,
        }))
    }

    /// Sends `req` to the node of `slot`, following its redirects. Error replies
    /// other than redirects come back as values.
    pub async fn run(self: &Arc<Self>, slot: u16, req: Arc<Request>) -> Result<Value, Error> {
        let mut node = self.route(slot).await;
        let mut asking = false;
        for _ in 0..=MAX_REDIRECTS {
            let mut watch = Watch {
                router: self,
                node: &node,
                answered: false,
            };
            let answer = node.pipe.call(req.clone(), asking).await;
            watch.answered = true;
            drop(watch);
            let text = match answer {
                Ok(Value::Error(text)) => {
                    node.answered();
                    text
                }
                Ok(v) => {
                    node.answered();
                    return Ok(v);
                }
                Err(e) => {
                    self.suspect(&node);
                    return Err(e);
                }
            };
            match slots::redirect(&text, &node.host)? {
                Some(Redirect::Moved { slot, host, port }) => {
                    node = self.moved(slot, &host, port);
                    asking = false;
                }
                Some(Redirect::Ask { host, port, .. }) => {
                    node = self.node_at(&host, port);
                    asking = true;
                }
                None => {
                    // CLUSTERDOWN, TRYAGAIN, LOADING, MASTERDOWN, ...: the map may
                    // have changed under it.
                    if error::reply_kind(&text).is_outage() {
                        self.stale.store(true, Ordering::Relaxed);
                    }
                    return Ok(Value::Error(text));
                }
            }
        }
        Err(Error::failed(
            ErrorKind::TryAgain,
            format!("slot {slot} redirected more than {MAX_REDIRECTS} times"),
        ))
    }

    /// Sends `req`, a command without keys (such as `SCRIPT LOAD` or `PING`), to
    /// `node` itself. A connection error, or the caller's timeout, suspects the node
    /// (see `Router::suspect`), as a routed call's does.
    pub async fn run_on(self: &Arc<Self>, node: &Node, req: Arc<Request>) -> Result<Value, Error> {
        let mut watch = Watch {
            router: self,
            node,
            answered: false,
        };
        let answer = node.pipe.call(req, false).await;
        watch.answered = true;
        drop(watch);
        match &answer {
            Ok(_) => node.answered(),
            Err(_) => self.suspect(node),
        }
        answer
    }

    /// `node` did not answer a call: it may be dead, or hung, and its slots served
    /// by a replica promoted meanwhile, which no redirect tells (the node answers
    /// nothing). The map is read again now, in the background, asking `node` last
    /// ([`Router::refresh_soon`]).
    fn suspect(self: &Arc<Self>, node: &Node) {
        node.failed();
        self.refresh_soon();
    }

    /// Reads the slot map again now, in the background, unless a read is under way
    /// or one was made less than [`REFRESH_EVERY`] ago; the map stays marked stale
    /// then, so the next call or `refresh_soon` reads it. Needs a Tokio runtime (does
    /// nothing without one).
    pub fn refresh_soon(self: &Arc<Self>) {
        self.stale.store(true, Ordering::Relaxed);
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if let Ok(last) = self.refresh.clone().try_lock_owned() {
            self.read(last);
        }
    }

    /// The node a call to `slot` goes to first ([`Router::run`]): its master in the
    /// map (read again first when stale, or when the slot is not placed yet).
    pub async fn node(self: &Arc<Self>, slot: u16) -> Arc<Node> {
        self.route(slot).await
    }

    /// The node `slot`'s calls go to: its master in the map (read again first when
    /// stale), or any node when none is known, which redirects the call or answers
    /// why it cannot.
    async fn route(self: &Arc<Self>, slot: u16) -> Arc<Node> {
        if self.stale.load(Ordering::Relaxed) {
            self.refresh(false).await;
        }
        if let Some(node) = self.map.load().node(slot) {
            return node.clone();
        }
        self.refresh(true).await;
        let map = self.map.load();
        map.node(slot)
            .or_else(|| map.nodes.first())
            .unwrap_or(&self.seed_nodes[0])
            .clone()
    }

    /// Reads the slot map again in a task of its own (a caller that stops waiting
    /// does not cancel it), unless it was read less than [`REFRESH_EVERY`] ago. With
    /// `wait`, waits for it (or for a read under way, then uses its map); without,
    /// leaves it to run.
    async fn refresh(self: &Arc<Self>, wait: bool) {
        let last = if wait {
            self.refresh.clone().lock_owned().await
        } else {
            match self.refresh.clone().try_lock_owned() {
                Ok(guard) => guard,
                Err(_) => return,
            }
        };
        if let Some(read) = self.read(last) {
            if wait {
                let _ = read.await;
            }
        }
    }

    /// Starts a read of the map, holding `last` (the refresh lock) until it ends,
    /// unless the last one began less than [`REFRESH_EVERY`] ago.
    fn read(
        self: &Arc<Self>,
        mut last: tokio::sync::OwnedMutexGuard<Option<Instant>>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if last.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return None;
        }
        *last = Some(Instant::now());
        self.stale.store(false, Ordering::Relaxed);
        let router = self.clone();
        Some(tokio::spawn(async move {
            let read = router.load().await;
            if let Err(e) = &read {
                tracing::debug!(error = %e, "cluster slot map not read");
                router.stale.store(true, Ordering::Relaxed);
            }
            *router.unread.lock().unwrap_or_else(|e| e.into_inner()) =
                read.err().map(|e| e.to_string());
            drop(last);
        }))
    }

    /// Asks the known masters, then the seeds, for the slot map, until one answers;
    /// the nodes whose last call failed last (a hung one would hold the read for
    /// the whole timeout).
    async fn load(&self) -> Result<(), Error> {
        let old = self.map.load_full();
        let mut asked: Vec<&Arc<Node>> = old.nodes.iter().collect();
        for seed in &self.seed_nodes {
            if !asked.iter().any(|n| n.name == seed.name) {
                asked.push(seed);
            }
        }
        // Stable: the order stays among those that answer and those that do not.
        asked.sort_by_key(|n| n.failed.load(Ordering::Relaxed));
        let mut req = Request::default();
        req.start(2);
        req.arg(b"CLUSTER");
        req.arg(b"SLOTS");
        let mut last = Error::failed(ErrorKind::Connection, "no cluster node known");
        for node in asked {
            let reply = match tokio::time::timeout(self.timeout, node.pool.query(&req)).await {
                Ok(r) => r,
                Err(_) => Err(Error::Timeout),
            };
            match reply.and_then(|v| slots::parse_slots(v, &node.host)) {
                Ok(ranges) => {
                    self.map.store(Arc::new(self.mapped(&old, &ranges, node)));
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The map of `ranges`, keeping the nodes (and their connections) already known.
    fn mapped(&self, old: &Map, ranges: &[slots::Range], asked: &Arc<Node>) -> Map {
        let mut map = Map {
            slots: vec![UNMAPPED; usize::from(SLOTS)],
            nodes: Vec::new(),
            masters: 0,
        };
        for r in ranges {
            let name = self.template.at(&r.host, r.port).name();
            let i = match map.nodes.iter().position(|n| n.name == name) {
                Some(i) => i,
                None => {
                    map.nodes.push(self.known(old, &r.host, r.port));
                    map.nodes.len() - 1
                }
            };
            map.slots[usize::from(r.first)..=usize::from(r.last)].fill(i as u16);
        }
        map.masters = map.nodes.len();
        if map.find(&asked.name).is_none() {
            map.nodes.push(asked.clone());
        }
        map
    }

    /// The node at `host:port` from `map` or the seeds, or a new one.
    fn known(&self, map: &Map, host: &str, port: u16) -> Arc<Node> {
        let target = self.template.at(host, port);
        let name = target.name();
        map.find(&name)
            .or_else(|| self.seed_nodes.iter().find(|n| n.name == name))
            .cloned()
            .unwrap_or_else(|| Node::new(target, self.timeout))
    }

    /// The node at `host:port`, added to the map when new (not serving a slot yet).
    fn node_at(&self, host: &str, port: u16) -> Arc<Node> {
        let name = self.template.at(host, port).name();
        if let Some(node) = self.map.load().find(&name) {
            return node.clone();
        }
        let node = self.known(&self.map.load(), host, port);
        self.map.rcu(|map| {
            let mut map = Map::clone(map);
            if map.find(&name).is_none() {
                map.nodes.push(node.clone());
            }
            map
        });
        node
    }

    /// A `MOVED`: `slot` is served by `host:port` from now on. The rest of the map
    /// may have moved too, so it is read again at the next call.
    fn moved(&self, slot: u16, host: &str, port: u16) -> Arc<Node> {
        let node = self.node_at(host, port);
        self.map.rcu(|map| {
            let mut map = Map::clone(map);
            let i = match map.nodes.iter().position(|n| n.name == node.name) {
                Some(i) => i,
                None => {
                    map.nodes.push(node.clone());
                    map.nodes.len() - 1
                }
            };
            map.slots[usize::from(slot)] = i as u16;
            map
        });
        self.stale.store(true, Ordering::Relaxed);
        node
    }

    /// The node the map says serves `slot` now, without reading the map again:
    /// `None` while the map has not been read or leaves the slot unserved.
    pub fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        self.map.load().node(slot).cloned()
    }

    /// The masters serving slots in the map as it is, without reading it again.
    pub fn masters_now(&self) -> Vec<Arc<Node>> {
        let map = self.map.load();
        map.nodes[..map.masters].to_vec()
    }

    /// Why the last read of the slot map failed, while none has succeeded since.
    pub fn unread(&self) -> Option<String> {
        self.unread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The masters serving slots, the map read first if it never was.
    pub async fn masters(self: &Arc<Self>) -> Vec<Arc<Node>> {
        if self.map.load().masters == 0 {
            self.refresh(true).await;
        }
        let map = self.map.load();
        map.nodes[..map.masters].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT` of
        // redis-server 7.0.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b""), 0);
        assert_eq!(slot(b"{user1000}.following"), 3443);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        // The first `{...}` with something inside is the tag...
        assert_eq!(slot(b"foo{bar}{zap}"), 5061);
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), 4015);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        // ...and an empty or unclosed one is no tag: the whole key is hashed.
        assert_eq!(slot(b"foo{}{bar}"), 8363);
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"{}"), 15257);
        assert_eq!(slot(b"foo{"), 7673);
        // A counter's key: its placement in hex is the tag.
        assert_eq!(slot(b"sluice:{00000000000000ab}:d|client=a:sc"), 2250);
        assert_eq!(
            slot(b"sluice:{00000000000000ab}:d|client=a:sc"),
            slot(b"00000000000000ab")
        );
    }
}
