//! PlanB's own layout, measured here beside fibre's engines: what the frontier costs on
//! this machine.
//!
//! PlanB (NSDI 2026) is the frontier of software IPv6 lookup: 390 M lookups a second on one
//! core of an AMD server, 2.6 ns a lookup, by the paper's account. This program builds the
//! structure the paper publishes from the shipped IPv6 table and times it beside fibre's
//! two engines in the same run, so that the README's speed targets can be read against it:
//!
//! - the prefixes become sorted range starts (the top 64 bits of the address; the table
//!   holds nothing longer than /64), neighbours with the same answer merged, and each
//!   start's answer sits in an array of its own;
//! - above the starts, an implicit tree: every node one cache line of 8 keys, 9 children
//!   found by arithmetic (no pointers), the levels laid out one after the other, so every
//!   lookup takes the same number of levels;
//! - a level is one AVX-512 compare of the key against the node's 8 keys and a count of
//!   the mask; a batch walks 16 keys level by level, as the paper's code does.
//!
//! It is checked against fibre's trie on every address before it is timed (matched
//! addresses: 2^20 distinct ones, then 128 repeated, which keeps everything in the first
//! level cache and so measures instructions alone).
//!
//! Last, it times the step every such search is made of, on lines that stay in the first
//! level cache: 16 keys in flight, each taking levels of "compare 8 keys, count the mask,
//! compute the next line" one after the other. That is the floor of a comparison search
//! on this machine, whatever its layout: a search over the 333,702 ranges of the real
//! table needs at least log2(333,702) / 3 = 6 such 8-way steps (or 5 of fibre's 16-way
//! ones, which cost two compares).
//!
//! Measured here (2 vCPU KVM guest, AMD EPYC with AVX-512, three runs, best of 7 passes
//! in each of three rounds): PlanB's layout, six levels, 5.33 MiB, batched 12.3-14.3 ns
//! with 2^20 distinct addresses and 8.8-8.9 with 128; fibre's range tree (3.30 MiB)
//! 10.3-10.5 and 9.9-10.1 in the same rounds; fibre's trie 18.7-19.3 and 12.6. Scalar:
//! PlanB's layout 23-26 ns, the range tree 20-22. One compare step costs 1.26-1.32 ns
//! with six a key and 16 keys in flight, so the six levels cost 7.6-7.9 ns before the
//! value is read. (The README's "Where the targets stand" draws the conclusion.)
//!
//! `cargo run --release -p fibre-bench --example planb_layout`

#[allow(dead_code)] // this program times its candidates itself, beside two engines
mod experiment;

use experiment::best_of;
use fibre_lpm::{Engine, Lpm, Prefix, Table};

/// Keys in a node: one cache line.
const KEYS: usize = 8;
/// Children of a node.
const ARITY: usize = KEYS + 1;
/// Keys a batch walks together, as the paper's code does.
const GROUP: usize = 16;

/// One node: 8 keys in one aligned cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; KEYS]);

/// PlanB's linearized B+-tree over the range starts.
struct Linearized {
    /// Every level's nodes, root first, padded to a power of two so that an index can be
    /// masked into bounds instead of checked.
    lines: Vec<Line>,
    mask: usize,
    /// Where each level's first node sits in `lines`.
    level_start: Vec<usize>,
    /// The answer from each range start on (`u32::MAX`: none).
    values: Vec<u32>,
}

/// How many of `line`'s keys are at most `key`.
#[inline(always)]
fn count_at_most(line: &Line, key: u64) -> usize {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx512f"))]
    // SAFETY: the CPU has AVX-512F (checked at compile time); the load reads the 64 bytes
    // of `line`, a live reference.
    unsafe {
        use std::arch::x86_64::{_mm512_cmple_epu64_mask, _mm512_load_si512, _mm512_set1_epi64};
        let keys = _mm512_load_si512(line.0.as_ptr().cast());
        _mm512_cmple_epu64_mask(keys, _mm512_set1_epi64(key as i64)).count_ones() as usize
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx512f")))]
    line.0.iter().filter(|&&k| k <= key).count()
}

impl Linearized {
    fn build(table: &Lpm<u128>, prefixes: &[Prefix<u128>]) -> Self {
        let (starts, values) = ranges(table, prefixes);
        // Levels: the last holds every start, 8 to a node; each one above has 9 times
        // fewer nodes, up to a single root.
        let mut nodes_per_level = vec![starts.len().div_ceil(KEYS).max(1)];
        while nodes_per_level[0] > 1 {
            nodes_per_level.insert(0, nodes_per_level[0].div_ceil(ARITY));
        }
        // A complete tree: level l holds 9^l nodes, so that children are found by
        // arithmetic alone.
        let depth = nodes_per_level.len();
        let mut level_start = Vec::with_capacity(depth);
        let mut total = 0;
        for l in 0..depth {
            level_start.push(total);
            total += ARITY.pow(l as u32);
        }
        let leaf_nodes = ARITY.pow(depth as u32 - 1);
        assert!(leaf_nodes * KEYS >= starts.len());
        let mut lines = vec![Line([u64::MAX; KEYS]); total.next_power_of_two()];
        let leaf = |i: usize| starts.get(i).copied().unwrap_or(u64::MAX);
        for l in 0..depth {
            // A node at level l covers this many starts; each of its children a ninth.
            let covers = KEYS * ARITY.pow((depth - 1 - l) as u32);
            let child_covers = covers / ARITY;
            for n in 0..ARITY.pow(l as u32) {
                let line = &mut lines[level_start[l] + n];
                for k in 0..KEYS {
                    // The last level holds the starts themselves; above it, key k is the
                    // first start under child k + 1.
                    line.0[k] = if l == depth - 1 {
                        leaf(n * KEYS + k)
                    } else {
                        leaf(n * covers + (k + 1) * child_covers)
                    };
                }
            }
        }
        let mask = lines.len() - 1;
        Linearized {
            lines,
            mask,
            level_start,
            values,
        }
    }

    /// The answer at `position`, the number of starts at most the key (at least 1: the
    /// first start is 0).
    #[inline(always)]
    fn value_at(&self, position: usize) -> Option<u32> {
        let v = self.values[position.saturating_sub(1).min(self.values.len() - 1)];
        (v != u32::MAX).then_some(v)
    }

    fn lookup(&self, key: u64) -> Option<u32> {
        let mut n = 0;
        let last = self.level_start.len() - 1;
        for l in 0..last {
            n = ARITY * n + count_at_most(&self.lines[(self.level_start[l] + n) & self.mask], key);
        }
        let line = &self.lines[(self.level_start[last] + n) & self.mask];
        self.value_at(n * KEYS + count_at_most(line, key))
    }

    fn lookup_batch(&self, keys: &[u64], out: &mut [Option<u32>]) {
        let last = self.level_start.len() - 1;
        for (ks, os) in keys.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
            let Ok(ks) = <&[u64; GROUP]>::try_from(ks) else {
                for (o, &k) in os.iter_mut().zip(ks) {
                    *o = self.lookup(k);
                }
                continue;
            };
            let mut n = [0usize; GROUP];
            for &start in &self.level_start[..last] {
                for (n, &k) in n.iter_mut().zip(ks) {
                    *n = ARITY * *n + count_at_most(&self.lines[(start + *n) & self.mask], k);
                }
            }
            let start = self.level_start[last];
            for ((o, &n), &k) in os.iter_mut().zip(&n).zip(ks) {
                let line = &self.lines[(start + n) & self.mask];
                *o = self.value_at(n * KEYS + count_at_most(line, k));
            }
        }
    }

    fn describe(&self) -> String {
        let used = self.level_start.last().unwrap() + ARITY.pow(self.level_start.len() as u32 - 1);
        format!(
            "{} levels of 8-key lines over {} range starts, {:.2} MiB",
            self.level_start.len(),
            self.values.len(),
            (used * 64 + self.values.len() * 4) as f64 / 1048576.0
        )
    }
}

/// The sorted range starts of `prefixes` (top 64 bits) and the answer from each on,
/// neighbours with the same answer merged.
fn ranges(table: &Lpm<u128>, prefixes: &[Prefix<u128>]) -> (Vec<u64>, Vec<u32>) {
    let mut starts: Vec<u64> = vec![0];
    for p in prefixes {
        assert!(p.len() <= 64, "PlanB's layout covers prefixes up to /64");
        let start = (p.addr() >> 64) as u64;
        starts.push(start);
        if let Ok(end) = u64::try_from(u128::from(start) + (1u128 << (64 - u32::from(p.len())))) {
            starts.push(end);
        }
    }
    starts.sort_unstable();
    starts.dedup();
    let (mut kept, mut values) = (Vec::new(), Vec::<u32>::new());
    for s in starts {
        let v = table.lookup(u128::from(s) << 64).unwrap_or(u32::MAX);
        if values.last() != Some(&v) {
            kept.push(s);
            values.push(v);
        }
    }
    (kept, values)
}

/// ns per step of `levels` dependent compare steps for each of 2^20 keys, 16 in flight, on
/// 64 lines that stay in the first-level cache.
fn step_cost(levels: usize) -> f64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let lines: Vec<Line> = (0..64)
        .map(|_| {
            let mut keys: [u64; KEYS] = std::array::from_fn(|_| next());
            keys.sort_unstable();
            Line(keys)
        })
        .collect();
    let keys: Vec<u64> = (0..1 << 20).map(|_| next()).collect();
    let mut sink = 0;
    let ns = best_of(keys.len(), || {
        for ks in keys.chunks_exact(GROUP) {
            let mut n = [0usize; GROUP];
            for _ in 0..levels {
                for (n, &k) in n.iter_mut().zip(ks) {
                    *n = (ARITY * *n + count_at_most(&lines[*n & 63], k)) & 63;
                }
            }
            sink += n.iter().sum::<usize>();
        }
    });
    std::hint::black_box(sink);
    ns / levels as f64
}

fn main() {
    let (prefixes, trie, keys) = experiment::shipped_ipv6();
    experiment::announce(&prefixes, &trie);
    let planb = Linearized::build(&trie, &prefixes);
    let range_tree = <Table<u128> as Engine<u128>>::build(
        prefixes.iter().enumerate().map(|(i, p)| (*p, i as u32)),
    );
    println!("PlanB's layout: {}", planb.describe());
    println!(
        "fibre's IPv6 engine ({}): {:.2} MiB",
        <Table<u128> as Engine<u128>>::STRUCTURE,
        range_tree.memory().lookup_bytes as f64 / 1048576.0
    );
    for (what, keys) in [
        ("2^20 distinct", keys.clone()),
        (
            "128 distinct",
            (0..keys.len()).map(|i| keys[i % 128]).collect(),
        ),
    ] {
        let top: Vec<u64> = keys.iter().map(|&k| (k >> 64) as u64).collect();
        let mut want = vec![None; keys.len()];
        let mut got = vec![None; keys.len()];
        trie.lookup_batch(&keys, &mut want);
        planb.lookup_batch(&top, &mut got);
        assert_eq!(want, got, "PlanB's layout answers as the trie does");
        for (&k, &w) in top.iter().zip(&want).take(100_000) {
            assert_eq!(planb.lookup(k), w, "PlanB's layout, one at a time");
        }
        for _ in 0..3 {
            let planb_batch = best_of(keys.len(), || planb.lookup_batch(&top, &mut got));
            let ours = best_of(keys.len(), || range_tree.lookup_batch(&keys, &mut got));
            let trie_batch = best_of(keys.len(), || trie.lookup_batch(&keys, &mut got));
            let planb_scalar = best_of(keys.len(), || {
                for (o, &k) in got.iter_mut().zip(&top) {
                    *o = planb.lookup(k);
                }
            });
            let ours_scalar = best_of(keys.len(), || {
                for (o, &k) in got.iter_mut().zip(&keys) {
                    *o = range_tree.lookup(k);
                }
            });
            std::hint::black_box(&got);
            println!(
                "matched, {what}, ns per lookup (best of 7): PlanB's layout batch {planb_batch:.2} scalar {planb_scalar:.2} | fibre {} batch {ours:.2} scalar {ours_scalar:.2} | fibre trie batch {trie_batch:.2}",
                <Table<u128> as Engine<u128>>::STRUCTURE
            );
        }
    }
    for levels in [1, 6] {
        println!(
            "one compare step (8 keys, mask, count, next line; 16 keys in flight, in L1), {levels} level(s) a key: {:.2} ns a step",
            step_cost(levels)
        );
    }
}
