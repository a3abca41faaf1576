//! Memory that readers share with the writer: arenas of cells handed out in blocks,
//! written only where no published snapshot can reach, reused only once no reader can.
//!
//! Both structures keep their lookup arrays in [`Blocks`]: a buffer of cells (atomics,
//! so that sharing it needs no `unsafe`) from which nodes, leaves or pages are allocated
//! in blocks of a few elements. A published snapshot holds the buffer through an `Arc`;
//! the writer goes on using the same buffer. The rule that makes this sound:
//!
//! - a block allocated since the last publish is *fresh*: no snapshot can reach it, so
//!   the writer may write it ([`Blocks::set`] and [`Blocks::copy`] check this, always);
//! - a block a snapshot may reach is never written: the structure copies it to a fresh
//!   block and *releases* the old one. Which blocks a structure still uses is the
//!   structure's to know (its tests check that every element is in use, free, or waiting
//!   for readers, exactly once); what is checked here, always, is that a block is released
//!   only while allocated, and whole, so that no block can be freed twice or in part;
//! - [`Blocks::publish`] makes everything published (nothing is fresh any more) and
//!   hands back what was released before it ([`Released`]); the caller
//!   ([`crate::shared`]) gives that back to [`Blocks::reclaim`] only once no reader holds
//!   the snapshot that was current when it was released, or any older one;
//! - growing allocates a bigger buffer and copies; snapshots keep the old one alive.
//!
//! A lookup therefore never reads a cell while it is written. Readers load cells with
//! relaxed atomic loads or, in the range tree, with plain vector loads: both are sound
//! because nothing writes what they read, and the publish (a release store of the new
//! snapshot, read with acquire) orders the writer's stores before the readers' loads.
//!
//! [`Released`] carries the generation of the buffer it came from: a table that
//! rebuilt its arrays ignores blocks released from the old ones.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// One element of an arena: a value in atomics, so a shared buffer can be written
/// through `&` without `unsafe`.
pub(crate) trait Cell: Default + Send + Sync {
    /// The plain value the cell holds.
    type Value: Copy + Default + PartialEq + std::fmt::Debug;
    /// The value (relaxed loads).
    fn read(&self) -> Self::Value;
    /// Stores `value` (relaxed stores).
    fn write(&self, value: Self::Value);
    /// A cell holding `value`.
    fn new(value: Self::Value) -> Self {
        let c = Self::default();
        c.write(value);
        c
    }
}

impl Cell for AtomicU32 {
    type Value = u32;
    #[inline(always)]
    fn read(&self) -> u32 {
        self.load(Relaxed)
    }
    #[inline(always)]
    fn write(&self, value: u32) {
        self.store(value, Relaxed)
    }
}

/// A new generation number: names one set of buffers, so that blocks released from
/// them are never freed into others.
pub(crate) fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

/// A buffer of cells of which the first `len` are in use. It never moves: growing
/// allocates a bigger one.
#[derive(Debug)]
struct Arena<C: Cell> {
    buf: Arc<[C]>,
    len: usize,
    /// Fitted once built, or a copy: it grows by an eighth from then on, where one being
    /// built doubles.
    settled: bool,
}

impl<C: Cell> Default for Arena<C> {
    fn default() -> Self {
        Arena {
            buf: Arc::from(Vec::new()),
            len: 0,
            settled: false,
        }
    }
}

impl<C: Cell> Arena<C> {
    /// Appends `n` default elements and returns the index of the first. A buffer too
    /// small grows: by an eighth once settled, else doubling.
    fn extend(&mut self, n: u32) -> u32 {
        let base = self.len;
        let want = base + n as usize;
        if want > self.buf.len() {
            let growth = if self.settled { GROWTH_SETTLED } else { 1 };
            let capacity = want.max(self.buf.len() + self.buf.len() / growth).max(64);
            self.reserve_exactly(capacity);
        }
        assert!(
            want <= 1 << 31,
            "lookup arrays are limited to 2^31 elements"
        );
        self.len = want;
        base as u32
    }

    /// Makes the buffer `capacity` elements (at least those in use): a new buffer, the
    /// elements in use copied, the rest default, made in place (`Arc<[C]>` collects an
    /// iterator of known length without a vector first). Holders of the old one keep it.
    fn reserve_exactly(&mut self, capacity: usize) {
        if capacity.max(self.len) != self.buf.len() {
            let old = std::mem::take(self);
            self.copy_of(&old, capacity);
            self.settled = old.settled;
        }
    }

    /// Makes this arena a copy of `from` in a new buffer of `capacity` elements (at least
    /// those in use).
    fn copy_of(&mut self, from: &Arena<C>, capacity: usize) {
        let len = from.len;
        self.buf = (0..capacity.max(len))
            .map(|i| {
                if i < len {
                    C::new(from.buf[i].read())
                } else {
                    C::default()
                }
            })
            .collect();
        self.len = len;
    }
}

/// Room a built or copied buffer keeps for changes: a sixteenth of what it holds, so that
/// the first changes after a compile write in place rather than copy the buffer into a
/// bigger one (tens of milliseconds for a full table's).
const HEADROOM: usize = 16;

/// How much a buffer grows when it is full once fitted or copied: by an eighth (the slack
/// it then holds, every page of it written, is resident). A buffer being built doubles,
/// and is fitted when built ([`Blocks::fit`]).
const GROWTH_SETTLED: usize = 8;

/// Which elements were allocated since the last publish: those the writer may change in
/// place. Until a buffer is first published, all of it is.
#[derive(Clone, Debug)]
struct Fresh {
    all: bool,
    bits: Vec<u64>,
    /// The words of `bits` that are not zero, to clear them quickly.
    words: Vec<u32>,
}

impl Default for Fresh {
    fn default() -> Self {
        Fresh {
            all: true,
            bits: Vec::new(),
            words: Vec::new(),
        }
    }
}

impl Fresh {
    /// Marks elements `base..base + size` fresh.
    fn mark(&mut self, base: u32, size: u32) {
        if self.all {
            return;
        }
        for i in base..base + size {
            let w = (i / 64) as usize;
            if w >= self.bits.len() {
                self.bits.resize(w + 1, 0);
            }
            if self.bits[w] == 0 {
                self.words.push(w as u32);
            }
            self.bits[w] |= 1 << (i % 64);
        }
    }

    /// True if element `i` may be changed in place.
    #[inline]
    fn contains(&self, i: u32) -> bool {
        self.all
            || self
                .bits
                .get((i / 64) as usize)
                .is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// Everything is published: nothing is fresh any more.
    fn clear(&mut self) {
        self.all = false;
        for &w in &self.words {
            self.bits[w as usize] = 0;
        }
        self.words.clear();
    }

    fn bytes(&self) -> usize {
        self.bits.capacity() * 8 + self.words.capacity() * 4
    }
}

/// Free lists of blocks by size, within one arena; grown to a size when a block of it is
/// first freed.
#[derive(Clone, Debug, Default)]
struct BlockAlloc {
    free: Vec<Vec<u32>>,
    free_slots: usize,
}

impl BlockAlloc {
    /// A freed block of `size` elements, if there is one.
    fn reuse(&mut self, size: u32) -> Option<u32> {
        let base = self.free.get_mut(size as usize)?.pop()?;
        self.free_slots -= size as usize;
        Some(base)
    }

    /// Returns a block for reuse.
    fn free(&mut self, base: u32, size: u32) {
        let size = size as usize;
        if self.free.len() <= size {
            self.free.resize_with(size + 1, Vec::new);
        }
        self.free[size].push(base);
        self.free_slots += size;
    }

    fn bytes(&self) -> usize {
        self.free.iter().map(|v| v.capacity() * 4).sum::<usize>()
            + self.free.capacity() * std::mem::size_of::<Vec<u32>>()
    }
}

/// Blocks released before a publish, to be reused once no reader can reach them. Only
/// [`Blocks::publish`] makes one.
#[derive(Debug)]
pub(crate) struct Released {
    generation: u64,
    /// `(base, size)` of each block.
    blocks: Vec<(u32, u32)>,
}

impl Released {
    /// Elements in these blocks (tests count them).
    #[cfg(test)]
    pub fn slots(&self) -> usize {
        self.blocks.iter().map(|b| b.1 as usize).sum()
    }

    /// Elements in these blocks if they came from `blocks`' buffers, else 0 (tests).
    #[cfg(test)]
    pub fn slots_in<C: Cell>(&self, blocks: &Blocks<C>) -> usize {
        if self.generation == blocks.generation {
            self.slots()
        } else {
            0
        }
    }
}

/// An arena handed out in blocks, written only where no snapshot reaches (see the module
/// documentation).
pub(crate) struct Blocks<C: Cell> {
    arena: Arena<C>,
    alloc: BlockAlloc,
    fresh: Fresh,
    /// One bit per element: allocated (in use, as far as this arena knows) or not.
    live: Vec<u64>,
    /// Blocks released since the last publish that a snapshot may still reach.
    released: Vec<(u32, u32)>,
    generation: u64,
}

impl<C: Cell> Default for Blocks<C> {
    fn default() -> Self {
        Blocks {
            arena: Arena::default(),
            alloc: BlockAlloc::default(),
            fresh: Fresh::default(),
            live: Vec::new(),
            released: Vec::new(),
            generation: next_generation(),
        }
    }
}

impl<C: Cell> std::fmt::Debug for Blocks<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blocks")
            .field("len", &self.arena.len)
            .field("free", &self.alloc.free_slots)
            .field("released", &self.released.len())
            .finish_non_exhaustive()
    }
}

impl<C: Cell> Blocks<C> {
    /// Elements in the arena (in use, free, or waiting for readers).
    pub fn len(&self) -> usize {
        self.arena.len
    }

    /// The buffer, to share with a snapshot or to read.
    #[inline(always)]
    pub fn buffer(&self) -> &Arc<[C]> {
        &self.arena.buf
    }

    /// Element `i`.
    #[inline(always)]
    pub fn get(&self, i: u32) -> C::Value {
        self.arena.buf[i as usize].read()
    }

    /// Writes element `i`.
    ///
    /// # Panics
    /// If `i` is not fresh: a published snapshot may reach it, and a reader may be
    /// reading it right now.
    #[inline]
    pub fn set(&self, i: u32, value: C::Value) {
        assert!(
            self.fresh.contains(i),
            "element {i} is published: it may not be written"
        );
        self.arena.buf[i as usize].write(value)
    }

    /// Copies elements `from..from + n` to `to..to + n`, which must not overlap.
    ///
    /// # Panics
    /// If the ranges are out of bounds or overlap, or the destination is not fresh.
    pub fn copy(&self, from: u32, to: u32, n: u32) {
        let (from, to, n) = (from as usize, to as usize, n as usize);
        let len = self.arena.len;
        assert!(from + n <= len && to + n <= len, "copy within the arena");
        assert!(
            from + n <= to || to + n <= from,
            "copy between disjoint elements"
        );
        assert!(
            (to..to + n).all(|i| self.fresh.contains(i as u32)),
            "copy into published elements"
        );
        let base = self.arena.buf.as_ptr();
        // A plain copy rather than one atomic word at a time: blocks of up to 16 lines
        // copied with vector moves took the shared writer's copy-on-write updates of the
        // range tree on the real IPv6 stream from 0.8-1.0 to 1.3 M/s (`fibre bench
        // lookup`).
        // SAFETY: both ranges are in bounds of the buffer and disjoint (checked above).
        // Cells are atomics, whose interior mutability allows writing through a pointer
        // derived from a shared reference. Nothing writes the source meanwhile (only the
        // writer writes, and it is here), and nothing reads or writes the destination: it
        // is fresh (checked above), so no published snapshot reaches it, and the writer's
        // own lookups need `&` of the table this `&self` belongs to, which the writer,
        // copying, does not give out. So this plain copy races with no other access.
        unsafe {
            std::ptr::copy_nonoverlapping(base.add(from), base.add(to).cast_mut(), n);
        }
    }

    /// A block of `size` elements, fresh: a freed one if there is one, else new ones at
    /// the end (which hold the cell's default).
    pub fn alloc(&mut self, size: u32) -> u32 {
        let base = match self.alloc.reuse(size) {
            Some(b) => b,
            None => self.arena.extend(size),
        };
        self.fresh.mark(base, size);
        self.mark_live(base, size, true);
        base
    }

    /// Flips elements `base..base + size` to allocated (`live`) or not.
    ///
    /// # Panics
    /// If one of them already was: a block freed twice, or in part, or handed out twice.
    fn mark_live(&mut self, base: u32, size: u32, live: bool) {
        let end = (base + size) as usize;
        if self.live.len() * 64 < end {
            self.live.resize(end.div_ceil(64), 0);
        }
        // A word at a time: the bits of `base..end` in it, all flipped at once.
        let mut i = base as usize;
        while i < end {
            let (word, from) = (i / 64, i % 64);
            let to = (end - word * 64).min(64);
            let bits = (u64::MAX >> (64 - (to - from))) << from;
            let held = self.live[word] & bits;
            if held != if live { 0 } else { bits } {
                // The first element already so.
                let wrong = if live { held } else { !held & bits };
                panic!(
                    "element {} is {} already",
                    word * 64 + wrong.trailing_zeros() as usize,
                    if live { "allocated" } else { "released" }
                );
            }
            self.live[word] ^= bits;
            i = word * 64 + to;
        }
    }

    /// Gives back a block: free at once if no snapshot has seen it, after the next
    /// publish and its readers otherwise.
    ///
    /// # Panics
    /// If the block (all of it) is not allocated.
    pub fn release(&mut self, base: u32, size: u32) {
        self.mark_live(base, size, false);
        if self.fresh.contains(base) {
            self.alloc.free(base, size);
        } else {
            self.released.push((base, size));
        }
    }

    /// True if element `i` was allocated since the last publish (so it may be written).
    #[inline]
    pub fn is_fresh(&self, i: u32) -> bool {
        self.fresh.contains(i)
    }

    /// Marks everything published and returns what was released before, to be reclaimed
    /// once no reader holds a snapshot that reaches it.
    pub fn publish(&mut self) -> Released {
        self.fresh.clear();
        Released {
            generation: self.generation,
            blocks: std::mem::take(&mut self.released),
        }
    }

    /// Frees blocks a publish released, now that no reader can reach them. Blocks from
    /// another generation of buffers are ignored.
    pub fn reclaim(&mut self, released: Released) {
        if released.generation == self.generation {
            for (base, size) in released.blocks {
                self.alloc.free(base, size);
            }
        }
    }

    /// A private copy of these blocks, never published: the same cells in a buffer of its
    /// own, every element fresh (no snapshot reaches the copy), the blocks released since
    /// the last publish free in it at once, and a generation of its own (nothing released
    /// from one is ever freed into the other). Blocks that an earlier publish handed out
    /// ([`Released`], held by the caller until no reader reaches them) are neither in use
    /// nor free in the copy: they stay unused there. A table copied while its readers hold
    /// several versions so keeps those blocks idle; one never published (a snapshot's, in
    /// `fibre-fib`) has none.
    pub fn duplicate(&self) -> Blocks<C> {
        // A buffer of its own, whatever the capacity: never the original's shared.
        let mut arena = Arena {
            buf: Arc::from(Vec::new()),
            len: 0,
            settled: true,
        };
        arena.copy_of(&self.arena, self.arena.len + self.arena.len / HEADROOM);
        let mut alloc = self.alloc.clone();
        for &(base, size) in &self.released {
            alloc.free(base, size);
        }
        Blocks {
            arena,
            alloc,
            fresh: Fresh::default(),
            live: self.live.clone(),
            released: Vec::new(),
            generation: next_generation(),
        }
    }

    /// Fits the buffer to what it holds and a sixteenth more, once built: a buffer that
    /// doubled as it was filled may hold up to as much again unused.
    pub fn fit(&mut self) {
        self.arena
            .reserve_exactly(self.arena.len + self.arena.len / HEADROOM);
        self.arena.settled = true;
    }

    /// Elements sitting in free blocks.
    pub fn free_slots(&self) -> usize {
        self.alloc.free_slots
    }

    /// Elements in blocks released since the last publish (tests).
    #[cfg(test)]
    pub fn released_slots(&self) -> usize {
        self.released.iter().map(|b| b.1 as usize).sum()
    }

    /// Bytes of the buffer in use.
    pub fn lookup_bytes(&self) -> usize {
        self.arena.len * std::mem::size_of::<C>()
    }

    /// Bytes of what allocation and copy on write keep beside the buffer.
    pub fn update_bytes(&self) -> usize {
        self.alloc.bytes()
            + self.fresh.bytes()
            + self.live.capacity() * 8
            + self.released.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(b: &Blocks<AtomicU32>, from: u32, n: u32) -> Vec<u32> {
        (from..from + n).map(|i| b.get(i)).collect()
    }

    /// A buffer being built doubles; fitted, it keeps a sixteenth more than it holds and
    /// then grows by an eighth, its contents kept; its copy is fitted the same way.
    #[test]
    fn a_fitted_buffer_keeps_a_sixteenth_and_grows_by_an_eighth() {
        let mut b: Blocks<AtomicU32> = Blocks::default();
        for i in 0..1000 {
            let x = b.alloc(16);
            b.set(x, i);
        }
        assert_eq!(b.buffer().len(), 16384, "doubling while built");
        b.fit();
        assert_eq!(b.buffer().len(), 16000 + 1000);
        let copy = b.duplicate();
        assert_eq!(copy.buffer().len(), 17000);
        while b.len() < 17000 {
            b.alloc(8);
        }
        b.alloc(8);
        assert_eq!(b.buffer().len(), 17000 + 17000 / 8);
        for i in 0..1000 {
            assert_eq!(b.get(i * 16), i);
            assert_eq!(copy.get(i * 16), i);
        }
    }

    #[test]
    fn growing_keeps_contents_and_leaves_old_buffers_to_their_holders() {
        let mut b: Blocks<AtomicU32> = Blocks::default();
        let x = b.alloc(3);
        b.set(x + 1, 7);
        let held = b.buffer().clone();
        b.alloc(1000);
        assert_eq!(b.get(1), 7);
        b.set(1, 8);
        assert_eq!(
            held[1].load(Relaxed),
            7,
            "a snapshot's buffer is not written by growth"
        );
    }

    #[test]
    fn copy_moves_elements_and_leaves_the_source() {
        let mut b: Blocks<AtomicU32> = Blocks::default();
        let x = b.alloc(8);
        for i in 0..4 {
            b.set(x + i, 10 + i);
        }
        b.copy(x, x + 4, 4);
        assert_eq!(words(&b, x, 8), [10, 11, 12, 13, 10, 11, 12, 13]);
    }

    #[test]
    #[should_panic(expected = "disjoint")]
    fn copy_refuses_overlapping_ranges() {
        let mut b: Blocks<AtomicU32> = Blocks::default();
        b.alloc(8);
        b.copy(0, 2, 4);
    }

    #[test]
    #[should_panic(expected = "is published")]
    fn published_elements_cannot_be_written() {
        let mut b: Blocks<AtomicU32> = Blocks::default();
        let x = b.alloc(4);
        b.publish();
        b.set(x, 1);
    }

    #[test]
    #[should_panic(expected = "published elements")]
    fn published_elements_cannot_be_copied_over() {
        let mut b: Blocks<AtomicU32> = Blocks::default();
        let x = b.alloc(4);
        b.publish();
        let y = b.alloc(4);
        b.copy(y, x, 4);
    }

    #[test]
    fn released_blocks_wait_for_reclaim_unless_never_published() {
        let mut b: Blocks<AtomicU32> = Blocks::default();
        let x = b.alloc(4);
        b.release(x, 4);
        assert_eq!(b.free_slots(), 4, "never published: free at once");
        assert_eq!(b.alloc(4), x, "and reused");
        let first = b.publish();
        assert_eq!(first.slots(), 0);
        assert!(!b.is_fresh(x));
        b.release(x, 4);
        assert_eq!(b.free_slots(), 0, "published: kept for its readers");
        let y = b.alloc(4);
        assert_ne!(y, x, "not reused while readers may hold it");
        assert!(b.is_fresh(y));
        let second = b.publish();
        assert_eq!(second.slots(), 4);
        let mut other: Blocks<AtomicU32> = Blocks::default();
        other.reclaim(Released {
            generation: second.generation,
            blocks: second.blocks.clone(),
        });
        assert_eq!(
            other.free_slots(),
            0,
            "another generation's blocks are ignored"
        );
        b.reclaim(second);
        assert_eq!(b.free_slots(), 4);
        assert_eq!(b.alloc(4), x);
    }

    /// Blocks of every size across word boundaries, allocated, released and reused at
    /// random: each element's mark is what a per-element reference says, and releasing
    /// a block again, or one element past it, is refused and changes nothing.
    #[test]
    fn blocks_across_words_are_marked_element_by_element() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut b: Blocks<AtomicU32> = Blocks::default();
        let mut held: Vec<(u32, u32)> = Vec::new();
        let mut live = std::collections::HashSet::new();
        for step in 0..3000 {
            if held.is_empty() || rng.gen_bool(0.55) {
                let size = rng.gen_range(1..140);
                let x = b.alloc(size);
                for i in x..x + size {
                    assert!(live.insert(i), "element {i} handed out twice");
                }
                held.push((x, size));
            } else {
                let (x, size) = held.swap_remove(rng.gen_range(0..held.len()));
                b.release(x, size);
                for i in x..x + size {
                    live.remove(&i);
                }
                if step % 50 == 0 {
                    let before = b.live.clone();
                    for (base, len) in [(x, size), (x, size + 1)] {
                        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            b.mark_live(base, len, false)
                        }));
                        assert!(again.is_err(), "released twice: {base} {len}");
                        // (Words past the last may have been added, empty.)
                        assert_eq!(b.live[..before.len()], before[..]);
                        assert!(b.live[before.len()..].iter().all(|&w| w == 0));
                    }
                }
            }
            if step % 100 == 0 {
                for i in 0..b.len() as u32 {
                    let marked = b.live[i as usize / 64] & (1 << (i % 64)) != 0;
                    assert_eq!(marked, live.contains(&i), "element {i} at step {step}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "released already")]
    fn a_block_cannot_be_released_twice() {
        let mut b: Blocks<AtomicU32> = Blocks::default();
        let x = b.alloc(4);
        b.publish();
        b.release(x, 4);
        b.release(x, 4);
    }

    #[test]
    #[should_panic(expected = "released already")]
    fn a_block_cannot_be_released_larger_than_it_was_allocated() {
        let mut b: Blocks<AtomicU32> = Blocks::default();
        let x = b.alloc(4);
        b.release(x, 5);
    }
}
