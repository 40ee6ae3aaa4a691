//! A worker's records, in chunks that never move once allocated.
//!
//! A `Vec` grown by a quarter at a time (a doubled slab just past its
//! doubling is half empty) copies each record about four times on the way
//! to its size, and every copy hands the old buffer back to the allocator,
//! which kept much of it resident: RSS growth ran 18 B per entry above the
//! table bytes at 1,000,000 entries. Records here sit in fixed chunks
//! allocated once: RSS growth 76.6 -> 70.8 B per entry (six pairs),
//! one-block stores +12.5% by median (a growing worker copies nothing),
//! other rows within noise (perf/results/2026-12-07-holder-table-peak.md).
//! A chunk is 7 KiB, so a worker's partly filled last chunk wastes little.

use std::ops::{Index, IndexMut};

/// A block's place in its worker's slab.
pub(super) type BlockId = u32;

const CHUNK_BITS: u32 = 8;
/// Records per chunk: 7 KiB of 28-byte records. (1,024 measured the
/// same, but wastes four times as much in a worker's last chunk.)
pub(super) const CHUNK: usize = 1 << CHUNK_BITS;
const IN_CHUNK: BlockId = (1 << CHUNK_BITS) - 1;

/// Whole chunks of a fixed size: an index masked to the chunk needs no
/// bounds check, so a record costs one more load than in a `Vec` (the
/// chunk's address, from a table small enough to stay cached).
pub(super) struct Slab<T> {
    chunks: Vec<Box<[T; CHUNK]>>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { chunks: Vec::new(), len: 0 }
    }
}

impl<T: Copy> Slab<T> {
    /// Room for `n` records.
    pub(super) fn with_capacity(n: usize, filler: T) -> Self {
        let mut slab = Slab::default();
        slab.reserve(n, filler);
        slab
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }

    /// Room for `additional` more records, in whole chunks filled with
    /// `filler` (never read: an id at or past `len` is a bug, caught by a
    /// debug assertion).
    pub(super) fn reserve(&mut self, additional: usize, filler: T) {
        let chunks = (self.len + additional).div_ceil(CHUNK);
        self.chunks.reserve_exact(chunks.saturating_sub(self.chunks.len()));
        while self.chunks.len() < chunks {
            self.chunks.push(chunk_of(filler));
        }
    }

    /// Appends `value`, in a new chunk if the last is full.
    pub(super) fn push(&mut self, value: T) {
        let (at, offset) = (self.len / CHUNK, self.len % CHUNK);
        match self.chunks.get_mut(at) {
            Some(chunk) => chunk[offset] = value,
            None => self.chunks.push(chunk_of(value)),
        }
        self.len += 1;
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|chunk| chunk.iter()).take(self.len)
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.chunks.iter_mut().flat_map(|chunk| chunk.iter_mut()).take(self.len)
    }
}

/// A chunk filled with `value`, built on the heap (a 7 KiB array on the
/// stack first would be a copy more).
fn chunk_of<T: Copy>(value: T) -> Box<[T; CHUNK]> {
    vec![value; CHUNK].into_boxed_slice().try_into().unwrap_or_else(|_| unreachable!("CHUNK elements"))
}

/// The records, not the filler behind them.
impl<T: Copy + std::fmt::Debug> std::fmt::Debug for Slab<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T> Index<BlockId> for Slab<T> {
    type Output = T;

    #[inline]
    fn index(&self, id: BlockId) -> &T {
        debug_assert!((id as usize) < self.len, "id {id} of {}", self.len);
        &self.chunks[(id >> CHUNK_BITS) as usize][(id & IN_CHUNK) as usize]
    }
}

impl<T> IndexMut<BlockId> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, id: BlockId) -> &mut T {
        debug_assert!((id as usize) < self.len, "id {id} of {}", self.len);
        &mut self.chunks[(id >> CHUNK_BITS) as usize][(id & IN_CHUNK) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_their_ids_and_addresses_as_the_slab_grows_past_many_chunks() {
        let mut slab = Slab::default();
        let mut first_of_chunk = Vec::new();
        for i in 0..5 * CHUNK as u32 + 7 {
            slab.push(i);
            if i as usize % CHUNK == 0 {
                first_of_chunk.push(std::ptr::from_ref(&slab[i]));
            }
            assert_eq!(slab.len(), i as usize + 1);
        }
        assert_eq!(slab.capacity(), 6 * CHUNK, "whole chunks");
        assert!((0..slab.len() as u32).all(|i| slab[i] == i));
        assert!(slab.iter().copied().eq(0..slab.len() as u32), "the room past the last record is not iterated");
        // No record ever moved.
        for (chunk, &address) in first_of_chunk.iter().enumerate() {
            assert_eq!(std::ptr::from_ref(&slab[(chunk * CHUNK) as u32]), address, "chunk {chunk}");
        }
        for value in slab.iter_mut() {
            *value += 1;
        }
        slab[3] = 0;
        assert_eq!((slab[3], slab[4], slab[(3 * CHUNK) as u32]), (0, 5, 3 * CHUNK as u32 + 1));
        assert_eq!(slab.iter().count(), 5 * CHUNK + 7);
    }

    #[test]
    fn reserving_adds_whole_chunks_that_pushes_then_fill_without_allocating() {
        let mut slab: Slab<u64> = Slab::with_capacity(125, u64::MAX);
        assert_eq!((slab.len(), slab.capacity()), (0, CHUNK));
        slab.reserve(100, u64::MAX);
        assert_eq!(slab.capacity(), CHUNK, "already room for 100");
        slab.reserve(2 * CHUNK + 3, u64::MAX);
        assert_eq!(slab.capacity(), 3 * CHUNK);
        let chunks = slab.chunks.as_ptr();
        for i in 0..3 * CHUNK as u64 {
            slab.push(i);
        }
        assert_eq!((slab.capacity(), slab.chunks.as_ptr()), (3 * CHUNK, chunks), "no chunk added, none moved");
        assert!((0..3 * CHUNK as u32).all(|i| slab[i] == u64::from(i)));
        assert!(Slab::<u8>::with_capacity(0, 0).chunks.is_empty());
    }

    #[test]
    fn reserved_room_is_neither_iterated_nor_printed() {
        let mut slab = Slab::with_capacity(2 * CHUNK, 7u8);
        assert_eq!((slab.iter().count(), slab.iter_mut().count()), (0, 0));
        assert_eq!(format!("{slab:?}"), "[]");
        slab.push(1);
        slab.push(2);
        assert!(slab.iter().copied().eq([1, 2]));
        assert_eq!(format!("{slab:?}"), "[1, 2]");
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "id 1 of 1")]
    fn an_id_in_reserved_room_is_caught_in_debug_builds() {
        let mut slab = Slab::with_capacity(CHUNK, 0u32);
        slab.push(1);
        let _ = slab[1];
    }

    /// Past the chunks, every build panics: the assertion in debug
    /// builds, the chunk table's bounds check in release ones.
    #[test]
    #[should_panic]
    fn an_id_past_the_chunks_panics() {
        let mut slab = Slab::default();
        slab.push(1u32);
        let _ = slab[CHUNK as u32];
    }
}
