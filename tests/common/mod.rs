//! Test harness: starts the real `sluice` binary on loopback ports and talks to it
//! through Envoy's own gRPC client stubs (from `envoy-types`) and plain HTTP.
#![allow(dead_code)]

pub mod certs;
pub mod contract;
pub mod otlp;
pub mod redis;
pub mod sentinel;
pub mod tls;
pub mod tools;
pub mod xds;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sluice::admin::pb::admin_client::AdminClient;
use sluice::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use sluice::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

/// The lines `child` writes to its (piped) stderr, read to the end by a thread of
/// their own, so a chatty child never blocks on a full pipe.
pub fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// `sluice serve` on the policy file `policy` and loopback ports the kernel picks,
/// not yet run: for tests of start-up and its refusals.
pub fn serve_command(policy: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("serve").arg("--config").arg(policy).args([
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    cmd
}

/// A running `sluice serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub grpc: String,
    pub http: String,
    /// The admin API's address, or `off`.
    pub admin: String,
    pub dir: tempfile::TempDir,
    /// Log lines printed before it listened (a store can log while it starts).
    pub startup: Vec<String>,
    /// Log lines printed since.
    pub lines: mpsc::Receiver<String>,
}

impl Server {
    /// The shard `name` as `/debug/store` shows it; panics when it is not listed.
    pub fn store_shard(&self, name: &str) -> serde_json::Value {
        let (status, body) = http(&self.http, "GET", "/debug/store", "");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        v["shards"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no shard {name} in {body}"))
    }

    /// Sends SIGTERM, as Kubernetes does to stop a pod.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid, no memory involved.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({signal}) failed");
    }

    /// Starts sluice with `policy` written to `policy.yaml` in a fresh directory.
    pub fn start(policy: &str, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("policy.yaml"), policy).expect("write policy");
        let path = dir.path().join("policy.yaml");
        Self::start_with(dir, &[path], extra)
    }

    pub fn start_with(dir: tempfile::TempDir, configs: &[PathBuf], extra: &[&str]) -> Server {
        Self::start_env(dir, configs, extra, &[])
    }

    /// As [`Server::start_with`], with extra environment variables.
    pub fn start_env(
        dir: tempfile::TempDir,
        configs: &[PathBuf],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        Self::spawn(Self::command(configs, extra, env), dir)
    }

    /// The `sluice serve` command [`Server::start_env`] runs, for a test that changes
    /// more of how it starts.
    pub fn command(configs: &[PathBuf], extra: &[&str], env: &[(&str, &str)]) -> Command {
        // SLUICE_TEST_BINARY runs another build (a release one, for measurements).
        let binary = std::env::var_os("SLUICE_TEST_BINARY")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_sluice").into());
        let mut cmd = Command::new(binary);
        // Under the whole suite's load a Redis call can pass the default 15 ms store
        // timeout and be answered by the failure mode, which a test counting exact
        // admissions would read as a wrong count. Tests of the timeout pass their own
        // (`--store-timeout` or this variable, both of which override this one).
        cmd.env("SLUICE_STORE_TIMEOUT", "2s");
        // Info unless a test asks for more.
        cmd.env("RUST_LOG", "info");
        cmd.envs(env.iter().copied());
        cmd.arg("serve")
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--admin-addr", "127.0.0.1:0"])
            .args(["--reload-interval", "100ms"]);
        for c in configs {
            cmd.arg("--config").arg(c);
        }
        cmd.args(extra);
        cmd
    }

    /// Runs `cmd` (a sluice, however started) and waits until it listens.
    pub fn spawn(mut cmd: Command, dir: tempfile::TempDir) -> Server {
        cmd.env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn sluice");
        let rx = stderr_lines(&mut child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut startup = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(l) => l,
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("sluice did not start listening");
                }
            };
            if line.contains("sluice listening") {
                let grpc = field(&line, "grpc=");
                let http = field(&line, "http=");
                let admin = field(&line, "admin=");
                return Server {
                    child,
                    grpc,
                    http,
                    admin,
                    dir,
                    startup,
                    lines: rx,
                };
            }
            startup.push(line);
        }
    }

    /// The `--prometheus-addr` address, as its start-up line logged it.
    pub fn prometheus_addr(&self) -> String {
        self.startup
            .iter()
            .find(|l| l.contains("metrics also served"))
            .and_then(|l| l.split("prometheus=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .expect("the --prometheus-addr address logged")
            .to_string()
    }

    pub fn policy_path(&self) -> PathBuf {
        self.dir.path().join("policy.yaml")
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        let url = format!("http://{}", self.grpc);
        RateLimitServiceClient::connect(url).await.expect("connect")
    }

    /// A client of the admin API, in plain text.
    pub async fn admin_client(&self) -> AdminClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.admin))
            .expect("a URL")
            .connect()
            .await
            .expect("connect to the admin port");
        AdminClient::new(channel)
    }

    /// An HTTP/2 connection to the gRPC port with h2's own client, for what tonic
    /// will not send, and the task driving it (it ends when the connection does).
    pub async fn h2(
        &self,
    ) -> (
        h2::client::SendRequest<bytes::Bytes>,
        tokio::task::JoinHandle<Result<(), h2::Error>>,
    ) {
        let tcp = tokio::net::TcpStream::connect(&self.grpc)
            .await
            .expect("connect to the gRPC port");
        let (h2, conn) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
        (h2, tokio::spawn(conn))
    }

    /// A POST of the gRPC method at `path` to the gRPC port, with a gRPC client's
    /// headers; more may be added.
    pub fn grpc_post(&self, path: &str) -> http::request::Builder {
        http::Request::post(format!("http://{}{path}", self.grpc))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
    }

    /// A client over TLS: trusting `ca`, presenting `identity` (cert, key) when given,
    /// and checking the server's certificate for `localhost`.
    pub async fn tls_client(
        &self,
        ca: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let read = |p: &Path| std::fs::read(p).expect("a certificate file");
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(ca)))
            .domain_name("localhost");
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(read(cert), read(key)));
        }
        let port = self.grpc.rsplit(':').next().expect("a port");
        let channel = Channel::from_shared(format!("https://localhost:{port}"))
            .expect("a URL")
            .tls_config(tls)?
            .connect()
            .await?;
        Ok(RateLimitServiceClient::new(channel))
    }

    /// Log lines printed so far.
    pub fn drain_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Reads log lines until one satisfies `found`; returns every line read, that one
    /// last. Panics naming `what` after `limit`.
    pub async fn wait_line(
        &self,
        limit: Duration,
        what: &str,
        found: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut read = Vec::new();
        loop {
            for line in self.lines.try_iter() {
                let done = found(&line);
                read.push(line);
                if done {
                    return read;
                }
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the log line: {what}; read: {read:#?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every line logged before this call, read to the end: appends a comment to the
    /// policy file, waits for the reload it causes to be logged, and returns the lines
    /// before that one. Lines come through one pipe in order, so nothing logged
    /// earlier can still be on its way, as it could after a fixed wait.
    pub async fn lines_until_reload(&self) -> Vec<String> {
        let path = self.policy_path();
        let mut text = std::fs::read_to_string(&path).expect("read policy");
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("# a comment: the file changed, the policy did not\n");
        write_atomic(&path, &text);
        let mut lines = self
            .wait_line(Duration::from_secs(10), "the policy reload", |l| {
                l.contains("policy reloaded from files")
            })
            .await;
        lines.pop();
        lines
    }

    /// The value of one sample of `/metrics` (see [`sample`]).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let (status, text) = http(&self.http, "GET", "/metrics", "");
        assert_eq!(status, 200, "{text}");
        sample(&text, name, labels)
    }

    /// The exit status, if the process has ended.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits until the process exits; panics if it is still running after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice still running {limit:?} later"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The value of the sample `name{labels}` in a Prometheus text exposition, with
/// exactly these labels in any order; `None` when there is no such sample.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    want.sort();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (n, mut have) = match series.split_once('{') {
                Some((n, rest)) => (n, parse_labels(rest.strip_suffix('}')?)?),
                None => (series, Vec::new()),
            };
            have.sort();
            (n == name && have == want).then(|| value.parse().ok())?
        })
}

/// `k="v",k2="v2"` (values with `\"` and `\\` escapes) as pairs.
fn parse_labels(mut s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => value.push(chars.next()?.1),
                (_, c) => value.push(c),
            }
        };
        out.push((key.to_string(), value));
        s = rest[end + 1..].trim_start_matches(',');
    }
    Some(out)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field(line: &str, name: &str) -> String {
    let start = line.find(name).expect("field") + name.len();
    line[start..]
        .split_whitespace()
        .next()
        .expect("value")
        .to_string()
}

/// Builds a descriptor from (key, value) pairs.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A descriptor with its own hits_addend.
pub fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(hits),
        ..desc(entries)
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

pub async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(req)
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

/// The requests per unit of the first status's limit; `None` when it has none.
pub fn first_limit(resp: &RateLimitResponse) -> Option<u32> {
    resp.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

pub fn header<'a>(resp: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    resp.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// Minimal HTTP/1.1 client over a TCP stream: (status, body).
pub fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    http_with(addr, method, path, &[], body)
}

/// [`http`] with extra request headers.
pub fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect http");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    let body = if out
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(&body)
    } else {
        body
    };
    (status, body)
}

fn dechunk(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(pos) = rest.find("\r\n") {
        let size = usize::from_str_radix(rest[..pos].trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = pos + 2;
        out.push_str(&rest[start..(start + size).min(rest.len())]);
        rest = rest.get(start + size + 2..).unwrap_or("");
    }
    out
}

/// Runs `attempt` until one run of it begins and ends in one `window` of the wall
/// clock (windows aligned to the Unix epoch, as sluice's fixed windows are, on this
/// clock or on Redis TIME on this machine), and returns what that run returned. A run
/// that a window's end cut in two counted in two windows and proves nothing: it is
/// thrown away and run again with the next number (0, 1, 2), for fresh keys where the
/// run can take them. So the run leaves its assertions on counts to the caller.
/// Panics after three runs.
pub async fn in_one_window<T>(window: Duration, mut attempt: impl AsyncFnMut(u32) -> T) -> T {
    let index = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        now.as_micros() / window.as_micros()
    };
    for n in 0..3 {
        let before = index();
        let out = attempt(n).await;
        if index() == before {
            return out;
        }
    }
    panic!("three runs each crossed the end of a window of {window:?}");
}

/// Sends `total` requests of one descriptor `(key, value)` in `domain` from `clients`
/// concurrent clients, spread over `servers` in turn; returns how many were admitted.
pub async fn admitted_across(
    servers: &[Server],
    clients: usize,
    total: usize,
    domain: &str,
    (key, value): (&str, &str),
) -> u32 {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = servers[c % servers.len()].client().await;
        let calls = total / clients + usize::from(c < total % clients);
        let req = request(domain, vec![desc(&[(key, value)])]);
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u32;
            for _ in 0..calls {
                if call(&mut client, req.clone()).await.overall_code == OK {
                    ok += 1;
                }
            }
            ok
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("client");
    }
    admitted
}

/// Waits until `f` holds, polling; panics with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Has `cmd`'s process start with at most `n` open files (RLIMIT_NOFILE), so that
/// a test can run it out of descriptors.
pub fn limit_open_files(cmd: &mut Command, n: u64) {
    limit_open_files_to(cmd, n, n);
}

/// Starts `cmd` with a soft open-file limit of `soft` under a hard one of `hard`.
pub fn limit_open_files_to(cmd: &mut Command, soft: u64, hard: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit(2) is async-signal-safe; nothing else runs in the child
    // between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: soft as libc::rlim_t,
                rlim_max: hard as libc::rlim_t,
            };
            match libc::setrlimit(libc::RLIMIT_NOFILE, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// Writes a file atomically (rename), as editors and ConfigMap updates do.
pub fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// Sends `bytes` one at a time, `gap` apart, reading meanwhile, until the server
/// closes the connection: what it sent, and when it closed. Panics if it is still
/// open after `limit`.
pub async fn trickle<S>(
    stream: S,
    bytes: &[u8],
    gap: Duration,
    limit: Duration,
) -> (String, Duration)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = std::time::Instant::now();
    let deadline = tokio::time::Instant::from_std(started + limit);
    let (mut read, mut write) = tokio::io::split(stream);
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let mut next = 0;
    let mut tick = tokio::time::interval(gap);
    loop {
        tokio::select! {
            got = read.read(&mut buf) => match got {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            _ = tick.tick(), if next < bytes.len() => {
                if write.write_all(&bytes[next..next + 1]).await.is_err() {
                    next = bytes.len();
                }
                next += 1;
            }
            _ = tokio::time::sleep_until(deadline) => {
                panic!(
                    "still open after {limit:?}, {next} bytes sent: {}",
                    String::from_utf8_lossy(&answer)
                )
            }
        }
    }
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}
