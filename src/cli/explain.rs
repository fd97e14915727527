//! `sluice explain`: what the server would answer for one request, and why, without
//! spending anything; from a running server's admin API (`--server`), or from
//! policy files alone (`--config`, every counter fresh).

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use clap::Args;
use serde_json::{json, Value};

use super::connect::{connect, unanswered_in_time, ConnectArgs, ConnectError, ANSWER_WAIT};
use crate::admin::pb;
use crate::clock::SystemClock;
use crate::limiter::{Limiter, Settings};
use crate::service::{HeaderStyle, Service};
use crate::store::MemoryStore;
use crate::telemetry::printable::printable;
use crate::telemetry::Metrics;

/// `sluice explain` settings.
#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The request's domain.
    #[arg(long)]
    pub domain: String,
    /// The descriptor's entries as key=value, in order; a lone `+` starts another
    /// descriptor of the same request.
    #[arg(required = true, value_name = "KEY=VALUE")]
    pub entries: Vec<String>,
    /// The request's hits_addend (0 or absent: 1).
    #[arg(long, default_value_t = 0)]
    pub hits: u32,
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Explain against these policy files alone (fresh counters), not a server.
    #[arg(long)]
    pub config: Vec<PathBuf>,
    /// Print the explanation as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Why `sluice explain` could not explain.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("'{0}' is not KEY=VALUE")]
    Entry(String),
    #[error("descriptor {0} has no entries: a lone '+' goes between KEY=VALUE entries")]
    EmptyDescriptor(usize),
    #[error("{0}")]
    Policy(String),
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("the admin API answered: {0}")]
    Call(String),
}

/// The request the arguments spell.
pub fn request(args: &ExplainArgs) -> Result<pb::ExplainRequest, ExplainError> {
    let mut descriptors = vec![pb::RequestDescriptor::default()];
    for e in &args.entries {
        if e == "+" {
            descriptors.push(pb::RequestDescriptor::default());
            continue;
        }
        let (key, value) = e
            .split_once('=')
            .ok_or_else(|| ExplainError::Entry(e.clone()))?;
        let last = descriptors.last_mut().expect("at least one");
        last.entries.push(pb::request_descriptor::Entry {
            key: key.to_string(),
            value: value.to_string(),
        });
    }
    if let Some(i) = descriptors.iter().position(|d| d.entries.is_empty()) {
        return Err(ExplainError::EmptyDescriptor(i + 1));
    }
    Ok(pb::ExplainRequest {
        domain: args.domain.clone(),
        descriptors,
        hits_addend: args.hits,
    })
}

/// Explains as the arguments say.
/// The explanation, and (from a server) what its policy stands on when a change to
/// it was refused: [`standing`]'s warnings, for stderr.
pub async fn run(args: &ExplainArgs) -> Result<(pb::Explanation, Vec<String>), ExplainError> {
    let req = request(args)?;
    if args.config.is_empty() {
        remote(args, req).await
    } else {
        Ok((local(&args.config, req).await?, Vec::new()))
    }
}

/// One warning per source whose latest change was refused (its last good documents
/// answer), and per document of the listing that is not `loaded` for a reason of
/// its own (a RateLimitPolicy not Accepted): what the explanation was decided by
/// is not what was last written. Empty when everything loaded.
pub fn standing(p: &pb::Policies) -> Vec<String> {
    let mut out: Vec<String> = p
        .refused
        .iter()
        .map(|r| {
            format!(
                "the server refused the latest change of its {} policies, and answers by their last good version: {}",
                printable(&r.source),
                printable(&r.error)
            )
        })
        .collect();
    for s in &p.sources {
        if s.status == "loaded" || s.status.is_empty() {
            continue;
        }
        if p.refused.iter().any(|r| r.error == s.error) {
            continue;
        }
        let what = if s.status == "refused" {
            "is refused and serves nothing"
        } else {
            "serves its last good version"
        };
        out.push(format!(
            "{} (domain {}) {what}: {}",
            printable(&s.source),
            printable(&s.domain),
            printable(&s.error)
        ));
    }
    out
}

async fn local(
    paths: &[PathBuf],
    req: pb::ExplainRequest,
) -> Result<pb::Explanation, ExplainError> {
    use crate::policy::{DirFiles, Snapshot};
    let snapshot = Snapshot::read(paths, DirFiles::Yaml);
    // The wrong directory would explain every request as answered OK by no rule,
    // as `sluice validate` and `serve` refuse it.
    if snapshot.has_no_file() {
        let mut why = snapshot.notes().to_vec();
        why.push("no policy file to explain against".to_string());
        return Err(ExplainError::Policy(why.join("\n")));
    }
    let (policy, _) = snapshot.load().map_err(|errors| {
        ExplainError::Policy(
            errors
                .iter()
                .map(|e| printable(&e.to_string()).into_owned())
                .collect::<Vec<_>>()
                .join("\n"),
        )
    })?;
    let store = MemoryStore::new(Arc::new(SystemClock), 1000);
    let limiter = Limiter::new(
        Arc::new(ArcSwap::from_pointee(policy)),
        store,
        Settings::default(),
    );
    let service = Service::new(limiter, HeaderStyle::Draft03, Arc::new(Metrics::new()));
    crate::admin::explain_with(&service, req, HeaderStyle::Draft03)
        .await
        .map_err(|e| ExplainError::BadRequest(e.0))
}

async fn remote(
    args: &ExplainArgs,
    req: pb::ExplainRequest,
) -> Result<(pb::Explanation, Vec<String>), ExplainError> {
    let domain = req.domain.clone();
    let mut client = connect(&args.connect).await?;
    let answer = tokio::time::timeout(ANSWER_WAIT, client.explain(req))
        .await
        .map_err(|_| unanswered_in_time(&args.connect.server))?;
    let explanation = match answer {
        Ok(answer) => answer.into_inner(),
        Err(s) => return Err(call_failed(&args.connect, &s).await),
    };
    // A server that does not list its policies leaves the explanation as it is.
    let listed = client.list_policies(pb::ListPoliciesRequest { domain });
    let notes = match tokio::time::timeout(ANSWER_WAIT, listed).await {
        Ok(Ok(p)) => standing(&p.into_inner()),
        _ => Vec::new(),
    };
    Ok((explanation, notes))
}

/// A failed call's error: the connection's when it was not the admin API's answer.
async fn call_failed(args: &ConnectArgs, s: &tonic::Status) -> ExplainError {
    match super::probe::unanswered(args, s).await {
        Some(e) => ExplainError::Connect(e),
        None => ExplainError::Call(super::connect::status_text(s)),
    }
}

pub(crate) fn code_name(code: i32) -> &'static str {
    match pb::Code::try_from(code) {
        Ok(pb::Code::Ok) => "OK",
        Ok(pb::Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

fn kind_name(kind: i32) -> &'static str {
    match pb::MatchKind::try_from(kind) {
        Ok(pb::MatchKind::Exact) => "exact",
        Ok(pb::MatchKind::Wildcard) => "wildcard",
        Ok(pb::MatchKind::KeyOnly) => "key only",
        _ => "unknown",
    }
}

/// Microseconds for people: `1.5s`, `250ms`, `never`.
fn span(us: u64) -> String {
    if us == u64::MAX {
        "never".to_string()
    } else if us >= 1_000_000 {
        format!("{:.1}s", us as f64 / 1e6)
    } else {
        format!("{}ms", us.div_ceil(1000))
    }
}

/// The explanation for people.
pub fn text(e: &pb::Explanation) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    // Entries, counter keys and reasons carry values clients chose: escaped.
    let _ = writeln!(
        out,
        "domain {}: {}",
        printable(&e.domain),
        code_name(e.overall_code)
    );
    if !e.store_error.is_empty() {
        let _ = writeln!(out, "store: {}", printable(&e.store_error));
    }
    for (i, d) in e.descriptors.iter().enumerate() {
        let entries: Vec<_> = d.entries.iter().map(|e| printable(e)).collect();
        let _ = writeln!(out, "descriptor {}: {}", i + 1, entries.join(" "));
        if !d.levels.is_empty() {
            let levels: Vec<String> = d
                .levels
                .iter()
                .map(|l| match pb::MatchKind::try_from(l.kind) {
                    Ok(pb::MatchKind::Wildcard) => {
                        format!(
                            "{}={} (wildcard {})",
                            printable(&l.key),
                            printable(&l.value),
                            printable(&l.pattern)
                        )
                    }
                    _ => format!(
                        "{}={} ({})",
                        printable(&l.key),
                        printable(&l.value),
                        kind_name(l.kind)
                    ),
                })
                .collect();
            let _ = writeln!(out, "  matched:  {}", levels.join(" > "));
        }
        if !d.no_match.is_empty() {
            let _ = writeln!(out, "  no match: {}", printable(&d.no_match));
        }
        if !d.replaced_by.is_empty() {
            let _ = writeln!(out, "  replaced: {}", printable(&d.replaced_by));
        }
        if let Some(r) = &d.rule {
            let mut rule = format!("{} ({} layer)", r.path, r.layer);
            if !r.name.is_empty() {
                let _ = write!(rule, " name {}", r.name);
            }
            if r.unlimited {
                rule.push_str(": unlimited");
            } else {
                rule.push_str(": ");
                push_limit(&mut rule, r);
                for other in &r.also {
                    rule.push_str(" and ");
                    push_limit(&mut rule, other);
                }
            }
            for (on, what) in [
                (r.shadow_mode, "shadow"),
                (r.quota_mode, "quota"),
                (r.from_override, "the request's limit override"),
            ] {
                if on {
                    let _ = write!(rule, ", {what}");
                }
            }
            if !r.replaces.is_empty() {
                let _ = write!(rule, ", replaces {}", r.replaces.join(", "));
            }
            let _ = writeln!(out, "  rule:     {rule}");
        }
        if let Some(n) = &d.nearest {
            let mut nearest = String::new();
            push_limit(&mut nearest, n);
            let _ = writeln!(out, "  nearest:  {nearest} (the state below is its)");
        }
        if !d.counter_key.is_empty() {
            let _ = writeln!(out, "  counter:  {}", printable(&d.counter_key));
        }
        if d.local {
            let _ = writeln!(
                out,
                "  local:    decided in this replica's memory (failure_mode local); {} hit(s) not yet in the store",
                d.local_unsettled
            );
        }
        if let Some(c) = &d.counter {
            let mut state = format!(
                "{} hit(s) {}: {} left, full again in {}",
                d.hits,
                if c.admitted { "fit" } else { "do not fit" },
                c.remaining,
                span(c.reset_micros)
            );
            if !c.admitted {
                let _ = write!(state, ", retry after {}", span(c.retry_after_micros));
            }
            if c.owed > 0 {
                let _ = write!(state, ", owes {} hit(s)", c.owed);
            }
            for (on, what) in [(c.banned, "banned"), (c.blocked, "blocked")] {
                if on {
                    let _ = write!(state, ", {what}");
                }
            }
            if c.tightened {
                state.push_str(", under a tightened limit");
                // The rule whose limit the state is of; a server that does not
                // say the limit in force (0) gets the bare words.
                if let Some(r) = d.nearest.as_ref().or(d.rule.as_ref()) {
                    if c.limit > 0 {
                        let _ = write!(
                            state,
                            " of {} (configured {})",
                            limit_words(c.limit, r),
                            r.requests_per_unit
                        );
                    }
                }
            }
            let _ = writeln!(out, "  state:    {state}");
        }
        let _ = writeln!(
            out,
            "  answer:   {} ({})",
            code_name(d.code),
            printable(&d.reason)
        );
    }
    for h in &e.response_headers {
        let _ = writeln!(out, "header {}: {}", printable(&h.key), printable(&h.value));
    }
    out
}

/// `10 per second (sliding_window_counter)`, with the burst of a bucket and the
/// name of a named limit of a list.
fn push_limit(out: &mut String, r: &pb::Rule) {
    use std::fmt::Write as _;
    if r.algorithm == "concurrency" {
        // The window is the lease: `3 in flight (concurrency, lease 300s)`.
        let lease = pb::Rule {
            unit: "unknown".to_string(),
            ..r.clone()
        };
        let _ = write!(
            out,
            "{} in flight (concurrency, lease {})",
            r.requests_per_unit,
            unit_text(&lease)
        );
        return;
    }
    let _ = write!(
        out,
        "{} per {} ({}",
        r.requests_per_unit,
        unit_text(r),
        r.algorithm
    );
    if r.algorithm == "token_bucket" || r.algorithm == "leaky_bucket" {
        let _ = write!(out, ", burst {}", r.burst);
    }
    out.push(')');
}

/// `requests` in `r`'s unit: `2 per minute`, or `2 in flight` for concurrency.
fn limit_words(requests: u64, r: &pb::Rule) -> String {
    if r.algorithm == "concurrency" {
        format!("{requests} in flight")
    } else {
        format!("{requests} per {}", unit_text(r))
    }
}

/// The unit, the calendar window (`calendar_month in Europe/Berlin`), or the
/// window's length when it is no unit (`90s`).
fn unit_text(r: &pb::Rule) -> String {
    if !r.calendar.is_empty() {
        return format!("{} in {}", r.calendar, r.time_zone);
    }
    if r.unit != "unknown" || r.window_micros == 0 {
        return r.unit.clone();
    }
    if r.window_micros.is_multiple_of(1_000_000) {
        format!("{}s", r.window_micros / 1_000_000)
    } else {
        format!("{}us", r.window_micros)
    }
}

/// The explanation as JSON, with the proto's field names in lowerCamelCase and enum
/// names as text (as grpcurl prints it).
pub fn to_json(e: &pb::Explanation) -> Value {
    let rule = |r: &pb::Rule| {
        json!({
            "path": r.path, "statKey": r.stat_key, "name": r.name, "layer": r.layer, "unlimited": r.unlimited,
            "algorithm": r.algorithm, "requestsPerUnit": r.requests_per_unit, "unit": r.unit,
            "windowMicros": r.window_micros, "burst": r.burst, "shadowMode": r.shadow_mode,
            "calendar": r.calendar, "timeZone": r.time_zone,
            "quotaMode": r.quota_mode, "replaces": r.replaces, "fromOverride": r.from_override,
            "also": r.also.iter().map(|a| json!({
                "name": a.name, "algorithm": a.algorithm, "requestsPerUnit": a.requests_per_unit,
                "unit": a.unit, "windowMicros": a.window_micros, "burst": a.burst,
                "calendar": a.calendar, "timeZone": a.time_zone,
            })).collect::<Vec<_>>(),
            "penalty": r.penalty.as_ref().map(|p| json!({
                "violations": p.violations, "withinMicros": p.within_micros, "banMicros": p.ban_micros,
                "tighten": p.tighten.as_ref().map(|t| json!({"factor": t.factor, "forMicros": t.for_micros})),
                "block": p.block.as_ref().map(|b| json!({
                    "bans": b.bans, "withinMicros": b.within_micros, "forMicros": b.for_micros,
                })),
            })),
        })
    };
    json!({
        "domain": e.domain,
        "domainKnown": e.domain_known,
        "overallCode": code_name(e.overall_code),
        "storeError": e.store_error,
        "hashedKeys": e.hashed_keys,
        "responseHeaders": e.response_headers.iter().map(|h| json!({"key": h.key, "value": h.value})).collect::<Vec<_>>(),
        "descriptors": e.descriptors.iter().map(|d| json!({
            "entries": d.entries,
            "levels": d.levels.iter().map(|l| json!({
                "key": l.key, "value": l.value,
                "kind": pb::MatchKind::try_from(l.kind).map(|k| k.as_str_name()).unwrap_or("MATCH_KIND_UNKNOWN"),
                "pattern": l.pattern,
            })).collect::<Vec<_>>(),
            "noMatch": d.no_match,
            "rule": d.rule.as_ref().map(rule),
            "nearest": d.nearest.as_ref().map(rule),
            "replacedBy": d.replaced_by,
            "counterKey": d.counter_key,
            "hits": d.hits,
            "counter": d.counter.as_ref().map(|c| json!({
                "admitted": c.admitted, "remaining": c.remaining, "resetMicros": c.reset_micros,
                "retryAfterMicros": c.retry_after_micros, "owed": c.owed, "banned": c.banned,
                "blocked": c.blocked, "tightened": c.tightened, "limit": c.limit,
            })),
            "code": code_name(d.code),
            "reason": d.reason,
            "local": d.local,
            "localUnsettled": d.local_unsettled,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn entries(words: &[&str]) -> Result<pb::ExplainRequest, ExplainError> {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            explain: ExplainArgs,
        }
        let args = ["explain", "--domain", "d"].iter().chain(words);
        request(&Cli::try_parse_from(args).expect("parses").explain)
    }

    /// A stray `+` would explain an empty descriptor, which no Envoy sends.
    #[test]
    fn a_plus_must_sit_between_entries() {
        let two = entries(&["a=1", "+", "b=2"]).expect("two descriptors");
        assert_eq!(two.descriptors.len(), 2);
        for words in [&["a=1", "+"][..], &["+", "a=1"], &["a=1", "+", "+", "b=2"]] {
            let e = entries(words).expect_err("refused");
            assert!(e.to_string().contains("has no entries"), "{words:?}: {e}");
        }
    }

    /// Values a client chose (the operator pastes them, the server echoes them in
    /// the counter key and the levels) print escaped: they cannot clear the
    /// screen, set the title or break the explanation into forged lines.
    #[test]
    fn values_print_escaped_one_line_a_field() {
        let e = pb::Explanation {
            domain: "h".into(),
            descriptors: vec![pb::DescriptorExplanation {
                entries: vec!["user=bob\rcarol\nanswer:   OK".into()],
                levels: vec![pb::LevelMatch {
                    key: "user".into(),
                    value: "\u{1b}]0;title\u{7}\u{202e}".into(),
                    kind: pb::MatchKind::KeyOnly as i32,
                    ..Default::default()
                }],
                counter_key: "h|user=\u{1b}[2J\u{1b}[H".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let out = text(&e);
        assert_eq!(out.lines().count(), 5, "{out}");
        assert!(
            !out.contains(|c: char| c.is_control() && c != '\n' || c == '\u{202e}'),
            "{out:?}"
        );
        for shown in [
            "descriptor 1: user=bob\\rcarol\\nanswer:   OK",
            "user=\\u{1b}]0;title\\u{7}\\u{202e}",
            "counter:  h|user=\\u{1b}[2J\\u{1b}[H",
        ] {
            assert!(out.contains(shown), "{shown:?} in\n{out}");
        }
    }

    /// The state line names every sentence the key serves, not only a ban.
    #[test]
    fn the_state_names_a_block_and_a_tightening() {
        let e = |counter: pb::CounterState| pb::Explanation {
            descriptors: vec![pb::DescriptorExplanation {
                counter: Some(counter),
                ..Default::default()
            }],
            ..Default::default()
        };
        let blocked = text(&e(pb::CounterState {
            blocked: true,
            ..Default::default()
        }));
        assert!(blocked.contains(", blocked"), "{blocked}");
        let tightened = text(&e(pb::CounterState {
            admitted: true,
            tightened: true,
            ..Default::default()
        }));
        assert!(
            tightened.contains(", under a tightened limit"),
            "{tightened}"
        );
        let banned = text(&e(pb::CounterState {
            banned: true,
            ..Default::default()
        }));
        assert!(
            banned.contains(", banned") && !banned.contains("blocked"),
            "{banned}"
        );
    }

    /// A key a penalty tightened is explained with the limit in force for it, the
    /// one its remaining counts down from and its answer states (2, a fifth of 10),
    /// the rule's configured 10 beside it; in text and in JSON.
    #[tokio::test]
    async fn a_tightened_key_is_explained_with_the_limit_in_force() {
        use crate::algorithm::SECOND;
        use crate::clock::ManualClock;
        use crate::limiter::{test_limiter, Descriptor};
        const POLICY: &str = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n      algorithm: fixed_window\n      name: per_ip\n      penalty: {violations: 2, within: 1m, tighten: {factor: 0.2, for: 10m}}\n";
        let clock = ManualClock::new(1_700_000_000 * SECOND);
        let l = test_limiter(POLICY, &clock, Settings::default());
        let ip = [("ip", "1.1.1.1")];
        let d = [Descriptor::new(&ip[..], 1)];
        let explained = || async {
            let e = l.explain("d", &d).await;
            crate::admin::explain::to_pb("d", &d, &e, HeaderStyle::Draft03, false)
        };
        let full = explained().await;
        assert_eq!(full.descriptors[0].counter.as_ref().unwrap().limit, 10);
        assert!(!text(&full).contains("tightened"), "{}", text(&full));
        // Two denials past the limit tighten the key to a fifth.
        while !l.decide("d", &d).await.over_limit {}
        l.decide("d", &d).await;
        clock.advance(61 * SECOND);
        let tight = explained().await;
        let shown = text(&tight);
        assert!(
            shown.contains("state:    1 hit(s) fit: 1 left, ")
                && shown.contains(", under a tightened limit of 2 per minute (configured 10)\n"),
            "{shown}"
        );
        assert!(
            shown.contains("header x-ratelimit-limit: 2, 2;w=60;name=\"per_ip\""),
            "the answer states the same limit: {shown}"
        );
        let json = to_json(&tight);
        let desc = &json["descriptors"][0];
        assert_eq!(desc["counter"]["tightened"], true);
        assert_eq!(desc["counter"]["limit"], 2);
        assert_eq!(desc["rule"]["requestsPerUnit"], 10);
    }

    /// Every key anywhere in `v`.
    fn keys(v: &Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    out.insert(k.clone());
                    keys(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
            _ => {}
        }
    }

    /// `--json` says all the admin API says: every field of the explanation's
    /// messages, read from the proto's own descriptors, has its key, so a field
    /// added to the proto and not here fails.
    #[test]
    fn json_carries_every_field_of_the_explanation() {
        let rule = pb::Rule {
            penalty: Some(pb::Penalty {
                tighten: Some(Default::default()),
                block: Some(Default::default()),
                ..Default::default()
            }),
            also: vec![Default::default()],
            ..Default::default()
        };
        let e = pb::Explanation {
            descriptors: vec![pb::DescriptorExplanation {
                levels: vec![Default::default()],
                rule: Some(rule.clone()),
                nearest: Some(rule),
                counter: Some(Default::default()),
                ..Default::default()
            }],
            response_headers: vec![Default::default()],
            ..Default::default()
        };
        let mut shown = std::collections::BTreeSet::new();
        keys(&to_json(&e), &mut shown);
        let set = prost_types::FileDescriptorSet::decode(crate::admin::DESCRIPTORS).unwrap();
        let messages = [
            "Explanation",
            "DescriptorExplanation",
            "LevelMatch",
            "Rule",
            "Penalty",
            "Tighten",
            "BlockRule",
            "CounterState",
        ];
        let mut checked = 0;
        for file in &set.file {
            for m in file.message_type.iter() {
                if !messages.contains(&m.name()) {
                    continue;
                }
                checked += 1;
                for f in &m.field {
                    let name = f.json_name();
                    assert!(shown.contains(name), "{}.{name} is not in --json", m.name());
                }
            }
        }
        assert_eq!(checked, messages.len());
    }
}
