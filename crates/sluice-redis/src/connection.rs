//! One connection to a Redis server, serving one call at a time, and RESP2 requests
//! and the replies of the calls on the decide path.
//!
//! A caller with at most one call in flight needs no multiplexing: it writes the
//! call into one reused [`Request`], sends it, and parses the reply (a flat array of
//! integers) straight into numbers ([`Wire::call`]), without a task hop or an
//! allocation per argument and per reply value. Any other reply is read as a
//! [`Value`] ([`Wire::query`]). Any I/O or protocol error leaves the connection
//! unusable, so a reply can never be matched to the wrong call; the caller drops it
//! and connects again.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};

use crate::error::{self, Error, ErrorKind};
use crate::stream;
use crate::target::Target;
use crate::value::{self, Value};

/// A RESP2 request being built: `*N` then each argument as a bulk string.
#[derive(Debug, Default)]
pub struct Request {
    buf: Vec<u8>,
}

// `#[inline]`: the decide path writes each argument through these, from another
// crate, and a release build without LTO inlines across crates only what says so.
impl Request {
    /// A whole command of the given arguments (the command name first).
    pub fn command(parts: &[&[u8]]) -> Request {
        let mut req = Request::default();
        req.start(parts.len());
        for p in parts {
            req.arg(p);
        }
        req
    }

    /// Starts a command of `args` arguments (the command name included).
    #[inline]
    pub fn start(&mut self, args: usize) {
        self.buf.clear();
        self.buf.push(b'*');
        push_decimal(&mut self.buf, args as u64);
        self.buf.extend_from_slice(b"\r\n");
    }

    #[inline]
    pub fn arg(&mut self, value: &[u8]) {
        self.buf.push(b'$');
        push_decimal(&mut self.buf, value.len() as u64);
        self.buf.extend_from_slice(b"\r\n");
        self.buf.extend_from_slice(value);
        self.buf.extend_from_slice(b"\r\n");
    }

    #[inline]
    pub fn arg_u64(&mut self, value: u64) {
        self.arg(itoa::Buffer::new().format(value).as_bytes());
    }

    /// A signed integer argument, in decimal.
    #[inline]
    pub fn arg_i64(&mut self, value: i64) {
        self.arg(itoa::Buffer::new().format(value).as_bytes());
    }

    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

#[inline]
fn push_decimal(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// What Redis answered to one command.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// An array of integers (the decide script's reply).
    Integers(Vec<i64>),
    /// A status (`+OK`) or an integer alone.
    Status,
    /// An error reply (`-NOSCRIPT ...`, `-ERR ...`), without the dash.
    Error(String),
}

/// Reads one reply of some shape from the start of a buffer: the reply and the bytes
/// it took, or `None` while incomplete.
pub type Parser<T> = fn(&[u8]) -> Result<Option<(T, usize)>, Error>;

/// What a reader made of the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed<T> {
    /// A whole reply and the bytes it took.
    Done(T, usize),
    /// Incomplete: the reply takes at least this many bytes from the start.
    Short(usize),
}

impl<T> Parsed<T> {
    #[inline]
    pub(crate) fn done(self) -> Option<(T, usize)> {
        match self {
            Parsed::Done(t, used) => Some((t, used)),
            Parsed::Short(_) => None,
        }
    }
}

/// A [`Parser`] that says how short an incomplete reply is.
type Reader<T> = fn(&[u8]) -> Result<Parsed<T>, Error>;

/// One connection to a server.
pub struct Wire {
    stream: stream::Stream,
    read: Vec<u8>,
    /// Where the next reply starts in `read` (pub/sub messages and pipelined
    /// replies may arrive together).
    at: usize,
    /// When the last reply arrived (or the connection opened).
    used: Instant,
    /// Redis answered with an error after which it closes the connection
    /// ([`error::closes_connection`]).
    closing: bool,
}

/// Idle this long, a connection is looked at before it is used again
/// ([`Wire::stale`]). Redis's `timeout` counts whole seconds from the last
/// second's tick, so it may close a connection idle for less than one.
const IDLE_CHECK: Duration = Duration::from_millis(250);

impl Wire {
    /// Connects, authenticates and selects the database, within the target's timeout.
    pub async fn connect(target: &Target) -> Result<Wire, Error> {
        match tokio::time::timeout(target.timeout, Self::open(target)).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout),
        }
    }

    async fn open(target: &Target) -> Result<Wire, Error> {
        let mut wire = Wire {
            stream: stream::open(target).await?,
            read: Vec::with_capacity(4096),
            at: 0,
            used: Instant::now(),
            closing: false,
        };
        let mut req = Request::default();
        if let Some(password) = &target.password {
            match &target.username {
                Some(user) => {
                    req.start(3);
                    req.arg(b"AUTH");
                    req.arg(user.as_bytes());
                }
                None => {
                    req.start(2);
                    req.arg(b"AUTH");
                }
            }
            req.arg(password.as_bytes());
            wire.expect_ok(&req, "AUTH").await?;
        }
        if target.db != 0 {
            req.start(2);
            req.arg(b"SELECT");
            req.arg_u64(target.db as u64);
            // A database the server does not have (past its `databases`, or any but
            // 0 on a cluster node) fails every connection, not a call: a connection
            // error, so the shard is backed off instead of dialled for every call.
            wire.expect_ok(&req, "SELECT")
                .await
                .map_err(|e| match e.kind() {
                    ErrorKind::Script => Error::failed(
                        ErrorKind::Connection,
                        format!(
                            "{}: the URL names database {}, which this server does not \
                             have (see its `databases` setting; a cluster node has only 0)",
                            e.message(),
                            target.db
                        ),
                    ),
                    _ => e,
                })?;
        }
        Ok(wire)
    }

    async fn expect_ok(&mut self, req: &Request, what: &str) -> Result<(), Error> {
        match self.call(req).await? {
            Answer::Status => Ok(()),
            Answer::Error(e) => Err(Error::failed(error::reply_kind(&e), format!("{what}: {e}"))),
            Answer::Integers(_) => Err(Error::failed(
                ErrorKind::Protocol,
                format!("{what}: unexpected reply"),
            )),
        }
    }

    /// Whether the server closed this connection while it sat idle (its `timeout`,
    /// or a NAT or load balancer that cuts idle connections), is closing it after an
    /// error reply, or sent what no call asked for: then it must not carry a
    /// call. Only a connection idle for a quarter of a second is looked at, by one
    /// read that does not wait; a call sent on a connection already closed would
    /// fail, and one closed while a call is under way may have run it, so only this
    /// moment can tell.
    pub fn stale(&mut self) -> bool {
        if self.closing || self.at < self.read.len() {
            return true;
        }
        if self.used.elapsed() < IDLE_CHECK {
            return false;
        }
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(Waker::noop());
        // Pending: open and quiet. Anything else: closed, failed, or bytes no
        // call asked for.
        !matches!(
            Pin::new(&mut self.stream).poll_read(&mut cx, &mut buf),
            Poll::Pending
        )
    }

    /// Writes `bytes` (one or more commands) and flushes them.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let written = async {
            self.stream.write_all(bytes).await?;
            self.stream.flush().await
        };
        written.await.map_err(|e| error::io("write", &e))
    }

    /// Sends one command and reads its answer, a decide script's reply, a status or
    /// an error. An `Err` leaves the connection unusable.
    pub async fn call(&mut self, req: &Request) -> Result<Answer, Error> {
        self.send(req.bytes()).await?;
        self.reply(read_answer).await
    }

    /// Sends one command and reads its reply, whatever its shape.
    pub async fn query(&mut self, req: &Request) -> Result<Value, Error> {
        self.send(req.bytes()).await?;
        self.next().await
    }

    /// Reads the next reply: the answer to a command sent with [`Wire::send`], or a
    /// message pushed to a subscriber.
    pub async fn next(&mut self) -> Result<Value, Error> {
        self.reply(value::read).await
    }

    /// Reads until `read` finds a whole reply. A reply that arrives in pieces is not
    /// read again from its start for each: only once as many bytes have arrived as
    /// it takes at least, and among the new ones the LF that ends every reply (the
    /// ones before held none whole).
    async fn reply<T>(&mut self, read: Reader<T>) -> Result<T, Error> {
        // Bytes (from `at`) the reply takes at least; 0 until it was found short.
        let mut need = 0;
        // Bytes (from `at`) looked at already, found short.
        let mut seen = 0;
        loop {
            let have = self.read.len() - self.at;
            if need == 0 || (have >= need && self.read[self.at + seen..].contains(&b'\n')) {
                match read(&self.read[self.at..])? {
                    Parsed::Done(answer, used) => {
                        self.closing |= self.read[self.at] == b'-'
                            && error::closes_connection(&self.read[self.at + 1..]);
                        self.used = Instant::now();
                        self.at += used;
                        if self.at == self.read.len() {
                            self.read.clear();
                            self.at = 0;
                        }
                        return Ok(answer);
                    }
                    Parsed::Short(n) => need = n,
                }
                seen = have;
            } else if have >= need {
                seen = have;
            }
            if have > MAX_REPLY || need > MAX_REPLY {
                return Err(Error::failed(ErrorKind::Protocol, "reply too large"));
            }
            if self.at > 0 {
                self.read.drain(..self.at);
                self.at = 0;
            }
            let n = self
                .stream
                .read_buf(&mut self.read)
                .await
                .map_err(|e| error::io("read", &e))?;
            if n == 0 {
                return Err(Error::failed(
                    ErrorKind::Connection,
                    "connection closed by Redis",
                ));
            }
        }
    }
}

/// A decide reply is at most 64 requests' worth of 512 keys of 7 integers: far below.
pub(crate) const MAX_REPLY: usize = 64 << 20;

pub(crate) fn protocol(what: &str) -> Error {
    Error::failed(
        ErrorKind::Protocol,
        format!("unexpected Redis reply: {what}"),
    )
}

/// The line starting at `at` (without CRLF) and where the next one starts; `None`
/// until the CRLF has arrived.
pub(crate) fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], at + end + 2))
}

pub(crate) fn integer(text: &[u8]) -> Result<i64, Error> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', d)) => (true, d),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(protocol("bad integer"));
    }
    let mut v: i64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return Err(protocol("bad integer"));
        }
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(c - b'0')))
            .ok_or_else(|| protocol("integer out of range"))?;
    }
    Ok(if negative { -v } else { v })
}

/// Parses one complete answer from the start of `buf`, with the bytes it took;
/// `Ok(None)` while incomplete. Only what the decide script, AUTH and SELECT answer
/// is accepted.
pub fn parse(buf: &[u8]) -> Result<Option<(Answer, usize)>, Error> {
    read_answer(buf).map(Parsed::done)
}

/// [`parse`], saying how short an incomplete answer is.
fn read_answer(buf: &[u8]) -> Result<Parsed<Answer>, Error> {
    let Some((first, mut at)) = line(buf, 0) else {
        // 3 bytes at least (`+\r\n`), the last of them past the buffer.
        return Ok(Parsed::Short(buf.len().max(2) + 1));
    };
    let Some((&kind, text)) = first.split_first() else {
        return Err(protocol("empty line"));
    };
    match kind {
        b'+' | b':' => Ok(Parsed::Done(Answer::Status, at)),
        b'-' => Ok(Parsed::Done(
            Answer::Error(String::from_utf8_lossy(text).into_owned()),
            at,
        )),
        b'*' => {
            let n = integer(text)?;
            // *-1 (a null array) is not something the scripts send.
            let n = usize::try_from(n).map_err(|_| protocol("null array"))?;
            if n > MAX_REPLY / 4 {
                return Err(protocol("array too long"));
            }
            // Each item takes 4 bytes at least (`:0\r\n`): no reservation past what
            // has arrived (a 12-byte header may declare 16 Mi items).
            let mut values = Vec::with_capacity(n.min((buf.len() - at) / 4));
            for i in 0..n {
                let Some((item, next)) = line(buf, at) else {
                    // This item ends past the buffer, and each one after takes 4 more.
                    let end = (at + 4).max(buf.len() + 1);
                    return Ok(Parsed::Short(end + 4 * (n - i - 1)));
                };
                match item.split_first() {
                    Some((b':', digits)) => values.push(integer(digits)?),
                    _ => return Err(protocol("array item is not an integer")),
                }
                at = next;
            }
            Ok(Parsed::Done(Answer::Integers(values), at))
        }
        _ => Err(protocol("unknown reply type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_resp_bulk_strings() {
        let mut r = Request::default();
        r.start(3);
        r.arg(b"SET");
        r.arg(b"k");
        r.arg_u64(1_234_567_890_123);
        assert_eq!(
            r.bytes(),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$13\r\n1234567890123\r\n"
        );
        r.start(2);
        r.arg(b"X");
        r.arg_u64(0);
        assert_eq!(r.bytes(), b"*2\r\n$1\r\nX\r\n$1\r\n0\r\n");
        r.start(3);
        r.arg_i64(-12);
        r.arg_i64(7);
        r.arg_i64(i64::MIN);
        assert_eq!(
            r.bytes(),
            &b"*3\r\n$3\r\n-12\r\n$1\r\n7\r\n$20\r\n-9223372036854775808\r\n"[..]
        );
    }

    #[test]
    fn replies_parse_only_when_complete() {
        let full = b"*3\r\n:1\r\n:-1\r\n:9007199254740993\r\n";
        for cut in 0..full.len() {
            assert_eq!(parse(&full[..cut]).unwrap(), None, "cut at {cut}");
            // What it says the reply takes at least: more than it has, no more than
            // the reply.
            let Parsed::Short(need) = read_answer(&full[..cut]).unwrap() else {
                panic!("cut at {cut}: not short");
            };
            assert!(cut < need && need <= full.len(), "cut at {cut}: {need}");
        }
        // Items of 4 bytes: the bound is the reply's length.
        let small = b"*3\r\n:1\r\n:2\r\n:3\r\n";
        assert_eq!(
            read_answer(&small[..6]).unwrap(),
            Parsed::Short(small.len())
        );
        // A header that declares more than a reply may hold is found short of it at
        // once.
        let Parsed::Short(need) = read_answer(b"*16777216\r\n").unwrap() else {
            panic!("not short");
        };
        assert!(need > MAX_REPLY, "{need}");
        assert_eq!(
            parse(full).unwrap(),
            Some((
                Answer::Integers(vec![1, -1, 9_007_199_254_740_993]),
                full.len()
            ))
        );
        assert_eq!(
            parse(b"*0\r\n:5\r\n").unwrap(),
            Some((Answer::Integers(vec![]), 4))
        );
        assert_eq!(parse(b"+OK\r\n").unwrap(), Some((Answer::Status, 5)));
        assert_eq!(
            parse(b"-NOSCRIPT No matching script\r\n").unwrap(),
            Some((Answer::Error("NOSCRIPT No matching script".to_string()), 30))
        );
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        for bad in [
            &b"*2\r\n$1\r\nx\r\n"[..],
            b"*-1\r\n",
            b"*x\r\n",
            b"?\r\n",
            b"\r\n",
            b"*1\r\n:99999999999999999999\r\n",
            b"*1\r\n:\r\n",
            b"*1\r\n:1a\r\n",
            b"*999999999999\r\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
