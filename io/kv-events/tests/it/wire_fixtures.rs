//! Byte-exact KV-event fixtures (tests/fixtures/kv_events, made by msgspec
//! from Structs mirroring the engines' schemas): each decodes to what
//! manifest.json says.
//!
//! With `KVPICK_REGEN_FIXTURES=1` and a `python3` that can import `msgspec`,
//! the generator is also run into a temporary directory and its output must
//! equal the committed files byte for byte; otherwise that check is skipped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use kvpick_core::event::KvEvent;
use kvpick_core::hashing::HashSeed;
use kvpick_kv_events::wire::{DecodedBatch, DecodedEvent, GroupKinds, Medium, decode_batch};
use serde_json::{Value, json};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kv_events")
}

fn manifest() -> Vec<Value> {
    let path = fixtures_dir().join("manifest.json");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let manifest: Value = serde_json::from_str(&text).expect("manifest.json is JSON");
    manifest["fixtures"].as_array().expect("fixtures list").clone()
}

fn medium_name(medium: &Option<Medium>) -> Value {
    match medium {
        None => Value::Null,
        Some(Medium::Gpu) => json!("GPU"),
        Some(Medium::Cpu) => json!("CPU"),
        Some(Medium::Disk) => json!("DISK"),
        Some(Medium::Other(s)) => json!(s),
    }
}

/// The decoded event in the manifest's shape.
fn event_json(ev: &DecodedEvent) -> Value {
    let kind = ev.kv_cache_spec_kind.as_ref().map(|k| k.as_str().to_owned());
    match &ev.event {
        KvEvent::Stored { block_hashes, parent, token_ids, block_size, seed } => {
            // The seed is always derived from what the event reveals.
            assert_eq!(*seed, HashSeed::new(ev.lora_name.as_deref(), ev.cache_salt.as_deref()));
            json!({
                "type": "BlockStored",
                "block_hashes": block_hashes,
                "parent_block_hash": parent,
                "token_ids": token_ids,
                "block_size": block_size,
                "medium": medium_name(&ev.medium),
                "lora_name": ev.lora_name,
                "lora_id": ev.lora_id,
                "cache_salt": ev.cache_salt,
                "group_idx": ev.group_idx,
                "kv_cache_spec_kind": kind,
                "full_attention": ev.full_attention(),
            })
        }
        KvEvent::Removed { block_hashes } => json!({
            "type": "BlockRemoved",
            "block_hashes": block_hashes,
            "medium": medium_name(&ev.medium),
            "group_idx": ev.group_idx,
            "kv_cache_spec_kind": kind,
            "full_attention": ev.full_attention(),
        }),
        KvEvent::Cleared => json!({"type": "AllBlocksCleared", "full_attention": ev.full_attention()}),
    }
}

fn batch_json(batch: &DecodedBatch) -> Value {
    let malformed: Vec<Value> = batch
        .malformed
        .iter()
        .map(|m| {
            let debug = format!("{:?}", m.error);
            let variant = debug.split([' ', '{', '(']).next().unwrap_or_default().to_owned();
            json!({"index": m.index, "error": variant})
        })
        .collect();
    json!({
        "ts": batch.ts,
        "dp_rank": batch.dp_rank,
        "events": batch.events.iter().map(event_json).collect::<Vec<_>>(),
        "skipped_unknown": batch.skipped_unknown,
        "malformed": malformed,
    })
}

#[test]
fn every_fixture_decodes_as_the_manifest_says() {
    let fixtures = manifest();
    assert!(fixtures.len() >= 14, "manifest lists {} fixtures", fixtures.len());
    for fixture in &fixtures {
        let file = fixture["file"].as_str().expect("file name");
        let bytes = fs::read(fixtures_dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(Some(bytes.len() as u64), fixture["bytes"].as_u64(), "{file}: size");
        let batch = decode_batch(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        let got = batch_json(&batch);
        assert_eq!(
            got, fixture["expect"],
            "{file} ({}):\n got  {got}\n want {}",
            fixture["description"], fixture["expect"]
        );
    }
}

#[test]
fn fixture_prefixes_fail_cleanly() {
    // Every strict prefix of a fixture is a truncated envelope: an error,
    // never a panic, and never a batch.
    for fixture in manifest() {
        let file = fixture["file"].as_str().expect("file name");
        let bytes = fs::read(fixtures_dir().join(file)).expect("fixture");
        for len in 0..bytes.len() {
            assert!(decode_batch(&bytes[..len]).is_err(), "{file}: prefix of {len} bytes decoded");
        }
    }
}

#[test]
fn hybrid_groups_learn_kinds_across_events() {
    // vllm_0_23: group 1 is sliding window (told by a BlockStored), so the
    // group-1 BlockRemoved without a kind is not indexed either.
    let bytes = fs::read(fixtures_dir().join("vllm_0_23_array_dp_rank.bin")).expect("fixture");
    let batch = decode_batch(&bytes).expect("decodes");
    let mut groups = GroupKinds::new();
    let judged: Vec<bool> = batch.events.iter().map(|e| groups.should_index(e)).collect();
    assert_eq!(judged, [true, true, false, false, true]);
    assert_eq!(groups.learned(1), Some(false));
    assert_eq!(groups.learned(0), Some(true));
}

fn python_with_msgspec() -> bool {
    Command::new("python3").args(["-c", "import msgspec"]).output().map(|out| out.status.success()).unwrap_or(false)
}

#[test]
fn fixtures_are_what_the_generator_makes() {
    if std::env::var("KVPICK_REGEN_FIXTURES").as_deref() != Ok("1") {
        eprintln!("KVPICK_REGEN_FIXTURES is not 1: fixture regeneration not checked");
        return;
    }
    if !python_with_msgspec() {
        eprintln!("python3 with msgspec not found: fixture regeneration not checked");
        return;
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let out = std::env::temp_dir().join(format!("kvpick-fixtures-{}-{nanos}", std::process::id()));
    let dir = fixtures_dir();
    let status = Command::new("python3")
        .arg(dir.join("gen_fixtures.py"))
        .arg("--out")
        .arg(&out)
        .status()
        .expect("run gen_fixtures.py");
    assert!(status.success(), "gen_fixtures.py failed: {status}");
    let listing = |d: &Path| -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(d)
            .expect("read dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".bin") || n == "manifest.json")
            .collect();
        names.sort();
        names
    };
    let (committed, generated) = (listing(&dir), listing(&out));
    assert_eq!(committed, generated, "fixture file sets differ");
    for name in &committed {
        let (a, b) = (fs::read(dir.join(name)).expect("committed"), fs::read(out.join(name)).expect("generated"));
        assert!(a == b, "{name}: committed bytes differ from the generator's (rerun gen_fixtures.py)");
    }
    let _ = fs::remove_dir_all(&out);
}
