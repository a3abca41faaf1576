//! Lookups in the range trees, one key at a time or a batch in lockstep.
//!
//! Every key takes the first stage's height in node steps and then one leaf step. A batch
//! of [`BATCH`] keys takes each key through the upper levels at once (they stay in
//! the caches; in registers, with nothing stored between steps), then walks the last
//! node level and the leaves level by level: one step per key and a prefetch of that
//! key's next lines, so that a level's prefetches arrive while the pass over the other
//! keys goes on. (Walking every level in lockstep cost 20% more: 12.7-14.1 ns a matched
//! IPv6 lookup against 10.1-10.4, `lookup_profile`; walking only the leaves in lockstep,
//! 11.7-12.1.) Keys whose /64 holds longer prefixes take the second stage afterwards, its
//! roots prefetched first (none in the real tables).
//!
//! Every step is one of the [`Steps`] of the table's form ([`crate::form`]): the walks
//! below are generic over them and compiled once per form, and the table's form chooses,
//! once per call.

use super::layout::{LeafLine, NodeLine, Steps, DEEP, UNROUTED};
use super::spans::{low64, top64, wide};
use super::tree::{search, Tree};
use super::{RangeSnapshot, RangeTree};
#[cfg(target_arch = "x86_64")]
use crate::form::{avx2_form, avx512_form, Avx2, Avx512};
use crate::form::{Portable, Runnable};
use crate::key::Key;
use crate::BATCH;

/// What lookups read, borrowed from a range tree or a snapshot of one.
#[derive(Clone, Copy)]
pub(crate) struct RangeView<'a> {
    form: Runnable,
    leaves: &'a [LeafLine],
    nodes: &'a [NodeLine],
    main: Tree,
}

/// Asks the CPU to start loading the line at `p` (a hint: any address is allowed).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch never faults and changes no state visible to the program,
    // whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = p;
}

/// What lookups read from: a range tree or a snapshot of one. A single lookup in a vector
/// form is a call (its code is compiled for the form, so it cannot be inlined into a
/// caller compiled for baseline x86-64); the callee takes the table and builds the view
/// itself, from loads, rather than from a view its caller stored to the stack.
pub(crate) trait Viewed {
    /// The arrays lookups read.
    fn view(&self) -> RangeView<'_>;
}

avx2_form! {
    /// [`RangeView::lookup_with`] compiled for the AVX2 form.
    fn lookup_avx2<K: Key, T: Viewed>(table: &T, cpu: Avx2, key: K) -> Option<u32> {
        table.view().lookup_with(cpu, key)
    }

    /// [`RangeView::batch_with`] compiled for the AVX2 form.
    fn batch_avx2<K: Key>(view: &RangeView<'_>, cpu: Avx2, keys: &[K], out: &mut [Option<u32>]) {
        view.batch_with(cpu, keys, out)
    }
}

avx512_form! {
    /// [`RangeView::lookup_with`] compiled for the AVX-512 form.
    fn lookup_avx512<K: Key, T: Viewed>(table: &T, cpu: Avx512, key: K) -> Option<u32> {
        table.view().lookup_with(cpu, key)
    }

    /// [`RangeView::batch_with`] compiled for the AVX-512 form.
    fn batch_avx512<K: Key>(
        view: &RangeView<'_>,
        cpu: Avx512,
        keys: &[K],
        out: &mut [Option<u32>],
    ) {
        view.batch_with(cpu, keys, out)
    }
}

/// The value of `key`'s longest prefix in `table`, by the code of its form.
#[inline(always)]
fn lookup<K: Key, T: Viewed>(table: &T, form: Runnable, key: K) -> Option<u32> {
    match form {
        Runnable::Portable => table.view().lookup_with(Portable, key),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `cpu` exists only where this CPU has the form's features
        // (`crate::form`: `Runnable::new` detects them before making one).
        Runnable::Avx2(cpu) => unsafe { lookup_avx2(table, cpu, key) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for the AVX-512 form.
        Runnable::Avx512(cpu) => unsafe { lookup_avx512(table, cpu, key) },
    }
}

impl RangeView<'_> {
    /// Looks up every key of `keys` into `out`, by the code of the view's form.
    pub(crate) fn lookup_batch<K: Key>(&self, keys: &[K], out: &mut [Option<u32>]) {
        assert!(out.len() >= keys.len(), "output shorter than input");
        match self.form {
            Runnable::Portable => self.batch_with(Portable, keys, out),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `lookup`, `cpu` proves the CPU has the form's features.
            Runnable::Avx2(cpu) => unsafe { batch_avx2(self, cpu, keys, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for the AVX-512 form.
            Runnable::Avx512(cpu) => unsafe { batch_avx512(self, cpu, keys, out) },
        }
    }

    #[inline(always)]
    fn finish<S: Steps>(&self, steps: S, stored: u32, w: u128) -> Option<u32> {
        let v = match Tree::from_deep(stored) {
            Some(deep) => search(steps, self.leaves, self.nodes, deep, low64(w)),
            None => stored,
        };
        (v != UNROUTED).then_some(v)
    }

    #[inline(always)]
    fn lookup_with<S: Steps, K: Key>(&self, steps: S, key: K) -> Option<u32> {
        let w = wide(key);
        let stored = search(steps, self.leaves, self.nodes, self.main, top64(w));
        self.finish(steps, stored, w)
    }

    #[inline(always)]
    fn batch_with<S: Steps, K: Key>(&self, steps: S, keys: &[K], out: &mut [Option<u32>]) {
        for (ks, os) in keys.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
            let mut top = [0u64; BATCH];
            let mut at = [0u32; BATCH];
            // The levels above the last two (a full IPv6 table's first 200 nodes) stay
            // cached: each key goes through them at once, in registers.
            let hot = self.main.height.saturating_sub(2);
            for ((t, a), &k) in top.iter_mut().zip(at.iter_mut()).zip(ks) {
                *t = top64(wide(k));
                let mut i = self.main.root;
                for _ in 0..hot {
                    i = steps.node_child(&self.nodes[i as usize], *t);
                }
                *a = i;
            }
            let n = ks.len();
            // Each of the last two steps starts loading the line the key needs next, which
            // the pass over the other keys gives time to arrive.
            for level in (0..self.main.height.min(2)).rev() {
                if level == 1 {
                    for (a, &t) in at[..n].iter_mut().zip(&top[..n]) {
                        *a = steps.node_child(&self.nodes[*a as usize], t);
                        let p = self.nodes.as_ptr().wrapping_add(*a as usize).cast::<u8>();
                        prefetch(p);
                        prefetch(p.wrapping_add(64));
                    }
                } else {
                    for (a, &t) in at[..n].iter_mut().zip(&top[..n]) {
                        *a = steps.node_child(&self.nodes[*a as usize], t);
                        prefetch(self.leaves.as_ptr().wrapping_add(*a as usize));
                    }
                }
            }
            let mut deep = 0u32;
            for (a, &t) in at[..n].iter_mut().zip(&top[..n]) {
                *a = steps.leaf_value(&self.leaves[*a as usize], t);
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
                *o = self.finish(steps, stored, wide(k));
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
                lookup(self, self.form, key)
            }

            /// Looks up every key of `keys`, writing the answers to the same positions of
            /// `out`, walking [`BATCH`] keys at a time in lockstep.
            ///
            /// # Panics
            /// If `out` is shorter than `keys`.
            pub fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
                self.view().lookup_batch(keys, out)
            }
        }
    };
}

range_lookups!(RangeTree);
range_lookups!(RangeSnapshot);

impl<K: Key> Viewed for RangeTree<K> {
    #[inline(always)]
    fn view(&self) -> RangeView<'_> {
        RangeView {
            form: self.form,
            leaves: self.store.leaves.buffer(),
            nodes: self.store.nodes.buffer(),
            main: self.main,
        }
    }
}

impl<K: Key> Viewed for RangeSnapshot<K> {
    #[inline(always)]
    fn view(&self) -> RangeView<'_> {
        RangeView {
            form: self.form,
            leaves: &self.leaves,
            nodes: &self.nodes,
            main: self.main,
        }
    }
}
