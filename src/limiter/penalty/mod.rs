//! `penalty` (docs/observability.md, "Closing the loop"): a key denied `violations` times within
//! `within` is sentenced: banned (denied outright) for `ban`, or tightened (its limit
//! multiplied by `factor`) for `tighten.for`. With `block`, a key sentenced `bans`
//! times within `block.within` goes on the block list: denied outright for
//! `block.for`. Operators add and lift blocks through the admin API.
//!
//! [`Penalties`] is consulted before the store: a banned or blocked key is OVER_LIMIT
//! at once, with no store call, and `retry-after` is the rest of its sentence; a
//! tightened key is decided against its scaled limit. It is fed after each decision
//! with the denials of rules that carry a penalty. Only enforced limits count: a
//! `shadow_mode` limit never denies, and a `quota_mode` limit is left to its quota
//! rule. Soft shedding never counts.
//!
//! **One replica or many.** With the memory store the counts and sentences are this
//! process's own. With a store that shares them ([`Store::shares_sentences`], Redis),
//! every denial is counted in the store, so a client spread over replicas is
//! sentenced as one; the sentence comes back in the reply and is kept here, and
//! `sync` brings in the sentences other replicas started (the server runs it every
//! second), so each replica denies a banned key without a store call.
//!
//! Denials are counted per counter key with the same estimate as the default
//! algorithm (sliding window counter), so memory per key is a few words whatever
//! `violations` is. The map is sharded like the memory store and bounded
//! ([`DEFAULT_MAX_TRACKED`] keys): when a shard is full, of the keys without a
//! sentence the one whose record expires soonest goes (an expired one first); keys
//! serving a sentence are never dropped early.
//!
//!
//! Three parts: [`table`] holds the counts and sentences in process, [`hooks`] is
//! what the limiter calls before and after the store, and [`board`] encodes what a
//! sharing store keeps.
//!
//! [`Store::shares_sentences`]: crate::store::Board::shares_sentences

pub mod board;
pub mod hooks;
pub mod table;
#[cfg(test)]
mod tests;

pub use board::{decode_info, encode_info, strike, Pending};
pub use hooks::{
    apply_sentences, count_denial, deny_charges, mark_started, matched_under_override, Asked,
    Sentenced,
};
pub use table::Penalties;

use crate::algorithm::Micros;
use crate::policy::Sentence;
use crate::store::Kind;

/// Keys tracked at most, over all shards.
pub const DEFAULT_MAX_TRACKED: usize = 100_000;

/// Whose key a sentence is on: shown by `/debug/blocks` and the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanInfo {
    pub domain: String,
    /// The rule's path (the metrics label).
    pub rule: String,
    /// The display form of the key (values, hashed as in counter keys).
    pub key: String,
}

/// Who put a sentence in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A rule's `penalty`.
    Penalty,
    /// An operator, through the admin API.
    Operator,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Penalty => "penalty",
            Source::Operator => "operator",
        }
    }
}

/// A sentence in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveBan {
    pub info: BanInfo,
    pub kind: Kind,
    pub source: Source,
    /// The counter key (what Unblock takes).
    pub counter: String,
    /// When it ends (clock micros).
    pub until: Micros,
    /// How long it still lasts.
    pub remaining: Micros,
    /// A tightening's factor, in millionths (0 otherwise).
    pub factor_ppm: u32,
}

/// A sentence as the limiter acts on it before asking the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InForce {
    /// Denied outright for this long more; `blocked` when on the block list.
    Denied { left: Micros, blocked: bool },
    /// Decided against its limit scaled by this factor (millionths).
    Tightened { factor_ppm: u32 },
}

/// A sentence a denial started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub kind: Kind,
    pub span: Micros,
}

/// A penalty's sentence as the store names it: kind, length, factor (millionths).
pub(crate) fn parts(sentence: &Sentence) -> (Kind, Micros, u32) {
    match *sentence {
        Sentence::Ban(d) => (Kind::Ban, d, 0),
        Sentence::Tighten { factor_ppm, span } => (Kind::Tighten, span, factor_ppm),
    }
}
