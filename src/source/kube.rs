//! The Kubernetes source: watches `RateLimitPolicy` objects (all namespaces, or the
//! one of `--kube-namespace`), hands them to the [`Hub`], and writes each object's
//! `Accepted` condition through the status subresource.
//!
//! The watch survives anything: a failed list or watch (API server restarting,
//! network gone, the CRD not installed yet) is logged and retried with a back-off of
//! 0.5 s doubling to 5 s (shorter than kube-runtime's default 30 s, so a restarted API
//! server or a freshly installed CRD is picked up within seconds). After a re-list,
//! the known objects are replaced only once the list is complete, so limits never
//! vanish while the API server is away.
//!
//! Objects are read with their spec as raw JSON text ([`RawPolicy`]), not
//! deserialized into [`crate::crd::RateLimitPolicySpec`]: every spec goes through
//! [`policy::parse_resource_spec`], and an odd object, however deep, only makes
//! itself `Invalid`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use kube::api::{ApiResource, Patch, PatchParams};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::claim;
use super::hub::{Acceptance, Candidate, Hub, Outcomes};
use super::raw_policy::RawPolicy;
use crate::crd::{Condition, RateLimitPolicy, ACCEPTED};
use crate::policy::{self, Document, PolicyError};
use crate::telemetry::printable::printable;

/// Watches RateLimitPolicy objects and feeds the hub.
pub struct KubeSource {
    client: Client,
    resource: ApiResource,
    namespace: Option<String>,
    hub: Arc<Hub>,
    /// Counts the watches the API server accepted (see [`WatchOpened`]).
    opened: tokio::sync::watch::Receiver<u64>,
}

/// What is known about one object.
#[derive(Debug, Clone)]
struct Tracked {
    uid: Option<String>,
    candidate: Candidate,
    /// The `Accepted` condition stored in the object, as last seen.
    stored: Option<Condition>,
    /// Every condition stored in the object, as last seen: the others are other
    /// controllers', written back as they are.
    conditions: Vec<serde_json::Value>,
    /// `metadata.resourceVersion`, as last seen: a status write made from an
    /// older version of the object is refused (409), not applied over a newer.
    version: Option<String>,
    /// The API server refused its last status write: logged once, until a write
    /// is taken (a refusal such as RBAC's stands until an operator acts).
    refused: bool,
    /// When its spec last changed, in the order the watch saw changes: the latest
    /// change's status is written first (see [`KubeSource::write_statuses`]).
    changed: u64,
}

/// The User-Agent of Sluice's requests to the API server, which its audit log
/// records with each.
pub const USER_AGENT: &str = concat!("sluice/", env!("CARGO_PKG_VERSION"));

/// The API server and its credentials, from the in-cluster service account or
/// `KUBECONFIG`, with Sluice's [`USER_AGENT`].
pub async fn config() -> kube::Result<kube::Config> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    let agent = http::HeaderValue::from_static(USER_AGENT);
    config.headers.push((http::header::USER_AGENT, agent));
    Ok(config)
}

impl KubeSource {
    /// Connects with in-cluster config or `KUBECONFIG`.
    pub async fn connect(namespace: Option<String>, hub: Arc<Hub>) -> anyhow::Result<KubeSource> {
        let failed = |e: kube::Error| {
            anyhow::anyhow!(
                "--kube: cannot configure a Kubernetes client (in-cluster service account or KUBECONFIG): {e}"
            )
        };
        let config = config().await.map_err(failed)?;
        let (opened_tx, opened) = tokio::sync::watch::channel(0);
        let client = kube::client::ClientBuilder::try_from(config)
            .map_err(failed)?
            .with_layer(&WatchOpened(Arc::new(opened_tx)))
            .build();
        Ok(KubeSource {
            client,
            resource: ApiResource::erase::<RateLimitPolicy>(&()),
            namespace,
            hub,
            opened,
        })
    }

    fn api(&self, namespace: Option<&str>) -> Api<RawPolicy> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &self.resource),
            None => Api::all_with(self.client.clone(), &self.resource),
        }
    }

    /// Watches until `shutdown` resolves. `first` is told when the first list is in
    /// the hub, or when the first attempt failed (CRD missing, API server away), so
    /// start-up can wait for the cluster's policies without hanging on a broken
    /// cluster.
    pub async fn run(self, shutdown: impl Future<Output = ()>, first: oneshot::Sender<()>) {
        let mut first = Some(first);
        tokio::pin!(shutdown);
        let scope = self
            .namespace
            .as_deref()
            .map_or("all namespaces".to_string(), |ns| format!("namespace {ns}"));
        tracing::info!(scope = %scope, "watching RateLimitPolicy objects");
        let stream = backed_off(
            watcher::watcher(
                self.api(self.namespace.as_deref()),
                watcher::Config::default(),
            ),
            QuickBackoff::default(),
        );
        tokio::pin!(stream);
        let mut outcomes = self.hub.outcomes();
        let mut retry = tokio::time::interval(Duration::from_secs(5));
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        let mut objects: BTreeMap<String, Tracked> = BTreeMap::new();
        let mut listing: Option<BTreeMap<String, Tracked>> = None;
        let mut failing = false;
        // A watch resumed where it left off sends no event until something changes:
        // the API server accepting it is what says the watch is back.
        let mut opened = self.opened.clone();
        let mut listed = false;
        // Statuses left to write when the last round ran out of its time.
        let mut more = false;
        // Status writes cannot reach the API server: said once, until one succeeds.
        let mut unreachable = false;
        // While events keep coming (a burst, or a resumed watch's missed versions):
        // when its first came, and when statuses are written if no other comes.
        let mut burst: Option<(Instant, Instant)> = None;
        let mut changes = 0;
        loop {
            let mut changed = false;
            let settled = burst.map(|(_, at)| at);
            tokio::select! {
                // Events before statuses: a policy's change must not wait for the
                // statuses of a burst of others.
                biased;
                _ = &mut shutdown => return,
                event = stream.next() => {
                    let Some(event) = event else {
                        tracing::error!("the RateLimitPolicy watch ended; Kubernetes policies are no longer updated");
                        return;
                    };
                    let was_failing = failing;
                    let mut watch = Watch {
                        objects: &mut objects,
                        listing: &mut listing,
                        failing: &mut failing,
                        listed: &mut listed,
                        first: &mut first,
                        scope: &scope,
                        changes: &mut changes,
                    };
                    changed = watch.take(event);
                    // Every event already waiting is taken before compiling: a
                    // burst (a namespace's policies deleted at once, many applied
                    // together) compiles once, not once per object.
                    while let Some(Some(event)) = stream.next().now_or_never() {
                        changed |= watch.take(event);
                    }
                    if failing && !was_failing {
                        // Only a watch opened after this failure restores it.
                        opened.borrow_and_update();
                    }
                    let now = Instant::now();
                    let first = burst.map_or(now, |(first, _)| first);
                    burst = Some((first, (now + SETTLE).min(first + SETTLE_MAX)));
                },
                Ok(()) = opened.changed(), if failing => {
                    tracing::info!(scope = %scope, "RateLimitPolicy watch restored");
                    failing = false;
                }
                _ = tokio::time::sleep_until(settled.unwrap_or_else(Instant::now)), if settled.is_some() => {}
                Ok(()) = outcomes.changed(), if settled.is_none() => {}
                _ = std::future::ready(()), if more && settled.is_none() => {}
                _ = retry.tick() => {}
            }
            if changed {
                let candidates = objects.values().map(|t| t.candidate.clone()).collect();
                // Compiling many policies takes milliseconds: the runtime moves
                // this thread's other tasks (requests) to another meanwhile.
                let compile = || self.hub.set_policies(candidates);
                match tokio::runtime::Handle::current().runtime_flavor() {
                    tokio::runtime::RuntimeFlavor::CurrentThread => compile(),
                    _ => tokio::task::block_in_place(compile),
                }
            }
            if listed {
                if let Some(tx) = first.take() {
                    let _ = tx.send(());
                }
            }
            if let Some((_, at)) = burst {
                if Instant::now() < at {
                    continue;
                }
                burst = None;
            }
            let latest = outcomes.borrow_and_update().clone();
            more = self
                .write_statuses(&mut objects, &latest, &mut unreachable)
                .await;
        }
    }

    /// Patches every object whose stored `Accepted` condition differs from the
    /// computed one.
    ///
    /// Several replicas must not fight over the status. Each replica computes the
    /// verdicts from the same objects (and the same policy files), ordered only by
    /// data in the objects (see [`super::hub`]), so all reach the same condition; and
    /// a replica patches only when the stored condition (status, reason, message,
    /// observedGeneration) differs from it. The first replica's patch makes the
    /// others' comparisons equal, so a status is written once per change, not once
    /// per replica, and never flips back and forth. `lastTransitionTime` is kept when
    /// the status (True/False) does not change, and is left out of the comparison.
    /// A failed patch is retried on the next event or every 5 s. When the API
    /// server cannot take writes (no answer, none in time, or a refusal of its own:
    /// see [`server_wide`]), the round stops there rather than wait on every object
    /// in turn, and says so once (`unreachable`) until a write succeeds; a refusal
    /// of one object's patch is that object's.
    ///
    /// It runs once the watch has been quiet for [`SETTLE`] (at most [`SETTLE_MAX`]
    /// after a burst began), so a burst of versions is written once, with its end.
    /// Writing stops after [`STATUS_ROUND`] so that waiting events are taken first;
    /// it returns true when statuses are left to write (and the API server is
    /// taking them), to be called again at once. The latest spec change is
    /// written first ([`latest_first`]).
    ///
    /// This holds for replicas of one Deployment, which share their flags and
    /// files (at the same paths: a `Conflicted` message may name a file). Two differently configured instances watching the same objects (say,
    /// one with `--kube-namespace` and one without, or different `--shared-domains`)
    /// can reach different verdicts and would overwrite each other's status: give
    /// such instances disjoint namespaces.
    async fn write_statuses(
        &self,
        objects: &mut BTreeMap<String, Tracked>,
        outcomes: &Outcomes,
        unreachable: &mut bool,
    ) -> bool {
        let started = Instant::now();
        let mut written = false;
        for (key, t) in latest_first(objects) {
            let Some(outcome) = outcomes.get(key) else {
                continue;
            };
            if outcome.generation != t.candidate.generation {
                continue;
            }
            let wanted = condition(&outcome.verdict, outcome.generation);
            if t.stored.as_ref().is_some_and(|s| same(s, &wanted)) {
                continue;
            }
            if written && started.elapsed() >= STATUS_ROUND {
                return true;
            }
            let mut patch_cond = wanted.clone();
            patch_cond.last_transition_time = match &t.stored {
                Some(s) if s.status == wanted.status && s.last_transition_time.is_some() => {
                    s.last_transition_time.clone()
                }
                _ => Some(now_rfc3339()),
            };
            // A merge patch replaces the whole list: the others go back as read,
            // and the version makes the API server refuse the write if any
            // changed since.
            let ours = serde_json::to_value(&patch_cond).unwrap_or_default();
            let mut conditions = t.conditions.clone();
            match conditions.iter_mut().find(|c| c["type"] == ACCEPTED) {
                Some(c) => *c = ours,
                None => conditions.push(ours),
            }
            let patch = json!({
                "metadata": {"resourceVersion": t.version},
                "status": {
                    "observedGeneration": outcome.generation,
                    "conditions": conditions,
                }
            });
            let api = self.api(Some(&t.candidate.namespace));
            let params = PatchParams::default();
            let patch = Patch::Merge(&patch);
            let call = api.patch_status(&t.candidate.name, &params, &patch);
            match tokio::time::timeout(Duration::from_secs(10), call).await {
                Ok(Ok(written_obj)) => {
                    if std::mem::take(unreachable) {
                        tracing::info!("writing RateLimitPolicy statuses again");
                    }
                    match &outcome.verdict {
                        Acceptance::Accepted => {
                            tracing::info!(policy = %key, "RateLimitPolicy accepted")
                        }
                        _ => tracing::warn!(
                            policy = %key,
                            reason = %wanted.reason,
                            "RateLimitPolicy not accepted: {}",
                            printable(&wanted.message)
                        ),
                    }
                    t.stored = Some(patch_cond);
                    t.conditions = conditions;
                    t.version = written_obj.metadata.resource_version;
                    t.refused = false;
                    written = true;
                }
                Ok(Err(kube::Error::Api(e))) if e.code == 409 => {
                    // Written since it was read (another controller's condition,
                    // an edit): its watch event brings it, and a round after it.
                    tracing::debug!(policy = %key, "status changed since read; written again after the change arrives");
                }
                Ok(Err(kube::Error::Api(e))) if !server_wide(&e) => {
                    if !std::mem::replace(&mut t.refused, true) {
                        tracing::warn!(policy = %key, error = %e, "cannot write status; will retry")
                    }
                }
                failed => {
                    if !std::mem::replace(unreachable, true) {
                        let error = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => "no answer within 10 s".to_string(),
                        };
                        tracing::warn!(
                            policy = %key,
                            error = %error,
                            "cannot reach the API server to write statuses; retrying every 5 s"
                        );
                    }
                    return false;
                }
            }
        }
        false
    }
}

/// The objects, the one whose spec changed last first: an edit made during a burst
/// of others (a team's manifests applied, a namespace deleted) gets its status
/// without waiting for theirs, as its effect does not wait for their compiling.
fn latest_first(objects: &mut BTreeMap<String, Tracked>) -> Vec<(&String, &mut Tracked)> {
    let mut order: Vec<_> = objects.iter_mut().collect();
    order.sort_by_key(|(_, t)| std::cmp::Reverse(t.changed));
    order
}

/// Whether a refused status write says the API server cannot take writes now,
/// rather than something of this object: an overload or failure of its own (429,
/// 5xx), or an answer that is not its verdict on an object at all, such as the
/// plain "404 page not found" a restarting API server gives for a kind it does not
/// serve yet.
fn server_wide(status: &kube::core::Status) -> bool {
    status.code == 429
        || status.code >= 500
        || !kube::core::response::reason::is_known(&status.reason)
}

/// Statuses are written once the watch has sent no event for this long: the events
/// of a burst reach the source one by one through the client's connection task, and
/// a resumed watch sends one per version it missed, so each policy's status is
/// written once with its final state, not once per version.
const SETTLE: Duration = Duration::from_millis(100);

/// The longest statuses wait for a burst to end.
const SETTLE_MAX: Duration = Duration::from_secs(1);

/// How long one round of status writes may run before waiting events are taken.
const STATUS_ROUND: Duration = Duration::from_millis(250);

/// The watch's state, as one event changes it.
struct Watch<'a> {
    objects: &'a mut BTreeMap<String, Tracked>,
    /// A re-list in progress: replaces `objects` once complete.
    listing: &'a mut Option<BTreeMap<String, Tracked>>,
    failing: &'a mut bool,
    listed: &'a mut bool,
    first: &'a mut Option<oneshot::Sender<()>>,
    scope: &'a str,
    /// Spec changes seen so far, to number the next ([`Tracked::changed`]).
    changes: &'a mut u64,
}

impl Watch<'_> {
    /// Takes one event; true when the policies to serve changed.
    fn take(&mut self, event: Result<Event<RawPolicy>, watcher::Error>) -> bool {
        let scope = self.scope;
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                log_watch_error(&e, scope, *self.failing);
                *self.failing = true;
                // A list cut short is started again from scratch.
                *self.listing = None;
                if let Some(tx) = self.first.take() {
                    let _ = tx.send(());
                }
                return false;
            }
        };
        if *self.failing {
            tracing::info!(scope = %scope, "RateLimitPolicy watch restored");
            *self.failing = false;
        }
        match event {
            // Dropped by backed_off(); a new list starts empty anyway.
            Event::Init => {
                *self.listing = None;
                false
            }
            Event::InitApply(obj) => {
                let (key, t) = track(obj, self.objects, self.changes);
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key, t);
                false
            }
            Event::InitDone => {
                let list = self.listing.take().unwrap_or_default();
                tracing::info!(policies = list.len(), scope = %scope, "RateLimitPolicy objects listed");
                let changed = differs(self.objects, &list) || self.objects.is_empty();
                *self.objects = list;
                *self.listed = true;
                changed
            }
            Event::Apply(obj) => {
                let (key, t) = track(obj, self.objects, self.changes);
                let changed = self
                    .objects
                    .get(&key)
                    .is_none_or(|old| old.candidate != t.candidate);
                self.objects.insert(key, t);
                changed
            }
            Event::Delete(obj) => {
                let key = key_of(&obj);
                tracing::info!(policy = %key, "RateLimitPolicy deleted");
                self.objects.remove(&key).is_some()
            }
        }
    }
}

/// A layer of the API client that counts the watch requests the API server
/// accepts (answered 200: the watch is open), so the source can say the watch is
/// back as soon as it is, not at the next event, which a quiet cluster may not send
/// for hours.
#[derive(Clone)]
struct WatchOpened(Arc<tokio::sync::watch::Sender<u64>>);

impl<S> tower_layer::Layer<S> for WatchOpened {
    type Service = WatchOpenedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WatchOpenedService {
            inner,
            opened: self.0.clone(),
        }
    }
}

/// The service of [`WatchOpened`].
#[derive(Clone)]
struct WatchOpenedService<S> {
    inner: S,
    opened: Arc<tokio::sync::watch::Sender<u64>>,
}

impl<S, B, R> tower_service::Service<http::Request<B>> for WatchOpenedService<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true"));
        let answer = self.inner.call(req);
        let opened = self.opened.clone();
        Box::pin(async move {
            let response = answer.await?;
            if watch && response.status().is_success() {
                opened.send_modify(|n| *n = n.wrapping_add(1));
            }
            Ok(response)
        })
    }
}

/// The condition for a verdict.
pub fn condition(verdict: &Acceptance, generation: i64) -> Condition {
    let (status, reason, message) = match verdict {
        Acceptance::Accepted => ("True", "Accepted", "the policy is serving".to_string()),
        Acceptance::Invalid(m) => ("False", "Invalid", m.clone()),
        Acceptance::Conflicted(m) => ("False", "Conflicted", m.clone()),
    };
    Condition {
        type_: ACCEPTED.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: Some(generation),
        last_transition_time: None,
    }
}

/// Equal but for `lastTransitionTime`.
fn same(a: &Condition, b: &Condition) -> bool {
    a.type_ == b.type_
        && a.status == b.status
        && a.reason == b.reason
        && a.message == b.message
        && a.observed_generation == b.observed_generation
}

fn key_of(obj: &RawPolicy) -> String {
    format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or(""),
        obj.metadata.name.as_deref().unwrap_or("")
    )
}

/// Converts an object, re-using the parse of an unchanged generation and carrying
/// the last good version of the same object (same uid).
fn track(
    obj: RawPolicy,
    known: &BTreeMap<String, Tracked>,
    changes: &mut u64,
) -> (String, Tracked) {
    let key = key_of(&obj);
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let name = obj.metadata.name.clone().unwrap_or_default();
    let generation = obj.metadata.generation.unwrap_or(0);
    let uid = obj.metadata.uid.clone();
    let created = obj
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    let conditions = obj.conditions();
    let stored = conditions
        .iter()
        .find(|c| c["type"] == ACCEPTED)
        .and_then(|c| serde_json::from_value(c.clone()).ok());
    let version = obj.metadata.resource_version.clone();
    let previous = known.get(&key).filter(|old| old.uid == uid);
    let (spec, unreadable) = match obj.spec() {
        Ok(spec) => (spec, None),
        Err((why, known)) => (known, Some(why)),
    };

    let current = match (previous, unreadable) {
        (Some(old), _) if old.candidate.generation == generation => old.candidate.current.clone(),
        (_, Some(why)) => Err(vec![PolicyError {
            file: format!("{namespace}/{name}"),
            line: None,
            message: why,
        }]),
        (_, None) => parse(&namespace, &name, &spec),
    };
    let changed = match previous {
        Some(old) if old.candidate.generation == generation => old.changed,
        _ => {
            *changes += 1;
            *changes
        }
    };
    let last_good = match &current {
        Ok(doc) => Some(doc.clone()),
        Err(_) => previous.and_then(|old| old.candidate.last_good.clone()),
    };
    if previous.is_none_or(|old| old.candidate.generation != generation) {
        match &current {
            Ok(doc) => {
                tracing::info!(policy = %key, generation, domain = %doc.domain, "RateLimitPolicy read")
            }
            Err(errors) => tracing::warn!(
                policy = %key,
                generation,
                "RateLimitPolicy is invalid: {}",
                printable(&errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
            ),
        }
    }
    let claimed = match &current {
        Err(_) => claim::claimed(&namespace, &name, &spec),
        Ok(_) => None,
    };
    let candidate = Candidate {
        namespace,
        name,
        created,
        generation,
        domain: spec
            .get("domain")
            .and_then(|d| d.as_str())
            .map(String::from),
        current,
        last_good,
        claimed,
    };
    (
        key,
        Tracked {
            refused: previous.is_some_and(|old| old.refused),
            uid,
            candidate,
            stored,
            conditions,
            version,
            changed,
        },
    )
}

fn parse(
    namespace: &str,
    name: &str,
    spec: &serde_json::Value,
) -> Result<Document, Vec<PolicyError>> {
    if spec.is_null() {
        return Err(vec![PolicyError {
            file: format!("{namespace}/{name}"),
            line: None,
            message: "RateLimitPolicy has no 'spec'".to_string(),
        }]);
    }
    policy::parse_resource_spec(namespace, name, spec)
}

fn differs(a: &BTreeMap<String, Tracked>, b: &BTreeMap<String, Tracked>) -> bool {
    a.len() != b.len()
        || a.iter()
            .zip(b.iter())
            .any(|((ka, ta), (kb, tb))| ka != kb || ta.candidate != tb.candidate)
}

fn log_watch_error(e: &watcher::Error, scope: &str, repeated: bool) {
    let not_found = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 404,
        watcher::Error::WatchError(s) => s.code == 404,
        _ => false,
    };
    if repeated {
        tracing::debug!(scope, error = %e, "RateLimitPolicy watch still failing; retrying");
    } else if not_found {
        tracing::warn!(
            scope,
            "the RateLimitPolicy CRD is not installed (install it with `sluice crd | kubectl apply -f -`); waiting for it"
        );
    } else {
        tracing::warn!(scope, error = %e, "RateLimitPolicy watch failed; retrying with back-off (the current policies keep serving)");
    }
}

/// The watcher's events, errors retried after `backoff`, which restarts only once
/// objects (or their absence) are actually read. kube-runtime's `Event::Init`
/// opens every attempt to list, including those about to fail, so it is dropped
/// here: passed on, it would count as a success, restart the back-off on every
/// retry and report the watch restored each time.
fn backed_off<S, B>(events: S, backoff: B) -> impl Stream<Item = S::Item>
where
    S: Stream<Item = Result<Event<RawPolicy>, watcher::Error>>,
    B: Backoff,
{
    // Fused: the loop takes waiting events until none is ready, and may poll it
    // again after an end.
    events
        .filter(|e| std::future::ready(!matches!(e, Ok(Event::Init))))
        .backoff(backoff)
        .fuse()
}

/// 0.5 s doubling to 5 s, reset after a success.
#[derive(Debug, Clone)]
pub(super) struct QuickBackoff {
    next: Duration,
}

impl Default for QuickBackoff {
    fn default() -> Self {
        QuickBackoff {
            next: Duration::from_millis(500),
        }
    }
}

impl Iterator for QuickBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (self.next * 2).min(Duration::from_secs(5));
        Some(now)
    }
}

impl Backoff for QuickBackoff {
    fn reset(&mut self) {
        *self = QuickBackoff::default();
    }
}

/// The current time as RFC 3339 with seconds (what Kubernetes stores).
fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    let secs = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
    secs.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_compare_without_transition_time() {
        let a = condition(&Acceptance::Invalid("x".into()), 3);
        let mut b = a.clone();
        b.last_transition_time = Some(now_rfc3339());
        assert!(same(&a, &b));
        assert!(!same(&a, &condition(&Acceptance::Invalid("x".into()), 4)));
        assert!(!same(&a, &condition(&Acceptance::Accepted, 3)));
        assert!(now_rfc3339().ends_with('Z'));
    }

    fn policy(name: &str, generation: i64, limit: u32) -> RawPolicy {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "uid": name, "generation": generation},
            "spec": {"domain": name, "descriptors": [
                {"key": "user", "rateLimit": {"unit": "minute", "requestsPerUnit": limit}}
            ]},
        }))
        .unwrap()
    }

    /// A burst of policies and then an edit of one older than them: the edit's
    /// status is written first; a status written back (same generation) moves
    /// nothing.
    #[test]
    fn the_latest_spec_change_is_written_first() {
        let mut objects = BTreeMap::new();
        let mut changes = 0;
        let mut take = |objects: &mut BTreeMap<String, Tracked>, p: RawPolicy| {
            let (key, t) = track(p, objects, &mut changes);
            objects.insert(key, t);
        };
        take(&mut objects, policy("zeta", 1, 2));
        for i in 0..5 {
            take(&mut objects, policy(&format!("p{i}"), 1, 5));
        }
        take(&mut objects, policy("zeta", 2, 3));
        take(&mut objects, policy("p4", 1, 5));
        let order = |objects: &mut BTreeMap<String, Tracked>| -> Vec<String> {
            latest_first(objects)
                .into_iter()
                .map(|(k, _)| k.clone())
                .collect()
        };
        assert_eq!(
            order(&mut objects),
            ["ns/zeta", "ns/p4", "ns/p3", "ns/p2", "ns/p1", "ns/p0"]
        );
        take(&mut objects, policy("p0", 2, 6));
        assert_eq!(order(&mut objects)[..2], ["ns/p0", "ns/zeta"]);
    }

    /// A refusal that is the API server's verdict on the object stays the object's;
    /// overload, failure and answers that are not the API server's own (how kube's
    /// client reads a plain-text body) stop the round.
    #[test]
    fn only_refusals_about_the_object_are_the_object_s() {
        use kube::core::Status;
        let own = |reason: &str, code| Status::failure("x", reason).with_code(code);
        for status in [
            own("NotFound", 404),
            own("Conflict", 409),
            own("Forbidden", 403),
        ] {
            assert!(!server_wide(&status), "{status:?}");
        }
        let page = Status::failure("404 page not found", "Failed to parse error data");
        for status in [
            page.with_code(404),
            own("ServiceUnavailable", 503),
            own("TooManyRequests", 429),
            own("InternalError", 500),
        ] {
            assert!(server_wide(&status), "{status:?}");
        }
    }

    /// What a back-off would wait, recorded, without waiting.
    #[derive(Clone, Default)]
    struct Recorded {
        inner: QuickBackoff,
        waits: Arc<std::sync::Mutex<Vec<u128>>>,
    }

    impl Iterator for Recorded {
        type Item = Duration;
        fn next(&mut self) -> Option<Duration> {
            let wait = self.inner.next()?;
            self.waits.lock().unwrap().push(wait.as_millis());
            Some(Duration::ZERO)
        }
    }

    impl Backoff for Recorded {
        fn reset(&mut self) {
            self.inner.reset();
        }
    }

    /// Each failed attempt opens with `Init`; the waits still double, and restart
    /// only after a list that succeeded.
    #[tokio::test]
    async fn failed_lists_back_off_doubling_and_a_good_list_restarts_it() {
        let failed = || [Ok(Event::Init), Err(watcher::Error::NoResourceVersion)];
        let mut script: Vec<Result<Event<RawPolicy>, watcher::Error>> = Vec::new();
        for _ in 0..5 {
            script.extend(failed());
        }
        script.extend([Ok(Event::Init), Ok(Event::InitDone)]);
        script.extend(failed());
        let recorded = Recorded::default();
        let events: Vec<_> = backed_off(futures::stream::iter(script), recorded.clone())
            .collect()
            .await;
        let waits = recorded.waits.lock().unwrap().clone();
        assert_eq!(waits, [500, 1000, 2000, 4000, 5000, 500]);
        assert!(
            !events.iter().any(|e| matches!(e, Ok(Event::Init))),
            "no attempt to list passes for a success"
        );
    }

    #[test]
    fn backoff_doubles_to_five_seconds_and_resets() {
        let mut b = QuickBackoff::default();
        let seen: Vec<u128> = (0..6).map(|_| b.next().unwrap().as_millis()).collect();
        assert_eq!(seen, [500, 1000, 2000, 4000, 5000, 5000]);
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(500)));
    }
}
