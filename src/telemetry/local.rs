//! `failure_mode: local` as series, set at scrape time from the limiter's share and
//! the store's shards: `sluice_degraded{shard}` (1 while a shard cannot be reached),
//! `sluice_local_decisions_total`, `sluice_local_share` (replicas assumed),
//! `sluice_local_share_learned` (0 while that is the configured count),
//! `sluice_local_share_kubernetes` (the count from the Service's EndpointSlices),
//! `sluice_local_share_kubernetes_failing` (set by the EndpointSlice watch itself) and
//! `sluice_local_missing_replicas` (replicas whose shares are reserved).

use prometheus::{IntCounter, IntGauge, IntGaugeVec, Registry};

use super::{int_counter, int_gauge, int_gauge_vec, registered};

use crate::limiter::local::{LocalStatus, ShareSource};
use crate::store::{ShardState, ShardStatus};

#[derive(Debug)]
pub struct LocalStats {
    degraded: IntGaugeVec,
    decisions: IntCounter,
    share: IntGauge,
    learned: IntGauge,
    kubernetes: IntGauge,
    kubernetes_failing: IntGauge,
    missing: IntGauge,
    unsettled: IntGauge,
}

impl LocalStats {
    pub fn new(registry: &Registry) -> LocalStats {
        let gauge = |name: &str, help: &str| registered(registry, int_gauge(name, help));
        let degraded = registered(
            registry,
            int_gauge_vec(
                "sluice_degraded",
                "1 while a store shard cannot be reached (failing, backing off or on trial).",
                &["shard"],
            ),
        );
        let decisions = registered(registry, int_counter("sluice_local_decisions_total", "Requests decided in this replica's memory with its share of the limits (failure_mode local)."));
        let share = gauge(
            "sluice_local_share",
            "Replicas assumed to share each limit of a failure_mode local domain.",
        );
        let learned = gauge(
            "sluice_local_share_learned",
            "1 when sluice_local_share was counted (through the store or from Kubernetes), 0 when it is --local-share-replicas.",
        );
        let kubernetes = gauge(
            "sluice_local_share_kubernetes",
            "Ready endpoints of this replica's Service, from its EndpointSlices (--local-share-service); 0 when none is known.",
        );
        let kubernetes_failing = gauge(
            "sluice_local_share_kubernetes_failing",
            "1 while the EndpointSlices of --local-share-service cannot be read (the last count stands).",
        );
        let missing = gauge(
            "sluice_local_missing_replicas",
            "Replicas that stopped beating in the store a moment ago (they may be deciding alone): \
             the live replicas decide failure_mode local domains on each limit less their shares.",
        );
        let unsettled = gauge(
            "sluice_local_unsettled_counters",
            "Counters decided locally whose spending the store has not taken yet.",
        );
        LocalStats {
            degraded,
            decisions,
            share,
            learned,
            kubernetes,
            kubernetes_failing,
            missing,
            unsettled,
        }
    }

    /// Whether the EndpointSlice watch is failing (its last count stands meanwhile).
    pub fn kubernetes_failing(&self, failing: bool) {
        self.kubernetes_failing.set(i64::from(failing));
    }

    /// Sets every series from the share's state and the store's shards.
    pub fn set(&self, local: &LocalStatus, shards: &[ShardStatus]) {
        for s in shards {
            let down = matches!(
                s.state,
                ShardState::Failing | ShardState::BackingOff | ShardState::Trying
            );
            self.degraded
                .with_label_values(&[s.name.as_str()])
                .set(i64::from(down));
        }
        let seen = self.decisions.get();
        if local.decisions > seen {
            self.decisions.inc_by(local.decisions - seen);
        }
        self.share.set(i64::from(local.replicas));
        self.learned
            .set(i64::from(local.source != ShareSource::Configured));
        self.kubernetes
            .set(i64::from(local.kubernetes.unwrap_or(0)));
        self.missing.set(i64::from(local.missing));
        self.unsettled.set(local.unsettled_counters as i64);
    }
}
