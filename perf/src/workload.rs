//! Synthetic KV-cache contents: which workers hold which prompt prefixes,
//! and the engine events that store or evict them.
//!
//! The model: a few system prompts (Zipf-popular, 256 to 3,072 tokens)
//! start every conversation; the rest of a conversation is turns unique to
//! it. A worker holds prefixes of the conversations it served, so it shares
//! system-prompt blocks with other workers and its own turns with no one,
//! except where a conversation moved between workers. *Probe* conversations
//! are 8,192-token prompts whose earlier turns were served by 8 to 32
//! workers: a probe matches one worker to its previous turn, others to
//! earlier turns, most others to its system prompt only, the rest not at all.
//!
//! Everything is derived from one seed, so replaying a population into
//! several indexes stores exactly the same blocks in the same order. Engine
//! block hashes are the blocks' sequence hashes (as when an engine is run
//! with a known hasher), which lets indexes that recompute sequence hashes
//! (Dynamo's `PositionalIndexer`) run on the same events.

use std::collections::VecDeque;

use fastrand::Rng;
use kvpick_core::hashing::{HashSeed, SequenceHash, chain, local_block_hash};

/// Tokens per KV block (the engines' `--block-size`).
pub const BLOCK_SIZE: u32 = 16;
const BLOCK: usize = BLOCK_SIZE as usize;
const VOCAB: u32 = 128_000;

/// Lengths in blocks of the system prompts, most popular first.
pub const SYSTEM_BLOCKS: [usize; 8] = [64, 16, 128, 32, 96, 24, 192, 48];

/// Filler conversations (beyond their system prompt) span this many blocks,
/// log-uniformly: 128 to 16,384 tokens.
const BODY_BLOCKS: (usize, usize) = (8, 1024);

/// Chance that a filler conversation also left an earlier turn on a second worker.
const MOVED_CONVERSATION: f64 = 0.2;

/// One KV event as an engine reports it, engine-neutral; hashes are
/// precomputed so that converting it to any index's event type is cheap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockEvent {
    /// Blocks in chain order; block 0's parent is `parent`.
    Stored {
        worker: u32,
        parent: Option<u64>,
        /// Engine block hashes (here: sequence hashes).
        hashes: Vec<u64>,
        /// Local (tokens-only) hashes, for indexes keyed by them.
        locals: Vec<u64>,
        /// `hashes.len() * BLOCK_SIZE` tokens.
        tokens: Vec<u32>,
    },
    /// Evicted blocks, children before their parents.
    Removed { worker: u32, hashes: Vec<u64> },
}

impl BlockEvent {
    pub fn worker(&self) -> u32 {
        match self {
            BlockEvent::Stored { worker, .. } | BlockEvent::Removed { worker, .. } => *worker,
        }
    }

    pub fn blocks(&self) -> usize {
        match self {
            BlockEvent::Stored { hashes, .. } | BlockEvent::Removed { hashes, .. } => hashes.len(),
        }
    }
}

/// Consecutive blocks of one chain as one worker stores them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub worker: u32,
    /// Engine hash of the block before the first one.
    pub parent: Option<u64>,
    pub tokens: Vec<u32>,
    pub locals: Vec<u64>,
    pub hashes: Vec<u64>,
}

impl Segment {
    /// Hashes `tokens` (a trailing partial block is dropped) chained to `parent`.
    pub fn new(worker: u32, parent: Option<u64>, mut tokens: Vec<u32>) -> Segment {
        tokens.truncate(tokens.len() / BLOCK * BLOCK);
        let blocks = tokens.len() / BLOCK;
        let (mut locals, mut hashes) = (Vec::with_capacity(blocks), Vec::with_capacity(blocks));
        let mut prev = parent.map(SequenceHash);
        for block in tokens.chunks_exact(BLOCK) {
            let local = local_block_hash(block, HashSeed::default());
            let seq = chain(prev, local);
            locals.push(local);
            hashes.push(seq.0);
            prev = Some(seq);
        }
        Segment { worker, parent, tokens, locals, hashes }
    }

    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Stored events of at most `batch` blocks each, each chained to the last.
    pub fn stored(&self, batch: usize, out: &mut Vec<BlockEvent>) {
        let batch = batch.max(1);
        let mut parent = self.parent;
        for start in (0..self.len()).step_by(batch) {
            let end = (start + batch).min(self.len());
            out.push(BlockEvent::Stored {
                worker: self.worker,
                parent,
                hashes: self.hashes[start..end].to_vec(),
                locals: self.locals[start..end].to_vec(),
                tokens: self.tokens[start * BLOCK..end * BLOCK].to_vec(),
            });
            parent = Some(self.hashes[end - 1]);
        }
    }

    /// Removed events of at most `batch` blocks each, last block first (an
    /// engine evicts a finished request's blocks leaf first).
    pub fn removed(&self, batch: usize, out: &mut Vec<BlockEvent>) {
        let reversed: Vec<u64> = self.hashes.iter().rev().copied().collect();
        for hashes in reversed.chunks(batch.max(1)) {
            out.push(BlockEvent::Removed { worker: self.worker, hashes: hashes.to_vec() });
        }
    }
}

/// Random tokens; the first `n` blocks from a seed are the same whatever `n`.
fn random_tokens(seed: u64, blocks: usize) -> Vec<u32> {
    let mut rng = Rng::with_seed(seed);
    (0..blocks * BLOCK).map(|_| rng.u32(..VOCAB)).collect()
}

/// A seed for item `i` of a `domain`, decorrelated from its neighbours (splitmix64).
fn derive_seed(seed: u64, domain: u64, i: u64) -> u64 {
    let mut z = seed ^ domain.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Index into `SYSTEM_BLOCKS`, with weight `1 / (rank + 1)`.
fn pick_system(rng: &mut Rng) -> usize {
    let total: f64 = (1..=SYSTEM_BLOCKS.len()).map(|r| 1.0 / r as f64).sum();
    let mut target = rng.f64() * total;
    for rank in 0..SYSTEM_BLOCKS.len() {
        target -= 1.0 / (rank + 1) as f64;
        if target < 0.0 {
            return rank;
        }
    }
    SYSTEM_BLOCKS.len() - 1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PopulationSpec {
    pub workers: u32,
    /// Stored (block, worker) pairs in total, exactly (a worker's probe
    /// history is cut short when it would exceed the worker's share).
    pub entries: u64,
    /// Probe conversations.
    pub probes: usize,
    /// Blocks of a probe prompt (512 = 8,192 tokens).
    pub prompt_blocks: usize,
    pub seed: u64,
}

#[derive(Clone, Debug)]
struct SystemPrompt {
    tokens: Vec<u32>,
    /// Sequence hash of its last block: the parent of every conversation's first turn.
    tail: u64,
}

#[derive(Clone, Copy, Debug)]
struct Conversation {
    system: usize,
    body_seed: u64,
}

/// A worker holds blocks `from..to` of a conversation's chain (its system
/// prompt, then its body), having already held blocks `0..from`: `from` is
/// 0, or the system prompt's length when the worker held it before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub worker: u32,
    pub conversation: usize,
    pub from: usize,
    pub to: usize,
}

/// A planned population: what each worker holds, in arrival order.
#[derive(Clone, Debug)]
pub struct Population {
    pub spec: PopulationSpec,
    systems: Vec<SystemPrompt>,
    conversations: Vec<Conversation>,
    placements: Vec<Placement>,
    probes: Vec<usize>,
    /// Bit `s` set: the worker holds system prompt `s` in full.
    held_systems: Vec<u64>,
    entries: u64,
}

struct Planner {
    rng: Rng,
    seed: u64,
    conversations: Vec<Conversation>,
    placements: Vec<Placement>,
    held_systems: Vec<u64>,
    used: Vec<u64>,
    budget: Vec<u64>,
}

impl Planner {
    fn conversation(&mut self, system: usize) -> usize {
        let body_seed = derive_seed(self.seed, 2, self.conversations.len() as u64);
        self.conversations.push(Conversation { system, body_seed });
        self.conversations.len() - 1
    }

    fn remaining(&self, worker: usize) -> u64 {
        self.budget[worker].saturating_sub(self.used[worker])
    }

    /// Places the first `depth` blocks of a conversation on a worker, cut
    /// to the worker's remaining budget. Returns the depth it then holds.
    fn place(&mut self, worker: usize, conversation: usize, depth: usize) -> usize {
        let system = self.conversations[conversation].system;
        let system_blocks = SYSTEM_BLOCKS[system];
        let from = if self.held_systems[worker] & (1 << system) != 0 { system_blocks } else { 0 };
        let to = depth.min(from + usize::try_from(self.remaining(worker)).unwrap_or(usize::MAX));
        if to <= from {
            return depth.min(from);
        }
        self.placements.push(Placement { worker: worker as u32, conversation, from, to });
        self.used[worker] += (to - from) as u64;
        if to >= system_blocks {
            self.held_systems[worker] |= 1 << system;
        }
        to
    }
}

impl Population {
    pub fn plan(spec: PopulationSpec) -> Population {
        let workers = spec.workers.max(1) as usize;
        let systems = SYSTEM_BLOCKS
            .iter()
            .enumerate()
            .map(|(i, &blocks)| {
                let tokens = random_tokens(derive_seed(spec.seed, 1, i as u64), blocks);
                let tail = Segment::new(0, None, tokens.clone()).hashes.last().copied().unwrap_or_default();
                SystemPrompt { tokens, tail }
            })
            .collect();
        let per_worker = spec.entries / workers as u64;
        let extra = (spec.entries % workers as u64) as usize;
        let mut p = Planner {
            rng: Rng::with_seed(spec.seed),
            seed: spec.seed,
            conversations: Vec::new(),
            placements: Vec::new(),
            held_systems: vec![0; workers],
            used: vec![0; workers],
            budget: (0..workers).map(|w| per_worker + u64::from(w < extra)).collect(),
        };

        // Probes first: their history is older than the filler's.
        let mut probes = Vec::with_capacity(spec.probes);
        let mut order: Vec<usize> = (0..workers).collect();
        for _ in 0..spec.probes {
            let system = pick_system(&mut p.rng);
            let conversation = p.conversation(system);
            probes.push(conversation);
            // The previous turn ends 16 blocks (256 tokens) before the prompt does.
            let last_turn = spec.prompt_blocks.saturating_sub(16).max(SYSTEM_BLOCKS[system] + 1);
            p.rng.shuffle(&mut order);
            let servers = p.rng.usize(8..=32).min(workers);
            for (i, &worker) in order[..servers].iter().enumerate() {
                let depth = if i == 0 { last_turn } else { p.rng.usize(SYSTEM_BLOCKS[system] + 1..=last_turn) };
                p.place(worker, conversation, depth);
            }
        }

        // Filler, round robin, until every worker has its share of entries.
        loop {
            let mut placed = false;
            for worker in 0..workers {
                if p.remaining(worker) == 0 {
                    continue;
                }
                placed = true;
                let system = pick_system(&mut p.rng);
                let (lo, hi) = (BODY_BLOCKS.0 as f64, BODY_BLOCKS.1 as f64);
                let body = (lo * (hi / lo).powf(p.rng.f64())).round() as usize;
                let conversation = p.conversation(system);
                let depth = p.place(worker, conversation, SYSTEM_BLOCKS[system] + body);
                let other = p.rng.usize(..workers);
                if depth > SYSTEM_BLOCKS[system] + 1
                    && other != worker
                    && p.remaining(other) > 0
                    && p.rng.f64() < MOVED_CONVERSATION
                {
                    let earlier = p.rng.usize(SYSTEM_BLOCKS[system] + 1..depth);
                    p.place(other, conversation, earlier);
                }
            }
            if !placed {
                break;
            }
        }

        let entries = p.used.iter().sum();
        Population {
            spec,
            systems,
            conversations: p.conversations,
            placements: p.placements,
            probes,
            held_systems: p.held_systems,
            entries,
        }
    }

    /// Stored (block, worker) pairs once every placement is replayed.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    pub fn workers(&self) -> u32 {
        self.held_systems.len() as u32
    }

    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    pub fn conversations(&self) -> usize {
        self.conversations.len()
    }

    /// The blocks a placement stores, hashed.
    pub fn segment(&self, placement: &Placement) -> Segment {
        let conversation = self.conversations[placement.conversation];
        let system = &self.systems[conversation.system];
        let system_blocks = SYSTEM_BLOCKS[conversation.system];
        let body = random_tokens(conversation.body_seed, placement.to.saturating_sub(system_blocks));
        if placement.from == 0 {
            let mut tokens = system.tokens[..placement.to.min(system_blocks) * BLOCK].to_vec();
            tokens.extend_from_slice(&body);
            Segment::new(placement.worker, None, tokens)
        } else {
            Segment::new(placement.worker, Some(system.tail), body)
        }
    }

    /// Emits every placement's Stored events, `batch` blocks each, in order.
    pub fn replay(&self, batch: usize, mut apply: impl FnMut(BlockEvent)) {
        let mut events = Vec::new();
        for placement in &self.placements {
            self.segment(placement).stored(batch, &mut events);
            events.drain(..).for_each(&mut apply);
        }
    }

    /// Tokens of each probe prompt (`prompt_blocks` full blocks).
    pub fn probe_prompts(&self) -> Vec<Vec<u32>> {
        self.probes
            .iter()
            .map(|&c| {
                let conversation = self.conversations[c];
                let system = &self.systems[conversation.system];
                let body_blocks = self.spec.prompt_blocks.saturating_sub(SYSTEM_BLOCKS[conversation.system]);
                let mut tokens = system.tokens.clone();
                tokens.extend(random_tokens(conversation.body_seed, body_blocks));
                tokens
            })
            .collect()
    }

    /// A system prompt the worker holds in full (chosen by `rng`), or none.
    fn held_system(&self, worker: u32, rng: &mut Rng) -> Option<usize> {
        let held = self.held_systems[worker as usize];
        if held == 0 {
            return None;
        }
        let nth = rng.u32(..held.count_ones());
        (0..SYSTEM_BLOCKS.len()).filter(|s| held & (1 << s) != 0).nth(nth as usize)
    }

    /// A new conversation turn on a random worker: `blocks` fresh blocks
    /// after a system prompt the worker holds.
    fn fresh_segment(&self, rng: &mut Rng, seed: u64, blocks: usize) -> Segment {
        let worker = rng.u32(..self.workers());
        let parent = self.held_system(worker, rng).map(|s| self.systems[s].tail);
        Segment::new(worker, parent, random_tokens(seed, blocks))
    }
}

/// Rounds of new conversations stored on top of a population, then evicted
/// again, so the index returns to the population after every round.
pub struct FreshConversations<'p> {
    population: &'p Population,
    rng: Rng,
    next: u64,
}

impl<'p> FreshConversations<'p> {
    pub fn new(population: &'p Population, seed: u64) -> Self {
        FreshConversations { population, rng: Rng::with_seed(seed), next: 0 }
    }

    /// `conversations` turns of `blocks` blocks each, stored in events of
    /// `batch` blocks, and their removal (same batch size, leaf first).
    pub fn round(&mut self, conversations: usize, blocks: usize, batch: usize) -> (Vec<BlockEvent>, Vec<BlockEvent>) {
        let (mut stores, mut removals) = (Vec::new(), Vec::new());
        for _ in 0..conversations {
            let seed = derive_seed(self.population.spec.seed, 3, self.next);
            self.next += 1;
            let segment = self.population.fresh_segment(&mut self.rng, seed, blocks);
            segment.stored(batch, &mut stores);
            segment.removed(batch, &mut removals);
        }
        (stores, removals)
    }
}

enum Resident {
    /// A population placement not touched yet.
    Planned(usize),
    /// Evictable hashes, parents first (evicted from the back).
    Hashes(Vec<u64>),
}

/// A steady state at capacity: every new turn stored on a worker (16 to 64
/// blocks, in events of 16) evicts as many blocks of that worker's oldest
/// conversations, leaf first, in events of 1 to 8 blocks, as an LRU engine
/// cache does. System prompts, which other conversations hang off, are never
/// evicted. About 4 in 5 events are removals; blocks split half and half.
pub struct EvictionMix<'p> {
    population: &'p Population,
    rng: Rng,
    next: u64,
    resident: Vec<VecDeque<Resident>>,
}

impl<'p> EvictionMix<'p> {
    pub fn new(population: &'p Population, seed: u64) -> Self {
        let mut resident: Vec<VecDeque<Resident>> = (0..population.workers()).map(|_| VecDeque::new()).collect();
        for (i, placement) in population.placements.iter().enumerate() {
            resident[placement.worker as usize].push_back(Resident::Planned(i));
        }
        EvictionMix { population, rng: Rng::with_seed(seed), next: 0, resident }
    }

    /// Events of at least `block_events` blocks in total.
    pub fn chunk(&mut self, block_events: usize) -> Vec<BlockEvent> {
        let mut out = Vec::new();
        let mut blocks = 0;
        while blocks < block_events {
            let seed = derive_seed(self.population.spec.seed, 4, self.next);
            self.next += 1;
            let turn = self.rng.usize(16..=64);
            let segment = self.population.fresh_segment(&mut self.rng, seed, turn);
            segment.stored(16, &mut out);
            blocks += segment.len();
            let worker = segment.worker;
            let queue = &mut self.resident[worker as usize];
            queue.push_back(Resident::Hashes(segment.hashes));
            let mut to_evict = turn;
            while to_evict > 0 {
                let Some(front) = queue.front_mut() else { break };
                if let Resident::Planned(i) = *front {
                    *front = Resident::Hashes(self.population.evictable(&self.population.placements[i]));
                }
                let Resident::Hashes(hashes) = front else { unreachable!("planned residents were just hashed") };
                let take = self.rng.usize(1..=8).min(to_evict).min(hashes.len());
                if take > 0 {
                    let evicted: Vec<u64> = hashes.drain(hashes.len() - take..).rev().collect();
                    out.push(BlockEvent::Removed { worker, hashes: evicted });
                    to_evict -= take;
                    blocks += take;
                }
                if hashes.is_empty() {
                    queue.pop_front();
                }
            }
        }
        out
    }
}

impl Population {
    /// Hashes of a placement's blocks past its system prompt, parents first.
    fn evictable(&self, placement: &Placement) -> Vec<u64> {
        let system_blocks = SYSTEM_BLOCKS[self.conversations[placement.conversation].system];
        let skip = system_blocks.saturating_sub(placement.from);
        let mut hashes = self.segment(placement).hashes;
        hashes.drain(..skip.min(hashes.len()));
        hashes
    }
}

#[cfg(test)]
mod tests;
