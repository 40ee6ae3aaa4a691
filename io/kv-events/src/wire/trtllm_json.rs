//! TensorRT-LLM's KV events as `trtllm-serve` answers `POST
//! /kv_cache_events`: a JSON list, drained (each call returns the events
//! produced since the previous one), each event as TensorRT-LLM's
//! `KVCacheEventSerializer` writes it:
//!
//! ```text
//! {"event_id": n, "data": {...}, "window_size": w, "attention_dp_rank": r?}
//! data = {"type": "created", "num_blocks_per_cache_level": [...]}
//!      | {"type": "stored", "parent_hash": h | null,
//!         "blocks": [{"type": "stored_block", "block_hash": h,
//!                     "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": e}],
//!                     "cache_level": l, "priority": p}]}
//!      | {"type": "removed", "block_hashes": [h, ...]}
//!      | {"type": "updated", "block_hash": h,
//!         "cache_level": {"type": "event_diff", "new_value": a, "old_value": b} | null,
//!         "priority": {...} | null}
//! ```
//!
//! What kvpick makes of them:
//! - `stored` → [`KvEvent::Stored`]: the block size is the first block's
//!   token count, every block must have the same; hashes are the engine's
//!   (a C++ `size_t`: an unsigned integer, a negative one reinterpreted
//!   bitwise); `cache_level` 0 is device memory ([`Medium::Gpu`]), others are
//!   [`Medium::Other`] (`"cache_level_N"`) and not indexed. A block with a
//!   non-zero `token_extra_id` (a multimodal or prompt-tuning token) cannot
//!   be matched by a text prompt's hash: the event is skipped from it on
//!   (its later blocks chain under it), counted in [`Drain::skipped`].
//! - `removed` → [`KvEvent::Removed`].
//! - `updated` whose `cache_level` moves a block off level 0 (offloaded to
//!   host memory) → [`KvEvent::Removed`] of that block: the device no longer
//!   holds it. Other updates (priority, back to level 0: the tokens are not
//!   sent again) are skipped.
//! - `created` (the KV cache manager started: an engine start or restart) →
//!   [`KvEvent::Cleared`].
//!
//! LoRA adapters are not serialized by TensorRT-LLM (a TODO in its
//! serializer), so the seed is the default one. `window_size` and
//! `attention_dp_rank` are passed on: with variable sliding-window
//! attention the engine sends each window's events, and only the largest
//! window holds whole prefixes (the caller keeps those); each attention-DP
//! rank is its own worker.
//!
//! A body that is not a JSON list fails whole; an event that does not
//! match the shape is dropped alone and described in [`Drain::malformed`].
//! Never panics; sizes are bounded by the body (the caller caps it) and by
//! the limits of this module's parent.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, Visitor};
use serde_json::value::RawValue;

use super::{DecodedEvent, MAX_BLOCKS_PER_EVENT, MAX_EVENTS_PER_BATCH, MAX_TOKENS_PER_EVENT, Medium};
use kvpick_core::event::{EngineBlockHash, KvEvent};
use kvpick_core::hashing::HashSeed;

/// One drained event with TensorRT-LLM's envelope fields.
#[derive(Clone, Debug, PartialEq)]
pub struct DrainedEvent {
    pub event_id: u64,
    /// The attention window the event is about (`window_size`).
    pub window_size: Option<u64>,
    /// The attention data-parallel rank that produced it, when sent.
    pub attention_dp_rank: Option<u32>,
    pub decoded: DecodedEvent,
}

/// One `/kv_cache_events` answer, decoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Drain {
    /// The events understood, in answer order.
    pub events: Vec<DrainedEvent>,
    /// Events (or the tail of a stored event) not indexed by rule.
    pub skipped: u32,
    /// Events dropped for bad content: `event_id` when readable, and why.
    pub malformed: Vec<(Option<u64>, String)>,
    /// Every event id seen, with its rank, malformed and skipped events
    /// included, in order: what a caller checks for gaps (lost events).
    pub event_ids: Vec<EventMark>,
}

/// An event's id and the attention-DP rank that numbered it: each rank's
/// KV cache manager counts its own events from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventMark {
    pub rank: Option<u32>,
    pub id: u64,
}

/// The body is not a JSON list of events.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("TensorRT-LLM KV events: {0}")]
pub struct DrainError(pub String);

/// Decodes one `/kv_cache_events` answer.
///
/// Typed: every token of a stored block is a JSON object (~55 bytes for 4
/// bytes of information), and building a `serde_json::Value` tree of them
/// cost 10 to 50 times the time of decoding the same events from vLLM's
/// msgpack. An answer whose every event has the expected shape (always,
/// from a real engine) is decoded in one pass; otherwise the list is split
/// into each event's raw text (borrowed, no copy) and each event decoded
/// alone, so one that does not match is dropped alone.
pub fn decode_drain(body: &[u8]) -> Result<Drain, DrainError> {
    let mut drain = Drain::default();
    if let Ok(list) = serde_json::from_slice::<Bounded<Envelope<Data<'_>>, MAX_EVENTS_PER_BATCH>>(body) {
        for envelope in list.0 {
            let data = envelope.data.ok_or_else(|| "no data".to_owned());
            add(&mut drain, envelope.event_id, envelope.window_size, envelope.attention_dp_rank, data);
        }
        return Ok(drain);
    }
    let list: Bounded<&RawValue, MAX_EVENTS_PER_BATCH> =
        serde_json::from_slice(body).map_err(|e| DrainError(format!("not a JSON list of events: {e}")))?;
    for raw in list.0 {
        let envelope = match serde_json::from_str::<Envelope<&RawValue>>(raw.get()) {
            Ok(envelope) => envelope,
            Err(e) => {
                drain.malformed.push((None, format!("not an event: {e}")));
                continue;
            }
        };
        let data = envelope
            .data
            .ok_or_else(|| "no data".to_owned())
            .and_then(|raw| serde_json::from_str::<Data<'_>>(raw.get()).map_err(|e| format!("bad data: {e}")));
        add(&mut drain, envelope.event_id, envelope.window_size, envelope.attention_dp_rank, data);
    }
    Ok(drain)
}

/// Adds one event (its envelope fields and its data, or why the data is
/// unusable) to `drain`.
fn add(
    drain: &mut Drain,
    event_id: Option<Lenient>,
    window_size: Option<Lenient>,
    attention_dp_rank: Option<Lenient>,
    data: Result<Data<'_>, String>,
) {
    let id = event_id.and_then(|n| n.0);
    let attention_dp_rank = attention_dp_rank.and_then(|n| n.0).and_then(|r| u32::try_from(r).ok());
    if let Some(id) = id {
        drain.event_ids.push(EventMark { rank: attention_dp_rank, id });
    }
    match data.and_then(decode_event) {
        Ok(Decoded::Events(events, skipped)) => {
            drain.skipped += skipped;
            let Some(event_id) = id else {
                drain.malformed.push((None, "no event_id".into()));
                return;
            };
            let window_size = window_size.and_then(|n| n.0);
            drain.events.extend(events.into_iter().map(|decoded| DrainedEvent {
                event_id,
                window_size,
                attention_dp_rank,
                decoded,
            }));
        }
        Ok(Decoded::Skipped) => drain.skipped += 1,
        Err(why) => drain.malformed.push((id, why)),
    }
}

/// `{"event_id", "data", "window_size", "attention_dp_rank"?}`; other keys
/// ignored. `D` is the data decoded ([`Data`]) or left raw. A field of the
/// wrong type reads as absent (as a missing id does), so the event is
/// reported with what could be read.
#[derive(Deserialize)]
struct Envelope<D> {
    #[serde(default)]
    event_id: Option<Lenient>,
    #[serde(default = "none")]
    data: Option<D>,
    #[serde(default)]
    window_size: Option<Lenient>,
    #[serde(default)]
    attention_dp_rank: Option<Lenient>,
}

fn none<D>() -> Option<D> {
    None
}

/// A non-negative integer, or `None` for any other JSON value.
struct Lenient(Option<u64>);

impl<'de> Deserialize<'de> for Lenient {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Lenient;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Lenient, E> {
                Ok(Lenient(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Lenient, E> {
                Ok(Lenient(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Lenient, E> {
                Ok(Lenient(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Lenient, E> {
                Ok(Lenient(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Lenient, E> {
                Ok(Lenient(None))
            }
            fn visit_unit<E>(self) -> Result<Lenient, E> {
                Ok(Lenient(None))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Lenient, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Lenient, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// Every field any event type has; which ones count depends on `type`.
/// One struct rather than a tagged enum: serde's internally tagged enums
/// buffer the whole event before choosing.
#[derive(Deserialize)]
struct Data<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    parent_hash: Option<Hash>,
    #[serde(default)]
    blocks: Option<Bounded<Block, MAX_BLOCKS_PER_EVENT>>,
    #[serde(default)]
    block_hashes: Option<Bounded<Hash, MAX_BLOCKS_PER_EVENT>>,
    #[serde(default)]
    block_hash: Option<Hash>,
    #[serde(default)]
    cache_level: Option<Diff>,
}

/// `{"block_hash", "tokens", "cache_level"}` of a stored block; `type`,
/// `priority` and `mm_keys` are not needed.
#[derive(Deserialize)]
struct Block {
    block_hash: Hash,
    tokens: Bounded<Token, MAX_TOKENS_PER_EVENT>,
    #[serde(default)]
    cache_level: Option<u64>,
}

#[derive(Deserialize)]
struct Token {
    token_id: i64,
    #[serde(default)]
    token_extra_id: Option<u64>,
}

/// An `event_diff` (`{"new_value", "old_value"}`); only cache levels matter.
#[derive(Deserialize)]
struct Diff {
    #[serde(default)]
    new_value: Option<u64>,
    #[serde(default)]
    old_value: Option<u64>,
}

/// A block hash: an integer, unsigned or (reinterpreted) signed 64-bit.
struct Hash(EngineBlockHash);

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Hash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a block hash (a 64-bit integer)")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Hash, E> {
                Ok(Hash(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Hash, E> {
                Ok(Hash(v as u64))
            }
        }
        d.deserialize_any(V)
    }
}

/// A list of at most `N` elements, refused as soon as it is longer (a
/// hostile body cannot make it allocate past the limit).
struct Bounded<T, const N: usize>(Vec<T>);

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const N: usize>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for V<T, N> {
            type Value = Bounded<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {N} elements")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Bounded<T, N>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(element) = seq.next_element()? {
                    if out.len() == N {
                        return Err(de::Error::custom(format!("more than {N} elements")));
                    }
                    out.push(element);
                }
                Ok(Bounded(out))
            }
        }
        d.deserialize_seq(V::<T, N>(std::marker::PhantomData))
    }
}

enum Decoded {
    /// What the event means (a stored event may stop early: the count of
    /// blocks left out rides along).
    Events(Vec<DecodedEvent>, u32),
    Skipped,
}

fn event(event: KvEvent, medium: Option<Medium>) -> DecodedEvent {
    DecodedEvent {
        event,
        medium,
        lora_name: None,
        lora_id: None,
        cache_salt: None,
        group_idx: None,
        kv_cache_spec_kind: None,
    }
}

fn decode_event(data: Data<'_>) -> Result<Decoded, String> {
    match data.kind.as_deref().ok_or("data has no type")? {
        "created" => Ok(Decoded::Events(vec![event(KvEvent::Cleared, None)], 0)),
        "stored" => stored(data),
        "removed" => {
            let hashes = data.block_hashes.ok_or("removed without block_hashes")?;
            let block_hashes = hashes.0.into_iter().map(|h| h.0).collect();
            Ok(Decoded::Events(vec![event(KvEvent::Removed { block_hashes }, Some(Medium::Gpu))], 0))
        }
        "updated" => {
            let block = data.block_hash.ok_or("updated without an integer block_hash")?.0;
            match data.cache_level.map(|d| (d.old_value, d.new_value)) {
                Some((Some(0), Some(new))) if new != 0 => Ok(Decoded::Events(
                    vec![event(KvEvent::Removed { block_hashes: vec![block] }, Some(Medium::Gpu))],
                    0,
                )),
                _ => Ok(Decoded::Skipped),
            }
        }
        _ => Ok(Decoded::Skipped),
    }
}

fn stored(data: Data<'_>) -> Result<Decoded, String> {
    let parent = data.parent_hash.map(|h| h.0);
    let blocks = data.blocks.ok_or("stored without blocks")?.0;
    if blocks.is_empty() {
        return Ok(Decoded::Skipped);
    }
    let mut block_hashes = Vec::with_capacity(blocks.len());
    let mut token_ids = Vec::with_capacity(blocks.len() * blocks[0].tokens.0.len());
    let mut block_size = None;
    let mut level = None;
    let mut left_out = 0u32;
    for (i, block) in blocks.iter().enumerate() {
        let tokens = &block.tokens.0;
        if tokens.is_empty() {
            return Err("a stored block without tokens".into());
        }
        let size = u32::try_from(tokens.len()).map_err(|_| "too many tokens in a block")?;
        if *block_size.get_or_insert(size) != size {
            return Err(format!("blocks of {} and {size} tokens in one event", block_size.unwrap_or(size)));
        }
        let cache_level = block.cache_level.unwrap_or(0);
        if *level.get_or_insert(cache_level) != cache_level {
            return Err("blocks of several cache levels in one event".into());
        }
        if token_ids.len() + tokens.len() > MAX_TOKENS_PER_EVENT {
            return Err(format!("more than {MAX_TOKENS_PER_EVENT} tokens in one event"));
        }
        let start = token_ids.len();
        let mut extra = false;
        for token in tokens {
            let id = u32::try_from(token.token_id)
                .map_err(|_| format!("token_id {} is not a u32 token id", token.token_id))?;
            token_ids.push(id);
            extra |= token.token_extra_id.is_some_and(|e| e != 0);
        }
        if extra {
            // Not matchable by a text prompt; neither is anything after it.
            token_ids.truncate(start);
            left_out = u32::try_from(blocks.len() - i).unwrap_or(u32::MAX);
            break;
        }
        block_hashes.push(block.block_hash.0);
    }
    if block_hashes.is_empty() {
        return Ok(Decoded::Events(Vec::new(), left_out));
    }
    let medium = match level.unwrap_or(0) {
        0 => Medium::Gpu,
        n => Medium::Other(format!("cache_level_{n}")),
    };
    let block_size = block_size.unwrap_or(1);
    let stored = KvEvent::Stored { block_hashes, parent, token_ids, block_size, seed: HashSeed::default() };
    Ok(Decoded::Events(vec![event(stored, Some(medium))], left_out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `trtllm-serve` answers, as its serializer writes it (Python's
    /// `json` with FastAPI's separators).
    const ANSWER: &str = r#"[
      {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [2048, 0]}, "window_size": 4096},
      {"event_id": 1, "data": {"type": "stored", "parent_hash": null, "blocks": [
          {"type": "stored_block", "block_hash": 11, "tokens": [
              {"type": "unique_token", "token_id": 1, "token_extra_id": 0},
              {"type": "unique_token", "token_id": 2, "token_extra_id": 0}], "cache_level": 0, "priority": 35},
          {"type": "stored_block", "block_hash": 18446744073709551615, "tokens": [
              {"type": "unique_token", "token_id": 3, "token_extra_id": 0},
              {"type": "unique_token", "token_id": 4, "token_extra_id": 0}], "cache_level": 0, "priority": 35}]},
       "window_size": 4096, "attention_dp_rank": 1},
      {"event_id": 2, "data": {"type": "stored", "parent_hash": -1, "blocks": [
          {"type": "stored_block", "block_hash": 12, "tokens": [
              {"type": "unique_token", "token_id": 5, "token_extra_id": 0},
              {"type": "unique_token", "token_id": 6, "token_extra_id": 0}], "cache_level": 0, "priority": 35},
          {"type": "stored_block", "block_hash": 13, "tokens": [
              {"type": "unique_token", "token_id": 7, "token_extra_id": 9},
              {"type": "unique_token", "token_id": 8, "token_extra_id": 0}], "cache_level": 0, "priority": 35}]},
       "window_size": 4096},
      {"event_id": 3, "data": {"type": "updated", "block_hash": 12,
          "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0}, "priority": null}, "window_size": 4096},
      {"event_id": 4, "data": {"type": "updated", "block_hash": 12, "cache_level": null,
          "priority": {"type": "event_diff", "new_value": 50, "old_value": 35}}, "window_size": 4096},
      {"event_id": 5, "data": {"type": "removed", "block_hashes": [11, 18446744073709551615]}, "window_size": 4096},
      {"event_id": 6, "data": {"type": "stored", "parent_hash": null, "blocks": [
          {"type": "stored_block", "block_hash": 14, "tokens": [{"type": "unique_token", "token_id": -1, "token_extra_id": 0}],
           "cache_level": 0, "priority": 35}]}, "window_size": 4096},
      {"event_id": 7, "data": {"type": "mystery"}, "window_size": 4096}
    ]"#;

    #[test]
    fn an_answer_decodes_as_documented() {
        let drain = decode_drain(ANSWER.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let ids: Vec<u64> = drain.event_ids.iter().map(|m| m.id).collect();
        assert_eq!(ids, (0..8).collect::<Vec<u64>>());
        assert_eq!(drain.event_ids[1], EventMark { rank: Some(1), id: 1 });
        assert_eq!(drain.event_ids[2], EventMark { rank: None, id: 2 });
        let kinds: Vec<(u64, &KvEvent)> = drain.events.iter().map(|e| (e.event_id, &e.decoded.event)).collect();
        assert_eq!(kinds.len(), 5, "{kinds:?}");
        assert_eq!(kinds[0], (0, &KvEvent::Cleared));
        assert_eq!(
            kinds[1],
            (
                1,
                &KvEvent::Stored {
                    block_hashes: vec![11, u64::MAX],
                    parent: None,
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                    seed: HashSeed::default()
                }
            )
        );
        assert_eq!(drain.events[1].attention_dp_rank, Some(1));
        assert_eq!(drain.events[1].window_size, Some(4096));
        assert!(drain.events[1].decoded.on_device());
        // The multimodal block and what follows are left out.
        assert_eq!(
            kinds[2],
            (
                2,
                &KvEvent::Stored {
                    block_hashes: vec![12],
                    parent: Some(u64::MAX),
                    token_ids: vec![5, 6],
                    block_size: 2,
                    seed: HashSeed::default()
                }
            )
        );
        // Offloaded to host memory: gone from the device.
        assert_eq!(kinds[3], (3, &KvEvent::Removed { block_hashes: vec![12] }));
        assert_eq!(kinds[4], (5, &KvEvent::Removed { block_hashes: vec![11, u64::MAX] }));
        // The priority update, the unknown type and the multimodal tail.
        assert_eq!(drain.skipped, 3);
        assert_eq!(drain.malformed.len(), 1);
        assert_eq!(drain.malformed[0].0, Some(6));
        assert!(drain.malformed[0].1.contains("token_id"), "{:?}", drain.malformed);
    }

    #[test]
    fn one_odd_event_costs_the_fast_path_not_the_answer() {
        let fast = decode_drain(ANSWER.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        // A last event whose data has a field of the wrong type: the
        // one-pass decode fails, the per-event one keeps the rest.
        let odd = ANSWER.trim_end().trim_end_matches(']').to_owned()
            + r#", {"event_id": 8, "data": {"type": "removed", "block_hashes": "all"}}]"#;
        let slow = decode_drain(odd.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(slow.events, fast.events);
        assert_eq!(slow.skipped, fast.skipped);
        assert_eq!(&slow.event_ids[..8], &fast.event_ids[..]);
        assert_eq!(slow.malformed.len(), fast.malformed.len() + 1);
        assert_eq!(slow.malformed.last().map(|m| m.0), Some(Some(8)));
    }

    #[test]
    fn bad_shapes_are_reported_not_fatal() {
        assert!(decode_drain(b"{}").is_err());
        assert!(decode_drain(b"[").is_err());
        assert_eq!(decode_drain(b"[]").map(|d| d.events.len()), Ok(0));
        let uneven = r#"[{"event_id": 1, "data": {"type": "stored", "parent_hash": null, "blocks": [
            {"block_hash": 1, "tokens": [{"token_id": 1}], "cache_level": 0},
            {"block_hash": 2, "tokens": [{"token_id": 1}, {"token_id": 2}], "cache_level": 0}]}},
            {"event_id": 2, "data": {"type": "removed", "block_hashes": ["x"]}},
            {"event_id": 3, "data": {"type": "stored", "parent_hash": "p", "blocks": []}},
            {"data": {"type": "removed", "block_hashes": [1]}},
            {"event_id": 4},
            7]"#;
        let drain = decode_drain(uneven.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert!(drain.events.is_empty(), "{:?}", drain.events);
        let ids: Vec<Option<u64>> = drain.malformed.iter().map(|m| m.0).collect();
        assert_eq!(ids, [Some(1), Some(2), Some(3), None, Some(4), None]);
        // A higher cache level is decoded as not on the device.
        let host = r#"[{"event_id": 9, "data": {"type": "stored", "parent_hash": null, "blocks": [
            {"block_hash": 1, "tokens": [{"token_id": 1}], "cache_level": 1}]}}]"#;
        let drain = decode_drain(host.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert!(!drain.events[0].decoded.on_device());
    }
}
