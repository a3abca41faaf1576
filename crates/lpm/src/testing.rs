//! What the structures' tests share: `Tested`, the interface of either structure, random
//! prefixes that overlap, probe addresses at and around every route's edges, and the
//! randomized comparison with the reference, for either structure.

use crate::key::Key;
use crate::prefix::Prefix;
use crate::ranges::{RangeSnapshot, RangeTree};
use crate::reference::ReferenceLpm;
use crate::table::Lookups;
use crate::trie::{Trie, TrieSnapshot};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// What the randomized tests need of a structure, so they run on either.
pub(crate) trait Tested<K: Key>: Lookups<K> + Default {
    /// A table holding `routes` (later duplicates replace earlier ones), built in bulk.
    fn build(routes: impl IntoIterator<Item = (Prefix<K>, u32)>) -> Self;
    /// Sets `prefix` to `value`; returns the value it had.
    fn insert(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32>;
    /// Removes `prefix`; returns its value.
    fn remove(&mut self, prefix: &Prefix<K>) -> Option<u32>;
    /// Removes every prefix of `prefixes` held; returns how many were.
    fn remove_many(&mut self, prefixes: &[Prefix<K>]) -> usize;
    /// The value of exactly `prefix`.
    fn get(&self, prefix: &Prefix<K>) -> Option<u32>;
    /// Number of prefixes of each length, indexed by length.
    fn count_by_len(&self) -> &[usize];
    /// All prefixes and values, sorted by address, then length.
    fn to_vec(&self) -> Vec<(Prefix<K>, u32)>;
}

/// [`Lookups`] and [`Tested`] by the structure's own methods of the same names.
macro_rules! tested {
    ($table:ident, $snapshot:ident) => {
        impl<K: Key> Lookups<K> for $table<K> {
            fn lookup(&self, key: K) -> Option<u32> {
                $table::lookup(self, key)
            }
            fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
                $table::lookup_batch(self, keys, out)
            }
            fn len(&self) -> usize {
                $table::len(self)
            }
        }

        impl<K: Key> Lookups<K> for $snapshot<K> {
            fn lookup(&self, key: K) -> Option<u32> {
                $snapshot::lookup(self, key)
            }
            fn lookup_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
                $snapshot::lookup_batch(self, keys, out)
            }
            fn len(&self) -> usize {
                $snapshot::len(self)
            }
        }

        impl<K: Key> Tested<K> for $table<K> {
            fn build(routes: impl IntoIterator<Item = (Prefix<K>, u32)>) -> Self {
                $table::build(routes)
            }
            fn insert(&mut self, prefix: Prefix<K>, value: u32) -> Option<u32> {
                $table::insert(self, prefix, value)
            }
            fn remove(&mut self, prefix: &Prefix<K>) -> Option<u32> {
                $table::remove(self, prefix)
            }
            fn remove_many(&mut self, prefixes: &[Prefix<K>]) -> usize {
                $table::remove_many(self, prefixes)
            }
            fn get(&self, prefix: &Prefix<K>) -> Option<u32> {
                $table::get(self, prefix)
            }
            fn count_by_len(&self) -> &[usize] {
                $table::count_by_len(self)
            }
            fn to_vec(&self) -> Vec<(Prefix<K>, u32)> {
                $table::to_vec(self)
            }
        }
    };
}

tested!(Trie, TrieSnapshot);
tested!(RangeTree, RangeSnapshot);

/// Random prefixes clustered around a few base addresses so that they overlap; /0,
/// host routes and /64s come often.
pub(crate) fn random_prefix<K: Key>(rng: &mut SmallRng, bases: &[u128]) -> Prefix<K> {
    let base = bases[rng.gen_range(0..bases.len())];
    let noise: u128 = rng.gen::<u128>() >> rng.gen_range(0..128);
    let addr = K::from_u128(base ^ noise);
    let len = match rng.gen_range(0..10) {
        0 => 0,
        1 => K::BITS,
        2 => 64.min(K::BITS),
        _ => rng.gen_range(0..=K::BITS),
    };
    Prefix::new_clamped(addr, len)
}

/// Addresses at and around the edges of every route, a random one inside each, random
/// ones, and the first and last address.
pub(crate) fn probes_for<K: Key>(routes: &[(Prefix<K>, u32)], rng: &mut SmallRng) -> Vec<K> {
    let mut probes = Vec::new();
    for (p, _) in routes {
        let span = if p.len() == K::BITS {
            0
        } else {
            u128::MAX >> (128 - u32::from(K::BITS) + u32::from(p.len()))
        };
        let a = p.addr().to_u128();
        probes.push(p.addr());
        probes.push(K::from_u128(a | span));
        probes.push(K::from_u128(a.wrapping_sub(1)));
        probes.push(K::from_u128((a | span).wrapping_add(1)));
        probes.push(K::from_u128(a | (rng.gen::<u128>() & span)));
    }
    probes.extend((0..64).map(|_| K::from_u128(rng.gen())));
    probes.push(K::from_u128(0));
    probes.push(K::from_u128(u128::MAX));
    probes
}

/// Every probe, scalar and batched, answers as the reference does.
pub(crate) fn check_against_reference<K: Key>(
    t: &impl Lookups<K>,
    r: &ReferenceLpm<K>,
    probes: &[K],
) {
    let mut batch = vec![None; probes.len()];
    t.lookup_batch(probes, &mut batch);
    for (i, &k) in probes.iter().enumerate() {
        let want = r.lookup(k).map(|x| x.1);
        assert_eq!(t.lookup(k), want, "lookup {k:?}");
        assert_eq!(batch[i], want, "batched lookup {k:?}");
    }
}

/// One random operation on `t` and the reference `r` alike, their answers compared: with
/// probability `insert` (or when `live`, the prefixes held, is empty) an insert or replace
/// of a prefix around `bases`, else the removal of one of `live`.
pub(crate) fn random_op<K: Key, E: Tested<K>>(
    t: &mut E,
    r: &mut ReferenceLpm<K>,
    live: &mut Vec<Prefix<K>>,
    rng: &mut SmallRng,
    bases: &[u128],
    insert: f64,
) {
    if rng.gen_bool(insert) || live.is_empty() {
        let p = random_prefix::<K>(rng, bases);
        let v = rng.gen_range(0..1 << 20);
        assert_eq!(t.insert(p, v), r.insert(p, v), "insert {p}");
        live.push(p);
    } else {
        let p = live.swap_remove(rng.gen_range(0..live.len()));
        assert_eq!(t.remove(&p), r.remove(&p), "remove {p}");
    }
}

/// Removes a batch of up to `most` of `live`, the prefixes held, from `t` and the
/// reference `r` alike, their answers compared: neighbours in address order (so that
/// whole nodes empty), one of them named twice, and a random prefix around `bases`,
/// held or not.
pub(crate) fn random_removals<K: Key, E: Tested<K>>(
    t: &mut E,
    r: &mut ReferenceLpm<K>,
    live: &mut Vec<Prefix<K>>,
    rng: &mut SmallRng,
    bases: &[u128],
    most: usize,
) {
    live.sort_unstable();
    live.dedup();
    let from = rng.gen_range(0..=live.len());
    let to = live.len().min(from + rng.gen_range(0..=most));
    let mut batch: Vec<Prefix<K>> = live.drain(from..to).collect();
    if let Some(&first) = batch.first() {
        batch.push(first);
    }
    batch.push(random_prefix::<K>(rng, bases));
    let held = batch.iter().filter(|p| r.remove(p).is_some()).count();
    assert_eq!(t.remove_many(&batch), held, "remove {batch:?}");
    live.retain(|p| r.get(p).is_some());
}

/// `ops` random inserts, replaces and removes around `bases` random base addresses (and
/// every 32, a batch of removals),
/// checked against the reference every 16 operations with `check` run on the structure,
/// then the whole table and a bulk build of it.
pub(crate) fn random_ops_match_reference<K: Key, E: Tested<K>>(
    seed: u64,
    ops: usize,
    bases: usize,
    check: impl Fn(&E),
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let bases: Vec<u128> = (0..bases).map(|_| rng.gen()).collect();
    let mut t = E::default();
    let mut r = ReferenceLpm::<K>::new();
    let mut live = Vec::new();
    for step in 0..ops {
        random_op(&mut t, &mut r, &mut live, &mut rng, &bases, 0.65);
        if step % 32 == 31 {
            random_removals(&mut t, &mut r, &mut live, &mut rng, &bases, 24);
            check(&t);
        }
        if step % 16 == 0 {
            check(&t);
            let routes = r.to_sorted_vec();
            check_against_reference(&t, &r, &probes_for(&routes, &mut rng));
        }
    }
    check(&t);
    assert_eq!(t.to_vec(), r.to_sorted_vec());
    assert_eq!(t.len(), r.len());
    assert_eq!(t.count_by_len(), r.count_by_len());
    for (p, v) in r.to_sorted_vec() {
        assert_eq!(t.get(&p), Some(v));
    }
    let probes = probes_for(&r.to_sorted_vec(), &mut rng);
    check_against_reference(&t, &r, &probes);
    let built = E::build(r.to_sorted_vec());
    check(&built);
    check_against_reference(&built, &r, &probes);
}
