//! What an engine tells us about its KV cache, in engine-neutral form.
//!
//! Decoders of the engines' wire formats (vLLM, SGLang, TensorRT-LLM) produce
//! these; shards apply them to their index.

use crate::hashing::HashSeed;

/// A block hash as the engine reports it. Engines hash with their own scheme
/// (vLLM publishes the last 8 bytes of a SHA-256 chain), so these can only be
/// mapped, never recomputed.
pub type EngineBlockHash = u64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks newly cached, in chain order: block `i + 1`'s parent is
    /// block `i`, and block 0's parent is `parent` (none: a prompt start).
    Stored {
        block_hashes: Vec<EngineBlockHash>,
        parent: Option<EngineBlockHash>,
        /// Exactly `block_hashes.len() * block_size` tokens.
        token_ids: Vec<u32>,
        block_size: u32,
        /// Seed of the request that filled the blocks (its LoRA adapter).
        seed: HashSeed,
    },
    /// Blocks evicted, in any order.
    Removed { block_hashes: Vec<EngineBlockHash> },
    /// Everything the worker held is gone (cache reset, engine restart).
    Cleared,
}

impl KvEvent {
    /// Blocks the event stores or removes (none for `Cleared`).
    pub fn blocks(&self) -> usize {
        match self {
            KvEvent::Stored { block_hashes, .. } | KvEvent::Removed { block_hashes } => block_hashes.len(),
            KvEvent::Cleared => 0,
        }
    }
}
