//! `sluice-bench load`: send a scenario's requests and report throughput, latency
//! percentiles and outcomes.
//!
//! Two ways to send:
//! - closed loop (default): `--concurrency` workers, each sends its next request as
//!   soon as the previous answer arrives. Measures the most a service can do.
//! - fixed rate (`--rate N`): requests are scheduled at N per second from the start,
//!   whatever the service does. Latency is measured from each request's *intended* send
//!   time, so a stall of the service counts against every request that should have
//!   been sent during it (no coordinated omission). `--concurrency` is then the most
//!   requests in flight; when all are busy, due requests queue in the generator and
//!   their wait counts.
//!
//! Every run is bounded: `--warmup` plus `--duration`, or `--requests` measured
//! requests, whichever ends first, then at most `--drain` for answers in flight.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use rand::SeedableRng;
use tokio::sync::{Notify, Semaphore};

use crate::client::{self, Client};
use crate::codec::OVER_LIMIT;
use crate::workload::{Class, Scenario, Spec, Workload};

#[derive(Parser, Clone, Debug)]
pub struct Load {
    /// The service's gRPC address (host:port).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub addr: String,
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// Descriptor entry key the hot, check, charge, uniform, zipf and attack scenarios
    /// send.
    #[arg(long, default_value = "client")]
    pub key: String,
    #[arg(long, value_enum, default_value_t = Scenario::Hot)]
    pub scenario: Scenario,
    /// Distinct values (keys) for uniform, zipf, attack (normal traffic) and layered.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Zipf exponent for `--scenario zipf`: higher is more skewed.
    #[arg(long, default_value_t = 1.1)]
    pub zipf_s: f64,
    /// Share of requests (0..1) on the one attacker key in `--scenario attack`.
    #[arg(long, default_value_t = 0.1)]
    pub attack_share: f64,
    /// Take keys in order 0, 1, 2, ... instead of at random (to fill a store).
    #[arg(long)]
    pub sequential: bool,
    /// Number of the first key, for the uniform, zipf and attack scenarios: keys are
    /// `k{first-key}` onwards, so consecutive runs can send only new keys.
    #[arg(long, default_value_t = 0)]
    pub first_key: u64,
    /// What each request of `--scenario charge` costs (its descriptor's hits_addend),
    /// as Envoy reports a response's tokens at stream end.
    #[arg(long, default_value_t = 8)]
    pub cost: u64,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// HTTP/2 client: `h2` (lean) or `tonic` (its `Channel`, for comparison).
    #[arg(long, value_enum, default_value_t = client::Kind::H2)]
    pub client: client::Kind,
    /// Requests in flight at once, spread over the connections. With `--rate`, the
    /// most in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Fixed rate, requests per second (open loop). 0: closed loop.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// How long to measure, after the warm-up.
    #[arg(long, default_value = "10s", value_parser = sluice::config::parse_duration)]
    pub duration: Duration,
    /// Load sent before measuring (connections, caches, JIT-free but still warm).
    #[arg(long, default_value = "1s", value_parser = sluice::config::parse_duration)]
    pub warmup: Duration,
    /// Stop after this many measured requests (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub requests: u64,
    /// Longest wait for answers in flight at the end.
    #[arg(long, default_value = "5s", value_parser = sluice::config::parse_duration)]
    pub drain: Duration,
    /// Runtime worker threads of the generator (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Name of the service under test, for reports (`ceiling` is the reference for
    /// ratios in `sluice-bench report`).
    #[arg(long, default_value = "")]
    pub target: String,
    /// A free-form label printed with the results.
    #[arg(long, default_value = "")]
    pub label: String,
    /// Print one JSON line instead of text.
    #[arg(long)]
    pub json: bool,
}

const MEASURING: u8 = 1;
const STOPPED: u8 = 2;

/// What the workers of one connection saw while measuring.
struct Stats {
    /// Closed loop: send to answer. Fixed rate: intended send time to answer.
    latency: Histogram<u64>,
    /// Fixed rate only: actual send to answer (the service's share of the latency).
    service: Histogram<u64>,
    /// `[class][outcome]`, outcome 0 ok, 1 over limit, 2 error.
    counts: [[u64; 3]; 2],
}

impl Stats {
    fn new() -> Stats {
        Stats {
            latency: histogram(),
            service: histogram(),
            counts: [[0; 3]; 2],
        }
    }

    fn add(&mut self, other: &Stats) {
        let _ = self.latency.add(&other.latency);
        let _ = self.service.add(&other.service);
        for c in 0..2 {
            for o in 0..3 {
                self.counts[c][o] += other.counts[c][o];
            }
        }
    }
}

/// Microseconds, 1 us to 60 s, 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, 60_000_000)
}

struct Shared {
    workload: Workload,
    phase: AtomicU8,
    /// Measured requests sent and answered, counted only with `--requests`.
    claimed: AtomicU64,
    completed: AtomicU64,
    limit: u64,
    done: Notify,
    first_error: std::sync::Mutex<Option<String>>,
}

impl Shared {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Relaxed)
    }

    /// Before sending: whether this request is measured. With `--requests N`, only the
    /// first N requests sent while measuring are (and none is sent after them: `None`
    /// tells the worker to stop), so exactly N measured requests reach the service.
    fn before_send(&self, phase: u8) -> Option<bool> {
        if phase != MEASURING {
            return Some(false);
        }
        if self.limit == 0 {
            return Some(true);
        }
        (self.claimed.fetch_add(1, Ordering::Relaxed) < self.limit).then_some(true)
    }

    /// After the answer: whether to record it. Without `--requests`, a request is
    /// recorded only if measuring is still on (the span is the duration); with it,
    /// every claimed request is, and the last answer ends the run.
    fn after_answer(&self, measured: bool) -> bool {
        if !measured {
            return false;
        }
        if self.limit == 0 {
            return self.phase() == MEASURING;
        }
        if self.completed.fetch_add(1, Ordering::Relaxed) + 1 == self.limit {
            self.phase.store(STOPPED, Ordering::Relaxed);
            self.done.notify_one();
        }
        true
    }

    fn error(&self, e: &tonic::Status) {
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(format!("{:?}: {}", e.code(), e.message()));
        }
    }

    fn outcome(&self, stats: &mut Stats, class: Class, res: &Result<i32, tonic::Status>) {
        let o = match res {
            Ok(code) if *code == OVER_LIMIT => 1,
            Ok(_) => 0,
            Err(e) => {
                self.error(e);
                2
            }
        };
        stats.counts[class as usize][o] += 1;
    }
}

/// The fixed-rate schedule: request `i` is due at `start + i / rate`.
struct Schedule {
    start: Instant,
    rate: f64,
    /// Requests released to the workers so far.
    permits: Semaphore,
    /// Next request index a worker takes.
    taken: AtomicU64,
}

impl Schedule {
    fn due(&self, i: u64) -> Instant {
        self.start + Duration::from_secs_f64(i as f64 / self.rate)
    }
}

/// Runs the load and prints the result.
pub async fn run(load: Load) -> anyhow::Result<()> {
    anyhow::ensure!(
        load.rate >= 0.0 && load.rate.is_finite(),
        "--rate must be >= 0"
    );
    anyhow::ensure!(!load.duration.is_zero(), "--duration must be > 0");
    let workload = Workload::new(Spec {
        scenario: load.scenario,
        domain: load.domain.clone(),
        key: load.key.clone(),
        keys: load.keys,
        zipf_s: load.zipf_s,
        attack_share: load.attack_share,
        sequential: load.sequential,
        first_key: load.first_key,
        cost: load.cost,
    })?;

    let mut connections = Vec::new();
    for _ in 0..load.connections.max(1) {
        connections.push(Client::connect(load.client, &load.addr).await?);
    }

    let shared = Arc::new(Shared {
        workload,
        phase: AtomicU8::new(if load.warmup.is_zero() { MEASURING } else { 0 }),
        claimed: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        limit: load.requests,
        done: Notify::new(),
        first_error: std::sync::Mutex::new(None),
    });
    let open = load.rate > 0.0;
    let schedule = Arc::new(Schedule {
        start: Instant::now(),
        rate: load.rate.max(1e-9),
        permits: Semaphore::new(0),
        taken: AtomicU64::new(0),
    });

    // The workers of one connection share one task: when one read brings several
    // answers, one wake lets their workers record them and send the next requests,
    // which the connection then writes together. (A task per worker cost a wake per
    // answer, often across threads.) They also share one `Stats`, recorded into as
    // each answer comes: a histogram is some 140 KB, and one per worker (hundreds)
    // made every record a cache miss. Its lock is never contended (one task).
    let finished = Arc::new(AtomicU64::new(0));
    let workers = load.concurrency.max(1);
    let mut tasks = Vec::new();
    let mut all_stats = Vec::new();
    for (c, client) in connections.iter().enumerate() {
        let stats = Arc::new(std::sync::Mutex::new(Stats::new()));
        all_stats.push(stats.clone());
        let group: Vec<_> = (c..workers)
            .step_by(connections.len())
            .map(|i| {
                let (client, shared, finished) = (client.clone(), shared.clone(), finished.clone());
                let (schedule, stats) = (schedule.clone(), stats.clone());
                let seed = i as u64;
                async move {
                    if open {
                        fixed_rate_worker(client, shared, schedule, &stats, seed).await
                    } else {
                        closed_loop_worker(client, shared, &stats, seed).await
                    };
                    finished.fetch_add(1, Ordering::Relaxed);
                }
            })
            .collect();
        tasks.push(tokio::spawn(futures::future::join_all(group)));
    }
    let pacer_stop = Arc::new(AtomicBool::new(false));
    let pacer = open.then(|| {
        let (schedule, stop) = (schedule.clone(), pacer_stop.clone());
        std::thread::Builder::new()
            .name("pacer".into())
            .spawn(move || pace(&schedule, &stop))
            .expect("spawn pacer thread")
    });

    tokio::time::sleep(load.warmup).await;
    let _ = shared
        .phase
        .compare_exchange(0, MEASURING, Ordering::Relaxed, Ordering::Relaxed);
    let started = Instant::now();
    let cpu_at_start = own_cpu();
    let released_at_start = schedule.taken.load(Ordering::Relaxed);
    tokio::select! {
        _ = tokio::time::sleep(load.duration) => {}
        _ = shared.done.notified() => {}
    }
    shared.phase.store(STOPPED, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let cpu = own_cpu().zip(cpu_at_start).map(|(end, start)| end - start);
    pacer_stop.store(true, Ordering::Relaxed);
    if let Some(p) = pacer {
        let _ = p.join();
    }
    // Requests due by now that no worker had taken yet: the service fell behind. (Not
    // the permits left: the pacer releases a little ahead of time.)
    let behind = if open {
        let due = (schedule.start.elapsed().as_secs_f64() * schedule.rate).floor() as u64 + 1;
        due.saturating_sub(schedule.taken.load(Ordering::Relaxed))
    } else {
        0
    };
    let scheduled = schedule.taken.load(Ordering::Relaxed) - released_at_start;
    schedule.permits.close();

    let deadline = tokio::time::Instant::now() + load.drain;
    for t in tasks {
        let _ = tokio::time::timeout_at(deadline, t).await;
    }
    let mut total = Stats::new();
    for stats in &all_stats {
        total.add(&stats.lock().unwrap_or_else(|p| p.into_inner()));
    }
    let unfinished = workers - finished.load(Ordering::Relaxed) as usize;

    let first_error = shared
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    report(
        &load,
        &total,
        elapsed,
        Extra {
            cpu,
            behind,
            scheduled,
            unfinished,
            first_error,
        },
    );
    Ok(())
}

struct Extra {
    /// The generator's own CPU time over the measured phase (Linux only).
    cpu: Option<Duration>,
    behind: u64,
    scheduled: u64,
    unfinished: usize,
    first_error: Option<String>,
}

/// Locks a connection's stats (never contended: its workers share one task).
fn lock(stats: &std::sync::Mutex<Stats>) -> std::sync::MutexGuard<'_, Stats> {
    stats.lock().unwrap_or_else(|p| p.into_inner())
}

async fn closed_loop_worker(
    mut client: Client,
    shared: Arc<Shared>,
    stats: &std::sync::Mutex<Stats>,
    seed: u64,
) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(rand::random::<u64>() ^ seed);
    loop {
        let phase = shared.phase();
        if phase == STOPPED {
            break;
        }
        let Some(measured) = shared.before_send(phase) else {
            break;
        };
        let (body, class) = shared.workload.pick(&mut rng);
        let sent = Instant::now();
        let res = client.call(body).await;
        let took = sent.elapsed();
        let failed = res.is_err();
        if shared.after_answer(measured) {
            let stats = &mut *lock(stats);
            let _ = stats.latency.record(micros(took));
            shared.outcome(stats, class, &res);
        }
        if failed {
            // A closed connection fails every call at once, without waiting: without
            // a yield this loop would never let the timer that ends the run fire.
            tokio::task::yield_now().await;
        }
    }
}

async fn fixed_rate_worker(
    mut client: Client,
    shared: Arc<Shared>,
    schedule: Arc<Schedule>,
    stats: &std::sync::Mutex<Stats>,
    seed: u64,
) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(rand::random::<u64>() ^ seed);
    loop {
        match schedule.permits.acquire().await {
            Ok(p) => p.forget(),
            Err(_) => break,
        }
        let phase = shared.phase();
        if phase == STOPPED {
            break;
        }
        let Some(measured) = shared.before_send(phase) else {
            break;
        };
        let i = schedule.taken.fetch_add(1, Ordering::Relaxed);
        let due = schedule.due(i);
        let (body, class) = shared.workload.pick(&mut rng);
        let sent = Instant::now();
        let res = client.call(body).await;
        let done = Instant::now();
        let failed = res.is_err();
        if shared.after_answer(measured) {
            // From the due time, or from the send when released early (see LEAD).
            let stats = &mut *lock(stats);
            let _ = stats.latency.record(micros(done - due.min(sent)));
            let _ = stats.service.record(micros(done - sent));
            shared.outcome(stats, class, &res);
        }
        if failed {
            // As in the closed loop: a permit ready at once and a call failing at once
            // must not keep the run's timer from firing.
            tokio::task::yield_now().await;
        }
    }
}

/// How far ahead of its due time the pacer releases a request: about the time the
/// sleeping pacer and then a parked worker take to wake up, so that the request leaves
/// on time rather than that much late.
const LEAD: Duration = Duration::from_micros(100);

/// Releases requests as they fall due, from a plain thread: the runtime's timer ticks
/// in milliseconds, far coarser than the gaps between requests at high rates, while a
/// thread's sleep wakes within tens of microseconds. Requests are released [`LEAD`]
/// early, and a worker that gets one early measures from when it actually sends it;
/// any wake-up delay beyond the lead is charged to the requests it delays, as it
/// should be.
fn pace(schedule: &Schedule, stop: &AtomicBool) {
    let mut released: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now() + LEAD;
        let elapsed = now.saturating_duration_since(schedule.start).as_secs_f64();
        // Request i is due at i / rate: those with i <= elapsed * rate are due by now.
        let due = (elapsed * schedule.rate).floor() as u64 + 1;
        if due > released {
            schedule.permits.add_permits((due - released) as usize);
            released = due;
        }
        let next = schedule.due(released);
        let wait = next
            .saturating_duration_since(Instant::now() + LEAD)
            .min(Duration::from_millis(50));
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

/// This process's CPU time so far (user + system), from /proc; `None` elsewhere.
fn own_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ').skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(Duration::from_millis((user + system) * 10))
}

fn quantile(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(q)
    }
}

fn report(load: &Load, s: &Stats, elapsed: Duration, extra: Extra) {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let sum = |c: usize| s.counts[c].iter().sum::<u64>();
    let done = sum(0) + sum(1);
    let rps = done as f64 / secs;
    let h = &s.latency;
    let (p50, p90, p99, p999, max) = (
        quantile(h, 0.5),
        quantile(h, 0.9),
        quantile(h, 0.99),
        quantile(h, 0.999),
        h.max(),
    );
    let [[ok, over, errors], [a_ok, a_over, a_err]] = s.counts;
    let mode = if load.rate > 0.0 { "rate" } else { "closed" };
    let scenario = load.scenario.name();
    if load.json {
        let mut j = serde_json::json!({
            "target": load.target, "label": load.label, "scenario": scenario, "mode": mode,
            "rate": load.rate, "connections": load.connections, "client": load.client.name(),
            "concurrency": load.concurrency, "seconds": secs,
            "rps": rps.round(), "requests": done,
            "p50_us": p50, "p90_us": p90, "p99_us": p99, "p999_us": p999, "max_us": max,
            "ok": ok + a_ok, "over_limit": over + a_over, "errors": errors + a_err,
        });
        if load.scenario == Scenario::Attack {
            j["normal"] = serde_json::json!({"ok": ok, "over_limit": over, "errors": errors});
            j["attacker"] = serde_json::json!({"ok": a_ok, "over_limit": a_over,
                "errors": a_err, "admitted_per_s": (a_ok as f64 / secs).round()});
        }
        if load.rate > 0.0 {
            j["service_p50_us"] = quantile(&s.service, 0.5).into();
            j["service_p99_us"] = quantile(&s.service, 0.99).into();
            j["scheduled"] = extra.scheduled.into();
            j["behind"] = extra.behind.into();
        }
        if extra.unfinished > 0 {
            j["unfinished_workers"] = extra.unfinished.into();
        }
        if let Some(cpu) = extra.cpu.filter(|_| done > 0) {
            j["generator_cpu_us"] = (cpu.as_secs_f64() * 1e6 / done as f64).into();
        }
        if let Some(e) = &extra.first_error {
            j["first_error"] = e.clone().into();
        }
        println!("{j}");
    } else {
        let name = match (load.target.as_str(), load.label.as_str()) {
            ("", "") => scenario.to_string(),
            ("", l) => l.to_string(),
            (t, "") => format!("{t}/{scenario}"),
            (t, l) => format!("{t}/{l}"),
        };
        println!(
            "{name:<28} {mode:>6} {rps:>9.0} req/s  p50 {p50:>6} us  p90 {p90:>6}  p99 {p99:>6}  \
             p99.9 {p999:>6}  max {max:>7} us  ok {} over {} errors {}",
            ok + a_ok,
            over + a_over,
            errors + a_err
        );
        if load.scenario == Scenario::Attack {
            println!(
                "{:<28} normal ok {ok} over {over} errors {errors} | attacker ok {a_ok} \
                 ({:.0}/s admitted) over {a_over} errors {a_err}",
                "",
                a_ok as f64 / secs
            );
        }
        if load.rate > 0.0 {
            println!(
                "{:<28} rate {:.0}/s: service p50 {} us p99 {} us (from actual send); \
                 scheduled {} behind {}",
                "",
                load.rate,
                quantile(&s.service, 0.5),
                quantile(&s.service, 0.99),
                extra.scheduled,
                extra.behind
            );
        }
    }
    if extra.unfinished > 0 {
        eprintln!(
            "warning: {} workers still waiting for answers after --drain",
            extra.unfinished
        );
    }
    if let Some(e) = extra.first_error {
        eprintln!("warning: {} errors; first: {e}", errors + a_err);
    }
}
