//! gRPC's length-prefixed messages: reading them from a request body, bounded by
//! `--max-request-bytes`, and framing answers.
//!
//! A message's 5-byte prefix (a compression flag and a big-endian length) arrives
//! first, so a message declared larger than the limit is refused before its bytes
//! are read; a body that goes on past the limit is refused as soon as it does.
//!
//! A message that has to wait for its rest is bounded twice: in time (it must be
//! whole within [`Settings::message_timeout`](super::Settings)) and in the bytes all
//! such messages hold at once ([`Charge`]). Otherwise clients that never finish
//! their bodies would hold up to 200 streams × the message limit per connection,
//! for as long as they like. One that arrives whole, as Envoy's do, meets neither:
//! no timer, no clock, no shared counter.

use std::future::{poll_fn, Future};
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::Stream;
use h2::RecvStream;
use tokio::time::Sleep;

use super::status::{Code, GrpcError};
use super::Stats;

/// Bytes of a message's prefix.
const PREFIX: usize = 5;

/// The bytes of one unfinished message counted in [`Stats::buffered`], given back
/// when it is dropped.
pub(super) struct Charge<S: Deref<Target = Stats>> {
    stats: S,
    max: usize,
    held: usize,
}

impl<S: Deref<Target = Stats>> Charge<S> {
    pub(super) fn new(stats: S, max: usize) -> Self {
        Charge {
            stats,
            max,
            held: 0,
        }
    }

    /// Counts `bytes` as this message's, instead of what it held before; refused if
    /// that takes the total past the most. (Refused, the charge stays until dropped:
    /// the call ends and frees it.)
    fn hold(&mut self, bytes: usize) -> Result<(), GrpcError> {
        let total = &self.stats.buffered;
        if bytes > self.held {
            let more = bytes - self.held;
            self.held = bytes;
            let before = total.fetch_add(more, Ordering::Relaxed);
            if before.saturating_add(more) > self.max {
                return Err(GrpcError::buffers_full(self.max));
            }
        } else if bytes < self.held {
            total.fetch_sub(self.held - bytes, Ordering::Relaxed);
            self.held = bytes;
        }
        Ok(())
    }
}

impl<S: Deref<Target = Stats>> Drop for Charge<S> {
    fn drop(&mut self) {
        if self.held > 0 {
            self.stats.buffered.fetch_sub(self.held, Ordering::Relaxed);
        }
    }
}

/// Reads a unary call's body and takes its one message out, with the time it
/// first had to wait for the body (taken only when `timed`; `None` if it never
/// waited). `Ok(None)`: the stream broke (reset, connection gone) and there is no
/// one to answer. A body that is not whole within `limit` of the first wait (in
/// the poll that read the headers) is refused, and so is one that would wait
/// holding more than `charge` may.
pub(super) async fn read_message<S: Deref<Target = Stats>>(
    mut body: RecvStream,
    max: usize,
    timed: bool,
    limit: Duration,
    mut charge: Charge<S>,
) -> Result<Option<(Bytes, Option<quanta::Instant>)>, GrpcError> {
    let mut waited: Option<quanta::Instant> = None;
    // Armed at the first wait only. Boxed: a call that never waits carries a
    // pointer, not the timer.
    let mut timer: Option<Pin<Box<Sleep>>> = None;
    // Most requests come in one DATA frame, kept as it is; only a body in several
    // frames is copied into one buffer.
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut len = 0usize;
    let mut declared = false;
    // Saturating: `max` may be as large as `usize::MAX`.
    let most = max.saturating_add(PREFIX);
    loop {
        let held = match (&first, &more) {
            (_, Some(buf)) => buf.capacity(),
            (Some(f), None) => f.len(),
            (None, None) => 0,
        };
        let next = poll_fn(|cx| {
            let next = body.poll_data(cx);
            if next.is_pending() {
                if timer.is_none() {
                    if timed {
                        waited = Some(quanta::Instant::now());
                    }
                    timer = Some(Box::pin(tokio::time::sleep(limit)));
                }
                charge.hold(held)?;
                if timer
                    .as_mut()
                    .is_some_and(|t| t.as_mut().poll(cx).is_ready())
                {
                    return Poll::Ready(Err(GrpcError::message_timeout(limit)));
                }
            }
            next.map(Ok)
        });
        let Some(chunk) = next.await? else {
            break;
        };
        let Ok(chunk) = chunk else {
            return Ok(None);
        };
        // The window reopens as data is read, not when the call is answered.
        let _ = body.flow_control().release_capacity(chunk.len());
        len += chunk.len();
        if len > most {
            return Err(GrpcError::too_large(len - PREFIX, max));
        }
        match (&first, &mut more) {
            (None, _) => first = Some(chunk),
            (Some(f), None) => {
                let mut buf = BytesMut::with_capacity(f.len() + chunk.len());
                buf.extend_from_slice(f);
                buf.extend_from_slice(&chunk);
                more = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&chunk),
        }
        if !declared && len >= PREFIX {
            declared = true;
            let head = match (&first, &more) {
                (_, Some(buf)) => &buf[..PREFIX],
                (Some(f), None) => &f[..PREFIX],
                (None, None) => unreachable!("len >= PREFIX"),
            };
            check_prefix(head, max)?;
        }
    }
    let body = match (first, more) {
        (_, Some(buf)) => buf.freeze(),
        (Some(f), None) => f,
        (None, None) => Bytes::new(),
    };
    unframe(body, max).map(|m| Some((m, waited)))
}

/// The declared length of the message whose prefix `head` is, if it may be read.
fn check_prefix(head: &[u8], max: usize) -> Result<usize, GrpcError> {
    if head[0] != 0 {
        return Err(GrpcError::new(
            Code::Unimplemented,
            "compressed messages are not supported",
        ));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > max {
        return Err(GrpcError::too_large(len, max));
    }
    Ok(len)
}

/// The message inside one length-prefixed gRPC frame (a unary call's whole body).
pub(super) fn unframe(mut body: Bytes, max: usize) -> Result<Bytes, GrpcError> {
    if body.len() < PREFIX {
        return Err(GrpcError::new(
            Code::Internal,
            "the request carries no complete gRPC message",
        ));
    }
    let len = check_prefix(&body[..PREFIX], max)?;
    if body.len() - PREFIX != len {
        return Err(GrpcError::new(
            Code::Internal,
            format!(
                "the request's gRPC frame declares {len} bytes but {} follow; a unary call carries exactly one message",
                body.len() - PREFIX
            ),
        ));
    }
    Ok(body.split_off(PREFIX))
}

/// The request messages of a client- or bidirectional-streaming call, each without
/// its prefix, until the client ends its side. An `Err` item (a compressed, oversized
/// or truncated message, or a broken stream) is the last.
///
/// A message begun must be whole within the message timeout, and counts against
/// the unfinished bytes while it waits; between messages a stream may stay idle
/// for as long as the call lasts.
pub struct Messages {
    body: RecvStream,
    buf: BytesMut,
    max: usize,
    done: bool,
    limit: Duration,
    charge: Charge<Arc<Stats>>,
    /// Runs while a begun message waits for its rest.
    timer: Option<Pin<Box<Sleep>>>,
    timing: bool,
}

impl Messages {
    pub(super) fn new(
        body: RecvStream,
        max: usize,
        limit: Duration,
        charge: Charge<Arc<Stats>>,
    ) -> Self {
        Messages {
            body,
            buf: BytesMut::new(),
            max,
            done: false,
            limit,
            charge,
            timer: None,
            timing: false,
        }
    }

    /// No more messages: what the stream held is freed, whoever holds it.
    fn end(&mut self) {
        self.done = true;
        self.buf = BytesMut::new();
        self.timer = None;
        let _ = self.charge.hold(0);
    }

    /// Waiting for more of the body: bounds a begun message; an empty buffer is
    /// let go, so that an idle stream holds nothing (the messages taken from it
    /// share its allocation).
    fn wait(&mut self, cx: &mut Context<'_>) -> Result<(), GrpcError> {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
            self.timing = false;
            return self.charge.hold(0);
        }
        self.charge.hold(self.buf.capacity())?;
        if !self.timing {
            self.timing = true;
            let due = tokio::time::Instant::now() + self.limit;
            match &mut self.timer {
                Some(t) => t.as_mut().reset(due),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(due))),
            }
        }
        if let Some(t) = &mut self.timer {
            if t.as_mut().poll(cx).is_ready() {
                return Err(GrpcError::message_timeout(self.limit));
            }
        }
        Ok(())
    }

    /// The next whole message in the buffer, if there is one.
    fn take(&mut self) -> Result<Option<Bytes>, GrpcError> {
        if self.buf.len() < PREFIX {
            return Ok(None);
        }
        let len = check_prefix(&self.buf[..PREFIX], self.max)?;
        if self.buf.len() - PREFIX < len {
            return Ok(None);
        }
        self.buf.advance(PREFIX);
        // The next message gets its own time.
        self.timing = false;
        Ok(Some(self.buf.split_to(len).freeze()))
    }
}

impl Stream for Messages {
    type Item = Result<Bytes, GrpcError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match this.take() {
                Ok(Some(m)) => return Poll::Ready(Some(Ok(m))),
                Ok(None) => {}
                Err(e) => {
                    this.end();
                    return Poll::Ready(Some(Err(e)));
                }
            }
            match this.body.poll_data(cx) {
                Poll::Pending => {
                    if let Err(e) = this.wait(cx) {
                        this.end();
                        return Poll::Ready(Some(Err(e)));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Some(Ok(chunk))) => {
                    let _ = this.body.flow_control().release_capacity(chunk.len());
                    this.buf.extend_from_slice(&chunk);
                }
                Poll::Ready(Some(Err(_))) => {
                    this.end();
                    let e = GrpcError::new(Code::Cancelled, "the request stream broke");
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    let inside = !this.buf.is_empty();
                    this.end();
                    if inside {
                        let e = GrpcError::new(
                            Code::Internal,
                            "the request stream ended inside a gRPC message",
                        );
                        return Poll::Ready(Some(Err(e)));
                    }
                }
            }
        }
    }
}

/// `message` encoded behind its 5-byte gRPC prefix, in one buffer: an answer is
/// encoded once and never copied.
pub fn frame(message: &impl prost::Message) -> Bytes {
    let mut buf = BytesMut::with_capacity(PREFIX + message.encoded_len());
    frame_into(message, &mut buf);
    buf.freeze()
}

/// Appends `message` to `buf` as one gRPC frame: not compressed, big-endian length.
pub fn frame_into(message: &impl prost::Message, buf: &mut impl BufMut) {
    let len = message.encoded_len();
    buf.put_u8(0);
    buf.put_u32(len as u32);
    // Cannot fail on a buffer that grows (Vec, BytesMut).
    let _ = message.encode(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 64 * 1024;

    #[test]
    fn frames_round_trip() {
        // prost encodes a String as google.protobuf.StringValue: field 1.
        let f = frame(&"abc".to_string());
        assert_eq!(&f[..], &[0, 0, 0, 0, 5, 0x0a, 3, b'a', b'b', b'c']);
        assert_eq!(
            unframe(f, MAX).unwrap(),
            Bytes::from_static(&[0x0a, 3, b'a', b'b', b'c'])
        );
        assert_eq!(unframe(frame(&String::new()), MAX).unwrap(), Bytes::new());
    }

    #[test]
    fn bad_frames_get_their_codes() {
        let code = |b: &'static [u8]| unframe(Bytes::from_static(b), MAX).unwrap_err().code;
        assert_eq!(code(b""), Code::Internal);
        assert_eq!(code(&[0, 0, 0]), Code::Internal);
        assert_eq!(code(&[1, 0, 0, 0, 1, 7]), Code::Unimplemented);
        assert_eq!(code(&[0, 0, 0, 0, 9, 7]), Code::Internal);
        assert_eq!(code(&[0, 0, 0, 0, 1, 7, 7]), Code::Internal);
        assert_eq!(code(&[0, 0xff, 0xff, 0xff, 0xff]), Code::ResourceExhausted);
        // The limit is the message's own length, prefix not counted.
        assert_eq!(
            unframe(Bytes::from_static(&[0, 0, 0, 0, 2, 7, 7]), 2)
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            unframe(Bytes::from_static(&[0, 0, 0, 0, 3, 7, 7, 7]), 2)
                .unwrap_err()
                .code,
            Code::ResourceExhausted
        );
        // No limit at all: every length a prefix can declare.
        assert_eq!(
            unframe(Bytes::from_static(&[0, 0, 0, 0, 1, 7]), usize::MAX)
                .unwrap()
                .len(),
            1
        );
    }
}
