//! The engine's KV cache: a fixed number of blocks, a prefix cache of full
//! prompt blocks keyed by their chained digest, and LRU eviction of the
//! cached blocks no running request references.
//!
//! Accounting: `used = cached blocks + anonymous blocks ≤ capacity`.
//! Anonymous blocks belong to one request and are not (yet) in the prefix
//! cache: prompt blocks not computed yet, the trailing partial block and
//! the completion's blocks. A request reserves all its blocks when it is
//! admitted (no preemption is modelled); as its prefill computes full
//! blocks they turn into cached blocks it references ([`PrefixCache::store`]).
//! A cached block is **pinned** while some request references it, and goes
//! to the LRU list when the last reference is released; eviction takes the
//! least recently released block. A request releases its blocks tail first,
//! so a prompt's last blocks are evicted before its first ones, as in vLLM.
//!
//! Every change the router must learn is queued as a [`CacheEvent`]:
//! `Stored` when blocks become cached (consecutive blocks of one request in
//! one event), `Removed` when blocks are evicted (one event per
//! reservation), `Cleared` on an announced [`PrefixCache::clear`].

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::block_hash::BlockDigest;
use super::event_batch::CacheEvent;

#[derive(Debug)]
struct CachedBlock {
    parent: Option<BlockDigest>,
    tokens: Box<[u32]>,
    refs: u32,
    /// Position in the LRU list while `refs == 0`.
    lru_stamp: Option<u64>,
}

/// The KV block pool and its prefix cache.
#[derive(Debug)]
pub struct PrefixCache {
    block_size: u32,
    capacity: usize,
    blocks: HashMap<BlockDigest, CachedBlock>,
    /// Unreferenced cached blocks, least recently released first.
    lru: BTreeMap<u64, BlockDigest>,
    anonymous: usize,
    next_stamp: u64,
    events: Vec<CacheEvent>,
}

/// A cached block, as [`PrefixCache::snapshot`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedBlockInfo {
    /// The hash the engine publishes for it.
    pub hash: u64,
    pub digest: BlockDigest,
    /// Published hash of its parent block (`None`: a prompt's first block).
    pub parent: Option<u64>,
    pub token_ids: Vec<u32>,
    /// Running requests referencing it (0: evictable).
    pub refs: u32,
}

/// The cache's state at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheSnapshot {
    pub capacity: usize,
    pub block_size: u32,
    /// Cached + anonymous blocks.
    pub used: usize,
    /// Cached blocks no request references.
    pub evictable: usize,
    /// Every cached block, by published hash.
    pub blocks: Vec<CachedBlockInfo>,
}

impl CacheSnapshot {
    /// Whether a block with this published hash is cached.
    pub fn contains(&self, hash: u64) -> bool {
        self.blocks.binary_search_by_key(&hash, |b| b.hash).is_ok()
    }

    /// vLLM's `kv_cache_usage_perc`: the share of blocks not free, cached
    /// but unreferenced blocks counting as free.
    pub fn usage(&self) -> f64 {
        (self.used - self.evictable) as f64 / self.capacity as f64
    }
}

impl PrefixCache {
    /// An empty cache of `capacity` blocks of `block_size` tokens.
    pub fn new(capacity: usize, block_size: u32) -> Self {
        PrefixCache {
            block_size,
            capacity,
            blocks: HashMap::new(),
            lru: BTreeMap::new(),
            anonymous: 0,
            next_stamp: 0,
            events: Vec::new(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Blocks taken: cached (pinned or not) and anonymous.
    pub fn used(&self) -> usize {
        self.blocks.len() + self.anonymous
    }

    /// Cached blocks no request references.
    pub fn evictable(&self) -> usize {
        self.lru.len()
    }

    /// Number of cached blocks.
    pub fn cached(&self) -> usize {
        self.blocks.len()
    }

    /// See [`CacheSnapshot::usage`].
    pub fn usage(&self) -> f64 {
        (self.used() - self.evictable()) as f64 / self.capacity as f64
    }

    /// How many leading blocks of `chain` are cached.
    pub fn match_len(&self, chain: &[BlockDigest]) -> usize {
        chain.iter().take_while(|d| self.blocks.contains_key(d)).count()
    }

    /// Admits a request: pins the cached blocks `hits` (leading blocks of its
    /// chain, all cached) and reserves `new_blocks` anonymous blocks,
    /// evicting unreferenced blocks as needed. Without room, changes nothing
    /// and returns `false`.
    pub fn reserve(&mut self, hits: &[BlockDigest], new_blocks: usize) -> bool {
        let revived = hits.iter().filter(|d| self.blocks.get(d).is_some_and(|b| b.refs == 0)).count();
        let free = self.capacity - self.used();
        if free + (self.lru.len() - revived) < new_blocks {
            return false;
        }
        for digest in hits {
            self.pin(*digest);
        }
        let mut evicted = Vec::new();
        while self.capacity - self.used() < new_blocks {
            let Some((_, digest)) = self.lru.pop_first() else { break };
            self.blocks.remove(&digest);
            evicted.push(digest);
        }
        if !evicted.is_empty() {
            self.events.push(CacheEvent::Removed { hashes: evicted });
        }
        self.anonymous += new_blocks;
        true
    }

    /// Caches blocks `range` of a request's `chain` (`tokens` is its whole
    /// prompt), now computed: each turns one of the request's anonymous
    /// blocks into a reference to the cached block. A block someone else
    /// cached meanwhile is referenced and the anonymous block freed. The
    /// request must already reference every block before `range.start`.
    pub fn store(&mut self, chain: &[BlockDigest], tokens: &[u32], range: Range<usize>) {
        let bs = self.block_size as usize;
        let mut run: Option<CacheEvent> = None;
        for i in range {
            let digest = chain[i];
            self.anonymous = self.anonymous.saturating_sub(1);
            if self.blocks.contains_key(&digest) {
                self.pin(digest);
                self.events.extend(run.take());
                continue;
            }
            let parent = i.checked_sub(1).map(|p| chain[p]);
            let block_tokens = &tokens[i * bs..(i + 1) * bs];
            self.blocks.insert(digest, CachedBlock { parent, tokens: block_tokens.into(), refs: 1, lru_stamp: None });
            match &mut run {
                Some(CacheEvent::Stored { hashes, token_ids, .. }) => {
                    hashes.push(digest);
                    token_ids.extend_from_slice(block_tokens);
                }
                _ => {
                    run = Some(CacheEvent::Stored {
                        hashes: vec![digest],
                        parent,
                        token_ids: block_tokens.to_vec(),
                        block_size: self.block_size,
                    })
                }
            }
        }
        self.events.extend(run);
    }

    /// Releases a finished or aborted request's blocks: its references
    /// (`held`, in chain order; released tail first) and its `anonymous`
    /// blocks. Unknown digests (the cache was cleared) are skipped.
    pub fn release(&mut self, held: &[BlockDigest], anonymous: usize) {
        for digest in held.iter().rev() {
            let Some(block) = self.blocks.get_mut(digest) else { continue };
            block.refs = block.refs.saturating_sub(1);
            if block.refs == 0 && block.lru_stamp.is_none() {
                let stamp = self.next_stamp;
                self.next_stamp += 1;
                block.lru_stamp = Some(stamp);
                self.lru.insert(stamp, *digest);
            }
        }
        self.anonymous = self.anonymous.saturating_sub(anonymous);
    }

    /// Empties the cache (engine restart, cache reset). Requests holding
    /// blocks must be dropped by the caller. Queues `Cleared` if `announce`.
    pub fn clear(&mut self, announce: bool) {
        self.blocks.clear();
        self.lru.clear();
        self.anonymous = 0;
        self.events.clear();
        if announce {
            self.events.push(CacheEvent::Cleared);
        }
    }

    /// The events queued since the last call, in order.
    pub fn drain_events(&mut self) -> Vec<CacheEvent> {
        std::mem::take(&mut self.events)
    }

    pub fn snapshot(&self) -> CacheSnapshot {
        let mut blocks: Vec<CachedBlockInfo> = self
            .blocks
            .iter()
            .map(|(digest, b)| CachedBlockInfo {
                hash: digest.published(),
                digest: *digest,
                parent: b.parent.map(BlockDigest::published),
                token_ids: b.tokens.to_vec(),
                refs: b.refs,
            })
            .collect();
        blocks.sort_by_key(|b| b.hash);
        CacheSnapshot {
            capacity: self.capacity,
            block_size: self.block_size,
            used: self.used(),
            evictable: self.evictable(),
            blocks,
        }
    }

    fn pin(&mut self, digest: BlockDigest) {
        if let Some(block) = self.blocks.get_mut(&digest) {
            block.refs += 1;
            if let Some(stamp) = block.lru_stamp.take() {
                self.lru.remove(&stamp);
            }
        }
    }
}
