//! Where the sources meet: the latest documents of the file source, the latest
//! `RateLimitConfig`s of the xDS source and the latest `RateLimitPolicy` objects of
//! the Kubernetes source are compiled together into ONE policy, swapped whole into
//! the `Arc<ArcSwap<Policy>>` the request path reads.
//!
//! Rules, in the order they are applied ([`resolve`]):
//! - File documents always serve (the file source only hands over sets that compile;
//!   a broken edit keeps the last good files, as before). xDS documents serve beside
//!   them as if they were files: a version that does not compile with the files is
//!   refused as a whole ([`Hub::set_xds`]) and the last good one keeps serving, and
//!   so is a file set that does not compile with the xDS documents
//!   ([`Hub::set_files`]). A refused set is never stored, so no later rebuild
//!   brings it in.
//! - Policies are considered oldest first (`creationTimestamp`, then
//!   `namespace/name`).
//! - A domain belongs to the namespace of its oldest policy (valid or not: the
//!   domain is read from the raw spec). A policy of another namespace naming it is
//!   `Conflicted`, unless the domain is in `--shared-domains`.
//! - A policy whose spec does not parse is `Invalid`; it never affects the others:
//!   the descriptor paths its spec still names stay its own ([`super::claim`]), so
//!   a newer policy defining them is `Conflicted` as it was before the bad edit.
//! - A valid policy is added to its domain's documents when they still compile with
//!   it (files first, then older policies); otherwise, for instance when it defines a
//!   descriptor path already defined by a file or an older policy, or disagrees on
//!   `failureMode`/`shardBy`, it is `Conflicted` and contributes nothing. So a file
//!   and a policy naming one domain merge, and on a clash the file keeps serving.
//! - Last, an `Invalid` policy keeps serving its last good version (seen by this
//!   process) when that still fits. This step runs after every verdict is known, so
//!   the verdicts depend only on the objects and the files, never on what one
//!   replica happened to see earlier: every replica computes the same statuses.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::policy::{compile_with, Defaults, Document, Fit, Policy, PolicyError};
use crate::telemetry::printable::printable;
use crate::telemetry::Metrics;

/// A `RateLimitPolicy` object as the hub needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub namespace: String,
    pub name: String,
    /// `metadata.creationTimestamp` in RFC 3339 (UTC, `Z`), so text order is age
    /// order.
    pub created: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// `spec.domain` as written, even when the spec is otherwise invalid.
    pub domain: Option<String>,
    /// The current spec, parsed.
    pub current: Result<Document, Vec<PolicyError>>,
    /// The last version of this object (same uid) that parsed, if any.
    pub last_good: Option<Document>,
    /// While the spec does not parse, the paths it still names
    /// ([`super::claim::claimed`]): they stay this policy's.
    pub claimed: Option<Document>,
}

impl Candidate {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The result for one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acceptance {
    Accepted,
    Invalid(String),
    Conflicted(String),
}

/// A verdict and the generation it was computed for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub generation: i64,
    pub verdict: Acceptance,
    /// `spec.domain` as written.
    pub domain: Option<String>,
}

/// Verdicts by `namespace/name`.
pub type Outcomes = BTreeMap<String, Outcome>;

/// Decides which documents serve; see the module docs. Returns the documents to
/// compile (files first, then policies oldest first) and every policy's verdict.
pub fn resolve(
    files: &[Document],
    candidates: &[Candidate],
    shared: &HashSet<String>,
) -> (Vec<Document>, Outcomes) {
    let mut order: Vec<&Candidate> = candidates.iter().collect();
    order.sort_by(|a, b| {
        (&a.created, &a.namespace, &a.name).cmp(&(&b.created, &b.namespace, &b.name))
    });

    // The owner of each domain: the namespace of its oldest policy.
    let mut owner: HashMap<&str, &Candidate> = HashMap::new();
    for c in &order {
        if let Some(domain) = c.domain.as_deref() {
            owner.entry(domain).or_insert(c);
        }
    }

    // What serves (files, then accepted policies), and what serves plus what
    // invalid policies still claim: newer policies may take neither.
    let mut served = Fit::default();
    let mut claimed = Fit::default();
    for doc in files {
        served.take(doc);
        claimed.take(doc);
    }
    // Which invalid policies claim paths, by domain.
    let mut claims: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut serving: Vec<Document> = Vec::new();
    let mut outcomes = Outcomes::new();

    for c in &order {
        let verdict = match &c.current {
            Err(errors) => {
                if let Some(claim) = &c.claimed {
                    if fits(claim, c, &owner, shared, &served, &claimed, &claims).is_ok() {
                        claimed.take(claim);
                        claims
                            .entry(claim.domain.as_str())
                            .or_default()
                            .push(claim.source.as_str());
                    }
                }
                Acceptance::Invalid(invalid_message(errors))
            }
            Ok(doc) => match fits(doc, c, &owner, shared, &served, &claimed, &claims) {
                Ok(()) => {
                    served.take(doc);
                    claimed.take(doc);
                    serving.push(doc.clone());
                    Acceptance::Accepted
                }
                Err(message) => Acceptance::Conflicted(message),
            },
        };
        outcomes.insert(
            c.key(),
            Outcome {
                generation: c.generation,
                verdict,
                domain: c.domain.clone(),
            },
        );
    }

    // Invalid policies keep their last good version where it still fits (the
    // claims have kept newer policies off their paths).
    let no_claims = HashMap::new();
    for c in &order {
        let (Err(_), Some(doc)) = (&c.current, &c.last_good) else {
            continue;
        };
        match fits(doc, c, &owner, shared, &served, &served, &no_claims) {
            Ok(()) => {
                tracing::debug!(policy = %c.key(), "invalid update: the last good version keeps serving");
                served.take(doc);
                serving.push(doc.clone());
            }
            Err(message) => tracing::warn!(
                policy = %c.key(),
                "invalid update, and the last good version no longer fits: {}",
                printable(&message)
            ),
        }
    }

    let mut docs = files.to_vec();
    docs.extend(serving);
    (docs, outcomes)
}

/// Whether `doc` (of candidate `c`) may join its domain: the domain's owner allows
/// it, and it compiles with what serves and what older invalid policies claim
/// (`claimed`, which `claims` names by domain). `Err` says why not.
fn fits(
    doc: &Document,
    c: &Candidate,
    owner: &HashMap<&str, &Candidate>,
    shared: &HashSet<String>,
    served: &Fit,
    claimed: &Fit,
    claims: &HashMap<&str, Vec<&str>>,
) -> Result<(), String> {
    if !shared.contains(&doc.domain) {
        if let Some(first) = owner.get(doc.domain.as_str()) {
            if first.namespace != c.namespace {
                return Err(format!(
                    "domain '{}' belongs to namespace '{}' (its oldest policy is {}); \
                     use another domain, or list '{}' in sluice's --shared-domains to let namespaces share it",
                    doc.domain,
                    first.namespace,
                    first.key(),
                    doc.domain
                ));
            }
        }
    }
    let errors = claimed.check(doc);
    if errors.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = errors.iter().map(|e| e.message.clone()).collect();
    // Only an Invalid policy's claim in the way: it may serve nothing here (no last
    // good version seen), so "the older one keeps serving" would mislead.
    if let Some(owners) = claims.get(doc.domain.as_str()) {
        if served.check(doc).is_empty() {
            return Err(format!(
                "conflicts with older policy {} of domain '{}', which is Invalid and keeps its paths until it is fixed or deleted: {}",
                owners.join(", "),
                doc.domain,
                lines.join("; ")
            ));
        }
    }
    Err(format!(
        "conflicts with an older policy or a policy file of domain '{}' (the older one keeps serving): {}",
        doc.domain,
        lines.join("; ")
    ))
}

/// The longest `Invalid` message: a status holds it, and an object too large for
/// the API server to store would take the status writes of the policies after it
/// down with it.
const MAX_MESSAGE: usize = 4096;

fn invalid_message(errors: &[PolicyError]) -> String {
    let mut out = String::from("spec is invalid: ");
    for (n, e) in errors.iter().enumerate() {
        if n > 0 && out.len() + 2 + e.message.len() > MAX_MESSAGE {
            out.push_str(&format!("; and {} more error(s)", errors.len() - n));
            break;
        }
        if n > 0 {
            out.push_str("; ");
        }
        if e.message.len() <= MAX_MESSAGE {
            out.push_str(&e.message);
        } else {
            // One error longer than the message may be (a long key quoted): cut on
            // a char.
            let mut cut = MAX_MESSAGE - 64;
            while !e.message.is_char_boundary(cut) {
                cut -= 1;
            }
            out.push_str(&e.message[..cut]);
            out.push_str("...");
        }
    }
    out
}

/// What the sources say beside the serving policy, for `/debug/policies`.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// By source (`file`, `xds`): why its latest change was refused, while its last
    /// good documents keep serving.
    pub refused: BTreeMap<&'static str, String>,
    /// Every RateLimitPolicy's verdict.
    pub outcomes: Arc<Outcomes>,
}

/// Where a serving document came from: `kubernetes` for an object read from the
/// API server (its source is its `namespace/name`), `xds` for a `RateLimitConfig`
/// taken over xDS, `file` otherwise (a file may hold RateLimitPolicy manifests too).
/// A file or xDS document's refusal is under this name in [`Status::refused`].
pub fn origin(source: &crate::policy::SourceInfo) -> &'static str {
    if source.resource.as_deref() == Some(source.source.as_str()) {
        "kubernetes"
    } else if source.source.starts_with("xds:") {
        "xds"
    } else {
        "file"
    }
}

/// Whether a serving document is what its source holds now, for `/debug/policies`
/// and ListPolicies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Standing<'a> {
    /// It is.
    Loaded,
    /// Its source's latest change was refused (why); its last good version serves.
    Refused(&'a str),
    /// A RateLimitPolicy's `Accepted` condition; one not accepted serves its last
    /// good version.
    Verdict(&'a Acceptance),
}

/// The [`Standing`] of `source`, a document of the serving policy, in `status`.
pub fn standing<'a>(source: &crate::policy::SourceInfo, status: &'a Status) -> Standing<'a> {
    let origin = origin(source);
    if origin == "kubernetes" {
        return match status.outcomes.get(&source.source) {
            Some(outcome) => Standing::Verdict(&outcome.verdict),
            None => Standing::Loaded,
        };
    }
    match status.refused.get(origin) {
        Some(error) => Standing::Refused(error),
        None => Standing::Loaded,
    }
}

/// The latest documents of every source, and the one policy compiled from them.
#[derive(Debug)]
pub struct Hub {
    policy: Arc<ArcSwap<Policy>>,
    shared: HashSet<String>,
    defaults: Defaults,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
    outcomes: watch::Sender<Arc<Outcomes>>,
    /// Counts the file sets swapped in, so a refused xDS version is checked again
    /// when the files it clashed with change.
    files_swapped: watch::Sender<u64>,
    /// Counts the xDS versions swapped in, so a refused file edit is tried again
    /// when the xDS documents it clashed with change.
    xds_swapped: AtomicU64,
    /// See [`Status::refused`].
    refused: Mutex<BTreeMap<&'static str, String>>,
}

#[derive(Debug, Default)]
struct State {
    files: Vec<Document>,
    xds: Vec<Document>,
    policies: Vec<Candidate>,
}

impl State {
    /// The documents that always serve: files, then xDS.
    fn fixed(&self) -> Vec<Document> {
        let mut docs = self.files.clone();
        docs.extend(self.xds.iter().cloned());
        docs
    }
}

impl Hub {
    /// An empty hub (no documents, an empty policy).
    pub fn new(shared_domains: &[String], defaults: Defaults, metrics: Arc<Metrics>) -> Arc<Hub> {
        Arc::new(Hub {
            policy: Arc::new(ArcSwap::from_pointee(Policy::default())),
            shared: shared_domains.iter().cloned().collect(),
            defaults,
            metrics,
            state: Mutex::new(State::default()),
            outcomes: watch::channel(Arc::new(Outcomes::new())).0,
            files_swapped: watch::channel(0).0,
            xds_swapped: AtomicU64::new(0),
            refused: Mutex::new(BTreeMap::new()),
        })
    }

    /// The policy the request path reads.
    pub fn policy(&self) -> Arc<ArcSwap<Policy>> {
        self.policy.clone()
    }

    /// The verdicts of the latest policy, updated after each swap.
    pub fn outcomes(&self) -> watch::Receiver<Arc<Outcomes>> {
        self.outcomes.subscribe()
    }

    /// The sources' refusals and the policies' verdicts.
    pub fn status(&self) -> Status {
        Status {
            refused: self.refusals().clone(),
            outcomes: self.outcomes.borrow().clone(),
        }
    }

    /// Records why `source`'s latest change was refused; its next accepted change
    /// (or [`Hub::clear_refusal`]) clears it.
    pub fn refuse(&self, source: &'static str, error: String) {
        self.refusals().insert(source, error);
        self.metrics.policy_refused(source, true);
    }

    /// Forgets `source`'s refusal: what it has now is what serves.
    pub fn clear_refusal(&self, source: &'static str) {
        self.refusals().remove(source);
        self.metrics.policy_refused(source, false);
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, String>> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many file sets have been swapped in, updated after each.
    pub fn files_swapped(&self) -> watch::Receiver<u64> {
        self.files_swapped.subscribe()
    }

    /// How many xDS versions have been swapped in.
    pub fn xds_swapped(&self) -> u64 {
        self.xds_swapped.load(Ordering::Relaxed)
    }

    /// Replaces the file documents (a set that compiles on its own) and rebuilds,
    /// unless they do not compile together with the xDS documents: then nothing
    /// changes, now or at a later rebuild, and the errors say why.
    pub fn set_files(&self, docs: Vec<Document>) -> Result<(), Vec<PolicyError>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::replace(&mut state.files, docs);
        self.rebuild(&state, "file")
            .inspect_err(|_| state.files = old)?;
        self.clear_refusal("file");
        self.files_swapped.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Replaces the xDS documents and rebuilds, unless they do not compile together
    /// with the files: then nothing changes and the errors say why.
    pub fn set_xds(&self, docs: Vec<Document>) -> Result<(), Vec<PolicyError>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::replace(&mut state.xds, docs);
        self.rebuild(&state, "xds")
            .inspect_err(|_| state.xds = old)?;
        self.clear_refusal("xds");
        self.xds_swapped.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Replaces the RateLimitPolicy objects and rebuilds. Counted as a refused
    /// reload when a policy is newly `Invalid` or `Conflicted` (a new generation, or
    /// a new reason), as a file or xDS change that does not load is.
    pub fn set_policies(&self, policies: Vec<Candidate>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.policies = policies;
        let before = self.outcomes.borrow().clone();
        // resolve() passes policies only when they compile with the files and xDS,
        // which always compile together, so this does not fail.
        let compiled = self.rebuild(&state, "kube").is_ok();
        let after = self.outcomes.borrow().clone();
        let refused = after
            .iter()
            .any(|(key, o)| o.verdict != Acceptance::Accepted && before.get(key) != Some(o));
        self.metrics.policy_reload("kube", compiled && !refused);
        let standing = after.values().any(|o| o.verdict != Acceptance::Accepted);
        self.metrics.policy_refused("kube", standing);
    }

    /// Compiles `state` and swaps the result in; on an error nothing is swapped and
    /// the caller puts its documents back.
    fn rebuild(&self, state: &State, source: &str) -> Result<(), Vec<PolicyError>> {
        let (docs, outcomes) = resolve(&state.fixed(), &state.policies, &self.shared);
        let policy = compile_with(docs, &self.defaults)?;
        tracing::debug!(
            source,
            domains = policy.domains.len(),
            rules = policy.rule_count(),
            "policy compiled"
        );
        self.metrics.policy_swapped(&policy);
        self.policy.store(Arc::new(policy));
        self.outcomes.send_replace(Arc::new(outcomes));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_invalid_message_is_bounded_and_counts_what_it_leaves_out() {
        let error = |message: String| PolicyError {
            file: "ns/p".into(),
            line: None,
            message,
        };
        let many: Vec<PolicyError> = (0..9_000)
            .map(|i| error(format!("descriptor {i:05}: 'lease' is required")))
            .collect();
        let m = invalid_message(&many);
        assert!(m.len() <= MAX_MESSAGE + 64, "{}", m.len());
        assert!(m.starts_with("spec is invalid: descriptor 00000:"), "{m}");
        assert!(m.ends_with(" more error(s)"), "{m}");
        let shown = m.matches("'lease' is required").count();
        assert!(m.contains(&format!("and {} more", 9_000 - shown)), "{m}");
        // One long error is cut, not left out, and what follows is still counted.
        let long = error(format!("key '{}' is bad", "é".repeat(5_000)));
        let cut = invalid_message(&[long, error("b".repeat(100))]);
        assert!(cut.len() <= MAX_MESSAGE + 64, "{}", cut.len());
        assert!(cut.ends_with("...; and 1 more error(s)"), "{cut}");
        let few = invalid_message(&[error("a".into()), error("b".into())]);
        assert_eq!(few, "spec is invalid: a; b");
    }

    use super::*;
    use crate::policy::{compile, parse_str};

    fn file(text: &str) -> Vec<Document> {
        parse_str("file.yaml", text).unwrap()
    }

    fn cand(ns: &str, name: &str, created: &str, spec: serde_json::Value) -> Candidate {
        let current = crate::policy::parse_resource_spec(ns, name, &spec);
        Candidate {
            namespace: ns.into(),
            name: name.into(),
            created: created.into(),
            generation: 1,
            domain: spec["domain"].as_str().map(String::from),
            last_good: current.as_ref().ok().cloned(),
            claimed: current
                .is_err()
                .then(|| super::super::claim::claimed(ns, name, &spec))
                .flatten(),
            current,
        }
    }

    fn spec(domain: &str, key: &str) -> serde_json::Value {
        serde_json::json!({
            "domain": domain,
            "descriptors": [{"key": key, "rateLimit": {"unit": "second", "requestsPerUnit": 1}}]
        })
    }

    fn verdict(o: &Outcomes, key: &str) -> Acceptance {
        o[key].verdict.clone()
    }

    #[test]
    fn same_path_older_wins_whatever_the_input_order() {
        let a = cand("ns", "a", "2024-01-01T00:00:00Z", spec("d", "k"));
        let b = cand("ns", "b", "2024-01-02T00:00:00Z", spec("d", "k"));
        let (docs, o) = resolve(&[], &[b.clone(), a.clone()], &HashSet::new());
        assert_eq!(verdict(&o, "ns/a"), Acceptance::Accepted);
        assert!(
            matches!(verdict(&o, "ns/b"), Acceptance::Conflicted(m) if m.contains("already defined at ns/a"))
        );
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].source, "ns/a");
    }

    #[test]
    fn same_timestamp_orders_by_name_and_different_paths_merge() {
        let a = cand("ns", "a", "2024-01-01T00:00:00Z", spec("d", "k"));
        let b = cand("ns", "b", "2024-01-01T00:00:00Z", spec("d", "k"));
        let c = cand("ns", "c", "2024-01-01T00:00:00Z", spec("d", "other"));
        let (docs, o) = resolve(&[], &[c, b, a], &HashSet::new());
        assert_eq!(verdict(&o, "ns/a"), Acceptance::Accepted);
        assert!(matches!(verdict(&o, "ns/b"), Acceptance::Conflicted(_)));
        assert_eq!(verdict(&o, "ns/c"), Acceptance::Accepted);
        assert_eq!(docs.len(), 2);
        compile(docs).unwrap();
    }

    #[test]
    fn domain_belongs_to_the_oldest_namespace_unless_shared() {
        let a = cand("one", "a", "2024-01-01T00:00:00Z", spec("d", "k1"));
        let b = cand("two", "b", "2024-01-02T00:00:00Z", spec("d", "k2"));
        let (_, o) = resolve(&[], &[a.clone(), b.clone()], &HashSet::new());
        assert_eq!(verdict(&o, "one/a"), Acceptance::Accepted);
        assert!(
            matches!(verdict(&o, "two/b"), Acceptance::Conflicted(m) if m.contains("belongs to namespace 'one'") && m.contains("--shared-domains"))
        );
        let shared: HashSet<String> = ["d".to_string()].into();
        let (docs, o) = resolve(&[], &[a, b], &shared);
        assert_eq!(verdict(&o, "two/b"), Acceptance::Accepted);
        assert_eq!(docs.len(), 2);
    }

    #[test]
    fn invalid_policy_keeps_its_last_good_version_and_never_harms_others() {
        let good = cand("ns", "a", "2024-01-01T00:00:00Z", spec("d", "k"));
        let mut bad = cand(
            "ns",
            "a",
            "2024-01-01T00:00:00Z",
            serde_json::json!({"domain": "d", "descriptors": [{"key": "k"}, {"key": "k"}]}),
        );
        assert!(bad.current.is_err());
        bad.last_good = good.current.clone().ok();
        bad.generation = 2;
        let other = cand("ns", "b", "2024-01-02T00:00:00Z", spec("d", "k2"));
        let (docs, o) = resolve(&[], &[bad.clone(), other.clone()], &HashSet::new());
        assert!(
            matches!(verdict(&o, "ns/a"), Acceptance::Invalid(m) if m.contains("duplicate descriptor"))
        );
        assert_eq!(o["ns/a"].generation, 2);
        assert_eq!(verdict(&o, "ns/b"), Acceptance::Accepted);
        assert_eq!(docs.len(), 2, "the last good version and the other policy");

        // Without a last good version (another replica, just started) the verdicts
        // are the same.
        bad.last_good = None;
        let (docs2, o2) = resolve(&[], &[bad, other], &HashSet::new());
        assert_eq!(o, o2);
        assert_eq!(docs2.len(), 1);
    }

    /// An invalid edit to the older of two policies defining one path: the older
    /// one's last good version keeps the path, the newer stays Conflicted, and a
    /// replica that never saw the good version reaches the same verdicts.
    #[test]
    fn an_invalid_edit_to_the_older_policy_does_not_hand_its_path_over() {
        let older = cand("ns", "a", "2024-01-01T00:00:00Z", spec("d", "k"));
        let newer = cand("ns", "b", "2024-01-02T00:00:00Z", spec("d", "k"));
        let (_, before) = resolve(&[], &[older.clone(), newer.clone()], &HashSet::new());
        assert!(matches!(
            verdict(&before, "ns/b"),
            Acceptance::Conflicted(_)
        ));

        let mut edited = cand(
            "ns",
            "a",
            "2024-01-01T00:00:00Z",
            serde_json::json!({"domain": "d", "descriptors": [{"key": "k", "rateLimit": {"unit": "second"}}]}),
        );
        assert!(edited.current.is_err());
        edited.last_good = older.current.clone().ok();
        let (docs, o) = resolve(&[], &[edited.clone(), newer.clone()], &HashSet::new());
        assert!(matches!(verdict(&o, "ns/a"), Acceptance::Invalid(_)));
        let sources: Vec<&str> = docs.iter().map(|d| d.source.as_str()).collect();
        assert_eq!(sources, ["ns/a"], "the last good version serves");

        // The newer one is told which policy holds the path, and that it is Invalid
        // (it serves nothing here), not that it "keeps serving".
        assert!(
            matches!(verdict(&o, "ns/b"), Acceptance::Conflicted(m) if m.contains("older policy ns/a of domain 'd', which is Invalid")),
            "{:?}",
            verdict(&o, "ns/b")
        );
        edited.last_good = None;
        let (docs, fresh) = resolve(&[], &[edited, newer], &HashSet::new());
        assert_eq!(fresh, o);
        assert!(docs.is_empty());
    }

    #[test]
    fn a_file_and_a_policy_merge_and_on_a_clash_the_file_wins() {
        let files = file("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
        let merging = cand("ns", "a", "2024-01-01T00:00:00Z", spec("d", "k2"));
        let clashing = cand("ns", "b", "2024-01-02T00:00:00Z", spec("d", "k"));
        let (docs, o) = resolve(&files, &[merging, clashing], &HashSet::new());
        assert_eq!(verdict(&o, "ns/a"), Acceptance::Accepted);
        assert!(
            matches!(verdict(&o, "ns/b"), Acceptance::Conflicted(m) if m.contains("file.yaml"))
        );
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].source, "file.yaml");
    }

    #[test]
    fn xds_documents_merge_with_files_and_a_clash_changes_nothing() {
        let hub = Hub::new(&[], Defaults::default(), Arc::new(Metrics::new()));
        hub.set_files(file("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")).unwrap();
        let xds = |key: &str| {
            parse_str("xds:d", &format!("domain: d\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: second, requests_per_unit: 2}}\n")).unwrap()
        };
        hub.set_xds(xds("x")).unwrap();
        let p = hub.policy().load_full();
        assert!(p.domain("d").unwrap().find(&[("k", "v")]).is_some());
        assert!(p.domain("d").unwrap().find(&[("x", "v")]).is_some());
        let errors = hub.set_xds(xds("k")).unwrap_err();
        assert!(
            errors[0].message.contains("already defined at file.yaml"),
            "{errors:?}"
        );
        let p = hub.policy().load_full();
        assert!(
            p.domain("d").unwrap().find(&[("x", "v")]).is_some(),
            "the last good xDS documents serve"
        );
        hub.set_xds(Vec::new()).unwrap();
        assert!(hub
            .policy()
            .load()
            .domain("d")
            .unwrap()
            .find(&[("x", "v")])
            .is_none());
    }

    #[test]
    fn each_swap_exports_the_limits_and_drops_those_gone() {
        let metrics = Arc::new(Metrics::new());
        let hub = Hub::new(&[], Defaults::default(), metrics.clone());
        hub.set_files(file("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 7}\n")).unwrap();
        let series = r#"sluice_limit{algorithm="sliding_window_counter",descriptor="k",domain="d",rule="k"} 7"#;
        assert!(metrics.render().contains(series), "{}", metrics.render());
        hub.set_files(file("domain: d\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 8}\n")).unwrap();
        let text = metrics.render();
        assert!(!text.contains(series), "{text}");
        assert!(
            text.contains(r#"descriptor="j",domain="d",rule="j"} 8"#),
            "{text}"
        );
    }

    /// A RateLimitPolicy edit that is refused counts as a refused reload, once.
    #[test]
    fn a_refused_policy_edit_counts_as_a_refused_reload() {
        let metrics = Arc::new(Metrics::new());
        let hub = Hub::new(&[], Defaults::default(), metrics.clone());
        let count = |result: &str| {
            let series =
                format!("sluice_policy_reloads_total{{result=\"{result}\",source=\"kube\"}} ");
            let text = metrics.render();
            let line = text
                .lines()
                .find(|l| l.starts_with(&series))
                .map(String::from);
            line.map(|l| l[series.len()..].to_string())
                .unwrap_or_default()
        };
        // 1 while some policy is refused, whatever changed since.
        let refused = || {
            let series = "sluice_policy_refused{source=\"kube\"} ";
            let text = metrics.render();
            let line = text
                .lines()
                .find(|l| l.starts_with(series))
                .map(String::from);
            line.map(|l| l[series.len()..].to_string())
                .unwrap_or_default()
        };
        let good = cand("ns", "a", "2024-01-01T00:00:00Z", spec("d", "k"));
        hub.set_policies(vec![good.clone()]);
        assert_eq!((count("ok"), count("error")), ("1".into(), String::new()));
        assert_eq!(refused(), "0");

        let mut bad = cand(
            "ns",
            "a",
            "2024-01-01T00:00:00Z",
            serde_json::json!({"domain": "d", "descriptors": [{"key": "k"}, {"key": "k"}]}),
        );
        bad.generation = 2;
        bad.last_good = good.current.clone().ok();
        hub.set_policies(vec![bad.clone()]);
        assert_eq!(count("error"), "1");
        // Another object's change: the refusal is not news.
        let other = cand("ns", "b", "2024-01-02T00:00:00Z", spec("d", "j"));
        hub.set_policies(vec![bad, other.clone()]);
        assert_eq!((count("ok"), count("error")), ("2".into(), "1".into()));
        assert_eq!(refused(), "1", "the refusal stands");
        // A newer policy on a path already taken: Conflicted, refused.
        let clash = cand("ns", "c", "2024-01-03T00:00:00Z", spec("d", "j"));
        hub.set_policies(vec![good.clone(), other.clone(), clash]);
        assert_eq!(count("error"), "2");
        hub.set_policies(vec![good, other]);
        assert_eq!(refused(), "0", "every policy accepted");
    }

    #[test]
    fn hub_swaps_and_publishes() {
        let hub = Hub::new(&[], Defaults::default(), Arc::new(Metrics::new()));
        let rx = hub.outcomes();
        hub.set_files(file("domain: f\ndescriptors:\n  - key: k\n"))
            .unwrap();
        hub.set_policies(vec![cand(
            "ns",
            "a",
            "2024-01-01T00:00:00Z",
            spec("d", "k"),
        )]);
        let policy = hub.policy().load_full();
        assert!(policy.domain("f").is_some());
        assert!(policy.domain("d").is_some());
        assert_eq!(rx.borrow()["ns/a"].verdict, Acceptance::Accepted);
        hub.set_policies(Vec::new());
        assert!(hub.policy().load().domain("d").is_none());
    }
}
