//! The simulated engine's KV-event payloads: byte-identical to msgspec's
//! (the fixtures of `tests/fixtures/kv_events/`) and decoded by kvpick's
//! own decoder, in both encodings and both hash formats.

use std::path::PathBuf;

use kvpick_core::{HashSeed, KvEvent};
use kvpick_kv_events::wire::{DecodedEvent, KvCacheSpecKind, Medium, decode_batch};
use kvpick_sim::{BatchEncoder, BlockDigest, CacheEvent, EventEncoding, HashFormat};
use serde_json::Value;

/// engines.md §1.3's example hash (> i64::MAX: msgpack `uint64`).
const H_EXAMPLE: u64 = 15_760_518_052_499_183_552;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/kv_events")
}

fn fixture(name: &str) -> Vec<u8> {
    let path = fixture_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The manifest's `expect` of one fixture.
fn expected(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("manifest.json")).expect("manifest.json");
    let manifest: Value = serde_json::from_str(&text).expect("manifest is JSON");
    let entry = manifest["fixtures"]
        .as_array()
        .expect("fixtures list")
        .iter()
        .find(|f| f["file"] == name)
        .unwrap_or_else(|| panic!("{name} in manifest"));
    entry["expect"].clone()
}

/// The batch of engines.md §1.3: stored, removed, cleared.
fn example_events() -> Vec<CacheEvent> {
    let h = BlockDigest(u128::from(H_EXAMPLE) | (0xabcd_u128 << 64));
    vec![
        CacheEvent::Stored { hashes: vec![h], parent: None, token_ids: vec![1, 2, 3, 4], block_size: 4 },
        CacheEvent::Removed { hashes: vec![h] },
        CacheEvent::Cleared,
    ]
}

fn encoder(encoding: EventEncoding, hash_format: HashFormat, dp_rank: u32) -> BatchEncoder {
    BatchEncoder { encoding, hash_format, dp_rank }
}

#[test]
fn array_encoding_matches_msgspec_fixture_bytes() {
    let name = "vllm_array_8field_example.bin";
    let expect = expected(name);
    // The content we encode is the fixture's content.
    assert_eq!(expect["ts"], 1.5);
    assert_eq!(expect["dp_rank"], 0);
    assert_eq!(expect["events"][0]["block_hashes"][0], H_EXAMPLE);
    assert_eq!(expect["events"][0]["token_ids"], serde_json::json!([1, 2, 3, 4]));
    let ours = encoder(EventEncoding::Array, HashFormat::Int, 0).encode(1.5, &example_events());
    assert_eq!(ours, fixture(name), "array-encoded batch differs from msgspec's bytes");
    assert_eq!(ours.len(), 94);
}

#[test]
fn map_encoding_matches_msgspec_fixture_bytes() {
    let name = "vllm_map_example.bin";
    let expect = expected(name);
    assert_eq!(expect["ts"], 1.5);
    assert_eq!(expect["events"][0]["group_idx"], 0);
    assert_eq!(expect["events"][0]["kv_cache_spec_kind"], "full_attention");
    assert_eq!(expect["events"][1]["group_idx"], 0);
    let ours = encoder(EventEncoding::Map, HashFormat::Int, 0).encode(1.5, &example_events());
    assert_eq!(ours, fixture(name), "map-encoded batch differs from msgspec's bytes");
    assert_eq!(ours.len(), 275);
}

/// Hashes straddling every msgpack int width, unsigned and (read as
/// SGLang's signed int64) negative, long token lists (array16) and more
/// than 15 events (array16 for the event list).
fn varied_events() -> Vec<CacheEvent> {
    let negative = [-32i64, -33, -128, -129, -32_768, -32_769, i64::from(i32::MIN), i64::from(i32::MIN) - 1, i64::MIN];
    let widths: Vec<u64> =
        [0u64, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x1_0000, 0xffff_ffff, 0x1_0000_0000, i64::MAX as u64, u64::MAX]
            .into_iter()
            .chain(negative.map(|n| n as u64))
            .collect();
    let digests: Vec<BlockDigest> = widths.iter().map(|&w| BlockDigest(u128::from(w) | (7u128 << 100))).collect();
    let block_size = 16;
    let tokens: Vec<u32> = (0..digests.len() as u32 * block_size).map(|i| i * 13_001 % 151_936).collect();
    let mut events = vec![CacheEvent::Stored {
        hashes: digests.clone(),
        parent: Some(BlockDigest(42)),
        token_ids: tokens.clone(),
        block_size,
    }];
    for (i, d) in digests.iter().enumerate() {
        let start = i * block_size as usize;
        events.push(CacheEvent::Stored {
            hashes: vec![*d],
            parent: None,
            token_ids: tokens[start..start + block_size as usize].to_vec(),
            block_size,
        });
        events.push(CacheEvent::Removed { hashes: vec![*d] });
    }
    assert!(events.len() > 15, "the event list needs msgpack's array16");
    events.push(CacheEvent::Removed { hashes: digests });
    events.push(CacheEvent::Cleared);
    events
}

fn check_decoded(sent: &[CacheEvent], decoded: &[DecodedEvent], encoding: EventEncoding) {
    assert_eq!(sent.len(), decoded.len());
    for (s, d) in sent.iter().zip(decoded) {
        let expected = match s {
            CacheEvent::Stored { hashes, parent, token_ids, block_size } => KvEvent::Stored {
                block_hashes: hashes.iter().map(|h| h.published()).collect(),
                parent: parent.map(BlockDigest::published),
                token_ids: token_ids.clone(),
                block_size: *block_size,
                seed: HashSeed::new(None, None),
            },
            CacheEvent::Removed { hashes } => {
                KvEvent::Removed { block_hashes: hashes.iter().map(|h| h.published()).collect() }
            }
            CacheEvent::Cleared => KvEvent::Cleared,
        };
        assert_eq!(d.event, expected);
        assert_eq!(d.full_attention(), Some(true));
        if !matches!(s, CacheEvent::Cleared) {
            assert_eq!(d.medium, Some(Medium::Gpu));
        }
        match (encoding, s) {
            (EventEncoding::Map, CacheEvent::Stored { .. }) => {
                assert_eq!(d.group_idx, Some(0));
                assert_eq!(d.kv_cache_spec_kind, Some(KvCacheSpecKind::FullAttention));
            }
            (EventEncoding::Map, CacheEvent::Removed { .. }) => assert_eq!(d.group_idx, Some(0)),
            _ => assert_eq!(d.group_idx, None),
        }
    }
}

#[test]
fn kvpick_decodes_both_encodings_and_hash_formats() {
    let events = varied_events();
    for encoding in [EventEncoding::Map, EventEncoding::Array] {
        for hash_format in [HashFormat::Int, HashFormat::Bytes, HashFormat::SignedInt] {
            let payload = encoder(encoding, hash_format, 3).encode(1_789_095_808.837_884_7, &events);
            let batch = decode_batch(&payload)
                .unwrap_or_else(|e| panic!("{encoding:?}/{hash_format:?}: kvpick rejects the batch: {e}"));
            assert_eq!(batch.ts, 1_789_095_808.837_884_7);
            assert_eq!(batch.dp_rank, Some(3));
            assert!(batch.malformed.is_empty(), "{encoding:?}/{hash_format:?}: {:?}", batch.malformed);
            assert_eq!(batch.skipped_unknown, 0);
            check_decoded(&events, &batch.events, encoding);
        }
    }
}

#[test]
fn empty_batch_decodes() {
    for encoding in [EventEncoding::Map, EventEncoding::Array] {
        let batch = decode_batch(&encoder(encoding, HashFormat::Int, 0).encode(0.0, &[])).expect("empty batch");
        assert!(batch.events.is_empty());
    }
}
