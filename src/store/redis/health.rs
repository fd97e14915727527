//! Per-shard health: a shard that keeps failing is left alone for a short, growing
//! back-off, and calls to it fail at once with `StoreError::BackingOff` instead of
//! each waiting out the store timeout. The first call after the back-off is a trial:
//! success brings the shard back, failure doubles the back-off.
//!
//! "Keeps failing" means at least [`FAILURES_TO_BACK_OFF`] outages (errors whose
//! [`ErrorKind::is_outage`]) with no success in between and no gap of
//! [`STALE_FAILURE`] (plus the call timeout: a hung shard's failures come at
//! least that far apart) between two of them, the streak lasting at least
//! [`MIN_FAILING`]. A count alone is not enough:
//! one scheduling stall (a busy CPU) makes every call in flight time out at once, and
//! that burst, followed by successes, says nothing about the shard. A dead or hung
//! shard under load still fails continuously and is backed off about [`MIN_FAILING`]
//! after its first failure.
//!
//! A script or protocol error is no outage (waiting would not mend it): it is
//! counted, kept as the last error and logged at error level, at most once per
//! [`LOUD_EVERY`] with the number of such errors since, so a flood of them does
//! not flood the log.
//!
//! A shard no call has answered lately is asked whether it answers (a write that
//! writes nothing, or a PING where an ACL refuses it; see `ping`), so its state
//! follows the server without traffic: the probe's failures count as a call's do,
//! by the same streak, and its success ends an outage the probe would have met
//! ([`Asked::sees`]) as a trial's would.
//! [`Health::probe_due`] and [`Health::probed`] keep the probe's schedule.
//!
//! Logs one line per state change (down, up), never one per request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::store::{ErrorKind, LastError, Report, ShardState, ShardStatus, StoreError};

/// Consecutive failures (no success between) that can take a shard down.
pub const FAILURES_TO_BACK_OFF: u32 = 3;
/// How long such a streak must last, first failure to latest, to take a shard down.
/// Longer than one stall's burst of timeouts (they land within a few milliseconds),
/// short enough that a dead shard is left alone within a tenth of a second.
pub const MIN_FAILING: Duration = Duration::from_millis(50);
/// A failure this long after the previous one starts a new streak: nobody asked the
/// shard in between, so the old failure says nothing about it now.
pub const STALE_FAILURE: Duration = Duration::from_secs(1);
/// First back-off; doubled by each failed trial up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Longest silence between two error lines about script or protocol errors while
/// they go on.
pub const LOUD_EVERY: Duration = Duration::from_secs(10);
/// How often a shard that no call has answered since the last look is probed: as
/// long as a failure stays news ([`STALE_FAILURE`]), so what an idle shard reports
/// is never older than what a failure is trusted for, at one command a second.
pub const PROBE_EVERY: Duration = STALE_FAILURE;
/// The next probe after one that failed while the shard is not backed off: three
/// failed probes in a row then span [`MIN_FAILING`], the streak that takes a shard
/// down, and one slow PING (a busy machine) is soon followed by one that clears it.
pub const PROBE_AGAIN: Duration = Duration::from_millis(25);

/// The failing streak and back-off; only touched on failures and on the first
/// success after one.
#[derive(Debug, Default)]
struct Streak {
    failures: u32,
    /// First failure of the current streak.
    since: Option<Instant>,
    /// Latest failure of the current streak.
    last: Option<Instant>,
    /// Kind of that failure.
    kind: Option<ErrorKind>,
    /// The least a probe must ask to see that failure over (`None`: only a call).
    mended_by: Option<Asked>,
    backoff: Duration,
}

/// What a probe asked a shard, least first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Asked {
    /// `PING`: answered by a replica, a server out of memory, and over a
    /// connection that authenticated before a password changed.
    Ping,
    /// A write (that writes nothing): refused as a decide call is by a replica
    /// (`READONLY`), a server out of memory (`OOM`) or a password missing or
    /// refused.
    Write,
}

impl Asked {
    /// The least a probe must ask to meet `error` as a call met it, so that its
    /// answer says the error is over: `None` for what only a call can tell (a
    /// script error; an ACL refusing one of the script's commands, which the probe
    /// does not run; a cluster's or a replica's state, `CLUSTERDOWN`, `TRYAGAIN`
    /// or `MASTERDOWN`: a replica refuses the probe as `READONLY` first, and a
    /// master refusing it so gets a `PING` instead).
    pub fn sees(error: &StoreError) -> Option<Asked> {
        let kind = error.kind()?;
        match kind {
            _ if fails_ping(kind) => Some(Asked::Ping),
            ErrorKind::ReadOnly | ErrorKind::Oom => Some(Asked::Write),
            ErrorKind::NoAuth if !refused_by_acl(error.message()) => Some(Asked::Write),
            _ => None,
        }
    }
}

/// Whether a `noauth` error is an ACL refusing a command (which the probe may not
/// run), not a password missing or refused.
fn refused_by_acl(message: &str) -> bool {
    message.starts_with("NOPERM") || message.contains("The user executing the script can't run")
}

#[derive(Debug, Default)]
struct State {
    streak: Streak,
    /// Kept across recoveries, for `/debug/store`.
    last_error: Option<LastError>,
    /// When a script or protocol error was last logged.
    logged_at: Option<Instant>,
    /// Script or protocol errors since that line.
    unlogged: u64,
    /// Taken down, then its back-off ended by a new address ([`Health::retry_now`]):
    /// the next success says it is up.
    moved_while_down: bool,
    /// When the shard is next looked at for a probe; `None` before the first look.
    next_probe: Option<Instant>,
}

/// The health of one shard (or of the whole cluster).
///
/// `check` runs on every request and `success` on nearly every call, so neither takes
/// the lock while the shard is healthy: `check` reads `down_until`, `success` returns
/// at once unless `failing` is set. A success racing a failure may be ordered either
/// way, as if it had come just before or just after.
pub struct Health {
    /// The shard as logs and metrics name it (host:port, no password): shared, so a
    /// failed call names its shard without allocating.
    pub name: Arc<str>,
    /// Origin of `down_until`.
    base: Instant,
    /// End of the back-off in nanoseconds since `base`; 0 while up. Stays set after
    /// the back-off ends (trials) until a success, so it also says "down".
    down_until: AtomicU64,
    /// A failure has been seen since the last success.
    failing: AtomicBool,
    /// A call has succeeded since the last look for a probe: the shard needs none.
    answered: AtomicBool,
    /// A failure this long after the previous one starts a new streak:
    /// [`STALE_FAILURE`] plus the call timeout ([`Health::with_call_timeout`]).
    stale: Duration,
    /// Decide calls last went by `FCALL` (else `EVALSHA`): what a trace names them.
    by_function: AtomicBool,
    state: Mutex<State>,
    report: Option<Arc<dyn Report>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("name", &self.name)
            .field("down_until", &self.down_until)
            .field("failing", &self.failing)
            .finish_non_exhaustive()
    }
}

impl Health {
    /// Records how the last decide call went: by `FCALL` or by script.
    pub fn set_by_function(&self, yes: bool) {
        if self.by_function.load(Relaxed) != yes {
            self.by_function.store(yes, Relaxed);
        }
    }

    /// The command decide calls go by now: `FCALL` or `EVALSHA`.
    pub fn decide_command(&self) -> &'static str {
        if self.by_function.load(Relaxed) {
            "FCALL"
        } else {
            "EVALSHA"
        }
    }

    pub fn new(name: String, report: Option<Arc<dyn Report>>) -> Self {
        if let Some(r) = &report {
            // Export the shard's error counters at 0 from the start, so dashboards and
            // alerts see every shard before its first failure.
            r.shard_declared("redis", &name);
        }
        Health {
            name: name.into(),
            base: Instant::now(),
            down_until: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            stale: STALE_FAILURE,
            by_function: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            report,
        }
    }

    /// Failures of calls that time out after `timeout` come at least that far
    /// apart from one caller (a quiet replica, the probe): they still make a
    /// streak, so a hung shard is backed off however long `--store-timeout` is.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.stale = STALE_FAILURE.saturating_add(timeout);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `at` as nanoseconds since `base`.
    fn nanos(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// `Err(BackingOff)` while the shard is backing off.
    pub fn check(&self) -> Result<(), StoreError> {
        // Healthy: no clock read either.
        if self.down_until.load(Relaxed) == 0 {
            return Ok(());
        }
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Result<(), StoreError> {
        let until = self.down_until.load(Relaxed);
        if until != 0 && self.nanos(now) < until {
            Err(StoreError::BackingOff)
        } else {
            Ok(())
        }
    }

    /// Whether the shard is currently considered down (backing off, or its trials
    /// have not succeeded yet).
    pub fn is_down(&self) -> bool {
        self.down_until.load(Relaxed) != 0
    }

    /// Whether a call has failed since the last success (failing, backing off or
    /// on trial).
    pub fn is_failing(&self) -> bool {
        self.failing.load(Relaxed)
    }

    /// Whether the shard's calls (or probes) fail because it does not answer, or
    /// not in time (errors a PING meets too), rather than with an answer (a
    /// script error, `READONLY`): in a cluster, a master its replica may have
    /// replaced.
    pub fn unanswering(&self) -> bool {
        self.is_failing() && self.lock().streak.kind.is_some_and(fails_ping)
    }

    pub fn success(&self) {
        // Stored once per look, then only read: calls under load share the line.
        if !self.answered.load(Relaxed) {
            self.answered.store(true, Relaxed);
        }
        self.recover();
    }

    /// Ends a failing streak and a back-off.
    fn recover(&self) {
        if !self.failing.load(Relaxed) {
            return;
        }
        let mut s = self.lock();
        if self.down_until.load(Relaxed) != 0 || s.moved_while_down {
            tracing::info!(shard = %self.name, "redis shard up");
        }
        s.moved_while_down = false;
        s.streak = Streak::default();
        self.down_until.store(0, Relaxed);
        self.failing.store(false, Relaxed);
        if let Some(r) = &self.report {
            r.shard_answered("redis", &self.name);
        }
    }

    /// The shard's address changed (a new master after a failover): failures and a
    /// back-off earned by the old address say nothing of the new one, so the streak
    /// starts over and the next call is tried at once.
    pub fn retry_now(&self) {
        let mut s = self.lock();
        s.streak = Streak::default();
        if self.down_until.swap(0, Relaxed) != 0 {
            s.moved_while_down = true;
        }
    }

    /// Whether the next success will log that the shard is up.
    #[cfg(test)]
    fn will_say_up(&self) -> bool {
        self.is_down() || self.lock().moved_while_down
    }

    /// Records a failed call: counted, kept as the last error, and an outage counts
    /// towards the back-off. A call not tried (`BackingOff`) is nothing new.
    pub fn failure(&self, error: &StoreError) {
        self.failure_at(error, Instant::now());
    }

    fn failure_at(&self, error: &StoreError, now: Instant) {
        let Some(kind) = error.kind() else { return };
        if let Some(r) = &self.report {
            r.store_error("redis", &self.name, kind);
        }
        let mut s = self.lock();
        self.failing.store(true, Relaxed);
        s.last_error = Some(LastError {
            kind,
            message: error.message().to_string(),
            at: SystemTime::now(),
        });
        if kind.is_outage() {
            s.streak.kind = Some(kind);
            s.streak.mended_by = Asked::sees(error);
            self.outage(&mut s.streak, error, now);
        } else {
            self.log_loudly(&mut s, kind, error, now);
        }
    }

    fn outage(&self, s: &mut Streak, error: &StoreError, now: Instant) {
        let until = self.down_until.load(Relaxed);
        let stale = s
            .last
            .is_some_and(|last| now.saturating_duration_since(last) >= self.stale);
        if until == 0 && stale {
            s.failures = 0;
            s.since = None;
        }
        s.last = Some(now);
        s.failures = s.failures.saturating_add(1);
        let since = *s.since.get_or_insert(now);
        if until == 0 {
            let failing_for = now.saturating_duration_since(since);
            if s.failures < FAILURES_TO_BACK_OFF || failing_for < MIN_FAILING {
                return;
            }
            s.backoff = FIRST_BACKOFF;
            if let Some(what) = misconfigured(error) {
                tracing::error!(
                    shard = %self.name,
                    %error,
                    backoff_ms = s.backoff.as_millis() as u64,
                    "redis shard down: it refuses sluice's settings ({what}), so \
                     nothing is counted there until they are fixed; retrying"
                );
            } else {
                tracing::warn!(
                    shard = %self.name,
                    %error,
                    failures = s.failures,
                    failing_ms = failing_for.as_millis() as u64,
                    backoff_ms = s.backoff.as_millis() as u64,
                    "redis shard down: backing off"
                );
            }
        } else {
            // Many calls may fail at once (those in flight when the shard went down,
            // or the trials let through when a back-off ends): grow the back-off once
            // per round, not once per call.
            if self.nanos(now) < until {
                return;
            }
            s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
            // A retry that met the same refusal: said again, once per round.
            if let Some(what) = misconfigured(error) {
                tracing::error!(
                    shard = %self.name,
                    %error,
                    backoff_ms = s.backoff.as_millis() as u64,
                    "redis shard still down: it refuses sluice's settings ({what}); retrying"
                );
            }
        }
        self.down_until.store(self.nanos(now + s.backoff), Relaxed);
    }

    /// A script or protocol error: a bug or a misconfigured server that every call
    /// may meet, so one line per [`LOUD_EVERY`] at most.
    fn log_loudly(&self, s: &mut State, kind: ErrorKind, error: &StoreError, now: Instant) {
        s.unlogged += 1;
        let quiet = s
            .logged_at
            .is_some_and(|at| now.saturating_duration_since(at) < LOUD_EVERY);
        if quiet {
            return;
        }
        tracing::error!(
            shard = %self.name,
            %kind,
            %error,
            errors = s.unlogged,
            "redis call failed on a working shard; answering by the failure mode \
             (errors counts this one and those not logged since the last line)"
        );
        s.logged_at = Some(now);
        s.unlogged = 0;
    }

    /// Whether to probe the shard at `now`: its look is due and no call has
    /// succeeded since the last one, or calls have failed since their last success.
    /// A shard answering its traffic is left alone until the next look.
    pub fn probe_due(&self, now: Instant) -> bool {
        let mut s = self.lock();
        if s.next_probe.is_some_and(|at| now < at) {
            return false;
        }
        let answered = self.answered.swap(false, Relaxed);
        if answered && !self.failing.load(Relaxed) {
            s.next_probe = Some(now + PROBE_EVERY);
            return false;
        }
        true
    }

    /// When the shard is next looked at for a probe (`None`: at once).
    pub fn next_probe(&self) -> Option<Instant> {
        self.lock().next_probe
    }

    /// Records a probe that ended at `now`: the shard answered what it was asked
    /// (`Ok`) or not. A failure the probe met as a call would have
    /// ([`Asked::sees`]) counts as a call's failure; an answer ends an outage the
    /// probe would have met, as a trial's success does, but not one it cannot see
    /// (a replica refusing writes answers a PING; a script error), which waits for
    /// a call. Any other error reply (an ACL refusing the probe) says nothing of
    /// the shard.
    pub fn probed(&self, result: &Result<Asked, StoreError>, now: Instant) {
        let again = match result {
            Ok(asked) => {
                self.probe_answered(*asked);
                false
            }
            Err(e) if Asked::sees(e).is_some() => {
                self.failure_at(e, now);
                !self.is_down()
            }
            Err(_) => false,
        };
        let wait = if again { PROBE_AGAIN } else { PROBE_EVERY };
        self.lock().next_probe = Some(now + wait);
    }

    fn probe_answered(&self, asked: Asked) {
        if !self.failing.load(Relaxed) {
            return;
        }
        let mended = {
            let s = self.lock();
            let outage = self.is_down() || s.streak.failures > 0 || s.moved_while_down;
            let seen = match s.streak.kind {
                None => true,
                Some(_) => s.streak.mended_by.is_some_and(|least| asked >= least),
            };
            outage && seen
        };
        if mended {
            // Not `success`: the shard still had no call answered.
            self.recover();
        }
    }

    /// Where the shard stands, for `/debug/store`.
    pub fn status(&self) -> ShardStatus {
        self.status_at(Instant::now(), SystemTime::now())
    }

    fn status_at(&self, now: Instant, wall: SystemTime) -> ShardStatus {
        let s = self.lock();
        let until = self.down_until.load(Relaxed);
        let left = Duration::from_nanos(until.saturating_sub(self.nanos(now)));
        let state = if until != 0 && !left.is_zero() {
            ShardState::BackingOff
        } else if until != 0 {
            ShardState::Trying
        } else if self.failing.load(Relaxed) {
            ShardState::Failing
        } else {
            ShardState::Up
        };
        ShardStatus {
            name: self.name.to_string(),
            nodes: Vec::new(),
            state,
            last_error: s.last_error.clone(),
            backoff_until: (state == ShardState::BackingOff).then(|| wall + left),
        }
    }

    /// Records the outcome of a call when dropped; a call dropped before it finished
    /// (the limiter's store timeout) counts as a timeout.
    pub fn guard(&self) -> CallGuard<'_> {
        CallGuard {
            health: self,
            done: false,
        }
    }
}

/// Whether a PING meets the outage as a call does (no connection, no answer in
/// time, a TLS handshake refused, a server loading or busy with a script), so a
/// PING answered says it is over. A replica refusing writes, a server out of
/// memory, an ACL refusing a script's command: a PING is answered through them
/// (the probe's write sees a replica, a full server and a password refused:
/// [`Asked::sees`]).
fn fails_ping(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Connection
            | ErrorKind::Timeout
            | ErrorKind::Tls
            | ErrorKind::Loading
            | ErrorKind::Busy
    )
}

/// Which of sluice's settings the shard refuses, and what to do, when `error` says
/// they do not fit it (the password, the ACL's grants, TLS): Redis can never be
/// reached until someone changes them, so every failed try is logged as an error.
fn misconfigured(error: &StoreError) -> Option<&'static str> {
    match error.kind()? {
        ErrorKind::Tls => Some("TLS: check the rediss:// URL and its tls_* files"),
        ErrorKind::NoAuth if denied_by_acl(error.message()) => Some(
            "its ACL: the user may not run a command or reach a key sluice needs; \
             grant what the Redis chapter of the docs lists under ACL",
        ),
        ErrorKind::NoAuth => Some("the password: fix the user and password in the URL"),
        _ => None,
    }
}

/// Whether a `noauth` error is an ACL refusing a command or key (`NOPERM`, or a
/// command a script runs), not a password.
fn denied_by_acl(message: &str) -> bool {
    message.contains("NOPERM") || message.contains("can't run this command")
}

/// See [`Health::guard`].
#[derive(Debug)]
pub struct CallGuard<'a> {
    health: &'a Health,
    done: bool,
}

impl CallGuard<'_> {
    pub fn finish<T>(mut self, result: &Result<T, StoreError>) {
        self.done = true;
        match result {
            Ok(_) => self.health.success(),
            Err(e) => self.health.failure(e),
        }
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.health.failure(&StoreError::Timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The log says which setting is refused: an ACL's `NOPERM` is no password
    /// problem.
    #[test]
    fn a_refusal_names_the_setting_refused() {
        let refused =
            |text: &str| misconfigured(&StoreError::from(sluice_redis::error::reply(text.into())));
        let acl = refused("NOPERM this user has no permissions to run the 'evalsha' command");
        assert!(acl.is_some_and(|w| w.contains("ACL")), "{acl:?}");
        let acl = refused(
            "ERR The user executing the script can't run this command or subcommand script: 1",
        );
        assert!(acl.is_some_and(|w| w.contains("ACL")), "{acl:?}");
        let password = refused("WRONGPASS invalid username-password pair or user is disabled.");
        assert!(password.is_some_and(|w| w.contains("password") && !w.contains("ACL")));
        assert!(refused("NOAUTH Authentication required.").is_some_and(|w| w.contains("password")));
        let tls = misconfigured(&StoreError::failed(ErrorKind::Tls, "certificate unknown"));
        assert!(tls.is_some_and(|w| w.contains("TLS")));
        assert_eq!(refused("OOM command not allowed"), None);
        assert_eq!(misconfigured(&StoreError::Timeout), None);
    }

    fn down() -> StoreError {
        StoreError::failed(ErrorKind::Connection, "connect: refused")
    }

    fn backing_off(h: &Health, now: Instant) -> bool {
        matches!(h.check_at(now), Err(StoreError::BackingOff))
    }

    #[test]
    fn failures_lasting_the_span_back_off_and_success_recovers() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        // A dead shard under load: a failure every millisecond.
        for i in 0..MIN_FAILING.as_millis() as u32 {
            h.failure_at(&down(), t0 + MS * i);
            assert!(!h.is_down(), "{i} ms");
            assert!(h.check_at(t0 + MS * i).is_ok());
        }
        let down_at = t0 + MIN_FAILING;
        h.failure_at(&down(), down_at);
        assert!(h.is_down());
        assert!(backing_off(&h, down_at));
        assert!(backing_off(&h, down_at + FIRST_BACKOFF - MS));
        assert!(h.check_at(down_at + FIRST_BACKOFF).is_ok(), "trial");
        h.success();
        assert!(!h.is_down());
        assert!(h.check().is_ok());
        // The streak starts over after the success.
        h.failure_at(&down(), down_at + FIRST_BACKOFF);
        assert!(!h.is_down());
    }

    #[test]
    fn a_burst_of_timeouts_then_a_success_does_not_back_off() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        // One stall: every call in flight times out together, then calls succeed.
        for round in 0..3u32 {
            let stall = t0 + MIN_FAILING * round;
            for _ in 0..64 {
                h.failure_at(&StoreError::Timeout, stall);
            }
            assert!(!h.is_down(), "round {round}");
            h.success();
        }
        assert!(h.check_at(t0 + MIN_FAILING * 3).is_ok());
        // The same burst with no success after it and failures continuing past the
        // span is an outage.
        for _ in 0..64 {
            h.failure_at(&StoreError::Timeout, t0 + MIN_FAILING * 3);
        }
        assert!(!h.is_down());
        h.failure_at(&StoreError::Timeout, t0 + MIN_FAILING * 4);
        assert!(h.is_down());
    }

    #[test]
    fn a_success_resets_the_streak() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        h.failure_at(&down(), t0);
        h.failure_at(&down(), t0 + MIN_FAILING - MS);
        h.success();
        // Failing since t0 would be long enough now, but the streak began again.
        h.failure_at(&down(), t0 + MIN_FAILING);
        h.failure_at(&down(), t0 + MIN_FAILING + MS);
        h.failure_at(&down(), t0 + MIN_FAILING * 2 - MS);
        assert!(!h.is_down());
        h.failure_at(&down(), t0 + MIN_FAILING * 2);
        assert!(h.is_down());
    }

    #[test]
    fn a_long_streak_needs_enough_failures() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        h.failure_at(&down(), t0);
        h.failure_at(&down(), t0 + MIN_FAILING * 10);
        assert!(!h.is_down(), "two failures are not an outage");
        h.failure_at(&down(), t0 + MIN_FAILING * 11);
        assert!(h.is_down());
    }

    #[test]
    fn an_old_failure_does_not_start_an_outage_later() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        // One timeout, then no calls at all for a while, then one stall's burst.
        h.failure_at(&StoreError::Timeout, t0);
        let later = t0 + STALE_FAILURE + MIN_FAILING;
        for _ in 0..64 {
            h.failure_at(&StoreError::Timeout, later);
        }
        assert!(!h.is_down(), "the old failure made the burst look long");
        // Failures continuing past the span from the burst still back off.
        h.failure_at(&StoreError::Timeout, later + MIN_FAILING);
        assert!(h.is_down());
    }

    /// A hung shard with a long store timeout, asked by one caller at a time (a
    /// quiet replica, the probe): each failure comes a timeout after the last, yet
    /// they make a streak and back it off, rather than each call waiting it out.
    #[test]
    fn failures_a_long_timeout_apart_still_make_a_streak() {
        let timeout = Duration::from_secs(3);
        let h = Health::new("s".into(), None).with_call_timeout(timeout);
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(!h.is_down(), "failure {i}");
            h.failure_at(&StoreError::Timeout, t0 + (timeout + MS * 25) * i);
        }
        assert!(h.is_down());
        // Without the timeout the same failures read as unrelated.
        let h = Health::new("s".into(), None);
        for i in 0..3 {
            h.failure_at(&StoreError::Timeout, t0 + (timeout + MS * 25) * i);
        }
        assert!(!h.is_down());
        // Still stale past the timeout plus STALE_FAILURE: nobody asked in between.
        let h = Health::new("s".into(), None).with_call_timeout(timeout);
        for i in 0..3 {
            h.failure_at(&StoreError::Timeout, t0 + (timeout + STALE_FAILURE) * i);
        }
        assert!(!h.is_down());
    }

    /// What a shard reported, in order.
    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Report for Log {
        fn shard_declared(&self, store: &str, shard: &str) {
            self.0
                .lock()
                .unwrap()
                .push(format!("declared {store} {shard}"));
        }
        fn store_error(&self, store: &str, shard: &str, kind: ErrorKind) {
            self.0
                .lock()
                .unwrap()
                .push(format!("{kind} {store} {shard}"));
        }
        fn denial_cache_answer(&self) {}
        fn shard_answered(&self, store: &str, shard: &str) {
            self.0
                .lock()
                .unwrap()
                .push(format!("answered {store} {shard}"));
        }
    }

    #[test]
    fn a_recovery_is_reported_once_and_a_healthy_success_never() {
        let log = Arc::new(Log::default());
        let h = Health::new("10.0.0.1:6379".into(), Some(log.clone()));
        h.success();
        h.failure(&down());
        h.success();
        h.success();
        // A probe's PONG ends an outage a PING meets, and says so too.
        h.failure(&down());
        h.probed(&Ok(Asked::Ping), Instant::now());
        h.success();
        assert_eq!(
            *log.0.lock().unwrap(),
            [
                "declared redis 10.0.0.1:6379",
                "connection redis 10.0.0.1:6379",
                "answered redis 10.0.0.1:6379",
                "connection redis 10.0.0.1:6379",
                "answered redis 10.0.0.1:6379",
            ]
        );
    }

    #[test]
    fn failures_are_reported_per_shard_with_their_kind() {
        let log = Arc::new(Log::default());
        let h = Health::new("10.0.0.1:6379".into(), Some(log.clone()));
        h.failure(&down());
        h.failure(&StoreError::failed(ErrorKind::ReadOnly, "READONLY"));
        h.failure(&StoreError::BackingOff);
        drop(h.guard());
        assert_eq!(
            *log.0.lock().unwrap(),
            [
                "declared redis 10.0.0.1:6379",
                "connection redis 10.0.0.1:6379",
                "readonly redis 10.0.0.1:6379",
                "timeout redis 10.0.0.1:6379",
            ]
        );
    }

    #[test]
    fn script_errors_never_back_off_and_are_kept_as_the_last_error() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        let script = StoreError::failed(ErrorKind::Script, "ERR user_script:1: boom");
        for i in 0..100u32 {
            h.failure_at(&script, t0 + MIN_FAILING * i);
        }
        assert!(!h.is_down());
        let status = h.status_at(t0 + MIN_FAILING * 100, SystemTime::now());
        assert_eq!(status.state, ShardState::Failing);
        let last = status.last_error.expect("kept");
        assert_eq!(
            (last.kind, last.message.as_str()),
            (ErrorKind::Script, "ERR user_script:1: boom")
        );
        h.success();
        let status = h.status();
        assert_eq!(status.state, ShardState::Up);
        assert_eq!(status.last_error.map(|e| e.kind), Some(ErrorKind::Script));
    }

    #[test]
    fn script_errors_are_logged_once_per_interval_with_a_count() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        let script = StoreError::failed(ErrorKind::Script, "boom");
        h.failure_at(&script, t0);
        assert_eq!(h.lock().logged_at, Some(t0), "the first one is logged");
        for i in 1..=50u32 {
            h.failure_at(&script, t0 + MS * i);
        }
        assert_eq!(h.lock().logged_at, Some(t0), "the flood is not");
        assert_eq!(h.lock().unlogged, 50);
        h.failure_at(&script, t0 + LOUD_EVERY);
        assert_eq!(h.lock().logged_at, Some(t0 + LOUD_EVERY));
        assert_eq!(h.lock().unlogged, 0, "counted in that line");
    }

    #[test]
    fn the_status_follows_the_back_off() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        let wall = SystemTime::now();
        assert_eq!(h.status_at(t0, wall).state, ShardState::Up);
        assert!(h.status_at(t0, wall).last_error.is_none());
        h.failure_at(&down(), t0);
        assert_eq!(h.status_at(t0, wall).state, ShardState::Failing);
        h.failure_at(&down(), t0);
        h.failure_at(&down(), t0 + MIN_FAILING);
        let at = t0 + MIN_FAILING + MS;
        let status = h.status_at(at, wall);
        assert_eq!(status.state, ShardState::BackingOff);
        assert_eq!(
            status.backoff_until,
            Some(wall + FIRST_BACKOFF - MS),
            "the deadline on the wall clock"
        );
        assert_eq!(
            status.last_error.map(|e| e.kind),
            Some(ErrorKind::Connection)
        );
        let trying = h.status_at(t0 + MIN_FAILING + FIRST_BACKOFF, wall);
        assert_eq!(trying.state, ShardState::Trying);
        assert_eq!(trying.backoff_until, None);
        h.success();
        assert_eq!(h.status_at(at, wall).state, ShardState::Up);
    }

    #[test]
    fn dropped_calls_count_as_failures() {
        let h = Health::new("s".into(), None);
        for _ in 0..3 {
            drop(h.guard());
        }
        assert_eq!(h.lock().streak.failures, 3);
        h.guard().finish(&Err::<(), _>(StoreError::failed(
            ErrorKind::Protocol,
            "bad reply",
        )));
        assert_eq!(h.lock().streak.failures, 3, "a bad reply is not an outage");
        h.guard().finish(&Ok(()));
        assert_eq!(h.lock().streak.failures, 0);
        assert!(!h.failing.load(Relaxed));
    }

    #[test]
    fn a_new_address_ends_the_back_off_and_starts_a_new_streak() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        h.failure_at(&down(), t0);
        h.failure_at(&down(), t0);
        h.failure_at(&down(), t0 + MIN_FAILING);
        assert!(backing_off(&h, t0 + MIN_FAILING + MS));
        h.retry_now();
        assert!(!h.is_down());
        assert!(h.check_at(t0 + MIN_FAILING + MS).is_ok());
        // It was down: its first success at the new address says it is up.
        assert!(h.will_say_up());
        // The old streak is gone: it takes a new one to back off again.
        h.failure_at(&down(), t0 + MIN_FAILING * 2);
        assert!(!h.is_down());
        h.failure_at(&down(), t0 + MIN_FAILING * 2);
        h.failure_at(&down(), t0 + MIN_FAILING * 3);
        assert!(h.is_down());
        assert_eq!(h.lock().streak.backoff, FIRST_BACKOFF);
        h.success();
        assert!(!h.will_say_up());
        // A move while up says nothing at the next success.
        h.retry_now();
        assert!(!h.will_say_up());
    }

    #[test]
    fn failed_trials_grow_the_backoff() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        h.failure_at(&down(), t0);
        h.failure_at(&down(), t0);
        h.failure_at(&down(), t0 + MIN_FAILING);
        assert!(h.is_down());
        // Failures while backing off (calls already in flight) change nothing.
        for _ in 0..5 {
            h.failure_at(&down(), t0 + MIN_FAILING + MS);
        }
        assert_eq!(h.lock().streak.backoff, FIRST_BACKOFF);
        // Each failed round after a back-off doubles it, up to the maximum.
        let mut now = t0 + MIN_FAILING;
        for round in 1..=10u32 {
            now += h.lock().streak.backoff;
            assert!(backing_off(&h, now - MS), "round {round}");
            assert!(h.check_at(now).is_ok(), "trial allowed");
            h.failure_at(&down(), now);
            h.failure_at(&down(), now);
            let want = (FIRST_BACKOFF * 2u32.pow(round)).min(MAX_BACKOFF);
            assert_eq!(h.lock().streak.backoff, want, "round {round}");
            assert!(h.is_down());
        }
        // A successful trial brings it back.
        now += h.lock().streak.backoff;
        assert!(h.check_at(now).is_ok());
        h.success();
        assert!(!h.is_down());
        assert!(h.check_at(now).is_ok());
    }

    /// Probes `h` at each look, `ping` answering at each, for up to `looks`
    /// looks from `t0`, as the prober does; returns the time of the last look.
    fn probe_looks(
        h: &Health,
        t0: Instant,
        looks: usize,
        mut ping: impl FnMut(usize) -> Result<Asked, StoreError>,
    ) -> Instant {
        let mut now = t0;
        for i in 0..looks {
            assert!(h.probe_due(now), "look {i}");
            h.probed(&ping(i), now);
            now = h.next_probe().expect("scheduled");
        }
        now
    }

    #[test]
    fn an_idle_shard_is_probed_once_per_interval_and_one_under_traffic_is_not() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        assert!(h.probe_due(t0), "the first look probes");
        h.probed(&Ok(Asked::Ping), t0);
        assert_eq!(h.next_probe(), Some(t0 + PROBE_EVERY));
        assert!(!h.probe_due(t0 + PROBE_EVERY - MS));
        assert!(h.probe_due(t0 + PROBE_EVERY), "nothing answered since");
        h.probed(&Ok(Asked::Ping), t0 + PROBE_EVERY);
        // A call answered since the last look: no probe, the next look an interval on.
        h.success();
        let later = t0 + PROBE_EVERY * 2;
        assert!(!h.probe_due(later));
        assert_eq!(h.next_probe(), Some(later + PROBE_EVERY));
        assert!(h.probe_due(later + PROBE_EVERY), "idle again");
        // A shard whose calls fail is probed though they came back.
        h.probed(&Ok(Asked::Ping), later + PROBE_EVERY);
        h.success();
        h.failure_at(&down(), later + PROBE_EVERY);
        assert!(h.probe_due(later + PROBE_EVERY * 2));
    }

    #[test]
    fn a_dead_idle_shard_goes_down_by_its_probes_and_comes_back_by_one() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        let after = probe_looks(&h, t0, 3, |_| Err(down()));
        assert!(h.is_down(), "three failed probes over {MIN_FAILING:?}");
        let down_at = after - PROBE_EVERY;
        assert!(
            down_at - t0 < MIN_FAILING * 2,
            "down {:?} after",
            down_at - t0
        );
        assert_eq!(
            h.status_at(down_at, SystemTime::now()).state,
            ShardState::BackingOff
        );
        // Backed off, it is probed once an interval; a failed probe after the
        // back-off is a failed trial.
        h.probed(&Err(down()), after);
        assert_eq!(h.lock().streak.backoff, FIRST_BACKOFF * 2);
        assert_eq!(h.next_probe(), Some(after + PROBE_EVERY));
        // Back: the next probe brings it up, with no call.
        assert!(h.probe_due(after + PROBE_EVERY));
        h.probed(&Ok(Asked::Ping), after + PROBE_EVERY);
        assert!(!h.is_down() && !h.is_failing());
        assert_eq!(h.status().state, ShardState::Up);
    }

    #[test]
    fn a_hung_idle_shard_goes_down_though_each_probe_takes_the_timeout() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        let timeout = Duration::from_millis(200);
        let mut now = t0;
        for i in 0..3 {
            assert!(!h.is_down(), "probe {i}");
            assert!(h.probe_due(now));
            now += timeout;
            h.probed(&Err(StoreError::Timeout), now);
            now = h.next_probe().unwrap();
        }
        assert!(h.is_down());
    }

    #[test]
    fn one_slow_ping_does_not_take_a_shard_down() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        // Every other probe times out (a busy machine): never three in a row.
        probe_looks(&h, t0, 20, |i| match i % 2 {
            0 => Err(StoreError::Timeout),
            _ => Ok(Asked::Ping),
        });
        assert!(!h.is_down());
        assert!(!h.is_failing(), "the answered probe clears the timeout");
        // Two in a row leave it failing, not down; the next answer clears it.
        let t1 = t0 + PROBE_EVERY * 100;
        probe_looks(&h, t1, 3, |i| {
            if i < 2 {
                Err(StoreError::Timeout)
            } else {
                Ok(Asked::Ping)
            }
        });
        assert!(!h.is_down() && !h.is_failing());
    }

    #[test]
    fn a_probe_answered_does_not_end_what_a_ping_cannot_see() {
        let t0 = Instant::now();
        // A replica refusing writes answers PING: its back-off waits for a trial call.
        let h = Health::new("s".into(), None);
        let readonly = StoreError::failed(ErrorKind::ReadOnly, "READONLY");
        h.failure_at(&readonly, t0);
        h.failure_at(&readonly, t0);
        h.failure_at(&readonly, t0 + MIN_FAILING);
        assert!(h.is_down());
        assert!(h.probe_due(t0 + MIN_FAILING));
        h.probed(&Ok(Asked::Ping), t0 + MIN_FAILING);
        assert!(h.is_down(), "a PING says nothing of writes");
        assert_eq!(h.next_probe(), Some(t0 + MIN_FAILING + PROBE_EVERY));
        // A script error neither.
        let h = Health::new("s".into(), None);
        h.failure_at(&StoreError::failed(ErrorKind::Script, "boom"), t0);
        h.probed(&Ok(Asked::Ping), t0);
        assert!(h.is_failing());
        // An error reply that is no outage a PING meets (an ACL refusing PING)
        // counts as nothing.
        let h = Health::new("s".into(), None);
        let refused = Err(StoreError::failed(ErrorKind::NoAuth, "NOPERM"));
        for i in 0..10u32 {
            h.probed(&refused, t0 + MIN_FAILING * i);
        }
        assert!(!h.is_failing());
        assert_eq!(h.next_probe(), Some(t0 + MIN_FAILING * 9 + PROBE_EVERY));
    }

    #[test]
    fn a_probe_answered_at_a_new_address_says_the_shard_is_up() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        probe_looks(&h, t0, 3, |_| Err(down()));
        assert!(h.is_down());
        h.retry_now();
        assert!(h.will_say_up());
        h.probed(&Ok(Asked::Ping), t0 + PROBE_EVERY);
        assert!(!h.will_say_up() && !h.is_failing());
    }

    #[test]
    fn only_a_shard_that_does_not_answer_is_unanswering() {
        let h = Health::new("s".into(), None);
        let t0 = Instant::now();
        assert!(!h.unanswering());
        h.failure_at(&StoreError::failed(ErrorKind::Script, "ERR boom"), t0);
        assert!(h.is_failing() && !h.unanswering(), "it answered");
        h.failure_at(&StoreError::failed(ErrorKind::ReadOnly, "READONLY"), t0);
        assert!(!h.unanswering(), "it answered");
        h.failure_at(&StoreError::Timeout, t0 + MS);
        assert!(h.unanswering());
        h.success();
        assert!(!h.unanswering());
        h.probed(&Err(down()), t0 + 2 * MS);
        assert!(h.unanswering(), "a failed probe");
    }

    /// A replica, a server out of memory, a password refused: a PING is answered
    /// through them, the probe's script is refused as the calls were. Its answer
    /// brings the shard back with no call; its refusal takes an idle shard down.
    #[test]
    fn a_write_probe_sees_what_a_ping_cannot() {
        let t0 = Instant::now();
        for error in [
            StoreError::failed(ErrorKind::ReadOnly, "READONLY You can't write"),
            StoreError::failed(ErrorKind::Oom, "OOM command not allowed"),
            StoreError::failed(ErrorKind::NoAuth, "NOAUTH Authentication required."),
            StoreError::failed(ErrorKind::NoAuth, "WRONGPASS invalid username-password"),
        ] {
            // Backed off by its calls: a PING's answer leaves it down, the
            // script's brings it up.
            let h = Health::new("s".into(), None);
            for at in [t0, t0, t0 + MIN_FAILING] {
                h.failure_at(&error, at);
            }
            assert!(h.is_down(), "{error}");
            h.probed(&Ok(Asked::Ping), t0 + MIN_FAILING);
            assert!(h.is_down(), "a PING says nothing of {error}");
            h.probed(&Ok(Asked::Write), t0 + MIN_FAILING + PROBE_EVERY);
            assert!(!h.is_down() && !h.is_failing(), "{error}");
            assert_eq!(h.status().state, ShardState::Up);
            // Idle and up, the script refused three times: down with no call.
            let h = Health::new("s".into(), None);
            probe_looks(&h, t0, 3, |_| Err(error.clone()));
            assert!(h.is_down(), "{error}");
            assert_eq!(h.status().last_error.unwrap().message, error.message());
        }
    }

    /// What the probe's script does not run (an ACL refusing one of a decide
    /// call's commands) and a script error wait for a call, whatever answered.
    #[test]
    fn a_write_probe_does_not_end_what_only_a_call_can_tell() {
        let t0 = Instant::now();
        for error in [
            StoreError::failed(
                ErrorKind::NoAuth,
                "ERR The user executing the script can't run this command or subcommand",
            ),
            StoreError::failed(ErrorKind::NoAuth, "NOPERM this user has no permissions"),
            StoreError::failed(ErrorKind::MasterDown, "MASTERDOWN Link with MASTER is down"),
        ] {
            let h = Health::new("s".into(), None);
            for at in [t0, t0, t0 + MIN_FAILING] {
                h.failure_at(&error, at);
            }
            assert!(h.is_down(), "{error}");
            h.probed(&Ok(Asked::Write), t0 + MIN_FAILING);
            assert!(h.is_down(), "{error} waits for a call");
        }
        let h = Health::new("s".into(), None);
        h.failure_at(&StoreError::failed(ErrorKind::Script, "boom"), t0);
        h.probed(&Ok(Asked::Write), t0);
        assert!(h.is_failing());
        // An ACL refusing the probe's script counts as nothing.
        let h = Health::new("s".into(), None);
        let refused = StoreError::failed(ErrorKind::NoAuth, "NOPERM no permissions to run 'eval'");
        probe_looks(&h, t0, 5, |_| Err(refused.clone()));
        assert!(!h.is_failing());
    }
}
