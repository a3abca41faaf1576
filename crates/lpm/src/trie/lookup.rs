//! Lookups: one key at a time, or many at once with their memory reads overlapped.
//!
//! A lookup is a chain of dependent reads (direct entry, nodes, leaf), and each read can
//! miss the cache. The batched lookup walks a group of keys level by level: it issues a
//! prefetch for every key's next read, then comes back to use them, so the reads of the
//! whole group are in flight together instead of one after another.

use super::node::{decode, NODE_FLAG};
use super::Lpm;
use crate::key::Key;

/// Keys walked together by [`Lpm::lookup_batch`].
pub const BATCH_GROUP: usize = 32;

/// Asks the CPU to start loading the cache line of `r`.
#[inline(always)]
fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching has no architectural effect and never faults; the pointer comes
    // from a live reference.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((r as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

impl<K: Key> Lpm<K> {
    /// The value of the longest prefix containing `key`, or `None` if no prefix does.
    #[inline]
    pub fn lookup(&self, key: K) -> Option<u32> {
        decode(self.lookup_stored(key))
    }

    /// Like [`Lpm::lookup`] for a standard library address.
    #[inline]
    pub fn lookup_addr(&self, addr: K::Addr) -> Option<u32> {
        self.lookup(addr.into())
    }

    #[inline(always)]
    fn lookup_stored(&self, key: K) -> u32 {
        let d = u32::from(self.direct_bits);
        let entry = self.direct[key.bits(0, d) as usize];
        if entry & NODE_FLAG == 0 {
            return entry;
        }
        let mut node = self.nodes[(entry & !NODE_FLAG) as usize];
        let mut depth = d;
        loop {
            let bit = 1u64 << key.bits(depth, 6);
            if node.children & bit == 0 {
                let rank = (node.leafvec & (bit | (bit - 1))).count_ones();
                return self.leaves[(node.leaf_base + rank - 1) as usize];
            }
            node =
                self.nodes[(node.child_base + (node.children & (bit - 1)).count_ones()) as usize];
            depth += 6;
        }
    }

    /// Looks up every key of `keys`, writing the answers to the same positions of `out`.
    ///
    /// Keys are walked [`BATCH_GROUP`] at a time with their memory reads overlapped; use
    /// batches of that size or more for full speed.
    ///
    /// # Panics
    /// If `out` is shorter than `keys`.
    pub fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
        assert!(out.len() >= keys.len(), "output shorter than input");
        for (k, o) in keys.chunks(BATCH_GROUP).zip(out.chunks_mut(BATCH_GROUP)) {
            self.lookup_group(k, o);
        }
    }

    #[inline(always)]
    fn lookup_group(&self, keys: &[K], out: &mut [Option<u32>]) {
        let d = u32::from(self.direct_bits);
        let n = keys.len();
        debug_assert!(n <= BATCH_GROUP);
        // Per key: the index of its next read (direct entry, node or leaf), and the key
        // with the bits resolved so far shifted out.
        let mut next = [0u32; BATCH_GROUP];
        let mut rest = [K::default(); BATCH_GROUP];
        for i in 0..n {
            next[i] = keys[i].top(d);
            rest[i] = keys[i].shl(d);
            prefetch(&self.direct[next[i] as usize]);
        }
        // Keys still descending through nodes, and keys whose leaf is known.
        let mut walking = [0u8; BATCH_GROUP];
        let mut walking_len = 0;
        let mut at_leaf = [0u8; BATCH_GROUP];
        let mut at_leaf_len = 0;
        for i in 0..n {
            let entry = self.direct[next[i] as usize];
            if entry & NODE_FLAG == 0 {
                out[i] = decode(entry);
            } else {
                next[i] = entry & !NODE_FLAG;
                prefetch(&self.nodes[next[i] as usize]);
                walking[walking_len] = i as u8;
                walking_len += 1;
            }
        }
        while walking_len > 0 {
            let mut still = 0;
            for w in 0..walking_len {
                let i = walking[w] as usize;
                let node = self.nodes[next[i] as usize];
                let bit = 1u64 << rest[i].top6();
                rest[i] = rest[i].shl(6);
                if node.children & bit != 0 {
                    next[i] = node.child_base + (node.children & (bit - 1)).count_ones();
                    prefetch(&self.nodes[next[i] as usize]);
                    walking[still] = i as u8;
                    still += 1;
                } else {
                    let rank = (node.leafvec & (bit | (bit - 1))).count_ones();
                    next[i] = node.leaf_base + rank - 1;
                    prefetch(&self.leaves[next[i] as usize]);
                    at_leaf[at_leaf_len] = i as u8;
                    at_leaf_len += 1;
                }
            }
            walking_len = still;
        }
        for &i in &at_leaf[..at_leaf_len] {
            let i = i as usize;
            out[i] = decode(self.leaves[next[i] as usize]);
        }
    }
}
