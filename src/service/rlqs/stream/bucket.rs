//! A bucket id as the stream keeps it: its sorted pairs, what makes one irregular,
//! and the digest an id too large to keep is tracked under.

use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

/// A bucket's pairs sorted by key: how the stream knows it again.
pub(super) type BucketKey = Vec<(String, String)>;

/// Most bytes (keys and values) of a bucket id the stream keeps as it is. Envoy
/// builds ids from its matchers' keys and request attributes (a header of up to
/// 60 KiB), so a larger id is decided all the same, and kept as its digest.
pub const MAX_BUCKET_ID_BYTES: usize = 4096;

/// Why a bucket is answered apart from the rest of its report. Each is Envoy's
/// doing for one bucket (one request's long header, an empty header value, a
/// matcher's configuration): none ends the stream, which would take every other
/// bucket's assignment with it, at every report Envoy sends again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::service::rlqs) enum Irregular {
    /// Over [`MAX_BUCKET_ID_BYTES`]: decided against its limit, kept under a digest.
    IdTooLarge,
    /// More than [`MAX_ENTRIES`], or an empty key: no rule can match, ALLOW_ALL.
    ///
    /// [`MAX_ENTRIES`]: crate::service::MAX_ENTRIES
    TooManyEntries,
    EmptyKey,
    /// No entries (Envoy leaves out an entry whose value is empty): Envoy takes no
    /// assignment without an id, so it is left out of the answer.
    NoEntries,
}

impl Irregular {
    pub(in crate::service::rlqs) fn as_str(self) -> &'static str {
        match self {
            Irregular::IdTooLarge => "id_too_large",
            Irregular::TooManyEntries => "too_many_entries",
            Irregular::EmptyKey => "empty_key",
            Irregular::NoEntries => "no_entries",
        }
    }

    /// What the bucket gets, for the log.
    pub(in crate::service::rlqs) fn answer(self) -> &'static str {
        match self {
            Irregular::IdTooLarge => "decided against its limit, tracked under a digest of its id",
            Irregular::TooManyEntries | Irregular::EmptyKey => "ALLOW_ALL: no rule can match it",
            Irregular::NoEntries => {
                "left out of the answer: Envoy takes no assignment without an id"
            }
        }
    }
}

/// The bytes of a bucket's keys and values.
pub(super) fn id_bytes<'a>(pairs: impl IntoIterator<Item = (&'a String, &'a String)>) -> usize {
    pairs.into_iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// A hash of a bucket's sorted pairs, to tell its demand record from its
/// neighbours' under a shared counter.
pub(super) fn bucket_hash(usage: &BucketQuotaUsage) -> u64 {
    let mut bytes = Vec::new();
    for (k, v) in entries_of(usage) {
        for part in [k, v] {
            bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
            bytes.extend_from_slice(part.as_bytes());
        }
    }
    crate::hash::stable_hash(&bytes)
}

/// A bucket's sorted pairs.
fn entries_of(usage: &BucketQuotaUsage) -> BucketKey {
    let mut entries: BucketKey = usage
        .bucket_id
        .iter()
        .flat_map(|b| b.bucket.iter())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    entries.sort_unstable();
    entries
}

/// How the stream tracks a bucket id too large to keep: one entry whose key is
/// empty (no bucket kept as it is has one) and whose value is the SHA-256 of the
/// sorted pairs, each part preceded by its length so no two ids run together.
pub(super) fn digest(entries: &BucketKey) -> BucketKey {
    use std::fmt::Write;
    let mut sha = ring::digest::Context::new(&ring::digest::SHA256);
    for (k, v) in entries {
        for part in [k, v] {
            sha.update(&(part.len() as u64).to_le_bytes());
            sha.update(part.as_bytes());
        }
    }
    let mut hex = String::with_capacity(64);
    for b in sha.finish().as_ref() {
        let _ = write!(hex, "{b:02x}");
    }
    vec![(String::new(), hex)]
}
