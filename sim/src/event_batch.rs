//! KV events and their msgpack payload, byte for byte as vLLM's msgspec
//! writes them (engines.md §1.2–1.3).
//!
//! A batch is always the positional `[ts, events, data_parallel_rank]`.
//! Events are tagged maps ([`EventEncoding::Map`], vLLM ≥ #42892) or
//! positional arrays ([`EventEncoding::Array`], the release that appended
//! `lora_name`). Map events list their fields in the struct's declaration
//! order, as msgspec does, with `omit_defaults` applied: `event_version` is
//! left out, `group_idx` 0 and `extra_keys` (one nil per block) are not.

use super::block_hash::BlockDigest;
use super::config::{EventEncoding, HashFormat};
use super::msgpack::MsgpackWriter;

/// Storage tier of every simulated block.
const MEDIUM: &str = "GPU";
/// KV cache spec kind of every simulated block (one full-attention group).
const KIND: &str = "full_attention";

/// One KV event of the simulated engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheEvent {
    /// Full blocks newly cached, in chain order; block 0's parent is `parent`.
    Stored { hashes: Vec<BlockDigest>, parent: Option<BlockDigest>, token_ids: Vec<u32>, block_size: u32 },
    /// Blocks evicted.
    Removed { hashes: Vec<BlockDigest> },
    /// The whole cache is gone.
    Cleared,
}

/// Encodes batches for one engine.
#[derive(Clone, Copy, Debug)]
pub struct BatchEncoder {
    pub encoding: EventEncoding,
    pub hash_format: HashFormat,
    pub dp_rank: u32,
}

impl BatchEncoder {
    /// The payload frame of one batch.
    pub fn encode(&self, ts: f64, events: &[CacheEvent]) -> Vec<u8> {
        let mut w = MsgpackWriter::new();
        w.array(3);
        w.f64(ts);
        w.array(events.len());
        for event in events {
            match self.encoding {
                EventEncoding::Map => self.map_event(&mut w, event),
                EventEncoding::Array => self.array_event(&mut w, event),
            }
        }
        w.uint(u64::from(self.dp_rank));
        w.into_bytes()
    }

    fn map_event(&self, w: &mut MsgpackWriter, event: &CacheEvent) {
        match event {
            CacheEvent::Stored { hashes, parent, token_ids, block_size } => {
                w.map(11);
                w.str("type");
                w.str("BlockStored");
                w.str("block_hashes");
                self.hashes(w, hashes);
                w.str("parent_block_hash");
                self.opt_hash(w, *parent);
                w.str("token_ids");
                tokens(w, token_ids);
                w.str("block_size");
                w.uint(u64::from(*block_size));
                w.str("lora_id");
                w.nil();
                w.str("medium");
                w.str(MEDIUM);
                w.str("lora_name");
                w.nil();
                w.str("extra_keys");
                w.array(hashes.len());
                for _ in hashes {
                    w.nil();
                }
                w.str("group_idx");
                w.uint(0);
                w.str("kv_cache_spec_kind");
                w.str(KIND);
            }
            CacheEvent::Removed { hashes } => {
                w.map(4);
                w.str("type");
                w.str("BlockRemoved");
                w.str("block_hashes");
                self.hashes(w, hashes);
                w.str("medium");
                w.str(MEDIUM);
                w.str("group_idx");
                w.uint(0);
            }
            CacheEvent::Cleared => {
                w.map(1);
                w.str("type");
                w.str("AllBlocksCleared");
            }
        }
    }

    fn array_event(&self, w: &mut MsgpackWriter, event: &CacheEvent) {
        match event {
            CacheEvent::Stored { hashes, parent, token_ids, block_size } => {
                w.array(8);
                w.str("BlockStored");
                self.hashes(w, hashes);
                self.opt_hash(w, *parent);
                tokens(w, token_ids);
                w.uint(u64::from(*block_size));
                w.nil(); // lora_id
                w.str(MEDIUM);
                w.nil(); // lora_name
            }
            CacheEvent::Removed { hashes } => {
                w.array(3);
                w.str("BlockRemoved");
                self.hashes(w, hashes);
                w.str(MEDIUM);
            }
            CacheEvent::Cleared => {
                w.array(1);
                w.str("AllBlocksCleared");
            }
        }
    }

    fn hash(&self, w: &mut MsgpackWriter, digest: BlockDigest) {
        match self.hash_format {
            HashFormat::Int => w.uint(digest.published()),
            HashFormat::Bytes => w.bin(&digest.bytes()),
            // SGLang's `hash_str_to_int64`: the digest's 8 bytes as a
            // signed int64.
            HashFormat::SignedInt => w.int(digest.published() as i64),
        }
    }

    fn hashes(&self, w: &mut MsgpackWriter, hashes: &[BlockDigest]) {
        w.array(hashes.len());
        for h in hashes {
            self.hash(w, *h);
        }
    }

    fn opt_hash(&self, w: &mut MsgpackWriter, digest: Option<BlockDigest>) {
        match digest {
            Some(d) => self.hash(w, d),
            None => w.nil(),
        }
    }
}

fn tokens(w: &mut MsgpackWriter, token_ids: &[u32]) {
    w.array(token_ids.len());
    for t in token_ids {
        w.uint(u64::from(*t));
    }
}
