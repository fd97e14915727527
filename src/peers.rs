//! The side channel of `failure_mode: local` over HTTP. A replica that finds a
//! shard unreachable asks each live peer, `POST /local-share/cut`, whether it
//! reaches the shard; the peer answers after probing it, and holds the asker's
//! share if it does (`http` serves the question, `limiter::local` keeps the state).
//!
//! The questions go from one task, never from the request path, each on a fresh
//! connection with a short deadline: a few hundred bytes every half second per
//! peer while a shard is lost, nothing otherwise, over hyper's HTTP/1.1 client.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde::{Deserialize, Serialize};

use crate::limiter::local::peers::{Answer, Peer};
use crate::service::Service;
use crate::store::Store;

/// Where a replica takes its peers' questions, on its HTTP port.
pub const PATH: &str = "/local-share/cut";

/// The largest question or answer read (both are far smaller).
pub const MAX_BYTES: usize = 1024;

/// "I am cut off from shard `shard`; do you reach it?"
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// The asker's replica id (as in the heartbeat set).
    pub replica: String,
    /// The shard, as its position in `--redis` (every replica lists the same shards
    /// in the same order, or their counters would not meet).
    pub shard: usize,
}

/// The answer: whether the peer reached the shard just now, and whether it holds
/// the asker's share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub reached: bool,
    pub reserved: bool,
}

/// Runs the questions until `stop`: on each tick (and as soon as an episode
/// starts), ends the episodes whose shard answers again and sends the questions
/// due, each waiting at most `wait` for its answer. A round's answers stand as
/// they come: a later round's may land first, and either way the asker shares.
pub fn ask<S: Store>(
    service: Arc<Service<S>>,
    wait: Duration,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    tokio::spawn(async move {
        tokio::pin!(stop);
        let limiter = &service.limiter;
        let local = limiter.local();
        let id = local.replica_id().to_string();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => {},
                _ = local.peers().woken() => {},
            }
            let now = local.now();
            for shard in local.peers().cut_off() {
                if !limiter.store().shard_failing(shard) {
                    local.peers().back(shard, now);
                }
            }
            // Each round on a task of its own: one that waits out a silent peer
            // (up to `wait`, the store timeout and more) does not hold back the
            // next, which renews the holds of the peers that did answer.
            for round in local.peers().due(now) {
                let service = service.clone();
                let question = Question {
                    replica: id.clone(),
                    shard: round.shard,
                };
                tokio::spawn(async move {
                    let answers = round.peers.iter().map(|p| one(p, &question, wait));
                    let answers = futures::future::join_all(answers).await;
                    for (_, a) in &answers {
                        service.metrics.local().peer_query(*a);
                    }
                    let local = service.limiter.local();
                    local
                        .peers()
                        .answered(round.shard, round.episode, &answers, local.now());
                });
            }
        }
    });
}

/// `peer`'s answer to `question`, `Silent` when it does not come in time or does
/// not read.
async fn one(peer: &Peer, question: &Question, wait: Duration) -> (String, Answer) {
    let answer = match &peer.address {
        Some(address) => match post(address, question, wait).await {
            Ok(r) if r.reached => Answer::Reached,
            Ok(_) => Answer::NotReached,
            Err(e) => {
                tracing::debug!(peer = %peer.id, %address, error = %e, "local share: a peer did not answer");
                Answer::Silent
            }
        },
        None => Answer::Silent,
    };
    (peer.id.clone(), answer)
}

/// Sends `question` to the replica at `address` (HOST:PORT) and reads its reply,
/// within `wait`.
pub async fn post(address: &str, question: &Question, wait: Duration) -> Result<Reply, String> {
    let body = serde_json::to_vec(question).map_err(|e| e.to_string())?;
    let request = http::Request::post(PATH)
        .header(http::header::HOST, address)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CONNECTION, "close")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
        let answer = async move {
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| format!("send: {e}"))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_BYTES * 4)
                .collect()
                .await
                .map_err(|e| format!("read: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        // The connection runs beside the exchange and ends with it (`connection:
        // close`); the deadline bounds both.
        let (answer, _) = tokio::join!(answer, connection);
        answer
    };
    let (status, body) = tokio::time::timeout(wait, exchange)
        .await
        .map_err(|_| format!("no answer within {wait:?}"))??;
    parse_reply(status, &body)
}

/// A reply's status and JSON body: a 200 with a [`Reply`], or an error.
fn parse_reply(status: http::StatusCode, body: &[u8]) -> Result<Reply, String> {
    if status != http::StatusCode::OK {
        return Err(format!(
            "status {status}: {}",
            String::from_utf8_lossy(body).trim()
        ));
    }
    serde_json::from_slice(body).map_err(|e| format!("reply: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_reads_from_a_200_and_anything_else_is_an_error() {
        use http::StatusCode;
        let ok = br#"{"reached":true,"reserved":true}"#;
        assert_eq!(
            parse_reply(StatusCode::OK, ok),
            Ok(Reply {
                reached: true,
                reserved: true
            })
        );
        let bad = parse_reply(StatusCode::BAD_REQUEST, br#"{"error":"no shard 9"}"#);
        assert!(bad.unwrap_err().contains("400"));
        assert!(parse_reply(StatusCode::OK, b"").is_err());
        assert!(parse_reply(StatusCode::OK, br#"{"reached":1}"#).is_err());
    }

    #[test]
    fn a_question_is_small_and_names_its_fields() {
        let q = Question {
            replica: "00c0ffee00c0ffee".into(),
            shard: 1,
        };
        let text = serde_json::to_string(&q).unwrap();
        assert_eq!(text, r#"{"replica":"00c0ffee00c0ffee","shard":1}"#);
        assert!(text.len() < MAX_BYTES);
        assert!(serde_json::from_str::<Question>(r#"{"replica":"a","shard":1,"x":2}"#).is_err());
    }
}
