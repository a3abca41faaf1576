//! The longest-prefix-match engine: a compressed multibit trie in the manner of Poptrie.
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
//! The lookup arrays live in buffers that a published [`Snapshot`] shares with the
//! table (see `arena.rs`). Once a table has been published, an update never writes what
//! the snapshot can reach: it copies the path from the direct array down to what it
//! changes (each block at most once between two publishes), writes the copies, and
//! releases the old blocks, which [`crate::shared`] reuses only when no reader can still
//! hold a snapshot that reaches them. The direct array is kept in pages, copied on their
//! first write after a publish. So readers and the writer share one copy of everything
//! that did not change. A table that was never published is changed in place.

pub(crate) mod arena;
mod build;
mod lookup;
pub(crate) mod node;
mod update;

pub use lookup::BATCH_GROUP;
pub use node::MAX_VALUE;

use crate::key::Key;
use crate::prefix::Prefix;
use arena::{Arena, Fresh, NodeCell, PAGE_BITS};
use node::{
    decode, BlockAlloc, Node, NodeAux, ENTRY_INDEX, NODE_FLAG, RECORD_FLAG, RECORD_HEADER,
    WIDE_FLAG,
};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Grow the direct array when the table holds more routes than this.
const GROW_AT: usize = 16 * 1024;
/// Shrink it again when the table holds fewer routes than this.
const SHRINK_AT: usize = 4 * 1024;

/// A map from prefixes of one address family to values, with longest-prefix lookups.
///
/// Values are route or nexthop indices up to [`MAX_VALUE`]. See the module documentation
/// for how it works.
///
/// ```
/// use fibre_lpm::{Lpm, Prefix};
/// let mut t: Lpm<u32> = Lpm::new();
/// t.insert("10.0.0.0/8".parse().unwrap(), 1);
/// t.insert("10.1.0.0/16".parse().unwrap(), 2);
/// assert_eq!(t.lookup(0x0A01_0203), Some(2)); // 10.1.2.3
/// assert_eq!(t.lookup(0x0A02_0000), Some(1)); // 10.2.0.0
/// assert_eq!(t.lookup(0x0B00_0000), None);
/// ```
#[derive(Debug)]
pub struct Lpm<K: Key> {
    direct_bits: u8,
    /// The direct-pointing array, in pages of 256 entries: page `p` of the array is block
    /// `page_table[p]` of `direct`. Per entry: a stored
    /// leaf value, `NODE_FLAG | node index`, or, for a node without children,
    /// `NODE_FLAG | RECORD_FLAG | offset of its leaf record`.
    page_table: Vec<u32>,
    direct: Arena<AtomicU32>,
    nodes: Arena<NodeCell>,
    leaves: Arena<AtomicU32>,
    // ---- update side: never read by lookups ----
    /// Pages of `direct` free for reuse.
    free_pages: Vec<u32>,
    fresh_pages: Fresh,
    /// Per direct entry: 1 + length of the prefix that owns it, 0 if none.
    direct_owner: Vec<u8>,
    /// Prefixes of at most `direct_bits` bits.
    direct_prefixes: HashMap<Prefix<K>, u32>,
    /// The root node of each direct entry that refers to a wide root's children.
    wide_roots: HashMap<usize, u32>,
    /// Beside `nodes`, index for index.
    aux: Vec<NodeAux>,
    node_alloc: BlockAlloc,
    leaf_alloc: BlockAlloc,
    count_by_len: Vec<usize>,
    len: usize,
    /// Nodes and leaves allocated since the last publish (all of them before the first).
    fresh_nodes: Fresh,
    fresh_leaves: Fresh,
    /// Blocks released since the last publish that a published snapshot may still reach.
    released: Vec<Block>,
    /// Names these arrays, so blocks released from others are never freed into them.
    generation: u64,
    _key: PhantomData<fn() -> K>,
}

/// A block of one of the arrays: `(is a leaf block, base, size)`.
type Block = (Array, u32, u32);

/// The arrays blocks are released from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Array {
    Nodes,
    Leaves,
    /// A page of the direct array (base: its page number; size: 1).
    Pages,
}

/// Blocks a table released before a publish, to be freed into it once no reader can
/// reach them (see [`crate::shared`]).
#[derive(Debug, Default)]
pub struct Released {
    generation: u64,
    blocks: Vec<Block>,
}

pub(crate) fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What lookups read, borrowed from a table or a snapshot.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    direct_bits: u32,
    page_table: &'a [u32],
    direct: &'a [AtomicU32],
    nodes: &'a [NodeCell],
    leaves: &'a [AtomicU32],
}

/// One published version of a table: everything lookups need, nothing updates need.
///
/// Readers get one from [`crate::LpmReader::read`]; it shares every part that has not
/// changed since with the writer's table and with other snapshots.
pub struct Snapshot<K: Key> {
    direct_bits: u8,
    page_table: Box<[u32]>,
    direct: Arc<[AtomicU32]>,
    nodes: Arc<[NodeCell]>,
    leaves: Arc<[AtomicU32]>,
    len: usize,
    _key: PhantomData<fn() -> K>,
}

impl<K: Key> Snapshot<K> {
    #[inline(always)]
    pub(crate) fn view(&self) -> View<'_> {
        View {
            direct_bits: u32::from(self.direct_bits),
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

    /// True if this version holds no prefix.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<K: Key> std::fmt::Debug for Snapshot<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("family", &K::FAMILY)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<K: Key> Clone for Lpm<K> {
    /// A private copy: its own arrays, never published.
    fn clone(&self) -> Self {
        let mut node_alloc = self.node_alloc.clone();
        let mut leaf_alloc = self.leaf_alloc.clone();
        let mut free_pages = self.free_pages.clone();
        // Blocks waiting for readers of the original are simply free in the copy.
        for &(array, base, size) in &self.released {
            match array {
                Array::Nodes => node_alloc.free(base, size),
                Array::Leaves => leaf_alloc.free(base, size),
                Array::Pages => free_pages.push(base),
            }
        }
        Lpm {
            direct_bits: self.direct_bits,
            page_table: self.page_table.clone(),
            direct: self.direct.deep_clone(),
            free_pages,
            fresh_pages: Fresh::default(),
            nodes: self.nodes.deep_clone(),
            leaves: self.leaves.deep_clone(),
            direct_owner: self.direct_owner.clone(),
            direct_prefixes: self.direct_prefixes.clone(),
            wide_roots: self.wide_roots.clone(),
            aux: self.aux.clone(),
            node_alloc,
            leaf_alloc,
            count_by_len: self.count_by_len.clone(),
            len: self.len,
            fresh_nodes: Fresh::default(),
            fresh_leaves: Fresh::default(),
            released: Vec::new(),
            generation: next_generation(),
            _key: PhantomData,
        }
    }
}

/// Bytes used by a table, by purpose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes that lookups read: the direct array, nodes and leaves (free blocks included).
    pub lookup_bytes: usize,
    /// Bytes only updates use: prefixes per level, ownership, inherited values, free lists.
    pub update_bytes: usize,
    /// Nodes in the node array (free ones included).
    pub nodes: usize,
    /// Leaves in the leaf array (free ones included).
    pub leaves: usize,
    /// Nodes and leaves sitting in free blocks.
    pub free_slots: usize,
}

impl<K: Key> Default for Lpm<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key> Lpm<K> {
    /// An empty table (about a kilobyte).
    pub fn new() -> Self {
        Self::with_direct_bits(K::SMALL_DIRECT_BITS)
    }

    fn with_direct_bits(direct_bits: u8) -> Self {
        let entries = 1usize << direct_bits;
        let pages = (entries >> PAGE_BITS) as u32;
        let mut direct = Arena::default();
        direct.extend(pages << PAGE_BITS); // new cells hold 0, which is NO_ROUTE
        Lpm {
            direct_bits,
            page_table: (0..pages).collect(),
            direct,
            free_pages: Vec::new(),
            fresh_pages: Fresh::default(),
            nodes: Arena::default(),
            leaves: Arena::default(),
            direct_owner: vec![0; entries],
            direct_prefixes: HashMap::new(),
            wide_roots: HashMap::new(),
            aux: Vec::new(),
            node_alloc: BlockAlloc::default(),
            leaf_alloc: BlockAlloc::default(),
            count_by_len: vec![0; usize::from(K::BITS) + 1],
            len: 0,
            fresh_nodes: Fresh::default(),
            fresh_leaves: Fresh::default(),
            released: Vec::new(),
            generation: next_generation(),
            _key: PhantomData,
        }
    }

    #[inline(always)]
    pub(crate) fn view(&self) -> View<'_> {
        View {
            direct_bits: u32::from(self.direct_bits),
            page_table: &self.page_table,
            direct: self.direct.buffer(),
            nodes: self.nodes.buffer(),
            leaves: self.leaves.buffer(),
        }
    }

    /// This table as readers will see it: a snapshot sharing its arrays. The table copies
    /// what it changes from now on.
    pub(crate) fn publish(&mut self) -> (Snapshot<K>, Released) {
        self.fresh_nodes.clear();
        self.fresh_leaves.clear();
        self.fresh_pages.clear();
        let snapshot = Snapshot {
            direct_bits: self.direct_bits,
            page_table: self.page_table.as_slice().into(),
            direct: self.direct.buffer().clone(),
            nodes: self.nodes.buffer().clone(),
            leaves: self.leaves.buffer().clone(),
            len: self.len,
            _key: PhantomData,
        };
        let released = Released {
            generation: self.generation,
            blocks: std::mem::take(&mut self.released),
        };
        (snapshot, released)
    }

    /// Nodes and leaves, and pages, in blocks released from this table's arrays (tests).
    #[cfg(test)]
    pub(crate) fn slots_of(&self, released: &Released) -> (usize, usize) {
        if released.generation != self.generation {
            return (0, 0);
        }
        let pages = released.blocks.iter().filter(|b| b.0 == Array::Pages);
        let slots = released.blocks.iter().filter(|b| b.0 != Array::Pages);
        (slots.map(|b| b.2 as usize).sum(), pages.count())
    }

    /// Frees blocks released before a publish, once no reader can reach them.
    pub(crate) fn reclaim(&mut self, released: Released) {
        if released.generation != self.generation {
            return; // released from arrays this table has since replaced
        }
        for (array, base, size) in released.blocks {
            match array {
                Array::Nodes => self.node_alloc.free(base, size),
                Array::Leaves => self.leaf_alloc.free(base, size),
                Array::Pages => self.free_pages.push(base),
            }
        }
    }

    /// Where direct entry `e` is in `direct`.
    #[inline]
    fn entry_index(&self, e: usize) -> u32 {
        self.page_table[e >> PAGE_BITS] << PAGE_BITS | (e as u32 & ((1 << PAGE_BITS) - 1))
    }

    /// Direct entry `e`.
    #[inline]
    fn entry(&self, e: usize) -> u32 {
        self.direct.get(self.entry_index(e))
    }

    /// Sets direct entry `e`, first copying its page if a snapshot may hold it.
    fn set_entry(&mut self, e: usize, value: u32) {
        let page = self.page_table[e >> PAGE_BITS];
        if !self.fresh_pages.contains(page) {
            let copy = match self.free_pages.pop() {
                Some(p) => p,
                None => self.direct.extend(1 << PAGE_BITS) >> PAGE_BITS,
            };
            for i in 0..1 << PAGE_BITS {
                let v = self.direct.get(page << PAGE_BITS | i);
                self.direct.set(copy << PAGE_BITS | i, v);
            }
            self.fresh_pages.mark(copy, 1);
            self.page_table[e >> PAGE_BITS] = copy;
            self.released.push((Array::Pages, page, 1));
        }
        self.direct.set(self.entry_index(e), value);
    }

    #[inline]
    fn node(&self, n: u32) -> Node {
        self.nodes.get(n)
    }

    /// Writes node `n` (fresh: see the module documentation).
    fn set_node(&mut self, n: u32, node: Node) {
        debug_assert!(self.fresh_nodes.contains(n), "node {n} is published");
        self.nodes.set(n, node);
    }

    #[inline]
    fn leaf(&self, i: u32) -> u32 {
        self.leaves.get(i)
    }

    /// A block of `size` nodes, fresh.
    fn alloc_nodes(&mut self, size: u32) -> u32 {
        let base = match self.node_alloc.reuse(size) {
            Some(b) => b,
            None => {
                let b = self.nodes.extend(size);
                self.aux.resize_with(self.nodes.len(), NodeAux::default);
                b
            }
        };
        self.fresh_nodes.mark(base, size);
        base
    }

    /// A block of `size` leaves, fresh.
    fn alloc_leaves(&mut self, size: u32) -> u32 {
        let base = self
            .leaf_alloc
            .reuse(size)
            .unwrap_or_else(|| self.leaves.extend(size));
        self.fresh_leaves.mark(base, size);
        base
    }

    /// Gives back a block of nodes: free now if no snapshot has seen it, later otherwise.
    fn release_nodes(&mut self, base: u32, size: u32) {
        if self.fresh_nodes.contains(base) {
            self.node_alloc.free(base, size);
        } else {
            self.released.push((Array::Nodes, base, size));
        }
    }

    /// Gives back a block of leaves, as [`Lpm::release_nodes`] does.
    fn release_leaves(&mut self, base: u32, size: u32) {
        if self.fresh_leaves.contains(base) {
            self.leaf_alloc.free(base, size);
        } else {
            self.released.push((Array::Leaves, base, size));
        }
    }

    /// Number of prefixes in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the table holds no prefix.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of prefixes of each length, indexed by length (`0..=32` or `0..=128`).
    pub fn count_by_len(&self) -> &[usize] {
        &self.count_by_len
    }

    /// Bits resolved by the direct-pointing array.
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
        let i = prefixes.binary_search_by_key(&art, |e| e.0).ok()?;
        decode(prefixes[i].1)
    }

    /// True if exactly `prefix` is in the table.
    pub fn contains(&self, prefix: &Prefix<K>) -> bool {
        self.get(prefix).is_some()
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

    /// Iterates over all prefixes and values, sorted by address, then length.
    pub fn iter(&self) -> impl Iterator<Item = (Prefix<K>, u32)> {
        self.to_vec().into_iter()
    }

    fn collect(&self, n: u32, key: K, depth: u32, out: &mut Vec<(Prefix<K>, u32)>) {
        let aux = &self.aux[n as usize];
        for &(art, stored) in &aux.prefixes {
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
            n = node.child_base + (node.children & (bit - 1)).count_ones();
            depth += 6;
        }
        Some((n, art_index(key, depth, len)))
    }

    /// Bytes used, by purpose.
    pub fn memory(&self) -> MemoryUsage {
        use std::mem::size_of;
        let lookup_bytes = self.page_table.len() * 4
            + self.direct.len() * 4
            + self.nodes.len() * size_of::<NodeCell>()
            + self.leaves.len() * 4;
        let prefix_bytes: usize = self
            .aux
            .iter()
            .map(|a| a.prefixes.capacity() * size_of::<(u8, u32)>())
            .sum();
        // A hash map entry costs its key and value plus one control byte.
        let map_bytes = self.direct_prefixes.capacity() * (size_of::<(Prefix<K>, u32)>() + 1)
            + self.wide_roots.capacity() * (size_of::<(usize, u32)>() + 1);
        let update_bytes = self.direct_owner.len()
            + self.aux.len() * size_of::<NodeAux>()
            + prefix_bytes
            + map_bytes
            + self.node_alloc.bytes()
            + self.leaf_alloc.bytes()
            + self.fresh_nodes.bytes()
            + self.fresh_leaves.bytes()
            + self.released.capacity() * size_of::<Block>()
            + self.free_pages.capacity() * 4
            + self.fresh_pages.bytes()
            + self.count_by_len.len() * size_of::<usize>();
        MemoryUsage {
            lookup_bytes,
            update_bytes,
            nodes: self.nodes.len(),
            leaves: self.leaves.len(),
            free_slots: self.node_alloc.free_slots() + self.leaf_alloc.free_slots(),
        }
    }

    /// Rebuilds the table in fresh, tightly packed arrays (the same prefixes and values).
    pub fn compact(&mut self) {
        *self = Self::build_with_direct_bits(self.to_vec(), self.direct_bits);
    }

    /// Removes every prefix.
    pub fn clear(&mut self) {
        *self = Self::new();
    }
}

impl<K: Key> Lpm<K> {
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
