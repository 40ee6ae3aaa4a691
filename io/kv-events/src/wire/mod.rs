//! Decoder of the engines' KV-event payloads (msgpack), into [`KvEvent`]s.
//!
//! vLLM, SGLang and TensorRT-LLM publish KV events over ZMQ as three frames:
//! topic, 8-byte big-endian sequence number, msgpack payload. This module
//! decodes the payload frame only: [`decode_batch`] takes its bytes and
//! returns a [`DecodedBatch`]. It is pure (no I/O), never panics, and bounds
//! every allocation by the input size and the fixed limits below, so it can be
//! fed hostile bytes (and fuzzed) as is.
//!
//! # Accepted forms
//!
//! - **Batch**: an array `[ts, events]` or `[ts, events, dp_rank]` (`dp_rank`
//!   may be nil; more trailing elements are ignored), or a map with keys
//!   `ts`, `events`, `data_parallel_rank` (unknown keys ignored). `ts` may be a
//!   float or an integer.
//! - **Event**: a positional array whose first element is the type name
//!   (`msgspec` `array_like` + `tag`: vLLM before #42892, SGLang before
//!   #37482), decoded by position and of any length (missing trailing fields
//!   are absent, extra ones ignored), or a map with key `"type"` (newer vLLM,
//!   SGLang, TensorRT-LLM's native publisher), keys in any order, unknown keys
//!   ignored. Positions of `BlockStored`: 1 `block_hashes`, 2
//!   `parent_block_hash`, 3 `token_ids`, 4 `block_size`, 5 `lora_id`, 6
//!   `medium`, 7 `lora_name` (or SGLang #30827's `{"cache_salt": …}` map), 8
//!   `extra_keys`, 9 `group_idx`, 10 `kv_cache_spec_kind`. `BlockRemoved`: 1
//!   `block_hashes`, 2 `medium`, 3 `group_idx`, 4 `kv_cache_spec_kind`.
//!   `AllBlocksCleared`: no fields.
//! - **Block hash**: a msgpack integer, unsigned or signed 64-bit (a negative
//!   value is reinterpreted bitwise: SGLang publishes signed int64), or a
//!   binary of 1 to 64 bytes, mapped to `u64` as vLLM itself maps its digest
//!   when it publishes ints (`int.from_bytes(digest, "big") & (2**64 - 1)`,
//!   i.e. the **last 8 bytes, big-endian**; shorter binaries are
//!   zero-extended). A vLLM started with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`
//!   (32-byte SHA-256 digests, or 16 bytes with the xxhash option) therefore
//!   yields the very `u64` it would have published by default, so a fleet
//!   mixing both settings stays consistent. (Dynamo's decoder accepts only
//!   integers; it has no byte mapping to agree with.) Empty or longer binaries
//!   are an error for the event.
//! - **Token ids**: non-negative integers up to `u32::MAX`; an `[a, b]` pair
//!   (SGLang EAGLE bigram) counts as token `a`. String tokens (allowed by
//!   TensorRT-LLM's schema) cannot be hashed: an error for the event.
//!
//! # Cache salt and LoRA
//!
//! [`DecodedEvent::cache_salt`] comes from, in order of precedence: a
//! `cache_salt` map key (SGLang ≥ #37482); SGLang #30827's map in position 7;
//! vLLM's `extra_keys`. vLLM appends the request's `cache_salt` to the extra
//! keys of the request's **first block only** (after the LoRA name and
//! multimodal keys, before the prompt-embeds digest), so it is looked for only
//! when the event starts a prompt (`parent_block_hash` nil), in the first
//! block's entry: a typed entry `{"type": "cache_salt", "salt": s}` or
//! `["cache_salt", s]` (RFC vllm#55487 schema) wins; otherwise, skipping a
//! leading string equal to `lora_name`, the **last bare string** is taken as
//! the salt (multimodal keys are `[id, offset]` pairs since vLLM 0.19 and the
//! prompt-embeds digest is binary). Before 0.19 multimodal ids were bare
//! strings, so a multimodal first block without salt gets its last image id
//! as "salt": its blocks then never match a text-only hash, which is what we
//! want anyway (kvpick hashes tokens only and cannot tell images apart).
//! Events that continue a chain carry no salt on the wire: `None` there means
//! "not reported", not "unsalted"; the index should chain them under their
//! parent. [`KvEvent::Stored`]'s seed is `HashSeed::new(lora_name, cache_salt)`,
//! empty strings counting as absent.
//!
//! # KV cache groups
//!
//! Hybrid models (sliding window, Mamba, …) publish one event stream per KV
//! cache group; only full-attention groups can be indexed by prefix (a
//! sliding-window group's `token_ids` may even span more than its blocks).
//! The rule, from the event alone ([`DecodedEvent::full_attention`]): a
//! `kv_cache_spec_kind` of `full_attention`, `mla_attention` or
//! `sink_full_attention` is indexed, any other kind (unknown strings
//! included) is not; without a kind, group 0 or no group (older engines,
//! SGLang, TensorRT-LLM) is indexed and a group > 0 is undecided. vLLM sends
//! the kind on `BlockStored` but usually not on `BlockRemoved`, so callers keep
//! a [`GroupKinds`] per publisher, which learns each group's kind from the
//! events that carry one and judges the others (undecided: skip).
//!
//! # Errors
//!
//! A malformed envelope (not an array/map, missing `ts`/`events`, a bad
//! `dp_rank`, truncated or invalid msgpack anywhere, trailing bytes) fails the
//! whole batch with a [`WireError`]. An event whose msgpack is well formed but
//! whose content is wrong (wrong field type, missing required field, value out
//! of range, over a limit, token count not matching its blocks) is dropped
//! alone and reported in [`DecodedBatch::malformed`]; the rest of the batch is
//! decoded. An event of unknown type is skipped and counted in
//! [`DecodedBatch::skipped_unknown`]. Every error carries a byte offset.
//!
//! # Why no msgpack crate
//!
//! The reader (`reader.rs`, ~300 lines) is written for this decoder:
//! zero-copy strings, every error with a byte offset, container lengths
//! checked against the bytes left, and a non-recursive skip. `rmp`'s
//! low-level API reads through its `RmpRead` trait and reports no offsets, so
//! wrapping it to get offsets and those checks would take about as much code;
//! serde-based decoding (`rmp-serde`) allocates per value and cannot report
//! which event of a batch failed while keeping the others.

mod decode;
pub mod event_ids;
pub mod frames;
mod groups;
mod reader;
pub mod sequencer;
pub mod trtllm_json;

#[cfg(test)]
mod tests;

pub use groups::GroupKinds;
use kvpick_core::event::{EngineBlockHash, KvEvent};
use reader::{Reader, Token};

/// Most events in one batch (SGLang with `page_size` 1 sends one event per
/// token page, so long prompts make long batches).
pub const MAX_EVENTS_PER_BATCH: usize = 1 << 20;
/// Most block hashes in one event.
pub const MAX_BLOCKS_PER_EVENT: usize = 1 << 20;
/// Most token ids in one event.
pub const MAX_TOKENS_PER_EVENT: usize = 1 << 22;
/// Longest LoRA name, cache salt, medium or cache-spec kind, in bytes.
pub const MAX_NAME_LEN: usize = 4096;
/// Longest binary block hash, in bytes (SHA-512 size; vLLM sends 32 or 16).
pub const MAX_HASH_BYTES: usize = 64;

/// One payload frame, decoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodedBatch {
    /// Engine wall-clock time of the batch, in seconds since the epoch.
    pub ts: f64,
    /// Data-parallel rank of the publishing engine, if it said.
    pub dp_rank: Option<u32>,
    /// The events understood, in batch order.
    pub events: Vec<DecodedEvent>,
    /// Events of a type this decoder does not know, skipped.
    pub skipped_unknown: u32,
    /// Events dropped for bad content, the batch being otherwise intact.
    pub malformed: Vec<MalformedEvent>,
}

/// One event of a batch, with its engine metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedEvent {
    /// The engine-neutral event, ready for the index. For `Stored`, the seed
    /// is `HashSeed::new(lora_name, cache_salt)`, and the token count equals
    /// `blocks × block_size` whenever [`DecodedEvent::full_attention`] is
    /// `Some(true)` (not checked for other groups, whose events are not
    /// indexed).
    pub event: KvEvent,
    /// Where the blocks live; `None` when not sent (older engines: the GPU).
    pub medium: Option<Medium>,
    /// LoRA adapter of the request that filled the blocks (`Stored` only).
    pub lora_name: Option<String>,
    /// vLLM's deprecated numeric LoRA id (`Stored` only), kept for callers
    /// that map ids to names for engines predating `lora_name`.
    pub lora_id: Option<i64>,
    /// The request's cache salt, when the event reveals it (see the module
    /// docs: only events starting a prompt can).
    pub cache_salt: Option<String>,
    /// KV cache group of the blocks (hybrid models), when sent.
    pub group_idx: Option<u32>,
    /// Kind of the group's KV cache spec, when sent.
    pub kv_cache_spec_kind: Option<KvCacheSpecKind>,
}

impl DecodedEvent {
    /// Whether the event belongs to a full-attention group, judged from its
    /// own fields: `None` for a group > 0 without a kind (ask a
    /// [`GroupKinds`]). `AllBlocksCleared` is always `Some(true)`.
    pub fn full_attention(&self) -> Option<bool> {
        if matches!(self.event, KvEvent::Cleared) {
            return Some(true);
        }
        match (&self.kv_cache_spec_kind, self.group_idx) {
            (Some(kind), _) => Some(kind.is_full_attention()),
            (None, None | Some(0)) => Some(true),
            (None, Some(_)) => None,
        }
    }

    /// Whether the blocks are in device memory: medium `GPU` or not sent.
    pub fn on_device(&self) -> bool {
        matches!(self.medium, None | Some(Medium::Gpu))
    }

    /// Block hashes of a `Stored` or `Removed` event (empty for `Cleared`).
    pub fn block_hashes(&self) -> &[EngineBlockHash] {
        match &self.event {
            KvEvent::Stored { block_hashes, .. } | KvEvent::Removed { block_hashes } => block_hashes,
            KvEvent::Cleared => &[],
        }
    }
}

/// Storage tier of an event's blocks. Matching is ASCII case-insensitive;
/// an empty string counts as not sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Medium {
    /// `GPU`.
    Gpu,
    /// `CPU`.
    Cpu,
    /// `DISK` or `STORAGE` (vLLM's name).
    Disk,
    /// Anything else, as sent (e.g. SGLang's `CPU_TIER1`, `CPU_TIER2`).
    Other(String),
}

/// Kind of a KV cache group's spec (`kv_cache_spec_kind`), as vLLM names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCacheSpecKind {
    FullAttention,
    MlaAttention,
    SinkFullAttention,
    SlidingWindow,
    SlidingWindowMla,
    ChunkedLocalAttention,
    Mamba,
    EncoderOnlyAttention,
    CrossAttention,
    /// Anything else, as sent; never indexed.
    Other(String),
}

impl KvCacheSpecKind {
    /// Whether blocks of this kind hold a whole prefix's KV, so a prefix hash
    /// names them: full attention and its MLA and attention-sink variants.
    pub fn is_full_attention(&self) -> bool {
        matches!(self, Self::FullAttention | Self::MlaAttention | Self::SinkFullAttention)
    }

    /// The wire name.
    pub fn as_str(&self) -> &str {
        match self {
            Self::FullAttention => "full_attention",
            Self::MlaAttention => "mla_attention",
            Self::SinkFullAttention => "sink_full_attention",
            Self::SlidingWindow => "sliding_window",
            Self::SlidingWindowMla => "sliding_window_mla",
            Self::ChunkedLocalAttention => "chunked_local_attention",
            Self::Mamba => "mamba",
            Self::EncoderOnlyAttention => "encoder_only_attention",
            Self::CrossAttention => "cross_attention",
            Self::Other(s) => s,
        }
    }

    fn from_wire(s: &str) -> Self {
        match s {
            "full_attention" => Self::FullAttention,
            "mla_attention" => Self::MlaAttention,
            "sink_full_attention" => Self::SinkFullAttention,
            "sliding_window" => Self::SlidingWindow,
            "sliding_window_mla" => Self::SlidingWindowMla,
            "chunked_local_attention" => Self::ChunkedLocalAttention,
            "mamba" => Self::Mamba,
            "encoder_only_attention" => Self::EncoderOnlyAttention,
            "cross_attention" => Self::CrossAttention,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// An event dropped for bad content; the rest of its batch was decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MalformedEvent {
    /// Position of the event in the batch's event array.
    pub index: usize,
    pub error: WireError,
}

/// What failed, and at which byte offset of the payload.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("input ends inside {what} starting at byte {offset}")]
    Truncated { offset: usize, what: &'static str },
    #[error("reserved msgpack marker {marker:#04x} at byte {offset}")]
    InvalidMarker { offset: usize, marker: u8 },
    #[error("{what} at byte {offset}: expected {expected}, found {found}")]
    UnexpectedType { offset: usize, what: &'static str, expected: &'static str, found: &'static str },
    #[error("{what} at byte {offset}: {value} is out of range")]
    OutOfRange { offset: usize, what: &'static str, value: i128 },
    #[error("{what} at byte {offset}: length {len} is over the limit of {limit}")]
    TooLong { offset: usize, what: &'static str, len: usize, limit: usize },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { offset: usize, what: &'static str },
    #[error("{what} at byte {offset} lacks field {field}")]
    MissingField { offset: usize, what: &'static str, field: &'static str },
    #[error("block hash at byte {offset}: {len}-byte binary (1 to {MAX_HASH_BYTES} accepted)")]
    BadHashLength { offset: usize, len: usize },
    #[error("BlockStored at byte {offset}: {blocks} blocks of {block_size} tokens, but {tokens} token ids")]
    TokenCountMismatch { offset: usize, blocks: usize, block_size: u32, tokens: usize },
    #[error("{len} bytes left after the batch, at byte {offset}")]
    TrailingBytes { offset: usize, len: usize },
}

impl WireError {
    /// Byte offset in the payload where the failing item starts.
    pub fn offset(&self) -> usize {
        match *self {
            WireError::Truncated { offset, .. }
            | WireError::InvalidMarker { offset, .. }
            | WireError::UnexpectedType { offset, .. }
            | WireError::OutOfRange { offset, .. }
            | WireError::TooLong { offset, .. }
            | WireError::InvalidUtf8 { offset, .. }
            | WireError::MissingField { offset, .. }
            | WireError::BadHashLength { offset, .. }
            | WireError::TokenCountMismatch { offset, .. }
            | WireError::TrailingBytes { offset, .. } => offset,
        }
    }
}

pub(crate) fn unexpected(offset: usize, what: &'static str, expected: &'static str, found: Token<'_>) -> WireError {
    WireError::UnexpectedType { offset, what, expected, found: found.name() }
}

/// Decodes one payload frame (the third ZMQ frame) into a batch of events.
///
/// Fails only for a malformed envelope; bad events are dropped one by one
/// into [`DecodedBatch::malformed`] (see the module docs for the rules).
pub fn decode_batch(payload: &[u8]) -> Result<DecodedBatch, WireError> {
    let mut r = Reader::new(payload);
    let mut batch = DecodedBatch::default();
    match r.token("batch")? {
        Token::Array(n) => {
            if n < 2 {
                let field = if n == 0 { "ts" } else { "events" };
                return Err(WireError::MissingField { offset: 0, what: "batch", field });
            }
            batch.ts = read_ts(&mut r)?;
            decode_events(&mut r, &mut batch)?;
            if n >= 3 {
                batch.dp_rank = read_dp_rank(&mut r)?;
            }
            for _ in 3..n {
                r.skip("batch field")?;
            }
        }
        Token::Map(n) => {
            let (mut ts, mut events) = (None, false);
            for _ in 0..n {
                let key = r.token("batch key")?;
                match key {
                    Token::Str(b"ts") => ts = Some(read_ts(&mut r)?),
                    Token::Str(b"events") => {
                        batch.events.clear();
                        batch.malformed.clear();
                        batch.skipped_unknown = 0;
                        decode_events(&mut r, &mut batch)?;
                        events = true;
                    }
                    Token::Str(b"data_parallel_rank") => batch.dp_rank = read_dp_rank(&mut r)?,
                    _ => {
                        r.skip_contents(key, "batch key")?;
                        r.skip("batch field")?;
                    }
                }
            }
            if !events {
                return Err(WireError::MissingField { offset: 0, what: "batch", field: "events" });
            }
            batch.ts = ts.ok_or(WireError::MissingField { offset: 0, what: "batch", field: "ts" })?;
        }
        other => return Err(unexpected(0, "batch", "array or map", other)),
    }
    if !r.is_empty() {
        return Err(WireError::TrailingBytes { offset: r.pos(), len: r.remaining() });
    }
    Ok(batch)
}

/// The batch's stamp (its `ts`, the engine's wall clock when it was made),
/// read without decoding its events; `None` for a payload that is not a
/// batch. Tells a batch overtaken on the way from a restarted engine's
/// (see the sequencer).
pub fn batch_ts(payload: &[u8]) -> Option<f64> {
    let mut r = Reader::new(payload);
    match r.token("batch").ok()? {
        Token::Array(n) if n >= 1 => read_ts(&mut r).ok(),
        Token::Map(n) => {
            for _ in 0..n {
                match r.token("batch key").ok()? {
                    Token::Str(b"ts") => return read_ts(&mut r).ok(),
                    key => {
                        r.skip_contents(key, "batch key").ok()?;
                        r.skip("batch field").ok()?;
                    }
                }
            }
            None
        }
        _ => None,
    }
}

fn read_ts(r: &mut Reader<'_>) -> Result<f64, WireError> {
    let at = r.pos();
    match r.token("ts")? {
        Token::Float(v) => Ok(v),
        Token::Uint(v) => Ok(v as f64),
        Token::Neg(v) => Ok(v as f64),
        other => Err(unexpected(at, "ts", "float", other)),
    }
}

fn read_dp_rank(r: &mut Reader<'_>) -> Result<Option<u32>, WireError> {
    let at = r.pos();
    match r.token("data_parallel_rank")? {
        Token::Nil => Ok(None),
        Token::Uint(v) => match u32::try_from(v) {
            Ok(v) => Ok(Some(v)),
            Err(_) => Err(WireError::OutOfRange { offset: at, what: "data_parallel_rank", value: i128::from(v) }),
        },
        Token::Neg(v) => Err(WireError::OutOfRange { offset: at, what: "data_parallel_rank", value: i128::from(v) }),
        other => Err(unexpected(at, "data_parallel_rank", "int or nil", other)),
    }
}

fn decode_events(r: &mut Reader<'_>, batch: &mut DecodedBatch) -> Result<(), WireError> {
    let at = r.pos();
    let n = match r.token("events")? {
        Token::Array(n) => n as usize,
        other => return Err(unexpected(at, "events", "array", other)),
    };
    if n > MAX_EVENTS_PER_BATCH {
        return Err(WireError::TooLong { offset: at, what: "events", len: n, limit: MAX_EVENTS_PER_BATCH });
    }
    // The smallest event that decodes (`["AllBlocksCleared"]`) takes 18
    // bytes: reserve no more than the input can hold, growing past that only
    // with the events actually decoded.
    batch.events.reserve(n.min(r.remaining() / 18));
    for index in 0..n {
        let start = r.pos();
        match decode::event(r) {
            Ok(Some(event)) => batch.events.push(event),
            Ok(None) => batch.skipped_unknown = batch.skipped_unknown.saturating_add(1),
            Err(error) => {
                // Drop this event alone if the msgpack around it is intact;
                // if it cannot even be skipped, the batch is broken.
                r.seek(start);
                r.skip("event")?;
                batch.malformed.push(MalformedEvent { index, error });
            }
        }
    }
    Ok(())
}
