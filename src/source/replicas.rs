//! The replica count from Kubernetes (`--local-share-service`): watches the
//! `discovery.k8s.io/v1` EndpointSlices of Sluice's own Service and reports how many
//! distinct endpoints are ready, for `failure_mode: local`'s share of a limit.
//!
//! An endpoint is ready unless its `conditions.ready` is false (Kubernetes reads a
//! missing condition as ready). One pod can appear in several slices (one per address
//! family, or while the controller moves it), so endpoints are told apart by their
//! `targetRef` (its uid, else its kind, namespace and name), else by their addresses.
//!
//! The count is never a reason to stop: a watch that cannot list (the API server
//! away, RBAC refusing, the API not served) is logged once per failing streak,
//! shown in `sluice_local_share_kubernetes_failing`, and retried with the policy
//! watch's back-off (0.5 s doubling to 5 s); the last count stands meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::Value;

use super::kube::QuickBackoff;
use crate::telemetry::Metrics;

/// The label Kubernetes puts on every EndpointSlice of a Service.
const SERVICE_LABEL: &str = "kubernetes.io/service-name";

/// `--local-share-service`: `NAME`, or `NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    /// None: the client's namespace (the pod's own in a cluster, the kubeconfig
    /// context's outside one).
    pub namespace: Option<String>,
    pub name: String,
}

impl FromStr for ServiceRef {
    type Err = String;

    fn from_str(s: &str) -> Result<ServiceRef, String> {
        let (namespace, name) = match s.split_once('/') {
            Some((ns, name)) => (Some(ns), name),
            None => (None, s),
        };
        let label = |what: &str, v: &str| -> Result<String, String> {
            let ok = !v.is_empty()
                && v.len() <= 63
                && v.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !v.starts_with('-')
                && !v.ends_with('-');
            if ok {
                Ok(v.to_string())
            } else {
                Err(format!(
                    "expected NAME or NAMESPACE/NAME of a Service, got {s:?}: the {what} must be \
                     1-63 lowercase letters, digits or '-', starting and ending with a letter or digit"
                ))
            }
        };
        Ok(ServiceRef {
            namespace: namespace.map(|ns| label("namespace", ns)).transpose()?,
            name: label("name", name)?,
        })
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Watches one Service's EndpointSlices.
pub struct ReplicaWatch {
    api: Api<DynamicObject>,
    /// `NAMESPACE/NAME`, for logs.
    service: String,
    name: String,
    metrics: Arc<Metrics>,
}

impl ReplicaWatch {
    /// Connects with in-cluster config or `KUBECONFIG`. A failure is the caller's
    /// to log: it leaves the count to the store or the configured one.
    pub async fn connect(service: &ServiceRef, metrics: Arc<Metrics>) -> kube::Result<Self> {
        let client = Client::try_from(super::kube::config().await?)?;
        let namespace = service
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let resource = ApiResource::erase::<EndpointSlice>(&());
        Ok(ReplicaWatch {
            api: Api::namespaced_with(client, &namespace, &resource),
            service: format!("{namespace}/{}", service.name),
            name: service.name.clone(),
            metrics,
        })
    }

    /// Watches until `shutdown`, calling `learn` with each new count (0: no ready
    /// endpoint, or no slice at all).
    ///
    /// After a failure the watch starts over with a full list rather than resuming:
    /// a resumed watch says nothing until a slice changes, and a complete list is
    /// what shows that the count is current again.
    pub async fn run(self, shutdown: impl Future<Output = ()>, learn: impl Fn(u32) + Send) {
        tokio::pin!(shutdown);
        tracing::info!(service = %self.service, "counting replicas from the Service's EndpointSlices");
        let config = watcher::Config::default().labels(&format!("{SERVICE_LABEL}={}", self.name));
        let mut slices = Slices::default();
        let mut backoff = QuickBackoff::default();
        let mut failing = false;
        loop {
            let stream = watcher::watcher(self.api.clone(), config.clone());
            tokio::pin!(stream);
            let error = loop {
                let event = tokio::select! {
                    _ = &mut shutdown => return,
                    event = stream.next() => event,
                };
                let event = match event {
                    None => break None,
                    Some(Err(e)) => break Some(e),
                    Some(Ok(event)) => event,
                };
                let listed = matches!(event, Event::InitDone);
                if let Some(n) = slices.apply(event) {
                    if n == 0 {
                        tracing::warn!(
                            service = %self.service,
                            "the Service has no ready endpoint in its EndpointSlices: the replica count is not taken from Kubernetes"
                        );
                    }
                    learn(n);
                }
                if listed {
                    backoff.reset();
                    if failing {
                        tracing::info!(service = %self.service, "EndpointSlices read again");
                        self.metrics.local().kubernetes_failing(false);
                        failing = false;
                    }
                }
            };
            match error {
                // A resource version too old to resume from: list again, as usual.
                Some(watcher::Error::WatchError(s)) if s.code == 410 => {}
                Some(e) if !failing => {
                    self.log_failure(&e);
                    self.metrics.local().kubernetes_failing(true);
                    failing = true;
                }
                Some(e) => {
                    tracing::debug!(service = %self.service, error = %e, "EndpointSlices still cannot be read")
                }
                None => {}
            }
            let wait = backoff.next().unwrap_or(Duration::from_secs(5));
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn log_failure(&self, e: &watcher::Error) {
        let status = match e {
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
            watcher::Error::WatchError(s) => Some(s.code),
            _ => None,
        };
        let why = match status {
            Some(403) => "not allowed: grant get, list and watch on endpointslices.discovery.k8s.io in the Service's namespace",
            Some(404) => "the API server does not serve discovery.k8s.io/v1 EndpointSlices",
            _ => "cannot read the Service's EndpointSlices",
        };
        tracing::warn!(
            service = %self.service,
            error = %e,
            "failure_mode local: {why}; the replica count from Kubernetes keeps its last value (or the store's, or --local-share-replicas) and the watch retries"
        );
    }
}

/// The slices last seen, and the count last reported.
#[derive(Debug, Default)]
struct Slices {
    known: BTreeMap<String, Vec<String>>,
    /// A list in progress: it replaces `known` once complete, so a list cut short
    /// never lowers the count.
    listing: Option<BTreeMap<String, Vec<String>>>,
    listed: bool,
    reported: Option<u32>,
}

impl Slices {
    /// Takes in one watch event; answers the count when it is new.
    fn apply(&mut self, event: Event<DynamicObject>) -> Option<u32> {
        match event {
            Event::Init => self.listing = Some(BTreeMap::new()),
            Event::InitApply(obj) => {
                let (key, ready) = read(&obj);
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key, ready);
            }
            Event::InitDone => {
                self.known = self.listing.take().unwrap_or_default();
                self.listed = true;
            }
            Event::Apply(obj) => {
                let (key, ready) = read(&obj);
                self.known.insert(key, ready);
            }
            Event::Delete(obj) => {
                self.known.remove(&read(&obj).0);
            }
        }
        if !self.listed {
            return None;
        }
        let n = count(self.known.values());
        (self.reported != Some(n)).then(|| {
            self.reported = Some(n);
            n
        })
    }
}

/// A slice's `NAMESPACE/NAME` and the identities of its ready endpoints.
fn read(obj: &DynamicObject) -> (String, Vec<String>) {
    let key = format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or(""),
        obj.metadata.name.as_deref().unwrap_or("")
    );
    (key, ready_endpoints(obj.data.get("endpoints")))
}

/// The identities of the ready endpoints in a slice's `endpoints` list; anything
/// not shaped like one is skipped.
fn ready_endpoints(endpoints: Option<&Value>) -> Vec<String> {
    let Some(list) = endpoints.and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter(|e| e.pointer("/conditions/ready").and_then(Value::as_bool) != Some(false))
        .filter_map(identity)
        .collect()
}

fn identity(endpoint: &Value) -> Option<String> {
    let text = |path: &str| {
        endpoint
            .pointer(path)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    if let Some(uid) = text("/targetRef/uid") {
        return Some(format!("uid {uid}"));
    }
    if let Some(name) = text("/targetRef/name") {
        let kind = text("/targetRef/kind").unwrap_or("");
        let ns = text("/targetRef/namespace").unwrap_or("");
        return Some(format!("ref {kind}/{ns}/{name}"));
    }
    let mut addresses: Vec<&str> = endpoint
        .get("addresses")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if addresses.is_empty() {
        return None;
    }
    addresses.sort_unstable();
    Some(format!("addresses {}", addresses.join(",")))
}

/// Distinct ready endpoints over every slice.
fn count<'a>(slices: impl Iterator<Item = &'a Vec<String>>) -> u32 {
    let distinct: BTreeSet<&String> = slices.flatten().collect();
    u32::try_from(distinct.len()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(endpoints: Value) -> Vec<String> {
        ready_endpoints(Some(&endpoints))
    }

    #[test]
    fn ready_endpoints_are_counted_once_across_slices() {
        let v4 = slice(json!([
            {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "a", "uid": "u-a"}},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": false}, "targetRef": {"kind": "Pod", "name": "b", "uid": "u-b"}},
            {"addresses": ["10.0.0.3"], "targetRef": {"kind": "Pod", "name": "c", "uid": "u-c"}},
            {"addresses": ["10.0.0.4"], "conditions": {}},
        ]));
        // The same pods' IPv6 addresses, and a pod in both slices while it moves.
        let v6 = slice(json!([
            {"addresses": ["fd00::1"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "a", "uid": "u-a"}},
            {"addresses": ["fd00::3"], "conditions": {"ready": null}, "targetRef": {"kind": "Pod", "name": "c", "uid": "u-c"}},
            {"addresses": ["10.0.0.4"]},
        ]));
        // a, c (missing and null conditions are ready) and the bare address; not b.
        assert_eq!(count([&v4, &v6].into_iter()), 3);
        assert_eq!(count([&v4].into_iter()), 3);
        assert_eq!(count(std::iter::empty()), 0);
    }

    #[test]
    fn endpoints_without_a_uid_are_told_apart_by_reference_then_addresses() {
        let a = slice(json!([
            {"addresses": ["10.0.0.1"], "targetRef": {"kind": "Pod", "namespace": "s", "name": "a"}},
            {"addresses": ["10.0.0.9", "10.0.0.8"]},
        ]));
        let b = slice(json!([
            {"addresses": ["10.0.0.2"], "targetRef": {"kind": "Pod", "namespace": "s", "name": "a"}},
            {"addresses": ["10.0.0.8", "10.0.0.9"]},
            {"addresses": ["10.0.0.7"]},
        ]));
        assert_eq!(count([&a, &b].into_iter()), 3);
    }

    #[test]
    fn odd_slices_count_nothing_and_do_not_panic() {
        for odd in [
            json!(null),
            json!("x"),
            json!({"endpoints": 1}),
            json!([1, "x", null, {}, {"addresses": []}, {"addresses": [1]}, {"targetRef": 3}]),
        ] {
            assert_eq!(slice(odd.clone()), Vec::<String>::new(), "{odd}");
        }
        assert!(ready_endpoints(None).is_empty());
    }

    fn object(name: &str, endpoints: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "ns"},
            "addressType": "IPv4",
            "endpoints": endpoints,
        }))
        .expect("an object")
    }

    fn pods(uids: &[&str]) -> Value {
        let list: Vec<Value> = uids
            .iter()
            .map(|u| json!({"addresses": ["10.0.0.1"], "targetRef": {"uid": u}}))
            .collect();
        Value::Array(list)
    }

    #[test]
    fn a_count_is_reported_once_listed_and_then_only_when_it_changes() {
        let mut s = Slices::default();
        assert_eq!(s.apply(Event::Init), None);
        assert_eq!(
            s.apply(Event::InitApply(object("a", pods(&["1", "2"])))),
            None
        );
        assert_eq!(
            s.apply(Event::InitApply(object("b", pods(&["2", "3"])))),
            None
        );
        assert_eq!(s.apply(Event::InitDone), Some(3));
        assert_eq!(s.apply(Event::Apply(object("a", pods(&["1", "2"])))), None);
        assert_eq!(
            s.apply(Event::Apply(object("a", pods(&["1", "4"])))),
            Some(4)
        );
        assert_eq!(s.apply(Event::Delete(object("b", Value::Null))), Some(2));
        // A new list counts only once complete, and replaces what was known.
        assert_eq!(s.apply(Event::Init), None);
        assert_eq!(s.apply(Event::InitApply(object("c", pods(&["9"])))), None);
        assert_eq!(s.apply(Event::InitDone), Some(1));
        assert_eq!(s.apply(Event::Init), None);
        assert_eq!(s.apply(Event::InitDone), Some(0));
    }

    #[test]
    fn a_service_is_a_name_or_a_namespace_and_a_name() {
        let s: ServiceRef = "sluice".parse().unwrap();
        assert_eq!((s.namespace, s.name.as_str()), (None, "sluice"));
        let s: ServiceRef = "rate-limits/sluice-1".parse().unwrap();
        assert_eq!(s.namespace.as_deref(), Some("rate-limits"));
        assert_eq!(s.to_string(), "rate-limits/sluice-1");
        let long = "x".repeat(64);
        for bad in [
            "",
            "/x",
            "x/",
            "a/b/c",
            "Sluice",
            "-x",
            "x-",
            "a_b",
            long.as_str(),
        ] {
            let e = bad.parse::<ServiceRef>().unwrap_err();
            assert!(e.contains("NAMESPACE/NAME"), "{bad}: {e}");
        }
    }
}
