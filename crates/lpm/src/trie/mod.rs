//! The trie: longest-prefix match by a compressed multibit trie in the manner of Poptrie.
//!
//! # The structure
//!
//! A key is read from its most significant bit. The first `D` bits (the *direct bits*:
//! 18 for a large table of either family, 8 for small tables) index the
//! *direct-pointing array*: each entry either holds the answer for every key that starts
//! with those bits (a leaf), or refers to a node.
//!
//! A node resolves the next six bits: it has 64 slots. Slots that lead deeper are
//! *children*; the others are *leaves* holding the answer. A node does not store 64
//! entries: a 64-bit map marks which slots are children, and the children sit side by
//! side in the node array, so child `s` is found at `child_base + popcount(children
//! below s)`. Neighbouring leaf slots usually hold the same answer, so a second map marks
//! where each run of equal leaves starts, and only one leaf per run is stored. A node is
//! 24 bytes; a leaf is 4.
//!
//! Every leaf holds the complete answer for its slot ("leaf pushing"): the longest prefix
//! covering the slot, wherever in the trie that prefix lives. A lookup therefore reads one
//! direct entry, then one node per six bits until it meets a leaf slot, then one leaf,
//! and never backtracks. IPv4 and IPv6 run the same code; only the key width differs.
//!
//! ```text
//!   key:  [ D direct bits ][ 6 ][ 6 ][ 6 ] ...
//!            |
//!   direct[ ]--> node { children: 0b..1..1.., leafvec: 0b1..1...1, child_base, leaf_base }
//!                        |                       |
//!                 nodes[child_base + rank]   leaves[leaf_base + rank - 1]
//! ```
//!
//! Two shortcuts save reads where the first level leads. A node hanging from the direct
//! array (a *root*) without children keeps its maps in a *leaf record* just before its
//! leaves, and the direct entry points at the record: one read instead of two. A root
//! most of whose slots lead deeper (8 or more children holding something) is *wide*: it
//! gets all 64 children, so child `s` is simply `child_base + s`, and the direct entry
//! points at the children; a lookup never reads the root. Dense regions thus get a
//! 24-bit first level: IPv6 /48s under busy /18s take four node reads instead of five.
//!
//! # Updates
//!
//! Beside the lookup arrays sits what updates need and lookups never read: the prefixes
//! that end at each level (per direct entry, the length of the prefix that owns it; per
//! node, the prefixes ending in its six bits and the value it inherits from above). A
//! change to one prefix touches only the node where the prefix ends: its slots are
//! recomputed, and where a covered slot is a child, the new inherited value is pushed
//! down into that subtree. Prefixes of at most `D` bits are painted onto the direct array
//! the way DIR-24-8 does it: an entry is overwritten only if it is owned by a prefix no
//! longer than the new one. Nodes are created on the way down when a longer prefix
//! arrives and removed on the way up when they no longer hold anything.
//!
//! The table switches between small and large direct arrays as it grows and shrinks, so
//! an empty table costs about a kilobyte and a full one gets a wide first level.
//!
//! # Sharing with readers
//!
//! The lookup arrays live in buffers that a published snapshot shares with the table
//! (see [`crate::memory`]). Once a table has been published, an update never writes what
//! the snapshot can reach: it copies the path from the direct array down to what it
//! changes (each block at most once between two publishes), writes the copies, and
//! releases the old blocks, which [`mod@crate::shared`] reuses only when no reader can still
//! hold a snapshot that reaches them. The direct array is kept in pages, copied on their
//! first write after a publish. So readers and the writer share one copy of everything
//! that did not change. A table that was never published is changed in place.

mod build;
mod lookup;
pub(crate) mod node;
mod removals;
mod update;

use lookup::TrieView;

use crate::form::{Popcount, Portable, Runnable};
use crate::key::Key;
use crate::memory::{Blocks, Released};
use crate::prefix::Prefix;
use crate::MemoryUsage;
use node::{
    decode, Ended, Node, NodeAux, NodeCell, ENTRY_INDEX, NODE_FLAG, RECORD_FLAG, RECORD_HEADER,
    WIDE_FLAG,
};
use std::collections::HashMap;

/// The hasher of the update side's maps.
type Fold = foldhash::fast::RandomState;
use std::marker::PhantomData;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

/// Bits resolved by the direct-pointing array of a small table (either family).
const SMALL_DIRECT_BITS: u8 = 8;
/// Bits resolved by the direct-pointing array of a large table (either family).
pub(crate) const LARGE_DIRECT_BITS: u8 = 18;
/// Grow the direct array when the table holds more routes than this.
const GROW_AT: usize = 16 * 1024;
/// Shrink it again when the table holds fewer routes than this.
const SHRINK_AT: usize = 4 * 1024;
/// Entries in a page of the direct array: `1 << PAGE_BITS`.
const PAGE_BITS: u32 = 8;
/// Entries in a page of the direct array.
const PAGE: u32 = 1 << PAGE_BITS;

/// A map from prefixes of one address family to values, with longest-prefix lookups by
/// the trie described in the module documentation.
pub(crate) struct Trie<K: Key> {
    direct_bits: u8,
    /// The instructions lookups use.
    form: Runnable,
    /// The direct-pointing array, in pages of 256 entries: page `p` of the array is the
    /// block at `page_table[p] << PAGE_BITS` of `direct`. Per entry: a stored leaf value,
    /// `NODE_FLAG | node index`, `NODE_FLAG | WIDE_FLAG | children's index` for a wide
    /// root, or, for a root without children, `NODE_FLAG | RECORD_FLAG | offset of its
    /// leaf record`.
    page_table: Vec<u32>,
    direct: Blocks<AtomicU32>,
    nodes: Blocks<NodeCell>,
    leaves: Blocks<AtomicU32>,
    // ---- update side: never read by lookups ----
    /// Per direct entry: 1 + length of the prefix that owns it, 0 if none.
    direct_owner: Vec<u8>,
    /// Prefixes of at most `direct_bits` bits.
    /// (Hashed by `foldhash`: a patch looks up each length above a prefix here, and the
    /// standard SipHash took a tenth of a link's thousand routes patched.)
    direct_prefixes: HashMap<Prefix<K>, u32, Fold>,
    /// The root node of each direct entry that refers to a wide root's children.
    wide_roots: HashMap<usize, u32, Fold>,
    /// Beside `nodes`, index for index.
    aux: Vec<NodeAux>,
    count_by_len: Vec<usize>,
    len: usize,
    _key: PhantomData<fn() -> K>,
}

/// Blocks a trie released before a publish, to be freed into it once no reader can
/// reach them (see [`mod@crate::shared`]).
#[derive(Debug)]
pub(crate) struct TrieReleased {
    direct: Released,
    nodes: Released,
    leaves: Released,
}

/// One published version of a trie: everything lookups need, nothing updates need. It
/// shares every part that has not changed since with the writer's table and with other
/// snapshots.
pub(crate) struct TrieSnapshot<K: Key> {
    direct_bits: u8,
    form: Runnable,
    page_table: Box<[u32]>,
    direct: Arc<[AtomicU32]>,
    nodes: Arc<[NodeCell]>,
    leaves: Arc<[AtomicU32]>,
    len: usize,
    _key: PhantomData<fn() -> K>,
}

impl<K: Key> TrieSnapshot<K> {
    #[inline(always)]
    pub(crate) fn view(&self) -> TrieView<'_> {
        TrieView {
            direct_bits: u32::from(self.direct_bits),
            form: self.form,
            page_table: &self.page_table,
            direct: &self.direct,
            nodes: &self.nodes,
            leaves: &self.leaves,
        }
    }

    /// Number of prefixes in this version.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The instructions lookups use.
    pub fn form(&self) -> Runnable {
        self.form
    }
}

impl<K: Key> std::fmt::Debug for TrieSnapshot<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrieSnapshot")
            .field("family", &K::FAMILY)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<K: Key> Clone for Trie<K> {
    /// A private copy, never published: the same arrays copied as they are (blocks the
    /// original keeps for its readers are free in the copy; see [`Blocks::duplicate`]).
    /// A copy rather than a build: the full IPv4 table's trie copies in a fraction of
    /// the 140 ms a build of its prefixes takes.
    fn clone(&self) -> Self {
        Trie {
            direct_bits: self.direct_bits,
            form: self.form,
            page_table: self.page_table.clone(),
            direct: self.direct.duplicate(),
            nodes: self.nodes.duplicate(),
            leaves: self.leaves.duplicate(),
            direct_owner: self.direct_owner.clone(),
            direct_prefixes: self.direct_prefixes.clone(),
            wide_roots: self.wide_roots.clone(),
            aux: self.aux.clone(),
            count_by_len: self.count_by_len.clone(),
            len: self.len,
            _key: PhantomData,
        }
    }
}

impl<K: Key> std::fmt::Debug for Trie<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trie")
            .field("family", &K::FAMILY)
            .field("len", &self.len)
            .field("form", &self.form.form())
            .field("direct_bits", &self.direct_bits)
            .finish_non_exhaustive()
    }
}

impl<K: Key> Default for Trie<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key> Trie<K> {
    /// An empty table (about a kilobyte), its lookups in the fastest form this CPU runs.
    pub fn new() -> Self {
        Self::with_direct_bits(SMALL_DIRECT_BITS, Runnable::best())
    }

    fn with_direct_bits(direct_bits: u8, form: Runnable) -> Self {
        let entries = 1usize << direct_bits;
        let mut direct = Blocks::default();
        // New cells hold 0, which is no route.
        let page_table = (0..entries >> PAGE_BITS)
            .map(|_| direct.alloc(PAGE) >> PAGE_BITS)
            .collect();
        Trie {
            direct_bits,
            form,
            page_table,
            direct,
            nodes: Blocks::default(),
            leaves: Blocks::default(),
            direct_owner: vec![0; entries],
            direct_prefixes: HashMap::default(),
            wide_roots: HashMap::default(),
            aux: Vec::new(),
            count_by_len: vec![0; usize::from(K::BITS) + 1],
            len: 0,
            _key: PhantomData,
        }
    }

    /// The instructions lookups use.
    pub fn form(&self) -> Runnable {
        self.form
    }

    /// The bits set in `x`, counted by `POPCNT` where the form proves the CPU has it:
    /// updates count bits at every node they touch, and software popcounts measured
    /// 15-25% off the trie's update rates.
    #[inline(always)]
    fn ones(&self, x: u64) -> u32 {
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = self.form.avx2() {
            return cpu.count(x);
        }
        Portable.count(x)
    }

    /// Makes lookups (of this table and of its next snapshots) use `form`.
    pub fn set_form(&mut self, form: Runnable) {
        self.form = form;
    }

    #[inline(always)]
    pub(crate) fn view(&self) -> TrieView<'_> {
        TrieView {
            direct_bits: u32::from(self.direct_bits),
            form: self.form,
            page_table: &self.page_table,
            direct: self.direct.buffer(),
            nodes: self.nodes.buffer(),
            leaves: self.leaves.buffer(),
        }
    }

    /// This table as readers will see it: a snapshot sharing its arrays, and what was
    /// released since the last publish. The table copies what it changes from now on.
    pub(crate) fn publish(&mut self) -> (TrieSnapshot<K>, TrieReleased) {
        let released = TrieReleased {
            direct: self.direct.publish(),
            nodes: self.nodes.publish(),
            leaves: self.leaves.publish(),
        };
        let snapshot = TrieSnapshot {
            direct_bits: self.direct_bits,
            form: self.form,
            page_table: self.page_table.as_slice().into(),
            direct: self.direct.buffer().clone(),
            nodes: self.nodes.buffer().clone(),
            leaves: self.leaves.buffer().clone(),
            len: self.len,
            _key: PhantomData,
        };
        (snapshot, released)
    }

    /// Frees what a publish released, now that no reader can reach it.
    pub(crate) fn reclaim(&mut self, released: TrieReleased) {
        self.direct.reclaim(released.direct);
        self.nodes.reclaim(released.nodes);
        self.leaves.reclaim(released.leaves);
    }

    /// Nodes and leaves, and pages, in blocks of this table's arrays that a publish
    /// released (tests).
    #[cfg(test)]
    pub(crate) fn slots_of(&self, released: &TrieReleased) -> (usize, usize) {
        (
            released.nodes.slots_in(&self.nodes) + released.leaves.slots_in(&self.leaves),
            released.direct.slots_in(&self.direct) / PAGE as usize,
        )
    }

    /// Where direct entry `e` is in `direct`.
    #[inline]
    fn entry_index(&self, e: usize) -> u32 {
        self.page_table[e >> PAGE_BITS] << PAGE_BITS | (e as u32 & (PAGE - 1))
    }

    /// Direct entry `e`.
    #[inline]
    fn entry(&self, e: usize) -> u32 {
        self.direct.get(self.entry_index(e))
    }

    /// Sets direct entry `e`, first copying its page if a snapshot may hold it.
    fn set_entry(&mut self, e: usize, value: u32) {
        let page = self.page_table[e >> PAGE_BITS];
        if !self.direct.is_fresh(page << PAGE_BITS) {
            let copy = self.direct.alloc(PAGE);
            self.direct.copy(page << PAGE_BITS, copy, PAGE);
            self.direct.release(page << PAGE_BITS, PAGE);
            self.page_table[e >> PAGE_BITS] = copy >> PAGE_BITS;
        }
        self.direct.set(self.entry_index(e), value);
    }

    #[inline]
    fn node(&self, n: u32) -> Node {
        self.nodes.get(n)
    }

    /// Writes node `n` (fresh: see the module documentation).
    fn set_node(&mut self, n: u32, node: Node) {
        self.nodes.set(n, node);
    }

    #[inline]
    fn leaf(&self, i: u32) -> u32 {
        self.leaves.get(i)
    }

    /// A block of `size` nodes, fresh.
    fn alloc_nodes(&mut self, size: u32) -> u32 {
        let base = self.nodes.alloc(size);
        if self.aux.len() < self.nodes.len() {
            self.aux.resize_with(self.nodes.len(), NodeAux::default);
        }
        base
    }

    /// A block of `size` leaves, fresh.
    fn alloc_leaves(&mut self, size: u32) -> u32 {
        self.leaves.alloc(size)
    }

    /// Gives back a block of nodes: free now if no snapshot has seen it, later otherwise.
    fn release_nodes(&mut self, base: u32, size: u32) {
        self.nodes.release(base, size);
    }

    /// Gives back a block of leaves, as [`Trie::release_nodes`] does.
    fn release_leaves(&mut self, base: u32, size: u32) {
        self.leaves.release(base, size);
    }

    /// Number of prefixes in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Number of prefixes of each length, indexed by length (`0..=32` or `0..=128`).
    pub fn count_by_len(&self) -> &[usize] {
        &self.count_by_len
    }

    /// Bits resolved by the direct-pointing array.
    #[cfg(test)]
    pub fn direct_bits(&self) -> u8 {
        self.direct_bits
    }

    /// The value stored for exactly `prefix` (not a longest-prefix match).
    pub fn get(&self, prefix: &Prefix<K>) -> Option<u32> {
        if prefix.len() <= self.direct_bits {
            return self.direct_prefixes.get(prefix).copied();
        }
        let (node, art) = self.find_node(prefix)?;
        let prefixes = &self.aux[node as usize].prefixes;
        let i = prefixes.binary_search_by_key(&art, |e| e.art).ok()?;
        decode(prefixes[i].stored())
    }

    /// All prefixes and their values, sorted by address, then length.
    pub fn to_vec(&self) -> Vec<(Prefix<K>, u32)> {
        let mut out = Vec::with_capacity(self.len);
        out.extend(self.direct_prefixes.iter().map(|(p, v)| (*p, *v)));
        let d = u32::from(self.direct_bits);
        for e in 0..1usize << self.direct_bits {
            if let Some(n) = self.root_node(e) {
                let key = K::default().deposit(0, d, e as u32);
                self.collect(n, key, d, &mut out);
            }
        }
        out.sort_unstable();
        out
    }

    fn collect(&self, n: u32, key: K, depth: u32, out: &mut Vec<(Prefix<K>, u32)>) {
        let aux = &self.aux[n as usize];
        for e in &aux.prefixes {
            let (art, stored) = (e.art, e.stored());
            let rel = 7 - art.leading_zeros();
            let bits = u32::from(art) ^ (1 << rel);
            let p = Prefix::new_clamped(key.deposit(depth, rel, bits), (depth + rel) as u8);
            out.push((p, decode(stored).expect("stored prefixes have values")));
        }
        let node = self.node(n);
        let mut children = node.children;
        let mut child = node.child_base;
        while children != 0 {
            let slot = children.trailing_zeros();
            self.collect(child, key.deposit(depth, 6, slot), depth + 6, out);
            child += 1;
            children &= children - 1;
        }
    }

    /// The node where `prefix` (longer than the direct bits) ends, and its ART index there.
    fn find_node(&self, prefix: &Prefix<K>) -> Option<(u32, u8)> {
        let d = u32::from(self.direct_bits);
        let len = u32::from(prefix.len());
        let key = prefix.addr();
        let mut n = self.root_node(key.bits(0, d) as usize)?;
        let mut depth = d;
        while len > depth + 6 {
            let node = self.node(n);
            let bit = 1u64 << key.bits(depth, 6);
            if node.children & bit == 0 {
                return None;
            }
            n = node.child_base + self.ones(node.children & (bit - 1));
            depth += 6;
        }
        Some((n, art_index(key, depth, len)))
    }

    /// Bytes used, by purpose.
    pub fn memory(&self) -> MemoryUsage {
        use std::mem::size_of;
        let lookup_bytes = self.page_table.len() * 4
            + self.direct.lookup_bytes()
            + self.nodes.lookup_bytes()
            + self.leaves.lookup_bytes();
        let prefix_bytes: usize = self
            .aux
            .iter()
            .map(|a| a.prefixes.len() * size_of::<Ended>())
            .sum();
        // A hash map entry costs its key and value plus one control byte.
        let map_bytes = self.direct_prefixes.capacity() * (size_of::<(Prefix<K>, u32)>() + 1)
            + self.wide_roots.capacity() * (size_of::<(usize, u32)>() + 1);
        let update_bytes = self.direct_owner.len()
            + self.aux.len() * size_of::<NodeAux>()
            + prefix_bytes
            + map_bytes
            + self.direct.update_bytes()
            + self.nodes.update_bytes()
            + self.leaves.update_bytes()
            + self.count_by_len.len() * size_of::<usize>();
        MemoryUsage {
            lookup_bytes,
            update_bytes,
            nodes: self.nodes.len(),
            leaves: self.leaves.len(),
            free_slots: self.nodes.free_slots() + self.leaves.free_slots(),
        }
    }

    /// Rebuilds the table in fresh, tightly packed arrays (the same prefixes, values and
    /// form).
    pub fn compact(&mut self) {
        *self = Self::build_with_direct_bits(self.to_vec(), self.direct_bits, self.form);
    }

    /// Removes every prefix (the form stays).
    pub fn clear(&mut self) {
        *self = Self::with_direct_bits(SMALL_DIRECT_BITS, self.form);
    }
}

impl<K: Key> Trie<K> {
    /// The node hanging from direct entry `e`, if any.
    fn root_node(&self, e: usize) -> Option<u32> {
        let entry = self.entry(e);
        if entry & NODE_FLAG == 0 {
            None
        } else if entry & RECORD_FLAG != 0 {
            Some(self.leaf((entry & ENTRY_INDEX) + 2))
        } else if entry & WIDE_FLAG != 0 {
            Some(self.wide_roots[&e])
        } else {
            Some(entry & ENTRY_INDEX)
        }
    }

    /// True if node `n` is a root whose 64 slots are all children.
    fn is_wide(&self, n: u32) -> bool {
        self.aux[n as usize].root && self.node(n).children == u64::MAX
    }

    /// Points direct entry `e` at root `n`: at its leaf record when it has no children, at
    /// its children when it is wide.
    fn refresh_direct(&mut self, e: usize, n: u32) {
        let node = self.node(n);
        let entry = if node.children == 0 {
            NODE_FLAG | RECORD_FLAG | (node.leaf_base - RECORD_HEADER)
        } else if node.children == u64::MAX {
            NODE_FLAG | WIDE_FLAG | node.child_base
        } else {
            NODE_FLAG | n
        };
        if node.children == u64::MAX {
            self.wide_roots.insert(e, n);
        } else {
            self.wide_roots.remove(&e);
        }
        if self.entry(e) != entry {
            self.set_entry(e, entry);
        }
    }
}

/// The ART index of the prefix of length `len` of `key` within the node at `depth`:
/// `1 << rel | rel_bits`, where `rel = len - depth` is 1..=6.
#[inline]
fn art_index<K: Key>(key: K, depth: u32, len: u32) -> u8 {
    let rel = len - depth;
    debug_assert!((1..=6).contains(&rel));
    ((1u32 << rel) | key.bits(depth, rel)) as u8
}

#[cfg(test)]
mod tests;
