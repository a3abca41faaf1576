//! The range tree's memory: leaves and nodes as whole cache lines, how they are encoded,
//! and the one search step each takes.
//!
//! A *leaf* is one 64-byte line holding up to [`LEAF_RANGES`] consecutive ranges: the
//! first range's start (`base`), the other starts as 32-bit offsets from it (shifted right
//! by a per-leaf `shift`, so that far-apart starts with common trailing zeros still fit),
//! and every range's value. Where even that cannot hold two starts (sparse tables, such
//! as host routes scattered over the address space), a *wide* leaf holds up to
//! [`WIDE_RANGES`] starts in full; the leaf's shift word says which form it is, a branch
//! that a real routing table always takes the same way. A *node* is two lines holding up to [`NODE_KEYS`] separator
//! keys and where its children start: a node's children (up to [`NODE_CHILDREN`]) sit
//! side by side in one block of their arena, so child `k` is `base + k`, found with no
//! read after the compare. Separators are stored less one and compared with "less
//! than", so unused ones (the largest value) never count; unused offsets in a leaf hold
//! the largest value and unused values repeat the last real one. A search step is thus
//! a count of keys below the searched key, with no special case for the fill: two
//! AVX-512 compares in a node, one in a leaf, where the CPU has them.
//!
//! Cells are atomics (see [`crate::memory`] for why that makes sharing lines with readers
//! sound). The steps come in three forms ([`Steps`]: AVX-512, AVX2, portable), one
//! compiled for each [`crate::Form`]; the vector forms read a line with plain vector
//! loads, which is sound because no load ever overlaps a store to the same line: a line
//! is read through a shared reference to the table or to a published snapshot that
//! reaches it, the writer writes only fresh lines, which no snapshot reaches
//! ([`crate::memory`] checks every write), and it writes its own table only through
//! `&mut`, never while a lookup on that table holds `&`.

use crate::form::Portable;
#[cfg(target_arch = "x86_64")]
use crate::form::{avx2_form, avx512_form, Avx2, Avx512};
use crate::memory::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Ranges in a leaf.
pub(crate) const LEAF_RANGES: usize = 7;
/// Separator keys in a node; it has one child more.
pub(crate) const NODE_KEYS: usize = 15;
/// 64-bit words in a node: the keys, then where its children start and how many.
pub(crate) const NODE_WORDS: usize = 16;
/// Children of a node.
pub(crate) const NODE_CHILDREN: usize = NODE_KEYS + 1;

/// Set in a stored value that refers to a second-stage tree over the low 64 bits of an
/// IPv6 key (a /64 holding longer prefixes); the tree's height sits in [`DEEP_HEIGHT`]
/// and its root's index below.
pub(crate) const DEEP: u32 = 1 << 31;
/// Where a second-stage tree's height sits in a stored value that refers to it.
pub(crate) const DEEP_HEIGHT_SHIFT: u32 = 28;
/// The root index part of a stored value that refers to a second-stage tree.
pub(crate) const DEEP_ROOT: u32 = (1 << DEEP_HEIGHT_SHIFT) - 1;
/// The stored value of ranges no prefix covers.
pub(crate) const UNROUTED: u32 = DEEP - 1;
const _: () = assert!(crate::MAX_VALUE < UNROUTED);

/// A leaf line: 16 words of 32 bits. Words 0-1: base; 2-7: offsets of ranges 1..7;
/// 8-14: values of ranges 0..7; 15: shift. A wide leaf: words 0-7, the starts of up to
/// four ranges; 8-11, their values; 12, how many; 15, `WIDE`.
#[derive(Default, Debug)]
#[repr(C, align(64))]
pub(crate) struct LeafLine([AtomicU64; 8]);

/// A node: 16 words of 64 bits in two cache lines. Words 0-14: separator keys less one;
/// word 15: the index of the first child (low half) and the number of children (high
/// half).
#[derive(Default, Debug)]
#[repr(C, align(64))]
pub(crate) struct NodeLine([AtomicU64; NODE_WORDS]);

impl LeafLine {
    /// The line's 32-bit word `i` (of 16; little-endian halves of its 64-bit cells).
    #[inline(always)]
    fn word(&self, i: usize) -> u32 {
        (self.0[i / 2].load(Relaxed) >> (32 * (i % 2))) as u32
    }
}

impl Cell for LeafLine {
    type Value = [u64; 8];
    #[inline(always)]
    fn read(&self) -> [u64; 8] {
        std::array::from_fn(|i| self.0[i].load(Relaxed))
    }
    #[inline(always)]
    fn write(&self, value: [u64; 8]) {
        for (c, v) in self.0.iter().zip(value) {
            c.store(v, Relaxed);
        }
    }
}

impl Cell for NodeLine {
    type Value = [u64; NODE_WORDS];
    #[inline(always)]
    fn read(&self) -> [u64; NODE_WORDS] {
        std::array::from_fn(|i| self.0[i].load(Relaxed))
    }
    #[inline(always)]
    fn write(&self, value: [u64; NODE_WORDS]) {
        for (c, v) in self.0.iter().zip(value) {
            c.store(v, Relaxed);
        }
    }
}

/// The 32-bit word `i` of a line of 64-bit words (little-endian halves).
fn word(line: &[u64], i: usize) -> u32 {
    (line[i / 2] >> (32 * (i % 2))) as u32
}

fn set_word(line: &mut [u64], i: usize, v: u32) {
    let shift = 32 * (i % 2);
    line[i / 2] = line[i / 2] & !(0xFFFF_FFFF << shift) | u64::from(v) << shift;
}

/// Ranges in a *wide* leaf, the form for starts too far apart for 32-bit offsets (sparse
/// tables: random host routes, say): the starts in full, 64 bits each.
pub(crate) const WIDE_RANGES: usize = 4;
/// The shift word of a wide leaf.
const WIDE: u32 = u32::MAX;

/// Whether `ranges` (sorted starts, the first the leaf's base) fit one leaf, in one form
/// or the other.
pub(crate) fn fits_leaf(ranges: &[(u64, u32)]) -> bool {
    ranges.len() <= WIDE_RANGES || ranges.len() <= LEAF_RANGES && leaf_shift(ranges).is_some()
}

/// The shift that makes every start's offset from the first fit below `u32::MAX`, if any.
fn leaf_shift(ranges: &[(u64, u32)]) -> Option<u32> {
    let base = ranges[0].0;
    let shift = ranges[1..]
        .iter()
        .map(|r| (r.0 - base).trailing_zeros())
        .min()
        .unwrap_or(0);
    let shift = shift.min(63);
    let last = ranges[ranges.len() - 1].0 - base;
    ((last >> shift) < u64::from(u32::MAX)).then_some(shift)
}

/// How many of `ranges`, from the first, one leaf takes (at least one): as many as fit
/// with offsets, or as a wide leaf if that takes more.
pub(crate) fn leaf_take(ranges: &[(u64, u32)]) -> usize {
    let mut n = 1;
    while n < ranges.len() && n < LEAF_RANGES && leaf_shift(&ranges[..=n]).is_some() {
        n += 1;
    }
    n.max(ranges.len().min(WIDE_RANGES))
}

/// A leaf line holding `ranges` (which must [`fits_leaf`]): with offsets if they fit,
/// else wide.
pub(crate) fn encode_leaf(ranges: &[(u64, u32)]) -> [u64; 8] {
    debug_assert!(fits_leaf(ranges));
    let last = ranges[ranges.len() - 1].1;
    let mut line = [0u64; 8];
    let Some(shift) = leaf_shift(ranges).filter(|_| ranges.len() <= LEAF_RANGES) else {
        // Wide: starts in 64-bit words 0-3 (the largest value where unused), values
        // where the other form has them, then the number of ranges.
        for k in 0..WIDE_RANGES {
            line[k] = ranges.get(k).map_or(u64::MAX, |r| r.0);
            set_word(&mut line, 8 + k, ranges.get(k).map_or(last, |r| r.1));
        }
        set_word(&mut line, 12, ranges.len() as u32);
        set_word(&mut line, 15, WIDE);
        return line;
    };
    let base = ranges[0].0;
    line[0] = base;
    for k in 0..LEAF_RANGES - 1 {
        let offset = match ranges.get(k + 1) {
            Some(r) => ((r.0 - base) >> shift) as u32,
            None => u32::MAX,
        };
        set_word(&mut line, 2 + k, offset);
    }
    for k in 0..LEAF_RANGES {
        set_word(&mut line, 8 + k, ranges.get(k).map_or(last, |r| r.1));
    }
    set_word(&mut line, 15, shift);
    line
}

/// Up to `N` `(start, value)` pairs, on the stack: what a line decodes to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decoded<const N: usize> {
    items: [(u64, u32); N],
    len: usize,
}

impl<const N: usize> Decoded<N> {
    fn new() -> Self {
        Decoded {
            items: [(0, 0); N],
            len: 0,
        }
    }

    fn push(&mut self, item: (u64, u32)) {
        self.items[self.len] = item;
        self.len += 1;
    }
}

impl<const N: usize> std::ops::Deref for Decoded<N> {
    type Target = [(u64, u32)];
    fn deref(&self) -> &[(u64, u32)] {
        &self.items[..self.len]
    }
}

/// The ranges a leaf line holds.
pub(crate) fn decode_leaf(line: &[u64; 8]) -> Decoded<LEAF_RANGES> {
    let base = line[0];
    let shift = word(line, 15);
    let mut ranges = Decoded::new();
    if shift == WIDE {
        for k in 0..word(line, 12) as usize {
            ranges.push((line[k], word(line, 8 + k)));
        }
        return ranges;
    }
    ranges.push((base, word(line, 8)));
    for k in 0..LEAF_RANGES - 1 {
        let offset = word(line, 2 + k);
        if offset == u32::MAX {
            break;
        }
        ranges.push((base + (u64::from(offset) << shift), word(line, 9 + k)));
    }
    ranges
}

/// A node whose children start at `base` and begin at the keys `firsts` (1 to
/// [`NODE_CHILDREN`] of them; the first is not stored: the parent knows it).
pub(crate) fn encode_node(firsts: &[u64], base: u32) -> [u64; NODE_WORDS] {
    debug_assert!(!firsts.is_empty() && firsts.len() <= NODE_CHILDREN);
    let mut line = [u64::MAX; NODE_WORDS];
    for (k, &first) in firsts.iter().enumerate().skip(1) {
        debug_assert!(first > firsts[k - 1]);
        line[k - 1] = first - 1;
    }
    line[NODE_KEYS] = u64::from(base) | (firsts.len() as u64) << 32;
    line
}

/// Where a node's children start, and how many there are.
pub(crate) fn node_block(line: &[u64; NODE_WORDS]) -> (u32, u32) {
    let w = line[NODE_KEYS];
    (w as u32, (w >> 32) as u32)
}

/// The children of a node, `(first key, index)`, the first with `first` as its key.
pub(crate) fn decode_node(line: &[u64; NODE_WORDS], first: u64) -> Decoded<NODE_CHILDREN> {
    let (base, count) = node_block(line);
    let mut children = Decoded::new();
    for k in 0..count as usize {
        let key = if k == 0 { first } else { line[k - 1] + 1 };
        children.push((key, base + k as u32));
    }
    children
}

/// The search steps in one instruction-set form ([`crate::form`]): the child of a node
/// and the value in a leaf for a key. The vector forms' implementors are the proofs that
/// the CPU runs them, so a step can be called only with one in hand.
pub(crate) trait Steps: Copy {
    /// One search step in a node: the index of the child whose subtree holds `key`.
    fn node_child(self, node: &NodeLine, key: u64) -> u32;
    /// One search step in a leaf: the stored value of the range holding `key`, which must
    /// not be below the leaf's base.
    fn leaf_value(self, leaf: &LeafLine, key: u64) -> u32;
}

impl Steps for Portable {
    #[inline(always)]
    fn node_child(self, node: &NodeLine, key: u64) -> u32 {
        let rank = node.0[..NODE_KEYS]
            .iter()
            .filter(|k| k.load(Relaxed) < key)
            .count();
        node.0[NODE_KEYS].load(Relaxed) as u32 + rank as u32
    }

    #[inline(always)]
    fn leaf_value(self, leaf: &LeafLine, key: u64) -> u32 {
        let line = leaf.read();
        if word(&line, 15) == WIDE {
            let rank = line[..WIDE_RANGES].iter().filter(|&&s| s <= key).count();
            return word(&line, 8 + rank.max(1) - 1);
        }
        let d = ((key - line[0]) >> word(&line, 15)).min(u64::from(u32::MAX)) as u32;
        let rank = (0..LEAF_RANGES - 1)
            .filter(|&k| word(&line, 2 + k) <= d)
            .count();
        word(&line, 8 + rank)
    }
}

#[cfg(target_arch = "x86_64")]
impl Steps for Avx2 {
    #[inline(always)]
    fn node_child(self, node: &NodeLine, key: u64) -> u32 {
        // SAFETY: `self` exists only where the CPU has the AVX2 form's features
        // (`crate::form`: `Runnable::new` detects them before making one).
        unsafe { node_child_avx2(node, key) }
    }

    #[inline(always)]
    fn leaf_value(self, leaf: &LeafLine, key: u64) -> u32 {
        // SAFETY: as above, `self` proves the CPU has the features.
        unsafe { leaf_value_avx2(leaf, key) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Steps for Avx512 {
    #[inline(always)]
    fn node_child(self, node: &NodeLine, key: u64) -> u32 {
        // SAFETY: `self` exists only where the CPU has the AVX-512 form's features
        // (`crate::form`: `Runnable::new` detects them before making one).
        unsafe { node_child_avx512(node, key) }
    }

    #[inline(always)]
    fn leaf_value(self, leaf: &LeafLine, key: u64) -> u32 {
        // SAFETY: as above, `self` proves the CPU has the features.
        unsafe { leaf_value_avx512(leaf, key) }
    }
}

avx512_form! {
    /// The node step with AVX-512: two compares of eight keys, one 16-bit mask, one count.
    #[inline]
    fn node_child_avx512(node: &NodeLine, key: u64) -> u32 {
        use std::arch::x86_64::{
            _mm512_cmplt_epu64_mask, _mm512_kunpackb, _mm512_loadu_si512,
            _mm512_mask_cmplt_epu64_mask, _mm512_set1_epi64,
        };
        const HIGH_KEYS: u8 = (1 << (NODE_KEYS - 8)) - 1;
        // SAFETY: the loads read exactly the 128 bytes of `node`, a live reference, and
        // overlap no store (module documentation).
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_si512(node.0.as_ptr().cast()),
                _mm512_loadu_si512(node.0[8..].as_ptr().cast()),
            )
        };
        // The last word (where the children start) is masked off the compare and read on
        // its own, in parallel with it.
        let base = node.0[NODE_KEYS].load(Relaxed) as u32;
        let k = _mm512_set1_epi64(key as i64);
        let lo = _mm512_cmplt_epu64_mask(lo, k);
        let hi = _mm512_mask_cmplt_epu64_mask(HIGH_KEYS, hi, k);
        base + _mm512_kunpackb(u16::from(hi), u16::from(lo)).count_ones()
    }

    /// The leaf step with AVX-512: one compare of six 32-bit offsets (a wide leaf: of
    /// four 64-bit starts).
    #[inline]
    fn leaf_value_avx512(leaf: &LeafLine, key: u64) -> u32 {
        use std::arch::x86_64::{
            _mm256_cmple_epu64_mask, _mm256_loadu_si256, _mm256_mask_cmple_epu32_mask,
            _mm256_set1_epi32, _mm256_set1_epi64x,
        };
        let shift = leaf.word(15);
        if shift == WIDE {
            // Sparse ranges (never on a full table: predicted every time there). Computing
            // both forms' ranks and choosing without a branch measured 5% slower on the
            // full IPv6 table, 20% faster on 100 of its routes (which mix the forms).
            // SAFETY: the load reads the first 32 of the 64 bytes of `leaf`, a live
            // reference, and overlaps no store (module documentation).
            let starts = unsafe { _mm256_loadu_si256(leaf.0.as_ptr().cast()) };
            let mask = _mm256_cmple_epu64_mask(starts, _mm256_set1_epi64x(key as i64));
            // Lane 0, the leaf's first start, is at most any key searched here; the OR
            // keeps the index in the line even if that were ever broken.
            return leaf.word(8 + (mask | 1).count_ones() as usize - 1);
        }
        let base = leaf.0[0].load(Relaxed);
        let d = ((key - base) >> shift).min(u64::from(u32::MAX)) as u32;
        // SAFETY: the load reads bytes 8 to 40 of the 64 of `leaf`, as above.
        let offsets = unsafe { _mm256_loadu_si256(leaf.0[1..].as_ptr().cast()) };
        let mask = _mm256_mask_cmple_epu32_mask(0b11_1111, offsets, _mm256_set1_epi32(d as i32));
        leaf.word(8 + mask.count_ones() as usize)
    }
}

avx2_form! {
    /// The node step with AVX2: four compares of four keys (AVX2 compares signed, so
    /// keys and the searched key are flipped in their top bit).
    #[inline]
    fn node_child_avx2(node: &NodeLine, key: u64) -> u32 {
        use std::arch::x86_64::{
            _mm256_castsi256_pd, _mm256_cmpgt_epi64, _mm256_loadu_si256, _mm256_movemask_pd,
            _mm256_set1_epi64x, _mm256_xor_si256,
        };
        let flip = _mm256_set1_epi64x(i64::MIN);
        let k = _mm256_set1_epi64x((key ^ 1 << 63) as i64);
        let mut below = 0u32;
        for c in 0..4 {
            // SAFETY: the four loads read exactly the 128 bytes of `node`, a live
            // reference, and overlap no store (module documentation).
            let v = unsafe { _mm256_loadu_si256(node.0[4 * c..].as_ptr().cast()) };
            let v = _mm256_xor_si256(v, flip);
            let lt = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(k, v)));
            below |= (lt as u32) << (4 * c);
        }
        // The last lane (where the children start) is masked off, and read on its own.
        let base = node.0[NODE_KEYS].load(Relaxed) as u32;
        base + (below & ((1 << NODE_KEYS) - 1)).count_ones()
    }

    /// The leaf step with AVX2: unsigned "at most" as "the larger is the bound" for
    /// 32-bit offsets, and flipped signed compares for a wide leaf's 64-bit starts.
    #[inline]
    fn leaf_value_avx2(leaf: &LeafLine, key: u64) -> u32 {
        use std::arch::x86_64::{
            _mm256_castsi256_pd, _mm256_castsi256_ps, _mm256_cmpeq_epi32, _mm256_cmpgt_epi64,
            _mm256_loadu_si256, _mm256_max_epu32, _mm256_movemask_pd, _mm256_movemask_ps,
            _mm256_set1_epi32, _mm256_set1_epi64x, _mm256_xor_si256,
        };
        let shift = leaf.word(15);
        if shift == WIDE {
            let flip = _mm256_set1_epi64x(i64::MIN);
            // SAFETY: the load reads the first 32 of the 64 bytes of `leaf`, a live
            // reference, and overlaps no store (module documentation).
            let starts = unsafe { _mm256_loadu_si256(leaf.0.as_ptr().cast()) };
            let starts = _mm256_xor_si256(starts, flip);
            let k = _mm256_set1_epi64x((key ^ 1 << 63) as i64);
            let above = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(starts, k)));
            let rank = (WIDE_RANGES as u32 - (above as u32).count_ones()).max(1);
            return leaf.word(8 + rank as usize - 1);
        }
        let base = leaf.0[0].load(Relaxed);
        let d = ((key - base) >> shift).min(u64::from(u32::MAX)) as u32;
        // SAFETY: the load reads bytes 8 to 40 of the 64 of `leaf`, as above.
        let offsets = unsafe { _mm256_loadu_si256(leaf.0[1..].as_ptr().cast()) };
        let bound = _mm256_set1_epi32(d as i32);
        let at_most = _mm256_cmpeq_epi32(_mm256_max_epu32(offsets, bound), bound);
        let rank =
            (_mm256_movemask_ps(_mm256_castsi256_ps(at_most)) as u32 & 0b11_1111).count_ones();
        leaf.word(8 + rank as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::form::{Form, Runnable};

    fn leaf(ranges: &[(u64, u32)]) -> LeafLine {
        LeafLine::new(encode_leaf(ranges))
    }

    /// The leaf step's answer, the same in every form this CPU runs.
    fn leaf_value(leaf: &LeafLine, key: u64) -> u32 {
        let want = Portable.leaf_value(leaf, key);
        for form in Runnable::all() {
            let got = match form {
                Runnable::Portable => want,
                #[cfg(target_arch = "x86_64")]
                Runnable::Avx2(cpu) => cpu.leaf_value(leaf, key),
                #[cfg(target_arch = "x86_64")]
                Runnable::Avx512(cpu) => cpu.leaf_value(leaf, key),
            };
            assert_eq!(got, want, "{form:?}, key {key}");
        }
        want
    }

    /// The node step's answer, the same in every form this CPU runs.
    fn node_child(node: &NodeLine, key: u64) -> u32 {
        let want = Portable.node_child(node, key);
        for form in Runnable::all() {
            let got = match form {
                Runnable::Portable => want,
                #[cfg(target_arch = "x86_64")]
                Runnable::Avx2(cpu) => cpu.node_child(node, key),
                #[cfg(target_arch = "x86_64")]
                Runnable::Avx512(cpu) => cpu.node_child(node, key),
            };
            assert_eq!(got, want, "{form:?}, key {key}");
        }
        want
    }

    #[test]
    fn leaves_round_trip_and_answer_every_range() {
        let ranges = [
            (1000, 1),
            (1000 + 4096, 2),
            (1000 + 3 * 4096, 3),
            (1000 + (0xFFFF_FFFEu64 << 12), 4),
        ];
        assert!(fits_leaf(&ranges));
        let cell = leaf(&ranges);
        assert_eq!(*decode_leaf(&cell.read()), ranges);
        for (i, &(start, value)) in ranges.iter().enumerate() {
            assert_eq!(leaf_value(&cell, start), value);
            if i > 0 {
                assert_eq!(leaf_value(&cell, start - 1), ranges[i - 1].1);
            }
        }
        assert_eq!(leaf_value(&cell, u64::MAX), 4);
    }

    #[test]
    fn sparse_ranges_take_wide_leaves() {
        let sparse = [
            (0, 1),
            (1, 2),
            (1 << 40, 3),
            (u64::MAX - 9, 4),
            (u64::MAX, 5),
        ];
        assert_eq!(
            leaf_take(&sparse),
            WIDE_RANGES,
            "more than offsets would take"
        );
        for n in 1..=WIDE_RANGES {
            let cell = leaf(&sparse[..n]);
            assert_eq!(*decode_leaf(&cell.read()), sparse[..n]);
            for (i, &(start, value)) in sparse[..n].iter().enumerate() {
                assert_eq!(leaf_value(&cell, start), value);
                assert_eq!(
                    leaf_value(&cell, start.saturating_add(1)),
                    if i + 1 < n && sparse[i + 1].0 == start + 1 {
                        sparse[i + 1].1
                    } else {
                        value
                    }
                );
            }
            assert_eq!(leaf_value(&cell, u64::MAX), sparse[n - 1].1);
        }
        let last = leaf(&sparse[1..]);
        assert_eq!(
            leaf_value(&last, u64::MAX),
            5,
            "a real start at the largest key"
        );
        assert_eq!(leaf_value(&last, u64::MAX - 1), 4);
    }

    #[test]
    fn leaves_refuse_what_does_not_fit() {
        assert!(!fits_leaf(&[
            (0, 1),
            (1, 2),
            (1 << 40, 3),
            (1 << 41, 4),
            (1 << 42, 5)
        ]));
        assert!(fits_leaf(&[(0, 1), (1, 2), (1 << 40, 3)]), "wide");
        let eight: Vec<(u64, u32)> = (0..8).map(|i| (i, i as u32)).collect();
        assert_eq!(leaf_take(&eight), LEAF_RANGES);
        let full = leaf(&eight[..LEAF_RANGES]);
        assert_eq!(leaf_value(&full, 6), 6);
        assert_eq!(leaf_value(&full, u64::MAX), 6);
        let one = leaf(&[(u64::MAX, 9)]);
        assert_eq!(leaf_value(&one, u64::MAX), 9);
    }

    /// Random leaves (starts close together, so offsets, or scattered, so wide leaves)
    /// and nodes: `steps` answers every key as the portable steps do.
    fn steps_answer_as_the_portable_ones(steps: impl Steps) {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        let mut rng = SmallRng::seed_from_u64(9);
        for round in 0..if cfg!(miri) { 40 } else { 2000 } {
            let spread = if round % 2 == 0 { 20 } else { 63 };
            let mut starts: Vec<u64> = (0..rng.gen_range(1..=LEAF_RANGES))
                .map(|_| rng.gen::<u64>() >> (64 - spread))
                .collect();
            starts.push(0);
            starts.sort_unstable();
            starts.dedup();
            let ranges: Vec<(u64, u32)> = starts.iter().map(|&s| (s, rng.gen())).collect();
            let n = leaf_take(&ranges);
            let cell = LeafLine::new(encode_leaf(&ranges[..n]));
            let firsts: Vec<u64> = starts.iter().copied().take(NODE_CHILDREN).collect();
            let node = NodeLine::new(encode_node(&firsts, rng.gen_range(0..1000)));
            for _ in 0..16 {
                let key = match rng.gen_range(0..4) {
                    0 => u64::MAX,
                    1 => starts[rng.gen_range(0..starts.len())],
                    _ => rng.gen::<u64>() >> (64 - spread),
                };
                assert_eq!(
                    steps.leaf_value(&cell, key),
                    Portable.leaf_value(&cell, key)
                );
                assert_eq!(
                    steps.node_child(&node, key),
                    Portable.node_child(&node, key)
                );
            }
        }
    }

    // A form this CPU lacks cannot be compared here: its test is ignored (the build
    // script asks the CPU; under Miri, a form runs only where the build enables its
    // features). Run anyway (`--include-ignored`), it checks what can be checked on such
    // a CPU: that the build script saw the same CPU, and that a table refuses the form.

    /// What a test of `form` checks where this CPU lacks it.
    fn refused(form: Form, build_script_saw_it_lacking: bool) {
        assert!(
            build_script_saw_it_lacking || cfg!(miri),
            "the build script found the {form} form's features on this CPU, detection did not"
        );
        assert_eq!(
            crate::Table::<u32>::new().set_form(form),
            Err(crate::UnsupportedForm(form))
        );
    }

    #[test]
    #[cfg_attr(
        fibre_cpu_lacks_avx2,
        ignore = "this CPU lacks the AVX2 form's features (avx2, bmi1, bmi2, lzcnt, popcnt)"
    )]
    #[cfg_attr(
        all(miri, not(target_feature = "avx2")),
        ignore = "under Miri the AVX2 form runs only in a build that enables its features"
    )]
    fn avx2_steps_answer_as_the_portable_ones() {
        match Runnable::new(Form::Avx2) {
            #[cfg(target_arch = "x86_64")]
            Some(Runnable::Avx2(cpu)) => steps_answer_as_the_portable_ones(cpu),
            _ => refused(Form::Avx2, cfg!(fibre_cpu_lacks_avx2)),
        }
    }

    #[test]
    #[cfg_attr(
        fibre_cpu_lacks_avx512,
        ignore = "this CPU lacks the AVX-512 form's features (avx512f, avx512vl)"
    )]
    #[cfg_attr(
        all(miri, not(target_feature = "avx512vl")),
        ignore = "under Miri the AVX-512 form runs only in a build that enables its features"
    )]
    fn avx512_steps_answer_as_the_portable_ones() {
        match Runnable::new(Form::Avx512) {
            #[cfg(target_arch = "x86_64")]
            Some(Runnable::Avx512(cpu)) => steps_answer_as_the_portable_ones(cpu),
            _ => refused(Form::Avx512, cfg!(fibre_cpu_lacks_avx512)),
        }
    }

    #[test]
    fn nodes_find_the_child_of_every_key() {
        let firsts: Vec<u64> = (0..NODE_CHILDREN as u64).map(|c| c * 100).collect();
        for n in 1..=NODE_CHILDREN {
            let cell = NodeLine::new(encode_node(&firsts[..n], 7));
            let children = decode_node(&cell.read(), 0);
            let want: Vec<(u64, u32)> = (0..n).map(|c| (firsts[c], 7 + c as u32)).collect();
            assert_eq!(*children, want);
            for key in [0, 1, 99, 100, 101, 550, 999, 1000, 1499, 1500, u64::MAX] {
                let want = want.iter().rfind(|c| c.0 <= key).unwrap().1;
                assert_eq!(node_child(&cell, key), want, "{n} children, key {key}");
            }
        }
        let top = NodeLine::new(encode_node(&[0, u64::MAX], 1));
        assert_eq!(node_child(&top, u64::MAX), 2);
        assert_eq!(node_child(&top, u64::MAX - 1), 1);
    }
}
