//! Whether one more document compiles with the documents already taken, at the
//! cost of that document alone. The Kubernetes source asks it of every
//! RateLimitPolicy in turn, oldest first, so a change costs what the policies
//! hold, not that times their number, as compiling each policy with all the
//! older ones of its domain would.

use std::collections::HashMap;

use super::compile::{conflict, duplicate, Defined, Origin, Path};
use super::model::{DescriptorNode, Document, RateLimit};
use super::replaces;
use super::PolicyError;

/// The documents taken so far, by domain.
#[derive(Debug, Default)]
pub struct Fit {
    domains: HashMap<String, Taken>,
}

#[derive(Debug, Default)]
struct Taken {
    defined: Defined,
    /// The documents with a limit that has a name or `replaces`: only those can
    /// be in a circle of `replaces`.
    replacing: Vec<Document>,
}

impl Fit {
    /// The errors [`compile`](super::compile) would give for the documents taken
    /// followed by `doc`; empty when `doc` fits. The documents taken compile
    /// together, and `doc` compiles on its own (every parsed document does), so
    /// these are its clashes with them: a setting they disagree on, a path they
    /// define both, a circle of `replaces` through them.
    pub fn check(&self, doc: &Document) -> Vec<PolicyError> {
        let mut errors = Vec::new();
        let Some(taken) = self.domains.get(&doc.domain) else {
            return errors;
        };
        taken.defined.settings_clash(doc, &mut errors);
        let mut path = Path::new();
        for d in &doc.descriptors {
            duplicates(&taken.defined, doc, d, &mut path, &mut errors);
        }
        // The documents taken hold no circle, so a new one goes through a limit
        // of `doc` that replaces another.
        if any_limit(&doc.descriptors, &|rl| !rl.replaces.is_empty()) {
            let mut limits = Vec::new();
            for taken in taken.replacing.iter().chain([doc]) {
                replaces::limits(&taken.source, &taken.descriptors, &mut limits);
            }
            for (first, message) in replaces::circles(&limits) {
                errors.push(PolicyError {
                    file: limits[first].source.to_string(),
                    line: limits[first].line,
                    message,
                });
            }
        }
        errors
    }

    /// Takes `doc`, which fits ([`Fit::check`] found nothing).
    pub fn take(&mut self, doc: &Document) {
        let taken = self.domains.entry(doc.domain.clone()).or_default();
        taken.defined.take_settings(doc);
        let mut path = Path::new();
        for d in &doc.descriptors {
            define(&mut taken.defined, doc, d, &mut path);
        }
        if any_limit(&doc.descriptors, &|rl| {
            rl.name.is_some() || !rl.replaces.is_empty()
        }) {
            taken.replacing.push(doc.clone());
        }
    }
}

/// Whether a limit of the tree is `f`.
fn any_limit(tree: &[DescriptorNode], f: &impl Fn(&RateLimit) -> bool) -> bool {
    tree.iter()
        .any(|d| d.rate_limit.iter().chain(&d.also).any(f) || any_limit(&d.descriptors, f))
}

/// Pushes an error for each path of `d`'s tree already defined, as `compile` does:
/// below a duplicate nothing more is reported.
fn duplicates(
    defined: &Defined,
    doc: &Document,
    d: &DescriptorNode,
    path: &mut Path,
    errors: &mut Vec<PolicyError>,
) {
    path.push((d.key.clone(), d.value.clone()));
    if let Some(first) = defined.paths.get(path) {
        let here = Origin::new(&doc.source, d.line);
        errors.push(conflict(&here, duplicate(d, &doc.domain, first)));
    } else {
        for child in &d.descriptors {
            duplicates(defined, doc, child, path, errors);
        }
    }
    path.pop();
}

fn define(defined: &mut Defined, doc: &Document, d: &DescriptorNode, path: &mut Path) {
    path.push((d.key.clone(), d.value.clone()));
    defined
        .paths
        .entry(path.clone())
        .or_insert_with(|| Origin::new(&doc.source, d.line));
    for child in &d.descriptors {
        define(defined, doc, child, path);
    }
    path.pop();
}

#[cfg(test)]
mod tests {
    use super::super::{compile, parse_str};
    use super::*;

    /// A document of `source` built from small choices, so that many of them
    /// clash in every way documents can: settings, paths, circles.
    fn doc(source: &str, seed: u64) -> Document {
        let mut n = seed;
        let mut pick = |m: u64| {
            n = n
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (n >> 33) % m
        };
        let domain = ["a", "b"][pick(2) as usize];
        let mut text = format!("domain: {domain}\n");
        match pick(4) {
            0 => text += "failure_mode: open\n",
            1 => text += "failure_mode: closed\n",
            _ => {}
        }
        match pick(4) {
            0 => text += "shard_by: user\n",
            1 => text += "shard_by: tenant\n",
            _ => {}
        }
        text += "descriptors:\n";
        let mut keys = std::collections::HashSet::new();
        for _ in 0..=pick(3) {
            let key = ["user", "tenant", "path"][pick(3) as usize];
            if !keys.insert(key) {
                continue;
            }
            text += &format!("  - key: {key}\n");
            if pick(2) == 0 {
                text += &format!("    value: v{}\n", pick(3));
            }
            let name = format!("l{}", pick(6));
            text += &format!("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: {name}\n");
            let other = format!("l{}", pick(6));
            if pick(3) == 0 && other != name {
                text += &format!("      replaces: [{{name: {other}}}]\n");
            }
            if pick(2) == 0 {
                text += &format!(
                    "    descriptors:\n      - key: c{}\n        rate_limit: {{unit: minute, requests_per_unit: 2}}\n",
                    pick(2)
                );
            }
        }
        parse_str(source, &text)
            .unwrap_or_else(|e| panic!("{text}: {e:?}"))
            .remove(0)
    }

    fn shown(errors: &[PolicyError]) -> Vec<String> {
        errors.iter().map(|e| e.to_string()).collect()
    }

    /// Whatever the documents, `check` says what compiling them all would: the
    /// same errors, in the same order, or none.
    #[test]
    fn says_what_compiling_everything_would() {
        let (mut fitted, mut refused) = (0, 0);
        let mut kinds = [0; 4];
        for round in 0..200u64 {
            let mut fit = Fit::default();
            let mut taken: Vec<Document> = Vec::new();
            for i in 0..12 {
                let next = doc(&format!("p{i}.yaml"), round * 1000 + i);
                let mut all = taken.clone();
                all.push(next.clone());
                let want = compile(all).err().unwrap_or_default();
                assert_eq!(shown(&fit.check(&next)), shown(&want), "{next:#?}");
                for e in &want {
                    let kind = ["failure mode", "shard_by", "duplicate", "replace"]
                        .iter()
                        .position(|k| e.message.contains(k));
                    kinds[kind.expect("a known clash")] += 1;
                }
                if want.is_empty() {
                    fit.take(&next);
                    taken.push(next);
                    fitted += 1;
                } else {
                    refused += 1;
                }
            }
        }
        // Both outcomes, and every kind of clash, were exercised many times.
        assert!(fitted > 300 && refused > 300, "{fitted} {refused}");
        assert!(kinds.iter().all(|n| *n > 20), "{kinds:?}");
    }

    #[test]
    fn a_circle_across_documents_is_a_clash() {
        let one = |source: &str, text: &str| parse_str(source, text).unwrap().remove(0);
        let a = one(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: b}]}\n",
        );
        let b = one(
            "b.yaml",
            "domain: d\ndescriptors:\n  - key: y\n    rate_limit: {unit: second, requests_per_unit: 1, name: b, replaces: [{name: a}]}\n",
        );
        let mut fit = Fit::default();
        fit.take(&a);
        let errors = fit.check(&b);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].to_string().starts_with(
                "a.yaml:4: limits 'a' (a.yaml:4) and 'b' (b.yaml:4) replace each other"
            ),
            "{}",
            errors[0]
        );
    }
}
