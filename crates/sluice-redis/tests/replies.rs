//! Replies as a misbehaving or slow server sends them, from a fake server on a TCP
//! port: in pieces, byte by byte, or declaring far more than a reply may hold.

use std::time::Duration;

use sluice_redis::{Answer, ErrorKind, Request, Target, Value, Wire};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const TIMEOUT: Duration = Duration::from_secs(2);

/// A server on a local port that answers each command it reads with the next of
/// `replies`, sent in the pieces given, one write (and a pause) each, and then
/// keeps the connection open, silent, until the client goes.
async fn fake(replies: Vec<Vec<&'static [u8]>>) -> Target {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let mut buf = [0u8; 1024];
        for pieces in replies {
            // One command per read: the client sends each whole and waits.
            if tcp.read(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
            for piece in pieces {
                if tcp.write_all(piece).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        while tcp.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    });
    Target::parse(&format!("redis://127.0.0.1:{port}"), TIMEOUT).unwrap()
}

fn bytes(reply: &'static [u8]) -> Vec<&'static [u8]> {
    reply.chunks(1).collect()
}

#[tokio::test]
async fn a_reply_that_declares_more_than_it_may_hold_is_refused_at_once() {
    // 12 bytes that declare 16 Mi integers: 64 MiB at least, over the limit.
    let target = fake(vec![vec![b"*1677", b"7216\r", b"\n", b":1\r\n"]]).await;
    let mut wire = Wire::connect(&target).await.unwrap();
    let answer = tokio::time::timeout(TIMEOUT, wire.call(&Request::command(&[b"EVALSHA"])))
        .await
        .expect("refused without waiting for the rest");
    let e = answer.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert!(e.to_string().contains("reply too large"), "{e}");
}

#[tokio::test]
async fn a_bulk_string_longer_than_a_reply_may_be_is_refused_at_once() {
    let target = fake(vec![vec![b"*2\r\n$67108", b"864\r\n", b"ab"]]).await;
    let mut wire = Wire::connect(&target).await.unwrap();
    let answer = tokio::time::timeout(TIMEOUT, wire.query(&Request::command(&[b"GET"])))
        .await
        .expect("refused without waiting for the rest");
    let e = answer.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
}

#[tokio::test]
async fn replies_sent_a_byte_at_a_time_are_read_whole() {
    let target = fake(vec![
        bytes(b"*3\r\n:1\r\n:22\r\n:333\r\n"),
        bytes(b"*2\r\n$5\r\nhel\nl\r\n*1\r\n+OK\r\n"),
        // Two replies in one: the second is read from what is left of the first.
        vec![b"+OK\r\n$1\r", b"\nx\r", b"\n"],
    ])
    .await;
    let mut wire = Wire::connect(&target).await.unwrap();
    let answer = tokio::time::timeout(TIMEOUT, wire.call(&Request::command(&[b"EVALSHA"]))).await;
    assert_eq!(answer.unwrap().unwrap(), Answer::Integers(vec![1, 22, 333]));
    let req = Request::command(&[b"GET"]);
    let value = tokio::time::timeout(TIMEOUT, wire.query(&req)).await;
    assert_eq!(
        value.unwrap().unwrap(),
        Value::Array(vec![
            Value::Bulk(b"hel\nl".to_vec()),
            Value::Array(vec![Value::Status("OK".into())]),
        ])
    );
    let value = tokio::time::timeout(TIMEOUT, wire.query(&req)).await;
    assert_eq!(value.unwrap().unwrap(), Value::Status("OK".into()));
    let value = tokio::time::timeout(TIMEOUT, wire.next()).await;
    assert_eq!(value.unwrap().unwrap(), Value::Bulk(b"x".to_vec()));
}
