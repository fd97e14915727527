//! `sluice top` in a real terminal: run under tmux against a loaded server (in plain
//! text and over mutual TLS), the screen read back with `capture-pane`. tmux comes
//! from apt (scripts/test.sh); with `SLUICE_REQUIRE_TOOLS` a missing one fails.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::tls::{admin_over_mutual_tls, Ca};
use common::*;

const POLICY: &str = include_str!("fixtures/explain.yaml");

/// A tmux server of this test's own, killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new(name: &str) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            assert!(
                std::env::var_os("SLUICE_REQUIRE_TOOLS").is_none(),
                "SLUICE_REQUIRE_TOOLS is set but tmux is missing (apt-get install tmux)"
            );
            eprintln!("\n*** SKIPPED: tmux not found (apt-get install tmux) ***\n");
            return None;
        }
        Some(Tmux {
            socket: format!("sluice-top-{name}-{}", std::process::id()),
        })
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend(keys);
        assert!(self.run(&args).status.success());
    }

    /// Polls the screen until it shows every one of `texts` at once: the whole view
    /// a test asserts on, not its first panel (the panels fill from separate calls,
    /// so a frame may show the rules before the bans). Names the missing ones on
    /// timeout.
    fn wait_for_all(&self, what: &str, texts: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let screen = self.screen();
            let missing: Vec<_> = texts.iter().filter(|t| !screen.contains(*t)).collect();
            if missing.is_empty() {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {missing:?} not on the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls the screen until `ok` holds for it.
    fn wait(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "{what}; the screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

async fn load(server: &Server) {
    let mut rls = server.client().await;
    for _ in 0..6 {
        call(&mut rls, request("api", vec![desc(&[("tenant", "acme")])])).await;
    }
    // Another key of the same rule: 3 of 7 denied.
    call(&mut rls, request("api", vec![desc(&[("tenant", "zeta")])])).await;
    // A charge of 90 on another rule, within its 100 a minute: 1.5 hits a second.
    call(
        &mut rls,
        request("api", vec![desc_hits(&[("plan", "promo")], 90)]),
    )
    .await;
}

fn start_top(tmux: &Tmux, args: &[&str]) {
    let mut command = vec![
        env!("CARGO_BIN_EXE_sluice").to_string(),
        "top".into(),
        "--interval".into(),
        "200ms".into(),
    ];
    command.extend(args.iter().map(|a| a.to_string()));
    let out = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "120",
        "-y",
        "32",
        &command.join(" "),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(tmux
        .run(&["set-option", "-t", "top", "remain-on-exit", "on"])
        .status
        .success());
}

/// The wait status of process `pid` if it has exited and is not yet reaped: the
/// last field of `/proc/PID/stat`.
fn zombie_exit_code(pid: &str) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    if fields.first() != Some(&"Z") {
        return None;
    }
    fields.last()?.parse().ok()
}

/// An operator's block of tenant `value`, through the admin API.
fn block_now(server: &Server, value: &str) {
    use sluice::admin::pb;
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            server
                .admin_client()
                .await
                .block(pb::BlockRequest {
                    domain: "api".into(),
                    entries: vec![pb::request_descriptor::Entry {
                        key: "tenant".into(),
                        value: value.into(),
                    }],
                    for_micros: 0,
                })
                .await
                .expect("Block");
        });
}

/// The load, from a runtime of its own: the tests poll the screen from a plain
/// thread.
fn load_now(server: &Server) {
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(load(server));
}

#[test]
fn sluice_top_shows_rules_and_offenders_sorts_filters_and_quits() {
    let Some(tmux) = Tmux::new("plain") else {
        return;
    };
    let server = Server::start(POLICY, &[]);
    load_now(&server);
    block_now(&server, "mallory");
    start_top(&tmux, &["--server", &server.admin]);
    // The whole first view: the tenant rule with acme denied, the order, the selected
    // rule's top keys, and the operator's block in the bans panel.
    tmux.wait_for_all(
        "the first full view",
        &[
            "tenant",
            "42.9%",
            "acme",
            "sort: deny ratio",
            "3 denied",
            "bans and blocks",
            "block api/tenant mallory",
        ],
    );

    // The cost column: the charged rule's hits per second over the minute.
    tmux.wait("the plan rule's cost/s", |s| {
        s.contains("cost/s")
            && s.lines()
                .any(|l| l.contains("plan") && l.split_whitespace().any(|w| w == "1.5"))
    });

    tmux.keys(&["s"]);
    tmux.wait("sorted by denials", |s| s.contains("sort: denied"));
    tmux.keys(&["/", "z", "z", "z", "Enter"]);
    tmux.wait("filtered to nothing", |s| {
        s.contains("filter: zzz") && !s.contains("42.9%")
    });
    tmux.keys(&["c"]);
    tmux.wait("the filter cleared", |s| s.contains("42.9%"));

    // A terminal too short for the panes keeps the rules and says what it left out;
    // grown again, it shows them all.
    let resize = |rows: &str| {
        let out = tmux.run(&["resize-window", "-t", "top", "-y", rows]);
        assert!(out.status.success(), "{out:?}");
    };
    resize("8");
    tmux.wait("the rules and a word on the panes left out", |s| {
        s.contains("42.9%")
            && s.contains("terminal too small for the top keys and bans: 8 rows, 9 needed")
            && !s.contains("top keys of")
    });
    resize("32");
    tmux.wait_for_all(
        "every pane again",
        &["top keys of", "bans and blocks", "q quit"],
    );

    tmux.keys(&["q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = tmux.run(&[
            "display-message",
            "-p",
            "-t",
            "top",
            "#{pane_dead}:#{pane_dead_status}:#{pane_pid}",
        ]);
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if state.starts_with("1:0:") {
            break;
        }
        // tmux may mark the pane dead before it reaps the process: an exited one
        // waiting to be reaped (a zombie) tells its status in /proc.
        if let Some(pid) = state.strip_prefix("1::") {
            if let Some(code) = zombie_exit_code(pid) {
                assert_eq!(code, 0, "top's exit status");
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "top did not quit cleanly: {state:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The terminal is restored: the main screen is back, not the view.
    let after = tmux.screen();
    assert!(!after.contains("top keys of"), "{after}");
}

#[test]
fn sluice_top_works_over_mutual_tls() {
    let Some(tmux) = Tmux::new("mtls") else {
        return;
    };
    let ca = Ca::new("admin-ca");
    let client = ca.client("operator");
    let server = admin_over_mutual_tls(POLICY, &ca);
    load_now(&server);
    let port = server.admin.rsplit(':').next().unwrap();
    let addr = format!("localhost:{port}");
    start_top(
        &tmux,
        &[
            "--server",
            &addr,
            "--tls-ca",
            ca.cert().to_str().unwrap(),
            "--tls-cert",
            client.cert.to_str().unwrap(),
            "--tls-key",
            client.key.to_str().unwrap(),
        ],
    );
    tmux.wait_for_all("the view over mTLS", &["live", "acme"]);
    tmux.keys(&["q"]);
}

/// Keys clients chose reach the operator's terminal escaped: what `sluice top`
/// writes (read raw from the pane, before the terminal interprets it) holds no
/// escape sequence of theirs, no BEL and no line separator, and the screen shows
/// each key as itself, not as the key it would pose as once its controls dropped.
#[test]
fn sluice_top_writes_clients_keys_escaped() {
    let Some(tmux) = Tmux::new("hostile") else {
        return;
    };
    let server = Server::start(POLICY, &[]);
    let hostile = [
        "bob\rcarol",
        "\u{1b}]52;c;cHduZWQ\u{7}",
        "\u{1b}]0;title\u{7}\u{1b}[2J",
        "line\u{2028}sep",
        "adm\u{200b}in",
    ];
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            let mut rls = server.client().await;
            for value in hostile {
                // The tenant rule allows 5 a minute: the sixth is denied.
                for _ in 0..6 {
                    call(&mut rls, request("api", vec![desc(&[("tenant", value)])])).await;
                }
            }
        });
    let raw = tempfile::NamedTempFile::new().expect("temp file");
    start_top(&tmux, &["--server", &server.admin]);
    let out = tmux.run(&[
        "pipe-pane",
        "-t",
        "top",
        &format!("cat >> {}", raw.path().display()),
    ]);
    assert!(out.status.success(), "{out:?}");
    // The screen may be drawn whole before the pipe joins, and then only its
    // changes: a new size has it drawn whole again, into the pipe.
    let out = tmux.run(&["resize-window", "-t", "top", "-x", "121", "-y", "32"]);
    assert!(out.status.success(), "{out:?}");
    tmux.wait_for_all(
        "the hostile keys, escaped",
        &[
            r"bob\rcarol",
            r"\u{1b}]52;c;cHduZWQ\u{7}",
            r"\u{1b}]0;title\u{7}\u{1b}[2J",
            r"line\u{2028}sep",
            r"adm\u{200b}in",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        let written = std::fs::read(raw.path()).expect("the pane's bytes");
        let text = String::from_utf8_lossy(&written).into_owned();
        if text.contains(r"bob\rcarol") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    tmux.keys(&["q"]);
    assert!(text.contains(r"bob\rcarol"), "{text:?}");
    for (what, bad) in [
        ("an OSC sequence", "\u{1b}]"),
        ("a BEL", "\u{7}"),
        ("a line separator", "\u{2028}"),
        ("a zero-width space", "\u{200b}"),
        ("the client's clear screen", "\u{1b}[2J\u{1b}[H"),
    ] {
        assert!(!text.contains(bad), "{what} written: {text:?}");
    }
}
