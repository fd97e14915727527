//! What a sharing store ([`crate::store::Board`]) keeps of a penalty: the key's
//! description beside a sentence, and a denial to count there.

use super::{parts, BanInfo, Source};
use crate::policy::Penalty;
use crate::store::Strike;

/// The `info` a sharing store keeps beside a sentence: who the key is and who
/// sentenced it, as a JSON array.
pub fn encode_info(info: &BanInfo, source: Source) -> String {
    serde_json::json!([info.domain, info.rule, info.key, source.as_str()]).to_string()
}

pub fn decode_info(text: &str) -> (BanInfo, Source) {
    let parts: Vec<String> = serde_json::from_str(text).unwrap_or_default();
    let part = |i: usize| parts.get(i).cloned().unwrap_or_default();
    let source = if part(3) == "operator" {
        Source::Operator
    } else {
        Source::Penalty
    };
    (
        BanInfo {
            domain: part(0),
            rule: part(1),
            key: part(2),
        },
        source,
    )
}

/// A denial to count in a sharing store, built while the outcome is settled and
/// sent after.
#[derive(Debug)]
pub struct Pending {
    pub status: usize,
    pub key: String,
    pub penalty: Penalty,
    /// Counted here to `violations` already (a tightened key): the store's count
    /// is reached with this one denial.
    pub reached: bool,
    pub info: String,
}

impl Pending {
    pub fn strike(&self) -> Strike<'_> {
        strike(&self.key, &self.penalty, &self.info, 1, self.reached)
    }
}

/// `denials` of `key` to count towards `penalty` in a sharing store, `info`
/// stored with a sentence they start. `reached`: counted here to `violations`
/// already, so the store's count is reached with these.
pub fn strike<'a>(
    key: &'a str,
    penalty: &Penalty,
    info: &'a str,
    denials: u64,
    reached: bool,
) -> Strike<'a> {
    let (kind, span, factor_ppm) = parts(&penalty.sentence);
    Strike {
        key,
        denials,
        violations: if reached {
            1
        } else {
            penalty.violations.max(1)
        },
        within: penalty.within.max(1),
        kind,
        span,
        factor_ppm,
        block: penalty
            .block
            .map(|b| (b.bans.max(1), b.within.max(1), b.span)),
        info,
    }
}
