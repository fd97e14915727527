//! Explain: an admin request becomes limiter input (checked as ShouldRateLimit
//! checks it), and the limiter's [`Explained`] becomes the API's message.

use crate::limiter::explain::Explained;
use crate::limiter::{Ban, Descriptor};
use crate::policy::{LevelMatch, NoMatch, Policy, Rule, Sentence};
use crate::service::decode;
use crate::service::{descriptors, headers, BadRequest, HeaderStyle};
use crate::store::Mode;

use super::pb;

/// The request's entries, owned, and how to borrow them as limiter input.
pub struct Request {
    pub domain: String,
    pub hits_addend: u32,
    entries: Vec<(String, String)>,
    shapes: Vec<(std::ops::Range<usize>, Option<u64>)>,
}

impl Request {
    pub fn from_pb(req: pb::ExplainRequest) -> Request {
        let mut entries = Vec::new();
        let mut shapes = Vec::new();
        for d in req.descriptors {
            let start = entries.len();
            entries.extend(d.entries.into_iter().map(|e| (e.key, e.value)));
            shapes.push((start..entries.len(), d.hits_addend));
        }
        Request {
            domain: req.domain,
            hits_addend: req.hits_addend,
            entries,
            shapes,
        }
    }

    /// The request as the decision path reads it.
    pub fn view(&self) -> decode::Request<'_> {
        decode::Request {
            domain: &self.domain,
            hits_addend: self.hits_addend,
            descriptors: self
                .shapes
                .iter()
                .map(|(range, hits)| decode::WireDescriptor {
                    entries: range.clone(),
                    hits_addend: *hits,
                    is_negative_hits: false,
                    limit: None,
                })
                .collect(),
            entries: self
                .entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
        }
    }
}

/// Checks `view` exactly as ShouldRateLimit does.
pub fn checked<'r>(
    view: &'r decode::Request<'_>,
) -> Result<Vec<Descriptor<'r, (&'r str, &'r str)>>, BadRequest> {
    descriptors(view)
}

/// The API's message for an explanation of `domain`'s request.
pub fn to_pb(
    domain: &str,
    entries: &[Descriptor<'_, (&str, &str)>],
    e: &Explained,
    style: HeaderStyle,
    hashed_keys: bool,
) -> pb::Explanation {
    let o = &e.outcome;
    let code = |over: bool| {
        if over {
            pb::Code::OverLimit
        } else {
            pb::Code::Ok
        }
    };
    let mut out = pb::Explanation {
        domain: domain.to_string(),
        domain_known: o.domain_known,
        overall_code: code(o.over_limit) as i32,
        descriptors: Vec::new(),
        response_headers: headers::headers(o, style)
            .into_iter()
            .map(|(k, v)| pb::Header {
                key: k.to_string(),
                value: v,
            })
            .collect(),
        store_error: o
            .failure
            .as_ref()
            .map(|f| format!("{} (failure mode {} answers)", f.error, f.mode.as_str()))
            .unwrap_or_default(),
        hashed_keys,
    };
    for ((status, detail), d) in o.statuses.iter().zip(&e.descriptors).zip(entries) {
        let mut x = pb::DescriptorExplanation {
            entries: d.entries.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            hits: status.hits,
            code: code(status.over_limit) as i32,
            counter_key: detail.counter_key.clone().unwrap_or_default(),
            ..Default::default()
        };
        if let Some(trace) = &detail.trace {
            x.levels = trace
                .levels
                .iter()
                .zip(d.entries)
                .map(|(m, (k, v))| {
                    let (kind, pattern) = match m {
                        LevelMatch::Exact => (pb::MatchKind::Exact, String::new()),
                        LevelMatch::Wildcard(p) => (pb::MatchKind::Wildcard, p.clone()),
                        LevelMatch::KeyOnly => (pb::MatchKind::KeyOnly, String::new()),
                    };
                    pb::LevelMatch {
                        key: k.to_string(),
                        value: v.to_string(),
                        kind: kind as i32,
                        pattern,
                    }
                })
                .collect();
            if let Err(why) = trace.result {
                x.no_match = no_match(why, d.entries);
            }
        } else {
            x.no_match = format!("no policy names domain '{domain}': answered OK");
        }
        let rule = o.rule(status);
        if let Some(rule) = rule {
            // A rule with several limits is shown whole, from the list's first.
            let matched = match (status.answered_by, status.rule) {
                (Some(_), Some(own)) => o.policy.rule(own),
                _ => rule,
            };
            x.rule = Some(rule_pb(&o.policy, matched, status.limit_override.is_some()));
            if status.answered_by.is_some() {
                x.nearest = Some(rule_pb(&o.policy, rule, false));
            }
        }
        if let Some(replaced) = detail.replaced {
            let name = o.policy.rule(replaced).name.clone().unwrap_or_default();
            // Among every rule the request matched, those replaced too: two limits
            // that replace each other both drop out, and each names the other.
            let by = o
                .statuses
                .iter()
                .zip(&e.descriptors)
                .filter_map(|(s, d)| o.rule(s).or(d.replaced.map(|id| o.policy.rule(id))))
                .find(|r| r.replaces.contains(&name))
                .map(|r| r.name.clone().unwrap_or_else(|| r.path.clone()))
                .unwrap_or_default();
            x.replaced_by = format!("rule '{name}' matched and is replaced by '{by}'");
        }
        if let Some(v) = status.verdict {
            // The limit the key was decided against, as the answer states it: a
            // tightened key's is its penalty's share of the rule's.
            let limit = rule.map_or(0, |r| status.requests_per_unit(r));
            x.counter = Some(pb::CounterState {
                admitted: v.admitted,
                remaining: v.remaining,
                reset_micros: v.reset,
                retry_after_micros: v.retry_after,
                banned: status.ban == Ban::Active,
                blocked: status.ban == Ban::Blocked,
                tightened: status.tightened.is_some(),
                owed: v.owed,
                limit: u64::from(limit),
            });
        }
        x.reason = reason(
            rule,
            status,
            detail.mode,
            detail.replaced.is_some(),
            o.failure.is_some() && status.verdict.is_none(),
            o.over_limit,
        );
        out.descriptors.push(x);
    }
    out
}

fn no_match(why: NoMatch, entries: &[(&str, &str)]) -> String {
    let at = |i: usize| entries.get(i).map_or(("", ""), |e| *e);
    match why {
        NoMatch::Empty => "no entries".to_string(),
        NoMatch::Key(i) => format!("no rule at level {} has key '{}'", i + 1, at(i).0),
        NoMatch::Value(i) => {
            let (k, v) = at(i);
            format!("rules with key '{k}' at level {} match no value '{v}' (no wildcard, no key-only rule)", i + 1)
        }
        NoMatch::Deeper(i) => format!(
            "the rule matched at level {} has no nested descriptors: a limit applies only to a descriptor of exactly its depth ({}), this one has {} entries",
            i + 1,
            i + 1,
            entries.len()
        ),
        NoMatch::NoLimitHere => {
            "every entry matched, but that node has no rate_limit of its own (only deeper ones)"
                .to_string()
        }
    }
}

fn reason(
    rule: Option<&Rule>,
    status: &crate::limiter::Status,
    mode: Option<Mode>,
    replaced: bool,
    failed: bool,
    denied: bool,
) -> String {
    let Some(rule) = rule else {
        return if replaced {
            "replaced: not counted".to_string()
        } else {
            "no rule: answered OK".to_string()
        };
    };
    if rule.limit.is_none() {
        return "unlimited".to_string();
    }
    if failed {
        return "store unreachable: the failure mode answers".to_string();
    }
    if status.ban == Ban::Active {
        return "banned by the rule's penalty".to_string();
    }
    if status.ban == Ban::Blocked {
        return "on the block list".to_string();
    }
    let Some(v) = status.verdict else {
        return "not decided: another descriptor's ban denies the request".to_string();
    };
    // A quota descriptor over its limit says OVER_LIMIT either way: whether the
    // request is denied tells which.
    match (mode, v.admitted, denied) {
        (_, true, _) => "within limit".to_string(),
        (Some(Mode::Shadow), false, _) => "shadow: over limit, not enforced".to_string(),
        (Some(Mode::Quota), false, true) => {
            "quota: over limit, and so is every quota descriptor of the request".to_string()
        }
        (Some(Mode::Quota), false, false) => {
            "quota: over limit, but another quota descriptor has room".to_string()
        }
        (_, false, _) => "over limit".to_string(),
    }
}

/// A rule as the API shows it, with the further limits of its `rate_limits` list
/// (their rules in `policy`).
pub fn rule_pb(policy: &Policy, rule: &Rule, from_override: bool) -> pb::Rule {
    let limit = rule.limit;
    pb::Rule {
        also: rule
            .also
            .iter()
            .map(|&id| rule_pb(policy, policy.rule(id), from_override))
            .collect(),
        path: rule.path.clone(),
        stat_key: rule.stat_key.clone(),
        name: rule.name.clone().unwrap_or_default(),
        layer: rule.layer.as_str().to_string(),
        unlimited: limit.is_none(),
        algorithm: limit
            .map(|l| match rule.lease {
                Some(_) => "concurrency".to_string(),
                None => l.algorithm.as_str().to_string(),
            })
            .unwrap_or_default(),
        requests_per_unit: u64::from(rule.requests_per_unit),
        unit: rule.unit.as_str().to_string(),
        window_micros: limit.map_or(0, |l| l.window),
        burst: limit.map_or(0, |l| l.burst),
        calendar: rule
            .calendar
            .as_ref()
            .map(|c| c.period().as_str().to_string())
            .unwrap_or_default(),
        time_zone: rule
            .calendar
            .as_ref()
            .map(|c| c.zone_name().to_string())
            .unwrap_or_default(),
        shadow_mode: rule.shadow_mode,
        quota_mode: rule.quota_mode,
        replaces: rule.replaces.clone(),
        from_override,
        penalty: rule.penalty.map(|p| pb::Penalty {
            violations: p.violations,
            within_micros: p.within,
            ban_micros: match p.sentence {
                Sentence::Ban(d) => d,
                Sentence::Tighten { .. } => 0,
            },
            tighten: match p.sentence {
                Sentence::Tighten { factor_ppm, span } => Some(pb::Tighten {
                    factor: f64::from(factor_ppm) / 1e6,
                    for_micros: span,
                }),
                Sentence::Ban(_) => None,
            },
            block: p.block.map(|b| pb::BlockRule {
                bans: b.bans,
                within_micros: b.within,
                for_micros: b.span,
            }),
        }),
    }
}
