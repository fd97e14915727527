//! Redis Sentinel: standalone shards named by their master's name, whose address the
//! sentinels give ([`Master`]).
//!
//! Each master has a task that asks the sentinels (`SENTINEL get-master-addr-by-name`)
//! at start, every [`POLL`], when a call to the shard meets an outage (its address may
//! be stale: a connection error, a timeout, `READONLY`, `MASTERDOWN`), and when a
//! sentinel announces a failover on its pub/sub channels. An address is used only once
//! `ROLE` on it says `master`: during a failover the sentinels may name a replica that
//! is still being promoted. A new address bumps the master's generation; each of the
//! shard's connections compares it (one relaxed load) before its next call and, made
//! for an older one, is dropped and made again to the new master. So calls leave the
//! old master as soon as one sentinel tells of the switch: after `SENTINEL FAILOVER`
//! the old master goes on accepting writes for some seconds before it is turned into
//! a replica, and what it takes meanwhile is lost.
//!
//! While no master is known, calls fail with what stood in the way (sentinels that
//! do not answer, a refused password, a replica) and take the domain's failure mode
//! like any outage; a new master ends the shard's back-off at once, so
//! the next call goes to it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use tokio::sync::Notify;

use crate::store::{ErrorKind, StoreError};

use super::health::Health;
use super::{shard_name, ConfigError};

/// How often the sentinels are asked while nothing seems wrong: a backstop for a
/// failover announcement that was missed.
pub const POLL: Duration = Duration::from_secs(1);
/// Shortest gap between two questions to the sentinels while calls keep failing.
pub const MIN_GAP: Duration = Duration::from_millis(50);
/// A sentinel's channels that say a master moved or is moving.
const CHANNELS: [&str; 2] = ["+switch-master", "+failover-state-reconf-slaves"];

/// One master as the sentinels know it, and where it is now.
pub struct Master {
    /// The master's name with the sentinels; also the shard's name.
    pub name: String,
    /// The master URL's settings (TLS, user, password, db) around a placeholder
    /// address.
    template: ConnectionInfo,
    sentinels: Arc<[Client]>,
    /// The sentinel that answered last, asked first next time.
    first: AtomicUsize,
    current: Mutex<Option<Resolved>>,
    /// Why the last round found no master, while none is known: what calls fail with.
    problem: Mutex<Option<StoreError>>,
    /// Bumped whenever `current` changes; 0 until the first master is known.
    generation: AtomicU64,
    wake: Notify,
    timeout: Duration,
    config: ConnectionManagerConfig,
    health: Arc<Health>,
    /// A redis-rs connection to the current master (refunds, peeks, key counts),
    /// made again when the generation moves on.
    managed: Mutex<Option<(u64, ConnectionManager)>>,
}

/// A master's address that answered `ROLE` with `master`.
#[derive(Clone)]
pub struct Resolved {
    /// `host:port`.
    pub addr: String,
    pub info: ConnectionInfo,
    pub generation: u64,
}

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("name", &self.name)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// The sentinels' clients, from their URLs (`redis://[:password@]host:port`, or
/// `rediss://`).
pub fn sentinels(urls: &[String]) -> Result<Arc<[Client]>, ConfigError> {
    if urls.is_empty() {
        return Err(ConfigError::NoUrl);
    }
    urls.iter()
        .map(|u| {
            Client::open(u.as_str()).map_err(|e| ConfigError::Url {
                url: shard_name(u),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// A master given as its name, or as a URL whose host is its name
/// (`rediss://:password@mymaster/2`): the scheme, credentials and database are the
/// master's, the address comes from the sentinels.
pub fn parse_master(spec: &str) -> Result<(String, ConnectionInfo), ConfigError> {
    let url = if spec.contains("://") {
        spec.to_string()
    } else {
        format!("redis://{spec}")
    };
    let bad = |reason: String| ConfigError::Url {
        url: shard_name(spec),
        reason,
    };
    let info = url
        .as_str()
        .into_connection_info()
        .map_err(|e| bad(e.to_string()))?;
    let name = match info.addr() {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
        _ => return Err(bad("a master is named, not a socket".into())),
    };
    // The port is the sentinels' to say; one written here would be ignored.
    if shard_name(&url).contains(':') {
        return Err(bad(
            "a sentinel master is named, not addressed: give no port".into(),
        ));
    }
    if name.is_empty() {
        return Err(bad("no master name".into()));
    }
    Ok((name, info))
}

/// `template` pointed at `host:port`, keeping its TLS settings.
fn at(template: &ConnectionInfo, host: String, port: u16) -> ConnectionInfo {
    let addr = match template.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    template.clone().set_addr(addr)
}

/// A call's error while no master is known: the kind of what stood in the way (a
/// refused password reads as one), with the master's name.
fn unresolved(name: &str, problem: Option<&StoreError>) -> StoreError {
    let (kind, why) = match problem {
        Some(e) => (
            e.kind().unwrap_or(ErrorKind::Connection),
            e.message().to_string(),
        ),
        None => (ErrorKind::Connection, "not asked yet".to_string()),
    };
    StoreError::failed(kind, format!("no master known for {name}: {why}"))
}

impl Master {
    /// A master named `name` (its settings in `template`), its shard's `health`, and
    /// the task that follows its address, stopped when the master is dropped. Must
    /// run inside a Tokio runtime.
    pub fn spawn(
        name: String,
        template: ConnectionInfo,
        sentinels: Arc<[Client]>,
        health: Arc<Health>,
        timeout: Duration,
        config: ConnectionManagerConfig,
    ) -> Arc<Master> {
        let master = Arc::new(Master {
            name,
            template,
            sentinels,
            first: AtomicUsize::new(0),
            current: Mutex::new(None),
            problem: Mutex::new(None),
            generation: AtomicU64::new(0),
            wake: Notify::new(),
            timeout,
            config,
            health,
            managed: Mutex::new(None),
        });
        tokio::spawn(follow(Arc::downgrade(&master)));
        master
    }

    /// Changes whenever the master's address does (0: none known yet).
    pub fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    /// The current master's address, if one is known.
    pub fn current(&self) -> Option<Resolved> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The master's address; while none is known, an error saying what stood in
    /// the way (and the sentinels are asked again).
    pub fn resolved(&self) -> Result<Resolved, StoreError> {
        self.current().ok_or_else(|| {
            self.suspect();
            let problem = self.problem.lock().unwrap_or_else(|p| p.into_inner());
            unresolved(&self.name, problem.as_ref())
        })
    }

    /// A call met an outage: ask the sentinels again soon.
    pub fn suspect(&self) {
        self.wake.notify_one();
    }

    /// A redis-rs connection to the current master.
    pub fn managed(&self) -> Result<ConnectionManager, StoreError> {
        let now = self.resolved()?;
        let mut slot = self.managed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((generation, conn)) = &*slot {
            if *generation == now.generation {
                return Ok(conn.clone());
            }
        }
        let conn = self.connection_manager(&now)?;
        *slot = Some((now.generation, conn.clone()));
        Ok(conn)
    }

    /// A new lazily connected redis-rs connection to `to`.
    pub fn connection_manager(&self, to: &Resolved) -> Result<ConnectionManager, StoreError> {
        let client = Client::open(to.info.clone()).map_err(|e| super::classify::redis(&e))?;
        ConnectionManager::new_lazy_with_config(client, self.config.clone())
            .map_err(|e| super::classify::redis(&e))
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn async_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
    }

    /// Asks the sentinels once, starting with the one that answered last, and moves
    /// to the address they give if `ROLE` there says master. `conns` caches one
    /// connection per sentinel across calls.
    async fn resolve(&self, conns: &mut [Option<MultiplexedConnection>]) {
        let n = self.sentinels.len();
        let start = self.first.load(Relaxed) % n;
        let current = self.current();
        let mut problem = None;
        for i in (0..n).map(|k| (start + k) % n) {
            let (host, port) = match self.ask(i, &mut conns[i]).await {
                Ok(Some(addr)) => addr,
                Ok(None) => {
                    problem = Some(StoreError::failed(
                        ErrorKind::Connection,
                        format!("sentinel {} does not know the name", i + 1),
                    ));
                    continue;
                }
                Err(e) => {
                    problem = Some(e);
                    continue;
                }
            };
            self.first.store(i, Relaxed);
            let addr = format!("{host}:{port}");
            if current.as_ref().is_some_and(|c| c.addr == addr) {
                return;
            }
            let info = at(&self.template, host, port);
            match self.role(&info).await {
                Ok(true) => {
                    self.switch(addr, info, current.as_ref());
                    return;
                }
                // Named but not a master yet (a promotion under way), or not
                // reachable: another sentinel may know better; if none does, the
                // next round asks again.
                Ok(false) => {
                    tracing::debug!(master = %self.name, %addr, "sentinel names a replica");
                    problem = Some(StoreError::failed(
                        ErrorKind::ReadOnly,
                        format!("{addr} is not a master (yet)"),
                    ));
                }
                Err(e) => {
                    tracing::debug!(master = %self.name, %addr, error = %e, "ROLE failed");
                    problem = Some(StoreError::failed(
                        e.kind().unwrap_or(ErrorKind::Connection),
                        format!("{addr}: {}", e.message()),
                    ));
                }
            }
        }
        if current.is_none() {
            *self.problem.lock().unwrap_or_else(|p| p.into_inner()) = problem;
        }
    }

    fn switch(&self, addr: String, info: ConnectionInfo, from: Option<&Resolved>) {
        let generation = self.generation.load(Relaxed) + 1;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Resolved {
            addr: addr.clone(),
            info,
            generation,
        });
        self.generation.store(generation, Relaxed);
        self.health.retry_now();
        match from {
            Some(old) => tracing::warn!(
                master = %self.name, from = %old.addr, to = %addr, "redis master moved"
            ),
            None => tracing::info!(master = %self.name, %addr, "redis master found"),
        }
    }

    /// `SENTINEL get-master-addr-by-name` on sentinel `i`; `None` when it does not
    /// know the name.
    async fn ask(
        &self,
        i: usize,
        conn: &mut Option<MultiplexedConnection>,
    ) -> Result<Option<(String, u16)>, StoreError> {
        let asked = async {
            if conn.is_none() {
                let c = self.sentinels[i]
                    .get_multiplexed_async_connection_with_config(&self.async_config())
                    .await?;
                *conn = Some(c);
            }
            let c = conn.as_mut().expect("connected above");
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.name)
                .query_async::<Option<(String, u16)>>(c)
                .await
        };
        let failed = |e: StoreError| {
            StoreError::failed(
                e.kind().unwrap_or(ErrorKind::Connection),
                format!("sentinel {}: {}", i + 1, e.message()),
            )
        };
        match tokio::time::timeout(self.timeout, asked).await {
            Ok(Ok(addr)) => Ok(addr),
            Ok(Err(e)) => {
                tracing::debug!(master = %self.name, sentinel = i, error = %e, "sentinel failed");
                *conn = None;
                Err(failed(super::classify::redis(&e)))
            }
            Err(_) => {
                *conn = None;
                Err(failed(StoreError::failed(ErrorKind::Timeout, "no answer")))
            }
        }
    }

    /// Whether the server at `info` says it is a master.
    async fn role(&self, info: &ConnectionInfo) -> Result<bool, StoreError> {
        let asked = async {
            let client = Client::open(info.clone())?;
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&self.async_config())
                .await?;
            redis::cmd("ROLE")
                .query_async::<redis::Value>(&mut conn)
                .await
        };
        match tokio::time::timeout(self.timeout, asked).await {
            Ok(Ok(value)) => Ok(is_master(&value)),
            Ok(Err(e)) => Err(super::classify::redis(&e)),
            Err(_) => Err(StoreError::Timeout),
        }
    }
}

/// Whether a `ROLE` reply starts with `master`.
fn is_master(role: &redis::Value) -> bool {
    use redis::Value;
    let Value::Array(items) = role else {
        return false;
    };
    match items.first() {
        Some(Value::BulkString(b)) => b == b"master",
        Some(Value::SimpleString(s)) => s == "master",
        _ => false,
    }
}

/// Follows a master's address until it is dropped: asks at once, then whenever
/// woken (at most once per [`MIN_GAP`]) or every [`POLL`].
async fn follow(master: Weak<Master>) {
    let mut conns: Vec<Option<MultiplexedConnection>> = Vec::new();
    loop {
        let Some(m) = master.upgrade() else { return };
        conns.resize_with(m.sentinels.len(), || None);
        m.resolve(&mut conns).await;
        // A wake-up that came while resolving is kept by the Notify's permit, so
        // a failure seen meanwhile is asked about again after the gap.
        tokio::time::sleep(MIN_GAP).await;
        let wait = if m.current().is_none() { MIN_GAP } else { POLL };
        let _ = tokio::time::timeout(wait, m.wake.notified()).await;
    }
}

/// Listens on each sentinel's failover channels and wakes every master's task on an
/// announcement, until all `masters` are dropped. Must run inside a Tokio runtime.
pub fn listen(sentinels: &[Client], masters: Vec<Weak<Master>>, timeout: Duration) {
    let masters: Arc<[Weak<Master>]> = masters.into();
    for client in sentinels {
        tokio::spawn(subscribe(client.clone(), masters.clone(), timeout));
    }
}

fn alive(masters: &[Weak<Master>]) -> bool {
    masters.iter().any(|m| m.strong_count() > 0)
}

async fn subscribe(client: Client, masters: Arc<[Weak<Master>]>, timeout: Duration) {
    while alive(&masters) {
        let connected = async {
            let mut pubsub = client.get_async_pubsub().await?;
            for channel in CHANNELS {
                pubsub.subscribe(channel).await?;
            }
            Ok::<_, redis::RedisError>(pubsub)
        };
        let pubsub = match tokio::time::timeout(timeout, connected).await {
            Ok(Ok(p)) => p,
            _ => {
                // The sentinel is down: polling covers for it; try again later.
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        let mut messages = pubsub.into_on_message();
        while alive(&masters) {
            match tokio::time::timeout(POLL, messages.next()).await {
                Ok(Some(msg)) => {
                    tracing::debug!(channel = msg.get_channel_name(), "sentinel announcement");
                    for m in masters.iter().filter_map(Weak::upgrade) {
                        m.suspect();
                    }
                }
                Ok(None) => break,
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_are_named_with_their_own_settings() {
        let (name, info) = parse_master("mymaster").unwrap();
        assert_eq!(name, "mymaster");
        assert_eq!(info.redis_settings().db(), 0);
        let (name, info) = parse_master("rediss://user:pw@cache-a/3").unwrap();
        assert_eq!(name, "cache-a");
        assert_eq!(info.redis_settings().username(), Some("user"));
        assert_eq!(info.redis_settings().password(), Some("pw"));
        assert_eq!(info.redis_settings().db(), 3);
        let moved = at(&info, "10.0.0.7".into(), 6380);
        match moved.addr() {
            ConnectionAddr::TcpTls { host, port, .. } => {
                assert_eq!((host.as_str(), *port), ("10.0.0.7", 6380));
            }
            other => panic!("TLS lost: {other:?}"),
        }
        assert_eq!(moved.redis_settings().password(), Some("pw"));
        let plain = at(&parse_master("m").unwrap().1, "127.0.0.1".into(), 1);
        assert_eq!(plain.addr(), &ConnectionAddr::Tcp("127.0.0.1".into(), 1));
    }

    #[test]
    fn a_master_with_a_port_or_no_name_is_refused() {
        let e = parse_master("redis://mymaster:6379")
            .unwrap_err()
            .to_string();
        assert!(e.contains("give no port"), "{e}");
        assert!(parse_master("redis://:pw@/0").is_err());
        assert!(parse_master("redis+unix:///tmp/x.sock").is_err());
    }

    #[test]
    fn only_a_master_role_counts() {
        use redis::Value;
        let master = Value::Array(vec![
            Value::BulkString(b"master".to_vec()),
            Value::Int(10),
            Value::Array(vec![]),
        ]);
        assert!(is_master(&master));
        let replica = Value::Array(vec![
            Value::BulkString(b"slave".to_vec()),
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(6379),
            Value::BulkString(b"connected".to_vec()),
            Value::Int(10),
        ]);
        assert!(!is_master(&replica));
        assert!(!is_master(&Value::Nil));
        assert!(!is_master(&Value::Array(vec![])));
    }
}
