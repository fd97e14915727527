//! The compiled descriptor tree and envoyproxy/ratelimit's lookup over it. Lookups
//! borrow the request's strings and never allocate.

use std::collections::HashMap;

use super::Entry;

type Map<V> = HashMap<String, V, ahash::RandomState>;

/// One node of a domain's tree: the rule it carries and its children by entry key.
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    pub rule: Option<usize>,
    pub children: Map<KeyLevel>,
}

/// Every child of one node that has the same key.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyLevel {
    pub exact: Map<Node>,
    /// Wildcard values in file order (add them with [`KeyLevel::add_wildcard`]).
    pub wildcards: Vec<(Pattern, Node)>,
    /// Which wildcards a value may match, so a lookup does not try them all.
    index: Wildcards,
    /// The child without a value.
    pub any: Option<Box<Node>>,
}

/// Wildcards a level tries one by one before it looks them up by their ends: fewer
/// are cheaper to try than the value's ends are to hash.
const INDEXED: usize = 16;

/// The wildcards of a level by their literal ends: a pattern matches only values
/// that start with the text before its first `*` and end with the text after its
/// last. A lookup takes, for each length of start and of end that some pattern has,
/// the value's own start and end of that length, and tries only the patterns filed
/// under them: its cost grows with the lengths in use, not with the patterns.
#[derive(Debug, Clone, Default)]
struct Wildcards {
    /// Position in file order of each pattern's text.
    by_text: Map<usize>,
    /// Starts in use, by length, each with the ends in use under it.
    starts: Vec<(usize, Map<Ends>)>,
}

/// The patterns of one start, by end.
#[derive(Debug, Clone, Default)]
struct Ends {
    /// Lengths in use.
    lengths: Vec<usize>,
    /// Positions in file order, ascending.
    by_end: Map<Vec<usize>>,
}

impl Wildcards {
    fn add(&mut self, pattern: &Pattern, at: usize) {
        self.by_text.entry(pattern.text.clone()).or_insert(at);
        let (start, end) = pattern.ends();
        let i = match self.starts.iter().position(|(len, _)| *len == start.len()) {
            Some(i) => i,
            None => {
                self.starts.push((start.len(), Map::default()));
                self.starts.len() - 1
            }
        };
        let ends = self.starts[i].1.entry(start.to_string()).or_default();
        if !ends.lengths.contains(&end.len()) {
            ends.lengths.push(end.len());
        }
        ends.by_end.entry(end.to_string()).or_default().push(at);
    }

    /// The first pattern in file order whose text is `value`, else the first that
    /// matches it.
    fn find(&self, wildcards: &[(Pattern, Node)], value: &str) -> Option<usize> {
        // Only a value with a star can spell a pattern.
        if value.contains('*') {
            if let Some(&at) = self.by_text.get(value) {
                return Some(at);
            }
        }
        let mut best: Option<usize> = None;
        for (len, starts) in &self.starts {
            let Some(ends) = value.get(..*len).and_then(|start| starts.get(start)) else {
                continue;
            };
            for &end_len in &ends.lengths {
                let Some(positions) = value
                    .len()
                    .checked_sub(end_len)
                    .and_then(|from| value.get(from..))
                    .and_then(|end| ends.by_end.get(end))
                else {
                    continue;
                };
                let first = positions
                    .iter()
                    .take_while(|&&at| best.is_none_or(|b| at < b))
                    .find(|&&at| wildcards[at].0.matches(value));
                if let Some(&at) = first {
                    best = Some(at);
                }
            }
        }
        best
    }
}

/// A value with `*` wildcards, each matching any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pattern {
    pub text: String,
    /// The literal pieces between the stars (first and last may be empty).
    parts: Vec<String>,
}

impl Pattern {
    pub(crate) fn new(text: &str) -> Pattern {
        Pattern {
            text: text.to_string(),
            parts: text.split('*').map(str::to_string).collect(),
        }
    }

    /// The literal text before the first `*` and after the last.
    fn ends(&self) -> (&str, &str) {
        match self.parts.as_slice() {
            [] => ("", ""),
            [only] => (only.as_str(), only.as_str()),
            [first, .., last] => (first.as_str(), last.as_str()),
        }
    }

    /// Whether the whole of `value` matches. Taking each middle piece at its
    /// leftmost place is enough: it leaves the most room for the rest.
    pub(crate) fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.parts.split_first() {
            Some(split) => split,
            None => return value.is_empty(),
        };
        let Some((last, middle)) = rest.split_last() else {
            return value == first;
        };
        let Some(mut remaining) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        for part in middle {
            match remaining.find(part.as_str()) {
                Some(at) => remaining = &remaining[at + part.len()..],
                None => return false,
            }
        }
        remaining.len() >= last.len() && remaining.ends_with(last.as_str())
    }
}

impl KeyLevel {
    /// Adds a wildcard value after those already there; its node.
    pub(crate) fn add_wildcard(&mut self, pattern: Pattern) -> &mut Node {
        let at = self.wildcards.len();
        self.index.add(&pattern, at);
        self.wildcards.push((pattern, Node::default()));
        &mut self.wildcards[at].1
    }

    /// The wildcard a value takes: the first in file order whose text it spells,
    /// else the first that matches it.
    fn wildcard(&self, value: &str) -> Option<&(Pattern, Node)> {
        if self.wildcards.len() < INDEXED {
            let w = &self.wildcards;
            return w
                .iter()
                .find(|(p, _)| p.text == value)
                .or_else(|| w.iter().find(|(p, _)| p.matches(value)));
        }
        self.wildcards.get(self.index.find(&self.wildcards, value)?)
    }

    /// Exact value first (a request value that spells a pattern exactly is an exact
    /// hit, as in envoyproxy/ratelimit's map lookup), then wildcards in file order,
    /// then the key alone.
    fn lookup(&self, value: &str) -> Option<&Node> {
        if let Some(node) = self.exact.get(value) {
            return Some(node);
        }
        if let Some((_, node)) = self.wildcard(value) {
            return Some(node);
        }
        self.any.as_deref()
    }
}

/// How one level of a descriptor matched (see `Node::trace`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LevelMatch {
    /// The key with this exact value.
    Exact,
    /// The key with a wildcard value: the pattern.
    Wildcard(String),
    /// The key alone (a rule with no value).
    KeyOnly,
}

/// Why a descriptor matched no rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoMatch {
    /// No entries.
    Empty,
    /// No rule at this level (0-based) has the entry's key.
    Key(usize),
    /// Rules at this level have the key, but none its value (no wildcard, no key-only).
    Value(usize),
    /// The descriptor is longer than the rules: the node matched at this level has no
    /// children, so a limit applies only to a descriptor of exactly that depth.
    Deeper(usize),
    /// Every entry matched, but the last node carries no limit (only deeper rules do).
    NoLimitHere,
}

/// How a descriptor walked the tree: each level's match, then the rule or why none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub levels: Vec<LevelMatch>,
    pub result: Result<usize, NoMatch>,
}

impl KeyLevel {
    /// [`KeyLevel::lookup`], saying how it matched.
    fn lookup_traced(&self, value: &str) -> Option<(&Node, LevelMatch)> {
        if let Some(node) = self.exact.get(value) {
            return Some((node, LevelMatch::Exact));
        }
        if let Some((p, node)) = self.wildcard(value) {
            return Some((node, LevelMatch::Wildcard(p.text.clone())));
        }
        self.any.as_deref().map(|n| (n, LevelMatch::KeyOnly))
    }
}

impl Node {
    /// [`Node::find`], recording each level (off the request path: it allocates).
    pub(crate) fn trace<E: Entry>(&self, entries: &[E]) -> Trace {
        let mut levels = Vec::new();
        let Some(last) = entries.len().checked_sub(1) else {
            return Trace {
                levels,
                result: Err(NoMatch::Empty),
            };
        };
        let mut node = self;
        for (i, entry) in entries.iter().enumerate() {
            let Some(level) = node.children.get(entry.key()) else {
                return Trace {
                    levels,
                    result: Err(NoMatch::Key(i)),
                };
            };
            let Some((next, how)) = level.lookup_traced(entry.value()) else {
                return Trace {
                    levels,
                    result: Err(NoMatch::Value(i)),
                };
            };
            levels.push(how);
            if i == last {
                let result = next.rule.ok_or(NoMatch::NoLimitHere);
                return Trace { levels, result };
            }
            if next.children.is_empty() {
                return Trace {
                    levels,
                    result: Err(NoMatch::Deeper(i)),
                };
            }
            node = next;
        }
        unreachable!("the last entry returns")
    }

    /// Every rule id in this subtree, in no particular order.
    pub(crate) fn rule_ids(&self, out: &mut Vec<usize>) {
        out.extend(self.rule);
        for level in self.children.values() {
            for node in level.exact.values() {
                node.rule_ids(out);
            }
            for (_, node) in &level.wildcards {
                node.rule_ids(out);
            }
            if let Some(node) = &level.any {
                node.rule_ids(out);
            }
        }
    }

    /// The rule for entries that come as a set, not a list (an RLQS `BucketId`, a
    /// map): each level takes a not yet used entry whose key the tree has at that
    /// level, and matches its value as [`Node::find`] does; the rule of the node
    /// reached when every entry is used applies. Candidates are tried in the order of
    /// `entries` (the caller sorts them by key), backing out of a branch that cannot
    /// use every entry. `order` receives the entries' indices in tree order.
    ///
    /// Keys are unique in a set, so a path of the tree fixes which entries it uses:
    /// each node is visited at most once, and the walk is bounded by the tree.
    pub(crate) fn find_unordered<E: Entry>(
        &self,
        entries: &[E],
        order: &mut Vec<usize>,
    ) -> Option<usize> {
        order.clear();
        if entries.is_empty() {
            return None;
        }
        self.walk_unordered(entries, order)
    }

    fn walk_unordered<E: Entry>(&self, entries: &[E], order: &mut Vec<usize>) -> Option<usize> {
        for (i, entry) in entries.iter().enumerate() {
            if order.contains(&i) {
                continue;
            }
            let Some(next) = self
                .children
                .get(entry.key())
                .and_then(|level| level.lookup(entry.value()))
            else {
                continue;
            };
            order.push(i);
            let found = if order.len() == entries.len() {
                next.rule
            } else {
                next.walk_unordered(entries, order)
            };
            if found.is_some() {
                return found;
            }
            order.pop();
        }
        None
    }

    /// envoyproxy/ratelimit's GetLimit: walk the entries level by level; the rule of
    /// the node matched by the last entry applies; the walk stops at a node without
    /// children, so a longer descriptor matches nothing.
    pub(crate) fn find<E: Entry>(&self, entries: &[E]) -> Option<usize> {
        let mut node = self;
        let last = entries.len().checked_sub(1)?;
        for (i, entry) in entries.iter().enumerate() {
            let next = node.children.get(entry.key())?.lookup(entry.value())?;
            if i == last {
                return next.rule;
            }
            if next.children.is_empty() {
                return None;
            }
            node = next;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matching() {
        let cases = [
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("foo*", "fo", false),
            ("bar*b", "barb", true),
            ("bar*b", "bar-xyz-b", true),
            ("bar*b", "bar-xyz-c", false),
            ("foo*bar*baz", "foo1bar2baz", true),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foobazbar", false),
            ("*", "", true),
            ("*", "anything", true),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("*x*", "abxcd", true),
            ("*x*", "abcd", false),
            ("ab*ba", "aba", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ];
        for (pattern, value, want) in cases {
            assert_eq!(
                Pattern::new(pattern).matches(value),
                want,
                "{pattern} vs {value}"
            );
        }
    }

    /// The wildcard a level's lookup takes, as the rule says it: the first in file
    /// order whose text the value spells, else the first that matches.
    fn first_in_file_order(patterns: &[String], value: &str) -> Option<usize> {
        patterns
            .iter()
            .position(|p| p == value)
            .or_else(|| patterns.iter().position(|p| Pattern::new(p).matches(value)))
    }

    fn level_of(patterns: &[String]) -> KeyLevel {
        let mut level = KeyLevel::default();
        for (i, p) in patterns.iter().enumerate() {
            level.add_wildcard(Pattern::new(p)).rule = Some(i);
        }
        level
    }

    #[test]
    fn the_first_wildcard_in_file_order_wins_among_many() {
        let mut patterns: Vec<String> = (0..10_000).map(|i| format!("tenant-{i}-*")).collect();
        patterns.push("*-admin".into());
        patterns.push("tenant-*".into());
        patterns.insert(0, "tenant-42-x*".into());
        let level = level_of(&patterns);
        let rule = |v: &str| level.lookup(v).and_then(|n| n.rule);
        assert_eq!(rule("tenant-42-xy"), Some(0));
        assert_eq!(rule("tenant-42-y"), Some(43));
        assert_eq!(rule("tenant-9999-admin"), Some(10_000));
        assert_eq!(rule("root-admin"), Some(10_001));
        assert_eq!(rule("tenant-x"), Some(10_002));
        // A value that spells a pattern takes it, before an earlier one matching.
        assert_eq!(rule("tenant-*"), Some(10_002));
        assert_eq!(rule("other"), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Patterns and values over a few letters, stars and a two-byte letter: the
        /// index takes the wildcard that trying each in file order takes.
        #[test]
        fn the_index_takes_the_wildcard_file_order_takes(
            patterns in proptest::collection::vec("[ab*é]{0,5}", 0..40),
            values in proptest::collection::vec("[abé*]{0,6}", 1..12),
        ) {
            let patterns: Vec<String> =
                patterns.into_iter().filter(|p| p.contains('*')).collect();
            let level = level_of(&patterns);
            for value in &values {
                let want = first_in_file_order(&patterns, value);
                let got = level.lookup(value).and_then(|n| n.rule);
                proptest::prop_assert_eq!(got, want, "{:?} in {:?}", value, patterns);
                // The index alone, however few the patterns.
                let indexed = level.index.find(&level.wildcards, value);
                proptest::prop_assert_eq!(indexed, want, "{:?} in {:?}", value, patterns);
            }
        }
    }
}
