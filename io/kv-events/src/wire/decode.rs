//! One event: positional (`msgspec` `array_like`) or map form.

use super::reader::{Reader, Token};
use super::{
    DecodedEvent, KvCacheSpecKind, MAX_BLOCKS_PER_EVENT, MAX_HASH_BYTES, MAX_NAME_LEN, MAX_TOKENS_PER_EVENT, Medium,
    WireError, unexpected,
};
use kvpick_core::event::{EngineBlockHash, KvEvent};
use kvpick_core::hashing::HashSeed;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
}

fn kind_of(name: &[u8]) -> Option<Kind> {
    match name {
        b"BlockStored" => Some(Kind::Stored),
        b"BlockRemoved" => Some(Kind::Removed),
        b"AllBlocksCleared" => Some(Kind::Cleared),
        _ => None,
    }
}

/// Fields gathered from either form, before the event is assembled.
#[derive(Default)]
struct Fields<'a> {
    block_hashes: Option<Vec<EngineBlockHash>>,
    parent: Option<EngineBlockHash>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<Medium>,
    lora_name: Option<&'a str>,
    cache_salt: Option<&'a str>,
    /// Offset of the `extra_keys` value, read once the other fields are known.
    extra_keys_at: Option<usize>,
    group_idx: Option<u32>,
    kv_cache_spec_kind: Option<KvCacheSpecKind>,
}

/// Decodes one event, consuming exactly its value on success. `Ok(None)`: an
/// event of unknown type, skipped.
pub(super) fn event(r: &mut Reader<'_>) -> Result<Option<DecodedEvent>, WireError> {
    let start = r.pos();
    match r.token("event")? {
        Token::Array(n) => positional(r, start, n),
        Token::Map(n) => map(r, start, n),
        other => Err(unexpected(start, "event", "array or map", other)),
    }
}

fn positional<'a>(r: &mut Reader<'a>, start: usize, n: u32) -> Result<Option<DecodedEvent>, WireError> {
    if n == 0 {
        return Err(WireError::MissingField { offset: start, what: "event", field: "type" });
    }
    let at = r.pos();
    let kind = match r.token("event type")? {
        Token::Str(name) => kind_of(name),
        other => return Err(unexpected(at, "event type", "str", other)),
    };
    let Some(kind) = kind else {
        for _ in 1..n {
            r.skip("event field")?;
        }
        return Ok(None);
    };
    let mut f = Fields::default();
    for i in 1..n {
        match (kind, i) {
            (Kind::Stored | Kind::Removed, 1) => f.block_hashes = Some(hashes(r)?),
            (Kind::Stored, 2) => f.parent = opt_hash(r)?,
            (Kind::Stored, 3) => f.token_ids = Some(tokens(r)?),
            (Kind::Stored, 4) => f.block_size = Some(block_size(r)?),
            (Kind::Stored, 5) => f.lora_id = opt_i64(r, "lora_id")?,
            (Kind::Stored, 6) | (Kind::Removed, 2) => f.medium = opt_medium(r)?,
            (Kind::Stored, 7) => lora_name_or_sglang_meta(r, &mut f)?,
            (Kind::Stored, 8) => {
                f.extra_keys_at = Some(r.pos());
                r.skip("extra_keys")?;
            }
            (Kind::Stored, 9) | (Kind::Removed, 3) => f.group_idx = opt_u32(r, "group_idx")?,
            (Kind::Stored, 10) | (Kind::Removed, 4) => f.kv_cache_spec_kind = opt_kind(r)?,
            _ => r.skip("event field")?,
        }
    }
    assemble(r, start, kind, f).map(Some)
}

fn map<'a>(r: &mut Reader<'a>, start: usize, n: u32) -> Result<Option<DecodedEvent>, WireError> {
    let body = r.pos();
    // msgspec writes the tag first; look further only if it did not.
    let mut kind = None;
    let mut entries = n;
    if n > 0 && matches!(r.token("event key")?, Token::Str(b"type")) {
        kind = Some(type_value(r)?);
        entries -= 1;
    } else {
        r.seek(body);
        for _ in 0..n {
            let key = r.token("event key")?;
            if key == Token::Str(b"type") {
                kind = Some(type_value(r)?);
            } else {
                r.skip_contents(key, "event key")?;
                r.skip("event field")?;
            }
        }
        r.seek(body);
    }
    // The caller skips the whole value after an error.
    let kind = kind.ok_or(WireError::MissingField { offset: start, what: "event", field: "type" })?;
    let Some(kind) = kind else {
        for _ in 0..entries {
            r.skip("event key")?;
            r.skip("event field")?;
        }
        return Ok(None);
    };
    let mut f = Fields::default();
    for _ in 0..entries {
        let key = r.token("event key")?;
        let Token::Str(key) = key else {
            r.skip_contents(key, "event key")?;
            r.skip("event field")?;
            continue;
        };
        match (kind, key) {
            (Kind::Stored | Kind::Removed, b"block_hashes") => f.block_hashes = Some(hashes(r)?),
            (Kind::Stored, b"parent_block_hash") => f.parent = opt_hash(r)?,
            (Kind::Stored, b"token_ids") => f.token_ids = Some(tokens(r)?),
            (Kind::Stored, b"block_size") => f.block_size = Some(block_size(r)?),
            (Kind::Stored, b"lora_id") => f.lora_id = opt_i64(r, "lora_id")?,
            (Kind::Stored | Kind::Removed, b"medium") => f.medium = opt_medium(r)?,
            (Kind::Stored, b"lora_name") => f.lora_name = opt_name(r, "lora_name")?,
            (Kind::Stored, b"cache_salt") => f.cache_salt = opt_name(r, "cache_salt")?,
            (Kind::Stored, b"extra_keys") => {
                f.extra_keys_at = Some(r.pos());
                r.skip("extra_keys")?;
            }
            (Kind::Stored | Kind::Removed, b"group_idx") => f.group_idx = opt_u32(r, "group_idx")?,
            (Kind::Stored | Kind::Removed, b"kv_cache_spec_kind") => f.kv_cache_spec_kind = opt_kind(r)?,
            // `type` (already read), and everything this decoder ignores.
            _ => r.skip("event field")?,
        }
    }
    assemble(r, start, kind, f).map(Some)
}

/// The value of a `type` key: `Some(kind)`, or `None` for an unknown type.
fn type_value(r: &mut Reader<'_>) -> Result<Option<Kind>, WireError> {
    let at = r.pos();
    match r.token("event type")? {
        Token::Str(name) => Ok(kind_of(name)),
        other => Err(unexpected(at, "event type", "str", other)),
    }
}

fn assemble(r: &Reader<'_>, start: usize, kind: Kind, f: Fields<'_>) -> Result<DecodedEvent, WireError> {
    let missing = |field| WireError::MissingField { offset: start, what: "event", field };
    let event = match kind {
        Kind::Cleared => KvEvent::Cleared,
        Kind::Removed => KvEvent::Removed { block_hashes: f.block_hashes.ok_or(missing("block_hashes"))? },
        Kind::Stored => {
            let block_hashes = f.block_hashes.ok_or(missing("block_hashes"))?;
            let token_ids = f.token_ids.ok_or(missing("token_ids"))?;
            let block_size = f.block_size.ok_or(missing("block_size"))?;
            let lora_name = f.lora_name.filter(|s| !s.is_empty());
            let cache_salt = f.cache_salt.filter(|s| !s.is_empty()).or_else(|| match (f.extra_keys_at, f.parent) {
                (Some(at), None) => salt_from_extra_keys(r, at, lora_name),
                _ => None,
            });
            let seed = HashSeed::new(lora_name, cache_salt);
            let decoded = DecodedEvent {
                event: KvEvent::Stored { block_hashes, parent: f.parent, token_ids, block_size, seed },
                medium: f.medium,
                lora_name: lora_name.map(str::to_owned),
                lora_id: f.lora_id,
                cache_salt: cache_salt.map(str::to_owned),
                group_idx: f.group_idx,
                kv_cache_spec_kind: f.kv_cache_spec_kind,
            };
            if decoded.full_attention() == Some(true) && !tokens_fill_blocks(&decoded.event) {
                let (blocks, tokens) = (decoded.block_hashes().len(), decoded_tokens(&decoded.event));
                return Err(WireError::TokenCountMismatch { offset: start, blocks, block_size, tokens });
            }
            return Ok(decoded);
        }
    };
    Ok(DecodedEvent {
        event,
        medium: f.medium,
        lora_name: None,
        lora_id: None,
        cache_salt: None,
        group_idx: f.group_idx,
        kv_cache_spec_kind: f.kv_cache_spec_kind,
    })
}

/// Whether a `Stored` event has exactly `blocks × block_size` tokens, with
/// `block_size > 0` (the contract of [`KvEvent::Stored`]).
fn tokens_fill_blocks(event: &KvEvent) -> bool {
    match event {
        KvEvent::Stored { block_hashes, token_ids, block_size, .. } => {
            *block_size > 0 && block_hashes.len().checked_mul(*block_size as usize) == Some(token_ids.len())
        }
        _ => true,
    }
}

fn decoded_tokens(event: &KvEvent) -> usize {
    match event {
        KvEvent::Stored { token_ids, .. } => token_ids.len(),
        _ => 0,
    }
}

/// Maps a block hash token to the engine's `u64` (see the module docs).
#[inline]
fn hash_of(token: Token<'_>, at: usize) -> Result<EngineBlockHash, WireError> {
    match token {
        Token::Uint(v) => Ok(v),
        Token::Neg(v) => Ok(v as u64),
        Token::Bin(bytes) if (1..=MAX_HASH_BYTES).contains(&bytes.len()) => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Ok(tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
        }
        Token::Bin(bytes) => Err(WireError::BadHashLength { offset: at, len: bytes.len() }),
        other => Err(unexpected(at, "block hash", "int or bin", other)),
    }
}

fn hashes(r: &mut Reader<'_>) -> Result<Vec<EngineBlockHash>, WireError> {
    let at = r.pos();
    let n = match r.token("block_hashes")? {
        Token::Array(n) => n as usize,
        other => return Err(unexpected(at, "block_hashes", "array", other)),
    };
    if n > MAX_BLOCKS_PER_EVENT {
        return Err(WireError::TooLong { offset: at, what: "block_hashes", len: n, limit: MAX_BLOCKS_PER_EVENT });
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let at = r.pos();
        out.push(hash_of(r.token_fast("block hash")?, at)?);
    }
    Ok(out)
}

fn opt_hash(r: &mut Reader<'_>) -> Result<Option<EngineBlockHash>, WireError> {
    let at = r.pos();
    match r.token("parent_block_hash")? {
        Token::Nil => Ok(None),
        token => hash_of(token, at).map(Some),
    }
}

fn tokens(r: &mut Reader<'_>) -> Result<Vec<u32>, WireError> {
    let at = r.pos();
    let n = match r.token("token_ids")? {
        Token::Array(n) => n as usize,
        other => return Err(unexpected(at, "token_ids", "array", other)),
    };
    if n > MAX_TOKENS_PER_EVENT {
        return Err(WireError::TooLong { offset: at, what: "token_ids", len: n, limit: MAX_TOKENS_PER_EVENT });
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let at = r.pos();
        let token = match r.token_fast("token id")? {
            // SGLang EAGLE bigram `[a, b]`: the block's own token is `a`.
            Token::Array(2) => {
                let first_at = r.pos();
                let first = r.token_fast("token id")?;
                r.skip("token id")?;
                token_id(first, first_at)?
            }
            other => token_id(other, at)?,
        };
        out.push(token);
    }
    Ok(out)
}

#[inline]
fn token_id(token: Token<'_>, at: usize) -> Result<u32, WireError> {
    match token {
        Token::Uint(v) => {
            u32::try_from(v).map_err(|_| WireError::OutOfRange { offset: at, what: "token id", value: i128::from(v) })
        }
        Token::Neg(v) => Err(WireError::OutOfRange { offset: at, what: "token id", value: i128::from(v) }),
        other => Err(unexpected(at, "token id", "int", other)),
    }
}

fn block_size(r: &mut Reader<'_>) -> Result<u32, WireError> {
    let at = r.pos();
    match r.token("block_size")? {
        Token::Uint(v) => {
            u32::try_from(v).map_err(|_| WireError::OutOfRange { offset: at, what: "block_size", value: i128::from(v) })
        }
        Token::Neg(v) => Err(WireError::OutOfRange { offset: at, what: "block_size", value: i128::from(v) }),
        other => Err(unexpected(at, "block_size", "int", other)),
    }
}

fn opt_u32(r: &mut Reader<'_>, what: &'static str) -> Result<Option<u32>, WireError> {
    let at = r.pos();
    match r.token(what)? {
        Token::Nil => Ok(None),
        Token::Uint(v) => {
            u32::try_from(v).map(Some).map_err(|_| WireError::OutOfRange { offset: at, what, value: i128::from(v) })
        }
        Token::Neg(v) => Err(WireError::OutOfRange { offset: at, what, value: i128::from(v) }),
        other => Err(unexpected(at, what, "int or nil", other)),
    }
}

fn opt_i64(r: &mut Reader<'_>, what: &'static str) -> Result<Option<i64>, WireError> {
    let at = r.pos();
    match r.token(what)? {
        Token::Nil => Ok(None),
        Token::Uint(v) => {
            i64::try_from(v).map(Some).map_err(|_| WireError::OutOfRange { offset: at, what, value: i128::from(v) })
        }
        Token::Neg(v) => Ok(Some(v)),
        other => Err(unexpected(at, what, "int or nil", other)),
    }
}

fn name<'a>(bytes: &'a [u8], at: usize, what: &'static str) -> Result<&'a str, WireError> {
    if bytes.len() > MAX_NAME_LEN {
        return Err(WireError::TooLong { offset: at, what, len: bytes.len(), limit: MAX_NAME_LEN });
    }
    std::str::from_utf8(bytes).map_err(|_| WireError::InvalidUtf8 { offset: at, what })
}

fn opt_name<'a>(r: &mut Reader<'a>, what: &'static str) -> Result<Option<&'a str>, WireError> {
    let at = r.pos();
    match r.token(what)? {
        Token::Nil => Ok(None),
        Token::Str(bytes) => name(bytes, at, what).map(Some),
        other => Err(unexpected(at, what, "str or nil", other)),
    }
}

fn opt_medium(r: &mut Reader<'_>) -> Result<Option<Medium>, WireError> {
    Ok(opt_name(r, "medium")?.and_then(|s| {
        if s.is_empty() {
            None
        } else if s.eq_ignore_ascii_case("GPU") {
            Some(Medium::Gpu)
        } else if s.eq_ignore_ascii_case("CPU") {
            Some(Medium::Cpu)
        } else if s.eq_ignore_ascii_case("DISK") || s.eq_ignore_ascii_case("STORAGE") {
            Some(Medium::Disk)
        } else {
            Some(Medium::Other(s.to_owned()))
        }
    }))
}

fn opt_kind(r: &mut Reader<'_>) -> Result<Option<KvCacheSpecKind>, WireError> {
    Ok(opt_name(r, "kv_cache_spec_kind")?.filter(|s| !s.is_empty()).map(KvCacheSpecKind::from_wire))
}

/// Position 7 of a positional `BlockStored`: vLLM's `lora_name` (str), or
/// SGLang #30827's `{"cache_salt": …}` map.
fn lora_name_or_sglang_meta<'a>(r: &mut Reader<'a>, f: &mut Fields<'a>) -> Result<(), WireError> {
    let at = r.pos();
    match r.token("lora_name")? {
        Token::Nil => {}
        Token::Str(bytes) => f.lora_name = Some(name(bytes, at, "lora_name")?),
        Token::Map(n) => {
            for _ in 0..n {
                let key = r.token("metadata key")?;
                if key == Token::Str(b"cache_salt") {
                    f.cache_salt = opt_name(r, "cache_salt")?;
                } else {
                    r.skip_contents(key, "metadata key")?;
                    r.skip("metadata field")?;
                }
            }
        }
        other => return Err(unexpected(at, "lora_name", "str, map or nil", other)),
    }
    Ok(())
}

/// The cache salt in vLLM's `extra_keys` (first block's entry), best effort:
/// anything unexpected there means "no salt", never an error.
fn salt_from_extra_keys<'a>(r: &Reader<'a>, at: usize, lora_name: Option<&str>) -> Option<&'a str> {
    let mut r = r.clone();
    r.seek(at);
    let Ok(Token::Array(blocks)) = r.token("extra_keys") else { return None };
    if blocks == 0 {
        return None;
    }
    let Ok(Token::Array(items)) = r.token("extra_keys") else { return None };
    let mut salt = None;
    for i in 0..items {
        let item_at = r.pos();
        let item = r.token("extra key").ok()?;
        match item {
            Token::Str(bytes) => {
                let Ok(s) = name(bytes, item_at, "cache_salt") else { continue };
                if i == 0 && lora_name == Some(s) {
                    continue;
                }
                salt = Some(s);
            }
            Token::Map(n) => {
                // Typed `ExtraKey` struct: {"type": "cache_salt", "salt": s}.
                let (mut tag, mut value) = (false, None);
                for _ in 0..n {
                    let key = r.token("extra key").ok()?;
                    r.skip_contents(key, "extra key").ok()?;
                    let value_at = r.pos();
                    let v = r.token("extra key").ok()?;
                    match (key, v) {
                        (Token::Str(b"type"), Token::Str(b"cache_salt")) => tag = true,
                        (Token::Str(b"salt"), Token::Str(bytes)) => value = name(bytes, value_at, "cache_salt").ok(),
                        _ => r.skip_contents(v, "extra key").ok()?,
                    }
                }
                if tag && value.is_some() {
                    return value;
                }
            }
            Token::Array(n) => {
                // Typed `ExtraKey` in array form, ["cache_salt", s]; anything
                // else here is a multimodal `[id, offset]` pair.
                let mut left = n;
                if n == 2 {
                    let first = r.token("extra key").ok()?;
                    left -= 1;
                    if first == Token::Str(b"cache_salt") {
                        let value_at = r.pos();
                        return match r.token("extra key").ok()? {
                            Token::Str(bytes) => name(bytes, value_at, "cache_salt").ok(),
                            _ => None,
                        };
                    }
                    r.skip_contents(first, "extra key").ok()?;
                }
                for _ in 0..left {
                    r.skip("extra key").ok()?;
                }
            }
            _ => {}
        }
    }
    salt
}
