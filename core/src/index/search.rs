//! The jump search behind [`KvIndex::find_matches`], done in rounds.
//!
//! A probe is one holder-table lookup, and on a live router the table is
//! not in cache: each probe is a cache miss or two. Done depth-first, a
//! lookup's ~16 jumps and ~100 bisection probes (64 workers dropping out
//! at different depths) queue their misses one after another. Here every
//! round's probes are independent of each other: first the jump points, a
//! growing batch at a time, then the bisections a level at a time across
//! every dropped group. Each round looks all its blocks up before reading
//! any result, so the misses overlap (perf/README.md, "`find_matches` in
//! rounds"). The answers are the depth-first search's; the lookups are
//! too, but for the rest of a jump batch past where the last worker
//! dropped out.

use smallvec::SmallVec;

use super::holders::Holders;
use super::placed::Placed;
use super::{JUMP, KvIndex};
use crate::hashing::SequenceHash;
use crate::slot_set::{Bitmap, HolderSet, Live, MatchByWidth, Slot, SlotSet, find_matches_by_width};

/// Probes in one round. 64 covers every group a one-word shard can have
/// and bounds the stack the groups take (their arrays are not initialised,
/// so an empty round costs nothing); a level with more bisects the rest of
/// a group depth-first, with the same answer and no allocation.
const ROUND: usize = 64;

/// Blocks `lo..hi` of a prompt: a group's slots hold block `lo` and not
/// block `hi`. 8 bytes, aligned as one, so a group is filed as two stores
/// (span, set) its later copy can forward from: with two `usize` fields
/// built one by one, the copy's 16-byte load stalled on store forwarding
/// and a 64-worker warm lookup took 1.6 µs instead of 1.0 (perf annotate).
#[derive(Clone, Copy)]
#[repr(align(8))]
struct Span {
    lo: u32,
    hi: u32,
}

impl Span {
    fn mid(self) -> u32 {
        self.lo + (self.hi - self.lo) / 2
    }
}

/// The groups of one bisection level.
type Groups<B> = SmallVec<[(Span, Live<B>); ROUND]>;

/// One round's lookups, in the order of its groups or jump points: the
/// keys, then what each found.
struct Round<'a, H> {
    keys: [SequenceHash; ROUND],
    found: [Option<&'a H>; ROUND],
}

/// A lookup in a holder table of sets of type `H`. Passed by value (three
/// words): behind a reference, every probe would load the table's address
/// before the table.
struct Search<'a, H> {
    holders: &'a Placed<SequenceHash, H>,
    seq: &'a [SequenceHash],
}

impl<H> Clone for Search<'_, H> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H> Copy for Search<'_, H> {}

impl<'a, H: HolderSet> Search<'a, H> {
    /// Looks `keys` up (at most `ROUND`): all prefetched before any is read,
    /// so their cache misses overlap. Each key is read from the prompt once
    /// and kept for its lookup: reading it again after the prefetch cost
    /// 4-6% of a warm lookup (perf/README, "Emitting a lookup's answers").
    fn look_up(self, keys: impl Iterator<Item = SequenceHash>, round: &mut Round<'a, H>) {
        // Callers cap a level and a jump batch at `ROUND`; a key past it
        // would go unread.
        debug_assert!(keys.size_hint().1.is_some_and(|most| most <= ROUND));
        let mut n = 0;
        for (key, kept) in keys.zip(round.keys.iter_mut()) {
            self.holders.prefetch_home(key);
            *kept = key;
            n += 1;
        }
        for (key, found) in round.keys[..n].iter().zip(round.found.iter_mut()) {
            *found = self.holders.get(key);
        }
    }

    /// Depth-first bisection of one unsettled group, for a level that is
    /// full.
    fn bisect<B: Bitmap>(self, group: (Span, Live<B>), out: &mut Vec<(Slot, u32)>) {
        let holders_of_mid = self.holders.get(&self.seq[group.0.mid() as usize]);
        let [upper, lower] = halves(group, holders_of_mid);
        if let Some(upper) = settle(upper, out) {
            self.bisect(upper, out);
        }
        if let Some(lower) = settle(lower, out) {
            self.bisect(lower, out);
        }
    }

    /// Files a group for the next level, unless it is settled or the level
    /// is full (then it is bisected at once).
    fn file<B: Bitmap>(self, level: &mut Groups<B>, group: (Span, Live<B>), out: &mut Vec<(Slot, u32)>) {
        let Some(group) = settle(group, out) else { return };
        if level.len() < ROUND {
            level.push(group);
        } else {
            self.bisect(group, out);
        }
    }

    /// Bisects every group a level at a time, each level's probes looked
    /// up together. Leaves both levels empty.
    fn bisect_in_rounds<B: Bitmap>(
        self,
        (mut level, mut next): (&mut Groups<B>, &mut Groups<B>),
        round: &mut Round<'a, H>,
        out: &mut Vec<(Slot, u32)>,
    ) {
        while !level.is_empty() {
            self.look_up(level.iter().map(|(span, _)| self.seq[span.mid() as usize]), round);
            for (group, &found) in level.drain(..).zip(round.found.iter()) {
                let [upper, lower] = halves(group, found);
                self.file(next, upper, out);
                self.file(next, lower, out);
            }
            std::mem::swap(&mut level, &mut next);
        }
    }
}

/// A group that needs no more lookups is settled: an empty one, or one a
/// block wide, whose slots hold exactly `lo + 1` blocks (emitted). Any
/// other is handed back.
#[inline(always)]
fn settle<B: Bitmap>((span, set): (Span, Live<B>), out: &mut Vec<(Slot, u32)>) -> Option<(Span, Live<B>)> {
    if set.is_empty() {
        None
    } else if span.hi - span.lo == 1 {
        set.emit(span.hi, out);
        None
    } else {
        Some((span, set))
    }
}

/// A group split at its middle block by that block's holders: those
/// holding it (the upper half) and the rest (the lower). Callers take the
/// two by name: a loop over the array made a warm lookup at 256 workers
/// 16-19% slower (the same at 64).
#[inline(always)]
fn halves<B: Bitmap, H: HolderSet>((span, set): (Span, Live<B>), holders_of_mid: Option<&H>) -> [(Span, Live<B>); 2] {
    let mid = span.mid();
    let deeper = and(holders_of_mid, &set);
    let mut shallower = set;
    shallower.subtract(&deeper);
    [(Span { lo: mid, hi: span.hi }, deeper), (Span { lo: span.lo, hi: mid }, shallower)]
}

fn and<B: Bitmap, H: HolderSet>(holders: Option<&H>, among: &Live<B>) -> Live<B> {
    match holders {
        Some(holders) => holders.and(among),
        None => H::default().and(among),
    }
}

/// Finds the matches of `seq` in the index's table: a one-word table with
/// one-word sets; a wider one with sets as wide as the shard. (Compiling
/// every width's search for both tables, behind a second match on the
/// table, made 256 workers' warm lookups 5-10% slower; this way, 3-5%.)
pub(super) fn find_matches(index: &KvIndex, seq: &[SequenceHash], out: &mut Vec<(Slot, u32)>) {
    match &index.holders {
        Holders::Narrow(holders) => index.find_in::<[u64; 1], u64>(Search { holders, seq }, 1, out),
        Holders::Wide(holders) => find_matches_by_width(&Wide { index, holders }, index.workers.len(), seq, out),
    }
}

/// A lookup in a table of [`SlotSet`]s, at the width the shard needs.
struct Wide<'a> {
    index: &'a KvIndex,
    holders: &'a Placed<SequenceHash, SlotSet>,
}

impl MatchByWidth for Wide<'_> {
    fn find_matches_in<B: Bitmap>(&self, seq: &[SequenceHash], words: usize, out: &mut Vec<(Slot, u32)>) {
        self.index.find_in::<B, SlotSet>(Search { holders: self.holders, seq }, words, out)
    }
}

impl KvIndex {
    fn find_in<B: Bitmap, H: HolderSet>(&self, search: Search<'_, H>, words: usize, out: &mut Vec<(Slot, u32)>) {
        let seq = search.seq;
        let Some(first) = seq.first() else { return };
        let Some(holders) = search.holders.get(first) else { return };
        let mut live = Live::<B>::of(holders, words);
        if !self.needs_scan.is_empty() {
            let suspects = self.needs_scan.and(&live);
            if !suspects.is_empty() {
                live.subtract(&suspects);
                for slot in suspects.iter() {
                    let depth = 1 + seq[1..].iter().take_while(|s| self.holds(slot, **s)).count();
                    out.push((slot, depth as u32));
                }
            }
        }
        let last = seq.len() - 1;
        let (mut dropped, mut next) = (Groups::new(), Groups::new());
        let mut round = Round { keys: [SequenceHash(0); ROUND], found: [None; ROUND] };
        let mut lo = 0;
        // Jump points in batches of 4, 8, 16, …: a prompt whose match ends
        // early looks up at most as many points past its end as it needed,
        // plus 2 (a first batch of 1, 2 or 4 measured the same warm; 4 was
        // best cold).
        let mut batch = 4;
        while lo < last && !live.is_empty() {
            let points = (last - lo).div_ceil(JUMP).min(batch);
            search.look_up((1..=points).map(|k| seq[(lo + k * JUMP).min(last)]), &mut round);
            for &found in &round.found[..points] {
                let hi = (lo + JUMP).min(last);
                let still = and(found, &live);
                if still != live {
                    let mut gone = live;
                    gone.subtract(&still);
                    search.file(&mut dropped, (Span { lo: lo as u32, hi: hi as u32 }, gone), out);
                    live = still;
                }
                lo = hi;
                if live.is_empty() {
                    break;
                }
            }
            batch = (batch * 2).min(ROUND);
        }
        live.emit(lo as u32 + 1, out);
        search.bisect_in_rounds((&mut dropped, &mut next), &mut round, out);
    }
}
