//! The small positioned value tree that both YAML documents and Kubernetes JSON
//! specs are turned into, so one converter (and one set of checks) serves both.

/// Nesting deeper than this is refused: it keeps every recursive walk (conversion,
/// drop) far from the stack limit, whatever the input.
pub(crate) const MAX_DEPTH: usize = 128;

/// A value with the 1-based line it starts on (`None` for JSON input).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub line: Option<usize>,
    pub value: Value,
}

/// A scalar keeps its source text besides its resolved type, because string fields
/// accept any scalar as written (`value: 123` is the string "123", as in
/// envoyproxy/ratelimit).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool, String),
    Int(i128, String),
    Float(f64, String),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in document order; duplicates are kept so they can be reported.
    Map(Vec<(Node, Node)>),
}

impl Node {
    pub(crate) fn new(line: Option<usize>, value: Value) -> Node {
        Node { line, value }
    }

    /// What this node is, for messages: "a list", "the string 'a'", ...
    pub(crate) fn describe(&self) -> String {
        match &self.value {
            Value::Null => "nothing (null)".to_string(),
            Value::Bool(_, t) => format!("the boolean {t}"),
            Value::Int(_, t) => format!("the integer {t}"),
            Value::Float(_, t) => format!("the number {t}"),
            Value::Str(s) => format!("the string '{}'", shorten(s)),
            Value::Seq(_) => "a list".to_string(),
            Value::Map(_) => "a mapping".to_string(),
        }
    }

    /// The text of any scalar; `None` for null, lists and mappings.
    pub(crate) fn scalar_text(&self) -> Option<&str> {
        match &self.value {
            Value::Bool(_, t) | Value::Int(_, t) | Value::Float(_, t) | Value::Str(t) => Some(t),
            Value::Null | Value::Seq(_) | Value::Map(_) => None,
        }
    }

    /// Converts to JSON (for `metadata`). Non-string mapping keys become their text;
    /// duplicate keys are reported by line.
    pub(crate) fn to_json(&self) -> Result<serde_json::Value, (Option<usize>, String)> {
        use serde_json::Value as J;
        Ok(match &self.value {
            Value::Null => J::Null,
            Value::Bool(b, _) => J::Bool(*b),
            Value::Int(i, t) => match (i64::try_from(*i), u64::try_from(*i)) {
                (Ok(v), _) => J::from(v),
                (_, Ok(v)) => J::from(v),
                _ => return Err((self.line, format!("integer {t} is too large"))),
            },
            Value::Float(f, t) => match serde_json::Number::from_f64(*f) {
                Some(n) => J::Number(n),
                None => J::String(t.clone()),
            },
            Value::Str(s) => J::String(s.clone()),
            Value::Seq(items) => J::Array(
                items
                    .iter()
                    .map(Node::to_json)
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Value::Map(entries) => {
                let mut map = serde_json::Map::new();
                for (k, v) in entries {
                    let key = match k.scalar_text() {
                        Some(t) => t.to_string(),
                        None => return Err((k.line, format!("mapping key is {}", k.describe()))),
                    };
                    if map.contains_key(&key) {
                        return Err((k.line, format!("duplicate key '{}'", shorten(&key))));
                    }
                    map.insert(key, v.to_json()?);
                }
                J::Object(map)
            }
        })
    }

    /// Converts a JSON value (a Kubernetes object's spec). Fails only when the value
    /// nests deeper than [`MAX_DEPTH`].
    pub(crate) fn from_json(value: &serde_json::Value) -> Option<Node> {
        from_json_at(value, 0)
    }
}

fn from_json_at(value: &serde_json::Value, depth: usize) -> Option<Node> {
    use serde_json::Value as J;
    if depth > MAX_DEPTH {
        return None;
    }
    let value = match value {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b, b.to_string()),
        J::Number(n) => {
            let text = n.to_string();
            if let Some(i) = n.as_i64() {
                Value::Int(i128::from(i), text)
            } else if let Some(u) = n.as_u64() {
                Value::Int(i128::from(u), text)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN), text)
            }
        }
        J::String(s) => Value::Str(s.clone()),
        J::Array(items) => Value::Seq(
            items
                .iter()
                .map(|v| from_json_at(v, depth + 1))
                .collect::<Option<Vec<_>>>()?,
        ),
        J::Object(map) => Value::Map(
            map.iter()
                .map(|(k, v)| {
                    let v = from_json_at(v, depth + 1)?;
                    Some((Node::new(None, Value::Str(k.clone())), v))
                })
                .collect::<Option<Vec<_>>>()?,
        ),
    };
    Some(Node::new(None, value))
}

/// Cuts long input down for messages.
pub(crate) fn shorten(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(MAX).collect();
        out.push('…');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_keeps_types() {
        let json = serde_json::json!({"a": [1, -2, 1.5, true, null, "x"], "b": {"c": "d"}});
        let node = Node::from_json(&json).unwrap();
        assert_eq!(node.to_json().unwrap(), json);
    }

    #[test]
    fn json_too_deep_is_refused() {
        let mut v = serde_json::json!(1);
        for _ in 0..(MAX_DEPTH + 2) {
            v = serde_json::json!([v]);
        }
        assert!(Node::from_json(&v).is_none());
    }

    #[test]
    fn duplicate_metadata_key_is_an_error() {
        let k = |s: &str, line| Node::new(Some(line), Value::Str(s.into()));
        let node = Node::new(
            Some(1),
            Value::Map(vec![(k("a", 1), k("x", 1)), (k("a", 2), k("y", 2))]),
        );
        let err = node.to_json().unwrap_err();
        assert_eq!(err.0, Some(2));
    }
}
