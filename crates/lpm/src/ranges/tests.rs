//! Tests of the range tree against the reference, plus structural checks.

use super::layout::UNROUTED;
use super::*;
use crate::reference::ReferenceLpm;
use crate::testing::{
    check_against_reference, probes_for, random_ops_match_reference, random_prefix,
};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

impl<K: Key> RangeTree<K> {
    /// Checks the trees' shape and the accounting of lines: every line is in a tree, free
    /// or released.
    pub(crate) fn check_invariants(&self) {
        self.check_invariants_with((0, 0));
    }

    /// Leaves and nodes in what a publish released.
    pub(crate) fn lines_of(&self, released: &RangeReleased) -> (usize, usize) {
        (
            released.0.leaves.slots_in(&self.store.leaves),
            released.0.nodes.slots_in(&self.store.nodes),
        )
    }

    /// [`RangeTree::check_invariants`] when `retired` more leaves and nodes wait for
    /// readers of older snapshots.
    pub(crate) fn check_invariants_with(&self, retired: (usize, usize)) {
        let (leaves, nodes) = self.store.reachable(self.main);
        assert_eq!(
            (leaves, nodes),
            (self.store.live_leaves, self.store.live_nodes),
            "the lines in use are the lines the trees reach"
        );
        let (free_leaves, free_nodes) = self.store.idle();
        assert_eq!(
            leaves + free_leaves + retired.0,
            self.store.leaves.len(),
            "every leaf is in a tree, free, or waiting for readers, once"
        );
        assert_eq!(
            nodes + free_nodes + retired.1,
            self.store.nodes.len(),
            "every node is in a tree, free, or waiting for readers, once"
        );
        let first = self.store.ranges(self.main);
        assert_eq!(first[0].0, 0, "the first stage covers every key");
        for w in first.windows(2) {
            assert!(w[0].0 < w[1].0, "ranges are sorted");
        }
        let deep = first.iter().filter_map(|r| Tree::from_deep(r.1));
        for tree in deep {
            let r = self.store.ranges(tree);
            assert_eq!(r[0].0, 0, "a second stage covers its /64");
            assert!(r.iter().all(|x| Tree::from_deep(x.1).is_none()));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn ipv4_random_operations_match_reference(seed in any::<u64>()) {
        random_ops_match_reference::<u32, RangeTree<u32>>(seed, 300, 4, RangeTree::check_invariants);
    }

    #[test]
    fn ipv6_random_operations_match_reference(seed in any::<u64>()) {
        random_ops_match_reference::<u128, RangeTree<u128>>(seed, 300, 4, RangeTree::check_invariants);
    }
}

#[test]
fn many_routes_in_few_regions_split_leaves_and_nodes() {
    // Thousands of overlapping prefixes around two bases: leaves and nodes split, the
    // tree grows levels, bulk rebuilds happen, and the answers stay the reference's.
    for seed in 0..3 {
        random_ops_match_reference::<u128, RangeTree<u128>>(
            seed,
            6000,
            2,
            RangeTree::check_invariants,
        );
        random_ops_match_reference::<u32, RangeTree<u32>>(
            seed,
            6000,
            2,
            RangeTree::check_invariants,
        );
    }
}

#[test]
fn long_prefixes_get_a_second_stage_that_follows_the_first() {
    let p = |s: &str| -> Prefix<u128> { s.parse().unwrap() };
    let a = |s: &str| -> u128 { s.parse::<std::net::Ipv6Addr>().unwrap().into() };
    let mut t = RangeTree::<u128>::new();
    t.insert(p("2001:db8::/32"), 1);
    t.insert(p("2001:db8::1/128"), 2);
    t.insert(p("2001:db8::8000:0:0:0/65"), 3);
    assert_eq!(t.lookup(a("2001:db8::1")), Some(2));
    assert_eq!(t.lookup(a("2001:db8::2")), Some(1));
    assert_eq!(t.lookup(a("2001:db8::8000:0:0:5")), Some(3));
    // A change above the /64 reaches the second stage's default.
    t.insert(p("2001:db8::/48"), 4);
    assert_eq!(t.lookup(a("2001:db8::2")), Some(4));
    assert_eq!(t.lookup(a("2001:db8::1")), Some(2));
    assert_eq!(t.lookup(a("2001:db8:0:1::")), Some(4));
    t.remove(&p("2001:db8::/48"));
    assert_eq!(t.lookup(a("2001:db8::2")), Some(1));
    // Removing the long prefixes removes the second stage.
    t.remove(&p("2001:db8::1/128"));
    t.remove(&p("2001:db8::8000:0:0:0/65"));
    assert_eq!(t.lookup(a("2001:db8::1")), Some(1));
    assert_eq!(t.lookup(a("2001:db8::8000:0:0:5")), Some(1));
    t.check_invariants();
    assert!(t
        .store
        .ranges(t.main)
        .iter()
        .all(|r| Tree::from_deep(r.1).is_none()));
    t.remove(&p("2001:db8::/32"));
    assert_eq!(t.lookup(a("2001:db8::1")), None);
    // Ranges are not merged across leaves, but every one answers nothing now.
    assert!(t.store.ranges(t.main).iter().all(|r| r.1 == UNROUTED));
}

#[test]
fn an_empty_table_is_one_leaf_and_answers_nothing() {
    let t = RangeTree::<u128>::new();
    assert_eq!(t.lookup(0), None);
    assert_eq!(t.lookup(u128::MAX), None);
    assert_eq!(t.memory().lookup_bytes, 64, "one leaf");
    let mut out = [Some(1); 3];
    t.lookup_batch(&[0, 1, u128::MAX], &mut out);
    assert_eq!(out, [None; 3]);
}

#[test]
fn a_snapshot_keeps_its_version_while_the_table_changes() {
    let mut rng = SmallRng::seed_from_u64(7);
    let bases: Vec<u128> = (0..3).map(|_| rng.gen()).collect();
    let mut t = RangeTree::<u128>::new();
    let mut r = ReferenceLpm::<u128>::new();
    for _ in 0..2000 {
        let p = random_prefix::<u128>(&mut rng, &bases);
        let v = rng.gen_range(0..1000);
        t.insert(p, v);
        r.insert(p, v);
    }
    let mut pending = Vec::new();
    for round in 0..20 {
        let (snapshot, released) = t.publish();
        pending.push(released);
        let frozen = r.clone();
        for _ in 0..50 {
            let p = random_prefix::<u128>(&mut rng, &bases);
            if rng.gen_bool(0.5) {
                let v = rng.gen_range(0..1000);
                t.insert(p, v);
                r.insert(p, v);
            } else {
                t.remove(&p);
                r.remove(&p);
            }
        }
        let probes = probes_for(&frozen.to_sorted_vec(), &mut rng);
        let mut batch = vec![None; probes.len()];
        snapshot.lookup_batch(&probes, &mut batch);
        for (i, &k) in probes.iter().enumerate() {
            let want = frozen.lookup(k).map(|x| x.1);
            assert_eq!(
                snapshot.lookup(k),
                want,
                "round {round}: the snapshot's version"
            );
            assert_eq!(batch[i], want);
        }
        check_against_reference(&t, &r, &probes);
        drop(snapshot);
        // No reader holds an older snapshot any more.
        for released in pending.drain(..) {
            t.reclaim(released);
        }
    }
    t.check_invariants();
}

#[test]
fn sparse_host_routes_pack_into_wide_leaves() {
    // Random /128s far apart: their starts do not fit 32-bit offsets, so leaves hold
    // them in full. Each route costs a second stage (one leaf) and its share of the
    // first stage's leaves and nodes; with offsets alone it cost 330 bytes.
    let mut rng = SmallRng::seed_from_u64(3);
    let mut t = RangeTree::<u128>::new();
    let mut r = ReferenceLpm::<u128>::new();
    let routes: Vec<(Prefix<u128>, u32)> = (0..20_000)
        .map(|i| (Prefix::new_clamped(rng.gen(), 128), i))
        .collect();
    for &(p, v) in &routes {
        t.insert(p, v);
        r.insert(p, v);
    }
    t.check_invariants();
    let probes = probes_for(&routes, &mut rng);
    check_against_reference(&t, &r, &probes);
    let built = RangeTree::build(routes.iter().copied());
    check_against_reference(&built, &r, &probes);
    let per_route = built.memory().lookup_bytes / routes.len();
    assert!(per_route < 120, "{per_route} bytes per route");
}

/// A bulk build given the same prefix more than once keeps its last value, in random
/// order among other prefixes, and counts it once: as inserting them in turn does.
#[test]
fn a_build_keeps_the_last_value_of_a_prefix_given_twice() {
    for seed in 0..16 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let bases: Vec<u128> = (0..8).map(|_| rng.gen()).collect();
        let mut routes: Vec<(Prefix<u128>, u32)> = (0..400)
            .map(|i| (random_prefix::<u128>(&mut rng, &bases), i))
            .collect();
        // Each prefix again, later, with another value.
        let again: Vec<(Prefix<u128>, u32)> = routes
            .iter()
            .step_by(3)
            .map(|&(p, v)| (p, v + 10_000))
            .collect();
        routes.extend(again);
        let mut r = ReferenceLpm::new();
        for &(p, v) in &routes {
            r.insert(p, v);
        }
        let t = RangeTree::build(routes.iter().copied());
        t.check_invariants();
        assert_eq!(t.to_vec(), r.to_sorted_vec(), "seed {seed}");
        assert_eq!(t.count_by_len(), r.count_by_len(), "seed {seed}");
        check_against_reference(&t, &r, &probes_for(&r.to_sorted_vec(), &mut rng));
    }
}
