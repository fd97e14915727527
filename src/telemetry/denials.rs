//! Who is being denied, as series set at scrape time: each rule's deny ratio and
//! recent denials, its top offenders, and the keys serving a penalty ban.

use super::{gauge_vec, int_gauge, int_gauge_vec, registered};
use prometheus::{GaugeVec, IntGauge, IntGaugeVec, Registry};

#[derive(Debug)]
pub(super) struct DenialStats {
    pub(super) active_bans: IntGauge,
    pub(super) deny_ratio: GaugeVec,
    pub(super) recent_denials: IntGaugeVec,
    pub(super) top_offenders: IntGaugeVec,
}

impl DenialStats {
    pub(super) fn new(registry: &Registry) -> DenialStats {
        let active_bans = registered(
            registry,
            int_gauge(
                "sluice_penalty_active_bans",
                "Keys serving a penalty ban in this process.",
            ),
        );
        let deny_ratio = registered(
            registry,
            gauge_vec(
                "sluice_deny_ratio",
                "Denied / decided descriptors of a rule over the last 60 s.",
                &["domain", "rule"],
            ),
        );
        let recent_denials = registered(
            registry,
            int_gauge_vec(
                "sluice_recent_denials",
                "Denied descriptors of a rule over the last 60 s (the deny ratio's numerator).",
                &["domain", "rule"],
            ),
        );
        let top_offenders = registered(
            registry,
            int_gauge_vec(
                "sluice_top_offenders",
                "Denials over the last 60 s of the 10 keys a rule denied most (rank 1 = most).",
                &["domain", "rule", "key", "rank"],
            ),
        );
        DenialStats {
            active_bans,
            deny_ratio,
            recent_denials,
            top_offenders,
        }
    }
}
