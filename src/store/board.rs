//! Penalty sentences (bans, tightenings, the block list) held where every replica
//! sees them: a [`Board`]. The Redis store keeps them in Redis; the memory store
//! holds none (the trait's defaults) and the limiter keeps them in process.
//!
//! The store knows nothing of policies: a [`Strike`] carries the numbers of the
//! rule's `penalty`, and `info` is the caller's opaque description of the key (who
//! it is, for listings), stored beside the sentence.

use std::future::Future;

use super::StoreError;
use crate::algorithm::Micros;

/// Where penalty sentences are shared between replicas. Every store is a board; one
/// that shares nothing keeps the defaults, which count no strike and hold no
/// sentence, so the limiter keeps them in process.
pub trait Board: Send + Sync + 'static {
    /// Whether sentences live here, shared by every replica; otherwise the limiter
    /// holds them in process.
    fn shares_sentences(&self) -> bool {
        false
    }

    /// Counts a strike's denials towards its penalty; the sentence in force
    /// afterwards, if any (one this strike started, or one another replica did).
    fn strike(
        &self,
        _strike: &Strike<'_>,
    ) -> impl Future<Output = Result<Option<Sentenced>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// Puts `sentence` in force for its `remaining` (an operator's block).
    fn sentence(
        &self,
        _sentence: &Sentenced,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// Lifts the sentence of `key`, and its counts; whether there was one.
    fn pardon(&self, _key: &str) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async { Ok(false) }
    }

    /// Every sentence in force.
    fn sentences(&self) -> impl Future<Output = Result<Vec<Sentenced>, StoreError>> + Send {
        async { Ok(Vec::new()) }
    }
}

/// A shared board is a board.
impl<B: Board> Board for std::sync::Arc<B> {
    fn shares_sentences(&self) -> bool {
        (**self).shares_sentences()
    }

    fn strike(
        &self,
        strike: &Strike<'_>,
    ) -> impl Future<Output = Result<Option<Sentenced>, StoreError>> + Send {
        (**self).strike(strike)
    }

    fn sentence(
        &self,
        sentence: &Sentenced,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).sentence(sentence)
    }

    fn pardon(&self, key: &str) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).pardon(key)
    }

    fn sentences(&self) -> impl Future<Output = Result<Vec<Sentenced>, StoreError>> + Send {
        (**self).sentences()
    }
}

/// What a sentence does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Denied outright: a penalty's `ban`.
    Ban,
    /// The key's limit scaled down: a penalty's `tighten`.
    Tighten,
    /// Denied outright and on the block list: a penalty's `block`, or an operator's.
    Block,
}

impl Kind {
    /// The name `/debug/blocks` and the admin API show.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Ban => "ban",
            Kind::Tighten => "tighten",
            Kind::Block => "block",
        }
    }

    /// One letter, as the Redis board stores it.
    pub fn code(self) -> &'static str {
        match self {
            Kind::Ban => "b",
            Kind::Tighten => "t",
            Kind::Block => "k",
        }
    }

    pub fn from_code(code: &str) -> Option<Kind> {
        match code {
            "b" => Some(Kind::Ban),
            "t" => Some(Kind::Tighten),
            "k" => Some(Kind::Block),
            _ => None,
        }
    }

    /// Whether the key is denied without asking for its counter.
    pub fn denies(self) -> bool {
        self != Kind::Tighten
    }
}

/// Denials of a key whose rule has a penalty, counted in one step.
#[derive(Debug, Clone, Copy)]
pub struct Strike<'a> {
    /// The counter key.
    pub key: &'a str,
    /// How many: one request's, or those an RLQS report carries.
    pub denials: u64,
    pub violations: u64,
    pub within: Micros,
    /// [`Kind::Ban`] or [`Kind::Tighten`].
    pub kind: Kind,
    /// How long the ban or tightening lasts.
    pub span: Micros,
    /// A tightening's factor, in millionths.
    pub factor_ppm: u32,
    /// `block`: (bans, within, for).
    pub block: Option<(u64, Micros, Micros)>,
    /// Stored with a sentence this strike starts.
    pub info: &'a str,
}

/// A sentence in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sentenced {
    /// The counter key.
    pub key: String,
    pub kind: Kind,
    /// How long it still lasts.
    pub remaining: Micros,
    /// A tightening's factor, in millionths (0 otherwise).
    pub factor_ppm: u32,
    /// What the caller stored with it.
    pub info: String,
    /// Whether the strike that returned it started it.
    pub started: bool,
}
