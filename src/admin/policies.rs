//! ListPolicies: the loaded domains and rules, where each document came from and
//! whether it is what its source holds now (the same status as `/debug/policies`).

use crate::policy::{Policy, SourceInfo};
use crate::source::hub::{self, Acceptance, Standing, Status};

use super::explain::rule_pb;
use super::pb;

pub fn list(policy: &Policy, status: &Status, domain: &str) -> pb::Policies {
    let mut names: Vec<&String> = policy
        .domains
        .keys()
        .filter(|d| domain.is_empty() || d.as_str() == domain)
        .collect();
    names.sort();
    let mut sources: Vec<pb::Source> = policy
        .sources
        .iter()
        .filter(|s| domain.is_empty() || s.domain == domain)
        .map(|s| {
            let (state, error) = source_status(s, status);
            pb::Source {
                source: s.source.clone(),
                domain: s.domain.clone(),
                line: s.line.map_or(0, |l| l as u32),
                resource: s.resource.clone().unwrap_or_default(),
                status: state.to_string(),
                error,
            }
        })
        .collect();
    // RateLimitPolicies serving nothing (Conflicted, or Invalid with no last good
    // version here) are listed too, with why.
    for (key, outcome) in status.outcomes.iter() {
        let named = outcome.domain.as_deref().unwrap_or_default();
        if policy.sources.iter().any(|s| &s.source == key)
            || !(domain.is_empty() || named == domain)
        {
            continue;
        }
        let (state, error) = verdict_status("refused", &outcome.verdict);
        sources.push(pb::Source {
            source: key.clone(),
            domain: named.to_string(),
            line: 0,
            resource: key.clone(),
            status: state.to_string(),
            error,
        });
    }
    pb::Policies {
        sources,
        refused: status
            .refused
            .iter()
            .map(|(source, error)| pb::Refusal {
                source: source.to_string(),
                error: error.clone(),
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

/// A serving document's status and why: `loaded`, or `last_good` when its source's
/// latest change was refused or its RateLimitPolicy is not Accepted.
fn source_status(source: &SourceInfo, status: &Status) -> (&'static str, String) {
    match hub::standing(source, status) {
        Standing::Loaded => ("loaded", String::new()),
        Standing::Refused(error) => ("last_good", error.to_string()),
        Standing::Verdict(verdict) => verdict_status("last_good", verdict),
    }
}

/// A RateLimitPolicy's status: `loaded` when Accepted, else `unaccepted` with its
/// `Accepted` condition's reason and message.
fn verdict_status(unaccepted: &'static str, verdict: &Acceptance) -> (&'static str, String) {
    match verdict {
        Acceptance::Accepted => ("loaded", String::new()),
        Acceptance::Invalid(m) => (unaccepted, format!("Invalid: {m}")),
        Acceptance::Conflicted(m) => (unaccepted, format!("Conflicted: {m}")),
    }
}
