//! The side channel between replicas, the answering half: peers that said they are
//! cut off from a shard this replica reaches. Each is counted missing at once (its
//! share reserved, as for a replica whose heartbeat stopped) until its word
//! lapses ([`HOLD`], renewed by each question) or, once it has stopped asking
//! ([`QUIET`]), it beats on that shard again, whichever comes first.
//!
//! Only live peers are held, so what anyone can post changes nothing but the
//! reservation of a replica that is serving, and only ever makes it larger.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::algorithm::Micros;
use crate::store::{parse_member, ShardBeats};

use super::{lock, since};

/// How long a peer's word holds: a few of its questions ([`super::peers::ASK_EVERY`]),
/// so one lost question does not lift the reservation.
pub const HOLD: Micros = 2_000_000;

/// A peer that asked within this is still cut off, whatever its heartbeat says:
/// its beats can reach the shard when its decisions, with a far shorter timeout,
/// cannot. Two of its questions ([`super::peers::ASK_EVERY`]).
pub const QUIET: Micros = 2 * super::peers::ASK_EVERY;

/// One shard a peer is cut off from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold {
    shard: usize,
    /// Until when (limiter clock) the word holds.
    until: Micros,
    /// The shard's own clock when this replica reached it for the peer (ms): a beat
    /// of the peer's scored later is a beat since.
    reached_at: u64,
    /// When (limiter clock) the peer last asked.
    asked: Micros,
}

/// A held peer, as `/debug/store` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPeer {
    pub id: String,
    pub shards: Vec<usize>,
    /// The longest any of its holds has left.
    pub left: Micros,
}

/// The peers held, by id.
#[derive(Debug, Default)]
pub struct Held {
    peers: Mutex<HashMap<String, Vec<Hold>>>,
}

impl Held {
    /// Holds `id`'s share for [`HOLD`] from `now`: it is cut off from `shard`, which
    /// this replica reached at `reached_at` (the shard's clock).
    pub fn hold(&self, id: &str, shard: usize, reached_at: u64, now: Micros) {
        let mut peers = lock(&self.peers);
        let holds = peers.entry(id.to_string()).or_default();
        let hold = Hold {
            shard,
            until: now.saturating_add(HOLD),
            reached_at,
            asked: now,
        };
        match holds.iter_mut().find(|h| h.shard == shard) {
            Some(h) => *h = hold,
            None => holds.push(hold),
        }
    }

    /// Drops the holds that have lapsed at `now`; whether any went.
    pub fn expire(&self, now: Micros) -> bool {
        let mut peers = lock(&self.peers);
        let before = peers.len();
        for holds in peers.values_mut() {
            holds.retain(|h| h.until > now);
        }
        peers.retain(|_, holds| !holds.is_empty());
        peers.len() != before
    }

    /// Drops the holds of peers that beat again on their shard since it was
    /// reached for them and have stopped asking ([`QUIET`]); whether any went.
    pub fn beat_again(&self, shards: &[ShardBeats], now: Micros) -> bool {
        let mut peers = lock(&self.peers);
        if peers.is_empty() {
            return false;
        }
        let before = peers.len();
        for (id, holds) in peers.iter_mut() {
            holds.retain(|h| {
                let latest = shards
                    .iter()
                    .filter(|s| s.shard == h.shard)
                    .flat_map(|s| &s.live)
                    .filter(|(m, _)| parse_member(m).0 == id.as_str())
                    .map(|(_, beat)| *beat)
                    .max();
                since(now, h.asked) < QUIET || latest.is_none_or(|beat| beat <= h.reached_at)
            });
        }
        peers.retain(|_, holds| !holds.is_empty());
        peers.len() != before
    }

    /// The peers held that `live` counts as live (the heartbeat already counts the
    /// others missing).
    pub fn among(&self, live: impl Fn(&str) -> bool) -> u32 {
        lock(&self.peers).keys().filter(|id| live(id)).count() as u32
    }

    pub fn status(&self, now: Micros) -> Vec<HeldPeer> {
        let mut out: Vec<HeldPeer> = lock(&self.peers)
            .iter()
            .map(|(id, holds)| HeldPeer {
                id: id.clone(),
                shards: holds.iter().map(|h| h.shard).collect(),
                left: holds
                    .iter()
                    .map(|h| h.until.saturating_sub(now))
                    .max()
                    .unwrap_or(0),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beats(shard: usize, live: &[(&str, u64)]) -> ShardBeats {
        ShardBeats {
            shard,
            live: live.iter().map(|(m, b)| (m.to_string(), *b)).collect(),
        }
    }

    #[test]
    fn a_hold_lapses_unless_renewed() {
        let held = Held::default();
        held.hold("a", 0, 1_000, 10);
        assert!(!held.expire(10 + HOLD - 1));
        held.hold("a", 0, 1_400, 10 + HOLD / 2);
        assert!(!held.expire(10 + HOLD));
        assert_eq!(held.status(10 + HOLD)[0].shards, [0]);
        assert!(held.expire(10 + HOLD / 2 + HOLD));
        assert!(held.status(0).is_empty());
    }

    #[test]
    fn a_hold_lifts_when_the_peer_beats_again_on_that_shard_after_it_was_reached() {
        let held = Held::default();
        held.hold("a", 1, 5_000, 0);
        // Its beat before the cut, and a beat on another shard, change nothing.
        assert!(!held.beat_again(
            &[
                beats(1, &[("a@10.0.0.1:8080", 4_900)]),
                beats(0, &[("a@10.0.0.1:8080", 5_100)]),
            ],
            QUIET
        ));
        assert_eq!(held.among(|id| id == "a"), 1);
        assert_eq!(held.among(|_| false), 0, "counted missing already");
        let again = [beats(1, &[("a@10.0.0.1:8080", 5_200)])];
        // While it still asks, a beat that got through is no sign it is back (its
        // decisions may still time out).
        assert!(!held.beat_again(&again, QUIET - 1));
        assert_eq!(held.among(|_| true), 1);
        assert!(held.beat_again(&again, QUIET));
        assert_eq!(held.among(|_| true), 0);
    }
}
