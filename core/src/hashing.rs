//! Block and sequence hashes, bit-compatible with NVIDIA Dynamo's KV router
//! (`dynamo-kv-router` 1.6.1) so both can be checked against each other.
//!
//! A prompt is cut into full blocks of `block_size` tokens (a trailing partial
//! block is never hashed: no engine caches it). Each block gets a *local* hash
//! of its tokens; the *sequence* hash of block `i` names the whole prefix
//! `0..=i` by chaining the previous sequence hash with the local one.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every chain step and, without LoRA or salt, of local block hashes.
pub const XXH3_SEED: u64 = 1337;

/// Hash of one block's tokens, independent of what precedes it.
pub type LocalBlockHash = u64;

/// Hash naming a whole prefix: all blocks up to and including this one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceHash(pub u64);

/// Seed for local block hashes: requests under different LoRA adapters or
/// cache salts must never share cache entries, so they hash apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HashSeed(pub u64);

impl Default for HashSeed {
    fn default() -> Self {
        HashSeed(XXH3_SEED)
    }
}

impl HashSeed {
    /// Folds a LoRA name and a cache salt into the seed (wrapping adds, inner
    /// seeds 0 and 1 so `(salt = x)` and `(lora = x)` stay distinct). Empty
    /// strings count as absent, as in Dynamo.
    pub fn new(lora_name: Option<&str>, cache_salt: Option<&str>) -> Self {
        let mut seed = XXH3_SEED;
        if let Some(lora) = lora_name.filter(|s| !s.is_empty()) {
            seed = seed.wrapping_add(xxh3_64_with_seed(lora.as_bytes(), 0));
        }
        if let Some(salt) = cache_salt.filter(|s| !s.is_empty()) {
            seed = seed.wrapping_add(xxh3_64_with_seed(salt.as_bytes(), 1));
        }
        HashSeed(seed)
    }
}

/// Local hash of one block: xxh3-64 over its tokens as little-endian u32.
///
/// On a little-endian CPU those bytes are the block's own memory, so the hash
/// reads the tokens in place: no copy, no zeroed scratch buffer (which cost
/// more than the hash itself for a 16-token block).
#[inline]
pub fn local_block_hash(block: &[u32], seed: HashSeed) -> LocalBlockHash {
    if cfg!(target_endian = "little") {
        xxh3_64_with_seed(bytemuck::cast_slice(block), seed.0)
    } else {
        let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&bytes, seed.0)
    }
}

/// Next link of the chain: xxh3-64 (seed 1337) over `[parent, local]` as
/// 16 little-endian bytes. The chain seed never varies; only local hashes do.
#[inline]
pub fn next_sequence_hash(parent: SequenceHash, local: LocalBlockHash) -> SequenceHash {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&parent.0.to_le_bytes());
    bytes[8..].copy_from_slice(&local.to_le_bytes());
    SequenceHash(xxh3_64_with_seed(&bytes, XXH3_SEED))
}

/// Sequence hash of a block given its parent's (none for the first block).
#[inline]
pub fn chain(parent: Option<SequenceHash>, local: LocalBlockHash) -> SequenceHash {
    match parent {
        Some(parent) => next_sequence_hash(parent, local),
        None => SequenceHash(local),
    }
}

/// Local hashes of every full block of `tokens`.
pub fn local_block_hashes(tokens: &[u32], block_size: u32, seed: HashSeed) -> Vec<LocalBlockHash> {
    if block_size == 0 {
        return Vec::new();
    }
    tokens.chunks_exact(block_size as usize).map(|block| local_block_hash(block, seed)).collect()
}

/// Sequence hashes of every full block of `tokens`, first block first.
pub fn sequence_hashes(tokens: &[u32], block_size: u32, seed: HashSeed) -> Vec<SequenceHash> {
    sequence_hash_chain(tokens, block_size, seed).collect()
}

/// The same hashes as one shared slice, written in place in one pass: the
/// chunks have an exact length, so `collect` allocates the `Arc` once and
/// nothing is allocated per block.
pub fn shared_sequence_hashes(tokens: &[u32], block_size: u32, seed: HashSeed) -> Arc<[SequenceHash]> {
    sequence_hash_chain(tokens, block_size, seed).collect()
}

/// Each block's local hash is independent of the chain, so the CPU overlaps
/// the next block's hash with the current chain step.
fn sequence_hash_chain(tokens: &[u32], block_size: u32, seed: HashSeed) -> impl Iterator<Item = SequenceHash> + '_ {
    // A zero block size hashes nothing; `max(1)` only keeps `chunks_exact` from panicking.
    let blocks = if block_size == 0 { &[][..] } else { tokens };
    let mut parent = None;
    blocks.chunks_exact(block_size.max(1) as usize).map(move |block| {
        let seq = chain(parent, local_block_hash(block, seed));
        parent = Some(seq);
        seq
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_partial_block_is_not_hashed() {
        let tokens: Vec<u32> = (0..35).collect();
        assert_eq!(sequence_hashes(&tokens, 16, HashSeed::default()).len(), 2);
        assert!(sequence_hashes(&tokens[..15], 16, HashSeed::default()).is_empty());
        assert!(sequence_hashes(&tokens, 0, HashSeed::default()).is_empty());
    }

    #[test]
    fn first_sequence_hash_is_the_local_hash() {
        let tokens: Vec<u32> = (0..32).collect();
        let seed = HashSeed::default();
        let seq = sequence_hashes(&tokens, 16, seed);
        let local = local_block_hashes(&tokens, 16, seed);
        assert_eq!(seq[0].0, local[0]);
        assert_eq!(seq[1], next_sequence_hash(seq[0], local[1]));
    }

    #[test]
    fn sequence_hash_depends_on_the_whole_prefix() {
        let a: Vec<u32> = (0..32).collect();
        let mut b = a.clone();
        b[0] = 999;
        let (sa, sb) = (sequence_hashes(&a, 16, HashSeed::default()), sequence_hashes(&b, 16, HashSeed::default()));
        assert_ne!(sa[1], sb[1]);
        assert_eq!(
            local_block_hashes(&a, 16, HashSeed::default())[1],
            local_block_hashes(&b, 16, HashSeed::default())[1]
        );
    }

    #[test]
    fn lora_and_salt_separate_caches() {
        let plain = HashSeed::new(None, None);
        assert_eq!(plain, HashSeed::default());
        assert_eq!(HashSeed::new(Some(""), Some("")), plain);
        let lora = HashSeed::new(Some("x"), None);
        let salt = HashSeed::new(None, Some("x"));
        let both = HashSeed::new(Some("x"), Some("x"));
        let all = [plain, lora, salt, both];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn large_blocks_hash_like_small_ones() {
        let tokens: Vec<u32> = (0..1000).collect();
        let seed = HashSeed::default();
        let bytes: Vec<u8> = tokens[..200].iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(local_block_hash(&tokens[..200], seed), xxh3_64_with_seed(&bytes, XXH3_SEED));
    }
}
