//! The client against a real `redis-server` on a Unix socket in a temporary
//! directory (no port to race for): calls, replies, error kinds, the pool. Skipped
//! when `redis-server` is not on `PATH`, unless `SLUICE_REQUIRE_REDIS` is set.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_redis::{Answer, ErrorKind, Pool, Request, Target, Value, Wire};

const PASSWORD: &str = "s3cret";
const TIMEOUT: Duration = Duration::from_secs(2);

struct Server {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// A server on a Unix socket that wants [`PASSWORD`]; `None` without redis-server.
    async fn start() -> Option<Server> {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("redis.sock");
        let child = match Command::new("redis-server")
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .args(["--requirepass", PASSWORD])
            .arg("--unixsocket")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                assert!(
                    std::env::var_os("SLUICE_REQUIRE_REDIS").is_none(),
                    "SLUICE_REQUIRE_REDIS is set but redis-server cannot be run: {e}"
                );
                eprintln!("*** SKIPPED: redis-server is not on PATH ***");
                return None;
            }
        };
        let server = Server { child, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Wire::connect(&server.target(PASSWORD)).await.is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some(server)
    }

    fn target(&self, password: &str) -> Target {
        let socket = self.dir.path().join("redis.sock");
        let url = format!("unix://{}?pass={password}", socket.display());
        Target::parse(&url, TIMEOUT).unwrap()
    }
}

#[tokio::test]
async fn calls_read_their_replies_and_an_error_reply_leaves_the_connection_usable() {
    let Some(server) = Server::start().await else {
        return;
    };
    let mut wire = Wire::connect(&server.target(PASSWORD)).await.unwrap();

    let mut req = Request::default();
    req.start(3);
    req.arg(b"INCRBY");
    req.arg(b"n");
    req.arg_i64(-7);
    assert_eq!(wire.query(&req).await.unwrap(), Value::Int(-7));

    // The decide path's reply: a flat array of integers, read straight into numbers.
    let script = Request::command(&[
        b"EVAL",
        b"return {1, -2, tonumber(redis.call('GET', KEYS[1]))}",
        b"1",
        b"n",
    ]);
    assert_eq!(
        wire.call(&script).await.unwrap(),
        Answer::Integers(vec![1, -2, -7])
    );

    let refused = wire
        .query(&Request::command(&[b"NOSUCHCOMMAND"]))
        .await
        .unwrap();
    let Value::Error(text) = refused else {
        panic!("{refused:?}")
    };
    let e = sluice_redis::error::reply(text);
    assert_eq!(e.kind(), ErrorKind::Script, "{e}");
    assert!(!e.kind().is_outage());
    assert!(e.message().contains("unknown command"), "{e}");

    // The same connection answers the next call.
    assert_eq!(
        wire.query(&Request::command(&[b"GET", b"n"]))
            .await
            .unwrap(),
        Value::Bulk(b"-7".to_vec())
    );
}

#[tokio::test]
async fn a_wrong_or_missing_password_is_noauth() {
    let Some(server) = Server::start().await else {
        return;
    };
    let e = Wire::connect(&server.target("wrong")).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::NoAuth, "{e}");
    assert!(e.message().starts_with("AUTH: WRONGPASS"), "{e}");

    let socket = server.dir.path().join("redis.sock");
    let url = format!("unix://{}", socket.display());
    let mut wire = Wire::connect(&Target::parse(&url, TIMEOUT).unwrap())
        .await
        .unwrap();
    let Value::Error(text) = wire.query(&Request::command(&[b"PING"])).await.unwrap() else {
        panic!("PING answered without a password")
    };
    assert_eq!(sluice_redis::error::reply(text).kind(), ErrorKind::NoAuth);
}

/// A database the server does not have fails the connection, as a connection
/// error (the shard is then backed off), not as a call's error; a password refused
/// first stays noauth.
#[tokio::test]
async fn a_database_the_server_lacks_is_a_connection_error() {
    let Some(server) = Server::start().await else {
        return;
    };
    let socket = server.dir.path().join("redis.sock");
    let url = format!("unix://{}?pass={PASSWORD}&db=16", socket.display());
    let e = Wire::connect(&Target::parse(&url, TIMEOUT).unwrap())
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(
        e.message()
            .starts_with("SELECT: ERR DB index is out of range"),
        "{e}"
    );
    let url = format!("unix://{}?db=16", socket.display());
    let e = Wire::connect(&Target::parse(&url, TIMEOUT).unwrap())
        .await
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::NoAuth, "{e}");
    // A database it has is selected.
    let url = format!("unix://{}?pass={PASSWORD}&db=15", socket.display());
    assert!(Wire::connect(&Target::parse(&url, TIMEOUT).unwrap())
        .await
        .is_ok());
}

#[tokio::test]
async fn no_server_is_a_connection_error_and_a_silent_one_a_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepted by the kernel, never answered: AUTH waits past the target's timeout.
    let silent = Target::parse(
        &format!("redis://:pw@127.0.0.1:{port}"),
        Duration::from_millis(200),
    )
    .unwrap();
    let started = Instant::now();
    let e = Wire::connect(&silent).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    drop(listener);
    let gone = Target::parse(&format!("redis://127.0.0.1:{port}"), TIMEOUT).unwrap();
    let e = Wire::connect(&gone).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(e.message().starts_with("connect: "), "{e}");
    assert!(e.kind().is_outage());
}

#[tokio::test]
async fn a_pool_serves_calls_from_many_tasks() {
    let Some(server) = Server::start().await else {
        return;
    };
    let pool = std::sync::Arc::new(Pool::new(server.target(PASSWORD)));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.query(&Request::command(&[b"INCR", b"hits"])).await })
        })
        .collect();
    for t in tasks {
        assert!(matches!(t.await.unwrap(), Ok(Value::Int(1..=20))));
    }
    assert_eq!(
        pool.query(&Request::command(&[b"GET", b"hits"]))
            .await
            .unwrap(),
        Value::Bulk(b"20".to_vec())
    );
}

/// Redis closes a connection after a protocol error (here a command too long for a
/// client that has not authenticated): the next call, made at once, goes over a new
/// connection and gets Redis's answer, not "connection closed".
#[tokio::test]
async fn a_connection_redis_closes_after_a_protocol_error_carries_no_further_call() {
    let Some(server) = Server::start().await else {
        return;
    };
    let socket = server.dir.path().join("redis.sock");
    let url = format!("unix://{}", socket.display());
    let pool = Pool::new(Target::parse(&url, TIMEOUT).unwrap());
    let mut long = vec![&b"MSET"[..]];
    long.extend([&b"k"[..], b"v"].repeat(5));
    let refusal = |v: Value| match v {
        Value::Error(text) => sluice_redis::error::reply(text),
        other => panic!("answered without a password: {other:?}"),
    };
    let refused = refusal(pool.query(&Request::command(&long)).await.unwrap());
    assert!(refused.message().contains("Protocol error"), "{refused}");
    for _ in 0..3 {
        let answer = pool.query(&Request::command(&[b"PING"])).await;
        let answer = refusal(answer.expect("a reply, not a closed connection"));
        assert_eq!(answer.kind(), ErrorKind::NoAuth, "{answer}");
    }
}
