//! Reading a report: prost's decoding, with strings that are not UTF-8 repaired.

use crate::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use bytes::Bytes;
use sluice_grpc::{Code, GrpcError};

/// prost's decoding of a report, except that a string that is not UTF-8 (a bucket
/// id's key or value, which Envoy's matchers take from requests unchecked, or the
/// domain) is repaired as `String::from_utf8_lossy` repairs it, as `ShouldRateLimit`
/// does (`decode::decode_lossy`): refused, it would end the stream, and with it every
/// assignment of the Envoy, on every report Envoy sends again.
pub fn decode(message: &Bytes) -> Result<RateLimitQuotaUsageReports, GrpcError> {
    crate::service::decode::decode_repairing(message, raw::Reports::repaired).map_err(|e| {
        GrpcError::new(
            Code::InvalidArgument,
            format!("undecodable RateLimitQuotaUsageReports: {e}"),
        )
    })
}

/// `RateLimitQuotaUsageReports` with its strings as `bytes`: the same wire format
/// (a map is a repeated message of key 1 and value 2), decoded without the UTF-8
/// check.
pub(super) mod raw {
    use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use crate::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
    use crate::service::decode::lossy_string;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Reports {
        #[prost(bytes = "vec", tag = "1")]
        pub domain: Vec<u8>,
        #[prost(message, repeated, tag = "2")]
        pub bucket_quota_usages: Vec<Usage>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Usage {
        #[prost(message, optional, tag = "1")]
        pub bucket_id: Option<Id>,
        #[prost(message, optional, tag = "2")]
        pub time_elapsed: Option<prost_types::Duration>,
        #[prost(uint64, tag = "3")]
        pub num_requests_allowed: u64,
        #[prost(uint64, tag = "4")]
        pub num_requests_denied: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Id {
        #[prost(message, repeated, tag = "1")]
        pub bucket: Vec<Pair>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Pair {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }

    impl Reports {
        pub fn repaired(self) -> RateLimitQuotaUsageReports {
            RateLimitQuotaUsageReports {
                domain: lossy_string(self.domain),
                bucket_quota_usages: self
                    .bucket_quota_usages
                    .into_iter()
                    .map(|u| BucketQuotaUsage {
                        // A key repeated (or two repaired alike): the last one wins,
                        // as in prost's map.
                        bucket_id: u.bucket_id.map(|id| BucketId {
                            bucket: id
                                .bucket
                                .into_iter()
                                .map(|p| (lossy_string(p.key), lossy_string(p.value)))
                                .collect(),
                        }),
                        time_elapsed: u.time_elapsed,
                        num_requests_allowed: u.num_requests_allowed,
                        num_requests_denied: u.num_requests_denied,
                    })
                    .collect(),
            }
        }
    }
}
