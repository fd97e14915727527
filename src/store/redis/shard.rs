//! Placement: which shard (standalone) or hash slot (cluster) holds a counter, and
//! the Redis key it is stored under.
//!
//! Standalone shards use jump consistent hash (Lamping and Veach, 2014) of
//! `Hit::placement`: stable across processes, and growing from n to n + 1 shards
//! moves only about 1/(n + 1) of the keys. In a cluster every key carries the
//! placement as a `{hash tag}`, so counters placed together (one `shard_by` tenant)
//! share a slot and are decided by one script; other keys are grouped by slot.

use crate::algorithm::Algorithm;
use crate::store::Hit;

/// Jump consistent hash: the bucket in `0..buckets` for `key`. `buckets` must be > 0.
pub fn jump_hash(mut key: u64, buckets: usize) -> usize {
    let (mut b, mut j) = (-1i64, 0i64);
    let n = buckets.max(1) as i64;
    while j < n {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b.wrapping_add(1) as f64) * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as usize
}

/// The cluster hash slot of a key (its `{hash tag}`), as the cluster client routes it.
pub use sluice_redis::cluster::slot;

/// The short code the scripts know an algorithm by. It also ends the Redis key, so a
/// policy that changes a rule's algorithm starts a fresh counter instead of reading
/// another algorithm's state (or a sorted set as a string).
pub const fn code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindowLog => "sl",
        Algorithm::SlidingWindowCounter => "sc",
        Algorithm::TokenBucket => "tb",
        Algorithm::LeakyBucket => "lb",
    }
}

/// A placement as the hash tag of its keys: 16 lowercase hex digits.
fn tag(placement: u64) -> [u8; 16] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut tag = [0; 16];
    for (i, digit) in tag.iter_mut().enumerate() {
        *digit = HEX[(placement >> ((15 - i) * 4)) as usize & 15];
    }
    tag
}

/// The cluster hash slot of the keys of `placement` (their hash tag), without
/// building one.
pub fn placement_slot(placement: u64) -> u16 {
    slot(&tag(placement))
}

/// The Redis key of a hit's counter: `PREFIX{placement}:key:code`. The prefix must
/// not contain `{`, so the placement is the hash tag.
pub fn redis_key(prefix: &str, hit: &Hit) -> String {
    // By hand rather than format!: this runs for every hit of every request.
    let code = code(hit.limit.algorithm);
    let mut key = String::with_capacity(prefix.len() + 20 + hit.key.len() + code.len());
    key.push_str(prefix);
    key.push('{');
    key.extend(tag(hit.placement).map(char::from));
    key.push_str("}:");
    key.push_str(&hit.key);
    key.push(':');
    key.push_str(code);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_keys_are_prefix_placement_in_hex_key_and_code_in_the_placements_slot() {
        use crate::algorithm::Limit;
        use crate::store::{Mode, Spend};
        for (placement, key, algorithm) in [
            (0, "", Algorithm::FixedWindow),
            (0xab, "d|client=a", Algorithm::SlidingWindowCounter),
            (u64::MAX, "é:{x}", Algorithm::LeakyBucket),
            (0x0123_4567_89ab_cdef, "k", Algorithm::TokenBucket),
        ] {
            let hit = Hit {
                key: key.into(),
                placement,
                limit: Limit {
                    algorithm,
                    requests: 1,
                    window: 1,
                    burst: 1,
                    phase: 0,
                },
                hits: 1,
                mode: Mode::Enforce,
                spend: Spend::IfAdmitted,
                fallback: Default::default(),
                max_delay: crate::algorithm::NO_DEADLINE,
            };
            let redis_key = redis_key("sluice:", &hit);
            assert_eq!(
                redis_key,
                format!("sluice:{{{placement:016x}}}:{key}:{}", code(algorithm))
            );
            assert_eq!(slot(redis_key.as_bytes()), placement_slot(placement));
        }
    }

    #[test]
    fn growing_from_three_to_four_shards_moves_about_a_quarter() {
        let n = 100_000u64;
        let mut moved = 0;
        for i in 0..n {
            let key = crate::hash::stable_hash(format!("key-{i}").as_bytes());
            let (before, after) = (jump_hash(key, 3), jump_hash(key, 4));
            assert!(before < 3 && after < 4);
            if before != after {
                // A moved key only ever moves to the new shard.
                assert_eq!(after, 3);
                moved += 1;
            }
        }
        let share = moved as f64 / n as f64;
        assert!((0.23..0.27).contains(&share), "moved {share}");
    }

    #[test]
    fn placement_spreads_keys_evenly() {
        let mut counts = [0usize; 4];
        for i in 0..40_000u64 {
            let key = crate::hash::stable_hash(&i.to_le_bytes());
            counts[jump_hash(key, 4)] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(jump_hash(42, 1), 0);
    }

    /// Every replica must place a key on the same shard, so the buckets are pinned.
    /// The expected values were computed once with an independent implementation of
    /// the paper's reference C++ (Lamping and Veach, figure 1) in Python, itself
    /// checked against dgryski/go-jump's table generated from that C++.
    #[test]
    fn jump_hash_matches_the_published_algorithm() {
        const BUCKETS: [usize; 12] = [1, 2, 3, 4, 5, 7, 8, 16, 100, 1000, 65_536, 1 << 20];
        #[rustfmt::skip]
        let table: [(u64, [usize; 12]); 9] = [
            (0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            (1, [0, 0, 0, 0, 0, 6, 6, 6, 55, 549, 21_134, 985_611]),
            (42, [0, 1, 2, 2, 2, 2, 2, 2, 43, 571, 5_747, 153_897]),
            (0xdead_beef, [0, 1, 2, 3, 3, 5, 5, 5, 87, 285, 64_244, 479_362]),
            (0x0ddc_0ffe_ebad_f00d, [0, 1, 2, 2, 2, 2, 2, 15, 72, 113, 47_800, 86_737]),
            (10_863_919_174_838_991, [0, 1, 1, 1, 1, 6, 6, 14, 21, 830, 4_855, 803_824]),
            (2_016_238_256_797_177_309, [0, 1, 1, 3, 3, 3, 3, 3, 3, 863, 39_755, 413_009]),
            (u64::MAX, [0, 1, 2, 2, 2, 2, 7, 10, 92, 313, 18_311, 589_430]),
            (1 << 63, [0, 1, 1, 3, 4, 5, 5, 12, 84, 453, 53_854, 802_256]),
        ];
        for (key, want) in table {
            let got = BUCKETS.map(|n| jump_hash(key, n));
            assert_eq!(got, want, "key {key:#x}");
        }
    }
}
