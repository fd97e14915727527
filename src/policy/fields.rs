//! Reading mappings field by field with precise errors: wrong types, duplicate and
//! non-string keys, and unknown fields (with a "did you mean" hint). Field names are
//! given in snake_case and spelled in camelCase for resources.

use std::collections::HashMap;

use super::node::{shorten, Node, Value};
use super::PolicyError;

/// The spelling of field names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// envoyproxy/ratelimit files: snake_case.
    File,
    /// RateLimitPolicy `spec`: camelCase.
    Resource,
}

impl Form {
    /// `snake` as spelled in this form.
    pub(crate) fn spell(self, snake: &str) -> String {
        match self {
            Form::File => snake.to_string(),
            Form::Resource => {
                let mut out = String::with_capacity(snake.len());
                let mut upper = false;
                for c in snake.chars() {
                    if c == '_' {
                        upper = true;
                    } else if upper {
                        out.extend(c.to_uppercase());
                        upper = false;
                    } else {
                        out.push(c);
                    }
                }
                out
            }
        }
    }
}

/// Errors found so far in one source.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub source: String,
    pub form: Form,
    pub errors: Vec<PolicyError>,
    /// The descriptor being read: its index at each level, and its key and value
    /// once read. An error without a line (a Kubernetes object's or an xDS config's)
    /// says where it is by this path instead.
    pub path: Vec<(usize, Option<String>)>,
}

impl Ctx {
    pub(crate) fn new(source: &str, form: Form) -> Ctx {
        Ctx {
            source: source.to_string(),
            form,
            errors: Vec::new(),
            path: Vec::new(),
        }
    }

    pub(crate) fn error(&mut self, line: Option<usize>, message: impl Into<String>) {
        let mut message = message.into();
        if line.is_none() && !self.path.is_empty() {
            message = format!("at {}: {message}", self.location());
        }
        self.errors.push(PolicyError {
            file: self.source.clone(),
            line,
            message,
        });
    }

    /// `descriptors[0].descriptors[2] (key 'path' value '/a')`.
    pub(crate) fn location(&self) -> String {
        let list = self.form.spell("descriptors");
        let steps: Vec<String> = self
            .path
            .iter()
            .map(|(i, _)| format!("{list}[{i}]"))
            .collect();
        let mut text = steps.join(".");
        if let Some((_, Some(what))) = self.path.last() {
            text.push_str(&format!(" ({what})"));
        }
        text
    }
}

/// A field that was present (and not null).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field<'n> {
    /// The name as written in the document.
    pub name: &'n str,
    /// Line of the key.
    pub key_line: Option<usize>,
    pub node: &'n Node,
}

impl Field<'_> {
    /// Line of the value, falling back to the key's.
    pub(crate) fn line(&self) -> Option<usize> {
        self.node.line.or(self.key_line)
    }
}

/// A mapping being read. Every field read is remembered; [`Fields::finish`] reports
/// the others as unknown.
pub(crate) struct Fields<'n> {
    pub line: Option<usize>,
    entries: Vec<(Field<'n>, bool)>,
    asked: Vec<String>,
}

impl<'n> Fields<'n> {
    /// Opens `node` as the mapping `what` (for messages); `None` after an error when
    /// it is not a mapping.
    pub(crate) fn open(ctx: &mut Ctx, node: &'n Node, what: &str) -> Option<Fields<'n>> {
        let Value::Map(map) = &node.value else {
            ctx.error(
                node.line,
                format!("{what} must be a mapping, found {}", node.describe()),
            );
            return None;
        };
        let mut entries: Vec<(Field<'n>, bool)> = Vec::with_capacity(map.len());
        let mut seen: HashMap<&'n str, Option<usize>> = HashMap::with_capacity(map.len());
        for (key, value) in map {
            let Value::Str(name) = &key.value else {
                ctx.error(
                    key.line,
                    format!("key {} in {what} is not a string", key_text(key)),
                );
                continue;
            };
            if let Some(first) = seen.get(name.as_str()) {
                ctx.error(
                    key.line,
                    format!(
                        "duplicate key '{}' in {what}{}",
                        shorten(name),
                        at_line(*first, "first at")
                    ),
                );
                continue;
            }
            seen.insert(name, key.line);
            let field = Field {
                name,
                key_line: key.line,
                node: value,
            };
            entries.push((field, false));
        }
        Some(Fields {
            line: node.line,
            entries,
            asked: Vec::new(),
        })
    }

    /// Opens a field's value as the mapping `what`; problems with the mapping as a
    /// whole (missing fields) are then reported at the field's key.
    pub(crate) fn open_field(ctx: &mut Ctx, field: Field<'n>, what: &str) -> Option<Fields<'n>> {
        let mut fields = Fields::open(ctx, field.node, what)?;
        fields.line = field.key_line.or(fields.line);
        Some(fields)
    }

    /// The field `snake` (spelled for the form); `None` when absent or null.
    pub(crate) fn get(&mut self, ctx: &Ctx, snake: &str) -> Option<Field<'n>> {
        let name = ctx.form.spell(snake);
        let found = self.entries.iter_mut().find(|(f, _)| f.name == name);
        self.asked.push(name);
        let (field, used) = found?;
        *used = true;
        if field.node.value == Value::Null {
            return None;
        }
        Some(*field)
    }

    /// Accepts a field without reading it.
    pub(crate) fn ignore(&mut self, ctx: &Ctx, snake: &str) {
        let _ = self.get(ctx, snake);
    }

    /// Reports every field not read as unknown.
    pub(crate) fn finish(self, ctx: &mut Ctx, what: &str) {
        for (field, used) in &self.entries {
            if *used {
                continue;
            }
            let hint = self
                .asked
                .iter()
                .find(|known| normalize(known) == normalize(field.name))
                .map(|known| format!(" (did you mean '{known}'?)"))
                .unwrap_or_default();
            ctx.error(
                field.key_line,
                format!("unknown field '{}' in {what}{hint}", shorten(field.name)),
            );
        }
    }
}

fn normalize(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

fn key_text(key: &Node) -> String {
    match key.scalar_text() {
        Some(t) => format!("'{}'", shorten(t)),
        None => key.describe(),
    }
}

/// " (first at line N)" or nothing when the line is unknown.
pub(crate) fn at_line(line: Option<usize>, words: &str) -> String {
    match line {
        Some(l) => format!(" ({words} line {l})"),
        None => String::new(),
    }
}

/// A string field. The file form takes any scalar as written (`value: 8080` is the
/// text "8080", as in envoyproxy/ratelimit). The resource form takes strings only,
/// as the CRD's schema does: kubectl reads a plain `on`, `42` or `1.5` as a boolean
/// or a number, and the API server refuses it where the schema wants a string.
/// Empty strings come back empty.
pub(crate) fn string(ctx: &mut Ctx, field: Field<'_>) -> Option<String> {
    if ctx.form == Form::Resource {
        if let Some(message) = not_a_string(field, "a string") {
            ctx.error(field.line(), message);
            return None;
        }
    }
    text(ctx, field)
}

/// Why a boolean or a number is refused where the resource form wants `wants` (a
/// string, or a string or an integer); `None` for anything else (strings, and what
/// is no scalar, left to [`text`]'s message).
pub(crate) fn not_a_string(field: Field<'_>, wants: &str) -> Option<String> {
    let (written, what) = match &field.node.value {
        Value::Bool(_, t) => (t, "a boolean"),
        Value::Int(_, t) => (t, "an integer"),
        Value::Float(_, t) => (t, "a number"),
        Value::Null | Value::Str(_) | Value::Seq(_) | Value::Map(_) => return None,
    };
    // A spec from the API server (JSON, no lines) was typed by whoever wrote it;
    // YAML was typed by the reader, and quoting keeps the text.
    Some(if field.node.line.is_some() {
        format!(
            "'{}': {written} is read as {what} by kubectl; quote it: \"{written}\"",
            field.name
        )
    } else {
        format!(
            "'{}' must be {wants}, found {}",
            field.name,
            field.node.describe()
        )
    })
}

/// Any scalar's text, as written, in both forms: for fields whose own check (a list
/// of words, a duration) refuses whatever is not one of its words anyway, with a
/// message that says more than "not a string". Empty strings come back empty.
pub(crate) fn text(ctx: &mut Ctx, field: Field<'_>) -> Option<String> {
    match field.node.scalar_text() {
        Some(text) => Some(text.to_string()),
        None => {
            ctx.error(
                field.line(),
                format!(
                    "'{}' must be a string, found {}",
                    field.name,
                    field.node.describe()
                ),
            );
            None
        }
    }
}

/// A boolean field.
pub(crate) fn boolean(ctx: &mut Ctx, field: Field<'_>) -> Option<bool> {
    match field.node.value {
        Value::Bool(b, _) => Some(b),
        _ => {
            ctx.error(
                field.line(),
                format!(
                    "'{}' must be true or false, found {}",
                    field.name,
                    field.node.describe()
                ),
            );
            None
        }
    }
}

/// A boolean field that defaults to false.
pub(crate) fn flag(ctx: &mut Ctx, fields: &mut Fields<'_>, snake: &str) -> bool {
    fields
        .get(ctx, snake)
        .and_then(|f| boolean(ctx, f))
        .unwrap_or(false)
}

/// An integer field within `min..=max`.
///
/// A decimal with a leading zero (`010`) is refused: the YAML 1.1 readers of
/// kubectl and envoyproxy/ratelimit (go-yaml v2) take it for octal (8), so reading
/// 10 would count by another number than the API server stores or the file meant
/// under envoyproxy/ratelimit. A number with a zero fraction (`5.0`, `1e3`) is the
/// integer it names, as the API server and go-yaml v2 read it.
pub(crate) fn integer(ctx: &mut Ctx, field: Field<'_>, min: i128, max: i128) -> Option<i128> {
    let value = match &field.node.value {
        Value::Int(_, written) if leading_zero(written) => {
            let reader = match ctx.form {
                Form::Resource => "kubectl",
                Form::File => "envoyproxy/ratelimit",
            };
            ctx.error(
                field.line(),
                format!(
                    "'{}': {written} has a leading zero, which {reader} reads as an octal number; write it without",
                    field.name
                ),
            );
            return None;
        }
        Value::Int(value, _) => *value,
        // 2^53: beyond it a float no longer names one integer. The written digits
        // decide, not the rounded f64: `0.99999999999999999` rounds to 1.0 but is
        // no integer.
        Value::Float(f, written)
            if f.fract() == 0.0
                && f.abs() <= 9_007_199_254_740_992.0
                && names_an_integer(written) =>
        {
            *f as i128
        }
        _ => {
            ctx.error(
                field.line(),
                format!(
                    "'{}' must be an integer, found {}",
                    field.name,
                    field.node.describe()
                ),
            );
            return None;
        }
    };
    if value < min {
        let what = if min == 0 { "negative" } else { "below" };
        let bound = if min == 0 {
            String::new()
        } else {
            format!(" {min}")
        };
        ctx.error(
            field.line(),
            format!("'{}' must not be {what}{bound}, found {value}", field.name),
        );
        return None;
    }
    if value > max {
        ctx.error(
            field.line(),
            format!("'{}' must be at most {max}, found {value}", field.name),
        );
        return None;
    }
    Some(value)
}

/// Whether a decimal number as written (`5.0`, `1.5e1`, `-2E+3`) is exactly an
/// integer: every digit after the point is zero once the exponent has moved it.
/// Text that is not such a number (`.inf`, a tagged integer) is left to the value.
fn names_an_integer(written: &str) -> bool {
    let text = written.replace('_', "");
    let body = text.trim_start_matches(['-', '+']);
    let (mantissa, exponent) = match body.split_once(['e', 'E']) {
        Some((m, e)) => match exponent_of(e) {
            Some(e) => (m, e),
            None => return true,
        },
        None => (body, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if !whole
        .chars()
        .chain(fraction.chars())
        .all(|c| c.is_ascii_digit())
    {
        return true;
    }
    // The number is DIGITS x 10^scale: an integer when the digits end in at least
    // -scale zeros (or are all zeros).
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_end_matches('0');
    if significant.trim_start_matches('0').is_empty() {
        return true;
    }
    // In i128, where an i64 exponent less the length of a string cannot overflow.
    let trailing_zeros = (digits.len() - significant.len()) as i128;
    i128::from(exponent) - fraction.len() as i128 + trailing_zeros >= 0
}

/// The exponent of a decimal as written (`3`, `+3`, `-03`), held at `i64::MIN` or
/// `i64::MAX` when it is beyond them: a number of that exponent is written in far
/// fewer digits, so it is still an integer (or not) as with the exponent itself.
/// `None` for text that is not an exponent.
fn exponent_of(written: &str) -> Option<i64> {
    let digits = written.strip_prefix(['-', '+']).unwrap_or(written);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let beyond = if written.starts_with('-') {
        i64::MIN
    } else {
        i64::MAX
    };
    Some(written.parse::<i64>().unwrap_or(beyond))
}

/// Whether a plain integer's digits start with a zero followed by another digit.
fn leading_zero(written: &str) -> bool {
    // go-yaml v2 drops `_` separators before it reads the digits.
    let mut digits = written
        .trim_start_matches(['-', '+'])
        .bytes()
        .filter(|b| *b != b'_');
    digits.next() == Some(b'0') && digits.next().is_some_and(|b| b.is_ascii_digit())
}

/// A list field.
pub(crate) fn list<'n>(ctx: &mut Ctx, field: Field<'n>) -> Option<&'n [Node]> {
    match &field.node.value {
        Value::Seq(items) => Some(items),
        _ => {
            ctx.error(
                field.line(),
                format!(
                    "'{}' must be a list, found {}",
                    field.name,
                    field.node.describe()
                ),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    #[test]
    fn camel_case_spelling() {
        assert_eq!(Form::Resource.spell("requests_per_unit"), "requestsPerUnit");
        assert_eq!(Form::Resource.spell("key"), "key");
        assert_eq!(Form::File.spell("rate_limit"), "rate_limit");
    }

    #[test]
    fn normalize_ignores_case_and_separators() {
        assert_eq!(normalize("requestsperunit"), normalize("requests_per_unit"));
        assert_eq!(normalize("rateLimit"), normalize("rate_limit"));
    }

    /// A float is an integer by its written digits, never by the f64 it rounds to.
    #[test]
    fn names_an_integer_reads_the_digits() {
        for yes in [
            "5.0", "5.", "1e3", "1.5e1", "10e-1", "-2E+3", "0.0", "0e-9", "1_000.0",
        ] {
            assert!(names_an_integer(yes), "{yes}");
        }
        for no in [
            "1.5",
            "0.99999999999999999",
            "5.000000000000000001",
            "15e-1",
            "1e-1",
        ] {
            assert!(!names_an_integer(no), "{no}");
        }
    }

    /// Exponents beyond i64 read as what they are: a huge positive one makes any
    /// number an integer, a huge negative one makes any number but zero a fraction.
    #[test]
    fn names_an_integer_reads_exponents_beyond_i64() {
        for yes in [
            "10e9223372036854775807",
            "1e9999999999999999999",
            "1.5e99999999999999999999999",
            "0e-9999999999999999999",
            "0.000e-9223372036854775809",
        ] {
            assert!(names_an_integer(yes), "{yes}");
        }
        for no in [
            "1e-9223372036854775808",
            "1e-9999999999999999999",
            "10e-99999999999999999999999",
            "0.5e-9223372036854775809",
        ] {
            assert!(!names_an_integer(no), "{no}");
        }
    }

    /// The digits of `written` (a decimal as `names_an_integer` takes it) name an
    /// integer: no digit other than 0 is left after the point once the exponent has
    /// moved it. Read digit by digit, the exponent only compared, never added.
    fn integer_by_digits(written: &str) -> bool {
        let text = written.replace('_', "");
        let body = text.trim_start_matches(['-', '+']);
        let (mantissa, exponent) = body.split_once(['e', 'E']).unwrap_or((body, "0"));
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let digits: Vec<u8> = whole.bytes().chain(fraction.bytes()).collect();
        let negative = exponent.starts_with('-');
        let magnitude = exponent
            .trim_start_matches(['-', '+'])
            .trim_start_matches('0');
        // Where the point falls among the digits; an exponent of more digits than
        // there are digits moves it past them all.
        let point: i128 = if magnitude.len() > 30 {
            if negative {
                i128::MIN / 2
            } else {
                i128::MAX / 2
            }
        } else {
            let e: i128 = magnitude.parse().unwrap_or(0);
            whole.len() as i128 + if negative { -e } else { e }
        };
        digits
            .iter()
            .enumerate()
            .all(|(i, d)| (i as i128) < point || *d == b'0')
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        #[test]
        fn names_an_integer_agrees_with_the_digits(
            written in "[-+]?(0|[0-9_]{1,6})?\\.?[0-9]{0,6}([eE][-+]?(0{0,3}[0-9]{1,3}|[0-9]{18,22}|9223372036854775[0-9]{3}))?"
                .prop_filter("a number has a digit", |w| {
                    w.split(['e', 'E']).next().is_some_and(|m| m.bytes().any(|b| b.is_ascii_digit()))
                }),
        ) {
            proptest::prop_assert_eq!(names_an_integer(&written), integer_by_digits(&written), "{}", written);
        }
    }
}
