//! KV-event batches as vLLM ≥ 0.26 publishes them (map events, positional
//! envelope), plus the older positional event form.

use super::msgpack::{Mp, s};

pub const BLOCK_SIZE: u32 = 4;

/// Tokens of block `k` of the test prompt (distinct for every `k`).
pub fn block_tokens(k: u64) -> Vec<u32> {
    (0..BLOCK_SIZE).map(|i| (k as u32) * BLOCK_SIZE + i + 1).collect()
}

/// Tokens of the test prompt's first `n` blocks.
pub fn prompt_tokens(n: u64) -> Vec<u32> {
    (0..n).flat_map(block_tokens).collect()
}

/// Engine hash of block `k` of the test prompt.
pub fn engine_hash(k: u64) -> u64 {
    0xdab8_9baa_7b58_0000 + k
}

fn uints(values: impl IntoIterator<Item = u64>) -> Mp {
    Mp::Array(values.into_iter().map(Mp::Uint).collect())
}

/// `BlockStored` of block `k` of the test prompt, chained to block `k - 1`.
pub fn stored_block(k: u64) -> Mp {
    stored_with(k, "GPU", "full_attention")
}

pub fn stored_with(k: u64, medium: &str, kind: &str) -> Mp {
    Mp::Map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", uints([engine_hash(k)])),
        ("parent_block_hash", if k == 0 { Mp::Nil } else { Mp::Uint(engine_hash(k - 1)) }),
        ("token_ids", uints(block_tokens(k).into_iter().map(u64::from))),
        ("block_size", Mp::Uint(BLOCK_SIZE.into())),
        ("lora_id", Mp::Nil),
        ("medium", s(medium)),
        ("lora_name", Mp::Nil),
        ("extra_keys", Mp::Array(vec![Mp::Nil])),
        ("group_idx", Mp::Uint(0)),
        ("kv_cache_spec_kind", s(kind)),
    ])
}

/// The same `BlockStored` in the positional form of vLLM ≤ 0.23.
pub fn stored_block_positional(k: u64) -> Mp {
    Mp::Array(vec![
        s("BlockStored"),
        uints([engine_hash(k)]),
        if k == 0 { Mp::Nil } else { Mp::Uint(engine_hash(k - 1)) },
        uints(block_tokens(k).into_iter().map(u64::from)),
        Mp::Uint(BLOCK_SIZE.into()),
        Mp::Nil,
        s("GPU"),
    ])
}

pub fn removed_blocks(ks: &[u64]) -> Mp {
    Mp::Map(vec![
        ("type", s("BlockRemoved")),
        ("block_hashes", uints(ks.iter().map(|&k| engine_hash(k)))),
        ("medium", s("GPU")),
    ])
}

pub fn cleared() -> Mp {
    Mp::Map(vec![("type", s("AllBlocksCleared"))])
}

/// `[ts, events, dp_rank]` with `ts` = now.
pub fn batch(events: Vec<Mp>) -> Vec<u8> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let mut out = Vec::new();
    Mp::Array(vec![Mp::Float(now), Mp::Array(events), Mp::Uint(0)]).encode(&mut out);
    out
}

/// The batch storing block `k` of the test prompt.
pub fn chain_batch(k: u64) -> Vec<u8> {
    batch(vec![stored_block(k)])
}
