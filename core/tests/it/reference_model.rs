//! Differential test: the sharded index and slot tables against a naive
//! model written for clarity (plain maps, linear scans), over random
//! sequences of worker changes, KV events, selections and booking changes,
//! with 1, 2 and 4 shards.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use kvpick_core::cost::pick;
use kvpick_core::hashing::{HashSeed, SequenceHash, chain, local_block_hash};
use kvpick_core::{
    Admission, Candidate, KvEvent, LoadSnapshot, Millis, Prompt, ReservationId, RouterConfig, SelectRequest,
    SelectionService, WorkerId, WorkerSpec,
};
use proptest::prelude::*;

const BS: u32 = 2;

#[derive(Default, Clone)]
struct NaiveWorker {
    /// engine hash → sequence hash
    blocks: HashMap<u64, SequenceHash>,
    bookings: BTreeMap<u64, NaiveBooking>,
}

#[derive(Clone)]
struct NaiveBooking {
    seq: Vec<SequenceHash>,
    unhashed: u64,
    prefill: u64,
    in_prefill: bool,
    lease_until: Millis,
}

impl NaiveWorker {
    fn holds(&self, seq: SequenceHash) -> bool {
        self.blocks.values().any(|s| *s == seq)
    }

    fn overlap(&self, prompt: &[SequenceHash]) -> u32 {
        prompt.iter().take_while(|s| self.holds(**s)).count() as u32
    }

    fn active_set(&self) -> HashSet<SequenceHash> {
        self.bookings.values().flat_map(|b| b.seq.iter().copied()).collect()
    }

    fn load(&self, id: WorkerId) -> LoadSnapshot {
        LoadSnapshot {
            worker: id,
            prefill_tokens: self.bookings.values().filter(|b| b.in_prefill).map(|b| b.prefill).sum(),
            active_blocks: self.active_set().len() as u64 + self.bookings.values().map(|b| b.unhashed).sum::<u64>(),
            requests: self.bookings.len() as u32,
            cached_blocks: self.blocks.len() as u64,
            block_size_mismatch: None,
            schedulable: true,
        }
    }
}

/// The model: workers by id, and the same generator the service uses.
struct Naive {
    workers: BTreeMap<WorkerId, NaiveWorker>,
    rng: fastrand::Rng,
    cfg: RouterConfig,
}

impl Naive {
    fn store(&mut self, id: WorkerId, parent: Option<u64>, hashes: &[u64], tokens: &[u32]) -> bool {
        let Some(w) = self.workers.get_mut(&id) else { return false };
        let mut parent_seq = match parent {
            None => None,
            Some(p) => match w.blocks.get(&p) {
                Some(s) => Some(*s),
                None => return false,
            },
        };
        for (h, block) in hashes.iter().zip(tokens.chunks_exact(BS as usize)) {
            let seq = match w.blocks.get(h) {
                Some(existing) => *existing,
                None => {
                    let seq = chain(parent_seq, local_block_hash(block, HashSeed::default()));
                    w.blocks.insert(*h, seq);
                    seq
                }
            };
            parent_seq = Some(seq);
        }
        true
    }

    fn select(&mut self, prompt: &Prompt, now: Millis, id: u64) -> Option<(WorkerId, u32)> {
        let mut candidates = Vec::new();
        for (wid, w) in &self.workers {
            let active = w.active_set();
            let load = w.load(*wid);
            candidates.push(Candidate {
                worker: *wid,
                endpoint: addr(wid.0),
                block_size: BS,
                overlap_blocks: w.overlap(&prompt.seq_hashes),
                active_prefill_tokens: load.prefill_tokens,
                active_blocks: load.active_blocks,
                new_blocks: prompt.seq_hashes.iter().filter(|s| !active.contains(s)).count() as u64,
                active_requests: load.requests,
                max_num_batched_tokens: None,
                total_kv_blocks: None,
                booked_prefix_blocks: 0,
                speed: 1.0,
                eviction_pressure: 0.0,
            });
        }
        if candidates.is_empty() {
            return None;
        }
        let unhashed = prompt.unhashed_blocks(BS);
        let costs: Vec<f64> = candidates.iter().map(|c| c.cost(prompt.isl_tokens, unhashed, &self.cfg)).collect();
        let chosen = &candidates[pick(&costs, self.cfg.temperature, &mut self.rng)];
        let booking = NaiveBooking {
            seq: prompt.seq_hashes.to_vec(),
            unhashed: u64::from(unhashed),
            prefill: u64::from(chosen.effective_prefill_tokens(prompt.isl_tokens)),
            in_prefill: true,
            lease_until: now.after(self.cfg.lease),
        };
        let result = (chosen.worker, chosen.overlap_blocks);
        self.workers.get_mut(&chosen.worker).expect("candidate exists").bookings.insert(id, booking);
        Some(result)
    }

    fn booking_mut(&mut self, id: u64) -> Option<&mut NaiveBooking> {
        self.workers.values_mut().find_map(|w| w.bookings.get_mut(&id))
    }

    fn free(&mut self, id: u64) -> bool {
        self.workers.values_mut().any(|w| w.bookings.remove(&id).is_some())
    }

    fn expire(&mut self, now: Millis) {
        for w in self.workers.values_mut() {
            w.bookings.retain(|_, b| b.lease_until > now);
        }
    }
}

fn addr(id: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, (id >> 8) as u8, id as u8], 8000))
}

#[derive(Clone, Debug)]
enum Op {
    AddWorker(u8),
    DeleteWorker(u8),
    /// Store `len` blocks of tokens drawn from `alphabet` on a worker,
    /// from the root or below one of its held blocks.
    Store {
        worker: u8,
        from_held: Option<u16>,
        len: u8,
        tokens: Vec<u8>,
    },
    Remove {
        worker: u8,
        picks: Vec<u16>,
        unknown: bool,
    },
    Clear(u8),
    /// Select for a prompt made of a held chain (optionally perturbed) or fresh tokens.
    Select {
        from_worker: u8,
        pick: u16,
        extra: Vec<u8>,
        perturb: Option<u8>,
    },
    PrefillComplete(u16),
    Free(u16),
    Advance(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u8..6).prop_map(Op::AddWorker),
        1 => (0u8..6).prop_map(Op::DeleteWorker),
        8 => (0u8..6, proptest::option::weighted(0.7, any::<u16>()), 1u8..6, proptest::collection::vec(0u8..3, 12))
            .prop_map(|(worker, from_held, len, tokens)| Op::Store { worker, from_held, len, tokens }),
        3 => (0u8..6, proptest::collection::vec(any::<u16>(), 1..4), any::<bool>())
            .prop_map(|(worker, picks, unknown)| Op::Remove { worker, picks, unknown }),
        1 => (0u8..6).prop_map(Op::Clear),
        6 => (0u8..6, any::<u16>(), proptest::collection::vec(0u8..3, 0..5), proptest::option::of(0u8..8))
            .prop_map(|(from_worker, pick, extra, perturb)| Op::Select { from_worker, pick, extra, perturb }),
        2 => any::<u16>().prop_map(Op::PrefillComplete),
        2 => any::<u16>().prop_map(Op::Free),
        1 => (0u16..200).prop_map(Op::Advance),
    ]
}

/// (parent engine hash, tokens of the block)
type KnownBlock = (Option<u64>, Vec<u32>);

/// Per-worker chains as the test remembers them: engine hash → (parent engine hash, tokens of its block).
#[derive(Default)]
struct Chains {
    blocks: BTreeMap<u8, BTreeMap<u64, KnownBlock>>,
    next_hash: u64,
}

impl Chains {
    /// Tokens of the whole prefix ending at `hash`, if the test still knows it.
    fn prefix(&self, worker: u8, mut hash: u64) -> Vec<u32> {
        let mut parts = Vec::new();
        let blocks = &self.blocks[&worker];
        while let Some((parent, tokens)) = blocks.get(&hash) {
            parts.push(tokens.clone());
            match parent {
                Some(p) => hash = *p,
                None => break,
            }
        }
        parts.into_iter().rev().flatten().collect()
    }
}

fn run(ops: &[Op], shards: usize) -> Result<(), TestCaseError> {
    let cfg = RouterConfig { lease: Duration::from_millis(500), ..RouterConfig::default() };
    let mut svc = SelectionService::new(cfg.clone(), BS, shards);
    let mut naive = Naive { workers: BTreeMap::new(), rng: fastrand::Rng::with_seed(cfg.seed), cfg };
    let mut chains = Chains { next_hash: 1, ..Chains::default() };
    let mut now = Millis(0);
    let mut next_id = 0u64;
    let mut prompts: Vec<Prompt> = Vec::new();

    for op in ops {
        match op {
            Op::AddWorker(w) => {
                let id = WorkerId(u64::from(*w));
                svc.upsert_worker(WorkerSpec::new(id, addr(id.0), BS), now).expect("block size matches");
                naive.workers.entry(id).or_default();
                chains.blocks.entry(*w).or_default();
            }
            Op::DeleteWorker(w) => {
                let id = WorkerId(u64::from(*w));
                prop_assert_eq!(svc.delete_worker(id).is_ok(), naive.workers.remove(&id).is_some());
                chains.blocks.remove(w);
            }
            Op::Store { worker, from_held, len, tokens } => {
                let Some(known) = chains.blocks.get(worker) else { continue };
                let parent = from_held.and_then(|i| known.keys().nth(i as usize % known.len().max(1)).copied());
                let toks: Vec<u32> =
                    tokens.iter().cycle().take(*len as usize * BS as usize).map(|t| u32::from(*t)).collect();
                let hashes: Vec<u64> = (0..*len as u64).map(|i| chains.next_hash + i).collect();
                chains.next_hash += *len as u64;
                let event = KvEvent::Stored {
                    block_hashes: hashes.clone(),
                    parent,
                    token_ids: toks.clone(),
                    block_size: BS,
                    seed: HashSeed::default(),
                };
                let id = WorkerId(u64::from(*worker));
                let applied = svc.apply_kv_event(id, &event).is_ok();
                prop_assert_eq!(applied, naive.store(id, parent, &hashes, &toks));
                if applied {
                    let mut p = parent;
                    let known = chains.blocks.get_mut(worker).expect("checked above");
                    for (h, block) in hashes.iter().zip(toks.chunks(BS as usize)) {
                        known.insert(*h, (p, block.to_vec()));
                        p = Some(*h);
                    }
                }
            }
            Op::Remove { worker, picks, unknown } => {
                let id = WorkerId(u64::from(*worker));
                let Some(w) = naive.workers.get_mut(&id) else { continue };
                let held: Vec<u64> =
                    w.blocks.keys().copied().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
                let mut hashes: Vec<u64> =
                    picks.iter().filter(|_| !held.is_empty()).map(|i| held[*i as usize % held.len()]).collect();
                if *unknown {
                    hashes.push(u64::MAX - 7);
                }
                for h in &hashes {
                    w.blocks.remove(h);
                }
                svc.apply_kv_event(id, &KvEvent::Removed { block_hashes: hashes }).expect("worker exists");
            }
            Op::Clear(worker) => {
                let id = WorkerId(u64::from(*worker));
                if let Some(w) = naive.workers.get_mut(&id) {
                    w.blocks.clear();
                    svc.apply_kv_event(id, &KvEvent::Cleared).expect("worker exists");
                }
            }
            Op::Select { from_worker, pick, extra, perturb } => {
                let mut toks = match chains.blocks.get(from_worker).filter(|b| !b.is_empty()) {
                    Some(known) => {
                        let hash = *known.keys().nth(*pick as usize % known.len()).expect("non-empty");
                        chains.prefix(*from_worker, hash)
                    }
                    None => Vec::new(),
                };
                if let Some(at) = perturb {
                    if !toks.is_empty() {
                        let i = *at as usize % toks.len();
                        toks[i] += 7;
                    }
                }
                toks.extend(extra.iter().map(|t| u32::from(*t)));
                let prompt = svc.prompt(&toks, HashSeed::default());
                next_id += 1;
                let request = SelectRequest {
                    id: ReservationId(next_id),
                    prompt: prompt.clone(),
                    model: None,
                    allowed: None,
                    priority: 0,
                    sticky: None,
                };
                let got = svc.select_and_reserve(request, now);
                let want = naive.select(&prompt, now, next_id);
                match (got, want) {
                    (Ok(Admission::Reserved(sel)), Some((worker, overlap))) => {
                        prop_assert_eq!((sel.worker, sel.overlap_blocks), (worker, overlap));
                    }
                    (Err(_), None) => {}
                    (got, want) => prop_assert!(false, "service {:?} vs model {:?}", got, want),
                }
                prompts.push(prompt);
            }
            Op::PrefillComplete(i) => {
                if next_id == 0 {
                    continue;
                }
                let id = u64::from(*i) % next_id + 1;
                let known = naive.booking_mut(id).map(|b| b.in_prefill = false).is_some();
                prop_assert_eq!(svc.prefill_complete(ReservationId(id), now).is_ok(), known);
            }
            Op::Free(i) => {
                if next_id == 0 {
                    continue;
                }
                let id = u64::from(*i) % next_id + 1;
                prop_assert_eq!(svc.free_reservation(ReservationId(id), now).is_ok(), naive.free(id));
            }
            Op::Advance(ms) => {
                now = Millis(now.0 + u64::from(*ms));
                svc.tick(now);
                naive.expire(now);
            }
        }

        let want_loads: Vec<LoadSnapshot> = naive.workers.iter().map(|(id, w)| w.load(*id)).collect();
        prop_assert_eq!(svc.loads(), want_loads);
        for prompt in prompts.iter().rev().take(4) {
            let want: Vec<(WorkerId, u32)> = naive
                .workers
                .iter()
                .map(|(id, w)| (*id, w.overlap(&prompt.seq_hashes)))
                .filter(|(_, depth)| *depth > 0)
                .collect();
            prop_assert_eq!(svc.overlap_scores(prompt), want);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn sharded_service_matches_the_naive_model(ops in proptest::collection::vec(op(), 1..250)) {
        for shards in [1, 2, 4] {
            run(&ops, shards)?;
        }
    }
}

/// Long chains exercise the jump search (the proptest's chains are short).
#[test]
fn long_chains_with_holes_match_the_naive_model() {
    let mut rng = fastrand::Rng::with_seed(11);
    for shards in [1, 2, 4] {
        let mut ops = vec![Op::AddWorker(0), Op::AddWorker(1), Op::AddWorker(2)];
        for step in 0..400u32 {
            let worker = rng.u8(0..3);
            ops.push(match step % 5 {
                0..=2 => Op::Store {
                    worker,
                    from_held: if rng.u8(0..10) < 8 { Some(rng.u16(..)) } else { None },
                    len: 5,
                    tokens: (0..12).map(|_| rng.u8(0..2)).collect(),
                },
                3 => Op::Remove { worker, picks: vec![rng.u16(..)], unknown: false },
                _ => Op::Select { from_worker: worker, pick: rng.u16(..), extra: vec![], perturb: None },
            });
        }
        run(&ops, shards).expect("matches the model");
    }
}
