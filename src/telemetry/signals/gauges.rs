//! The signals' series, set at scrape time: machine-regular keys, the subnets with
//! the most denials and the denial spikes of sensitive rules.

use crate::telemetry::{gauge_vec, int_gauge_vec, registered};
use prometheus::{GaugeVec, IntGaugeVec, Registry};

#[derive(Debug)]
pub(crate) struct SignalStats {
    pub(crate) regular_keys: IntGaugeVec,
    pub(crate) top_subnets: IntGaugeVec,
    pub(crate) top_subnet_addresses: IntGaugeVec,
    pub(crate) denial_spike_ratio: GaugeVec,
}

impl SignalStats {
    pub(crate) fn new(registry: &Registry) -> SignalStats {
        let regular_keys = registered(
            registry,
            int_gauge_vec(
                "sluice_regular_keys",
                "Busy keys of a rule whose last 20 gaps between requests barely vary (coefficient of variation under 0.1): scripts on a timer.",
                &["domain", "rule"],
            ),
        );
        let top_subnets = registered(
            registry,
            int_gauge_vec(
                "sluice_top_subnets",
                "Denials over the last 60 s of the 10 subnets (/24, /64) a rule denied most (rank 1 = most).",
                &["domain", "rule", "subnet", "rank"],
            ),
        );
        let top_subnet_addresses = registered(
            registry,
            int_gauge_vec(
                "sluice_top_subnet_addresses",
                "Distinct addresses denied over the last 60 s in the 10 subnets (/24, /64) of a rule with the most (rank 1 = most).",
                &["domain", "rule", "subnet", "rank"],
            ),
        );
        let denial_spike_ratio = registered(
            registry,
            gauge_vec(
                "sluice_denial_spike_ratio",
                "A sensitive rule's denials over the last 60 s against its baseline (denials per minute, an EWMA over 30 minutes, at least 1).",
                &["domain", "rule"],
            ),
        );
        SignalStats {
            regular_keys,
            top_subnets,
            top_subnet_addresses,
            denial_spike_ratio,
        }
    }
}
