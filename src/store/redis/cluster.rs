//! A Redis Cluster: calls routed to the node that serves their keys' slot.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use crate::store::{Report, StoreError};

use super::health::Health;
use super::scripts::Call;
use super::wire::Value;
use super::{bad_url, classify, expire, shard_name, ConfigError};

pub struct Cluster {
    client: ClusterClient,
    /// Connected on first use, so sluice starts while the cluster is down.
    conn: tokio::sync::OnceCell<ClusterConnection>,
    pub health: Health,
    /// The seed nodes' `host:port`, for `/debug/store`.
    pub seeds: Vec<String>,
}

fn value(v: redis::Value) -> Value {
    match v {
        redis::Value::Nil => Value::Nil,
        redis::Value::Int(i) => Value::Int(i),
        redis::Value::BulkString(b) => Value::Bulk(b),
        redis::Value::SimpleString(s) => Value::Status(s),
        redis::Value::Okay => Value::Status("OK".into()),
        redis::Value::Array(a) => Value::Array(a.into_iter().map(value).collect()),
        other => Value::Error(format!("unexpected reply {other:?}")),
    }
}

impl Cluster {
    pub fn new(
        urls: &[String],
        timeout: Duration,
        report: Option<Arc<dyn Report>>,
    ) -> Result<Cluster, ConfigError> {
        let client = ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(1)
            // A reply that redis-rs waits on before its retry (CLUSTERDOWN,
            // TRYAGAIN, LOADING, MASTERDOWN) waits 1.28 s or more by default: far
            // past the store timeout, so the shard would see timeouts instead of
            // the reply. A retry within a few milliseconds, then the reply.
            .min_retry_wait(1)
            .max_retry_wait(5)
            .build()
            .map_err(|e| bad_url(&urls.join(","), &e))?;
        Ok(Cluster {
            client,
            conn: tokio::sync::OnceCell::new(),
            health: Health::new("cluster".to_string(), report),
            seeds: urls.iter().map(|u| shard_name(u)).collect(),
        })
    }

    /// Runs `parts` (the command's name first) on the node of the slot of its keys.
    async fn send(&self, parts: &[&[u8]]) -> Result<Value, StoreError> {
        self.send_rs(parts).await.map_err(|e| classify::redis(&e))
    }

    async fn send_rs(&self, parts: &[&[u8]]) -> Result<Value, redis::RedisError> {
        let mut cmd = redis::cmd(std::str::from_utf8(parts[0]).unwrap_or("PING"));
        for p in &parts[1..] {
            cmd.arg(*p);
        }
        let mut conn = self
            .conn
            .get_or_try_init(|| self.client.get_async_connection())
            .await?
            .clone();
        let v: redis::Value = cmd.query_async(&mut conn).await?;
        Ok(value(v))
    }

    /// A script call on the node of its keys' slot (all keys share one).
    pub async fn script(&self, call: &Call<'_>) -> Result<Value, StoreError> {
        let with = |text: bool| {
            let mut parts = call.parts(text);
            let keys = call.keys().len().to_string();
            let mut all: Vec<Vec<u8>> = parts.drain(..2).map(<[u8]>::to_vec).collect();
            all.push(keys.into_bytes());
            all.extend(parts.into_iter().map(<[u8]>::to_vec));
            all
        };
        let first = with(false);
        let refs: Vec<&[u8]> = first.iter().map(Vec::as_slice).collect();
        match self.send_rs(&refs).await {
            Err(e) if e.code() == Some("NOSCRIPT") || e.to_string().starts_with("NoScript") => {
                let again = with(true);
                let refs: Vec<&[u8]> = again.iter().map(Vec::as_slice).collect();
                self.send(&refs).await
            }
            r => r.map_err(|e| classify::redis(&e)),
        }
    }

    /// A command on the node of `parts[1]`'s slot (its first key).
    pub async fn command(&self, parts: &[&[u8]]) -> Result<Value, StoreError> {
        self.send(parts).await
    }

    /// DBSIZE summed over the masters; `None` while not connected or failing.
    pub async fn dbsize(&self) -> Option<usize> {
        let mut conn = self.conn.get()?.clone();
        let cmd = redis::cmd("DBSIZE");
        tokio::time::timeout(Duration::from_secs(1), cmd.query_async::<usize>(&mut conn))
            .await
            .ok()?
            .ok()
    }

    /// The expire-cycle warnings of every master ([`expire::check_cluster`]).
    pub async fn expire_warnings(&self, store_timeout: Duration) -> Vec<String> {
        match self.conn.get() {
            Some(conn) => expire::check_cluster(&mut conn.clone(), store_timeout).await,
            None => Vec::new(),
        }
    }
}
