//! An experiment for the next IPv6 design: would 8-bit strides beat the trie's 6-bit ones?
//!
//! fibre's trie resolves 6 bits a node (64-bit maps), so a /48 takes four node steps after
//! the first 24 bits. With 8 bits a node (256-bit maps, found by a word and a popcount
//! plus a running count per word) it takes three, but a node grows from 24 to 80 bytes.
//! This program builds such a structure for the shipped IPv6 table, lookup side only (16
//! direct bits, roots with 32 or more children made wide so the direct entry indexes
//! their 256 children: a 24-bit first level where the table is dense), checks it against
//! the trie on a million matched addresses, and times both in the same run.
//!
//! Measured here (best of 7, three rounds): 54,624 nodes, 5.76 MiB; batched 18.4-19.6 ns
//! against the trie's 18.1-18.5, scalar 38-45 against 31-33. With nodes padded to two
//! aligned cache lines (128 bytes, 8.26 MiB): 19.5-21.0 against 18.7-19.7. One step fewer
//! does not pay for nodes three times the size: not a way forward as it stands.
//!
//! `cargo run --release -p fibre-bench --example stride8`

use fibre_experiments::{prefetch, Candidate};
use fibre_lpm::Prefix;

const DIRECT: u32 = 16;
const NODE: u32 = 1 << 31;
const WIDE: u32 = 1 << 30;
const INDEX: u32 = WIDE - 1;
/// A root with at least this many children is made wide.
const WIDE_AT: usize = 32;

/// A node of 256 slots in two cache lines: what a step to a child needs in the first,
/// the leaf map in the second.
#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
struct Node8 {
    children: [u64; 4],
    child_base: u32,
    leaf_base: u32,
    /// Children before word `w`, leaf runs started before word `w`.
    cum_children: [u8; 4],
    cum_leaves: [u8; 4],
    leafvec: [u64; 4],
}

/// Prefixes and their values.
type Routes = Vec<(Prefix<u128>, u32)>;

struct Stride8 {
    direct: Vec<u32>,
    nodes: Vec<Node8>,
    leaves: Vec<u32>,
}

/// The 8 bits of `key` at `depth`.
fn slot_of(key: u128, depth: u32) -> usize {
    ((key << depth) >> 120) as usize
}

impl Stride8 {
    fn build(routes: &[(Prefix<u128>, u32)]) -> Stride8 {
        let mut s = Stride8 {
            direct: vec![0; 1 << DIRECT],
            nodes: Vec::new(),
            leaves: Vec::new(),
        };
        // Prefixes of at most 16 bits: painted, shortest first.
        let mut short: Vec<_> = routes
            .iter()
            .filter(|r| r.0.len() as u32 <= DIRECT)
            .collect();
        short.sort_by_key(|r| r.0.len());
        for (p, v) in short {
            let start = (p.addr() >> (128 - DIRECT)) as usize;
            for e in start..start + (1 << (DIRECT - u32::from(p.len()))) {
                s.direct[e] = v + 1;
            }
        }
        let deep: Vec<_> = routes
            .iter()
            .filter(|r| r.0.len() as u32 > DIRECT)
            .copied()
            .collect();
        let mut i = 0;
        while i < deep.len() {
            let e = (deep[i].0.addr() >> (128 - DIRECT)) as usize;
            let j = i + deep[i..]
                .iter()
                .position(|r| (r.0.addr() >> (128 - DIRECT)) as usize != e)
                .unwrap_or(deep.len() - i);
            let inherited = s.direct[e];
            let (values, groups) = Self::slots(&deep[i..j], DIRECT, inherited);
            if groups.len() >= WIDE_AT {
                // Wide: all 256 children, the direct entry points at them.
                let base = s.nodes.len();
                s.nodes.resize(base + 256, Node8::default());
                let mut g = groups.iter().peekable();
                for (slot, &value) in values.iter().enumerate() {
                    let items = match g.peek() {
                        Some((gs, items)) if *gs == slot => {
                            g.next();
                            items.as_slice()
                        }
                        _ => &[][..],
                    };
                    s.fill(base + slot, items, DIRECT + 8, value);
                }
                s.direct[e] = NODE | WIDE | base as u32;
            } else {
                let n = s.nodes.len();
                s.nodes.push(Node8::default());
                s.fill(n, &deep[i..j], DIRECT, inherited);
                s.direct[e] = NODE | n as u32;
            }
            i = j;
        }
        s
    }

    /// Slot values of a node at `depth` from the prefixes ending in it, and the runs of
    /// `items` longer than the node under each slot that holds some: `(slot, items)`.
    fn slots(
        items: &[(Prefix<u128>, u32)],
        depth: u32,
        inherited: u32,
    ) -> ([u32; 256], Vec<(usize, Routes)>) {
        let mut values = [inherited; 256];
        let mut ending: Vec<_> = items
            .iter()
            .filter(|r| u32::from(r.0.len()) <= depth + 8)
            .collect();
        ending.sort_by_key(|r| r.0.len());
        for (p, v) in ending {
            let first = slot_of(p.addr(), depth);
            let span = 1 << (depth + 8 - u32::from(p.len()));
            values[first..first + span].fill(v + 1);
        }
        let mut groups = Vec::new();
        let mut k = 0;
        while k < items.len() {
            let slot = slot_of(items[k].0.addr(), depth);
            let end = k + items[k..]
                .iter()
                .position(|r| slot_of(r.0.addr(), depth) != slot)
                .unwrap_or(items.len() - k);
            let deeper: Vec<_> = items[k..end]
                .iter()
                .filter(|r| u32::from(r.0.len()) > depth + 8)
                .copied()
                .collect();
            if !deeper.is_empty() {
                groups.push((slot, deeper));
            }
            k = end;
        }
        (values, groups)
    }

    /// Fills node `n` at `depth` from `items` (the prefixes longer than `depth` under it).
    fn fill(&mut self, n: usize, items: &[(Prefix<u128>, u32)], depth: u32, inherited: u32) {
        let (values, groups) = Self::slots(items, depth, inherited);
        let mut node = Node8::default();
        for (slot, _) in &groups {
            node.children[slot / 64] |= 1 << (slot % 64);
        }
        // Leaf runs: child slots do not break a run.
        let mut previous = None;
        let mut runs = Vec::new();
        for (slot, &v) in values.iter().enumerate() {
            if node.children[slot / 64] >> (slot % 64) & 1 == 1 {
                continue;
            }
            if previous != Some(v) {
                node.leafvec[slot / 64] |= 1 << (slot % 64);
                runs.push(v);
                previous = Some(v);
            }
        }
        let (mut c, mut l) = (0u32, 0u32);
        for w in 0..4 {
            node.cum_children[w] = c as u8;
            node.cum_leaves[w] = l as u8;
            c += node.children[w].count_ones();
            l += node.leafvec[w].count_ones();
        }
        node.leaf_base = self.leaves.len() as u32;
        self.leaves.extend(runs);
        node.child_base = self.nodes.len() as u32;
        self.nodes
            .resize(self.nodes.len() + groups.len(), Node8::default());
        for (rank, (slot, deeper)) in groups.iter().enumerate() {
            self.fill(
                node.child_base as usize + rank,
                deeper,
                depth + 8,
                values[*slot],
            );
        }
        self.nodes[n] = node;
    }

    /// One step at `slot`: `Ok(child)` or `Err(leaf index)`.
    #[inline(always)]
    fn step(node: &Node8, slot: usize) -> Result<u32, u32> {
        let (w, b) = (slot / 64, slot % 64);
        let bit = 1u64 << b;
        if node.children[w] & bit != 0 {
            Ok(node.child_base
                + u32::from(node.cum_children[w])
                + (node.children[w] & (bit - 1)).count_ones())
        } else {
            let rank =
                u32::from(node.cum_leaves[w]) + (node.leafvec[w] & (bit | (bit - 1))).count_ones();
            Err(node.leaf_base + rank - 1)
        }
    }

    fn lookup(&self, key: u128) -> Option<u32> {
        let e = self.direct[(key >> (128 - DIRECT)) as usize];
        if e & NODE == 0 {
            return e.checked_sub(1);
        }
        let (mut n, mut depth) = (e & INDEX, DIRECT);
        if e & WIDE != 0 {
            n += slot_of(key, DIRECT) as u32;
            depth += 8;
        }
        loop {
            match Self::step(&self.nodes[n as usize], slot_of(key, depth)) {
                Ok(child) => (n, depth) = (child, depth + 8),
                Err(leaf) => return self.leaves[leaf as usize].checked_sub(1),
            }
        }
    }

    fn lookup_batch(&self, keys: &[u128], out: &mut [Option<u32>]) {
        for (keys, out) in keys.chunks(64).zip(out.chunks_mut(64)) {
            let mut next = [0u32; 64];
            let mut window = [0u64; 64];
            let mut answer = [0u32; 64];
            let (mut walking, mut at_leaf) = (0u64, 0u64);
            for &k in keys {
                prefetch((&self.direct[(k >> (128 - DIRECT)) as usize] as *const u32).cast());
            }
            for (i, &k) in keys.iter().enumerate() {
                let e = self.direct[(k >> (128 - DIRECT)) as usize];
                if e & NODE == 0 {
                    answer[i] = e;
                    continue;
                }
                let (mut n, mut depth) = (e & INDEX, DIRECT);
                if e & WIDE != 0 {
                    n += slot_of(k, DIRECT) as u32;
                    depth += 8;
                }
                next[i] = n;
                window[i] = ((k << depth) >> 64) as u64;
                prefetch((&self.nodes[n as usize] as *const Node8).cast());
                walking |= 1 << i;
            }
            while walking != 0 {
                let mut lanes = walking;
                while lanes != 0 {
                    let i = lanes.trailing_zeros() as usize & 63;
                    lanes &= lanes - 1;
                    let node = &self.nodes[next[i] as usize];
                    let slot = (window[i] >> 56) as usize;
                    window[i] <<= 8;
                    match Self::step(node, slot) {
                        Ok(child) => {
                            next[i] = child;
                            prefetch((&self.nodes[child as usize] as *const Node8).cast());
                            prefetch(self.nodes[child as usize].leafvec.as_ptr().cast());
                        }
                        Err(leaf) => {
                            next[i] = leaf;
                            prefetch((&self.leaves[leaf as usize] as *const u32).cast());
                            walking &= !(1 << i);
                            at_leaf |= 1 << i;
                        }
                    }
                }
            }
            while at_leaf != 0 {
                let i = at_leaf.trailing_zeros() as usize & 63;
                at_leaf &= at_leaf - 1;
                answer[i] = self.leaves[next[i] as usize];
            }
            for (o, &a) in out.iter_mut().zip(&answer) {
                *o = a.checked_sub(1);
            }
        }
    }
}

impl Candidate for Stride8 {
    type Key = u128;
    fn lookup(&self, key: u128) -> Option<u32> {
        Stride8::lookup(self, key)
    }
    fn lookup_batch(&self, keys: &[u128], out: &mut [Option<u32>]) {
        Stride8::lookup_batch(self, keys, out)
    }
    fn describe(&self) -> String {
        let node = std::mem::size_of::<Node8>();
        let bytes = self.direct.len() * 4 + self.nodes.len() * node + self.leaves.len() * 4;
        format!(
            "{} nodes of {node} bytes, {:.2} MiB",
            self.nodes.len(),
            bytes as f64 / 1048576.0
        )
    }
}

fn main() {
    let (prefixes, table, keys) = fibre_experiments::shipped_ipv6();
    let mut sorted: Routes = prefixes
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, i as u32))
        .collect();
    sorted.sort_by_key(|(p, _)| (p.addr(), p.len()));
    let s8 = Stride8::build(&sorted);
    fibre_experiments::announce(&prefixes, &table);
    fibre_experiments::compare("8-bit strides", &s8, &table, &keys, &keys, 3);
}
