//! The client tools the tests run (grpcurl, grpc-health-probe: Go tools that
//! scripts/install-tools.sh installs), found where Go puts them or on PATH.

use std::path::PathBuf;
use std::process::{Command, Output};

use super::tls::{Ca, Pair};

/// A Go tool from the Go bin directories or PATH; `None` (after a loud message) when
/// it is missing and not required.
pub fn tool(name: &str) -> Option<PathBuf> {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    let mut dirs = vec![home.join("go/bin")];
    if let Some(d) = std::env::var_os("GOPATH") {
        dirs.insert(0, PathBuf::from(d).join("bin"));
    }
    if let Some(d) = std::env::var_os("GOBIN") {
        dirs.insert(0, PathBuf::from(d));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = dirs
        .into_iter()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        missing(name);
    }
    found
}

/// Skips loudly, or fails under `SLUICE_REQUIRE_TOOLS`.
pub fn missing(name: &str) {
    assert!(
        std::env::var_os("SLUICE_REQUIRE_TOOLS").is_none(),
        "SLUICE_REQUIRE_TOOLS is set but {name} is missing: run scripts/install-tools.sh"
    );
    eprintln!("\n*** SKIPPED: {name} not found; run scripts/install-tools.sh ***\n");
}

/// A finished command's status and output, for assertion messages.
pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// grpcurl against `addr`, in plain text or with the client certificate of `tls`.
pub fn grpcurl(grpcurl: &PathBuf, addr: &str, tls: Option<&(Ca, Pair)>, args: &[&str]) -> Output {
    let mut cmd = Command::new(grpcurl);
    cmd.args(["-max-time", "10"]);
    match tls {
        None => {
            cmd.arg("-plaintext");
        }
        Some((ca, client)) => {
            cmd.arg("-cacert").arg(ca.cert());
            cmd.arg("-cert").arg(&client.cert);
            cmd.arg("-key").arg(&client.key);
        }
    }
    cmd.args(args.iter().take_while(|a| !a.is_empty()));
    cmd.arg(addr);
    cmd.args(args.iter().skip_while(|a| !a.is_empty()).skip(1));
    cmd.output().expect("run grpcurl")
}
