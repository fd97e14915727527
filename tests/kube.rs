//! `sluice serve --kube` against a REAL Kubernetes API server (etcd +
//! apiextensions-apiserver, started by `scripts/kube-apiserver.sh` in a temporary
//! directory), driven with a real kubectl.
//!
//! Skips (loudly) when the API server binaries are absent, unless
//! `SLUICE_REQUIRE_KUBE` is set, as `scripts/test.sh` does after installing them
//! with `scripts/install-kube.sh`: then their absence is a failure.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// An API server in a temporary directory, stopped on drop.
struct Cluster {
    dir: tempfile::TempDir,
    kubeconfig: String,
    kubectl: String,
    env: Vec<(String, String)>,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn script() -> PathBuf {
    repo().join("scripts/kube-apiserver.sh")
}

/// Where a binary is: an explicit variable, else `dirs`, else PATH.
fn find_bin(var: &str, name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    dirs.iter()
        .cloned()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn binaries_present() -> Result<(), String> {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    let mut go_dirs = vec![home.join("go/bin")];
    if let Some(gopath) = std::env::var_os("GOPATH") {
        go_dirs.insert(0, PathBuf::from(gopath).join("bin"));
    }
    if let Some(gobin) = std::env::var_os("GOBIN") {
        go_dirs.insert(0, PathBuf::from(gobin));
    }
    let mut missing = Vec::new();
    // The API server scripts/install-kube.sh builds (apiextensions-apiserver with
    // discovery and OpenAPI), or any named in APIEXT_BIN.
    if find_bin("APIEXT_BIN", "sluice-test-apiserver", &go_dirs).is_none() {
        missing.push("sluice-test-apiserver");
    }
    if find_bin("ETCD_BIN", "etcd", &[]).is_none() {
        missing.push("etcd");
    }
    if !script().is_file() {
        missing.push("scripts/kube-apiserver.sh");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join(", "))
    }
}

impl Cluster {
    /// Starts the API server, or returns `None` (after a loud message) when its
    /// binaries are absent and `SLUICE_REQUIRE_KUBE` is unset.
    fn start() -> Option<Cluster> {
        Self::start_with(false)
    }

    /// As [`Cluster::start`], the API server writing the metadata of every request
    /// to its audit log, [`Cluster::audit`].
    fn start_audited() -> Option<Cluster> {
        Self::start_with(true)
    }

    fn start_with(audited: bool) -> Option<Cluster> {
        if let Err(missing) = binaries_present() {
            if std::env::var_os("SLUICE_REQUIRE_KUBE").is_some() {
                panic!("SLUICE_REQUIRE_KUBE is set but {missing} is missing: run scripts/install-kube.sh");
            }
            // Straight to stderr, past the test harness's capture, so a skip is seen.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!(
                    "\n\
                     ########################################################################\n\
                     ## SKIPPING the Kubernetes tests (tests/kube.rs): {missing} not found.\n\
                     ## Run scripts/install-kube.sh, or scripts/test.sh (which requires them).\n\
                     ########################################################################\n"
                )
                .as_bytes(),
            );
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("sluice-kube-")
            .tempdir()
            .expect("tempdir");
        let mut cluster = Cluster {
            dir,
            kubeconfig: String::new(),
            kubectl: String::new(),
            env: Vec::new(),
        };
        if !audited {
            cluster.run_script(&[]);
            return Some(cluster);
        }
        let d = cluster.dir.path();
        let policy = d.join("audit-policy.yaml");
        std::fs::write(
            &policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n  - level: Metadata\n",
        )
        .expect("write the audit policy");
        let args = format!(
            "--audit-policy-file={} --audit-log-path={}",
            policy.display(),
            d.join("audit.log").display()
        );
        cluster.run_script(&[("KUBE_APISERVER_EXTRA_ARGS", &args)]);
        Some(cluster)
    }

    /// The events of the audit log so far (with [`Cluster::start_audited`]).
    fn audit(&self) -> Vec<serde_json::Value> {
        let log = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        log.lines()
            .map(|l| serde_json::from_str(l).expect("an audit event"))
            .collect()
    }

    /// `kube-apiserver.sh start`, with extra environment; reads DIR/env.
    fn run_script(&mut self, envs: &[(&str, &str)]) {
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(self.dir.path())
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("run kube-apiserver.sh");
        assert!(
            out.status.success(),
            "kube-apiserver.sh start failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env = std::fs::read_to_string(self.dir.path().join("env")).expect("DIR/env");
        self.env = env
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.kubeconfig = self.var("KUBECONFIG");
        self.kubectl = self.var("KUBECTL_REAL");
    }

    fn var(&self, name: &str) -> String {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} missing from DIR/env"))
    }

    fn stop(&self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .output();
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = Command::new(&self.kubectl)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        {
            let mut input = child.stdin.take().expect("stdin");
            input
                .write_all(stdin.unwrap_or("").as_bytes())
                .expect("write stdin");
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// `kubectl apply --validate=false -f -`; `Err(stderr)` when refused.
    fn apply(&self, yaml: &str) -> Result<(), String> {
        self.apply_with(&["--validate=false"], yaml)
    }

    /// `kubectl apply ARGS -f -`; `Err(stderr)` when refused.
    fn apply_with(&self, args: &[&str], yaml: &str) -> Result<(), String> {
        let args: Vec<&str> = ["apply"]
            .iter()
            .chain(args)
            .chain(&["-f", "-"])
            .copied()
            .collect();
        let out = self.kubectl(&args, Some(yaml));
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn must(&self, args: &[&str]) -> String {
        self.must_with(args, "")
    }

    /// As [`Cluster::must`], with `stdin` as kubectl's input.
    fn must_with(&self, args: &[&str], stdin: &str) -> String {
        let out = self.kubectl(args, Some(stdin));
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn jsonpath(&self, ns: &str, name: &str, path: &str) -> String {
        let out = self.kubectl(
            &[
                "get",
                "ratelimitpolicies.sluice.dev",
                name,
                "-n",
                ns,
                "-o",
                &format!("jsonpath={path}"),
            ],
            None,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Applies the repository's RateLimitPolicy CRD and waits until it is served.
    /// Has the API server serve EndpointSlices (this one does not build them in:
    /// tests/kube/crd-endpointslice.yaml stands for the built-in kind).
    async fn serve_endpoint_slices(&self) {
        let crd = repo().join("tests/kube/crd-endpointslice.yaml");
        self.must(&["apply", "-f", crd.to_str().unwrap()]);
        self.wait_established("endpointslices.discovery.k8s.io")
            .await;
    }

    /// Installs the CRD and applies `policy`, the first of its kind (retried
    /// while the API server does not serve the kind yet).
    async fn install_crd_with(&self, policy: &str) {
        self.install_crd().await;
        self.apply_new_kind(&["--validate=false"], policy).await;
    }

    /// Starts Sluice with `--kube` on this cluster, once it has accepted the
    /// policy `namespace/name`.
    async fn serve_accepted(&self, namespace: &str, name: &str) -> Server {
        let env = [("KUBECONFIG", self.kubeconfig.as_str())];
        let server = Server::start_env(tempfile::tempdir().unwrap(), &[], &["--kube"], &env);
        self.wait_accepted(namespace, name, "True/Accepted", Duration::from_secs(15))
            .await;
        server
    }

    async fn install_crd(&self) {
        let crd = repo().join("crds/ratelimitpolicies.yaml");
        self.must(&["apply", "--validate=false", "-f", crd.to_str().unwrap()]);
        self.wait_established("ratelimitpolicies.sluice.dev").await;
    }

    /// Waits until the CRD `name` is Established.
    async fn wait_established(&self, name: &str) {
        // (Polled: `kubectl wait` fails at once while the CRD has no conditions yet,
        // and so does this jsonpath, which only means "not yet".)
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let established = self.kubectl(
                &[
                    "get",
                    "crd",
                    name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
                ],
                None,
            );
            if established.status.success() && established.stdout == b"True" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the CRD {name} never became Established"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `kubectl apply ARGS`, retrying while kubectl's discovery does not know a new
    /// kind.
    async fn apply_new_kind(&self, args: &[&str], yaml: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while let Err(e) = self.apply_with(args, yaml) {
            assert!(Instant::now() < deadline, "not applied: {e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Adds a `Programmed` condition to the policy's conditions as read, as
    /// another controller (a gateway's) would.
    fn add_programmed(&self, ns: &str, name: &str) {
        let stored = self.jsonpath(ns, name, "{.status.conditions}");
        let mut conditions: Vec<serde_json::Value> = serde_json::from_str(&stored).unwrap();
        conditions.push(serde_json::json!({
            "type": "Programmed",
            "status": "True",
            "reason": "Programmed",
            "message": "routes carry the policy's descriptors",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }));
        let patch = serde_json::json!({"status": {"conditions": conditions}}).to_string();
        self.must(&[
            "patch",
            "ratelimitpolicies.sluice.dev",
            name,
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ]);
    }

    /// The `Accepted` condition as `status/reason/message`.
    fn accepted(&self, ns: &str, name: &str) -> String {
        let q = |f: &str| {
            self.jsonpath(
                ns,
                name,
                &format!("{{.status.conditions[?(@.type==\"Accepted\")].{f}}}"),
            )
        };
        format!("{}/{}/{}", q("status"), q("reason"), q("message"))
    }

    /// Waits until the `Accepted` condition starts with `want` (e.g. `False/Invalid`)
    /// and describes the current generation; returns it.
    async fn wait_accepted(&self, ns: &str, name: &str, want: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            last = self.accepted(ns, name);
            let generation = self.jsonpath(ns, name, "{.metadata.generation}");
            let observed = self.jsonpath(
                ns,
                name,
                "{.status.conditions[?(@.type==\"Accepted\")].observedGeneration}",
            );
            let top = self.jsonpath(ns, name, "{.status.observedGeneration}");
            if last.starts_with(want) && observed == generation && top == generation {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{ns}/{name}: Accepted condition never became {want}; last: {last}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn policy(ns: &str, name: &str, domain: &str, key: &str, rate_limit: &str) -> String {
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
         spec:\n  domain: {domain}\n  descriptors:\n    - key: {key}\n      rateLimit: {rate_limit}\n"
    )
}

fn per_minute(ns: &str, name: &str, domain: &str, key: &str, n: u32) -> String {
    policy(
        ns,
        name,
        domain,
        key,
        &format!("{{unit: minute, requestsPerUnit: {n}}}"),
    )
}

/// The `requests_per_unit` of the limit sluice applies to one descriptor, if any.
async fn limit(server: &Server, domain: &str, key: &str) -> Option<u32> {
    limit_of(server, domain, &[(key, "probe")]).await
}

/// As [`limit`], for a descriptor of these entries.
async fn limit_of(server: &Server, domain: &str, entries: &[(&str, &str)]) -> Option<u32> {
    let mut client = server.client().await;
    let r = call(&mut client, request(domain, vec![desc(entries)])).await;
    r.statuses
        .first()
        .and_then(|s| s.current_limit.as_ref())
        .map(|l| l.requests_per_unit)
}

/// Waits until sluice applies `want` to `domain`/`key`; returns how long it took.
async fn wait_limit(
    server: &Server,
    domain: &str,
    key: &str,
    want: Option<u32>,
    within: Duration,
) -> Duration {
    wait_limit_of(server, domain, &[(key, "probe")], want, within).await
}

/// As [`wait_limit`], for a descriptor of these entries.
async fn wait_limit_of(
    server: &Server,
    domain: &str,
    entries: &[(&str, &str)],
    want: Option<u32>,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < within {
        last = limit_of(server, domain, entries).await;
        if last == want {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let logs = server.drain_lines().join("\n");
    panic!("{domain}/{entries:?}: wanted limit {want:?} within {within:?}, still {last:?}\nsluice log:\n{logs}");
}

/// `sluice validate` on one file holding `yaml`: `Err(stderr)` when refused.
fn validate(yaml: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("validate")
        .arg(&file)
        .output()
        .expect("run sluice validate");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The policy file a server was started with.
fn repo_file(server: &Server) -> PathBuf {
    server.dir.path().join("mixed.yaml")
}

const TWO_S: Duration = Duration::from_secs(2);
/// For status conditions, read with several kubectl calls per poll.
/// A `failure_mode: local` domain, for the replica count's tests.
const LOCAL_POLICY: &str = "domain: d\nfailure_mode: local\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 60}\n";

const STATUS: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_policies_from_a_real_api_server() {
    let Some(mut k) = Cluster::start() else {
        return;
    };
    let started = Instant::now();
    let env = [("KUBECONFIG", k.kubeconfig.clone())];
    let env: Vec<(&str, &str)> = env.iter().map(|(a, b)| (*a, b.as_str())).collect();

    // sluice starts before the CRD exists (and with a policy file of its own): it
    // must wait for the CRD, not fail.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mixed.yaml");
    std::fs::write(
        &file,
        "domain: mixed\ndescriptors:\n  - key: filekey\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
    )
    .unwrap();
    let mut log_env = env.clone();
    log_env.push(("RUST_LOG", "info,sluice::source::kube=debug"));
    let all = Server::start_env(dir, &[file], &["--kube"], &log_env);
    wait_limit(&all, "mixed", "filekey", Some(3), TWO_S).await;
    // The watch retries before the CRD comes.
    let mut log = all.startup.clone();
    log.extend(
        all.wait_line(Duration::from_secs(10), "a retry", |l| {
            l.contains("still failing") || l.contains("CRD is not installed")
        })
        .await,
    );

    // The CRD, from the committed YAML (the same `sluice crd` prints).
    k.install_crd().await;
    let names = k.must(&[
        "get",
        "crd",
        "ratelimitpolicies.sluice.dev",
        "-o",
        "jsonpath={.spec.names.shortNames}",
    ]);
    assert!(names.contains("rlp"), "{names}");

    // A policy: seen once the watch finds the CRD (back-off at most 5 s).
    k.apply_new_kind(
        &["--validate=false"],
        &per_minute("team-a", "a", "shop", "user", 2),
    )
    .await;
    wait_limit(&all, "shop", "user", Some(2), Duration::from_secs(15)).await;
    k.wait_accepted("team-a", "a", "True/Accepted", Duration::from_secs(5))
        .await;
    // While the CRD was missing the watch retried quietly, backing off; it was
    // restored once, when a list succeeded.
    log.extend(all.drain_lines());
    let count = |text: &str| log.iter().filter(|l| l.contains(text)).count();
    assert_eq!(count("RateLimitPolicy watch restored"), 1, "{log:#?}");
    assert_eq!(count("CRD is not installed"), 1, "{log:#?}");
    let table = k.must(&["get", "rlp", "-n", "team-a"]);
    assert!(
        table.contains("DOMAIN") && table.contains("ACCEPTED") && table.contains("shop"),
        "{table}"
    );

    // An edit is seen within 2 s.
    k.apply(&per_minute("team-a", "a", "shop", "user", 5))
        .unwrap();
    let took = wait_limit(&all, "shop", "user", Some(5), TWO_S).await;
    eprintln!("edit seen after {took:?}");

    // The schema refuses bad specs at kubectl apply.
    for (rate_limit, expect) in [
        (
            "{unit: minute, requestsPerUnit: -1}",
            "greater than or equal to 0",
        ),
        (
            "{unit: minute}",
            "requestsPerUnit is required unless unlimited is true",
        ),
        ("{unit: fortnight, requestsPerUnit: 1}", "Unsupported value"),
        (
            "{unit: minute, requestsPerUnit: 1, algorithm: magic}",
            "Unsupported value",
        ),
        ("{window: 10 seconds, requestsPerUnit: 1}", "should match"),
        (
            "{unlimited: true, unit: minute}",
            "cannot be set when unlimited is true",
        ),
        (
            "{algorithm: concurrency, requestsPerUnit: 2}",
            "set exactly one of unit or window (or lease",
        ),
        (
            "{algorithm: concurrency, requestsPerUnit: 2, lease: 5 minutes}",
            "should match",
        ),
    ] {
        let err = k
            .apply(&policy("team-a", "a", "shop", "user", rate_limit))
            .expect_err(rate_limit);
        assert!(err.contains(expect), "{rate_limit}: {err}");
    }
    assert_eq!(limit(&all, "shop", "user").await, Some(5));

    // What the schema refuses, `sluice validate` refuses too, with a message saying
    // what to write: kubectl's YAML reader makes booleans and numbers of plain
    // scalars, and the schema has spellings and bounds the parser alone would not.
    let descriptor_policy = |domain: &str, descriptor: &str| {
        format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: a, namespace: team-a}}\n\
             spec:\n  domain: {domain}\n  descriptors:\n    - {descriptor}\n"
        )
    };
    let per_minute_5 = "rateLimit: {unit: minute, requestsPerUnit: 5}";
    for (domain, descriptor, expect) in [
        ("shop", format!("{{key: on, {per_minute_5}}}"), "'key': on is read as a boolean by kubectl; quote it"),
        ("shop", format!("{{key: n, {per_minute_5}}}"), "'key': n is read as a boolean"),
        ("shop", format!("{{key: 42, {per_minute_5}}}"), "'key': 42 is read as an integer"),
        ("shop", format!("{{key: 1_000, {per_minute_5}}}"), "'key': 1_000 is read as an integer"),
        ("shop", format!("{{key: user, value: true, {per_minute_5}}}"), "'value': true is read as a boolean"),
        ("shop", format!("{{key: user, value: 1.5, {per_minute_5}}}"), "'value': 1.5 is read as a number"),
        ("42", format!("{{key: user, {per_minute_5}}}"), "'domain': 42 is read as an integer"),
        ("shop", "{key: user, rateLimit: {unit: minute, requestsPerUnit: 1.5}}".into(), "'requestsPerUnit' must be an integer, found the number 1.5"),
        ("shop", "{key: user, rateLimit: {unit: minute, requestsPerUnit: 5, algorithm: token_bucket, burst: 7.5}}".into(), "'burst' must be an integer, found the number 7.5"),
        ("shop", "{key: user, rateLimit: {unit: Minute, requestsPerUnit: 5}}".into(), "must be all lowercase or all uppercase"),
        ("shop", "{key: user, rateLimit: {window: ' 10s', requestsPerUnit: 5}}".into(), "has spaces around it"),
        ("shop", format!("{{key: user, rateLimit: {{window: {}, requestsPerUnit: 5}}}}", "1s".repeat(17)), "at most 32"),
        ("shop", "{key: user, rateLimit: {algorithm: concurrency, lease: '5m ', requestsPerUnit: 5}}".into(), "has spaces around it"),
        ("shop", "{key: user, rateLimit: {unit: minute, requestsPerUnit: 5, name: 7}}".into(), "'name': 7 is read as an integer"),
        ("shop", "{key: user, rateLimit: {unit: minute, requestsPerUnit: 5, algorithm: token_bucket, burst: 1125899906842625}}".into(), "'burst' must be at most 1125899906842624"),
    ] {
        let yaml = descriptor_policy(domain, &descriptor);
        let refused = validate(&yaml).expect_err(&descriptor);
        assert!(refused.contains(expect), "{descriptor}: {refused}");
        k.apply(&yaml).expect_err(&descriptor);
    }
    assert_eq!(limit(&all, "shop", "user").await, Some(5));

    // Requests in flight: a concurrency limit with its lease, as in a policy file.
    k.apply(&policy(
        "team-c",
        "streams",
        "streams",
        "user",
        "{algorithm: concurrency, requestsPerUnit: 2, lease: 5m}",
    ))
    .unwrap();
    wait_limit(&all, "streams", "user", Some(2), TWO_S).await;
    k.wait_accepted("team-c", "streams", "True/Accepted", STATUS)
        .await;
    let stored = k.must(&["get", "rlp", "streams", "-n", "team-c", "-o", "yaml"]);
    assert!(stored.contains("lease: 5m"), "{stored}");

    // A descriptor value written as an integer (a port): the schema takes it
    // (int-or-string), the API server keeps the number, and sluice serves it as the
    // value "8080", as it does from a file; `sluice validate` agrees.
    let ports = "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: ports, namespace: team-c}\n\
                 spec:\n  domain: ports\n  descriptors:\n    - key: port\n      value: 8080\n      rateLimit: {unit: minute, requestsPerUnit: 6}\n";
    validate(ports).unwrap();
    k.apply(ports).unwrap();
    wait_limit_of(&all, "ports", &[("port", "8080")], Some(6), TWO_S).await;
    k.wait_accepted("team-c", "ports", "True/Accepted", STATUS)
        .await;
    let stored = k.must(&["get", "rlp", "ports", "-n", "team-c", "-o", "json"]);
    let stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(
        stored["spec"]["descriptors"][0]["value"],
        serde_json::json!(8080)
    );

    // A count written with a zero fraction: the schema's integer takes it, the API
    // server serves it as 4, and `sluice validate` reads it as 4 too.
    let four = policy(
        "team-c",
        "four",
        "four",
        "user",
        "{unit: minute, requestsPerUnit: 4.0}",
    );
    validate(&four).unwrap();
    k.apply(&four).unwrap();
    wait_limit(&all, "four", "user", Some(4), TWO_S).await;

    // Valid for the schema, invalid for sluice (a duplicate key): Invalid, and the
    // last good limits keep serving.
    let dup = "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: a, namespace: team-a}\n\
               spec:\n  domain: shop\n  descriptors:\n    - {key: user, rateLimit: {unit: minute, requestsPerUnit: 9}}\n    - {key: user, rateLimit: {unit: minute, requestsPerUnit: 8}}\n";
    k.apply(dup).unwrap();
    let cond = k
        .wait_accepted("team-a", "a", "False/Invalid", STATUS)
        .await;
    assert!(cond.contains("duplicate descriptor"), "{cond}");
    assert_eq!(limit(&all, "shop", "user").await, Some(5));
    // Counted as a refused reload (the shipped alert reads it), and shown.
    let refused = [("source", "kube"), ("result", "error")];
    assert_eq!(
        all.metric("sluice_policy_reloads_total", &refused),
        Some(1.0)
    );
    let status = debug_status(&all, "team-a/a");
    assert_eq!(
        (&status["state"], &status["reason"]),
        (&"last_good".into(), &"Invalid".into()),
        "{status}"
    );
    k.apply(&per_minute("team-a", "a", "shop", "user", 7))
        .unwrap();
    wait_limit(&all, "shop", "user", Some(7), TWO_S).await;
    k.wait_accepted("team-a", "a", "True/Accepted", STATUS)
        .await;

    // Limits that replace each other (a request matching both would be limited by
    // neither): Invalid with the words `sluice validate` gives for the same
    // manifest, and the last good version keeps serving.
    k.apply(&per_minute("team-e", "circle", "circle", "user", 3))
        .unwrap();
    wait_limit(&all, "circle", "user", Some(3), TWO_S).await;
    let circle = "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: circle, namespace: team-e}\n\
                  spec:\n  domain: circle\n  descriptors:\n    - {key: user, rateLimit: {unit: minute, requestsPerUnit: 3, name: user_cap, replaces: [{name: ip_cap}]}}\n    - {key: ip, rateLimit: {unit: minute, requestsPerUnit: 5, name: ip_cap, replaces: [{name: user_cap}]}}\n";
    let words = "limits 'user_cap' (";
    let rest = ") replace each other: when both match one request neither applies";
    let refused = validate(circle).expect_err("a circle of replaces");
    assert!(
        refused.contains(words) && refused.contains(rest),
        "{refused}"
    );
    k.apply(circle).unwrap();
    let cond = k
        .wait_accepted("team-e", "circle", "False/Invalid", STATUS)
        .await;
    assert!(
        cond.contains("limits 'user_cap' (team-e/circle, key 'user' with no value) and 'ip_cap' (team-e/circle, key 'ip' with no value)")
            && cond.contains(rest),
        "{cond}"
    );
    assert_eq!(limit(&all, "circle", "user").await, Some(3));

    // An invalid edit to the older of two policies defining one path: the older
    // one's last good version keeps it, and the newer one stays Conflicted.
    k.apply(&per_minute("team-d", "first", "paths", "user", 3))
        .unwrap();
    k.wait_accepted("team-d", "first", "True/Accepted", STATUS)
        .await;
    k.apply(&per_minute("team-d", "second", "paths", "user", 8))
        .unwrap();
    k.wait_accepted("team-d", "second", "False/Conflicted", STATUS)
        .await;
    let bad_first = "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: first, namespace: team-d}\n\
                     spec:\n  domain: paths\n  descriptors:\n    - {key: user, rateLimit: {unit: minute, requestsPerUnit: 4}}\n    - {key: user, rateLimit: {unit: minute, requestsPerUnit: 5}}\n";
    k.apply(bad_first).unwrap();
    k.wait_accepted("team-d", "first", "False/Invalid", STATUS)
        .await;
    assert_eq!(limit(&all, "paths", "user").await, Some(3));
    assert!(
        k.accepted("team-d", "second")
            .starts_with("False/Conflicted"),
        "{}",
        k.accepted("team-d", "second")
    );

    // A policy cannot move to another domain: an old one would take the domain
    // from the namespace that owns it. The API server refuses the edit.
    let moved = k
        .apply(&per_minute("team-d", "first", "shop", "user", 3))
        .unwrap_err();
    assert!(moved.contains("spec.domain cannot change"), "{moved}");
    assert_eq!(limit(&all, "paths", "user").await, Some(3));

    // Another namespace naming the same domain: Conflicted.
    k.apply(&per_minute("team-b", "b", "shop", "other", 11))
        .unwrap();
    let cond = k
        .wait_accepted("team-b", "b", "False/Conflicted", STATUS)
        .await;
    assert!(cond.contains("belongs to namespace 'team-a'"), "{cond}");
    assert_eq!(limit(&all, "shop", "other").await, None);
    let status = debug_status(&all, "team-b/b");
    assert_eq!(
        (&status["state"], &status["reason"]),
        (&"refused".into(), &"Conflicted".into()),
        "{status}"
    );
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("team-a")),
        "{status}"
    );

    // A policy and a file naming one domain merge; a clash makes the policy
    // Conflicted and the file keeps serving.
    k.apply(&per_minute("team-a", "m", "mixed", "polkey", 4))
        .unwrap();
    wait_limit(&all, "mixed", "polkey", Some(4), TWO_S).await;
    assert_eq!(limit(&all, "mixed", "filekey").await, Some(3));
    k.wait_accepted("team-a", "m", "True/Accepted", STATUS)
        .await;
    k.apply(&per_minute("team-a", "clash", "mixed", "filekey", 9))
        .unwrap();
    let cond = k
        .wait_accepted("team-a", "clash", "False/Conflicted", STATUS)
        .await;
    assert!(cond.contains("mixed.yaml"), "{cond}");
    assert_eq!(limit(&all, "mixed", "filekey").await, Some(3));

    // Delete: the limit is gone within 2 s, and team-b now owns the domain.
    k.must(&["delete", "rlp", "a", "-n", "team-a"]);
    wait_limit(&all, "shop", "user", None, TWO_S).await;
    wait_limit(&all, "shop", "other", Some(11), TWO_S).await;
    k.wait_accepted("team-b", "b", "True/Accepted", STATUS)
        .await;

    // --kube-namespace sees its namespace only.
    let only_b = Server::start_env(
        tempfile::tempdir().unwrap(),
        &[],
        &["--kube", "--kube-namespace", "team-b"],
        &env,
    );
    // Started after the policies exist: serves them from the first request.
    assert_eq!(limit(&only_b, "shop", "other").await, Some(11));
    assert_eq!(limit(&only_b, "mixed", "polkey").await, None);
    drop(only_b);

    // The example file applies as is, and every policy in it is accepted.
    let example = repo().join("examples/policy.yaml");
    k.must(&["apply", "--validate=false", "-f", example.to_str().unwrap()]);
    for name in ["edge", "service", "tenants"] {
        k.wait_accepted("shop", name, "True/Accepted", Duration::from_secs(3))
            .await;
    }
    wait_limit(&all, "api", "remote_address", Some(600), TWO_S).await;

    // A second replica (same flags and files) agrees on every status: nothing is
    // rewritten back and forth.
    // (The same file path, as in a Deployment: a Conflicted message names it.)
    let replica = Server::start_env(
        tempfile::tempdir().unwrap(),
        &[repo_file(&all)],
        &["--kube"],
        &env,
    );
    assert_eq!(limit(&replica, "api", "remote_address").await, Some(600));
    let versions = || {
        ["shop edge", "team-a clash", "team-b b", "team-a m"]
            .map(|p| {
                let (ns, name) = p.split_once(' ').unwrap();
                k.jsonpath(ns, name, "{.metadata.resourceVersion}")
            })
            .join(",")
    };
    let before = versions();
    // A policy of its own: once both replicas serve it, each has handled every event
    // before it, a status write of the other's included, and written what it would.
    k.apply(&per_minute("team-b", "probe", "probe", "user", 4))
        .unwrap();
    wait_limit(&replica, "probe", "user", Some(4), TWO_S).await;
    wait_limit(&all, "probe", "user", Some(4), TWO_S).await;
    assert_eq!(versions(), before, "replicas rewrote a status");
    drop(replica);

    // The API server restarts (same ports): limits keep serving meanwhile, and
    // sluice's watch comes back by itself.
    let port = k.var("KUBE_APISERVER_PORT");
    let etcd = k.var("ETCD_CLIENT_PORT");
    let peer = k.var("ETCD_PEER_PORT");
    k.stop();
    assert_eq!(limit(&all, "shop", "other").await, Some(11));
    k.run_script(&[
        ("SLUICE_KUBE_APISERVER_PORT", &port),
        ("SLUICE_ETCD_CLIENT_PORT", &etcd),
        ("SLUICE_ETCD_PEER_PORT", &peer),
    ]);
    k.apply(&per_minute("team-b", "b", "shop", "other", 12))
        .unwrap();
    let took = wait_limit(&all, "shop", "other", Some(12), Duration::from_secs(20)).await;
    eprintln!("edit after an API server restart seen after {took:?}");
    eprintln!("kube test took {:?}", started.elapsed());
}

/// An EndpointSlice in `default` of Service `service`, one endpoint per (pod uid,
/// address, ready); `None` leaves `conditions` out (Kubernetes reads that as ready).
fn endpoint_slice(name: &str, service: &str, endpoints: &[(&str, &str, Option<bool>)]) -> String {
    let mut yaml = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: default\n  \
         labels:\n    kubernetes.io/service-name: {service}\naddressType: IPv4\n\
         ports:\n  - {{name: grpc, port: 8081, protocol: TCP}}\nendpoints:\n"
    );
    for (uid, address, ready) in endpoints {
        yaml += &format!(
            "  - addresses: [\"{address}\"]\n    targetRef: {{kind: Pod, namespace: default, name: pod-{uid}, uid: {uid}}}\n"
        );
        if let Some(ready) = ready {
            yaml += &format!("    conditions: {{ready: {ready}}}\n");
        }
    }
    yaml
}

/// `/debug/store`'s local share: (replicas, where the count came from).
fn share(server: &Server) -> (u64, String) {
    let (status, body) = http(&server.http, "GET", "/debug/store", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let local = &v["local"];
    let from = local["replicas_from"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (local["replicas"].as_u64().unwrap_or(0), from)
}

/// Waits until the share is `want`; returns how long it took.
async fn wait_share(server: &Server, want: (u64, &str), within: Duration) -> Duration {
    let start = Instant::now();
    let mut last = share(server);
    while (last.0, last.1.as_str()) != want {
        if start.elapsed() > within {
            let logs = server.drain_lines().join("\n");
            panic!(
                "wanted a share of {want:?} within {within:?}, still {last:?}\nsluice log:\n{logs}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = share(server);
    }
    start.elapsed()
}

/// Waits until the metric `name` is `want`.
async fn wait_metric(server: &Server, name: &str, want: f64) {
    eventually(Duration::from_secs(10), name, || async {
        server.metric(name, &[]) == Some(want)
    })
    .await;
}

/// The `/debug/policies` status of the RateLimitPolicy `namespace/name`.
fn debug_status(server: &Server, key: &str) -> serde_json::Value {
    let (_, body) = http(&server.http, "GET", "/debug/policies", "");
    let p: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let policies = p["policies"].as_array().cloned().unwrap_or_default();
    let found = policies.into_iter().find(|x| x["source"] == key);
    found.unwrap_or_else(|| panic!("{key} not in {body}"))["status"].clone()
}

/// Waits for a log line containing `text`, printed before sluice listened or since.
async fn logged(server: &Server, text: &str) {
    if !server.startup.iter().any(|l| l.contains(text)) {
        server
            .wait_line(Duration::from_secs(15), text, |l| l.contains(text))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_count_follows_the_services_endpoint_slices() {
    let Some(mut k) = Cluster::start() else {
        return;
    };
    if !common::redis::available() {
        return;
    }
    let redis = common::redis::RedisServer::start().await;
    let env = [("KUBECONFIG", k.kubeconfig.as_str())];
    let serve = |redis: &str, extra: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policy.yaml");
        std::fs::write(&file, LOCAL_POLICY).unwrap();
        let mut args = vec!["--redis", redis];
        args.extend_from_slice(extra);
        Server::start_env(dir, &[file], &args, &env)
    };
    const FAILING: &str = "sluice_local_share_kubernetes_failing";
    // Server-side: kubectl knows the built-in kind and would send a strategic merge
    // patch, which the API server refuses for a custom resource.
    const SLICES: &[&str] = &["--server-side"];

    // Started before the API server serves EndpointSlices: a warning, the count the
    // heartbeat in Redis gives (this replica alone), and the metric says so. A bare
    // name is in the kubeconfig context's namespace (default).
    let sluice = serve(&redis.url(), &["--local-share-service", "sluice"]);
    logged(
        &sluice,
        "the API server does not serve discovery.k8s.io/v1 EndpointSlices",
    )
    .await;
    wait_share(&sluice, (1, "store"), Duration::from_secs(10)).await;
    wait_metric(&sluice, FAILING, 1.0).await;

    k.serve_endpoint_slices().await;
    // Three ready pods (one without conditions), and another Service's slice.
    let three = [
        ("p1", "10.0.0.1", Some(true)),
        ("p2", "10.0.0.2", Some(true)),
        ("p3", "10.0.0.3", None),
    ];
    let established = Instant::now();
    k.apply_new_kind(SLICES, &endpoint_slice("sluice-a", "sluice", &three))
        .await;
    k.apply_with(
        SLICES,
        &endpoint_slice("other-a", "other", &[("q1", "10.0.1.1", Some(true))]),
    )
    .unwrap();
    // Within the watch's back-off (at most 5 s) of the API appearing.
    wait_share(&sluice, (3, "kubernetes"), Duration::from_secs(15)).await;
    let took = established.elapsed();
    eprintln!("count from the EndpointSlice API {took:?} after it was established");
    assert_eq!(sluice.metric("sluice_local_share", &[]), Some(3.0));
    assert_eq!(
        sluice.metric("sluice_local_share_kubernetes", &[]),
        Some(3.0)
    );
    assert_eq!(sluice.metric("sluice_local_share_learned", &[]), Some(1.0));
    assert_eq!(sluice.metric(FAILING, &[]), Some(0.0));

    // A fourth pod; then one of them not ready.
    let mut four = three.to_vec();
    four.push(("p4", "10.0.0.4", Some(true)));
    k.apply_with(SLICES, &endpoint_slice("sluice-a", "sluice", &four))
        .unwrap();
    let took = wait_share(&sluice, (4, "kubernetes"), TWO_S).await;
    eprintln!("a fourth endpoint counted after {took:?}");
    four[1].2 = Some(false);
    k.apply_with(SLICES, &endpoint_slice("sluice-a", "sluice", &four))
        .unwrap();
    wait_share(&sluice, (3, "kubernetes"), TWO_S).await;
    // A second slice: the same pods' other addresses count once, a new pod counts.
    let second = [
        ("p1", "10.0.2.1", Some(true)),
        ("p3", "10.0.2.3", Some(true)),
        ("p5", "10.0.2.5", Some(true)),
    ];
    k.apply_with(SLICES, &endpoint_slice("sluice-b", "sluice", &second))
        .unwrap();
    wait_share(&sluice, (4, "kubernetes"), TWO_S).await;
    assert_eq!(sluice.metric("sluice_local_share", &[]), Some(4.0));

    // No slice left: Kubernetes gives no count, the store's stands.
    k.must(&[
        "delete",
        "endpointslices.discovery.k8s.io",
        "sluice-a",
        "sluice-b",
    ]);
    wait_share(&sluice, (1, "store"), TWO_S).await;
    assert_eq!(
        sluice.metric("sluice_local_share_kubernetes", &[]),
        Some(0.0)
    );

    // The API server goes away: a warning, the last count stands, nothing stops.
    k.apply_with(SLICES, &endpoint_slice("sluice-a", "sluice", &three))
        .unwrap();
    wait_share(&sluice, (3, "kubernetes"), TWO_S).await;
    let ports = ["KUBE_APISERVER_PORT", "ETCD_CLIENT_PORT", "ETCD_PEER_PORT"].map(|v| k.var(v));
    k.stop();
    logged(&sluice, "cannot read the Service's EndpointSlices").await;
    wait_metric(&sluice, FAILING, 1.0).await;
    assert_eq!(share(&sluice), (3, "kubernetes".to_string()));
    assert_eq!(http(&sluice.http, "GET", "/healthz", "").0, 200);

    // A replica started meanwhile, its Redis away too: the configured count.
    let lonely = serve(
        "redis://127.0.0.1:1",
        &[
            "--local-share-replicas",
            "2",
            "--local-share-service",
            "default/sluice",
        ],
    );
    logged(&lonely, "cannot read the Service's EndpointSlices").await;
    wait_metric(&lonely, FAILING, 1.0).await;
    assert_eq!(share(&lonely), (2, "configured".to_string()));
    assert_eq!(http(&lonely.http, "GET", "/healthz", "").0, 200);

    // The API server back (same ports and data): both watches recover by themselves.
    k.run_script(&[
        ("SLUICE_KUBE_APISERVER_PORT", &ports[0]),
        ("SLUICE_ETCD_CLIENT_PORT", &ports[1]),
        ("SLUICE_ETCD_PEER_PORT", &ports[2]),
    ]);
    wait_share(&lonely, (3, "kubernetes"), Duration::from_secs(20)).await;
    wait_metric(&sluice, FAILING, 0.0).await;
    wait_metric(&lonely, FAILING, 0.0).await;
    assert_eq!(share(&sluice), (3, "kubernetes".to_string()));
}

/// Many policies arriving or leaving at once (a team's manifests applied, a
/// namespace deleted) do not hold back an edit made right after: the edit takes
/// effect within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_after_a_burst_of_policies_takes_effect_within_2_s() {
    let Some(k) = Cluster::start() else {
        return;
    };
    k.install_crd_with(&per_minute("ops", "edit", "ops", "user", 2))
        .await;
    let env = [("KUBECONFIG", k.kubeconfig.as_str())];
    let server = Server::start_env(tempfile::tempdir().unwrap(), &[], &["--kube"], &env);
    wait_limit(&server, "ops", "user", Some(2), Duration::from_secs(15)).await;

    const BURST: usize = 400;
    let burst: String = (0..BURST)
        .map(|i| {
            let name = format!("p{i}");
            let domain = format!("d{i}");
            format!("---\n{}", per_minute("burst", &name, &domain, "user", 5))
        })
        .collect();
    k.must_with(&["create", "--validate=false", "-f", "-"], &burst);
    // kubectl has returned: every policy of the burst is stored, and sluice may
    // still be working through their events.
    k.apply(&per_minute("ops", "edit", "ops", "user", 3))
        .expect("the edit applies");
    wait_limit(&server, "ops", "user", Some(3), TWO_S).await;
    k.wait_accepted("ops", "edit", "True/Accepted", STATUS)
        .await;
    // The burst itself is served, and every policy gets its status.
    let last = format!("d{}", BURST - 1);
    wait_limit(&server, &last, "user", Some(5), Duration::from_secs(60)).await;
    let name = format!("p{}", BURST - 1);
    k.wait_accepted("burst", &name, "True/Accepted", Duration::from_secs(60))
        .await;
    wait_limit(&server, "d0", "user", Some(5), TWO_S).await;
    k.wait_accepted("burst", "p0", "True/Accepted", STATUS)
        .await;

    // The whole namespace's policies deleted in one call, as deleting a namespace
    // does: every delete event arrives at once.
    k.must(&[
        "delete",
        "ratelimitpolicies.sluice.dev",
        "--all",
        "-n",
        "burst",
        "--wait=false",
    ]);
    k.apply(&per_minute("ops", "edit", "ops", "user", 4))
        .expect("the edit applies");
    wait_limit(&server, "ops", "user", Some(4), TWO_S).await;
    wait_limit(&server, &last, "user", None, TWO_S).await;
    wait_limit(&server, "d0", "user", None, TWO_S).await;
}

/// A policy whose spec nests deeper than a JSON reader builds values for (here
/// under a descriptor's `metadata`, which the schema leaves open) is `Invalid`
/// alone: the other policies of the cluster are served, whether it is there when
/// sluice starts or arrives while it watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_too_deep_to_read_is_invalid_alone() {
    let Some(k) = Cluster::start() else {
        return;
    };
    k.install_crd().await;
    let deep = |name: &str| {
        let nested = format!("{}1{}", "{\"a\":".repeat(200), "}".repeat(200));
        format!(
            "{{\"apiVersion\":\"sluice.dev/v1alpha1\",\"kind\":\"RateLimitPolicy\",\
             \"metadata\":{{\"name\":\"{name}\",\"namespace\":\"ops\"}},\
             \"spec\":{{\"domain\":\"{name}\",\"descriptors\":[{{\"key\":\"user\",\
             \"rateLimit\":{{\"unit\":\"minute\",\"requestsPerUnit\":1}},\"metadata\":{nested}}}]}}}}"
        )
    };
    k.apply_new_kind(
        &["--validate=false"],
        &per_minute("ops", "good", "ops", "user", 2),
    )
    .await;
    k.must_with(&["create", "--validate=false", "-f", "-"], &deep("deep1"));
    let env = [("KUBECONFIG", k.kubeconfig.as_str())];
    let server = Server::start_env(tempfile::tempdir().unwrap(), &[], &["--kube"], &env);
    wait_limit(&server, "ops", "user", Some(2), Duration::from_secs(15)).await;
    let status = k
        .wait_accepted("ops", "deep1", "False/Invalid", STATUS)
        .await;
    assert!(status.contains("spec cannot be read"), "{status}");
    assert_eq!(limit(&server, "deep1", "user").await, None);

    k.must_with(&["create", "--validate=false", "-f", "-"], &deep("deep2"));
    k.apply(&per_minute("ops", "good", "ops", "user", 3))
        .expect("the edit applies");
    wait_limit(&server, "ops", "user", Some(3), TWO_S).await;
    k.wait_accepted("ops", "deep2", "False/Invalid", STATUS)
        .await;
}

/// Statuses sluice cannot write while the API server is away (here: policies a
/// file now clashes with) are retried until it is back; the log says once that it
/// cannot reach the API server, not once per policy and retry, and once that it
/// writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_the_api_server_cannot_take_are_retried_and_the_outage_logged_once() {
    let Some(mut k) = Cluster::start() else {
        return;
    };
    let names = ["a", "b", "c"];
    k.install_crd_with(&per_minute("ops", "a", "da", "user", 2))
        .await;
    for name in &names[1..] {
        k.apply(&per_minute("ops", name, &format!("d{name}"), "user", 2))
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("files.yaml");
    std::fs::write(&file, "domain: other\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n").unwrap();
    let env = [("KUBECONFIG", k.kubeconfig.as_str())];
    let server = Server::start_env(dir, std::slice::from_ref(&file), &["--kube"], &env);
    for name in names {
        k.wait_accepted("ops", name, "True/Accepted", Duration::from_secs(15))
            .await;
    }

    let port = k.var("KUBE_APISERVER_PORT");
    let etcd = k.var("ETCD_CLIENT_PORT");
    let peer = k.var("ETCD_PEER_PORT");
    k.stop();
    // The file takes the three domains: each policy is now Conflicted, which sluice
    // cannot write yet.
    let clash: String = names
        .iter()
        .map(|n| format!("---\ndomain: d{n}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 7}}\n"))
        .collect();
    write_atomic(&file, &clash);
    wait_limit(&server, "dc", "user", Some(7), Duration::from_secs(15)).await;
    let mut lines = server
        .wait_line(Duration::from_secs(30), "the API server unreachable", |l| {
            l.contains("cannot reach the API server")
        })
        .await;
    k.run_script(&[
        ("SLUICE_KUBE_APISERVER_PORT", &port),
        ("SLUICE_ETCD_CLIENT_PORT", &etcd),
        ("SLUICE_ETCD_PEER_PORT", &peer),
    ]);
    lines.extend(
        server
            .wait_line(Duration::from_secs(60), "statuses written again", |l| {
                l.contains("writing RateLimitPolicy statuses again")
            })
            .await,
    );
    for name in names {
        k.wait_accepted("ops", name, "False/Conflicted", STATUS)
            .await;
    }
    lines.extend(server.drain_lines());
    let count = |text: &str| lines.iter().filter(|l| l.contains(text)).count();
    assert_eq!(count("cannot reach the API server"), 1, "{lines:#?}");
    assert_eq!(count("cannot write status"), 0, "{lines:#?}");
    assert_eq!(
        count("writing RateLimitPolicy statuses again"),
        1,
        "{lines:#?}"
    );
}

/// Status writes the API server refuses for good (here: a 403, as RBAC without
/// `ratelimitpolicies/status` answers) are retried, but each policy's refusal is
/// logged once, not at every retry; once a write is taken, a later refusal is
/// logged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_status_write_is_logged_once_per_policy_however_often_retried() {
    let Some(k) = Cluster::start() else {
        return;
    };
    let names = ["a", "b"];
    k.install_crd_with(&per_minute("ops", "a", "da", "user", 2))
        .await;
    k.apply(&per_minute("ops", "b", "db", "user", 2)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let refuse = dir.path().join("refuse");
    std::fs::write(&refuse, "").unwrap();
    let (_proxy, kubeconfig) = RefusingProxy::start(&k, &refuse);
    let env = [("KUBECONFIG", kubeconfig.to_str().unwrap())];
    let server = Server::start_env(dir, &[], &["--kube"], &env);
    wait_limit(&server, "db", "user", Some(2), Duration::from_secs(15)).await;
    // Three refused writes of each policy: two retries after the first refusal.
    let count = refuse.with_extension("count");
    let refused = |name: &str| {
        std::fs::read_to_string(&count)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == name)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    while names.iter().any(|n| refused(n) < 3) {
        assert!(Instant::now() < deadline, "status writes not retried");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lines = server.drain_lines();
    for name in names {
        let policy = format!("ops/{name}");
        let logged = lines
            .iter()
            .filter(|l| l.contains("cannot write status") && l.contains(&policy))
            .count();
        assert_eq!(logged, 1, "{name}: {lines:#?}");
    }

    // Allowed again: written, and a new refusal is news.
    std::fs::remove_file(&refuse).unwrap();
    k.wait_accepted("ops", "a", "True/Accepted", Duration::from_secs(15))
        .await;
    std::fs::write(&refuse, "").unwrap();
    k.apply(&per_minute("ops", "a", "da", "user", 3)).unwrap();
    server
        .wait_line(Duration::from_secs(15), "a refusal after a write", |l| {
            l.contains("cannot write status") && l.contains("ops/a")
        })
        .await;
}

/// The watch's return after an API server outage is logged when the watch is back,
/// not at the next change of a policy: here no policy changes at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_watch_is_logged_when_it_is_back_without_a_change() {
    let Some(mut k) = Cluster::start() else {
        return;
    };
    k.install_crd_with(&per_minute("ops", "a", "da", "user", 2))
        .await;
    let server = k.serve_accepted("ops", "a").await;

    let port = k.var("KUBE_APISERVER_PORT");
    let etcd = k.var("ETCD_CLIENT_PORT");
    let peer = k.var("ETCD_PEER_PORT");
    k.stop();
    server
        .wait_line(Duration::from_secs(30), "the watch failing", |l| {
            l.contains("RateLimitPolicy watch failed")
        })
        .await;
    k.run_script(&[
        ("SLUICE_KUBE_APISERVER_PORT", &port),
        ("SLUICE_ETCD_CLIENT_PORT", &etcd),
        ("SLUICE_ETCD_PEER_PORT", &peer),
    ]);
    // The back-off is at most 5 s; the API server is up once the script returns.
    server
        .wait_line(Duration::from_secs(20), "the watch restored", |l| {
            l.contains("RateLimitPolicy watch restored")
        })
        .await;
    assert_eq!(limit(&server, "da", "user").await, Some(2));
}

/// A TCP proxy to the API server that a test can cut: sluice's connections go
/// through it, kubectl's do not, so the cluster changes while sluice's watch is down.
struct Cut {
    addr: std::net::SocketAddr,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Cut {
    async fn start(to: String) -> Cut {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (o, c) = (open.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !o.load(Ordering::SeqCst) {
                    continue;
                }
                let to = to.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&to).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                c.lock().unwrap().push(task.abort_handle());
            }
        });
        Cut { addr, open, conns }
    }

    /// Closes every connection and refuses new ones until [`Cut::restore`].
    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Edits made while sluice's watch was down reach it as one event per missed
/// version when the watch resumes; each policy's status is written once, with its
/// final state, not once per version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_watch_writes_each_status_once_with_its_final_state() {
    let Some(k) = Cluster::start() else {
        return;
    };
    k.install_crd_with(&per_minute("ops", "a", "da", "user", 2))
        .await;
    let port = k.var("KUBE_APISERVER_PORT");
    let proxy = Cut::start(format!("127.0.0.1:{port}")).await;
    let kubeconfig = std::fs::read_to_string(&k.kubeconfig).unwrap().replace(
        &format!("https://127.0.0.1:{port}"),
        &format!("https://{}", proxy.addr),
    );
    let dir = tempfile::tempdir().unwrap();
    let through = dir.path().join("kubeconfig");
    std::fs::write(&through, kubeconfig).unwrap();
    let env = [("KUBECONFIG", through.to_str().unwrap())];
    let server = Server::start_env(dir, &[], &["--kube"], &env);
    k.wait_accepted("ops", "a", "True/Accepted", Duration::from_secs(15))
        .await;

    proxy.cut();
    server
        .wait_line(Duration::from_secs(30), "the watch failing", |l| {
            l.contains("RateLimitPolicy watch failed")
        })
        .await;
    for n in 3..=8 {
        k.apply(&per_minute("ops", "a", "da", "user", n)).unwrap();
    }
    let before = k.jsonpath("ops", "a", "{.metadata.resourceVersion}");
    proxy.restore();
    wait_limit(&server, "da", "user", Some(8), Duration::from_secs(20)).await;
    k.wait_accepted("ops", "a", "True/Accepted", STATUS).await;

    // Every change of the object since the last edit: a watch from its version,
    // which the API server ends after a second.
    let path = format!(
        "/apis/sluice.dev/v1alpha1/namespaces/ops/ratelimitpolicies?watch=true&resourceVersion={before}&timeoutSeconds=1&fieldSelector=metadata.name%3Da"
    );
    let events = k.must(&["get", "--raw", &path]);
    let writes: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&events)
        .into_iter()
        .map(|e| e.expect("a watch event"))
        .collect();
    let generations: Vec<_> = writes
        .iter()
        .map(|e| e["object"]["status"]["observedGeneration"].clone())
        .collect();
    assert_eq!(
        writes.len(),
        1,
        "status writes after the edits (observedGeneration of each): {generations:?}"
    );
}

/// tests/kube-refusing-proxy.py in front of the test API server, killed however
/// the test ends.
struct RefusingProxy(std::process::Child);

impl RefusingProxy {
    /// Starts it with its control file `refuse`; returns it and a kubeconfig
    /// (beside `refuse`) that reaches the API server through it.
    fn start(k: &Cluster, refuse: &Path) -> (RefusingProxy, PathBuf) {
        let mut proxy = Command::new("python3")
            .arg(repo().join("tests/kube-refusing-proxy.py"))
            .args([&k.var("KUBE_APISERVER_URL"), &k.var("KUBE_TEST_DIR")])
            .arg(refuse)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        let stdout = proxy.stdout.take().unwrap();
        let proxy = RefusingProxy(proxy);
        let mut port = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut port)
            .expect("the proxy's port");
        let kubeconfig = refuse.with_file_name("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{}\n\
                 contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n",
                port.trim()
            ),
        )
        .unwrap();
        (proxy, kubeconfig)
    }
}

impl Drop for RefusingProxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Another controller's conditions on a policy (a gateway's `Programmed`, say)
/// survive Sluice's status writes: Sluice writes its `Accepted` condition only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_controllers_conditions_are_kept() {
    let Some(k) = Cluster::start() else {
        return;
    };
    k.install_crd_with(&per_minute("ops", "a", "da", "user", 2))
        .await;
    let server = k.serve_accepted("ops", "a").await;

    // The other controller adds its condition beside Sluice's, as it read them.
    k.add_programmed("ops", "a");
    let programmed = "{.status.conditions[?(@.type==\"Programmed\")].status}";
    assert_eq!(k.jsonpath("ops", "a", programmed), "True");

    // An edit Sluice refuses, then one it takes: two status writes of its own.
    let dup = "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: a, namespace: ops}\n\
               spec:\n  domain: da\n  descriptors:\n    - {key: user, rateLimit: {unit: minute, requestsPerUnit: 9}}\n    - {key: user, rateLimit: {unit: minute, requestsPerUnit: 8}}\n";
    k.apply(dup).unwrap();
    k.wait_accepted("ops", "a", "False/Invalid", STATUS).await;
    assert_eq!(k.jsonpath("ops", "a", programmed), "True", "after Invalid");
    k.apply(&per_minute("ops", "a", "da", "user", 3)).unwrap();
    k.wait_accepted("ops", "a", "True/Accepted", STATUS).await;
    wait_limit(&server, "da", "user", Some(3), TWO_S).await;
    assert_eq!(k.jsonpath("ops", "a", programmed), "True", "after Accepted");
    let types = k.jsonpath("ops", "a", "{.status.conditions[*].type}");
    assert_eq!(types, "Accepted Programmed");
}

/// Sluice's requests to the API server say who makes them: the audit log records
/// the User-Agent `sluice/VERSION` with each list, watch and status write of
/// RateLimitPolicies, where an operator would otherwise find a blank. And those are
/// all the rights it takes: deploy/rbac.yaml grants exactly these verbs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_servers_audit_log_names_sluice_and_the_verbs_its_role_grants() {
    let Some(k) = Cluster::start_audited() else {
        return;
    };
    k.install_crd_with(&per_minute("ops", "a", "da", "user", 2))
        .await;
    let _server = k.serve_accepted("ops", "a").await;
    // Every request but kubectl's (the test's own) on the policies is Sluice's.
    let sluices = || {
        k.audit()
            .into_iter()
            .filter(|e| e["objectRef"]["resource"] == "ratelimitpolicies")
            .filter(|e| {
                let agent = e["userAgent"].as_str().unwrap_or("");
                !agent.starts_with("kubectl")
            })
            .collect::<Vec<_>>()
    };
    let verbs = |events: &[serde_json::Value]| {
        ["list", "watch", "patch"]
            .iter()
            .all(|v| events.iter().any(|e| e["verb"] == *v))
    };
    eventually(
        STATUS,
        "the list, watch and status write audited",
        || async { verbs(&sluices()) },
    )
    .await;
    let agent = format!("sluice/{}", env!("CARGO_PKG_VERSION"));
    let mut used = std::collections::BTreeSet::new();
    for e in sluices() {
        assert_eq!(e["userAgent"], agent.as_str(), "{e}");
        let resource = match e["objectRef"]["subresource"].as_str() {
            Some(sub) => format!("ratelimitpolicies/{sub}"),
            None => "ratelimitpolicies".to_string(),
        };
        used.insert((resource, e["verb"].as_str().unwrap().to_string()));
    }
    assert_eq!(used, granted_by_deploy_rbac());
}

/// The (resource, verb) pairs deploy/rbac.yaml's ClusterRole grants.
fn granted_by_deploy_rbac() -> std::collections::BTreeSet<(String, String)> {
    use yaml_rust2::YamlLoader;
    let text = std::fs::read_to_string(repo().join("deploy/rbac.yaml")).unwrap();
    let docs = YamlLoader::load_from_str(&text).expect("deploy/rbac.yaml is YAML");
    let role = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("ClusterRole"))
        .expect("a ClusterRole");
    let mut granted = std::collections::BTreeSet::new();
    for rule in role["rules"].as_vec().expect("rules") {
        for resource in rule["resources"].as_vec().expect("resources") {
            for verb in rule["verbs"].as_vec().expect("verbs") {
                let pair = (resource.as_str().unwrap(), verb.as_str().unwrap());
                granted.insert((pair.0.to_string(), pair.1.to_string()));
            }
        }
    }
    granted
}

/// With `--local-share-service`, Sluice only lists and watches the Service's
/// EndpointSlices: the Role the chart gives it for them grants exactly that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_slices_are_read_with_the_verbs_the_charts_role_grants() {
    let Some(k) = Cluster::start_audited() else {
        return;
    };
    if !common::redis::available() {
        return;
    }
    let redis = common::redis::RedisServer::start().await;
    k.serve_endpoint_slices().await;
    let two = [
        ("p1", "10.0.0.1", Some(true)),
        ("p2", "10.0.0.2", Some(true)),
    ];
    k.apply_new_kind(
        &["--server-side"],
        &endpoint_slice("sluice-a", "sluice", &two),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, LOCAL_POLICY).unwrap();
    let env = [("KUBECONFIG", k.kubeconfig.as_str())];
    let args = ["--redis", &redis.url(), "--local-share-service", "sluice"];
    let sluice = Server::start_env(dir, &[file], &args, &env);
    wait_share(&sluice, (2, "kubernetes"), Duration::from_secs(15)).await;
    let agent = format!("sluice/{}", env!("CARGO_PKG_VERSION"));
    let verbs = || {
        k.audit()
            .into_iter()
            .filter(|e| e["objectRef"]["resource"] == "endpointslices")
            .filter(|e| e["userAgent"] == agent.as_str())
            .map(|e| e["verb"].as_str().unwrap_or_default().to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    eventually(STATUS, "the list and the watch audited", || async {
        verbs().len() >= 2
    })
    .await;
    assert_eq!(verbs(), granted_by_chart_endpointslice_role());
}

/// The verbs the chart's Role for EndpointSlices grants (its one `verbs:` line).
fn granted_by_chart_endpointslice_role() -> std::collections::BTreeSet<String> {
    let path = repo().join("charts/sluice/templates/rbac-endpointslices.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("verbs:"))
        .expect("a verbs: line");
    serde_json::from_str::<Vec<String>>(line.trim())
        .expect("verbs as a flow list")
        .into_iter()
        .collect()
}

/// A status write made from an older version of the object than the API server
/// holds (the other controller wrote its condition while Sluice's write was on
/// its way) does not undo that change: it is refused, and Sluice writes again
/// from the newer version, quietly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_that_raced_another_is_written_again() {
    let Some(k) = Cluster::start() else {
        return;
    };
    k.install_crd_with(&per_minute("ops", "a", "da", "user", 2))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let refuse = dir.path().join("refuse");
    let (_proxy, kubeconfig) = RefusingProxy::start(&k, &refuse);
    let env = [("KUBECONFIG", kubeconfig.to_str().unwrap())];
    let server = Server::start_env(dir, &[], &["--kube"], &env);
    k.wait_accepted("ops", "a", "True/Accepted", Duration::from_secs(15))
        .await;

    // Sluice's write for an edit is held on its way...
    let hold = refuse.with_extension("hold");
    std::fs::write(&hold, "").unwrap();
    k.apply(&per_minute("ops", "a", "da", "user", 3)).unwrap();
    wait_limit(&server, "da", "user", Some(3), TWO_S).await;
    let held = refuse.with_extension("held");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !held.exists() {
        assert!(Instant::now() < deadline, "no status write held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ...while the other controller adds its condition to what it read.
    k.add_programmed("ops", "a");
    std::fs::remove_file(&hold).unwrap();

    k.wait_accepted("ops", "a", "True/Accepted", STATUS).await;
    let programmed = "{.status.conditions[?(@.type==\"Programmed\")].status}";
    assert_eq!(k.jsonpath("ops", "a", programmed), "True");
    let lines = server.drain_lines();
    assert!(
        !lines.iter().any(|l| l.contains("cannot write status")),
        "{lines:#?}"
    );
}

#[test]
fn committed_crd_is_what_sluice_crd_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("crd")
        .output()
        .expect("run sluice crd");
    assert!(out.status.success());
    let committed = std::fs::read_to_string(repo().join("crds/ratelimitpolicies.yaml")).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout) == committed,
        "crds/ratelimitpolicies.yaml differs from `sluice crd`: regenerate it with `cargo run -q -- crd > crds/ratelimitpolicies.yaml`"
    );
}

#[test]
fn both_examples_hold_the_same_limits() {
    let load = |name: &str| {
        let (policy, _docs) = sluice::policy::load_paths(&[repo().join(name)])
            .unwrap_or_else(|e| panic!("{name}: {e:#?}"));
        let mut rules: Vec<String> = policy
            .rules
            .iter()
            .map(|r| {
                format!(
                    "{} {:?} {:?} {} {:?}",
                    r.path, r.limit, r.layer, r.shadow_mode, r.penalty
                )
            })
            .collect();
        rules.sort();
        rules
    };
    assert_eq!(
        load("examples/policy.yaml"),
        load("examples/envoy-ratelimit.yaml")
    );
}
