//! Incremental updates: insert, replace and remove one prefix, touching only the part of
//! the trie under it.
//!
//! Once the table has been published, nothing a snapshot can reach is written: a node is
//! changed only after [`Trie::writable_root`] and `fresh_children` have copied the path
//! down to it, and leaves always go to a fresh block. Blocks allocated since the last
//! publish are fresh and are written in place, so a batch of updates copies each block at
//! most once. (Before the first publish everything is fresh: a private table pays nothing.)
//!
//! Invariants kept here (and checked by `Trie::check_invariants` in tests):
//! - a node exists only if a prefix ends in it or below it, except the children of a
//!   wide root (a root gets all 64 children once 8 of them hold something, and goes back
//!   to only those when fewer than 4 do: see `adjust_width`);
//! - every node's `default` is the value its parent's slot would have as a leaf;
//! - every leaf is the longest covering prefix (leaf pushing).

use super::node::{encode, Ended, Node, NodeAux, EMPTY, RECORD_HEADER};
use super::{art_index, Trie, GROW_AT, LARGE_DIRECT_BITS, SHRINK_AT, SMALL_DIRECT_BITS};
use crate::key::Key;
use crate::prefix::Prefix;
use crate::MAX_VALUE;

/// Deepest possible path: (128 - 8) / 6 + 1 nodes.
const MAX_DEPTH: usize = 21;
/// A root becomes wide when this many of its children hold something...
const WIDEN_AT: u32 = 8;
/// ...and stops being wide when fewer than this many do.
const NARROW_BELOW: u32 = 4;

impl<K: Key> Trie<K> {
    /// Sets the value of `prefix`, returning the value it had.
    ///
    /// # Panics
    /// If `value` exceeds [`MAX_VALUE`].
    pub fn insert(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32> {
        assert!(value <= MAX_VALUE, "value {value} exceeds MAX_VALUE");
        let old = if prefix.len() <= self.direct_bits {
            self.insert_direct(prefix, value)
        } else {
            self.insert_deep(prefix, value)
        };
        if old.is_none() {
            self.count_by_len[usize::from(prefix.len())] += 1;
            self.len += 1;
            if self.direct_bits == SMALL_DIRECT_BITS && self.len > GROW_AT {
                self.rebuild_with_direct_bits(LARGE_DIRECT_BITS);
            }
        }
        old
    }

    /// Removes `prefix`, returning its value.
    pub fn remove(&mut self, prefix: &Prefix<K>) -> Option<u32> {
        let old = if prefix.len() <= self.direct_bits {
            self.remove_direct(prefix)
        } else {
            self.remove_deep(prefix)
        };
        if old.is_some() {
            self.count_by_len[usize::from(prefix.len())] -= 1;
            self.len -= 1;
            if self.direct_bits == LARGE_DIRECT_BITS && self.len < SHRINK_AT {
                self.rebuild_with_direct_bits(SMALL_DIRECT_BITS);
            } else if self.mostly_free() {
                self.compact();
            }
        }
        old
    }

    /// True when free blocks outnumber used elements two to one (and are worth the
    /// rebuild): compacting then costs no more than the removals that led here.
    pub(super) fn mostly_free(&self) -> bool {
        let free = self.nodes.free_slots() + self.leaves.free_slots();
        let total = self.nodes.len() + self.leaves.len();
        free > 4096 && free > 2 * (total - free)
    }

    pub(super) fn rebuild_with_direct_bits(&mut self, bits: u8) {
        if bits != self.direct_bits {
            *self = Self::build_with_direct_bits(self.to_vec(), bits, self.form);
        }
    }

    // ---- prefixes no longer than the direct bits: painted onto the direct array ----

    fn insert_direct(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32> {
        let old = self.direct_prefixes.insert(prefix, value);
        if old == Some(value) {
            return old;
        }
        let owner = prefix.len() + 1;
        for e in self.direct_range(&prefix) {
            if self.direct_owner[e] <= owner {
                self.direct_owner[e] = owner;
                self.set_direct_value(e, encode(value));
            }
        }
        old
    }

    pub(super) fn remove_direct(&mut self, prefix: &Prefix<K>) -> Option<u32> {
        let old = self.direct_prefixes.remove(prefix)?;
        // Entries owned by this prefix fall back to the longest shorter prefix covering it.
        let (owner, stored) = (0..prefix.len())
            .rev()
            .find_map(|len| {
                let q = Prefix::new_clamped(prefix.addr(), len);
                self.direct_prefixes.get(&q).map(|&v| (len + 1, encode(v)))
            })
            .unwrap_or((0, EMPTY));
        let mine = prefix.len() + 1;
        for e in self.direct_range(prefix) {
            if self.direct_owner[e] == mine {
                self.direct_owner[e] = owner;
                self.set_direct_value(e, stored);
            }
        }
        Some(old)
    }

    pub(super) fn direct_range(&self, prefix: &Prefix<K>) -> std::ops::Range<usize> {
        let d = u32::from(self.direct_bits);
        let start = prefix.addr().bits(0, d) as usize;
        start..start + (1usize << (d - u32::from(prefix.len())))
    }

    fn set_direct_value(&mut self, e: usize, stored: u32) {
        match self.root_node(e) {
            None => self.set_entry(e, stored),
            Some(n) => {
                if self.aux[n as usize].default != stored {
                    let n = self.writable_root(e);
                    self.aux[n as usize].default = stored;
                    self.recompile(n);
                    self.refresh_direct(e, n);
                }
            }
        }
    }

    /// The root node hanging from direct entry `e`, made fresh: copied (with its leaves,
    /// whose record names it) if a snapshot can reach it, and the entry pointed at the copy.
    pub(super) fn writable_root(&mut self, e: usize) -> u32 {
        let n = self.root_node(e).expect("a root hangs from the entry");
        if self.nodes.is_fresh(n) {
            return n;
        }
        let m = self.alloc_nodes(1);
        self.move_node(n, m);
        self.release_nodes(n, 1);
        let values = self.slot_values(m);
        self.compile_leaves(m, &values, true);
        self.refresh_direct(e, m);
        m
    }

    /// Makes node `n`'s children fresh (`n` itself must be): copies their block if a
    /// snapshot can reach it.
    pub(super) fn fresh_children(&mut self, n: u32) {
        let mut node = self.node(n);
        let count = self.ones(node.children);
        if count == 0 || self.nodes.is_fresh(node.child_base) {
            return;
        }
        let base = self.alloc_nodes(count);
        for j in 0..count {
            self.move_node(node.child_base + j, base + j);
        }
        self.release_nodes(node.child_base, count);
        node.child_base = base;
        self.set_node(n, node);
    }

    // ---- longer prefixes: kept in the node where they end ----

    fn insert_deep(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32> {
        if self.get(&prefix) == Some(value) {
            return Some(value);
        }
        let d = u32::from(self.direct_bits);
        let len = u32::from(prefix.len());
        let key = prefix.addr();
        let e = key.bits(0, d) as usize;
        let root = match self.root_node(e) {
            Some(_) => self.writable_root(e),
            None => {
                let n = self.alloc_nodes(1);
                self.init_leaf_node(n, self.entry(e), true);
                n
            }
        };
        let mut n = root;
        let mut depth = d;
        while len > depth + 6 {
            n = self.child_or_new(n, key.bits(depth, 6));
            depth += 6;
        }
        let art = art_index(key, depth, len);
        let stored = encode(value);
        let prefixes = &mut self.aux[n as usize].prefixes;
        let old = match prefixes.binary_search_by_key(&art, |e| e.art) {
            Ok(i) => {
                let old = prefixes[i].stored();
                prefixes[i] = Ended::new(art, stored);
                Some(old - 1)
            }
            Err(i) => {
                let mut more = Vec::with_capacity(prefixes.len() + 1);
                more.extend_from_slice(&prefixes[..i]);
                more.push(Ended::new(art, stored));
                more.extend_from_slice(&prefixes[i..]);
                *prefixes = more.into_boxed_slice();
                None
            }
        };
        self.recompile(n);
        self.adjust_width(root);
        self.refresh_direct(e, root);
        old
    }

    fn remove_deep(&mut self, prefix: &Prefix<K>) -> Option<u32> {
        let d = u32::from(self.direct_bits);
        let len = u32::from(prefix.len());
        let key = prefix.addr();
        let e = key.bits(0, d) as usize;
        self.get(prefix)?;
        let root = self.writable_root(e);
        let mut path = [(0u32, 0u32); MAX_DEPTH];
        let mut path_len = 0;
        let mut n = root;
        let mut depth = d;
        while len > depth + 6 {
            self.fresh_children(n);
            let node = self.node(n);
            let slot = key.bits(depth, 6);
            let bit = 1u64 << slot;
            path[path_len] = (n, slot);
            path_len += 1;
            n = node.child_base + self.ones(node.children & (bit - 1));
            depth += 6;
        }
        let art = art_index(key, depth, len);
        let prefixes = &mut self.aux[n as usize].prefixes;
        let i = prefixes
            .binary_search_by_key(&art, |e| e.art)
            .expect("the prefix was found above");
        let stored = prefixes[i].stored();
        let mut fewer = Vec::with_capacity(prefixes.len() - 1);
        fewer.extend_from_slice(&prefixes[..i]);
        fewer.extend_from_slice(&prefixes[i + 1..]);
        *prefixes = fewer.into_boxed_slice();
        self.recompile(n);
        // Remove nodes that no longer hold anything, bottom up (a wide root keeps its
        // children; it may narrow below).
        while path_len > 0 && self.holds_nothing(n) {
            path_len -= 1;
            let (parent, slot) = path[path_len];
            if path_len == 0 && self.is_wide(parent) {
                break;
            }
            self.remove_child(parent, slot);
            n = parent;
        }
        self.adjust_width(root);
        if self.holds_nothing(root) {
            let default = self.aux[root as usize].default;
            self.free_node_leaves(root);
            self.aux[root as usize] = NodeAux::default();
            self.set_node(root, Node::default());
            self.release_nodes(root, 1);
            self.set_entry(e, default);
            self.wide_roots.remove(&e);
        } else {
            self.refresh_direct(e, root);
        }
        Some(stored - 1)
    }

    /// True if node `n` has no prefixes and no children.
    pub(super) fn holds_nothing(&self, n: u32) -> bool {
        self.aux[n as usize].prefixes.is_empty() && self.node(n).children == 0
    }

    /// Widens or narrows root `r` (fresh) by how many of its children hold something.
    ///
    /// Runs on every deep update, so it counts only as far as the decision needs: a
    /// narrow root with fewer than `WIDEN_AT` children cannot widen, and a wide root stays
    /// wide as soon as `NARROW_BELOW` of its children are found in use.
    pub(super) fn adjust_width(&mut self, r: u32) {
        let node = self.node(r);
        let count = self.ones(node.children);
        let wide = node.children == u64::MAX;
        let enough = if wide { NARROW_BELOW } else { WIDEN_AT };
        if count < enough {
            return;
        }
        let used = (0..count)
            .filter(|&j| !self.holds_nothing(node.child_base + j))
            .take(enough as usize)
            .count() as u32;
        if !wide && used >= WIDEN_AT {
            self.widen(r);
        } else if wide && used < NARROW_BELOW {
            self.narrow(r);
        }
    }

    /// Gives root `r` (fresh) all 64 children, new ones holding their slot's value.
    fn widen(&mut self, r: u32) {
        let mut node = self.node(r);
        let values = self.slot_values(r);
        let base = self.alloc_nodes(64);
        let mut child = node.child_base;
        for slot in 0..64 {
            if node.children >> slot & 1 == 1 {
                self.move_node(child, base + slot);
                child += 1;
            } else {
                self.init_leaf_node(base + slot, values[slot as usize], false);
            }
        }
        let count = self.ones(node.children);
        if count > 0 {
            self.release_nodes(node.child_base, count);
        }
        node.children = u64::MAX;
        node.child_base = base;
        self.set_node(r, node);
        self.recompile(r);
    }

    /// Keeps only the children of wide root `r` (fresh) that hold something.
    fn narrow(&mut self, r: u32) {
        let mut node = self.node(r);
        let keep = (0..64u32)
            .filter(|&s| !self.holds_nothing(node.child_base + s))
            .fold(0u64, |m, s| m | 1 << s);
        let count = self.ones(keep);
        let base = if count > 0 {
            self.alloc_nodes(count)
        } else {
            0
        };
        let mut j = 0;
        for slot in 0..64 {
            let child = node.child_base + slot;
            if keep >> slot & 1 == 1 {
                self.move_node(child, base + j);
                j += 1;
            } else {
                self.free_node_leaves(child);
                self.aux[child as usize] = NodeAux::default();
            }
        }
        self.release_nodes(node.child_base, 64);
        node.children = keep;
        node.child_base = base;
        self.set_node(r, node);
        self.recompile(r);
    }

    /// Makes node `n` a fresh node with no prefixes and no children, all slots `default`;
    /// `root` if it hangs from the direct array.
    fn init_leaf_node(&mut self, n: u32, default: u32, root: bool) {
        self.set_node(n, Node::default());
        self.aux[n as usize] = NodeAux {
            default,
            prefixes: Box::default(),
            root,
        };
        self.compile_leaves(n, &[default; 64], false);
    }

    /// The child of `parent` (fresh) at `slot`, fresh, created (holding the slot's value)
    /// if missing.
    fn child_or_new(&mut self, parent: u32, slot: u32) -> u32 {
        let bit = 1u64 << slot;
        if self.node(parent).children & bit != 0 {
            self.fresh_children(parent);
            let node = self.node(parent);
            return node.child_base + self.ones(node.children & (bit - 1));
        }
        let mut node = self.node(parent);
        let rank = self.ones(node.children & (bit - 1));
        let default = self.slot_values(parent)[slot as usize];
        let count = self.ones(node.children);
        let base = self.alloc_nodes(count + 1);
        for j in 0..count {
            let dst = base + j + u32::from(j >= rank);
            self.move_node(node.child_base + j, dst);
        }
        if count > 0 {
            self.release_nodes(node.child_base, count);
        }
        let child = base + rank;
        self.init_leaf_node(child, default, false);
        node.children |= bit;
        node.child_base = base;
        self.set_node(parent, node);
        self.recompile(parent);
        child
    }

    /// Deletes the (empty) child of `parent` at `slot`.
    fn remove_child(&mut self, parent: u32, slot: u32) {
        let mut node = self.node(parent);
        let bit = 1u64 << slot;
        let rank = self.ones(node.children & (bit - 1));
        let count = self.ones(node.children);
        let child = node.child_base + rank;
        self.free_node_leaves(child);
        self.aux[child as usize] = NodeAux::default();
        let base = if count == 1 {
            0
        } else {
            let base = self.alloc_nodes(count - 1);
            for j in (0..count).filter(|&j| j != rank) {
                let dst = base + j - u32::from(j > rank);
                self.move_node(node.child_base + j, dst);
            }
            base
        };
        if self.nodes.is_fresh(node.child_base) {
            for j in 0..count {
                self.set_node(node.child_base + j, Node::default());
            }
        }
        self.release_nodes(node.child_base, count);
        node.children &= !bit;
        node.child_base = base;
        self.set_node(parent, node);
        self.recompile(parent);
    }

    /// Copies node `from` to the fresh `to`, moving its update-side data.
    pub(super) fn move_node(&mut self, from: u32, to: u32) {
        self.set_node(to, self.node(from));
        self.aux[to as usize] = std::mem::take(&mut self.aux[from as usize]);
    }

    pub(super) fn free_node_leaves(&mut self, n: u32) {
        let node = self.node(n);
        let header = self.header(n);
        let size = self.ones(node.leafvec) + header;
        if size > 0 {
            self.release_leaves(node.leaf_base - header, size);
        }
    }

    /// Words of record header before node `n`'s leaves.
    fn header(&self, n: u32) -> u32 {
        if self.aux[n as usize].root {
            RECORD_HEADER
        } else {
            0
        }
    }

    /// The stored value of each of node `n`'s 64 slots as a leaf.
    pub(super) fn slot_values(&self, n: u32) -> [u32; 64] {
        let aux = &self.aux[n as usize];
        let mut values = [aux.default; 64];
        for e in &aux.prefixes {
            let (art, stored) = (e.art, e.stored());
            let rel = 7 - art.leading_zeros();
            let bits = (u32::from(art) ^ (1 << rel)) as usize;
            let span = 64usize >> rel;
            values[bits * span..(bits + 1) * span].fill(stored);
        }
        values
    }

    /// Recomputes node `n`'s (fresh) leaves from its prefixes and default, and pushes
    /// changed inherited values down into its children.
    pub(super) fn recompile(&mut self, n: u32) {
        let values = self.slot_values(n);
        let changes = |t: &Self| {
            let node = t.node(n);
            let mut children = node.children;
            let mut child = node.child_base;
            while children != 0 {
                if t.aux[child as usize].default != values[children.trailing_zeros() as usize] {
                    return true;
                }
                child += 1;
                children &= children - 1;
            }
            false
        };
        if changes(self) {
            self.fresh_children(n);
        }
        let node = self.node(n);
        let mut children = node.children;
        let mut child = node.child_base;
        while children != 0 {
            let slot = children.trailing_zeros() as usize;
            if self.aux[child as usize].default != values[slot] {
                self.aux[child as usize].default = values[slot];
                self.recompile(child);
            }
            child += 1;
            children &= children - 1;
        }
        self.compile_leaves(n, &values, true);
    }

    /// Writes node `n`'s leaf runs (and record header, for a root) for the given slot
    /// values; `had_block` says whether the node already owns a leaf block.
    pub(super) fn compile_leaves(&mut self, n: u32, values: &[u32; 64], had_block: bool) {
        let node = self.node(n);
        let mut leafvec = 0u64;
        let mut runs = [0u32; 64];
        let mut count = 0u32;
        let mut previous = None;
        for (slot, &v) in values.iter().enumerate() {
            if node.children >> slot & 1 == 1 {
                continue;
            }
            if previous != Some(v) {
                leafvec |= 1 << slot;
                runs[count as usize] = v;
                count += 1;
                previous = Some(v);
            }
        }
        let header = self.header(n);
        let old_size = if had_block {
            self.ones(node.leafvec) + header
        } else {
            0
        };
        let size = count + header;
        let mut block = node.leaf_base.wrapping_sub(header);
        if size != old_size || (old_size > 0 && !self.leaves.is_fresh(block)) {
            if old_size > 0 {
                self.release_leaves(block, old_size);
            }
            block = if size > 0 { self.alloc_leaves(size) } else { 0 };
        }
        let base = block + header;
        if header > 0 {
            self.leaves.set(block, leafvec as u32);
            self.leaves.set(block + 1, (leafvec >> 32) as u32);
            self.leaves.set(block + 2, n);
        }
        for (i, &run) in runs[..count as usize].iter().enumerate() {
            self.leaves.set(base + i as u32, run);
        }
        self.set_node(
            n,
            Node {
                leafvec,
                leaf_base: base,
                ..node
            },
        );
    }
}
