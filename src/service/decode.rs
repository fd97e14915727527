//! A `RateLimitRequest` as the limiter reads it, with its strings borrowed.
//!
//! prost decodes every entry into two `String`s and every descriptor into its own
//! `Vec`, about a dozen allocations for a three-descriptor request. [`Request::decode`]
//! reads the usual message in place instead: the fields sluice uses, each string
//! checked as UTF-8 as prost checks it. Anything else (an unknown field, a repeated
//! `hits_addend` or `limit` message, a malformed byte) makes it give up, and the
//! caller decodes with [`decode_lossy`]: prost's decoding, so the outcome and every
//! error stay prost's, except that a string that is not UTF-8 is repaired rather
//! than refused.
//!
//! Envoy copies request header and query values into descriptor entries without
//! checking them, so a client decides what bytes a value holds. Refusing the call
//! (`INVALID_ARGUMENT`) would let one bad byte skip every limit of its request, as
//! Envoy's filter fails open by default. A value that is not UTF-8 is read instead
//! as `String::from_utf8_lossy` reads it, each invalid sequence one U+FFFD: it gets
//! what any value gets, and distinct bad values may share one counter (more denial,
//! never less).

use std::ops::Range;

use prost::Message;

use crate::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The request's fields that sluice reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request<'a> {
    pub domain: &'a str,
    pub hits_addend: u32,
    pub descriptors: Vec<WireDescriptor>,
    /// Every descriptor's (key, value) entries, one after the other.
    pub entries: Vec<(&'a str, &'a str)>,
}

/// One descriptor: its entries are `Request::entries[entries]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WireDescriptor {
    pub entries: Range<usize>,
    /// `hits_addend`'s value when the field is present.
    pub hits_addend: Option<u64>,
    pub is_negative_hits: bool,
    /// The descriptor's `limit` (Envoy's `RateLimitOverride`), as sent.
    pub limit: Option<LimitOverride>,
}

/// `RateLimitOverride`: `requests_per_unit` per `unit` (`RateLimitUnit`'s number,
/// unchecked here) in place of the matched limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: i32,
}

impl<'a> Request<'a> {
    /// The view of a request prost decoded (or the JSON endpoint built).
    pub fn of(req: &'a RateLimitRequest) -> Self {
        let mut entries = Vec::new();
        let descriptors = req
            .descriptors
            .iter()
            .map(|d| {
                let start = entries.len();
                entries.extend(d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
                WireDescriptor {
                    entries: start..entries.len(),
                    hits_addend: d.hits_addend,
                    is_negative_hits: d.is_negative_hits,
                    limit: d.limit.as_ref().map(|l| LimitOverride {
                        requests_per_unit: l.requests_per_unit,
                        unit: l.unit,
                    }),
                }
            })
            .collect();
        Request {
            domain: &req.domain,
            hits_addend: req.hits_addend,
            descriptors,
            entries,
        }
    }

    /// Reads an encoded request in place; `None` when prost must decide (see the
    /// module's documentation). When it answers, the answer equals `Request::of` of
    /// prost's decoding.
    pub fn decode(message: &'a [u8]) -> Option<Self> {
        let mut req = Request {
            domain: "",
            hits_addend: 0,
            descriptors: Vec::with_capacity(4),
            entries: Vec::with_capacity(8),
        };
        let mut r = Reader(message);
        while !r.0.is_empty() {
            match r.key()? {
                (1, LEN) => req.domain = r.string()?,
                (2, LEN) => {
                    let d = descriptor(r.bytes()?, &mut req.entries)?;
                    req.descriptors.push(d);
                }
                // prost keeps the low 32 bits of a longer varint.
                (3, VARINT) => req.hits_addend = r.varint()? as u32,
                _ => return None,
            }
        }
        Some(req)
    }
}

/// prost's decoding of a request, for one [`Request::decode`] leaves to it. A message
/// prost refuses only for a string that is not UTF-8 (the domain, an entry's key or
/// value) is decoded anyway, each such string repaired as
/// `String::from_utf8_lossy` repairs it; any other error is prost's own. A message
/// prost decodes costs nothing more.
pub fn decode_lossy(message: &[u8]) -> Result<RateLimitRequest, prost::DecodeError> {
    decode_repairing(message, raw::Request::repaired)
}

/// `M` as prost decodes it; when prost refuses it, `R` (the same message with its
/// strings as `bytes`) decoded and `repair`ed into an `M`. prost's error stands
/// when `R` does not decode either.
pub fn decode_repairing<M, R>(message: &[u8], repair: fn(R) -> M) -> Result<M, prost::DecodeError>
where
    M: Message + Default,
    R: Message + Default,
{
    M::decode(message).or_else(|refused| R::decode(message).map(repair).map_err(|_| refused))
}

/// `bytes` as a string, each sequence that is not UTF-8 replaced by U+FFFD (as
/// `String::from_utf8_lossy` does); valid bytes are kept without a copy.
pub fn lossy_string(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `RateLimitRequest` with its strings as `bytes`: the same wire format, decoded by
/// prost without the UTF-8 check.
mod raw {
    use crate::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry as PbEntry, RateLimitOverride,
    };
    use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use crate::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    use super::lossy_string;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(bytes = "vec", tag = "1")]
        pub domain: Vec<u8>,
        #[prost(message, repeated, tag = "2")]
        pub descriptors: Vec<Descriptor>,
        #[prost(uint32, tag = "3")]
        pub hits_addend: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Descriptor {
        #[prost(message, repeated, tag = "1")]
        pub entries: Vec<Entry>,
        #[prost(message, optional, tag = "2")]
        pub limit: Option<RateLimitOverride>,
        #[prost(message, optional, tag = "3")]
        pub hits_addend: Option<u64>,
        #[prost(bool, tag = "4")]
        pub is_negative_hits: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Entry {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }

    impl Request {
        pub fn repaired(self) -> RateLimitRequest {
            RateLimitRequest {
                domain: lossy_string(self.domain),
                descriptors: self
                    .descriptors
                    .into_iter()
                    .map(|d| RateLimitDescriptor {
                        entries: d
                            .entries
                            .into_iter()
                            .map(|e| PbEntry {
                                key: lossy_string(e.key),
                                value: lossy_string(e.value),
                            })
                            .collect(),
                        limit: d.limit,
                        hits_addend: d.hits_addend,
                        is_negative_hits: d.is_negative_hits,
                    })
                    .collect(),
                hits_addend: self.hits_addend,
            }
        }
    }
}

const VARINT: u8 = 0;
const LEN: u8 = 2;

fn descriptor<'a>(
    message: &'a [u8],
    entries: &mut Vec<(&'a str, &'a str)>,
) -> Option<WireDescriptor> {
    let mut d = WireDescriptor {
        entries: entries.len()..entries.len(),
        hits_addend: None,
        is_negative_hits: false,
        limit: None,
    };
    let mut r = Reader(message);
    while !r.0.is_empty() {
        match r.key()? {
            (1, LEN) => entries.push(entry(r.bytes()?)?),
            (2, LEN) if d.limit.is_none() => d.limit = Some(limit_override(r.bytes()?)?),
            // A second one would be merged into the first: prost's business.
            (3, LEN) if d.hits_addend.is_none() => {
                let mut value = 0;
                let mut w = Reader(r.bytes()?);
                while !w.0.is_empty() {
                    match w.key()? {
                        (1, VARINT) => value = w.varint()?,
                        _ => return None,
                    }
                }
                d.hits_addend = Some(value);
            }
            (4, VARINT) => d.is_negative_hits = r.varint()? != 0,
            _ => return None,
        }
    }
    d.entries.end = entries.len();
    Some(d)
}

fn limit_override(message: &[u8]) -> Option<LimitOverride> {
    let mut l = LimitOverride {
        requests_per_unit: 0,
        unit: 0,
    };
    let mut r = Reader(message);
    while !r.0.is_empty() {
        match r.key()? {
            // prost keeps the low 32 bits, for the enum too.
            (1, VARINT) => l.requests_per_unit = r.varint()? as u32,
            (2, VARINT) => l.unit = r.varint()? as i32,
            _ => return None,
        }
    }
    Some(l)
}

fn entry(message: &[u8]) -> Option<(&str, &str)> {
    let (mut key, mut value) = ("", "");
    let mut r = Reader(message);
    while !r.0.is_empty() {
        match r.key()? {
            (1, LEN) => key = r.string()?,
            (2, LEN) => value = r.string()?,
            _ => return None,
        }
    }
    Some((key, value))
}

/// The bytes not read yet.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// A varint of at most 10 bytes that fits in 64 bits, as prost accepts.
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for (i, &b) in self.0.iter().enumerate().take(10) {
            if i == 9 && b > 1 {
                return None;
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                self.0 = &self.0[i + 1..];
                return Some(value);
            }
        }
        None
    }

    /// A field's (tag, wire type), for the one-byte keys of tags below 16.
    fn key(&mut self) -> Option<(u8, u8)> {
        let (&b, rest) = self.0.split_first()?;
        if b >= 0x80 {
            return None;
        }
        self.0 = rest;
        Some((b >> 3, b & 7))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (field, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(field)
    }

    fn string(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }
}

#[cfg(test)]
mod tests {
    use crate::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use prost::Message;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn random_string(rng: &mut StdRng) -> String {
        const PARTS: [&str; 8] = [
            "",
            "a",
            "remote_address",
            "10.0.0.1",
            "é",
            "|=",
            "\u{1F600}",
            "x",
        ];
        (0..rng.random_range(0..4))
            .map(|_| PARTS[rng.random_range(0..PARTS.len())])
            .collect()
    }

    fn random_request(rng: &mut StdRng) -> RateLimitRequest {
        RateLimitRequest {
            domain: random_string(rng),
            hits_addend: if rng.random_bool(0.5) {
                0
            } else {
                rng.random()
            },
            descriptors: (0..rng.random_range(0..5))
                .map(|_| RateLimitDescriptor {
                    entries: (0..rng.random_range(0..4))
                        .map(|_| Entry {
                            key: random_string(rng),
                            value: random_string(rng),
                        })
                        .collect(),
                    hits_addend: rng.random_bool(0.3).then(|| {
                        if rng.random_bool(0.3) {
                            0
                        } else {
                            rng.random()
                        }
                    }),
                    is_negative_hits: rng.random_bool(0.1),
                    limit: rng.random_bool(0.3).then(|| RateLimitOverride {
                        requests_per_unit: rng.random_range(0..1000),
                        unit: rng.random_range(-1..9),
                    }),
                })
                .collect(),
        }
    }

    #[test]
    fn reads_what_prost_encodes_as_prost_decodes_it() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..5_000 {
            let req = random_request(&mut rng);
            let bytes = req.encode_to_vec();
            let decoded = RateLimitRequest::decode(bytes.as_slice()).expect("prost decodes");
            assert_eq!(
                Request::decode(&bytes),
                Some(Request::of(&decoded)),
                "{req:?}"
            );
        }
    }

    #[test]
    fn damaged_messages_are_read_as_prost_reads_them_or_left_to_prost() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut read = 0;
        for _ in 0..20_000 {
            let mut bytes = random_request(&mut rng).encode_to_vec();
            if bytes.is_empty() {
                continue;
            }
            match rng.random_range(0..3) {
                0 => {
                    let i = rng.random_range(0..bytes.len());
                    bytes[i] = rng.random();
                }
                1 => bytes.truncate(rng.random_range(0..bytes.len())),
                _ => {
                    let i = rng.random_range(0..=bytes.len());
                    bytes.insert(i, rng.random());
                }
            }
            if let Some(view) = Request::decode(&bytes) {
                let decoded = RateLimitRequest::decode(bytes.as_slice())
                    .expect("prost decodes what the fast reader reads");
                assert_eq!(view, Request::of(&decoded), "{bytes:?}");
                read += 1;
            }
        }
        assert!(read > 1_000, "{read}");
    }

    #[test]
    fn a_limit_override_is_read_in_place() {
        let req = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "k".into(),
                    value: "v".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 5,
                    unit: 2,
                }),
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let bytes = req.encode_to_vec();
        let view = Request::decode(&bytes).expect("read in place");
        assert_eq!(
            view.descriptors[0].limit,
            Some(LimitOverride {
                requests_per_unit: 5,
                unit: 2
            })
        );
    }

    #[test]
    fn unusual_fields_are_left_to_prost() {
        let mut req = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "k".into(),
                    value: "v".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 5,
                    unit: 1,
                }),
                ..Default::default()
            }],
            hits_addend: 0,
        };
        // A second `limit` message merges into the first: prost's business.
        let mut twice = req.encode_to_vec();
        let limit = [0x12, 2, 0x08, 7];
        twice[4] += limit.len() as u8; // the descriptor, last in the message
        twice.extend_from_slice(&limit);
        assert_eq!(Request::decode(&twice), None);
        assert!(RateLimitRequest::decode(twice.as_slice()).is_ok());
        req.descriptors[0].limit = None;
        let mut bytes = req.encode_to_vec();
        assert!(Request::decode(&bytes).is_some());
        // An unknown field (15, varint): prost skips it.
        bytes.extend_from_slice(&[15 << 3, 1]);
        assert_eq!(Request::decode(&bytes), None);
        assert!(RateLimitRequest::decode(bytes.as_slice()).is_ok());
        // Invalid UTF-8 in the domain: prost refuses it; `decode_lossy` repairs it.
        let bad = [0x0a, 1, 0xff];
        assert_eq!(Request::decode(&bad), None);
        assert!(RateLimitRequest::decode(&bad[..]).is_err());
        assert_eq!(decode_lossy(&bad).expect("repaired").domain, "\u{FFFD}");
    }

    /// A request whose strings are bytes, as a client's header reaches Envoy.
    fn raw_request(domain: &[u8], entries: &[(&[u8], &[u8])]) -> Vec<u8> {
        raw::Request {
            domain: domain.to_vec(),
            descriptors: vec![raw::Descriptor {
                entries: entries
                    .iter()
                    .map(|&(k, v)| raw::Entry {
                        key: k.to_vec(),
                        value: v.to_vec(),
                    })
                    .collect(),
                hits_addend: Some(3),
                ..Default::default()
            }],
            hits_addend: 2,
        }
        .encode_to_vec()
    }

    #[test]
    fn strings_that_are_not_utf8_are_repaired_as_from_utf8_lossy_does() {
        let bytes = raw_request(
            b"edge",
            &[
                (b"remote_address", b"10.0.0.1"),
                (b"x-user", b"evil\xff"),
                (b"k\xc3", b"\xe2\x82 \xf0\x9f\x98\x80 \xc0\xaf"),
            ],
        );
        // The fast reader leaves it to prost, which refuses it.
        assert_eq!(Request::decode(&bytes), None);
        let refused = RateLimitRequest::decode(bytes.as_slice()).unwrap_err();
        assert!(refused.to_string().contains("UTF-8"), "{refused}");
        let req = decode_lossy(&bytes).expect("repaired, not refused");
        let view = Request::of(&req);
        assert_eq!(view.domain, "edge");
        assert_eq!(view.hits_addend, 2);
        assert_eq!(
            view.entries,
            vec![
                ("remote_address", "10.0.0.1"),
                ("x-user", "evil\u{FFFD}"),
                ("k\u{FFFD}", "\u{FFFD} \u{1F600} \u{FFFD}\u{FFFD}"),
            ]
        );
        assert_eq!(view.descriptors[0].hits_addend, Some(3));
        // Distinct bad values share the repaired one's counter, which is the value
        // a valid U+FFFD names too.
        let other = decode_lossy(&raw_request(b"edge", &[(b"x-user", b"evil\xfe")])).unwrap();
        let valid = decode_lossy(&raw_request(
            b"edge",
            &[(b"x-user", "evil\u{FFFD}".as_bytes())],
        ))
        .unwrap();
        assert_eq!(other.descriptors[0].entries[0].value, "evil\u{FFFD}");
        assert_eq!(other, valid);
        // The domain is repaired the same way.
        let domain = decode_lossy(&raw_request(b"ed\xffge", &[(b"k", b"v")])).unwrap();
        assert_eq!(domain.domain, "ed\u{FFFD}ge");
    }

    #[test]
    fn the_lossy_decoder_is_prost_but_for_utf8() {
        let mut rng = StdRng::seed_from_u64(13);
        let mut repaired = 0;
        for _ in 0..20_000 {
            let mut bytes = random_request(&mut rng).encode_to_vec();
            if !bytes.is_empty() && rng.random_bool(0.8) {
                let i = rng.random_range(0..bytes.len());
                bytes[i] = rng.random();
            }
            match (
                RateLimitRequest::decode(bytes.as_slice()),
                decode_lossy(&bytes),
            ) {
                (Ok(prost), lossy) => assert_eq!(lossy, Ok(prost), "{bytes:?}"),
                (Err(refused), Ok(_)) => {
                    assert!(refused.to_string().contains("UTF-8"), "{refused}");
                    repaired += 1;
                }
                (Err(refused), Err(e)) => assert_eq!(e, refused),
            }
        }
        assert!(repaired > 100, "{repaired}");
    }
}
