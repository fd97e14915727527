//! Real `redis-server` processes for the Redis store's tests: each on a free loopback
//! port, in its own temporary directory, with persistence off, killed on drop.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether `redis-server` can be run. Tests that need it return early, loudly, when
/// it cannot (scripts/test.sh installs it).
pub fn available() -> bool {
    runs("redis-server")
}

/// Whether `binary` (of the Debian package of that name) can be run; loud when not.
pub fn runs(binary: &str) -> bool {
    let ok = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        // scripts/test.sh installs redis-server and redis-sentinel and sets this: a skip
        // there is a failure.
        assert!(
            std::env::var_os("SLUICE_REQUIRE_REDIS").is_none(),
            "SLUICE_REQUIRE_REDIS is set but {binary} cannot be run"
        );
        eprintln!(
            "\n*** SKIPPED: {binary} is not on PATH; install it (apt-get install {binary}) \
             or run scripts/test.sh ***\n"
        );
    }
    ok
}

/// A free loopback port whose cluster bus port (port + 10000) is free too, never
/// handed out before by this process (tests run in parallel threads, and the kernel
/// may give a just-released port to the next bind). Bound then released, so another
/// process may still take it first: [`RedisServer`] checks that the server answering
/// on it is its own.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..200 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        if port < 55_000
            && !given.contains(&port)
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            given.push(port);
            return port;
        }
    }
    panic!("no free port pair");
}

/// A running redis-server.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    extra: Vec<String>,
    /// Serves TLS only (on `port`).
    tls: bool,
    /// Processes started so far; each logs to a file of its own.
    spawns: u32,
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        Self::start_with(&[]).await
    }

    /// A fresh server; `None` (after [`available`]'s loud message) when redis-server
    /// cannot be run.
    pub async fn if_available() -> Option<RedisServer> {
        if !available() {
            return None;
        }
        Some(Self::start().await)
    }

    /// Starts with extra `redis-server` arguments (e.g. `--requirepass x`).
    pub async fn start_with(extra: &[&str]) -> RedisServer {
        let mut s = RedisServer {
            child: None,
            port: 0,
            dir: tempfile::tempdir().expect("tempdir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls: false,
            spawns: 0,
        };
        s.spawn_on_free_port().await;
        s
    }

    /// Spawns on a fresh free port, again on another if someone else took it first.
    async fn spawn_on_free_port(&mut self) {
        for _ in 0..5 {
            self.port = free_port();
            if self.spawn().await {
                return;
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// Starts a TLS-only server with a fresh CA and a certificate for localhost and
    /// 127.0.0.1; the CA is `ca.crt` in [`RedisServer::dir`].
    pub async fn start_tls() -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        tls_certificates(dir.path());
        let d = dir.path();
        let path = |f: &str| d.join(f).to_string_lossy().into_owned();
        let mut s = RedisServer {
            child: None,
            port: 0,
            extra: vec![
                "--tls-cert-file".into(),
                path("server.crt"),
                "--tls-key-file".into(),
                path("server.key"),
                "--tls-ca-cert-file".into(),
                path("ca.crt"),
                "--tls-auth-clients".into(),
                "no".into(),
            ],
            dir,
            tls: true,
            spawns: 0,
        };
        s.spawn_on_free_port().await;
        s
    }

    /// A TLS-only server with the given certificate and key, trusting `ca` for
    /// client certificates, which it requires when `clients`; `extra` as in
    /// [`RedisServer::start_with`].
    pub async fn start_tls_files(
        cert: &Path,
        key: &Path,
        ca: &Path,
        clients: bool,
        extra: &[&str],
    ) -> RedisServer {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut args = vec![
            "--tls-cert-file".into(),
            path(cert),
            "--tls-key-file".into(),
            path(key),
            "--tls-ca-cert-file".into(),
            path(ca),
            "--tls-auth-clients".into(),
            if clients { "yes" } else { "no" }.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut s = RedisServer {
            child: None,
            port: 0,
            extra: args,
            dir: tempfile::tempdir().expect("tempdir"),
            tls: true,
            spawns: 0,
        };
        s.spawn_on_free_port().await;
        s
    }

    /// Spawns redis-server on `self.port`; false if it did not come to serve there
    /// (it exited, typically because another process holds the port).
    async fn spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let listen: &[&str] = if self.tls {
            &["--port", "0", "--tls-port", &port]
        } else {
            &["--port", &port]
        };
        self.spawns += 1;
        let log = self.dir.path().join(format!("redis-{}.log", self.spawns));
        let child = Command::new("redis-server")
            .args(listen)
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let ready = self.wait_ready(log).await;
        if !ready {
            self.kill();
        }
        ready
    }

    /// Waits until our redis-server serves on the port: true once its own log says
    /// so (Redis logs "Ready to accept connections" once every listener is bound, so
    /// the port is ours, not another process's), false if it exits first (a port
    /// taken meanwhile: it logs the failed bind and exits).
    async fn wait_ready(&mut self, log: PathBuf) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !self.running() {
                return false;
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Ready to accept connections") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// Whether our redis-server process is still alive.
    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().map(|s| s.is_none()).unwrap_or(false))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Sluice's own connections to this server, for calls a test makes as the
    /// store would.
    pub fn pool(&self) -> sluice_redis::Pool {
        let target = sluice_redis::Target::parse(&self.url(), std::time::Duration::from_secs(5))
            .expect("a server's URL");
        sluice_redis::Pool::new(target)
    }

    /// Kills the server (SIGKILL: no goodbye to clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes the server (`SIGSTOP`) for `d`, then lets it go on: a stall in which
    /// it holds its connections but answers nothing. The stall's length is the fault
    /// under test, so this one wait is a time, not a condition.
    pub async fn stall(&self, d: Duration) {
        self.freeze();
        tokio::time::sleep(d).await;
        self.thaw();
    }

    /// Freezes the server (`SIGSTOP`) until [`RedisServer::thaw`]: a hung Redis.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self.child.as_ref().expect("running").id();
        // SAFETY: kill(2) on our own child's pid, no memory involved.
        let rc = unsafe { libc::kill(pid as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal})");
    }

    /// Makes the server busy for `secs` seconds with `DEBUG SLEEP` from a connection
    /// of its own (the server must run with `--enable-debug-command local`), and
    /// returns once it is: a PING on another connection goes unanswered. A slow
    /// Redis that still holds every connection open.
    pub async fn sleep(&self, secs: u32) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.addr())
            .await
            .expect("connect");
        s.write_all(format!("DEBUG SLEEP {secs}\r\n").as_bytes())
            .await
            .expect("DEBUG SLEEP");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let mut ping = tokio::net::TcpStream::connect(self.addr())
                .await
                .expect("connect");
            ping.write_all(b"PING\r\n").await.expect("PING");
            let mut buf = [0u8; 16];
            let answer =
                tokio::time::timeout(Duration::from_millis(200), ping.read(&mut buf)).await;
            if answer.is_err() {
                // Closing the connection does not wake the sleeping server.
                return;
            }
        }
        panic!("redis-server did not start sleeping (is --enable-debug-command local set?)");
    }

    /// Starts it again on the same port (empty: no persistence), retrying for a while
    /// if another process took the port meanwhile.
    pub async fn restart(&mut self) {
        self.kill();
        for _ in 0..20 {
            if self.spawn().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("redis-server could not restart on port {}", self.port);
    }

    /// An async connection for inspecting the server.
    /// Polls `cmd` (an `INFO`-like command) until its text contains `want`; panics
    /// with `why` past `deadline`.
    pub async fn wait_for(&self, cmd: &redis::Cmd, want: &str, deadline: Instant, why: &str) {
        let mut conn = self.conn().await;
        loop {
            let text: String = cmd.query_async(&mut conn).await.expect("INFO-like reply");
            if text.contains(want) {
                return;
            }
            assert!(Instant::now() < deadline, "{why}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.conn_as(&self.url()).await
    }

    pub async fn conn_as(&self, url: &str) -> redis::aio::MultiplexedConnection {
        redis::Client::open(url)
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Calls of `command` (e.g. `evalsha`) the server has answered, from
/// `INFO commandstats`.
pub async fn command_calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Lua calls the server ran: decide calls (a function by `FCALL`, or a script by
/// `EVALSHA`), refunds and peeks.
pub async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    command_calls(conn, "fcall").await + command_calls(conn, "evalsha").await
}

/// Every key on the server.
pub async fn keys(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("KEYS")
}

/// A Redis Cluster of `masters` nodes (no replicas), every slot assigned.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// A cluster node's flags: a node unreachable for 2 s counts as failing.
const CLUSTER_NODE: &[&str] = &[
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
];

/// Runs `redis-cli --cluster` with `args` (the subcommand first); panics if it fails.
fn cluster_cli(args: &[String]) {
    let status = Command::new("redis-cli")
        .arg("--cluster")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run redis-cli");
    assert!(status.success(), "redis-cli --cluster {} failed", args[0]);
}

impl RedisCluster {
    pub async fn start(masters: usize) -> RedisCluster {
        let mut nodes = Vec::new();
        for _ in 0..masters {
            let node = RedisServer::start_with(CLUSTER_NODE);
            nodes.push(node.await);
        }
        let mut args = vec!["create".to_string()];
        args.extend(nodes.iter().map(RedisServer::addr));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        cluster_cli(&args);
        let cluster = RedisCluster { nodes };
        cluster.wait_ok().await;
        cluster
    }

    /// As [`RedisCluster::start`]; `None` (after [`available`]'s loud message) when
    /// redis-server cannot be run.
    pub async fn if_available(masters: usize) -> Option<RedisCluster> {
        if !available() {
            return None;
        }
        Some(Self::start(masters).await)
    }

    /// Waits until every node reports `cluster_state:ok`.
    async fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &self.nodes {
            let info = redis::cmd("CLUSTER").arg("INFO").to_owned();
            let why = "the cluster never became ok";
            node.wait_for(&info, "cluster_state:ok", deadline, why)
                .await;
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Adds a replica of `nodes[master]` (pushed last onto `nodes`), once it has
    /// synced with its master and every node knows it.
    pub async fn add_replica(&mut self, master: usize) {
        let replica = RedisServer::start_with(CLUSTER_NODE).await;
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut self.nodes[master].conn().await)
            .await
            .expect("CLUSTER MYID");
        cluster_cli(&[
            "add-node".to_string(),
            replica.addr(),
            self.nodes[master].addr(),
            "--cluster-slave".to_string(),
            "--cluster-master-id".to_string(),
            id,
        ]);
        let deadline = Instant::now() + Duration::from_secs(30);
        let info = redis::cmd("INFO").arg("replication").to_owned();
        let why = "the replica never synced";
        replica
            .wait_for(&info, "master_link_status:up", deadline, why)
            .await;
        self.nodes.push(replica);
        self.wait_ok().await;
    }
}

/// A fresh CA (`ca.crt`) and a certificate for localhost and 127.0.0.1 signed by it
/// (`server.crt`, `server.key`; no extended key usage, so it serves as a client's
/// certificate too), written in `d`.
pub fn tls_certificates(d: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "openssl {args:?} failed");
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=sluice test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        d.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}
