//! What cluster nodes answer about slots: the slot map (`CLUSTER SLOTS`) and the
//! redirects (`MOVED`, `ASK`) of a node that does not serve a key's slot.

use super::SLOTS;
use crate::{error, Error, ErrorKind, Value};

/// A range of slots and the `host:port` of the master serving it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub first: u16,
    pub last: u16,
    pub host: String,
    pub port: u16,
}

fn bad(what: &str) -> Error {
    Error::failed(ErrorKind::Protocol, format!("CLUSTER SLOTS: {what}"))
}

/// Reads a `CLUSTER SLOTS` reply: per range `[first, last, [host, port, id, ...],
/// replicas...]`. A master without a known endpoint (an empty host, `?` or nil) is
/// `asked`, the node that answered, as Redis means it.
pub fn parse_slots(reply: Value, asked: &str) -> Result<Vec<Range>, Error> {
    let entries = match reply {
        Value::Array(a) => a,
        Value::Error(e) => return Err(error::reply(e)),
        _ => return Err(bad("not an array")),
    };
    entries
        .into_iter()
        .map(|entry| {
            let items = entry
                .into_array()
                .ok_or_else(|| bad("a range is no array"))?;
            let [first, last, master, ..] = items.as_slice() else {
                return Err(bad("a range without its master"));
            };
            let slot = |v: &Value| {
                v.as_int()
                    .and_then(|s| u16::try_from(s).ok())
                    .filter(|s| *s < SLOTS)
                    .ok_or_else(|| bad("a slot out of range"))
            };
            let (first, last) = (slot(first)?, slot(last)?);
            if first > last {
                return Err(bad("a range that ends before it starts"));
            }
            let Value::Array(master) = master else {
                return Err(bad("a master is no array"));
            };
            let (host, port) = match master.as_slice() {
                [host, port, ..] => (host, port),
                _ => return Err(bad("a master without host and port")),
            };
            let host = match host {
                Value::Nil => String::new(),
                h => h.as_text().ok_or_else(|| bad("a host is no text"))?,
            };
            let host = if host.is_empty() || host == "?" {
                asked.to_string()
            } else {
                host
            };
            let port = port
                .as_int()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("a port out of range"))?;
            Ok(Range {
                first,
                last,
                host,
                port,
            })
        })
        .collect()
}

/// Where a node sent a call for a slot it does not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// The slot lives on that node now (`MOVED slot host:port`).
    Moved { slot: u16, host: String, port: u16 },
    /// This one call goes to that node, after `ASKING` (`ASK slot host:port`): the
    /// slot is being migrated there.
    Ask { slot: u16, host: String, port: u16 },
}

/// The redirect of an error reply (without its dash); `Ok(None)` for any other
/// error. An empty host (`MOVED 12 :7001`) is `asked`'s, the node that answered.
pub fn redirect(text: &str, asked: &str) -> Result<Option<Redirect>, Error> {
    let mut words = text.split(' ');
    let code = words.next().unwrap_or("");
    if code != "MOVED" && code != "ASK" {
        return Ok(None);
    }
    let wrong = || Error::failed(ErrorKind::Protocol, format!("bad redirect: {text}"));
    let slot = words
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|s| *s < SLOTS)
        .ok_or_else(wrong)?;
    let (host, port) = words
        .next()
        .and_then(|a| a.rsplit_once(':'))
        .ok_or_else(wrong)?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(wrong)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = if host.is_empty() { asked } else { host }.to_string();
    Ok(Some(if code == "MOVED" {
        Redirect::Moved { slot, host, port }
    } else {
        Redirect::Ask { slot, host, port }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }

    fn node(host: Value, port: i64) -> Value {
        Value::Array(vec![
            host,
            Value::Int(port),
            bulk("07c37dfeb235213a872192d90877d0cd55635b91"),
        ])
    }

    #[test]
    fn cluster_slots_name_each_range_s_master() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node(bulk("127.0.0.1"), 30001),
                node(bulk("127.0.0.1"), 30004),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node(bulk(""), 30002),
            ]),
            Value::Array(vec![Value::Int(7), Value::Int(7), node(Value::Nil, 30003)]),
        ]);
        let ranges = parse_slots(reply, "10.0.0.9").unwrap();
        let range = |first, last, host: &str, port| Range {
            first,
            last,
            host: host.to_string(),
            port,
        };
        assert_eq!(
            ranges,
            vec![
                range(0, 5460, "127.0.0.1", 30001),
                range(5461, 16383, "10.0.0.9", 30002),
                range(7, 7, "10.0.0.9", 30003),
            ]
        );
        // A cluster without assigned slots.
        assert_eq!(parse_slots(Value::Array(vec![]), "h").unwrap(), vec![]);
    }

    #[test]
    fn bad_cluster_slots_replies_are_errors() {
        let range = |items: Vec<Value>| Value::Array(vec![Value::Array(items)]);
        let ok_node = || node(bulk("h"), 1);
        for bad in [
            Value::Nil,
            bulk("x"),
            Value::Array(vec![Value::Int(1)]),
            range(vec![Value::Int(0), Value::Int(10)]),
            range(vec![Value::Int(0), Value::Int(16384), ok_node()]),
            range(vec![Value::Int(-1), Value::Int(10), ok_node()]),
            range(vec![Value::Int(10), Value::Int(9), ok_node()]),
            range(vec![Value::Int(0), Value::Int(1), Value::Int(5)]),
            range(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Array(vec![bulk("h")]),
            ]),
            range(vec![Value::Int(0), Value::Int(1), node(bulk("h"), 0)]),
            range(vec![Value::Int(0), Value::Int(1), node(bulk("h"), 70000)]),
            range(vec![Value::Int(0), Value::Int(1), node(Value::Int(3), 1)]),
        ] {
            let e = parse_slots(bad.clone(), "h").expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::Protocol, "{bad:?}");
        }
        let e = parse_slots(
            Value::Error("ERR This instance has cluster support disabled".into()),
            "h",
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Script);
    }

    #[test]
    fn redirects_name_the_slot_and_node() {
        let moved = |slot, host: &str, port| Redirect::Moved {
            slot,
            host: host.into(),
            port,
        };
        assert_eq!(
            redirect("MOVED 3999 127.0.0.1:6381", "a").unwrap(),
            Some(moved(3999, "127.0.0.1", 6381))
        );
        assert_eq!(
            redirect("ASK 0 cache-2.internal:7000", "a").unwrap(),
            Some(Redirect::Ask {
                slot: 0,
                host: "cache-2.internal".into(),
                port: 7000
            })
        );
        assert_eq!(
            redirect("MOVED 16383 ::1:7002", "a").unwrap(),
            Some(moved(16383, "::1", 7002))
        );
        assert_eq!(
            redirect("MOVED 5 :7002", "10.0.0.9").unwrap(),
            Some(moved(5, "10.0.0.9", 7002))
        );
        for other in [
            "CLUSTERDOWN Hash slot not served",
            "ERR MOVED",
            "MOVEDX 1 h:1",
            "",
        ] {
            assert_eq!(redirect(other, "a").unwrap(), None, "{other:?}");
        }
        for bad in [
            "MOVED",
            "MOVED x h:1",
            "MOVED 16384 h:1",
            "MOVED 1",
            "MOVED 1 h",
            "MOVED 1 h:0",
            "MOVED 1 h:99999",
            "ASK 1 h:port",
        ] {
            assert_eq!(
                redirect(bad, "a").unwrap_err().kind(),
                ErrorKind::Protocol,
                "{bad}"
            );
        }
    }
}
