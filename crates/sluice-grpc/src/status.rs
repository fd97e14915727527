//! gRPC status codes and a call's failure, sent as `grpc-status` and `grpc-message`.

use http::{HeaderMap, HeaderValue};

/// gRPC status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    /// The code a `grpc-status` value stands for; UNKNOWN for anything else, as gRPC
    /// clients read it.
    pub fn from_status(value: &[u8]) -> Code {
        const CODES: [Code; 17] = [
            Code::Ok,
            Code::Cancelled,
            Code::Unknown,
            Code::InvalidArgument,
            Code::DeadlineExceeded,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::DataLoss,
            Code::Unauthenticated,
        ];
        std::str::from_utf8(value)
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .and_then(|i| CODES.get(i).copied())
            .unwrap_or(Code::Unknown)
    }
}

/// A call's failure: sent as a trailers-only response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcError {
    pub code: Code,
    pub message: String,
}

impl GrpcError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        GrpcError {
            code,
            message: message.into(),
        }
    }

    /// The answer to a path no handler serves.
    pub fn unimplemented(path: &str) -> Self {
        GrpcError::new(Code::Unimplemented, format!("unknown method {path}"))
    }

    /// The answer to a message larger than `max` bytes.
    pub fn too_large(len: usize, max: usize) -> Self {
        GrpcError::new(
            Code::ResourceExhausted,
            format!("request message of {len} bytes is larger than the limit of {max} (--max-request-bytes)"),
        )
    }
}

impl GrpcError {
    /// The answer to a message that would wait for its rest while `max` bytes of
    /// unfinished messages are held.
    pub(super) fn buffers_full(max: usize) -> Self {
        GrpcError::new(
            Code::ResourceExhausted,
            format!("unfinished request messages would hold more than {max} bytes (--grpc-max-buffered-request-bytes): the request must arrive whole"),
        )
    }

    /// The answer to a message that did not arrive within `limit`.
    pub(super) fn message_timeout(limit: std::time::Duration) -> Self {
        GrpcError::new(
            Code::DeadlineExceeded,
            format!("the request message did not arrive within {limit:?}"),
        )
    }
}

impl std::fmt::Display for GrpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for GrpcError {}

/// `grpc-status` (and `grpc-message` when there is one).
pub(super) fn status(code: Code, message: &str) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(2);
    h.insert("grpc-status", HeaderValue::from(code as u16));
    if !message.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
            h.insert("grpc-message", v);
        }
    }
    h
}

/// The status a response's headers or trailers carry: `None` when they carry none.
pub fn status_of(headers: &HeaderMap) -> Option<Result<(), GrpcError>> {
    let code = Code::from_status(headers.get("grpc-status")?.as_bytes());
    if code == Code::Ok {
        return Some(Ok(()));
    }
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Some(Err(GrpcError::new(code, message)))
}

/// `grpc-message` encoding: printable ASCII except `%` as is, every other byte of
/// the UTF-8 text as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &[u8]) -> String {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b%c"), "a b%25c");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
        assert_eq!(percent_decode(b"a b%25c"), "a b%c");
        assert_eq!(percent_decode(b"%C3%A9%0A"), "é\n");
        assert_eq!(percent_decode(b"50%"), "50%");
    }

    #[test]
    fn statuses_round_trip() {
        let h = status(Code::NotFound, "no such file");
        assert_eq!(
            status_of(&h),
            Some(Err(GrpcError::new(Code::NotFound, "no such file")))
        );
        assert_eq!(status_of(&status(Code::Ok, "")), Some(Ok(())));
        assert_eq!(status_of(&HeaderMap::new()), None);
        assert_eq!(Code::from_status(b"99"), Code::Unknown);
        assert_eq!(Code::from_status(b"16"), Code::Unauthenticated);
    }
}
