//! Lookups in the range trees, one key at a time or a batch in lockstep.
//!
//! Every key takes the first stage's height in node steps and then one leaf step. A batch
//! of [`RANGE_BATCH`] keys takes each key through the upper levels at once (they stay in
//! the caches; in registers, with nothing stored between steps), then walks the last
//! node level and the leaves level by level: one step per key and a prefetch of that
//! key's next lines, so that a level's prefetches arrive while the pass over the other
//! keys goes on. (Walking every level in lockstep cost 20% more: 12.7-14.1 ns a matched
//! IPv6 lookup against 10.1-10.4, `lookup_profile`; walking only the leaves in lockstep,
//! 11.7-12.1.) Keys whose /64 holds longer prefixes take the second stage afterwards, its
//! roots prefetched first (none in the real tables).

use super::layout::{leaf_value, node_child, LeafCell, NodeCell, DEEP, NO_ROUTE};
use super::spans::{low64, top64, wide};
use super::tree::{search, Tree};
use super::{RangeLpm, RangeSnapshot};
use crate::key::Key;

/// Keys walked in lockstep by a batched lookup.
pub const RANGE_BATCH: usize = 64;

/// What lookups read.
#[derive(Clone, Copy)]
struct View<'a> {
    leaves: &'a [LeafCell],
    nodes: &'a [NodeCell],
    main: Tree,
}

/// Asks the CPU to start loading the line at `p` (a hint: any address is allowed).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and changes no state visible to the program,
    // whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl View<'_> {
    #[inline(always)]
    fn finish(&self, stored: u32, w: u128) -> Option<u32> {
        let v = match Tree::from_deep(stored) {
            Some(deep) => search(self.leaves, self.nodes, deep, low64(w)),
            None => stored,
        };
        (v != NO_ROUTE).then_some(v)
    }

    #[inline(always)]
    fn lookup<K: Key>(&self, key: K) -> Option<u32> {
        let w = wide(key);
        self.finish(search(self.leaves, self.nodes, self.main, top64(w)), w)
    }

    fn lookup_batch<K: Key>(&self, keys: &[K], out: &mut [Option<u32>]) {
        assert!(out.len() >= keys.len(), "output shorter than input");
        for (ks, os) in keys.chunks(RANGE_BATCH).zip(out.chunks_mut(RANGE_BATCH)) {
            let mut top = [0u64; RANGE_BATCH];
            let mut at = [0u32; RANGE_BATCH];
            // The levels above the last two (a full IPv6 table's first 200 nodes) stay
            // cached: each key goes through them at once, in registers.
            let hot = self.main.height.saturating_sub(2);
            for ((t, a), &k) in top.iter_mut().zip(at.iter_mut()).zip(ks) {
                *t = top64(wide(k));
                let mut i = self.main.root;
                for _ in 0..hot {
                    i = node_child(&self.nodes[i as usize], *t);
                }
                *a = i;
            }
            let n = ks.len();
            // Each of the last two steps starts loading the line the key needs next, which
            // the pass over the other keys gives time to arrive.
            for level in (0..self.main.height.min(2)).rev() {
                if level == 1 {
                    for (a, &t) in at[..n].iter_mut().zip(&top[..n]) {
                        *a = node_child(&self.nodes[*a as usize], t);
                        let p = self.nodes.as_ptr().wrapping_add(*a as usize).cast::<u8>();
                        prefetch(p);
                        prefetch(p.wrapping_add(64));
                    }
                } else {
                    for (a, &t) in at[..n].iter_mut().zip(&top[..n]) {
                        *a = node_child(&self.nodes[*a as usize], t);
                        prefetch(self.leaves.as_ptr().wrapping_add(*a as usize));
                    }
                }
            }
            let mut deep = 0u32;
            for (a, &t) in at[..n].iter_mut().zip(&top[..n]) {
                *a = leaf_value(&self.leaves[*a as usize], t);
                deep |= *a;
            }
            if deep & DEEP != 0 {
                // Some keys fall in /64s holding longer prefixes: start loading the roots
                // of their second stages before searching any.
                for &stored in &at[..n] {
                    if let Some(tree) = Tree::from_deep(stored) {
                        let root = match tree.height {
                            0 => self.leaves.as_ptr().wrapping_add(tree.root as usize).cast(),
                            _ => self.nodes.as_ptr().wrapping_add(tree.root as usize).cast(),
                        };
                        prefetch::<u8>(root);
                    }
                }
            }
            for ((o, &stored), &k) in os.iter_mut().zip(&at[..n]).zip(ks) {
                *o = self.finish(stored, wide(k));
            }
        }
    }
}

/// Lookups, the same on the writer's table and on a published snapshot.
macro_rules! range_lookups {
    ($t:ident) => {
        impl<K: Key> $t<K> {
            /// The value of the longest prefix containing `key`, if any.
            #[inline]
            pub fn lookup(&self, key: K) -> Option<u32> {
                self.view().lookup(key)
            }

            /// [`Self::lookup`] of a standard library address.
            #[inline]
            pub fn lookup_addr(&self, addr: K::Addr) -> Option<u32> {
                self.lookup(addr.into())
            }

            /// Looks up every key of `keys`, writing the answers to the same positions of
            /// `out`, walking [`RANGE_BATCH`] keys at a time in lockstep.
            ///
            /// # Panics
            /// If `out` is shorter than `keys`.
            pub fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
                self.view().lookup_batch(keys, out)
            }
        }
    };
}

range_lookups!(RangeLpm);
range_lookups!(RangeSnapshot);

impl<K: Key> RangeLpm<K> {
    #[inline(always)]
    fn view(&self) -> View<'_> {
        View {
            leaves: self.store.leaves.buffer(),
            nodes: self.store.nodes.buffer(),
            main: self.main,
        }
    }
}

impl<K: Key> RangeSnapshot<K> {
    #[inline(always)]
    fn view(&self) -> View<'_> {
        View {
            leaves: &self.leaves,
            nodes: &self.nodes,
            main: self.main,
        }
    }
}
