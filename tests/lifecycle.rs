//! Process lifecycle: ConfigMap-style reloads, SIGHUP and graceful SIGTERM.

use crate::common;

use std::os::unix::fs::symlink;
use std::time::Duration;

use common::*;

fn policy(rpu: u32) -> String {
    format!(
        "domain: cm\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n  - key: q\n    rate_limit: {{unit: second, requests_per_unit: 1, algorithm: leaky_bucket, burst: 4}}\n"
    )
}

/// Waits up to `within` for `server` to answer `k=v` of domain `cm` with a limit of
/// `rpu` requests per unit (asking with no hits, so nothing is spent).
async fn served_limit(server: &Server, within: Duration, what: &str, rpu: u32) {
    let c = server.client().await;
    eventually(within, what, || {
        let mut c = c.clone();
        async move {
            let r = call(&mut c, request("cm", vec![desc_hits(&[("k", "v")], 0)])).await;
            r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit)
                == Some(rpu)
        }
    })
    .await;
}

#[tokio::test]
async fn a_mounted_configmap_update_is_seen_within_two_seconds() {
    // Kubernetes mounts a ConfigMap as `policy.yaml -> ..data/policy.yaml` with
    // `..data -> ..<timestamp>`, and updates it by swapping the `..data` link.
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("mount");
    std::fs::create_dir_all(mount.join("..v1")).unwrap();
    std::fs::write(mount.join("..v1/policy.yaml"), policy(5)).unwrap();
    symlink("..v1", mount.join("..data")).unwrap();
    symlink("..data/policy.yaml", mount.join("policy.yaml")).unwrap();

    let server = Server::start_with(dir, std::slice::from_ref(&mount), &[]);
    let mut c = server.client().await;
    let limit = |r: &sluice::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    let r = call(&mut c, request("cm", vec![desc(&[("k", "v")])])).await;
    assert_eq!(limit(&r), Some(5));

    std::fs::create_dir_all(mount.join("..v2")).unwrap();
    std::fs::write(mount.join("..v2/policy.yaml"), policy(50)).unwrap();
    symlink("..v2", mount.join("..data_tmp")).unwrap();
    std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
    served_limit(
        &server,
        Duration::from_secs(2),
        "the swapped ConfigMap is served",
        50,
    )
    .await;
}

#[tokio::test]
async fn sigterm_turns_readiness_off_and_lets_in_flight_calls_finish() {
    let server = Server::start(&policy(5), &[]);
    let c = server.client().await;
    // Fill the leaky queue: the later answers are held for up to 3 s.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut c = c.clone();
        held.push(tokio::spawn(async move {
            c.should_rate_limit(request("cm", vec![desc(&[("q", "x")])]))
                .await
                .map(|r| r.into_inner().overall_code)
        }));
    }
    // All four are decided (and counted) before they are held.
    let admitted = [
        ("domain", "cm"),
        ("layer", "service"),
        ("outcome", "ok"),
        ("rule", "q"),
    ];
    eventually(Duration::from_secs(5), "four calls in the queue", || {
        let n = server.metric("sluice_requests_total", &admitted);
        async move { n == Some(4.0) }
    })
    .await;
    server.terminate();
    eventually(
        Duration::from_secs(5),
        "readiness goes false on SIGTERM",
        || async { http(&server.http, "GET", "/readyz", "").0 == 503 },
    )
    .await;
    // ...while calls are still held (the last one's turn comes 3 s after the first).
    assert!(
        held.iter().any(|h| !h.is_finished()),
        "readiness went false only after every call was answered"
    );
    for h in held {
        assert_eq!(h.await.unwrap().expect("in-flight call finished"), OK);
    }
    let mut server = server;
    let status = server.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn sigterm_as_soon_as_it_listens_is_a_graceful_stop() {
    // The handler is installed before sluice says it listens; it used to be
    // installed a moment after, and a SIGTERM in between killed the process.
    for _ in 0..5 {
        let mut server = Server::start(&policy(5), &["--drain-delay", "0s"]);
        server.terminate();
        let status = server.wait_exit(Duration::from_secs(10)).await;
        assert!(status.success(), "{status:?}");
    }
}

/// A second signal during the drain ends the process at once: an operator who
/// presses Ctrl-C again does not wait out `--drain-delay`.
#[tokio::test]
async fn a_second_signal_during_the_drain_exits_at_once() {
    for second in [libc::SIGTERM, libc::SIGINT] {
        let mut server = Server::start(&policy(5), &["--drain-delay", "60s"]);
        server.terminate();
        eventually(Duration::from_secs(5), "draining after SIGTERM", || async {
            http(&server.http, "GET", "/readyz", "").0 == 503
        })
        .await;
        assert!(server.try_exit().is_none(), "exited before the drain delay");
        server.signal(second);
        let status = server.wait_exit(Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(1), "{status:?}");
        server
            .wait_line(Duration::from_secs(5), "the second signal logged", |l| {
                l.contains("second signal")
            })
            .await;
    }
}

/// SIGHUP reads the policy and TLS files at once (here the reload interval is an
/// hour), and the process serves on: it used to end it, undrained.
#[tokio::test]
async fn sighup_reads_the_files_at_once_and_keeps_serving() {
    use common::tls::{client_config, der, served, Ca, SecretVolume};
    let ca = Ca::new("hup-ca");
    let (first, second) = (ca.server(), ca.server());
    let volume = SecretVolume::new(&first, None);
    let (cert, key) = (volume.path("tls.crt"), volume.path("tls.key"));
    let mut server = Server::start(
        &policy(5),
        &[
            "--reload-interval",
            "1h",
            "--grpc-tls-cert",
            cert.to_str().unwrap(),
            "--grpc-tls-key",
            key.to_str().unwrap(),
        ],
    );
    let config = client_config(&ca.cert(), None, b"h2");
    assert_eq!(
        served(&server.grpc, config.clone()).await.unwrap(),
        der(&first.cert)
    );
    // The first poll runs as the process starts; edits made after it wait an hour.
    let path = server.policy_path();
    write_atomic(&path, &policy(50));
    volume.update(&second, None);
    server.signal(libc::SIGHUP);
    server
        .wait_line(Duration::from_secs(5), "the policy reloaded", |l| {
            l.contains("policy reloaded from files")
        })
        .await;
    let want = der(&second.cert);
    eventually(Duration::from_secs(5), "the new certificate serves", || {
        let (config, grpc, want) = (config.clone(), server.grpc.clone(), want.clone());
        async move { served(&grpc, config).await.is_ok_and(|c| c == want) }
    })
    .await;
    // The start's load and the SIGHUP's; counted just after the policy serves.
    let reloads = || {
        server.metric(
            "sluice_policy_reloads_total",
            &[("source", "file"), ("result", "ok")],
        )
    };
    eventually(Duration::from_secs(5), "two loads counted", || async {
        reloads() == Some(2.0)
    })
    .await;
    assert!(server.try_exit().is_none(), "SIGHUP ended the process");
}

/// A reload that brings two resources of one name and namespace (which `kubectl
/// apply` would collapse into one) is refused, and the last good policy serves on.
#[tokio::test]
async fn a_reload_with_two_resources_of_one_name_keeps_the_last_good_policy() {
    let mut server = Server::start(&policy(5), &["--reload-interval", "1h"]);
    let resource = |domain: &str, rpu: u32| {
        format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\n\
             metadata: {{name: a, namespace: shop}}\nspec:\n  domain: {domain}\n  \
             descriptors:\n    - key: k\n      rateLimit: {{unit: minute, requestsPerUnit: {rpu}}}\n"
        )
    };
    let path = server.policy_path();
    write_atomic(
        &path,
        &format!("{}---\n{}", resource("cm", 50), resource("other", 50)),
    );
    server.signal(libc::SIGHUP);
    server
        .wait_line(Duration::from_secs(5), "the reload refused", |l| {
            l.contains("policy refused") && l.contains("duplicate RateLimitPolicy 'a'")
        })
        .await;
    let mut c = server.client().await;
    let r = call(&mut c, request("cm", vec![desc_hits(&[("k", "v")], 0)])).await;
    let served = r.statuses[0].current_limit.as_ref();
    assert_eq!(served.map(|l| l.requests_per_unit), Some(5), "{r:?}");
    assert!(
        server.try_exit().is_none(),
        "the refused reload ended the process"
    );
}

/// A reload that brings limits replacing each other, or a fractional count, is
/// refused with the words `sluice validate` prints for the same file, and the last
/// good policy serves on.
#[tokio::test]
async fn a_reload_of_a_bad_policy_logs_what_validate_says_and_keeps_the_last_good() {
    let server = Server::start(&policy(5), &["--reload-interval", "1h"]);
    let path = server.policy_path();
    for bad in [
        "domain: cm\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 50, name: x, replaces: [{name: y}]}\n  - key: q\n    rate_limit: {unit: minute, requests_per_unit: 50, name: y, replaces: [{name: x}]}\n",
        "domain: cm\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 0.99999999999999999}\n",
    ] {
        write_atomic(&path, bad);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("validate")
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        let said = said.lines().next().unwrap().to_string();
        server.signal(libc::SIGHUP);
        server
            .wait_line(Duration::from_secs(5), "the reload refused", |l| {
                l.contains("policy refused") && l.contains(&said)
            })
            .await;
        let mut c = server.client().await;
        let r = call(&mut c, request("cm", vec![desc_hits(&[("k", "v")], 0)])).await;
        let served = r.statuses[0].current_limit.as_ref();
        assert_eq!(served.map(|l| l.requests_per_unit), Some(5), "{r:?}");
    }
}

/// A poll that cannot open the files because the process is out of file descriptors
/// says nothing of the files: it is not a refused policy (which would tell the
/// operator to fix a file that is fine and fire SluicePolicyReloadRefused), and the
/// files are read again once descriptors are free.
#[tokio::test]
async fn a_poll_starved_of_file_descriptors_refuses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, policy(5)).unwrap();
    // The gRPC port may take every descriptor (its default cap keeps a quarter
    // free), and holds silent connections long enough.
    let flags = [
        "--grpc-max-connections",
        "1000",
        "--handshake-timeout",
        "60s",
    ];
    let mut cmd = Server::command(&[path], &flags, &[]);
    limit_open_files(&mut cmd, 64);
    let server = Server::spawn(cmd, dir);

    // Silent connections until sluice has no descriptor left for the policy file.
    let mut held = Vec::new();
    for _ in 0..80 {
        held.push(std::net::TcpStream::connect(&server.grpc).unwrap());
    }
    server
        .wait_line(Duration::from_secs(10), "the starved poll", |l| {
            l.contains("policy files cannot be read for now")
        })
        .await;
    drop(held);
    let lines = server
        .wait_line(Duration::from_secs(10), "the files read again", |l| {
            l.contains("policy files can be read again")
        })
        .await;
    assert!(
        !lines.iter().any(|l| l.contains("policy refused")),
        "{lines:#?}"
    );
    // Read once descriptors are free again (the lines above say so).
    let refused = server
        .metric(
            "sluice_policy_reloads_total",
            &[("result", "error"), ("source", "file")],
        )
        .unwrap_or(0.0);
    assert_eq!(refused, 0.0, "a file that is fine was counted as refused");

    // The files are watched as before: an edit is served.
    write_atomic(&server.policy_path(), &policy(50));
    served_limit(&server, Duration::from_secs(10), "the edit served", 50).await;
}

/// A soft open-file limit far below the hard one (systemd's 1,024 under 524,288 is
/// common) is raised to the hard one at start, as Go programs such as
/// envoyproxy/ratelimit do: a fleet of Envoys gets its connections, where the
/// soft limit's share would have refused most of them.
#[tokio::test]
async fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, policy(1000)).unwrap();
    let mut cmd = Server::command(&[path], &[], &[]);
    limit_open_files_to(&mut cmd, 64, 1024);
    let server = Server::spawn(cmd, dir);
    assert!(
        server
            .startup
            .iter()
            .any(|l| l.contains("open-file limit raised") && l.contains("1024")),
        "{:#?}",
        server.startup
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(line.split_whitespace().nth(3), Some("1024"), "{line}");

    // More connections than the soft limit had descriptors, each answered.
    let mut clients = Vec::new();
    for _ in 0..80 {
        clients.push(server.client().await);
    }
    for c in &mut clients {
        let resp = call(c, request("cm", vec![desc(&[("k", "v")])])).await;
        assert_eq!(resp.overall_code, 1, "{resp:?}");
    }
}

/// A FIFO at `path`'s side, to be renamed over a policy file: sluice's next read
/// of that file blocks on it until [`feed`] writes it, so a test chooses exactly
/// what a poll reads and when.
fn fifo_beside(path: &std::path::Path, name: &str) -> std::path::PathBuf {
    let fifo = path.with_file_name(name);
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    fifo
}

/// Waits (up to 10 s) until sluice has the FIFO at `fifo` open to read, runs
/// `meanwhile` (the rest of an update, which that read will not see), then has the
/// read return `text`.
async fn feed(fifo: &std::path::Path, text: &str, meanwhile: impl FnOnce()) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // Opening a FIFO to write without blocking fails until a reader has it open.
    let mut writer = loop {
        let open = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo);
        match open {
            Ok(f) => break f,
            Err(_) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "sluice never read {}",
                    fifo.display()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    meanwhile();
    writer.write_all(text.as_bytes()).unwrap();
}

/// An edit written in place (truncated, then written, perhaps in pieces) that a
/// poll reads half way is neither refused nor served: the empty file used to be
/// refused (logged as an error, counted, and `SluicePolicyReloadRefused` firing for
/// ten minutes over an edit that was fine), and a file cut mid-number
/// (`requests_per_unit: 1000` read as `10`) used to serve until the next poll.
#[tokio::test]
async fn an_edit_read_half_written_is_neither_refused_nor_served() {
    let server = Server::start(&policy(5), &[]);
    let path = server.policy_path();
    let full = "domain: cm\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000\n";
    let cut = &full[..full.len() - 3];
    let (empty, half) = (
        fifo_beside(&path, "empty.fifo"),
        fifo_beside(&path, "half.fifo"),
    );
    std::fs::rename(&empty, &path).unwrap();
    // The first read finds the file truncated; the next one, half written; the
    // ones after, whole.
    feed(&path, "", || std::fs::rename(&half, &path).unwrap()).await;
    feed(&path, cut, || write_atomic(&path, full)).await;
    served_limit(
        &server,
        Duration::from_secs(5),
        "the whole edit serves",
        1000,
    )
    .await;

    let reloads = |result| {
        server.metric(
            "sluice_policy_reloads_total",
            &[("source", "file"), ("result", result)],
        )
    };
    // The start's load and the whole edit's, none for the half-written one (counted
    // just after the edit serves).
    eventually(Duration::from_secs(5), "two loads counted", || async {
        reloads("ok") == Some(2.0)
    })
    .await;
    assert_eq!(
        reloads("error"),
        Some(0.0),
        "a half-written file was refused"
    );
    let refused = server.metric("sluice_policy_refused", &[("source", "file")]);
    assert_eq!(refused, Some(0.0));
    let logged = server.drain_lines();
    assert!(
        !logged.iter().any(|l| l.contains("policy refused")),
        "{logged:#?}"
    );
}

/// A ConfigMap update that drops a key, read between kubelet's swap of `..data`
/// and its removal of the dropped key's link (which dangles meanwhile), is not
/// refused: it used to be, as a file that cannot be read.
#[tokio::test]
async fn a_configmap_update_read_mid_swap_is_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Read first: a file sluice's poll blocks on while the test swaps the mount.
    let other = "domain: other\ndescriptors:\n  - key: o\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let first = dir.path().join("first.yaml");
    std::fs::write(&first, other).unwrap();
    // The mount as kubelet makes it: links through `..data` to a dated directory.
    let mount = dir.path().join("mount");
    let v1 = mount.join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir_all(&v1).unwrap();
    std::fs::write(v1.join("a.yaml"), policy(5)).unwrap();
    std::fs::write(v1.join("b.yaml"), other.replace("other", "dropped")).unwrap();
    symlink(v1.file_name().unwrap(), mount.join("..data")).unwrap();
    symlink("..data/a.yaml", mount.join("a.yaml")).unwrap();
    symlink("..data/b.yaml", mount.join("b.yaml")).unwrap();
    let server = Server::start_with(dir, &[first.clone(), mount.clone()], &[]);
    served_limit(&server, Duration::from_secs(5), "the mount serves", 5).await;

    let (fifo, next) = (
        fifo_beside(&first, "first.fifo"),
        fifo_beside(&first, "next.fifo"),
    );
    std::fs::rename(&fifo, &first).unwrap();
    // kubelet's update, `b.yaml` dropped: the new dated directory and a link to it
    // renamed over `..data`, made while a poll waits on `first.yaml`, which then
    // lists the mount with `b.yaml` dangling.
    let v2 = mount.join("..2026_01_01_00_01_00.000000002");
    feed(&first, other, || {
        std::fs::create_dir(&v2).unwrap();
        std::fs::write(v2.join("a.yaml"), policy(50)).unwrap();
        symlink(v2.file_name().unwrap(), mount.join("..data_tmp")).unwrap();
        std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
        std::fs::rename(&next, &first).unwrap();
    })
    .await;
    // The next poll waits on `first.yaml` again, so that one has listed the mount:
    // kubelet now removes the dropped key's link and the old directory.
    feed(&first, other, || {
        std::fs::remove_file(mount.join("b.yaml")).unwrap();
        std::fs::remove_dir_all(&v1).unwrap();
        write_atomic(&first, other);
    })
    .await;
    served_limit(&server, Duration::from_secs(5), "the update serves", 50).await;
    let refused = server.metric(
        "sluice_policy_reloads_total",
        &[("source", "file"), ("result", "error")],
    );
    assert_eq!(refused, Some(0.0), "{:#?}", server.drain_lines());
}

/// A policy directory made unreadable (`chmod 000`) is refused with the reason,
/// not as a directory that holds no policy file (which it does), and the last good
/// policy serves on; readable again, the refusal is over, and the log says so.
#[tokio::test]
async fn a_directory_made_unreadable_is_refused_with_the_reason() {
    use std::fs::Permissions;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    std::fs::write(policies.join("policy.yaml"), policy(5)).unwrap();
    let mut cmd = Server::command(std::slice::from_ref(&policies), &[], &[]);
    // Root reads whatever the mode says: sluice runs as nobody then.
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    if unsafe { libc::geteuid() } == 0 {
        std::fs::set_permissions(dir.path(), Permissions::from_mode(0o755)).unwrap();
        cmd.uid(65534).gid(65534);
    }
    let server = Server::spawn(cmd, dir);
    served_limit(&server, Duration::from_secs(5), "the policy serves", 5).await;

    std::fs::set_permissions(&policies, Permissions::from_mode(0o000)).unwrap();
    let lines = server
        .wait_line(Duration::from_secs(10), "the refusal", |l| {
            l.contains("policy refused")
        })
        .await;
    let refusal = lines.last().unwrap();
    assert!(refusal.contains("Permission denied"), "{refusal}");
    assert!(
        !lines.iter().any(|l| l.contains("holds no policy file")),
        "{lines:#?}"
    );
    served_limit(&server, Duration::from_secs(1), "the last good policy", 5).await;

    std::fs::set_permissions(&policies, Permissions::from_mode(0o755)).unwrap();
    server
        .wait_line(Duration::from_secs(10), "the refusal over", |l| {
            l.contains("back to the policy serving")
        })
        .await;
    let refused = server.metric("sluice_policy_refused", &[("source", "file")]);
    assert_eq!(refused, Some(0.0));
}

/// The start says what it loaded, in the words and fields of a reload's line, so
/// an operator reading the log of a fresh process sees its domains and rules. A
/// rule is a descriptor as written: a `rate_limits` list of two limits is one rule,
/// and `sluice validate`, the log and `/debug/policies` count alike.
#[tokio::test]
async fn the_start_logs_how_many_domains_and_rules_the_files_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(
        &path,
        "domain: a\ndescriptors:\n\
         \x20 - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n\
         \x20 - key: q\n    rate_limits:\n\
         \x20     - {unit: second, requests_per_unit: 5}\n\
         \x20     - {unit: day, requests_per_unit: 500}\n\
         ---\ndomain: b\ndescriptors:\n\
         \x20 - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let validate = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("validate")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&validate.stdout),
        "ok: 2 domain(s), 3 rule(s)\n",
        "{}",
        String::from_utf8_lossy(&validate.stderr)
    );
    let server = Server::start_with(dir, &[path], &[]);
    let line = server
        .startup
        .iter()
        .find(|l| l.contains("policy loaded from files"))
        .unwrap_or_else(|| panic!("no load logged: {:#?}", server.startup));
    assert!(
        line.contains("domains=2") && line.contains("rules=3"),
        "{line}"
    );
    let (status, body) = http(&server.http, "GET", "/debug/policies", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let listed: usize = v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rules"].as_array().unwrap().len())
        .sum();
    assert_eq!(listed, 3, "{body}");
}

/// A datagram socket standing for systemd's, as `NOTIFY_SOCKET` names it.
fn notify_socket(dir: &std::path::Path) -> (std::os::unix::net::UnixDatagram, String) {
    let path = dir.join("notify");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (socket, path.display().to_string())
}

/// The next state sent to `socket`, waiting up to its read timeout.
fn next_state(socket: &std::os::unix::net::UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = socket
        .recv(&mut buf)
        .expect("a state sent to NOTIFY_SOCKET");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Under a systemd unit of `Type=notify` (deploy/systemd/sluice.service), Sluice
/// says it is ready once its ports answer, with a status naming them, and says it
/// is stopping at SIGTERM.
#[tokio::test]
async fn systemd_is_told_when_it_is_ready_and_when_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, socket) = notify_socket(dir.path());
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, policy(5)).unwrap();
    let mut server = Server::start_env(dir, &[path], &[], &[("NOTIFY_SOCKET", &socket)]);
    let ready = next_state(&manager);
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    let status = ready.lines().find_map(|l| l.strip_prefix("STATUS="));
    let status = status.unwrap_or_else(|| panic!("no STATUS in {ready:?}"));
    assert!(status.contains(&server.grpc), "{status}");
    assert!(status.contains(&server.http), "{status}");
    let mut c = server.client().await;
    let answer = call(&mut c, request("cm", vec![desc(&[("k", "v")])])).await;
    assert_eq!(answer.overall_code, OK);

    server.terminate();
    let stopping = next_state(&manager);
    assert!(stopping.starts_with("STOPPING=1"), "{stopping:?}");
    let status = server.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "{status:?}");
}

/// A policy that does not load stops the start before systemd is told it is ready,
/// so the unit fails rather than counting as started.
#[test]
fn a_start_that_fails_never_says_ready() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, socket) = notify_socket(dir.path());
    manager
        .set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, "domain: cm\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n").unwrap();
    let out = serve_command(&path)
        .env("NOTIFY_SOCKET", &socket)
        .output()
        .expect("run sluice");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let mut buf = [0u8; 512];
    let sent = manager.recv(&mut buf).map(|n| buf[..n].to_vec());
    assert!(sent.is_err(), "told {:?}", sent.map(String::from_utf8));
}

/// A `NOTIFY_SOCKET` nobody listens on is warned about; Sluice serves all the same.
#[tokio::test]
async fn a_service_manager_that_cannot_be_told_does_not_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("no-such-socket").display().to_string();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, policy(5)).unwrap();
    let server = Server::start_env(dir, &[path], &[], &[("NOTIFY_SOCKET", &gone)]);
    server
        .wait_line(Duration::from_secs(5), "the warning", |l| {
            l.contains("WARN") && l.contains("NOTIFY_SOCKET") && l.contains(&gone)
        })
        .await;
    let mut c = server.client().await;
    let answer = call(&mut c, request("cm", vec![desc(&[("k", "v")])])).await;
    assert_eq!(answer.overall_code, OK);
}

/// deploy/systemd/sluice.service, as systemd itself reads it: every key known and
/// well formed (`systemd-analyze verify`, with `ExecStart` pointed at this build),
/// and its sandbox rated OK by `systemd-analyze security`.
#[test]
fn the_systemd_unit_is_one_systemd_accepts_and_rates_well_sandboxed() {
    let Some(analyze) = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .into_iter()
        .map(std::path::Path::new)
        .find(|p| p.is_file())
    else {
        return common::tools::missing("systemd-analyze");
    };
    let unit = std::fs::read_to_string("deploy/systemd/sluice.service").unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/sluice serve"),
        "{unit}"
    );
    let here = unit.replace("/usr/local/bin/sluice", env!("CARGO_BIN_EXE_sluice"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.service");
    std::fs::write(&path, here).unwrap();

    let verify = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = common::tools::text(&verify);
    assert!(verify.status.success(), "{said}");
    // Unknown keys and bad values are only warned about, on stderr.
    assert!(verify.stderr.is_empty(), "{said}");

    let security = std::process::Command::new(analyze)
        .args(["security", "--offline=true"])
        .arg(&path)
        .output()
        .unwrap();
    let said = common::tools::text(&security);
    let stdout = String::from_utf8_lossy(&security.stdout);
    let level = stdout
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for sluice.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok());
    let level = level.unwrap_or_else(|| panic!("no exposure level: {said}"));
    assert!(level <= 2.0, "exposure {level} of 10: {said}");
}
