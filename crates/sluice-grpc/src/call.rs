//! One stream: routes it by its headers, reads its request, calls the handler and
//! sends the answer.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderValue, Request, Response, StatusCode};
use tokio::sync::watch;

use super::deadline::Deadline;
use super::message::{read_message, Charge, Messages};
use super::status::{status, Code, GrpcError};
use super::{Handler, Kind, Reply, Settings, Stats};

/// Errors of the stream itself (the client reset it, the connection went) end it
/// silently.
pub(super) async fn call<H: Handler>(
    handler: &H,
    settings: &Settings,
    stats: &Arc<Stats>,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    stop: &watch::Receiver<bool>,
) {
    let (parts, body) = req.into_parts();
    if parts.method != http::Method::POST {
        let e = GrpcError::new(Code::Unimplemented, "gRPC calls are POST requests");
        return refuse(&mut respond, StatusCode::METHOD_NOT_ALLOWED, &e);
    }
    let grpc = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !grpc {
        let e = GrpcError::new(Code::Unimplemented, "content-type must be application/grpc");
        return refuse(&mut respond, StatusCode::UNSUPPORTED_MEDIA_TYPE, &e);
    }
    // Routed before the body is read: a method this port does not serve is answered
    // now, whether its request ever ends or not (reflection's never does).
    let Some((method, kind)) = handler.route(parts.uri.path()) else {
        let e = GrpcError::unimplemented(parts.uri.path());
        return refuse(&mut respond, StatusCode::OK, &e);
    };
    let timeout = match Deadline::timeout(&parts.headers) {
        Ok(t) => t,
        Err(e) => return refuse(&mut respond, StatusCode::OK, &e),
    };
    let max = handler.max_message(method, settings.max_message);
    let answer = match kind {
        Kind::Unary => {
            // The call's own deadline, when shorter: its client is gone by then.
            let limit = timeout.map_or(settings.message_timeout, |t| {
                t.min(settings.message_timeout)
            });
            let charge = Charge::new(&**stats, settings.max_buffered);
            let read = read_message(body, max, timeout.is_some(), limit, charge).await;
            let (message, waited_since) = match read {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(e) => {
                    handler.refused(method, &e);
                    return refuse(&mut respond, StatusCode::OK, &e);
                }
            };
            // A client that reset the stream before its call was read has given up
            // on it: Envoy at its filter timeout, while this process was stalled
            // (paused, CPU-throttled) with the call in its socket. Decided now, it
            // would count hits for a request Envoy has already answered by its own
            // failure mode.
            if poll_fn(|cx| Poll::Ready(respond.poll_reset(cx).is_ready())).await {
                handler.abandoned(method);
                return;
            }
            let deadline = timeout.map(|t| match waited_since {
                Some(since) => Deadline::since(t, since),
                None => Deadline::at_once(t),
            });
            let call = pin!(handler.call_with_headers(method, message, deadline, &parts.headers));
            unless_reset(&mut respond, call).await
        }
        Kind::Streaming => {
            let deadline = timeout.map(Deadline::after);
            let charge = Charge::new(stats.clone(), settings.max_buffered);
            let messages = Messages::new(body, max, settings.message_timeout, charge);
            let call =
                pin!(handler.stream_with_headers(method, messages, deadline, &parts.headers));
            unless_reset(&mut respond, call).await
        }
    };
    match answer {
        None => {} // the client gave up; the call is dropped
        Some(Ok(Reply::One(m))) => {
            let Ok(mut send) = respond.send_response(ok_headers(), false) else {
                return;
            };
            if send.send_data(m, false).is_ok() {
                let _ = send.send_trailers(status(Code::Ok, ""));
            }
        }
        Some(Ok(Reply::Stream(s))) => stream(respond, s, stop.clone()).await,
        Some(Err(e)) => refuse(&mut respond, StatusCode::OK, &e),
    }
}

/// `answer`, or `None` if the client resets the stream first. The caller pins
/// the call: a future taken by value and pinned here would be held twice in this
/// one's state (the argument and the pinned local), and every call's future, which
/// holds this one, moved and allocated at twice the size.
async fn unless_reset<T>(
    respond: &mut SendResponse<Bytes>,
    mut answer: Pin<&mut impl Future<Output = T>>,
) -> Option<T> {
    // Poll the call first: most finish at once, without looking for a reset.
    poll_fn(|cx| {
        if let Poll::Ready(a) = answer.as_mut().poll(cx) {
            return Poll::Ready(Some(a));
        }
        match respond.poll_reset(cx) {
            Poll::Ready(_) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Sends a streaming reply until it ends, the client resets the stream or the
/// server stops (then UNAVAILABLE, so that the client goes elsewhere).
///
/// A message is sent only once the stream has room for it in the client's window
/// (h2 would otherwise queue it, without limit, for a client that does not read), and
/// the next is not asked for meanwhile: the reply's producer waits, and so does its
/// reading of the client's requests (RLQS answers each report it reads). What h2
/// holds for one stream stays under one window (at most its send buffer) and one
/// message.
async fn stream(
    mut respond: SendResponse<Bytes>,
    mut messages: BoxStream<'static, Result<Bytes, GrpcError>>,
    mut stop: watch::Receiver<bool>,
) {
    let Ok(mut send) = respond.send_response(ok_headers(), false) else {
        return;
    };
    let mut stopped = pin!(stop.wait_for(|s| *s));
    // Taken from the reply, waiting for room in the window.
    let mut held: Option<Bytes> = None;
    loop {
        enum Next {
            Item(Option<Result<Bytes, GrpcError>>),
            Room,
            Reset,
            Stop,
        }
        let next = poll_fn(|cx| {
            if send.poll_reset(cx).is_ready() {
                return Poll::Ready(Next::Reset);
            }
            if stopped.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Next::Stop);
            }
            if held.is_none() {
                return messages.poll_next_unpin(cx).map(Next::Item);
            }
            loop {
                return match send.poll_capacity(cx) {
                    Poll::Ready(Some(Ok(0))) => continue,
                    Poll::Ready(Some(Ok(_))) => Poll::Ready(Next::Room),
                    // The stream can send no more (reset, or the connection went).
                    Poll::Ready(_) => Poll::Ready(Next::Reset),
                    Poll::Pending => Poll::Pending,
                };
            }
        })
        .await;
        let trailers = match next {
            Next::Item(Some(Ok(m))) => {
                // Asks for the whole message: the window it is given may be less,
                // and h2 sends the rest as the client reads.
                send.reserve_capacity(m.len().min(MAX_RESERVE));
                if send.capacity() == 0 {
                    held = Some(m);
                } else if send.send_data(m, false).is_err() {
                    return;
                }
                continue;
            }
            Next::Room => {
                let m = held
                    .take()
                    .expect("room is waited for only with a message held");
                if send.send_data(m, false).is_err() {
                    return;
                }
                continue;
            }
            Next::Item(Some(Err(e))) => status(e.code, &e.message),
            Next::Item(None) => status(Code::Ok, ""),
            Next::Reset => return,
            Next::Stop => status(Code::Unavailable, "server is shutting down"),
        };
        let _ = send.send_trailers(trailers);
        return;
    }
}

/// The most send capacity asked for at once: HTTP/2's largest window.
const MAX_RESERVE: usize = (1 << 31) - 1;

fn ok_headers() -> Response<()> {
    let mut r = Response::new(());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    r
}

/// A trailers-only answer: headers with the status, and the stream ends.
fn refuse(respond: &mut SendResponse<Bytes>, http_status: StatusCode, e: &GrpcError) {
    let mut r = ok_headers();
    *r.status_mut() = http_status;
    r.headers_mut().extend(status(e.code, &e.message));
    let _ = respond.send_response(r, true);
}
