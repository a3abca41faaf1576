//! The range tree: longest-prefix match as a search over address ranges.
//!
//! # The idea
//!
//! A table of prefixes cuts the address space into ranges, each with one answer (the
//! longest prefix covering it). A lookup is then a search for the range holding the
//! address: no walk bit by bit, no backtracking, and every lookup takes the same number
//! of steps, so a batch walks in lockstep with no branch on the data. PlanB (NSDI 2026)
//! measured this with wide compares; here the search is a B+-tree whose steps are two
//! AVX-512 compares of a node's 15 separators (two cache lines; its 16 children side by
//! side, so the child is found by addition) and, at the bottom, one compare in a leaf of
//! seven ranges packed into one line (see `layout.rs`). On the shipped IPv6 table a
//! batched lookup costs 55-65% of the trie's (`fibre bench lookup --structure`, and the
//! `lookup_profile` example), which is why IPv6 uses it; for IPv4 the trie is two to
//! three times faster.
//!
//! The first-stage tree searches the top 64 bits of a key, which is all of an IPv4
//! address and every IPv6 prefix up to /64 (all of the real table). A /64 that holds
//! longer prefixes is one range whose value refers to a second-stage tree over the low 64
//! bits, built from the prefixes inside it; so /65../128 cost one more search, and only
//! for keys that fall in such a /64.
//!
//! # Updates
//!
//! The prefixes themselves sit in an ordered map beside the trees, never read by
//! lookups. A change to prefix P changes the answers only within P's span: the structure
//! sweeps the prefixes inside P (the map holds them side by side) into the span's new
//! ranges and assigns them to the tree, which rewrites the leaves overlapping the span and
//! splits what overflows (`tree.rs`). A span holding many ranges (a default route, say)
//! is cheaper to rebuild in bulk, as is a tree that has split to twice its built size.
//!
//! # Sharing with readers
//!
//! As the trie does (see its documentation and [`crate::shared`]): blocks of lines that a
//! published [`RangeSnapshot`] can reach are copied, never written, and reused only once
//! no reader holds a snapshot that reaches them.

mod layout;
mod lookup;
mod spans;
#[cfg(test)]
mod tests;
mod tree;

use crate::form::Runnable;
use crate::key::Key;
use crate::prefix::Prefix;
use crate::{MemoryUsage, MAX_VALUE};
use layout::{LeafLine, NodeLine, UNROUTED};
use spans::{low64, span, sweep, top64, wide};
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;
use tree::{Store, Tree, TreeReleased};

/// Prefix `p` as the map of prefixes keys it.
#[inline]
fn packed<K: Key>(p: &Prefix<K>) -> K::Packed {
    p.addr().pack(p.len())
}

/// The prefix a key of the map of prefixes packs.
#[inline]
fn unpacked<K: Key>(key: K::Packed) -> Prefix<K> {
    let (addr, len) = K::unpack(key);
    Prefix::new_clamped(addr, len)
}

/// Spans with more ranges than this are rebuilt in bulk rather than assigned.
const BULK_SPAN: usize = 1 << 14;
/// Rebuild when the leaves have grown past twice their number after the last bulk build
/// plus this many.
const REBUILD_SLACK: usize = 1024;

/// A map from prefixes of one address family to values, with longest-prefix lookups by
/// range search. The same operations as the trie; the module documentation says how it
/// works and when it is the better structure.
pub(crate) struct RangeTree<K: Key> {
    /// The instructions lookups use.
    form: Runnable,
    // ---- update side: never read by lookups ----
    /// The prefixes and their values, each keyed packed ([`crate::key::bits::Bits::pack`]:
    /// the full IPv6 table's map in 7.9 MB rather than 13.3).
    prefixes: BTreeMap<K::Packed, u32>,
    count_by_len: Vec<usize>,
    /// Live leaves right after the last bulk build.
    built_leaves: usize,
    // ---- what lookups read ----
    store: Store,
    main: Tree,
    _key: PhantomData<fn() -> K>,
}

/// One published version of a [`RangeTree`]: everything lookups need.
pub(crate) struct RangeSnapshot<K: Key> {
    form: Runnable,
    leaves: Arc<[LeafLine]>,
    nodes: Arc<[NodeLine]>,
    main: Tree,
    len: usize,
    _key: PhantomData<fn() -> K>,
}

impl<K: Key> RangeSnapshot<K> {
    /// Number of prefixes in this version.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The instructions lookups use.
    pub fn form(&self) -> Runnable {
        self.form
    }
}

impl<K: Key> std::fmt::Debug for RangeSnapshot<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeSnapshot")
            .field("family", &K::FAMILY)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Lines a [`RangeTree`] released before a publish, to be reused once no reader can
/// reach them (see [`mod@crate::shared`]).
#[derive(Debug)]
pub(crate) struct RangeReleased(TreeReleased);

impl<K: Key> Default for RangeTree<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key> Clone for RangeTree<K> {
    /// A private copy, never published: the same prefixes, values and form, built afresh
    /// (blocks the original keeps for its readers stay behind).
    fn clone(&self) -> Self {
        let mut copy = Self::build(self.iter());
        copy.form = self.form;
        copy
    }
}

impl<K: Key> std::fmt::Debug for RangeTree<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeTree")
            .field("family", &K::FAMILY)
            .field("len", &self.prefixes.len())
            .field("form", &self.form.form())
            .field("height", &self.main.height)
            .finish_non_exhaustive()
    }
}

impl<K: Key> RangeTree<K> {
    /// An empty table (one leaf), its lookups in the fastest form this CPU runs.
    pub fn new() -> Self {
        let mut store = Store::default();
        let main = store.build(&[(0, UNROUTED)]);
        RangeTree {
            form: Runnable::best(),
            prefixes: BTreeMap::new(),
            count_by_len: vec![0; usize::from(K::BITS) + 1],
            built_leaves: 1,
            store,
            main,
            _key: PhantomData,
        }
    }

    /// A table holding `routes` (later duplicates replace earlier ones), built in bulk.
    pub fn build(routes: impl IntoIterator<Item = (Prefix<K>, u32)>) -> Self {
        let mut t = Self::new();
        // The map built from sorted keys in one pass: inserted one at a time, each insert
        // searched the map (a full IPv6 table's took 65 ms of a snapshot's compile).
        let mut all: Vec<(K::Packed, u32, u8)> = routes
            .into_iter()
            .map(|(p, v)| {
                assert!(v <= MAX_VALUE, "value {v} exceeds MAX_VALUE");
                (packed(&p), v, p.len())
            })
            .collect();
        // Stable: of a prefix given twice, the later value stays.
        all.sort_by_key(|a| a.0);
        let mut unique: Vec<(K::Packed, u32)> = Vec::with_capacity(all.len());
        for (i, &(key, value, len)) in all.iter().enumerate() {
            if all.get(i + 1).is_some_and(|next| next.0 == key) {
                continue;
            }
            t.count_by_len[usize::from(len)] += 1;
            unique.push((key, value));
        }
        t.prefixes = unique.into_iter().collect();
        t.rebuild();
        t
    }

    /// Sets `prefix` to `value`; returns the value it had.
    ///
    /// # Panics
    /// If `value` exceeds [`MAX_VALUE`].
    pub fn insert(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32> {
        assert!(value <= MAX_VALUE, "value {value} exceeds MAX_VALUE");
        let old = self.prefixes.insert(packed(&prefix), value);
        if old.is_none() {
            self.count_by_len[usize::from(prefix.len())] += 1;
        }
        if old != Some(value) {
            self.changed(&prefix);
        }
        old
    }

    /// Removes `prefix`; returns its value.
    pub fn remove(&mut self, prefix: &Prefix<K>) -> Option<u32> {
        let old = self.prefixes.remove(&packed(prefix))?;
        self.count_by_len[usize::from(prefix.len())] -= 1;
        self.changed(prefix);
        Some(old)
    }

    /// Removes every prefix of `prefixes` the tree holds; returns how many it held.
    pub fn remove_many(&mut self, prefixes: &[Prefix<K>]) -> usize {
        prefixes.iter().filter(|p| self.remove(p).is_some()).count()
    }

    /// The value of exactly `prefix`.
    pub fn get(&self, prefix: &Prefix<K>) -> Option<u32> {
        self.prefixes.get(&packed(prefix)).copied()
    }

    /// Number of prefixes.
    pub fn len(&self) -> usize {
        self.prefixes.len()
    }

    /// Number of prefixes of each length, indexed by length.
    pub fn count_by_len(&self) -> &[usize] {
        &self.count_by_len
    }

    /// Iterates over all prefixes and values, sorted by address, then length.
    pub fn iter(&self) -> impl Iterator<Item = (Prefix<K>, u32)> + '_ {
        self.prefixes.iter().map(|(p, v)| (unpacked(*p), *v))
    }

    /// All prefixes and values, sorted by address, then length.
    pub fn to_vec(&self) -> Vec<(Prefix<K>, u32)> {
        self.iter().collect()
    }

    /// Removes every prefix (the form stays).
    pub fn clear(&mut self) {
        let form = self.form;
        *self = Self::new();
        self.form = form;
    }

    /// The instructions lookups use.
    pub fn form(&self) -> Runnable {
        self.form
    }

    /// Makes lookups (of this table and of its next snapshots) use `form`.
    pub fn set_form(&mut self, form: Runnable) {
        self.form = form;
    }

    /// Rebuilds the trees in bulk in new arenas, tightly packed (the same prefixes,
    /// values and form).
    pub fn compact(&mut self) {
        *self = self.clone();
    }

    /// Bytes used, by purpose. `nodes` and `leaves` count the arenas' nodes (128 bytes,
    /// two cache lines each) and leaves (64 bytes, one line).
    pub fn memory(&self) -> MemoryUsage {
        use std::mem::size_of;
        let lookup_bytes = self.store.leaves.lookup_bytes() + self.store.nodes.lookup_bytes();
        // A B-tree map keeps keys and values in separate arrays in its nodes, which are
        // two thirds full on average: an entry costs its key and value and half again.
        let entry = size_of::<K::Packed>() + size_of::<u32>();
        let map_bytes = self.prefixes.len() * entry * 3 / 2;
        MemoryUsage {
            lookup_bytes,
            update_bytes: map_bytes + self.store.update_bytes(),
            nodes: self.store.nodes.len(),
            leaves: self.store.leaves.len(),
            free_slots: self.store.leaves.free_slots() + self.store.nodes.free_slots(),
        }
    }

    /// This table as readers will see it: a snapshot sharing its arrays, and the lines
    /// released since the last publish. The table copies what it changes from now on.
    pub(crate) fn publish(&mut self) -> (RangeSnapshot<K>, RangeReleased) {
        let released = self.store.publish();
        let snapshot = RangeSnapshot {
            form: self.form,
            leaves: self.store.leaves.buffer().clone(),
            nodes: self.store.nodes.buffer().clone(),
            main: self.main,
            len: self.prefixes.len(),
            _key: PhantomData,
        };
        (snapshot, RangeReleased(released))
    }

    /// Reuses lines that no reader can reach any more.
    pub(crate) fn reclaim(&mut self, released: RangeReleased) {
        self.store.reclaim(released.0);
    }

    /// The stored value of the longest prefix shorter than `len` that covers `addr`.
    ///
    /// The map's last prefix at or before `addr/(len-1)` is either that prefix, or one
    /// that shares fewer leading bits with `addr` than any covering prefix is long, so
    /// the search goes on below that: a few ordered-map searches, not one per length.
    fn covering(&self, addr: K, len: u8) -> u32 {
        let mut below = len; // every candidate is shorter than this
        while below > 0 {
            let probe = Prefix::new_clamped(addr, below - 1);
            let Some((&q, &v)) = self.prefixes.range(..=packed(&probe)).next_back() else {
                break;
            };
            let q = unpacked::<K>(q);
            if q.len() < below && q.contains(addr) {
                return v;
            }
            // `q` is before `probe` and does not cover `addr`: every prefix that does and
            // is before `probe` also covers `q`'s address, so it is at most as long as
            // the bits the two addresses share (fewer than `below - 1`).
            let common = (wide(q.addr()) ^ wide(addr)).leading_zeros() as u8;
            debug_assert!(common < below - 1);
            // (The `min` keeps the loop finite even if that reasoning were wrong.)
            below = (common + 1).min(below - 1);
        }
        UNROUTED
    }

    /// The prefixes inside `p` (itself included), in order.
    fn inside(&self, p: &Prefix<K>) -> impl Iterator<Item = (Prefix<K>, u32)> + '_ {
        let (_, end) = span(p);
        let last = Prefix::new_clamped(spans::narrow::<K>(end), K::BITS);
        self.prefixes
            .range(packed(p)..=packed(&last))
            .map(|(q, v)| (unpacked(*q), *v))
    }

    /// Brings the trees up to date after `p` changed in the map.
    fn changed(&mut self, p: &Prefix<K>) {
        if p.len() <= 64 {
            let (s, e) = span(p);
            // A prefix in the map starts its own span: what is around it does not count.
            let covering = if self.prefixes.contains_key(&packed(p)) {
                UNROUTED
            } else {
                self.covering(p.addr(), p.len())
            };
            let ranges = sweep(s, e, covering, self.inside(p));
            if ranges.len() > BULK_SPAN {
                self.rebuild();
            } else {
                self.assign_first_stage(s, e, &ranges);
            }
        } else {
            self.changed_long(p);
        }
        if self.store.live_leaves > 2 * self.built_leaves + REBUILD_SLACK {
            self.rebuild();
        }
    }

    /// A prefix longer than /64 changed: its /64's second-stage tree follows.
    fn changed_long(&mut self, p: &Prefix<K>) {
        let block = Prefix::new_clamped(p.addr(), 64);
        let b = top64(wide(block.addr()));
        let old = Tree::from_deep(self.store.search(self.main, b));
        let any_long = self.inside(&block).any(|(q, _)| q.len() > 64);
        let value = match (old, any_long) {
            (Some(deep), true) => {
                let (s, e) = span(p);
                let ranges = sweep(s, e, self.covering(p.addr(), p.len()), self.inside(p));
                let low: Vec<(u64, u32)> = ranges.iter().map(|r| (low64(r.0), r.1)).collect();
                let new = self.store.assign(deep, low64(s), low64(e), &low);
                if new == deep {
                    return;
                }
                new.to_deep()
            }
            (None, true) => self.build_deep(&block),
            (Some(deep), false) => {
                self.store.release_tree(deep);
                self.covering(block.addr(), 65)
            }
            (None, false) => self.covering(block.addr(), 65),
        };
        self.main = self.store.assign(self.main, b, b, &[(b, value)]);
    }

    /// Builds the second-stage tree of the /64 `block` from the prefixes inside it;
    /// returns the stored value that refers to it.
    fn build_deep(&mut self, block: &Prefix<K>) -> u32 {
        let (s, e) = span(block);
        let covering = self.covering(block.addr(), 65);
        let ranges = sweep(
            s,
            e,
            covering,
            self.inside(block).filter(|(q, _)| q.len() > 64),
        );
        let low: Vec<(u64, u32)> = ranges.iter().map(|r| (low64(r.0), r.1)).collect();
        self.store.build(&low).to_deep()
    }

    /// Makes the first stage's ranges over the /64-aligned span `[s, e]` those of
    /// `ranges` (widened), with second-stage trees for the /64s that need one.
    fn assign_first_stage(&mut self, s: u128, e: u128, ranges: &[(u128, u32)]) {
        // The second stages there are rebuilt (the values around them may have changed),
        // and a /64 whose long prefixes all answer as the prefix around them does needs
        // none.
        let long: usize = self.count_by_len.iter().skip(65).sum();
        // Second stages exist exactly while longer prefixes do.
        if long > 0 {
            for old in self.store.deep_in(self.main, top64(s), top64(e)) {
                self.store.release_tree(old);
            }
        }
        let first = self.first_stage(ranges, e);
        self.main = self.store.assign(self.main, top64(s), top64(e), &first);
    }

    /// The first-stage ranges of widened `ranges` ending at `e`: a /64 where a range
    /// starts inside becomes one range referring to a new second-stage tree.
    fn first_stage(&mut self, ranges: &[(u128, u32)], e: u128) -> Vec<(u64, u32)> {
        if ranges.iter().all(|r| low64(r.0) == 0) {
            // No /64 holds a longer prefix (IPv4 always, IPv6 almost always).
            return ranges.iter().map(|r| (top64(r.0), r.1)).collect();
        }
        let mut deep: Vec<u64> = ranges
            .iter()
            .filter(|r| low64(r.0) != 0)
            .map(|r| top64(r.0))
            .collect();
        deep.dedup();
        let mut at: Vec<u64> = ranges
            .iter()
            .filter(|r| low64(r.0) == 0)
            .map(|r| top64(r.0))
            .collect();
        for &b in &deep {
            at.push(b);
            if b < top64(e) {
                at.push(b + 1);
            }
        }
        at.sort_unstable();
        at.dedup();
        let answer_at = |w: u128| ranges[ranges.partition_point(|r| r.0 <= w) - 1].1;
        let mut first: Vec<(u64, u32)> = Vec::with_capacity(at.len());
        for t in at {
            let value = if deep.binary_search(&t).is_ok() {
                let w = u128::from(t) << 64;
                let lo = ranges.partition_point(|r| r.0 <= w);
                let hi = ranges.partition_point(|r| top64(r.0) <= t);
                let mut low = vec![(0u64, answer_at(w))];
                low.extend(ranges[lo..hi].iter().map(|r| (low64(r.0), r.1)));
                self.store.build(&low).to_deep()
            } else {
                answer_at(u128::from(t) << 64)
            };
            if first.last().is_none_or(|l| l.1 != value) {
                first.push((t, value));
            }
        }
        first
    }

    /// Rebuilds every tree in bulk from the map.
    fn rebuild(&mut self) {
        let ranges = sweep(0, u128::MAX, UNROUTED, self.iter());
        let old = self.main;
        let first = self.first_stage(&ranges, u128::MAX);
        self.store.release_tree(old);
        self.main = self.store.build(&first);
        self.store.leaves.fit();
        self.store.nodes.fit();
        self.built_leaves = self.store.live_leaves;
    }
}
