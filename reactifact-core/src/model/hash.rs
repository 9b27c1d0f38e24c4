//! SHA-256 digests: content hashes, commit hashes and the state hash.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

macro_rules! digest_type {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; 32]);

        /// Encoded as a 32-byte binary string (one rmp `bin 8`), not as 32 integers.
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_bytes(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                serde_bytes::ByteArray::<32>::deserialize(deserializer).map(|bytes| $name(bytes.into_array()))
            }
        }

        impl $name {
            /// The 32 raw bytes of the digest.
            pub fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }

            /// The first 12 hex digits, for log lines and short displays.
            pub fn short(&self) -> String {
                hex(&self.0[..6])
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex(&self.0))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.short())
            }
        }
    };
}

digest_type!(
    /// SHA-256 of an artifact's rmp-serde encoding (named fields).
    ContentHash
);
digest_type!(
    /// SHA-256 of a commit: its parent hash, generation, state hash and operations.
    CommitHash
);
digest_type!(
    /// Deterministic digest of every current artifact (id, kind, content hash) and relation.
    ///
    /// It does not depend on version counters, creation order or the order in which the state
    /// was built, so two contexts holding the same content have the same state hash.
    StateHash
);

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
    out
}

pub(crate) fn content_hash(bytes: &[u8]) -> ContentHash {
    ContentHash(Sha256::digest(bytes).into())
}

impl ContentHash {
    /// The content hash of encoded bytes: what a commit records of an artifact's or an
    /// intent's encoding (the `action_hash` of a [`NewIntent`](crate::NewIntent)), and
    /// what a store checks a row's bytes against.
    pub fn of(bytes: &[u8]) -> ContentHash {
        content_hash(bytes)
    }
}

/// An `io::Write` that feeds a SHA-256 hasher, so rmp-serde can encode straight into it.
/// rmp-serde writes many small pieces; they are gathered into whole blocks first, since the
/// hasher's per-call cost dominates for pieces of a few bytes.
pub(crate) struct HashWriter {
    hasher: Sha256,
    buffer: Vec<u8>,
}

impl HashWriter {
    const CHUNK: usize = 4096;

    pub(crate) fn new(domain: &[u8]) -> Self {
        let mut buffer = Vec::with_capacity(Self::CHUNK);
        buffer.extend_from_slice(domain);
        HashWriter {
            hasher: Sha256::new(),
            buffer,
        }
    }

    /// Appends what `write` writes to the bytes hashed: straight into the buffer, without a
    /// call through `io::Write` per piece.
    pub(crate) fn append(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        write(&mut self.buffer);
        if self.buffer.len() >= Self::CHUNK {
            self.hasher.update(&self.buffer);
            self.buffer.clear();
        }
    }

    pub(crate) fn finish(mut self) -> [u8; 32] {
        self.hasher.update(&self.buffer);
        self.hasher.finalize().into()
    }
}

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.buffer.len() + buf.len() > Self::CHUNK {
            self.hasher.update(&self.buffer);
            self.buffer.clear();
            if buf.len() >= Self::CHUNK {
                self.hasher.update(buf);
                return Ok(buf.len());
            }
        }
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An order-independent, incrementally maintained digest of a set of entries.
///
/// Each entry contributes the SHA-256 of its canonical bytes; the accumulator is their sum
/// modulo 2^256. Adding and removing an entry costs one hash, whatever the size of the set,
/// which keeps commits O(changes). The published [`StateHash`] is the SHA-256 of the sum and
/// the entry count.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(crate) struct SetDigest {
    sum: [u64; 4],
    count: u64,
}

impl SetDigest {
    pub(crate) fn add(&mut self, entry: &[u8; 32]) {
        let limbs = limbs(entry);
        let mut carry = false;
        for (acc, limb) in self.sum.iter_mut().zip(limbs) {
            let (s1, c1) = acc.overflowing_add(limb);
            let (s2, c2) = s1.overflowing_add(carry as u64);
            *acc = s2;
            carry = c1 || c2;
        }
        self.count += 1;
    }

    pub(crate) fn remove(&mut self, entry: &[u8; 32]) {
        let limbs = limbs(entry);
        let mut borrow = false;
        for (acc, limb) in self.sum.iter_mut().zip(limbs) {
            let (s1, b1) = acc.overflowing_sub(limb);
            let (s2, b2) = s1.overflowing_sub(borrow as u64);
            *acc = s2;
            borrow = b1 || b2;
        }
        self.count -= 1;
    }

    pub(crate) fn finish(&self) -> StateHash {
        let mut hasher = Sha256::new();
        hasher.update(b"reactifact/state/v1");
        for limb in self.sum {
            hasher.update(limb.to_le_bytes());
        }
        hasher.update(self.count.to_le_bytes());
        StateHash(hasher.finalize().into())
    }
}

fn limbs(entry: &[u8; 32]) -> [u64; 4] {
    std::array::from_fn(|i| {
        let mut limb = [0u8; 8];
        limb.copy_from_slice(&entry[i * 8..i * 8 + 8]);
        u64::from_le_bytes(limb)
    })
}

/// Digest of one artifact entry for the state hash: tag, id, kind and content hash.
pub(crate) fn artifact_entry(id: &str, kind: &str, hash: &ContentHash) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"A");
    hasher.update((id.len() as u64).to_le_bytes());
    hasher.update(id.as_bytes());
    hasher.update((kind.len() as u64).to_le_bytes());
    hasher.update(kind.as_bytes());
    hasher.update(hash.0);
    hasher.finalize().into()
}

/// Digest of one relation entry for the state hash.
pub(crate) fn relation_entry(from: &str, name: &str, to: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"R");
    for part in [from, name, to] {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_digest_is_order_independent_and_removable() {
        let a = artifact_entry("a", "k", &content_hash(b"1"));
        let b = artifact_entry("b", "k", &content_hash(b"2"));
        let mut ab = SetDigest::default();
        ab.add(&a);
        ab.add(&b);
        let mut ba = SetDigest::default();
        ba.add(&b);
        ba.add(&a);
        assert_eq!(ab.finish(), ba.finish());
        ab.remove(&a);
        let mut only_b = SetDigest::default();
        only_b.add(&b);
        assert_eq!(ab, only_b);
        ab.remove(&b);
        assert_eq!(ab.finish(), SetDigest::default().finish());
    }

    #[test]
    fn hash_writer_matches_one_shot_hashing_across_chunk_boundaries() {
        use std::io::Write;
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let mut writer = HashWriter::new(b"domain");
        for piece in data.chunks(7).chain([&data[..5000]]) {
            writer.write_all(piece).unwrap();
        }
        let mut expected = Sha256::new();
        expected.update(b"domain");
        expected.update(&data);
        expected.update(&data[..5000]);
        assert_eq!(writer.finish(), <[u8; 32]>::from(expected.finalize()));
    }

    #[test]
    fn digests_encode_as_one_binary_string() {
        let h = content_hash(b"x");
        let bytes = rmp_serde::to_vec(&h).unwrap();
        assert_eq!(bytes.len(), 2 + 32, "bin 8 header and 32 bytes");
        assert_eq!(rmp_serde::from_slice::<ContentHash>(&bytes).unwrap(), h);
    }

    #[test]
    fn hex_is_lowercase_and_full_length() {
        let h = content_hash(b"");
        assert_eq!(
            h.to_string(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(h.short(), "e3b0c44298fc");
    }
}
