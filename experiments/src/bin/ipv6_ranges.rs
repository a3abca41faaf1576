//! An experiment for the next IPv6 design: what would a static range search cost here?
//!
//! fibre's trie takes about 3.5 node steps of some 25 instructions each for a matched IPv6
//! lookup, and is bound by instructions more than by memory (see `lookup_profile`).
//! PlanB (NSDI 2026) instead turns the prefixes into address ranges and searches their
//! boundaries with wide compares. This program measures that idea on the shipped IPv6
//! table, next to the trie, in the same run: it is a measurement, not an engine (it is
//! built once, never updated, and handles prefixes up to /64 only, which is every prefix
//! of the real table).
//!
//! The structure: the sorted boundaries of the ranges (the top 64 bits of the address),
//! each range's value, and above them a static search tree whose nodes hold 16 keys (two
//! cache lines, aligned) and have 17 children found by arithmetic, not pointers. Every
//! lookup takes the same number of levels, so a batch walks in lockstep with no branches
//! on the data (256 keys at a time: with less work per key than the trie's walk, a pass
//! over 64 keys is shorter than a cache miss and the prefetches arrive late).
//!
//! Measured here (best of 7, trie in the same run): 333,712 ranges in 3.98 MiB, five
//! levels. With the compiler's own code for the compares (some 30 instructions for 16
//! keys) the ranges took 24.6 ns batched against the trie's 17.7; with two explicit
//! AVX-512 compares a level, 13.3 against 18.0-18.3, and 24 ns scalar against 32.
//!
//! A second structure, `Packed`, tries exactly that: leaves of one cache line holding up
//! to 6 ranges (their starts as 32-bit offsets from the first, shifted, beside their
//! values), 8-key internal nodes of one line above (9 children each): 55,622 leaves, five
//! internal levels, 3.82 MiB, one cold line at the bottom. Every level is one AVX-512
//! compare of 8 keys and a popcount, the leaf one compare of 8 lanes (the compiler turns
//! the plain loops into some 30 instructions a level: with them the same structure took
//! 22-26 ns). Measured: 9.9-11.3 ns batched against the trie's 17.8-18.6 in the same runs,
//! scalar 20-35 against about 31. Internal nodes of 16 keys (17 children, four levels):
//! 11.7-12.7 batched, scalar 20-23.
//!
//! The same `Packed` structure for the IPv4 table (addresses in the top half of the
//! 64-bit key): 194,395 leaves, 13.35 MiB, six levels; 24.5-29.8 ns batched against the
//! trie's 8.0-8.4. For IPv4 the trie's direct array and leaf records win by far.
//!
//! A third structure, `Chunked`, puts the ranges below an 18-bit direct-pointing array as
//! DXR does: a chunk of one range is answered by its entry, up to six by one leaf, more
//! by a small tree of its own (7-key nodes with explicit child indices, walked like the
//! trie with per-key masks). IPv6: 4.90 MiB, 15.2-15.6 ns batched against the trie's
//! 18.0-18.8 (and `Packed`'s 10); IPv4: 17.61 MiB, 13.3-13.7 against the trie's 7.3-7.6.
//! Chunking gives back most of what the global search gains for IPv6, and still loses
//! for IPv4: `Packed`'s speed comes from its lockstep walk (every key the same number of
//! levels, no branch on the data) as much as from its compares.
//!
//! A fourth, `BTree`, keeps `Packed`'s leaves and lockstep walk but finds children through
//! explicit indices, the layout a B+-tree that splits and merges under updates would
//! have. With 7-key nodes of one line (height 6): 11.9-12.3 ns batched against the trie's
//! 17.9-18.1, scalar 34-57; with 15-key nodes of two lines (height 4): 12.2-12.4 batched,
//! scalar 24-30 against the trie's 36 (`Packed`: 10.3-10.4 in the same run).
//!
//! So a global range search, as a B+-tree of uniform height walked in lockstep, is the way
//! forward for IPv6 lookups that the measurements point to, and the trie stays the better
//! structure for IPv4. That is what fibre-lpm's range tree became, IPv6's structure: this
//! B+-tree with 15-key nodes whose children sit side by side, incremental updates with
//! copy on write, wide leaves for sparse starts and a second stage for /65-/128; it does
//! a matched IPv6 lookup in 10.1-10.4 ns batched (`lookup_profile`, which measures it
//! beside the trie).
//!
//! `cargo run --release -p fibre-bench --example ipv6_ranges`

use fibre_experiments::{prefetch, Candidate};
use fibre_lpm::{Key, Prefix, Table};

/// Keys per node: two 64-byte cache lines of `u64`.
const B: usize = 16;

/// The ranges of `prefixes` (top 64 bits of the address): sorted starts, and the value
/// of each (`u32::MAX`: no route), neighbours with equal values merged.
fn ranges_of<K: Key>(table: &Table<K>, prefixes: &[Prefix<K>]) -> (Vec<u64>, Vec<u32>) {
    let mut starts: Vec<u64> = vec![0];
    for p in prefixes {
        assert!(p.len() <= 64, "the experiment covers prefixes up to /64");
        let start = top64(p.addr());
        starts.push(start);
        let size = 1u128 << (64 - u32::from(p.len()));
        if let Ok(end) = u64::try_from(u128::from(start) + size) {
            starts.push(end);
        }
    }
    starts.sort_unstable();
    starts.dedup();
    // Each range takes the answer of its first address.
    let mut bounds = Vec::new();
    let mut values: Vec<u32> = Vec::new();
    for s in starts {
        let v = table.lookup(from_top64(s)).unwrap_or(u32::MAX);
        if values.last() != Some(&v) {
            bounds.push(s);
            values.push(v);
        }
    }
    (bounds, values)
}

/// The top 64 bits of an address (IPv4: the address, then 32 zero bits).
fn top64<K: Key>(key: K) -> u64 {
    ((key.to_u128() << (128 - u32::from(K::BITS))) >> 64) as u64
}

/// The address whose top 64 bits are `top`.
fn from_top64<K: Key>(top: u64) -> K {
    K::from_u128((u128::from(top) << 64) >> (128 - u32::from(K::BITS)))
}

/// Bytes in MiB.
fn mib(bytes: usize) -> f64 {
    bytes as f64 / 1048576.0
}

/// Ranges in a leaf of [`Packed`].
const L: usize = 6;

/// Up to `L` consecutive ranges in one cache line: their starts as 32-bit offsets from
/// the first (shifted right by `shift`), and their values.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Leaf {
    base: u64,
    keys: [u32; L],
    values: [u32; L],
    shift: u32,
    count: u32,
}

/// The ranges with compressed leaves: one cold line a lookup at the bottom, 8-key
/// internal nodes of one line above (9 children each).
struct Packed {
    leaves: Vec<Leaf>,
    levels: Vec<Vec<Node8>>,
}

/// 8 keys, one aligned cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Node8([u64; 8]);

/// Packs consecutive `(start, value)` ranges into leaves, as many to a leaf (up to `L`)
/// as keep their offsets from the leaf's first start within 32 bits once shifted.
fn pack_leaves(ranges: &[(u64, u32)]) -> Vec<Leaf> {
    let mut leaves = Vec::new();
    let mut i = 0;
    while i < ranges.len() {
        let base = ranges[i].0;
        let (mut end, mut shift) = (i + 1, 64);
        while end < ranges.len() && end - i < L {
            let delta = ranges[end].0 - base;
            let s = shift.min(delta.trailing_zeros());
            if (delta >> s) > u64::from(u32::MAX) {
                break;
            }
            shift = s;
            end += 1;
        }
        let shift = if shift == 64 { 0 } else { shift };
        let mut leaf = Leaf {
            base,
            shift,
            count: (end - i) as u32,
            ..Leaf::default()
        };
        for (k, &(start, value)) in ranges[i..end].iter().enumerate() {
            leaf.keys[k] = ((start - base) >> shift) as u32;
            leaf.values[k] = value;
        }
        leaves.push(leaf);
        i = end;
    }
    leaves
}

/// Builds levels of [`TreeNode`]s above `children` (`(first key, index)` of each, leaves
/// when `leaf_children`), appending them to `nodes`; returns the root's index and the
/// number of levels.
fn build_tree<const K: usize>(
    nodes: &mut Vec<TreeNode<K>>,
    mut children: Vec<(u64, usize)>,
    mut leaf_children: u32,
) -> (usize, usize) {
    let mut height = 0;
    while children.len() > 1 || height == 0 {
        let level_base = nodes.len();
        for group in children.chunks(K + 1) {
            let mut node = TreeNode {
                keys: [u64::MAX; K],
                child_base: group[0].1 as u32,
                leaf_children,
            };
            for (k, child) in group.iter().enumerate().skip(1) {
                node.keys[k - 1] = child.0;
            }
            nodes.push(node);
        }
        children = children
            .chunks(K + 1)
            .enumerate()
            .map(|(j, g)| (g[0].0, level_base + j))
            .collect();
        leaf_children = 0;
        height += 1;
    }
    (children[0].1, height)
}

impl Packed {
    fn build<K: Key>(table: &Table<K>, prefixes: &[Prefix<K>]) -> Packed {
        let (bounds, values) = ranges_of(table, prefixes);
        let ranges: Vec<(u64, u32)> = bounds.into_iter().zip(values).collect();
        let leaves = pack_leaves(&ranges);
        let mut levels: Vec<Vec<Node8>> = Vec::new();
        let mut firsts: Vec<u64> = leaves.iter().map(|l| l.base).collect();
        while firsts.len() > 1 {
            let nodes = firsts.len().div_ceil(9);
            let mut level = Vec::with_capacity(nodes);
            let mut up = Vec::with_capacity(nodes);
            for j in 0..nodes {
                up.push(firsts[9 * j]);
                level.push(Node8(std::array::from_fn(|c| {
                    firsts.get(9 * j + c + 1).copied().unwrap_or(u64::MAX)
                })));
            }
            levels.push(level);
            firsts = up;
        }
        levels.reverse();
        Packed { leaves, levels }
    }

    /// How many of the node's keys are at most `key`: one AVX-512 compare where the CPU
    /// has it (the compiler makes a poor job of the plain loop).
    #[inline(always)]
    fn rank8(node: &Node8, key: u64) -> usize {
        #[cfg(all(target_arch = "x86_64", target_feature = "avx512f"))]
        // SAFETY: the CPU has AVX-512F (checked at compile time); the load reads the 64
        // bytes of `node`, a live reference.
        unsafe {
            use std::arch::x86_64::{
                _mm512_cmple_epu64_mask, _mm512_loadu_si512, _mm512_set1_epi64,
            };
            let keys = _mm512_loadu_si512(node.0.as_ptr().cast());
            let mask = _mm512_cmple_epu64_mask(keys, _mm512_set1_epi64(key as i64));
            mask.count_ones() as usize
        }
        #[cfg(not(all(target_arch = "x86_64", target_feature = "avx512f")))]
        {
            let mut mask = 0u32;
            for (s, &k) in node.0.iter().enumerate() {
                mask |= u32::from(k <= key) << s;
            }
            mask.count_ones() as usize
        }
    }

    #[inline(always)]
    fn in_leaf(leaf: &Leaf, key: u64) -> Option<u32> {
        let d = (key - leaf.base) >> leaf.shift;
        #[cfg(all(target_arch = "x86_64", target_feature = "avx512vl"))]
        // SAFETY: the CPU has AVX-512VL (checked at compile time); the load reads 32 bytes
        // of `leaf` (its keys and the first values, masked off below), a live reference.
        let rank = unsafe {
            use std::arch::x86_64::{
                _mm256_cmple_epu32_mask, _mm256_loadu_si256, _mm256_set1_epi32,
            };
            let keys = _mm256_loadu_si256(leaf.keys.as_ptr().cast());
            let d32 = d.min(u64::from(u32::MAX)) as u32;
            let mask = _mm256_cmple_epu32_mask(keys, _mm256_set1_epi32(d32 as i32));
            (u32::from(mask) & ((1 << leaf.count) - 1)).count_ones() as usize
        };
        #[cfg(not(all(target_arch = "x86_64", target_feature = "avx512vl")))]
        let rank = (0..L)
            .filter(|&k| k < leaf.count as usize && u64::from(leaf.keys[k]) <= d)
            .count();
        let v = leaf.values[rank - 1];
        (v != u32::MAX).then_some(v)
    }

    fn lookup(&self, key: u64) -> Option<u32> {
        let mut j = 0;
        for level in &self.levels {
            j = 9 * j + Self::rank8(&level[j], key);
        }
        Self::in_leaf(&self.leaves[j], key)
    }

    fn lookup_batch(&self, keys: &[u64], out: &mut [Option<u32>]) {
        const G: usize = 256;
        for (ks, os) in keys.chunks(G).zip(out.chunks_mut(G)) {
            let mut j = [0usize; G];
            for (l, level) in self.levels.iter().enumerate() {
                for (jj, &k) in j.iter_mut().zip(ks) {
                    *jj = 9 * *jj + Self::rank8(&level[*jj], k);
                }
                for &jj in &j[..ks.len()] {
                    match self.levels.get(l + 1) {
                        Some(next) => prefetch(next.as_ptr().wrapping_add(jj).cast()),
                        None => prefetch(self.leaves.as_ptr().wrapping_add(jj).cast()),
                    }
                }
            }
            for ((o, &jj), &k) in os.iter_mut().zip(&j).zip(ks) {
                *o = Self::in_leaf(&self.leaves[jj], k);
            }
        }
    }

    fn describe(&self) -> String {
        let bytes =
            self.leaves.len() * 64 + self.levels.iter().map(|l| l.len() * 64).sum::<usize>();
        format!(
            "{} leaves of up to {L} ranges, {} levels above them, {:.2} MiB",
            self.leaves.len(),
            self.levels.len(),
            mib(bytes)
        )
    }
}

/// `B` keys, aligned to cache lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Node([u64; B]);

/// `B` values, aligned to a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Values([u32; B]);

/// Boundaries and values, with a static B-ary search tree above them.
struct Ranges {
    /// Sorted boundaries, padded with `u64::MAX` to whole nodes: range `i` starts at
    /// `bounds[i]`.
    bounds: Vec<Node>,
    /// The value of range `i` (`u32::MAX`: no route).
    values: Vec<Values>,
    /// Internal levels, root first; node `j` of a level has children `(B + 1) * j + c`.
    levels: Vec<Vec<Node>>,
}

impl Ranges {
    fn build(table: &Table<u128>, prefixes: &[Prefix<u128>]) -> Ranges {
        let (mut bounds, mut values) = ranges_of(table, prefixes);
        let leaves = bounds.len().div_ceil(B);
        bounds.resize(leaves * B, u64::MAX);
        values.resize(leaves * B, u32::MAX);
        // Internal levels, bottom up: a node at the level above holds, for its children
        // 1..=B, the first key of each child's subtree.
        let mut levels: Vec<Vec<u64>> = Vec::new();
        let mut below_nodes = leaves;
        // The first key of each subtree of the level being built on.
        let mut firsts: Vec<u64> = (0..leaves).map(|n| bounds[n * B]).collect();
        while below_nodes > 1 {
            let nodes = below_nodes.div_ceil(B + 1);
            let mut level = vec![u64::MAX; nodes * B];
            let mut up_firsts = Vec::with_capacity(nodes);
            for j in 0..nodes {
                up_firsts.push(firsts.get((B + 1) * j).copied().unwrap_or(u64::MAX));
                for c in 1..=B {
                    level[j * B + c - 1] = firsts.get((B + 1) * j + c).copied().unwrap_or(u64::MAX);
                }
            }
            levels.push(level);
            firsts = up_firsts;
            below_nodes = nodes;
        }
        levels.reverse();
        let nodes = |flat: &[u64]| -> Vec<Node> {
            flat.chunks(B)
                .map(|c| Node(c.try_into().expect("whole nodes")))
                .collect()
        };
        Ranges {
            bounds: nodes(&bounds),
            values: values
                .chunks(B)
                .map(|c| Values(c.try_into().expect("whole nodes")))
                .collect(),
            levels: levels.iter().map(|l| nodes(l)).collect(),
        }
    }

    /// How many of the node's keys are at most `key` (the child to take, or the slot).
    #[inline(always)]
    fn rank(node: &[u64; B], key: u64) -> usize {
        #[cfg(all(target_arch = "x86_64", target_feature = "avx512f"))]
        // SAFETY: the CPU has AVX-512F (checked at compile time); the loads read the
        // node's 128 bytes, a live reference.
        unsafe {
            use std::arch::x86_64::{
                _mm512_cmple_epu64_mask, _mm512_loadu_si512, _mm512_set1_epi64,
            };
            let k = _mm512_set1_epi64(key as i64);
            let lo = _mm512_cmple_epu64_mask(_mm512_loadu_si512(node.as_ptr().cast()), k);
            let hi = _mm512_cmple_epu64_mask(_mm512_loadu_si512(node[8..].as_ptr().cast()), k);
            (lo.count_ones() + hi.count_ones()) as usize
        }
        #[cfg(not(all(target_arch = "x86_64", target_feature = "avx512f")))]
        {
            let mut mask = 0u32;
            for (s, &k) in node.iter().enumerate() {
                mask |= u32::from(k <= key) << s;
            }
            mask.count_ones() as usize
        }
    }

    /// Node `j` of a level.
    #[inline(always)]
    fn node(level: &[Node], j: usize) -> &[u64; B] {
        &level[j].0
    }

    /// The value of range `i`.
    #[inline(always)]
    fn value(&self, i: usize) -> u32 {
        self.values[i / B].0[i % B]
    }

    fn lookup(&self, key: u64) -> Option<u32> {
        let mut j = 0;
        for level in &self.levels {
            j = (B + 1) * j + Self::rank(Self::node(level, j), key);
        }
        let slot = Self::rank(Self::node(&self.bounds, j), key);
        // Keys below the node's first boundary belong to the last range of the node
        // before; boundary 0 makes that impossible for node 0.
        let i = j * B + slot - 1;
        let v = self.value(i);
        (v != u32::MAX).then_some(v)
    }

    fn lookup_batch(&self, keys: &[u64], out: &mut [Option<u32>]) {
        const G: usize = 256;
        for (ks, os) in keys.chunks(G).zip(out.chunks_mut(G)) {
            let mut j = [0usize; G];
            for (l, level) in self.levels.iter().enumerate() {
                for (jj, &k) in j.iter_mut().zip(ks) {
                    *jj = (B + 1) * *jj + Self::rank(Self::node(level, *jj), k);
                }
                let next = self.levels.get(l + 1).unwrap_or(&self.bounds);
                let last = l + 1 == self.levels.len();
                for &jj in &j[..ks.len()] {
                    prefetch(next.as_ptr().wrapping_add(jj).cast());
                    prefetch(next.as_ptr().wrapping_add(jj).cast::<u8>().wrapping_add(64));
                    if last {
                        prefetch(self.values.as_ptr().wrapping_add(jj).cast());
                    }
                }
            }
            for ((o, &jj), &k) in os.iter_mut().zip(&j).zip(ks) {
                let i = jj * B + Self::rank(Self::node(&self.bounds, jj), k) - 1;
                let v = self.value(i);
                *o = (v != u32::MAX).then_some(v);
            }
        }
    }

    fn describe(&self) -> String {
        use std::mem::size_of;
        let bytes = self.bounds.len() * size_of::<Node>()
            + self.values.len() * size_of::<Values>()
            + self
                .levels
                .iter()
                .map(|l| l.len() * size_of::<Node>())
                .sum::<usize>();
        format!(
            "{} ranges in nodes of {B}, {} levels above them, {:.2} MiB",
            self.bounds.len() * B,
            self.levels.len(),
            mib(bytes)
        )
    }
}

/// Bits of the direct-pointing array of [`Chunked`].
const D: u32 = 18;
/// A direct entry that refers to a chunk's only leaf...
const LEAF_ENTRY: u32 = 1 << 31;
/// ...or to the root of a chunk's search tree; otherwise it is the chunk's one value
/// plus one (0: no route).
const TREE_ENTRY: u32 = 1 << 30;
const ENTRY: u32 = TREE_ENTRY - 1;

/// An internal node of a search tree: `K` keys and where its `K + 1` children start
/// (`K` = 7: one cache line; 15: two).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct TreeNode<const K: usize> {
    keys: [u64; K],
    child_base: u32,
    /// 1 if the children are leaves.
    leaf_children: u32,
}

impl<const K: usize> TreeNode<K> {
    /// Whole 8-lane vectors: checked when a node size is first used.
    const WHOLE_VECTORS: () = assert!((K + 1).is_multiple_of(8) && K < 64);

    /// How many of the node's keys are at most `key`.
    #[inline(always)]
    fn rank(&self, key: u64) -> u32 {
        let () = Self::WHOLE_VECTORS;
        #[cfg(all(target_arch = "x86_64", target_feature = "avx512f"))]
        // SAFETY: the CPU has AVX-512F (checked at compile time); `K + 1` is a multiple of
        // 8 (`WHOLE_VECTORS`), so the loads read exactly the node's `8 * (K + 1)` bytes, a
        // live reference; the last lane (the child index and flag) is masked off.
        unsafe {
            use std::arch::x86_64::{
                _mm512_cmple_epu64_mask, _mm512_loadu_si512, _mm512_set1_epi64,
            };
            let k = _mm512_set1_epi64(key as i64);
            let base = (self as *const Self).cast::<u64>();
            let mut mask = 0u64;
            for c in 0..(K + 1) / 8 {
                let lanes = _mm512_loadu_si512(base.add(8 * c).cast());
                mask |= u64::from(_mm512_cmple_epu64_mask(lanes, k)) << (8 * c);
            }
            (mask & ((1 << K) - 1)).count_ones()
        }
        #[cfg(not(all(target_arch = "x86_64", target_feature = "avx512f")))]
        {
            self.keys.iter().filter(|&&k| k <= key).count() as u32
        }
    }
}

/// The ranges below a direct-pointing array, as DXR arranges them: the top `D` bits of
/// the key pick a chunk; a chunk of one range is answered by its entry, a chunk of up to
/// `L` ranges by one leaf, a bigger one by a small search tree of its own (explicit child
/// indices, so chunks of any size pack together).
struct Chunked {
    direct: Vec<u32>,
    nodes: Vec<TreeNode<7>>,
    leaves: Vec<Leaf>,
}

impl Chunked {
    fn build<K: Key>(table: &Table<K>, prefixes: &[Prefix<K>]) -> Chunked {
        let (bounds, values) = ranges_of(table, prefixes);
        let mut c = Chunked {
            direct: vec![0; 1 << D],
            nodes: Vec::new(),
            leaves: Vec::new(),
        };
        let mut first = 0; // the range holding the chunk's start
        for e in 0..1usize << D {
            let start = (e as u64) << (64 - D);
            let end = u128::from(start) + (1u128 << (64 - D));
            while first + 1 < bounds.len() && bounds[first + 1] <= start {
                first += 1;
            }
            let mut chunk = vec![(start, values[first])];
            let mut i = first + 1;
            while i < bounds.len() && u128::from(bounds[i]) < end {
                chunk.push((bounds[i], values[i]));
                i += 1;
            }
            c.direct[e] = c.add_chunk(&chunk);
        }
        c
    }

    /// The direct entry for a chunk of `(start, value)` ranges.
    fn add_chunk(&mut self, chunk: &[(u64, u32)]) -> u32 {
        if chunk.len() == 1 {
            let v = chunk[0].1;
            return if v == u32::MAX { 0 } else { v + 1 };
        }
        let leaf_base = self.leaves.len();
        self.leaves.extend(pack_leaves(chunk));
        if self.leaves.len() - leaf_base == 1 {
            return LEAF_ENTRY | leaf_base as u32;
        }
        let children = (leaf_base..self.leaves.len())
            .map(|l| (self.leaves[l].base, l))
            .collect();
        let (root, _) = build_tree(&mut self.nodes, children, 1);
        TREE_ENTRY | root as u32
    }

    fn lookup(&self, key: u64) -> Option<u32> {
        let e = self.direct[(key >> (64 - D)) as usize];
        if e & LEAF_ENTRY != 0 {
            return Packed::in_leaf(&self.leaves[(e & ENTRY) as usize], key);
        }
        if e & TREE_ENTRY == 0 {
            return e.checked_sub(1);
        }
        let mut n = (e & ENTRY) as usize;
        loop {
            let node = &self.nodes[n];
            let child = (node.child_base + node.rank(key)) as usize;
            if node.leaf_children != 0 {
                return Packed::in_leaf(&self.leaves[child], key);
            }
            n = child;
        }
    }

    fn lookup_batch(&self, keys: &[u64], out: &mut [Option<u32>]) {
        for (ks, os) in keys.chunks(64).zip(out.chunks_mut(64)) {
            let mut next = [0usize; 64];
            let (mut walking, mut at_leaf) = (0u64, 0u64);
            for &k in ks {
                prefetch(
                    self.direct
                        .as_ptr()
                        .wrapping_add((k >> (64 - D)) as usize)
                        .cast(),
                );
            }
            for (i, (&k, o)) in ks.iter().zip(os.iter_mut()).enumerate() {
                let e = self.direct[(k >> (64 - D)) as usize];
                next[i] = (e & ENTRY) as usize;
                if e & LEAF_ENTRY != 0 {
                    prefetch(self.leaves.as_ptr().wrapping_add(next[i]).cast());
                    at_leaf |= 1 << i;
                } else if e & TREE_ENTRY != 0 {
                    prefetch(self.nodes.as_ptr().wrapping_add(next[i]).cast());
                    walking |= 1 << i;
                } else {
                    *o = e.checked_sub(1);
                }
            }
            while walking != 0 {
                let mut lanes = walking;
                while lanes != 0 {
                    let i = lanes.trailing_zeros() as usize & 63;
                    lanes &= lanes - 1;
                    let node = &self.nodes[next[i]];
                    next[i] = (node.child_base + node.rank(ks[i])) as usize;
                    if node.leaf_children != 0 {
                        prefetch(self.leaves.as_ptr().wrapping_add(next[i]).cast());
                        walking &= !(1 << i);
                        at_leaf |= 1 << i;
                    } else {
                        prefetch(self.nodes.as_ptr().wrapping_add(next[i]).cast());
                    }
                }
            }
            while at_leaf != 0 {
                let i = at_leaf.trailing_zeros() as usize & 63;
                at_leaf &= at_leaf - 1;
                os[i] = Packed::in_leaf(&self.leaves[next[i]], ks[i]);
            }
        }
    }

    fn describe(&self) -> String {
        let bytes = self.direct.len() * 4 + self.nodes.len() * 64 + self.leaves.len() * 64;
        format!(
            "below {D} direct bits: {} tree nodes, {} leaves, {:.2} MiB",
            self.nodes.len(),
            self.leaves.len(),
            mib(bytes)
        )
    }
}

/// `Packed`'s leaves under a B+-tree of [`TreeNode`]s with explicit child indices, which
/// updates could split and merge: every key still descends the same number of levels, so
/// a batch walks in lockstep as in `Packed`.
struct BTree<const K: usize> {
    leaves: Vec<Leaf>,
    nodes: Vec<TreeNode<K>>,
    root: usize,
    height: usize,
}

impl<const K: usize> BTree<K> {
    fn describe(&self) -> String {
        format!(
            "{}-key nodes, {} of them, height {}",
            K,
            self.nodes.len(),
            self.height
        )
    }

    fn build(packed: &Packed) -> Self {
        let leaves = packed.leaves.clone();
        let mut nodes = Vec::new();
        let children = leaves
            .iter()
            .enumerate()
            .map(|(i, l)| (l.base, i))
            .collect();
        let (root, height) = build_tree(&mut nodes, children, 1);
        BTree {
            leaves,
            nodes,
            root,
            height,
        }
    }

    fn lookup(&self, key: u64) -> Option<u32> {
        let mut n = self.root;
        for _ in 1..self.height {
            let node = &self.nodes[n];
            n = (node.child_base + node.rank(key)) as usize;
        }
        let node = &self.nodes[n];
        let leaf = (node.child_base + node.rank(key)) as usize;
        Packed::in_leaf(&self.leaves[leaf], key)
    }

    fn lookup_batch(&self, keys: &[u64], out: &mut [Option<u32>]) {
        const G: usize = 256;
        for (ks, os) in keys.chunks(G).zip(out.chunks_mut(G)) {
            let mut j = [self.root; G];
            for level in 0..self.height {
                for (jj, &k) in j.iter_mut().zip(ks) {
                    let node = &self.nodes[*jj];
                    *jj = (node.child_base + node.rank(k)) as usize;
                }
                let last = level + 1 == self.height;
                for &jj in &j[..ks.len()] {
                    if last {
                        prefetch(self.leaves.as_ptr().wrapping_add(jj).cast());
                    } else {
                        let node = self.nodes.as_ptr().wrapping_add(jj).cast::<u8>();
                        prefetch(node);
                        if K > 7 {
                            prefetch(node.wrapping_add(64));
                        }
                    }
                }
            }
            for ((o, &jj), &k) in os.iter_mut().zip(&j).zip(ks) {
                *o = Packed::in_leaf(&self.leaves[jj], k);
            }
        }
    }
}

/// `Candidate` for a structure whose own `lookup`, `lookup_batch` and `describe` serve.
macro_rules! candidate {
    ($($ty:ty),*) => {$(
        impl Candidate for $ty {
            type Key = u64;
            fn lookup(&self, key: u64) -> Option<u32> {
                <$ty>::lookup(self, key)
            }
            fn lookup_batch(&self, keys: &[u64], out: &mut [Option<u32>]) {
                <$ty>::lookup_batch(self, keys, out)
            }
            fn describe(&self) -> String {
                <$ty>::describe(self)
            }
        }
    )*};
}

candidate!(Ranges, Packed, Chunked, BTree<7>, BTree<15>);

fn main() {
    let (prefixes, table, keys) = fibre_experiments::shipped_ipv6();
    fibre_experiments::announce(&prefixes, &table);
    // The structures search the top 64 bits of the address.
    let top: Vec<u64> = keys.iter().map(|&k| top64(k)).collect();
    fibre_experiments::compare(
        "ranges",
        &Ranges::build(&table, &prefixes),
        &table,
        &keys,
        &top,
        1,
    );
    let packed = Packed::build(&table, &prefixes);
    fibre_experiments::compare("packed ranges", &packed, &table, &keys, &top, 3);
    let btree = BTree::<7>::build(&packed);
    fibre_experiments::compare(
        "B+-tree ranges, 7-key nodes",
        &btree,
        &table,
        &keys,
        &top,
        3,
    );
    let btree = BTree::<15>::build(&packed);
    fibre_experiments::compare(
        "B+-tree ranges, 15-key nodes",
        &btree,
        &table,
        &keys,
        &top,
        3,
    );
    let chunked = Chunked::build(&table, &prefixes);
    fibre_experiments::compare("chunked ranges", &chunked, &table, &keys, &top, 3);
    // The same for IPv4, the address in the top half of the 64-bit key.
    let (prefixes, table, keys) = fibre_experiments::shipped_ipv4();
    fibre_experiments::announce(&prefixes, &table);
    let top: Vec<u64> = keys.iter().map(|&k| top64(k)).collect();
    let packed = Packed::build(&table, &prefixes);
    fibre_experiments::compare("packed ranges", &packed, &table, &keys, &top, 3);
    let chunked = Chunked::build(&table, &prefixes);
    fibre_experiments::compare("chunked ranges", &chunked, &table, &keys, &top, 3);
}
