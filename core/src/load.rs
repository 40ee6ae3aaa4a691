//! A worker's slot table: the load booked on it by active reservations.
//!
//! Every booking books a whole chain of sequence hashes from the prompt's
//! first block, so the worker's active blocks are the union of a few chains
//! from their roots: a tree. It is kept compressed, one node per run of
//! blocks that the same bookings share (`Segment`), so booking, freeing and
//! "how much of this prompt is active here" cost one step per branch or
//! booking end along the prompt's path, not one per block (a 512-block
//! prompt used to touch 512 reference counts to book and 512 to free).
//!
//! A sequence hash names its whole prefix, so two chains that agree at depth
//! `d` agree at every depth before it: where a prompt leaves a segment is
//! found by bisection over the segment's own blocks.

use std::collections::HashMap;
use std::sync::Arc;

use rustc_hash::FxBuildHasher;
use smallvec::SmallVec;

use crate::hashing::SequenceHash;

/// Prefill tokens still to compute and KV blocks held by active requests.
#[derive(Debug, Default)]
pub struct WorkerLoad {
    prefill_tokens: u64,
    tree: BookedTree,
    /// Blocks with no sequence hash: trailing partial blocks and prompts
    /// booked without tokens. Never shared.
    unhashed_blocks: u64,
    requests: u32,
}

impl WorkerLoad {
    pub fn prefill_tokens(&self) -> u64 {
        self.prefill_tokens
    }

    pub fn active_blocks(&self) -> u64 {
        self.tree.blocks + self.unhashed_blocks
    }

    pub fn requests(&self) -> u32 {
        self.requests
    }

    pub fn is_idle(&self) -> bool {
        self.requests == 0 && self.prefill_tokens == 0 && self.active_blocks() == 0
    }

    /// How many leading blocks of `seq` are already active here.
    pub fn active_prefix(&self, seq: &[SequenceHash]) -> usize {
        self.tree.walk(seq, Compare::Ends, |_| {}).depth
    }

    pub fn book(&mut self, seq: &Arc<[SequenceHash]>, unhashed_blocks: u32, prefill_tokens: u32) {
        self.tree.book(seq);
        self.unhashed_blocks += u64::from(unhashed_blocks);
        self.prefill_tokens += u64::from(prefill_tokens);
        self.requests += 1;
    }

    pub fn complete_prefill(&mut self, prefill_tokens: u32) {
        self.prefill_tokens -= u64::from(prefill_tokens);
    }

    /// Undoes `book`; `prefill_tokens` is what is still booked as prefill
    /// (zero once prefill completed).
    pub fn release(&mut self, seq: &[SequenceHash], unhashed_blocks: u32, prefill_tokens: u32) {
        self.tree.release(seq);
        self.unhashed_blocks -= u64::from(unhashed_blocks);
        self.prefill_tokens -= u64::from(prefill_tokens);
        self.requests -= 1;
    }
}

type SegmentId = u32;

/// Blocks `chain[start..end]`, booked by `refs` bookings, each of which
/// books all of them (a booking that ends inside a run splits it there).
#[derive(Debug)]
struct Segment {
    /// Any chain through this segment; only `..end` of it is read, which every
    /// chain through it shares. Shared with the booking, not copied.
    chain: Arc<[SequenceHash]>,
    start: u32,
    end: u32,
    refs: u32,
    /// Segments continuing this one, by their first block (kept here so
    /// choosing a child reads no other segment). Two stay inline: a run is
    /// mostly continued by one or two others.
    children: SmallVec<[(SequenceHash, SegmentId); 2]>,
}

impl Segment {
    fn len(&self) -> u64 {
        u64::from(self.end - self.start)
    }
}

/// How a walk tells where a prompt leaves a segment.
#[derive(Clone, Copy)]
enum Compare {
    /// The segment's last block, then bisection.
    Ends,
    /// Every block.
    Every,
}

/// Where a walk along a prompt stopped.
struct Walk {
    /// Leading blocks of the prompt that are booked.
    depth: usize,
    /// The segment holding the last of them, if any.
    last: Option<SegmentId>,
}

#[derive(Debug, Default)]
struct BookedTree {
    /// Slab of segments; `free` lists the vacant ones.
    segments: Vec<Segment>,
    free: Vec<SegmentId>,
    /// Segments starting at depth 0, by their first block.
    roots: HashMap<SequenceHash, SegmentId, FxBuildHasher>,
    /// Distinct booked blocks: the sum of the segments' lengths.
    blocks: u64,
    /// The walk's segments, kept between calls so booking and freeing do not
    /// allocate.
    path: Vec<SegmentId>,
    /// Put in vacant segments so they keep no prompt alive.
    vacant_chain: Arc<[SequenceHash]>,
}

impl BookedTree {
    /// Follows `seq` down the tree, calling `visit` with every segment it
    /// enters, including one it leaves part-way.
    ///
    /// `Compare::Ends` trusts that a sequence hash names its whole prefix
    /// (true of every chain `Prompt` hashes); `Compare::Every` checks every
    /// block, so a forged collision cannot graft one prompt onto another's
    /// run: booking uses it, and the tree's paths are then exactly the
    /// booked chains, which the cheaper walks may rely on.
    fn walk(&self, seq: &[SequenceHash], compare: Compare, mut visit: impl FnMut(SegmentId)) -> Walk {
        let mut walk = Walk { depth: 0, last: None };
        let Some(first) = seq.first() else { return walk };
        let Some(mut id) = self.roots.get(first).copied() else { return walk };
        loop {
            visit(id);
            walk.last = Some(id);
            let segment = &self.segments[id as usize];
            let (start, end) = (segment.start as usize, segment.end as usize);
            let shared = seq.len().min(end);
            // The segment's first block is known to match (that is how it was
            // chosen); usually its last does too, which one comparison tells.
            let differs_at = match compare {
                Compare::Ends if seq[shared - 1] != segment.chain[shared - 1] => {
                    Some(first_disagreement(seq, &segment.chain, start + 1, shared - 1))
                }
                Compare::Ends => None,
                Compare::Every if std::ptr::eq(seq.as_ptr(), segment.chain.as_ptr()) => None,
                Compare::Every => (start + 1..shared).find(|&d| seq[d] != segment.chain[d]),
            };
            if let Some(depth) = differs_at {
                walk.depth = depth;
                return walk;
            }
            walk.depth = shared;
            if shared == seq.len() {
                return walk;
            }
            let next = seq[end];
            match segment.children.iter().find(|(first, _)| *first == next) {
                Some(&(_, child)) => id = child,
                None => return walk,
            }
        }
    }

    /// `walk`, keeping the segments it entered in the tree's scratch path,
    /// taken out for the caller to hand back (`self.path = path`).
    fn walk_path(&mut self, seq: &[SequenceHash], compare: Compare) -> (Walk, Vec<SegmentId>) {
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let walk = self.walk(seq, compare, |id| path.push(id));
        (walk, path)
    }

    /// Books the whole of `seq`: every segment along it gains a booking, a
    /// segment the prompt leaves or ends inside is cut there, and what is not
    /// booked yet becomes a new segment holding `seq` itself.
    fn book(&mut self, seq: &Arc<[SequenceHash]>) {
        if seq.is_empty() {
            return;
        }
        let (walk, path) = self.walk_path(seq, Compare::Every);
        if let Some(last) = walk.last {
            if walk.depth < self.segments[last as usize].end as usize {
                self.split(last, walk.depth as u32);
            }
        }
        for &id in &path {
            self.segments[id as usize].refs += 1;
        }
        self.path = path;
        if walk.depth == seq.len() {
            return;
        }
        let new = self.alloc(Segment {
            chain: Arc::clone(seq),
            start: walk.depth as u32,
            end: seq.len() as u32,
            refs: 1,
            children: SmallVec::new(),
        });
        self.blocks += (seq.len() - walk.depth) as u64;
        let first = seq[walk.depth];
        match walk.last {
            Some(parent) => self.segments[parent as usize].children.push((first, new)),
            None => {
                self.roots.insert(first, new);
            }
        }
    }

    /// Undoes `book(seq)`. Segments left with no booking go (they are the
    /// tail of the path: a segment has at least its children's bookings); the
    /// deepest one left is joined to its only child when no booking ends
    /// between them, so the tree does not fray into short runs over time.
    fn release(&mut self, seq: &[SequenceHash]) {
        if seq.is_empty() {
            return;
        }
        let (walk, path) = self.walk_path(seq, Compare::Ends);
        let booked = walk.depth == seq.len()
            && walk.last.is_some_and(|last| self.segments[last as usize].end as usize == seq.len());
        // Always true: `release` gets the very chain `book` put in the tree.
        debug_assert!(booked, "released a chain that was not booked");
        if booked {
            for &id in &path {
                self.segments[id as usize].refs -= 1;
            }
            let kept = path.iter().take_while(|&&id| self.segments[id as usize].refs > 0).count();
            for depth in (kept..path.len()).rev() {
                let id = path[depth];
                match depth.checked_sub(1).map(|d| path[d]) {
                    Some(parent) => self.segments[parent as usize].children.retain(|(_, child)| *child != id),
                    // The path's first segment is the root keyed by the prompt's first block.
                    None => {
                        self.roots.remove(&seq[0]);
                    }
                }
                self.blocks -= self.segments[id as usize].len();
                self.vacate(id);
            }
            if let Some(&deepest) = kept.checked_sub(1).and_then(|d| path.get(d)) {
                self.join_only_child(deepest);
            }
            // A segment left holding the freed prompt would keep all of it
            // alive (up to 8,192 blocks for a one-block run): it takes a child's
            // chain instead, which runs through it too. Deepest first, so each
            // takes a chain its child no longer shares with the freed prompt.
            for &id in path[..kept].iter().rev() {
                let segment = &self.segments[id as usize];
                if std::ptr::eq(segment.chain.as_ptr(), seq.as_ptr()) {
                    if let Some(&(_, child)) = segment.children.first() {
                        let chain = Arc::clone(&self.segments[child as usize].chain);
                        self.segments[id as usize].chain = chain;
                    }
                }
            }
        }
        self.path = path;
    }

    /// Cuts segment `id` before depth `at`; the tail keeps its bookings and
    /// children.
    fn split(&mut self, id: SegmentId, at: u32) {
        let segment = &mut self.segments[id as usize];
        debug_assert!(segment.start < at && at < segment.end);
        let tail = Segment {
            chain: Arc::clone(&segment.chain),
            start: at,
            end: segment.end,
            refs: segment.refs,
            children: std::mem::take(&mut segment.children),
        };
        segment.end = at;
        let first = tail.chain[at as usize];
        let tail = self.alloc(tail);
        self.segments[id as usize].children.push((first, tail));
    }

    /// Joins `id` and its only child when every booking of one is a booking
    /// of the other (no booking ends at `id`'s end).
    fn join_only_child(&mut self, id: SegmentId) {
        let segment = &self.segments[id as usize];
        let [(_, child)] = segment.children[..] else { return };
        if self.segments[child as usize].refs != segment.refs {
            return;
        }
        let child_segment = &mut self.segments[child as usize];
        let (chain, children, end) =
            (Arc::clone(&child_segment.chain), std::mem::take(&mut child_segment.children), child_segment.end);
        let segment = &mut self.segments[id as usize];
        segment.chain = chain;
        segment.end = end;
        segment.children = children;
        self.vacate(child);
    }

    fn alloc(&mut self, segment: Segment) -> SegmentId {
        match self.free.pop() {
            Some(id) => {
                self.segments[id as usize] = segment;
                id
            }
            None => {
                self.segments.push(segment);
                (self.segments.len() - 1) as SegmentId
            }
        }
    }

    fn vacate(&mut self, id: SegmentId) {
        let segment = &mut self.segments[id as usize];
        segment.chain = Arc::clone(&self.vacant_chain);
        segment.children.clear();
        self.free.push(id);
    }
}

/// The first depth in `lo..=hi` where `seq` and `chain` differ, given that
/// they agree before `lo` and differ at `hi`. Agreement is a prefix (a
/// sequence hash names its whole prefix), so bisection finds it.
fn first_disagreement(seq: &[SequenceHash], chain: &[SequenceHash], mut lo: usize, mut hi: usize) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if seq[mid] == chain[mid] {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests;
