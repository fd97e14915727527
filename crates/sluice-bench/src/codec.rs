//! The generator's side of the wire: requests go out as bytes encoded once, before the
//! run, with their gRPC frame prefix, and only `overall_code` is read from each response. The generator then spends
//! its time on HTTP/2, not on building and parsing protobuf, so more of the machine
//! is left to the service under test.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
use tonic::client::Grpc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::Status;

/// `overall_code` values of a RateLimitResponse.
pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Length of a gRPC message's frame prefix: a compression flag and a big-endian u32
/// length.
pub const PREFIX: usize = 5;

/// `overall_code` of a gRPC-framed RateLimitResponse.
pub fn unframe_code(frame: &[u8]) -> Result<i32, Status> {
    let bad = |what: &str| Status::internal(format!("bad RateLimitResponse frame: {what}"));
    let Some((&[flag, a, b, c, d], rest)) = frame.split_first_chunk::<PREFIX>() else {
        return Err(bad("no message"));
    };
    if flag != 0 {
        return Err(bad("compressed"));
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    let mut msg = rest.get(..len).ok_or_else(|| bad("truncated"))?;
    overall_code(&mut msg).map_err(|e| Status::internal(format!("bad RateLimitResponse: {e}")))
}

/// Sends pre-encoded `RateLimitRequest` bytes; decodes `overall_code` only.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = i32;
    type Encoder = RawEncoder;
    type Decoder = CodeDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> CodeDecoder {
        CodeDecoder
    }
}

#[derive(Debug)]
pub struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

#[derive(Debug)]
pub struct CodeDecoder;

impl Decoder for CodeDecoder {
    type Item = i32;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<i32>, Status> {
        overall_code(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("bad RateLimitResponse: {e}")))
    }
}

/// Reads field 1 (`overall_code`) of an encoded RateLimitResponse, skipping the rest.
pub fn overall_code(buf: &mut impl Buf) -> Result<i32, prost::DecodeError> {
    let mut code = 0;
    while buf.has_remaining() {
        let (tag, wire) = decode_key(buf)?;
        if tag == 1 && wire == WireType::Varint {
            code = decode_varint(buf)? as i32;
        } else {
            skip_field(wire, tag, buf, DecodeContext::default())?;
        }
    }
    Ok(code)
}

/// One ShouldRateLimit call through tonic with an encoded (unframed) request; returns
/// `overall_code`.
pub async fn should_rate_limit(grpc: &mut Grpc<Channel>, body: Bytes) -> Result<i32, Status> {
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("connection not ready: {e}")))?;
    let res = grpc
        .unary(
            tonic::Request::new(body),
            PathAndQuery::from_static(PATH),
            RawCodec,
        )
        .await?;
    Ok(res.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use prost::Message;

    #[test]
    fn reads_overall_code_past_other_fields() {
        let res = RateLimitResponse {
            statuses: vec![DescriptorStatus {
                code: 1,
                limit_remaining: 7,
                ..Default::default()
            }],
            response_headers_to_add: vec![HeaderValue {
                key: "x-ratelimit-limit".into(),
                value: "10".into(),
                ..Default::default()
            }],
            overall_code: OVER_LIMIT,
            ..Default::default()
        };
        let bytes = res.encode_to_vec();
        assert_eq!(overall_code(&mut bytes.as_slice()).unwrap(), OVER_LIMIT);
        assert_eq!(overall_code(&mut &[][..]).unwrap(), 0, "empty: UNKNOWN");
        assert!(
            overall_code(&mut &[0x0a, 0x05, 0x01][..]).is_err(),
            "truncated"
        );
    }

    #[test]
    fn frames_round_trip() {
        let res = RateLimitResponse {
            overall_code: OVER_LIMIT,
            ..Default::default()
        };
        let mut buf = Vec::new();
        sluice_grpc::frame_into(&res, &mut buf);
        assert_eq!(buf[..PREFIX], [0, 0, 0, 0, 2]);
        assert_eq!(unframe_code(&buf).unwrap(), OVER_LIMIT);
        assert!(unframe_code(&buf[..PREFIX + 1]).is_err(), "truncated");
        assert!(unframe_code(&[]).is_err(), "no message");
        buf[0] = 1;
        assert!(unframe_code(&buf).is_err(), "compressed");
    }
}
