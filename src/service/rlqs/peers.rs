//! The streams of each limited bucket on this replica, so that a report which moves
//! a bucket's split reaches the bucket's other streams at once rather than at their
//! own next report, up to one interval later.
//!
//! Without it, shares add up to more than the limit whenever one Envoy's demand
//! jumps: the others keep the larger shares they were given against its old demand
//! until they report again. Each other stream is sent the bucket's new total
//! ([`Nudge`]), works out its own share from its last demand and, if that moved by
//! more than [`HYSTERESIS`](crate::quota::HYSTERESIS), sends Envoy an assignment on
//! the open stream unasked. Streams of other replicas learn the new total from Redis
//! at their next report.
//!
//! One mutex over the table: it is taken once per bucket per report (every few
//! seconds per Envoy), never by ShouldRateLimit. Each stream's inbox is bounded and a
//! full one drops the nudge: it is a hint, and the stream's next report settles the
//! share anyway.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::store::Share;

/// Nudges a stream may hold unread before more are dropped.
pub const INBOX: usize = 64;

/// A bucket's new demand total, from one stream's report.
#[derive(Debug)]
pub struct Nudge {
    /// The bucket's pairs, sorted by key, as the reporting stream saw them.
    pub entries: Vec<(String, String)>,
    /// Its demand record's key.
    pub key: String,
    /// Every live stream's demand, summed, just after the report.
    pub share: Share,
}

/// One stream's inbox, by its id.
type Member = (String, mpsc::Sender<Arc<Nudge>>);

/// Streams by bucket (demand key).
#[derive(Debug, Default)]
pub struct Peers {
    buckets: Mutex<HashMap<String, Vec<Member>>>,
}

impl Peers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Member>>> {
        // A panic elsewhere leaves the table as it was: still usable.
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `stream` reports `key` and takes nudges for it in `inbox`.
    pub fn join(&self, key: &str, stream: &str, inbox: &mpsc::Sender<Arc<Nudge>>) {
        let mut all = self.lock();
        let members = all.entry(key.to_string()).or_default();
        if !members.iter().any(|(id, _)| id == stream) {
            members.push((stream.to_string(), inbox.clone()));
        }
    }

    /// `stream` no longer reports `key`.
    pub fn leave(&self, key: &str, stream: &str) {
        let mut all = self.lock();
        if let Some(members) = all.get_mut(key) {
            members.retain(|(id, _)| id != stream);
            if members.is_empty() {
                all.remove(key);
            }
        }
    }

    /// Tells every stream of the nudge's bucket but `from` its new total.
    pub fn nudge(&self, from: &str, nudge: Nudge) {
        let all = self.lock();
        let Some(members) = all.get(&nudge.key) else {
            return;
        };
        if members.len() < 2 {
            return;
        }
        let nudge = Arc::new(nudge);
        for (id, inbox) in members {
            if id != from {
                // Full or closed: dropped (see the module's comment).
                let _ = inbox.try_send(nudge.clone());
            }
        }
    }

    /// Buckets with at least one stream.
    #[cfg(test)]
    pub fn buckets(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nudge(key: &str) -> Nudge {
        Nudge {
            entries: vec![("route".into(), "api".into())],
            key: key.into(),
            share: Share {
                total: 60.0,
                streams: 2,
            },
        }
    }

    #[test]
    fn nudges_reach_the_buckets_other_streams_and_a_full_inbox_drops_them() {
        let peers = Peers::default();
        let (a_tx, mut a_rx) = mpsc::channel(INBOX);
        let (b_tx, mut b_rx) = mpsc::channel(INBOX);
        let (c_tx, mut c_rx) = mpsc::channel(INBOX);
        peers.join("k", "a", &a_tx);
        peers.join("k", "a", &a_tx);
        peers.join("k", "b", &b_tx);
        peers.join("other", "c", &c_tx);
        for _ in 0..INBOX + 10 {
            peers.nudge("a", nudge("k"));
        }
        assert!(a_rx.try_recv().is_err(), "never to the reporting stream");
        assert!(c_rx.try_recv().is_err(), "never to another bucket's");
        let mut got = 0;
        while let Ok(n) = b_rx.try_recv() {
            assert_eq!(n.key, "k");
            got += 1;
        }
        assert_eq!(got, INBOX, "the rest dropped, the sender never waits");
        peers.nudge("b", nudge("k"));
        assert!(a_rx.try_recv().is_ok());
        assert!(a_rx.try_recv().is_err(), "a joined twice is one member");
        peers.leave("k", "a");
        peers.nudge("b", nudge("k"));
        assert!(a_rx.try_recv().is_err(), "a left");
        peers.leave("k", "b");
        peers.leave("other", "c");
        assert_eq!(peers.buckets(), 0);
    }
}
