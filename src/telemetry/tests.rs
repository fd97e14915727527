use super::*;
use crate::clock::ManualClock;
use crate::limiter::{Descriptor, Limiter, Settings};
use crate::store::MemoryStore;

const T0: Micros = 1_700_000_000 * SECOND;

const POLICY: &str = r#"
domain: d
descriptors:
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 2
      algorithm: fixed_window
      penalty: {violations: 3, within: 10s, ban: 1m}
"#;

fn setup(clock: &ManualClock, hash_keys: bool) -> (Limiter<MemoryStore>, Metrics) {
    let settings = Settings {
        hashing: crate::limiter::key::Hashing {
            all: hash_keys,
            hash: secret_hash(),
        },
        ..Settings::default()
    };
    let limiter = crate::limiter::test_limiter(POLICY, clock, settings);
    (limiter, Metrics::with_clock(Arc::new(clock.clone())))
}

fn secret_hash() -> crate::hash::ValueHash {
    crate::hash::ValueHash::from_secret(b"the replicas' shared secret").unwrap()
}

async fn ask(l: &Limiter<MemoryStore>, m: &Metrics, ip: &str) {
    let entries = [("ip", ip)];
    let outcome = l.decide("d", &[Descriptor::new(&entries[..], 1)]).await;
    m.record("d", &outcome, Duration::from_micros(10));
}

#[tokio::test]
async fn ratio_top_offenders_and_bans_are_exported() {
    let clock = ManualClock::new(T0);
    let (l, m) = setup(&clock, false);
    for _ in 0..10 {
        ask(&l, &m, "6.6.6.6").await;
    }
    for i in 0..10 {
        ask(&l, &m, &format!("10.0.0.{i}")).await;
    }
    let text = m.render();
    // 20 decisions: 6.6.6.6 admitted twice, denied 3 times, then banned 5 times.
    assert!(
        text.contains(r#"sluice_deny_ratio{domain="d",rule="ip"} 0.4"#),
        "{text}"
    );
    assert!(text.contains(r#"sluice_recent_denials{domain="d",rule="ip"} 8"#));
    assert!(
        text.contains(r#"sluice_top_offenders{domain="d",key="6.6.6.6",rank="1",rule="ip"} 8"#),
        "{text}"
    );
    assert!(text.contains(r#"sluice_penalty_bans_total{domain="d",rule="ip"} 1"#));
    assert!(text.contains(
        r#"sluice_requests_total{domain="d",layer="service",outcome="banned",rule="ip"} 5"#
    ));
    assert!(text.contains(
        r#"sluice_requests_total{domain="d",layer="service",outcome="over_limit",rule="ip"} 3"#
    ));
    // A minute and a quarter later the window is empty and the series are gone.
    clock.advance(75 * SECOND);
    let text = m.render();
    assert!(!text.contains("sluice_deny_ratio{"), "{text}");
    assert!(!text.contains("sluice_top_offenders{"), "{text}");
    assert!(m.top_offenders().is_empty());
}

/// A key a client chose shows in `sluice_top_offenders` with its control
/// characters escaped: `curl /metrics` on a terminal does not set its title or
/// write its clipboard. `/debug/top` keeps the key as it is.
#[tokio::test]
async fn top_offenders_label_escapes_what_a_terminal_would_run() {
    let clock = ManualClock::new(T0);
    let (l, m) = setup(&clock, false);
    let key = "x\u{1b}]0;title\u{7}";
    for _ in 0..4 {
        ask(&l, &m, key).await;
    }
    let text = m.render();
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(
        text.contains(r#"key="x\\u{1b}]0;title\\u{7}",rank="1""#),
        "{text}"
    );
    assert_eq!(m.top_offenders()[0].top[0].0, key);
}

#[tokio::test]
async fn shed_and_near_limit_are_counted_per_rule() {
    let policy = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window, shed: {from: 0.5}}\n";
    let clock = ManualClock::new(T0);
    let l = crate::limiter::test_limiter(policy, &clock, Settings::default())
        .with_chance(Arc::new(crate::limiter::shed::SeededChance::new(5)));
    let m = Metrics::with_clock(Arc::new(clock.clone())).with_near_limit_ratio(0.8);
    let (mut shed, mut near) = (0, 0);
    for k in 0..50 {
        let ip = format!("10.0.0.{k}");
        let entries = [("ip", ip.as_str())];
        for n in 1..=12 {
            let o = l.decide("d", &[Descriptor::new(&entries[..], 1)]).await;
            m.record("d", &o, Duration::from_micros(10));
            shed += usize::from(o.statuses[0].shed);
            // Admitted to 9 or 10 of 10: past 0.8 of the limit.
            near += usize::from(!o.over_limit && n >= 9);
        }
    }
    assert!(shed > 0 && near > 0, "{shed} {near}");
    let text = m.render();
    for line in [
        format!(
            r#"sluice_requests_total{{domain="d",layer="service",outcome="shed",rule="ip"}} {shed}"#
        ),
        format!(r#"sluice_near_limit_total{{domain="d",rule="ip"}} {near}"#),
        r#"sluice_requests_total{domain="d",layer="service",outcome="over_limit",rule="ip"} 100"#
            .to_string(),
    ] {
        assert!(text.contains(&line), "{line} in {text}");
    }
}

/// A quota limit past its limit in a request another quota limit admits is counted
/// apart, as a shadow limit's would-be denial is: neither `ok` (its limit is spent)
/// nor a denial (the request went through). Only when every quota limit is past
/// does the request count `over_limit`.
#[tokio::test]
async fn a_quota_over_its_limit_in_an_admitted_request_is_counted_apart() {
    let policy = "domain: d\ndescriptors:\n  - key: plan\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}\n  - key: team\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}\n  - key: ip\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}\n";
    let clock = ManualClock::new(T0);
    let l = crate::limiter::test_limiter(policy, &clock, Settings::default());
    let m = Metrics::with_clock(Arc::new(clock.clone()));
    m.policy_swapped(&l.policy());
    let series = |outcome: &str, rule: &str, n: u64| {
        format!(
            r#"sluice_requests_total{{domain="d",layer="service",outcome="{outcome}",rule="{rule}"}} {n}"#
        )
    };
    // Declared at 0 for the quota rules only, as shadow_over_limit is for the shadow one.
    let text = m.render();
    assert!(
        text.contains(&series("quota_over_limit", "plan", 0)),
        "{text}"
    );
    assert!(
        !text.contains(r#"outcome="quota_over_limit",rule="ip""#),
        "{text}"
    );
    assert!(
        text.contains(&series("shadow_over_limit", "ip", 0)),
        "{text}"
    );
    let (plan, team, ip) = ([("plan", "free")], [("team", "a")], [("ip", "1.2.3.4")]);
    let mut admitted = 0;
    for _ in 0..4 {
        let o = l
            .decide(
                "d",
                &[
                    Descriptor::new(&plan[..], 1),
                    Descriptor::new(&team[..], 1),
                    Descriptor::new(&ip[..], 1),
                ],
            )
            .await;
        m.record("d", &o, Duration::from_micros(10));
        admitted += u64::from(!o.over_limit);
    }
    // plan: 1 ok, then past its limit while team has room (2), then with team past too (1).
    assert_eq!(admitted, 3);
    let text = m.render();
    for line in [
        series("ok", "plan", 1),
        series("quota_over_limit", "plan", 2),
        series("over_limit", "plan", 1),
        series("ok", "team", 3),
        series("over_limit", "team", 1),
        series("ok", "ip", 1),
        series("shadow_over_limit", "ip", 3),
    ] {
        assert!(text.contains(&line), "{line} in {text}");
    }
    // Neither kind of would-be denial is a denial.
    assert!(
        text.contains(r#"sluice_recent_denials{domain="d",rule="plan"} 1"#),
        "{text}"
    );
}

/// One client every 20 ms, another with exponential gaps of the same mean
/// (seeded), through the limiter: only the first is listed, with `--hash-keys`
/// as its hash.
#[tokio::test]
async fn a_client_on_a_timer_is_listed_as_regular() {
    use rand::{Rng, SeedableRng};
    let policy = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";
    for hash_keys in [false, true] {
        let clock = ManualClock::new(T0);
        let settings = Settings {
            hashing: crate::limiter::key::Hashing {
                all: hash_keys,
                hash: secret_hash(),
            },
            ..Settings::default()
        };
        let l = crate::limiter::test_limiter(policy, &clock, settings);
        let m = Metrics::with_clock(Arc::new(clock.clone()));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut events: Vec<(Micros, &str)> = Vec::new();
        let (mut bot, mut person) = (T0, T0);
        for _ in 0..60 {
            bot += 20_000;
            events.push((bot, "6.6.6.6"));
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            person += (-u.ln() * 20_000.0) as Micros;
            events.push((person, "10.0.0.1"));
        }
        events.sort();
        for (t, ip) in events {
            clock.set(t);
            let entries = [("ip", ip)];
            let d = [Descriptor::new(&entries[..], 1)];
            let o = l.decide("d", &d).await;
            m.record_request("d", &o, &d, l.hashing(), Duration::from_micros(10));
        }
        let signals = m.signals();
        assert_eq!(signals.len(), 1, "{signals:?}");
        let regular = &signals[0].regular;
        assert_eq!(regular.len(), 1, "{regular:?}");
        let mut shown = String::new();
        if hash_keys {
            secret_hash().push_hex(&mut shown, b"6.6.6.6");
        } else {
            shown.push_str("6.6.6.6");
        }
        assert_eq!(regular[0].key, shown);
        assert_eq!(regular[0].requests, 60);
        assert!((regular[0].mean_interval - 0.02).abs() < 1e-9);
        let text = m.render();
        assert!(
            text.contains(r#"sluice_regular_keys{domain="d",rule="ip"} 1"#),
            "{text}"
        );
        assert!(!text.contains("6.6.6.6") || !hash_keys);
    }
}

/// 50 addresses of one /24 each a little over the limit, beside 10 loud
/// addresses of their own networks: no address of the /24 is a top offender, the
/// /24 is the first subnet by denials and by addresses.
#[tokio::test]
async fn a_subnet_of_quiet_offenders_ranks_first() {
    for hash_keys in [false, true] {
        let clock = ManualClock::new(T0);
        let settings = Settings {
            hashing: crate::limiter::key::Hashing {
                all: hash_keys,
                hash: secret_hash(),
            },
            ..Settings::default()
        };
        // POLICY: 2 a minute, banned after 3 denials in 10 s.
        let l = crate::limiter::test_limiter(POLICY, &clock, settings);
        let m = Metrics::with_clock(Arc::new(clock.clone()));
        let send = |ip: String| {
            let (l, m) = (&l, &m);
            async move {
                let entries = [("ip", ip.as_str())];
                let d = [Descriptor::new(&entries[..], 1)];
                let o = l.decide("d", &d).await;
                m.record_request("d", &o, &d, l.hashing(), Duration::from_micros(10));
            }
        };
        for i in 0..50 {
            for _ in 0..3 {
                send(format!("10.1.2.{i}")).await;
            }
        }
        for i in 0..10 {
            for _ in 0..6 {
                send(format!("192.168.{i}.1")).await;
            }
        }
        let shown = |v: &str| {
            let mut out = String::new();
            crate::limiter::key::push_value(&mut out, v, l.hashing());
            out
        };
        let top = &m.top_offenders()[0].top;
        assert_eq!(top.len(), 10);
        assert!(top.iter().all(|(_, n)| *n == 4), "{top:?}");
        let quiet: Vec<String> = (0..50).map(|i| shown(&format!("10.1.2.{i}"))).collect();
        assert!(top.iter().all(|(k, _)| !quiet.contains(k)), "{top:?}");
        let s = &m.signals()[0].subnets;
        let net = shown("10.1.2.0/24");
        assert_eq!(
            (s.by_denials[0].subnet.as_str(), s.by_denials[0].denials),
            (net.as_str(), 50)
        );
        assert_eq!(
            (
                s.by_addresses[0].subnet.as_str(),
                s.by_addresses[0].addresses
            ),
            (net.as_str(), 50)
        );
        assert_eq!(s.by_denials[1].denials, 4);
        let text = m.render();
        let series =
            format!(r#"sluice_top_subnets{{domain="d",rank="1",rule="ip",subnet="{net}"}} 50"#);
        assert!(text.contains(&series), "{series} in {text}");
        assert!(text.contains(&format!(
            r#"sluice_top_subnet_addresses{{domain="d",rank="1",rule="ip",subnet="{net}"}} 50"#
        )));
        assert_eq!(text.contains("10.1.2."), !hash_keys);
    }
}

/// A login path denying 2 a minute for half an hour, then 30 in one minute: its
/// spike ratio is about 24 (the baseline, started at zero, is near 1.27) and it is
/// listed. The same denials of `/search`, on
/// the same rule path but not sensitive, do not count.
#[tokio::test]
async fn a_sensitive_rule_spikes_against_its_own_baseline() {
    let policy = "domain: d\ndescriptors:\n  - key: path\n    value: /login\n    sensitive: true\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: path\n    value: /search\n    rate_limit: {unit: second, requests_per_unit: 0}\n";
    let start = T0 - T0 % (60 * SECOND);
    let clock = ManualClock::new(start);
    let l = crate::limiter::test_limiter(policy, &clock, Settings::default());
    let m = Metrics::with_clock(Arc::new(clock.clone()));
    let deny = |path: &'static str| {
        let (l, m) = (&l, &m);
        async move {
            let entries = [("path", path)];
            let o = l.decide("d", &[Descriptor::new(&entries[..], 1)]).await;
            assert!(o.over_limit);
            m.record("d", &o, Duration::from_micros(10));
        }
    };
    for minute in 0..30 {
        for i in 0..2 {
            clock.set(start + minute * 60 * SECOND + i * 20 * SECOND);
            deny("/login").await;
            deny("/search").await;
        }
    }
    clock.set(start + 30 * 60 * SECOND);
    let calm = m.signals();
    let spike = calm[0].spike.unwrap();
    let baseline = 2.0 * (1.0 - (29.0_f64 / 30.0).powi(30));
    assert!(
        (spike.baseline.unwrap() - baseline).abs() < 1e-9,
        "{spike:?}"
    );
    assert!(!spike.is_spike(), "{spike:?}");
    for i in 0..30 {
        clock.set(start + 30 * 60 * SECOND + i * SECOND);
        deny("/login").await;
        deny("/search").await;
    }
    let spike = m.signals()[0].spike.unwrap();
    // The 30 of this minute and minute 29's 2 weighted by 31 of its 60 s.
    let recent = 30.0 + 2.0 * 31.0 / 60.0;
    assert!((spike.recent - recent).abs() < 1e-9, "{spike:?}");
    assert!((spike.ratio - recent / baseline).abs() < 1e-9, "{spike:?}");
    assert!(spike.is_spike());
    let text = m.render();
    let exported: f64 = gauge(&text, "sluice_denial_spike_ratio")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!((exported - recent / baseline).abs() < 1e-6, "{text}");
    // Three quiet minutes later the last minute is empty: ratio 0.
    clock.advance(3 * 60 * SECOND);
    let spike = m.signals()[0].spike.unwrap();
    assert_eq!((spike.recent, spike.ratio), (0.0, 0.0));
    assert!(!spike.is_spike());
    // A policy where /login is no longer sensitive: its gauge goes.
    let plain = policy.replace("    sensitive: true\n", "");
    let docs = crate::policy::parse_str("p.yaml", &plain).unwrap();
    m.policy_swapped(&crate::policy::compile(docs).unwrap());
    assert!(m.signals().iter().all(|s| s.spike.is_none()));
    assert!(!m.render().contains("sluice_denial_spike_ratio{"));
}

#[tokio::test]
async fn hash_keys_shows_hashes_in_the_top_offenders() {
    let clock = ManualClock::new(T0);
    let (l, m) = setup(&clock, true);
    for _ in 0..5 {
        ask(&l, &m, "6.6.6.6").await;
    }
    let top = m.top_offenders();
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].top.len(), 1);
    let mut keyed = String::new();
    secret_hash().push_hex(&mut keyed, b"6.6.6.6");
    assert_eq!(top[0].top[0].0, keyed);
    let text = m.render();
    assert!(!text.contains("6.6.6.6"));
    assert!(text.contains(&keyed), "{text}");
}

/// Captures what a tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn store_state_changes_are_logged_once_each() {
    use crate::limiter::{Status, StoreFailure};
    let docs = crate::policy::parse_str("p.yaml", POLICY).expect("parses");
    let policy = Arc::new(crate::policy::compile(docs).expect("compiles"));
    let outcome = |failed: bool| Outcome {
        policy: policy.clone(),
        domain_known: true,
        over_limit: false,
        statuses: vec![Status {
            rule: Some(0),
            limit_override: None,
            over_limit: false,
            verdict: (!failed).then(crate::algorithm::Verdict::default),
            hits: 1,
            spend: crate::store::Spend::IfAdmitted,
            ban: Ban::None,
            shed: false,
            tightened: None,
            answered_by: None,
            spent_denied: false,
        }],
        delay: 0,
        failure: failed.then(|| StoreFailure {
            error: crate::store::StoreError::Timeout,
            shard: None,
            mode: FailureMode::Open,
            answer: Default::default(),
            store: "redis",
            partial: false,
        }),
        offenders: Vec::new(),
        now: None,
        overrides: Vec::new(),
        local: false,
    };
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let clock = Arc::new(ManualClock::new(1_000 * SECOND));
    let m = Metrics::with_clock(clock.clone());
    let local = || Outcome {
        local: true,
        ..outcome(false)
    };
    let lines = |captured: &Captured| {
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_string).collect::<Vec<_>>()
    };
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..3 {
            m.record("d", &outcome(false), Duration::ZERO);
        }
        // An outage, with answers in between that come without a failure (a cached
        // denial, a shard that is up): the store is not back while failures go on.
        for _ in 0..5 {
            m.record("d", &outcome(true), Duration::ZERO);
            clock.advance(SECOND / 2);
            m.record("d", &outcome(false), Duration::ZERO);
        }
        assert_eq!(lines(&captured).len(), 1, "{:?}", lines(&captured));
        // A second without a failure: decided in memory (`local`) is no sign of it,
        // a decision is.
        clock.advance(SECOND);
        m.record("d", &local(), Duration::ZERO);
        assert_eq!(lines(&captured).len(), 1, "{:?}", lines(&captured));
        for _ in 0..3 {
            m.record("d", &outcome(false), Duration::ZERO);
        }
        // Another outage, over with no decision to see it end but its shard's
        // word: the next one's failure says the store answered again before it
        // says it fails.
        m.record("d", &outcome(true), Duration::ZERO);
        crate::store::Report::shard_answered(&m, "redis", "10.0.0.1:6379");
        clock.advance(2 * SECOND);
        m.record("d", &outcome(true), Duration::ZERO);
        // That outage goes on with a request every two seconds and no shard
        // answering: the store never answered, so the log says nothing more.
        for _ in 0..5 {
            clock.advance(2 * SECOND);
            m.record("d", &outcome(true), Duration::ZERO);
        }
        // A decision from the store too soon after the last failure to end the
        // outage, then nothing until the next: that one is an outage of its own.
        clock.advance(SECOND / 2);
        m.record("d", &outcome(false), Duration::ZERO);
        clock.advance(10 * SECOND);
        m.record("d", &outcome(true), Duration::ZERO);
    });
    let lines = lines(&captured);
    assert_eq!(lines.len(), 7, "{lines:?}");
    assert!(lines[0].contains("store failing") && lines[0].contains("redis"));
    // Which domain's failure mode the line names: domains answer by their own.
    assert!(
        lines[0].contains("domain=\"d\"") || lines[0].contains("domain=d"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("store answering again") && lines[1].contains("failed_calls=5"));
    assert!(lines[2].contains("store failing"));
    assert!(lines[3].contains("store answering again") && lines[3].contains("failed_calls=1"));
    assert!(lines[4].contains("store failing"));
    assert!(lines[5].contains("store answering again") && lines[5].contains("failed_calls=6"));
    assert!(lines[6].contains("store failing"));
    assert!(m
        .render()
        .contains(r#"sluice_store_failures_total{store="redis"} 13"#));
    assert!(m.render().contains(
        r#"sluice_requests_total{domain="d",layer="service",outcome="failed_open",rule="ip"} 13"#
    ));
}

#[tokio::test]
async fn disabled_metrics_record_nothing() {
    let clock = ManualClock::new(T0);
    let (l, _) = setup(&clock, false);
    let m = Metrics::disabled();
    ask(&l, &m, "1.1.1.1").await;
    assert!(!m.render().contains("sluice_requests_total{"));
}

#[test]
fn store_errors_are_counted_per_shard_and_kind_from_zero() {
    let m = Metrics::new();
    let report: &dyn Report = &m;
    report.shard_declared("redis", "10.0.0.1:6379");
    let text = m.render();
    for kind in ErrorKind::ALL {
        let zero = format!(
                "sluice_store_errors_total{{kind=\"{kind}\",shard=\"10.0.0.1:6379\",store=\"redis\"}} 0\n"
            );
        assert!(text.contains(&zero), "{zero} in {text}");
    }
    report.store_error("redis", "10.0.0.1:6379", ErrorKind::ReadOnly);
    report.store_error("redis", "10.0.0.1:6379", ErrorKind::ReadOnly);
    report.store_error("redis", "10.0.0.1:6379", ErrorKind::Oom);
    let text = m.render();
    assert!(text.contains(
        r#"sluice_store_errors_total{kind="readonly",shard="10.0.0.1:6379",store="redis"} 2"#
    ));
    assert!(text.contains(
        r#"sluice_store_errors_total{kind="oom",shard="10.0.0.1:6379",store="redis"} 1"#
    ));
    assert!(text.contains(
        r#"sluice_store_errors_total{kind="connection",shard="10.0.0.1:6379",store="redis"} 0"#
    ));
}

#[test]
fn openmetrics_declares_counters_without_total_and_carries_exemplars() {
    let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total 3\n\
                # HELP b Odd counter.\n# TYPE b counter\nb 1\n\
                # HELP c Level.\n# TYPE c gauge\nc{x=\"y\"} 2\n\
                # HELP sluice_decision_seconds Time.\n# TYPE sluice_decision_seconds histogram\n\
                sluice_decision_seconds_bucket{le=\"0.00005\"} 1\n\
                sluice_decision_seconds_bucket{le=\"+Inf\"} 2\n\
                sluice_decision_seconds_sum 0.1\nsluice_decision_seconds_count 2\n";
    let exemplars = [
        None,
        Some(super::exemplar::Exemplar {
            trace_id: [0xab; 16],
            seconds: 0.09,
            at: 1700000000.5,
        }),
    ];
    let om = super::render::openmetrics(text, &exemplars);
    let want = "# HELP a Things.\n# TYPE a counter\na_total 3\n\
                # HELP b Odd counter.\n# TYPE b unknown\nb 1\n\
                # HELP c Level.\n# TYPE c gauge\nc{x=\"y\"} 2\n\
                # HELP sluice_decision_seconds Time.\n# TYPE sluice_decision_seconds histogram\n\
                sluice_decision_seconds_bucket{le=\"0.00005\"} 1\n\
                sluice_decision_seconds_bucket{le=\"+Inf\"} 2 # {trace_id=\"abababababababababababababababab\"} 0.09 1700000000.500\n\
                sluice_decision_seconds_sum 0.1\nsluice_decision_seconds_count 2\n# EOF\n";
    assert_eq!(om, want);
}

/// A stream of `key` starting (a charge of one slot) or ending (its refund).
async fn stream(l: &Limiter<MemoryStore>, m: &Metrics, key: &str, spend: Spend) -> Outcome {
    let entries = [("api_key", key)];
    let d = Descriptor {
        spend,
        ..Descriptor::new(&entries[..], 1)
    };
    let outcome = l.decide("d", &[d]).await;
    m.record("d", &outcome, Duration::from_micros(10));
    outcome
}

/// The value of the one series of `name` in `text`, if any.
fn gauge(text: &str, name: &str) -> Option<String> {
    let prefix = format!("{name}{{");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .map(|l| l.rsplit(' ').next().unwrap_or_default().to_string())
}

#[tokio::test]
async fn in_flight_shows_the_busiest_keys_slots_and_falls_after_the_window() {
    let policy = "domain: d
descriptors:
  - key: api_key
    rate_limit: {algorithm: concurrency, requests_per_unit: 4, lease: 5m}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
";
    let clock = ManualClock::new(T0);
    let l = crate::limiter::test_limiter(policy, &clock, Settings::default());
    let m = Metrics::with_clock(Arc::new(clock.clone())).with_peak_window(Duration::from_secs(10));
    let entries = [("plain", "x")];
    let o = l.decide("d", &[Descriptor::new(&entries[..], 1)]).await;
    m.record("d", &o, Duration::from_micros(10));
    assert_eq!(
        gauge(&m.render(), "sluice_in_flight"),
        None,
        "no concurrency rule decided"
    );

    for _ in 0..3 {
        stream(&l, &m, "k1", Spend::Always).await;
    }
    stream(&l, &m, "k2", Spend::Always).await;
    let text = m.render();
    assert!(
        text.contains(r#"sluice_in_flight{domain="d",rule="api_key"} 3"#),
        "the busiest key's slots, not the sum: {text}"
    );
    assert!(
        !text.contains(r#"sluice_in_flight{domain="d",rule="plain"}"#),
        "{text}"
    );

    // k1's streams end in the next window: their answers say 2, 1, 0 in use, and
    // the last window's 3 still shows.
    clock.advance(10 * SECOND);
    for _ in 0..3 {
        stream(&l, &m, "k1", Spend::Refund).await;
    }
    assert_eq!(gauge(&m.render(), "sluice_in_flight").as_deref(), Some("3"));
    // A window on, the highest of the last one: 2 (after k1's first end).
    clock.advance(10 * SECOND);
    assert_eq!(gauge(&m.render(), "sluice_in_flight").as_deref(), Some("2"));
    // Two windows without a decision: nothing in flight was reported.
    clock.advance(10 * SECOND);
    assert_eq!(gauge(&m.render(), "sluice_in_flight").as_deref(), Some("0"));

    // A refused start holds every slot (and is no debt: a slot, not a cost).
    for _ in 0..5 {
        stream(&l, &m, "k3", Spend::Always).await;
    }
    let text = m.render();
    assert_eq!(gauge(&text, "sluice_in_flight").as_deref(), Some("4"));
    assert_eq!(gauge(&text, "sluice_debt"), None, "{text}");
}

#[tokio::test]
async fn debt_shows_what_a_key_owes_after_its_charges() {
    let policy = "domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
";
    let clock = ManualClock::new(T0);
    let l = crate::limiter::test_limiter(policy, &clock, Settings::default());
    let m = Metrics::with_clock(Arc::new(clock.clone())).with_peak_window(Duration::from_secs(15));
    let charge = |key: &'static str, hits: u64| {
        let (l, m) = (&l, &m);
        async move {
            let entries = [("api_key", key)];
            let d = Descriptor {
                spend: Spend::Always,
                ..Descriptor::new(&entries[..], hits)
            };
            let o = l.decide("d", &[d]).await;
            m.record("d", &o, Duration::from_micros(10));
            o.over_limit
        }
    };
    assert!(!charge("k2", 4).await, "4 of 10 fit");
    assert_eq!(gauge(&m.render(), "sluice_debt"), None, "nothing owed yet");
    assert!(charge("k1", 25).await, "25 on 10 did not fit");
    assert_eq!(gauge(&m.render(), "sluice_debt").as_deref(), Some("15"));
    assert!(charge("k1", 25).await, "25 while owing did not fit");
    // The key owes both overshoots, not the larger charge.
    let text = m.render();
    assert_eq!(gauge(&text, "sluice_debt").as_deref(), Some("40"), "{text}");
    // Another key's smaller debt does not hide it: the gauge is the most one key owed.
    assert!(charge("k2", 7).await, "7 on 6 left did not fit");
    let text = m.render();
    assert_eq!(gauge(&text, "sluice_debt").as_deref(), Some("40"), "{text}");
    assert!(text.contains(r#"sluice_cost_total{domain="d",kind="over",rule="api_key"} 57"#));
    // The gauge reads the answers, not the counter: it falls two windows on without
    // a charge, while the minute's window still owes.
    clock.advance(30 * SECOND);
    assert_eq!(gauge(&m.render(), "sluice_debt").as_deref(), Some("0"));
}

/// Envoy sends at most 10^9 hits a charge, but a key's debt adds up over charges
/// (a bytes budget soon owes billions): the gauge shows it exactly, not 2^32 - 1.
#[tokio::test]
async fn debt_past_four_billion_hits_shows_exactly() {
    let policy = "domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: fixed_window}
";
    let clock = ManualClock::new(T0);
    let l = crate::limiter::test_limiter(policy, &clock, Settings::default());
    let m = Metrics::with_clock(Arc::new(clock.clone()));
    let entries = [("api_key", "k")];
    for _ in 0..5 {
        let d = Descriptor {
            spend: Spend::Always,
            ..Descriptor::new(&entries[..], 1_000_000_000)
        };
        let o = l.decide("d", &[d]).await;
        m.record("d", &o, Duration::from_micros(10));
    }
    let text = m.render();
    assert_eq!(
        gauge(&text, "sluice_debt").as_deref(),
        Some("4999999000"),
        "{text}"
    );
}

#[tokio::test]
async fn costs_past_the_largest_number_show_the_largest_number() {
    let policy = "domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 10}
";
    let clock = ManualClock::new(T0);
    let l = crate::limiter::test_limiter(policy, &clock, Settings::default());
    let m = Metrics::with_clock(Arc::new(clock.clone()));
    let entries = [("api_key", "k")];
    let d = Descriptor {
        spend: Spend::Always,
        ..Descriptor::new(&entries[..], crate::store::MAX_HITS)
    };
    let o = l.decide("d", &[d]).await;
    m.record("d", &o, Duration::from_micros(10));
    // Other threads' stripes near the top, as 2^14 such charges each leave them.
    let st = m.all_stats().remove(0);
    for stripe in st.counts.iter().skip(1).take(2) {
        stripe.cost[0].store(u64::MAX - 1, Ordering::Relaxed);
    }
    let text = m.render();
    let line = format!(
        r#"sluice_cost_total{{domain="d",kind="spent",rule="api_key"}} {}"#,
        u64::MAX
    );
    assert!(text.contains(&line), "{line} in {text}");
}

/// A decision made on the policy a reload then replaced, recorded after the reload
/// (it was in flight across it), does not bring back the series of a rule the new
/// policy removed: neither sluice's own nor envoyproxy/ratelimit's. A rule the new
/// policy keeps still counts it.
#[tokio::test]
async fn a_decision_in_flight_across_a_reload_does_not_bring_back_a_removed_rule() {
    const IP: &str =
        "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let both =
        format!("{IP}  - key: tenant\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n");
    let clock = ManualClock::new(T0);
    let old = crate::limiter::test_limiter(&both, &clock, Settings::default());
    let new = crate::limiter::test_limiter(IP, &clock, Settings::default());
    let m = Metrics::with_clock(Arc::new(clock.clone())).with_erl(0.8);
    m.policy_swapped(&old.policy());
    let ip = [("ip", "10.0.0.1")];
    let tenant = [("tenant", "acme")];
    let on_old_ip = old.decide("d", &[Descriptor::new(&ip[..], 1)]).await;
    let on_old_tenant = old.decide("d", &[Descriptor::new(&tenant[..], 1)]).await;
    // The reload: the new policy has no tenant; a decision on it is recorded first.
    m.policy_swapped(&new.policy());
    let on_new = new.decide("d", &[Descriptor::new(&ip[..], 1)]).await;
    m.record("d", &on_new, Duration::from_micros(10));
    assert!(!m.render().contains("tenant"));
    // Then the decisions that started on the old policy.
    m.record("d", &on_old_tenant, Duration::from_micros(10));
    m.record("d", &on_old_ip, Duration::from_micros(10));
    let text = m.render();
    assert!(!text.contains("tenant"), "{text}");
    assert!(
        text.contains(r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="ip",key2=""} 2"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"sluice_requests_total{domain="d",layer="service",outcome="ok",rule="ip"} 2"#
        ),
        "{text}"
    );
}

/// `--denied-requests-spend admitting-limits`: a request denied by one limit spends
/// its hits on the limits that admitted it, and `spent` counts them there, as it
/// counts what every counter spent; a request that spends nothing counts nothing.
#[tokio::test]
async fn hits_a_denied_request_spent_count_as_spent() {
    let policy = "domain: d
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
";
    for (spend, spent) in [
        (crate::limiter::DeniedSpend::AdmittingLimits, 3),
        (crate::limiter::DeniedSpend::Nothing, 1),
    ] {
        let clock = ManualClock::new(T0);
        let settings = Settings {
            denied_spend: spend,
            ..Settings::default()
        };
        let l = crate::limiter::test_limiter(policy, &clock, settings);
        let m = Metrics::with_clock(Arc::new(clock.clone()));
        let (ip, tenant) = ([("ip", "a")], [("tenant", "t")]);
        for _ in 0..3 {
            let both = [Descriptor::new(&ip[..], 1), Descriptor::new(&tenant[..], 1)];
            let o = l.decide("d", &both).await;
            m.record("d", &o, Duration::from_micros(10));
        }
        // What the tenant's counter holds: a check sees it.
        let o = l.decide("d", &[Descriptor::new(&tenant[..], 0)]).await;
        let left = o.statuses[0].verdict.expect("decided").remaining;
        assert_eq!(left, 10 - spent, "{spend:?}");
        let text = m.render();
        let line = format!(r#"sluice_cost_total{{domain="d",kind="spent",rule="tenant"}} {spent}"#);
        assert!(text.contains(&line), "{spend:?}: {line} in {text}");
    }
}
