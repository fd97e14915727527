//! `sluice serve --kube` against a REAL Kubernetes API server (etcd +
//! apiextensions-apiserver, started by `scripts/kube-apiserver.sh` in a temporary
//! directory), driven with a real kubectl.
//!
//! Skips (loudly) when the API server binaries are absent, unless
//! `SLUICE_REQUIRE_KUBE` is set, as `scripts/test.sh` does after installing them
//! with `scripts/install-kube.sh`: then their absence is a failure.

mod common;

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
        cluster.run_script(&[]);
        Some(cluster)
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
        let out = self.kubectl(&["apply", "--validate=false", "-f", "-"], Some(yaml));
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn must(&self, args: &[&str]) -> String {
        let out = self.kubectl(args, None);
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
    let mut client = server.client().await;
    let r = call(&mut client, request(domain, vec![desc(&[(key, "probe")])])).await;
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
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < within {
        last = limit(server, domain, key).await;
        if last == want {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let logs = server.drain_lines().join("\n");
    panic!("{domain}/{key}: wanted limit {want:?} within {within:?}, still {last:?}\nsluice log:\n{logs}");
}

/// The policy file a server was started with.
fn repo_file(server: &Server) -> PathBuf {
    server.dir.path().join("mixed.yaml")
}

const TWO_S: Duration = Duration::from_secs(2);
/// For status conditions, read with several kubectl calls per poll.
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
    let all = Server::start_env(dir, &[file], &["--kube"], &env);
    wait_limit(&all, "mixed", "filekey", Some(3), TWO_S).await;

    // The CRD, from the committed YAML (the same `sluice crd` prints).
    let crd = repo().join("crds/ratelimitpolicies.yaml");
    k.must(&["apply", "--validate=false", "-f", crd.to_str().unwrap()]);
    // (Polled: `kubectl wait` fails at once while the CRD has no conditions yet, and
    // so does this jsonpath, which only means "not yet".)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let established = k.kubectl(
            &[
                "get",
                "crd",
                "ratelimitpolicies.sluice.dev",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
            ],
            None,
        );
        if established.status.success() && established.stdout == b"True" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the CRD never became Established"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names = k.must(&[
        "get",
        "crd",
        "ratelimitpolicies.sluice.dev",
        "-o",
        "jsonpath={.spec.names.shortNames}",
    ]);
    assert!(names.contains("rlp"), "{names}");

    // A policy: seen once the watch finds the CRD (back-off at most 5 s).
    // (Retried while kubectl's discovery does not know the new kind yet.)
    let first = per_minute("team-a", "a", "shop", "user", 2);
    let deadline = Instant::now() + Duration::from_secs(15);
    while let Err(e) = k.apply(&first) {
        assert!(Instant::now() < deadline, "first policy not applied: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_limit(&all, "shop", "user", Some(2), Duration::from_secs(15)).await;
    k.wait_accepted("team-a", "a", "True/Accepted", Duration::from_secs(5))
        .await;
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
    ] {
        let err = k
            .apply(&policy("team-a", "a", "shop", "user", rate_limit))
            .expect_err(rate_limit);
        assert!(err.contains(expect), "{rate_limit}: {err}");
    }
    assert_eq!(limit(&all, "shop", "user").await, Some(5));

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
    k.apply(&per_minute("team-a", "a", "shop", "user", 7))
        .unwrap();
    wait_limit(&all, "shop", "user", Some(7), TWO_S).await;
    k.wait_accepted("team-a", "a", "True/Accepted", STATUS)
        .await;

    // Another namespace naming the same domain: Conflicted.
    k.apply(&per_minute("team-b", "b", "shop", "other", 11))
        .unwrap();
    let cond = k
        .wait_accepted("team-b", "b", "False/Conflicted", STATUS)
        .await;
    assert!(cond.contains("belongs to namespace 'team-a'"), "{cond}");
    assert_eq!(limit(&all, "shop", "other").await, None);

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
