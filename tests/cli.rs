//! The `sluice` command line: validate, serve's refusals, and docs/flags.md against
//! the definitions.

use std::process::Command;

use crate::common::{serve_command, stderr_lines, Server};

/// A valid policy of one rule.
const ONE_RULE: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

#[test]
fn validate_accepts_good_files_and_names_file_and_line_of_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, ONE_RULE).unwrap();
    let out = sluice().arg("validate").arg(&good).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    let out = sluice()
        .arg("validate")
        .arg(&good)
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:4:", bad.display())), "{err}");
    assert!(err.contains("fortnight"), "{err}");
}

/// A file named twice (two spellings, or its directory and itself) is read once:
/// not refused as a duplicate of itself ("p/base.yaml:4: duplicate descriptor ...
/// already defined at p/base.yaml:4"). The same for `explain --config`.
#[test]
fn a_policy_file_named_twice_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("p")).unwrap();
    std::fs::write(dir.path().join("p/base.yaml"), ONE_RULE).unwrap();
    for paths in [
        &["p/base.yaml", "./p/base.yaml"][..],
        &["p", "p/base.yaml"],
        &["p/base.yaml", "p/base.yaml"],
    ] {
        let out = sluice()
            .arg("validate")
            .args(paths)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{paths:?}: {err}");
        assert!(!err.contains("duplicate"), "{paths:?}: {err}");
        let out = sluice()
            .args([
                "explain", "--domain", "d", "k=v", "--config", paths[0], "--config", paths[1],
            ])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{paths:?}: {err}");
    }
}

/// A policy whose key holds a terminal's control sequence (here one that sets the
/// window title), defined twice: refused with the key escaped, as `sluice top`
/// shows clients' keys, by validate, serve and explain --config alike.
pub(crate) const TITLE_KEY_TWICE: &str = "domain: d
descriptors:
  - key: \"k\\e]0;pwn\\a\"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: \"k\\e]0;pwn\\a\"
    rate_limit: {unit: second, requests_per_unit: 1}
";

#[test]
fn policy_errors_show_control_characters_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(&path, TITLE_KEY_TWICE).unwrap();
    let validated = refused(sluice().arg("validate").arg(&path));
    let served =
        String::from_utf8_lossy(&serve_command(&path).output().unwrap().stderr).into_owned();
    let explained = refused(
        sluice()
            .args(["explain", "--domain", "d", "k=v", "--config"])
            .arg(&path),
    );
    for (what, stderr) in [
        ("validate", validated),
        ("serve", served),
        ("explain", explained),
    ] {
        assert!(
            stderr.contains("duplicate descriptor key 'k\\u{1b}]0;pwn\\u{7}' with no value"),
            "{what}: {stderr}"
        );
        assert!(!stderr.contains(['\u{1b}', '\u{7}']), "{what}: {stderr:?}");
    }
}

/// Runs `cmd`, which must refuse: exit status 1 and nothing on stdout. Its stderr.
fn refused(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// `sluice explain --config` on a directory with no policy file refuses as validate
/// does, rather than explaining every request as answered OK by no rule.
#[test]
fn explain_refuses_a_directory_without_policy_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml.bak"), "domain: api\n").unwrap();
    let stderr = refused(
        sluice()
            .args(["explain", "--domain", "api", "tenant=acme", "--config"])
            .arg(dir.path()),
    );
    assert!(
        stderr.contains("no policy file to explain against"),
        "{stderr}"
    );
}

/// `sluice top` into a pipe says it needs a terminal and what a script reads
/// instead, rather than a bare OS error after connecting.
#[test]
fn top_into_a_pipe_says_it_needs_a_terminal() {
    let stderr = refused(
        sluice()
            .args(["top", "--server", "127.0.0.1:1"])
            .stdin(std::process::Stdio::null()),
    );
    assert!(
        stderr.contains("the output is not a terminal") && stderr.contains("/debug/top"),
        "{stderr}"
    );
}

/// `sluice explain` with no server listening says where it dialled and why it
/// failed, each cause once.
#[test]
fn explain_without_a_server_says_so_once() {
    // A port just closed: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("127.0.0.1:{port}");
    let stderr = refused(sluice().args(["explain", "--domain", "d", "k=v", "--server", &server]));
    assert!(
        stderr.contains(&format!("cannot reach the admin API at {server}"))
            && stderr.contains("refused"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("tcp connect error").count(), 1, "{stderr}");
}

/// `sluice explain` and `sluice top` refuse a `--server` they would not reach as
/// written (a port out of range dialled port 80), naming the flag, before
/// connecting.
#[test]
fn explain_and_top_refuse_a_bad_server() {
    let cases = [
        (
            vec!["--server", "127.0.0.1:99999"],
            "invalid value '127.0.0.1:99999' for '--server <SERVER>': port 99999 is out of range: expected 1-65535",
        ),
        (
            vec!["--server", "localhost"],
            "'localhost' has no port; expected HOST:PORT, http://HOST:PORT or https://HOST:PORT",
        ),
    ];
    for command in [&["explain", "--domain", "d", "k=v"][..], &["top"]] {
        for (args, says) in &cases {
            let out = sluice()
                .args(command)
                .args(args)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{command:?} {args:?}: {stderr}");
            assert!(stderr.contains(says), "{command:?} {args:?}: {stderr}");
            assert!(out.stdout.is_empty(), "{command:?} {args:?}");
        }
    }
    // The environment's address too.
    let out = sluice()
        .args(["explain", "--domain", "d", "k=v"])
        .env("SLUICE_SERVER", "127.0.0.1:65536")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("port 65536 is out of range"), "{stderr}");
}

/// `sluice explain` and `sluice top` refuse TLS flags they would not use: with an
/// http:// server, --tls-ca went unread and the call ran in plain text, and so did
/// --tls-cert and --tls-key without --tls-ca. Refused before any file is read.
#[test]
fn explain_and_top_refuse_tls_flags_they_would_not_use() {
    let dir = tempfile::tempdir().unwrap();
    let unread = dir.path().join("unread.pem");
    let unread = unread.to_str().unwrap();
    let cases = [
        (
            vec!["--server", "http://127.0.0.1:8082", "--tls-ca", unread],
            "sluice {}: --server http://127.0.0.1:8082: plain http:// takes no --tls-ca, --tls-cert or --tls-key; use https://",
        ),
        (
            vec!["--server", "127.0.0.1:8082", "--tls-cert", unread, "--tls-key", unread],
            "sluice {}: --tls-cert and --tls-key are for TLS, which needs --tls-ca (the CA that signs the admin port's certificate)",
        ),
        (
            vec!["--server", "https://127.0.0.1:8082"],
            "sluice {}: --server https://127.0.0.1:8082: https:// needs --tls-ca, the CA that signs the admin port's certificate",
        ),
    ];
    for command in [&["explain", "--domain", "d", "k=v"][..], &["top"]] {
        for (args, says) in &cases {
            let stderr = refused(
                sluice()
                    .args(command)
                    .args(args)
                    .stdin(std::process::Stdio::null()),
            );
            let says = says.replace("{}", command[0]);
            assert_eq!(stderr.trim_end(), says, "{command:?} {args:?}");
        }
    }
}

/// `sluice explain` says why an admin port over mutual TLS refused it, and that a
/// port which is not the admin API's is the wrong one: not a broken pipe, a closed
/// connection or a 404, which is what the refused handshake and the other ports
/// showed. A TLS 1.3 client learns of its refusal only after its first bytes, so the
/// refusals are tried a few times.
#[test]
fn explain_says_why_the_admin_port_refuses_it() {
    use crate::common::tls::{admin_over_mutual_tls, Ca};
    let ca = Ca::new("admin-ca");
    let other = Ca::new("other-ca");
    let stranger = other.client("stranger");
    let server = admin_over_mutual_tls(ONE_RULE, &ca);
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (ca_cert, cert, key) = (path(&ca.cert()), path(&stranger.cert), path(&stranger.key));
    let explain = |server: &str, tls: &[&str]| {
        refused(
            sluice()
                .args(["explain", "--domain", "d", "k=v", "--server", server])
                .args(tls),
        )
    };
    for _ in 0..5 {
        let stderr = explain(&server.admin, &[]);
        assert!(
            stderr.contains("it answers in TLS") && stderr.contains("--tls-ca"),
            "{stderr}"
        );
        let stderr = explain(&server.admin, &["--tls-ca", &ca_cert]);
        assert!(
            stderr.contains("refused the TLS handshake")
                && stderr.contains("CertificateRequired")
                && stderr.contains("give --tls-cert and --tls-key"),
            "{stderr}"
        );
        let with_cert = ["--tls-ca", &ca_cert, "--tls-cert", &cert, "--tls-key", &key];
        let stderr = explain(&server.admin, &with_cert);
        assert!(
            stderr.contains("refused the TLS handshake")
                && stderr.contains("UnknownCA")
                && stderr.contains("did not accept --tls-cert"),
            "{stderr}"
        );
    }
    // A plain-text port reached over TLS.
    let plain = Server::start(ONE_RULE, &[]);
    let stderr = explain(&plain.admin, &["--tls-ca", &ca_cert]);
    assert!(stderr.contains("it does not answer in TLS"), "{stderr}");
    // The gRPC and HTTP ports are not the admin API's.
    for port in [&plain.grpc, &plain.http] {
        let stderr = explain(port, &[]);
        assert!(
            stderr.contains(&format!(
                "admin API at {port}: it does not serve sluice's admin API"
            )) && stderr.contains("--admin-addr"),
            "{stderr}"
        );
    }
}

/// `sluice explain` against a port that takes the connection and never answers (a
/// stopped server: the kernel still accepts) gives up and says so, in plain text
/// and over TLS, where it waited for ever, in the handshake or for the answer.
#[test]
fn explain_gives_up_on_a_port_that_never_answers() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = silent.local_addr().unwrap().to_string();
    // Accepted and held, never read nor answered.
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for _ in 0..2 {
            open.push(silent.accept().unwrap().0);
        }
        std::thread::sleep(Duration::from_secs(60));
    });
    let ca = crate::common::tls::Ca::new("admin-ca");
    let ca = ca.cert();
    let runs: Vec<_> = [vec![], vec!["--tls-ca", ca.to_str().unwrap()]]
        .into_iter()
        .map(|tls| {
            sluice()
                .args(["explain", "--domain", "d", "k=v", "--server", &server])
                .args(tls)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    for mut run in runs {
        while run.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = run.kill();
                panic!("sluice explain still waits after 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = run.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("cannot reach the admin API at {server}"))
                && stderr.contains("no answer within 10s"),
            "{stderr}"
        );
    }
    drop(held);
}

/// `sluice explain` against a port that answers in something other than HTTP/2 (a
/// Redis port, as here a line of text) says it does not speak gRPC, not that the
/// admin API answered a frame of an invalid size.
#[test]
fn explain_says_a_port_that_does_not_speak_grpc_is_not_the_admin_api() {
    use std::io::{Read, Write};
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = port.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in port.incoming() {
            let mut conn = conn.unwrap();
            let mut buf = [0u8; 64];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"-ERR unknown command 'PRI'\r\n");
        }
    });
    let stderr = refused(sluice().args(["explain", "--domain", "d", "k=v", "--server", &server]));
    assert!(
        stderr.contains(&format!(
            "cannot reach the admin API at {server}: it does not speak gRPC"
        )),
        "{stderr}"
    );
}

/// `sluice explain` names the TLS file it cannot use, and why, before it connects:
/// a CA file with no certificate, a certificate file with none, a key file with no
/// key, a key that is not the certificate's. It said "transport error", or
/// "UnknownIssuer" as if the server's certificate were at fault.
#[test]
fn explain_names_a_tls_file_it_cannot_use() {
    use crate::common::tls::Ca;
    let ca = Ca::new("admin-ca");
    let client = ca.client("operator");
    let other = ca.client("other");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (ca_cert, cert, key, other_key) = (
        path(&ca.cert()),
        path(&client.cert),
        path(&client.key),
        path(&other.key),
    );
    // Nothing listens: the files are refused before any connection.
    let cases = [
        (
            [&key, &cert, &key],
            format!("--tls-ca {key}: no PEM certificate in the file"),
        ),
        (
            [&ca_cert, &key, &key],
            format!("--tls-cert {key}: no PEM certificate in the file"),
        ),
        (
            [&ca_cert, &cert, &cert],
            format!("--tls-key {cert}: no PEM private key"),
        ),
        (
            [&ca_cert, &cert, &other_key],
            format!("--tls-key {other_key} is not the key of --tls-cert {cert}"),
        ),
    ];
    for ([ca, cert, key], says) in cases {
        let stderr = refused(sluice().args([
            "explain",
            "--domain",
            "d",
            "k=v",
            "--server",
            "127.0.0.1:1",
            "--tls-ca",
            ca,
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ]));
        assert!(stderr.contains(&says), "{says}: {stderr}");
    }
}

/// A directory with no policy file is most likely the wrong one: validate warns as
/// serve does, names what it did not read, and fails.
#[test]
fn validate_refuses_a_directory_without_policy_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("readme.txt"), "not a policy").unwrap();
    let out = sluice().arg("validate").arg(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("holds no policy file"), "{err}");
    assert!(
        err.contains("not read:") && err.contains("readme.txt"),
        "{err}"
    );

    // A drop-in runtime directory: files in subdirectories, any name.
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("limits"), "domain: d\ndescriptors: []\n").unwrap();
    let out = sluice()
        .args(["validate", "--config-dir-files", "all"])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "readme.txt is no policy: {err}");
    assert!(err.contains("readme.txt"), "{err}");
    std::fs::remove_file(dir.path().join("readme.txt")).unwrap();
    let out = sluice()
        .args(["validate", "--config-dir-files", "all"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&sub).unwrap();
    std::fs::write(dir.path().join("readme.txt"), "not a policy").unwrap();

    std::fs::write(dir.path().join("p.yaml"), "domain: d\ndescriptors: []\n").unwrap();
    let out = sluice().arg("validate").arg(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("not read:") && err.contains("readme.txt"),
        "{err}"
    );
}

/// Renders the command line's reference from its clap definitions: one section per
/// subcommand, one row per flag with its environment variable, default and help.
fn flag_reference() -> String {
    use clap::CommandFactory;
    use std::fmt::Write;

    /// One table cell: one line, `|` escaped, and outside code spans the characters
    /// Markdown would read as emphasis or HTML (`*.yaml`, `<tempdir>`).
    fn cell(text: &str) -> String {
        let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut out = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i > 0 {
                out.push('`');
            }
            if i % 2 == 1 {
                out.push_str(&part.replace('|', "\\|"));
            } else {
                for c in part.chars() {
                    match c {
                        '|' | '*' | '_' => {
                            out.push('\\');
                            out.push(c);
                        }
                        '<' => out.push_str("&lt;"),
                        _ => out.push(c),
                    }
                }
            }
        }
        out
    }
    let cli = sluice::config::Cli::command();
    let mut out = String::new();
    out.push_str(
        "# Flag reference\n\n\
         <!-- Generated from the clap definitions in src/config/ by\n     \
         `SLUICE_BLESS=1 cargo test --test integration cli::flag_reference`; do not edit by hand:\n     \
         `cargo test` fails when this page and the definitions differ. -->\n\n\
         Every subcommand of `sluice`, with every flag as `--help` shows it. Each `serve`\n\
         flag also reads the environment variable beside it; a flag given on the command\n\
         line wins. [Running `sluice serve`](command-line.md) explains what the flags do\n\
         together. Durations are written as in policies: a number and a unit (`250ms`,\n\
         `10s`, `1.5s`, `5m`, `1h`, `1d`, `100us`), or a sum such as `1m30s`.\n",
    );
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        let about = sub
            .get_long_about()
            .or(sub.get_about())
            .map(|a| cell(&a.to_string()))
            .unwrap_or_default();
        let _ = write!(out, "\n## sluice {}\n\n{about}\n\n", sub.get_name());
        let args: Vec<_> = sub
            .get_arguments()
            .filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
            .collect();
        if args.is_empty() {
            out.push_str("No flags.\n");
            continue;
        }
        // Flags come in their `--help` groups (a heading per group), each group
        // under its own table.
        let mut heading = None;
        let mut table = false;
        for arg in args {
            if !table || arg.get_help_heading() != heading {
                heading = arg.get_help_heading();
                if let Some(h) = heading {
                    let _ = write!(out, "\n### {h}\n\n");
                } else if table {
                    out.push('\n');
                }
                out.push_str("| flag | environment | default | meaning |\n|---|---|---|---|\n");
                table = true;
            }
            let takes_value = arg.get_action().takes_values();
            let value = arg
                .get_value_names()
                .map(|names| {
                    names
                        .iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
            let many = if arg.get_value_delimiter().is_some() {
                "[,...]"
            } else if matches!(arg.get_action(), clap::ArgAction::Append) {
                "..."
            } else {
                ""
            };
            let name = match arg.get_long() {
                Some(long) if takes_value => format!("`--{long} {value}{many}`"),
                Some(long) => format!("`--{long}`"),
                None => format!("`{value}{many}`"),
            };
            let name = match arg.get_short() {
                Some(short) => format!("`-{short}`, {name}"),
                None => name,
            };
            let env = arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let defaults: Vec<_> = arg
                .get_default_values()
                .iter()
                .map(|d| format!("`{}`", d.to_string_lossy()))
                .collect();
            let default = if !takes_value
                || arg.get_default_values().is_empty()
                || arg.is_hide_default_value_set()
            {
                String::new()
            } else {
                defaults.join(", ")
            };
            let mut meaning = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| cell(&h.to_string()))
                .unwrap_or_default();
            let values: Vec<_> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            if !meaning.is_empty() && !meaning.ends_with('.') {
                meaning.push('.');
            }
            if takes_value && !values.is_empty() {
                let _ = write!(meaning, " One of {}.", values.join(", "));
            }
            if arg.is_required_set() {
                meaning.push_str(" Required.");
            }
            let _ = writeln!(out, "| {name} | {env} | {default} | {} |", meaning.trim());
        }
    }
    out
}

/// docs/flags.md is the command line's own definitions rendered: a flag added,
/// renamed, given a new default or new help without the page following fails here.
/// `SLUICE_BLESS=1` writes the page instead.
#[test]
fn flag_reference_matches_the_command_line() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/flags.md");
    let rendered = flag_reference();
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&path, &rendered).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "docs/flags.md differs from the command line's definitions (src/config/): \
         regenerate it with `SLUICE_BLESS=1 cargo test --test integration cli::flag_reference`"
    );
    // The page names every serve flag the command line has.
    use clap::CommandFactory;
    let cli = sluice::config::Cli::command();
    let serve = cli.find_subcommand("serve").unwrap();
    for arg in serve.get_arguments().filter(|a| !a.is_hide_set()) {
        if let Some(long) = arg.get_long() {
            if long != "help" {
                assert!(
                    committed.contains(&format!("`--{long}")),
                    "--{long} missing"
                );
            }
        }
    }
}

#[test]
fn serve_without_policies_says_how_to_give_them() {
    let out = sluice()
        .arg("serve")
        .env_remove("SLUICE_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--config") && err.contains("--kube"), "{err}");
}

/// A Deployment of envoyproxy/ratelimit whose image is swapped for Sluice keeps its
/// environment: Sluice reads none of it without `--env-compat erl`, so it must say
/// which of those variables it is not reading, or `REDIS_URL` goes unnoticed and
/// each replica counts alone in memory.
#[test]
fn serve_names_the_ratelimit_variables_it_does_not_read() {
    let out = sluice()
        .arg("serve")
        .env_remove("SLUICE_CONFIG")
        .env_remove("SLUICE_ENV_COMPAT")
        .env("REDIS_URL", "127.0.0.1:6379")
        .env("RUNTIME_ROOT", "/data")
        .env("USE_STATSD", "false")
        .env("PORT", "8080")
        .env("GRPC_PORT", "tcp://10.0.0.1:8081")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let warning = err
        .lines()
        .find(|l| l.contains("set but not read"))
        .unwrap_or_else(|| panic!("no warning about the unread variables: {err}"));
    // The variables that change what is served, not an ignored one (USE_STATSD) or a
    // name other software sets too (PORT; GRPC_PORT, set by Kubernetes for a Service
    // named `grpc`).
    assert!(
        warning.contains("envoyproxy/ratelimit's RUNTIME_ROOT, REDIS_URL are set")
            && warning.contains("--env-compat erl"),
        "{warning}"
    );
    assert!(err.contains("--config"), "{err}");

    // Read with --env-compat erl: no such warning.
    let out = sluice()
        .args(["serve", "--env-compat", "erl"])
        .env_remove("SLUICE_CONFIG")
        .env("RUNTIME_ROOT", "/nonexistent")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("set but not read"), "{err}");
}

#[test]
fn serve_refuses_to_start_on_a_bad_policy() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "descriptors: []\n").unwrap();
    let out = serve_command(&bad).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml"), "{err}");
}

#[test]
fn bench_policies_load() {
    for file in [
        "benches/policy.yaml",
        "benches/memory-policy.yaml",
        "benches/reference/config/bench.yaml",
    ] {
        let out = sluice().args(["validate", file]).output().unwrap();
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn logs_to_a_pipe_carry_no_colour_escapes() {
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, ONE_RULE).unwrap();
    let mut child = serve_command(&policy)
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader ends when the child's stderr closes, so a hung start fails the test
    // by the kill below rather than hanging it.
    let rx = stderr_lines(&mut child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.contains("sluice listening"))
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => lines.push(line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines.iter().any(|l| l.contains("sluice listening")),
        "{lines:?}"
    );
    assert!(
        lines.iter().all(|l| !l.contains('\x1b')),
        "colour escapes in piped logs: {lines:?}"
    );
}

/// `serve` with `args` on a valid policy, expected to refuse to start: its stderr.
fn serve_refusal(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, ONE_RULE).unwrap();
    let out = serve_command(&policy)
        .args(args)
        .env_remove("SLUICE_HASH_SECRET")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success(), "started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A `--prometheus-path` that axum would read as a pattern is refused with a
/// message naming the flag: a segment starting with `:` or `*` stopped start-up
/// with a panic.
#[test]
fn a_prometheus_path_that_is_a_pattern_is_refused() {
    for path in ["/:id", "/a/*rest"] {
        let stderr = serve_refusal(
            &[
                "--prometheus-addr",
                "127.0.0.1:0",
                "--prometheus-path",
                path,
            ],
            &[],
        );
        assert!(
            stderr.contains(&format!("invalid value '{path}' for '--prometheus-path"))
                && !stderr.contains("panicked"),
            "{stderr}"
        );
    }
}

/// A bound on unfinished request bytes below the largest request would refuse a
/// legitimate request that comes in several frames, with nothing else held.
#[test]
fn a_buffered_bound_below_the_largest_request_is_refused() {
    let err = serve_refusal(
        &[
            "--grpc-max-buffered-request-bytes",
            "1KiB",
            "--admin-addr",
            "off",
        ],
        &[],
    );
    assert!(
        err.contains("--grpc-max-buffered-request-bytes 1024 is below --max-request-bytes"),
        "{err}"
    );
}

/// Two listening flags on one port are refused naming both, rather than the
/// second failing with "address in use"; a port taken by another process names
/// the flag whose address it is.
#[test]
fn listening_flags_on_one_port_are_refused_naming_both() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let at = |ip: &str, port: u16| format!("{ip}:{port}");
    for (args, want) in [
        (
            vec!["--grpc-addr".into(), at("127.0.0.1", free), "--admin-addr".into(), at("127.0.0.1", free)],
            format!("--grpc-addr 127.0.0.1:{free} and --admin-addr 127.0.0.1:{free} name the same port"),
        ),
        (
            vec!["--http-addr".into(), at("0.0.0.0", free), "--prometheus-addr".into(), at("127.0.0.1", free), "--admin-addr".into(), "off".into()],
            format!("--http-addr 0.0.0.0:{free} and --prometheus-addr 127.0.0.1:{free} name the same port"),
        ),
        (
            vec!["--grpc-addr".into(), at("127.0.0.1", port), "--admin-addr".into(), "off".into()],
            format!("--grpc-addr: cannot listen on 127.0.0.1:{port}"),
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = serve_refusal(&args, &[]);
        assert!(err.contains(&want), "{args:?}: {err}");
    }
    drop(taken);
}

/// A store timeout of zero is refused, from the flag or the environment, as every
/// other duration flag's zero is: each decision would race Redis's answer.
#[test]
fn a_store_timeout_of_zero_is_refused() {
    for (args, env) in [
        (&["--store-timeout", "0s"][..], &[][..]),
        (&[][..], &[("SLUICE_STORE_TIMEOUT", "0ms")][..]),
    ] {
        let err = serve_refusal(args, env);
        assert!(
            err.contains("for '--store-timeout <STORE_TIMEOUT>'")
                && err.contains("must be longer than zero"),
            "{args:?} {env:?}: {err}"
        );
    }
}

/// A key prefix only means something on Redis: without a Redis store it would be
/// ignored, so it is refused, and a bad one is refused naming its own flag.
#[test]
fn a_key_prefix_needs_a_redis_store_and_a_bad_one_names_its_flag() {
    for (args, env) in [
        (&["--redis-key-prefix", "fleet-a:"][..], &[][..]),
        (&[][..], &[("SLUICE_REDIS_KEY_PREFIX", "fleet-a:")][..]),
    ] {
        let err = serve_refusal(args, env);
        assert!(
            err.contains("required arguments were not provided")
                && err.contains("--redis-key-prefix")
                && err.contains("--redis <REDIS>|--redis-cluster <REDIS_CLUSTER>|--redis-sentinel"),
            "{args:?} {env:?}: {err}"
        );
    }
    let err = serve_refusal(
        &["--redis", "redis://127.0.0.1:1", "--redis-key-prefix={x"],
        &[],
    );
    assert!(
        err.starts_with("error: invalid value '{x' for '--redis-key-prefix")
            && err.contains("must not contain '{'"),
        "{err}"
    );
}

#[test]
fn hash_keys_without_a_secret_refuses_to_start_and_says_why() {
    let err = serve_refusal(&["--hash-keys"], &[]);
    assert!(
        err.contains("--hash-keys needs a secret") && err.contains("--hash-secret-file"),
        "{err}"
    );
}

#[test]
fn a_short_or_unreadable_hash_secret_is_refused() {
    let err = serve_refusal(&["--hash-keys"], &[("SLUICE_HASH_SECRET", "short")]);
    assert!(err.contains("at least 16 bytes"), "{err}");
    assert!(!err.contains("short\""), "the secret is echoed: {err}");
    let err = serve_refusal(&["--hash-secret-file", "/nonexistent/secret"], &[]);
    assert!(err.contains("/nonexistent/secret"), "{err}");
}

/// A reader that stops early (`sluice crd | head -1`) ends the output quietly: the
/// CRD is larger than a pipe holds, so the write meets the closed pipe.
#[test]
fn output_to_a_reader_that_stops_early_is_not_a_panic() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = sluice()
        .arg("crd")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with('#'), "{first}");
    // The reader is gone now; the rest of the CRD cannot be written.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}

/// In a chain of `replaces` (x replaces y, y replaces z) explain names, for each
/// dropped limit, the limit that replaced it, even one that is replaced itself.
#[test]
fn explain_names_the_replacing_limit_when_it_is_replaced_too() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(
        &policy,
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: x, replaces: [{name: y}]}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, name: y, replaces: [{name: z}]}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 1, name: z}\n",
    )
    .unwrap();
    let out = sluice()
        .args(["explain", "--config"])
        .arg(&policy)
        .args(["--domain", "d", "a=1", "+", "b=1", "+", "c=1", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let ds = e["descriptors"].as_array().unwrap();
    assert_eq!(ds[0]["replacedBy"], "", "{e:#}");
    assert_eq!(
        ds[1]["replacedBy"], "rule 'y' matched and is replaced by 'x'",
        "{e:#}"
    );
    assert_eq!(
        ds[2]["replacedBy"], "rule 'z' matched and is replaced by 'y'",
        "{e:#}"
    );
}

/// Two limits that replace each other would both drop out of a request that
/// matches both, leaving it unlimited: `validate` and `explain` refuse the policy,
/// naming both limits and their lines, the same words as a refused reload.
#[test]
fn limits_that_replace_each_other_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(
        &policy,
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: x, replaces: [{name: y}]}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, name: y, replaces: [{name: x}]}\n",
    )
    .unwrap();
    let p = policy.display().to_string();
    let want = format!(
        "{p}:4: limits 'x' ({p}:4) and 'y' ({p}:6) replace each other: when both match one request neither applies, so the request is limited by neither; keep 'replaces' on one of them only"
    );
    for args in [
        vec!["validate", &p],
        vec!["explain", "--config", &p, "--domain", "d", "a=1"],
    ] {
        let out = sluice().args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(&want), "{args:?}: {stderr}");
    }
}

/// The server's refusal of a bad request and `sluice explain`'s own output count
/// descriptors alike, from 1: the second descriptor is "descriptor 2" in both.
#[test]
fn explain_and_the_server_count_descriptors_from_one() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(
        &policy,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let explain = |extra: &[&str]| {
        let out = sluice()
            .args(["explain", "--config"])
            .arg(&policy)
            .args(["--domain", "d", "k=1", "+"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Refused by the CLI itself, and by the server's request check.
    assert!(explain(&["+"]).contains("descriptor 2 has no entries"));
    assert!(
        explain(&["a=1", "=x"]).contains("descriptor 2 entry 2 has an empty key"),
        "{}",
        explain(&["a=1", "=x"])
    );
    let many: Vec<String> = (0..33).map(|i| format!("e{i}=1")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    assert!(explain(&many).contains("descriptor 2 has 33 entries; at most 32 are allowed"));
}
