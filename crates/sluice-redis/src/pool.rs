//! A few connections to one server for the calls off the decide path: refunds,
//! peeks, the block list, RLQS demand, key counts and queries.
//!
//! A call takes an idle connection or makes one, and puts it back only when the
//! call ended with a reply (an error reply included): a call abandoned half way (its
//! caller's timeout dropped it) or failed takes its connection with it, so no reply
//! is ever read by the wrong call. At most [`MAX_OPEN`] calls are under way at once;
//! more wait their turn, bounded by their caller's timeout.

use std::sync::Mutex;

use tokio::sync::Semaphore;

use crate::{Error, Request, Target, Value, Wire};

/// Most connections (and calls under way) per server.
pub const MAX_OPEN: usize = 8;

pub struct Pool {
    target: Target,
    idle: Mutex<Vec<Wire>>,
    open: Semaphore,
}

impl Pool {
    /// No connection is made until the first call.
    pub fn new(target: Target) -> Pool {
        Pool {
            target,
            idle: Mutex::new(Vec::new()),
            open: Semaphore::new(MAX_OPEN),
        }
    }

    /// Sends `req` and reads its reply.
    pub async fn query(&self, req: &Request) -> Result<Value, Error> {
        let _turn = self
            .open
            .acquire()
            .await
            .expect("the pool's semaphore is never closed");
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        // One the server closed while idle (its `timeout`) is replaced.
        let mut wire = match idle.and_then(|mut w| (!w.stale()).then_some(w)) {
            Some(w) => w,
            None => Wire::connect(&self.target).await?,
        };
        let value = wire.query(req).await?;
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(wire);
        Ok(value)
    }
}
