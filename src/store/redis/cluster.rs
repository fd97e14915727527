//! Counters on a Redis Cluster: each script call on the node of its keys' slot,
//! through the cluster client ([`sluice_redis::cluster`]), with a health per master:
//! one master down backs off its slots' calls alone, while the others keep
//! deciding theirs. Calls made before the slot map is known (every node unreachable
//! since the start) count for the cluster as a whole.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use sluice_redis::cluster::{self, Router};
use sluice_redis::{Request, Value};

use crate::algorithm::Micros;
use crate::store::{Report, ShardState, ShardStatus, StoreError};

use super::health::Health;
use super::scripts::{self, By, Call, Group, Scripts};
use super::{expire, shard_name, target, ConfigError};

pub struct Cluster {
    router: Arc<Router>,
    /// Calls to a slot the map does not place (not read yet, or the slot unserved).
    pub health: Arc<Health>,
    /// Per node that has served a slot, its health; added to, never cut.
    nodes: ArcSwap<Vec<Arc<Health>>>,
    report: Option<Arc<dyn Report>>,
    /// The seed nodes' `host:port`, for `/debug/store`.
    pub seeds: Vec<String>,
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
            .map(|u| target(u, timeout))
            .collect::<Result<Vec<_>, _>>()?;
        let router = Router::new(targets, timeout).ok_or(ConfigError::NoUrl)?;
        Ok(Cluster {
            router,
            health: Arc::new(Health::new("cluster".to_string(), report.clone())),
            nodes: ArcSwap::from_pointee(Vec::new()),
            report,
            seeds: urls.iter().map(|u| shard_name(u)).collect(),
        })
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

    /// The health of the node `name`, made (and its metrics declared) the first
    /// time the node is met.
    fn node_health(&self, name: &str) -> Arc<Health> {
        if let Some(h) = self.nodes.load().iter().find(|h| h.name == name) {
            return h.clone();
        }
        let made = Arc::new(Health::new(name.to_string(), self.report.clone()));
        let mut found = None;
        self.nodes.rcu(|nodes| {
            found = nodes.iter().find(|h| h.name == name).cloned();
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
        let slot = group
            .keys
            .first()
            .map_or(0, |k| cluster::slot(k.as_bytes()));
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
        scripts::run(write, |req| async move {
            Ok(router.run(slot, Arc::new(req)).await?)
        })
        .await
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
