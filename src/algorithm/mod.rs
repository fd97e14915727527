//! Rate-limit algorithms as pure functions of (limit, state, now, hits).
//!
//! Each algorithm lives in its own file and exposes one `decide` function. Nothing here
//! knows about stores, gRPC or clocks: the memory store calls these directly with its
//! clock, and the Redis Lua scripts mirror them with Redis `TIME`. A decision never
//! mutates its input; it returns the next state, which the caller commits only when
//! every limit of the request admitted it (all-or-nothing).

mod charge;
pub mod fixed_window;
pub mod leaky_bucket;
mod refund;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

pub use charge::{charge, owed_now};
pub use refund::refund;

#[cfg(test)]
pub(crate) mod testkit;

/// Microseconds since the Unix epoch. Redis `TIME` has the same resolution, so the
/// Lua scripts and these functions agree to the microsecond.
pub type Micros = u64;

/// Microseconds in one second.
pub const SECOND: Micros = 1_000_000;

/// The largest `burst`: 2^50, the most a counter holds and the largest number the
/// Redis scripts are given (they clamp larger ones).
pub const MAX_BURST: u64 = 1 << 50;

/// The longest a bucket may take to fill from empty, burst × window / requests:
/// 2^50 µs (about 35 years), as the longest window. A full bucket's state then
/// reaches at most that far ahead, below [`token_bucket::END_OF_TIME`] (2^53 µs)
/// until the year 2219 (7 × 2^50 µs), so its whole burst fits at once. A penalty's
/// tightening at most doubles that (it rounds the rate down): until 2184.
pub const MAX_FILL: Micros = 1 << 50;

/// Which algorithm a limit uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// A counter per window aligned to the Unix epoch.
    FixedWindow,
    /// Every admitted hit's timestamp, kept for one window. Exact.
    SlidingWindowLog,
    /// Weighted previous window plus the current one. The default.
    #[default]
    SlidingWindowCounter,
    /// Capacity `burst`, refilled continuously at the rate.
    TokenBucket,
    /// A queue of `burst` that drains at the rate; admitted requests wait their turn.
    LeakyBucket,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ];

    /// The name used in policies (`fixed_window`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
        }
    }

    /// Parses a policy name; `None` for an unknown one.
    pub fn parse(name: &str) -> Option<Algorithm> {
        Some(match name {
            "fixed_window" => Algorithm::FixedWindow,
            "sliding_window_log" => Algorithm::SlidingWindowLog,
            "sliding_window_counter" => Algorithm::SlidingWindowCounter,
            "token_bucket" => Algorithm::TokenBucket,
            "leaky_bucket" => Algorithm::LeakyBucket,
            _ => return None,
        })
    }
}

/// A limit as the algorithms see it: `requests` per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub algorithm: Algorithm,
    /// Requests admitted per window. May be 0 (everything denied).
    pub requests: u64,
    /// Window length, always > 0.
    pub window: Micros,
    /// token_bucket: capacity; leaky_bucket: queue length. Equals `requests` when the
    /// policy does not set it. Ignored by the window algorithms.
    pub burst: u64,
    /// fixed_window only: where its windows start, as a time modulo `window` (so
    /// always below it): 0 aligns them to the Unix epoch. A calendar window (a local
    /// day or month, `policy::Calendar`) is the fixed window of its current length
    /// that starts at local midnight. Ignored by the other algorithms.
    pub phase: Micros,
}

/// The stored state of one counter.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    FixedWindow(fixed_window::State),
    SlidingWindowLog(sliding_window_log::State),
    SlidingWindowCounter(sliding_window_counter::State),
    TokenBucket(token_bucket::State),
    LeakyBucket(leaky_bucket::State),
}

/// What one limit says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verdict {
    pub admitted: bool,
    /// Hits still admissible after this decision (after consuming, when admitted).
    pub remaining: u64,
    /// Time until the counter is back to its full allowance if no more hits arrive
    /// (fixed windows: until the window ends). Reported as `duration_until_reset`.
    pub reset: Micros,
    /// When denied: the shortest wait after which the same request would be admitted,
    /// never shorter than the truth (`u64::MAX` if it never can be, e.g. hits > limit).
    /// 0 when admitted.
    pub retry_after: Micros,
    /// leaky_bucket only: how long the OK answer is held so the request leaves the
    /// queue in its turn. 0 for every other algorithm, and when denied.
    pub delay: Micros,
    /// When admitted with nothing left (`remaining == 0`, hits > 0), after a charge
    /// that did not fit ([`charge`]), or when denied a request that can never fit
    /// (`retry_after == u64::MAX`, hits > 0): the wait until a one-hit request fits on
    /// the new state, exact like `retry_after` (`u64::MAX` if never). 0 otherwise.
    /// Lets a cache deny without asking again, and a never-fitting request's
    /// `retry-after` wait for the key to admit anything ([`Verdict::retry_wait`]).
    pub next_room: Micros,
    /// After a charge that did not fit ([`charge`]): what the key owes, in hits: how
    /// far its new state is past the limit (a window's count over `requests`, a
    /// bucket's hits below empty over `burst`, rounded up). In a peek (the admin API's
    /// Explain), what the key owes before the peeked hits ([`owed_now`]). 0 otherwise.
    pub owed: u64,
    /// leaky_bucket only: denied because the request's turn would come after the
    /// longest delay its caller waits ([`decide_within`]), though the queue had room;
    /// it took no place in it. Such a denial holds for that caller's deadline only
    /// (a caller with a longer one is admitted), so no cache may keep it.
    pub late: bool,
}

impl Verdict {
    /// The wait a denial's `retry-after` reports: `retry_after`, exact. A request
    /// that can never fit as sent (more hits than the limit holds) gets `window`, but
    /// never less than the wait until the key admits anything again: a charge past
    /// the limit leaves a debt that can outlast a window (a sliding window's weighted
    /// count, a bucket's hits below empty), so a client told one window would come
    /// back while even a one-hit request is still denied. That wait is `next_room`,
    /// or `reset` when not even one hit ever fits (a bucket owing to the end of
    /// time, a limit of 0).
    pub fn retry_wait(&self, window: Micros) -> Micros {
        if self.retry_after != u64::MAX {
            return self.retry_after;
        }
        let room = if self.next_room == u64::MAX {
            self.reset
        } else {
            self.next_room
        };
        window.max(room)
    }
}

/// A caller without a deadline: a leaky_bucket answer is held however late its turn.
pub const NO_DEADLINE: Micros = u64::MAX;

/// A verdict and the state to store if the request goes through.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The state after consuming `hits`. `None` when nothing changes (denied, or
    /// `hits == 0`): the caller then keeps the old state.
    pub next: Option<State>,
}

/// Decides one request of `hits` against `limit` at `now`.
///
/// `state` is `None` for a counter never seen (or expired). A state of another
/// algorithm (the policy changed) is treated as `None`.
pub fn decide(limit: &Limit, state: Option<&State>, now: Micros, hits: u64) -> Decision {
    decide_within(limit, state, now, hits, NO_DEADLINE)
}

/// [`decide`] for a caller who waits at most `max_delay` for its answer: a
/// leaky_bucket request whose turn comes later is denied at once ([`Verdict::late`])
/// and takes no place in the queue. The other algorithms hold no answer and ignore
/// it.
pub fn decide_within(
    limit: &Limit,
    state: Option<&State>,
    now: Micros,
    hits: u64,
    max_delay: Micros,
) -> Decision {
    let mut d = decide_alone(limit, state, now, hits, max_delay);
    let v = &mut d.verdict;
    // A hypothetical one-hit request at the same time, from a caller without a
    // deadline: on the new state after an admission that leaves no room (what every
    // caller must wait at least), on the old one after a denial no wait ends (when
    // the key admits anything, for its retry-after). Only these pay for it.
    let basis = match (v.admitted, hits > 0) {
        (true, true) if v.remaining == 0 => Some(d.next.as_ref().or(state)),
        (false, true) if v.retry_after == u64::MAX => Some(state),
        _ => None,
    };
    if let Some(basis) = basis {
        v.next_room = decide_alone(limit, basis, now, 1, NO_DEADLINE)
            .verdict
            .retry_after;
    }
    d
}

/// What [`decide_in_place`] changed in a state, for [`undo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change(Option<sliding_window_log::Added>);

impl Change {
    /// Whether the state changed (hits were recorded).
    pub fn changed(&self) -> bool {
        self.0.is_some()
    }
}

/// [`decide`] on a counter's state that the caller keeps, changed where it is, for
/// the algorithm whose state grows with its limit (sliding_window_log: copying its
/// log would cost more than the decision). `None` for the others, and for a state
/// of another algorithm: the caller then uses [`decide`]. The verdict is
/// [`decide`]'s, and `state` afterwards decides as its `next` would (or as the old
/// state, when nothing was recorded); a caller that does not keep the decision
/// (another limit of the request denied it) gives the change to [`undo`].
pub fn decide_in_place(
    limit: &Limit,
    state: &mut State,
    now: Micros,
    hits: u64,
) -> Option<(Verdict, Change)> {
    let State::SlidingWindowLog(log) = state else {
        return None;
    };
    if !in_place(limit.algorithm) {
        return None;
    }
    let (mut v, added) = sliding_window_log::decide_in_place(limit, log, now, hits);
    // As in `decide_within`: the state is now the new one after an admission, and
    // (but for expired entries) the old one after a denial.
    let room = match (v.admitted, hits > 0) {
        (true, true) => v.remaining == 0,
        (false, true) => v.retry_after == u64::MAX,
        _ => false,
    };
    if room {
        v.next_room = sliding_window_log::verdict(limit, log, now, 1).retry_after;
    }
    Some((v, Change(added)))
}

/// Whether [`decide_in_place`] decides the states of `algorithm`.
pub fn in_place(algorithm: Algorithm) -> bool {
    algorithm == Algorithm::SlidingWindowLog
}

/// Takes back what [`decide_in_place`] recorded in `state`.
pub fn undo(state: &mut State, change: Change) {
    if let (State::SlidingWindowLog(log), Some(added)) = (state, change.0) {
        log.undo(added);
    }
}

/// [`decide_within`] without `next_room`.
fn decide_alone(
    limit: &Limit,
    state: Option<&State>,
    now: Micros,
    hits: u64,
    max_delay: Micros,
) -> Decision {
    match limit.algorithm {
        Algorithm::FixedWindow => {
            let s = match state {
                Some(State::FixedWindow(s)) => Some(s),
                _ => None,
            };
            fixed_window::decide(limit, s, now, hits).map_state(State::FixedWindow)
        }
        Algorithm::SlidingWindowLog => {
            let s = match state {
                Some(State::SlidingWindowLog(s)) => Some(s),
                _ => None,
            };
            sliding_window_log::decide(limit, s, now, hits).map_state(State::SlidingWindowLog)
        }
        Algorithm::SlidingWindowCounter => {
            let s = match state {
                Some(State::SlidingWindowCounter(s)) => Some(s),
                _ => None,
            };
            sliding_window_counter::decide(limit, s, now, hits)
                .map_state(State::SlidingWindowCounter)
        }
        Algorithm::TokenBucket => {
            let s = match state {
                Some(State::TokenBucket(s)) => Some(s),
                _ => None,
            };
            token_bucket::decide(limit, s, now, hits).map_state(State::TokenBucket)
        }
        Algorithm::LeakyBucket => {
            let s = match state {
                Some(State::LeakyBucket(s)) => Some(s),
                _ => None,
            };
            leaky_bucket::decide(limit, s, now, hits, max_delay).map_state(State::LeakyBucket)
        }
    }
}

/// The time after which `state` carries no information (it would decide exactly like a
/// fresh counter), so a store may drop it.
pub fn expires_at(limit: &Limit, state: &State) -> Micros {
    match state {
        State::FixedWindow(s) => fixed_window::expires_at(limit, s),
        State::SlidingWindowLog(s) => sliding_window_log::expires_at(limit, s),
        State::SlidingWindowCounter(s) => sliding_window_counter::expires_at(limit, s),
        State::TokenBucket(s) => token_bucket::expires_at(limit, s),
        State::LeakyBucket(s) => leaky_bucket::expires_at(limit, s),
    }
}

/// Rewrites a bucket's state written under another rate than `limit`'s in that
/// rate, owing what it owes at `now` ([`token_bucket`]'s module doc): stored
/// whatever the decision, so that the debt drains at the new rate from the policy
/// change on. Whether it changed; other algorithms never do.
pub fn rebase(limit: &Limit, state: &mut State, now: Micros) -> bool {
    match state {
        State::TokenBucket(s) | State::LeakyBucket(s) => token_bucket::rebase(limit, s, now),
        _ => false,
    }
}

/// An algorithm's own decision, before its state is wrapped in [`State`].
#[derive(Debug, Clone, PartialEq)]
pub struct Step<S> {
    pub verdict: Verdict,
    pub next: Option<S>,
}

impl<S> Step<S> {
    fn map_state(self, f: impl FnOnce(S) -> State) -> Decision {
        Decision {
            verdict: self.verdict,
            next: self.next.map(f),
        }
    }
}
