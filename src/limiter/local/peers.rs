//! The side channel between replicas, the asking half: the live peers the latest
//! heartbeat listed (with the addresses where their HTTP servers answer), and this
//! replica's standing on each shard it finds it cannot reach.
//!
//! Cut off from a shard, a replica cannot tell "only I am cut off" (the others
//! decide the whole limit in the store, so whatever it admits comes on top) from
//! "the shard is down for everyone" (each must admit its share, or the total falls
//! to 0). So it asks every live peer, and one that reaches the shard reserves this
//! replica's share at once, as it does for a replica whose heartbeat stopped
//! ([`super::held`]). Until every peer has answered, this replica admits nothing of
//! that shard's counters; then it decides with its share, whichever the answers.
//! A peer that never answers is waited for until the heartbeat would have told the
//! others anyway ([`NOTICE`]). With no peer to ask, the share at once.
//!
//! The request path comes here only when a call failed ([`Peers::may_share`]), and
//! once an episode has started it reads a word or two there, without the lock,
//! whether it waits for the peers or shares; the questions go out from a task of
//! the server's ([`Peers::due`], [`Peers::answered`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::algorithm::Micros;

use super::{lock, since};

/// How often a replica still cut off asks again: its peers hold its share for
/// [`super::held::HOLD`], so a question renewed this often keeps it held.
pub const ASK_EVERY: Micros = 500_000;

/// How long a replica waits for a peer that does not answer: a replica is missing
/// to the others once its beat is older than the live span, and they learn it at
/// their next beat. After that their heartbeat reserves its share anyway.
pub const NOTICE: Micros = super::BEATS.live.as_micros() as Micros + 1_000_000;

/// Shards whose failed calls are answered without the lock, at least: a store of
/// more shards has a word for each ([`Peers::new`]).
const FAST: usize = 64;

/// A failed call on the lock-free path writes its time at most this often per
/// shard, so that a lost shard's calls mostly only read.
const FAILED_STEP: Micros = 10_000;

/// A live replica other than this one, as its heartbeat names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: String,
    /// Where its HTTP server answers; `None` for a replica that advertises none
    /// (an older version, or one with the side channel off): it cannot be asked.
    pub address: Option<String>,
}

/// This replica's standing on one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// The shard answers (or nothing has failed there).
    Reaching,
    /// Cut off, and not every peer has answered: nothing is admitted locally.
    Waiting,
    /// Cut off, and a peer reaches the shard: it reserved this replica's share.
    Alone,
    /// Cut off, and no peer reaches the shard.
    DownForAll,
    /// Cut off, and some peer has not answered for as long as the heartbeat takes
    /// to notice: the share, as before the side channel.
    Unanswered,
    /// Cut off with no peer to ask: the share at once.
    NoPeers,
}

impl Standing {
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Reaching => "reaching",
            Standing::Waiting => "waiting_for_peers",
            Standing::Alone => "cut_off_alone",
            Standing::DownForAll => "down_for_all",
            Standing::Unanswered => "peers_silent",
            Standing::NoPeers => "no_peers",
        }
    }
}

/// A peer's answer to "do you reach this shard?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// It reaches the shard, and holds this replica's share.
    Reached,
    NotReached,
    /// No answer in time, or not one that reads.
    Silent,
}

impl Answer {
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Reached => "reached",
            Answer::NotReached => "not_reached",
            Answer::Silent => "no_answer",
        }
    }
}

/// Questions to send now: about `shard`, to `peers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub shard: usize,
    /// The episode asked about: answers that come back after it ended are not
    /// taken for the next one.
    pub episode: u64,
    pub peers: Vec<Peer>,
}

/// One shard this replica is cut off from, as `/debug/store` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct CutStatus {
    pub shard: usize,
    pub standing: Standing,
    /// Since the first failure of this episode.
    pub for_us: Micros,
    /// How long the peers took to answer (from the first failure to the standing
    /// that followed `Waiting`), once they have.
    pub answered_in: Option<Micros>,
    /// Peers that reach the shard, by their latest answers.
    pub reached_by: usize,
}

#[derive(Debug, Clone)]
struct Cut {
    /// Numbers this episode among the replica's ([`Round::episode`]).
    episode: u64,
    standing: Standing,
    since: Micros,
    /// The latest failure seen on the request path.
    failed: Micros,
    asked: Option<Micros>,
    answered_in: Option<Micros>,
    /// Each peer's latest answer this episode (never `Silent`).
    answers: Vec<(String, Answer)>,
}

impl Cut {
    fn new(episode: u64, now: Micros, standing: Standing) -> Cut {
        Cut {
            episode,
            standing,
            since: now,
            failed: now,
            asked: None,
            answered_in: None,
            answers: Vec::new(),
        }
    }

    fn shares(&self) -> bool {
        !matches!(self.standing, Standing::Waiting | Standing::Reaching)
    }

    /// Moves on from the answers so far: once every peer has answered, `Alone` if
    /// one reaches the shard, else `DownForAll`; a peer silent past [`NOTICE`]
    /// gives the share as well.
    fn review(&mut self, peers: &[Peer], now: Micros) {
        if matches!(self.standing, Standing::Reaching | Standing::NoPeers) {
            return;
        }
        let answer = |p: &Peer| {
            self.answers
                .iter()
                .find(|(id, _)| *id == p.id)
                .map(|(_, a)| *a)
        };
        let all = peers.iter().all(|p| answer(p).is_some());
        let reached = peers.iter().any(|p| answer(p) == Some(Answer::Reached));
        let next = if all {
            if reached {
                Standing::Alone
            } else {
                Standing::DownForAll
            }
        } else if self.standing == Standing::Waiting && since(now, self.since) >= NOTICE {
            Standing::Unanswered
        } else {
            self.standing
        };
        if self.standing == Standing::Waiting && next != Standing::Waiting {
            self.answered_in = Some(now.saturating_sub(self.since));
        }
        self.standing = next;
    }
}

/// The live peers and this replica's standing per shard.
#[derive(Debug)]
pub struct Peers {
    /// Whether this replica advertises an address: without one, it asks nobody
    /// (as before the side channel).
    asking: AtomicBool,
    known: Mutex<Vec<Peer>>,
    /// By shard; `Reaching` for shards never cut off.
    cuts: Mutex<Vec<Option<Cut>>>,
    /// Per shard, for the failed calls to read without the lock.
    fast: Box<[Fast]>,
    /// Episodes started so far, to number the next.
    episodes: AtomicU64,
    /// Wakes the asking task when an episode starts.
    wake: tokio::sync::Notify,
}

/// A shard's standing as its failed calls read it without the lock (as `cuts`
/// says, published under its lock).
#[derive(Debug, Default)]
struct Fast {
    /// 0 unless it is cut off and shares, else its latest failed call (within
    /// [`FAILED_STEP`]).
    sharing: AtomicU64,
    /// 0 unless it is cut off and waits for the peers, else when the wait began.
    waiting: AtomicU64,
    /// The latest failed call while it waits (within [`FAILED_STEP`]).
    failed: AtomicU64,
}

impl Default for Peers {
    fn default() -> Peers {
        Peers::new(FAST)
    }
}

impl Peers {
    /// For a store of `shards` shards: the failed calls of each are answered
    /// without a lock shared by every shard, however many there are.
    pub fn new(shards: usize) -> Peers {
        Peers {
            asking: AtomicBool::new(false),
            known: Mutex::default(),
            cuts: Mutex::default(),
            fast: (0..shards.max(FAST)).map(|_| Fast::default()).collect(),
            episodes: AtomicU64::new(0),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Runs `f` on another thread while the lock over every shard's standing is
    /// held (a round being sent, the admin page being read): its output, if it
    /// came within 5 s.
    #[cfg(test)]
    pub(crate) fn while_locked<T: Send>(
        &self,
        f: impl FnOnce() -> T + Send,
    ) -> Result<T, std::sync::mpsc::RecvTimeoutError> {
        std::thread::scope(|s| {
            let held = lock(&self.cuts);
            let (tx, rx) = std::sync::mpsc::channel();
            s.spawn(move || {
                let _ = tx.send(f());
            });
            let answered = rx.recv_timeout(std::time::Duration::from_secs(5));
            drop(held);
            answered
        })
    }

    /// Turns asking on: this replica advertises where it is reached.
    pub fn ask(&self, on: bool) {
        self.asking.store(on, Relaxed);
    }

    fn asking(&self) -> bool {
        self.asking.load(Relaxed)
    }

    /// Sets `shard`'s entry of `fast` from its cut (under the `cuts` lock):
    /// whether it shares, and since when it last failed; whether it waits, and
    /// since when.
    fn publish(&self, shard: usize, cut: Option<&Cut>) {
        let Some(fast) = self.fast.get(shard) else {
            return;
        };
        match cut.filter(|c| c.shares()) {
            Some(c) => _ = fast.sharing.fetch_max(c.failed.max(1), Relaxed),
            None => fast.sharing.store(0, Relaxed),
        }
        let waits = cut.filter(|c| c.standing == Standing::Waiting);
        fast.waiting
            .store(waits.map_or(0, |c| c.since.max(1)), Relaxed);
        if cut.is_none() {
            fast.failed.store(0, Relaxed);
        }
    }

    /// The latest failed call on `shard`, whichever path saw it.
    fn last_failed(&self, shard: usize, cut: &Cut) -> Micros {
        let fast = self
            .fast
            .get(shard)
            .map_or(0, |f| f.sharing.load(Relaxed).max(f.failed.load(Relaxed)));
        cut.failed.max(fast)
    }

    /// The live peers, as the latest heartbeat listed them.
    pub fn learn(&self, peers: Vec<Peer>) {
        *lock(&self.known) = peers;
    }

    pub fn known(&self) -> Vec<Peer> {
        lock(&self.known).clone()
    }

    /// Whether `id` is a live peer.
    pub fn is_live(&self, id: &str) -> bool {
        lock(&self.known).iter().any(|p| p.id == id)
    }

    /// A call to `shard` failed: whether this replica may decide its counters with
    /// its share now. The first failure starts an episode (waiting for the peers,
    /// or the share at once with none to ask) and wakes the asking task.
    pub fn may_share(&self, shard: usize, now: Micros) -> bool {
        // Once the peers have answered, a lost shard's calls read one word (and now
        // and then write the time): no lock while the outage lasts.
        if let Some(fast) = self.fast.get(shard) {
            let failed = fast.sharing.load(Relaxed);
            if failed != 0 {
                if since(now, failed) >= FAILED_STEP {
                    // Not over a 0 that the end of the episode wrote meanwhile.
                    let _ = fast
                        .sharing
                        .compare_exchange(failed, now.max(1), Relaxed, Relaxed);
                }
                return true;
            }
            // Nor while it waits for them: their answers are reviewed as they come
            // (`answered`), and the wait's end by the asking task's ticks (`due`)
            // or by the first call past it, below.
            let began = fast.waiting.load(Relaxed);
            if began != 0 && since(now, began) < NOTICE {
                let failed = fast.failed.load(Relaxed);
                if since(now, failed) >= FAILED_STEP {
                    let _ = fast.failed.compare_exchange(failed, now, Relaxed, Relaxed);
                }
                return false;
            }
        }
        let mut cuts = lock(&self.cuts);
        if cuts.len() <= shard {
            cuts.resize(shard + 1, None);
        }
        if let Some(cut) = &mut cuts[shard] {
            cut.failed = now;
            if cut.standing == Standing::Waiting {
                let known = lock(&self.known);
                cut.review(&known, now);
            }
            self.publish(shard, Some(cut));
            return cut.shares();
        }
        let none = !self.asking() || lock(&self.known).is_empty();
        let standing = if none {
            Standing::NoPeers
        } else {
            Standing::Waiting
        };
        let cut = Cut::new(self.episodes.fetch_add(1, Relaxed), now, standing);
        let shares = cut.shares();
        self.publish(shard, Some(&cut));
        cuts[shard] = Some(cut);
        drop(cuts);
        if !shares {
            tracing::info!(
                shard,
                "local share: cut off from a shard; asking the peers whether they reach it (nothing admitted locally until they answer)"
            );
            self.wake.notify_one();
        }
        shares
    }

    /// Resolves when an episode has started since the last call.
    pub async fn woken(&self) {
        self.wake.notified().await
    }

    /// The shards this replica is cut off from.
    pub fn cut_off(&self) -> Vec<usize> {
        lock(&self.cuts)
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|_| i))
            .collect()
    }

    /// The shard answers again (the store says so, and no call there has failed
    /// for [`ASK_EVERY`]): the episode ends and the questions stop; the peers'
    /// holds lapse or lift when they see this replica beat.
    pub fn back(&self, shard: usize, now: Micros) {
        let mut cuts = lock(&self.cuts);
        let Some(slot) = cuts.get_mut(shard) else {
            return;
        };
        if slot
            .as_ref()
            .is_some_and(|c| since(now, self.last_failed(shard, c)) >= ASK_EVERY)
        {
            *slot = None;
            self.publish(shard, None);
            tracing::info!(shard, "local share: the shard answers again");
        }
    }

    /// The questions due now: every episode's first at once, then one every
    /// [`ASK_EVERY`], to every peer that has an address. Also lets a wait that has
    /// outlasted [`NOTICE`] give the share.
    pub fn due(&self, now: Micros) -> Vec<Round> {
        let known = lock(&self.known).clone();
        let askable: Vec<Peer> = known
            .iter()
            .filter(|p| p.address.is_some())
            .cloned()
            .collect();
        let mut rounds = Vec::new();
        for (shard, cut) in lock(&self.cuts).iter_mut().enumerate() {
            let Some(cut) = cut else { continue };
            cut.review(&known, now);
            self.publish(shard, Some(cut));
            if cut.standing == Standing::NoPeers || askable.is_empty() {
                continue;
            }
            if cut.asked.is_none_or(|at| since(now, at) >= ASK_EVERY) {
                cut.asked = Some(now);
                rounds.push(Round {
                    shard,
                    episode: cut.episode,
                    peers: askable.clone(),
                });
            }
        }
        rounds
    }

    /// The peers' answers about `shard` in `episode`: a peer's latest answer stands
    /// until it gives another (silence changes nothing). Answers about an episode
    /// that has ended change nothing.
    pub fn answered(&self, shard: usize, episode: u64, answers: &[(String, Answer)], now: Micros) {
        let known = lock(&self.known).clone();
        let mut cuts = lock(&self.cuts);
        let Some(Some(cut)) = cuts.get_mut(shard) else {
            return;
        };
        if cut.episode != episode {
            return;
        }
        for (id, answer) in answers {
            if *answer == Answer::Silent {
                continue;
            }
            match cut.answers.iter_mut().find(|(p, _)| p == id) {
                Some(entry) => entry.1 = *answer,
                None => cut.answers.push((id.clone(), *answer)),
            }
        }
        let before = cut.standing;
        cut.review(&known, now);
        self.publish(shard, Some(cut));
        if cut.standing != before {
            tracing::info!(
                shard,
                standing = cut.standing.as_str(),
                "local share: the peers answered"
            );
        }
    }

    /// Each shard this replica is cut off from.
    pub fn status(&self, now: Micros) -> Vec<CutStatus> {
        lock(&self.cuts)
            .iter()
            .enumerate()
            .filter_map(|(shard, c)| {
                let c = c.as_ref()?;
                Some(CutStatus {
                    shard,
                    standing: c.standing,
                    for_us: now.saturating_sub(c.since),
                    answered_in: c.answered_in,
                    reached_by: c
                        .answers
                        .iter()
                        .filter(|(_, a)| *a == Answer::Reached)
                        .count(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Micros = 1_000;

    fn peer(id: &str) -> Peer {
        Peer {
            id: id.to_string(),
            address: Some(format!("10.0.0.{}:8080", id.len())),
        }
    }

    fn two_peers() -> Peers {
        let peers = Peers::default();
        peers.ask(true);
        peers.learn(vec![peer("a"), peer("bb")]);
        peers
    }

    fn standing(peers: &Peers, shard: usize, now: Micros) -> Standing {
        peers
            .status(now)
            .iter()
            .find(|c| c.shard == shard)
            .map_or(Standing::Reaching, |c| c.standing)
    }

    #[test]
    fn a_cut_replica_admits_nothing_until_every_peer_has_answered_then_its_share() {
        let peers = two_peers();
        let t = 1_000_000;
        assert!(!peers.may_share(1, t), "waiting for the peers");
        assert_eq!(standing(&peers, 1, t), Standing::Waiting);
        // The first round goes at once, to both; the next not before ASK_EVERY.
        let rounds = peers.due(t);
        assert_eq!(rounds.len(), 1);
        assert_eq!((rounds[0].shard, rounds[0].peers.len()), (1, 2));
        assert!(peers.due(t + 10 * MS).is_empty());
        // One answers: still nothing.
        let episode = rounds[0].episode;
        peers.answered(1, episode, &[("a".into(), Answer::Reached)], t + 20 * MS);
        assert!(!peers.may_share(1, t + 21 * MS));
        // The other is silent in this round, answers in the next.
        peers.answered(1, episode, &[("bb".into(), Answer::Silent)], t + 25 * MS);
        assert!(!peers.may_share(1, t + 26 * MS));
        assert_eq!(peers.due(t + ASK_EVERY).len(), 1);
        peers.answered(
            1,
            episode,
            &[("bb".into(), Answer::NotReached)],
            t + ASK_EVERY + 5 * MS,
        );
        assert!(peers.may_share(1, t + ASK_EVERY + 6 * MS));
        let s = &peers.status(t + ASK_EVERY + 6 * MS)[0];
        assert_eq!(s.standing, Standing::Alone);
        assert_eq!(s.answered_in, Some(ASK_EVERY + 5 * MS));
        assert_eq!(s.reached_by, 1);
        // Other shards are untouched.
        assert_eq!(standing(&peers, 0, t), Standing::Reaching);
    }

    /// `peers.may_share(shard, now)` asked while the lock over every shard's
    /// standing is held: its answer, if it came.
    fn while_locked(
        peers: &Peers,
        shard: usize,
        now: Micros,
    ) -> Result<bool, std::sync::mpsc::RecvTimeoutError> {
        peers.while_locked(|| peers.may_share(shard, now))
    }

    #[test]
    fn a_call_waiting_for_the_peers_takes_no_lock_shared_by_every_shard() {
        let peers = two_peers();
        let t = 1_000_000;
        assert!(!peers.may_share(1, t), "waiting for the peers");
        // The waiting shard's calls are answered all the same.
        let answered = while_locked(&peers, 1, t + MS);
        assert_eq!(answered, Ok(false), "withheld at once");
        // The failure it saw keeps the episode open, as one seen under the lock does.
        peers.back(1, t + MS + ASK_EVERY - 1);
        assert_eq!(standing(&peers, 1, t + MS), Standing::Waiting);
        peers.back(1, t + MS + ASK_EVERY);
        assert_eq!(standing(&peers, 1, t + MS), Standing::Reaching);
        // Past the wait, the first call gives the share, as before.
        assert!(!peers.may_share(1, t + 2 * ASK_EVERY));
        assert!(!peers.may_share(1, t + 2 * ASK_EVERY + NOTICE - 1));
        assert!(peers.may_share(1, t + 2 * ASK_EVERY + NOTICE));
    }

    #[test]
    fn with_many_shards_the_last_ones_calls_take_no_lock_shared_by_every_shard() {
        let peers = Peers::new(100);
        peers.ask(true);
        peers.learn(vec![peer("a"), peer("bb")]);
        let t = 1_000_000;
        assert!(!peers.may_share(99, t), "waiting for the peers");
        assert_eq!(while_locked(&peers, 99, t + MS), Ok(false));
        let episode = peers.due(t + MS)[0].episode;
        let both = [
            ("a".to_string(), Answer::NotReached),
            ("bb".to_string(), Answer::NotReached),
        ];
        peers.answered(99, episode, &both, t + 2 * MS);
        assert_eq!(while_locked(&peers, 99, t + 3 * MS), Ok(true), "its share");
    }

    #[test]
    fn a_clock_stepped_back_ends_the_waits_instead_of_stretching_them() {
        let peers = two_peers();
        let t = 100_000_000;
        assert!(!peers.may_share(1, t));
        assert_eq!(peers.due(t).len(), 1);
        // Ten seconds back: the next round is due at once, and the wait for the
        // silent peers gives the share, as a wait past NOTICE does.
        let back = t - 10_000_000;
        assert_eq!(peers.due(back).len(), 1);
        assert_eq!(standing(&peers, 1, back), Standing::Unanswered);
        assert!(peers.may_share(1, back));
        // The failures seen before the step do not keep the episode open.
        peers.back(1, back + ASK_EVERY);
        assert_eq!(standing(&peers, 1, back + ASK_EVERY), Standing::Reaching);
    }

    #[test]
    fn no_peer_reaching_the_shard_is_down_for_all_and_a_later_reach_makes_it_alone() {
        let peers = two_peers();
        let t = 5_000_000;
        assert!(!peers.may_share(0, t));
        let episode = peers.due(t)[0].episode;
        let not = [
            ("a".to_string(), Answer::NotReached),
            ("bb".to_string(), Answer::NotReached),
        ];
        peers.answered(0, episode, &not, t + 30 * MS);
        assert!(peers.may_share(0, t + 31 * MS));
        assert_eq!(standing(&peers, 0, t), Standing::DownForAll);
        // Re-asked while cut off: one peer has the shard back and holds the share.
        assert_eq!(peers.due(t + ASK_EVERY).len(), 1);
        peers.answered(
            0,
            episode,
            &[("a".into(), Answer::Reached)],
            t + ASK_EVERY + MS,
        );
        assert_eq!(standing(&peers, 0, t), Standing::Alone);
        assert!(peers.may_share(0, t + ASK_EVERY + 2 * MS));
    }

    #[test]
    fn a_silent_peer_is_waited_for_until_the_heartbeat_would_have_noticed() {
        let peers = two_peers();
        let t = 9_000_000;
        assert!(!peers.may_share(0, t));
        let episode = peers.due(t)[0].episode;
        peers.answered(0, episode, &[("a".into(), Answer::Reached)], t + 10 * MS);
        assert!(!peers.may_share(0, t + NOTICE - 1));
        assert!(peers.may_share(0, t + NOTICE));
        assert_eq!(standing(&peers, 0, t + NOTICE), Standing::Unanswered);
        // A peer without an address cannot be asked: it is silent too.
        let peers = Peers::default();
        peers.ask(true);
        peers.learn(vec![Peer {
            id: "old".into(),
            address: None,
        }]);
        assert!(!peers.may_share(0, t));
        assert!(peers.due(t).is_empty(), "nobody to ask");
        assert!(!peers.may_share(0, t + NOTICE - 1));
        peers.due(t + NOTICE);
        assert_eq!(standing(&peers, 0, t + NOTICE), Standing::Unanswered);
    }

    #[test]
    fn with_no_peer_or_no_address_of_its_own_a_replica_shares_at_once() {
        let alone = Peers::default();
        alone.ask(true);
        assert!(alone.may_share(0, 1));
        assert_eq!(standing(&alone, 0, 1), Standing::NoPeers);
        assert!(alone.due(1).is_empty());
        let off = Peers::default();
        off.learn(vec![peer("a")]);
        assert!(off.may_share(0, 1), "the side channel off: as before");
        assert!(off.due(1).is_empty());
    }

    #[test]
    fn an_episode_ends_once_the_shard_has_not_failed_for_a_while_and_the_next_waits_again() {
        let peers = two_peers();
        let t = 1_000_000;
        assert!(!peers.may_share(2, t));
        let episode = peers.due(t)[0].episode;
        let both = [
            ("a".to_string(), Answer::Reached),
            ("bb".to_string(), Answer::Reached),
        ];
        peers.answered(2, episode, &both, t + MS);
        assert!(peers.may_share(2, t + 100 * MS));
        assert_eq!(peers.cut_off(), [2]);
        // Failed a moment ago (on the lock-free path): not over yet.
        assert!(peers.may_share(2, t + 300 * MS));
        peers.back(2, t + 300 * MS + ASK_EVERY - 1);
        assert_eq!(peers.cut_off(), [2]);
        peers.back(2, t + 300 * MS);
        assert_eq!(peers.cut_off(), [2]);
        peers.back(2, t + 300 * MS + ASK_EVERY);
        assert!(peers.cut_off().is_empty());
        assert!(peers.due(t + 2 * ASK_EVERY).is_empty(), "no more questions");
        // Cut off again: the old answers are gone, the peers are asked again, and
        // an answer about the last episode that comes late is not taken for this one.
        assert!(!peers.may_share(2, t + 3 * ASK_EVERY));
        assert_eq!(peers.due(t + 3 * ASK_EVERY).len(), 1);
        peers.answered(2, episode, &both, t + 3 * ASK_EVERY + MS);
        assert!(!peers.may_share(2, t + 3 * ASK_EVERY + 2 * MS));
        assert_eq!(standing(&peers, 2, t), Standing::Waiting);
    }
}
