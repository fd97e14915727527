//! Hashes every replica must agree on: they place counters on Redis shards and name
//! counters in keys that several processes share, so none may depend on a per-process
//! seed (std's `RandomState` does).

/// FNV-1a, 64 bits: stable across processes, versions and machines. Used where the
/// input is not secret and only the spread matters (placing a key on a shard).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published FNV-1a 64 test vectors: a change here moves every counter to
    /// another shard, so it must be deliberate.
    #[test]
    fn stable_hash_matches_the_published_fnv1a_vectors() {
        assert_eq!(stable_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stable_hash(b"foobar"), 0x85944171f73967e8);
        assert_eq!(stable_hash(b"abc"), 0xe71fa2190541574b);
    }
}
