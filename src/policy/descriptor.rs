//! Converting descriptor trees and their `rate_limit`s (both spellings) into the
//! model, with envoyproxy/ratelimit's checks and Sluice's own.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::algorithm::Algorithm;

use super::duration;
use super::fields::{
    at_line, boolean, flag, integer, list, not_a_string, string, text, Ctx, Field, Fields, Form,
};
use super::model::{DescriptorNode, RateLimit};
use super::node::{shorten, Value};
use super::{Block, Calendar, Layer, Penalty, Period, Sentence, Shed, Unit};

/// Reads a `descriptors` list whose items inherit `layer`. Invalid items are left
/// out after their errors are recorded.
pub(crate) fn descriptors(ctx: &mut Ctx, field: Field<'_>, layer: Layer) -> Vec<DescriptorNode> {
    let Some(items) = list(ctx, field) else {
        return Vec::new();
    };
    let mut out: Vec<DescriptorNode> = Vec::with_capacity(items.len());
    // Where each key/value was first defined at this level.
    let mut seen: HashMap<(String, Option<String>), Option<usize>> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        ctx.path.push((i, None));
        let d = descriptor(ctx, item, layer);
        ctx.path.pop();
        let Some(d) = d else {
            continue;
        };
        match seen.entry((d.key.clone(), d.value.clone())) {
            Entry::Occupied(first) => ctx.error(
                d.line,
                format!(
                    "duplicate descriptor {}{}",
                    describe_path(&d.key, d.value.as_deref()),
                    at_line(*first.get(), "first defined at")
                ),
            ),
            Entry::Vacant(slot) => {
                slot.insert(d.line);
                out.push(d);
            }
        }
    }
    out
}

/// `key 'k' value 'v'` or `key 'k' with no value`, for messages.
pub(crate) fn describe_path(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("key '{}' value '{}'", shorten(key), shorten(v)),
        None => format!("key '{}' with no value", shorten(key)),
    }
}

fn descriptor(ctx: &mut Ctx, node: &super::node::Node, parent: Layer) -> Option<DescriptorNode> {
    let mut f = Fields::open(ctx, node, "descriptor")?;
    let key_field = f.get(ctx, "key");
    // A key that is there but no string has had its error (`string` says why).
    let key_refused = key_field.is_some();
    let key = key_field.and_then(|k| string(ctx, k));
    let value = f
        .get(ctx, "value")
        .and_then(|v| value(ctx, v))
        .filter(|v| !v.is_empty());
    if let (Some(k), Some(here)) = (&key, ctx.path.last_mut()) {
        here.1 = Some(describe_path(k, value.as_deref()));
    }
    let layer = match f.get(ctx, "layer") {
        Some(field) => text(ctx, field).and_then(|s| {
            let layer = parse_layer(&s);
            if layer.is_none() {
                ctx.error(
                    field.line(),
                    format!(
                        "unknown layer '{}' (expected edge, service or tenant)",
                        shorten(&s)
                    ),
                );
            }
            layer
        }),
        None => None,
    }
    .unwrap_or(parent);
    let single = f.get(ctx, "rate_limit");
    let several = f.get(ctx, "rate_limits");
    let (rate_limit, also) = match (single, several) {
        (Some(_), Some(list)) => {
            ctx.error(
                list.key_line,
                format!(
                    "a descriptor takes either '{}' or '{}', not both",
                    ctx.form.spell("rate_limit"),
                    list.name
                ),
            );
            (None, Vec::new())
        }
        (Some(one), None) => (rate_limit(ctx, one), Vec::new()),
        (None, Some(list)) => {
            let mut limits = rate_limits(ctx, list).into_iter();
            (limits.next(), limits.collect())
        }
        (None, None) => (None, Vec::new()),
    };
    let children = match f.get(ctx, "descriptors") {
        Some(field) => descriptors(ctx, field, layer),
        None => Vec::new(),
    };
    let shadow_mode = flag(ctx, &mut f, "shadow_mode");
    let detailed_metric = flag(ctx, &mut f, "detailed_metric");
    let share_threshold = flag(ctx, &mut f, "share_threshold");
    let quota_mode = flag(ctx, &mut f, "quota_mode");
    let value_to_metric = flag(ctx, &mut f, "value_to_metric");
    let sensitive = flag(ctx, &mut f, "sensitive");
    let metadata = match f.get(ctx, "metadata") {
        Some(field) if matches!(field.node.value, Value::Map(_)) => match field.node.to_json() {
            Ok(json) => Some(json),
            Err((line, message)) => {
                ctx.error(line, format!("in '{}': {message}", field.name));
                None
            }
        },
        Some(field) => {
            ctx.error(
                field.line(),
                format!(
                    "'{}' must be a mapping, found {}",
                    field.name,
                    field.node.describe()
                ),
            );
            None
        }
        None => None,
    };
    let line = f.line;
    f.finish(ctx, "descriptor");
    let key = match key {
        Some(k) if !k.is_empty() => k,
        None if key_refused => return None,
        _ => {
            ctx.error(line, "descriptor has an empty or missing 'key'");
            return None;
        }
    };
    Some(DescriptorNode {
        line,
        key,
        value,
        rate_limit,
        also,
        descriptors: children,
        shadow_mode,
        detailed_metric,
        share_threshold,
        quota_mode,
        value_to_metric,
        sensitive,
        metadata,
        layer,
    })
}

/// A descriptor's `value`. The CRD's schema takes a string or an integer
/// (`x-kubernetes-int-or-string`: `value: 8080` is natural for a port or a status
/// code), and the API server keeps an integer as the number kubectl read, served as
/// its decimal digits. So the resource form takes an integer written as those
/// digits, and nothing else that is not a string.
fn value(ctx: &mut Ctx, field: Field<'_>) -> Option<String> {
    if ctx.form == Form::Resource {
        if let Value::Int(i, written) = &field.node.value {
            if i64::try_from(*i).is_ok_and(|i| i.to_string() == *written) {
                return Some(written.clone());
            }
            ctx.error(
                field.line(),
                format!(
                    "'{}': {written} is read as an integer by kubectl and would be served as other digits or refused; quote it: \"{written}\"",
                    field.name
                ),
            );
            return None;
        }
        if let Some(message) = not_a_string(field, "a string or an integer") {
            ctx.error(field.line(), message);
            return None;
        }
    }
    text(ctx, field)
}

fn parse_layer(s: &str) -> Option<Layer> {
    match s {
        "edge" => Some(Layer::Edge),
        "service" => Some(Layer::Service),
        "tenant" => Some(Layer::Tenant),
        _ => None,
    }
}

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

fn rate_limit(ctx: &mut Ctx, field: Field<'_>) -> Option<RateLimit> {
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
        .and_then(|b| integer(ctx, b, 1, max_count(ctx)))
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
            Some(Algorithm::TokenBucket | Algorithm::LeakyBucket) => {}
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
fn rate_limits(ctx: &mut Ctx, field: Field<'_>) -> Vec<RateLimit> {
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
        Some(w) if w.is_multiple_of(crate::algorithm::SECOND) => {
            format!("{}s", w / crate::algorithm::SECOND)
        }
        Some(w) => format!("{w}us"),
        None => "none".to_string(),
    }
}

/// The largest count (`burst`, `violations`, `bans`) a policy may write: the CRD's
/// schema has them as int64, the file form as u64.
fn max_count(ctx: &Ctx) -> i128 {
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

fn duration_field(ctx: &mut Ctx, field: Field<'_>) -> Option<u64> {
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

/// `shed: {from: 0.9}`: `from` a share of the limit strictly between 0 and 1.
fn shed(ctx: &mut Ctx, field: Field<'_>) -> Option<Shed> {
    let mut f = Fields::open_field(ctx, field, "shed")?;
    let from = f.get(ctx, "from");
    let line = f.line;
    f.finish(ctx, "shed");
    let Some(from) = from else {
        ctx.error(
            line,
            "'shed' needs 'from' (the share of the limit where shedding starts, such as 0.9)",
        );
        return None;
    };
    let value = match from.node.value {
        Value::Float(v, _) => v,
        Value::Int(v, _) => v as f64,
        _ => {
            ctx.error(
                from.line(),
                format!(
                    "'from' must be a number between 0 and 1, found {}",
                    from.node.describe()
                ),
            );
            return None;
        }
    };
    if !(value > 0.0 && value < 1.0) {
        ctx.error(
            from.line(),
            format!("'from' must be above 0 and below 1 (a share of the limit), found {value}"),
        );
        return None;
    }
    Some(Shed { from: value })
}

fn penalty(ctx: &mut Ctx, field: Field<'_>) -> Option<Penalty> {
    let mut f = Fields::open_field(ctx, field, "penalty")?;
    let violations = f.get(ctx, "violations");
    let within = f.get(ctx, "within");
    let ban = f.get(ctx, "ban");
    let tighten_field = f.get(ctx, "tighten");
    let block_field = f.get(ctx, "block");
    let line = f.line;
    f.finish(ctx, "penalty");
    for (present, name) in [(violations, "violations"), (within, "within")] {
        if present.is_none() {
            ctx.error(line, format!("'penalty' needs '{name}'"));
        }
    }
    let violations = violations
        .and_then(|v| integer(ctx, v, 1, max_count(ctx)))
        .and_then(|v| u64::try_from(v).ok());
    let within = within.and_then(|w| duration_field(ctx, w));
    let sentence = match (ban, tighten_field) {
        (Some(b), None) => duration_field(ctx, b).map(Sentence::Ban),
        (None, Some(t)) => tighten(ctx, t),
        (Some(_), Some(t)) => {
            ctx.error(
                t.key_line,
                "'penalty' takes either 'ban' or 'tighten', not both",
            );
            None
        }
        (None, None) => {
            ctx.error(
                line,
                "'penalty' needs 'ban' (a duration) or 'tighten' ({factor, for})",
            );
            None
        }
    };
    let block = match block_field {
        Some(b) => Some(block(ctx, b)?),
        None => None,
    };
    Some(Penalty {
        violations: violations?,
        within: within?,
        sentence: sentence?,
        block,
    })
}

/// `tighten: {factor: 0.1, for: 10m}`: `factor` strictly between 0 and 1.
fn tighten(ctx: &mut Ctx, field: Field<'_>) -> Option<Sentence> {
    let mut f = Fields::open_field(ctx, field, "tighten")?;
    let factor = f.get(ctx, "factor");
    let span = f.get(ctx, "for");
    let line = f.line;
    f.finish(ctx, "tighten");
    if factor.is_none() {
        ctx.error(line, "'tighten' needs 'factor' (such as 0.1)");
    }
    if span.is_none() {
        ctx.error(line, "'tighten' needs 'for' (a duration such as 10m)");
    }
    let span = span.and_then(|s| duration_field(ctx, s));
    let factor = factor?;
    let value = match factor.node.value {
        Value::Float(v, _) => v,
        Value::Int(v, _) => v as f64,
        _ => {
            ctx.error(
                factor.line(),
                format!(
                    "'factor' must be a number between 0 and 1, found {}",
                    factor.node.describe()
                ),
            );
            return None;
        }
    };
    let factor_ppm = (value * 1_000_000.0).round();
    if !(value > 0.0 && value < 1.0 && (1.0..1_000_000.0).contains(&factor_ppm)) {
        ctx.error(
            factor.line(),
            format!(
                "'factor' must be above 0 and below 1 (it scales the limit down), found {value}"
            ),
        );
        return None;
    }
    Some(Sentence::Tighten {
        factor_ppm: factor_ppm as u32,
        span: span?,
    })
}

/// `block: {bans: 3, within: 1h, for: 24h}`.
fn block(ctx: &mut Ctx, field: Field<'_>) -> Option<Block> {
    let mut f = Fields::open_field(ctx, field, "block")?;
    let bans = f.get(ctx, "bans");
    let within = f.get(ctx, "within");
    let span = f.get(ctx, "for");
    let line = f.line;
    f.finish(ctx, "block");
    for (present, name) in [(bans, "bans"), (within, "within"), (span, "for")] {
        if present.is_none() {
            ctx.error(line, format!("'block' needs '{name}'"));
        }
    }
    let bans = bans
        .and_then(|v| integer(ctx, v, 1, max_count(ctx)))
        .and_then(|v| u64::try_from(v).ok());
    let within = within.and_then(|w| duration_field(ctx, w));
    let span = span.and_then(|s| duration_field(ctx, s));
    Some(Block {
        bans: bans?,
        within: within?,
        span: span?,
    })
}

#[cfg(test)]
mod tests {
    use crate::algorithm::Algorithm;
    use crate::policy::{compile, parse_resource_spec, parse_str, Period, Shed, Unit};

    fn shed_of(rate_limit: &str) -> Result<Option<Shed>, String> {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n");
        match parse_str("p.yaml", &text) {
            Ok(docs) => Ok(compile(docs).unwrap().rules[0].shed),
            Err(e) => Err(e
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")),
        }
    }

    fn penalty_of(penalty: &str) -> Result<Option<crate::policy::Penalty>, String> {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 10, penalty: {penalty}}}\n"
        );
        match parse_str("p.yaml", &text) {
            Ok(docs) => Ok(compile(docs).unwrap().rules[0].penalty),
            Err(e) => Err(e
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")),
        }
    }

    #[test]
    fn penalty_reads_ban_tighten_and_block() {
        use crate::algorithm::SECOND;
        use crate::policy::{Block, Sentence};
        let p = penalty_of("{violations: 3, within: 1m, ban: 10m}")
            .unwrap()
            .unwrap();
        assert_eq!(p.sentence, Sentence::Ban(600 * SECOND));
        assert_eq!(p.block, None);
        let p = penalty_of(
            "{violations: 3, within: 1m, tighten: {factor: 0.25, for: 5m}, block: {bans: 3, within: 1h, for: 24h}}",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            p.sentence,
            Sentence::Tighten {
                factor_ppm: 250_000,
                span: 300 * SECOND
            }
        );
        assert_eq!(
            p.block,
            Some(Block {
                bans: 3,
                within: 3_600 * SECOND,
                span: 86_400 * SECOND
            })
        );
    }

    #[test]
    fn penalty_refuses_what_is_not_one_sentence_or_not_a_factor() {
        for (penalty, message) in [
            (
                "{violations: 3, within: 1m}",
                "needs 'ban' (a duration) or 'tighten'",
            ),
            (
                "{violations: 3, within: 1m, ban: 1m, tighten: {factor: 0.5, for: 1m}}",
                "either 'ban' or 'tighten', not both",
            ),
            (
                "{violations: 3, within: 1m, tighten: {factor: 1, for: 1m}}",
                "above 0 and below 1",
            ),
            (
                "{violations: 3, within: 1m, tighten: {factor: 0, for: 1m}}",
                "above 0 and below 1",
            ),
            (
                "{violations: 3, within: 1m, tighten: {factor: high, for: 1m}}",
                "must be a number",
            ),
            (
                "{violations: 3, within: 1m, tighten: {factor: 0.5}}",
                "'tighten' needs 'for'",
            ),
            (
                "{violations: 3, within: 1m, ban: 1m, block: {bans: 2, for: 1h}}",
                "'block' needs 'within'",
            ),
            (
                "{violations: 3, within: 1m, ban: 1m, block: {bans: 0, within: 1h, for: 1h}}",
                "'bans'",
            ),
            (
                "{violations: 3, within: 1m, ban: 1m, block: {bans: 2, within: 1h, for: 1h, x: 1}}",
                "'x'",
            ),
        ] {
            let err = penalty_of(penalty).expect_err(penalty);
            assert!(err.contains(message), "{penalty}: {err}");
        }
    }

    #[test]
    fn shed_reads_from_and_refuses_what_is_no_share_of_the_limit() {
        assert_eq!(
            shed_of("{unit: second, requests_per_unit: 10, shed: {from: 0.9}}"),
            Ok(Some(Shed { from: 0.9 }))
        );
        assert_eq!(shed_of("{unit: second, requests_per_unit: 10}"), Ok(None));
        for (rate_limit, message) in [
            (
                "{unit: second, requests_per_unit: 10, shed: {}}",
                "p.yaml:4: 'shed' needs 'from'",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: 1}}",
                "p.yaml:4: 'from' must be above 0 and below 1 (a share of the limit), found 1",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: 0}}",
                "'from' must be above 0 and below 1",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: 1.5}}",
                "found 1.5",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: '90%'}}",
                "'from' must be a number between 0 and 1, found the string '90%'",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: 0.9, to: 1}}",
                "unknown field 'to' in shed",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: 0.9}",
                "shed must be a mapping, found the number 0.9",
            ),
            (
                "{unlimited: true, shed: {from: 0.9}}",
                "should not specify 'shed' when 'unlimited' is true",
            ),
        ] {
            let e = shed_of(rate_limit).unwrap_err();
            assert!(e.contains(message), "{rate_limit}: {message:?} in {e}");
        }
    }

    #[test]
    fn shed_in_the_resource_form() {
        let spec = serde_json::json!({
            "domain": "d",
            "descriptors": [{"key": "k", "rateLimit": {"unit": "second", "requestsPerUnit": 10, "shed": {"from": 0.75}}}]
        });
        let doc = parse_resource_spec("ns", "p", &spec).unwrap();
        assert_eq!(
            compile(vec![doc]).unwrap().rules[0].shed,
            Some(Shed { from: 0.75 })
        );
    }

    #[test]
    fn shed_probability_rises_linearly_from_from_to_the_limit() {
        let shed = Shed { from: 0.8 };
        assert_eq!(shed.probability(0, 100), 0.0);
        assert_eq!(shed.probability(80, 100), 0.0);
        assert!((shed.probability(90, 100) - 0.5).abs() < 1e-9);
        assert_eq!(shed.probability(100, 100), 1.0);
        assert_eq!(shed.probability(0, 0), 0.0);
    }

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

    /// The errors of a RateLimitPolicy whose one descriptor (line 7) is `descriptor`.
    fn resource_errors(descriptor: &str) -> String {
        errors(&format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: p}}\nspec:\n  domain: d\n  descriptors:\n    - {descriptor}\n"
        ))
    }

    /// A RateLimitPolicy refuses what the CRD's schema refuses, so `sluice validate`
    /// predicts `kubectl apply`: booleans and numbers where the schema wants a string
    /// (kubectl's YAML reader types plain scalars), unit spellings outside the
    /// schema's enum, durations with spaces around them, windows past its maxLength,
    /// counts past int64.
    #[test]
    fn resource_form_refuses_what_the_crd_schema_refuses() {
        for (descriptor, message) in [
            (
                "{key: on}",
                "p.yaml:7: 'key': on is read as a boolean by kubectl; quote it: \"on\"",
            ),
            (
                "{key: n}",
                "p.yaml:7: 'key': n is read as a boolean by kubectl; quote it: \"n\"",
            ),
            (
                "{key: 42}",
                "p.yaml:7: 'key': 42 is read as an integer by kubectl; quote it: \"42\"",
            ),
            (
                "{key: k, value: true}",
                "p.yaml:7: 'value': true is read as a boolean by kubectl; quote it: \"true\"",
            ),
            (
                "{key: k, value: 1.5}",
                "p.yaml:7: 'value': 1.5 is read as a number by kubectl; quote it: \"1.5\"",
            ),
            (
                "{key: k, value: 0x1F}",
                "p.yaml:7: 'value': 0x1F is read as an integer by kubectl and would be served as other digits or refused; quote it: \"0x1F\"",
            ),
            (
                "{key: k, value: 010}",
                "p.yaml:7: 'value': 010 is read as an integer by kubectl",
            ),
            (
                "{key: k, rateLimit: {unit: Minute, requestsPerUnit: 5}}",
                "p.yaml:7: rate limit unit 'Minute' must be all lowercase or all uppercase in a RateLimitPolicy (minute or MINUTE), as its schema lists them",
            ),
            (
                "{key: k, rateLimit: {window: ' 10s', requestsPerUnit: 5}}",
                "p.yaml:7: 'window': ' 10s' has spaces around it, which a RateLimitPolicy's schema refuses; write '10s'",
            ),
            (
                "{key: k, rateLimit: {window: 'calendar_day ', requestsPerUnit: 5}}",
                "p.yaml:7: 'window': 'calendar_day ' has spaces around it",
            ),
            (
                "{key: k, rateLimit: {window: 1s1s1s1s1s1s1s1s1s1s1s1s1s1s1s1s1s, requestsPerUnit: 5}}",
                "p.yaml:7: 'window' is 34 characters long; a RateLimitPolicy's schema allows at most 32",
            ),
            (
                "{key: k, rateLimit: {algorithm: concurrency, lease: '5m ', requestsPerUnit: 5}}",
                "p.yaml:7: 'lease': '5m ' has spaces around it",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 5, penalty: {violations: 3, within: ' 1m', ban: 1m}}}",
                "p.yaml:7: 'within': ' 1m' has spaces around it",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 5, algorithm: token_bucket, burst: 9223372036854775808}}",
                "p.yaml:7: 'burst' must be at most 9223372036854775807, found 9223372036854775808",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 010}}",
                "p.yaml:7: 'requestsPerUnit': 010 has a leading zero, which kubectl reads as an octal number; write it without",
            ),
            (
                "{key: 1_000}",
                "p.yaml:7: 'key': 1_000 is read as an integer by kubectl; quote it: \"1_000\"",
            ),
            (
                "{key: k, value: 1_000}",
                "p.yaml:7: 'value': 1_000 is read as an integer by kubectl and would be served as other digits",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 5, name: 7}}",
                "p.yaml:7: 'name': 7 is read as an integer by kubectl; quote it: \"7\"",
            ),
            (
                "{key: k, rateLimit: {unit: second, requestsPerUnit: 5, replaces: [{name: yes}]}}",
                "p.yaml:7: 'name': yes is read as a boolean by kubectl; quote it: \"yes\"",
            ),
            (
                "{key: k, rateLimit: {window: calendar_day, timeZone: 1, requestsPerUnit: 5}}",
                "p.yaml:7: 'timeZone': 1 is read as an integer by kubectl; quote it: \"1\"",
            ),
        ] {
            let e = resource_errors(descriptor);
            assert!(e.starts_with(message), "{descriptor}:\n  {message}\nnot in\n  {e}");
        }
        // The key's one error says why; no second one calls it missing.
        assert_eq!(
            resource_errors("{key: on}"),
            "p.yaml:7: 'key': on is read as a boolean by kubectl; quote it: \"on\""
        );
        let e = errors(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: p}\nspec:\n  domain: 42\n",
        );
        assert!(
            e.starts_with("p.yaml:5: 'domain': 42 is read as an integer by kubectl; quote it"),
            "{e}"
        );
        let e = errors(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: p, namespace: off}\nspec: {domain: d}\n",
        );
        assert!(e.contains("'namespace': off is read as a boolean"), "{e}");
    }

    /// What the schema takes, the resource form takes: a value written as an
    /// integer (served as its digits), quoted text, a unit in lowercase or
    /// uppercase, a window of exactly the schema's maxLength.
    #[test]
    fn resource_form_takes_what_the_crd_schema_takes() {
        let doc = |descriptor: &str| {
            let text = format!(
                "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: p}}\nspec:\n  domain: d\n  descriptors:\n    - {descriptor}\n"
            );
            let mut docs =
                parse_str("p.yaml", &text).unwrap_or_else(|e| panic!("{descriptor}: {e:?}"));
            docs.remove(0).descriptors.remove(0)
        };
        assert_eq!(
            doc("{key: port, value: 8080}").value.as_deref(),
            Some("8080")
        );
        assert_eq!(doc("{key: code, value: -1}").value.as_deref(), Some("-1"));
        assert_eq!(doc("{key: 'on', value: 'true'}").key, "on");
        assert_eq!(
            doc("{key: k, value: '0x1F'}").value.as_deref(),
            Some("0x1F")
        );
        let d = doc("{key: k, rateLimit: {unit: second, requestsPerUnit: 1_000}}");
        assert_eq!(d.rate_limit.unwrap().requests_per_unit, 1000);
        for unit in ["minute", "MINUTE"] {
            let d = doc(&format!(
                "{{key: k, rateLimit: {{unit: {unit}, requestsPerUnit: 5}}}}"
            ));
            assert_eq!(d.rate_limit.unwrap().unit, Some(Unit::Minute));
        }
        let d = doc(&format!(
            "{{key: k, rateLimit: {{window: {}, requestsPerUnit: 5}}}}",
            "1s".repeat(16)
        ));
        assert_eq!(
            d.rate_limit.unwrap().window,
            Some(16 * crate::algorithm::SECOND)
        );
        // From the API server (JSON): an integer value is the integer's digits; a
        // boolean where a string belongs is named as such (below the schema's depth
        // the API server checks nothing, so sluice does).
        let spec =
            serde_json::json!({"domain": "d", "descriptors": [{"key": "port", "value": 8080}]});
        let parsed = parse_resource_spec("ns", "p", &spec).unwrap();
        assert_eq!(parsed.descriptors[0].value.as_deref(), Some("8080"));
        let spec = serde_json::json!({"domain": "d", "descriptors": [{"key": true, "value": 1.5}]});
        let e = parse_resource_spec("ns", "p", &spec).unwrap_err();
        let e: Vec<_> = e.iter().map(|e| e.message.as_str()).collect();
        assert!(
            e.contains(&"at descriptors[0]: 'key' must be a string, found the boolean true"),
            "{e:?}"
        );
        assert!(
            e.contains(
                &"at descriptors[0]: 'value' must be a string or an integer, found the number 1.5"
            ),
            "{e:?}"
        );
    }

    /// An object has no lines: its errors say which descriptor, by place and key, as
    /// a file's say by line.
    #[test]
    fn resource_errors_name_the_descriptor_path() {
        let spec = serde_json::json!({"domain": "d", "descriptors": [
            {"key": "a", "rateLimit": {"unit": "second", "requestsPerUnit": 1}},
            {"key": "b", "descriptors": [
                {"key": "c", "value": "x", "rateLimit": {"unit": "second", "requestsPerUnit": 1, "burst": 0}}
            ]}
        ]});
        let e = parse_resource_spec("ns", "p", &spec).unwrap_err();
        assert!(
            e[0].message
                .starts_with("at descriptors[1].descriptors[0] (key 'c' value 'x'): "),
            "{e:?}"
        );
        // A file's errors keep their line alone.
        let file = "domain: d\ndescriptors:\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}\n";
        let e = parse_str("f.yaml", file).unwrap_err();
        assert!(!e[0].message.starts_with("at "), "{e:?}");
        assert_eq!(e[0].line, Some(4));
    }

    /// The file form (envoyproxy/ratelimit's) keeps reading what that service reads:
    /// any scalar as text, units in any case, durations with spaces around them.
    #[test]
    fn file_form_keeps_its_leniency() {
        let text = "domain: d
descriptors:
  - key: on
    value: 0x1F
    rate_limit: {unit: Minute, requests_per_unit: 5}
  - key: k
    value: 1.5
    rate_limit: {window: ' 10s', requests_per_unit: 5, name: 7}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 9223372036854775808}
";
        let docs = parse_str("p.yaml", text).unwrap_or_else(|e| panic!("{e:?}"));
        let d = &docs[0].descriptors;
        assert_eq!(
            (d[0].key.as_str(), d[0].value.as_deref()),
            ("on", Some("0x1F"))
        );
        assert_eq!(d[0].rate_limit.as_ref().unwrap().unit, Some(Unit::Minute));
        assert_eq!(d[1].value.as_deref(), Some("1.5"));
        let rl = d[1].rate_limit.as_ref().unwrap();
        assert_eq!(
            (rl.window, rl.name.as_deref()),
            (Some(10 * crate::algorithm::SECOND), Some("7"))
        );
        assert_eq!(d[2].rate_limit.as_ref().unwrap().burst, Some(1 << 63));
    }

    /// Both forms read an integer as its YAML 1.1 reader does where the readings can
    /// agree (`5.0` and `1e3` are 5 and 1000, `0x10` is 16) and refuse a leading zero,
    /// which that reader takes for octal.
    #[test]
    fn integers_read_as_kubectl_and_envoyproxy_ratelimit_read_them() {
        let count = |text: String| {
            parse_str("p.yaml", &text)
                .map(|mut d| d.remove(0).descriptors.remove(0).rate_limit.unwrap())
                .map(|rate_limit| rate_limit.requests_per_unit)
                .map_err(|e| e[0].to_string())
        };
        let file = |n: &str| {
            count(format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: {n}}}\n"
            ))
        };
        let resource = |n: &str| {
            count(format!(
                "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: p}}\nspec:\n  domain: d\n  descriptors:\n    - {{key: k, rateLimit: {{unit: second, requestsPerUnit: {n}}}}}\n"
            ))
        };
        for (n, want) in [("5", 5), ("5.0", 5), ("1e3", 1000), ("0x10", 16), ("0", 0)] {
            assert_eq!(file(n), Ok(want), "{n}");
            assert_eq!(resource(n), Ok(want), "{n}");
        }
        assert_eq!(
            file("010"),
            Err("p.yaml:4: 'requests_per_unit': 010 has a leading zero, which envoyproxy/ratelimit reads as an octal number; write it without".into())
        );
        assert!(resource("010")
            .unwrap_err()
            .contains("which kubectl reads as an octal number"));
        for n in [
            "5.5",
            "1e30",
            ".inf",
            ".nan",
            "0.99999999999999999",
            "4.0000000000000000001",
            "1e-400",
            "1e-99999999999999999999",
        ] {
            let want = format!("'requests_per_unit' must be an integer, found the number {n}");
            assert!(file(n).unwrap_err().ends_with(&want), "{n}: {:?}", file(n));
            assert!(
                resource(n).unwrap_err().contains("must be an integer"),
                "{n}"
            );
        }
    }

    /// The errors of a policy whose one descriptor has `rate_limit` (line 4).
    fn rate_limit_errors(rate_limit: &str) -> String {
        errors(&format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n"
        ))
    }

    fn errors(text: &str) -> String {
        match parse_str("p.yaml", text) {
            Ok(_) => String::new(),
            Err(e) => e
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        }
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
