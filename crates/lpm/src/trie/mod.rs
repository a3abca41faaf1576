//! The longest-prefix-match engine: a compressed multibit trie in the manner of Poptrie.
//!
//! # The structure
//!
//! A key is read from its most significant bit. The first `D` bits (the *direct bits*:
//! 18 for a large IPv4 table, 16 for a large IPv6 one, 8 for small tables) index the
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
//! The engine itself is single-threaded; [`crate::shared`] gives it lock-free readers.

mod build;
mod lookup;
pub(crate) mod node;
mod update;

pub use lookup::BATCH_GROUP;
pub use node::MAX_VALUE;

use crate::key::Key;
use crate::prefix::Prefix;
use node::{decode, BlockAlloc, Node, NodeAux, ENTRY_INDEX, NODE_FLAG, RECORD_FLAG, RECORD_HEADER};
use std::collections::HashMap;

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
#[derive(Clone, Debug)]
pub struct Lpm<K: Key> {
    direct_bits: u8,
    /// Per entry: a stored leaf value, `NODE_FLAG | node index`, or, for a node without
    /// children, `NODE_FLAG | RECORD_FLAG | offset of its leaf record`.
    direct: Vec<u32>,
    nodes: Vec<Node>,
    leaves: Vec<u32>,
    // ---- update side: never read by lookups ----
    /// Per direct entry: 1 + length of the prefix that owns it, 0 if none.
    direct_owner: Vec<u8>,
    /// Prefixes of at most `direct_bits` bits.
    direct_prefixes: HashMap<Prefix<K>, u32>,
    /// Beside `nodes`, index for index.
    aux: Vec<NodeAux>,
    node_alloc: BlockAlloc,
    leaf_alloc: BlockAlloc,
    count_by_len: Vec<usize>,
    len: usize,
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
        Lpm {
            direct_bits,
            direct: vec![node::NO_ROUTE; entries],
            nodes: Vec::new(),
            leaves: Vec::new(),
            direct_owner: vec![0; entries],
            direct_prefixes: HashMap::new(),
            aux: Vec::new(),
            node_alloc: BlockAlloc::default(),
            leaf_alloc: BlockAlloc::default(),
            count_by_len: vec![0; usize::from(K::BITS) + 1],
            len: 0,
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
        for e in 0..self.direct.len() {
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
        let node = self.nodes[n as usize];
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
            let node = self.nodes[n as usize];
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
        let lookup_bytes =
            self.direct.len() * 4 + self.nodes.len() * size_of::<Node>() + self.leaves.len() * 4;
        let prefix_bytes: usize = self
            .aux
            .iter()
            .map(|a| a.prefixes.capacity() * size_of::<(u8, u32)>())
            .sum();
        // A hash map entry costs its key and value plus one control byte.
        let map_bytes = self.direct_prefixes.capacity() * (size_of::<(Prefix<K>, u32)>() + 1);
        let update_bytes = self.direct_owner.len()
            + self.aux.len() * size_of::<NodeAux>()
            + prefix_bytes
            + map_bytes
            + self.node_alloc.bytes()
            + self.leaf_alloc.bytes()
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
        let entry = self.direct[e];
        if entry & NODE_FLAG == 0 {
            None
        } else if entry & RECORD_FLAG != 0 {
            Some(self.leaves[(entry & ENTRY_INDEX) as usize + 2])
        } else {
            Some(entry & ENTRY_INDEX)
        }
    }

    /// Points direct entry `e` at root `n`: at its leaf record when it has no children.
    fn refresh_direct(&mut self, e: usize, n: u32) {
        let node = self.nodes[n as usize];
        self.direct[e] = if node.children == 0 {
            NODE_FLAG | RECORD_FLAG | (node.leaf_base - RECORD_HEADER)
        } else {
            NODE_FLAG | n
        };
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
