//! A descriptor's `rate_limit` and `rate_limits` (both spellings) into the model:
//! units, windows (calendar ones too), algorithms, bursts, leases and `replaces`,
//! with envoyproxy/ratelimit's checks and a RateLimitPolicy's schema's.

use crate::algorithm::{Algorithm, Micros, MAX_BURST, MAX_FILL, SECOND};

use super::duration;
use super::fields::{at_line, boolean, integer, list, string, text, Ctx, Field, Fields, Form};
use super::model::RateLimit;
use super::node::shorten;
use super::sentence::{penalty, shed};
use super::{Calendar, Period, Unit};

/// envoyproxy/ratelimit's units, case-insensitive as there (a RateLimitPolicy's
/// schema narrows this to lowercase and uppercase, checked in [`rate_limit`]).
fn parse_unit(s: &str) -> Option<Unit> {
    Some(match s.to_ascii_lowercase().as_str() {
        "second" => Unit::Second,
        "minute" => Unit::Minute,
        "hour" => Unit::Hour,
        "day" => Unit::Day,
        "week" => Unit::Week,
        "month" => Unit::Month,
        "year" => Unit::Year,
        _ => return None,
    })
}

pub(super) fn rate_limit(ctx: &mut Ctx, field: Field<'_>) -> Option<RateLimit> {
    let what = field.name;
    let errors_before = ctx.errors.len();
    let mut f = Fields::open_field(ctx, field, what)?;
    let unit_field = f.get(ctx, "unit");
    let unit = unit_field.and_then(|u| text(ctx, u)).and_then(|s| {
        let unit = parse_unit(&s);
        // The CRD's schema lists each unit in lowercase and in uppercase only.
        let mixed = s != s.to_ascii_lowercase() && s != s.to_ascii_uppercase();
        if unit.is_some() && ctx.form == Form::Resource && mixed {
            ctx.error(
                unit_field.and_then(|u| u.line()),
                format!(
                    "rate limit unit '{}' must be all lowercase or all uppercase in a RateLimitPolicy ({} or {}), as its schema lists them",
                    shorten(&s),
                    s.to_ascii_lowercase(),
                    s.to_ascii_uppercase()
                ),
            );
            return None;
        }
        if unit.is_none() {
            ctx.error(
                unit_field.and_then(|u| u.line()),
                format!(
                    "invalid rate limit unit '{}' (expected second, minute, hour, day, week, month or year)",
                    shorten(&s)
                ),
            );
        }
        unit
    });
    let rpu_field = f.get(ctx, "requests_per_unit");
    let requests_per_unit = rpu_field
        .and_then(|r| integer(ctx, r, 0, i128::from(u32::MAX)))
        .and_then(|r| u32::try_from(r).ok());
    let unlimited_field = f.get(ctx, "unlimited");
    let unlimited = unlimited_field
        .and_then(|u| boolean(ctx, u))
        .unwrap_or(false);
    let name = f
        .get(ctx, "name")
        .and_then(|n| string(ctx, n))
        .filter(|n| !n.is_empty());
    let replaces = match f.get(ctx, "replaces") {
        Some(r) => replaces(ctx, r, name.as_deref()),
        None => Vec::new(),
    };
    let algorithm_field = f.get(ctx, "algorithm");
    let mut concurrency = false;
    let algorithm = algorithm_field.and_then(|a| text(ctx, a)).and_then(|s| {
        // Requests in flight: a sliding log whose window is the lease (see `lease`).
        if s == "concurrency" {
            concurrency = true;
            return Some(Algorithm::SlidingWindowLog);
        }
        let algorithm = Algorithm::parse(&s);
        if algorithm.is_none() {
            ctx.error(
                algorithm_field.and_then(|a| a.line()),
                format!(
                    "unknown algorithm '{}' (expected fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket or concurrency)",
                    shorten(&s)
                ),
            );
        }
        algorithm
    });
    let window_field = f.get(ctx, "window");
    let mut period = None;
    let window = window_field.and_then(|w| {
        let text = text(ctx, w)?;
        if !schema_text(ctx, w, &text, Some(super::MAX_WINDOW_CHARS)) {
            return None;
        }
        if let Some(p) = Period::parse(&text) {
            period = Some(p);
            return None;
        }
        if text.starts_with("calendar") {
            ctx.error(
                w.line(),
                format!(
                    "'{}': unknown calendar window '{}' (expected calendar_day or calendar_month)",
                    w.name,
                    shorten(&text)
                ),
            );
            return None;
        }
        duration_field(ctx, w)
    });
    let zone_field = f.get(ctx, "time_zone");
    let zone = zone_field.and_then(|z| string(ctx, z));
    let lease_field = f.get(ctx, "lease");
    let lease = lease_field.and_then(|l| duration_field(ctx, l));
    let burst_field = f.get(ctx, "burst");
    let burst = burst_field
        .and_then(|b| integer(ctx, b, 1, i128::from(MAX_BURST)))
        .and_then(|b| u64::try_from(b).ok());
    let penalty_field = f.get(ctx, "penalty");
    let penalty = penalty_field.and_then(|p| penalty(ctx, p));
    let shed_field = f.get(ctx, "shed");
    let shed = shed_field.and_then(|s| shed(ctx, s));
    let line = f.line;
    f.finish(ctx, what);

    if unlimited {
        for (extra, name) in [
            (unit_field, "unit"),
            (window_field, "window"),
            (zone_field, "time_zone"),
            (lease_field, "lease"),
            (algorithm_field, "algorithm"),
            (burst_field, "burst"),
            (penalty_field, "penalty"),
            (shed_field, "shed"),
        ] {
            if let Some(extra) = extra {
                ctx.error(
                    extra.key_line,
                    format!(
                        "should not specify '{}' when 'unlimited' is true",
                        ctx.form.spell(name)
                    ),
                );
            }
        }
    } else if concurrency {
        // The lease is the window: a slot whose refund never comes is free after it.
        for (extra, name) in [(unit_field, "unit"), (window_field, "window")] {
            if let Some(extra) = extra {
                ctx.error(
                    extra.key_line,
                    format!(
                        "'algorithm: concurrency' takes 'lease' (how long a slot is held at most), not '{}'",
                        ctx.form.spell(name)
                    ),
                );
            }
        }
        if lease_field.is_none() {
            ctx.error(
                line,
                "'algorithm: concurrency' needs 'lease': how long a slot is held at most when its refund never comes (longer than the longest stream)",
            );
        }
        if rpu_field.is_none() {
            ctx.error(
                line,
                format!("'{what}' needs '{}'", ctx.form.spell("requests_per_unit")),
            );
        }
    } else {
        if let Some(l) = lease_field {
            ctx.error(
                l.key_line,
                "'lease' applies only to 'algorithm: concurrency'",
            );
        }
        match (unit_field, window_field) {
            (None, None) => ctx.error(
                line,
                format!("'{what}' needs 'unit' or 'window' (or 'unlimited: true')"),
            ),
            (Some(_), Some(w)) => ctx.error(
                w.key_line,
                format!("'{what}' takes either 'unit' or 'window', not both"),
            ),
            _ => {}
        }
        if rpu_field.is_none() {
            ctx.error(
                line,
                format!("'{what}' needs '{}'", ctx.form.spell("requests_per_unit")),
            );
        }
    }
    // `burst` needs its algorithm named, so whether a document is valid never
    // depends on the server's `--default-algorithm`.
    if let (Some(b), false) = (burst_field, unlimited) {
        match algorithm {
            _ if concurrency => ctx.error(
                b.key_line,
                "'burst' only applies to token_bucket and leaky_bucket, not concurrency",
            ),
            Some(Algorithm::TokenBucket | Algorithm::LeakyBucket) => {
                if let (Some(burst), Some(requests)) = (burst, requests_per_unit) {
                    let window = window.or_else(|| unit.and_then(Unit::micros));
                    fills_in_time(ctx, b, burst, requests, unit, window);
                }
            }
            Some(other) => ctx.error(
                b.key_line,
                format!(
                    "'burst' only applies to token_bucket and leaky_bucket, not {}",
                    other.as_str()
                ),
            ),
            None if algorithm_field.is_none() => ctx.error(
                b.key_line,
                "'burst' only applies to token_bucket and leaky_bucket: name one with 'algorithm'",
            ),
            None => {}
        }
    }
    let calendar = calendar(
        ctx,
        period,
        zone_field,
        zone.as_deref(),
        algorithm_field,
        algorithm,
    );
    if ctx.errors.len() > errors_before {
        return None;
    }
    Some(RateLimit {
        line,
        name,
        unlimited,
        unit,
        window,
        requests_per_unit: requests_per_unit.unwrap_or(0),
        // A calendar window is a fixed window whatever `--default-algorithm` says.
        algorithm: algorithm.or(calendar.as_ref().map(|_| Algorithm::FixedWindow)),
        calendar,
        lease: if concurrency { lease } else { None },
        burst,
        replaces,
        penalty,
        shed,
    })
}

/// Refuses a bucket that takes longer than [`MAX_FILL`] to fill from empty (burst ×
/// window / requests): its state would run past the end of time the stores count
/// to, and a full bucket would no longer give its whole burst.
fn fills_in_time(
    ctx: &mut Ctx,
    field: Field<'_>,
    burst: u64,
    requests: u32,
    unit: Option<Unit>,
    window: Option<Micros>,
) {
    // No rate admits nothing and keeps no state.
    let (Some(window), true) = (window, requests > 0) else {
        return;
    };
    let (requests, window) = (u128::from(requests), u128::from(window));
    let longest = u128::from(MAX_FILL);
    if u128::from(burst) * window <= longest * requests {
        return;
    }
    let years = u128::from(burst) * window / requests / u128::from(YEAR);
    let most = (longest * requests / window).min(u128::from(MAX_BURST));
    let per = match unit {
        Some(u) => u.as_str().to_string(),
        None => describe_micros(window as Micros),
    };
    ctx.error(
        field.line(),
        format!(
            "'{}': a bucket of {burst} at {requests} per {per} takes about {years} years to fill, longer than the longest allowed, {MAX_FILL}us (about 35 years); at this rate '{}' may be at most {most}",
            field.name, field.name
        ),
    );
}

/// A calendar window (`window: calendar_day`, `calendar_month`) in `time_zone` (UTC
/// when not given), counted by fixed_window: the other algorithms count over spans
/// of one length, which a local day or month is not. `time_zone` without a calendar
/// window is an error, as is a zone the built-in zone rules do not name.
fn calendar(
    ctx: &mut Ctx,
    period: Option<Period>,
    zone_field: Option<Field<'_>>,
    zone: Option<&str>,
    algorithm_field: Option<Field<'_>>,
    algorithm: Option<Algorithm>,
) -> Option<Calendar> {
    let Some(period) = period else {
        if let Some(z) = zone_field {
            ctx.error(
                z.key_line,
                format!(
                    "'{}' applies only to a calendar window (window: calendar_day or calendar_month)",
                    ctx.form.spell("time_zone")
                ),
            );
        }
        return None;
    };
    if let Some(other) = algorithm.filter(|a| *a != Algorithm::FixedWindow) {
        ctx.error(
            algorithm_field.and_then(|a| a.line()),
            format!(
                "a calendar window ({}) is counted by fixed_window only, not {}: the other algorithms need windows of one length",
                period.as_str(),
                other.as_str()
            ),
        );
    }
    match Calendar::new(period, zone.unwrap_or("UTC")) {
        Ok(c) => Some(c),
        Err(message) => {
            let line = zone_field.and_then(|z| z.line());
            ctx.error(
                line,
                format!("'{}': {message}", ctx.form.spell("time_zone")),
            );
            None
        }
    }
}

/// `rate_limits`: several limits on one descriptor, each read as a `rate_limit`.
/// A request passes only when every one admits it, so the limits must differ in
/// their window; what decides for the descriptor as a whole (`unlimited`,
/// `replaces`, `penalty`, `shed`) belongs to a single `rate_limit`. Returns nothing
/// after an error.
pub(super) fn rate_limits(ctx: &mut Ctx, field: Field<'_>) -> Vec<RateLimit> {
    let Some(items) = list(ctx, field) else {
        return Vec::new();
    };
    let errors_before = ctx.errors.len();
    if items.is_empty() {
        ctx.error(
            field.line(),
            format!(
                "'{}' needs at least one limit (or leave it out)",
                field.name
            ),
        );
    }
    if items.len() > super::MAX_RATE_LIMITS {
        ctx.error(
            field.line(),
            format!(
                "'{}' holds {} limits; at most {} are allowed",
                field.name,
                items.len(),
                super::MAX_RATE_LIMITS
            ),
        );
        return Vec::new();
    }
    let mut out: Vec<RateLimit> = Vec::with_capacity(items.len());
    for item in items {
        let as_field = Field {
            name: field.name,
            key_line: item.line,
            node: item,
        };
        let Some(rl) = rate_limit(ctx, as_field) else {
            continue;
        };
        let alone = [
            (rl.lease.is_some(), "algorithm: concurrency"),
            (rl.unlimited, "unlimited"),
            (!rl.replaces.is_empty(), "replaces"),
            (rl.penalty.is_some(), "penalty"),
            (rl.shed.is_some(), "shed"),
        ];
        for (_, name) in alone.iter().filter(|(set, _)| *set) {
            ctx.error(
                rl.line,
                format!(
                    "'{}' is not allowed in '{}': it applies to the descriptor as a whole; use a single '{}'",
                    ctx.form.spell(name),
                    field.name,
                    ctx.form.spell("rate_limit"),
                ),
            );
        }
        if let Some(first) = out.iter().find(|o| o.same_window(&rl)) {
            ctx.error(
                rl.line,
                format!(
                    "'{}' has two limits with the same window ({}){}: one would always decide for the other; keep the smaller",
                    field.name,
                    describe_window(&rl),
                    at_line(first.line, "first at")
                ),
            );
            continue;
        }
        out.push(rl);
    }
    if ctx.errors.len() > errors_before {
        return Vec::new();
    }
    out
}

/// The window of `rl` in seconds (`60s`), for messages.
fn describe_window(rl: &RateLimit) -> String {
    if let Some(c) = &rl.calendar {
        return format!("{} in {}", c.period().as_str(), c.zone_name());
    }
    match rl.window_micros() {
        Some(w) => describe_micros(w),
        None => "none".to_string(),
    }
}

/// A duration in seconds when whole (`60s`), else in microseconds.
fn describe_micros(micros: Micros) -> String {
    if micros.is_multiple_of(SECOND) {
        format!("{}s", micros / SECOND)
    } else {
        format!("{micros}us")
    }
}

/// A year of 365 days, for messages.
const YEAR: Micros = 365 * 86_400 * SECOND;

/// The largest count (`violations`, `bans`) a policy may write: the CRD's
/// schema has them as int64, the file form as u64.
pub(super) fn max_count(ctx: &Ctx) -> i128 {
    match ctx.form {
        Form::File => i128::from(u64::MAX),
        Form::Resource => i128::from(i64::MAX),
    }
}

/// In the resource form, what the CRD's schema refuses in the text of a duration or
/// a window, which the parser would otherwise let pass: spaces around it (the
/// schema's pattern is anchored; the parser trims) and more than `max_chars`
/// characters (the schema's `maxLength`). False after an error.
fn schema_text(ctx: &mut Ctx, field: Field<'_>, text: &str, max_chars: Option<usize>) -> bool {
    if ctx.form != Form::Resource {
        return true;
    }
    if let Some(max) = max_chars {
        let chars = text.chars().count();
        if chars > max {
            ctx.error(
                field.line(),
                format!(
                    "'{}' is {chars} characters long; a RateLimitPolicy's schema allows at most {max}",
                    field.name
                ),
            );
            return false;
        }
    }
    if text.trim() != text {
        ctx.error(
            field.line(),
            format!(
                "'{}': '{}' has spaces around it, which a RateLimitPolicy's schema refuses; write '{}'",
                field.name,
                shorten(text),
                shorten(text.trim())
            ),
        );
        return false;
    }
    true
}

pub(super) fn duration_field(ctx: &mut Ctx, field: Field<'_>) -> Option<u64> {
    let text = text(ctx, field)?;
    if !schema_text(ctx, field, &text, None) {
        return None;
    }
    match duration::parse_positive(&text) {
        Ok(d) => Some(d),
        Err(message) => {
            ctx.error(field.line(), format!("'{}': {message}", field.name));
            None
        }
    }
}

fn replaces(ctx: &mut Ctx, field: Field<'_>, own: Option<&str>) -> Vec<String> {
    let Some(items) = list(ctx, field) else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Some(mut f) = Fields::open(ctx, item, "replaces entry") else {
            continue;
        };
        let name = f.get(ctx, "name").and_then(|n| string(ctx, n));
        f.finish(ctx, "replaces entry");
        match name {
            Some(n) if !n.is_empty() => {
                if Some(n.as_str()) == own {
                    ctx.error(
                        item.line,
                        format!(
                            "'replaces' names this limit itself ('{}'); a limit cannot replace itself",
                            shorten(&n)
                        ),
                    );
                } else {
                    out.push(n);
                }
            }
            _ => ctx.error(item.line, "'replaces' entry has an empty or missing 'name'"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::policy::descriptor::tests::errors;
    use crate::policy::{compile, parse_resource_spec, parse_str, Period, Unit};

    /// A policy's durations are the flags' syntax (`policy::duration`), longer than
    /// zero; a bad one is `FILE:LINE: 'field': why`.
    #[test]
    fn windows_and_leases_take_one_duration_syntax() {
        let window = |w: &str| {
            let text = format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{window: {w}, requests_per_unit: 5}}\n"
            );
            let policy = compile(parse_str("p.yaml", &text).unwrap()).unwrap();
            let id = policy.domain("d").unwrap().find(&[("k", "x")]).unwrap();
            policy.rule(id).limit.unwrap().window
        };
        assert_eq!(window("1.5s"), 1_500_000);
        assert_eq!(window("1m30s"), 90 * crate::algorithm::SECOND);
        assert_eq!(window("250us"), 250);
        assert_eq!(window("1d"), 86_400 * crate::algorithm::SECOND);
        for (bad, why) in [
            (
                "0s",
                "p.yaml:4: 'window': duration '0s' must be longer than zero",
            ),
            ("10x", "p.yaml:4: 'window': unknown unit 'x' in '10x'"),
            ("'10'", "p.yaml:4: 'window': '10' is not a duration"),
            (
                "13032d",
                "p.yaml:4: 'window': duration '13032d' is longer than the longest allowed",
            ),
        ] {
            let err = rate_limit_errors(&format!("{{window: {bad}, requests_per_unit: 5}}"));
            assert!(err.starts_with(why), "{bad}: {err}");
        }
        let err = rate_limit_errors("{algorithm: concurrency, requests_per_unit: 3, lease: 0.5us}");
        assert!(
            err.contains("'lease': '0.5us' is not a duration of whole microseconds"),
            "{err}"
        );
        let err = rate_limit_errors(
            "{unit: minute, requests_per_unit: 3, penalty: {violations: 3, within: 1m, ban: 213503982d}}",
        );
        assert!(
            err.contains("'ban': duration '213503982d' is longer than the longest allowed"),
            "{err}"
        );
    }

    /// A bucket whose state would run past the stores' end of time is refused: its
    /// burst above 2^50, or a fill from empty longer than 2^50 µs (about 35 years).
    #[test]
    fn a_bucket_must_fill_within_the_longest_window() {
        for (rate_limit, why) in [
            (
                "{unit: day, requests_per_unit: 1, algorithm: token_bucket, burst: 100000}",
                "p.yaml:4: 'burst': a bucket of 100000 at 1 per day takes about 273 years to fill, longer than the longest allowed, 1125899906842624us (about 35 years); at this rate 'burst' may be at most 13031",
            ),
            (
                "{unit: year, requests_per_unit: 1, algorithm: leaky_bucket, burst: 300}",
                "p.yaml:4: 'burst': a bucket of 300 at 1 per year takes about 300 years to fill, longer than the longest allowed, 1125899906842624us (about 35 years); at this rate 'burst' may be at most 35",
            ),
            (
                "{window: 1.5s, requests_per_unit: 1, algorithm: token_bucket, burst: 1000000000}",
                "p.yaml:4: 'burst': a bucket of 1000000000 at 1 per 1500000us takes about 47 years to fill",
            ),
            (
                "{window: 1us, requests_per_unit: 5, algorithm: token_bucket, burst: 1125899906842625}",
                "p.yaml:4: 'burst' must be at most 1125899906842624, found 1125899906842625",
            ),
            (
                "{unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 18446744073709551615}",
                "p.yaml:4: 'burst' must be at most 1125899906842624, found 18446744073709551615",
            ),
        ] {
            let err = rate_limit_errors(rate_limit);
            assert!(err.starts_with(why), "{rate_limit}: {err}");
        }
        // Each limit of a list, and the resource form, alike.
        let listed = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: day, requests_per_unit: 1, algorithm: token_bucket, burst: 13032}
";
        assert!(
            errors(listed).starts_with("p.yaml:6: 'burst': a bucket of 13032 at 1 per day"),
            "{}",
            errors(listed)
        );
        let spec = serde_json::json!({
            "domain": "d",
            "descriptors": [{"key": "k", "rateLimits": [
                {"unit": "second", "requestsPerUnit": 5},
                {"unit": "year", "requestsPerUnit": 1, "algorithm": "leaky_bucket", "burst": 36}
            ]}]
        });
        let err = parse_resource_spec("ns", "p", &spec).unwrap_err();
        assert!(
            err[0]
                .message
                .contains("'burst': a bucket of 36 at 1 per year"),
            "{err:?}"
        );
    }

    /// The largest bucket each rate accepts fills: it admits its whole burst at once.
    #[test]
    fn the_largest_bucket_accepted_gives_its_whole_burst() {
        use crate::algorithm::{decide, MAX_FILL};
        for (rate_limit, burst) in [
            ("{unit: day, requests_per_unit: 1, algorithm: token_bucket, burst: 13031}", 13_031),
            ("{unit: year, requests_per_unit: 1, algorithm: leaky_bucket, burst: 35}", 35),
            (
                "{window: 1us, requests_per_unit: 1, algorithm: token_bucket, burst: 1125899906842624}",
                1 << 50,
            ),
            (
                "{window: 7s, requests_per_unit: 3, algorithm: leaky_bucket, burst: 482528531}",
                482_528_531,
            ),
        ] {
            let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n");
            let policy = compile(parse_str("p.yaml", &text).unwrap()).unwrap();
            let limit = policy.rules[0].limit.unwrap();
            assert_eq!(limit.burst, burst);
            // Today, and as late as the year 2219.
            for now in [1_750_000_000 * crate::algorithm::SECOND, 7 * MAX_FILL - 1] {
                let v = decide(&limit, None, now, burst).verdict;
                assert!(v.admitted, "{rate_limit} at {now}");
                assert_eq!(v.remaining, 0, "{rate_limit} at {now}");
            }
        }
    }

    /// The errors of a policy whose one descriptor has `rate_limit` (line 4).
    fn rate_limit_errors(rate_limit: &str) -> String {
        errors(&format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n"
        ))
    }

    #[test]
    fn rate_limits_compile_into_a_rule_and_its_further_limits() {
        let text = "domain: d
descriptors:
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: day, requests_per_unit: 10000, algorithm: fixed_window, name: daily}
      - {window: 90s, requests_per_unit: 100}
";
        let policy = compile(parse_str("p.yaml", text).unwrap()).unwrap();
        let id = policy
            .domain("d")
            .unwrap()
            .find(&[("api_key", "x")])
            .unwrap();
        let rule = policy.rule(id);
        assert_eq!((rule.requests_per_unit, rule.unit.as_str()), (10, "second"));
        assert_eq!(rule.also.len(), 2);
        let daily = policy.rule(rule.also[0]);
        assert_eq!(daily.name.as_deref(), Some("daily"));
        assert_eq!(daily.path, "api_key");
        assert_eq!(daily.limit.unwrap().requests, 10_000);
        let odd = policy.rule(rule.also[1]);
        assert_eq!(odd.limit.unwrap().window, 90 * crate::algorithm::SECOND);
        assert!(odd.also.is_empty());
        // The tree reaches the first only; the others are its.
        assert_eq!(policy.domain("d").unwrap().rule_ids(), [id]);
    }

    #[test]
    fn rate_limits_in_a_resource_are_spelled_rate_limits_in_camel_case() {
        let spec = serde_json::json!({
            "domain": "d",
            "descriptors": [{
                "key": "k",
                "rateLimits": [
                    {"unit": "second", "requestsPerUnit": 1},
                    {"unit": "minute", "requestsPerUnit": 30}
                ]
            }]
        });
        let doc = parse_resource_spec("ns", "p", &spec).unwrap();
        let d = &doc.descriptors[0];
        assert_eq!(d.rate_limit.as_ref().unwrap().requests_per_unit, 1);
        assert_eq!(d.also.len(), 1);
        assert_eq!(d.also[0].requests_per_unit, 30);
    }

    #[test]
    fn bad_rate_limits_name_the_file_and_line() {
        let two_same = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {window: 60s, requests_per_unit: 5}
";
        assert_eq!(
            errors(two_same),
            "p.yaml:6: 'rate_limits' has two limits with the same window (60s) (first at line 5): one would always decide for the other; keep the smaller"
        );
        let both = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
    rate_limits:
      - {unit: second, requests_per_unit: 5}
";
        assert_eq!(
            errors(both),
            "p.yaml:5: a descriptor takes either 'rate_limit' or 'rate_limits', not both"
        );
        let unlimited = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unlimited: true}
";
        assert!(
            errors(unlimited).starts_with("p.yaml:6: 'unlimited' is not allowed in 'rate_limits'"),
            "{}",
            errors(unlimited)
        );
        let penalty = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 5, penalty: {violations: 1, within: 1m, ban: 1m}}
";
        assert!(
            errors(penalty).starts_with("p.yaml:5: 'penalty' is not allowed in 'rate_limits'"),
            "{}",
            errors(penalty)
        );
        let empty = "domain: d\ndescriptors:\n  - key: k\n    rate_limits: []\n";
        assert_eq!(
            errors(empty),
            "p.yaml:4: 'rate_limits' needs at least one limit (or leave it out)"
        );
        let missing = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {requests_per_unit: 5}
";
        assert_eq!(
            errors(missing),
            "p.yaml:5: 'rate_limits' needs 'unit' or 'window' (or 'unlimited: true')"
        );
    }

    #[test]
    fn calendar_windows_compile_to_a_fixed_window_in_their_zone() {
        let text = "domain: d
descriptors:
  - key: tenant
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {window: calendar_month, time_zone: Europe/Berlin, requests_per_unit: 100000, name: monthly}
      - {window: calendar_day, requests_per_unit: 5000}
      - {window: 1d, requests_per_unit: 6000}
";
        let policy = compile(parse_str("p.yaml", text).unwrap()).unwrap();
        let monthly = policy
            .rules
            .iter()
            .find(|r| r.name.as_deref() == Some("monthly"))
            .unwrap();
        let limit = monthly.limit.unwrap();
        assert_eq!(limit.algorithm, Algorithm::FixedWindow);
        assert_eq!(monthly.unit, Unit::Month);
        let calendar = monthly.calendar.as_ref().unwrap();
        assert_eq!(
            (calendar.period(), calendar.zone_name()),
            (Period::Month, "Europe/Berlin")
        );
        // No zone: UTC. A calendar day and a 1d window are different windows.
        let daily = policy
            .rules
            .iter()
            .find(|r| r.requests_per_unit == 5000)
            .unwrap();
        assert_eq!(daily.calendar.as_ref().unwrap().zone_name(), "UTC");
        assert_eq!(daily.unit, Unit::Day);
        // The resource form spells the zone timeZone.
        let spec = serde_json::json!({
            "domain": "d",
            "descriptors": [{"key": "k", "rateLimit": {"window": "calendar_day", "timeZone": "America/New_York", "requestsPerUnit": 10}}]
        });
        let doc = parse_resource_spec("ns", "p", &spec).unwrap();
        let rule = &compile(vec![doc]).unwrap().rules[0];
        assert_eq!(
            rule.calendar.as_ref().unwrap().zone_name(),
            "America/New_York"
        );
    }

    #[test]
    fn concurrency_is_a_sliding_log_over_its_lease() {
        let text = "domain: d
descriptors:
  - key: api_key
    rate_limit: {algorithm: concurrency, requests_per_unit: 3, lease: 5m}
";
        let policy = compile(parse_str("p.yaml", text).unwrap()).unwrap();
        let rule = &policy.rules[0];
        let limit = rule.limit.unwrap();
        assert_eq!(limit.algorithm, Algorithm::SlidingWindowLog);
        assert_eq!(
            (limit.requests, limit.window),
            (3, 300 * crate::algorithm::SECOND)
        );
        assert_eq!(rule.lease, Some(300 * crate::algorithm::SECOND));
        for (rate_limit, message) in [
            (
                "{algorithm: concurrency, requests_per_unit: 3}",
                "p.yaml:4: 'algorithm: concurrency' needs 'lease'",
            ),
            (
                "{algorithm: concurrency, requests_per_unit: 3, lease: 5m, unit: minute}",
                "p.yaml:4: 'algorithm: concurrency' takes 'lease' (how long a slot is held at most), not 'unit'",
            ),
            (
                "{unit: minute, requests_per_unit: 3, lease: 5m}",
                "p.yaml:4: 'lease' applies only to 'algorithm: concurrency'",
            ),
            (
                "{algorithm: concurrency, requests_per_unit: 3, lease: 5m, burst: 4}",
                "'burst' only applies to token_bucket and leaky_bucket, not concurrency",
            ),
            (
                "{algorithm: concurrency, requests_per_unit: 3, lease: forever}",
                "p.yaml:4: 'lease':",
            ),
        ] {
            let e = rate_limit_errors(rate_limit);
            assert!(e.contains(message), "{rate_limit}: {message:?} in {e}");
        }
        let listed = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {algorithm: concurrency, requests_per_unit: 3, lease: 5m}
";
        assert!(
            errors(listed)
                .starts_with("p.yaml:6: 'algorithm: concurrency' is not allowed in 'rate_limits'"),
            "{}",
            errors(listed)
        );
    }

    #[test]
    fn calendar_windows_refuse_what_they_cannot_count() {
        for (rate_limit, message) in [
            (
                "{window: calendar_day, time_zone: Europe/Atlantis, requests_per_unit: 5}",
                "p.yaml:4: 'time_zone': unknown time zone 'Europe/Atlantis' (expected an IANA name such as Europe/Berlin, America/New_York or UTC)",
            ),
            (
                "{window: calendar_month, requests_per_unit: 5, algorithm: token_bucket}",
                "p.yaml:4: a calendar window (calendar_month) is counted by fixed_window only, not token_bucket: the other algorithms need windows of one length",
            ),
            (
                "{window: calendar_day, requests_per_unit: 5, algorithm: sliding_window_counter}",
                "is counted by fixed_window only, not sliding_window_counter",
            ),
            (
                "{unit: day, time_zone: Europe/Berlin, requests_per_unit: 5}",
                "p.yaml:4: 'time_zone' applies only to a calendar window (window: calendar_day or calendar_month)",
            ),
            (
                "{window: calendar_week, requests_per_unit: 5}",
                "p.yaml:4: 'window': unknown calendar window 'calendar_week' (expected calendar_day or calendar_month)",
            ),
            (
                "{unlimited: true, time_zone: UTC}",
                "should not specify 'time_zone' when 'unlimited' is true",
            ),
        ] {
            let e = rate_limit_errors(rate_limit);
            assert!(e.contains(message), "{rate_limit}: {message:?} in {e}");
        }
        // The same calendar twice in one list is one window twice.
        let twice = "domain: d
descriptors:
  - key: k
    rate_limits:
      - {window: calendar_day, time_zone: Europe/Berlin, requests_per_unit: 5}
      - {window: calendar_day, time_zone: Europe/Berlin, requests_per_unit: 6}
";
        assert_eq!(
            errors(twice),
            "p.yaml:6: 'rate_limits' has two limits with the same window (calendar_day in Europe/Berlin) (first at line 5): one would always decide for the other; keep the smaller"
        );
    }
}
