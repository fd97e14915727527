//! The trace context a call arrives with: W3C `traceparent`, or B3 in its single
//! (`b3`) or multiple (`x-b3-*`) header form, which Envoy's Zipkin tracer sends.
//!
//! Read only when tracing is on, and without allocating: the ids are decoded from
//! the header bytes in place. A malformed header is treated as absent (the call
//! then starts a trace of its own), as the W3C and B3 specifications ask: a bad
//! header from a client must never fail the call.

use http::HeaderMap;

/// What a call's headers say of the trace it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incoming {
    /// The caller's span, which the call's span is the child of.
    Parent(Parent),
    /// A decision not to sample, without ids (B3's `b3: 0`, or `x-b3-sampled: 0`
    /// alone): no parent to name, but a sampler that follows the parent's decision
    /// follows this one.
    Unsampled,
}

/// The caller's span, which the call's span is the child of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The caller sampled its span (W3C flag `01`, B3 `1`, `d` or debug). B3's
    /// "defer" (no decision) counts as not sampled.
    pub sampled: bool,
}

/// What `headers` say: `traceparent` first, then `b3`, then `x-b3-*`.
pub fn incoming(headers: &HeaderMap) -> Option<Incoming> {
    if let Some(v) = headers.get("traceparent") {
        return traceparent(v.as_bytes()).map(Incoming::Parent);
    }
    if let Some(v) = headers.get("b3") {
        return b3_single(v.as_bytes());
    }
    let debug = headers
        .get("x-b3-flags")
        .is_some_and(|f| f.as_bytes() == b"1");
    let sampling = headers.get("x-b3-sampled").map(|s| s.as_bytes());
    let ids = headers.get("x-b3-traceid").zip(headers.get("x-b3-spanid"));
    let Some((trace, span)) = ids else {
        let deny = !debug && matches!(sampling, Some(b"0" | b"false"));
        return deny.then_some(Incoming::Unsampled);
    };
    Some(Incoming::Parent(Parent {
        trace_id: b3_trace_id(trace.as_bytes())?,
        span_id: hex8(span.as_bytes())?,
        sampled: debug || matches!(sampling, Some(b"1" | b"true")),
    }))
}

/// `version-traceid-parentid-flags`; a later version may append fields after a `-`.
fn traceparent(v: &[u8]) -> Option<Parent> {
    if v.len() < 55 || (v.len() > 55 && (v[..2] == *b"00" || v[55] != b'-')) {
        return None;
    }
    if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex_byte(&v[0..2])?;
    if version == 0xff {
        return None;
    }
    let flags = hex_byte(&v[53..55])?;
    Some(Parent {
        trace_id: hex16(&v[3..35])?,
        span_id: hex8(&v[36..52])?,
        sampled: flags & 1 == 1,
    })
    .filter(valid)
}

/// `traceid-spanid[-sampling[-parentspanid]]`, or a sampling decision alone (which
/// names no parent; only a denial is kept).
fn b3_single(v: &[u8]) -> Option<Incoming> {
    if v == b"0" {
        return Some(Incoming::Unsampled);
    }
    let mut parts = v.split(|b| *b == b'-');
    let trace_id = b3_trace_id(parts.next()?)?;
    let span_id = hex8(parts.next()?)?;
    let sampled = match parts.next() {
        None => false,
        Some(b"1" | b"d") => true,
        Some(b"0") => false,
        Some(_) => return None,
    };
    Some(Parent {
        trace_id,
        span_id,
        sampled,
    })
    .filter(valid)
    .map(Incoming::Parent)
}

/// A 64- or 128-bit B3 trace id; a 64-bit one fills the low half.
fn b3_trace_id(v: &[u8]) -> Option<[u8; 16]> {
    match v.len() {
        32 => hex16(v),
        16 => {
            let low = hex8(v)?;
            let mut id = [0; 16];
            id[8..].copy_from_slice(&low);
            Some(id)
        }
        _ => None,
    }
}

/// All-zero ids are invalid in both formats.
fn valid(p: &Parent) -> bool {
    p.trace_id != [0; 16] && p.span_id != [0; 8]
}

fn hex16(v: &[u8]) -> Option<[u8; 16]> {
    let mut out = [0; 16];
    hex_into(v, &mut out)?;
    Some(out)
}

fn hex8(v: &[u8]) -> Option<[u8; 8]> {
    let mut out = [0; 8];
    hex_into(v, &mut out)?;
    Some(out)
}

fn hex_into(v: &[u8], out: &mut [u8]) -> Option<()> {
    if v.len() != out.len() * 2 {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(v.chunks_exact(2)) {
        *o = hex_byte(pair)?;
    }
    Some(())
}

/// Two lowercase hex digits (W3C and B3 both require lowercase).
fn hex_byte(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(pair[0])? << 4 | digit(pair[1])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    /// The parent `headers` name, if any.
    fn parent(h: &HeaderMap) -> Option<Parent> {
        match incoming(h)? {
            Incoming::Parent(p) => Some(p),
            Incoming::Unsampled => None,
        }
    }

    const TRACE: [u8; 16] = [
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47,
        0x36,
    ];
    const SPAN: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];

    #[test]
    fn a_w3c_traceparent_names_the_parent_and_its_sampling() {
        let h = headers(&[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )]);
        let p = parent(&h).unwrap();
        assert_eq!((p.trace_id, p.span_id, p.sampled), (TRACE, SPAN, true));
        let h = headers(&[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        )]);
        assert!(!parent(&h).unwrap().sampled);
    }

    #[test]
    fn a_later_traceparent_version_may_carry_more_fields() {
        let h = headers(&[(
            "traceparent",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next",
        )]);
        assert_eq!(parent(&h).unwrap().trace_id, TRACE);
    }

    #[test]
    fn a_malformed_traceparent_names_no_parent() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            let h = headers(&[("traceparent", bad)]);
            assert_eq!(incoming(&h), None, "{bad:?}");
        }
    }

    #[test]
    fn b3_single_header_forms() {
        let h = headers(&[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1")]);
        assert_eq!(
            parent(&h),
            Some(Parent {
                trace_id: TRACE,
                span_id: SPAN,
                sampled: true
            })
        );
        let h = headers(&[(
            "b3",
            "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-d-05e3ac9a4f6e3b90",
        )]);
        assert!(parent(&h).unwrap().sampled);
        // A 64-bit trace id, and no sampling decision (deferred).
        let h = headers(&[("b3", "a3ce929d0e0e4736-00f067aa0ba902b7")]);
        let p = parent(&h).unwrap();
        assert_eq!(&p.trace_id[..8], &[0; 8]);
        assert_eq!(&p.trace_id[8..], &TRACE[8..]);
        assert!(!p.sampled);
        // A decision not to sample alone names no parent, and is kept; an accepting
        // decision alone leaves it to the sampler; a bad sampling flag is ignored.
        assert_eq!(
            incoming(&headers(&[("b3", "0")])),
            Some(Incoming::Unsampled)
        );
        assert_eq!(incoming(&headers(&[("b3", "1")])), None);
        let h = headers(&[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-x")]);
        assert_eq!(incoming(&h), None);
    }

    #[test]
    fn b3_multiple_headers() {
        let h = headers(&[
            ("x-b3-traceid", "4bf92f3577b34da6a3ce929d0e0e4736"),
            ("x-b3-spanid", "00f067aa0ba902b7"),
            ("x-b3-sampled", "1"),
        ]);
        assert_eq!(
            parent(&h),
            Some(Parent {
                trace_id: TRACE,
                span_id: SPAN,
                sampled: true
            })
        );
        let h = headers(&[
            ("x-b3-traceid", "4bf92f3577b34da6a3ce929d0e0e4736"),
            ("x-b3-spanid", "00f067aa0ba902b7"),
            ("x-b3-flags", "1"),
        ]);
        assert!(parent(&h).unwrap().sampled, "debug implies sampled");
        let h = headers(&[
            ("x-b3-traceid", "4bf92f3577b34da6a3ce929d0e0e4736"),
            ("x-b3-sampled", "1"),
        ]);
        assert_eq!(incoming(&h), None, "no span id");
        for deny in ["0", "false"] {
            let h = headers(&[("x-b3-sampled", deny)]);
            assert_eq!(incoming(&h), Some(Incoming::Unsampled), "{deny}");
        }
        let h = headers(&[("x-b3-sampled", "0"), ("x-b3-flags", "1")]);
        assert_eq!(incoming(&h), None, "debug overrides the denial");
    }

    #[test]
    fn traceparent_wins_over_b3() {
        let h = headers(&[
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("b3", "a3ce929d0e0e4736-00f067aa0ba902b7-0"),
        ]);
        assert_eq!(parent(&h).unwrap().trace_id, TRACE);
        assert_eq!(incoming(&HeaderMap::new()), None);
    }
}
