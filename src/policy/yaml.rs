//! Reading YAML text into positioned [`Node`]s, one per document, from yaml-rust2's
//! marked event stream. Building the tree by hand keeps duplicate mapping keys (the
//! crate's own loader silently drops them) and the line of every key and value.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use super::node::{Node, Value, MAX_DEPTH};

/// The most nodes one document may hold (every key and value, and each copy an
/// alias makes), so a "billion laughs" document is refused instead of exhausting
/// memory. Anchors live within one document, so this bounds what aliases can make.
const MAX_NODES: usize = 1_000_000;

/// A YAML syntax problem at a 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlError {
    pub line: Option<usize>,
    pub message: String,
}

/// Parses every document of `text`. Empty documents (nothing but comments, or a
/// trailing `---`) come back as [`Value::Null`] nodes.
pub(crate) fn load(text: &str) -> Result<Vec<Node>, YamlError> {
    load_capped(text, MAX_NODES)
}

/// [`load`], with at most `max_nodes` nodes per document.
fn load_capped(text: &str, max_nodes: usize) -> Result<Vec<Node>, YamlError> {
    // Editors on Windows may start a file with a byte-order mark; YAML allows it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    refuse_control_characters(text)?;
    let mut loader = Loader {
        parser: Parser::new_from_str(text),
        anchors: HashMap::new(),
        nodes: 0,
        max_nodes,
    };
    let mut docs = Vec::new();
    loop {
        let (event, mark) = loader.next()?;
        match event {
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
            Event::StreamEnd => return Ok(docs),
            Event::DocumentStart => {
                loader.anchors.clear();
                loader.nodes = 0;
                let (event, mark) = loader.next()?;
                docs.push(loader.node(event, mark, 0)?);
            }
            _ => return Err(error(mark, "unexpected YAML event outside a document")),
        }
    }
}

/// Refuses the characters YAML does not allow in a stream: control characters but
/// tab and line breaks (and NEL), and U+FFFE and U+FFFF. yaml-rust2 would read a NUL as the end
/// of the text, so a corrupted file would load without the rules after it, and take
/// other control characters into domains and keys. go-yaml (envoyproxy/ratelimit,
/// kubectl) refuses them likewise.
fn refuse_control_characters(text: &str) -> Result<(), YamlError> {
    let allowed = |c: char| {
        matches!(c, '\t' | '\n' | '\r' | ' '..='~' | '\u{85}')
            || ('\u{a0}'..='\u{fffd}').contains(&c)
            || c >= '\u{10000}'
    };
    let Some(at) = text.find(|c: char| !allowed(c)) else {
        return Ok(());
    };
    let (line, column) = position(&text[..at]);
    let c = text[at..].chars().next().unwrap_or_default();
    Err(YamlError {
        line: Some(line),
        message: format!(
            "{} U+{:04X} at column {column}, which YAML does not allow (is the file corrupted?)",
            if c.is_control() {
                "control character"
            } else {
                "character"
            },
            u32::from(c),
        ),
    })
}

/// The line and column (from 1, in characters) of what follows `before`.
pub(super) fn position(before: &str) -> (usize, usize) {
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

struct Loader<'a> {
    parser: Parser<std::str::Chars<'a>>,
    /// Anchored nodes of the current document with their size in nodes.
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes of the current document so far, alias copies included.
    nodes: usize,
    max_nodes: usize,
}

impl Loader<'_> {
    fn next(&mut self) -> Result<(Event, Marker), YamlError> {
        self.parser.next_token().map_err(|e| YamlError {
            line: Some(e.marker().line().max(1)),
            message: format!("invalid YAML: {}", e.info()),
        })
    }

    fn count(&mut self, n: usize, mark: Marker) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > self.max_nodes {
            let message = format!(
                "document too large: a YAML document may hold at most {} nodes (each key and value, and each copy an alias makes); split it into several documents (---) or files",
                self.max_nodes
            );
            return Err(error(mark, &message));
        }
        Ok(())
    }

    /// Builds the node that starts with `event`, consuming its whole subtree.
    fn node(&mut self, event: Event, mark: Marker, depth: usize) -> Result<Node, YamlError> {
        if depth > MAX_DEPTH {
            return Err(error(mark, "YAML nested too deeply"));
        }
        let line = Some(mark.line().max(1));
        let before = self.nodes;
        self.count(1, mark)?;
        let (node, anchor) = match event {
            Event::Scalar(text, style, anchor, tag) => {
                let value = scalar(text, style, tag.as_ref()).map_err(|m| error(mark, &m))?;
                (Node::new(line, value), anchor)
            }
            Event::SequenceStart(anchor, _) => {
                let mut items = Vec::new();
                loop {
                    let (event, mark) = self.next()?;
                    if event == Event::SequenceEnd {
                        break;
                    }
                    items.push(self.node(event, mark, depth + 1)?);
                }
                (Node::new(line, Value::Seq(items)), anchor)
            }
            Event::MappingStart(anchor, _) => {
                let mut entries = Vec::new();
                let mut merged = Vec::new();
                loop {
                    let (event, mark) = self.next()?;
                    if event == Event::MappingEnd {
                        break;
                    }
                    let merge = is_merge_key(&event);
                    let key = self.node(event, mark, depth + 1)?;
                    let (event, mark) = self.next()?;
                    let value = self.node(event, mark, depth + 1)?;
                    if merge {
                        merged.push(value);
                    } else {
                        entries.push((key, value));
                    }
                }
                merge_into(&mut entries, merged)?;
                (Node::new(line, Value::Map(entries)), anchor)
            }
            Event::Alias(id) => {
                let (node, size) = match self.anchors.get(&id) {
                    Some((node, size)) => (node.clone(), *size),
                    None => return Err(error(mark, "unknown alias")),
                };
                self.count(size, mark)?;
                // The copy is reported where the alias is used.
                return Ok(Node { line, ..node });
            }
            _ => return Err(error(mark, "unexpected YAML event")),
        };
        if anchor > 0 {
            self.anchors
                .insert(anchor, (node.clone(), self.nodes - before));
        }
        Ok(node)
    }
}

/// The YAML 1.1 merge key: a plain `<<` (quoted, it is an ordinary key).
/// envoyproxy/ratelimit's reader (go-yaml v2) and kubectl take it, so files
/// written for them use it.
fn is_merge_key(event: &Event) -> bool {
    matches!(event, Event::Scalar(text, TScalarStyle::Plain, _, None) if text == "<<")
}

/// Adds the entries of the mappings merged in (`<<: *a` or `<<: [*a, *b]`) whose
/// keys the mapping does not have: its own keys win, then earlier mappings.
fn merge_into(entries: &mut Vec<(Node, Node)>, merged: Vec<Node>) -> Result<(), YamlError> {
    if merged.is_empty() {
        return Ok(());
    }
    // Keys by their form (type and text), hashed: a big mapping merged into another
    // must not cost the product of their sizes.
    let form = |key: &Node| format!("{:?}", key.value);
    let mut seen: std::collections::HashSet<String> =
        entries.iter().map(|(k, _)| form(k)).collect();
    for value in merged {
        let maps = match value.value {
            Value::Seq(items) => items,
            other => vec![Node::new(value.line, other)],
        };
        for map in maps {
            let Value::Map(more) = map.value else {
                return Err(YamlError {
                    line: map.line,
                    message: "the merge key '<<' takes a mapping or a list of mappings".into(),
                });
            };
            for (key, value) in more {
                if seen.insert(form(&key)) {
                    entries.push((key, value));
                }
            }
        }
    }
    Ok(())
}

fn error(mark: Marker, message: &str) -> YamlError {
    YamlError {
        line: Some(mark.line().max(1)),
        message: message.to_string(),
    }
}

/// Resolves a scalar's type. Quoted and block scalars are strings; plain ones follow
/// the YAML core schema, plus what the YAML 1.1 reader (go-yaml v2) of
/// envoyproxy/ratelimit and kubectl adds: `y`/`n`/`yes`/`no`/`on`/`off` as booleans,
/// numbers with `_` separators (`1_000`), and `0b`/`0B`, `0X`, `0O` prefixes. (A
/// leading `0` stays decimal here, where go-yaml v2 reads octal; a field that takes
/// an integer refuses it, see `fields::integer`.)
fn scalar(text: String, style: TScalarStyle, tag: Option<&Tag>) -> Result<Value, String> {
    if let Some(tag) = tag {
        if tag.handle == "tag:yaml.org,2002:" || tag.handle == "!!" {
            let resolved = match tag.suffix.as_str() {
                "str" => return Ok(Value::Str(text)),
                "null" => Some(Value::Null),
                "bool" => parse_bool(&text).map(|b| Value::Bool(b, text.clone())),
                "int" => parse_int(&text).map(|i| Value::Int(i, text.clone())),
                "float" => parse_float(&text)
                    .or_else(|| parse_int(&text).map(|i| i as f64))
                    .map(|f| Value::Float(f, text.clone())),
                _ => None,
            };
            return match resolved {
                Some(v) => Ok(v),
                None if matches!(tag.suffix.as_str(), "map" | "seq" | "binary" | "timestamp") => {
                    Ok(Value::Str(text))
                }
                None => Err(format!("'{}' is not a valid !!{}", text, tag.suffix)),
            };
        }
    }
    if style != TScalarStyle::Plain {
        return Ok(Value::Str(text));
    }
    if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL") {
        return Ok(Value::Null);
    }
    if let Some(b) = parse_bool(&text) {
        return Ok(Value::Bool(b, text));
    }
    if let Some(i) = parse_int(&text) {
        return Ok(Value::Int(i, text));
    }
    if let Some(f) = parse_float(&text) {
        return Ok(Value::Float(f, text));
    }
    Ok(Value::Str(text))
}

fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" | "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => {
            Some(true)
        }
        "false" | "False" | "FALSE" | "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => {
            Some(false)
        }
        _ => None,
    }
}

/// `text` without `_` when it starts like a number: go-yaml v2 drops them there.
fn without_separators(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('_') && text.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+')
    {
        text.replace('_', "").into()
    } else {
        text.into()
    }
}

fn parse_int(text: &str) -> Option<i128> {
    let text = &*without_separators(text);
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let prefix = digits.get(..2).map(str::to_ascii_lowercase);
    let (radix, digits) = match prefix.as_deref() {
        Some("0x") => (16, &digits[2..]),
        Some("0o") => (8, &digits[2..]),
        Some("0b") => (2, &digits[2..]),
        _ => (10, digits),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let value = i128::from_str_radix(digits, radix).ok()?;
    Some(if negative { -value } else { value })
}

fn parse_float(text: &str) -> Option<f64> {
    let text = &*without_separators(text);
    match text {
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        _ => {}
    }
    // The core schema's float pattern; Rust's parser alone would also take "inf".
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    let mantissa = body.split(['e', 'E']).next().unwrap_or("");
    let ok_chars = body
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'));
    if !ok_chars || !mantissa.chars().any(|c| c.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Node {
        let mut docs = load(text).unwrap();
        assert_eq!(docs.len(), 1);
        docs.remove(0)
    }

    #[test]
    fn scalars_resolve_like_the_core_schema() {
        let node = one(
            "[1, -2, 0x10, 1.5, true, off, ~, '', \"7\", !!str 8, abc, 1e3, n, 'y', 1_000, 0b101, -1_0.5, _1, '1_0']",
        );
        let Value::Seq(items) = node.value else {
            panic!("not a list")
        };
        let values: Vec<Value> = items.into_iter().map(|n| n.value).collect();
        assert_eq!(values[0], Value::Int(1, "1".into()));
        assert_eq!(values[1], Value::Int(-2, "-2".into()));
        assert_eq!(values[2], Value::Int(16, "0x10".into()));
        assert_eq!(values[3], Value::Float(1.5, "1.5".into()));
        assert_eq!(values[4], Value::Bool(true, "true".into()));
        assert_eq!(values[5], Value::Bool(false, "off".into()));
        assert_eq!(values[6], Value::Null);
        assert_eq!(values[7], Value::Str(String::new()));
        assert_eq!(values[8], Value::Str("7".into()));
        assert_eq!(values[9], Value::Str("8".into()));
        assert_eq!(values[10], Value::Str("abc".into()));
        assert_eq!(values[11], Value::Float(1000.0, "1e3".into()));
        assert_eq!(values[12], Value::Bool(false, "n".into()));
        assert_eq!(values[13], Value::Str("y".into()));
        // go-yaml v2's additions: `_` separators, binary.
        assert_eq!(values[14], Value::Int(1000, "1_000".into()));
        assert_eq!(values[15], Value::Int(5, "0b101".into()));
        assert_eq!(values[16], Value::Float(-10.5, "-1_0.5".into()));
        assert_eq!(values[17], Value::Str("_1".into()));
        assert_eq!(values[18], Value::Str("1_0".into()));
    }

    #[test]
    fn lines_are_one_based_and_duplicates_are_kept() {
        let node = one("# c\na: 1\nb:\n  c: 2\na: 3\n");
        let Value::Map(entries) = node.value else {
            panic!("not a map")
        };
        let lines: Vec<_> = entries.iter().map(|(k, _)| k.line).collect();
        assert_eq!(lines, vec![Some(2), Some(3), Some(5)]);
        let Value::Map(inner) = &entries[1].1.value else {
            panic!("not a map")
        };
        assert_eq!(inner[0].0.line, Some(4));
    }

    #[test]
    fn several_documents_and_empty_ones() {
        let docs = load("a: 1\n---\n# nothing\n---\nb: 2\n").unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[1].value, Value::Null);
        assert_eq!(docs[2].line, Some(5));
        assert!(load("").unwrap().is_empty());
    }

    #[test]
    fn syntax_errors_carry_a_line() {
        let err = load("'''").unwrap_err();
        assert!(err.line.is_some());
        let err = load("a: 1\nb: [\n").unwrap_err();
        assert!(err.line.unwrap() >= 2, "{err:?}");
    }

    #[test]
    fn aliases_are_copied_and_bombs_refused() {
        let node = one("a: &x {k: v}\nb: *x\n");
        let Value::Map(entries) = node.value else {
            panic!("not a map")
        };
        assert_eq!(entries[1].1.line, Some(2));
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(load(&bomb).is_err());
    }

    /// The cap says what it counts, aliases or not, and holds per document.
    #[test]
    fn the_node_cap_is_per_document_and_says_so() {
        // 1 map + 3 keys + 3 values.
        let doc = "a: 1\nb: 2\nc: 3\n";
        let err = load_capped(doc, 6).unwrap_err();
        assert_eq!(err.line, Some(3));
        assert!(
            err.message
                .starts_with("document too large: a YAML document may hold at most 6 nodes"),
            "{}",
            err.message
        );
        assert!(!err.message.contains("aliases expand"), "{}", err.message);
        assert_eq!(load_capped(doc, 7).unwrap().len(), 1);
        let two = format!("{doc}---\n{doc}");
        assert_eq!(load_capped(&two, 7).unwrap().len(), 2);
    }

    /// `<<: *a` and `<<: [*a, *b]` merge as go-yaml v2 and kubectl merge: the
    /// mapping's own keys win, then the earlier mappings.
    #[test]
    fn merge_keys_merge_and_own_keys_win() {
        let node = one("a: &a {unit: minute, requests_per_unit: 5}\n\
             b: &b {unit: second, name: b}\n\
             one: {<<: *a, requests_per_unit: 7}\n\
             list: {<<: [*b, *a]}\n\
             quoted: {'<<': x}\n");
        let Value::Map(entries) = node.value else {
            panic!("not a map")
        };
        let map = |i: usize| -> Vec<(Value, Value)> {
            let Value::Map(m) = &entries[i].1.value else {
                panic!("not a map")
            };
            m.iter()
                .map(|(k, v)| (k.value.clone(), v.value.clone()))
                .collect()
        };
        let s = |t: &str| Value::Str(t.into());
        assert_eq!(
            map(2),
            [
                (s("requests_per_unit"), Value::Int(7, "7".into())),
                (s("unit"), s("minute"))
            ]
        );
        assert_eq!(
            map(3),
            [
                (s("unit"), s("second")),
                (s("name"), s("b")),
                (s("requests_per_unit"), Value::Int(5, "5".into()))
            ]
        );
        assert_eq!(map(4), [(s("<<"), s("x"))]);
        let err = load("a: {<<: 3}\n").unwrap_err();
        assert!(err.message.contains("merge key '<<'"), "{err:?}");
    }

    #[test]
    fn deep_nesting_is_refused() {
        let text = format!("{}{}", "[".repeat(500), "]".repeat(500));
        assert!(load(&text).is_err());
    }
}
