//! The lookup structure's memory: nodes, leaves, their encodings, and a block allocator.
//!
//! A node's children are stored side by side in one block of the node array, and its
//! distinct leaves side by side in one block of the leaf array; the node holds only the
//! base index of each block and two 64-bit maps saying which slots are children and where
//! each run of equal leaves begins. A block grows or shrinks by moving to a block of the
//! new size; freed blocks go to a free list per size and are reused first.

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
/// The stored form of "no route".
pub(crate) const NO_ROUTE: u32 = 0;

/// The largest value a prefix can map to: `2^31 - 2` (values are stored plus one, and the
/// top bit marks node references; the flags below it count only with the top bit).
pub const MAX_VALUE: u32 = NODE_FLAG - 2;

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
    /// and the leaf's index (meaningless when the slot is a child).
    #[inline(always)]
    pub fn step(&self, slot: u32) -> (bool, u32, u32) {
        let bit = 1u64 << slot;
        let below = bit - 1;
        let child = self.child_base + (self.children & below).count_ones();
        let leaf = (self.leaf_base + (self.leafvec & (bit | below)).count_ones()).wrapping_sub(1);
        (self.children & bit != 0, child, leaf)
    }
}

/// Update-side data of a node, kept beside it (same index) and never read by lookups.
#[derive(Clone, Default, Debug)]
pub(crate) struct NodeAux {
    /// Stored value every slot has unless a prefix of this node says otherwise: the
    /// longest prefix above this node that covers it.
    pub default: u32,
    /// The prefixes that end in this node (lengths depth+1 ..= depth+6), as
    /// (ART index `1 << rel_len | rel_bits`, stored value), sorted by index so shorter
    /// prefixes come first.
    pub prefixes: Vec<(u8, u32)>,
    /// Hangs from the direct array: its leaf block starts with a record header.
    pub root: bool,
}

/// Largest block: 64 leaves and a record header.
const MAX_BLOCK: u32 = 64 + RECORD_HEADER;

/// Free lists of blocks by size (1..=64 nodes, 1..=67 leaf words) within one array.
#[derive(Clone, Debug)]
pub(crate) struct BlockAlloc {
    free: Vec<Vec<u32>>,
    free_slots: usize,
}

impl Default for BlockAlloc {
    fn default() -> Self {
        BlockAlloc {
            free: vec![Vec::new(); MAX_BLOCK as usize + 1],
            free_slots: 0,
        }
    }
}

impl BlockAlloc {
    /// A freed block of `size` elements, if there is one.
    pub fn reuse(&mut self, size: u32) -> Option<u32> {
        debug_assert!((1..=MAX_BLOCK).contains(&size));
        let base = self.free[size as usize].pop()?;
        self.free_slots -= size as usize;
        Some(base)
    }

    /// Returns a block for reuse.
    pub fn free(&mut self, base: u32, size: u32) {
        debug_assert!((1..=MAX_BLOCK).contains(&size));
        self.free[size as usize].push(base);
        self.free_slots += size as usize;
    }

    /// Elements sitting in free blocks.
    pub fn free_slots(&self) -> usize {
        self.free_slots
    }

    /// Bytes of the free lists themselves.
    pub fn bytes(&self) -> usize {
        self.free.iter().map(|v| v.capacity() * 4).sum::<usize>()
            + self.free.capacity() * std::mem::size_of::<Vec<u32>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_reserves_the_node_flag() {
        assert_eq!(decode(NO_ROUTE), None);
        assert_eq!(decode(encode(0)), Some(0));
        assert_eq!(decode(encode(MAX_VALUE)), Some(MAX_VALUE));
        assert_eq!(encode(MAX_VALUE) & NODE_FLAG, 0);
        assert_eq!(std::mem::size_of::<Node>(), 24);
    }

    #[test]
    fn freed_blocks_are_reused_by_size() {
        let mut a = BlockAlloc::default();
        assert_eq!(a.reuse(3), None);
        a.free(0, 3);
        a.free(8, 5);
        assert_eq!(a.free_slots(), 8);
        assert_eq!(a.reuse(4), None, "a block of another size is not reused");
        assert_eq!(a.reuse(3), Some(0));
        assert_eq!(a.free_slots(), 5);
    }
}
