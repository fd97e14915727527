//! The test xDS server (`tools/test-xds`, built by `scripts/install-test-xds.sh`):
//! go-control-plane's snapshot cache behind ADS, as Envoy Gateway runs it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::certs::Certs;
use super::http;

/// The fixtures of `tests/fixtures/envoy-gateway/`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoy-gateway")
        .join(name)
}

/// The server binary: `SLUICE_TEST_XDS`, else `sluice-test-xds` in Go's bin
/// directory. `None` (the test skips) when absent and `SLUICE_REQUIRE_XDS` is unset.
pub fn binary() -> Option<PathBuf> {
    let found = match std::env::var_os("SLUICE_TEST_XDS") {
        Some(p) => Some(PathBuf::from(p)),
        None => go_bin().map(|d| d.join("sluice-test-xds")),
    }
    .filter(|p| p.is_file());
    if found.is_none() {
        if std::env::var_os("SLUICE_REQUIRE_XDS").is_some() {
            panic!("SLUICE_REQUIRE_XDS is set but sluice-test-xds is missing: run scripts/install-test-xds.sh");
        }
        eprintln!("skipped: sluice-test-xds not built (scripts/install-test-xds.sh)");
    }
    found
}

fn go_bin() -> Option<PathBuf> {
    let out = Command::new("go")
        .args(["env", "GOBIN", "GOPATH"])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let mut lines = text.lines();
    let gobin = lines.next().unwrap_or("").trim();
    if !gobin.is_empty() {
        return Some(PathBuf::from(gobin));
    }
    Some(PathBuf::from(lines.next()?.trim()).join("bin"))
}

/// A running test xDS server, killed on drop.
pub struct XdsServer {
    child: Child,
    bin: PathBuf,
    args: Vec<String>,
    /// `127.0.0.1:PORT` of ADS.
    pub addr: String,
    /// The loopback control address.
    pub control: String,
}

impl XdsServer {
    /// Serves `files` over mTLS with `certs` (Envoy Gateway's), for node
    /// `envoy-ratelimit`.
    pub fn start_tls(bin: &Path, certs: &Certs, files: &[PathBuf]) -> XdsServer {
        let mut args: Vec<String> = [
            "-cert",
            &certs.path("envoy-gateway.crt").display().to_string(),
            "-key",
            &certs.path("envoy-gateway.key").display().to_string(),
            "-ca",
            &certs.path("ca.crt").display().to_string(),
        ]
        .map(String::from)
        .into();
        args.extend(files.iter().map(|f| f.display().to_string()));
        Self::spawn(bin, "127.0.0.1:0", args)
    }

    /// Serves `files` in plain text.
    pub fn start_plain(bin: &Path, files: &[PathBuf]) -> XdsServer {
        let args = files.iter().map(|f| f.display().to_string()).collect();
        Self::spawn(bin, "127.0.0.1:0", args)
    }

    fn spawn(bin: &Path, listen: &str, args: Vec<String>) -> XdsServer {
        let mut child = Command::new(bin)
            .args(["-listen", listen])
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sluice-test-xds");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the listening line");
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
                .to_string()
        };
        XdsServer {
            addr: field("xds="),
            control: field("control="),
            child,
            bin: bin.to_path_buf(),
            args,
        }
    }

    /// The ADS port.
    pub fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Publishes `yaml` (RateLimitConfig documents) as the next version; returns it.
    pub fn publish(&self, yaml: &str) -> String {
        let (status, body) = http(&self.control, "POST", "/snapshot", yaml);
        assert_eq!(status, 200, "{body}");
        body.trim().to_string()
    }

    /// Publishes the files of `paths` as the next version.
    pub fn publish_files(&self, paths: &[PathBuf]) -> String {
        let text: Vec<String> = paths
            .iter()
            .map(|p| std::fs::read_to_string(p).expect("read fixture"))
            .collect();
        self.publish(&text.join("\n---\n"))
    }

    /// Every DiscoveryRequest received so far (with its `stream` and `unix_nanos`).
    pub fn requests(&self) -> Vec<serde_json::Value> {
        let (status, body) = http(&self.control, "GET", "/requests", "");
        assert_eq!(status, 200, "{body}");
        body.lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// Every DiscoveryResponse sent so far (`stream`, `version_info`, `nonce`,
    /// `unix_nanos`).
    pub fn responses(&self) -> Vec<serde_json::Value> {
        let (status, body) = http(&self.control, "GET", "/responses", "");
        assert_eq!(status, 200, "{body}");
        body.lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }

    /// Stops the server (its streams break).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a new server on the same port with the same arguments, and `files` in
    /// place of the old ones when given. Its versions start at 1 again, as a
    /// restarted Envoy Gateway's do.
    pub fn restart(&mut self, files: Option<&[PathBuf]>) {
        self.kill();
        let mut args = self.args.clone();
        if let Some(files) = files {
            args.retain(|a| !a.ends_with(".yaml"));
            args.extend(files.iter().map(|f| f.display().to_string()));
        }
        let listen = self.addr.clone();
        let next = Self::spawn(&self.bin, &listen, args);
        *self = next;
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
