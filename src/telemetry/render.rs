//! The scrape: gauges computed at scrape time, the striped families and the text
//! exposition.

use super::printable::printable;
use super::*;

/// Where a rule's windowed maximum of one gauge is, if it has one.
type PeakOf = fn(&RuleStats) -> Option<&peak::Peak>;

impl Metrics {
    /// Every rule's deny ratio and worst keys over the last minute, by domain and rule.
    pub fn top_offenders(&self) -> Vec<RuleTop> {
        let now = self.clock.now();
        let mut out: Vec<RuleTop> = Vec::new();
        for st in self.all_stats() {
            let (decided, denied) = st.window_totals(now);
            let (spent, refunded) = st.cost_totals(now);
            let top = st.top.top(now, top::TOP);
            if decided == 0 && top.is_empty() {
                continue;
            }
            match out.last_mut() {
                // The same path under two layers: one view.
                Some(last) if last.domain == st.domain && last.rule == st.rule => {
                    last.decided += decided;
                    last.denied += denied;
                    last.spent = last.spent.saturating_add(spent);
                    last.refunded = last.refunded.saturating_add(refunded);
                    let mut merged: HashMap<String, u64> = last.top.drain(..).collect();
                    for (k, n) in top {
                        *merged.entry(k).or_default() += n;
                    }
                    let mut merged: Vec<(String, u64)> = merged.into_iter().collect();
                    merged.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                    merged.truncate(top::TOP);
                    last.top = merged;
                }
                _ => out.push(RuleTop {
                    domain: st.domain.clone(),
                    rule: st.rule.clone(),
                    decided,
                    denied,
                    spent,
                    refunded,
                    top,
                }),
            }
        }
        out
    }

    /// The same metrics in the OpenMetrics text format (what a scraper asking for
    /// `application/openmetrics-text` gets), with the trace ids of sampled calls as
    /// exemplars on `sluice_decision_seconds`' buckets. The prometheus crate has no
    /// exemplars and speaks only the 0.0.4 format, so this rewrites that text:
    /// a counter family is declared without its `_total` suffix (its samples keep
    /// it), a counter whose name lacks the suffix is declared `unknown` (so its
    /// series keep their names), `untyped` becomes `unknown`, and `# EOF` ends it.
    pub fn render_openmetrics(&self) -> String {
        openmetrics(&self.render(), &self.exemplars.get())
    }

    /// Writes the striped families in the text format.
    fn render_striped(&self, out: &mut String) {
        use std::fmt::Write;
        let stats = self.all_stats();
        if !stats.is_empty() {
            out.push_str(
                "# HELP sluice_requests_total Descriptors decided, by matched rule and outcome \
                 (ok, over_limit, shadow_over_limit, quota_over_limit, failed_open, failed_closed, banned, blocked, shed).\n\
                 # TYPE sluice_requests_total counter\n",
            );
            for st in &stats {
                let exported = st.exported.load(Ordering::Relaxed);
                for (i, o) in OUTCOMES.iter().enumerate() {
                    let n = st.outcome(i);
                    if n == 0 && exported & (1 << i) == 0 {
                        continue;
                    }
                    out.push_str("sluice_requests_total{domain=\"");
                    escape_label(&st.domain, out);
                    let _ = write!(out, "\",layer=\"{}\",outcome=\"{o}\",rule=\"", st.layer);
                    escape_label(&st.rule, out);
                    let _ = writeln!(out, "\"}} {n}");
                }
            }
            out.push_str(
                "# HELP sluice_penalty_bans_total Sentences (bans, tightenings, blocks) started by a rule's penalty.\n\
                 # TYPE sluice_penalty_bans_total counter\n",
            );
            let mut bans: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
            for st in &stats {
                *bans.entry((&st.domain, &st.rule)).or_default() += st.bans();
            }
            for ((domain, rule), n) in bans {
                out.push_str("sluice_penalty_bans_total{domain=\"");
                escape_label(domain, out);
                out.push_str("\",rule=\"");
                escape_label(rule, out);
                let _ = writeln!(out, "\"}} {n}");
            }
            out.push_str(
                "# HELP sluice_cost_total Hits by rule: spent (admitted requests' and every charge's; a denied request's where it spends them), refunded (given back by is_negative_hits), over (charges that did not fit, spent and owed).\n\
                 # TYPE sluice_cost_total counter\n",
            );
            let mut cost: std::collections::BTreeMap<(&str, &str, usize), u64> = Default::default();
            for st in &stats {
                for kind in 0..COST_KINDS.len() {
                    let n = cost.entry((&st.domain, &st.rule, kind)).or_default();
                    *n = n.saturating_add(st.cost(kind));
                }
            }
            for ((domain, rule, kind), n) in cost {
                out.push_str("sluice_cost_total{domain=\"");
                escape_label(domain, out);
                let _ = write!(out, "\",kind=\"{}\",rule=\"", COST_KINDS[kind]);
                escape_label(rule, out);
                let _ = writeln!(out, "\"}} {n}");
            }
            let period = self.peak_period(self.clock.now());
            let gauges: [(&str, &str, PeakOf); 2] = [
                (
                    "sluice_in_flight",
                    "algorithm: concurrency rules: the most slots in use (requests in flight) one key had, as this replica's answers of the last --peak-window (at least) reported.",
                    |st| st.in_flight.get().map(|p| &**p),
                ),
                (
                    "sluice_debt",
                    "The most one key of the rule owed after a charge past its limit (in hits: how far its counter was over the limit, a bucket below empty), as this replica's answers of the last --peak-window (at least) reported.",
                    |st| st.debt.get().map(|p| &**p),
                ),
            ];
            for (name, help, peak) in gauges {
                let mut highest: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
                for st in &stats {
                    if let Some(p) = peak(st) {
                        let v = highest.entry((&st.domain, &st.rule)).or_default();
                        *v = (*v).max(p.get(period));
                    }
                }
                if highest.is_empty() {
                    continue;
                }
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
                for ((domain, rule), n) in highest {
                    let _ = write!(out, "{name}{{domain=\"");
                    escape_label(domain, out);
                    out.push_str("\",rule=\"");
                    escape_label(rule, out);
                    let _ = writeln!(out, "\"}} {n}");
                }
            }
            out.push_str(
                "# HELP sluice_near_limit_total Admitted descriptors that left their counter past --near-limit-ratio of the limit.\n\
                 # TYPE sluice_near_limit_total counter\n",
            );
            let mut near: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
            for st in &stats {
                *near.entry((&st.domain, &st.rule)).or_default() += st.near_limit();
            }
            for ((domain, rule), n) in near {
                out.push_str("sluice_near_limit_total{domain=\"");
                escape_label(domain, out);
                out.push_str("\",rule=\"");
                escape_label(rule, out);
                let _ = writeln!(out, "\"}} {n}");
            }
        }
        let h = self.decision_seconds.totals();
        out.push_str(
            "# HELP sluice_decision_seconds Time spent inside sluice per call.\n\
             # TYPE sluice_decision_seconds histogram\n",
        );
        for (bound, n) in LATENCY_BOUNDS.iter().zip(&h.cumulative) {
            let _ = writeln!(out, "sluice_decision_seconds_bucket{{le=\"{bound}\"}} {n}");
        }
        let count = h.cumulative.last().copied().unwrap_or(0);
        let _ = writeln!(out, "sluice_decision_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "sluice_decision_seconds_sum {}", h.sum_seconds);
        let _ = writeln!(out, "sluice_decision_seconds_count {count}");
    }

    /// Refills the gauges computed at scrape time.
    fn refresh(&self) {
        self.signals.regular_keys.reset();
        self.signals.top_subnets.reset();
        self.signals.top_subnet_addresses.reset();
        self.signals.denial_spike_ratio.reset();
        for s in self.signals() {
            if let Some(spike) = s.spike {
                self.signals
                    .denial_spike_ratio
                    .with_label_values(&[&s.domain, &s.rule])
                    .set(spike.ratio);
            }
            self.signals
                .regular_keys
                .with_label_values(&[&s.domain, &s.rule])
                .set(s.regular.len() as i64);
            for (rank, n) in s.subnets.by_denials.iter().enumerate() {
                let rank = (rank + 1).to_string();
                self.signals
                    .top_subnets
                    .with_label_values(&[&s.domain, &s.rule, &n.subnet, &rank])
                    .set(n.denials as i64);
            }
            for (rank, n) in s.subnets.by_addresses.iter().enumerate() {
                let rank = (rank + 1).to_string();
                self.signals
                    .top_subnet_addresses
                    .with_label_values(&[&s.domain, &s.rule, &n.subnet, &rank])
                    .set(n.addresses as i64);
            }
        }
        self.denials.deny_ratio.reset();
        self.denials.recent_denials.reset();
        self.denials.top_offenders.reset();
        for t in self.top_offenders() {
            let labels = [t.domain.as_str(), t.rule.as_str()];
            if t.decided > 0 {
                self.denials
                    .deny_ratio
                    .with_label_values(&labels)
                    .set(t.denied as f64 / t.decided as f64);
                self.denials
                    .recent_denials
                    .with_label_values(&labels)
                    .set(t.denied as i64);
            }
            for (rank, (key, denials)) in t.top.iter().enumerate() {
                let rank = (rank + 1).to_string();
                // Clients chose the key: `curl /metrics` on a terminal must not run
                // the escape sequences it may hold.
                let key = printable(key);
                self.denials
                    .top_offenders
                    .with_label_values(&[t.domain.as_str(), &t.rule, &key, &rank])
                    .set(*denials as i64);
            }
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh();
        let answers: u64 = self
            .store
            .cache_answer_stripes
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum();
        self.store
            .cache_answers
            .inc_by(answers.saturating_sub(self.store.cache_answers.get()));
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        let mut text = String::from_utf8(buf).unwrap_or_default();
        self.render_striped(&mut text);
        if let Some(erl) = &self.erl {
            erl.render(&mut text);
            let loads = |result: &str| -> u64 {
                ["file", "xds", "kube"]
                    .iter()
                    .filter_map(|source| {
                        self.policy_reloads
                            .get_metric_with_label_values(&[source, result])
                            .ok()
                    })
                    .map(|c| c.get())
                    .sum()
            };
            erl::render_config_loads(&mut text, loads("ok"), loads("error"));
        }
        text
    }
}

/// `text` (the 0.0.4 format) as OpenMetrics, with `exemplars` (one per bucket of
/// `sluice_decision_seconds`, `+Inf` last) on that histogram's bucket lines.
pub(super) fn openmetrics(text: &str, exemplars: &[Option<exemplar::Exemplar>]) -> String {
    use std::fmt::Write;
    let mut types: HashMap<&str, &str> = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, ty)) = rest.split_once(' ') {
                types.insert(name, ty);
            }
        }
    }
    // The family name and type a 0.0.4 family is declared with in OpenMetrics.
    let declared = |name: &str| -> (String, &'static str) {
        match types.get(name).copied() {
            Some("counter") => match name.strip_suffix("_total") {
                Some(base) => (base.to_string(), "counter"),
                None => (name.to_string(), "unknown"),
            },
            Some("gauge") => (name.to_string(), "gauge"),
            Some("histogram") => (name.to_string(), "histogram"),
            Some("summary") => (name.to_string(), "summary"),
            _ => (name.to_string(), "unknown"),
        }
    };
    let mut out = String::with_capacity(text.len() + 1024);
    let mut bucket = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            let _ = writeln!(out, "# HELP {} {help}", declared(name).0);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_once(' ').map_or(rest, |(n, _)| n);
            let (family, ty) = declared(name);
            let _ = writeln!(out, "# TYPE {family} {ty}");
        } else if line.starts_with('#') || line.is_empty() {
            continue;
        } else if line.starts_with("sluice_decision_seconds_bucket{") {
            out.push_str(line);
            if let Some(Some(e)) = exemplars.get(bucket) {
                let _ = write!(
                    out,
                    " # {{trace_id=\"{:032x}\"}} {} {:.3}",
                    u128::from_be_bytes(e.trace_id),
                    e.seconds,
                    e.at
                );
            }
            bucket += 1;
            out.push('\n');
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("# EOF\n");
    out
}
