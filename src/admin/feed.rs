//! WatchOffenders and WatchDecisions: streams that end when the client leaves or the
//! server stops.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tokio::sync::{watch, OwnedSemaphorePermit};

use crate::limiter::penalty::ActiveBan;
use crate::service::tap::{Interest, Sample, Subscription, Tap};
use crate::telemetry::signals::subnet::Subnet;
use crate::telemetry::{Metrics, RuleSignals, RuleTop};

use super::pb;

/// A server stream of the admin API.
pub type Feed<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

/// Shortest interval between snapshots a watcher may ask for.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
const DEFAULT_RATE: u32 = 100;

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

/// Whether `domain`/`rule` pass the filter.
fn selected(f: &pb::Filter, domain: &str, rule: &str) -> bool {
    (f.domain.is_empty() || f.domain == domain) && rule.starts_with(f.rule_prefix.as_str())
}

fn subnets(all: &[Subnet]) -> Vec<pb::Subnet> {
    all.iter()
        .map(|n| pb::Subnet {
            subnet: n.subnet.clone(),
            denials: n.denials,
            addresses: n.addresses,
        })
        .collect()
}

/// Adds a rule's signals to its entry.
fn with_signals(t: &mut pb::RuleTop, s: &RuleSignals) {
    t.regular_keys = s
        .regular
        .iter()
        .map(|r| pb::RegularKey {
            key: r.key.clone(),
            requests: r.requests,
            mean_interval_seconds: r.mean_interval,
            cv: r.cv,
        })
        .collect();
    t.subnets_by_denials = subnets(&s.subnets.by_denials);
    t.subnets_by_addresses = subnets(&s.subnets.by_addresses);
    t.denial_spike = s.spike.map(|d| pb::DenialSpike {
        recent_denials: d.recent,
        baseline_per_minute: d.baseline,
        ratio: d.ratio,
        spiking: d.is_spike(),
    });
}

/// One snapshot of the offenders, signals and sentences the filter selects.
pub fn snapshot(
    f: &pb::Filter,
    tops: Vec<RuleTop>,
    signals: Vec<RuleSignals>,
    bans: Vec<ActiveBan>,
) -> pb::TopSnapshot {
    let mut rules: Vec<pb::RuleTop> = tops
        .into_iter()
        .filter(|t| selected(f, &t.domain, &t.rule))
        .map(|t| pb::RuleTop {
            deny_ratio: if t.decided > 0 {
                t.denied as f64 / t.decided as f64
            } else {
                0.0
            },
            domain: t.domain,
            rule: t.rule,
            decided: t.decided,
            denied: t.denied,
            spent: t.spent,
            refunded: t.refunded,
            offenders: t
                .top
                .into_iter()
                .map(|(key, denials)| pb::Offender { key, denials })
                .collect(),
            ..Default::default()
        })
        .collect();
    for s in signals.iter().filter(|s| selected(f, &s.domain, &s.rule)) {
        let quiet = s.regular.is_empty()
            && s.subnets.by_denials.is_empty()
            && s.subnets.by_addresses.is_empty()
            && s.spike.is_none();
        match rules
            .iter_mut()
            .find(|t| t.domain == s.domain && t.rule == s.rule)
        {
            Some(t) => with_signals(t, s),
            None if !quiet => {
                let mut t = pb::RuleTop {
                    domain: s.domain.clone(),
                    rule: s.rule.clone(),
                    ..Default::default()
                };
                with_signals(&mut t, s);
                rules.push(t);
            }
            None => {}
        }
    }
    pb::TopSnapshot {
        unix_micros: unix_micros(),
        rules,
        bans: bans
            .into_iter()
            .filter(|b| selected(f, &b.info.domain, &b.info.rule))
            .map(|b| pb::Ban {
                domain: b.info.domain,
                rule: b.info.rule,
                key: b.info.key,
                remaining_micros: b.remaining,
                kind: b.kind.as_str().to_string(),
            })
            .collect(),
    }
}

/// Ends `feed` when `stop` turns true, so a watcher does not hold shutdown up.
fn until_stopped<T: Send + 'static>(feed: Feed<T>, mut stop: watch::Receiver<bool>) -> Feed<T> {
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    Box::pin(feed.take_until(stopped))
}

/// `feed`, holding `place` until it is dropped (the client left, or the server
/// stopped).
pub fn holding<T: Send + 'static>(feed: Feed<T>, place: OwnedSemaphorePermit) -> Feed<T> {
    Box::pin(feed.map(move |item| {
        let _held = &place;
        item
    }))
}

/// A snapshot every interval, the first at once.
pub fn offenders(
    f: pb::Filter,
    metrics: Arc<Metrics>,
    bans: impl Fn() -> Vec<ActiveBan> + Send + Sync + 'static,
    stop: watch::Receiver<bool>,
) -> Feed<pb::TopSnapshot> {
    let every = match f.interval_ms {
        0 => DEFAULT_INTERVAL,
        ms => Duration::from_millis(u64::from(ms)).max(MIN_INTERVAL),
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let bans = Arc::new(bans);
    let feed = futures::stream::unfold(tick, move |mut tick| {
        let f = f.clone();
        let metrics = metrics.clone();
        let bans = bans.clone();
        async move {
            tick.tick().await;
            // Everything is read at the tick, the sentences too: read before the
            // wait, they would be an interval old.
            Some((
                Ok(snapshot(
                    &f,
                    metrics.top_offenders(),
                    metrics.signals(),
                    bans(),
                )),
                tick,
            ))
        }
    });
    until_stopped(Box::pin(feed), stop)
}

/// The live decisions the filter selects, at most its rate.
pub fn decisions(f: pb::Filter, tap: &Arc<Tap>, stop: watch::Receiver<bool>) -> Feed<pb::Decision> {
    let sub: Subscription = tap.subscribe(Interest {
        domain: (!f.domain.is_empty()).then(|| f.domain.clone()),
        rule_prefix: (!f.rule_prefix.is_empty()).then(|| f.rule_prefix.clone()),
        denied_only: f.denied_only,
        max_per_second: match f.max_per_second {
            0 => DEFAULT_RATE,
            n => n,
        },
    });
    let feed = futures::stream::unfold(sub, |mut sub| async move {
        let s = sub.samples.recv().await?;
        Some((Ok(decision(s)), sub))
    });
    until_stopped(Box::pin(feed), stop)
}

fn decision(s: Sample) -> pb::Decision {
    let code = |over: bool| {
        if over {
            pb::Code::OverLimit as i32
        } else {
            pb::Code::Ok as i32
        }
    };
    pb::Decision {
        unix_micros: s.unix_micros,
        domain: s.domain,
        overall_code: code(s.over_limit),
        latency_micros: s.latency.as_micros() as u64,
        descriptors: s
            .descriptors
            .into_iter()
            .map(|d| pb::DecidedDescriptor {
                rule: d.rule,
                key: d.key,
                code: code(d.over_limit),
                remaining: d.remaining.unwrap_or(0),
                outcome: d.outcome.to_string(),
            })
            .collect(),
        dropped: s.dropped,
    }
}
