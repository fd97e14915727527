//! Who is being denied, as series set at scrape time: each rule's deny ratio and
//! recent denials, its top offenders, and the keys serving a penalty ban.

use super::registered;
use prometheus::{GaugeVec, IntGauge, IntGaugeVec, Opts, Registry};

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
            IntGauge::new(
                "sluice_penalty_active_bans",
                "Keys serving a penalty ban in this process.",
            )
            .expect("static metric definition"),
        );
        let deny_ratio = registered(
            registry,
            GaugeVec::new(
                Opts::new(
                    "sluice_deny_ratio",
                    "Denied / decided descriptors of a rule over the last 60 s.",
                ),
                &["domain", "rule"],
            )
            .expect("static metric definition"),
        );
        let recent_denials = registered(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "sluice_recent_denials",
                    "Denied descriptors of a rule over the last 60 s (the deny ratio's numerator).",
                ),
                &["domain", "rule"],
            )
            .expect("static metric definition"),
        );
        let top_offenders = registered(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "sluice_top_offenders",
                    "Denials over the last 60 s of the 10 keys a rule denied most (rank 1 = most).",
                ),
                &["domain", "rule", "key", "rank"],
            )
            .expect("static metric definition"),
        );
        DenialStats {
            active_bans,
            deny_ratio,
            recent_denials,
            top_offenders,
        }
    }
}
