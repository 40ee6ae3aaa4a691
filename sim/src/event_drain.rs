//! TensorRT-LLM's KV events as `trtllm-serve` hands them out: a bounded
//! buffer drained by `POST /kv_cache_events` (engines.md §5).
//!
//! Like TensorRT-LLM's `KVCacheEventManager`: every event gets the next id
//! (from 0; a restart counts from 0 again, after a `created` event); at
//! most `event_buffer_max_size` events wait, and when more come the
//! **oldest** are discarded (its `worker()` erases from the front); a drain
//! takes them all. Each answer is the JSON list `KVCacheEventSerializer`
//! makes, written as FastAPI's `JSONResponse` writes it (compact
//! separators), field order as the serializer's dicts: no `lora_id` (not
//! serialized, a TODO in TensorRT-LLM), `priority` 35 (its default
//! retention priority), `cache_level` 0 (device memory), and
//! `attention_dp_rank` only when the engine runs attention DP.
//!
//! Block hashes are the simulator's own (its `block_hash`), not
//! TensorRT-LLM's `BlockKeyHasher`: kvpick indexes blocks by their tokens
//! and only uses the engine's hashes as names, as it would TensorRT-LLM's.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::event_batch::CacheEvent;

/// `num_blocks_per_cache_level` of the `created` event: the device level
/// and an empty host level.
const CREATED_LEVELS: usize = 2;
/// TensorRT-LLM's default retention priority.
const PRIORITY: u32 = 35;

/// The engine's event buffer.
pub struct EventDrain {
    max_size: usize,
    /// `window_size` of every event: the model's attention window.
    window_size: u32,
    attention_dp_rank: Option<u32>,
    num_blocks: usize,
    state: Mutex<State>,
    drained: AtomicU64,
    discarded: AtomicU64,
}

struct State {
    next_id: u64,
    /// Serialized events, oldest first.
    events: VecDeque<String>,
}

impl EventDrain {
    /// A buffer holding `max_size` events, with the `created` event of a
    /// fresh KV cache of `num_blocks` blocks in it.
    pub fn new(max_size: usize, window_size: u32, attention_dp_rank: Option<u32>, num_blocks: usize) -> Self {
        let drain = EventDrain {
            max_size: max_size.max(1),
            window_size,
            attention_dp_rank,
            num_blocks,
            state: Mutex::new(State { next_id: 0, events: VecDeque::new() }),
            drained: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
        };
        drain.restart();
        drain
    }

    /// Buffers one engine step's events.
    pub fn push(&self, events: &[CacheEvent]) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for event in events {
            let data = match event {
                CacheEvent::Stored { hashes, parent, token_ids, block_size } => {
                    stored(hashes.iter().map(|h| h.published()), parent.map(|p| p.published()), token_ids, *block_size)
                }
                CacheEvent::Removed { hashes } => {
                    let list: Vec<String> = hashes.iter().map(|h| h.published().to_string()).collect();
                    format!(r#"{{"type":"removed","block_hashes":[{}]}}"#, list.join(","))
                }
                // TensorRT-LLM has no "everything gone" event short of a new
                // KV cache manager: `restart`.
                CacheEvent::Cleared => continue,
            };
            self.enqueue(&mut state, &data);
        }
    }

    /// A new KV cache manager: ids from 0, the buffer emptied, and its
    /// `created` event first.
    pub fn restart(&self) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.next_id = 0;
        state.events.clear();
        let mut levels = [0usize; CREATED_LEVELS];
        levels[0] = self.num_blocks;
        let levels: Vec<String> = levels.iter().map(usize::to_string).collect();
        let created = format!(r#"{{"type":"created","num_blocks_per_cache_level":[{}]}}"#, levels.join(","));
        self.enqueue(&mut state, &created);
    }

    /// Takes every buffered event: the body of one `/kv_cache_events`
    /// answer.
    pub fn drain(&self) -> String {
        let events = {
            let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            std::mem::take(&mut state.events)
        };
        self.drained.fetch_add(events.len() as u64, Ordering::Relaxed);
        let mut body = String::with_capacity(2 + events.iter().map(|e| e.len() + 1).sum::<usize>());
        body.push('[');
        for (i, event) in events.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(event);
        }
        body.push(']');
        body
    }

    /// Events handed out, and events discarded because the buffer was full.
    pub fn counts(&self) -> (u64, u64) {
        (self.drained.load(Ordering::Relaxed), self.discarded.load(Ordering::Relaxed))
    }

    fn enqueue(&self, state: &mut State, data: &str) {
        let id = state.next_id;
        state.next_id += 1;
        let mut event = format!(r#"{{"event_id":{id},"data":{data},"window_size":{}"#, self.window_size);
        if let Some(rank) = self.attention_dp_rank {
            let _ = write!(event, r#","attention_dp_rank":{rank}"#);
        }
        event.push('}');
        state.events.push_back(event);
        while state.events.len() > self.max_size {
            state.events.pop_front();
            self.discarded.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn stored(hashes: impl Iterator<Item = u64>, parent: Option<u64>, token_ids: &[u32], block_size: u32) -> String {
    let mut out = String::from(r#"{"type":"stored","parent_hash":"#);
    match parent {
        Some(p) => {
            let _ = write!(out, "{p}");
        }
        None => out.push_str("null"),
    }
    out.push_str(r#","blocks":["#);
    let size = block_size.max(1) as usize;
    for (i, (hash, tokens)) in hashes.zip(token_ids.chunks(size)).enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, r#"{{"type":"stored_block","block_hash":{hash},"tokens":["#);
        for (j, token) in tokens.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let _ = write!(out, r#"{{"type":"unique_token","token_id":{token},"token_extra_id":0}}"#);
        }
        let _ = write!(out, r#"],"cache_level":0,"priority":{PRIORITY}}}"#);
    }
    out.push_str("]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_hash::BlockDigest;

    #[test]
    fn answers_are_what_trtllm_serve_writes() {
        let drain = EventDrain::new(8, 4096, None, 100);
        drain.push(&[
            CacheEvent::Stored {
                hashes: vec![BlockDigest(7), BlockDigest(8)],
                parent: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
            },
            CacheEvent::Removed { hashes: vec![BlockDigest(7)] },
            CacheEvent::Cleared,
        ]);
        // What Python's json.dumps(separators=(",", ":")) makes of
        // KVCacheEventSerializer's dicts for the same events.
        let want = concat!(
            r#"[{"event_id":0,"data":{"type":"created","num_blocks_per_cache_level":[100,0]},"window_size":4096},"#,
            r#"{"event_id":1,"data":{"type":"stored","parent_hash":null,"blocks":["#,
            r#"{"type":"stored_block","block_hash":7,"tokens":[{"type":"unique_token","token_id":1,"token_extra_id":0},"#,
            r#"{"type":"unique_token","token_id":2,"token_extra_id":0}],"cache_level":0,"priority":35},"#,
            r#"{"type":"stored_block","block_hash":8,"tokens":[{"type":"unique_token","token_id":3,"token_extra_id":0},"#,
            r#"{"type":"unique_token","token_id":4,"token_extra_id":0}],"cache_level":0,"priority":35}]},"window_size":4096},"#,
            r#"{"event_id":2,"data":{"type":"removed","block_hashes":[7]},"window_size":4096}]"#
        );
        assert_eq!(drain.drain(), want);
        assert_eq!(drain.drain(), "[]");
        assert_eq!(drain.counts(), (3, 0));
    }

    #[test]
    fn a_full_buffer_discards_the_oldest_and_a_restart_counts_from_zero() {
        let drain = EventDrain::new(2, 64, Some(1), 10);
        let removed = |h| CacheEvent::Removed { hashes: vec![BlockDigest(h)] };
        drain.push(&[removed(1), removed(2), removed(3)]);
        let body = drain.drain();
        assert!(body.starts_with(r#"[{"event_id":2,"#) && body.contains(r#""event_id":3,"#), "{body}");
        assert!(body.contains(r#""window_size":64,"attention_dp_rank":1}"#), "{body}");
        assert_eq!(drain.counts(), (2, 2));
        drain.restart();
        assert!(drain.drain().starts_with(r#"[{"event_id":0,"data":{"type":"created""#));
    }
}
