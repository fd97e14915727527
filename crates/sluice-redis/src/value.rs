//! Any RESP2 reply, for the calls whose answers are not the decide script's flat
//! array of integers: other scripts, `CONFIG GET`, `CLUSTER SLOTS`, `SENTINEL`,
//! `ROLE`, pub/sub messages.

use crate::connection::{integer, line, protocol, Parsed, MAX_REPLY};
use crate::Error;

/// Arrays nest no deeper than this (`CLUSTER SLOTS` nests three): a reply that does
/// is refused rather than parsed on the stack.
const MAX_DEPTH: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A null bulk string or array.
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    /// A status reply (`+OK`).
    Status(String),
    /// An error reply, without the dash.
    Error(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bulk(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    /// A bulk string or status as text.
    pub fn as_text(&self) -> Option<String> {
        match self {
            Value::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::Status(s) => Some(s.clone()),
            _ => None,
        }
    }

    pub fn into_array(self) -> Option<Vec<Value>> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Parses one complete reply at the start of `buf`: the reply and the bytes it took,
/// or `Ok(None)` while incomplete.
pub fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, Error> {
    read(buf).map(Parsed::done)
}

/// [`parse`], saying how short an incomplete reply is.
pub(crate) fn read(buf: &[u8]) -> Result<Parsed<Value>, Error> {
    parse_at(buf, 0, 0)
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Parsed<Value>, Error> {
    let Some((first, next)) = line(buf, at) else {
        // 3 bytes at least, the last of them past the buffer.
        return Ok(Parsed::Short((at + 3).max(buf.len() + 1)));
    };
    let Some((&kind, text)) = first.split_first() else {
        return Err(protocol("empty line"));
    };
    let value = match kind {
        b'+' => Value::Status(String::from_utf8_lossy(text).into_owned()),
        b'-' => Value::Error(String::from_utf8_lossy(text).into_owned()),
        b':' => Value::Int(integer(text)?),
        b'$' => {
            let n = integer(text)?;
            if n == -1 {
                return Ok(Parsed::Done(Value::Nil, next));
            }
            let n = usize::try_from(n).map_err(|_| protocol("bad length"))?;
            if n > MAX_REPLY {
                return Err(protocol("bulk string too long"));
            }
            let end = next + n;
            if buf.len() < end + 2 {
                return Ok(Parsed::Short(end + 2));
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(protocol("bulk string without CRLF"));
            }
            return Ok(Parsed::Done(Value::Bulk(buf[next..end].to_vec()), end + 2));
        }
        b'*' => {
            let n = integer(text)?;
            if n == -1 {
                return Ok(Parsed::Done(Value::Nil, next));
            }
            let n = usize::try_from(n).map_err(|_| protocol("bad length"))?;
            if n > MAX_REPLY / 4 {
                return Err(protocol("array too long"));
            }
            if depth >= MAX_DEPTH {
                return Err(protocol("arrays nested too deep"));
            }
            // Each item takes 3 bytes at least: no reservation past what arrived.
            let mut items = Vec::with_capacity(n.min((buf.len() - next) / 3));
            let mut at = next;
            for i in 0..n {
                match parse_at(buf, at, depth + 1)? {
                    Parsed::Done(item, after) => {
                        items.push(item);
                        at = after;
                    }
                    // Each item after this one takes 3 bytes more.
                    Parsed::Short(end) => return Ok(Parsed::Short(end + 3 * (n - i - 1))),
                }
            }
            return Ok(Parsed::Done(Value::Array(items), at));
        }
        _ => return Err(protocol("unknown reply type")),
    };
    Ok(Parsed::Done(value, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reply_type_parses_only_when_complete() {
        let full = b"*4\r\n$5\r\nhello\r\n:-3\r\n*2\r\n+OK\r\n$-1\r\n-ERR no\r\n";
        for cut in 0..full.len() {
            assert_eq!(parse(&full[..cut]).unwrap(), None, "cut at {cut}");
            // What it says the reply takes at least: more than it has, no more than
            // the reply.
            let Parsed::Short(need) = read(&full[..cut]).unwrap() else {
                panic!("cut at {cut}: not short");
            };
            assert!(cut < need && need <= full.len(), "cut at {cut}: {need}");
        }
        // A bulk string's length says where it ends.
        assert_eq!(read(b"$5\r\nhe").unwrap(), Parsed::Short(11));
        let (v, used) = parse(full).unwrap().unwrap();
        assert_eq!(used, full.len());
        assert_eq!(
            v,
            Value::Array(vec![
                Value::Bulk(b"hello".to_vec()),
                Value::Int(-3),
                Value::Array(vec![Value::Status("OK".into()), Value::Nil]),
                Value::Error("ERR no".into()),
            ])
        );
        assert_eq!(parse(b"*-1\r\n").unwrap(), Some((Value::Nil, 5)));
        assert_eq!(
            parse(b"$0\r\n\r\n:1\r\n").unwrap(),
            Some((Value::Bulk(vec![]), 6))
        );
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        for bad in [
            &b"$3\r\nabcde\r\n"[..],
            b"$-2\r\n",
            b"*-5\r\n",
            b"!3\r\n",
            b"\r\n",
            b":12x\r\n",
            b"$99999999999\r\n",
            deep.as_bytes(),
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_read_as_numbers_and_text() {
        assert_eq!(Value::Bulk(b"42".to_vec()).as_int(), Some(42));
        assert_eq!(Value::Int(7).as_int(), Some(7));
        assert_eq!(Value::Status("x".into()).as_int(), None);
        assert_eq!(
            Value::Status("PONG".into()).as_text().as_deref(),
            Some("PONG")
        );
        assert_eq!(Value::Nil.into_array(), None);
    }
}
