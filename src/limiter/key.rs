//! Counter keys: which counter a matched descriptor touches.
//!
//! A key is `domain|key=value|key=value`, with the wildcard pattern in place of the
//! value at levels matched through `share_threshold`. Keys never carry unbounded
//! request data: a value longer than 64 bytes (or holding a separator) is replaced by
//! its keyed hash, and with `--hash-keys` every value is, so client addresses and API
//! keys are neither stored nor shown raw, nor recoverable without the secret.

use crate::hash::ValueHash;
use crate::policy::{Entry, Rule, Unit};

/// Longest value kept verbatim in a key.
pub const MAX_RAW_VALUE: usize = 64;

/// How values are written into keys: which of them are hashed, and with what key.
#[derive(Debug, Clone, Copy)]
pub struct Hashing {
    /// Hash every value (`--hash-keys`), not only long or unsafe ones.
    pub all: bool,
    pub hash: ValueHash,
}

impl Default for Hashing {
    /// Long values only, under a key of this process.
    fn default() -> Self {
        Hashing {
            all: false,
            hash: ValueHash::random(),
        }
    }
}

/// Writes the counter key of `rule` matched by `entries` into `out`.
pub fn counter_key<E: Entry>(
    domain: &str,
    rule: &Rule,
    entries: &[E],
    hashing: &Hashing,
    out: &mut String,
) {
    out.clear();
    push_name(out, domain, hashing);
    for (i, entry) in entries.iter().enumerate() {
        out.push('|');
        push_name(out, entry.key(), hashing);
        out.push('=');
        match rule.shared.get(i).and_then(|s| s.as_deref()) {
            Some(pattern) => push_value(out, pattern, hashing),
            None => push_value(out, entry.value(), hashing),
        }
    }
}

/// Writes the counter key of a descriptor's `limit` override into `out`: the domain
/// and every entry as [`counter_key`] writes them, then `|=` and the unit, as
/// envoyproxy/ratelimit keys an override by domain, entries and unit. No configured
/// rule's key holds `|=` (entry keys are never empty), so the two never share a
/// counter.
///
/// Unlike a rule's, an override's entry keys are the request's own, matched against
/// nothing: each is written by [`push_key`], so a key holding `|` or `=` cannot pose
/// as two entries (`route=r|tenant` with `t1` as `route=r`, `tenant=t1`) and a long
/// one does not end up in the store.
pub fn override_key<E: Entry>(
    domain: &str,
    entries: &[E],
    unit: Unit,
    hashing: &Hashing,
    out: &mut String,
) {
    out.clear();
    push_name(out, domain, hashing);
    for entry in entries {
        out.push('|');
        push_key(out, entry.key(), hashing);
        out.push('=');
        push_value(out, entry.value(), hashing);
    }
    out.push_str("|=");
    out.push_str(unit.as_str());
}

/// Writes an entry key the request chose into a counter key: verbatim when it is at
/// most [`MAX_RAW_VALUE`] bytes and holds no separator and does not look like a hash
/// (a leading `#`), else its keyed hash. Keys name the descriptor's parts, not
/// clients, so `--hash-keys` leaves them as they are.
pub fn push_key(out: &mut String, key: &str, hashing: &Hashing) {
    if needs_hash(key) {
        hashing.hash.push_hex(out, key.as_bytes());
    } else {
        out.push_str(key);
    }
}

/// Writes a domain or a rule's entry key, which a policy chose, into a counter key:
/// verbatim unless it holds a separator or looks like a hash, then its keyed hash.
/// Domain `shop|tenant=acme` with key `path` would otherwise count on domain
/// `shop`'s counter for `tenant=acme`, `path`: another namespace's. Names of any
/// length stay verbatim, so no counter of an existing policy moves.
fn push_name(out: &mut String, name: &str, hashing: &Hashing) {
    // Bytes, not chars: both separators are ASCII, and this runs for every entry.
    let hashed = name.bytes().any(|b| b == b'|' || b == b'=')
        || (name.len() == HASHED_LEN && name.starts_with('#'));
    if hashed {
        hashing.hash.push_hex(out, name.as_bytes());
    } else {
        out.push_str(name);
    }
}

/// Whether a key or value must be hashed to keep counter keys apart: it holds a
/// separator, is longer than [`MAX_RAW_VALUE`], or could be taken for a hash
/// ([`ValueHash::push_hex`] writes `#` and 32 hex digits).
fn needs_hash(text: &str) -> bool {
    text.len() > MAX_RAW_VALUE
        || text.contains(['|', '='])
        || (text.len() == HASHED_LEN && text.starts_with('#'))
}

/// Length of a hashed value: `#` and 32 hex digits.
const HASHED_LEN: usize = 33;

/// Appends to a rule's counter key the window of one of its further limits
/// (`rate_limits`): `|~60s` (`|~1500ms`, `|~7us` when not whole). The first limit of
/// the list keeps the rule's plain key, so turning a `rate_limit` into a list keeps
/// its counter. The part after the last `|` of any other key holds a `=` (values
/// holding `|` are hashed), this one's never does, so the further counters never
/// meet another rule's.
pub fn push_window(out: &mut String, rule: &Rule) {
    const MS: u64 = 1_000;
    if let Some(c) = &rule.calendar {
        // `|~calendar_day@Europe/Berlin`: the same counter every day and month,
        // whatever each one's length.
        out.push_str("|~");
        out.push_str(c.period().as_str());
        out.push('@');
        out.push_str(c.zone_name());
        return;
    }
    let Some(limit) = rule.limit else { return };
    let w = limit.window;
    let (n, unit) = if w.is_multiple_of(crate::algorithm::SECOND) {
        (w / crate::algorithm::SECOND, "s")
    } else if w.is_multiple_of(MS) {
        (w / MS, "ms")
    } else {
        (w, "us")
    };
    out.push_str("|~");
    out.push_str(itoa::Buffer::new().format(n));
    out.push_str(unit);
}

/// The key the top-offenders view and penalty bans show for a matched descriptor:
/// its values joined by `|` (the pattern at `share_threshold` levels), each written
/// by [`push_value`], so `--hash-keys` shows hashes and long values are hashed.
pub fn offender<E: Entry>(rule: &Rule, entries: &[E], hashing: &Hashing, out: &mut String) {
    out.clear();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        match rule.shared.get(i).and_then(|s| s.as_deref()) {
            Some(pattern) => push_value(out, pattern, hashing),
            None => push_value(out, entry.value(), hashing),
        }
    }
}

/// The display form of a value for keys and the top-offenders view.
pub fn push_value(out: &mut String, value: &str, hashing: &Hashing) {
    if hashing.all || needs_hash(value) {
        hashing.hash.push_hex(out, value.as_bytes());
    } else {
        out.push_str(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Layer;

    const SECRET: &[u8] = b"a test secret of many bytes";

    fn long_only() -> Hashing {
        Hashing {
            all: false,
            hash: ValueHash::from_secret(SECRET).unwrap(),
        }
    }

    fn every_value() -> Hashing {
        Hashing {
            all: true,
            ..long_only()
        }
    }

    fn rule(shared: Vec<Option<String>>) -> Rule {
        Rule {
            id: 0,
            path: "a/b".into(),
            name: None,
            limit: None,
            requests_per_unit: 1,
            unit: Unit::Second,
            replaces: vec![],
            shadow_mode: false,
            global_shadow: false,
            quota_mode: false,
            layer: Layer::Service,
            penalty: None,
            shed: None,
            sensitive: false,
            metadata: None,
            shared,
            rendered: Default::default(),
            also: Vec::new(),
            calendar: None,
            lease: None,
            stat_key: String::new(),
        }
    }

    #[test]
    fn override_keys_name_the_unit_apart_from_rule_keys() {
        let entries = [("route", "r"), ("tenant", "t1")];
        let mut k = String::new();
        override_key("edge", &entries, Unit::Minute, &long_only(), &mut k);
        assert_eq!(k, "edge|route=r|tenant=t1|=minute");
        let mut rule_key = String::new();
        counter_key(
            "edge",
            &rule(vec![None, None]),
            &entries,
            &long_only(),
            &mut rule_key,
        );
        assert!(k.starts_with(&rule_key) && k != rule_key);
        let mut hashed = String::new();
        override_key("edge", &entries, Unit::Minute, &every_value(), &mut hashed);
        assert!(
            !hashed.contains("t1") && hashed.ends_with("|=minute"),
            "{hashed}"
        );
    }

    #[test]
    fn override_keys_keep_entries_apart_whatever_the_request_names_them() {
        let mut honest = String::new();
        override_key(
            "edge",
            &[("route", "r"), ("tenant", "t1")],
            Unit::Year,
            &long_only(),
            &mut honest,
        );
        // One entry whose key holds a separator, posing as the two above.
        let mut forged = String::new();
        override_key(
            "edge",
            &[("route=r|tenant", "t1")],
            Unit::Year,
            &long_only(),
            &mut forged,
        );
        assert_ne!(honest, forged);
        assert!(
            forged.starts_with("edge|#") && forged.ends_with("=t1|=year"),
            "{forged}"
        );
        // A long key is stored as its hash, not verbatim.
        let long = "k".repeat(60_000);
        override_key(
            "edge",
            &[(long.as_str(), "v")],
            Unit::Year,
            &long_only(),
            &mut forged,
        );
        assert_eq!(forged.len(), "edge|=v|=year".len() + 33, "{forged}");
        // A key or value that looks like a hash is hashed too, so no raw text can
        // stand for another's hash.
        let mut hashed = String::new();
        override_key(
            "edge",
            &[(long.as_str(), "v")],
            Unit::Year,
            &long_only(),
            &mut hashed,
        );
        let posing = &hashed["edge|".len().."edge|".len() + 33];
        override_key(
            "edge",
            &[(posing, "v")],
            Unit::Year,
            &long_only(),
            &mut forged,
        );
        assert_ne!(forged, hashed);
        // Ordinary keys are written as before: a rolling upgrade keeps the counters.
        override_key(
            "edge",
            &[("route", "r"), ("tenant", "t1")],
            Unit::Year,
            &every_value(),
            &mut forged,
        );
        assert!(forged.starts_with("edge|route=#"), "{forged}");
    }

    /// Distinct requests never share a counter: over values and request keys with
    /// separators, newlines, `#`, hash look-alikes (each value's own hash among
    /// them) and lengths either side of [`MAX_RAW_VALUE`], a rule's counter keys
    /// and override keys are one-to-one, with every value raw or hashed.
    #[test]
    fn distinct_values_and_override_entries_never_share_a_counter() {
        use proptest::prelude::*;
        use std::collections::HashMap;
        // Mostly short strings of separators, so that pairs posing as each other
        // (`a`, `=b` and `a=`, `b`) turn up in one batch.
        let text = || {
            prop_oneof![
                6 => "[a|=]{0,3}",
                1 => "[#\n.~]{0,2}",
                1 => "[ab]{63,66}",
                1 => "#[0-9a-f]{32}",
            ]
        };
        let units = [Unit::Second, Unit::Minute, Unit::Year];
        let mut runner = proptest::test_runner::TestRunner::default();
        let batch = proptest::collection::vec(
            (
                proptest::collection::vec((text(), text()), 1..3),
                0..units.len(),
            ),
            1..48,
        );
        runner
            .run(&batch, |batch| {
                for hashing in [long_only(), every_value()] {
                    // Each value's own hash, posing as a raw value.
                    let mut requests = batch.clone();
                    for (entries, unit) in &batch {
                        let mut hashed = entries.clone();
                        for (k, v) in &mut hashed {
                            let mut h = String::new();
                            hashing.hash.push_hex(&mut h, v.as_bytes());
                            *v = h;
                            h = String::new();
                            hashing.hash.push_hex(&mut h, k.as_bytes());
                            *k = h;
                        }
                        requests.push((hashed, *unit));
                    }
                    let mut rule_keys: HashMap<String, Vec<String>> = HashMap::new();
                    let mut override_keys: HashMap<String, (Vec<(String, String)>, usize)> =
                        HashMap::new();
                    let mut k = String::new();
                    for (entries, unit) in requests {
                        // A rule's levels: the entries' keys are the rule's.
                        let values: Vec<String> = entries.iter().map(|e| e.1.clone()).collect();
                        let as_rule: Vec<(&str, &str)> = values
                            .iter()
                            .enumerate()
                            .map(|(i, v)| (["k0", "k1", "k2"][i], v.as_str()))
                            .collect();
                        counter_key(
                            "d",
                            &rule(vec![None; as_rule.len()]),
                            &as_rule,
                            &hashing,
                            &mut k,
                        );
                        if let Some(other) = rule_keys.insert(k.clone(), values.clone()) {
                            prop_assert_eq!(&other, &values, "one counter: {}", k);
                        }
                        override_key("d", &entries, units[unit], &hashing, &mut k);
                        let this = (entries, unit);
                        if let Some(other) = override_keys.insert(k.clone(), this.clone()) {
                            prop_assert_eq!(&other, &this, "one counter: {}", k);
                        }
                    }
                }
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn key_names_domain_keys_and_values() {
        let mut k = String::new();
        counter_key(
            "edge",
            &rule(vec![None, None]),
            &[("a", "1"), ("b", "2")],
            &long_only(),
            &mut k,
        );
        assert_eq!(k, "edge|a=1|b=2");
    }

    /// A domain or key holding a separator cannot pose as another domain's entries:
    /// `shop|tenant=acme` with `path=/x` and `shop` with `tenant=acme`, `path=/x`
    /// count apart.
    #[test]
    fn domains_and_keys_with_separators_get_counters_of_their_own() {
        let key = |domain: &str, entries: &[(&str, &str)]| {
            let mut k = String::new();
            let r = rule(vec![None; entries.len()]);
            counter_key(domain, &r, entries, &long_only(), &mut k);
            k
        };
        let victim = key("shop", &[("tenant", "acme"), ("path", "/x")]);
        assert_eq!(victim, "shop|tenant=acme|path=/x");
        let by_domain = key("shop|tenant=acme", &[("path", "/x")]);
        let by_key = key("shop", &[("tenant=acme|path", "/x")]);
        let by_both = key("shop|tenant", &[("acme|path", "/x")]);
        for other in [&by_domain, &by_key, &by_both] {
            assert_ne!(other, &victim);
            assert!(!victim.starts_with(other.as_str()), "{other}");
        }
        assert_eq!(by_domain.matches('|').count(), 1, "{by_domain}");
        // A name that looks like a hash is hashed too, so it cannot pose as one.
        let hashed = key("shop|x", &[("k", "v")]);
        let lookalike = &hashed[..HASHED_LEN];
        assert_ne!(key(lookalike, &[("k", "v")]), hashed);
    }

    #[test]
    fn shared_levels_use_the_pattern() {
        let mut k = String::new();
        let r = rule(vec![Some("files/*".into())]);
        counter_key("d", &r, &[("a", "files/x")], &long_only(), &mut k);
        let mut k2 = String::new();
        counter_key("d", &r, &[("a", "files/y")], &long_only(), &mut k2);
        assert_eq!(k, "d|a=files/*");
        assert_eq!(k, k2);
    }

    #[test]
    fn long_and_separator_values_are_hashed() {
        let long = "x".repeat(65);
        let mut k = String::new();
        counter_key(
            "d",
            &rule(vec![None]),
            &[("a", long.as_str())],
            &long_only(),
            &mut k,
        );
        assert!(!k.contains(&long));
        assert_eq!(k.len(), "d|a=#".len() + 32, "{k}");
        counter_key(
            "d",
            &rule(vec![None]),
            &[("a", "p|b=c")],
            &long_only(),
            &mut k,
        );
        assert!(!k.contains("p|b"), "{k}");
    }

    #[test]
    fn offender_shows_values_or_their_hashes() {
        let mut k = String::new();
        let r = rule(vec![None, Some("files/*".into())]);
        offender(
            &r,
            &[("ip", "10.0.0.1"), ("f", "files/x")],
            &long_only(),
            &mut k,
        );
        assert_eq!(k, "10.0.0.1|files/*");
        offender(
            &r,
            &[("ip", "10.0.0.1"), ("f", "files/x")],
            &every_value(),
            &mut k,
        );
        assert!(!k.contains("10.0.0.1"), "{k}");
        assert!(k.starts_with('#'), "{k}");
    }

    #[test]
    fn hash_all_hides_every_value_but_stays_stable() {
        let mut k = String::new();
        counter_key(
            "d",
            &rule(vec![None]),
            &[("ip", "10.0.0.1")],
            &every_value(),
            &mut k,
        );
        assert!(!k.contains("10.0.0.1"));
        let mut k2 = String::new();
        counter_key(
            "d",
            &rule(vec![None]),
            &[("ip", "10.0.0.1")],
            &every_value(),
            &mut k2,
        );
        assert_eq!(k, k2);
    }

    #[test]
    fn another_secret_gives_other_keys() {
        let other = Hashing {
            all: true,
            hash: ValueHash::from_secret(b"another secret, also long").unwrap(),
        };
        let (mut a, mut b) = (String::new(), String::new());
        counter_key(
            "d",
            &rule(vec![None]),
            &[("ip", "10.0.0.1")],
            &every_value(),
            &mut a,
        );
        counter_key(
            "d",
            &rule(vec![None]),
            &[("ip", "10.0.0.1")],
            &other,
            &mut b,
        );
        assert_ne!(a, b);
        assert!(
            a.starts_with("d|ip=#") && b.starts_with("d|ip=#"),
            "{a} {b}"
        );
    }
}
