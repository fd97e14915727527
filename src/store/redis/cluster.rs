//! Counters on a Redis Cluster: each script call on the node of its keys' slot,
//! through the cluster client ([`sluice_redis::cluster`]), with one health for the
//! whole cluster.

use std::sync::Arc;
use std::time::Duration;

use sluice_redis::cluster::{self, Router};
use sluice_redis::{Request, Target, Value};

use crate::algorithm::Micros;
use crate::store::{Report, StoreError};

use super::health::Health;
use super::scripts::{self, By, Call, Group, Scripts};
use super::{bad_url, expire, shard_name, ConfigError};

pub struct Cluster {
    router: Arc<Router>,
    pub health: Health,
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
            .map(|u| Target::parse(u, timeout).map_err(|e| bad_url(u, e)))
            .collect::<Result<Vec<_>, _>>()?;
        let router = Router::new(targets, timeout).ok_or(ConfigError::NoUrl)?;
        Ok(Cluster {
            router,
            health: Health::new("cluster".to_string(), report),
            seeds: urls.iter().map(|u| shard_name(u)).collect(),
        })
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
