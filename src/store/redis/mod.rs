//! The Redis counter store: counters on standalone Redis shards or a Redis Cluster,
//! decided by Lua scripts that mirror `src/algorithm`.
//!
//! A request's hits are decided per shard it touches (usually one) by a script that
//! checks every hit on that shard and consumes only if the request passes the shared
//! [`admitted`] rule. When a request spans shards and is denied as a whole, the shards
//! that consumed get their hits back through a refund script. Every call goes over
//! Sluice's own Redis client ([`sluice_redis`]): a standalone shard's decide calls
//! over its tasks' connections, its refunds, peeks and key counts over a small pool,
//! so connections do not grow with callers.
//!
//! On standalone shards concurrent requests are also coalesced ([`coalesce`]): each
//! shard has at most two decide calls in flight, and the requests that queue up
//! meanwhile go together in the next call, which decides them one after another
//! (each all-or-nothing, as if they had arrived back to back). Redis pays a fixed
//! cost per call (dispatch, the script's setup, `TIME`) on top of the cost per hit,
//! so under load this cuts its CPU per decision (docs/performance-notes.md, "Redis
//! path"); an idle shard still gets a lone request at once. One call counts as one
//! success or failure for the shard's health. In a cluster each request makes its
//! own call per slot.
//! A request over several shards is decided by those that answer by its deadline:
//! one that fails or hangs leaves its own hits undecided, and under `failure_mode:
//! open` only those are lifted (`spread`).
//! Denials are cached locally until their retry time ([`cache`]); shards that keep
//! failing are backed off ([`health`]), and shards no call has answered lately are
//! asked whether they answer, so their health follows them without traffic
//! (`ping`). When a shard first answers, its expire cycle is checked against the
//! store timeout once ([`expire`]).
//!
//! Standalone shards may also be named masters of Redis Sentinel ([`sentinel`]):
//! their connections follow the master the sentinels name.
//!
//! Needs Redis 6.0 or later (scripts read `TIME` and write, which relies on effect
//! replication, and the refund uses `SET ... KEEPTTL`); tested with 7.0, where
//! standalone shards are called by function (`FCALL`, see [`scripts::Library`]). Private CAs
//! for `rediss://` are trusted through `SSL_CERT_FILE` / `SSL_CERT_DIR`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use sluice_redis::sentinel::{self, Master};
use sluice_redis::{Pool, Request, Target, Value};

use crate::algorithm::{Micros, Verdict};
use crate::clock::Clock;

use super::probe::{split_address, Probe, StoreCall};
use super::{
    admitted, Board, Hit, Report, Sentenced, ShardStatus, Spend, Store, StoreError, Strike,
    Verdicts,
};

mod board;
pub mod cache;
pub mod cluster;
pub mod coalesce;
mod demand;
mod error;
pub mod expire;
pub mod health;
mod local;
pub mod offset;
mod ping;
pub mod scripts;
pub mod shard;
mod spread;

use cache::DenialCache;
use cluster::Cluster;
use coalesce::Coalescer;
use health::Health;
use scripts::{Call, Group, HitArgs, Reply, Scripts};

/// How to reach Redis and how the store behaves.
#[derive(Debug, Clone)]
pub struct Options {
    /// `redis://[:password@]host:port[/db]` or `rediss://` (TLS) URLs.
    pub urls: Vec<String>,
    /// The URLs are seed nodes of one Redis Cluster rather than standalone shards.
    pub cluster: bool,
    /// Redis Sentinel URLs; when given, each of `urls` names a master
    /// ([`sentinel::parse_master`]), one shard each.
    pub sentinels: Vec<String>,
    /// Connect and response timeout of the connections. The limiter's store timeout
    /// bounds each request anyway; this bounds how long a dead connection lingers.
    pub timeout: Duration,
    /// Longest wait for one script call before it counts as a shard failure; the
    /// server sets it to `--store-timeout`, so a hung shard is backed off as soon as
    /// the limiter gives up on it.
    pub call_timeout: Duration,
    /// Prepended to every key (no `{`: the placement is the key's hash tag).
    pub prefix: String,
    /// Most over-limit decisions remembered locally; 0 turns the cache off.
    pub cache_capacity: usize,
    /// Tests only: decide at this clock's time instead of Redis `TIME`.
    pub fixed_clock: Option<Arc<dyn Clock>>,
    /// How often the key count (`sluice_active_keys`) is read from the shards.
    pub key_count_interval: Duration,
}

impl Options {
    pub fn new(urls: Vec<String>, cluster: bool) -> Self {
        Options {
            urls,
            cluster,
            sentinels: Vec::new(),
            timeout: Duration::from_secs(1),
            call_timeout: Duration::from_secs(1),
            prefix: "sluice:".to_string(),
            cache_capacity: 100_000,
            fixed_clock: None,
            key_count_interval: Duration::from_secs(10),
        }
    }
}

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("no Redis URL given")]
    NoUrl,
    #[error("invalid Redis URL {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("the key prefix must not contain '{{' (the placement is the hash tag)")]
    Prefix,
    #[error("sentinel master {0} is given twice")]
    DuplicateMaster(String),
    #[error("redis shard {0} is given twice: each shard must be another server or database")]
    DuplicateShard(String),
    #[error("Redis Sentinel is for standalone shards, not a cluster")]
    SentinelCluster,
}

/// A shard (or slot) and the hits of a request it consumed, with their refund tokens.
type Spent = (usize, Vec<(usize, i64)>);

/// A standalone shard's connections off the decide path: to its URL, or to its
/// Sentinel master's current address.
enum ShardConn {
    Fixed(Arc<Pool>),
    Sentinel(Arc<Master>),
}

impl ShardConn {
    fn get(&self) -> Result<Arc<Pool>, StoreError> {
        match self {
            ShardConn::Fixed(p) => Ok(p.clone()),
            ShardConn::Sentinel(m) => Ok(m.pool()?),
        }
    }
}

/// A call's health: a standalone shard's, borrowed, or a cluster master's.
enum HealthOf<'a> {
    Shard(&'a Health),
    Node(Arc<Health>),
}

impl std::ops::Deref for HealthOf<'_> {
    type Target = Health;

    fn deref(&self) -> &Health {
        match self {
            HealthOf::Shard(h) => h,
            HealthOf::Node(h) => h,
        }
    }
}

/// A cluster's target is its slot (below 16384).
fn slot_of(target: usize) -> u16 {
    u16::try_from(target).unwrap_or(u16::MAX)
}

struct Shard {
    /// For refunds, peeks and key counts; decide calls go through the coalescer.
    conn: ShardConn,
    health: Arc<Health>,
    coalescer: Coalescer,
    offset: offset::Offset,
}

enum Backend {
    Shards(Vec<Shard>),
    Cluster(Box<Cluster>),
}

struct Inner {
    backend: Backend,
    scripts: Scripts,
    cache: DenialCache,
    prefix: String,
    fixed_clock: Option<Arc<dyn Clock>>,
    call_timeout: Duration,
    /// Origin of the local monotonic clock the cache runs on.
    epoch: Instant,
    /// Keys on all shards at the last count (DBSIZE), for `sluice_active_keys`.
    keys: AtomicUsize,
    report: Option<Arc<dyn Report>>,
}

/// Counters in Redis. Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("shards", &self.shard_names())
            .finish()
    }
}

/// `host:port` of a URL (a socket's path), without credentials, for logs and metric labels.
pub fn shard_name(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    if scheme.ends_with("unix") {
        // A socket's path, without the settings after it.
        return rest.split(['?', '#']).next().unwrap_or(rest).to_string();
    }
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?', '#'])
        .next()
        .unwrap_or(rest)
        .to_string()
}

fn bad_url(url: &str, reason: impl std::fmt::Display) -> ConfigError {
    ConfigError::Url {
        url: shown(url),
        reason: reason.to_string(),
    }
}

/// A URL as a refusal shows it: its `host:port` ([`shard_name`]), or, where it has
/// no `://` to find that by (a typo), as written after any credentials and before
/// any settings.
fn shown(url: &str) -> String {
    if url.contains("://") {
        return shard_name(url);
    }
    let rest = url.rsplit_once('@').map_or(url, |(_, r)| r);
    rest.split(['?', '#']).next().unwrap_or(rest).to_string()
}

/// The sentinels, from their URLs (`redis://[:password@]host:port`, or
/// `rediss://`).
fn sentinels(urls: &[String], timeout: Duration) -> Result<Arc<[Target]>, ConfigError> {
    if urls.is_empty() {
        return Err(ConfigError::NoUrl);
    }
    urls.iter().map(|u| target(u, timeout)).collect()
}

/// The target of `url`; a client certificate out of its validity period is warned
/// of, as Redis will refuse it.
fn target(url: &str, timeout: Duration) -> Result<Target, ConfigError> {
    let target = Target::parse(url, timeout).map_err(|e| bad_url(url, e))?;
    if let Some((cert, _)) = target.tls.as_ref().and_then(|t| t.client.as_ref()) {
        let peer = format!("Redis {}", shard_name(url));
        crate::cert::warn_if_out_of_date(cert, &peer, crate::cert::now_seconds());
    }
    Ok(target)
}

/// A key prefix must hold no `{`: the hash tag of a key is the placement after it.
pub fn check_prefix(prefix: &str) -> Result<(), ConfigError> {
    if prefix.contains('{') {
        return Err(ConfigError::Prefix);
    }
    Ok(())
}

impl RedisStore {
    /// Sets up the connections. They connect lazily, so this succeeds while Redis is
    /// down (requests then take the failure mode). Must run inside a Tokio runtime.
    /// `report` hears of every failed call and cached denial (metrics, in the server).
    pub fn new(opts: Options, report: Option<Arc<dyn Report>>) -> Result<Self, ConfigError> {
        if opts.urls.is_empty() {
            return Err(ConfigError::NoUrl);
        }
        check_prefix(&opts.prefix)?;
        if opts.cluster && !opts.sentinels.is_empty() {
            return Err(ConfigError::SentinelCluster);
        }
        let scripts = Scripts::default();
        let backend = if opts.cluster {
            let cluster =
                Cluster::new(&opts.urls, opts.timeout, opts.call_timeout, report.clone())?;
            cluster.warm(&scripts.decide);
            Backend::Cluster(Box::new(cluster))
        } else {
            let mut shards = Vec::with_capacity(opts.urls.len());
            if !opts.sentinels.is_empty() {
                let sentinels = sentinels(&opts.sentinels, opts.timeout)?;
                let mut masters: Vec<Arc<Master>> = Vec::with_capacity(opts.urls.len());
                for spec in &opts.urls {
                    let (name, template) =
                        sentinel::parse_master(spec, opts.timeout).map_err(|e| bad_url(spec, e))?;
                    if masters.iter().any(|m| m.name == name) {
                        return Err(ConfigError::DuplicateMaster(name));
                    }
                    let health = Arc::new(
                        Health::new(name.clone(), report.clone())
                            .with_call_timeout(opts.call_timeout),
                    );
                    // A new master ends the shard's back-off at once.
                    let found = health.clone();
                    let master = Master::spawn(
                        name,
                        template,
                        sentinels.clone(),
                        move || found.retry_now(),
                        opts.timeout,
                    );
                    let links = (0..coalesce::CALLS_IN_FLIGHT)
                        .map(|_| coalesce::Link::unrouted())
                        .collect();
                    let coalescer = Coalescer::spawn(
                        links,
                        Some(master.clone()),
                        scripts.clone(),
                        health.clone(),
                        opts.call_timeout,
                    );
                    shards.push(Shard {
                        conn: ShardConn::Sentinel(master.clone()),
                        health,
                        coalescer,
                        offset: offset::Offset::default(),
                    });
                    masters.push(master);
                }
                sentinel::listen(&sentinels, masters.iter().map(Arc::downgrade).collect());
            }
            let mut seen = std::collections::HashSet::new();
            for url in opts.urls.iter().filter(|_| opts.sentinels.is_empty()) {
                let target = target(url, opts.timeout)?;
                // Twice on one server and database, a shard would count its share of
                // keys on the same counters as the other, under two health states.
                if !seen.insert((shard_name(url), target.db)) {
                    return Err(ConfigError::DuplicateShard(shard_name(url)));
                }
                let health = Arc::new(
                    Health::new(shard_name(url), report.clone())
                        .with_call_timeout(opts.call_timeout),
                );
                let links = (0..coalesce::CALLS_IN_FLIGHT)
                    .map(|_| coalesce::Link::new(target.clone()))
                    .collect();
                let coalescer = Coalescer::spawn(
                    links,
                    None,
                    scripts.clone(),
                    health.clone(),
                    opts.call_timeout,
                );
                shards.push(Shard {
                    conn: ShardConn::Fixed(Arc::new(Pool::new(target))),
                    health,
                    coalescer,
                    offset: offset::Offset::default(),
                });
            }
            Backend::Shards(shards)
        };
        let inner = Arc::new(Inner {
            backend,
            scripts,
            cache: DenialCache::new(opts.cache_capacity),
            prefix: opts.prefix,
            fixed_clock: opts.fixed_clock,
            call_timeout: opts.call_timeout,
            epoch: Instant::now(),
            keys: AtomicUsize::new(0),
            report,
        });
        tokio::spawn(count_keys(Arc::downgrade(&inner), opts.key_count_interval));
        tokio::spawn(ping::watch(Arc::downgrade(&inner)));
        Ok(RedisStore { inner })
    }

    /// The shards' names (host:port), or `cluster`.
    pub fn shard_names(&self) -> Vec<String> {
        match &self.inner.backend {
            Backend::Shards(s) => s.iter().map(|s| s.health.name.to_string()).collect(),
            Backend::Cluster(c) => vec![c.health.name.to_string()],
        }
    }

    /// Over-limit decisions currently cached.
    pub fn cached_denials(&self) -> usize {
        self.inner.cache.len()
    }

    /// Whether the shard at `index` is backing off (in a cluster, any master).
    pub fn shard_down(&self, index: usize) -> bool {
        match &self.inner.backend {
            Backend::Shards(s) => s[index.min(s.len() - 1)].health.is_down(),
            Backend::Cluster(c) => c.is_down(),
        }
    }
}

impl Inner {
    /// Time for the local cache: the test clock, or microseconds on a monotonic clock.
    fn local_now(&self) -> Micros {
        match &self.fixed_clock {
            Some(c) => c.now(),
            None => self.epoch.elapsed().as_micros() as Micros,
        }
    }

    /// The shard (standalone) or slot (cluster) a hit's counter belongs to.
    fn target(&self, hit: &Hit) -> usize {
        match &self.backend {
            Backend::Shards(s) => shard::jump_hash(hit.placement, s.len()),
            Backend::Cluster(_) => usize::from(shard::placement_slot(hit.placement)),
        }
    }

    /// Whether every hit is decided by one script call: then no refund can be needed.
    fn one_target(&self, hits: &[Hit]) -> bool {
        let Some(first) = hits.first() else {
            return true;
        };
        match &self.backend {
            Backend::Shards(s) => {
                let t = shard::jump_hash(first.placement, s.len());
                hits.iter()
                    .all(|h| shard::jump_hash(h.placement, s.len()) == t)
            }
            // The slot follows from the placement (the hash tag) alone.
            Backend::Cluster(_) => hits.iter().all(|h| h.placement == first.placement),
        }
    }

    /// The health a call to `target` counts for: the standalone shard's, or in a
    /// cluster, the health of the master serving that slot.
    fn health(&self, target: usize) -> HealthOf<'_> {
        match &self.backend {
            Backend::Shards(s) => HealthOf::Shard(&s[target.min(s.len() - 1)].health),
            Backend::Cluster(c) => HealthOf::Node(c.health_of(slot_of(target))),
        }
    }

    /// Longest wait for a refund or a peek: bounded, so a hung shard cannot hold
    /// them forever, but not as short as a decision's store timeout.
    fn off_path_wait(&self) -> Duration {
        self.call_timeout.max(Duration::from_secs(1))
    }

    /// One script call off the decide path (refunds, peeks, the sentence list,
    /// RLQS demand): on standalone shard `target`, or on the cluster, which routes
    /// it by its keys; at most `wait`.
    async fn invoke_at(
        &self,
        target: usize,
        call: &Call<'_>,
        wait: Duration,
    ) -> Result<Value, StoreError> {
        let sent = async {
            match &self.backend {
                Backend::Shards(s) => scripts::invoke(&*s[target].conn.get()?, call).await,
                Backend::Cluster(c) => c.script(call).await,
            }
        };
        match tokio::time::timeout(wait, sent).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout),
        }
    }

    /// When a call sent at `sent` (local clock) was decided, from the time its shard
    /// answered with (see `offset`); a cluster's calls count from the send.
    fn decided_at(&self, target: usize, sent: Micros, shard_now: Micros) -> Micros {
        match &self.backend {
            Backend::Shards(s) => s[target].offset.decided_at(sent, shard_now),
            Backend::Cluster(_) => sent,
        }
    }

    /// Decides `hits`, which all live on one shard (or slot), the usual case: one
    /// call that consumes all or nothing, so nothing to give back.
    async fn decide_one(
        &self,
        hits: &[Hit],
        probe: Option<&dyn Probe>,
    ) -> Result<Verdicts, StoreError> {
        let sent = self.local_now();
        if let Some(v) = self.cached(hits, sent) {
            return Ok(v);
        }
        let Some(first) = hits.first() else {
            return Ok(Verdicts {
                admitted: true,
                ..Verdicts::default()
            });
        };
        let target = self.target(first);
        let keys: Vec<String> = hits
            .iter()
            .map(|h| shard::redis_key(&self.prefix, h))
            .collect();
        let health = self.health(target);
        health.check()?;
        let fixed_now = self.fixed_clock.as_ref().map(|c| c.now());
        let group = Group {
            keys,
            hits: hits.iter().map(HitArgs::new).collect(),
            quota_elsewhere: false,
        };
        let reply = self
            .decide_group(target, &health, group, fixed_now, probe)
            .await?;
        let decided = self.decided_at(target, sent, reply.now);
        let verdicts: Vec<Verdict> = reply.verdicts.iter().map(|&(v, _)| v).collect();
        let admitted = admitted(hits.iter().map(|h| h.mode), &verdicts);
        self.cache
            .remember(hits, &verdicts, admitted, decided.min(self.local_now()));
        Ok(Verdicts {
            admitted,
            verdicts,
            now: None,
            failed: None,
        })
    }

    /// One group's decide call on `target`, whose health the caller has checked;
    /// `probe` hears of it.
    async fn decide_group(
        &self,
        target: usize,
        health: &Health,
        group: Group,
        fixed_now: Option<Micros>,
        probe: Option<&dyn Probe>,
    ) -> Result<Reply, StoreError> {
        let Some(probe) = probe else {
            return self.send_group(target, health, group, fixed_now).await;
        };
        let mut watch = Watch {
            inner: self,
            probe,
            target,
            keys: group.keys.len(),
            started: SystemTime::now(),
            told: false,
        };
        let result = self.send_group(target, health, group, fixed_now).await;
        watch.told = true;
        self.tell(
            probe,
            target,
            "decide",
            watch.keys,
            watch.started,
            result.as_ref().err(),
        );
        result
    }

    /// Tells `probe` of a call of `script` on `target` that began at `started` and
    /// has just ended.
    pub(super) fn tell(
        &self,
        probe: &dyn Probe,
        target: usize,
        script: &'static str,
        keys: usize,
        started: SystemTime,
        error: Option<&StoreError>,
    ) {
        // Only a sampled call gets here: the Sentinel or cluster master's address is
        // copied. Only decide calls go by function; refunds and the cluster's calls by
        // script. A cluster call names the master the slot map gives the slot (a
        // MOVED reply may take it elsewhere).
        let sentinel_addr;
        let cluster_addr;
        let (address, operation) = match &self.backend {
            Backend::Shards(s) => {
                let shard = &s[target.min(s.len() - 1)];
                let address = match &shard.conn {
                    ShardConn::Fixed(_) => Some(&*shard.health.name),
                    ShardConn::Sentinel(m) => {
                        sentinel_addr = m.current().map(|r| r.addr);
                        sentinel_addr.as_deref()
                    }
                };
                let operation = match script {
                    "decide" => shard.health.decide_command(),
                    _ => "EVALSHA",
                };
                (address, operation)
            }
            Backend::Cluster(c) => {
                cluster_addr = c.master_of(slot_of(target));
                (cluster_addr.as_deref(), "EVALSHA")
            }
        };
        let (host, port) = address.map_or((None, None), |a| {
            let (h, p) = split_address(a);
            (Some(h), p)
        });
        probe.call(&StoreCall {
            system: "redis",
            host,
            port,
            operation,
            script,
            keys,
            started,
            ended: SystemTime::now(),
            error,
        });
    }

    /// A standalone shard's call goes through its coalescer, which keeps the
    /// shard's health itself; a cluster's counts for `health`, its master's.
    async fn send_group(
        &self,
        target: usize,
        health: &Health,
        group: Group,
        fixed_now: Option<Micros>,
    ) -> Result<Reply, StoreError> {
        let cluster = match &self.backend {
            Backend::Shards(s) => return s[target].coalescer.decide(group, fixed_now).await,
            Backend::Cluster(c) => c,
        };
        let guard = health.guard();
        let sent = cluster.decide(&self.scripts, &group, fixed_now);
        let result = match tokio::time::timeout(self.call_timeout, sent).await {
            Ok(Ok(value)) => scripts::integers(value)
                .and_then(|v| scripts::parse_replies(&v, &[group.hits.len()]))
                .map(|mut r| r.remove(0)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Timeout),
        };
        guard.finish(&result);
        if result.is_ok() {
            // The cluster answers: what calls failed before the map placed their
            // slots says nothing any more.
            cluster.health.success();
        }
        result
    }

    /// Gives back what the listed groups consumed. Failures are logged and counted:
    /// those hits stay spent until their counters expire.
    async fn refund(&self, hits: &[Hit], groups: &[Spent]) {
        let calls = groups.iter().map(|(target, consumed)| async move {
            let call = scripts::refund_call(&self.scripts, &self.prefix, hits, consumed);
            let result = self.invoke_at(*target, &call, self.off_path_wait()).await;
            if let Err(e) = result {
                let health = self.health(*target);
                tracing::debug!(shard = %health.name, error = %e, "refund failed");
                health.failure(&e);
            }
        });
        futures::future::join_all(calls).await;
    }

    /// [`Store::peek`]: one read-only script call per shard (or slot) the hits live
    /// on, off the request path (no coalescing, no denial cache: the counters as
    /// Redis holds them).
    async fn peek(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        let keys: Vec<String> = hits
            .iter()
            .map(|h| shard::redis_key(&self.prefix, h))
            .collect();
        let mut targets: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, h) in hits.iter().enumerate() {
            let t = self.target(h);
            match targets.iter_mut().find(|(x, _)| *x == t) {
                Some((_, members)) => members.push(i),
                None => targets.push((t, vec![i])),
            }
        }
        let fixed_now = self.fixed_clock.as_ref().map(|c| c.now());
        let mut verdicts = vec![Verdict::default(); hits.len()];
        for (target, members) in targets {
            let group: Vec<&Hit> = members.iter().map(|&i| &hits[i]).collect();
            let group_keys: Vec<String> = members.iter().map(|&i| keys[i].clone()).collect();
            let call = scripts::peek_call(&self.scripts, &group, &group_keys, fixed_now);
            let values = self.invoke_at(target, &call, self.off_path_wait()).await?;
            let values = scripts::integers(values)?;
            for (&i, v) in members
                .iter()
                .zip(scripts::parse_peek(&values, group.len())?)
            {
                verdicts[i] = v;
            }
        }
        Ok(Verdicts {
            admitted: admitted(hits.iter().map(|h| h.mode), &verdicts),
            verdicts,
            now: None,
            failed: None,
        })
    }

    /// The cached denial of `hits`, if one still holds.
    fn cached(&self, hits: &[Hit], now: Micros) -> Option<Verdicts> {
        // A charge or a refund is spent whatever the verdict: it must reach Redis.
        // A refund gives room back, so what was remembered of its keys goes (a
        // denial another request caches while the refund is on its way may outlive
        // it: until its retry time at most).
        if hits.iter().any(|h| h.spend.always()) {
            let refunded = hits.iter().filter(|h| h.spend == Spend::Refund);
            self.cache.forget(refunded.map(|h| h.key.as_str()));
            return None;
        }
        let v = self.cache.lookup(hits, now)?;
        if let Some(r) = &self.report {
            r.denial_cache_answer();
        }
        Some(v)
    }
}

/// A probed decide call; one the limiter stops waiting for (its store timeout) is
/// told as timed out when dropped, so the trace shows where the time went.
struct Watch<'a> {
    inner: &'a Inner,
    probe: &'a dyn Probe,
    target: usize,
    keys: usize,
    started: SystemTime,
    told: bool,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if !self.told {
            let timeout = StoreError::Timeout;
            let (target, keys) = (self.target, self.keys);
            self.inner.tell(
                self.probe,
                target,
                "decide",
                keys,
                self.started,
                Some(&timeout),
            );
        }
    }
}

/// Keeps `Inner::keys` at the shards' DBSIZE sum (in a cluster, DBSIZE is summed over
/// the masters), read every `every` off the request path, until the store is dropped.
/// DBSIZE counts every key of the database, so it is sluice's own counters when Redis
/// is given to sluice alone; a shard that does not answer keeps its last count.
///
/// The first time a shard (or the cluster) answers, its expire cycle is also checked
/// against the store timeout, once ([`expire`]).
async fn count_keys(inner: Weak<Inner>, every: Duration) {
    let mut last: Vec<usize> = Vec::new();
    let mut checked: Vec<bool> = Vec::new();
    loop {
        let Some(inner) = inner.upgrade() else { return };
        let timeout = inner.call_timeout;
        let counts: Vec<Option<usize>> = match &inner.backend {
            Backend::Shards(shards) => {
                checked.resize(shards.len(), false);
                let counts = shards
                    .iter()
                    .zip(checked.iter_mut())
                    .map(|(s, checked)| async move {
                        let pool = s.conn.get().ok()?;
                        let n = dbsize(&pool).await;
                        if n.is_some() && !*checked {
                            *checked = true;
                            let warning = expire::check(&pool, &s.health.name, timeout).await;
                            if let Some(warning) = warning {
                                tracing::warn!(shard = %s.health.name, "{warning}");
                            }
                        }
                        n
                    });
                futures::future::join_all(counts).await
            }
            Backend::Cluster(c) => {
                let n = c.dbsize().await;
                checked.resize(1, false);
                if n.is_some() && !checked[0] {
                    checked[0] = true;
                    for warning in c.expire_warnings(timeout).await {
                        tracing::warn!(shard = %c.health.name, "{warning}");
                    }
                }
                vec![n]
            }
        };
        last.resize(counts.len(), 0);
        for (l, n) in last.iter_mut().zip(counts) {
            if let Some(n) = n {
                *l = n;
            }
        }
        inner.keys.store(last.iter().sum(), Ordering::Relaxed);
        drop(inner);
        tokio::time::sleep(every).await;
    }
}

/// One shard's DBSIZE. It says nothing of the shard's health: a replica answers it
/// while refusing writes (READONLY), so only decide calls (and heartbeats, which
/// write) mark a shard up or down.
async fn dbsize(pool: &Pool) -> Option<usize> {
    let mut req = Request::default();
    req.start(1);
    req.arg(b"DBSIZE");
    let reply = tokio::time::timeout(Duration::from_secs(1), pool.query(&req)).await;
    usize::try_from(reply.ok()?.ok()?.as_int()?).ok()
}

impl RedisStore {
    async fn decide_with(
        &self,
        hits: &[Hit],
        wait: Duration,
        probe: Option<&dyn Probe>,
    ) -> Result<Verdicts, StoreError> {
        if self.inner.one_target(hits) {
            // One script call (maybe shared with other requests, each decided all or
            // nothing): nothing to give back if the limiter stops waiting, and
            // nothing to decide without it, so the limiter's timer is its deadline.
            return self.inner.decide_one(hits, probe).await;
        }
        spread::decide(&self.inner, hits, wait, probe).await
    }
}

impl Store for RedisStore {
    async fn decide(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        self.decide_with(hits, self.inner.call_timeout, None).await
    }

    async fn decide_within(
        &self,
        hits: &[Hit],
        wait: Duration,
        probe: Option<&dyn Probe>,
    ) -> Result<Verdicts, StoreError> {
        self.decide_with(hits, wait, probe).await
    }

    async fn peek(&self, hits: &[Hit]) -> Result<Verdicts, StoreError> {
        self.inner.peek(hits).await
    }

    fn active_keys(&self) -> usize {
        self.inner.keys.load(Ordering::Relaxed)
    }

    fn shards(&self) -> Vec<ShardStatus> {
        match &self.inner.backend {
            Backend::Shards(s) => s
                .iter()
                .map(|s| match &s.conn {
                    // The master the shard's calls go to now.
                    ShardConn::Sentinel(m) => ShardStatus {
                        nodes: m.current().map(|r| r.addr).into_iter().collect(),
                        ..s.health.status()
                    },
                    ShardConn::Fixed(_) => s.health.status(),
                })
                .collect(),
            Backend::Cluster(c) => c.statuses(),
        }
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    async fn settle(&self, batch: &[crate::store::Settlement]) -> Vec<Result<bool, StoreError>> {
        self.settle_all(batch).await
    }

    async fn heartbeat(
        &self,
        member: &str,
        beats: crate::store::Beats,
    ) -> Result<Option<crate::store::Heard>, StoreError> {
        self.beat(member, beats).await.map(Some)
    }

    async fn leave(&self, member: &str) -> Result<(), StoreError> {
        self.unbeat(member).await
    }

    fn shard_of(&self, hit: &Hit) -> usize {
        match &self.inner.backend {
            Backend::Shards(s) => shard::jump_hash(hit.placement, s.len()),
            Backend::Cluster(_) => 0,
        }
    }

    fn probes_shards(&self) -> bool {
        matches!(self.inner.backend, Backend::Shards(_))
    }

    fn shard_failing(&self, shard: usize) -> bool {
        match &self.inner.backend {
            Backend::Shards(_) => self.inner.health(shard).is_failing(),
            Backend::Cluster(c) => c.is_failing(),
        }
    }

    fn shard_name(&self, shard: usize) -> Option<Arc<str>> {
        match &self.inner.backend {
            Backend::Shards(s) => s.get(shard).map(|s| s.health.name.clone()),
            Backend::Cluster(_) => None,
        }
    }

    async fn reach(&self, shard: usize) -> Result<u64, StoreError> {
        self.probe(shard).await
    }
}

impl Board for RedisStore {
    fn shares_sentences(&self) -> bool {
        true
    }

    async fn strike(&self, strike: &Strike<'_>) -> Result<Option<Sentenced>, StoreError> {
        self.inner.strike(strike).await
    }

    async fn sentence(&self, sentence: &Sentenced) -> Result<(), StoreError> {
        self.inner.put(sentence).await
    }

    async fn pardon(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.pardon(key).await
    }

    async fn sentences(&self) -> Result<Vec<Sentenced>, StoreError> {
        self.inner.sentences().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_hide_passwords() {
        assert_eq!(
            shard_name("redis://:secret@10.0.0.1:6379/0"),
            "10.0.0.1:6379"
        );
        assert_eq!(shard_name("rediss://user:pw@host:6380"), "host:6380");
        assert_eq!(shard_name("host:1"), "host:1");
        assert_eq!(
            shard_name("unix:///run/redis.sock?db=1&pass=x"),
            "/run/redis.sock"
        );
        assert_eq!(
            shard_name("rediss://10.0.0.1:6380#insecure"),
            "10.0.0.1:6380"
        );
    }

    /// A URL that is no URL is shown as written (without a password), and the
    /// error says what to write.
    #[test]
    fn a_url_typo_is_shown_and_explained() {
        for (url, shown, says) in [
            (
                "redis//127.0.0.1:6379",
                "redis//127.0.0.1:6379",
                "redis://HOST:PORT",
            ),
            ("127.0.0.1:6379", "127.0.0.1:6379", "redis://HOST:PORT"),
            ("localhost:6379", "localhost:6379", "redis://HOST:PORT"),
            ("redis//:secret@h:1", "h:1", "redis://HOST:PORT"),
            (
                "http://127.0.0.1:6379",
                "127.0.0.1:6379",
                "redis://, rediss://",
            ),
            ("redis://127.0.0.1:99999", "127.0.0.1:99999", "port"),
        ] {
            let e = target(url, Duration::from_secs(1)).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("invalid Redis URL {shown}: ")),
                "{url}: {e}"
            );
            assert!(e.contains(says), "{url}: {e}");
            assert!(
                !e.contains("secret") && !e.contains("without a base"),
                "{url}: {e}"
            );
        }
    }

    #[tokio::test]
    async fn a_shard_given_twice_is_refused() {
        for urls in [
            vec!["redis://127.0.0.1:6379", "redis://127.0.0.1:6379/0"],
            vec!["redis://127.0.0.1:6379/2", "redis://:pw@127.0.0.1:6379/2"],
        ] {
            let urls = urls.into_iter().map(String::from).collect();
            let Err(e) = RedisStore::new(Options::new(urls, false), None) else {
                panic!("a shard given twice was taken");
            };
            assert!(
                matches!(e, ConfigError::DuplicateShard(ref s) if s == "127.0.0.1:6379"),
                "{e}"
            );
        }
        // Two databases of one server are two shards.
        let urls = vec![
            "redis://127.0.0.1:6379/1".into(),
            "redis://127.0.0.1:6379/2".into(),
        ];
        assert!(RedisStore::new(Options::new(urls, false), None).is_ok());
    }
}
