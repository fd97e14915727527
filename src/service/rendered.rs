//! The parts of an answer that depend on the rule alone, written once when a policy
//! is compiled: each answer then copies them instead of encoding and formatting them
//! again (a layered request's three statuses and its headers did so on every call).

use crate::policy::Rule;

use super::{headers, response};

/// A rule's constant answer parts; empty for a rule without a limit, which reports
/// neither.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rendered {
    /// The `current_limit` message's fields, encoded, without its own key and length.
    pub current_limit: Box<[u8]>,
    /// The value of `x-ratelimit-limit` (`--response-headers draft03`).
    pub draft03_limit: Box<str>,
    /// The rule's name as an IETF header quotes it, quotes included.
    pub ietf_name: Box<str>,
    /// The value of `ratelimit-policy` (`--response-headers ietf`).
    pub ietf_policy: Box<str>,
}

/// Renders `rule`'s constant parts.
pub fn render(rule: &Rule) -> Rendered {
    let Some(limit) = rule.limit else {
        return Rendered::default();
    };
    let ietf_name = headers::ietf_name(rule);
    Rendered {
        current_limit: response::current_limit_fields(rule).into(),
        draft03_limit: headers::draft03_limit(rule, &limit).into(),
        ietf_policy: headers::ietf_policy(&ietf_name, rule, &limit).into(),
        ietf_name: ietf_name.into(),
    }
}
