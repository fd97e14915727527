//! systemd's readiness protocol (`sd_notify`): under a unit of `Type=notify`,
//! systemd counts Sluice as started only once it says `READY=1`, so units ordered
//! after it (an Envoy on the same host) start when it answers, not when its
//! process exists; `STATUS=` is the line `systemctl status` shows.
//!
//! Written by hand rather than with a crate: it is one datagram to the socket
//! systemd names in `NOTIFY_SOCKET`, and without that variable nothing is sent.

/// Tells the service manager `state` (newline-separated `NAME=value` pairs) when
/// it asked to be told. A manager that cannot be told is warned about, never fatal:
/// Sluice serves either way.
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty()) else {
        return;
    };
    if let Err(e) = send(&socket, state) {
        tracing::warn!(
            socket = %socket.to_string_lossy(),
            error = %e,
            "cannot tell the service manager (NOTIFY_SOCKET) the state"
        );
    }
}

#[cfg(unix)]
fn send(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let name = socket.as_bytes();
    let addr = match name.strip_prefix(b"@") {
        // An abstract socket: `@` stands for the leading NUL byte.
        #[cfg(target_os = "linux")]
        Some(abstract_name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(abstract_name)?
        }
        _ if name.starts_with(b"/") => SocketAddr::from_pathname(socket)?,
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a socket path (/...) or an abstract socket (@...)",
            ))
        }
    };
    UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(not(unix))]
fn send(_: &std::ffi::OsStr, _: &str) -> std::io::Result<()> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn a_path_and_an_abstract_socket_both_receive_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("sluice-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        let socket = format!("@{name}");
        send(std::ffi::OsStr::from_bytes(socket.as_bytes()), "STOPPING=1").unwrap();
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn a_name_that_is_no_socket_is_an_error_not_a_panic() {
        for name in ["relative/path", "vsock:2:1234"] {
            let e = send(std::ffi::OsStr::new(name), "READY=1").unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{name:?}");
        }
        let gone = send(std::ffi::OsStr::new("/nonexistent/notify"), "READY=1");
        assert!(gone.is_err());
    }
}
