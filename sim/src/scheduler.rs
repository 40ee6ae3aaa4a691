//! The engine's scheduler, one step at a time, in virtual time: pure and
//! synchronous (the async loop in `engine_loop` only paces and delivers).
//!
//! A step, like vLLM's: every running request past its prefill decodes one
//! token; running prefills get chunks of the remaining token budget
//! (`max_batched_tokens`), first come first served; then waiting requests
//! are admitted in arrival order while the budget, `max_num_seqs` and the
//! KV cache allow (the first that does not fit blocks the others).
//! Admission books the blocks of the prompt (and of tokens generated
//! before a preemption) and one more; a decoding request takes a block
//! each time its tokens fill one. When the cache has no block left for a
//! decode, the request admitted last is preempted as vLLM's recompute
//! preemption does: its blocks are released (those it cached stay cached
//! until evicted), it goes back to the head of the waiting queue, and on
//! readmission it recomputes its prompt (from whatever is still cached)
//! and resumes generating where it stopped. On
//! admission the request's leading cached blocks are hits (at most
//! `prompt_len - 1` tokens, as vLLM always computes the last prompt token),
//! counted in `prefix_cache_queries`/`prefix_cache_hits`. The step that
//! completes a prefill also samples the first token. A request finishes
//! after exactly `max_tokens` tokens (no EOS is sampled) and releases its
//! blocks. The step lasts [`TimeModel::step_ns`] of virtual time.
//!
//! Disaggregated prefill/decode ([`PdOptions`]): a prefill request may
//! **hold** its prompt's blocks when it finishes (pinned, as a running
//! request's, until [`Scheduler::release_hold`]), for a decode engine to
//! pull; a decode request may arrive with its leading prompt tokens'
//! KV already transferred, written into its blocks at admission (full
//! blocks cached and announced like computed ones) so that only the rest
//! of the prompt is computed.
//!
//! Determinism: given the same submissions in the same order, the same
//! configuration gives the same tokens, hashes, events and virtual times.

use std::collections::{HashMap, VecDeque};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::block_hash::{BlockDigest, EngineHasher};
use super::config::EngineConfig;
use super::event_batch::CacheEvent;
use super::prefix_cache::PrefixCache;
use super::time_model::TimeModel;
use super::tokenizer::{OUTPUT_WORDS, output_word};

/// An engine-local request id, in arrival order.
pub type RequestId = u64;

/// Finished requests remembered for inspection ([`Scheduler::outcomes`]).
const OUTCOMES_KEPT: usize = 4096;

/// What to generate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpec {
    /// The rendered prompt.
    pub prompt: Vec<u32>,
    /// Completion length (always reached).
    pub max_tokens: u32,
    /// Sampling seed; `None`: derived from the engine seed and arrival order.
    pub seed: Option<u64>,
}

/// How one leg of a disaggregated (P/D) request enters the scheduler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PdOptions {
    /// Leading prompt tokens whose KV a prefill engine computed and this
    /// engine received (0: none; at most the prompt's length). Written at
    /// admission; a request preempted later recomputes them.
    pub transferred_tokens: usize,
    /// On finishing, keep the prompt's blocks (full ones cached, the
    /// trailing partial one anonymous) pinned for a decode engine to pull,
    /// until [`Scheduler::release_hold`].
    pub hold_blocks: bool,
}

/// Blocks a finished prefill keeps for a transfer.
#[derive(Debug)]
struct Hold {
    cached: Vec<BlockDigest>,
    anonymous: usize,
}

/// A finished request's numbers; times in virtual nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub id: RequestId,
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    pub arrived_ns: u64,
    pub first_token_ns: u64,
    pub finished_ns: u64,
}

impl Outcome {
    /// Time to first token.
    pub fn ttft_ns(&self) -> u64 {
        self.first_token_ns - self.arrived_ns
    }

    /// Arrival to last token.
    pub fn latency_ns(&self) -> u64 {
        self.finished_ns - self.arrived_ns
    }
}

/// What a step produced for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    /// A sampled token and its text.
    Token { id: RequestId, token_id: u32, text: String },
    /// The request's last token was the previous update.
    Finished(Outcome),
}

/// One step's work and results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepReport {
    pub started_ns: u64,
    pub ended_ns: u64,
    /// Prompt tokens computed (all requests).
    pub prefill_tokens: u64,
    /// Requests that decoded a token.
    pub decoding: u64,
    pub updates: Vec<Update>,
    /// KV events of the step, in order (one batch on the wire).
    pub events: Vec<CacheEvent>,
}

/// Monotonic counters (vLLM's metrics of the same names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub finished: u64,
    pub aborted: u64,
    pub steps: u64,
    /// Running requests preempted for want of KV blocks.
    pub preemptions: u64,
}

#[derive(Debug)]
struct Sequence {
    id: RequestId,
    prompt: Vec<u32>,
    chain: Vec<BlockDigest>,
    max_tokens: u32,
    rng: fastrand::Rng,
    arrived_ns: u64,
    cached_tokens: u32,
    /// Prompt tokens computed (or cached).
    computed: usize,
    /// Cached blocks referenced: always `chain[..held.len()]`.
    held: Vec<BlockDigest>,
    anonymous: usize,
    generated: u32,
    first_token_ns: u64,
    /// This step's work: prompt tokens, or 1 decode token.
    chunk: usize,
    decode: bool,
    /// Disaggregated decode: prompt tokens whose KV came from a prefill
    /// engine (written into its blocks at admission, then 0).
    transferred: usize,
    /// Disaggregated prefill: keep the prompt's blocks when finished.
    hold_blocks: bool,
}

impl Sequence {
    fn prefill_done(&self) -> bool {
        self.computed == self.prompt.len()
    }
}

/// Checks a request against an engine's limits; the error is for the client.
pub fn check_request(cfg: &EngineConfig, prompt_len: usize, max_tokens: u32) -> Result<(), String> {
    if prompt_len == 0 {
        return Err("the prompt is empty".into());
    }
    if max_tokens == 0 {
        return Err("max_tokens must be at least 1".into());
    }
    let total = prompt_len as u64 + u64::from(max_tokens);
    if total > u64::from(cfg.max_model_len) {
        return Err(format!(
            "This model's maximum context length is {} tokens. However, you requested {total} tokens \
             ({prompt_len} in the messages, {max_tokens} in the completion).",
            cfg.max_model_len
        ));
    }
    let blocks = total.div_ceil(u64::from(cfg.block_size));
    if blocks > cfg.num_blocks as u64 {
        return Err(format!("the request needs {blocks} KV blocks, the engine has {}", cfg.num_blocks));
    }
    Ok(())
}

/// The scheduler and KV cache of one engine.
#[derive(Debug)]
pub struct Scheduler {
    cfg: EngineConfig,
    hasher: EngineHasher,
    cache: PrefixCache,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    now_ns: u64,
    next_id: RequestId,
    counters: Counters,
    outcomes: VecDeque<Outcome>,
    /// Finished prefills' blocks kept for a transfer, by request.
    holds: HashMap<RequestId, Hold>,
}

impl Scheduler {
    pub fn new(cfg: &EngineConfig) -> Self {
        Scheduler {
            hasher: EngineHasher::new(cfg.effective_hash_seed()),
            cache: PrefixCache::new(cfg.num_blocks, cfg.block_size),
            cfg: cfg.clone(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            now_ns: 0,
            next_id: 0,
            counters: Counters::default(),
            outcomes: VecDeque::new(),
            holds: HashMap::new(),
        }
    }

    /// Queues a request, arriving now; returns its id.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<RequestId, String> {
        self.submit_pd(spec, PdOptions::default())
    }

    /// Queues the decode half of a disaggregated request: a prefill engine
    /// computed its prompt and the KV blocks were transferred, so at
    /// admission its blocks hold the prompt (full blocks are cached and
    /// announced as any computed block) and it decodes from its first step,
    /// as vLLM's decode side does with a KV connector. A request preempted
    /// later recomputes its prompt here, as vLLM does.
    pub fn submit_prefilled(&mut self, spec: RequestSpec) -> Result<RequestId, String> {
        let transferred_tokens = spec.prompt.len();
        self.submit_pd(spec, PdOptions { transferred_tokens, hold_blocks: false })
    }

    /// Queues one leg of a disaggregated request (see [`PdOptions`]).
    pub fn submit_pd(&mut self, spec: RequestSpec, options: PdOptions) -> Result<RequestId, String> {
        check_request(&self.cfg, spec.prompt.len(), spec.max_tokens)?;
        if options.transferred_tokens > spec.prompt.len() {
            return Err(format!(
                "{} transferred tokens for a prompt of {}",
                options.transferred_tokens,
                spec.prompt.len()
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        let seed = spec.seed.unwrap_or_else(|| xxh3_64_with_seed(&id.to_le_bytes(), self.cfg.seed));
        self.waiting.push_back(Sequence {
            id,
            chain: self.hasher.chain(&spec.prompt, self.cfg.block_size),
            prompt: spec.prompt,
            max_tokens: spec.max_tokens,
            rng: fastrand::Rng::with_seed(seed),
            arrived_ns: self.now_ns,
            cached_tokens: 0,
            computed: 0,
            held: Vec::new(),
            anonymous: 0,
            generated: 0,
            first_token_ns: 0,
            chunk: 0,
            decode: false,
            transferred: options.transferred_tokens,
            hold_blocks: options.hold_blocks,
        });
        Ok(id)
    }

    /// Drops a request wherever it is, releasing its blocks.
    pub fn abort(&mut self, id: RequestId) -> bool {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i);
        } else if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let seq = self.running.remove(i);
            self.cache.release(&seq.held, seq.anonymous);
        } else {
            return false;
        }
        self.counters.aborted += 1;
        true
    }

    /// Engine restart: drops every request (returned) and empties the cache
    /// (no event: the restarted publisher announces it, or not).
    pub fn reset(&mut self) -> Vec<RequestId> {
        let ids: Vec<RequestId> = self.running.iter().chain(&self.waiting).map(|s| s.id).collect();
        self.counters.aborted += ids.len() as u64;
        self.running.clear();
        self.waiting.clear();
        self.holds.clear();
        self.cache.clear(false);
        ids
    }

    /// Unpins the blocks a finished prefill held for a transfer (pulled, or
    /// its lease over); `false` if it held none.
    pub fn release_hold(&mut self, id: RequestId) -> bool {
        let Some(hold) = self.holds.remove(&id) else { return false };
        self.cache.release(&hold.cached, hold.anonymous);
        true
    }

    /// Whether the finished request `id` holds blocks for a transfer.
    pub fn holds(&self, id: RequestId) -> bool {
        self.holds.contains_key(&id)
    }

    /// Finished prefills holding blocks for a transfer.
    pub fn held_transfers(&self) -> usize {
        self.holds.len()
    }

    /// Blocks (cached and anonymous) held for transfers.
    pub fn held_blocks(&self) -> usize {
        self.holds.values().map(|h| h.cached.len() + h.anonymous).sum()
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Virtual time now.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Moves virtual time forward to `ns` (never back): the engine was idle
    /// or stalled until then.
    pub fn advance_to(&mut self, ns: u64) {
        self.now_ns = self.now_ns.max(ns);
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    pub fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    pub fn time_model(&self) -> &TimeModel {
        &self.cfg.time
    }

    /// The last finished requests (up to 4,096), oldest first.
    pub fn outcomes(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes.iter()
    }

    /// Runs one step; `None` if there is nothing to run.
    pub fn step(&mut self) -> Option<StepReport> {
        let (prefill_tokens, decoding) = self.plan();
        if prefill_tokens == 0 && decoding == 0 {
            return None;
        }
        let started_ns = self.now_ns;
        self.now_ns += self.cfg.time.step_ns(prefill_tokens, decoding);
        self.counters.steps += 1;
        let updates = self.execute();
        Some(StepReport {
            started_ns,
            ended_ns: self.now_ns,
            prefill_tokens,
            decoding,
            updates,
            events: self.cache.drain_events(),
        })
    }

    /// Picks this step's work: decodes, prefill chunks, admissions.
    fn plan(&mut self) -> (u64, u64) {
        self.grow_or_preempt();
        let mut budget = self.cfg.max_batched_tokens as usize;
        let (mut prefill, mut decoding) = (0u64, 0u64);
        for seq in self.running.iter_mut().filter(|s| s.prefill_done()) {
            seq.decode = budget > 0;
            if seq.decode {
                budget -= 1;
                decoding += 1;
            }
        }
        for seq in self.running.iter_mut().filter(|s| !s.prefill_done()) {
            seq.chunk = (seq.prompt.len() - seq.computed).min(budget);
            budget -= seq.chunk;
            prefill += seq.chunk as u64;
        }
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(mut seq) = self.waiting.pop_front() else { break };
            if !self.admit(&mut seq) {
                self.waiting.push_front(seq);
                break;
            }
            if seq.prefill_done() {
                // Transferred: it decodes in this very step.
                seq.decode = true;
                budget -= 1;
                decoding += 1;
            } else {
                seq.chunk = (seq.prompt.len() - seq.computed).min(budget);
                budget -= seq.chunk;
                prefill += seq.chunk as u64;
            }
            self.running.push(seq);
        }
        (prefill, decoding)
    }

    /// Gives every decoding request the block its next token needs,
    /// preempting the request admitted last while the cache has none.
    fn grow_or_preempt(&mut self) {
        let bs = self.cfg.block_size as usize;
        let mut i = 0;
        while i < self.running.len() {
            let seq = &self.running[i];
            let held = seq.held.len() + seq.anonymous;
            let needed = (seq.prompt.len() + seq.generated as usize + 1).div_ceil(bs);
            if !seq.prefill_done() || needed <= held {
                i += 1;
                continue;
            }
            if self.cache.reserve(&[], needed - held) {
                self.running[i].anonymous += needed - held;
                i += 1;
                continue;
            }
            // `running` is in admission order: the last came last.
            let Some(victim) = self.running.pop() else { break };
            self.preempt(victim);
        }
    }

    /// vLLM's recompute preemption: the request gives its blocks back and
    /// waits at the head of the queue, keeping the tokens it generated.
    fn preempt(&mut self, mut seq: Sequence) {
        self.cache.release(&seq.held, seq.anonymous);
        seq.held.clear();
        seq.anonymous = 0;
        seq.computed = 0;
        seq.chunk = 0;
        seq.decode = false;
        self.counters.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Books a waiting request's blocks, hits first: its prompt's, those of
    /// tokens it generated before a preemption, and its next token's.
    fn admit(&mut self, seq: &mut Sequence) -> bool {
        let bs = self.cfg.block_size as usize;
        let max_hit_blocks = (seq.prompt.len() - 1) / bs;
        let hits = self.cache.match_len(&seq.chain).min(max_hit_blocks);
        let total_blocks = (seq.prompt.len() + seq.generated as usize + 1).div_ceil(bs);
        let new_blocks = total_blocks - hits;
        if !self.cache.reserve(&seq.chain[..hits], new_blocks) {
            return false;
        }
        seq.held = seq.chain[..hits].to_vec();
        seq.anonymous = new_blocks;
        seq.computed = hits * bs;
        let transferred = std::mem::take(&mut seq.transferred);
        if transferred > seq.computed {
            // The transferred blocks: written, so cached like computed ones,
            // and not computed here: they count as cached tokens.
            let full = (transferred / bs).min(seq.chain.len());
            if full > hits {
                self.cache.store(&seq.chain, &seq.prompt, hits..full);
                seq.held.extend_from_slice(&seq.chain[hits..full]);
                seq.anonymous -= full - hits;
            }
            seq.computed = transferred;
        }
        seq.cached_tokens = seq.computed as u32;
        self.counters.prefix_cache_queries += seq.prompt.len() as u64;
        // Transferred blocks are not hits of this engine's cache.
        self.counters.prefix_cache_hits += (hits * bs) as u64;
        self.counters.prompt_tokens += seq.prompt.len() as u64;
        true
    }

    /// Applies the planned work at the step's end.
    fn execute(&mut self) -> Vec<Update> {
        let bs = self.cfg.block_size as usize;
        let mut updates = Vec::new();
        for seq in &mut self.running {
            let mut sample = std::mem::take(&mut seq.decode);
            if seq.chunk > 0 {
                seq.computed += std::mem::take(&mut seq.chunk);
                let full = (seq.computed / bs).min(seq.chain.len());
                let stored = seq.held.len();
                if full > stored {
                    self.cache.store(&seq.chain, &seq.prompt, stored..full);
                    seq.held.extend_from_slice(&seq.chain[stored..full]);
                    seq.anonymous -= full - stored;
                }
                // A preempted request's recompute resumes its output.
                sample |= seq.prefill_done();
            }
            if sample {
                if seq.generated == 0 {
                    seq.first_token_ns = self.now_ns;
                }
                let (token_id, text) = output_word(seq.rng.usize(..OUTPUT_WORDS.len()));
                seq.generated += 1;
                self.counters.generation_tokens += 1;
                updates.push(Update::Token { id: seq.id, token_id, text });
            }
        }
        let now = self.now_ns;
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].generated < self.running[i].max_tokens {
                i += 1;
                continue;
            }
            let seq = self.running.remove(i);
            if seq.hold_blocks {
                // The prompt's blocks stay pinned for the transfer: its full
                // blocks and the partial last one (vLLM sends every block of
                // the prompt); the completion's blocks go.
                let partial = usize::from(seq.prompt.len() % bs != 0).min(seq.anonymous);
                self.cache.release(&[], seq.anonymous - partial);
                self.holds.insert(seq.id, Hold { cached: seq.held, anonymous: partial });
            } else {
                self.cache.release(&seq.held, seq.anonymous);
            }
            let outcome = Outcome {
                id: seq.id,
                prompt_tokens: seq.prompt.len() as u32,
                cached_tokens: seq.cached_tokens,
                completion_tokens: seq.generated,
                arrived_ns: seq.arrived_ns,
                first_token_ns: seq.first_token_ns,
                finished_ns: now,
            };
            self.counters.finished += 1;
            if self.outcomes.len() == OUTCOMES_KEPT {
                self.outcomes.pop_front();
            }
            self.outcomes.push_back(outcome);
            updates.push(Update::Finished(outcome));
        }
        updates
    }
}
