//! `sluice-bench report FILE...`: one table from the JSON lines of `load --json`, with
//! each target's throughput and latency against the `ceiling` target of the same
//! scenario and mode (the do-nothing server, same run, same machine).

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
    print!("{}", table(&rows, &r.ceiling));
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
        let base = group.iter().find(|r| s(r, "target") == ceiling);
        for r in &group {
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
            let _ = writeln!(
                out,
                "{:<10} {:<7} {:<22} {:>9.0} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7}  {}",
                scenario,
                mode_label,
                s(r, "target"),
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
}
