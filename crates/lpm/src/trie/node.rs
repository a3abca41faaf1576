//! The trie's memory: nodes, leaves and direct entries, and how they are encoded.
//!
//! A node's children are stored side by side in one block of the node array, and its
//! distinct leaves side by side in one block of the leaf array; the node holds only the
//! base index of each block and two 64-bit maps saying which slots are children and where
//! each run of equal leaves begins. A block grows or shrinks by moving to a block of the
//! new size (blocks are handed out by [`crate::memory::Blocks`]).

use crate::form::Popcount;
use crate::memory::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Set in a direct-pointing entry that refers to a node (the rest of the entry is its index).
pub(crate) const NODE_FLAG: u32 = 1 << 31;
/// Set, with `NODE_FLAG`, in a direct-pointing entry that refers to the *leaf record* of a
/// node without children: the rest of the entry is the record's offset in the leaf array.
pub(crate) const RECORD_FLAG: u32 = 1 << 30;
/// Set, with `NODE_FLAG`, in a direct-pointing entry that refers to a *wide root*: a root
/// all of whose 64 slots are children. The rest of the entry is the index of its children
/// block, which the next six bits of the key index directly, so a lookup skips reading the
/// root itself: under a dense root, one level fewer.
pub(crate) const WIDE_FLAG: u32 = 1 << 29;
/// The index or offset part of a direct-pointing entry that refers to a node or record.
pub(crate) const ENTRY_INDEX: u32 = WIDE_FLAG - 1;
/// Words before the leaves of a node that hangs from the direct array (a *root*): the two
/// halves of its `leafvec`, then its node index. So a lookup that reaches a root without
/// children reads the record alone, usually one or two adjacent cache lines, not the
/// node and then a leaf elsewhere.
pub(crate) const RECORD_HEADER: u32 = 3;
/// A leaf or direct entry holding no route: 0, since values are stored plus one.
pub(crate) const EMPTY: u32 = 0;

// Values are stored plus one, and the top bit marks node references (the flags below it
// count only with the top bit): the largest value is two below the flag.
const _: () = assert!(crate::MAX_VALUE == NODE_FLAG - 2);

/// The stored form of a value.
#[inline(always)]
pub(crate) fn encode(value: u32) -> u32 {
    value + 1
}

/// The value of a stored leaf, `None` for no route.
#[inline(always)]
pub(crate) fn decode(stored: u32) -> Option<u32> {
    stored.checked_sub(1)
}

/// A node of the trie: 64 slots, one for each value of the next six bits of the key.
///
/// Slot `s` is a child if bit `s` of `children` is set; the child is then node
/// `child_base + (number of children below s)`. Otherwise slot `s` is a leaf, whose stored
/// value is leaf `leaf_base + (number of bits of leafvec at or below s) - 1`: `leafvec` has
/// a bit where a run of leaf slots with equal values begins (child slots do not break a run).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub children: u64,
    pub leafvec: u64,
    pub child_base: u32,
    pub leaf_base: u32,
}

impl Node {
    /// One step of a lookup at `slot`: whether the slot is a child, the child's index,
    /// and the leaf's index (meaningless when the slot is a child); bits counted by
    /// `popcount`.
    #[inline(always)]
    pub fn step(&self, slot: u32, popcount: impl Popcount) -> (bool, u32, u32) {
        let bit = 1u64 << slot;
        let below = bit - 1;
        let child = self.child_base + popcount.count(self.children & below);
        let leaf = (self.leaf_base + popcount.count(self.leafvec & (bit | below))).wrapping_sub(1);
        (self.children & bit != 0, child, leaf)
    }
}

/// A prefix that ends in a node: its ART index (`1 << rel_len | rel_bits`) and its stored
/// value, in 5 bytes aligned to one (a `(u8, u32)` takes 8): the full IPv4 table's
/// million prefixes so take 5 MB rather than 8 beside its trie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ended {
    /// The ART index.
    pub art: u8,
    stored: [u8; 4],
}

impl Ended {
    /// Prefix `art` with stored value `stored`.
    pub fn new(art: u8, stored: u32) -> Ended {
        Ended {
            art,
            stored: stored.to_ne_bytes(),
        }
    }

    /// The stored value.
    pub fn stored(&self) -> u32 {
        u32::from_ne_bytes(self.stored)
    }
}

/// Update-side data of a node, kept beside it (same index) and never read by lookups.
#[derive(Clone, Default, Debug)]
pub(crate) struct NodeAux {
    /// Stored value every slot has unless a prefix of this node says otherwise: the
    /// longest prefix above this node that covers it.
    pub default: u32,
    /// The prefixes that end in this node (lengths depth+1 ..= depth+6), as
    /// [`Ended`] entries, sorted by ART index so shorter prefixes come first: a boxed
    /// slice of exactly their number (a change makes it anew), 8 bytes less than a
    /// vector a node.
    pub prefixes: Box<[Ended]>,
    /// Hangs from the direct array: its leaf block starts with a record header.
    pub root: bool,
}

/// A [`Node`] in cells: its two maps, then both block bases in one word.
#[derive(Default, Debug)]
#[repr(C)]
pub(crate) struct NodeCell {
    children: AtomicU64,
    leafvec: AtomicU64,
    bases: AtomicU64,
}

impl Cell for NodeCell {
    type Value = Node;
    #[inline(always)]
    fn read(&self) -> Node {
        let bases = self.bases.load(Relaxed);
        Node {
            children: self.children.load(Relaxed),
            leafvec: self.leafvec.load(Relaxed),
            child_base: bases as u32,
            leaf_base: (bases >> 32) as u32,
        }
    }
    #[inline(always)]
    fn write(&self, n: Node) {
        self.children.store(n.children, Relaxed);
        self.leafvec.store(n.leafvec, Relaxed);
        self.bases.store(
            u64::from(n.child_base) | u64::from(n.leaf_base) << 32,
            Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_VALUE;

    #[test]
    fn encoding_round_trips_and_reserves_the_node_flag() {
        assert_eq!(decode(EMPTY), None);
        assert_eq!(decode(encode(0)), Some(0));
        assert_eq!(decode(encode(MAX_VALUE)), Some(MAX_VALUE));
        assert_eq!(encode(MAX_VALUE) & NODE_FLAG, 0);
        assert_eq!(std::mem::size_of::<Node>(), 24);
    }

    #[test]
    fn node_cells_round_trip() {
        let n = Node {
            children: u64::MAX - 5,
            leafvec: 1 << 63 | 1,
            child_base: 0x7FFF_FFFF,
            leaf_base: 12345,
        };
        assert_eq!(NodeCell::new(n).read(), n);
    }
}
