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

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
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
}
