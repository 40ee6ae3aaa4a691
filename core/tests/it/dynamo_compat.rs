//! Compatibility of kvpick-core with NVIDIA Dynamo's KV router, crate
//! `dynamo-kv-router` 1.6.1: Dynamo is only *called* here, as
//! an oracle; none of its code is part of kvpick.
//!
//! 1. Hashing: local block hashes, sequence hashes and the LoRA / cache-salt
//!    seed are bit-identical to Dynamo's (property test plus literal values).
//! 2. Index: a random stream of KV events and lookups is fed to
//!    `SelectionService` (1, 2 and 4 shards), to Dynamo's single-threaded
//!    `RadixTree`, and to a plain model of what every engine holds; the
//!    per-worker overlap scores of all of them must be identical.
//!    Under a memory budget, each kvpick service gets its own `RadixTree`,
//!    told of every eviction as a removal: the two must still agree (an
//!    evicted block simply stops matching), and kvpick stays in budget.
//! 3. Where the two routers legitimately differ, focused tests pin both
//!    behaviours and say which one is right (the generator of 2 stays away
//!    from those cases; see `Model::store_op`).

use std::collections::{BTreeSet, HashMap, HashSet};

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheEventError, KvCacheRemoveData,
    KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash, RouterEvent, compute_block_hash_for_seq,
    compute_seq_hash_for_block,
};
use kvpick_core::hashing::{
    HashSeed, SequenceHash, XXH3_SEED, local_block_hashes, next_sequence_hash, sequence_hashes,
};
use kvpick_core::index::{Applied, ENTRY_BYTES, JUMP, WORKER_BYTES};
use kvpick_core::{EventError, KvEvent, Millis, Prompt, RouterConfig, SelectionService, WorkerId, WorkerSpec};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

/// Modest and fixed, so the whole file runs in a few seconds in debug builds.
/// No regression files are written: a failure prints its minimal case.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

fn dynamo_options<'a>(lora: Option<&'a str>, salt: Option<&'a str>) -> BlockHashOptions<'a> {
    // Dynamo's `cache_namespace` is what vLLM and kvpick call the cache salt:
    // `compute_salt_hash(cache_namespace, lora_name)` mixes it with inner seed 1.
    BlockHashOptions { lora_name: lora, cache_namespace: salt, ..BlockHashOptions::default() }
}

fn dynamo_local(tokens: &[u32], block_size: u32, lora: Option<&str>, salt: Option<&str>) -> Vec<u64> {
    compute_block_hash_for_seq(tokens, block_size, dynamo_options(lora, salt)).into_iter().map(|h| h.0).collect()
}

// ---------------------------------------------------------------------------
// 1. Hashing
// ---------------------------------------------------------------------------

/// LoRA names and cache salts: absent, empty (must count as absent on both
/// sides), ASCII, or arbitrary Unicode.
fn name() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(String::new())),
        3 => "[a-zA-Z0-9_./:-]{1,24}".prop_map(Some),
        1 => "\\PC{1,8}".prop_map(Some),
    ]
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn block_and_sequence_hashes_match_dynamo(
        tokens in vec(any::<u32>(), 0..600),
        block_size in select(vec![1u32, 2, 16, 32, 64, 128, 200]),
        lora in name(),
        salt in name(),
    ) {
        let (lora, salt) = (lora.as_deref(), salt.as_deref());
        let seed = HashSeed::new(lora, salt);
        prop_assert_eq!(
            seed.0,
            dynamo_kv_hashing::compute_salt_hash(salt, lora).expect("string salts always hash")
        );

        let ours_local = local_block_hashes(&tokens, block_size, seed);
        let theirs_local = compute_block_hash_for_seq(&tokens, block_size, dynamo_options(lora, salt));
        prop_assert_eq!(ours_local.len(), tokens.len() / block_size as usize);
        prop_assert_eq!(&ours_local, &theirs_local.iter().map(|h| h.0).collect::<Vec<_>>());

        let ours_seq: Vec<u64> = sequence_hashes(&tokens, block_size, seed).into_iter().map(|s| s.0).collect();
        prop_assert_eq!(&ours_seq, &compute_seq_hash_for_block(&theirs_local));
        let prompt = Prompt::from_tokens(&tokens, block_size, seed);
        prop_assert_eq!(prompt.seq_hashes.iter().map(|s| s.0).collect::<Vec<_>>(), ours_seq);
    }

    #[test]
    fn chain_step_matches_dynamo(parent in any::<u64>(), local in any::<u64>()) {
        prop_assert_eq!(
            next_sequence_hash(SequenceHash(parent), local).0,
            dynamo_tokens::compute_next_sequence_hash(parent, local)
        );
    }
}

/// Literal values, computed once: a change on either side (kvpick's hashing
/// or a Dynamo upgrade) fails here even if both sides changed together.
#[test]
fn fixed_vectors() {
    let tokens: Vec<u32> = (0..40).map(|i| i * 7919 + 3).chain([u32::MAX, 0, 1 << 31, 42]).collect();
    // (lora, salt, local hashes, sequence hashes) for 44 tokens in blocks of 16
    // (the trailing 12 tokens are not hashed).
    type Vector<'a> = (Option<&'a str>, Option<&'a str>, [u64; 2], [u64; 2]);
    let expected: [Vector; 4] = [
        (None, None, [5922887940885335326, 10198985838335267753], [5922887940885335326, 12102224611122907793]),
        (Some("my-lora"), None, [658442097870006149, 9142588092804763544], [658442097870006149, 8302511892529341288]),
        (None, Some("tenant-a"), [563754051635829598, 15634920875825835593], [563754051635829598, 7318456229512647312]),
        (
            Some("my-lora"),
            Some("tenant-a"),
            [16907853347334374780, 3579771768423444794],
            [16907853347334374780, 13410007328228035039],
        ),
    ];
    for (lora, salt, local, seq) in expected {
        let seed = HashSeed::new(lora, salt);
        let ours_local = local_block_hashes(&tokens, 16, seed);
        let ours_seq: Vec<u64> = sequence_hashes(&tokens, 16, seed).into_iter().map(|s| s.0).collect();
        let theirs_local = dynamo_local(&tokens, 16, lora, salt);
        let theirs_seq =
            compute_seq_hash_for_block(&theirs_local.iter().map(|&h| LocalBlockHash(h)).collect::<Vec<_>>());
        assert_eq!(ours_local, local, "kvpick local hashes, lora {lora:?} salt {salt:?}");
        assert_eq!(theirs_local, local, "Dynamo local hashes, lora {lora:?} salt {salt:?}");
        assert_eq!(ours_seq, seq, "kvpick sequence hashes, lora {lora:?} salt {salt:?}");
        assert_eq!(theirs_seq, seq, "Dynamo sequence hashes, lora {lora:?} salt {salt:?}");
    }
    assert_eq!(HashSeed::default().0, XXH3_SEED);
    // Empty names are absent on both sides; block size 0 hashes nothing.
    assert_eq!(HashSeed::new(Some(""), Some("")), HashSeed::default());
    assert_eq!(dynamo_local(&tokens, 16, Some(""), Some("")), dynamo_local(&tokens, 16, None, None));
    assert!(local_block_hashes(&tokens, 0, HashSeed::default()).is_empty());
    assert!(dynamo_local(&tokens, 0, None, None).is_empty());
}

// ---------------------------------------------------------------------------
// Both routers side by side
// ---------------------------------------------------------------------------

/// kvpick (one `SelectionService` per shard count) and Dynamo's `RadixTree`,
/// fed the same events. Worker `i` is kvpick's `WorkerId(i)` and Dynamo's
/// `worker_id = i`, dp_rank 0.
struct Routers {
    block_size: u32,
    lora: Option<&'static str>,
    services: Vec<SelectionService>,
    tree: RadixTree,
    event_id: u64,
    /// The one service has a budget: its evictions are removals to Dynamo.
    mirror_evictions: bool,
}

impl Routers {
    fn new(workers: u64, block_size: u32, lora: Option<&'static str>, shard_counts: &[usize]) -> Self {
        let services = shard_counts
            .iter()
            .map(|&shards| {
                let mut service = SelectionService::new(RouterConfig::default(), block_size, shards);
                for i in 1..=workers {
                    let endpoint = format!("10.0.0.{i}:8000").parse().expect("valid socket address");
                    service
                        .upsert_worker(WorkerSpec::new(WorkerId(i), endpoint, block_size), Millis(0))
                        .expect("the worker's block size is the service's");
                }
                service
            })
            .collect();
        Routers { block_size, lora, services, tree: RadixTree::new(), event_id: 0, mirror_evictions: false }
    }

    /// One service of `shards` shards, the fullest keeping at most
    /// `per_shard` entries: each shard's share of the budget covers that
    /// many entries and the fixed cost of as many workers as the fullest
    /// shard has (workers go to the shard with the fewest), so a shard
    /// with one worker fewer keeps `WORKER_BYTES / ENTRY_BYTES` more (see
    /// `run_budgeted`).
    fn budgeted(workers: u64, block_size: u32, lora: Option<&'static str>, shards: usize, per_shard: u64) -> Self {
        let fullest = workers.div_ceil(shards as u64);
        let max_bytes = shards as u64 * (per_shard * ENTRY_BYTES + fullest * WORKER_BYTES);
        let cfg = RouterConfig { index_max_bytes: Some(max_bytes), ..Default::default() };
        let mut routers = Routers::new(workers, block_size, lora, &[]);
        let mut service = SelectionService::new(cfg, block_size, shards);
        service.record_evictions();
        for i in 1..=workers {
            let endpoint = format!("10.0.0.{i}:8000").parse().expect("valid socket address");
            service
                .upsert_worker(WorkerSpec::new(WorkerId(i), endpoint, block_size), Millis(0))
                .expect("the worker's block size is the service's");
        }
        routers.services.push(service);
        routers.mirror_evictions = true;
        routers
    }

    fn seed(&self) -> HashSeed {
        HashSeed::new(self.lora, None)
    }

    fn options(&self) -> BlockHashOptions<'static> {
        dynamo_options(self.lora, None)
    }

    /// Applies `event` to every kvpick service (they must agree) and `data`
    /// to Dynamo.
    fn apply(
        &mut self,
        worker: u64,
        event: KvEvent,
        data: KvCacheEventData,
    ) -> (Result<Applied, EventError>, Result<(), KvCacheEventError>) {
        let results: Vec<_> = self.services.iter_mut().map(|s| s.apply_kv_event(WorkerId(worker), &event)).collect();
        assert!(results.windows(2).all(|w| w[0] == w[1]), "shard counts disagree on {event:?}: {results:?}");
        let dynamo = self.apply_to_dynamo(worker, data);
        if self.mirror_evictions {
            for (evicted_from, hash) in self.services[0].take_evictions() {
                let data = KvCacheEventData::Removed(KvCacheRemoveData {
                    block_hashes: vec![ExternalSequenceBlockHash(hash)],
                });
                // Dynamo may not hold it: it drops a block's descendants
                // when the engine removes the block (section 3), where
                // kvpick keeps them as orphans. Only lookups must agree.
                let _ = self.apply_to_dynamo(evicted_from.0, data);
            }
        }
        (results[0].clone(), dynamo)
    }

    fn apply_to_dynamo(&mut self, worker: u64, data: KvCacheEventData) -> Result<(), KvCacheEventError> {
        self.event_id += 1;
        self.tree.apply_event(RouterEvent::new(worker, KvCacheEvent { event_id: self.event_id, data, dp_rank: 0 }))
    }

    /// One `BlockStored`: engine hashes `hashes`, tokens `tokens` (exactly
    /// `hashes.len()` blocks).
    fn store(
        &mut self,
        worker: u64,
        parent: Option<u64>,
        hashes: &[u64],
        tokens: &[u32],
    ) -> (Result<Applied, EventError>, Result<(), KvCacheEventError>) {
        let bs = self.block_size as usize;
        assert_eq!(tokens.len(), hashes.len() * bs, "test stores whole blocks");
        let blocks = hashes
            .iter()
            .zip(tokens.chunks_exact(bs))
            .map(|(&hash, block)| {
                // Dynamo's own hash of the block's tokens, as its publishers compute it.
                let local = compute_block_hash_for_seq(block, self.block_size, self.options());
                KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(hash),
                    tokens_hash: local[0],
                    mm_extra_info: None,
                }
            })
            .collect();
        let event = KvEvent::Stored {
            block_hashes: hashes.to_vec(),
            parent,
            token_ids: tokens.to_vec(),
            block_size: self.block_size,
            seed: self.seed(),
        };
        let data = KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: parent.map(ExternalSequenceBlockHash),
            start_position: None,
            blocks,
        });
        self.apply(worker, event, data)
    }

    fn remove(&mut self, worker: u64, hashes: &[u64]) -> (Result<Applied, EventError>, Result<(), KvCacheEventError>) {
        let event = KvEvent::Removed { block_hashes: hashes.to_vec() };
        let data = KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: hashes.iter().map(|&h| ExternalSequenceBlockHash(h)).collect(),
        });
        self.apply(worker, event, data)
    }

    fn clear(&mut self, worker: u64) -> (Result<Applied, EventError>, Result<(), KvCacheEventError>) {
        self.apply(worker, KvEvent::Cleared, KvCacheEventData::Cleared)
    }

    /// kvpick's overlap scores `(worker, blocks)` per service, zeros omitted.
    fn kvpick_scores(&self, tokens: &[u32]) -> Vec<Vec<(u64, u32)>> {
        self.services
            .iter()
            .map(|service| {
                let prompt = service.prompt(tokens, self.seed());
                service.overlap_scores(&prompt).into_iter().filter(|&(_, d)| d > 0).map(|(w, d)| (w.0, d)).collect()
            })
            .collect()
    }

    /// Dynamo's overlap scores, sorted by worker, zeros omitted.
    fn dynamo_scores(&self, tokens: &[u32]) -> Vec<(u64, u32)> {
        let local = compute_block_hash_for_seq(tokens, self.block_size, self.options());
        let mut scores: Vec<(u64, u32)> = self
            .tree
            .find_matches(local, false)
            .scores
            .into_iter()
            .filter(|&(w, s)| {
                assert_eq!(w.dp_rank, 0, "only dp_rank 0 is ever used");
                s > 0
            })
            .map(|(w, s)| (w.worker_id, s))
            .collect();
        scores.sort_unstable();
        scores
    }

    /// kvpick's scores, asserting every shard count agrees.
    fn kvpick(&self, tokens: &[u32]) -> Vec<(u64, u32)> {
        let all = self.kvpick_scores(tokens);
        assert!(all.windows(2).all(|w| w[0] == w[1]), "shard counts disagree: {all:?}");
        all.into_iter().next().unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------
// 2. Differential index test
// ---------------------------------------------------------------------------

/// splitmix64's output function: a bijection on u64.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Deterministic token source for one operation.
struct Tokens(u64);

impl Tokens {
    fn next(&mut self, below: u32) -> u32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        (mix(self.0) % u64::from(below)) as u32
    }
}

#[derive(Clone, Debug)]
enum ParentPick {
    /// A new prompt start.
    Root,
    /// The block this worker stored last (if it still holds it).
    Latest,
    /// Any block the worker holds (with all its ancestors).
    Held(Index),
    /// The deepest such block (builds chains deeper than kvpick's jump
    /// distance).
    Deepest,
    /// Walk down the chain of a block stored by anyone: continue from the
    /// deepest block of it this worker holds (shares prefixes across workers
    /// and builds chains deeper than kvpick's jump distance).
    Follow(Index),
    /// A parent this worker does not hold: both routers must skip the event.
    Unknown(UnknownParent),
}

#[derive(Clone, Debug)]
enum UnknownParent {
    /// A hash no engine ever reported.
    Fresh(u64),
    /// A real block: held by other workers, or evicted by this one.
    Known(Index),
}

#[derive(Clone, Copy, Debug)]
enum RemoveMode {
    /// Any held blocks, middle ones included (their children stay cached).
    Any,
    /// A held block and every held descendant of it.
    Subtree,
    /// Held blocks without held children (the usual LRU eviction).
    Leaves,
}

#[derive(Clone, Copy, Debug)]
enum LookupKind {
    /// The whole token prefix of a stored block, plus a partial block.
    Full,
    /// Cut anywhere (possibly mid-block).
    Truncated,
    /// One token changed in one block.
    Changed,
    /// Followed by random blocks.
    Extended,
    /// Random tokens from the alphabet.
    Random,
}

#[derive(Clone, Debug)]
enum Op {
    Store {
        worker: usize,
        parent: ParentPick,
        blocks: usize,
        tokens: u64,
    },
    Remove {
        worker: usize,
        mode: RemoveMode,
        picks: Vec<Index>,
        unknown: Vec<u64>,
        reverse: bool,
    },
    Clear {
        worker: usize,
    },
    /// `deepest`: built from the deepest block any worker holds, rather
    /// than from any block ever stored.
    Lookup {
        kind: LookupKind,
        deepest: bool,
        pick: Index,
        at: Index,
        tokens: u64,
    },
}

#[derive(Clone, Debug)]
struct Scenario {
    workers: usize,
    block_size: u32,
    /// Tokens are drawn from `0..alphabet`: small, so workers share prefixes.
    alphabet: u32,
    lora: Option<&'static str>,
    /// Keys the engine hashes of this scenario.
    hash_key: u64,
    ops: Vec<Op>,
}

fn parent_pick(deep: bool) -> impl Strategy<Value = ParentPick> {
    // Deep scenarios mostly extend their longest chains.
    let (extend, start) = if deep { (8, 1) } else { (2, 2) };
    prop_oneof![
        start => Just(ParentPick::Root),
        3 => Just(ParentPick::Latest),
        2 => any::<Index>().prop_map(ParentPick::Held),
        extend => Just(ParentPick::Deepest),
        3 => any::<Index>().prop_map(ParentPick::Follow),
        1 => prop_oneof![
            any::<u64>().prop_map(UnknownParent::Fresh),
            any::<Index>().prop_map(UnknownParent::Known),
        ]
        .prop_map(ParentPick::Unknown),
    ]
}

fn op(deep: bool) -> impl Strategy<Value = Op> {
    let remove_mode = prop_oneof![Just(RemoveMode::Any), Just(RemoveMode::Subtree), Just(RemoveMode::Leaves)];
    let unknown = prop_oneof![3 => Just(Vec::new()), 1 => vec(any::<u64>(), 1..3)];
    let lookup_kind = prop_oneof![
        Just(LookupKind::Full),
        Just(LookupKind::Truncated),
        Just(LookupKind::Changed),
        Just(LookupKind::Extended),
        Just(LookupKind::Random),
    ];
    prop_oneof![
        20 => (0..6usize, parent_pick(deep), 1..=8usize, any::<u64>())
            .prop_map(|(worker, parent, blocks, tokens)| Op::Store { worker, parent, blocks, tokens }),
        8 => (0..6usize, remove_mode, vec(any::<Index>(), 1..5), unknown, any::<bool>())
            .prop_map(|(worker, mode, picks, unknown, reverse)| Op::Remove { worker, mode, picks, unknown, reverse }),
        u32::from(!deep) => (0..6usize).prop_map(|worker| Op::Clear { worker }),
        12 => (lookup_kind, any::<bool>(), any::<Index>(), any::<Index>(), any::<u64>())
            .prop_map(|(kind, deepest, pick, at, tokens)| Op::Lookup { kind, deepest, pick, at, tokens }),
    ]
}

/// `deep` scenarios mostly extend their longest chains and never clear.
fn scenario(deep: bool) -> impl Strategy<Value = Scenario> {
    let ops = vec(op(deep), 1..300);
    (1..=6usize, select(vec![1u32, 2, 3, 4, 16]), 2..=4u32, select(vec![None, Some("adapter-a")]), any::<u64>(), ops)
        .prop_map(|(workers, block_size, alphabet, lora, hash_key, ops)| Scenario {
            workers,
            block_size,
            alphabet,
            lora,
            hash_key,
            ops,
        })
}

#[derive(Debug)]
struct Block {
    parent: Option<u64>,
    tokens: Vec<u32>,
}

/// What every engine holds. Engine block hashes are content-addressed like
/// vLLM's (a hash of the parent's hash and the block's tokens; here a fresh
/// random u64 per distinct block) and shared by all workers, as vLLM's are
/// when every worker runs with the same PYTHONHASHSEED — which Dynamo's
/// `RadixTree` relies on (see `engine_hashes_need_not_agree_across_workers`).
struct Model {
    block_size: u32,
    alphabet: u32,
    hash_key: u64,
    minted: u64,
    by_content: HashMap<(Option<u64>, Vec<u32>), u64>,
    blocks: HashMap<u64, Block>,
    /// Every block any engine ever stored, in first-stored order.
    known: Vec<u64>,
    held: Vec<BTreeSet<u64>>,
    latest: Vec<Option<u64>>,
}

/// A `BlockStored` the model decided to send, and its expected outcome.
struct Store {
    parent: Option<u64>,
    hashes: Vec<u64>,
    tokens: Vec<u32>,
    /// Blocks newly held, or `None` when the parent is unknown to the worker.
    newly_stored: Option<u64>,
}

impl Model {
    fn new(s: &Scenario) -> Self {
        Model {
            block_size: s.block_size,
            alphabet: s.alphabet,
            hash_key: s.hash_key,
            minted: 0,
            by_content: HashMap::new(),
            blocks: HashMap::new(),
            known: Vec::new(),
            held: vec![BTreeSet::new(); s.workers],
            latest: vec![None; s.workers],
        }
    }

    /// A hash never used before (`mix` is a bijection).
    fn mint(&mut self) -> u64 {
        self.minted += 1;
        mix(self.hash_key.wrapping_add(self.minted))
    }

    fn engine_hash(&mut self, parent: Option<u64>, tokens: &[u32]) -> u64 {
        if let Some(&hash) = self.by_content.get(&(parent, tokens.to_vec())) {
            return hash;
        }
        let hash = self.mint();
        self.by_content.insert((parent, tokens.to_vec()), hash);
        self.blocks.insert(hash, Block { parent, tokens: tokens.to_vec() });
        self.known.push(hash);
        hash
    }

    fn parent_of(&self, hash: u64) -> Option<u64> {
        self.blocks.get(&hash).expect("only registered blocks are walked").parent
    }

    /// Hashes from the prompt start down to `hash`.
    fn path(&self, hash: u64) -> Vec<u64> {
        let mut path = vec![hash];
        while let Some(parent) = self.parent_of(path[path.len() - 1]) {
            path.push(parent);
        }
        path.reverse();
        path
    }

    fn prefix_tokens(&self, hash: u64) -> Vec<u32> {
        self.path(hash).iter().flat_map(|h| self.blocks[h].tokens.iter().copied()).collect()
    }

    fn random_tokens(&self, n_blocks: usize, source: &mut Tokens) -> Vec<u32> {
        (0..n_blocks * self.block_size as usize).map(|_| source.next(self.alphabet)).collect()
    }

    /// Held blocks whose every ancestor is held too, in hash order.
    fn rooted(&self, w: usize) -> Vec<u64> {
        let held = &self.held[w];
        let mut memo: HashMap<u64, bool> = HashMap::new();
        let mut out = Vec::new();
        for &hash in held {
            let mut walked = Vec::new();
            let mut cur = Some(hash);
            let rooted = loop {
                let Some(c) = cur else { break true };
                if let Some(&known) = memo.get(&c) {
                    break known;
                }
                if !held.contains(&c) {
                    break false;
                }
                walked.push(c);
                cur = self.parent_of(c);
            };
            memo.extend(walked.into_iter().map(|c| (c, rooted)));
            if rooted {
                out.push(hash);
            }
        }
        out
    }

    /// Evicted blocks of `w` that still have held descendants.
    fn holes(&self, w: usize) -> HashSet<u64> {
        let held = &self.held[w];
        let (mut holes, mut seen) = (HashSet::new(), HashSet::new());
        for &hash in held {
            let mut cur = self.parent_of(hash);
            while let Some(c) = cur {
                if !seen.insert(c) {
                    break;
                }
                if !held.contains(&c) {
                    holes.insert(c);
                }
                cur = self.parent_of(c);
            }
        }
        holes
    }

    /// Chooses a `BlockStored` for worker `w`, or `None` to skip the op.
    ///
    /// Kept away from what the routers legitimately disagree on (see the
    /// focused tests in section 3): a store never uses as parent a held block
    /// cut off from the prompt start by an evicted ancestor, and never
    /// re-stores an evicted block while descendants of it are still held.
    fn store_op(&mut self, w: usize, pick: &ParentPick, n_blocks: usize, seed: u64) -> Option<Store> {
        let mut source = Tokens(seed);
        let bs = self.block_size as usize;
        let unknown_parent = match pick {
            ParentPick::Unknown(UnknownParent::Fresh(hash)) => Some(*hash),
            ParentPick::Unknown(UnknownParent::Known(i)) if !self.known.is_empty() => {
                Some(self.known[i.index(self.known.len())])
            }
            ParentPick::Unknown(UnknownParent::Known(_)) => return None,
            _ => None,
        };
        if let Some(parent) = unknown_parent {
            if self.held[w].contains(&parent) {
                return None;
            }
            let hashes = (0..n_blocks).map(|_| self.mint()).collect();
            let tokens = self.random_tokens(n_blocks, &mut source);
            return Some(Store { parent: Some(parent), hashes, tokens, newly_stored: None });
        }

        let rooted = self.rooted(w);
        let (parent, tokens) = match pick {
            ParentPick::Latest => match self.latest[w].filter(|h| rooted.binary_search(h).is_ok()) {
                Some(latest) => (Some(latest), self.random_tokens(n_blocks, &mut source)),
                None => (None, self.random_tokens(n_blocks, &mut source)),
            },
            ParentPick::Held(i) if !rooted.is_empty() => {
                (Some(rooted[i.index(rooted.len())]), self.random_tokens(n_blocks, &mut source))
            }
            ParentPick::Deepest if !rooted.is_empty() => {
                let deepest = rooted.iter().copied().max_by_key(|&h| (self.path(h).len(), h));
                (deepest, self.random_tokens(n_blocks, &mut source))
            }
            ParentPick::Follow(i) if !self.known.is_empty() => {
                let path = self.path(self.known[i.index(self.known.len())]);
                let have = path.iter().take_while(|h| self.held[w].contains(h)).count();
                if have == path.len() {
                    (path.last().copied(), self.random_tokens(n_blocks, &mut source))
                } else {
                    let parent = have.checked_sub(1).map(|i| path[i]);
                    let tokens = path[have..(have + n_blocks).min(path.len())]
                        .iter()
                        .flat_map(|h| self.blocks[h].tokens.iter().copied())
                        .collect();
                    (parent, tokens)
                }
            }
            _ => (None, self.random_tokens(n_blocks, &mut source)),
        };

        let holes = self.holes(w);
        let mut hashes = Vec::new();
        let mut prev = parent;
        for block in tokens.chunks_exact(bs) {
            let hash = self.engine_hash(prev, block);
            if holes.contains(&hash) {
                break;
            }
            hashes.push(hash);
            prev = Some(hash);
        }
        if hashes.is_empty() {
            return None;
        }
        let tokens = tokens[..hashes.len() * bs].to_vec();
        let newly_stored = hashes.iter().filter(|h| !self.held[w].contains(h)).count() as u64;
        self.held[w].extend(hashes.iter().copied());
        self.latest[w] = hashes.last().copied();
        Some(Store { parent, hashes, tokens, newly_stored: Some(newly_stored) })
    }

    /// Chooses the hashes of a `BlockRemoved` for `w` and applies it; returns
    /// them with the expected `(removed, unknown_removed)`.
    fn remove_op(
        &mut self,
        w: usize,
        mode: RemoveMode,
        picks: &[Index],
        unknown: &[u64],
        reverse: bool,
    ) -> (Vec<u64>, u64, u64) {
        let held: Vec<u64> = self.held[w].iter().copied().collect();
        let mut hashes = Vec::new();
        if !held.is_empty() {
            match mode {
                RemoveMode::Any => hashes.extend(picks.iter().map(|i| held[i.index(held.len())])),
                RemoveMode::Subtree => {
                    let top = held[picks[0].index(held.len())];
                    let mut subtree: Vec<(usize, u64)> = held
                        .iter()
                        .filter_map(|&h| {
                            let path = self.path(h);
                            let at = path.iter().position(|&p| p == top)?;
                            Some((path.len() - at, h))
                        })
                        .collect();
                    subtree.sort_unstable();
                    hashes.extend(subtree.into_iter().map(|(_, h)| h));
                }
                RemoveMode::Leaves => {
                    let with_children: HashSet<u64> = held.iter().filter_map(|&h| self.parent_of(h)).collect();
                    let leaves: Vec<u64> = held.iter().copied().filter(|h| !with_children.contains(h)).collect();
                    hashes.extend(picks.iter().map(|i| leaves[i.index(leaves.len())]));
                }
            }
        }
        for &x in unknown {
            // A hash never reported, or a real block this worker does not hold.
            let hash = if x % 2 == 0 || self.known.is_empty() { x } else { self.known[x as usize % self.known.len()] };
            if !self.held[w].contains(&hash) {
                hashes.push(hash);
            }
        }
        if reverse {
            hashes.reverse();
        }
        let (mut removed, mut unknown_removed) = (0, 0);
        for h in &hashes {
            if self.held[w].remove(h) {
                removed += 1;
            } else {
                unknown_removed += 1;
            }
        }
        (hashes, removed, unknown_removed)
    }

    fn lookup_tokens(&self, kind: LookupKind, deepest: bool, pick: &Index, at: &Index, seed: u64) -> Vec<u32> {
        let mut source = Tokens(seed);
        let bs = self.block_size as usize;
        let partial = at.index(bs);
        if self.known.is_empty() || matches!(kind, LookupKind::Random) {
            let n_blocks = at.index(12 * bs + 1) / bs;
            let tail = self.random_tokens(1, &mut source);
            let tokens = self.random_tokens(n_blocks, &mut source);
            return tokens.into_iter().chain(tail.into_iter().take(partial)).collect();
        }
        let deepest_held = || self.held.iter().flatten().copied().max_by_key(|&h| (self.path(h).len(), h));
        let base = match deepest.then(deepest_held).flatten() {
            Some(hash) => self.prefix_tokens(hash),
            None => self.prefix_tokens(self.known[pick.index(self.known.len())]),
        };
        match kind {
            LookupKind::Full => {
                let tail = self.random_tokens(1, &mut source);
                base.into_iter().chain(tail.into_iter().take(partial)).collect()
            }
            LookupKind::Truncated => base[..at.index(base.len() + 1)].to_vec(),
            LookupKind::Changed => {
                let mut tokens = base;
                let i = at.index(tokens.len());
                // Another token of the alphabet, or one far outside it.
                tokens[i] = if seed % 3 == 0 { 1_000_000 } else { (tokens[i] + 1) % self.alphabet };
                tokens
            }
            LookupKind::Extended => {
                let extra = 1 + at.index(4);
                base.into_iter().chain(self.random_tokens(extra, &mut source)).collect()
            }
            LookupKind::Random => unreachable!("handled above"),
        }
    }

    /// The truth: for each worker, how many leading blocks of the prompt its
    /// engine holds.
    fn expected_scores(&self, tokens: &[u32]) -> Vec<(u64, u32)> {
        let mut chain = Vec::new();
        let mut prev = None;
        for block in tokens.chunks_exact(self.block_size as usize) {
            let Some(&hash) = self.by_content.get(&(prev, block.to_vec())) else { break };
            chain.push(hash);
            prev = Some(hash);
        }
        self.held
            .iter()
            .enumerate()
            .filter_map(|(w, held)| {
                let depth = chain.iter().take_while(|h| held.contains(h)).count() as u32;
                (depth > 0).then_some((w as u64 + 1, depth))
            })
            .collect()
    }
}

/// What a scenario exercised, to check the generator keeps reaching the
/// interesting paths.
#[derive(Debug, Default)]
struct Coverage {
    /// Deepest overlap of any lookup.
    deepest: u32,
    /// Lookups where two or more workers matched and one matched more than
    /// kvpick's jump distance (jump search and bisection).
    deep_lookups: u32,
    /// Lookups matched by a worker holding blocks cut off by an eviction
    /// (kvpick's block-by-block scan).
    lookups_with_holes: u32,
    /// Stores both routers had to skip.
    unknown_parent_stores: u32,
}

/// Feeds one scenario to the engines' model, kvpick (1, 2 and 4 shards) and
/// Dynamo; every lookup's scores must be the engines' truth on both routers.
fn run(s: &Scenario) -> Coverage {
    let mut model = Model::new(s);
    let mut routers = Routers::new(s.workers as u64, s.block_size, s.lora, &[1, 2, 4]);
    let mut coverage = Coverage::default();
    for (step, op) in s.ops.iter().enumerate() {
        match op {
            Op::Store { worker, parent, blocks, tokens } => {
                let w = worker % s.workers;
                let Some(store) = model.store_op(w, parent, *blocks, *tokens) else { continue };
                let (ours, theirs) = routers.store(w as u64 + 1, store.parent, &store.hashes, &store.tokens);
                match store.newly_stored {
                    Some(stored) => {
                        assert_eq!(ours, Ok(Applied { stored, ..Applied::default() }), "step {step}: {op:?}");
                        assert_eq!(theirs, Ok(()), "step {step}: {op:?}");
                    }
                    None => {
                        let parent = store.parent.expect("only a parent can be unknown");
                        assert_eq!(ours, Err(EventError::UnknownParent(parent)), "step {step}: {op:?}");
                        assert_eq!(theirs, Err(KvCacheEventError::ParentBlockNotFound), "step {step}: {op:?}");
                        coverage.unknown_parent_stores += 1;
                    }
                }
            }
            Op::Remove { worker, mode, picks, unknown, reverse } => {
                let w = worker % s.workers;
                let (hashes, removed, unknown_removed) = model.remove_op(w, *mode, picks, unknown, *reverse);
                if hashes.is_empty() {
                    continue;
                }
                // Dynamo applies what it can and reports unknown hashes (and
                // those it dropped implicitly, see section 3) as an error:
                // only kvpick's counts are checked here.
                let (ours, _) = routers.remove(w as u64 + 1, &hashes);
                let expected = Ok(Applied { removed, unknown_removed, ..Applied::default() });
                assert_eq!(ours, expected, "step {step}: {op:?}");
            }
            Op::Clear { worker } => {
                let w = worker % s.workers;
                let removed = std::mem::take(&mut model.held[w]).len() as u64;
                let (ours, theirs) = routers.clear(w as u64 + 1);
                assert_eq!(ours, Ok(Applied { removed, ..Applied::default() }), "step {step}: {op:?}");
                assert_eq!(theirs, Ok(()), "step {step}: {op:?}");
            }
            Op::Lookup { kind, deepest, pick, at, tokens } => {
                let prompt = model.lookup_tokens(*kind, *deepest, pick, at, *tokens);
                let expected = model.expected_scores(&prompt);
                for (scores, shards) in routers.kvpick_scores(&prompt).iter().zip([1, 2, 4]) {
                    assert_eq!(scores, &expected, "step {step}: kvpick, {shards} shards, {op:?}, prompt {prompt:?}");
                }
                let dynamo = routers.dynamo_scores(&prompt);
                assert_eq!(dynamo, expected, "step {step}: Dynamo, {op:?}, prompt {prompt:?}");

                let deepest = expected.iter().map(|&(_, d)| d).max().unwrap_or(0);
                coverage.deepest = coverage.deepest.max(deepest);
                coverage.deep_lookups += u32::from(expected.len() > 1 && deepest > JUMP as u32);
                let holed = expected.iter().any(|&(w, _)| !model.holes(w as usize - 1).is_empty());
                coverage.lookups_with_holes += u32::from(holed);
            }
        }
        for (w, held) in model.held.iter().enumerate() {
            for service in &routers.services {
                let load = service.loads()[w];
                assert_eq!(load.worker, WorkerId(w as u64 + 1));
                assert_eq!(load.cached_blocks, held.len() as u64, "step {step}: blocks cached by {:?}", load.worker);
            }
        }
    }
    coverage
}

/// Feeds one scenario's engine events to kvpick under a budget of
/// `per_shard` entries per shard and to a `RadixTree` told of kvpick's
/// evictions; every lookup must score the same on both. Returns the
/// evictions seen.
fn run_budgeted(s: &Scenario, shards: usize, per_shard: u64) -> u64 {
    let mut model = Model::new(s);
    let mut routers = Routers::budgeted(s.workers as u64, s.block_size, s.lora, shards, per_shard);
    for (step, op) in s.ops.iter().enumerate() {
        match op {
            Op::Store { worker, parent, blocks, tokens } => {
                let w = worker % s.workers;
                let Some(store) = model.store_op(w, parent, *blocks, *tokens) else { continue };
                // A parent kvpick evicted is unknown to both.
                let (ours, theirs) = routers.store(w as u64 + 1, store.parent, &store.hashes, &store.tokens);
                assert_eq!(ours.is_ok(), theirs.is_ok(), "step {step}: {op:?}: {ours:?} against {theirs:?}");
            }
            Op::Remove { worker, mode, picks, unknown, reverse } => {
                let w = worker % s.workers;
                let (hashes, _, _) = model.remove_op(w, *mode, picks, unknown, *reverse);
                if !hashes.is_empty() {
                    // Dynamo reports hashes it no longer holds; kvpick counts them.
                    let (ours, _) = routers.remove(w as u64 + 1, &hashes);
                    assert!(ours.is_ok(), "step {step}: {op:?}: {ours:?}");
                }
            }
            Op::Clear { worker } => {
                let w = worker % s.workers;
                model.held[w].clear();
                let (ours, theirs) = routers.clear(w as u64 + 1);
                assert!(ours.is_ok() && theirs.is_ok(), "step {step}: {op:?}: {ours:?}, {theirs:?}");
            }
            Op::Lookup { kind, deepest, pick, at, tokens } => {
                let prompt = model.lookup_tokens(*kind, *deepest, pick, at, *tokens);
                let ours = routers.kvpick(&prompt);
                assert_eq!(ours, routers.dynamo_scores(&prompt), "step {step}: {shards} shards, {op:?}");
            }
        }
        let fullest = (s.workers as u64).div_ceil(shards as u64);
        for shard in routers.services[0].shards() {
            let (entries, cap) = (shard.index().entries(), shard.index().max_entries());
            let fewer = fullest - shard.worker_count() as u64;
            assert_eq!(
                cap,
                Some(per_shard + fewer * WORKER_BYTES / ENTRY_BYTES),
                "step {step}: the budget less its workers' cost"
            );
            assert!(
                entries <= per_shard + fewer * WORKER_BYTES / ENTRY_BYTES,
                "step {step}: a shard holds {entries} entries over {cap:?}"
            );
        }
    }
    routers.services[0].shard_stats().blocks_evicted
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn a_budgeted_index_matches_dynamo_told_of_its_evictions(
        s in prop_oneof![3 => scenario(false), 1 => scenario(true)],
        per_shard in 1u64..24,
    ) {
        for shards in [1, 2, 4] {
            run_budgeted(&s, shards, per_shard);
        }
    }

    #[test]
    fn overlap_scores_match_dynamo_radix_tree(s in prop_oneof![3 => scenario(false), 1 => scenario(true)]) {
        run(&s);
    }
}

/// A deterministic sample of deep scenarios must reach the paths that matter
/// (so a change to the generator cannot quietly stop testing them).
#[test]
fn generator_reaches_deep_chains_holes_and_unknown_parents() {
    let mut runner = TestRunner::deterministic();
    let mut total = Coverage::default();
    for _ in 0..10 {
        let s = scenario(true).new_tree(&mut runner).expect("the strategy always generates").current();
        let c = run(&s);
        total.deepest = total.deepest.max(c.deepest);
        total.deep_lookups += c.deep_lookups;
        total.lookups_with_holes += c.lookups_with_holes;
        total.unknown_parent_stores += c.unknown_parent_stores;
    }
    assert!(total.deepest > JUMP as u32, "{total:?}");
    assert!(total.deep_lookups > 0, "{total:?}");
    assert!(total.lookups_with_holes > 0, "{total:?}");
    assert!(total.unknown_parent_stores > 0, "{total:?}");
}

/// The budgeted runs above do evict (a generator change cannot quietly
/// keep every scenario under budget).
#[test]
fn budgeted_scenarios_evict() {
    let mut runner = TestRunner::deterministic();
    let evicted: u64 = (0..10)
        .map(|_| scenario(true).new_tree(&mut runner).expect("the strategy always generates").current())
        .map(|s| [1, 2, 4].iter().map(|&shards| run_budgeted(&s, shards, 4)).sum::<u64>())
        .sum();
    assert!(evicted > 100, "{evicted} evictions");
}

// ---------------------------------------------------------------------------
// 3. Where kvpick and Dynamo legitimately differ
// ---------------------------------------------------------------------------

fn stored(n: u64) -> Result<Applied, EventError> {
    Ok(Applied { stored: n, ..Applied::default() })
}

/// The engine evicts the middle block `b` of `a b c` but keeps `c` (vLLM
/// evicts single blocks and reports each one, so a child can outlive its
/// parent), then recomputes `b`. Its prefix cache serves `a b c` again: the
/// right overlap is 3.
///
/// kvpick says 3: it follows the engine's reports block by block. Dynamo's
/// compressed `RadixTree` cuts the worker's coverage of a whole edge at the
/// evicted block and silently forgets the rest of that edge ("stale" hashes,
/// see `remove_worker_at_pos` and the TODO(CORRECTNESS) in `apply_removed`),
/// so it says 2 when `a b c` sit on one edge — and 3 when another worker's
/// traffic happened to split the edge at `b` first. kvpick is right, and its
/// answer does not depend on other workers. Likewise Dynamo refuses to extend
/// `c` (ParentBlockNotFound) in the first history only; kvpick accepts it.
#[test]
fn evicting_a_middle_block_then_recomputing_it() {
    let (a, b, c, x) = ([1, 1], [2, 2], [3, 3], [9, 9]);
    let abc = [a, b, c].concat();
    for other_worker_first in [false, true] {
        let mut r = Routers::new(2, 2, None, &[1, 2]);
        let worker_2 = if other_worker_first {
            // Worker 2 shares `a b` (same engine hashes: same content).
            assert_eq!(r.store(2, None, &[10, 11, 20], &[a, b, x].concat()), (stored(3), Ok(())));
            vec![(2, 2)]
        } else {
            vec![]
        };
        let with = |w1: u32| [vec![(1, w1)], worker_2.clone()].concat();
        assert_eq!(r.store(1, None, &[10, 11, 12], &abc), (stored(3), Ok(())));
        assert_eq!(r.remove(1, &[11]).0, Ok(Applied { removed: 1, ..Applied::default() }));
        assert_eq!(r.kvpick(&abc), with(1));
        assert_eq!(r.dynamo_scores(&abc), with(1));

        assert_eq!(r.store(1, Some(10), &[11], &b), (stored(1), Ok(())));
        assert_eq!(r.kvpick(&abc), with(3), "kvpick, other worker first: {other_worker_first}");
        let dynamo = if other_worker_first { 3 } else { 2 };
        assert_eq!(r.dynamo_scores(&abc), with(dynamo), "Dynamo, other worker first: {other_worker_first}");

        let (ours, theirs) = r.store(1, Some(12), &[13], &[4, 4]);
        assert_eq!(ours, stored(1));
        let expected = if other_worker_first { Ok(()) } else { Err(KvCacheEventError::ParentBlockNotFound) };
        assert_eq!(theirs, expected, "Dynamo, other worker first: {other_worker_first}");
    }
}

/// Worker 2 hashes the same tokens as worker 1 to other engine hashes (vLLM
/// workers without a common PYTHONHASHSEED, or different engines). kvpick maps
/// engine hashes per worker, so worker 2 extends its own chain and its
/// evictions apply. Dynamo's tree finds worker 2's parent on an edge that
/// carries worker 1's hash: it drops worker 2's store (ParentBlockNotFound),
/// then refuses worker 2's eviction (BlockNotFound) and keeps reporting a
/// block worker 2 no longer has. kvpick is right on both counts; Dynamo
/// requires engine hashes that agree across workers, so the differential test
/// uses such hashes.
#[test]
fn engine_hashes_need_not_agree_across_workers() {
    let (a, b) = ([1, 1], [2, 2]);
    let ab = [a, b].concat();
    let mut r = Routers::new(2, 2, None, &[1, 2]);
    assert_eq!(r.store(1, None, &[10, 11], &ab), (stored(2), Ok(())));
    assert_eq!(r.store(2, None, &[50], &a), (stored(1), Ok(())));
    let (ours, theirs) = r.store(2, Some(50), &[51], &b);
    assert_eq!(ours, stored(1));
    assert_eq!(theirs, Err(KvCacheEventError::ParentBlockNotFound));
    assert_eq!(r.kvpick(&ab), vec![(1, 2), (2, 2)]);
    assert_eq!(r.dynamo_scores(&ab), vec![(1, 2), (2, 1)]);

    let (ours, theirs) = r.remove(2, &[51, 50]);
    assert_eq!(ours, Ok(Applied { removed: 2, ..Applied::default() }));
    assert_eq!(theirs, Err(KvCacheEventError::BlockNotFound));
    assert_eq!(r.kvpick(&ab), vec![(1, 2)]);
    assert_eq!(r.dynamo_scores(&ab), vec![(1, 2), (2, 1)], "Dynamo keeps worker 2's evicted block");
}

/// An engine may cache the same tokens twice under two hashes when it hashes
/// something the KV event does not carry (vLLM's extra keys: a multimodal
/// hash, a cache salt). kvpick reference-counts the prefix: it stays cached
/// until both copies are evicted, in either order. Dynamo keys its tree by
/// tokens and records only the first hash on the edge: evicting the first
/// copy drops the prefix while the second is still cached, and the second
/// hash then lingers in its lookup table, its eviction refused. kvpick is
/// right (the copies are indistinguishable to a router); evicting the
/// second copy first, both agree.
#[test]
fn one_worker_caching_the_same_tokens_under_two_engine_hashes() {
    let a = [1, 1];
    for first_evicted in [10, 60] {
        let mut r = Routers::new(1, 2, None, &[1, 2]);
        assert_eq!(r.store(1, None, &[10], &a), (stored(1), Ok(())));
        assert_eq!(r.store(1, None, &[60], &a), (stored(1), Ok(())));
        assert_eq!(r.kvpick(&a), vec![(1, 1)]);
        assert_eq!(r.dynamo_scores(&a), vec![(1, 1)]);

        let (ours, theirs) = r.remove(1, &[first_evicted]);
        assert_eq!(ours, Ok(Applied { removed: 1, ..Applied::default() }));
        assert_eq!(r.kvpick(&a), vec![(1, 1)], "kvpick after evicting {first_evicted}");
        if first_evicted == 10 {
            assert_eq!(theirs, Ok(()));
            assert_eq!(r.dynamo_scores(&a), vec![], "Dynamo forgets the second copy");
        } else {
            assert_eq!(theirs, Err(KvCacheEventError::BlockNotFound));
            assert_eq!(r.dynamo_scores(&a), vec![(1, 1)]);
        }

        let (ours, theirs) = r.remove(1, &[70 - first_evicted]);
        assert_eq!(ours, Ok(Applied { removed: 1, ..Applied::default() }));
        let expected = if first_evicted == 10 { Err(KvCacheEventError::BlockNotFound) } else { Ok(()) };
        assert_eq!(theirs, expected, "Dynamo, second eviction after evicting {first_evicted}");
        assert_eq!(r.kvpick(&a), vec![]);
        assert_eq!(r.dynamo_scores(&a), vec![]);
    }
}

/// An engine reports a hash it already holds, with other tokens (a 64-bit
/// collision, or a publisher reusing block ids without reporting the
/// eviction). Neither router can know which content is cached. kvpick keeps
/// what it recorded first and ignores the block (its chain continues from the
/// recorded content); Dynamo indexes both contents under one lookup entry
/// that now points at the second, so evicting the hash leaves the first
/// content cached in its tree for good: even `Cleared` keeps it, as clearing
/// walks the lookup table. Between the two events both answers are guesses;
/// after the eviction kvpick is exact and Dynamo keeps a phantom block. Content-addressed engine hashes
/// make this a collision-only case, and the differential test never sends it.
#[test]
fn an_engine_hash_reported_again_with_other_tokens() {
    let (a, b) = ([1, 1], [2, 2]);
    let mut r = Routers::new(1, 2, None, &[1, 2]);
    assert_eq!(r.store(1, None, &[10], &a), (stored(1), Ok(())));
    assert_eq!(r.store(1, None, &[10], &b), (stored(0), Ok(())));
    assert_eq!((r.kvpick(&a), r.kvpick(&b)), (vec![(1, 1)], vec![]));
    assert_eq!((r.dynamo_scores(&a), r.dynamo_scores(&b)), (vec![(1, 1)], vec![(1, 1)]));

    assert_eq!(r.remove(1, &[10]), (Ok(Applied { removed: 1, ..Applied::default() }), Ok(())));
    assert_eq!((r.kvpick(&a), r.kvpick(&b)), (vec![], vec![]));
    assert_eq!((r.dynamo_scores(&a), r.dynamo_scores(&b)), (vec![(1, 1)], vec![]), "Dynamo's phantom block");
    assert_eq!(r.clear(1), (Ok(Applied::default()), Ok(())));
    assert_eq!(r.kvpick(&a), vec![]);
    assert_eq!(r.dynamo_scores(&a), vec![(1, 1)], "Dynamo's phantom block survives Cleared");
}
