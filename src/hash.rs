//! Hashes every replica must agree on: they place counters on Redis shards and name
//! counters in keys that several processes share, so none may depend on a per-process
//! seed (std's `RandomState` does).
//!
//! Values that stand in counter keys hashed (client addresses under `--hash-keys`,
//! values over 64 bytes always) use [`ValueHash`], keyed by a secret: without it,
//! whoever reads Redis could recover an IPv4 address from its hash by trying all of
//! them, and a client could craft a long value whose hash is someone else's counter.

use std::fmt;

use siphasher::sip128::{Hasher128, SipHasher24};

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

/// Shortest secret accepted: SipHash's key is 128 bits.
pub const MIN_SECRET_BYTES: usize = 16;

/// SipHash-2-4 with 128-bit output, under a key derived from the operator's secret
/// (SHA-256 of it, first 16 bytes). SipHash is a keyed PRF made for short inputs:
/// tens of nanoseconds for a value, where HMAC-SHA256 costs several blocks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ValueHash {
    k0: u64,
    k1: u64,
}

/// Why a secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the hash secret has {0} bytes; it needs at least {MIN_SECRET_BYTES} bytes (for instance `openssl rand -hex 32`)")]
pub struct ShortSecret(pub usize);

impl ValueHash {
    /// The hash under `secret`: every replica given the same secret agrees.
    pub fn from_secret(secret: &[u8]) -> Result<Self, ShortSecret> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(ShortSecret(secret.len()));
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, secret);
        let mut key = [0u8; 16];
        key.copy_from_slice(&digest.as_ref()[..16]);
        Ok(Self::from_key(key))
    }

    /// A key of this process alone, for counters no other process reads (the memory
    /// store) when no secret is given.
    pub fn random() -> Self {
        Self::from_key(rand::random())
    }

    /// A fixed, publicly known key, for shared counters when no secret is given:
    /// replicas agree, but hashes can be computed by anyone.
    pub fn public() -> Self {
        Self::from_key(*b"sluice-no-secret")
    }

    fn from_key(key: [u8; 16]) -> Self {
        let (a, b) = key.split_at(8);
        ValueHash {
            k0: u64::from_le_bytes(a.try_into().expect("8 bytes")),
            k1: u64::from_le_bytes(b.try_into().expect("8 bytes")),
        }
    }

    /// The 16 bytes of `value`'s hash, in SipHash's reference byte order.
    pub fn hash(&self, value: &[u8]) -> [u8; 16] {
        let mut h = SipHasher24::new_with_keys(self.k0, self.k1);
        std::hash::Hasher::write(&mut h, value);
        h.finish128().as_bytes()
    }

    /// Appends `#` and the hash of `value` in 32 lowercase hex digits.
    pub fn push_hex(&self, out: &mut String, value: &[u8]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.reserve(33);
        out.push('#');
        for b in self.hash(value) {
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
}

/// Never prints the key.
impl fmt::Debug for ValueHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ValueHash(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// SipHash-2-4-128's reference vectors (key 00..0f, messages 00..n-1).
    #[test]
    fn value_hash_matches_the_siphash_reference_vectors() {
        let h = ValueHash::from_key(std::array::from_fn(|i| i as u8));
        assert_eq!(hex(&h.hash(b"")), "a3817f04ba25a8e66df67214c7550293");
        let fifteen: Vec<u8> = (0..15).collect();
        assert_eq!(hex(&h.hash(&fifteen)), "5493e99933b0a8117e08ec0f97cfc3d9");
    }

    /// The whole derivation, from secret to the text in a counter key, as computed by
    /// an independent implementation (Python's hashlib and SipHash written from the
    /// paper). Replicas of different versions must agree on it, so a change here
    /// restarts every hashed counter and must be deliberate.
    #[test]
    fn hashed_values_from_a_secret_are_pinned() {
        let h = ValueHash::from_secret(b"correct horse battery staple!!").unwrap();
        let mut s = String::new();
        h.push_hex(&mut s, b"10.0.0.1");
        assert_eq!(s, "#311a51516b78866c4654dbab27586fe2");
        s.clear();
        h.push_hex(&mut s, &[b'x'; 100]);
        assert_eq!(s, "#456c53953cb69406a28cc89fddbbfbd0");
    }

    #[test]
    fn short_secrets_are_refused_and_keys_never_printed() {
        assert_eq!(ValueHash::from_secret(b"too short"), Err(ShortSecret(9)));
        let h = ValueHash::from_secret(&[7; 16]).unwrap();
        assert_eq!(format!("{h:?}"), "ValueHash(..)");
        assert_ne!(ValueHash::from_secret(&[8; 16]).unwrap(), h);
    }

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
