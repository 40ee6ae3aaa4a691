//! Unit tests of the wire decoder: every error and limit, the hash, salt and
//! group rules, a property round trip through a test-only msgpack encoder in
//! both event forms, and hostile-input properties.

use proptest::prelude::*;

use super::*;
use kvpick_core::hashing::HashSeed;

// ---------------------------------------------------------------------------
// A small msgpack encoder, for tests only.
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Enc {
    buf: Vec<u8>,
}

impl Enc {
    fn new() -> Self {
        Enc::default()
    }
    fn bytes(self) -> Vec<u8> {
        self.buf
    }
    fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self
    }
    fn nil(&mut self) -> &mut Self {
        self.raw(&[0xc0])
    }
    fn boolean(&mut self, v: bool) -> &mut Self {
        self.raw(&[if v { 0xc3 } else { 0xc2 }])
    }
    fn uint(&mut self, v: u64) -> &mut Self {
        if v < 0x80 {
            self.raw(&[v as u8])
        } else if v <= 0xff {
            self.raw(&[0xcc, v as u8])
        } else if v <= 0xffff {
            self.raw(&[0xcd]).raw(&(v as u16).to_be_bytes())
        } else if v <= 0xffff_ffff {
            self.raw(&[0xce]).raw(&(v as u32).to_be_bytes())
        } else {
            self.raw(&[0xcf]).raw(&v.to_be_bytes())
        }
    }
    /// A non-negative integer in a chosen (possibly non-minimal) width.
    fn uint_as(&mut self, v: u64, width: u8) -> &mut Self {
        match width {
            0 if v < 0x80 => self.raw(&[v as u8]),
            1 if v <= 0xff => self.raw(&[0xcc, v as u8]),
            2 if v <= 0xffff => self.raw(&[0xcd]).raw(&(v as u16).to_be_bytes()),
            3 if v <= 0xffff_ffff => self.raw(&[0xce]).raw(&(v as u32).to_be_bytes()),
            4 if v <= i64::MAX as u64 => self.raw(&[0xd3]).raw(&(v as i64).to_be_bytes()),
            _ => self.raw(&[0xcf]).raw(&v.to_be_bytes()),
        }
    }
    fn int(&mut self, v: i64) -> &mut Self {
        if v >= 0 {
            self.uint(v as u64)
        } else if v >= -32 {
            self.raw(&[v as i8 as u8])
        } else if v >= i64::from(i8::MIN) {
            self.raw(&[0xd0, v as i8 as u8])
        } else if v >= i64::from(i16::MIN) {
            self.raw(&[0xd1]).raw(&(v as i16).to_be_bytes())
        } else if v >= i64::from(i32::MIN) {
            self.raw(&[0xd2]).raw(&(v as i32).to_be_bytes())
        } else {
            self.raw(&[0xd3]).raw(&v.to_be_bytes())
        }
    }
    fn f64(&mut self, v: f64) -> &mut Self {
        self.raw(&[0xcb]).raw(&v.to_be_bytes())
    }
    fn f32(&mut self, v: f32) -> &mut Self {
        self.raw(&[0xca]).raw(&v.to_be_bytes())
    }
    fn str_bytes(&mut self, s: &[u8]) -> &mut Self {
        let n = s.len();
        if n < 32 {
            self.raw(&[0xa0 | n as u8]);
        } else if n <= 0xff {
            self.raw(&[0xd9, n as u8]);
        } else if n <= 0xffff {
            self.raw(&[0xda]).raw(&(n as u16).to_be_bytes());
        } else {
            self.raw(&[0xdb]).raw(&(n as u32).to_be_bytes());
        }
        self.raw(s)
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.str_bytes(s.as_bytes())
    }
    fn bin(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len();
        if n <= 0xff {
            self.raw(&[0xc4, n as u8]);
        } else if n <= 0xffff {
            self.raw(&[0xc5]).raw(&(n as u16).to_be_bytes());
        } else {
            self.raw(&[0xc6]).raw(&(n as u32).to_be_bytes());
        }
        self.raw(b)
    }
    fn array(&mut self, n: usize) -> &mut Self {
        if n < 16 {
            self.raw(&[0x90 | n as u8])
        } else if n <= 0xffff {
            self.raw(&[0xdc]).raw(&(n as u16).to_be_bytes())
        } else {
            self.raw(&[0xdd]).raw(&(n as u32).to_be_bytes())
        }
    }
    fn map(&mut self, n: usize) -> &mut Self {
        if n < 16 {
            self.raw(&[0x80 | n as u8])
        } else if n <= 0xffff {
            self.raw(&[0xde]).raw(&(n as u16).to_be_bytes())
        } else {
            self.raw(&[0xdf]).raw(&(n as u32).to_be_bytes())
        }
    }
    fn opt_str(&mut self, s: Option<&str>) -> &mut Self {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }
    fn opt_uint(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            Some(v) => self.uint(v),
            None => self.nil(),
        }
    }
    fn uints(&mut self, vs: &[u64]) -> &mut Self {
        self.array(vs.len());
        for &v in vs {
            self.uint(v);
        }
        self
    }
}

// ---------------------------------------------------------------------------
// A model of events, its encodings, and what decoding must give.
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Hash {
    Uint(u64),
    Neg(i64),
    Bin(Vec<u8>),
}

impl Hash {
    fn expected(&self) -> u64 {
        match self {
            Hash::Uint(v) => *v,
            Hash::Neg(v) => *v as u64,
            Hash::Bin(b) => b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)),
        }
    }
    fn encode(&self, e: &mut Enc) {
        match self {
            Hash::Uint(v) => e.uint(*v),
            Hash::Neg(v) => e.int(*v),
            Hash::Bin(b) => e.bin(b),
        };
    }
}

/// An arbitrary msgpack value, for unknown fields and keys.
#[derive(Clone, Debug)]
enum Junk {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Ext(Vec<u8>),
    Array(Vec<Junk>),
    Map(Vec<(Junk, Junk)>),
}

impl Junk {
    fn encode(&self, e: &mut Enc) {
        match self {
            Junk::Nil => {
                e.nil();
            }
            Junk::Bool(b) => {
                e.boolean(*b);
            }
            Junk::Int(v) => {
                e.int(*v);
            }
            Junk::Float(v) => {
                e.f64(*v);
            }
            Junk::Str(s) => {
                e.str(s);
            }
            Junk::Bin(b) => {
                e.bin(b);
            }
            Junk::Ext(b) => {
                // fixext of 1/2/4/8/16 or ext 8.
                match b.len() {
                    1 => e.raw(&[0xd4, 7]),
                    2 => e.raw(&[0xd5, 7]),
                    4 => e.raw(&[0xd6, 7]),
                    8 => e.raw(&[0xd7, 7]),
                    16 => e.raw(&[0xd8, 7]),
                    n => e.raw(&[0xc7, n as u8, 7]),
                };
                e.raw(b);
            }
            Junk::Array(items) => {
                e.array(items.len());
                for item in items {
                    item.encode(e);
                }
            }
            Junk::Map(entries) => {
                e.map(entries.len());
                for (k, v) in entries {
                    k.encode(e);
                    v.encode(e);
                }
            }
        }
    }
}

fn junk() -> impl Strategy<Value = Junk> {
    let leaf = prop_oneof![
        Just(Junk::Nil),
        any::<bool>().prop_map(Junk::Bool),
        any::<i64>().prop_map(Junk::Int),
        any::<f64>().prop_map(Junk::Float),
        "[a-z_]{0,40}".prop_map(Junk::Str),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Junk::Bin),
        prop::collection::vec(any::<u8>(), 0..20).prop_map(Junk::Ext),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Junk::Array),
            prop::collection::vec((inner.clone(), inner), 0..4).prop_map(Junk::Map),
        ]
    })
}

#[derive(Clone, Debug)]
struct Stored {
    hashes: Vec<Hash>,
    parent: Option<Hash>,
    block_size: u32,
    tokens: Vec<u32>,
    lora_id: Option<i64>,
    medium: Option<&'static str>,
    lora_name: Option<String>,
    salt: Option<String>,
    group_idx: Option<u32>,
    kind: Option<&'static str>,
}

#[derive(Clone, Debug)]
enum Ev {
    Stored(Stored),
    Removed { hashes: Vec<Hash>, medium: Option<&'static str>, group_idx: Option<u32> },
    Cleared,
    Unknown { name: &'static str, fields: Vec<Junk> },
}

#[derive(Clone, Debug)]
struct Case {
    ts: f64,
    /// None: no dp_rank element/key; Some(None): nil.
    dp_rank: Option<Option<u32>>,
    map_envelope: bool,
    events: Vec<(Ev, Form)>,
}

/// How one event is encoded.
#[derive(Clone, Debug)]
struct Form {
    map: bool,
    /// Extra trailing positional fields, or unknown keys in map form.
    extra: Vec<Junk>,
    /// Rotation of the map keys (the `type` key included).
    rotate: usize,
}

const MEDIA: &[&str] = &["GPU", "gpu", "CPU", "STORAGE", "DISK", "CPU_TIER1"];
const KINDS: &[&str] = &["full_attention", "mla_attention", "sliding_window", "mamba", "future_kind"];

fn hash() -> impl Strategy<Value = Hash> {
    prop_oneof![
        any::<u64>().prop_map(Hash::Uint),
        (i64::MIN..0).prop_map(Hash::Neg),
        prop::collection::vec(any::<u8>(), 32).prop_map(Hash::Bin),
        prop::collection::vec(any::<u8>(), 1..=MAX_HASH_BYTES).prop_map(Hash::Bin),
    ]
}

fn stored() -> impl Strategy<Value = Stored> {
    (
        prop::collection::vec(hash(), 0..5),
        prop::option::of(hash()),
        1u32..=5,
        any::<u64>(),
        prop::option::of(any::<i64>()),
        prop::option::of(prop::sample::select(MEDIA)),
        prop::option::of("[a-z0-9-]{1,12}"),
        prop::option::of("[a-z0-9-]{1,12}"),
        prop::option::of(0u32..4),
        prop::option::of(prop::sample::select(KINDS)),
    )
        .prop_map(|(hashes, parent, block_size, seed, lora_id, medium, lora_name, salt, group_idx, kind)| {
            let mut rng = fastrand::Rng::with_seed(seed);
            let tokens = (0..hashes.len() * block_size as usize)
                .map(|_| match rng.u8(..) {
                    0..=200 => rng.u32(..200_000),
                    _ => rng.u32(..),
                })
                .collect();
            Stored { hashes, parent, block_size, tokens, lora_id, medium, lora_name, salt, group_idx, kind }
        })
}

fn event() -> impl Strategy<Value = Ev> {
    prop_oneof![
        4 => stored().prop_map(Ev::Stored),
        2 => (
            prop::collection::vec(hash(), 0..5),
            prop::option::of(prop::sample::select(MEDIA)),
            prop::option::of(0u32..4)
        )
            .prop_map(|(hashes, medium, group_idx)| Ev::Removed { hashes, medium, group_idx }),
        1 => Just(Ev::Cleared),
        1 => (prop::sample::select(&["BlockTouched", "Foo", ""][..]), prop::collection::vec(junk(), 0..4))
            .prop_map(|(name, fields)| Ev::Unknown { name, fields }),
    ]
}

fn form() -> impl Strategy<Value = Form> {
    (any::<bool>(), prop::collection::vec(junk(), 0..3), 0usize..16).prop_map(|(map, extra, rotate)| Form {
        map,
        extra,
        rotate,
    })
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<f64>().prop_filter("finite", |v| v.is_finite()),
        prop::option::of(prop::option::of(any::<u32>())),
        any::<bool>(),
        prop::collection::vec((event(), form()), 0..8),
    )
        .prop_map(|(ts, dp_rank, map_envelope, events)| Case { ts, dp_rank, map_envelope, events })
}

/// A map event: entries as (key, encoded value), rotated, plus unknown keys.
fn encode_map_event(e: &mut Enc, mut entries: Vec<(String, Vec<u8>)>, form: &Form) {
    for (i, j) in form.extra.iter().enumerate() {
        let mut v = Enc::new();
        j.encode(&mut v);
        entries.push((format!("unknown_{i}"), v.bytes()));
    }
    let len = entries.len();
    entries.rotate_left(form.rotate % len.max(1));
    e.map(len);
    for (k, v) in entries {
        e.str(&k).raw(&v);
    }
}

fn value(f: impl FnOnce(&mut Enc)) -> Vec<u8> {
    let mut e = Enc::new();
    f(&mut e);
    e.bytes()
}

fn hashes_value(hashes: &[Hash]) -> Vec<u8> {
    value(|e| {
        e.array(hashes.len());
        for h in hashes {
            h.encode(e);
        }
    })
}

/// Encodes one event; in positional form, a salt rides in position 7 (SGLang
/// metadata map) when there is no LoRA name, else in the first block's
/// `extra_keys`; the strategy only makes salts that can be expressed.
fn encode_event(e: &mut Enc, ev: &Ev, form: &Form) {
    match (ev, form.map) {
        (Ev::Stored(s), false) => {
            let extra_keys = s.salt.as_ref().filter(|_| s.lora_name.is_some());
            let mut last = 4;
            if s.lora_id.is_some() {
                last = 5;
            }
            if s.medium.is_some() {
                last = 6;
            }
            if s.lora_name.is_some() || s.salt.is_some() {
                last = 7;
            }
            if extra_keys.is_some() {
                last = 8;
            }
            if s.group_idx.is_some() {
                last = 9;
            }
            if s.kind.is_some() {
                last = 10;
            }
            let extra = if last == 10 { form.extra.len() } else { 0 };
            e.array(last + 1 + extra).str("BlockStored").raw(&hashes_value(&s.hashes));
            match &s.parent {
                Some(h) => h.encode(e),
                None => {
                    e.nil();
                }
            }
            e.uints(&s.tokens.iter().map(|&t| u64::from(t)).collect::<Vec<_>>()).uint(u64::from(s.block_size));
            for pos in 5..=last {
                match pos {
                    5 => match s.lora_id {
                        Some(v) => e.int(v),
                        None => e.nil(),
                    },
                    6 => e.opt_str(s.medium),
                    7 => match (&s.lora_name, &s.salt) {
                        (Some(name), _) => e.str(name),
                        (None, Some(salt)) => e.map(1).str("cache_salt").str(salt),
                        (None, None) => e.nil(),
                    },
                    8 => match extra_keys {
                        // [[lora, ["mm", 0], salt, <embeds digest>], None...]
                        Some(salt) => e
                            .array(2)
                            .array(4)
                            .opt_str(s.lora_name.as_deref())
                            .array(2)
                            .str("mm-hash")
                            .uint(0)
                            .str(salt)
                            .bin(&[9; 32])
                            .nil(),
                        None => e.nil(),
                    },
                    9 => e.opt_uint(s.group_idx.map(u64::from)),
                    _ => e.opt_str(s.kind),
                };
            }
            for j in form.extra.iter().take(extra) {
                j.encode(e);
            }
        }
        (Ev::Stored(s), true) => {
            let mut entries = vec![
                (
                    "type".to_owned(),
                    value(|e| {
                        e.str("BlockStored");
                    }),
                ),
                ("block_hashes".to_owned(), hashes_value(&s.hashes)),
                (
                    "parent_block_hash".to_owned(),
                    value(|e| match &s.parent {
                        Some(h) => h.encode(e),
                        None => {
                            e.nil();
                        }
                    }),
                ),
                (
                    "token_ids".to_owned(),
                    value(|e| {
                        e.uints(&s.tokens.iter().map(|&t| u64::from(t)).collect::<Vec<_>>());
                    }),
                ),
                (
                    "block_size".to_owned(),
                    value(|e| {
                        e.uint(u64::from(s.block_size));
                    }),
                ),
                (
                    "lora_id".to_owned(),
                    value(|e| match s.lora_id {
                        Some(v) => {
                            e.int(v);
                        }
                        None => {
                            e.nil();
                        }
                    }),
                ),
                (
                    "medium".to_owned(),
                    value(|e| {
                        e.opt_str(s.medium);
                    }),
                ),
                (
                    "lora_name".to_owned(),
                    value(|e| {
                        e.opt_str(s.lora_name.as_deref());
                    }),
                ),
            ];
            if let Some(salt) = &s.salt {
                entries.push((
                    "cache_salt".to_owned(),
                    value(|e| {
                        e.str(salt);
                    }),
                ));
            }
            if let Some(g) = s.group_idx {
                entries.push((
                    "group_idx".to_owned(),
                    value(|e| {
                        e.uint(u64::from(g));
                    }),
                ));
            }
            if let Some(k) = s.kind {
                entries.push((
                    "kv_cache_spec_kind".to_owned(),
                    value(|e| {
                        e.str(k);
                    }),
                ));
            }
            encode_map_event(e, entries, form);
        }
        (Ev::Removed { hashes, medium, group_idx }, false) => {
            let last = if group_idx.is_some() { 3 } else { 2 };
            let extra = if last == 3 { form.extra.len().min(1) } else { 0 };
            e.array(last + 1 + extra).str("BlockRemoved").raw(&hashes_value(hashes)).opt_str(*medium);
            if last == 3 {
                e.opt_uint(group_idx.map(u64::from));
            }
            if extra == 1 {
                // Position 4 is the kind; a trailing str there must be one.
                e.str("full_attention");
            }
        }
        (Ev::Removed { hashes, medium, group_idx }, true) => {
            let mut entries = vec![
                (
                    "type".to_owned(),
                    value(|e| {
                        e.str("BlockRemoved");
                    }),
                ),
                ("block_hashes".to_owned(), hashes_value(hashes)),
                (
                    "medium".to_owned(),
                    value(|e| {
                        e.opt_str(*medium);
                    }),
                ),
            ];
            if let Some(g) = group_idx {
                entries.push((
                    "group_idx".to_owned(),
                    value(|e| {
                        e.uint(u64::from(*g));
                    }),
                ));
            }
            encode_map_event(e, entries, form);
        }
        (Ev::Cleared, false) => {
            e.array(1 + form.extra.len()).str("AllBlocksCleared");
            for j in &form.extra {
                j.encode(e);
            }
        }
        (Ev::Cleared, true) => encode_map_event(
            e,
            vec![(
                "type".to_owned(),
                value(|e| {
                    e.str("AllBlocksCleared");
                }),
            )],
            form,
        ),
        (Ev::Unknown { name, fields }, false) => {
            e.array(1 + fields.len()).str(name);
            for j in fields {
                j.encode(e);
            }
        }
        (Ev::Unknown { name, fields }, true) => {
            let mut entries = vec![(
                "type".to_owned(),
                value(|e| {
                    e.str(name);
                }),
            )];
            for (i, j) in fields.iter().enumerate() {
                entries.push((format!("block_hashes{i}"), value(|e| j.encode(e))));
            }
            encode_map_event(e, entries, form);
        }
    }
}

fn encode_case(c: &Case) -> Vec<u8> {
    let mut e = Enc::new();
    let dp = |e: &mut Enc, dp: Option<u32>| {
        e.opt_uint(dp.map(u64::from));
    };
    let events = |e: &mut Enc| {
        e.array(c.events.len());
        for (ev, form) in &c.events {
            encode_event(e, ev, form);
        }
    };
    if c.map_envelope {
        e.map(2 + usize::from(c.dp_rank.is_some()));
        e.str("events");
        events(&mut e);
        if let Some(rank) = c.dp_rank {
            e.str("data_parallel_rank");
            dp(&mut e, rank);
        }
        e.str("ts").f64(c.ts);
    } else {
        e.array(2 + usize::from(c.dp_rank.is_some())).f64(c.ts);
        events(&mut e);
        if let Some(rank) = c.dp_rank {
            dp(&mut e, rank);
        }
    }
    e.bytes()
}

fn medium_of(s: &str) -> Medium {
    match s.to_ascii_uppercase().as_str() {
        "GPU" => Medium::Gpu,
        "CPU" => Medium::Cpu,
        "STORAGE" | "DISK" => Medium::Disk,
        _ => Medium::Other(s.to_owned()),
    }
}

fn expected(c: &Case) -> DecodedBatch {
    let mut batch = DecodedBatch {
        ts: c.ts,
        dp_rank: c.dp_rank.flatten(),
        events: Vec::new(),
        skipped_unknown: 0,
        malformed: vec![],
    };
    for (ev, form) in &c.events {
        let decoded = match ev {
            Ev::Stored(s) => {
                // A positional salt alongside a LoRA name travels in
                // extra_keys, which only speak for prompt-starting events.
                let salt = if !form.map && s.lora_name.is_some() && s.parent.is_some() { None } else { s.salt.clone() };
                DecodedEvent {
                    event: KvEvent::Stored {
                        block_hashes: s.hashes.iter().map(Hash::expected).collect(),
                        parent: s.parent.as_ref().map(Hash::expected),
                        token_ids: s.tokens.clone(),
                        block_size: s.block_size,
                        seed: HashSeed::new(s.lora_name.as_deref(), salt.as_deref()),
                    },
                    medium: s.medium.map(medium_of),
                    lora_name: s.lora_name.clone(),
                    lora_id: s.lora_id,
                    cache_salt: salt,
                    group_idx: s.group_idx,
                    kv_cache_spec_kind: s.kind.map(KvCacheSpecKind::from_wire),
                }
            }
            Ev::Removed { hashes, medium, group_idx } => DecodedEvent {
                event: KvEvent::Removed { block_hashes: hashes.iter().map(Hash::expected).collect() },
                medium: medium.map(medium_of),
                lora_name: None,
                lora_id: None,
                cache_salt: None,
                group_idx: *group_idx,
                kv_cache_spec_kind: (!form.map && group_idx.is_some() && !form.extra.is_empty())
                    .then_some(KvCacheSpecKind::FullAttention),
            },
            Ev::Cleared => DecodedEvent {
                event: KvEvent::Cleared,
                medium: None,
                lora_name: None,
                lora_id: None,
                cache_salt: None,
                group_idx: None,
                kv_cache_spec_kind: None,
            },
            Ev::Unknown { .. } => {
                batch.skipped_unknown += 1;
                continue;
            }
        };
        batch.events.push(decoded);
    }
    batch
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn decode_inverts_encode(c in case()) {
        let bytes = encode_case(&c);
        let got = decode_batch(&bytes);
        prop_assert_eq!(got, Ok(expected(&c)));
    }

    #[test]
    fn strict_prefixes_are_errors(c in case()) {
        let bytes = encode_case(&c);
        for len in 0..bytes.len() {
            prop_assert!(decode_batch(&bytes[..len]).is_err());
        }
    }

    #[test]
    fn mutated_payloads_never_panic(c in case(), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut bytes = encode_case(&c);
        for (at, b) in flips {
            if !bytes.is_empty() {
                let i = at % bytes.len();
                bytes[i] = b;
            }
        }
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(batch) = decode_batch(&bytes) {
            // Whatever decodes was really there.
            prop_assert!(batch.events.len() + batch.malformed.len() <= bytes.len());
        }
    }
}

// ---------------------------------------------------------------------------
// Helpers for hand-written cases.
// ---------------------------------------------------------------------------

/// `[1.5, [<events>], 0]`.
fn batch_of(events: &[Vec<u8>]) -> Vec<u8> {
    let mut e = Enc::new();
    e.array(3).f64(1.5).array(events.len());
    for ev in events {
        e.raw(ev);
    }
    e.uint(0);
    e.bytes()
}

fn one(event: Vec<u8>) -> Result<DecodedBatch, WireError> {
    decode_batch(&batch_of(&[event]))
}

/// The single event of a batch, which must have decoded.
fn only(event: Vec<u8>) -> DecodedEvent {
    let batch = one(event).expect("batch decodes");
    assert!(batch.malformed.is_empty(), "{:?}", batch.malformed);
    assert_eq!(batch.events.len(), 1);
    batch.events.into_iter().next().expect("one event")
}

/// The error of the single event of a batch, which must have been dropped.
fn event_error(event: Vec<u8>) -> WireError {
    let batch = one(event).expect("batch decodes");
    assert!(batch.events.is_empty(), "{:?}", batch.events);
    assert_eq!(batch.malformed.len(), 1);
    batch.malformed[0].error.clone()
}

fn stored_array(hashes: &[u64], parent: Option<u64>, tokens: &[u64], block_size: u64) -> Enc {
    let mut e = Enc::new();
    e.array(5).str("BlockStored").uints(hashes).opt_uint(parent).uints(tokens).uint(block_size);
    e
}

fn simple_stored() -> Vec<u8> {
    stored_array(&[1], None, &[1, 2], 2).bytes()
}

fn stored_with(f: impl FnOnce(&mut Enc)) -> Vec<u8> {
    // BlockStored map with the required fields, plus whatever `f` adds
    // (`f` must add exactly one entry).
    let mut e = Enc::new();
    e.map(5).str("type").str("BlockStored").str("block_hashes").uints(&[1]).str("token_ids").uints(&[1, 2]);
    e.str("block_size").uint(2);
    f(&mut e);
    e.bytes()
}

// ---------------------------------------------------------------------------
// Envelope.
// ---------------------------------------------------------------------------

#[test]
fn batch_forms() {
    let ev = simple_stored();
    // [ts, events]
    let mut e = Enc::new();
    e.array(2).f64(2.5).array(1).raw(&ev);
    let b = decode_batch(&e.bytes()).expect("2 elements");
    assert_eq!((b.ts, b.dp_rank, b.events.len()), (2.5, None, 1));
    // [ts, events, nil]
    let mut e = Enc::new();
    e.array(3).f64(2.5).array(1).raw(&ev).nil();
    assert_eq!(decode_batch(&e.bytes()).expect("nil rank").dp_rank, None);
    // [ts, events, rank, trailing...], integer and f32 timestamps.
    let mut e = Enc::new();
    e.array(5).uint(7).array(0).uint(u64::from(u32::MAX)).str("later").map(0);
    let b = decode_batch(&e.bytes()).expect("trailing fields");
    assert_eq!((b.ts, b.dp_rank), (7.0, Some(u32::MAX)));
    let mut e = Enc::new();
    e.array(2).f32(0.5).array(0);
    assert_eq!(decode_batch(&e.bytes()).expect("f32").ts, 0.5);
    // Map envelope, any key order, unknown keys (even container keys).
    let mut e = Enc::new();
    e.map(5).array(1).uint(1).uint(2).str("data_parallel_rank").uint(4).str("events").array(1).raw(&ev);
    e.str("extra").map(1).str("k").array(0).str("ts").int(-3);
    let b = decode_batch(&e.bytes()).expect("map envelope");
    assert_eq!((b.ts, b.dp_rank, b.events.len()), (-3.0, Some(4), 1));
}

#[test]
fn envelope_errors_fail_the_batch() {
    let mut cases: Vec<(Vec<u8>, WireError)> = vec![
        (vec![], WireError::Truncated { offset: 0, what: "batch" }),
        (vec![0xc1], WireError::InvalidMarker { offset: 0, marker: 0xc1 }),
        (vec![0x07], WireError::UnexpectedType { offset: 0, what: "batch", expected: "array or map", found: "int" }),
        (vec![0x90], WireError::MissingField { offset: 0, what: "batch", field: "ts" }),
        (
            value(|e| {
                e.array(1).f64(1.0);
            }),
            WireError::MissingField { offset: 0, what: "batch", field: "events" },
        ),
        (
            value(|e| {
                e.array(2).str("x").array(0);
            }),
            WireError::UnexpectedType { offset: 1, what: "ts", expected: "float", found: "str" },
        ),
        (
            value(|e| {
                e.array(2).f64(1.0).map(0);
            }),
            WireError::UnexpectedType { offset: 10, what: "events", expected: "array", found: "map" },
        ),
        (
            value(|e| {
                e.array(3).f64(1.0).array(0).int(-1);
            }),
            WireError::OutOfRange { offset: 11, what: "data_parallel_rank", value: -1 },
        ),
        (
            value(|e| {
                e.array(3).f64(1.0).array(0).uint(1 << 32);
            }),
            WireError::OutOfRange { offset: 11, what: "data_parallel_rank", value: 1 << 32 },
        ),
        (
            value(|e| {
                e.array(3).f64(1.0).array(0).str("0");
            }),
            WireError::UnexpectedType { offset: 11, what: "data_parallel_rank", expected: "int or nil", found: "str" },
        ),
        (
            value(|e| {
                e.array(2).f64(1.0).array(0).nil();
            }),
            WireError::TrailingBytes { offset: 11, len: 1 },
        ),
        (
            value(|e| {
                e.map(1).str("ts").f64(1.0);
            }),
            WireError::MissingField { offset: 0, what: "batch", field: "events" },
        ),
        (
            value(|e| {
                e.map(1).str("events").array(0);
            }),
            WireError::MissingField { offset: 0, what: "batch", field: "ts" },
        ),
        // An array header claiming more elements than bytes left.
        (vec![0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0], WireError::Truncated { offset: 0, what: "batch" }),
        (vec![0xdf, 0x00, 0x00, 0x00, 0x02, 0xc0, 0xc0, 0xc0], WireError::Truncated { offset: 0, what: "batch" }),
    ];
    // Truncated inside a string, a float, a 32-bit length.
    cases.push((vec![0x92, 0xcb, 0x3f], WireError::Truncated { offset: 1, what: "ts" }));
    cases.push((
        value(|e| {
            e.map(1).raw(&[0xa5]).raw(b"ts");
        }),
        WireError::Truncated { offset: 1, what: "batch key" },
    ));
    cases.push((vec![0x92, 0xc6, 0, 0], WireError::Truncated { offset: 1, what: "ts" }));
    for (bytes, want) in cases {
        assert_eq!(decode_batch(&bytes), Err(want.clone()), "{bytes:02x?}");
        assert!(!want.to_string().is_empty());
    }
}

#[test]
fn error_offsets_and_messages() {
    let err = WireError::TooLong { offset: 12, what: "token_ids", len: 9, limit: 8 };
    assert_eq!(err.offset(), 12);
    assert_eq!(err.to_string(), "token_ids at byte 12: length 9 is over the limit of 8");
    let err = WireError::InvalidMarker { offset: 3, marker: 0xc1 };
    assert_eq!(err.to_string(), "reserved msgpack marker 0xc1 at byte 3");
}

#[test]
fn too_many_events_is_a_batch_error() {
    let n = MAX_EVENTS_PER_BATCH + 1;
    let mut e = Enc::new();
    e.array(2).f64(0.0).array(n);
    e.raw(&vec![0xc0; n]);
    let err = decode_batch(&e.bytes()).expect_err("over the limit");
    assert_eq!(err, WireError::TooLong { offset: 10, what: "events", len: n, limit: MAX_EVENTS_PER_BATCH });
}

#[test]
fn many_tiny_events() {
    // The smallest events there are: unknown-type `["x"]`, 3 bytes each.
    let n = 1 << 12;
    let mut e = Enc::new();
    e.array(2).f64(0.0).array(n);
    for _ in 0..n {
        e.array(1).str("x");
    }
    let batch = decode_batch(&e.bytes()).expect("decodes");
    assert_eq!(batch.skipped_unknown as usize, n);
}

// ---------------------------------------------------------------------------
// Per-event errors.
// ---------------------------------------------------------------------------

#[test]
fn bad_event_is_dropped_alone() {
    let bad = stored_array(&[1], None, &[1, 2, 3], 2).bytes();
    let batch = decode_batch(&batch_of(&[simple_stored(), bad, simple_stored()])).expect("batch survives");
    assert_eq!(batch.events.len(), 2);
    assert_eq!(batch.malformed.len(), 1);
    assert_eq!(batch.malformed[0].index, 1);
    assert!(matches!(
        batch.malformed[0].error,
        WireError::TokenCountMismatch { blocks: 1, block_size: 2, tokens: 3, .. }
    ));
}

#[test]
fn broken_msgpack_inside_an_event_fails_the_batch() {
    // A reserved marker inside an event: the event cannot be skipped.
    let mut bad = Enc::new();
    bad.array(2).str("BlockStored").raw(&[0xc1]);
    let err = one(bad.bytes()).expect_err("batch fails");
    assert_eq!(err, WireError::InvalidMarker { offset: 24, marker: 0xc1 });
    // An event array claiming more fields than the batch holds.
    let mut bad = Enc::new();
    bad.raw(&[0xdc, 0x01, 0x00]).str("BlockStored");
    assert!(matches!(one(bad.bytes()), Err(WireError::Truncated { .. })));
}

#[test]
fn event_errors() {
    let cases: Vec<(Vec<u8>, WireError)> = vec![
        (
            value(|e| {
                e.nil();
            }),
            WireError::UnexpectedType { offset: 11, what: "event", expected: "array or map", found: "nil" },
        ),
        (
            value(|e| {
                e.array(0);
            }),
            WireError::MissingField { offset: 11, what: "event", field: "type" },
        ),
        (
            value(|e| {
                e.array(1).uint(3);
            }),
            WireError::UnexpectedType { offset: 12, what: "event type", expected: "str", found: "int" },
        ),
        (
            value(|e| {
                e.map(1).str("block_hashes").array(0);
            }),
            WireError::MissingField { offset: 11, what: "event", field: "type" },
        ),
        (
            value(|e| {
                e.map(1).str("type").uint(1);
            }),
            WireError::UnexpectedType { offset: 17, what: "event type", expected: "str", found: "int" },
        ),
        (
            value(|e| {
                e.map(2).str("x").nil().str("type").nil();
            }),
            WireError::UnexpectedType { offset: 20, what: "event type", expected: "str", found: "nil" },
        ),
        (
            value(|e| {
                e.array(1).str("BlockStored");
            }),
            WireError::MissingField { offset: 11, what: "event", field: "block_hashes" },
        ),
        (
            value(|e| {
                e.array(3).str("BlockStored").uints(&[]).nil();
            }),
            WireError::MissingField { offset: 11, what: "event", field: "token_ids" },
        ),
        (
            value(|e| {
                e.array(4).str("BlockStored").uints(&[]).nil().uints(&[]);
            }),
            WireError::MissingField { offset: 11, what: "event", field: "block_size" },
        ),
        (
            value(|e| {
                e.array(1).str("BlockRemoved");
            }),
            WireError::MissingField { offset: 11, what: "event", field: "block_hashes" },
        ),
        (
            value(|e| {
                e.array(2).str("BlockRemoved").nil();
            }),
            WireError::UnexpectedType { offset: 25, what: "block_hashes", expected: "array", found: "nil" },
        ),
        (
            value(|e| {
                e.array(2).str("BlockRemoved").array(1).f64(1.0);
            }),
            WireError::UnexpectedType { offset: 26, what: "block hash", expected: "int or bin", found: "float" },
        ),
        (
            value(|e| {
                e.array(2).str("BlockRemoved").array(1).str("abc");
            }),
            WireError::UnexpectedType { offset: 26, what: "block hash", expected: "int or bin", found: "str" },
        ),
        (
            value(|e| {
                e.array(2).str("BlockRemoved").array(1).bin(&[]);
            }),
            WireError::BadHashLength { offset: 26, len: 0 },
        ),
        (
            value(|e| {
                e.array(2).str("BlockRemoved").array(1).bin(&[1; 65]);
            }),
            WireError::BadHashLength { offset: 26, len: 65 },
        ),
        (
            value(|e| {
                e.array(3).str("BlockRemoved").uints(&[]).uint(1);
            }),
            WireError::UnexpectedType { offset: 26, what: "medium", expected: "str or nil", found: "int" },
        ),
        (
            value(|e| {
                e.array(4).str("BlockRemoved").uints(&[]).nil().str("0");
            }),
            WireError::UnexpectedType { offset: 27, what: "group_idx", expected: "int or nil", found: "str" },
        ),
        (
            value(|e| {
                e.array(4).str("BlockRemoved").uints(&[]).nil().uint(1 << 32);
            }),
            WireError::OutOfRange { offset: 27, what: "group_idx", value: 1 << 32 },
        ),
        (
            value(|e| {
                e.array(4).str("BlockRemoved").uints(&[]).nil().int(-1);
            }),
            WireError::OutOfRange { offset: 27, what: "group_idx", value: -1 },
        ),
        (
            value(|e| {
                e.array(5).str("BlockRemoved").uints(&[]).nil().nil().uint(3);
            }),
            WireError::UnexpectedType { offset: 28, what: "kv_cache_spec_kind", expected: "str or nil", found: "int" },
        ),
        (
            stored_array(&[1], None, &[1, 1 << 32], 2).bytes(),
            WireError::OutOfRange { offset: 29, what: "token id", value: 1 << 32 },
        ),
        (
            value(|e| {
                e.array(5).str("BlockStored").uints(&[1]).nil().array(2).uint(1).int(-5).uint(2);
            }),
            WireError::OutOfRange { offset: 29, what: "token id", value: -5 },
        ),
        (
            value(|e| {
                e.array(5).str("BlockStored").uints(&[1]).nil().array(2).uint(1).str("x").uint(2);
            }),
            WireError::UnexpectedType { offset: 29, what: "token id", expected: "int", found: "str" },
        ),
        (
            value(|e| {
                e.array(5)
                    .str("BlockStored")
                    .uints(&[1])
                    .nil()
                    .array(2)
                    .uint(1)
                    .array(3)
                    .uint(1)
                    .uint(2)
                    .uint(3)
                    .uint(2);
            }),
            WireError::UnexpectedType { offset: 29, what: "token id", expected: "int", found: "array" },
        ),
        (
            value(|e| {
                e.array(5).str("BlockStored").uints(&[1]).nil().str("1 2").uint(2);
            }),
            WireError::UnexpectedType { offset: 27, what: "token_ids", expected: "array", found: "str" },
        ),
        (
            stored_array(&[1], None, &[1, 2], 1 << 32).bytes(),
            WireError::OutOfRange { offset: 30, what: "block_size", value: 1 << 32 },
        ),
        (
            value(|e| {
                e.array(5).str("BlockStored").uints(&[1]).nil().uints(&[1]).int(-1);
            }),
            WireError::OutOfRange { offset: 29, what: "block_size", value: -1 },
        ),
        (
            value(|e| {
                e.array(5).str("BlockStored").uints(&[1]).nil().uints(&[1]).nil();
            }),
            WireError::UnexpectedType { offset: 29, what: "block_size", expected: "int", found: "nil" },
        ),
        (
            value(|e| {
                e.array(3).str("BlockStored").uints(&[1]).str("p");
            }),
            WireError::UnexpectedType { offset: 26, what: "block hash", expected: "int or bin", found: "str" },
        ),
        (
            stored_with(|e| {
                e.str("lora_id").uint(u64::MAX);
            }),
            WireError::OutOfRange { offset: 77, what: "lora_id", value: i128::from(u64::MAX) },
        ),
        (
            stored_with(|e| {
                e.str("lora_id").str("1");
            }),
            WireError::UnexpectedType { offset: 77, what: "lora_id", expected: "int or nil", found: "str" },
        ),
        (
            stored_with(|e| {
                e.str("lora_name").uint(1);
            }),
            WireError::UnexpectedType { offset: 79, what: "lora_name", expected: "str or nil", found: "int" },
        ),
        (
            value(|e| {
                let mut s = stored_array(&[1], None, &[1, 2], 2);
                s.buf[0] = 0x98;
                e.raw(&s.bytes()).nil().nil().uint(7);
            }),
            WireError::UnexpectedType { offset: 33, what: "lora_name", expected: "str, map or nil", found: "int" },
        ),
        (
            stored_with(|e| {
                e.str("lora_name").str_bytes(&[0xff, 0xfe]);
            }),
            WireError::InvalidUtf8 { offset: 79, what: "lora_name" },
        ),
        (
            stored_with(|e| {
                e.str("cache_salt").str(&"s".repeat(MAX_NAME_LEN + 1));
            }),
            WireError::TooLong { offset: 80, what: "cache_salt", len: MAX_NAME_LEN + 1, limit: MAX_NAME_LEN },
        ),
        (
            stored_array(&[1], None, &[1, 2], 0).bytes(),
            WireError::TokenCountMismatch { offset: 11, blocks: 1, block_size: 0, tokens: 2 },
        ),
    ];
    let wrong: Vec<String> = cases
        .into_iter()
        .filter_map(|(event, want)| {
            let got = event_error(event.clone());
            (got != want).then(|| format!("{event:02x?}\n  got  {got:?}\n  want {want:?}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn names_at_the_limit_are_fine() {
    let name = "n".repeat(MAX_NAME_LEN);
    let ev = only(stored_with(|e| {
        e.str("lora_name").str(&name);
    }));
    assert_eq!(ev.lora_name.as_deref(), Some(name.as_str()));
}

#[test]
fn too_many_blocks_or_tokens_drop_the_event() {
    let n = MAX_BLOCKS_PER_EVENT + 1;
    let mut e = Enc::new();
    e.array(2).str("BlockRemoved").array(n).raw(&vec![0x01; n]);
    assert_eq!(
        event_error(e.bytes()),
        WireError::TooLong { offset: 25, what: "block_hashes", len: n, limit: MAX_BLOCKS_PER_EVENT }
    );
    let n = MAX_TOKENS_PER_EVENT + 1;
    let mut e = Enc::new();
    e.array(5).str("BlockStored").uints(&[1]).nil().array(n).raw(&vec![0x01; n]).uint(1);
    assert_eq!(
        event_error(e.bytes()),
        WireError::TooLong { offset: 27, what: "token_ids", len: n, limit: MAX_TOKENS_PER_EVENT }
    );
}

#[test]
fn token_count_is_checked_only_for_full_attention() {
    // A sliding-window group's tokens may span more than its blocks.
    let mut e = stored_array(&[1], None, &[1, 2, 3], 2);
    e.buf[0] = 0x9b;
    e.nil().nil().nil().nil().uint(1).str("sliding_window");
    let ev = only(e.bytes());
    assert_eq!(ev.full_attention(), Some(false));
    // Group 1 without a kind: undecided, not checked either.
    let mut e = stored_array(&[1], None, &[1, 2, 3], 2);
    e.buf[0] = 0x9a;
    e.nil().nil().nil().nil().uint(1);
    assert_eq!(only(e.bytes()).full_attention(), None);
    // Group 0 without a kind is full attention: checked.
    let mut e = stored_array(&[1], None, &[1, 2, 3], 2);
    e.buf[0] = 0x9a;
    e.nil().nil().nil().nil().uint(0);
    assert!(matches!(event_error(e.bytes()), WireError::TokenCountMismatch { .. }));
}

// ---------------------------------------------------------------------------
// Unknown types and fields.
// ---------------------------------------------------------------------------

#[test]
fn unknown_types_are_skipped_and_counted() {
    let mut arr = Enc::new();
    arr.array(3).str("BlockTouched").map(1).str("a").array(2).nil().bin(&[1, 2]).uint(5);
    let mut map_first = Enc::new();
    map_first.map(2).str("type").str("Pinned").str("block_hashes").str("not even hashes");
    let mut map_later = Enc::new();
    map_later.map(3).str("block_hashes").array(1).str("x").array(1).uint(1).nil().str("type").str("Pinned");
    let batch = decode_batch(&batch_of(&[arr.bytes(), simple_stored(), map_first.bytes(), map_later.bytes()]))
        .expect("decodes");
    assert_eq!((batch.events.len(), batch.skipped_unknown, batch.malformed.len()), (1, 3, 0));
}

#[test]
fn unknown_fields_and_trailing_positions_are_ignored() {
    let mut e = Enc::new();
    e.map(8).str("session_id").str("s").str("type").str("BlockStored").array(1).uint(1).map(1).nil().nil();
    e.str("block_hashes").uints(&[9]).str("token_ids").uints(&[1]).str("block_size").uint(1);
    e.str("kv_cache_spec_sliding_window").uint(128).str("mm_keys").array(1).array(1).map(1).str("hash").str("ab");
    let ev = only(e.bytes());
    assert_eq!(ev.block_hashes(), &[9]);
    // Positional with 20 elements, junk after position 10.
    let mut e = stored_array(&[1], None, &[1, 2], 2);
    e.buf[0] = 0xdc;
    e.buf.splice(1..1, [0, 20]);
    e.nil().str("GPU").nil().nil().uint(0).str("full_attention").uint(4096).str("LOCAL").map(0);
    for _ in 0..6 {
        e.array(1).f64(1.0);
    }
    let ev = only(e.bytes());
    assert_eq!((ev.group_idx, ev.medium), (Some(0), Some(Medium::Gpu)));
    // Cleared with trailing fields, both forms.
    let mut e = Enc::new();
    e.array(3).str("AllBlocksCleared").nil().str("owner");
    assert_eq!(only(e.bytes()).event, KvEvent::Cleared);
    let mut e = Enc::new();
    e.map(2).str("ownership").str("x").str("type").str("AllBlocksCleared");
    assert_eq!(only(e.bytes()).event, KvEvent::Cleared);
}

#[test]
fn deep_nesting_in_unknown_fields_is_skipped_without_recursion() {
    let depth = 200_000;
    let mut e = Enc::new();
    e.map(5).str("type").str("BlockStored").str("block_hashes").uints(&[1]).str("token_ids").uints(&[1]);
    e.str("block_size").uint(1).str("deep");
    e.raw(&vec![0x91; depth]).nil();
    assert_eq!(only(e.bytes()).block_hashes(), &[1]);
    // The same nesting as an unknown event.
    let mut e = Enc::new();
    e.array(2).str("Deep").raw(&vec![0x91; depth]).nil();
    assert_eq!(one(e.bytes()).expect("decodes").skipped_unknown, 1);
}

// ---------------------------------------------------------------------------
// Hashes, tokens, media, kinds.
// ---------------------------------------------------------------------------

#[test]
fn hash_encodings() {
    let mut e = Enc::new();
    e.array(2).str("BlockRemoved").array(9);
    e.int(-1).int(i64::MIN).uint(u64::MAX).uint_as(5, 4).uint_as(6, 5).uint_as(7, 1);
    let digest: Vec<u8> = (1..=32).collect();
    e.bin(&digest).bin(&[0xab, 0xcd, 0xef]).bin(&[0xff; 64]);
    let ev = only(e.bytes());
    assert_eq!(ev.block_hashes(), &[u64::MAX, 1 << 63, u64::MAX, 5, 6, 7, 0x191a_1b1c_1d1e_1f20, 0xab_cdef, u64::MAX]);
    // engines.md §1.5: the event int of a digest is its last 8 bytes.
    let mut digest = [0u8; 32];
    digest[24..].copy_from_slice(&2164874634404590027u64.to_be_bytes());
    digest[..4].copy_from_slice(&[0xc9, 0xd5, 0x8b, 0xa6]);
    let mut e = Enc::new();
    e.array(2).str("BlockRemoved").array(1).bin(&digest);
    assert_eq!(only(e.bytes()).block_hashes(), &[2164874634404590027]);
}

#[test]
fn eagle_bigram_tokens_keep_the_first() {
    let mut e = Enc::new();
    e.array(5).str("BlockStored").uints(&[1]).nil().array(2);
    e.array(2).uint(10).uint(11).array(2).uint(11).uint(12).uint(2);
    match only(e.bytes()).event {
        KvEvent::Stored { token_ids, .. } => assert_eq!(token_ids, [10, 11]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn media() {
    let medium = |s: &str| {
        let mut e = Enc::new();
        e.array(3).str("BlockRemoved").uints(&[]).str(s);
        only(e.bytes()).medium
    };
    assert_eq!(medium("GPU"), Some(Medium::Gpu));
    assert_eq!(medium("gpu"), Some(Medium::Gpu));
    assert_eq!(medium("CPU"), Some(Medium::Cpu));
    assert_eq!(medium("STORAGE"), Some(Medium::Disk));
    assert_eq!(medium("disk"), Some(Medium::Disk));
    assert_eq!(medium(""), None);
    assert_eq!(medium("CPU_TIER2"), Some(Medium::Other("CPU_TIER2".into())));
    let ev = only(value(|e| {
        e.array(3).str("BlockRemoved").uints(&[]).str("CPU");
    }));
    assert!(!ev.on_device());
    let ev = only(value(|e| {
        e.array(2).str("BlockRemoved").uints(&[]);
    }));
    assert!(ev.on_device());
}

#[test]
fn kinds() {
    for (name, full) in [
        ("full_attention", true),
        ("mla_attention", true),
        ("sink_full_attention", true),
        ("sliding_window", false),
        ("sliding_window_mla", false),
        ("chunked_local_attention", false),
        ("mamba", false),
        ("encoder_only_attention", false),
        ("cross_attention", false),
        ("something_new", false),
    ] {
        let kind = KvCacheSpecKind::from_wire(name);
        assert_eq!(kind.as_str(), name);
        assert_eq!(kind.is_full_attention(), full, "{name}");
    }
    assert_eq!(KvCacheSpecKind::from_wire("x"), KvCacheSpecKind::Other("x".into()));
    // An empty kind counts as absent.
    let mut e = Enc::new();
    e.array(5).str("BlockRemoved").uints(&[]).nil().uint(0).str("");
    assert_eq!(only(e.bytes()).kv_cache_spec_kind, None);
}

// ---------------------------------------------------------------------------
// Cache salt and LoRA.
// ---------------------------------------------------------------------------

/// A positional BlockStored with `lora_name` and `extra_keys`.
fn with_extra_keys(parent: Option<u64>, lora: Option<&str>, extra_keys: impl FnOnce(&mut Enc)) -> DecodedEvent {
    let mut e = stored_array(&[1], parent, &[1, 2], 2);
    e.buf[0] = 0x99;
    e.nil().nil().opt_str(lora);
    extra_keys(&mut e);
    only(e.bytes())
}

#[test]
fn salt_from_extra_keys() {
    // [lora, mm pair, salt, embeds digest] on the first block.
    let ev = with_extra_keys(None, Some("lora-a"), |e| {
        e.array(2).array(4).str("lora-a").array(2).str("img").uint(0).str("salt-1").bin(&[7; 32]).nil();
    });
    assert_eq!((ev.lora_name.as_deref(), ev.cache_salt.as_deref()), (Some("lora-a"), Some("salt-1")));
    match ev.event {
        KvEvent::Stored { seed, .. } => assert_eq!(seed, HashSeed::new(Some("lora-a"), Some("salt-1"))),
        other => panic!("{other:?}"),
    }
    // A salt equal to the LoRA name is still a salt.
    let ev = with_extra_keys(None, Some("x"), |e| {
        e.array(1).array(2).str("x").str("x");
    });
    assert_eq!(ev.cache_salt.as_deref(), Some("x"));
    // Without a LoRA the first string is the salt.
    let ev = with_extra_keys(None, None, |e| {
        e.array(1).array(1).str("only-salt");
    });
    assert_eq!(ev.cache_salt.as_deref(), Some("only-salt"));
    // Only a LoRA name: no salt.
    let ev = with_extra_keys(None, Some("lora-a"), |e| {
        e.array(1).array(1).str("lora-a");
    });
    assert_eq!(ev.cache_salt, None);
    // Not the first block of a prompt: the salt is not on the wire.
    let ev = with_extra_keys(Some(5), None, |e| {
        e.array(1).array(1).str("looks-like-salt");
    });
    assert_eq!(ev.cache_salt, None);
    // Typed entries (map and array forms) win over bare strings.
    let ev = with_extra_keys(None, None, |e| {
        e.array(1).array(3).map(1).str("type").str("lora").map(2).str("salt").str("typed").str("type");
        e.str("cache_salt").str("bare");
    });
    assert_eq!(ev.cache_salt.as_deref(), Some("typed"));
    let ev = with_extra_keys(None, None, |e| {
        e.array(1).array(2).array(2).str("cache_salt").str("t2").str("bare");
    });
    assert_eq!(ev.cache_salt.as_deref(), Some("t2"));
    // Odd shapes mean no salt, never an error.
    for odd in [
        value(|e| {
            e.nil();
        }),
        value(|e| {
            e.array(0);
        }),
        value(|e| {
            e.array(1).nil();
        }),
        value(|e| {
            e.str("flat");
        }),
        value(|e| {
            e.array(1).array(2).bin(&[1]).array(1).map(0);
        }),
        value(|e| {
            e.array(1).array(1).str_bytes(&[0xff]);
        }),
        value(|e| {
            e.array(1).array(1).array(2).str("cache_salt").uint(1);
        }),
    ] {
        let ev = with_extra_keys(None, None, |e| {
            e.raw(&odd);
        });
        assert_eq!(ev.cache_salt, None, "{odd:02x?}");
    }
}

#[test]
fn explicit_salt_wins_and_empty_means_none() {
    let mut e = Enc::new();
    e.map(7).str("type").str("BlockStored").str("block_hashes").uints(&[1]).str("token_ids").uints(&[1]);
    e.str("block_size").uint(1).str("cache_salt").str("field").str("lora_name").str("");
    e.str("extra_keys").array(1).array(1).str("from-extra-keys");
    let ev = only(e.bytes());
    assert_eq!((ev.cache_salt.as_deref(), ev.lora_name.as_deref()), (Some("field"), None));
    let ev = only(stored_with(|e| {
        e.str("cache_salt").str("");
    }));
    assert_eq!(ev.cache_salt, None);
    // SGLang #30827: {"cache_salt": …} in position 7, other keys ignored.
    let mut e = stored_array(&[1], None, &[1, 2], 2);
    e.buf[0] = 0x98;
    e.nil().nil().map(2).str("other").array(1).nil().str("cache_salt").str("sgl");
    let ev = only(e.bytes());
    assert_eq!((ev.cache_salt.as_deref(), ev.lora_name.as_deref()), (Some("sgl"), None));
}

// ---------------------------------------------------------------------------
// Groups.
// ---------------------------------------------------------------------------

fn removed_in(group: Option<u32>, kind: Option<&str>) -> DecodedEvent {
    let mut e = Enc::new();
    e.array(5).str("BlockRemoved").uints(&[1]).nil().opt_uint(group.map(u64::from)).opt_str(kind);
    only(e.bytes())
}

#[test]
fn group_kinds() {
    let mut g = GroupKinds::new();
    // Without learning: no group or group 0 indexed, others not.
    assert!(g.should_index(&removed_in(None, None)));
    assert!(g.should_index(&removed_in(Some(0), None)));
    assert!(!g.should_index(&removed_in(Some(2), None)));
    assert_eq!(removed_in(Some(2), None).full_attention(), None);
    // Learning from kinds.
    assert!(g.should_index(&removed_in(Some(2), Some("full_attention"))));
    assert!(g.should_index(&removed_in(Some(2), None)));
    assert!(!g.should_index(&removed_in(Some(0), Some("sliding_window"))));
    assert!(!g.should_index(&removed_in(Some(0), None)));
    assert!(!g.should_index(&removed_in(None, Some("mamba"))));
    assert!(!g.should_index(&removed_in(Some(3), Some("brand_new"))));
    assert_eq!(g.learned(3), Some(false));
    // Groups past the table are judged but not learned.
    assert!(g.should_index(&removed_in(Some(100_000), Some("full_attention"))));
    assert!(!g.should_index(&removed_in(Some(100_000), None)));
    // Cleared is always applied.
    assert!(g.should_index(&only(value(|e| {
        e.array(1).str("AllBlocksCleared");
    }))));
    g.clear();
    assert_eq!(g.learned(2), None);
    assert!(g.should_index(&removed_in(Some(0), None)));
}

// ---------------------------------------------------------------------------
// Throughput (release mode):
// cargo test --release -p kvpick-core --lib wire::tests::throughput -- --ignored --nocapture
// ---------------------------------------------------------------------------

#[test]
#[ignore = "benchmark; run in release mode"]
fn throughput() {
    use kvpick_core::shard::Shard;
    use kvpick_core::worker::{WorkerId, WorkerSpec};
    use std::time::Instant;

    const BLOCK: u32 = 16;
    const EVENTS: usize = 32;
    const BLOCKS_PER_EVENT: usize = 4;
    let mut rng = fastrand::Rng::with_seed(7);
    // Batch k stores 32 new 4-block chains (vLLM map form) and removes batch
    // k-1's: 256 block events per batch, a steady-state index.
    let batches: Vec<Vec<u8>> = (0..64u64)
        .map(|k| {
            let mut e = Enc::new();
            e.array(3).f64(k as f64).array(2 * EVENTS);
            for i in 0..EVENTS as u64 {
                let hashes: Vec<u64> =
                    (0..BLOCKS_PER_EVENT as u64).map(|b| (k << 40 | i << 20 | b) ^ 0x9e37_79b9_7f4a_7c15).collect();
                let tokens: Vec<u64> =
                    (0..BLOCKS_PER_EVENT * BLOCK as usize).map(|_| u64::from(rng.u32(..150_000))).collect();
                e.map(11).str("type").str("BlockStored").str("block_hashes").uints(&hashes);
                e.str("parent_block_hash").nil().str("token_ids").uints(&tokens).str("block_size");
                e.uint(u64::from(BLOCK)).str("lora_id").nil().str("medium").str("GPU").str("lora_name").nil();
                e.str("extra_keys").array(1).nil().str("group_idx").uint(0);
                e.str("kv_cache_spec_kind").str("full_attention");
            }
            let prev = (k + 63) % 64;
            for i in 0..EVENTS as u64 {
                let hashes: Vec<u64> =
                    (0..BLOCKS_PER_EVENT as u64).map(|b| (prev << 40 | i << 20 | b) ^ 0x9e37_79b9_7f4a_7c15).collect();
                e.map(4).str("type").str("BlockRemoved").str("block_hashes").uints(&hashes);
                e.str("medium").str("GPU").str("group_idx").uint(0);
            }
            e.uint(0);
            e.bytes()
        })
        .collect();
    let block_events_per_batch = (2 * EVENTS * BLOCKS_PER_EVENT) as u64;
    let rounds = 200;

    let start = Instant::now();
    let mut decoded = 0u64;
    for _ in 0..rounds {
        for b in &batches {
            let batch = decode_batch(b).expect("decodes");
            decoded += batch.events.len() as u64;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let blocks = block_events_per_batch * (rounds * batches.len()) as u64;
    let bytes: usize = batches.iter().map(Vec::len).sum::<usize>() * rounds;
    println!(
        "decode only: {:.2} M block events/s, {:.0} MB/s ({decoded} events)",
        blocks as f64 / secs / 1e6,
        bytes as f64 / secs / 1e6
    );

    let mut shard = Shard::new();
    let worker = WorkerId(1);
    shard.upsert_worker(WorkerSpec::new(worker, "10.0.0.1:8000".parse().expect("addr"), BLOCK));
    let mut groups = GroupKinds::new();
    let start = Instant::now();
    for _ in 0..rounds {
        for b in &batches {
            let batch = decode_batch(b).expect("decodes");
            for ev in &batch.events {
                if groups.should_index(ev) && ev.on_device() {
                    let _ = shard.apply_event(worker, &ev.event);
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!("decode + apply: {:.2} M block events/s", blocks as f64 / secs / 1e6);
}
