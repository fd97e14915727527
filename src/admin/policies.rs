//! ListPolicies: the loaded domains and rules, and where each document came from.

use crate::policy::Policy;

use super::explain::rule_pb;
use super::pb;

pub fn list(policy: &Policy, domain: &str) -> pb::Policies {
    let mut names: Vec<&String> = policy
        .domains
        .keys()
        .filter(|d| domain.is_empty() || d.as_str() == domain)
        .collect();
    names.sort();
    pb::Policies {
        sources: policy
            .sources
            .iter()
            .filter(|s| domain.is_empty() || s.domain == domain)
            .map(|s| pb::Source {
                source: s.source.clone(),
                domain: s.domain.clone(),
                line: s.line.map_or(0, |l| l as u32),
                resource: s.resource.clone().unwrap_or_default(),
            })
            .collect(),
        domains: names
            .into_iter()
            .map(|name| {
                let d = &policy.domains[name];
                pb::Domain {
                    name: name.clone(),
                    failure_mode: d
                        .failure_mode
                        .map_or(String::new(), |m| m.as_str().to_string()),
                    shard_by: d.shard_by.clone().unwrap_or_default(),
                    rules: d
                        .rule_ids()
                        .into_iter()
                        .map(|id| rule_pb(policy, policy.rule(id), false))
                        .collect(),
                }
            })
            .collect(),
    }
}
