//! Counters on a Redis Cluster: each script call on the node of its keys' slot,
//! through the cluster client ([`sluice_redis::cluster`]), with a health per master:
//! one master down backs off its slots' calls alone, while the others keep
//! deciding theirs. Calls made before the slot map is known (every node unreachable
//! since the start) count for the cluster as a whole.
//!
//! Calls go by `EVALSHA`. A master's script cache starts empty (a new cluster, a
//! restart without persistence, a replica promoted by a failover: replicas do not
//! get scripts) and may be emptied (`SCRIPT FLUSH`), so each script is loaded on
//! each master (`Loaded`) before the first call there, and again when the master
//! answers NOSCRIPT: one `SCRIPT LOAD` shared by every call that waits for it, rather
//! than one full-text `EVAL` per call, whose burst outlasted the store timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use sluice_redis::cluster::{self, Node, Router};
use sluice_redis::{Request, Value};

use crate::algorithm::Micros;
use crate::store::{Report, ShardState, ShardStatus, StoreError};

use super::health::Health;
use super::scripts::{self, By, Call, Group, Lua, Scripts};
use super::{expire, shard_name, target, ConfigError};

pub struct Cluster {
    router: Arc<Router>,
    /// Calls to a slot the map does not place (not read yet, or the slot unserved).
    pub health: Arc<Health>,
    /// Per node that has served a slot, its health; added to, never cut.
    nodes: ArcSwap<Vec<Arc<Health>>>,
    report: Option<Arc<dyn Report>>,
    /// How long a call waits, for its nodes' health ([`Health::with_call_timeout`]).
    call_timeout: Duration,
    /// The seed nodes' `host:port`, for `/debug/store`.
    pub seeds: Vec<String>,
    /// Per script and master met, whether it is loaded there; added to, never cut.
    loaded: Arc<ArcSwap<Vec<Arc<Loaded>>>>,
}

/// One script on one master: loaded before the first call there, and loaded again
/// by the first call that meets NOSCRIPT since, while the others wait for that load.
struct Loaded {
    node: String,
    hash: String,
    /// Loads the master answered; 0 until the first.
    loads: AtomicU64,
    /// Loads tried, answered or not.
    tries: AtomicU64,
    /// The master refused `SCRIPT LOAD` (an ACL): calls that meet NOSCRIPT send the
    /// script's text, which caches it as well.
    refused: AtomicBool,
    /// Held while a load is under way.
    loading: Arc<tokio::sync::Mutex<()>>,
}

impl Loaded {
    /// The entry of `script` on `node`, made the first time they are met.
    fn of(all: &ArcSwap<Vec<Arc<Loaded>>>, node: &str, script: &Lua) -> Arc<Loaded> {
        let find = |all: &[Arc<Loaded>]| {
            all.iter()
                .find(|l| l.node == node && l.hash == script.hash())
                .cloned()
        };
        if let Some(l) = find(&all.load()) {
            return l;
        }
        let made = Arc::new(Loaded {
            node: node.to_string(),
            hash: script.hash().to_string(),
            loads: AtomicU64::new(0),
            tries: AtomicU64::new(0),
            refused: AtomicBool::new(false),
            loading: Arc::new(tokio::sync::Mutex::new(())),
        });
        let mut found = None;
        all.rcu(|all| {
            found = find(all);
            let mut all = Vec::clone(all);
            if found.is_none() {
                all.push(made.clone());
            }
            all
        });
        found.unwrap_or(made)
    }

    /// Loads the script on `node` unless a load has answered since the caller saw
    /// `seen` loads (then that one served it) or one was tried while the caller
    /// waited (it failed: the call goes on and meets the outage itself); returns the
    /// loads now. The load runs in a task of its own, so a caller that stops waiting
    /// does not cancel it for the others.
    async fn load(
        self: &Arc<Self>,
        router: &Arc<Router>,
        node: &Arc<Node>,
        text: &'static str,
        seen: u64,
    ) -> u64 {
        if self.refused.load(Ordering::Relaxed) {
            return seen;
        }
        let tried = self.tries.load(Ordering::Acquire);
        let turn = self.loading.clone().lock_owned().await;
        let now = self.loads.load(Ordering::Acquire);
        if now != seen || self.tries.load(Ordering::Acquire) != tried {
            return now;
        }
        self.tries.fetch_add(1, Ordering::Release);
        let (me, router, node) = (self.clone(), router.clone(), node.clone());
        let task = tokio::spawn(async move {
            let mut req = Request::default();
            req.start(3);
            req.arg(b"SCRIPT");
            req.arg(b"LOAD");
            req.arg(text.as_bytes());
            match router.run_on(&node, Arc::new(req)).await {
                Ok(Value::Bulk(_)) => {
                    me.loads.fetch_add(1, Ordering::Release);
                }
                Ok(Value::Error(e))
                    if e.starts_with("NOPERM") || e.starts_with("ERR unknown command") =>
                {
                    tracing::debug!(node = %me.node, error = %e, "SCRIPT LOAD refused");
                    me.refused.store(true, Ordering::Relaxed);
                }
                // Down, slow or busy: the calls meet that themselves.
                _ => {}
            }
            drop(turn);
            me.loads.load(Ordering::Acquire)
        });
        task.await.unwrap_or(seen)
    }
}

impl Cluster {
    /// No connection is made until the first call. Must run inside a Tokio runtime.
    pub fn new(
        urls: &[String],
        timeout: Duration,
        call_timeout: Duration,
        report: Option<Arc<dyn Report>>,
    ) -> Result<Cluster, ConfigError> {
        let targets = urls
            .iter()
            .map(|u| target(u, timeout))
            .collect::<Result<Vec<_>, _>>()?;
        let router = Router::new(targets, timeout).ok_or(ConfigError::NoUrl)?;
        Ok(Cluster {
            router,
            health: Arc::new(
                Health::new("cluster".to_string(), report.clone()).with_call_timeout(call_timeout),
            ),
            nodes: ArcSwap::from_pointee(Vec::new()),
            report,
            call_timeout,
            seeds: urls.iter().map(|u| shard_name(u)).collect(),
            loaded: Arc::new(ArcSwap::from_pointee(Vec::new())),
        })
    }

    /// Reads the slot map and loads `script` on every master, in the background, so
    /// that the first calls after start pay for neither (as a standalone shard's
    /// connections are made and loaded at start). A failure is left for the first
    /// call to meet.
    pub fn warm(&self, script: &Lua) {
        let (router, loaded) = (self.router.clone(), self.loaded.clone());
        let script = script.clone();
        tokio::spawn(async move {
            let masters = router.masters().await;
            let loads = masters.iter().map(|node| {
                let entry = Loaded::of(&loaded, &node.name, &script);
                let (router, text) = (&router, script.text());
                async move {
                    if entry.loads.load(Ordering::Acquire) == 0 {
                        entry.load(router, node, text, 0).await;
                    }
                }
            });
            futures::future::join_all(loads).await;
        });
    }

    /// The health a call to `slot` counts for: its master's, as the map places it
    /// now, or the cluster's while the map does not.
    pub fn health_of(&self, slot: u16) -> Arc<Health> {
        match self.router.owner(slot) {
            Some(node) => self.node_health(&node.name),
            None => self.health.clone(),
        }
    }

    /// The master the slot map gives `slot` now (`host:port`), if it is known.
    pub fn master_of(&self, slot: u16) -> Option<String> {
        self.router.owner(slot).map(|node| node.name.clone())
    }

    /// The masters the slot map names now, without reading it.
    pub fn masters_now(&self) -> Vec<Arc<Node>> {
        self.router.masters_now()
    }

    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// The health of the node `name`, made (and its metrics declared) the first
    /// time the node is met.
    pub fn node_health(&self, name: &str) -> Arc<Health> {
        if let Some(h) = self.nodes.load().iter().find(|h| *h.name == *name) {
            return h.clone();
        }
        let made = Arc::new(
            Health::new(name.to_string(), self.report.clone()).with_call_timeout(self.call_timeout),
        );
        let mut found = None;
        self.nodes.rcu(|nodes| {
            found = nodes.iter().find(|h| *h.name == *name).cloned();
            let mut nodes = Vec::clone(nodes);
            if found.is_none() {
                nodes.push(made.clone());
            }
            nodes
        });
        found.unwrap_or(made)
    }

    /// Whether a call has failed since its last success, on any master or before
    /// the map was read.
    pub fn is_failing(&self) -> bool {
        self.health.is_failing() || self.nodes.load().iter().any(|h| h.is_failing())
    }

    /// Whether any master, or the cluster before the map was read, is backing off.
    pub fn is_down(&self) -> bool {
        self.health.is_down() || self.nodes.load().iter().any(|h| h.is_down())
    }

    /// For `/debug/store`: the cluster as a whole first (named `cluster`, with the
    /// seeds; as bad as its worst master), then each master the map names now.
    pub fn statuses(&self) -> Vec<ShardStatus> {
        let masters: Vec<ShardStatus> = self
            .router
            .masters_now()
            .iter()
            .map(|n| ShardStatus {
                nodes: vec![n.name.clone()],
                ..self.node_health(&n.name).status()
            })
            .collect();
        let mut whole = ShardStatus {
            nodes: self.seeds.clone(),
            ..self.health.status()
        };
        for m in &masters {
            if severity(m.state) > severity(whole.state) {
                whole.state = m.state;
                whole.backoff_until = m.backoff_until;
            }
            let newer = match (&m.last_error, &whole.last_error) {
                (Some(m), Some(w)) => m.at > w.at,
                (m, _) => m.is_some(),
            };
            if newer {
                whole.last_error = m.last_error.clone();
            }
        }
        let mut all = vec![whole];
        all.extend(masters);
        all
    }

    /// A script call on the node of its keys' slot (all keys share one).
    pub async fn script(&self, call: &Call<'_>) -> Result<Value, StoreError> {
        let slot = call
            .keys()
            .first()
            .map_or(0, |k| cluster::slot(k.as_bytes()));
        self.eval(slot, call.script(), |req, text| call.write(req, text))
            .await
    }

    /// The decide call of `group` on the node of its keys' slot, written straight
    /// into one request ([`scripts::write_decide`]).
    pub async fn decide(
        &self,
        scripts: &Scripts,
        group: &Group,
        fixed_now: Option<Micros>,
    ) -> Result<Value, StoreError> {
        let slot = group
            .keys
            .first()
            .map_or(0, |k| cluster::slot(k.as_bytes()));
        let by = |text| match text {
            true => By::Text,
            false => By::Hash(scripts.decide.hash()),
        };
        self.eval(slot, &scripts.decide, |req, text| {
            scripts::write_decide(req, by(text), &[group], fixed_now)
        })
        .await
    }

    /// A call of `script` that `write` writes by hash (or, told `true`, by text) on
    /// the node of `slot`: `EVALSHA`, the script loaded there first when it never
    /// was, and again on NOSCRIPT. Only a call that still meets NOSCRIPT after that
    /// (the master refuses `SCRIPT LOAD`, or a redirect took the call to a node not
    /// met yet) sends the text. An error reply comes back as its [`StoreError`].
    async fn eval(
        &self,
        slot: u16,
        script: &Lua,
        write: impl Fn(&mut Request, bool),
    ) -> Result<Value, StoreError> {
        let node = self.router.node(slot).await;
        let loaded = Loaded::of(&self.loaded, &node.name, script);
        let mut seen = loaded.loads.load(Ordering::Acquire);
        if seen == 0 {
            seen = loaded.load(&self.router, &node, script.text(), 0).await;
        }
        let send = |text: bool| {
            let mut req = Request::default();
            write(&mut req, text);
            self.router.run(slot, Arc::new(req))
        };
        let mut value = send(false).await?;
        if scripts::noscript(&value) {
            if loaded.load(&self.router, &node, script.text(), seen).await != seen {
                value = send(false).await?;
            }
            if scripts::noscript(&value) {
                value = send(true).await?;
            }
        }
        match value {
            Value::Error(e) => Err(sluice_redis::error::reply(e).into()),
            v => Ok(v),
        }
    }

    /// A command (`parts`, its name first) on the node of its first key's slot
    /// (`parts[1]`). An error reply is its [`StoreError`].
    pub async fn command(&self, parts: &[&[u8]]) -> Result<Value, StoreError> {
        let slot = parts.get(1).map_or(0, |k| cluster::slot(k));
        let mut req = Request::default();
        req.start(parts.len());
        for p in parts {
            req.arg(p);
        }
        match self.router.run(slot, Arc::new(req)).await? {
            Value::Error(e) => Err(sluice_redis::error::reply(e).into()),
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

/// How far from up a state is, for the cluster's entry.
fn severity(state: ShardState) -> u8 {
    match state {
        ShardState::Up | ShardState::InMemory => 0,
        ShardState::Failing => 1,
        ShardState::Trying => 2,
        ShardState::BackingOff => 3,
    }
}
