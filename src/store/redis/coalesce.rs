//! Coalescing: at most [`CALLS_IN_FLIGHT`] decide calls in flight per standalone
//! shard, each carrying every request queued for that shard when it was sent.
//!
//! Each shard has a bounded queue and [`CALLS_IN_FLIGHT`] tasks, each with its own
//! connection, which take the queue in turns. A request's share of hits on the shard
//! (a [`Group`]) is queued; a task takes everything queued (up to [`MAX_REQUESTS`]
//! requests or [`MAX_KEYS`] keys), sends one call deciding the groups one after
//! another (each all-or-nothing, as if the requests had arrived back to back), and
//! answers each request with its group's verdicts. While its call is in flight the
//! other task collects and sends the next one, so Redis works on one call while the
//! answers of the previous one go out (one call in flight left the machine idle
//! during every round trip: docs/performance-notes.md, "Redis path"), and under load one round trip and one
//! script call serve many requests; an idle shard sends a lone request at once (no
//! timer, no waiting for a batch to fill).
//!
//! The call keeps the shard's timeout and health accounting: it is bounded by the
//! call timeout, counts as one success or one failure, and its failure fails every
//! request in it. A request whose caller stopped waiting (the limiter's store
//! timeout, or a request over several shards admitted at its deadline without this
//! shard) before its call was sent is dropped unsent, so it consumes nothing; a call
//! already sent is not cut short for one request's deadline, as it decides the
//! others in it too. A full queue makes callers wait (the limiter's store timeout
//! bounds the wait), so overload never grows memory.
//!
//! The call is an `FCALL` of the decide function ([`scripts::Library`]) where the
//! server has functions (Redis 7) and lets Sluice load them, else an `EVALSHA` of the
//! same script; either decides alike on the same stored state.
//!
//! A shard behind Redis Sentinel has no fixed address: its tasks make their
//! connections for the master the sentinels named last ([`super::sentinel`]), make
//! them again when it changes, and report each outage so the sentinels are asked.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use sluice_redis::sentinel::Master;
use sluice_redis::{Answer, Request, Target, Value, Wire};
use tokio::sync::{mpsc, oneshot};

use crate::algorithm::Micros;
use crate::store::{ErrorKind, StoreError};

use super::health::Health;
use super::scripts::{self, By, Group, Reply, Scripts};

/// Most requests decided by one call.
pub const MAX_REQUESTS: usize = 64;
/// Most keys in one call; a request with more keys is sent alone.
pub const MAX_KEYS: usize = 512;
/// Decide calls a shard may have in flight, each on its own connection.
pub const CALLS_IN_FLIGHT: usize = 2;
/// Requests that may wait for a shard; further callers wait to be queued.
const QUEUE: usize = 4096;

struct Job {
    group: Group,
    fixed_now: Option<Micros>,
    reply: oneshot::Sender<Result<Reply, StoreError>>,
}

/// How a shard's task reaches its Redis: its own connection, connected on first use
/// and again after an error.
pub struct Link {
    /// `None` for a Sentinel shard's task before it knows a master.
    target: Option<Target>,
    conn: Option<Wire>,
    req: Request,
    /// Whether decide calls go by `FCALL`: unknown until a `FUNCTION LOAD` answered.
    functions: Option<bool>,
}

impl Link {
    pub fn new(target: Target) -> Link {
        Link {
            target: Some(target),
            conn: None,
            req: Request::default(),
            functions: None,
        }
    }

    /// Connects and loads the decide function (or, without functions, the script)
    /// ahead of the first call, so that the first requests after start pay for
    /// neither (over TLS and a real network, the handshakes and a reload round trip
    /// can outlast the store timeout). A failure is left for the first call to meet.
    async fn warm(&mut self, scripts: &Scripts) {
        let Some(target) = &self.target else { return };
        if self.conn.is_some() {
            return;
        }
        let (req, functions) = (&mut self.req, &mut self.functions);
        let warmed = async {
            let mut wire = Wire::connect(target).await.ok()?;
            if load_library(&mut wire, req, scripts, functions)
                .await
                .ok()?
            {
                return Some(wire);
            }
            req.start(3);
            req.arg(b"SCRIPT");
            req.arg(b"LOAD");
            req.arg(scripts.decide.text().as_bytes());
            match wire.query(req).await.ok()? {
                Value::Bulk(_) => Some(wire),
                _ => None,
            }
        };
        // Bounded like a connection: a hung server at start is the first call's to
        // find.
        if let Ok(Some(wire)) = tokio::time::timeout(target.timeout, warmed).await {
            self.conn = Some(wire);
        }
    }

    /// A Sentinel shard's link before it knows a master.
    pub fn unrouted() -> Link {
        Link {
            target: None,
            conn: None,
            req: Request::default(),
            functions: None,
        }
    }

    /// A link to `master`'s current address; `seen` is the generation it was made
    /// for.
    fn to_master(master: &Master) -> Result<(Link, u64), StoreError> {
        let now = master.resolved()?;
        Ok((Link::new(now.target), now.generation))
    }
}

/// The queue of one shard. Dropping it ends the shard's task once the queue drains.
pub struct Coalescer {
    tx: mpsc::Sender<Job>,
}

fn closed() -> StoreError {
    StoreError::failed(ErrorKind::Connection, "shard queue closed")
}

impl Coalescer {
    /// Starts the shard's task. Must run inside a Tokio runtime.
    /// `master` is the shard's Sentinel master, when it has one.
    pub fn spawn(
        links: Vec<Link>,
        master: Option<Arc<Master>>,
        scripts: Scripts,
        health: Arc<Health>,
        call_timeout: Duration,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for link in links {
            let task = ShardTask {
                link,
                master: master.clone(),
                seen: 0,
                scripts: scripts.clone(),
                health: health.clone(),
                call_timeout,
            };
            tokio::spawn(task.run(rx.clone()));
        }
        Coalescer { tx }
    }

    /// Decides `group` in the shard's next call.
    pub async fn decide(
        &self,
        group: Group,
        fixed_now: Option<Micros>,
    ) -> Result<Reply, StoreError> {
        let mut pending = self.enqueue(group, fixed_now).await?;
        std::future::poll_fn(|cx| poll_outcome(&mut pending, cx)).await
    }

    /// Queues `group` for the shard's next call; the answer comes on the receiver.
    /// Dropping the receiver before the call is sent leaves the group unsent.
    pub async fn enqueue(
        &self,
        group: Group,
        fixed_now: Option<Micros>,
    ) -> Result<Pending, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            group,
            fixed_now,
            reply,
        };
        self.tx.send(job).await.map_err(|_| closed())?;
        Ok(answer)
    }
}

/// Where a queued group's outcome arrives.
pub type Pending = oneshot::Receiver<Result<Reply, StoreError>>;

/// The outcome of a queued group, once it has come; a shard task that ended without
/// answering is an unavailable shard. Borrowed, so that a caller that stops waiting
/// still holds the receiver (and can hand it on).
pub fn poll_outcome(
    pending: &mut Pending,
    cx: &mut Context<'_>,
) -> Poll<Result<Reply, StoreError>> {
    Pin::new(pending)
        .poll(cx)
        .map(|answer| answer.unwrap_or_else(|_| Err(closed())))
}

struct ShardTask {
    link: Link,
    master: Option<Arc<Master>>,
    /// The master's generation `link` was made for.
    seen: u64,
    scripts: Scripts,
    health: Arc<Health>,
    call_timeout: Duration,
}

impl ShardTask {
    async fn run(mut self, rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>) {
        self.link.warm(&self.scripts).await;
        // A job taken from the queue that did not fit the previous call.
        let mut next: Option<Job> = None;
        let mut batch: Vec<Job> = Vec::new();
        loop {
            // The queue is taken in turns: while one task's call is in flight, the
            // other collects the next one.
            let mut queue = rx.lock().await;
            let first = match next.take() {
                Some(job) => job,
                None => match queue.recv().await {
                    Some(job) => job,
                    None => return,
                },
            };
            let fixed_now = first.fixed_now;
            let mut keys = first.group.keys.len();
            batch.push(first);
            while batch.len() < MAX_REQUESTS {
                let Ok(job) = queue.try_recv() else { break };
                // Tests only: one call decides at one fixed time.
                if job.fixed_now != fixed_now || keys + job.group.keys.len() > MAX_KEYS {
                    next = Some(job);
                    break;
                }
                keys += job.group.keys.len();
                batch.push(job);
            }
            drop(queue);
            // Nobody waits for these any more: deciding them would spend for nothing.
            batch.retain(|job| !job.reply.is_closed());
            if batch.is_empty() {
                continue;
            }
            match self.call(&batch, fixed_now).await {
                Ok(replies) => {
                    for (job, reply) in batch.drain(..).zip(replies) {
                        let _ = job.reply.send(Ok(reply));
                    }
                }
                Err(e) => {
                    for job in batch.drain(..) {
                        let _ = job.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    async fn call(
        &mut self,
        batch: &[Job],
        fixed_now: Option<Micros>,
    ) -> Result<Vec<Reply>, StoreError> {
        // Requests queued before the shard went down fail at once, as new ones do.
        self.health.check()?;
        let guard = self.health.guard();
        let groups: Vec<&Group> = batch.iter().map(|j| &j.group).collect();
        let sizes: Vec<usize> = groups.iter().map(|g| g.hits.len()).collect();
        let result = match route(self.master.as_deref(), &mut self.link, &mut self.seen) {
            Ok(routed) => {
                if routed {
                    // A link made for a new master: connected and loaded ahead of
                    // the call, as a standalone shard's are at start.
                    self.link.warm(&self.scripts).await;
                }
                let sent = send(&mut self.link, &self.scripts, &groups, fixed_now);
                match tokio::time::timeout(self.call_timeout, sent).await {
                    Ok(Ok(values)) => scripts::parse_replies(&values, &sizes),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(StoreError::Timeout),
                }
            }
            Err(e) => Err(e),
        };
        self.health
            .set_by_function(self.link.functions == Some(true));
        guard.finish(&result);
        if let (Some(master), Err(e)) = (&self.master, &result) {
            if e.is_transient() {
                // A stale address fails like a dead one: ask the sentinels.
                master.suspect();
            }
        }
        result
    }
}

/// Points a Sentinel shard's link at the master's current address when that moved
/// since the link was made for generation `seen` (one relaxed load when it has not).
/// Whether it made a new link.
fn route(master: Option<&Master>, link: &mut Link, seen: &mut u64) -> Result<bool, StoreError> {
    let Some(master) = master else {
        return Ok(false);
    };
    if *seen == master.generation() && link.target.is_some() {
        return Ok(false);
    }
    let (new, generation) = Link::to_master(master)?;
    *link = new;
    *seen = generation;
    Ok(true)
}

/// Loads the decide function library over `wire` unless `functions` already says
/// whether the server has it, and records a lasting answer: whether calls go by
/// `FCALL`. A passing refusal (out of memory, loading) has this call go by script
/// and the next one ask again.
async fn load_library(
    wire: &mut Wire,
    req: &mut Request,
    scripts: &Scripts,
    functions: &mut Option<bool>,
) -> Result<bool, StoreError> {
    if let Some(known) = *functions {
        return Ok(known);
    }
    scripts.decide_library.write_load(req);
    let loaded = scripts::Library::loaded(&wire.query(req).await?);
    *functions = loaded;
    Ok(loaded == Some(true))
}

/// Sends one decide call and returns the script's reply values.
async fn send(
    link: &mut Link,
    scripts: &Scripts,
    groups: &[&Group],
    fixed_now: Option<Micros>,
) -> Result<Vec<i64>, StoreError> {
    let (target, conn, req, functions) = match link {
        Link {
            target: Some(target),
            conn,
            req,
            functions,
        } => (target, conn, req, functions),
        Link { target: None, .. } => {
            return Err(StoreError::failed(ErrorKind::Connection, "no master known"));
        }
    };
    // Out of its slot while in use: a call abandoned half way (the timeout drops this
    // future) or failed leaves no connection behind with a reply still to come.
    // One the server closed while idle (its `timeout`) is replaced before the call.
    let mut wire = match conn.take().and_then(|mut w| (!w.stale()).then_some(w)) {
        Some(wire) => wire,
        None => Wire::connect(target).await?,
    };
    let mut answer = None;
    if *functions != Some(false) && load_library(&mut wire, req, scripts, functions).await? {
        let by = By::Function(scripts.decide_library.name());
        scripts::write_decide(req, by, groups, fixed_now);
        let mut first = wire.call(req).await?;
        if matches!(&first, Answer::Error(e) if scripts::Library::missing(e)) {
            // Gone from the server (a restart, FUNCTION FLUSH, a failover): load it
            // again, or call by script from now on if that is refused.
            *functions = None;
            if load_library(&mut wire, req, scripts, functions).await? {
                scripts::write_decide(req, by, groups, fixed_now);
                first = wire.call(req).await?;
                if matches!(&first, Answer::Error(e) if scripts::Library::missing(e)) {
                    // Loaded, and still not callable: this server or user has no
                    // `FCALL` (renamed, or an ACL without it).
                    *functions = Some(false);
                }
            }
        }
        if *functions == Some(true) {
            answer = Some(first);
        }
    }
    let answer = match answer {
        Some(answer) => answer,
        None => {
            scripts::write_decide(req, By::Hash(scripts.decide.hash()), groups, fixed_now);
            let mut answer = wire.call(req).await?;
            if matches!(&answer, Answer::Error(e) if e.starts_with("NOSCRIPT")) {
                // Redis lost its scripts (restart, SCRIPT FLUSH): EVAL caches it again.
                scripts::write_decide(req, By::Text, groups, fixed_now);
                answer = wire.call(req).await?;
            }
            answer
        }
    };
    match answer {
        Answer::Integers(values) => {
            *conn = Some(wire);
            Ok(values)
        }
        Answer::Error(e) => {
            let e = super::error::shard_reply(e);
            // Only a script error leaves the connection as good as it was. A shard in
            // an outage gets a fresh one next time, so a URL whose name moved to the
            // new master after a failover reaches it; Redis closes a connection it
            // refused for want of AUTH or for a protocol error anyway.
            if e.kind() == Some(ErrorKind::Script) {
                *conn = Some(wire);
            }
            Err(e)
        }
        Answer::Status => {
            *conn = Some(wire);
            Err(StoreError::failed(
                ErrorKind::Protocol,
                "decide script answered no array",
            ))
        }
    }
}
