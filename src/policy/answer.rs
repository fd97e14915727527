//! The parts of an answer that depend on the rule alone, written once when a policy
//! is compiled: each answer then copies them instead of encoding and formatting them
//! again (a layered request's three statuses and its headers would otherwise do so on
//! every call). The service reads them; it writes the per-request parts itself.

use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as ProtoUnit, RateLimit,
};
use prost::Message;

use crate::algorithm::{Limit, SECOND};

use super::{Rule, Unit};

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
    let ietf_name = ietf_name(rule);
    let rpu = rule.requests_per_unit;
    let mut draft03 = String::new();
    push_draft03_limit(&mut draft03, rule, rpu, &limit);
    let mut policy = String::new();
    push_ietf_policy(&mut policy, &ietf_name, rpu, &limit);
    Rendered {
        current_limit: current_limit(rule, rpu).encode_to_vec().into(),
        draft03_limit: draft03.into(),
        ietf_policy: policy.into(),
        ietf_name: ietf_name.into(),
    }
}

/// `rule`'s `current_limit` as Envoy's message, with `requests_per_unit`: its own,
/// or a tightened key's share of it.
pub fn current_limit(rule: &Rule, requests_per_unit: u32) -> RateLimit {
    RateLimit {
        name: rule.name.clone().unwrap_or_default(),
        requests_per_unit,
        unit: proto_unit(rule.unit) as i32,
    }
}

/// `rule`'s requests per unit scaled by a tightening's factor (millionths), as the
/// tightened key is decided ([`super::tightened`]).
pub fn tightened_requests(rule: &Rule, factor_ppm: u32) -> u32 {
    let scaled = super::tightened(u64::from(rule.requests_per_unit), factor_ppm);
    u32::try_from(scaled).unwrap_or(u32::MAX)
}

/// `rule`'s `current_limit.unit`, as Envoy's enum value.
pub fn unit_value(rule: &Rule) -> i32 {
    proto_unit(rule.unit) as i32
}

fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Unknown => ProtoUnit::Unknown,
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

/// The window in whole seconds, rounded up, as the headers state it.
fn window_secs(limit: &Limit) -> u64 {
    limit.window.div_ceil(SECOND)
}

/// Writes `x-ratelimit-limit`'s value for `rule` with `rpu` requests per unit (its
/// own, or a tightened key's) onto `s`: "{rpu}, {rpu};w={window}", then
/// ";name=\"{name}\"" when the rule is named.
pub fn push_draft03_limit(s: &mut String, rule: &Rule, rpu: u32, limit: &Limit) {
    let mut n = itoa::Buffer::new();
    let rpu = n.format(rpu);
    s.push_str(rpu);
    s.push_str(", ");
    s.push_str(rpu);
    s.push_str(";w=");
    s.push_str(itoa::Buffer::new().format(window_secs(limit)));
    if let Some(name) = &rule.name {
        s.push_str(";name=\"");
        push_sf_escaped(s, name);
        s.push('"');
    }
}

/// The name IETF headers give `rule` (its `name`, else its path), quoted.
fn ietf_name(rule: &Rule) -> String {
    let mut s = String::from('"');
    push_sf_escaped(&mut s, rule.name.as_deref().unwrap_or(&rule.path));
    s.push('"');
    s
}

/// Writes `ratelimit-policy`'s value with `rpu` requests per unit (a rule's own, or a
/// tightened key's) onto `s`: "{ietf_name};q={rpu};w={window}".
pub fn push_ietf_policy(s: &mut String, ietf_name: &str, rpu: u32, limit: &Limit) {
    s.push_str(ietf_name);
    s.push_str(";q=");
    s.push_str(itoa::Buffer::new().format(rpu));
    s.push_str(";w=");
    s.push_str(itoa::Buffer::new().format(window_secs(limit)));
}

/// A structured-field string (RFC 8941) holds printable ASCII only, with `"` and
/// `\` escaped. Any other byte of `s` (a control character, UTF-8) is written as
/// `%XX`, and so is `%`: a name or descriptor value with a line break in it would
/// otherwise end the header and start another on the client's response.
fn push_sf_escaped(out: &mut String, s: &str) {
    for b in s.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(char::from(b));
            }
            b'%' => out.push_str("%25"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xf)]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
    use prost::Message;

    use crate::policy::Policy;

    const POLICY: &str = r#"
domain: d
descriptors:
  - key: named
    rate_limit: {unit: hour, requests_per_unit: 300, name: "a \"quoted\" \\ name"}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 7}
  - key: free
    rate_limit: {unlimited: true}
"#;

    fn rule<'p>(policy: &'p Policy, path: &str) -> &'p crate::policy::Rule {
        policy
            .rules
            .iter()
            .find(|r| r.path == path)
            .unwrap_or_else(|| panic!("no rule {path}"))
    }

    #[test]
    fn each_rule_is_rendered_as_its_answers_report_it() {
        let docs = crate::policy::parse_str("p.yaml", POLICY).expect("parses");
        let policy = crate::policy::compile(docs).expect("compiles");

        let named = &rule(&policy, "named").rendered;
        assert_eq!(
            RateLimit::decode(&named.current_limit[..]).expect("decodes"),
            RateLimit {
                name: "a \"quoted\" \\ name".into(),
                requests_per_unit: 300,
                unit: 3, // HOUR
            }
        );
        assert_eq!(
            &*named.draft03_limit,
            r#"300, 300;w=3600;name="a \"quoted\" \\ name""#
        );
        assert_eq!(&*named.ietf_name, r#""a \"quoted\" \\ name""#);
        assert_eq!(
            &*named.ietf_policy,
            r#""a \"quoted\" \\ name";q=300;w=3600"#
        );

        // Unnamed: no name in current_limit or x-ratelimit-limit; IETF names it by path.
        let nested = &rule(&policy, "tenant/path").rendered;
        assert_eq!(
            RateLimit::decode(&nested.current_limit[..]).expect("decodes"),
            RateLimit {
                name: String::new(),
                requests_per_unit: 7,
                unit: 1, // SECOND
            }
        );
        assert_eq!(&*nested.draft03_limit, "7, 7;w=1");
        assert_eq!(&*nested.ietf_policy, r#""tenant/path";q=7;w=1"#);

        // Unlimited rules report no limit, so nothing is rendered.
        assert_eq!(rule(&policy, "free").rendered, Default::default());
    }

    #[test]
    fn quotes_and_backslashes_are_escaped() {
        for name in ["", "plain", "a\"b", "back\\slash", "\"\\\""] {
            let mut s = String::new();
            super::push_sf_escaped(&mut s, name);
            assert_eq!(s, name.replace('\\', "\\\\").replace('"', "\\\""));
        }
    }

    /// A name cannot end the header it is in: line breaks and every byte a
    /// structured-field string may not hold are percent-encoded.
    #[test]
    fn control_characters_and_utf8_are_percent_encoded() {
        for (name, want) in [
            ("x\r\nset-cookie: a=b", "x%0D%0Aset-cookie: a=b"),
            ("tab\there", "tab%09here"),
            ("é\"", "%C3%A9\\\""),
            ("100%", "100%25"),
            ("del\u{7f}", "del%7F"),
        ] {
            let mut s = String::new();
            super::push_sf_escaped(&mut s, name);
            assert_eq!(s, want, "{name:?}");
            assert!(s.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{s}");
        }
    }
}
