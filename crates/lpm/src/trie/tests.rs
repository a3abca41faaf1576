//! Tests of the trie against the reference, plus a structural invariant check.

use super::node::{decode, NODE_FLAG, RECORD_FLAG, RECORD_HEADER, WIDE_FLAG};
use super::*;
use crate::reference::ReferenceLpm;
use crate::table::Lookups;
use crate::testing::{
    check_against_reference, probes_for, random_op, random_ops_match_reference, random_prefix,
    random_removals,
};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

impl<K: Key> Trie<K> {
    /// Checks the structure: reachable nodes, inherited values, minimal leaf runs, no empty
    /// nodes, and that reachable plus free slots account for every array element.
    pub(crate) fn check_invariants(&self) {
        self.check_invariants_with((0, 0));
    }

    /// [`Trie::check_invariants`] when `retired` more slots and pages sit in blocks released
    /// before a publish and still waiting for readers.
    pub(crate) fn check_invariants_with(&self, retired: (usize, usize)) {
        let mut pages: Vec<u32> = self.page_table.clone();
        pages.sort_unstable();
        pages.dedup();
        assert_eq!(
            pages.len(),
            self.page_table.len(),
            "no page is in the table twice"
        );
        let idle = self.direct.free_slots() + self.direct.released_slots();
        assert_eq!(
            pages.len() + idle / PAGE as usize + retired.1,
            self.direct.len() >> PAGE_BITS,
            "every page is in the table, free or released, once"
        );
        let retired = retired.0;
        let mut reachable_nodes = 0;
        let mut reachable_leaves = 0;
        for e in 0..1usize << self.direct_bits {
            let entry = self.entry(e);
            if let Some(n) = self.root_node(e) {
                let node = self.node(n);
                assert!(
                    self.aux[n as usize].root,
                    "node {n} hangs from the direct array"
                );
                assert_eq!(
                    entry & RECORD_FLAG != 0,
                    node.children == 0,
                    "records exactly for roots without children"
                );
                assert_eq!(
                    entry & WIDE_FLAG != 0,
                    node.children == u64::MAX,
                    "wide entries exactly for roots with every child"
                );
                if entry & WIDE_FLAG != 0 {
                    assert_eq!(entry & ENTRY_INDEX, node.child_base, "wide entry");
                }
                let used = (0..node.children.count_ones())
                    .filter(|&j| !self.holds_nothing(node.child_base + j))
                    .count();
                if node.children == u64::MAX {
                    assert!(used >= 4, "a wide root with {used} used children");
                } else {
                    assert!(used < 8, "a narrow root with {used} used children");
                }
                let record = node.leaf_base - RECORD_HEADER;
                let leafvec = u64::from(self.leaf(record)) | u64::from(self.leaf(record + 1)) << 32;
                assert_eq!(
                    (leafvec, self.leaf(record + 2)),
                    (node.leafvec, n),
                    "record header"
                );
                reachable_nodes += 1;
                reachable_leaves += RECORD_HEADER as usize;
                self.check_node(n, false, &mut reachable_nodes, &mut reachable_leaves);
            } else {
                assert_eq!(entry & NODE_FLAG, 0);
            }
        }
        let released = self.nodes.released_slots() + self.leaves.released_slots();
        assert_eq!(
            reachable_nodes
                + reachable_leaves
                + self.nodes.free_slots()
                + self.leaves.free_slots()
                + released
                + retired,
            self.nodes.len() + self.leaves.len(),
            "every node and leaf is either reachable or free"
        );
        assert_eq!(self.count_by_len.iter().sum::<usize>(), self.len);
    }

    /// Checks node `n` and its subtree; `under_wide` if its parent is a wide root.
    fn check_node(&self, n: u32, under_wide: bool, nodes: &mut usize, leaves: &mut usize) {
        let node = self.node(n);
        let aux = &self.aux[n as usize];
        assert!(
            under_wide || !aux.prefixes.is_empty() || node.children != 0,
            "node {n} holds nothing and should have been removed"
        );
        let wide = aux.root && node.children == u64::MAX;
        assert!(aux.prefixes.windows(2).all(|w| w[0].art < w[1].art));
        let values = self.slot_values(n);
        let mut previous = None;
        for (slot, &v) in values.iter().enumerate() {
            if node.children >> slot & 1 == 1 {
                continue;
            }
            let bit = 1u64 << slot;
            let rank = (node.leafvec & (bit | (bit - 1))).count_ones();
            assert_eq!(self.leaf(node.leaf_base + rank - 1), v);
            assert_eq!(
                node.leafvec & bit != 0,
                previous != Some(v),
                "leaf runs are minimal"
            );
            previous = Some(v);
        }
        *leaves += node.leafvec.count_ones() as usize;
        let mut children = node.children;
        let mut child = node.child_base;
        while children != 0 {
            let slot = children.trailing_zeros() as usize;
            assert_eq!(
                self.aux[child as usize].default, values[slot],
                "inherited value"
            );
            assert!(
                !self.aux[child as usize].root,
                "only direct-array nodes are roots"
            );
            *nodes += 1;
            self.check_node(child, wide, nodes, leaves);
            child += 1;
            children &= children - 1;
        }
    }
}

fn p4(s: &str) -> Prefix<u32> {
    s.parse().unwrap()
}

fn ip4(s: &str) -> u32 {
    s.parse::<std::net::Ipv4Addr>().unwrap().into()
}

#[test]
fn empty_table_is_small_and_finds_nothing() {
    let t: Trie<u128> = Trie::new();
    assert_eq!(t.lookup(0), None);
    assert_eq!(t.lookup(u128::MAX), None);
    let m = t.memory();
    assert!(m.lookup_bytes + m.update_bytes < 8192, "{m:?}");
}

#[test]
fn longest_prefix_wins_and_removal_falls_back() {
    let mut t = Trie::new();
    assert_eq!(t.insert(p4("0.0.0.0/0"), 0), None);
    assert_eq!(t.insert(p4("10.0.0.0/8"), 1), None);
    assert_eq!(t.insert(p4("10.1.0.0/16"), 2), None);
    assert_eq!(t.insert(p4("10.1.2.0/24"), 3), None);
    assert_eq!(t.insert(p4("10.1.2.3/32"), 4), None);
    assert_eq!(t.lookup(ip4("10.1.2.3")), Some(4));
    assert_eq!(t.lookup(ip4("10.1.2.4")), Some(3));
    assert_eq!(t.lookup(ip4("10.1.3.4")), Some(2));
    assert_eq!(t.lookup(ip4("10.2.3.4")), Some(1));
    assert_eq!(t.lookup(ip4("11.2.3.4")), Some(0));
    assert_eq!(
        t.insert(p4("10.1.2.0/24"), 9),
        Some(3),
        "replace returns the old value"
    );
    assert_eq!(t.lookup(ip4("10.1.2.4")), Some(9));
    assert_eq!(t.remove(&p4("10.1.0.0/16")), Some(2));
    assert_eq!(t.lookup(ip4("10.1.3.4")), Some(1));
    assert_eq!(t.lookup(ip4("10.1.2.4")), Some(9));
    assert_eq!(t.remove(&p4("10.1.0.0/16")), None);
    assert_eq!(t.remove(&p4("0.0.0.0/0")), Some(0));
    assert_eq!(t.lookup(ip4("11.2.3.4")), None);
    assert_eq!(t.get(&p4("10.1.2.3/32")), Some(4));
    assert_eq!(t.get(&p4("10.1.2.2/32")), None);
    assert_eq!(t.len(), 3);
    assert_eq!(t.count_by_len()[8], 1);
    assert_eq!(t.count_by_len()[32], 1);
    t.check_invariants();
    for p in ["10.1.2.3/32", "10.1.2.0/24", "10.0.0.0/8"] {
        t.remove(&p4(p)).unwrap();
    }
    assert!(t.is_empty());
    let m = t.memory();
    assert_eq!(
        m.free_slots,
        m.nodes + m.leaves,
        "an empty table holds only free blocks"
    );
    t.check_invariants();
}

#[test]
fn host_routes_and_default_in_ipv6() {
    let mut t: Trie<u128> = Trie::new();
    t.insert("::/0".parse().unwrap(), 1);
    t.insert("2001:db8::1/128".parse().unwrap(), 2);
    t.insert(
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"
            .parse()
            .unwrap(),
        3,
    );
    assert_eq!(t.lookup(0x2001_0db8 << 96 | 1), Some(2));
    assert_eq!(t.lookup(0x2001_0db8 << 96 | 2), Some(1));
    assert_eq!(t.lookup(u128::MAX), Some(3));
    assert_eq!(t.lookup(u128::MAX - 1), Some(1));
    t.check_invariants();
    assert_eq!(t.to_vec().len(), 3);
}

/// Batched lookups step through a 64-bit window of the key and take it again every ten
/// levels: a chain of nested prefixes down to /128 walks past several windows, in a small
/// table (8 direct bits) and a large one (18, with wide roots), with a neighbour of every
/// prefix so each level's answer differs.
#[test]
fn batched_lookups_walk_past_the_key_window() {
    let base: u128 = 0x2001_0db8_85a3_0000_0000_8a2e_0370_7334;
    let mut routes: Vec<(Prefix<u128>, u32)> = Vec::new();
    for len in 0..=128u8 {
        routes.push((Prefix::new_clamped(base, len), u32::from(len)));
        if len > 0 {
            let sibling = base ^ (1u128 << (128 - u32::from(len)));
            routes.push((Prefix::new_clamped(sibling, len), 1000 + u32::from(len)));
        }
    }
    let mut rng = SmallRng::seed_from_u64(7);
    for extra in [0usize, 2 * GROW_AT] {
        let mut all = routes.clone();
        let chain: std::collections::HashSet<Prefix<u128>> = routes.iter().map(|r| r.0).collect();
        all.extend(
            (0..extra)
                .map(|i| {
                    let p = random_prefix::<u128>(&mut rng, &[base, 0x2a00 << 112, 0x2600 << 112]);
                    (p, 5000 + i as u32)
                })
                .filter(|(p, _)| !chain.contains(p)),
        );
        let t = Trie::build(all.iter().copied());
        let mut r = ReferenceLpm::new();
        for &(p, v) in &all {
            r.insert(p, v);
        }
        assert_eq!(t.len(), r.len());
        assert!(extra == 0 || t.direct_bits() == LARGE_DIRECT_BITS);
        let mut probes = probes_for(&routes, &mut rng);
        probes.extend((0..128).map(|b| base ^ (1u128 << b)));
        check_against_reference(&t, &r, &probes);
        assert_eq!(t.lookup(base), Some(128));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn ipv4_random_operations_match_reference(seed in any::<u64>()) {
        random_ops_match_reference::<u32, Trie<u32>>(seed, 300, 4, Trie::check_invariants);
    }

    #[test]
    fn ipv6_random_operations_match_reference(seed in any::<u64>()) {
        random_ops_match_reference::<u128, Trie<u128>>(seed, 300, 4, Trie::check_invariants);
    }

    #[test]
    fn explicit_prefixes_match_reference(
        routes in proptest::collection::vec((any::<u32>(), 0u8..=32, 0u32..1000), 0..200),
        probes in proptest::collection::vec(any::<u32>(), 0..100),
    ) {
        let mut t = Trie::<u32>::new();
        let mut r = ReferenceLpm::<u32>::new();
        for &(a, l, v) in &routes {
            let p = Prefix::new_clamped(a, l);
            prop_assert_eq!(t.insert(p, v), r.insert(p, v));
        }
        for &k in probes.iter().chain(routes.iter().map(|x| &x.0)) {
            prop_assert_eq!(t.lookup(k), r.lookup(k).map(|x| x.1));
        }
        for &(a, l, _) in routes.iter().step_by(2) {
            let p = Prefix::new_clamped(a, l);
            prop_assert_eq!(t.remove(&p), r.remove(&p));
        }
        for &k in probes.iter().chain(routes.iter().map(|x| &x.0)) {
            prop_assert_eq!(t.lookup(k), r.lookup(k).map(|x| x.1));
        }
        t.check_invariants();
    }
}

#[test]
fn growing_past_the_threshold_switches_to_a_wide_direct_array_and_back() {
    fn run<K: Key>() {
        let mut rng = SmallRng::seed_from_u64(7);
        let bases: Vec<u128> = (0..64).map(|_| rng.gen()).collect();
        let mut t = Trie::<K>::new();
        let mut r = ReferenceLpm::<K>::new();
        let mut live = Vec::new();
        while r.len() <= GROW_AT + 100 {
            let p = random_prefix::<K>(&mut rng, &bases);
            t.insert(p, r.len() as u32);
            r.insert(p, r.len() as u32);
            live.push(p);
        }
        assert_eq!(t.direct_bits(), LARGE_DIRECT_BITS);
        t.check_invariants();
        let probes = probes_for(&r.to_sorted_vec()[..2000], &mut rng);
        check_against_reference(&t, &r, &probes);
        for p in live {
            assert_eq!(t.remove(&p), r.remove(&p));
        }
        assert!(t.is_empty());
        assert_eq!(t.direct_bits(), SMALL_DIRECT_BITS);
        t.check_invariants();
        assert!(t.memory().lookup_bytes < 64 * 1024, "{:?}", t.memory());
    }
    run::<u32>();
    run::<u128>();
}

#[test]
fn decode_of_direct_entries_is_consistent() {
    let t: Trie<u32> = Trie::build([(p4("1.0.0.0/8"), 5)]);
    assert_eq!(decode(t.entry(1)), Some(5));
    assert_eq!(t.entry(1) & NODE_FLAG, 0);
}

#[test]
fn a_dense_root_widens_and_narrows_again() {
    let mut t: Trie<u32> = Trie::new();
    let mut reference = ReferenceLpm::new();
    t.insert(p4("10.0.0.0/8"), 99);
    reference.insert(p4("10.0.0.0/8"), 99);
    // Ten /16s under 10/8, each in its own slot of the root (bits 8..14).
    let subs: Vec<_> = (0..10u32)
        .map(|i| Prefix::new_clamped(0x0A00_0000 | (i * 4) << 16, 16))
        .collect();
    let probe = |t: &Trie<u32>, r: &ReferenceLpm<u32>| {
        for x in 0..64u32 {
            let k = 0x0A00_0000 | x << 18 | 0x1234;
            assert_eq!(t.lookup(k), r.lookup(k).map(|v| v.1), "key {k:#x}");
            let mut out = [None];
            t.lookup_batch(&[k], &mut out);
            assert_eq!(out[0], r.lookup(k).map(|v| v.1), "batched, key {k:#x}");
        }
    };
    for (i, &p) in subs.iter().enumerate() {
        t.insert(p, i as u32);
        reference.insert(p, i as u32);
        t.check_invariants();
        probe(&t, &reference);
        let wide = t.entry(10) & WIDE_FLAG != 0;
        assert_eq!(wide, i + 1 >= 8, "wide once 8 children hold something");
    }
    for (i, p) in subs.iter().enumerate() {
        t.remove(p);
        reference.remove(p);
        t.check_invariants();
        probe(&t, &reference);
        let wide = t.entry(10) & WIDE_FLAG != 0;
        assert_eq!(wide, 10 - (i + 1) >= 4, "narrow again below 4");
    }
    // A shorter prefix's new value reaches the empty children of a wide root.
    for &p in &subs[..9] {
        t.insert(p, 1);
        reference.insert(p, 1);
    }
    t.insert(p4("10.0.0.0/8"), 7);
    reference.insert(p4("10.0.0.0/8"), 7);
    t.check_invariants();
    probe(&t, &reference);
}

/// A dense root loses children in batches while a snapshot holds it: seven of its ten
/// /16s (and a /20 under each) in one batch narrow it, the rest and the /8 above them in
/// another delete it; the structure is sound after each (what the snapshot reaches
/// waiting for it), the table answers as the reference, the snapshot as it was.
#[test]
fn a_dense_root_empties_in_batches_under_a_snapshot() {
    let mut t: Trie<u32> = Trie::new();
    let mut r = ReferenceLpm::new();
    let mut all = vec![p4("10.0.0.0/8")];
    for i in 0..10u32 {
        all.push(Prefix::new_clamped(0x0A00_0000 | (i * 4) << 16, 16));
        all.push(Prefix::new_clamped(
            0x0A00_0000 | (i * 4) << 16 | 0x30 << 8,
            20,
        ));
    }
    for (v, &p) in all.iter().enumerate() {
        t.insert(p, v as u32);
        r.insert(p, v as u32);
    }
    assert_ne!(t.entry(10) & WIDE_FLAG, 0, "wide");
    let probes: Vec<u32> = (0..64u32)
        .flat_map(|x| {
            [
                0x0A00_0000 | x << 18 | 0x1234,
                0x0A00_0000 | x << 18 | 0x3456,
            ]
        })
        .collect();
    let mut waiting = Vec::new();
    for (batch, narrow) in [(&all[1..15], true), (&all[..], false)] {
        let (snapshot, released) = t.publish();
        waiting.push(released);
        let frozen = r.clone();
        let held = batch.iter().filter(|p| r.remove(p).is_some()).count();
        assert_eq!(t.remove_many(batch), held);
        let retired = waiting
            .iter()
            .map(|w| t.slots_of(w))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        t.check_invariants_with(retired);
        check_against_reference(&t, &r, &probes);
        check_against_reference(&snapshot, &frozen, &probes);
        let entry = t.entry(10);
        if narrow {
            assert_eq!(
                entry & (NODE_FLAG | WIDE_FLAG),
                NODE_FLAG,
                "narrow, still a node"
            );
        } else {
            assert_eq!(entry & NODE_FLAG, 0, "the root is gone");
            assert!(t.is_empty());
        }
    }
}

/// Batches of removals on a published trie copy around its snapshot: after each, the
/// structure is sound (every block reachable, free, or waiting for the snapshots), the
/// table answers as the reference and each snapshot as it was. Small and large tables
/// (the last batch taking a large one below the threshold of the small direct array),
/// prefixes spread wide or crowded around two addresses.
#[test]
fn batches_of_removals_copy_around_published_snapshots() {
    for seed in 0..16u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let spread = if seed % 2 == 0 { 64 } else { 2 };
        let bases: Vec<u128> = (0..spread).map(|_| rng.gen()).collect();
        let mut t = Trie::<u32>::new();
        let mut r = ReferenceLpm::<u32>::new();
        let mut live = Vec::new();
        let size = if seed % 4 == 3 { GROW_AT + 2000 } else { 1500 };
        while r.len() < size {
            random_op(&mut t, &mut r, &mut live, &mut rng, &bases, 1.0);
        }
        let mut held: Vec<(TrieSnapshot<u32>, ReferenceLpm<u32>)> = Vec::new();
        let mut waiting = Vec::new();
        for round in 0..5 {
            let bits = t.direct_bits();
            let (snapshot, released) = t.publish();
            waiting.push(released);
            held.push((snapshot, r.clone()));
            if round < 4 {
                random_removals(&mut t, &mut r, &mut live, &mut rng, &bases, 300);
            } else {
                // All but a hundred: a large table goes below the small array's threshold.
                live.sort_unstable();
                live.dedup();
                let gone: Vec<Prefix<u32>> = live.drain(100.min(live.len())..).collect();
                let count = gone.iter().filter(|p| r.remove(p).is_some()).count();
                assert_eq!(t.remove_many(&gone), count);
                assert_eq!(t.direct_bits(), SMALL_DIRECT_BITS, "seed {seed}");
            }
            // Rebuilt with the other direct array, the trie holds new buffers alone.
            if t.direct_bits() == bits {
                let retired = waiting
                    .iter()
                    .map(|w| t.slots_of(w))
                    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                t.check_invariants_with(retired);
            } else {
                t.check_invariants();
            }
            check_against_reference(&t, &r, &probes_for(&r.to_sorted_vec(), &mut rng));
            for (snapshot, frozen) in &held {
                let probes = probes_for(&frozen.to_sorted_vec()[..200.min(frozen.len())], &mut rng);
                check_against_reference(snapshot, frozen, &probes);
            }
        }
        assert_eq!(t.to_vec(), r.to_sorted_vec(), "seed {seed}");
    }
}

/// A copy of a trie that was published and changed since (so that blocks wait for its
/// readers) is the same table holding every element once, reachable or free (what waited
/// is free in the copy); copy and original, changed apart at random (past the threshold
/// of the wide direct array, and back; each change begins with a batch of removals),
/// each answer as a reference, their snapshots as they were.
#[test]
fn a_copy_is_the_same_table_and_changes_apart() {
    fn change(
        t: &mut Trie<u32>,
        r: &mut ReferenceLpm<u32>,
        rng: &mut SmallRng,
        bases: &[u128],
        n: usize,
    ) {
        let mut live: Vec<Prefix<u32>> = r.to_sorted_vec().into_iter().map(|x| x.0).collect();
        random_removals(t, r, &mut live, rng, bases, 200);
        for _ in 0..n {
            random_op(t, r, &mut live, rng, bases, 0.6);
        }
    }
    for seed in 0..12 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let bases: Vec<u128> = (0..64).map(|_| rng.gen()).collect();
        let mut t = Trie::<u32>::new();
        let mut r = ReferenceLpm::<u32>::new();
        change(&mut t, &mut r, &mut rng, &bases, 600);
        let (snapshot, _released) = t.publish();
        let frozen = r.clone();
        change(&mut t, &mut r, &mut rng, &bases, 300);
        let mut copy = t.clone();
        let mut copied = r.clone();
        copy.check_invariants();
        assert_eq!(
            copy.direct.released_slots() + copy.nodes.released_slots(),
            0
        );
        let probes = probes_for(&r.to_sorted_vec(), &mut rng);
        check_against_reference(&copy, &copied, &probes);
        let extra = if seed % 3 == 0 { 8 * GROW_AT } else { 400 };
        change(&mut copy, &mut copied, &mut rng, &bases, extra);
        change(&mut t, &mut r, &mut rng, &bases, 400);
        copy.check_invariants();
        assert_eq!(
            copy.direct_bits() == LARGE_DIRECT_BITS,
            copied.len() > GROW_AT,
            "seed {seed}"
        );
        assert_eq!(copied.len() > GROW_AT, extra > GROW_AT, "seed {seed}");
        for (table, reference) in [(&t, &r), (&copy, &copied)] {
            let probes = probes_for(&reference.to_sorted_vec(), &mut rng);
            check_against_reference(table, reference, &probes);
            assert_eq!(table.to_vec(), reference.to_sorted_vec());
        }
        let probes = probes_for(&frozen.to_sorted_vec(), &mut rng);
        for k in probes {
            assert_eq!(snapshot.lookup(k), frozen.lookup(k).map(|x| x.1), "{k}");
        }
    }
}

/// A table as built (its buffers fitted to what they hold and a sixteenth more) and its
/// copy change apart: a copy never shares a buffer with its original, whatever their
/// capacity; each then grows past its room and answers as its reference.
#[test]
fn a_copy_of_a_built_table_changes_apart() {
    for seed in 0..8 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let bases: Vec<u128> = (0..64).map(|_| rng.gen()).collect();
        let mut t = Trie::<u32>::new();
        let mut r = ReferenceLpm::<u32>::new();
        let mut live = Vec::new();
        for _ in 0..2000 {
            random_op(&mut t, &mut r, &mut live, &mut rng, &bases, 0.9);
        }
        let mut built = Trie::<u32>::build(r.to_sorted_vec());
        let mut copy = built.clone();
        let mut copied = r.clone();
        let mut copied_live: Vec<Prefix<u32>> = live.clone();
        // Past a sixteenth of the table's size: each buffer grows at least once.
        for _ in 0..600 {
            random_op(
                &mut copy,
                &mut copied,
                &mut copied_live,
                &mut rng,
                &bases,
                0.9,
            );
        }
        let mut built_live = live.clone();
        let mut r_built = r.clone();
        for _ in 0..600 {
            random_op(
                &mut built,
                &mut r_built,
                &mut built_live,
                &mut rng,
                &bases,
                0.9,
            );
        }
        for (table, reference) in [(&built, &r_built), (&copy, &copied)] {
            table.check_invariants();
            let probes = probes_for(&reference.to_sorted_vec(), &mut rng);
            check_against_reference(table, reference, &probes);
            assert_eq!(table.to_vec(), reference.to_sorted_vec(), "seed {seed}");
        }
    }
}
