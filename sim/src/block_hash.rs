//! The simulated engine's own block hashes: a chain a router cannot derive.
//!
//! Like vLLM's (engines.md §1.5), each full block's digest hashes the
//! parent's **whole** digest together with the block's tokens, starting from
//! a per-engine root (vLLM's `NONE_HASH`), and only the digest's last 8 bytes
//! are published. Here the digest is xxh3-128 seeded with the engine's hash
//! seed over `parent digest (16 bytes, big-endian) ‖ tokens (u32,
//! little-endian)`; the published value is the digest's low 64 bits, which
//! are its last 8 bytes in big-endian order, exactly as vLLM maps its
//! digests to ints. Knowing published values and tokens is not enough to
//! extend the chain: the router must map engine hashes to its own.

use xxhash_rust::xxh3::xxh3_128_with_seed;

/// A block's full digest (what the next block chains on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockDigest(pub u128);

impl BlockDigest {
    /// The value put in KV events as an int: the last 8 bytes, big-endian.
    pub fn published(self) -> u64 {
        self.0 as u64
    }

    /// The value put in KV events as bytes (16 bytes, big-endian).
    pub fn bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }
}

/// Hashes token blocks into one engine's chain.
#[derive(Clone, Debug)]
pub struct EngineHasher {
    seed: u64,
    root: BlockDigest,
}

impl EngineHasher {
    pub fn new(seed: u64) -> Self {
        EngineHasher { seed, root: BlockDigest(xxh3_128_with_seed(b"kvpick-sim NONE_HASH", seed)) }
    }

    /// Digest of one block given its parent's (`None`: the prompt's first).
    pub fn block(&self, parent: Option<BlockDigest>, tokens: &[u32]) -> BlockDigest {
        let mut input = Vec::with_capacity(16 + 4 * tokens.len());
        input.extend_from_slice(&parent.unwrap_or(self.root).bytes());
        for t in tokens {
            input.extend_from_slice(&t.to_le_bytes());
        }
        BlockDigest(xxh3_128_with_seed(&input, self.seed))
    }

    /// Digests of every full block of `tokens` (a trailing partial block has
    /// none), in order.
    pub fn chain(&self, tokens: &[u32], block_size: u32) -> Vec<BlockDigest> {
        let mut parent = None;
        tokens
            .chunks_exact(block_size as usize)
            .map(|block| {
                let digest = self.block(parent, block);
                parent = Some(digest);
                digest
            })
            .collect()
    }
}
