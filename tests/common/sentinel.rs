//! Real `redis-sentinel` processes watching a test master: each on a free loopback
//! port with a config file of its own (Sentinel rewrites it), killed on drop.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis::{free_port, runs};

/// Whether `redis-sentinel` can be run (scripts/test.sh installs it); loud when not.
pub fn available() -> bool {
    runs("redis-sentinel")
}

/// Sentinels monitoring one master under one name.
pub struct Sentinels {
    children: Vec<Child>,
    pub ports: Vec<u16>,
    /// Each sentinel's TLS port, when started with [`Sentinels::start_tls`].
    pub tls_ports: Vec<u16>,
    pub name: String,
    pub dir: tempfile::TempDir,
}

impl Sentinels {
    /// `n` sentinels watching the master at 127.0.0.1:`master_port` as `name`, with
    /// a quorum of a majority and a short down-after so failovers are quick.
    pub async fn start(n: usize, name: &str, master_port: u16) -> Sentinels {
        Self::start_with(n, name, master_port, "").await
    }

    /// As [`Sentinels::start`], with `extra` appended to each config (such as
    /// `sentinel auth-pass NAME PASSWORD` for a master with a password).
    pub async fn start_with(n: usize, name: &str, master_port: u16, extra: &str) -> Sentinels {
        Self::start_inner(n, name, master_port, extra, false).await
    }

    /// As [`Sentinels::start_with`], each sentinel also serving TLS on a port of
    /// [`Sentinels::tls_ports`] (`extra` names the files: `tls-cert-file` and so on);
    /// the plain ports stay for the test's own checks.
    pub async fn start_tls(n: usize, name: &str, master_port: u16, extra: &str) -> Sentinels {
        Self::start_inner(n, name, master_port, extra, true).await
    }

    async fn start_inner(
        n: usize,
        name: &str,
        master_port: u16,
        extra: &str,
        tls: bool,
    ) -> Sentinels {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Sentinels {
            children: Vec::new(),
            ports: Vec::new(),
            tls_ports: Vec::new(),
            name: name.to_string(),
            dir,
        };
        for i in 0..n {
            let port = free_port();
            let tls_port = if tls { free_port() } else { 0 };
            let conf = s.dir.path().join(format!("sentinel-{i}.conf"));
            let log = s.dir.path().join(format!("sentinel-{i}.log"));
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {log}\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 10000\n\
                 sentinel parallel-syncs {name} 1\n{tls_line}{extra}\n",
                tls_line = if tls {
                    format!("tls-port {tls_port}\n")
                } else {
                    String::new()
                },
                dir = s.dir.path().display(),
                log = log.display(),
                quorum = n / 2 + 1,
            );
            std::fs::write(&conf, text).expect("sentinel config");
            let child = Command::new("redis-sentinel")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-sentinel");
            s.children.push(child);
            s.ports.push(port);
            if tls {
                s.tls_ports.push(tls_port);
            }
        }
        s
    }

    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    async fn conn(&self, i: usize) -> Option<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.urls()[i].as_str()).ok()?;
        tokio::time::timeout(
            Duration::from_secs(1),
            client.get_multiplexed_async_connection(),
        )
        .await
        .ok()?
        .ok()
    }

    /// `SENTINEL args...` on sentinel `i`, or its error as text.
    pub async fn command(&self, i: usize, args: &[&str]) -> Result<redis::Value, String> {
        let mut conn = self.conn(i).await.ok_or("cannot connect")?;
        let mut cmd = redis::cmd("SENTINEL");
        for a in args {
            cmd.arg(*a);
        }
        cmd.query_async::<redis::Value>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }

    /// The master's address as sentinel `i` gives it.
    pub async fn master_addr(&self, i: usize) -> Option<String> {
        let mut conn = self.conn(i).await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.name)
            .query_async(&mut conn)
            .await
            .ok()?;
        addr.map(|(h, p)| format!("{h}:{p}"))
    }

    /// Waits until every sentinel sees the master, `replicas` replicas and all the
    /// other sentinels: before then a failover has no replica to promote or no
    /// majority to elect a leader.
    pub async fn wait_settled(&self, replicas: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let others = self.ports.len() - 1;
        loop {
            let mut ok = true;
            for i in 0..self.ports.len() {
                let seen = |v: Result<redis::Value, String>| match v {
                    Ok(redis::Value::Array(a)) => a.len(),
                    _ => 0,
                };
                ok &= self.master_addr(i).await.is_some()
                    && seen(self.command(i, &["replicas", &self.name]).await) == replicas
                    && seen(self.command(i, &["sentinels", &self.name]).await) == others;
            }
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sentinels did not settle; logs in {}",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends `signal` to every sentinel (`SIGSTOP`: none answers; `SIGCONT`).
    pub fn signal_all(&self, signal: libc::c_int) {
        for c in &self.children {
            // SAFETY: kill(2) on our own child's pid, no memory involved.
            let rc = unsafe { libc::kill(c.id() as libc::pid_t, signal) };
            assert_eq!(rc, 0, "kill({}, {signal})", c.id());
        }
    }

    /// Starts a failover on sentinel 0, retrying while Sentinel refuses for now
    /// (no replica judged good yet, a failover still in progress).
    pub async fn failover(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.command(0, &["failover", &self.name]).await {
                Ok(_) => return,
                Err(e) => assert!(Instant::now() < deadline, "SENTINEL FAILOVER: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
