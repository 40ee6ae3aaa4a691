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
/// end inside each other and branch at many depths.
fn prompt() -> impl Strategy<Value = Vec<u64>> {
    (0u64..3, 1usize..24, 0u64..4, 0usize..24).prop_map(|(root, shared, branch, tail)| {
        // A sequence hash names its prefix: derive each from its parent.
        let mut out = Vec::new();
        let mut h = root * 1_000_003 + 1;
        for _ in 0..shared {
            h = h.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            out.push(h);
        }
        for _ in 0..tail {
            h = h.wrapping_mul(6364136223846793005).wrapping_add(branch + 7);
            out.push(h);
        }
        out
    })
}

#[derive(Clone, Debug)]
enum Op {
    Book(Vec<u64>),
    /// Releases the n-th live booking (modulo how many are live).
    Release(usize),
    Probe(Vec<u64>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prompt().prop_map(Op::Book),
        2 => any::<usize>().prop_map(Op::Release),
        2 => prompt().prop_map(Op::Probe),
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
            }
            prop_assert_eq!(load.active_blocks(), model.refs.len() as u64);
            for seq in &live {
                prop_assert_eq!(load.active_prefix(seq), seq.len());
            }
            // Compressed: a segment per booking end or branch, never frayed
            // into runs that no booking separates.
            let segments = load.tree.segments.len() - load.tree.free.len();
            prop_assert!(segments <= 2 * live.len(), "{} segments for {} bookings", segments, live.len());
        }
        for seq in live.drain(..) {
            load.release(&seq, 0, 0);
        }
        prop_assert!(load.is_idle());
        prop_assert!(load.tree.roots.is_empty());
        prop_assert_eq!(load.tree.free.len(), load.tree.segments.len());
    }
}
