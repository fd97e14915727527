//! A Redis Cluster: calls routed to the node that serves their keys' slot.
//!
//! The slot map comes from `CLUSTER SLOTS`, read on first use from a seed or a known
//! node (so sluice starts while the cluster is down) and again when it is stale: after
//! a redirect, a connection error or timeout, or an outage reply. Reads are bounded:
//! one at a time and one per [`REFRESH_EVERY`] at most, and a call that finds its slot
//! mapped does not wait for one. A call goes to its first key's slot (the callers keep
//! every call within one slot); a node that does not serve it redirects it, `MOVED`
//! (the slot moved: the map is corrected at once) or `ASK` (the slot is migrating: this
//! call goes there after `ASKING`), at most [`MAX_REDIRECTS`] times.
//!
//! Each node has its calls pipelined ([`pipe`]) and a small [`Pool`] for the calls
//! off the decide path (the map itself, key counts, `CONFIG GET`). Every node speaks
//! with the first seed URL's TLS, credentials and database.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use crate::algorithm::Micros;
use crate::store::{ErrorKind, Report, StoreError};

use super::health::Health;
use super::scripts::{self, By, Call, Group, Scripts};
use super::shard::{self, SLOTS};
use super::wire::{Pool, Request, Target, Value};
use super::{bad_url, classify, expire, shard_name, ConfigError};

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

/// One node of the cluster.
pub struct Node {
    /// `host:port`.
    pub name: String,
    host: String,
    pool: Pool,
    pipe: Pipe,
}

impl Node {
    fn new(target: Target, timeout: Duration) -> Arc<Node> {
        let host = match &target.addr {
            super::wire::target::Addr::Tcp { host, .. } => host.clone(),
            super::wire::target::Addr::Unix(_) => String::new(),
        };
        Arc::new(Node {
            name: target.name(),
            host,
            pipe: Pipe::spawn(target.clone(), timeout),
            pool: Pool::new(target),
        })
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

pub struct Cluster {
    router: Arc<Router>,
    pub health: Health,
    /// The seed nodes' `host:port`, for `/debug/store`.
    pub seeds: Vec<String>,
}

/// The slot map and the nodes, shared with the map's reads in the background.
struct Router {
    /// What every node's connections use but the address (the first seed's URL).
    template: Target,
    seed_nodes: Vec<Arc<Node>>,
    map: ArcSwap<Map>,
    /// Held while the map is read; when it was last read.
    refresh: Arc<tokio::sync::Mutex<Option<Instant>>>,
    /// The map may be wrong: read it again at the next call.
    stale: AtomicBool,
    timeout: Duration,
}

/// Marks the map stale if the call it watches is dropped unanswered (its caller's
/// timeout): the node may be gone.
struct Watch<'a>(&'a AtomicBool, bool);

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

impl Cluster {
    /// No connection is made until the first call. Must run inside a Tokio runtime.
    pub fn new(
        urls: &[String],
        timeout: Duration,
        report: Option<Arc<dyn Report>>,
    ) -> Result<Cluster, ConfigError> {
        let targets = urls
            .iter()
            .map(|u| Target::parse(u, timeout).map_err(|e| bad_url(u, e)))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(template) = targets.first().cloned() else {
            return Err(ConfigError::NoUrl);
        };
        let seed_nodes: Vec<Arc<Node>> =
            targets.into_iter().map(|t| Node::new(t, timeout)).collect();
        let map = Map {
            slots: vec![UNMAPPED; usize::from(SLOTS)],
            nodes: seed_nodes.clone(),
            masters: 0,
        };
        let router = Router {
            template,
            seed_nodes,
            map: ArcSwap::from_pointee(map),
            refresh: Arc::new(tokio::sync::Mutex::new(None)),
            stale: AtomicBool::new(false),
            timeout,
        };
        Ok(Cluster {
            router: Arc::new(router),
            health: Health::new("cluster".to_string(), report),
            seeds: urls.iter().map(|u| shard_name(u)).collect(),
        })
    }

    /// A script call on the node of its keys' slot (all keys share one).
    pub async fn script(&self, call: &Call<'_>) -> Result<Value, StoreError> {
        let slot = call.keys().first().map_or(0, |k| shard::slot(k.as_bytes()));
        self.eval(slot, |req, text| call.write(req, text)).await
    }

    /// The decide call of `group` on the node of its keys' slot, written straight
    /// into one request ([`scripts::write_decide`]).
    pub async fn decide(
        &self,
        scripts: &Scripts,
        group: &Group,
        fixed_now: Option<Micros>,
    ) -> Result<Value, StoreError> {
        let slot = group.keys.first().map_or(0, |k| shard::slot(k.as_bytes()));
        let by = |text| match text {
            true => By::Text,
            false => By::Hash(scripts.decide.hash()),
        };
        self.eval(slot, |req, text| {
            scripts::write_decide(req, by(text), &[group], fixed_now)
        })
        .await
    }

    /// A script call that `write` writes ([`scripts::run`]) on the node of `slot`.
    async fn eval(
        &self,
        slot: u16,
        write: impl Fn(&mut Request, bool),
    ) -> Result<Value, StoreError> {
        let router = &self.router;
        scripts::run(write, |req| router.run(slot, Arc::new(req))).await
    }

    /// A command (`parts`, its name first) on the node of its first key's slot
    /// (`parts[1]`). An error reply is its [`StoreError`].
    pub async fn command(&self, parts: &[&[u8]]) -> Result<Value, StoreError> {
        let slot = parts.get(1).map_or(0, |k| shard::slot(k));
        let mut req = Request::default();
        req.start(parts.len());
        for p in parts {
            req.arg(p);
        }
        match self.router.run(slot, Arc::new(req)).await? {
            Value::Error(e) => Err(classify::reply(e)),
            v => Ok(v),
        }
    }

    /// DBSIZE summed over the masters; `None` while any of them does not answer.
    pub async fn dbsize(&self) -> Option<usize> {
        let masters = self.router.masters().await;
        if masters.is_empty() {
            return None;
        }
        let sizes = futures::future::join_all(masters.iter().map(|n| super::dbsize(&n.pool)));
        sizes.await.into_iter().sum()
    }

    /// The expire-cycle warnings of every master ([`expire::check`]).
    pub async fn expire_warnings(&self, store_timeout: Duration) -> Vec<String> {
        let masters = self.router.masters().await;
        let checks = masters
            .iter()
            .map(|n| expire::check(&n.pool, &n.name, store_timeout));
        futures::future::join_all(checks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

impl Router {
    /// Sends `req` to the node of `slot`, following its redirects. Error replies
    /// other than redirects come back as values.
    async fn run(self: &Arc<Self>, slot: u16, req: Arc<Request>) -> Result<Value, StoreError> {
        let mut node = self.route(slot).await;
        let mut asking = false;
        for _ in 0..=MAX_REDIRECTS {
            let mut watch = Watch(&self.stale, false);
            let answer = node.pipe.call(req.clone(), asking).await;
            watch.1 = true;
            let text = match answer {
                Ok(Value::Error(text)) => text,
                Ok(v) => return Ok(v),
                Err(e) => {
                    self.stale.store(true, Ordering::Relaxed);
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
                    if classify::reply_kind(&text).is_outage() {
                        self.stale.store(true, Ordering::Relaxed);
                    }
                    return Ok(Value::Error(text));
                }
            }
        }
        Err(StoreError::failed(
            ErrorKind::TryAgain,
            format!("slot {slot} redirected more than {MAX_REDIRECTS} times"),
        ))
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
        let mut last = if wait {
            self.refresh.clone().lock_owned().await
        } else {
            match self.refresh.clone().try_lock_owned() {
                Ok(guard) => guard,
                Err(_) => return,
            }
        };
        if last.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        self.stale.store(false, Ordering::Relaxed);
        let router = self.clone();
        let read = tokio::spawn(async move {
            if let Err(e) = router.load().await {
                tracing::debug!(error = %e, "cluster slot map not read");
                router.stale.store(true, Ordering::Relaxed);
            }
            drop(last);
        });
        if wait {
            let _ = read.await;
        }
    }

    /// Asks the known masters, then the seeds, for the slot map, until one answers.
    async fn load(&self) -> Result<(), StoreError> {
        let old = self.map.load_full();
        let mut asked: Vec<&Arc<Node>> = old.nodes.iter().collect();
        for seed in &self.seed_nodes {
            if !asked.iter().any(|n| n.name == seed.name) {
                asked.push(seed);
            }
        }
        let mut req = Request::default();
        req.start(2);
        req.arg(b"CLUSTER");
        req.arg(b"SLOTS");
        let mut last = StoreError::failed(ErrorKind::Connection, "no cluster node known");
        for node in asked {
            let reply = match tokio::time::timeout(self.timeout, node.pool.query(&req)).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::Timeout),
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

    /// The masters serving slots, the map read first if it never was.
    async fn masters(self: &Arc<Self>) -> Vec<Arc<Node>> {
        if self.map.load().masters == 0 {
            self.refresh(true).await;
        }
        let map = self.map.load();
        map.nodes[..map.masters].to_vec()
    }
}
