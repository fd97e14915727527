//! What each fuzz target asserts of one input. Shared by the fuzz targets and by
//! `tests/fuzz_corpus.rs`, which replays the committed corpora on stable Rust.

use prost::Message;
use sluice::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use sluice::service::decode::{decode_lossy, Request};

/// The in-place request decoder against prost: when it answers, its answer is the
/// view of prost's decoding; when prost refuses a message, so does it. The lossy
/// decoder (the fallback) is prost wherever prost decodes, and reads a message prost
/// refuses only for a string that is not UTF-8, otherwise keeping prost's error.
pub fn request_decode(data: &[u8]) {
    let prost = RateLimitRequest::decode(data);
    if let Some(fast) = Request::decode(data) {
        let prost = prost
            .as_ref()
            .expect("Request::decode read a message prost refuses");
        assert_eq!(fast, Request::of(prost), "the decoders disagree");
    }
    match (prost, decode_lossy(data)) {
        (Ok(prost), lossy) => assert_eq!(lossy, Ok(prost), "the lossy decoder differs"),
        (Err(refused), Ok(_)) => assert!(
            refused.to_string().contains("UTF-8"),
            "the lossy decoder read a message prost refuses: {refused}"
        ),
        (Err(refused), Err(e)) => assert_eq!(e, refused, "the lossy decoder's error differs"),
    }
}

/// The policy parser on any text, both forms: an error list or documents, never a
/// panic; documents compile to a policy or to errors.
pub fn policy_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match sluice::policy::parse_str("fuzz.yaml", text) {
        Ok(docs) => {
            let _ = sluice::policy::compile(docs);
        }
        Err(errors) => assert!(!errors.is_empty(), "an error result with no error"),
    }
}

/// `POST /json`'s body: a request or a clear error; a request survives the trip
/// through protobuf, and the in-place decoder reads its encoding as prost does.
pub fn json_request(data: &[u8]) {
    let Ok(req) = sluice::service::json::parse_request(data) else {
        return;
    };
    let bytes = req.encode_to_vec();
    let back = RateLimitRequest::decode(bytes.as_slice()).expect("prost reads its own encoding");
    assert_eq!(back, req);
    if let Some(fast) = Request::decode(&bytes) {
        assert_eq!(fast, Request::of(&req));
    }
}

/// Redis replies, through both readers (the decide script's and the general one):
/// an answer, an error or "incomplete", never a panic. Read as it arrives, a reply is
/// incomplete until its last byte and then the same answer, taking the same bytes, as
/// with more bytes after it; where both readers read a reply they agree.
pub fn resp_parse(data: &[u8]) {
    use sluice_redis::connection::{parse, Answer};
    use sluice_redis::{value, Value};
    arrives_whole(data, parse);
    arrives_whole(data, value::parse);
    if let (Ok(Some((answer, n))), Ok(Some((general, m)))) = (parse(data), value::parse(data)) {
        assert_eq!(n, m, "both readers take the same bytes");
        match answer {
            Answer::Integers(ints) => assert_eq!(
                general,
                Value::Array(ints.into_iter().map(Value::Int).collect())
            ),
            Answer::Error(e) => assert_eq!(general, Value::Error(e)),
            Answer::Status => assert!(matches!(general, Value::Status(_) | Value::Int(_))),
        }
    }
}

fn arrives_whole<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    parse: sluice_redis::connection::Parser<T>,
) {
    let Ok(Some(answer)) = parse(data) else {
        return;
    };
    let first = (1..=data.len())
        .find(|&n| matches!(parse(&data[..n]), Ok(Some(_))))
        .expect("the whole buffer is an answer");
    assert_eq!(parse(&data[..first]).ok().flatten().as_ref(), Some(&answer));
    for n in 0..first {
        assert!(
            matches!(parse(&data[..n]), Ok(None)),
            "the first {n} bytes of a reply are not incomplete: {:?}",
            parse(&data[..n])
        );
    }
}
