//! One cluster node's calls, pipelined over a couple of connections.
//!
//! Calls for a node are queued; each of its [`CONNECTIONS`] tasks takes everything
//! queued (up to [`MAX_BATCH`] calls), writes the calls in one write and reads their
//! replies in order. While one task waits for its replies the other collects the next
//! batch, so under load a round trip and a write serve many calls, and an idle node
//! gets a lone call at once. Unlike a standalone shard's coalescing, each call stays a
//! command of its own: the calls' keys live in different slots.
//!
//! A batch is bounded by the node's timeout; an error or timeout fails the calls not
//! yet answered and drops the connection, so no reply is matched to the wrong call.
//! A call whose caller stopped waiting before its batch was written is dropped unsent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Mutex};

use crate::{Error, ErrorKind, Request, Target, Value, Wire};

/// Connections (and batches in flight) per node.
pub const CONNECTIONS: usize = 2;
/// Most calls written together.
pub const MAX_BATCH: usize = 64;
/// Calls that may wait for a node; further callers wait to be queued.
const QUEUE: usize = 4096;

const ASKING: &[u8] = b"*1\r\n$6\r\nASKING\r\n";

struct Job {
    req: Arc<Request>,
    /// Sent after `ASKING` (an `ASK` redirect), whose `+OK` is read and dropped.
    asking: bool,
    /// Taken when the call is answered.
    reply: Option<oneshot::Sender<Result<Value, Error>>>,
}

/// The queue of one node. Dropping it ends the node's tasks once the queue drains.
pub struct Pipe {
    tx: mpsc::Sender<Job>,
}

fn closed() -> Error {
    Error::failed(ErrorKind::Connection, "cluster node queue closed")
}

impl Pipe {
    /// Starts the node's tasks (connected on first call). Must run inside a Tokio
    /// runtime.
    pub fn spawn(target: Target, timeout: Duration) -> Pipe {
        let (tx, rx) = mpsc::channel(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..CONNECTIONS {
            tokio::spawn(run(target.clone(), timeout, rx.clone()));
        }
        Pipe { tx }
    }

    /// Sends `req` (after `ASKING` when `asking`) and reads its reply.
    pub async fn call(&self, req: Arc<Request>, asking: bool) -> Result<Value, Error> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            req,
            asking,
            reply: Some(reply),
        };
        self.tx.send(job).await.map_err(|_| closed())?;
        answer.await.unwrap_or_else(|_| Err(closed()))
    }
}

async fn run(target: Target, timeout: Duration, rx: Arc<Mutex<mpsc::Receiver<Job>>>) {
    let mut conn: Option<Wire> = None;
    let mut out: Vec<u8> = Vec::new();
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    loop {
        // The queue is taken in turns: while one task's batch is in flight, the
        // other collects the next one.
        let mut queue = rx.lock().await;
        match queue.recv().await {
            Some(job) => batch.push(job),
            None => return,
        }
        while batch.len() < MAX_BATCH {
            let Ok(job) = queue.try_recv() else { break };
            batch.push(job);
        }
        drop(queue);
        batch.retain(|job| job.reply.as_ref().is_some_and(|r| !r.is_closed()));
        if batch.is_empty() {
            continue;
        }
        out.clear();
        for job in &batch {
            if job.asking {
                out.extend_from_slice(ASKING);
            }
            out.extend_from_slice(job.req.bytes());
        }
        let mut answered = 0;
        let sent = exchange(&mut conn, &target, &out, &mut batch, &mut answered);
        let failed = match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(Error::Timeout),
        };
        if let Some(e) = failed {
            conn = None;
            for reply in batch.drain(answered..).filter_map(|j| j.reply) {
                let _ = reply.send(Err(e.clone()));
            }
        }
        batch.clear();
    }
}

/// Writes `out` (the batch's calls) and answers the batch's calls in order, counting
/// them in `answered`; connects first when there is no connection.
async fn exchange(
    conn: &mut Option<Wire>,
    target: &Target,
    out: &[u8],
    batch: &mut [Job],
    answered: &mut usize,
) -> Result<(), Error> {
    if conn.as_mut().is_none_or(Wire::stale) {
        *conn = Some(Wire::connect(target).await?);
    }
    let wire = conn.as_mut().expect("connected above");
    wire.send(out).await?;
    for job in batch.iter_mut() {
        let asked = if job.asking {
            Some(wire.next().await?)
        } else {
            None
        };
        let mut value = wire.next().await?;
        if let Some(Value::Error(e)) = asked {
            value = Value::Error(e);
        }
        if let Some(reply) = job.reply.take() {
            // A caller that left no longer needs it.
            let _ = reply.send(Ok(value));
        }
        *answered += 1;
    }
    Ok(())
}
