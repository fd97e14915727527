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
//! a replica, and what it takes meanwhile is lost. The announcing sentinel is asked
//! first after its announcement, and while calls fail the current address is kept
//! only if `ROLE` there still says master: a sentinel cut off from the others goes
//! on naming the old master.
//!
//! While no master is known, calls fail with what stood in the way (sentinels that
//! do not answer, a refused password, a name they do not know, a replica), and a
//! round where no sentinel gave an address is logged by why, once until that
//! changes; a new master is told to the caller at once ([`Master::spawn`]'s
//! `on_switch`), so that a caller backing off can send its next call to it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::target::Addr;
use crate::{error, Error, ErrorKind, Pool, Request, Target, Value, Wire};

/// How often the sentinels are asked while nothing seems wrong: a backstop for a
/// failover announcement that was missed.
pub const POLL: Duration = Duration::from_secs(1);
/// Shortest gap between two questions to the sentinels while calls keep failing.
pub const MIN_GAP: Duration = Duration::from_millis(50);
/// No sentinel, for [`Master`]'s `announcer`.
const NONE: usize = usize::MAX;
/// A sentinel's channels that say a master moved or is moving.
const CHANNELS: [&str; 2] = ["+switch-master", "+failover-state-reconf-slaves"];

/// Why a round of asking the sentinels gave no address at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Trouble {
    /// A sentinel gave an address (or none was asked yet).
    None,
    /// No sentinel answered: down, unreachable, or hung.
    Silent,
    /// Sentinels answered only to refuse sluice's password or TLS.
    Refused,
    /// The sentinels that answered do not know the master's name.
    Unknown,
}

impl Trouble {
    fn of(v: u8) -> Trouble {
        [
            Trouble::None,
            Trouble::Silent,
            Trouble::Refused,
            Trouble::Unknown,
        ]
        .into_iter()
        .find(|t| *t as u8 == v)
        .unwrap_or(Trouble::None)
    }

    /// The trouble of a round where no sentinel gave an address: `unknown`
    /// sentinels answered that they do not know the name, `refused` refused sluice.
    fn of_round(unknown: usize, refused: usize) -> Trouble {
        if unknown > 0 {
            Trouble::Unknown
        } else if refused > 0 {
            Trouble::Refused
        } else {
            Trouble::Silent
        }
    }
}

/// Whether a sentinel's error is a refusal of sluice's settings (it answered).
fn refusal(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::NoAuth | ErrorKind::Tls)
}

/// One master as the sentinels know it, and where it is now.
pub struct Master {
    /// The master's name with the sentinels; also the shard's name.
    pub name: String,
    /// The master URL's settings (TLS, user, password, db) around a placeholder
    /// address.
    template: Target,
    sentinels: Arc<[Target]>,
    /// The sentinel that answered last, asked first next time.
    first: AtomicUsize,
    /// The sentinel that announced a failover of this master since the last round
    /// began ([`NONE`] if none): it knows of it, so the next round asks it first.
    announcer: AtomicUsize,
    current: Mutex<Option<Resolved>>,
    /// Why the last round found no master, while none is known: what calls fail with.
    problem: Mutex<Option<Error>>,
    /// Bumped whenever `current` changes; 0 until the first master is known.
    generation: AtomicU64,
    wake: Notify,
    timeout: Duration,
    /// Called when the master moves (or is first found).
    on_switch: Box<dyn Fn() + Send + Sync>,
    /// The connections to the current master off the decide path (refunds, peeks,
    /// key counts), made again when the generation moves on.
    pool: Mutex<Option<(u64, Arc<Pool>)>>,
    /// What kept the last round from any address ([`Trouble`]): said once, until
    /// it changes.
    trouble: AtomicU8,
    /// A call failed, or a sentinel announced a failover, since the last round: a
    /// sentinel naming the current address is then believed only if `ROLE` there
    /// still says master (a sentinel cut off from the others names it after a
    /// failover).
    doubted: AtomicBool,
}

/// A master's address that answered `ROLE` with `master`.
#[derive(Clone)]
pub struct Resolved {
    /// `host:port`.
    pub addr: String,
    pub target: Target,
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

/// A master given as its name, or as a URL whose host is its name
/// (`rediss://:password@mymaster/2`): the scheme, credentials and database are the
/// master's, the address comes from the sentinels. `Err`: why the spec is refused.
pub fn parse_master(spec: &str, timeout: Duration) -> Result<(String, Target), String> {
    let url = if spec.contains("://") {
        spec.to_string()
    } else {
        format!("redis://{spec}")
    };
    let target = Target::parse(&url, timeout)?;
    let name = match &target.addr {
        Addr::Tcp { host, .. } => host.clone(),
        Addr::Unix(_) => return Err("a master is named, not a socket".into()),
    };
    // The port is the sentinels' to say; one written here would be ignored.
    if url::Url::parse(&url).is_ok_and(|u| u.port().is_some()) {
        return Err("a sentinel master is named, not addressed: give no port".into());
    }
    if name.is_empty() {
        return Err("no master name".into());
    }
    Ok((name, target))
}

/// A call's error while no master is known: the kind of what stood in the way (a
/// refused password reads as one), with the master's name.
fn unresolved(name: &str, problem: Option<&Error>) -> Error {
    let (kind, why) = match problem {
        Some(e) => (e.kind(), e.message().to_string()),
        None => (ErrorKind::Connection, "not asked yet".to_string()),
    };
    Error::failed(kind, format!("no master known for {name}: {why}"))
}

impl Master {
    /// A master named `name` (its settings in `template`), and the task that follows
    /// its address, stopped when the master is dropped; `on_switch` is called each
    /// time a new address is taken. Must run inside a Tokio runtime.
    pub fn spawn(
        name: String,
        template: Target,
        sentinels: Arc<[Target]>,
        on_switch: impl Fn() + Send + Sync + 'static,
        timeout: Duration,
    ) -> Arc<Master> {
        let master = Arc::new(Master {
            name,
            template,
            sentinels,
            first: AtomicUsize::new(0),
            announcer: AtomicUsize::new(NONE),
            current: Mutex::new(None),
            problem: Mutex::new(None),
            generation: AtomicU64::new(0),
            wake: Notify::new(),
            timeout,
            on_switch: Box::new(on_switch),
            pool: Mutex::new(None),
            trouble: AtomicU8::new(Trouble::None as u8),
            doubted: AtomicBool::new(false),
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
    pub fn resolved(&self) -> Result<Resolved, Error> {
        self.current().ok_or_else(|| {
            self.suspect();
            let problem = self.problem.lock().unwrap_or_else(|p| p.into_inner());
            unresolved(&self.name, problem.as_ref())
        })
    }

    /// A call met an outage: ask the sentinels again soon.
    pub fn suspect(&self) {
        self.doubted.store(true, Relaxed);
        self.wake.notify_one();
    }

    /// Sentinel `i` announced a failover of this master: it knows of it, so it is
    /// asked first (one cut off from the others would name the old master).
    fn announced_by(&self, i: usize) {
        self.announcer.store(i, Relaxed);
        self.suspect();
    }

    /// The connections to the current master off the decide path.
    pub fn pool(&self) -> Result<Arc<Pool>, Error> {
        let now = self.resolved()?;
        let mut slot = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((generation, pool)) = &*slot {
            if *generation == now.generation {
                return Ok(pool.clone());
            }
        }
        let pool = Arc::new(Pool::new(now.target));
        *slot = Some((now.generation, pool.clone()));
        Ok(pool)
    }

    /// Asks the sentinels once, starting with the one that answered last, and moves
    /// to the address they give if `ROLE` there says master. `conns` caches one
    /// connection per sentinel across calls.
    async fn resolve(&self, conns: &mut [Option<Wire>]) {
        let n = self.sentinels.len();
        let start = match self.announcer.swap(NONE, Relaxed) {
            NONE => self.first.load(Relaxed),
            announcer => announcer,
        } % n;
        let current = self.current();
        let doubted = self.doubted.swap(false, Relaxed);
        // Whether the current address still says master, asked once a round.
        let mut still_master: Option<Result<bool, Error>> = None;
        let mut problem = None;
        // Sentinels that do not know the name, the last of them, and those that
        // refused sluice: a round where none gave an address says which.
        let (mut unknown, mut knows_none) = (0, None);
        let mut refused: Option<Error> = None;
        let mut refusals = 0;
        let mut gave = false;
        for i in (0..n).map(|k| (start + k) % n) {
            let (host, port) = match self.ask(i, &mut conns[i]).await {
                Ok(Some(addr)) => {
                    gave = true;
                    self.heard(i);
                    addr
                }
                Ok(None) => {
                    unknown += 1;
                    knows_none = Some(i);
                    continue;
                }
                Err(e) => {
                    if refusal(&e) {
                        refusals += 1;
                        refused = Some(e.clone());
                    }
                    problem = Some(e);
                    continue;
                }
            };
            self.first.store(i, Relaxed);
            let addr = format!("{host}:{port}");
            if let Some(c) = current.as_ref().filter(|c| c.addr == addr) {
                if !doubted {
                    return;
                }
                if still_master.is_none() {
                    still_master = Some(self.role(&c.target).await);
                }
                match still_master.as_ref().expect("asked above") {
                    Ok(true) => return,
                    // Demoted, yet named: this sentinel may not know of the
                    // failover; another may.
                    Ok(false) => {
                        problem = Some(Error::failed(
                            ErrorKind::ReadOnly,
                            format!("{addr} is no longer a master"),
                        ));
                        continue;
                    }
                    // Down or hung: no sign the sentinel is wrong, but another
                    // may know of a failover already.
                    Err(e) => {
                        problem = Some(Error::failed(e.kind(), format!("{addr}: {}", e.message())));
                        continue;
                    }
                }
            }
            let target = self.template.at(&host, port);
            match self.role(&target).await {
                Ok(true) => {
                    self.switch(addr, target, current.as_ref());
                    return;
                }
                // Named but not a master yet (a promotion under way), or not
                // reachable: another sentinel may know better; if none does, the
                // next round asks again.
                Ok(false) => {
                    tracing::debug!(master = %self.name, %addr, "sentinel names a replica");
                    problem = Some(Error::failed(
                        ErrorKind::ReadOnly,
                        format!("{addr} is not a master (yet)"),
                    ));
                }
                Err(e) => {
                    tracing::debug!(master = %self.name, %addr, error = %e, "ROLE failed");
                    problem = Some(Error::failed(e.kind(), format!("{addr}: {}", e.message())));
                }
            }
        }
        // A round where a sentinel gave an address (a replica, or one that does not
        // answer) is no trouble with the sentinels; one where none did is, said once
        // until it changes. Calls meanwhile go on to the last master found, without
        // anyone to tell of a failover.
        if !gave {
            let trouble = Trouble::of_round(unknown, refusals);
            match trouble {
                Trouble::Unknown => {
                    problem = Some(Error::failed(
                        ErrorKind::Connection,
                        "no sentinel knows the name: check --redis-sentinel-master",
                    ));
                }
                Trouble::Refused => problem = refused,
                _ => {}
            }
            if self.trouble.swap(trouble as u8, Relaxed) != trouble as u8 {
                let watched = match (trouble, knows_none) {
                    (Trouble::Unknown, Some(i)) => self.watched(i, &mut conns[i]).await,
                    _ => None,
                };
                self.tell(trouble, current.as_ref(), problem.as_ref(), watched);
            }
        }
        if current.is_none() {
            *self.problem.lock().unwrap_or_else(|p| p.into_inner()) = problem;
        }
    }

    /// Sentinel `i` gave an address: whatever kept the rounds before from one is
    /// over.
    fn heard(&self, i: usize) {
        let was = Trouble::of(self.trouble.swap(Trouble::None as u8, Relaxed));
        if matches!(was, Trouble::Silent | Trouble::Refused) {
            tracing::info!(master = %self.name, sentinel = i + 1, "a sentinel answers again");
        }
    }

    /// Logs why no sentinel gave an address, once when it begins (or changes).
    fn tell(
        &self,
        trouble: Trouble,
        current: Option<&Resolved>,
        problem: Option<&Error>,
        watched: Option<String>,
    ) {
        let error = problem.map(|e| e.message().to_string()).unwrap_or_default();
        let meanwhile = match current {
            Some(c) => format!(
                "calls go on to {}, the master last found, and a failover meanwhile is not seen",
                c.addr
            ),
            None => "no master is known, so calls are answered by the failure mode".to_string(),
        };
        let name = &self.name;
        match trouble {
            Trouble::None => {}
            Trouble::Silent => tracing::warn!(
                master = %name, %error, "no sentinel answers: {meanwhile}"
            ),
            Trouble::Refused if problem.is_some_and(|e| e.kind() == ErrorKind::Tls) => {
                tracing::error!(
                    master = %name,
                    %error,
                    "the sentinels refuse sluice's TLS settings: check the rediss:// \
                     --redis-sentinel URLs and their tls_* files; {meanwhile}"
                )
            }
            Trouble::Refused => tracing::error!(
                master = %name,
                %error,
                "the sentinels refuse sluice's password: give the one they want in the \
                 --redis-sentinel URLs (redis://:PASSWORD@host:port, or USER:PASSWORD); \
                 {meanwhile}"
            ),
            Trouble::Unknown => tracing::error!(
                master = %name,
                "no sentinel knows a master named {name}: check --redis-sentinel-master \
                 against the names they watch ({}); {meanwhile}",
                watched.as_deref().unwrap_or("not said")
            ),
        }
    }

    /// The names of the masters sentinel `i` watches (`SENTINEL MASTERS`), if it
    /// says.
    async fn watched(&self, i: usize, conn: &mut Option<Wire>) -> Option<String> {
        let asked = async {
            if conn.is_none() {
                *conn = Some(Wire::connect(&self.sentinels[i]).await.ok()?);
            }
            let c = conn.as_mut()?;
            let reply = c
                .query(&Request::command(&[b"SENTINEL", b"MASTERS"]))
                .await
                .ok()?;
            master_names(reply)
        };
        let names = tokio::time::timeout(self.timeout, asked).await.ok()??;
        Some(if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        })
    }

    fn switch(&self, addr: String, target: Target, from: Option<&Resolved>) {
        let generation = self.generation.load(Relaxed) + 1;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Resolved {
            addr: addr.clone(),
            target,
            generation,
        });
        self.generation.store(generation, Relaxed);
        (self.on_switch)();
        match from {
            Some(old) => tracing::warn!(
                master = %self.name, from = %old.addr, to = %addr, "redis master moved"
            ),
            None => tracing::info!(master = %self.name, %addr, "redis master found"),
        }
    }

    /// `SENTINEL get-master-addr-by-name` on sentinel `i`; `None` when it does not
    /// know the name.
    async fn ask(&self, i: usize, conn: &mut Option<Wire>) -> Result<Option<(String, u16)>, Error> {
        let asked = async {
            if conn.is_none() {
                *conn = Some(Wire::connect(&self.sentinels[i]).await?);
            }
            let c = conn.as_mut().expect("connected above");
            let req = Request::command(&[
                b"SENTINEL",
                b"get-master-addr-by-name",
                self.name.as_bytes(),
            ]);
            master_addr(c.query(&req).await?)
        };
        let failed =
            |e: Error| Error::failed(e.kind(), format!("sentinel {}: {}", i + 1, e.message()));
        match tokio::time::timeout(self.timeout, asked).await {
            Ok(Ok(addr)) => Ok(addr),
            Ok(Err(e)) => {
                tracing::debug!(master = %self.name, sentinel = i, error = %e, "sentinel failed");
                *conn = None;
                Err(failed(e))
            }
            Err(_) => {
                *conn = None;
                Err(failed(Error::failed(ErrorKind::Timeout, "no answer")))
            }
        }
    }

    /// Whether the server at `target` says it is a master.
    async fn role(&self, target: &Target) -> Result<bool, Error> {
        let asked = async {
            let mut conn = Wire::connect(target).await?;
            let req = Request::command(&[b"ROLE"]);
            match conn.query(&req).await? {
                Value::Error(e) => Err(error::reply(e)),
                v => Ok(is_master(&v)),
            }
        };
        match tokio::time::timeout(self.timeout, asked).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout),
        }
    }
}

/// A `SENTINEL get-master-addr-by-name` reply: the address, or `None` for a name
/// the sentinel does not know.
fn master_addr(reply: Value) -> Result<Option<(String, u16)>, Error> {
    let bad = |what: &str| Error::failed(ErrorKind::Protocol, format!("sentinel: {what}"));
    let items = match reply {
        Value::Nil => return Ok(None),
        Value::Error(e) => return Err(error::reply(e)),
        Value::Array(items) => items,
        _ => return Err(bad("no address")),
    };
    match items.as_slice() {
        [host, port] => {
            let host = host.as_text().ok_or_else(|| bad("no host"))?;
            let port = port
                .as_int()
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| bad("bad port"))?;
            Ok(Some((host, port)))
        }
        _ => Err(bad("no address")),
    }
}

/// The `name` of each master in a `SENTINEL MASTERS` reply (an array of flat
/// field-value arrays); `None` for an error or another shape.
fn master_names(reply: Value) -> Option<Vec<String>> {
    let masters = reply.into_array()?;
    let mut names = Vec::with_capacity(masters.len());
    for fields in masters {
        let fields = fields.into_array()?;
        let name = fields
            .chunks(2)
            .find(|kv| kv[0].as_text().as_deref() == Some("name"))
            .and_then(|kv| kv.get(1)?.as_text())?;
        names.push(name);
    }
    Some(names)
}

/// Whether a `ROLE` reply starts with `master`.
fn is_master(role: &Value) -> bool {
    let Value::Array(items) = role else {
        return false;
    };
    items.first().and_then(Value::as_text).as_deref() == Some("master")
}

/// Follows a master's address until it is dropped: asks at once, then whenever
/// woken (at most once per [`MIN_GAP`]) or every [`POLL`].
async fn follow(master: Weak<Master>) {
    let mut conns: Vec<Option<Wire>> = Vec::new();
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
pub fn listen(sentinels: &[Target], masters: Vec<Weak<Master>>) {
    let masters: Arc<[Weak<Master>]> = masters.into();
    for (i, target) in sentinels.iter().enumerate() {
        tokio::spawn(subscribe(i, target.clone(), masters.clone()));
    }
}

fn alive(masters: &[Weak<Master>]) -> bool {
    masters.iter().any(|m| m.strong_count() > 0)
}

/// A connection subscribed to [`CHANNELS`].
async fn subscribed(target: &Target) -> Result<Wire, Error> {
    let mut conn = Wire::connect(target).await?;
    let mut req = Request::default();
    req.start(1 + CHANNELS.len());
    req.arg(b"SUBSCRIBE");
    for channel in CHANNELS {
        req.arg(channel.as_bytes());
    }
    conn.send(req.bytes()).await?;
    Ok(conn)
}

/// A pushed value's channel and payload when it is a published message (not a
/// subscription's confirmation or an error).
fn announcement(value: &Value) -> Option<(String, String)> {
    let Value::Array(items) = value else {
        return None;
    };
    match items.as_slice() {
        [kind, channel, payload] if kind.as_text().as_deref() == Some("message") => {
            Some((channel.as_text()?, payload.as_text().unwrap_or_default()))
        }
        _ => None,
    }
}

/// Whether an announcement's payload names `master` (`<name> <old ip> <old port>
/// <new ip> <new port>`, or `<type> <name> <ip> <port> @ <master> ...`).
fn names(payload: &str, master: &str) -> bool {
    payload.split(' ').any(|word| word == master)
}

/// Listens on sentinel `i` (`target`).
async fn subscribe(i: usize, target: Target, masters: Arc<[Weak<Master>]>) {
    while alive(&masters) {
        let mut conn = match tokio::time::timeout(target.timeout, subscribed(&target)).await {
            Ok(Ok(c)) => c,
            _ => {
                // The sentinel is down: polling covers for it; try again later.
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        while alive(&masters) {
            match tokio::time::timeout(POLL, conn.next()).await {
                Ok(Ok(Value::Error(e))) => {
                    tracing::debug!(error = %e, "sentinel refused the subscription");
                    tokio::time::sleep(POLL).await;
                    break;
                }
                Ok(Ok(msg)) => {
                    if let Some((channel, payload)) = announcement(&msg) {
                        tracing::debug!(%channel, %payload, "sentinel announcement");
                        for m in masters.iter().filter_map(Weak::upgrade) {
                            if names(&payload, &m.name) {
                                m.announced_by(i);
                            } else {
                                m.suspect();
                            }
                        }
                    }
                }
                Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(1);

    #[test]
    fn masters_are_named_with_their_own_settings() {
        let (name, target) = parse_master("mymaster", T).unwrap();
        assert_eq!(name, "mymaster");
        assert_eq!(target.db, 0);
        let (name, target) = parse_master("rediss://user:pw@cache-a/3", T).unwrap();
        assert_eq!(name, "cache-a");
        assert_eq!(target.username.as_deref(), Some("user"));
        assert_eq!(target.password.as_deref(), Some("pw"));
        assert_eq!(target.db, 3);
        let moved = target.at("10.0.0.7", 6380);
        assert_eq!(moved.name(), "10.0.0.7:6380");
        assert!(moved.tls.is_some(), "TLS kept");
        assert_eq!(moved.password.as_deref(), Some("pw"));
        let plain = parse_master("m", T).unwrap().1.at("127.0.0.1", 1);
        assert!(plain.tls.is_none());
    }

    #[test]
    fn a_master_with_a_port_or_no_name_is_refused() {
        let e = parse_master("redis://mymaster:6379", T)
            .unwrap_err()
            .to_string();
        assert!(e.contains("give no port"), "{e}");
        assert!(parse_master("redis://:pw@/0", T).is_err());
        assert!(parse_master("redis+unix:///tmp/x.sock", T).is_err());
    }

    #[test]
    fn a_round_without_an_address_says_why() {
        assert_eq!(Trouble::of_round(0, 0), Trouble::Silent);
        assert_eq!(Trouble::of_round(0, 2), Trouble::Refused);
        // A sentinel that answers and does not know the name says more than one
        // that refuses or does not answer.
        assert_eq!(Trouble::of_round(1, 1), Trouble::Unknown);
        for t in [
            Trouble::None,
            Trouble::Silent,
            Trouble::Refused,
            Trouble::Unknown,
        ] {
            assert_eq!(Trouble::of(t as u8), t);
        }
        assert!(refusal(&error::reply(
            "WRONGPASS invalid username-password pair".into()
        )));
        assert!(refusal(&error::reply(
            "NOAUTH Authentication required.".into()
        )));
        assert!(!refusal(&Error::failed(
            ErrorKind::Connection,
            "connect: refused"
        )));
        assert!(!refusal(&Error::Timeout));
    }

    #[test]
    fn sentinel_masters_reply_gives_the_names_watched() {
        let text = |t: &str| Value::Bulk(t.as_bytes().to_vec());
        let master = |name: &str| {
            Value::Array(vec![
                text("name"),
                text(name),
                text("ip"),
                text("127.0.0.1"),
            ])
        };
        let reply = Value::Array(vec![master("counters"), master("other")]);
        assert_eq!(
            master_names(reply),
            Some(vec!["counters".to_string(), "other".to_string()])
        );
        assert_eq!(master_names(Value::Array(vec![])), Some(vec![]));
        assert_eq!(master_names(Value::Error("NOPERM".into())), None);
        assert_eq!(
            master_names(Value::Array(vec![Value::Array(vec![text("ip")])])),
            None
        );
    }

    #[test]
    fn only_a_master_role_counts() {
        let master = Value::Array(vec![
            Value::Bulk(b"master".to_vec()),
            Value::Int(10),
            Value::Array(vec![]),
        ]);
        assert!(is_master(&master));
        let replica = Value::Array(vec![
            Value::Bulk(b"slave".to_vec()),
            Value::Bulk(b"127.0.0.1".to_vec()),
            Value::Int(6379),
            Value::Bulk(b"connected".to_vec()),
            Value::Int(10),
        ]);
        assert!(!is_master(&replica));
        assert!(!is_master(&Value::Nil));
        assert!(!is_master(&Value::Array(vec![])));
    }

    #[test]
    fn sentinel_replies_read_as_addresses_and_announcements() {
        let addr = Value::Array(vec![
            Value::Bulk(b"10.0.0.2".to_vec()),
            Value::Bulk(b"6380".to_vec()),
        ]);
        assert_eq!(
            master_addr(addr).unwrap(),
            Some(("10.0.0.2".to_string(), 6380))
        );
        assert_eq!(master_addr(Value::Nil).unwrap(), None);
        assert!(master_addr(Value::Array(vec![Value::Int(1)])).is_err());
        let bad_port = Value::Array(vec![
            Value::Bulk(b"h".to_vec()),
            Value::Bulk(b"99999".to_vec()),
        ]);
        assert!(master_addr(bad_port).is_err());
        let text = |t: &str| Value::Bulk(t.as_bytes().to_vec());
        let msg = Value::Array(vec![
            text("message"),
            text("+switch-master"),
            text("m 10.0.0.1 6379 10.0.0.2 6379"),
        ]);
        let (channel, payload) = announcement(&msg).unwrap();
        assert_eq!(channel, "+switch-master");
        assert!(names(&payload, "m") && !names(&payload, "m2"));
        let confirm = Value::Array(vec![
            text("subscribe"),
            text("+switch-master"),
            Value::Int(1),
        ]);
        assert_eq!(announcement(&confirm), None);
    }
}
