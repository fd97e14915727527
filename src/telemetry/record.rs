//! Counting a decided request: its rule's outcome stripes, the deny-ratio rings,
//! the latency histogram, the signals that read its keys, the store's health.

use super::*;

/// How long decisions must come without a failure-mode answer before the log says
/// the store answers again.
pub(super) const STORE_QUIET: Micros = SECOND;

/// Whether `status`, admitted by `rule`, left its counter past `ratio` of the limit:
/// the threshold envoyproxy/ratelimit's `near_limit` uses, counted per descriptor.
fn near_limit(rule: &Rule, status: &crate::limiter::Status, ratio: f64) -> bool {
    let (Some(limit), Some(v)) = (rule.limit, status.verdict) else {
        return false;
    };
    let capacity = match limit.algorithm {
        crate::algorithm::Algorithm::TokenBucket | crate::algorithm::Algorithm::LeakyBucket => {
            limit.burst
        }
        _ => limit.requests,
    };
    let threshold = (capacity as f64 * ratio).floor() as u64;
    v.admitted && status.hits > 0 && capacity.saturating_sub(v.remaining) > threshold
}

/// Counts a denial for the subnet of each of `entries`' values that is an address,
/// shown hashed under `--hash-keys`.
fn count_subnets<E: Entry>(subnets: &Subnets, now: Micros, entries: &[E], hashing: &Hashing) {
    for e in entries {
        if let Some((net, bit)) = signals::subnet::subnet_of(e.value()) {
            let v6 = net.contains(':');
            if hashing.all {
                let mut shown = String::with_capacity(32);
                crate::limiter::key::push_value(&mut shown, &net, hashing);
                subnets.add(now, &shown, bit, v6);
            } else {
                subnets.add(now, &net, bit, v6);
            }
        }
    }
}

/// Rule stats by (domain, rule path, layer), and which of them the serving policy has.
#[derive(Debug, Default)]
pub(super) struct RuleTable {
    by_key: HashMap<StatsKey, Arc<RuleStats>>,
    /// `None` until a policy is swapped in ([`Metrics::policy_swapped`]).
    serving: Option<std::collections::HashSet<StatsKey>>,
}

/// Every bit of [`OUTCOMES`]: a rule met outside a swapped-in policy exports them all.
const ALL_OUTCOMES: u16 = (1 << OUTCOMES.len()) - 1;

/// The outcomes `rule` can have in a domain of failure mode `mode` (`None`: the
/// server's `--failure-mode`, either), a bit of [`OUTCOMES`] each.
fn possible_outcomes(rule: &Rule, mode: Option<FailureMode>) -> u16 {
    let mut bits = 1 << OK;
    if rule.limit.is_none() {
        return bits;
    }
    bits |= 1 << OVER_LIMIT;
    if rule.shadow_mode {
        bits |= 1 << SHADOW_OVER_LIMIT;
    }
    if rule.quota_mode {
        bits |= 1 << QUOTA_OVER_LIMIT;
    }
    bits |= match mode {
        Some(FailureMode::Closed) => 1 << FAILED_CLOSED,
        // `local` answers a key it cannot keep as `open` does.
        Some(FailureMode::Open | FailureMode::Local) => 1 << FAILED_OPEN,
        None => 1 << FAILED_OPEN | 1 << FAILED_CLOSED,
    };
    if let Some(penalty) = &rule.penalty {
        bits |= 1 << BANNED;
        if penalty.block.is_some() {
            bits |= 1 << BLOCKED;
        }
    }
    if rule.shed.is_some() {
        bits |= 1 << SHED;
    }
    bits
}

impl RuleStats {
    fn new((domain, rule, layer): &StatsKey, exported: u16) -> RuleStats {
        RuleStats {
            domain: domain.clone(),
            rule: rule.clone(),
            layer,
            counts: Stripes::default(),
            exported: AtomicU16::new(exported),
            ratio: Stripes::default(),
            spent: Stripes::default(),
            refunded: Stripes::default(),
            top: TopOffenders::default(),
            regular: RegularKeys::default(),
            subnets: Subnets::default(),
            sensitive: AtomicBool::new(false),
            spike: Spike::default(),
            in_flight: OnceLock::new(),
            debt: OnceLock::new(),
        }
    }
}

impl Metrics {
    /// Counts one decided request.
    pub fn record(&self, domain: &str, outcome: &Outcome, took: Duration) {
        self.record_inner::<(&str, &str)>(domain, outcome, took, None);
    }

    /// Counts one decided request and feeds the signals that read its keys
    /// (`hashing` writes them as the top-offenders view does).
    pub fn record_request<E: Entry>(
        &self,
        domain: &str,
        outcome: &Outcome,
        descriptors: &[Descriptor<'_, E>],
        hashing: &Hashing,
        took: Duration,
    ) {
        self.record_inner(domain, outcome, took, Some((descriptors, hashing)));
    }

    fn record_inner<E: Entry>(
        &self,
        domain: &str,
        outcome: &Outcome,
        took: Duration,
        request: Option<(&[Descriptor<'_, E>], &Hashing)>,
    ) {
        if !self.enabled {
            return;
        }
        self.decision_seconds.observe(took);
        if !outcome.domain_known {
            self.unknown_domain.inc();
            return;
        }
        self.store_health(domain, outcome);
        if let Some(erl) = &self.erl {
            if outcome.shadowed_denial() {
                erl.global_shadow();
            }
        }
        let guard = self.handles.load();
        let fresh;
        let handles: &PolicyHandles = match guard.as_deref() {
            Some(h) if std::ptr::eq(h.policy.as_ptr(), Arc::as_ptr(&outcome.policy)) => h,
            _ => {
                fresh = Arc::new(PolicyHandles {
                    policy: Arc::downgrade(&outcome.policy),
                    rules: (0..outcome.policy.rules.len())
                        .map(|_| OnceLock::new())
                        .collect(),
                    erl: (0..self.erl.as_ref().map_or(0, |_| outcome.policy.rules.len()))
                        .map(|_| OnceLock::new())
                        .collect(),
                });
                self.handles.store(Some(fresh.clone()));
                &fresh
            }
        };
        let mut now = None;
        for (i, s) in outcome.statuses.iter().enumerate() {
            // An override is counted under the rule it replaced; one that replaced
            // none has no series of its own (its labels would be the request's keys).
            let (Some(rule_id), Some(rule)) = (s.rule, outcome.rule(s)) else {
                continue;
            };
            let st = handles.rules[rule_id].get_or_init(|| {
                let configured = outcome.policy.rule(rule_id);
                let st = self.rule_stats(domain, configured);
                if configured.sensitive {
                    st.sensitive.store(true, Ordering::Relaxed);
                }
                st
            });
            let label = match (&outcome.failure, s.verdict) {
                _ if s.ban == Ban::Active => BANNED,
                _ if s.ban == Ban::Blocked => BLOCKED,
                _ if s.shed => SHED,
                // Without a verdict: the failure mode answered it (a shard that
                // failed; the request's other descriptors may have been decided).
                (Some(f), None) if f.mode != FailureMode::Closed => FAILED_OPEN,
                (Some(_), None) => FAILED_CLOSED,
                (_, Some(v)) if !v.admitted && rule.shadow_mode => SHADOW_OVER_LIMIT,
                // A quota limit past its limit says OVER_LIMIT, but another quota
                // limit admitted the request: not a denial, and not `ok` either
                // (as a shadow limit's would-be denial is not).
                _ if s.over_limit && rule.quota_mode && !outcome.over_limit => QUOTA_OVER_LIMIT,
                _ if s.over_limit => OVER_LIMIT,
                _ => OK,
            };
            let (counts, owned) = st.counts.local();
            striped::add(&counts.outcomes[label], owned, 1);
            if s.ban == Ban::Started {
                striped::add(&counts.bans, owned, 1);
            }
            if label == OK && near_limit(rule, s, self.near_limit_ratio) {
                striped::add(&counts.near_limit, owned, 1);
            }
            if let (Some(v), true) = (s.verdict, s.hits > 0) {
                let (spent, refunded) = match s.spend {
                    Spend::IfAdmitted if v.admitted && (!outcome.over_limit || s.spent_denied) => {
                        (s.hits, 0)
                    }
                    Spend::IfAdmitted => (0, 0),
                    Spend::Always => {
                        if !v.admitted {
                            striped::add(&counts.cost[2], owned, s.hits);
                        }
                        (s.hits, 0)
                    }
                    Spend::Refund => (0, s.hits),
                };
                let now =
                    *now.get_or_insert_with(|| outcome.now.unwrap_or_else(|| self.clock.now()));
                // A concurrency rule's refused stream start is a charge that did not
                // fit too; it shows as slots in use, not as debt.
                if s.spend == Spend::Always && v.owed > 0 && rule.lease.is_none() {
                    st.debt
                        .get_or_init(Box::default)
                        .record(self.peak_period(now), v.owed);
                }
                if spent > 0 {
                    striped::add(&counts.cost[0], owned, spent);
                    let (w, owned) = st.spent.local();
                    w.add(now, spent, owned);
                }
                if refunded > 0 {
                    striped::add(&counts.cost[1], owned, refunded);
                    let (w, owned) = st.refunded.local();
                    w.add(now, refunded, owned);
                }
            }
            // Slots in use are what the limit no longer has room for. A tightened
            // key's remaining is against its scaled limit, not the rule's.
            if let (Some(v), Some(limit), Some(_), None) =
                (s.verdict, rule.limit, rule.lease, s.tightened)
            {
                let now =
                    *now.get_or_insert_with(|| outcome.now.unwrap_or_else(|| self.clock.now()));
                st.in_flight.get_or_init(Box::default).record(
                    self.peak_period(now),
                    limit.requests.saturating_sub(v.remaining),
                );
            }
            if let Some(erl) = &self.erl {
                let counts = handles.erl[rule_id]
                    .get_or_init(|| erl.counts(domain, outcome.policy.rule(rule_id)));
                erl.record(counts, rule, s);
            }
            let decided = rule.limit.is_some()
                && (s.verdict.is_some()
                    || outcome.failure.is_some()
                    || matches!(s.ban, Ban::Active | Ban::Blocked));
            if decided {
                let now =
                    *now.get_or_insert_with(|| outcome.now.unwrap_or_else(|| self.clock.now()));
                let denied = matches!(label, OVER_LIMIT | BANNED | SHED | BLOCKED);
                let (ratio, owned) = st.ratio.local();
                ratio.record(now, denied, owned);
                let entries = request.and_then(|(d, hashing)| Some((d.get(i)?.entries, hashing)));
                if let Some((entries, hashing)) = entries {
                    let hash = self.key_hash(rule, entries);
                    st.regular.arrival(now, hash, |out| {
                        crate::limiter::key::offender(rule, entries, hashing, out)
                    });
                }
                if denied {
                    if let Some(key) = outcome.offender(i) {
                        st.top.add(now, key);
                    }
                    if rule.sensitive {
                        st.spike.denial(now);
                    }
                    if let Some((entries, hashing)) = entries {
                        count_subnets(&st.subnets, now, entries, hashing);
                    }
                }
            }
        }
    }

    /// A descriptor's key for the signals: its values (a `share_threshold` level's
    /// pattern), hashed without allocating.
    fn key_hash<E: Entry>(&self, rule: &Rule, entries: &[E]) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.key_hasher.build_hasher();
        for (i, e) in entries.iter().enumerate() {
            match rule.shared.get(i).and_then(|s| s.as_deref()) {
                Some(pattern) => h.write(pattern.as_bytes()),
                None => h.write(e.value().as_bytes()),
            }
            h.write_u8(0xff);
        }
        h.finish()
    }

    /// Every rule's signals now, by domain and rule.
    pub fn signals(&self) -> Vec<RuleSignals> {
        let now = self.clock.now();
        let mut out: Vec<RuleSignals> = Vec::new();
        for st in self.all_stats() {
            let regular = st.regular.regular(now);
            let subnets = st.subnets.top(now);
            let spike = st.sensitive.load(Ordering::Relaxed).then(|| {
                let (recent, baseline) = st.spike.view(now);
                DenialSpike {
                    recent,
                    baseline,
                    ratio: signals::spike::ratio(recent, baseline),
                }
            });
            if regular.is_empty() && subnets.by_denials.is_empty() && spike.is_none() {
                continue;
            }
            match out.last_mut() {
                // The same path under two layers: one view (each subnet ranked by
                // its count under one layer).
                Some(last) if last.domain == st.domain && last.rule == st.rule => {
                    last.regular.extend(regular);
                    last.spike = match (last.spike, spike) {
                        (Some(a), Some(b)) => {
                            let recent = a.recent + b.recent;
                            let baseline = match (a.baseline, b.baseline) {
                                (Some(x), Some(y)) => Some(x + y),
                                (x, y) => x.or(y),
                            };
                            Some(DenialSpike {
                                recent,
                                baseline,
                                ratio: signals::spike::ratio(recent, baseline),
                            })
                        }
                        (a, b) => a.or(b),
                    };
                    last.subnets.by_denials.extend(subnets.by_denials);
                    last.subnets.by_addresses.extend(subnets.by_addresses);
                    let s = &mut last.subnets;
                    s.by_denials.sort_by(|a, b| {
                        b.denials
                            .cmp(&a.denials)
                            .then_with(|| a.subnet.cmp(&b.subnet))
                    });
                    s.by_addresses.sort_by(|a, b| {
                        b.addresses
                            .cmp(&a.addresses)
                            .then_with(|| a.subnet.cmp(&b.subnet))
                    });
                    s.by_denials.truncate(signals::subnet::TOP);
                    s.by_addresses.truncate(signals::subnet::TOP);
                }
                _ => out.push(RuleSignals {
                    domain: st.domain.clone(),
                    rule: st.rule.clone(),
                    regular,
                    subnets,
                    spike,
                }),
            }
        }
        out
    }

    /// Counts a sentence `rule`'s penalty started outside a decided request: from
    /// the denials an Envoy reported on an RLQS stream.
    pub fn sentence_started(&self, domain: &str, rule: &Rule) {
        if !self.enabled {
            return;
        }
        let st = self.rule_stats(domain, rule);
        let (counts, owned) = st.counts.local();
        striped::add(&counts.bans, owned, 1);
    }

    /// `rule`'s stats. A rule the serving policy lacks (a request decided by the
    /// policy a reload replaced) counts in stats of its own, never exported.
    fn rule_stats(&self, domain: &str, rule: &Rule) -> Arc<RuleStats> {
        let key = (domain.to_string(), rule.path.clone(), rule.layer.as_str());
        let mut table = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = table.by_key.get(&key) {
            return st.clone();
        }
        let st = Arc::new(RuleStats::new(&key, ALL_OUTCOMES));
        if table.serving.as_ref().is_none_or(|s| s.contains(&key)) {
            table.by_key.insert(key, st.clone());
        }
        st
    }

    /// Makes the stats of every rule of `policy`, exporting at 0 the outcomes each
    /// can have, and drops those of rules it lacks.
    pub(super) fn declare_rules(&self, policy: &Policy) {
        let mut wanted: HashMap<StatsKey, u16> = HashMap::new();
        for (domain, rule) in policy.rules_by_domain() {
            let mode = policy.domains.get(domain).and_then(|d| d.failure_mode);
            // A descriptor's other limits count under their own rules.
            for id in rule.limit_ids() {
                let r = policy.rule(id);
                let key = (domain.to_string(), r.path.clone(), r.layer.as_str());
                *wanted.entry(key).or_default() |= possible_outcomes(r, mode);
            }
        }
        let mut table = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        table.by_key.retain(|key, _| wanted.contains_key(key));
        for (key, outcomes) in &wanted {
            table
                .by_key
                .entry(key.clone())
                .or_insert_with(|| Arc::new(RuleStats::new(key, *outcomes)))
                .exported
                .store(*outcomes, Ordering::Relaxed);
        }
        table.serving = Some(wanted.into_keys().collect());
    }

    /// Every rule's stats, sorted by domain, rule and layer.
    pub(super) fn all_stats(&self) -> Vec<Arc<RuleStats>> {
        let mut all: Vec<Arc<RuleStats>> = self
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_key
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| (&a.domain, &a.rule, a.layer).cmp(&(&b.domain, &b.rule, b.layer)));
        all
    }

    /// Logs the store's state changes (failing, answering again), never per request.
    ///
    /// An answer without a failure during an outage does not show the store is back
    /// by itself: a cached denial, a `local` decision or a call to a shard that is
    /// up also come without one. So the store answers again once decisions have come
    /// [`STORE_QUIET`] without a failure-mode answer; when no decision came in that
    /// time to say so but the store answered since the last failure (a decision
    /// too soon after it, or a shard's word, `Report::shard_answered`), the next
    /// failure says it first, so each outage has its line. A quiet second alone
    /// (sparse traffic during one outage) says nothing: the store may never have
    /// answered.
    fn store_health(&self, domain: &str, outcome: &Outcome) {
        match &outcome.failure {
            Some(f) => {
                self.store_failures
                    .get_or_init(|| self.store.store_failures_vec.with_label_values(&[f.store]))
                    .inc();
                if f.error == crate::store::StoreError::Full {
                    // A key not kept: the store answers, and its refusals are
                    // logged where they are counted.
                    return;
                }
                let now = self.clock.now();
                let last = self.last_store_failure.swap(now, Ordering::Relaxed);
                // Read on every failure, written only after a recovery.
                let answered = self.store_answered.load(Ordering::Relaxed);
                if answered {
                    self.store_answered.store(false, Ordering::Relaxed);
                }
                if answered
                    && now.saturating_sub(last) >= STORE_QUIET
                    && self.store_failing.swap(false, Ordering::Relaxed)
                {
                    tracing::info!(
                        failed_calls = self.failures_in_outage.swap(0, Ordering::Relaxed),
                        "store answering again"
                    );
                }
                self.failures_in_outage.fetch_add(1, Ordering::Relaxed);
                if !self.store_failing.swap(true, Ordering::Relaxed) {
                    let answer = match f.answer {
                        crate::limiter::StoreErrorAnswer::FailureMode => {
                            "store failing; answering by the failure mode"
                        }
                        crate::limiter::StoreErrorAnswer::Error => {
                            "store failing; answering with an error (--store-error-answer error)"
                        }
                    };
                    // The first failing request's domain and mode: other domains
                    // answer by their own.
                    tracing::warn!(
                        store = f.store,
                        // As the "redis shard down" line and the metrics name them.
                        shard = f.shard.as_deref().map(tracing::field::display),
                        kind = f.error.kind().map(|k| tracing::field::display(k.as_str())),
                        error = %f.error,
                        domain,
                        failure_mode = f.mode.as_str(),
                        "{answer}"
                    );
                }
            }
            None => {
                if !self.store_failing.load(Ordering::Relaxed)
                    || outcome.local
                    || !outcome.statuses.iter().any(|s| s.verdict.is_some())
                {
                    return;
                }
                let quiet = self
                    .clock
                    .now()
                    .saturating_sub(self.last_store_failure.load(Ordering::Relaxed))
                    >= STORE_QUIET;
                if quiet && self.store_failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        failed_calls = self.failures_in_outage.swap(0, Ordering::Relaxed),
                        "store answering again"
                    );
                } else if !quiet && !self.store_answered.load(Ordering::Relaxed) {
                    // Too soon to say, but a failure a quiet second on may.
                    self.store_answered.store(true, Ordering::Relaxed);
                }
            }
        }
    }
}
