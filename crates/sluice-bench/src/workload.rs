//! What the generator sends: one scenario's requests, encoded before the run.
//!
//! Every distinct request (one per key, up to [`TABLE_MAX`] keys) is encoded once into
//! a table, as a gRPC frame ready to send; picking a request is then a random index and
//! a copy of a static slice. Above the table's size requests are encoded as they are
//! sent.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use clap::ValueEnum;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use rand::Rng;

use crate::zipf::Zipf;
use sluice_grpc::frame_into as frame;

/// Most requests encoded ahead of the run (about 60 MB at this size).
pub const TABLE_MAX: u64 = 1 << 20;

/// The value the attacker sends in the `attack` scenario.
pub const ATTACKER: &str = "attacker";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// One key, every request.
    Hot,
    /// `--keys` keys, uniformly at random.
    Uniform,
    /// `--keys` keys, Zipf-distributed with exponent `--zipf-s` (a few keys are hot).
    Zipf,
    /// `--attack-share` of requests on one attacker key, the rest uniform over
    /// `--keys` normal keys; outcomes are counted separately for the two.
    Attack,
    /// Three descriptors per request (edge `remote_address`, `service`, `tenant`).
    Layered,
    /// One key, as in `hot`, checked as Envoy checks before a request on a route
    /// whose rate limit has a cost of its own: the descriptor's `hits_addend` is 0.
    Check,
    /// One key, as in `hot`, charged as Envoy charges at stream end
    /// (`apply_on_stream_done`): the descriptor's `hits_addend` is `--cost`.
    Charge,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Hot => "hot",
            Scenario::Uniform => "uniform",
            Scenario::Zipf => "zipf",
            Scenario::Attack => "attack",
            Scenario::Layered => "layered",
            Scenario::Check => "check",
            Scenario::Charge => "charge",
        }
    }
}

/// Which traffic a request belongs to, for separate counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Normal = 0,
    Attacker = 1,
}

/// Settings of a workload (from the command line).
#[derive(Debug, Clone)]
pub struct Spec {
    pub scenario: Scenario,
    pub domain: String,
    pub key: String,
    pub keys: u64,
    pub zipf_s: f64,
    pub attack_share: f64,
    pub sequential: bool,
    /// Number of the first key (`k{first_key}`), so runs one after another can send
    /// keys none before them sent.
    pub first_key: u64,
    /// What each request of the `charge` scenario costs.
    pub cost: u64,
}

pub struct Workload {
    spec: Spec,
    table: Vec<Bytes>,
    attacker: Bytes,
    zipf: Option<Zipf>,
    next: AtomicU64,
}

impl Workload {
    pub fn new(spec: Spec) -> anyhow::Result<Workload> {
        anyhow::ensure!(spec.keys >= 1, "--keys must be at least 1");
        anyhow::ensure!(
            (0.0..=1.0).contains(&spec.attack_share),
            "--attack-share must be within 0..1"
        );
        let zipf = match spec.scenario {
            Scenario::Zipf => Some(Zipf::new(spec.keys, spec.zipf_s)?),
            _ => None,
        };
        let distinct = match spec.scenario {
            Scenario::Hot | Scenario::Check | Scenario::Charge => 1,
            _ => spec.keys,
        };
        let mut w = Workload {
            attacker: Bytes::new(),
            table: Vec::new(),
            zipf,
            next: AtomicU64::new(0),
            spec,
        };
        // All templates live in one buffer that lives as long as the process, so a
        // template is a `'static` slice: handing one out copies two words and touches
        // no reference count that the generator's threads would fight over.
        let mut buf = Vec::new();
        frame(
            &w.request_with(vec![descriptor(&w.spec.key, ATTACKER.to_string())]),
            &mut buf,
        );
        let mut ends = vec![buf.len()];
        if distinct <= TABLE_MAX {
            for i in 0..distinct {
                frame(&w.request(i), &mut buf);
                ends.push(buf.len());
            }
        }
        let buf: &'static [u8] = Vec::leak(buf);
        let mut start = 0;
        let mut slices = ends.into_iter().map(|end| {
            let b = Bytes::from_static(&buf[start..end]);
            start = end;
            b
        });
        w.attacker = slices.next().unwrap_or_default();
        w.table = slices.collect();
        Ok(w)
    }

    /// The next request to send, gRPC-framed, and its class.
    #[inline]
    pub fn pick(&self, rng: &mut impl Rng) -> (Bytes, Class) {
        let s = &self.spec;
        if s.scenario == Scenario::Attack && rng.random::<f64>() < s.attack_share {
            return (self.attacker.clone(), Class::Attacker);
        }
        let index = match s.scenario {
            Scenario::Hot | Scenario::Check | Scenario::Charge => 0,
            _ if s.sequential => self.next.fetch_add(1, Ordering::Relaxed) % s.keys,
            Scenario::Zipf => self.zipf.as_ref().map_or(0, |z| z.sample(rng) - 1),
            _ => rng.random_range(0..s.keys),
        };
        let body = match self.table.get(index as usize) {
            Some(b) => b.clone(),
            None => {
                let mut buf = Vec::new();
                frame(&self.request(index), &mut buf);
                Bytes::from(buf)
            }
        };
        (body, Class::Normal)
    }

    /// The request of key `index`.
    pub fn request(&self, index: u64) -> RateLimitRequest {
        let key = &self.spec.key;
        let descriptors = match self.spec.scenario {
            Scenario::Hot => vec![descriptor(key, "hot".into())],
            Scenario::Check => vec![costed(descriptor(key, "hot".into()), 0)],
            Scenario::Charge => vec![costed(descriptor(key, "hot".into()), self.spec.cost)],
            Scenario::Uniform | Scenario::Zipf | Scenario::Attack => {
                vec![descriptor(key, format!("k{}", self.spec.first_key + index))]
            }
            Scenario::Layered => vec![
                descriptor(
                    "remote_address",
                    format!(
                        "10.{}.{}.{}",
                        index >> 16 & 255,
                        index >> 8 & 255,
                        index & 255
                    ),
                ),
                descriptor("service", "checkout".into()),
                descriptor("tenant", format!("t{}", index % 100)),
            ],
        };
        self.request_with(descriptors)
    }

    fn request_with(&self, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.spec.domain.clone(),
            descriptors,
            hits_addend: 0,
        }
    }
}

fn descriptor(key: &str, value: String) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_string(),
            value,
        }],
        ..Default::default()
    }
}

/// The descriptor with a `hits_addend` of its own, as Envoy sends a rate limit's
/// cost (per-route `rate_limits` with `hits_addend`): the request's stays 0.
fn costed(d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..d
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use rand::SeedableRng;

    use super::*;
    use crate::codec::PREFIX;

    fn spec(scenario: Scenario) -> Spec {
        Spec {
            scenario,
            domain: "bench".into(),
            key: "client".into(),
            keys: 1000,
            zipf_s: 1.1,
            attack_share: 0.25,
            sequential: false,
            first_key: 0,
            cost: 8,
        }
    }

    fn decode(b: &Bytes) -> RateLimitRequest {
        let len = u32::from_be_bytes(b[1..PREFIX].try_into().unwrap()) as usize;
        assert_eq!((b[0], len), (0, b.len() - PREFIX), "frame prefix");
        RateLimitRequest::decode(&b[PREFIX..]).unwrap()
    }

    fn value(r: &RateLimitRequest, i: usize) -> &str {
        &r.descriptors[i].entries[0].value
    }

    #[test]
    fn templates_decode_to_the_scenario_requests() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let w = Workload::new(spec(Scenario::Hot)).unwrap();
        let r = decode(&w.pick(&mut rng).0);
        assert_eq!(r.domain, "bench");
        assert_eq!(value(&r, 0), "hot");

        let w = Workload::new(spec(Scenario::Layered)).unwrap();
        let r = decode(&w.pick(&mut rng).0);
        let keys: Vec<_> = r.descriptors.iter().map(|d| &d.entries[0].key).collect();
        assert_eq!(keys, ["remote_address", "service", "tenant"]);

        let w = Workload::new(spec(Scenario::Uniform)).unwrap();
        for _ in 0..100 {
            let r = decode(&w.pick(&mut rng).0);
            let n: u64 = value(&r, 0)[1..].parse().unwrap();
            assert!(n < 1000);
        }
    }

    /// Envoy's check and charge carry their cost on the descriptor, not the
    /// request, so Sluice tells them from a plain request (which has none).
    #[test]
    fn check_and_charge_carry_their_cost_on_the_descriptor() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut s = spec(Scenario::Check);
        s.key = "api_key".into();
        let cost = |s: &Spec| {
            let w = Workload::new(s.clone()).unwrap();
            let r = decode(&w.pick(&mut rand::rngs::SmallRng::seed_from_u64(7)).0);
            assert_eq!(r.hits_addend, 0, "the request's own hits_addend");
            assert_eq!(r.descriptors.len(), 1);
            assert_eq!(r.descriptors[0].entries[0].key, "api_key");
            assert_eq!(value(&r, 0), "hot", "one key, as in hot");
            assert!(!r.descriptors[0].is_negative_hits);
            r.descriptors[0].hits_addend.map(|h| h.value)
        };
        assert_eq!(cost(&s), Some(0), "a check spends nothing");
        s.scenario = Scenario::Charge;
        assert_eq!(cost(&s), Some(8), "a charge spends --cost");
        s.cost = 1500;
        assert_eq!(cost(&s), Some(1500));
        // Every request of the run is the same one.
        let w = Workload::new(s).unwrap();
        let first = w.pick(&mut rng).0;
        assert!((0..100).all(|_| w.pick(&mut rng).0 == first));
        // A plain request carries no cost of its own.
        let w = Workload::new(spec(Scenario::Hot)).unwrap();
        assert_eq!(decode(&w.pick(&mut rng).0).descriptors[0].hits_addend, None);
    }

    #[test]
    fn attack_sends_its_share_to_the_attacker() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(2);
        let w = Workload::new(spec(Scenario::Attack)).unwrap();
        let mut attacker = 0;
        for _ in 0..10_000 {
            let (b, class) = w.pick(&mut rng);
            let r = decode(&b);
            assert_eq!(class == Class::Attacker, value(&r, 0) == ATTACKER);
            attacker += (class == Class::Attacker) as u32;
        }
        assert!((2200..2800).contains(&attacker), "{attacker}");
    }

    #[test]
    fn zipf_favours_the_first_keys() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let w = Workload::new(spec(Scenario::Zipf)).unwrap();
        let k0 = (0..10_000)
            .filter(|_| value(&decode(&w.pick(&mut rng).0), 0) == "k0")
            .count();
        // P(rank 1) for n = 1000, s = 1.1 is about 0.18.
        assert!((1300..2300).contains(&k0), "{k0}");
    }

    #[test]
    fn sequential_touches_every_key_once_per_round() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(4);
        let mut s = spec(Scenario::Uniform);
        s.sequential = true;
        s.keys = 5;
        let w = Workload::new(s).unwrap();
        let seen: Vec<String> = (0..10)
            .map(|_| value(&decode(&w.pick(&mut rng).0), 0).to_string())
            .collect();
        assert_eq!(seen[..5], ["k0", "k1", "k2", "k3", "k4"]);
        assert_eq!(seen[5..], seen[..5]);
    }

    #[test]
    fn first_key_starts_the_keys_past_an_earlier_run() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(6);
        let mut s = spec(Scenario::Uniform);
        s.sequential = true;
        s.keys = 3;
        s.first_key = 60_000;
        let w = Workload::new(s).unwrap();
        let seen: Vec<String> = (0..3)
            .map(|_| value(&decode(&w.pick(&mut rng).0), 0).to_string())
            .collect();
        assert_eq!(seen, ["k60000", "k60001", "k60002"]);
    }

    #[test]
    fn beyond_the_table_requests_are_encoded_on_the_fly() {
        let mut s = spec(Scenario::Uniform);
        s.keys = TABLE_MAX + 1;
        s.sequential = true;
        let w = Workload::new(s).unwrap();
        assert!(w.table.is_empty());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        assert_eq!(value(&decode(&w.pick(&mut rng).0), 0), "k0");
    }
}
