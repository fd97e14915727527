//! The Lua scripts and their calling convention: arguments out, verdicts back.
//!
//! Standalone shards on Redis 7 call the decide script as a function ([`Library`],
//! `FCALL`). Otherwise scripts run with EVALSHA by their SHA-1; a standalone server
//! that answers NOSCRIPT (after a restart or `SCRIPT FLUSH`) gets the call again as
//! EVAL, which caches the script. A cluster master gets the script loaded once
//! instead, for all the calls that met its absence (see `cluster`).
//!
//! Exactness: Lua numbers are doubles, exact for integers below 2^53. The scripts
//! never form a product directly (see `muldiv` in common.lua), so they agree with the
//! Rust algorithms whenever every time, count and quotient stays below 2^53: true for
//! any limit of at most 2^50 requests/burst/hits over a window of at most 2^50 µs
//! (35 years) whose burst * window / requests is below 2^53 µs (285 years). Larger
//! values are clamped to 2^50 here, which for such limits means "unlimited" anyway.

use sluice_redis::{Pool, Request, Value};

use crate::algorithm::{Micros, Verdict};
use crate::store::{ErrorKind, Hit, Mode, Spend, StoreError};

use super::shard;

/// Lua helpers and algorithms: what the decision calls.
macro_rules! decide_helpers {
    () => {
        concat!(
            include_str!("lua/common.lua"),
            include_str!("lua/algorithms.lua")
        )
    };
}

/// Lua helpers, algorithms and the decision itself, as one script.
const DECIDE_LUA: &str = concat!(decide_helpers!(), include_str!("lua/decide.lua"));

/// Lua helpers, algorithms and the read-only peek.
const PEEK_LUA: &str = concat!(
    include_str!("lua/common.lua"),
    include_str!("lua/algorithms.lua"),
    include_str!("lua/peek.lua")
);

/// Lua helpers and the give-back.
const REFUND_LUA: &str = concat!(
    include_str!("lua/common.lua"),
    include_str!("lua/refund.lua")
);

/// Largest value passed to the scripts (see the module doc).
pub const MAX_ARG: u64 = 1 << 50;

// A request's hits are refused past what the scripts are given, not clamped.
const _: () = assert!(crate::store::MAX_HITS == MAX_ARG);

// A policy's `burst` is refused past it too, so no bucket is clamped.
const _: () = assert!(crate::algorithm::MAX_BURST == MAX_ARG);

/// Values per hit in the decide reply.
const REPLY_STRIDE: usize = 7;

/// A Lua script and its SHA-1, the name EVALSHA calls it by.
#[derive(Debug, Clone)]
pub struct Lua {
    text: &'static str,
    hash: String,
}

impl Lua {
    pub fn new(text: &'static str) -> Lua {
        Lua {
            text,
            hash: sha1_smol::Sha1::from(text).digest().to_string(),
        }
    }

    pub fn hash(&self) -> &str {
        &self.hash
    }

    pub fn text(&self) -> &'static str {
        self.text
    }

    /// A call of this script, to be given its keys and arguments.
    pub fn call(&self) -> Call<'_> {
        Call {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// The decide script as a Redis function library (Redis 7 and later), so that Redis
/// builds its helpers once, when the library loads, instead of on every call: about a
/// fifth of a one-counter call's cost (docs/performance-notes.md, "Redis path"). The
/// names carry the script's hash, so replicas of different versions sharing a Redis
/// each call their own; the stored state is the script's either way.
#[derive(Debug)]
pub struct Library {
    /// The library's and its one function's name, `sluice_decide_` and 16 hex digits.
    name: String,
    /// `FUNCTION LOAD`'s argument.
    text: String,
}

impl Library {
    fn of_decide(script: &Lua) -> Library {
        let name = format!("sluice_decide_{}", &script.hash()[..16]);
        let text = format!(
            "#!lua name={name}\n{}local function decide(KEYS, ARGV)\n{}\nend\n\
             redis.register_function('{name}', decide)\n",
            decide_helpers!(),
            include_str!("lua/decide.lua"),
        );
        Library { name, text }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// `FUNCTION LOAD` of this library into `req`.
    pub fn write_load(&self, req: &mut Request) {
        req.start(3);
        req.arg(b"FUNCTION");
        req.arg(b"LOAD");
        req.arg(self.text.as_bytes());
    }

    /// What a `FUNCTION LOAD` reply says of calling by function: `Some(true)`, the
    /// library is there (loaded now, or by another replica of the same version
    /// before); `Some(false)`, this server or user has none (a Redis before 7 knows
    /// no `FUNCTION`, an ACL may forbid it: `ERR`, `NOPERM`), so calls go by script;
    /// `None`, not now (`OOM` at `maxmemory`, `LOADING`, `BUSY`, a replica's
    /// `READONLY`): ask again with the next call rather than go by script for good.
    pub fn loaded(reply: &Value) -> Option<bool> {
        match reply {
            Value::Bulk(_) => Some(true),
            Value::Error(e) if e.contains("already exists") => Some(true),
            Value::Error(e) if e.starts_with("ERR") || e.starts_with("NOPERM") => Some(false),
            Value::Error(_) => None,
            _ => Some(false),
        }
    }

    /// Whether an error answering `FCALL` means calling by script instead: the
    /// function is unknown to this server (after a restart, `FUNCTION FLUSH` or a
    /// failover to a server that never loaded it: load it again first), or the server
    /// or the user has no `FCALL`.
    pub fn missing(error: &str) -> bool {
        error.starts_with("ERR Function not found")
            || error.starts_with("ERR unknown command")
            || error.starts_with("NOPERM")
    }
}

/// The scripts, hashed once.
#[derive(Debug, Clone)]
pub struct Scripts {
    pub decide: Lua,
    /// The decide script as a function library.
    pub decide_library: std::sync::Arc<Library>,
    pub refund: Lua,
    pub peek: Lua,
    /// RLQS demand records (`demand.lua`, see `demand.rs`).
    pub demand: Lua,
}

impl Default for Scripts {
    fn default() -> Self {
        let decide = Lua::new(DECIDE_LUA);
        Scripts {
            decide_library: std::sync::Arc::new(Library::of_decide(&decide)),
            decide,
            refund: Lua::new(REFUND_LUA),
            peek: Lua::new(PEEK_LUA),
            demand: Lua::new(include_str!("lua/demand.lua")),
        }
    }
}

/// A script call off the decide path, its keys and arguments as text.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    script: &'a Lua,
    keys: Vec<String>,
    args: Vec<String>,
}

impl Call<'_> {
    pub fn key(&mut self, key: impl Into<String>) -> &mut Self {
        self.keys.push(key.into());
        self
    }

    pub fn arg(&mut self, arg: impl std::fmt::Display) -> &mut Self {
        self.args.push(arg.to_string());
        self
    }

    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    pub fn script(&self) -> &Lua {
        self.script
    }

    /// The call as one command: EVALSHA, or with `text` EVAL (after NOSCRIPT).
    pub fn write(&self, req: &mut Request, text: bool) {
        req.start(3 + self.keys.len() + self.args.len());
        if text {
            req.arg(b"EVAL");
            req.arg(self.script.text.as_bytes());
        } else {
            req.arg(b"EVALSHA");
            req.arg(self.script.hash.as_bytes());
        }
        req.arg_u64(self.keys.len() as u64);
        for k in &self.keys {
            req.arg(k.as_bytes());
        }
        for a in &self.args {
            req.arg(a.as_bytes());
        }
    }
}

/// Runs a script call that `write` writes by hash (or, told `true`, by text)
/// through `send`: EVALSHA, then EVAL if the server lost its scripts (a restart,
/// `SCRIPT FLUSH`). An error reply comes back as its [`StoreError`].
pub async fn run<F, Fut>(
    write: impl Fn(&mut Request, bool),
    mut send: F,
) -> Result<Value, StoreError>
where
    F: FnMut(Request) -> Fut,
    Fut: std::future::Future<Output = Result<Value, StoreError>>,
{
    let mut req = Request::default();
    write(&mut req, false);
    let mut value = send(req).await?;
    if noscript(&value) {
        let mut req = Request::default();
        write(&mut req, true);
        value = send(req).await?;
    }
    match value {
        Value::Error(e) => Err(super::error::shard_reply(e)),
        v => Ok(v),
    }
}

/// Whether a script call's reply says the server does not have the script.
pub fn noscript(value: &Value) -> bool {
    matches!(value, Value::Error(e) if e.starts_with("NOSCRIPT"))
}

/// Runs `call` on `pool`'s server ([`run`]).
pub async fn invoke(pool: &Pool, call: &Call<'_>) -> Result<Value, StoreError> {
    let write = |req: &mut Request, text| call.write(req, text);
    run(write, |req| async move { Ok(pool.query(&req).await?) }).await
}

/// A script's reply as a flat array of integers.
pub fn integers(value: Value) -> Result<Vec<i64>, StoreError> {
    let bad = || StoreError::failed(ErrorKind::Protocol, "script answered no array of integers");
    value
        .into_array()
        .ok_or_else(bad)?
        .iter()
        .map(|v| match v {
            Value::Int(i) => Ok(*i),
            _ => Err(bad()),
        })
        .collect()
}

/// One request's share of a decide call: its hits on one shard (or slot), with
/// their Redis keys, in the request's order, owned so a shard's task can send it.
#[derive(Debug, Clone, Default)]
pub struct Group {
    pub keys: Vec<String>,
    pub hits: Vec<HitArgs>,
    /// Quota-mode hits of the request live on other shards too.
    pub quota_elsewhere: bool,
}

/// A hit's script arguments (clamped, see the module doc).
#[derive(Debug, Clone)]
pub struct HitArgs {
    limit: LimitArgs,
    hits: u64,
    /// leaky_bucket: [`Hit::max_delay`], sent after the hit (-1 for none).
    max_delay: Option<u64>,
}

/// A limit as the decide script takes it, sent once per call for all its hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LimitArgs {
    code: &'static str,
    requests: u64,
    window: u64,
    burst: u64,
    mode: &'static str,
}

impl HitArgs {
    pub fn new(h: &Hit) -> Self {
        HitArgs {
            limit: LimitArgs {
                code: shard::code(h.limit.algorithm),
                requests: clamp(h.limit.requests),
                window: clamp(h.limit.window.max(1)),
                burst: burst_arg(&h.limit),
                mode: mode_code(h.mode, h.spend),
            },
            hits: clamp(h.hits),
            max_delay: (h.max_delay != crate::algorithm::NO_DEADLINE).then(|| clamp(h.max_delay)),
        }
    }
}

/// What one decide call answered for one group.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Whether the shard consumed (the group's hits passed the shared rule).
    pub consumed: bool,
    /// Verdicts and refund tokens, in the group's order.
    pub verdicts: Vec<(Verdict, i64)>,
    /// The shard's clock (µs) when the call decided.
    pub now: Micros,
}

fn clamp(v: u64) -> u64 {
    v.min(MAX_ARG)
}

/// The limit's third number: a bucket's burst, or a fixed window's phase (below its
/// window, so never clamped: a calendar window's local midnight), which
/// `fixed_window` in algorithms.lua reads in that place. The other windows ignore it.
fn burst_arg(limit: &crate::algorithm::Limit) -> u64 {
    match limit.algorithm {
        crate::algorithm::Algorithm::FixedWindow => limit.phase % limit.window.max(1),
        _ => clamp(limit.burst),
    }
}

/// The mode's letter, in upper case for a charge (decide.lua then spends it whole),
/// `R` for a refund (never denied, so its mode does not matter).
fn mode_code(mode: Mode, spend: Spend) -> &'static str {
    match (mode, spend) {
        (_, Spend::Refund) => "R",
        (Mode::Enforce, Spend::IfAdmitted) => "e",
        (Mode::Shadow, Spend::IfAdmitted) => "s",
        (Mode::Quota, Spend::IfAdmitted) => "q",
        (Mode::Enforce, Spend::Always) => "E",
        (Mode::Shadow, Spend::Always) => "S",
        (Mode::Quota, Spend::Always) => "Q",
    }
}

/// One argument of a script call.
enum Arg<'a> {
    Text(&'a str),
    Number(u64),
    Signed(i64),
}

/// Receives a decide call's keys and arguments, each kind in call order.
trait Sink {
    fn key(&mut self, key: &str);
    fn arg(&mut self, arg: Arg<'_>);
}

/// How many limits a hit's limit is looked for among before it is sent as a new one:
/// bounds the search in a call with many distinct limits (a repeat costs only bytes).
const LIMIT_SEARCH: usize = 32;

/// A decide call's distinct limits, in first-use order, and the number (1-based) of
/// each hit's limit, hit after hit, group after group.
struct Layout<'g> {
    limits: Vec<&'g LimitArgs>,
    numbers: Vec<u64>,
}

impl<'g> Layout<'g> {
    fn new(groups: &[&'g Group]) -> Self {
        let hits = groups.iter().map(|g| g.hits.len()).sum();
        let mut layout = Layout {
            limits: Vec::new(),
            numbers: Vec::with_capacity(hits),
        };
        for h in groups.iter().flat_map(|g| &g.hits) {
            let found = layout
                .limits
                .iter()
                .take(LIMIT_SEARCH)
                .position(|l| **l == h.limit);
            let i = found.unwrap_or_else(|| {
                layout.limits.push(&h.limit);
                layout.limits.len() - 1
            });
            layout.numbers.push(i as u64 + 1);
        }
        layout
    }
}

/// leaky_bucket's code: its hits carry one value more, their longest delay.
const LEAKY: &str = shard::code(crate::algorithm::Algorithm::LeakyBucket);

/// The keys and arguments deciding `groups` one after another, in the layout
/// decide.lua documents: the call's limits once, then per group its size (negated
/// when quota hits live elsewhere) and per hit its limit's number (negated and
/// followed by the hits unless they are 1), and for a leaky_bucket hit its longest
/// delay.
fn decide_args(
    groups: &[&Group],
    layout: &Layout<'_>,
    fixed_now: Option<Micros>,
    sink: &mut impl Sink,
) {
    sink.arg(match fixed_now {
        Some(n) => Arg::Number(n),
        None => Arg::Text(""),
    });
    sink.arg(Arg::Number(layout.limits.len() as u64));
    for l in &layout.limits {
        sink.arg(Arg::Text(l.code));
        sink.arg(Arg::Number(l.requests));
        sink.arg(Arg::Number(l.window));
        sink.arg(Arg::Number(l.burst));
        sink.arg(Arg::Text(l.mode));
    }
    let mut numbers = layout.numbers.iter();
    for g in groups {
        let m = g.hits.len() as i64;
        sink.arg(Arg::Signed(if g.quota_elsewhere { -m } else { m }));
        for (h, key) in g.hits.iter().zip(&g.keys) {
            sink.key(key);
            let j = *numbers.next().expect("a number per hit") as i64;
            if h.hits == 1 {
                sink.arg(Arg::Signed(j));
            } else {
                sink.arg(Arg::Signed(-j));
                sink.arg(Arg::Number(h.hits));
            }
            if h.limit.code == LEAKY {
                sink.arg(match h.max_delay {
                    Some(d) => Arg::Number(d),
                    None => Arg::Signed(-1),
                });
            }
        }
    }
}

/// How [`write_decide`] names the script.
#[derive(Debug, Clone, Copy)]
pub enum By<'a> {
    /// `EVALSHA` with the script's hash (without functions).
    Hash(&'a str),
    /// `EVAL` with the script's text (after a NOSCRIPT answer; Redis caches it again).
    Text,
    /// `FCALL` of the function of this name ([`Library`]).
    Function(&'a str),
}

/// Writes the decide call for `groups` as one RESP command into `req`, without an
/// allocation per argument.
pub fn write_decide(
    req: &mut Request,
    script: By<'_>,
    groups: &[&Group],
    fixed_now: Option<Micros>,
) {
    struct Count(usize, usize);
    impl Sink for Count {
        fn key(&mut self, _: &str) {
            self.0 += 1;
        }
        fn arg(&mut self, _: Arg<'_>) {
            self.1 += 1;
        }
    }
    struct Keys<'r>(&'r mut Request);
    impl Sink for Keys<'_> {
        fn key(&mut self, key: &str) {
            self.0.arg(key.as_bytes());
        }
        fn arg(&mut self, _: Arg<'_>) {}
    }
    struct Args<'r>(&'r mut Request);
    impl Sink for Args<'_> {
        fn key(&mut self, _: &str) {}
        fn arg(&mut self, arg: Arg<'_>) {
            match arg {
                Arg::Text(t) => self.0.arg(t.as_bytes()),
                Arg::Number(n) => self.0.arg_u64(n),
                Arg::Signed(n) => self.0.arg_i64(n),
            }
        }
    }
    let layout = Layout::new(groups);
    let mut count = Count(0, 0);
    decide_args(groups, &layout, fixed_now, &mut count);
    req.start(3 + count.0 + count.1);
    match script {
        By::Hash(sha) => {
            req.arg(b"EVALSHA");
            req.arg(sha.as_bytes());
        }
        By::Text => {
            req.arg(b"EVAL");
            req.arg(DECIDE_LUA.as_bytes());
        }
        By::Function(name) => {
            req.arg(b"FCALL");
            req.arg(name.as_bytes());
        }
    }
    req.arg_u64(count.0 as u64);
    decide_args(groups, &layout, fixed_now, &mut Keys(req));
    decide_args(groups, &layout, fixed_now, &mut Args(req));
}

/// Builds the refund invocation for the consumed hits of a group.
pub fn refund_call<'a>(
    scripts: &'a Scripts,
    prefix: &str,
    hits: &[Hit],
    consumed: &[(usize, i64)],
) -> Call<'a> {
    let mut call = scripts.refund.call();
    for &(i, token) in consumed {
        let h = &hits[i];
        call.key(shard::redis_key(prefix, h));
        call.arg(shard::code(h.limit.algorithm))
            .arg(clamp(h.limit.requests))
            .arg(clamp(h.limit.window.max(1)))
            .arg(clamp(h.hits))
            .arg(token);
    }
    call
}

/// Values per hit in the peek reply.
const PEEK_STRIDE: usize = 7;

/// Builds the peek invocation for `hits` (all on one shard or slot) at `keys`.
pub fn peek_call<'a>(
    scripts: &'a Scripts,
    hits: &[&Hit],
    keys: &[String],
    fixed_now: Option<Micros>,
) -> Call<'a> {
    let mut call = scripts.peek.call();
    match fixed_now {
        Some(n) => call.arg(n),
        None => call.arg(""),
    };
    for (h, key) in hits.iter().zip(keys) {
        let a = HitArgs::new(h);
        call.key(key)
            .arg(a.limit.code)
            .arg(a.limit.requests)
            .arg(a.limit.window)
            .arg(a.limit.burst)
            .arg(a.hits);
    }
    call
}

/// Reads a peek reply for `n` hits: their verdicts, then the shard's time.
pub fn parse_peek(values: &[i64], n: usize) -> Result<Vec<Verdict>, StoreError> {
    if values.len() != n * PEEK_STRIDE + 1 {
        return Err(StoreError::failed(
            ErrorKind::Protocol,
            format!(
                "peek script answered {} values, expected {}",
                values.len(),
                n * PEEK_STRIDE + 1
            ),
        ));
    }
    let micros = |v: i64| -> Micros { u64::try_from(v).unwrap_or(u64::MAX) };
    Ok(values[..n * PEEK_STRIDE]
        .chunks_exact(PEEK_STRIDE)
        .map(|c| Verdict {
            admitted: c[0] == 1,
            remaining: u64::try_from(c[1]).unwrap_or(0),
            reset: micros(c[2]),
            retry_after: micros(c[3]),
            delay: micros(c[4]),
            next_room: micros(c[5]),
            owed: u64::try_from(c[6]).unwrap_or(0),
            late: false,
        })
        .collect())
}

/// Reads a decide reply for groups of `sizes` hits each (and the call's time, last).
pub fn parse_replies(values: &[i64], sizes: &[usize]) -> Result<Vec<Reply>, StoreError> {
    let want: usize = 1 + sizes.iter().map(|n| 1 + n * REPLY_STRIDE).sum::<usize>();
    if values.len() != want {
        return Err(StoreError::failed(
            ErrorKind::Protocol,
            format!(
                "decide script answered {} values, expected {want}",
                values.len()
            ),
        ));
    }
    let micros = |v: i64| -> Micros {
        // The scripts send -1 for "never".
        u64::try_from(v).unwrap_or(u64::MAX)
    };
    let (&now, mut rest) = values.split_last().expect("at least the time");
    let now = u64::try_from(now).unwrap_or(0);
    let mut replies = Vec::with_capacity(sizes.len());
    for &n in sizes {
        let (group, tail) = rest.split_at(1 + n * REPLY_STRIDE);
        rest = tail;
        let verdicts = group[1..]
            .chunks_exact(REPLY_STRIDE)
            .map(|c| {
                // A charge's delay place holds what its key owes, negated; a denial's,
                // the turn that came too late for its caller (`late`).
                let admitted = c[0] == 1;
                let (delay, owed, late) = match u64::try_from(c[4]) {
                    Ok(delay) if admitted => (delay, 0, false),
                    Ok(turn) => (0, 0, turn > 0),
                    Err(_) => (0, c[4].unsigned_abs(), false),
                };
                (
                    Verdict {
                        admitted,
                        remaining: u64::try_from(c[1]).unwrap_or(0),
                        reset: micros(c[2]),
                        retry_after: micros(c[3]),
                        delay,
                        next_room: micros(c[6]),
                        owed,
                        late,
                    },
                    c[5],
                )
            })
            .collect();
        replies.push(Reply {
            consumed: group[0] == 1,
            verdicts,
            now,
        });
    }
    Ok(replies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::store::Limit;

    /// The arguments a call sends, as text, and its keys.
    fn sent(groups: &[&Group]) -> (Vec<String>, Vec<String>) {
        struct Texts(Vec<String>, Vec<String>);
        impl Sink for Texts {
            fn key(&mut self, key: &str) {
                self.1.push(key.to_string());
            }
            fn arg(&mut self, arg: Arg<'_>) {
                self.0.push(match arg {
                    Arg::Text(t) => t.to_string(),
                    Arg::Number(n) => n.to_string(),
                    Arg::Signed(n) => n.to_string(),
                });
            }
        }
        let mut t = Texts(Vec::new(), Vec::new());
        decide_args(groups, &Layout::new(groups), None, &mut t);
        (t.0, t.1)
    }

    fn group(hits: &[(&str, Algorithm, u64, u64)], quota_elsewhere: bool) -> Group {
        group_within(hits, crate::algorithm::NO_DEADLINE, quota_elsewhere)
    }

    /// [`group`], every hit's caller waiting at most `max_delay`.
    fn group_within(
        hits: &[(&str, Algorithm, u64, u64)],
        max_delay: Micros,
        quota_elsewhere: bool,
    ) -> Group {
        let hits: Vec<Hit> = hits
            .iter()
            .map(|&(key, algorithm, requests, hits)| {
                let h = crate::store::testkit::hit(key, algorithm, requests, hits);
                Hit {
                    limit: Limit {
                        window: 1_000_000,
                        ..h.limit
                    },
                    max_delay,
                    ..h
                }
            })
            .collect();
        Group {
            keys: hits.iter().map(|h| h.key.clone()).collect(),
            hits: hits.iter().map(HitArgs::new).collect(),
            quota_elsewhere,
        }
    }

    #[test]
    fn the_decide_library_is_named_by_its_version_and_registers_that_name() {
        let scripts = Scripts::default();
        let lib = &scripts.decide_library;
        assert_eq!(
            lib.name(),
            format!("sluice_decide_{}", &scripts.decide.hash()[..16])
        );
        assert!(lib
            .text()
            .starts_with(&format!("#!lua name={}\n", lib.name())));
        assert!(lib.text().ends_with(&format!(
            "redis.register_function('{}', decide)\n",
            lib.name()
        )));
        let mut req = Request::default();
        write_decide(&mut req, By::Function(lib.name()), &[], None);
        let sent = String::from_utf8_lossy(req.bytes()).into_owned();
        assert!(sent.contains(&format!("FCALL\r\n${}\r\n{}", lib.name().len(), lib.name())));
    }

    #[test]
    fn only_a_server_or_user_without_functions_falls_back_to_scripts() {
        let error = |e: &str| Value::Error(e.to_string());
        assert_eq!(
            Library::loaded(&Value::Bulk(b"sluice_decide_0123".to_vec())),
            Some(true)
        );
        // Another replica of the same version loaded it first.
        assert_eq!(
            Library::loaded(&error("ERR Library 'sluice_decide_0123' already exists")),
            Some(true)
        );
        assert_eq!(
            Library::loaded(&error(
                "ERR unknown command 'FUNCTION', with args beginning with: 'LOAD'"
            )),
            Some(false)
        );
        assert_eq!(
            Library::loaded(&error(
                "NOPERM this user has no permissions to run the 'function|load' command"
            )),
            Some(false)
        );
        // A passing refusal decides nothing: the next call asks again.
        for passing in [
            "OOM command not allowed when used memory > 'maxmemory'.",
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script.",
            "READONLY You can't write against a read only replica.",
        ] {
            assert_eq!(Library::loaded(&error(passing)), None, "{passing}");
        }
        assert!(Library::missing("ERR Function not found"));
        assert!(Library::missing(
            "ERR unknown command 'FCALL', with args beginning with: "
        ));
        // An error of the Lua itself is the call's outcome: never sent again.
        assert!(!Library::missing(
            "ERR user_function:12: Script attempted to access nonexistent global variable 'x'"
        ));
    }

    #[test]
    fn a_leaky_hit_carries_its_longest_delay_and_no_other_hit_does() {
        use Algorithm::{LeakyBucket as Lb, TokenBucket as Tb};
        let within = group_within(&[("q", Lb, 5, 1), ("t", Tb, 5, 2)], 16_000, false);
        let free = group(&[("q", Lb, 5, 3)], false);
        let (args, _) = sent(&[&within, &free]);
        let want = [
            "", "2", //
            "lb", "5", "1000000", "5", "e", //
            "tb", "5", "1000000", "5", "e", //
            "2", "1", "16000", "-2", "2", // the leaky hit's wait; none after the bucket's
            "1", "-1", "3", "-1", // a caller without a deadline: -1
        ];
        assert_eq!(args, want);
    }

    #[test]
    fn a_call_sends_each_limit_once_and_one_hit_as_one_value() {
        use Algorithm::{FixedWindow as Fw, TokenBucket as Tb};
        let a = group(&[("ip1", Fw, 10, 1), ("svc", Tb, 50, 1)], false);
        let b = group(&[("ip2", Fw, 10, 3), ("svc", Tb, 50, 0)], true);
        let c = group(&[("ip3", Fw, 20, 1)], false);
        let (args, keys) = sent(&[&a, &b, &c]);
        assert_eq!(keys, ["ip1", "svc", "ip2", "svc", "ip3"]);
        let want = [
            "", "3", // no fixed time; three distinct limits
            "fw", "10", "1000000", "0", "e", // a fixed window's phase in the burst's place
            "tb", "50", "1000000", "50", "e", //
            "fw", "20", "1000000", "0", "e", //
            "2", "1", "2", // a: two hits, one each
            "-2", "-1", "3", "-2", "0", // b: quota elsewhere; hits 3 and 0
            "1", "3", // c: the third limit
        ];
        assert_eq!(args, want);
    }

    #[test]
    fn past_the_search_bound_a_limit_is_sent_again_and_still_named_right() {
        // Limits 1..=40 in turn, then the first and the last again: the first is
        // found among the first LIMIT_SEARCH, the last is past them and sent anew.
        let mut hits: Vec<(&str, Algorithm, u64, u64)> = (1..=40)
            .map(|r| ("k", Algorithm::FixedWindow, r, 1))
            .collect();
        hits.push(("k", Algorithm::FixedWindow, 1, 1));
        hits.push(("k", Algorithm::FixedWindow, 40, 1));
        let g = group(&hits, false);
        let (args, _) = sent(&[&g]);
        assert_eq!(args[1], "41", "40 distinct limits and one repeat");
        let limit = |j: usize| &args[2 + (j - 1) * 5..2 + j * 5];
        let numbers = &args[2 + 41 * 5 + 1..];
        assert_eq!(numbers.len(), 42);
        for (i, n) in numbers.iter().enumerate() {
            let requests = hits[i].2.to_string();
            assert_eq!(limit(n.parse().unwrap())[1], requests, "hit {i}");
        }
        assert_eq!((numbers[40].as_str(), numbers[41].as_str()), ("1", "41"));
    }

    #[test]
    fn replies_are_checked_and_never_maps_to_max() {
        let parse_reply = |v: &[i64], n: usize| parse_replies(v, &[n]).map(|mut r| r.remove(0));
        assert!(parse_reply(&[1, 1, 2], 1).is_err());
        assert!(
            parse_reply(&[0, 0, 3, 10, -1, 0, 0, 0], 1).is_err(),
            "no time"
        );
        let r = parse_reply(&[0, 0, 3, 10, -1, 0, 0, 0, 555], 1).unwrap();
        assert!(!r.consumed);
        assert_eq!(r.now, 555);
        assert_eq!(r.verdicts[0].0.retry_after, u64::MAX);
        assert_eq!(r.verdicts[0].0.remaining, 3);
        let r = parse_reply(&[1, 1, 0, 10, 0, 0, 42, 7, 1, 0, 10, 0, 0, 43, -1, 9], 2).unwrap();
        assert_eq!(r.verdicts[0].0.next_room, 7);
        assert_eq!(r.verdicts[0].1, 42);
        assert_eq!(r.verdicts[1].0.next_room, u64::MAX);
        // A charge's debt is its delay place negated; a delay stays a delay.
        let r = parse_reply(&[1, 0, 0, 10, 5, -40, 0, 5, 1, 0, 10, 0, 3, 0, 0, 9], 2).unwrap();
        assert_eq!((r.verdicts[0].0.owed, r.verdicts[0].0.delay), (40, 0));
        assert_eq!((r.verdicts[1].0.owed, r.verdicts[1].0.delay), (0, 3));
    }

    #[test]
    fn replies_are_split_by_group() {
        let values = [
            1, 1, 4, 5, 0, 0, 7, 0, 0, 0, 9, -1, 0, 0, 1, 2, 3, 4, 5, 6, 7,
        ];
        assert!(parse_replies(&values, &[1, 1]).is_err());
        assert!(parse_replies(&values, &[2, 1]).is_err());
        let r = parse_replies(&values, &[1, 1, 0]).unwrap_err();
        assert_eq!(r.kind(), Some(ErrorKind::Protocol));
        let r = parse_replies(&values[..17], &[1, 1]).unwrap();
        assert!(r[0].consumed && !r[1].consumed);
        assert_eq!((r[0].now, r[1].now), (3, 3));
        assert_eq!(r[0].verdicts[0].1, 7);
        assert_eq!(r[0].verdicts[0].0.remaining, 4);
        assert_eq!(r[1].verdicts[0].0.reset, u64::MAX);
        assert_eq!((r[1].verdicts[0].1, r[1].verdicts[0].0.next_room), (1, 2));
    }
}
