//! Circles of `replaces`: limits that replace one another, in pairs (`a` replaces
//! `b`, `b` replaces `a`) or longer rings. When all of them match one request,
//! envoyproxy/ratelimit's rule drops every one, so the request is limited by none of
//! them: a limit that disappears without a word. A policy holding such a circle is
//! refused, by the parser within one document and by `compile` across the documents
//! of a domain, with the same message either way.

use std::collections::HashMap;

use super::descriptor::describe_path;
use super::model::{DescriptorNode, RateLimit};

/// A limit as the circle search needs it.
pub(super) struct Limit<'a> {
    pub source: &'a str,
    pub name: Option<&'a str>,
    pub replaces: &'a [String],
    pub line: Option<usize>,
    /// Where it is defined, for the message: `FILE:LINE`, or the file and the
    /// descriptor when the line is not known.
    pub at: String,
}

impl<'a> Limit<'a> {
    /// `rl`, a limit of descriptor `d` in `source`.
    pub(super) fn of(source: &'a str, d: &DescriptorNode, rl: &'a RateLimit) -> Limit<'a> {
        let line = rl.line.or(d.line);
        let at = match line {
            Some(line) => format!("{source}:{line}"),
            None => format!("{source}, {}", describe_path(&d.key, d.value.as_deref())),
        };
        Limit {
            source,
            name: rl.name.as_deref(),
            replaces: &rl.replaces,
            line,
            at,
        }
    }
}

/// Every limit of a descriptor tree, in document order.
pub(super) fn limits<'a>(source: &'a str, tree: &'a [DescriptorNode], out: &mut Vec<Limit<'a>>) {
    for d in tree {
        for rl in d.rate_limit.iter().chain(&d.also) {
            out.push(Limit::of(source, d, rl));
        }
        limits(source, &d.descriptors, out);
    }
}

/// One message per circle among `limits`, with the index of the circle's first
/// limit (where the error is reported). Empty when no limit replaces another in a
/// circle.
pub(super) fn circles(limits: &[Limit<'_>]) -> Vec<(usize, String)> {
    if limits.iter().all(|l| l.replaces.is_empty()) {
        return Vec::new();
    }
    let mut named: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, l) in limits.iter().enumerate() {
        if let Some(name) = l.name {
            named.entry(name).or_default().push(i);
        }
    }
    let edges: Vec<Vec<usize>> = limits
        .iter()
        .map(|l| {
            l.replaces
                .iter()
                .filter_map(|r| named.get(r.as_str()))
                .flatten()
                .copied()
                .collect()
        })
        .collect();

    // Depth-first, without recursion: a back edge to a limit still on the path
    // closes a circle.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    let mut mark = vec![Mark::New; limits.len()];
    let mut found: Vec<Vec<usize>> = Vec::new();
    for start in 0..limits.len() {
        if mark[start] != Mark::New {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = Mark::OnPath;
        while let Some((node, next)) = path.last_mut() {
            let node = *node;
            let Some(&to) = edges[node].get(*next) else {
                mark[node] = Mark::Done;
                path.pop();
                continue;
            };
            *next += 1;
            match mark[to] {
                Mark::New => {
                    mark[to] = Mark::OnPath;
                    path.push((to, 0));
                }
                Mark::OnPath => {
                    let from = path.iter().position(|(n, _)| *n == to).unwrap_or(0);
                    let mut circle: Vec<usize> = path[from..].iter().map(|(n, _)| *n).collect();
                    // Start at the limit written first, so the message is stable.
                    let first = circle
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, n)| **n)
                        .map_or(0, |(i, _)| i);
                    circle.rotate_left(first);
                    if !found.contains(&circle) {
                        found.push(circle);
                    }
                }
                Mark::Done => {}
            }
        }
    }
    found
        .into_iter()
        .map(|circle| (circle[0], message(limits, &circle)))
        .collect()
}

fn message(limits: &[Limit<'_>], circle: &[usize]) -> String {
    let name = |i: usize| limits[i].name.unwrap_or_default();
    let each: Vec<String> = circle
        .iter()
        .map(|&i| format!("'{}' ({})", name(i), limits[i].at))
        .collect();
    if let [a, b] = each.as_slice() {
        return format!(
            "limits {a} and {b} replace each other: when both match one request neither applies, so the request is limited by neither; keep 'replaces' on one of them only"
        );
    }
    let (last, rest) = each.split_last().expect("a circle has limits");
    let ring: Vec<String> = circle
        .iter()
        .zip(circle.iter().cycle().skip(1))
        .map(|(&a, &b)| format!("'{}' replaces '{}'", name(a), name(b)))
        .collect();
    format!(
        "limits {} and {last} replace one another in a circle ({}): when all of them match one request none applies, so the request is limited by none of them; remove one 'replaces' of the circle",
        rest.join(", "),
        ring.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit<'a>(name: &'a str, replaces: &'a [String], line: usize) -> Limit<'a> {
        Limit {
            source: "p.yaml",
            name: (!name.is_empty()).then_some(name),
            replaces,
            line: Some(line),
            at: format!("p.yaml:{line}"),
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_chain_is_no_circle() {
        let (b, c) = (names(&["b"]), names(&["c"]));
        let limits = [limit("a", &b, 1), limit("b", &c, 2), limit("c", &[], 3)];
        assert!(circles(&limits).is_empty());
        // An unnamed limit can replace others but never be replaced.
        let a = names(&["a"]);
        let limits = [limit("a", &[], 1), limit("", &a, 2)];
        assert!(circles(&limits).is_empty());
    }

    #[test]
    fn a_pair_names_both_limits_and_where() {
        let (a, b) = (names(&["a"]), names(&["b"]));
        let limits = [limit("x", &[], 1), limit("a", &b, 4), limit("b", &a, 8)];
        assert_eq!(
            circles(&limits),
            vec![(1, "limits 'a' (p.yaml:4) and 'b' (p.yaml:8) replace each other: when both match one request neither applies, so the request is limited by neither; keep 'replaces' on one of them only".to_string())]
        );
    }

    #[test]
    fn a_ring_is_told_in_order_from_the_first_limit() {
        let (a, b, c) = (names(&["a"]), names(&["b"]), names(&["c"]));
        let limits = [limit("b", &c, 2), limit("a", &b, 1), limit("c", &a, 3)];
        let found = circles(&limits);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, 0);
        assert!(
            found[0].1.starts_with("limits 'b' (p.yaml:2), 'c' (p.yaml:3) and 'a' (p.yaml:1) replace one another in a circle ('b' replaces 'c', 'c' replaces 'a', 'a' replaces 'b')"),
            "{}",
            found[0].1
        );
    }

    #[test]
    fn limits_sharing_a_name_close_a_circle_too() {
        // Two limits named `m`: `replaces: m` drops both, so `n` and the second `m`
        // replace each other.
        let (m, n) = (names(&["m"]), names(&["n"]));
        let limits = [limit("n", &m, 1), limit("m", &[], 2), limit("m", &n, 3)];
        let found = circles(&limits);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0]
            .1
            .starts_with("limits 'n' (p.yaml:1) and 'm' (p.yaml:3)"));
    }
}
