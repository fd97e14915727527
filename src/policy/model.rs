//! Uncompiled policy documents, as parsed from either YAML form or from a Kubernetes
//! object. A [`Document`] is already validated on its own; what needs several
//! documents (merging, duplicates across files, conflicting settings) is
//! [`compile`](super::compile)'s.

use crate::algorithm::{Algorithm, Micros};

use super::{Calendar, FailureMode, Layer, Penalty, Shed, Unit};

/// Which spelling a document used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocumentKind {
    /// envoyproxy/ratelimit's `domain` + `descriptors` document (snake_case).
    File,
    /// A `sluice.dev/v1alpha1` `RateLimitPolicy` object (camelCase `spec`).
    Resource {
        /// `metadata.namespace`, when given.
        namespace: Option<String>,
        /// `metadata.name`.
        name: String,
    },
}

/// One policy document: a domain and its descriptor tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// The file it came from, or `namespace/name` of a Kubernetes object.
    pub source: String,
    /// 1-based line where the document starts, when known.
    pub line: Option<usize>,
    pub kind: DocumentKind,
    pub domain: String,
    /// `failure_mode` for this domain, when set.
    pub failure_mode: Option<FailureMode>,
    /// `shard_by`: the entry key whose value places this domain's counters.
    pub shard_by: Option<String>,
    pub descriptors: Vec<DescriptorNode>,
}

impl Document {
    /// `namespace/name` for a resource (`name` alone without a namespace).
    pub fn resource_name(&self) -> Option<String> {
        match &self.kind {
            DocumentKind::File => None,
            DocumentKind::Resource {
                namespace: Some(ns),
                name,
            } => Some(format!("{ns}/{name}")),
            DocumentKind::Resource {
                namespace: None,
                name,
            } => Some(name.clone()),
        }
    }
}

/// One node of the descriptor tree.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DescriptorNode {
    /// 1-based line of the descriptor, when known.
    pub line: Option<usize>,
    pub key: String,
    /// `None` matches any value of `key`. May hold `*` wildcards.
    pub value: Option<String>,
    /// `rate_limit`, or the first limit of a `rate_limits` list.
    pub rate_limit: Option<RateLimit>,
    /// The other limits of a `rate_limits` list, in order: each counts the same
    /// requests under its own window, and a request passes only when all of them
    /// admit it. Empty for a single `rate_limit`.
    pub also: Vec<RateLimit>,
    pub descriptors: Vec<DescriptorNode>,
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    /// With a wildcard `value`: one counter shared by every matching value.
    pub share_threshold: bool,
    pub quota_mode: bool,
    pub value_to_metric: bool,
    /// A login or password-reset path: its denials get a spike gauge.
    pub sensitive: bool,
    /// Any mapping, returned in the response's `dynamic_metadata`.
    pub metadata: Option<serde_json::Value>,
    /// The layer, already inherited from the parent when not written.
    pub layer: Layer,
}

impl DescriptorNode {
    /// Whether `value` is a wildcard pattern.
    pub fn is_wildcard(&self) -> bool {
        self.value.as_deref().is_some_and(|v| v.contains('*'))
    }
}

/// A descriptor's `rate_limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    /// 1-based line of the `rate_limit` key, when known.
    pub line: Option<usize>,
    pub name: Option<String>,
    pub unlimited: bool,
    /// Exactly one of `unit`, `window` and `calendar` is set unless `unlimited`.
    pub unit: Option<Unit>,
    pub window: Option<Micros>,
    /// `window: calendar_day` or `calendar_month`, in `time_zone` (UTC when not
    /// given): a `fixed_window` over local days or months.
    pub calendar: Option<Calendar>,
    /// `algorithm: concurrency`: requests in flight, each slot held from its request
    /// until its refund, or at most this long.
    pub lease: Option<Micros>,
    /// 0 for an unlimited limit that does not give it.
    pub requests_per_unit: u32,
    /// `None` when the document names none: the compiled policy's default applies
    /// ([`Defaults`](super::Defaults), `--default-algorithm`).
    pub algorithm: Option<Algorithm>,
    /// Only for token_bucket and leaky_bucket.
    pub burst: Option<u64>,
    pub replaces: Vec<String>,
    pub penalty: Option<Penalty>,
    pub shed: Option<Shed>,
}

impl RateLimit {
    /// The window length: `window`, or the unit's length (a calendar window's
    /// nominal length: a day, 30 days).
    pub fn window_micros(&self) -> Option<Micros> {
        self.window
            .or(self.lease)
            .or_else(|| self.unit.and_then(Unit::micros))
            .or_else(|| self.calendar.as_ref().map(|c| c.period().nominal()))
    }

    /// Whether `self` and `other` count over the same windows: the same length, or
    /// the same calendar span in the same zone.
    pub fn same_window(&self, other: &RateLimit) -> bool {
        match (&self.calendar, &other.calendar) {
            (None, None) => self.window_micros() == other.window_micros(),
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    /// The unit reported in `current_limit`: `unit`, or the unit exactly as long as
    /// `window`, else [`Unit::Unknown`].
    pub fn report_unit(&self) -> Unit {
        if let Some(unit) = self.unit {
            return unit;
        }
        if let Some(calendar) = &self.calendar {
            return calendar.period().unit();
        }
        const UNITS: [Unit; 7] = [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ];
        self.window
            .and_then(|w| UNITS.into_iter().find(|u| u.micros() == Some(w)))
            .unwrap_or(Unit::Unknown)
    }
}
