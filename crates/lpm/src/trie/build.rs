//! Bulk build: a whole table from a list of prefixes in one pass, packed tightly.
//!
//! The list is sorted by address then length, so the prefixes under any node form one
//! contiguous run, and within the run of one slot the prefixes ending in the node come
//! before the longer ones. Each node is built once, its children allocated as one block.

use super::node::{encode, Ended, Node};
use super::{art_index, Trie, GROW_AT, LARGE_DIRECT_BITS, SMALL_DIRECT_BITS};
use crate::form::Runnable;
use crate::key::Key;
use crate::prefix::Prefix;
use crate::MAX_VALUE;

impl<K: Key> Trie<K> {
    /// Builds a table from `(prefix, value)` pairs; a prefix given twice keeps its last value.
    ///
    /// # Panics
    /// If a value exceeds [`MAX_VALUE`].
    pub fn build(routes: impl IntoIterator<Item = (Prefix<K>, u32)>) -> Self {
        let routes: Vec<_> = routes.into_iter().collect();
        let bits = if routes.len() > GROW_AT {
            LARGE_DIRECT_BITS
        } else {
            SMALL_DIRECT_BITS
        };
        Self::build_with_direct_bits(routes, bits, Runnable::best())
    }

    pub(super) fn build_with_direct_bits(
        mut routes: Vec<(Prefix<K>, u32)>,
        bits: u8,
        form: Runnable,
    ) -> Self {
        routes.sort_by_key(|(p, _)| (p.addr(), p.len()));
        // Keep the last value of a duplicate (the sort is stable).
        routes.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1 = later.1;
            }
            same
        });
        let mut t = Self::with_direct_bits(bits, form);
        for &(p, v) in &routes {
            assert!(v <= MAX_VALUE, "value {v} exceeds MAX_VALUE");
            t.count_by_len[usize::from(p.len())] += 1;
        }
        t.len = routes.len();

        // Prefixes within the direct bits: paint shortest first, so longer ones win.
        let mut shallow: Vec<_> = routes.iter().filter(|(p, _)| p.len() <= bits).collect();
        shallow.sort_by_key(|(p, _)| p.len());
        for &&(p, v) in &shallow {
            t.direct_prefixes.insert(p, v);
            for e in t.direct_range(&p) {
                t.set_entry(e, encode(v));
                t.direct_owner[e] = p.len() + 1;
            }
        }

        // Longer prefixes: one subtree per direct entry, built from its contiguous run.
        let deep: Vec<_> = routes.into_iter().filter(|(p, _)| p.len() > bits).collect();
        let d = u32::from(bits);
        let mut i = 0;
        while i < deep.len() {
            let e = deep[i].0.addr().bits(0, d);
            let j = i + deep[i..]
                .iter()
                .position(|(p, _)| p.addr().bits(0, d) != e)
                .unwrap_or(deep.len() - i);
            let n = t.alloc_nodes(1);
            t.aux[n as usize].default = t.entry(e as usize);
            t.aux[n as usize].root = true;
            t.build_node(n, d, &deep[i..j]);
            t.adjust_width(n);
            t.refresh_direct(e as usize, n);
            i = j;
        }
        t.direct.fit();
        t.nodes.fit();
        t.leaves.fit();
        t
    }

    /// Fills node `n` (whose `default` is set) from `items`: every prefix longer than
    /// `depth` inside the node's region, sorted by address then length.
    fn build_node(&mut self, n: u32, depth: u32, items: &[(Prefix<K>, u32)]) {
        let mut prefixes = Vec::new();
        let mut children = 0u64;
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        let mut i = 0;
        while i < items.len() {
            let slot = items[i].0.addr().bits(depth, 6);
            let in_slot = |p: &Prefix<K>| p.addr().bits(depth, 6) == slot;
            while i < items.len()
                && in_slot(&items[i].0)
                && u32::from(items[i].0.len()) <= depth + 6
            {
                let (p, v) = items[i];
                prefixes.push(Ended::new(
                    art_index(p.addr(), depth, u32::from(p.len())),
                    encode(v),
                ));
                i += 1;
            }
            let start = i;
            while i < items.len() && in_slot(&items[i].0) {
                i += 1;
            }
            if i > start {
                children |= 1 << slot;
                runs.push((slot as usize, start, i));
            }
        }
        prefixes.sort_unstable_by_key(|e| e.art);
        self.aux[n as usize].prefixes = prefixes.into_boxed_slice();
        let count = self.ones(children);
        let base = if count > 0 {
            self.alloc_nodes(count)
        } else {
            0
        };
        self.set_node(
            n,
            Node {
                children,
                child_base: base,
                ..self.node(n)
            },
        );
        let values = self.slot_values(n);
        for (rank, &(slot, start, end)) in runs.iter().enumerate() {
            let child = base + rank as u32;
            self.aux[child as usize].default = values[slot];
            self.build_node(child, depth + 6, &items[start..end]);
        }
        self.compile_leaves(n, &values, false);
    }
}
