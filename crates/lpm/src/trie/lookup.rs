//! Lookups: one key at a time, or many at once with their memory reads overlapped.
//!
//! A lookup is a chain of dependent reads (direct entry, nodes, leaf), and each read can
//! miss the cache. The batched lookup walks a group of keys level by level: it issues a
//! prefetch for every key's next read, then comes back to use them, so the reads of the
//! whole group are in flight together instead of one after another. The keys still
//! walking are a 64-bit mask, visited lowest first. Each key walks a 64-bit window of
//! itself, not the whole key, so an IPv6 step shifts one word, not two (taken again every
//! ten levels), and so does the scalar walk. Both are compiled twice, once for a large
//! table's direct bits as a constant, which turns the shifts of the key by them into
//! immediate ones. Lanes are indexed through their masks (`lane`), which the compiler can
//! see are in bounds, and prefetches skip bounds checks. Together, counted with callgrind
//! on the real tables (`fibre-bench`'s `lookup_profile` example): batched IPv6 from 215 to 171
//! instructions per lookup, scalar IPv6 131 to 117, batched IPv4 91 to 81.
//!
//! Measured here and kept: branches on "child or leaf" beat branch-free selects, in both
//! the scalar and the batched walk (the core speculates past predicted branches into the
//! next lookups; a select must wait for its data); the mask beats a compacted list of
//! walking keys by about 10% for IPv6. Measured and rejected: groups of 128 keys (no
//! faster); a branch-free walk over a compacted list (20% slower, even with everything in
//! L1); masking indices into power-of-two arrays instead of checking them (fewer
//! instructions, but the AND sits on the chain of dependent reads, where a predicted bounds
//! check does not: no faster, scalar lookups slower). Unchecked indexing would save 10-16%
//! in L1 but make memory safety rest on every index the writer stores; not taken. A hash
//! table of the IPv6 /48s (with no longer prefix under them) probed beside the direct
//! array answered 46% of matched lookups in one probe, yet made batched lookups slower
//! (23 against 18 ns): the trie's upper levels stay in cache, so a /48 lookup misses the
//! cache only about twice, and the probe's own line misses for every lookup, hit or not.

//!
//! The batched walk is compiled twice ([`crate::form`]): for the AVX2 form, where the
//! popcounts and trailing-zero counts of the bitmaps are single instructions (the AVX-512
//! form runs this code too: the trie has no use for wider compares), and portably, where
//! each popcount is a dozen shifts and adds; the table's form chooses, once per call. A
//! single lookup is not worth a call: it counts bits with `POPCNT` itself where the form
//! proves the CPU has it ([`Popcount`]), and stays inlinable into its caller.

use super::node::{decode, NodeCell, EMPTY, ENTRY_INDEX, NODE_FLAG, RECORD_FLAG, WIDE_FLAG};
use super::{Trie, TrieSnapshot, LARGE_DIRECT_BITS, PAGE_BITS};
#[cfg(target_arch = "x86_64")]
use crate::form::{avx2_form, Avx2};
use crate::form::{Popcount, Portable, Runnable};
use crate::key::Key;
use crate::memory::Cell;
use crate::BATCH;
use std::sync::atomic::AtomicU32;

/// What lookups read, borrowed from a trie or a snapshot of one.
#[derive(Clone, Copy)]
pub(crate) struct TrieView<'a> {
    pub(super) direct_bits: u32,
    pub(super) form: Runnable,
    pub(super) page_table: &'a [u32],
    pub(super) direct: &'a [AtomicU32],
    pub(super) nodes: &'a [NodeCell],
    pub(super) leaves: &'a [AtomicU32],
}

/// Asks the CPU to start loading the cache line of `r`.
#[inline(always)]
fn prefetch<T>(r: &T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: prefetching has no architectural effect and never faults; the pointer comes
    // from a live reference.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((r as *const T).cast::<i8>());
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = r;
}

/// Asks the CPU to start loading the cache line of `slice[index]`, without checking that
/// `index` is in bounds: a bounds check per prefetch costs more than the prefetch.
#[inline(always)]
fn prefetch_at<T>(slice: &[T], index: u32) {
    let p = slice.as_ptr().wrapping_add(index as usize);
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: prefetching has no architectural effect and never faults, whatever the
    // address; `wrapping_add` computes the address without any access.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>());
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = p;
}

/// The same lookup methods on a table and on a published snapshot of one.
macro_rules! lookup_methods {
    ($ty:ident) => {
        impl<K: Key> $ty<K> {
            /// The value of the longest prefix containing `key`, or `None` if no prefix does.
            #[inline]
            pub fn lookup(&self, key: K) -> Option<u32> {
                self.view().lookup(key)
            }

            /// Looks up every key of `keys`, writing the answers to the same positions of
            /// `out`, [`BATCH`] at a time with their memory reads overlapped.
            ///
            /// # Panics
            /// If `out` is shorter than `keys`.
            pub fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
                self.view().lookup_batch(keys, out)
            }
        }
    };
}

lookup_methods!(Trie);
lookup_methods!(TrieSnapshot);

avx2_form! {
    /// [`TrieView::lookup_all`] compiled for the AVX2 form (`cpu` proves it runs here).
    fn batch_avx2<K: Key>(view: &TrieView<'_>, cpu: Avx2, keys: &[K], out: &mut [Option<u32>]) {
        let _ = cpu;
        view.lookup_all(keys, out)
    }
}

impl TrieView<'_> {
    /// The value of `key`'s longest prefix, counting bits as the view's form allows.
    #[inline(always)]
    pub(crate) fn lookup<K: Key>(&self, key: K) -> Option<u32> {
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = self.form.avx2() {
            return decode(self.lookup_stored(cpu, key));
        }
        decode(self.lookup_stored(Portable, key))
    }

    /// Looks up every key of `keys` into `out`, by the code of the view's form.
    pub(crate) fn lookup_batch<K: Key>(&self, keys: &[K], out: &mut [Option<u32>]) {
        assert!(out.len() >= keys.len(), "output shorter than input");
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = self.form.avx2() {
            // SAFETY: `cpu` exists only where this CPU has the AVX2 form's features
            // (`crate::form`: `Runnable::new` detects them before making one).
            return unsafe { batch_avx2(self, cpu, keys, out) };
        }
        self.lookup_all(keys, out)
    }

    /// The stored answer for `key`: the walk compiled for the large direct array, where
    /// the direct bits are a constant (every shift of the key by them is an immediate
    /// one), or for any other.
    #[inline(always)]
    fn lookup_stored<K: Key>(&self, popcount: impl Popcount, key: K) -> u32 {
        if self.direct_bits == u32::from(LARGE_DIRECT_BITS) {
            self.walk::<K, true>(popcount, key)
        } else {
            self.walk::<K, false>(popcount, key)
        }
    }

    /// Every key of `keys` into `out`, [`BATCH`] at a time.
    #[inline(always)]
    fn lookup_all<K: Key>(&self, keys: &[K], out: &mut [Option<u32>]) {
        if self.direct_bits == u32::from(LARGE_DIRECT_BITS) {
            for (k, o) in keys.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
                self.lookup_group::<K, true>(k, o);
            }
        } else {
            for (k, o) in keys.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
                self.lookup_group::<K, false>(k, o);
            }
        }
    }

    #[inline(always)]
    fn entry_ref(&self, e: u32) -> &AtomicU32 {
        let e = e as usize;
        &self.direct
            [(self.page_table[e >> PAGE_BITS] as usize) << PAGE_BITS | (e & ((1 << PAGE_BITS) - 1))]
    }

    #[inline(always)]
    fn walk<K: Key, const LARGE: bool>(&self, popcount: impl Popcount, key: K) -> u32 {
        let d = if LARGE {
            u32::from(LARGE_DIRECT_BITS)
        } else {
            self.direct_bits
        };
        let entry = self.entry_ref(key.top(d)).read();
        if entry & NODE_FLAG == 0 {
            return entry;
        }
        // The root's slot: the six bits after the direct ones.
        let slot = key.bits(d, 6);
        if entry & RECORD_FLAG != 0 {
            let leaf = self.record_leaf_index(entry & ENTRY_INDEX, slot, popcount);
            return self.leaves[leaf as usize].read();
        }
        let mut index = entry & ENTRY_INDEX;
        let mut offset = d;
        if entry & WIDE_FLAG != 0 {
            index += slot;
            offset += 6;
        }
        // Node by node through a window of the key, taken again when it runs out.
        loop {
            let mut window = key.window(offset);
            for _ in 0..K::WINDOW_LEVELS {
                let (has_child, child, leaf) = self.nodes[index as usize]
                    .read()
                    .step((window >> 58) as u32, popcount);
                if !has_child {
                    return self.leaves[leaf as usize].read();
                }
                index = child;
                window <<= 6;
            }
            offset += 6 * K::WINDOW_LEVELS;
        }
    }

    /// The leaf index of `slot` in the leaf record at `offset` (a root without children).
    #[inline(always)]
    fn record_leaf_index(&self, offset: u32, slot: u32, popcount: impl Popcount) -> u32 {
        let o = offset as usize;
        let leafvec = u64::from(self.leaves[o].read()) | u64::from(self.leaves[o + 1].read()) << 32;
        let bit = 1u64 << slot;
        offset + 2 + popcount.count(leafvec & (bit | (bit - 1)))
    }

    #[inline(always)]
    fn lookup_group<K: Key, const LARGE: bool>(&self, keys: &[K], out: &mut [Option<u32>]) {
        let d = if LARGE {
            u32::from(LARGE_DIRECT_BITS)
        } else {
            self.direct_bits
        };
        let n = keys.len().min(BATCH).min(out.len());
        let (keys, out) = (&keys[..n], &mut out[..n]);
        static UNUSED: AtomicU32 = AtomicU32::new(0);
        // Per lane: its direct entry, the index it reads next, its window of the key (for
        // a key at a leaf record: its slot there), and its answer (stored form). Lanes are
        // found through 64-bit masks and indexed through `lane`, which is provably in
        // bounds of these arrays: no bounds checks.
        let mut entries = [&UNUSED; BATCH];
        let mut next = [0u32; BATCH];
        let mut window = [0u64; BATCH];
        let mut answer = [EMPTY; BATCH];
        let lane = |mask: u64| mask.trailing_zeros() as usize & (BATCH - 1);
        for i in 0..n {
            entries[i] = self.entry_ref(keys[i].top(d));
            prefetch(entries[i]);
        }
        // Keys walking nodes, those of them whose window starts a level further on (below
        // a wide root), and keys whose next read is a root's leaf record.
        let mut walking = 0u64;
        let mut below_wide = 0u64;
        let mut at_record = 0u64;
        for i in 0..n {
            let entry = entries[i].read();
            next[i] = entry & ENTRY_INDEX;
            if entry & NODE_FLAG == 0 {
                answer[i] = entry;
            } else if entry & RECORD_FLAG != 0 {
                prefetch_at(self.leaves, next[i]);
                window[i] = u64::from(keys[i].bits(d, 6));
                at_record |= 1 << i;
            } else {
                let mut offset = d;
                if entry & WIDE_FLAG != 0 {
                    next[i] += keys[i].bits(d, 6);
                    offset += 6;
                    below_wide |= 1 << i;
                }
                window[i] = keys[i].window(offset);
                prefetch_at(self.nodes, next[i]);
                walking |= 1 << i;
            }
        }
        let mut at_leaf = 0u64;
        while at_record != 0 {
            let i = lane(at_record);
            at_record &= at_record - 1;
            // (`count_ones` is POPCNT where this walk is compiled for the AVX2 form.)
            next[i] = self.record_leaf_index(next[i], window[i] as u32, Portable);
            prefetch_at(self.leaves, next[i]);
            at_leaf |= 1 << i;
        }
        // Level by level: every key still walking takes one step per pass. Its window
        // starts at its first node, so all run out together and are taken again then.
        let mut level = 0;
        while walking != 0 {
            if K::WINDOW_LEVELS != u32::MAX && level > 0 && level % K::WINDOW_LEVELS == 0 {
                let mut lanes = walking;
                while lanes != 0 {
                    let i = lane(lanes);
                    lanes &= lanes - 1;
                    let wide = (below_wide >> i & 1) as u32;
                    window[i] = keys[i].window(d + 6 * (level + wide));
                }
            }
            let mut lanes = walking;
            while lanes != 0 {
                let i = lane(lanes);
                lanes &= lanes - 1;
                let node = self.nodes[next[i] as usize].read();
                let (has_child, child, leaf) = node.step((window[i] >> 58) as u32, Portable);
                window[i] <<= 6;
                if has_child {
                    next[i] = child;
                    prefetch_at(self.nodes, child);
                } else {
                    next[i] = leaf;
                    prefetch_at(self.leaves, leaf);
                    walking &= !(1 << i);
                    at_leaf |= 1 << i;
                }
            }
            level += 1;
        }
        while at_leaf != 0 {
            let i = lane(at_leaf);
            at_leaf &= at_leaf - 1;
            answer[i] = self.leaves[next[i] as usize].read();
        }
        for (o, &a) in out.iter_mut().zip(&answer) {
            *o = decode(a);
        }
    }
}
