//! `failure_mode: local` as series, set at scrape time from the limiter's share and
//! the store's shards: `sluice_degraded{shard}` (1 while a shard cannot be reached),
//! `sluice_local_decisions_total`, `sluice_local_share` (replicas assumed),
//! `sluice_local_share_learned` (0 while that is the configured count),
//! `sluice_local_share_kubernetes` (the count from the Service's EndpointSlices),
//! `sluice_local_share_kubernetes_failing` (set by the EndpointSlice watch itself),
//! `sluice_local_missing_replicas` (replicas whose shares are reserved),
//! `sluice_local_unsettled_counters` and `sluice_local_refused_total` (the counters
//! decided locally, and the new keys not kept at `--max-keys`), and the side
//! channel between replicas: `sluice_local_share_peers` (live peers known),
//! `sluice_local_share_peer_queries_total{answer}` (counted by the asking task as the
//! answers come) and `sluice_local_cut_off_shards{standing}`.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{counter_vec, int_counter, int_gauge, int_gauge_vec, registered};

use crate::limiter::local::peers::{Answer, Standing};
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
    refused: IntCounter,
    peers: IntGauge,
    queries: IntCounterVec,
    cut_off: IntGaugeVec,
}

/// The standings `sluice_local_cut_off_shards` counts (every one but `reaching`).
const STANDINGS: [Standing; 5] = [
    Standing::Waiting,
    Standing::Alone,
    Standing::DownForAll,
    Standing::Unanswered,
    Standing::NoPeers,
];

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
        let refused = registered(
            registry,
            int_counter(
                "sluice_local_refused_total",
                "New keys of failure_mode local domains not kept while the store was away, --max-keys counters decided locally \
                 each owing spending: answered as failure_mode open answers (failed_open), and added to no store.",
            ),
        );
        let peers = gauge(
            "sluice_local_share_peers",
            "Live peers the latest heartbeat listed; those with an address are asked when this replica finds a shard unreachable.",
        );
        let queries = registered(
            registry,
            counter_vec(
                "sluice_local_share_peer_queries_total",
                "Questions to peers from this replica cut off from a shard, by answer: reached (the peer reaches it and reserves this replica's share), not_reached, no_answer.",
                &["answer"],
            ),
        );
        for a in [Answer::Reached, Answer::NotReached, Answer::Silent] {
            queries.with_label_values(&[a.as_str()]);
        }
        let cut_off = registered(
            registry,
            int_gauge_vec(
                "sluice_local_cut_off_shards",
                "Shards this replica cannot reach, by standing: waiting_for_peers (nothing admitted locally), cut_off_alone, down_for_all, peers_silent, no_peers.",
                &["standing"],
            ),
        );
        for s in STANDINGS {
            cut_off.with_label_values(&[s.as_str()]);
        }
        LocalStats {
            peers,
            queries,
            cut_off,
            degraded,
            decisions,
            share,
            learned,
            kubernetes,
            kubernetes_failing,
            missing,
            unsettled,
            refused,
        }
    }

    /// A peer's answer to this replica's question.
    pub fn peer_query(&self, answer: Answer) {
        self.queries.with_label_values(&[answer.as_str()]).inc();
    }

    /// Whether the EndpointSlice watch is failing (its last count stands meanwhile).
    pub fn kubernetes_failing(&self, failing: bool) {
        self.kubernetes_failing.set(i64::from(failing));
    }

    /// Sets every series from the share's state and the store's shards.
    pub fn set(&self, local: &LocalStatus, shards: &[ShardStatus]) {
        // A shard no longer listed (a cluster master that left the map) goes.
        self.degraded.reset();
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
        let seen = self.refused.get();
        if local.refused > seen {
            self.refused.inc_by(local.refused - seen);
        }
        self.peers.set(local.peers.len() as i64);
        for s in STANDINGS {
            let n = local.cut_off.iter().filter(|c| c.standing == s).count();
            self.cut_off.with_label_values(&[s.as_str()]).set(n as i64);
        }
    }
}
