//! `sluice-bench report FILE...`: one table from the JSON lines of `load --json`, with
//! each target's throughput and latency against the `ceiling` target of the same
//! scenario and mode (the do-nothing server, same run, same machine). With
//! `--against TARGET` it compares at equal or lower p99 instead: runs of each target at
//! several concurrencies, each point of TARGET against the most another target did at
//! a p99 no higher.

use std::fmt::Write;

use clap::Parser;
use serde_json::Value;

#[derive(Parser, Clone, Debug)]
pub struct Report {
    /// Files of JSON lines written by `sluice-bench load --json` ("-" for stdin).
    #[arg(required = true)]
    pub files: Vec<String>,
    /// The target the ratios are taken against.
    #[arg(long, default_value = "ceiling")]
    pub ceiling: String,
    /// Compare at equal or lower p99 against this target (closed-loop runs only).
    #[arg(long)]
    pub against: Option<String>,
}

pub fn run(r: Report) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for f in &r.files {
        let text = if f == "-" {
            std::io::read_to_string(std::io::stdin())?
        } else {
            std::fs::read_to_string(f)?
        };
        for line in text.lines().filter(|l| l.trim_start().starts_with('{')) {
            rows.push(serde_json::from_str::<Value>(line)?);
        }
    }
    match &r.against {
        Some(against) => print!("{}", matched(&rows, against)),
        None => print!("{}", table(&rows, &r.ceiling)),
    }
    Ok(())
}

fn s(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or("").to_string()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

/// Renders rows in the order seen, scenarios grouped, ratios against `ceiling`.
pub fn table(rows: &[Value], ceiling: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:<7} {:<22} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7}  notes",
        "scenario",
        "mode",
        "target",
        "rps",
        "p50_us",
        "p99_us",
        "rps/ceil",
        "p50/ceil",
        "p99/ceil",
        "cpu_us",
        "redis_us",
        "gen_us"
    );
    let mut scenarios: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (s(r, "scenario"), s(r, "mode"));
        if !scenarios.contains(&k) {
            scenarios.push(k);
        }
    }
    for (scenario, mode) in &scenarios {
        let group: Vec<&Value> = rows
            .iter()
            .filter(|r| &s(r, "scenario") == scenario && &s(r, "mode") == mode)
            .collect();
        for r in &group {
            let base = base_of(&group, ceiling, r);
            let ratio = |k: &str| match base {
                Some(b) if f(b, k) > 0.0 => format!("{:.2}", f(r, k) / f(b, k)),
                _ => "-".into(),
            };
            let mode_label = if mode == "rate" {
                format!("{:.0}/s", f(r, "rate"))
            } else {
                mode.clone()
            };
            let mut notes = Vec::new();
            let errors = f(r, "errors");
            if errors > 0.0 {
                notes.push(format!("errors {errors}"));
            }
            if f(r, "over_limit") > 0.0 {
                notes.push(format!("over_limit {}", f(r, "over_limit")));
            }
            if let Some(a) = r.get("attacker") {
                notes.push(format!(
                    "attacker admitted {}/s (ok {} over {})",
                    a["admitted_per_s"], a["ok"], a["over_limit"]
                ));
                if let Some(n) = r.get("normal") {
                    notes.push(format!("normal over {}", n["over_limit"]));
                }
            }
            if f(r, "failed_open") > 0.0 {
                notes.push(format!("{} decisions by failure mode", f(r, "failed_open")));
            }
            // A few requests are always in the pacer's hands; flag a backlog of more
            // than 10 ms of the schedule.
            if f(r, "behind") > (f(r, "rate") / 100.0).max(10.0) {
                notes.push(format!("behind {}", f(r, "behind")));
            }
            if let Some(e) = r.get("first_error").and_then(Value::as_str) {
                notes.push(format!("first error: {e}"));
            }
            // CPU per request of the target, of its Redis and of the generator, when
            // measured.
            let cpu = |k: &str| match r.get(k).and_then(Value::as_f64) {
                Some(v) => format!("{v:.1}"),
                None => "-".into(),
            };
            let target = match r.get("round") {
                Some(n) => format!("{} #{n}", s(r, "target")),
                None => s(r, "target"),
            };
            let _ = writeln!(
                out,
                "{:<10} {:<7} {:<22} {:>9.0} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7}  {}",
                scenario,
                mode_label,
                target,
                f(r, "rps"),
                f(r, "p50_us"),
                f(r, "p99_us"),
                ratio("rps"),
                ratio("p50_us"),
                ratio("p99_us"),
                cpu("cpu_us"),
                cpu("redis_cpu_us"),
                cpu("generator_cpu_us"),
                notes.join("; ")
            );
        }
    }
    out.push_str(&medians(rows, &scenarios, ceiling));
    // And against the reference service, the goal's yardstick, when it ran.
    if ceiling != REFERENCE && rows.iter().any(|r| s(r, "target") == REFERENCE) {
        out.push_str(&medians(rows, &scenarios, REFERENCE));
    }
    out
}

/// The target `scripts/bench.sh` names envoyproxy/ratelimit.
const REFERENCE: &str = "reference";

/// The `ceiling` row of `r`'s round among `group` (one scenario and mode).
fn base_of<'a>(group: &[&'a Value], ceiling: &str, r: &Value) -> Option<&'a Value> {
    group
        .iter()
        .copied()
        .find(|b| s(b, "target") == ceiling && round(b) == round(r))
}

/// The round a row was measured in (`scripts/bench.sh` with `BENCH_ROUNDS`); 0 for a
/// single round.
fn round(r: &Value) -> u64 {
    r["round"].as_u64().unwrap_or(0)
}

/// With several rounds: per scenario and target, the median over the rounds of the
/// req/s ratio to that round's ceiling, with its lowest and highest, so that one
/// round disturbed by the machine does not stand for the whole run.
fn medians(rows: &[Value], scenarios: &[(String, String)], ceiling: &str) -> String {
    let mut out = String::new();
    let mut rounds: Vec<u64> = rows.iter().map(round).collect();
    rounds.sort_unstable();
    rounds.dedup();
    if rounds.len() < 2 {
        return out;
    }
    let _ = writeln!(
        out,
        "# req/s against the same round's {ceiling}, over {} rounds: median (lowest-highest)",
        rounds.len()
    );
    for (scenario, mode) in scenarios {
        let group: Vec<&Value> = rows
            .iter()
            .filter(|r| &s(r, "scenario") == scenario && &s(r, "mode") == mode)
            .collect();
        let mut targets: Vec<String> = Vec::new();
        for r in &group {
            let t = s(r, "target");
            if t != ceiling && t != "ceiling" && !targets.contains(&t) {
                targets.push(t);
            }
        }
        for t in &targets {
            let mut ratios: Vec<f64> = group
                .iter()
                .filter(|r| &s(r, "target") == t)
                .filter_map(|r| {
                    let base = base_of(&group, ceiling, r)?;
                    (f(base, "rps") > 0.0).then(|| f(r, "rps") / f(base, "rps"))
                })
                .collect();
            if ratios.is_empty() {
                continue;
            }
            ratios.sort_by(f64::total_cmp);
            let n = ratios.len();
            // The lower middle of an even count: never flatters.
            let median = ratios[(n - 1) / 2];
            let _ = writeln!(
                out,
                "# {scenario:<10} {t:<22} {median:.2} ({:.2}-{:.2}) over {n} rounds",
                ratios[0],
                ratios[n - 1]
            );
        }
    }
    out
}

/// Throughput at equal or lower p99: per scenario, each closed-loop point of
/// `against` (one concurrency) beside the highest req/s each other target reached in a
/// run whose p99 was no higher (and at most 0.1 % of whose decisions the failure mode
/// made), and the ratio; then per target the lowest ratio over all the points and over
/// those whose p99 is within Envoy's default 20 ms timeout for rate-limit calls (past
/// it Envoy stops waiting for answers), and the ratio at the point where `against` had
/// its most req/s.
pub fn matched(rows: &[Value], against: &str) -> String {
    // Envoy's rate-limit filter waits 20 ms for an answer unless told otherwise.
    const ENVOY_TIMEOUT_US: f64 = 20_000.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:<22} {:>6} {:>9} {:>8}   {:>6} {:>9} {:>8} {:>6}",
        "scenario", "target", "c", "rps", "p99_us", "ref_c", "ref_rps", "ref_p99", "ratio"
    );
    let closed: Vec<&Value> = rows.iter().filter(|r| s(r, "mode") == "closed").collect();
    let mut scenarios: Vec<String> = Vec::new();
    let mut targets: Vec<String> = Vec::new();
    for r in &closed {
        let (sc, t) = (s(r, "scenario"), s(r, "target"));
        if !scenarios.contains(&sc) {
            scenarios.push(sc);
        }
        if t != against && !targets.contains(&t) {
            targets.push(t);
        }
    }
    let mut summary = String::new();
    for scenario in &scenarios {
        let of = |t: &str| -> Vec<&Value> {
            let mut v: Vec<&Value> = closed
                .iter()
                .copied()
                .filter(|r| &s(r, "scenario") == scenario && s(r, "target") == t)
                .collect();
            v.sort_by(|a, b| f(a, "concurrency").total_cmp(&f(b, "concurrency")));
            v
        };
        let refs = of(against);
        let Some(peak) = refs
            .iter()
            .max_by(|a, b| f(a, "rps").total_cmp(&f(b, "rps")))
        else {
            continue;
        };
        for t in &targets {
            let points = of(t);
            if points.is_empty() {
                continue;
            }
            let mut lowest: Option<f64> = None;
            let mut lowest_in_time: Option<f64> = None;
            let mut at_peak = None;
            for r in &refs {
                // A run with more than 0.1 % of its decisions by the failure mode (the
                // store too slow) counted less than it answered: it does not count.
                let best = points
                    .iter()
                    .filter(|p| f(p, "p99_us") <= f(r, "p99_us"))
                    .filter(|p| f(p, "failed_open") <= f(p, "requests") / 1000.0)
                    .max_by(|a, b| f(a, "rps").total_cmp(&f(b, "rps")));
                let ratio = best.map(|b| f(b, "rps") / f(r, "rps").max(1.0));
                let cell = |k: &str, v: Option<&&Value>| match v {
                    Some(v) => format!("{:.0}", f(v, k)),
                    None => "-".into(),
                };
                let _ = writeln!(
                    out,
                    "{:<10} {:<22} {:>6} {:>9} {:>8}   {:>6.0} {:>9.0} {:>8.0} {:>6}",
                    scenario,
                    t,
                    cell("concurrency", best),
                    cell("rps", best),
                    cell("p99_us", best),
                    f(r, "concurrency"),
                    f(r, "rps"),
                    f(r, "p99_us"),
                    ratio.map_or("-".into(), |x| format!("{x:.2}"))
                );
                // A point the target never got under counts as ratio 0.
                let x = ratio.unwrap_or(0.0);
                lowest = Some(lowest.map_or(x, |l: f64| l.min(x)));
                if f(r, "p99_us") <= ENVOY_TIMEOUT_US {
                    lowest_in_time = Some(lowest_in_time.map_or(x, |l: f64| l.min(x)));
                }
                if std::ptr::eq(*r, *peak) {
                    at_peak = Some(x);
                }
            }
            let _ = writeln!(
                summary,
                "# {scenario} {t}: lowest ratio {:.2} over {} points of {against}, {} over \
                 those with a p99 within 20 ms; \
                 {:.2} at its most req/s ({:.0} at {:.0} in flight)",
                lowest.unwrap_or(0.0),
                refs.len(),
                lowest_in_time.map_or("-".into(), |x| format!("{x:.2}")),
                at_peak.unwrap_or(0.0),
                f(peak, "rps"),
                f(peak, "concurrency"),
            );
        }
    }
    out.push_str(&summary);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_against_the_ceiling_of_the_same_scenario() {
        let rows: Vec<Value> = [
            r#"{"target":"ceiling","scenario":"hot","mode":"closed","rps":1000,"p50_us":100,"p99_us":200}"#,
            r#"{"target":"sluice","scenario":"hot","mode":"closed","rps":500,"p50_us":150,"p99_us":500,
               "cpu_us":12.34,"redis_cpu_us":0}"#,
            r#"{"target":"ceiling","scenario":"attack","mode":"rate","rate":100,"rps":100,"p50_us":50,"p99_us":90}"#,
            r#"{"target":"sluice","scenario":"attack","mode":"rate","rate":100,"rps":100,"p50_us":60,"p99_us":99,
               "attacker":{"admitted_per_s":10,"ok":50,"over_limit":450},"normal":{"over_limit":0}}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
        let t = table(&rows, "ceiling");
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(
            lines[2].contains("0.50") && lines[2].contains("2.50"),
            "{t}"
        );
        // CPU per request when measured, "-" when not.
        assert!(
            lines[2].contains("12.3") && lines[2].contains(" 0.0 "),
            "{t}"
        );
        assert!(lines[1].contains(" - "), "{t}");
        assert!(
            lines[4].contains("100/s") && lines[4].contains("1.10"),
            "{t}"
        );
        assert!(lines[4].contains("attacker admitted 10/s"), "{t}");
    }

    #[test]
    fn rounds_are_taken_against_their_own_ceiling_and_summed_up_by_the_median() {
        let row = |t: &str, round: u32, rps: u32| -> Value {
            serde_json::from_str(&format!(
                r#"{{"target":"{t}","scenario":"layered","mode":"closed","round":{round},"rps":{rps},"p50_us":1,"p99_us":1}}"#
            ))
            .unwrap()
        };
        let rows = vec![
            row("ceiling", 1, 1000),
            row("memory", 1, 900),
            row("ceiling", 2, 2000),
            row("memory", 2, 1000),
            row("ceiling", 3, 1000),
            row("memory", 3, 950),
        ];
        let t = table(&rows, "ceiling");
        // Round 2's ratio is against round 2's ceiling (2000), not round 1's.
        let r2 = t.lines().find(|l| l.contains("memory #2")).unwrap();
        assert!(r2.contains(" 0.50 "), "{t}");
        // 0.50, 0.90 and 0.95: the median is 0.90, not the mean (0.78).
        assert!(
            t.contains("# layered    memory                 0.90 (0.50-0.95) over 3 rounds"),
            "{t}"
        );
        // Against the reference too, when it ran.
        let mut with_ref = rows.clone();
        for (round, rps) in [(1, 300), (2, 250), (3, 400)] {
            with_ref.push(row("reference", round, rps));
        }
        let t = table(&with_ref, "ceiling");
        assert!(
            t.contains("# layered    memory                 3.00 (2.38-4.00) over 3 rounds"),
            "{t}"
        );
        // One round: no summary.
        let one = table(&rows[..2], "ceiling");
        assert!(!one.contains("rounds"), "{one}");
    }

    #[test]
    fn matched_takes_the_most_a_target_did_at_a_p99_no_higher() {
        let failed = |mut r: Value| {
            r["requests"] = 10000.into();
            r["failed_open"] = 11.into();
            r
        };
        let row = |t: &str, c: u32, rps: u32, p99: u32| -> Value {
            serde_json::from_str(&format!(
                r#"{{"target":"{t}","scenario":"layered","mode":"closed","concurrency":{c},"rps":{rps},"p99_us":{p99}}}"#
            ))
            .unwrap()
        };
        let rows = vec![
            row("reference", 64, 1000, 8000),
            row("reference", 256, 1200, 30000),
            row("sluice", 64, 2500, 3000),
            row("sluice", 256, 3300, 8100),
            row("sluice", 512, 3700, 15000),
            // Most of its answers by the failure mode: not a point at all.
            failed(row("sluice", 1024, 9000, 20000)),
            // Another scenario's points never count.
            row("reference", 16, 10, 100),
            row("sluice", 16, 50, 500),
        ]
        .into_iter()
        .map(|mut r| {
            if r["concurrency"] == 16 {
                r["scenario"] = "hot".into();
            }
            r
        })
        .collect::<Vec<_>>();
        let t = matched(&rows, "reference");
        let lines: Vec<&str> = t.lines().collect();
        // Reference at 64 (p99 8000): sluice's 256 run (p99 8100) is over, so 64's 2500.
        let at64 = lines
            .iter()
            .find(|l| l.contains("layered") && l.contains(" 8000 "))
            .unwrap();
        assert!(at64.contains(" 2500 ") && at64.ends_with(" 2.50"), "{t}");
        // Reference at 256 (p99 30000): sluice's best under it is 3700.
        let at256 = lines.iter().find(|l| l.contains(" 30000 ")).unwrap();
        assert!(at256.contains(" 3700 ") && at256.ends_with(" 3.08"), "{t}");
        assert!(
            t.contains("# layered sluice: lowest ratio 2.50 over 2 points of reference, 2.50 over those with a p99 within 20 ms; 3.08 at its most req/s (1200 at 256 in flight)"),
            "{t}"
        );
        // No sluice point under the hot reference's p99: no ratio, lowest 0.
        assert!(t.contains("# hot sluice: lowest ratio 0.00"), "{t}");
    }
}
