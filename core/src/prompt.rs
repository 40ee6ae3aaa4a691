//! A request's prompt as selection needs it: hashed once, shared by all shards.

use std::sync::Arc;

use crate::hashing::{HashSeed, SequenceHash, shared_sequence_hashes};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    /// Sequence hashes of the prompt's full blocks.
    pub seq_hashes: Arc<[SequenceHash]>,
    pub isl_tokens: u32,
    /// False for a load-only prompt: `isl_tokens` is a guess.
    pub tokens_known: bool,
}

impl Prompt {
    pub fn from_tokens(tokens: &[u32], block_size: u32, seed: HashSeed) -> Self {
        Prompt {
            seq_hashes: shared_sequence_hashes(tokens, block_size, seed),
            isl_tokens: u32::try_from(tokens.len()).unwrap_or(u32::MAX),
            tokens_known: true,
        }
    }

    /// A prompt whose tokens are unknown (tokenizer down or body not
    /// tokenizable): routed by load alone.
    pub fn load_only(isl_tokens: u32) -> Self {
        Prompt { seq_hashes: Arc::from([]), isl_tokens, tokens_known: false }
    }

    /// Blocks the prompt fills that carry no sequence hash (a trailing
    /// partial block, or every block of a load-only prompt).
    pub fn unhashed_blocks(&self, block_size: u32) -> u32 {
        let blocks = self.isl_tokens.div_ceil(block_size.max(1));
        blocks.saturating_sub(self.seq_hashes.len() as u32)
    }
}
