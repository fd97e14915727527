//! The benchmark tooling works end to end: its policies load, and the load generator
//! drives a server in every mode and reports sane numbers. Timing is not tested.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    rate_limit_response::Code, RateLimitRequest, RateLimitResponse,
};

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines `child` writes to its (piped) stderr, read by a thread of their own so
/// a chatty child never blocks on a full pipe.
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// The workspace's root, where the benchmark policies live.
fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The `sluice` binary of this build: it belongs to another package of the
/// workspace, so Cargo does not name it here; it sits beside this package's
/// binary and is built with the same profile when missing.
fn sluice_bin() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_sluice-bench"));
    let bin = bench.with_file_name("sluice");
    if !bin.exists() {
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "-p", "sluice", "--bin", "sluice"]);
        if bench.parent().and_then(|p| p.file_name()) == Some("release".as_ref()) {
            build.arg("--release");
        }
        let status = build.current_dir(root()).status().unwrap();
        assert!(status.success(), "cargo build -p sluice failed");
    }
    bin
}

/// Spawns a server told to listen on port 0 and returns it with the port it reports
/// on stderr (`port` picks it out of a line), once it is listening. The kernel picks
/// the port at bind time, so no other process can take it between choosing and
/// binding, as it could with a port chosen by the test.
fn listening(mut cmd: Command, port: fn(&str) -> Option<u16>) -> (Kill, u16) {
    let mut child = Kill(cmd.stderr(Stdio::piped()).spawn().unwrap());
    let rx = stderr_lines(&mut child.0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => match port(&line) {
                Some(p) => return (child, p),
                None => seen.push(line),
            },
            Err(_) => panic!("{cmd:?} did not report listening: {seen:?}"),
        }
    }
}

/// The port of `host:port` following `marker` in `line`.
fn port_after(line: &str, marker: &str) -> Option<u16> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let addr = rest.split_whitespace().next()?;
    addr.rsplit(':').next()?.parse().ok()
}

/// The do-nothing server, listening; its port.
fn noop() -> (Kill, u16) {
    noop_with(&[])
}

fn noop_with(args: &[&str]) -> (Kill, u16) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice-bench"));
    cmd.args(["noop", "--addr", "127.0.0.1:0"]).args(args);
    listening(cmd, |line| port_after(line, "RateLimitService on "))
}

/// A RateLimitService in this process that always answers OK and counts the calls
/// it has answered.
struct Counting(Arc<AtomicU64>);

#[tonic::async_trait]
impl RateLimitService for Counting {
    async fn should_rate_limit(
        &self,
        _req: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        self.0.fetch_add(1, Relaxed);
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

/// Serves [`Counting`] on a runtime of its own, whose drop ends it: the listener and
/// every connection close at once, as a killed server's do. Its port and count.
fn counting() -> (tokio::runtime::Runtime, u16, Arc<AtomicU64>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let answered = Arc::new(AtomicU64::new(0));
    let incoming = rt
        .block_on(async {
            tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap())
        })
        .unwrap();
    let port = incoming.local_addr().unwrap().port();
    let service = RateLimitServiceServer::new(Counting(answered.clone()));
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    (rt, port, answered)
}

fn load(port: u16, args: &[&str]) -> serde_json::Value {
    // A run of `--requests N` ends at its count; its duration is only a bound, wide
    // enough for a debug build on a slow machine (20,000 calls took 5 s on one).
    let duration = if args.contains(&"--requests") {
        "60s"
    } else {
        "3s"
    };
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["load", "--addr", &format!("127.0.0.1:{port}"), "--json"])
        .args(["--warmup", "0s", "--duration", duration])
        .args(if args.contains(&"--concurrency") {
            &[][..]
        } else {
            &["--concurrency", "4"][..]
        })
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn load_generator_drives_sluice_in_every_scenario() {
    let (_sluice, grpc) = sluice_memory();
    for scenario in ["hot", "uniform", "zipf", "layered"] {
        let r = load(grpc, &["--scenario", scenario, "--requests", "200"]);
        assert_eq!(r["scenario"], scenario);
        assert_eq!(r["requests"], 200, "{r}");
        assert_eq!(r["ok"], 200, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["p50_us"].as_u64().unwrap() > 0, "{r}");
    }
    // The attacker key is limited to 100/s: most of its 60 % share is denied, while
    // normal keys (well under their limit) never are.
    let r = load(
        grpc,
        &[
            "--scenario",
            "attack",
            "--key",
            "user",
            "--attack-share",
            "0.6",
            "--requests",
            "1000",
        ],
    );
    assert_eq!(r["normal"]["over_limit"], 0, "{r}");
    assert!(r["attacker"]["over_limit"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");

    // Envoy's check and charge, as sluice tells them apart: on a key far from its
    // limit both are admitted; on `user` (100/s) charges of 8 are spent past the
    // limit, so the checks that follow are refused while the key owes.
    for scenario in ["check", "charge"] {
        let r = load(
            grpc,
            &[
                "--scenario",
                scenario,
                "--key",
                "api_key",
                "--requests",
                "200",
            ],
        );
        assert_eq!(r["scenario"], scenario);
        assert_eq!(
            (r["ok"].as_u64(), r["errors"].as_u64()),
            (Some(200), Some(0)),
            "{r}"
        );
    }
    let r = load(
        grpc,
        &[
            "--scenario",
            "charge",
            "--key",
            "user",
            "--cost",
            "8",
            "--requests",
            "100",
        ],
    );
    assert_eq!(r["errors"], 0, "{r}");
    assert!(r["over_limit"].as_u64().unwrap() > 0, "{r}");
    let r = load(
        grpc,
        &["--scenario", "check", "--key", "user", "--requests", "20"],
    );
    assert_eq!(
        (r["over_limit"].as_u64(), r["errors"].as_u64()),
        (Some(20), Some(0)),
        "{r}"
    );

    // A request sluice refuses (INVALID_ARGUMENT, in a trailers-only response) counts
    // as an error and its message is reported, with either client.
    for client in ["h2", "tonic"] {
        let r = load(
            grpc,
            &["--client", client, "--domain", "", "--requests", "50"],
        );
        assert_eq!(
            (r["errors"].as_u64(), r["ok"].as_u64()),
            (Some(50), Some(0)),
            "{r}"
        );
        assert_eq!(
            r["first_error"], "InvalidArgument: domain must not be empty",
            "{r}"
        );
    }
    // The tonic client, kept for comparison, still counts outcomes.
    let r = load(grpc, &["--client", "tonic", "--requests", "200"]);
    assert_eq!(
        (r["client"].as_str(), r["ok"].as_u64()),
        (Some("tonic"), Some(200)),
        "{r}"
    );
}

/// Far more calls in flight than a server takes streams per connection (200 for
/// sluice), from the first instant: the generator waits for room instead of failing
/// calls. Before, calls sent ahead of the server's SETTINGS were refused and counted
/// as errors, and late-read answers could exhaust h2's budget for small DATA frames,
/// which closed the connection ("too_many_data_frames").
#[test]
fn many_calls_in_flight_on_two_connections_all_succeed() {
    let (_sluice, grpc) = sluice_memory();
    for _ in 0..3 {
        let r = load(
            grpc,
            &[
                "--connections",
                "2",
                "--concurrency",
                "1024",
                "--requests",
                "20000",
            ],
        );
        assert_eq!(
            (r["ok"].as_u64(), r["errors"].as_u64()),
            (Some(20000), Some(0)),
            "{r}"
        );
    }
}

/// sluice with the benchmark policy and counters in memory, listening; its gRPC port.
fn sluice_memory() -> (Kill, u16) {
    let mut cmd = Command::new(sluice_bin());
    cmd.arg("serve")
        .arg("--config")
        .arg(root().join("benches/policy.yaml"))
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1");
    listening(cmd, |line| {
        line.contains("sluice listening")
            .then(|| port_after(line, "grpc="))
            .flatten()
    })
}

/// Threads of process `pid` whose name starts with `prefix` (Linux /proc).
fn threads_named(pid: u32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|name| name.starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

/// The ceiling takes `--worker-threads` as `sluice serve` does, so a benchmark can run
/// both with the same number of workers.
#[test]
fn the_ceiling_runs_with_the_worker_threads_it_is_given() {
    for (workers, expected) in [("1", 1), ("3", 3)] {
        let (server, port) = noop_with(&["--worker-threads", workers]);
        let r = load(port, &["--requests", "100"]);
        assert_eq!(r["ok"], 100, "{r}");
        assert_eq!(
            threads_named(server.0.id(), "tokio-rt-worker"),
            expected,
            "--worker-threads {workers}"
        );
    }
}

#[test]
fn fixed_rate_mode_keeps_its_schedule_against_the_ceiling() {
    let (_noop, port) = noop();
    let r = load(port, &["--scenario", "uniform", "--rate", "200"]);
    assert_eq!(r["mode"], "rate");
    assert_eq!(r["errors"], 0, "{r}");
    let done = r["requests"].as_u64().unwrap();
    // 3 s at 200/s; a loaded machine may run a little behind. Never ahead: at most
    // what the schedule released over the measured time (which a loaded machine
    // stretches past 3 s), and the requests in flight when it began.
    let seconds = r["seconds"].as_f64().unwrap();
    let in_flight = r["concurrency"].as_u64().unwrap();
    let most = (200.0 * seconds).ceil() as u64 + in_flight + 1;
    assert!((300..=most).contains(&done), "{r}");
    assert!(r["service_p50_us"].as_u64().unwrap() <= r["p99_us"].as_u64().unwrap());
}

#[test]
fn a_run_ends_on_time_when_its_server_goes_away() {
    // The server dies early in a 3 s run: every call then fails at once, and the
    // generator must still stop at the end of its duration and report the errors
    // (it used to spin forever on one thread).
    for threads in ["1", "2"] {
        let (server, port, answered) = counting();
        let mut gen = Kill(
            Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
                .args(["load", "--addr", &format!("127.0.0.1:{port}"), "--json"])
                .args(["--warmup", "0s", "--duration", "3s", "--threads", threads])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        // Stop the server once the generator has had answers (its start can take
        // more than a second on a busy machine), not after a fixed time. Its 64
        // workers each wait for an answer before the next call, so of 500 calls
        // answered here, more than 400 answers have reached it.
        let deadline = Instant::now() + Duration::from_secs(20);
        while answered.load(Relaxed) < 500 {
            if let Some(status) = gen.0.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(gen.0.stderr.as_mut().unwrap(), &mut err).unwrap();
                panic!(
                    "{threads} thread(s): the generator ended ({status}) before 500 answers: {err}"
                );
            }
            assert!(
                Instant::now() < deadline,
                "{threads} thread(s): {} answers in 20 s",
                answered.load(Relaxed)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(server);
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = gen.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{threads} thread(s): the generator is still running 29 s after its run's end"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(gen.0.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(status.success(), "{threads} thread(s): {status}: {err}");
        let mut out = String::new();
        std::io::Read::read_to_string(gen.0.stdout.as_mut().unwrap(), &mut out).unwrap();
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert!(r["ok"].as_u64().unwrap() > 0, "{r}");
        assert!(r["errors"].as_u64().unwrap() > 0, "{r}");
    }
}
