use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

fn chain(blocks: &[u64]) -> Arc<[SequenceHash]> {
    blocks.iter().map(|&b| SequenceHash(b)).collect()
}

#[test]
fn shared_prefix_blocks_are_counted_once() {
    let mut load = WorkerLoad::default();
    let a = chain(&[1, 2, 3, 4]);
    let b = chain(&[1, 2, 100]);
    load.book(&a, 1, 70);
    load.book(&b, 0, 10);
    assert_eq!(load.active_blocks(), 4 + 1 + 1);
    assert_eq!(load.active_prefix(&b), 3);
    assert_eq!(load.active_prefix(&chain(&[1, 7])), 1);
    assert_eq!(load.prefill_tokens(), 80);
    load.complete_prefill(70);
    load.release(&a, 1, 0);
    assert_eq!(load.active_blocks(), 3);
    assert_eq!(load.requests(), 1);
    load.release(&b, 0, 10);
    assert!(load.is_idle());
}

#[test]
fn a_prompt_ending_inside_a_run_splits_it_and_the_run_joins_again_when_it_goes() {
    let mut load = WorkerLoad::default();
    let long = chain(&(1..=512).collect::<Vec<_>>());
    let short = chain(&(1..=100).collect::<Vec<_>>());
    load.book(&long, 0, 0);
    load.book(&short, 0, 0);
    assert_eq!(load.tree.segments.len() - load.tree.free.len(), 2);
    assert_eq!(load.active_blocks(), 512);
    assert_eq!(load.active_prefix(&chain(&[1, 2, 3])), 3);
    load.release(&short, 0, 0);
    assert_eq!(load.tree.segments.len() - load.tree.free.len(), 1, "the split is undone");
    assert_eq!(load.active_prefix(&long), 512);
    load.release(&long, 0, 0);
    assert!(load.is_idle());
    assert!(load.tree.roots.is_empty());
}

#[test]
fn the_same_prompt_twice_is_one_run_with_two_bookings() {
    let mut load = WorkerLoad::default();
    let a = chain(&[5, 6, 7]);
    let again = chain(&[5, 6, 7]);
    load.book(&a, 0, 0);
    load.book(&again, 0, 0);
    assert_eq!(load.active_blocks(), 3);
    load.release(&a, 0, 0);
    assert_eq!(load.active_blocks(), 3);
    assert_eq!(load.active_prefix(&a), 3);
    load.release(&again, 0, 0);
    assert!(load.is_idle());
}

#[test]
fn freed_runs_keep_no_prompt_alive() {
    let mut load = WorkerLoad::default();
    let a = chain(&[1, 2, 3]);
    let b = chain(&[1, 2, 9]);
    load.book(&a, 0, 0);
    load.book(&b, 0, 0);
    load.release(&a, 0, 0);
    load.release(&b, 0, 0);
    assert_eq!(Arc::strong_count(&a), 1);
    assert_eq!(Arc::strong_count(&b), 1);
}

/// What the tree replaces: one reference count per booked block. Slow and
/// obviously right, so the tree is checked against it.
#[derive(Default)]
struct PerBlock {
    refs: HashMap<SequenceHash, u32>,
}

impl PerBlock {
    fn book(&mut self, seq: &[SequenceHash]) {
        for s in seq {
            *self.refs.entry(*s).or_default() += 1;
        }
    }

    fn release(&mut self, seq: &[SequenceHash]) {
        for s in seq {
            let refs = self.refs.get_mut(s).expect("booked");
            *refs -= 1;
            if *refs == 0 {
                self.refs.remove(s);
            }
        }
    }

    fn active_prefix(&self, seq: &[SequenceHash]) -> usize {
        seq.iter().take_while(|s| self.refs.contains_key(s)).count()
    }
}

/// Prompts from a small tree of conversations, so they share prefixes,
/// end inside each other and branch at every depth, again and again.
fn prompt() -> impl Strategy<Value = Vec<u64>> {
    (0u64..3, proptest::collection::vec(0u64..3, 0..40)).prop_map(|(root, steps)| {
        // A sequence hash names its prefix: derive each from its parent.
        let mut h = root * 1_000_003 + 1;
        steps
            .into_iter()
            .map(|step| {
                h = h.wrapping_mul(6364136223846793005).wrapping_add(step * 2 + 1);
                h
            })
            .collect()
    })
}

#[derive(Clone, Debug)]
enum Op {
    Book(Vec<u64>),
    /// Releases the n-th live booking (modulo how many are live).
    Release(usize),
    Probe(Vec<u64>),
    /// Probes the first `k` blocks of a live booking (`k` past its end adds
    /// a block no one booked).
    ProbeLive(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prompt().prop_map(Op::Book),
        2 => any::<usize>().prop_map(Op::Release),
        2 => prompt().prop_map(Op::Probe),
        2 => (any::<usize>(), 0usize..45).prop_map(|(n, k)| Op::ProbeLive(n, k)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_tree_counts_like_one_reference_count_per_block(ops in proptest::collection::vec(op(), 1..120)) {
        let mut load = WorkerLoad::default();
        let mut model = PerBlock::default();
        let mut live: Vec<Arc<[SequenceHash]>> = Vec::new();
        for op in ops {
            match op {
                Op::Book(p) => {
                    let seq = chain(&p);
                    load.book(&seq, 0, 0);
                    model.book(&seq);
                    live.push(seq);
                }
                Op::Release(n) if !live.is_empty() => {
                    let seq = live.swap_remove(n % live.len());
                    load.release(&seq, 0, 0);
                    model.release(&seq);
                }
                Op::Release(_) => {}
                Op::Probe(p) => {
                    let seq = chain(&p);
                    prop_assert_eq!(load.active_prefix(&seq), model.active_prefix(&seq));
                }
                Op::ProbeLive(_, _) if live.is_empty() => {}
                Op::ProbeLive(n, k) => {
                    let booked = &live[n % live.len()];
                    let mut seq = booked[..k.min(booked.len())].to_vec();
                    if k > booked.len() {
                        seq.push(SequenceHash(u64::MAX - k as u64));
                    }
                    prop_assert_eq!(load.active_prefix(&seq), model.active_prefix(&seq));
                }
            }
            check_invariants(&load.tree, &live)?;
            prop_assert_eq!(load.active_blocks(), model.refs.len() as u64);
            for seq in &live {
                prop_assert_eq!(load.active_prefix(seq), seq.len());
            }
            // Compressed: a segment per booking end or branch, never frayed
            // into runs that no booking separates.
            let segments = load.tree.segments.len() - load.tree.free.len();
            prop_assert!(segments <= 2 * live.len(), "{} segments for {} bookings", segments, live.len());
        }
        let booked: Vec<_> = live.clone();
        for seq in live.drain(..) {
            load.release(&seq, 0, 0);
        }
        for seq in &booked {
            prop_assert_eq!(Arc::strong_count(seq), 1, "a freed tree keeps no prompt alive");
        }
        prop_assert!(load.is_idle());
        prop_assert!(load.tree.roots.is_empty());
        prop_assert_eq!(load.tree.free.len(), load.tree.segments.len());
    }
}

/// The tree's shape, checked after every step of the proptest.
fn check_invariants(tree: &BookedTree, live: &[Arc<[SequenceHash]>]) -> Result<(), TestCaseError> {
    let mut reached = vec![false; tree.segments.len()];
    let mut stack: Vec<(SegmentId, u32)> = Vec::new();
    for (&key, &id) in &tree.roots {
        let root = &tree.segments[id as usize];
        prop_assert_eq!(root.start, 0);
        prop_assert_eq!(key, root.chain[0]);
        stack.push((id, 0));
    }
    let mut blocks = 0;
    while let Some((id, parent_end)) = stack.pop() {
        prop_assert!(!reached[id as usize], "segment {} reached twice", id);
        reached[id as usize] = true;
        let segment = &tree.segments[id as usize];
        prop_assert_eq!(segment.start, parent_end);
        prop_assert!(segment.start < segment.end && segment.end as usize <= segment.chain.len());
        blocks += segment.len();
        let ending = live
            .iter()
            .filter(|seq| seq.len() == segment.end as usize && seq[..] == segment.chain[..seq.len()])
            .count() as u32;
        let below: u32 = segment.children.iter().map(|&(_, c)| tree.segments[c as usize].refs).sum();
        prop_assert_eq!(segment.refs, ending + below, "refs of segment {}", id);
        prop_assert!(!(ending == 0 && segment.children.len() == 1), "segment {} and its only child are not joined", id);
        for &(first, child) in &segment.children {
            let c = &tree.segments[child as usize];
            prop_assert_eq!(first, c.chain[c.start as usize]);
            prop_assert_eq!(&c.chain[..segment.end as usize], &segment.chain[..segment.end as usize]);
            stack.push((child, segment.end));
        }
    }
    prop_assert_eq!(blocks, tree.blocks);
    for &id in &tree.free {
        prop_assert!(!reached[id as usize], "free segment {} is still in the tree", id);
        let vacant = &tree.segments[id as usize];
        prop_assert!(Arc::ptr_eq(&vacant.chain, &tree.vacant_chain) && vacant.children.is_empty());
    }
    prop_assert_eq!(reached.iter().filter(|&&r| r).count() + tree.free.len(), tree.segments.len());
    Ok(())
}

/// A chain that collides with another at one block (forged: 64-bit xxh3
/// collisions take ~2^32 work with the public seed) is booked apart from it,
/// so every booking still frees what it booked.
#[test]
fn a_forged_collision_books_apart_and_frees_cleanly() {
    let mut load = WorkerLoad::default();
    let a = chain(&[1, 2, 99]);
    let b = chain(&[1, 3, 99]);
    let c = chain(&[1, 3]);
    load.book(&a, 0, 0);
    load.book(&b, 0, 0);
    assert_eq!(load.active_blocks(), 5);
    load.book(&c, 0, 0);
    load.release(&b, 0, 0);
    load.release(&a, 0, 0);
    load.release(&c, 0, 0);
    assert!(load.is_idle());
    assert!(load.tree.roots.is_empty());
}
