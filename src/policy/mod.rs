//! The policy model: what limits apply to which descriptors.
//!
//! Policies come from files (envoyproxy/ratelimit documents or RateLimitPolicy
//! manifests) and from Kubernetes. Every source produces [`Document`]s; [`compile`]
//! merges them into one immutable [`Policy`] that the request path reads through an
//! atomic swap. Lookups follow envoyproxy/ratelimit's matching exactly.
//!
//! The interface in this file is what the service and the sources rely on.
//!
//! How a policy is read, innermost first:
//! - `yaml.rs`: YAML text to positioned nodes (`node.rs`), one per document;
//!   Kubernetes JSON converts to the same nodes, so both share every check.
//! - `fields.rs`: reading a mapping with precise errors (types, duplicate and unknown
//!   keys); `parse.rs` (documents, both forms), `descriptor.rs` (descriptor trees),
//!   `rate_limit.rs` (their `rate_limit`s, `duration.rs` for durations) and
//!   `sentence.rs` (`shed` and `penalty`) build the [`Document`] model (`model.rs`).
//! - `compile.rs` merges documents into a [`Policy`] whose trees (`matcher.rs`)
//!   answer [`Domain::find`]; `load.rs` reads `--config` files and directories.

use std::collections::HashMap;
use std::fmt;

use crate::algorithm::{Algorithm, Limit, Micros};

pub mod answer;
mod calendar;
mod compile;
mod descriptor;
pub mod duration;
mod fields;
mod fit;
mod load;
mod matcher;
mod model;
mod node;
mod parse;
mod rate_limit;
mod replaces;
mod sentence;
mod yaml;

pub use calendar::{Calendar, Period};
pub use compile::{compile, compile_with};
pub use fit::Fit;
pub use load::{load_paths, read_paths, DirFiles, Snapshot};
pub use matcher::{LevelMatch, NoMatch, Trace};
pub use model::{DescriptorNode, Document, DocumentKind, RateLimit};
pub use parse::{parse_file_json, parse_resource_spec, parse_str, API_VERSION, KIND};

/// The most entries one descriptor of a request may carry, and so the deepest a
/// policy's descriptors may nest: a deeper one could match no request.
pub const MAX_ENTRIES: usize = 32;

/// The largest `burst` a policy may write (the CRD's schema states it too).
pub const MAX_BURST: u64 = crate::algorithm::MAX_BURST;

/// The most limits one descriptor's `rate_limits` list may hold: each is a counter
/// every request of the descriptor touches.
pub const MAX_RATE_LIMITS: usize = 8;

/// The longest `window` a RateLimitPolicy may write, in characters (the CRD schema's
/// `maxLength`, which the parser applies to the resource form too).
pub const MAX_WINDOW_CHARS: usize = 32;

/// Where a policy problem was found: `FILE:LINE: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// The file (or `namespace/name` of a Kubernetes object).
    pub file: String,
    /// 1-based line, when it can be known.
    pub line: Option<usize>,
    /// What is wrong, for a person.
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file, line, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// A layer of limits. Sluice decides edge, then service, then tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Layer {
    /// Per client or network, decided first.
    Edge,
    /// Per route or service; the default.
    #[default]
    Service,
    /// Per customer, decided last.
    Tenant,
}

impl Layer {
    /// The name used in policies and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Edge => "edge",
            Layer::Service => "service",
            Layer::Tenant => "tenant",
        }
    }
}

/// What a compiled policy assumes where a document says nothing (server flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Defaults {
    /// The algorithm of rate limits that name none (`--default-algorithm`).
    pub algorithm: Algorithm,
    /// Every limit counts and reports but never denies, as if each had
    /// `shadow_mode: true` (`--shadow-mode`, envoyproxy/ratelimit's `SHADOW_MODE`).
    pub shadow_mode: bool,
}

/// What to answer when the counter store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailureMode {
    /// Answer OK.
    #[default]
    Open,
    /// Answer OVER_LIMIT.
    Closed,
    /// Decide in this replica's memory with its share of the limit (the limit
    /// divided by the replicas serving), as `limiter::local` does.
    Local,
}

impl FailureMode {
    /// The name policies and flags give it.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Open => "open",
            FailureMode::Closed => "closed",
            FailureMode::Local => "local",
        }
    }

    /// The mode `name` spells ([`FailureMode::as_str`]).
    pub fn parse(name: &str) -> Option<FailureMode> {
        [FailureMode::Open, FailureMode::Closed, FailureMode::Local]
            .into_iter()
            .find(|m| m.as_str() == name)
    }
}

/// envoyproxy/ratelimit's units. `Unknown` is reported for a `window` that is not
/// exactly one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Unknown,
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// The name in policies (lower case) and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Unknown => "unknown",
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit of Envoy's `RateLimitUnit` number; `None` for an unknown number.
    pub fn from_proto(n: i32) -> Option<Unit> {
        Some(match n {
            0 => Unit::Unknown,
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    /// The unit's length; `None` for `Unknown`.
    pub fn micros(self) -> Option<Micros> {
        const S: Micros = crate::algorithm::SECOND;
        Some(match self {
            Unit::Unknown => return None,
            Unit::Second => S,
            Unit::Minute => 60 * S,
            Unit::Hour => 3600 * S,
            Unit::Day => 86_400 * S,
            Unit::Week => 7 * 86_400 * S,
            Unit::Month => 30 * 86_400 * S,
            Unit::Year => 365 * 86_400 * S,
        })
    }
}

/// A penalty: a key denied `violations` times within `within` is banned (denied
/// outright) or tightened (its limit scaled down) for a while; with `block`, a key
/// penalised often enough goes on the block list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Penalty {
    /// Denials that trigger the sentence (at least 1).
    pub violations: u64,
    /// The span over which denials are counted.
    pub within: Micros,
    /// What a key over its violations gets.
    pub sentence: Sentence,
    /// `block`: the block list for chronic offenders.
    pub block: Option<Block>,
}

/// What a penalty does to a key over its violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sentence {
    /// `ban`: denied outright for this long.
    Ban(Micros),
    /// `tighten: {factor, for}`: the key's limit multiplied by `factor` (in
    /// millionths, above 0 and below one million) for `for`.
    Tighten { factor_ppm: u32, span: Micros },
}

impl Sentence {
    /// How long the sentence lasts.
    pub fn span(&self) -> Micros {
        match *self {
            Sentence::Ban(d) => d,
            Sentence::Tighten { span, .. } => span,
        }
    }
}

/// `block: {bans, within, for}`: a key penalised `bans` times within `within` is
/// denied outright for `span`, and listed on the block list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Block {
    pub bans: u64,
    pub within: Micros,
    pub span: Micros,
}

/// `requests` scaled by a tightening's factor: rounded down, at least 1 (a
/// tightened key still gets some traffic; a ban is the sentence that admits none).
pub fn tightened(requests: u64, factor_ppm: u32) -> u64 {
    ((u128::from(requests) * u128::from(factor_ppm) / 1_000_000) as u64).max(1)
}

/// Soft shedding: past `from` of the limit, a request is denied with a probability
/// rising linearly from 0 there to 1 at the limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shed {
    /// The share of the limit where shedding starts, above 0 and below 1.
    pub from: f64,
}

impl Shed {
    /// The chance of shedding a request that brings the counter to `used` of
    /// `capacity`: 0 up to `from`, 1 at the limit.
    pub fn probability(&self, used: u64, capacity: u64) -> f64 {
        if capacity == 0 {
            return 0.0;
        }
        let fill = used as f64 / capacity as f64;
        ((fill - self.from) / (1.0 - self.from)).clamp(0.0, 1.0)
    }
}

/// A compiled limit at one node of the descriptor tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Index of this rule in [`Policy::rules`]; stable for one compiled policy.
    /// `usize::MAX` for a request's override ([`Rule::overriding`]).
    pub id: usize,
    /// The keys from the root to this node joined by `/` (`tenant/path`): the metrics
    /// label, never a request value.
    pub path: String,
    /// `rate_limit.name`, if given.
    pub name: Option<String>,
    /// The limit, or `None` for `unlimited: true`.
    pub limit: Option<Limit>,
    /// `requests_per_unit` and `unit` as reported in `current_limit`.
    pub requests_per_unit: u32,
    /// See `requests_per_unit`; [`Unit::Unknown`] for a `window` that is no unit.
    pub unit: Unit,
    /// Names of limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Counted and reported but never denies.
    pub shadow_mode: bool,
    /// In shadow mode through `--shadow-mode` only (envoyproxy/ratelimit's
    /// `SHADOW_MODE`), not its own `shadow_mode`: as there, its status still says
    /// OVER_LIMIT past its limit; only the answer as a whole stays OK.
    pub global_shadow: bool,
    /// Denies only when every quota-mode descriptor of the request is over limit.
    pub quota_mode: bool,
    /// The descriptor's layer (inherited from its parents when not written).
    pub layer: Layer,
    /// `rate_limit.penalty`, if given.
    pub penalty: Option<Penalty>,
    /// `rate_limit.shed`, if given.
    pub shed: Option<Shed>,
    /// The descriptor is marked `sensitive` (a login or password-reset path).
    pub sensitive: bool,
    /// Metadata merged into the response's `dynamic_metadata` when this rule matches.
    pub metadata: Option<serde_json::Value>,
    /// For each level from the root: `Some(pattern)` when that level matched through a
    /// `share_threshold` wildcard, so the counter key carries the pattern instead of
    /// the request's value (one counter shared by every value the pattern matches).
    pub shared: Vec<Option<String>>,
    /// What every answer says about this rule, written once here (set by `compile`).
    pub rendered: answer::Rendered,
    /// The other limits of the descriptor's `rate_limits` list, as ids of rules
    /// that no tree reaches: each counts the same requests in a counter of its own,
    /// and the request passes only when this rule and every one of them admit it.
    /// Empty for a single `rate_limit`, and in those rules themselves.
    pub also: Vec<usize>,
    /// `window: calendar_day` or `calendar_month`: the limit (a fixed window of the
    /// nominal length) is counted over the local day or month holding each
    /// request's time ([`Rule::limit_at`]).
    pub calendar: Option<Calendar>,
    /// `algorithm: concurrency`: the limit counts requests in flight (a sliding log
    /// whose window is this lease), +1 at the request and -1 at its refund.
    pub lease: Option<Micros>,
    /// envoyproxy/ratelimit's name for this rule's statistics: each level from the
    /// root as `key_value` (`key` without a value), joined by `.`; empty for an
    /// override.
    pub stat_key: String,
}

/// One domain's compiled descriptor tree.
#[derive(Debug, Clone, Default)]
pub struct Domain {
    /// The domain requests name.
    pub name: String,
    /// The domain's own failure mode, when a document sets one.
    pub failure_mode: Option<FailureMode>,
    /// The entry key whose value places this domain's counters, when set.
    pub shard_by: Option<String>,
    pub(crate) root: matcher::Node,
}

/// A request entry as the matcher sees it; implemented by the service for Envoy's
/// protobuf entries so matching needs no copies.
pub trait Entry {
    /// The entry's key.
    fn key(&self) -> &str;
    /// The entry's value.
    fn value(&self) -> &str;
}

impl Entry for (&str, &str) {
    fn key(&self) -> &str {
        self.0
    }
    fn value(&self) -> &str {
        self.1
    }
}

impl Entry for (String, String) {
    fn key(&self) -> &str {
        &self.0
    }
    fn value(&self) -> &str {
        &self.1
    }
}

/// Where a compiled policy's documents came from, for `/debug/policies`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    /// File path, or `namespace/name` of a Kubernetes object.
    pub source: String,
    /// The domain the document names.
    pub domain: String,
    /// 1-based line where the document starts, when known.
    pub line: Option<usize>,
    /// `namespace/name` when the document is a RateLimitPolicy resource.
    pub resource: Option<String>,
}

/// Every domain's compiled tree. Immutable once built; swapped whole on reload.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Compiled trees by domain name.
    pub domains: HashMap<String, Domain>,
    /// All rules of all domains, indexed by [`Rule::id`].
    pub rules: Vec<Rule>,
    /// Every document compiled into this policy, in order.
    pub sources: Vec<SourceInfo>,
    /// What the documents left out was filled with.
    pub defaults: Defaults,
}

impl Policy {
    /// A domain's tree, if any document names it.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The rule with this id; ids come from [`Domain::find`] on this policy.
    pub fn rule(&self, id: usize) -> &Rule {
        &self.rules[id]
    }

    /// How many rules the documents wrote: descriptors with a `rate_limit`, a
    /// `rate_limits` list or `unlimited: true`. A list is one rule however many
    /// limits it holds ([`Rule::also`]), as `/debug/policies` lists a document's
    /// rules; [`Policy::rules`] holds every limit.
    pub fn rule_count(&self) -> usize {
        self.rules.len() - self.rules.iter().map(|r| r.also.len()).sum::<usize>()
    }

    /// Every rule with the name of its domain, sorted by domain and rule id.
    pub fn rules_by_domain(&self) -> Vec<(&str, &Rule)> {
        let mut out = Vec::with_capacity(self.rules.len());
        let mut ids = Vec::new();
        for (name, domain) in &self.domains {
            ids.clear();
            domain.root.rule_ids(&mut ids);
            out.extend(ids.iter().map(|&id| (name.as_str(), &self.rules[id])));
        }
        out.sort_by(|a, b| (a.0, a.1.id).cmp(&(b.0, b.1.id)));
        out
    }
}

impl Rule {
    /// This rule's id, then those of its further limits ([`Rule::also`]): every
    /// limit a request matching it is decided by.
    pub fn limit_ids(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.id).chain(self.also.iter().copied())
    }

    /// The limit to decide a request at `now` by: [`Rule::limit`], over the calendar
    /// window holding `now` for a calendar rule. `None` for an unlimited rule.
    pub fn limit_at(&self, now: impl FnOnce() -> Micros) -> Option<Limit> {
        let limit = self.limit?;
        Some(match &self.calendar {
            Some(c) => c.limit(limit, now()),
            None => limit,
        })
    }

    /// The rule a request's descriptor `limit` override stands for (Envoy's
    /// `RateLimitOverride`): `requests_per_unit` per `unit` with the default
    /// algorithm, unnamed, never quota and shadow only under `defaults.shadow_mode`,
    /// as envoyproxy/ratelimit treats it. `path` and `layer` are those of the rule it
    /// replaces (keys joined by `/`, `service` without one).
    pub fn overriding(
        path: String,
        layer: Layer,
        requests_per_unit: u32,
        unit: Unit,
        defaults: &Defaults,
    ) -> Option<Rule> {
        let window = unit.micros()?;
        let requests = u64::from(requests_per_unit);
        let mut rule = Rule {
            id: usize::MAX,
            path,
            name: None,
            limit: Some(Limit {
                algorithm: defaults.algorithm,
                requests,
                window,
                burst: requests,
                phase: 0,
            }),
            requests_per_unit,
            unit,
            replaces: Vec::new(),
            shadow_mode: defaults.shadow_mode,
            global_shadow: defaults.shadow_mode,
            quota_mode: false,
            layer,
            penalty: None,
            shed: None,
            sensitive: false,
            metadata: None,
            shared: Vec::new(),
            rendered: Default::default(),
            also: Vec::new(),
            calendar: None,
            lease: None,
            stat_key: String::new(),
        };
        rule.rendered = answer::render(&rule);
        Some(rule)
    }
}

impl Domain {
    /// The rule that applies to a request descriptor, following envoyproxy/ratelimit:
    /// per level exact `key`+`value` first, then wildcard values in file order, then
    /// `key` alone; a limit applies only when the descriptor has exactly as many
    /// entries as the matched depth. Returns the rule's id.
    pub fn find<E: Entry>(&self, entries: &[E]) -> Option<usize> {
        self.root.find(entries)
    }

    /// The rule for entries given as a set in any order (an RLQS `BucketId`), and in
    /// `order` the entries' indices in the order the tree matched them: each level
    /// takes an entry whose key the tree has there (trying `entries` in their order
    /// and backing out of branches that cannot use them all), matched as
    /// [`Domain::find`] matches a value.
    pub fn find_unordered<E: Entry>(&self, entries: &[E], order: &mut Vec<usize>) -> Option<usize> {
        self.root.find_unordered(entries, order)
    }

    /// [`Domain::find`] with how each level matched, or why nothing did (for the
    /// admin API's Explain; allocates).
    pub fn trace<E: Entry>(&self, entries: &[E]) -> Trace {
        self.root.trace(entries)
    }

    /// Every rule of this domain, in id order.
    pub fn rule_ids(&self) -> Vec<usize> {
        let mut ids = Vec::new();
        self.root.rule_ids(&mut ids);
        ids.sort_unstable();
        ids
    }
}
